/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_softmax.c - softmax and log-softmax along any dimension, and the
 * fused softmax + cross-entropy loss with integer targets. Row statistics
 * are computed in double on the CPU; CUDA tensors go to kernels/ops/ops_nn.cu
 * (lib/ops/cuda_ops_nn.h). */
#include "config.h"

#include <math.h>
#include <string.h>

#include "ops_internal.h"
#include "kernels/runtime/profile.h"
#ifdef FG_HAVE_CUDA
#include "cuda_ops_nn.h"
#endif

static inline double ld(const char *p, fg_dtype dt)
{
    return dt == FG_FP32 ? *(const float *)p : *(const double *)p;
}
static inline void st(char *p, fg_dtype dt, double v)
{
    if (dt == FG_FP32)
        *(float *)p = (float)v;
    else
        *(double *)p = v;
}

/* ---- softmax / log_softmax ------------------------------------------------ */

typedef struct sm_ctx {
    fg_dtype dt;
    int log;
} sm_ctx;

/* p[0] = out lane, p[1] = x lane */
static void softmax_lane(void *c, char **p, const int64_t *s, int64_t n)
{
    const sm_ctx *sc = c;
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = ld(p[1] + i * s[1], sc->dt);
        mx = v > mx ? v : mx;
    }
    if (mx == -INFINITY)
        mx = 0; /* all -inf: keep exp() finite (yields NaN like 0/0) */
    for (int64_t i = 0; i < n; i++)
        sum += exp(ld(p[1] + i * s[1], sc->dt) - mx);
    const double lse = log(sum);
    for (int64_t i = 0; i < n; i++) {
        double v = ld(p[1] + i * s[1], sc->dt) - mx;
        st(p[0] + i * s[0], sc->dt, sc->log ? v - lse : exp(v) / sum);
    }
}

/* p[0] = dx, p[1] = g, p[2] = y. softmax: dx = y (g - sum g y);
 * log_softmax: dx = g - exp(y) sum g. */
static void softmax_grad_lane(void *c, char **p, const int64_t *s, int64_t n)
{
    const sm_ctx *sc = c;
    double dot = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = ld(p[1] + i * s[1], sc->dt);
        dot += sc->log ? g : g * ld(p[2] + i * s[2], sc->dt);
    }
    for (int64_t i = 0; i < n; i++) {
        double g = ld(p[1] + i * s[1], sc->dt),
               y = ld(p[2] + i * s[2], sc->dt);
        st(p[0] + i * s[0], sc->dt, sc->log ? g - exp(y) * dot : y * (g - dot));
    }
}

typedef struct sm_extra {
    int dim, log;
} sm_extra;

#ifdef FG_HAVE_CUDA
/* The incoming gradient g as a contiguous tensor of dtype dt (the CUDA
 * kernels take contiguous operands of one dtype). */
static fg_status grad_as(fg_tensor *g, fg_dtype dt, fg_arena *dom,
                         fg_tensor **out)
{
    if (g->dtype == dt)
        return fg_contiguous_raw(g, dom, out);
    return fg_copy_raw(g, dt, dom, out);
}
#endif

static fg_status softmax_backward(fg_node *n, fg_tensor *const *g,
                                  fg_tensor **gin)
{
    const sm_extra *ex = fg_node_extra(n);
    const fg_tensor *y = fg_node_saved(n, 0);
    fg_tensor *dx = NULL;
#ifdef FG_HAVE_CUDA
    if (y->device == FG_DEVICE_CUDA) {
        fg_arena *dom = fg_bw_domain();
        fg_tensor *gc;
        FG_TRY(grad_as(g[0], y->dtype, dom, &gc));
        fg_status s = fg_tensor_new_like(dom, y, 0, &dx);
        if (s == FG_OK)
            s = fg_cuda_softmax_backward(gc, y, dx, ex->dim, ex->log);
        fg_tensor_free(gc);
        if (s != FG_OK) {
            fg_tensor_free(dx);
            return s;
        }
        gin[0] = dx;
        return FG_OK;
    }
#endif
    FG_TRY(fg_tensor_new_like(fg_bw_domain(), y, 0, &dx));
    char *base[3] = {fg_tensor_base(dx), fg_tensor_base(g[0]),
                     fg_tensor_base(y)};
    const int64_t *str[3] = {dx->stride, g[0]->stride, y->stride};
    size_t es = fg_dtype_size(y->dtype), ess[3] = {es, es, es};
    sm_ctx sc = {y->dtype, ex->log};
    fg_for_each_lane(y->nd, y->shape, ex->dim, 3, base, str, ess, 1,
                     softmax_grad_lane, &sc);
    gin[0] = dx;
    return FG_OK;
}

static const fg_op_def softmax_def = {"SoftmaxBackward", softmax_backward, NULL};
static const fg_op_def log_softmax_def = {"LogSoftmaxBackward",
                                          softmax_backward, NULL};

static fg_status softmax_op(const char *fn, int log, fg_tensor *x, int dim,
                            fg_tensor **out)
{
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    int d = fg_norm_dim(dim, x->nd);
    if (d < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: dim %d out of range for %d dimensions", fn, dim,
                        x->nd);
    fg_tensor *y = NULL;
#ifdef FG_HAVE_CUDA
    if (x->device == FG_DEVICE_CUDA) { /* the per-device dispatch point */
        fg_arena *dom = fg_alloc_domain(&x, 1);
        fg_tensor *xc;
        FG_TRY(fg_contiguous_raw(x, dom, &xc));
        fg_status s = fg_tensor_new_like(dom, x, 0, &y);
        if (s == FG_OK)
            s = fg_cuda_softmax_forward(xc, y, d, log);
        fg_tensor_free(xc);
        if (s != FG_OK) {
            fg_tensor_free(y);
            return s;
        }
        sm_extra ex = {d, log};
        FG_TRY(fg_op_finish(log ? &log_softmax_def : &softmax_def, &x, 1, &y,
                            1, &y, 1, &ex, sizeof ex));
        *out = y;
        return FG_OK;
    }
#endif
    if (x->device != FG_DEVICE_CPU)
        return fg_op_unsupported(fn, x->device);
    FG_TRY(fg_tensor_new_like(fg_alloc_domain(&x, 1), x, 0, &y));
    char *base[2] = {fg_tensor_base(y), fg_tensor_base(x)};
    const int64_t *str[2] = {y->stride, x->stride};
    size_t es = fg_dtype_size(x->dtype), ess[2] = {es, es};
    sm_ctx sc = {x->dtype, log};
    fg_for_each_lane(x->nd, x->shape, d, 2, base, str, ess, 1, softmax_lane,
                     &sc);
    sm_extra ex = {d, log};
    FG_TRY(fg_op_finish(log ? &log_softmax_def : &softmax_def, &x, 1, &y, 1,
                        &y, 1, &ex, sizeof ex));
    *out = y;
    return FG_OK;
}

fg_status fg_softmax(fg_tensor *x, int dim, fg_tensor **out)
{
    return softmax_op("fg_softmax", 0, x, dim, out);
}

fg_status fg_log_softmax(fg_tensor *x, int dim, fg_tensor **out)
{
    return softmax_op("fg_log_softmax", 1, x, dim, out);
}

/* ---- cross-entropy ---------------------------------------------------------- */

typedef struct ce_extra {
    int64_t rows, classes, count, ignore_index;
    int64_t targets[]; /* rows */
} ce_extra;

static fg_status ce_backward(fg_node *n, fg_tensor *const *g, fg_tensor **gin)
{
    const ce_extra *ex = fg_node_extra(n);
    const fg_tensor *x = fg_node_saved(n, 0), *lse = fg_node_saved(n, 1);
    const fg_dtype dt = x->dtype;
    const size_t es = fg_dtype_size(dt);
    fg_meta m;
    fg_node_input_meta(n, 0, &m);
    fg_tensor *dx = NULL;
    FG_TRY(fg_tensor_new(fg_bw_domain(), dt, m.device, m.nd, m.shape, &dx));
#ifdef FG_HAVE_CUDA
    if (x->device == FG_DEVICE_CUDA) {
        /* g (0-dim, on the device) is read by the kernel: no host sync. */
        fg_status s = fg_cuda_cross_entropy_backward(
            x, lse, ex->targets, ex->ignore_index, ex->count, g[0], dx);
        if (s != FG_OK) {
            fg_tensor_free(dx);
            return s;
        }
        gin[0] = dx;
        return FG_OK;
    }
#endif
    double gv = fg_load_elem(fg_tensor_base(g[0]), g[0]->dtype);
    const double scale = ex->count ? gv / (double)ex->count : 0.0;
    const char *xb = fg_tensor_base(x), *lb = fg_tensor_base(lse);
    char *db = fg_tensor_base(dx);
    const int64_t R = ex->rows, V = ex->classes;
#pragma omp parallel for if (R * V > 32768)
    for (int64_t r = 0; r < R; r++) {
        const int64_t t = ex->targets[r];
        char *drow = db + (size_t)(r * V) * es;
        if (t == ex->ignore_index) {
            memset(drow, 0, (size_t)V * es);
            continue;
        }
        const char *xrow = xb + (size_t)(r * V) * es;
        const double l = ld(lb + (size_t)r * es, dt);
        for (int64_t j = 0; j < V; j++) {
            double pj = exp(ld(xrow + (size_t)j * es, dt) - l);
            st(drow + (size_t)j * es, dt, scale * (pj - (j == t)));
        }
    }
    gin[0] = dx;
    return FG_OK;
}

static const fg_op_def ce_def = {"CrossEntropyBackward", ce_backward, NULL};

/* The CPU forward: row statistics in double, the loss summed in row
 * order (deterministic); frees rowloss (R doubles from dom). */
static void ce_cpu_forward(const fg_tensor *x, fg_tensor *lse, fg_tensor *loss,
                           double *rowloss, const int64_t *targets,
                           int64_t ignore_index, int64_t count, fg_arena *dom)
{
    const int64_t V = x->shape[x->nd - 1], R = x->numel / V;
    const fg_dtype dt = x->dtype;
    const size_t es = fg_dtype_size(dt);
    const char *xb = fg_tensor_base(x);
    char *lb = fg_tensor_base(lse);
#pragma omp parallel for if (R * V > 32768)
    for (int64_t r = 0; r < R; r++) {
        const char *row = xb + (size_t)(r * V) * es;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < V; j++) {
            double v = ld(row + (size_t)j * es, dt);
            mx = v > mx ? v : mx;
        }
        for (int64_t j = 0; j < V; j++)
            sum += exp(ld(row + (size_t)j * es, dt) - mx);
        double l = mx + log(sum);
        st(lb + (size_t)r * es, dt, l);
        const int64_t t = targets[r];
        rowloss[r] = t == ignore_index ? 0.0 : l - ld(row + (size_t)t * es, dt);
    }
    double total = 0; /* summed in row order: deterministic */
    for (int64_t r = 0; r < R; r++)
        total += rowloss[r];
    fg_mem_free(dom, rowloss, sizeof(double) * (size_t)R);
    st(fg_tensor_base(loss), dt, count ? total / (double)count : 0.0);
}

static fg_status fg_cross_entropy_impl(fg_tensor *logits,
                                       const int64_t *targets,
                                       int64_t n_targets, int64_t ignore_index,
                                       fg_tensor **out)
{
    static const char fn[] = "fg_cross_entropy";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, logits, "logits"));
    if (logits->nd < 1 || logits->shape[logits->nd - 1] < 1)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "logits need a last dimension of >= 1 classes");
    const int64_t V = logits->shape[logits->nd - 1], R = logits->numel / V;
    if (n_targets != R)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "%lld targets for %lld rows of logits",
                       (long long)n_targets, (long long)R);
    if (R > 0 && !targets)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "targets is NULL");
    int64_t count = 0;
    for (int64_t r = 0; r < R; r++) {
        if (targets[r] == ignore_index)
            continue;
        if (targets[r] < 0 || targets[r] >= V)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "target %lld of row %lld is not in [0, %lld) nor "
                           "the ignore index %lld",
                           (long long)targets[r], (long long)r, (long long)V,
                           (long long)ignore_index);
        count++;
    }
    int on_cuda = 0;
#ifdef FG_HAVE_CUDA
    on_cuda = logits->device == FG_DEVICE_CUDA;
#endif
    if (logits->device != FG_DEVICE_CPU && !on_cuda)
        return fg_op_unsupported(fn, logits->device);

    fg_arena *dom = fg_alloc_domain(&logits, 1);
    fg_tensor *x, *lse = NULL, *loss = NULL;
    double *rowloss = NULL;
    FG_TRY(fg_contiguous_raw(logits, dom, &x));
    /* lse and loss: fp32 for fp16/bf16 logits on CUDA, else x's dtype */
    fg_dtype sdt = x->dtype;
#ifdef FG_HAVE_CUDA
    if (on_cuda)
        sdt = fg_cuda_nn_stat_dtype(x->dtype);
#endif
    fg_status s = fg_tensor_new(dom, sdt, x->device, 1, &R, &lse);
    if (s == FG_OK)
        s = fg_tensor_new(dom, sdt, x->device, 0, NULL, &loss);
#ifdef FG_HAVE_CUDA
    if (s == FG_OK && on_cuda)
        s = fg_cuda_cross_entropy_forward(x, targets, ignore_index, count, lse,
                                          loss);
#endif
    if (s == FG_OK && !on_cuda &&
        !(rowloss = fg_mem_alloc(dom, sizeof(double) * (size_t)R)))
        s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "scratch");
    if (s != FG_OK) {
        fg_tensor_free(x);
        fg_tensor_free(lse);
        fg_tensor_free(loss);
        return s;
    }
    if (!on_cuda)
        ce_cpu_forward(x, lse, loss, rowloss, targets, ignore_index, count,
                       dom);

    s = FG_OK;
    if (fg_ag_should_record(&logits, 1)) {
        size_t xb_bytes = sizeof(ce_extra) + sizeof(int64_t) * (size_t)R;
        ce_extra *ex = fg_mem_alloc(dom, xb_bytes);
        if (!ex) {
            s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "scratch");
        } else {
            ex->rows = R;
            ex->classes = V;
            ex->count = count;
            ex->ignore_index = ignore_index;
            if (R) /* targets may be NULL with no rows */
                memcpy(ex->targets, targets, sizeof(int64_t) * (size_t)R);
            fg_tensor *saved[2] = {x, lse};
            s = fg_ag_record(&ce_def, &logits, 1, &loss, 1, saved, 2, ex,
                             xb_bytes, NULL);
            fg_mem_free(dom, ex, xb_bytes);
        }
    }
    fg_tensor_free(x);
    fg_tensor_free(lse);
    if (s != FG_OK) {
        fg_tensor_free(loss);
        return s;
    }
    *out = loss;
    return FG_OK;
}

fg_status fg_cross_entropy(fg_tensor *logits, const int64_t *targets,
                           int64_t n_targets, int64_t ignore_index,
                           fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_XENT,
                   fg_cross_entropy_impl(logits, targets, n_targets, ignore_index, out));
}
