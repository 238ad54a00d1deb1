/* SPDX-License-Identifier: MIT */
/* tests/test_dist_dp.c - data parallelism under mpirun: N ranks with B rows
 * each against one process training on the same N * B rows.
 *
 * Guarantees checked (doc/distributed.md):
 *  - bitwise: against one process running the N * B rows as N micro-batches
 *    of B (fg_gpt_train_step, accum = N), for N a power of two with the
 *    fixed-order reduction: fp32 and fp64, buckets started from the hooks
 *    or after the backward, with clipping; ZeRO-1 while clipping does not
 *    trigger;
 *  - within tolerance: against one batch of N * B rows (a different
 *    summation order inside the GEMMs), ZeRO-1 with clipping, gradient
 *    accumulation on the ranks, other N. Tolerances on the parameters,
 *    relative to their largest magnitude, after 3 steps: fp64 1e-12,
 *    fp32 2e-5;
 *  - checkpoints: save after two steps, load into a fresh model and fg_dp,
 *    one more step on both gives the same bits (full and ZeRO-1);
 *  - overlap: with several buckets, some start inside the backward;
 *  - loss scaling: fg_dp_train_step_scaled with power-of-two scales gives
 *    the plain step's bits, every configuration. */
#include "dist_util.h"

enum { STEPS = 3, B = 3 };

typedef struct run_cfg {
    const char *name;
    fg_dtype dt;
    int zero1, overlap, accum;
    double clip;
    int bitwise;    /* vs the micro-batch reference */
    size_t bucket;  /* bytes */
} run_cfg;

static fg_sort_task task = {6, 8};

static fg_gpt *model(fg_dtype dt)
{
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = fg_sort_task_vocab(&task);
    c.ctx = fg_sort_task_seqlen(&task);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.dtype = dt;
    fg_gpt *m = NULL;
    FGD_OK(fg_gpt_create(&c, 1234, &m));
    return m;
}

/* The global batch of a step: N * accum * B rows, the same on every rank. */
static void batch(int step, int rows, int64_t *x, int64_t *y)
{
    uint64_t rng = 77 + (uint64_t)step * 1000003u;
    FGD_OK(fg_sort_task_batch(&task, 0, &rng, rows, x, y));
}

static double params_err(const fg_gpt *a, const fg_gpt *b, int *identical)
{
    int n;
    const fg_param *pa = fg_gpt_params(a, &n), *pb = fg_gpt_params(b, &n);
    double num = 0, den = 1e-30;
    *identical = 1;
    for (int i = 0; i < n; i++) {
        const int64_t k = fg_tensor_numel(pa[i].tensor);
        const fg_dtype dt = fg_tensor_dtype(pa[i].tensor);
        const void *x = fg_tensor_data(pa[i].tensor), *y =
                                                          fg_tensor_data(pb[i].tensor);
        *identical &= memcmp(x, y, (size_t)k * fg_dtype_size(dt)) == 0;
        for (int64_t j = 0; j < k; j++) {
            const double u = dt == FG_FP64 ? ((const double *)x)[j]
                                           : ((const float *)x)[j];
            const double v = dt == FG_FP64 ? ((const double *)y)[j]
                                           : ((const float *)y)[j];
            num = fmax(num, fabs(u - v));
            den = fmax(den, fabs(v));
        }
    }
    return num / den;
}

static void check_close(const fg_gpt *dp, const fg_gpt *ref, fg_dtype dt,
                        int bitwise, const char *what, const char *name)
{
    int same = 0;
    const double e = params_err(dp, ref, &same);
    const double tol = dt == FG_FP64 ? 1e-12 : 2e-5;
    if (bitwise)
        FGD_CHECK(same, "%s: parameters differ from %s (max rel %.3g), "
                  "expected bitwise equality", name, what, e);
    FGD_CHECK(e <= tol, "%s: parameters vs %s: rel error %.3g > %.3g", name,
              what, e, tol);
    if (fgd_rank == 0 && getenv("FG_TEST_VERBOSE"))
        printf("  %-28s vs %-22s rel %.3g%s\n", name, what, e,
               same ? " (bitwise)" : "");
}

static void run(fg_comm *c, const run_cfg *rc)
{
    const int N = fgd_size, A = rc->accum;
    const int64_t T = fg_sort_task_seqlen(&task);
    const int rows = N * A * B;
    int64_t *x = malloc(sizeof(int64_t) * (size_t)(rows * T));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)(rows * T));
    /* rank r's rows: micro-batches r * A .. r * A + A - 1 */
    const int64_t *xr = x + (int64_t)fgd_rank * A * B * T;
    const int64_t *yr = y + (int64_t)fgd_rank * A * B * T;

    fg_gpt *m = model(rc->dt), *micro = model(rc->dt), *big = model(rc->dt);
    fg_gpt *sm = model(rc->dt); /* the loss-scaled step's */
    fg_dp_config dc;
    fg_dp_config_init(&dc);
    dc.zero1 = rc->zero1;
    dc.overlap = rc->overlap;
    dc.bucket_bytes = rc->bucket;
    dc.adamw.lr = 1e-3;
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    fg_dp *dp = NULL, *dps = NULL;
    FGD_OK(fg_dp_create(c, ps, n, &dc, &dp));
    FGD_OK(fg_dp_create(c, fg_gpt_params(sm, &n), n, &dc, &dps));
    fg_grad_scaler sc;
    fg_grad_scaler_init(&sc);
    sc.growth_interval = 1; /* a new power of two every step */
    fg_adamw *om = NULL, *ob = NULL;
    const fg_param *pm = fg_gpt_params(micro, &n);
    FGD_OK(fg_adamw_create(pm, n, &dc.adamw, &om));
    const fg_param *pg = fg_gpt_params(big, &n);
    FGD_OK(fg_adamw_create(pg, n, &dc.adamw, &ob));
    fg_generator g1, g2, g3, g4;
    fg_generator_init(&g1, 5);
    g2 = g3 = g4 = g1;
    double loss_dp = 0, loss_ref = 0;
    for (int s = 0; s < STEPS; s++) {
        batch(s, rows, x, y);
        fg_step_stats st, sr;
        FGD_OK(fg_dp_train_step(dp, m, xr, yr, B, T, A, rc->clip, -1, &g1,
                                NULL, &st));
        fg_step_stats ss;
        FGD_OK(fg_dp_train_step_scaled(dps, sm, xr, yr, B, T, A, rc->clip, -1,
                                       &g4, NULL, &sc, &ss));
        FGD_CHECK(ss.loss == st.loss && ss.grad_norm == st.grad_norm,
                  "%s: loss-scaled step: loss %.17g vs %.17g, norm %.17g vs "
                  "%.17g", rc->name, ss.loss, st.loss, ss.grad_norm,
                  st.grad_norm);
        FGD_OK(fg_gpt_train_step(micro, om, x, y, B, T, N * A, rc->clip, -1,
                                 &g2, NULL, &sr));
        FGD_OK(fg_gpt_train_step(big, ob, x, y, rows, T, 1, rc->clip, -1, &g3,
                                 NULL, NULL));
        loss_dp = st.loss;
        loss_ref = sr.loss;
    }
    FGD_CHECK(fabs(loss_dp - loss_ref) <= 1e-6 * fabs(loss_ref),
              "%s: loss %.9g vs %.9g", rc->name, loss_dp, loss_ref);
    check_close(m, micro, rc->dt, rc->bitwise, "N micro-batches", rc->name);
    check_close(m, big, rc->dt, 0, "one batch of N*B", rc->name);
    /* power-of-two scales: the same bits as without */
    check_close(sm, m, rc->dt, 1, "the loss-scaled step", rc->name);
    FGD_CHECK(sc.scale == 65536.0 * (1 << STEPS) && sc.skipped == 0,
              "%s: scale %g, %lld skipped", rc->name, sc.scale,
              (long long)sc.skipped);

    fg_dp_stats ds;
    FGD_OK(fg_dp_get_stats(dp, &ds));
    FGD_CHECK(ds.steps == STEPS, "%s: %lld synchronised backwards", rc->name,
              (long long)ds.steps);
    if (rc->overlap && ds.buckets > 1)
        FGD_CHECK(ds.started_in_backward > 0, "%s: %d buckets, none started "
                  "during the backward", rc->name, ds.buckets);
    if (!rc->overlap)
        FGD_CHECK(ds.started_in_backward == 0, "%s: overlap off", rc->name);
    if (rc->zero1 && N > 1)
        FGD_CHECK(ds.shard_elements < fg_gpt_num_params(m),
                  "%s: shard of %lld of %lld elements", rc->name,
                  (long long)ds.shard_elements,
                  (long long)fg_gpt_num_params(m));
    fg_dp_free(dp);
    fg_dp_free(dps);
    fg_gpt_free(sm);
    fg_adamw_free(om);
    fg_adamw_free(ob);
    fg_gpt_free(m);
    fg_gpt_free(micro);
    fg_gpt_free(big);
    free(x);
    free(y);
}

/* Save after 2 steps, resume in a fresh model: step 3 matches bitwise. */
static void test_checkpoint(fg_comm *c, int zero1)
{
    const int64_t T = fg_sort_task_seqlen(&task);
    const int rows = fgd_size * B;
    int64_t *x = malloc(sizeof(int64_t) * (size_t)(rows * T));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)(rows * T));
    const int64_t *xr = x + (int64_t)fgd_rank * B * T;
    const int64_t *yr = y + (int64_t)fgd_rank * B * T;
    double tag = fgd_rank == 0 ? (double)getpid() : 0;
    FGD_OK(fg_comm_allreduce(c, &tag, &tag, 1, FG_FP64, FG_REDUCE_SUM));
    char path[256];
    snprintf(path, sizeof path, "/tmp/fg-dist-ckpt-%.0f-%d.bin", tag, zero1);

    fg_dp_config dc;
    fg_dp_config_init(&dc);
    dc.zero1 = zero1;
    dc.bucket_bytes = 16384;
    int n;
    fg_gpt *a = model(FG_FP32);
    fg_dp *da = NULL;
    const fg_param *pa = fg_gpt_params(a, &n);
    FGD_OK(fg_dp_create(c, pa, n, &dc, &da));
    fg_generator g;
    fg_generator_init(&g, 9);
    fg_train_state st = {0};
    /* Flags: step 0 carries rank r's bit r + 1 (rank 0: none), step 1
     * none; every rank sees the OR of the others' after step 0, 0 after
     * step 1 (the step clears what it sent). */
    FGD_CHECK(fg_dp_flags(da) == 0, "flags before the first step: 0x%x",
              fg_dp_flags(da));
    for (int s = 0; s < 2; s++) {
        batch(100 + s, rows, x, y);
        if (s == 0 && fgd_rank > 0)
            FGD_OK(fg_dp_set_flags(da, 1u << (fgd_rank % 8)));
        FGD_OK(fg_dp_train_step(da, a, xr, yr, B, T, 1, 1.0, -1, &g, NULL,
                                NULL));
        unsigned want = 0;
        for (int r = 1; s == 0 && r < fgd_size; r++)
            want |= 1u << (r % 8);
        FGD_CHECK(fg_dp_flags(da) == want, "flags after step %d: 0x%x, want "
                  "0x%x", s, fg_dp_flags(da), want);
    }
    FGD_CHECK(fg_dp_set_flags(da, 1u << 8) == FG_ERR_INVALID_ARGUMENT,
              "flag bit 8");
    FGD_CHECK(fg_dp_set_flags(NULL, 1) == FG_ERR_INVALID_ARGUMENT,
              "NULL dp flags");
    FGD_CHECK(fg_dp_flags(NULL) == 0, "NULL dp flags read");
    st.step = 2;
    st.rng = g;
    FGD_OK(fg_dp_checkpoint_save(da, path, a, &st, "dist test"));

    fg_gpt *b = model(FG_FP32); /* same init: must be overwritten anyway */
    fg_dp *db = NULL;
    const fg_param *pb = fg_gpt_params(b, &n);
    FGD_OK(fg_dp_create(c, pb, n, &dc, &db));
    fg_train_state sb = {0};
    FGD_OK(fg_dp_checkpoint_load(db, path, b, &sb));
    FGD_CHECK(sb.step == 2, "resumed at step %lld", (long long)sb.step);
    batch(102, rows, x, y);
    FGD_OK(fg_dp_train_step(da, a, xr, yr, B, T, 1, 1.0, -1, &g, NULL, NULL));
    FGD_OK(fg_dp_train_step(db, b, xr, yr, B, T, 1, 1.0, -1, &sb.rng, NULL,
                            NULL));
    int same = 0;
    const double e = params_err(b, a, &same);
    FGD_CHECK(same, "checkpoint%s: resumed run differs (rel %.3g)",
              zero1 ? " (ZeRO-1)" : "", e);
    FGD_OK(fg_comm_barrier(c));
    if (fgd_rank == 0)
        remove(path);
    fg_dp_free(da);
    fg_dp_free(db);
    fg_gpt_free(a);
    fg_gpt_free(b);
    free(x);
    free(y);
}

static void test_errors(fg_comm *c)
{
    fg_gpt *m = model(FG_FP32);
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    fg_dp *dp = (fg_dp *)1;
    FGD_CHECK(fg_dp_create(NULL, ps, n, NULL, &dp) == FG_ERR_INVALID_ARGUMENT,
              "NULL comm");
    fg_param twice[2] = {ps[0], ps[0]};
    FGD_CHECK(fg_dp_create(c, twice, 2, NULL, &dp) ==
                  FG_ERR_INVALID_ARGUMENT &&
                  strstr(fg_last_error(), "twice"),
              "duplicate parameter: %s", fg_last_error());
    FGD_CHECK(dp == NULL, "dp untouched-or-NULL on failure");
    /* a model that is not the fg_dp's */
    FGD_OK(fg_dp_create(c, ps, n, NULL, &dp));
    fg_gpt *other = model(FG_FP32);
    int64_t x[64] = {0}, y[64] = {0};
    FGD_CHECK(fg_dp_train_step(dp, other, x, y, 1, 8, 1, 0, -1, NULL, NULL,
                               NULL) == FG_ERR_INVALID_ARGUMENT,
              "foreign model");
    fg_dp_free(dp);
    fg_gpt_free(other);
    fg_gpt_free(m);
}

int main(int argc, char **argv)
{
    fg_comm *c = fgd_init(&argc, &argv, 100);
    const int pow2 = (fgd_size & (fgd_size - 1)) == 0;
    const run_cfg runs[] = {
        {"fp64 overlap", FG_FP64, 0, 1, 1, 1.0, pow2, 8192},
        {"fp32 overlap", FG_FP32, 0, 1, 1, 1.0, pow2, 8192},
        {"fp32 after backward", FG_FP32, 0, 0, 1, 1.0, pow2, 8192},
        {"fp32 one bucket", FG_FP32, 0, 1, 1, 1.0, pow2, 0},
        {"fp32 zero1 no clip", FG_FP32, 1, 1, 1, 0, pow2, 8192},
        {"fp64 zero1 no clip", FG_FP64, 1, 1, 1, 0, pow2, 4096},
        {"fp32 zero1 clip", FG_FP32, 1, 1, 1, 0.05, 0, 8192},
        {"fp32 accum 2", FG_FP32, 0, 1, 2, 1.0, 0, 8192},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++)
        run(c, &runs[i]);
    test_checkpoint(c, 0);
    test_checkpoint(c, 1);
    test_errors(c);
    return fgd_finish(c, "test_dist_dp");
}
