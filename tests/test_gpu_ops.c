/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_ops.c - every autograd op on the GPU against the CPU op
 * (fp64 reference) on fresh random inputs, forward and backward: the case
 * table of gpu_op_harness.c (broadcasting, odd shapes, strided views
 * feeding other ops) in fp64 (<= 1e-12), fp32 (<= 1e-5) and bf16 (fp16 for
 * a few), errors being max-abs relative to max |reference|, low-precision
 * bounds derived in gpu_op_harness.c. Plus: the dropout mask and the
 * fp16/bf16 casts bit-identical to the CPU, fg_dropout_add equal to the chain
 * it fuses, and mixing devices (or dtypes)
 * in one op is an error status, not a crash.
 *
 * Exits 77 (skip) without a GPU; CUDA is touched only inside the forked
 * tests. FG_TEST_SEED=<printed seed> reproduces a run; FG_TEST_VERBOSE=1
 * prints every error next to its tolerance; FG_SANITIZE runs a subset
 * (fp32 and bf16) for compute-sanitizer. */
#include "gpu_op_harness.h"

/* (case, dtype) pairs to run, filled by main before the fork. */
static int combo_case[4 * 128];
static fg_dtype combo_dt[4 * 128];
static int n_combos;

START_TEST(test_op)
{
    const gph_case *c = &gph_cases[combo_case[_i]];
    fgt_rng r = fgt_rng_for(1000 + (uint64_t)combo_case[_i]);
    gph_run(c, combo_dt[_i], &r);
}
END_TEST

/* ---- errors ----------------------------------------------------------- */

/* expr fails with a status and a message, leaving *out (= sentinel) alone. */
#define EXPECT_ERROR(expr, outp, sentinel)                                  \
    do {                                                                    \
        fg_clear_error();                                                   \
        *(outp) = (sentinel);                                               \
        fg_status s_ = (expr);                                              \
        ck_assert_msg(s_ != FG_OK, "%s succeeded", #expr);                  \
        ck_assert_msg(fg_last_error()[0] != '\0', "%s: no message", #expr); \
        ck_assert_msg(*(outp) == (sentinel), "%s wrote *out", #expr);       \
    } while (0)

static fg_tensor *rand_t(fgt_rng *r, fg_dtype dt, fg_device dev, int nd,
                         const int64_t *shape, int requires_grad)
{
    gph_input in = {.nd = nd};
    memcpy(in.shape, shape, sizeof(int64_t) * (size_t)nd);
    double *h = gph_draw(&in, r, dt);
    fg_tensor *t = gph_tensor(dt, dev, nd, shape, h, requires_grad);
    free(h);
    return t;
}

START_TEST(test_mixed_devices)
{
    fgt_rng r = fgt_rng_for(900);
    const fg_device CPU = FG_DEVICE_CPU, GPU = FG_DEVICE_CUDA;
    fg_tensor *xc = rand_t(&r, FG_FP32, CPU, FG_SHAPE(7, 13), 1);
    fg_tensor *xg = rand_t(&r, FG_FP32, GPU, FG_SHAPE(7, 13), 1);
    fg_tensor *wc = rand_t(&r, FG_FP32, CPU, FG_SHAPE(13, 5), 1);
    fg_tensor *bc = rand_t(&r, FG_FP32, CPU, FG_SHAPE(13), 1);
    fg_tensor *q = rand_t(&r, FG_FP32, GPU, FG_SHAPE(1, 7, 2, 8), 1);
    fg_tensor *kc = rand_t(&r, FG_FP32, CPU, FG_SHAPE(1, 7, 2, 8), 1);
    fg_tensor *sentinel = (fg_tensor *)&r, *out = NULL;
    EXPECT_ERROR(fg_add(xc, xg, &out), &out, sentinel);
    EXPECT_ERROR(fg_add(xg, xc, &out), &out, sentinel);
    EXPECT_ERROR(fg_sub(xg, bc, &out), &out, sentinel); /* broadcast too */
    EXPECT_ERROR(fg_mul(bc, xg, &out), &out, sentinel);
    EXPECT_ERROR(fg_div(xg, xc, &out), &out, sentinel);
    EXPECT_ERROR(fg_matmul(xg, wc, 0, 0, &out), &out, sentinel);
    fg_tensor *pair[2] = {xg, xc};
    EXPECT_ERROR(fg_concat(pair, 2, 0, &out), &out, sentinel);
    EXPECT_ERROR(fg_layernorm(xg, bc, NULL, 1e-5, &out), &out, sentinel);
    fg_attention_options ao;
    fg_attention_options_init(&ao);
    EXPECT_ERROR(fg_attention(q, kc, q, &ao, &out), &out, sentinel);
    /* A CPU gradient for a GPU output: refused before anything runs, so a
     * correct backward afterwards still works. */
    fg_tensor *y = NULL;
    FGT_OK(fg_exp(xg, &y));
    fg_clear_error();
    ck_assert(fg_backward_with(y, xc) != FG_OK);
    ck_assert_ptr_null(fg_tensor_grad(xg));
    fg_tensor *gy = rand_t(&r, FG_FP32, GPU, FG_SHAPE(7, 13), 0);
    FGT_OK(fg_backward_with(y, gy));
    ck_assert_ptr_nonnull(fg_tensor_grad(xg));
    /* The GPU tensors are still fine for ops. */
    FGT_OK(fg_add(xg, xg, &out));
    ck_assert_int_eq(fg_tensor_device(out), FG_DEVICE_CUDA);
    fg_tensor *all[] = {xc, xg, wc, bc, q, kc, y, gy, out};
    fgt_free_all(all, 9);
}
END_TEST

/* All inputs of an op share the dtype, on the GPU as on the CPU. */
START_TEST(test_mixed_dtypes)
{
    fgt_rng r = fgt_rng_for(901);
    fg_tensor *a = rand_t(&r, FG_FP32, FG_DEVICE_CUDA, FG_SHAPE(7, 13), 1);
    fg_tensor *b = rand_t(&r, FG_BF16, FG_DEVICE_CUDA, FG_SHAPE(7, 13), 1);
    fg_tensor *w = rand_t(&r, FG_FP64, FG_DEVICE_CUDA, FG_SHAPE(13, 5), 1);
    fg_tensor *sentinel = (fg_tensor *)&r, *out = NULL;
    EXPECT_ERROR(fg_add(a, b, &out), &out, sentinel);
    EXPECT_ERROR(fg_matmul(a, w, 0, 0, &out), &out, sentinel);
    fg_tensor *all[] = {a, b, w};
    fgt_free_all(all, 3);
}
END_TEST

/* ---- dropout mask and casts: bit-level agreement ------------------------ */

/* Dropout of ones: the GPU's kept/dropped pattern equals the CPU's element
 * for element (same Philox mapping), for odd sizes and offsets. */
START_TEST(test_dropout_mask)
{
    fgt_rng r = fgt_rng_for(910);
    const double ps[3] = {0.1, 0.5, 0.9};
    const fg_dtype dts[2] = {FG_FP32, FG_BF16};
    for (int k = 0; k < 3; k++)
        for (int d = 0; d < 2; d++) {
            const int64_t n = 4099;
            uint64_t seed = fgt_next(&r), off = fgt_next(&r) >> 20;
            fg_tensor *xc, *xg, *yc, *yg;
            FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(n), &xc));
            FGT_OK(fg_tensor_ones(dts[d], FG_DEVICE_CUDA, FG_SHAPE(n), &xg));
            FGT_OK(fg_dropout(xc, ps[k], seed, off, &yc));
            FGT_OK(fg_dropout(xg, ps[k], seed, off, &yg));
            double *hc = fgt_host(yc), *hg = fgt_host(yg);
            const double keep = 1.0 / (1.0 - ps[k]);
            int64_t dropped = 0;
            for (int64_t i = 0; i < n; i++) {
                ck_assert_msg((hc[i] == 0) == (hg[i] == 0),
                              "p %g %s: element %lld kept on %s only", ps[k],
                              fg_dtype_name(dts[d]), (long long)i,
                              hc[i] != 0 ? "the CPU" : "the GPU");
                dropped += hc[i] == 0;
                if (hg[i] != 0)
                    ck_assert_msg(fabs(hg[i] - keep) <= 0x1p-8 * keep,
                                  "kept value %.9g, want %.9g", hg[i], keep);
            }
            ck_assert(dropped > 0 && dropped < n);
            free(hc);
            free(hg);
            fg_tensor *all[] = {xc, xg, yc, yg};
            fgt_free_all(all, 4);
        }
}
END_TEST

/* fg_dropout_add on the GPU: forward and both gradients bit-identical to the
 * GPU chain it fuses (fg_dropout, fg_cast into x's dtype, fg_add), for the
 * dtype pairs of its contract (autocast's bf16/fp16 branch into fp32); the
 * kept pattern (db != 0) is the CPU's fg_dropout mask; fp32 and fp64 equal
 * the CPU op bit for bit; a length of 4099 and one of 4096 (vector loads). */
static fg_tensor *dadd_run(fg_tensor *x, fg_tensor *b, fg_tensor *w, double p,
                           uint64_t seed, uint64_t off, int fused)
{
    fg_tensor *y = NULL, *d = NULL, *dc = NULL, *yw, *l;
    if (fused) {
        FGT_OK(fg_dropout_add(x, b, p, seed, off, &y));
    } else {
        FGT_OK(fg_dropout(b, p, seed, off, &d));
        FGT_OK(fg_cast(d, fg_tensor_dtype(x), &dc));
        FGT_OK(fg_add(x, dc, &y));
    }
    FGT_OK(fg_mul(y, w, &yw)); /* a random incoming gradient */
    FGT_OK(fg_sum(yw, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    fg_tensor *all[] = {d, dc, yw, l};
    fgt_free_all(all, 4);
    return y;
}

static void assert_same(const char *what, fg_dtype xt, fg_dtype bt,
                        const fg_tensor *a, const fg_tensor *b, int64_t n)
{
    double *ha = fgt_host(a), *hb = fgt_host(b);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(ha[i] == hb[i], "%s (%s x, %s b) [%lld]: %.9g vs %.9g",
                      what, fg_dtype_name(xt), fg_dtype_name(bt),
                      (long long)i, ha[i], hb[i]);
    free(ha);
    free(hb);
}

START_TEST(test_dropout_add)
{
    fgt_rng r = fgt_rng_for(930);
    const fg_dtype pairs[5][2] = {{FG_FP32, FG_FP32}, {FG_FP64, FG_FP64},
                                  {FG_FP32, FG_BF16}, {FG_FP32, FG_FP16},
                                  {FG_BF16, FG_BF16}};
    for (int kk = 0; kk < 10; kk++) {
        /* 4099: the per-element path; 4096: four elements as vectors */
        const int k = kk % 5;
        const int64_t n = kk < 5 ? 4099 : 4096, sh[1] = {n};
        const fg_dtype xt = pairs[k][0], bt = pairs[k][1];
        const double p = k == 4 ? 0.0 : 0.1 + 0.2 * k;
        const uint64_t seed = fgt_next(&r), off = fgt_next(&r) >> 20;
        double *h[3];
        for (int j = 0; j < 3; j++) {
            h[j] = malloc(sizeof(double) * n);
            for (int64_t i = 0; i < n; i++) {
                const double u = fgt_uniform(&r);
                h[j][i] = u < 0 ? u - 0.01 : u + 0.01; /* never zero */
            }
        }
        fg_tensor *t[2][3];
        for (int f = 0; f < 2; f++) {
            t[f][0] = gph_tensor(xt, FG_DEVICE_CUDA, 1, sh, h[0], 1);
            t[f][1] = gph_tensor(bt, FG_DEVICE_CUDA, 1, sh, h[1], 1);
            t[f][2] = gph_tensor(xt, FG_DEVICE_CUDA, 1, sh, h[2], 0);
        }
        fg_tensor *y = dadd_run(t[0][0], t[0][1], t[0][2], p, seed, off, 1);
        fg_tensor *yr = dadd_run(t[1][0], t[1][1], t[1][2], p, seed, off, 0);
        ck_assert_int_eq(fg_tensor_dtype(y), xt);
        assert_same("y", xt, bt, y, yr, n);
        assert_same("dx", xt, bt, fg_tensor_grad(t[0][0]),
                    fg_tensor_grad(t[1][0]), n);
        assert_same("db", xt, bt, fg_tensor_grad(t[0][1]),
                    fg_tensor_grad(t[1][1]), n);
        /* the CPU's mask, and the CPU op where it has the dtypes */
        fg_tensor *ones, *mask, *c[3] = {0}, *yc = NULL;
        FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(n), &ones));
        FGT_OK(fg_dropout(ones, p, seed, off, &mask));
        double *hm = fgt_host(mask), *hdb = fgt_host(fg_tensor_grad(t[0][1]));
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg((hm[i] == 0) == (hdb[i] == 0),
                          "%s b: element %lld kept on %s only",
                          fg_dtype_name(bt), (long long)i,
                          hm[i] != 0 ? "the CPU" : "the GPU");
        if (xt == bt && xt != FG_BF16) {
            for (int j = 0; j < 3; j++)
                c[j] = gph_tensor(xt, FG_DEVICE_CPU, 1, sh, h[j], j < 2);
            yc = dadd_run(c[0], c[1], c[2], p, seed, off, 1);
            assert_same("y vs CPU", xt, bt, y, yc, n);
            assert_same("db vs CPU", xt, bt, fg_tensor_grad(t[0][1]),
                        fg_tensor_grad(c[1]), n);
        }
        free(hm);
        free(hdb);
        for (int j = 0; j < 3; j++)
            free(h[j]);
        fg_tensor *all[] = {t[0][0], t[0][1], t[0][2], t[1][0], t[1][1],
                            t[1][2], y, yr, ones, mask, c[0], c[1], c[2], yc};
        fgt_free_all(all, 14);
    }
}
END_TEST

/* GPU casts round like the library's host converters (round to nearest
 * even), bit for bit: fp32 -> bf16 / fp16 (incl. fp16 subnormals and
 * values near its range) and fp64 -> fp32. */
START_TEST(test_cast_rounding)
{
    fgt_rng r = fgt_rng_for(920);
    const int64_t n = 2048;
    double *h = malloc(sizeof(double) * n);
    for (int64_t i = 0; i < n; i++) {
        const double scale[4] = {1, 1e-6, 3e4, 1e-2};
        h[i] = scale[i % 4] * 2 * fgt_uniform(&r);
    }
    const fg_dtype from[3] = {FG_FP32, FG_FP32, FG_FP64};
    const fg_dtype to[3] = {FG_BF16, FG_FP16, FG_FP32};
    for (int k = 0; k < 3; k++) {
        fg_tensor *xg = gph_tensor(from[k], FG_DEVICE_CUDA, FG_SHAPE(n), h, 0);
        double *src = fgt_host(xg); /* as stored in from[k] */
        fg_tensor *yg, *ref;
        FGT_OK(fg_cast(xg, to[k], &yg));
        ck_assert_int_eq(fg_tensor_dtype(yg), to[k]);
        /* host conversion from the same from[k] values */
        ref = gph_tensor(to[k], FG_DEVICE_CPU, FG_SHAPE(n), src, 0);
        double *hy = fgt_host(yg), *hr = fgt_host(ref);
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg(hy[i] == hr[i] || (isnan(hy[i]) && isnan(hr[i])),
                          "cast %s -> %s of %.17g: gpu %.17g, host %.17g",
                          fg_dtype_name(from[k]), fg_dtype_name(to[k]),
                          src[i], hy[i], hr[i]);
        free(src);
        free(hy);
        free(hr);
        fg_tensor *all[] = {xg, yg, ref};
        fgt_free_all(all, 3);
    }
    free(h);
}
END_TEST

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU op suite\n");
        return 77;
    }
    fgt_base_seed();
    const int sanitize = getenv("FG_SANITIZE") != NULL;
    for (int c = 0; c < gph_n_cases; c++)
        for (int d = 0; d < 4; d++) {
            fg_dtype dt = gph_dtype_at(d);
            if (!gph_case_has_dtype(&gph_cases[c], dt))
                continue;
            if (sanitize && dt != FG_FP32 && dt != FG_BF16)
                continue;
            if (n_combos < (int)(sizeof combo_case / sizeof combo_case[0])) {
                combo_case[n_combos] = c;
                combo_dt[n_combos++] = dt;
            }
        }
    Suite *s = suite_create("gpu_ops");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 900);
    fgt_add_loop(tc, test_op, 0, n_combos);
    fgt_add_test(tc, test_mixed_devices);
    fgt_add_test(tc, test_mixed_dtypes);
    fgt_add_test(tc, test_dropout_mask);
    fgt_add_test(tc, test_dropout_add);
    fgt_add_test(tc, test_cast_rounding);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
