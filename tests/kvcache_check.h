/* SPDX-License-Identifier: MIT */
/* tests/kvcache_check.h - the KV-cache checks shared by the CPU suite
 * (test_kvcache.c) and the GPU one (test_gpu_kvcache.c): cached logits
 * against the full forward, and sampling with and without the cache. The
 * reference is fg_gpt_forward on the whole window, which never touches
 * the cache code. Include after test_ops_util.h. */
#ifndef FG_TESTS_KVCACHE_CHECK_H
#define FG_TESTS_KVCACHE_CHECK_H

#include <math.h>
#include <string.h>

/* The model variants every check runs on. */
typedef struct kvc_variant {
    const char *name;
    int64_t window;
    double softcap;
    int alibi, tie;
} kvc_variant;

static const kvc_variant KVC_VARIANTS[] = {
    {"plain", 0, 0, 0, 1},       {"untied", 0, 0, 0, 0},
    {"window 3", 3, 0, 0, 1},    {"alibi", 0, 0, 1, 1},
    {"softcap 2", 0, 2.0, 0, 1}, {"window+alibi+softcap", 2, 3.0, 1, 0},
};
enum { KVC_NVARIANTS = sizeof KVC_VARIANTS / sizeof *KVC_VARIANTS };

static inline fg_gpt *kvc_model(const kvc_variant *v, fg_dtype dt,
                                fg_device dev, int64_t ctx, uint64_t seed)
{
    fg_set_num_threads(1); /* tiny ops: OpenMP threads only add overhead */
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = 17;
    c.ctx = ctx;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.dtype = dt;
    c.device = dev;
    c.attn_window = v->window;
    c.attn_softcap = v->softcap;
    c.alibi = v->alibi;
    c.tie_weights = v->tie;
    fg_gpt *m;
    FGT_OK(fg_gpt_create(&c, seed, &m));
    return m;
}

/* The full forward's logits of each row's last token: [B, V] doubles
 * (caller frees); tokens is [B, T]. */
static inline double *kvc_full_last(const fg_gpt *m, const int64_t *tokens,
                                    int64_t B, int64_t T)
{
    const int64_t V = fg_gpt_get_config(m)->vocab;
    fg_tensor *lg;
    fg_no_grad_begin();
    FGT_OK(fg_gpt_forward(m, tokens, B, T, NULL, NULL, &lg, NULL));
    fg_no_grad_end();
    double *all = fgt_host(lg), *last = malloc((size_t)(B * V) * sizeof *last);
    for (int64_t b = 0; b < B; b++)
        memcpy(last + b * V, all + (b * T + T - 1) * V,
               (size_t)V * sizeof *last);
    free(all);
    fg_tensor_free(lg);
    return last;
}

/* Feeds B = 2 random sequences of ctx tokens through the cache in chunks
 * (a prefill of `prefill`, then one token at a time) and compares each
 * step's logits with the full forward's within tol (relative to the
 * largest logit). A first pass fills the cache with another sequence and
 * resets it, so stale entries beyond the cached length are in place: a
 * read past it would show. */
static inline void kvc_check_logits(const fg_gpt *m, int64_t prefill,
                                    double tol, fgt_rng *r)
{
    const int64_t B = 2, ctx = fg_gpt_get_config(m)->ctx,
                  V = fg_gpt_get_config(m)->vocab;
    int64_t *seq = malloc((size_t)(B * ctx) * sizeof *seq),
            *chunk = malloc((size_t)(B * ctx) * sizeof *chunk),
            *win = malloc((size_t)(B * ctx) * sizeof *win);
    fg_gpt_kv_cache *kv;
    FGT_OK(fg_gpt_kv_cache_create(m, B, &kv));
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < B * ctx; i++)
            seq[i] = fgt_int(r, 0, V - 1);
        fg_gpt_kv_cache_reset(kv);
        for (int64_t len = 0; len < ctx;) {
            const int64_t T = len == 0 ? prefill : 1;
            for (int64_t b = 0; b < B; b++)
                memcpy(chunk + b * T, seq + b * ctx + len,
                       (size_t)T * sizeof *chunk);
            fg_tensor *lg;
            FGT_OK(fg_gpt_forward_cached(m, kv, chunk, T, &lg));
            len += T;
            ck_assert_int_eq(fg_gpt_kv_cache_length(kv), len);
            ck_assert_int_eq(fg_tensor_ndim(lg), 2);
            ck_assert_int_eq(fg_tensor_size(lg, 0), B);
            ck_assert_int_eq(fg_tensor_size(lg, 1), V);
            for (int64_t b = 0; b < B; b++)
                memcpy(win + b * len, seq + b * ctx,
                       (size_t)len * sizeof *win);
            double *got = fgt_host(lg), *ref = kvc_full_last(m, win, B, len);
            const double err = fgt_rel_err(got, ref, (size_t)(B * V));
            if (!(err <= tol))
                ck_abort_msg("cached logits at length %lld (prefill %lld): "
                             "rel err %.3g > %.3g", (long long)len,
                             (long long)prefill, err, tol);
            free(got);
            free(ref);
            fg_tensor_free(lg);
        }
    }
    fg_gpt_kv_cache_free(kv);
    free(seq);
    free(chunk);
    free(win);
}

/* The tokens of FG_SAMPLE_CACHE_SHIFT's policy, computed from the full
 * forward: the window starts at max(0, n_prompt - ctx) and, whenever it
 * would exceed ctx tokens, jumps to the last (ctx + 1) / 2; greedy. */
static inline void kvc_shift_reference(const fg_gpt *m, int64_t *tokens,
                                       int64_t n_prompt, int64_t n_new)
{
    const int64_t ctx = fg_gpt_get_config(m)->ctx,
                  V = fg_gpt_get_config(m)->vocab;
    int64_t ws = n_prompt > ctx ? n_prompt - ctx : 0;
    for (int64_t len = n_prompt; len < n_prompt + n_new; len++) {
        if (len - ws > ctx)
            ws = len - (ctx + 1) / 2;
        double *lg = kvc_full_last(m, tokens + ws, 1, len - ws);
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        tokens[len] = best;
        free(lg);
    }
}

/* Sampling with the cache gives the recomputing sampler's tokens, greedy
 * and at temperature 1 with one seed, for a short prompt and one longer
 * than the context, generating past the context; the shift mode gives its
 * documented policy's tokens. */
static inline void kvc_check_sampling(const fg_gpt *m, fgt_rng *r)
{
    const int64_t ctx = fg_gpt_get_config(m)->ctx,
                  V = fg_gpt_get_config(m)->vocab, n_new = 2 * ctx + 3;
    const int64_t prompts[2] = {1, ctx + 2};
    const double temps[2] = {0, 1};
    for (int p = 0; p < 2; p++) {
        const int64_t n = prompts[p] + n_new;
        int64_t *a = malloc((size_t)n * sizeof *a),
                *b = malloc((size_t)n * sizeof *b);
        for (int64_t i = 0; i < prompts[p]; i++)
            a[i] = fgt_int(r, 0, V - 1);
        for (int t = 0; t < 2; t++) {
            fg_sample_options o;
            fg_sample_options_init(&o);
            o.temperature = temps[t];
            o.seed = fgt_next(r);
            memcpy(b, a, (size_t)prompts[p] * sizeof *b);
            o.mode = FG_SAMPLE_RECOMPUTE;
            FGT_OK(fg_gpt_sample(m, a, prompts[p], n_new, &o));
            o.mode = FG_SAMPLE_CACHE;
            FGT_OK(fg_gpt_sample(m, b, prompts[p], n_new, &o));
            for (int64_t i = 0; i < n; i++)
                if (a[i] != b[i])
                    ck_abort_msg("prompt %lld, temperature %g: token %lld "
                                 "is %lld with the cache, %lld without",
                                 (long long)prompts[p], temps[t],
                                 (long long)i, (long long)b[i],
                                 (long long)a[i]);
            if (t == 0) { /* the shift mode, greedy */
                o.mode = FG_SAMPLE_CACHE_SHIFT;
                FGT_OK(fg_gpt_sample(m, b, prompts[p], n_new, &o));
                kvc_shift_reference(m, a, prompts[p], n_new);
                for (int64_t i = 0; i < n; i++)
                    ck_assert_int_eq(a[i], b[i]);
            }
        }
        free(a);
        free(b);
    }
}

#endif /* FG_TESTS_KVCACHE_CHECK_H */
