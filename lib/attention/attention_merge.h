/* SPDX-License-Identifier: MIT */
/* lib/attention/attention_merge.h - the validated problem of
 * fg_attention_merge (attention.h), handed from the public entry point
 * (attention_merge.c) to the CPU loop there or to the CUDA kernel
 * (kernels/attention/attn_merge.cu). Kept apart from attention_internal.h so
 * the merge can change without touching the attention core. */
#ifndef FG_LIB_ATTENTION_MERGE_H
#define FG_LIB_ATTENTION_MERGE_H

#include "flashgrad/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One operand: O ([B, Nq, H, d], element strides) and its statistics m, l
 * (contiguous [B, H, Nq], of dtype st_dtype). */
typedef struct fg_attn_merge_operand {
    void *o;
    fg_dtype o_dtype;
    int64_t sb, ss, sh;
    void *m, *l;
    fg_dtype st_dtype;
} fg_attn_merge_operand;

typedef struct fg_attn_merge_problem {
    int64_t B, Nq, H, d;
    int n;                               /* parts, >= 1 */
    const fg_attn_merge_operand *parts;  /* n of them */
    fg_attn_merge_operand out;
    int acc_fp64;    /* arithmetic in fp64 (some operand is fp64) */
    int num_threads; /* CPU */
    void *stream;    /* cudaStream_t (CUDA) */
} fg_attn_merge_problem;

/* CUDA backend (kernels/attention/attn_merge.cu; without CUDA the stub in
 * kernels/attention/attn_merge_stub.c returns FG_ERR_UNSUPPORTED). */
fg_status fg_attn_cuda_merge(const fg_attn_merge_problem *mp);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_ATTENTION_MERGE_H */
