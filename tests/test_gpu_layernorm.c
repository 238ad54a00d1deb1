/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_layernorm.c - the CUDA layernorm kernels (issue 22) on
 * training shapes, through their entry points so that every output can be
 * poisoned (NaN) first: forward (y, mean, rstd) and backward (dx, dw, db)
 * against a naive fp64 reference on the same (rounded) inputs, for rows held
 * in registers (C = 64, 768, 3072, 8192; C = 771, not a multiple of the
 * vector width; rows not a multiple of a block's rows; more rows than one
 * wave of blocks, so a block sums several) and rows over the register bound
 * (C = 4100 in fp64, 10000); strided weight and missing bias; every dtype
 * pair of fg_layernorm_cast (same dtype, fp32 -> bf16 / fp16, fp64 ->
 * fp32). Also: dw / db / dx bitwise equal over two runs (no atomics); the
 * narrow-output kernels equal the same-dtype kernel followed by fg_cast bit
 * for bit, forward and backward; a NaN stays in its row (y, dx) and
 * reaches every dw column; fg_nn_layernorm_forward under bf16 autocast
 * returns that bf16 tensor and the chain's gradients; and the backward
 * adding dx into a residual fork's pending gradient (residual_fork.h);
 * fg_dropout_add_layernorm's fused kernels equal to the two ops they
 * replace, bit for bit, forward and backward.
 *
 * Tolerances, max-abs error relative to max |reference| (gpu_op_harness.c
 * explains them): fp64 1e-12, fp32 1e-5, bf16 / fp16 gph_tolerance(dt, 3)
 * = 2.3e-2 / 2.9e-3 for a value stored in that dtype (the harness's
 * layernorm depth). Exits 77 without a GPU. */
#include <math.h>
#include <string.h>

#include "gpu_op_harness.h"

#include "lib/ops/cuda_ops_nn.h"
#include "residual_fork.h"

typedef struct ln_shape {
    int64_t R, C;
    int strided_w, no_bias, dw_only;
} ln_shape;

static const ln_shape shapes[] = {
    {37, 768, 0, 0, 0},   {2000, 768, 0, 0, 0}, {5, 3072, 0, 0, 0},
    {19, 771, 0, 0, 0},   {261, 64, 0, 0, 0},   {9, 8192, 0, 0, 0},
    {6, 4100, 0, 0, 0},   {3, 10000, 0, 0, 0},  {11, 1, 0, 0, 0},
    {37, 768, 1, 1, 0},   {300, 771, 1, 0, 1},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static const fg_dtype pairs[][2] = {
    {FG_FP32, FG_FP32}, {FG_FP32, FG_BF16}, {FG_FP32, FG_FP16},
    {FG_BF16, FG_BF16}, {FG_FP16, FG_FP16}, {FG_FP64, FG_FP64},
    {FG_FP64, FG_FP32},
};
#define N_PAIRS ((int)(sizeof pairs / sizeof pairs[0]))

static double tol_of(fg_dtype dt)
{
    return dt == FG_FP64 || dt == FG_FP32 ? gph_tolerance(dt, 0)
                                          : gph_tolerance(dt, 3);
}

/* An uninitialised CUDA tensor filled with NaN. */
static fg_tensor *poisoned(fg_dtype dt, int nd, const int64_t *shape)
{
    fg_tensor *t = NULL;
    FGT_OK(fg_tensor_empty(dt, FG_DEVICE_CUDA, nd, shape, &t));
    FGT_OK(fg_tensor_fill(t, NAN));
    return t;
}

static void expect_close(const char *what, const ln_shape *s, fg_dtype xt,
                         fg_dtype yt, const fg_tensor *g, const double *ref,
                         double tol)
{
    const int64_t n = fg_tensor_numel(g);
    double *h = fgt_host(g), num = 0, den = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = isnan(h[i]) ? INFINITY : fabs(h[i] - ref[i]);
        if (e > num || isnan(h[i])) {
            num = e;
            at = i;
        }
        den = fmax(den, fabs(ref[i]));
    }
    const double err = num == 0 ? 0 : num / den;
    ck_assert_msg(err <= tol,
                  "[%lld x %lld] %s -> %s %s: error %.3g > %.3g at %lld "
                  "(gpu %.17g, ref %.17g)",
                  (long long)s->R, (long long)s->C, fg_dtype_name(xt),
                  fg_dtype_name(yt), what, err, tol, (long long)at, h[at],
                  ref[at]);
    free(h);
}

static void expect_same(const char *what, const ln_shape *s, fg_dtype xt,
                        fg_dtype yt, const fg_tensor *a, const fg_tensor *b)
{
    const int64_t n = fg_tensor_numel(a);
    double *ha = fgt_host(a), *hb = fgt_host(b);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&ha[i], &hb[i], sizeof(double)) == 0,
                      "[%lld x %lld] %s -> %s %s[%lld]: %.17g vs %.17g",
                      (long long)s->R, (long long)s->C, fg_dtype_name(xt),
                      fg_dtype_name(yt), what, (long long)i, ha[i], hb[i]);
    free(ha);
    free(hb);
}

/* The naive fp64 layernorm of rows hx (w, b may be NULL): y, mean, rstd,
 * and with the incoming gradient hg: dx, dw, db. */
static void reference(const ln_shape *s, const double *hx, const double *hw,
                      const double *hb, const double *hg, double *y,
                      double *mean, double *rstd, double *dx, double *dw,
                      double *db)
{
    const int64_t R = s->R, C = s->C;
    memset(dw, 0, sizeof(double) * (size_t)C);
    memset(db, 0, sizeof(double) * (size_t)C);
    for (int64_t r = 0; r < R; r++) {
        const double *xr = hx + r * C, *gr = hg + r * C;
        double m = 0, v = 0, s1 = 0, s2 = 0;
        for (int64_t j = 0; j < C; j++)
            m += xr[j];
        m /= (double)C;
        for (int64_t j = 0; j < C; j++)
            v += (xr[j] - m) * (xr[j] - m);
        const double rs = 1.0 / sqrt(v / (double)C + 1e-5);
        mean[r] = m;
        rstd[r] = rs;
        for (int64_t j = 0; j < C; j++) {
            const double xh = (xr[j] - m) * rs, wj = hw ? hw[j] : 1.0;
            y[r * C + j] = xh * wj + (hb ? hb[j] : 0.0);
            s1 += gr[j] * wj;
            s2 += gr[j] * wj * xh;
            dw[j] += gr[j] * xh;
            db[j] += gr[j];
        }
        for (int64_t j = 0; j < C; j++) {
            const double xh = (xr[j] - m) * rs, wj = hw ? hw[j] : 1.0;
            dx[r * C + j] = rs * (gr[j] * wj - s1 / (double)C -
                                  xh * s2 / (double)C);
        }
    }
}

/* The layernorm's inputs on the GPU: x (rows with mean ~4: the variance
 * must not cancel), weight (strided when asked: a step-2 view), bias, g. */
typedef struct ln_inputs {
    double *hx, *hw, *hb, *hg;
    fg_tensor *x, *w, *wbase, *b, *g;
} ln_inputs;

static void inputs_make(const ln_shape *s, fg_dtype xt, fg_dtype yt,
                        fgt_rng *r, ln_inputs *in)
{
    memset(in, 0, sizeof *in);
    const gph_input ix = {.nd = 2, .shape = {s->R, s->C}, .amp = 5,
                          .min_abs = 3, .positive = 1},
                    iw = {.nd = 1, .shape = {2 * s->C}, .amp = 1.5,
                          .min_abs = 0.5, .positive = 1},
                    ib = {.nd = 1, .shape = {s->C}},
                    ig = {.nd = 2, .shape = {s->R, s->C}};
    in->hx = gph_draw(&ix, r, xt);
    double *hw2 = gph_draw(&iw, r, xt);
    in->hb = s->no_bias ? NULL : gph_draw(&ib, r, xt);
    in->hg = gph_draw(&ig, r, yt);
    in->x = gph_tensor(xt, FG_DEVICE_CUDA, FG_SHAPE(s->R, s->C), in->hx, 0);
    in->hw = malloc(sizeof(double) * (size_t)s->C);
    if (s->strided_w) { /* every other element of a [2C] vector */
        in->wbase = gph_tensor(xt, FG_DEVICE_CUDA, FG_SHAPE(2 * s->C), hw2, 0);
        FGT_OK(fg_slice(in->wbase, 0, 0, 2 * s->C, 2, &in->w));
        ck_assert_int_eq(fg_tensor_strides(in->w)[0], 2);
        for (int64_t j = 0; j < s->C; j++)
            in->hw[j] = hw2[2 * j];
    } else {
        memcpy(in->hw, hw2, sizeof(double) * (size_t)s->C);
        in->w = gph_tensor(xt, FG_DEVICE_CUDA, FG_SHAPE(s->C), in->hw, 0);
    }
    free(hw2);
    if (in->hb)
        in->b = gph_tensor(xt, FG_DEVICE_CUDA, FG_SHAPE(s->C), in->hb, 0);
    in->g = gph_tensor(yt, FG_DEVICE_CUDA, FG_SHAPE(s->R, s->C), in->hg, 0);
}

static void inputs_free(ln_inputs *in)
{
    fg_tensor *all[] = {in->x, in->w, in->wbase, in->b, in->g};
    fgt_free_all(all, 5);
    free(in->hx);
    free(in->hw);
    free(in->hb);
    free(in->hg);
}

/* Outputs of one forward + backward, poisoned before the calls. */
typedef struct ln_outputs {
    fg_tensor *y, *mean, *rstd, *dx, *dw, *db;
} ln_outputs;

static void run(const ln_shape *s, const ln_inputs *in, fg_dtype yt,
                const fg_tensor *g, ln_outputs *o)
{
    const fg_dtype xt = fg_tensor_dtype(in->x),
                   st = fg_cuda_nn_stat_dtype(xt);
    o->y = poisoned(yt, FG_SHAPE(s->R, s->C));
    o->mean = poisoned(st, FG_SHAPE(s->R));
    o->rstd = poisoned(st, FG_SHAPE(s->R));
    o->dx = s->dw_only ? NULL : poisoned(xt, FG_SHAPE(s->R, s->C));
    o->dw = poisoned(xt, FG_SHAPE(s->C));
    o->db = s->dw_only ? NULL : poisoned(xt, FG_SHAPE(s->C));
    FGT_OK(fg_cuda_layernorm_forward(in->x, in->w, in->b, 1e-5, o->y, o->mean,
                                     o->rstd));
    FGT_OK(fg_cuda_layernorm_backward(in->x, in->w, o->mean, o->rstd, g,
                                      o->dx, 0, o->dw, o->db));
}

static void outputs_free(ln_outputs *o)
{
    fg_tensor *all[] = {o->y, o->mean, o->rstd, o->dx, o->dw, o->db};
    fgt_free_all(all, 6);
}

/* Every output of run a equal to run b's bit for bit; b's y is by (it may
 * be a cast of b->y). */
static void expect_same_outputs(const char *when, const ln_shape *s,
                                fg_dtype xt, fg_dtype yt, const ln_outputs *a,
                                const ln_outputs *b, const fg_tensor *by)
{
    static const char *names[6] = {"y", "mean", "rstd", "dx", "dw", "db"};
    const fg_tensor *ta[6] = {a->y, a->mean, a->rstd, a->dx, a->dw, a->db},
                    *tb[6] = {by, b->mean, b->rstd, b->dx, b->dw, b->db};
    for (int k = 0; k < 6; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s (vs %s)", names[k], when);
        if (ta[k])
            expect_same(what, s, xt, yt, ta[k], tb[k]);
    }
}

START_TEST(test_ln_kernels)
{
    const ln_shape *s = &shapes[_i / N_PAIRS];
    const fg_dtype xt = pairs[_i % N_PAIRS][0], yt = pairs[_i % N_PAIRS][1];
    fgt_rng r = fgt_rng_for(2200 + (uint64_t)_i);
    ln_inputs in;
    inputs_make(s, xt, yt, &r, &in);
    const int64_t RC = s->R * s->C;
    double *y = malloc(sizeof(double) * (size_t)RC),
           *dx = malloc(sizeof(double) * (size_t)RC),
           *mean = malloc(sizeof(double) * (size_t)s->R),
           *rstd = malloc(sizeof(double) * (size_t)s->R),
           *dw = malloc(sizeof(double) * (size_t)s->C),
           *db = malloc(sizeof(double) * (size_t)s->C);
    reference(s, in.hx, in.hw, in.hb, in.hg, y, mean, rstd, dx, dw, db);

    ln_outputs o, o2;
    run(s, &in, yt, in.g, &o);
    const double tc = tol_of(fg_cuda_nn_stat_dtype(xt));
    expect_close("y", s, xt, yt, o.y, y, fmax(tol_of(yt), tc));
    expect_close("mean", s, xt, yt, o.mean, mean, tc);
    expect_close("rstd", s, xt, yt, o.rstd, rstd, tc);
    if (o.dx)
        expect_close("dx", s, xt, yt, o.dx, dx, tol_of(xt));
    expect_close("dw", s, xt, yt, o.dw, dw, tol_of(xt));
    if (o.db)
        expect_close("db", s, xt, yt, o.db, db, tol_of(xt));

    /* deterministic: a second run gives the same bits */
    run(s, &in, yt, in.g, &o2);
    expect_same_outputs("run 2", s, xt, yt, &o, &o2, o2.y);
    outputs_free(&o2);

    /* a narrow y is the same-dtype kernel's y rounded; its backward reads
     * the narrow g as the same-dtype kernel reads g widened */
    if (yt != xt) {
        fg_tensor *gw = NULL, *yc = NULL;
        FGT_OK(fg_cast(in.g, xt, &gw));
        run(s, &in, xt, gw, &o2);
        FGT_OK(fg_cast(o2.y, yt, &yc));
        expect_same_outputs("same-dtype kernel", s, xt, yt, &o, &o2, yc);
        outputs_free(&o2);
        fg_tensor_free(gw);
        fg_tensor_free(yc);
    }
    outputs_free(&o);
    inputs_free(&in);
    free(y);
    free(dx);
    free(mean);
    free(rstd);
    free(dw);
    free(db);
}
END_TEST

/* A NaN in x makes its row of y (and its mean, rstd, dx) NaN and leaves
 * the other rows finite, in the register and the general kernels; every
 * column of dw then sums a NaN. */
START_TEST(test_ln_nan)
{
    const ln_shape sh[2] = {{9, 768, 0, 0, 0}, {3, 10000, 0, 0, 0}};
    for (int k = 0; k < 2; k++) {
        const ln_shape *s = &sh[k];
        fgt_rng r = fgt_rng_for(2290 + (uint64_t)k);
        ln_inputs in;
        inputs_make(s, FG_FP32, FG_BF16, &r, &in);
        const int64_t bad = 1;
        in.hx[bad * s->C + 5] = NAN;
        fg_tensor_free(in.x);
        in.x = gph_tensor(FG_FP32, FG_DEVICE_CUDA, FG_SHAPE(s->R, s->C), in.hx,
                          0);
        ln_outputs o;
        run(s, &in, FG_BF16, in.g, &o);
        double *y = fgt_host(o.y), *dx = fgt_host(o.dx), *dw = fgt_host(o.dw);
        for (int64_t i = 0; i < s->R * s->C; i++) {
            ck_assert_msg(!isnan(y[i]) == (i / s->C != bad), "y[%lld]",
                          (long long)i);
            ck_assert_msg(!isnan(dx[i]) == (i / s->C != bad), "dx[%lld]",
                          (long long)i);
        }
        for (int64_t j = 0; j < s->C; j++)
            ck_assert_msg(isnan(dw[j]), "dw[%lld] = %g", (long long)j, dw[j]);
        free(y);
        free(dx);
        free(dw);
        outputs_free(&o);
        inputs_free(&in);
    }
}
END_TEST

/* y = (fused ? fg_layernorm_cast : fg_cast(fg_layernorm)) in bf16, or
 * fg_nn_layernorm_forward under bf16 autocast (nn); sum(y * u) backward. */
static fg_tensor *ln_chain(fg_tensor *x, fg_nn_layernorm *l, fg_tensor *u,
                           int how)
{
    fg_tensor *y = NULL, *t = NULL, *p = NULL, *sum = NULL;
    if (how == 2) {
        FGT_OK(fg_autocast_begin(FG_BF16));
        FGT_OK(fg_nn_layernorm_forward(l, x, &y));
        FGT_OK(fg_autocast_end());
    } else if (how == 1) {
        FGT_OK(fg_layernorm_cast(x, l->weight, l->bias, l->eps, FG_BF16, &y));
    } else {
        FGT_OK(fg_layernorm(x, l->weight, l->bias, l->eps, &t));
        FGT_OK(fg_cast(t, FG_BF16, &y));
    }
    ck_assert_int_eq(fg_tensor_dtype(y), FG_BF16);
    FGT_OK(fg_mul(y, u, &p));
    FGT_OK(fg_sum(p, NULL, 0, 0, &sum));
    FGT_OK(fg_backward(sum));
    fg_tensor *all[] = {t, p, sum};
    fgt_free_all(all, 3);
    return y;
}

/* The op and the nn layer under autocast: the chain's bits, gradients
 * included (into fp32 x and fp32 parameters). */
START_TEST(test_ln_autocast)
{
    fgt_rng r = fgt_rng_for(2299);
    const ln_shape s = {2 * 64, 768, 0, 0, 0};
    const gph_input ix = {.nd = 3, .shape = {2, 64, 768}, .amp = 3},
                    ip = {.nd = 1, .shape = {768}, .amp = 1.5},
                    iu = {.nd = 3, .shape = {2, 64, 768}};
    double *hx = gph_draw(&ix, &r, FG_FP32), *hw = gph_draw(&ip, &r, FG_FP32),
           *hb = gph_draw(&ip, &r, FG_FP32), *hu = gph_draw(&iu, &r, FG_BF16);
    fg_tensor *x[3], *y[3], *u = gph_tensor(FG_BF16, FG_DEVICE_CUDA, 3,
                                            ix.shape, hu, 0);
    fg_nn_layernorm l[3];
    for (int k = 0; k < 3; k++) {
        x[k] = gph_tensor(FG_FP32, FG_DEVICE_CUDA, 3, ix.shape, hx, 1);
        FGT_OK(fg_nn_layernorm_init(&l[k], 768, FG_FP32, FG_DEVICE_CUDA));
        fg_no_grad_begin();
        FGT_OK(fg_tensor_copy_from_host(l[k].weight, FG_FP64, hw, 768));
        FGT_OK(fg_tensor_copy_from_host(l[k].bias, FG_FP64, hb, 768));
        FGT_OK(fg_no_grad_end());
        y[k] = ln_chain(x[k], &l[k], u, k);
    }
    for (int k = 1; k < 3; k++) {
        expect_same("y", &s, FG_FP32, FG_BF16, y[k], y[0]);
        expect_same("dx", &s, FG_FP32, FG_BF16, fg_tensor_grad(x[k]),
                    fg_tensor_grad(x[0]));
        expect_same("dw", &s, FG_FP32, FG_BF16, fg_tensor_grad(l[k].weight),
                    fg_tensor_grad(l[0].weight));
        expect_same("db", &s, FG_FP32, FG_BF16, fg_tensor_grad(l[k].bias),
                    fg_tensor_grad(l[0].bias));
    }
    for (int k = 0; k < 3; k++) {
        fg_tensor_free(x[k]);
        fg_tensor_free(y[k]);
        fg_nn_layernorm_release(&l[k]);
    }
    fg_tensor_free(u);
    free(hx);
    free(hw);
    free(hb);
    free(hu);
}
END_TEST

/* The residual stream's fork on the GPU: the kernel adds dx into the
 * pending gradient (dx_acc), equal to writing it and accumulating, bit for
 * bit, for the register kernel (C 768, both vector widths) and the
 * general one (C 10000). */
START_TEST(test_ln_residual_fork)
{
    check_residual_fork(FG_DEVICE_CUDA, FG_FP32, FG_BF16, 300, 768, 0x4e61);
    check_residual_fork(FG_DEVICE_CUDA, FG_FP32, FG_FP32, 37, 771, 0x4e62);
    check_residual_fork(FG_DEVICE_CUDA, FG_BF16, FG_BF16, 64, 768, 0x4e63);
    check_residual_fork(FG_DEVICE_CUDA, FG_FP16, FG_FP16, 5, 10000, 0x4e64);
    check_residual_fork(FG_DEVICE_CUDA, FG_FP64, FG_FP64, 19, 768, 0x4e65);
}
END_TEST

/* fg_dropout_add_layernorm against its chain, fg_dropout_add then
 * fg_layernorm_cast: y, h and every gradient (x, b, weight, bias) equal
 * bit for bit. Loss sum(h u) + sum(y v) (use 0), sum(h u) (1: no
 * gradient reaches y itself), sum(y v) (2: none reaches h); b_const: the
 * branch needs no gradient (its node input has no meta: the fused node
 * keeps b's dtype itself). The fused node must be the one recorded where
 * the kernels apply (C % 4 == 0). Two passes, the second adding into the
 * leaves' .grad: the fused node's backward then adds dweight / dbias in
 * its column-sum kernel and dx through the engine's target (backward_acc),
 * the same bits as the chain's accumulations. */
typedef struct dal_case {
    int64_t R, C;
    fg_dtype bt;
    double p;
    int use, b_const;
} dal_case;

static void dal_run(const dal_case *c, int fused, const double *hx,
                    const double *hb, const double *hw, const double *hbias,
                    const double *hu, const double *hv, fg_tensor **out)
{
    const int64_t shape[2] = {c->R, c->C};
    fg_tensor *x = gph_tensor(FG_FP32, FG_DEVICE_CUDA, 2, shape, hx, 1),
              *b = gph_tensor(c->bt, FG_DEVICE_CUDA, 2, shape, hb,
                              !c->b_const),
              *w = gph_tensor(FG_FP32, FG_DEVICE_CUDA, 1, &c->C, hw, 1),
              *bias = gph_tensor(FG_FP32, FG_DEVICE_CUDA, 1, &c->C, hbias, 1),
              *u = gph_tensor(c->bt, FG_DEVICE_CUDA, 2, shape, hu, 0),
              *v = gph_tensor(FG_FP32, FG_DEVICE_CUDA, 2, shape, hv, 0);
    fg_tensor *y = NULL, *h = NULL;
    for (int pass = 0; pass < 2; pass++) {
        fg_tensor *ph = NULL, *py = NULL, *sh = NULL, *sy = NULL,
                  *loss = NULL, *shf = NULL;
        fg_tensor_free(y);
        fg_tensor_free(h);
        y = h = NULL;
        if (fused) {
            FGT_OK(fg_dropout_add_layernorm(x, b, c->p, 0x5eed, 96, w, bias,
                                            1e-5, c->bt, &y, &h));
            if (c->C % 4 == 0)
                ck_assert_str_eq(fg_node_name(fg_tensor_grad_fn(h)),
                                 "DropoutAddLayerNormBackward");
        } else {
            FGT_OK(fg_dropout_add(x, b, c->p, 0x5eed, 96, &y));
            FGT_OK(fg_layernorm_cast(y, w, bias, 1e-5, c->bt, &h));
        }
        FGT_OK(fg_mul(h, u, &ph));
        FGT_OK(fg_sum(ph, NULL, 0, 0, &sh));
        FGT_OK(fg_mul(y, v, &py));
        FGT_OK(fg_sum(py, NULL, 0, 0, &sy));
        if (c->use == 0) {
            FGT_OK(fg_cast(sh, FG_FP32, &shf));
            FGT_OK(fg_add(shf, sy, &loss));
        }
        FGT_OK(fg_backward(c->use == 0 ? loss : c->use == 1 ? sh : sy));
        fg_tensor *all[] = {ph, py, sh, sy, shf, loss};
        fgt_free_all(all, 6);
    }
    out[0] = y;
    out[1] = h;
    out[2] = x;
    out[3] = b;
    out[4] = w;
    out[5] = bias;
    fg_tensor *all[] = {u, v};
    fgt_free_all(all, 2);
}

START_TEST(test_dropout_add_layernorm)
{
    static const dal_case cases[] = {
        {300, 768, FG_BF16, 0.1, 0, 0},  {37, 768, FG_FP16, 0.2, 0, 0},
        {2000, 768, FG_BF16, 0.1, 1, 0}, {64, 768, FG_BF16, 0.1, 2, 0},
        {64, 768, FG_BF16, 0.0, 0, 0},   {19, 771, FG_BF16, 0.1, 0, 0},
        {5, 3072, FG_FP16, 0.1, 0, 0},   {300, 768, FG_BF16, 0.1, 0, 1},
    };
    fgt_rng r = fgt_rng_for(0xda1);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const dal_case *c = &cases[k];
        const ln_shape s = {c->R, c->C, 0, 0, 0};
        const gph_input im = {.nd = 2, .shape = {c->R, c->C}, .amp = 2},
                        ip = {.nd = 1, .shape = {c->C}, .amp = 1.5};
        double *hx = gph_draw(&im, &r, FG_FP32), *hb = gph_draw(&im, &r, c->bt),
               *hw = gph_draw(&ip, &r, FG_FP32),
               *hbias = gph_draw(&ip, &r, FG_FP32),
               *hu = gph_draw(&im, &r, c->bt), *hv = gph_draw(&im, &r, FG_FP32);
        fg_tensor *t[2][6];
        for (int f = 0; f < 2; f++)
            dal_run(c, f, hx, hb, hw, hbias, hu, hv, t[f]);
        expect_same("y", &s, FG_FP32, c->bt, t[1][0], t[0][0]);
        expect_same("h", &s, FG_FP32, c->bt, t[1][1], t[0][1]);
        static const char *names[] = {"dx", "db (branch)", "dweight",
                                      "dbias"};
        for (int i = 0; i < 4; i++) {
            const fg_tensor *g0 = fg_tensor_grad(t[0][2 + i]),
                            *g1 = fg_tensor_grad(t[1][2 + i]);
            if ((c->use == 2 && i >= 2) || (c->b_const && i == 1)) {
                /* no gradient reached h, or b needs none */
                ck_assert_ptr_null(g1);
                continue;
            }
            ck_assert_ptr_nonnull(g1);
            expect_same(names[i], &s, FG_FP32, c->bt, g1, g0);
        }
        for (int f = 0; f < 2; f++)
            fgt_free_all(t[f], 6);
        double *hs[] = {hx, hb, hw, hbias, hu, hv};
        for (int i = 0; i < 6; i++)
            free(hs[i]);
    }
}
END_TEST

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU layernorm suite\n");
        return 77;
    }
    fgt_base_seed();
    Suite *su = suite_create("gpu_layernorm");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    fgt_add_loop(tc, test_ln_kernels, 0, N_SHAPES * N_PAIRS);
    fgt_add_test(tc, test_ln_nan);
    fgt_add_test(tc, test_ln_autocast);
    fgt_add_test(tc, test_ln_residual_fork);
    fgt_add_test(tc, test_dropout_add_layernorm);
    suite_add_tcase(su, tc);
    return fgt_run_suite(su);
}
