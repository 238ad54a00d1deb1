/* SPDX-License-Identifier: MIT */
/* kernels/runtime/device.h - the C interface of the CUDA runtime layer:
 * device memory (a caching allocator), copies and pointer checks. Declared
 * here so the layers above (attention, tensors, ops) need no CUDA header;
 * in a build without CUDA only fg_cuda_check_pointer exists (a stub in
 * kernels/runtime/cuda_stub.c), and callers guard the rest with
 * #ifdef FG_HAVE_CUDA. */
#ifndef FG_KERNELS_RUNTIME_DEVICE_H
#define FG_KERNELS_RUNTIME_DEVICE_H

#include <stddef.h>

#include "lib/core/error.h"

/* The error every CUDA entry point of a build without CUDA reports. */
#define FG_NO_CUDA(fn)                                                      \
    fg_error(FG_ERR_UNSUPPORTED,                                            \
             "%s: flashgrad was built without CUDA (configure --with-cuda)", \
             fn)

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device memory (kernels/runtime/cuda_alloc.cu) ------------------------------
 * A caching allocator in the spirit of PyTorch's: blocks are rounded up
 * (512 B granularity, 2 MiB above 1 MiB) and kept in per-size free lists
 * when released, so a training step that repeats the same allocation
 * sequence calls cudaMalloc only during the first step. All kernels run on
 * one stream, so a block released by the host may be handed out again at
 * once: its next user is enqueued after every kernel that used it. */
fg_status fg_cuda_mem_alloc(size_t bytes, void **out);
void fg_cuda_mem_free(void *p, size_t bytes);
/* Long-lived buffers (optimizer tables, the cuBLAS workspace): straight
 * from the driver, never from or to the cache, so creating one in the
 * middle of the first step does not take a block the next step needs. */
fg_status fg_cuda_mem_alloc_persistent(size_t bytes, void **out);
void fg_cuda_mem_free_persistent(void *p);

/* Copies on the context stream. H2D returns once the source may be reused;
 * D2H waits for the copy (and everything enqueued before it). */
fg_status fg_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
fg_status fg_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
fg_status fg_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes);
fg_status fg_cuda_memset_zero(void *dst, size_t bytes);

/* Checks that ptr is device-accessible memory; sets the error if not
 * (kernels/runtime/cuda_runtime.cu). */
fg_status fg_cuda_check_pointer(const void *ptr, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* FG_KERNELS_RUNTIME_DEVICE_H */
