/* SPDX-License-Identifier: MIT */
/* lib/train/optim_step.c - one training step: micro-batches with gradient
 * accumulation inside an arena (fg_gpt_accumulate, also used by the
 * data-parallel step of lib/dist), clipping, AdamW, zeroing. */
#include <stdlib.h>

#include "flashgrad/optim.h"
#include "lib/core/error.h"
#include "lib/autograd/tensor_internal.h"
#include "train_internal.h"

/* Zero gradients for parameters that have none yet (the first step), made
 * before the forward: every step then has the same live set of buffers,
 * so the first step warms the device cache for all the others (with
 * .grad appearing mid-backward, step 2 would need new blocks). Like
 * PyTorch's zero_grad(set_to_none=False). */
static fg_status ensure_grads(const fg_param *ps, int n)
{
    for (int i = 0; i < n; i++) {
        fg_tensor *t = ps[i].tensor;
        if (!t->grad && t->requires_grad)
            FG_TRY(fg_tensor_new_like(NULL, t, 1, &t->grad));
    }
    return FG_OK;
}

/* Every parameter's .grad to zero: one launch on the GPU, not one each. */
static fg_status zero_grads(const fg_param *ps, int n)
{
    fg_tensor *local[64] = {0}, **ts = local;
    if (n > 64 && !(ts = malloc(sizeof *ts * (size_t)n)))
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "zero_grad list");
    for (int i = 0; i < n; i++)
        ts[i] = ps[i].tensor;
    fg_status s = fg_zero_grad(ts, n);
    if (ts != local)
        free(ts);
    return s;
}

fg_status fg_gpt_accumulate(const fg_gpt *m, const int64_t *x,
                            const int64_t *y, int64_t B, int64_t T, int accum,
                            double loss_scale, fg_generator *rng,
                            fg_arena *arena, fg_micro_fn before_backward,
                            void *user, double *loss_sum,
                            fg_tensor **last_loss)
{
    if (last_loss)
        *last_loss = NULL;
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    FG_TRY(ensure_grads(ps, n));
    fg_nn_mode mode = {1, rng, NULL};
    double total = 0;
    fg_status s = FG_OK;
    for (int a = 0; a < accum && s == FG_OK; a++) {
        if (arena) {
            FG_TRY(fg_arena_reset(arena));
            FG_TRY(fg_arena_push(arena));
        }
        fg_tensor *loss = NULL, *scaled = NULL;
        double l = 0;
        s = fg_gpt_forward(m, x + a * B * T, B, T, y + a * B * T, &mode,
                           NULL, &loss);
        /* loss_scale / accum: a power of two times 1 / accum, so with a
         * power-of-two scale the product is that of 1 / accum exactly */
        if (s == FG_OK)
            s = accum > 1 || loss_scale != 1.0
                    ? fg_scale(loss, loss_scale / accum, &scaled)
                    : (scaled = fg_tensor_retain(loss), FG_OK);
        if (s == FG_OK && before_backward)
            s = before_backward(user, a, accum);
        if (s == FG_OK)
            s = fg_backward(scaled);
        /* Read the loss only now: on a GPU the host has then enqueued the
         * whole backward while the forward ran, instead of idling the GPU
         * at a sync between the two. The last one, for a caller that asks,
         * later still (after the optimizer is queued). */
        if (s == FG_OK && last_loss && a == accum - 1)
            *last_loss = fg_tensor_retain(loss);
        else if (s == FG_OK)
            s = fg_tensor_item(loss, &l);
        fg_tensor_free(scaled);
        fg_tensor_free(loss);
        if (arena)
            fg_arena_pop(arena);
        total += l;
    }
    *loss_sum = total;
    return s;
}

fg_status fg_gpt_train_step_scaled(const fg_gpt *m, fg_adamw *opt,
                                   const int64_t *x, const int64_t *y,
                                   int64_t B, int64_t T, int accum,
                                   double clip, double lr, fg_generator *rng,
                                   fg_arena *arena, fg_grad_scaler *scale,
                                   fg_step_stats *stats)
{
    if (!m || !opt || !x || !y || accum < 1 || B <= 0 || T <= 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    if (scale)
        FG_TRY(fg_grad_scaler_check(scale));
    const double ls = scale ? scale->scale : 1.0;
    int n, skipped = 0;
    const fg_param *ps = fg_gpt_params(m, &n);
    double total = 0;
    /* the last loss read after the optimizer and the zeroing are queued:
     * the GPU then runs from the backward into them, and the step waits
     * for the device once (the gradient norm) instead of twice */
    fg_tensor *last = NULL;
    fg_status s = fg_gpt_accumulate(m, x, y, B, T, accum, ls, rng, arena,
                                    NULL, NULL, &total, &last);
    double norm = 0;
    /* the optimizer over exactly the model's parameters: clip and step in
     * one (on CUDA without the clip's pass over the gradients) */
    int no = 0;
    const fg_param *po = fg_adamw_params(opt, &no);
    int same = no == n;
    for (int i = 0; same && i < n; i++)
        same = po[i].tensor == ps[i].tensor;
    if (s == FG_OK && same)
        s = scale ? fg_adamw_step_unscale(opt, lr, clip, 1.0 / ls, &norm,
                                          &skipped)
                  : fg_adamw_step_clip(opt, lr, clip, &norm);
    else if (s == FG_OK) {
        s = scale ? fg_clip_grad_unscale(ps, n, clip, 1.0 / ls, &norm,
                                         &skipped)
                  : fg_clip_grad_norm(ps, n, clip, &norm);
        if (s == FG_OK && !skipped)
            s = fg_adamw_step(opt, lr);
    }
    fg_status z = zero_grads(ps, n);
    if (s == FG_OK)
        s = z;
    if (s == FG_OK && scale)
        s = fg_grad_scaler_update(scale, skipped);
    if (last) {
        double l = 0;
        fg_status r = fg_tensor_item(last, &l);
        if (s == FG_OK)
            s = r;
        total += l;
        fg_tensor_free(last);
    }
    if (s == FG_OK && stats) {
        stats->loss = total / accum;
        stats->grad_norm = norm;
    }
    return s;
}

fg_status fg_gpt_train_step(const fg_gpt *m, fg_adamw *opt, const int64_t *x,
                            const int64_t *y, int64_t B, int64_t T, int accum,
                            double clip, double lr, fg_generator *rng,
                            fg_arena *arena, fg_step_stats *stats)
{
    return fg_gpt_train_step_scaled(m, opt, x, y, B, T, accum, clip, lr, rng,
                                    arena, NULL, stats);
}
