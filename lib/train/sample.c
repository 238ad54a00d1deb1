/* SPDX-License-Identifier: MIT */
/* lib/train/sample.c - autoregressive sampling with temperature and top-k,
 * recomputing the context or with a KV cache. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flashgrad/nn.h"
#include "lib/core/error.h"

void fg_sample_options_init(fg_sample_options *o)
{
    if (!o)
        return;
    o->temperature = 1.0;
    o->top_k = 0;
    o->seed = 0;
    o->mode = FG_SAMPLE_CACHE;
}

/* Draws from the softmax of logits[0..V-1] / temperature restricted to
 * the top_k largest, with the uniform number u in [0, 1); temperature 0:
 * the argmax (the first of equal ones). */
static int64_t draw(double *lg, int64_t V, double temp, int top_k, double u,
                    double *scratch)
{
    if (temp == 0) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        return best;
    }
    /* Shifted by the largest logit before dividing: logits / a tiny
     * temperature would overflow to inf (and inf - inf = NaN). Every
     * value is then <= 0, the largest 0. */
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; v++)
        if (lg[v] > mx)
            mx = lg[v];
    for (int64_t v = 0; v < V; v++)
        lg[v] = (lg[v] - mx) / temp;
    if (top_k > 0 && top_k < V) {
        /* threshold = the top_k-th largest value (partial selection). */
        memcpy(scratch, lg, (size_t)V * sizeof *scratch);
        for (int k = 0; k < top_k; k++) {
            int64_t best = k;
            for (int64_t v = k + 1; v < V; v++)
                if (scratch[v] > scratch[best])
                    best = v;
            double tmp = scratch[k];
            scratch[k] = scratch[best];
            scratch[best] = tmp;
        }
        const double thr = scratch[top_k - 1];
        for (int64_t v = 0; v < V; v++)
            if (lg[v] < thr)
                lg[v] = -INFINITY;
    }
    double sum = 0;
    for (int64_t v = 0; v < V; v++)
        sum += (lg[v] = exp(lg[v])); /* already shifted: at most 1 */
    double acc = 0, target = u * sum;
    int64_t last = 0;
    for (int64_t v = 0; v < V; v++) {
        if (lg[v] == 0)
            continue;
        last = v;
        acc += lg[v];
        if (target < acc)
            return v;
    }
    return last;
}

/* The logits that predict tokens[len] into lg (host, fp64): the model on
 * the last ctx tokens, recomputed or through the cache (which, but for the
 * first call, holds the tokens up to len - 2). */
static fg_status next_logits(const fg_gpt *m, fg_gpt_kv_cache *kv,
                             fg_sample_mode mode, const int64_t *tokens,
                             int64_t len, int first, double *lg)
{
    const int64_t ctx = fg_gpt_get_config(m)->ctx,
                  V = fg_gpt_get_config(m)->vocab;
    fg_tensor *logits = NULL, *last = NULL;
    fg_status s;
    if (!kv) {
        const int64_t T = len < ctx ? len : ctx;
        s = fg_gpt_forward(m, tokens + len - T, 1, T, NULL, NULL, &logits,
                           NULL);
        if (s == FG_OK)
            s = fg_narrow(logits, 1, T - 1, 1, &last);
    } else {
        if (!first && fg_gpt_kv_cache_length(kv) < ctx) { /* one token */
            s = fg_gpt_forward_cached(m, kv, tokens + len - 1, 1, &last);
        } else { /* the prompt, or a full cache: prefill the window */
            const int64_t keep = mode == FG_SAMPLE_CACHE_SHIFT && !first
                                     ? (ctx + 1) / 2 : ctx;
            const int64_t T = len < keep ? len : keep;
            fg_gpt_kv_cache_reset(kv);
            s = fg_gpt_forward_cached(m, kv, tokens + len - T, T, &last);
        }
    }
    if (s == FG_OK)
        s = fg_tensor_copy_to_host(last, FG_FP64, lg, V);
    fg_tensor_free(last);
    fg_tensor_free(logits);
    return s;
}

fg_status fg_gpt_sample(const fg_gpt *m, int64_t *tokens, int64_t n_prompt,
                        int64_t n_new, const fg_sample_options *o)
{
    if (!m || !tokens || n_prompt < 1 || n_new < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "fg_gpt_sample: bad "
                       "arguments");
    fg_sample_options def;
    fg_sample_options_init(&def);
    if (!o)
        o = &def;
    if (!(o->temperature >= 0) || !isfinite(o->temperature) || o->top_k < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "fg_gpt_sample: temperature %g (finite, >= 0), "
                       "top_k %d (>= 0)", o->temperature, o->top_k);
    if (o->mode != FG_SAMPLE_RECOMPUTE && o->mode != FG_SAMPLE_CACHE &&
        o->mode != FG_SAMPLE_CACHE_SHIFT)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "fg_gpt_sample: unknown mode %d", (int)o->mode);
    const int64_t V = fg_gpt_get_config(m)->vocab;
    double *lg = malloc((size_t)V * 2 * sizeof *lg);
    if (!lg)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "sampling buffer");
    fg_gpt_kv_cache *kv = NULL;
    fg_status s = o->mode == FG_SAMPLE_RECOMPUTE
                      ? FG_OK : fg_gpt_kv_cache_create(m, 1, &kv);
    uint64_t rng = o->seed ^ 0x5A4D504C45ull;
    fg_no_grad_begin();
    for (int64_t i = 0; i < n_new && s == FG_OK; i++) {
        const int64_t len = n_prompt + i;
        s = next_logits(m, kv, o->mode, tokens, len, i == 0, lg);
        /* NaN or +inf logits (a diverged model) give no distribution to
         * draw from: an error, not an arbitrary token. -inf is a token
         * that cannot come. */
        int any = 0;
        for (int64_t v = 0; v < V && s == FG_OK; v++) {
            if (isnan(lg[v]) || lg[v] == INFINITY)
                s = FG_FAIL(FG_ERR_STATE,
                            "fg_gpt_sample: the logit of token %lld at "
                            "position %lld is %g; the model's output is "
                            "not finite",
                            (long long)v, (long long)len, lg[v]);
            any |= lg[v] > -INFINITY;
        }
        if (s == FG_OK && !any)
            s = FG_FAIL(FG_ERR_STATE, "fg_gpt_sample: every logit at "
                        "position %lld is -inf", (long long)len);
        if (s == FG_OK) {
            const double u =
                (double)(fg_rng_next(&rng) >> 11) * 0x1.0p-53;
            tokens[len] = draw(lg, V, o->temperature, o->top_k, u, lg + V);
        }
    }
    fg_no_grad_end();
    fg_gpt_kv_cache_free(kv);
    free(lg);
    return s;
}
