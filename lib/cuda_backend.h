/* lib/cuda_backend.h - the C side of the CUDA backend of the tensor and op
 * layer: device memory (a caching allocator), copies, and the op kernels'
 * entry points. Everything here exists only in builds with FG_HAVE_CUDA;
 * callers guard their CUDA branch with #ifdef FG_HAVE_CUDA (a build without
 * CUDA cannot create a CUDA tensor, so those branches are unreachable).
 *
 * Conventions for every fg_cuda_* op entry point:
 *  - tensors are fg_tensor handles whose storage is device memory; outputs
 *    are allocated by the caller (fg_tensor_new with FG_DEVICE_CUDA) unless
 *    the function says otherwise;
 *  - all work is enqueued on the context stream (fg_cuda_stream() in
 *    kernels/cuda_context.h) and is asynchronous to the host, except where
 *    a function says it synchronises;
 *  - dtypes: fp64 computes in fp64; fp32, fp16 and bf16 compute in fp32;
 *  - the return value is FG_OK or an error recorded with fg_error(). */
#ifndef FG_LIB_CUDA_BACKEND_H
#define FG_LIB_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "tensor_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device memory (kernels/cuda_alloc.cu) ------------------------------
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

/* ---- strided copy and fill (kernels/ops_ew.cu) --------------------------
 * dst = src elementwise: src is broadcast to dst's shape (stride 0 where
 * src has extent 1 or fewer dimensions), any dtypes (converted with
 * round-to-nearest-even), any strides; both on the device. */
fg_status fg_cuda_copy_strided(fg_tensor *dst, const fg_tensor *src);
/* Every element of t (any strides) to v. */
fg_status fg_cuda_fill_strided(fg_tensor *t, double v);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_CUDA_BACKEND_H */
