/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma.cuh - fp16/bf16 FlashAttention backward for Hopper
 * (sm_90a) on warpgroup MMA (wgmma).
 *
 * One block of two warpgroups per (K/V block, K/V head, batch); K_j and V_j
 * stay in shared memory, dK_j and dV_j accumulate in registers (fp32). For
 * each query head of the group and each query block of 64 rows (128: kWide,
 * 80: kQ80; Q_i, dO_i double-buffered, by TMA), Alg. 4 lines 11-23 in five
 * wgmma GEMMs:
 *   S^T  = K Q_i^T      dP^T = V dO_i^T       (A, B from shared memory)
 *   P^T  = exp2(S^T scale log2e - lse2), dropout, dS^T = P^T (dP^T - D_i)
 *   dV  += P^T dO_i     dK  += dS^T Q_i       (A from registers, B = dO/Q
 *                                              read MN-major)
 *   dQ_i += dS K                              (A = dS^T from shared memory
 *                                              read MN-major)
 * dQ_i leaves through shared memory: each warp stores its fragment to a
 * contiguous run and one lane issues a TMA bulk reduce-add of it into the
 * fp32 accumulator (tiled layout, dq_tiled_index). Per-thread vector
 * atomics from registers kept the L2 82% busy and cost 40% of the d = 256
 * backward (H100: 10.9 ms with, 6.6 ms without). Deterministic mode
 * (a.dq_sem): the same tiles, added in a fixed order (dq_writer; split d:
 * dq_add_split).
 * Computing the transposed scores leaves P^T and dS^T in the accumulator
 * layout, which is the A-register layout of the dV / dK products.
 * Work split (kSplitD): for d <= 128 warpgroup w owns keys 64w..64w+63
 * (Bc = 128) and the full width of dK/dV; for d = 256 the accumulators of
 * 64 keys do not fit one warpgroup, so both own the same 64 keys (Bc = 64),
 * each recomputes S^T and dP^T and accumulates one 128-wide half of dK/dV.
 * The dQ product is split over the two warpgroups by columns.
 *
 * The kernel template and its launch<> live here, its tile shapes and
 * per-mode shared-memory parts in attn_bwd_wgmma_traits.cuh, its loads
 * (K/V, each step's tiles and coordinates) in attn_bwd_wgmma_load.cuh, its
 * dQ path (product, staging, reduce-adds, det turns) in
 * attn_bwd_wgmma_dq.cuh, the score tile's elements (modifiers, masks, P^T
 * and dropout, the softcap's factor, dbias) in attn_bwd_wgmma_score.cuh;
 * each kMode is instantiated in a translation unit of its own
 * (attn_bwd_wgmma_mode<k>.cu, k = 0..7, mode 5 at d = 128 alone, built for
 * sm_90a only) so the kernels compile in parallel, and
 * attn_bwd_wgmma_dispatch.cu calls them through
 * the extern declarations at the end. */
#ifndef FG_KERNELS_ATTN_BWD_WGMMA_CUH
#define FG_KERNELS_ATTN_BWD_WGMMA_CUH

#include "attn_bwd_wgmma_dq.cuh"
#include "attn_bwd_wgmma_load.cuh"
#include "attn_bwd_wgmma_score.cuh"
#include "attn_bwd_wgmma_traits.cuh"
#include "attn_common.cuh"
#include "attn_kernels.h"
#include "kernels/runtime/cuda_check.h"
#include "tma_map.h"
#include "wgmma_epilogue.cuh"
#include "wgmma_sm90.cuh"

#include <type_traits>

namespace fg {

/* kWide: 128 queries a step at d = 64 (kModes 0-3, 6 and 7, the
 * deterministic dQ's turns included; FG_ATTN_BWD_WIDE=0 turns it off.
 * The masks, block walks, modifiers and sequence offsets are written for
 * any Br, and a packed tile's rows past its sequence get P = 0 from their
 * padded lse2 as with 64 rows). With 64-query steps
 * the d = 64 consumers spent their time in each step's hand-offs (the
 * fences, arrivals and waits around P / dS^T and the ping-pong; ncu,
 * H200, session 23) rather than in the 64 x 64 x 64 products;
 * FlashAttention-3 runs d = 64 with 128-query steps. The same products
 * on twice the queries: S^T and dP^T are 64 keys x 128 queries a
 * warpgroup, dS^T is stored as two 64-query panels, and the dQ product is
 * split by queries (warpgroup w: queries 64w.., all 64 columns, panel w
 * of dS^T) instead of by columns, so each warp stages runs w and 4 + w of
 * 64-row tile w (the same tiled dq_acc). dQ runs after dK's product
 * (kEarlyDQ's 32 registers would not fit beside S^T and dP^T); nq_pad is
 * a multiple of 128 so the last step's stats and dQ tiles stay inside. */
/* kDet (split d only): the deterministic dQ turns (dq_add_split), a kernel
 * of their own so that the default d = 256 kernel keeps its registers
 * (232; with det a runtime test, 248 and 3% slower on an H200). */
/* kQ80 (d = 128, kMode 0, no dropout, not deterministic): 80-query steps,
 * as FlashAttention-3's unmasked d = 128 backward, so each key block's
 * walk has 1.25x fewer steps and dQ reduce-adds per product. S^T and dP^T
 * are 64 keys x 80 queries a warpgroup (40 registers each), dV and dK
 * take five 16-query k steps. dQ cannot be M = 80 (wgmma's M is 64 a
 * warpgroup), so the dQ product runs transposed: dQ_i^T = K^T dS^T,
 * warpgroup w taking d's rows 64w..64w + 63 (A = K's panel w read
 * MN-major) over the 80 queries (N = 80), and B = dS stored [query][key]
 * K-major (stmatrix .trans) in two 64-key panels of 80 rows, which the
 * 128-byte swizzle allows where dS^T [key][query] read MN-major (80 is no
 * multiple of its 64-element rows) would not. The staged runs are dQ^T
 * fragments: dq_acc holds 80-query transposed tiles (dq_t80_index,
 * AttnArgs::dq_tile_q), nq_pad a multiple of 320. The dQ product of step i
 * runs after dK's product of step i + 1, as at d = 128 otherwise. */
template <typename T, int D, int kMode, bool kDropout, bool kWide, bool kDet = false,
          bool kQ80 = false>
__global__ void __launch_bounds__(BwdSpec<D, kDropout>::kThreads, 1)
attn_bwd_wgmma_kernel(const __grid_constant__ AttnArgs args,
                      const __grid_constant__ CUtensorMap tmQ,
                      const __grid_constant__ CUtensorMap tmK,
                      const __grid_constant__ CUtensorMap tmV,
                      const __grid_constant__ CUtensorMap tmO,
                      const __grid_constant__ CUtensorMap tmB,
                      const __grid_constant__ CUtensorMap tmDB, const int bias_flags,
                      const int order)
{
#ifdef FG_WGMMA_ENABLED
    /* kModes 3 and 7 run the key blocks of sequence b of a packed or key-padded
     * batch as a problem of its own (seq_args), as the forward does: the
     * TMA maps span the packed rows (batch 0) and tiles start at the
     * sequence's first row. Query rows of a neighbouring sequence that a
     * tile reads get P = 0 (their padded lse2 is +inf); its key rows are
     * masked and never stored. lse2, D and the dQ tiles keep the padded
     * [B, H, nq_pad] layout (nq_pad: the longest sequence). */
    constexpr bool kRagged = kmode_ragged(kMode);
    /* The grid: (key block, head, batch); kMode 5 with bias_flags bit 3
     * (a dbias broadcast over the batch, by reductions): (batch, key
     * block, head), so that the blocks adding into the same dbias tile
     * run together and their reductions meet in the L2 (H100, [H, 2k, 2k]
     * fp32 sums of 8 batches: otherwise one DRAM read-modify-write of the
     * 268 MB of sums per batch). The blocks of one (batch, head) keep
     * their order, as the deterministic dQ needs. */
    const bool bfirst = kMode == 5 && (bias_flags & 8);
    /* otherwise (key block, head, batch), longest first under a mask
     * (grid_pos; order 0, the natural order, in deterministic mode, whose
     * dQ turns wait on the later key blocks of the same head) */
    int gx, hk, b;
    if (bfirst) {
        gx = (int)blockIdx.y;
        hk = (int)blockIdx.z;
        b = (int)blockIdx.x;
    } else {
        int pair;
        grid_pos(order, &gx, &pair);
        hk = pair % args.Hk;
        b = pair / args.Hk;
    }
    AttnArgs seq;
    int64_t q_row0 = 0, k_row0 = 0;
    int tb = b, nk_rows = args.Nk; /* TMA batch coordinate; key rows */
    using SeqSmem = BwdSeqSmem<D, kMode>;
    if constexpr (kRagged) {
        if constexpr (SeqSmem::value) { /* seq_s below (seq_patch's key rows) */
            if (args.cu_q)
                nk_rows = args.cu_k[b + 1] - args.cu_k[b];
        } else {
            seq = seq_args<T, float>(args, b, &nk_rows);
            seq.dq_acc = args.dq_acc;
        }
        if (args.cu_q) {
            q_row0 = args.cu_q[b];
            k_row0 = args.cu_k[b];
            tb = 0;
        }
        if ((int64_t)gx * BwdWgTile<D>::kBc >= nk_rows)
            return; /* past this sequence: the grid fits the longest */
    }
    static_assert(!kWide || (D == 64 && kMode != 4 && kMode != 5), "wide steps: no bias");
    static_assert(!kQ80 || (D == 128 && kMode == 0 && !kDropout && !kWide && !kDet),
                  "80-query steps: d = 128, kMode 0, no dropout");
    using Tile = BwdTile<D, kWide, kQ80>;
    /* Two forms of 8aa980e measured on an H200 (session 22), kept where
     * each is faster: the warpgroup index by a shuffle from lane 0
     * (CUTLASS's canonical_warp_group_idx: the compiler knows it is
     * warp-uniform) and the wgmma descriptors built once per tile
     * (WgDescAt) gain with dropout (d = 64 +7%); without dropout the plain
     * index gains 3-6% and descriptors once per tile lose at d = 128. */
    constexpr bool kWgShfl = kDropout, kDescOnce = kDropout || D == 64;
    using Desc = WgDescAt<kDescOnce>;
    constexpr bool kSpec = BwdSpec<D, kDropout>::value;
    constexpr bool kEarlyDQ = BwdSpec<D, kDropout>::kEarlyDQ && !kWide;
    /* P^T packed beside dS^T and dV issued with dK (below), where P^T,
     * its packed copy, dP^T and both A fragments would not fit beside dK
     * and dV: the wide d = 64 steps, and kQ80 (128 + 40 + 40 + 20 + 20
     * registers: ptxas serialised every wgmma, C7512). */
    constexpr bool kLateDV = kWide || kQ80;
    const bool drop = kDropout && (!BwdDropRT<D, kMode>::value || args.dropout);
    constexpr int Bc = Tile::kBc, Br = Tile::kBr, DH = Tile::kDH;
    using DQPath = BwdDQ<T, D, kMode, kWide, kQ80, Desc>;
    constexpr int DQW = DQPath::DQW; /* columns of a warpgroup's dQ product */
    using Loads = BwdLoads<T, D, kMode, kWide, kQ80>; /* K/V and each step's tiles */
    using StepAt = typename Loads::StepAt;
    using Score = BwdScore<T, D, kMode, kDropout, kWide, kQ80>; /* the score tile's elements */
    using Keep = typename Score::Keep; /* dropout keep bits, one per score element (Br / 2) */
    constexpr uint32_t qtile = Br * D * 2;   /* bytes of one Q or dO tile */
    extern __shared__ unsigned char smem[];
    const uint32_t base = smem_u32(smem);
    const uint32_t sK = (base + 1023) & ~1023u;
    const uint32_t sV = sK + Bc * D * 2;
    const uint32_t sQ0 = sV + Bc * D * 2;    /* buffer b: Q at + 2b qtile, dO after */
    const uint32_t sdS0 = sQ0 + 4 * qtile;   /* dS^T [Bc][Br], one 64-wide panel, x kDSBufs */
    const uint32_t sP = sdS0 + Tile::kDSBufs * Bc * Br * 2; /* split d only: P^T Z [Bc][Br] */
    const uint32_t sStage = sP + Tile::kPBytes; /* d <= 128: dQ_i [Br][D] floats */
    using BiasTile = BwdBiasTile<D, kMode>;
    const uint32_t sBias = sStage + Tile::kStageBytes; /* BiasTile: [2][Br][Bc] */
    /* BiasTile: the bias by TMA (Loads, Score: btma), and dS into the
     * stage (dbtma), stored to dbias by TMA when there is one (bias_flags
     * bit 1) */
    constexpr bool dbtma = BiasTile::value;
    AttnArgs *seq_s = (AttnArgs *)(smem + (sStage - base) + Tile::kStageBytes + BiasTile::kBytes);
    float *lse2_s = (float *)((unsigned char *)seq_s + SeqSmem::kBytes); /* [2][Br] */
    float *D_s = lse2_s + 2 * Br;                                  /* [2][Br] */
    /* split d only, after the mbarriers: P^T [Br/2][128] and the dropout
     * bits [128], thread-major */
    float *xch = (float *)((unsigned char *)(D_s + 2 * Br) + 128);
    uint32_t *keep_x = (uint32_t *)(xch + (Br / 2) * 128);

    const int wg = kWgShfl ? __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0)
                           : (int)threadIdx.x >> 7;
    const int warp = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int key_base = Tile::kSplitD ? 0 : 64 * wg; /* this WG's keys */
    const int dslice = Tile::kSplitD ? DH * wg : 0;   /* its dK/dV columns */
    /* det (a.dq_sem): each dQ_i tile is summed in a fixed order of key
     * blocks, from the last to the first (dq_writer; split d: each warp's
     * lane 0, dq_add_split); blocks are numbered backwards so that,
     * started in grid order, a block only ever waits for blocks started
     * before it. */
    static_assert(!kDet || Tile::kSplitD, "kDet: split d only");
    const bool det = Tile::kSplitD ? kDet : kSpec && !kQ80 && args.dq_sem != nullptr;
    const int kb = det ? (nk_rows + Bc - 1) / Bc - 1 - gx : gx;
    const int64_t j0 = (int64_t)kb * Bc;
    const int kvalid = (int)min((int64_t)Bc, (int64_t)nk_rows - j0); /* rows stored */
    const float scale_log2 = (float)(args.scale * 1.4426950408889634);

    /* TMA: K and V once, then per step Q_i, dO_i (64-column panels) and
     * the 64 lse2 / D values (bulk copies), double-buffered; thread 0
     * (kSpec: the producer) issues, mbarriers signal (bar_kv,
     * bar_q[buffer]); kSpec: the consumer threads release a buffer on
     * free_q[buffer]. */
    const uint32_t bar_kv = smem_u32(D_s + 2 * Br), bar_q = bar_kv + 8, free_q = bar_kv + 24;
    const uint32_t ds_full = bar_kv + 40; /* kSpec: dS^T [buffer] stored by both WGs */
    /* det: the dQ staging of step s filled by every consumer thread
     * (dq_full[s & 1]) and read by writer s & 1's bulk reduces
     * (dq_empty[s & 1]) */
    const uint32_t dq_full = bar_kv + 56, dq_empty = bar_kv + 72;
    /* The step's coordinates travel with its buffer: whoever issues step
     * st's loads writes its first query row, head and flags (bit 0 dead,
     * bit 1 needs the per-element mask) into step_info[st & 1] before the
     * arrival that the consumers' wait on bar_q acquires. The consumers
     * read them instead of locating the step themselves (a division, the
     * block list's global load and the band test on every step's path). */
    int4 *step_info = reinterpret_cast<int4 *>(smem + (bar_kv + 96 - base)); /* [2] */
    if constexpr (SeqSmem::value) { /* args, a word a thread, then thread 0 moves it to b */
        const uint32_t *src = reinterpret_cast<const uint32_t *>(&args);
        for (int i = threadIdx.x; i < (int)(sizeof(AttnArgs) / 4); i += blockDim.x)
            reinterpret_cast<uint32_t *>(seq_s)[i] = src[i];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if constexpr (SeqSmem::value) {
            seq_patch<T, float>(*seq_s, args, b);
            seq_s->dq_acc = args.dq_acc;
        }
        for (int i = 0; i < 3; i++)
            mbar_init(bar_kv + 8 * i, 1);
        if (kSpec) {
            for (int i = 0; i < 4; i++) /* free_q[2], ds_full[2]: every consumer thread */
                mbar_init(free_q + 8 * i, 256);
            for (int i = 0; i < 2; i++) {
                mbar_init(dq_full + 8 * i, 256);
                mbar_init(dq_empty + 8 * i, 1);
            }
        }
        mbar_init_fence();
    }
    __syncthreads();
    const AttnArgs &a = SeqSmem::value ? *seq_s : kRagged ? seq : args;

    /* The (head, query block) steps (QuerySteps, attn_walk.cuh). */
    constexpr bool kCausal = kMode == 1, kMasked = kMode >= 2;
    constexpr bool kMods = kmode_mods(kMode); /* softcap, ALiBi (none in 6, 7) */
    constexpr bool kBias = kMode == 4 || kMode == 5;
    QuerySteps steps;
    steps.init(a, kMasked, kCausal, b, hk, j0, Bc, Br);
    /* Broadcast from lane 0: read from shared memory (kModes 3, 7) it would
     * not be warp-uniform to the compiler, nor would the step loop's
     * counter and the Q_i / dO_i buffer descriptors built from it (a
     * 64-bit vector add and two R2UR per wgmma). */
    const int64_t total = __shfl_sync(0xffffffffu, (long long)steps.total, 0);
    /* the loads: K_j, V_j and each step's Q_i, dO_i, lse2, D (and bias);
     * rot is set below, after K_j and V_j are on their way, as before the
     * loads were an object (the deterministic d = 256 kernels' SASS) */
    bool rot;
    const Loads ld{args, a,      tmQ,  tmK,   tmV, tmO, tmB,   b,   hk,     kb,   tb,
                   q_row0, k_row0, j0, total, rot, steps, step_info, sK, sV, sQ0, sBias,
                   bar_kv, bar_q, lse2_s, D_s};
    /* K_j, V_j only for a block with steps, as the producer does: one
     * without would exit with the load still writing its shared memory
     * (split d, the only kernel here, keeps the register epilogue) */
    if (!kSpec && total > 0 && threadIdx.x == 0)
        ld.load_kv();
    /* det without a mask (a.dq_rotate): block kb takes step kb first and
     * the others cyclically after it, so that at any moment the blocks of
     * a head add to different dQ tiles, each tile's turns in the order the
     * blocks reach it (dq_writer). Walked all from step 0 instead, block kb
     * waits at its first step for every block above it: a chain of turns
     * (a bulk reduce each) before it can start, about as long as the
     * blocks' whole work at N = 2k. Every block of the head must be able
     * to run at once (block nk - 1 waits for block 0, started last): the
     * launch sets dq_rotate only where they fit twice over. */
    const int nkb = (nk_rows + Bc - 1) / Bc;
    rot = det && kMode == 0 && a.dq_rotate && total >= nkb;
    /* the dQ path: products, staging, reduce-adds, det turns */
    DQPath dq(args, a, base, sK, sdS0, sStage, ds_full, dq_full, dq_empty, b, hk, kb, wg, warp,
              lane, det, rot, total);

    if constexpr (kSpec) {
        if (threadIdx.x >= 256) { /* the producer warpgroup: loads only */
            setmaxnreg_dec<24>();
            if (threadIdx.x == 256 && total > 0) {
                ld.load_kv();
                StepAt next = kRagged ? ld.where(0) : StepAt{};
                for (int64_t st = 0; st < total; st++) {
                    if (st >= 2) /* step st - 2 released the buffer */
                        mbar_wait(free_q + 8 * (uint32_t)(st & 1), (uint32_t)((st >> 1) - 1) & 1);
                    if constexpr (kRagged) {
                        ld.load_step(st, next, 0);
                        if (st + 1 < total)
                            next = ld.where(st + 1);
                    } else {
                        ld.issue(st);
                    }
                }
            } else if (det && threadIdx.x >= 288 && threadIdx.x < 352) {
                dq.dq_writer((threadIdx.x - 288) / 32,
                             [&](int64_t s, int &gh, int64_t &i0, bool &dead) {
                                 ld.locate(s, gh, i0, dead);
                             });
            }
            return;
        }
        setmaxnreg_inc<240>();
    }

    float dk[DH / 2], dv[DH / 2];
#pragma unroll
    for (int i = 0; i < DH / 2; i++)
        dk[i] = dv[i] = 0.f;

    if (!kSpec && total > 0 && threadIdx.x == 0)
        ld.issue(0);
    /* Ping-pong: warpgroup w waits on named barrier 1 + w before issuing
     * S^T and dP^T, and lets the other go once S^T has landed; warpgroup
     * 1 opens and skips the hand-off after its last step. */
    if (kSpec && wg == 1 && total > 0)
        named_arrive(1, 256);
    int64_t prev_i0 = 0, prev_bh = 0; /* kSpec: the step whose dQ is due */
    int slope_h = -1; /* the head of slope_c */
    float slope_c = 0.f;
    const float scale_f = (float)a.scale, inv_scale = (float)(1.0 / a.scale);
    const float inv_cap = kMods && a.softcap > 0.f ? 1.f / a.softcap : 0.f;
    const float cap_k = inv_cap * 0.6931471805599453f; /* ln 2 / cap */
    /* The softcap alone (no ALiBi, no bias): S^T kept as t = tanh(scale
     * s / cap) and P = exp2(t cap log2(e) - lse2) (the forward's
     * cap_units): one FMUL and the tanh an element, not four FMULs. */
    const bool cap_units = !kBias && kMasked && kMods && a.softcap > 0.f && !a.alibi;
    const float cap_k1 = scale_f * inv_cap, cap_k2 = kMods ? a.softcap * inv_scale : 0.f;
    const float exp_k = cap_units ? (float)(a.softcap * 1.4426950408889634) : scale_log2;
    const int64_t bias_s0 = a.bias_s[0], bias_s1 = a.bias_s[1], bias_s2 = a.bias_s[2],
                  bias_s3 = a.bias_s[3];
    const void *bias_p = a.bias;
    const bool bias_f32 = a.bias_f32;
    /* dbias by store (its strides dbs) or by atomics (the accumulator's, dba) */
    const bool dbias_store = kBias && a.dbias_mode == kDbiasStore;
    const bool dbias_atomic = kBias && a.dbias_mode == kDbiasAtomic;
    int64_t dbs[4], dba[4];
#pragma unroll
    for (int x = 0; x < 4; x++) {
        dbs[x] = a.dbias_s[x];
        dba[x] = a.dbias_acc_s[x];
    }
    for (int64_t st = 0; st < total; st++) {
        const uint32_t sQ = sQ0 + (uint32_t)(st & 1) * 2 * qtile, sdO = sQ + qtile;
        const float *lse2 = lse2_s + (st & 1) * Br, *Dv = D_s + (st & 1) * Br;
        const uint32_t sdS = dq.step_sdS(st);
        /* Prefetch: the buffer was released by the last barrier (split d:
         * issued later, once the dQ reduces staged in it have read it). */
        if (!kSpec && !Tile::kSplitD && st + 1 < total && threadIdx.x == 0)
            ld.issue(st + 1);
        if (st == 0)
            mbar_wait(bar_kv, 0);
        mbar_wait(bar_q + 8 * (uint32_t)(st & 1), (uint32_t)(st >> 1) & 1);
        const int4 info = step_info[st & 1]; /* written with step st's loads */
        const int64_t i0 = (int64_t)(((uint64_t)(uint32_t)info.y << 32) | (uint32_t)info.x);
        const int gh = info.z;
        const bool dead = kMasked && (info.w & 1), need_mask = (info.w & 2) != 0;
        const int h = hk * a.group + gh;
        const int64_t bh = (int64_t)b * a.H + h;
        /* The step's values of the score tile's elements (BwdScore) */
        const float ks = (float)a.keep_scale;
        /* The head's ALiBi slope, loaded when the head changes (a load per
         * step sat on every step's critical path). */
        if (kMasked && kMods && a.alibi && h != slope_h) {
            slope_c = a.alibi[b * a.alibi_sb + h];
            slope_h = h;
        }
        const float slope = slope_c;
        /* ALiBi's |i - j + shift| of the thread's element 0 */
        const float dist0 = kMasked && kMods && a.alibi
                                ? (float)(int)(i0 + 2 * t4 + a.shift - (j0 + key_base + 16 * warp + g))
                                : 0.f;
        /* any score modifier to apply (Score::mask) */
        const bool mods = kBias || (kMasked && kMods && (a.softcap > 0.f || a.alibi));
        /* kBias: the bias's base offset and row / key bounds (Score::bias_of) */
        const int64_t i_t = i0 + 2 * t4, j_t = j0 + key_base + 16 * warp + g;
        const int64_t bias_base = kBias ? b * bias_s0 + h * bias_s1 + i_t * bias_s2 + j_t * bias_s3
                                        : 0;
        const int rows_left = kBias ? (int)min((int64_t)a.Nq - i_t, (int64_t)Br) : 0;
        const int keys_left = kBias ? (int)min((int64_t)a.Nk - j_t, (int64_t)Bc) : 0;
        /* btma: this warpgroup's bias panel (its keys are panel wg) of the
         * step's stage */
        const uint32_t sBw = sBias + (uint32_t)(st & 1) * (uint32_t)BiasTile::kStage + wg * Br * 128;
        /* kBias: dbias's offset of element 0 (Score::put_dbias) */
        const int64_t dbias_base = kBias && dbias_store ? b * dbs[0] + h * dbs[1] + i_t * dbs[2] +
                                                              j_t * dbs[3]
                                 : kBias && dbias_atomic ? b * dba[0] + h * dba[1] + i_t * dba[2] +
                                                               j_t * dba[3]
                                                         : 0;
        const Score score{a,        base,      b,         wg,           warp,     lane,
                          g,        t4,        key_base,  j0,           drop,     xch,
                          inv_scale, inv_cap,  cap_k,     cap_k1,       cap_k2,   exp_k,
                          cap_units, bias_s2,  bias_s3,   bias_p,       bias_f32, dbias_store,
                          dbias_atomic, dbs,   dba,       st,           i0,       bh,
                          dead,     need_mask, slope,     dist0,        ks,       lse2,
                          bias_base, dbias_base, rows_left, keys_left,  sBw};
        /* Two packed 16-bit pairs of score tile qt into a [key][query] panel
         * (dS^T for dQ, or P^T Z). */
        auto store_t = [&](uint32_t buf, int qt, uint32_t lo, uint32_t hi) {
            const int key0 = key_base + 16 * warp + g;
            unsigned char *p = smem + (buf - base);
            *reinterpret_cast<uint32_t *>(p + pswz(key0, qt, Bc) + 4 * t4) = lo;
            *reinterpret_cast<uint32_t *>(p + pswz(key0 + 8, qt, Bc) + 4 * t4) = hi;
        };
        /* store_t of tiles 2 kk and 2 kk + 1 at once by stmatrix: r = {lo,
         * hi of tile 2 kk, lo, hi of 2 kk + 1} is the accumulator layout of
         * four 8 x 8 matrices (keys +0 / +8 of this warp's 16 by query
         * chunks 2 kk, 2 kk + 1); lane L gives row L % 8 of matrix L / 8.
         * One store instead of four, with one address. */
        auto store_t4 = [&](uint32_t buf, int kk, const uint32_t (&r)[4]) {
            const int key = key_base + 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
            /* chunk < Br / 8: Br / 64 panels */
            stmatrix_x4(buf + pswz(key, (2 * kk + (lane >> 4)) & (Br / 8 - 1), Bc), r);
        };
        /* kQ80: the same four matrices transposed into dS [query][key]
         * (dQ^T's B operand: 64-key panels of Br rows): lane L gives query
         * row 8 (2 kk + L / 16) + L % 8 of matrix L / 8, whose 8 keys
         * start at key_base + 16 warp + 8 ((L / 8) % 2), this warpgroup's
         * panel. */
        auto store_ds4 = [&](uint32_t buf, int kk, const uint32_t (&r)[4]) {
            const int qrow = 8 * (2 * kk + (lane >> 4)) + (lane & 7);
            const int key = key_base + 16 * warp + 8 * ((lane >> 3) & 1);
            stmatrix_x4_trans(buf + pswz(qrow, key >> 3, Br), r);
        };
        const uint32_t boff = (dslice / 64) * Br * 128; /* this WG's d panels */
        /* dV's and dK's B operands (dO_i, Q_i read MN-major, this WG's d
         * panels); k step kk is 16 rows on, 2048 bytes */
        const Desc dOp(sdO + boff, Br * 128, 1024), dQp(sQ + boff, Br * 128, 1024);
        uint32_t pf[Br / 16][4], sf[Br / 16][4];        /* A fragments for dV, dK */
        /* The dV/dK wgmma read pf/sf asynchronously: keep them live (in
         * their registers) until it has completed. */
        auto keep_frags = [&]() {
#pragma unroll
            for (int kk = 0; kk < Br / 16; kk++)
#pragma unroll
                for (int x = 0; x < 4; x++)
                    asm volatile("" : "+r"(pf[kk][x]), "+r"(sf[kk][x])::"memory");
            wg_fence_regs(dk);
            wg_fence_regs(dv);
        };

        if constexpr (Tile::kSplitD) {
            /* d = 256: WG 0 computes S^T, WG 1 dP^T (64 keys x 64 queries
             * over all of d, instead of both computing both); P^T and the
             * dropout bits cross over through shared memory - thread t of
             * WG 1 reads what thread t of WG 0 wrote (same fragment slots).
             * dV and dK then read P^T Z and dS^T from shared memory. */
            float acc[Br / 2];
            const Desc dA(wg == 0 ? sK : sV, 16, 1024), dB(wg == 0 ? sQ : sdO, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                WgmmaOp<T, Br>::template ss<0, 0>(
                    acc, dA((kk >> 2) * Bc * 128 + (kk & 3) * 32),
                    dB((kk >> 2) * Br * 128 + (kk & 3) * 32), kk > 0);
            wg_commit();
            wg_wait<0>();
            wg_fence_regs(acc);
            const int tid = threadIdx.x & 127;
            if (wg == 0) {
                if (need_mask || mods)
                    score.mask(acc);
                uint32_t keep;
                score.probs(acc, keep);
#pragma unroll
                for (int kk = 0; kk < Br / 16; kk++) {
                    uint32_t r[4];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int x = 8 * kk + 4 * h;
                        r[2 * h] = pack2<T>(acc[x] * score.zf(keep, x),
                                            acc[x + 1] * score.zf(keep, x + 1));
                        r[2 * h + 1] = pack2<T>(acc[x + 2] * score.zf(keep, x + 2),
                                                acc[x + 3] * score.zf(keep, x + 3));
                    }
                    store_t4(sP, kk, r);
                }
                fence_proxy_async(); /* P^T Z stores -> the dV wgmma reads */
                /* P^T to WG 1 as float4 [e / 4][thread]: 8 stores, not 32 */
#pragma unroll
                for (int e = 0; e < Br / 2; e += 4)
                    reinterpret_cast<float4 *>(xch)[(e >> 2) * 128 + tid] =
                        make_float4(acc[e], acc[e + 1], acc[e + 2], acc[e + 3]);
                keep_x[tid] = keep;
            }
            /* warps 2-3: their last reduces have read the dO_i tile */
            if (lane == 0 && (warp >> 1))
                bulk_wait_read<0>();
            __syncthreads();
            StepAt nxt{};
            if (st + 1 < total && threadIdx.x == 0) {
                nxt = ld.where(st + 1);
                ld.load_step(st + 1, nxt, 1);
            }
            /* dV += (P^T Z) dO_i (L.17), this WG's half of d: issued now,
             * so it runs while warpgroup 1 computes dS^T (and warpgroup 0
             * waits for it) instead of after. A K-major from shared
             * memory, B read MN-major. */
            const Desc dP0(sP, 16, 1024), dS0(sdS, 16, 1024);
            wg_fence();
            wg_fence_regs(dv);
#pragma unroll
            for (int kk = 0; kk < Br / 16; kk++)
                WgmmaOp<T, DH>::template ss<0, 1>(dv, dP0(kk * 32), dOp(kk * 2048), 1);
            wg_commit();
            if (wg == 1) { /* dS^T = P^T (dP^T Z - D_i) (Alg4 L.19-21) */
                const uint32_t keep = drop ? keep_x[tid] : 0;
                uint32_t r[4];
#pragma unroll
                for (int qt = 0; qt < Br / 8; qt++) {
                    float ds[4];
                    const float4 p4 = reinterpret_cast<const float4 *>(xch)[qt * 128 + tid];
                    const float2 lc =
                        kMods && a.softcap > 0.f ? score.cap_rows(qt) : make_float2(0.f, 0.f);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int x = 4 * qt + e;
                        const float p = e == 0 ? p4.x : e == 1 ? p4.y : e == 2 ? p4.z : p4.w;
                        const float dl =
                            p * (acc[x] * score.zf(keep, x) - Dv[8 * qt + 2 * t4 + (e & 1)]);
                        score.put_dbias(p, x, dl);
                        ds[e] = dl * score.cap_grad(p, x, (e & 1) ? lc.y : lc.x);
                    }
                    r[2 * (qt & 1)] = pack2<T>(ds[0], ds[1]);
                    r[2 * (qt & 1) + 1] = pack2<T>(ds[2], ds[3]);
                    if (qt & 1)
                        store_t4(sdS, qt >> 1, r);
                }
            }
            fence_proxy_async();
            /* Each warp's dQ reduce of the last step read its staging run
             * out of the buffer the next prefetch overwrites: warps 0-1
             * (the Q_i tile) waited for here, warps 2-3 (dO_i) before the
             * first barrier, not all before the softmax: the reduces run
             * while P^T and dS^T are computed (ncu, H200, N 4k: the warps
             * waited at the earlier wait for 24% of the kernel's stall
             * samples, the L2 66% busy with the reduces). */
            if (lane == 0 && !(warp >> 1))
                bulk_wait_read<0>();
            __syncthreads();
            if (st + 1 < total && threadIdx.x == 0)
                ld.load_step(st + 1, nxt, 2);
            /* dK += dS^T Q_i (L.23), this WG's half of d. */
            wg_fence();
            wg_fence_regs(dk);
#pragma unroll
            for (int kk = 0; kk < Br / 16; kk++)
                WgmmaOp<T, DH>::template ss<0, 1>(dk, dS0(kk * 32), dQp(kk * 2048), 1);
            wg_commit();
        } else {
            /* S^T = K Q_i^T (Alg4 L.12) and dP^T = V dO_i^T (L.18) in two
             * commit groups, so P^T is computed while dP^T is still on the
             * tensor cores, and dS^T while dV's product is. kSpec: the
             * dQ product of the step before goes between them and the
             * softmax (kEarlyDQ) or after dK's product. */
          /* kPrev: a dQ product of the step before is due (kSpec); a
           * compile-time flag, so that each wgmma wait has one meaning. */
          auto body = [&](auto prev_c) {
            constexpr bool kPrev = decltype(prev_c)::value;
            float s[Br / 2], dp[Br / 2], qp[DQW / 2];
            if constexpr (kSpec)
                named_sync(1 + wg, 256);
            /* K-major tiles in 64-wide panels: k step kk is panel kk / 4,
             * 32 bytes a step into its 128-byte rows */
            const Desc dK(sK + key_base * 128, 16, 1024), dV(sV + key_base * 128, 16, 1024),
                dQ(sQ, 16, 1024), dO(sdO, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                WgmmaOp<T, Br>::template ss<0, 0>(
                    s, dK((kk >> 2) * Bc * 128 + (kk & 3) * 32),
                    dQ((kk >> 2) * Br * 128 + (kk & 3) * 32), kk > 0);
            wg_commit();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                WgmmaOp<T, Br>::template ss<0, 0>(
                    dp, dV((kk >> 2) * Bc * 128 + (kk & 3) * 32),
                    dO((kk >> 2) * Br * 128 + (kk & 3) * 32), kk > 0);
            wg_commit();
            if constexpr (kEarlyDQ && kPrev) {
                dq.wait_ds(st - 1);
                dq.dq_issue(qp, st - 1);
                wg_wait<2>(); /* S^T */
            } else {
                wg_wait<1>();
            }
            wg_fence_regs(s);
            if (kSpec && (wg == 0 || st + 1 < total))
                named_arrive(2 - wg, 256);
            if (need_mask || mods)
                score.mask(s);
            /* kCapG: the softcap alone keeps dS^T's factor from S^T
             * (BwdScore::cap_keep) instead of recovering it from P. Not
             * in the d = 128 dropout kernels: there it spilled 2.4x as
             * much and every kMode 2 call ran slower (H200, N 8k, p 0.1:
             * softcap + causal 366 -> 316 TFLOP/s, ALiBi + causal 415 ->
             * 345). The wide d = 64 kernels spill 1.7x as much with it
             * and still gain (260 -> 320). The packed kernels (kMode 3)
             * have it too, except the wide d = 64 ones, which spilled
             * 1.8-2.3x as much (H200, softcap 30 + causal, packed,
             * d = 128: N 8k 402-404 -> 457-460, N 2k 310 -> 344). */
            constexpr bool kCapG = kMasked && kMods && !(kRagged && kWide) && !(kDropout && D == 128);
            uint32_t cg[Br / 4];
            if (kCapG && cap_units)
                score.cap_keep(s, cg);
            Keep keep;
            score.probs(s, keep); /* s keeps P^T before dropout, for dS^T */
            /* dV += (P^T Z) dO_i (Alg4 L.17): B read MN-major, 16 queries
             * per k-step, LBO = one d panel of Br rows. kLateDV: P^T packed
             * with dS^T below and dV issued with dK, so that P^T (fp32),
             * its packed copy and dP^T are never live together (64 + 32 +
             * 64 registers: ptxas serialised the wgmma). */
            auto dv_issue = [&]() {
                wg_fence_regs(dv);
#pragma unroll
                for (int kk = 0; kk < Br / 16; kk++)
                    WgmmaOp<T, DH>::template rs<1>(dv, pf[kk], dOp(kk * 2048), 1);
            };
            auto pack_p = [&](int qt) {
                const int x = 4 * qt;
                pf[qt >> 1][(qt & 1) * 2] =
                    pack2<T>(s[x] * score.zf(keep, x), s[x + 1] * score.zf(keep, x + 1));
                pf[qt >> 1][(qt & 1) * 2 + 1] =
                    pack2<T>(s[x + 2] * score.zf(keep, x + 2), s[x + 3] * score.zf(keep, x + 3));
            };
            if constexpr (!kLateDV) {
#pragma unroll
                for (int qt = 0; qt < Br / 8; qt++)
                    pack_p(qt);
                wg_fence();
                dv_issue();
                wg_commit();
            }
            if constexpr (kLateDV) /* dP^T */
                wg_wait<0>();
            else if constexpr (kEarlyDQ && kPrev) /* dP^T (dQ's and dV's products may still run) */
                wg_wait<2>();
            else
                wg_wait<1>();
            wg_fence_regs(dp);

            /* dS^T = P^T (dP^T Z - D_i) (Alg4 L.19-21), to registers for dK
             * and (below) to shared memory ([key][query], one panel) for dQ.
             * The softcap's factor in a copy of its own: with the test per
             * element, kMode 2 issued 22% more instructions than kMode 0
             * on the same work (H200, ncu). */
            auto ds_tile = [&](auto cap_c) {
                /* the softcap's factor: 1 from P (cap_grad), 2 kept (cap_kept) */
                constexpr int kCapM = decltype(cap_c)::value;
                constexpr bool kCap = kCapM == 1;
                uint32_t dbm[4]; /* dbtma: dl of matrices 4u .. 4u + 3, packed */
#pragma unroll
                for (int qt = 0; qt < Br / 8; qt++) {
                    float ds[4], dls[4];
                    if constexpr (kLateDV)
                        pack_p(qt);
                    const float2 Dq = *reinterpret_cast<const float2 *>(Dv + 8 * qt + 2 * t4);
                    const float2 lc = kCap ? score.cap_rows(qt) : make_float2(0.f, 0.f);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int x = 4 * qt + e;
                        const float dl =
                            s[x] * (dp[x] * score.zf(keep, x) - ((e & 1) ? Dq.y : Dq.x));
                        if (dbtma) /* as put_dbias: p = 0 gives 0 (not -0) */
                            dls[e] = s[x] == 0.f ? 0.f : dl;
                        else
                            score.put_dbias(s[x], x, dl);
                        if constexpr (kCapM == 2)
                            ds[e] = dl * score.cap_kept(cg, x);
                        else
                            ds[e] = kCap ? dl * score.cap_grad(s[x], x, (e & 1) ? lc.y : lc.x) : dl;
                    }
                    if (dbtma) { /* over the bias just read (this warp's columns) */
                        dbm[(qt & 1) * 2] = pack2<T>(dls[0], dls[1]);
                        dbm[(qt & 1) * 2 + 1] = pack2<T>(dls[2], dls[3]);
                        if (qt & 1)
                            stmatrix_x4_trans(score.bias_mat(qt >> 1), dbm);
                    }
                    const int kk = qt >> 1, half = (qt & 1) * 2;
                    sf[kk][half] = pack2<T>(ds[0], ds[1]);
                    sf[kk][half + 1] = pack2<T>(ds[2], ds[3]);
                    if (!kSpec)
                        store_t(sdS, qt, sf[kk][half], sf[kk][half + 1]);
                }
            };
            if (kCapG && cap_units)
                ds_tile(std::integral_constant<int, 2>{});
            else if (kMasked && kMods && a.softcap > 0.f)
                ds_tile(std::integral_constant<int, 1>{});
            else
                ds_tile(std::integral_constant<int, 0>{});
            if (dbtma) { /* the warpgroup's dS panel -> dbias rows i0.., keys j0 + 64 wg.. */
                fence_proxy_async();
                named_sync(3 + wg, 128);
                if (threadIdx.x % 128 == 0 && !dead && (bias_flags & 2)) {
                    tma_store_4d(&tmDB, sBw, (int)(j0 + key_base), (int)i0, h, b);
                    bulk_commit();
                }
                if ((bias_flags & 4) && !dead)
                    score.dbias_reduce(i0, h);
            }

            /* dK += dS^T Q_i (Alg4 L.23). */
            wg_fence();
            if constexpr (kLateDV)
                dv_issue();
            wg_fence_regs(dk);
#pragma unroll
            for (int kk = 0; kk < Br / 16; kk++)
                WgmmaOp<T, DH>::template rs<1>(dk, sf[kk], dQp(kk * 2048), 1);
            wg_commit();

            if constexpr (kSpec) {
                /* dQ_{st-1} lands; then dS^T of this step may overwrite
                 * buffer st & 1, whose last readers (both warpgroups'
                 * dQ_{st-2}) finished before the other warpgroup's
                 * arrival on ds_full for step st - 1. */
                if constexpr (kPrev && kEarlyDQ) {
                    wg_wait<2>();
                    wg_fence_regs(qp);
                    dq.dq_store(qp, st - 1, prev_i0, prev_bh, 0);
                } else if constexpr (kPrev) {
                    dq.wait_ds(st - 1);
                    dq.dq_now(qp, st - 1, prev_i0, prev_bh, 0);
                }
                if (!a.deterministic) {
                    /* dS^T by stmatrix: sf[kk] is the accumulator layout of
                     * four 8 x 8 matrices, keys +0 / +8 of this warp's 16 by
                     * query chunks 2 kk, 2 kk + 1 (store_t's layout; lane L
                     * gives row L % 8 of matrix L / 8): 4 stores a step, not
                     * 16 with an address each. kMode 5 keeps store_t (its
                     * registers: the row address cost 118 more spill loads
                     * and stores in the loop with dropout). */
                    if constexpr (kQ80) {
#pragma unroll
                        for (int kk = 0; kk < Br / 16; kk++)
                            store_ds4(sdS, kk, sf[kk]);
                    } else if constexpr (kMode != 5) {
#pragma unroll
                        for (int kk = 0; kk < Br / 16; kk++)
                            store_t4(sdS, kk, sf[kk]);
                    } else {
#pragma unroll
                        for (int qt = 0; qt < Br / 8; qt++)
                            store_t(sdS, qt, sf[qt >> 1][(qt & 1) * 2], sf[qt >> 1][(qt & 1) * 2 + 1]);
                    }
                    fence_proxy_async(); /* dS^T stores -> the wgmma reads */
                    mbar_arrive(ds_full + 8 * (uint32_t)(st & 1));
                }
                wg_wait<0>();
                keep_frags();
                if (dbtma && threadIdx.x % 128 == 0)
                    bulk_wait_read<0>(); /* the dbias store has read the stage */
                /* every product of the step has read Q_i, dO_i, lse2, D */
                mbar_arrive(free_q + 8 * (uint32_t)(st & 1));
            }
          };
            if (kSpec && st > 0 && !a.deterministic)
                body(std::true_type{});
            else
                body(std::false_type{});
            prev_i0 = i0;
            prev_bh = bh;
        }

        if constexpr (!kSpec) { /* split d (d = 256) */
            /* dQ_i += scale dS K (Alg4 L.22) for this step: dS^T was
             * stored and fenced before the step's second barrier. */
            if (!a.deterministic) {
                float q[DQW / 2];
                if (dq.dv_early) {
                    dq.dq_add_early(q, st, gh, i0, bh, dead, sQ);
                } else {
                    dq.dq_now(q, st, i0, bh, sQ);
                    if (det)
                        dq.dq_add_split(st, gh, i0, bh, dead, sQ);
                }
            } else {
                wg_wait<0>();
            }
            keep_frags();
            /* Warpgroup 1's products of this step (its dV reads P^T Z)
             * are done before warpgroup 0 writes P^T Z and the exchange of
             * the next step. A block barrier: session 36 (H200, d = 256)
             * timed it against named barrier 9 (warpgroup 1 arrives,
             * warpgroup 0 waits), an mbarrier, and a wait on warpgroup 1's
             * dV before the step's second barrier: all within 1-2%, the
             * block barrier never slower, and racecheck reported the
             * named barrier's exchange on d = 256 batches only. */
            __syncthreads();
        }
    }

    if constexpr (kSpec) { /* the last step's dQ */
        if (total > 0 && !a.deterministic) {
            float q[DQW / 2];
            dq.wait_ds(total - 1);
            dq.dq_now(q, total - 1, prev_i0, prev_bh, 0);
        }
    }
    if (lane == 0)
        /* the staged dQ runs live in this block's shared memory: they must
         * have been read before it exits; the adds themselves complete
         * with the grid (as CUTLASS's TMA-store epilogues rely on), so no
         * wait for the L2's acknowledgements at the end of every block
         * (split d, det: the last turn waits for them and is passed on) */
        if (Tile::kSplitD && det)
            dq.dq_pass();
        else
            bulk_wait_read<0>();
    /* Alg4 L.25: dK = scale * acc, dV; rows past Nk and padded d skipped.
     * With a.dkv_staged (16-byte rows): through the warp's own 16 rows of
     * the V tile (d <= 128: read only by this warpgroup's dP^T products,
     * all done: every warp of the warpgroup has issued its last dK
     * product; split d: the loop's last block barrier follows every
     * product, and warpgroup wg stages its half of d in V's panels 2 wg,
     * 2 wg + 1), dK then dV (wgmma_epilogue.cuh). A block without steps
     * never loaded V, so no copy can still be landing there. */
    const float sc = (float)a.scale;
    if (a.dkv_staged) { /* set only for 16-byte rows (vec16_ok) */
        const uint32_t sVw = sV + (Tile::kSplitD ? (uint32_t)(2 * wg) * Bc * 128 : 0u);
        const int kr0 = key_base + 16 * warp;
        const int nr = min(16, kvalid - kr0);
        const unsigned char *vp = smem + (sVw - base);
        warp_rows_out<T, DH>(dk, sc, sc, sVw, vp, Bc * 128, (uint32_t)kr0,
                             elem<T>(a.dk, b, j0 + kr0, hk) + dslice, a.dk.ss, nr, a.d - dslice);
        warp_rows_out<T, DH>(dv, 1.f, 1.f, sVw, vp, Bc * 128, (uint32_t)kr0,
                             elem<T>(a.dv, b, j0 + kr0, hk) + dslice, a.dv.ss, nr, a.d - dslice);
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int kr = key_base + 16 * warp + g + 8 * r;
        if (kr >= kvalid)
            continue;
        T *dkp = elem<T>(a.dk, b, j0 + kr, hk), *dvp = elem<T>(a.dv, b, j0 + kr, hk);
#pragma unroll
        for (int n = 0; n < DH / 8; n++) {
            const int c = dslice + n * 8 + 2 * t4;
            if (c < a.d) {
                *reinterpret_cast<uint32_t *>(dkp + c) =
                    pack2<T>(dk[4 * n + 2 * r] * sc, dk[4 * n + 2 * r + 1] * sc);
                *reinterpret_cast<uint32_t *>(dvp + c) = pack2<T>(dv[4 * n + 2 * r], dv[4 * n + 2 * r + 1]);
            }
        }
    }
#endif
}

struct BwdMaps {
    CUtensorMap q, k, v, o; /* q, o: boxes of 64 rows, or 80 (q80) */
    /* kMode 5: bias_flags 1 (no dbias), 3 (dbias too, by TMA) or 5 (a
     * broadcast dbias by vector reductions into dbias_acc), plus 8 when
     * that dbias is broadcast over the batch (the batch-first grid) */
    CUtensorMap bias, dbias;
    int bias_flags;
    int q80; /* the 80-query kernel (attn_bwd_wgmma_dq_tile_q) */
};

template <typename T, int D, int kMode, bool kDropout, bool kWide = false, bool kQ80 = false>
fg_status launch(const AttnArgs &a, const BwdMaps &m, cudaStream_t st)
{
    using Tile = BwdTile<D, kWide, kQ80>;
    /* BwdDropRT: the dropout kernel, told by a.dropout */
    constexpr bool kDr = kDropout || BwdDropRT<D, kMode>::value;
    auto kern = attn_bwd_wgmma_kernel<T, D, kMode, kDr, kWide, false, kQ80>;
    if constexpr (Tile::kSplitD)
        if (a.dq_sem)
            kern = attn_bwd_wgmma_kernel<T, D, kMode, kDr, kWide, true>;
    const size_t smem = Tile::kSmem + BwdBiasTile<D, kMode>::kBytes + BwdSeqSmem<D, kMode>::kBytes +
                        BwdDropX<D, kMode, kDr, kWide>::kBytes;
    FG_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
    const unsigned nkb = (unsigned)((a.Nk + Tile::kBc - 1) / Tile::kBc);
    const dim3 grid = kMode == 5 && (m.bias_flags & 8) ? dim3((unsigned)a.B, nkb, (unsigned)a.Hk)
                                                       : dim3(nkb, (unsigned)a.Hk, (unsigned)a.B);
    /* longest first under a mask (grid_pos); never with the deterministic
     * dQ's turns or the batch-first grid */
    int order = 0;
    if (!a.dq_sem && !(kMode == 5 && (m.bias_flags & 8)))
        FG_TRY(grid_order((int)nkb, a.Hk * a.B, 1, kMode != 0, &order));
    /* The rotated deterministic walk (dq_rotate) where a head's key
     * blocks (one per SM: __launch_bounds__(.., 1)) fit in half the GPU,
     * so a head's blocks run together even beside other work;
     * FG_ATTN_DET_ROTATE=0 turns it off (comparisons). */
    AttnArgs ar = a;
    ar.dq_split_turns = 3;
    for (const char *t : {"0", "1", "2"})
        if (env_is("FG_ATTN_DET_SPLIT_TURNS", t))
            ar.dq_split_turns = t[0] - '0';
    if (kMode == 0 && a.dq_sem && nkb >= 2 && !env_is("FG_ATTN_DET_ROTATE", "0")) {
        int dev = 0, sms = 0;
        FG_CUDA_TRY(cudaGetDevice(&dev));
        FG_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        ar.dq_rotate = 2 * (int64_t)nkb <= sms;
    }
    kern<<<grid, BwdSpec<D, kDr>::kThreads, smem, st>>>(ar, m.q, m.k, m.v, m.o, m.bias, m.dbias,
                                                         kMode == 5 ? m.bias_flags : 0, order);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* Explicit instantiations of launch<> for one kMode: both dtypes, every
 * padded head dim and both dropout settings. X is empty in the mode's
 * translation unit, extern everywhere else. */
#define FG_BWD_WGMMA_ARGS const AttnArgs &, const BwdMaps &, cudaStream_t
#define FG_BWD_WGMMA_LAUNCH(X, T, D, M)                                                 \
    X template fg_status launch<T, D, M, false>(FG_BWD_WGMMA_ARGS);                     \
    X template fg_status launch<T, D, M, true>(FG_BWD_WGMMA_ARGS);
#define FG_BWD_WGMMA_MODE(X, M)                                                         \
    FG_BWD_WGMMA_LAUNCH(X, __half, 64, M)                                               \
    FG_BWD_WGMMA_LAUNCH(X, __half, 128, M)                                              \
    FG_BWD_WGMMA_LAUNCH(X, __half, 256, M)                                              \
    FG_BWD_WGMMA_LAUNCH(X, __nv_bfloat16, 64, M)                                        \
    FG_BWD_WGMMA_LAUNCH(X, __nv_bfloat16, 128, M)                                       \
    FG_BWD_WGMMA_LAUNCH(X, __nv_bfloat16, 256, M)
/* kWide: d = 64, kModes 0-3, 6 and 7 (no bias) */
#define FG_BWD_WGMMA_WIDE(X, M)                                                         \
    X template fg_status launch<__half, 64, M, false, true>(FG_BWD_WGMMA_ARGS);         \
    X template fg_status launch<__half, 64, M, true, true>(FG_BWD_WGMMA_ARGS);          \
    X template fg_status launch<__nv_bfloat16, 64, M, false, true>(FG_BWD_WGMMA_ARGS);  \
    X template fg_status launch<__nv_bfloat16, 64, M, true, true>(FG_BWD_WGMMA_ARGS);
FG_BWD_WGMMA_MODE(extern, 0)
FG_BWD_WGMMA_MODE(extern, 1)
FG_BWD_WGMMA_WIDE(extern, 0)
FG_BWD_WGMMA_WIDE(extern, 1)
FG_BWD_WGMMA_WIDE(extern, 2)
FG_BWD_WGMMA_WIDE(extern, 3)
FG_BWD_WGMMA_WIDE(extern, 6)
FG_BWD_WGMMA_WIDE(extern, 7)
FG_BWD_WGMMA_MODE(extern, 2)
FG_BWD_WGMMA_MODE(extern, 3)
FG_BWD_WGMMA_MODE(extern, 4)
FG_BWD_WGMMA_MODE(extern, 6)
FG_BWD_WGMMA_MODE(extern, 7)
/* kQ80: d = 128, kMode 0, no dropout */
#define FG_BWD_WGMMA_Q80(X)                                                             \
    X template fg_status launch<__half, 128, 0, false, false, true>(FG_BWD_WGMMA_ARGS); \
    X template fg_status launch<__nv_bfloat16, 128, 0, false, false, true>(FG_BWD_WGMMA_ARGS);
FG_BWD_WGMMA_Q80(extern)
/* kMode 5: d = 128 only (BwdBiasTile) */
FG_BWD_WGMMA_LAUNCH(extern, __half, 128, 5)
FG_BWD_WGMMA_LAUNCH(extern, __nv_bfloat16, 128, 5)

} /* namespace fg */

#endif
