/* SPDX-License-Identifier: MIT */
/* lib/attention/attention_varlen.h - packed variable-length batches and key
 * padding (fg_attn_params.cu_seqlens_q/k, seqused_k): validation, and the
 * per-sequence view the CPU backend runs each sequence through. */
#ifndef FG_LIB_ATTENTION_VARLEN_H
#define FG_LIB_ATTENTION_VARLEN_H

#include "attention_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks cu_seqlens_q/k, total_q/k and seqused_k of p (on CUDA from their
 * host copies in p when it has them all, else through a synchronous copy
 * of the arrays to the host, on params.cuda_stream) and fills the matching
 * fields of pb, which already holds the sizes. Runs before the operands
 * are checked: packed operands are [total, heads, d]. */
fg_status fg_attn_check_varlen(const fg_attn_params *p, fg_attn_problem *pb,
                               const char *fn);

/* True when sequences differ from the dense [B, Nq] x [B, Nk] problem. */
static inline int fg_attn_ragged(const fg_attn_problem *pb)
{
    return pb->varlen || pb->seqused_k;
}

/* One sequence: its first rows in the packed Q and K (0 dense), its query
 * and key lengths and the keys it sees (used <= nk). Host arrays only. */
typedef struct fg_attn_seq {
    int64_t q0, k0, nq, nk, used;
} fg_attn_seq;
fg_attn_seq fg_attn_seq_of(const fg_attn_problem *pb, int64_t b);

/* All of sequence b at once: its problem *sp (Nq = nq, Nk = used: keys
 * past it do not exist for the mask; the causal shift of its own lengths,
 * nk - nq bottom-right, 0 top-left; b, h stay global for dropout, ALiBi
 * and the stats strides), the stats moved to its first packed row, and
 * the n operands in[] moved to its rows into out[] (the first n_q are
 * Q-like, the rest K-like; packed ones drop stride_b, since each sequence
 * is batch b of a [1, total, heads, d] buffer). Dense: only Nk changes.
 * Returns the sequence. */
fg_attn_seq fg_attn_seq_views(const fg_attn_problem *pb, int64_t b,
                              fg_attn_problem *sp,
                              const fg_attn_tensor *const *in, int n_q, int n,
                              fg_attn_tensor *out, const fg_attn_stats *st,
                              fg_attn_stats *st_out);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_ATTENTION_VARLEN_H */
