/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_load.cuh - the loads of the sm_90a wgmma
 * backward (attn_bwd_wgmma.cuh): K_j and V_j once, and per step Q_i, dO_i,
 * lse2, D (and the bias tile) by TMA into the step's buffer, with the
 * step's coordinates (head, first query row, mask flags) beside them in
 * step_info. One thread issues them (kSpec: the producer warpgroup's
 * first; otherwise thread 0); the step walk is attn_walk.cuh's
 * QuerySteps. One object a thread, made once the block knows its key
 * block and step count. */
#ifndef FG_KERNELS_ATTN_BWD_WGMMA_LOAD_CUH
#define FG_KERNELS_ATTN_BWD_WGMMA_LOAD_CUH

#include "attn_bwd_wgmma_dq.cuh"
#include "attn_bwd_wgmma_traits.cuh"
#include "attn_common.cuh"
#include "attn_walk.cuh"
#include "wgmma_sm90.cuh"

#include <cuda.h> /* CUtensorMap */
#include <stdint.h>

namespace fg {

template <typename T, int D, int kMode, bool kWide, bool kQ80> struct BwdLoads {
    using Tile = BwdTile<D, kWide, kQ80>;
    using BiasTile = BwdBiasTile<D, kMode>;
    static constexpr bool kCausal = kMode == 1, kMasked = kMode >= 2;
    static constexpr bool btma = BiasTile::value; /* the bias by TMA */
    static constexpr int Bc = Tile::kBc, Br = Tile::kBr;
    static constexpr int kQBox = kQ80 ? Br : 64; /* rows of a Q / dO box */
    static constexpr uint32_t qtile = Br * D * 2; /* bytes of one Q or dO tile */
    struct StepAt {
        int64_t i0;
        int gh, flags; /* flags: step_info's bits */
    };

    /* The kernel's values by reference, as its lambdas captured them (as
     * BwdDQ and BwdScore do). args: the launch's (its parameter space); a:
     * the sequence's (kModes 3, 7). */
    const AttnArgs &args, &a;
    const CUtensorMap &tmQ, &tmK, &tmV, &tmO, &tmB;
    const int &b, &hk, &kb, &tb; /* tb: the TMA batch coordinate */
    const int64_t &q_row0, &k_row0, &j0, &total;
    const bool &rot; /* the rotated walk (bwd_rotated) */
    const QuerySteps &steps;
    int4 *const &step_info; /* [2] */
    const uint32_t &sK, &sV, &sQ0, &sBias, &bar_kv, &bar_q;
    float *const &lse2_s, *const &D_s; /* [2][Br] each */

    /* A tile of `rows` rows in boxes of `box` (the map's: Bc for K and V,
     * kQBox for Q and dO, so a wide step's tile takes two) */
    __device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                             int rows, int box, int64_t row0, int head) const {
#pragma unroll
        for (int p = 0; p < D / 64; p++)
#pragma unroll
            for (int r = 0; r < rows / box; r++)
                tma_load_4d(dst + p * rows * 128 + r * box * 128, map, bar, p * 64,
                            (int)row0 + box * r, head, tb);
    }

    __device__ __forceinline__ void load_kv() const {
        mbar_expect_tx(bar_kv, 2 * Bc * D * 2);
        tma_tile(sK, &tmK, bar_kv, Bc, Bc, k_row0 + j0, hk);
        tma_tile(sV, &tmV, bar_kv, Bc, Bc, k_row0 + j0, hk);
    }

    /* Step st -> its head gh, first query row i0 and whether it is dead. */
    __device__ __forceinline__ void locate(int64_t st, int &gh, int64_t &i0, bool &dead) const {
        if (rot)
            st = bwd_rotated(st, kb, total);
        dead = steps.locate(a, b, hk, j0, Bc, Br, st, &gh, &i0) && kMasked;
    }

    /* A step's loads in two parts: where (locate and the mask flags: a few
     * hundred instructions with divisions, where the 24-register producer
     * spills) and the loads themselves. kRagged: the producer works out
     * step st + 1 before it waits for the buffer that step needs, so only
     * the loads sit between the consumers' release and that step's data
     * (H200, d = 128, causal batch packed: backward +1-5%, N = 2k and 8k;
     * in the other modes, whose locate is cheaper, d = 64 variants lost
     * 4%, so they locate after the wait as before). The fields the same
     * for every sequence come from the parameter space (seq_s is in
     * shared memory). */
    __device__ __forceinline__ StepAt where(int64_t st) const { /* one thread */
        StepAt w;
        bool dead;
        locate(st, w.gh, w.i0, dead);
        /* (element-wise masking: the sequence's end, the causal diagonal,
         * the band's edges, dead blocks) */
        const bool need_mask = j0 + Bc > a.Nk || w.i0 + Br > a.Nq ||
                               (kCausal && j0 + Bc - 1 > w.i0 + a.shift) ||
                               (kMasked && (dead || !inside_band(a, w.i0, w.i0 + Br - 1, j0, Bc)));
        w.flags = (dead ? 1 : 0) | (need_mask ? 2 : 0);
        return w;
    }

    /* Step st's loads. part 0: all of them on one barrier arrival. Split d
     * loads in two parts: the dQ staging of step st - 2 fills buffer st & 1
     * (warps 0-1 of each warpgroup its Q_i tile, warps 2-3 its dO_i tile),
     * so dO_i, lse2 and D follow as soon as warps 2-3 have seen their
     * reduces read (part 1: transaction bytes alone) and Q_i once warps 0-1
     * have (part 2, which arrives). step_info is written before the
     * arrival that publishes it. The bias tile is part 0's only:
     * BwdBiasTile is d = 128 only. part is a constant at every call. */
    __device__ __forceinline__ void load_step(int64_t st, const StepAt &w, int part) const {
        /* one thread */
        const int64_t i0 = w.i0;
        if (part != 2)
            step_info[st & 1] = make_int4((int)(uint32_t)i0, (int)(i0 >> 32), w.gh, w.flags);
        const int h = hk * args.group + w.gh;
        const uint32_t buf = sQ0 + (uint32_t)(st & 1) * 2 * qtile;
        const uint32_t bar = bar_q + 8 * (uint32_t)(st & 1);
        if (part == 0)
            mbar_expect_tx(bar, 2 * qtile + 2 * Br * 4 + (btma ? (uint32_t)BiasTile::kStage : 0));
        else if (part == 1)
            mbar_expect_tx_only(bar, qtile + 2 * Br * 4);
        else
            mbar_expect_tx(bar, qtile);
        if (part != 1)
            tma_tile(buf, &tmQ, bar, Br, kQBox, q_row0 + i0, h);
        if (part == 2)
            return;
        tma_tile(buf + qtile, &tmO, bar, Br, kQBox, q_row0 + i0, h);
        if (part == 0 && btma) { /* bias rows i0.., keys j0..: Bc / 64 panels */
            const int hb = args.bias_s[1] ? h : 0, bb = args.bias_s[0] ? b : 0;
#pragma unroll
            for (int p = 0; p < Bc / 64; p++)
                tma_load_4d(sBias + (uint32_t)(st & 1) * (uint32_t)BiasTile::kStage + p * Br * 128,
                            &tmB, bar, (int)(j0 + 64 * p), (int)i0, hb, bb);
        }
        const int64_t row = ((int64_t)b * args.H + h) * args.nq_pad + i0;
        bulk_load(smem_u32(lse2_s + (st & 1) * Br), (const float *)args.lse2p + row, Br * 4, bar);
        bulk_load(smem_u32(D_s + (st & 1) * Br), (const float *)args.Dp + row, Br * 4, bar);
    }

    /* where and load_step in one (one thread) */
    __device__ __forceinline__ void issue(int64_t st) const { load_step(st, where(st), 0); }
};

} // namespace fg

#endif
