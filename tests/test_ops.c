/* SPDX-License-Identifier: MIT */
/* tests/test_ops.c - gradcheck (fp64, eps 1e-6, |a - n| <= 1e-5 + 1e-3 |n|)
 * of the elementwise, matmul, reduction and shape ops on random shapes from
 * the run's seed: odd extents, size-1 dimensions, 0-d scalars, broadcasting,
 * strided (transposed / sliced) inputs. Plus forward values against naive
 * loops (matmul: CBLAS and the loop fallback, fp32 within 1e-5 relative,
 * fp64 within 1e-12). */
#include <float.h>

#include "test_ops_util.h"
#include "lib/core/blas.h"

#define LOOPS 16

/* ---- elementwise ----------------------------------------------------------- */

typedef struct op_ctx {
    int op;
    double k;
    int dims[FG_MAX_DIMS];
    int n_dims, keepdim, dim;
    int64_t a, b, c; /* op parameters (slice start/end/step etc.) */
    int64_t shape[FG_MAX_DIMS];
    int nd;
    int ta, tb, view_a;
} op_ctx;

static fg_status binary_fn(fg_tensor *const *in, int n, fg_tensor **out,
                           void *u)
{
    const op_ctx *c = u;
    switch (c->op) {
    case 0: return fg_add(in[0], in[1], out);
    case 1: return fg_sub(in[0], in[1], out);
    case 2: return fg_mul(in[0], in[1], out);
    default: return fg_div(in[0], in[1], out);
    }
}

/* b's shape: a random suffix of a's with some extents set to 1. */
static int bcast_shape(fgt_rng *r, int nd, const int64_t *sa, int64_t *sb)
{
    int nb = (int)fgt_int(r, 0, nd);
    for (int i = 0; i < nb; i++)
        sb[i] = fgt_int(r, 0, 2) == 0 ? 1 : sa[nd - nb + i];
    return nb;
}

START_TEST(test_binary)
{
    fgt_rng r = fgt_rng_for(400 + (uint64_t)_i);
    for (int op = 0; op < 4; op++) {
        int64_t sa[FG_MAX_DIMS], sb[FG_MAX_DIMS];
        int na = fgt_shape(&r, 0, 4, 4, sa);
        int nb = bcast_shape(&r, na, sa, sb);
        int swap = fgt_int(&r, 0, 1);
        fg_tensor *a = fgt_rand(&r, FG_FP64, na, sa, 1.5, 0, 1);
        fg_tensor *b = fgt_rand(&r, FG_FP64, nb, sb, 1.5, op == 3 ? 0.5 : 0,
                                fgt_int(&r, 0, 2) != 0);
        fg_tensor *in[2] = {swap && op != 3 ? b : a, swap && op != 3 ? a : b};
        op_ctx c = {.op = op};
        char what[64];
        snprintf(what, sizeof what, "binary op %d (case %d)", op, _i);
        fgt_gradcheck(what, binary_fn, &c, in, 2, 0);
        fg_tensor_free(a);
        fg_tensor_free(b);
    }
}
END_TEST

static fg_status unary_fn(fg_tensor *const *in, int n, fg_tensor **out,
                          void *u)
{
    const op_ctx *c = u;
    switch (c->op) {
    case 0: return fg_exp(in[0], out);
    case 1: return fg_log(in[0], out);
    case 2: return fg_tanh(in[0], out);
    case 3: return fg_relu(in[0], out);
    case 4: return fg_gelu(in[0], out);
    case 5: return fg_scale(in[0], c->k, out);
    default: return fg_add_scalar(in[0], c->k, out);
    }
}

START_TEST(test_unary)
{
    fgt_rng r = fgt_rng_for(410 + (uint64_t)_i);
    for (int op = 0; op < 7; op++) {
        int64_t s[FG_MAX_DIMS];
        int nd = fgt_shape(&r, 0, 4, 5, s);
        /* relu: keep 0.05 away from the kink; log: positive inputs */
        fg_tensor *x = fgt_rand(&r, FG_FP64, nd, s, 2.0,
                                op == 3 ? 0.05 : op == 1 ? 0.2 : 0, 1);
        if (op == 1) {
            double *h = fgt_host(x);
            for (int64_t i = 0; i < fg_tensor_numel(x); i++)
                h[i] = fabs(h[i]);
            fg_no_grad_begin();
            FGT_OK(fg_tensor_copy_from_host(x, FG_FP64, h, fg_tensor_numel(x)));
            FGT_OK(fg_no_grad_end());
            free(h);
        }
        op_ctx c = {.op = op, .k = 3 * fgt_uniform(&r)};
        char what[64];
        snprintf(what, sizeof what, "unary op %d (case %d)", op, _i);
        fgt_gradcheck(what, unary_fn, &c, &x, 1, 0);
        fg_tensor_free(x);
    }
}
END_TEST

/* Forward values against libm (fp64 within 1e-14 relative). */
START_TEST(test_elementwise_values)
{
    fgt_rng r = fgt_rng_for(415);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(3, 5), 2, 0.01, 0);
    fg_tensor *b = fgt_rand(&r, FG_FP64, FG_SHAPE(5), 2, 0.5, 0);
    double *hx = fgt_host(x), *hb = fgt_host(b);
    fg_tensor *y[6];
    FGT_OK(fg_gelu(x, &y[0]));
    FGT_OK(fg_relu(x, &y[1]));
    FGT_OK(fg_div(x, b, &y[2]));
    FGT_OK(fg_sub(b, x, &y[3]));
    FGT_OK(fg_tanh(x, &y[4]));
    FGT_OK(fg_add_scalar(x, -0.5, &y[5]));
    double *h[6];
    for (int k = 0; k < 6; k++)
        h[k] = fgt_host(y[k]);
    for (int i = 0; i < 15; i++) {
        double v = hx[i], w = hb[i % 5];
        double ge = 0.5 * v *
                    (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        ck_assert(fabs(h[0][i] - ge) <= 1e-14 * (1 + fabs(ge)));
        ck_assert(h[1][i] == (v > 0 ? v : 0));
        ck_assert(fabs(h[2][i] - v / w) <= 1e-15 * fabs(v / w));
        ck_assert(h[3][i] == w - v);
        ck_assert(fabs(h[4][i] - tanh(v)) <= 1e-15);
        ck_assert(h[5][i] == v - 0.5);
    }
    fg_tensor *bad, *c;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(4), &c));
    FGT_FAILS(fg_add(x, c, &bad), FG_ERR_INVALID_ARGUMENT); /* 5 vs 4 */
    FGT_FAILS(fg_add(x, NULL, &bad), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_exp(x, NULL), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_scale(x, NAN, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_tensor *h16;
    FGT_OK(fg_tensor_zeros(FG_FP16, FG_DEVICE_CPU, FG_SHAPE(4), &h16));
    FGT_FAILS(fg_exp(h16, &bad), FG_ERR_UNSUPPORTED);
    for (int k = 0; k < 6; k++) {
        fg_tensor_free(y[k]);
        free(h[k]);
    }
    fg_tensor *all[] = {x, b, c, h16};
    fgt_free_all(all, 4);
    free(hx);
    free(hb);
}
END_TEST

/* fp32 GELU and its derivative on [-9, 9] against the tanh form in fp64
 * (an independent reference: the library computes x sigmoid(2u)): the
 * value within 2 FLT_EPSILON |x| (the tanhf form lost everything below
 * x = -5, where 1 + tanh(u) cancels), the derivative within 1e-5
 * (|g| + 0.01). */
START_TEST(test_gelu_fp32_accuracy)
{
    enum { N = 7201 };
    static float hx[N];
    for (int i = 0; i < N; i++)
        hx[i] = -9.0f + 0.0025f * (float)i;
    fg_tensor *x, *y, *sum, *gx;
    FGT_OK(fg_tensor_from_host(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(N), hx, &x));
    FGT_OK(fg_tensor_set_requires_grad(x, 1));
    FGT_OK(fg_gelu(x, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &sum));
    FGT_OK(fg_backward(sum));
    gx = fg_tensor_grad(x);
    ck_assert_ptr_nonnull(gx);
    double *hy = fgt_host(y), *hg = fgt_host(gx);
    const double c = sqrt(2 / M_PI), a = 0.044715;
    for (int i = 0; i < N; i++) {
        const double v = hx[i], t = tanh(c * (v + a * v * v * v));
        const double ge = 0.5 * v * (1 + t);
        const double gd = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * a * v * v);
        ck_assert_msg(fabs(hy[i] - ge) <= 2 * FLT_EPSILON * fabs(v), "gelu(%g) = %.9g, want %.9g",
                      v, hy[i], ge);
        ck_assert_msg(fabs(hg[i] - gd) <= 1e-5 * (fabs(gd) + 0.01), "gelu'(%g) = %.9g, want %.9g",
                      v, hg[i], gd);
    }
    /* The tail, where the fp64 reference above cancels too: for x <= -5,
     * 1 + tanh(u) = 2 e^(2u) (1 + O(e^(2u))), so gelu = x e^(2u) to 1e-9 */
    for (int i = 0; hx[i] <= -5.0f; i++) {
        const double v = hx[i], tail = v * exp(2 * c * (v + a * v * v * v));
        ck_assert_msg(fabs(hy[i] - tail) <= 1e-5 * fabs(tail), "gelu(%g) = %.9g, want %.9g", v,
                      hy[i], tail);
    }
    free(hy);
    free(hg);
    fg_tensor *all[] = {x, y, sum};
    fgt_free_all(all, 3);
}
END_TEST

/* ---- matmul -------------------------------------------------------------- */

static fg_status matmul_fn(fg_tensor *const *in, int n, fg_tensor **out,
                           void *u)
{
    const op_ctx *c = u;
    fg_tensor *a = in[0];
    int ta = c->ta;
    if (c->view_a) { /* feed a transposed view: strided operand */
        fg_tensor *v;
        FGT_TRY(fg_transpose(a, -1, -2, &v));
        fg_status s = fg_matmul(v, in[1], !ta, c->tb, out);
        fg_tensor_free(v);
        return s;
    }
    return fg_matmul(a, in[1], ta, c->tb, out);
}

START_TEST(test_matmul_grad)
{
    fgt_rng r = fgt_rng_for(420 + (uint64_t)_i);
    for (int kind = 0; kind < 5; kind++) {
        int64_t M = fgt_int(&r, 1, 5), N = fgt_int(&r, 1, 5),
                K = fgt_int(&r, 1, 5), B = fgt_int(&r, 1, 3),
                B2 = fgt_int(&r, 2, 3);
        op_ctx c = {.ta = (int)fgt_int(&r, 0, 1), .tb = (int)fgt_int(&r, 0, 1),
                    .view_a = kind == 4};
        int64_t sa[4], sb[4];
        int na = 0, nb = 0;
        /* a, b shapes in storage order (trans swaps the last two) */
#define MAT(s, n, r0, c0, t)            \
    do {                                \
        s[n++] = (t) ? (c0) : (r0);     \
        s[n++] = (t) ? (r0) : (c0);     \
    } while (0)
        switch (kind) {
        case 0: break;                          /* [M,K] x [K,N] */
        case 1: sa[na++] = B; break;            /* [B,M,K] x [K,N] */
        case 2: sb[nb++] = B; break;            /* [M,K] x [B,K,N] */
        case 3:                                 /* [B2,1,..] x [B,..] */
            sa[na++] = B2;
            sa[na++] = 1;
            sb[nb++] = B;
            break;
        default: sa[na++] = B; sb[nb++] = B; break; /* strided a */
        }
        MAT(sa, na, M, K, c.ta);
        MAT(sb, nb, K, N, c.tb);
        fg_tensor *in[2] = {fgt_rand(&r, FG_FP64, na, sa, 1, 0, 1),
                            fgt_rand(&r, FG_FP64, nb, sb, 1, 0, 1)};
        char what[64];
        snprintf(what, sizeof what, "matmul kind %d ta %d tb %d (case %d)",
                 kind, c.ta, c.tb, _i);
        fgt_gradcheck(what, matmul_fn, &c, in, 2, 0);
        fgt_free_all(in, 2);
    }
}
END_TEST

/* C[b] = op(A[b]) op(B[b]) by definition, in double. */
static void naive_bmm(const double *a, const double *b, double *c, int64_t B,
                      int64_t M, int64_t N, int64_t K, int ta, int tb,
                      int b_shared)
{
    for (int64_t z = 0; z < B; z++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    double x = ta ? a[z * M * K + k * M + i]
                                  : a[z * M * K + i * K + k];
                    const double *bb = b + (b_shared ? 0 : z * K * N);
                    double y = tb ? bb[j * K + k] : bb[k * N + j];
                    s += x * y;
                }
                c[(z * M + i) * N + j] = s;
            }
}

START_TEST(test_matmul_values)
{
    fgt_rng r = fgt_rng_for(430 + (uint64_t)_i);
    for (int force_loop = 0; force_loop < 2; force_loop++)
        for (int dt = 0; dt < 2; dt++)
            for (int t = 0; t < 4; t++) {
                fg_gemm_force_loop(force_loop);
                int ta = t & 1, tb = t >> 1, shared = fgt_int(&r, 0, 1);
                int64_t B = fgt_int(&r, 1, 4), M = fgt_int(&r, 1, 40),
                        N = fgt_int(&r, 1, 40), K = fgt_int(&r, 1, 40);
                int64_t sa[3] = {B, ta ? K : M, ta ? M : K};
                int64_t sb[3] = {B, tb ? N : K, tb ? K : N};
                fg_dtype d = dt ? FG_FP64 : FG_FP32;
                fg_tensor *a = fgt_rand(&r, d, 3, sa, 1, 0, 0);
                fg_tensor *b = shared ? fgt_rand(&r, d, 2, sb + 1, 1, 0, 0)
                                      : fgt_rand(&r, d, 3, sb, 1, 0, 0);
                fg_tensor *c;
                FGT_OK(fg_matmul(a, b, ta, tb, &c));
                ck_assert_int_eq(fg_tensor_size(c, 0), B);
                ck_assert_int_eq(fg_tensor_size(c, 1), M);
                ck_assert_int_eq(fg_tensor_size(c, 2), N);
                double *ha = fgt_host(a), *hb = fgt_host(b), *hc = fgt_host(c);
                double *ref = malloc(sizeof(double) * (size_t)(B * M * N));
                naive_bmm(ha, hb, ref, B, M, N, K, ta, tb, shared);
                double tol = dt ? 1e-12 : 1e-5;
                for (int64_t i = 0; i < B * M * N; i++)
                    ck_assert_msg(fabs(hc[i] - ref[i]) <= tol * (1 + fabs(ref[i])),
                                  "%s (forced loop %d) %s ta %d tb %d: %g "
                                  "vs %g",
                                  fg_gemm_backend(), force_loop,
                                  dt ? "fp64" : "fp32", ta, tb,
                                  hc[i], ref[i]);
                free(ha);
                free(hb);
                free(hc);
                free(ref);
                fg_tensor_free(a);
                fg_tensor_free(b);
                fg_tensor_free(c);
            }
    fg_gemm_force_loop(0);
    fg_tensor *a, *b, *bad;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 3), &a));
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(4, 5), &b));
    FGT_FAILS(fg_matmul(a, b, 0, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "inner dimensions"));
    FGT_FAILS(fg_matmul(a, NULL, 0, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_tensor_free(a);
    fg_tensor_free(b);
    /* K = 0: a zero product, no BLAS call with bad leading dimensions. */
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(3, 0), &a));
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(0, 2), &b));
    FGT_OK(fg_matmul(a, b, 0, 0, &bad));
    float *p = fg_tensor_data(bad);
    for (int i = 0; i < 6; i++)
        ck_assert(p[i] == 0.0f);
    fg_tensor *all[] = {a, b, bad};
    fgt_free_all(all, 3);
}
END_TEST

/* ---- reductions ------------------------------------------------------------ */

static fg_status reduce_fn(fg_tensor *const *in, int n, fg_tensor **out,
                           void *u)
{
    const op_ctx *c = u;
    return (c->op ? fg_mean : fg_sum)(in[0], c->n_dims ? c->dims : NULL,
                                      c->n_dims, c->keepdim, out);
}

START_TEST(test_reduce)
{
    fgt_rng r = fgt_rng_for(440 + (uint64_t)_i);
    for (int op = 0; op < 2; op++) {
        int64_t s[FG_MAX_DIMS];
        int nd = fgt_shape(&r, 1, 4, 4, s);
        op_ctx c = {.op = op, .keepdim = (int)fgt_int(&r, 0, 1)};
        for (int d = 0; d < nd; d++)
            if (fgt_int(&r, 0, 1))
                c.dims[c.n_dims++] = fgt_int(&r, 0, 1) ? d : d - nd;
        fg_tensor *x = fgt_rand(&r, FG_FP64, nd, s, 1, 0, 1);
        char what[64];
        snprintf(what, sizeof what, "%s over %d dims (case %d)",
                 op ? "mean" : "sum", c.n_dims, _i);
        fgt_gradcheck(what, reduce_fn, &c, &x, 1, 0);
        fg_tensor_free(x);
    }
}
END_TEST

START_TEST(test_reduce_values)
{
    const double v[6] = {1, 2, 3, 4, 5, 6};
    fg_tensor *x, *s0, *s1, *m, *all;
    FGT_OK(fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 3), v, &x));
    int d0 = 0, d1 = -1;
    FGT_OK(fg_sum(x, &d0, 1, 0, &s0));
    FGT_OK(fg_sum(x, &d1, 1, 1, &s1));
    FGT_OK(fg_mean(x, NULL, 0, 0, &m));
    FGT_OK(fg_sum(x, NULL, 0, 1, &all));
    ck_assert_int_eq(fg_tensor_ndim(s0), 1);
    ck_assert_int_eq(fg_tensor_size(s1, 1), 1);
    ck_assert_int_eq(fg_tensor_ndim(m), 0);
    ck_assert_int_eq(fg_tensor_ndim(all), 2);
    double *h0 = fgt_host(s0), *h1 = fgt_host(s1);
    ck_assert(h0[0] == 5 && h0[1] == 7 && h0[2] == 9);
    ck_assert(h1[0] == 6 && h1[1] == 15);
    ck_assert(fgt_item(m) == 3.5 && fgt_item(all) == 21);
    int dup[2] = {1, -1};
    fg_tensor *bad;
    FGT_FAILS(fg_sum(x, dup, 2, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    int out_of_range = 2;
    FGT_FAILS(fg_mean(x, &out_of_range, 1, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_tensor *t[] = {x, s0, s1, m, all};
    fgt_free_all(t, 5);
    free(h0);
    free(h1);
}
END_TEST

/* ---- shape ops ------------------------------------------------------------- */

static fg_status shape_fn(fg_tensor *const *in, int n, fg_tensor **out,
                          void *u)
{
    const op_ctx *c = u;
    switch (c->op) {
    case 0: return fg_reshape(in[0], c->nd, c->shape, out);
    case 1: return fg_permute(in[0], c->dims, out);
    case 2: return fg_transpose(in[0], c->dims[0], c->dims[1], out);
    case 3: return fg_slice(in[0], c->dim, c->a, c->b, c->c, out);
    case 4: return fg_narrow(in[0], c->dim, c->a, c->b, out);
    case 5: return fg_concat(in, n, c->dim, out);
    case 6: { /* split, then recombine the parts differently */
        fg_tensor *p[3], *q;
        int64_t sizes[3] = {c->a, c->b, c->c};
        FGT_TRY(fg_split(in[0], c->dim, sizes, 3, p));
        fg_tensor *order[3] = {p[2], p[0], p[1]};
        fg_status s = fg_concat(order, 2, c->dim, &q); /* p[1] unused */
        fgt_free_all(p, 3);
        if (s == FG_OK) {
            s = fg_mul(q, q, out);
            fg_tensor_free(q);
        }
        return s;
    }
    default: { /* contiguous of a transposed view */
        fg_tensor *v;
        FGT_TRY(fg_transpose(in[0], 0, -1, &v));
        fg_status s = fg_contiguous(v, out);
        fg_tensor_free(v);
        return s;
    }
    }
}

START_TEST(test_shape_ops)
{
    fgt_rng r = fgt_rng_for(450 + (uint64_t)_i);
    for (int op = 0; op < 8; op++) {
        int64_t s[FG_MAX_DIMS];
        int nd = fgt_shape(&r, 1, 4, 5, s);
        op_ctx c = {.op = op};
        int n_in = 1;
        fg_tensor *in[3] = {NULL, NULL, NULL};
        c.dim = (int)fgt_int(&r, 0, nd - 1);
        int64_t ext = s[c.dim];
        switch (op) {
        case 0: { /* reshape: move a factor around, infer one dimension */
            int64_t numel = 1;
            for (int i = 0; i < nd; i++)
                numel *= s[i];
            c.nd = 3;
            c.shape[0] = s[0];
            c.shape[1] = -1;
            c.shape[2] = 1;
            (void)numel;
            break;
        }
        case 1: /* random permutation */
            for (int i = 0; i < nd; i++)
                c.dims[i] = i;
            for (int i = nd - 1; i > 0; i--) {
                int j = (int)fgt_int(&r, 0, i), t = c.dims[i];
                c.dims[i] = c.dims[j];
                c.dims[j] = t;
            }
            break;
        case 2:
            c.dims[0] = (int)fgt_int(&r, 0, nd - 1);
            c.dims[1] = (int)fgt_int(&r, -nd, -1);
            break;
        case 3: /* python slice, possibly negative / out of range / empty */
            c.a = fgt_int(&r, -ext, ext - 1); /* non-empty result */
            c.b = (c.a < 0 ? c.a + ext : c.a) + fgt_int(&r, 1, ext + 1);
            if (fgt_int(&r, 0, 1) && c.b < ext)
                c.b -= ext; /* same end, negative */
            c.c = fgt_int(&r, 1, 3);
            break;
        case 4:
            c.a = fgt_int(&r, 0, ext - 1);
            c.b = fgt_int(&r, 1, ext - c.a);
            break;
        case 5: /* concat of 3 tensors that differ along dim */
            n_in = 3;
            break;
        case 6: /* split into 3 parts (one may be empty) */
            s[c.dim] = ext = fgt_int(&r, 2, 6);
            c.a = fgt_int(&r, 1, ext); /* the output is never empty */
            c.b = fgt_int(&r, 0, ext - c.a);
            c.c = ext - c.a - c.b;
            break;
        default:
            break;
        }
        for (int k = 0; k < n_in; k++) {
            if (op == 5)
                s[c.dim] = fgt_int(&r, 1, 3);
            in[k] = fgt_rand(&r, FG_FP64, nd, s, 1, 0, k != 1 || op != 5 ? 1 : 0);
        }
        char what[64];
        snprintf(what, sizeof what, "shape op %d (case %d)", op, _i);
        fgt_gradcheck(what, shape_fn, &c, in, n_in, 0);
        fgt_free_all(in, n_in);
    }
}
END_TEST

static fg_status bias_gelu_fn(fg_tensor *const *in, int n, fg_tensor **out,
                              void *u)
{
    (void)n;
    (void)u;
    return fg_bias_gelu(in[0], in[1], out);
}

/* The fused op equals gelu(x + b) and its gradients pass gradcheck (x
 * strided too); bad bias shapes are refused. */
START_TEST(test_bias_gelu)
{
    fgt_rng r = fgt_rng_for(470);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(2, 3, 5), 2, 0, 1);
    fg_tensor *b = fgt_rand(&r, FG_FP64, FG_SHAPE(5), 1, 0, 1);
    fg_tensor *y, *t, *z;
    FGT_OK(fg_bias_gelu(x, b, &y));
    FGT_OK(fg_add(x, b, &t));
    FGT_OK(fg_gelu(t, &z));
    double *hy = fgt_host(y), *hz = fgt_host(z);
    for (int i = 0; i < 30; i++)
        ck_assert_msg(fabs(hy[i] - hz[i]) <= 1e-15 * (1 + fabs(hz[i])),
                      "element %d: %.17g vs %.17g", i, hy[i], hz[i]);
    free(hy);
    free(hz);
    fg_tensor *in[2] = {x, b};
    fgt_gradcheck("bias_gelu", bias_gelu_fn, NULL, in, 2, 0);
    fg_tensor *xt;
    FGT_OK(fg_transpose(x, 0, 1, &xt)); /* [3, 2, 5], strided */
    fg_tensor *in2[2] = {xt, b};
    fgt_gradcheck("bias_gelu strided", bias_gelu_fn, NULL, in2, 2, 0);
    fg_tensor *bad = fgt_rand(&r, FG_FP64, FG_SHAPE(3), 1, 0, 0);
    fg_tensor *o = (fg_tensor *)0x1;
    FGT_FAILS(fg_bias_gelu(x, bad, &o), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(o, (fg_tensor *)0x1);
    fg_tensor *all[] = {y, t, z, xt, bad, x, b};
    fgt_free_all(all, 7);
}
END_TEST

FGT_MAIN_BEGIN("ops")
FGT_LOOP(test_binary, LOOPS)
FGT_LOOP(test_unary, LOOPS)
FGT_TEST(test_elementwise_values)
FGT_TEST(test_gelu_fp32_accuracy)
FGT_TEST(test_bias_gelu)
FGT_LOOP(test_matmul_grad, LOOPS)
FGT_LOOP(test_matmul_values, 2)
FGT_LOOP(test_reduce, LOOPS)
FGT_TEST(test_reduce_values)
FGT_LOOP(test_shape_ops, LOOPS)
FGT_MAIN_END()
