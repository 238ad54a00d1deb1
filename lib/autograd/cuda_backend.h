/* SPDX-License-Identifier: MIT */
/* lib/autograd/cuda_backend.h - what the tensor layer needs from the CUDA
 * backend beyond device memory (kernels/runtime/device.h, included here):
 * strided copy, fill and accumulate. The tensor layer declares them and the
 * op kernels (kernels/ops/ops_ew.cu) implement them, so this layer never
 * includes the op layer above it. Everything here exists only in builds with FG_HAVE_CUDA;
 * callers guard their CUDA branch with #ifdef FG_HAVE_CUDA (a build without
 * CUDA cannot create a CUDA tensor, so those branches are unreachable).
 *
 * Conventions for every fg_cuda_* op entry point:
 *  - tensors are fg_tensor handles whose storage is device memory; outputs
 *    are allocated by the caller (fg_tensor_new with FG_DEVICE_CUDA) unless
 *    the function says otherwise;
 *  - all work is enqueued on the context stream (fg_cuda_stream() in
 *    kernels/runtime/cuda_context.h) and is asynchronous to the host, except where
 *    a function says it synchronises;
 *  - dtypes: fp64 computes in fp64; fp32, fp16 and bf16 compute in fp32;
 *  - the return value is FG_OK or an error recorded with fg_error(). */
#ifndef FG_LIB_CUDA_BACKEND_H
#define FG_LIB_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/runtime/device.h"
#include "tensor_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- strided copy and fill (kernels/ops/ops_ew.cu) --------------------------
 * dst = src elementwise: src is broadcast to dst's shape (stride 0 where
 * src has extent 1 or fewer dimensions), any dtypes (converted with
 * round-to-nearest-even), any strides; both on the device. */
fg_status fg_cuda_copy_strided(fg_tensor *dst, const fg_tensor *src);
/* Every element of t (any strides) to v. */
fg_status fg_cuda_fill_strided(fg_tensor *t, double v);
/* dst += src: same shape, dst contiguous (gradient accumulation in the
 * autograd engine). A src of another dtype is rounded to dst's first, in
 * the same pass (bit-identical to a cast, then the add). */
fg_status fg_cuda_accumulate(fg_tensor *dst, const fg_tensor *src);
/* Zeroes the n device ranges (ptrs[i], bytes[i]) in one launch per 128
 * ranges (zero_grad of a model's parameters). */
fg_status fg_cuda_zero_many(void *const *ptrs, const size_t *bytes, int n);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_CUDA_BACKEND_H */
