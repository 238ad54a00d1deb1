/* SPDX-License-Identifier: MIT */
/* tests/test_gradcheck.c - the gradcheck API itself: it passes correct
 * gradients, catches a wrong one (and reports the right element), catches
 * a backward that is not reentrant, works in fast mode, restores its inputs
 * bit for bit without touching .grad, and reports misuse as statuses. */
#include "test_ops_util.h"

/* y = tanh(x0) * x1 + x0 (x1 may not require grad) */
static fg_status fn_ok(fg_tensor *const *in, int n, fg_tensor **out, void *u)
{
    fg_tensor *t, *m;
    FGT_TRY(fg_tanh(in[0], &t));
    fg_status s = fg_mul(t, in[1], &m);
    fg_tensor_free(t);
    FGT_TRY(s);
    s = fg_add(m, in[0], out);
    fg_tensor_free(m);
    return s;
}

/* A hook on the leaf that corrupts element 3 of its gradient. */
static fg_status corrupt3(fg_tensor *g, fg_tensor **rep, void *u)
{
    double *h = fgt_host(g);
    h[3] += *(double *)u;
    fg_tensor *r;
    fg_status s = fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU,
                                      fg_tensor_ndim(g), fg_tensor_shape(g), h,
                                      &r);
    free(h);
    *rep = r;
    return s;
}

static int g_calls;
static fg_status flaky(fg_tensor *g, fg_tensor **rep, void *u)
{
    return fg_scale(g, 1.0 + 1e-9 * (g_calls++ % 2), rep);
}

START_TEST(test_pass_and_restore)
{
    fgt_rng r = fgt_rng_for(600);
    fg_tensor *in[2] = {fgt_rand(&r, FG_FP64, FG_SHAPE(2, 3), 1, 0, 1),
                        fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 0)};
    double *before = fgt_host(in[0]);
    fg_gradcheck_report rep;
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, NULL, &rep));
    ck_assert_msg(rep.passed, "%s", rep.message);
    ck_assert(rep.reentrant);
    ck_assert_int_eq(rep.n_checked, 6 * 6); /* only x0 requires grad */
    ck_assert_int_eq(rep.n_failed, 0);
    ck_assert(rep.worst_ratio <= 1.0 && rep.worst_input == 0);
    ck_assert_ptr_nonnull(strstr(rep.message, "ok"));
    double *after = fgt_host(in[0]);
    ck_assert(memcmp(before, after, 6 * sizeof(double)) == 0);
    ck_assert_ptr_null(fg_tensor_grad(in[0]));
    /* Fast mode, and inside an active arena. */
    fg_arena *a;
    FGT_OK(fg_arena_create(0, &a));
    FGT_OK(fg_arena_push(a));
    fg_gradcheck_options o;
    fg_gradcheck_options_init(&o);
    o.fast_mode = 1;
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, &o, &rep));
    ck_assert_msg(rep.passed, "%s", rep.message);
    ck_assert_int_eq(rep.n_checked, 1);
    FGT_OK(fg_arena_pop(a));
    fg_arena_stats st;
    FGT_OK(fg_arena_get_stats(a, &st));
    ck_assert_uint_eq(st.live_objects, 0); /* gradcheck used the heap */
    fg_arena_free(a);
    fgt_free_all(in, 2);
    free(before);
    free(after);
}
END_TEST

START_TEST(test_detects_wrong_gradient)
{
    fgt_rng r = fgt_rng_for(601);
    fg_tensor *in[2] = {fgt_rand(&r, FG_FP64, FG_SHAPE(2, 3), 1, 0, 1),
                        fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 1)};
    double delta = 1e-2;
    fg_hook *h;
    FGT_OK(fg_tensor_register_hook(in[0], corrupt3, &delta, &h));
    fg_gradcheck_report rep;
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, NULL, &rep));
    ck_assert(!rep.passed);
    ck_assert(rep.reentrant);
    ck_assert_int_eq(rep.n_checked, 6 * 9);
    ck_assert_int_eq(rep.n_failed, 6); /* column 3 of input 0 */
    ck_assert_int_eq(rep.worst_input, 0);
    ck_assert_int_eq(rep.worst_in_elem, 3);
    ck_assert(fabs(rep.worst_analytical - rep.worst_numerical - delta) < 1e-6);
    ck_assert(rep.worst_ratio > 1.0);
    ck_assert_ptr_nonnull(strstr(rep.message, "outside tolerance"));
    /* A corruption within tolerance passes (atol 1e-5). */
    delta = 1e-7;
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, NULL, &rep));
    ck_assert_msg(rep.passed, "%s", rep.message);
    /* Fast mode sees it too. Its probe adds delta * u[3] to v^T J u, so
     * the check is only as strong as |u[3]|: a random probe seed made this
     * fail for ~15% of seeds (|u[3]| small). The probe seed is fixed here
     * (u[3] is then a fixed number, not small) and the inputs stay random. */
    delta = 0.5;
    fg_gradcheck_options o;
    fg_gradcheck_options_init(&o);
    o.fast_mode = 1;
    o.seed = 7;
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, &o, &rep));
    ck_assert(!rep.passed && rep.worst_input == 0 && rep.n_failed == 1);
    fg_hook_remove(h);
    /* Not reentrant: the two backward runs differ in the last bits. */
    FGT_OK(fg_tensor_register_hook(in[1], flaky, NULL, &h));
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, NULL, &rep));
    ck_assert(!rep.reentrant && !rep.passed);
    ck_assert_ptr_nonnull(strstr(rep.message, "reentrant"));
    o.check_reentrant = 0;
    o.fast_mode = 0;
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, &o, &rep));
    ck_assert_msg(rep.passed, "%s", rep.message);
    fg_hook_remove(h);
    fgt_free_all(in, 2);
}
END_TEST

static fg_status fn_fail(fg_tensor *const *in, int n, fg_tensor **out,
                         void *u)
{
    return fg_reshape(in[0], FG_SHAPE(7, 7), out);
}

static int g_evals;
static fg_status fn_shape_changes(fg_tensor *const *in, int n,
                                  fg_tensor **out, void *u)
{
    if (g_evals++ == 0)
        return fg_exp(in[0], out);
    return fg_sum(in[0], NULL, 0, 0, out);
}

static fg_status fn_detached(fg_tensor *const *in, int n, fg_tensor **out,
                             void *u)
{
    return fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2), out);
}

START_TEST(test_misuse)
{
    fgt_rng r = fgt_rng_for(602);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 1);
    fg_tensor *x32 = fgt_rand(&r, FG_FP32, FG_SHAPE(3), 1, 0, 1);
    fg_tensor *c = fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 0);
    fg_gradcheck_report rep;
    rep.passed = 42;
    FGT_FAILS(fg_gradcheck(fn_ok, NULL, &c, 1, NULL, &rep),
              FG_ERR_INVALID_ARGUMENT); /* nothing requires grad */
    ck_assert_int_eq(rep.passed, 42);  /* report untouched */
    fg_tensor *in32[2] = {x32, x32};
    FGT_FAILS(fg_gradcheck(fn_ok, NULL, in32, 2, NULL, &rep),
              FG_ERR_INVALID_ARGUMENT);
    fg_gradcheck_options o;
    fg_gradcheck_options_init(&o);
    o.allow_fp32 = 1;
    o.eps = 1e-2;
    o.atol = 1e-2;
    o.rtol = 1e-2;
    FGT_OK(fg_gradcheck(fn_ok, NULL, in32, 2, &o, &rep));
    ck_assert_msg(rep.passed, "%s", rep.message);
    FGT_FAILS(fg_gradcheck(fn_fail, NULL, &x, 1, NULL, &rep),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "fg_reshape"));
    g_evals = 0;
    FGT_FAILS(fg_gradcheck(fn_shape_changes, NULL, &x, 1, NULL, &rep),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gradcheck(fn_detached, NULL, &x, 1, NULL, &rep),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gradcheck(NULL, NULL, &x, 1, NULL, &rep),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gradcheck(fn_ok, NULL, &x, 1, NULL, NULL),
              FG_ERR_INVALID_ARGUMENT);
    o.eps = 0;
    FGT_FAILS(fg_gradcheck(fn_ok, NULL, &x, 1, &o, &rep),
              FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {x, x32, c};
    fgt_free_all(all, 3);
}
END_TEST

FGT_MAIN_BEGIN("gradcheck")
FGT_TEST(test_pass_and_restore)
FGT_TEST(test_detects_wrong_gradient)
FGT_TEST(test_misuse)
FGT_MAIN_END()
