/* SPDX-License-Identifier: MIT */
/* lib/train/grad_scaler.c - dynamic loss scaling for fp16 training
 * (fg_grad_scaler, optim.h): the scale's growth and backoff, and the
 * unscale-and-clip of a loop of the caller's own. The train steps
 * (optim_step.c, lib/dist/dp.c) fold the unscale into the update. */
#include <math.h>

#include "flashgrad/optim.h"
#include "lib/core/error.h"
#include "train_internal.h"

/* PyTorch's GradScaler defaults. */
void fg_grad_scaler_init(fg_grad_scaler *s)
{
    if (!s)
        return;
    s->scale = 65536.0;
    s->growth_factor = 2.0;
    s->backoff_factor = 0.5;
    s->growth_interval = 2000;
    s->good_steps = 0;
    s->skipped = 0;
}

fg_status fg_grad_scaler_check(const fg_grad_scaler *s)
{
    if (!s)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL scaler");
    if (!isfinite(s->scale) || !(s->scale > 0))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "loss scale %g (finite and "
                       "> 0)", s->scale);
    if (!(s->growth_factor >= 1) || !isfinite(s->growth_factor))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "growth factor %g (>= 1)",
                       s->growth_factor);
    if (!(s->backoff_factor > 0 && s->backoff_factor < 1))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "backoff factor %g (in "
                       "(0, 1))", s->backoff_factor);
    if (s->growth_interval < 1 || s->good_steps < 0 || s->skipped < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "growth interval %lld, good "
                       "steps %lld, skipped %lld (interval >= 1, counts >= "
                       "0)", (long long)s->growth_interval,
                       (long long)s->good_steps, (long long)s->skipped);
    return FG_OK;
}

/* The scale stays a normal number whose inverse is too: 2^-24 .. 2^64
 * (far beyond any useful fp16 scale, and 2^64 squared stays finite in
 * the norm's fp64 sum of squares). */
#define SCALE_MIN 0x1p-24
#define SCALE_MAX 0x1p64

fg_status fg_grad_scaler_update(fg_grad_scaler *s, int found_inf)
{
    FG_TRY(fg_grad_scaler_check(s));
    if (found_inf) {
        s->skipped++;
        s->good_steps = 0;
        s->scale = fmax(s->scale * s->backoff_factor, SCALE_MIN);
    } else if (++s->good_steps >= s->growth_interval) {
        s->good_steps = 0;
        s->scale = fmin(s->scale * s->growth_factor, SCALE_MAX);
    }
    return FG_OK;
}

fg_status fg_grad_scaler_unscale(const fg_grad_scaler *s,
                                 const fg_param *params, int n,
                                 double max_norm, double *norm,
                                 int *found_inf)
{
    if (found_inf)
        *found_inf = 0;
    FG_TRY(fg_grad_scaler_check(s));
    if (!found_inf)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL found_inf");
    return fg_clip_grad_unscale(params, n, max_norm, 1.0 / s->scale, norm,
                                found_inf);
}
