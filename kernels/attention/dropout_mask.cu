/* kernels/attention/dropout_mask.cu - the dropout keep-mask drawn on the GPU with
 * cuRAND's own Philox4x32-10, using the counter/key mapping shared with the
 * CPU (lib/core/dropout_map.h). Used by tests to check that both devices draw the
 * same mask bit for bit; the attention kernels inline the same code. */
#include <cuda_runtime.h>
#include <curand_kernel.h>

#include "lib/attention/attention_internal.h"
#include "kernels/runtime/cuda_check.h"
#include "lib/core/dropout_map.h"

/* One thread per group of four columns (one Philox call). */
__global__ void fg_dropout_mask_kernel(uint8_t *mask, int64_t H, int64_t Nq,
                                       int64_t Nk, uint64_t seed,
                                       uint64_t offset, uint32_t threshold,
                                       int64_t ngroups_row, int64_t total)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total)
        return;
    const int64_t g = t % ngroups_row, row = t / ngroups_row; /* row = bh*Nq+i */
    const int64_t i = row % Nq, bh = row / Nq;
    const uint2 key = make_uint2(fg_dropout_key_x(seed, offset),
                                 fg_dropout_key_y(seed, offset));
    const uint4 ctr = make_uint4(fg_dropout_ctr_x(4 * g), fg_dropout_ctr_y(i),
                                 fg_dropout_ctr_z(bh), fg_dropout_ctr_w(offset));
    const uint4 r = curand_Philox4x32_10(ctr, key);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
    for (int c = 0; c < 4; c++) {
        const int64_t j = 4 * g + c;
        if (j < Nk)
            mask[row * Nk + j] = (uint8_t)fg_dropout_keep(w[c], threshold);
    }
}

extern "C" fg_status fg_attn_cuda_dropout_mask(const fg_attn_problem *pb,
                                               uint8_t *mask)
{
    const int64_t ngroups = (pb->Nk + 3) / 4;
    const int64_t total = pb->B * pb->H * pb->Nq * ngroups;
    const size_t bytes = (size_t)(pb->B * pb->H * pb->Nq * pb->Nk);
    uint8_t *dmask = NULL;
    FG_CUDA_TRY(cudaMalloc((void **)&dmask, bytes));
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    fg_dropout_mask_kernel<<<(unsigned)blocks, threads>>>(
        dmask, pb->H, pb->Nq, pb->Nk, pb->seed, pb->offset,
        pb->keep_threshold, ngroups, total);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaMemcpy(mask, dmask, bytes, cudaMemcpyDeviceToHost);
    cudaFree(dmask);
    if (e != cudaSuccess)
        return fg_cuda_status(e, "dropout mask kernel", __FILE__, __LINE__);
    return FG_OK;
}
