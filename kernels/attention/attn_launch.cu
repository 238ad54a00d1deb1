/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_launch.cu - host side of the CUDA attention: turns a
 * validated fg_attn_problem into kernel arguments, allocates the backward's
 * O(B*H*N*d) workspace stream-ordered (cudaMallocAsync, so repeated calls
 * reuse the pool) and launches on the caller's stream. */
#include <cuda_runtime.h>

#include "lib/attention/attention_internal.h"
#include "attn_kernels.h"
#include "kernels/runtime/device.h"
#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/cuda_context.h"

#include <stdlib.h>
#include <string.h>

using fg::AttnArgs;
using fg::Operand;

/* Packed operands have no batch stride (attention.h). */
static Operand operand(const fg_attn_problem *pb, const fg_attn_tensor *t)
{
    Operand o;
    o.ptr = t ? t->data : nullptr;
    o.sb = t && !pb->varlen ? t->stride_b : 0;
    o.ss = t ? t->stride_s : 0;
    o.sh = t ? t->stride_h : 0;
    return o;
}

static bool aligned16(const Operand &t)
{
    return ((uintptr_t)t.ptr % 16) == 0 && t.sb % 8 == 0 && t.ss % 8 == 0 &&
           t.sh % 8 == 0;
}

bool fg::mma_path_ok(const AttnArgs &a, bool backward)
{
    if (fg::env_is("FG_ATTN_KERNEL", "general"))
        return false;

    bool ok = aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.o);
    if (backward)
        ok = ok && aligned16(a.dout) && aligned16(a.dq) && aligned16(a.dk) &&
             aligned16(a.dv);
    return ok;
}

static fg_status base_args(const fg_attn_problem *pb, const char *fn,
                           AttnArgs *a, size_t *smem_limit)
{
    if (pb->B > 65535 || pb->H > 65535)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: batch and heads must be <= 65535 on CUDA", fn);
    int dev = 0, optin = 0;
    FG_CUDA_TRY(cudaGetDevice(&dev));
    FG_CUDA_TRY(cudaDeviceGetAttribute(&optin,
                                       cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                       dev));
    *smem_limit = (size_t)optin;
    *a = AttnArgs();
    a->B = (int)pb->B;
    a->Nq = (int)pb->Nq;
    a->Nk = (int)pb->Nk;
    a->H = (int)pb->H;
    a->Hk = (int)pb->Hk;
    a->d = (int)pb->d;
    a->group = (int)pb->group;
    a->shift = pb->causal_shift;
    a->causal = pb->causal;
    /* Plain bottom-right causal is the fast kernels' kCausal; anything else
     * the band describes (windows, top-left) is a variant. */
    const bool plain_causal = pb->causal && pb->win_hi == 0 &&
                              pb->win_lo == -FG_ATTN_UNBOUNDED &&
                              pb->causal_shift == pb->Nk - pb->Nq;
    a->band = pb->band;
    a->win_lo = pb->win_lo;
    a->win_hi = pb->win_hi;
    a->softcap = (float)pb->softcap;
    a->softcap_d = pb->softcap;
    a->alibi = pb->alibi;
    a->alibi_sb = pb->alibi_sb;
    a->sparse = pb->sparse;
    if (pb->sparse) {
        a->bm_b = (int)pb->bm.batch;
        a->bm_h = (int)pb->bm.heads;
        a->nqb = (int)pb->bm.q_blocks;
        a->nkb = (int)pb->bm.k_blocks;
        a->kv_count = pb->bm.kv_count;
        a->kv_index = pb->bm.kv_index;
        a->q_count = pb->bm.q_count;
        a->q_index = pb->bm.q_index;
    }
    a->bias = pb->bias.data;
    if (a->bias) {
        a->bias_f32 = pb->bias.dtype == FG_FP32;
        a->bias_s[0] = pb->bias.stride_b;
        a->bias_s[1] = pb->bias.stride_h;
        a->bias_s[2] = pb->bias.stride_q;
        a->bias_s[3] = pb->bias.stride_k;
    }
    /* Packed batches and key padding are variants too: the wgmma kernels
     * run them in kMode 3 (7 with masks alone), the sm80 kernels in kMode 2
     * with kRagged. A bias (never combined with them) runs in the wgmma
     * forward's kMode 2 and the backward's kMode 4 or 5, and in the sm80
     * kernels' kMode 4. */
    a->variant = (pb->band && !plain_causal) || pb->softcap > 0 || pb->alibi ||
                 pb->sparse || pb->varlen || pb->seqused_k || pb->bias.data;
    a->scale = pb->scale;
    a->dropout = pb->dropout_p > 0.0;
    a->keep_threshold = pb->keep_threshold;
    a->keep_scale = pb->keep_scale;
    a->seed = pb->seed;
    a->offset = pb->offset;
    a->deterministic = pb->deterministic;
    a->cu_q = pb->cu_q;
    a->cu_k = pb->cu_k;
    a->seqused_k = pb->seqused_k;
    a->total_q = pb->total_q;
    a->total_k = pb->total_k;
    a->top_left = pb->top_left;
    a->st_b = pb->st_b;
    a->st_h = pb->st_h;
    return FG_OK;
}

extern "C" fg_status fg_attn_cuda_forward(const fg_attn_problem *pb,
                                          const fg_attn_tensor *q,
                                          const fg_attn_tensor *k,
                                          const fg_attn_tensor *v,
                                          const fg_attn_tensor *o,
                                          const fg_attn_stats *st)
{
    AttnArgs a;
    size_t limit = 0;
    FG_TRY(base_args(pb, "fg_attention_forward", &a, &limit));
    a.q = operand(pb, q);
    a.k = operand(pb, k);
    a.v = operand(pb, v);
    a.o = operand(pb, o);
    a.m = st->m;
    a.l = st->l;
    return fg::attn_fwd_dispatch(pb->dtype, a, limit,
                                 (cudaStream_t)pb->stream);
}

/* dbias's mode (attn_bias.cu) and, for atomics into a dbias not of the
 * accumulator type, the bytes of the scratch it sums in. */
static size_t dbias_setup(const fg_attn_problem *pb, AttnArgs *a, size_t acc)
{
    const fg_attn_bias *t = &pb->dbias;
    if (!t->data)
        return 0;
    a->dbias = t->data;
    a->dbias_f32 = t->dtype == FG_FP32;
    const int64_t s[4] = {t->stride_b, t->stride_h, t->stride_q, t->stride_k};
    const int64_t full[4] = {pb->B, pb->H, pb->Nq, pb->Nk};
    bool bcast = false;
    for (int x = 0; x < 4; x++) {
        a->dbias_s[x] = s[x];
        bcast = bcast || (s[x] == 0 && full[x] > 1);
    }
    if (!bcast) {
        a->dbias_mode = fg::kDbiasStore;
        return 0;
    }
    if (pb->deterministic) {
        a->dbias_mode = fg::kDbiasPass;
        return 0;
    }
    a->dbias_mode = fg::kDbiasAtomic;
    if (fg_dtype_size(t->dtype) == acc) { /* fp32 for fp32/16/bf16, fp64 for fp64 */
        a->dbias_acc = t->data;
        for (int x = 0; x < 4; x++)
            a->dbias_acc_s[x] = s[x];
        return 0;
    }
    /* A dense scratch of dbias's stored shape (zero strides kept). */
    int64_t n = 1;
    for (int x = 3; x >= 0; x--) {
        a->dbias_acc_s[x] = s[x] ? n : 0;
        n *= s[x] ? full[x] : 1;
    }
    return ((size_t)n * acc + 255) & ~(size_t)255;
}

extern "C" fg_status fg_attn_cuda_backward(const fg_attn_problem *pb,
                                           const fg_attn_tensor *q,
                                           const fg_attn_tensor *k,
                                           const fg_attn_tensor *v,
                                           const fg_attn_tensor *o,
                                           const fg_attn_tensor *dout,
                                           const fg_attn_stats *st,
                                           const fg_attn_tensor *dq,
                                           const fg_attn_tensor *dk,
                                           const fg_attn_tensor *dv)
{
    AttnArgs a;
    size_t limit = 0;
    FG_TRY(base_args(pb, "fg_attention_backward", &a, &limit));
    a.q = operand(pb, q);
    a.k = operand(pb, k);
    a.v = operand(pb, v);
    a.o = operand(pb, o);
    a.dout = operand(pb, dout);
    a.dq = operand(pb, dq);
    a.dk = operand(pb, dk);
    a.dv = operand(pb, dv);
    a.m = st->m;
    a.l = st->l;
    cudaStream_t s = (cudaStream_t)pb->stream;
    const size_t acc = pb->dtype == FG_FP64 ? sizeof(double) : sizeof(float);
    const size_t rows = (size_t)fg::stat_rows(a);
    /* D, then the dQ accumulator at a 256-byte boundary (vector atomics). */
    const size_t d_bytes = (acc * rows + 255) & ~(size_t)255;
    /* fp16/bf16 on Hopper (the wgmma path): lse2 and D padded to a
     * multiple of 128 rows (the wide d = 64 kernels step 128 queries; 320
     * for the 80-query d = 128 kernel: attn_bwd_wgmma_nq_pad), and dQ
     * accumulated in 64- or 80-row tiles of the padded head dim; a packed
     * batch pads every sequence to the longest (Nq). */
    const bool hopper = (pb->dtype == FG_FP16 || pb->dtype == FG_BF16) && fg::wgmma_usable();
    const int64_t nq_pad = fg::attn_bwd_wgmma_nq_pad(a);
    const size_t pad_bytes =
        hopper ? (2 * sizeof(float) * (size_t)(pb->B * pb->H * nq_pad) + 255) & ~(size_t)255 : 0;
    /* Deterministic mode writes dQ directly (no accumulator), except on
     * the wgmma path without a block mask, which sums the tiled
     * accumulator in a fixed order with eight turn counters per 64-query
     * tile (attn_bwd_wgmma.cuh: dq_writer, at d = 256 dq_add_split). */
    const bool det_tiles = hopper && pb->deterministic && pb->d <= 256 && !pb->sparse;
    size_t dq_bytes = pb->deterministic && !det_tiles ? 0 : acc * rows * (size_t)pb->d;
    size_t sem_bytes = 0;
    /* Copies of the dQ accumulator (AttnArgs::dq_copies) shorten each
     * tile's chain of turns: two were the default from session 18 (H200,
     * d = 128, N = 8k, deterministic / default 0.82-0.84 -> 0.90-0.91). With
     * the rotated walks of the unmasked kernels and the wide d = 64 writers
     * (session 38, H200, bench/compare_det.py) one was faster in 16 of 18
     * cells of two runs, causal included: 0.84-1.07 of the default
     * backward against 0.81-1.09 with two. FG_ATTN_DET_COPIES=1, 2 or 4
     * overrides. */
    int copies = 1;
    static const char *const kCopies[] = {"1", "2", "4"};
    if (det_tiles)
        for (const char *c : kCopies)
            if (fg::env_is("FG_ATTN_DET_COPIES", c))
                copies = c[0] - '0';
    if (hopper && dq_bytes) { /* either layout: the kernel is chosen later */
        const size_t tiled = sizeof(float) * (size_t)(pb->B * pb->H * nq_pad) *
                             (size_t)fg::attn_bwd_wgmma_dpad((int)pb->d) * (size_t)copies;
        dq_bytes = tiled > dq_bytes ? tiled : dq_bytes;
        if (det_tiles)
            sem_bytes = (8 * sizeof(int) * (size_t)(pb->B * pb->H * (nq_pad / 64)) * (size_t)copies +
                         sizeof(int) /* the give-up flag */ + 255) & ~(size_t)255;
        dq_bytes += sem_bytes; /* the counters after the accumulator, zeroed with it */
    }
    const size_t bias_bytes = dbias_setup(pb, &a, acc);
    /* Never 0 (an empty packed batch): allocators may refuse it. */
    const size_t need = d_bytes + dq_bytes + pad_bytes + bias_bytes;
    const size_t bytes = need ? need : 256;
    void *ws = nullptr;
    /* On the context stream (the autograd path) the caching allocator
     * serves the workspace, so a training step allocates nothing once
     * warm; other streams get stream-ordered pool memory. */
    const bool cached = s == fg_cuda_stream();
    if (cached)
        FG_TRY(fg_cuda_mem_alloc(bytes, &ws));
    else
        FG_CUDA_TRY(cudaMallocAsync(&ws, bytes, s));
    a.D = ws;
    a.dq_acc = (char *)ws + d_bytes;
    if (sem_bytes) {
        a.dq_sem = (int *)((char *)ws + d_bytes + dq_bytes - sem_bytes);
        a.dq_copies = copies;
    }
    if (pad_bytes) {
        a.nq_pad = nq_pad;
        a.lse2p = (char *)ws + d_bytes + dq_bytes;
        a.Dp = (float *)a.lse2p + (size_t)(pb->B * pb->H * nq_pad);
    }
    if (bias_bytes)
        a.dbias_acc = (char *)ws + d_bytes + dq_bytes + pad_bytes;
    /* dq_acc is zeroed by launch_bwd: with the padded stats on the wgmma
     * path, else by a memset */
    a.dq_zero = dq_bytes;
    cudaError_t e = bias_bytes ? cudaMemsetAsync(a.dbias_acc, 0, bias_bytes, s) : cudaSuccess;
    fg_status status = FG_OK;
    if (e != cudaSuccess)
        status = fg_cuda_status(e, "cudaMemsetAsync", __FILE__, __LINE__);
    else
        status = fg::attn_bwd_dispatch(pb->dtype, a, limit, s);
    if (cached) {
        fg_cuda_mem_free(ws, bytes);
        return status;
    }
    e = cudaFreeAsync(ws, s);
    if (e != cudaSuccess && status == FG_OK)
        status = fg_cuda_status(e, "cudaFreeAsync", __FILE__, __LINE__);
    return status;
}

extern "C" fg_status fg_attn_cuda_read_ints(int32_t *host, const int32_t *dev,
                                            int64_t n, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    FG_CUDA_TRY(cudaMemcpyAsync(host, dev, sizeof(int32_t) * (size_t)n,
                                cudaMemcpyDeviceToHost, s));
    FG_CUDA_TRY(cudaStreamSynchronize(s));
    return FG_OK;
}
