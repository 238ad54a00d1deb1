/* SPDX-License-Identifier: MIT */
/* tests/varlen_harness.h - packed variable-length cases for the CPU and
 * GPU suites: inputs drawn fresh from the test seed, packed into the
 * case's layout and dtype (outputs NaN-poisoned), the naive fp64 reference
 * (tests/naive_attention.c, each sequence run densely on its own) and the
 * error metrics over the rows the sequences own. Rows past cu_seqlens[B]
 * ("tail" rows) must come back untouched (still NaN). With VL_LOWP
 * defined, fp16/bf16 buffers are handled too (tests/lowp.c). */
#ifndef FG_TESTS_VARLEN_HARNESS_H
#define FG_TESTS_VARLEN_HARNESS_H

#include "naive_attention.h"
#include "ref_dropout.h"
#include "test_util.h"
#ifdef VL_LOWP
#include "lowp.h"
#endif

#define VL_MAXB 8

typedef struct vl_case {
    int64_t B, H, Hk, d;
    int32_t lq[VL_MAXB], lk[VL_MAXB]; /* sequence lengths */
    int32_t used[VL_MAXB];            /* seqused_k when use_used */
    int use_used;
    int64_t pad_q, pad_k; /* tail rows past cu[B] in the packed buffers */
    int hmajor;           /* [H, total, d] storage instead of [total, H, d] */
    int causal, top_left, window;
    int64_t window_left, window_right;
    double softcap;
    int alibi; /* 1: slopes [H]; 2: [B, H] */
    double p;
    uint64_t seed, offset;
    fg_dtype dtype;
    int block_q, block_k, threads;
    int deterministic;
    /* Run as a dense [B, N, H, d] batch without cu_seqlens (every lq and
     * every lk equal, no tail rows, hmajor 0): key padding alone. */
    int dense;
    /* fp64 runs only: the backward reads O rounded to `dtype`, as a kernel
     * that stores O in it does. D = rowsum(dO o O) comes from the stored O;
     * where the exact dQ and dK vanish (a row with one visible key, kept by
     * dropout) that rounding is all the GPU's result holds. */
    int o_as_stored;
    /* Host copies of the offsets in the call (fg_attn_params's
     * cu_seqlens_q_host, ...): bit 0 cu_seqlens_q, bit 1 cu_seqlens_k,
     * bit 2 seqused_k, each only where the call has that array. */
    int host_copies;
} vl_case;

/* Inputs (fp64, contiguous [total, heads, d], already rounded to the
 * case's dtype), offsets, slopes and the reference dropout mask. */
typedef struct vl_data {
    int32_t cu_q[VL_MAXB + 1], cu_k[VL_MAXB + 1];
    int64_t Nq, Nk, total_q, total_k;
    double *q, *k, *v, *g;
    float *slopes;
    uint8_t *keep; /* [B, H, Nq, Nk] or NULL */
} vl_data;

static inline void vl_store(fg_dtype dt, void *buf, int64_t off, double x)
{
    switch (dt) {
    case FG_FP64: ((double *)buf)[off] = x; break;
    case FG_FP32: ((float *)buf)[off] = (float)x; break;
#ifdef VL_LOWP
    case FG_FP16: ((uint16_t *)buf)[off] = fgt_f32_to_f16((float)x); break;
    case FG_BF16: ((uint16_t *)buf)[off] = fgt_f32_to_bf16((float)x); break;
#endif
    default: break;
    }
}

static inline double vl_load(fg_dtype dt, const void *buf, int64_t off)
{
    switch (dt) {
    case FG_FP64: return ((const double *)buf)[off];
    case FG_FP32: return ((const float *)buf)[off];
#ifdef VL_LOWP
    case FG_FP16: return fgt_f16_to_f32(((const uint16_t *)buf)[off]);
    case FG_BF16: return fgt_bf16_to_f32(((const uint16_t *)buf)[off]);
#endif
    default: return NAN;
    }
}

static inline double vl_round(fg_dtype dt, double x)
{
    char tmp[8];
    vl_store(dt, tmp, 0, x);
    return vl_load(dt, tmp, 0);
}

static inline void vl_make(const vl_case *c, uint64_t salt, vl_data *d)
{
    memset(d, 0, sizeof *d);
    d->Nq = d->Nk = 1; /* the maximum lengths; at least 1 */
    for (int64_t b = 0; b < c->B; b++) {
        d->cu_q[b + 1] = d->cu_q[b] + c->lq[b];
        d->cu_k[b + 1] = d->cu_k[b] + c->lk[b];
        d->Nq = c->lq[b] > d->Nq ? c->lq[b] : d->Nq;
        d->Nk = c->lk[b] > d->Nk ? c->lk[b] : d->Nk;
    }
    d->total_q = d->cu_q[c->B] + c->pad_q;
    d->total_k = d->cu_k[c->B] + c->pad_k;
    const size_t nq = (size_t)(d->total_q * c->H * c->d);
    const size_t nk = (size_t)(d->total_k * c->Hk * c->d);
    fgt_rng rng = fgt_rng_for(salt);
    d->q = malloc(sizeof(double) * nq + 8);
    d->g = malloc(sizeof(double) * nq + 8);
    d->k = malloc(sizeof(double) * nk + 8);
    d->v = malloc(sizeof(double) * nk + 8);
    fgt_fill(d->q, nq, &rng, 1.0);
    fgt_fill(d->k, nk, &rng, 1.0);
    fgt_fill(d->v, nk, &rng, 1.0);
    fgt_fill(d->g, nq, &rng, 1.0);
    for (size_t i = 0; i < nq; i++) {
        d->q[i] = vl_round(c->dtype, d->q[i]);
        d->g[i] = vl_round(c->dtype, d->g[i]);
    }
    for (size_t i = 0; i < nk; i++) {
        d->k[i] = vl_round(c->dtype, d->k[i]);
        d->v[i] = vl_round(c->dtype, d->v[i]);
    }
    if (c->alibi) {
        const int64_t n = (c->alibi == 2 ? c->B : 1) * c->H;
        d->slopes = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            d->slopes[i] = (float)(0.05 + 0.5 * fabs(fgt_uniform(&rng)));
    }
    if (c->p > 0) { /* from the documented mapping, not the library's */
        d->keep = malloc((size_t)(c->B * c->H * d->Nq * d->Nk));
        ref_dropout_mask(c->seed, c->offset, c->p, c->B, c->H, d->Nq, d->Nk,
                         d->keep);
    }
}

/* Random lengths in [0, max_len] (lk = lq a quarter of the time) and
 * options: d a multiple of 8 up to 8 max_d8, windows up to max_win, tail
 * rows, both storage orders, every variant. */
static inline void vl_random(fgt_rng *rng, int32_t max_len, int max_d8,
                             int64_t max_win, vl_case *c)
{
    memset(c, 0, sizeof *c);
    c->B = fgt_int(rng, 1, VL_MAXB);
    for (int64_t b = 0; b < c->B; b++) {
        c->lq[b] = (int32_t)fgt_int(rng, 0, max_len);
        c->lk[b] = fgt_int(rng, 0, 3) ? (int32_t)fgt_int(rng, 0, max_len) : c->lq[b];
        c->used[b] = (int32_t)fgt_int(rng, 0, c->lk[b]);
    }
    c->use_used = (int)fgt_int(rng, 0, 1);
    c->Hk = fgt_int(rng, 1, 2);
    c->H = c->Hk * fgt_int(rng, 1, 2);
    c->d = 8 * fgt_int(rng, 1, max_d8);
    c->pad_q = fgt_int(rng, 0, 3);
    c->pad_k = fgt_int(rng, 0, 3);
    c->hmajor = (int)fgt_int(rng, 0, 1);
    c->causal = (int)fgt_int(rng, 0, 1);
    c->top_left = (int)fgt_int(rng, 0, 1);
    c->window = (int)fgt_int(rng, 0, 1);
    c->window_left = fgt_int(rng, -1, max_win);
    c->window_right = fgt_int(rng, -1, max_win);
    c->softcap = fgt_int(rng, 0, 1) ? 0.5 + 5 * fabs(fgt_uniform(rng)) : 0;
    c->alibi = (int)fgt_int(rng, 0, 2);
    c->p = fgt_int(rng, 0, 2) == 0 ? 0.15 : 0;
    c->seed = (uint64_t)fgt_int(rng, 0, 1000);
}

static inline void vl_free(vl_data *d)
{
    free(d->q); free(d->k); free(d->v); free(d->g);
    free(d->slopes); free(d->keep);
}

/* Params with host pointers for cu_seqlens, seqused_k and the slopes (the
 * GPU suite swaps in device copies). */
static inline void vl_params(const vl_case *c, const vl_data *d,
                             fg_attn_params *p)
{
    fg_attn_params_init(p, c->B, d->Nq, d->Nk, c->H, c->Hk, c->d);
    p->causal = c->causal;
    p->causal_align = c->top_left ? FG_ATTN_ALIGN_TOP_LEFT
                                  : FG_ATTN_ALIGN_BOTTOM_RIGHT;
    if (c->window) {
        p->window_left = c->window_left;
        p->window_right = c->window_right;
    }
    p->softcap = c->softcap;
    p->alibi_slopes = d->slopes;
    p->alibi_stride_b = c->alibi == 2 ? c->H : 0;
    p->dropout_p = c->p;
    p->seed = c->seed;
    p->offset = c->offset;
    p->block_q = c->block_q;
    p->block_k = c->block_k;
    p->num_threads = c->threads;
    p->deterministic = c->deterministic;
    if (!c->dense) {
        p->cu_seqlens_q = d->cu_q;
        p->cu_seqlens_k = d->cu_k;
        p->total_q = d->total_q;
        p->total_k = d->total_k;
    }
    p->seqused_k = c->use_used ? c->used : NULL;
}

/* The packed layout of an operand with `rows` rows: [rows, heads, d] or
 * [heads, rows, d]; stride_b gets a junk value (it must be ignored), or
 * with c->dense that of [B, rows / B, heads, d]. */
static inline fg_attn_tensor vl_layout(const vl_case *c, void *ptr, fg_dtype dt,
                                       int64_t rows, int64_t heads)
{
    fg_attn_tensor t = {ptr, dt, 987654321, heads * c->d, c->d};
    if (c->dense)
        t.stride_b = rows / c->B * heads * c->d;
    if (c->hmajor) {
        t.stride_s = c->d;
        t.stride_h = rows * c->d;
    }
    return t;
}

/* A host buffer in the case's layout and dtype holding src ([rows, heads,
 * d] fp64), or NaN everywhere when src is NULL. */
static inline void *vl_pack(const vl_case *c, fg_dtype dt, const double *src,
                            int64_t rows, int64_t heads, fg_attn_tensor *t)
{
    const size_t n = (size_t)(rows * heads * c->d);
    void *buf = malloc(n * fg_dtype_size(dt) + 8);
    *t = vl_layout(c, buf, dt, rows, heads);
    for (int64_t s = 0; s < rows; s++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t x = 0; x < c->d; x++)
                vl_store(dt, buf, s * t->stride_s + h * t->stride_h + x,
                         src ? src[(s * heads + h) * c->d + x] : NAN);
    return buf;
}

/* The owned rows [0, owned) of a packed buffer as fp64 [owned, heads, d];
 * *tail_nan = every tail row is still NaN. */
static inline double *vl_unpack(const vl_case *c, const fg_attn_tensor *t,
                                const void *buf, int64_t rows, int64_t owned,
                                int64_t heads, int *tail_nan)
{
    double *out = malloc(sizeof(double) * (size_t)(owned * heads * c->d) + 8);
    *tail_nan = 1;
    for (int64_t s = 0; s < rows; s++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t x = 0; x < c->d; x++) {
                const double y =
                    vl_load(t->dtype, buf, s * t->stride_s + h * t->stride_h + x);
                if (s < owned)
                    out[(s * heads + h) * c->d + x] = y;
                else if (!isnan(y))
                    *tail_nan = 0;
            }
    return out;
}

/* Results over the owned rows, fp64: O, dQ [cu_q[B], H, d]; dK, dV
 * [cu_k[B], Hk, d]; m, l [H, total_q] (tail entries NaN). */
typedef struct vl_out {
    double *o, *m, *l, *dq, *dk, *dv;
    int tails_nan; /* every tail row of every output still NaN */
} vl_out;

static inline void vl_out_free(vl_out *r)
{
    free(r->o); free(r->m); free(r->l);
    free(r->dq); free(r->dk); free(r->dv);
}

static inline naive_shape vl_shape(const vl_case *c, const vl_data *d)
{
    naive_shape ns = {c->B, d->Nq, d->Nk, c->H, c->Hk, c->d,
                      1.0 / sqrt((double)c->d), c->causal, c->p, d->keep};
    ns.top_left = c->top_left;
    if (c->window) {
        ns.window = 1;
        ns.window_left = c->window_left;
        ns.window_right = c->window_right;
    }
    ns.softcap = c->softcap;
    ns.alibi = d->slopes;
    ns.alibi_sb = c->alibi == 2 ? c->H : 0;
    ns.seqused_k = c->use_used ? c->used : NULL;
    return ns;
}

/* The naive fp64 reference of the case. */
static inline void vl_reference(const vl_case *c, const vl_data *d, vl_out *r)
{
    const size_t nq = (size_t)(d->total_q * c->H * c->d);
    const size_t nk = (size_t)(d->total_k * c->Hk * c->d);
    const size_t ns = (size_t)(c->H * d->total_q);
    memset(r, 0, sizeof *r);
    r->o = malloc(sizeof(double) * nq + 8);
    r->dq = malloc(sizeof(double) * nq + 8);
    r->dk = malloc(sizeof(double) * nk + 8);
    r->dv = malloc(sizeof(double) * nk + 8);
    r->m = malloc(sizeof(double) * ns + 8);
    r->l = malloc(sizeof(double) * ns + 8);
    fgt_poison_d(r->m, ns);
    fgt_poison_d(r->l, ns);
    const naive_shape s = vl_shape(c, d);
    naive_varlen_forward(&s, d->cu_q, d->cu_k, d->total_q, d->q, d->k, d->v,
                         r->o, r->m, r->l);
    naive_varlen_backward(&s, d->cu_q, d->cu_k, d->q, d->k, d->v, d->g, r->dq,
                          r->dk, r->dv);
    r->tails_nan = 1;
}

/* Stats [H, total_q] of dtype dt to fp64; tail entries must be NaN. */
static inline double *vl_stats(const vl_case *c, const vl_data *d, fg_dtype dt,
                               const void *buf, int *tail_nan)
{
    const int64_t n = c->H * d->total_q;
    double *out = malloc(sizeof(double) * (size_t)n + 8);
    for (int64_t i = 0; i < n; i++) {
        out[i] = vl_load(dt, buf, i);
        if (i % d->total_q >= d->cu_q[c->B] && !isnan(out[i]))
            *tail_nan = 0;
    }
    return out;
}

/* Errors of r against the reference ref, over owned rows (the metrics of
 * tests/test_util.h: max-abs relative to max |ref|, gradients with a 0.1
 * floor; stats with -inf matched exactly). */
typedef struct vl_err {
    double o, m, l, dq, dk, dv;
} vl_err;

static inline double vl_stats_err(const vl_case *c, const vl_data *d,
                                  const double *a, const double *ref)
{
    double worst = 0;
    for (int64_t h = 0; h < c->H; h++) {
        const double e = fgt_stats_err(a + h * d->total_q, ref + h * d->total_q,
                                       (size_t)d->cu_q[c->B]);
        worst = e > worst ? e : worst;
    }
    return worst;
}

static inline vl_err vl_compare(const vl_case *c, const vl_data *d,
                                const vl_out *r, const vl_out *ref)
{
    const size_t nq = (size_t)(d->cu_q[c->B] * c->H * c->d);
    const size_t nk = (size_t)(d->cu_k[c->B] * c->Hk * c->d);
    vl_err e;
    e.o = fgt_rel_err_floor(r->o, ref->o, nq, 1e-300);
    e.m = vl_stats_err(c, d, r->m, ref->m);
    e.l = vl_stats_err(c, d, r->l, ref->l);
    e.dq = fgt_rel_err_floor(r->dq, ref->dq, nq, 0.1);
    e.dk = fgt_rel_err_floor(r->dk, ref->dk, nk, 0.1);
    e.dv = fgt_rel_err_floor(r->dv, ref->dv, nk, 0.1);
    return e;
}

/* The first of r's outputs (0..5: O, m, l, dQ, dK, dV) whose bits differ
 * from b's over the owned rows (m and l: all of [H, total_q]), or -1. */
static inline int vl_bitwise_diff(const vl_case *c, const vl_data *d,
                                  const vl_out *r, const vl_out *b)
{
    const size_t nq = (size_t)(d->cu_q[c->B] * c->H * c->d);
    const size_t nk = (size_t)(d->cu_k[c->B] * c->Hk * c->d);
    const size_t ns = (size_t)(c->H * d->total_q);
    const double *x[6] = {r->o, r->m, r->l, r->dq, r->dk, r->dv},
                 *y[6] = {b->o, b->m, b->l, b->dq, b->dk, b->dv};
    const size_t n[6] = {nq, ns, ns, nq, nk, nk};
    for (int i = 0; i < 6; i++)
        if (memcmp(x[i], y[i], n[i] * sizeof(double)) != 0)
            return i;
    return -1;
}

/* Where vl_run puts the buffers: NULL = the CPU (host buffers as they
 * are); else copies to and from a device. */
typedef struct vl_dev {
    fg_device device;
    void *(*put)(const void *host, size_t bytes);
    void (*get)(void *host, const void *dev, size_t bytes);
    void (*drop)(void *dev);
} vl_dev;

static inline void *vl_put(const vl_dev *dev, void *host, size_t bytes)
{
    return dev ? dev->put(host, bytes) : host;
}

/* Runs c's forward and backward through the library in dtype dt on dev,
 * every output poisoned before; r gets the results (vl_out). */
static inline void vl_run(const vl_case *c, const vl_data *d, fg_dtype dt,
                          const vl_dev *dev, vl_out *r, fg_status *fwd,
                          fg_status *bwd)
{
    const fg_dtype sd = dt == FG_FP64 ? FG_FP64 : FG_FP32;
    fg_attn_params p;
    vl_params(c, d, &p);
    fg_attn_tensor t[8]; /* q k v dO | o dq dk dv */
    const double *src[8] = {d->q, d->k, d->v, d->g, NULL, NULL, NULL, NULL};
    const int kl[8] = {0, 1, 1, 0, 0, 0, 1, 1};
    void *host[10], *devp[10];
    size_t bytes[10];
    for (int i = 0; i < 8; i++) {
        const int64_t rows = kl[i] ? d->total_k : d->total_q;
        const int64_t heads = kl[i] ? c->Hk : c->H;
        host[i] = vl_pack(c, dt, src[i], rows, heads, &t[i]);
        bytes[i] = (size_t)(rows * heads * c->d) * fg_dtype_size(dt);
    }
    const size_t ns = (size_t)(c->H * d->total_q);
    for (int i = 8; i < 10; i++) {
        bytes[i] = ns * fg_dtype_size(sd);
        host[i] = malloc(bytes[i] + 8);
        for (size_t x = 0; x < ns; x++)
            vl_store(sd, host[i], (int64_t)x, NAN);
    }
    for (int i = 0; i < 10; i++) {
        devp[i] = vl_put(dev, host[i], bytes[i]);
        if (i < 8)
            t[i].data = devp[i];
    }
    /* The small arrays, where the operands are. */
    void *small[4] = {NULL, NULL, NULL, NULL};
    if (dev) {
        p.device = dev->device;
        const int64_t ns_alibi = (c->alibi == 2 ? c->B : 1) * c->H;
        if (p.cu_seqlens_q) {
            small[0] = dev->put(d->cu_q, sizeof(int32_t) * (size_t)(c->B + 1));
            small[1] = dev->put(d->cu_k, sizeof(int32_t) * (size_t)(c->B + 1));
            p.cu_seqlens_q = small[0];
            p.cu_seqlens_k = small[1];
        }
        if (p.seqused_k)
            p.seqused_k = small[2] = dev->put(c->used, sizeof(int32_t) * (size_t)c->B);
        if (p.alibi_slopes)
            p.alibi_slopes = small[3] =
                dev->put(d->slopes, sizeof(float) * (size_t)ns_alibi);
    }
    /* copies of their own (the CPU compares them with the arrays) */
    int32_t hc[2 * VL_MAXB + 2 + VL_MAXB];
    memcpy(hc, d->cu_q, sizeof(int32_t) * (size_t)(c->B + 1));
    memcpy(hc + VL_MAXB + 1, d->cu_k, sizeof(int32_t) * (size_t)(c->B + 1));
    memcpy(hc + 2 * VL_MAXB + 2, c->used, sizeof(int32_t) * (size_t)c->B);
    if (p.cu_seqlens_q && (c->host_copies & 1))
        p.cu_seqlens_q_host = hc;
    if (p.cu_seqlens_k && (c->host_copies & 2))
        p.cu_seqlens_k_host = hc + VL_MAXB + 1;
    if (p.seqused_k && (c->host_copies & 4))
        p.seqused_k_host = hc + 2 * VL_MAXB + 2;
    fg_attn_stats st = {devp[8], devp[9], sd};
    *fwd = fg_attention_forward(&p, &t[0], &t[1], &t[2], &t[4], &st);
    fg_attn_tensor o_in = t[4]; /* the O the backward reads */
    double *o_st = NULL;
    if (c->o_as_stored && dt == FG_FP64 && !dev && *fwd == FG_OK) {
        const size_t n = bytes[4] / sizeof(double);
        o_st = malloc(bytes[4] + 8);
        for (size_t x = 0; x < n; x++) {
            double tmp; /* room for any dtype */
            vl_store(c->dtype, &tmp, 0, ((const double *)host[4])[x]);
            o_st[x] = vl_load(c->dtype, &tmp, 0);
        }
        o_in.data = o_st;
    }
    *bwd = *fwd == FG_OK ? fg_attention_backward(&p, &t[0], &t[1], &t[2], &o_in,
                                                 &t[3], &st, &t[5], &t[6], &t[7])
                         : *fwd;
    free(o_st);
    for (int i = 0; i < 10; i++)
        if (dev) {
            dev->get(host[i], devp[i], bytes[i]);
            dev->drop(devp[i]);
        }
    for (int i = 0; dev && i < 4; i++)
        if (small[i])
            dev->drop(small[i]);
    int tq[4], tm = 1;
    for (int i = 4; i < 8; i++)
        t[i].data = host[i];
    r->o = vl_unpack(c, &t[4], host[4], d->total_q, d->cu_q[c->B], c->H, &tq[0]);
    r->dq = vl_unpack(c, &t[5], host[5], d->total_q, d->cu_q[c->B], c->H, &tq[1]);
    r->dk = vl_unpack(c, &t[6], host[6], d->total_k, d->cu_k[c->B], c->Hk, &tq[2]);
    r->dv = vl_unpack(c, &t[7], host[7], d->total_k, d->cu_k[c->B], c->Hk, &tq[3]);
    r->m = vl_stats(c, d, sd, host[8], &tm);
    r->l = vl_stats(c, d, sd, host[9], &tm);
    r->tails_nan = tq[0] && tq[1] && tq[2] && tq[3] && tm;
    for (int i = 0; i < 10; i++)
        free(host[i]);
}

#endif /* FG_TESTS_VARLEN_HARNESS_H */
