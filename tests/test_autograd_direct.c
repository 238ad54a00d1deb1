/* SPDX-License-Identifier: MIT */
/* tests/test_autograd_direct.c - the per-parameter work of a training step
 * on the CPU: a cast's backward adding straight into the parameter's .grad
 * (bit-identical to the cast + accumulation it replaces, which a no-op
 * tensor hook forces), post-accumulate hooks still firing, and the
 * gradient matching an fp64 reference; a parameter's cached cast
 * (fg_cast_param) equal to fg_cast bit for bit, reused while the parameter
 * is unchanged, refreshed after fg_tensor_copy and AdamW, and replaced
 * (not overwritten) while a graph still holds it; fg_linear on the CPU is
 * fg_matmul + fg_add bit for bit; a layernorm's backward adding into the
 * residual fork's pending gradient (residual_fork.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flashgrad/flashgrad.h"
#include "lib/ops/ops_internal.h"
#include "test_ops_util.h"
#include "residual_fork.h"

enum { M = 7, K = 5, N = 6 };

static fg_status count_hook(fg_tensor *leaf, void *user)
{
    (void)leaf;
    ++*(int *)user;
    return FG_OK;
}

/* loss = sum(x @ cast(w, dt)) (+ sum(w) when tied: a second edge to w),
 * backward; returns the host allocations the backward made. */
static uint64_t step(fg_tensor *w, fg_tensor *x, fg_dtype dt, int tied)
{
    fg_tensor *wc = NULL, *y = NULL, *l = NULL, *lw = NULL, *tot = NULL;
    FGT_OK(fg_cast(w, dt, &wc));
    FGT_OK(fg_matmul(x, wc, 0, 0, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    if (tied) {
        fg_tensor *lc = NULL;
        FGT_OK(fg_sum(w, NULL, 0, 0, &lw));
        FGT_OK(fg_cast(lw, dt, &lc));
        FGT_OK(fg_add(l, lc, &tot));
        fg_tensor_free(lc);
    } else {
        tot = fg_tensor_retain(l);
    }
    fg_memory_stats a, b;
    fg_memory_get_stats(&a);
    FGT_OK(fg_backward(tot));
    fg_memory_get_stats(&b);
    fg_tensor *all[] = {wc, y, l, lw, tot};
    fgt_free_all(all, 5);
    return b.host_allocs - a.host_allocs;
}

/* The parameter in dtype pdt, used through a cast to cdt: two backwards
 * (the second adds into an existing .grad, the direct path) against the
 * same with a no-op tensor hook (the engine's general path), bit for bit,
 * and against the fp64 gradient 2 x^T 1 (+ 2 when tied). */
static void check_direct(fg_dtype pdt, fg_dtype cdt, int tied)
{
    fgt_rng r = fgt_rng_for(0xd1ec7 + 16 * pdt + 4 * cdt + tied);
    fg_tensor *w = fgt_rand(&r, pdt, FG_SHAPE(K, N), 1.0, 0.1, 1);
    fg_tensor *x = fgt_rand(&r, cdt, FG_SHAPE(M, K), 1.0, 0.1, 0);
    fg_tensor *w2 = NULL;
    FGT_OK(fg_tensor_zeros(pdt, FG_DEVICE_CPU, FG_SHAPE(K, N), &w2));
    FGT_OK(fg_tensor_copy(w2, w));
    FGT_OK(fg_tensor_set_requires_grad(w2, 1));
    fg_hook *h = NULL, *ha = NULL, *hb = NULL;
    FGT_OK(fg_tensor_register_hook(w2, fgt_noop_hook, NULL, &h));
    int fired = 0, fired2 = 0;
    FGT_OK(fg_tensor_register_post_accumulate_hook(w, count_hook, &fired,
                                                   &ha));
    FGT_OK(fg_tensor_register_post_accumulate_hook(w2, count_hook, &fired2,
                                                   &hb));
    step(w, x, cdt, tied);
    step(w2, x, cdt, tied);
    const uint64_t direct = step(w, x, cdt, tied);
    const uint64_t general = step(w2, x, cdt, tied);
    ck_assert_int_eq(fired, 2);
    ck_assert_int_eq(fired2, 2);
    if (!tied) /* no temporary for the converted gradient */
        ck_assert_msg(direct < general, "direct path not taken: %llu vs "
                      "%llu allocations", (unsigned long long)direct,
                      (unsigned long long)general);
    double *g = fgt_host(fg_tensor_grad(w)), *g2 = fgt_host(fg_tensor_grad(w2));
    double *hx = fgt_host(x);
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            double ref = 0;
            for (int m = 0; m < M; m++)
                ref += hx[m * K + k];
            ref = 2 * (ref + (tied ? 1 : 0));
            const double got = g[k * N + n];
            ck_assert_msg(memcmp(&got, &g2[k * N + n], sizeof got) == 0,
                          "(%d, %d): %.17g vs the general path's %.17g", k,
                          n, got, g2[k * N + n]);
            ck_assert_msg(fabs(got - ref) <= 1e-5 * (1 + fabs(ref)),
                          "(%d, %d): %.9g, reference %.9g", k, n, got, ref);
        }
    free(g);
    free(g2);
    free(hx);
    fg_hook_remove(h);
    fg_hook_remove(ha);
    fg_hook_remove(hb);
    fg_tensor *all[] = {w, x, w2};
    fgt_free_all(all, 3);
}

START_TEST(test_cast_backward_into_grad)
{
    check_direct(FG_FP32, FG_FP64, 0);
    check_direct(FG_FP64, FG_FP32, 0);
    check_direct(FG_FP32, FG_FP64, 1);
}
END_TEST

/* The residual stream's fork: the layernorm's backward adds into the
 * pending gradient (residual_fork.h), equal to the general path bit for
 * bit. */
START_TEST(test_residual_fork_cpu)
{
    check_residual_fork(FG_DEVICE_CPU, FG_FP32, FG_FP32, 9, 37, 0x4e51);
    check_residual_fork(FG_DEVICE_CPU, FG_FP64, FG_FP64, 9, 37, 0x4e52);
    check_residual_fork(FG_DEVICE_CPU, FG_FP64, FG_FP32, 9, 37, 0x4e53);
}
END_TEST

/* fg_cast_param(w) holds fg_cast(w)'s bits. */
static void assert_cast_equal(fg_tensor *w, fg_tensor *wc)
{
    fg_tensor *ref = NULL;
    FGT_OK(fg_cast(w, fg_tensor_dtype(wc), &ref));
    double *a = fgt_host(wc), *b = fgt_host(ref);
    ck_assert(memcmp(a, b, sizeof(double) * (size_t)fg_tensor_numel(w)) == 0);
    free(a);
    free(b);
    fg_tensor_free(ref);
}

START_TEST(test_cached_cast)
{
    fgt_rng r = fgt_rng_for(0xcac4e);
    fg_tensor *w = fgt_rand(&r, FG_FP32, FG_SHAPE(K, N), 1.0, 0.1, 1);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(M, K), 1.0, 0.1, 0);
    fg_tensor *w2 = NULL, *a = NULL, *b = NULL;
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(K, N), &w2));
    FGT_OK(fg_tensor_copy(w2, w));
    FGT_OK(fg_tensor_set_requires_grad(w2, 1));
    /* made once, then the same copy while w is unchanged */
    FGT_OK(fg_cast_param(w, FG_FP64, &a));
    FGT_OK(fg_cast_param(w, FG_FP64, &b));
    ck_assert_ptr_eq(fg_tensor_data(a), fg_tensor_data(b));
    assert_cast_equal(w, a);
    fg_tensor_free(b);
    /* the gradient reaches w as through fg_cast (bit for bit) */
    fg_tensor *y = NULL, *l = NULL, *c2 = NULL, *y2 = NULL, *l2 = NULL;
    FGT_OK(fg_matmul(x, a, 0, 0, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    FGT_OK(fg_cast(w2, FG_FP64, &c2));
    FGT_OK(fg_matmul(x, c2, 0, 0, &y2));
    FGT_OK(fg_sum(y2, NULL, 0, 0, &l2));
    /* while the graph holds the copy, a write to w makes the next use
     * take a new copy: the saved one stays intact for the backward */
    fg_tensor *w_new = fgt_rand(&r, FG_FP32, FG_SHAPE(K, N), 1.0, 0.1, 0);
    fg_no_grad_begin();
    FGT_OK(fg_tensor_copy(w, w_new));
    FGT_OK(fg_no_grad_end());
    FGT_OK(fg_cast_param(w, FG_FP64, &b));
    ck_assert_ptr_ne(fg_tensor_data(a), fg_tensor_data(b));
    assert_cast_equal(w, b);
    FGT_OK(fg_backward(l));
    FGT_OK(fg_backward(l2));
    double *g = fgt_host(fg_tensor_grad(w)), *g2 = fgt_host(fg_tensor_grad(w2));
    ck_assert(memcmp(g, g2, sizeof(double) * K * N) == 0);
    free(g);
    free(g2);
    fg_tensor *all[] = {a, b, y, l, c2, y2, l2, w_new};
    fgt_free_all(all, 8);
    /* AdamW's update makes the copy stale; the next use recasts */
    fg_param p = {.tensor = w, .decay = 1};
    snprintf(p.name, sizeof p.name, "w");
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    fg_adamw *o = NULL;
    FGT_OK(fg_adamw_create(&p, 1, &oc, &o));
    FGT_OK(fg_adamw_step(o, 0.05));
    FGT_OK(fg_cast_param(w, FG_FP64, &a));
    assert_cast_equal(w, a);
    /* not a parameter (no grad): a plain cast */
    FGT_OK(fg_cast_param(x, FG_FP32, &b));
    ck_assert_ptr_null(fg_tensor_grad_fn(b));
    fg_adamw_free(o);
    fg_tensor *rest[] = {a, b, w, x, w2};
    fgt_free_all(rest, 5);
}
END_TEST

/* fg_linear on the CPU is fg_matmul then fg_add: the same bits forward
 * and backward; no bias is fg_matmul; bad operands fail before *out. */
START_TEST(test_linear_cpu)
{
    fgt_rng r = fgt_rng_for(0x11e4);
    fg_tensor *x = fgt_rand(&r, FG_FP32, FG_SHAPE(2, M, K), 1.0, 0.1, 1);
    fg_tensor *w = fgt_rand(&r, FG_FP32, FG_SHAPE(K, N), 1.0, 0.1, 1);
    fg_tensor *b = fgt_rand(&r, FG_FP32, FG_SHAPE(N), 1.0, 0.1, 1);
    fg_tensor *y = NULL, *t = NULL, *y2 = NULL, *l = NULL, *l2 = NULL;
    FGT_OK(fg_linear(x, w, b, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    double *gx = fgt_host(fg_tensor_grad(x)), *gw = fgt_host(fg_tensor_grad(w)),
           *gb = fgt_host(fg_tensor_grad(b)), *hy = fgt_host(y);
    fg_tensor *ps[] = {x, w, b};
    FGT_OK(fg_zero_grad(ps, 3));
    FGT_OK(fg_matmul(x, w, 0, 0, &t));
    FGT_OK(fg_add(t, b, &y2));
    FGT_OK(fg_sum(y2, NULL, 0, 0, &l2));
    FGT_OK(fg_backward(l2));
    double *gx2 = fgt_host(fg_tensor_grad(x)),
           *gw2 = fgt_host(fg_tensor_grad(w)),
           *gb2 = fgt_host(fg_tensor_grad(b)), *hy2 = fgt_host(y2);
    ck_assert(!memcmp(hy, hy2, sizeof(double) * 2 * M * N));
    ck_assert(!memcmp(gx, gx2, sizeof(double) * 2 * M * K));
    ck_assert(!memcmp(gw, gw2, sizeof(double) * K * N));
    ck_assert(!memcmp(gb, gb2, sizeof(double) * N));
    double *bufs[] = {gx, gw, gb, hy, gx2, gw2, gb2, hy2};
    for (int i = 0; i < 8; i++)
        free(bufs[i]);
    fg_tensor *sentinel = (fg_tensor *)&r, *out = sentinel, *bd = NULL;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(N), &bd));
    FGT_FAILS(fg_linear(x, w, bd, &out), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(out, sentinel);
    fg_tensor *all[] = {x, w, b, y, t, y2, l, l2, bd};
    fgt_free_all(all, 9);
}
END_TEST

FGT_MAIN_BEGIN("autograd_direct")
FGT_TEST(test_linear_cpu)
FGT_TEST(test_cached_cast)
FGT_TEST(test_cast_backward_into_grad)
FGT_TEST(test_residual_fork_cpu)
FGT_MAIN_END()
