/* SPDX-License-Identifier: MIT */
/* tests/test_gradcheck_block.c - gradcheck of a composite: a full pre-LN
 * transformer block (layernorm, fused QKV projection split into strided
 * views, causal FlashAttention, output projection, residuals, GELU MLP,
 * dropouts with fixed seeds) in fp64 with torch's tolerances, with respect
 * to the input and all twelve parameters. Full Jacobians on a small block,
 * fast mode (v^T J u) on a larger one. */
#include "test_ops_util.h"
#include "test_ops_block.h"

typedef struct blk_case {
    blk_cfg cfg;
    int64_t B, T;
    int fast;
} blk_case;

static const blk_case cases[] = {
    {{16, 2, 32, 0.0, 0.0, 0}, 1, 4, 0},
    {{16, 2, 24, 0.25, 0.1, 0}, 2, 3, 0},
    {{32, 4, 64, 0.2, 0.1, 0}, 2, 9, 1},
};

static fg_status block_fn(fg_tensor *const *in, int n, fg_tensor **out,
                          void *u)
{
    const blk_cfg *c = u;
    return blk_forward(c, in + 1, in[0], out);
}

START_TEST(test_block)
{
    blk_case bc = cases[_i];
    fgt_rng r = fgt_rng_for(700 + (uint64_t)_i);
    bc.cfg.seed = fgt_next(&r);
    fg_generator g;
    fg_generator_init(&g, fgt_next(&r));
    fg_tensor *in[1 + BLK_NPARAMS];
    FGT_OK(fg_tensor_rand_normal(&g, 0, 1, FG_FP64, FG_DEVICE_CPU,
                                 FG_SHAPE(bc.B, bc.T, bc.cfg.C), &in[0]));
    FGT_OK(fg_tensor_set_requires_grad(in[0], 1));
    FGT_OK(blk_params(&bc.cfg, &g, FG_FP64, in + 1));
    char what[96];
    snprintf(what, sizeof what,
             "transformer block B %lld T %lld C %lld H %lld p %g/%g%s",
             (long long)bc.B, (long long)bc.T, (long long)bc.cfg.C,
             (long long)bc.cfg.H, bc.cfg.p_attn, bc.cfg.p_resid,
             bc.fast ? " (fast)" : "");
    fgt_gradcheck(what, block_fn, &bc.cfg, in, 1 + BLK_NPARAMS, bc.fast);
    fgt_free_all(in, 1 + BLK_NPARAMS);
}
END_TEST

FGT_MAIN_BEGIN("gradcheck_block")
FGT_LOOP(test_block, (int)(sizeof cases / sizeof cases[0]))
FGT_MAIN_END()
