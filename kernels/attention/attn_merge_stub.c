/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_merge_stub.c - fg_attention_merge on CUDA in a
 * build without CUDA: FG_ERR_UNSUPPORTED, not a link error. */
#include "lib/attention/attention_merge.h"
#include "kernels/runtime/device.h"
#include "lib/core/error.h"

fg_status fg_attn_cuda_merge(const fg_attn_merge_problem *mp)
{
    (void)mp;
    return FG_NO_CUDA("fg_attention_merge");
}
