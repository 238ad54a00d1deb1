/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_elementwise.c - broadcasting binary ops (add, sub, mul, div),
 * unary ops (scale, add_scalar, exp, log, tanh, relu, gelu) and cast, with
 * their backward functions. */
#include "config.h"

#include <math.h>
#include <string.h>

#include "ops_internal.h"
#include "kernels/runtime/profile.h"
#ifdef FG_HAVE_CUDA
#include "cuda_ops_ew.h"
#endif

/* ---- CPU kernels ------------------------------------------------------- */

#define GELU_C 0.7978845608028654 /* sqrt(2/pi) */
#define GELU_A 0.044715

#define TEXP(x) _Generic((x), float: expf, default: exp)(x)
#define TLOG(x) _Generic((x), float: logf, default: log)(x)
#define TTANH(x) _Generic((x), float: tanhf, default: tanh)(x)

/* GELU, tanh form: 0.5 x (1 + tanh(u)), u = c (x + a x^3), written as
 * x sigmoid(2u) = x / (1 + e^(-2u)) (the same function: 0.5 (1 + tanh(u))
 * = sigmoid(2u)). glibc's expf costs about a quarter of its tanhf (8 against
 * 35 ns an element on the development machine, where the tanhf forms were
 * a quarter of a CPU training step), and the sigmoid keeps its relative
 * accuracy in the negative tail, where 1 + tanh(u) cancels (x = -5: the
 * tanhf form returns 0, this one 2e-7 to 5e-6 relative). e^(-2u) = inf for
 * very negative x gives -0, and 0 for large x gives x. Derivative:
 * s + 2 x s (1 - s) c (1 + 3 a x^2), s = sigmoid(2u), since
 * 1 - tanh(u)^2 = 4 s (1 - s). */
static inline double gelu_sig_d(double x)
{
    return 1.0 / (1.0 + exp(-2.0 * GELU_C * (x + GELU_A * x * x * x)));
}
static inline float gelu_sig_f(float x)
{
    return 1.0f / (1.0f + expf((float)(-2.0 * GELU_C) * (x + (float)GELU_A * x * x * x)));
}
static inline double gelu_d(double x) { return x * gelu_sig_d(x); }
static inline float gelu_f(float x) { return x * gelu_sig_f(x); }
static inline double gelu_grad_d(double x)
{
    const double s = gelu_sig_d(x);
    return s + 2.0 * x * s * (1.0 - s) * GELU_C * (1.0 + 3.0 * GELU_A * x * x);
}
static inline float gelu_grad_f(float x)
{
    const float s = gelu_sig_f(x);
    return s + 2.0f * x * s * (1.0f - s) * (float)GELU_C * (1.0f + 3.0f * (float)GELU_A * x * x);
}
#define TGELU(x) _Generic((x), float: gelu_f, default: gelu_d)(x)
#define TGELU_GRAD(x) _Generic((x), float: gelu_grad_f, default: gelu_grad_d)(x)

/* out = EXPR(a, b); the contiguous case is a plain indexed loop so the
 * compiler can vectorise it. */
#define DEF_BIN(NAME, T, EXPR)                                              \
    static void NAME(void *c_, char **p, const int64_t *s, int64_t n)       \
    {                                                                       \
        (void)c_;                                                           \
        char *o = p[0];                                                     \
        const char *pa = p[1], *pb = p[2];                                  \
        const int64_t es = (int64_t)sizeof(T);                              \
        if (s[0] == es && s[1] == es && s[2] == es) {                       \
            T *O = (T *)o;                                                  \
            const T *A = (const T *)pa, *B = (const T *)pb;                 \
            for (int64_t i = 0; i < n; i++) {                               \
                T a = A[i], b = B[i];                                       \
                O[i] = (EXPR);                                              \
            }                                                               \
            return;                                                         \
        }                                                                   \
        for (int64_t i = 0; i < n; i++, o += s[0], pa += s[1], pb += s[2]) { \
            T a = *(const T *)pa, b = *(const T *)pb;                       \
            *(T *)o = (EXPR);                                               \
        }                                                                   \
    }

#define DEF_BIN2(NAME, EXPR) \
    DEF_BIN(NAME##_f32, float, EXPR) DEF_BIN(NAME##_f64, double, EXPR)

DEF_BIN2(add, a + b)
DEF_BIN2(sub, a - b)
DEF_BIN2(mul, a * b)
DEF_BIN2(div, a / b)
DEF_BIN2(tanh_grad, a * (1 - b * b))
DEF_BIN2(relu_grad, b > 0 ? a : 0)
DEF_BIN2(gelu_grad, a * TGELU_GRAD(b))

static const fg_iter_row_fn bin_tab[FG_EW_COUNT_BINARY][2] = {
    [FG_EW_ADD] = {add_f32, add_f64},
    [FG_EW_SUB] = {sub_f32, sub_f64},
    [FG_EW_MUL] = {mul_f32, mul_f64},
    [FG_EW_DIV] = {div_f32, div_f64},
    [FG_EW_TANH_GRAD] = {tanh_grad_f32, tanh_grad_f64},
    [FG_EW_RELU_GRAD] = {relu_grad_f32, relu_grad_f64},
    [FG_EW_GELU_GRAD] = {gelu_grad_f32, gelu_grad_f64},
};

/* out = EXPR(x, k) with a scalar parameter k. */
#define DEF_UN(NAME, T, EXPR)                                               \
    static void NAME(void *c_, char **p, const int64_t *s, int64_t n)       \
    {                                                                       \
        const T k = (T) * (const double *)c_;                               \
        (void)k;                                                            \
        char *o = p[0];                                                     \
        const char *px = p[1];                                              \
        const int64_t es = (int64_t)sizeof(T);                              \
        if (s[0] == es && s[1] == es) {                                     \
            T *O = (T *)o;                                                  \
            const T *X = (const T *)px;                                     \
            for (int64_t i = 0; i < n; i++) {                               \
                T x = X[i];                                                 \
                O[i] = (EXPR);                                              \
            }                                                               \
            return;                                                         \
        }                                                                   \
        for (int64_t i = 0; i < n; i++, o += s[0], px += s[1]) {            \
            T x = *(const T *)px;                                           \
            *(T *)o = (EXPR);                                               \
        }                                                                   \
    }

#define DEF_UN2(NAME, EXPR) \
    DEF_UN(NAME##_f32, float, EXPR) DEF_UN(NAME##_f64, double, EXPR)

DEF_UN2(exp, TEXP(x))
DEF_UN2(log, TLOG(x))
DEF_UN2(tanh, TTANH(x))
DEF_UN2(relu, x > 0 ? x : 0)
DEF_UN2(gelu, TGELU(x))
DEF_UN2(scale, k * x)
DEF_UN2(add_scalar, x + k)

static const fg_iter_row_fn un_tab[FG_EW_COUNT_UNARY][2] = {
    [FG_EW_EXP] = {exp_f32, exp_f64},
    [FG_EW_LOG] = {log_f32, log_f64},
    [FG_EW_TANH] = {tanh_f32, tanh_f64},
    [FG_EW_RELU] = {relu_f32, relu_f64},
    [FG_EW_GELU] = {gelu_f32, gelu_f64},
    [FG_EW_SCALE] = {scale_f32, scale_f64},
    [FG_EW_ADD_SCALAR] = {add_scalar_f32, add_scalar_f64},
};

static int dt_index(fg_dtype dt) { return dt == FG_FP64; }

static fg_status ew_binary_cpu(fg_ew_binary op, const fg_tensor *a,
                               const fg_tensor *b, fg_arena *dom,
                               fg_tensor **out)
{
    int nd;
    int64_t shape[FG_MAX_DIMS], sa[FG_MAX_DIMS], sb[FG_MAX_DIMS];
    if (!fg_broadcast_shapes(a->nd, a->shape, b->nd, b->shape, &nd, shape))
        return FG_FAIL(FG_ERR_INTERNAL, "shapes do not broadcast");
    fg_tensor *y;
    FG_TRY(fg_tensor_new(dom, a->dtype, a->device, nd, shape, &y));
    fg_broadcast_strides(a, nd, shape, sa);
    fg_broadcast_strides(b, nd, shape, sb);
    char *base[3] = {fg_tensor_base(y), fg_tensor_base(a), fg_tensor_base(b)};
    const int64_t *str[3] = {y->stride, sa, sb};
    size_t es = fg_dtype_size(a->dtype), ess[3] = {es, es, es};
    fg_iter it;
    fg_iter_init(&it, nd, shape, 3, base, str, ess);
    fg_iter_run_parallel(&it, bin_tab[op][dt_index(a->dtype)], NULL);
    *out = y;
    return FG_OK;
}

#ifdef FG_HAVE_CUDA
static fg_status ew_binary_cuda(fg_ew_binary op, const fg_tensor *a,
                                const fg_tensor *b, fg_arena *dom,
                                fg_tensor **out)
{
    int nd;
    int64_t shape[FG_MAX_DIMS];
    if (!fg_broadcast_shapes(a->nd, a->shape, b->nd, b->shape, &nd, shape))
        return FG_FAIL(FG_ERR_INTERNAL, "shapes do not broadcast");
    fg_tensor *y;
    FG_TRY(fg_tensor_new(dom, a->dtype, a->device, nd, shape, &y));
    fg_status s = fg_cuda_ew_binary(op, y, a, b);
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    *out = y;
    return FG_OK;
}
#endif

static fg_status fg_ew_binary_raw_impl(fg_ew_binary op, const fg_tensor *a,
                                       const fg_tensor *b, fg_arena *dom, fg_tensor **out)
{
    switch (a->device) { /* the per-device dispatch point */
    case FG_DEVICE_CPU: return ew_binary_cpu(op, a, b, dom, out);
#ifdef FG_HAVE_CUDA
    case FG_DEVICE_CUDA: return ew_binary_cuda(op, a, b, dom, out);
#endif
    default: return fg_op_unsupported("elementwise op", a->device);
    }
}

/* The profiler's names of the elementwise kernels (fg_profile_ops). */
static const char *const binary_names[FG_EW_COUNT_BINARY] = {
    [FG_EW_ADD] = "add", [FG_EW_SUB] = "sub", [FG_EW_MUL] = "mul",
    [FG_EW_DIV] = "div", [FG_EW_TANH_GRAD] = "tanh_grad",
    [FG_EW_RELU_GRAD] = "relu_grad", [FG_EW_GELU_GRAD] = "gelu_grad"};
static const char *const unary_names[FG_EW_COUNT_UNARY] = {
    [FG_EW_EXP] = "exp", [FG_EW_LOG] = "log", [FG_EW_TANH] = "tanh",
    [FG_EW_RELU] = "relu", [FG_EW_GELU] = "gelu", [FG_EW_SCALE] = "scale",
    [FG_EW_ADD_SCALAR] = "add_scalar"};

fg_status fg_ew_binary_raw(fg_ew_binary op, const fg_tensor *a,
                           const fg_tensor *b, fg_arena *dom, fg_tensor **out)
{
    FG_PROF_RETURN_AS(FG_PROF_OTHER,
                      (unsigned)op < FG_EW_COUNT_BINARY ? binary_names[op] : NULL,
                      fg_ew_binary_raw_impl(op, a, b, dom, out));
}

static fg_status ew_unary_cpu(fg_ew_unary op, const fg_tensor *x, double k,
                              fg_arena *dom, fg_tensor **out)
{
    fg_tensor *y;
    FG_TRY(fg_tensor_new(dom, x->dtype, x->device, x->nd, x->shape, &y));
    char *base[2] = {fg_tensor_base(y), fg_tensor_base(x)};
    const int64_t *str[2] = {y->stride, x->stride};
    size_t es = fg_dtype_size(x->dtype), ess[2] = {es, es};
    fg_iter it;
    fg_iter_init(&it, x->nd, x->shape, 2, base, str, ess);
    fg_iter_run_parallel(&it, un_tab[op][dt_index(x->dtype)], &k);
    *out = y;
    return FG_OK;
}

#ifdef FG_HAVE_CUDA
/* x may be a broadcast view (0 strides, as sum's backward makes). */
static fg_status ew_unary_cuda(fg_ew_unary op, const fg_tensor *x, double k,
                               fg_arena *dom, fg_tensor **out)
{
    fg_tensor *y;
    FG_TRY(fg_tensor_new(dom, x->dtype, x->device, x->nd, x->shape, &y));
    fg_status s = fg_cuda_ew_unary(op, y, x, k);
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    *out = y;
    return FG_OK;
}
#endif

static fg_status fg_ew_unary_raw_impl(fg_ew_unary op, const fg_tensor *x,
                                      double k,
                                      fg_arena *dom, fg_tensor **out)
{
    switch (x->device) {
    case FG_DEVICE_CPU: return ew_unary_cpu(op, x, k, dom, out);
#ifdef FG_HAVE_CUDA
    case FG_DEVICE_CUDA: return ew_unary_cuda(op, x, k, dom, out);
#endif
    default: return fg_op_unsupported("elementwise op", x->device);
    }
}

fg_status fg_ew_unary_raw(fg_ew_unary op, const fg_tensor *x, double k,
                          fg_arena *dom, fg_tensor **out)
{
    FG_PROF_RETURN_AS(FG_PROF_OTHER,
                      (unsigned)op < FG_EW_COUNT_UNARY ? unary_names[op] : NULL,
                      fg_ew_unary_raw_impl(op, x, k, dom, out));
}

/* fg_copy_strided dispatches on the device itself. */
static fg_status fg_copy_raw_impl(const fg_tensor *x, fg_dtype dt,
                                  fg_arena *dom,
                                  fg_tensor **out)
{
    fg_tensor *y;
    FG_TRY(fg_tensor_new(dom, dt, x->device, x->nd, x->shape, &y));
    fg_status s = fg_copy_strided(y, x);
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    *out = y;
    return FG_OK;
}

fg_status fg_copy_raw(const fg_tensor *x, fg_dtype dt, fg_arena *dom,
                      fg_tensor **out)
{
    FG_PROF_RETURN_AS(FG_PROF_OTHER, x && x->dtype != dt ? "cast" : "copy",
                      fg_copy_raw_impl(x, dt, dom, out));
}

/* ---- binary ops -------------------------------------------------------- */

/* gin = sum_to(g, shape of input i), negated if neg. */
static fg_status reduce_grad(fg_node *n, int i, fg_tensor *g, int neg,
                             fg_tensor **gin)
{
    fg_meta m;
    fg_node_input_meta(n, i, &m);
    fg_tensor *r;
    FG_TRY(fg_sum_to_shape(g, m.nd, m.shape, &r));
    if (!neg) {
        *gin = r;
        return FG_OK;
    }
    fg_status s = fg_ew_unary_raw(FG_EW_SCALE, r, -1.0, fg_bw_domain(), gin);
    fg_tensor_free(r);
    return s;
}

static fg_status add_backward(fg_node *n, fg_tensor *const *g,
                              fg_tensor **gin)
{
    for (int i = 0; i < 2; i++)
        if (fg_node_needs_grad(n, i))
            FG_TRY(reduce_grad(n, i, g[0], 0, &gin[i]));
    return FG_OK;
}

static fg_status sub_backward(fg_node *n, fg_tensor *const *g,
                              fg_tensor **gin)
{
    for (int i = 0; i < 2; i++)
        if (fg_node_needs_grad(n, i))
            FG_TRY(reduce_grad(n, i, g[0], i == 1, &gin[i]));
    return FG_OK;
}

/* gin[i] = sum_to(g op other) */
static fg_status prod_grad(fg_node *n, int i, fg_ew_binary op, fg_tensor *g,
                           const fg_tensor *other, int neg, fg_tensor **gin)
{
    fg_tensor *t;
    FG_TRY(fg_ew_binary_raw(op, g, other, fg_bw_domain(), &t));
    fg_status s = reduce_grad(n, i, t, neg, gin);
    fg_tensor_free(t);
    return s;
}

static fg_status mul_backward(fg_node *n, fg_tensor *const *g,
                              fg_tensor **gin)
{
    /* saved: a, b */
    if (fg_node_needs_grad(n, 0))
        FG_TRY(prod_grad(n, 0, FG_EW_MUL, g[0], fg_node_saved(n, 1), 0,
                         &gin[0]));
    if (fg_node_needs_grad(n, 1))
        FG_TRY(prod_grad(n, 1, FG_EW_MUL, g[0], fg_node_saved(n, 0), 0,
                         &gin[1]));
    return FG_OK;
}

static fg_status div_backward(fg_node *n, fg_tensor *const *g,
                              fg_tensor **gin)
{
    /* saved: b, y = a / b. da = g / b, db = -g y / b. */
    const fg_tensor *b = fg_node_saved(n, 0), *y = fg_node_saved(n, 1);
    if (fg_node_needs_grad(n, 0))
        FG_TRY(prod_grad(n, 0, FG_EW_DIV, g[0], b, 0, &gin[0]));
    if (fg_node_needs_grad(n, 1)) {
        fg_tensor *gy;
        FG_TRY(fg_ew_binary_raw(FG_EW_MUL, g[0], y, fg_bw_domain(), &gy));
        fg_status s = prod_grad(n, 1, FG_EW_DIV, gy, b, 1, &gin[1]);
        fg_tensor_free(gy);
        FG_TRY(s);
    }
    return FG_OK;
}

static const fg_op_def add_def = {"AddBackward", add_backward, NULL};
static const fg_op_def sub_def = {"SubBackward", sub_backward, NULL};
static const fg_op_def mul_def = {"MulBackward", mul_backward, NULL};
static const fg_op_def div_def = {"DivBackward", div_backward, NULL};

static fg_status binary_op(const char *fn, fg_ew_binary op,
                           const fg_op_def *def, fg_tensor *a, fg_tensor *b,
                           fg_tensor **out)
{
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check2(fn, a, b));
    int nd;
    int64_t shape[FG_MAX_DIMS];
    if (!fg_broadcast_shapes(a->nd, a->shape, b->nd, b->shape, &nd, shape)) {
        char sa[128], sb[128];
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: shapes %s and %s do not broadcast", fn,
                        fg_fmt_shape(sa, sizeof sa, a->nd, a->shape),
                        fg_fmt_shape(sb, sizeof sb, b->nd, b->shape));
    }
    fg_tensor *in[2] = {a, b}, *y;
    FG_TRY(fg_ew_binary_raw(op, a, b, fg_alloc_domain(in, 2), &y));
    fg_tensor *saved[2] = {a, b};
    int n_saved = 0;
    if (op == FG_EW_MUL) {
        n_saved = 2;
    } else if (op == FG_EW_DIV) {
        saved[0] = b;
        saved[1] = y;
        n_saved = 2;
    }
    FG_TRY(fg_op_finish(def, in, 2, &y, 1, saved, n_saved, NULL, 0));
    *out = y;
    return FG_OK;
}

fg_status fg_add(fg_tensor *a, fg_tensor *b, fg_tensor **out)
{
    return binary_op("fg_add", FG_EW_ADD, &add_def, a, b, out);
}
fg_status fg_sub(fg_tensor *a, fg_tensor *b, fg_tensor **out)
{
    return binary_op("fg_sub", FG_EW_SUB, &sub_def, a, b, out);
}
fg_status fg_mul(fg_tensor *a, fg_tensor *b, fg_tensor **out)
{
    return binary_op("fg_mul", FG_EW_MUL, &mul_def, a, b, out);
}
fg_status fg_div(fg_tensor *a, fg_tensor *b, fg_tensor **out)
{
    return binary_op("fg_div", FG_EW_DIV, &div_def, a, b, out);
}

/* ---- unary ops ------------------------------------------------------------- */

/* gin = g op saved[0] */
static fg_status saved_grad(fg_node *n, fg_ew_binary op, fg_tensor *const *g,
                            fg_tensor **gin)
{
    return fg_ew_binary_raw(op, g[0], fg_node_saved(n, 0), fg_bw_domain(),
                            &gin[0]);
}

static fg_status exp_backward(fg_node *n, fg_tensor *const *g, fg_tensor **gin)
{
    return saved_grad(n, FG_EW_MUL, g, gin); /* saved y */
}
static fg_status log_backward(fg_node *n, fg_tensor *const *g, fg_tensor **gin)
{
    return saved_grad(n, FG_EW_DIV, g, gin); /* saved x */
}
static fg_status tanh_backward(fg_node *n, fg_tensor *const *g,
                               fg_tensor **gin)
{
    return saved_grad(n, FG_EW_TANH_GRAD, g, gin); /* saved y */
}
static fg_status relu_backward(fg_node *n, fg_tensor *const *g,
                               fg_tensor **gin)
{
    return saved_grad(n, FG_EW_RELU_GRAD, g, gin); /* saved y */
}
static fg_status gelu_backward(fg_node *n, fg_tensor *const *g,
                               fg_tensor **gin)
{
    return saved_grad(n, FG_EW_GELU_GRAD, g, gin); /* saved x */
}
static fg_status scale_backward(fg_node *n, fg_tensor *const *g,
                                fg_tensor **gin)
{
    double k = *(const double *)fg_node_extra(n);
    return fg_ew_unary_raw(FG_EW_SCALE, g[0], k, fg_bw_domain(), &gin[0]);
}
static fg_status add_scalar_backward(fg_node *n, fg_tensor *const *g,
                                     fg_tensor **gin)
{
    (void)n;
    gin[0] = fg_tensor_retain(g[0]);
    return FG_OK;
}
static fg_status cast_backward(fg_node *n, fg_tensor *const *g,
                               fg_tensor **gin)
{
    fg_meta m;
    fg_node_input_meta(n, 0, &m);
    return fg_copy_raw(g[0], m.dtype, fg_bw_domain(), &gin[0]);
}

/* The parameter's .grad += its low-precision gradient converted: one
 * kernel instead of a cast and an add (the same roundings). */
static fg_status cast_backward_acc(fg_node *n, fg_tensor *const *g,
                                   fg_tensor **gin, fg_tensor *const *acc)
{
    (void)n;
    (void)gin;
    return fg_grad_accumulate(acc[0], g[0]);
}

static const fg_op_def exp_def = {"ExpBackward", exp_backward, NULL};
static const fg_op_def log_def = {"LogBackward", log_backward, NULL};
static const fg_op_def tanh_def = {"TanhBackward", tanh_backward, NULL};
static const fg_op_def relu_def = {"ReluBackward", relu_backward, NULL};
static const fg_op_def gelu_def = {"GeluBackward", gelu_backward, NULL};
static const fg_op_def scale_def = {"ScaleBackward", scale_backward, NULL};
static const fg_op_def add_scalar_def = {"AddScalarBackward",
                                         add_scalar_backward, NULL};
static const fg_op_def cast_def = {"CastBackward", cast_backward,
                                   cast_backward_acc};

/* save: 0 nothing, 1 the input, 2 the output */
static fg_status unary_op(const char *fn, fg_ew_unary op, const fg_op_def *def,
                          fg_tensor *x, double k, int save, fg_tensor **out)
{
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    if (!isfinite(k))
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: scalar %g", fn, k);
    fg_tensor *y;
    FG_TRY(fg_ew_unary_raw(op, x, k, fg_alloc_domain(&x, 1), &y));
    fg_tensor *saved = save == 1 ? x : y;
    FG_TRY(fg_op_finish(def, &x, 1, &y, 1, &saved, save ? 1 : 0, &k,
                        sizeof k));
    *out = y;
    return FG_OK;
}

fg_status fg_scale(fg_tensor *x, double s, fg_tensor **out)
{
    return unary_op("fg_scale", FG_EW_SCALE, &scale_def, x, s, 0, out);
}
fg_status fg_add_scalar(fg_tensor *x, double s, fg_tensor **out)
{
    return unary_op("fg_add_scalar", FG_EW_ADD_SCALAR, &add_scalar_def, x, s,
                    0, out);
}
fg_status fg_exp(fg_tensor *x, fg_tensor **out)
{
    return unary_op("fg_exp", FG_EW_EXP, &exp_def, x, 0, 2, out);
}
fg_status fg_log(fg_tensor *x, fg_tensor **out)
{
    return unary_op("fg_log", FG_EW_LOG, &log_def, x, 0, 1, out);
}
fg_status fg_tanh(fg_tensor *x, fg_tensor **out)
{
    return unary_op("fg_tanh", FG_EW_TANH, &tanh_def, x, 0, 2, out);
}
fg_status fg_relu(fg_tensor *x, fg_tensor **out)
{
    return unary_op("fg_relu", FG_EW_RELU, &relu_def, x, 0, 2, out);
}
fg_status fg_gelu(fg_tensor *x, fg_tensor **out)
{
    return unary_op("fg_gelu", FG_EW_GELU, &gelu_def, x, 0, 1, out);
}

fg_status fg_cast(fg_tensor *x, fg_dtype dt, fg_tensor **out)
{
    static const char fn[] = "fg_cast";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    /* fp16/bf16 tensors exist only where their kernels do: on CUDA */
    const int low = dt == FG_FP16 || dt == FG_BF16;
    if (dt != FG_FP32 && dt != FG_FP64 && !low)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "unknown dtype %d", (int)dt);
    if (low && x->device != FG_DEVICE_CUDA)
        return FG_FAIL(FG_ERR_UNSUPPORTED,
                       "to %s: %s tensors support fp32 and fp64 (fp16 and "
                       "bf16 only on CUDA)",
                       fg_dtype_name(dt), fg_device_name(x->device));
    fg_tensor *y;
    FG_TRY(fg_copy_raw(x, dt, fg_alloc_domain(&x, 1), &y));
    FG_TRY(fg_op_finish(&cast_def, &x, 1, &y, 1, NULL, 0, NULL, 0));
    *out = y;
    return FG_OK;
}

fg_status fg_cast_param(fg_tensor *x, fg_dtype dt, fg_tensor **out)
{
    if (!x || x->grad_fn || !x->requires_grad || x->dtype == dt ||
        !fg_tensor_is_contiguous(x))
        return fg_cast(x, dt, out);
    static const char fn[] = "fg_cast_param";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    if ((dt == FG_FP16 || dt == FG_BF16) && x->device != FG_DEVICE_CUDA)
        return fg_cast(x, dt, out); /* its error */
    fg_tensor *c, *y;
    FG_TRY(fg_tensor_lowp(x, dt, &c));
    FG_TRY(fg_tensor_view_new(fg_alloc_domain(&x, 1), c, c->nd, c->shape,
                              c->stride, c->offset, &y));
    FG_TRY(fg_op_finish(&cast_def, &x, 1, &y, 1, NULL, 0, NULL, 0));
    *out = y;
    return FG_OK;
}

/* ---- fused bias + GELU ------------------------------------------------------ */

/* saved: x (contiguous), bias (contiguous). dx = g gelu'(x + b) in one pass
 * on the GPU; dbias = dx summed over the rows (deterministic reduction). */
static fg_status bias_gelu_backward(fg_node *n, fg_tensor *const *g,
                                    fg_tensor **gin)
{
    const fg_tensor *x = fg_node_saved(n, 0), *b = fg_node_saved(n, 1);
    fg_arena *dom = fg_bw_domain();
    fg_tensor *gc = NULL, *dx = NULL;
    FG_TRY(fg_contiguous_raw(g[0], dom, &gc));
    fg_status s;
#ifdef FG_HAVE_CUDA
    if (x->device == FG_DEVICE_CUDA) {
        s = fg_tensor_new_like(dom, x, 0, &dx);
        if (s == FG_OK)
            s = fg_cuda_bias_gelu_backward(dx, gc, x, b);
    } else
#endif
    {
        fg_tensor *u = NULL;
        s = fg_ew_binary_raw(FG_EW_ADD, x, b, dom, &u);
        if (s == FG_OK)
            s = fg_ew_binary_raw(FG_EW_GELU_GRAD, gc, u, dom, &dx);
        fg_tensor_free(u);
    }
    fg_tensor_free(gc);
    if (s == FG_OK && fg_node_needs_grad(n, 1))
        s = fg_sum_to_shape(dx, b->nd, b->shape, &gin[1]);
    if (s != FG_OK || !fg_node_needs_grad(n, 0)) {
        fg_tensor_free(dx);
        dx = NULL;
    }
    gin[0] = dx;
    return s;
}

static const fg_op_def bias_gelu_def = {"BiasGeluBackward",
                                        bias_gelu_backward, NULL};

fg_status fg_bias_gelu(fg_tensor *x, fg_tensor *bias, fg_tensor **out)
{
    static const char fn[] = "fg_bias_gelu";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check2(fn, x, bias));
    if (x->nd < 1 || bias->nd != 1 || bias->shape[0] != x->shape[x->nd - 1]) {
        char sx[128], sb[128];
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: bias %s must be [C] for x %s = [..., C]", fn,
                        fg_fmt_shape(sb, sizeof sb, bias->nd, bias->shape),
                        fg_fmt_shape(sx, sizeof sx, x->nd, x->shape));
    }
    fg_tensor *in[2] = {x, bias};
    fg_arena *dom = fg_alloc_domain(in, 2);
    fg_tensor *xc = NULL, *bc = NULL, *y = NULL;
    FG_TRY(fg_contiguous_raw(x, dom, &xc));
    fg_status s = fg_contiguous_raw(bias, dom, &bc);
#ifdef FG_HAVE_CUDA
    if (s == FG_OK && x->device == FG_DEVICE_CUDA) {
        s = fg_tensor_new_like(dom, xc, 0, &y);
        if (s == FG_OK)
            s = fg_cuda_bias_gelu(y, xc, bc);
    } else
#endif
    if (s == FG_OK) { /* CPU: the two passes (the oracle, not the hot path) */
        fg_tensor *u = NULL;
        s = fg_ew_binary_raw(FG_EW_ADD, xc, bc, dom, &u);
        if (s == FG_OK)
            s = fg_ew_unary_raw(FG_EW_GELU, u, 0, dom, &y);
        fg_tensor_free(u);
    }
    if (s == FG_OK) {
        fg_tensor *saved[2] = {xc, bc};
        s = fg_op_finish(&bias_gelu_def, in, 2, &y, 1, saved, 2, NULL, 0);
        if (s == FG_OK)
            *out = y;
    } else {
        fg_tensor_free(y);
    }
    fg_tensor_free(xc);
    fg_tensor_free(bc);
    return s;
}
