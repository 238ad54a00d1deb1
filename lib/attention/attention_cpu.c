/* SPDX-License-Identifier: MIT */
/* lib/attention/attention_cpu.c - CPU backend of the attention API: the tiled
 * FlashAttention algorithm (attention_cpu_impl.h) for fp32 and fp64, and the
 * host side of the dropout RNG mapping (dropout_map.h + philox.h). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention_internal.h"
#include "attention_varlen.h"
#include "lib/core/dropout_map.h"
#include "lib/core/error.h"
#include "lib/core/philox.h"

/* Threads for ntasks independent tasks of about `work` multiply-adds in
 * all: never more than tasks, and results do not depend on the count
 * (each task writes disjoint outputs). Unrequested (0), a problem below
 * 2^18 of them runs on one thread: a parallel region costs more than it
 * saves there (a one-token decoding step, a gradcheck's many small
 * calls), and with the cores busy OpenMP's spinning workers made such
 * calls far slower (a CI run's gradcheck hit its 120 s timeout beside two
 * compilers). work is a double: the product of the sizes may pass
 * 2^63. */
static int fg_cpu_threads(int requested, int64_t ntasks, double work)
{
#ifdef _OPENMP
    int n = requested > 0 ? requested : work < 262144.0 ? 1 : omp_get_max_threads();
#else
    int n = 1;
    (void)requested;
    (void)work;
#endif
    if ((int64_t)n > ntasks)
        n = ntasks > 0 ? (int)ntasks : 1;
    return n < 1 ? 1 : n;
}

static int fg_cpu_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Per-thread workspace reused across calls, so a training step's attention
 * calls stop allocating once the largest size has been seen (the "memory
 * plan" of the autograd layer). Grown, never shrunk; released by
 * fg_attention_release_workspace() or, when the thread exits, by the
 * destructor of a pthread key that mirrors the pointer (thread-local
 * variables alone are not freed at thread exit). */
static _Thread_local void *tls_ws;
static _Thread_local size_t tls_ws_size;
static pthread_once_t ws_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t ws_key;
static int ws_key_ok;

static void ws_key_create(void)
{
    ws_key_ok = pthread_key_create(&ws_key, free) == 0;
}

static void *fg_cpu_workspace(size_t bytes)
{
    if (bytes <= tls_ws_size)
        return tls_ws;
    pthread_once(&ws_key_once, ws_key_create);
    /* Without the key the buffer would leak at thread exit: refuse. */
    if (!ws_key_ok)
        return NULL;
    void *p = malloc(bytes);
    if (!p)
        return NULL;
    if (pthread_setspecific(ws_key, p) != 0) {
        free(p);
        return NULL;
    }
    free(tls_ws);
    tls_ws = p;
    tls_ws_size = bytes;
    return p;
}

void fg_attention_release_workspace(void)
{
    if (tls_ws) /* then this thread created the key (pthread_once) */
        pthread_setspecific(ws_key, NULL);
    free(tls_ws);
    tls_ws = NULL;
    tls_ws_size = 0;
}

void fg_dropout_row(const fg_attn_problem *pb, int64_t b, int64_t h, int64_t i,
                    int64_t j0, int64_t n, uint8_t *out)
{
    const fg_u32x2 key = {fg_dropout_key_x(pb->seed, pb->offset),
                          fg_dropout_key_y(pb->seed, pb->offset)};
    fg_u32x4 ctr = {0, fg_dropout_ctr_y(i), fg_dropout_ctr_z(b * pb->H + h),
                    fg_dropout_ctr_w(pb->offset)};
    /* A row meets each call in 8 of its columns; cache the 32 columns of
     * j / 32 (four calls, one per (j / 2) % 4). */
    uint32_t words[4][4];
    int64_t have = -1; /* j / 32 currently in words[][] */
    for (int64_t c = 0; c < n; c++) {
        const int64_t j = j0 + c;
        if ((j >> 5) != have) {
            have = j >> 5;
            for (int q = 0; q < 4; q++) {
                ctr.x = fg_dropout_ctr_x(32 * have + 2 * q);
                const fg_u32x4 r = fg_dropout_philox(ctr, key);
                words[q][0] = r.x;
                words[q][1] = r.y;
                words[q][2] = r.z;
                words[q][3] = r.w;
            }
        }
        out[c] = (uint8_t)fg_dropout_keep8(words[(j >> 1) & 3][fg_dropout_word(j)],
                                          fg_dropout_byte(i, j), pb->keep_threshold);
    }
}

#define T float
#define SFX _f32
#define EXP expf
#define TANH tanhf
#include "attention_cpu_impl.h"
#undef T
#undef SFX
#undef EXP
#undef TANH

#define T double
#define SFX _f64
#define EXP exp
#define TANH tanh
#include "attention_cpu_impl.h"
#undef T
#undef SFX
#undef EXP
#undef TANH

fg_status fg_attn_cpu_forward(const fg_attn_problem *pb,
                              const fg_attn_tensor *q, const fg_attn_tensor *k,
                              const fg_attn_tensor *v, const fg_attn_tensor *o,
                              const fg_attn_stats *st)
{
    if (pb->dtype == FG_FP64)
        return forward_f64(pb, q, k, v, o, st);
    return forward_f32(pb, q, k, v, o, st);
}

fg_status fg_attn_cpu_backward(const fg_attn_problem *pb,
                               const fg_attn_tensor *q, const fg_attn_tensor *k,
                               const fg_attn_tensor *v, const fg_attn_tensor *o,
                               const fg_attn_tensor *dout,
                               const fg_attn_stats *st,
                               const fg_attn_tensor *dq,
                               const fg_attn_tensor *dk,
                               const fg_attn_tensor *dv)
{
    if (pb->dtype == FG_FP64)
        return backward_f64(pb, q, k, v, o, dout, st, dq, dk, dv);
    return backward_f32(pb, q, k, v, o, dout, st, dq, dk, dv);
}
