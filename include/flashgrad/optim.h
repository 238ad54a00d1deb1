/* SPDX-License-Identifier: MIT */
/* flashgrad/optim.h - training machinery: AdamW, gradient clipping, the
 * learning-rate schedule, and checkpoints.
 *
 *     fg_adamw_config oc;
 *     fg_adamw_config_init(&oc);                  // lr 3e-4, wd 0.1, ...
 *     fg_adamw *opt;
 *     fg_adamw_create(params, n, &oc, &opt);      // params from fg_gpt_params
 *     for (step ...) {
 *         ... forward, fg_backward(loss) (once per micro-batch) ...
 *         fg_clip_grad_norm(params, n, 1.0, &norm);
 *         fg_adamw_step(opt, fg_lr_at(&sched, step));
 *         fg_zero_grad(...);
 *     }
 *
 * The updates run outside the graph, in place on the parameters' storage,
 * in a fixed order: the same gradients give the same bits every time
 * (this is what makes a resumed run identical to an uninterrupted one).
 * Parameters may live on the CPU or on CUDA (all of one optimizer on one
 * device): on CUDA the update is one kernel over all parameters and the
 * gradient norm a deterministic two-pass reduction. */
#ifndef FLASHGRAD_OPTIM_H
#define FLASHGRAD_OPTIM_H

#include <stdint.h>

#include "flashgrad/export.h"
#include "flashgrad/nn.h"
#include "flashgrad/status.h"
#include "flashgrad/tensor.h"

FG_BEGIN_DECLS

/* ---- AdamW ---------------------------------------------------------------- */

typedef struct fg_adamw_config {
    double lr;           /* used when fg_adamw_step gets lr < 0 */
    double beta1, beta2; /* 0.9, 0.95 */
    double eps;          /* 1e-8 */
    double weight_decay; /* 0.1; decoupled, only on params with decay = 1 */
} fg_adamw_config;
FG_API void fg_adamw_config_init(fg_adamw_config *c);

typedef struct fg_adamw fg_adamw;

/* An optimizer over n parameters (the array is copied; the tensors are
 * retained). The moment buffers start at zero. */
FG_API fg_status fg_adamw_create(const fg_param *params, int n,
                                 const fg_adamw_config *c, fg_adamw **out);
FG_API void fg_adamw_free(fg_adamw *o);
/* One update with learning rate lr (lr < 0: the config's):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr * (wd * p)                       (decoupled, decay params only)
 *   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
 * Parameters without a .grad are skipped (their moments unchanged). */
FG_API fg_status fg_adamw_step(fg_adamw *o, double lr);
/* Updates done so far (t). */
FG_API int64_t fg_adamw_steps(const fg_adamw *o);
/* Borrowed first/second moment tensors of parameter i (checkpoints). */
FG_API fg_status fg_adamw_state(const fg_adamw *o, int i, fg_tensor **m,
                                fg_tensor **v);
FG_API fg_status fg_adamw_set_steps(fg_adamw *o, int64_t t);

/* Global L2 norm of the gradients of the n parameters (computed in double,
 * in a fixed order) into *norm; if it exceeds max_norm > 0, every gradient
 * is scaled by max_norm / (norm + 1e-6). max_norm <= 0 only measures. */
FG_API fg_status fg_clip_grad_norm(const fg_param *params, int n,
                                   double max_norm, double *norm);

/* ---- one training step ------------------------------------------------------ */

typedef struct fg_step_stats {
    double loss;      /* mean over the micro-batches */
    double grad_norm; /* global norm before clipping */
} fg_step_stats;

/* One optimizer step of a GPT on `accum` micro-batches of B sequences of
 * length T (x, y hold accum * B * T ids, y -1 = ignored): for each, reset
 * `arena` (may be NULL: heap), forward in training mode with dropout masks
 * from rng, backward of loss / accum (gradients accumulate); then clip to
 * `clip` (<= 0: no clipping), fg_adamw_step(opt, lr), zero the gradients.
 * With an arena the steady state allocates nothing in the tensor layer. */
FG_API fg_status fg_gpt_train_step(const fg_gpt *m, fg_adamw *opt,
                                   const int64_t *x, const int64_t *y,
                                   int64_t B, int64_t T, int accum,
                                   double clip, double lr, fg_generator *rng,
                                   fg_arena *arena, fg_step_stats *stats);

/* ---- loss scaling (fp16 training) -------------------------------------------
 * fp16's smallest normal is 2^-14: small gradients of an fp16 autocast
 * region (fg_autocast_begin(FG_FP16)) underflow to zero. Like PyTorch's
 * GradScaler, the loss is multiplied by `scale` before the backward, the
 * gradients are divided by it before clipping and the update, and a step
 * whose gradients hold an inf or NaN (the scale was too large) is skipped:
 * parameters, moments and the optimizer's step count stay as they were,
 * and the scale is multiplied by backoff_factor. After growth_interval
 * steps in a row without one, the scale is multiplied by growth_factor.
 * With a power-of-two scale and no overflow or underflow the gradients
 * after the division are those of the unscaled loss bit for bit (fp32 /
 * fp64 parameters' gradients). bf16 has fp32's range and needs none.
 *
 *     fg_grad_scaler sc;
 *     fg_grad_scaler_init(&sc);                    // 2^16, x2 / 2000, x0.5
 *     for (step ...) {
 *         fg_gpt_train_step_scaled(m, opt, ..., &sc, &stats);
 *         // stats.grad_norm is not finite where the step was skipped
 *     }
 * or, in a loop of one's own: backward of fg_scale(loss, sc.scale), then
 * fg_grad_scaler_unscale(&sc, params, n, clip, &norm, &found_inf), then
 * fg_adamw_step unless found_inf, then fg_grad_scaler_update(&sc,
 * found_inf). */
typedef struct fg_grad_scaler {
    double scale;            /* multiplies the loss; 65536 (2^16) */
    double growth_factor;    /* 2 */
    double backoff_factor;   /* 0.5 */
    int64_t growth_interval; /* 2000 */
    int64_t good_steps;      /* finite steps since the scale last changed */
    int64_t skipped;         /* steps skipped so far */
} fg_grad_scaler;
FG_API void fg_grad_scaler_init(fg_grad_scaler *s);
/* After a step: found_inf 1 backs the scale off (and counts a skipped
 * step), 0 counts a good step and grows the scale every growth_interval
 * of them. FG_ERR_INVALID_ARGUMENT for NULL or a scaler whose fields are
 * out of range (scale not finite and > 0, growth_factor < 1,
 * backoff_factor not in (0, 1), growth_interval < 1); the scale stays
 * within [2^-24, 2^64]. */
FG_API fg_status fg_grad_scaler_update(fg_grad_scaler *s, int found_inf);
/* The gradients of the n parameters (fp32/fp64, one device) hold
 * s->scale times the true gradients: *norm = their global L2 norm
 * divided by s->scale. If that is not finite, *found_inf = 1 and the
 * gradients are left as they are; else *found_inf = 0 and every gradient
 * is multiplied by 1 / s->scale, and by max_norm / (*norm + 1e-6) too when
 * max_norm > 0 and *norm exceeds it (fg_clip_grad_norm's clipping). The
 * scaler itself is not changed: see fg_grad_scaler_update. */
FG_API fg_status fg_grad_scaler_unscale(const fg_grad_scaler *s,
                                        const fg_param *params, int n,
                                        double max_norm, double *norm,
                                        int *found_inf);
/* fg_gpt_train_step with loss scaling: each micro-batch's backward runs on
 * loss * scale->scale / accum; the step is skipped (the gradients zeroed,
 * nothing else changed) when they hold an inf or NaN, and
 * fg_grad_scaler_update follows either way. stats->grad_norm is the
 * unscaled norm, or not finite for a skipped step. scale NULL: exactly
 * fg_gpt_train_step. */
FG_API fg_status fg_gpt_train_step_scaled(const fg_gpt *m, fg_adamw *opt,
                                          const int64_t *x, const int64_t *y,
                                          int64_t B, int64_t T, int accum,
                                          double clip, double lr,
                                          fg_generator *rng, fg_arena *arena,
                                          fg_grad_scaler *scale,
                                          fg_step_stats *stats);

/* ---- learning-rate schedule ------------------------------------------------ */

/* Linear warmup from 0 to lr over `warmup` steps, then cosine decay to
 * min_lr at step `total`, min_lr after. */
typedef struct fg_lr_schedule {
    double lr, min_lr;
    int64_t warmup, total;
} fg_lr_schedule;
/* The learning rate for step (0-based; a negative step counts as 0). */
FG_API double fg_lr_at(const fg_lr_schedule *s, int64_t step);

/* ---- checkpoints -------------------------------------------------------------
 * One file: magic "FGCKPT01", format version, the model config, the
 * training state, a caller's text blob (e.g. the trainer's options), every
 * parameter and both AdamW moments (name, dtype, shape, raw bytes), and a
 * trailing 64-bit FNV-1a checksum of everything before it. Numbers and
 * tensor data are little-endian on every host. Loading checks magic,
 * version, sizes, checksum, and that the model's config and parameter
 * shapes match; a truncated or corrupted
 * file gives FG_ERR_IO with a message saying what is wrong, and nothing is
 * modified; so does a directory or any other file that is not one. Saving
 * writes a temporary PATH.tmp.XXXXXX of a unique name, fsyncs it, renames
 * it over PATH and fsyncs the directory: a crash or a kill leaves the old
 * checkpoint or the new one, and concurrent savers of one PATH each leave
 * a whole file. A temporary left by a save that died is removed by the
 * next save of that PATH. I/O errors carry the system's reason. */

#define FG_CHECKPOINT_VERSION 2 /* 2 adds the attention variants of the
                                  config; version 1 files still load */

typedef struct fg_train_state {
    int64_t step;          /* optimizer steps done */
    fg_generator rng;      /* dropout generator */
    uint64_t data_rng;     /* data sampler state */
    double best_val;       /* trainer's bookkeeping */
} fg_train_state;

FG_API fg_status fg_checkpoint_save(const char *path, const fg_gpt *m,
                                    const fg_adamw *opt,
                                    const fg_train_state *st,
                                    const char *meta);
/* Validates the whole file and reads its config, state and meta (copied
 * into meta[0..meta_cap-1], NUL-terminated, truncated to fit; NULL to
 * skip). Any output pointer may be NULL. */
FG_API fg_status fg_checkpoint_peek(const char *path, fg_gpt_config *cfg,
                                    fg_train_state *st, char *meta,
                                    size_t meta_cap);
/* Loads parameters (and the optimizer's moments and step count when opt
 * is non-NULL; the file must have them) and the state into an existing
 * model built with the same config. */
FG_API fg_status fg_checkpoint_load(const char *path, fg_gpt *m,
                                    fg_adamw *opt, fg_train_state *st);

FG_END_DECLS

#endif /* FLASHGRAD_OPTIM_H */
