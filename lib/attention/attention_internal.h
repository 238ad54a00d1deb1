/* SPDX-License-Identifier: MIT */
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
    /* i' = i + causal_shift (Nk - Nq bottom-right, 0 top-left). Key j is
     * visible to query i iff win_lo <= j - i' <= win_hi (and j < Nk, and
     * its block is listed when sparse). band = 1 when either bound is
     * finite: causal is win_hi = min(window_right, 0). */
    int64_t causal_shift;
    int band;
    int64_t win_lo, win_hi;
    double softcap;          /* 0 = off */
    const float *alibi;      /* NULL = off; slope of (b, h): alibi[b*alibi_sb + h] */
    int64_t alibi_sb;
    int sparse;              /* bm is valid */
    fg_attn_block_mask bm;
    double dropout_p;
    uint32_t keep_threshold; /* fg_attention_dropout_threshold(p), 0..256 */
    double keep_scale;       /* 256 / keep_threshold (0 if that is 0) */
    uint64_t seed, offset;
    int block_q, block_k, num_threads;
    fg_dtype dtype;          /* operand dtype */
    fg_dtype stats_dtype;    /* FG_FP64 for fp64 operands, else FG_FP32 */
    void *stream;            /* cudaStream_t (CUDA only) */
    int deterministic;       /* CUDA backward without dQ atomics */
    /* Packed batches and key padding (attention_varlen.c). With varlen,
     * sequence b owns packed rows cu_q[b] .. cu_q[b+1]-1 of Q (cu_k: K);
     * Nq, Nk are the maximum lengths. seqused_k (dense or packed) masks
     * keys at or past seqused_k[b]. Both arrays live on the operands'
     * device (validated through a host copy). */
    int varlen;
    const int32_t *cu_q, *cu_k;
    int64_t total_q, total_k; /* rows of the packed buffers */
    const int32_t *seqused_k; /* NULL = no key padding */
    int top_left;             /* causal_align == FG_ATTN_ALIGN_TOP_LEFT */
    /* Stats (and the backward's D) element (b, h, i) is at
     * b * st_b + h * st_h + i: [B, H, Nq] dense (st_b = H Nq, st_h = Nq),
     * [H, total_q] packed (st_b = 0, st_h = total_q, i the packed row). */
    int64_t st_b, st_h;
    /* Additive bias and its gradient (attention_bias.c): data == NULL when
     * absent. Strides are zeroed on dimensions of extent 1, so a zero
     * stride always means "broadcast" (or a single index). dbias is only
     * set for the backward. */
    fg_attn_bias bias, dbias;
} fg_attn_problem;

/* No bound: |win_lo|, |win_hi| at this value never limit anything (and
 * i + shift +- it cannot overflow). */
#define FG_ATTN_UNBOUNDED ((int64_t)1 << 62)

static inline int64_t fg_attn_clamp(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}
/* Keys [begin, end) that rows i0 .. i1 (inclusive) may see through the
 * band; queries [begin, end) that keys j0 .. j1 may be seen by. */
static inline int64_t fg_attn_key_begin(const fg_attn_problem *pb, int64_t i0)
{
    return fg_attn_clamp(i0 + pb->causal_shift + pb->win_lo, 0, pb->Nk);
}
static inline int64_t fg_attn_key_end(const fg_attn_problem *pb, int64_t i1)
{
    return fg_attn_clamp(i1 + pb->causal_shift + pb->win_hi + 1, 0, pb->Nk);
}
static inline int64_t fg_attn_query_begin(const fg_attn_problem *pb, int64_t j0)
{
    return fg_attn_clamp(j0 - pb->causal_shift - pb->win_hi, 0, pb->Nq);
}
static inline int64_t fg_attn_query_end(const fg_attn_problem *pb, int64_t j1)
{
    return fg_attn_clamp(j1 - pb->causal_shift - pb->win_lo + 1, 0, pb->Nq);
}
/* The block-mask lists of (b, h): key blocks of query block qb, or query
 * blocks of key block kb (broadcast dimensions have extent 1). */
static inline const int32_t *fg_attn_kv_list(const fg_attn_problem *pb,
                                             int64_t b, int64_t h, int64_t qb,
                                             int32_t *count)
{
    const fg_attn_block_mask *m = &pb->bm;
    const int64_t r = ((m->batch > 1 ? b : 0) * m->heads +
                       (m->heads > 1 ? h : 0)) * m->q_blocks + qb;
    *count = m->kv_count[r];
    return m->kv_index + r * m->k_blocks;
}
static inline const int32_t *fg_attn_q_list(const fg_attn_problem *pb,
                                            int64_t b, int64_t h, int64_t kb,
                                            int32_t *count)
{
    const fg_attn_block_mask *m = &pb->bm;
    const int64_t r = ((m->batch > 1 ? b : 0) * m->heads +
                       (m->heads > 1 ? h : 0)) * m->k_blocks + kb;
    *count = m->q_count[r];
    return m->q_index + r * m->q_blocks;
}

/* 1 when t carries the strides fg_attn_bshd/bhsd give for sizes that
 * overflow (FG_ATTN_STRIDE_BAD), so the message can say so. */
int fg_attn_layout_bad(const fg_attn_tensor *t);

/* Variant parameters (attention_mask.c): checks window, softcap, ALiBi and
 * the block mask of p and fills the matching fields of pb (which already
 * holds the sizes, device and dtype). */
fg_status fg_attn_check_variants(const fg_attn_params *p, fg_attn_problem *pb,
                                 const char *fn);

/* Bias and dbias (attention_bias.c): checks p->bias (and, when backward,
 * p->dbias) and fills pb->bias / pb->dbias. `views` are the validated
 * operand views followed by stats.m and stats.l (n_views in all); the
 * first n_in operands are inputs, the other operands outputs, and the
 * stats are outputs of the forward. No output may overlap the bias, and
 * dbias may overlap nothing. */
struct fg_view;
fg_status fg_attn_check_bias(const fg_attn_params *p, fg_attn_problem *pb,
                             const struct fg_view *views, int n_views,
                             int n_in, int backward, const char *fn);
/* Offset of bias element (b, h, i, j) in elements. */
static inline int64_t fg_attn_bias_off(const fg_attn_bias *t, int64_t b,
                                       int64_t h, int64_t i, int64_t j)
{
    return b * t->stride_b + h * t->stride_h + i * t->stride_q +
           j * t->stride_k;
}

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
/* Copies n 4-byte words from the device to the host on `stream` and waits
 * for it (the validation of cu_seqlens, seqused_k and ALiBi slopes). */
fg_status fg_attn_cuda_read_ints(int32_t *host, const int32_t *dev, int64_t n,
                                 void *stream);
/* Fills the lists of m (device storage, carved) from a device block map. */
fg_status fg_attn_cuda_block_mask_build(const fg_attn_block_mask *m,
                                        const uint8_t *map);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_ATTENTION_INTERNAL_H */
