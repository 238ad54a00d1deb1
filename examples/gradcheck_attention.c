/* SPDX-License-Identifier: MIT */
/* examples/gradcheck_attention.c - check flashgrad's gradients of the
 * attention op and of a pre-LN transformer block against finite
 * differences, with fg_gradcheck (fp64; torch.autograd.gradcheck's
 * defaults: eps 1e-6, atol 1e-5, rtol 1e-3), and print a PASS/FAIL table.
 *
 *   usage: gradcheck_attention [seed]
 *
 * Exit status 0 when every check passes. The attention checks include the
 * causal mask, dropout with a fixed seed (the backward regenerates the same
 * mask), GQA, and Q/K/V as strided views of one fused QKV projection. */
#include <stdio.h>
#include <stdlib.h>

#include <flashgrad/flashgrad.h>

#define CHECK(expr)                                                      \
    do {                                                                 \
        fg_status s_ = (expr);                                           \
        if (s_ != FG_OK) {                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                    fg_last_error());                                    \
            exit(2);                                                     \
        }                                                                \
    } while (0)

/* ---- attention ---------------------------------------------------------- */

typedef struct attn_case {
    const char *name;
    int64_t B, Nq, Nk, H, Hk, d;
    int causal, fused;
    double p;
} attn_case;

static fg_attention_options attn_opts(const attn_case *c)
{
    fg_attention_options o;
    fg_attention_options_init(&o);
    o.causal = c->causal;
    o.dropout_p = c->p;
    o.seed = 0x5eed; /* fixed: the function must be deterministic */
    o.offset = 3;
    o.block_q = 2; /* small tiles: exercise the online softmax */
    o.block_k = 3;
    return o;
}

static fg_status attn_fn(fg_tensor *const *in, int n, fg_tensor **out,
                         void *user)
{
    const attn_case *c = user;
    fg_attention_options o = attn_opts(c);
    if (!c->fused)
        return fg_attention(in[0], in[1], in[2], &o, out);
    /* One [B, N, (H + 2 Hk) d] tensor split into Q, K, V views. */
    const int64_t sizes[3] = {c->H * c->d, c->Hk * c->d, c->Hk * c->d};
    fg_tensor *p[3] = {0}, *q = NULL, *k = NULL, *v = NULL;
    fg_status s = fg_split(in[0], 2, sizes, 3, p);
    if (s == FG_OK)
        s = fg_reshape(p[0], FG_SHAPE(c->B, c->Nq, c->H, c->d), &q);
    if (s == FG_OK)
        s = fg_reshape(p[1], FG_SHAPE(c->B, c->Nk, c->Hk, c->d), &k);
    if (s == FG_OK)
        s = fg_reshape(p[2], FG_SHAPE(c->B, c->Nk, c->Hk, c->d), &v);
    if (s == FG_OK)
        s = fg_attention(q, k, v, &o, out);
    for (int i = 0; i < 3; i++)
        fg_tensor_free(p[i]);
    fg_tensor_free(q);
    fg_tensor_free(k);
    fg_tensor_free(v);
    return s;
}

/* ---- a pre-LN transformer block --------------------------------------------- */

enum { LN1_W, LN1_B, QKV_W, QKV_B, O_W, O_B, LN2_W, LN2_B, FC_W, FC_B,
       PR_W, PR_B, NPARAMS };

typedef struct block_case {
    const char *name;
    int64_t B, T, C, H, F;
    double p;
    int fast;
} block_case;

static fg_status linear(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                        fg_tensor **y)
{
    fg_tensor *t;
    fg_status s = fg_matmul(x, w, 0, 0, &t);
    if (s == FG_OK)
        s = fg_add(t, b, y);
    fg_tensor_free(t);
    return s;
}

/* in[0] = x [B, T, C], in[1..] = parameters */
static fg_status block_fn(fg_tensor *const *in, int n, fg_tensor **out,
                          void *user)
{
    const block_case *c = user;
    fg_tensor *const *p = in + 1;
    const int64_t d = c->C / c->H, sizes[3] = {c->C, c->C, c->C};
    fg_tensor *t[16] = {0}, *qkv[3] = {0};
    fg_attention_options o;
    fg_attention_options_init(&o);
    o.causal = 1;
    o.dropout_p = c->p;
    o.seed = 42;
    fg_status s = fg_layernorm(in[0], p[LN1_W], p[LN1_B], 1e-5, &t[0]);
#define STEP(expr) if (s == FG_OK) s = (expr)
    STEP(linear(t[0], p[QKV_W], p[QKV_B], &t[1]));
    STEP(fg_split(t[1], -1, sizes, 3, qkv));
    STEP(fg_reshape(qkv[0], FG_SHAPE(c->B, c->T, c->H, d), &t[2]));
    STEP(fg_reshape(qkv[1], FG_SHAPE(c->B, c->T, c->H, d), &t[3]));
    STEP(fg_reshape(qkv[2], FG_SHAPE(c->B, c->T, c->H, d), &t[4]));
    STEP(fg_attention(t[2], t[3], t[4], &o, &t[5]));
    STEP(fg_reshape(t[5], FG_SHAPE(c->B, c->T, c->C), &t[6]));
    STEP(linear(t[6], p[O_W], p[O_B], &t[7]));
    STEP(fg_dropout(t[7], c->p, 42, 1, &t[8]));
    STEP(fg_add(in[0], t[8], &t[9]));
    STEP(fg_layernorm(t[9], p[LN2_W], p[LN2_B], 1e-5, &t[10]));
    STEP(linear(t[10], p[FC_W], p[FC_B], &t[11]));
    STEP(fg_gelu(t[11], &t[12]));
    STEP(linear(t[12], p[PR_W], p[PR_B], &t[13]));
    STEP(fg_dropout(t[13], c->p, 42, 2, &t[14]));
    STEP(fg_add(t[9], t[14], out));
#undef STEP
    for (int i = 0; i < 16; i++)
        fg_tensor_free(t[i]);
    for (int i = 0; i < 3; i++)
        fg_tensor_free(qkv[i]);
    return s;
}

static fg_tensor *param(fg_generator *g, double mean, int nd,
                        const int64_t *shape)
{
    fg_tensor *t;
    CHECK(fg_tensor_rand_normal(g, mean, 0.3, FG_FP64, FG_DEVICE_CPU, nd,
                                shape, &t));
    CHECK(fg_tensor_set_requires_grad(t, 1));
    return t;
}

/* ---- the table --------------------------------------------------------- */

static int run(const char *name, fg_gradcheck_fn fn, void *user,
               fg_tensor *const *in, int n, int fast, uint64_t seed)
{
    fg_gradcheck_options o;
    fg_gradcheck_options_init(&o);
    o.fast_mode = fast;
    o.seed = seed;
    fg_gradcheck_report r;
    CHECK(fg_gradcheck(fn, user, in, n, &o, &r));
    printf("%-46s %-4s %9lld %10.2e %9.2e %6s  %s\n", name,
           fast ? "fast" : "full", (long long)r.n_checked, r.max_abs_err,
           r.worst_ratio, r.reentrant ? "yes" : "NO",
           r.passed ? "PASS" : "FAIL");
    if (!r.passed)
        printf("    %s\n", r.message);
    return r.passed;
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 2024;
    fg_generator g;
    fg_generator_init(&g, seed);
    int passed = 0, total = 0;

    printf("flashgrad %s gradcheck: fp64, eps 1e-6, pass iff |a - n| <= "
           "1e-5 + 1e-3 |n| (seed %llu)\n\n",
           fg_version(), (unsigned long long)seed);
    printf("%-46s %-4s %9s %10s %9s %6s  %s\n", "check", "mode", "entries",
           "max|a-n|", "worst", "reent", "result");
    printf("%.*s\n", 96,
           "-------------------------------------------------------------"
           "----------------------------------------");

    static const attn_case attn[] = {
        {"attention B1 N7 H2 d8", 1, 7, 7, 2, 2, 8, 0, 0, 0.0},
        {"attention B1 N7 H2 d8, causal", 1, 7, 7, 2, 2, 8, 1, 0, 0.0},
        {"attention B2 Nq5 Nk8 H2 Hk1 (GQA), causal", 2, 5, 8, 2, 1, 8, 1, 0,
         0.0},
        {"attention B1 N7 H2 d8, causal, dropout 0.2", 1, 7, 7, 2, 2, 8, 1, 0,
         0.2},
        {"attention B2 N6 H2 d16, causal, dropout 0.3", 2, 6, 6, 2, 2, 16, 1,
         0, 0.3},
        {"attention on fused-QKV views, causal, drop 0.2", 2, 5, 5, 2, 1, 8, 1,
         1, 0.2},
    };
    for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) {
        const attn_case *c = &attn[i];
        fg_tensor *in[3] = {0};
        int n = c->fused ? 1 : 3;
        if (c->fused) {
            in[0] = param(&g, 0, FG_SHAPE(c->B, c->Nq, (c->H + 2 * c->Hk) * c->d));
        } else {
            in[0] = param(&g, 0, FG_SHAPE(c->B, c->Nq, c->H, c->d));
            in[1] = param(&g, 0, FG_SHAPE(c->B, c->Nk, c->Hk, c->d));
            in[2] = param(&g, 0, FG_SHAPE(c->B, c->Nk, c->Hk, c->d));
        }
        passed += run(c->name, attn_fn, (void *)c, in, n, 0, seed);
        total++;
        for (int k = 0; k < n; k++)
            fg_tensor_free(in[k]);
    }

    static const block_case blocks[] = {
        {"transformer block B1 T4 C16 H2", 1, 4, 16, 2, 32, 0.0, 0},
        {"transformer block B2 T3 C16 H2, dropout 0.2", 2, 3, 16, 2, 24, 0.2,
         0},
        {"transformer block B2 T12 C32 H4, dropout 0.1", 2, 12, 32, 4, 64, 0.1,
         1},
    };
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        const block_case *c = &blocks[i];
        const int64_t C = c->C, F = c->F;
        fg_tensor *in[1 + NPARAMS];
        in[0] = param(&g, 0, FG_SHAPE(c->B, c->T, C));
        in[1 + LN1_W] = param(&g, 1, FG_SHAPE(C));
        in[1 + LN1_B] = param(&g, 0, FG_SHAPE(C));
        in[1 + QKV_W] = param(&g, 0, FG_SHAPE(C, 3 * C));
        in[1 + QKV_B] = param(&g, 0, FG_SHAPE(3 * C));
        in[1 + O_W] = param(&g, 0, FG_SHAPE(C, C));
        in[1 + O_B] = param(&g, 0, FG_SHAPE(C));
        in[1 + LN2_W] = param(&g, 1, FG_SHAPE(C));
        in[1 + LN2_B] = param(&g, 0, FG_SHAPE(C));
        in[1 + FC_W] = param(&g, 0, FG_SHAPE(C, F));
        in[1 + FC_B] = param(&g, 0, FG_SHAPE(F));
        in[1 + PR_W] = param(&g, 0, FG_SHAPE(F, C));
        in[1 + PR_B] = param(&g, 0, FG_SHAPE(C));
        passed += run(c->name, block_fn, (void *)c, in, 1 + NPARAMS, c->fast,
                      seed);
        total++;
        for (int k = 0; k < 1 + NPARAMS; k++)
            fg_tensor_free(in[k]);
    }
    printf("\n%d of %d checks passed: %s\n", passed, total,
           passed == total ? "PASS" : "FAIL");
    return passed == total ? 0 : 1;
}
