/* SPDX-License-Identifier: MIT */
/* kernels/runtime/cuda_check.h - turning CUDA errors into fg_status (never exit()). */
#ifndef FG_KERNELS_CUDA_CHECK_H
#define FG_KERNELS_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "lib/core/error.h"

/* Evaluate a CUDA runtime call; on failure record file, line, the call and
 * CUDA's message, clear CUDA's sticky-free error state, return FG_ERR_CUDA
 * (FG_ERR_NO_DEVICE / FG_ERR_OUT_OF_MEMORY where that is what happened). */
#define FG_CUDA_TRY(call)                                                   \
    do {                                                                    \
        cudaError_t fg_cu_e_ = (call);                                      \
        if (fg_cu_e_ != cudaSuccess)                                        \
            return fg_cuda_status(fg_cu_e_, #call, __FILE__, __LINE__);     \
    } while (0)

/* After a kernel launch: launch-configuration errors. */
#define FG_CUDA_TRY_LAUNCH() FG_CUDA_TRY(cudaGetLastError())

static inline fg_status fg_cuda_status(cudaError_t e, const char *what,
                                       const char *file, int line)
{
    (void)cudaGetLastError(); /* clear non-sticky errors */
    fg_status s = FG_ERR_CUDA;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        s = FG_ERR_NO_DEVICE;
    else if (e == cudaErrorMemoryAllocation)
        s = FG_ERR_OUT_OF_MEMORY;
    return fg_error(s, "%s:%d: %s failed: %s (%s)", file, line, what,
                    cudaGetErrorName(e), cudaGetErrorString(e));
}

#endif /* FG_KERNELS_CUDA_CHECK_H */
