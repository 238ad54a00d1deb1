/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_mask.cu - the block-mask builder on the GPU: the
 * kv and q block lists (attention.h, fg_attn_block_mask) from a dense
 * boolean block map already on the device. One thread per list; the lists
 * are short (at most ceil(N / 128) entries), so a scan per thread is
 * simpler than a parallel compaction and not slower at these sizes. */
#include <cuda_runtime.h>

#include "lib/attention/attention_internal.h"
#include "kernels/runtime/cuda_check.h"

namespace {

/* kv lists: one thread per (bh, qb) row of the map; q lists: one per
 * (bh, kb) column. */
__global__ void block_lists(const uint8_t *map, int64_t bh_n, int64_t nqb,
                            int64_t nkb, int32_t *kv_count, int32_t *kv_index,
                            int32_t *q_count, int32_t *q_index)
{
    const int64_t rows = bh_n * nqb, total = rows + bh_n * nkb;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        if (t < rows) {
            const uint8_t *mp = map + t * nkb;
            int32_t c = 0;
            for (int64_t kb = 0; kb < nkb; kb++)
                if (mp[kb])
                    kv_index[t * nkb + c++] = (int32_t)kb;
            kv_count[t] = c;
        } else {
            const int64_t u = t - rows, bh = u / nkb, kb = u % nkb;
            const uint8_t *mp = map + bh * nqb * nkb + kb;
            int32_t c = 0;
            for (int64_t qb = 0; qb < nqb; qb++)
                if (mp[qb * nkb])
                    q_index[u * nqb + c++] = (int32_t)qb;
            q_count[u] = c;
        }
    }
}

} // namespace

extern "C" fg_status fg_attn_cuda_block_mask_build(const fg_attn_block_mask *m,
                                                   const uint8_t *map)
{
    const int64_t bh = m->batch * m->heads;
    const int64_t total = bh * (m->q_blocks + m->k_blocks);
    const unsigned blocks = (unsigned)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
    block_lists<<<blocks, 256>>>(map, bh, m->q_blocks, m->k_blocks,
                                 (int32_t *)m->kv_count, (int32_t *)m->kv_index,
                                 (int32_t *)m->q_count, (int32_t *)m->q_index);
    FG_CUDA_TRY_LAUNCH();
    /* Complete on return (the header's promise): the caller may free the
     * map at once. */
    FG_CUDA_TRY(cudaStreamSynchronize(0));
    return FG_OK;
}
