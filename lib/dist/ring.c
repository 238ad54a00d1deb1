/* SPDX-License-Identifier: MIT */
/* lib/dist/ring.c - ring attention (dist.h): sequence parallelism over the
 * ranks of a communicator.
 *
 * Each rank holds nch chunks of c = n / nch tokens (nch = 1 contiguous,
 * 2 zigzag). Block (query chunk a, key chunk b), by global chunk index, is
 * full for b < a, plain causal for b == a (equal lengths: Nq = Nk = c) and
 * empty for b > a under a causal mask; full otherwise (attention.h, merging
 * partial results).
 *
 * Forward, step t = 0 .. N-1: the rank holds the K/V chunks of rank r - t;
 * it starts sending them to r + 1 (and receiving r - t - 1's from r - 1),
 * computes its blocks against them and merges each block's (O, m, l) into
 * the query chunk's accumulator (fg_attention_merge, in place), then waits
 * for the transfer. The transfer overlaps the blocks' compute.
 *
 * Backward: the same walk of K/V; each block's backward runs with the
 * merged O, m, l of the forward, which gives exact partial dQ (summed into
 * the rank's dQ) and exact dK/dV of the block's keys. The dK/dV of a K/V
 * chunk travel with it: rank r adds its blocks' part to the accumulator it
 * received from r - 1 and sends it on; after N steps it is back with the
 * chunk's owner. The accumulator's transfer overlaps the next step's
 * compute.
 *
 * Ring buffers are chunk-major: nch contiguous [B, c, Hk, d] blocks of K,
 * then of V (and dK, dV), so every chunk is a plain BSHD view. fp16/bf16
 * accumulate in fp32. On CUDA everything runs on the context stream (the
 * communicator's), p->cuda_stream is not used. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "flashgrad/cuda.h"

#include "comm_internal.h"
#include "dist_internal.h"
#include "lib/core/error.h"
#include "kernels/runtime/device.h"

enum { FULL, DIAG, SKIP };

typedef struct ring {
    fg_device dev;
    fg_dtype dt, sdt, adt; /* operands, statistics, accumulators */
    size_t es, ses, aes;
    int N, r, nch;
    int64_t n, c, B, H, Hk, d;
    int causal;
    fg_ring_layout layout;
    fg_attn_params pb; /* one block: Nq = Nk = c */
    fg_attn_params pm; /* merges of one query chunk */
    int64_t kvn;       /* elements of K (or V) on a rank: B n Hk d */
} ring;

int64_t fg_ring_position(fg_ring_layout layout, int size, int rank, int64_t n,
                         int64_t i)
{
    if (layout != FG_RING_ZIGZAG)
        return (int64_t)rank * n + i;
    const int64_t c = n / 2, j = i / c;
    return (j == 0 ? rank : 2 * (int64_t)size - 1 - rank) * c + i % c;
}

static int64_t chunk_gid(const ring *R, int rank, int j)
{
    if (R->nch == 1)
        return rank;
    return j == 0 ? rank : 2 * R->N - 1 - rank;
}

static int kind(const ring *R, int64_t a, int64_t b)
{
    if (!R->causal || b < a)
        return FULL;
    return b == a ? DIAG : SKIP;
}

/* ---- device memory and the two helpers ------------------------------------------ */

static fg_status dalloc(const ring *R, size_t bytes, void **p)
{
    *p = NULL;
    if (R->dev == FG_DEVICE_CPU) {
        *p = malloc(bytes ? bytes : 1);
        return *p ? FG_OK
                  : fg_error(FG_ERR_OUT_OF_MEMORY, "ring attention: %zu bytes",
                             bytes);
    }
#ifdef FG_HAVE_CUDA
    return fg_cuda_mem_alloc(bytes ? bytes : 1, p);
#else
    return FG_NO_CUDA("ring attention");
#endif
}

static void dfree(const ring *R, void *p, size_t bytes)
{
    if (!p)
        return;
    if (R->dev == FG_DEVICE_CPU)
        free(p);
#ifdef FG_HAVE_CUDA
    else
        fg_cuda_mem_free(p, bytes ? bytes : 1);
#endif
    (void)bytes;
}

static fg_status dzero(const ring *R, void *p, size_t bytes)
{
    if (R->dev == FG_DEVICE_CPU) {
        memset(p, 0, bytes);
        return FG_OK;
    }
#ifdef FG_HAVE_CUDA
    return fg_cuda_memset_zero(p, bytes);
#else
    return FG_NO_CUDA("ring attention");
#endif
}

/* A call's temporary buffers: all allocated, or none (then FG_ERR_...);
 * entries of 0 bytes stay NULL. */
typedef struct wsbuf {
    void **p;
    size_t bytes;
} wsbuf;

static fg_status ws_alloc(const ring *R, const wsbuf *w, int n)
{
    for (int i = 0; i < n; i++)
        *w[i].p = NULL;
    fg_status s = FG_OK;
    for (int i = 0; i < n && s == FG_OK; i++)
        if (w[i].bytes)
            s = dalloc(R, w[i].bytes, w[i].p);
    return s;
}

static void ws_free(const ring *R, const wsbuf *w, int n)
{
    for (int i = 0; i < n; i++)
        dfree(R, *w[i].p, w[i].bytes);
}

/* [B, S, Hh, d] strided copy, es-byte elements. */
static fg_status copy4d(const ring *R, void *dst, const int64_t ds[3],
                        const void *src, const int64_t ss[3], int64_t B,
                        int64_t S, int64_t Hh, int64_t d, size_t es)
{
    if (R->dev == FG_DEVICE_CUDA)
        return fg_dist_cuda_copy4d(dst, ds, src, ss, B, S, Hh, d, es);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < Hh; h++)
                memcpy((char *)dst + (size_t)(b * ds[0] + s * ds[1] +
                                              h * ds[2]) * es,
                       (const char *)src + (size_t)(b * ss[0] + s * ss[1] +
                                                    h * ss[2]) * es,
                       (size_t)d * es);
    return FG_OK;
}

/* dst += src, n elements (CPU: same dtype, fp32 or fp64). */
static fg_status add(const ring *R, void *dst, fg_dtype ddt, const void *src,
                     fg_dtype sdt, int64_t n)
{
    if (R->dev == FG_DEVICE_CUDA)
        return fg_dist_cuda_add(dst, ddt, src, sdt, n);
    if (ddt == FG_FP64) {
        double *x = dst;
        const double *y = src;
        for (int64_t i = 0; i < n; i++)
            x[i] += y[i];
    } else {
        float *x = dst;
        const float *y = src;
        for (int64_t i = 0; i < n; i++)
            x[i] += y[i];
    }
    return FG_OK;
}

/* ---- views ------------------------------------------------------------------------ */

/* Local chunk j of a caller's [B, n, heads, d] operand. */
static fg_attn_tensor chunk_of(const ring *R, const fg_attn_tensor *t, int j)
{
    fg_attn_tensor v = *t;
    v.data = (char *)t->data +
             (size_t)((int64_t)j * R->c * t->stride_s) * fg_dtype_size(t->dtype);
    return v;
}

/* Chunk j of a chunk-major buffer of nch [B, c, heads, d] blocks. */
static fg_attn_tensor chunk_buf(const ring *R, void *base, fg_dtype dt,
                                int64_t heads, int j)
{
    const int64_t blk = R->B * R->c * heads * R->d;
    return fg_attn_bshd((char *)base + (size_t)(j * blk) * fg_dtype_size(dt),
                        dt, R->c, heads, R->d);
}

static const int64_t *strides(const fg_attn_tensor *t, int64_t s[3])
{
    s[0] = t->stride_b;
    s[1] = t->stride_s;
    s[2] = t->stride_h;
    return s;
}

/* Caller's operand (any strides) <-> chunk-major buffer. to_buf: pack. */
static fg_status pack(const ring *R, const fg_attn_tensor *t, void *buf,
                      int64_t heads, int to_buf)
{
    for (int j = 0; j < R->nch; j++) {
        fg_attn_tensor x = chunk_of(R, t, j);
        fg_attn_tensor y = chunk_buf(R, buf, t->dtype, heads, j);
        int64_t sx[3], sy[3];
        strides(&x, sx);
        strides(&y, sy);
        if (to_buf)
            FG_TRY(copy4d(R, y.data, sy, x.data, sx, R->B, R->c, heads, R->d,
                          R->es));
        else
            FG_TRY(copy4d(R, x.data, sx, y.data, sy, R->B, R->c, heads, R->d,
                          R->es));
    }
    return FG_OK;
}

/* The local K and V into a ring buffer (K chunks, then V chunks). */
static fg_status pack_kv(const ring *R, const fg_attn_tensor *k,
                         const fg_attn_tensor *v, void *buf)
{
    FG_TRY(pack(R, k, buf, R->Hk, 1));
    return pack(R, v, (char *)buf + (size_t)R->kvn * R->es, R->Hk, 1);
}

/* Statistics [B, H, n] <-> per-chunk [B, H, c] (to_chunks: split). */
static fg_status stats_move(const ring *R, void *whole, void *chunk, int j,
                            int to_chunks)
{
    const int64_t sw[3] = {R->H * R->n, R->n, 1}, sc[3] = {R->H * R->c, R->c, 1};
    char *w = (char *)whole + (size_t)((int64_t)j * R->c) * R->ses;
    /* As [B, H, c, 1] operands. */
    return to_chunks ? copy4d(R, chunk, sc, w, sw, R->B, R->H, R->c, 1, R->ses)
                     : copy4d(R, w, sw, chunk, sc, R->B, R->H, R->c, 1, R->ses);
}

/* Block (local query chunk jq, K/V chunk jk of the buffer held, which
 * came from rank src): its parameters (causal on the diagonal) and K/V
 * views; 0 when the causal mask empties it. */
static int block(const ring *R, int src, int jq, int jk, void *kv,
                 fg_attn_params *pb, fg_attn_tensor *kk, fg_attn_tensor *vv)
{
    const int kd = kind(R, chunk_gid(R, R->r, jq), chunk_gid(R, src, jk));
    if (kd == SKIP)
        return 0;
    *pb = R->pb;
    pb->causal = kd == DIAG;
    *kk = chunk_buf(R, kv, R->dt, R->Hk, jk);
    *vv = chunk_buf(R, (char *)kv + (size_t)R->kvn * R->es, R->dt, R->Hk, jk);
    return 1;
}

/* ---- setup ------------------------------------------------------------------------------ */

static fg_status setup(ring *R, fg_comm *c, fg_ring_layout layout,
                       const fg_attn_params *p, const fg_attn_tensor *const *ts,
                       int nts, const fg_attn_stats *st, const char *fn)
{
    if (!c || !p || !st)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: NULL communicator, "
                        "params or stats", fn);
    for (int i = 0; i < nts; i++)
        if (!ts[i] || !ts[i]->data)
            return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: operand %d is NULL",
                            fn, i);
    if (layout != FG_RING_CONTIGUOUS && layout != FG_RING_ZIGZAG)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: unknown layout %d", fn,
                        (int)layout);
    if (p->seqlen_q != p->seqlen_k || p->seqlen_q < 1)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: seqlen_q (%lld) and seqlen_k (%lld) are the "
                        "local length n and must be equal", fn,
                        (long long)p->seqlen_q, (long long)p->seqlen_k);
    if (layout == FG_RING_ZIGZAG && p->seqlen_q % 2)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: zigzag needs an even local length (n = %lld)", fn,
                        (long long)p->seqlen_q);
    if (p->dropout_p != 0)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: dropout is not supported (the masks would use "
                        "block-local key indices)", fn);
    if (p->window_left != -1 || p->window_right != -1 || p->alibi_slopes ||
        p->block_mask || p->bias || p->dbias)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: sliding windows, ALiBi, block masks and a bias "
                        "depend on global positions and are not supported "
                        "(softcap is)", fn);
    if (p->cu_seqlens_q || p->cu_seqlens_k || p->seqused_k)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: packed batches (cu_seqlens) and key padding "
                        "(seqused_k) are not supported",
                        fn);
    if (p->device != c->device)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: the operands are on %s but the communicator "
                        "moves %s buffers", fn, fg_device_name(p->device),
                        fg_device_name(c->device));
    if (c->device == FG_DEVICE_CUDA && fg_comm_get_stream(c))
        return fg_error(FG_ERR_UNSUPPORTED, "%s: one GPU per process, please",
                        fn);
    const fg_dtype dt = ts[0]->dtype;
    for (int i = 1; i < nts; i++)
        if (ts[i]->dtype != dt)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: operand dtypes differ (%s, %s)", fn,
                            fg_dtype_name(dt), fg_dtype_name(ts[i]->dtype));
    if (fg_dtype_size(dt) == 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: unknown dtype", fn);
    memset(R, 0, sizeof *R);
    R->dev = c->device;
    R->dt = dt;
    R->sdt = dt == FG_FP64 ? FG_FP64 : FG_FP32;
    R->adt = dt == FG_FP64 ? FG_FP64 : FG_FP32;
    if (st->dtype != R->sdt)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: stats must be %s", fn,
                        fg_dtype_name(R->sdt));
    R->es = fg_dtype_size(dt);
    R->ses = fg_dtype_size(R->sdt);
    R->aes = fg_dtype_size(R->adt);
    R->N = c->size;
    R->r = c->rank;
    R->layout = layout;
    R->nch = layout == FG_RING_ZIGZAG ? 2 : 1;
    R->n = p->seqlen_q;
    R->c = R->n / R->nch;
    R->B = p->batch;
    R->H = p->heads_q;
    R->Hk = p->heads_kv;
    R->d = p->head_dim;
    R->causal = p->causal != 0;
    R->kvn = R->B * R->n * R->Hk * R->d;
    R->pb = *p;
    R->pb.seqlen_q = R->pb.seqlen_k = R->c;
    R->pb.cuda_stream = R->dev == FG_DEVICE_CUDA ? fg_cuda_get_stream() : NULL;
    R->pm = R->pb;
    R->pm.causal = 0;
    if (R->B < 1 || R->H < 1 || R->Hk < 1 || R->d < 1)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: sizes must be >= 1", fn);
    return FG_OK;
}

/* ---- forward -------------------------------------------------------------------------- */

fg_status fg_ring_attention_forward(fg_comm *c, fg_ring_layout layout,
                                    const fg_attn_params *p,
                                    const fg_attn_tensor *q,
                                    const fg_attn_tensor *k,
                                    const fg_attn_tensor *v,
                                    const fg_attn_tensor *o,
                                    const fg_attn_stats *stats)
{
    static const char fn[] = "fg_ring_attention_forward";
    ring R;
    const fg_attn_tensor *ts[] = {q, k, v, o};
    FG_TRY(setup(&R, c, layout, p, ts, 4, stats, fn));
    const int half = R.dt == FG_FP16 || R.dt == FG_BF16;
    const int64_t on = R.B * R.c * R.H * R.d, sn = R.B * R.H * R.c;
    /* Workspace: K/V twice (current, next), one block's (O, m, l), and
     * the accumulators the output cannot hold itself: fp32 O for fp16/bf16,
     * per-chunk statistics for zigzag. */
    const size_t kvb = 2 * (size_t)R.kvn * R.es;
    const size_t ob = (size_t)on * R.es, sb = (size_t)sn * R.ses;
    const size_t oacc_b = half ? (size_t)(R.B * R.n * R.H * R.d) * 4 : 0;
    const size_t sacc_b = R.nch > 1 ? 2 * (size_t)R.nch * sb : 0;
    void *kv[2], *opart, *mpart, *lpart, *oacc, *sacc;
    const wsbuf ws[] = {{&kv[0], kvb}, {&kv[1], kvb},   {&opart, ob},
                        {&mpart, sb},  {&lpart, sb},    {&oacc, oacc_b},
                        {&sacc, sacc_b}};
    const int nws = (int)(sizeof ws / sizeof *ws);
    fg_status s = ws_alloc(&R, ws, nws);
    if (s == FG_OK)
        s = pack_kv(&R, k, v, kv[0]);
    if (s != FG_OK)
        goto out;

    /* Accumulators per local query chunk. */
    fg_attn_tensor acc_o[2];
    fg_attn_stats acc_st[2];
    for (int j = 0; j < R.nch; j++) {
        if (half) {
            const fg_attn_tensor whole = fg_attn_bshd(oacc, FG_FP32, R.n,
                                                      R.H, R.d);
            acc_o[j] = chunk_of(&R, &whole, j);
        } else {
            acc_o[j] = chunk_of(&R, o, j);
        }
        if (R.nch == 1)
            acc_st[j] = *stats;
        else
            acc_st[j] = (fg_attn_stats){(char *)sacc + (size_t)(2 * j) * sb,
                                        (char *)sacc + (size_t)(2 * j + 1) * sb,
                                        R.sdt};
    }
    int have[2] = {0, 0};
    fg_attn_tensor po = fg_attn_bshd(opart, R.dt, R.c, R.H, R.d);
    fg_attn_stats pst = {mpart, lpart, R.sdt};
    int cur = 0;
    const int next = (R.r + 1) % R.N, prev = (R.r + R.N - 1) % R.N;
    for (int t = 0; t < R.N; t++) {
        const int src = (R.r - t + R.N) % R.N;
        fg_comm_request *req = NULL;
        if (t < R.N - 1) {
            fg_status w = fg_comm_isendrecv(c, kv[cur], 2 * (size_t)R.kvn,
                                            next, kv[cur ^ 1],
                                            2 * (size_t)R.kvn, prev, R.dt,
                                            &req);
            if (w != FG_OK) {
                s = w;
                goto out;
            }
        }
        for (int jq = 0; jq < R.nch && s == FG_OK; jq++) {
            fg_attn_tensor qv = chunk_of(&R, q, jq);
            for (int jk = 0; jk < R.nch && s == FG_OK; jk++) {
                fg_attn_params pb;
                fg_attn_tensor kk, vv;
                if (!block(&R, src, jq, jk, kv[cur], &pb, &kk, &vv))
                    continue;
                s = fg_attention_forward(&pb, &qv, &kk, &vv, &po, &pst);
                if (s != FG_OK)
                    break;
                /* First block: the accumulator becomes it; later blocks
                 * merge into it in place. */
                if (!have[jq]) {
                    s = fg_attention_merge(&R.pm, 1, &po, &pst, &acc_o[jq],
                                           &acc_st[jq]);
                } else {
                    const fg_attn_tensor ops[2] = {acc_o[jq], po};
                    const fg_attn_stats sts[2] = {acc_st[jq], pst};
                    s = fg_attention_merge(&R.pm, 2, ops, sts, &acc_o[jq],
                                           &acc_st[jq]);
                }
                have[jq] = 1;
            }
        }
        /* The transfer completes even when this rank's compute failed, so
         * no rank is left waiting. */
        fg_status w = fg_comm_wait(req);
        if (w != FG_OK) {
            s = w;
            goto out;
        }
        cur ^= 1;
    }
    for (int j = 0; j < R.nch && s == FG_OK; j++) {
        if (half) { /* fp32 accumulator -> the caller's O */
            fg_attn_tensor oj = chunk_of(&R, o, j);
            s = fg_attention_merge(&R.pm, 1, &acc_o[j], &acc_st[j], &oj,
                                   &acc_st[j]);
        }
        if (s == FG_OK && R.nch > 1) {
            s = stats_move(&R, stats->m, acc_st[j].m, j, 0);
            if (s == FG_OK)
                s = stats_move(&R, stats->l, acc_st[j].l, j, 0);
        }
    }
out:
    ws_free(&R, ws, nws);
    return s;
}

/* ---- backward ------------------------------------------------------------------------ */

fg_status fg_ring_attention_backward(
    fg_comm *c, fg_ring_layout layout, const fg_attn_params *p,
    const fg_attn_tensor *q, const fg_attn_tensor *k, const fg_attn_tensor *v,
    const fg_attn_tensor *o, const fg_attn_tensor *dout,
    const fg_attn_stats *stats, const fg_attn_tensor *dq,
    const fg_attn_tensor *dk, const fg_attn_tensor *dv)
{
    static const char fn[] = "fg_ring_attention_backward";
    ring R;
    const fg_attn_tensor *ts[] = {q, k, v, o, dout, dq, dk, dv};
    FG_TRY(setup(&R, c, layout, p, ts, 8, stats, fn));
    const int half = R.dt == FG_FP16 || R.dt == FG_BF16;
    const int64_t qn = R.B * R.n * R.H * R.d;      /* dQ on this rank */
    const int64_t qcn = R.B * R.c * R.H * R.d;     /* one query chunk */
    const int64_t kcn = R.B * R.c * R.Hk * R.d;    /* one K chunk */
    const int64_t sn = R.B * R.H * R.c;
    const size_t kvb = 2 * (size_t)R.kvn * R.es;   /* K and V */
    const size_t dkvb = 2 * (size_t)R.kvn * R.aes; /* dK and dV */
    const size_t dqb = (size_t)qn * R.aes, sb = (size_t)sn * R.ses;
    const size_t partb = (size_t)(qcn + 2 * kcn) * R.es;
    const size_t stb = R.nch > 1 ? 2 * (size_t)R.nch * sb : 0;
    const size_t convb = half ? (size_t)(qn > 2 * R.kvn ? qn : 2 * R.kvn) * R.es
                              : 0;
    void *kv[2], *loc[2], *in[2], *dqacc, *part, *stc, *conv;
    const wsbuf ws[] = {{&kv[0], kvb},  {&kv[1], kvb},  {&loc[0], dkvb},
                        {&loc[1], dkvb}, {&in[0], dkvb}, {&in[1], dkvb},
                        {&dqacc, dqb},  {&part, partb}, {&stc, stb},
                        {&conv, convb}};
    const int nws = (int)(sizeof ws / sizeof *ws);
    fg_status s = ws_alloc(&R, ws, nws);
    if (s == FG_OK)
        s = dzero(&R, dqacc, dqb);
    if (s == FG_OK)
        s = pack_kv(&R, k, v, kv[0]);
    /* The merged statistics of each query chunk. */
    fg_attn_stats qst[2];
    for (int j = 0; j < R.nch && s == FG_OK; j++) {
        if (R.nch == 1) {
            qst[j] = *stats;
            continue;
        }
        qst[j] = (fg_attn_stats){(char *)stc + (size_t)(2 * j) * sb,
                                 (char *)stc + (size_t)(2 * j + 1) * sb,
                                 R.sdt};
        s = stats_move(&R, stats->m, qst[j].m, j, 1);
        if (s == FG_OK)
            s = stats_move(&R, stats->l, qst[j].l, j, 1);
    }
    if (s != FG_OK)
        goto out;

    fg_attn_tensor pdq = fg_attn_bshd(part, R.dt, R.c, R.H, R.d);
    fg_attn_tensor pdk = fg_attn_bshd((char *)part + (size_t)qcn * R.es, R.dt,
                                      R.c, R.Hk, R.d);
    fg_attn_tensor pdv = fg_attn_bshd(
        (char *)part + (size_t)(qcn + kcn) * R.es, R.dt, R.c, R.Hk, R.d);
    const int next = (R.r + 1) % R.N, prev = (R.r + R.N - 1) % R.N;
    int cur = 0, lc = 0, ic = 0;
    fg_comm_request *dreq = NULL;
    fg_status cs = FG_OK; /* this rank's compute; the ring goes on */
    for (int t = 0; t < R.N; t++) {
        const int src = (R.r - t + R.N) % R.N;
        fg_comm_request *kvreq = NULL;
        if (t < R.N - 1) {
            s = fg_comm_isendrecv(c, kv[cur], 2 * (size_t)R.kvn, next,
                                  kv[cur ^ 1], 2 * (size_t)R.kvn, prev, R.dt,
                                  &kvreq);
            if (s != FG_OK)
                break;
        }
        /* This rank's part of the dK/dV of chunk owner src. */
        if (cs == FG_OK)
            cs = dzero(&R, loc[lc], dkvb);
        for (int jq = 0; jq < R.nch && cs == FG_OK; jq++) {
            fg_attn_tensor qv = chunk_of(&R, q, jq), ov = chunk_of(&R, o, jq),
                           gv = chunk_of(&R, dout, jq);
            for (int jk = 0; jk < R.nch && cs == FG_OK; jk++) {
                fg_attn_params pb;
                fg_attn_tensor kk, vv;
                if (!block(&R, src, jq, jk, kv[cur], &pb, &kk, &vv))
                    continue;
                cs = fg_attention_backward(&pb, &qv, &kk, &vv, &ov, &gv,
                                           &qst[jq], &pdq, &pdk, &pdv);
                if (cs == FG_OK)
                    cs = add(&R, (char *)dqacc + (size_t)(jq * qcn) * R.aes,
                             R.adt, pdq.data, R.dt, qcn);
                if (cs == FG_OK)
                    cs = add(&R, (char *)loc[lc] + (size_t)(jk * kcn) * R.aes,
                             R.adt, pdk.data, R.dt, kcn);
                if (cs == FG_OK)
                    cs = add(&R,
                             (char *)loc[lc] +
                                 (size_t)(R.kvn + jk * kcn) * R.aes,
                             R.adt, pdv.data, R.dt, kcn);
            }
        }
        if (R.N > 1) {
            /* The accumulator of chunk owner src so far (from r - 1),
             * plus this rank's part, goes on to r + 1. */
            if (t > 0) {
                s = fg_comm_wait(dreq);
                dreq = NULL;
                if (s != FG_OK) {
                    fg_comm_wait(kvreq);
                    break;
                }
                if (cs == FG_OK)
                    cs = add(&R, loc[lc], R.adt, in[ic], R.adt, 2 * R.kvn);
            }
            s = fg_comm_isendrecv(c, loc[lc], 2 * (size_t)R.kvn, next,
                                  in[ic ^ 1], 2 * (size_t)R.kvn, prev, R.adt,
                                  &dreq);
            if (s != FG_OK) {
                fg_comm_wait(kvreq);
                break;
            }
            lc ^= 1;
            ic ^= 1;
        }
        s = fg_comm_wait(kvreq);
        if (s != FG_OK)
            break;
        cur ^= 1;
    }
    if (s == FG_OK && dreq)
        s = fg_comm_wait(dreq); /* our own chunks' dK/dV, back home */
    else
        fg_comm_wait(dreq);
    if (s == FG_OK)
        s = cs;
    if (s != FG_OK)
        goto out;
    /* Accumulators -> the caller's dQ, dK, dV (converted first for
     * fp16/bf16). */
    {
        void *dkv = R.N > 1 ? in[ic] : loc[lc];
        struct {
            const fg_attn_tensor *t;
            void *acc;
            int64_t heads, count;
        } outs[] = {
            {dq, dqacc, R.H, qn},
            {dk, dkv, R.Hk, R.kvn},
            {dv, (char *)dkv + (size_t)R.kvn * R.aes, R.Hk, R.kvn},
        };
        for (int i = 0; i < 3 && s == FG_OK; i++) {
            void *src = outs[i].acc;
            if (half) {
                s = dzero(&R, conv, (size_t)outs[i].count * R.es);
                if (s == FG_OK)
                    s = add(&R, conv, R.dt, src, R.adt, outs[i].count);
                src = conv;
            }
            if (s == FG_OK)
                s = pack(&R, outs[i].t, src, outs[i].heads, 0);
        }
    }
out:
    ws_free(&R, ws, nws);
    return s;
}
