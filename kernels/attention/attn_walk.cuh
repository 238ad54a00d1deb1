/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_walk.cuh - which tiles a block visits: the block
 * lists of a block-sparse mask, a query block's key walk and a key block's
 * query walk through the band and the lists, the band's per-row and
 * per-key limits inside a tile, and the fast backward's (head, query
 * block) steps. Included by attn_common.cuh, whose band and packed-batch
 * pieces it uses. */
#ifndef FG_KERNELS_ATTN_WALK_CUH
#define FG_KERNELS_ATTN_WALK_CUH

#include "attn_common.cuh"

namespace fg {

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

/* The walk of one block along the other axis, in blocks of `blk`: kv,
 * the keys of query rows x0 .. x0+len-1 (key_walk); else the queries of
 * keys x0 .. x0+len-1 (query_walk). The block lists, or the band's span. */
template <bool kv>
__device__ __forceinline__ BlockWalk band_walk(const AttnArgs &a, int64_t b, int64_t h,
                                               int64_t x0, int len, int blk)
{
    BlockWalk w;
    w.blk = blk;
    w.list = nullptr;
    w.first = 0;
    w.per = FG_ATTN_SPARSE_BLOCK / blk;
    w.nblk = kv ? a.nkb : a.nqb;
    w.limit = kv ? a.Nk : a.Nq;
    if (a.sparse) {
        int n;
        w.list = block_list(a, kv, b, h, x0 / FG_ATTN_SPARSE_BLOCK, &n);
        w.n = n * w.per;
        return w;
    }
    const int64_t lo = kv ? band_key_begin(a, x0) : band_query_begin(a, x0);
    const int64_t hi = kv ? band_key_end(a, x0 + len - 1) : band_query_end(a, x0 + len - 1);
    w.first = lo / blk;
    w.n = hi > lo ? (int)((hi + blk - 1) / blk - w.first) : 0;
    return w;
}

/* Key walk of query rows i0 .. i0+rows-1 of (b, h) with Bc-key blocks. */
__device__ __forceinline__ BlockWalk key_walk(const AttnArgs &a, int64_t b, int64_t h,
                                              int64_t i0, int rows, int Bc)
{
    return band_walk<true>(a, b, h, i0, rows, Bc);
}

/* Query walk of keys j0 .. j0+cols-1 for query head h with Br-row blocks. */
__device__ __forceinline__ BlockWalk query_walk(const AttnArgs &a, int64_t b, int64_t h,
                                                int64_t j0, int cols, int Br)
{
    return band_walk<false>(a, b, h, j0, cols, Br);
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

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_WALK_CUH */
