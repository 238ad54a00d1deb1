/* SPDX-License-Identifier: MIT */
/* tests/test_autograd.c - the tape: gradients of small graphs against
 * hand-derived values, accumulation, retain_grad, no_grad, fg_grad,
 * multi-output nodes, graph freeing, and every misuse as a status with a
 * message (no crash; ASan/valgrind runs check for leaks). Tolerances: exact
 * where the arithmetic is exact, else 1e-12 in fp64. */
#include "test_ops_util.h"

/* y = sum(x * w): dy/dx = w, dy/dw = x. */
static fg_tensor *dot_loss(fg_tensor *x, fg_tensor *w)
{
    fg_tensor *p, *l;
    FGT_OK(fg_mul(x, w, &p));
    FGT_OK(fg_sum(p, NULL, 0, 0, &l));
    fg_tensor_free(p); /* the graph keeps what it needs */
    return l;
}

START_TEST(test_basic_and_accumulate)
{
    fgt_rng r = fgt_rng_for(200);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(3, 4), 1, 0, 1);
    fg_tensor *w = fgt_rand(&r, FG_FP64, FG_SHAPE(3, 4), 1, 0, 1);
    double *hx = fgt_host(x), *hw = fgt_host(w);
    fg_tensor *l = dot_loss(x, w);
    ck_assert(fg_tensor_requires_grad(l) && !fg_tensor_is_leaf(l));
    ck_assert_str_eq(fg_node_name(fg_tensor_grad_fn(l)), "SumBackward");
    ck_assert_ptr_null(fg_tensor_grad(x));
    FGT_OK(fg_backward(l));
    double *gx = fgt_host(fg_tensor_grad(x)), *gw = fgt_host(fg_tensor_grad(w));
    ck_assert(fgt_max_diff(gx, hw, 12) == 0 && fgt_max_diff(gw, hx, 12) == 0);
    free(gx);
    free(gw);
    /* A second graph: gradients accumulate into the same buffers. */
    fg_tensor *grad_buf = fg_tensor_grad(x);
    fg_tensor *l2 = dot_loss(x, w);
    FGT_OK(fg_backward(l2));
    ck_assert_ptr_eq(fg_tensor_grad(x), grad_buf);
    gx = fgt_host(fg_tensor_grad(x));
    for (int i = 0; i < 12; i++)
        ck_assert(gx[i] == 2 * hw[i]);
    free(gx);
    /* zero_grad: zeros in place, no new buffer. */
    fg_tensor *ps[3] = {x, w, NULL};
    FGT_OK(fg_zero_grad(ps, 3));
    ck_assert_ptr_eq(fg_tensor_grad(x), grad_buf);
    gx = fgt_host(fg_tensor_grad(x));
    for (int i = 0; i < 12; i++)
        ck_assert(gx[i] == 0);
    free(gx);
    FGT_OK(fg_tensor_clear_grad(x));
    ck_assert_ptr_null(fg_tensor_grad(x));
    fg_tensor_free(l);
    fg_tensor_free(l2);
    fg_tensor_free(x);
    fg_tensor_free(w);
    free(hx);
    free(hw);
}
END_TEST

/* x used by several consumers (diamond): y = sum(x*x + exp(x) + 3x). */
START_TEST(test_diamond)
{
    fgt_rng r = fgt_rng_for(201);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(5), 1, 0, 1);
    double *hx = fgt_host(x);
    fg_tensor *a, *b, *c, *ab, *abc, *l;
    FGT_OK(fg_mul(x, x, &a));
    FGT_OK(fg_exp(x, &b));
    FGT_OK(fg_scale(x, 3.0, &c));
    FGT_OK(fg_add(a, b, &ab));
    FGT_OK(fg_add(ab, c, &abc));
    FGT_OK(fg_sum(abc, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    double *g = fgt_host(fg_tensor_grad(x));
    for (int i = 0; i < 5; i++)
        ck_assert(fabs(g[i] - (2 * hx[i] + exp(hx[i]) + 3)) < 1e-12);
    fg_tensor *all[] = {x, a, b, c, ab, abc, l};
    fgt_free_all(all, 7);
    free(g);
    free(hx);
}
END_TEST

START_TEST(test_retain_grad)
{
    fgt_rng r = fgt_rng_for(202);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(2, 3), 1, 0, 1);
    fg_tensor *h, *h2, *l;
    FGT_OK(fg_tanh(x, &h));
    FGT_OK(fg_scale(h, 2.0, &h2));
    FGT_OK(fg_tensor_retain_grad(h));
    FGT_OK(fg_sum(h2, NULL, 0, 0, &l));
    FGT_OK(fg_backward_ex(l, NULL, FG_BACKWARD_RETAIN_GRAPH));
    ck_assert_ptr_nonnull(fg_tensor_grad(h));
    ck_assert_ptr_null(fg_tensor_grad(h2)); /* not retained */
    double *gh = fgt_host(fg_tensor_grad(h));
    for (int i = 0; i < 6; i++)
        ck_assert(gh[i] == 2.0);
    free(gh);
    /* Retained grads accumulate like a leaf's. */
    FGT_OK(fg_backward(l));
    gh = fgt_host(fg_tensor_grad(h));
    ck_assert(gh[5] == 4.0);
    free(gh);
    FGT_OK(fg_tensor_retain_grad(x)); /* leaf: no-op */
    fg_tensor *nr;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2), &nr));
    FGT_FAILS(fg_tensor_retain_grad(nr), FG_ERR_STATE);
    fg_tensor *all[] = {x, h, h2, l, nr};
    fgt_free_all(all, 5);
}
END_TEST

START_TEST(test_no_grad)
{
    fgt_rng r = fgt_rng_for(203);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(4), 1, 0, 1);
    fg_tensor *y, *z, *w;
    ck_assert(fg_grad_enabled());
    fg_no_grad_begin();
    fg_no_grad_begin(); /* nests */
    ck_assert(!fg_grad_enabled());
    FGT_OK(fg_exp(x, &y));
    FGT_OK(fg_no_grad_end());
    ck_assert(!fg_grad_enabled());
    FGT_OK(fg_mul(y, x, &z));
    FGT_OK(fg_no_grad_end());
    ck_assert(fg_grad_enabled());
    FGT_FAILS(fg_no_grad_end(), FG_ERR_STATE);
    ck_assert(!fg_tensor_requires_grad(y) && !fg_tensor_grad_fn(y));
    ck_assert(!fg_tensor_requires_grad(z) && !fg_tensor_grad_fn(z));
    FGT_FAILS(fg_backward(z), FG_ERR_INVALID_ARGUMENT);
    /* An input that does not require grad records nothing either. */
    FGT_OK(fg_tanh(y, &w));
    ck_assert(!fg_tensor_grad_fn(w));
    fg_tensor *all[] = {x, y, z, w};
    fgt_free_all(all, 4);
}
END_TEST

START_TEST(test_errors)
{
    fgt_rng r = fgt_rng_for(204);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(2, 3), 1, 0, 1);
    fg_tensor *y, *l, *g_bad, *g_ok, *g32;
    FGT_OK(fg_exp(x, &y));
    /* Non-scalar output without a gradient. */
    FGT_FAILS(fg_backward(y), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "one-element"));
    /* Gradient of the wrong shape / dtype. */
    FGT_OK(fg_tensor_ones(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(3, 2), &g_bad));
    FGT_FAILS(fg_backward_with(y, g_bad), FG_ERR_INVALID_ARGUMENT);
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, 3), &g32));
    FGT_FAILS(fg_backward_with(y, g32), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_backward_with(y, NULL), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_backward(NULL), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(fg_tensor_grad(x)); /* nothing happened */
    /* A correct one works and frees the graph ... */
    FGT_OK(fg_tensor_ones(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 3), &g_ok));
    ck_assert_uint_gt(fg_node_saved_bytes(fg_tensor_grad_fn(y)), 0);
    FGT_OK(fg_backward_with(y, g_ok));
    ck_assert(fg_node_is_freed(fg_tensor_grad_fn(y)));
    ck_assert_uint_eq(fg_node_saved_bytes(fg_tensor_grad_fn(y)), 0);
    double *g1 = fgt_host(fg_tensor_grad(x));
    /* ... so a second backward through it is a state error, not a crash,
     * and .grad is left as it was. */
    FGT_FAILS(fg_backward_with(y, g_ok), FG_ERR_STATE);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "second time"));
    double *g2 = fgt_host(fg_tensor_grad(x));
    ck_assert(fgt_max_diff(g1, g2, 6) == 0);
    /* Through a longer graph whose tail was freed. */
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    FGT_FAILS(fg_backward(l), FG_ERR_STATE);
    /* requires_grad only on leaves */
    FGT_FAILS(fg_tensor_set_requires_grad(y, 0), FG_ERR_STATE);
    fg_tensor *all[] = {x, y, l, g_bad, g_ok, g32};
    fgt_free_all(all, 6);
    free(g1);
    free(g2);
}
END_TEST

/* A saved input modified in place before the backward is detected. */
START_TEST(test_version_check)
{
    fgt_rng r = fgt_rng_for(205);
    fg_tensor *w = fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 1);
    fg_tensor *c = fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 0);
    fg_tensor *y, *l;
    FGT_OK(fg_mul(w, c, &y)); /* saves c */
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    FGT_OK(fg_tensor_fill(c, 0.0));
    FGT_FAILS(fg_backward(l), FG_ERR_STATE);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "modified in place"));
    ck_assert_ptr_null(fg_tensor_grad(w));
    fg_tensor *all[] = {w, c, y, l};
    fgt_free_all(all, 4);
}
END_TEST

START_TEST(test_fg_grad_and_free_graph)
{
    fgt_rng r = fgt_rng_for(206);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(4), 1, 0, 1);
    fg_tensor *u = fgt_rand(&r, FG_FP64, FG_SHAPE(4), 1, 0, 1); /* unused */
    fg_tensor *h, *l, *gr[3] = {0};
    double *hx = fgt_host(x);
    FGT_OK(fg_mul(x, x, &h));
    FGT_OK(fg_sum(h, NULL, 0, 0, &l));
    fg_tensor *in[3] = {x, u, h};
    FGT_OK(fg_grad(l, NULL, in, 3, gr, FG_BACKWARD_RETAIN_GRAPH));
    ck_assert_ptr_null(fg_tensor_grad(x)); /* .grad untouched */
    ck_assert_ptr_null(gr[1]);             /* u not used */
    double *gx = fgt_host(gr[0]), *gh = fgt_host(gr[2]);
    for (int i = 0; i < 4; i++)
        ck_assert(gx[i] == 2 * hx[i] && gh[i] == 1.0);
    /* Freeing the graph releases the saved tensors. */
    ck_assert_uint_gt(fg_node_saved_bytes(fg_tensor_grad_fn(h)), 0);
    FGT_OK(fg_graph_free(l));
    ck_assert_uint_eq(fg_node_saved_bytes(fg_tensor_grad_fn(h)), 0);
    FGT_FAILS(fg_backward(l), FG_ERR_STATE);
    FGT_FAILS(fg_grad(l, NULL, in, 3, NULL, 0), FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {x, u, h, l, gr[0], gr[2]};
    fgt_free_all(all, 6);
    free(hx);
    free(gx);
    free(gh);
}
END_TEST

/* split: one node, three outputs, one of them unused. */
START_TEST(test_multi_output)
{
    fgt_rng r = fgt_rng_for(207);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(2, 7), 1, 0, 1);
    fg_tensor *parts[3], *a, *l;
    const int64_t sizes[3] = {2, 4, 1};
    FGT_OK(fg_split(x, 1, sizes, 3, parts));
    ck_assert_ptr_eq(fg_tensor_grad_fn(parts[0]), fg_tensor_grad_fn(parts[2]));
    ck_assert_int_eq(fg_node_num_outputs(fg_tensor_grad_fn(parts[0])), 3);
    FGT_OK(fg_mul(parts[0], parts[0], &a)); /* d/dx = 2 x on columns 0-1 */
    fg_tensor *s1, *s2, *s12;
    FGT_OK(fg_sum(a, NULL, 0, 0, &s1));
    FGT_OK(fg_sum(parts[2], NULL, 0, 0, &s2)); /* 1 on column 6 */
    FGT_OK(fg_add(s1, s2, &s12));
    FGT_OK(fg_scale(s12, 1.0, &l));
    FGT_OK(fg_backward(l));
    double *hx = fgt_host(x), *g = fgt_host(fg_tensor_grad(x));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 7; j++) {
            double want = j < 2 ? 2 * hx[i * 7 + j] : j == 6 ? 1.0 : 0.0;
            ck_assert(g[i * 7 + j] == want);
        }
    fg_tensor *all[] = {x, parts[0], parts[1], parts[2], a, s1, s2, s12, l};
    fgt_free_all(all, 9);
    free(hx);
    free(g);
}
END_TEST

/* The root is a leaf; and dropping every handle before backward. */
START_TEST(test_leaf_root_and_lifetimes)
{
    fg_tensor *x;
    FGT_OK(fg_tensor_scalar(FG_FP64, FG_DEVICE_CPU, 3.0, &x));
    FGT_OK(fg_tensor_set_requires_grad(x, 1));
    FGT_OK(fg_backward(x));
    ck_assert(fgt_item(fg_tensor_grad(x)) == 1.0);
    fg_tensor_free(x);

    fgt_rng r = fgt_rng_for(208);
    fg_tensor *w = fgt_rand(&r, FG_FP64, FG_SHAPE(3, 3), 1, 0, 1);
    fg_tensor *h1, *h2, *l;
    FGT_OK(fg_matmul(w, w, 0, 1, &h1));
    FGT_OK(fg_tanh(h1, &h2));
    fg_tensor_free(h1);
    FGT_OK(fg_mean(h2, NULL, 0, 0, &l));
    fg_tensor_free(h2);
    fg_tensor *wg = w;
    fg_tensor_retain(wg);
    fg_tensor_free(w); /* the user's handle is gone; the graph holds w */
    FGT_OK(fg_backward(l));
    ck_assert_ptr_nonnull(fg_tensor_grad(wg));
    fg_tensor_free(l);
    fg_tensor_free(wg);
}
END_TEST

/* Gradients stay exact in fp32 for a linear function (dtype handling). */
START_TEST(test_fp32_and_cast)
{
    fgt_rng r = fgt_rng_for(209);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(6), 1, 0, 1);
    fg_tensor *x32, *y, *l;
    FGT_OK(fg_cast(x, FG_FP32, &x32));
    ck_assert_int_eq(fg_tensor_dtype(x32), FG_FP32);
    FGT_OK(fg_scale(x32, 0.5, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    ck_assert_int_eq(fg_tensor_dtype(fg_tensor_grad(x)), FG_FP64);
    double *g = fgt_host(fg_tensor_grad(x));
    for (int i = 0; i < 6; i++)
        ck_assert(g[i] == 0.5);
    fg_tensor *bad;
    FGT_FAILS(fg_add(x, x32, &bad), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_cast(x, FG_FP16, &bad), FG_ERR_UNSUPPORTED);
    fg_tensor *all[] = {x, x32, y, l};
    fgt_free_all(all, 4);
    free(g);
}
END_TEST

/* A strided (transposed) seed gradient flows through every kind of op. */
START_TEST(test_strided_seed_gradient)
{
    fgt_rng r = fgt_rng_for(210);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(3, 4), 1, 0, 1);
    fg_tensor *gt = fgt_rand(&r, FG_FP64, FG_SHAPE(4, 3), 1, 0, 0);
    fg_tensor *g, *y;
    FGT_OK(fg_transpose(gt, 0, 1, &g)); /* [3, 4], not contiguous */
    ck_assert(!fg_tensor_is_contiguous(g));
    FGT_OK(fg_tanh(x, &y));
    FGT_OK(fg_backward_with(y, g));
    double *hx = fgt_host(x), *hg = fgt_host(g), *gx = fgt_host(fg_tensor_grad(x));
    for (int i = 0; i < 12; i++) {
        double t = tanh(hx[i]);
        ck_assert(fabs(gx[i] - hg[i] * (1 - t * t)) < 1e-15);
    }
    fg_tensor *all[] = {x, gt, g, y};
    fgt_free_all(all, 4);
    free(hx);
    free(hg);
    free(gx);
}
END_TEST

FGT_MAIN_BEGIN("autograd")
FGT_TEST(test_basic_and_accumulate)
FGT_TEST(test_diamond)
FGT_TEST(test_retain_grad)
FGT_TEST(test_no_grad)
FGT_TEST(test_errors)
FGT_TEST(test_version_check)
FGT_TEST(test_fg_grad_and_free_graph)
FGT_TEST(test_multi_output)
FGT_TEST(test_leaf_root_and_lifetimes)
FGT_TEST(test_fp32_and_cast)
FGT_TEST(test_strided_seed_gradient)
FGT_MAIN_END()
