/* SPDX-License-Identifier: MIT */
/* tests/test_attention_cpu.c - the tiled CPU attention against the naive
 * fp64 reference: forward (O, m, l) and backward (dQ, dK, dV) over a grid of
 * shapes, layouts, GQA, causal alignment, block sizes and dtypes.
 * Tolerances (max-abs error relative to max |reference|): fp64 1e-12,
 * fp32 1e-5. */
#include <check.h>

#include "attn_harness.h"

#define TOL_F64 1e-12
#define TOL_F32 1e-5

static double tol_for(fg_dtype dt) { return dt == FG_FP64 ? TOL_F64 : TOL_F32; }

static void check_case(const fgt_case *c, uint64_t salt)
{
    fgt_result r;
    fgt_run_case(c, salt, 1, &r);
    const double tol = tol_for(c->dtype);
    ck_assert_msg(r.fwd == FG_OK, "forward failed: %s", fg_last_error());
    ck_assert_msg(r.bwd == FG_OK, "backward failed: %s", fg_last_error());
#define SHAPE                                                                \
    "B=%lld Nq=%lld Nk=%lld H=%lld Hk=%lld d=%lld causal=%d bhsd=%d %s p=%g " \
    "Br=%d Bc=%d"
#define SHAPE_ARGS                                                         \
    (long long)c->B, (long long)c->Nq, (long long)c->Nk, (long long)c->H,  \
        (long long)c->Hk, (long long)c->d, c->causal, c->bhsd,              \
        fg_dtype_name(c->dtype), c->p, c->block_q, c->block_k
    ck_assert_msg(r.finite, "non-finite output, " SHAPE, SHAPE_ARGS);
    ck_assert_msg(r.err_o <= tol, "O err %.3g > %.1g, " SHAPE, r.err_o, tol,
                  SHAPE_ARGS);
    ck_assert_msg(r.err_m <= tol, "m err %.3g, " SHAPE, r.err_m, SHAPE_ARGS);
    ck_assert_msg(r.err_l <= tol, "l err %.3g, " SHAPE, r.err_l, SHAPE_ARGS);
    ck_assert_msg(r.err_dq <= tol, "dQ err %.3g, " SHAPE, r.err_dq, SHAPE_ARGS);
    ck_assert_msg(r.err_dk <= tol, "dK err %.3g, " SHAPE, r.err_dk, SHAPE_ARGS);
    ck_assert_msg(r.err_dv <= tol, "dV err %.3g, " SHAPE, r.err_dv, SHAPE_ARGS);
    fgt_result_free(&r);
}

/* Shapes from the issue: N in {1, 17, 97, 257, 1025}, Nq != Nk both ways,
 * d in {8, 16, 40, 64, 128, 256}, GQA, causal, both layouts, blocks that do
 * not divide N. Each loop index runs the case in fp64 and fp32. */
static const fgt_case grid[] = {
    /* B Nq Nk H Hk d causal bhsd */
    {1, 1, 1, 1, 1, 8, 0, 0},
    {1, 1, 1, 1, 1, 8, 1, 1},
    {2, 17, 17, 3, 3, 16, 0, 0},
    {2, 17, 17, 3, 3, 16, 1, 1},
    {1, 97, 97, 2, 1, 40, 1, 0},
    {1, 97, 33, 4, 2, 64, 0, 1},
    {1, 33, 97, 4, 2, 64, 1, 0},
    {1, 257, 257, 2, 2, 128, 1, 1},
    {1, 257, 17, 2, 1, 8, 1, 0},   /* Nq > Nk: fully masked rows */
    {1, 17, 257, 3, 1, 40, 1, 1},
    {1, 1025, 1025, 1, 1, 64, 1, 0},
    {1, 97, 257, 2, 2, 256, 0, 0},
    {1, 257, 97, 2, 2, 256, 1, 1},
    {3, 1, 97, 4, 4, 16, 1, 0},
    {2, 97, 1, 2, 1, 16, 1, 1},
};

START_TEST(test_grid)
{
    const int blocks[][2] = {{0, 0}, {16, 16}, {7, 13}, {64, 5}, {1, 1}};
    for (int dt = 0; dt < 2; dt++) {
        fgt_case c = grid[_i];
        c.dtype = dt ? FG_FP32 : FG_FP64;
        c.block_q = blocks[_i % 5][0];
        c.block_k = blocks[_i % 5][1];
        if (c.Nq * c.Nk > 100000 && c.block_q == 1)
            c.block_q = 3; /* keep the long cases fast */
        check_case(&c, 1000 + (uint64_t)_i * 2 + (uint64_t)dt);
    }
}
END_TEST

/* Random shapes on every run, drawn from the test seed. */
START_TEST(test_random_shapes)
{
    fgt_rng rng = fgt_rng_for(77 + (uint64_t)_i);
    fgt_case c = {0};
    c.B = fgt_int(&rng, 1, 3);
    c.Nq = fgt_int(&rng, 1, 150);
    c.Nk = fgt_int(&rng, 1, 150);
    c.Hk = fgt_int(&rng, 1, 3);
    c.H = c.Hk * fgt_int(&rng, 1, 3);
    c.d = 8 * fgt_int(&rng, 1, 12);
    c.causal = (int)fgt_int(&rng, 0, 1);
    c.bhsd = (int)fgt_int(&rng, 0, 1);
    c.block_q = (int)fgt_int(&rng, 1, 70);
    c.block_k = (int)fgt_int(&rng, 1, 70);
    c.dtype = fgt_int(&rng, 0, 1) ? FG_FP32 : FG_FP64;
    check_case(&c, 5000 + (uint64_t)_i);
}
END_TEST

/* Explicit scale, and results identical (bitwise) for any thread count. */
START_TEST(test_threads_deterministic)
{
    fgt_case c = {2, 130, 70, 4, 2, 32, 1, 0, FG_FP32};
    c.scale = 0.3;
    fgt_result r1, r2;
    c.threads = 1;
    fgt_run_case(&c, 42, 1, &r1);
    c.threads = 3;
    fgt_run_case(&c, 42, 1, &r2);
    ck_assert(r1.fwd == FG_OK && r2.fwd == FG_OK);
    ck_assert(r1.bwd == FG_OK && r2.bwd == FG_OK);
    ck_assert(r1.err_o <= TOL_F32 && r1.err_dq <= TOL_F32);
    ck_assert(memcmp(r1.o, r2.o, r1.nq * sizeof(double)) == 0);
    ck_assert(memcmp(r1.dq, r2.dq, r1.nq * sizeof(double)) == 0);
    ck_assert(memcmp(r1.dk, r2.dk, r1.nk * sizeof(double)) == 0);
    ck_assert(memcmp(r1.dv, r2.dv, r1.nk * sizeof(double)) == 0);
    fgt_result_free(&r1);
    fgt_result_free(&r2);
}
END_TEST

/* Nq > Nk with bottom-right causal: the first Nq - Nk rows see no key.
 * They must give O = 0, m = -inf, l = 0, zero dQ, and no NaN anywhere. */
START_TEST(test_fully_masked_rows)
{
    for (int dt = 0; dt < 2; dt++) {
        for (int drop = 0; drop < 2; drop++) {
            fgt_case c = {2, 40, 13, 2, 1, 16, 1, (int)dt, dt ? FG_FP32 : FG_FP64};
            c.p = drop ? 0.3 : 0.0;
            c.seed = 9;
            c.block_q = 8;
            c.block_k = 8;
            fgt_result r;
            fgt_run_case(&c, 300 + (uint64_t)dt, 1, &r);
            ck_assert(r.fwd == FG_OK && r.bwd == FG_OK);
            ck_assert_msg(r.finite, "NaN/inf in O or gradients");
            ck_assert(r.err_o <= tol_for(c.dtype));
            ck_assert(r.err_dq <= tol_for(c.dtype));
            ck_assert(r.err_dk <= tol_for(c.dtype));
            ck_assert(r.err_dv <= tol_for(c.dtype));
            for (int64_t b = 0; b < c.B; b++)
                for (int64_t h = 0; h < c.H; h++)
                    for (int64_t i = 0; i < c.Nq - c.Nk; i++) {
                        size_t srow = (size_t)((b * c.H + h) * c.Nq + i);
                        ck_assert(isinf(r.m[srow]) && r.m[srow] < 0);
                        ck_assert(r.l[srow] == 0.0);
                        for (int64_t x = 0; x < c.d; x++) {
                            size_t e = (size_t)(((b * c.Nq + i) * c.H + h) * c.d + x);
                            ck_assert(r.o[e] == 0.0);
                            ck_assert(r.dq[e] == 0.0);
                        }
                    }
            fgt_result_free(&r);
        }
    }
}
END_TEST

/* Logits up to about +-1e4: the online softmax must not overflow. */
START_TEST(test_large_logits)
{
    for (int dt = 0; dt < 2; dt++) {
        fgt_case c = {1, 70, 90, 2, 2, 64, (int)dt, 0, dt ? FG_FP32 : FG_FP64};
        c.amp = 100; /* |q.k| * scale up to ~1e4 */
        c.block_k = 16;
        fgt_result r;
        fgt_run_case(&c, 700 + (uint64_t)dt, 1, &r);
        ck_assert(r.fwd == FG_OK && r.bwd == FG_OK);
        ck_assert_msg(r.finite, "overflow with large logits");
        double maxm = 0;
        for (size_t i = 0; i < r.ns; i++)
            if (fabs(r.m[i]) > maxm)
                maxm = fabs(r.m[i]);
        ck_assert_msg(maxm > 1000, "test did not reach large logits (%g)", maxm);
        /* Logits of 1e4 carry an absolute rounding error of ~1e4 * eps in
         * S, which exp() turns into a relative error of P: the bound is
         * that condition number, not the usual tolerance. */
        ck_assert_msg(r.err_o <= (dt ? 5e-2 : 1e-9), "O err %g", r.err_o);
        fgt_result_free(&r);
    }
}
END_TEST

/* m and l are exactly the naive row max and row sum of exp(S - m). */
START_TEST(test_stats_match_naive)
{
    fgt_case c = {2, 50, 61, 3, 3, 24, 1, 1, FG_FP64};
    c.block_q = 9;
    c.block_k = 11;
    fgt_result r;
    fgt_run_case(&c, 900, 0, &r);
    ck_assert(r.fwd == FG_OK);
    ck_assert_msg(r.err_m <= 1e-14, "m err %g", r.err_m);
    ck_assert_msg(r.err_l <= 1e-12, "l err %g", r.err_l);
    fgt_result_free(&r);
}
END_TEST

/* Packed QKV ([B, N, 3, H, d]) with a packed dQKV output: strided operands
 * that interleave in one buffer are legal and must not be taken as aliasing. */
START_TEST(test_packed_qkv)
{
    const int64_t B = 2, N = 37, H = 2, d = 16, row = 3 * H * d;
    const size_t n = (size_t)(B * N * row);
    fgt_rng rng = fgt_rng_for(1234);
    double *qkv = malloc(n * sizeof(double)), *dqkv = malloc(n * sizeof(double));
    double *o = malloc(n / 3 * sizeof(double)), *g = malloc(n / 3 * sizeof(double));
    double m[2 * 2 * 37], l[2 * 2 * 37];
    fgt_fill(qkv, n, &rng, 1.0);
    fgt_fill(g, n / 3, &rng, 1.0);
    fgt_poison_d(dqkv, n);
    fg_attn_tensor t[3], dt[3];
    for (int i = 0; i < 3; i++) {
        fg_attn_tensor x = {qkv + i * H * d, FG_FP64, N * row, row, d};
        fg_attn_tensor y = {dqkv + i * H * d, FG_FP64, N * row, row, d};
        t[i] = x;
        dt[i] = y;
    }
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP64, N, H, d);
    fg_attn_tensor tg = fg_attn_bshd(g, FG_FP64, N, H, d);
    fg_attn_stats st = {m, l, FG_FP64};
    fg_attn_params p;
    fg_attn_params_init(&p, B, N, N, H, H, d);
    p.causal = 1;
    ck_assert_msg(fg_attention_forward(&p, &t[0], &t[1], &t[2], &to, &st) == FG_OK,
                  "%s", fg_last_error());
    ck_assert_msg(fg_attention_backward(&p, &t[0], &t[1], &t[2], &to, &tg, &st,
                                        &dt[0], &dt[1], &dt[2]) == FG_OK,
                  "%s", fg_last_error());
    /* Compare with the naive reference on unpacked copies. */
    double *q = malloc(n / 3 * sizeof(double)), *k = malloc(n / 3 * sizeof(double));
    double *v = malloc(n / 3 * sizeof(double)), *ro = malloc(n / 3 * sizeof(double));
    double *rd[3], *gd[3];
    for (int i = 0; i < 3; i++) {
        rd[i] = malloc(n / 3 * sizeof(double));
        gd[i] = malloc(n / 3 * sizeof(double));
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < N; s++)
            for (int64_t x = 0; x < H * d; x++) {
                size_t u = (size_t)((b * N + s) * H * d + x);
                size_t pk = (size_t)((b * N + s) * row + x);
                q[u] = qkv[pk];
                k[u] = qkv[pk + H * d];
                v[u] = qkv[pk + 2 * H * d];
                for (int i = 0; i < 3; i++)
                    gd[i][u] = dqkv[pk + i * H * d];
            }
    naive_shape ns = {B, N, N, H, H, d, 1.0 / sqrt((double)d), 1, 0, NULL};
    naive_attention_forward(&ns, q, k, v, ro, NULL, NULL);
    naive_attention_backward(&ns, q, k, v, g, rd[0], rd[1], rd[2]);
    ck_assert(fgt_rel_err(o, ro, n / 3) <= TOL_F64);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(fgt_rel_err(gd[i], rd[i], n / 3) <= TOL_F64, "grad %d", i);
    for (int i = 0; i < 3; i++) {
        free(rd[i]);
        free(gd[i]);
    }
    free(q); free(k); free(v); free(ro);
    free(qkv); free(dqkv); free(o); free(g);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("attention_cpu");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    fgt_add_loop(tc, test_grid, 0, (int)(sizeof grid / sizeof grid[0]));
    fgt_add_loop(tc, test_random_shapes, 0, 12);
    fgt_add_test(tc, test_threads_deterministic);
    fgt_add_test(tc, test_fully_masked_rows);
    fgt_add_test(tc, test_large_logits);
    fgt_add_test(tc, test_stats_match_naive);
    fgt_add_test(tc, test_packed_qkv);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    fgt_base_seed();
    return fgt_run_suite(suite());
}
