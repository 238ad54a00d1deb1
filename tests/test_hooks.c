/* SPDX-License-Identifier: MIT */
/* tests/test_hooks.c - autograd hooks: firing order (tensor hooks ->
 * pre-hooks -> retain_grad update -> node -> post-hooks; leaves: tensor
 * hooks -> .grad update -> post-accumulate hooks), replacement of
 * gradients, removal by handle (also from inside a hook and after the owner
 * died), a post-accumulate hook doing an optimizer step, hooks on tensors
 * used several times firing once with the summed gradient, and failures. */
#include "test_ops_util.h"

/* ---- a log of what fired -------------------------------------------- */

static char g_log[512];
static void logf_(const char *s)
{
    strncat(g_log, s, sizeof g_log - strlen(g_log) - 1);
    strncat(g_log, " ", sizeof g_log - strlen(g_log) - 1);
}

/* All elements of t equal v? */
static int all_eq(const fg_tensor *t, double v)
{
    double *h = fgt_host(t);
    int ok = 1;
    for (int64_t i = 0; i < fg_tensor_numel(t); i++)
        ok &= fabs(h[i] - v) < 1e-12;
    free(h);
    return ok;
}

static fg_status scaled(fg_tensor *g, double k, fg_tensor **out)
{
    return fg_scale(g, k, out);
}

/* ---- firing order on a node ------------------------------------------ */

typedef struct order_ctx {
    fg_tensor *y; /* the MulBackward output */
    fg_tensor *b; /* so dL/da = g * b */
} order_ctx;

static fg_status t1(fg_tensor *g, fg_tensor **rep, void *u)
{
    logf_("T1");
    ck_assert(all_eq(g, 1.0));
    return scaled(g, 2.0, rep);
}
static fg_status t2(fg_tensor *g, fg_tensor **rep, void *u)
{
    logf_("T2");
    ck_assert(all_eq(g, 2.0)); /* sees T1's replacement */
    return FG_OK;
}
static fg_status p1(fg_node *n, fg_tensor *const *go, int no, fg_tensor **rep,
                    void *u)
{
    order_ctx *c = u;
    logf_("P1");
    ck_assert_int_eq(no, 1);
    ck_assert(all_eq(go[0], 2.0));               /* after tensor hooks */
    ck_assert_ptr_null(fg_tensor_grad(c->y));    /* before retain_grad */
    ck_assert_str_eq(fg_node_name(n), "MulBackward");
    return scaled(go[0], 1.5, &rep[0]);
}
static fg_status p2(fg_node *n, fg_tensor *const *go, int no, fg_tensor **rep,
                    void *u)
{
    logf_("P2");
    ck_assert(all_eq(go[0], 3.0));
    return FG_OK;
}
static fg_status q1(fg_node *n, fg_tensor *const *gi, int ni,
                    fg_tensor *const *go, int no, fg_tensor **rep, void *u)
{
    order_ctx *c = u;
    logf_("Q1");
    ck_assert_int_eq(ni, 2);
    /* retain_grad stored the gradient after the pre-hooks */
    ck_assert_ptr_nonnull(fg_tensor_grad(c->y));
    ck_assert(all_eq(fg_tensor_grad(c->y), 3.0));
    ck_assert(all_eq(go[0], 3.0));
    /* the node ran: grad_inputs[0] = 3 * b */
    double *gb = fgt_host(gi[0]), *hb = fgt_host(c->b);
    for (int i = 0; i < 4; i++)
        ck_assert(fabs(gb[i] - 3 * hb[i]) < 1e-12);
    free(gb);
    free(hb);
    return FG_OK;
}
static fg_status q2(fg_node *n, fg_tensor *const *gi, int ni,
                    fg_tensor *const *go, int no, fg_tensor **rep, void *u)
{
    logf_("Q2");
    /* replace grad_inputs[1] (b's) by zeros */
    return fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, fg_tensor_ndim(gi[1]),
                           fg_tensor_shape(gi[1]), &rep[1]);
}
static fg_status leaf_t(fg_tensor *g, fg_tensor **rep, void *u)
{
    logf_((const char *)u);
    return FG_OK;
}
static fg_status leaf_acc(fg_tensor *leaf, void *u)
{
    logf_((const char *)u);
    ck_assert_ptr_nonnull(fg_tensor_grad(leaf));
    return FG_OK;
}

START_TEST(test_order_and_replacement)
{
    fgt_rng r = fgt_rng_for(300);
    fg_tensor *a = fgt_rand(&r, FG_FP64, FG_SHAPE(2, 2), 1, 0, 1);
    fg_tensor *b = fgt_rand(&r, FG_FP64, FG_SHAPE(2, 2), 1, 0, 1);
    fg_tensor *y, *l;
    g_log[0] = 0;
    FGT_OK(fg_mul(a, b, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    order_ctx c = {y, b};
    fg_node *n = fg_tensor_grad_fn(y);
    /* Registered out of order on purpose: kinds fire in their fixed order,
     * and within a kind in registration order. */
    FGT_OK(fg_node_register_post_hook(n, q1, &c, NULL));
    FGT_OK(fg_node_register_pre_hook(n, p1, &c, NULL));
    FGT_OK(fg_tensor_register_hook(y, t1, NULL, NULL));
    FGT_OK(fg_node_register_post_hook(n, q2, &c, NULL));
    FGT_OK(fg_tensor_retain_grad(y));
    FGT_OK(fg_node_register_pre_hook(n, p2, &c, NULL));
    FGT_OK(fg_tensor_register_hook(y, t2, NULL, NULL));
    FGT_OK(fg_tensor_register_post_accumulate_hook(a, leaf_acc, "AACC",
                                                   NULL));
    FGT_OK(fg_tensor_register_hook(a, leaf_t, "AT", NULL));
    FGT_OK(fg_backward(l));
    ck_assert_str_eq(g_log, "T1 T2 P1 P2 Q1 Q2 AT AACC ");
    /* a got 3 b (from the node); b's gradient was replaced by zeros. */
    double *ga = fgt_host(fg_tensor_grad(a)), *hb = fgt_host(b);
    for (int i = 0; i < 4; i++)
        ck_assert(fabs(ga[i] - 3 * hb[i]) < 1e-12);
    ck_assert(all_eq(fg_tensor_grad(b), 0.0));
    free(ga);
    free(hb);
    fg_tensor *all[] = {a, b, y, l};
    fgt_free_all(all, 4);
}
END_TEST

/* ---- removal ------------------------------------------------------------ */

static int g_count;
static fg_status counting(fg_tensor *g, fg_tensor **rep, void *u)
{
    g_count++;
    return FG_OK;
}
static fg_status remove_self(fg_tensor *g, fg_tensor **rep, void *u)
{
    g_count += 100;
    fg_hook **h = u;
    fg_hook_remove(*h);
    *h = NULL;
    return FG_OK;
}
static fg_status counting_pre(fg_node *n, fg_tensor *const *go, int no,
                              fg_tensor **rep, void *u)
{
    g_count++;
    return FG_OK;
}
static fg_status times10(fg_tensor *g, fg_tensor **rep, void *u)
{
    return fg_scale(g, 10.0, rep);
}

static void run_sum(fg_tensor *x)
{
    fg_tensor *l;
    FGT_OK(fg_sum(x, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    fg_tensor_free(l);
}

START_TEST(test_remove_by_handle)
{
    fg_tensor *x;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(3), &x));
    FGT_OK(fg_tensor_set_requires_grad(x, 1));
    fg_hook *h1, *h2, *hself, *h10;
    g_count = 0;
    FGT_OK(fg_tensor_register_hook(x, counting, NULL, &h1));
    FGT_OK(fg_tensor_register_hook(x, remove_self, &hself, &hself));
    FGT_OK(fg_tensor_register_hook(x, counting, NULL, &h2));
    FGT_OK(fg_tensor_register_hook(x, times10, NULL, &h10));
    run_sum(x);
    ck_assert_int_eq(g_count, 102);
    ck_assert(all_eq(fg_tensor_grad(x), 10.0));
    ck_assert_ptr_null(hself);
    fg_hook_remove(h1);
    fg_hook_remove(h10);
    run_sum(x); /* only h2 left */
    ck_assert_int_eq(g_count, 103);
    ck_assert(all_eq(fg_tensor_grad(x), 11.0));
    /* Freeing the handle keeps the hook; removing twice is harmless. */
    fg_hook_handle_free(h2);
    run_sum(x);
    ck_assert_int_eq(g_count, 104);
    fg_hook_remove(NULL);
    fg_hook_handle_free(NULL);
    fg_tensor_free(x);
}
END_TEST

/* A handle that outlives its tensor and node (heap and arena). */
START_TEST(test_handle_outlives_owner)
{
    fgt_rng r = fgt_rng_for(301);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 1);
    fg_tensor *y, *l;
    fg_hook *h, *hp, *hx;
    FGT_OK(fg_exp(x, &y));
    FGT_OK(fg_tensor_register_hook(y, counting, NULL, &h));
    FGT_OK(fg_node_register_pre_hook(fg_tensor_grad_fn(y), counting_pre,
                                     NULL, &hp));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    /* The hook is on y's grad_fn: it fires even though y's handle is gone. */
    fg_tensor_free(y);
    g_count = 0;
    FGT_OK(fg_backward(l));
    ck_assert_int_eq(g_count, 2); /* tensor hook + pre-hook */
    fg_tensor_free(l); /* node dies */
    fg_hook_remove(h); /* safe: just frees the handle */
    fg_hook_remove(hp);
    FGT_OK(fg_tensor_register_hook(x, counting, NULL, &hx));
    fg_tensor_free(x);
    fg_hook_remove(hx);

    fg_arena *a;
    FGT_OK(fg_arena_create(0, &a));
    FGT_OK(fg_arena_push(a));
    fg_tensor *p = fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 1);
    FGT_OK(fg_tanh(p, &y));
    FGT_OK(fg_tensor_register_hook(y, counting, NULL, &h));
    FGT_OK(fg_tensor_register_hook(p, counting, NULL, &hx));
    FGT_OK(fg_arena_pop(a));
    FGT_OK(fg_arena_reset(a)); /* owners gone */
    fg_hook_remove(h);
    fg_hook_remove(hx);
    fg_arena_free(a);
}
END_TEST

/* ---- post-accumulate: an SGD step inside backward ------------------------ */

typedef struct sgd_ctx {
    const double *expect_grad; /* what .grad must hold when the hook runs */
    double lr;
    int calls;
} sgd_ctx;

static fg_status sgd_step(fg_tensor *w, void *u)
{
    sgd_ctx *c = u;
    c->calls++;
    ck_assert(!fg_grad_enabled()); /* hooks run under no_grad */
    double *g = fgt_host(fg_tensor_grad(w)), *hw = fgt_host(w);
    for (int i = 0; i < 4; i++) {
        ck_assert(fabs(g[i] - c->expect_grad[i]) < 1e-12);
        hw[i] -= c->lr * g[i];
    }
    fg_status s = fg_tensor_copy_from_host(w, FG_FP64, hw, 4);
    free(g);
    free(hw);
    return s;
}

START_TEST(test_post_accumulate_sgd)
{
    fgt_rng r = fgt_rng_for(302);
    fg_tensor *w = fgt_rand(&r, FG_FP64, FG_SHAPE(4), 1, 0, 1);
    fg_tensor *c = fgt_rand(&r, FG_FP64, FG_SHAPE(4), 1, 0, 0);
    double *hc = fgt_host(c), *w0 = fgt_host(w), two_c[4];
    sgd_ctx ctx = {hc, 0.1, 0};
    fg_hook *h;
    FGT_OK(fg_tensor_register_post_accumulate_hook(w, sgd_step, &ctx, &h));
    fg_tensor *y, *loss;
    FGT_OK(fg_mul(w, c, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &loss));
    FGT_OK(fg_backward(loss));
    ck_assert_int_eq(ctx.calls, 1);
    double *w1 = fgt_host(w);
    for (int i = 0; i < 4; i++) {
        ck_assert(fabs(w1[i] - (w0[i] - 0.1 * hc[i])) < 1e-15);
        two_c[i] = 2 * hc[i];
    }
    /* Second step without zero_grad: the hook sees the accumulated 2c. */
    fg_tensor_free(y);
    fg_tensor_free(loss);
    ctx.expect_grad = two_c;
    FGT_OK(fg_mul(w, c, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &loss));
    FGT_OK(fg_backward(loss));
    ck_assert_int_eq(ctx.calls, 2);
    fg_hook_remove(h);
    fg_tensor *all[] = {w, c, y, loss};
    fgt_free_all(all, 4);
    free(hc);
    free(w0);
    free(w1);
}
END_TEST

/* ---- used several times: one call with the summed gradient --------------- */

typedef struct sum_ctx {
    int calls;
    double *expect;
    int n;
} sum_ctx;

static fg_status check_sum(fg_tensor *g, fg_tensor **rep, void *u)
{
    sum_ctx *c = u;
    c->calls++;
    double *h = fgt_host(g);
    for (int i = 0; i < c->n; i++)
        ck_assert_msg(fabs(h[i] - c->expect[i]) < 1e-12, "%g vs %g", h[i],
                      c->expect[i]);
    free(h);
    return FG_OK;
}

START_TEST(test_used_twice_fires_once)
{
    fgt_rng r = fgt_rng_for(303);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(5), 1, 0, 1);
    double *hx = fgt_host(x), ex[5], eh[5];
    fg_tensor *h, *hh, *s, *t, *l;
    FGT_OK(fg_tanh(x, &h));
    /* l = sum(h*h + h + x):  dl/dh = 2h + 1;  dl/dx = (2h+1)(1-h^2) + 1 */
    FGT_OK(fg_mul(h, h, &hh));
    FGT_OK(fg_add(hh, h, &s));
    FGT_OK(fg_add(s, x, &t));
    FGT_OK(fg_sum(t, NULL, 0, 0, &l));
    for (int i = 0; i < 5; i++) {
        double th = tanh(hx[i]);
        eh[i] = 2 * th + 1;
        ex[i] = eh[i] * (1 - th * th) + 1;
    }
    sum_ctx cx = {0, ex, 5}, ch = {0, eh, 5};
    FGT_OK(fg_tensor_register_hook(x, check_sum, &cx, NULL));
    FGT_OK(fg_tensor_register_hook(h, check_sum, &ch, NULL));
    FGT_OK(fg_backward(l));
    ck_assert_int_eq(cx.calls, 1);
    ck_assert_int_eq(ch.calls, 1);
    fg_tensor *all[] = {x, h, hh, s, t, l};
    fgt_free_all(all, 6);
    free(hx);
}
END_TEST

/* ---- failures -------------------------------------------------------------- */

static fg_status failing(fg_tensor *g, fg_tensor **rep, void *u)
{
    return FG_ERR_IO;
}
static fg_status wrong_shape(fg_tensor *g, fg_tensor **rep, void *u)
{
    return fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(7), rep);
}
static fg_status fail_after_replacing(fg_node *n, fg_tensor *const *go,
                                      int no, fg_tensor **rep, void *u)
{
    FGT_OK(fg_scale(go[0], 2.0, &rep[0])); /* must not leak */
    return FG_ERR_INVALID_ARGUMENT;
}

START_TEST(test_hook_failures)
{
    fgt_rng r = fgt_rng_for(304);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 1);
    fg_tensor *y, *l;
    FGT_OK(fg_exp(x, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    fg_hook *h;
    FGT_OK(fg_tensor_register_hook(y, failing, NULL, &h));
    FGT_FAILS(fg_backward_ex(l, NULL, FG_BACKWARD_RETAIN_GRAPH), FG_ERR_IO);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "a tensor hook failed"));
    ck_assert_ptr_null(fg_tensor_grad(x));
    fg_hook_remove(h);
    FGT_OK(fg_tensor_register_hook(y, wrong_shape, NULL, &h));
    FGT_FAILS(fg_backward_ex(l, NULL, FG_BACKWARD_RETAIN_GRAPH),
              FG_ERR_INVALID_ARGUMENT);
    fg_hook_remove(h);
    FGT_OK(fg_node_register_pre_hook(fg_tensor_grad_fn(y),
                                     fail_after_replacing, NULL, &h));
    FGT_FAILS(fg_backward_ex(l, NULL, FG_BACKWARD_RETAIN_GRAPH),
              FG_ERR_INVALID_ARGUMENT);
    fg_hook_remove(h);
    FGT_OK(fg_backward(l)); /* all hooks gone: works */
    ck_assert_ptr_nonnull(fg_tensor_grad(x));
    /* Registration errors. */
    fg_tensor *c;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2), &c));
    FGT_FAILS(fg_tensor_register_hook(c, counting, NULL, NULL), FG_ERR_STATE);
    FGT_FAILS(fg_tensor_register_post_accumulate_hook(y, leaf_acc, NULL,
                                                      NULL),
              FG_ERR_STATE);
    FGT_FAILS(fg_tensor_register_hook(x, NULL, NULL, NULL),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_node_register_post_hook(NULL, q1, NULL, NULL),
              FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {x, y, l, c};
    fgt_free_all(all, 4);
}
END_TEST

/* A hook that runs backward again over the graph that called it: the
 * nested pass once freed the gradient the outer pass had handed this hook
 * (a use after free). Refused now, in the hook; the outer pass carries
 * the hook's failure and the graph works afterwards. */
typedef struct reenter {
    fg_tensor *loss;
    fg_status nested;
    double first; /* the hook's gradient, read after the nested call */
} reenter;

static fg_status reentering(fg_tensor *grad, fg_tensor **replace, void *user)
{
    (void)replace;
    reenter *r = user;
    r->nested = fg_backward_ex(r->loss, NULL, FG_BACKWARD_RETAIN_GRAPH);
    r->first = ((const double *)fg_tensor_data(grad))[0];
    return r->nested == FG_OK ? FG_OK : FG_ERR_STATE;
}

START_TEST(test_no_reentrant_backward)
{
    fg_tensor *x, *y, *l;
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(3), 0.5, &x));
    FGT_OK(fg_tensor_set_requires_grad(x, 1));
    FGT_OK(fg_exp(x, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    reenter r = {l, FG_OK, 0};
    fg_hook *h;
    FGT_OK(fg_tensor_register_hook(y, reentering, &r, &h));
    FGT_FAILS(fg_backward_ex(l, NULL, FG_BACKWARD_RETAIN_GRAPH), FG_ERR_STATE);
    ck_assert_int_eq(r.nested, FG_ERR_STATE);
    ck_assert(r.first == 1.0); /* the hook's gradient is still alive */
    ck_assert_ptr_null(fg_tensor_grad(x));
    fg_hook_remove(h);
    FGT_OK(fg_backward(l)); /* no pass left marked as running */
    const double *g = fg_tensor_data(fg_tensor_grad(x));
    ck_assert(fabs(g[0] - exp(0.5)) < 1e-15);
    fg_tensor *all[] = {x, y, l};
    fgt_free_all(all, 3);
}
END_TEST

FGT_MAIN_BEGIN("hooks")
FGT_TEST(test_order_and_replacement)
FGT_TEST(test_remove_by_handle)
FGT_TEST(test_handle_outlives_owner)
FGT_TEST(test_post_accumulate_sgd)
FGT_TEST(test_used_twice_fires_once)
FGT_TEST(test_hook_failures)
FGT_TEST(test_no_reentrant_backward)
FGT_MAIN_END()
