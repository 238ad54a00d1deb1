/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma.cuh - fp16/bf16 FlashAttention forward for Hopper
 * (sm_90a) on warpgroup MMA (wgmma).
 *
 * One block of kWG warpgroups per (query block, head, batch); warpgroup w
 * owns 64 query rows, so the online softmax stays inside a warp (quad
 * shuffles) as in the sm_80 kernel. Per key block (Alg. 1 lines 6-12):
 *   S = Q K_j^T      wgmma, A = Q and B = K from shared memory (K-major),
 *   softmax          registers (accumulator layout = mma.sync C layout),
 *   O += P V_j       wgmma, A = P from registers (bf16/fp16), B = V from
 *                    shared memory read MN-major (transposed).
 * Q, K and V arrive by TMA (one thread issues, mbarriers signal) in
 * 128-byte swizzled panels (wgmma_sm90.cuh), K/V double-buffered; the loads of K_{j+1} and V_j overlap
 * the MMAs of block j, and the softmax of block j overlaps the P V product
 * of block j-1 (see the loop). Masks only on boundary blocks; O
 * normalised once.
 * Every head dim in [8, 256] runs here (padded to 64/128/256); the same
 * alignment rule as the sm_80 path applies.
 *
 * The kernel template and its launch<> live here; each kMode is
 * instantiated in a translation unit of its own (attn_fwd_wgmma_mode<k>.cu,
 * k = 0..3, 6, 7, built for sm_90a only) so the kernels compile in parallel,
 * and attn_fwd_wgmma_dispatch.cu calls them through the extern
 * declarations at the end. */
#ifndef FG_KERNELS_ATTN_FWD_WGMMA_CUH
#define FG_KERNELS_ATTN_FWD_WGMMA_CUH

#include "attn_common.cuh"
#include "attn_fwd_wgmma_traits.cuh"
#include "attn_kernels.h"
#include "kernels/runtime/cuda_check.h"
#include "tma_map.h"
#include "wgmma_epilogue.cuh"
#include "wgmma_sm90.cuh"

namespace fg {

template <typename T, int D, int WG, int kMode, bool kDropout>
__global__ void __launch_bounds__(FwdSpec<WG, kDropout>::kThreads,
                                  FwdWgTile<D, WG, FwdWide<D, kMode, kDropout>::value>::kMinBlocks)
attn_fwd_wgmma_kernel(const __grid_constant__ AttnArgs args,
                      const __grid_constant__ CUtensorMap tmQ,
                      const __grid_constant__ CUtensorMap tmK,
                      const __grid_constant__ CUtensorMap tmV,
                      const __grid_constant__ CUtensorMap tmB, const int bias_tma,
                      const int order)
{
#ifdef FG_WGMMA_ENABLED
    /* kMode 3 runs sequence b of a packed or key-padded batch as a problem
     * of its own (seq_args: lengths, keys seen, shift, moved O and stats);
     * the TMA maps then span the packed rows (batch 0) and its tiles start
     * at the sequence's first row. Rows of a neighbouring sequence that a
     * tile reads are masked (keys) or never stored (queries). The other
     * modes read args itself, as before. */
    constexpr bool kRagged = kmode_ragged(kMode);
    constexpr bool kMods = kmode_mods(kMode); /* softcap, ALiBi, bias */
    int blk, pair; /* grid_pos: the query block (before reversal), b H + h */
    grid_pos(order, &blk, &pair);
    const int h = pair % args.H, b = pair / args.H;
    AttnArgs seq;
    int64_t q_row0 = 0, k_row0 = 0;
    int tb = b; /* the TMA batch coordinate */
    if constexpr (kRagged) {
        int nk_rows;
        seq = seq_args<T, float>(args, b, &nk_rows);
        if (args.cu_q) {
            q_row0 = args.cu_q[b];
            k_row0 = args.cu_k[b];
            tb = 0;
        }
    }
    const AttnArgs &a = kRagged ? seq : args;
    using Tile = FwdWgTile<D, WG, FwdWide<D, kMode, kDropout>::value>;
    constexpr bool kSpec = FwdSpec<WG, kDropout>::value;
    const bool drop = kDropout && (!FwdDropRT<D, kMode>::value || a.dropout);
    constexpr bool kCausal = kMode == 1, kMasked = kMode >= 2;
    constexpr int Br = Tile::kBr, Bc = Tile::kBc;
    constexpr int SR = Bc / 2; /* S registers per thread */
    constexpr int OR = D / 2;  /* O registers per thread */
    extern __shared__ unsigned char smem[];
    /* wgmma's swizzle atoms need 1024-byte alignment. */
    const uint32_t sQ = (smem_u32(smem) + 1023) & ~1023u;
    const uint32_t sK0 = sQ + Br * D * 2, sV0 = sK0 + Bc * D * 2;
    const uint32_t kv_stride = 2 * Bc * D * 2;

    /* warp-uniform to the compiler (a shuffle from lane 0): descriptors
     * built from it stay in uniform registers (attn_bwd_wgmma.cuh); one
     * warpgroup (d = 64): 0 */
    const int wg = WG == 1 ? 0 : __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0);
    const int warp = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    /* masked: the longest query blocks (the last) first */
    const int mblk = kMode != 0 ? gridDim.x - 1 - blk : blk;
    const int64_t i0 = (int64_t)mblk * Br;
    const int hk = h / a.group;
    const int64_t bh = (int64_t)b * a.H + h;
    if (kRagged && i0 >= a.Nq) /* past this sequence: the grid fits the longest */
        return;
    const int rows = (int)min((int64_t)Br, a.Nq - i0);

    /* kMasked: the band, the block lists and the score modifiers
     * (attention.h); otherwise every key block up to the causal limit. */
    const BlockWalk walk = fwd_key_walk(a, kMasked, kCausal, b, h, i0, rows, Bc);
    const int nblocks = walk.n;

    /* TMA loads, issued by thread 0 (kSpec: the producer warp), one
     * 64-column panel per copy, each tile completing on its own mbarrier:
     * Q, K stages 0/1, V stages 0/1; kSpec adds the consumers' release
     * barriers of the K and V stages (one arrival per consumer warp).
     * Rows past the sequence and columns past d arrive as zeros. */
    const uint32_t barQ = sQ + Br * D * 2 + 2 * kv_stride;
    const uint32_t barK = barQ + 8, barV = barQ + 24; /* + 8 * stage */
    const uint32_t freeK = barQ + 40, freeV = barQ + 56;
    /* The bias by TMA (kMode 2, a 16-bit bias whose rows TMA can read,
     * FwdMaps::bias_tma): tile j of bias rows i0.. and keys j0.. arrives
     * beside K_j in stage j & 1 (barB), 64-column panels with the 128-byte
     * swizzle; the consumers release it with K_j (freeK), after adding it.
     * Per element loads from global memory, issued once S_j had landed,
     * left the tensor cores idle for most of each step (H100/H200: 87-93
     * TFLOP/s with a [B, H, N, N] bias, N = 2k, against 350+ without). */
    const bool btma = kMasked && kMods && !kRagged && bias_tma;
    const uint32_t barB = barQ + 72;  /* + 8 * stage */
    const uint32_t sB0 = barQ + 1024; /* + stage * kBiasStage */
    auto tma_bias = [&](int jb) {
        const uint32_t st = (uint32_t)(jb & 1), bar = barB + 8 * st;
        mbar_expect_tx(bar, (uint32_t)Tile::kBiasStage);
        const int hb = a.bias_s[1] ? h : 0, bb = a.bias_s[0] ? b : 0;
#pragma unroll
        for (int p = 0; p < Bc / 64; p++)
            tma_load_4d(sB0 + st * (uint32_t)Tile::kBiasStage + p * Br * 128, &tmB, bar,
                        (int)walk.start(jb) + p * 64, (int)i0, hb, bb);
    };
    auto tma_tile = [&](uint32_t dst, const CUtensorMap *map, uint32_t bar, int rows_box,
                        int64_t row0, int head) {
        mbar_expect_tx(bar, (uint32_t)rows_box * D * 2);
#pragma unroll
        for (int p = 0; p < D / 64; p++)
            tma_load_4d(dst + p * rows_box * 128, map, bar, p * 64, (int)row0, head, tb);
    };
    if (threadIdx.x == 0) {
        for (int i = 0; i < 5; i++)
            mbar_init(barQ + 8 * i, 1);
        if (kSpec)
            for (int i = 5; i < 9; i++)
                mbar_init(barQ + 8 * i, 8);
        if (btma)
            for (int i = 9; i < 11; i++)
                mbar_init(barQ + 8 * i, 1);
        mbar_init_fence();
    }
    __syncthreads();
    if constexpr (kSpec) {
        if (threadIdx.x >= 256) { /* the producer warpgroup: loads only */
            setmaxnreg_dec<24>();
            if (threadIdx.x == 256 && nblocks > 0) {
                tma_tile(sQ, &tmQ, barQ, Br, q_row0 + i0, h);
                for (int jb = 0; jb < nblocks; jb++) {
                    const uint32_t st = (uint32_t)(jb & 1), par = (uint32_t)((jb >> 1) - 1) & 1;
                    if (jb >= 2) /* K_{j-2} / V_{j-2} released by all consumers */
                        mbar_wait(freeK + 8 * st, par);
                    tma_tile(sK0 + st * kv_stride, &tmK, barK + 8 * st, Bc,
                             k_row0 + walk.start(jb), hk);
                    if (btma)
                        tma_bias(jb);
                    if (jb >= 2)
                        mbar_wait(freeV + 8 * st, par);
                    tma_tile(sV0 + st * kv_stride, &tmV, barV + 8 * st, Bc,
                             k_row0 + walk.start(jb), hk);
                }
            }
            return;
        }
        setmaxnreg_inc<240>();
    }
    /* Ping-pong (kSpec): warpgroup w issues its GEMMs after named barrier
     * 1 + w, then lets the other go (barrier 2 - w). Warpgroup 0 starts;
     * per warpgroup nblocks + 1 issue slots, and warpgroup 1 skips the
     * hand-off after its last so the arrivals match the waits. The hand-off
     * follows the wait for S_j (P V still runs): a bar.arrive between the
     * wgmmas and their wait made ptxas serialise the wgmmas (C7514). */
    auto gemm_turn = [&]() {
        if constexpr (kSpec)
            named_sync(1 + wg, 256);
    };
    auto gemm_done = [&]() {
        if constexpr (kSpec)
            named_arrive(2 - wg, 256);
    };
    if (kSpec && wg == 1 && nblocks > 0)
        named_arrive(1, 256);
    /* Stage K_0 (with Q); iteration j then loads K_{j+1} and V_j, so the
     * V block a P V product reads lags its K block by one. */
    /* Q only for a block with key blocks (as the producer above): one
     * without writes its zero O through the Q tile (a.o_staged), which a
     * load still in flight would overwrite */
    if (!kSpec && threadIdx.x == 0 && nblocks > 0) {
        tma_tile(sQ, &tmQ, barQ, Br, q_row0 + i0, h);
        tma_tile(sK0, &tmK, barK, Bc, k_row0 + walk.start(0), hk);
        if (btma)
            tma_bias(0);
    }

    float o[OR];
#pragma unroll
    for (int i = 0; i < OR; i++)
        o[i] = 0.f;
    float m_raw[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.f, 0.f};
    const float scale_log2 = (float)(a.scale * 1.4426950408889634);
    /* This thread's rows: row_w and row_w + 8. */
    const int64_t row_w = i0 + wg * 64 + warp * 16 + g;
    const uint32_t sQw = sQ + wg * 64 * 128; /* this warpgroup's 64 rows */
    uint32_t pf[Bc / 16][4]; /* P_{j-1} as A fragments */

    /* O += P_{j-1} V_{j-1}: two n8 accumulator tiles of S are the A
     * fragment of one k16 step; V read transposed, 16 rows per step. */
    auto issue_pv = [&](uint32_t sV) {
        wg_fence();
        wg_fence_regs(o);
        const uint64_t dv0 = wg_desc(sV, Bc * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++)
            WgmmaOp<T, D>::template rs<1>(o, pf[kk], dv0 + ((kk * 16 * 128) >> 4), 1);
        wg_commit();
    };

    /* Software pipeline (FA3's intra-warpgroup overlap): iteration j issues
     * S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back, then runs the
     * softmax of S_j while the P V product is still on the tensor cores;
     * O is rescaled by alpha_j once that product has landed. */
    const float slope = kMasked && kMods && a.alibi ? a.alibi[b * a.alibi_sb + h] : 0.f;
    /* The modifiers' constants as float locals: read from AttnArgs per
     * element they are recomputed after every wgmma (a memory clobber). */
    const float scale_f = (float)a.scale, inv_scale = (float)(1.0 / a.scale);
    const float inv_cap = a.softcap > 0.f ? 1.f / a.softcap : 0.f;
    /* The softcap alone (no ALiBi, no bias): S is kept as t = tanh(scale
     * s / cap), whose logit is cap t, so the softmax's exponent takes cap
     * log2(e) for scale log2(e) and m leaves as cap max t. One FMUL and
     * the tanh an element instead of four FMULs and the tanh. */
    const bool cap_units = kMasked && kMods && a.softcap > 0.f && !a.alibi && !a.bias;
    const float cap_k1 = scale_f * inv_cap, cap_k2 = a.softcap * inv_scale;
    const float exp_k = cap_units ? (float)(a.softcap * 1.4426950408889634) : scale_log2;
    const float m_k = cap_units ? a.softcap : scale_f; /* m = m_k max S */
    /* kMasked with a bias: element i's offset is a per-block base plus
     * compile-time multiples of the row and key strides. */
    const int64_t bias_s2 = a.bias_s[2], bias_s3 = a.bias_s[3];
    const int64_t bias_row0 = kMasked && kMods && a.bias ? b * a.bias_s[0] + h * a.bias_s[1] + row_w * bias_s2
                                                : 0;
    const int bias_rows = (int)min(a.Nq - row_w, (int64_t)16);
    /* ALiBi alone under a causal band (win_hi <= 0: every visible pair has
     * i + shift - j >= 0, so |d| = d; masked pairs' values do not matter):
     * S starts as the bias, -(slope / scale) d, and the first k-step of
     * Q K^T accumulates onto it. One FFMA an element (a per-block base
     * and a compile-time offset) instead of the FADD and FFMA after it:
     * H200, d = 128, N = 8k, ALiBi + causal forward 466 -> 497 TFLOP/s.
     * The backward's S^T done this way ran 20% slower (508 -> 403:
     * ptxas serialised its wgmmas, C7512) and keeps the two operations. */
    const bool alibi_acc = kMasked && kMods && a.alibi && !(a.softcap > 0.f) && a.band &&
                           a.win_hi <= 0;
    const float alibi_sl = slope * inv_scale;
    for (int jb = 0; jb < nblocks; jb++) {
        const int64_t j0 = walk.start(jb);
        const uint32_t sK = sK0 + (jb & 1) * kv_stride;
        if (!kSpec && threadIdx.x == 0) { /* both buffers were released by the last barrier */
            if (jb + 1 < nblocks) {
                tma_tile(sK0 + ((jb + 1) & 1) * kv_stride, &tmK, barK + 8 * ((jb + 1) & 1), Bc,
                         k_row0 + walk.start(jb + 1), hk);
                if (btma)
                    tma_bias(jb + 1);
            }
            tma_tile(sV0 + (jb & 1) * kv_stride, &tmV, barV + 8 * (jb & 1), Bc, k_row0 + j0,
                     hk);
        }
        if (jb == 0)
            mbar_wait(barQ, 0);
        mbar_wait(barK + 8 * (jb & 1), (jb >> 1) & 1); /* K_j */
        if (jb > 0)
            mbar_wait(barV + 8 * ((jb - 1) & 1), ((jb - 1) >> 1) & 1); /* V_{j-1} */

        /* S = Q_i K_j^T (Alg1 L.9): D/16 k-steps, 32 bytes apart inside a
         * 128-byte swizzled row, 64 columns per panel. */
        float s[SR];
        if (alibi_acc) { /* element i: d = dist0 + its offset (the modifiers below) */
            const float base = -alibi_sl * (float)(int)(row_w + a.shift - (j0 + 2 * t4));
#pragma unroll
            for (int i = 0; i < SR; i++)
                s[i] = fmaf(-alibi_sl, (float)(((i >> 1) & 1) * 8 - (i >> 2) * 8 - (i & 1)), base);
            wg_fence_regs(s); /* written before the wgmma fence, not after */
        }
        gemm_turn();
        wg_fence();
        const uint64_t dq0 = wg_desc(sQw, 16, 1024), dk0 = wg_desc(sK, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) /* start address moves in 16-byte units */
            WgmmaOp<T, Bc>::template ss<0, 0>(s, dq0 + (((kk >> 2) * Br * 128 + (kk & 3) * 32) >> 4),
                                              dk0 + (((kk >> 2) * Bc * 128 + (kk & 3) * 32) >> 4),
                                              kk > 0 || alibi_acc);
        wg_commit();
        if (jb > 0)
            issue_pv(sV0 + ((jb - 1) & 1) * kv_stride);
        if (jb > 0)
            wg_wait<1>(); /* S_j done; the P V product may still run */
        else
            wg_wait<0>();
        wg_fence_regs(s);
        gemm_done();
        if (kSpec && lane == 0 && !btma)
            mbar_arrive(freeK + 8 * (jb & 1)); /* K_j read */

        /* Score modifiers, then the mask (only on blocks that cross the
         * band's edges or the end). */
        /* raw_score_mod, per block */
        if (kMasked && kMods && (a.softcap > 0.f || (a.alibi && !alibi_acc))) {
            /* ALiBi's |i - j + shift|: a per-block base and a compile-time
             * offset per element, in float (exact below 2^24) */
            const float dist0 = (float)(int)(row_w + a.shift - (j0 + 2 * t4));
            if (cap_units) {
#pragma unroll
                for (int i = 0; i < SR; i++)
                    s[i] = tanh_fast(s[i] * cap_k1);
            } else if (a.softcap > 0.f) { /* (cap t - slope |d|) / scale */
#pragma unroll
                for (int i = 0; i < SR; i++) {
                    const float t = tanh_fast(s[i] * cap_k1);
                    s[i] = a.alibi ? fmaf(t, cap_k2,
                                          -alibi_sl * fabsf(dist0 + (float)(((i >> 1) & 1) * 8 -
                                                                            (i >> 2) * 8 - (i & 1))))
                                   : t * cap_k2;
                }
            } else { /* ALiBi alone, in S's units: s - (slope / scale) |d|,
                      * two operations an element instead of four */
#pragma unroll
                for (int i = 0; i < SR; i++)
                    s[i] = fmaf(-alibi_sl, fabsf(dist0 + (float)(((i >> 1) & 1) * 8 - (i >> 2) * 8 - (i & 1))),
                                s[i]);
            }
        }
        if (btma) { /* + bias / scale from the stage: element (R, c) of a
                     * panel at row R, 16-byte chunk (c % 64 / 8) ^ (R % 8)
                     * (the swizzle; R % 8 = g here), so the eight rows a
                     * warp reads hit eight distinct chunks */
            mbar_wait(barB + 8 * (jb & 1), (jb >> 1) & 1);
            const unsigned char *sb = smem + (sB0 - smem_u32(smem)) +
                                      (jb & 1) * Tile::kBiasStage +
                                      (wg * 64 + warp * 16 + g) * 128 + 4 * t4;
#pragma unroll
            for (int n = 0; n < Bc / 8; n++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float2 bv = unpack2<T>(*reinterpret_cast<const uint32_t *>(
                        sb + (n >> 3) * Br * 128 + r * 8 * 128 + (((n & 7) ^ g) << 4)));
                    s[4 * n + 2 * r] = fmaf(bv.x, inv_scale, s[4 * n + 2 * r]);
                    s[4 * n + 2 * r + 1] = fmaf(bv.y, inv_scale, s[4 * n + 2 * r + 1]);
                }
            if (kSpec && lane == 0)
                mbar_arrive(freeK + 8 * (jb & 1)); /* K_j and bias_j read */
        } else if (kMasked && kMods && a.bias) { /* + bias / scale (raw units: the scale is in exp2) */
            const int64_t c0 = j0 + 2 * t4;
            const int64_t base = bias_row0 + c0 * bias_s3;
            const int cols = (int)min((int64_t)a.Nk - c0, (int64_t)Bc);
#pragma unroll
            for (int i = 0; i < SR; i++) {
                const int r = ((i >> 1) & 1) * 8, c = (i >> 2) * 8 + (i & 1);
                if (r < bias_rows && c < cols) {
                    const int64_t off = base + r * bias_s2 + c * bias_s3;
                    const float bv = a.bias_f32 ? ((const float *)a.bias)[off]
                                                : to_acc(((const T *)a.bias)[off]);
                    s[i] = fmaf(bv, inv_scale, s[i]);
                }
            }
        }
        const bool dead = kMasked && walk.dead(jb);
        const bool need_mask =
            j0 + Bc > a.Nk || (kCausal && j0 + Bc - 1 > i0 + wg * 64 + a.shift) ||
            (kMasked && (dead || !inside_band(a, i0 + wg * 64, i0 + wg * 64 + 63, j0, Bc)));
        if (kMasked && need_mask) { /* the keys each of this thread's rows sees */
            int2 cc[2];
#pragma unroll
            for (int r = 0; r < 2; r++)
                cc[r] = dead ? make_int2(Bc, -1) : band_cols(a, row_w + 8 * r, j0, Bc);
#pragma unroll
            for (int i = 0; i < SR; i++) {
                const int col = (i >> 2) * 8 + 2 * t4 + (i & 1);
                const int2 c = cc[(i >> 1) & 1];
                if (col < c.x || col > c.y)
                    s[i] = -INFINITY;
            }
        } else if (need_mask) { /* column limits of rows row_w, + 8 */
            int lim[2];
#pragma unroll
            for (int r = 0; r < 2; r++)
                lim[r] = row_key_limit(a, kCausal, row_w + 8 * r, j0, Bc);
#pragma unroll
            for (int i = 0; i < SR; i++)
                if ((i >> 2) * 8 + 2 * t4 + (i & 1) >= lim[(i >> 1) & 1])
                    s[i] = -INFINITY;
        }

        /* Online softmax (Alg1 L.10-11) on rows g (r = 0) and g + 8. */
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m_raw[r];
#pragma unroll
            for (int n = 0; n < Bc / 8; n++)
                mx = fmax_nan(mx, fmax_nan(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
            mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float ms = mx == -INFINITY ? 0.f : mx * exp_k;
            /* an unmoved maximum gives alpha = 1 exactly (the FFMA below
             * would leave the rounding error of ms in the exponent) */
            alpha[r] = mx == -INFINITY || mx == m_raw[r] ? 1.f
                                                          : exp2_fast(m_raw[r] * exp_k - ms);
            m_raw[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < Bc / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2_fast(fmaf(s[4 * n + 2 * r + e], exp_k, -ms));
                    s[4 * n + 2 * r + e] = p;
                    sum += p;
                }
            l_part[r] = l_part[r] * alpha[r] + sum;
        }

        if (drop) { /* zero dropped P; 256/T is applied at the end */
            /* one call per 16 elements: rows row_w + {0, 8}, 32 keys */
#pragma unroll
            for (int c = 0; c < Bc / 32; c++)
                fwd_dropout32(a, bh, row_w, j0 + 32 * c, t4, [&](int n, int r, int e) {
                    s[4 * (4 * c + n) + 2 * r + e] = 0.f;
                });
        }

        /* The P V product has landed: O *= alpha_j (it already holds
         * P_{j-1} V_{j-1}, which alpha_j rescales too), then P_j -> pf. */
        wg_wait<0>();
        if (kSpec && lane == 0 && jb > 0)
            mbar_arrive(freeV + 8 * ((jb - 1) & 1)); /* V_{j-1} read */
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                asm volatile("" : "+r"(pf[kk][x])::"memory");
        wg_fence_regs(o);
        /* O *= alpha only where a row of the warp moved its maximum: late
         * in long rows most blocks move none, and O *= 1 is no change
         * (d = 256: 128 multiplies a thread, a fifth of the block's work).
         * Not at d = 64 (32 multiplies; the test cost the one-warpgroup
         * dropout kernel 36 registers, three blocks an SM to two). */
        if (D < 128 || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int i = 0; i < OR; i++)
                o[i] *= alpha[(i >> 1) & 1];
        }
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++) {
            pf[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
            pf[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
            pf[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
            pf[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
        }
        if (!kSpec)
            __syncthreads(); /* K_j and V_{j-1} buffers are refilled next */
    }
    if (nblocks > 0) { /* the last P V product */
        mbar_wait(barV + 8 * ((nblocks - 1) & 1), ((nblocks - 1) >> 1) & 1);
        gemm_turn();
        issue_pv(sV0 + ((nblocks - 1) & 1) * kv_stride);
        wg_wait<0>();
        if (kSpec && wg == 0)
            gemm_done();
        wg_fence_regs(o);
    }

    /* Epilogue: full row sums over the quad, O / l * 256/T, m and l; O
     * from registers, or with a.o_staged through the warp's rows of the Q
     * tile (wgmma_epilogue.cuh) */
    const bool staged = a.o_staged; /* set only for 16-byte rows (vec16_ok) */
    float inv_r[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = l_part[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int64_t i = row_w + 8 * r;
        const float inv = l != 0.f ? (float)a.keep_scale / l : 0.f;
        inv_r[r] = inv;
        if (i < a.Nq) {
            T *dst = elem<T>(a.o, b, i, h);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                const int c = n * 8 + 2 * t4;
                if (c < a.d && !staged)
                    *reinterpret_cast<uint32_t *>(dst + c) =
                        pack2<T>(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
            }
            if (t4 == 0) {
                const float mr = m_raw[r];
                const int64_t at = (kRagged ? stat_row0(a, b, h) : bh * a.Nq) + i;
                ((float *)a.m)[at] = mr == -INFINITY ? -INFINITY : mr * m_k;
                ((float *)a.l)[at] = l;
            }
        }
    }
    if (staged) /* the warp's own rows of the Q tile, dead since the last S */
        warp_rows_out<T, D>(o, inv_r[0], inv_r[1], sQ, smem + (sQ - smem_u32(smem)), Br * 128,
                            (uint32_t)(wg * 64 + warp * 16),
                            elem<T>(a.o, b, i0 + wg * 64 + warp * 16, h), a.o.ss,
                            (int)min((int64_t)16, a.Nq - (i0 + wg * 64 + warp * 16)), a.d);
#endif
}

struct FwdMaps {
    CUtensorMap q, k, v;
    CUtensorMap bias; /* valid when bias_tma (make_bias_tmap) */
    int bias_tma;
    int kv_rows; /* the K/V maps' box rows: the kernel's kBc */
};

template <typename T, int D, int WG, int kMode, bool kDropout>
fg_status launch(const AttnArgs &a, const FwdMaps &m, cudaStream_t st)
{
    /* FwdDropRT: the dropout kernel, told by a.dropout */
    constexpr bool kDr = kDropout || FwdDropRT<D, kMode>::value;
    using Tile = FwdWgTile<D, WG, FwdWide<D, kMode, kDr>::value>;
    auto kern = attn_fwd_wgmma_kernel<T, D, WG, kMode, kDr>;
    if (m.kv_rows != Tile::kBc) /* the dispatch's maps and this kernel disagree */
        return fg_error(FG_ERR_INTERNAL, "attention forward: K/V tiles of %d rows for a %d-key kernel",
                       m.kv_rows, Tile::kBc);
    const int btma = kMode == 2 && m.bias_tma;
    const size_t smem = Tile::kSmem + (btma ? Tile::kBiasSmem : 0);
    FG_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
    dim3 grid((unsigned)((a.Nq + Tile::kBr - 1) / Tile::kBr), (unsigned)a.H,
              (unsigned)a.B);
    /* longest first under a mask (grid_pos), as the backward */
    int order = 0;
    FG_TRY(grid_order((int)grid.x, a.H * a.B, Tile::kMinBlocks, kMode != 0, &order));
    kern<<<grid, FwdSpec<WG, kDr>::kThreads, smem, st>>>(a, m.q, m.k, m.v, m.bias, btma,
                                                         order);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* Explicit instantiations of launch<> for one kMode: both dtypes, every
 * padded head dim (with its warpgroup count) and both dropout settings.
 * X is empty in the mode's translation unit, extern everywhere else. */
#define FG_FWD_WGMMA_ARGS const AttnArgs &, const FwdMaps &, cudaStream_t
#define FG_FWD_WGMMA_LAUNCH(X, T, D, M)                                                 \
    X template fg_status launch<T, D, FwdWG<D>::value, M, false>(FG_FWD_WGMMA_ARGS);    \
    X template fg_status launch<T, D, FwdWG<D>::value, M, true>(FG_FWD_WGMMA_ARGS);
#define FG_FWD_WGMMA_MODE(X, M)                                                         \
    FG_FWD_WGMMA_LAUNCH(X, __half, 64, M)                                               \
    FG_FWD_WGMMA_LAUNCH(X, __half, 128, M)                                              \
    FG_FWD_WGMMA_LAUNCH(X, __half, 256, M)                                              \
    FG_FWD_WGMMA_LAUNCH(X, __nv_bfloat16, 64, M)                                        \
    FG_FWD_WGMMA_LAUNCH(X, __nv_bfloat16, 128, M)                                       \
    FG_FWD_WGMMA_LAUNCH(X, __nv_bfloat16, 256, M)
FG_FWD_WGMMA_MODE(extern, 0)
FG_FWD_WGMMA_MODE(extern, 1)
FG_FWD_WGMMA_MODE(extern, 2)
FG_FWD_WGMMA_MODE(extern, 3)
FG_FWD_WGMMA_MODE(extern, 6)
FG_FWD_WGMMA_MODE(extern, 7)

} /* namespace fg */

#endif
