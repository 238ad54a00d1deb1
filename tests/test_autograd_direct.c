/* tests/test_autograd_direct.c - the per-parameter work of a training step
 * on the CPU: a cast's backward adding straight into the parameter's .grad
 * (bit-identical to the cast + accumulation it replaces, which a no-op
 * tensor hook forces), post-accumulate hooks still firing, and the
 * gradient matching an fp64 reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flashgrad/flashgrad.h"
#include "test_ops_util.h"

enum { M = 7, K = 5, N = 6 };

static fg_status noop_hook(fg_tensor *g, fg_tensor **replace, void *user)
{
    (void)g;
    (void)replace;
    (void)user;
    return FG_OK;
}

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
    FGT_OK(fg_tensor_register_hook(w2, noop_hook, NULL, &h));
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

FGT_MAIN_BEGIN("autograd_direct")
FGT_TEST(test_cast_backward_into_grad)
FGT_MAIN_END()
