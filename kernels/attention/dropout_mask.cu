/* SPDX-License-Identifier: MIT */
/* kernels/attention/dropout_mask.cu - the dropout keep-mask drawn on the GPU with
 * the Philox4x32-7 and counter/word/byte mapping shared with the CPU
 * (lib/core/dropout_map.h, philox.h). Used by tests to check that both devices
 * draw the same mask bit for bit; the attention kernels inline the same code. */
#include <cuda_runtime.h>

#include "lib/attention/attention_internal.h"
#include "kernels/runtime/cuda_check.h"
#include "lib/core/dropout_map.h"

/* One thread per Philox call: the 16 elements of rows i, i + 8 (i % 16 < 8)
 * and columns 32c + 8n + 2q + e (n = 0..3, e = 0..1) for one (i, c, q). */
__global__ void fg_dropout_mask_kernel(uint8_t *mask, int64_t H, int64_t Nq,
                                       int64_t Nk, uint64_t seed,
                                       uint64_t offset, uint32_t threshold,
                                       int64_t ncalls_row, int64_t total)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total)
        return;
    /* t = (bh * rowsets + (i / 16) * 8 + i % 8) * ncalls_row + (c * 4 + q) */
    const int64_t call = t % ncalls_row, rs = t / ncalls_row;
    const int64_t rowsets = (Nq + 15) / 16 * 8;
    const int64_t bh = rs / rowsets, r8 = rs % rowsets;
    const int64_t i0 = (r8 >> 3) * 16 + (r8 & 7), jb = (call >> 2) * 32 + 2 * (call & 3);
    const fg_u32x2 key = {fg_dropout_key_x(seed, offset),
                          fg_dropout_key_y(seed, offset)};
    const fg_u32x4 ctr = {fg_dropout_ctr_x(jb), fg_dropout_ctr_y(i0),
                          fg_dropout_ctr_z(bh), fg_dropout_ctr_w(offset)};
    const fg_u32x4 r = fg_dropout_philox(ctr, key);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
    for (int half = 0; half < 2; half++) {
        const int64_t i = i0 + 8 * half;
        if (i >= Nq)
            break;
        for (int n = 0; n < 4; n++)
            for (int e = 0; e < 2; e++) {
                const int64_t j = jb + 8 * n + e;
                if (j < Nk)
                    mask[(bh * Nq + i) * Nk + j] = (uint8_t)fg_dropout_keep8(
                        w[fg_dropout_word(j)], fg_dropout_byte(i, j), threshold);
            }
    }
}

extern "C" fg_status fg_attn_cuda_dropout_mask(const fg_attn_problem *pb,
                                               uint8_t *mask)
{
    const int64_t ncalls = (pb->Nk + 31) / 32 * 4;
    const int64_t total = pb->B * pb->H * ((pb->Nq + 15) / 16 * 8) * ncalls;
    const size_t bytes = (size_t)(pb->B * pb->H * pb->Nq * pb->Nk);
    uint8_t *dmask = NULL;
    FG_CUDA_TRY(cudaMalloc((void **)&dmask, bytes));
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    fg_dropout_mask_kernel<<<(unsigned)blocks, threads>>>(
        dmask, pb->H, pb->Nq, pb->Nk, pb->seed, pb->offset,
        pb->keep_threshold, ncalls, total);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaMemcpy(mask, dmask, bytes, cudaMemcpyDeviceToHost);
    cudaFree(dmask);
    if (e != cudaSuccess)
        return fg_cuda_status(e, "dropout mask kernel", __FILE__, __LINE__);
    return FG_OK;
}
