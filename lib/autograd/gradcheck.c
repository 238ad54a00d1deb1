/* SPDX-License-Identifier: MIT */
/* lib/autograd/gradcheck.c - finite-difference gradient check (see gradcheck.h).
 *
 * Jacobians are held densely on the host in double: one n_out x numel
 * matrix per checked input, rows filled by vector-Jacobian products, columns
 * by central differences. Everything the check allocates goes to the heap
 * (it pushes "no arena"), so it can run inside a training loop's arena.
 *
 * CUDA inputs (fp64 on the GPU) are perturbed element by element with
 * one-element host<->device copies into the element's device address, and
 * restored from the value read before the perturbation, so every element
 * comes back bit for bit; fast mode moves whole tensors through
 * fg_tensor_copy_{to,from}_host. The output may live on the GPU too: the
 * VJP seed is created on its device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "flashgrad/gradcheck.h"
#include "autograd_internal.h"
#include "lib/core/error.h"
#ifdef FG_HAVE_CUDA
#include "cuda_backend.h"
#endif

void fg_gradcheck_options_init(fg_gradcheck_options *o)
{
    if (!o)
        return;
    o->eps = 1e-6;
    o->atol = 1e-5;
    o->rtol = 1e-3;
    o->fast_mode = 0;
    o->check_reentrant = 1;
    o->allow_fp32 = 0;
    o->seed = 0x5EEDull;
}

typedef struct gc {
    fg_gradcheck_fn fn;
    void *user;
    fg_tensor *const *inputs;
    int n_inputs;
    fg_gradcheck_options o;
    fg_gradcheck_report *rep;
    int nt;               /* inputs that require grad */
    int tidx[64];         /* their indices into inputs[] */
    fg_tensor *targets[64];
    int64_t n_out;
    int out_nd;
    int64_t out_shape[FG_MAX_DIMS];
    fg_dtype out_dt;
    fg_device out_dev;
} gc;

static void *xcalloc(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

/* fn(inputs) -> host doubles; checks the output's shape stays put. */
/* Keeps the function's own message. */
static fg_status fn_failed(fg_status s)
{
    char msg[400];
    snprintf(msg, sizeof msg, "%s", fg_last_error());
    return fg_error(s, "fg_gradcheck: the function failed (%s): %s",
                    fg_status_string(s), msg);
}

static fg_status eval(gc *g, double *y)
{
    fg_tensor *out = NULL;
    fg_clear_error(); /* a function that fails silently leaves "" */
    fg_status s = g->fn(g->inputs, g->n_inputs, &out, g->user);
    if (s != FG_OK) {
        fg_tensor_free(out);
        return fn_failed(s);
    }
    if (!out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "the function returned NULL");
    if (!fg_same_shape(out->nd, out->shape, g->out_nd, g->out_shape)) {
        fg_tensor_free(out);
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "the function's output shape changed between calls");
    }
    s = fg_tensor_copy_to_host(out, FG_FP64, y, g->n_out);
    fg_tensor_free(out);
    return s;
}

/* Records entry (a, n) of input t, in element j, out element k. */
static void judge(gc *g, int t, int64_t j, int64_t k, double a, double n)
{
    fg_gradcheck_report *r = g->rep;
    double err = fabs(a - n), tol = g->o.atol + g->o.rtol * fabs(n);
    double ratio = (isnan(a) || isnan(n)) ? INFINITY : err / tol;
    r->n_checked++;
    if (!(ratio <= 1.0))
        r->n_failed++;
    if (err > r->max_abs_err || isnan(err))
        r->max_abs_err = isnan(err) ? INFINITY : err;
    if (r->worst_input < 0 || ratio > r->worst_ratio) {
        r->worst_ratio = ratio;
        r->worst_input = g->tidx[t];
        r->worst_in_elem = j;
        r->worst_out_elem = k;
        r->worst_analytical = a;
        r->worst_numerical = n;
    }
}

/* Vector-Jacobian product for seed v (host, n_out) into host rows[t]. */
static fg_status vjp(gc *g, fg_tensor *y0, const double *v, double **rows)
{
    fg_tensor *seed, *grads[64] = {0};
    FG_TRY(fg_tensor_new(NULL, g->out_dt, g->out_dev, g->out_nd,
                         g->out_shape, &seed));
    fg_status s = FG_OK;
    fg_no_grad_begin();
    s = fg_tensor_copy_from_host(seed, FG_FP64, v, g->n_out);
    fg_no_grad_end();
    if (s == FG_OK)
        s = fg_grad(y0, seed, g->targets, g->nt, grads,
                    FG_BACKWARD_RETAIN_GRAPH);
    for (int t = 0; t < g->nt; t++) {
        int64_t n = g->targets[t]->numel;
        if (s == FG_OK && grads[t])
            s = fg_tensor_copy_to_host(grads[t], FG_FP64, rows[t], n);
        else if (s == FG_OK)
            memset(rows[t], 0, sizeof(double) * (size_t)n);
        fg_tensor_free(grads[t]);
    }
    fg_tensor_free(seed);
    return s;
}

/* Element j of a checked input (fp32 or fp64), read and written as a
 * double. Host tensors go through their host pointer; CUDA tensors through
 * a one-element copy to or from the element's device address (the copies
 * run on the context stream, so they are ordered with the function's
 * kernels). A conversion to fp32 rounds the same way on both paths. */
static fg_status set_elem(fg_tensor *x, int64_t j, double v)
{
    if (x->device == FG_DEVICE_CPU) {
        fg_store_elem(fg_tensor_elem_ptr(x, j), x->dtype, v);
        return FG_OK;
    }
#ifdef FG_HAVE_CUDA
    union { double d; float f; } buf;
    size_t sz = fg_dtype_size(x->dtype);
    if (x->dtype == FG_FP64)
        buf.d = v;
    else
        buf.f = (float)v;
    return fg_cuda_memcpy_h2d(fg_tensor_elem_ptr(x, j), &buf, sz);
#else
    (void)v;
    return FG_FAIL(FG_ERR_UNSUPPORTED, "input on %s",
                   fg_device_name(x->device));
#endif
}

static fg_status get_elem(fg_tensor *x, int64_t j, double *v)
{
    if (x->device == FG_DEVICE_CPU) {
        *v = fg_load_elem(fg_tensor_elem_ptr(x, j), x->dtype);
        return FG_OK;
    }
#ifdef FG_HAVE_CUDA
    union { double d; float f; } buf;
    FG_TRY(fg_cuda_memcpy_d2h(&buf, fg_tensor_elem_ptr(x, j),
                              fg_dtype_size(x->dtype)));
    *v = x->dtype == FG_FP64 ? buf.d : (double)buf.f;
    return FG_OK;
#else
    return FG_FAIL(FG_ERR_UNSUPPORTED, "input on %s",
                   fg_device_name(x->device));
#endif
}

/* All n elements of x (row-major) from / to host doubles. On the GPU one
 * bulk copy instead of n one-element ones (fast mode perturbs everything).
 * Runs under no_grad, after the graph of y0 was freed, so the write is
 * allowed and the version bump it makes is harmless. */
static fg_status set_all(fg_tensor *x, const double *v)
{
    if (x->device != FG_DEVICE_CPU)
        return fg_tensor_copy_from_host(x, FG_FP64, v, x->numel);
    for (int64_t j = 0; j < x->numel; j++)
        fg_store_elem(fg_tensor_elem_ptr(x, j), x->dtype, v[j]);
    return FG_OK;
}

static fg_status get_all(fg_tensor *x, double *v)
{
    if (x->device != FG_DEVICE_CPU)
        return fg_tensor_copy_to_host(x, FG_FP64, v, x->numel);
    for (int64_t j = 0; j < x->numel; j++)
        v[j] = fg_load_elem(fg_tensor_elem_ptr(x, j), x->dtype);
    return FG_OK;
}

static fg_status full_check(gc *g, fg_tensor *y0)
{
    const int64_t m = g->n_out;
    double **ja = xcalloc((size_t)g->nt, sizeof *ja);
    double **rows = xcalloc((size_t)g->nt, sizeof *rows);
    double **again = xcalloc((size_t)g->nt, sizeof *again);
    double *v = xcalloc((size_t)m, sizeof *v);
    double *yp = xcalloc((size_t)m, sizeof *yp),
           *ym = xcalloc((size_t)m, sizeof *ym);
    fg_status s = (ja && rows && again && v && yp && ym)
                      ? FG_OK
                      : FG_FAIL(FG_ERR_OUT_OF_MEMORY, "gradcheck buffers");
    for (int t = 0; t < g->nt && s == FG_OK; t++) {
        size_t n = (size_t)g->targets[t]->numel;
        ja[t] = xcalloc((size_t)m * n, sizeof(double));
        rows[t] = xcalloc(n, sizeof(double));
        again[t] = xcalloc(n, sizeof(double));
        if (!ja[t] || !rows[t] || !again[t])
            s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "gradcheck Jacobian");
    }
    /* Analytical: row k of every Jacobian from the VJP with e_k. */
    for (int64_t k = 0; k < m && s == FG_OK; k++) {
        v[k] = 1.0;
        s = vjp(g, y0, v, rows);
        if (s == FG_OK && g->o.check_reentrant) {
            s = vjp(g, y0, v, again);
            for (int t = 0; t < g->nt && s == FG_OK; t++)
                if (memcmp(rows[t], again[t],
                           sizeof(double) * (size_t)g->targets[t]->numel))
                    g->rep->reentrant = 0;
        }
        v[k] = 0.0;
        for (int t = 0; t < g->nt && s == FG_OK; t++) {
            int64_t n = g->targets[t]->numel;
            memcpy(ja[t] + k * n, rows[t], sizeof(double) * (size_t)n);
        }
    }
    if (s == FG_OK)
        fg_graph_free(y0);
    /* Numerical: column j from central differences. */
    fg_no_grad_begin();
    for (int t = 0; t < g->nt && s == FG_OK; t++) {
        fg_tensor *x = g->targets[t];
        const int64_t n = x->numel;
        for (int64_t j = 0; j < n && s == FG_OK; j++) {
            double x0 = 0, xp = 0, xm = 0;
            s = get_elem(x, j, &x0);
            if (s != FG_OK)
                break;
            /* Read back as stored (fp32 rounds x0 +/- eps). */
            s = set_elem(x, j, x0 + g->o.eps);
            if (s == FG_OK)
                s = get_elem(x, j, &xp);
            if (s == FG_OK)
                s = eval(g, yp);
            if (s == FG_OK)
                s = set_elem(x, j, x0 - g->o.eps);
            if (s == FG_OK)
                s = get_elem(x, j, &xm);
            if (s == FG_OK)
                s = eval(g, ym);
            /* Restore even after a failure: the caller's input is intact. */
            fg_status r = set_elem(x, j, x0);
            if (s == FG_OK)
                s = r;
            for (int64_t k = 0; k < m && s == FG_OK; k++)
                judge(g, t, j, k, ja[t][k * n + j], (yp[k] - ym[k]) / (xp - xm));
        }
    }
    fg_no_grad_end();
    for (int t = 0; ja && rows && again && t < g->nt; t++) {
        free(ja[t]);
        free(rows[t]);
        free(again[t]);
    }
    free(ja);
    free(rows);
    free(again);
    free(v);
    free(yp);
    free(ym);
    return s;
}

/* splitmix64 -> [-1, 1) */
static double rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* Fast-mode probe entry: random sign, magnitude in [0.5, 1), so one wrong
 * gradient entry of size e moves its probe by at least e / 2 (uniform
 * entries near zero let a 1e-2 error pass unseen one run in ten). */
static double probe(uint64_t *s)
{
    const double r = rnd(s);
    return r < 0 ? r * 0.5 - 0.5 : r * 0.5 + 0.5;
}

static fg_status fast_check(gc *g, fg_tensor *y0)
{
    const int64_t m = g->n_out;
    uint64_t rs = g->o.seed;
    double *v = xcalloc((size_t)m, sizeof *v);
    double *yp = xcalloc((size_t)m, sizeof *yp),
           *ym = xcalloc((size_t)m, sizeof *ym);
    double **u = xcalloc((size_t)g->nt, sizeof *u),
           **gr = xcalloc((size_t)g->nt, sizeof *gr),
           **gr2 = xcalloc((size_t)g->nt, sizeof *gr2),
           **x0 = xcalloc((size_t)g->nt, sizeof *x0);
    fg_status s = (v && yp && ym && u && gr && gr2 && x0)
                      ? FG_OK
                      : FG_FAIL(FG_ERR_OUT_OF_MEMORY, "gradcheck buffers");
    for (int t = 0; t < g->nt && s == FG_OK; t++) {
        size_t n = (size_t)g->targets[t]->numel;
        u[t] = xcalloc(n, sizeof(double));
        gr[t] = xcalloc(n, sizeof(double));
        gr2[t] = xcalloc(n, sizeof(double));
        x0[t] = xcalloc(n, sizeof(double));
        if (!u[t] || !gr[t] || !gr2[t] || !x0[t])
            s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "gradcheck buffers");
        for (size_t j = 0; s == FG_OK && j < n; j++)
            u[t][j] = probe(&rs);
    }
    for (int64_t k = 0; k < m && s == FG_OK; k++)
        v[k] = probe(&rs);
    if (s == FG_OK)
        s = vjp(g, y0, v, gr);
    if (s == FG_OK && g->o.check_reentrant) {
        s = vjp(g, y0, v, gr2);
        for (int t = 0; t < g->nt && s == FG_OK; t++)
            if (memcmp(gr[t], gr2[t],
                       sizeof(double) * (size_t)g->targets[t]->numel))
                g->rep->reentrant = 0;
    }
    if (s == FG_OK)
        fg_graph_free(y0);
    fg_no_grad_begin();
    for (int t = 0; t < g->nt && s == FG_OK; t++) {
        fg_tensor *x = g->targets[t];
        const int64_t n = x->numel;
        double a = 0, num = 0;
        double *xs = malloc(sizeof(double) * (size_t)(n ? n : 1));
        if (!xs) {
            s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "gradcheck buffers");
            break;
        }
        s = get_all(x, x0[t]);
        if (s != FG_OK) {
            free(xs);
            break;
        }
        for (int64_t j = 0; j < n; j++)
            a += gr[t][j] * u[t][j];
        for (int64_t j = 0; j < n; j++)
            xs[j] = x0[t][j] + g->o.eps * u[t][j];
        s = set_all(x, xs);
        if (s == FG_OK)
            s = eval(g, yp);
        for (int64_t j = 0; j < n; j++)
            xs[j] = x0[t][j] - g->o.eps * u[t][j];
        if (s == FG_OK)
            s = set_all(x, xs);
        if (s == FG_OK)
            s = eval(g, ym);
        free(xs);
        /* Restore from the values read (exact) even after a failure. */
        fg_status r = set_all(x, x0[t]);
        if (s == FG_OK)
            s = r;
        for (int64_t k = 0; k < m; k++)
            num += v[k] * (yp[k] - ym[k]) / (2 * g->o.eps);
        if (s == FG_OK)
            judge(g, t, -1, -1, a, num);
    }
    fg_no_grad_end();
    for (int t = 0; u && gr && gr2 && x0 && t < g->nt; t++) {
        free(u[t]);
        free(gr[t]);
        free(gr2[t]);
        free(x0[t]);
    }
    free(u);
    free(gr);
    free(gr2);
    free(x0);
    free(v);
    free(yp);
    free(ym);
    return s;
}

static void summarise(gc *g)
{
    fg_gradcheck_report *r = g->rep;
    r->passed = r->n_failed == 0 && r->reentrant;
    if (r->passed) {
        snprintf(r->message, sizeof r->message,
                 "ok: %lld %s, max |a - n| = %.3g", (long long)r->n_checked,
                 g->o.fast_mode ? "probes" : "entries", r->max_abs_err);
    } else if (r->n_failed) {
        snprintf(r->message, sizeof r->message,
                 "%lld of %lld %s outside tolerance; worst: input %d "
                 "element %lld, output element %lld: analytical %.10g, "
                 "numerical %.10g (ratio %.3g)%s",
                 (long long)r->n_failed, (long long)r->n_checked,
                 g->o.fast_mode ? "probes" : "entries", r->worst_input,
                 (long long)r->worst_in_elem, (long long)r->worst_out_elem,
                 r->worst_analytical, r->worst_numerical, r->worst_ratio,
                 r->reentrant ? "" : "; backward not reentrant");
    } else {
        snprintf(r->message, sizeof r->message,
                 "backward is not reentrant: two runs with the same "
                 "gradient gave different results");
    }
}

fg_status fg_gradcheck(fg_gradcheck_fn fn, void *user,
                       fg_tensor *const *inputs, int n_inputs,
                       const fg_gradcheck_options *opts,
                       fg_gradcheck_report *report)
{
    if (!fn || !report || !inputs || n_inputs < 1)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "need fn, report and n_inputs >= 1 inputs");
    gc g;
    memset(&g, 0, sizeof g);
    g.fn = fn;
    g.user = user;
    g.inputs = inputs;
    g.n_inputs = n_inputs;
    fg_gradcheck_options_init(&g.o);
    if (opts)
        g.o = *opts;
    /* inf tolerances would pass anything, an inf eps gives NaN */
    if (!(g.o.eps > 0) || !(g.o.atol >= 0) || !(g.o.rtol >= 0) ||
        !isfinite(g.o.eps) || !isfinite(g.o.atol) || !isfinite(g.o.rtol))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "eps must be finite and > 0, atol and rtol finite and "
                       ">= 0 (got %g, %g, %g)",
                       g.o.eps, g.o.atol, g.o.rtol);
    for (int i = 0; i < n_inputs; i++) {
        const fg_tensor *x = inputs[i];
        if (!x)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "input %d is NULL", i);
        if (!x->requires_grad)
            continue;
        if (x->device != FG_DEVICE_CPU && x->device != FG_DEVICE_CUDA)
            return FG_FAIL(FG_ERR_UNSUPPORTED, "input %d is a %s tensor", i,
                           fg_device_name(x->device));
        if (x->dtype != FG_FP64 && !(x->dtype == FG_FP32 && g.o.allow_fp32))
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "input %d is %s: gradcheck needs fp64 (set "
                           "allow_fp32 for fp32 with looser tolerances)",
                           i, fg_dtype_name(x->dtype));
        if (g.nt == 64)
            return FG_FAIL(FG_ERR_UNSUPPORTED, "more than 64 inputs");
        g.tidx[g.nt] = i;
        g.targets[g.nt++] = inputs[i];
    }
    if (g.nt == 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "no input requires grad: nothing to check");
    memset(report, 0, sizeof *report);
    report->worst_input = -1;
    report->worst_in_elem = report->worst_out_elem = -1;
    report->reentrant = 1;
    g.rep = report;

    FG_TRY(fg_arena_push(NULL));
    fg_tensor *y0 = NULL;
    fg_clear_error(); /* a function that fails silently leaves "" */
    fg_status s = fn(inputs, n_inputs, &y0, user);
    if (s != FG_OK) {
        fg_tensor_free(y0);
        y0 = NULL;
        s = fn_failed(s);
    } else if (!y0) {
        s = FG_FAIL(FG_ERR_INVALID_ARGUMENT, "the function returned NULL");
    } else if (y0->device != FG_DEVICE_CPU &&
               y0->device != FG_DEVICE_CUDA) {
        s = FG_FAIL(FG_ERR_UNSUPPORTED, "output on %s",
                    fg_device_name(y0->device));
    } else if (!y0->requires_grad) {
        s = FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                    "the output does not require grad (it does not depend "
                    "on any checked input, or was computed under no_grad)");
    }
    if (s == FG_OK) {
        g.n_out = y0->numel;
        g.out_nd = y0->nd;
        memcpy(g.out_shape, y0->shape, sizeof g.out_shape);
        g.out_dt = y0->dtype;
        g.out_dev = y0->device;
        s = g.o.fast_mode ? fast_check(&g, y0) : full_check(&g, y0);
    }
    fg_tensor_free(y0);
    fg_arena_pop(NULL);
    if (s == FG_OK)
        summarise(&g);
    return s;
}
