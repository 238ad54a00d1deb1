/* SPDX-License-Identifier: MIT */
/* lib/core/error.c - thread-local last-error storage. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

#define FG_MSG_CAP 512

static _Thread_local char tls_msg[FG_MSG_CAP];
static _Thread_local fg_status tls_status = FG_OK;

static fg_status record(fg_status s, const char *func, const char *fmt,
                        va_list ap)
{
    size_t n = 0;
    if (func) {
        int w = snprintf(tls_msg, sizeof tls_msg, "%s: ", func);
        n = (w > 0 && (size_t)w < sizeof tls_msg) ? (size_t)w : 0;
    }
    vsnprintf(tls_msg + n, sizeof tls_msg - n, fmt, ap);
    tls_status = s;
    return s;
}

fg_status fg_error(fg_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(s, NULL, fmt, ap);
    va_end(ap);
    return s;
}

fg_status fg_error_at(fg_status s, const char *func, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(s, func, fmt, ap);
    va_end(ap);
    return s;
}

const char *fg_last_error(void) { return tls_msg; }

fg_status fg_last_status(void) { return tls_status; }

void fg_clear_error(void)
{
    tls_msg[0] = '\0';
    tls_status = FG_OK;
}

const char *fg_status_string(fg_status s)
{
    switch (s) {
    case FG_OK: return "ok";
    case FG_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FG_ERR_UNSUPPORTED: return "unsupported";
    case FG_ERR_OUT_OF_MEMORY: return "out of memory";
    case FG_ERR_CUDA: return "CUDA error";
    case FG_ERR_NO_DEVICE: return "no CUDA device";
    case FG_ERR_STATE: return "invalid state";
    case FG_ERR_IO: return "I/O error";
    case FG_ERR_INTERNAL: return "internal error";
    case FG_ERR_COMM: return "communication error";
    }
    return "unknown status";
}
