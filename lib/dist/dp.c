/* SPDX-License-Identifier: MIT */
/* lib/dist/dp.c - data parallelism (dist.h): the flat gradient buffer and
 * its buckets, the post-accumulate hooks that start each bucket's
 * reduction during the backward, ZeRO-1 (AdamW over this rank's slices of
 * every bucket, then the parameters' all-gather) and the data-parallel
 * train step (checkpoints: dp_checkpoint.c).
 *
 * Layout. Parameters are laid out in the flat buffer in reverse order (the
 * backward produces the last layers' gradients first) and grouped into
 * buckets of about bucket_bytes (whole parameters; a larger one is a bucket
 * of its own). With ZeRO-1 each bucket is padded to a multiple of the
 * ranks and rank r owns its r-th slice. Every parameter's .grad is a view
 * of its place, so the backward accumulates straight into the buffer and
 * the all-reduce needs no copies.
 *
 * Order. Buckets are started strictly in index order (bucket i + 1 only
 * after i), whatever order the hooks complete them in, so every rank issues
 * the same collectives in the same order, as MPI and NCCL require. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "comm_internal.h"
#include "dist_internal.h"
#include "dp_internal.h"
#include "lib/autograd/tensor_internal.h"
#include "lib/core/error.h"
#include "lib/train/train_internal.h"

void fg_dp_config_init(fg_dp_config *c)
{
    if (!c)
        return;
    memset(c, 0, sizeof *c);
    c->bucket_bytes = 0; /* the backend's: fg_dp_create */
    c->overlap = 1;
    fg_adamw_config_init(&c->adamw);
}

/* ---- buckets ------------------------------------------------------------------- */

static fg_status launch(fg_dp *dp, dp_bucket *b)
{
    char *p = dp->gbase + (size_t)b->off * dp->es;
    if (dp->cfg.zero1) {
        char *mine = p + (size_t)(dp->comm->rank * b->chunk) * dp->es;
        return fg_comm_ireduce_scatter(dp->comm, p, mine, (size_t)b->chunk,
                                       dp->dt, FG_REDUCE_AVG, &b->req);
    }
    return fg_comm_iallreduce(dp->comm, p, p, (size_t)b->len, dp->dt,
                              FG_REDUCE_AVG, &b->req);
}

/* Starts every bucket that is complete and next in line. */
static fg_status launch_ready(fg_dp *dp, int from_hook)
{
    while (dp->next_launch < dp->nb && dp->bk[dp->next_launch].pending == 0) {
        FG_TRY(launch(dp, &dp->bk[dp->next_launch]));
        dp->next_launch++;
        dp->started_in_backward += from_hook;
    }
    return FG_OK;
}

/* Lets MPI advance the reductions in flight (it progresses inside calls,
 * and a request's second phase starts from its own test). NCCL progresses
 * on the GPU by itself: testing there would only cost an event query per
 * bucket in flight at every hook, quadratic in the buckets per step. */
static fg_status poll(fg_dp *dp)
{
    if (fg_comm_get_backend(dp->comm) == FG_COMM_NCCL)
        return FG_OK;
    for (int i = 0; i < dp->next_launch; i++) {
        dp_bucket *b = &dp->bk[i];
        if (b->req && !b->done)
            FG_TRY(fg_comm_test(b->req, &b->done));
    }
    return FG_OK;
}

static fg_status dp_hook(fg_tensor *leaf, void *user)
{
    dp_param *e = user;
    fg_dp *dp = e->dp;
    if (!dp->armed)
        return FG_OK;
    if (leaf->grad != e->view)
        return fg_error(FG_ERR_STATE,
                        "data parallel: the gradient of %s was replaced "
                        "(fg_tensor_clear_grad?); zero it with "
                        "fg_dp_zero_grad", dp->params[e - dp->ps].name);
    if (e->ready_epoch == dp->epoch)
        return FG_OK;
    e->ready_epoch = dp->epoch;
    if (--dp->bk[e->bucket].pending == 0 && dp->cfg.overlap)
        FG_TRY(launch_ready(dp, 1));
    return poll(dp);
}

static void reset_pending(fg_dp *dp)
{
    for (int i = 0; i < dp->nb; i++) {
        dp->bk[i].pending = dp->bk[i].nparams;
        dp->bk[i].done = 0;
    }
    dp->next_launch = 0;
    dp->armed = 0;
    dp->epoch++;
}

/* No reduction in flight (between fg_dp_finish_backward and the next
 * synchronising backward). */
static fg_status check_idle(const fg_dp *dp, const char *fn)
{
    if (!dp)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: NULL dp", fn);
    if (dp->next_launch > 0)
        return fg_error(FG_ERR_STATE, "%s: reductions are in flight: call "
                        "fg_dp_finish_backward first", fn);
    return FG_OK;
}

fg_status fg_dp_set_sync(fg_dp *dp, int sync)
{
    FG_TRY(check_idle(dp, __func__));
    dp->armed = sync != 0;
    return FG_OK;
}

fg_status fg_dp_finish_backward(fg_dp *dp)
{
    if (!dp)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL dp");
    fg_status s = FG_OK;
    /* Buckets whose parameters got no gradient (or all of them, without
     * a synchronising backward) start now, in order. */
    for (int i = 0; i < dp->nb; i++)
        dp->bk[i].pending = 0;
    s = launch_ready(dp, 0);
    for (int i = 0; i < dp->nb; i++) {
        fg_status w = fg_comm_wait(dp->bk[i].req); /* NULL-safe */
        dp->bk[i].req = NULL;
        if (s == FG_OK)
            s = w;
    }
    reset_pending(dp);
    dp->steps++;
    return s;
}

/* ---- creation ---------------------------------------------------------------------- */

static fg_status check_params(fg_comm *comm, const fg_param *params, int n,
                              fg_dtype *dt)
{
    for (int i = 0; i < n; i++) {
        fg_tensor *t = params[i].tensor;
        if (!t)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "parameter %d is NULL", i);
        const fg_dtype d = fg_tensor_dtype(t);
        if (i == 0)
            *dt = d;
        if ((d != FG_FP32 && d != FG_FP64) || d != *dt)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "parameters must all be fp32 or all fp64 (%s is "
                           "%s)", params[i].name, fg_dtype_name(d));
        if (fg_tensor_device(t) != comm->device)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "parameter %s is on %s but the communicator (%s) "
                           "moves %s buffers", params[i].name,
                           fg_device_name(fg_tensor_device(t)),
                           comm->backend == FG_COMM_MPI ? "MPI" : "NCCL",
                           fg_device_name(comm->device));
        if (!fg_tensor_is_contiguous(t) || !t->requires_grad ||
            t->grad_fn)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "parameter %s must be a contiguous leaf requiring "
                           "grad", params[i].name);
        for (int j = 0; j < i; j++)
            if (params[j].tensor == t)
                return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                               "parameter %s is listed twice", params[i].name);
    }
    return FG_OK;
}

/* MPI on the CPU: small buckets overlap more of the backward. NCCL: an
 * eighth of the gradients within 25 MiB (PyTorch DDP's size) .. 64 MiB.
 * On two H200s (session 38) 25 MiB trained the baby GPT (43 MB of
 * gradients) 1.97-1.98x as fast as one GPU (64 MiB 1.95-1.96x) and
 * GPT-2-small (497 MB) 1.84-1.89x, where 64 MiB gave 1.89-1.93x: fewer,
 * larger collectives beside its longer kernels (doc/distributed.md). */
static size_t default_bucket_bytes(const fg_dp *dp)
{
    if (dp->comm->backend != FG_COMM_NCCL)
        return (size_t)4 << 20;
    size_t total = 0;
    for (int i = 0; i < dp->n; i++)
        total += (size_t)dp->ps[i].numel * dp->es;
    const size_t lo = (size_t)25 << 20, hi = (size_t)64 << 20;
    return total / 8 < lo ? lo : total / 8 > hi ? hi : total / 8;
}

/* Buckets over the parameters in reverse order. */
static fg_status plan(fg_dp *dp)
{
    const int N = dp->comm->size;
    const int64_t cap = (int64_t)(dp->cfg.bucket_bytes / dp->es) > 0
                            ? (int64_t)(dp->cfg.bucket_bytes / dp->es)
                            : 1;
    dp->bk = calloc((size_t)dp->n, sizeof *dp->bk);
    if (!dp->bk)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "buckets");
    int64_t off = 0;
    dp_bucket *b = NULL;
    for (int i = dp->n - 1; i >= 0; i--) {
        dp_param *p = &dp->ps[i];
        if (!b || b->len >= cap) {
            if (b) {
                b->padded = dp->cfg.zero1 ? (b->len + N - 1) / N * N : b->len;
                b->chunk = b->padded / N;
                off += b->padded;
            }
            b = &dp->bk[dp->nb++];
            b->off = off;
        }
        p->bucket = (int)(b - dp->bk);
        p->flat = b->off + b->len;
        b->len += p->numel;
        b->nparams++;
    }
    b->padded = dp->cfg.zero1 ? (b->len + N - 1) / N * N : b->len;
    b->chunk = b->padded / N;
    dp->total = off + b->padded;
    return FG_OK;
}

/* Each parameter's .grad becomes a view of its place in the buffer (an
 * existing gradient is copied in). */
static fg_status install_views(fg_dp *dp)
{
    for (int i = 0; i < dp->n; i++) {
        dp_param *p = &dp->ps[i];
        fg_tensor *t = p->t;
        int64_t stride[FG_MAX_DIMS];
        fg_contiguous_strides(t->nd, t->shape, stride);
        fg_tensor *v = NULL;
        FG_TRY(fg_tensor_view_new(NULL, dp->gflat, t->nd, t->shape, stride,
                                  dp->gflat->offset + p->flat, &v));
        if (t->grad) {
            fg_status s = fg_tensor_copy(v, t->grad);
            if (s != FG_OK) {
                fg_tensor_free(v);
                return s;
            }
            fg_tensor_free(t->grad);
        }
        t->grad = v;
        p->view = v;
    }
    return FG_OK;
}

/* ZeRO-1: the pieces of parameters inside this rank's slice of each
 * bucket, as 1-D parameter views whose .grad views the buffer, and AdamW
 * over them (moments for those elements only). */
static fg_status make_shard(fg_dp *dp)
{
    const int r = dp->comm->rank;
    int cap = dp->n + dp->nb;
    dp->seg = calloc((size_t)cap, sizeof *dp->seg);
    dp->segp = calloc((size_t)cap, sizeof *dp->segp);
    if (!dp->seg || !dp->segp)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "shard");
    for (int i = 0; i < dp->n; i++) {
        const dp_param *p = &dp->ps[i];
        const dp_bucket *b = &dp->bk[p->bucket];
        const int64_t lo = b->off + r * b->chunk, hi = lo + b->chunk;
        const int64_t a = p->flat > lo ? p->flat : lo;
        const int64_t e = p->flat + p->numel < hi ? p->flat + p->numel : hi;
        if (a >= e)
            continue;
        dp_seg *s = &dp->seg[dp->nseg];
        s->param = i;
        s->flat = a;
        s->poff = a - p->flat;
        s->len = e - a;
        dp->shard_elements += s->len;
        fg_param *q = &dp->segp[dp->nseg++];
        *q = dp->params[i];
        FG_TRY(fg_tensor_view_new(NULL, p->t, FG_SHAPE(s->len),
                                  (const int64_t[]){1},
                                  p->t->offset + s->poff, &q->tensor));
        q->tensor->requires_grad = 1;
        FG_TRY(fg_tensor_view_new(NULL, dp->gflat, FG_SHAPE(s->len),
                                  (const int64_t[]){1},
                                  dp->gflat->offset + s->flat,
                                  &q->tensor->grad));
    }
    if (dp->nseg == 0)
        return FG_OK; /* more ranks than elements: nothing to update */
    return fg_adamw_create(dp->segp, dp->nseg, &dp->cfg.adamw, &dp->opt);
}

fg_status fg_dp_create(fg_comm *comm, const fg_param *params, int n,
                       const fg_dp_config *c, fg_dp **out)
{
    if (!comm || !params || n < 1 || !out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "need a communicator, n >= 1 "
                       "parameters and out");
    *out = NULL;
    fg_dp_config def;
    fg_dp_config_init(&def);
    if (!c)
        c = &def;
    if (comm->backend == FG_COMM_NCCL && fg_comm_get_stream(comm))
        return FG_FAIL(FG_ERR_UNSUPPORTED, "a communicator of one of several "
                       "GPUs driven by one process (one GPU per process, "
                       "please)");
    fg_dtype dt = FG_FP32;
    FG_TRY(check_params(comm, params, n, &dt));
    fg_dp *dp = calloc(1, sizeof *dp);
    if (!dp)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "fg_dp");
    dp->comm = comm;
    dp->cfg = *c;
    dp->n = n;
    dp->dt = dt;
    dp->dev = comm->device;
    dp->es = fg_dtype_size(dt);
    dp->ps = calloc((size_t)n, sizeof *dp->ps);
    dp->params = calloc((size_t)n, sizeof *dp->params);
    fg_status s = dp->ps && dp->params
                      ? FG_OK
                      : FG_FAIL(FG_ERR_OUT_OF_MEMORY, "fg_dp");
    for (int i = 0; s == FG_OK && i < n; i++) {
        dp->params[i] = params[i];
        dp->ps[i].dp = dp;
        dp->ps[i].t = fg_tensor_retain(params[i].tensor);
        dp->ps[i].numel = fg_tensor_numel(params[i].tensor);
    }
    if (s == FG_OK && dp->cfg.bucket_bytes == 0)
        dp->cfg.bucket_bytes = default_bucket_bytes(dp);
    if (s == FG_OK)
        s = plan(dp);
    /* Parameters and optimizer state live on the heap. */
    int pushed = s == FG_OK && fg_arena_push(NULL) == FG_OK;
    if (s == FG_OK && !pushed)
        s = FG_FAIL(FG_ERR_STATE, "arena stack full");
    if (s == FG_OK)
        s = fg_tensor_zeros(dt, dp->dev, FG_SHAPE(dp->total), &dp->gflat);
    if (s == FG_OK) {
        dp->gbase = fg_tensor_data(dp->gflat);
        s = install_views(dp);
    }
    /* Every rank starts from rank 0's values. */
    for (int i = 0; s == FG_OK && i < n; i++) {
        s = fg_comm_broadcast(comm, fg_tensor_data(dp->ps[i].t),
                              (size_t)dp->ps[i].numel, dt, 0);
        fg_tensor_bump_version(dp->ps[i].t); /* stales an autocast copy */
    }
    if (s == FG_OK && dp->cfg.zero1)
        s = make_shard(dp);
    else if (s == FG_OK)
        s = fg_adamw_create(dp->params, n, &dp->cfg.adamw, &dp->opt);
    if (pushed)
        fg_arena_pop(NULL);
    for (int i = 0; s == FG_OK && i < n; i++)
        s = fg_tensor_register_post_accumulate_hook(dp->ps[i].t, dp_hook,
                                                    &dp->ps[i],
                                                    &dp->ps[i].hook);
    if (s != FG_OK) {
        fg_dp_free(dp);
        return s;
    }
    reset_pending(dp);
    *out = dp;
    return FG_OK;
}

void fg_dp_free(fg_dp *dp)
{
    if (!dp)
        return;
    for (int i = 0; i < dp->nb; i++)
        fg_comm_wait(dp->bk[i].req);
    for (int i = 0; dp->ps && i < dp->n; i++) {
        fg_hook_remove(dp->ps[i].hook);
        fg_tensor_free(dp->ps[i].t);
    }
    fg_adamw_free(dp->opt);
    for (int i = 0; dp->segp && i < dp->nseg; i++)
        fg_tensor_free(dp->segp[i].tensor); /* frees its .grad view */
    fg_tensor_free(dp->gflat);
    free(dp->ps);
    free(dp->params);
    free(dp->bk);
    free(dp->seg);
    free(dp->segp);
    free(dp);
}

/* ---- clipping, step ------------------------------------------------------------- */

/* fg_dp_clip_grad_norm on gradients that hold 1 / inv times the true
 * ones (inv 1: none); skip: a global norm that is not finite leaves them
 * as they are and sets *skipped, on every rank alike. */
static fg_status clip_unscale(fg_dp *dp, double max_norm, double inv,
                              int skip, double *norm, int *skipped)
{
    *skipped = 0;
    if (!dp)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL dp");
    if (!dp->cfg.zero1) /* every rank holds the same averaged gradients */
        return skip ? fg_clip_grad_unscale(dp->params, dp->n, max_norm, inv,
                                           norm, skipped)
                    : fg_clip_grad_norm(dp->params, dp->n, max_norm, norm);
    if (isnan(max_norm))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "max_norm is NaN");
    /* ZeRO-1: the sum of squares of the slices, summed over the ranks. */
    double ss = 0;
    if (dp->nseg > 0) {
        double local = 0;
        FG_TRY(fg_clip_grad_norm(dp->segp, dp->nseg, 0, &local));
        ss = local * local;
    }
    FG_TRY(fg_comm_allreduce_host_f64(dp->comm, &ss, 1, FG_REDUCE_SUM));
    const double total = sqrt(ss) * inv;
    if (norm)
        *norm = total;
    if (skip && !isfinite(total)) {
        *skipped = 1;
        return FG_OK;
    }
    const double k = fg_clip_factor(total, max_norm, inv);
    if (k != 1.0) {
        fg_no_grad_begin();
        fg_status s = FG_OK;
        for (int i = 0; s == FG_OK && i < dp->nseg; i++) {
            fg_tensor *g = dp->segp[i].tensor->grad, *scaled = NULL;
            s = fg_scale(g, k, &scaled);
            if (s == FG_OK)
                s = fg_tensor_copy(g, scaled);
            fg_tensor_free(scaled);
        }
        fg_no_grad_end();
        FG_TRY(s);
    }
    return FG_OK;
}

fg_status fg_dp_clip_grad_norm(fg_dp *dp, double max_norm, double *norm)
{
    int skipped;
    return clip_unscale(dp, max_norm, 1.0, 0, norm, &skipped);
}

fg_status fg_dp_zero_grad(fg_dp *dp)
{
    if (!dp)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL dp");
    return fg_tensor_fill(dp->gflat, 0.0);
}

/* ZeRO-1 after the slices' update: this rank's slices go into the buffer,
 * each bucket is all-gathered in place, every parameter is copied out. */
static fg_status gather_params(fg_dp *dp)
{
    for (int i = 0; i < dp->nseg; i++) {
        const dp_seg *s = &dp->seg[i];
        const char *src = (const char *)fg_tensor_data(dp->ps[s->param].t) +
                          (size_t)s->poff * dp->es;
        FG_TRY(fg_dist_copy(dp->dev, dp->gbase + (size_t)s->flat * dp->es, src,
                            (size_t)s->len * dp->es));
    }
    fg_status s = FG_OK;
    for (int i = 0; i < dp->nb && s == FG_OK; i++) {
        dp_bucket *b = &dp->bk[i];
        char *p = dp->gbase + (size_t)b->off * dp->es;
        s = fg_comm_iallgather(dp->comm,
                               p + (size_t)(dp->comm->rank * b->chunk) *
                                       dp->es,
                               p, (size_t)b->chunk, dp->dt, &b->req);
    }
    for (int i = 0; i < dp->nb; i++) {
        fg_status w = fg_comm_wait(dp->bk[i].req);
        dp->bk[i].req = NULL;
        if (s == FG_OK)
            s = w;
    }
    for (int i = 0; s == FG_OK && i < dp->n; i++) {
        s = fg_dist_copy(dp->dev, fg_tensor_data(dp->ps[i].t),
                         dp->gbase + (size_t)dp->ps[i].flat * dp->es,
                         (size_t)dp->ps[i].numel * dp->es);
        fg_tensor_bump_version(dp->ps[i].t); /* stales an autocast copy */
    }
    if (s == FG_OK)
        s = fg_dp_zero_grad(dp);
    return s;
}

fg_status fg_dp_step(fg_dp *dp, double lr)
{
    FG_TRY(check_idle(dp, __func__));
    if (dp->opt)
        FG_TRY(fg_adamw_step(dp->opt, lr));
    dp->opt_steps++;
    if (dp->cfg.zero1)
        return gather_params(dp);
    return FG_OK;
}

fg_adamw *fg_dp_optimizer(const fg_dp *dp) { return dp ? dp->opt : NULL; }

/* ---- the train step ----------------------------------------------------------------- */

/* Only the last micro-batch's backward synchronises. */
static fg_status before_backward(void *user, int micro, int accum)
{
    return fg_dp_set_sync(user, micro == accum - 1);
}

fg_status fg_dp_check_model(const fg_dp *dp, const fg_gpt *m)
{
    int n = 0;
    const fg_param *ps = fg_gpt_params(m, &n);
    if (n != dp->n)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "the model has %d parameters, "
                       "the fg_dp %d", n, dp->n);
    for (int i = 0; i < n; i++)
        if (ps[i].tensor != dp->ps[i].t)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "parameter %d (%s) is "
                           "not the one the fg_dp was created with", i,
                           ps[i].name);
    return FG_OK;
}

fg_status fg_dp_train_step_scaled(fg_dp *dp, const fg_gpt *m,
                                  const int64_t *x, const int64_t *y,
                                  int64_t B, int64_t T, int accum,
                                  double clip, double lr, fg_generator *rng,
                                  fg_arena *arena, fg_grad_scaler *scale,
                                  fg_step_stats *stats)
{
    if (!dp || !m || !x || !y || accum < 1 || B <= 0 || T <= 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    FG_TRY(fg_dp_check_model(dp, m));
    if (scale)
        FG_TRY(fg_grad_scaler_check(scale));
    const double ls = scale ? scale->scale : 1.0;
    double total = 0, norm = 0;
    int skipped = 0;
    fg_status s = fg_gpt_accumulate(m, x, y, B, T, accum, ls, rng, arena,
                                    before_backward, dp, &total, NULL);
    /* Reductions already started must complete on every rank, even when
     * this one failed. */
    fg_status f = fg_dp_finish_backward(dp);
    if (s == FG_OK)
        s = f;
    /* The loss and the flags reduce before the optimizer: this wait for
     * the host value then overlaps nothing that is queued, and the step
     * and zeroing below run on the GPU while the caller prepares the next
     * batch (after them, it would drain the stream every step). A flag's
     * mean over the ranks is > 0 where any rank set it. */
    double v[1 + DP_NFLAGS];
    v[0] = total / accum;
    for (int i = 0; i < DP_NFLAGS; i++)
        v[1 + i] = (dp->flags_in >> i) & 1u;
    dp->flags_in = 0;
    if (s == FG_OK)
        s = fg_comm_allreduce_host_f64(dp->comm, v, 1 + DP_NFLAGS,
                                       FG_REDUCE_AVG);
    if (s == FG_OK) {
        dp->flags_out = 0;
        for (int i = 0; i < DP_NFLAGS; i++)
            dp->flags_out |= (v[1 + i] > 0) ? 1u << i : 0u;
    }
    if (s == FG_OK)
        s = clip_unscale(dp, clip, 1.0 / ls, scale != NULL, &norm, &skipped);
    if (s == FG_OK && !skipped)
        s = fg_dp_step(dp, lr);
    fg_status z = fg_dp_zero_grad(dp);
    if (s == FG_OK)
        s = z;
    if (s == FG_OK && scale)
        s = fg_grad_scaler_update(scale, skipped);
    if (s == FG_OK && stats) {
        stats->loss = v[0];
        stats->grad_norm = norm;
    }
    return s;
}

fg_status fg_dp_set_flags(fg_dp *dp, unsigned flags)
{
    if (!dp)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL dp");
    if (flags >> DP_NFLAGS)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "flags 0x%x: only bits 0-%d "
                       "exist", flags, DP_NFLAGS - 1);
    dp->flags_in = flags;
    return FG_OK;
}

unsigned fg_dp_flags(const fg_dp *dp) { return dp ? dp->flags_out : 0; }

fg_status fg_dp_get_stats(const fg_dp *dp, fg_dp_stats *st)
{
    if (!dp || !st)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    st->buckets = dp->nb;
    st->buffer_bytes = (size_t)dp->total * dp->es;
    st->shard_elements = dp->cfg.zero1 ? dp->shard_elements : dp->total;
    st->steps = dp->steps;
    st->started_in_backward = dp->started_in_backward;
    return FG_OK;
}

fg_status fg_dp_train_step(fg_dp *dp, const fg_gpt *m, const int64_t *x,
                           const int64_t *y, int64_t B, int64_t T, int accum,
                           double clip, double lr, fg_generator *rng,
                           fg_arena *arena, fg_step_stats *stats)
{
    return fg_dp_train_step_scaled(dp, m, x, y, B, T, accum, clip, lr, rng,
                                   arena, NULL, stats);
}
