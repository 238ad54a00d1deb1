/* SPDX-License-Identifier: MIT */
/* tests/test_attention_bias.c - the additive attention bias and its
 * gradient on the CPU against the naive fp64 reference (which adds the
 * bias pair by pair and returns dS = dL/d(logit); the broadcast sums of
 * dbias are formed in tests/bias_util.h): every broadcast pattern, fp32 and
 * fp64 bias and dbias, strided bias layouts, combined with causal, window,
 * ALiBi, softcap, dropout, GQA, block-sparse and BHSD operands. Also -inf
 * and NaN biases, thread-count independence of dbias, a finite-difference
 * check of dbias, and the rejection of bad bias arguments with nothing
 * written.
 * Tolerances (max-abs error relative to max(max |ref|, 0.1)): fp64 1e-12;
 * fp32 2e-5 for O, m, l, dQ, dK, dV (as test_attention_variants) and 1e-4
 * for dbias, whose broadcast sums add up to B*H*Nq terms in fp32; an fp64
 * problem with an fp32 bias or dbias is held to 1e-4 (an fp32 dbias sums in
 * fp32, and the sum of dS over a row is 0 in exact arithmetic, so a wholly
 * broadcast dbias is all cancellation). */
#include <check.h>

#include "attn_harness.h"
#include "bias_util.h"

typedef struct bcase {
    fgt_case c;
    int bcast;            /* FGT_BC_* bits */
    int layout, dlayout;  /* FGT_BL_* of bias and dbias */
    fg_dtype bias_dt, dbias_dt; /* 0: the operands' dtype */
    double p_inf;         /* share of -inf bias entries */
    /* After the fill: row (0, 0, 3) of the bias gets -inf everywhere
     * (special = 1), or a NaN at key 1 (2, visible under causal) or at key
     * Nk - 1 (3, masked under causal with Nq = Nk). */
    int special;
} bcase;

typedef struct bres {
    fg_status fwd, bwd;
    double err_o, err_m, err_l, err_dq, err_dk, err_dv, err_db;
    int finite, pad_ok;
    double *m, *l, *o, *db; /* owned */
} bres;

static void bres_free(bres *r)
{
    free(r->m); free(r->l); free(r->o); free(r->db);
}

/* Forward and backward with bias and dbias through the public API, and the
 * naive reference; errors into r. */
static void run_bias_case(const bcase *bc, uint64_t salt, bres *r)
{
    const fgt_case *c = &bc->c;
    memset(r, 0, sizeof *r);
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t ns_ = (size_t)(c->B * c->H * c->Nq);
    fgt_rng rng = fgt_rng_for(salt);
    double *in[4];
    const size_t sizes[4] = {nq, nk, nk, nq}; /* q, k, v, dO */
    for (int x = 0; x < 4; x++) {
        in[x] = malloc(sizeof(double) * sizes[x]);
        fgt_fill(in[x], sizes[x], &rng, 1.0);
        if (c->dtype == FG_FP32)
            for (size_t e = 0; e < sizes[x]; e++)
                in[x][e] = (float)in[x][e];
    }
    fg_attn_params p;
    naive_shape ns;
    fgt_variants var;
    fgt_setup(c, &rng, &p, &ns, &var);
    fgt_bias bias, dbias;
    fgt_bias_init(&bias, c->B, c->H, c->Nq, c->Nk, bc->bcast,
                  bc->bias_dt ? bc->bias_dt : c->dtype, bc->layout);
    fgt_bias_fill(&bias, &rng, 2.0, bc->p_inf);
    for (int64_t j = 0; bc->special && j < c->Nk; j++)
        if (bc->special == 1 || (bc->special == 2 && j == 1) ||
            (bc->special == 3 && j == c->Nk - 1))
            fgt_bias_set(&bias, 0, 0, 3, j, bc->special == 1 ? -INFINITY : NAN);
    fgt_bias_naive(&bias, &ns);
    fgt_bias_init(&dbias, c->B, c->H, c->Nq, c->Nk, bc->bcast,
                  bc->dbias_dt ? bc->dbias_dt : c->dtype, bc->dlayout);
    p.bias = &bias.desc;
    p.dbias = &dbias.desc;

    fg_attn_tensor t[4], to, tdq, tdk, tdv;
    const int64_t S[4] = {c->Nq, c->Nk, c->Nk, c->Nq};
    const int64_t Hh[4] = {c->H, c->Hk, c->Hk, c->H};
    void *buf[4];
    for (int x = 0; x < 4; x++)
        buf[x] = fgt_pack(c, in[x], S[x], Hh[x], &t[x]);
    void *bo = fgt_out(c, c->Nq, c->H, &to);
    void *bdq = fgt_out(c, c->Nq, c->H, &tdq);
    void *bdk = fgt_out(c, c->Nk, c->Hk, &tdk);
    void *bdv = fgt_out(c, c->Nk, c->Hk, &tdv);
    const fg_dtype sd = c->dtype;
    void *sm = malloc(ns_ * fg_dtype_size(sd)), *sl = malloc(ns_ * fg_dtype_size(sd));
    memset(sm, 0xff, ns_ * fg_dtype_size(sd));
    memset(sl, 0xff, ns_ * fg_dtype_size(sd));
    fg_attn_stats st = {sm, sl, sd};

    r->fwd = fg_attention_forward(&p, &t[0], &t[1], &t[2], &to, &st);
    if (r->fwd == FG_OK)
        r->bwd = fg_attention_backward(&p, &t[0], &t[1], &t[2], &to, &t[3],
                                       &st, &tdq, &tdk, &tdv);
    r->o = fgt_unpack(c, &to, c->Nq, c->H);
    r->m = fgt_stats_to_d(c, sm, ns_);
    r->l = fgt_stats_to_d(c, sl, ns_);
    double *dq = fgt_unpack(c, &tdq, c->Nq, c->H);
    double *dk = fgt_unpack(c, &tdk, c->Nk, c->Hk);
    double *dv = fgt_unpack(c, &tdv, c->Nk, c->Hk);
    r->db = fgt_bias_read(&dbias);
    r->pad_ok = fgt_bias_padding_intact(&dbias);

    uint8_t *mask = NULL;
    if (c->p > 0) {
        mask = malloc((size_t)(c->B * c->H * c->Nq * c->Nk));
        ref_dropout_mask(c->seed, c->offset, c->p, c->B, c->H, c->Nq, c->Nk,
                         mask);
        ns.keep = mask;
    }
    double *ro = malloc(sizeof(double) * nq), *rm = malloc(sizeof(double) * ns_);
    double *rl = malloc(sizeof(double) * ns_);
    double *rdq = malloc(sizeof(double) * nq), *rdk = malloc(sizeof(double) * nk);
    double *rdv = malloc(sizeof(double) * nk);
    double *rds = malloc(sizeof(double) * (size_t)(c->B * c->H * c->Nq * c->Nk));
    naive_attention_forward(&ns, in[0], in[1], in[2], ro, rm, rl);
    naive_attention_backward_ds(&ns, in[0], in[1], in[2], in[3], rdq, rdk,
                                rdv, rds);
    double *rdb = fgt_dbias_ref(rds, c->B, c->H, c->Nq, c->Nk, dbias.ext);
    r->err_o = fgt_rel_err(r->o, ro, nq);
    r->err_m = fgt_stats_err(r->m, rm, ns_);
    r->err_l = fgt_stats_err(r->l, rl, ns_);
    r->err_dq = fgt_rel_err_floor(dq, rdq, nq, 0.1);
    r->err_dk = fgt_rel_err_floor(dk, rdk, nk, 0.1);
    r->err_dv = fgt_rel_err_floor(dv, rdv, nk, 0.1);
    r->err_db = fgt_rel_err_floor(r->db, rdb, fgt_bias_count(&dbias), 0.1);
    r->finite = fgt_all_finite(r->o, nq) && fgt_all_finite(dq, nq) &&
                fgt_all_finite(dk, nk) && fgt_all_finite(dv, nk) &&
                fgt_all_finite(r->db, fgt_bias_count(&dbias));
    free(mask);
    free(ro); free(rm); free(rl); free(rdq); free(rdk); free(rdv); free(rds);
    free(rdb); free(dq); free(dk); free(dv);
    for (int x = 0; x < 4; x++) {
        free(in[x]);
        free(buf[x]);
    }
    free(bo); free(bdq); free(bdk); free(bdv); free(sm); free(sl);
    fgt_bias_free(&bias);
    fgt_bias_free(&dbias);
    fgt_variants_free(&var);
}

static const char *bc_name(int bcast)
{
    static const char *names[16] = {
        "[B,H,Nq,Nk]", "[1,H,Nq,Nk]", "[B,1,Nq,Nk]", "[Nq,Nk]",
        "[B,H,1,Nk]", "[1,H,1,Nk]", "[B,1,1,Nk]", "[1,1,1,Nk]",
        "[B,H,Nq,1]", "[1,H,Nq,1]", "[B,1,Nq,1]", "[1,1,Nq,1]",
        "[B,H,1,1]", "[1,H,1,1]", "[B,1,1,1]", "[1,1,1,1]"};
    return names[bcast & 15];
}

static void check_bias_case(const bcase *bc, uint64_t salt)
{
    const fgt_case *c = &bc->c;
    bres r;
    run_bias_case(bc, salt, &r);
    const int f64 = c->dtype == FG_FP64;
    const int f32_side = (bc->bias_dt == FG_FP32 || bc->dbias_dt == FG_FP32);
    const double tol = f64 ? 1e-12 : 2e-5;
    const double tol_db = f64 ? (f32_side ? 1e-4 : 1e-12) : 1e-4;
#define BSHAPE                                                               \
    "bias %s %s dbias %s layout %d/%d, B=%lld Nq=%lld Nk=%lld H=%lld "       \
    "Hk=%lld d=%lld causal=%d win=%d cap=%g alibi=%d sparse=%g p=%g %s"
#define BARGS                                                                \
    bc_name(bc->bcast), fg_dtype_name(bc->bias_dt ? bc->bias_dt : c->dtype), \
        fg_dtype_name(bc->dbias_dt ? bc->dbias_dt : c->dtype), bc->layout,   \
        bc->dlayout, (long long)c->B, (long long)c->Nq, (long long)c->Nk,    \
        (long long)c->H, (long long)c->Hk, (long long)c->d, c->causal,       \
        c->window, c->softcap, c->alibi, c->sparse, c->p,                    \
        fg_dtype_name(c->dtype)
    ck_assert_msg(r.fwd == FG_OK && r.bwd == FG_OK, "%s", fg_last_error());
    ck_assert_msg(r.finite, "non-finite output, " BSHAPE, BARGS);
    ck_assert_msg(r.pad_ok, "dbias padding written, " BSHAPE, BARGS);
    ck_assert_msg(r.err_o <= tol, "O err %.3g, " BSHAPE, r.err_o, BARGS);
    ck_assert_msg(r.err_m <= tol, "m err %.3g, " BSHAPE, r.err_m, BARGS);
    ck_assert_msg(r.err_l <= tol, "l err %.3g, " BSHAPE, r.err_l, BARGS);
    ck_assert_msg(r.err_dq <= tol, "dQ err %.3g, " BSHAPE, r.err_dq, BARGS);
    ck_assert_msg(r.err_dk <= tol, "dK err %.3g, " BSHAPE, r.err_dk, BARGS);
    ck_assert_msg(r.err_dv <= tol, "dV err %.3g, " BSHAPE, r.err_dv, BARGS);
    ck_assert_msg(r.err_db <= tol_db, "dbias err %.3g, " BSHAPE, r.err_db,
                  BARGS);
    bres_free(&r);
}

/* Every broadcast pattern on a small GQA problem, both dtypes, with the
 * dtype of bias and dbias and their layouts varied. */
START_TEST(test_broadcast_patterns)
{
    for (int dt = 0; dt < 2; dt++) {
        bcase bc;
        memset(&bc, 0, sizeof bc);
        bc.c.B = 2; bc.c.H = 4; bc.c.Hk = 2; bc.c.d = 16;
        bc.c.Nq = 37; bc.c.Nk = 70;
        bc.c.block_q = 16; bc.c.block_k = 32;
        bc.c.dtype = dt ? FG_FP32 : FG_FP64;
        bc.bcast = _i;
        bc.layout = _i % 3;
        bc.dlayout = (_i + 1) % 3;
        if (!dt) { /* fp64 problems with an fp32 bias or dbias too */
            bc.bias_dt = _i % 4 == 1 ? FG_FP32 : 0;
            bc.dbias_dt = _i % 4 == 2 ? FG_FP32 : 0;
        }
        check_bias_case(&bc, 100 + (uint64_t)(_i * 2 + dt));
    }
}
END_TEST

/* The bias with each mask and score modifier. */
static bcase combo(int i)
{
    bcase bc;
    memset(&bc, 0, sizeof bc);
    fgt_case *c = &bc.c;
    c->B = 2; c->H = 2; c->Hk = 1; c->d = 16; c->Nq = 65; c->Nk = 90;
    switch (i) {
    case 0: /* [Nq, Nk], causal */
        bc.bcast = FGT_BC_B | FGT_BC_H; c->causal = 1;
        break;
    case 1: /* [H, Nq, Nk], window, BHSD */
        bc.bcast = FGT_BC_B; c->window = 1; c->window_left = 10;
        c->window_right = 5; c->bhsd = 1;
        break;
    case 2: /* [B, 1, 1, Nk] (key padding), ALiBi, top-left causal */
        bc.bcast = FGT_BC_H | FGT_BC_Q; c->alibi = 2; c->causal = 1;
        c->top_left = 1;
        break;
    case 3: /* [B, H, Nq, Nk], softcap */
        c->softcap = 3.0; bc.layout = FGT_BL_KMAJOR;
        break;
    case 4: /* [1, H, 1, Nk], dropout */
        bc.bcast = FGT_BC_B | FGT_BC_Q; c->p = 0.2; c->seed = 5; c->offset = 9;
        break;
    case 5: /* [B, H, Nq, Nk], block-sparse, MQA */
        c->Nq = 200; c->Nk = 260; c->H = 3; c->sparse = 0.6;
        break;
    case 6: /* [Nq, Nk], everything */
        bc.bcast = FGT_BC_B | FGT_BC_H; c->Nq = 150; c->Nk = 140; c->H = 4;
        c->Hk = 2; c->causal = 1; c->window = 1; c->window_left = 50;
        c->window_right = -1; c->alibi = 1; c->softcap = 4.0; c->p = 0.1;
        c->seed = 3; c->sparse = 0.8; c->bhsd = 1; bc.layout = FGT_BL_PADDED;
        break;
    default: /* -inf entries (a bias used as a mask), [B, 1, Nq, Nk] */
        bc.bcast = FGT_BC_H; bc.p_inf = 0.3; c->causal = 1;
        break;
    }
    return bc;
}
#define N_COMBOS 8

START_TEST(test_combinations)
{
    for (int dt = 0; dt < 2; dt++) {
        bcase bc = combo(_i);
        bc.c.dtype = dt ? FG_FP32 : FG_FP64;
        bc.c.block_q = dt ? 32 : 0;
        bc.c.block_k = dt ? 16 : 0;
        check_bias_case(&bc, 300 + (uint64_t)(_i * 2 + dt));
    }
}
END_TEST

/* Random shapes, patterns and variants on every run. */
START_TEST(test_random)
{
    fgt_rng rng = fgt_rng_for(777 + (uint64_t)_i);
    bcase bc;
    memset(&bc, 0, sizeof bc);
    fgt_case *c = &bc.c;
    c->B = fgt_int(&rng, 1, 2);
    c->Nq = fgt_int(&rng, 1, 130);
    c->Nk = fgt_int(&rng, 1, 130);
    c->Hk = fgt_int(&rng, 1, 2);
    c->H = c->Hk * fgt_int(&rng, 1, 2);
    c->d = 8 * fgt_int(&rng, 1, 3);
    c->causal = (int)fgt_int(&rng, 0, 1);
    c->top_left = (int)fgt_int(&rng, 0, 1);
    c->bhsd = (int)fgt_int(&rng, 0, 1);
    c->softcap = fgt_int(&rng, 0, 1) ? 1 + 4 * fabs(fgt_uniform(&rng)) : 0;
    c->alibi = (int)fgt_int(&rng, 0, 2);
    c->p = fgt_int(&rng, 0, 2) == 0 ? 0.15 : 0;
    c->seed = (uint64_t)fgt_int(&rng, 0, 1000);
    c->block_q = (int)fgt_int(&rng, 0, 40);
    c->block_k = (int)fgt_int(&rng, 0, 40);
    c->threads = (int)fgt_int(&rng, 0, 3);
    c->dtype = fgt_int(&rng, 0, 1) ? FG_FP32 : FG_FP64;
    bc.bcast = (int)fgt_int(&rng, 0, 15);
    bc.layout = (int)fgt_int(&rng, 0, 2);
    bc.dlayout = (int)fgt_int(&rng, 0, 2);
    check_bias_case(&bc, 900 + (uint64_t)_i);
}
END_TEST

/* A row whose keys all have a -inf bias behaves as a fully masked row:
 * O = 0, m = -inf, l = 0, dQ = 0, its dbias 0, no NaN anywhere. */
START_TEST(test_minus_inf_row)
{
    bcase bc;
    memset(&bc, 0, sizeof bc);
    bc.c.B = 1; bc.c.H = 2; bc.c.Hk = 1; bc.c.d = 8; bc.c.Nq = 9; bc.c.Nk = 12;
    bc.c.dtype = _i ? FG_FP32 : FG_FP64;
    bc.c.causal = _i;
    bc.special = 1;
    bres r;
    run_bias_case(&bc, 40 + (uint64_t)_i, &r);
    ck_assert_msg(r.fwd == FG_OK && r.bwd == FG_OK, "%s", fg_last_error());
    ck_assert(r.finite && r.pad_ok);
    ck_assert(isinf(r.m[3]) && r.m[3] < 0 && r.l[3] == 0);
    for (int64_t x = 0; x < bc.c.d; x++)
        ck_assert(r.o[3 * bc.c.H * bc.c.d + x] == 0);
    for (int64_t j = 0; j < bc.c.Nk; j++)
        ck_assert(r.db[3 * bc.c.Nk + j] == 0);
    const double tol = _i ? 2e-5 : 1e-12;
    ck_assert(r.err_o <= tol && r.err_dq <= tol && r.err_dk <= tol &&
              r.err_db <= (_i ? 1e-4 : 1e-12));
    bres_free(&r);
}
END_TEST

/* NaN in a visible pair's bias: that row's O, m, l and dbias are NaN, the
 * other rows finite. NaN in a masked pair's bias: never read. */
START_TEST(test_nan_bias)
{
    for (int visible = 0; visible < 2; visible++) {
        bcase bc;
        memset(&bc, 0, sizeof bc);
        bc.c.B = 1; bc.c.H = 1; bc.c.Hk = 1; bc.c.d = 8;
        bc.c.Nq = bc.c.Nk = 10;
        bc.c.causal = 1;
        bc.c.dtype = FG_FP64;
        bc.special = visible ? 2 : 3;
        bres r;
        run_bias_case(&bc, 60 + (uint64_t)visible, &r);
        ck_assert_msg(r.fwd == FG_OK && r.bwd == FG_OK, "%s", fg_last_error());
        ck_assert(r.pad_ok);
        for (int64_t i = 0; i < bc.c.Nq; i++) {
            const int nan_row = visible && i == 3;
            ck_assert_msg(isnan(r.o[i * bc.c.d]) == nan_row, "row %lld",
                          (long long)i);
            ck_assert(isnan(r.m[i]) == nan_row && isnan(r.l[i]) == nan_row);
            ck_assert(isnan(r.db[i * bc.c.Nk + 0]) == nan_row);
        }
        if (!visible)
            ck_assert(r.finite && r.err_o <= 1e-12 && r.err_db <= 1e-12 &&
                      r.err_dq <= 1e-12);
        bres_free(&r);
    }
}
END_TEST

/* dbias summed over broadcast dimensions is bit-identical for 1, 2 and 3
 * threads (and block sizes only change rounding, not the result's
 * determinism). */
START_TEST(test_threads_bitwise)
{
    const int patterns[3] = {FGT_BC_B | FGT_BC_H, FGT_BC_H | FGT_BC_Q, 0};
    bcase bc;
    memset(&bc, 0, sizeof bc);
    bc.c.B = 3; bc.c.H = 4; bc.c.Hk = 2; bc.c.d = 16; bc.c.Nq = 50;
    bc.c.Nk = 60; bc.c.dtype = FG_FP32; bc.c.p = 0.1; bc.c.seed = 4;
    bc.bcast = patterns[_i];
    bres r[3];
    for (int t = 0; t < 3; t++) {
        bc.c.threads = t + 1;
        run_bias_case(&bc, 80 + (uint64_t)_i, &r[t]);
        ck_assert_msg(r[t].fwd == FG_OK && r[t].bwd == FG_OK, "%s",
                      fg_last_error());
        ck_assert(r[t].err_db <= 1e-4);
    }
    int64_t ext[4] = {bc.bcast & FGT_BC_B ? 1 : bc.c.B,
                      bc.bcast & FGT_BC_H ? 1 : bc.c.H,
                      bc.bcast & FGT_BC_Q ? 1 : bc.c.Nq, bc.c.Nk};
    const size_t n = (size_t)(ext[0] * ext[1] * ext[2] * ext[3]);
    for (int t = 1; t < 3; t++)
        ck_assert(memcmp(r[0].db, r[t].db, n * sizeof(double)) == 0);
    for (int t = 0; t < 3; t++)
        bres_free(&r[t]);
}
END_TEST

/* Finite differences of L = sum(G * O) with respect to every stored bias
 * element against the backward's dbias (fp64; central differences,
 * |dbias - fd| <= 1e-7 + 1e-5 |fd|), through softcap, ALiBi and causal,
 * for a broadcast and a full bias. */
static double fd_loss(const fg_attn_params *p, const fg_attn_tensor *t,
                      const fg_attn_tensor *to, const fg_attn_stats *st,
                      const double *g, size_t n)
{
    ck_assert(fg_attention_forward(p, &t[0], &t[1], &t[2], to, st) == FG_OK);
    double L = 0;
    for (size_t e = 0; e < n; e++)
        L += g[e] * ((const double *)to->data)[e];
    return L;
}

START_TEST(test_dbias_finite_differences)
{
    const int64_t B = 2, H = 2, Nq = 6, Nk = 7, d = 8;
    const size_t nq = (size_t)(B * Nq * H * d), nk = (size_t)(B * Nk * d);
    fgt_rng rng = fgt_rng_for(123 + (uint64_t)_i);
    double *q = malloc(nq * 8), *k = malloc(nk * 8), *v = malloc(nk * 8);
    double *g = malloc(nq * 8), *o = malloc(nq * 8), *dq = malloc(nq * 8);
    double *dk = malloc(nk * 8), *dv = malloc(nk * 8);
    double m[24], l[24];
    fgt_fill(q, nq, &rng, 1.0);
    fgt_fill(k, nk, &rng, 1.0);
    fgt_fill(v, nk, &rng, 1.0);
    fgt_fill(g, nq, &rng, 1.0);
    fg_attn_tensor t[4] = {fg_attn_bshd(q, FG_FP64, Nq, H, d),
                           fg_attn_bshd(k, FG_FP64, Nk, 1, d),
                           fg_attn_bshd(v, FG_FP64, Nk, 1, d),
                           fg_attn_bshd(g, FG_FP64, Nq, H, d)};
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP64, Nq, H, d);
    fg_attn_tensor tdq = fg_attn_bshd(dq, FG_FP64, Nq, H, d);
    fg_attn_tensor tdk = fg_attn_bshd(dk, FG_FP64, Nk, 1, d);
    fg_attn_tensor tdv = fg_attn_bshd(dv, FG_FP64, Nk, 1, d);
    fg_attn_stats st = {m, l, FG_FP64};
    fgt_bias bias, dbias;
    const int bcast = _i ? 0 : FGT_BC_B | FGT_BC_Q;
    fgt_bias_init(&bias, B, H, Nq, Nk, bcast, FG_FP64, FGT_BL_PADDED);
    fgt_bias_fill(&bias, &rng, 1.0, 0);
    fgt_bias_init(&dbias, B, H, Nq, Nk, bcast, FG_FP64, FGT_BL_KMAJOR);
    float slopes[2] = {0.3f, 0.7f};
    fg_attn_params p;
    fg_attn_params_init(&p, B, Nq, Nk, H, 1, d);
    p.causal = 1;
    p.softcap = 2.0;
    p.alibi_slopes = slopes;
    p.bias = &bias.desc;
    p.dbias = &dbias.desc;
    fd_loss(&p, t, &to, &st, g, nq);
    ck_assert(fg_attention_backward(&p, &t[0], &t[1], &t[2], &to, &t[3], &st,
                                    &tdq, &tdk, &tdv) == FG_OK);
    double *ana = fgt_bias_read(&dbias);
    const double eps = 1e-6;
    for (size_t x = 0; x < fgt_bias_count(&bias); x++) {
        double *e = (double *)bias.host + fgt_bias_off(&bias, x);
        const double keep = *e;
        *e = keep + eps;
        const double lp = fd_loss(&p, t, &to, &st, g, nq);
        *e = keep - eps;
        const double lm = fd_loss(&p, t, &to, &st, g, nq);
        *e = keep;
        const double num = (lp - lm) / (2 * eps);
        ck_assert_msg(fabs(ana[x] - num) <= 1e-7 + 1e-5 * fabs(num),
                      "dbias[%zu] = %.10g, finite differences %.10g", x,
                      ana[x], num);
    }
    free(ana);
    fgt_bias_free(&bias);
    fgt_bias_free(&dbias);
    free(q); free(k); free(v); free(g); free(o); free(dq); free(dk); free(dv);
}
END_TEST

/* Bad bias/dbias arguments are refused with a message naming the problem,
 * and no output (O, m, l, dQ, dK, dV, dbias) is written. */
START_TEST(test_bad_arguments)
{
    const int64_t N = 16, H = 2, d = 8;
    const size_t n = (size_t)(N * H * d);
    float *in = calloc(n, 4), *out[4], m[32], l[32];
    for (int x = 0; x < 4; x++) {
        out[x] = malloc(n * 4);
        for (size_t e = 0; e < n; e++)
            out[x][e] = 1234.5f;
    }
    for (int x = 0; x < 32; x++)
        m[x] = l[x] = 1234.5f;
    float *bbuf = calloc((size_t)(N * N * H), 4), *dbuf = malloc(N * N * H * 4);
    for (int64_t e = 0; e < N * N * H; e++)
        dbuf[e] = 1234.5f;
    fg_attn_tensor t = fg_attn_bshd(in, FG_FP32, N, H, d);
    fg_attn_tensor to[4];
    for (int x = 0; x < 4; x++)
        to[x] = fg_attn_bshd(out[x], FG_FP32, N, H, d);
    fg_attn_stats st = {m, l, FG_FP32};
    const int32_t cu[2] = {0, (int32_t)N};
    struct { const char *want; int what; fg_status code; } bad[] = {
        {"bias dtype", 0, FG_ERR_INVALID_ARGUMENT},
        {"bias data is NULL", 1, FG_ERR_INVALID_ARGUMENT},
        {"bias has a negative stride", 2, FG_ERR_INVALID_ARGUMENT},
        {"bias strides overflow", 3, FG_ERR_INVALID_ARGUMENT},
        {"bias pointer", 4, FG_ERR_INVALID_ARGUMENT},
        {"bias overlaps an output", 5, FG_ERR_INVALID_ARGUMENT},
        {"bias with varlen", 6, FG_ERR_UNSUPPORTED},
        {"dbias is set but bias is NULL", 7, FG_ERR_INVALID_ARGUMENT},
        {"broadcast (zero stride) exactly", 8, FG_ERR_INVALID_ARGUMENT},
        {"distinct elements alias", 9, FG_ERR_INVALID_ARGUMENT},
        {"dbias overlaps bias", 10, FG_ERR_INVALID_ARGUMENT},
        {"dbias overlaps another operand", 11, FG_ERR_INVALID_ARGUMENT},
        {"dbias dtype", 12, FG_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_attn_params p;
        fg_attn_params_init(&p, 1, N, N, H, H, d);
        fg_attn_bias b = {bbuf, FG_FP32, 0, N * N, N, 1};
        fg_attn_bias db = {dbuf, FG_FP32, 0, N * N, N, 1};
        p.bias = &b;
        p.dbias = &db;
        switch (bad[i].what) {
        case 0: b.dtype = FG_FP64; break;
        case 1: b.data = NULL; break;
        case 2: b.stride_q = -1; break;
        case 3: b.stride_q = INT64_MAX / 4; break;
        case 4: b.data = (char *)bbuf + 2; break;
        case 5: b.data = out[0]; break;
        case 6: p.cu_seqlens_q = p.cu_seqlens_k = cu; break;
        case 7: p.bias = NULL; break;
        case 8: db.stride_h = 0; break;
        case 9: db.stride_q = 1; break;
        case 10: db.data = bbuf; break;
        case 11: db.data = out[1]; break;
        case 12: db.dtype = FG_BF16; break;
        }
        fg_status s1 = FG_OK;
        if (bad[i].what < 7) { /* the forward checks the bias, not dbias */
            s1 = fg_attention_forward(&p, &t, &t, &t, &to[0], &st);
            ck_assert_msg(s1 == bad[i].code, "case %zu: forward gave %d", i,
                          (int)s1);
            ck_assert_msg(strstr(fg_last_error(), bad[i].want),
                          "case %zu: '%s'", i, fg_last_error());
        }
        s1 = fg_attention_backward(&p, &t, &t, &t, &t, &t, &st, &to[1],
                                   &to[2], &to[3]);
        ck_assert_msg(s1 == bad[i].code, "case %zu: backward gave %d", i,
                      (int)s1);
        ck_assert_msg(strstr(fg_last_error(), bad[i].want), "case %zu: '%s'",
                      i, fg_last_error());
        for (int x = 0; x < 4; x++)
            for (size_t e = 0; e < n; e++)
                ck_assert(out[x][e] == 1234.5f);
        for (int x = 0; x < 32; x++)
            ck_assert(m[x] == 1234.5f && l[x] == 1234.5f);
        for (int64_t e = 0; e < N * N * H; e++)
            ck_assert(dbuf[e] == 1234.5f);
    }
    /* The forward ignores dbias entirely (even a bad one). */
    {
        fg_attn_params p;
        fg_attn_params_init(&p, 1, N, N, H, H, d);
        fg_attn_bias b = {bbuf, FG_FP32, 0, N * N, N, 1};
        fg_attn_bias db = {NULL, FG_FP16, -1, 0, 0, 0};
        p.bias = &b;
        p.dbias = &db;
        ck_assert(fg_attention_forward(&p, &t, &t, &t, &to[0], &st) == FG_OK);
    }
    free(in); free(bbuf); free(dbuf);
    for (int x = 0; x < 4; x++)
        free(out[x]);
}
END_TEST

/* ---- the autograd op ---------------------------------------------------- */

static fg_status bias_attn_fn(fg_tensor *const *in, int n, fg_tensor **out,
                              void *u)
{
    fg_attention_options o = *(const fg_attention_options *)u;
    o.bias = n > 3 ? in[3] : NULL;
    return fg_attention(in[0], in[1], in[2], &o, out);
}

static fg_tensor *rand_tensor(fgt_rng *r, int nd, const int64_t *shape,
                              int requires_grad)
{
    int64_t n = 1;
    for (int x = 0; x < nd; x++)
        n *= shape[x];
    double *h = malloc(sizeof(double) * (size_t)n);
    fgt_fill(h, (size_t)n, r, 1.0);
    fg_tensor *t = NULL;
    ck_assert(fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU, nd, shape, h, &t) ==
              FG_OK);
    free(h);
    ck_assert(fg_tensor_set_requires_grad(t, requires_grad) == FG_OK);
    return t;
}

/* fg_gradcheck of fg_attention with a bias that requires grad (and of q,
 * k, v), for biases of rank 2, 3 and 4 with broadcast dimensions, through
 * causal, softcap, ALiBi, dropout and GQA; full Jacobians in fp64 with
 * gradcheck's default tolerances (atol 1e-5, rtol 1e-3). */
START_TEST(test_autograd_gradcheck)
{
    static const float slopes[2] = {0.3f, 0.6f};
    const int64_t B = 2, Nq = 4, Nk = 5, H = 2, Hk = 1, d = 8;
    const int64_t shapes[3][4] = {{Nq, Nk}, {H, Nq, Nk}, {B, 1, 1, Nk}};
    const int nds[3] = {2, 3, 4};
    fgt_rng r = fgt_rng_for(1200 + (uint64_t)_i);
    fg_attention_options o;
    fg_attention_options_init(&o);
    o.causal = _i != 1;
    o.softcap = _i == 1 ? 2.0 : 0;
    o.alibi_slopes = _i == 2 ? slopes : NULL;
    o.dropout_p = _i == 2 ? 0.2 : 0;
    o.seed = 17;
    fg_tensor *in[4] = {
        rand_tensor(&r, 4, (int64_t[]){B, Nq, H, d}, 1),
        rand_tensor(&r, 4, (int64_t[]){B, Nk, Hk, d}, 1),
        rand_tensor(&r, 4, (int64_t[]){B, Nk, Hk, d}, 1),
        rand_tensor(&r, nds[_i], shapes[_i], 1)};
    fg_gradcheck_report rep;
    ck_assert_msg(fg_gradcheck(bias_attn_fn, &o, in, 4, NULL, &rep) == FG_OK,
                  "%s", fg_last_error());
    ck_assert_msg(rep.passed, "bias rank %d: %s", nds[_i], rep.message);
    ck_assert(rep.n_checked > 0);
    /* A bias that does not require grad gets none; the op still works. */
    ck_assert(fg_tensor_set_requires_grad(in[3], 0) == FG_OK);
    ck_assert(fg_gradcheck(bias_attn_fn, &o, in, 4, NULL, &rep) == FG_OK);
    ck_assert_msg(rep.passed, "%s", rep.message);
    /* A bias that does not broadcast is refused. */
    fg_tensor *bad = rand_tensor(&r, 2, (int64_t[]){Nq + 1, Nk}, 0), *out = NULL;
    o.bias = bad;
    ck_assert(fg_attention(in[0], in[1], in[2], &o, &out) ==
              FG_ERR_INVALID_ARGUMENT);
    ck_assert(out == NULL && strstr(fg_last_error(), "bias dimension 2"));
    fg_tensor_free(bad);
    for (int x = 0; x < 4; x++)
        fg_tensor_free(in[x]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention_bias");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    fgt_add_loop(tc, test_broadcast_patterns, 0, 16);
    fgt_add_loop(tc, test_combinations, 0, N_COMBOS);
    fgt_add_loop(tc, test_random, 0, 12);
    fgt_add_loop(tc, test_minus_inf_row, 0, 2);
    fgt_add_test(tc, test_nan_bias);
    fgt_add_loop(tc, test_threads_bitwise, 0, 3);
    fgt_add_loop(tc, test_dbias_finite_differences, 0, 2);
    fgt_add_test(tc, test_bad_arguments);
    fgt_add_loop(tc, test_autograd_gradcheck, 0, 3);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
