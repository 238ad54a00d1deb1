/* SPDX-License-Identifier: MIT */
/* flashgrad/profile.h - an opt-in time breakdown by kernel family.
 *
 * Between fg_profile_begin() and fg_profile_end(), every op that launches
 * work is timed and its time added to its family: the forward of
 * fg_matmul, fg_attention (and fg_attention_qkvpacked), fg_layernorm (and
 * fg_layernorm_cast) and
 * fg_cross_entropy, the backward of their graph nodes, AdamW and gradient
 * clipping, and every other op's kernels (elementwise, casts, copies,
 * embeddings, dropout, reductions, gradient accumulation) as
 * FG_PROF_OTHER. A call nested in a timed one
 * counts for the outer one only (a cast inside fg_matmul is GEMM time).
 * On CUDA the time is the GPU's, between CUDA events recorded on the
 * context stream around the call; on the CPU it is wall-clock time. What
 * the families leave of the region's wall time is launches, host work the
 * GPU waits for, and unwrapped work (fg_profile.wall_ms minus the sum).
 *
 * Off (the default), each op pays one test of a flag; timing never
 * changes a result. One region at a time, on the thread that runs the
 * ops. */
#ifndef FLASHGRAD_PROFILE_H
#define FLASHGRAD_PROFILE_H

#include <stdint.h>

#include "flashgrad/export.h"
#include "flashgrad/status.h"
#include "flashgrad/types.h"

FG_BEGIN_DECLS

typedef enum fg_prof_family {
    FG_PROF_OTHER = 0,   /* elementwise, casts, copies, embeddings, ... */
    FG_PROF_GEMM,        /* fg_matmul and its backward */
    FG_PROF_ATTENTION,   /* fg_attention(_qkvpacked) and its backward */
    FG_PROF_LAYERNORM,   /* fg_layernorm(_cast) and its backward */
    FG_PROF_XENT,        /* fg_cross_entropy (softmax + loss) and backward */
    FG_PROF_OPTIMIZER,   /* fg_adamw_step, fg_clip_grad_norm */
    FG_PROF_NFAMILIES
} fg_prof_family;

typedef struct fg_profile {
    double ms[FG_PROF_NFAMILIES]; /* milliseconds per family */
    int64_t calls[FG_PROF_NFAMILIES];
    double wall_ms;               /* the region, begin to end (synced) */
    fg_device device;             /* how it was timed */
} fg_profile;

/* Starts a region timing work on `dev` (CUDA: waits for the stream
 * first). FG_ERR_STATE if one is running; FG_ERR_UNSUPPORTED for CUDA in
 * a build without it. */
FG_API fg_status fg_profile_begin(fg_device dev);
/* Ends the region (CUDA: waits for the stream) and fills *out. */
FG_API fg_status fg_profile_end(fg_profile *out);
/* "GEMM", "attention", ... ("?" out of range). */
FG_API const char *fg_profile_family_name(int family);

FG_END_DECLS

#endif /* FLASHGRAD_PROFILE_H */
