/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_tf32_fwd.cu - fp32 FlashAttention forward on TF32
 * tensor cores (mma.sync m16n8k8, sm_80+): TF32 (the opt-in of
 * fg_cuda_set_attention_allow_tf32) or, with kSplit, strict fp32 by the
 * 3xTF32 split of every operand (attn_tf32.cuh).
 *
 * The structure of the fp16/bf16 kernel (attn_fwd_mma.cu), with fp32 tiles
 * (attn_tf32.cuh): one block of 4 warps (8 at d = 256 where the shared
 * memory allows: FwdTile) per (query block, head, batch),
 * each warp owning 16 query rows per m-tile (two m-tiles for d <= 64, so a
 * K/V fragment feeds two products; one above, where O fills the
 * registers), so the online softmax of Algorithm 1 reduces over the 4
 * lanes of a quad. S = Q K^T and O += P V on tensor cores with fp32
 * accumulators; in TF32 mode Q, K, V are rounded to TF32 once in shared
 * memory and P in registers (as FlashAttention-2 rounds P to fp16); in
 * 3xTF32 mode fragments of Q, K, V and P are split as they are read, except
 * at d = 128 (kLo), where K and V are split once per block into shared
 * memory (their TF32 part in place, the remainder in tiles of its own) and
 * 8 warps share them: per warp, splitting all of K and V in registers was
 * half of the instructions (ncu, H200: FADD 30%, F2FP 22%, HMMA 14%).
 * exp2 with the scale
 * folded in, O / l once at the end; masks only on blocks that cross the
 * diagonal, the band or the end. K and V stream through one buffer each,
 * by cp.async: K_{j+1} is fetched while the softmax and P V of block j
 * run, V_{j+1} while S_{j+1} is computed; the fp32 tiles take twice the
 * fp16 kernel's room, and a second block per SM (d <= 128 on an H100)
 * hides the rest.
 *
 * kMode: 0 no mask or bottom-right causal (a.causal, at run time), 2 the
 * variants (band, block lists, softcap, ALiBi), as in attn_fwd_mma.cu. */
#include "attn_tf32.cuh"
#include "kernels/runtime/cuda_check.h"

namespace fg {
namespace tf32 {

/* NW warps of 16 query rows per m-tile. At d = 256 the 4-warp tile takes
 * 133 KiB of shared memory, so an SM holds one block, 4 warps, too few to
 * hide mma.sync latency; where 200 KiB fits (H100, H200) the 8-warp tile
 * shares each K/V tile among twice the rows with 8 warps an SM (the
 * registers, 255 a thread, still fit); FG_ATTN_TF32_WIDE=0 keeps 4. kLo
 * (3xTF32, d = 128, 8 warps): 198 KiB with the remainder tiles of K and V;
 * FG_ATTN_TF32X3_TILES=0 keeps the 4-warp register split.
 * Warp pairs sharing rows, each with half of d (the backward's kPair),
 * were dropped here: once the 8 unpaired warps summed 4 k steps per tile
 * they won both ways on an H200 at N 4k (3xTF32, d = 256: 41.6 against
 * 37.1 TFLOP/s causal, 47.7 against 39.6 unpaired G = 2; session 43). */
template <int D, int NW = 4, bool kLo = false> struct FwdTile {
    static constexpr int kMT = D <= 64 ? 2 : 1; /* m16 tiles per warp */
    static constexpr int kThreads = 32 * NW;
    static constexpr int kBr = 16 * kMT * NW; /* 4 warps: 128 or 64 rows */
    static constexpr int kBc = D == 256 ? 32 : 64;
    static constexpr int kLd = D + 4;
    /* Q, K, V (and with kLo the remainders of K and V) */
    static constexpr size_t kSmem = sizeof(float) * (size_t)(kBr + (kLo ? 4 : 2) * kBc) * kLd;
};

template <int D, int NW, int kMode, bool kDropout, bool kSplit, bool kLo>
__global__ void __launch_bounds__(FwdTile<D, NW, kLo>::kThreads)
    fwd_kernel(const AttnArgs a, const int blk0, const int last)
{
    constexpr bool kMasked = kMode == 2;
    /* Plain causal: a runtime flag, not an instantiation (build time; see
     * fwd_mask). The variants' band carries their causality. */
    const bool causal = !kMasked && a.causal;
    using Tile = FwdTile<D, NW, kLo>;
    static_assert(!kLo || kSplit, "remainder tiles are 3xTF32's");
    constexpr int Br = Tile::kBr, Bc = Tile::kBc, LD = Tile::kLd, MT = Tile::kMT;
    constexpr int NT = Bc / 8; /* n8 tiles of S, k8 steps of P V */
    constexpr int DT = D / 8; /* n8 tiles of O */
    /* 3xTF32 sums G k steps in each zeroed tile before adding it in fp32
     * (G = 1: mma), 1/G of the per-step tile's FADDs: 4 at d = 256 (8
     * warps spill 432 / 288 bytes with it against 572 / 460 with G = 1,
     * and run 47.7 against 39.6 TFLOP/s unmasked), 2 at d = 128 (192
     * registers, no spills; 4 spilled 176-264 bytes there, and 2 spilled
     * at d = 32, 64).
     * scripts/tf32x3-model.py --groups: the truncation error of one step
     * per tile holds up to G = 4 (dK over 4097 rows, a logit of 13 over
     * d = 256) and doubles at G = 8. */
    constexpr int G = kSplit && D == 256 ? 4 : kSplit && D == 128 ? 2 : 1;
    static_assert(DT % G == 0 && NT % G == 0, "whole groups of k steps");
    constexpr int NTH = Tile::kThreads;
    extern __shared__ __align__(128) float smem_f[];
    float *Qs = smem_f, *Ks = Qs + Br * LD, *Vs = Ks + Bc * LD;
    float *Kl = Vs + Bc * LD, *Vl = Kl + Bc * LD; /* kLo only */
    const uint32_t sQ = smem_u32(Qs), sK = smem_u32(Ks), sKl = smem_u32(Kl);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    /* Masked: the grid is (H, query blocks from blk0, B), heads fastest
     * (launch): blocks near the end do the most work, so every head of a
     * batch issues its longest before any issues its next (last: the final
     * block's index). Unmasked: (blocks, H, B), a head's blocks together,
     * sharing its K and V in L2. */
    const bool hfast = heads_fastest(kMasked, causal);
    const GridPos pos = grid_pos(hfast);
    const int mblk = hfast ? last - pos.blk : blk0 + pos.blk;
    const int64_t i0 = (int64_t)mblk * Br;
    const int h = pos.head, b = blockIdx.z, hk = h / a.group;
    const int64_t bh = (int64_t)b * a.H + h;
    const int rows = (int)min((int64_t)Br, (int64_t)a.Nq - i0);
    const BlockWalk walk = fwd_key_walk(a, kMasked, causal, b, h, i0, rows, Bc);
    const int nblocks = walk.n;

    /* cp.async groups, in order: {Q, K_0}, {V_0}, then K_{j+1} and V_{j+1}
     * (empty past the last block), so "all but the newest group landed"
     * is always the tile needed next. Without kSplit, V is copied by pairs
     * of rows, the mapping round_rows_pairs permutes with. */
    auto issue = [&](float *dst, const Operand &t, int jb, bool pairs) {
        if (jb < nblocks) {
            const int64_t js = walk.start(jb);
            const int valid = (int)min((int64_t)Bc, a.Nk - js);
            if (pairs)
                load_rows<D, true>(smem_u32(dst), t, b, js, hk, Bc, valid, a.d, NTH);
            else
                load_rows<D>(smem_u32(dst), t, b, js, hk, Bc, valid, a.d, NTH);
        }
        cp_async_commit();
    };
    load_rows<D>(sQ, a.q, b, i0, h, Br, rows, a.d, NTH);
    issue(Ks, a.k, 0, false);
    issue(Vs, a.v, 0, !kSplit);

    float o[MT][DT][4], m_raw[MT][2], l_part[MT][2];
    fwd_state_init(o, m_raw, l_part);
    const float scale_log2 = (float)(a.scale * 1.4426950408889634);
    const int64_t row_w = i0 + warp * 16 * MT + g; /* + 16 mt + 8 r */
    const float slope = kMasked && a.alibi ? a.alibi[b * a.alibi_sb + h] : 0.f;

    for (int jb = 0; jb < nblocks; jb++) {
        const int64_t j0 = walk.start(jb);
        cp_async_wait<1>(); /* K_j (and Q) landed */
        if (!kSplit) { /* 3xTF32 splits fragments as they are read */
            if (jb == 0)
                round_rows<D>(Qs, Br, NTH);
            round_rows<D>(Ks, Bc, NTH);
        }
        if (kLo)
            split_rows<D>(Ks, Kl, Bc, NTH);
        __syncthreads();

        /* S = Q_i K_j^T (Alg1 L.9). */
        float s[MT][NT][4];
        frag_zero(s);
#pragma unroll
        for (int kg = 0; kg < DT; kg += G) {
            Frag<4, kSplit> af[G][MT];
#pragma unroll
            for (int u = 0; u < G; u++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    lda_rows<LD>(af[u][mt].h, sQ, (warp * MT + mt) * 16, (kg + u) * 8);
                    af[u][mt].split();
                }
#pragma unroll
            for (int n2 = 0; n2 < NT / 2; n2++) {
                float t[MT][2][4]; /* 3xTF32: this group's sums */
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        t[mt][0][e] = t[mt][1][e] = 0.f;
#pragma unroll
                for (int u = 0; u < G; u++) {
                    const int k0 = (kg + u) * 8;
                    Frag<4, kSplit> bf;
                    ldb_rows<LD>(bf.h, sK, n2 * 16, k0);
                    if constexpr (kLo)
                        ldb_rows<LD>(bf.l, sKl, n2 * 16, k0);
                    else
                        bf.split();
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        if constexpr (kSplit) {
                            mma_into(t[mt][0], af[u][mt], bf, 0);
                            mma_into(t[mt][1], af[u][mt], bf, 2);
                        } else { /* TF32: straight into S */
                            mma_into(s[mt][2 * n2], af[u][mt], bf, 0);
                            mma_into(s[mt][2 * n2 + 1], af[u][mt], bf, 2);
                        }
                    }
                }
                if constexpr (kSplit)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            s[mt][2 * n2][e] += t[mt][0][e];
                            s[mt][2 * n2 + 1][e] += t[mt][1][e];
                        }
            }
        }
        __syncthreads(); /* every warp is done with K_j */
        issue(Ks, a.k, jb + 1, false);

        /* Score modifiers, the mask, the online softmax (Alg1 L.10-11)
         * and dropout on the P that feeds O (attn_mma_tile.cuh). */
        if (kMasked && (a.softcap > 0.f || a.alibi))
            fwd_score_mods<true>(a, s, slope, row_w, j0, t4);
        fwd_mask<kMasked, Bc>(a, causal, s, walk, jb, i0, j0, warp, row_w, t4);
        fwd_softmax(s, m_raw, l_part, o, scale_log2);
        if (kDropout && a.dropout) /* 256/T is applied at the end */
            fwd_dropout(a, s, j0, row_w, bh, t4);

        cp_async_wait<1>(); /* V_j landed */
        if (!kSplit) /* rounded, and pair-interleaved for ldb_pairs_il */
            round_rows_pairs<D>(Vs, Bc, NTH);
        if (kLo)
            split_rows<D>(Vs, Vl, Bc, NTH);
        __syncthreads();
        /* O += P V_j (Alg1 L.12): S's n8 tile kk is the pair-permuted A
         * fragment of k8 step kk. */
#pragma unroll
        for (int kg = 0; kg < NT; kg += G) {
            Frag<4, kSplit> pf[G][MT];
#pragma unroll
            for (int u = 0; u < G; u++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    pf[u][mt].from_acc(s[mt][kg + u]);
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                float t[MT][4]; /* 3xTF32: this group's sums */
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    t[mt][0] = t[mt][1] = t[mt][2] = t[mt][3] = 0.f;
#pragma unroll
                for (int u = 0; u < G; u++) {
                    const int kk = kg + u;
                    Frag<2, kSplit> bv;
                    if constexpr (kSplit) { /* fp32 rows, split as read */
                        ldb_pairs<LD>(Vs, kk * 8, dt * 8, &bv.h[0], &bv.h[1]);
                        if constexpr (kLo)
                            ldb_pairs<LD>(Vl, kk * 8, dt * 8, &bv.l[0], &bv.l[1]);
                        else
                            bv.split();
                    } else {
                        ldb_pairs_il<LD>(Vs, kk * 8, dt * 8, &bv.h[0], &bv.h[1]);
                    }
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        if constexpr (kSplit)
                            mma_into(t[mt], pf[u][mt], bv, 0);
                        else
                            mma_into(o[mt][dt], pf[u][mt], bv, 0);
                    }
                }
                if constexpr (kSplit)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            o[mt][dt][e] += t[mt][e];
            }
        }
        __syncthreads(); /* every warp is done with V_j */
        issue(Vs, a.v, jb + 1, !kSplit);
    }
    cp_async_wait<0>(); /* nothing in flight at exit (Q when no block ran) */

    /* Epilogue: full row sums over the quad, O / l * 256/T, m and l;
     * rows that saw nothing get O = 0, NaN rows stay NaN. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = l_part[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int64_t i = row_w + mt * 16 + 8 * r;
            const float inv = l != 0.f ? (float)a.keep_scale / l : 0.f;
            if (i >= a.Nq)
                continue;
            float *dst = elem<float>(a.o, b, i, h);
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                const int c = dt * 8 + 2 * t4;
                if (c < a.d)
                    *reinterpret_cast<float2 *>(dst + c) =
                        make_float2(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
            }
            if (t4 == 0) {
                const float mr = m_raw[mt][r];
                ((float *)a.m)[bh * a.Nq + i] = mr == -INFINITY ? -INFINITY : mr * (float)a.scale;
                ((float *)a.l)[bh * a.Nq + i] = l;
            }
        }
}

template <int D, int NW, bool kSplit, bool kLo = false>
static fg_status launch(const AttnArgs &a, cudaStream_t st)
{
    using Tile = FwdTile<D, NW, kLo>;
    return with_mode(a, [&](auto mode, auto drop) {
        auto kern = fwd_kernel<D, NW, decltype(mode)::value, decltype(drop)::value, kSplit, kLo>;
        FG_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)Tile::kSmem));
        const int64_t nqb = (a.Nq + Tile::kBr - 1) / Tile::kBr;
        return launch_grids(heads_fastest(decltype(mode)::value == 2, a.causal), nqb, a.H, a.B,
                            [&](dim3 grid, int64_t c) {
                                kern<<<grid, Tile::kThreads, Tile::kSmem, st>>>(
                                    a, (int)c, (int)(nqb - 1 - c));
                            });
    });
}

} /* namespace tf32 */

fg_status attn_tf32_fwd(const AttnArgs &a, size_t smem_limit, cudaStream_t st, bool *ran)
{
    *ran = false;
    const tf32::Prec prec = tf32::precision(a, false);
    if (prec == tf32::Prec::kNone)
        return FG_OK;
    return f32::with_pad_d(a.d, [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        const bool split = tf32::kHaveSplit && prec == tf32::Prec::kSplit;
        auto run = [&](auto nw) { /* 3xTF32 or TF32 on blocks of NW warps */
            constexpr int NW = decltype(nw)::value;
            *ran = true;
            if constexpr (tf32::kHaveSplit)
                if (split)
                    return tf32::launch<D, NW, true>(a, st);
            return tf32::launch<D, NW, false>(a, st);
        };
        if constexpr (D == 256)
            if (tf32::FwdTile<D, 8>::kSmem <= smem_limit && !env_is("FG_ATTN_TF32_WIDE", "0"))
                return run(std::integral_constant<int, 8>());
        if constexpr (D == 128 && tf32::kHaveSplit) {
            using Lo = tf32::FwdTile<D, 8, true>;
            if (split && Lo::kSmem <= smem_limit && !env_is("FG_ATTN_TF32X3_TILES", "0")) {
                *ran = true;
                return tf32::launch<D, 8, true, true>(a, st);
            }
        }
        if (tf32::FwdTile<D>::kSmem > smem_limit)
            return FG_OK; /* *ran stays false: the SIMT kernel runs */
        return run(std::integral_constant<int, 4>());
    });
}

} /* namespace fg */
