/* SPDX-License-Identifier: MIT */
/* lib/attention/attention.c - the public attention API: argument validation (all of it
 * before any output is touched) and dispatch to the CPU or CUDA backend. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention_internal.h"
#include "attention_varlen.h"
#include "lib/core/error.h"
#include "lib/core/strided.h"
#include "kernels/runtime/device.h"

void fg_attn_params_init(fg_attn_params *p, int64_t batch, int64_t seqlen_q,
                         int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                         int64_t head_dim)
{
    if (!p)
        return;
    fg_attn_params z = {0};
    *p = z;
    p->batch = batch;
    p->seqlen_q = seqlen_q;
    p->seqlen_k = seqlen_k;
    p->heads_q = heads_q;
    p->heads_kv = heads_kv;
    p->head_dim = head_dim;
    p->device = FG_DEVICE_CPU;
    p->window_left = -1;
    p->window_right = -1;
}

/* The layouts' strides, or FG_ATTN_STRIDE_BAD in all three when a size is
 * negative or a product overflows int64 (attention.h): signed overflow is
 * undefined, and a wrapped stride could describe a valid-looking layout. */
static fg_attn_tensor layout(void *data, fg_dtype dtype, int64_t seqlen,
                             int64_t heads, int64_t head_dim, int bhsd)
{
    const int64_t inner = bhsd ? seqlen : heads; /* positions per outer step */
    int64_t mid, outer;
    fg_attn_tensor t = {data, dtype, FG_ATTN_STRIDE_BAD, FG_ATTN_STRIDE_BAD,
                        FG_ATTN_STRIDE_BAD};
    if (seqlen < 0 || heads < 0 || head_dim < 0 ||
        __builtin_mul_overflow(inner, head_dim, &mid) ||
        __builtin_mul_overflow(bhsd ? heads : seqlen, mid, &outer))
        return t;
    t.stride_b = outer;
    t.stride_s = bhsd ? head_dim : mid;
    t.stride_h = bhsd ? mid : head_dim;
    return t;
}

fg_attn_tensor fg_attn_bshd(void *data, fg_dtype dtype, int64_t seqlen,
                            int64_t heads, int64_t head_dim)
{
    return layout(data, dtype, seqlen, heads, head_dim, 0);
}

fg_attn_tensor fg_attn_bhsd(void *data, fg_dtype dtype, int64_t seqlen,
                            int64_t heads, int64_t head_dim)
{
    return layout(data, dtype, seqlen, heads, head_dim, 1);
}

int fg_attn_layout_bad(const fg_attn_tensor *t)
{
    return t->stride_b == FG_ATTN_STRIDE_BAD &&
           t->stride_s == FG_ATTN_STRIDE_BAD &&
           t->stride_h == FG_ATTN_STRIDE_BAD;
}

uint32_t fg_attention_dropout_threshold(double p)
{
    if (!(p >= 0.0) || p >= 1.0)
        return p >= 1.0 ? 0u : 256u;
    /* round((1-p) * 256); exact in double. */
    return (uint32_t)floor((1.0 - p) * 256.0 + 0.5);
}

uint32_t fg_dropout_threshold(double p)
{
    if (!(p >= 0.0) || p >= 1.0)
        return p >= 1.0 ? 0u : (1u << 24);
    /* floor((1-p) * 2^24); exact in double. */
    return (uint32_t)floor((1.0 - p) * 16777216.0);
}

/* ---- validation ------------------------------------------------------ */

typedef struct operand {
    const char *name;
    const fg_attn_tensor *t;
    int64_t seqlen, heads;
} operand;

static fg_status check_params(const fg_attn_params *p, fg_attn_problem *pb,
                              const char *fn)
{
    if (!p)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
    if (p->batch < 1 || p->seqlen_q < 1 || p->seqlen_k < 1 ||
        p->heads_q < 1 || p->heads_kv < 1 || p->head_dim < 1)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: sizes must be >= 1 (batch=%lld seqlen_q=%lld "
                        "seqlen_k=%lld heads_q=%lld heads_kv=%lld "
                        "head_dim=%lld)",
                        fn, (long long)p->batch, (long long)p->seqlen_q,
                        (long long)p->seqlen_k, (long long)p->heads_q,
                        (long long)p->heads_kv, (long long)p->head_dim);
    if (p->head_dim % 8 != 0 || p->head_dim > FG_ATTN_MAX_HEAD_DIM)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: head_dim %lld unsupported (need a multiple of 8 "
                        "in [8, %d])",
                        fn, (long long)p->head_dim, FG_ATTN_MAX_HEAD_DIM);
    if (p->heads_q % p->heads_kv != 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: heads_q (%lld) must be a multiple of heads_kv "
                        "(%lld)",
                        fn, (long long)p->heads_q, (long long)p->heads_kv);
    int64_t bh;
    if (p->seqlen_q > INT32_MAX || p->seqlen_k > INT32_MAX ||
        __builtin_mul_overflow(p->batch, p->heads_q, &bh) || bh > INT32_MAX)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: seqlen and batch*heads must be < 2^31", fn);
    if (!isfinite(p->softmax_scale) || p->softmax_scale < 0.0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: softmax_scale must be finite and > 0 (0 selects "
                        "1/sqrt(d)), got %g",
                        fn, p->softmax_scale);
    /* The fp32 paths multiply by (float)scale: one beyond FLT_MAX is inf
     * there and turns every score into inf or NaN. The same bound holds
     * for fp64, so the oracle accepts exactly what fp32 accepts. */
    if (p->softmax_scale > FLT_MAX)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: softmax_scale %g is not a finite fp32 number",
                        fn, p->softmax_scale);
    if (!(p->dropout_p >= 0.0 && p->dropout_p < 1.0))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: dropout_p must be in [0, 1), got %g", fn,
                        p->dropout_p);
    if (p->block_q < 0 || p->block_q > FG_ATTN_MAX_BLOCK || p->block_k < 0 ||
        p->block_k > FG_ATTN_MAX_BLOCK || p->num_threads < 0 ||
        p->num_threads > FG_ATTN_MAX_THREADS)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: block_q/block_k must be in [0, %d] and "
                        "num_threads in [0, %d] (got %d, %d, %d)",
                        fn, FG_ATTN_MAX_BLOCK, FG_ATTN_MAX_THREADS,
                        p->block_q, p->block_k, p->num_threads);
    if (p->device != FG_DEVICE_CPU && p->device != FG_DEVICE_CUDA)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: unknown device %d", fn,
                        (int)p->device);

    pb->B = p->batch;
    pb->Nq = p->seqlen_q;
    pb->Nk = p->seqlen_k;
    pb->H = p->heads_q;
    pb->Hk = p->heads_kv;
    pb->d = p->head_dim;
    pb->group = p->heads_q / p->heads_kv;
    pb->scale = p->softmax_scale > 0.0 ? p->softmax_scale
                                       : 1.0 / sqrt((double)p->head_dim);
    pb->causal = p->causal != 0;
    pb->causal_shift = p->seqlen_k - p->seqlen_q;
    pb->dropout_p = p->dropout_p;
    pb->keep_threshold = fg_attention_dropout_threshold(p->dropout_p);
    /* 1 / (the effective keep probability T / 256): unbiased, E[out] = P V */
    pb->keep_scale = pb->keep_threshold ? 256.0 / pb->keep_threshold : 0.0;
    pb->seed = p->seed;
    pb->offset = p->offset;
    pb->block_q = p->block_q ? p->block_q : FG_ATTN_DEFAULT_BLOCK_Q;
    pb->block_k = p->block_k ? p->block_k : FG_ATTN_DEFAULT_BLOCK_K;
    pb->num_threads = p->num_threads;
#ifdef _OPENMP
    /* Threads beyond the processors only cost OS threads and workspace:
     * the result is the same for every count. */
    if (pb->num_threads > omp_get_num_procs())
        pb->num_threads = omp_get_num_procs();
#endif
    pb->stream = p->cuda_stream;
    pb->deterministic = p->deterministic != 0;
    return FG_OK;
}

/* A packed operand is [1, total, heads, d]: stride_b is not used. */
static fg_view operand_view(const operand *op, int64_t B, int64_t d)
{
    fg_view v;
    v.base = (const char *)op->t->data;
    v.esize = fg_dtype_size(op->t->dtype);
    v.nd = 4;
    v.ext[0] = B;          v.str[0] = B > 1 ? op->t->stride_b : 0;
    v.ext[1] = op->seqlen; v.str[1] = op->t->stride_s;
    v.ext[2] = op->heads;  v.str[2] = op->t->stride_h;
    v.ext[3] = d;          v.str[3] = 1;
    return v;
}

static fg_view stats_view(const void *ptr, const fg_attn_problem *pb)
{
    fg_view v;
    v.base = (const char *)ptr;
    v.esize = fg_dtype_size(pb->stats_dtype);
    v.nd = 1;
    v.ext[0] = pb->varlen ? pb->H * pb->total_q : pb->B * pb->H * pb->Nq;
    v.str[0] = 1;
    return v;
}

static fg_status check_pointer(const void *ptr, size_t align,
                               fg_device dev, const char *name, const char *fn)
{
    if (!ptr)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s data is NULL", fn,
                        name);
    if ((uintptr_t)ptr % align != 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s pointer %p is not aligned to its %zu-byte "
                        "element",
                        fn, name, ptr, align);
    if (dev == FG_DEVICE_CUDA) {
        fg_status s = fg_cuda_check_pointer(ptr, name);
        if (s != FG_OK)
            return s;
    }
    return FG_OK;
}

/* Operands: inputs first (n_in of them), then outputs. Checks dtype, device
 * support, pointers, strides, and that no output overlaps anything. The
 * views of the operands, then stats.m and stats.l, go to views[] (room for
 * 12) and their count to *nv, for the bias checks. */
static fg_status check_operands(fg_attn_problem *pb, fg_device dev,
                                const operand *ops, int n_ops, int n_in,
                                const fg_attn_stats *st, int stats_is_output,
                                fg_view *views, int *nv_out, const char *fn)
{
    for (int i = 0; i < n_ops; i++)
        if (!ops[i].t)
            return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                            ops[i].name);
    if (!st)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: stats is NULL", fn);

    fg_dtype dt = ops[0].t->dtype;
    if (fg_dtype_size(dt) == 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: q has unknown dtype %d",
                        fn, (int)dt);
    for (int i = 1; i < n_ops; i++)
        if (ops[i].t->dtype != dt)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: dtype mismatch: q is %s but %s is %s", fn,
                            fg_dtype_name(dt), ops[i].name,
                            fg_dtype_name(ops[i].t->dtype));
    if (dev == FG_DEVICE_CPU && dt != FG_FP32 && dt != FG_FP64)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: the CPU backend supports fp32 and fp64, not %s",
                        fn, fg_dtype_name(dt));
    pb->dtype = dt;
    pb->stats_dtype = dt == FG_FP64 ? FG_FP64 : FG_FP32;
    if (st->dtype != pb->stats_dtype)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: stats must be %s for %s operands, got %s", fn,
                        fg_dtype_name(pb->stats_dtype), fg_dtype_name(dt),
                        fg_dtype_name(st->dtype));

    size_t es = fg_dtype_size(dt);
    for (int i = 0; i < n_ops; i++) {
        const fg_attn_tensor *t = ops[i].t;
        FG_TRY(check_pointer(t->data, es, dev, ops[i].name, fn));
        if (fg_attn_layout_bad(t))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: %s has the strides of fg_attn_bshd/"
                            "fg_attn_bhsd for sizes that are negative or "
                            "whose product overflows int64",
                            fn, ops[i].name);
        if (t->stride_b < 0 || t->stride_s < 0 || t->stride_h < 0)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: %s has a negative stride (%lld, %lld, %lld)",
                            fn, ops[i].name, (long long)t->stride_b,
                            (long long)t->stride_s, (long long)t->stride_h);
        views[i] = operand_view(&ops[i], pb->varlen ? 1 : pb->B, pb->d);
        if (fg_view_max_offset(&views[i]) < 0)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: %s strides overflow 64-bit offsets", fn,
                            ops[i].name);
        if (i >= n_in && fg_view_self_overlaps(&views[i]))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: output %s has strides (%lld, %lld, %lld) "
                            "under which distinct elements alias",
                            fn, ops[i].name, (long long)t->stride_b,
                            (long long)t->stride_s, (long long)t->stride_h);
    }
    size_t ss = fg_dtype_size(pb->stats_dtype);
    FG_TRY(check_pointer(st->m, ss, dev, "stats.m", fn));
    FG_TRY(check_pointer(st->l, ss, dev, "stats.l", fn));
    const char *names[12];
    for (int i = 0; i < n_ops; i++)
        names[i] = ops[i].name;
    int nv = n_ops;
    int m_idx = nv, l_idx = nv + 1;
    views[nv] = stats_view(st->m, pb);
    names[nv++] = "stats.m";
    views[nv] = stats_view(st->l, pb);
    names[nv++] = "stats.l";

    /* Every output against everything else. */
    for (int i = 0; i < nv; i++) {
        int out_i = (i < n_ops) ? i >= n_in
                                : (i == m_idx || i == l_idx) && stats_is_output;
        if (!out_i)
            continue;
        for (int j = 0; j < nv; j++) {
            if (j == i)
                continue;
            if (fg_views_overlap(&views[i], &views[j]))
                return fg_error(FG_ERR_INVALID_ARGUMENT,
                                "%s: output %s overlaps %s in memory", fn,
                                names[i], names[j]);
        }
    }
    *nv_out = nv;
    return FG_OK;
}

#define OP(nm, ptr, sl, hd) { nm, ptr, sl, hd }

fg_status fg_attention_forward(const fg_attn_params *p, const fg_attn_tensor *q,
                               const fg_attn_tensor *k, const fg_attn_tensor *v,
                               const fg_attn_tensor *o,
                               const fg_attn_stats *stats)
{
    static const char fn[] = "fg_attention_forward";
    fg_attn_problem pb;
    FG_TRY(check_params(p, &pb, fn));
    FG_TRY(fg_attn_check_varlen(p, &pb, fn));
    const int64_t rq = pb.varlen ? pb.total_q : pb.Nq;
    const int64_t rk = pb.varlen ? pb.total_k : pb.Nk;
    operand ops[] = {
        OP("q", q, rq, pb.H), OP("k", k, rk, pb.Hk),
        OP("v", v, rk, pb.Hk), OP("o", o, rq, pb.H),
    };
    fg_view views[12];
    int nv = 0;
    FG_TRY(check_operands(&pb, p->device, ops, 4, 3, stats, 1, views, &nv, fn));
    FG_TRY(fg_attn_check_bias(p, &pb, views, nv, 3, 0, fn));
    FG_TRY(fg_attn_check_variants(p, &pb, fn));
    if (p->device == FG_DEVICE_CUDA)
        return fg_attn_cuda_forward(&pb, q, k, v, o, stats);
    return fg_attn_cpu_forward(&pb, q, k, v, o, stats);
}

fg_status fg_attention_backward(const fg_attn_params *p,
                                const fg_attn_tensor *q,
                                const fg_attn_tensor *k,
                                const fg_attn_tensor *v,
                                const fg_attn_tensor *o,
                                const fg_attn_tensor *dout,
                                const fg_attn_stats *stats,
                                const fg_attn_tensor *dq,
                                const fg_attn_tensor *dk,
                                const fg_attn_tensor *dv)
{
    static const char fn[] = "fg_attention_backward";
    fg_attn_problem pb;
    FG_TRY(check_params(p, &pb, fn));
    FG_TRY(fg_attn_check_varlen(p, &pb, fn));
    const int64_t rq = pb.varlen ? pb.total_q : pb.Nq;
    const int64_t rk = pb.varlen ? pb.total_k : pb.Nk;
    operand ops[] = {
        OP("q", q, rq, pb.H),     OP("k", k, rk, pb.Hk),
        OP("v", v, rk, pb.Hk),    OP("o", o, rq, pb.H),
        OP("dout", dout, rq, pb.H), OP("dq", dq, rq, pb.H),
        OP("dk", dk, rk, pb.Hk),  OP("dv", dv, rk, pb.Hk),
    };
    fg_view views[12];
    int nv = 0;
    FG_TRY(check_operands(&pb, p->device, ops, 8, 5, stats, 0, views, &nv, fn));
    FG_TRY(fg_attn_check_bias(p, &pb, views, nv, 5, 1, fn));
    FG_TRY(fg_attn_check_variants(p, &pb, fn));
    if (p->device == FG_DEVICE_CUDA)
        return fg_attn_cuda_backward(&pb, q, k, v, o, dout, stats, dq, dk, dv);
    return fg_attn_cpu_backward(&pb, q, k, v, o, dout, stats, dq, dk, dv);
}

fg_status fg_attention_dropout_mask(const fg_attn_params *p, uint8_t *mask)
{
    static const char fn[] = "fg_attention_dropout_mask";
    if (!p)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
    /* Only the fields the mask depends on are checked. */
    fg_attn_params q = *p;
    q.head_dim = 8;
    q.heads_kv = 1;
    q.softmax_scale = 0;
    q.block_q = q.block_k = 0;
    q.num_threads = 0;
    fg_attn_problem pb;
    FG_TRY(check_params(&q, &pb, fn));
    if (!mask)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: mask is NULL", fn);
    if (pb.B * pb.H > INT64_MAX / pb.Nq / pb.Nk)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: mask too large", fn);
    if (p->device == FG_DEVICE_CUDA)
        return fg_attn_cuda_dropout_mask(&pb, mask);
    for (int64_t b = 0; b < pb.B; b++)
        for (int64_t h = 0; h < pb.H; h++)
            for (int64_t i = 0; i < pb.Nq; i++)
                fg_dropout_row(&pb, b, h, i, 0, pb.Nk,
                               mask + ((b * pb.H + h) * pb.Nq + i) * pb.Nk);
    return FG_OK;
}
