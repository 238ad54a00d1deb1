/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_linear.c - the Linear layer's op (fg_linear) and the MLP's
 * body (fg_mlp), each one node whose bias adds, GELU and GELU derivative
 * run in cuBLASLt epilogues on CUDA (kernels/ops/gemm_lt.cu), and whose
 * bias gradients come from a column-sum kernel (fp16 / bf16) or the
 * weight-gradient GEMM's epilogue.
 * Wherever cuBLASLt declines a GEMM (and for fg_mlp on the CPU) that step
 * runs as the unfused ops run it (fg_matmul, fg_add, fg_gelu's kernels and
 * their backwards), so the CPU's bits are theirs. */
#include <string.h>

#include "config.h"

#include "ops_linear_internal.h"
#ifdef FG_HAVE_CUDA
#include "cuda_ops_ew.h"
#endif
#include "kernels/runtime/profile.h"

#ifdef FG_HAVE_CUDA
static int64_t rows(const fg_tensor *t)
{
    return t->numel / t->shape[t->nd - 1];
}
#endif

int64_t fg_lin_ones_pitch(const fg_tensor *x)
{
    if (!x || !x->ones_col || x->nd < 2)
        return 0;
    const int64_t K = x->shape[x->nd - 1], P = K + FG_ONES_PAD;
    if (x->stride[x->nd - 1] != 1 || x->stride[x->nd - 2] != P)
        return 0;
    for (int i = x->nd - 3; i >= 0; i--) /* every row P after the last */
        if (x->stride[i] != x->stride[i + 1] * x->shape[i + 1])
            return 0;
    return P;
}

fg_status fg_lin_lt(fg_lt_epilogue e, const fg_tensor *a, int ta,
                    const fg_tensor *b, int tb, fg_tensor *c,
                    const fg_tensor *bias, fg_tensor *aux, int beta1,
                    int *done)
{
    *done = 0;
#ifdef FG_HAVE_CUDA
    if (c->device != FG_DEVICE_CUDA)
        return FG_OK;
    fg_cuda_lt_gemm q;
    memset(&q, 0, sizeof q);
    q.dt = a->dtype;
    q.c32 = c->dtype == FG_FP32 && a->dtype != FG_FP32;
    q.beta1 = beta1;
    q.M = rows(c);
    q.N = c->shape[c->nd - 1];
    q.K = ta ? rows(a) : a->shape[a->nd - 1];
    q.A = fg_tensor_base(a);
    q.lda = fg_lin_ones_pitch(a);
    q.B = fg_tensor_base(b);
    q.ta = ta;
    q.tb = tb;
    q.C = fg_tensor_base(c);
    q.epilogue = e;
    q.bias = bias ? fg_tensor_base(bias) : NULL;
    q.aux = aux ? fg_tensor_base(aux) : NULL;
    return fg_cuda_gemm_lt(&q, done);
#else
    (void)e, (void)a, (void)ta, (void)b, (void)tb, (void)c, (void)bias;
    (void)aux, (void)beta1;
    return FG_OK;
#endif
}

int fg_lin_col_sums_ok(const fg_tensor *gy, fg_dtype out)
{
#ifdef FG_HAVE_CUDA
    static int keep = -1; /* FG_GEMM_BGRAD=1: the epilogue, as before */
    return !fg_op_env_once(&keep, "FG_GEMM_BGRAD", "1") &&
           gy->device == FG_DEVICE_CUDA &&
           (gy->dtype == FG_BF16 || gy->dtype == FG_FP16) &&
           (out == FG_FP32 || out == gy->dtype) &&
           fg_tensor_is_contiguous(gy) && gy->nd >= 1;
#else
    (void)gy, (void)out;
    return 0;
#endif
}

fg_status fg_lin_col_sums(fg_tensor *db, const fg_tensor *gy, int acc)
{
#ifdef FG_HAVE_CUDA
    return fg_cuda_col_sums(db, gy, acc);
#else
    (void)db, (void)gy, (void)acc;
    return FG_FAIL(FG_ERR_INTERNAL, "built without CUDA");
#endif
}

fg_status fg_lin_new_last(fg_arena *dom, const fg_tensor *t, int64_t n,
                          fg_tensor **out)
{
    int64_t shape[FG_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->nd);
    shape[t->nd - 1] = n;
    return fg_tensor_new(dom, t->dtype, t->device, t->nd, shape, out);
}

static fg_status new_meta(const fg_meta *m, fg_tensor **out)
{
    return fg_tensor_new(fg_bw_domain(), m->dtype, m->device, m->nd,
                         m->shape, out);
}

fg_status fg_lin_affine(fg_arena *dom, fg_tensor *x, fg_tensor *w,
                        fg_tensor *b, fg_tensor **y)
{
    FG_TRY(fg_lin_new_last(dom, x, w->shape[1], y));
    int done = 0;
    fg_status s = fg_lin_lt(FG_LT_BIAS, x, 0, w, 0, *y, b, NULL, 0, &done);
    if (s == FG_OK && !done) {
        s = fg_matmul_raw(x, 0, w, 0, *y, 0);
        fg_tensor *t = *y;
        *y = NULL;
        if (s == FG_OK)
            s = fg_ew_binary_raw(FG_EW_ADD, t, b, dom, y);
        fg_tensor_free(t);
    }
    if (s != FG_OK) {
        fg_tensor_free(*y);
        *y = NULL;
    }
    return s;
}

fg_status fg_lin_grads(fg_tensor *x, fg_tensor *w, fg_tensor *gy,
                              int nx, int nw, int nb, const fg_meta *bm,
                              fg_tensor **dx, fg_tensor **dw, fg_tensor **db)
{
    fg_arena *dom = fg_bw_domain();
    int dx_done = !nx, dw_done = !nw, db_done = !nb;
    fg_status s = FG_OK;
    /* db by the column-sum kernel where it applies, else in dW's epilogue */
    const int sums = nb && fg_lin_col_sums_ok(gy, bm->dtype),
              epi = nb && !sums;
    if (nw && x->device == FG_DEVICE_CUDA) {
        s = fg_tensor_new(dom, w->dtype, w->device, 2, w->shape, dw);
        if (s == FG_OK && epi)
            s = new_meta(bm, db);
        if (s == FG_OK)
            s = fg_lin_lt(epi ? FG_LT_BGRAD_B : FG_LT_DEFAULT, x, 1, gy, 0,
                          *dw, epi ? *db : NULL, NULL, 0, &dw_done);
        db_done = !nb || (epi && dw_done);
    }
    if (s == FG_OK && sums) {
        if (!*db)
            s = new_meta(bm, db);
        if (s == FG_OK)
            s = fg_lin_col_sums(*db, gy, 0);
        db_done = s == FG_OK;
    }
    if (s == FG_OK && nx && x->device == FG_DEVICE_CUDA) {
        s = fg_lin_new_last(dom, gy, w->shape[0], dx);
        if (s == FG_OK)
            s = fg_lin_lt(FG_LT_DEFAULT, gy, 0, w, 1, *dx, NULL, NULL, 0,
                          &dx_done);
    }
    if (s == FG_OK && (!dx_done || !dw_done)) {
        fg_tensor *gx = NULL, *gw = NULL;
        s = fg_matmul_grads(x, 0, w, 0, gy, !dx_done, !dw_done, &gx, &gw);
        if (s == FG_OK && gx) {
            fg_tensor_free(*dx);
            *dx = gx;
        }
        if (s == FG_OK && gw) {
            fg_tensor_free(*dw);
            *dw = gw;
        }
    }
    if (s == FG_OK && !db_done) {
        fg_tensor_free(*db);
        *db = NULL;
        s = fg_sum_to_shape(gy, bm->nd, bm->shape, db);
    }
    return s;
}

void fg_lin_free_grads(fg_tensor **gin, int n)
{
    for (int i = 0; i < n; i++) {
        fg_tensor_free(gin[i]);
        gin[i] = NULL;
    }
}

/* ---- fg_linear ---------------------------------------------------------- */

/* Inputs x, w, b; saved x, w (contiguous, one dtype, on CUDA). */
static fg_status linear_backward(fg_node *n, fg_tensor *const *g,
                                 fg_tensor **gin)
{
    fg_tensor *gy = NULL;
    FG_TRY(fg_contiguous_raw(g[0], fg_bw_domain(), &gy));
    fg_meta bm; /* an input without grad has no meta */
    if (fg_node_needs_grad(n, 2))
        fg_node_input_meta(n, 2, &bm);
    fg_status s = fg_lin_grads(fg_node_saved(n, 0), fg_node_saved(n, 1), gy,
                               fg_node_needs_grad(n, 0),
                               fg_node_needs_grad(n, 1),
                               fg_node_needs_grad(n, 2), &bm, &gin[0],
                               &gin[1], &gin[2]);
    fg_tensor_free(gy);
    if (s != FG_OK)
        fg_lin_free_grads(gin, 3);
    return s;
}

static const fg_op_def linear_def = {"LinearBackward", linear_backward, NULL};

/* Every operand contiguous, one dtype, x [..., K], w [K, N], b [N]. */
static int linear_shapes(const fg_tensor *x, const fg_tensor *w,
                         const fg_tensor *b)
{
    return w->dtype == x->dtype && b->dtype == x->dtype &&
           w->device == x->device && b->device == x->device && x->nd >= 2 &&
           w->nd == 2 && b->nd == 1 && fg_tensor_is_contiguous(x) &&
           fg_tensor_is_contiguous(w) && fg_tensor_is_contiguous(b) &&
           x->shape[x->nd - 1] == w->shape[0] && b->shape[0] == w->shape[1] &&
           x->numel > 0 && w->numel > 0;
}

/* The one-node form, on CUDA only: *y NULL (and FG_OK) when it does not
 * apply or cuBLASLt has no bias epilogue for it. */
static fg_status linear_fused(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                              fg_tensor **y)
{
    *y = NULL;
    if (x->device != FG_DEVICE_CUDA || !linear_shapes(x, w, b))
        return FG_OK;
    fg_tensor *in[3] = {x, w, b}, *out;
    FG_TRY(fg_lin_new_last(fg_alloc_domain(in, 3), x, w->shape[1], &out));
    int done = 0;
    fg_status s = fg_lin_lt(FG_LT_BIAS, x, 0, w, 0, out, b, NULL, 0, &done);
    if (s != FG_OK || !done) {
        fg_tensor_free(out);
        return s;
    }
    FG_TRY(fg_op_finish(&linear_def, in, 3, &out, 1, in, 2, NULL, 0));
    *y = out;
    return FG_OK;
}

static fg_status fg_linear_impl(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                                fg_tensor **out)
{
    FG_TRY(fg_op_check_out("fg_linear", out));
    if (!b)
        return fg_matmul(x, w, 0, 0, out);
    FG_TRY(fg_op_check2("fg_linear", x, w));
    FG_TRY(fg_op_check2("fg_linear", x, b));
    fg_tensor *y = NULL;
    FG_TRY(linear_fused(x, w, b, &y));
    if (y) {
        *out = y;
        return FG_OK;
    }
    /* Elsewhere the two ops it fuses (the CPU's bits are theirs). */
    fg_tensor *t = NULL;
    FG_TRY(fg_matmul(x, w, 0, 0, &t));
    fg_status s = fg_add(t, b, out);
    fg_tensor_free(t);
    return s;
}

fg_status fg_linear(fg_tensor *x, fg_tensor *w, fg_tensor *b, fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_GEMM, fg_linear_impl(x, w, b, out));
}

/* ---- fg_mlp ------------------------------------------------------------- */

/* Inputs x, w1, b1, w2, b2; saved x, w1, w2 (contiguous), the
 * pre-activation h = x w1 + b1 and a = gelu(h). */

fg_status fg_lin_gelu_grads(fg_tensor *a, fg_tensor *h, fg_tensor *w2,
                            fg_tensor *gy, fg_tensor **dh)
{
    int done = 0;
    fg_status s = FG_OK;
    if (h->device == FG_DEVICE_CUDA) {
        s = fg_tensor_new_like(fg_bw_domain(), h, 0, dh);
        if (s == FG_OK)
            s = fg_lin_lt(FG_LT_DGELU, gy, 0, w2, 1, *dh, NULL, h, 0, &done);
        if (s != FG_OK || done)
            return s;
        fg_tensor_free(*dh);
        *dh = NULL;
    }
    fg_tensor *da = NULL, *unused = NULL;
    s = fg_matmul_grads(a, 0, w2, 0, gy, 1, 0, &da, &unused);
    if (s == FG_OK)
        s = fg_ew_binary_raw(FG_EW_GELU_GRAD, da, h, fg_bw_domain(), dh);
    fg_tensor_free(da);
    return s;
}

static fg_status mlp_backward(fg_node *n, fg_tensor *const *g,
                              fg_tensor **gin)
{
    fg_tensor *x = fg_node_saved(n, 0), *w1 = fg_node_saved(n, 1),
              *w2 = fg_node_saved(n, 2), *h = fg_node_saved(n, 3),
              *a = fg_node_saved(n, 4), *gy = NULL, *dh = NULL;
    int need[5];
    for (int i = 0; i < 5; i++)
        need[i] = fg_node_needs_grad(n, i);
    fg_meta m1, m2; /* an input without grad has no meta */
    if (need[MLP_B1])
        fg_node_input_meta(n, MLP_B1, &m1);
    if (need[MLP_B2])
        fg_node_input_meta(n, MLP_B2, &m2);
    FG_TRY(fg_contiguous_raw(g[0], fg_bw_domain(), &gy));
    fg_status s = fg_lin_grads(a, w2, gy, 0, need[MLP_W2], need[MLP_B2], &m2,
                               NULL, &gin[MLP_W2], &gin[MLP_B2]);
    if (s == FG_OK && (need[MLP_X] || need[MLP_W1] || need[MLP_B1])) {
        s = fg_lin_gelu_grads(a, h, w2, gy, &dh);
        if (s == FG_OK)
            s = fg_lin_grads(x, w1, dh, need[MLP_X], need[MLP_W1],
                             need[MLP_B1], &m1, &gin[MLP_X], &gin[MLP_W1],
                             &gin[MLP_B1]);
    }
    fg_tensor_free(gy);
    fg_tensor_free(dh);
    if (s != FG_OK)
        fg_lin_free_grads(gin, 5);
    return s;
}

static const fg_op_def mlp_def = {"MlpBackward", mlp_backward, NULL};

fg_status fg_lin_mlp_record(const fg_op_def *def, fg_tensor *const *in,
                            fg_tensor *const *c, fg_arena *dom,
                            fg_tensor **out)
{
    fg_tensor *h = NULL, *a = NULL, *y = NULL;
    fg_status s = fg_lin_mlp_hidden(dom, c[MLP_X], c[MLP_W1], c[MLP_B1], &h,
                                    &a);
    if (s == FG_OK)
        s = fg_lin_affine(dom, a, c[MLP_W2], c[MLP_B2], &y);
    if (s == FG_OK) {
        fg_tensor *saved[5] = {c[MLP_X], c[MLP_W1], c[MLP_W2], h, a};
        s = fg_op_finish(def, in, 5, &y, 1, saved, 5, NULL, 0);
        if (s == FG_OK)
            *out = y;
    } else {
        fg_tensor_free(y);
    }
    fg_tensor_free(h);
    fg_tensor_free(a);
    return s;
}

fg_status fg_lin_mlp_hidden(fg_arena *dom, fg_tensor *x, fg_tensor *w1,
                            fg_tensor *b1, fg_tensor **h, fg_tensor **a)
{
    const int64_t H = w1->shape[1];
    fg_status s = fg_lin_new_last(dom, x, H, h);
    if (s == FG_OK)
        s = fg_lin_new_last(dom, x, H, a);
    int done = 0;
    if (s == FG_OK)
        s = fg_lin_lt(FG_LT_GELU_AUX_BIAS, x, 0, w1, 0, *a, b1, *h, 0, &done);
    if (s == FG_OK && !done) {
        fg_tensor_free(*h);
        fg_tensor_free(*a);
        *h = *a = NULL;
        s = fg_lin_affine(dom, x, w1, b1, h);
        if (s == FG_OK)
            s = fg_ew_unary_raw(FG_EW_GELU, *h, 0, dom, a);
    }
    return s;
}

fg_status fg_lin_check_mlp(const char *fn, fg_tensor *const *in)
{
    static const char *const names[5] = {"x", "w1", "b1", "w2", "b2"};
    for (int i = 0; i < 5; i++) {
        FG_TRY(fg_op_check(fn, in[i], names[i]));
        if (in[i]->dtype != in[0]->dtype || in[i]->device != in[0]->device)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: %s is %s on %s, x is %s on %s", fn, names[i],
                            fg_dtype_name(in[i]->dtype),
                            fg_device_name(in[i]->device),
                            fg_dtype_name(in[0]->dtype),
                            fg_device_name(in[0]->device));
    }
    const fg_tensor *x = in[0], *w1 = in[1], *b1 = in[2], *w2 = in[3],
                    *b2 = in[4];
    if (x->nd < 2 || w1->nd != 2 || b1->nd != 1 || w2->nd != 2 ||
        b2->nd != 1 || w1->shape[0] != x->shape[x->nd - 1] ||
        b1->shape[0] != w1->shape[1] || w2->shape[0] != w1->shape[1] ||
        b2->shape[0] != w2->shape[1]) {
        char s[5][96];
        for (int i = 0; i < 5; i++)
            fg_fmt_shape(s[i], sizeof s[i], in[i]->nd, in[i]->shape);
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: shapes x %s, w1 %s, b1 %s, w2 %s, b2 %s; want "
                        "x [..., C] (2+ dims), w1 [C, H], b1 [H], w2 [H, D], "
                        "b2 [D]",
                        fn, s[0], s[1], s[2], s[3], s[4]);
    }
    return FG_OK;
}

static fg_status fg_mlp_impl(fg_tensor *x, fg_tensor *w1, fg_tensor *b1,
                             fg_tensor *w2, fg_tensor *b2, fg_tensor **out)
{
    static const char fn[] = "fg_mlp";
    FG_TRY(fg_op_check_out(fn, out));
    fg_tensor *in[5] = {x, w1, b1, w2, b2}, *c[5] = {NULL};
    FG_TRY(fg_lin_check_mlp(fn, in));
    fg_arena *dom = fg_alloc_domain(in, 5);
    fg_status s = FG_OK;
    for (int i = 0; i < 5 && s == FG_OK; i++)
        s = fg_contiguous_raw(in[i], dom, &c[i]);
    if (s == FG_OK)
        s = fg_lin_mlp_record(&mlp_def, in, c, dom, out);
    for (int i = 0; i < 5; i++)
        fg_tensor_free(c[i]);
    return s;
}

fg_status fg_mlp(fg_tensor *x, fg_tensor *w1, fg_tensor *b1, fg_tensor *w2,
                 fg_tensor *b2, fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_GEMM, fg_mlp_impl(x, w1, b1, w2, b2, out));
}
