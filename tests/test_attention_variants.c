/* SPDX-License-Identifier: MIT */
/* tests/test_attention_variants.c - the attention variants on the CPU
 * (sliding window, top-left causal, softcap, ALiBi, block-sparse, and their
 * combinations with dropout and GQA) against the naive fp64 reference,
 * which writes the mask and the score modifiers out pair by pair from
 * attention.h (independent of the tiled code and of the block-list
 * builder: it reads the dense block map). Also: fully masked rows, NaN
 * propagation and the rejection of bad parameters.
 * Tolerances (max-abs error relative to max |reference|): fp64 1e-12,
 * fp32 2e-5 (softcap's tanh adds a few ulps). */
#include <check.h>

#include "attn_harness.h"

#define TOL_F64 1e-12
#define TOL_F32 2e-5

static void check_case(const fgt_case *c, uint64_t salt)
{
    fgt_result r;
    fgt_run_case(c, salt, 1, &r);
    const double tol = c->dtype == FG_FP64 ? TOL_F64 : TOL_F32;
#define VSHAPE                                                               \
    "B=%lld Nq=%lld Nk=%lld H=%lld Hk=%lld d=%lld causal=%d tl=%d win=%d "   \
    "(%lld,%lld) cap=%g alibi=%d sparse=%g p=%g %s Br=%d Bc=%d"
#define VARGS                                                                \
    (long long)c->B, (long long)c->Nq, (long long)c->Nk, (long long)c->H,   \
        (long long)c->Hk, (long long)c->d, c->causal, c->top_left, c->window, \
        (long long)c->window_left, (long long)c->window_right, c->softcap,   \
        c->alibi, c->sparse, c->p, fg_dtype_name(c->dtype), c->block_q,      \
        c->block_k
    ck_assert_msg(r.fwd == FG_OK, "forward failed: %s", fg_last_error());
    ck_assert_msg(r.bwd == FG_OK, "backward failed: %s", fg_last_error());
    ck_assert_msg(r.finite, "non-finite output, " VSHAPE, VARGS);
    ck_assert_msg(r.err_o <= tol, "O err %.3g, " VSHAPE, r.err_o, VARGS);
    ck_assert_msg(r.err_m <= tol, "m err %.3g, " VSHAPE, r.err_m, VARGS);
    ck_assert_msg(r.err_l <= tol, "l err %.3g, " VSHAPE, r.err_l, VARGS);
    ck_assert_msg(r.err_dq <= tol, "dQ err %.3g, " VSHAPE, r.err_dq, VARGS);
    ck_assert_msg(r.err_dk <= tol, "dK err %.3g, " VSHAPE, r.err_dk, VARGS);
    ck_assert_msg(r.err_dv <= tol, "dV err %.3g, " VSHAPE, r.err_dv, VARGS);
    fgt_result_free(&r);
}

/* Each option alone, then combinations; sizes straddle the 128-block and
 * tile boundaries (127, 128, 129, 257) and Nq != Nk both ways. */
static fgt_case variant(int i)
{
    fgt_case c = {0};
    c.B = 1; c.H = 2; c.Hk = 1; c.d = 16;
    switch (i) {
    case 0: /* sliding window, symmetric */
        c.Nq = c.Nk = 129; c.window = 1; c.window_left = 20; c.window_right = 20;
        break;
    case 1: /* causal + window (a left window), Nq < Nk */
        c.Nq = 97; c.Nk = 257; c.causal = 1; c.window = 1;
        c.window_left = 31; c.window_right = -1;
        break;
    case 2: /* top-left causal, Nq > Nk */
        c.Nq = 257; c.Nk = 97; c.causal = 1; c.top_left = 1;
        break;
    case 3: /* top-left causal, Nq < Nk */
        c.Nq = 100; c.Nk = 300; c.causal = 1; c.top_left = 1; c.H = 3; c.Hk = 3;
        break;
    case 4: /* softcap */
        c.Nq = c.Nk = 128; c.softcap = 2.0; c.d = 32;
        break;
    case 5: /* ALiBi [H], causal */
        c.Nq = c.Nk = 127; c.causal = 1; c.alibi = 1; c.H = 4; c.Hk = 2;
        break;
    case 6: /* ALiBi [B, H], not causal, Nq != Nk */
        c.B = 2; c.Nq = 60; c.Nk = 200; c.alibi = 2;
        break;
    case 7: /* block-sparse, per (b, h) map */
        c.B = 2; c.Nq = c.Nk = 300; c.sparse = 0.5;
        break;
    case 8: /* block-sparse, broadcast map, causal */
        c.Nq = 257; c.Nk = 384; c.sparse = 0.6; c.map_bcast = 1; c.causal = 1;
        break;
    case 9: /* window + ALiBi + softcap + dropout + GQA */
        c.B = 2; c.Nq = c.Nk = 150; c.H = 4; c.Hk = 2; c.window = 1;
        c.window_left = 40; c.window_right = 10; c.alibi = 1; c.softcap = 5.0;
        c.p = 0.2; c.seed = 7; c.offset = 3;
        break;
    case 10: /* everything at once, top-left, block-sparse */
        c.Nq = 200; c.Nk = 260; c.H = 4; c.Hk = 1; c.causal = 1; c.top_left = 1;
        c.window = 1; c.window_left = 90; c.window_right = -1; c.alibi = 2;
        c.softcap = 3.0; c.sparse = 0.7; c.p = 0.1; c.seed = 11; c.bhsd = 1;
        break;
    default: /* a window of width 0 right of the diagonal only */
        c.Nq = c.Nk = 70; c.window = 1; c.window_left = 0; c.window_right = 0;
        break;
    }
    return c;
}
#define N_VARIANTS 12

START_TEST(test_variant_grid)
{
    const int blocks[][2] = {{0, 0}, {16, 16}, {7, 13}, {64, 5}};
    for (int dt = 0; dt < 2; dt++) {
        fgt_case c = variant(_i);
        c.dtype = dt ? FG_FP32 : FG_FP64;
        c.block_q = blocks[(_i + dt) % 4][0];
        c.block_k = blocks[(_i + dt) % 4][1];
        check_case(&c, 9000 + (uint64_t)_i * 2 + (uint64_t)dt);
    }
}
END_TEST

/* Random combinations on every run, drawn from the test seed. */
START_TEST(test_random_variants)
{
    fgt_rng rng = fgt_rng_for(313 + (uint64_t)_i);
    fgt_case c = {0};
    c.B = fgt_int(&rng, 1, 2);
    c.Nq = fgt_int(&rng, 1, 300);
    c.Nk = fgt_int(&rng, 1, 300);
    c.Hk = fgt_int(&rng, 1, 2);
    c.H = c.Hk * fgt_int(&rng, 1, 2);
    c.d = 8 * fgt_int(&rng, 1, 4);
    c.causal = (int)fgt_int(&rng, 0, 1);
    c.top_left = (int)fgt_int(&rng, 0, 1);
    c.bhsd = (int)fgt_int(&rng, 0, 1);
    c.window = (int)fgt_int(&rng, 0, 1);
    c.window_left = fgt_int(&rng, -1, 80);
    c.window_right = fgt_int(&rng, -1, 80);
    c.softcap = fgt_int(&rng, 0, 1) ? 0.5 + 5 * fabs(fgt_uniform(&rng)) : 0;
    c.alibi = (int)fgt_int(&rng, 0, 2);
    c.sparse = fgt_int(&rng, 0, 1) ? 0.3 + 0.6 * fabs(fgt_uniform(&rng)) : 0;
    c.map_bcast = (int)fgt_int(&rng, 0, 1);
    c.p = fgt_int(&rng, 0, 2) == 0 ? 0.15 : 0;
    c.seed = (uint64_t)fgt_int(&rng, 0, 1000);
    c.block_q = (int)fgt_int(&rng, 0, 70);
    c.block_k = (int)fgt_int(&rng, 0, 70);
    c.dtype = fgt_int(&rng, 0, 1) ? FG_FP32 : FG_FP64;
    check_case(&c, 7000 + (uint64_t)_i);
}
END_TEST

/* A window that excludes every key of some rows, and an all-zero block
 * map: those rows give O = 0, m = -inf, l = 0, dQ = 0, no NaN. */
START_TEST(test_fully_masked_rows)
{
    fgt_case cases[2] = {{0}, {0}};
    cases[0].B = 1; cases[0].Nq = 50; cases[0].Nk = 20; cases[0].H = 2;
    cases[0].Hk = 2; cases[0].d = 8; cases[0].window = 1;
    cases[0].window_left = 3; cases[0].window_right = 3; /* rows far below */
    cases[0].top_left = 1;
    cases[1] = cases[0];
    cases[1].window = 0;
    cases[1].sparse = 1e-9; /* nothing listed */
    for (int i = 0; i < 2; i++) {
        for (int dt = 0; dt < 2; dt++) {
            fgt_case c = cases[i];
            c.dtype = dt ? FG_FP32 : FG_FP64;
            fgt_result r;
            fgt_run_case(&c, 400 + (uint64_t)(i * 2 + dt), 1, &r);
            ck_assert_msg(r.fwd == FG_OK && r.bwd == FG_OK, "%s",
                          fg_last_error());
            ck_assert(r.finite);
            int masked = 0;
            for (int64_t row = 0; row < c.B * c.H * c.Nq; row++) {
                if (r.rl[row] != 0)
                    continue;
                masked++;
                ck_assert(isinf(r.m[row]) && r.m[row] < 0 && r.l[row] == 0);
                const int64_t b = row / (c.H * c.Nq), h = row / c.Nq % c.H,
                              q = row % c.Nq;
                for (int64_t x = 0; x < c.d; x++) {
                    const size_t at = (size_t)(((b * c.Nq + q) * c.H + h) * c.d + x);
                    ck_assert(r.o[at] == 0 && r.dq[at] == 0);
                }
            }
            ck_assert_msg(masked > 0, "case %d masks no row", i);
            ck_assert(r.err_o <= TOL_F32 && r.err_dk <= TOL_F32);
            fgt_result_free(&r);
        }
    }
}
END_TEST

/* NaN in, NaN out: a NaN in one query row makes that row NaN (not a masked
 * row), and a NaN in one key makes every row that sees it NaN, gradients
 * included; rows that do not see the key stay finite. */
START_TEST(test_nan_propagates)
{
    const int64_t B = 1, N = 40, H = 1, d = 8;
    const size_t n = (size_t)(B * N * H * d);
    fgt_rng rng = fgt_rng_for(55);
    double *buf[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = malloc(sizeof(double) * n);
        fgt_fill(buf[i], n, &rng, 1.0);
    }
    buf[0][5 * d + 2] = NAN;  /* query row 5 */
    buf[1][20 * d + 1] = NAN; /* key 20 */
    double *o = malloc(sizeof(double) * n), *dq = malloc(sizeof(double) * n);
    double *dk = malloc(sizeof(double) * n), *dv = malloc(sizeof(double) * n);
    double m[40], l[40];
    fg_attn_params p;
    fg_attn_params_init(&p, B, N, N, H, H, d);
    p.causal = 1; /* rows < 20 never see key 20 */
    fg_attn_tensor tq = fg_attn_bshd(buf[0], FG_FP64, N, H, d);
    fg_attn_tensor tk = fg_attn_bshd(buf[1], FG_FP64, N, H, d);
    fg_attn_tensor tv = fg_attn_bshd(buf[2], FG_FP64, N, H, d);
    fg_attn_tensor tg = fg_attn_bshd(buf[3], FG_FP64, N, H, d);
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP64, N, H, d);
    fg_attn_tensor tdq = fg_attn_bshd(dq, FG_FP64, N, H, d);
    fg_attn_tensor tdk = fg_attn_bshd(dk, FG_FP64, N, H, d);
    fg_attn_tensor tdv = fg_attn_bshd(dv, FG_FP64, N, H, d);
    fg_attn_stats st = {m, l, FG_FP64};
    ck_assert(fg_attention_forward(&p, &tq, &tk, &tv, &to, &st) == FG_OK);
    ck_assert(fg_attention_backward(&p, &tq, &tk, &tv, &to, &tg, &st, &tdq,
                                    &tdk, &tdv) == FG_OK);
    for (int64_t i = 0; i < N; i++) {
        const int nan_row = i == 5 || i >= 20;
        ck_assert_msg(isnan(o[i * d]) == nan_row, "row %lld O", (long long)i);
        ck_assert_msg(isnan(m[i]) == nan_row, "row %lld m", (long long)i);
        ck_assert_msg(isnan(dq[i * d]) == nan_row, "row %lld dQ", (long long)i);
    }
    /* Key 20 is seen by the NaN rows; key 5 by row 5 (NaN). */
    ck_assert(isnan(dk[20 * d]) && isnan(dv[20 * d]) && isnan(dk[5 * d]));
    for (int i = 0; i < 4; i++)
        free(buf[i]);
    free(o); free(dq); free(dk); free(dv);
}
END_TEST

/* Bad variant parameters are refused with a message naming the field, and
 * nothing is written. */
START_TEST(test_bad_parameters)
{
    const int64_t N = 130, d = 8;
    const size_t n = (size_t)(N * d);
    float *q = calloc(n, 4), *o = malloc(n * 4), m[130], l[130];
    for (size_t i = 0; i < n; i++)
        o[i] = 1234.5f;
    fg_attn_tensor t = fg_attn_bshd(q, FG_FP32, N, 1, d);
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP32, N, 1, d);
    fg_attn_stats st = {m, l, FG_FP32};
    float slopes[2] = {0.5f, NAN};
    int32_t lists[64] = {0};
    fg_attn_block_mask bm = {1, 1, 2, 2, lists, lists + 2, lists + 8, lists + 10};
    struct { const char *want; int what; } bad[] = {
        {"window_left", 0}, {"window_left", 1}, {"softcap", 2},
        {"softcap", 3}, {"alibi_slopes[1]", 4}, {"alibi_stride_b", 5},
        {"causal_align", 6}, {"block_mask is", 7}, {"block_mask kv", 8},
        {"block_mask", 9},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_attn_params p;
        fg_attn_params_init(&p, 1, N, N, 2, 2, d);
        p.heads_q = p.heads_kv = 1;
        switch (bad[i].what) {
        case 0: p.window_left = -2; break;
        case 1: p.window_right = -7; p.window_left = -5; break;
        case 2: p.softcap = -1; break;
        case 3: p.softcap = INFINITY; break;
        case 4: p.heads_q = p.heads_kv = 1; p.alibi_slopes = slopes;
                p.alibi_stride_b = 0; p.batch = 1;
                slopes[0] = NAN; break;
        case 5: p.alibi_slopes = slopes; p.alibi_stride_b = 3; break;
        case 6: p.causal_align = 2; break;
        case 7: bm.q_blocks = 3; p.block_mask = &bm; break;
        case 8: bm.q_blocks = 2; lists[0] = 5; p.block_mask = &bm; break;
        case 9: lists[0] = 1; lists[2] = 0; lists[8] = 0; p.block_mask = &bm;
                break; /* kv lists name (0,0), q lists nothing */
        }
        ck_assert_msg(fg_attention_forward(&p, &t, &t, &t, &to, &st) ==
                          FG_ERR_INVALID_ARGUMENT,
                      "case %zu accepted", i);
        const char *msg = fg_last_error();
        ck_assert_msg(strstr(msg, i == 4 ? "alibi_slopes[0]" : bad[i].want),
                      "case %zu: message '%s'", i, msg);
        for (size_t x = 0; x < n; x++)
            ck_assert(o[x] == 1234.5f);
    }
    free(q);
    free(o);
}
END_TEST

/* The builder's lists against a dense map, both views, with broadcast. */
START_TEST(test_block_mask_build)
{
    fgt_rng rng = fgt_rng_for(21);
    const int64_t mb = 2, mh = 3, nqb = 5, nkb = 7;
    uint8_t map[2 * 3 * 5 * 7];
    for (size_t i = 0; i < sizeof map; i++)
        map[i] = fgt_uniform(&rng) < 0.0;
    const int64_t need = fg_attn_block_mask_storage(mb, mh, nqb, nkb);
    ck_assert_int_eq(need, mb * mh * (nqb + nkb + 2 * nqb * nkb));
    int32_t *st = malloc(sizeof(int32_t) * (size_t)need);
    fg_attn_block_mask m;
    ck_assert(fg_attn_block_mask_build(&m, map, mb, mh, nqb, nkb, st,
                                       FG_DEVICE_CPU) == FG_OK);
    for (int64_t bh = 0; bh < mb * mh; bh++) {
        for (int64_t qb = 0; qb < nqb; qb++) {
            int32_t c = 0;
            for (int64_t kb = 0; kb < nkb; kb++)
                if (map[(bh * nqb + qb) * nkb + kb])
                    ck_assert_int_eq(m.kv_index[(bh * nqb + qb) * nkb + c++], kb);
            ck_assert_int_eq(m.kv_count[bh * nqb + qb], c);
        }
        for (int64_t kb = 0; kb < nkb; kb++) {
            int32_t c = 0;
            for (int64_t qb = 0; qb < nqb; qb++)
                if (map[(bh * nqb + qb) * nkb + kb])
                    ck_assert_int_eq(m.q_index[(bh * nkb + kb) * nqb + c++], qb);
            ck_assert_int_eq(m.q_count[bh * nkb + kb], c);
        }
    }
    ck_assert(fg_attn_block_mask_storage(0, 1, 1, 1) < 0);
    ck_assert(fg_attn_block_mask_storage(1, INT64_MAX / 2, 1 << 20, 1 << 20) < 0);
    ck_assert(fg_attn_block_mask_build(&m, NULL, mb, mh, nqb, nkb, st,
                                       FG_DEVICE_CPU) == FG_ERR_INVALID_ARGUMENT);
    free(st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention_variants");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    fgt_add_loop(tc, test_variant_grid, 0, N_VARIANTS);
    fgt_add_loop(tc, test_random_variants, 0, 16);
    fgt_add_test(tc, test_fully_masked_rows);
    fgt_add_test(tc, test_nan_propagates);
    fgt_add_test(tc, test_bad_parameters);
    fgt_add_test(tc, test_block_mask_build);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
