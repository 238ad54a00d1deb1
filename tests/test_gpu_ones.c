/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_ones.c - the layernorm output with a ones column
 * (fg_dropout_add_layernorm_ones) and the master Linear / MLP that read
 * it, whose bias gradients come out of the weight-gradient GEMM as one
 * more row (lib/ops/ops_linear_master.c): h equal to
 * fg_dropout_add_layernorm's bit for bit in rows C + 8 apart, the padding
 * 1, 0, ..., 0; the Linear's dw and db against an fp64 reference (h^T u,
 * u's column sums), and every gradient (the residual, the branch, the
 * layernorm's and the layer's parameters) against the same graph on the
 * contiguous h (the column-sum kernel's bias gradients), over two
 * backwards (the second adds into .grad), one parameter hooked (its
 * gradient a tensor of its own, not added into .grad by the backward).
 * Loop bit 1: the MLP instead of the Linear; bit 2: FG_GEMM_LT=0
 * (cuBLASLt refused: the unfused paths read the strided h). Exits 77
 * without a GPU. */
#include <math.h>
#include <stdlib.h>

#include "test_ops_util.h"

#include "lib/ops/ops_internal.h"
#include "lib/ops/ops_linear_internal.h"

enum { B = 2, T = 1024, C = 128, N = 192, R = B * T, NP = 8 };

/* A CUDA leaf of dtype dt with values uniform in [-amp, amp), |v| >= 0.01. */
static fg_tensor *dev(fgt_rng *r, fg_dtype dt, int nd, const int64_t *shape,
                      double amp, int grad)
{
    fg_tensor *c = fgt_rand(r, FG_FP64, nd, shape, amp, 0.01, 0),
              *t = fgt_to_cuda(c, dt, grad);
    fg_tensor_free(c);
    return t;
}

/* max |got - want| / max |want| over the gradients of a and b. */
static double grad_err(const fg_tensor *a, const fg_tensor *b)
{
    const int64_t n = fg_tensor_numel(a);
    double *ga = fgt_host(fg_tensor_grad(a)), *gb = fgt_host(fg_tensor_grad(b));
    const double e = fgt_max_diff(ga, gb, n) / fgt_max_abs(gb, (size_t)n);
    free(ga);
    free(gb);
    return e;
}

/* h's storage as [R, C + 8]: its rows equal want's bit for bit, then 1 and
 * seven zeros. */
static void check_padding(fg_tensor *h, const fg_tensor *want)
{
    const int64_t *st = fg_tensor_strides(h);
    ck_assert_int_eq(st[1], C + NP);
    ck_assert_int_eq(st[0], T * (C + NP));
    fg_tensor *full = NULL;
    const int64_t sh[2] = {R, C + NP}, fst[2] = {C + NP, 1};
    FGT_OK(fg_tensor_view_new(NULL, h, 2, sh, fst, 0, &full));
    double *got = fgt_host(full), *ref = fgt_host(want);
    for (int64_t i = 0; i < R; i++) {
        for (int64_t j = 0; j < C; j++)
            ck_assert_msg(got[i * (C + NP) + j] == ref[i * C + j],
                          "h[%lld, %lld] differs", (long long)i, (long long)j);
        for (int64_t j = C; j < C + NP; j++)
            ck_assert_msg(got[i * (C + NP) + j] == (j == C),
                          "row %lld padding %lld: %g", (long long)i,
                          (long long)(j - C), got[i * (C + NP) + j]);
    }
    free(got);
    free(ref);
    fg_tensor_free(full);
}

/* The error of w's and b's gradients (fp32, pass backwards summed)
 * against fgt_weight_grad_ref of h's and u's values. */
static double linear_ref_err(const fg_tensor *h, const fg_tensor *u,
                             const fg_tensor *w, const fg_tensor *b, int pass)
{
    double *hh = fgt_host(h), *hu = fgt_host(u), *dw, *db;
    fgt_weight_grad_ref(hh, hu, R, C, N, &dw, &db);
    double *gw = fgt_host(fg_tensor_grad(w)), *gb = fgt_host(fg_tensor_grad(b));
    for (int64_t i = 0; i < C * N; i++)
        gw[i] /= pass;
    for (int64_t i = 0; i < N; i++)
        gb[i] /= pass;
    const double ew = fgt_max_diff(gw, dw, C * N) / fgt_max_abs(dw, C * N),
                 eb = fgt_max_diff(gb, db, N) / fgt_max_abs(db, N);
    double *bufs[] = {hh, hu, dw, db, gw, gb};
    for (int i = 0; i < 6; i++)
        free(bufs[i]);
    return ew > eb ? ew : eb;
}

START_TEST(test_ones_column)
{
    const int mlp = _i & 1;
    if (_i & 2)
        setenv("FG_GEMM_LT", "0", 1);
    fgt_rng r = fgt_rng_for(0x0e5 + (uint64_t)_i);
    /* path A (ones column): x, br, lnw, lnb, then the layer's parameters
     * (Linear: w, b; MLP: w1, b1, w2, b2); path B: their twins */
    enum { NL = 8 };
    fg_tensor *a[NL] = {NULL}, *bb[NL] = {NULL};
    const int nl = mlp ? 8 : 6;
    a[0] = dev(&r, FG_FP32, FG_SHAPE(B, T, C), 2.0, 1);
    a[1] = dev(&r, FG_BF16, FG_SHAPE(B, T, C), 1.0, 1);
    a[2] = dev(&r, FG_FP32, FG_SHAPE(C), 0.5, 1);
    a[3] = dev(&r, FG_FP32, FG_SHAPE(C), 0.5, 1);
    if (mlp) {
        a[4] = dev(&r, FG_FP32, FG_SHAPE(C, 4 * C), 0.1, 1);
        a[5] = dev(&r, FG_FP32, FG_SHAPE(4 * C), 0.5, 1);
        a[6] = dev(&r, FG_FP32, FG_SHAPE(4 * C, C), 0.1, 1);
        a[7] = dev(&r, FG_FP32, FG_SHAPE(C), 0.5, 1);
    } else {
        a[4] = dev(&r, FG_FP32, FG_SHAPE(C, N), 0.2, 1);
        a[5] = dev(&r, FG_FP32, FG_SHAPE(N), 0.5, 1);
    }
    for (int i = 0; i < nl; i++)
        bb[i] = fgt_to_cuda(a[i], fg_tensor_dtype(a[i]),
                            fg_tensor_requires_grad(a[i]));
    fg_tensor *u = dev(&r, FG_BF16, FG_SHAPE(B, T, mlp ? C : N), 0.5, 0);
    /* a hook on the first weight (Linear) or bias (MLP) of both paths:
     * that gradient copied out of the GEMM's scratch, the other added */
    fg_hook *hk[2] = {NULL, NULL};
    FGT_OK(fg_tensor_register_hook(a[4 + mlp], fgt_noop_hook, NULL, &hk[0]));
    FGT_OK(fg_tensor_register_hook(bb[4 + mlp], fgt_noop_hook, NULL, &hk[1]));
    const char *names[NL] = {"x", "branch", "ln weight", "ln bias",
                             mlp ? "w1" : "w", mlp ? "b1" : "b", "w2", "b2"};
    for (int pass = 1; pass <= 2; pass++) {
        fg_tensor *ya = NULL, *ha = NULL, *yb = NULL, *hb = NULL, *oa = NULL,
                  *ob = NULL;
        FGT_OK(fg_dropout_add_layernorm_ones(a[0], a[1], 0.1, 7, 40, a[2],
                                             a[3], 1e-5, FG_BF16, &ya, &ha));
        FGT_OK(fg_dropout_add_layernorm(bb[0], bb[1], 0.1, 7, 40, bb[2],
                                        bb[3], 1e-5, FG_BF16, &yb, &hb));
        check_padding(ha, hb);
        /* what the master layers test before taking the GEMM's row */
        ck_assert_int_eq(fg_lin_ones_pitch(ha), C + NP);
        ck_assert_int_eq(fg_lin_ones_pitch(hb), 0);
        if (mlp) {
            FGT_OK(fg_mlp_master(ha, a[4], a[5], a[6], a[7], &oa));
            FGT_OK(fg_mlp_master(hb, bb[4], bb[5], bb[6], bb[7], &ob));
        } else {
            FGT_OK(fg_linear_master(ha, a[4], a[5], &oa));
            FGT_OK(fg_linear_master(hb, bb[4], bb[5], &ob));
        }
        /* the forward GEMM reads h with its pitch: the same products */
        double *va = fgt_host(oa), *vb = fgt_host(ob);
        const int64_t no = fg_tensor_numel(ob);
        const double ey = fgt_max_diff(va, vb, no) / fgt_max_abs(vb, no);
        ck_assert_msg(ey <= 0x1p-7, "pass %d: output error %.3g", pass, ey);
        free(va);
        free(vb);
        FGT_OK(fg_backward_with(oa, u));
        FGT_OK(fg_backward_with(ob, u));
        /* fp32 sums of the same bf16 products in another order */
        for (int i = 0; i < nl; i++) {
            const double e = grad_err(a[i], bb[i]);
            fprintf(stderr, "ones column %s%s pass %d %s: error %.3g\n",
                    mlp ? "MLP" : "Linear", _i & 2 ? " (unfused)" : "", pass,
                    names[i], e);
            ck_assert_msg(e <= 1e-5, "pass %d %s: error %.3g", pass, names[i],
                          e);
        }
        if (!mlp) {
            const double e = linear_ref_err(hb, u, a[4], a[5], pass);
            ck_assert_msg(e <= 1e-5, "pass %d: dw / db against fp64: %.3g",
                          pass, e);
        }
        fg_tensor *all[] = {ya, ha, yb, hb, oa, ob};
        fgt_free_all(all, 6);
    }
    fg_hook_remove(hk[0]);
    fg_hook_remove(hk[1]);
    fgt_free_all(a, nl);
    fgt_free_all(bb, nl);
    fg_tensor_free(u);
}
END_TEST

static const char *const g_switches[] = {"FG_GEMM_LT"};

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the ones-column suite\n");
        return 77;
    }
    fgt_base_seed();
    FGT_SWITCHES_SAVE(g_switches);
    Suite *s = suite_create("gpu_ones");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, fgt_switches_restore, fgt_switches_restore);
    fgt_add_loop(tc, test_ones_column, 0, 4);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
