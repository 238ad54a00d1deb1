/* SPDX-License-Identifier: MIT */
/* lib/core/error.h - internal helpers for the error model (see status.h). */
#ifndef FG_LIB_ERROR_H
#define FG_LIB_ERROR_H

#include "flashgrad/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#  define FG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#  define FG_PRINTF(a, b)
#endif

/* Record status s with a printf-style message for fg_last_error(); returns s
 * so callers can write `return fg_error(FG_ERR_..., "...")`. The message is
 * prefixed with the calling function's name by FG_FAIL. */
fg_status fg_error(fg_status s, const char *fmt, ...) FG_PRINTF(2, 3);

#define FG_FAIL(status, ...) fg_error_at((status), __func__, __VA_ARGS__)
fg_status fg_error_at(fg_status s, const char *func, const char *fmt, ...)
    FG_PRINTF(3, 4);

/* Propagate a failing status from a call that already recorded its message. */
#define FG_TRY(expr)                         \
    do {                                     \
        fg_status fg_try_s_ = (expr);        \
        if (fg_try_s_ != FG_OK)              \
            return fg_try_s_;                \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_ERROR_H */
