/* SPDX-License-Identifier: MIT */
/* tests/gpu_op_harness.c - GPU-vs-CPU op checks (see gpu_op_harness.h) and
 * the table of op cases shared by test_gpu_ops and test_gpu_gradcheck.
 *
 * Tolerances (max-abs error relative to max |reference|):
 *   fp64  1e-12 (both sides compute in fp64; only the order of operations
 *         differs: cuBLAS / tree reductions vs loops, CUDA vs glibc libm);
 *   fp32  1e-5  (the GPU computes in fp32 on fp32-exact inputs; the output
 *         rounding is 2^-24 and fp32 accumulation over our short rows,
 *         K <= 129, stays well below 1e-6 for random data);
 *   bf16 / fp16  2 * depth * u, with u the unit roundoff of the format:
 *         2^-8 for bf16 (8 significant bits), 2^-11 for fp16 (11 bits).
 *         Inputs and the upstream gradient are the same (already rounded)
 *         numbers on both sides, and the GPU computes in fp32, so the
 *         difference comes from rounding values to the format: the output
 *         (<= u |y_i|, so <= u max |y| in our metric), plus each saved
 *         activation or intermediate tensor the computation goes through
 *         in bf16/fp16 - `depth` counts those roundings on the longest
 *         path, forward or backward (default 2: e.g. exp's backward
 *         g * y rounds y when it is saved and rounds the product). The
 *         factor 2 per rounding covers the op mixing a rounded value into a
 *         sum or a difference (softmax's g - sum(g y), layernorm's centred
 *         gradient) and the normalisation by the max instead of
 *         elementwise. bf16 depth 2 gives 1.6e-2, fp16 2.0e-3.
 * Cases whose op rounds by design (a cast through bf16) set tol_floor. */
#include "gpu_op_harness.h"

double gph_tolerance(fg_dtype dt, int depth)
{
    if (depth <= 0)
        depth = 2;
    switch (dt) {
    case FG_FP64: return 1e-12;
    case FG_FP32: return 1e-5;
    case FG_BF16: return 2.0 * depth * ldexp(1.0, -8);
    case FG_FP16: return 2.0 * depth * ldexp(1.0, -11);
    }
    return 0;
}

static unsigned dt_bit(fg_dtype dt)
{
    switch (dt) {
    case FG_FP64: return GPH_F64;
    case FG_FP32: return GPH_F32;
    case FG_BF16: return GPH_BF16;
    case FG_FP16: return GPH_F16;
    }
    return 0;
}

int gph_case_has_dtype(const gph_case *c, fg_dtype dt)
{
    return ((c->dtypes ? c->dtypes : GPH_DEFAULT) & dt_bit(dt)) != 0;
}

fg_dtype gph_dtype_at(int i)
{
    static const fg_dtype dts[4] = {FG_FP64, FG_FP32, FG_BF16, FG_FP16};
    return dts[i % 4];
}

static int64_t numel_of(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    return n;
}

/* Rounds h to dt through a host tensor of that dtype (the library's own
 * round-to-nearest-even converters), so the GPU tensor of dtype dt and the
 * fp64 reference hold the same numbers. */
static void round_to(fg_dtype dt, double *h, int64_t n)
{
    if (dt == FG_FP64 || n == 0)
        return;
    fg_tensor *t;
    FGT_OK(fg_tensor_empty(dt, FG_DEVICE_CPU, FG_SHAPE(n), &t));
    FGT_OK(fg_tensor_copy_from_host(t, FG_FP64, h, n));
    FGT_OK(fg_tensor_copy_to_host(t, FG_FP64, h, n));
    fg_tensor_free(t);
}

double *gph_draw(const gph_input *in, fgt_rng *r, fg_dtype dt)
{
    const int64_t n = numel_of(in->nd, in->shape);
    const double amp = in->amp > 0 ? in->amp : 1.0;
    const double lo = in->min_abs > amp * 1e-3 ? in->min_abs : amp * 1e-3;
    double *h = malloc(sizeof(double) * (size_t)(n ? n : 1));
    ck_assert_ptr_nonnull(h);
    for (int64_t i = 0; i < n; i++) {
        double u = fgt_uniform(r); /* [-1, 1) */
        if (in->positive) {
            h[i] = lo + (amp - lo) * 0.5 * (u + 1.0);
        } else {
            double m = lo + (amp - lo) * fabs(u);
            h[i] = u < 0 ? -m : m;
        }
    }
    round_to(dt, h, n);
    return h;
}

fg_tensor *gph_tensor(fg_dtype dt, fg_device dev, int nd,
                      const int64_t *shape, const double *h,
                      int requires_grad)
{
    fg_tensor *t = NULL;
    FGT_OK(fg_tensor_empty(dt, dev, nd, shape, &t));
    fg_no_grad_begin();
    FGT_OK(fg_tensor_copy_from_host(t, FG_FP64, h, fg_tensor_numel(t)));
    FGT_OK(fg_no_grad_end());
    if (requires_grad)
        FGT_OK(fg_tensor_set_requires_grad(t, 1));
    return t;
}

void gph_inputs(const gph_case *c, fgt_rng *r, fg_dtype dt, fg_device dev,
                fg_tensor **out)
{
    for (int i = 0; i < c->n_in; i++) {
        double *h = gph_draw(&c->in[i], r, dt);
        out[i] = gph_tensor(dt, dev, c->in[i].nd, c->in[i].shape, h,
                            !c->in[i].no_grad);
        free(h);
    }
}

/* max |a - ref| / max |ref| (0 if both are all zero, +inf on NaN or on a
 * nonzero error against an all-zero reference); *at = worst element. */
static double rel_err(const double *a, const double *ref, int64_t n,
                      int64_t *at, double *ref_max)
{
    double num = 0, den = 0;
    *at = n ? 0 : -1;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i])) {
            *at = i;
            *ref_max = fgt_max_abs(ref, (size_t)n);
            return INFINITY;
        }
        double e = fabs(a[i] - ref[i]);
        if (e > num) {
            num = e;
            *at = i;
        }
        if (fabs(ref[i]) > den)
            den = fabs(ref[i]);
    }
    *ref_max = den;
    if (num == 0)
        return 0;
    return den > 0 ? num / den : INFINITY;
}

/* Asserts that GPU tensor g (dtype want_dt, on CUDA) has the reference's
 * shape and values within tol. */
static void compare(const char *what, const gph_case *c, fg_dtype dt,
                    int pass, const fg_tensor *g, fg_dtype want_dt,
                    const fg_tensor *ref_t, const double *ref, double tol)
{
    ck_assert_msg(fg_tensor_device(g) == FG_DEVICE_CUDA,
                  "%s [%s] %s: result on %s", c->name, fg_dtype_name(dt),
                  what, fg_device_name(fg_tensor_device(g)));
    ck_assert_msg(fg_tensor_dtype(g) == want_dt, "%s [%s] %s: dtype %s",
                  c->name, fg_dtype_name(dt), what,
                  fg_dtype_name(fg_tensor_dtype(g)));
    const int nd = fg_tensor_ndim(ref_t);
    ck_assert_msg(fg_tensor_ndim(g) == nd, "%s [%s] %s: %d dims, want %d",
                  c->name, fg_dtype_name(dt), what, fg_tensor_ndim(g), nd);
    for (int d = 0; d < nd; d++)
        ck_assert_msg(fg_tensor_size(g, d) == fg_tensor_size(ref_t, d),
                      "%s [%s] %s: extent %d is %lld, want %lld", c->name,
                      fg_dtype_name(dt), what, d,
                      (long long)fg_tensor_size(g, d),
                      (long long)fg_tensor_size(ref_t, d));
    const int64_t n = fg_tensor_numel(ref_t);
    double *h = fgt_host(g), ref_max = 0;
    int64_t at;
    double err = rel_err(h, ref, n, &at, &ref_max);
    if (getenv("FG_TEST_VERBOSE"))
        fprintf(stderr, "%-44s %-4s %-16s pass %d: error %.3g (tol %.3g)\n",
                c->name, fg_dtype_name(dt), what, pass, err, tol);
    ck_assert_msg(err <= tol,
                  "%s [%s] %s (pass %d): max error %.3g > tol %.3g "
                  "(relative to max |ref| %.3g); worst element %lld of %lld: "
                  "gpu %.17g cpu %.17g",
                  c->name, fg_dtype_name(dt), what, pass, err, tol, ref_max,
                  (long long)at, (long long)n, at >= 0 ? h[at] : NAN,
                  at >= 0 ? ref[at] : NAN);
    free(h);
}

/* Best effort poisoning: NaN into every block the GPU pass handed out
 * (inputs, output, gradients) before it is freed, so the caching allocator
 * returns NaN-filled memory to the next pass and an op that leaves part of
 * its output unwritten shows up as NaN. Failures are ignored. */
static void poison(fg_tensor *t)
{
    if (!t)
        return;
    fg_no_grad_begin();
    (void)fg_tensor_fill(t, NAN);
    (void)fg_no_grad_end();
}

void gph_run(const gph_case *c, fg_dtype dt, fgt_rng *rng)
{
    fgt_rng r = *rng;
    if (c->setup)
        c->setup(c->user, &r);
    double tol = gph_tolerance(dt, c->depth);
    if (tol < c->tol_floor)
        tol = c->tol_floor;
    const int n = c->n_in;
    double *h[GPH_MAX_IN];
    for (int i = 0; i < n; i++)
        h[i] = gph_draw(&c->in[i], &r, dt);

    /* Reference: fp64 on the CPU. */
    fg_tensor *cin[GPH_MAX_IN] = {0}, *cout = NULL;
    for (int i = 0; i < n; i++)
        cin[i] = gph_tensor(FG_FP64, FG_DEVICE_CPU, c->in[i].nd,
                            c->in[i].shape, h[i], !c->in[i].no_grad);
    FGT_OK(c->fn(cin, n, &cout, c->user));
    ck_assert_ptr_nonnull(cout);
    const int64_t n_out = fg_tensor_numel(cout);
    double *ref_y = fgt_host(cout), *hg = NULL;
    const int backward = fg_tensor_requires_grad(cout);
    double *ref_g[GPH_MAX_IN] = {0};
    if (backward) {
        gph_input gi = {.nd = fg_tensor_ndim(cout)};
        memcpy(gi.shape, fg_tensor_shape(cout), sizeof(int64_t) * gi.nd);
        /* A one-element input broadcast over a larger output gets the sum
         * of the upstream gradient: with random signs that sum can cancel
         * to ~0 and turn harmless rounding into a huge relative error, so
         * such cases get a positive upstream gradient. */
        for (int i = 0; i < n; i++)
            if (!c->in[i].no_grad &&
                numel_of(c->in[i].nd, c->in[i].shape) == 1 &&
                fg_tensor_numel(cout) > 1)
                gi.positive = 1;
        hg = gph_draw(&gi, &r, dt);
        fg_tensor *g = gph_tensor(FG_FP64, FG_DEVICE_CPU, gi.nd, gi.shape, hg,
                                  0);
        FGT_OK(fg_backward_with(cout, g));
        fg_tensor_free(g);
        for (int i = 0; i < n; i++)
            if (fg_tensor_grad(cin[i]))
                ref_g[i] = fgt_host(fg_tensor_grad(cin[i]));
    }

    /* The GPU twice: the second pass runs on memory poisoned by the first. */
    for (int pass = 0; pass < 2; pass++) {
        fg_tensor *gin[GPH_MAX_IN] = {0}, *gout = NULL, *gg = NULL;
        for (int i = 0; i < n; i++)
            gin[i] = gph_tensor(dt, FG_DEVICE_CUDA, c->in[i].nd,
                                c->in[i].shape, h[i], !c->in[i].no_grad);
        FGT_OK(c->fn(gin, n, &gout, c->user));
        ck_assert_ptr_nonnull(gout);
        const fg_dtype out_dt =
            c->fp32_out && (dt == FG_BF16 || dt == FG_FP16) ? FG_FP32 : dt;
        compare("forward", c, dt, pass, gout, out_dt, cout, ref_y, tol);
        if (backward) {
            ck_assert_msg(fg_tensor_requires_grad(gout),
                          "%s [%s]: the GPU output does not require grad",
                          c->name, fg_dtype_name(dt));
            gg = gph_tensor(out_dt, FG_DEVICE_CUDA, fg_tensor_ndim(cout),
                            fg_tensor_shape(cout), hg, 0);
            FGT_OK(fg_backward_with(gout, gg));
            for (int i = 0; i < n; i++) {
                fg_tensor *gr = fg_tensor_grad(gin[i]);
                char what[32];
                snprintf(what, sizeof what, "grad of input %d", i);
                if (!ref_g[i]) {
                    ck_assert_msg(gr == NULL, "%s [%s] %s: unexpected",
                                  c->name, fg_dtype_name(dt), what);
                    continue;
                }
                ck_assert_msg(gr != NULL, "%s [%s] %s: missing", c->name,
                              fg_dtype_name(dt), what);
                compare(what, c, dt, pass, gr, dt, fg_tensor_grad(cin[i]),
                        ref_g[i], tol);
            }
        }
        if (pass == 0) {
            poison(gout);
            for (int i = 0; i < n; i++) {
                poison(fg_tensor_grad(gin[i]));
                poison(gin[i]);
            }
        }
        fg_tensor_free(gg);
        fg_tensor_free(gout);
        fgt_free_all(gin, n);
    }
    (void)n_out;
    free(ref_y);
    free(hg);
    for (int i = 0; i < n; i++) {
        free(h[i]);
        free(ref_g[i]);
    }
    fg_tensor_free(cout);
    fgt_free_all(cin, n);
}

/* ======================================================================
 * The op cases.
 * ====================================================================== */

enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_SCALE, OP_ADD_SCALAR, OP_EXP, OP_LOG,
    OP_TANH, OP_RELU, OP_GELU, OP_CAST, OP_MATMUL, OP_MATMUL_TVIEW, OP_SUM,
    OP_MEAN, OP_RESHAPE, OP_PERMUTE_EXP, OP_TRANSPOSE_CONTIG, OP_SLICE_TANH,
    OP_NARROW_GELU, OP_CONCAT, OP_SPLIT, OP_TVIEW_ADD, OP_TVIEW_RESHAPE_SUM,
    OP_SOFTMAX, OP_LOG_SOFTMAX, OP_TVIEW_SOFTMAX, OP_LAYERNORM,
    OP_TVIEW_LAYERNORM, OP_EMBEDDING, OP_CROSS_ENTROPY,
    OP_TVIEW_CROSS_ENTROPY, OP_DROPOUT, OP_TVIEW_DROPOUT, OP_ATTENTION,
    OP_ATTENTION_QKV, OP_ATTENTION_QKVPACKED, OP_BIAS_GELU
};

typedef struct opx {
    int op;
    double k;
    int dims[FG_MAX_DIMS], n_dims, keepdim, dim;
    int64_t a, b, c;         /* slice start/end/step, split sizes, heads */
    int nd;                  /* reshape target */
    int64_t shape[FG_MAX_DIMS];
    int ta, tb;
    fg_dtype mid;            /* cast through */
    int with_w, with_b;      /* layernorm */
    /* embedding indices / cross-entropy targets (drawn by the setups) */
    int idx_nd;
    int64_t idx_shape[3], n_idx, vocab;
    double ignore_frac;
    int64_t idx[640];
    /* dropout / attention */
    double p;
    uint64_t seed, offset;
    int causal;
} opx;

#define TRY(expr)                                                       \
    do {                                                                \
        fg_status s_ = (expr);                                          \
        if (s_ != FG_OK)                                                \
            return s_;                                                  \
    } while (0)

/* out = f(view), freeing the view. */
#define THEN(view_expr, call)                                           \
    do {                                                                \
        fg_tensor *v_ = NULL;                                           \
        TRY(view_expr);                                                 \
        fg_status s2_ = (call);                                         \
        fg_tensor_free(v_);                                             \
        return s2_;                                                     \
    } while (0)

static fg_status unary(int op, fg_tensor *x, double k, fg_tensor **out)
{
    switch (op) {
    case OP_SCALE: return fg_scale(x, k, out);
    case OP_ADD_SCALAR: return fg_add_scalar(x, k, out);
    case OP_EXP: return fg_exp(x, out);
    case OP_LOG: return fg_log(x, out);
    case OP_TANH: return fg_tanh(x, out);
    case OP_RELU: return fg_relu(x, out);
    default: return fg_gelu(x, out);
    }
}

/* y = cast(cast(x, mid), dtype(x)) * x. The CPU reference cannot cast to
 * fp16/bf16, so there the round trip is the identity (tol_floor covers
 * the rounding the GPU does); a cast to x's own dtype is skipped. */
static fg_status cast_fn(const opx *o, fg_tensor *x, fg_tensor **out)
{
    const fg_dtype dt = fg_tensor_dtype(x);
    const int lowp = o->mid == FG_BF16 || o->mid == FG_FP16;
    if (dt == o->mid || (lowp && fg_tensor_device(x) == FG_DEVICE_CPU))
        return fg_mul(x, x, out);
    fg_tensor *m = NULL, *back = NULL;
    TRY(fg_cast(x, o->mid, &m));
    fg_status s = fg_cast(m, dt, &back);
    fg_tensor_free(m);
    TRY(s);
    s = fg_mul(back, x, out);
    fg_tensor_free(back);
    return s;
}

static fg_status split_fn(const opx *o, fg_tensor *x, fg_tensor **out)
{
    fg_tensor *p[3] = {0}, *q = NULL;
    const int64_t sizes[3] = {o->a, o->b, o->c};
    TRY(fg_split(x, o->dim, sizes, 3, p));
    fg_tensor *order[2] = {p[2], p[0]}; /* p[1] unused: zero gradient */
    fg_status s = fg_concat(order, 2, o->dim, &q);
    fgt_free_all(p, 3);
    TRY(s);
    s = fg_mul(q, q, out);
    fg_tensor_free(q);
    return s;
}

/* The attention cases' options: causal, dropout p with its seed/offset. */
static fg_attention_options attention_options(const opx *o)
{
    fg_attention_options ao;
    fg_attention_options_init(&ao);
    ao.causal = o->causal;
    ao.dropout_p = o->p;
    ao.seed = o->seed;
    ao.offset = o->offset;
    return ao;
}

static fg_status attention_qkv_fn(const opx *o, fg_tensor *qkv,
                                  fg_tensor **out)
{
    const int64_t B = fg_tensor_size(qkv, 0), T = fg_tensor_size(qkv, 1),
                  C = fg_tensor_size(qkv, 2) / 3, H = o->a;
    const int64_t sizes[3] = {C, C, C};
    fg_tensor *p[3] = {0}, *v[3] = {0};
    fg_status s = fg_split(qkv, -1, sizes, 3, p);
    for (int i = 0; i < 3 && s == FG_OK; i++)
        s = fg_reshape(p[i], FG_SHAPE(B, T, H, C / H), &v[i]);
    const fg_attention_options ao = attention_options(o);
    if (s == FG_OK)
        s = fg_attention(v[0], v[1], v[2], &ao, out);
    fgt_free_all(p, 3);
    fgt_free_all(v, 3);
    return s;
}

static fg_status op_fn(fg_tensor *const *in, int n, fg_tensor **out, void *u)
{
    const opx *o = u;
    fg_tensor *x = in[0];
    switch (o->op) {
    case OP_ADD: return fg_add(x, in[1], out);
    case OP_BIAS_GELU: return fg_bias_gelu(x, in[1], out);
    case OP_SUB: return fg_sub(x, in[1], out);
    case OP_MUL: return fg_mul(x, in[1], out);
    case OP_DIV: return fg_div(x, in[1], out);
    case OP_SCALE: case OP_ADD_SCALAR: case OP_EXP: case OP_LOG:
    case OP_TANH: case OP_RELU: case OP_GELU:
        return unary(o->op, x, o->k, out);
    case OP_CAST: return cast_fn(o, x, out);
    case OP_MATMUL: return fg_matmul(x, in[1], o->ta, o->tb, out);
    case OP_MATMUL_TVIEW: /* a strided (transposed) operand */
        THEN(fg_transpose(x, -1, -2, &v_),
             fg_matmul(v_, in[1], !o->ta, o->tb, out));
    case OP_SUM: case OP_MEAN:
        return (o->op == OP_SUM ? fg_sum : fg_mean)(
            x, o->n_dims ? o->dims : NULL, o->n_dims, o->keepdim, out);
    case OP_RESHAPE: return fg_reshape(x, o->nd, o->shape, out);
    case OP_PERMUTE_EXP: THEN(fg_permute(x, o->dims, &v_), fg_exp(v_, out));
    case OP_TRANSPOSE_CONTIG:
        THEN(fg_transpose(x, o->dims[0], o->dims[1], &v_),
             fg_contiguous(v_, out));
    case OP_SLICE_TANH:
        THEN(fg_slice(x, o->dim, o->a, o->b, o->c, &v_), fg_tanh(v_, out));
    case OP_NARROW_GELU:
        THEN(fg_narrow(x, o->dim, o->a, o->b, &v_), fg_gelu(v_, out));
    case OP_CONCAT: return fg_concat(in, n, o->dim, out);
    case OP_SPLIT: return split_fn(o, x, out);
    case OP_TVIEW_ADD: THEN(fg_transpose(x, 0, 1, &v_), fg_add(v_, in[1], out));
    case OP_TVIEW_RESHAPE_SUM: { /* reshape must copy a transposed view */
        fg_tensor *t = NULL;
        TRY(fg_transpose(x, 0, -1, &t));
        fg_tensor *r = NULL;
        fg_status s = fg_reshape(t, o->nd, o->shape, &r);
        fg_tensor_free(t);
        TRY(s);
        s = fg_sum(r, o->dims, o->n_dims, o->keepdim, out);
        fg_tensor_free(r);
        return s;
    }
    case OP_SOFTMAX: return fg_softmax(x, o->dim, out);
    case OP_LOG_SOFTMAX: return fg_log_softmax(x, o->dim, out);
    case OP_TVIEW_SOFTMAX:
        THEN(fg_transpose(x, 0, -1, &v_), fg_softmax(v_, -1, out));
    case OP_LAYERNORM:
        return fg_layernorm(x, o->with_w ? in[1] : NULL,
                            o->with_b ? in[1 + o->with_w] : NULL, 1e-5, out);
    case OP_TVIEW_LAYERNORM:
        THEN(fg_transpose(x, 0, 1, &v_),
             fg_layernorm(v_, in[1], in[2], 1e-5, out));
    case OP_EMBEDDING:
        return fg_embedding(x, o->idx, o->idx_nd, o->idx_shape, out);
    case OP_CROSS_ENTROPY:
        return fg_cross_entropy(x, o->idx, o->n_idx, -1, out);
    case OP_TVIEW_CROSS_ENTROPY: /* logits stored [V, R], used as [R, V] */
        THEN(fg_transpose(x, 0, 1, &v_),
             fg_cross_entropy(v_, o->idx, o->n_idx, -1, out));
    case OP_DROPOUT: return fg_dropout(x, o->p, o->seed, o->offset, out);
    case OP_TVIEW_DROPOUT:
        THEN(fg_transpose(x, 0, 1, &v_),
             fg_dropout(v_, o->p, o->seed, o->offset, out));
    case OP_ATTENTION: {
        const fg_attention_options ao = attention_options(o);
        return fg_attention(x, in[1], in[2], &ao, out);
    }
    case OP_ATTENTION_QKV: return attention_qkv_fn(o, x, out);
    case OP_ATTENTION_QKVPACKED: {
        const fg_attention_options ao = attention_options(o);
        return fg_attention_qkvpacked(x, o->a, &ao, out);
    }
    }
    return FG_ERR_INVALID_ARGUMENT;
}

/* Indices in [0, vocab) with guaranteed repeats (the backward must
 * scatter-add, not overwrite). */
static void setup_indices(void *u, fgt_rng *r)
{
    opx *o = u;
    o->n_idx = numel_of(o->idx_nd, o->idx_shape);
    ck_assert(o->n_idx <= (int64_t)(sizeof o->idx / sizeof o->idx[0]));
    for (int64_t i = 0; i < o->n_idx; i++)
        o->idx[i] = fgt_int(r, 0, o->vocab - 1);
    if (o->n_idx > 2)
        o->idx[o->n_idx - 1] = o->idx[0];
}

/* Targets with about ignore_frac of the rows set to -1 (ignored). */
static void setup_targets(void *u, fgt_rng *r)
{
    opx *o = u;
    setup_indices(u, r);
    for (int64_t i = 0; i < o->n_idx; i++)
        if (o->ignore_frac >= 1 ||
            (fgt_uniform(r) + 1) * 0.5 < o->ignore_frac)
            o->idx[i] = -1;
}

static void setup_seed(void *u, fgt_rng *r)
{
    opx *o = u;
    o->seed = fgt_next(r);
    o->offset = (uint64_t)fgt_int(r, 0, 1 << 20);
}

#define NARGS(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
/* An input of the given shape, default values (U(-1, 1), never 0). */
#define IN(...) {.nd = NARGS(__VA_ARGS__), .shape = {__VA_ARGS__}}
/* ... with |x| in [lo, amp] (pos: positive), ng: requires no grad. */
#define INX(amp_, lo_, pos_, ng_, ...)                                  \
    {.nd = NARGS(__VA_ARGS__), .shape = {__VA_ARGS__}, .amp = (amp_),   \
     .min_abs = (lo_), .positive = (pos_), .no_grad = (ng_)}
#define SCALAR {.nd = 0}
#define X(...) (&(opx){__VA_ARGS__})

const gph_case gph_cases[] = {
    /* ---- elementwise, broadcasting ---- */
    {"add [B,T,C] + [C]", op_fn, X(.op = OP_ADD), NULL, 2,
     {IN(2, 7, 13), IN(13)}, GPH_ALL},
    {"bias_gelu [2,7,13] + [13] (fused)", op_fn, X(.op = OP_BIAS_GELU), NULL,
     2, {IN(2, 7, 13), IN(13)}, GPH_ALL, 3},
    {"add [7,13] + scalar", op_fn, X(.op = OP_ADD), NULL, 2,
     {IN(7, 13), SCALAR}},
    {"sub [3,1,5] - [4,1]", op_fn, X(.op = OP_SUB), NULL, 2,
     {IN(3, 1, 5), IN(4, 1)}},
    {"mul [B,1,C] * [B,T,1]", op_fn, X(.op = OP_MUL), NULL, 2,
     {IN(2, 1, 13), IN(2, 7, 1)}, GPH_ALL},
    {"mul [33] * [1,33] (b no grad)", op_fn, X(.op = OP_MUL), NULL, 2,
     {IN(33), INX(1, 0, 0, 1, 1, 33)}},
    {"div [7,13] / [13]", op_fn, X(.op = OP_DIV), NULL, 2,
     {IN(7, 13), INX(1.5, 0.5, 0, 0, 13)}},
    {"div scalar / [33] (positive denominators)", op_fn, X(.op = OP_DIV),
     NULL, 2, {SCALAR, INX(1.5, 0.5, 1, 0, 33)}},
    {"add [13,7]^T + [13] (strided)", op_fn, X(.op = OP_TVIEW_ADD), NULL, 2,
     {IN(13, 7), IN(13)}},
    /* ---- unary ---- */
    {"scale -1.7", op_fn, X(.op = OP_SCALE, .k = -1.7), NULL, 1, {IN(33)}},
    {"add_scalar 0.3", op_fn, X(.op = OP_ADD_SCALAR, .k = 0.3), NULL, 1,
     {IN(7, 13)}},
    {"exp", op_fn, X(.op = OP_EXP), NULL, 1, {INX(2, 0, 0, 0, 2, 7, 13)},
     GPH_ALL},
    {"log (positive)", op_fn, X(.op = OP_LOG), NULL, 1,
     {INX(3, 0.1, 1, 0, 13, 7)}},
    {"tanh", op_fn, X(.op = OP_TANH), NULL, 1, {INX(2, 0, 0, 0, 1, 33)}},
    {"relu (|x| >= 0.05)", op_fn, X(.op = OP_RELU), NULL, 1,
     {INX(2, 0.05, 0, 0, 7, 13)}},
    {"gelu", op_fn, X(.op = OP_GELU), NULL, 1, {INX(3, 0, 0, 0, 2, 7, 13)},
     GPH_ALL},
    /* ---- casts: through fp32 and fp64 both sides round identically ---- */
    {"cast through fp32", op_fn, X(.op = OP_CAST, .mid = FG_FP32), NULL, 1,
     {IN(7, 13)}, GPH_F64 | GPH_F32, .no_gradcheck = 1},
    {"cast through fp64", op_fn, X(.op = OP_CAST, .mid = FG_FP64), NULL, 1,
     {IN(7, 13)}, GPH_F64 | GPH_F32},
    /* y = bf16(x) x: forward <= 2^-9 relative, backward two bf16 terms:
     * 2 * 2^-8 covers both. */
    {"cast through bf16", op_fn, X(.op = OP_CAST, .mid = FG_BF16), NULL, 1,
     {IN(7, 13)}, GPH_F64 | GPH_F32 | GPH_BF16, .tol_floor = 0x1p-7,
     .no_gradcheck = 1},
    {"cast through fp16", op_fn, X(.op = OP_CAST, .mid = FG_FP16), NULL, 1,
     {IN(7, 13)}, GPH_F32 | GPH_F16, .tol_floor = 0x1p-10,
     .no_gradcheck = 1},
    /* ---- matmul ---- */
    {"matmul [7,13]x[13,5]", op_fn, X(.op = OP_MATMUL), NULL, 2,
     {IN(7, 13), IN(13, 5)}, GPH_ALL},
    {"matmul trans_a", op_fn, X(.op = OP_MATMUL, .ta = 1), NULL, 2,
     {IN(13, 7), IN(13, 5)}},
    {"matmul trans_b", op_fn, X(.op = OP_MATMUL, .tb = 1), NULL, 2,
     {IN(7, 13), IN(5, 13)}},
    {"matmul trans_a trans_b", op_fn, X(.op = OP_MATMUL, .ta = 1, .tb = 1),
     NULL, 2, {IN(13, 7), IN(5, 13)}},
    {"matmul [B,T,C]x[C,D]", op_fn, X(.op = OP_MATMUL), NULL, 2,
     {IN(2, 7, 33), IN(33, 13)}, GPH_ALL},
    {"matmul [3,1,7,5]x[4,5,6] (batch broadcast)", op_fn, X(.op = OP_MATMUL),
     NULL, 2, {IN(3, 1, 7, 5), IN(4, 5, 6)}},
    {"matmul [2,7,5]x[2,1,5]^T (N = 1)", op_fn,
     X(.op = OP_MATMUL, .tb = 1), NULL, 2, {IN(2, 7, 5), IN(2, 1, 5)}},
    {"matmul [2,33,7]x[7,1] (M = 33, N = 1)", op_fn, X(.op = OP_MATMUL),
     NULL, 2, {IN(2, 33, 7), IN(7, 1)}},
    {"matmul strided a (transposed view)", op_fn,
     X(.op = OP_MATMUL_TVIEW), NULL, 2, {IN(2, 7, 5), IN(2, 5, 6)}},
    {"matmul [65,129]x[129,33]", op_fn, X(.op = OP_MATMUL), NULL, 2,
     {IN(65, 129), IN(129, 33)}},
    /* ---- reductions (reductions to one element of positive values: a sum
     * that cancels to ~0 would turn fp32 rounding into a large relative
     * error) ---- */
    {"sum all", op_fn, X(.op = OP_SUM), NULL, 1, {INX(1, 0.1, 1, 0, 7, 13)}},
    {"sum dim -1 keepdim", op_fn,
     X(.op = OP_SUM, .dims = {-1}, .n_dims = 1, .keepdim = 1), NULL, 1,
     {IN(2, 7, 13)}},
    {"sum dims {0, 2}", op_fn, X(.op = OP_SUM, .dims = {0, 2}, .n_dims = 2),
     NULL, 1, {IN(2, 7, 13)}},
    {"mean dim 1 keepdim", op_fn,
     X(.op = OP_MEAN, .dims = {1}, .n_dims = 1, .keepdim = 1), NULL, 1,
     {IN(2, 7, 13)}},
    {"mean all", op_fn, X(.op = OP_MEAN), NULL, 1,
     {INX(1, 0.1, 1, 0, 33)}},
    {"mean dims {0, -1} over [3,1,5] (one element)", op_fn,
     X(.op = OP_MEAN, .dims = {0, -1}, .n_dims = 2), NULL, 1,
     {INX(1, 0.1, 1, 0, 3, 1, 5)}},
    /* ---- shape ops; views feeding other ops ---- */
    {"reshape [2,7,13] -> [7,-1]", op_fn,
     X(.op = OP_RESHAPE, .nd = 2, .shape = {7, -1}), NULL, 1,
     {IN(2, 7, 13)}},
    {"permute {2,0,1} -> exp", op_fn,
     X(.op = OP_PERMUTE_EXP, .dims = {2, 0, 1}), NULL, 1, {IN(2, 7, 13)}},
    {"transpose(0,2) -> contiguous", op_fn,
     X(.op = OP_TRANSPOSE_CONTIG, .dims = {0, 2}), NULL, 1, {IN(2, 7, 13)}},
    {"slice dim 1 [1:-1:2] -> tanh", op_fn,
     X(.op = OP_SLICE_TANH, .dim = 1, .a = 1, .b = -1, .c = 2), NULL, 1,
     {IN(2, 7, 13)}},
    {"narrow dim -1 (3, 7) -> gelu", op_fn,
     X(.op = OP_NARROW_GELU, .dim = -1, .a = 3, .b = 7), NULL, 1,
     {IN(2, 7, 13)}},
    {"concat dim 1 (middle part no grad)", op_fn,
     X(.op = OP_CONCAT, .dim = 1), NULL, 3,
     {IN(2, 3, 5), INX(1, 0, 0, 1, 2, 1, 5), IN(2, 4, 5)}},
    {"split dim -1 {5,0,8} -> concat -> mul", op_fn,
     X(.op = OP_SPLIT, .dim = -1, .a = 5, .b = 0, .c = 8), NULL, 1,
     {IN(2, 7, 13)}},
    {"split dim 0 {1,3,3} -> concat -> mul", op_fn,
     X(.op = OP_SPLIT, .dim = 0, .a = 1, .b = 3, .c = 3), NULL, 1,
     {IN(7, 13)}},
    {"transposed view -> reshape (copy) -> sum", op_fn,
     X(.op = OP_TVIEW_RESHAPE_SUM, .nd = 2, .shape = {13, -1},
       .dims = {1}, .n_dims = 1),
     NULL, 1, {IN(2, 7, 13)}},
    /* ---- softmax ---- */
    {"softmax last dim", op_fn, X(.op = OP_SOFTMAX, .dim = -1), NULL, 1,
     {INX(3, 0, 0, 0, 7, 13)}, GPH_ALL, 3},
    {"softmax middle dim", op_fn, X(.op = OP_SOFTMAX, .dim = 1), NULL, 1,
     {INX(3, 0, 0, 0, 2, 13, 7)}, GPH_DEFAULT, 3},
    {"softmax of a transposed view", op_fn, X(.op = OP_TVIEW_SOFTMAX), NULL,
     1, {INX(3, 0, 0, 0, 33, 7)}, GPH_DEFAULT, 3},
    /* log_softmax: the saved output is rounded relative to |log p|
     * (log V plus the logit range, ~5), and its backward exponentiates it:
     * depth 6. */
    {"log_softmax last dim", op_fn, X(.op = OP_LOG_SOFTMAX, .dim = -1), NULL,
     1, {INX(3, 0, 0, 0, 2, 7, 33)}, GPH_DEFAULT, 6},
    {"log_softmax dim 0", op_fn, X(.op = OP_LOG_SOFTMAX, .dim = 0), NULL, 1,
     {INX(3, 0, 0, 0, 5, 7)}, GPH_DEFAULT, 6},
    /* ---- layernorm ---- */
    {"layernorm weight+bias", op_fn,
     X(.op = OP_LAYERNORM, .with_w = 1, .with_b = 1), NULL, 3,
     {IN(2, 7, 33), INX(1.5, 0.5, 1, 0, 33), IN(33)}, GPH_ALL, 3},
    {"layernorm no weight/bias", op_fn, X(.op = OP_LAYERNORM), NULL, 1,
     {IN(7, 13)}, GPH_DEFAULT, 3},
    {"layernorm weight only", op_fn, X(.op = OP_LAYERNORM, .with_w = 1),
     NULL, 2, {IN(13, 7), IN(7)}, GPH_DEFAULT, 3},
    {"layernorm of a transposed view", op_fn, X(.op = OP_TVIEW_LAYERNORM),
     NULL, 3, {IN(7, 2, 13), IN(13), IN(13)}, GPH_DEFAULT, 3},
    /* training widths: rows in registers (C = 771: not a multiple of the
     * vector width; 37 rows: not a multiple of a block's) and over the
     * register bound (C = 8200: the three-pass kernels) */
    {"layernorm [37,771] (rows in registers)", op_fn,
     X(.op = OP_LAYERNORM, .with_w = 1, .with_b = 1), NULL, 3,
     {IN(37, 771), INX(1.5, 0.5, 1, 0, 771), IN(771)}, GPH_ALL, 3},
    {"layernorm [3,8200] (over the register bound)", op_fn,
     X(.op = OP_LAYERNORM, .with_w = 1, .with_b = 1), NULL, 3,
     {IN(3, 8200), INX(1.5, 0.5, 1, 0, 8200), IN(8200)}, GPH_DEFAULT, 3},
    /* ---- embedding ---- */
    {"embedding [2,5] ids into [13,7]", op_fn,
     X(.op = OP_EMBEDDING, .idx_nd = 2, .idx_shape = {2, 5}, .vocab = 13),
     setup_indices, 1, {IN(13, 7)}, GPH_ALL},
    {"embedding 33 ids into [5,8] (many repeats)", op_fn,
     X(.op = OP_EMBEDDING, .idx_nd = 1, .idx_shape = {33}, .vocab = 5),
     setup_indices, 1, {IN(5, 8)}},
    {"embedding 600 ids into [3,300] (long rows, column tiles)", op_fn,
     X(.op = OP_EMBEDDING, .idx_nd = 1, .idx_shape = {600}, .vocab = 3),
     setup_indices, 1, {IN(3, 300)}},
    /* ---- cross-entropy ---- */
    {"cross_entropy [2,7,13], ~25% ignored", op_fn,
     X(.op = OP_CROSS_ENTROPY, .idx_nd = 1, .idx_shape = {14}, .vocab = 13,
       .ignore_frac = 0.25),
     setup_targets, 1, {INX(3, 0, 0, 0, 2, 7, 13)}, GPH_ALL, .fp32_out = 1},
    {"cross_entropy [33,5]", op_fn,
     X(.op = OP_CROSS_ENTROPY, .idx_nd = 1, .idx_shape = {33}, .vocab = 5),
     setup_targets, 1, {INX(3, 0, 0, 0, 33, 5)}, .fp32_out = 1},
    {"cross_entropy every row ignored", op_fn,
     X(.op = OP_CROSS_ENTROPY, .idx_nd = 1, .idx_shape = {7}, .vocab = 13,
       .ignore_frac = 1),
     setup_targets, 1, {IN(7, 13)}, .fp32_out = 1},
    {"cross_entropy of transposed logits", op_fn,
     X(.op = OP_TVIEW_CROSS_ENTROPY, .idx_nd = 1, .idx_shape = {7},
       .vocab = 33, .ignore_frac = 0.2),
     setup_targets, 1, {INX(3, 0, 0, 0, 33, 7)}, .fp32_out = 1},
    /* ---- dropout: identical Philox masks on both devices ---- */
    {"dropout p 0.1", op_fn, X(.op = OP_DROPOUT, .p = 0.1), setup_seed, 1,
     {IN(2, 7, 33)}},
    {"dropout p 0.1 of a transposed view", op_fn,
     X(.op = OP_TVIEW_DROPOUT, .p = 0.1), setup_seed, 1, {IN(13, 33)}},
    /* ---- attention. The bf16/fp16 tensor-core kernels round P and dS
     * (like FlashAttention-2); depth 8 bounds that chain (P, O, dP - D,
     * dS, dQ/dK/dV, saved O). Their accuracy against a same-precision
     * naive attention is tested in test_gpu_attention; this checks the
     * op's wiring. ---- */
    {"attention causal [2,7,2,8]", op_fn,
     X(.op = OP_ATTENTION, .causal = 1), NULL, 3,
     {IN(2, 7, 2, 8), IN(2, 7, 2, 8), IN(2, 7, 2, 8)}, GPH_ALL, 8},
    {"attention GQA H 4 Hk 2, Nq 5 Nk 13", op_fn,
     X(.op = OP_ATTENTION), NULL, 3,
     {IN(1, 5, 4, 16), IN(1, 13, 2, 16), IN(1, 13, 2, 16)}, GPH_DEFAULT, 8},
    {"attention causal GQA H 4 Hk 1, Nq 13 Nk 33", op_fn,
     X(.op = OP_ATTENTION, .causal = 1), NULL, 3,
     {IN(2, 13, 4, 8), IN(2, 33, 1, 8), IN(2, 33, 1, 8)}, GPH_DEFAULT, 8},
    {"attention causal, dropout 0.1", op_fn,
     X(.op = OP_ATTENTION, .causal = 1, .p = 0.1), setup_seed, 3,
     {IN(2, 13, 2, 8), IN(2, 13, 2, 8), IN(2, 13, 2, 8)}, GPH_DEFAULT, 8},
    {"attention on strided views of a fused QKV", op_fn,
     X(.op = OP_ATTENTION_QKV, .a = 2, .causal = 1), NULL, 1,
     {IN(2, 7, 48)}, GPH_DEFAULT, 8},
    {"fg_attention_qkvpacked, causal, dropout", op_fn,
     X(.op = OP_ATTENTION_QKVPACKED, .a = 2, .causal = 1, .p = 0.1),
     setup_seed, 1, {IN(2, 13, 48)}, GPH_DEFAULT, 8},
};

const int gph_n_cases = (int)(sizeof gph_cases / sizeof gph_cases[0]);
