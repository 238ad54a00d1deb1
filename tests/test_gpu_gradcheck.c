/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_gradcheck.c - fg_gradcheck in fp64 on the GPU (inputs and
 * outputs are CUDA tensors; torch's tolerances |a - n| <= 1e-5 + 1e-3 |n|,
 * eps 1e-6):
 *   - every op case of gpu_op_harness.c (the same shapes, views and
 *     broadcasting as test_gpu_ops) except the casts that round;
 *   - a full pre-LN transformer block built with fg_nn_block_init(...,
 *     FG_FP64, FG_DEVICE_CUDA) and fg_nn_block_forward (dropout 0),
 *     reduced to a scalar, with respect to the input and all twelve
 *     parameters: full Jacobians on small blocks, fast mode (v^T J u) on a
 *     larger one (mirrors test_gradcheck_block);
 *   - gradcheck itself on CUDA inputs: it restores them bit for bit, never
 *     touches .grad, and catches a wrong gradient.
 * Exits 77 (skip) without a GPU; CUDA is touched only in the forked tests.
 * FG_TEST_SEED=<printed seed> reproduces a run. */
#include "gpu_op_harness.h"

/* gradcheck runs every backward twice and wants identical bits
 * (reentrancy); the CUDA attention backward accumulates dQ with atomics
 * unless deterministic algorithms are on (types.h), as torch's gradcheck
 * would need nondet_tol. Each test runs in its own fork, so this only
 * affects the test that calls it. */
static void deterministic(void)
{
    fg_set_deterministic(1);
}

/* Full Jacobians up to this many input elements, fast mode above. */
#define FULL_MAX_IN 1000

START_TEST(test_op_gradcheck)
{
    const gph_case *c = &gph_cases[_i];
    if (c->no_gradcheck)
        return;
    deterministic();
    fgt_rng r = fgt_rng_for(2000 + (uint64_t)_i);
    if (c->setup)
        c->setup(c->user, &r);
    fg_tensor *in[GPH_MAX_IN] = {0};
    gph_inputs(c, &r, FG_FP64, FG_DEVICE_CUDA, in);
    int64_t total = 0;
    for (int i = 0; i < c->n_in; i++)
        total += fg_tensor_numel(in[i]);
    char what[160];
    snprintf(what, sizeof what, "%s (gpu fp64%s)", c->name,
             total > FULL_MAX_IN ? ", fast" : "");
    fgt_gradcheck(what, c->fn, c->user, in, c->n_in, total > FULL_MAX_IN);
    fgt_free_all(in, c->n_in);
}
END_TEST

/* ---- a transformer block ------------------------------------------------ */

typedef struct blk_case {
    int64_t C, H, B, T;
    int fast;
} blk_case;

static const blk_case blk_cases[] = {
    {16, 2, 1, 4, 0},
    {16, 2, 2, 3, 0},
    {32, 4, 2, 9, 1},
};

typedef struct blk_ctx {
    fg_nn_block blk;
    fg_tensor *w; /* fixed random weights of the scalar reduction */
} blk_ctx;

/* sum(block(x) * w): a scalar depending on every output element. The
 * parameters are the ones inside ctx->blk, which gradcheck perturbs in
 * place through in[1..]. */
static fg_status block_fn(fg_tensor *const *in, int n, fg_tensor **out,
                          void *u)
{
    const blk_ctx *b = u;
    fg_tensor *y = NULL, *yw = NULL;
    fg_status s = fg_nn_block_forward(&b->blk, in[0], NULL, &y);
    if (s == FG_OK)
        s = fg_mul(y, b->w, &yw);
    if (s == FG_OK)
        s = fg_sum(yw, NULL, 0, 0, out);
    fg_tensor_free(y);
    fg_tensor_free(yw);
    return s;
}

/* Replaces a parameter's values with U(-0.5, 0.5) (centre 1 for the
 * LayerNorm weights): GPT-2's init (std 0.02, zero biases, unit LN) would
 * leave the block nearly linear and many gradients trivially zero. */
static void rerandomise(fgt_rng *r, fg_tensor *p, double centre)
{
    const int64_t n = fg_tensor_numel(p);
    double *h = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        h[i] = centre + 0.5 * fgt_uniform(r);
    fg_no_grad_begin();
    FGT_OK(fg_tensor_copy_from_host(p, FG_FP64, h, n));
    FGT_OK(fg_no_grad_end());
    free(h);
}

START_TEST(test_block)
{
    blk_case bc = blk_cases[_i];
    /* Under compute-sanitizer the probes of fast mode: a full Jacobian is
     * thousands of block evaluations, each slowed by the tool. */
    bc.fast = bc.fast || fgt_sanitize_mode() != 0;
    deterministic();
    fgt_rng r = fgt_rng_for(2100 + (uint64_t)_i);
    fg_generator g;
    fg_generator_init(&g, fgt_next(&r));
    blk_ctx b;
    memset(&b, 0, sizeof b);
    FGT_OK(fg_nn_block_init(&b.blk, bc.C, bc.H, 2, 0.0, &g, FG_FP64,
                            FG_DEVICE_CUDA));
    fg_tensor *in[13] = {
        NULL,
        b.blk.ln1.weight, b.blk.ln1.bias,
        b.blk.attn.qkv.weight, b.blk.attn.qkv.bias,
        b.blk.attn.proj.weight, b.blk.attn.proj.bias,
        b.blk.ln2.weight, b.blk.ln2.bias,
        b.blk.mlp.fc.weight, b.blk.mlp.fc.bias,
        b.blk.mlp.proj.weight, b.blk.mlp.proj.bias,
    };
    for (int i = 1; i < 13; i++) {
        ck_assert_ptr_nonnull(in[i]);
        ck_assert_int_eq(fg_tensor_device(in[i]), FG_DEVICE_CUDA);
        ck_assert(fg_tensor_requires_grad(in[i]));
        rerandomise(&r, in[i], (i == 1 || i == 7) ? 1.0 : 0.0);
    }
    const int64_t xs[3] = {bc.B, bc.T, bc.C};
    gph_input xi = {.nd = 3, .shape = {bc.B, bc.T, bc.C}};
    double *hx = gph_draw(&xi, &r, FG_FP64), *hw = gph_draw(&xi, &r, FG_FP64);
    in[0] = gph_tensor(FG_FP64, FG_DEVICE_CUDA, 3, xs, hx, 1);
    b.w = gph_tensor(FG_FP64, FG_DEVICE_CUDA, 3, xs, hw, 0);
    char what[96];
    snprintf(what, sizeof what,
             "gpu transformer block B %lld T %lld C %lld H %lld%s",
             (long long)bc.B, (long long)bc.T, (long long)bc.C,
             (long long)bc.H, bc.fast ? " (fast)" : "");
    fgt_gradcheck(what, block_fn, &b, in, 13, bc.fast);
    fg_tensor_free(in[0]);
    fg_tensor_free(b.w);
    fg_nn_block_release(&b.blk);
    free(hx);
    free(hw);
}
END_TEST

/* ---- gradcheck's own GPU path ----------------------------------------- */

/* y = tanh(x0) * x1 + x0 */
static fg_status fn_ok(fg_tensor *const *in, int n, fg_tensor **out, void *u)
{
    fg_tensor *t = NULL, *m = NULL;
    fg_status s = fg_tanh(in[0], &t);
    if (s == FG_OK)
        s = fg_mul(t, in[1], &m);
    if (s == FG_OK)
        s = fg_add(m, in[0], out);
    fg_tensor_free(t);
    fg_tensor_free(m);
    return s;
}

/* Hook adding *(double *)u to element 3 of a (GPU) gradient. */
static fg_status corrupt3(fg_tensor *g, fg_tensor **rep, void *u)
{
    const int64_t n = fg_tensor_numel(g);
    double *h = calloc((size_t)n, sizeof(double));
    h[3] = *(double *)u;
    fg_tensor *d = NULL;
    fg_status s = fg_tensor_from_host(FG_FP64, fg_tensor_device(g),
                                      fg_tensor_ndim(g), fg_tensor_shape(g),
                                      h, &d);
    free(h);
    if (s == FG_OK)
        s = fg_add(g, d, rep);
    fg_tensor_free(d);
    return s;
}

START_TEST(test_gradcheck_gpu_inputs)
{
    deterministic();
    fgt_rng r = fgt_rng_for(2200);
    gph_input a = {.nd = 2, .shape = {2, 3}}, b = {.nd = 1, .shape = {3}};
    double *ha = gph_draw(&a, &r, FG_FP64), *hb = gph_draw(&b, &r, FG_FP64);
    fg_tensor *in[2] = {
        gph_tensor(FG_FP64, FG_DEVICE_CUDA, 2, a.shape, ha, 1),
        gph_tensor(FG_FP64, FG_DEVICE_CUDA, 1, b.shape, hb, 1)};
    fg_gradcheck_report rep;
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, NULL, &rep));
    ck_assert_msg(rep.passed, "%s", rep.message);
    ck_assert_int_eq(rep.n_checked, 6 * 9);
    /* Inputs restored bit for bit, .grad untouched. */
    double *a2 = fgt_host(in[0]), *b2 = fgt_host(in[1]);
    ck_assert(memcmp(a2, ha, 6 * sizeof(double)) == 0);
    ck_assert(memcmp(b2, hb, 3 * sizeof(double)) == 0);
    ck_assert_ptr_null(fg_tensor_grad(in[0]));
    ck_assert_ptr_null(fg_tensor_grad(in[1]));
    free(a2);
    free(b2);
    /* Fast mode restores too. */
    fg_gradcheck_options o;
    fg_gradcheck_options_init(&o);
    o.fast_mode = 1;
    o.seed = fgt_base_seed();
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, &o, &rep));
    ck_assert_msg(rep.passed, "%s", rep.message);
    a2 = fgt_host(in[0]);
    ck_assert(memcmp(a2, ha, 6 * sizeof(double)) == 0);
    free(a2);
    /* A wrong gradient in element 3 of input 0 is caught and located. */
    double delta = 1e-2;
    fg_hook *h;
    FGT_OK(fg_tensor_register_hook(in[0], corrupt3, &delta, &h));
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, NULL, &rep));
    ck_assert(!rep.passed);
    ck_assert_int_eq(rep.n_failed, 6);
    ck_assert_int_eq(rep.worst_input, 0);
    ck_assert_int_eq(rep.worst_in_elem, 3);
    FGT_OK(fg_gradcheck(fn_ok, NULL, in, 2, &o, &rep));
    ck_assert(!rep.passed && rep.worst_input == 0);
    fg_hook_remove(h);
    a2 = fgt_host(in[0]);
    ck_assert(memcmp(a2, ha, 6 * sizeof(double)) == 0);
    free(a2);
    fgt_free_all(in, 2);
    free(ha);
    free(hb);
}
END_TEST

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU gradcheck suite\n");
        return 77;
    }
    fgt_base_seed();
    Suite *s = suite_create("gpu_gradcheck");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 900);
    /* Under compute-sanitizer (FG_SANITIZE) only the API test and the
     * smallest block, in fast mode (test_block): thousands of evaluations
     * per case are too slow. */
    const int sanitize = fgt_sanitize_mode() != 0;
    fgt_add_test(tc, test_gradcheck_gpu_inputs);
    if (!sanitize)
        fgt_add_loop(tc, test_op_gradcheck, 0, gph_n_cases);
    fgt_add_loop(tc, test_block, 0,
                 sanitize ? 1
                          : (int)(sizeof blk_cases /
                                  sizeof blk_cases[0]));
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
