/* SPDX-License-Identifier: MIT */
/* bench/bench_cuda.h - what the CUDA benchmarks share: exit with a message
 * on a failing CUDA call (CK) or flashgrad call (FG), and the float
 * comparison their medians sort with. */
#ifndef FG_BENCH_CUDA_H
#define FG_BENCH_CUDA_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include <flashgrad/flashgrad.h>

#define CK(call)                                                            \
    do {                                                                    \
        cudaError_t e_ = (call);                                            \
        if (e_ != cudaSuccess) {                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,   \
                    cudaGetErrorString(e_));                                \
            exit(1);                                                        \
        }                                                                   \
    } while (0)
#define FG(call)                                                            \
    do {                                                                    \
        if ((call) != FG_OK) {                                              \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,              \
                    fg_last_error());                                       \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

/* qsort comparison of floats, ascending. */
static inline int bench_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#endif /* FG_BENCH_CUDA_H */
