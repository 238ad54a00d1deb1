/* SPDX-License-Identifier: MIT */
/* tests/test_ops_util.h - helpers for the tensor/autograd suites: random
 * tensors from the run's seed (test_util.h), host copies, and a gradcheck
 * assertion that prints the report on failure. */
#ifndef FG_TESTS_TEST_OPS_UTIL_H
#define FG_TESTS_TEST_OPS_UTIL_H

#include <check.h>

#include "test_util.h"

#define FGT_OK(expr)                                                   \
    do {                                                               \
        fg_status fgt_s_ = (expr);                                     \
        ck_assert_msg(fgt_s_ == FG_OK, "%s -> %s: %s", #expr,          \
                      fg_status_string(fgt_s_), fg_last_error());      \
    } while (0)

#define FGT_FAILS(expr, status)                                        \
    do {                                                               \
        fg_clear_error();                                              \
        fg_status fgt_s_ = (expr);                                     \
        ck_assert_msg(fgt_s_ == (status), "%s -> %s (want %s): %s",    \
                      #expr, fg_status_string(fgt_s_),                 \
                      fg_status_string(status), fg_last_error());      \
        ck_assert_msg(fg_last_error()[0] != '\0', "%s: no message",    \
                      #expr);                                          \
    } while (0)

/* In a gradcheck function: return a failing status. */
#define FGT_TRY(expr)                                                  \
    do {                                                               \
        fg_status fgt_t_ = (expr);                                     \
        if (fgt_t_ != FG_OK)                                           \
            return fgt_t_;                                             \
    } while (0)

/* AdamW with the default config over every parameter of m. */
static inline fg_adamw *fgt_adamw_for(const fg_gpt *m)
{
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    fg_adamw *o = NULL;
    FGT_OK(fg_adamw_create(ps, n, &oc, &o));
    return o;
}

/* Uniform values in [-amp, amp), with |x| >= min_abs (kinks, log, div). */
static inline fg_tensor *fgt_rand(fgt_rng *r, fg_dtype dt, int nd,
                                  const int64_t *shape, double amp,
                                  double min_abs, int requires_grad)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    double *h = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        double v = amp * fgt_uniform(r);
        if (fabs(v) < min_abs)
            v = v < 0 ? -min_abs - fabs(v) : min_abs + fabs(v);
        h[i] = v;
    }
    fg_tensor *t = NULL;
    FGT_OK(fg_tensor_zeros(dt, FG_DEVICE_CPU, nd, shape, &t));
    fg_no_grad_begin();
    FGT_OK(fg_tensor_copy_from_host(t, FG_FP64, h, n));
    FGT_OK(fg_no_grad_end());
    if (requires_grad)
        FGT_OK(fg_tensor_set_requires_grad(t, 1));
    free(h);
    return t;
}

/* Host copy as doubles (caller frees). */
static inline double *fgt_host(const fg_tensor *t)
{
    int64_t n = fg_tensor_numel(t);
    double *h = malloc(sizeof(double) * (size_t)(n ? n : 1));
    FGT_OK(fg_tensor_copy_to_host(t, FG_FP64, h, n));
    return h;
}

static inline double fgt_item(const fg_tensor *t)
{
    double v = NAN;
    FGT_OK(fg_tensor_item(t, &v));
    return v;
}

/* max |a - b| over n doubles. */
static inline double fgt_max_diff(const double *a, const double *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (isnan(d))
            return INFINITY;
        m = d > m ? d : m;
    }
    return m;
}

static inline void fgt_free_all(fg_tensor **ts, int n)
{
    for (int i = 0; i < n; i++)
        fg_tensor_free(ts[i]);
}

/* A tensor hook that changes nothing: registered, it sends its tensor's
 * gradient down the engine's general path (no direct .grad target). */
static inline fg_status fgt_noop_hook(fg_tensor *g, fg_tensor **replace,
                                      void *user)
{
    (void)g, (void)replace, (void)user;
    return FG_OK;
}

/* A new CUDA leaf with t's values (t on any device) in dtype dt. */
static inline fg_tensor *fgt_to_cuda(const fg_tensor *t, fg_dtype dt,
                                     int requires_grad)
{
    double *h = fgt_host(t);
    fg_tensor *c = NULL;
    FGT_OK(fg_tensor_zeros(dt, FG_DEVICE_CUDA, fg_tensor_ndim(t),
                           fg_tensor_shape(t), &c));
    FGT_OK(fg_tensor_copy_from_host(c, FG_FP64, h, fg_tensor_numel(t)));
    if (requires_grad)
        FGT_OK(fg_tensor_set_requires_grad(c, 1));
    free(h);
    return c;
}

/* A linear layer's weight and bias gradients in fp64 from host values:
 * dw = x^T u ([K, N]) and db = u's column sums ([N]) for hx [MR, K],
 * hu [MR, N]; calloc'd. */
static inline void fgt_weight_grad_ref(const double *hx, const double *hu,
                                       int64_t MR, int64_t K, int64_t N,
                                       double **dwr, double **dbr)
{
    double *dw = calloc((size_t)(K * N), 8), *db = calloc((size_t)N, 8);
    for (int64_t m = 0; m < MR; m++)
        for (int64_t n = 0; n < N; n++) {
            db[n] += hu[m * N + n];
            for (int64_t k = 0; k < K; k++)
                dw[k * N + n] += hx[m * K + k] * hu[m * N + n];
        }
    *dwr = dw;
    *dbr = db;
}

/* Runs fg_gradcheck with the default (torch) tolerances and asserts a pass. */
static inline void fgt_gradcheck(const char *what, fg_gradcheck_fn fn,
                                 void *user, fg_tensor *const *in, int n,
                                 int fast)
{
    fg_gradcheck_options o;
    fg_gradcheck_options_init(&o);
    o.fast_mode = fast;
    o.seed = fgt_base_seed();
    fg_gradcheck_report rep;
    FGT_OK(fg_gradcheck(fn, user, in, n, &o, &rep));
    ck_assert_msg(rep.passed, "%s: gradcheck failed: %s", what, rep.message);
    ck_assert_msg(rep.n_checked > 0, "%s: nothing checked", what);
}

/* Random shape: nd in [lo_nd, hi_nd], extents in [1, hi_ext]. */
static inline int fgt_shape(fgt_rng *r, int lo_nd, int hi_nd, int hi_ext,
                            int64_t *shape)
{
    int nd = (int)fgt_int(r, lo_nd, hi_nd);
    for (int i = 0; i < nd; i++)
        shape[i] = fgt_int(r, 1, hi_ext);
    return nd;
}

/* Runs a Check suite with one tcase per (name, test) and a timeout. */
#define FGT_MAIN_BEGIN(suite_name)                                     \
    int main(void)                                                     \
    {                                                                  \
        fgt_base_seed();                                               \
        Suite *s_ = suite_create(suite_name);                          \
        TCase *tc_ = tcase_create("main");                             \
        tcase_set_timeout(tc_, 120);                                   \
        suite_add_tcase(s_, tc_);
#define FGT_TEST(fn) fgt_add_test(tc_, fn);
#define FGT_LOOP(fn, n) fgt_add_loop(tc_, fn, 0, (n));
#define FGT_MAIN_END()                                                 \
        return fgt_run_suite(s_);                                      \
    }

#endif /* FG_TESTS_TEST_OPS_UTIL_H */
