/* SPDX-License-Identifier: MIT */
/* kernels/runtime/profile.c - the profiler's regions and scopes
 * (flashgrad/profile.h). CPU: each outermost scope adds its wall-clock
 * time to its family and its operation. CUDA: each records an event
 * before and after; the pairs are read when the region ends, so no scope
 * waits for the GPU. */
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
    int op;        /* index into the region's operations */
    int ev;        /* CUDA: events ev and ev + 1 */
} pair;

/* Distinct operations a region tells apart; later ones share the last
 * entry, "(other operations)" of family -1. */
#define PROF_MAX_OPS 128

static struct {
    fg_device dev;
    int depth;     /* open scopes; only the outermost is timed */
    int family;    /* the outermost's */
    int op;        /* its operation */
    double t0;     /* CPU: its start */
    pair *pairs;   /* CUDA: closed scopes */
    int n, cap;
    fg_status err; /* the first failure, reported by fg_profile_end */
    fg_profile acc;
    fg_profile_op ops[PROF_MAX_OPS];
    int n_ops;
    double wall0;
} g;

/* The last region that ended well, by operation, largest time first. */
static fg_profile_op last_ops[PROF_MAX_OPS];
static int n_last_ops;

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

/* The region's entry of (family, name): names compare by address first
 * (the same literal or op definition each time), then by content. */
static int op_index(int family, const char *name)
{
    if (!name)
        name = fg_profile_family_name(family);
    for (int i = 0; i < g.n_ops; i++) /* the common case, no strcmp */
        if (g.ops[i].name == name && g.ops[i].family == family)
            return i;
    for (int i = 0; i < g.n_ops; i++)
        if (g.ops[i].family == family && !strcmp(g.ops[i].name, name))
            return i;
    if (g.n_ops == PROF_MAX_OPS) /* full: the last entry takes the rest */
        return PROF_MAX_OPS - 1;
    fg_profile_op *o = &g.ops[g.n_ops];
    const int last = g.n_ops == PROF_MAX_OPS - 1;
    o->name = last ? "(other operations)" : name;
    o->family = last ? -1 : family;
    return g.n_ops++;
}

int fg_prof_enter_slow(int family, const char *name)
{
    if (g.depth++ > 0)
        return -2; /* nested: the outer scope's time */
    g.family = family >= 0 && family < FG_PROF_NFAMILIES ? family : FG_PROF_OTHER;
    g.op = op_index(g.family, name);
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
    fg_profile_op *o = &g.ops[g.op];
    g.acc.calls[g.family]++;
    o->calls++;
    if (g.dev == FG_DEVICE_CPU) {
        const double ms = now_ms() - g.t0;
        g.acc.ms[g.family] += ms;
        o->ms += ms;
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
    g.pairs[g.n].op = g.op;
    g.pairs[g.n].ev = 2 * g.n;
    g.n++;
}

/* Largest time first; ties by calls, then name (a stable report). */
static int by_time(const void *pa, const void *pb)
{
    const fg_profile_op *a = pa, *b = pb;
    if (a->ms != b->ms)
        return a->ms < b->ms ? 1 : -1;
    if (a->calls != b->calls)
        return a->calls < b->calls ? 1 : -1;
    return strcmp(a->name, b->name);
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
            g.ops[g.pairs[i].op].ms += ms;
        }
        fg_prof_cuda_release();
    }
    g.acc.wall_ms = now_ms() - g.wall0;
    free(g.pairs);
    g.pairs = NULL;
    if (s == FG_OK) {
        *out = g.acc;
        memcpy(last_ops, g.ops, (size_t)g.n_ops * sizeof *g.ops);
        n_last_ops = g.n_ops;
        qsort(last_ops, (size_t)n_last_ops, sizeof *last_ops, by_time);
    }
    return s;
}

int fg_profile_ops(fg_profile_op *out, int max)
{
    for (int i = 0; out && i < max && i < n_last_ops; i++)
        out[i] = last_ops[i];
    return n_last_ops;
}
