/* SPDX-License-Identifier: MIT */
/* kernels/backend/loader.c - library side of the CUDA backend seam
 * (backend.h): finds and loads libflashgrad-cuda.so on the first CUDA call,
 * and defines every CUDA entry point as a trampoline into its table.
 *
 * Where the module is looked for, first hit wins:
 *   1. $FG_CUDA_BACKEND, the module's full path (nothing else is tried);
 *   2. FG_CUDA_BACKEND_DIR, the installed $(pkglibdir);
 *   3. next to the library itself (dladdr): DIR/libflashgrad-cuda.so and
 *      DIR/flashgrad/libflashgrad-cuda.so, for relocated installs and the
 *      build tree's .libs.
 * The outcome is decided once per process and kept: a module that is not
 * there, does not load (e.g. libcudart missing) or does not match is
 * reported by every CUDA call, and by fg_cuda_available(), with the reason;
 * no driver and no device are the module's to report. */
#define _GNU_SOURCE /* dladdr */
#include "config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "lib/core/error.h"

#ifndef FG_CUDA_BACKEND_DIR
#error "FG_CUDA_BACKEND_DIR (the installed module's folder) must be defined"
#endif

#define FG_CUDA_CORE_INIT_(ret, name, ...) .name = name,
#define FG_CUDA_CORE_VINIT_(name, ...) .name = name,
static const fg_cuda_core g_core = {
    .abi = FG_CUDA_BACKEND_ABI,
    .size = sizeof(fg_cuda_core),
    .fg_error = fg_error,
    .fg_error_at = fg_error_at,
    FG_CUDA_CORE_FUNCTIONS(FG_CUDA_CORE_INIT_, FG_CUDA_CORE_VINIT_)};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const fg_cuda_backend *g_backend; /* NULL: not usable, see g_why */
static char g_why[768];

/* Loads the module at path (which exists); on failure says why in g_why. */
static void open_module(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_why, sizeof g_why, "the CUDA backend %s cannot be loaded: %s",
                 path, e ? e : "dlopen failed");
        return;
    }
    fg_cuda_backend_get_fn get;
    /* POSIX guarantees that a data pointer from dlsym converts back. */
    *(void **)&get = dlsym(h, FG_CUDA_BACKEND_GET);
    const fg_cuda_backend *b = get ? get(FG_CUDA_BACKEND_ABI, &g_core) : NULL;
    if (!b || b->abi != FG_CUDA_BACKEND_ABI || b->size != sizeof *b) {
        snprintf(g_why, sizeof g_why,
                 "the CUDA backend %s (flashgrad %s) does not match this "
                 "library (flashgrad %s)",
                 path, b && b->version ? b->version : "?", PACKAGE_VERSION);
        dlclose(h);
        return;
    }
    /* Never closed: the CUDA runtime keeps its kernels registered. */
    g_backend = b;
}

static void load(void)
{
    const char *env = getenv("FG_CUDA_BACKEND");
    if (env && *env) {
        if (access(env, F_OK) == 0)
            open_module(env);
        else
            snprintf(g_why, sizeof g_why,
                     "the CUDA backend is not installed: FG_CUDA_BACKEND=%s "
                     "does not exist",
                     env);
        return;
    }
    char paths[3][512];
    int n = 0;
    snprintf(paths[n++], sizeof paths[0], "%s/%s", FG_CUDA_BACKEND_DIR,
             FG_CUDA_BACKEND_NAME);
    Dl_info info;
    if (dladdr((void *)&fg_cuda_backend_fail, &info) && info.dli_fname &&
        strrchr(info.dli_fname, '/')) {
        const int dl = (int)(strrchr(info.dli_fname, '/') - info.dli_fname);
        snprintf(paths[n++], sizeof paths[0], "%.*s/%s", dl, info.dli_fname,
                 FG_CUDA_BACKEND_NAME);
        snprintf(paths[n++], sizeof paths[0], "%.*s/flashgrad/%s", dl,
                 info.dli_fname, FG_CUDA_BACKEND_NAME);
    }
    char tried[sizeof g_why] = "";
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (access(paths[i], F_OK) == 0) {
            open_module(paths[i]);
            return;
        }
        if (len < sizeof tried)
            len += (size_t)snprintf(tried + len, sizeof tried - len, "%s%s",
                                    i ? ", " : "", paths[i]);
    }
    snprintf(g_why, sizeof g_why,
             "the CUDA backend is not installed (looked for %s; "
             "FG_CUDA_BACKEND may name it)",
             tried);
}

static const fg_cuda_backend *backend(void)
{
    pthread_once(&g_once, load);
    return g_backend;
}

fg_status fg_cuda_backend_fail(const char *what)
{
    (void)backend();
    if (what)
        return fg_error(FG_ERR_UNSUPPORTED, "%s: %s", what, g_why);
    return fg_error(FG_ERR_UNSUPPORTED, "%s", g_why);
}

fg_status fg_cuda_backend_fail_stats(fg_cuda_memory_stats *st)
{
    if (st)
        memset(st, 0, sizeof *st);
    return fg_cuda_backend_fail("fg_cuda_memory_get_stats");
}

/* The trampolines: the declarations they define are in the layers'
 * headers (included by backend.h), so the compiler checks each one. */
#define FG_CUDA_TRAMPOLINE_(ret, name, params, args, fallback)                \
    ret name params                                                           \
    {                                                                         \
        const fg_cuda_backend *fg_be_ = backend();                            \
        return fg_be_ ? fg_be_->name args : fallback;                         \
    }
#define FG_CUDA_VTRAMPOLINE_(name, params, args)                              \
    void name params                                                          \
    {                                                                         \
        const fg_cuda_backend *fg_be_ = backend();                            \
        if (fg_be_)                                                           \
            fg_be_->name args;                                                \
    }
FG_CUDA_ENTRY_POINTS(FG_CUDA_TRAMPOLINE_, FG_CUDA_VTRAMPOLINE_)
