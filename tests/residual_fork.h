/* SPDX-License-Identifier: MIT */
/* tests/residual_fork.h - a gradient fork like a transformer's residual
 * stream, on any device: h = 1.5 x feeds a layernorm and, created after it
 * (so its backward runs first), h * r. The layernorm's backward then adds
 * dx into h's pending gradient itself (fg_op_def.backward_acc) instead of
 * writing dx for the engine to accumulate; no-op tensor hooks on h and the
 * parameters keep the engine's general paths. Two backwards each (the
 * second adds into the parameters' .grad, through the layernorm's backward
 * on the fused run), and x, weight and bias gradients must be equal
 * bit for bit, and so must h's retained gradient (the fork's total, which
 * fg_tensor_retain_grad takes when h's producer runs), with fewer separate
 * accumulations on the fused path (fg_profile_ops). Include after
 * test_ops_util.h. */
#ifndef FG_TESTS_RESIDUAL_FORK_H
#define FG_TESTS_RESIDUAL_FORK_H

#include <string.h>

#include "flashgrad/profile.h"

static fg_status rf_noop_hook(fg_tensor *g, fg_tensor **replace, void *user)
{
    (void)g;
    (void)replace;
    (void)user;
    return FG_OK;
}

/* A tensor of dt on dev holding h (n doubles). */
static fg_tensor *rf_tensor(fg_dtype dt, fg_device dev, int nd,
                            const int64_t *shape, const double *h, int64_t n,
                            int requires_grad)
{
    fg_tensor *t = NULL;
    FGT_OK(fg_tensor_empty(dt, dev, nd, shape, &t));
    FGT_OK(fg_tensor_copy_from_host(t, FG_FP64, h, n));
    if (requires_grad)
        FGT_OK(fg_tensor_set_requires_grad(t, 1));
    return t;
}

/* One forward and backward of sum(cast(ln(h), xt) ... ): returns the
 * region's count of separate gradient accumulations; *hgrad (when
 * non-NULL) gets h's retained gradient, the fork's total, on the host. */
static int64_t rf_step(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                       fg_tensor *u, fg_tensor *r, fg_dtype yt, int hook,
                       double **hgrad)
{
    const fg_device dev = fg_tensor_device(x);
    const fg_dtype xt = fg_tensor_dtype(x);
    fg_tensor *h = NULL, *a = NULL, *p = NULL, *sa = NULL, *sac = NULL,
              *q = NULL, *sq = NULL, *loss = NULL;
    fg_hook *hk = NULL;
    FGT_OK(fg_scale(x, 1.5, &h));
    if (hgrad) /* a retain hook: the fused path still taken */
        FGT_OK(fg_tensor_retain_grad(h));
    if (hook)
        FGT_OK(fg_tensor_register_hook(h, rf_noop_hook, NULL, &hk));
    FGT_OK(fg_layernorm_cast(h, w, b, 1e-5, yt, &a));
    FGT_OK(fg_mul(a, u, &p));
    FGT_OK(fg_mul(h, r, &q)); /* after the layernorm: its backward first */
    FGT_OK(fg_sum(p, NULL, 0, 0, &sa));
    FGT_OK(fg_cast(sa, xt, &sac));
    FGT_OK(fg_sum(q, NULL, 0, 0, &sq));
    FGT_OK(fg_add(sac, sq, &loss));
    FGT_OK(fg_profile_begin(dev));
    FGT_OK(fg_backward(loss));
    fg_profile prof;
    FGT_OK(fg_profile_end(&prof));
    fg_profile_op ops[128];
    const int nops = fg_profile_ops(ops, 128);
    int64_t acc = 0;
    for (int i = 0; i < nops && i < 128; i++)
        if (!strcmp(ops[i].name, "fg_grad_accumulate"))
            acc += ops[i].calls;
    if (hgrad)
        *hgrad = fgt_host(fg_tensor_grad(h));
    if (hk)
        fg_hook_remove(hk);
    fg_tensor *all[] = {h, a, p, q, sa, sac, sq, loss};
    fgt_free_all(all, 8);
    return acc;
}

static void rf_expect_same(const char *what, const fg_tensor *a,
                           const fg_tensor *b, fg_dtype xt, fg_dtype yt)
{
    const int64_t n = fg_tensor_numel(a);
    double *ha = fgt_host(a), *hb = fgt_host(b);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&ha[i], &hb[i], sizeof(double)) == 0,
                      "%s (%s -> %s) [%lld]: %.17g fused, %.17g general",
                      what, fg_dtype_name(xt), fg_dtype_name(yt),
                      (long long)i, ha[i], hb[i]);
    free(ha);
    free(hb);
}

/* x [R, C] of xt, the layernorm's output of yt, on dev. */
static void check_residual_fork(fg_device dev, fg_dtype xt, fg_dtype yt,
                                int64_t R, int64_t C, uint64_t seed)
{
    fgt_rng rng = fgt_rng_for(seed);
    const int64_t shape[2] = {R, C}, n = R * C;
    double *hx = malloc(sizeof(double) * (size_t)n),
           *hu = malloc(sizeof(double) * (size_t)n),
           *hr = malloc(sizeof(double) * (size_t)n),
           *hw = malloc(sizeof(double) * (size_t)C),
           *hb = malloc(sizeof(double) * (size_t)C);
    for (int64_t i = 0; i < n; i++) {
        hx[i] = 2 * fgt_uniform(&rng);
        hu[i] = fgt_uniform(&rng);
        hr[i] = fgt_uniform(&rng);
    }
    for (int64_t j = 0; j < C; j++) {
        hw[j] = 1 + 0.5 * fgt_uniform(&rng);
        hb[j] = 0.5 * fgt_uniform(&rng);
    }
    fg_tensor *x[2], *w[2], *b[2];
    fg_tensor *u = rf_tensor(yt, dev, 2, shape, hu, n, 0),
              *r = rf_tensor(xt, dev, 2, shape, hr, n, 0);
    int64_t acc[2] = {0, 0};
    fg_hook *hooks[2] = {NULL, NULL};
    double *hg[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) { /* 0 fused, 1 the general path */
        x[k] = rf_tensor(xt, dev, 2, shape, hx, n, 1);
        w[k] = rf_tensor(xt, dev, 1, &C, hw, C, 1);
        b[k] = rf_tensor(xt, dev, 1, &C, hb, C, 1);
        if (k) /* the parameters' general path too */
            for (int i = 0; i < 2; i++)
                FGT_OK(fg_tensor_register_hook(i ? b[k] : w[k], rf_noop_hook,
                                               NULL, &hooks[i]));
        for (int rep = 0; rep < 2; rep++)
            acc[k] += rf_step(x[k], w[k], b[k], u, r, yt, k,
                              rep ? &hg[k] : NULL);
    }
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&hg[0][i], &hg[1][i], sizeof(double)) == 0,
                      "retained h.grad (%s -> %s) [%lld]: %.17g fused, "
                      "%.17g general", fg_dtype_name(xt), fg_dtype_name(yt),
                      (long long)i, hg[0][i], hg[1][i]);
    free(hg[0]);
    free(hg[1]);
    fg_hook_remove(hooks[0]);
    fg_hook_remove(hooks[1]);
    ck_assert_msg(acc[0] < acc[1],
                  "%s -> %s: %lld accumulations fused, %lld general: the "
                  "layernorm did not add into the fork",
                  fg_dtype_name(xt), fg_dtype_name(yt), (long long)acc[0],
                  (long long)acc[1]);
    rf_expect_same("dx", fg_tensor_grad(x[0]), fg_tensor_grad(x[1]), xt, yt);
    rf_expect_same("dw", fg_tensor_grad(w[0]), fg_tensor_grad(w[1]), xt, yt);
    rf_expect_same("db", fg_tensor_grad(b[0]), fg_tensor_grad(b[1]), xt, yt);
    fg_tensor *all[] = {x[0], x[1], w[0], w[1], b[0], b[1], u, r};
    fgt_free_all(all, 8);
    free(hx);
    free(hu);
    free(hr);
    free(hw);
    free(hb);
}

#endif /* FG_TESTS_RESIDUAL_FORK_H */
