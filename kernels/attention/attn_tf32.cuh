/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_tf32.cuh - the pieces shared by the TF32 attention
 * kernels (attn_tf32_fwd.cu, attn_tf32_bwd.cu): fp32 tiles in shared
 * memory, their rounding to TF32, the m16n8k8 fragment loads, and the
 * 3xTF32 split (Frag, mma).
 *
 * The kernels run in two precisions (template flag kSplit): TF32, the
 * opt-in of fg_cuda_set_attention_allow_tf32 (operands rounded to TF32,
 * one MMA per product), and 3xTF32 (every operand of every product split
 * into a TF32 big part and a TF32 remainder, three MMAs), strict fp32's
 * default since session 40 (see precision() below). Everything else (tiles,
 * masks, modifiers, dropout, GQA, strides) is the same code.
 *
 * 3xTF32 accuracy. The split loses about 2^-22 relative per product (the
 * dropped al bl and the rounding of l); what remains is the accumulation,
 * in the MMA accumulator as in TF32 mode. The tensor cores do not round an
 * MMA's sum to nearest (Fasi et al., 2021, found round-toward-zero on the
 * V100, T4 and A100): each MMA into a long-lived accumulator may shift it
 * by up to an ulp, one way, and 3xTF32 does three MMAs per k step. A CPU
 * model of that (every MMA's sum truncated) puts the forward at 5-6e-6 of
 * max |O| for sharp softmaxes (logits up to 13, d = 128-256) and about
 * 1e-5 of max |O| at Nk = 4096 (O small there: 1e-6 of the test's 0.1
 * floor); with round to nearest, 1e-6. Keeping S's small terms in an
 * accumulator of their own, or summing each key block's P V apart, halves
 * that in the model but cost 30-80 registers and spills here (tried).
 * Since session 39 `mma` sums each k step's three products in a zeroed
 * tile and adds that to the accumulator in fp32 (round to nearest): the
 * truncations are then relative to one step's partial sum (model:
 * 4.2e-5 -> 4.0e-7 on a dK over 4097 rows; scripts/tf32x3-model.py). On
 * an H200 (session 40) every output of test_gpu_fp32 then stays within
 * 0.31 of the strict 1e-5 bound (dK at N = 4097: 0.10; 5.5e-5 before).
 *
 * Tiles are fp32, row-major, rows padded to D + 4 floats. Then the eight
 * 16-byte rows of one ldmatrix phase fall in distinct bank groups (row r at
 * chunk r (D/4 + 1), odd), and a scalar read of element (2t + e, g) over
 * a warp (t = lane % 4, g = lane / 4) hits banks 8t + g: all distinct, so
 * no swizzle is needed. Tiles arrive by cp.async; in TF32 mode each thread
 * rounds the chunks it copied to TF32 in place (cvt.rna) before the barrier
 * that publishes them, so fragments need no conversion when read. In
 * 3xTF32 mode the tiles stay fp32 and each fragment is split in registers
 * as it is read (two tiles per operand would not fit two blocks per SM),
 * except at d = 128, where blocks of 8 warps split the tiles every warp
 * reads (K, V forward; Q_i, dO_i backward) once into shared memory
 * (split_rows): the per-warp splits were half the instructions.
 *
 * ldmatrix (.b16) moves 32-bit data unchanged: lane L receives row L / 4,
 * 4-byte word L % 4 of each 8 x 16-byte matrix, which is the m16n8k8 TF32
 * A layout for a row-major [m][k] tile and the B layout for an [n][k] one
 * (S = Q K^T, S^T = K Q^T, dP^T = V dO^T).
 *
 * A product whose A operand comes from an accumulator (P V, P^T dO,
 * dS^T Q, dS K) uses a pair permutation of the contraction index: k index
 * t stands for element 2t of the 8-slice, t + 4 for 2t + 1. The C layout
 * (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) is then the A layout with no
 * shuffle (c_to_a), and the B operand is read as rows 2t and 2t + 1 of a
 * row-major [k][n] tile (ldb_pairs). The sum runs over the same terms. */
#ifndef FG_KERNELS_ATTN_TF32_CUH
#define FG_KERNELS_ATTN_TF32_CUH

#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "attn_fp32.cuh"
#include "attn_kernels.h"
#include "attn_mma_tile.cuh"
#include "kernels/runtime/cuda_context.h"
#include "mma_sm80.cuh"

namespace fg {
namespace tf32 {

/* Async copy of rows s0 .. s0+rows-1 of head h into a [rows][D + 4] fp32
 * tile; rows >= valid and columns >= d are zero-filled. kPairs: thread
 * idx copies chunk c of both rows 2p and 2p + 1 (rows even), the chunks
 * round_rows_pairs then permutes: each thread must round only what its own
 * cp.async wrote (cp.async.wait covers the calling thread's copies alone;
 * the barrier comes after the rounding). */
template <int D, bool kPairs = false>
__device__ __forceinline__ void load_rows(uint32_t sbase, const Operand &t, int64_t b,
                                          int64_t s0, int64_t h, int rows, int valid, int d,
                                          int nthreads)
{
    constexpr int C = D / 4; /* 16-byte chunks per row */
    const float *base = (const float *)t.ptr + b * t.sb + h * t.sh;
    auto one = [&](int r, int c) {
        const bool ok = r < valid && c * 4 < d;
        const float *src = ok ? base + (s0 + r) * t.ss + c * 4 : base;
        cp_async16(sbase + (uint32_t)(r * (D + 4) + c * 4) * 4, src, ok ? 16 : 0);
    };
    if constexpr (kPairs) {
        for (int idx = threadIdx.x; idx < (rows / 2) * C; idx += nthreads) {
            const int p = idx / C, c = idx - p * C;
            one(2 * p, c);
            one(2 * p + 1, c);
        }
    } else {
        for (int idx = threadIdx.x; idx < rows * C; idx += nthreads) {
            const int r = idx / C;
            one(r, idx - r * C);
        }
    }
}

/* f(offset) for each 16-byte chunk that load_rows<D> (same rows,
 * nthreads) made this thread copy, offset in floats into the [rows][D + 4]
 * tile: the chunks a thread may touch after its own cp.async.wait, before
 * the barrier that publishes the tile. */
template <int D, typename F>
__device__ __forceinline__ void own_chunks(int rows, int nthreads, F f)
{
    constexpr int C = D / 4;
    for (int idx = threadIdx.x; idx < rows * C; idx += nthreads) {
        const int r = idx / C;
        f(r * (D + 4) + (idx - r * C) * 4);
    }
}

__device__ __forceinline__ float4 tf32x4(float4 v)
{
    return make_float4(__uint_as_float(to_tf32(v.x)), __uint_as_float(to_tf32(v.y)),
                       __uint_as_float(to_tf32(v.z)), __uint_as_float(to_tf32(v.w)));
}

/* Rounds the chunks this thread copied with load_rows to TF32 in place. */
template <int D>
__device__ __forceinline__ void round_rows(float *tile, int rows, int nthreads)
{
    own_chunks<D>(rows, nthreads, [&](int o) {
        float4 *p = (float4 *)(tile + o);
        *p = tf32x4(*p);
    });
}

/* 3xTF32 split of a tile in shared memory, for kernels whose warps all
 * read the same K or V tile: the chunks this thread copied with
 * load_rows become their TF32 big part in place and the remainder into
 * `lo` (same layout), once per block instead of once per warp in
 * registers. Same values as Frag::split, so the products are bitwise those
 * of splitting in registers. */
template <int D>
__device__ __forceinline__ void split_rows(float *tile, float *lo, int rows, int nthreads)
{
    own_chunks<D>(rows, nthreads, [&](int o) {
        float4 *p = (float4 *)(tile + o);
        const float4 v = *p, h = tf32x4(v);
        *p = h;
        *(float4 *)(lo + o) = tf32x4(make_float4(v.x - h.x, v.y - h.y, v.z - h.z, v.w - h.w));
    });
}

/* Named barrier `id` (1..15; 0 is __syncthreads) of `threads` threads:
 * the two warps of a pair (kPair kernels) handing each other a tile. */
__device__ __forceinline__ void pair_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* A fragment (rows m0 .. m0+15, k0 .. k0+7) of a row-major [m][k] tile
 * with LD floats per row, at shared address `tile`. */
template <int LD>
__device__ __forceinline__ void lda_rows(uint32_t a[4], uint32_t tile, int m0, int k0)
{
    const int lane = threadIdx.x & 31;
    const int r = m0 + (lane & 7) + 8 * ((lane >> 3) & 1), c = k0 + 4 * (lane >> 4);
    ldmatrix_x4(a, tile + (uint32_t)(r * LD + c) * 4);
}

/* B fragments of two n8 tiles (n0 .. n0+7: b[0], b[1]; n0+8 ..: b[2],
 * b[3]) over k0 .. k0+7 of an [n][k] tile. */
template <int LD>
__device__ __forceinline__ void ldb_rows(uint32_t b[4], uint32_t tile, int n0, int k0)
{
    const int lane = threadIdx.x & 31;
    const int r = n0 + (lane & 7) + 8 * (lane >> 4), c = k0 + 4 * ((lane >> 3) & 1);
    ldmatrix_x4(b, tile + (uint32_t)(r * LD + c) * 4);
}

/* B fragment, pair-permuted, of k0 .. k0+7, n0 .. n0+7 of a row-major
 * [k][n] tile (already TF32). */
template <int LD>
__device__ __forceinline__ void ldb_pairs(const float *tile, int k0, int n0, uint32_t *b0,
                                          uint32_t *b1)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float *p = tile + (k0 + 2 * t) * LD + n0 + g;
    *b0 = __float_as_uint(p[0]);
    *b1 = __float_as_uint(p[LD]);
}

/* V of the TF32 forward's O += P V: round a row-major [rows][D] tile
 * (rows even) to TF32 in place, into the pair-interleaved layout that
 * ldb_pairs_il reads with one 8-byte load per fragment instead of two
 * 4-byte ones (a quarter of the forward loop's loads at d = 128). Chunk c
 * (16 bytes) of rows 2p and 2p + 1 holds, for columns x = 4c, 4c + 1 (row
 * 2p) and x = 4c + 2, 4c + 3 (row 2p + 1), the elements (2p, x), (2p + 1,
 * x), (2p, x + 1), (2p + 1, x + 1): element (k, n) is at row 2 (k / 2) +
 * (n % 4) / 2, float 4 (n / 4) + 2 (n % 2) + k % 2. A half-warp's eight
 * rows (rows padded to D + 4 floats) then fall in distinct bank quads.
 * The tile must come from load_rows<D, true> (the same pair mapping, so a
 * thread permutes only chunks its own copies wrote). */
template <int D>
__device__ __forceinline__ void round_rows_pairs(float *tile, int rows, int nthreads)
{
    constexpr int C = D / 4, LD = D + 4;
    auto r = [](float x) { return __uint_as_float(to_tf32(x)); };
    for (int idx = threadIdx.x; idx < (rows / 2) * C; idx += nthreads) {
        const int p = idx / C, c = idx - p * C;
        float4 *p0 = (float4 *)(tile + 2 * p * LD + c * 4), *p1 = (float4 *)(tile + (2 * p + 1) * LD + c * 4);
        const float4 u = *p0, v = *p1;
        *p0 = make_float4(r(u.x), r(v.x), r(u.y), r(v.y));
        *p1 = make_float4(r(u.z), r(v.z), r(u.w), r(v.w));
    }
}

/* ldb_pairs from a round_rows_pairs tile. */
template <int LD>
__device__ __forceinline__ void ldb_pairs_il(const float *tile, int k0, int n0, uint32_t *b0,
                                             uint32_t *b1)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, n = n0 + g;
    const float2 v = *reinterpret_cast<const float2 *>(
        tile + (k0 + 2 * t + ((n & 3) >> 1)) * LD + (n >> 2) * 4 + (n & 1) * 2);
    *b0 = __float_as_uint(v.x);
    *b1 = __float_as_uint(v.y);
}

/* A fragment, pair-permuted, of rows m0 .. m0+15 over k0 .. k0+7 from a
 * transposed, row-major [k][m] tile (dS^T for dQ = dS K). */
template <int LD>
__device__ __forceinline__ void lda_pairs_t(uint32_t a[4], const float *tile, int k0, int m0)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float *p = tile + (k0 + 2 * t) * LD + m0 + g;
    a[0] = __float_as_uint(p[0]);
    a[1] = __float_as_uint(p[8]);
    a[2] = __float_as_uint(p[LD]);
    a[3] = __float_as_uint(p[LD + 8]);
}

/* N fragment registers of one operand. TF32 (kSplit = false): h holds
 * the value rounded to TF32. 3xTF32 (kSplit): h = tf32(x), the "big" part,
 * and l = tf32(x - h), the "small" remainder (x - h is exact in fp32; h + l
 * is x to about 2^-22 relative), so that a b = ah bh + ah bl + al bh up to
 * the dropped al bl (2^-22 relative) and the rounding of l: strict-fp32
 * products on TF32 tensor cores (CUTLASS's OpMultiplyAddFastF32). l is
 * never touched without kSplit, so the TF32 code is unchanged. An infinite
 * x gives l = NaN: 3xTF32 turns infinities into NaN. */
template <int N, bool kSplit> struct Frag {
    uint32_t h[N], l[N];

    /* h holds raw fp32 bits (tiles are not rounded in kSplit mode): split
     * them. Without kSplit h came from a rounded tile: nothing to do. */
    __device__ __forceinline__ void split()
    {
        if constexpr (kSplit) {
#pragma unroll
            for (int i = 0; i < N; i++)
                set(i, __uint_as_float(h[i]));
        }
    }
    /* Element i from an fp32 value: rounded, or split. */
    __device__ __forceinline__ void set(int i, float x)
    {
        h[i] = to_tf32(x);
        if constexpr (kSplit)
            l[i] = to_tf32(x - __uint_as_float(h[i]));
    }
    /* (N = 4) an accumulator tile as the pair-permuted A fragment. */
    __device__ __forceinline__ void from_acc(const float c[4])
    {
        set(0, c[0]);
        set(1, c[2]);
        set(2, c[1]);
        set(3, c[3]);
    }
};

/* t += a b with B registers j, j + 1 of b, no fp32 add (mma_into): one
 * TF32 product, or the three of 3xTF32. Kernels that sum G k steps in one
 * tile (kGroup) call it G times, then add the tile.
 *
 * c += a b with B registers j, j + 1 of b (mma): one TF32 product, or (kSplit)
 * the three of 3xTF32 (the small terms first) into a zeroed tile of their
 * own, added to c in fp32 (round to nearest). Each MMA's truncated sum is
 * then off by an ulp of this k step's partial sum, not of the accumulator,
 * which may be far larger and, for O, dK and dV, runs over a whole walk.
 * CPU model (scripts/tf32x3-model.py): dK over N = 4097 queries, max
 * error / max |ref| 4.2e-5 into c, 4.0e-7 by the tile; a logit of 13 over
 * d = 256, error 3.1e-5 -> 3.8e-6. Four transient registers and four
 * FADDs per three MMAs; ptxas spills 20-800 bytes in the 3xTF32 kernels
 * at d = 32-256 for them (none in the TF32 ones, which do not change). */
template <bool kSplit, int NB>
__device__ __forceinline__ void mma_into(float t[4], const Frag<4, kSplit> &a,
                                         const Frag<NB, kSplit> &b, int j)
{
    if constexpr (kSplit) {
        Mma<Tf32>::run(t, a.l, b.h[j], b.h[j + 1]);
        Mma<Tf32>::run(t, a.h, b.l[j], b.l[j + 1]);
    }
    Mma<Tf32>::run(t, a.h, b.h[j], b.h[j + 1]);
}
template <bool kSplit, int NB>
__device__ __forceinline__ void mma(float c[4], const Frag<4, kSplit> &a,
                                    const Frag<NB, kSplit> &b, int j)
{
    if constexpr (kSplit) {
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        mma_into(t, a, b, j);
#pragma unroll
        for (int i = 0; i < 4; i++)
            c[i] += t[i];
    } else {
        mma_into(c, a, b, j);
    }
}

/* The operand rows the kernels copy with cp.async: 16-byte aligned
 * pointers, strides multiples of 4 floats. */
inline bool aligned(const Operand &t)
{
    return (uintptr_t)t.ptr % 16 == 0 && t.sb % 4 == 0 && t.ss % 4 == 0 && t.sh % 4 == 0;
}

/* Which tensor-core fp32 kernels take a problem: TF32 with the opt-in;
 * otherwise 3xTF32, strict fp32's default where it is built (since
 * session 40: within 1e-5 of max |ref| in test_gpu_fp32 on an H200, every
 * output at <= 0.31 of that bound; session 41, H200, N 4k: forward /
 * backward 1.00-2.48x / 1.00-1.88x the efficient kernel at d = 32-128;
 * session 43: d = 256 1.05-1.09x / 1.03-1.05x);
 * none (the SIMT kernels run) outside the sm80 kernels' cover (a bias,
 * packed or key-padded batches), for operands not 16-byte aligned, in
 * builds without 3xTF32 (./configure --disable-attn-tf32x3), or with
 * FG_ATTN_KERNEL=general or =simt. At d = 256 attn_tf32_bwd takes kSplit
 * only on its paired-warp kernel (BwdTile::kPair: 220 KiB of shared
 * memory, FG_ATTN_TF32_PAIR unset); its two-launch kernel was slower in
 * 3xTF32 than the SIMT kernels. */
enum class Prec { kNone, kTf32, kSplit };
/* The 3xTF32 instantiations exist unless ./configure
 * --disable-attn-tf32x3 (they cost build time). */
#ifdef FG_ATTN_TF32X3
constexpr bool kHaveSplit = true;
#else
constexpr bool kHaveSplit = false;
#endif
inline Prec precision(const AttnArgs &a, bool backward)
{
    if (env_is("FG_ATTN_KERNEL", "general") || env_is("FG_ATTN_KERNEL", "simt") ||
        !tf32_supports(a))
        return Prec::kNone;
    bool ok = aligned(a.q) && aligned(a.k) && aligned(a.v) && aligned(a.o);
    if (backward)
        ok = ok && aligned(a.dout) && aligned(a.dq) && aligned(a.dk) && aligned(a.dv);
    if (!ok)
        return Prec::kNone;
    if (fg_cuda_attention_tf32_allowed())
        return Prec::kTf32;
    return kHaveSplit ? Prec::kSplit : Prec::kNone;
}

/* A launch's block count limit. Under a causal or variant mask the grid
 * is (heads, blocks, B), heads fastest, so every head of a batch issues
 * its longest block before any issues its next (H200, sessions 60-62:
 * causal +4-15% forward, +3-13% backward against (blocks, heads, B));
 * unmasked it stays (blocks, heads, B), where a head's blocks share its
 * operands in L2 (heads fastest cost d = 64 up to 5.5%). Heads fastest,
 * more blocks than this go in several launches (a build with
 * -DFG_ATTN_TF32_GRID_Y=2 runs them at the tests' sizes). */
#ifndef FG_ATTN_TF32_GRID_Y
#define FG_ATTN_TF32_GRID_Y 65535
#endif
constexpr int64_t kMaxGridY = FG_ATTN_TF32_GRID_Y;

/* The order above, one test for kernels and launches alike: masked (kMode
 * 2, the variants, whose band may be causal or not) or plain causal. */
__host__ __device__ __forceinline__ bool heads_fastest(bool masked, bool causal)
{
    return masked || causal;
}

/* A block's (block index within its launch, head) from blockIdx. */
struct GridPos {
    int blk, head;
};
__device__ __forceinline__ GridPos grid_pos(bool hfast)
{
    return hfast ? GridPos{(int)blockIdx.y, (int)blockIdx.x}
                 : GridPos{(int)blockIdx.x, (int)blockIdx.y};
}

/* Launches nblk blocks per (head, batch) in the order above: go(grid, c)
 * launches blocks c .. c + grid's block extent - 1. Only the heads-fastest
 * grid puts blocks on y and may need several launches. */
template <typename Go>
inline fg_status launch_grids(bool hfast, int64_t nblk, int64_t heads, int64_t B, Go go)
{
    const int64_t cap = hfast ? kMaxGridY : nblk;
    for (int64_t c = 0; c < nblk; c += cap) {
        const unsigned n = (unsigned)(nblk - c < cap ? nblk - c : cap);
        go(hfast ? dim3((unsigned)heads, n, (unsigned)B) : dim3(n, (unsigned)heads, (unsigned)B),
           c);
        FG_CUDA_TRY_LAUNCH();
    }
    return FG_OK;
}

/* f(integral_constant<int, kMode>, integral_constant<bool, kDropout>)
 * for a's instantiation: 2 the variants, 0 no mask or plain causal (the
 * sm80 kernels' kMode; a.causal tells the two apart at run time, which
 * saves an instantiation per kernel and only costs a test on masked
 * tiles). Dropout is a run-time flag too (a.dropout): the kDropout = true
 * kernels serve both settings, which halves this opt-in path's build; the
 * backward then takes keep bits of all ones and keep_scale 1 (p = 0), so
 * its P z and dP z round as without dropout, and uses no more registers
 * (ptxas, sm_90: doc/performance.md, session 12). */
template <typename F> inline fg_status with_mode(const AttnArgs &a, F f)
{
    using Drop = std::true_type;
    if (a.variant)
        return f(std::integral_constant<int, 2>(), Drop());
    return f(std::integral_constant<int, 0>(), Drop());
}

} /* namespace tf32 */
} /* namespace fg */

#endif /* FG_KERNELS_ATTN_TF32_CUH */
