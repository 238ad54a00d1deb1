/* SPDX-License-Identifier: MIT */
/* lib/core/common.c - dtype/device names, version. */
#include "flashgrad/types.h"

#include "config.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
void openblas_set_num_threads(int num_threads);
#endif

void fg_set_num_threads(int n)
{
#ifdef _OPENMP
    /* More threads than processors only oversubscribe the cores. */
    if (n > omp_get_num_procs())
        n = omp_get_num_procs();
    if (n > 0)
        omp_set_num_threads(n);
#else
    (void)n;
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
    openblas_set_num_threads(1);
#endif
}

size_t fg_dtype_size(fg_dtype dt)
{
    switch (dt) {
    case FG_FP32: return 4;
    case FG_FP64: return 8;
    case FG_FP16: return 2;
    case FG_BF16: return 2;
    }
    return 0;
}

const char *fg_dtype_name(fg_dtype dt)
{
    switch (dt) {
    case FG_FP32: return "fp32";
    case FG_FP64: return "fp64";
    case FG_FP16: return "fp16";
    case FG_BF16: return "bf16";
    }
    return "?";
}

const char *fg_device_name(fg_device dev)
{
    switch (dev) {
    case FG_DEVICE_CPU: return "cpu";
    case FG_DEVICE_CUDA: return "cuda";
    }
    return "?";
}

const char *fg_version(void) { return PACKAGE_VERSION; }

static volatile int g_deterministic;

void fg_set_deterministic(int on) { g_deterministic = on != 0; }

int fg_get_deterministic(void) { return g_deterministic; }
