/* SPDX-License-Identifier: MIT */
/* lib/attention/attention_mask.c - the attention variants' parameters:
 * validation of the window, causal alignment, softcap, ALiBi slopes and
 * block mask (all before anything is written), and the block-mask builder. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "attention_internal.h"
#include "kernels/runtime/device.h"
#include "lib/core/error.h"

/* The largest power of two <= min(x, FG_ATTN_SPARSE_BLOCK): a CPU tile that
 * never straddles a sparse block. */
static int sparse_tile(int x)
{
    int t = FG_ATTN_SPARSE_BLOCK;
    while (t > x)
        t /= 2;
    return t;
}

static fg_status check_slopes(const fg_attn_params *p, fg_attn_problem *pb,
                              const char *fn)
{
    if (p->alibi_stride_b != 0 && p->alibi_stride_b != pb->H)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: alibi_stride_b must be 0 (slopes [H]) or H = %lld "
                        "(slopes [B, H]), got %lld",
                        fn, (long long)pb->H, (long long)p->alibi_stride_b);
    if ((uintptr_t)p->alibi_slopes % sizeof(float) != 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: alibi_slopes is not 4-byte aligned", fn);
    const int64_t n = (p->alibi_stride_b ? pb->B : 1) * pb->H;
    const float *s = p->alibi_slopes;
    float *host = NULL;
    if (p->device == FG_DEVICE_CUDA) {
#ifdef FG_HAVE_CUDA
        /* A small synchronous read-back, on the call's stream (the one
         * the caller ordered the slopes' writes on): a bad slope is
         * refused here instead of turning rows into NaN. The bits are
         * copied as 4-byte words, never converted. */
        FG_TRY(fg_cuda_check_pointer(p->alibi_slopes, "alibi_slopes"));
        host = malloc(sizeof(float) * (size_t)n);
        if (!host)
            return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: slopes copy", fn);
        fg_status st = fg_attn_cuda_read_ints((int32_t *)host,
                                              (const int32_t *)s, n,
                                              p->cuda_stream);
        if (st != FG_OK) {
            free(host);
            return st;
        }
        s = host;
#endif
    }
    fg_status st = FG_OK;
    for (int64_t i = 0; i < n && st == FG_OK; i++)
        if (!isfinite(s[i]))
            st = fg_error(FG_ERR_INVALID_ARGUMENT,
                          "%s: alibi_slopes[%lld] = %g is not finite", fn,
                          (long long)i, (double)s[i]);
    free(host);
    pb->alibi = p->alibi_slopes;
    pb->alibi_sb = p->alibi_stride_b;
    return st;
}

/* Counts in [0, n_other], indices strictly ascending in [0, n_other): the
 * CUDA kernels also skip out-of-range entries, so a bad list read there
 * cannot reach outside K or Q. */
static fg_status check_lists(const int32_t *count, const int32_t *index,
                             int64_t rows, int64_t n_other, const char *what,
                             const char *fn)
{
    for (int64_t r = 0; r < rows; r++) {
        const int32_t c = count[r];
        if (c < 0 || c > n_other)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: block_mask %s count[%lld] = %d is outside "
                            "[0, %lld]",
                            fn, what, (long long)r, c, (long long)n_other);
        for (int32_t x = 0; x < c; x++) {
            const int32_t v = index[r * n_other + x];
            if (v < 0 || v >= n_other ||
                (x > 0 && v <= index[r * n_other + x - 1]))
                return fg_error(FG_ERR_INVALID_ARGUMENT,
                                "%s: block_mask %s list %lld is not strictly "
                                "ascending in [0, %lld) at entry %d",
                                fn, what, (long long)r, (long long)n_other, x);
        }
    }
    return FG_OK;
}

/* The kv lists and the q lists must name the same blocks. */
static fg_status check_transpose(const fg_attn_block_mask *m, const char *fn)
{
    const int64_t nq = m->q_blocks, nk = m->k_blocks;
    uint8_t *seen = calloc((size_t)(nq * nk), 1);
    if (!seen)
        return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: block mask check", fn);
    fg_status st = FG_OK;
    for (int64_t bh = 0; bh < m->batch * m->heads && st == FG_OK; bh++) {
        memset(seen, 0, (size_t)(nq * nk));
        int64_t total = 0;
        for (int64_t qb = 0; qb < nq; qb++)
            for (int32_t x = 0; x < m->kv_count[bh * nq + qb]; x++, total++)
                seen[qb * nk + m->kv_index[(bh * nq + qb) * nk + x]] = 1;
        for (int64_t kb = 0; kb < nk && st == FG_OK; kb++)
            for (int32_t x = 0; x < m->q_count[bh * nk + kb]; x++, total--)
                if (!seen[m->q_index[(bh * nk + kb) * nq + x] * nk + kb])
                    st = fg_error(FG_ERR_INVALID_ARGUMENT,
                                  "%s: block_mask q lists name block (%d, "
                                  "%lld) that the kv lists do not",
                                  fn, m->q_index[(bh * nk + kb) * nq + x],
                                  (long long)kb);
        if (st == FG_OK && total != 0)
            st = fg_error(FG_ERR_INVALID_ARGUMENT,
                          "%s: block_mask kv and q lists hold different "
                          "blocks",
                          fn);
    }
    free(seen);
    return st;
}

static fg_status check_block_mask(const fg_attn_params *p, fg_attn_problem *pb,
                                  const char *fn)
{
    const fg_attn_block_mask *m = p->block_mask;
    const int64_t nqb = (pb->Nq + FG_ATTN_SPARSE_BLOCK - 1) / FG_ATTN_SPARSE_BLOCK;
    const int64_t nkb = (pb->Nk + FG_ATTN_SPARSE_BLOCK - 1) / FG_ATTN_SPARSE_BLOCK;
    if ((m->batch != 1 && m->batch != pb->B) ||
        (m->heads != 1 && m->heads != pb->H) || m->q_blocks != nqb ||
        m->k_blocks != nkb)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: block_mask is [%lld, %lld, %lld, %lld] but this "
                        "problem needs [1 or %lld, 1 or %lld, %lld, %lld] "
                        "(blocks of %d)",
                        fn, (long long)m->batch, (long long)m->heads,
                        (long long)m->q_blocks, (long long)m->k_blocks,
                        (long long)pb->B, (long long)pb->H, (long long)nqb,
                        (long long)nkb, FG_ATTN_SPARSE_BLOCK);
    const int32_t *arr[4] = {m->kv_count, m->kv_index, m->q_count, m->q_index};
    static const char *names[4] = {"kv_count", "kv_index", "q_count",
                                   "q_index"};
    for (int i = 0; i < 4; i++) {
        if (!arr[i] || (uintptr_t)arr[i] % sizeof(int32_t))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: block_mask %s is NULL or misaligned", fn,
                            names[i]);
        if (p->device == FG_DEVICE_CUDA)
            FG_TRY(fg_cuda_check_pointer(arr[i], names[i]));
    }
    if (p->device == FG_DEVICE_CPU) {
        const int64_t bh = m->batch * m->heads;
        FG_TRY(check_lists(m->kv_count, m->kv_index, bh * nqb, nkb, "kv", fn));
        FG_TRY(check_lists(m->q_count, m->q_index, bh * nkb, nqb, "q", fn));
        FG_TRY(check_transpose(m, fn));
    }
    pb->sparse = 1;
    pb->bm = *m;
    pb->block_q = sparse_tile(pb->block_q);
    pb->block_k = sparse_tile(pb->block_k);
    return FG_OK;
}

fg_status fg_attn_check_variants(const fg_attn_params *p, fg_attn_problem *pb,
                                 const char *fn)
{
    if (p->causal_align != FG_ATTN_ALIGN_BOTTOM_RIGHT &&
        p->causal_align != FG_ATTN_ALIGN_TOP_LEFT)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: causal_align must be FG_ATTN_ALIGN_BOTTOM_RIGHT "
                        "or FG_ATTN_ALIGN_TOP_LEFT, got %d",
                        fn, p->causal_align);
    if (p->window_left < -1 || p->window_right < -1)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: window_left/window_right must be >= -1 (-1 = "
                        "unbounded), got %lld, %lld",
                        fn, (long long)p->window_left,
                        (long long)p->window_right);
    if (!isfinite(p->softcap) || p->softcap < 0.0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: softcap must be finite and >= 0 (0 = off), got %g",
                        fn, p->softcap);
    /* The fp32 paths hold softcap and 1 / softcap as floats: outside
     * [FLT_MIN, FLT_MAX] one of them is inf (or flushed to 0) and every
     * score NaN. As for softmax_scale, fp64 accepts exactly what fp32
     * does. */
    if (p->softcap > 0.0 && (p->softcap > FLT_MAX || p->softcap < FLT_MIN))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: softcap %g is outside [%g, %g] (it and its "
                        "inverse must be normal fp32 numbers)",
                        fn, p->softcap, (double)FLT_MIN, (double)FLT_MAX);
    pb->causal_shift = p->causal_align == FG_ATTN_ALIGN_TOP_LEFT
                           ? 0
                           : p->seqlen_k - p->seqlen_q;
    /* A window of 2^62 or more bounds nothing either: as unbounded, its
     * i' +- window arithmetic cannot overflow (INT64_MAX once wrapped to
     * an empty band: zero output, zero gradients). */
    pb->win_lo = p->window_left >= 0 && p->window_left < FG_ATTN_UNBOUNDED
                     ? -p->window_left
                     : -FG_ATTN_UNBOUNDED;
    pb->win_hi = p->window_right >= 0 && p->window_right < FG_ATTN_UNBOUNDED
                     ? p->window_right
                     : FG_ATTN_UNBOUNDED;
    if (p->causal && pb->win_hi > 0)
        pb->win_hi = 0;
    pb->band = pb->win_lo > -FG_ATTN_UNBOUNDED || pb->win_hi < FG_ATTN_UNBOUNDED;
    pb->softcap = p->softcap;
    pb->alibi = NULL;
    pb->alibi_sb = 0;
    pb->sparse = 0;
    memset(&pb->bm, 0, sizeof pb->bm);
    if (p->alibi_slopes)
        FG_TRY(check_slopes(p, pb, fn));
    if (p->block_mask)
        FG_TRY(check_block_mask(p, pb, fn));
    return FG_OK;
}

/* ---- block-mask builder ---------------------------------------------- */

int64_t fg_attn_block_mask_storage(int64_t mb, int64_t mh, int64_t nqb,
                                   int64_t nkb)
{
    if (mb < 1 || mh < 1 || nqb < 1 || nkb < 1 || nqb > INT32_MAX ||
        nkb > INT32_MAX)
        return -1;
    int64_t per = 0, n = 0;
    if (__builtin_mul_overflow(nqb, nkb, &per) ||
        __builtin_add_overflow(per, per, &per) || /* both index lists */
        __builtin_add_overflow(per, nqb + nkb, &per) ||
        __builtin_mul_overflow(per, mb, &n) ||
        __builtin_mul_overflow(n, mh, &n))
        return -1;
    return n;
}

/* Where the four arrays of a mask of this shape live inside storage. */
static void carve(fg_attn_block_mask *m, int32_t *storage, int64_t mb,
                  int64_t mh, int64_t nqb, int64_t nkb)
{
    const int64_t bh = mb * mh;
    m->batch = mb;
    m->heads = mh;
    m->q_blocks = nqb;
    m->k_blocks = nkb;
    m->kv_count = storage;
    m->kv_index = storage + bh * nqb;
    m->q_count = storage + bh * nqb * (1 + nkb);
    m->q_index = storage + bh * (nqb * (1 + nkb) + nkb);
}

/* Fills the lists from a dense host map (used by the CPU build and by the
 * CUDA kernel's host twin in tests). */
static void build_host(const uint8_t *map, int64_t bh_n, int64_t nqb,
                       int64_t nkb, int32_t *kv_count, int32_t *kv_index,
                       int32_t *q_count, int32_t *q_index)
{
    for (int64_t bh = 0; bh < bh_n; bh++) {
        const uint8_t *mp = map + bh * nqb * nkb;
        for (int64_t qb = 0; qb < nqb; qb++) {
            int32_t c = 0;
            for (int64_t kb = 0; kb < nkb; kb++)
                if (mp[qb * nkb + kb])
                    kv_index[(bh * nqb + qb) * nkb + c++] = (int32_t)kb;
            kv_count[bh * nqb + qb] = c;
        }
        for (int64_t kb = 0; kb < nkb; kb++) {
            int32_t c = 0;
            for (int64_t qb = 0; qb < nqb; qb++)
                if (mp[qb * nkb + kb])
                    q_index[(bh * nkb + kb) * nqb + c++] = (int32_t)qb;
            q_count[bh * nkb + kb] = c;
        }
    }
}

fg_status fg_attn_block_mask_build(fg_attn_block_mask *out, const uint8_t *map,
                                   int64_t mb, int64_t mh, int64_t nqb,
                                   int64_t nkb, int32_t *storage,
                                   fg_device device)
{
    static const char fn[] = "fg_attn_block_mask_build";
    if (!out || !map || !storage)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: out, map and storage must not be NULL", fn);
    if (fg_attn_block_mask_storage(mb, mh, nqb, nkb) < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: bad mask shape [%lld, %lld, %lld, %lld]", fn,
                        (long long)mb, (long long)mh, (long long)nqb,
                        (long long)nkb);
    if ((uintptr_t)storage % sizeof(int32_t))
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: storage misaligned", fn);
    fg_attn_block_mask m;
    carve(&m, storage, mb, mh, nqb, nkb);
    if (device == FG_DEVICE_CUDA) {
        FG_TRY(fg_cuda_check_pointer(map, "map"));
        FG_TRY(fg_cuda_check_pointer(storage, "storage"));
        FG_TRY(fg_attn_cuda_block_mask_build(&m, map));
    } else if (device == FG_DEVICE_CPU) {
        build_host(map, mb * mh, nqb, nkb, (int32_t *)m.kv_count,
                   (int32_t *)m.kv_index, (int32_t *)m.q_count,
                   (int32_t *)m.q_index);
    } else {
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: unknown device %d", fn,
                        (int)device);
    }
    *out = m;
    return FG_OK;
}
