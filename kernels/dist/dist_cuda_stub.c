/* SPDX-License-Identifier: MIT */
/* kernels/dist/dist_cuda_stub.c - the ring attention kernels of a build
 * without CUDA: FG_ERR_UNSUPPORTED. */
#include "lib/dist/dist_internal.h"

fg_status fg_dist_cuda_copy4d(void *dst, const int64_t dst_str[3],
                              const void *src, const int64_t src_str[3],
                              int64_t B, int64_t S, int64_t Hh, int64_t d,
                              size_t es)
{
    (void)dst; (void)dst_str; (void)src; (void)src_str;
    (void)B; (void)S; (void)Hh; (void)d; (void)es;
    return FG_NO_CUDA("ring attention (strided copy)");
}

fg_status fg_dist_cuda_add(void *dst, fg_dtype dst_dt, const void *src,
                           fg_dtype src_dt, int64_t n)
{
    (void)dst; (void)dst_dt; (void)src; (void)src_dt; (void)n;
    return FG_NO_CUDA("ring attention (accumulate)");
}
