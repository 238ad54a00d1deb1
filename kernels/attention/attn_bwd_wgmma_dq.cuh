/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_dq.cuh - the dQ path of the sm_90a wgmma
 * backward (attn_bwd_wgmma.cuh): a step's dQ product (Alg. 4 line 22), its
 * staging in shared memory and the TMA bulk reduce-add into the tiled fp32
 * accumulator, and the deterministic mode's turns (the producer's writers
 * at d <= 128, each warp's own adds at d = 256). One object a thread,
 * made once the block knows its key block and step count; the kernel
 * calls it from the producer and the consumer warpgroups. */
#ifndef FG_KERNELS_ATTN_BWD_WGMMA_DQ_CUH
#define FG_KERNELS_ATTN_BWD_WGMMA_DQ_CUH

#include "attn_bwd_wgmma_traits.cuh"
#include "attn_common.cuh"
#include "attn_walk.cuh"
#include "wgmma_sm90.cuh"

#include <stdint.h>

namespace fg {

/* The rotated walk (AttnArgs::dq_rotate): the step key block kb takes
 * st-th of its total. */
__device__ __forceinline__ int64_t bwd_rotated(int64_t st, int kb, int64_t total)
{
    st += kb;
    return st >= total ? st - total : st;
}

/* The kernel's tile (Tile), its descriptor builder (Desc) and its block
 * coordinates, shared by the kernel and this path. */
template <typename T, int D, int kMode, bool kWide, bool kQ80, typename Desc> struct BwdDQ {
    using Tile = BwdTile<D, kWide, kQ80>;
    static constexpr bool kMasked = kMode >= 2, kCausal = kMode == 1;
    static constexpr int Bc = Tile::kBc, Br = Tile::kBr, DQ = Tile::kDQ;
    /* columns of a warpgroup's dQ product (kQ80: queries of its dQ^T) */
    static constexpr int DQW = kQ80 ? Br : kWide ? D : DQ;
    /* floats of one warp's staged dQ run: 16 rows of DQ columns (kQ80: 16
     * rows of d by Br queries) */
    static constexpr int RUNF = 16 * (kQ80 ? Br : DQ);
    static constexpr uint32_t qtile = Br * D * 2; /* bytes of one Q or dO tile */

    /* The kernel's values by reference, as its lambdas captured them: with
     * copies the d = 256 kernels without dropout compiled to other SASS (a
     * loop invariant hoisted); this way every kernel's SASS is the same as
     * when this path was lambdas in the kernel (cuobjdump, modes 0-7). */
    const AttnArgs &args, &a; /* the launch's, and the sequence's (kModes 3, 7) */
    const uint32_t &base, &sK, &sdS0, &sStage;
    /* kSpec: dS^T [buffer] stored by both WGs; det: the dQ staging of
     * step s filled (dq_full[s & 1]) and read (dq_empty[s & 1]) */
    const uint32_t &ds_full, &dq_full, &dq_empty;
    const int &b, &hk, &kb, &wg, &warp, &lane;
    const bool &det, &rot; /* the deterministic turns; the rotated walk */
    const int64_t &total;  /* the block's steps */
    /* copies (AttnArgs::dq_copies): key block kb adds into copy kb % K,
     * after the blocks above it with the same remainder */
    int dq_K, dq_copy;  /* 1, 2, 4 */
    int64_t dq_nctr;    /* counters per copy */
    int *dq_giveup;     /* after the counters */
    int *dq_pend;       /* split d, lane 0: the counter whose turn is due */
    bool dv_relax, dv_early; /* split d: a.dq_split_turns bits 0, 1 */

    __device__ __forceinline__ BwdDQ(const AttnArgs &args_, const AttnArgs &a_,
                                     const uint32_t &base_, const uint32_t &sK_,
                                     const uint32_t &sdS0_, const uint32_t &sStage_,
                                     const uint32_t &ds_full_, const uint32_t &dq_full_,
                                     const uint32_t &dq_empty_, const int &b_, const int &hk_,
                                     const int &kb_, const int &wg_, const int &warp_,
                                     const int &lane_, const bool &det_, const bool &rot_,
                                     const int64_t &total_)
        : args(args_), a(a_), base(base_), sK(sK_), sdS0(sdS0_), sStage(sStage_),
          ds_full(ds_full_), dq_full(dq_full_), dq_empty(dq_empty_), b(b_), hk(hk_), kb(kb_),
          wg(wg_), warp(warp_), lane(lane_), det(det_), rot(rot_), total(total_)
    {
        dq_K = a.dq_copies > 1 ? a.dq_copies : 1;
        dq_copy = kb & (dq_K - 1);
        dq_nctr = (int64_t)args.B * a.H * (a.nq_pad / 64) * 8;
        dq_giveup = det ? a.dq_sem + dq_nctr * dq_K : nullptr;
        dq_pend = nullptr;
        dv_relax = det && (a.dq_split_turns & 1);
        dv_early = det && (a.dq_split_turns & 2);
    }


    /* det: two warps of the producer warpgroup (writers 0 and 1, for even
     * and odd steps, so that one waits for its sums to land while the
     * other issues) add each step's staged dQ_i to dq_acc in turns, lane
     * r < 8 run r (warp r's piece) with a turn counter of its own: the
     * turns of the eight runs pass on independently, and each waits for
     * 4 KB (d = 128) to land rather than 32. A tile's turns go to the key
     * blocks of its key walk (rows clipped to Nq), from the last block to
     * the first: the order in which causal and banded blocks reach it
     * (each starts at its diagonal), so the waits stay short. A block that
     * visits a tile outside that walk sees only masked pairs there and
     * adds nothing. kWide: a step is two 64-query tiles, added one after
     * the other, each with the walk and the counters of its own (lane r:
     * run r of tile t at staging run 8 t + r; the tiled accumulator and
     * the staging hold the same runs in the same order either way). */
    /* Run r of the 64-query tile at row it of head bh: its turn counter
     * and its place in this block's copy of the accumulator. */
    __device__ __forceinline__ int *dq_ctr(int64_t bh, int64_t it, int r) const
    {
        return a.dq_sem + dq_copy * dq_nctr + (bh * (a.nq_pad / 64) + it / 64) * 8 + r;
    }
    __device__ __forceinline__ float *dq_run(int64_t bh, int64_t it, int r) const
    {
        return (float *)a.dq_acc + dq_copy * ((int64_t)args.B * a.H * a.nq_pad * D) +
               (bh * a.nq_pad + it) * D + r * DQ * 16;
    }
    /* Does this block add to the 64-query tile at row it of head gh (step
     * s), and in which turn? Its place among the blocks of its copy adding
     * to the tile: from the last block to the first, or rotated (every
     * tile's walk is all blocks, first = 0): block k reaches step p at its
     * step (p - k) mod total, so the order is min(p, last), ..., 0, then
     * last, ..., p + 1. */
    __device__ __forceinline__ bool dq_turn(int64_t s, int gh, int64_t it, int &turn) const
    {
        const BlockWalk w = fwd_key_walk(a, kMasked, kCausal, b, hk * a.group + gh, it,
                                         (int)min((int64_t)64, (int64_t)a.Nq - it), Bc);
        const int64_t last = w.first + w.n - 1;
        if (kb < w.first || kb > last)
            return false;
        const int sh = dq_K >> 1;
        turn = (int)((last - kb) >> sh);
        if (rot) {
            const int64_t p = bwd_rotated(s, kb, total), m = min(p, last);
            turn = kb <= m ? (int)((m - kb) >> sh)
                           : (int)((m >= dq_copy ? ((m - dq_copy) >> sh) + 1 : 0) +
                                   ((last - kb) >> sh));
        }
        return true;
    }
    /* Writer wr's loop (locate: the kernel's step -> head, row, dead). */
    template <typename Locate> __device__ __forceinline__ void dq_writer(int wr, const Locate &locate)
    {
        for (int64_t s = wr; s < total; s += 2) {
            int gh;
            int64_t i0;
            bool dead;
            locate(s, gh, i0, dead);
            const int64_t bh = (int64_t)b * a.H + hk * a.group + gh;
            mbar_wait(dq_full + 8 * wr, (uint32_t)(s >> 1) & 1);
            unsigned mine = 0; /* bit t: this block adds to tile t */
#pragma unroll 1
            for (int t = 0; t < Br / 64; t++) {
                const int64_t it = i0 + 64 * t;
                int turn;
                if (dead || it >= a.Nq || lane >= 8 || !dq_turn(s, gh, it, turn))
                    continue;
                mine |= 1u << t;
                /* run `lane` of 64-query tile t of the step */
                turn_wait(dq_ctr(bh, it, lane), turn, dq_giveup);
                bulk_reduce_add_f32(dq_run(bh, it, lane),
                                    sStage + (uint32_t)(8 * t + lane) * DQ * 64, DQ * 64);
                bulk_commit();
            }
            if (mine)
                bulk_wait_read<0>();
            __syncwarp();
            if (lane == 0)
                mbar_arrive(dq_empty + 8 * wr);
            if (mine) {
                bulk_wait_all(); /* the sums are in dq_acc before the next turn */
#pragma unroll 1
                for (int t = 0; t < Br / 64; t++)
                    if (mine & (1u << t))
                        turn_pass(dq_ctr(bh, i0 + 64 * t, lane));
            }
        }
    }

    __device__ __forceinline__ uint32_t step_sdS(int64_t s) const
    {
        return sdS0 + (uint32_t)(Tile::kDSBufs == 2 ? s & 1 : 0) * Bc * Br * 2;
    }
    /* kSpec: waits until both warpgroups have stored dS^T of step s. */
    __device__ __forceinline__ void wait_ds(int64_t s) const
    {
        mbar_wait(ds_full + 8 * (uint32_t)(s & 1), (uint32_t)(s >> 1) & 1);
    }
    /* dQ_i += scale dS K (Alg4 L.22) of step s: A = dS (queries x keys)
     * read MN-major from dS^T, B = K read MN-major; this WG's DQ columns. */
    __device__ __forceinline__ void dq_issue(float (&q)[DQW / 2], int64_t s) const
    {
        if constexpr (kQ80) { /* dQ_i^T += K^T dS^T: d rows 64 wg.. by Br queries */
            const Desc da0(sK + (uint32_t)wg * Bc * 128, Bc * 128, 1024),
                db0(step_sdS(s), 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < Bc / 16; kk++)
                WgmmaOp<T, Br>::template ss<1, 0>(
                    q, da0(kk * 16 * 128), db0((kk >> 2) * Br * 128 + (kk & 3) * 32), kk > 0);
            wg_commit();
            return;
        }
        /* column wg*DQ: panel (wg*DQ)/64, and for DQ = 32 half a 128-byte
         * row into it (the swizzle is address-based); kWide: every column,
         * the queries of dS^T's panel wg */
        const uint32_t col = kWide ? 0u : (uint32_t)(wg * DQ);
        const Desc da0(step_sdS(s) + (kWide ? (uint32_t)wg * Bc * 128 : 0u), Bc * 128, 1024),
            db0(sK + (col / 64) * Bc * 128 + (col % 64) * 2, Bc * 128, 1024);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++)
            WgmmaOp<T, DQW>::template ss<1, 1>(q, da0(kk * 16 * 128), db0(kk * 16 * 128), kk > 0);
        wg_commit();
    }
    /* Warp w of warpgroup g stages its 16 x DQ piece of step s's dQ_i as
     * run 4g + w of the tile (fragment n of lane l at float4 32n + l:
     * stores without bank conflicts) and lane 0 reduce-adds the run into
     * dq_acc. Split d: the run goes to a Q_i / dO_i panel that only this
     * warpgroup's (finished) dV/dK products read. det: writer s & 1
     * reduces the whole tile of step s once every thread has staged. */
    /* split d: warp w of warpgroup g stages its run in the step's Q_i
     * (w < 2) or dO_i tile (w >= 2), panel 2 g + w % 2 */
    __device__ __forceinline__ uint32_t split_stage(uint32_t sQ) const
    {
        return sQ + (uint32_t)(warp >> 1) * qtile + (uint32_t)(wg * 2 + (warp & 1)) * Br * 128;
    }
    __device__ __forceinline__ void dq_store(const float (&q)[DQW / 2], int64_t s, int64_t i0,
                                             int64_t bh, uint32_t sQ) const
    {
        /* kWide: runs warp and 4 + warp of 64-row tile wg (its queries,
         * all D columns); otherwise run 4 wg + warp of the step's tile */
        constexpr int RW = kWide ? DQW / DQ : 1; /* runs per warp */
        const int run = kWide ? warp : wg * 4 + warp;
        const int64_t t0 = i0 + (kWide ? 64 * wg : 0);
        uint32_t stage;
        if constexpr (Tile::kSplitD) {
            stage = split_stage(sQ);
        } else {
            stage = sStage + (kWide ? (uint32_t)wg * 64 * D * 4 : 0u) + (uint32_t)run * RUNF * 4;
            if (det) {
                if (s > 0) /* writer (s - 1) & 1 has read step s - 1's tile */
                    mbar_wait(dq_empty + 8 * (uint32_t)((s - 1) & 1), (uint32_t)((s - 1) >> 1) & 1);
            } else {
                if (lane == 0)
                    bulk_wait_read<0>(); /* the last reduces have read it */
                __syncwarp();
            }
        }
        /* unscaled: the conversion (attn_bwd_write_dq*) applies the
         * softmax scale once to each sum, not here to every product */
        extern __shared__ unsigned char smem[]; /* the kernel's */
        float4 *sq = reinterpret_cast<float4 *>(smem + (stage - base)) + lane;
#pragma unroll
        for (int n = 0; n < DQW / 8; n++) /* kWide: run 4 (n / 4) on, fragment n % 4 */
            sq[RW > 1 ? (n >> 2) * 4 * DQ * 4 + 32 * (n & 3) : 32 * n] =
                make_float4(q[4 * n], q[4 * n + 1], q[4 * n + 2], q[4 * n + 3]);
        fence_proxy_async(); /* generic stores -> the bulk copy's reads */
        if (det) { /* split d: dq_add_split */
            if constexpr (!Tile::kSplitD)
                mbar_arrive(dq_full + 8 * (uint32_t)(s & 1));
            return;
        }
        __syncwarp();
        if (lane == 0) {
#pragma unroll
            for (int h = 0; h < RW; h++) /* kWide: runs warp, 4 + warp */
                bulk_reduce_add_f32((float *)a.dq_acc + (bh * a.nq_pad + t0) * D +
                                        (run + 4 * h) * RUNF,
                                    stage + (uint32_t)(4 * h * RUNF * 4), RUNF * 4);
            bulk_commit();
        }
    }
    /* Split d, det: lane 0 of each warp adds its staged run of step s in
     * its turn (this kernel has no producer warps to hand it to) and
     * passes the turn on once the add has landed, just before its next
     * add (or at the end): the wait for the L2's acknowledgement, a step
     * after the issue, stays off the step's barriers. A block waits only
     * for turns of blocks started before it (as dq_writer), and passes
     * its own before it waits. By default (a.dq_split_turns = 3) the
     * pass and a first poll of the next turn go out while the step's dQ
     * product runs (dq_add_early), and both are relaxed: the pass follows
     * the wait for the add's completion at the L2 (bulk_wait_all), and the
     * next add is issued only once the poll has seen the pass, so the
     * L2 applies the adds in turn order without the release's MEMBAR.GPU
     * and the acquire's L1 invalidation, which the whole warp waited on
     * before the step's last barrier (H200, session 54: 0.72-0.80x the
     * default backward -> 0.89-0.93x, reruns bitwise equal). */
    __device__ __forceinline__ void dq_pass()
    {
        if (dq_pend) {
            bulk_wait_all();
            if (dv_relax)
                turn_pass<true>(dq_pend);
            else
                turn_pass(dq_pend);
            dq_pend = nullptr;
        }
    }
    __device__ __forceinline__ void dq_wait(int *ctr, int turn) const
    {
        if (dv_relax)
            turn_wait<true>(ctr, turn, dq_giveup);
        else
            turn_wait(ctr, turn, dq_giveup);
    }
    /* lane 0, in its turn: this warp's staged run of the step's tile
     * added, its turn's pass due (dq_pass) */
    __device__ __forceinline__ void dq_add_run(int *ctr, int64_t bh, int64_t i0, uint32_t sQ)
    {
        bulk_reduce_add_f32(dq_run(bh, i0, wg * 4 + warp), split_stage(sQ), DQ * 64);
        bulk_commit();
        dq_pend = ctr;
    }
    __device__ __forceinline__ void dq_add_split(int64_t s, int gh, int64_t i0, int64_t bh,
                                                 bool dead, uint32_t sQ)
    {
        __syncwarp();
        int turn;
        if (lane == 0 && !dead && i0 < a.Nq && dq_turn(s, gh, i0, turn)) {
            int *ctr = dq_ctr(bh, i0, wg * 4 + warp);
            dq_pass();
            dq_wait(ctr, turn);
            dq_add_run(ctr, bh, i0, sQ);
        }
    }
    /* The turn's bookkeeping while the dQ product runs (lane 0: the
     * pass of the last add, then one poll), the add after staging. */
    __device__ __forceinline__ void dq_add_early(float (&q)[DQW / 2], int64_t s, int gh,
                                                 int64_t i0, int64_t bh, bool dead, uint32_t sQ)
    {
        dq_issue(q, s);
        int turn = 0, seen = 0;
        int *ctr = nullptr;
        if (lane == 0 && !dead && i0 < a.Nq && dq_turn(s, gh, i0, turn)) {
            ctr = dq_ctr(bh, i0, wg * 4 + warp);
            dq_pass();
            seen = dv_relax ? turn_poll<true>(ctr) : turn_poll(ctr);
        }
        __syncwarp();
        wg_wait<0>();
        wg_fence_regs(q);
        dq_store(q, s, i0, bh, sQ);
        __syncwarp();
        if (ctr) {
            if (seen < turn)
                dq_wait(ctr, turn);
            dq_add_run(ctr, bh, i0, sQ);
        }
    }
    /* The whole dQ product of step s, issued and waited for (with every
     * earlier product of this warpgroup), then staged and reduced. */
    __device__ __forceinline__ void dq_now(float (&q)[DQW / 2], int64_t s, int64_t i0, int64_t bh,
                                           uint32_t sQ) const
    {
        dq_issue(q, s);
        wg_wait<0>();
        wg_fence_regs(q);
        dq_store(q, s, i0, bh, sQ);
    }
};

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_BWD_WGMMA_DQ_CUH */
