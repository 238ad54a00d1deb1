/* SPDX-License-Identifier: MIT */
/* kernels/attention/mma_sm80.cuh - thin wrappers over the sm_80+ warp-level tensor-core
 * instructions used by the fast fp16/bf16 kernels and the TF32 fp32 ones:
 * cp.async (16-byte, zero-filling), ldmatrix (plain and transposed),
 * mma.sync m16n8k16 (fp16/bf16) and m16n8k8 (TF32) with fp32 accumulators. Fragment layouts (PTX ISA, "Matrix fragments for
 * mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
 *   A (16x16, row):  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
 *   B (16x8, col):   b0 (k 2t..2t+1, n g)   b1 (k 2t+8.., n g)
 *   C (16x8, f32):   c0,c1 (g, 2t..2t+1)    c2,c3 (g+8, 2t..2t+1)
 * Shared-memory tiles of 16-byte chunks are XOR-swizzled (chunk ^ row % 8)
 * so that the eight row addresses of one ldmatrix phase hit distinct banks. */
#ifndef FG_KERNELS_MMA_SM80_CUH
#define FG_KERNELS_MMA_SM80_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attn_traits.cuh"

namespace fg {

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy global -> shared; src_bytes = 0 fills zeros. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src,
                                           int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr)
{
    asm volatile(
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(addr));
}

/* D = A B + D, fp32 accumulators. */
template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float c[4], const uint32_t a[4],
                                               uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                       "r"(b1));
    }
};
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float c[4], const uint32_t a[4],
                                               uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                       "r"(b1));
    }
};

/* TF32: mma.sync m16n8k8 (half the k of the 16-bit ones, same register
 * counts), fp32 accumulators. Fragments hold fp32 bit patterns already
 * rounded by to_tf32; with k index t = lane % 4 and g = lane / 4:
 *   A (16x8, row): a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
 *   B (8x8, col):  b0 (k t, n g)  b1 (k t+4, n g)
 *   C: as m16n8k16. */
struct Tf32 {};
template <> struct Mma<Tf32> {
    static __device__ __forceinline__ void run(float c[4], const uint32_t a[4],
                                               uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                       "r"(b1));
    }
};
/* fp32 -> TF32, round to nearest: 10 mantissa bits, relative error <=
 * 2^-11; NaN and inf are kept. sm_90 has an instruction for ties to even
 * (cvt.rn: one F2FP.TF32); sm_80 has only ties away (cvt.rna), which ptxas
 * expands to four (a test for inf/NaN, an add, a mask). The two differ only
 * on exact ties. The TF32 kernels round every K, V, Q and dO element they
 * load and every P and dS, so on an H100 this is a tenth of the TF32
 * forward's loop (scripts/sass-loops.py). */
__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#endif
    return r;
}

/* Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile whose
 * rows hold `chunks` chunks (a power of two >= 4; with 4 chunks per row an
 * 8-row ldmatrix phase still has 2-way conflicts). */
__device__ __forceinline__ uint32_t swz(int row, int chunk, int chunks)
{
    const int mask = (chunks < 8 ? chunks : 8) - 1;
    return (uint32_t)((row * chunks + (chunk ^ (row & mask))) * 16);
}

/* Async copy of `rows` rows (s0 ..) of one head of a strided operand into a
 * swizzled [rows][D] tile; rows >= valid and columns >= d are zero-filled
 * (cp.async with a source size of 0). */
template <typename T, int D>
__device__ __forceinline__ void load_rows(uint32_t sbase, const Operand &t,
                                          int64_t b, int64_t s0, int64_t h,
                                          int rows, int valid, int d,
                                          int nthreads)
{
    constexpr int C = D / 8;
    const T *base = (const T *)t.ptr + b * t.sb + h * t.sh;
    for (int idx = threadIdx.x; idx < rows * C; idx += nthreads) {
        const int r = idx / C, c = idx - r * C;
        const bool ok = r < valid && c * 8 < d;
        const T *src = ok ? base + (s0 + r) * t.ss + c * 8 : base;
        cp_async16(sbase + swz(r, c, C), src, ok ? 16 : 0);
    }
}

} /* namespace fg */

#endif /* FG_KERNELS_MMA_SM80_CUH */
