/* SPDX-License-Identifier: MIT */
/* tests/test_ops_block.h - a pre-LN transformer block (GPT-2 style) built
 * from flashgrad ops, for the composite gradcheck and the memory-plan test:
 *
 *   h = ln1(x); q, k, v = split(h W_qkv + b_qkv) viewed as [B, T, H, d]
 *   x1 = x + dropout(attention(q, k, v, causal) W_o + b_o)
 *   y  = x1 + dropout(gelu(ln2(x1) W_fc + b_fc) W_pr + b_pr)
 *
 * Q, K and V reach the attention kernels as strided views of the fused QKV
 * projection (no copies). */
#ifndef FG_TESTS_TEST_OPS_BLOCK_H
#define FG_TESTS_TEST_OPS_BLOCK_H

#include <flashgrad/flashgrad.h>

enum {
    BLK_LN1_W, BLK_LN1_B, BLK_QKV_W, BLK_QKV_B, BLK_O_W, BLK_O_B,
    BLK_LN2_W, BLK_LN2_B, BLK_FC_W, BLK_FC_B, BLK_PR_W, BLK_PR_B,
    BLK_NPARAMS
};

typedef struct blk_cfg {
    int64_t C, H, F; /* width, heads (d = C / H), MLP hidden */
    double p_attn, p_resid;
    uint64_t seed;
} blk_cfg;

/* Parameters with GPT-2-like scales, from generator g. */
static inline fg_status blk_params(const blk_cfg *c, fg_generator *g,
                                   fg_dtype dt, fg_tensor **p)
{
    const int64_t C = c->C, F = c->F;
    const int64_t shapes[BLK_NPARAMS][2] = {
        {C, 0}, {C, 0}, {C, 3 * C}, {3 * C, 0}, {C, C}, {C, 0},
        {C, 0}, {C, 0}, {C, F}, {F, 0}, {F, C}, {C, 0}};
    for (int i = 0; i < BLK_NPARAMS; i++) {
        int nd = shapes[i][1] ? 2 : 1;
        double mean = (i == BLK_LN1_W || i == BLK_LN2_W) ? 1.0 : 0.0;
        fg_status s = fg_tensor_rand_normal(g, mean, 0.3, dt, FG_DEVICE_CPU,
                                            nd, shapes[i], &p[i]);
        if (s == FG_OK)
            s = fg_tensor_set_requires_grad(p[i], 1);
        if (s != FG_OK)
            return s;
    }
    return FG_OK;
}

/* y = x W + b */
static inline fg_status blk_linear(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                                   fg_tensor **y)
{
    fg_tensor *t;
    fg_status s = fg_matmul(x, w, 0, 0, &t);
    if (s != FG_OK)
        return s;
    s = fg_add(t, b, y);
    fg_tensor_free(t);
    return s;
}

#define BLK_T(expr)                 \
    do {                            \
        if (s == FG_OK)             \
            s = (expr);             \
    } while (0)

/* x [B, T, C] -> y [B, T, C]; p holds BLK_NPARAMS tensors. */
static inline fg_status blk_forward(const blk_cfg *c, fg_tensor *const *p,
                                    fg_tensor *x, fg_tensor **y)
{
    const int64_t B = fg_tensor_size(x, 0), T = fg_tensor_size(x, 1),
                  C = c->C, H = c->H, d = C / H;
    fg_tensor *t[20] = {0}, *parts[3] = {0};
    fg_status s = FG_OK;
    fg_attention_options ao;
    fg_attention_options_init(&ao);
    ao.causal = 1;
    ao.dropout_p = c->p_attn;
    ao.seed = c->seed;
    ao.offset = 1;
    const int64_t sizes[3] = {C, C, C};
    BLK_T(fg_layernorm(x, p[BLK_LN1_W], p[BLK_LN1_B], 1e-5, &t[0]));
    BLK_T(blk_linear(t[0], p[BLK_QKV_W], p[BLK_QKV_B], &t[1]));
    BLK_T(fg_split(t[1], -1, sizes, 3, parts));
    BLK_T(fg_reshape(parts[0], FG_SHAPE(B, T, H, d), &t[2]));
    BLK_T(fg_reshape(parts[1], FG_SHAPE(B, T, H, d), &t[3]));
    BLK_T(fg_reshape(parts[2], FG_SHAPE(B, T, H, d), &t[4]));
    BLK_T(fg_attention(t[2], t[3], t[4], &ao, &t[5]));
    BLK_T(fg_reshape(t[5], FG_SHAPE(B, T, C), &t[6]));
    BLK_T(blk_linear(t[6], p[BLK_O_W], p[BLK_O_B], &t[7]));
    BLK_T(fg_dropout(t[7], c->p_resid, c->seed, 2, &t[8]));
    BLK_T(fg_add(x, t[8], &t[9]));
    BLK_T(fg_layernorm(t[9], p[BLK_LN2_W], p[BLK_LN2_B], 1e-5, &t[10]));
    BLK_T(blk_linear(t[10], p[BLK_FC_W], p[BLK_FC_B], &t[11]));
    BLK_T(fg_gelu(t[11], &t[12]));
    BLK_T(blk_linear(t[12], p[BLK_PR_W], p[BLK_PR_B], &t[13]));
    BLK_T(fg_dropout(t[13], c->p_resid, c->seed, 3, &t[14]));
    BLK_T(fg_add(t[9], t[14], y));
    for (int i = 0; i < 20; i++)
        fg_tensor_free(t[i]);
    for (int i = 0; i < 3; i++)
        fg_tensor_free(parts[i]);
    return s;
}

#endif /* FG_TESTS_TEST_OPS_BLOCK_H */
