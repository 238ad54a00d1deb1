/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_linear_master.c - fg_linear and fg_mlp on fp32 master
 * parameters under autocast (ops_linear_internal.h): forward on the
 * parameters' cached low-precision copies, weight and bias gradients in
 * fp32 straight from the GEMMs into the parameters' .grad. Replaces, per
 * parameter and step, a CastBackward node, a bf16 gradient and the kernel
 * that widened it into .grad. */
#include <string.h>

#include "config.h"

#include "ops_linear_internal.h"
#include "kernels/runtime/profile.h"

/* p is an fp32 parameter on CUDA whose cached copy the products may use. */
static int master_param(const fg_tensor *p)
{
    return p && p->device == FG_DEVICE_CUDA && p->dtype == FG_FP32 &&
           p->requires_grad && !p->grad_fn && fg_tensor_is_contiguous(p);
}

static int master_ok(const fg_tensor *x, fg_tensor *const *params, int n)
{
    if (!x || x->device != FG_DEVICE_CUDA ||
        (x->dtype != FG_BF16 && x->dtype != FG_FP16) ||
        !(fg_tensor_is_contiguous(x) || fg_lin_ones_pitch(x)) || x->nd < 2 ||
        x->numel == 0)
        return 0;
    for (int i = 0; i < n; i++)
        if (!master_param(params[i]))
            return 0;
    return 1;
}

/* dw and db from one GEMM over x's padded rows (x has a ones column:
 * fg_lin_ones_pitch): the product [K + FG_ONES_PAD, N] into a scratch, its
 * first K rows dw and row K db (x's column of ones times gy: gy's column
 * sums, summed in fp32 by the GEMM), added into accw / accb where given,
 * else copied out (two leaves' gradients never share a storage).
 * On an H200 at GPT-2-small's shapes this GEMM took 0-5% longer than the
 * plain one (scripts/wgrad-probe.cu) where the column-sum kernel read gy
 * once more (20-25% of it): 1.1 ms a step at batch 64. *done 0 where
 * cuBLASLt declines (nothing written). */
static fg_status ones_wgrads(fg_tensor *x, fg_tensor *gy, fg_tensor *accw,
                             fg_tensor *accb, fg_tensor **dw, fg_tensor **db,
                             int *done)
{
    fg_arena *dom = fg_bw_domain();
    const int64_t K = x->shape[x->nd - 1], N = gy->shape[gy->nd - 1],
                  P = K + FG_ONES_PAD, R = x->numel / K,
                  xs[2] = {R, P}, xst[2] = {P, 1}, ss[2] = {P, N},
                  ws[2] = {K, N}, wst[2] = {N, 1}, bst = 1;
    fg_tensor *xe = NULL, *sc = NULL, *vw = NULL, *vb = NULL;
    *done = 0;
    *dw = *db = NULL;
    fg_status s = fg_tensor_view_new(dom, x, 2, xs, xst, x->offset, &xe);
    if (s == FG_OK)
        s = fg_tensor_new(dom, FG_FP32, x->device, 2, ss, &sc);
    if (s == FG_OK)
        s = fg_lin_lt(FG_LT_DEFAULT, xe, 1, gy, 0, sc, NULL, NULL, 0, done);
    if (s == FG_OK && *done)
        s = fg_tensor_view_new(dom, sc, 2, ws, wst, 0, &vw);
    if (s == FG_OK && *done)
        s = fg_tensor_view_new(dom, sc, 1, &N, &bst, K * N, &vb);
    if (s == FG_OK && *done)
        s = accw ? fg_grad_accumulate(accw, vw)
                 : fg_copy_raw(vw, FG_FP32, dom, dw);
    if (s == FG_OK && *done)
        s = accb ? fg_grad_accumulate(accb, vb)
                 : fg_copy_raw(vb, FG_FP32, dom, db);
    fg_tensor *t[4] = {xe, sc, vw, vb};
    for (int i = 0; i < 4; i++)
        fg_tensor_free(t[i]);
    if (s != FG_OK) {
        fg_tensor_free(*dw);
        fg_tensor_free(*db);
        *dw = *db = NULL;
    }
    return s;
}

/* The fp32 gradients of w [K, N] and b [N] in y = x w + b for gy (x
 * [..., K], gy [..., N], low precision): *dw = x^T gy, added into accw
 * instead when non-NULL (*dw NULL then); *db = gy's column sums, likewise
 * into accb. One cuBLASLt GEMM with an fp32 C, and the column-sum kernel
 * (fg_lin_col_sums_ok: the GEMM's bias-gradient epilogue where it does not
 * apply); where cuBLASLt declines, the same sums from fp32 copies of x and
 * gy (fg_matmul, fg_sum's reduction). Where x has a ones column both come
 * from one GEMM (ones_wgrads). */
static fg_status master_wgrads(fg_tensor *x, fg_tensor *gy, int nw, int nb,
                               fg_tensor *accw, fg_tensor *accb,
                               fg_tensor **dw, fg_tensor **db)
{
    fg_arena *dom = fg_bw_domain();
    const int64_t K = x->shape[x->nd - 1], N = gy->shape[gy->nd - 1],
                  wshape[2] = {K, N};
    fg_tensor *tw = NULL, *tb = NULL;
    fg_status s = FG_OK;
    *dw = *db = NULL;
    if (!nw && !nb)
        return FG_OK;
    /* where the column sums would take db (and FG_GEMM_BGRAD=1 not) */
    if (nw && nb && fg_lin_ones_pitch(x) && fg_lin_col_sums_ok(gy, FG_FP32)) {
        int done = 0;
        FG_TRY(ones_wgrads(x, gy, accw, accb, dw, db, &done));
        if (done)
            return FG_OK;
    }
    if (nw && accw)
        tw = fg_tensor_retain(accw);
    else if (nw)
        s = fg_tensor_new(dom, FG_FP32, x->device, 2, wshape, &tw);
    /* db by the column-sum kernel where it applies, else in dW's epilogue;
     * the kernel adds into b's target itself (one pass fewer than a fresh
     * db and fg_grad_accumulate, the same bits) */
    const int sums = nb && fg_lin_col_sums_ok(gy, FG_FP32),
              epi = nb && !sums,
              direct = sums && accb && accb->dtype == FG_FP32 &&
                       fg_tensor_is_contiguous(accb) && accb->numel == N;
    if (s == FG_OK && nb && !direct)
        s = fg_tensor_new(dom, FG_FP32, x->device, 1, &N, &tb);
    int done = !nw, db_done = !nb;
    if (s == FG_OK && nw)
        s = fg_lin_lt(epi ? FG_LT_BGRAD_B : FG_LT_DEFAULT, x, 1, gy, 0, tw,
                      epi ? tb : NULL, NULL, accw != NULL, &done);
    if (s == FG_OK && epi)
        db_done = done;
    if (s == FG_OK && sums) {
        s = fg_lin_col_sums(direct ? accb : tb, gy, direct);
        db_done = s == FG_OK;
    }
    if (s == FG_OK && (!done || !db_done)) {
        const int64_t rows = x->numel / K, xs[2] = {rows, K},
                      gs[2] = {rows, N};
        fg_tensor *x32 = NULL, *g32 = NULL, *x2 = NULL, *g2 = NULL;
        s = fg_copy_raw(x, FG_FP32, dom, &x32);
        if (s == FG_OK)
            s = fg_copy_raw(gy, FG_FP32, dom, &g32);
        if (s == FG_OK)
            s = fg_reshape_raw(x32, 2, xs, dom, &x2);
        if (s == FG_OK)
            s = fg_reshape_raw(g32, 2, gs, dom, &g2);
        if (s == FG_OK && !done)
            s = fg_matmul_raw(x2, 1, g2, 0, tw, accw != NULL);
        if (s == FG_OK && !db_done) {
            fg_tensor_free(tb);
            tb = NULL;
            s = fg_sum_to_shape(g2, 1, &N, &tb);
        }
        fg_tensor *t[4] = {x32, g32, x2, g2};
        for (int i = 0; i < 4; i++)
            fg_tensor_free(t[i]);
    }
    if (s == FG_OK && tb && accb)
        s = fg_grad_accumulate(accb, tb);
    if (s != FG_OK || accw) {
        fg_tensor_free(tw);
        tw = NULL;
    }
    if (s != FG_OK || accb) {
        fg_tensor_free(tb);
        tb = NULL;
    }
    *dw = tw;
    *db = tb;
    return s;
}

/* x's gradient gy w^T in x's dtype (fg_linear's GEMM, or its fallback). */
static fg_status master_dx(fg_tensor *x, fg_tensor *wl, fg_tensor *gy,
                           fg_tensor **dx)
{
    fg_tensor *unused_w = NULL, *unused_b = NULL;
    return fg_lin_grads(x, wl, gy, 1, 0, 0, NULL, dx, &unused_w, &unused_b);
}

/* Input 0's gradient where the engine gave a target for it. */
static fg_status add_to_target(fg_tensor *const *acc, fg_tensor **gin)
{
    if (!acc || !acc[0] || !gin[0])
        return FG_OK;
    fg_status s = fg_grad_accumulate(acc[0], gin[0]);
    fg_tensor_free(gin[0]);
    gin[0] = NULL;
    return s;
}

/* ---- fg_linear_master --------------------------------------------------- */

/* Inputs x, w, b (the fp32 parameters); saved x and w's copy wl. acc:
 * NULL or the engine's targets (fg_backward_acc_fn); every acc[i] is
 * added to exactly once: w's by the GEMM itself (C += x^T gy: out-of-place
 * split-K, so the bits of writing dw and adding it, gemm_lt.cu), b's and
 * x's by fg_grad_accumulate. */
static fg_status lm_grads(fg_node *n, fg_tensor *const *g, fg_tensor **gin,
                          fg_tensor *const *acc)
{
    fg_tensor *x = fg_node_saved(n, 0), *wl = fg_node_saved(n, 1), *gy = NULL;
    FG_TRY(fg_contiguous_raw(g[0], fg_bw_domain(), &gy));
    fg_status s = FG_OK;
    if (fg_node_needs_grad(n, 0))
        s = master_dx(x, wl, gy, &gin[0]);
    if (s == FG_OK)
        s = master_wgrads(x, gy, fg_node_needs_grad(n, 1),
                          fg_node_needs_grad(n, 2), acc ? acc[1] : NULL,
                          acc ? acc[2] : NULL, &gin[1], &gin[2]);
    if (s == FG_OK)
        s = add_to_target(acc, gin);
    fg_tensor_free(gy);
    if (s != FG_OK)
        fg_lin_free_grads(gin, 3);
    return s;
}

static const fg_op_def lm_def = {"LinearBackward", NULL, lm_grads};

static fg_status cast_params(fg_dtype dt, fg_tensor *const *p,
                             fg_tensor **c, int n)
{
    fg_status s = FG_OK;
    for (int i = 0; i < n && s == FG_OK; i++)
        s = fg_cast_param(p[i], dt, &c[i]);
    return s;
}

static fg_status linear_master_impl(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                                    fg_tensor **out)
{
    static const char fn[] = "fg_linear_master";
    FG_TRY(fg_op_check_out(fn, out));
    fg_tensor *p[2] = {w, b};
    if (!master_ok(x, p, 2) || w->nd != 2 || b->nd != 1 ||
        w->shape[0] != x->shape[x->nd - 1] || b->shape[0] != w->shape[1] ||
        w->numel == 0) {
        /* elsewhere: fg_linear on the cast parameters (its checks) */
        fg_tensor *c[2] = {NULL, NULL};
        fg_status s = x ? cast_params(x->dtype, p, c, b ? 2 : 1)
                        : FG_FAIL(FG_ERR_INVALID_ARGUMENT, "%s: x is NULL",
                                  fn);
        if (s == FG_OK)
            s = fg_linear(x, c[0], c[1], out);
        fg_tensor_free(c[0]);
        fg_tensor_free(c[1]);
        return s;
    }
    fg_tensor *wl, *bl, *y = NULL;
    FG_TRY(fg_tensor_lowp(w, x->dtype, &wl));
    FG_TRY(fg_tensor_lowp(b, x->dtype, &bl));
    fg_tensor *in[3] = {x, w, b};
    FG_TRY(fg_lin_affine(fg_alloc_domain(in, 3), x, wl, bl, &y));
    fg_tensor *saved[2] = {x, wl};
    FG_TRY(fg_op_finish(&lm_def, in, 3, &y, 1, saved, 2, NULL, 0));
    *out = y;
    return FG_OK;
}

fg_status fg_linear_master(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                           fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_GEMM, linear_master_impl(x, w, b, out));
}

/* ---- fg_mlp_master ------------------------------------------------------ */

/* Inputs x, w1, b1, w2, b2 (fp32 parameters); saved x, the copies w1l and
 * w2l, the pre-activation h and a = gelu(h). acc as lm_grads's. */
static fg_status mm_grads(fg_node *n, fg_tensor *const *g, fg_tensor **gin,
                          fg_tensor *const *acc)
{
    fg_tensor *x = fg_node_saved(n, 0), *w1l = fg_node_saved(n, 1),
              *w2l = fg_node_saved(n, 2), *h = fg_node_saved(n, 3),
              *a = fg_node_saved(n, 4), *gy = NULL, *dh = NULL;
    int need[5];
    for (int i = 0; i < 5; i++)
        need[i] = fg_node_needs_grad(n, i);
    FG_TRY(fg_contiguous_raw(g[0], fg_bw_domain(), &gy));
    fg_status s = master_wgrads(a, gy, need[MLP_W2], need[MLP_B2],
                                acc ? acc[MLP_W2] : NULL,
                                acc ? acc[MLP_B2] : NULL, &gin[MLP_W2],
                                &gin[MLP_B2]);
    if (s == FG_OK && (need[MLP_X] || need[MLP_W1] || need[MLP_B1])) {
        s = fg_lin_gelu_grads(a, h, w2l, gy, &dh);
        if (s == FG_OK && need[MLP_X])
            s = master_dx(x, w1l, dh, &gin[MLP_X]);
        if (s == FG_OK)
            s = master_wgrads(x, dh, need[MLP_W1], need[MLP_B1],
                              acc ? acc[MLP_W1] : NULL,
                              acc ? acc[MLP_B1] : NULL, &gin[MLP_W1],
                              &gin[MLP_B1]);
    }
    if (s == FG_OK)
        s = add_to_target(acc, gin);
    fg_tensor_free(gy);
    fg_tensor_free(dh);
    if (s != FG_OK)
        fg_lin_free_grads(gin, 5);
    return s;
}

static const fg_op_def mm_def = {"MlpBackward", NULL, mm_grads};

static fg_status mlp_master_impl(fg_tensor *x, fg_tensor *w1, fg_tensor *b1,
                                 fg_tensor *w2, fg_tensor *b2, fg_tensor **out)
{
    static const char fn[] = "fg_mlp_master";
    FG_TRY(fg_op_check_out(fn, out));
    fg_tensor *p[4] = {w1, b1, w2, b2};
    if (!master_ok(x, p, 4)) { /* fg_mlp on the cast parameters */
        fg_tensor *c[4] = {NULL};
        fg_status s = x ? cast_params(x->dtype, p, c, 4)
                        : FG_FAIL(FG_ERR_INVALID_ARGUMENT, "%s: x is NULL",
                                  fn);
        if (s == FG_OK)
            s = fg_mlp(x, c[0], c[1], c[2], c[3], out);
        for (int i = 0; i < 4; i++)
            fg_tensor_free(c[i]);
        return s;
    }
    fg_tensor *l[4];
    for (int i = 0; i < 4; i++)
        FG_TRY(fg_tensor_lowp(p[i], x->dtype, &l[i]));
    fg_tensor *in[5] = {x, w1, b1, w2, b2},
              *lin[5] = {x, l[0], l[1], l[2], l[3]};
    FG_TRY(fg_lin_check_mlp(fn, lin));
    return fg_lin_mlp_record(&mm_def, in, lin, fg_alloc_domain(in, 5), out);
}

fg_status fg_mlp_master(fg_tensor *x, fg_tensor *w1, fg_tensor *b1,
                        fg_tensor *w2, fg_tensor *b2, fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_GEMM, mlp_master_impl(x, w1, b1, w2, b2, out));
}
