/* SPDX-License-Identifier: MIT */
/* tests/test_threads.c - thread safety and thread-count independence:
 * four threads running, concurrently and each on its own data, attention
 * (forward and backward through the raw API, 4 OpenMP threads inside each
 * call), a small autograd graph (matmul, GELU, reshape, fg_attention, mul,
 * sum, backward, in a per-thread arena) and two training steps of a tiny
 * GPT (dropout, AdamW, per-thread arena and generator), give bitwise the
 * results of running the same four jobs one after the other on one
 * thread with 1 OpenMP thread. */
#include <pthread.h>

#include "test_ops_util.h"

enum { WORKERS = 4, ROUNDS = 10 };

/* Raw attention: fp32 with GQA, causal on odd workers, dropout. */
enum { AB = 2, ANQ = 37, ANK = 53, AH = 4, AHK = 2, AD = 32 };
enum { AQ = AB * ANQ * AH * AD, AK = AB * ANK * AHK * AD, AS = AB * AH * ANQ };

/* The graph: x [GR, GC] @ w [GC, GH * GD], GELU, viewed as [1, GR, GH, GD]
 * for q = k = v. */
enum { GR = 12, GC = 16, GH = 2, GD = 8 };

/* The GPT: vocabulary, context, batch, steps; room for its parameters. */
enum { MV = 11, MT = 8, MB = 4, MSTEPS = 2, MPARAMS = 8192 };

typedef struct job {
    int id;
    int threads; /* OpenMP threads inside every call */
    fg_status status;
    char msg[256];
    /* raw attention inputs and outputs */
    float q[AQ], k[AK], v[AK], g[AQ];
    float o[AQ], m[AS], l[AS], dq[AQ], dk[AK], dv[AK];
    /* graph inputs and results */
    double x[GR * GC], w[GC * GH * GD];
    double loss, gx[GR * GC], gw[GC * GH * GD];
    /* GPT tokens, losses and parameters after the steps */
    int64_t tx[MB * MT], ty[MB * MT];
    double step_loss[MSTEPS], params[MPARAMS];
} job;

static void job_init(job *j, int id, int threads)
{
    memset(j, 0, sizeof *j);
    j->id = id;
    j->threads = threads;
    fgt_rng r = fgt_rng_for(500 + (uint64_t)id);
    float *in[] = {j->q, j->k, j->v, j->g};
    const int n[] = {AQ, AK, AK, AQ};
    for (int t = 0; t < 4; t++)
        for (int e = 0; e < n[t]; e++)
            in[t][e] = (float)fgt_uniform(&r);
    fgt_fill(j->x, GR * GC, &r, 1.0);
    fgt_fill(j->w, GC * GH * GD, &r, 0.5);
    for (int e = 0; e < MB * MT; e++) {
        j->tx[e] = fgt_int(&r, 0, MV - 1);
        j->ty[e] = fgt_int(&r, 0, MV - 1);
    }
    float *out[] = {j->o, j->m, j->l, j->dq, j->dk, j->dv};
    const int no[] = {AQ, AS, AS, AQ, AK, AK};
    for (int t = 0; t < 6; t++)
        fgt_poison_f(out[t], (size_t)no[t]);
}

static fg_status run_attention(job *j)
{
    fg_attn_params p;
    fg_attn_params_init(&p, AB, ANQ, ANK, AH, AHK, AD);
    p.causal = j->id & 1;
    p.dropout_p = 0.1;
    p.seed = 1000 + (uint64_t)j->id;
    p.num_threads = j->threads;
    p.block_q = 16;
    p.block_k = 16;
    fg_attn_tensor q = fg_attn_bshd(j->q, FG_FP32, ANQ, AH, AD);
    fg_attn_tensor k = fg_attn_bshd(j->k, FG_FP32, ANK, AHK, AD);
    fg_attn_tensor v = fg_attn_bshd(j->v, FG_FP32, ANK, AHK, AD);
    fg_attn_tensor g = fg_attn_bshd(j->g, FG_FP32, ANQ, AH, AD);
    fg_attn_tensor o = fg_attn_bshd(j->o, FG_FP32, ANQ, AH, AD);
    fg_attn_tensor dq = fg_attn_bshd(j->dq, FG_FP32, ANQ, AH, AD);
    fg_attn_tensor dk = fg_attn_bshd(j->dk, FG_FP32, ANK, AHK, AD);
    fg_attn_tensor dv = fg_attn_bshd(j->dv, FG_FP32, ANK, AHK, AD);
    fg_attn_stats st = {j->m, j->l, FG_FP32};
    FGT_TRY(fg_attention_forward(&p, &q, &k, &v, &o, &st));
    return fg_attention_backward(&p, &q, &k, &v, &o, &g, &st, &dq, &dk, &dv);
}

/* The graph's intermediates come from a per-thread arena; x and w, like
 * parameters, live on the heap. */
static fg_status run_graph(job *j)
{
    const int64_t sx[] = {GR, GC}, sw[] = {GC, GH * GD},
                  sv[] = {1, GR, GH, GD};
    fg_tensor *x = NULL, *w = NULL, *xw, *h, *hv, *o, *oo, *loss;
    fg_arena *a = NULL;
    fg_attention_options opt;
    fg_attention_options_init(&opt);
    opt.causal = 1;
    fg_status s = fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU, 2, sx, j->x, &x);
    if (s == FG_OK)
        s = fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU, 2, sw, j->w, &w);
    if (s == FG_OK)
        s = fg_tensor_set_requires_grad(x, 1);
    if (s == FG_OK)
        s = fg_tensor_set_requires_grad(w, 1);
    if (s == FG_OK)
        s = fg_arena_create(0, &a);
    if (s == FG_OK && (s = fg_arena_push(a)) == FG_OK) {
        if ((s = fg_matmul(x, w, 0, 0, &xw)) == FG_OK &&
            (s = fg_gelu(xw, &h)) == FG_OK &&
            (s = fg_reshape(h, 4, sv, &hv)) == FG_OK &&
            (s = fg_attention(hv, hv, hv, &opt, &o)) == FG_OK &&
            (s = fg_mul(o, hv, &oo)) == FG_OK &&
            (s = fg_sum(oo, NULL, 0, 0, &loss)) == FG_OK &&
            (s = fg_backward(loss)) == FG_OK &&
            (s = fg_tensor_item(loss, &j->loss)) == FG_OK &&
            (s = fg_tensor_copy_to_host(fg_tensor_grad(x), FG_FP64, j->gx,
                                        GR * GC)) == FG_OK)
            s = fg_tensor_copy_to_host(fg_tensor_grad(w), FG_FP64, j->gw,
                                       GC * GH * GD);
        fg_arena_pop(a);
    }
    fg_arena_free(a); /* takes back every intermediate */
    fg_tensor_free(x);
    fg_tensor_free(w);
    return s;
}

/* A tiny GPT with dropout: MSTEPS AdamW steps; the parameters after them
 * as fp64 in j->params. */
static fg_status run_gpt(job *j)
{
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = MV;
    c.ctx = MT;
    c.n_layer = 1;
    c.n_head = 2;
    c.n_embd = 16;
    c.dropout = 0.1;
    fg_gpt *m = NULL;
    fg_adamw *opt = NULL;
    fg_arena *a = NULL;
    fg_status s = fg_gpt_create(&c, 77 + (uint64_t)j->id, &m);
    int n = 0;
    const fg_param *ps = s == FG_OK ? fg_gpt_params(m, &n) : NULL;
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    if (s == FG_OK && fg_gpt_num_params(m) > MPARAMS)
        s = FG_ERR_INVALID_ARGUMENT; /* the test's buffer is too small */
    if (s == FG_OK)
        s = fg_adamw_create(ps, n, &oc, &opt);
    if (s == FG_OK)
        s = fg_arena_create(0, &a);
    fg_generator g;
    fg_generator_init(&g, 900 + (uint64_t)j->id);
    for (int step = 0; step < MSTEPS && s == FG_OK; step++) {
        fg_step_stats st;
        s = fg_gpt_train_step(m, opt, j->tx, j->ty, MB, MT, 1, 1.0, 1e-2, &g,
                              a, &st);
        j->step_loss[step] = st.loss;
    }
    for (int i = 0, off = 0; i < n && s == FG_OK; i++) {
        const int64_t k = fg_tensor_numel(ps[i].tensor);
        s = fg_tensor_copy_to_host(ps[i].tensor, FG_FP64, j->params + off, k);
        off += (int)k;
    }
    fg_arena_free(a);
    fg_adamw_free(opt);
    fg_gpt_free(m);
    return s;
}

static void *run_job(void *arg)
{
    job *j = arg;
    fg_set_num_threads(j->threads); /* this thread's OpenMP team size */
    j->status = run_attention(j);
    if (j->status == FG_OK)
        j->status = run_graph(j);
    if (j->status == FG_OK)
        j->status = run_gpt(j);
    if (j->status != FG_OK) /* the message is thread-local: copy it here */
        snprintf(j->msg, sizeof j->msg, "%s", fg_last_error());
    return NULL;
}

#define SAME(a, b, f) (memcmp((a)->f, (b)->f, sizeof (a)->f) == 0)

START_TEST(test_concurrent_equals_serial)
{
    job *serial = malloc(sizeof(job) * WORKERS);
    job *conc = malloc(sizeof(job) * WORKERS);
    for (int w = 0; w < WORKERS; w++) {
        job_init(&serial[w], w, 1);
        run_job(&serial[w]);
        ck_assert_msg(serial[w].status == FG_OK, "job %d: %s", w,
                      serial[w].msg);
        ck_assert(fgt_all_finite(serial[w].gx, GR * GC));
        ck_assert(fgt_all_finite(serial[w].step_loss, MSTEPS));
        /* the steps trained something */
        ck_assert(serial[w].step_loss[1] != serial[w].step_loss[0]);
    }
    /* The four jobs differ from each other (separate data, masks). */
    ck_assert(!SAME(&serial[0], &serial[1], o));
    for (int round = 0; round < ROUNDS; round++) {
        pthread_t th[WORKERS];
        for (int w = 0; w < WORKERS; w++)
            job_init(&conc[w], w, WORKERS);
        for (int w = 0; w < WORKERS; w++)
            ck_assert(pthread_create(&th[w], NULL, run_job, &conc[w]) == 0);
        for (int w = 0; w < WORKERS; w++)
            ck_assert(pthread_join(th[w], NULL) == 0);
        for (int w = 0; w < WORKERS; w++) {
            const job *a = &serial[w], *b = &conc[w];
            ck_assert_msg(b->status == FG_OK, "round %d job %d: %s", round, w,
                          b->msg);
            ck_assert_msg(SAME(a, b, o) && SAME(a, b, m) && SAME(a, b, l),
                          "round %d job %d: attention forward differs", round,
                          w);
            ck_assert_msg(SAME(a, b, dq) && SAME(a, b, dk) && SAME(a, b, dv),
                          "round %d job %d: attention backward differs",
                          round, w);
            ck_assert_msg(memcmp(&a->loss, &b->loss, sizeof a->loss) == 0 &&
                              SAME(a, b, gx) && SAME(a, b, gw),
                          "round %d job %d: graph differs (loss %.17g vs "
                          "%.17g)", round, w, a->loss, b->loss);
            ck_assert_msg(SAME(a, b, step_loss) && SAME(a, b, params),
                          "round %d job %d: GPT steps differ (loss %.17g vs "
                          "%.17g)", round, w, a->step_loss[1],
                          b->step_loss[1]);
        }
    }
    free(serial);
    free(conc);
}
END_TEST

FGT_MAIN_BEGIN("threads")
FGT_TEST(test_concurrent_equals_serial)
FGT_MAIN_END()
