/* SPDX-License-Identifier: MIT */
/* tests/test_grad_scaler.c - dynamic loss scaling (fg_grad_scaler,
 * optim.h): the scale's growth and backoff and its bad values; a scaled
 * training step (power-of-two scales, gradient accumulation, clipping
 * active, fp32 and fp64) equals the unscaled one bit for bit; a step whose
 * gradients are not finite changes no parameter, moment or step count;
 * fg_grad_scaler_unscale against fg_clip_grad_norm on the true gradients. */
#include <math.h>
#include <string.h>

#include "lib/autograd/tensor_internal.h"
#include "test_ops_util.h"

static const fg_sort_task TASK = {4, 6};
enum { B = 8 };

START_TEST(test_scaler_update)
{
    fg_grad_scaler s;
    fg_grad_scaler_init(&s);
    ck_assert(s.scale == 65536.0 && s.growth_factor == 2.0 &&
              s.backoff_factor == 0.5 && s.growth_interval == 2000 &&
              s.good_steps == 0 && s.skipped == 0);
    s.growth_interval = 3;
    for (int i = 0; i < 2; i++)
        FGT_OK(fg_grad_scaler_update(&s, 0));
    ck_assert(s.scale == 65536.0 && s.good_steps == 2);
    FGT_OK(fg_grad_scaler_update(&s, 0)); /* the third good step grows */
    ck_assert(s.scale == 131072.0 && s.good_steps == 0);
    FGT_OK(fg_grad_scaler_update(&s, 0));
    FGT_OK(fg_grad_scaler_update(&s, 1)); /* backoff resets the count */
    ck_assert(s.scale == 65536.0 && s.good_steps == 0 && s.skipped == 1);
    /* the bounds: 2^-24 .. 2^64 */
    s.scale = 0x1p-24;
    FGT_OK(fg_grad_scaler_update(&s, 1));
    ck_assert(s.scale == 0x1p-24 && s.skipped == 2);
    s.scale = 0x1p64;
    s.growth_interval = 1;
    FGT_OK(fg_grad_scaler_update(&s, 0));
    ck_assert(s.scale == 0x1p64);
    /* bad fields: an error, and the scaler untouched */
    const double bad_scale[] = {0, -1, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        fg_grad_scaler b;
        fg_grad_scaler_init(&b);
        b.scale = bad_scale[i];
        fg_grad_scaler keep = b;
        FGT_FAILS(fg_grad_scaler_update(&b, 0), FG_ERR_INVALID_ARGUMENT);
        ck_assert(!memcmp(&b, &keep, sizeof b));
    }
    fg_grad_scaler b;
    fg_grad_scaler_init(&b);
    b.growth_factor = 0.5;
    FGT_FAILS(fg_grad_scaler_update(&b, 0), FG_ERR_INVALID_ARGUMENT);
    fg_grad_scaler_init(&b);
    b.backoff_factor = 1;
    FGT_FAILS(fg_grad_scaler_update(&b, 0), FG_ERR_INVALID_ARGUMENT);
    fg_grad_scaler_init(&b);
    b.growth_interval = 0;
    FGT_FAILS(fg_grad_scaler_update(&b, 0), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_grad_scaler_update(NULL, 0), FG_ERR_INVALID_ARGUMENT);
    fg_grad_scaler_init(NULL); /* no crash */
}
END_TEST

static fg_gpt *model(fg_dtype dt, uint64_t seed)
{
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = fg_sort_task_vocab(&TASK);
    c.ctx = fg_sort_task_seqlen(&TASK);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.dropout = 0.1;
    c.dtype = dt;
    fg_gpt *m;
    FGT_OK(fg_gpt_create(&c, seed, &m));
    return m;
}

/* Parameters and both moments of a and b, bit for bit. */
static void assert_same(const fg_gpt *a, const fg_adamw *oa, const fg_gpt *b,
                        const fg_adamw *ob)
{
    int n, n2;
    const fg_param *pa = fg_gpt_params(a, &n), *pb = fg_gpt_params(b, &n2);
    ck_assert_int_eq(n, n2);
    ck_assert_int_eq(fg_adamw_steps(oa), fg_adamw_steps(ob));
    for (int i = 0; i < n; i++) {
        fg_tensor *ma, *va, *mb, *vb;
        FGT_OK(fg_adamw_state(oa, i, &ma, &va));
        FGT_OK(fg_adamw_state(ob, i, &mb, &vb));
        const size_t bytes = (size_t)fg_tensor_numel(pa[i].tensor) *
                             fg_dtype_size(fg_tensor_dtype(pa[i].tensor));
        ck_assert_msg(!memcmp(fg_tensor_data(pa[i].tensor),
                              fg_tensor_data(pb[i].tensor), bytes),
                      "parameter %s differs", pa[i].name);
        ck_assert(!memcmp(fg_tensor_data(ma), fg_tensor_data(mb), bytes));
        ck_assert(!memcmp(fg_tensor_data(va), fg_tensor_data(vb), bytes));
    }
}

/* Steps of the scaled and the plain step on twin models: the same bits,
 * with 2 and 3 micro-batches (1/3 is not a power of two) and a clip that
 * is active (0.05 is below this model's gradient norms). */
static void scaled_equals_plain(fg_dtype dt)
{
    fg_gpt *a = model(dt, 7), *b = model(dt, 7);
    fg_adamw *oa = fgt_adamw_for(a), *ob = fgt_adamw_for(b);
    fg_grad_scaler sc;
    fg_grad_scaler_init(&sc);
    sc.growth_interval = 2; /* the scale changes during the run */
    const int64_t T = fg_sort_task_seqlen(&TASK);
    int64_t x[3 * B * 8], y[3 * B * 8];
    uint64_t data = 3;
    fg_generator ga = {11, 0}, gb = {11, 0};
    int clipped = 0;
    for (int step = 0; step < 6; step++) {
        const int accum = 2 + step % 2;
        FGT_OK(fg_sort_task_batch(&TASK, 0, &data, accum * B, x, y));
        fg_step_stats sa, sb;
        const double scale_before = sc.scale;
        FGT_OK(fg_gpt_train_step(a, oa, x, y, B, T, accum, 0.05, 1e-2, &ga,
                                 NULL, &sa));
        FGT_OK(fg_gpt_train_step_scaled(b, ob, x, y, B, T, accum, 0.05, 1e-2,
                                        &gb, NULL, &sc, &sb));
        ck_assert(isfinite(sa.loss) && sa.loss > 0);
        ck_assert(sa.loss == sb.loss);
        ck_assert_msg(sa.grad_norm == sb.grad_norm, "norm %.17g vs %.17g "
                      "(scale %g)", sa.grad_norm, sb.grad_norm, scale_before);
        clipped += sa.grad_norm > 0.05;
        assert_same(a, oa, b, ob);
    }
    ck_assert_int_gt(clipped, 0);
    ck_assert(sc.scale == 65536.0 * 8 && sc.skipped == 0);
    fg_adamw_free(oa);
    fg_adamw_free(ob);
    fg_gpt_free(a);
    fg_gpt_free(b);
}

START_TEST(test_scaled_step_bitwise_fp32) { scaled_equals_plain(FG_FP32); }
END_TEST

START_TEST(test_scaled_step_bitwise_fp64) { scaled_equals_plain(FG_FP64); }
END_TEST

/* A NaN in a weight every token uses makes every gradient NaN: the scaled
 * step is skipped (parameters, moments and t as before, the gradients
 * zeroed), the scale backs off, and the norm reported is not finite. */
START_TEST(test_nonfinite_step_skipped)
{
    fg_gpt *m = model(FG_FP32, 5), *twin = model(FG_FP32, 5);
    fg_adamw *o = fgt_adamw_for(m), *ot = fgt_adamw_for(twin);
    fg_grad_scaler sc;
    fg_grad_scaler_init(&sc);
    const int64_t T = fg_sort_task_seqlen(&TASK);
    int64_t x[B * 8], y[B * 8];
    uint64_t data = 9, data_t = 9;
    fg_generator g = {1, 0}, gt = {1, 0};
    fg_step_stats st;
    /* one good step on both, so that the moments are not zero */
    FGT_OK(fg_sort_task_batch(&TASK, 0, &data, B, x, y));
    FGT_OK(fg_gpt_train_step_scaled(m, o, x, y, B, T, 1, 1.0, 1e-2, &g, NULL,
                                    &sc, &st));
    FGT_OK(fg_sort_task_batch(&TASK, 0, &data_t, B, x, y));
    FGT_OK(fg_gpt_train_step(twin, ot, x, y, B, T, 1, 1.0, 1e-2, &gt, NULL,
                             &st));
    int n;
    const fg_param *ps = fg_gpt_params(m, &n), *pt = fg_gpt_params(twin, &n);
    int lnf = -1; /* the final LayerNorm's weight: on every token's path */
    for (int i = 0; i < n; i++)
        if (!strcmp(ps[i].name, "ln_f.w"))
            lnf = i;
    ck_assert_int_ge(lnf, 0);
    ((float *)fg_tensor_data(ps[lnf].tensor))[3] = NAN;
    ((float *)fg_tensor_data(pt[lnf].tensor))[3] = NAN;
    fg_tensor_bump_version(ps[lnf].tensor);
    fg_tensor_bump_version(pt[lnf].tensor);
    FGT_OK(fg_sort_task_batch(&TASK, 0, &data, B, x, y));
    FGT_OK(fg_gpt_train_step_scaled(m, o, x, y, B, T, 1, 1.0, 1e-2, &g, NULL,
                                    &sc, &st));
    ck_assert(!isfinite(st.grad_norm));
    ck_assert(sc.scale == 32768.0 && sc.skipped == 1 && sc.good_steps == 0);
    assert_same(m, o, twin, ot); /* the twin took no second step */
    ck_assert_int_eq(fg_adamw_steps(o), 1);
    for (int i = 0; i < n; i++) { /* the gradients were zeroed */
        const float *gr = fg_tensor_data(fg_tensor_grad(ps[i].tensor));
        for (int64_t j = 0; j < fg_tensor_numel(ps[i].tensor); j++)
            ck_assert(gr[j] == 0);
    }
    /* a bad scaler: an error before anything runs */
    sc.scale = -1;
    FGT_FAILS(fg_gpt_train_step_scaled(m, o, x, y, B, T, 1, 1.0, 1e-2, &g,
                                       NULL, &sc, &st),
              FG_ERR_INVALID_ARGUMENT);
    assert_same(m, o, twin, ot);
    fg_adamw_free(o);
    fg_adamw_free(ot);
    fg_gpt_free(m);
    fg_gpt_free(twin);
}
END_TEST

/* fg_grad_scaler_unscale on gradients set by hand: with scale 8 and an
 * active clip, the same bits as fg_clip_grad_norm on the true gradients;
 * an inf leaves every gradient as it was. */
START_TEST(test_unscale)
{
    enum { N = 37 };
    fg_tensor *p[2], *q[2];
    const int64_t shp[2][1] = {{N}, {5}};
    fg_param pp[2], pq[2];
    for (int t = 0; t < 2; t++) {
        FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, 1, shp[t], &p[t]));
        FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, 1, shp[t], &q[t]));
        fg_tensor_set_requires_grad(p[t], 1);
        fg_tensor_set_requires_grad(q[t], 1);
        fg_tensor *gp, *gq;
        FGT_OK(fg_tensor_new_like(NULL, p[t], 1, &gp));
        FGT_OK(fg_tensor_new_like(NULL, q[t], 1, &gq));
        p[t]->grad = gp;
        q[t]->grad = gq;
        float *a = fg_tensor_data(gp), *b = fg_tensor_data(gq);
        for (int64_t j = 0; j < shp[t][0]; j++) {
            b[j] = (float)(0.3 * sin(1.7 * (double)j + t) + 0.01 * j);
            a[j] = b[j] * 8;
        }
        pp[t] = (fg_param){p[t], "p", 1};
        pq[t] = (fg_param){q[t], "q", 1};
    }
    fg_grad_scaler sc;
    fg_grad_scaler_init(&sc);
    sc.scale = 8;
    double na, nb;
    int inf = -1;
    FGT_OK(fg_clip_grad_norm(pq, 2, 0.5, &nb));
    FGT_OK(fg_grad_scaler_unscale(&sc, pp, 2, 0.5, &na, &inf));
    ck_assert_int_eq(inf, 0);
    ck_assert(na == nb && nb > 0.5); /* the clip was active */
    for (int t = 0; t < 2; t++)
        ck_assert(!memcmp(fg_tensor_data(p[t]->grad),
                          fg_tensor_data(q[t]->grad),
                          (size_t)shp[t][0] * sizeof(float)));
    float *a = fg_tensor_data(p[1]->grad);
    a[2] = INFINITY;
    float keep[N];
    memcpy(keep, fg_tensor_data(p[0]->grad), sizeof keep);
    FGT_OK(fg_grad_scaler_unscale(&sc, pp, 2, 0.5, &na, &inf));
    ck_assert_int_eq(inf, 1);
    ck_assert(!isfinite(na));
    ck_assert(!memcmp(keep, fg_tensor_data(p[0]->grad), sizeof keep));
    ck_assert(isinf(a[2]));
    FGT_FAILS(fg_grad_scaler_unscale(&sc, pp, 2, 0.5, &na, NULL),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_grad_scaler_unscale(NULL, pp, 2, 0.5, &na, &inf),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_grad_scaler_unscale(&sc, NULL, 2, 0.5, &na, &inf),
              FG_ERR_INVALID_ARGUMENT);
    for (int t = 0; t < 2; t++) {
        fg_tensor_free(p[t]);
        fg_tensor_free(q[t]);
    }
}
END_TEST

FGT_MAIN_BEGIN("grad_scaler")
FGT_TEST(test_scaler_update)
FGT_TEST(test_scaled_step_bitwise_fp32)
FGT_TEST(test_scaled_step_bitwise_fp64)
FGT_TEST(test_nonfinite_step_skipped)
FGT_TEST(test_unscale)
FGT_MAIN_END()
