/* SPDX-License-Identifier: MIT */
/* lib/attention/attention_varlen.c - packed variable-length batches and key
 * padding: validation of cu_seqlens_q/k, total_q/k and seqused_k (before
 * anything is written) and the per-sequence view of attention_varlen.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_varlen.h"
#include "kernels/runtime/device.h"
#include "lib/core/error.h"

static fg_status check_array(const int32_t *a, const char *name,
                             fg_device dev, const char *fn)
{
    if ((uintptr_t)a % sizeof(int32_t) != 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s is not 4-byte aligned", fn, name);
    if (dev == FG_DEVICE_CUDA)
        return fg_cuda_check_pointer(a, name);
    return FG_OK;
}

/* cu[0] = 0, non-decreasing, every length <= max_len, cu[B] <= total. */
static fg_status check_cu(const int32_t *cu, int64_t B, int64_t max_len,
                          int64_t total, const char *name, const char *fn)
{
    if (cu[0] != 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s[0] must be 0, got %d", fn, name, cu[0]);
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: %s must be non-decreasing, but %s[%lld] = %d "
                            "< %s[%lld] = %d",
                            fn, name, name, (long long)(b + 1), cu[b + 1],
                            name, (long long)b, cu[b]);
        if (len > max_len)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: sequence %lld of %s has length %lld, more "
                            "than the maximum %lld (seqlen_q/seqlen_k)",
                            fn, (long long)b, name, (long long)len,
                            (long long)max_len);
    }
    if (cu[B] > total)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s[B] = %d is past the %lld rows of the packed "
                        "buffer",
                        fn, name, cu[B], (long long)total);
    return FG_OK;
}

/* 0 <= used[b] <= the key length of sequence b. */
static fg_status check_used(const int32_t *used, const int32_t *cu_k,
                            int64_t B, int64_t Nk, const char *fn)
{
    for (int64_t b = 0; b < B; b++) {
        const int64_t nk = cu_k ? (int64_t)cu_k[b + 1] - cu_k[b] : Nk;
        if (used[b] < 0 || used[b] > nk)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: seqused_k[%lld] = %d is outside [0, %lld] "
                            "(the sequence's key length)",
                            fn, (long long)b, used[b], (long long)nk);
    }
    return FG_OK;
}

/* The host copies (cu_seqlens_q_host, ...): each only beside its array,
 * 4-byte aligned; on the CPU equal to it (the kernels read the array, so
 * validating a copy that differs would validate nothing). */
static fg_status check_copies(const fg_attn_params *p, int64_t B,
                              const char *fn)
{
    const struct {
        const int32_t *a, *h;
        int64_t n;
        const char *name;
    } c[3] = {{p->cu_seqlens_q, p->cu_seqlens_q_host, B + 1, "cu_seqlens_q"},
              {p->cu_seqlens_k, p->cu_seqlens_k_host, B + 1, "cu_seqlens_k"},
              {p->seqused_k, p->seqused_k_host, B, "seqused_k"}};
    for (int i = 0; i < 3; i++) {
        if (!c[i].h)
            continue;
        if (!c[i].a)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: %s_host is given without %s", fn, c[i].name,
                            c[i].name);
        if ((uintptr_t)c[i].h % sizeof(int32_t) != 0)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: %s_host is not 4-byte aligned", fn,
                            c[i].name);
        if (p->device != FG_DEVICE_CUDA &&
            memcmp(c[i].a, c[i].h, sizeof(int32_t) * (size_t)c[i].n) != 0)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: %s_host differs from %s (a host copy must "
                            "hold the array's values)",
                            fn, c[i].name, c[i].name);
    }
    return FG_OK;
}

/* The arrays' values, on the host: the CPU's own, p's host copies when
 * it has every array's (CUDA: nothing read back, no wait), or one copy of
 * each array from the device (synchronous on the caller's stream, so
 * work enqueued before that writes them is seen). *host is freed by the
 * caller. */
static fg_status host_arrays(const fg_attn_params *p, int64_t B,
                             const int32_t **cq, const int32_t **ck,
                             const int32_t **used, int32_t **host,
                             const char *fn)
{
    *cq = p->cu_seqlens_q;
    *ck = p->cu_seqlens_k;
    *used = p->seqused_k;
    *host = NULL;
    if (p->device != FG_DEVICE_CUDA)
        return FG_OK;
    if ((!p->cu_seqlens_q || (p->cu_seqlens_q_host && p->cu_seqlens_k_host)) &&
        (!p->seqused_k || p->seqused_k_host)) {
        *cq = p->cu_seqlens_q_host;
        *ck = p->cu_seqlens_k_host;
        *used = p->seqused_k_host;
        return FG_OK;
    }
    int32_t *h = malloc(sizeof(int32_t) * (size_t)(3 * B + 2));
    if (!h)
        return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: cu_seqlens host copy", fn);
    *host = h;
    if (p->cu_seqlens_q) {
        FG_TRY(fg_attn_cuda_read_ints(h, p->cu_seqlens_q, B + 1, p->cuda_stream));
        *cq = *ck = h;
        /* Self-attention usually passes one array for both: one copy, as
         * each is a round trip to the device (a synchronisation). */
        if (p->cu_seqlens_k != p->cu_seqlens_q) {
            FG_TRY(fg_attn_cuda_read_ints(h + B + 1, p->cu_seqlens_k, B + 1,
                                          p->cuda_stream));
            *ck = h + B + 1;
        }
    }
    if (p->seqused_k) {
        FG_TRY(fg_attn_cuda_read_ints(h + 2 * B + 2, p->seqused_k, B,
                                      p->cuda_stream));
        *used = h + 2 * B + 2;
    }
    return FG_OK;
}

fg_status fg_attn_check_varlen(const fg_attn_params *p, fg_attn_problem *pb,
                               const char *fn)
{
    pb->varlen = 0;
    pb->cu_q = pb->cu_k = NULL;
    pb->total_q = pb->total_k = 0;
    pb->seqused_k = NULL;
    pb->top_left = p->causal_align == FG_ATTN_ALIGN_TOP_LEFT;
    pb->st_b = pb->H * pb->Nq;
    pb->st_h = pb->Nq;
    /* Checked first so the answer does not depend on the offsets' values
     * (attention_bias.c repeats it for a backward's lone dbias). */
    if (p->bias && (p->cu_seqlens_q || p->cu_seqlens_k || p->seqused_k))
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: bias with varlen is not supported", fn);
    if (!p->cu_seqlens_q != !p->cu_seqlens_k)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: cu_seqlens_q and cu_seqlens_k must be given "
                        "together",
                        fn);
    const int varlen = p->cu_seqlens_q != NULL;
    if (!varlen && !p->seqused_k) {
        FG_TRY(check_copies(p, pb->B, fn)); /* a copy without its array */
        return FG_OK;
    }
    if (varlen && p->block_mask)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: block masks are per padded batch and cannot be "
                        "combined with cu_seqlens",
                        fn);
    if (varlen) {
        if (p->total_q < 0 || p->total_k < 0 || p->total_q > INT32_MAX ||
            p->total_k > INT32_MAX)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: total_q and total_k must be in [0, 2^31), "
                            "got %lld, %lld",
                            fn, (long long)p->total_q, (long long)p->total_k);
        FG_TRY(check_array(p->cu_seqlens_q, "cu_seqlens_q", p->device, fn));
        FG_TRY(check_array(p->cu_seqlens_k, "cu_seqlens_k", p->device, fn));
    }
    if (p->seqused_k)
        FG_TRY(check_array(p->seqused_k, "seqused_k", p->device, fn));
    FG_TRY(check_copies(p, pb->B, fn));

    const int32_t *cq, *ck, *used;
    int32_t *host;
    fg_status st = host_arrays(p, pb->B, &cq, &ck, &used, &host, fn);
    if (st == FG_OK && varlen)
        st = check_cu(cq, pb->B, pb->Nq, p->total_q, "cu_seqlens_q", fn);
    if (st == FG_OK && varlen)
        st = check_cu(ck, pb->B, pb->Nk, p->total_k, "cu_seqlens_k", fn);
    if (st == FG_OK && used)
        st = check_used(used, varlen ? ck : NULL, pb->B, pb->Nk, fn);
    free(host);
    if (st != FG_OK)
        return st;
    pb->varlen = varlen;
    pb->seqused_k = p->seqused_k;
    if (varlen) {
        pb->cu_q = p->cu_seqlens_q;
        pb->cu_k = p->cu_seqlens_k;
        pb->total_q = p->total_q;
        pb->total_k = p->total_k;
        pb->st_b = 0;
        pb->st_h = p->total_q;
    }
    return FG_OK;
}

/* ---- the per-sequence view (host arrays: the CPU backend) ------------ */

fg_attn_seq fg_attn_seq_of(const fg_attn_problem *pb, int64_t b)
{
    fg_attn_seq s = {0, 0, pb->Nq, pb->Nk, pb->Nk};
    if (pb->varlen) {
        s.q0 = pb->cu_q[b];
        s.k0 = pb->cu_k[b];
        s.nq = pb->cu_q[b + 1] - s.q0;
        s.nk = pb->cu_k[b + 1] - s.k0;
        s.used = s.nk;
    }
    if (pb->seqused_k)
        s.used = pb->seqused_k[b];
    return s;
}

static void seq_problem(const fg_attn_problem *pb, const fg_attn_seq *s,
                        fg_attn_problem *out)
{
    *out = *pb;
    out->Nq = s->nq;
    out->Nk = s->used;
    /* The alignment uses the sequence's own lengths; padding masks keys
     * but does not move the corner. */
    out->causal_shift = pb->top_left ? 0 : s->nk - s->nq;
}

static fg_attn_tensor seq_tensor(const fg_attn_problem *pb,
                                 const fg_attn_tensor *t, int64_t row0)
{
    fg_attn_tensor r = *t;
    if (pb->varlen) {
        r.data = (char *)t->data +
                 (size_t)(row0 * t->stride_s) * fg_dtype_size(t->dtype);
        r.stride_b = 0;
    }
    return r;
}

static fg_attn_stats seq_stats(const fg_attn_problem *pb,
                               const fg_attn_stats *st, int64_t q0)
{
    fg_attn_stats r = *st;
    if (pb->varlen) {
        const size_t off = (size_t)q0 * fg_dtype_size(st->dtype);
        r.m = (char *)st->m + off;
        r.l = (char *)st->l + off;
    }
    return r;
}

fg_attn_seq fg_attn_seq_views(const fg_attn_problem *pb, int64_t b,
                              fg_attn_problem *sp,
                              const fg_attn_tensor *const *in, int n_q, int n,
                              fg_attn_tensor *out, const fg_attn_stats *st,
                              fg_attn_stats *st_out)
{
    const fg_attn_seq s = fg_attn_seq_of(pb, b);
    seq_problem(pb, &s, sp);
    for (int i = 0; i < n; i++)
        out[i] = seq_tensor(pb, in[i], i < n_q ? s.q0 : s.k0);
    *st_out = seq_stats(pb, st, s.q0);
    return s;
}
