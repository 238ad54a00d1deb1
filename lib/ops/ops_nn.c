/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_nn.c - layer normalisation, embedding lookup and dropout. Rows
 * are processed in parallel; sums over rows (weight gradients) run in a
 * fixed order in double, so results do not depend on the thread count.
 * CUDA tensors go to kernels/ops/ops_nn.cu (lib/ops/cuda_ops_nn.h). */
#include "config.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "cuda_ops_nn.h" /* the CUDA entry points, FG_NN_DROPOUT_TAG */
#include "flashgrad/attention.h" /* fg_dropout_threshold */
#include "ops_internal.h"
#include "lib/core/philox.h"
#include "kernels/runtime/profile.h"

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

/* A [C] vector (weight/bias) element, 1/0 when the vector is absent. */
static inline double vec(const fg_tensor *t, int64_t j, double dflt)
{
    if (!t)
        return dflt;
    return ld(fg_tensor_base(t) + (size_t)(j * t->stride[0]) * fg_esize(t->dtype),
              t->dtype);
}

/* The incoming gradient g as a contiguous tensor of dtype dt. */
static fg_status grad_as(fg_tensor *g, fg_dtype dt, fg_arena *dom,
                         fg_tensor **out)
{
    if (g->dtype == dt)
        return fg_contiguous_raw(g, dom, out);
    return fg_copy_raw(g, dt, dom, out);
}

/* ---- layernorm ---------------------------------------------------------- */

/* y's dtype for an x of dtype xt: xt, or one step narrower (the only
 * pairs the kernels take). */
int fg_layernorm_out_ok(fg_dtype xt, fg_dtype yt)
{
    return yt == xt || (xt == FG_FP32 && (yt == FG_BF16 || yt == FG_FP16)) ||
           (xt == FG_FP64 && yt == FG_FP32);
}

typedef struct ln_extra {
    fg_dtype ydt; /* the output's dtype, so the incoming gradient's */
} ln_extra;

/* The CPU backward (x, gc contiguous; gc of dtype gt): rows in parallel
 * for dx, columns in parallel with rows in order for dw / db. */
static void layernorm_cpu_backward(const fg_tensor *x, const fg_tensor *w,
                                   const fg_tensor *mean,
                                   const fg_tensor *rstd, const fg_tensor *gc,
                                   fg_tensor *dx, fg_tensor *dw, fg_tensor *db)
{
    const fg_dtype dt = x->dtype, gt = gc->dtype;
    const size_t es = fg_dtype_size(dt), gs = fg_dtype_size(gt);
    const int64_t C = x->shape[x->nd - 1], R = C ? x->numel / C : 0;
    const char *xb = fg_tensor_base(x), *gb = fg_tensor_base(gc),
               *mb = fg_tensor_base(mean), *rb = fg_tensor_base(rstd);
    if (dx) {
        char *dxb = fg_tensor_base(dx);
#pragma omp parallel for if (R * C > 32768)
        for (int64_t r = 0; r < R; r++) {
            const char *xr = xb + (size_t)(r * C) * es,
                       *gr = gb + (size_t)(r * C) * gs;
            const double mu = ld(mb + (size_t)r * es, dt),
                         rs = ld(rb + (size_t)r * es, dt);
            double s1 = 0, s2 = 0;
            for (int64_t j = 0; j < C; j++) {
                double xh = (ld(xr + (size_t)j * es, dt) - mu) * rs;
                double wg = ld(gr + (size_t)j * gs, gt) * vec(w, j, 1.0);
                s1 += wg;
                s2 += wg * xh;
            }
            s1 /= (double)C;
            s2 /= (double)C;
            char *dr = dxb + (size_t)(r * C) * es;
            for (int64_t j = 0; j < C; j++) {
                double xh = (ld(xr + (size_t)j * es, dt) - mu) * rs;
                double wg = ld(gr + (size_t)j * gs, gt) * vec(w, j, 1.0);
                st(dr + (size_t)j * es, dt, rs * (wg - s1 - xh * s2));
            }
        }
    }
    if (!dw && !db)
        return;
    char *dwb = dw ? fg_tensor_base(dw) : NULL,
         *dbb = db ? fg_tensor_base(db) : NULL;
#pragma omp parallel for if (R * C > 32768)
    for (int64_t j = 0; j < C; j++) {
        double aw = 0, ab = 0;
        for (int64_t r = 0; r < R; r++) {
            double gv = ld(gb + (size_t)(r * C + j) * gs, gt);
            double xh = (ld(xb + (size_t)(r * C + j) * es, dt) -
                         ld(mb + (size_t)r * es, dt)) *
                        ld(rb + (size_t)r * es, dt);
            aw += gv * xh;
            ab += gv;
        }
        if (dwb)
            st(dwb + (size_t)j * es, dt, aw);
        if (dbb)
            st(dbb + (size_t)j * es, dt, ab);
    }
}

/* acc NULL: the plain backward. Otherwise (backward_acc) each non-NULL
 * acc[i] receives input i's gradient added in place: dx by the CUDA kernel
 * itself (the residual stream's fork, one pass instead of a write and an
 * accumulation), the rest through fg_grad_accumulate, the engine's add. */
static fg_status layernorm_backward_impl(fg_node *n, fg_tensor *const *g,
                                         fg_tensor **gin,
                                         fg_tensor *const *acc)
{
    /* saved: x (contiguous), weight (or NULL), mean [R], rstd [R] */
    const fg_tensor *x = fg_node_saved(n, 0), *w = fg_node_saved(n, 1),
                    *mean = fg_node_saved(n, 2), *rstd = fg_node_saved(n, 3);
    const ln_extra *ex = fg_node_extra(n);
    fg_arena *dom = fg_bw_domain();
    fg_tensor *gc, *dx = NULL, *dw = NULL, *db = NULL;
    FG_TRY(grad_as(g[0], ex->ydt, dom, &gc));
    int on_cuda = 0;
#ifdef FG_HAVE_CUDA
    on_cuda = x->device == FG_DEVICE_CUDA;
#endif
    const int dx_in_place = acc && acc[0] && on_cuda;
    fg_status s = FG_OK;
    if (dx_in_place)
        dx = fg_tensor_retain(acc[0]);
    else if (fg_node_needs_grad(n, 0))
        s = fg_tensor_new_like(dom, x, 0, &dx);
    if (s == FG_OK && fg_node_needs_grad(n, 1))
        s = fg_tensor_new_like(dom, w, 0, &dw);
    if (s == FG_OK && fg_node_needs_grad(n, 2)) {
        fg_meta m;
        fg_node_input_meta(n, 2, &m);
        s = fg_tensor_new(dom, m.dtype, m.device, m.nd, m.shape, &db);
    }
#ifdef FG_HAVE_CUDA
    if (s == FG_OK && on_cuda)
        s = fg_cuda_layernorm_backward(x, w, mean, rstd, gc, dx,
                                       dx_in_place ? FG_LN_ACC_DX : 0, dw,
                                       db);
#endif
    if (s == FG_OK && !on_cuda)
        layernorm_cpu_backward(x, w, mean, rstd, gc, dx, dw, db);
    fg_tensor_free(gc);
    fg_tensor *d[3] = {dx, dw, db};
    for (int i = 0; i < 3; i++) {
        if (s == FG_OK && acc && acc[i] && d[i] && !(i == 0 && dx_in_place))
            s = fg_grad_accumulate(acc[i], d[i]);
        if (s != FG_OK || (acc && acc[i])) {
            fg_tensor_free(d[i]);
            d[i] = NULL;
        }
        gin[i] = d[i];
    }
    return s;
}

static fg_status layernorm_backward(fg_node *n, fg_tensor *const *g,
                                    fg_tensor **gin)
{
    return layernorm_backward_impl(n, g, gin, NULL);
}

static fg_status layernorm_backward_acc(fg_node *n, fg_tensor *const *g,
                                        fg_tensor **gin, fg_tensor *const *acc)
{
    return layernorm_backward_impl(n, g, gin, acc);
}

static const fg_op_def layernorm_def = {"LayerNormBackward",
                                        layernorm_backward,
                                        layernorm_backward_acc};

static fg_status check_vec(const char *fn, const fg_tensor *v,
                           const char *name, const fg_tensor *x, int64_t C)
{
    if (!v)
        return FG_OK;
    FG_TRY(fg_op_check(fn, v, name));
    if (v->nd != 1 || v->shape[0] != C || v->dtype != x->dtype ||
        v->device != x->device)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s must be a [%lld] %s tensor on x's device", fn,
                        name, (long long)C, fg_dtype_name(x->dtype));
    return FG_OK;
}

/* The CPU forward: two passes per row in double; mean/rstd stored in x's
 * precision, y rounded once to its dtype. */
static void layernorm_cpu_forward(const fg_tensor *xc, const fg_tensor *weight,
                                  const fg_tensor *bias, double eps,
                                  fg_tensor *y, fg_tensor *mean,
                                  fg_tensor *rstd)
{
    const int64_t C = xc->shape[xc->nd - 1], R = C ? xc->numel / C : 0;
    const fg_dtype dt = xc->dtype, yt = y->dtype;
    const size_t es = fg_dtype_size(dt), ys = fg_dtype_size(yt);
    const char *xb = fg_tensor_base(xc);
    char *yb = fg_tensor_base(y), *mb = fg_tensor_base(mean),
         *rb = fg_tensor_base(rstd);
#pragma omp parallel for if (R * C > 32768)
    for (int64_t r = 0; r < R; r++) {
        const char *xr = xb + (size_t)(r * C) * es;
        double mu = 0, var = 0;
        for (int64_t j = 0; j < C; j++)
            mu += ld(xr + (size_t)j * es, dt);
        mu /= (double)C;
        for (int64_t j = 0; j < C; j++) {
            double d = ld(xr + (size_t)j * es, dt) - mu;
            var += d * d;
        }
        const double rs = 1.0 / sqrt(var / (double)C + eps);
        st(mb + (size_t)r * es, dt, mu);
        st(rb + (size_t)r * es, dt, rs);
        char *yr = yb + (size_t)(r * C) * ys;
        for (int64_t j = 0; j < C; j++)
            st(yr + (size_t)j * ys, yt,
               (ld(xr + (size_t)j * es, dt) - mu) * rs * vec(weight, j, 1.0) +
                   vec(bias, j, 0.0));
    }
}

fg_status fg_layernorm_check(const char *fn, const fg_tensor *x,
                             const fg_tensor *weight, const fg_tensor *bias,
                             double eps, fg_dtype ydt)
{
    FG_TRY(fg_op_check(fn, x, "x"));
    if (x->nd < 1)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: x needs >= 1 dimension",
                        fn);
    if (!fg_layernorm_out_ok(x->dtype, ydt))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: out_dtype %s for a %s x (it must be x's dtype, "
                        "fp16/bf16 for fp32 x, or fp32 for fp64 x)",
                        fn, fg_dtype_name(ydt), fg_dtype_name(x->dtype));
    if ((ydt == FG_FP16 || ydt == FG_BF16) && x->device != FG_DEVICE_CUDA)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: %s output on %s (fp16 and bf16 only on CUDA)",
                        fn, fg_dtype_name(ydt), fg_device_name(x->device));
    const int64_t C = x->shape[x->nd - 1];
    FG_TRY(check_vec(fn, weight, "weight", x, C));
    FG_TRY(check_vec(fn, bias, "bias", x, C));
    if (!(eps > 0) || !isfinite(eps))
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: eps must be > 0, got %g",
                        fn, eps);
    /* rstd = 1 / sqrt(var + eps) is computed and saved in x's dtype (fp32
     * for fp32 x): a constant row has var = 0, and an eps below the
     * smallest normal number makes its rstd inf (or 0 * inf = NaN in the
     * backward). */
    const double eps_min = x->dtype == FG_FP64 ? DBL_MIN : FLT_MIN;
    if (eps < eps_min)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: eps %g is below the smallest normal %s number "
                        "(%g)",
                        fn, eps, x->dtype == FG_FP64 ? "fp64" : "fp32",
                        eps_min);
    return FG_OK;
}

static fg_status fg_layernorm_impl(const char *fn, fg_tensor *x,
                                   fg_tensor *weight, fg_tensor *bias,
                                   double eps, int out_dtype, fg_tensor **out)
{
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    const fg_dtype ydt = out_dtype < 0 ? x->dtype : (fg_dtype)out_dtype;
    FG_TRY(fg_layernorm_check(fn, x, weight, bias, eps, ydt));
    const int64_t C = x->shape[x->nd - 1];
    int on_cuda = 0; /* the per-device dispatch point */
#ifdef FG_HAVE_CUDA
    on_cuda = x->device == FG_DEVICE_CUDA;
#endif
    if (x->device != FG_DEVICE_CPU && !on_cuda)
        return fg_op_unsupported(fn, x->device);
    fg_tensor *in[3] = {x, weight, bias};
    fg_arena *dom = fg_alloc_domain(in, 3);
    const int64_t R = C ? x->numel / C : 0;
    fg_tensor *xc, *y = NULL, *mean = NULL, *rstd = NULL;
    FG_TRY(fg_contiguous_raw(x, dom, &xc));
    /* mean/rstd: fp32 for fp16/bf16 x on CUDA, else x's dtype */
    fg_dtype sdt = x->dtype;
#ifdef FG_HAVE_CUDA
    if (on_cuda)
        sdt = fg_cuda_nn_stat_dtype(x->dtype);
#endif
    fg_status s = fg_tensor_new(dom, ydt, x->device, x->nd, x->shape, &y);
    if (s == FG_OK)
        s = fg_tensor_new(dom, sdt, x->device, 1, &R, &mean);
    if (s == FG_OK)
        s = fg_tensor_new(dom, sdt, x->device, 1, &R, &rstd);
#ifdef FG_HAVE_CUDA
    if (s == FG_OK && on_cuda)
        s = fg_cuda_layernorm_forward(xc, weight, bias, eps, y, mean, rstd);
#endif
    if (s != FG_OK) {
        fg_tensor_free(xc);
        fg_tensor_free(y);
        fg_tensor_free(mean);
        fg_tensor_free(rstd);
        return s;
    }
    if (!on_cuda)
        layernorm_cpu_forward(xc, weight, bias, eps, y, mean, rstd);

    /* The stored mean/rstd are what the backward uses, in x's precision;
     * the backward's xhat is recomputed from them, consistently. */
    s = FG_OK;
    if (fg_ag_should_record(in, 3)) {
        fg_tensor *saved[4] = {xc, weight, mean, rstd};
        const ln_extra ex = {ydt};
        s = fg_ag_record(&layernorm_def, in, 3, &y, 1, saved, 4, &ex,
                         sizeof ex, NULL);
    }
    fg_tensor_free(xc);
    fg_tensor_free(mean);
    fg_tensor_free(rstd);
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    *out = y;
    return FG_OK;
}

fg_status fg_layernorm(fg_tensor *x, fg_tensor *weight, fg_tensor *bias,
                       double eps, fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_LAYERNORM,
                   fg_layernorm_impl("fg_layernorm", x, weight, bias, eps, -1,
                                     out));
}

fg_status fg_layernorm_cast(fg_tensor *x, fg_tensor *weight, fg_tensor *bias,
                            double eps, fg_dtype out_dtype, fg_tensor **out)
{
    /* A negative out_dtype means x's dtype to fg_layernorm_impl (how
     * fg_layernorm calls it); here it is as invalid as any other value. */
    if ((int)out_dtype < 0) {
        FG_TRY(fg_op_check_out("fg_layernorm_cast", out));
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "fg_layernorm_cast: out_dtype %d is not a dtype",
                        (int)out_dtype);
    }
    FG_PROF_RETURN(FG_PROF_LAYERNORM,
                   fg_layernorm_impl("fg_layernorm_cast", x, weight, bias, eps,
                                     (int)out_dtype, out));
}

/* ---- embedding -------------------------------------------------------- */

typedef struct emb_extra {
    int64_t n;
    int64_t idx[]; /* n */
} emb_extra;

static fg_status embedding_backward(fg_node *n, fg_tensor *const *g,
                                    fg_tensor **gin)
{
    const emb_extra *ex = fg_node_extra(n);
    fg_meta m;
    fg_node_input_meta(n, 0, &m);
    fg_arena *dom = fg_bw_domain();
    fg_tensor *gc, *dw = NULL;
    FG_TRY(grad_as(g[0], m.dtype, dom, &gc));
    fg_status s = fg_tensor_new(dom, m.dtype, m.device, 2, m.shape, &dw);
#ifdef FG_HAVE_CUDA
    if (s == FG_OK && m.device == FG_DEVICE_CUDA) {
        /* deterministic: a host-built CSR, rows summed in position order */
        s = fg_cuda_embedding_backward(gc, ex->idx, ex->n, dw);
        fg_tensor_free(gc);
        if (s != FG_OK) {
            fg_tensor_free(dw);
            return s;
        }
        gin[0] = dw;
        return FG_OK;
    }
#endif
    if (s == FG_OK)
        s = fg_tensor_zero_storage(dw);
    if (s != FG_OK) {
        fg_tensor_free(gc);
        fg_tensor_free(dw);
        return s;
    }
    const int64_t C = m.shape[1];
    const char *gb = fg_tensor_base(gc);
    char *wb = fg_tensor_base(dw);
    const fg_dtype dt = m.dtype;
    const size_t es = fg_dtype_size(dt);
    /* Scatter-add in index order (repeated indices sum deterministically). */
    for (int64_t i = 0; i < ex->n; i++) {
        char *wr = wb + (size_t)(ex->idx[i] * C) * es;
        const char *gr = gb + (size_t)(i * C) * es;
        if (dt == FG_FP32)
            for (int64_t j = 0; j < C; j++)
                ((float *)wr)[j] += ((const float *)gr)[j];
        else
            for (int64_t j = 0; j < C; j++)
                ((double *)wr)[j] += ((const double *)gr)[j];
    }
    fg_tensor_free(gc);
    gin[0] = dw;
    return FG_OK;
}

static const fg_op_def embedding_def = {"EmbeddingBackward",
                                        embedding_backward, NULL};

/* The CPU gather: y[i, :] = weight[indices[i], :]. */
static void embedding_cpu_forward(const fg_tensor *weight,
                                  const int64_t *indices, int64_t n,
                                  fg_tensor *y)
{
    const int64_t C = weight->shape[1];
    const size_t es = fg_dtype_size(weight->dtype);
    const char *wb = fg_tensor_base(weight);
    char *yb = fg_tensor_base(y);
#pragma omp parallel for if (n * C > 32768)
    for (int64_t i = 0; i < n; i++) {
        const char *wr = wb + (size_t)(indices[i] * weight->stride[0]) * es;
        char *yr = yb + (size_t)(i * C) * es;
        if (weight->stride[1] == 1)
            memcpy(yr, wr, (size_t)C * es);
        else
            for (int64_t j = 0; j < C; j++)
                memcpy(yr + (size_t)j * es,
                       wr + (size_t)(j * weight->stride[1]) * es, es);
    }
}

static fg_status fg_embedding_impl(fg_tensor *weight, const int64_t *indices,
                                   int nd,
                                   const int64_t *shape, fg_tensor **out)
{
    static const char fn[] = "fg_embedding";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, weight, "weight"));
    if (weight->nd != 2)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "weight must be [V, C]");
    int64_t n;
    FG_TRY(fg_check_shape(nd, shape, &n, fn));
    if (nd + 1 > FG_MAX_DIMS)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "indices have too many "
                                                "dimensions");
    if (n > 0 && !indices)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "indices is NULL");
    const int64_t V = weight->shape[0], C = weight->shape[1];
    for (int64_t i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= V)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "index %lld at position %lld is not in [0, %lld)",
                           (long long)indices[i], (long long)i, (long long)V);
    int on_cuda = 0; /* the per-device dispatch point */
#ifdef FG_HAVE_CUDA
    on_cuda = weight->device == FG_DEVICE_CUDA;
#endif
    if (weight->device != FG_DEVICE_CPU && !on_cuda)
        return fg_op_unsupported(fn, weight->device);
    int64_t oshape[FG_MAX_DIMS];
    if (nd) /* shape may be NULL for 0-d indices */
        memcpy(oshape, shape, sizeof(int64_t) * (size_t)nd);
    oshape[nd] = C;
    fg_arena *dom = fg_alloc_domain(&weight, 1);
    fg_tensor *y;
    FG_TRY(fg_tensor_new(dom, weight->dtype, weight->device, nd + 1, oshape,
                         &y));
    if (on_cuda) {
#ifdef FG_HAVE_CUDA
        fg_status cs = fg_cuda_embedding_forward(weight, indices, n, y);
        if (cs != FG_OK) {
            fg_tensor_free(y);
            return cs;
        }
#endif
    } else {
        embedding_cpu_forward(weight, indices, n, y);
    }
    fg_status s = FG_OK;
    if (fg_ag_should_record(&weight, 1)) {
        size_t bytes = sizeof(emb_extra) + sizeof(int64_t) * (size_t)n;
        emb_extra *ex = fg_mem_alloc(dom, bytes);
        if (!ex) {
            s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "scratch");
        } else {
            ex->n = n;
            if (n)
                memcpy(ex->idx, indices, sizeof(int64_t) * (size_t)n);
            s = fg_ag_record(&embedding_def, &weight, 1, &y, 1, NULL, 0, ex,
                             bytes, NULL);
            fg_mem_free(dom, ex, bytes);
        }
    }
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    *out = y;
    return FG_OK;
}

fg_status fg_embedding(fg_tensor *weight, const int64_t *indices, int nd,
                       const int64_t *shape, fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_OTHER,
                   fg_embedding_impl(weight, indices, nd, shape, out));
}

/* ---- dropout ---------------------------------------------------------- */

#define DROP_TAG FG_NN_DROPOUT_TAG /* "DROP", shared with the CUDA kernel */

typedef struct drop_extra {
    double p;
    uint64_t seed, offset;
} drop_extra;

/* dst[e] = src[e] * keep(e) / (1 - p) over contiguous buffers. */
static void dropout_apply(const drop_extra *ex, fg_dtype dt, const char *src,
                          char *dst, int64_t n)
{
    const uint32_t thr = fg_dropout_threshold(ex->p);
    const double scale = 1.0 / (1.0 - ex->p);
    const fg_u32x2 key = {(uint32_t)ex->seed, (uint32_t)(ex->seed >> 32) ^
                                                  (uint32_t)(ex->offset >> 32)};
    const size_t es = fg_dtype_size(dt);
#pragma omp parallel for if (n > 65536)
    for (int64_t b = 0; b < (n + 3) / 4; b++) {
        fg_u32x4 c = {(uint32_t)b, (uint32_t)((uint64_t)b >> 32), DROP_TAG,
                      (uint32_t)ex->offset};
        fg_u32x4 r = fg_philox4x32_10(c, key);
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
        for (int k = 0; k < 4 && 4 * b + k < n; k++) {
            const size_t o = (size_t)(4 * b + k) * es;
            /* times 0, not a literal 0: NaN and inf stay NaN (PyTorch's
             * x * mask * scale) */
            double v = ld(src + o, dt) * ((w[k] >> 8) < thr ? scale : 0.0);
            st(dst + o, dt, v);
        }
    }
}

static fg_status dropout_backward(fg_node *n, fg_tensor *const *g,
                                  fg_tensor **gin)
{
    const drop_extra *ex = fg_node_extra(n);
    fg_arena *dom = fg_bw_domain();
    fg_tensor *gc, *dx = NULL;
    FG_TRY(fg_contiguous_raw(g[0], dom, &gc));
    fg_status s = fg_tensor_new_like(dom, gc, 0, &dx);
    int on_cuda = 0;
#ifdef FG_HAVE_CUDA
    on_cuda = gc->device == FG_DEVICE_CUDA;
    if (s == FG_OK && on_cuda)
        s = fg_cuda_dropout(gc, dx, ex->p, ex->seed, ex->offset);
#endif
    if (s == FG_OK && !on_cuda)
        dropout_apply(ex, gc->dtype, fg_tensor_base(gc), fg_tensor_base(dx),
                      gc->numel);
    if (s != FG_OK) {
        fg_tensor_free(dx);
        dx = NULL;
    }
    fg_tensor_free(gc);
    gin[0] = dx;
    return s;
}

static const fg_op_def dropout_def = {"DropoutBackward", dropout_backward, NULL};

static fg_status fg_dropout_impl(fg_tensor *x, double p, uint64_t seed,
                                 uint64_t offset,
                                 fg_tensor **out)
{
    static const char fn[] = "fg_dropout";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    if (!(p >= 0.0 && p < 1.0))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "p must be in [0, 1), got %g",
                       p);
    int on_cuda = 0; /* the per-device dispatch point */
#ifdef FG_HAVE_CUDA
    on_cuda = x->device == FG_DEVICE_CUDA;
#endif
    if (x->device != FG_DEVICE_CPU && !on_cuda)
        return fg_op_unsupported(fn, x->device);
    fg_arena *dom = fg_alloc_domain(&x, 1);
    fg_tensor *xc, *y = NULL;
    FG_TRY(fg_contiguous_raw(x, dom, &xc));
    fg_status s = fg_tensor_new_like(dom, x, 0, &y);
    drop_extra ex = {p, seed, offset};
#ifdef FG_HAVE_CUDA
    if (s == FG_OK && on_cuda)
        s = fg_cuda_dropout(xc, y, p, seed, offset);
#endif
    if (s == FG_OK && !on_cuda)
        dropout_apply(&ex, x->dtype, fg_tensor_base(xc), fg_tensor_base(y),
                      x->numel);
    fg_tensor_free(xc);
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    FG_TRY(fg_op_finish(&dropout_def, &x, 1, &y, 1, NULL, 0, &ex, sizeof ex));
    *out = y;
    return FG_OK;
}

fg_status fg_dropout(fg_tensor *x, double p, uint64_t seed, uint64_t offset,
                     fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_OTHER, fg_dropout_impl(x, p, seed, offset, out));
}
