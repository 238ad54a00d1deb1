/* SPDX-License-Identifier: MIT */
/* lib/attention/attention_merge.c - fg_attention_merge (attention.h):
 * combining partial attention results over disjoint key sets by their
 * log-sum-exp. Validation for both devices, and the CPU loop (fp32/fp64);
 * the CUDA kernel is kernels/attention/attn_merge.cu. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>

#include "attention_internal.h"
#include "attention_merge.h"
#include "lib/core/error.h"
#include "lib/core/strided.h"
#include "kernels/runtime/device.h"

static const char fn[] = "fg_attention_merge";

static fg_view o_view(const fg_attn_merge_problem *mp,
                      const fg_attn_merge_operand *x)
{
    fg_view v;
    v.base = (const char *)x->o;
    v.esize = fg_dtype_size(x->o_dtype);
    v.nd = 4;
    v.ext[0] = mp->B;  v.str[0] = x->sb;
    v.ext[1] = mp->Nq; v.str[1] = x->ss;
    v.ext[2] = mp->H;  v.str[2] = x->sh;
    v.ext[3] = mp->d;  v.str[3] = 1;
    return v;
}

static fg_view st_view(const fg_attn_merge_problem *mp, const void *p,
                       fg_dtype dt)
{
    fg_view v;
    v.base = (const char *)p;
    v.esize = fg_dtype_size(dt);
    v.nd = 1;
    v.ext[0] = mp->B * mp->H * mp->Nq;
    v.str[0] = 1;
    return v;
}

static fg_status check_ptr(const void *p, size_t align, fg_device dev,
                           const char *what, const char *who)
{
    if (!p)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s of %s is NULL", fn,
                        what, who);
    if ((uintptr_t)p % align)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s of %s is not aligned to its %zu-byte "
                        "element", fn, what, who, align);
    if (dev == FG_DEVICE_CUDA)
        return fg_cuda_check_pointer(p, what);
    return FG_OK;
}

/* One operand (idx -1: the output): dtypes, pointers, strides. */
static fg_status check_operand(const fg_attn_merge_problem *mp, fg_device dev,
                               const fg_attn_tensor *o, const fg_attn_stats *st,
                               int idx, fg_attn_merge_operand *x)
{
    char who[32];
    if (idx < 0)
        snprintf(who, sizeof who, "the output");
    else
        snprintf(who, sizeof who, "part %d", idx);
    if (!o || !st)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: O or stats of %s is "
                        "NULL", fn, who);
    const fg_dtype dt = o->dtype;
    if (fg_dtype_size(dt) == 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: O of %s has unknown dtype %d", fn, who, (int)dt);
    if (dev == FG_DEVICE_CPU && dt != FG_FP32 && dt != FG_FP64)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: the CPU merges fp32 and fp64, not %s (%s)", fn,
                        fg_dtype_name(dt), who);
    const fg_dtype sdt = dt == FG_FP64 ? FG_FP64 : FG_FP32;
    if (st->dtype != sdt)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: stats of %s must be %s for %s O, got %s", fn,
                        who, fg_dtype_name(sdt), fg_dtype_name(dt),
                        fg_dtype_name(st->dtype));
    if (fg_attn_layout_bad(o))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: O of %s has the strides of fg_attn_bshd/bhsd "
                        "for sizes that are negative or overflow int64",
                        fn, who);
    if (o->stride_b < 0 || o->stride_s < 0 || o->stride_h < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: O of %s has a negative stride", fn, who);
    FG_TRY(check_ptr(o->data, fg_dtype_size(dt), dev, "O", who));
    FG_TRY(check_ptr(st->m, fg_dtype_size(sdt), dev, "stats.m", who));
    FG_TRY(check_ptr(st->l, fg_dtype_size(sdt), dev, "stats.l", who));
    x->o = o->data;
    x->o_dtype = dt;
    x->sb = o->stride_b;
    x->ss = o->stride_s;
    x->sh = o->stride_h;
    x->m = st->m;
    x->l = st->l;
    x->st_dtype = sdt;
    fg_view v = o_view(mp, x);
    if (fg_view_max_offset(&v) < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: O strides of %s overflow 64-bit offsets", fn, who);
    return FG_OK;
}

static int same_o(const fg_attn_merge_operand *a,
                  const fg_attn_merge_operand *b)
{
    return a->o == b->o && a->o_dtype == b->o_dtype && a->sb == b->sb &&
           a->ss == b->ss && a->sh == b->sh;
}

/* The output may be one of the parts exactly (in-place accumulation: every
 * row is read completely before it is written); any other overlap with an
 * input, or inside the output, is refused. */
static fg_status check_aliasing(const fg_attn_merge_problem *mp)
{
    const fg_attn_merge_operand *out = &mp->out;
    fg_view vo = o_view(mp, out);
    fg_view vm = st_view(mp, out->m, out->st_dtype);
    fg_view vl = st_view(mp, out->l, out->st_dtype);
    if (fg_view_self_overlaps(&vo))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: output O has strides under which distinct "
                        "elements alias", fn);
    if (fg_views_overlap(&vo, &vm) || fg_views_overlap(&vo, &vl) ||
        fg_views_overlap(&vm, &vl))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: output O, stats.m and stats.l overlap", fn);
    for (int i = 0; i < mp->n; i++) {
        const fg_attn_merge_operand *x = &mp->parts[i];
        fg_view po = o_view(mp, x);
        fg_view pm = st_view(mp, x->m, x->st_dtype);
        fg_view pl = st_view(mp, x->l, x->st_dtype);
        const int o_same = same_o(out, x);
        const int st_same = out->m == x->m && out->l == x->l &&
                            out->st_dtype == x->st_dtype;
        if ((!o_same && fg_views_overlap(&vo, &po)) ||
            fg_views_overlap(&vo, &pm) || fg_views_overlap(&vo, &pl))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: output O overlaps part %d without being "
                            "that part's O", fn, i);
        if (!st_same && (fg_views_overlap(&vm, &pm) ||
                         fg_views_overlap(&vm, &pl) ||
                         fg_views_overlap(&vl, &pm) ||
                         fg_views_overlap(&vl, &pl) ||
                         fg_views_overlap(&vm, &po) ||
                         fg_views_overlap(&vl, &po)))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: output stats overlap part %d without being "
                            "that part's stats", fn, i);
    }
    return FG_OK;
}

/* ---- CPU ------------------------------------------------------------------ */

static inline double ld(const void *p, fg_dtype dt, int64_t i)
{
    return dt == FG_FP64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static inline void st(void *p, fg_dtype dt, int64_t i, double x)
{
    if (dt == FG_FP64)
        ((double *)p)[i] = x;
    else
        ((float *)p)[i] = (float)x;
}

/* Row r = (b, h, i) of every operand, arithmetic in A (float unless some
 * operand is fp64). A part whose l is NaN or negative, whose m is NaN, or
 * whose m is +inf with l > 0 (what a NaN or +inf score leaves) makes the
 * row NaN: O, m and l, as attention over all the keys would have.
 * Otherwise m = max over the parts that see a key (l > 0);
 * w_k = l_k exp(m_k - m); O = sum_k (w_k / l) O_k in part order. Weights
 * live in w[] (n of them); everything of the row is read before any of it
 * is written, which makes the in-place form safe. */
#define MERGE_ROWS(A, EXP)                                                  \
    do {                                                                    \
        for (int64_t r = r0; r < r1; r++) {                                 \
            const int64_t i = r % mp->Nq, bh = r / mp->Nq;                  \
            const int64_t b = bh / mp->H, h = bh % mp->H;                   \
            A mx = -(A)INFINITY;                                            \
            int poison = 0;                                                 \
            for (int k = 0; k < n; k++) {                                   \
                const fg_attn_merge_operand *x = &mp->parts[k];             \
                const A lk = (A)ld(x->l, x->st_dtype, r);                   \
                const A mk = (A)ld(x->m, x->st_dtype, r);                   \
                w[k] = lk;                                                  \
                mw[k] = mk;                                                 \
                poison |= !(lk >= 0) || isnan(mk) ||                        \
                          (lk > 0 && mk == (A)INFINITY);                    \
                if (lk > 0 && mk > mx)                                      \
                    mx = mk;                                                \
            }                                                               \
            A L = 0;                                                        \
            for (int k = 0; k < n; k++) {                                   \
                w[k] = mx == -(A)INFINITY || !(w[k] > 0)                    \
                           ? (A)0 : (A)(w[k] * EXP((A)(mw[k] - mx)));       \
                L += (A)w[k];                                               \
            }                                                               \
            const A inv = L > 0 ? (A)1 / L : (A)0;                          \
            for (int k = 0; k < n; k++)                                     \
                w[k] = (A)w[k] * inv;                                       \
            const fg_attn_merge_operand *y = &mp->out;                      \
            for (int64_t c = 0; c < mp->d; c++) {                           \
                A acc = 0;                                                  \
                for (int k = 0; k < n; k++) {                               \
                    const fg_attn_merge_operand *x = &mp->parts[k];         \
                    if (w[k] != 0)                                          \
                        acc += (A)w[k] *                                    \
                               (A)ld(x->o, x->o_dtype,                      \
                                     b * x->sb + i * x->ss + h * x->sh + c); \
                }                                                           \
                st(y->o, y->o_dtype, b * y->sb + i * y->ss + h * y->sh + c, \
                   poison ? (A)NAN : acc);                                  \
            }                                                               \
            st(y->m, y->st_dtype, r,                                        \
               poison ? (A)NAN : L > 0 ? mx : -(A)INFINITY);                \
            st(y->l, y->st_dtype, r, poison ? (A)NAN : L);                  \
        }                                                                   \
    } while (0)

static fg_status merge_cpu(const fg_attn_merge_problem *mp)
{
    const int64_t rows = mp->B * mp->H * mp->Nq;
    const int n = mp->n;
    /* Per-thread weights: two arrays of n doubles per thread, allocated
     * up front so a failure writes nothing. */
    int nt = 1;
#ifdef _OPENMP
    nt = mp->num_threads > 0 ? mp->num_threads : omp_get_max_threads();
    if (nt > rows)
        nt = (int)rows;
    if (nt < 1)
        nt = 1;
#endif
    double *ws = malloc(sizeof(double) * 2 * (size_t)n * (size_t)nt);
    if (!ws)
        return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: cannot allocate %d "
                        "weights", fn, 2 * n * nt);
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        int t = 0, tn = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        tn = omp_get_num_threads();
#endif
        /* Contiguous row ranges: the result does not depend on nt. */
        const int64_t r0 = rows * t / tn, r1 = rows * (t + 1) / tn;
        double *w = ws + 2 * (size_t)n * (size_t)t, *mw = w + n;
        if (mp->acc_fp64)
            MERGE_ROWS(double, exp);
        else
            MERGE_ROWS(float, expf);
    }
    free(ws);
    return FG_OK;
}

/* ---- entry point ------------------------------------------------------------ */

fg_status fg_attention_merge(const fg_attn_params *p, int n_parts,
                             const fg_attn_tensor *o_parts,
                             const fg_attn_stats *stats_parts,
                             const fg_attn_tensor *o,
                             const fg_attn_stats *stats)
{
    if (!p)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
    if (p->batch < 1 || p->seqlen_q < 1 || p->heads_q < 1 ||
        p->head_dim < 1 || p->head_dim > FG_ATTN_MAX_HEAD_DIM)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: need batch, seqlen_q, heads_q >= 1 and head_dim "
                        "in [1, %d] (got %lld, %lld, %lld, %lld)",
                        fn, FG_ATTN_MAX_HEAD_DIM, (long long)p->batch,
                        (long long)p->seqlen_q, (long long)p->heads_q,
                        (long long)p->head_dim);
    if (p->batch > INT64_MAX / p->heads_q / p->seqlen_q)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: too many rows", fn);
    if (p->device != FG_DEVICE_CPU && p->device != FG_DEVICE_CUDA)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: unknown device %d", fn,
                        (int)p->device);
    if (p->num_threads < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: num_threads < 0", fn);
    if (n_parts < 1 || !o_parts || !stats_parts || !o || !stats)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: need n_parts >= 1 and non-NULL parts, O and "
                        "stats (n_parts = %d)", fn, n_parts);
    fg_attn_merge_operand *parts = malloc(sizeof *parts * (size_t)n_parts);
    if (!parts)
        return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: %d parts", fn, n_parts);
    fg_attn_merge_problem mp = {0};
    mp.B = p->batch;
    mp.Nq = p->seqlen_q;
    mp.H = p->heads_q;
    mp.d = p->head_dim;
    mp.n = n_parts;
    mp.parts = parts;
    mp.num_threads = p->num_threads;
    mp.stream = p->cuda_stream;
    fg_status s = FG_OK;
    for (int i = 0; i < n_parts && s == FG_OK; i++) {
        s = check_operand(&mp, p->device, &o_parts[i], &stats_parts[i], i,
                          &parts[i]);
        mp.acc_fp64 |= parts[i].o_dtype == FG_FP64;
    }
    if (s == FG_OK)
        s = check_operand(&mp, p->device, o, stats, -1, &mp.out);
    mp.acc_fp64 |= mp.out.o_dtype == FG_FP64;
    if (s == FG_OK)
        s = check_aliasing(&mp);
    if (s == FG_OK)
        s = p->device == FG_DEVICE_CUDA ? fg_attn_cuda_merge(&mp)
                                        : merge_cpu(&mp);
    free(parts);
    return s;
}
