/* SPDX-License-Identifier: MIT */
/* tests/test_ops_nn.c - the neural-network ops: gradcheck in fp64 (eps
 * 1e-6, |a - n| <= 1e-5 + 1e-3 |n|) of softmax, log_softmax, layernorm
 * (also through fg_layernorm_cast's same-dtype path),
 * embedding, cross-entropy, dropout, dropout + add (+ layernorm) and
 * attention on random shapes; their
 * forward values against naive formulas (fp64 within 1e-12); the dropout
 * mask statistics; and the attention node's memory: it saves Q, K, V, O,
 * m, l and its parameters, nothing of size N^2. */
#include "test_ops_util.h"

#define LOOPS 8

typedef struct nn_ctx {
    int op, dim, use_w, use_b;
    int64_t idx[64];
    int n_idx;
    int64_t ignore;
    double p;
    uint64_t seed, offset;
    fg_attention_options ao;
    int H, Hk, d, fused;
} nn_ctx;

/* ---- softmax / log_softmax --------------------------------------------- */

static fg_status softmax_fn(fg_tensor *const *in, int n, fg_tensor **out,
                            void *u)
{
    const nn_ctx *c = u;
    /* weight the output so the gradient is not trivially zero (rows of a
     * softmax sum to 1) */
    fg_tensor *y;
    FGT_TRY((c->op ? fg_log_softmax : fg_softmax)(in[0], c->dim, &y));
    fg_status s = fg_mul(y, in[1], out);
    fg_tensor_free(y);
    return s;
}

START_TEST(test_softmax_grad)
{
    fgt_rng r = fgt_rng_for(500 + (uint64_t)_i);
    for (int op = 0; op < 2; op++) {
        int64_t s[FG_MAX_DIMS];
        int nd = fgt_shape(&r, 1, 4, 5, s);
        nn_ctx c = {.op = op, .dim = (int)fgt_int(&r, -nd, nd - 1)};
        fg_tensor *in[2] = {fgt_rand(&r, FG_FP64, nd, s, 2, 0, 1),
                            fgt_rand(&r, FG_FP64, nd, s, 1, 0, 0)};
        fgt_gradcheck(op ? "log_softmax" : "softmax", softmax_fn, &c, in, 2,
                      0);
        fgt_free_all(in, 2);
    }
}
END_TEST

START_TEST(test_softmax_values)
{
    fgt_rng r = fgt_rng_for(505);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(3, 4, 5), 3, 0, 0);
    fg_tensor *y, *ly;
    FGT_OK(fg_softmax(x, 1, &y));
    FGT_OK(fg_log_softmax(x, 1, &ly));
    double *hx = fgt_host(x), *hy = fgt_host(y), *hl = fgt_host(ly);
    for (int a = 0; a < 3; a++)
        for (int c = 0; c < 5; c++) {
            double mx = -1e300, s = 0;
            for (int b = 0; b < 4; b++)
                mx = fmax(mx, hx[(a * 4 + b) * 5 + c]);
            for (int b = 0; b < 4; b++)
                s += exp(hx[(a * 4 + b) * 5 + c] - mx);
            for (int b = 0; b < 4; b++) {
                int i = (a * 4 + b) * 5 + c;
                ck_assert(fabs(hy[i] - exp(hx[i] - mx) / s) < 1e-15);
                ck_assert(fabs(hl[i] - (hx[i] - mx - log(s))) < 1e-14);
            }
        }
    fg_tensor *bad;
    FGT_FAILS(fg_softmax(x, 3, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {x, y, ly};
    fgt_free_all(all, 3);
    free(hx);
    free(hy);
    free(hl);
}
END_TEST

/* ---- layernorm ------------------------------------------------------------ */

static fg_status layernorm_fn(fg_tensor *const *in, int n, fg_tensor **out,
                              void *u)
{
    const nn_ctx *c = u;
    fg_tensor *w = c->use_w ? in[1] : NULL, *b = c->use_b ? in[2] : NULL;
    if (c->op) /* fg_layernorm_cast's same-dtype path */
        return fg_layernorm_cast(in[0], w, b, 1e-5, FG_FP64, out);
    return fg_layernorm(in[0], w, b, 1e-5, out);
}

START_TEST(test_layernorm_grad)
{
    fgt_rng r = fgt_rng_for(510 + (uint64_t)_i);
    for (int v = 0; v < 4; v++) {
        int64_t s[FG_MAX_DIMS];
        int nd = fgt_shape(&r, 1, 3, 4, s);
        s[nd - 1] = fgt_int(&r, 2, 7);
        nn_ctx c = {.use_w = v != 1, .use_b = v != 2, .op = v == 3};
        fg_tensor *in[3] = {fgt_rand(&r, FG_FP64, nd, s, 2, 0, 1),
                            fgt_rand(&r, FG_FP64, 1, s + nd - 1, 1, 0, 1),
                            fgt_rand(&r, FG_FP64, 1, s + nd - 1, 1, 0, 1)};
        fgt_gradcheck("layernorm", layernorm_fn, &c, in, 3, 0);
        fgt_free_all(in, 3);
    }
}
END_TEST

START_TEST(test_layernorm_values)
{
    fgt_rng r = fgt_rng_for(515);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(4, 6), 2, 0, 0);
    fg_tensor *w = fgt_rand(&r, FG_FP64, FG_SHAPE(6), 1, 0, 0);
    fg_tensor *b = fgt_rand(&r, FG_FP64, FG_SHAPE(6), 1, 0, 0);
    fg_tensor *y, *xt, *yt;
    FGT_OK(fg_layernorm(x, w, b, 1e-5, &y));
    double *hx = fgt_host(x), *hw = fgt_host(w), *hb = fgt_host(b),
           *hy = fgt_host(y);
    for (int i = 0; i < 4; i++) {
        double m = 0, v = 0;
        for (int j = 0; j < 6; j++)
            m += hx[i * 6 + j] / 6;
        for (int j = 0; j < 6; j++)
            v += (hx[i * 6 + j] - m) * (hx[i * 6 + j] - m) / 6;
        for (int j = 0; j < 6; j++)
            ck_assert(fabs(hy[i * 6 + j] - ((hx[i * 6 + j] - m) /
                                                 sqrt(v + 1e-5) * hw[j] +
                                             hb[j])) < 1e-13);
    }
    /* A strided input gives the same values as its contiguous copy. */
    FGT_OK(fg_transpose(x, 0, 1, &xt)); /* [6, 4]: rows of length 4 */
    FGT_OK(fg_layernorm(xt, NULL, NULL, 1e-5, &yt));
    ck_assert_int_eq(fg_tensor_size(yt, 0), 6);
    fg_tensor *bad;
    FGT_FAILS(fg_layernorm(x, b, NULL, 0.0, &bad), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_layernorm(xt, w, NULL, 1e-5, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {x, w, b, y, xt, yt};
    fgt_free_all(all, 6);
    free(hx);
    free(hw);
    free(hb);
    free(hy);
}
END_TEST

/* y = layernorm(x) in dtype yt (fg_layernorm_cast, or the chain it fuses:
 * fg_layernorm then fg_cast), then sum(y * gy) backward. */
static fg_tensor *ln_cast_run(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                              fg_tensor *gy, int fused)
{
    const fg_dtype yt = fg_tensor_dtype(gy);
    fg_tensor *y = NULL, *t = NULL, *p, *l;
    if (fused) {
        FGT_OK(fg_layernorm_cast(x, w, b, 1e-5, yt, &y));
    } else {
        FGT_OK(fg_layernorm(x, w, b, 1e-5, &t));
        FGT_OK(fg_cast(t, yt, &y));
    }
    ck_assert_int_eq(fg_tensor_dtype(y), yt);
    FGT_OK(fg_mul(y, gy, &p));
    FGT_OK(fg_sum(p, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    fg_tensor *all[] = {t, p, l};
    fgt_free_all(all, 3);
    return y;
}

static void same_bits(const char *what, const fg_tensor *a, const fg_tensor *b)
{
    const int64_t n = fg_tensor_numel(a);
    ck_assert_int_eq(n, fg_tensor_numel(b));
    double *ha = fgt_host(a), *hb = fgt_host(b);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(ha[i] == hb[i], "%s[%lld]: %.17g vs %.17g", what,
                      (long long)i, ha[i], hb[i]);
    free(ha);
    free(hb);
}

/* fg_layernorm_cast on the CPU (fp64 x, fp32 y): the chain's bits forward
 * and backward, the naive formula within y's rounding, NaN rows stay NaN
 * rows, and the dtype rule's errors leave *out alone. */
START_TEST(test_layernorm_cast)
{
    fgt_rng r = fgt_rng_for(517);
    const int64_t R = 5, C = 37;
    fg_tensor *in[2][3], *gy = fgt_rand(&r, FG_FP32, FG_SHAPE(R, C), 1, 0.01, 0);
    double *hx = NULL;
    {
        fg_tensor *t[3] = {fgt_rand(&r, FG_FP64, FG_SHAPE(R, C), 2, 0.01, 0),
                           fgt_rand(&r, FG_FP64, FG_SHAPE(C), 1, 0.01, 0),
                           fgt_rand(&r, FG_FP64, FG_SHAPE(C), 1, 0.01, 0)};
        for (int f = 0; f < 2; f++)
            for (int k = 0; k < 3; k++) { /* two copies of each */
                FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU,
                                       fg_tensor_ndim(t[k]),
                                       fg_tensor_shape(t[k]), &in[f][k]));
                FGT_OK(fg_tensor_copy(in[f][k], t[k]));
                FGT_OK(fg_tensor_set_requires_grad(in[f][k], 1));
            }
        hx = fgt_host(t[0]);
        fgt_free_all(t, 3);
    }
    fg_tensor *y = ln_cast_run(in[0][0], in[0][1], in[0][2], gy, 1);
    fg_tensor *yc = ln_cast_run(in[1][0], in[1][1], in[1][2], gy, 0);
    same_bits("y", y, yc);
    const char *names[3] = {"dx", "dw", "db"};
    for (int k = 0; k < 3; k++)
        same_bits(names[k], fg_tensor_grad(in[0][k]), fg_tensor_grad(in[1][k]));
    /* the naive formula, then y's rounding */
    double *hy = fgt_host(y), *hw = fgt_host(in[0][1]), *hb = fgt_host(in[0][2]);
    for (int64_t i = 0; i < R; i++) {
        double m = 0, v = 0;
        for (int64_t j = 0; j < C; j++)
            m += hx[i * C + j] / (double)C;
        for (int64_t j = 0; j < C; j++)
            v += (hx[i * C + j] - m) * (hx[i * C + j] - m) / (double)C;
        for (int64_t j = 0; j < C; j++) {
            const double ref =
                (hx[i * C + j] - m) / sqrt(v + 1e-5) * hw[j] + hb[j];
            ck_assert_msg(fabs(hy[i * C + j] - ref) <=
                              0x1p-24 * fabs(ref) + 1e-13,
                          "y[%lld, %lld] = %.9g, naive %.9g", (long long)i,
                          (long long)j, hy[i * C + j], ref);
        }
    }
    /* NaN in row 2 -> row 2 NaN, the others finite */
    hx[2 * C + 5] = NAN;
    fg_tensor *xn, *yn;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(R, C), &xn));
    FGT_OK(fg_tensor_copy_from_host(xn, FG_FP64, hx, R * C));
    FGT_OK(fg_layernorm_cast(xn, in[0][1], in[0][2], 1e-5, FG_FP32, &yn));
    double *hn = fgt_host(yn);
    for (int64_t i = 0; i < R * C; i++)
        ck_assert_msg(isnan(hn[i]) == (i / C == 2), "NaN at %lld",
                      (long long)i);
    /* errors: out untouched */
    fg_tensor *x32, *sentinel = (fg_tensor *)&r, *bad = sentinel;
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(R, C), &x32));
    FGT_FAILS(fg_layernorm_cast(x32, NULL, NULL, 1e-5, FG_BF16, &bad),
              FG_ERR_UNSUPPORTED);
    FGT_FAILS(fg_layernorm_cast(x32, NULL, NULL, 1e-5, FG_FP64, &bad),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_layernorm_cast(xn, NULL, NULL, 1e-5, FG_BF16, &bad),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_layernorm_cast(xn, NULL, NULL, 1e-5, (fg_dtype)99, &bad),
              FG_ERR_INVALID_ARGUMENT);
    /* -1 is fg_layernorm's internal "x's dtype": not a value to accept */
    FGT_FAILS(fg_layernorm_cast(x32, NULL, NULL, 1e-5, (fg_dtype)-1, &bad),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_layernorm_cast(xn, NULL, NULL, 0.0, FG_FP32, &bad),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(bad, sentinel);
    fg_tensor *all[] = {in[0][0], in[0][1], in[0][2], in[1][0], in[1][1],
                        in[1][2], gy, y, yc, xn, yn, x32};
    fgt_free_all(all, 12);
    free(hx);
    free(hy);
    free(hw);
    free(hb);
    free(hn);
}
END_TEST

/* ---- embedding -------------------------------------------------------------- */

static fg_status embedding_fn(fg_tensor *const *in, int n, fg_tensor **out,
                              void *u)
{
    const nn_ctx *c = u;
    return fg_embedding(in[0], c->idx, FG_SHAPE(2, (int64_t)c->n_idx / 2),
                        out);
}

START_TEST(test_embedding)
{
    fgt_rng r = fgt_rng_for(520 + (uint64_t)_i);
    int64_t V = fgt_int(&r, 1, 6), C = fgt_int(&r, 1, 5);
    nn_ctx c = {.n_idx = 2 * (int)fgt_int(&r, 1, 5)};
    for (int i = 0; i < c.n_idx; i++)
        c.idx[i] = fgt_int(&r, 0, V - 1); /* repeats are likely */
    fg_tensor *w = fgt_rand(&r, FG_FP64, FG_SHAPE(V, C), 1, 0, 1);
    fgt_gradcheck("embedding", embedding_fn, &c, &w, 1, 0);
    /* Values, and the backward as a scatter-add: dW[v] = count(v) * g. */
    fg_tensor *y, *l;
    FGT_OK(embedding_fn(&w, 1, &y, &c));
    double *hw = fgt_host(w), *hy = fgt_host(y);
    for (int i = 0; i < c.n_idx; i++)
        for (int j = 0; j < C; j++)
            ck_assert(hy[i * C + j] == hw[c.idx[i] * C + j]);
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    double *g = fgt_host(fg_tensor_grad(w));
    for (int64_t v = 0; v < V; v++) {
        int cnt = 0;
        for (int i = 0; i < c.n_idx; i++)
            cnt += c.idx[i] == v;
        for (int j = 0; j < C; j++)
            ck_assert(g[v * C + j] == cnt);
    }
    int64_t badidx[2] = {0, V};
    fg_tensor *bad;
    FGT_FAILS(fg_embedding(w, badidx, FG_SHAPE(2), &bad),
              FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {w, y, l};
    fgt_free_all(all, 3);
    free(hw);
    free(hy);
    free(g);
}
END_TEST

/* ---- cross-entropy --------------------------------------------------------- */

static fg_status ce_fn(fg_tensor *const *in, int n, fg_tensor **out, void *u)
{
    const nn_ctx *c = u;
    return fg_cross_entropy(in[0], c->idx, c->n_idx, c->ignore, out);
}

START_TEST(test_cross_entropy)
{
    fgt_rng r = fgt_rng_for(530 + (uint64_t)_i);
    int64_t s[3];
    int nd = fgt_shape(&r, 1, 3, 4, s);
    int64_t V = s[nd - 1] = fgt_int(&r, 1, 7), R = 1;
    for (int i = 0; i < nd - 1; i++)
        R *= s[i];
    nn_ctx c = {.n_idx = (int)R, .ignore = -100};
    for (int i = 0; i < R; i++)
        c.idx[i] = fgt_int(&r, 0, 3) == 0 ? -100 : fgt_int(&r, 0, V - 1);
    c.idx[0] = fgt_int(&r, 0, V - 1); /* at least one counted row */
    fg_tensor *x = fgt_rand(&r, FG_FP64, nd, s, 3, 0, 1);
    fgt_gradcheck("cross_entropy", ce_fn, &c, &x, 1, 0);
    /* value: mean over counted rows of logsumexp - x[target] */
    fg_tensor *l;
    FGT_OK(ce_fn(&x, 1, &l, &c));
    ck_assert_int_eq(fg_tensor_ndim(l), 0);
    double *hx = fgt_host(x), want = 0;
    int cnt = 0;
    for (int64_t i = 0; i < R; i++) {
        if (c.idx[i] == -100)
            continue;
        double s2 = 0;
        for (int64_t j = 0; j < V; j++)
            s2 += exp(hx[i * V + j]);
        want += log(s2) - hx[i * V + c.idx[i]];
        cnt++;
    }
    ck_assert(fabs(fgt_item(l) - want / cnt) < 1e-13);
    /* Every row ignored: loss 0 and a zero gradient. */
    nn_ctx z = c;
    for (int i = 0; i < R; i++)
        z.idx[i] = -100;
    fg_tensor *l0;
    FGT_OK(ce_fn(&x, 1, &l0, &z));
    ck_assert(fgt_item(l0) == 0.0);
    FGT_OK(fg_backward(l0));
    double *g = fgt_host(fg_tensor_grad(x));
    for (int64_t i = 0; i < R * V; i++)
        ck_assert(g[i] == 0.0);
    fg_tensor *bad;
    nn_ctx e = c;
    e.idx[0] = V;
    FGT_FAILS(ce_fn(&x, 1, &bad, &e), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_cross_entropy(x, c.idx, R + 1, -100, &bad),
              FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {x, l, l0};
    fgt_free_all(all, 3);
    free(hx);
    free(g);
}
END_TEST

/* ---- dropout --------------------------------------------------------------- */

static fg_status dropout_fn(fg_tensor *const *in, int n, fg_tensor **out,
                            void *u)
{
    const nn_ctx *c = u;
    return fg_dropout(in[0], c->p, c->seed, c->offset, out);
}

START_TEST(test_dropout)
{
    fgt_rng r = fgt_rng_for(540 + (uint64_t)_i);
    int64_t s[FG_MAX_DIMS];
    int nd = fgt_shape(&r, 1, 4, 5, s);
    nn_ctx c = {.p = 0.1 + 0.5 * fabs(fgt_uniform(&r)),
                .seed = fgt_next(&r), .offset = fgt_next(&r) % 1000};
    fg_tensor *x = fgt_rand(&r, FG_FP64, nd, s, 1, 0.01, 1);
    fgt_gradcheck("dropout", dropout_fn, &c, &x, 1, 0);
    fg_tensor_free(x);

    /* Statistics on 10^5 elements: kept fraction within 5 sigma of 1-p,
     * kept values scaled by 1/(1-p), the backward uses the same mask. */
    const int64_t n = 100000;
    fg_tensor *big, *y, *l;
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(n), &big));
    FGT_OK(fg_tensor_set_requires_grad(big, 1));
    FGT_OK(fg_dropout(big, c.p, c.seed, c.offset, &y));
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    const float *py = fg_tensor_data(y), *pg = fg_tensor_data(fg_tensor_grad(big));
    const float kept = (float)(1.0 / (1.0 - c.p));
    int64_t nk = 0;
    for (int64_t i = 0; i < n; i++) {
        ck_assert(py[i] == 0.0f || py[i] == kept);
        ck_assert(pg[i] == py[i]);
        nk += py[i] != 0;
    }
    double sd = sqrt(n * c.p * (1 - c.p));
    ck_assert_msg(fabs(nk - n * (1 - c.p)) < 5 * sd, "kept %lld of %lld, p %g",
                  (long long)nk, (long long)n, c.p);
    /* Another offset: another mask. Same pair: same mask. p = 0: copy. */
    fg_tensor *y2, *y3, *y0;
    FGT_OK(fg_dropout(big, c.p, c.seed, c.offset + 1, &y2));
    FGT_OK(fg_dropout(big, c.p, c.seed, c.offset, &y3));
    ck_assert(memcmp(fg_tensor_data(y2), py, n * 4) != 0);
    ck_assert(memcmp(fg_tensor_data(y3), py, n * 4) == 0);
    FGT_OK(fg_dropout(big, 0.0, c.seed, c.offset, &y0));
    ck_assert(((float *)fg_tensor_data(y0))[n - 1] == 1.0f);
    fg_tensor *bad;
    FGT_FAILS(fg_dropout(big, 1.0, 0, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {big, y, l, y2, y3, y0};
    fgt_free_all(all, 6);
}
END_TEST

/* ---- fused residual dropout-add --------------------------------------------- */

static fg_status dropout_add_fn(fg_tensor *const *in, int n, fg_tensor **out,
                                void *u)
{
    const nn_ctx *c = u;
    return fg_dropout_add(in[0], in[1], c->p, c->seed, c->offset, out);
}

/* fg_dropout_add: fp64 gradcheck (x and b), and in fp32 the forward and
 * both gradients equal the chain it fuses (fg_dropout then fg_add, the
 * independent reference) bit for bit, and y - x is 0 or b / (1 - p). */
START_TEST(test_dropout_add)
{
    fgt_rng r = fgt_rng_for(560 + (uint64_t)_i);
    int64_t s[FG_MAX_DIMS];
    int nd = fgt_shape(&r, 1, 4, 6, s);
    nn_ctx c = {.p = _i == 0 ? 0.0 : 0.1 + 0.5 * fabs(fgt_uniform(&r)),
                .seed = fgt_next(&r), .offset = fgt_next(&r) % 1000};
    fg_tensor *in[2] = {fgt_rand(&r, FG_FP64, nd, s, 1, 0.01, 1),
                        fgt_rand(&r, FG_FP64, nd, s, 1, 0.01, 1)};
    fgt_gradcheck("dropout_add", dropout_add_fn, &c, in, 2, 0);
    fgt_free_all(in, 2);

    const int64_t n = 4099, sn[1] = {n}; /* not a multiple of 4 (groups) */
    fg_tensor *x = fgt_rand(&r, FG_FP32, 1, sn, 2, 0.01, 1),
              *b = fgt_rand(&r, FG_FP32, 1, sn, 2, 0.01, 1),
              *w = fgt_rand(&r, FG_FP32, 1, sn, 1, 0.01, 0);
    fg_tensor *y, *yw, *l, *d, *yr, *ywr, *lr;
    FGT_OK(fg_dropout_add(x, b, c.p, c.seed, c.offset, &y));
    FGT_OK(fg_mul(y, w, &yw)); /* a random incoming gradient */
    FGT_OK(fg_sum(yw, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    double *gx = fgt_host(fg_tensor_grad(x)), *gb = fgt_host(fg_tensor_grad(b));
    FGT_OK(fg_tensor_zero_grad(x));
    FGT_OK(fg_tensor_zero_grad(b));
    FGT_OK(fg_dropout(b, c.p, c.seed, c.offset, &d));
    FGT_OK(fg_add(x, d, &yr));
    FGT_OK(fg_mul(yr, w, &ywr));
    FGT_OK(fg_sum(ywr, NULL, 0, 0, &lr));
    FGT_OK(fg_backward(lr));
    const float *py = fg_tensor_data(y), *pr = fg_tensor_data(yr),
                *px = fg_tensor_data(x), *pb = fg_tensor_data(b),
                *pw = fg_tensor_data(w),
                *rx = fg_tensor_data(fg_tensor_grad(x)),
                *rb = fg_tensor_data(fg_tensor_grad(b));
    const double keep = 1.0 / (1.0 - c.p);
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; i++) {
        ck_assert_msg(py[i] == pr[i], "y[%lld] %.9g, chain %.9g", (long long)i,
                      py[i], pr[i]);
        ck_assert(gx[i] == rx[i] && gx[i] == pw[i]);
        ck_assert(gb[i] == rb[i]);
        const double v = (double)py[i] - px[i];
        ck_assert(gb[i] == 0 ? v == 0 : fabs(v - pb[i] * keep) <= 1e-6 * (2 + fabs(px[i])));
        dropped += gb[i] == 0;
    }
    ck_assert(c.p == 0 ? dropped == 0 : dropped > 0 && dropped < n);
    fg_tensor *bad = NULL, *x2, *x64;
    FGT_FAILS(fg_dropout_add(x, b, 1.0, 0, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_dropout_add(x, NULL, 0.1, 0, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_dropout_add(x, b, 0.1, 0, 0, NULL), FG_ERR_INVALID_ARGUMENT);
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(n + 1), &x2));
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(n), &x64));
    FGT_FAILS(fg_dropout_add(x2, b, 0.1, 0, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_dropout_add(x64, b, 0.1, 0, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    ck_assert(bad == NULL);
    free(gx);
    free(gb);
    fg_tensor *all[] = {x, b, w, y, yw, l, d, yr, ywr, lr, x2, x64};
    fgt_free_all(all, 12);
}
END_TEST

/* h + y of fg_dropout_add_layernorm (x, b, weight, bias), so both outputs
 * carry a gradient. */
static fg_status dal_fn(fg_tensor *const *in, int n, fg_tensor **out, void *u)
{
    const nn_ctx *c = u;
    (void)n;
    fg_tensor *y = NULL, *h = NULL;
    FGT_TRY(fg_dropout_add_layernorm(in[0], in[1], c->p, c->seed, c->offset,
                                     in[2], in[3], 1e-5, FG_FP64, &y, &h));
    fg_status s = fg_add(h, y, out);
    fg_tensor_free(y);
    fg_tensor_free(h);
    return s;
}

/* fg_dropout_add_layernorm on the CPU (the two ops in turn): fp64
 * gradcheck through both outputs, the outputs equal to the chain's bit for
 * bit, and bad arguments rejected with the ops' messages (the CUDA
 * kernels: tests/test_gpu_layernorm.c). */
START_TEST(test_dropout_add_layernorm)
{
    fgt_rng r = fgt_rng_for(0xda1 + (uint64_t)_i);
    const int64_t C = 3 + _i, s[2] = {4, C};
    nn_ctx c = {.p = _i == 0 ? 0.0 : 0.3, .seed = fgt_next(&r),
                .offset = fgt_next(&r) % 1000};
    fg_tensor *in[4] = {fgt_rand(&r, FG_FP64, 2, s, 1, 0.01, 1),
                        fgt_rand(&r, FG_FP64, 2, s, 1, 0.01, 1),
                        fgt_rand(&r, FG_FP64, 1, &C, 1, 0.5, 1),
                        fgt_rand(&r, FG_FP64, 1, &C, 1, 0.01, 1)};
    fgt_gradcheck("dropout_add_layernorm", dal_fn, &c, in, 4, 0);
    fg_tensor *y = NULL, *h = NULL, *yr = NULL, *hr = NULL, *bad = NULL;
    FGT_OK(fg_dropout_add_layernorm(in[0], in[1], c.p, c.seed, c.offset,
                                    in[2], in[3], 1e-5, FG_FP64, &y, &h));
    FGT_OK(fg_dropout_add(in[0], in[1], c.p, c.seed, c.offset, &yr));
    FGT_OK(fg_layernorm_cast(yr, in[2], in[3], 1e-5, FG_FP64, &hr));
    same_bits("y", y, yr);
    same_bits("h", h, hr);
    FGT_FAILS(fg_dropout_add_layernorm(in[0], in[1], 1.0, 0, 0, in[2], in[3],
                                       1e-5, FG_FP64, &bad, &bad),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_dropout_add_layernorm(in[0], in[1], 0.1, 0, 0, in[2], in[3],
                                       0.0, FG_FP64, &bad, &bad),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_dropout_add_layernorm(in[0], in[1], 0.1, 0, 0, in[1], in[3],
                                       1e-5, FG_FP64, &bad, &bad),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_dropout_add_layernorm(in[0], in[1], 0.1, 0, 0, in[2], in[3],
                                       1e-5, FG_FP64, &bad, NULL),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_dropout_add_layernorm(in[0], in[1], 0.1, 0, 0, in[2], in[3],
                                       1e-5, FG_BF16, &bad, &bad),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert(bad == NULL);
    fg_tensor *all[] = {y, h, yr, hr};
    fgt_free_all(all, 4);
    fgt_free_all(in, 4);
}
END_TEST

/* ---- attention ------------------------------------------------------------- */

/* in: q, k, v  or (fused) one qkv [B, N, (H + 2 Hk) d] split into views */
static fg_status attention_fn(fg_tensor *const *in, int n, fg_tensor **out,
                              void *u)
{
    const nn_ctx *c = u;
    if (!c->fused)
        return fg_attention(in[0], in[1], in[2], &c->ao, out);
    const int64_t B = fg_tensor_size(in[0], 0), N = fg_tensor_size(in[0], 1);
    const int64_t sizes[3] = {c->H * c->d, c->Hk * c->d, c->Hk * c->d};
    fg_tensor *p[3], *q = NULL, *k = NULL, *v = NULL;
    FGT_TRY(fg_split(in[0], 2, sizes, 3, p));
    fg_status s = fg_reshape(p[0], FG_SHAPE(B, N, c->H, c->d), &q);
    if (s == FG_OK)
        s = fg_reshape(p[1], FG_SHAPE(B, N, c->Hk, c->d), &k);
    if (s == FG_OK)
        s = fg_reshape(p[2], FG_SHAPE(B, N, c->Hk, c->d), &v);
    /* views of the fused buffer, not copies */
    if (s == FG_OK && (!fg_tensor_shares_storage(q, in[0]) ||
                       !fg_tensor_shares_storage(v, in[0])))
        s = FG_ERR_INTERNAL;
    if (s == FG_OK)
        s = fg_attention(q, k, v, &c->ao, out);
    fgt_free_all(p, 3);
    fg_tensor_free(q);
    fg_tensor_free(k);
    fg_tensor_free(v);
    return s;
}

START_TEST(test_attention_grad)
{
    fgt_rng r = fgt_rng_for(550 + (uint64_t)_i);
    static const float slopes[4] = {0.25f, 0.5f, 0.125f, 0.75f};
    /* 0-3: plain/causal, dropout, fused QKV; 4-5: window, top-left,
     * softcap and ALiBi through the op's options (5 with dropout, fused);
     * 6: key padding; 7: a packed batch of 3 sequences (0-4 tokens each,
     * one tail row) with key padding and dropout */
    for (int variant = 0; variant < 8; variant++) {
        nn_ctx c = {0};
        fg_attention_options_init(&c.ao);
        int64_t B = fgt_int(&r, 1, 2), Nq = fgt_int(&r, 1, 6),
                Nk = fgt_int(&r, 1, 6);
        int32_t cq[4] = {0}, ck[4] = {0}, used[3];
        if (variant == 6) {
            for (int64_t b = 0; b < B; b++)
                used[b] = (int32_t)fgt_int(&r, 0, Nk);
            c.ao.seqused_k = used;
        }
        if (variant == 7) {
            for (int s = 0; s < 3; s++) {
                cq[s + 1] = cq[s] + (int32_t)fgt_int(&r, 0, 4);
                ck[s + 1] = ck[s] + (int32_t)fgt_int(&r, 0, 4);
                used[s] = (int32_t)fgt_int(&r, 0, ck[s + 1] - ck[s]);
            }
            B = 1;
            Nq = cq[3] + 1;
            Nk = ck[3] + 1;
            c.ao.cu_seqlens_q = cq;
            c.ao.cu_seqlens_k = ck;
            c.ao.n_seq = 3;
            c.ao.seqused_k = used;
        }
        c.Hk = (int)fgt_int(&r, 1, 2);
        c.H = c.Hk * (int)fgt_int(&r, 1, 2); /* GQA when H > Hk */
        c.d = 8;
        c.ao.causal = variant & 1;
        c.ao.block_q = (int)fgt_int(&r, 1, 4); /* several tiles */
        c.ao.block_k = (int)fgt_int(&r, 1, 4);
        if (variant >= 2 && variant != 6) {
            c.ao.dropout_p = 0.2;
            c.ao.seed = fgt_next(&r);
            c.ao.offset = fgt_next(&r) % 100;
        }
        if (variant == 4 || variant == 5) {
            c.ao.window_left = fgt_int(&r, 0, 3);
            c.ao.window_right = fgt_int(&r, -1, 2);
            c.ao.causal_align = FG_ATTN_ALIGN_TOP_LEFT;
            c.ao.softcap = 1.5;
            c.ao.alibi_slopes = slopes;
        }
        c.fused = variant == 3 || variant == 5;
        fg_tensor *in[3] = {NULL, NULL, NULL};
        int n_in = 3;
        if (c.fused) {
            n_in = 1;
            in[0] = fgt_rand(&r, FG_FP64,
                             FG_SHAPE(B, Nq, (c.H + 2 * c.Hk) * c.d), 1.5, 0,
                             1);
        } else {
            in[0] = fgt_rand(&r, FG_FP64, FG_SHAPE(B, Nq, c.H, c.d), 1.5, 0, 1);
            in[1] = fgt_rand(&r, FG_FP64, FG_SHAPE(B, Nk, c.Hk, c.d), 1.5, 0, 1);
            in[2] = fgt_rand(&r, FG_FP64, FG_SHAPE(B, Nk, c.Hk, c.d), 1, 0, 1);
        }
        char what[96];
        snprintf(what, sizeof what,
                 "attention causal %d p %g H %d Hk %d fused %d (case %d)",
                 c.ao.causal, c.ao.dropout_p, c.H, c.Hk, c.fused, _i);
        fgt_gradcheck(what, attention_fn, &c, in, n_in, 0);
        fgt_free_all(in, n_in);
    }
}
END_TEST

/* The op equals the raw API bit for bit, and its node holds no N^2 bytes. */
START_TEST(test_attention_memory)
{
    fgt_rng r = fgt_rng_for(560);
    enum { B = 1, N = 256, H = 2, D = 8 };
    fg_tensor *q = fgt_rand(&r, FG_FP32, FG_SHAPE(B, N, H, D), 1, 0, 1);
    fg_tensor *k = fgt_rand(&r, FG_FP32, FG_SHAPE(B, N, H, D), 1, 0, 1);
    fg_tensor *v = fgt_rand(&r, FG_FP32, FG_SHAPE(B, N, H, D), 1, 0, 1);
    fg_tensor *g = fgt_rand(&r, FG_FP32, FG_SHAPE(B, N, H, D), 1, 0, 0);
    fg_attention_options o;
    fg_attention_options_init(&o);
    o.causal = 1;
    o.dropout_p = 0.1;
    o.seed = 1234;
    o.offset = 7;
    fg_tensor *out;
    FGT_OK(fg_attention(q, k, v, &o, &out));
    fg_node *n = fg_tensor_grad_fn(out);
    ck_assert_str_eq(fg_node_name(n), "AttentionBackward");
    const size_t es = 4, qkvo = (size_t)B * N * H * D * es,
                 stats = (size_t)B * H * N * es;
    /* the extra: the parameters and a copy of the block-mask struct */
    const size_t expect = 4 * qkvo + 2 * stats + sizeof(fg_attn_params) +
                          sizeof(fg_attn_block_mask);
    ck_assert_uint_eq(fg_node_saved_bytes(n), expect);
    ck_assert_uint_lt(fg_node_saved_bytes(n), (size_t)N * N * es);
    FGT_OK(fg_backward_with(out, g));

    /* Reference: the raw API on the same buffers. */
    const size_t ne = (size_t)B * N * H * D;
    float *o2 = malloc(ne * 4), *m = malloc(stats), *l = malloc(stats),
          *dq = malloc(ne * 4), *dk = malloc(ne * 4), *dv = malloc(ne * 4);
    fgt_poison_f(o2, ne); /* every element must be written */
    fgt_poison_f(dq, ne);
    fgt_poison_f(dk, ne);
    fgt_poison_f(dv, ne);
    fg_attn_params p;
    fg_attn_params_init(&p, B, N, N, H, H, D);
    p.causal = 1;
    p.dropout_p = 0.1;
    p.seed = 1234;
    p.offset = 7;
    fg_attn_tensor tq = fg_attn_bshd(fg_tensor_data(q), FG_FP32, N, H, D),
                   tk = fg_attn_bshd(fg_tensor_data(k), FG_FP32, N, H, D),
                   tv = fg_attn_bshd(fg_tensor_data(v), FG_FP32, N, H, D),
                   to = fg_attn_bshd(o2, FG_FP32, N, H, D),
                   tg = fg_attn_bshd(fg_tensor_data(g), FG_FP32, N, H, D),
                   tdq = fg_attn_bshd(dq, FG_FP32, N, H, D),
                   tdk = fg_attn_bshd(dk, FG_FP32, N, H, D),
                   tdv = fg_attn_bshd(dv, FG_FP32, N, H, D);
    fg_attn_stats st = {m, l, FG_FP32};
    FGT_OK(fg_attention_forward(&p, &tq, &tk, &tv, &to, &st));
    FGT_OK(fg_attention_backward(&p, &tq, &tk, &tv, &to, &tg, &st, &tdq, &tdk,
                                 &tdv));
    ck_assert(memcmp(o2, fg_tensor_data(out), ne * 4) == 0);
    ck_assert(memcmp(dq, fg_tensor_data(fg_tensor_grad(q)), ne * 4) == 0);
    ck_assert(memcmp(dk, fg_tensor_data(fg_tensor_grad(k)), ne * 4) == 0);
    ck_assert(memcmp(dv, fg_tensor_data(fg_tensor_grad(v)), ne * 4) == 0);
    free(o2); free(m); free(l); free(dq); free(dk); free(dv);

    /* Errors come from the kernel's validation, before anything is made. */
    fg_tensor *q7, *bad;
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(1, 4, 1, 7), &q7));
    FGT_FAILS(fg_attention(q7, q7, q7, NULL, &bad), FG_ERR_UNSUPPORTED);
    FGT_FAILS(fg_attention(q, k, q7, NULL, &bad), FG_ERR_INVALID_ARGUMENT);
    o.dropout_p = 1.0;
    FGT_FAILS(fg_attention(q, k, v, &o, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {q, k, v, g, out, q7};
    fgt_free_all(all, 6);
}
END_TEST

FGT_MAIN_BEGIN("ops_nn")
FGT_LOOP(test_softmax_grad, LOOPS)
FGT_TEST(test_softmax_values)
FGT_LOOP(test_layernorm_grad, LOOPS)
FGT_TEST(test_layernorm_values)
FGT_TEST(test_layernorm_cast)
FGT_LOOP(test_embedding, LOOPS)
FGT_LOOP(test_cross_entropy, LOOPS)
FGT_LOOP(test_dropout, LOOPS)
FGT_LOOP(test_dropout_add, LOOPS)
FGT_LOOP(test_dropout_add_layernorm, 3)
FGT_LOOP(test_attention_grad, LOOPS)
FGT_TEST(test_attention_memory)
FGT_MAIN_END()
