/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma_traits.cuh - the sm_90a wgmma forward's
 * tile shapes, warp roles and per-mode choices, shared by the kernel
 * template (attn_fwd_wgmma.cuh) and its dispatch (tile sizes for the
 * launch checks). */
#ifndef FG_KERNELS_ATTN_FWD_WGMMA_TRAITS_CUH
#define FG_KERNELS_ATTN_FWD_WGMMA_TRAITS_CUH

#include <stddef.h>

namespace fg {

/* WG consumer warpgroups of 64 query rows. One warpgroup per block with
 * two blocks per SM lets the hardware overlap one block's softmax with the
 * other's MMAs (the blocks are independent, no ping-pong barriers needed)
 * at the cost of loading each K/V tile twice per SM; two warpgroups share
 * the tiles but run in lockstep. */
template <int D, int WG, int kWideBc = 0> struct FwdWgTile {
    static constexpr int kWG = WG;
    static constexpr int kBr = 64 * kWG;          /* query rows per block */
    /* keys per block: S (kBc / 2 regs) + O (D / 2 regs) must fit, and two
     * one-warpgroup blocks must fit an SM's shared memory. kWideBc
     * (FwdWide) overrides it. */
    static constexpr int kBc = kWideBc ? kWideBc : D == 256 || (WG == 1 && D == 128) ? 64 : 128;
    static constexpr int kMinBlocks = WG == 1 ? 2 : 1;
    static constexpr size_t kSmem =
        (size_t)(kBr * D + 4 * kBc * D) * 2 + 128 + 1024; /* Q, 2x(K, V), barriers, align */
    /* A 16-bit bias by TMA (FwdMaps::bias_tma): two [kBr][kBc] stages of
     * 64-column panels, 1024-aligned after the barriers. At d = 128 and
     * 256 this brings a block to 231552 of the 232448 bytes it may have. */
    static constexpr size_t kBiasStage = (size_t)kBr * kBc * 2;
    static constexpr size_t kBiasSmem = 1024 + 2 * kBiasStage;
};

/* Warp specialisation (two-warpgroup blocks, dropout included): a producer
 * warpgroup (24 registers a thread; one thread issues every TMA load)
 * and two consumer warpgroups (240 each, setmaxnreg); consumers release
 * K/V buffers through mbarriers instead of meeting at __syncthreads, and
 * take turns issuing their GEMMs (FA3's ping-pong), so one's softmax runs
 * while the other's products are on the tensor cores. */
template <int WG, bool kDropout> struct FwdSpec {
    static constexpr bool value = WG == 2;
    static constexpr int kThreads = WG * 128 + (value ? 128 : 0);
};

/* kMode: 0 no mask, 1 bottom-right causal (the tuned path), 2 the variants
 * (band of any window or alignment, block lists, softcap, ALiBi, bias), 3
 * the variants of a packed or key-padded batch, 6 and 7 modes 2 and 3
 * with masks alone (no softcap, ALiBi or bias), kept in their own
 * instantiations so the plain and causal kernels stay as they were (and
 * mode 2 too: the per-sequence arguments cost registers). */
/* Where one kernel serves both dropout settings (dropout a run-time flag,
 * a.dropout): half the kernels to build. Only where the dropout kernel
 * does not spill more than the one without (ptxas -v, sm_90a): the
 * variants (mode 2), and the packed batches (3) but at d = 128. Modes 6
 * and 7 have both (the masks-alone kernels are the ones to keep lean).
 * Mode 2 at d = 128 in two kernels (330 fewer SASS instructions without
 * dropout) ran its softcap and ALiBi forwards no faster (H200, session
 * 52): the dropout code is branched around. */
template <int D, int kMode> struct FwdDropRT {
    static constexpr bool value = kMode == 2 || (kMode == 3 && D != 128);
};

/* Wider key blocks where the per-block work (row maxima and sums, O's
 * rescale, the ping-pong hand-offs, the mbarrier waits) is a visible share
 * of a step: the unmasked d = 128 forward without dropout takes 176 keys a
 * block (FA3's choice for that case): S 88 registers, P 44, O 64, and two
 * K/V stages of 176 rows with Q fit in 214 KB. The masked modes keep 128
 * (their edge blocks would waste more), so does dropout (its 32-key
 * groups). 0: the default tile. */
template <int D, int kMode, bool kDropout> struct FwdWide {
    static constexpr int value = kMode != 0 || kDropout ? 0 : D == 128 ? 176 : D == 256 ? 80 : 0;
};

/* Warpgroups per block for head dim d, measured on an H100 (bf16, N = 8k):
 * d = 64 one (469 vs 359 TF/s), d = 128 two (518 vs 451). */
template <int D> struct FwdWG {
    static constexpr int value = D <= 64 ? 1 : 2;
};

} /* namespace fg */

#endif
