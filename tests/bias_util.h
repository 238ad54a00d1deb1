/* SPDX-License-Identifier: MIT */
/* tests/bias_util.h - host buffers for the attention bias and its gradient
 * in any broadcast pattern, dtype and layout, and the independent fp64
 * reference of dbias: the naive dS = dL/d(logit), [B, H, Nq, Nk], summed
 * over the broadcast dimensions here (not by the code under test). */
#ifndef FG_TESTS_BIAS_UTIL_H
#define FG_TESTS_BIAS_UTIL_H

#include "lowp.h"
#include "naive_attention.h"
#include "test_util.h"

/* Broadcast bits: the dimensions of [B, H, Nq, Nk] with a zero stride. */
enum { FGT_BC_B = 1, FGT_BC_H = 2, FGT_BC_Q = 4, FGT_BC_K = 8 };

/* Layouts of the stored (non-broadcast) dimensions. */
enum {
    FGT_BL_DENSE = 0, /* row-major [b, h, q, k] */
    FGT_BL_PADDED,    /* rows padded by 3, heads outside batches */
    FGT_BL_KMAJOR     /* [b, h, k, q]: stride_k != 1, rows padded by 1 */
};

typedef struct fgt_bias {
    fg_attn_bias desc; /* desc.data = host */
    void *host;
    size_t n;          /* elements of host, padding included */
    int64_t ext[4];    /* stored extents (1 where broadcast) */
    double *vals;      /* [ext] values as stored (rounded to the dtype) */
} fgt_bias;

/* Index of stored element (b, h, i, j) in vals. */
static inline size_t fgt_bias_idx(const fgt_bias *t, int64_t b, int64_t h,
                                  int64_t i, int64_t j)
{
    return (size_t)(((b * t->ext[1] + h) * t->ext[2] + i) * t->ext[3] + j);
}

static inline size_t fgt_bias_count(const fgt_bias *t)
{
    return (size_t)(t->ext[0] * t->ext[1] * t->ext[2] * t->ext[3]);
}

/* A bias-shaped host buffer filled with 0xff bytes (NaN in every dtype). */
static inline void fgt_bias_init(fgt_bias *t, int64_t B, int64_t H,
                                 int64_t Nq, int64_t Nk, int bcast,
                                 fg_dtype dt, int layout)
{
    memset(t, 0, sizeof *t);
    const int64_t full[4] = {B, H, Nq, Nk};
    for (int x = 0; x < 4; x++)
        t->ext[x] = (bcast >> x) & 1 ? 1 : full[x];
    const int64_t eb = t->ext[0], eh = t->ext[1], eq = t->ext[2], ek = t->ext[3];
    int64_t s[4];
    if (layout == FGT_BL_PADDED) {
        s[3] = 1;
        s[2] = ek + 3;
        s[0] = eq * s[2];
        s[1] = eb * s[0];
        t->n = (size_t)(eh * s[1]);
    } else if (layout == FGT_BL_KMAJOR) {
        s[2] = 1;
        s[3] = eq + 1;
        s[1] = ek * s[3];
        s[0] = eh * s[1];
        t->n = (size_t)(eb * s[0]);
    } else {
        s[3] = 1;
        s[2] = ek;
        s[1] = eq * ek;
        s[0] = eh * s[1];
        t->n = (size_t)(eb * s[0]);
    }
    t->desc.dtype = dt;
    t->desc.stride_b = (bcast & FGT_BC_B) ? 0 : s[0];
    t->desc.stride_h = (bcast & FGT_BC_H) ? 0 : s[1];
    t->desc.stride_q = (bcast & FGT_BC_Q) ? 0 : s[2];
    t->desc.stride_k = (bcast & FGT_BC_K) ? 0 : s[3];
    t->host = malloc(t->n * fg_dtype_size(dt));
    memset(t->host, 0xff, t->n * fg_dtype_size(dt));
    t->desc.data = t->host;
    t->vals = malloc(sizeof(double) * fgt_bias_count(t));
}

static inline int64_t fgt_bias_off(const fgt_bias *t, size_t idx)
{
    const int64_t j = (int64_t)idx % t->ext[3], i = (int64_t)idx / t->ext[3] % t->ext[2];
    const int64_t h = (int64_t)idx / t->ext[3] / t->ext[2] % t->ext[1];
    const int64_t b = (int64_t)idx / t->ext[3] / t->ext[2] / t->ext[1];
    return b * t->desc.stride_b + h * t->desc.stride_h + i * t->desc.stride_q +
           j * t->desc.stride_k;
}

/* Random values amp * U(-1, 1), each -inf with probability p_inf. */
static inline void fgt_bias_fill(fgt_bias *t, fgt_rng *rng, double amp,
                                 double p_inf)
{
    for (size_t x = 0; x < fgt_bias_count(t); x++) {
        double v = amp * fgt_uniform(rng);
        if (p_inf > 0 && 0.5 * (fgt_uniform(rng) + 1.0) < p_inf)
            v = -INFINITY;
        fgt_store(t->desc.dtype, t->host, fgt_bias_off(t, x), v);
        t->vals[x] = fgt_load(t->desc.dtype, t->host, fgt_bias_off(t, x));
    }
}

/* Sets one stored element (and its reference value). */
static inline void fgt_bias_set(fgt_bias *t, int64_t b, int64_t h, int64_t i,
                                int64_t j, double v)
{
    const size_t x = fgt_bias_idx(t, b, h, i, j);
    fgt_store(t->desc.dtype, t->host, fgt_bias_off(t, x), v);
    t->vals[x] = fgt_load(t->desc.dtype, t->host, fgt_bias_off(t, x));
}

/* Points the naive reference at the stored values (zero strides where
 * broadcast, so it reads them the way the definition says). */
static inline void fgt_bias_naive(const fgt_bias *t, naive_shape *ns)
{
    ns->bias = t->vals;
    ns->bias_sk = t->ext[3] > 1 ? 1 : 0;
    ns->bias_sq = t->ext[2] > 1 ? t->ext[3] : 0;
    ns->bias_sh = t->ext[1] > 1 ? t->ext[2] * t->ext[3] : 0;
    ns->bias_sb = t->ext[0] > 1 ? t->ext[1] * t->ext[2] * t->ext[3] : 0;
}

/* The stored elements as doubles, [ext]. */
static inline double *fgt_bias_read(const fgt_bias *t)
{
    double *out = malloc(sizeof(double) * fgt_bias_count(t));
    for (size_t x = 0; x < fgt_bias_count(t); x++)
        out[x] = fgt_load(t->desc.dtype, t->host, fgt_bias_off(t, x));
    return out;
}

/* 1 if every element outside the view still holds the 0xff poison. */
static inline int fgt_bias_padding_intact(const fgt_bias *t)
{
    const size_t es = fg_dtype_size(t->desc.dtype);
    uint8_t *used = calloc(t->n, 1);
    for (size_t x = 0; x < fgt_bias_count(t); x++)
        used[fgt_bias_off(t, x)] = 1;
    int ok = 1;
    for (size_t e = 0; e < t->n && ok; e++)
        for (size_t y = 0; y < es && !used[e]; y++)
            ok = ok && ((const uint8_t *)t->host)[e * es + y] == 0xff;
    free(used);
    return ok;
}

static inline void fgt_bias_free(fgt_bias *t)
{
    free(t->host);
    free(t->vals);
}

/* Reference dbias: ds [B, H, Nq, Nk] summed onto the stored extents. */
static inline double *fgt_dbias_ref(const double *ds, int64_t B, int64_t H,
                                    int64_t Nq, int64_t Nk, const int64_t ext[4])
{
    const size_t n = (size_t)(ext[0] * ext[1] * ext[2] * ext[3]);
    double *out = calloc(n, sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Nq; i++)
                for (int64_t j = 0; j < Nk; j++) {
                    const int64_t bb = ext[0] > 1 ? b : 0, hh = ext[1] > 1 ? h : 0;
                    const int64_t ii = ext[2] > 1 ? i : 0, jj = ext[3] > 1 ? j : 0;
                    out[((bb * ext[1] + hh) * ext[2] + ii) * ext[3] + jj] +=
                        ds[((b * H + h) * Nq + i) * Nk + j];
                }
    return out;
}

#endif /* FG_TESTS_BIAS_UTIL_H */
