/* SPDX-License-Identifier: MIT */
/* tests/test_ops_linear.c - fg_mlp (the MLP's body as one node,
 * lib/ops/ops_linear.c) on the CPU: forward and every gradient equal the
 * unfused ops' (fg_linear, fg_gelu, fg_linear) bit for bit in fp32 and
 * fp64, also over two accumulating backwards and with some inputs not
 * requiring grad; the forward against an independent fp64 evaluation;
 * gradcheck in fp64 (contiguous and strided x); NaN propagation; bad
 * arguments refused before anything is written. */
#include <math.h>
#include <string.h>

#include "test_ops_util.h"

#include "lib/ops/ops_internal.h"

enum { B = 2, T = 5, C = 6, H = 16, D = 7 };

typedef struct mlp_in {
    fg_tensor *t[5]; /* x, w1, b1, w2, b2 */
} mlp_in;

static mlp_in make_in(fgt_rng *r, fg_dtype dt, const int *grad)
{
    static const int64_t shapes[5][3] = {
        {B, T, C}, {C, H, 0}, {H, 0, 0}, {H, D, 0}, {D, 0, 0}};
    static const int nds[5] = {3, 2, 1, 2, 1};
    mlp_in m;
    for (int i = 0; i < 5; i++) /* pre-activations span GELU's curve */
        m.t[i] = fgt_rand(r, dt, nds[i], shapes[i], i == 0 ? 2.0 : 0.6, 0.01,
                          grad[i]);
    return m;
}

static mlp_in clone_in(const mlp_in *a)
{
    mlp_in m;
    for (int i = 0; i < 5; i++) {
        const fg_tensor *s = a->t[i];
        double *h = fgt_host(s);
        FGT_OK(fg_tensor_zeros(fg_tensor_dtype(s), FG_DEVICE_CPU,
                               fg_tensor_ndim(s), fg_tensor_shape(s),
                               &m.t[i]));
        FGT_OK(fg_tensor_copy_from_host(m.t[i], FG_FP64, h,
                                        fg_tensor_numel(s)));
        if (fg_tensor_requires_grad(s))
            FGT_OK(fg_tensor_set_requires_grad(m.t[i], 1));
        free(h);
    }
    return m;
}

static fg_status unfused(fg_tensor *const *in, fg_tensor **y)
{
    fg_tensor *h = NULL, *a = NULL;
    fg_status s = fg_linear(in[0], in[1], in[2], &h);
    if (s == FG_OK)
        s = fg_gelu(h, &a);
    if (s == FG_OK)
        s = fg_linear(a, in[3], in[4], y);
    fg_tensor_free(h);
    fg_tensor_free(a);
    return s;
}

static void same_bits(const fg_tensor *a, const fg_tensor *b, const char *what)
{
    ck_assert_msg((a == NULL) == (b == NULL), "%s: one is missing", what);
    if (!a)
        return;
    const int64_t n = fg_tensor_numel(a);
    ck_assert_int_eq(n, fg_tensor_numel(b));
    double *ha = fgt_host(a), *hb = fgt_host(b);
    ck_assert_msg(fgt_all_finite(ha, (size_t)n), "%s: not finite", what);
    ck_assert_msg(!memcmp(ha, hb, sizeof(double) * (size_t)n),
                  "%s: fused and unfused differ", what);
    free(ha);
    free(hb);
}

/* Two forwards and backwards of each form (the second adds into .grad). */
static void compare(fg_dtype dt, const int *grad, uint64_t salt)
{
    fgt_rng r = fgt_rng_for(salt);
    mlp_in f = make_in(&r, dt, grad), u = clone_in(&f);
    const int64_t ys[3] = {B, T, D};
    fg_tensor *up = fgt_rand(&r, dt, 3, ys, 1.0, 0.01, 0);
    for (int pass = 0; pass < 2; pass++) {
        fg_tensor *yf = NULL, *yu = NULL;
        FGT_OK(fg_mlp(f.t[0], f.t[1], f.t[2], f.t[3], f.t[4], &yf));
        FGT_OK(unfused(u.t, &yu));
        ck_assert_str_eq(fg_node_name(fg_tensor_grad_fn(yf)), "MlpBackward");
        same_bits(yf, yu, "y");
        FGT_OK(fg_backward_with(yf, up));
        FGT_OK(fg_backward_with(yu, up));
        fg_tensor_free(yf);
        fg_tensor_free(yu);
    }
    static const char *const names[5] = {"dx", "dw1", "db1", "dw2", "db2"};
    for (int i = 0; i < 5; i++)
        same_bits(fg_tensor_grad(f.t[i]), fg_tensor_grad(u.t[i]), names[i]);
    fgt_free_all(f.t, 5);
    fgt_free_all(u.t, 5);
    fg_tensor_free(up);
}

START_TEST(test_mlp_matches_unfused)
{
    static const int all[5] = {1, 1, 1, 1, 1}, some[5] = {1, 0, 1, 1, 0},
                     params[5] = {0, 1, 1, 1, 1};
    compare(FG_FP64, all, 0x11a0);
    compare(FG_FP32, all, 0x11a1);
    compare(FG_FP32, some, 0x11a2);
    compare(FG_FP64, params, 0x11a3);
}
END_TEST

static double gelu_ref(double v)
{
    return 0.5 * v *
           (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

/* y against loops in fp64 (an evaluation not sharing the op's code). */
START_TEST(test_mlp_reference)
{
    static const int none[5] = {0};
    fgt_rng r = fgt_rng_for(0x11a4);
    mlp_in m = make_in(&r, FG_FP64, none);
    double *h[5];
    for (int i = 0; i < 5; i++)
        h[i] = fgt_host(m.t[i]);
    fg_tensor *y = NULL;
    FGT_OK(fg_mlp(m.t[0], m.t[1], m.t[2], m.t[3], m.t[4], &y));
    double *hy = fgt_host(y), ref[B * T * D], act[H];
    for (int row = 0; row < B * T; row++) {
        for (int j = 0; j < H; j++) {
            double s = h[2][j];
            for (int k = 0; k < C; k++)
                s += h[0][row * C + k] * h[1][k * H + j];
            act[j] = gelu_ref(s);
        }
        for (int d = 0; d < D; d++) {
            double s = h[4][d];
            for (int j = 0; j < H; j++)
                s += act[j] * h[3][j * D + d];
            ref[row * D + d] = s;
        }
    }
    const double err = fgt_max_diff(hy, ref, B * T * D);
    ck_assert_msg(err <= 1e-12 * fgt_max_abs(ref, B * T * D), "error %.3g",
                  err);
    for (int i = 0; i < 5; i++)
        free(h[i]);
    free(hy);
    fg_tensor_free(y);
    fgt_free_all(m.t, 5);
}
END_TEST

static fg_status mlp_fn(fg_tensor *const *in, int n, fg_tensor **out,
                        void *u)
{
    (void)n;
    (void)u;
    return fg_mlp(in[0], in[1], in[2], in[3], in[4], out);
}

START_TEST(test_mlp_gradcheck)
{
    static const int all[5] = {1, 1, 1, 1, 1};
    fgt_rng r = fgt_rng_for(0x11a5);
    mlp_in m = make_in(&r, FG_FP64, all);
    fgt_gradcheck("mlp", mlp_fn, NULL, m.t, 5, 0);
    fg_tensor *xt = NULL; /* [T, B, C], strided: the op copies it */
    FGT_OK(fg_transpose(m.t[0], 0, 1, &xt));
    fg_tensor *in2[5] = {xt, m.t[1], m.t[2], m.t[3], m.t[4]};
    fgt_gradcheck("mlp strided x", mlp_fn, NULL, in2, 5, 0);
    fg_tensor_free(xt);
    fgt_free_all(m.t, 5);
}
END_TEST

/* A NaN in one row of x gives a NaN row of y and leaves the others. */
START_TEST(test_mlp_nan)
{
    static const int none[5] = {0};
    fgt_rng r = fgt_rng_for(0x11a6);
    mlp_in m = make_in(&r, FG_FP32, none);
    double *hx = fgt_host(m.t[0]);
    hx[3 * C + 2] = NAN; /* row 3 */
    FGT_OK(fg_tensor_copy_from_host(m.t[0], FG_FP64, hx, B * T * C));
    fg_tensor *y = NULL;
    FGT_OK(fg_mlp(m.t[0], m.t[1], m.t[2], m.t[3], m.t[4], &y));
    double *hy = fgt_host(y);
    for (int row = 0; row < B * T; row++)
        for (int d = 0; d < D; d++)
            ck_assert_msg(row == 3 ? isnan(hy[row * D + d])
                                   : isfinite(hy[row * D + d]),
                          "row %d col %d: %g", row, d, hy[row * D + d]);
    free(hx);
    free(hy);
    fg_tensor_free(y);
    fgt_free_all(m.t, 5);
}
END_TEST

START_TEST(test_mlp_errors)
{
    static const int none[5] = {0};
    fgt_rng r = fgt_rng_for(0x11a7);
    mlp_in m = make_in(&r, FG_FP64, none);
    fg_tensor *bad_w2 = fgt_rand(&r, FG_FP64, FG_SHAPE(H + 1, D), 1, 0, 0);
    fg_tensor *f32_b1 = fgt_rand(&r, FG_FP32, FG_SHAPE(H), 1, 0, 0);
    fg_tensor *o = (fg_tensor *)0x1;
    FGT_FAILS(fg_mlp(m.t[0], m.t[1], m.t[2], bad_w2, m.t[4], &o),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_mlp(m.t[0], m.t[1], f32_b1, m.t[3], m.t[4], &o),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_mlp(m.t[0], m.t[1], NULL, m.t[3], m.t[4], &o),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_mlp(m.t[1], m.t[1], m.t[2], m.t[3], m.t[4], &o),
              FG_ERR_INVALID_ARGUMENT); /* x [C, H]: C != H */
    FGT_FAILS(fg_mlp(m.t[0], m.t[1], m.t[2], m.t[3], m.t[4], NULL),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(o, (fg_tensor *)0x1);
    fg_tensor_free(bad_w2);
    fg_tensor_free(f32_b1);
    fgt_free_all(m.t, 5);
}
END_TEST

FGT_MAIN_BEGIN("ops_linear")
FGT_TEST(test_mlp_matches_unfused)
FGT_TEST(test_mlp_reference)
FGT_TEST(test_mlp_gradcheck)
FGT_TEST(test_mlp_nan)
FGT_TEST(test_mlp_errors)
FGT_MAIN_END()
