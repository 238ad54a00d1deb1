/* SPDX-License-Identifier: MIT */
/* lib/train/train_internal.h - the training step's micro-batch loop, shared
 * by fg_gpt_train_step (optim_step.c) and the data-parallel step above it
 * (lib/dist/dp.c). */
#ifndef FG_LIB_TRAIN_INTERNAL_H
#define FG_LIB_TRAIN_INTERNAL_H

#include "flashgrad/nn.h"
#include "flashgrad/optim.h"
#include "flashgrad/tensor.h"

/* Called before the backward of micro-batch `micro` (0 .. accum-1). */
typedef fg_status (*fg_micro_fn)(void *user, int micro, int accum);

/* The forward/backward loop of fg_gpt_train_step (optim.h): gradients of
 * loss * loss_scale / accum (loss_scale 1 without a scaler) accumulate
 * into the parameters' .grad (created zero first where missing);
 * *loss_sum receives the sum of the micro-batch losses. before_backward
 * may be NULL. last_loss non-NULL: the last micro-batch's
 * loss is not read (a wait for the GPU) but returned, a new reference
 * that the caller reads after queueing more work (the optimizer), adds to
 * *loss_sum last (the same sum) and frees before the arena's next reset;
 * NULL on failure. */
fg_status fg_gpt_accumulate(const fg_gpt *m, const int64_t *x,
                            const int64_t *y, int64_t B, int64_t T, int accum,
                            double loss_scale, fg_generator *rng,
                            fg_arena *arena,
                            fg_micro_fn before_backward, void *user,
                            double *loss_sum, fg_tensor **last_loss);

/* fg_clip_grad_norm(o's parameters, max_norm, norm) then fg_adamw_step(o,
 * lr), with the same parameters and moments bit for bit; on CUDA the norm
 * and the update share the optimizer's table and the update scales each
 * gradient as it reads it, so the clip's pass over the gradients is gone
 * and .grad keeps its unclipped values (fg_gpt_train_step zeroes them
 * next). Elsewhere the two calls. */
fg_status fg_adamw_step_clip(fg_adamw *o, double lr, double max_norm,
                             double *norm);
/* What gradients whose true global norm is `norm` are multiplied by:
 * inv_scale (a loss scale's inverse, 1 without one) times the clip factor
 * max_norm / (norm + 1e-6) when max_norm > 0 and norm exceeds it; the
 * CUDA norm kernels' finish_kernel computes the same. */
static inline double fg_clip_factor(double norm, double max_norm,
                                    double inv_scale)
{
    return inv_scale *
           ((max_norm > 0 && norm > max_norm) ? max_norm / (norm + 1e-6) : 1.0);
}
/* fg_adamw_step_clip on gradients that hold 1 / inv_scale times the true
 * ones (a loss scale): *norm = the true norm; the update sees each
 * gradient times inv_scale and the clip factor; a norm that is not finite
 * skips the step (parameters, moments and t unchanged) and sets *skipped. */
fg_status fg_adamw_step_unscale(fg_adamw *o, double lr, double max_norm,
                                double inv_scale, double *norm, int *skipped);
/* fg_clip_grad_norm likewise: the gradients are multiplied by inv_scale
 * and the clip factor, or left alone with *skipped = 1 where the norm is
 * not finite. */
fg_status fg_clip_grad_unscale(const fg_param *params, int n,
                               double max_norm, double inv_scale,
                               double *norm, int *skipped);
/* FG_OK for a scaler fg_grad_scaler_update accepts (optim.h). */
fg_status fg_grad_scaler_check(const fg_grad_scaler *s);
/* o's parameters (borrowed), n of them. */
const fg_param *fg_adamw_params(const fg_adamw *o, int *n);

#endif /* FG_LIB_TRAIN_INTERNAL_H */
