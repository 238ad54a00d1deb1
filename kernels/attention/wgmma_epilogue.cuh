/* SPDX-License-Identifier: MIT */
/* kernels/attention/wgmma_epilogue.cuh - the Hopper kernels' epilogue
 * through shared memory: a warp's 16 accumulator rows (O in the forward,
 * dK and dV in the backward) written into 16 rows of a dead operand tile,
 * then stored to global memory in 16-byte pieces.
 *
 * From registers, the accumulator layout gives each 4-byte store 8 rows x
 * 16 bytes: a warp instruction touches 8 sectors half full, and a d = 128
 * block's 32 (forward) or 64 (backward) such stores a thread go through
 * the L1 eight wavefronts each. Staged, a warp instruction stores two
 * 256-byte rows. The default where rows are 16-byte aligned
 * (FG_ATTN_FWD_EPI=0 / FG_ATTN_BWD_EPI=0: from registers). */
#ifndef FG_KERNELS_WGMMA_EPILOGUE_CUH
#define FG_KERNELS_WGMMA_EPILOGUE_CUH

#include "attn_common.cuh"
#include "wgmma_sm90.cuh"

#include <stdint.h>

namespace fg {

/* The warp's accumulator rows (acc[4n + 2r], acc[4n + 2r + 1]: row g + 8r,
 * columns 8n + 2 t4 and + 1, for lane 4 g + t4), scaled by s0 (rows g)
 * and s1 (rows g + 8), to dst rows 0..15 (dst = row 0, rstride elements
 * between rows, 16-byte aligned: vec16_ok, checked by the dispatch). The staging rows: trow ..
 * trow + 15 of a shared tile in the TMA 128-byte-swizzle layout (64-column
 * panels `panel` bytes apart, 128-byte rows, 16-byte chunk c of row w at
 * c ^ (w % 8)), so neither the stmatrix nor the reads conflict; tile is
 * its shared address and tp a generic pointer to it. The caller owns
 * those rows (no other warp reads or writes them until this returns).
 * Rows at or past nrows and columns at or past d are not stored. */
template <typename T, int D>
__device__ __forceinline__ void warp_rows_out(const float (&acc)[D / 2], float s0, float s1,
                                              uint32_t tile, const unsigned char *tp,
                                              uint32_t panel, uint32_t trow, T *dst,
                                              int64_t rstride, int nrows, int d)
{
    const int lane = threadIdx.x & 31;
    /* stmatrix x4: matrix m is rows 8 (m & 1).. by the 8 columns of piece
     * n + (m >> 1); lane L gives row L % 8 of matrix L / 8 */
    const int mr = lane & 7, mh = (lane >> 3) & 1, mn = lane >> 4;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
        const uint32_t p[4] = {pack2<T>(acc[4 * n] * s0, acc[4 * n + 1] * s0),
                               pack2<T>(acc[4 * n + 2] * s1, acc[4 * n + 3] * s1),
                               pack2<T>(acc[4 * n + 4] * s0, acc[4 * n + 5] * s0),
                               pack2<T>(acc[4 * n + 6] * s1, acc[4 * n + 7] * s1)};
        const int c = n + mn;
        stmatrix_x4(tile + (uint32_t)(c >> 3) * panel + (trow + 8 * mh + mr) * 128 +
                        (uint32_t)(((c & 7) ^ mr) << 4),
                    p);
    }
    __syncwarp();
    /* piece k: row k / (D / 8), 8 columns from 8 (k % (D / 8)) */
#pragma unroll 2
    for (int k = lane; k < 16 * (D / 8); k += 32) {
        const int w = k / (D / 8), c = k % (D / 8);
        const uint4 v = *reinterpret_cast<const uint4 *>(
            tp + (c >> 3) * panel + (trow + w) * 128 + (((c & 7) ^ (w & 7)) << 4));
        if (w >= nrows || c * 8 >= d)
            continue;
        T *out = dst + w * rstride + c * 8;
        if (c * 8 + 8 <= d) {
            *reinterpret_cast<uint4 *>(out) = v;
        } else { /* d % 8 != 0: the row's last piece */
            const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int x = 0; x < 8; x++)
                if (x < d - c * 8)
                    *reinterpret_cast<unsigned short *>(out + x) =
                        (unsigned short)(wd[x >> 1] >> (16 * (x & 1)));
        }
    }
    __syncwarp(); /* the rows are read before the caller writes them again */
}

} /* namespace fg */

#endif
