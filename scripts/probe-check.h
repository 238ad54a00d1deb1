/* SPDX-License-Identifier: MIT */
/* scripts/probe-check.h - the error checks of the standalone GPU probes
 * (the *-probe.cu files here): a failed CUDA or cuBLAS call prints the
 * file, line and error and exits with PROBE_FAIL_EXIT (1 unless the probe
 * sets it).
 * A probe is a throwaway measurement, so it exits instead of returning a
 * status as the library does. */
#ifndef FG_SCRIPTS_PROBE_CHECK_H
#define FG_SCRIPTS_PROBE_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#ifndef PROBE_FAIL_EXIT
#define PROBE_FAIL_EXIT 1
#endif

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));        \
            exit(PROBE_FAIL_EXIT);                                                             \
        }                                                                                      \
    } while (0)
#define CB(x)                                                                                  \
    do {                                                                                       \
        int s_ = (int)(x);                                                                     \
        if (s_ != 0) {                                                                         \
            fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, s_);              \
            exit(PROBE_FAIL_EXIT);                                                             \
        }                                                                                      \
    } while (0)

#endif
