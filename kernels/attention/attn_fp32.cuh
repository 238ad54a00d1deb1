/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fp32.cuh - the pieces shared by the fp32 attention
 * kernels (attn_fp32_fwd.cu, attn_fp32_bwd.cu): tile shapes, tile loads,
 * the register-blocked SIMT products and the dropout draw of the row
 * layout.
 *
 * Every tile lives in shared memory row-major with the contraction index
 * contiguous or the output columns contiguous, rows padded to D + 4 floats:
 * a float4 read of row n at column x then lands in 16-byte bank group
 * (n + x/4) mod 8, so the 16 different rows a half-warp reads in the
 * Q K^T product are two wavefronts, the minimum. Each of the 256 threads
 * owns a micro-tile: 4 rows times 4 (or 2) columns of S, and 4 rows times
 * D/16 columns of O or dQ; the products read float4s and do 4-16 FMAs per
 * shared-memory load. Accumulation is fp32 in a fixed order (strict fp32:
 * no TF32, no reassociation across threads except dQ's atomics). */
#ifndef FG_KERNELS_ATTN_FP32_CUH
#define FG_KERNELS_ATTN_FP32_CUH

#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "attn_common.cuh"
#include "kernels/runtime/cuda_check.h"

namespace fg {
namespace f32 {

constexpr int kThreads = 256;
constexpr int kBr = 64; /* query rows of the forward and dQ kernels */

/* The head dim the kernels compute with: d padded to 32, 64, 128 or 256
 * with zero columns. */
__host__ __device__ constexpr int pad_d(int d)
{
    return d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : 256;
}
__host__ __device__ constexpr int cmin(int x, int y) { return x < y ? x : y; }

/* Keys per block of the forward and dQ kernels (d = 256: 32, so the tiles
 * fit an A100's 163 KiB too). */
template <int D> struct Cfg {
    static constexpr int BC = D == 256 ? 32 : 64;
    static constexpr int LD = D + 4;         /* operand tile row stride */
    static constexpr int LDP = kBr + 4;      /* P^T / dS^T row stride */
    static constexpr int TN = BC / 16;       /* keys per thread: tx + 16 w */
    /* O / dQ columns of thread tx: NCH chunks of VEC at tx VEC + 16 VEC ch */
    static constexpr int VEC = cmin(4, D / 16);
    static constexpr int NCH = D / (16 * VEC);
};

/* Shared-memory bytes of the kernels. */
template <int D> constexpr size_t fwd_smem()
{
    return sizeof(float) * ((size_t)(kBr + 2 * Cfg<D>::BC) * Cfg<D>::LD +
                            (size_t)Cfg<D>::BC * Cfg<D>::LDP);
}
template <int D> constexpr size_t dq_smem()
{
    return fwd_smem<D>() + sizeof(float) * (size_t)kBr * Cfg<D>::LD;
}
template <int D, int BR, int BC> constexpr size_t bwd_smem()
{
    return sizeof(float) * ((size_t)(2 * BC + 2 * BR) * (D + 4) +
                            2 * (size_t)BC * (BR + 4) + 3 * (size_t)BR);
}

/* Rows s0 .. s0+R-1 of head h into a [R][D + 4] tile; rows at or past
 * `valid` and columns at or past d are zero (harmless in every product). */
template <int D, int R>
__device__ __forceinline__ void load_rows(float *dst, const Operand &t, int64_t b,
                                          int64_t s0, int64_t h, int valid, int d)
{
    const float *base = (const float *)t.ptr + b * t.sb + h * t.sh;
#pragma unroll 4
    for (int idx = threadIdx.x; idx < R * D; idx += kThreads) {
        const int r = idx / D, x = idx % D;
        dst[r * (D + 4) + x] = r < valid && x < d ? base[(s0 + r) * t.ss + x] : 0.f;
    }
}

template <int N>
__device__ __forceinline__ void lds(float (&v)[N], const float *p)
{
    if constexpr (N == 4) {
        const float4 t = *(const float4 *)p;
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else if constexpr (N == 2) {
        const float2 t = *(const float2 *)p;
        v[0] = t.x, v[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            v[i] = p[i];
    }
}

/* acc[u][w] += sum_{x < K} A[m0 + u][x] B[n0 + w NS][x] (row strides LD):
 * S = Q K^T, dP = dO V^T and their transposes. */
template <int K, int LD, int TM, int TN, int NS>
__device__ __forceinline__ void gemm_nt(float (&acc)[TM][TN], const float *A, int m0,
                                        const float *B, int n0)
{
#pragma unroll 2
    for (int x = 0; x < K; x += 4) {
        float a[TM][4], bb[TN][4];
#pragma unroll
        for (int u = 0; u < TM; u++)
            lds<4>(a[u], A + (m0 + u) * LD + x);
#pragma unroll
        for (int w = 0; w < TN; w++)
            lds<4>(bb[w], B + (n0 + w * NS) * LD + x);
#pragma unroll
        for (int e = 0; e < 4; e++)
#pragma unroll
            for (int u = 0; u < TM; u++)
#pragma unroll
                for (int w = 0; w < TN; w++)
                    acc[u][w] = fmaf(a[u][e], bb[w][e], acc[u][w]);
    }
}

/* acc[u][c VEC + e] += sum_{k < K} At[k][m0 + u] B[k][n0 + c CS + e]
 * (At row stride LDA, B row stride LDB): O += P V and dQ += dS K with P^T,
 * dS^T stored. */
template <int K, int LDA, int LDB, int VEC, int NCH, int CS>
__device__ __forceinline__ void gemm_tn(float (&acc)[4][VEC * NCH], const float *At, int m0,
                                        const float *B, int n0)
{
#pragma unroll 4
    for (int k = 0; k < K; k++) {
        float a[4];
        lds<4>(a, At + k * LDA + m0);
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            float bb[VEC];
            lds<VEC>(bb, B + k * LDB + n0 + c * CS);
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[u][c * VEC + e] = fmaf(a[u], bb[e], acc[u][c * VEC + e]);
        }
    }
}

/* acc[u][c VEC + e] += sum_{k < K} A[m0 + u][k] B[k][n0 + c CS + e]:
 * dV += P^T dO and dK += dS^T Q with P^T, dS^T stored. */
template <int K, int LDA, int LDB, int VEC, int NCH, int CS>
__device__ __forceinline__ void gemm_nn(float (&acc)[4][VEC * NCH], const float *A, int m0,
                                        const float *B, int n0)
{
#pragma unroll 2
    for (int k = 0; k < K; k += 4) {
        float a[4][4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            lds<4>(a[u], A + (m0 + u) * LDA + k);
#pragma unroll
        for (int e = 0; e < 4; e++)
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                float bb[VEC];
                lds<VEC>(bb, B + (k + e) * LDB + n0 + c * CS);
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int v = 0; v < VEC; v++)
                        acc[u][c * VEC + v] = fmaf(a[u][e], bb[v], acc[u][c * VEC + v]);
            }
    }
}

/* Keep bits of row i for the 8 keys jb + 8n + e (n = 0..3, e = 0..1; bit
 * 2n + e) of one Philox call, jb = 32c + 2q (lib/core/dropout_map.h). */
__device__ __forceinline__ uint32_t keep_bits8(const AttnArgs &a, int64_t bh, int64_t i,
                                               int64_t jb)
{
    const uint4 w = dropout_call(a, bh, i, jb);
    const int r = (int)((i >> 3) & 1); /* row i is the call's row r */
    uint32_t bits = 0;
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int e = 0; e < 2; e++)
            bits |= (uint32_t)fwd_kept(a, w, r, n, e) << (2 * n + e);
    return bits;
}

/* Keep bits (bit u: key jg + u) of row i for the 4 keys jg .. jg+3 (jg a
 * multiple of 4): two calls, (j / 2) % 4 differs between the pairs. */
__device__ __forceinline__ uint32_t keep_bits4(const AttnArgs &a, int64_t bh, int64_t i,
                                               int64_t jg)
{
    const int n = (int)((jg >> 3) & 3);
    const int64_t j1 = jg + 2;
    const uint32_t lo = keep_bits8(a, bh, i, (jg & ~(int64_t)31) | (jg & 6)),
                   hi = keep_bits8(a, bh, i, (j1 & ~(int64_t)31) | (j1 & 6));
    return ((lo >> (2 * n)) & 3u) | (((hi >> (2 * n)) & 3u) << 2);
}

/* The row layout (forward, dQ): thread (ty, tx) = (tid / 16, tid % 16)
 * owns rows 4 ty + u and keys tx + 16 w (w < 4) of a tile whose first key
 * j0 is a multiple of its width. The row's keys lie in the 8 calls
 * (c, q) of keys base + 32c + 2q + 8n + e (base = j0 rounded down to 32):
 * lane tx & 7 of the half-warp draws call (c, q) = (tx / 4 % 2, tx % 4)
 * (lanes 8-15 repeat it, at no extra time), and the lanes read their bit
 * with one shuffle. */
struct RowDrop {
    uint32_t mine; /* the bits this lane drew for the current row */
    int64_t base;
    __device__ __forceinline__ void draw(const AttnArgs &a, int64_t bh, int64_t i,
                                         int64_t j0, int tx, int bc)
    {
        (void)bc;
        base = j0 & ~(int64_t)31;
        mine = keep_bits8(a, bh, i, base + 32 * ((tx >> 2) & 1) + 2 * (tx & 3));
    }
    /* Whether key j0 + tx + 16 w is kept; every lane of the warp must call
     * it with the same j0 as draw. */
    __device__ __forceinline__ bool kept(int64_t j0, int w, int tx) const
    {
        const int jr = (int)(j0 - base) + tx + 16 * w;
        const int lane = threadIdx.x & 31;
        const int src = 4 * ((jr >> 5) & 1) + ((jr >> 1) & 3);
        const uint32_t bits = __shfl_sync(0xffffffffu, mine, (lane & 16) | src);
        return (bits >> (2 * ((jr >> 3) & 3) + (jr & 1))) & 1u;
    }
};

/* The logits of a row-layout tile s (raw q.k on entry) of rows r0 + u,
 * keys j0 + tx + 16 w: scale, softcap, ALiBi, -inf outside the mask, and
 * dc = 1 - tanh^2 (1 without softcap; unused values are optimised away).
 * The bias is not supported here (the dispatch sends it to the general
 * kernels). */
template <int TN>
__device__ __forceinline__ void row_logits(const AttnArgs &a, float (&s)[4][TN], int64_t r0,
                                           int64_t j0, int tx, float slope,
                                           float (&dc)[4][TN])
{
    const float scale = (float)a.scale;
    const bool plain = !(a.softcap > 0.f) && !a.alibi && j0 + 16 * TN <= a.Nk &&
                       inside_band(a, r0, r0 + 3, j0, 16 * TN);
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int w = 0; w < TN; w++) {
            dc[u][w] = 1.f;
            if (plain) {
                s[u][w] *= scale;
                continue;
            }
            const int64_t i = r0 + u, j = j0 + tx + 16 * w;
            s[u][w] = visible(a, i, j)
                          ? score_mod<float>(a, s[u][w] * scale, slope, i, j, &dc[u][w])
                          : -INFINITY;
        }
}

/* Row-layout epilogue: rows 4 ty + u (< rows) of head h of operand t get
 * acc times f[u] in columns x < d. */
template <int VEC, int NCH>
__device__ __forceinline__ void store_row_tile(const Operand &t, int64_t b, int64_t r0, int64_t h,
                                               int rows, int d, int tx,
                                               const float (&acc)[4][VEC * NCH],
                                               const float (&f)[4])
{
    const int ty = threadIdx.x >> 4;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        if (4 * ty + u >= rows)
            continue;
        float *row = elem<float>(t, b, r0 + u, h);
#pragma unroll
        for (int c = 0; c < NCH; c++)
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const int x = c * 16 * VEC + VEC * tx + e;
                if (x < d)
                    row[x] = acc[u][c * VEC + e] * f[u];
            }
    }
}

/* Launches a row-layout kernel (forward, dQ): one block per 64 query rows,
 * query head and batch. */
inline fg_status launch_rows(void (*kernel)(AttnArgs), size_t smem, const AttnArgs &a,
                             cudaStream_t st)
{
    FG_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
    dim3 grid((unsigned)((a.Nq + kBr - 1) / kBr), (unsigned)a.H, (unsigned)a.B);
    kernel<<<grid, kThreads, smem, st>>>(a);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* f(std::integral_constant<int, D>()) for d's padded head dim D. */
template <typename F> inline fg_status with_pad_d(int d, F f)
{
    switch (pad_d(d)) {
    case 32: return f(std::integral_constant<int, 32>());
    case 64: return f(std::integral_constant<int, 64>());
    case 128: return f(std::integral_constant<int, 128>());
    default: return f(std::integral_constant<int, 256>());
    }
}

/* Which kernels fp32 may take: the bias runs on the general kernels. */
inline bool usable(const AttnArgs &a)
{
    return !a.bias && !env_is("FG_ATTN_KERNEL", "general");
}

} /* namespace f32 */
} /* namespace fg */

#endif /* FG_KERNELS_ATTN_FP32_CUH */
