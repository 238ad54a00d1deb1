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
 * fg_profile_ops() then splits the families by operation: the public
 * op's name for a forward ("fg_dropout_add", "fg_embedding"; elementwise
 * kernels by their operation, "add", "mul", ...; "fg_grad_accumulate"
 * for the sums of gradients), the graph node's for a backward
 * ("DropoutAddBackward", ...): which of the "other kernels" to fuse next.
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

/* One operation of a region: fg_profile's figures split by name. */
typedef struct fg_profile_op {
    const char *name; /* the library's static string (or a custom op
                       * definition's name) */
    int family;       /* its fg_prof_family; -1 for "(other operations)",
                       * where a region's names past the 127th go */
    double ms;        /* its outermost calls' time */
    int64_t calls;
} fg_profile_op;

/* Starts a region timing work on `dev` (CUDA: waits for the stream
 * first). FG_ERR_STATE if one is running; FG_ERR_UNSUPPORTED for CUDA in
 * a build without it. */
FG_API fg_status fg_profile_begin(fg_device dev);
/* Ends the region (CUDA: waits for the stream) and fills *out. */
FG_API fg_status fg_profile_end(fg_profile *out);
/* "GEMM", "attention", ... ("?" out of range). */
FG_API const char *fg_profile_family_name(int family);
/* The operations of the last region fg_profile_end ended without error,
 * largest time first: the first `max` into `out` (NULL when max <= 0);
 * returns how many there are (0 before any region). Their ms and calls
 * sum to fg_profile's per family (all of them while the region had no
 * more than 127 names). */
FG_API int fg_profile_ops(fg_profile_op *out, int max);

FG_END_DECLS

#endif /* FLASHGRAD_PROFILE_H */
