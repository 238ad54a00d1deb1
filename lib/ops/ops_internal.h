/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_internal.h - what the op files share: argument checks, the
 * per-device dispatch point, recording, and raw (unrecorded) kernels that
 * backward functions reuse. */
#ifndef FG_LIB_OPS_INTERNAL_H
#define FG_LIB_OPS_INTERNAL_H

#include "lib/autograd/autograd_internal.h"
#include "lib/core/error.h"
#include "lib/autograd/tensor_internal.h"
#include "lib/autograd/tensor_iter.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Non-NULL, fp32 or fp64, a known device. `name` names the argument. */
fg_status fg_op_check(const char *fn, const fg_tensor *t, const char *name);
/* Both checked, and same dtype and device. */
fg_status fg_op_check2(const char *fn, const fg_tensor *a, const fg_tensor *b);
/* out non-NULL. */
fg_status fg_op_check_out(const char *fn, void *out);

/* 1 if environment switch `name` is exactly `value`, read once into *cache
 * (-1: not read yet): the ops' switches for measurements (fg_cuda(3)). */
int fg_op_env_once(int *cache, const char *name, const char *value);

/* "[2, 3, 4]" into buf (for messages). */
const char *fg_fmt_shape(char *buf, size_t size, int nd,
                         const int64_t *shape);

/* The dispatch point's answer for a device without an implementation yet
 * (CUDA until its ops land). */
fg_status fg_op_unsupported(const char *fn, fg_device dev);

/* If recording, records the node; on failure frees outputs[] and returns
 * the status. On success stores outputs in outs (when non-NULL). */
fg_status fg_op_finish(const fg_op_def *op, fg_tensor *const *inputs,
                       int n_in, fg_tensor *const *outputs, int n_out,
                       fg_tensor *const *saved, int n_saved,
                       const void *extra, size_t extra_bytes);

/* fg_cast for a parameter (a leaf requiring grad, contiguous): the result
 * is a view of the parameter's cached low-precision copy
 * (fg_tensor_lowp), cast only when stale, recorded as fg_cast is (its
 * gradient returns in x's dtype). Anything else goes to fg_cast. The view
 * is read-only in effect: writing it makes the copy stale. */
fg_status fg_cast_param(fg_tensor *x, fg_dtype dt, fg_tensor **out);

/* 1 if fg_layernorm_cast takes y dtype yt for x dtype xt: xt itself,
 * fp16/bf16 for fp32, fp32 for fp64 (the device may still refuse fp16/bf16
 * on the CPU). */
int fg_layernorm_out_ok(fg_dtype xt, fg_dtype yt);
/* fg_layernorm_cast's checks of x, weight, bias, eps and the output dtype
 * ydt (fn names the caller in the messages). */
fg_status fg_layernorm_check(const char *fn, const fg_tensor *x,
                             const fg_tensor *weight, const fg_tensor *bias,
                             double eps, fg_dtype ydt);

/* fg_dropout_add_layernorm whose h, where the fused CUDA kernel makes it
 * (fp16 / bf16 h, C % 8 == 0), has a ones column (fg_tensor's ones_col):
 * the same values in a [..., C] view of rows C + FG_ONES_PAD apart, for
 * the Linear / MLP master forms that read it (fg_linear_master,
 * fg_mlp_master: their bias gradients come out of the weight-gradient
 * GEMM). Elsewhere, and with FG_LIN_ONES=0 in the environment, h is
 * contiguous, as fg_dropout_add_layernorm's. */
fg_status fg_dropout_add_layernorm_ones(fg_tensor *x, fg_tensor *b, double p,
                                        uint64_t seed, uint64_t offset,
                                        fg_tensor *weight, fg_tensor *bias,
                                        double eps, fg_dtype out_dtype,
                                        fg_tensor **y, fg_tensor **h);

/* x [..., K] w [K, N] + b [N] (b NULL: fg_matmul), recorded. On CUDA
 * with contiguous operands of one dtype: one cuBLASLt GEMM with the bias
 * in its epilogue (accumulated in fp32, rounded once) and one node whose
 * backward is two GEMMs, the bias gradient in the weight gradient's
 * epilogue (lib/ops/ops_linear.c); elsewhere, or where cuBLASLt has no
 * such kernel, fg_matmul then fg_add (their bits). */
fg_status fg_linear(fg_tensor *x, fg_tensor *w, fg_tensor *b, fg_tensor **out);

/* The MLP's body as one op: y = gelu(x w1 + b1) w2 + b2, x [..., C],
 * w1 [C, H], b1 [H], w2 [H, D], b2 [D], GELU the tanh form (fg_gelu's),
 * one dtype and device, recorded as one node ("MlpBackward", GEMM
 * family). On CUDA two cuBLASLt GEMMs forward (bias + GELU, keeping the
 * pre-activation, then bias) and four backward (the GELU's derivative
 * and both bias gradients in the epilogues): no elementwise kernel, no
 * reduction. On the CPU (and wherever cuBLASLt has no such kernel) the
 * same function with fg_matmul, fg_add and fg_gelu's kernels, giving
 * their bits forward and backward. */
fg_status fg_mlp(fg_tensor *x, fg_tensor *w1, fg_tensor *b1, fg_tensor *w2,
                 fg_tensor *b2, fg_tensor **out);

/* ---- raw kernels: no checks, no recording, allocate in `dom` ---------- */

/* c = op(a) op(b) (accumulate: c +=) as fg_matmul computes it (batch
 * folding and broadcasting included); c has the product's shape. */
fg_status fg_matmul_raw(fg_tensor *a, int ta, fg_tensor *b, int tb,
                        fg_tensor *c, int accumulate);
/* fg_matmul's backward: *ga = dC op(b)^T (if need_a), *gb = op(a)^T dC
 * (if need_b), each zeroed then added to, in the backward's domain. */
fg_status fg_matmul_grads(const fg_tensor *a, int ta, const fg_tensor *b,
                          int tb, fg_tensor *g, int need_a, int need_b,
                          fg_tensor **ga, fg_tensor **gb);

typedef enum fg_ew_binary {
    FG_EW_ADD, FG_EW_SUB, FG_EW_MUL, FG_EW_DIV,
    /* backward helpers: a = incoming gradient, b = saved tensor */
    FG_EW_TANH_GRAD, /* a * (1 - b^2), b = tanh output */
    FG_EW_RELU_GRAD, /* b > 0 ? a : 0, b = relu output */
    FG_EW_GELU_GRAD, /* a * gelu'(b),  b = gelu input */
    FG_EW_COUNT_BINARY
} fg_ew_binary;

typedef enum fg_ew_unary {
    FG_EW_EXP, FG_EW_LOG, FG_EW_TANH, FG_EW_RELU, FG_EW_GELU,
    FG_EW_SCALE,     /* k * x */
    FG_EW_ADD_SCALAR, /* x + k */
    FG_EW_COUNT_UNARY
} fg_ew_unary;

/* New tensor of the broadcast shape of a and b (same dtype). */
fg_status fg_ew_binary_raw(fg_ew_binary op, const fg_tensor *a,
                           const fg_tensor *b, fg_arena *dom,
                           fg_tensor **out);
fg_status fg_ew_unary_raw(fg_ew_unary op, const fg_tensor *x, double k,
                          fg_arena *dom, fg_tensor **out);
/* Contiguous copy in dom (converting dtype if dt differs). */
fg_status fg_copy_raw(const fg_tensor *x, fg_dtype dt, fg_arena *dom,
                      fg_tensor **out);
/* x itself (retained) if contiguous, else a contiguous copy. */
fg_status fg_contiguous_raw(fg_tensor *x, fg_arena *dom, fg_tensor **out);
/* Reshape as a view when strides allow, else of a contiguous copy. */
fg_status fg_reshape_raw(fg_tensor *x, int nd, const int64_t *shape,
                         fg_arena *dom, fg_tensor **out);
/* Strides of x viewed with the new shape, if possible without a copy
 * (same numel). Returns 0 if impossible. */
int fg_view_strides(const fg_tensor *x, int nd, const int64_t *shape,
                    int64_t *stride);

/* The domain for a backward's tensors: the active arena or the heap. */
static inline fg_arena *fg_bw_domain(void)
{
    return fg_alloc_domain(NULL, 0);
}

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_OPS_INTERNAL_H */
