/* SPDX-License-Identifier: MIT */
/* lib/train/optim.c - AdamW, global-norm gradient clipping, LR schedule.
 * Parameters on the GPU go to the multi-tensor kernels of
 * kernels/ops/optim_cuda.cu (one launch per update), which follow the CPU loop
 * below operation for operation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "flashgrad/optim.h"
#include "lib/core/error.h"
#include "lib/autograd/tensor_internal.h"
#include "kernels/runtime/profile.h"
#include "lib/ops/cuda_ops_blas.h" /* fg_cuda_clip (plain C) */
#include "train_internal.h"

struct fg_adamw {
    fg_adamw_config cfg;
    int n;
    fg_param *params;
    fg_tensor **m, **v;
    int64_t t;
    fg_device dev; /* of every parameter */
#ifdef FG_HAVE_CUDA
    fg_cuda_adamw_param *cuda_params; /* n entries, refilled per step */
    fg_cuda_optim_cache *cuda_cache;  /* the device table, kept between steps */
#endif
};

void fg_adamw_config_init(fg_adamw_config *c)
{
    if (!c)
        return;
    c->lr = 3e-4;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->weight_decay = 0.1;
}

static fg_status check_param(const char *fn, const fg_param *p)
{
    const fg_tensor *t = p->tensor;
    if (!t)
        return fg_error_at(FG_ERR_INVALID_ARGUMENT, fn, "NULL parameter %s",
                           p->name);
    const fg_device dev = fg_tensor_device(t);
    int known = dev == FG_DEVICE_CPU;
#ifdef FG_HAVE_CUDA
    known |= dev == FG_DEVICE_CUDA;
#endif
    if (!known)
        return fg_error_at(FG_ERR_UNSUPPORTED, fn,
                           "parameter %s on %s: no optimizer for that "
                           "device in this build", p->name,
                           fg_device_name(dev));
    if (!fg_tensor_is_contiguous(t) ||
        (fg_tensor_dtype(t) != FG_FP32 && fg_tensor_dtype(t) != FG_FP64))
        return fg_error_at(FG_ERR_INVALID_ARGUMENT, fn,
                           "parameter %s must be contiguous fp32/fp64",
                           p->name);
    return FG_OK;
}

/* Every parameter checked, and all on one device (*dev; CPU when n == 0):
 * one update runs entirely on the CPU or entirely in one GPU launch. */
static fg_status check_params(const char *fn, const fg_param *ps, int n,
                              fg_device *dev)
{
    *dev = FG_DEVICE_CPU;
    for (int i = 0; i < n; i++) {
        FG_TRY(check_param(fn, &ps[i]));
        const fg_device d = fg_tensor_device(ps[i].tensor);
        if (i == 0)
            *dev = d;
        else if (d != *dev)
            return fg_error_at(FG_ERR_INVALID_ARGUMENT, fn,
                               "parameter %s is on %s, %s on %s: all "
                               "parameters must be on one device",
                               ps[i].name, fg_device_name(d), ps[0].name,
                               fg_device_name(*dev));
    }
    return FG_OK;
}

fg_status fg_adamw_create(const fg_param *params, int n,
                          const fg_adamw_config *c, fg_adamw **out)
{
    if (!params || n <= 0 || !c || !out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    if (!(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1 &&
          c->eps > 0 && isfinite(c->eps) && c->weight_decay >= 0 &&
          isfinite(c->weight_decay) && c->lr >= 0 && isfinite(c->lr)))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "betas in [0, 1), eps finite and > 0, weight decay and "
                       "lr finite and >= 0 (got betas %g, %g, eps %g, weight "
                       "decay %g, lr %g)",
                       c->beta1, c->beta2, c->eps, c->weight_decay, c->lr);
    fg_device dev;
    FG_TRY(check_params(__func__, params, n, &dev));
    fg_adamw *o = calloc(1, sizeof *o);
    if (!o)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "optimizer");
    o->cfg = *c;
    o->dev = dev;
    o->params = calloc((size_t)n, sizeof *o->params);
    o->m = calloc((size_t)n, sizeof *o->m);
    o->v = calloc((size_t)n, sizeof *o->v);
    int ok = o->params && o->m && o->v;
#ifdef FG_HAVE_CUDA
    if (dev == FG_DEVICE_CUDA) {
        o->cuda_params = calloc((size_t)n, sizeof *o->cuda_params);
        ok = ok && o->cuda_params;
    }
#endif
    fg_status s = ok ? FG_OK : FG_FAIL(FG_ERR_OUT_OF_MEMORY, "optimizer");
    if (s == FG_OK)
        s = fg_arena_push(NULL); /* optimizer state lives on the heap */
    if (s == FG_OK) {
        for (int i = 0; i < n && s == FG_OK; i++) {
            o->params[i] = params[i];
            fg_tensor *p = fg_tensor_retain(params[i].tensor);
            o->n = i + 1;
            fg_dtype dt = fg_tensor_dtype(p);
            fg_device dev = fg_tensor_device(p);
            s = fg_tensor_zeros(dt, dev, fg_tensor_ndim(p), fg_tensor_shape(p),
                                &o->m[i]);
            if (s == FG_OK)
                s = fg_tensor_zeros(dt, dev, fg_tensor_ndim(p),
                                    fg_tensor_shape(p), &o->v[i]);
        }
        fg_arena_pop(NULL);
    }
    if (s != FG_OK) {
        fg_adamw_free(o);
        return s;
    }
    *out = o;
    return FG_OK;
}

void fg_adamw_free(fg_adamw *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n; i++) {
        fg_tensor_free(o->params[i].tensor);
        fg_tensor_free(o->m[i]);
        fg_tensor_free(o->v[i]);
    }
    free(o->params);
    free(o->m);
    free(o->v);
#ifdef FG_HAVE_CUDA
    free(o->cuda_params);
    fg_cuda_optim_cache_free(o->cuda_cache);
#endif
    free(o);
}

#define ADAMW_LOOP(T, SQRT)                                               \
    do {                                                                  \
        T *p = pp;                                                        \
        const T *g = gp;                                                  \
        T *m = mp, *v = vp;                                               \
        for (int64_t j = 0; j < len; j++) {                               \
            m[j] = (T)(b1 * m[j] + (1 - b1) * g[j]);                      \
            v[j] = (T)(b2 * v[j] + (1 - b2) * g[j] * g[j]);               \
            T upd = (T)((m[j] / bc1) / (SQRT((T)(v[j] / bc2)) + eps));    \
            p[j] = (T)(p[j] * decay - lr * upd);                          \
        }                                                                 \
    } while (0)

#ifdef FG_HAVE_CUDA
/* The GPU update: the table of parameters that have a gradient, then one
 * launch (the table is uploaded again only when it changed). Validates
 * every gradient before anything is updated. *skipped = 1 where clip
 * skipped the update (the norm, read back, is not finite). */
static fg_status adamw_step_cuda(fg_adamw *o, double lr, double bc1,
                                 double bc2, const fg_cuda_clip *clip,
                                 double *norm, int *skipped)
{
    int k = 0;
    for (int i = 0; i < o->n; i++) {
        fg_tensor *pt = o->params[i].tensor, *gt = fg_tensor_grad(pt);
        if (!gt)
            continue;
        if (!fg_tensor_is_contiguous(gt) ||
            fg_tensor_device(gt) != FG_DEVICE_CUDA ||
            fg_tensor_dtype(gt) != fg_tensor_dtype(pt) ||
            fg_tensor_numel(gt) != fg_tensor_numel(pt))
            return FG_FAIL(FG_ERR_STATE,
                           "gradient of %s must be a contiguous %s CUDA "
                           "tensor of the parameter's size",
                           o->params[i].name,
                           fg_dtype_name(fg_tensor_dtype(pt)));
        fg_cuda_adamw_param *e = &o->cuda_params[k++];
        e->param = fg_tensor_data(pt);
        e->grad = fg_tensor_data(gt);
        e->m = fg_tensor_data(o->m[i]);
        e->v = fg_tensor_data(o->v[i]);
        e->numel = fg_tensor_numel(pt);
        e->dtype = fg_tensor_dtype(pt);
        e->decay = o->params[i].decay != 0;
        fg_tensor *lp = fg_tensor_lowp_target(pt);
        e->lowp = lp ? fg_tensor_data(lp) : NULL;
        e->lowp_dtype = lp ? fg_tensor_dtype(lp) : FG_BF16;
    }
    fg_cuda_adamw_hparams h;
    h.lr = lr;
    h.beta1 = o->cfg.beta1;
    h.beta2 = o->cfg.beta2;
    h.eps = o->cfg.eps;
    h.bc1 = bc1;
    h.bc2 = bc2;
    h.decay = 1 - lr * o->cfg.weight_decay; /* as the CPU loop's */
    if (clip) { /* the norm, then the update scaling as it reads */
        double nm = 0;
        FG_TRY(fg_cuda_adamw_step_clip(&o->cuda_cache, o->cuda_params, k, &h,
                                       clip, &nm));
        if (norm)
            *norm = nm;
        if (clip->skip_nonfinite && !isfinite(nm)) {
            *skipped = 1; /* nothing written: the copies stay as they were */
            return FG_OK;
        }
    } else
        FG_TRY(fg_cuda_adamw_step(&o->cuda_cache, o->cuda_params, k, &h));
    for (int i = 0; i < o->n; i++) { /* the copies written are current */
        fg_tensor *pt = o->params[i].tensor;
        if (fg_tensor_grad(pt))
            fg_tensor_lowp_updated(pt, fg_tensor_lowp_target(pt));
    }
    return FG_OK;
}
#endif

static fg_status clip_impl(const fg_param *params, int n, const fg_cuda_clip *c,
                           double *norm, int *skipped);

/* clip non-NULL: clip_impl over o's parameters first (on CUDA folded into
 * the update, .grad left unscaled); a step it skips changes nothing, t
 * included, and sets *skipped. */
static fg_status adamw_step_any(fg_adamw *o, double lr, const fg_cuda_clip *clip,
                                double *norm, int *skipped)
{
    int skip_local = 0;
    if (!skipped)
        skipped = &skip_local;
    *skipped = 0;
    if (!o)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL optimizer");
    if (lr < 0)
        lr = o->cfg.lr;
    if (!isfinite(lr)) /* NaN or inf: no step, and t stays */
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "learning rate %g", lr);
    if (clip && isnan(clip->max_norm)) /* it would skip clipping silently */
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "max_norm is NaN");
    if (clip && o->dev != FG_DEVICE_CUDA) {
        FG_TRY(clip_impl(o->params, o->n, clip, norm, skipped));
        if (*skipped)
            return FG_OK;
    }
    o->t++;
    const double b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
    const double bc1 = 1 - pow(b1, (double)o->t),
                 bc2 = 1 - pow(b2, (double)o->t);
#ifdef FG_HAVE_CUDA
    if (o->dev == FG_DEVICE_CUDA) {
        fg_status s = adamw_step_cuda(o, lr, bc1, bc2, clip, norm, skipped);
        if (s == FG_OK && *skipped)
            o->t--; /* no update happened */
        return s;
    }
#endif
    for (int i = 0; i < o->n; i++) {
        fg_tensor *pt = o->params[i].tensor, *gt = fg_tensor_grad(pt);
        if (!gt)
            continue;
        if (!fg_tensor_is_contiguous(gt))
            return FG_FAIL(FG_ERR_STATE, "gradient of %s is not contiguous",
                           o->params[i].name);
        const double decay =
            o->params[i].decay ? 1 - lr * o->cfg.weight_decay : 1;
        const int64_t len = fg_tensor_numel(pt);
        void *pp = fg_tensor_data(pt), *mp = fg_tensor_data(o->m[i]),
             *vp = fg_tensor_data(o->v[i]);
        const void *gp = fg_tensor_data(gt);
        if (fg_tensor_dtype(pt) == FG_FP32)
            ADAMW_LOOP(float, sqrtf);
        else
            ADAMW_LOOP(double, sqrt);
        fg_tensor_lowp_updated(pt, NULL); /* a cached copy is stale now */
    }
    return FG_OK;
}

fg_status fg_adamw_step(fg_adamw *o, double lr)
{
    FG_PROF_RETURN(FG_PROF_OPTIMIZER,
                   adamw_step_any(o, lr, NULL, NULL, NULL));
}

fg_status fg_adamw_step_clip(fg_adamw *o, double lr, double max_norm,
                             double *norm)
{
    const fg_cuda_clip c = {max_norm, 1.0, 0};
    FG_PROF_RETURN(FG_PROF_OPTIMIZER, adamw_step_any(o, lr, &c, norm, NULL));
}

fg_status fg_adamw_step_unscale(fg_adamw *o, double lr, double max_norm,
                                double inv_scale, double *norm, int *skipped)
{
    const fg_cuda_clip c = {max_norm, inv_scale, 1};
    FG_PROF_RETURN(FG_PROF_OPTIMIZER,
                   adamw_step_any(o, lr, &c, norm, skipped));
}

const fg_param *fg_adamw_params(const fg_adamw *o, int *n)
{
    *n = o ? o->n : 0;
    return o ? o->params : NULL;
}

int64_t fg_adamw_steps(const fg_adamw *o)
{
    return o ? o->t : 0;
}

fg_status fg_adamw_set_steps(fg_adamw *o, int64_t t)
{
    if (!o || t < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    o->t = t;
    return FG_OK;
}

fg_status fg_adamw_state(const fg_adamw *o, int i, fg_tensor **m,
                         fg_tensor **v)
{
    if (!o || i < 0 || i >= o->n)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "no parameter %d", i);
    if (m)
        *m = o->m[i];
    if (v)
        *v = o->v[i];
    return FG_OK;
}

#ifdef FG_HAVE_CUDA
/* The GPU norm and clip: the gradients' table, one reduction, the factor
 * and the scaling computed on the device. */
static fg_status clip_cuda(const fg_param *params, int n, const fg_cuda_clip *c,
                           double *norm, int *skipped)
{
    fg_cuda_grad *gs = calloc((size_t)n, sizeof *gs);
    if (!gs)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "gradient table");
    int k = 0;
    for (int i = 0; i < n; i++) {
        fg_tensor *g = fg_tensor_grad(params[i].tensor);
        if (!g)
            continue;
        if (!fg_tensor_is_contiguous(g) ||
            fg_tensor_device(g) != FG_DEVICE_CUDA) {
            free(gs);
            return FG_FAIL(FG_ERR_STATE,
                           "gradient of %s must be a contiguous CUDA tensor",
                           params[i].name);
        }
        gs[k].data = fg_tensor_data(g);
        gs[k].numel = fg_tensor_numel(g);
        gs[k].dtype = fg_tensor_dtype(g);
        k++;
    }
    double nm = 0;
    fg_status s = fg_cuda_clip_grad_norm(gs, k, c, c->skip_nonfinite ? &nm : norm);
    free(gs);
    if (s == FG_OK && c->skip_nonfinite) {
        if (norm)
            *norm = nm;
        *skipped = !isfinite(nm);
    }
    return s;
}
#endif

/* The global norm (divided by the loss scale: c->inv_scale), then the
 * gradients times fg_clip_factor; with c->skip_nonfinite, a norm that is
 * not finite sets *skipped and leaves the gradients as they are. */
static fg_status clip_impl(const fg_param *params, int n, const fg_cuda_clip *c,
                           double *norm, int *skipped)
{
    *skipped = 0;
    if (!params || n < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    if (isnan(c->max_norm)) /* it would skip clipping silently */
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "max_norm is NaN");
    fg_device dev;
    FG_TRY(check_params(__func__, params, n, &dev));
#ifdef FG_HAVE_CUDA
    if (dev == FG_DEVICE_CUDA)
        return clip_cuda(params, n, c, norm, skipped);
#endif
    double ss = 0;
    for (int i = 0; i < n; i++) {
        fg_tensor *g = fg_tensor_grad(params[i].tensor);
        if (!g)
            continue;
        const int64_t len = fg_tensor_numel(g);
        if (fg_tensor_dtype(g) == FG_FP32) {
            const float *x = fg_tensor_data(g);
            for (int64_t j = 0; j < len; j++)
                ss += (double)x[j] * x[j];
        } else {
            const double *x = fg_tensor_data(g);
            for (int64_t j = 0; j < len; j++)
                ss += x[j] * x[j];
        }
    }
    /* a power-of-two scale divides exactly: the unscaled gradients' norm */
    const double total = sqrt(ss) * c->inv_scale;
    if (norm)
        *norm = total;
    if (c->skip_nonfinite && !isfinite(total)) {
        *skipped = 1;
        return FG_OK;
    }
    const double k = fg_clip_factor(total, c->max_norm, c->inv_scale);
    if (k != 1.0) {
        for (int i = 0; i < n; i++) {
            fg_tensor *g = fg_tensor_grad(params[i].tensor);
            if (!g)
                continue;
            const int64_t len = fg_tensor_numel(g);
            if (fg_tensor_dtype(g) == FG_FP32) {
                float *x = fg_tensor_data(g);
                for (int64_t j = 0; j < len; j++)
                    x[j] = (float)(x[j] * k);
            } else {
                double *x = fg_tensor_data(g);
                for (int64_t j = 0; j < len; j++)
                    x[j] *= k;
            }
        }
    }
    return FG_OK;
}

fg_status fg_clip_grad_norm(const fg_param *params, int n, double max_norm,
                            double *norm)
{
    const fg_cuda_clip c = {max_norm, 1.0, 0};
    int skipped;
    FG_PROF_RETURN(FG_PROF_OPTIMIZER,
                   clip_impl(params, n, &c, norm, &skipped));
}

fg_status fg_clip_grad_unscale(const fg_param *params, int n,
                               double max_norm, double inv_scale,
                               double *norm, int *skipped)
{
    const fg_cuda_clip c = {max_norm, inv_scale, 1};
    FG_PROF_RETURN(FG_PROF_OPTIMIZER,
                   clip_impl(params, n, &c, norm, skipped));
}

double fg_lr_at(const fg_lr_schedule *s, int64_t step)
{
    if (!s)
        return 0;
    if (step < 0) /* (0 + 1) / warmup, or lr: never 0 / 0 */
        step = 0;
    if (step < s->warmup)
        return s->lr * (double)(step + 1) / (double)s->warmup;
    if (step >= s->total || s->total <= s->warmup)
        return s->min_lr;
    const double r =
        (double)(step - s->warmup) / (double)(s->total - s->warmup);
    return s->min_lr + 0.5 * (1 + cos(M_PI * r)) * (s->lr - s->min_lr);
}
