/* SPDX-License-Identifier: MIT */
/* lib/train/nn_internal.h - what the nn files share: the autocast casts
 * (definitions in nn_layers.c), the GPT's parts and the pieces of the
 * KV-cached forward (nn_kvcache.c). */
#ifndef FG_LIB_NN_INTERNAL_H
#define FG_LIB_NN_INTERNAL_H

#include "flashgrad/nn.h"
#include "flashgrad/tensor.h"

/* x in the autocast dtype when a region is active and x is a CUDA tensor
 * of another dtype (a recorded cast, so its gradient returns in x's
 * dtype; a parameter's is a view of its cached copy, fg_cast_param);
 * otherwise a new reference to x. NULL stays NULL. */
fg_status fg_nn_ac_cast(fg_tensor *x, fg_tensor **y);
/* x cast to dt if its dtype differs (recorded), else a new reference. */
fg_status fg_nn_to_dtype(fg_tensor *x, fg_dtype dt, fg_tensor **y);

/* fg_nn_embedding_forward_at, where positions == NULL means
 * start .. start + T - 1 in every row (the KV-cached forward). */
fg_status fg_nn_embedding_forward_from(const fg_nn_embedding *e,
                                       const int64_t *tokens,
                                       const int64_t *positions, int64_t B,
                                       int64_t T, int64_t start, fg_tensor **y);

/* One layer's KV cache: keys and values [B, cap, H, d] (NULL until the
 * first append, then in the dtype the layer's keys have). */
typedef struct fg_nn_kv {
    fg_tensor *k, *v;
    int64_t cap;
} fg_nn_kv;
/* The block in evaluation mode on T new tokens x [B, T, C] that follow
 * the len tokens cached in kv: stores their keys and values at
 * [len, len + T) and attends over all len + T (not recorded: call it
 * without grad). */
fg_status fg_nn_block_forward_kv(const fg_nn_block *b, fg_tensor *x,
                                 fg_nn_kv *kv, int64_t len, fg_tensor **y);

/* fg_nn_block_forward, and next (a layernorm) of the block's output y in
 * *h_next, the last residual join and next fused where they can be
 * (fg_dropout_add_layernorm); h_in: ln1(x) already made (by the previous
 * block's call), or NULL. next_ones: *h_next goes only to a Linear (the
 * next block's QKV projection), so it may carry a ones column
 * (fg_dropout_add_layernorm_ones). */
fg_status fg_nn_block_forward_ln(const fg_nn_block *b, fg_tensor *x,
                                 fg_tensor *h_in, const fg_nn_layernorm *next,
                                 int next_ones, const fg_nn_mode *mode,
                                 fg_tensor **y, fg_tensor **h_next);

struct fg_gpt {
    fg_gpt_config cfg;
    fg_nn_embedding emb;
    fg_nn_block *blocks;
    fg_nn_layernorm ln_f;
    fg_nn_linear head; /* weight NULL when tied */
    fg_tensor *alibi;  /* [n_head] fp32 slopes, or NULL */
    fg_param *params;
    int n_params;
};

/* FG_ERR_INVALID_ARGUMENT unless every one of the n tokens is in
 * [0, vocab). */
fg_status fg_gpt_check_tokens(const fg_gpt *m, const int64_t *tokens,
                              int64_t n);
/* Final LayerNorm and LM head: x [..., C] -> logits [..., vocab] in the
 * parameters' dtype. */
fg_status fg_gpt_head(const fg_gpt *m, fg_tensor *x, fg_tensor **logits);
/* The LM head alone, on h = ln_f(x) already made. */
fg_status fg_gpt_head_normed(const fg_gpt *m, fg_tensor *h,
                             fg_tensor **logits);

#endif /* FG_LIB_NN_INTERNAL_H */
