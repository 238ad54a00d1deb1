/* SPDX-License-Identifier: MIT */
/* tests/test_attention_grad.c - finite-difference gradcheck of the fp64
 * backward, plain and with every variant (window, top-left causal,
 * softcap, ALiBi, block-sparse, combined with dropout): for loss =
 * sum(O * G) with a random G, dL/dX from the backward
 * (dO = G) must match central differences (eps 1e-6) of the forward for every
 * element of Q, K and V: |analytic - numeric| <= 1e-5 + 1e-3 |numeric|. */
#include <check.h>

#include "test_util.h"

typedef struct gc_case {
    int64_t B, Nq, Nk, H, Hk, d;
    int causal;
    double p;
    /* variants: window (wl, wr; both 0 = none), top-left, softcap, ALiBi
     * slopes [H], and a block map keeping every block but (0, 1) */
    int64_t wl, wr;
    int top_left;
    double softcap;
    int alibi, sparse;
} gc_case;

static const gc_case cases[] = {
    {1, 5, 7, 2, 1, 8, 0, 0.0},
    {1, 5, 7, 2, 1, 8, 1, 0.0},
    {2, 6, 4, 2, 2, 8, 1, 0.0},  /* Nq > Nk: masked rows */
    {1, 9, 9, 1, 1, 16, 1, 0.0},
    {1, 5, 7, 2, 1, 8, 0, 0.25}, /* dropout, same seed both ways */
    {2, 7, 7, 2, 2, 8, 1, 0.4},
    {1, 3, 11, 3, 1, 8, 1, 0.1},
    {1, 9, 9, 1, 1, 8, 0, 0.0, 3, 2},               /* sliding window */
    {1, 6, 10, 2, 1, 8, 1, 0.0, 0, 0, 1},           /* top-left causal */
    {1, 7, 7, 2, 2, 8, 1, 0.0, 0, 0, 0, 1.5},       /* softcap */
    {1, 7, 9, 2, 1, 8, 0, 0.0, 0, 0, 0, 0, 1},      /* ALiBi */
    {1, 8, 8, 2, 1, 8, 1, 0.2, 4, -1, 0, 2.0, 1},   /* all, with dropout */
    {1, 140, 140, 1, 1, 8, 0, 0.0, 0, 0, 0, 0, 0, 1}, /* block-sparse */
};

static double loss(const fg_attn_params *p, double *q, double *k, double *v,
                   const double *g, double *o, double *m, double *l)
{
    fg_attn_tensor tq = fg_attn_bshd(q, FG_FP64, p->seqlen_q, p->heads_q, p->head_dim);
    fg_attn_tensor tk = fg_attn_bshd(k, FG_FP64, p->seqlen_k, p->heads_kv, p->head_dim);
    fg_attn_tensor tv = fg_attn_bshd(v, FG_FP64, p->seqlen_k, p->heads_kv, p->head_dim);
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP64, p->seqlen_q, p->heads_q, p->head_dim);
    fg_attn_stats st = {m, l, FG_FP64};
    ck_assert_msg(fg_attention_forward(p, &tq, &tk, &tv, &to, &st) == FG_OK,
                  "%s", fg_last_error());
    size_t n = (size_t)(p->batch * p->seqlen_q * p->heads_q * p->head_dim);
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += o[i] * g[i];
    return s;
}

START_TEST(test_gradcheck)
{
    const gc_case *c = &cases[_i];
    fg_attn_params p;
    fg_attn_params_init(&p, c->B, c->Nq, c->Nk, c->H, c->Hk, c->d);
    p.causal = c->causal;
    p.dropout_p = c->p;
    p.seed = 0xC0FFEEull + (uint64_t)_i;
    p.offset = 3;
    p.block_q = 2; /* several blocks even on tiny shapes */
    p.block_k = 3;
    if (c->wl || c->wr) {
        p.window_left = c->wl;
        p.window_right = c->wr;
    }
    p.causal_align = c->top_left ? FG_ATTN_ALIGN_TOP_LEFT : FG_ATTN_ALIGN_BOTTOM_RIGHT;
    p.softcap = c->softcap;
    const float slopes[4] = {0.3f, 0.7f, 0.2f, 0.5f};
    if (c->alibi)
        p.alibi_slopes = slopes;
    const uint8_t map[4] = {1, 0, 1, 1}; /* 2 x 2 blocks of 128 */
    int32_t storage[32];
    fg_attn_block_mask bm;
    if (c->sparse) {
        ck_assert(fg_attn_block_mask_build(&bm, map, 1, 1, 2, 2, storage,
                                           FG_DEVICE_CPU) == FG_OK);
        p.block_mask = &bm;
    }
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    fgt_rng rng = fgt_rng_for(40 + (uint64_t)_i);
    double *q = malloc(nq * 8), *k = malloc(nk * 8), *v = malloc(nk * 8);
    double *g = malloc(nq * 8), *o = malloc(nq * 8), *m = malloc(ns * 8);
    double *l = malloc(ns * 8), *dq = malloc(nq * 8), *dk = malloc(nk * 8);
    double *dv = malloc(nk * 8);
    fgt_fill(q, nq, &rng, 1.5);
    fgt_fill(k, nk, &rng, 1.5);
    fgt_fill(v, nk, &rng, 1.0);
    fgt_fill(g, nq, &rng, 1.0);
    loss(&p, q, k, v, g, o, m, l);
    fgt_poison_d(dq, nq);
    fgt_poison_d(dk, nk);
    fgt_poison_d(dv, nk);
    fg_attn_tensor tq = fg_attn_bshd(q, FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor tk = fg_attn_bshd(k, FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor tv = fg_attn_bshd(v, FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor tg = fg_attn_bshd(g, FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor tdq = fg_attn_bshd(dq, FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor tdk = fg_attn_bshd(dk, FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor tdv = fg_attn_bshd(dv, FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_stats st = {m, l, FG_FP64};
    ck_assert_msg(fg_attention_backward(&p, &tq, &tk, &tv, &to, &tg, &st, &tdq,
                                        &tdk, &tdv) == FG_OK,
                  "%s", fg_last_error());

    double *o2 = malloc(nq * 8), *m2 = malloc(ns * 8), *l2 = malloc(ns * 8);
    double *xs[3] = {q, k, v}, *gs[3] = {dq, dk, dv};
    size_t ns3[3] = {nq, nk, nk};
    const char *names[3] = {"dQ", "dK", "dV"};
    const double eps = 1e-6;
    int nonzero = 0;
    int checked = 0;
    for (int t = 0; t < 3; t++) {
        /* Large cases (the block-sparse one needs N > 128) check every
         * 11th element, which still visits both blocks of every row. */
        const size_t step = ns3[t] > 600 ? 11 : 1;
        for (size_t i = 0; i < ns3[t]; i += step, checked++) {
            double x0 = xs[t][i];
            xs[t][i] = x0 + eps;
            double lp = loss(&p, q, k, v, g, o2, m2, l2);
            xs[t][i] = x0 - eps;
            double lm = loss(&p, q, k, v, g, o2, m2, l2);
            xs[t][i] = x0;
            double num = (lp - lm) / (2 * eps), ana = gs[t][i];
            nonzero += fabs(num) > 1e-3;
            ck_assert_msg(fabs(ana - num) <= 1e-5 + 1e-3 * fabs(num),
                          "case %d %s[%zu]: analytic %.10g numeric %.10g", _i,
                          names[t], i, ana, num);
        }
    }
    ck_assert_msg(nonzero > checked / 6, "gradients suspiciously zero");
    free(q); free(k); free(v); free(g); free(o); free(m); free(l);
    free(dq); free(dk); free(dv); free(o2); free(m2); free(l2);
}
END_TEST

int main(void)
{
    fgt_base_seed();
    Suite *s = suite_create("attention_gradcheck");
    TCase *tc = tcase_create("fd");
    tcase_set_timeout(tc, 120);
    fgt_add_loop(tc, test_gradcheck, 0,
                 (int)(sizeof cases / sizeof cases[0]));
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
