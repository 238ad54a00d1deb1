/* SPDX-License-Identifier: MIT */
/* tests/test_attention_qkv.c - fg_attention_qkvpacked (issue 22): its
 * output and d(qkv) equal fg_split + fg_reshape + fg_attention bit for bit
 * in fp32 and fp64 (plain, causal with dropout, a window with softcap and
 * ALiBi, key padding, a packed batch with dropout, a bias, rows padded,
 * strided columns), computed in an arena filled with NaN first so every
 * element must be written; in fp64 without dropout both also match the
 * naive reference; an fp64 gradcheck of the op; its argument errors; and
 * the GPT's attention layer, which now runs it, equal bit for bit to the
 * split composition it replaced (output and every gradient). */
#include <math.h>
#include <string.h>

#include "naive_attention.h"
#include "test_ops_util.h"

#define LOOPS 3
#define N_VARIANTS 8

typedef struct qkv_case {
    fg_attention_options ao;
    int64_t B, N, H, d;
    int32_t cu[4], used[3];
    float slopes[3];
    int bias;   /* a [H, N, N] bias that requires grad */
    int layout; /* qkv: 0 contiguous; 1 rows padded (narrow of [B, N, 3C +
                   5] at column 3); 2 columns strided (transpose of
                   [B, 3C, N]: the op copies it) */
} qkv_case;

/* Variant v (N <= max_n, but up to 13 rows in 4): 0 plain; 1 causal,
 * dropout; 2 causal, window, softcap, ALiBi; 3 key padding; 4 a packed
 * batch of 3 sequences (0-4 tokens, one tail row), key padding, dropout;
 * 5 a bias; 6 rows padded, causal, dropout; 7 strided columns, a
 * two-sided window. */
static void make_case(int v, int max_n, fgt_rng *r, qkv_case *c)
{
    memset(c, 0, sizeof *c);
    fg_attention_options_init(&c->ao);
    c->B = fgt_int(r, 1, 2);
    c->N = fgt_int(r, 1, max_n);
    c->H = fgt_int(r, 1, 3);
    c->d = 8;
    c->ao.block_q = (int)fgt_int(r, 1, 4); /* several tiles */
    c->ao.block_k = (int)fgt_int(r, 1, 4);
    c->ao.causal = v == 1 || v == 2 || v == 6;
    if (v == 1 || v == 4 || v == 6) {
        c->ao.dropout_p = 0.2;
        c->ao.seed = fgt_next(r);
        c->ao.offset = fgt_next(r) % 100;
    }
    if (v == 2 || v == 7) {
        c->ao.window_left = fgt_int(r, 0, 3);
        c->ao.window_right = v == 7 ? fgt_int(r, 0, 2) : -1;
    }
    if (v == 2) {
        c->ao.softcap = 1.5;
        for (int h = 0; h < 3; h++)
            c->slopes[h] = 0.125f * (float)(h + 1);
        c->ao.alibi_slopes = c->slopes;
    }
    if (v == 3) {
        for (int64_t b = 0; b < c->B; b++)
            c->used[b] = (int32_t)fgt_int(r, 0, c->N);
        c->ao.seqused_k = c->used;
    }
    if (v == 4) {
        for (int s = 0; s < 3; s++) {
            c->cu[s + 1] = c->cu[s] + (int32_t)fgt_int(r, 0, 4);
            c->used[s] = (int32_t)fgt_int(r, 0, c->cu[s + 1] - c->cu[s]);
        }
        c->B = 1;
        c->N = c->cu[3] + 1;
        c->ao.cu_seqlens_q = c->ao.cu_seqlens_k = c->cu;
        c->ao.n_seq = 3;
        c->ao.seqused_k = c->used;
    }
    c->bias = v == 5;
    c->layout = v == 6 ? 1 : v == 7 ? 2 : 0;
}

static int64_t cols(const qkv_case *c) { return 3 * c->H * c->d; }

/* The shape of the tensor qkv is a view of. */
static void src_shape(const qkv_case *c, int64_t s[3])
{
    s[0] = c->B;
    s[1] = c->layout == 2 ? cols(c) : c->N;
    s[2] = c->layout == 2 ? c->N : c->layout == 1 ? cols(c) + 5 : cols(c);
}

/* Index in the source of qkv[b, n, col]. */
static int64_t src_index(const qkv_case *c, int64_t b, int64_t n, int64_t col)
{
    int64_t s[3];
    src_shape(c, s);
    if (c->layout == 2)
        return (b * s[1] + col) * s[2] + n;
    return (b * s[1] + n) * s[2] + (c->layout == 1 ? 3 : 0) + col;
}

static fg_tensor *leaf(fg_dtype dt, int nd, const int64_t *shape,
                       const double *h)
{
    fg_tensor *t = NULL;
    FGT_OK(fg_tensor_zeros(dt, FG_DEVICE_CPU, nd, shape, &t));
    FGT_OK(fg_tensor_copy_from_host(t, FG_FP64, h, fg_tensor_numel(t)));
    FGT_OK(fg_tensor_set_requires_grad(t, 1));
    return t;
}

/* qkv as the case's view of src (a new reference). */
static fg_status qkv_view(const qkv_case *c, fg_tensor *src, fg_tensor **qkv)
{
    if (c->layout == 1)
        return fg_narrow(src, 2, 3, cols(c), qkv);
    if (c->layout == 2)
        return fg_transpose(src, 1, 2, qkv);
    *qkv = fg_tensor_retain(src);
    return FG_OK;
}

/* The composition fg_attention_qkvpacked replaces: [B, N, H, d] out. */
static fg_status split_attention(const qkv_case *c, fg_tensor *qkv,
                                 const fg_attention_options *ao,
                                 fg_tensor **out)
{
    const int64_t C = c->H * c->d, sizes[3] = {C, C, C};
    fg_tensor *p[3] = {NULL}, *v[3] = {NULL};
    fg_status s = fg_split(qkv, -1, sizes, 3, p);
    for (int j = 0; j < 3 && s == FG_OK; j++)
        s = fg_reshape(p[j], FG_SHAPE(c->B, c->N, c->H, c->d), &v[j]);
    if (s == FG_OK)
        s = fg_attention(v[0], v[1], v[2], ao, out);
    fgt_free_all(p, 3);
    fgt_free_all(v, 3);
    return s;
}

typedef struct qkv_result {
    double *o, *g_src, *g_bias;
} qkv_result;

/* One path forward and backward (upstream gradient h_g) from fresh
 * leaves holding h_src (and h_bias); the results as host doubles. */
static void run_path_grads(const qkv_case *c, fg_dtype dt, int packed,
                           int src_grad, const double *h_src,
                           const double *h_g, const double *h_bias,
                           qkv_result *res)
{
    int64_t ss[3];
    src_shape(c, ss);
    const int64_t C = c->H * c->d;
    fg_tensor *src = leaf(dt, 3, ss, h_src), *qkv = NULL, *o = NULL,
              *g = NULL,
              *bias = c->bias ? leaf(dt, FG_SHAPE(c->H, c->N, c->N), h_bias)
                              : NULL;
    if (!src_grad)
        FGT_OK(fg_tensor_set_requires_grad(src, 0));
    FGT_OK(qkv_view(c, src, &qkv));
    fg_attention_options ao = c->ao;
    ao.bias = bias;
    if (packed) {
        FGT_OK(fg_attention_qkvpacked(qkv, c->H, &ao, &o));
        const fg_node *n = fg_tensor_grad_fn(o);
        ck_assert_str_eq(fg_node_name(n), "AttentionQKVPackedBackward");
        ck_assert_int_eq(fg_node_num_inputs(n), c->bias ? 2 : 1);
        ck_assert_int_eq(fg_tensor_ndim(o), 3);
        ck_assert(fg_tensor_size(o, 2) == C && fg_tensor_is_contiguous(o));
    } else {
        FGT_OK(split_attention(c, qkv, &ao, &o));
    }
    /* the same row-major values for [B, N, C] and [B, N, H, d] */
    FGT_OK(fg_tensor_zeros(dt, FG_DEVICE_CPU, fg_tensor_ndim(o),
                           fg_tensor_shape(o), &g));
    FGT_OK(fg_tensor_copy_from_host(g, FG_FP64, h_g, fg_tensor_numel(g)));
    FGT_OK(fg_backward_with(o, g));
    res->o = fgt_host(o);
    ck_assert(src_grad || fg_tensor_grad(src) == NULL);
    res->g_src = src_grad ? fgt_host(fg_tensor_grad(src)) : NULL;
    res->g_bias = bias ? fgt_host(fg_tensor_grad(bias)) : NULL;
    fg_tensor *all[] = {src, qkv, o, g, bias};
    fgt_free_all(all, 5);
}

static void run_path(const qkv_case *c, fg_dtype dt, int packed,
                     const double *h_src, const double *h_g,
                     const double *h_bias, qkv_result *res)
{
    run_path_grads(c, dt, packed, 1, h_src, h_g, h_bias, res);
}

/* An arena whose (one) chunk was filled with NaN: what the op allocates
 * from it starts as NaN, so an element it forgets to write shows. */
#define POISON_BYTES ((size_t)1 << 21)
static fg_arena *poisoned_arena(void)
{
    fg_arena *a = NULL;
    fg_tensor *t = NULL;
    FGT_OK(fg_arena_create(POISON_BYTES, &a));
    FGT_OK(fg_arena_push(a));
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU,
                          FG_SHAPE((int64_t)(POISON_BYTES - 4096) / 8), NAN,
                          &t));
    fg_tensor_free(t);
    FGT_OK(fg_arena_pop(a));
    FGT_OK(fg_arena_reset(a));
    return a;
}

static void expect_same(const char *what, const double *a, const double *b,
                        int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(a[i] == b[i] && signbit(a[i]) == signbit(b[i]),
                      "%s[%lld]: packed %.17g, split %.17g", what,
                      (long long)i, a[i], b[i]);
}

static double *host_values(fgt_rng *r, int64_t n, double amp)
{
    double *h = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const double v = amp * fgt_uniform(r);
        h[i] = fabs(v) < 1e-3 ? 1e-3 + fabs(v) : v; /* never zero */
    }
    return h;
}

/* fp64, no dropout, dense rows: O and d(qkv) against the naive fp64
 * reference (q, k, v de-interleaved from the source). */
static void check_naive(const qkv_case *c, const double *h_src,
                        const double *h_g, const double *h_bias,
                        const qkv_result *res)
{
    const int64_t B = c->B, N = c->N, H = c->H, d = c->d, C = H * d,
                  ne = B * N * C;
    double *in = malloc(sizeof(double) * (size_t)(3 * ne)),
           *grad = malloc(sizeof(double) * (size_t)(3 * ne)),
           *o = malloc(sizeof(double) * (size_t)ne),
           *st = malloc(sizeof(double) * (size_t)(2 * B * H * N));
    for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < 3 * C; j++)
                in[(j / C) * ne + (b * N + n) * C + j % C] =
                    h_src[src_index(c, b, n, j)];
    naive_shape s;
    memset(&s, 0, sizeof s);
    s.B = B;
    s.Nq = s.Nk = N;
    s.H = s.Hk = H;
    s.d = d;
    s.scale = 1.0 / sqrt((double)d);
    s.causal = c->ao.causal;
    s.window = c->ao.window_left >= 0 || c->ao.window_right >= 0;
    s.window_left = c->ao.window_left;
    s.window_right = c->ao.window_right;
    s.softcap = c->ao.softcap;
    s.alibi = c->ao.alibi_slopes;
    s.seqused_k = c->ao.seqused_k;
    if (c->bias) {
        s.bias = h_bias;
        s.bias_sh = N * N;
        s.bias_sq = N;
        s.bias_sk = 1;
    }
    naive_attention_forward(&s, in, in + ne, in + 2 * ne, o, st,
                            st + B * H * N);
    naive_attention_backward(&s, in, in + ne, in + 2 * ne, h_g, grad,
                             grad + ne, grad + 2 * ne);
    double *got = malloc(sizeof(double) * (size_t)(3 * ne));
    for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < 3 * C; j++)
                got[(j / C) * ne + (b * N + n) * C + j % C] =
                    res->g_src[src_index(c, b, n, j)];
    const double eo = fgt_rel_err_floor(res->o, o, (size_t)ne, 1e-3),
                 eg = fgt_rel_err_floor(got, grad, (size_t)(3 * ne), 1e-3);
    ck_assert_msg(eo <= 1e-12 && eg <= 1e-12,
                  "naive reference: O error %g, d(qkv) error %g", eo, eg);
    free(in);
    free(grad);
    free(o);
    free(st);
    free(got);
}

START_TEST(test_qkvpacked_equals_split)
{
    fgt_rng r = fgt_rng_for(0x9c0 + (uint64_t)_i);
    static const fg_dtype dts[2] = {FG_FP32, FG_FP64};
    for (int v = 0; v < N_VARIANTS; v++)
        for (int t = 0; t < 2; t++) {
            qkv_case c;
            make_case(v, 9, &r, &c);
            int64_t ss[3];
            src_shape(&c, ss);
            const int64_t n_src = ss[0] * ss[1] * ss[2],
                          n_o = c.B * c.N * c.H * c.d, n_b = c.H * c.N * c.N;
            double *h_src = host_values(&r, n_src, 1.5),
                   *h_g = host_values(&r, n_o, 1.0),
                   *h_bias = host_values(&r, n_b, 0.5);
            qkv_result p, s;
            fg_arena *a = poisoned_arena();
            FGT_OK(fg_arena_push(a));
            run_path(&c, dts[t], 1, h_src, h_g, h_bias, &p);
            FGT_OK(fg_arena_pop(a));
            fg_arena_stats st;
            FGT_OK(fg_arena_get_stats(a, &st));
            ck_assert_msg(st.chunk_allocs == 1, "left the poisoned chunk");
            fg_arena_free(a);
            run_path(&c, dts[t], 0, h_src, h_g, h_bias, &s);
            expect_same("O", p.o, s.o, n_o);
            expect_same("d(src)", p.g_src, s.g_src, n_src);
            if (c.bias)
                expect_same("dbias", p.g_bias, s.g_bias, n_b);
            for (int64_t i = 0; i < n_src && c.layout == 1; i++) {
                const int64_t col = i % ss[2]; /* padding: no gradient */
                if (col < 3 || col >= 3 + cols(&c))
                    ck_assert(p.g_src[i] == 0);
            }
            if (dts[t] == FG_FP64 && c.ao.dropout_p == 0 && !c.ao.cu_seqlens_q)
                check_naive(&c, h_src, h_g, h_bias, &p);
            free(p.o); free(p.g_src); free(p.g_bias);
            free(s.o); free(s.g_src); free(s.g_bias);
            free(h_src); free(h_g); free(h_bias);
        }
}
END_TEST

/* A bias that needs a gradient on a qkv that does not: the packed
 * backward still runs (dbias needs dS) and must match the split path.
 * (Its d(qkv) was once shaped from input 0's edge, which such a qkv
 * does not have: a crash.) */
START_TEST(test_qkvpacked_bias_grad_only)
{
    fgt_rng r = fgt_rng_for(0x9d0 + (uint64_t)_i);
    int ran = 0;
    for (int v = 0; v < N_VARIANTS; v++) {
        qkv_case c;
        make_case(v, 9, &r, &c);
        if (!c.bias)
            continue;
        int64_t ss[3];
        src_shape(&c, ss);
        const int64_t n_src = ss[0] * ss[1] * ss[2],
                      n_o = c.B * c.N * c.H * c.d, n_b = c.H * c.N * c.N;
        double *h_src = host_values(&r, n_src, 1.5),
               *h_g = host_values(&r, n_o, 1.0),
               *h_bias = host_values(&r, n_b, 0.5);
        qkv_result p, s, full;
        run_path_grads(&c, FG_FP64, 1, 0, h_src, h_g, h_bias, &p);
        run_path_grads(&c, FG_FP64, 0, 0, h_src, h_g, h_bias, &s);
        run_path(&c, FG_FP64, 1, h_src, h_g, h_bias, &full);
        expect_same("O", p.o, s.o, n_o);
        expect_same("dbias", p.g_bias, s.g_bias, n_b);
        expect_same("dbias vs qkv with a gradient", p.g_bias, full.g_bias,
                    n_b);
        free(p.o); free(p.g_bias);
        free(s.o); free(s.g_bias);
        free(full.o); free(full.g_src); free(full.g_bias);
        free(h_src); free(h_g); free(h_bias);
        ran++;
    }
    ck_assert_msg(ran > 0, "no variant with a bias");
}
END_TEST

typedef struct gc_ctx {
    const qkv_case *c;
} gc_ctx;

static fg_status packed_fn(fg_tensor *const *in, int n, fg_tensor **out,
                           void *u)
{
    const qkv_case *c = ((const gc_ctx *)u)->c;
    fg_attention_options ao = c->ao;
    ao.bias = n > 1 ? in[1] : NULL;
    fg_tensor *qkv = NULL;
    FGT_TRY(qkv_view(c, in[0], &qkv));
    fg_status s = fg_attention_qkvpacked(qkv, c->H, &ao, out);
    fg_tensor_free(qkv);
    return s;
}

START_TEST(test_qkvpacked_gradcheck)
{
    fgt_rng r = fgt_rng_for(0x9d0 + (uint64_t)_i);
    for (int v = 0; v < N_VARIANTS; v++) {
        qkv_case c;
        make_case(v, 6, &r, &c);
        int64_t ss[3];
        src_shape(&c, ss);
        fg_tensor *in[2] = {fgt_rand(&r, FG_FP64, 3, ss, 1.5, 0.01, 1),
                            c.bias ? fgt_rand(&r, FG_FP64,
                                              FG_SHAPE(c.H, c.N, c.N), 0.5,
                                              0.01, 1)
                                   : NULL};
        gc_ctx g = {&c};
        char what[64];
        snprintf(what, sizeof what, "qkvpacked variant %d (case %d)", v, _i);
        fgt_gradcheck(what, packed_fn, &g, in, c.bias ? 2 : 1, 0);
        fgt_free_all(in, 2);
    }
}
END_TEST

START_TEST(test_qkvpacked_errors)
{
    fg_tensor *qkv, *x4, *odd, *b2, *d7, *lowp = NULL, *bias, *out = NULL;
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(1, 4, 48), &qkv));
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(1, 4, 21), &d7));
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(1, 4, 3, 16), &x4));
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(1, 4, 16), &odd));
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, 4, 48), &b2));
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(3, 4, 4), &bias));
    fg_attention_options o;
    fg_attention_options_init(&o);
    FGT_FAILS(fg_attention_qkvpacked(NULL, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, NULL), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_attention_qkvpacked(x4, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_attention_qkvpacked(qkv, 0, &o, &out), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_attention_qkvpacked(qkv, -2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_attention_qkvpacked(qkv, 5, &o, &out), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_attention_qkvpacked(qkv, 17, &o, &out), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_attention_qkvpacked(odd, 1, &o, &out), FG_ERR_INVALID_ARGUMENT);
    /* head_dim 7: refused by the attention's own validation */
    FGT_FAILS(fg_attention_qkvpacked(d7, 1, &o, &out), FG_ERR_UNSUPPORTED);
    const int32_t cu[2] = {0, 4};
    o.cu_seqlens_q = o.cu_seqlens_k = cu;
    o.n_seq = 1;
    FGT_FAILS(fg_attention_qkvpacked(b2, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    {
        /* Bad offset values, refused by the attention's validation of the
         * op's own host copies (the device arrays are never read back):
         * decreasing, past the packed rows, and a key count past the
         * sequence's keys. */
        const int32_t down[3] = {0, 3, 2}, past[2] = {0, 9}, used[1] = {5};
        o.cu_seqlens_q = o.cu_seqlens_k = down;
        o.n_seq = 2;
        FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_nonnull(strstr(fg_last_error(), "cu_seqlens_q"));
        o.cu_seqlens_q = o.cu_seqlens_k = past;
        o.n_seq = 1;
        FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_nonnull(strstr(fg_last_error(), "cu_seqlens_q"));
        o.cu_seqlens_q = o.cu_seqlens_k = cu;
        o.seqused_k = used;
        FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_nonnull(strstr(fg_last_error(), "seqused_k"));
        o.seqused_k = NULL;
    }
    /* cu_seqlens_q without cu_seqlens_k (and the reverse, and n_seq 0):
     * refused before either array is read (once a crash) */
    o.cu_seqlens_k = NULL;
    FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    o.cu_seqlens_q = NULL;
    o.cu_seqlens_k = cu;
    FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    o.cu_seqlens_q = cu;
    o.n_seq = 0;
    FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    {
        fg_tensor *q4 = NULL;
        FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(1, 4, 2, 8), &q4));
        o.n_seq = 1;
        o.cu_seqlens_k = NULL;
        FGT_FAILS(fg_attention(q4, q4, q4, &o, &out), FG_ERR_INVALID_ARGUMENT);
        fg_tensor_free(q4);
    }
    fg_attention_options_init(&o);
    o.dropout_p = 1.0;
    FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    fg_attention_options_init(&o);
    o.bias = bias; /* 3 heads where there are 2 */
    FGT_FAILS(fg_attention_qkvpacked(qkv, 2, &o, &out), FG_ERR_INVALID_ARGUMENT);
    if (fg_tensor_zeros(FG_BF16, FG_DEVICE_CPU, FG_SHAPE(1, 4, 48), &lowp) ==
        FG_OK)
        FGT_FAILS(fg_attention_qkvpacked(lowp, 2, NULL, &out),
                  FG_ERR_UNSUPPORTED);
    ck_assert(out == NULL); /* untouched by every failure */
    FGT_OK(fg_attention_qkvpacked(qkv, 2, NULL, &out));
    fg_tensor *all[] = {qkv, x4, odd, b2, d7, lowp, bias, out};
    fgt_free_all(all, 8);
}
END_TEST

/* ---- the GPT's attention layer -------------------------------------------- */

/* What fg_nn_attention_forward computed before it used the packed op:
 * qkv projection, fg_split, reshapes, fg_attention, projection, output
 * dropout, with the layer's options and draws from mode->rng. */
static fg_status layer_by_split(const fg_nn_attention *a, fg_tensor *x,
                                const fg_nn_mode *mode, fg_tensor **y)
{
    const int64_t B = fg_tensor_size(x, 0), T = fg_tensor_size(x, 1),
                  C = fg_tensor_size(x, 2), H = a->n_head, d = C / H;
    const fg_nn_seqs *sq = mode->seqs;
    const int packed = sq && sq->cu_seqlens;
    fg_attention_options ao;
    fg_attention_options_init(&ao);
    ao.causal = 1;
    if (packed) {
        ao.cu_seqlens_q = ao.cu_seqlens_k = sq->cu_seqlens;
        ao.n_seq = sq->n_seq;
    } else if (sq) {
        ao.seqused_k = sq->lengths;
    }
    if (a->window > 0)
        ao.window_left = a->window;
    ao.softcap = a->softcap;
    ao.alibi_slopes = a->alibi_slopes;
    if (a->dropout > 0 && mode->training) {
        ao.dropout_p = a->dropout;
        FGT_TRY(fg_generator_next(mode->rng, &ao.seed, &ao.offset));
    }
    const int64_t sizes[3] = {C, C, C}, Bq = packed ? 1 : B,
                  Tq = packed ? B * T : T;
    fg_tensor *qkv = NULL, *p[3] = {NULL}, *v[3] = {NULL}, *o = NULL,
              *o2 = NULL, *z = NULL;
    fg_status s = fg_nn_linear_forward(&a->qkv, x, &qkv);
    if (s == FG_OK)
        s = fg_split(qkv, -1, sizes, 3, p);
    for (int j = 0; j < 3 && s == FG_OK; j++)
        s = fg_reshape(p[j], FG_SHAPE(Bq, Tq, H, d), &v[j]);
    if (s == FG_OK)
        s = fg_attention(v[0], v[1], v[2], &ao, &o);
    if (s == FG_OK)
        s = fg_reshape(o, FG_SHAPE(B, T, C), &o2);
    if (s == FG_OK)
        s = fg_nn_linear_forward(&a->proj, o2, &z);
    if (s == FG_OK)
        s = fg_nn_dropout(z, a->dropout, mode, y);
    fg_tensor *all[] = {qkv, p[0], p[1], p[2], v[0], v[1], v[2], o, o2, z};
    fgt_free_all(all, 10);
    return s;
}

/* Output, then the gradients of x and of the layer's four parameters. */
static void layer_run(const fg_nn_attention *a, int by_split, fg_dtype dt,
                      const int64_t *shape, const double *h_x,
                      const double *h_g, const fg_nn_seqs *seqs, int training,
                      double *res[6])
{
    fg_generator gen;
    fg_generator_init(&gen, 77);
    fg_nn_mode mode = {training, &gen, seqs};
    fg_tensor *x = leaf(dt, 3, shape, h_x), *y = NULL, *g = NULL;
    FGT_OK(by_split ? layer_by_split(a, x, &mode, &y)
                    : fg_nn_attention_forward(a, x, &mode, &y));
    FGT_OK(fg_tensor_zeros(dt, FG_DEVICE_CPU, 3, shape, &g));
    FGT_OK(fg_tensor_copy_from_host(g, FG_FP64, h_g, fg_tensor_numel(g)));
    FGT_OK(fg_backward_with(y, g));
    fg_tensor *ps[4] = {a->qkv.weight, a->qkv.bias, a->proj.weight,
                        a->proj.bias};
    res[0] = fgt_host(y);
    res[1] = fgt_host(fg_tensor_grad(x));
    for (int i = 0; i < 4; i++) {
        res[2 + i] = fgt_host(fg_tensor_grad(ps[i]));
        FGT_OK(fg_tensor_zero_grad(ps[i]));
    }
    fg_tensor *all[] = {x, y, g};
    fgt_free_all(all, 3);
}

/* Modes: evaluation; training (dropout); a window, softcap and ALiBi
 * while training; key padding; a packed batch while training. */
START_TEST(test_layer_unchanged)
{
    fgt_rng r = fgt_rng_for(0x9e0 + (uint64_t)_i);
    static const float slopes[2] = {0.25f, 0.5f};
    for (int mode = 0; mode < 5; mode++)
        for (int t = 0; t < 2; t++) {
            const fg_dtype dt = t ? FG_FP64 : FG_FP32;
            enum { B = 2, T = 7, C = 16, H = 2 };
            fg_generator gi;
            fg_generator_init(&gi, fgt_next(&r));
            fg_nn_attention a;
            FGT_OK(fg_nn_attention_init(&a, C, H, 0.25, 0.02, &gi, dt,
                                        FG_DEVICE_CPU));
            /* non-zero biases, so their gradients' paths are exercised */
            double hb[3 * C];
            for (int i = 0; i < 3 * C; i++)
                hb[i] = 0.1 * fgt_uniform(&r) + 0.01;
            fg_no_grad_begin();
            FGT_OK(fg_tensor_copy_from_host(a.qkv.bias, FG_FP64, hb, 3 * C));
            FGT_OK(fg_no_grad_end());
            if (mode == 2) {
                a.window = 2;
                a.softcap = 2.0;
                a.alibi_slopes = slopes;
            }
            const int32_t len[B] = {T, 4}, cu[4] = {0, 5, 9, B * T};
            const fg_nn_seqs padded = {len, NULL, 0}, pk = {NULL, cu, 3};
            const fg_nn_seqs *seqs =
                mode == 3 ? &padded : mode == 4 ? &pk : NULL;
            const int training = mode == 1 || mode == 2 || mode == 4;
            const int64_t shape[3] = {B, T, C};
            double *h_x = host_values(&r, B * T * C, 1.0),
                   *h_g = host_values(&r, B * T * C, 1.0), *now[6], *ref[6];
            layer_run(&a, 0, dt, shape, h_x, h_g, seqs, training, now);
            layer_run(&a, 1, dt, shape, h_x, h_g, seqs, training, ref);
            static const char *const what[6] = {"y", "dx", "dW_qkv",
                                                "db_qkv", "dW_proj",
                                                "db_proj"};
            const int64_t n[6] = {B * T * C, B * T * C, C * 3 * C, 3 * C,
                                  C * C, C};
            for (int i = 0; i < 6; i++) {
                expect_same(what[i], now[i], ref[i], n[i]);
                free(now[i]);
                free(ref[i]);
            }
            free(h_x);
            free(h_g);
            fg_nn_attention_release(&a);
        }
}
END_TEST

FGT_MAIN_BEGIN("attention_qkv")
FGT_LOOP(test_qkvpacked_equals_split, LOOPS)
FGT_LOOP(test_qkvpacked_bias_grad_only, 2)
FGT_LOOP(test_qkvpacked_gradcheck, 2)
FGT_TEST(test_qkvpacked_errors)
FGT_LOOP(test_layer_unchanged, 2)
FGT_MAIN_END()
