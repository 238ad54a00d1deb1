/* SPDX-License-Identifier: MIT */
/* flashgrad/status.h - the error model.
 *
 * Every public function that can fail returns an fg_status. On failure it
 * also records a human-readable message in thread-local storage, readable
 * with fg_last_error() until the next failing call on the same thread.
 * The library never aborts or exits on user error, and a call that fails
 * validation writes none of its outputs. */
#ifndef FLASHGRAD_STATUS_H
#define FLASHGRAD_STATUS_H

#include "flashgrad/export.h"

FG_BEGIN_DECLS

typedef enum fg_status {
    FG_OK = 0,
    FG_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad size/stride/dtype, aliasing */
    FG_ERR_UNSUPPORTED = 2,      /* valid request this build/device cannot do */
    FG_ERR_OUT_OF_MEMORY = 3,    /* host or device allocation failed */
    FG_ERR_CUDA = 4,             /* a CUDA runtime/library call failed */
    FG_ERR_NO_DEVICE = 5,        /* CUDA requested but no usable GPU */
    FG_ERR_STATE = 6,            /* call not valid in the current state */
    FG_ERR_IO = 7,               /* file read/write failed or corrupt data */
    FG_ERR_INTERNAL = 8,         /* a bug in flashgrad: please report it */
    FG_ERR_COMM = 9              /* an MPI/NCCL call failed (dist.h) */
} fg_status;

/* Message of the last failure on this thread ("" if none). The pointer stays
 * valid until the next flashgrad call on this thread. */
FG_API const char *fg_last_error(void);

/* Status of the last failure on this thread (FG_OK if none). */
FG_API fg_status fg_last_status(void);

/* Forget the last failure on this thread. */
FG_API void fg_clear_error(void);

/* Static name of a status code, e.g. "invalid argument". */
FG_API const char *fg_status_string(fg_status s);

FG_END_DECLS

#endif /* FLASHGRAD_STATUS_H */
