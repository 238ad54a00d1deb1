/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_common.cuh - device pieces shared by the forward and
 * backward kernels: strided operands, the grid order, packed batches, the
 * band and the score modifiers (softcap, ALiBi, bias), the dQ tile layout;
 * and, through the two headers included at its end, the tiles a block
 * visits (attn_walk.cuh) and dropout (attn_dropout.cuh). */
#ifndef FG_KERNELS_ATTN_COMMON_CUH
#define FG_KERNELS_ATTN_COMMON_CUH

#include <stdlib.h>

#include "attn_traits.cuh"
#include "kernels/runtime/cuda_check.h"

namespace fg {

/* 16-byte accesses of a 2-byte operand (the callers' sizeof(T) == 2): the
 * base and every stride a multiple of 8 elements (rows then start 16-byte
 * aligned). */
__host__ __forceinline__ bool vec16_ok(const Operand &t)
{
    return ((uintptr_t)t.ptr & 15) == 0 && t.sb % 8 == 0 && t.ss % 8 == 0 && t.sh % 8 == 0;
}

template <typename T>
__device__ __forceinline__ T *elem(const Operand &t, int64_t b, int64_t s,
                                   int64_t h)
{
    return (T *)t.ptr + b * t.sb + s * t.ss + h * t.sh;
}

/* Load rows s0 .. s0+rows-1 of head h into a [rows, ld] tile of A; rows at
 * or past `valid` are zero-filled so padded lanes compute harmless zeros. */
template <typename T, typename A>
__device__ __forceinline__ void load_tile(A *dst, int ld, const Operand &t,
                                          int64_t b, int64_t s0, int64_t h,
                                          int rows, int valid, int d)
{
    for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
        const int r = idx / d, x = idx - r * d;
        dst[r * ld + x] = r < valid ? to_acc(elem<T>(t, b, s0 + r, h)[x]) : A(0);
    }
}

/* ---- the order of a masked grid's blocks --------------------------------- */

/* Longest first. Under a causal mask the blocks of one (batch, head)
 * differ in length (at N = 1024 a backward key block visits 8 down to 1
 * query tiles), and in the natural order (block index fastest) the grid's
 * last wave mixes long blocks with short ones: the SMs that drew long ones
 * finish alone. With grid_order g > 0 the (block, batch x head) pairs are
 * dealt in groups of g heads, block index slowest inside a group (each
 * head's block 0, then each one's block 1, ...), so the last blocks to
 * start are short ones; g ~ two waves of blocks keeps a head's blocks
 * near each other in time (their K/V or Q/dO tiles shared in L2).
 * blk, bh: the block index and b * H + h of the (nblk, H, B) grid. */
__device__ __forceinline__ void grid_pos(int g, int *blk, int *bh)
{
    if (g <= 0) {
        *blk = (int)blockIdx.x;
        *bh = (int)(blockIdx.y + gridDim.y * blockIdx.z);
        return;
    }
    /* 32-bit: grid_order gives g > 0 only to grids of < 2^31 blocks */
    const unsigned nblk = gridDim.x, nbh = gridDim.y * gridDim.z;
    const unsigned lin = blockIdx.x + nblk * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned gsz = (unsigned)g * nblk, grp = lin / gsz, r = lin - grp * gsz;
    const unsigned cnt = min((unsigned)g, nbh - grp * (unsigned)g);
    *blk = (int)(r / cnt);
    *bh = (int)(grp * (unsigned)g + r % cnt);
}

/* grid_pos's g for a grid of nblk blocks per (batch, head), resident
 * blocks an SM each: two waves of blocks a group where on (the masked
 * grids of the forward and backward), else 0, the natural order.
 * FG_ATTN_LPT=n forces groups of n everywhere (0: the natural order), for
 * measurements; read at each call, as the other switches, so
 * bench/compare_env.py can A/B it in one process. H200, bf16, against the
 * natural order: the causal backward +1.3% at GPT-2-small's attention,
 * +2% at d = 64 N = 8k, +4% at d = 128 N = 8k with dropout (session 26);
 * the causal forward +7-12% at d = 256 N 2k-8k, +3-4% at d = 128 N 2k-8k,
 * level at d = 64, at N = 16k (session 57; session 26's -2..-5% at
 * d = 128 N = 2k was an older forward) and at d <= 128 N = 1k (+3-8% at
 * d = 256 N = 1k, session 58). Unmasked grids keep the natural order: a
 * head's blocks together share Q_i / dO_i in the L2 (session 59, dense
 * backward in groups of 4 heads to all: level to 2x slower). */
inline fg_status grid_order(int nblk, int nbh, int resident, bool on, int *g)
{
    *g = 0;
    if ((int64_t)nblk * nbh >= ((int64_t)1 << 31))
        return FG_OK; /* grid_pos's arithmetic is 32-bit */
    const char *env = getenv("FG_ATTN_LPT");
    if (env && *env) {
        const int n = atoi(env);
        *g = n < 0 ? 0 : n > 65535 ? 65535 : n;
        return FG_OK;
    }
    if (!on)
        return FG_OK;
    int dev = 0, sms = 0;
    FG_CUDA_TRY(cudaGetDevice(&dev));
    FG_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t w = 2 * (int64_t)sms * resident / (nblk > 0 ? nblk : 1);
    *g = (int)(w < 1 ? 1 : w > 65535 ? 65535 : w);
    return FG_OK;
}

/* ---- packed batches and key padding ------------------------------------ */

/* The first stats (and D, dq_acc) row of (b, h). */
__device__ __forceinline__ int64_t stat_row0(const AttnArgs &a, int64_t b, int64_t h)
{
    return b * a.st_b + h * a.st_h;
}
/* The same where the layout is known at compile time: dense rows
 * [B, H, Nq] as bh Nq (bh = b H + h, which the tuned sm80 kernels have at
 * hand: no stride loads), packed ones (kRagged) by stat_row0. */
template <bool kRagged>
__device__ __forceinline__ int64_t stat_row_of(const AttnArgs &a, int64_t b, int64_t h,
                                               int64_t bh)
{
    return kRagged ? stat_row0(a, b, h) : bh * a.Nq;
}
/* Stats row `row` as (batch, head, query row) for the operands: packed
 * rows are batch 0 (stride_b is 0 then); *owned = false for packed rows
 * past cu_q[B], which belong to no sequence. */
__device__ __forceinline__ void stat_coords(const AttnArgs &a, int64_t row, int64_t *b,
                                            int64_t *h, int64_t *i, bool *owned)
{
    const int64_t per_h = a.cu_q ? a.total_q : a.Nq;
    const int64_t bh = row / per_h;
    *i = row - bh * per_h;
    *b = a.cu_q ? 0 : bh / a.H;
    *h = a.cu_q ? bh : bh % a.H;
    *owned = !a.cu_q || *i < a.cu_q[a.B];
}

template <typename T>
__device__ __forceinline__ void move_rows(Operand &t, int64_t rows)
{
    if (t.ptr)
        t.ptr = (T *)t.ptr + rows * t.ss;
}

/* The wgmma kernels' kModes (attn_{fwd,bwd}_wgmma.cuh) that run a packed
 * or key-padded batch (3, and 7: 3 with masks alone), and those with the
 * score modifiers' code (all but 6 and 7, the variants with masks alone:
 * no softcap, ALiBi or bias). */
__host__ __device__ constexpr bool kmode_ragged(int m) { return m == 3 || m == 7; }
__host__ __device__ constexpr bool kmode_mods(int m) { return m != 6 && m != 7; }

/* Sequence b as a problem of its own (attention.h): Nq = its query rows,
 * Nk = the keys it sees (seqused_k), the causal shift of its own lengths,
 * and operands, stats, D and dq_acc moved to its first packed rows (dense
 * only Nk changes). seq_patch turns a copy of g into that in place (the
 * wgmma backward's copy in shared memory); returns its key rows, padded
 * ones included. */
template <typename T, typename A>
__device__ __forceinline__ int seq_patch(AttnArgs &a, const AttnArgs &g, int64_t b)
{
    if (!g.cu_q && !g.seqused_k)
        return (int)g.Nk;
    int64_t q0 = 0, k0 = 0;
    int nq = g.Nq, nk = g.Nk;
    if (g.cu_q) {
        q0 = g.cu_q[b];
        k0 = g.cu_k[b];
        nq = g.cu_q[b + 1] - (int)q0;
        nk = g.cu_k[b + 1] - (int)k0;
        move_rows<T>(a.q, q0);
        move_rows<T>(a.o, q0);
        move_rows<T>(a.dout, q0);
        move_rows<T>(a.dq, q0);
        move_rows<T>(a.k, k0);
        move_rows<T>(a.v, k0);
        move_rows<T>(a.dk, k0);
        move_rows<T>(a.dv, k0);
        a.m = (A *)g.m + q0;
        a.l = (A *)g.l + q0;
        if (g.D)
            a.D = (A *)g.D + q0;
        if (g.dq_acc)
            a.dq_acc = (A *)g.dq_acc + q0 * g.d;
    }
    a.Nq = nq;
    a.Nk = g.seqused_k ? g.seqused_k[b] : nk;
    a.shift = g.top_left ? 0 : (int64_t)nk - nq;
    return nk;
}
/* The same as a value; *nk_rows = its key rows. */
template <typename T, typename A>
__device__ __forceinline__ AttnArgs seq_args(const AttnArgs &g, int64_t b, int *nk_rows)
{
    AttnArgs a = g;
    *nk_rows = seq_patch<T, A>(a, g, b);
    return a;
}

/* ---- the mask and score-modifier piece (attention.h's variants) -------
 * Every kernel asks these: which keys a query block visits (the band and
 * the block lists), whether one pair is visible, and the final logit. */

/* Pair visibility: the band (causal is win_hi = 0); the block mask is
 * applied by the block walk, whose tiles never straddle a 128-block. */
__device__ __forceinline__ bool visible(const AttnArgs &a, int64_t i, int64_t j)
{
    if (j >= a.Nk)
        return false;
    if (a.band) {
        const int64_t t = j - (i + a.shift);
        return t >= a.win_lo && t <= a.win_hi;
    }
    return !a.causal || j <= i + a.shift;
}

__host__ __device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : (x > hi ? hi : x);
}
/* Without a band: row i sees column col of the key block at j0 iff col <
 * this limit (keys past Nk, and past i + shift when causal), in [0, bc].
 * The forwards' masks compare each element's column against it: one
 * 32-bit compare instead of 64-bit index compares. */
__device__ __forceinline__ int row_key_limit(const AttnArgs &a, bool causal, int64_t i,
                                             int64_t j0, int bc)
{
    int64_t l = a.Nk - j0;
    if (causal)
        l = min(l, i + a.shift - j0 + 1);
    return (int)max((int64_t)0, min(l, (int64_t)bc));
}
/* Keys [begin, end) that query rows i0 .. i1 may see through the band, and
 * query rows [begin, end) that may see keys j0 .. j1. */
__device__ __forceinline__ int64_t band_key_begin(const AttnArgs &a, int64_t i0)
{
    return a.band ? clamp64(i0 + a.shift + a.win_lo, 0, a.Nk) : 0;
}
__device__ __forceinline__ int64_t band_key_end(const AttnArgs &a, int64_t i1)
{
    if (a.band)
        return clamp64(i1 + a.shift + a.win_hi + 1, 0, a.Nk);
    return a.causal ? clamp64(i1 + a.shift + 1, 0, a.Nk) : a.Nk;
}
__device__ __forceinline__ int64_t band_query_begin(const AttnArgs &a, int64_t j0)
{
    if (a.band)
        return clamp64(j0 - a.shift - a.win_hi, 0, a.Nq);
    return a.causal ? clamp64(j0 - a.shift, 0, a.Nq) : 0;
}
__device__ __forceinline__ int64_t band_query_end(const AttnArgs &a, int64_t j1)
{
    return a.band ? clamp64(j1 - a.shift - a.win_lo + 1, 0, a.Nq) : a.Nq;
}

/* tanh on the special-function unit (rel. error ~2^-11, below fp16/bf16
 * output rounding): the softcap of the fp16/bf16 kernels. */
__device__ __forceinline__ float tanh_fast(float x)
{
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* 2^x on the special-function unit, subnormal results flushed to zero
 * (ex2.approx.ftz): exp2f's ex2.approx.f32 keeps them with a compare and
 * two predicated multiplies around MUFU.EX2 (sm_90), three more issued
 * instructions for every probability (ncu: the wgmma backward ran 5 FP32
 * instructions per score where its formulas need 3). A probability below
 * 2^-126 is far below any output's resolution: P <= 1, and a row's sum
 * is >= 1 in the forward. Same relative error as exp2f otherwise. */
__device__ __forceinline__ float exp2_fast(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The fast kernels keep raw scores q.k (the scale is folded into exp2):
 * the variants' final logit of pair (i, j), back in raw units. kPrecise:
 * tanhf for the softcap (the TF32 kernels). */
template <bool kPrecise = false>
__device__ __forceinline__ float raw_score_mod(const AttnArgs &a, float s, float slope,
                                               int64_t i, int64_t j)
{
    float x = s * (float)a.scale;
    if (a.softcap > 0.f) {
        const float y = x * (1.f / a.softcap);
        x = a.softcap * (kPrecise ? tanhf(y) : tanh_fast(y));
    }
    if (a.alibi) /* i - j fits 32 bits (both < 2^31) */
        x -= slope * fabsf((float)(int)(i - j) + (float)a.shift);
    return x * (float)(1.0 / a.scale);
}

/* The softcap's d logit / d x = 1 - tanh^2 of pair (i, j), recovered from
 * its probability p = exp2(logit log2e - lse2) (the backward keeps P, not
 * the logit) by undoing ALiBi; 0 where p = 0, whose dS is 0 anyway. (With
 * a bias, attn_bwd_wgmma.cuh's kMode 4 undoes it in its own cap_grad, and
 * the sm80 kernels' bwd_elem takes tanh of the score again.) */
__device__ __forceinline__ float softcap_grad(const AttnArgs &a, float p, float lse2,
                                              float slope, int64_t i, int64_t j)
{
    if (!(p > 0.f))
        return 0.f;
    float x = (__log2f(p) + lse2) * 0.6931471805599453f;
    if (a.alibi)
        x += slope * fabsf((float)(int)(i - j) + (float)a.shift);
    const float t = x * (1.f / a.softcap);
    return 1.f - t * t;
}

/* The final logit of a visible pair from x = scale * q.k: softcap, then
 * ALiBi (attention.h); *dcap = 1 - tanh^2 (d logit / dx) if asked. */
template <typename A>
__device__ __forceinline__ A score_mod(const AttnArgs &a, A x, A slope,
                                       int64_t i, int64_t j, A *dcap)
{
    if (a.softcap > 0.f) {
        const A cap = (A)a.softcap_d; /* a float cap would cost fp64 ~1e-8 */
        const A t = tanh(x / cap);
        x = cap * t;
        if (dcap)
            *dcap = A(1) - t * t;
    }
    if (a.alibi) {
        const int64_t dist = i + a.shift - j;
        x -= slope * (A)(dist < 0 ? -dist : dist);
    }
    return x;
}
/* bias[b, h, i, j] in the accumulator type (the caller knows the pair is
 * inside the problem). */
template <typename T, typename A>
__device__ __forceinline__ A bias_at(const AttnArgs &a, int64_t b, int64_t h,
                                     int64_t i, int64_t j)
{
    const int64_t off = b * a.bias_s[0] + h * a.bias_s[1] + i * a.bias_s[2] +
                        j * a.bias_s[3];
    return a.bias_f32 ? (A)((const float *)a.bias)[off]
                      : (A)to_acc(((const T *)a.bias)[off]);
}

/* dbias of a visible pair (b, h, i, j) inside the problem gets its dS:
 * stored (kDbiasStore: nothing broadcast, one pair an element) or added
 * (kDbiasAtomic) into dbias_acc, of the accumulator type (attn_bias.cu). */
template <typename T, typename A>
__device__ __forceinline__ void dbias_put_pair(const AttnArgs &a, int64_t b, int64_t h,
                                               int64_t i, int64_t j, A ds)
{
    if (a.dbias_mode == kDbiasStore) {
        const int64_t off = b * a.dbias_s[0] + h * a.dbias_s[1] + i * a.dbias_s[2] +
                            j * a.dbias_s[3];
        if (a.dbias_f32)
            ((float *)a.dbias)[off] = (float)ds;
        else
            ((T *)a.dbias)[off] = from_acc<T>(ds);
        return;
    }
    const int64_t off = b * a.dbias_acc_s[0] + h * a.dbias_acc_s[1] +
                        i * a.dbias_acc_s[2] + j * a.dbias_acc_s[3];
    atomicAdd((A *)a.dbias_acc + off, ds);
}

template <typename A>
__device__ __forceinline__ A alibi_slope(const AttnArgs &a, int64_t b, int64_t h)
{
    return a.alibi ? (A)a.alibi[b * a.alibi_sb + h] : A(0);
}

/* The row max of the tensor-core kernels: one instruction like fmaxf, but
 * a NaN wins (PTX max.NaN, sm_80+), so a NaN score makes its row NaN
 * instead of looking like a masked row. */
__device__ __forceinline__ float fmax_nan(float x, float y)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
    return r;
#else
    return (x != x || x > y) ? x : y;
#endif
}

/* max that lets a NaN win, so a NaN score makes its row NaN instead of
 * looking like a masked row (fmax would drop it). */
template <typename A>
__device__ __forceinline__ A max_nan(A x, A y)
{
    return (x != x || x > y) ? x : y;
}

/* Float index of dQ element (bh, query i, column x) in the tiled dq_acc
 * layout of the wgmma backward (AttnArgs::dq_tile_d = D): tile i / 64 of
 * 64 x D; inside it, warp w of warpgroup g (rows 16w..16w+15, columns
 * g D/2 .. g D/2 + D/2 - 1) owns run 4g + w of 16 D/2 floats, where lane
 * (4 row%8 + col%8/2) keeps its fragment n = col%(D/2)/8 as 4 floats
 * (row%16/8, col%2). */
__host__ __device__ __forceinline__ int64_t dq_tiled_index(int64_t bh, int64_t nq_pad,
                                                           int D, int64_t i, int x)
{
    const int DQ = D / 2, ir = (int)(i & 63), cc = x % DQ;
    const int run = (x / DQ) * 4 + (ir >> 4), lane = (ir & 7) * 4 + ((cc >> 1) & 3);
    return (bh * nq_pad + (i & ~(int64_t)63)) * D + (int64_t)run * DQ * 16 +
           ((cc >> 3) * 32 + lane) * 4 + ((ir >> 3) & 1) * 2 + (cc & 1);
}

/* The same for the 80-query transposed tiles of the d = 128 kernel
 * (AttnArgs::dq_tile_q = 80, kQ80): tile i / 80 of 80 x D floats; inside
 * it, warp w of warpgroup g (d rows 64g + 16w .. + 15 of dQ^T) owns run
 * 4g + w = x / 16 of 16 x 80 floats, where lane (4 (x % 8) + (i % 8) / 2)
 * keeps its fragment n = (i % 80) / 8 as 4 floats ((x % 16) / 8, i % 2). */
__host__ __device__ __forceinline__ int64_t dq_t80_index(int64_t bh, int64_t nq_pad, int D,
                                                         int64_t i, int x)
{
    const int ir = (int)(i % 80), lane = (x & 7) * 4 + ((ir & 7) >> 1);
    return (bh * nq_pad + (i - ir)) * D + (int64_t)(x >> 4) * 16 * 80 +
           ((ir >> 3) * 32 + lane) * 4 + ((x >> 3) & 1) * 2 + (ir & 1);
}

/* log2 of row (bh, i)'s softmax normaliser from the forward's m and l;
 * +inf for a row that saw no key, so exp2(s - lse2) = 0. */
__device__ __forceinline__ float stat_lse2(const AttnArgs &a, int64_t row)
{
    const float l = ((const float *)a.l)[row];
    const float m = ((const float *)a.m)[row];
    return l != 0.f ? m * 1.4426950408889634f + __log2f(l) : INFINITY;
}
__device__ __forceinline__ float row_lse2(const AttnArgs &a, int64_t bh, int64_t i)
{
    return stat_lse2(a, bh * a.Nq + i);
}

/* The sequence that packed row r (< cu[B]) belongs to: the last b with
 * cu[b] <= r (empty sequences skipped), by bisection. */
__device__ __forceinline__ int64_t packed_seq(const int32_t *cu, int B, int64_t r)
{
    int lo = 0, hi = B; /* cu[lo] <= r < cu[hi] */
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (cu[mid] <= r)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

} /* namespace fg */

/* the pieces that build on the ones above */
#include "attn_dropout.cuh"
#include "attn_walk.cuh"

#endif /* FG_KERNELS_ATTN_COMMON_CUH */
