/* SPDX-License-Identifier: MIT */
/* lib/train/nn_gpt.c - the GPT model: token + position embeddings, dropout,
 * n_layer pre-LN blocks, a final LayerNorm and the LM head (tied to the
 * token embedding or its own [C, V] matrix). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashgrad/nn.h"
#include "lib/core/error.h"
#include "nn_internal.h"

#define NN_T(expr)              \
    do {                        \
        if (s == FG_OK)         \
            s = (expr);         \
    } while (0)

void fg_gpt_config_init(fg_gpt_config *c)
{
    if (!c)
        return;
    memset(c, 0, sizeof *c);
    c->ctx = 64;
    c->n_layer = 2;
    c->n_head = 4;
    c->n_embd = 64;
    c->tie_weights = 1;
    c->dtype = FG_FP32;
    c->device = FG_DEVICE_CPU;
}

static void add_param(fg_gpt *m, fg_tensor *t, const char *name, int decay)
{
    fg_param *p = &m->params[m->n_params++];
    p->tensor = t;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->decay = decay;
}

static void collect(fg_gpt *m)
{
    char nm[40];
    add_param(m, m->emb.tok, "wte", 1);
    if (m->emb.pos) /* none with ALiBi */
        add_param(m, m->emb.pos, "wpe", 1);
    for (int i = 0; i < m->cfg.n_layer; i++) {
        fg_nn_block *b = &m->blocks[i];
#define P(t, field, decay)                                      \
        snprintf(nm, sizeof nm, "h%d.%s", i, field);            \
        add_param(m, t, nm, decay);
        P(b->ln1.weight, "ln1.w", 0) P(b->ln1.bias, "ln1.b", 0)
        P(b->attn.qkv.weight, "attn.qkv.w", 1)
        P(b->attn.qkv.bias, "attn.qkv.b", 0)
        P(b->attn.proj.weight, "attn.proj.w", 1)
        P(b->attn.proj.bias, "attn.proj.b", 0)
        P(b->ln2.weight, "ln2.w", 0) P(b->ln2.bias, "ln2.b", 0)
        P(b->mlp.fc.weight, "mlp.fc.w", 1) P(b->mlp.fc.bias, "mlp.fc.b", 0)
        P(b->mlp.proj.weight, "mlp.proj.w", 1)
        P(b->mlp.proj.bias, "mlp.proj.b", 0)
#undef P
    }
    add_param(m, m->ln_f.weight, "ln_f.w", 0);
    add_param(m, m->ln_f.bias, "ln_f.b", 0);
    if (m->head.weight)
        add_param(m, m->head.weight, "lm_head.w", 1);
}

fg_status fg_gpt_create(const fg_gpt_config *c, uint64_t seed, fg_gpt **out)
{
    if (!c || !out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    if (c->vocab <= 0 || c->ctx <= 0 || c->n_layer <= 0 || c->n_layer > 256 ||
        c->n_embd <= 0 || c->ctx > 4096)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "bad config: vocab %lld, ctx %lld (<= 4096), "
                       "%lld layers, width %lld",
                       (long long)c->vocab, (long long)c->ctx,
                       (long long)c->n_layer, (long long)c->n_embd);
    if (c->attn_window < 0 || !(c->attn_softcap >= 0) || !isfinite(c->attn_softcap) ||
        c->n_head <= 0 || c->n_head > 256)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "bad config: attn_window %lld (>= 0), attn_softcap %g "
                       "(finite, >= 0), %lld heads (1..256)",
                       (long long)c->attn_window, c->attn_softcap,
                       (long long)c->n_head);
    /* attention.h's bounds, here rather than at the first forward */
    if (c->attn_softcap > 0 &&
        (c->attn_softcap > FLT_MAX || c->attn_softcap < FLT_MIN))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "bad config: attn_softcap %g is outside [%g, %g] (it "
                       "and its inverse must be normal fp32 numbers)",
                       c->attn_softcap, (double)FLT_MIN, (double)FLT_MAX);
    if (c->alibi != 0 && c->alibi != 1)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "bad config: alibi %d (0 or 1)", c->alibi);
    if (c->dtype != FG_FP32 && c->dtype != FG_FP64)
        return FG_FAIL(FG_ERR_UNSUPPORTED, "dtype %s: fp32 or fp64 only",
                       fg_dtype_name(c->dtype));
    fg_gpt *m = calloc(1, sizeof *m);
    if (m)
        m->blocks = calloc((size_t)c->n_layer, sizeof *m->blocks);
    if (m && m->blocks)
        m->params = calloc((size_t)(12 * c->n_layer + 5), sizeof *m->params);
    if (!m || !m->blocks || !m->params) {
        fg_gpt_free(m);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "model structures");
    }
    m->cfg = *c;
    fg_generator g;
    fg_generator_init(&g, seed);
    const fg_dtype dt = c->dtype;
    const fg_device dev = c->device;
    /* Built on the heap whatever arena the caller has pushed. */
    fg_status s = fg_arena_push(NULL);
    if (s != FG_OK) {
        fg_gpt_free(m);
        return s;
    }
    NN_T(fg_nn_embedding_init(&m->emb, c->vocab, c->ctx, c->n_embd, 0.02, &g,
                              dt, dev));
    for (int i = 0; i < c->n_layer && s == FG_OK; i++)
        s = fg_nn_block_init(&m->blocks[i], c->n_embd, c->n_head,
                             (int)c->n_layer, c->dropout, &g, dt, dev);
    NN_T(fg_nn_layernorm_init(&m->ln_f, c->n_embd, dt, dev));
    if (!c->tie_weights)
        NN_T(fg_nn_linear_init(&m->head, c->n_embd, c->vocab, 0, 0.02, &g,
                               dt, dev));
    if (s == FG_OK && c->alibi) { /* ALiBi replaces learned positions */
        float slopes[256];
        for (int64_t h = 0; h < c->n_head; h++)
            slopes[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)c->n_head);
        s = fg_tensor_from_host(FG_FP32, dev, FG_SHAPE(c->n_head), slopes,
                                &m->alibi);
        fg_tensor_free(m->emb.pos);
        m->emb.pos = NULL;
    }
    for (int i = 0; i < c->n_layer && s == FG_OK; i++) {
        fg_nn_attention *a = &m->blocks[i].attn;
        a->window = c->attn_window;
        a->softcap = c->attn_softcap;
        a->alibi_slopes = m->alibi ? fg_tensor_data(m->alibi) : NULL;
    }
    fg_arena_pop(NULL);
    if (s != FG_OK) {
        fg_gpt_free(m);
        return s;
    }
    collect(m);
    *out = m;
    return FG_OK;
}

void fg_gpt_free(fg_gpt *m)
{
    if (!m)
        return;
    fg_nn_embedding_release(&m->emb);
    fg_tensor_free(m->alibi);
    if (m->blocks)
        for (int i = 0; i < m->cfg.n_layer; i++)
            fg_nn_block_release(&m->blocks[i]);
    fg_nn_layernorm_release(&m->ln_f);
    fg_nn_linear_release(&m->head);
    free(m->blocks);
    free(m->params);
    free(m);
}

const fg_gpt_config *fg_gpt_get_config(const fg_gpt *m)
{
    return m ? &m->cfg : NULL;
}

const fg_param *fg_gpt_params(const fg_gpt *m, int *n)
{
    if (n)
        *n = m ? m->n_params : 0;
    return m ? m->params : NULL;
}

int64_t fg_gpt_num_params(const fg_gpt *m)
{
    int64_t total = 0;
    for (int i = 0; m && i < m->n_params; i++)
        total += fg_tensor_numel(m->params[i].tensor);
    return total;
}

fg_status fg_gpt_check_tokens(const fg_gpt *m, const int64_t *tokens,
                              int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "token %lld at %lld not in [0, %lld)",
                           (long long)tokens[i], (long long)i,
                           (long long)m->cfg.vocab);
    return FG_OK;
}

/* mode->seqs of a [B, T] batch: lengths in [0, T], or offsets covering
 * the B*T tokens; positions (host [B, T], allocated) restart per packed
 * document, NULL otherwise. */
static fg_status check_seqs(const fg_nn_seqs *sq, int64_t B, int64_t T,
                            int64_t **positions)
{
    *positions = NULL;
    if (!sq)
        return FG_OK;
    if (sq->lengths && sq->cu_seqlens)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "seqs: give lengths or cu_seqlens, not both");
    for (int64_t b = 0; sq->lengths && b < B; b++)
        if (sq->lengths[b] < 0 || sq->lengths[b] > T)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "seqs: lengths[%lld] = %d is not in [0, %lld]",
                           (long long)b, sq->lengths[b], (long long)T);
    if (!sq->cu_seqlens)
        return FG_OK;
    const int32_t *cu = sq->cu_seqlens;
    if (sq->n_seq < 1 || cu[0] != 0 || cu[sq->n_seq] != B * T)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "seqs: cu_seqlens must run from 0 to B*T = %lld over "
                       "n_seq >= 1 documents",
                       (long long)(B * T));
    for (int64_t s = 0; s < sq->n_seq; s++)
        if (cu[s + 1] < cu[s])
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "seqs: cu_seqlens decreases at %lld", (long long)s);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(B * T));
    if (!pos)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "positions");
    for (int64_t s = 0; s < sq->n_seq; s++)
        for (int64_t t = cu[s]; t < cu[s + 1]; t++)
            pos[t] = t - cu[s];
    *positions = pos;
    return FG_OK;
}

fg_status fg_gpt_forward(const fg_gpt *m, const int64_t *tokens, int64_t B,
                         int64_t T, const int64_t *targets,
                         const fg_nn_mode *mode, fg_tensor **logits,
                         fg_tensor **loss)
{
    if (!m || !tokens || (!logits && !loss))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    if (loss && !targets)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "a loss needs targets");
    if (B <= 0 || T <= 0 || T > m->cfg.ctx || B > FG_MAX_NUMEL / T)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "B = %lld, T = %lld (context %lld)", (long long)B,
                       (long long)T, (long long)m->cfg.ctx);
    FG_TRY(fg_gpt_check_tokens(m, tokens, B * T));
    int64_t *pos = NULL;
    FG_TRY(check_seqs(mode ? mode->seqs : NULL, B, T, &pos));
    fg_tensor *x = NULL, *y = NULL, *h = NULL, *lg = NULL;
    fg_status s = fg_nn_embedding_forward_at(&m->emb, tokens, pos, B, T, &x);
    free(pos);
    NN_T(fg_nn_dropout(x, m->cfg.dropout, mode, &y));
    fg_tensor_free(x);
    x = y;
    /* Each block also makes the layernorm after it (the next ln1, or
     * ln_f), fused with its last residual join; h carries it over. */
    if (m->cfg.n_layer > 0)
        NN_T(fg_nn_layernorm_forward(&m->blocks[0].ln1, x, &h));
    for (int i = 0; i < m->cfg.n_layer && s == FG_OK; i++) {
        const fg_nn_layernorm *next =
            i + 1 < m->cfg.n_layer ? &m->blocks[i + 1].ln1 : &m->ln_f;
        fg_tensor *hn = NULL;
        y = NULL;
        s = fg_nn_block_forward_ln(&m->blocks[i], x, h, next,
                                   i + 1 < m->cfg.n_layer, mode, &y, &hn);
        fg_tensor_free(x);
        fg_tensor_free(h);
        x = y;
        h = hn;
    }
    if (m->cfg.n_layer > 0)
        NN_T(fg_gpt_head_normed(m, h, &lg));
    else
        NN_T(fg_gpt_head(m, x, &lg));
    if (loss)
        NN_T(fg_cross_entropy(lg, targets, B * T, -1, loss));
    fg_tensor_free(x);
    fg_tensor_free(h);
    if (s == FG_OK && logits)
        *logits = lg;
    else
        fg_tensor_free(lg);
    return s;
}

fg_status fg_gpt_head(const fg_gpt *m, fg_tensor *x, fg_tensor **logits)
{
    fg_tensor *h = NULL;
    FG_TRY(fg_nn_layernorm_forward(&m->ln_f, x, &h));
    fg_status s = fg_gpt_head_normed(m, h, logits);
    fg_tensor_free(h);
    return s;
}

fg_status fg_gpt_head_normed(const fg_gpt *m, fg_tensor *h,
                             fg_tensor **logits)
{
    fg_tensor *lg = NULL;
    fg_status s = FG_OK;
    if (m->head.weight) {
        NN_T(fg_nn_linear_forward(&m->head, h, &lg));
    } else { /* tied: h wte^T, in the autocast dtype when one is active */
        fg_tensor *ha = NULL, *wa = NULL;
        NN_T(fg_nn_ac_cast(h, &ha));
        NN_T(fg_nn_ac_cast(m->emb.tok, &wa));
        NN_T(fg_matmul(ha, wa, 0, 1, &lg));
        fg_tensor_free(ha);
        fg_tensor_free(wa);
    }
    if (s == FG_OK) { /* softmax-cross-entropy and the logits in fp32 */
        fg_tensor *lf = NULL;
        s = fg_nn_to_dtype(lg, m->cfg.dtype, &lf);
        fg_tensor_free(lg);
        lg = lf;
    }
    if (s == FG_OK)
        *logits = lg;
    else
        fg_tensor_free(lg);
    return s;
}
