/* SPDX-License-Identifier: MIT */
/* lib/dist/dp_internal.h - the state of an fg_dp (dist.h), shared by
 * dp.c (buckets, hooks, ZeRO-1, the step) and dp_checkpoint.c. */
#ifndef FG_LIB_DIST_DP_INTERNAL_H
#define FG_LIB_DIST_DP_INTERNAL_H

#include <stdint.h>

#include "flashgrad/dist.h"
#include "comm_internal.h"

typedef struct dp_param {
    struct fg_dp *dp;
    fg_tensor *t;       /* retained */
    fg_tensor *view;    /* the .grad we installed (t owns it) */
    int64_t numel, flat; /* elements; offset in the buffer */
    int bucket;
    uint64_t ready_epoch;
    fg_hook *hook;
} dp_param;

typedef struct dp_bucket {
    int64_t off, len, padded, chunk; /* elements; chunk = padded / size */
    int nparams, pending;
    int done; /* its request tested complete (MPI's poll skips it) */
    fg_comm_request *req;
} dp_bucket;

/* ZeRO-1: one piece of a parameter inside this rank's slice of a bucket. */
typedef struct dp_seg {
    int param;
    int64_t poff, flat, len; /* offset in the parameter, in the buffer */
} dp_seg;

enum { DP_NFLAGS = 8 }; /* fg_dp_set_flags: bits 0-7 */

struct fg_dp {
    fg_comm *comm;
    fg_dp_config cfg;
    int n;
    dp_param *ps;
    fg_param *params; /* copy of the caller's array */
    int nb;
    dp_bucket *bk;
    fg_tensor *gflat; /* 1-D, the gradient buffer */
    char *gbase;
    fg_dtype dt;
    fg_device dev;
    size_t es;
    int64_t total;
    /* the step in progress */
    int armed;
    uint64_t epoch;
    int next_launch;
    /* optimizer: full, or over the segments */
    fg_adamw *opt;
    int nseg;
    dp_seg *seg;
    fg_param *segp; /* 1-D views: parameter slice, .grad = buffer slice */
    int64_t shard_elements;
    int64_t opt_steps; /* AdamW steps taken (ZeRO-1 ranks may own nothing) */
    /* fg_dp_set_flags for the next step, and the last step's OR */
    unsigned flags_in, flags_out;
    /* stats */
    int64_t steps, started_in_backward;
};

/* FG_OK when m's parameters are the ones dp was created with. */
fg_status fg_dp_check_model(const fg_dp *dp, const fg_gpt *m);

#endif /* FG_LIB_DIST_DP_INTERNAL_H */
