/* SPDX-License-Identifier: MIT */
/* tests/test_autograd_memory.c - the memory plan: a toy GPT training step
 * (embeddings, a transformer block, tied LM head, cross-entropy, backward,
 * SGD) run inside an arena reset at the start of every step makes no host
 * allocation in the tensor/autograd layer after the first step; it computes
 * the same gradients as the same step on the heap (bit for bit); arena
 * resets release what arena objects held on heap parameters (no leak). */
#include "test_ops_util.h"
#include "test_ops_block.h"

enum { B = 2, T = 16, C = 32, NH = 4, F = 64, V = 50 };

typedef struct model {
    blk_cfg cfg;
    fg_tensor *wte, *wpe, *lnf_w, *lnf_b;
    fg_tensor *blk[BLK_NPARAMS];
    fg_tensor *all[4 + BLK_NPARAMS];
    int n_all;
} model;

static void model_init(model *m, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    blk_cfg c = {C, NH, F, 0.1, 0.1, 0};
    m->cfg = c;
    fg_generator g;
    fg_generator_init(&g, seed);
    FGT_OK(fg_tensor_rand_normal(&g, 0, 0.5, FG_FP32, FG_DEVICE_CPU,
                                 FG_SHAPE(V, C), &m->wte));
    FGT_OK(fg_tensor_rand_normal(&g, 0, 0.1, FG_FP32, FG_DEVICE_CPU,
                                 FG_SHAPE(T, C), &m->wpe));
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(C), &m->lnf_w));
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(C), &m->lnf_b));
    FGT_OK(blk_params(&m->cfg, &g, FG_FP32, m->blk));
    fg_tensor *top[4] = {m->wte, m->wpe, m->lnf_w, m->lnf_b};
    for (int i = 0; i < 4; i++) {
        FGT_OK(fg_tensor_set_requires_grad(top[i], 1));
        m->all[m->n_all++] = top[i];
    }
    for (int i = 0; i < BLK_NPARAMS; i++)
        m->all[m->n_all++] = m->blk[i];
}

/* Forward + backward; returns the loss. Handles are left to the arena
 * (or freed, on the heap). */
static double step(model *m, const int64_t *tok, const int64_t *tgt,
                   const int64_t *pos, uint64_t seed, int free_handles)
{
    fg_tensor *t[8] = {0};
    m->cfg.seed = seed;
    FGT_OK(fg_embedding(m->wte, tok, FG_SHAPE(B, T), &t[0]));
    FGT_OK(fg_embedding(m->wpe, pos, FG_SHAPE(T), &t[1]));
    FGT_OK(fg_add(t[0], t[1], &t[2]));
    FGT_OK(blk_forward(&m->cfg, m->blk, t[2], &t[3]));
    FGT_OK(fg_layernorm(t[3], m->lnf_w, m->lnf_b, 1e-5, &t[4]));
    FGT_OK(fg_matmul(t[4], m->wte, 0, 1, &t[5])); /* tied head */
    FGT_OK(fg_cross_entropy(t[5], tgt, B * T, -1, &t[6]));
    double loss = fgt_item(t[6]);
    FGT_OK(fg_backward(t[6]));
    if (free_handles)
        fgt_free_all(t, 7);
    return loss;
}

static void sgd(model *m, float lr)
{
    for (int i = 0; i < m->n_all; i++) {
        float *w = fg_tensor_data(m->all[i]);
        const float *g = fg_tensor_data(fg_tensor_grad(m->all[i]));
        for (int64_t j = 0; j < fg_tensor_numel(m->all[i]); j++)
            w[j] -= lr * g[j];
    }
    FGT_OK(fg_zero_grad(m->all, m->n_all));
}

static void batch(fgt_rng *r, int64_t *tok, int64_t *tgt, int64_t *pos)
{
    for (int i = 0; i < B * T; i++) {
        tok[i] = fgt_int(r, 0, V - 1);
        tgt[i] = i % 7 == 3 ? -1 : (tok[i] * 3 + 1) % V; /* some ignored */
    }
    for (int i = 0; i < T; i++)
        pos[i] = i;
}

START_TEST(test_steady_state_allocation_free)
{
    fg_memory_stats m0, m1, m2;
    fg_memory_get_stats(&m0);
    fgt_rng r = fgt_rng_for(800);
    int64_t tok[B * T], tgt[B * T], pos[T];
    batch(&r, tok, tgt, pos);
    model m;
    model_init(&m, fgt_next(&r));
    fg_generator drop;
    fg_generator_init(&drop, fgt_next(&r));
    fg_arena *a;
    FGT_OK(fg_arena_create(64 << 10, &a)); /* small: step 1 must grow it */
    double first = 0, last = 0;
    uint64_t chunks = 0;
    for (int it = 0; it < 8; it++) {
        FGT_OK(fg_arena_reset(a));
        if (it == 1) { /* from here on: nothing may be allocated */
            fg_memory_get_stats(&m1);
            fg_arena_stats st;
            FGT_OK(fg_arena_get_stats(a, &st));
            chunks = st.chunk_allocs;
            ck_assert_uint_ge(chunks, 2); /* step 1 had to grow it */
            ck_assert(m1.host_allocs > m0.host_allocs);
        }
        FGT_OK(fg_arena_push(a));
        uint64_t seed, off;
        FGT_OK(fg_generator_next(&drop, &seed, &off));
        double l = step(&m, tok, tgt, pos, seed ^ off, 0);
        FGT_OK(fg_arena_pop(a));
        sgd(&m, 0.05f);
        if (it == 0)
            first = l;
        last = l;
    }
    fg_memory_get_stats(&m2);
    ck_assert_msg(m2.host_allocs == m1.host_allocs,
                  "%llu allocations in steps 2-8",
                  (unsigned long long)(m2.host_allocs - m1.host_allocs));
    ck_assert(m2.host_live_bytes == m1.host_live_bytes);
    fg_arena_stats st;
    FGT_OK(fg_arena_get_stats(a, &st));
    ck_assert_uint_eq(st.chunk_allocs, chunks);
    ck_assert_uint_ge(st.capacity, st.high_water);
    ck_assert_msg(last < first, "loss %g -> %g", first, last);
    /* Reset releases the references arena objects hold on parameters: after
     * freeing the arena and the parameters nothing of ours is left. */
    fg_arena_free(a);
    fgt_free_all(m.all, m.n_all);
    fg_memory_stats mf;
    fg_memory_get_stats(&mf);
    ck_assert_msg(mf.host_live_bytes == m0.host_live_bytes,
                  "%lld bytes still allocated",
                  (long long)(mf.host_live_bytes - m0.host_live_bytes));
}
END_TEST

/* The arena changes where memory comes from, not the numbers. */
START_TEST(test_arena_matches_heap)
{
    fgt_rng r = fgt_rng_for(801);
    int64_t tok[B * T], tgt[B * T], pos[T];
    batch(&r, tok, tgt, pos);
    uint64_t seed = fgt_next(&r);
    model ma, mh;
    model_init(&ma, seed);
    model_init(&mh, seed);
    fg_arena *a;
    FGT_OK(fg_arena_create(0, &a));
    FGT_OK(fg_arena_push(a));
    double la = step(&ma, tok, tgt, pos, 99, 0);
    FGT_OK(fg_arena_pop(a));
    double lh = step(&mh, tok, tgt, pos, 99, 1);
    ck_assert(la == lh);
    for (int i = 0; i < ma.n_all; i++) {
        const fg_tensor *ga = fg_tensor_grad(ma.all[i]),
                        *gh = fg_tensor_grad(mh.all[i]);
        ck_assert(ga && gh);
        ck_assert_msg(memcmp(fg_tensor_data(ga), fg_tensor_data(gh),
                             fg_tensor_nbytes(ga)) == 0,
                      "parameter %d differs", i);
    }
    /* Gradients of heap parameters live on the heap, not in the arena:
     * they survive a reset and the arena reusing its memory. */
    FGT_OK(fg_arena_reset(a));
    FGT_OK(fg_arena_push(a));
    fg_tensor *junk;
    FGT_OK(fg_tensor_full(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(1 << 16), NAN,
                          &junk));
    FGT_OK(fg_arena_pop(a));
    for (int i = 0; i < ma.n_all; i++)
        ck_assert(memcmp(fg_tensor_data(fg_tensor_grad(ma.all[i])),
                         fg_tensor_data(fg_tensor_grad(mh.all[i])),
                         fg_tensor_nbytes(mh.all[i])) == 0);
    fg_arena_free(a);
    fgt_free_all(ma.all, ma.n_all);
    fgt_free_all(mh.all, mh.n_all);
}
END_TEST

/* Freeing a graph early gives its saved tensors back to the arena. */
START_TEST(test_graph_free_in_arena)
{
    fgt_rng r = fgt_rng_for(802);
    fg_tensor *w = fgt_rand(&r, FG_FP32, FG_SHAPE(64, 64), 1, 0, 1);
    fg_arena *a;
    FGT_OK(fg_arena_create(0, &a));
    FGT_OK(fg_arena_push(a));
    fg_tensor *h, *y, *l;
    FGT_OK(fg_matmul(w, w, 0, 0, &h));
    FGT_OK(fg_tanh(h, &y));
    fg_tensor_free(h);
    FGT_OK(fg_sum(y, NULL, 0, 0, &l));
    fg_tensor_free(y);
    fg_arena_stats before, after;
    FGT_OK(fg_arena_get_stats(a, &before));
    FGT_OK(fg_graph_free(l)); /* tanh's saved output is released */
    FGT_OK(fg_arena_get_stats(a, &after));
    ck_assert_uint_lt(after.live_objects, before.live_objects);
    FGT_FAILS(fg_backward(l), FG_ERR_STATE);
    FGT_OK(fg_arena_pop(a));
    fg_arena_free(a);
    fg_tensor_free(w);
}
END_TEST

FGT_MAIN_BEGIN("autograd_memory")
FGT_TEST(test_steady_state_allocation_free)
FGT_TEST(test_arena_matches_heap)
FGT_TEST(test_graph_free_in_arena)
FGT_MAIN_END()
