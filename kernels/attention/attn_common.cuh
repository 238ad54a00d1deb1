/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_common.cuh - device pieces shared by the forward and backward
 * kernels: strided tile loads/stores, the causal mask, and dropout (Philox4x32-7
 * with the counter/key mapping of lib/core/dropout_map.h, the same code the CPU
 * runs). */
#ifndef FG_KERNELS_ATTN_COMMON_CUH
#define FG_KERNELS_ATTN_COMMON_CUH

#include <stdlib.h>

#include "attn_traits.cuh"
#include "kernels/runtime/cuda_check.h"
#include "lib/core/dropout_map.h"

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
 * backward), else 0, the natural order. FG_ATTN_LPT=n forces groups of n
 * everywhere (0: the natural order), for measurements. H200, bf16, LPT
 * against the natural order, one round: the causal backward +1.3% at
 * GPT-2-small's attention (d = 64, N = 1024, 16 x 12 heads, dropout 0.1),
 * +2% at d = 64 N = 8k, +4% at d = 128 N = 8k with dropout; the forward
 * +1.7%, +1.4%, +4% there but -2..-5% at d = 128 N = 2k, so it stays in
 * its natural order (longest first only inside each head's run). */
inline fg_status grid_order(int nblk, int nbh, int resident, bool on, int *g)
{
    *g = 0;
    if ((int64_t)nblk * nbh >= ((int64_t)1 << 31))
        return FG_OK; /* grid_pos's arithmetic is 32-bit */
    static const int env = [] {
        const char *v = getenv("FG_ATTN_LPT");
        return v && *v ? atoi(v) : -1;
    }();
    if (env >= 0) {
        *g = env;
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

/* The block lists of (b, h): key blocks of query block qb (kv) or query
 * blocks of key block kb (!kv); *n = their count (0 if sparse is off). */
__device__ __forceinline__ const int32_t *block_list(const AttnArgs &a, bool kv,
                                                     int64_t b, int64_t h,
                                                     int64_t blk, int *n)
{
    const int64_t bh = (a.bm_b > 1 ? b : 0) * a.bm_h + (a.bm_h > 1 ? h : 0);
    const int64_t rows = kv ? a.nqb : a.nkb, len = kv ? a.nkb : a.nqb;
    const int64_t r = bh * rows + blk;
    *n = (kv ? a.kv_count : a.q_count)[r];
    return (kv ? a.kv_index : a.q_index) + r * len;
}

/* Span sp of the walk over [lo, hi): the whole range, or with a block list
 * its sp-th listed 128-block cut to the range; the start is rounded down
 * to a multiple of `align` (the tile, so dropout's 32-column calls and
 * tile-aligned loads hold; visible() masks the extra columns). Returns
 * false for an empty span or a list entry outside [0, nblocks) (the
 * validation cannot read device lists; such entries are skipped). */
__device__ __forceinline__ bool walk_span(const int32_t *list, int n_list,
                                          int nblocks, int sp, int64_t lo,
                                          int64_t hi, int align, int64_t *s_lo,
                                          int64_t *s_hi)
{
    if (list) {
        if (sp >= n_list)
            return false;
        const int32_t blk = list[sp];
        if (blk < 0 || blk >= nblocks)
            return false;
        const int64_t a0 = (int64_t)blk * FG_ATTN_SPARSE_BLOCK;
        lo = max(lo, a0);
        hi = min(hi, a0 + FG_ATTN_SPARSE_BLOCK);
    }
    *s_lo = lo - lo % align;
    *s_hi = hi;
    return hi > lo;
}

/* The fast kernels' block walk (kMasked instantiations): block k of a
 * query block's key walk, or of a key block's query walk, starts at
 * start(k). Dense: consecutive blocks from the band's first; sparse: the
 * `per` sub-blocks of each listed 128-block. A list entry outside the mask
 * (the validation cannot read device lists) is a dead block: it starts at
 * 0, so every address stays in bounds, and the kernel masks all of it. */
struct BlockWalk {
    int64_t first;
    int n;              /* blocks to visit */
    const int32_t *list;
    int per, nblk, blk; /* sub-blocks per 128-block, list range, block size */
    int64_t limit;      /* the sequence length: sub-blocks at or past it
                           (the tail of the last 128-block) are dead too */
    __device__ __forceinline__ int64_t raw(int k) const
    {
        const int32_t e = list[k / per];
        if (e < 0 || e >= nblk)
            return -1;
        const int64_t s = (int64_t)e * FG_ATTN_SPARSE_BLOCK + (int64_t)(k % per) * blk;
        return s < limit ? s : -1;
    }
    __device__ __forceinline__ int64_t start(int k) const
    {
        if (!list)
            return (first + k) * blk;
        const int64_t s = raw(k);
        return s < 0 ? 0 : s;
    }
    __device__ __forceinline__ bool dead(int k) const { return list && raw(k) < 0; }
};

/* Key walk of query rows i0 .. i0+rows-1 of (b, h) with Bc-key blocks. */
__device__ __forceinline__ BlockWalk key_walk(const AttnArgs &a, int64_t b, int64_t h,
                                              int64_t i0, int rows, int Bc)
{
    BlockWalk w;
    w.blk = Bc;
    w.list = nullptr;
    w.first = 0;
    w.per = FG_ATTN_SPARSE_BLOCK / Bc;
    w.nblk = a.nkb;
    w.limit = a.Nk;
    if (a.sparse) {
        int n;
        w.list = block_list(a, true, b, h, i0 / FG_ATTN_SPARSE_BLOCK, &n);
        w.n = n * w.per;
        return w;
    }
    const int64_t lo = band_key_begin(a, i0), hi = band_key_end(a, i0 + rows - 1);
    w.first = lo / Bc;
    w.n = hi > lo ? (int)((hi + Bc - 1) / Bc - w.first) : 0;
    return w;
}

/* Query walk of keys j0 .. j0+cols-1 for query head h with Br-row blocks. */
__device__ __forceinline__ BlockWalk query_walk(const AttnArgs &a, int64_t b, int64_t h,
                                                int64_t j0, int cols, int Br)
{
    BlockWalk w;
    w.blk = Br;
    w.list = nullptr;
    w.first = 0;
    w.per = FG_ATTN_SPARSE_BLOCK / Br;
    w.nblk = a.nqb;
    w.limit = a.Nq;
    if (a.sparse) {
        int n;
        w.list = block_list(a, false, b, h, j0 / FG_ATTN_SPARSE_BLOCK, &n);
        w.n = n * w.per;
        return w;
    }
    const int64_t lo = band_query_begin(a, j0), hi = band_query_end(a, j0 + cols - 1);
    w.first = lo / Br;
    w.n = hi > lo ? (int)((hi + Br - 1) / Br - w.first) : 0;
    return w;
}

/* The fast kernels' per-element mask, in 32-bit offsets: the keys row r
 * sees, relative to j0 (band_cols), or the rows that see key j, relative
 * to i0 (band_rows), as an inclusive range clamped to [-1, len] (empty
 * when x > y). One 64-bit computation per row or key, two integer compares
 * per element. */
__device__ __forceinline__ int2 band_cols(const AttnArgs &a, int64_t r, int64_t j0, int len)
{
    int64_t lo = 0, hi = a.Nk - 1;
    if (a.band) {
        lo = max(lo, r + a.shift + a.win_lo);
        hi = min(hi, r + a.shift + a.win_hi);
    }
    return make_int2((int)clamp64(lo - j0, -1, len), (int)clamp64(hi - j0, -1, len));
}
__device__ __forceinline__ int2 band_rows(const AttnArgs &a, int64_t j, int64_t i0, int len)
{
    if (j >= a.Nk)
        return make_int2(len, -1);
    int64_t lo = 0, hi = a.Nq - 1 + len; /* rows past Nq are harmless */
    if (a.band) {
        lo = max(lo, j - a.shift - a.win_hi);
        hi = min(hi, j - a.shift - a.win_lo);
    }
    return make_int2((int)clamp64(lo - i0, -1, len), (int)clamp64(hi - i0, -1, len));
}

/* True when every pair of rows r0 .. r1 and keys j0 .. j0+Bc-1 is inside
 * the band (no per-element mask needed for it). */
__device__ __forceinline__ bool inside_band(const AttnArgs &a, int64_t r0, int64_t r1,
                                            int64_t j0, int Bc)
{
    if (a.band)
        return j0 - (r1 + a.shift) >= a.win_lo && j0 + Bc - 1 - (r0 + a.shift) <= a.win_hi;
    return !a.causal || j0 + Bc - 1 <= r0 + a.shift;
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

/* The Philox words of the call that holds element (i, j)
 * (lib/core/dropout_map.h). */
__device__ __forceinline__ uint4 dropout_call(const AttnArgs &a, int64_t bh,
                                              int64_t i, int64_t j)
{
    const fg_u32x2 key = {fg_dropout_key_x(a.seed, a.offset),
                          fg_dropout_key_y(a.seed, a.offset)};
    const fg_u32x4 r = fg_dropout_philox({fg_dropout_ctr_x(j), fg_dropout_ctr_y(i),
                                          fg_dropout_ctr_z(bh), fg_dropout_ctr_w(a.offset)},
                                         key);
    return make_uint4(r.x, r.y, r.z, r.w);
}

__device__ __forceinline__ uint32_t dropout_word(const uint4 &w, int k)
{
    return k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
}

/* Dropout on a [rows, cols] tile of probabilities at (i0, j0): every kept
 * entry is scaled by 256/T, every dropped one zeroed. A thread takes one
 * (row, call): the 8 columns 32c + 8n + 2q + e of that row that the call
 * covers (the call's other row, i +- 8, is recomputed by its own thread:
 * simple, and these kernels are not the fast path). If `z` is non-NULL the
 * factor (0 or 256/T) is also written there. */
template <typename A>
__device__ __forceinline__ void apply_dropout(const AttnArgs &a, A *tile,
                                              A *z, int ld, int rows, int cols,
                                              int64_t bh, int64_t i0,
                                              int64_t j0)
{
    const int64_t c0 = j0 >> 5;
    const int calls = (int)(((j0 + cols - 1) >> 5) - c0 + 1) * 4;
    const A ks = (A)a.keep_scale;
    for (int idx = threadIdx.x; idx < rows * calls; idx += blockDim.x) {
        const int r = idx / calls, cq = idx - r * calls;
        const int64_t i = i0 + r, jb = 32 * (c0 + (cq >> 2)) + 2 * (cq & 3);
        const uint4 w = dropout_call(a, bh, i, jb);
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int64_t j = jb + 8 * n + e;
                if (j < j0 || j >= j0 + cols)
                    continue;
                const int col = (int)(j - j0);
                const A f = fg_dropout_keep8(dropout_word(w, fg_dropout_word(j)),
                                             fg_dropout_byte(i, j), a.keep_threshold)
                                ? ks : A(0);
                tile[r * ld + col] *= f;
                if (z)
                    z[r * ld + col] = f;
            }
    }
}

/* Forward tiles (rows as accumulator rows; mma.sync and wgmma layouts):
 * a thread holds rows r0, r0 + 8 (r0 % 16 < 8) and columns 8n + 2 t4 + e.
 * One call covers its 16 elements of columns jc .. jc + 31 (jc % 32 == 0):
 * element (row r0 + 8r, column jc + 8n + 2 t4 + e) is kept iff
 * fwd_kept(w, r, n, e). */
__device__ __forceinline__ uint4 fwd_dropout_call(const AttnArgs &a, int64_t bh, int64_t r0,
                                                  int64_t jc, int t4)
{
    return dropout_call(a, bh, r0, jc + 2 * t4);
}
__device__ __forceinline__ bool fwd_kept(const AttnArgs &a, const uint4 &w, int r, int n, int e)
{
    return fg_dropout_keep8(dropout_word(w, e + 2 * (n >> 1)), r + 2 * (n & 1),
                            a.keep_threshold);
}
/* Calls drop(n, r, e) for every dropped element of that call. */
template <typename F>
__device__ __forceinline__ void fwd_dropout32(const AttnArgs &a, int64_t bh, int64_t r0,
                                              int64_t jc, int t4, F &&drop)
{
    const uint4 w = fwd_dropout_call(a, bh, r0, jc, t4);
#pragma unroll
    for (int n = 0; n < 4; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (!fwd_kept(a, w, r, n, e))
                    drop(n, r, e);
}

/* Transposed tiles (the backward's S^T, keys as accumulator rows): a
 * thread holds keys jw + g and jw + 8 + g (jw % 16 == 0, g = lane / 4) and
 * queries 8m + 2 t4 + e. For the 16 queries ib .. ib + 15 (ib % 16 == 0)
 * its 8 elements are one word of each of two calls (i % 8 = 2 t4 and
 * 2 t4 + 1); the lane of key g ^ 1 (lane ^ 4) needs another word of the
 * same two calls, so each lane draws one call and they swap a word. Bit
 * 4 ih + 2 kh + e of the result: query ib + 8 ih + 2 t4 + e, key
 * jw + g + 8 kh. Every lane of the warp must call it. */
__device__ __forceinline__ uint32_t bwd_dropout_bits_of(const AttnArgs &a, uint32_t w0,
                                                        uint32_t w1, int g);
__device__ __forceinline__ uint32_t bwd_dropout_bits(const AttnArgs &a, int64_t bh, int64_t ib,
                                                     int64_t jw, int g, int t4)
{
    const int odd = g & 1, hi = 2 * (int)((jw >> 4) & 1);
    const uint4 w = dropout_call(a, bh, ib + 2 * t4 + odd, jw + g);
    return bwd_dropout_bits_of(a, dropout_word(w, hi), dropout_word(w, hi + 1), g);
}
/* The same from the two words its call gives the thread's warp: w0, w1 =
 * words hi, hi + 1 (hi = 2 for keys jw with jw % 32 == 16, else 0); the
 * wgmma backward shares each call between two warps (BwdDropX). The
 * bytes are compared four at a time and gathered by a multiply
 * (fg_dropout_keep_bytes, fg_dropout_gather_bytes: a third of the
 * instructions of a compare and a shift per byte). */
__device__ __forceinline__ uint32_t bwd_dropout_bits_of(const AttnArgs &a, uint32_t w0,
                                                        uint32_t w1, int g)
{
    const int odd = g & 1;
    const uint32_t mine = odd ? w1 : w0, theirs = odd ? w0 : w1;
    const uint32_t recv = __shfl_xor_sync(0xffffffffu, theirs, 4);
    /* mine is the word of the call of query parity `odd`, recv that of
     * the other parity; byte b = ih + 2 kh of parity e goes to bit
     * 4 ih + 2 kh + e */
    const uint32_t t = a.keep_threshold;
    return fg_dropout_gather_bytes(fg_dropout_keep_bytes(mine, t), odd) |
           fg_dropout_gather_bytes(fg_dropout_keep_bytes(recv, t), odd ^ 1);
}

/* Number of Bc-key blocks query rows i0 .. i0+rows-1 visit (causal: up to
 * the last row's diagonal; rows that see no key give 0). */
__device__ __forceinline__ int key_blocks(const AttnArgs &a, bool causal, int64_t i0,
                                          int rows, int Bc)
{
    int64_t n_keys = a.Nk;
    if (causal) {
        const int64_t last = i0 + rows - 1 + a.shift + 1;
        n_keys = last < 0 ? 0 : min(last, n_keys);
    }
    return (int)((n_keys + Bc - 1) / Bc);
}

/* The fast forward kernels' key walk of query rows i0 .. i0+rows-1: the
 * band's and the block list's blocks (masked, key_walk), or every Bc-key
 * block from 0 up to the causal limit. */
__device__ __forceinline__ BlockWalk fwd_key_walk(const AttnArgs &a, bool masked, bool causal,
                                                  int64_t b, int64_t h, int64_t i0, int rows,
                                                  int Bc)
{
    if (masked)
        return key_walk(a, b, h, i0, rows, Bc);
    BlockWalk w;
    w.first = 0;
    w.list = nullptr;
    w.blk = Bc;
    w.n = key_blocks(a, causal, i0, rows, Bc);
    return w;
}

/* Backward, key block starting at j0: the first Br-query block to visit
 * (causal skips rows that see none of these keys) and how many follow. */
__device__ __forceinline__ void query_blocks(const AttnArgs &a, bool causal, int64_t j0,
                                             int Br, int64_t *ib_first, int64_t *nqb)
{
    const int64_t i_first = causal ? max((int64_t)0, j0 - a.shift) : 0;
    *ib_first = i_first / Br;
    *nqb = a.Nq > i_first ? (a.Nq + Br - 1) / Br - *ib_first : 0;
}

/* The fast backward kernels' (query head, query block) steps of key block
 * j0 (Bc keys) of K/V head hk: every Br-row query block of each head of the
 * group, those past the causal diagonal (causal), or the band's and the
 * block lists' query blocks (masked); per-head block lists give each head
 * of the group its own count. */
struct QuerySteps {
    BlockWalk walk; /* the group's first head (every head unless per_head) */
    int64_t total;
    bool per_head;
    __device__ __forceinline__ void init(const AttnArgs &a, bool masked, bool causal,
                                         int64_t b, int hk, int64_t j0, int Bc, int Br)
    {
        per_head = masked && a.sparse && a.bm_h > 1 && a.group > 1;
        if (masked) {
            walk = query_walk(a, b, (int64_t)hk * a.group, j0, Bc, Br);
            total = (int64_t)walk.n * a.group;
            if (per_head) {
                total = 0;
                for (int gh = 0; gh < a.group; gh++)
                    total += query_walk(a, b, (int64_t)hk * a.group + gh, j0, Bc, Br).n;
            }
            return;
        }
        int64_t ib_first, nqb;
        query_blocks(a, causal, j0, Br, &ib_first, &nqb);
        walk.first = ib_first;
        walk.list = nullptr;
        walk.blk = Br;
        walk.n = (int)nqb;
        total = nqb * a.group;
    }
    /* Step st -> its head gh of the group and first query row *i0; true
     * when the step is dead (a list entry outside the mask: mask it all). */
    __device__ __forceinline__ bool locate(const AttnArgs &a, int64_t b, int hk, int64_t j0,
                                           int Bc, int Br, int64_t st, int *gh,
                                           int64_t *i0) const
    {
        if (per_head)
            for (*gh = 0; *gh < a.group; ++*gh) {
                const BlockWalk w = query_walk(a, b, (int64_t)hk * a.group + *gh, j0, Bc, Br);
                if (st < w.n) {
                    *i0 = w.start((int)st);
                    return w.dead((int)st);
                }
                st -= w.n;
            }
        if (walk.n == 0) { /* no steps: never asked */
            *gh = 0;
            *i0 = 0;
            return true;
        }
        /* 32-bit where it fits: a 64-bit division is a called routine
         * on the step's path */
        int k;
        if (st <= 0x7fffffff) {
            *gh = (int)((uint32_t)st / (uint32_t)walk.n);
            k = (int)((uint32_t)st - (uint32_t)*gh * (uint32_t)walk.n);
        } else {
            *gh = (int)(st / walk.n);
            k = (int)(st % walk.n);
        }
        *i0 = walk.start(k);
        return walk.dead(k);
    }
};

/* log2 of row (bh, i)'s softmax normaliser from the forward's m and l;
 * +inf for a row that saw no key, so exp2(s - lse2) = 0. */
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

#endif /* FG_KERNELS_ATTN_COMMON_CUH */
