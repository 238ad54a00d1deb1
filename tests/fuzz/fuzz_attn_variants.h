/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_attn_variants.h - the attention variants for
 * fuzz_attention.c: the bytes draw the causal alignment, window_left/right,
 * softcap, ALiBi slopes ([H] or [B, H]) and a block mask (built with
 * fg_attn_block_mask_build from a random block map), sometimes with one
 * bad value each; a model of attention.h's rules says whether they are
 * valid, and the naive reference gets the same variants (the dense map,
 * not the library's lists). */
#ifndef FG_TESTS_FUZZ_ATTN_VARIANTS_H
#define FG_TESTS_FUZZ_ATTN_VARIANTS_H

#include <float.h>
#include <math.h>
#include <stdint.h>

#include <flashgrad/flashgrad.h>

#include "../naive_attention.h"
#include "fuzz_util.h"

enum { FV_SLOPES = 16, FV_MAP = 64, FV_STORAGE = 256 };

typedef struct fz_variants {
    int ok; /* the model: every variant field valid */
    _Alignas(8) float slopes[FV_SLOPES + 1]; /* +1: a misaligned start */
    uint8_t map[FV_MAP];                     /* [mb, mh, nqb, nkb] */
    int32_t storage[FV_STORAGE];
    fg_attn_block_mask bm;
    int64_t mb, mh;
} fz_variants;

static int64_t fv_blocks(int64_t n)
{
    return (n + FG_ATTN_SPARSE_BLOCK - 1) / FG_ATTN_SPARSE_BLOCK;
}

static void fv_alibi(fz *f, fg_attn_params *p, fz_variants *v)
{
    const int64_t B = p->batch, H = p->heads_q;
    const uint8_t c = fz_u8(f);
    p->alibi_stride_b = c & 1 ? H : 0;
    const int64_t n = (c & 1 ? B : 1) * H;
    for (int64_t i = 0; i < n; i++) /* finite, either sign */
        v->slopes[i] = (float)(fz_u8(f) / 170.0 - 0.5);
    p->alibi_slopes = v->slopes;
    switch (c >> 1 & 7) { /* rarely, one bad field */
    case 1:
        v->slopes[fz_u8(f) % n] = (c & 16) ? NAN : -INFINITY;
        v->ok = 0;
        break;
    case 2:
        p->alibi_stride_b = H + 1; /* neither [H] nor [B, H] */
        v->ok = 0;
        break;
    case 3:
        p->alibi_slopes = (const float *)((const char *)v->slopes + 2);
        v->ok = 0;
        break;
    default:
        break;
    }
}

/* A map of random bits, its lists from the builder, sometimes damaged. */
static void fv_block_mask(fz *f, fg_attn_params *p, fz_variants *v)
{
    const uint8_t c = fz_u8(f);
    const int64_t B = p->batch, H = p->heads_q;
    int64_t nqb = fv_blocks(p->seqlen_q), nkb = fv_blocks(p->seqlen_k);
    v->mb = c & 1 ? B : 1;
    v->mh = c & 2 ? H : 1;
    const int bad_shape = (c >> 2 & 15) == 1;
    if (bad_shape) { /* a shape this problem does not have */
        if (c & 64)
            nqb++;
        else
            v->mb = B + 1;
    }
    const int64_t cells = v->mb * v->mh * nqb * nkb;
    if (cells > FV_MAP ||
        fg_attn_block_mask_storage(v->mb, v->mh, nqb, nkb) > FV_STORAGE)
        return; /* no block mask this time */
    const uint8_t density = fz_u8(f);
    for (int64_t i = 0; i < cells; i++)
        v->map[i] = fz_u8(f) < density;
    const fg_status s = fg_attn_block_mask_build(&v->bm, v->map, v->mb, v->mh,
                                                 nqb, nkb, v->storage,
                                                 FG_DEVICE_CPU);
    FZ_CHECK(s == FG_OK, "block mask build: %s", fg_last_error());
    p->block_mask = &v->bm;
    if (bad_shape) {
        v->ok = 0;
        return;
    }
    int32_t *kv_count = (int32_t *)v->bm.kv_count;
    int32_t *kv_index = (int32_t *)v->bm.kv_index;
    int32_t *q_count = (int32_t *)v->bm.q_count;
    const int64_t rows = v->mb * v->mh * nqb, r = fz_u8(f) % rows;
    switch (c >> 2 & 15) { /* rarely, damaged lists */
    case 2:
        kv_count[r] = (int32_t)nkb + 1;
        v->ok = 0;
        break;
    case 3:
        if (kv_count[r] > 0) { /* past the last key block */
            kv_index[r * nkb] = (int32_t)nkb;
            v->ok = 0;
        }
        break;
    case 4:
        for (int64_t k = 0; k < v->mb * v->mh * nkb; k++)
            if (q_count[k] > 0) { /* the q lists lose a block */
                q_count[k]--;
                v->ok = 0;
                break;
            }
        break;
    case 5:
        v->bm.q_index = NULL;
        v->ok = 0;
        break;
    default:
        break;
    }
}

/* Draws the variants into p and v (v->ok: the model's verdict). */
static void fv_decode(fz *f, fg_attn_params *p, fz_variants *v)
{
    memset(v, 0, sizeof *v);
    v->ok = 1;
    const uint8_t on = fz_u8(f);
    if (on & 1)
        p->causal_align = FG_ATTN_ALIGN_TOP_LEFT;
    if (on & 2) {
        static const int64_t w[] = {-1, 0,   1,   2,         3,
                                    7,  100, 130, INT64_MAX, -2};
        p->window_left = FZ_PICK(f, w);
        p->window_right = FZ_PICK(f, w);
        if (p->window_left < -1 || p->window_right < -1)
            v->ok = 0;
    }
    if (on & 4) {
        static const double caps[] = {0.5, 1,        2,   5,     30,   0,
                                      -1,  INFINITY, NAN, 1e300, 1e-39};
        p->softcap = FZ_PICK(f, caps);
        /* fp32 must hold it and its inverse as normal numbers */
        if (!(p->softcap >= 0 && isfinite(p->softcap)) ||
            (p->softcap > 0 && (p->softcap > FLT_MAX || p->softcap < FLT_MIN)))
            v->ok = 0;
    }
    if (on & 8)
        fv_alibi(f, p, v);
    if (on & 16)
        fv_block_mask(f, p, v);
    if ((on & 0xe0) == 0xe0) { /* an alignment that does not exist */
        p->causal_align = on & 1 ? -1 : 2;
        v->ok = 0;
    }
}

/* The same variants for the naive reference. */
static void fv_reference(const fg_attn_params *p, const fz_variants *v,
                         naive_shape *ns)
{
    ns->top_left = p->causal_align == FG_ATTN_ALIGN_TOP_LEFT;
    ns->window = 1;
    ns->window_left = p->window_left;
    ns->window_right = p->window_right;
    ns->softcap = p->softcap;
    ns->alibi = p->alibi_slopes;
    ns->alibi_sb = p->alibi_stride_b;
    if (p->block_mask) {
        ns->block_map = v->map;
        ns->map_b = v->mb;
        ns->map_h = v->mh;
    }
}

#endif /* FG_TESTS_FUZZ_ATTN_VARIANTS_H */
