/* SPDX-License-Identifier: MIT */
/* kernels/backend/module.c - module side of the CUDA backend seam
 * (backend.h): libflashgrad-cuda.so's one exported function, and the core
 * functions the kernels call, defined here as calls through the table the
 * library passed in (so the module needs nothing from libflashgrad.so at
 * link time, and no second copy of the error state exists). */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>

#include "backend.h"
#include "lib/core/error.h"

static const fg_cuda_core *g_core;

/* fg_error's message is formatted here and passed on whole: the library's
 * buffer is as long, so nothing more is cut. */
fg_status fg_error(fg_status s, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return g_core->fg_error(s, "%s", msg);
}

fg_status fg_error_at(fg_status s, const char *func, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return g_core->fg_error_at(s, func, "%s", msg);
}

#define FG_CUDA_SHIM_(ret, name, params, args)                                \
    ret name params { return g_core->name args; }
#define FG_CUDA_VSHIM_(name, params, args)                                    \
    void name params { g_core->name args; }
FG_CUDA_CORE_FUNCTIONS(FG_CUDA_SHIM_, FG_CUDA_VSHIM_)

#define FG_CUDA_ENTRY_(ret, name, ...) .name = name,
#define FG_CUDA_VENTRY_(name, ...) .name = name,
static const fg_cuda_backend g_table = {
    .abi = FG_CUDA_BACKEND_ABI,
    .size = sizeof(fg_cuda_backend),
    .version = PACKAGE_VERSION,
    FG_CUDA_ENTRY_POINTS(FG_CUDA_ENTRY_, FG_CUDA_VENTRY_)};

__attribute__((visibility("default"))) const fg_cuda_backend *
fg_cuda_backend_get(int abi, const fg_cuda_core *core)
{
    if (abi != FG_CUDA_BACKEND_ABI || !core ||
        core->abi != FG_CUDA_BACKEND_ABI || core->size != sizeof *core)
        return NULL;
    g_core = core;
    return &g_table;
}
