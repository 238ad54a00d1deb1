/* lib/attention/attention_internal.h - the validated attention problem handed from the
 * public API (attention.c) to the device backends (attention_cpu.c and the
 * CUDA kernels). Backends may assume everything here has been checked. */
#ifndef FG_LIB_ATTENTION_INTERNAL_H
#define FG_LIB_ATTENTION_INTERNAL_H

#include "flashgrad/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FG_ATTN_DEFAULT_BLOCK_Q 64
#define FG_ATTN_DEFAULT_BLOCK_K 64
#define FG_ATTN_MAX_BLOCK 1024
/* Largest num_threads accepted (a sanity bound; the CPU backend also never
 * starts more threads than there are processors). */
#define FG_ATTN_MAX_THREADS 1024

typedef struct fg_attn_problem {
    int64_t B, Nq, Nk, H, Hk, d;
    int64_t group;        /* H / Hk query heads per K/V head */
    double scale;         /* resolved softmax scale */
    int causal;
    int64_t causal_shift; /* Nk - Nq: query i sees key j iff j <= i + shift */
    double dropout_p;
    uint32_t keep_threshold; /* fg_dropout_threshold(p) */
    double keep_scale;       /* 1 / (1 - p) */
    uint64_t seed, offset;
    int block_q, block_k, num_threads;
    fg_dtype dtype;          /* operand dtype */
    fg_dtype stats_dtype;    /* FG_FP64 for fp64 operands, else FG_FP32 */
    void *stream;            /* cudaStream_t (CUDA only) */
    int deterministic;       /* CUDA backward without dQ atomics */
} fg_attn_problem;

/* CPU backend (attention_cpu.c). */
fg_status fg_attn_cpu_forward(const fg_attn_problem *pb,
                              const fg_attn_tensor *q, const fg_attn_tensor *k,
                              const fg_attn_tensor *v, const fg_attn_tensor *o,
                              const fg_attn_stats *st);
fg_status fg_attn_cpu_backward(const fg_attn_problem *pb,
                               const fg_attn_tensor *q, const fg_attn_tensor *k,
                               const fg_attn_tensor *v, const fg_attn_tensor *o,
                               const fg_attn_tensor *dout,
                               const fg_attn_stats *st,
                               const fg_attn_tensor *dq,
                               const fg_attn_tensor *dk,
                               const fg_attn_tensor *dv);
/* Keep flags for columns j0 .. j0+n-1 of row i of (b, h): out[c] = 1/0. */
void fg_dropout_row(const fg_attn_problem *pb, int64_t b, int64_t h, int64_t i,
                    int64_t j0, int64_t n, uint8_t *out);

/* CUDA backend (kernels/attention/); when the library is built without
 * CUDA, kernels/attention/attn_stub.c returns FG_ERR_UNSUPPORTED. */
fg_status fg_attn_cuda_forward(const fg_attn_problem *pb,
                               const fg_attn_tensor *q, const fg_attn_tensor *k,
                               const fg_attn_tensor *v, const fg_attn_tensor *o,
                               const fg_attn_stats *st);
fg_status fg_attn_cuda_backward(const fg_attn_problem *pb,
                                const fg_attn_tensor *q,
                                const fg_attn_tensor *k,
                                const fg_attn_tensor *v,
                                const fg_attn_tensor *o,
                                const fg_attn_tensor *dout,
                                const fg_attn_stats *st,
                                const fg_attn_tensor *dq,
                                const fg_attn_tensor *dk,
                                const fg_attn_tensor *dv);
fg_status fg_attn_cuda_dropout_mask(const fg_attn_problem *pb, uint8_t *mask);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_ATTENTION_INTERNAL_H */
