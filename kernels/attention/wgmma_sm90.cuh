/* SPDX-License-Identifier: MIT */
/* kernels/attention/wgmma_sm90.cuh - Hopper (sm_90a) warpgroup MMA building blocks for
 * the fast attention kernels: shared-memory matrix descriptors, the
 * fence / commit / wait protocol and the m64nNk16 wrappers (generated into
 * wgmma_ops.inc).
 *
 * Layout contract (PTX ISA, "Asynchronous Warpgroup Level Matrix Shared
 * Memory Layout"): every operand tile lives in shared memory as panels of
 * 64 16-bit elements (128 bytes) per row, rows contiguous, 8-row atoms of
 * 1024 bytes aligned to 1024, with the 128-byte swizzle: 16-byte chunk c of
 * row r is stored at chunk c ^ (r % 8) (pswz), which is what TMA writes
 * with CU_TENSOR_MAP_SWIZZLE_128B.
 *  - K-major operand (contiguous along the reduction dim, e.g. Q or K in
 *    S = Q K^T): descriptor start = panel + 32 bytes per k16 step inside the
 *    128-byte row, stride byte offset (SBO) = 1024 between 8-row groups.
 *  - MN-major operand (contiguous along M or N, e.g. V in O = P V): start =
 *    panel + 16 rows * 128 bytes per k16 step, SBO = 1024 between 8-row
 *    groups along K, leading byte offset (LBO) = distance between the
 *    64-wide panels along M/N.
 * Accumulator layout of m64nNk16 (fp32): warp w of the warpgroup holds rows
 * 16w + g and 16w + g + 8 (g = lane / 4); register 4i + {0,1} is (row g,
 * column 8i + 2t + {0,1}), 4i + {2,3} the same columns of row g + 8 (t =
 * lane % 4): per warp this is the mma.sync m16n8 C layout, so the softmax,
 * masking and dropout code of the sm_80 kernels applies unchanged, and two
 * n8 accumulator tiles are the A-register fragment of one k16 step. */
#ifndef FG_KERNELS_WGMMA_SM90_CUH
#define FG_KERNELS_WGMMA_SM90_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "mma_sm80.cuh"

namespace fg {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FG_WGMMA_ENABLED 1
#endif

/* 64-bit shared-memory matrix descriptor with the 128-byte swizzle. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) |
           ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | ((uint64_t)1 << 62);
}

/* desc advanced by `bytes` (a multiple of 16): the same value as wg_desc
 * of the address `bytes` further on. The start address is the low 14 bits
 * (addr >> 4) and shared-memory addresses stay below 256 KB, so the add
 * never carries into the other fields. Built once per tile and advanced
 * per k step, a descriptor costs one add (often folded into the uniform
 * register the wgmma reads) instead of masks and shifts per operand. */
__device__ __forceinline__ uint64_t wg_desc_add(uint64_t desc, uint32_t bytes)
{
    return desc + (bytes >> 4);
}

/* A tile's descriptors at byte offsets: kOnce builds the descriptor once
 * and advances it (wg_desc_add), else each offset's is built from the
 * address. Which is faster depends on register pressure: in the wgmma
 * backward once-per-tile gained at d = 64 and lost 4-9% at d = 128 (H200,
 * session 22), where the live 64-bit descriptors crowd the loop. */
template <bool kOnce> struct WgDescAt {
    uint32_t addr, lbo, sbo;
    uint64_t desc;
    __device__ __forceinline__ WgDescAt(uint32_t a, uint32_t l, uint32_t s)
        : addr(a), lbo(l), sbo(s), desc(kOnce ? wg_desc(a, l, s) : 0)
    {
    }
    __device__ __forceinline__ uint64_t operator()(uint32_t bytes) const
    {
        return kOnce ? wg_desc_add(desc, bytes) : wg_desc(addr + bytes, lbo, sbo);
    }
};

#ifdef FG_WGMMA_ENABLED
/* Orders register writes (accumulators, A fragments) before the next
 * wgmma reads them. */
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Generic-proxy shared-memory writes (st.shared, cp.async) become visible
 * to the async proxy that wgmma reads through. */
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#else
__device__ __forceinline__ void wg_fence() {}
__device__ __forceinline__ void wg_commit() {}
template <int N> __device__ __forceinline__ void wg_wait() {}
__device__ __forceinline__ void fence_proxy_async() {}
#endif

/* ---- TMA (bulk tensor copies) with mbarrier completion ---------------- */
#ifdef FG_WGMMA_ENABLED
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
/* Makes barrier initialisation visible to the async proxy (TMA). */
__device__ __forceinline__ void mbar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
/* Transaction bytes without an arrival: the first part of a load issued
 * in two parts, the second of which arrives (mbar_expect_tx). */
__device__ __forceinline__ void mbar_expect_tx_only(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
/* One arrival (no transaction bytes): a consumer releasing a buffer. */
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Named barriers 1..15 (0 is __syncthreads) between `threads` threads:
 * sync waits, arrive only counts (producer/consumer hand-offs). */
__device__ __forceinline__ void named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/* Warpgroup-wide register budget changes (warp specialisation): a
 * producer gives registers back, consumers take them. */
template <int R> __device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
/* Spins until the barrier's phase with parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* One box of a 4-D tensor map (coordinates innermost first) into shared
 * memory; completion is counted in bytes on `bar`. */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *tmap, uint32_t bar,
                                            int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
/* Plain bulk copy (size and addresses multiples of 16 bytes). */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes,
                                          uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* Element-wise fp32 add of a shared-memory run into global memory, done by
 * the TMA unit at the L2 (full lines instead of per-thread atomics); bulk
 * groups are per issuing thread. */
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
                 " [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* Four fp32 adds into 16 aligned bytes of global memory as one vector
 * reduction at the L2 (sm_90): a quarter of the scalar atomics. */
__device__ __forceinline__ void red_add_v4(float *p, float x, float y, float z, float w)
{
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(x), "f"(y),
                 "f"(z), "f"(w)
                 : "memory");
}
/* Until at most N of this thread's bulk groups still read their source. */
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
/* Until all of this thread's bulk groups have completed. */
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
/* One box of shared memory into a 4-D tensor map (the inverse of
 * tma_load_4d; rows and columns outside the tensor are not written),
 * completion tracked by this thread's bulk groups. */
__device__ __forceinline__ void tma_store_4d(const void *tmap, uint32_t src, int c0, int c1,
                                             int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group"
                 " [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(tmap),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
                 : "memory");
}
/* Four 8 x 8 16-bit matrices from registers to shared memory, transposed:
 * the inverse of ldmatrix_x4_trans (lane L gives row L % 8 of matrix
 * L / 8's address). */
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t r[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
/* The same, not transposed: lane L's register i holds row L / 4, columns
 * 2 (L % 4) and + 1 of matrix i (the accumulator layout). */
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t r[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
/* One poll of a turn counter: acquire, or relaxed (kRelaxed: the split-d
 * deterministic turns, whose adds are ordered by their completion waits). */
template <bool kRelaxed = false> __device__ __forceinline__ int turn_poll(const int *p)
{
    int x;
    if (kRelaxed)
        asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
    else
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
    return x;
}
/* A turn counter in global memory (the deterministic backward's dQ
 * order): waits until *p >= v (acquire, GPU scope; kRelaxed: relaxed
 * polls). Gives up after about four seconds, and then sets *giveup, which
 * ends every other wait of the launch at once: a block never hangs if the
 * hardware did not start the block it waits for (the sums stay right,
 * only their bitwise repeatability is lost). */
template <bool kRelaxed = false>
__device__ __forceinline__ void turn_wait(const int *p, int v, int *giveup)
{
    int x;
    uint64_t t0 = 0, t;
    for (uint32_t n = 0;; n++) {
        x = turn_poll<kRelaxed>(p);
        if (x >= v)
            return;
        if ((n & 1023) == 0) {
            asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(x) : "l"(giveup) : "memory");
            if (x)
                return;
            asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
            if (n == 0) {
                t0 = t;
            } else if (t - t0 > 4000000000ull) {
                asm volatile("st.relaxed.gpu.global.s32 [%0], 1;\n" ::"l"(giveup) : "memory");
                return;
            }
        }
    }
}
/* Passes the turn on: this thread's earlier writes (including completed
 * bulk operations) before the increment (release, GPU scope; kRelaxed:
 * relaxed, after the caller's wait for its bulk operations' completion). */
template <bool kRelaxed = false> __device__ __forceinline__ void turn_pass(int *p)
{
    if (kRelaxed)
        asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;\n" ::"l"(p) : "memory");
    else
        asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(p) : "memory");
}
#else
__device__ __forceinline__ void tma_store_4d(const void *, uint32_t, int, int, int, int) {}
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t, const uint32_t *) {}
__device__ __forceinline__ void stmatrix_x4(uint32_t, const uint32_t *) {}
__device__ __forceinline__ void bulk_reduce_add_f32(float *, uint32_t, uint32_t) {}
__device__ __forceinline__ void red_add_v4(float *, float, float, float, float) {}
__device__ __forceinline__ void bulk_commit() {}
template <int N> __device__ __forceinline__ void bulk_wait_read() {}
__device__ __forceinline__ void bulk_wait_all() {}
template <bool kRelaxed = false> __device__ __forceinline__ int turn_poll(const int *) { return 0; }
template <bool kRelaxed = false> __device__ __forceinline__ void turn_wait(const int *, int, int *) {}
template <bool kRelaxed = false> __device__ __forceinline__ void turn_pass(int *) {}
__device__ __forceinline__ void bulk_load(uint32_t, const void *, uint32_t, uint32_t) {}
__device__ __forceinline__ void mbar_init(uint32_t, uint32_t) {}
__device__ __forceinline__ void mbar_init_fence() {}
__device__ __forceinline__ void mbar_expect_tx(uint32_t, uint32_t) {}
__device__ __forceinline__ void mbar_expect_tx_only(uint32_t, uint32_t) {}
__device__ __forceinline__ void mbar_arrive(uint32_t) {}
__device__ __forceinline__ void named_sync(int, int) {}
__device__ __forceinline__ void named_arrive(int, int) {}
template <int R> __device__ __forceinline__ void setmaxnreg_dec() {}
template <int R> __device__ __forceinline__ void setmaxnreg_inc() {}
__device__ __forceinline__ void mbar_wait(uint32_t, uint32_t) {}
__device__ __forceinline__ void tma_load_4d(uint32_t, const void *, uint32_t, int, int, int, int) {}
#endif

/* Keeps the compiler from moving accumulator reads/writes across an
 * in-flight wgmma (the registers are written asynchronously). */
template <int R> __device__ __forceinline__ void wg_fence_regs(float (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

#ifdef FG_WGMMA_ENABLED
#include "wgmma_ops.inc"
#else
/* Other targets compile the kernels' host-visible shells only. */
template <typename T, int N> struct WgmmaOp {
    template <int TA, int TB>
    static __device__ __forceinline__ void ss(float (&)[N / 2], uint64_t, uint64_t, int) {}
    template <int TB>
    static __device__ __forceinline__ void rs(float (&)[N / 2], const uint32_t (&)[4], uint64_t, int) {}
};
#endif

/* Byte offset of 16-byte chunk `chunk` (of the full row) of row `row` in a
 * [D / 64 panels][rows][64] tile with the 128-byte swizzle. */
__device__ __forceinline__ uint32_t pswz(int row, int chunk, int rows)
{
    return (uint32_t)((chunk >> 3) * rows * 128 + row * 128 +
                      (((chunk & 7) ^ (row & 7)) << 4));
}

} /* namespace fg */

#endif /* FG_KERNELS_WGMMA_SM90_CUH */
