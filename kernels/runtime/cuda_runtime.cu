/* SPDX-License-Identifier: MIT */
/* kernels/runtime/cuda_runtime.cu - CUDA device queries and pointer checks used by
 * the public API's validation. */
#include <cuda_runtime.h>

#include "flashgrad/types.h" /* FG_API on fg_cuda_available: exported */
#include "device.h"
#include "cuda_check.h"

/* Returns 0 with the reason recorded for fg_last_error(): no driver, no
 * device, or what CUDA said. */
extern "C" int fg_cuda_available(void)
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return 1;
    (void)cudaGetLastError();
    if (e == cudaErrorInsufficientDriver)
        fg_error(FG_ERR_NO_DEVICE, "CUDA is not available: no usable NVIDIA "
                 "driver (%s: %s)", cudaGetErrorName(e), cudaGetErrorString(e));
    else if (e == cudaSuccess || e == cudaErrorNoDevice)
        fg_error(FG_ERR_NO_DEVICE, "CUDA is not available: no CUDA device");
    else
        fg_cuda_status(e, "cudaGetDeviceCount", __FILE__, __LINE__);
    return 0;
}

extern "C" fg_status fg_cuda_check_pointer(const void *ptr, const char *what)
{
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    if (e != cudaSuccess)
        return fg_cuda_status(e, "cudaPointerGetAttributes", __FILE__,
                              __LINE__);
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s (%p) is not device memory but the device is cuda",
                        what, ptr);
    return FG_OK;
}
