/* SPDX-License-Identifier: MIT */
/* lib/train/nn_kvcache.c - incremental decoding: the GPT's forward on new
 * tokens against the cached keys and values of the earlier ones (nn.h). */
#include <stdlib.h>

#include "flashgrad/nn.h"
#include "lib/core/error.h"
#include "nn_internal.h"

#define NN_T(expr)              \
    do {                        \
        if (s == FG_OK)         \
            s = (expr);         \
    } while (0)

struct fg_gpt_kv_cache {
    const fg_gpt *m;
    int64_t batch, len;
    fg_nn_kv *layers; /* [n_layer] */
};

fg_status fg_gpt_kv_cache_create(const fg_gpt *m, int64_t batch,
                                 fg_gpt_kv_cache **out)
{
    if (!m || !out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "fg_gpt_kv_cache_create: NULL argument");
    if (batch < 1 || batch > (int64_t)1 << 24)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "fg_gpt_kv_cache_create: batch %lld not in [1, 2^24]",
                       (long long)batch);
    fg_gpt_kv_cache *c = calloc(1, sizeof *c);
    if (c)
        c->layers = calloc((size_t)m->cfg.n_layer, sizeof *c->layers);
    if (!c || !c->layers) {
        free(c);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "fg_gpt_kv_cache_create");
    }
    c->m = m;
    c->batch = batch;
    for (int64_t i = 0; i < m->cfg.n_layer; i++)
        c->layers[i].cap = m->cfg.ctx;
    *out = c;
    return FG_OK;
}

void fg_gpt_kv_cache_free(fg_gpt_kv_cache *c)
{
    if (!c)
        return;
    for (int64_t i = 0; i < c->m->cfg.n_layer; i++) {
        fg_tensor_free(c->layers[i].k);
        fg_tensor_free(c->layers[i].v);
    }
    free(c->layers);
    free(c);
}

void fg_gpt_kv_cache_reset(fg_gpt_kv_cache *c)
{
    if (c)
        c->len = 0;
}

int64_t fg_gpt_kv_cache_length(const fg_gpt_kv_cache *c)
{
    return c ? c->len : 0;
}

/* Embeddings at positions len.., the blocks against the cache, then the
 * head on each sequence's last token only (the others' logits are not
 * needed: this is where a prefill saves the LM head's T x V product). */
static fg_status forward(const fg_gpt *m, fg_gpt_kv_cache *c,
                         const int64_t *tokens, int64_t T, fg_tensor **out)
{
    const int64_t B = c->batch;
    fg_tensor *x = NULL, *y = NULL, *last = NULL, *lg = NULL;
    fg_status s = fg_nn_embedding_forward_from(&m->emb, tokens, NULL, B, T, c->len,
                                             &x);
    for (int64_t i = 0; i < m->cfg.n_layer && s == FG_OK; i++) {
        y = NULL;
        s = fg_nn_block_forward_kv(&m->blocks[i], x, &c->layers[i], c->len,
                                   &y);
        fg_tensor_free(x);
        x = y;
    }
    NN_T(fg_narrow(x, 1, T - 1, 1, &last));
    NN_T(fg_gpt_head(m, last, &lg));
    NN_T(fg_reshape(lg, FG_SHAPE(B, m->cfg.vocab), out));
    fg_tensor_free(x);
    fg_tensor_free(last);
    fg_tensor_free(lg);
    return s;
}

fg_status fg_gpt_forward_cached(const fg_gpt *m, fg_gpt_kv_cache *c,
                                const int64_t *tokens, int64_t T,
                                fg_tensor **logits)
{
    if (!m || !c || !tokens || !logits)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "fg_gpt_forward_cached: NULL argument");
    if (c->m != m)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "fg_gpt_forward_cached: the cache belongs to another "
                       "model");
    if (T < 1 || T > m->cfg.ctx - c->len)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "fg_gpt_forward_cached: %lld new tokens after %lld "
                       "cached exceed the context %lld (T >= 1)",
                       (long long)T, (long long)c->len,
                       (long long)m->cfg.ctx);
    FG_TRY(fg_gpt_check_tokens(m, tokens, c->batch * T));
    fg_no_grad_begin(); /* the cache is written outside the graph */
    const fg_status s = forward(m, c, tokens, T, logits);
    fg_no_grad_end();
    c->len = s == FG_OK ? c->len + T : 0;
    return s;
}
