/* SPDX-License-Identifier: MIT */
/* lib/ops/cuda_ops_blas.h - the CUDA matrix products (kernels/ops/gemm_cuda.cu,
 * cuBLAS) and the optimizer kernels (kernels/ops/optim_cuda.cu): multi-tensor
 * AdamW and the global gradient norm with clipping.
 *
 * Only builds with FG_HAVE_CUDA define these functions; the header itself
 * is plain C and may be included anywhere. Conventions as in
 * lib/autograd/cuda_backend.h: device pointers, work on the context stream, fg_status
 * results with a recorded message. */
#ifndef FG_LIB_CUDA_OPS_BLAS_H
#define FG_LIB_CUDA_OPS_BLAS_H

#include <limits.h>
#include <stdint.h>

#include "flashgrad/types.h"
#include "flashgrad/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- GEMM ----------------------------------------------------------------- */

/* Can a rows x cols operand with element strides (rs, cs) go to cuBLAS
 * as it is? cuBLAS wants one unit stride and a leading dimension >= the
 * other extent (<= INT_MAX). On success *trans = 0 means "row-major with
 * leading dimension *ld" (cs unit), 1 means "column-major with leading
 * dimension *ld" (rs unit). Extent-1 dimensions take any stride. The C
 * side uses this to decide whether to make a tensor contiguous first. */
static inline int fg_cuda_gemm_layout(int64_t rows, int64_t cols, int64_t rs,
                                      int64_t cs, int *trans, int64_t *ld)
{
    const int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
    if (cs == 1 || cols == 1) {
        const int64_t l = rows == 1 ? c1 : rs;
        if (l >= c1 && l <= INT_MAX) {
            *trans = 0;
            *ld = l;
            return 1;
        }
    }
    if (rs == 1 || rows == 1) {
        const int64_t l = cols == 1 ? r1 : cs;
        if (l >= r1 && l <= INT_MAX) {
            *trans = 1;
            *ld = l;
            return 1;
        }
    }
    return 0;
}

/* For every b in [0, batch):
 *     C_b = alpha * A_b B_b + beta * C_b
 * with A_b = A + b*sA (M x K, strides a_rs, a_cs), B_b = B + b*sB (K x N),
 * C_b = C + b*sC (M x N), all strides in elements (0 allowed on A and B:
 * broadcast). dt: FG_FP64 (fp64 math), FG_FP32 (fp32; TF32 tensor cores
 * only with fg_cuda_set_allow_tf32), FG_FP16 / FG_BF16 (fp32
 * accumulation, fp32 alpha/beta). beta == 0 overwrites C (NaNs do not
 * propagate). Operands whose layout fg_cuda_gemm_layout rejects are packed
 * into a contiguous scratch copy first (correct but slower: make them
 * contiguous up front where possible); a C it rejects is computed in a
 * scratch and scattered back. sC == 0 with batch > 1 accumulates the whole
 * batch into one C (in order: beta for the first, 1 after). Otherwise the
 * C_b must not overlap each other, A or B. Asynchronous. */
fg_status fg_cuda_gemm(fg_dtype dt, int64_t M, int64_t N, int64_t K,
                       double alpha, const void *A, int64_t a_rs,
                       int64_t a_cs, const void *B, int64_t b_rs,
                       int64_t b_cs, double beta, void *C, int64_t c_rs,
                       int64_t c_cs, int64_t batch, int64_t sA, int64_t sB,
                       int64_t sC);

/* One cuBLASLt GEMM with an epilogue (kernels/ops/gemm_lt.cu):
 *     C [M, N] = op(A) [M, K] op(B) [K, N]   then the epilogue below,
 * every matrix row-major and contiguous: A is stored [M, K] (ta 0) or
 * [K, M] (ta 1), B [K, N] (tb 0) or [N, K] (tb 1). One dtype dt for A, B,
 * C, bias and aux (C and bias fp32 with c32); compute as fg_cuda_gemm (fp32 accumulation for
 * fp16/bf16, TF32 only when allowed, fp64 for fp64; no reduced-precision
 * split-K). "Per column" means a vector [N] indexed by C's column. */
typedef enum fg_lt_epilogue {
    FG_LT_DEFAULT,       /* the product alone */
    FG_LT_BIAS,          /* C += bias (input, per column) */
    FG_LT_GELU_AUX_BIAS, /* aux = product + bias; C = gelu(aux) (tanh form);
                            aux [M, N] is written (the pre-activation) */
    FG_LT_DGELU,         /* C = product * gelu'(aux); aux is read (the
                            DGELU_BGRAD form, with C's column sums, left
                            the MLP backward 45% longer: H200, session 23;
                            fg_mlp takes them from BGRAD_B) */
    FG_LT_BGRAD_B        /* bias (output, per column) = B's column sums
                            over its K rows (needs tb 0): a weight
                            gradient's GEMM giving the bias gradient */
} fg_lt_epilogue;

typedef struct fg_cuda_lt_gemm {
    fg_dtype dt;
    int64_t M, N, K;
    const void *A, *B;
    int ta, tb;
    int64_t lda; /* A's row pitch in elements; 0: packed (its last dim) */
    void *C;
    fg_lt_epilogue epilogue;
    void *bias; /* read (BIAS, GELU_AUX_BIAS) or overwritten (BGRAD_B) */
    void *aux;  /* [M, N] like C (the GELU epilogues); N % 8 == 0 */
    int c32;    /* fp16/bf16 A, B with an fp32 C and bias: a master
                   weight's gradient straight from the product, never
                   rounded to dt (FG_LT_DEFAULT and FG_LT_BGRAD_B only) */
    int beta1;  /* C += the product (C is read: a parameter's .grad);
                   else C = the product */
} fg_cuda_lt_gemm;

/* Runs g on the context stream. *done = 0 (FG_OK, nothing enqueued)
 * when cuBLASLt offers no algorithm for it, or the shape is outside what
 * it takes (sizes over INT32_MAX, N % 8 != 0 with aux, BGRAD_B with tb
 * 1): the caller then computes the same thing with separate kernels.
 * The algorithm chosen for a shape is cached. Asynchronous. */
fg_status fg_cuda_gemm_lt(const fg_cuda_lt_gemm *g, int *done);

/* ---- optimizer ---------------------------------------------------------------
 * Both kernels walk a table of per-tensor descriptors in device memory with
 * one launch for all tensors. A cache keeps the last table uploaded; a new
 * one goes up (one small H2D) only when some pointer, size or flag changed,
 * which in a training loop means the first step only. */

typedef struct fg_cuda_optim_cache fg_cuda_optim_cache;
void fg_cuda_optim_cache_free(fg_cuda_optim_cache *c);

typedef struct fg_cuda_adamw_param {
    void *param;       /* contiguous, numel elements of dtype */
    const void *grad;  /* same dtype and numel */
    void *m, *v;       /* moments, same dtype and numel */
    int64_t numel;
    fg_dtype dtype;    /* FG_FP32 or FG_FP64 */
    int decay;         /* 1: apply the decoupled weight decay */
    void *lowp;        /* NULL, or numel elements of lowp_dtype that get
                          the updated param rounded as fg_cast does */
    fg_dtype lowp_dtype; /* FG_BF16 or FG_FP16 */
} fg_cuda_adamw_param;

typedef struct fg_cuda_adamw_hparams {
    double lr, beta1, beta2, eps;
    double bc1, bc2; /* 1 - beta1^t, 1 - beta2^t (computed on the host) */
    double decay;    /* 1 - lr * weight_decay, used where decay is set */
} fg_cuda_adamw_hparams;

/* One AdamW update of the n tensors, elementwise in exactly the order of
 * the CPU loop in lib/train/optim.c (double intermediates, no FMA contraction),
 * so fp32 and fp64 results equal the CPU's bit for bit. Where lowp is set
 * the same kernel writes the parameter's autocast copy (no cast launch). *cache (NULL at
 * first: created here; owned by the caller, freed with
 * fg_cuda_optim_cache_free) holds the uploaded table. Asynchronous. */
fg_status fg_cuda_adamw_step(fg_cuda_optim_cache **cache,
                             const fg_cuda_adamw_param *ps, int n,
                             const fg_cuda_adamw_hparams *h);

/* What follows a gradient norm, on the GPU's norm kernels and in
 * lib/train/optim.c's CPU loop alike (fg_clip_factor, train_internal.h):
 * the gradients hold inv_scale^-1 times the true ones (a loss scale; 1:
 * none); the norm reported is the true one, and the gradients are
 * multiplied by inv_scale and by the clip factor max_norm / (norm + 1e-6)
 * when max_norm > 0 and the norm exceeds it. skip_nonfinite: a norm that
 * is not finite leaves every gradient (and, in the step, every parameter
 * and moment) unchanged; the caller sees it in the norm. */
typedef struct fg_cuda_clip {
    double max_norm;
    double inv_scale;
    int skip_nonfinite;
} fg_cuda_clip;

/* fg_cuda_clip_grad_norm over the n gradients, then fg_cuda_adamw_step,
 * with the same bits for the parameters, moments and norm, except that
 * the gradients are not written: the update scales each one by the clip
 * factor as it reads it (the factor stays on the device), so the clip's
 * pass over every gradient (a read and a write) is gone. With norm
 * non-NULL the norm is copied to the host after the update (this waits
 * for the stream). */
fg_status fg_cuda_adamw_step_clip(fg_cuda_optim_cache **cache,
                                  const fg_cuda_adamw_param *ps, int n,
                                  const fg_cuda_adamw_hparams *h,
                                  const fg_cuda_clip *c, double *norm);

typedef struct fg_cuda_grad {
    void *data; /* contiguous */
    int64_t numel;
    fg_dtype dtype; /* FG_FP32 or FG_FP64 */
} fg_cuda_grad;

/* Global L2 norm of the n gradients: squares summed in fp64, per block of
 * a fixed partition then in a fixed order (no atomics: the same gradients
 * give the same bits), then c's scaling (above; with inv_scale 1: if
 * max_norm > 0 and the norm exceeds it, every gradient is scaled by
 * max_norm / (norm + 1e-6)), the factor computed on the device. With norm
 * non-NULL the norm is copied to the host (this waits for the stream);
 * with norm NULL nothing waits. */
fg_status fg_cuda_clip_grad_norm(const fg_cuda_grad *gs, int n,
                                 const fg_cuda_clip *c, double *norm);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_CUDA_OPS_BLAS_H */
