/* SPDX-License-Identifier: MIT */
/* lib/ops/cuda_ops_nn.h - CUDA entry points of the nn ops (kernels/ops/ops_nn.cu):
 * softmax / log_softmax, softmax-cross-entropy, layernorm, embedding and
 * dropout. Conventions of lib/autograd/cuda_backend.h: the caller allocates every
 * output on the device (contiguous, fresh), all work is enqueued on
 * fg_cuda_stream(), nothing is launched for empty tensors, and errors come
 * back as fg_status with a message. Unless a function says otherwise,
 * tensor arguments are contiguous (callers use fg_contiguous_raw) and of
 * one dtype T in {fp64, fp32, fp16, bf16}; fp64 computes in fp64, the rest
 * in fp32. "Stat" tensors (layernorm mean/rstd, cross-entropy logsumexp and
 * loss) have the compute dtype: fp32 for fp16/bf16/fp32, fp64 for fp64 -
 * see fg_cuda_nn_stat_dtype().
 *
 * The declarations are harmless in builds without CUDA (callers guard the
 * calls with FG_HAVE_CUDA); FG_NN_DROPOUT_TAG is shared with the CPU. */
#ifndef FG_LIB_CUDA_OPS_NN_H
#define FG_LIB_CUDA_OPS_NN_H

#include <stdint.h>

#include "lib/autograd/tensor_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Third Philox counter word of fg_dropout's mask ("DROP"), so its stream
 * never collides with the attention kernels' dropout draws. */
#define FG_NN_DROPOUT_TAG 0x44524F50u

/* The dtype of the per-row statistics for inputs of dtype dt. */
static inline fg_dtype fg_cuda_nn_stat_dtype(fg_dtype dt)
{
    return dt == FG_FP64 ? FG_FP64 : FG_FP32;
}

/* y = softmax(x) (log_softmax if is_log) along dim (normalised, in range);
 * y has x's shape and dtype. */
fg_status fg_cuda_softmax_forward(const fg_tensor *x, fg_tensor *y, int dim,
                                  int is_log);
/* dx from the incoming gradient g and the saved output y (all of y's
 * shape and dtype): softmax dx = y (g - sum g y); log_softmax
 * dx = g - exp(y) sum g, sums along dim. */
fg_status fg_cuda_softmax_backward(const fg_tensor *g, const fg_tensor *y,
                                   fg_tensor *dx, int dim, int is_log);

/* Cross-entropy over the rows of x ([rows, classes] flattened: the last
 * dimension is the classes). targets: host array of rows entries, already
 * validated (each in [0, classes) or == ignore_index); count = number of
 * rows not ignored. Writes lse [rows] (stat dtype) and the 0-dim loss
 * (stat dtype) = sum of (lse - x[target]) over counted rows / count (0 if
 * count is 0), summed in a fixed order on the device. */
fg_status fg_cuda_cross_entropy_forward(const fg_tensor *x,
                                        const int64_t *targets,
                                        int64_t ignore_index, int64_t count,
                                        fg_tensor *lse, fg_tensor *loss);
/* dx = (softmax(x) - onehot(target)) * g / count, zero rows for ignored
 * targets (all zero if count is 0). g: 0-dim device tensor of any dtype,
 * read on the device. dx: x's shape and dtype. */
fg_status fg_cuda_cross_entropy_backward(const fg_tensor *x,
                                         const fg_tensor *lse,
                                         const int64_t *targets,
                                         int64_t ignore_index, int64_t count,
                                         const fg_tensor *g, fg_tensor *dx);

/* Layernorm over the last dimension C of x: y = (x - mean) * rstd * w + b,
 * rstd = 1 / sqrt(var + eps) (biased variance, two passes). weight / bias
 * may be NULL (1 / 0) and may have any stride ([C], x's dtype). mean and
 * rstd: [rows] in the stat dtype. y has x's dtype, or (fg_layernorm_cast)
 * fp16/bf16 for fp32 x, fp32 for fp64 x: the same computation, y rounded
 * once to its dtype. */
fg_status fg_cuda_layernorm_forward(const fg_tensor *x, const fg_tensor *weight,
                                    const fg_tensor *bias, double eps,
                                    fg_tensor *y, fg_tensor *mean,
                                    fg_tensor *rstd);
/* Gradients from the saved x, weight (may be NULL), mean, rstd and the
 * incoming g (x's shape, y's dtype). Any of dx, dw, db may be NULL (not
 * wanted); all three have x's dtype. dw, db ([C], contiguous) are column
 * sums over the rows in a fixed order (per-block partials in the compute
 * type, summed in fp64): bitwise reproducible on one device configuration
 * (visible SMs) and build. acc (FG_LN_ACC_* flags): with FG_LN_ACC_DX,
 * dx (contiguous) is added to: dx += the gradient rounded to x's dtype, the
 * bits of writing it and then fg_grad_accumulate (one pass over dx instead
 * of three); with FG_LN_ACC_COLS, dw and db likewise (the parameters'
 * .grad, without a temporary and an accumulation launch each). */
enum { FG_LN_ACC_DX = 1, FG_LN_ACC_COLS = 2 };
fg_status fg_cuda_layernorm_backward(const fg_tensor *x,
                                     const fg_tensor *weight,
                                     const fg_tensor *mean,
                                     const fg_tensor *rstd,
                                     const fg_tensor *g, fg_tensor *dx,
                                     int acc, fg_tensor *dw, fg_tensor *db);

/* fg_dropout_add_layernorm in one kernel each way, where it applies (an
 * fp32 x and y, b / h / gh / db fp16 or bf16 of one dtype, C % 4 == 0 and
 * C <= 8192, 16-byte aligned contiguous operands); elsewhere *done = 0 and
 * nothing is written (the caller runs fg_cuda_dropout_add and the
 * layernorm kernels, the same bits). Forward: y = x + dropout(b) (as
 * fg_cuda_dropout_add), h, mean, rstd = the layernorm of y (as
 * fg_cuda_layernorm_forward with h's dtype). Backward: dx as
 * fg_cuda_layernorm_backward's for x = y and g = gh, then db = the
 * dropout-add backward of the final dx (fg_cuda_dropout_add with x NULL);
 * dw, dbias as the layernorm's; acc as the layernorm's flags. */
fg_status fg_cuda_dropout_add_layernorm_forward(
    const fg_tensor *x, const fg_tensor *b, double p, uint64_t seed,
    uint64_t offset, const fg_tensor *weight, const fg_tensor *bias,
    double eps, fg_tensor *y, fg_tensor *h, fg_tensor *mean, fg_tensor *rstd,
    int *done);
fg_status fg_cuda_dropout_add_layernorm_backward(
    const fg_tensor *y, const fg_tensor *weight, const fg_tensor *mean,
    const fg_tensor *rstd, const fg_tensor *gh, fg_tensor *dx, int acc,
    fg_tensor *db, double p, uint64_t seed, uint64_t offset, fg_tensor *dw,
    fg_tensor *dbias, int *done);

/* y[i, :] = weight[indices[i], :] for the n host indices (validated).
 * weight: [V, C], any strides; y: contiguous [n, C] (any leading shape)
 * of weight's dtype. */
fg_status fg_cuda_embedding_forward(const fg_tensor *weight,
                                    const int64_t *indices, int64_t n,
                                    fg_tensor *y);
/* dw ([V, C], contiguous, fully written) = scatter-add of the rows of g
 * ([n, C] contiguous) at the n host indices: every used row sums its
 * gradient rows in position order (a host-built CSR), unused rows are
 * zero. Deterministic, no atomics. */
fg_status fg_cuda_embedding_backward(const fg_tensor *g,
                                     const int64_t *indices, int64_t n,
                                     fg_tensor *dw);

/* dst = src * keep / (1 - p) elementwise over contiguous tensors of one
 * shape and dtype, with exactly the CPU's mask (Philox4x32-10, key
 * {seed, seed >> 32 ^ offset >> 32}, counter {b, b >> 32,
 * FG_NN_DROPOUT_TAG, offset} for the group b of 4 elements, keep iff
 * (r >> 8) < fg_dropout_threshold(p)). Used for forward and backward. */
fg_status fg_cuda_dropout(const fg_tensor *src, fg_tensor *dst, double p,
                          uint64_t seed, uint64_t offset);
/* fg_dropout_add's kernel, fg_dropout's mask. Forward (x non-NULL):
 * y = x + round_b(keep ? b / (1 - p) : 0) in x's dtype. Backward (x NULL,
 * b the incoming gradient in x's dtype, y = db in the branch's dtype):
 * y = round_y(keep ? round_y(b) / (1 - p) : 0). Dtypes: b (forward) or y
 * (backward) has x's dtype, or is fp16/bf16 with fp32 x. */
fg_status fg_cuda_dropout_add(const fg_tensor *x, const fg_tensor *b,
                              fg_tensor *y, double p, uint64_t seed,
                              uint64_t offset);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_CUDA_OPS_NN_H */
