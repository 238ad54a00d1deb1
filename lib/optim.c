/* lib/optim.c - AdamW, global-norm gradient clipping, LR schedule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flashgrad/optim.h"
#include "error.h"

struct fg_adamw {
    fg_adamw_config cfg;
    int n;
    fg_param *params;
    fg_tensor **m, **v;
    int64_t t;
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
    if (fg_tensor_device(t) != FG_DEVICE_CPU)
        return fg_error_at(FG_ERR_UNSUPPORTED, fn,
                           "parameter %s on %s: only the CPU optimizer "
                           "exists", p->name,
                           fg_device_name(fg_tensor_device(t)));
    if (!fg_tensor_is_contiguous(t) ||
        (fg_tensor_dtype(t) != FG_FP32 && fg_tensor_dtype(t) != FG_FP64))
        return fg_error_at(FG_ERR_INVALID_ARGUMENT, fn,
                           "parameter %s must be contiguous fp32/fp64",
                           p->name);
    return FG_OK;
}

fg_status fg_adamw_create(const fg_param *params, int n,
                          const fg_adamw_config *c, fg_adamw **out)
{
    if (!params || n <= 0 || !c || !out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    if (!(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1 &&
          c->eps > 0 && c->weight_decay >= 0))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "betas in [0, 1), eps > 0, weight decay >= 0");
    for (int i = 0; i < n; i++)
        FG_TRY(check_param(__func__, &params[i]));
    fg_adamw *o = calloc(1, sizeof *o);
    if (!o)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "optimizer");
    o->cfg = *c;
    o->params = calloc((size_t)n, sizeof *o->params);
    o->m = calloc((size_t)n, sizeof *o->m);
    o->v = calloc((size_t)n, sizeof *o->v);
    fg_status s = (o->params && o->m && o->v)
                      ? FG_OK
                      : FG_FAIL(FG_ERR_OUT_OF_MEMORY, "optimizer");
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

fg_status fg_adamw_step(fg_adamw *o, double lr)
{
    if (!o)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL optimizer");
    if (lr < 0)
        lr = o->cfg.lr;
    if (!isfinite(lr))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "learning rate %g", lr);
    o->t++;
    const double b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
    const double bc1 = 1 - pow(b1, (double)o->t),
                 bc2 = 1 - pow(b2, (double)o->t);
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
    }
    return FG_OK;
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

fg_status fg_clip_grad_norm(const fg_param *params, int n, double max_norm,
                            double *norm)
{
    if (!params || n < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    for (int i = 0; i < n; i++)
        FG_TRY(check_param(__func__, &params[i]));
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
    const double total = sqrt(ss);
    if (norm)
        *norm = total;
    if (max_norm > 0 && total > max_norm) {
        const double k = max_norm / (total + 1e-6);
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

double fg_lr_at(const fg_lr_schedule *s, int64_t step)
{
    if (!s)
        return 0;
    if (step < s->warmup)
        return s->lr * (double)(step + 1) / (double)s->warmup;
    if (step >= s->total || s->total <= s->warmup)
        return s->min_lr;
    const double r =
        (double)(step - s->warmup) / (double)(s->total - s->warmup);
    return s->min_lr + 0.5 * (1 + cos(M_PI * r)) * (s->lr - s->min_lr);
}
