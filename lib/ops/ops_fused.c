/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_fused.c - fused ops that replace chains of small kernels in
 * the GPT step: fg_dropout_add (a branch's dropout, its cast into the
 * residual stream's dtype and the residual add; one kernel forward, one
 * backward) and fg_dropout_add_layernorm (that join and the layernorm of
 * its result, which the GPT's next sublayer reads: one kernel each way
 * instead of two). Results equal the unfused chain's bit for bit: every
 * rounding of the chain is kept. CUDA tensors go to kernels/ops/ops_nn.cu
 * and ops_layernorm.cu. */
#include "config.h"

#include "cuda_ops_nn.h" /* the CUDA entry points, FG_NN_DROPOUT_TAG */
#include "flashgrad/attention.h" /* fg_dropout_threshold */
#include "ops_internal.h"
#include "lib/core/philox.h"
#include "kernels/runtime/profile.h"

typedef struct dadd_extra {
    double p;
    uint64_t seed, offset;
} dadd_extra;

static inline double ld(const char *p, fg_dtype dt)
{
    return dt == FG_FP32 ? *(const float *)p : *(const double *)p;
}
/* v rounded to dt (fp32 or fp64), as a store would. */
static inline double rnd(double v, fg_dtype dt)
{
    return dt == FG_FP32 ? (double)(float)v : v;
}

/* The CPU kernel (fp32/fp64, contiguous). Forward (x != NULL):
 * y = x + rnd_b(b * (keep ? scale : 0)); backward (x == NULL, b is the
 * incoming gradient g, y is db): db = rnd_b(rnd_b(g) * (keep ? scale : 0))
 * (times 0, so a NaN or inf in b stays NaN, as in PyTorch).
 * rnd_b rounds to the branch's dtype, as the unfused cast and dropout did.
 * The mask is fg_dropout's. */
static void dadd_cpu(const dadd_extra *ex, const char *x, fg_dtype xt,
                     const char *b, fg_dtype bt, char *y, fg_dtype yt,
                     int64_t n)
{
    const uint32_t thr = fg_dropout_threshold(ex->p);
    const double scale = 1.0 / (1.0 - ex->p);
    const fg_u32x2 key = {(uint32_t)ex->seed, (uint32_t)(ex->seed >> 32) ^
                                                  (uint32_t)(ex->offset >> 32)};
    const size_t xs = fg_dtype_size(xt), bs = fg_dtype_size(bt);
    const fg_dtype vt = x ? bt : yt; /* the branch's dtype */
#pragma omp parallel for if (n > 65536)
    for (int64_t g = 0; g < (n + 3) / 4; g++) {
        fg_u32x4 c = {(uint32_t)g, (uint32_t)((uint64_t)g >> 32),
                      FG_NN_DROPOUT_TAG, (uint32_t)ex->offset};
        fg_u32x4 r = fg_philox4x32_10(c, key);
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
        for (int k = 0; k < 4 && 4 * g + k < n; k++) {
            const int64_t e = 4 * g + k;
            const double bv = rnd(ld(b + (size_t)e * bs, bt), vt);
            const double v = rnd(bv * ((w[k] >> 8) < thr ? scale : 0.0), vt);
            const double out = x ? ld(x + (size_t)e * xs, xt) + v : v;
            if (yt == FG_FP32)
                ((float *)y)[e] = (float)out;
            else
                ((double *)y)[e] = out;
        }
    }
}

/* db of the branch: the mask applied to the incoming gradient, in b's dtype;
 * dx is the incoming gradient itself (no kernel). */
static fg_status dadd_backward(fg_node *n, fg_tensor *const *g,
                               fg_tensor **gin)
{
    const dadd_extra *ex = fg_node_extra(n);
    if (fg_node_needs_grad(n, 0))
        gin[0] = fg_tensor_retain(g[0]);
    if (!fg_node_needs_grad(n, 1))
        return FG_OK;
    fg_meta m;
    fg_node_input_meta(n, 1, &m);
    fg_arena *dom = fg_bw_domain();
    fg_tensor *gc, *db = NULL;
    FG_TRY(fg_contiguous_raw(g[0], dom, &gc));
    fg_status s = fg_tensor_new(dom, m.dtype, m.device, m.nd, m.shape, &db);
    int on_cuda = 0;
#ifdef FG_HAVE_CUDA
    on_cuda = gc->device == FG_DEVICE_CUDA;
    if (s == FG_OK && on_cuda)
        s = fg_cuda_dropout_add(NULL, gc, db, ex->p, ex->seed, ex->offset);
#endif
    if (s == FG_OK && !on_cuda)
        dadd_cpu(ex, NULL, gc->dtype, fg_tensor_base(gc), gc->dtype,
                 fg_tensor_base(db), db->dtype, gc->numel);
    fg_tensor_free(gc);
    if (s != FG_OK) {
        fg_tensor_free(db);
        db = NULL;
    }
    gin[1] = db;
    return s;
}

static const fg_op_def dadd_def = {"DropoutAddBackward", dadd_backward, NULL};

static fg_status check_dadd(const char *fn, const fg_tensor *x,
                            const fg_tensor *b, double p)
{
    FG_TRY(fg_op_check(fn, x, "x"));
    FG_TRY(fg_op_check(fn, b, "b"));
    if (x->device != b->device)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: device mismatch (x on %s, b on %s)", fn,
                        fg_device_name(x->device), fg_device_name(b->device));
    if (b->dtype != x->dtype &&
        !(x->dtype == FG_FP32 && (b->dtype == FG_BF16 || b->dtype == FG_FP16)))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: b is %s, x is %s (b must have x's dtype, or be "
                        "fp16/bf16 with an fp32 x)",
                        fn, fg_dtype_name(b->dtype), fg_dtype_name(x->dtype));
    if (!fg_same_shape(x->nd, x->shape, b->nd, b->shape)) {
        char sx[96], sb[96];
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: x %s and b %s differ in shape (no broadcasting)",
                        fn, fg_fmt_shape(sx, sizeof sx, x->nd, x->shape),
                        fg_fmt_shape(sb, sizeof sb, b->nd, b->shape));
    }
    if (!(p >= 0.0 && p < 1.0))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: p must be in [0, 1), got %g", fn, p);
    return FG_OK;
}

static fg_status fg_dropout_add_impl(fg_tensor *x, fg_tensor *b, double p,
                                     uint64_t seed, uint64_t offset,
                                     fg_tensor **out)
{
    static const char fn[] = "fg_dropout_add";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(check_dadd(fn, x, b, p));
    int on_cuda = 0; /* the per-device dispatch point */
#ifdef FG_HAVE_CUDA
    on_cuda = x->device == FG_DEVICE_CUDA;
#endif
    if (x->device != FG_DEVICE_CPU && !on_cuda)
        return fg_op_unsupported(fn, x->device);
    fg_tensor *in[2] = {x, b};
    fg_arena *dom = fg_alloc_domain(in, 2);
    fg_tensor *xc = NULL, *bc = NULL, *y = NULL;
    fg_status s = fg_contiguous_raw(x, dom, &xc);
    if (s == FG_OK)
        s = fg_contiguous_raw(b, dom, &bc);
    if (s == FG_OK)
        s = fg_tensor_new_like(dom, x, 0, &y);
    const dadd_extra ex = {p, seed, offset};
#ifdef FG_HAVE_CUDA
    if (s == FG_OK && on_cuda)
        s = fg_cuda_dropout_add(xc, bc, y, p, seed, offset);
#endif
    if (s == FG_OK && !on_cuda)
        dadd_cpu(&ex, fg_tensor_base(xc), xc->dtype, fg_tensor_base(bc),
                 bc->dtype, fg_tensor_base(y), y->dtype, y->numel);
    fg_tensor_free(xc);
    fg_tensor_free(bc);
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    FG_TRY(fg_op_finish(&dadd_def, in, 2, &y, 1, NULL, 0, &ex, sizeof ex));
    *out = y;
    return FG_OK;
}

fg_status fg_dropout_add(fg_tensor *x, fg_tensor *b, double p, uint64_t seed,
                         uint64_t offset, fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_OTHER,
                   fg_dropout_add_impl(x, b, p, seed, offset, out));
}

/* ---- fg_dropout_add_layernorm ------------------------------------------- */

#ifdef FG_HAVE_CUDA
typedef struct dal_extra {
    dadd_extra dadd;
    fg_dtype bt; /* b's dtype (an input without grad has no meta) */
} dal_extra;

/* The fused node exists only on CUDA (the CPU runs the two ops).
 * saved: y = x + dropout(b), weight (or NULL), mean, rstd (fp32 [R]).
 * y's total gradient dx = g_y + the layernorm's (in place in g_y when
 * nobody else holds it, as the engine would sum them), then b's from dx:
 * one kernel where it applies, else the two ops' kernels in turn. acc:
 * NULL, or the engine's targets (fg_backward_acc_fn); the layernorm's dw
 * and dbias go straight into theirs when every wanted one has one, any
 * other target gets its gradient added after. */
static fg_status dal_grads(fg_node *n, fg_tensor *const *g, fg_tensor **gin,
                           fg_tensor *const *acc)
{
    const dal_extra *dex = fg_node_extra(n);
    const dadd_extra *ex = &dex->dadd;
    const fg_tensor *y = fg_node_saved(n, 0), *w = fg_node_saved(n, 1),
                    *mean = fg_node_saved(n, 2), *rstd = fg_node_saved(n, 3);
    fg_arena *dom = fg_bw_domain();
    fg_tensor *dx = NULL, *gh = NULL, *db = NULL, *dw = NULL, *dbias = NULL;
    fg_status s = FG_OK;
    const int need_w = fg_node_needs_grad(n, 2),
              need_b = fg_node_needs_grad(n, 3);
    const int cols_acc = acc && (acc[2] || acc[3]) && (!need_w || acc[2]) &&
                         (!need_b || acc[3]);
    const int flags = (g[0] ? FG_LN_ACC_DX : 0) |
                      (cols_acc ? FG_LN_ACC_COLS : 0);
    if (g[0] && fg_grad_exclusive(g[0]) && g[0]->dtype == y->dtype)
        dx = fg_tensor_retain(g[0]);
    else if (g[0])
        s = fg_copy_raw(g[0], y->dtype, dom, &dx);
    else
        s = fg_tensor_new_like(dom, y, 0, &dx);
    if (s == FG_OK) /* the fused kernel writes it even when unwanted */
        s = fg_tensor_new(dom, dex->bt, y->device, y->nd, y->shape, &db);
    if (s == FG_OK && g[1])
        s = fg_contiguous_raw(g[1], dom, &gh);
    if (cols_acc && gh) {
        dw = need_w ? fg_tensor_retain(acc[2]) : NULL;
        dbias = need_b ? fg_tensor_retain(acc[3]) : NULL;
    }
    if (s == FG_OK && gh && need_w && !cols_acc)
        s = fg_tensor_new_like(dom, w, 0, &dw);
    if (s == FG_OK && gh && need_b && !cols_acc) {
        fg_meta m;
        fg_node_input_meta(n, 3, &m);
        s = fg_tensor_new(dom, m.dtype, m.device, m.nd, m.shape, &dbias);
    }
    int done = 0;
    if (s == FG_OK && gh)
        s = fg_cuda_dropout_add_layernorm_backward(
            y, w, mean, rstd, gh, dx, flags, db, ex->p, ex->seed, ex->offset,
            dw, dbias, &done);
    if (s == FG_OK && gh && !done)
        s = fg_cuda_layernorm_backward(y, w, mean, rstd, gh, dx, flags, dw,
                                       dbias);
    if (s == FG_OK && !done)
        s = fg_cuda_dropout_add(NULL, dx, db, ex->p, ex->seed, ex->offset);
    fg_tensor_free(gh);
    fg_tensor *d[4] = {dx, db, dw, dbias};
    for (int i = 0; i < 4; i++) {
        const int in_acc = cols_acc && i >= 2; /* already added */
        if (s == FG_OK && d[i] && acc && acc[i] && !in_acc)
            s = fg_grad_accumulate(acc[i], d[i]);
        if (s != FG_OK || !fg_node_needs_grad(n, i) || (acc && acc[i])) {
            fg_tensor_free(d[i]);
            d[i] = NULL;
        }
        gin[i] = d[i];
    }
    return s;
}

/* the GPT's layernorm parameters get dw / dbias from the column-sum
 * kernel: no temporaries, no fg_grad_accumulate launches */
static const fg_op_def dal_def = {"DropoutAddLayerNormBackward", NULL,
                                  dal_grads};
#endif

/* The two ops, one after the other: the CPU, and CUDA where the fused
 * kernels do not apply. */
static fg_status dal_chain(fg_tensor *x, fg_tensor *b, double p, uint64_t seed,
                           uint64_t offset, fg_tensor *weight,
                           fg_tensor *bias, double eps, fg_dtype out_dtype,
                           fg_tensor **y, fg_tensor **h)
{
    fg_tensor *yy = NULL;
    FG_TRY(fg_dropout_add_impl(x, b, p, seed, offset, &yy));
    fg_status s = fg_layernorm_cast(yy, weight, bias, eps, out_dtype, h);
    if (s != FG_OK) {
        fg_tensor_free(yy);
        return s;
    }
    *y = yy;
    return FG_OK;
}

#ifdef FG_HAVE_CUDA
/* h for the fused kernel: contiguous, or with ones (fg_tensor's ones_col)
 * a [..., C] view of [R, C + FG_ONES_PAD] rows whose padding the kernel
 * writes. */
static fg_status dal_new_h(fg_arena *dom, const fg_tensor *x, fg_dtype dt,
                           int ones, fg_tensor **h)
{
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    static int off = -1; /* FG_LIN_ONES=0: the column sums, for A/B */
    if (!ones || fg_op_env_once(&off, "FG_LIN_ONES", "0") || x->nd < 2 ||
        C % 8 || (dt != FG_BF16 && dt != FG_FP16))
        return fg_tensor_new(dom, dt, x->device, x->nd, x->shape, h);
    const int64_t P = C + FG_ONES_PAD, full[2] = {R, P};
    int64_t st[FG_MAX_DIMS];
    st[x->nd - 1] = 1;
    st[x->nd - 2] = P;
    for (int i = x->nd - 3; i >= 0; i--)
        st[i] = st[i + 1] * x->shape[i + 1];
    fg_tensor *t = NULL;
    FG_TRY(fg_tensor_new(dom, dt, x->device, 2, full, &t));
    fg_status s = fg_tensor_view_new(dom, t, x->nd, x->shape, st, 0, h);
    fg_tensor_free(t);
    if (s == FG_OK)
        (*h)->ones_col = 1;
    return s;
}
#endif

static fg_status dal_impl(fg_tensor *x, fg_tensor *b, double p, uint64_t seed,
                          uint64_t offset, fg_tensor *weight, fg_tensor *bias,
                          double eps, fg_dtype out_dtype, int ones,
                          fg_tensor **y, fg_tensor **h)
{
    static const char fn[] = "fg_dropout_add_layernorm";
    FG_TRY(fg_op_check_out(fn, y));
    FG_TRY(fg_op_check_out(fn, h));
    FG_TRY(check_dadd(fn, x, b, p));
    if ((int)out_dtype < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: out_dtype %d is not a dtype", fn, (int)out_dtype);
    FG_TRY(fg_layernorm_check(fn, x, weight, bias, eps, out_dtype));
#ifdef FG_HAVE_CUDA
    if (x->device == FG_DEVICE_CUDA && x->numel > 0) {
        fg_tensor *in[4] = {x, b, weight, bias};
        fg_arena *dom = fg_alloc_domain(in, 4);
        const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
        fg_tensor *xc = NULL, *bc = NULL, *yy = NULL, *hh = NULL,
                  *mean = NULL, *rstd = NULL;
        fg_status s = fg_contiguous_raw(x, dom, &xc);
        if (s == FG_OK)
            s = fg_contiguous_raw(b, dom, &bc);
        if (s == FG_OK)
            s = fg_tensor_new_like(dom, x, 0, &yy);
        if (s == FG_OK)
            s = dal_new_h(dom, x, out_dtype, ones, &hh);
        if (s == FG_OK)
            s = fg_tensor_new(dom, FG_FP32, x->device, 1, &R, &mean);
        if (s == FG_OK)
            s = fg_tensor_new(dom, FG_FP32, x->device, 1, &R, &rstd);
        int done = 0;
        if (s == FG_OK)
            s = fg_cuda_dropout_add_layernorm_forward(
                xc, bc, p, seed, offset, weight, bias, eps, yy, hh, mean, rstd,
                &done);
        fg_tensor_free(xc);
        fg_tensor_free(bc);
        if (s == FG_OK && done && fg_ag_should_record(in, 4)) {
            fg_tensor *outs[2] = {yy, hh}, *saved[4] = {yy, weight, mean, rstd};
            const dal_extra ex = {{p, seed, offset}, b->dtype};
            s = fg_ag_record(&dal_def, in, 4, outs, 2, saved, 4, &ex,
                             sizeof ex, NULL);
        }
        fg_tensor_free(mean);
        fg_tensor_free(rstd);
        if (s != FG_OK || !done) {
            fg_tensor_free(yy);
            fg_tensor_free(hh);
            if (s != FG_OK)
                return s;
        } else {
            *y = yy;
            *h = hh;
            return FG_OK;
        }
    }
#endif
    (void)ones;
    return dal_chain(x, b, p, seed, offset, weight, bias, eps, out_dtype, y,
                     h);
}

fg_status fg_dropout_add_layernorm(fg_tensor *x, fg_tensor *b, double p,
                                   uint64_t seed, uint64_t offset,
                                   fg_tensor *weight, fg_tensor *bias,
                                   double eps, fg_dtype out_dtype,
                                   fg_tensor **y, fg_tensor **h)
{
    FG_PROF_RETURN(FG_PROF_LAYERNORM,
                   dal_impl(x, b, p, seed, offset, weight, bias, eps,
                            out_dtype, 0, y, h));
}

fg_status fg_dropout_add_layernorm_ones(fg_tensor *x, fg_tensor *b, double p,
                                        uint64_t seed, uint64_t offset,
                                        fg_tensor *weight, fg_tensor *bias,
                                        double eps, fg_dtype out_dtype,
                                        fg_tensor **y, fg_tensor **h)
{
    FG_PROF_RETURN(FG_PROF_LAYERNORM,
                   dal_impl(x, b, p, seed, offset, weight, bias, eps,
                            out_dtype, 1, y, h));
}
