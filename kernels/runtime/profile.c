/* SPDX-License-Identifier: MIT */
/* kernels/runtime/profile.c - the profiler's regions and scopes
 * (flashgrad/profile.h). CPU: each outermost scope adds its wall-clock
 * time to its family. CUDA: each records an event before and after; the
 * pairs are read when the region ends, so no scope waits for the GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "flashgrad/cuda.h"
#include "profile.h"

int fg_prof_active;

typedef struct pair {
    int family;
    int ev;        /* CUDA: events ev and ev + 1 */
} pair;

static struct {
    fg_device dev;
    int depth;     /* open scopes; only the outermost is timed */
    int family;    /* the outermost's */
    double t0;     /* CPU: its start */
    pair *pairs;   /* CUDA: closed scopes */
    int n, cap;
    fg_status err; /* the first failure, reported by fg_profile_end */
    fg_profile acc;
    double wall0;
} g;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

const char *fg_profile_family_name(int family)
{
    static const char *const names[FG_PROF_NFAMILIES] = {
        "other kernels", "GEMM", "attention", "layernorm",
        "softmax-xent", "optimizer"};
    return family >= 0 && family < FG_PROF_NFAMILIES ? names[family] : "?";
}

fg_status fg_profile_begin(fg_device dev)
{
    if (fg_prof_active)
        return fg_error(FG_ERR_STATE, "fg_profile_begin: a region is "
                        "already running");
    if (dev != FG_DEVICE_CPU && dev != FG_DEVICE_CUDA)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "fg_profile_begin: "
                        "unknown device %d", (int)dev);
    /* A CUDA build on a machine without a usable GPU answers like a CPU
     * build: unsupported, with fg_cuda_available()'s reason. */
    if (dev == FG_DEVICE_CUDA && !fg_cuda_available()) {
        char why[200]; /* fg_error rewrites the buffer fg_last_error reads */
        snprintf(why, sizeof why, "%s", fg_last_error());
        return fg_error(FG_ERR_UNSUPPORTED,
                        "fg_profile_begin: no CUDA device (%s)", why);
    }
    if (dev == FG_DEVICE_CUDA)
        FG_TRY(fg_cuda_synchronize());
    free(g.pairs);
    memset(&g, 0, sizeof g);
    g.dev = dev;
    g.acc.device = dev;
    g.wall0 = now_ms();
    fg_prof_active = 1;
    return FG_OK;
}

int fg_prof_enter_slow(int family)
{
    if (g.depth++ > 0)
        return -2; /* nested: the outer scope's time */
    g.family = family;
    if (g.dev == FG_DEVICE_CPU) {
        g.t0 = now_ms();
        return 0;
    }
    if (g.n == g.cap) {
        const int cap = g.cap ? 2 * g.cap : 256;
        pair *p = realloc(g.pairs, (size_t)cap * sizeof *p);
        if (!p) {
            if (g.err == FG_OK)
                g.err = fg_error(FG_ERR_OUT_OF_MEMORY, "profile scopes");
            return 0;
        }
        g.pairs = p;
        g.cap = cap;
    }
    const fg_status s = fg_prof_cuda_record(2 * g.n);
    if (s != FG_OK && g.err == FG_OK)
        g.err = s;
    return 0;
}

void fg_prof_leave_slow(int token)
{
    if (g.depth > 0)
        g.depth--;
    if (token == -2 || g.depth > 0 || !fg_prof_active)
        return;
    g.acc.calls[g.family]++;
    if (g.dev == FG_DEVICE_CPU) {
        g.acc.ms[g.family] += now_ms() - g.t0;
        return;
    }
    if (g.err != FG_OK || g.n == g.cap)
        return;
    const fg_status s = fg_prof_cuda_record(2 * g.n + 1);
    if (s != FG_OK) {
        g.err = s;
        return;
    }
    g.pairs[g.n].family = g.family;
    g.pairs[g.n].ev = 2 * g.n;
    g.n++;
}

fg_status fg_profile_end(fg_profile *out)
{
    if (!fg_prof_active)
        return fg_error(FG_ERR_STATE, "fg_profile_end: no region is running");
    if (!out)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "fg_profile_end: NULL "
                        "argument");
    fg_prof_active = 0;
    fg_status s = g.err;
    if (g.dev == FG_DEVICE_CUDA) {
        if (s == FG_OK)
            s = fg_cuda_synchronize();
        for (int i = 0; i < g.n && s == FG_OK; i++) {
            float ms = 0;
            s = fg_prof_cuda_elapsed(g.pairs[i].ev, g.pairs[i].ev + 1, &ms);
            g.acc.ms[g.pairs[i].family] += ms;
        }
        fg_prof_cuda_release();
    }
    g.acc.wall_ms = now_ms() - g.wall0;
    free(g.pairs);
    g.pairs = NULL;
    if (s == FG_OK)
        *out = g.acc;
    return s;
}
