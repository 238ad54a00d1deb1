/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_traits.cuh - the sm_90a wgmma backward's
 * tile shapes, warp roles and per-mode shared-memory parts, shared by the
 * kernel template (attn_bwd_wgmma.cuh) and its dispatch (sizes for the
 * launch checks). */
#ifndef FG_KERNELS_ATTN_BWD_WGMMA_TRAITS_CUH
#define FG_KERNELS_ATTN_BWD_WGMMA_TRAITS_CUH

#include "attn_common.cuh"

#include <stddef.h>

namespace fg {

/* Two warpgroups per block for every head dim (one-warpgroup blocks, two
 * per SM, measured 5-25% slower on an H100: the Q/dO tiles were streamed
 * twice and dQ got twice the atomics). */
/* BR: queries per step, 64, or 128 for the wide d = 64 kernels (kWide
 * below), or 80 for the d = 128 unmasked kernel without dropout (kQ80). */
template <int D, int BR = 64> struct BwdWgTile {
    static_assert(BR == 64 || (BR == 128 && D == 64) || (BR == 80 && D == 128),
                  "wide steps: d = 64 only; 80-query steps: d = 128 only");
    static constexpr bool kSplitD = D == 256;
    static constexpr int kWG = 2;
    static constexpr int kBc = kSplitD ? 64 : 64 * kWG; /* keys per block */
    static constexpr int kBr = BR;                      /* queries per step */
    static constexpr int kDH = kSplitD ? D / 2 : D;     /* dK/dV width per WG */
    static constexpr int kDQ = D / kWG;                 /* dQ width per WG */
    /* split d: P^T Z tile, and the P^T / dropout-bit exchange */
    static constexpr size_t kPBytes = kSplitD ? (size_t)kBc * kBr * 2 : 0;
    static constexpr size_t kXBytes = kSplitD ? (size_t)(kBr / 2 + 1) * 128 * 4 : 0;
    /* dQ_i staging (Br x D floats) for the bulk reduce; d = 256 has no room
     * and stages in the step's Q_i / dO_i tiles instead (64 KB, dead once
     * dK and dV are computed). */
    static constexpr size_t kStageBytes = kSplitD ? 0 : (size_t)kBr * D * 4;
    /* dS^T tiles: two (alternate steps) where shared memory allows, so
     * the warp-specialised kernel's dQ product of step i can read buffer
     * i & 1 while step i + 1 stores to the other. */
    static constexpr int kDSBufs = kSplitD ? 1 : 2;
    /* K, V; Q and dO double-buffered; dS^T [Bc][Br] x kDSBufs; P^T; dQ
     * staging; lse2, D per query (two buffers); eleven mbarriers (128
     * bytes); exchange; 1024 for alignment. At d = 256 this is 232056 of
     * the 232448 bytes a block may have. */
    static constexpr size_t kSmem =
        (size_t)(2 * kBc * D + 4 * kBr * D + kDSBufs * kBc * kBr) * 2 + kPBytes + kStageBytes +
        4 * kBr * sizeof(float) + 128 + kXBytes + 1024;
};

/* The tile of the wide (kWide: 128 queries a step, d = 64), the 80-query
 * (kQ80: d = 128, kMode 0 without dropout) or the 64-query kernels. At
 * kQ80: K, V 64 KB, Q / dO two stages of 80 rows 80 KB, dS two buffers 40
 * KB, the dQ staging 40 KB: 231808 of the 232448 bytes a block may have. */
template <int D, bool kWide, bool kQ80 = false>
using BwdTile = BwdWgTile<D, kQ80 ? 80 : kWide ? 128 : 64>;

/* Warp specialisation for d <= 128, dropout included (with dropout the
 * d = 128 instantiations spill 40-150 bytes of the consumers' 240
 * registers; the unspecialised kernel there was not measured against it):
 * a producer warpgroup (24 registers, one thread issues every load)
 * and the two consumer warpgroups, which never meet at a barrier: they
 * release each Q_i/dO_i/lse2/D buffer through an mbarrier (free_q) once
 * their products have read it, and the dQ product of step i, which needs
 * both warpgroups' dS^T rows, runs one step late, after an mbarrier
 * (ds_full) says both have stored them: in step i + 1 between S^T/dP^T
 * and the softmax (kEarlyDQ, d = 64: it overlaps the softmax, its 16
 * accumulator registers in flight) or, at d = 128 where its 32 would
 * spill, after dK's product. The
 * consumers take turns issuing S^T and dP^T (FA3's ping-pong, two named
 * barriers), so one's softmax runs while the other's products do (H100:
 * +2-5% at d = 128, +9-13% at d = 64 on top of the rest). Other variants:
 * two warpgroups, thread 0 loads, two __syncthreads per step. */
template <int D, bool kDropout> struct BwdSpec {
    static constexpr bool value = !BwdWgTile<D>::kSplitD;
    static constexpr int kThreads = 256 + (value ? 128 : 0);
#ifdef FG_BWD_EARLY_DQ /* experiments: force one placement */
    static constexpr bool kEarlyDQ = FG_BWD_EARLY_DQ;
#else
    static constexpr bool kEarlyDQ = D <= 64;
#endif
};

/* kMode: 0 no mask, 1 bottom-right causal (the tuned path), 2 the variants
 * (attn_fwd_wgmma.cuh), 3 the variants of a packed or key-padded batch, 4
 * the variants with an additive bias and dbias, 5 the same with the bias
 * and dbias by TMA (BwdBiasTile), 6 and 7 modes 2 and 3 without the score
 * modifiers (softcap, ALiBi: masks alone),
 * each its own instantiation: the bias in mode 2 cost every variant half
 * its speed (softcap 30 + causal, N = 8k: 135 -> 59 TFLOP/s, H100); the
 * modifiers' code, skipped at run time, cost windows, block masks and
 * packed batches 3-10% of their backward (H200, compare_modes.py: dense
 * through the variant kernel 437 -> 472 TFLOP/s, window 1024 313 -> 328,
 * packed causal 367 -> 382). */
/* Where one kernel serves both dropout settings (dropout a run-time flag,
 * a.dropout): half the kernels to build. Only where the dropout kernel
 * does not spill more than the one without (ptxas -v, sm_90a): modes 2,
 * 3 and 4 at d = 256, and modes 2 and 4 at d = 64 (at d = 128 the
 * dropout kernels spill 300-1000 bytes, the others 0-220). */
/* kMode 5 (the bias by TMA; d = 128 only): two stages of the bias tile
 * [Br queries][Bc keys] (64-key panels, 128-byte swizzle) between the dQ
 * staging and lse2/D. The producer loads the bias beside Q_i; after dS
 * each warp writes dS over its 16 key columns (stmatrix) and each
 * warpgroup stores its panel into a dense 16-bit dbias by TMA
 * (BwdMaps::bias_flags bit 1; without it there is no dbias). 231552 of the
 * 232448 bytes a block may have. Both decisions are compile-time: as
 * run-time branches beside mode 4's per-element path, ptxas spilled
 * 150-1800 bytes (sm_90a); this way none without dropout, 412 with (mode
 * 4: 0 and 500). Other bias and dbias layouts (fp32, strided keys,
 * broadcast rows or keys, a broadcast dbias summed by atomics), other head
 * dims and the split-d kernel take mode 4 (FG_ATTN_BIAS_TMA=0 forces it).
 * H200, N = 2k, bf16 [B,H,N,N] bias with dbias: 64 -> 136 TFLOP/s. */
template <int D, int kMode> struct BwdBiasTile {
    static constexpr bool value = kMode == 5 && !BwdWgTile<D>::kSplitD;
    static constexpr size_t kStage = (size_t)BwdWgTile<D>::kBr * BwdWgTile<D>::kBc * 2;
    static constexpr size_t kBytes = value ? 2 * kStage : 0;
};

/* kModes 3 and 7 (d <= 128): the sequence's AttnArgs (seq_args) in shared
 * memory, read there by the steps. As a local copy its fields took
 * registers for the whole kernel: ptxas spilled 400 bytes (d = 128, no
 * dropout; 104 reading every field from the parameter space) and the
 * causal batch packed into one row ran its backward at 0.70 of the same
 * pairs unpacked (H200, compare_modes.py). Split d has no room (392 bytes
 * spare) and keeps the local copy. */
template <int D, int kMode> struct BwdSeqSmem {
    static constexpr bool value = kmode_ragged(kMode) && !BwdWgTile<D>::kSplitD;
    static constexpr size_t kBytes = value ? (sizeof(AttnArgs) + 15) / 16 * 16 : 0;
};

/* Dropout in the warp-specialised backward (d <= 128): lane L of warps 2p
 * and 2p + 1 of a warpgroup make the same Philox calls (their keys share a
 * 32-key group, and the call depends on the key only through j / 32 and
 * (j / 2) % 4; the even warp uses words 0-1, the odd one 2-3), so each makes
 * half of the step's calls and hands the other warp its two words of each
 * through shared memory: [step parity][warpgroup][pair][Br / 16 calls][32
 * lanes] uint2, after the mbarriers. Not with a bias (kModes 4, 5: the bias
 * tile leaves no room at d = 128). */
template <int D, int kMode, bool kDropout, bool kWide = false> struct BwdDropX {
    static constexpr bool value = kDropout && !BwdWgTile<D>::kSplitD && kMode != 4 && kMode != 5;
    static constexpr size_t kBytes =
        value ? (size_t)2 * 2 * 2 * (BwdTile<D, kWide>::kBr / 16) * 32 * 8 : 0;
};

template <int D, int kMode> struct BwdDropRT {
    static constexpr bool value =
        kMode >= 2 && D != 128 && !(kmode_ragged(kMode) && D == 64);
};

} /* namespace fg */

#endif
