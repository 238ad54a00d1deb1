/* kernels/attn_common.cuh - device pieces shared by the forward and backward
 * kernels: strided tile loads/stores, the causal mask, and dropout (cuRAND's
 * Philox4x32-10 with the counter/key mapping of lib/dropout_map.h, the same
 * the CPU reimplements). */
#ifndef FG_KERNELS_ATTN_COMMON_CUH
#define FG_KERNELS_ATTN_COMMON_CUH

#include <curand_kernel.h>

#include "attn_traits.cuh"
#include "dropout_map.h"

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

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_COMMON_CUH */
