/* SPDX-License-Identifier: MIT */
/* lib/dist/dp_checkpoint.c - checkpoints of a data-parallel run (dist.h):
 * rank 0 writes the file the one-process trainer writes, every rank
 * loads it; with ZeRO-1 the sharded AdamW moments are gathered into a
 * full optimizer for saving and cut back into slices on loading. Every
 * rank takes part in each collective and all agree on the outcome. */
#include "config.h"

#include "lib/autograd/tensor_internal.h"
#include "lib/core/error.h"
#include "lib/train/train_internal.h"
#include "comm_internal.h"
#include "dist_internal.h"
#include "dp_internal.h"

/* The same verdict on every rank: `bad` is this rank's (0 ok); returns the
 * number of ranks that failed. */
static fg_status agree(fg_comm *c, int bad, int *nbad)
{
    double x = bad != 0;
    FG_TRY(fg_comm_allreduce_host_f64(c, &x, 1, FG_REDUCE_SUM));
    *nbad = (int)x;
    return FG_OK;
}

/* ZeRO-1: moment k (0: m, 1: v) of every rank's slices into full's
 * moments on rank 0 (every rank takes part; full is NULL elsewhere). */
static fg_status gather_moment(fg_dp *dp, int k, fg_tensor *flat,
                               fg_adamw *full)
{
    char *base = fg_tensor_data(flat);
    for (int i = 0; i < dp->nseg; i++) {
        fg_tensor *mt = NULL, *vt = NULL;
        FG_TRY(fg_adamw_state(dp->opt, i, &mt, &vt));
        FG_TRY(fg_dist_copy(dp->dev, base + (size_t)dp->seg[i].flat * dp->es,
                            fg_tensor_data(k ? vt : mt),
                            (size_t)dp->seg[i].len * dp->es));
    }
    for (int i = 0; i < dp->nb; i++) {
        const dp_bucket *b = &dp->bk[i];
        char *p = base + (size_t)b->off * dp->es;
        FG_TRY(fg_comm_allgather(dp->comm,
                                 p + (size_t)(dp->comm->rank * b->chunk) *
                                         dp->es,
                                 p, (size_t)b->chunk, dp->dt));
    }
    for (int i = 0; full && i < dp->n; i++) {
        fg_tensor *mt = NULL, *vt = NULL;
        FG_TRY(fg_adamw_state(full, i, &mt, &vt));
        FG_TRY(fg_dist_copy(dp->dev, fg_tensor_data(k ? vt : mt),
                            base + (size_t)dp->ps[i].flat * dp->es,
                            (size_t)dp->ps[i].numel * dp->es));
    }
    return FG_OK;
}

/* A full AdamW over the model's parameters (heap), for ZeRO-1 checkpoints. */
static fg_status full_adamw(fg_dp *dp, fg_adamw **out)
{
    FG_TRY(fg_arena_push(NULL));
    fg_status s = fg_adamw_create(dp->params, dp->n, &dp->cfg.adamw, out);
    fg_arena_pop(NULL);
    return s;
}

fg_status fg_dp_checkpoint_save(fg_dp *dp, const char *path, const fg_gpt *m,
                                const fg_train_state *st, const char *meta)
{
    if (!dp || !m)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL dp or model");
    FG_TRY(fg_dp_check_model(dp, m));
    const int root = dp->comm->rank == 0;
    fg_adamw *opt = dp->opt, *full = NULL;
    fg_status s = FG_OK;
    if (dp->cfg.zero1) {
        /* Collective: every rank runs the gathers, even after a local
         * failure (with a zeroed staging buffer), so none is left waiting. */
        fg_tensor *flat = NULL;
        FG_TRY(fg_arena_push(NULL));
        s = fg_tensor_zeros(dp->dt, dp->dev, FG_SHAPE(dp->total), &flat);
        fg_arena_pop(NULL);
        FG_TRY(s);
        if (root)
            s = full_adamw(dp, &full);
        for (int k = 0; k < 2; k++) {
            fg_status g = gather_moment(dp, k, flat, s == FG_OK ? full : NULL);
            if (s == FG_OK)
                s = g;
        }
        fg_tensor_free(flat);
        if (s == FG_OK && full)
            s = fg_adamw_set_steps(full, dp->opt_steps);
        opt = full;
    }
    if (s == FG_OK && root)
        s = fg_checkpoint_save(path, m, opt, st, meta);
    fg_adamw_free(full);
    int nbad = 0;
    FG_TRY(agree(dp->comm, s != FG_OK, &nbad));
    if (s == FG_OK && nbad)
        return FG_FAIL(FG_ERR_IO, "rank 0 could not write the checkpoint %s",
                       path);
    return s;
}

fg_status fg_dp_checkpoint_load(fg_dp *dp, const char *path, fg_gpt *m,
                                fg_train_state *st)
{
    if (!dp || !m)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL dp or model");
    FG_TRY(fg_dp_check_model(dp, m));
    fg_status s = FG_OK;
    if (!dp->cfg.zero1) {
        s = fg_checkpoint_load(path, m, dp->opt, st);
        if (s == FG_OK)
            dp->opt_steps = fg_adamw_steps(dp->opt);
    } else {
        /* The whole state into a temporary full AdamW, then this rank's
         * slices out of it. */
        fg_adamw *full = NULL;
        s = full_adamw(dp, &full);
        if (s == FG_OK)
            s = fg_checkpoint_load(path, m, full, st);
        for (int i = 0; s == FG_OK && i < dp->nseg; i++) {
            const dp_seg *g = &dp->seg[i];
            fg_tensor *fm, *fv, *sm, *sv;
            s = fg_adamw_state(full, g->param, &fm, &fv);
            if (s == FG_OK)
                s = fg_adamw_state(dp->opt, i, &sm, &sv);
            const size_t off = (size_t)g->poff * dp->es,
                         nb = (size_t)g->len * dp->es;
            if (s == FG_OK)
                s = fg_dist_copy(dp->dev, fg_tensor_data(sm),
                                 (char *)fg_tensor_data(fm) + off, nb);
            if (s == FG_OK)
                s = fg_dist_copy(dp->dev, fg_tensor_data(sv),
                                 (char *)fg_tensor_data(fv) + off, nb);
        }
        if (s == FG_OK) {
            dp->opt_steps = fg_adamw_steps(full);
            if (dp->opt)
                s = fg_adamw_set_steps(dp->opt, dp->opt_steps);
        }
        fg_adamw_free(full);
    }
    int nbad = 0;
    FG_TRY(agree(dp->comm, s != FG_OK, &nbad));
    if (s == FG_OK && nbad)
        return FG_FAIL(FG_ERR_IO, "%d rank(s) could not load %s", nbad, path);
    return s;
}

