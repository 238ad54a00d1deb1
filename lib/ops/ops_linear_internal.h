/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_linear_internal.h - the GEMM steps that fg_linear and fg_mlp
 * (ops_linear.c) share with their master-weight forms
 * (ops_linear_master.c). Every tensor contiguous (but x with a ones
 * column: fg_lin_ones_pitch); a matrix is [rows, last dim]. */
#ifndef FG_LIB_OPS_LINEAR_INTERNAL_H
#define FG_LIB_OPS_LINEAR_INTERNAL_H

#include "ops_internal.h"
#include "cuda_ops_blas.h" /* fg_lt_epilogue (plain C) */

#ifdef __cplusplus
extern "C" {
#endif

/* x's row pitch (x->shape[-1] + FG_ONES_PAD) when x is a layernorm output
 * with a ones column (fg_tensor's ones_col) laid out as its op wrote it,
 * else 0. Such an x is the one strided a that fg_lin_lt, fg_lin_affine and
 * fg_lin_mlp_hidden take (the GEMM reads it with that pitch). */
int64_t fg_lin_ones_pitch(const fg_tensor *x);

/* c = op(a) op(b) (c += with beta1) and epilogue e in one cuBLASLt GEMM
 * on CUDA; a fp32 c (and bias) for fp16/bf16 a, b gives the product
 * unrounded (fg_cuda_lt_gemm's c32). *done 0 where it does not apply (not
 * CUDA, or no cuBLASLt kernel): nothing written. */
fg_status fg_lin_lt(fg_lt_epilogue e, const fg_tensor *a, int ta,
                    const fg_tensor *b, int tb, fg_tensor *c,
                    const fg_tensor *bias, fg_tensor *aux, int beta1,
                    int *done);

/* 1 where a bias gradient (gy's column sums, into a tensor of dtype out)
 * is taken by fg_lin_col_sums instead of the weight-gradient GEMM's
 * BGRAD epilogue: fp16 / bf16 gy on CUDA. On an H200 that epilogue made
 * GPT-2-small's weight-gradient GEMMs 15-45% slower (fp32 or bf16 C
 * alike: scripts/wgrad-probe.cu), more than reading gy once more costs.
 * FG_GEMM_BGRAD=1 (read once) keeps the epilogue. */
int fg_lin_col_sums_ok(const fg_tensor *gy, fg_dtype out);

/* db = gy's column sums, db += them with acc (fg_cuda_col_sums: fp32 sums
 * in a fixed order; the add is fg_grad_accumulate's). */
fg_status fg_lin_col_sums(fg_tensor *db, const fg_tensor *gy, int acc);

/* A new contiguous tensor like t with its last dimension n, in dom. */
fg_status fg_lin_new_last(fg_arena *dom, const fg_tensor *t, int64_t n,
                          fg_tensor **out);

/* y = x w + b (x [..., K], w [K, N], b [N]): one GEMM with the bias
 * epilogue, else fg_matmul's product then fg_add's kernel. */
fg_status fg_lin_affine(fg_arena *dom, fg_tensor *x, fg_tensor *w,
                        fg_tensor *b, fg_tensor **y);

/* The gradients of y = x w (+ b) for gy: *dx = gy w^T (nx), *dw = x^T gy
 * (nw), *db = gy's column sums (nb; b's meta bm). On CUDA two GEMMs
 * writing fresh tensors, db by fg_lin_col_sums (fp16 / bf16) or in dw's
 * epilogue; whatever cuBLASLt declines as fg_matmul's backward and fg_add's
 * reduction compute it. */
fg_status fg_lin_grads(fg_tensor *x, fg_tensor *w, fg_tensor *gy, int nx,
                       int nw, int nb, const fg_meta *bm, fg_tensor **dx,
                       fg_tensor **dw, fg_tensor **db);

/* dh = (gy w2^T) gelu'(h): one GEMM with the DGELU epilogue on CUDA; else
 * fg_matmul's backward for a's gradient and fg_gelu's backward kernel. b1's
 * gradient, dh's column sums, comes from the dW1 GEMM's BGRAD_B epilogue
 * (fg_lin_grads): with DGELU_BGRAD here instead, cuBLASLt's kernel for the
 * [tokens, 4 width] dh ran the MLP's backward at about 400 TFLOP/s against
 * 540 for the linear layers' (GPT-2-small, H200). */
fg_status fg_lin_gelu_grads(fg_tensor *a, fg_tensor *h, fg_tensor *w2,
                            fg_tensor *gy, fg_tensor **dh);

/* h = x w1 + b1 and a = gelu(h): one GEMM with the GELU_AUX_BIAS
 * epilogue, else fg_matmul's product, fg_add's and fg_gelu's kernels. */
fg_status fg_lin_mlp_hidden(fg_arena *dom, fg_tensor *x, fg_tensor *w1,
                            fg_tensor *b1, fg_tensor **h, fg_tensor **a);

/* fg_mlp's argument checks of in = {x, w1, b1, w2, b2} (one dtype and
 * device, shapes x [..., C], w1 [C, H], b1 [H], w2 [H, D], b2 [D]). */
fg_status fg_lin_check_mlp(const char *fn, fg_tensor *const *in);

/* The MLP's inputs, in the order of its node's edges. */
enum { MLP_X, MLP_W1, MLP_B1, MLP_W2, MLP_B2 };

/* The MLP's forward on the contiguous operands c (the GEMMs' inputs,
 * ordered as MLP_*) recorded as def's node with edges to in: saved c[X],
 * c[W1], c[W2], the pre-activation h and a = gelu(h). *out the output. */
fg_status fg_lin_mlp_record(const fg_op_def *def, fg_tensor *const *in,
                            fg_tensor *const *c, fg_arena *dom,
                            fg_tensor **out);

/* Frees and clears gin[0..n-1] (a failed backward's partial results). */
void fg_lin_free_grads(fg_tensor **gin, int n);

/* ---- master-weight forms (ops_linear_master.c) ----------------------------
 * For autocast on CUDA: x in a low-precision dtype dt, w and b the fp32
 * parameters (leaves requiring grad, contiguous). The products run on the
 * parameters' cached dt copies (fg_tensor_lowp: the bits of fg_cast_param
 * + fg_linear / fg_mlp forward), but the node's edges go to the fp32
 * parameters themselves: their gradients come out of the weight-gradient
 * GEMMs in fp32 (never rounded to dt), added straight into .grad when the
 * engine offers it, with no CastBackward nodes. Where an operand does not
 * qualify (another device or dtype, a strided or non-leaf parameter) they
 * run as fg_cast_param then fg_linear / fg_mlp. */
fg_status fg_linear_master(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                           fg_tensor **out);
fg_status fg_mlp_master(fg_tensor *x, fg_tensor *w1, fg_tensor *b1,
                        fg_tensor *w2, fg_tensor *b2, fg_tensor **out);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_OPS_LINEAR_INTERNAL_H */
