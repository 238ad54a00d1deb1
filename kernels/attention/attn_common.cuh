/* kernels/attention/attn_common.cuh - device pieces shared by the forward and backward
 * kernels: strided tile loads/stores, the causal mask, and dropout (cuRAND's
 * Philox4x32-10 with the counter/key mapping of lib/core/dropout_map.h, the same
 * the CPU reimplements). */
#ifndef FG_KERNELS_ATTN_COMMON_CUH
#define FG_KERNELS_ATTN_COMMON_CUH

#include <curand_kernel.h>

#include "attn_traits.cuh"
#include "lib/core/dropout_map.h"

namespace fg {

template <typename T>
__device__ __forceinline__ T *elem(const Operand &t, int64_t b, int64_t s,
                                   int64_t h)
{
    return (T *)t.ptr + b * t.sb + s * t.ss + h * t.sh;
}

/* Load rows s0 .. s0+rows-1 of head h into a [rows, ld] tile of A; rows at
 * or past `valid` are zero-filled so padded lanes compute harmless zeros. */
template <typename T, typename A>
__device__ __forceinline__ void load_tile(A *dst, int ld, const Operand &t,
                                          int64_t b, int64_t s0, int64_t h,
                                          int rows, int valid, int d)
{
    for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
        const int r = idx / d, x = idx - r * d;
        dst[r * ld + x] = r < valid ? to_acc(elem<T>(t, b, s0 + r, h)[x]) : A(0);
    }
}

/* Causal visibility with bottom-right alignment. */
__device__ __forceinline__ bool visible(const AttnArgs &a, int64_t i, int64_t j)
{
    return j < a.Nk && (!a.causal || j <= i + a.shift);
}

/* Dropout on a [Br, Bc] tile of probabilities whose columns start at j0
 * (a multiple of 4): every kept entry is scaled by 1/(1-p), every dropped
 * one zeroed. One Philox call per 4 columns of a row. If `z` is non-NULL the
 * factor (0 or 1/(1-p)) is also written there. */
template <typename A>
__device__ __forceinline__ void apply_dropout(const AttnArgs &a, A *tile,
                                              A *z, int ld, int rows, int cols,
                                              int64_t bh, int64_t i0,
                                              int64_t j0)
{
    const uint2 key = make_uint2(fg_dropout_key_x(a.seed, a.offset),
                                 fg_dropout_key_y(a.seed, a.offset));
    const int groups = (cols + 3) / 4;
    const A ks = (A)a.keep_scale;
    for (int idx = threadIdx.x; idx < rows * groups; idx += blockDim.x) {
        const int r = idx / groups, g = idx - r * groups;
        const int64_t j = j0 + 4 * g;
        const uint4 ctr = make_uint4(fg_dropout_ctr_x(j), fg_dropout_ctr_y(i0 + r),
                                     fg_dropout_ctr_z(bh), fg_dropout_ctr_w(a.offset));
        const uint4 w = curand_Philox4x32_10(ctr, key);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int col = 4 * g + c;
            if (col < cols) {
                const A f = fg_dropout_keep(words[c], a.keep_threshold) ? ks : A(0);
                tile[r * ld + col] *= f;
                if (z)
                    z[r * ld + col] = f;
            }
        }
    }
}

/* Number of Bc-key blocks query rows i0 .. i0+rows-1 visit (causal: up to
 * the last row's diagonal; rows that see no key give 0). */
__device__ __forceinline__ int key_blocks(const AttnArgs &a, bool causal, int64_t i0,
                                          int rows, int Bc)
{
    int64_t n_keys = a.Nk;
    if (causal) {
        const int64_t last = i0 + rows - 1 + a.shift + 1;
        n_keys = last < 0 ? 0 : min(last, n_keys);
    }
    return (int)((n_keys + Bc - 1) / Bc);
}

/* Backward, key block starting at j0: the first Br-query block to visit
 * (causal skips rows that see none of these keys) and how many follow. */
__device__ __forceinline__ void query_blocks(const AttnArgs &a, bool causal, int64_t j0,
                                             int Br, int64_t *ib_first, int64_t *nqb)
{
    const int64_t i_first = causal ? max((int64_t)0, j0 - a.shift) : 0;
    *ib_first = i_first / Br;
    *nqb = a.Nq > i_first ? (a.Nq + Br - 1) / Br - *ib_first : 0;
}

/* log2 of row (bh, i)'s softmax normaliser from the forward's m and l;
 * +inf for a row that saw no key, so exp2(s - lse2) = 0. */
/* Float index of dQ element (bh, query i, column x) in the tiled dq_acc
 * layout of the wgmma backward (AttnArgs::dq_tile_d = D): tile i / 64 of
 * 64 x D; inside it, warp w of warpgroup g (rows 16w..16w+15, columns
 * g D/2 .. g D/2 + D/2 - 1) owns run 4g + w of 16 D/2 floats, where lane
 * (4 row%8 + col%8/2) keeps its fragment n = col%(D/2)/8 as 4 floats
 * (row%16/8, col%2). */
__host__ __device__ __forceinline__ int64_t dq_tiled_index(int64_t bh, int64_t nq_pad,
                                                           int D, int64_t i, int x)
{
    const int DQ = D / 2, ir = (int)(i & 63), cc = x % DQ;
    const int run = (x / DQ) * 4 + (ir >> 4), lane = (ir & 7) * 4 + ((cc >> 1) & 3);
    return (bh * nq_pad + (i & ~(int64_t)63)) * D + (int64_t)run * DQ * 16 +
           ((cc >> 3) * 32 + lane) * 4 + ((ir >> 3) & 1) * 2 + (cc & 1);
}

__device__ __forceinline__ float row_lse2(const AttnArgs &a, int64_t bh, int64_t i)
{
    const float l = ((const float *)a.l)[bh * a.Nq + i];
    const float m = ((const float *)a.m)[bh * a.Nq + i];
    return l > 0.f ? m * 1.4426950408889634f + __log2f(l) : INFINITY;
}

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_COMMON_CUH */
