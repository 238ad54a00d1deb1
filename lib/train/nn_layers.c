/* SPDX-License-Identifier: MIT */
/* lib/train/nn_layers.c - Linear, LayerNorm, embeddings, causal self-attention,
 * MLP and the pre-LN block (nn.h). Forward functions only chain recorded
 * ops; every intermediate handle is dropped as soon as it is consumed, the
 * graph keeps what the backward needs. */
#include <math.h>
#include <string.h>

#include "flashgrad/nn.h"
#include "lib/core/error.h"
#include "lib/ops/ops_internal.h"
#include "lib/ops/ops_linear_internal.h" /* fg_linear_master */
#include "nn_internal.h"

/* Runs `expr` only while s is FG_OK (a chain of ops with one exit). */
#define NN_T(expr)              \
    do {                        \
        if (s == FG_OK)         \
            s = (expr);         \
    } while (0)

static fg_status param(fg_tensor *t)
{
    return fg_tensor_set_requires_grad(t, 1);
}

/* ---- autocast ---------------------------------------------------------------- */

static _Thread_local int tls_ac_depth;
static _Thread_local fg_dtype tls_ac_dtype;

fg_status fg_autocast_begin(fg_dtype dt)
{
    if (dt != FG_BF16 && dt != FG_FP16 && dt != FG_FP32 && dt != FG_FP64)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "unknown dtype %d", (int)dt);
    if (tls_ac_depth > 0 && dt != tls_ac_dtype)
        return FG_FAIL(FG_ERR_STATE, "autocast to %s is already active",
                       fg_dtype_name(tls_ac_dtype));
    tls_ac_dtype = dt;
    tls_ac_depth++;
    return FG_OK;
}

fg_status fg_autocast_end(void)
{
    if (tls_ac_depth == 0)
        return FG_FAIL(FG_ERR_STATE, "no autocast region is active");
    tls_ac_depth--;
    return FG_OK;
}

int fg_autocast_get(fg_dtype *dt)
{
    if (dt && tls_ac_depth > 0)
        *dt = tls_ac_dtype;
    return tls_ac_depth > 0;
}

fg_status fg_nn_ac_cast(fg_tensor *x, fg_tensor **y)
{
    fg_dtype dt;
    if (x && fg_autocast_get(&dt) && fg_tensor_device(x) == FG_DEVICE_CUDA &&
        fg_tensor_dtype(x) != dt) /* parameters: their cached copy */
        return fg_cast_param(x, dt, y);
    *y = fg_tensor_retain(x);
    return FG_OK;
}

/* Under autocast on CUDA, p is an fp32 parameter: the layer runs on its
 * cached copy with the gradient in fp32 (fg_linear_master, fg_mlp_master). */
static int ac_master(const fg_tensor *p)
{
    fg_dtype dt;
    return p && fg_autocast_get(&dt) && fg_tensor_device(p) == FG_DEVICE_CUDA &&
           fg_tensor_dtype(p) == FG_FP32 && dt != FG_FP32;
}

fg_status fg_nn_to_dtype(fg_tensor *x, fg_dtype dt, fg_tensor **y)
{
    if (fg_tensor_dtype(x) != dt)
        return fg_cast(x, dt, y);
    *y = fg_tensor_retain(x);
    return FG_OK;
}

/* ---- Linear ---------------------------------------------------------------- */

fg_status fg_nn_linear_init(fg_nn_linear *l, int64_t in, int64_t out,
                            int bias, double std, fg_generator *g,
                            fg_dtype dt, fg_device dev)
{
    if (!l || !g || in <= 0 || out <= 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    memset(l, 0, sizeof *l);
    fg_status s = fg_tensor_rand_normal(g, 0, std, dt, dev, FG_SHAPE(in, out),
                                        &l->weight);
    NN_T(param(l->weight));
    if (bias) {
        NN_T(fg_tensor_zeros(dt, dev, FG_SHAPE(out), &l->bias));
        NN_T(param(l->bias));
    }
    if (s != FG_OK)
        fg_nn_linear_release(l);
    return s;
}

fg_status fg_nn_linear_forward(const fg_nn_linear *l, fg_tensor *x,
                               fg_tensor **y)
{
    if (!l || !l->weight)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "uninitialised layer");
    fg_tensor *xa = NULL, *wa = NULL, *ba = NULL;
    fg_status s = fg_nn_ac_cast(x, &xa);
    if (s == FG_OK && l->bias && ac_master(l->weight)) {
        /* fp32 weight gradients straight from the GEMMs (no casts back) */
        s = fg_linear_master(xa, l->weight, l->bias, y);
        fg_tensor_free(xa);
        return s;
    }
    NN_T(fg_nn_ac_cast(l->weight, &wa));
    NN_T(fg_nn_ac_cast(l->bias, &ba));
    /* the bias in the GEMM's epilogue on CUDA; matmul + add on the CPU */
    NN_T(fg_linear(xa, wa, ba, y));
    fg_tensor_free(xa);
    fg_tensor_free(wa);
    fg_tensor_free(ba);
    return s;
}

void fg_nn_linear_release(fg_nn_linear *l)
{
    if (!l)
        return;
    fg_tensor_free(l->weight);
    fg_tensor_free(l->bias);
    l->weight = l->bias = NULL;
}

/* ---- LayerNorm --------------------------------------------------------------- */

fg_status fg_nn_layernorm_init(fg_nn_layernorm *l, int64_t C, fg_dtype dt,
                               fg_device dev)
{
    if (!l || C <= 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    memset(l, 0, sizeof *l);
    l->eps = 1e-5;
    fg_status s = fg_tensor_ones(dt, dev, FG_SHAPE(C), &l->weight);
    NN_T(param(l->weight));
    NN_T(fg_tensor_zeros(dt, dev, FG_SHAPE(C), &l->bias));
    NN_T(param(l->bias));
    if (s != FG_OK)
        fg_nn_layernorm_release(l);
    return s;
}

fg_status fg_nn_layernorm_forward(const fg_nn_layernorm *l, fg_tensor *x,
                                  fg_tensor **y)
{
    if (!l)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL layer");
    /* Under autocast on CUDA y comes out in the autocast dtype, which is
     * what every consumer (a Linear, the MLP, the tied head) casts it to:
     * one kernel each way instead of layernorm + cast and their
     * backwards, the same bits (fg_layernorm_cast). */
    fg_dtype ac;
    if (x && fg_autocast_get(&ac) && fg_tensor_device(x) == FG_DEVICE_CUDA &&
        ac != fg_tensor_dtype(x) &&
        fg_layernorm_out_ok(fg_tensor_dtype(x), ac))
        return fg_layernorm_cast(x, l->weight, l->bias, l->eps, ac, y);
    return fg_layernorm(x, l->weight, l->bias, l->eps, y);
}

void fg_nn_layernorm_release(fg_nn_layernorm *l)
{
    if (!l)
        return;
    fg_tensor_free(l->weight);
    fg_tensor_free(l->bias);
    l->weight = l->bias = NULL;
}

/* ---- embeddings ------------------------------------------------------------- */

fg_status fg_nn_embedding_init(fg_nn_embedding *e, int64_t vocab, int64_t ctx,
                               int64_t C, double std, fg_generator *g,
                               fg_dtype dt, fg_device dev)
{
    if (!e || !g || vocab <= 0 || ctx <= 0 || C <= 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    memset(e, 0, sizeof *e);
    fg_status s = fg_tensor_rand_normal(g, 0, std, dt, dev,
                                        FG_SHAPE(vocab, C), &e->tok);
    NN_T(param(e->tok));
    NN_T(fg_tensor_rand_normal(g, 0, std, dt, dev, FG_SHAPE(ctx, C),
                               &e->pos));
    NN_T(param(e->pos));
    if (s != FG_OK)
        fg_nn_embedding_release(e);
    return s;
}

enum { NN_MAX_CTX = 4096 };

fg_status fg_nn_embedding_forward(const fg_nn_embedding *e,
                                  const int64_t *tokens, int64_t B, int64_t T,
                                  fg_tensor **y)
{
    return fg_nn_embedding_forward_from(e, tokens, NULL, B, T, 0, y);
}

fg_status fg_nn_embedding_forward_at(const fg_nn_embedding *e,
                                     const int64_t *tokens,
                                     const int64_t *positions, int64_t B,
                                     int64_t T, fg_tensor **y)
{
    return fg_nn_embedding_forward_from(e, tokens, positions, B, T, 0, y);
}

fg_status fg_nn_embedding_forward_from(const fg_nn_embedding *e,
                                       const int64_t *tokens,
                                       const int64_t *positions, int64_t B,
                                       int64_t T, int64_t start, fg_tensor **y)
{
    if (!e || !e->tok || !tokens || B <= 0 || T <= 0 || start < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    const int64_t ctx = e->pos ? fg_tensor_size(e->pos, 0) : NN_MAX_CTX;
    if (start + T > ctx || start + T > NN_MAX_CTX)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "sequence length %lld exceeds the context %lld",
                       (long long)(start + T), (long long)ctx);
    if (!e->pos) /* no learned positions (ALiBi models) */
        return fg_embedding(e->tok, tokens, FG_SHAPE(B, T), y);
    int64_t pos[NN_MAX_CTX]; /* start..start+T-1 (fg_embedding copies) */
    for (int64_t i = 0; i < T; i++)
        pos[i] = start + i;
    fg_tensor *te = NULL, *pe = NULL;
    fg_status s = fg_embedding(e->tok, tokens, FG_SHAPE(B, T), &te);
    if (positions) /* [B, T, C] + [B, T, C]; fg_embedding checks the range */
        NN_T(fg_embedding(e->pos, positions, FG_SHAPE(B, T), &pe));
    else
        NN_T(fg_embedding(e->pos, pos, FG_SHAPE(T), &pe));
    NN_T(fg_add(te, pe, y)); /* [B, T, C] + [T, C] broadcasts */
    fg_tensor_free(te);
    fg_tensor_free(pe);
    return s;
}

void fg_nn_embedding_release(fg_nn_embedding *e)
{
    if (!e)
        return;
    fg_tensor_free(e->tok);
    fg_tensor_free(e->pos);
    e->tok = e->pos = NULL;
}

/* ---- dropout ----------------------------------------------------------------- */

static int dropping(double p, const fg_nn_mode *mode)
{
    return p > 0 && mode && mode->training;
}

fg_status fg_nn_dropout(fg_tensor *x, double p, const fg_nn_mode *mode,
                        fg_tensor **y)
{
    if (!x || !y)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    if (!dropping(p, mode)) {
        *y = fg_tensor_retain(x);
        return FG_OK;
    }
    if (!mode->rng)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "training mode needs an rng");
    uint64_t seed, off;
    FG_TRY(fg_generator_next(mode->rng, &seed, &off));
    return fg_dropout(x, p, seed, off, y);
}

/* y = x + dropout(b), a branch joining the residual stream x in x's dtype:
 * one fused op (fg_dropout_add) where its dtype rule allows, else the
 * chain it fuses (the same result). */
static fg_status dropout_add(fg_tensor *x, fg_tensor *b, double p,
                             const fg_nn_mode *mode, fg_tensor **y)
{
    const fg_dtype xt = fg_tensor_dtype(x), bt = fg_tensor_dtype(b);
    if (bt != xt &&
        !(xt == FG_FP32 && (bt == FG_BF16 || bt == FG_FP16))) {
        fg_tensor *d = NULL, *dc = NULL;
        fg_status s = fg_nn_dropout(b, p, mode, &d);
        NN_T(fg_nn_to_dtype(d, xt, &dc));
        NN_T(fg_add(x, dc, y));
        fg_tensor_free(d);
        fg_tensor_free(dc);
        return s;
    }
    uint64_t seed = 0, off = 0;
    if (!dropping(p, mode))
        return fg_dropout_add(x, b, 0.0, 0, 0, y);
    if (!mode->rng)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "training mode needs an rng");
    FG_TRY(fg_generator_next(mode->rng, &seed, &off));
    return fg_dropout_add(x, b, p, seed, off, y);
}

/* y = x + dropout(b) and h = ln(y) as dropout_add then
 * fg_nn_layernorm_forward would make them, in one fused op when the
 * layernorm would be fg_layernorm_cast's and the join fg_dropout_add's
 * (fg_dropout_add_layernorm: one kernel each way on CUDA, the same bits
 * and the same draw from mode->rng). ones: h feeds a Linear or MLP only
 * (fg_dropout_add_layernorm_ones: their bias gradients from the GEMM). */
static fg_status dropout_add_ln(fg_tensor *x, fg_tensor *b, double p,
                                const fg_nn_mode *mode,
                                const fg_nn_layernorm *ln, int ones,
                                fg_tensor **y, fg_tensor **h)
{
    const fg_dtype xt = fg_tensor_dtype(x), bt = fg_tensor_dtype(b);
    fg_dtype ac;
    if (!fg_autocast_get(&ac) || fg_tensor_device(x) != FG_DEVICE_CUDA ||
        ac == xt || !fg_layernorm_out_ok(xt, ac) ||
        !(bt == xt || (xt == FG_FP32 && (bt == FG_BF16 || bt == FG_FP16)))) {
        FG_TRY(dropout_add(x, b, p, mode, y));
        fg_status s = fg_nn_layernorm_forward(ln, *y, h);
        if (s != FG_OK) {
            fg_tensor_free(*y);
            *y = NULL;
        }
        return s;
    }
    uint64_t seed = 0, off = 0;
    if (dropping(p, mode)) {
        if (!mode->rng)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "training mode needs an rng");
        FG_TRY(fg_generator_next(mode->rng, &seed, &off));
    } else {
        p = 0.0;
    }
    return (ones ? fg_dropout_add_layernorm_ones : fg_dropout_add_layernorm)(
        x, b, p, seed, off, ln->weight, ln->bias, ln->eps, ac, y, h);
}

/* ---- attention ---------------------------------------------------------------- */

fg_status fg_nn_attention_init(fg_nn_attention *a, int64_t C, int64_t n_head,
                               double dropout, double proj_std,
                               fg_generator *g, fg_dtype dt, fg_device dev)
{
    if (!a || n_head <= 0 || C % n_head || (C / n_head) % 8 ||
        C / n_head > 256)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "width %lld and %lld heads: head size must be a "
                       "multiple of 8 in [8, 256]",
                       (long long)C, (long long)n_head);
    if (!(dropout >= 0 && dropout < 1))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "dropout %g not in [0, 1)",
                       dropout);
    memset(a, 0, sizeof *a);
    a->n_head = n_head;
    a->dropout = dropout;
    fg_status s = fg_nn_linear_init(&a->qkv, C, 3 * C, 1, 0.02, g, dt, dev);
    NN_T(fg_nn_linear_init(&a->proj, C, C, 1, proj_std, g, dt, dev));
    if (s != FG_OK)
        fg_nn_attention_release(a);
    return s;
}

/* Stores this step's keys and values at [len, len + T) of the cache
 * (allocated on first use, on the heap, in the keys' dtype: bf16 under
 * autocast) and replaces k, v by views of the cache's first len + T rows.
 * Bottom-right causal alignment then puts the T new queries at the end. */
static fg_status kv_append(fg_nn_kv *kv, int64_t len, fg_tensor **k,
                           fg_tensor **v)
{
    fg_tensor **cache[2] = {&kv->k, &kv->v}, **cur[2] = {k, v};
    /* A copy: *k is freed and replaced in the loop below. */
    int64_t sh[4];
    memcpy(sh, fg_tensor_shape(*k), sizeof sh);
    const int64_t T = sh[1];
    if (len < 0 || len + T > kv->cap)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "KV cache: %lld + %lld tokens exceed its %lld",
                       (long long)len, (long long)T, (long long)kv->cap);
    for (int i = 0; i < 2; i++) {
        fg_tensor *dst = NULL, *all = NULL;
        fg_status s = FG_OK;
        if (*cache[i] && fg_tensor_dtype(*cache[i]) != fg_tensor_dtype(*k))
            return FG_FAIL(FG_ERR_STATE, "KV cache holds %s keys, the "
                           "model now makes %s ones (autocast changed?)",
                           fg_dtype_name(fg_tensor_dtype(*cache[i])),
                           fg_dtype_name(fg_tensor_dtype(*k)));
        if (!*cache[i] && (s = fg_arena_push(NULL)) == FG_OK) {
            s = fg_tensor_empty(fg_tensor_dtype(*k), fg_tensor_device(*k),
                                FG_SHAPE(sh[0], kv->cap, sh[2], sh[3]),
                                cache[i]);
            fg_arena_pop(NULL);
        }
        NN_T(fg_narrow(*cache[i], 1, len, T, &dst));
        NN_T(fg_tensor_copy(dst, *cur[i]));
        NN_T(fg_narrow(*cache[i], 1, 0, len + T, &all));
        fg_tensor_free(dst);
        if (s != FG_OK)
            return s;
        fg_tensor_free(*cur[i]);
        *cur[i] = all;
    }
    return FG_OK;
}

/* The attention layer up to its output projection (the residual dropout
 * is the caller's); with kv, attending over the cached keys too. */
static fg_status attention_core(const fg_nn_attention *a, fg_tensor *x,
                                const fg_nn_mode *mode, fg_nn_kv *kv,
                                int64_t len, fg_tensor **y)
{
    if (!a || !x || !y || fg_tensor_ndim(x) != 3)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "x must be [B, T, C]");
    if (a->n_head < 1 || fg_tensor_size(x, 2) % a->n_head != 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "n_head %lld must be >= 1 and divide C = %lld",
                       (long long)a->n_head, (long long)fg_tensor_size(x, 2));
    const int64_t B = fg_tensor_size(x, 0), T = fg_tensor_size(x, 1),
                  C = fg_tensor_size(x, 2), H = a->n_head, d = C / H;
    fg_attention_options ao;
    fg_attention_options_init(&ao);
    ao.causal = 1;
    const fg_nn_seqs *sq = mode ? mode->seqs : NULL;
    const int packed = sq && sq->cu_seqlens;
    if (sq && sq->lengths && sq->cu_seqlens)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "seqs: give lengths or cu_seqlens, not both");
    if (packed) { /* every token of the batch is one packed sequence */
        ao.cu_seqlens_q = ao.cu_seqlens_k = sq->cu_seqlens;
        ao.n_seq = sq->n_seq;
    } else if (sq) {
        ao.seqused_k = sq->lengths;
    }
    if (a->window > 0)
        ao.window_left = a->window;
    ao.softcap = a->softcap;
    ao.alibi_slopes = a->alibi_slopes;
    fg_status s = FG_OK;
    if (dropping(a->dropout, mode)) {
        if (!mode->rng)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "training mode needs an rng");
        ao.dropout_p = a->dropout;
        NN_T(fg_generator_next(mode->rng, &ao.seed, &ao.offset));
    }
    fg_tensor *qkv = NULL, *qkv1 = NULL, *parts[3] = {0}, *q = NULL,
              *k = NULL, *v = NULL, *o = NULL, *o2 = NULL;
    const int64_t sizes[3] = {C, C, C};
    const int64_t Bq = packed ? 1 : B, Tq = packed ? B * T : T;
    NN_T(fg_nn_linear_forward(&a->qkv, x, &qkv));
    /* Without a cache, one node on the fused projection: its backward
     * writes dq, dk, dv into one d(qkv), where split's would copy three
     * in. */
    if (!kv && !packed) {
        NN_T(fg_attention_qkvpacked(qkv, H, &ao, &o2));
    } else if (!kv) { /* the batch as one row of B T tokens */
        NN_T(fg_reshape(qkv, FG_SHAPE(1, B * T, 3 * C), &qkv1));
        NN_T(fg_attention_qkvpacked(qkv1, H, &ao, &o));
        NN_T(fg_reshape(o, FG_SHAPE(B, T, C), &o2));
    } else {
        /* [B, T, C] slices of the fused projection viewed as
         * [B, T, H, d] (strided views, passed to the kernel without
         * copies); the cache keeps k and v of their own. */
        NN_T(fg_split(qkv, -1, sizes, 3, parts));
        NN_T(fg_reshape(parts[0], FG_SHAPE(Bq, Tq, H, d), &q));
        NN_T(fg_reshape(parts[1], FG_SHAPE(Bq, Tq, H, d), &k));
        NN_T(fg_reshape(parts[2], FG_SHAPE(Bq, Tq, H, d), &v));
        NN_T(kv_append(kv, len, &k, &v));
        NN_T(fg_attention(q, k, v, &ao, &o));
        NN_T(fg_reshape(o, FG_SHAPE(B, T, C), &o2));
    }
    NN_T(fg_nn_linear_forward(&a->proj, o2, y));
    fg_tensor *all[] = {qkv,  qkv1, parts[0], parts[1], parts[2],
                        q,    k,    v,        o,        o2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fg_tensor_free(all[i]);
    return s;
}

fg_status fg_nn_attention_forward(const fg_nn_attention *a, fg_tensor *x,
                                  const fg_nn_mode *mode, fg_tensor **y)
{
    fg_tensor *p = NULL;
    fg_status s = attention_core(a, x, mode, NULL, 0, &p);
    NN_T(fg_nn_dropout(p, a ? a->dropout : 0, mode, y));
    fg_tensor_free(p);
    return s;
}

void fg_nn_attention_release(fg_nn_attention *a)
{
    if (!a)
        return;
    fg_nn_linear_release(&a->qkv);
    fg_nn_linear_release(&a->proj);
}

/* ---- MLP ---------------------------------------------------------------------- */

fg_status fg_nn_mlp_init(fg_nn_mlp *m, int64_t C, int64_t hidden,
                         double dropout, double proj_std, fg_generator *g,
                         fg_dtype dt, fg_device dev)
{
    if (!m)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL layer");
    memset(m, 0, sizeof *m);
    m->dropout = dropout;
    fg_status s = fg_nn_linear_init(&m->fc, C, hidden, 1, 0.02, g, dt, dev);
    NN_T(fg_nn_linear_init(&m->proj, hidden, C, 1, proj_std, g, dt, dev));
    if (s != FG_OK)
        fg_nn_mlp_release(m);
    return s;
}

/* The MLP's body as one node on CUDA (fg_mlp: the biases, the GELU, its
 * derivative and the bias gradients in the GEMMs' epilogues); on the CPU
 * the chain of ops it fuses, whose bits the CPU's results keep. */
static fg_status mlp_fused(const fg_nn_mlp *m, fg_tensor *x, fg_tensor **y)
{
    fg_tensor *in[5] = {x, m->fc.weight, m->fc.bias, m->proj.weight,
                        m->proj.bias},
              *c[5] = {NULL};
    fg_status s = FG_OK;
    if (ac_master(m->fc.weight)) { /* fp32 gradients, as the Linear's */
        s = fg_nn_ac_cast(x, &c[0]);
        NN_T(fg_mlp_master(c[0], in[1], in[2], in[3], in[4], y));
        fg_tensor_free(c[0]);
        return s;
    }
    for (int i = 0; i < 5; i++)
        NN_T(fg_nn_ac_cast(in[i], &c[i]));
    NN_T(fg_mlp(c[0], c[1], c[2], c[3], c[4], y));
    for (int i = 0; i < 5; i++)
        fg_tensor_free(c[i]);
    return s;
}

/* The MLP up to its output projection (the residual dropout is the
 * caller's). */
static fg_status mlp_core(const fg_nn_mlp *m, fg_tensor *x, fg_tensor **y)
{
    if (!m)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL layer");
    if (x && fg_tensor_device(x) == FG_DEVICE_CUDA && m->fc.bias &&
        m->proj.bias)
        return mlp_fused(m, x, y);
    fg_tensor *h = NULL, *a = NULL;
    fg_status s = fg_nn_linear_forward(&m->fc, x, &h);
    NN_T(fg_gelu(h, &a));
    NN_T(fg_nn_linear_forward(&m->proj, a, y));
    fg_tensor_free(h);
    fg_tensor_free(a);
    return s;
}

fg_status fg_nn_mlp_forward(const fg_nn_mlp *m, fg_tensor *x,
                            const fg_nn_mode *mode, fg_tensor **y)
{
    fg_tensor *p = NULL;
    fg_status s = mlp_core(m, x, &p);
    NN_T(fg_nn_dropout(p, m->dropout, mode, y));
    fg_tensor_free(p);
    return s;
}

void fg_nn_mlp_release(fg_nn_mlp *m)
{
    if (!m)
        return;
    fg_nn_linear_release(&m->fc);
    fg_nn_linear_release(&m->proj);
}

/* ---- block ---------------------------------------------------------------------- */

fg_status fg_nn_block_init(fg_nn_block *b, int64_t C, int64_t n_head,
                           int n_layer, double dropout, fg_generator *g,
                           fg_dtype dt, fg_device dev)
{
    if (!b || n_layer <= 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    memset(b, 0, sizeof *b);
    /* GPT-2: projections into the residual stream scaled so the stream's
     * variance does not grow with depth. */
    const double proj_std = 0.02 / sqrt(2.0 * n_layer);
    fg_status s = fg_nn_layernorm_init(&b->ln1, C, dt, dev);
    NN_T(fg_nn_attention_init(&b->attn, C, n_head, dropout, proj_std, g, dt,
                              dev));
    NN_T(fg_nn_layernorm_init(&b->ln2, C, dt, dev));
    NN_T(fg_nn_mlp_init(&b->mlp, C, 4 * C, dropout, proj_std, g, dt, dev));
    if (s != FG_OK)
        fg_nn_block_release(b);
    return s;
}

/* h_in: ln1(x) when the caller made it (NULL: made here). next: the
 * layernorm that follows the block (the next block's ln1, or ln_f), whose
 * output goes to *h_next, fused with the last join; NULL: none. next_ones:
 * next is a block's ln1 (its output feeds the QKV projection only). */
static fg_status block_core(const fg_nn_block *b, fg_tensor *x,
                            fg_tensor *h_in, const fg_nn_layernorm *next,
                            int next_ones, const fg_nn_mode *mode,
                            fg_nn_kv *kv, int64_t len, fg_tensor **y,
                            fg_tensor **h_next)
{
    fg_tensor *h1 = NULL, *a = NULL, *x1 = NULL, *h2 = NULL, *m = NULL;
    fg_status s = FG_OK;
    NN_T(b ? FG_OK : FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL layer"));
    /* branches join the residual stream in its dtype, dropout, cast and
     * add fused (one kernel each way instead of three and two), with the
     * layernorm that reads the result where it can (dropout_add_ln) */
    if (h_in)
        h1 = fg_tensor_retain(h_in);
    else
        NN_T(fg_nn_layernorm_forward(&b->ln1, x, &h1));
    NN_T(attention_core(&b->attn, h1, mode, kv, len, &a));
    NN_T(dropout_add_ln(x, a, b->attn.dropout, mode, &b->ln2, 1, &x1, &h2));
    NN_T(mlp_core(&b->mlp, h2, &m));
    if (next)
        NN_T(dropout_add_ln(x1, m, b->mlp.dropout, mode, next, next_ones, y,
                            h_next));
    else
        NN_T(dropout_add(x1, m, b->mlp.dropout, mode, y));
    fg_tensor *all[] = {h1, a, x1, h2, m};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fg_tensor_free(all[i]);
    return s;
}

fg_status fg_nn_block_forward(const fg_nn_block *b, fg_tensor *x,
                              const fg_nn_mode *mode, fg_tensor **y)
{
    return block_core(b, x, NULL, NULL, 0, mode, NULL, 0, y, NULL);
}

fg_status fg_nn_block_forward_ln(const fg_nn_block *b, fg_tensor *x,
                                 fg_tensor *h_in, const fg_nn_layernorm *next,
                                 int next_ones, const fg_nn_mode *mode,
                                 fg_tensor **y, fg_tensor **h_next)
{
    if (!h_next || !next)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    return block_core(b, x, h_in, next, next_ones, mode, NULL, 0, y, h_next);
}

fg_status fg_nn_block_forward_kv(const fg_nn_block *b, fg_tensor *x,
                                 fg_nn_kv *kv, int64_t len, fg_tensor **y)
{
    if (!kv)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL cache");
    return block_core(b, x, NULL, NULL, 0, NULL, kv, len, y, NULL);
}

void fg_nn_block_release(fg_nn_block *b)
{
    if (!b)
        return;
    fg_nn_layernorm_release(&b->ln1);
    fg_nn_attention_release(&b->attn);
    fg_nn_layernorm_release(&b->ln2);
    fg_nn_mlp_release(&b->mlp);
}
