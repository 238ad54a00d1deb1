/* SPDX-License-Identifier: MIT */
/* flashgrad/nn.h - neural-network layers, a GPT model, toy data sets and
 * sampling, built on the differentiable ops of autograd.h.
 *
 * Layers are plain structs holding parameter tensors (leaves requiring
 * grad, allocated on the heap: create them with no arena pushed). Their
 * forward functions record ops like any other op, so a whole training step
 * can run inside an fg_arena (see doc/training.md):
 *
 *     fg_gpt_config c;
 *     fg_gpt_config_init(&c);            // then set vocab, ctx, sizes
 *     fg_gpt *m;
 *     fg_gpt_create(&c, 42, &m);
 *     fg_nn_mode train = {1, &gen};      // dropout on, masks from gen
 *     fg_gpt_forward(m, tok, B, T, tgt, &train, &logits, &loss);
 *     fg_backward(loss);
 *
 * Layout: activations are [B, T, C]; Linear weights are [in, out]
 * (y = x W + b). Initialisation follows GPT-2: weights and embeddings
 * normal(0, 0.02), residual output projections normal(0, 0.02 /
 * sqrt(2 * n_layer)), biases 0, LayerNorm weight 1 and bias 0.
 *
 * Devices: every layer takes a device (FG_DEVICE_CPU or FG_DEVICE_CUDA);
 * the parameters live there and the ops dispatch on it. Parameter dtype:
 * fp32 or fp64.
 *
 * Mixed precision (CUDA), like torch.autocast: inside
 * fg_autocast_begin(FG_BF16) ... fg_autocast_end(), Linear layers, the
 * attention and the LM head cast their inputs and parameters to bf16
 * (recorded casts: gradients flow back in fp32 to fp32 parameters) and run
 * the matrix products (fp32 accumulation) and attention in bf16; LayerNorm
 * computes in the parameters' dtype and writes its output in bf16 (what
 * its consumers cast it to: fg_layernorm_cast, one kernel; torch.autocast
 * returns fp32 there, the next op's cast makes the two equal); the
 * residual stream, the softmax-cross-entropy and the returned logits stay
 * in the parameters' dtype. CPU tensors are never cast. */
#ifndef FLASHGRAD_NN_H
#define FLASHGRAD_NN_H

#include <stdint.h>

#include "flashgrad/autograd.h"
#include "flashgrad/export.h"
#include "flashgrad/status.h"
#include "flashgrad/tensor.h"
#include "flashgrad/types.h"

FG_BEGIN_DECLS

/* How the rows of a [B, T] batch hold sequences (fg_nn_mode.seqs), for
 * the attention layers and the GPT. At most one of:
 *  - lengths (host int32 [B]): key padding. Row b's real tokens are its
 *    first lengths[b] (0..T); the others are padding that no token
 *    attends to (attention.h's seqused_k). Give padded positions the
 *    target -1 so the loss ignores them: the loss of the real tokens is
 *    then that of the unpadded rows.
 *  - cu_seqlens (host int32 [n_seq + 1]): packing. The B*T tokens, row
 *    after row, hold n_seq documents back to back, document s being
 *    flattened tokens cu_seqlens[s] .. cu_seqlens[s+1]-1 (cu_seqlens[0]
 *    = 0, non-decreasing, cu_seqlens[n_seq] = B*T). Attention stays
 *    inside a document (attention.h's cu_seqlens) and the GPT's position
 *    embeddings restart at 0 in each, so the logits of a document are
 *    those of running it alone. */
typedef struct fg_nn_seqs {
    const int32_t *lengths;
    const int32_t *cu_seqlens;
    int64_t n_seq;
} fg_nn_seqs;

/* Training or evaluation. With training set and dropout > 0, each dropout
 * (and attention dropout) draws a fresh (seed, offset) pair from rng.
 * A NULL mode means evaluation (no dropout) of plain [B, T] rows; seqs
 * (NULL = plain rows) describes padded or packed batches. */
typedef struct fg_nn_mode {
    int training;
    fg_generator *rng;
    const fg_nn_seqs *seqs;
} fg_nn_mode;

/* A named parameter, as enumerated by a model for the optimizer and
 * checkpoints. `decay` is 1 for matrices (weight decay applies), 0 for
 * biases and LayerNorm parameters. The tensor is borrowed. */
typedef struct fg_param {
    fg_tensor *tensor;
    char name[40];
    int decay;
} fg_param;

/* ---- mixed precision ------------------------------------------------------ */

/* Starts (or nests, with the same dtype) an autocast region on this
 * thread; FG_ERR_STATE if a region with another dtype is active. */
FG_API fg_status fg_autocast_begin(fg_dtype dt);
/* Ends the innermost region (FG_ERR_STATE if none). */
FG_API fg_status fg_autocast_end(void);
/* 1 and *dt (may be NULL) = the dtype inside a region, else 0. */
FG_API int fg_autocast_get(fg_dtype *dt);

/* ---- layers -------------------------------------------------------------- */

typedef struct fg_nn_linear {
    fg_tensor *weight; /* [in, out] */
    fg_tensor *bias;   /* [out], or NULL */
} fg_nn_linear;
/* weight ~ normal(0, std), bias zero (if `bias`). */
FG_API fg_status fg_nn_linear_init(fg_nn_linear *l, int64_t in, int64_t out,
                                   int bias, double std, fg_generator *g,
                                   fg_dtype dt, fg_device dev);
/* x [..., in] -> y [..., out]. */
FG_API fg_status fg_nn_linear_forward(const fg_nn_linear *l, fg_tensor *x,
                                      fg_tensor **y);
FG_API void fg_nn_linear_release(fg_nn_linear *l);

typedef struct fg_nn_layernorm {
    fg_tensor *weight, *bias; /* [C] */
    double eps;
} fg_nn_layernorm;
FG_API fg_status fg_nn_layernorm_init(fg_nn_layernorm *l, int64_t C,
                                      fg_dtype dt, fg_device dev);
/* y has x's dtype; inside an autocast region on CUDA, the region's dtype
 * when fg_layernorm_cast takes that pair (fp32 x to bf16/fp16, or fp64 x
 * to fp32). */
FG_API fg_status fg_nn_layernorm_forward(const fg_nn_layernorm *l,
                                         fg_tensor *x, fg_tensor **y);
FG_API void fg_nn_layernorm_release(fg_nn_layernorm *l);

/* Token embedding [V, C] plus learned position embedding [ctx, C]. */
typedef struct fg_nn_embedding {
    fg_tensor *tok, *pos;
} fg_nn_embedding;
FG_API fg_status fg_nn_embedding_init(fg_nn_embedding *e, int64_t vocab,
                                      int64_t ctx, int64_t C, double std,
                                      fg_generator *g, fg_dtype dt,
                                      fg_device dev);
/* tokens: host array [B, T] of ids in [0, vocab), T <= ctx -> [B, T, C]. */
FG_API fg_status fg_nn_embedding_forward(const fg_nn_embedding *e,
                                         const int64_t *tokens, int64_t B,
                                         int64_t T, fg_tensor **y);
/* The same with the position of every token given (host [B, T], each in
 * [0, ctx)), e.g. restarting per packed document; NULL = 0..T-1 in every
 * row. */
FG_API fg_status fg_nn_embedding_forward_at(const fg_nn_embedding *e,
                                            const int64_t *tokens,
                                            const int64_t *positions,
                                            int64_t B, int64_t T,
                                            fg_tensor **y);
FG_API void fg_nn_embedding_release(fg_nn_embedding *e);

/* Causal multi-head self-attention: one fused QKV projection that
 * fg_attention_qkvpacked reads in place (its backward writes d(qkv) in
 * one tensor; the KV-cache path splits it into strided views for
 * fg_attention), dropout inside the attention kernel, an output
 * projection, residual dropout. */
typedef struct fg_nn_attention {
    fg_nn_linear qkv;  /* [C, 3C] */
    fg_nn_linear proj; /* [C, C] */
    int64_t n_head;
    double dropout;
    /* Attention variants (attention.h), off when 0 / NULL: each token sees
     * itself and the `window` tokens before it; scores capped at
     * `softcap`; ALiBi slopes (fp32 [n_head] on the layer's device,
     * owned by the caller, e.g. the GPT). */
    int64_t window;
    double softcap;
    const float *alibi_slopes;
} fg_nn_attention;
FG_API fg_status fg_nn_attention_init(fg_nn_attention *a, int64_t C,
                                      int64_t n_head, double dropout,
                                      double proj_std, fg_generator *g,
                                      fg_dtype dt, fg_device dev);
FG_API fg_status fg_nn_attention_forward(const fg_nn_attention *a,
                                         fg_tensor *x, const fg_nn_mode *mode,
                                         fg_tensor **y);
FG_API void fg_nn_attention_release(fg_nn_attention *a);

/* fc (C -> 4C) -> GELU -> proj (4C -> C) -> dropout. */
typedef struct fg_nn_mlp {
    fg_nn_linear fc, proj;
    double dropout;
} fg_nn_mlp;
FG_API fg_status fg_nn_mlp_init(fg_nn_mlp *m, int64_t C, int64_t hidden,
                                double dropout, double proj_std,
                                fg_generator *g, fg_dtype dt, fg_device dev);
FG_API fg_status fg_nn_mlp_forward(const fg_nn_mlp *m, fg_tensor *x,
                                   const fg_nn_mode *mode, fg_tensor **y);
FG_API void fg_nn_mlp_release(fg_nn_mlp *m);

/* Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(.)). */
typedef struct fg_nn_block {
    fg_nn_layernorm ln1, ln2;
    fg_nn_attention attn;
    fg_nn_mlp mlp;
} fg_nn_block;
FG_API fg_status fg_nn_block_init(fg_nn_block *b, int64_t C, int64_t n_head,
                                  int n_layer, double dropout,
                                  fg_generator *g, fg_dtype dt,
                                  fg_device dev);
FG_API fg_status fg_nn_block_forward(const fg_nn_block *b, fg_tensor *x,
                                     const fg_nn_mode *mode, fg_tensor **y);
FG_API void fg_nn_block_release(fg_nn_block *b);

/* Dropout helper: x itself (a new reference) when not training or p = 0. */
FG_API fg_status fg_nn_dropout(fg_tensor *x, double p, const fg_nn_mode *mode,
                               fg_tensor **y);

/* ---- GPT ------------------------------------------------------------------ */

typedef struct fg_gpt_config {
    int64_t vocab;     /* tokens */
    int64_t ctx;       /* longest sequence (position embeddings) */
    int64_t n_layer;
    int64_t n_head;
    int64_t n_embd;    /* width C; C / n_head must be a multiple of 8 */
    double dropout;    /* embedding, attention, residual dropout */
    int tie_weights;   /* LM head = token embedding transposed */
    fg_dtype dtype;    /* FG_FP32 or FG_FP64 */
    fg_device device;
    /* Attention variants (0 = off): a sliding window of attn_window
     * previous tokens; softcap on the attention scores; ALiBi (per-head
     * linear distance biases with the geometric slopes 2^(-8 (h+1) / H)
     * of Press et al.) instead of learned position embeddings. */
    int64_t attn_window;
    double attn_softcap;
    int alibi;
} fg_gpt_config;

/* Defaults: vocab 0 (must be set), ctx 64, 2 layers, 4 heads, width 64,
 * dropout 0, tied weights, fp32, CPU. */
FG_API void fg_gpt_config_init(fg_gpt_config *c);

typedef struct fg_gpt fg_gpt;

/* Builds and initialises a model; parameters drawn from a generator
 * seeded with `seed`. */
FG_API fg_status fg_gpt_create(const fg_gpt_config *c, uint64_t seed,
                               fg_gpt **out);
FG_API void fg_gpt_free(fg_gpt *m);
FG_API const fg_gpt_config *fg_gpt_get_config(const fg_gpt *m);
/* Borrowed array of the model's parameters, in a fixed order. */
FG_API const fg_param *fg_gpt_params(const fg_gpt *m, int *n);
/* Total number of parameter elements. */
FG_API int64_t fg_gpt_num_params(const fg_gpt *m);

/* tokens [B, T] (host, T <= ctx) -> logits [B, T, vocab] (contiguous).
 * With targets (host [B, T], -1 = ignored) also the mean cross-entropy
 * `loss` (0-d); either output pointer may be NULL. mode->seqs, if set,
 * makes the batch padded or packed (fg_nn_seqs). */
FG_API fg_status fg_gpt_forward(const fg_gpt *m, const int64_t *tokens,
                                int64_t B, int64_t T, const int64_t *targets,
                                const fg_nn_mode *mode, fg_tensor **logits,
                                fg_tensor **loss);

/* ---- KV cache (incremental decoding) --------------------------------------
 * The keys and values of every layer for the tokens seen so far, so that
 * the next token costs one one-token forward step instead of a pass over
 * the whole context:
 *
 *     fg_gpt_kv_cache *kv;
 *     fg_gpt_kv_cache_create(m, 1, &kv);
 *     fg_gpt_forward_cached(m, kv, prompt, n, &logits);  // prefill
 *     ... draw t from logits ...
 *     fg_gpt_forward_cached(m, kv, &t, 1, &logits);      // one step
 *
 * The new tokens' queries attend, with bottom-right causal alignment, to
 * all cached keys (and the window, softcap and ALiBi of the config, which
 * depend only on the distance between positions); positions continue from
 * the cached length. The cache holds up to ctx tokens in the dtype of the
 * model's keys (bf16 inside an fg_autocast_begin(FG_BF16) region on CUDA:
 * keep the region the same for the cache's lifetime), on the model's
 * device: 2 x n_layer x batch x ctx x n_embd elements, allocated on the
 * first forward (on the heap, whatever arena is pushed). */
typedef struct fg_gpt_kv_cache fg_gpt_kv_cache;

/* An empty cache for `batch` >= 1 sequences of model m (which must
 * outlive it). */
FG_API fg_status fg_gpt_kv_cache_create(const fg_gpt *m, int64_t batch,
                                        fg_gpt_kv_cache **out);
FG_API void fg_gpt_kv_cache_free(fg_gpt_kv_cache *c);
/* Forgets the cached tokens (keeps the memory). */
FG_API void fg_gpt_kv_cache_reset(fg_gpt_kv_cache *c);
/* Tokens cached per sequence (0 for NULL). */
FG_API int64_t fg_gpt_kv_cache_length(const fg_gpt_kv_cache *c);

/* Runs the model, in evaluation mode and without recording, on T new
 * tokens per sequence (host [batch, T], ids in [0, vocab)) that follow the
 * cached ones; stores their keys and values; *logits = the logits of each
 * sequence's last new token, [batch, vocab] in the model's dtype and on
 * its device. The cached length plus T must not exceed ctx
 * (FG_ERR_INVALID_ARGUMENT, nothing changed). The logits equal those of
 * fg_gpt_forward on the whole sequence up to rounding. A failure inside
 * the model empties the cache. */
FG_API fg_status fg_gpt_forward_cached(const fg_gpt *m, fg_gpt_kv_cache *c,
                                       const int64_t *tokens, int64_t T,
                                       fg_tensor **logits);

/* ---- sampling ----------------------------------------------------------- */

/* How fg_gpt_sample runs the model for each new token. */
typedef enum fg_sample_mode {
    /* Rerun the model on the last ctx tokens (no cache). */
    FG_SAMPLE_RECOMPUTE = 0,
    /* KV cache: a prefill of the prompt's last ctx tokens, then one-token
     * steps. Exactly the recompute mode's tokens: once the sequence is
     * longer than ctx its window moves every token, so each further token
     * costs a prefill of ctx tokens (as much as recomputing). */
    FG_SAMPLE_CACHE = 1,
    /* KV cache that, when full, keeps the last ctx / 2 tokens (a prefill)
     * and goes on one token at a time: beyond ctx tokens the model sees
     * between ctx / 2 and ctx of them instead of exactly ctx, so the text
     * differs from the other modes' there, but every token stays cheap. */
    FG_SAMPLE_CACHE_SHIFT = 2
} fg_sample_mode;

typedef struct fg_sample_options {
    double temperature; /* >= 0 (0: greedy, the argmax); default 1 */
    int top_k;          /* 0: all tokens */
    uint64_t seed;
    fg_sample_mode mode; /* default FG_SAMPLE_CACHE */
} fg_sample_options;
FG_API void fg_sample_options_init(fg_sample_options *o);

/* Appends n_new tokens to tokens[0..n_prompt-1] (tokens has room for
 * n_prompt + n_new, n_prompt >= 1). Each step runs the model (as `mode`
 * says; without recording) on the sequence, divides the last logits by
 * the temperature, keeps the top_k, and draws from the softmax with a
 * splitmix64 stream keyed by seed (one draw per token in every mode and
 * at every temperature; temperature 0 takes the argmax instead). Same
 * seed, same text. */
FG_API fg_status fg_gpt_sample(const fg_gpt *m, int64_t *tokens,
                               int64_t n_prompt, int64_t n_new,
                               const fg_sample_options *o);

/* ---- toy data --------------------------------------------------------------
 * Sorting task: a sequence of `len` digits in [0, digits), a separator
 * token (= digits), then the same digits sorted. The model sees
 * x = [a_1..a_len, SEP, s_1..s_{len-1}] and is trained on the targets
 * y = [-1 x len, s_1..s_len] (the loss covers only the answer).
 * One input in eight (by a hash of its digits) is held out: training
 * batches never contain it, evaluation batches contain only such inputs. */
typedef struct fg_sort_task {
    int len;    /* 2..64 */
    int digits; /* 2..64 */
} fg_sort_task;

FG_API int64_t fg_sort_task_vocab(const fg_sort_task *t);
FG_API int64_t fg_sort_task_seqlen(const fg_sort_task *t);
/* Fills x, y ([B, seqlen] each) with examples of the split (0 train,
 * 1 held out), advancing the 64-bit random state *rng. */
FG_API fg_status fg_sort_task_batch(const fg_sort_task *t, int split,
                                    uint64_t *rng, int64_t B, int64_t *x,
                                    int64_t *y);
/* Exact-match accuracy on n held-out examples generated from `seed`: an
 * example counts when the argmax at every answer position is right, which
 * is exactly when greedy decoding from the prompt reproduces the sorted
 * sequence. Runs without recording, in batches of 256 (allocating in the
 * arena if one is pushed, else the heap). */
FG_API fg_status fg_sort_task_accuracy(const fg_gpt *m, const fg_sort_task *t,
                                       int64_t n, uint64_t seed, double *acc);

/* Character-level text: the vocabulary is the set of distinct bytes of the
 * file (sorted); the first 90% of the text is the training split, the rest
 * validation. */
typedef struct fg_text_data {
    int64_t vocab;
    unsigned char itos[256]; /* id -> byte */
    int stoi[256];           /* byte -> id, -1 if absent */
    int64_t *ids;            /* the whole text as ids */
    int64_t n, n_train;
} fg_text_data;
FG_API fg_status fg_text_data_load(const char *path, fg_text_data *d);
FG_API void fg_text_data_release(fg_text_data *d);
/* B random windows of T + 1 ids from the split: x = window[0..T-1],
 * y = window[1..T]. */
FG_API fg_status fg_text_data_batch(const fg_text_data *d, int split,
                                    uint64_t *rng, int64_t B, int64_t T,
                                    int64_t *x, int64_t *y);

/* A 64-bit random step (splitmix64) for the data samplers. */
FG_API uint64_t fg_rng_next(uint64_t *state);

FG_END_DECLS

#endif /* FLASHGRAD_NN_H */
