/* SPDX-License-Identifier: MIT */
/* lib/dist/dist_internal.h - small helpers of the data-parallel and ring
 * attention code: copies on the communicator's device, and the CUDA
 * kernels ring attention needs (kernels/dist/dist_cuda.cu; without CUDA
 * kernels/dist/dist_cuda_stub.c reports FG_ERR_UNSUPPORTED). */
#ifndef FG_LIB_DIST_INTERNAL_H
#define FG_LIB_DIST_INTERNAL_H

#include <string.h>

#include "config.h"

#include "flashgrad/types.h"
#include "kernels/runtime/device.h"
#include "lib/core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst = src, n bytes, both on dev (CUDA: stream-ordered on the context
 * stream). */
static inline fg_status fg_dist_copy(fg_device dev, void *dst, const void *src,
                                     size_t n)
{
    if (n == 0 || dst == src)
        return FG_OK;
    if (dev == FG_DEVICE_CPU) {
        memcpy(dst, src, n);
        return FG_OK;
    }
#ifdef FG_HAVE_CUDA
    return fg_cuda_memcpy_d2d(dst, src, n);
#else
    return FG_NO_CUDA("device copy");
#endif
}

/* dst[b, s, h, :] = src[b, s, h, :] for [B, S, Hh, d] operands with
 * element strides {batch, sequence, head} (d contiguous), es-byte elements,
 * on the context stream. */
fg_status fg_dist_cuda_copy4d(void *dst, const int64_t dst_str[3],
                              const void *src, const int64_t src_str[3],
                              int64_t B, int64_t S, int64_t Hh, int64_t d,
                              size_t es);
/* dst[i] += src[i] for i < n, converting (fp32/fp64/fp16/bf16; arithmetic
 * in fp64 for fp64 dst, else fp32), on the context stream. */
fg_status fg_dist_cuda_add(void *dst, fg_dtype dst_dt, const void *src,
                           fg_dtype src_dt, int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_DIST_INTERNAL_H */
