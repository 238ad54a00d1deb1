/* SPDX-License-Identifier: MIT */
/* tests/attn_harness.h - run one attention case through the public API
 * (any layout/dtype) and through the naive fp64 reference, and report the
 * errors. Inputs are drawn fresh from the test seed; outputs are poisoned
 * with NaN before every call so unwritten elements are caught. */
#ifndef FG_TESTS_ATTN_HARNESS_H
#define FG_TESTS_ATTN_HARNESS_H

#include "naive_attention.h"
#include "ref_dropout.h"
#include "test_util.h"

typedef struct fgt_case {
    int64_t B, Nq, Nk, H, Hk, d;
    int causal;
    int bhsd;      /* 0: BSHD, 1: BHSD layout for every operand */
    fg_dtype dtype;
    double p;      /* dropout */
    uint64_t seed, offset;
    int block_q, block_k, threads;
    double amp;    /* input amplitude (1 by default) */
    double scale;  /* 0: default */
    /* Variants (zero = off); slopes and the block map are drawn from the
     * case's salt. */
    int top_left;
    int window;    /* use window_left/right (-1 unbounded) */
    int64_t window_left, window_right;
    double softcap;
    int alibi;     /* 1: slopes [H]; 2: slopes [B, H] */
    double sparse; /* > 0: keep each 128 x 128 block with this probability */
    int map_bcast; /* block map [1, 1, nqb, nkb] instead of [B, H, ...] */
} fgt_case;

/* The variant inputs a case draws: ALiBi slopes and the block map. */
typedef struct fgt_variants {
    float *slopes;
    uint8_t *map;
    int32_t *storage;
    fg_attn_block_mask bm;
    int64_t mb, mh;
} fgt_variants;

static inline void fgt_variants_free(fgt_variants *v)
{
    free(v->slopes);
    free(v->map);
    free(v->storage);
}

/* Draws the variant inputs of c and points p (and the reference ns) at
 * them. Slopes are positive (ALiBi's geometric slopes are in (0, 1]);
 * every query block keeps its first listed block with probability
 * c->sparse like the others, so empty rows occur too. */
static inline void fgt_variants_make(const fgt_case *c, fgt_rng *rng,
                                     fg_attn_params *p, naive_shape *ns,
                                     fgt_variants *v)
{
    memset(v, 0, sizeof *v);
    p->causal_align = c->top_left ? FG_ATTN_ALIGN_TOP_LEFT
                                  : FG_ATTN_ALIGN_BOTTOM_RIGHT;
    ns->top_left = c->top_left;
    if (c->window) {
        p->window_left = c->window_left;
        p->window_right = c->window_right;
        ns->window = 1;
        ns->window_left = c->window_left;
        ns->window_right = c->window_right;
    }
    p->softcap = c->softcap;
    ns->softcap = c->softcap;
    if (c->alibi) {
        const int64_t n = (c->alibi == 2 ? c->B : 1) * c->H;
        v->slopes = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            v->slopes[i] = (float)(0.05 + 0.5 * fabs(fgt_uniform(rng)));
        p->alibi_slopes = v->slopes;
        p->alibi_stride_b = c->alibi == 2 ? c->H : 0;
        ns->alibi = v->slopes;
        ns->alibi_sb = p->alibi_stride_b;
    }
    if (c->sparse > 0) {
        const int64_t nqb = (c->Nq + 127) / 128, nkb = (c->Nk + 127) / 128;
        v->mb = c->map_bcast ? 1 : c->B;
        v->mh = c->map_bcast ? 1 : c->H;
        const size_t n = (size_t)(v->mb * v->mh * nqb * nkb);
        v->map = malloc(n);
        for (size_t i = 0; i < n; i++)
            v->map[i] = 0.5 * (fgt_uniform(rng) + 1.0) < c->sparse;
        v->storage = malloc(sizeof(int32_t) *
                            (size_t)fg_attn_block_mask_storage(v->mb, v->mh, nqb, nkb));
        if (fg_attn_block_mask_build(&v->bm, v->map, v->mb, v->mh, nqb, nkb,
                                     v->storage, FG_DEVICE_CPU) == FG_OK)
            p->block_mask = &v->bm;
        ns->block_map = v->map;
        ns->map_b = v->mb;
        ns->map_h = v->mh;
    }
}

typedef struct fgt_result {
    fg_status fwd, bwd;
    double err_o, err_m, err_l, err_dq, err_dk, err_dv;
    int finite; /* every output and gradient finite */
    /* outputs converted back to BSHD fp64 (owned; fgt_result_free) */
    double *o, *m, *l, *dq, *dk, *dv;
    double *ro, *rm, *rl; /* reference */
    size_t nq, nk, ns;    /* element counts of Q-like, K-like, stats */
} fgt_result;

static inline void fgt_result_free(fgt_result *r)
{
    free(r->o); free(r->m); free(r->l);
    free(r->dq); free(r->dk); free(r->dv);
    free(r->ro); free(r->rm); free(r->rl);
}

/* Copy a BSHD fp64 array into a buffer in the case's layout/dtype. */
static inline void *fgt_pack(const fgt_case *c, const double *src, int64_t S,
                             int64_t Hh, fg_attn_tensor *t)
{
    size_t n = (size_t)(c->B * S * Hh * c->d), es = fg_dtype_size(c->dtype);
    void *buf = malloc(n * es);
    *t = c->bhsd ? fg_attn_bhsd(buf, c->dtype, S, Hh, c->d)
                 : fg_attn_bshd(buf, c->dtype, S, Hh, c->d);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < Hh; h++)
                for (int64_t x = 0; x < c->d; x++) {
                    int64_t off = b * t->stride_b + s * t->stride_s +
                                  h * t->stride_h + x;
                    double vv = src[((b * S + s) * Hh + h) * c->d + x];
                    if (c->dtype == FG_FP64)
                        ((double *)buf)[off] = vv;
                    else
                        ((float *)buf)[off] = (float)vv;
                }
    return buf;
}

/* An output buffer in the case's layout, NaN-poisoned. */
static inline void *fgt_out(const fgt_case *c, int64_t S, int64_t Hh,
                            fg_attn_tensor *t)
{
    size_t n = (size_t)(c->B * S * Hh * c->d);
    void *buf = malloc(n * fg_dtype_size(c->dtype));
    if (c->dtype == FG_FP64)
        fgt_poison_d(buf, n);
    else
        fgt_poison_f(buf, n);
    *t = c->bhsd ? fg_attn_bhsd(buf, c->dtype, S, Hh, c->d)
                 : fg_attn_bshd(buf, c->dtype, S, Hh, c->d);
    return buf;
}

static inline double *fgt_unpack(const fgt_case *c, const fg_attn_tensor *t,
                                 int64_t S, int64_t Hh)
{
    double *dst = malloc(sizeof(double) * (size_t)(c->B * S * Hh * c->d));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < Hh; h++)
                for (int64_t x = 0; x < c->d; x++) {
                    int64_t off = b * t->stride_b + s * t->stride_s +
                                  h * t->stride_h + x;
                    dst[((b * S + s) * Hh + h) * c->d + x] =
                        c->dtype == FG_FP64 ? ((double *)t->data)[off]
                                            : (double)((float *)t->data)[off];
                }
    return dst;
}

static inline double *fgt_stats_to_d(const fgt_case *c, void *p, size_t n)
{
    double *dst = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++)
        dst[i] = c->dtype == FG_FP64 ? ((double *)p)[i]
                                     : (double)((float *)p)[i];
    return dst;
}

static inline void fgt_params(const fgt_case *c, fg_attn_params *p)
{
    fg_attn_params_init(p, c->B, c->Nq, c->Nk, c->H, c->Hk, c->d);
    p->causal = c->causal;
    p->dropout_p = c->p;
    p->seed = c->seed;
    p->offset = c->offset;
    p->block_q = c->block_q;
    p->block_k = c->block_k;
    p->num_threads = c->threads;
    p->softmax_scale = c->scale;
}

/* The params of c, the matching naive shape and the variant inputs. */
static inline void fgt_setup(const fgt_case *c, fgt_rng *rng, fg_attn_params *p,
                             naive_shape *ns, fgt_variants *var)
{
    fgt_params(c, p);
    const naive_shape z = {c->B, c->Nq, c->Nk, c->H, c->Hk, c->d,
                           c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d),
                           c->causal, c->p, NULL};
    *ns = z;
    fgt_variants_make(c, rng, p, ns, var);
}

/* Run forward + backward on the CPU and the naive reference. `salt` picks
 * the random inputs. with_bwd = 0 skips the backward. */
static inline void fgt_run_case(const fgt_case *c, uint64_t salt, int with_bwd,
                                fgt_result *r)
{
    memset(r, 0, sizeof *r);
    const int64_t d = c->d;
    r->nq = (size_t)(c->B * c->Nq * c->H * d);
    r->nk = (size_t)(c->B * c->Nk * c->Hk * d);
    r->ns = (size_t)(c->B * c->H * c->Nq);
    const double amp = c->amp > 0 ? c->amp : 1.0;
    fgt_rng rng = fgt_rng_for(salt);
    double *q = malloc(sizeof(double) * r->nq), *g = malloc(sizeof(double) * r->nq);
    double *k = malloc(sizeof(double) * r->nk), *v = malloc(sizeof(double) * r->nk);
    fgt_fill(q, r->nq, &rng, amp);
    fgt_fill(k, r->nk, &rng, amp);
    fgt_fill(v, r->nk, &rng, 1.0);
    fgt_fill(g, r->nq, &rng, 1.0);
    /* fp32 runs compare against the reference on the rounded inputs. */
    if (c->dtype == FG_FP32) {
        for (size_t i = 0; i < r->nq; i++) { q[i] = (float)q[i]; g[i] = (float)g[i]; }
        for (size_t i = 0; i < r->nk; i++) { k[i] = (float)k[i]; v[i] = (float)v[i]; }
    }

    fg_attn_params p;
    naive_shape ns;
    fgt_variants var;
    fgt_setup(c, &rng, &p, &ns, &var);
    fg_attn_tensor tq, tk, tv, to, tg, tdq, tdk, tdv;
    void *bq = fgt_pack(c, q, c->Nq, c->H, &tq);
    void *bk = fgt_pack(c, k, c->Nk, c->Hk, &tk);
    void *bv = fgt_pack(c, v, c->Nk, c->Hk, &tv);
    void *bg = fgt_pack(c, g, c->Nq, c->H, &tg);
    void *bo = fgt_out(c, c->Nq, c->H, &to);
    fg_dtype sd = c->dtype == FG_FP64 ? FG_FP64 : FG_FP32;
    void *sm = malloc(r->ns * fg_dtype_size(sd)), *sl = malloc(r->ns * fg_dtype_size(sd));
    if (sd == FG_FP64) { fgt_poison_d(sm, r->ns); fgt_poison_d(sl, r->ns); }
    else { fgt_poison_f(sm, r->ns); fgt_poison_f(sl, r->ns); }
    fg_attn_stats st = {sm, sl, sd};

    r->fwd = fg_attention_forward(&p, &tq, &tk, &tv, &to, &st);
    r->o = fgt_unpack(c, &to, c->Nq, c->H);
    r->m = fgt_stats_to_d(c, sm, r->ns);
    r->l = fgt_stats_to_d(c, sl, r->ns);

    uint8_t *mask = NULL;
    if (c->p > 0) { /* from the documented mapping, not the library's */
        mask = malloc((size_t)(c->B * c->H * c->Nq * c->Nk));
        ref_dropout_mask(c->seed, c->offset, c->p, c->B, c->H, c->Nq, c->Nk,
                         mask);
        ns.keep = mask;
    }
    r->ro = malloc(sizeof(double) * r->nq);
    r->rm = malloc(sizeof(double) * r->ns);
    r->rl = malloc(sizeof(double) * r->ns);
    naive_attention_forward(&ns, q, k, v, r->ro, r->rm, r->rl);
    r->err_o = fgt_rel_err(r->o, r->ro, r->nq);
    r->err_m = fgt_stats_err(r->m, r->rm, r->ns);
    r->err_l = fgt_stats_err(r->l, r->rl, r->ns);
    r->finite = fgt_all_finite(r->o, r->nq);

    if (with_bwd && r->fwd == FG_OK) {
        void *bdq = fgt_out(c, c->Nq, c->H, &tdq);
        void *bdk = fgt_out(c, c->Nk, c->Hk, &tdk);
        void *bdv = fgt_out(c, c->Nk, c->Hk, &tdv);
        r->bwd = fg_attention_backward(&p, &tq, &tk, &tv, &to, &tg, &st, &tdq,
                                       &tdk, &tdv);
        r->dq = fgt_unpack(c, &tdq, c->Nq, c->H);
        r->dk = fgt_unpack(c, &tdk, c->Nk, c->Hk);
        r->dv = fgt_unpack(c, &tdv, c->Nk, c->Hk);
        double *rdq = malloc(sizeof(double) * r->nq);
        double *rdk = malloc(sizeof(double) * r->nk);
        double *rdv = malloc(sizeof(double) * r->nk);
        naive_attention_backward(&ns, q, k, v, g, rdq, rdk, rdv);
        /* Relative to max(max |ref|, 0.1), as the GPU suites: masks that
         * leave a row one key (a window of 0, say) make its dQ 0 in exact
         * arithmetic (dS = P (dP - D) with P = 1 and dP = D), and the
         * rounding of dP - D, ~1e-7 |dP| in fp32, would otherwise look
         * like an enormous relative error (seen: max |dQ| < 1e-3). */
        r->err_dq = fgt_rel_err_floor(r->dq, rdq, r->nq, 0.1);
        r->err_dk = fgt_rel_err_floor(r->dk, rdk, r->nk, 0.1);
        r->err_dv = fgt_rel_err_floor(r->dv, rdv, r->nk, 0.1);
        r->finite = r->finite && fgt_all_finite(r->dq, r->nq) &&
                    fgt_all_finite(r->dk, r->nk) && fgt_all_finite(r->dv, r->nk);
        free(rdq); free(rdk); free(rdv);
        free(bdq); free(bdk); free(bdv);
    }
    free(mask);
    fgt_variants_free(&var);
    free(q); free(k); free(v); free(g);
    free(bq); free(bk); free(bv); free(bg); free(bo);
    free(sm); free(sl);
}

#endif /* FG_TESTS_ATTN_HARNESS_H */
