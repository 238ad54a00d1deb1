/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_dropout.cuh - dropout inside the attention
 * kernels: the Philox4x32-7 call that holds element (i, j), with the
 * counter/key mapping of lib/core/dropout_map.h (the same code the CPU
 * runs), the tile form of the general kernels and the keep bits of the
 * tensor-core forward and backward. Included by attn_common.cuh. */
#ifndef FG_KERNELS_ATTN_DROPOUT_CUH
#define FG_KERNELS_ATTN_DROPOUT_CUH

#include "attn_common.cuh"
#include "lib/core/dropout_map.h"

namespace fg {

/* The Philox words of the call that holds element (i, j)
 * (lib/core/dropout_map.h). */
__device__ __forceinline__ uint4 dropout_call(const AttnArgs &a, int64_t bh,
                                              int64_t i, int64_t j)
{
    const fg_u32x2 key = {fg_dropout_key_x(a.seed, a.offset),
                          fg_dropout_key_y(a.seed, a.offset)};
    const fg_u32x4 r = fg_dropout_philox({fg_dropout_ctr_x(j), fg_dropout_ctr_y(i),
                                          fg_dropout_ctr_z(bh), fg_dropout_ctr_w(a.offset)},
                                         key);
    return make_uint4(r.x, r.y, r.z, r.w);
}

__device__ __forceinline__ uint32_t dropout_word(const uint4 &w, int k)
{
    return k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
}

/* Dropout on a [rows, cols] tile of probabilities at (i0, j0): every kept
 * entry is scaled by 256/T, every dropped one zeroed. A thread takes one
 * (row, call): the 8 columns 32c + 8n + 2q + e of that row that the call
 * covers (the call's other row, i +- 8, is recomputed by its own thread:
 * simple, and these kernels are not the fast path). If `z` is non-NULL the
 * factor (0 or 256/T) is also written there. */
template <typename A>
__device__ __forceinline__ void apply_dropout(const AttnArgs &a, A *tile,
                                              A *z, int ld, int rows, int cols,
                                              int64_t bh, int64_t i0,
                                              int64_t j0)
{
    const int64_t c0 = j0 >> 5;
    const int calls = (int)(((j0 + cols - 1) >> 5) - c0 + 1) * 4;
    const A ks = (A)a.keep_scale;
    for (int idx = threadIdx.x; idx < rows * calls; idx += blockDim.x) {
        const int r = idx / calls, cq = idx - r * calls;
        const int64_t i = i0 + r, jb = 32 * (c0 + (cq >> 2)) + 2 * (cq & 3);
        const uint4 w = dropout_call(a, bh, i, jb);
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int64_t j = jb + 8 * n + e;
                if (j < j0 || j >= j0 + cols)
                    continue;
                const int col = (int)(j - j0);
                const A f = fg_dropout_keep8(dropout_word(w, fg_dropout_word(j)),
                                             fg_dropout_byte(i, j), a.keep_threshold)
                                ? ks : A(0);
                tile[r * ld + col] *= f;
                if (z)
                    z[r * ld + col] = f;
            }
    }
}

/* Forward tiles (rows as accumulator rows; mma.sync and wgmma layouts):
 * a thread holds rows r0, r0 + 8 (r0 % 16 < 8) and columns 8n + 2 t4 + e.
 * One call covers its 16 elements of columns jc .. jc + 31 (jc % 32 == 0):
 * element (row r0 + 8r, column jc + 8n + 2 t4 + e) is kept iff
 * fwd_kept(w, r, n, e). */
__device__ __forceinline__ uint4 fwd_dropout_call(const AttnArgs &a, int64_t bh, int64_t r0,
                                                  int64_t jc, int t4)
{
    return dropout_call(a, bh, r0, jc + 2 * t4);
}
/* The call's word and byte of element (r, n, e): fwd_kept and
 * fwd_dropout32 read the same mapping. */
__device__ __forceinline__ constexpr int fwd_word(int n, int e) { return e + 2 * (n >> 1); }
__device__ __forceinline__ constexpr int fwd_byte(int r, int n) { return r + 2 * (n & 1); }
__device__ __forceinline__ bool fwd_kept(const AttnArgs &a, const uint4 &w, int r, int n, int e)
{
    return fg_dropout_keep8(dropout_word(w, fwd_word(n, e)), fwd_byte(r, n), a.keep_threshold);
}
/* Calls drop(n, r, e) for every dropped element of that call. The four
 * words are compared a word at a time (fg_dropout_keep_bytes: bit 7 of
 * byte k set <=> byte k kept), so an element costs a bit test and the
 * caller's select instead of a shift, a mask, a compare and the select
 * (ncu, H200, d = 64 forward: the per-byte form was two thirds of the
 * dropout's instructions, the Philox rounds the other third). */
template <typename F>
__device__ __forceinline__ void fwd_dropout32(const AttnArgs &a, int64_t bh, int64_t r0,
                                              int64_t jc, int t4, F &&drop)
{
    const uint4 w = fwd_dropout_call(a, bh, r0, jc, t4);
    const uint32_t t = a.keep_threshold;
    const uint32_t f[4] = {fg_dropout_keep_bytes(w.x, t), fg_dropout_keep_bytes(w.y, t),
                           fg_dropout_keep_bytes(w.z, t), fg_dropout_keep_bytes(w.w, t)};
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (!(f[fwd_word(n, e)] & (0x80u << (8 * fwd_byte(r, n)))))
                    drop(n, r, e);
}

/* Transposed tiles (the backward's S^T, keys as accumulator rows): a
 * thread holds keys jw + g and jw + 8 + g (jw % 16 == 0, g = lane / 4) and
 * queries 8m + 2 t4 + e. For the 16 queries ib .. ib + 15 (ib % 16 == 0)
 * its 8 elements are one word of each of two calls (i % 8 = 2 t4 and
 * 2 t4 + 1); the lane of key g ^ 1 (lane ^ 4) needs another word of the
 * same two calls, so each lane draws one call and they swap a word. Bit
 * 4 ih + 2 kh + e of the result: query ib + 8 ih + 2 t4 + e, key
 * jw + g + 8 kh. Every lane of the warp must call it. */
__device__ __forceinline__ uint32_t bwd_dropout_bits_of(const AttnArgs &a, uint32_t w0,
                                                        uint32_t w1, int g);
__device__ __forceinline__ uint32_t bwd_dropout_bits(const AttnArgs &a, int64_t bh, int64_t ib,
                                                     int64_t jw, int g, int t4)
{
    const int odd = g & 1, hi = 2 * (int)((jw >> 4) & 1);
    const uint4 w = dropout_call(a, bh, ib + 2 * t4 + odd, jw + g);
    return bwd_dropout_bits_of(a, dropout_word(w, hi), dropout_word(w, hi + 1), g);
}
/* The same from the two words its call gives the thread's warp: w0, w1 =
 * words hi, hi + 1 (hi = 2 for keys jw with jw % 32 == 16, else 0); the
 * wgmma backward shares each call between two warps (BwdDropX). The
 * bytes are compared four at a time and gathered by a multiply
 * (fg_dropout_keep_bytes, fg_dropout_gather_bytes: a third of the
 * instructions of a compare and a shift per byte). */
__device__ __forceinline__ uint32_t bwd_dropout_bits_of(const AttnArgs &a, uint32_t w0,
                                                        uint32_t w1, int g)
{
    const int odd = g & 1;
    const uint32_t mine = odd ? w1 : w0, theirs = odd ? w0 : w1;
    const uint32_t recv = __shfl_xor_sync(0xffffffffu, theirs, 4);
    /* mine is the word of the call of query parity `odd`, recv that of
     * the other parity; byte b = ih + 2 kh of parity e goes to bit
     * 4 ih + 2 kh + e */
    const uint32_t t = a.keep_threshold;
    return fg_dropout_gather_bytes(fg_dropout_keep_bytes(mine, t), odd) |
           fg_dropout_gather_bytes(fg_dropout_keep_bytes(recv, t), odd ^ 1);
}

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_DROPOUT_CUH */
