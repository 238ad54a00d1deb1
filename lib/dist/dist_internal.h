/* lib/dist/dist_internal.h - small helpers of the data-parallel and ring
 * attention code: byte copies on the communicator's device. */
#ifndef FG_LIB_DIST_INTERNAL_H
#define FG_LIB_DIST_INTERNAL_H

#include <string.h>

#include "config.h"

#include "flashgrad/types.h"
#include "kernels/runtime/device.h"
#include "lib/core/error.h"

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

#endif /* FG_LIB_DIST_INTERNAL_H */
