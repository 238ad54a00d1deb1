/* SPDX-License-Identifier: MIT */
/* lib/ops/cuda_ops_ew.h - CUDA elementwise ops and the sum reduction
 * (kernels/ops/ops_ew.cu). The strided copy and fill they sit next to are
 * declared in cuda_backend.h. Only in builds with FG_HAVE_CUDA; the
 * conventions of cuda_backend.h apply (device tensors, context stream,
 * fp64 computes in fp64, fp32/fp16/bf16 in fp32). */
#ifndef FG_LIB_CUDA_OPS_EW_H
#define FG_LIB_CUDA_OPS_EW_H

#include <stdint.h>

#include "lib/autograd/cuda_backend.h"
#include "ops_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = op(a, b), a and b broadcast to y's shape (NumPy rules). y, a and b
 * share one dtype and are CUDA tensors; y is allocated by the caller (any
 * strides; fresh and contiguous in practice) and must not overlap a or b. */
fg_status fg_cuda_ew_binary(fg_ew_binary op, fg_tensor *y,
                            const fg_tensor *a, const fg_tensor *b);

/* y = op(x, k) with y of x's shape and dtype (x any strides, including the
 * 0 strides of a broadcast view). */
fg_status fg_cuda_ew_unary(fg_ew_unary op, fg_tensor *y, const fg_tensor *x,
                           double k);

/* out = scale * (x summed over the dimensions where out_str is 0).
 * out_str are out's element strides over x's shape (what
 * fg_broadcast_strides(out, x->nd, x->shape, ...) gives: 0 on the summed
 * dimensions). Every element of out is written, so out need not be zeroed.
 * Same dtype for out and x. Deterministic (fixed-order two-pass sums, no
 * atomics); accumulates in fp32 (fp64 for fp64). */
/* Fused bias + GELU on contiguous tensors (bias [C] over the last dim of
 * x, all one dtype): y = gelu(x + b) and dx = g * gelu'(x + b), each one
 * pass with x + b kept in registers (never stored or rounded). */
fg_status fg_cuda_bias_gelu(fg_tensor *y, const fg_tensor *x,
                            const fg_tensor *b);
fg_status fg_cuda_bias_gelu_backward(fg_tensor *dx, const fg_tensor *g,
                                     const fg_tensor *x, const fg_tensor *b);
fg_status fg_cuda_sum_reduce(fg_tensor *out, const int64_t *out_str,
                             const fg_tensor *x, double scale);

/* out[j] = the sum over rows of x[..., j]: the bias gradient of a layer
 * whose output gradient is x (contiguous, fp16 / bf16, [..., C]); out [C],
 * contiguous, fp32 or x's dtype, every element written (accumulate:
 * out[j] += the sum instead, as fg_grad_accumulate would add the fresh
 * sum). Sums in fp32 in an order fixed by the shape (chunks of rows, then
 * the chunks in order): deterministic, no atomics. */
fg_status fg_cuda_col_sums(fg_tensor *out, const fg_tensor *x,
                           int accumulate);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_CUDA_OPS_EW_H */
