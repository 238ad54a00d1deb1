/* tests/test_threads.c - thread safety: four threads running attention
 * (forward and backward through the raw API, OpenMP inside each call) and
 * a small autograd graph (matmul, GELU, reshape, fg_attention, mul, sum,
 * backward, in a per-thread arena) concurrently, each on its own data,
 * give bitwise the results of running the same four jobs one after the
 * other on one thread. */
#include <pthread.h>

#include "test_ops_util.h"

enum { WORKERS = 4, ROUNDS = 10 };

/* Raw attention: fp32 with GQA, causal on odd workers, dropout. */
enum { AB = 2, ANQ = 37, ANK = 53, AH = 4, AHK = 2, AD = 32 };
enum { AQ = AB * ANQ * AH * AD, AK = AB * ANK * AHK * AD, AS = AB * AH * ANQ };

/* The graph: x [GR, GC] @ w [GC, GH * GD], GELU, viewed as [1, GR, GH, GD]
 * for q = k = v. */
enum { GR = 12, GC = 16, GH = 2, GD = 8 };

typedef struct job {
    int id;
    fg_status status;
    char msg[256];
    /* raw attention inputs and outputs */
    float q[AQ], k[AK], v[AK], g[AQ];
    float o[AQ], m[AS], l[AS], dq[AQ], dk[AK], dv[AK];
    /* graph inputs and results */
    double x[GR * GC], w[GC * GH * GD];
    double loss, gx[GR * GC], gw[GC * GH * GD];
} job;

static void job_init(job *j, int id)
{
    memset(j, 0, sizeof *j);
    j->id = id;
    fgt_rng r = fgt_rng_for(500 + (uint64_t)id);
    float *in[] = {j->q, j->k, j->v, j->g};
    const int n[] = {AQ, AK, AK, AQ};
    for (int t = 0; t < 4; t++)
        for (int e = 0; e < n[t]; e++)
            in[t][e] = (float)fgt_uniform(&r);
    fgt_fill(j->x, GR * GC, &r, 1.0);
    fgt_fill(j->w, GC * GH * GD, &r, 0.5);
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
    p.num_threads = 2;
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

static void *run_job(void *arg)
{
    job *j = arg;
    j->status = run_attention(j);
    if (j->status == FG_OK)
        j->status = run_graph(j);
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
        job_init(&serial[w], w);
        run_job(&serial[w]);
        ck_assert_msg(serial[w].status == FG_OK, "job %d: %s", w,
                      serial[w].msg);
        ck_assert(fgt_all_finite(serial[w].gx, GR * GC));
    }
    /* The four jobs differ from each other (separate data, masks). */
    ck_assert(!SAME(&serial[0], &serial[1], o));
    for (int round = 0; round < ROUNDS; round++) {
        pthread_t th[WORKERS];
        for (int w = 0; w < WORKERS; w++)
            job_init(&conc[w], w);
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
        }
    }
    free(serial);
    free(conc);
}
END_TEST

FGT_MAIN_BEGIN("threads")
FGT_TEST(test_concurrent_equals_serial)
FGT_MAIN_END()
