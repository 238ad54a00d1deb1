/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_stub.c - the CUDA attention entry points of a
 * build without CUDA: each reports FG_ERR_UNSUPPORTED, so callers get a
 * status, not a link error. */
#include <stdint.h>

#include "lib/attention/attention_internal.h"
#include "kernels/runtime/device.h"
#include "lib/core/error.h"

fg_status fg_attn_cuda_forward(const fg_attn_problem *pb,
                               const fg_attn_tensor *q, const fg_attn_tensor *k,
                               const fg_attn_tensor *v, const fg_attn_tensor *o,
                               const fg_attn_stats *st)
{
    (void)pb; (void)q; (void)k; (void)v; (void)o; (void)st;
    return FG_NO_CUDA("fg_attention_forward");
}

fg_status fg_attn_cuda_backward(const fg_attn_problem *pb,
                                const fg_attn_tensor *q,
                                const fg_attn_tensor *k,
                                const fg_attn_tensor *v,
                                const fg_attn_tensor *o,
                                const fg_attn_tensor *dout,
                                const fg_attn_stats *st,
                                const fg_attn_tensor *dq,
                                const fg_attn_tensor *dk,
                                const fg_attn_tensor *dv)
{
    (void)pb; (void)q; (void)k; (void)v; (void)o; (void)dout; (void)st;
    (void)dq; (void)dk; (void)dv;
    return FG_NO_CUDA("fg_attention_backward");
}

fg_status fg_attn_cuda_dropout_mask(const fg_attn_problem *pb, uint8_t *mask)
{
    (void)pb;
    (void)mask;
    return FG_NO_CUDA("fg_attention_dropout_mask");
}

fg_status fg_attn_cuda_read_ints(int32_t *host, const int32_t *dev, int64_t n,
                                 void *stream)
{
    (void)host; (void)dev; (void)n; (void)stream;
    return FG_NO_CUDA("fg_attn_cuda_read_ints");
}

/* ---- flashgrad/cuda.h --------------------------------------------------- */

fg_status fg_attn_cuda_block_mask_build(const fg_attn_block_mask *m,
                                        const uint8_t *map)
{
    (void)m;
    (void)map;
    return FG_NO_CUDA("fg_attn_block_mask_build");
}
