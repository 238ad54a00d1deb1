/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_traits.cuh - dtype dispatch, tile shapes and the kernel
 * argument block shared by the CUDA attention kernels (forward and
 * backward). One place decides the tile sizes and the accumulator type of
 * every dtype, so a faster mainloop can replace the general one without
 * touching the launch code.
 *
 * The general kernels here are "correct and complete" FlashAttention: all
 * dtypes, any head_dim in [8, 256] (multiple of 8), any sequence length,
 * strides, GQA, causal and dropout, with fp32 accumulation for fp16/bf16 and
 * fp32, fp64 for fp64. Arithmetic is plain FMA through shared memory. */
#ifndef FG_KERNELS_ATTN_TRAITS_CUH
#define FG_KERNELS_ATTN_TRAITS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/attention/attention_internal.h"
#include "lib/core/error.h"

namespace fg {

/* Is environment switch `name` set to `value`? The kernels' switches for
 * tests and measurements (doc: fg_cuda(3)), read at each call so that a
 * test or an in-process comparison can flip them between calls. */
inline bool env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

/* ---- dtype traits: storage type T, accumulator type A ------------------ */
template <typename T> struct AccOf {
    typedef float type;
    static constexpr bool is_bf16 = false;
};
template <> struct AccOf<double> {
    typedef double type;
    static constexpr bool is_bf16 = false;
};
template <> struct AccOf<__nv_bfloat16> {
    typedef float type;
    static constexpr bool is_bf16 = true;
};

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_acc(float x);
template <typename T> __device__ __forceinline__ T from_acc(double x);
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* Two floats -> one register of two 16-bit values (lo in the low half). */
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The inverse: one register of two 16-bit values -> (lo, hi) as floats. */
template <typename T> __device__ __forceinline__ float2 unpack2(uint32_t v);
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v));
}
template <> __device__ __forceinline__ float2 unpack2<__half>(uint32_t v)
{
    return __half22float2(*reinterpret_cast<const __half2 *>(&v));
}

__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
__device__ __forceinline__ double fast_exp(double x) { return exp(x); }

/* ---- kernel arguments -------------------------------------------------- */
/* A strided [B, S, heads, d] operand on the device (element strides). */
struct Operand {
    void *ptr;
    int64_t sb, ss, sh;
};

struct AttnArgs {
    Operand q, k, v, o, dout, dq, dk, dv;
    void *m, *l;          /* [B, H, Nq] stats, accumulator type */
    void *D;              /* [B, H, Nq] rowsum(dO * O), backward */
    /* wgmma backward only: lse2 = log2 of the softmax normaliser and D,
     * float [B*H][nq_pad] with rows padded to a multiple of 128, or 320
     * (attn_bwd_wgmma_nq_pad; +inf / 0), so every 64-, 80- or 128-query
     * block is one aligned bulk copy. */
    void *lse2p, *Dp;
    int64_t nq_pad;
    void *dq_acc;         /* [B, H, Nq, d] dQ accumulator, backward */
    size_t dq_zero;       /* bytes of dq_acc (and dq_sem) launch_bwd zeroes */
    /* 0: dq_acc is row-major [B, H, Nq, d]. D (64/128/256, the wgmma
     * backward): per (b, h), nq_pad / 64 tiles of 64 x D floats in the
     * wgmma accumulator order (dq_tiled_index), so each warp's share of a
     * tile is one contiguous run for a bulk reduce; it holds dS K without
     * the softmax scale, which attn_bwd_write_dq* applies to each sum. */
    int dq_tile_d;
    /* With dq_tile_d: the query rows of a tile, 64, or 80 for the 80-query
     * d = 128 kernel, whose tiles hold dQ^T (dq_t80_index). */
    int dq_tile_q;
    /* The deterministic wgmma backward (no block mask): eight turn counters
     * per (b, h, 64-query tile) of dq_acc and copy, then a give-up flag
     * (turn_wait), zeroed; NULL otherwise. */
    int *dq_sem;
    /* Copies of the tiled dq_acc (0 or 1: one), one after the other: the
     * deterministic backward adds key block kb into copy kb % copies, so
     * each tile's chain of turns is that many times shorter, and
     * attn_bwd_write_dq* sums the copies in order. */
    int dq_copies;
    /* The deterministic wgmma backward without a mask (kMode 0): key block
     * kb walks the query steps from step kb on, cyclically, and each dQ
     * tile's turns follow the order in which the blocks reach it (set by
     * the launch when a head's key blocks can all run at once). */
    int dq_rotate;
    /* The split-d (d = 256) deterministic turns (attn_bwd_wgmma.cuh,
     * dq_add_early): bit 0 a relaxed pass and poll, bit 1 the pass and a
     * first poll while the dQ product runs; 3 unless
     * FG_ATTN_DET_SPLIT_TURNS=0|1|2 (comparisons). */
    int dq_split_turns;
    /* The wgmma kernels' outputs through shared memory in 16-byte stores
     * (wgmma_epilogue.cuh): O in the forward, dK and dV in the backward
     * (every head dim); the dispatch sets them where every output row
     * starts 16-byte aligned, unless FG_ATTN_FWD_EPI=0 / FG_ATTN_BWD_EPI=0. */
    int o_staged, dkv_staged;
    int B, Nq, Nk, H, Hk, d, group;
    int64_t shift;        /* i' = i + shift (Nk - Nq bottom-right, 0 top-left) */
    int causal;           /* plain causal: the fast kernels' kCausal */
    /* Masks and score modifiers (attention.h; fg_attn_problem): key j is
     * visible to query i iff win_lo <= j - i' <= win_hi when band is set,
     * and its 128-block is listed when sparse. variant = anything beyond
     * plain/causal attention: the fast kernels' kMode = 2 instantiations. */
    int band, variant;
    int64_t win_lo, win_hi;
    float softcap;        /* 0 = off */
    double softcap_d;     /* the same in full precision (fp64 general path) */
    const float *alibi;   /* NULL = off; slope of (b, h) = alibi[b*alibi_sb + h] */
    int64_t alibi_sb;
    int sparse;
    int bm_b, bm_h, nqb, nkb; /* block-mask extents (1 = broadcast) */
    const int32_t *kv_count, *kv_index, *q_count, *q_index;
    double scale;
    int dropout;
    uint32_t keep_threshold;
    double keep_scale;
    uint64_t seed, offset;
    int Br, Bc;           /* tile rows (queries) and columns (keys) */
    int deterministic;    /* backward: dQ by attn_bwd_dq_kernel, no atomics */
    /* Packed batches and key padding (fg_attn_problem), device arrays;
     * NULL = dense / none. The general kernels and the wgmma forward's
     * kMode 3 read them: seq_args()
     * turns these arguments into sequence b's. Nq and Nk are then the
     * longest sequence (the grid), total_q/k the packed rows. */
    const int32_t *cu_q, *cu_k, *seqused_k;
    int64_t total_q, total_k;
    int top_left;         /* the per-sequence shift is 0, not nk - nq */
    /* Stats, D and dq_acc rows: (b, h, i) at b * st_b + h * st_h + i
     * ([B, H, Nq] dense, [H, total_q] packed; dq_acc times d). */
    int64_t st_b, st_h;
    /* Additive bias (NULL = none; attention.h) and its gradient: element
     * (b, h, i, j) at b s[0] + h s[1] + i s[2] + j s[3] (elements; a zero
     * stride broadcasts). *_f32: stored as float, else in the operands'
     * dtype. */
    const void *bias;
    int bias_f32;
    int64_t bias_s[4];
    void *dbias;
    int dbias_f32;
    int64_t dbias_s[4];
    /* How the backward produces dbias (attn_bias.cu): */
    int dbias_mode;
    void *dbias_acc;      /* mode 2: accumulator-type target of the atomics */
    int64_t dbias_acc_s[4];
};

enum {
    kDbiasNone = 0,
    kDbiasStore = 1,  /* nothing broadcast: the main kernel stores dS */
    kDbiasAtomic = 2, /* atomics into dbias_acc (dbias itself or scratch) */
    kDbiasPass = 3    /* deterministic: attn_bwd_dbias_kernel sums in order */
};

/* Rows of the stats, D and dq_acc: [B, H, Nq] dense, [H, total_q] packed. */
__host__ __device__ __forceinline__ int64_t stat_rows(const AttnArgs &a)
{
    return a.cu_q ? (int64_t)a.H * a.total_q : (int64_t)a.B * a.H * a.Nq;
}

/* Threads per block of the general kernels. */
constexpr int kThreads = 128;

/* Shared-memory bytes of the general kernels for tile sizes (Br, Bc). Rows
 * of K, V, Q and dO tiles are padded by one element so the column-parallel
 * dot products hit distinct banks. */
inline size_t fwd_smem_bytes(int Br, int Bc, int d, size_t acc_size)
{
    size_t n = (size_t)Br * d            /* Q_i */
             + (size_t)Bc * (d + 1)      /* K_j */
             + (size_t)Bc * d            /* V_j */
             + (size_t)Br * Bc           /* S / P */
             + (size_t)Br * d            /* O accumulator */
             + 3 * (size_t)Br;           /* m, l, alpha */
    return n * acc_size;
}

/* The backward kernels keep the softcap's 1 - tanh^2 in one more [Br, Bc]
 * tile when softcap is on (ncap = 1). */
inline size_t bwd_dq_smem_bytes(int Br, int Bc, int d, size_t acc_size,
                                int ncap)
{
    size_t n = 2 * (size_t)Br * (d + 1)  /* Q_i, dO_i */
             + 2 * (size_t)Bc * (d + 1)  /* K_j, V_j */
             + (2 + ncap) * (size_t)Br * Bc /* P, dP -> dS (, dcap) */
             + (size_t)Br * d            /* dQ accumulator */
             + 3 * (size_t)Br;           /* m, l, D */
    return n * acc_size;
}

inline size_t bwd_smem_bytes(int Br, int Bc, int d, size_t acc_size, int ncap)
{
    size_t n = 2 * (size_t)Bc * (d + 1)  /* K_j, V_j */
             + 2 * (size_t)Bc * d        /* dK_j, dV_j accumulators */
             + 2 * (size_t)Br * (d + 1)  /* Q_i, dO_i */
             + (3 + ncap) * (size_t)Br * Bc /* P, dP -> dS, P with dropout (, dcap) */
             + 3 * (size_t)Br;           /* m, l, D */
    return n * acc_size;
}

/* attn_bwd_dbias_kernel: Q_i, dO_i, K_j, V_j, P, dS, the dbias tile
 * (, dcap), m, l, D. */
inline size_t bwd_dbias_smem_bytes(int Br, int Bc, int d, size_t acc_size,
                                   int ncap)
{
    size_t n = 2 * (size_t)Br * (d + 1) + 2 * (size_t)Bc * (d + 1) +
               (3 + ncap) * (size_t)Br * Bc + 3 * (size_t)Br;
    return n * acc_size;
}

/* Largest square tile in {64, 32, 16, 8} whose shared memory fits both the
 * device limit and a budget that leaves room for two blocks per SM. */
template <typename F>
inline int pick_tile(F bytes_for, size_t limit)
{
    const size_t budget = limit < 113 * 1024 ? limit : 113 * 1024;
    for (int t = 64; t >= 8; t /= 2)
        if (bytes_for(t) <= budget)
            return t;
    return bytes_for(8) <= limit ? 8 : 0;
}

/* The backward's pick_tile, or FG_ERR_UNSUPPORTED naming the kernel
 * (`what`) when not even 8 x 8 tiles fit. */
template <typename F>
inline fg_status pick_bwd_tile(F bytes_for, size_t limit, int d, const char *what,
                               int *tile)
{
    *tile = pick_tile(bytes_for, limit);
    if (*tile == 0)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "fg_attention_backward: head_dim %d needs more shared "
                        "memory than this GPU has (%s)",
                        d, what);
    return FG_OK;
}

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_TRAITS_CUH */
