/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_tf32_bwd.cu - fp32 FlashAttention backward on TF32
 * tensor cores (mma.sync m16n8k8, sm_80+): TF32 (the opt-in of
 * fg_cuda_set_attention_allow_tf32) or, with kSplit, strict fp32 by the
 * 3xTF32 split of every operand (attn_tf32.cuh). Algorithm 4 in
 * FlashAttention-2's form (D = rowsum(dO * O) from attn_bwd.cu's
 * preprocessing), the structure of the fp16/bf16 kernel (attn_bwd_mma.cu)
 * with fp32 tiles (attn_tf32.cuh).
 *
 * One block of 4 warps per (64 keys, K/V head, batch); warp w owns keys
 * 16w .. 16w+15 and keeps their dK, dV in registers. 3xTF32 at d = 128
 * (kLo): 8 warps and 128 keys, with Q_i and dO_i split once a step into
 * shared memory (TF32 part in place, remainder tiles) instead of twice
 * by every warp in registers (H200, N 2k-8k: 37.6-37.9 TFLOP/s against
 * 36.2-36.7 unmasked, 33.8-37.3 against 30.2-34.6 causal, session 41).
 * K, V are loaded (and in TF32 mode rounded) once; for each query head
 * of the group and each query block of BR rows (Q_i, dO_i through one
 * buffer; a second block per SM overlaps the loads for d <= 128 on an
 * H100):
 *   S^T  = K Q_i^T                   P^T = exp2(S^T scale log2e - lse2)
 *   dP^T = V dO_i^T                  dS^T = P^T (dP^T Z - D_i)
 *   dV  += (P^T Z) dO_i              dK  += dS^T Q_i
 *   dQ_i += dS K  (dS^T through shared memory, fp32 atomics)
 * The transposed products leave P^T and dS^T in the accumulator layout,
 * which the pair permutation (attn_tf32.cuh) makes the A operand of the
 * dV and dK products, 8 queries at a time, so each k8 step's fragments
 * die at once. For d = 256 the dK/dV accumulators do not fit in
 * registers: where 220 KiB of shared memory fits (H100, H200), blocks of
 * 8 warps in pairs (BwdTile::kPair): the pair's first warp computes S^T,
 * the second dP^T, they swap tiles, and each keeps dK/dV of one d half;
 * elsewhere two launches each own half of d (and recompute S, dP), the
 * first also doing dQ. With deterministic = 1 dQ is left to the strict dQ
 * kernel (attn_fp32_dq), which sums it in a fixed order.
 *
 * kMode: 0 no mask or bottom-right causal (a.causal, at run time), 2 the
 * variants, as in attn_bwd_mma.cu; the softcap's 1 - tanh^2 comes from
 * the recomputed logit with tanhf. */
#include "attn_tf32.cuh"
#include "kernels/runtime/cuda_check.h"

namespace fg {
namespace tf32 {

/* D: head dim (padded); BR: queries per step; DH: the d slice whose dK/dV
 * a launch accumulates (D, or D / 2 for d = 256). */
template <int D, int BR, int DH, int NW = 4, bool kLo = false> struct BwdTile {
    static constexpr int kThreads = 32 * NW; /* NW warps */
    /* kPair (8 warps owning half of d each): warps w and w + 4 share keys
     * 16w .. 16w+15; w computes their S^T, w + 4 their dP^T, over all of
     * d, and each hands its tile to the other (kXchg floats), so that
     * both own dK, dV of one d half without recomputing either product. */
    static constexpr bool kPair = DH < D && NW == 8;
    static constexpr int kKeyWarps = kPair ? NW / 2 : NW;
    static constexpr int kBc = 16 * kKeyWarps; /* keys per block, 16 per warp */
    static constexpr int kLd = D + 4;
    static constexpr int kLdS = BR + 4; /* dS^T [key][query] row */
    static constexpr int kXchg = kPair ? NW * 32 * (BR / 2) : 0;
    /* K, V, Q, dO (kLo: and the remainders of Q, dO), dS^T, lse2 and D
     * per query, the pairs' exchange. */
    static constexpr size_t kSmem =
        sizeof(float) * ((size_t)(2 * kBc + (kLo ? 4 : 2) * BR) * kLd + (size_t)kBc * kLdS +
                         2 * BR + (size_t)kXchg);
};


/* c0 += A0 B0^T and, with kTwo, c1 += A1 B1^T, over the D contraction in
 * one k loop: A this warp's 16 rows (m0 ..) of a row-major [m][D] tile, B
 * the QT n8 tiles of an [n][D] tile (shared addresses). G > 1 (3xTF32,
 * one product): G k steps summed in each tile before it is added, as in
 * attn_tf32_fwd.cu. */
template <bool kSplit, bool kTwo, int LD, int D, int QT, bool kBLo = false, int G = 1>
__device__ __forceinline__ void nt_products(float (&c0)[QT][4], uint32_t a0, uint32_t b0,
                                            float (&c1)[QT][4], uint32_t a1, uint32_t b1, int m0,
                                            uint32_t b0l = 0)
{
    if constexpr (G > 1) {
        static_assert(kSplit && !kTwo && (D / 8) % G == 0, "groups: 3xTF32, one product");
#pragma unroll
        for (int kg = 0; kg < D / 8; kg += G) {
            Frag<4, true> fa[G];
#pragma unroll
            for (int u = 0; u < G; u++) {
                lda_rows<LD>(fa[u].h, a0, m0, (kg + u) * 8);
                fa[u].split();
            }
#pragma unroll
            for (int n2 = 0; n2 < QT / 2; n2++) {
                float t[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
                for (int u = 0; u < G; u++) {
                    Frag<4, true> fb;
                    ldb_rows<LD>(fb.h, b0, n2 * 16, (kg + u) * 8);
                    if constexpr (kBLo)
                        ldb_rows<LD>(fb.l, b0l, n2 * 16, (kg + u) * 8);
                    else
                        fb.split();
                    mma_into(t[0], fa[u], fb, 0);
                    mma_into(t[1], fa[u], fb, 2);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    c0[2 * n2][e] += t[0][e];
                    c0[2 * n2 + 1][e] += t[1][e];
                }
            }
        }
    } else {
#pragma unroll
        for (int kk = 0; kk < D / 8; kk++) {
            Frag<4, kSplit> fa0, fa1;
            lda_rows<LD>(fa0.h, a0, m0, kk * 8);
            fa0.split();
            if constexpr (kTwo) {
                lda_rows<LD>(fa1.h, a1, m0, kk * 8);
                fa1.split();
            }
#pragma unroll
            for (int n2 = 0; n2 < QT / 2; n2++) {
                Frag<4, kSplit> fb0, fb1;
                ldb_rows<LD>(fb0.h, b0, n2 * 16, kk * 8);
                if constexpr (kBLo) /* B's split made once, in shared memory */
                    ldb_rows<LD>(fb0.l, b0l, n2 * 16, kk * 8);
                else
                    fb0.split();
                if constexpr (kTwo) {
                    ldb_rows<LD>(fb1.h, b1, n2 * 16, kk * 8);
                    fb1.split();
                }
                mma(c0[2 * n2], fa0, fb0, 0);
                mma(c0[2 * n2 + 1], fa0, fb0, 2);
                if constexpr (kTwo) {
                    mma(c1[2 * n2], fa1, fb1, 0);
                    mma(c1[2 * n2 + 1], fa1, fb1, 2);
                }
            }
        }
    }
}

template <int D, int BR, int DH, int kMode, bool kDropout, bool kSplit, int NW, bool kLo>
__global__ void __launch_bounds__(32 * NW)
    bwd_kernel(const AttnArgs a, const int dslice, const int blk0)
{
    constexpr bool kMasked = kMode == 2;
    /* Plain causal: a runtime flag, not an instantiation (build time; see
     * fwd_mask). The variants' band carries their causality. */
    const bool causal = !kMasked && a.causal;
    using Tile = BwdTile<D, BR, DH, NW, kLo>;
    static_assert(!kLo || (kSplit && DH == D), "remainder tiles are 3xTF32's, one d slice");
    constexpr int Bc = Tile::kBc, Br = BR, LD = Tile::kLd, LDS = Tile::kLdS;
    constexpr int NTH = Tile::kThreads;
    constexpr int QT = Br / 8; /* n8 tiles of S^T over queries */
    constexpr int DT = DH / 8; /* n8 tiles of this launch's (warp's) d slice */
    constexpr bool kPair = Tile::kPair;
    static_assert(!kPair || DH * 2 == D, "pairs own halves of d");
    /* 3xTF32 S^T and dP^T: k steps per tile (nt_products), 2 at d = 128 */
    constexpr int kGroupS = kSplit && D == 128 ? 2 : kPair ? 2 : 1;
    extern __shared__ __align__(128) float smem_f[];
    float *Ks = smem_f, *Vs = Ks + Bc * LD, *Qs = Vs + Bc * LD, *dOs = Qs + Br * LD;
    float *Ql = dOs + Br * LD, *dOl = Ql + Br * LD; /* kLo only */
    float *dST = kLo ? dOl + Br * LD : Ql, *lse2_s = dST + Bc * LDS, *D_s = lse2_s + Br;
    float4 *xch = reinterpret_cast<float4 *>(D_s + Br); /* kPair: [warp][qt][lane] */
    const uint32_t sK = smem_u32(Ks), sV = smem_u32(Vs), sQ = smem_u32(Qs), sdO = smem_u32(dOs);
    const uint32_t sQl = smem_u32(Ql), sdOl = smem_u32(dOl);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    /* kw: this warp's 16 keys; half: its d half (kPair) */
    const int kw = kPair ? warp % Tile::kKeyWarps : warp, half = kPair ? warp / Tile::kKeyWarps : 0;
    const int dbase = (kPair ? half : dslice) * DH;
    /* Masked: the grid is (Hk, key blocks from blk0, B), heads fastest
     * (launch): key block 0 walks the most queries, so every head of a
     * batch issues it before any issues block 1. Unmasked: (blocks, Hk, B),
     * a head's blocks together, sharing its Q and dO in L2. */
    const GridPos pos = grid_pos(heads_fastest(kMasked, causal));
    const int64_t j0 = (int64_t)(blk0 + pos.blk) * Bc;
    const int hk = pos.head, b = blockIdx.z;
    const int kvalid = (int)min((int64_t)Bc, (int64_t)a.Nk - j0);
    const float scale_log2 = (float)(a.scale * 1.4426950408889634);

    load_rows<D>(sK, a.k, b, j0, hk, Bc, kvalid, a.d, NTH);
    load_rows<D>(sV, a.v, b, j0, hk, Bc, kvalid, a.d, NTH);
    cp_async_commit();
    cp_async_wait<0>();
    if (!kSplit) { /* published by the first step's barrier */
        round_rows<D>(Ks, Bc, NTH);
        round_rows<D>(Vs, Bc, NTH);
    }

    QuerySteps steps; /* the (head, query block) steps */
    steps.init(a, kMasked, causal, b, hk, j0, Bc, Br);

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[i][e] = dv[i][e] = 0.f;

    for (int64_t st = 0; st < steps.total; st++) {
        int gh;
        int64_t i0;
        const bool dead = steps.locate(a, b, hk, j0, Bc, Br, st, &gh, &i0) && kMasked;
        const int h = hk * a.group + gh;
        const int64_t bh = (int64_t)b * a.H + h;
        const int qvalid = (int)min((int64_t)Br, (int64_t)a.Nq - i0);
        __syncthreads(); /* the previous step's Q, dO, dS^T, lse2, D are consumed */
        /* Alg4 L.11: Q_i, dO_i, and the rows' lse2 and D, on chip. */
        load_rows<D>(sQ, a.q, b, i0, h, Br, qvalid, a.d, NTH);
        load_rows<D>(sdO, a.dout, b, i0, h, Br, qvalid, a.d, NTH);
        cp_async_commit();
        for (int r = threadIdx.x; r < Br; r += NTH) {
            const bool in = r < qvalid;
            lse2_s[r] = in ? row_lse2(a, bh, i0 + r) : INFINITY;
            D_s[r] = in ? ((const float *)a.D)[bh * a.Nq + i0 + r] : 0.f;
        }
        cp_async_wait<0>();
        if (!kSplit) {
            round_rows<D>(Qs, Br, NTH);
            round_rows<D>(dOs, Br, NTH);
        }
        if (kLo) {
            split_rows<D>(Qs, Ql, Br, NTH);
            split_rows<D>(dOs, dOl, Br, NTH);
        }
        __syncthreads();

        /* S^T = K Q_i^T (Alg4 L.12), dP^T = V dO_i^T (L.18), this warp's
         * 16 keys: in one k loop, or (3xTF32, twice the fragment
         * registers) one after the other. */
        float s[QT][4], dp[QT][4];
#pragma unroll
        for (int i = 0; i < QT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[i][e] = dp[i][e] = 0.f;
        if constexpr (kPair) {
            /* S^T by the first warp of a pair, dP^T by the second; each
             * then takes the other's tile through shared memory. */
            float x[QT][4];
#pragma unroll
            for (int i = 0; i < QT; i++)
                x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.f;
            nt_products<kSplit, false, LD, D, QT, false, kSplit ? kGroupS : 1>(
                x, half ? sV : sK, half ? sdO : sQ, x, 0, 0, kw * 16);
#pragma unroll
            for (int qt = 0; qt < QT; qt++)
                xch[(warp * QT + qt) * 32 + lane] = make_float4(x[qt][0], x[qt][1], x[qt][2], x[qt][3]);
            pair_sync(1 + kw, 64);
            const int other = warp ^ Tile::kKeyWarps;
#pragma unroll
            for (int qt = 0; qt < QT; qt++) {
                const float4 o = xch[(other * QT + qt) * 32 + lane];
                const float y[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[qt][e] = half ? y[e] : x[qt][e];
                    dp[qt][e] = half ? x[qt][e] : y[e];
                }
            }
            /* The next write of xch follows the next step's block barrier,
             * after both warps read it. */
        } else if constexpr (kSplit) {
            nt_products<true, false, LD, D, QT, kLo, kGroupS>(s, sK, sQ, s, 0, 0, kw * 16, sQl);
            nt_products<true, false, LD, D, QT, kLo, kGroupS>(dp, sV, sdO, dp, 0, 0, kw * 16, sdOl);
        } else {
            nt_products<false, true, LD, D>(s, sK, sQ, dp, sV, sdO, kw * 16);
        }

        /* P^T (Alg4 L.13-14), dropout (L.15-16, 19), dS^T (L.20-21), then
         * this 8-query slice's share of dV and dK. Element e of tile qt:
         * key j = j0 + 16 warp + g + 8 (e >> 1), query i = i0 + 8 qt +
         * 2 t4 + (e & 1). kMasked: softcap and ALiBi on the raw S^T first;
         * the mask is the rows each of this thread's two keys is seen by. */
        const BwdMask mk = bwd_mask<kMasked, Bc, Br>(a, causal, dead, i0, j0, kw, g);
        const float slope = kMasked && a.alibi ? a.alibi[b * a.alibi_sb + h] : 0.f;
        uint32_t keep = 0; /* bwd_dropout_bits of the current 16 queries */
        static_assert(QT % 2 == 0, "dropout draws 16 queries at a time");
        /* 3xTF32 at d = 128 and in pairs: GV query slices (k steps of dV,
         * dK) per tile, as nt_products' groups. */
        constexpr int GV = kSplit ? kGroupS : 1;
        static_assert(QT % GV == 0 && (GV == 1 || GV == 2), "whole groups of slices");
#pragma unroll
        for (int qg = 0; qg < QT; qg += GV) {
            Frag<4, kSplit> pf[GV], sf[GV];
#pragma unroll
            for (int u = 0; u < GV; u++) {
                const int qt = qg + u;
                float p[4], ds[4];
                /* Alg4 L.15: the keep bits of 16 queries, drawn at even qt */
                if (kDropout && !(qt & 1)) /* without dropout: all kept, z = 1 */
                    keep = a.dropout ? bwd_dropout_bits(a, bh, i0 + 8 * qt, j0 + 16 * kw, g, t4)
                                     : ~0u;
                const float2 L = *reinterpret_cast<const float2 *>(lse2_s + 8 * qt + 2 * t4);
                const float2 Dq = *reinterpret_cast<const float2 *>(D_s + 8 * qt + 2 * t4);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = 8 * qt + 2 * t4 + (e & 1);
                    bwd_elem<true, kMasked, kDropout>(
                        a, mk, s[qt][e], dp[qt][e], (e & 1) ? L.y : L.x, (e & 1) ? Dq.y : Dq.x,
                        qi, e >> 1, i0 + qi, j0 + 16 * kw + g + 8 * (e >> 1), slope,
                        scale_log2, (keep >> (4 * (qt & 1) + e)) & 1u, 0.f, false, &p[e],
                        &ds[e]);
                }
                pf[u].from_acc(p);
                sf[u].from_acc(ds);
                /* dS^T to shared memory for dQ, [key][query]: rounded
                 * (TF32), or fp32 to be split when read (3xTF32). */
                float *d0 = dST + (16 * kw + g) * LDS + 8 * qt + 2 * t4;
                if (kPair && half) {
                    /* the pair's first warp writes the same dS^T */
                } else if constexpr (kSplit) {
                    *reinterpret_cast<float2 *>(d0) = make_float2(ds[0], ds[1]);
                    *reinterpret_cast<float2 *>(d0 + 8 * LDS) = make_float2(ds[2], ds[3]);
                } else {
                    *reinterpret_cast<float2 *>(d0) =
                        make_float2(__uint_as_float(sf[u].h[0]), __uint_as_float(sf[u].h[2]));
                    *reinterpret_cast<float2 *>(d0 + 8 * LDS) =
                        make_float2(__uint_as_float(sf[u].h[1]), __uint_as_float(sf[u].h[3]));
                }
            }
            /* dV += (P^T Z) dO_i (Alg4 L.17), dK += dS^T Q_i (L.23): the
             * B fragment of rows 8 qt.. of dO_i or Q_i (its low part stored,
             * kLo, or split off), into the group's sum t (GV > 1, added
             * after the group) or straight into the accumulator. */
            auto ldb_mma = [&](Frag<2, kSplit> &bf, const float *hi, const float *lo,
                               const Frag<4, kSplit> &af, float (&t)[4], float (&c)[4], int qt,
                               int dt) {
                ldb_pairs<LD>(hi, 8 * qt, dbase + dt * 8, &bf.h[0], &bf.h[1]);
                if constexpr (kLo)
                    ldb_pairs<LD>(lo, 8 * qt, dbase + dt * 8, &bf.l[0], &bf.l[1]);
                else
                    bf.split();
                if constexpr (GV > 1)
                    mma_into(t, af, bf, 0);
                else
                    mma(c, af, bf, 0);
            };
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                float tv[4] = {0.f, 0.f, 0.f, 0.f}, tk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int u = 0; u < GV; u++) {
                    Frag<2, kSplit> bf; /* one for both, as before the helper */
                    ldb_mma(bf, dOs, dOl, pf[u], tv, dv[dt], qg + u, dt);
                    ldb_mma(bf, Qs, Ql, sf[u], tk, dk[dt], qg + u, dt);
                }
                if constexpr (GV > 1)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        dv[dt][e] += tv[e];
                        dk[dt][e] += tk[e];
                    }
            }
        }
        __syncthreads(); /* dS^T complete in shared memory */

        /* dQ_i += scale dS K (Alg4 L.22), by the first slice's launch:
         * warp w takes query m-tile w % (Br/16) and a 1/parts slice of d;
         * fp32 atomics into the accumulator. */
        if (dslice == 0 && !a.deterministic) {
            constexpr int MTS = Br / 16, parts = NW / MTS, DW = D / parts;
            const int mt = warp % MTS, part = warp / MTS;
            float q[DW / 8][4];
#pragma unroll
            for (int i = 0; i < DW / 8; i++)
                q[i][0] = q[i][1] = q[i][2] = q[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < Bc / 8; kk++) {
                Frag<4, kSplit> af;
                lda_pairs_t<LDS>(af.h, dST, kk * 8, mt * 16);
                af.split();
#pragma unroll
                for (int nt = 0; nt < DW / 8; nt++) {
                    Frag<2, kSplit> bk;
                    ldb_pairs<LD>(Ks, kk * 8, part * DW + nt * 8, &bk.h[0], &bk.h[1]);
                    bk.split();
                    mma(q[nt], af, bk, 0);
                }
            }
            const float sc = (float)a.scale;
            float *dqa = (float *)a.dq_acc + (bh * a.Nq + i0) * (int64_t)a.d;
            dq_tile_red<DW>(a, dqa, q, sc, i0, mt, part, g, t4);
        }
    }

    /* Alg4 L.25: dK = scale * acc, dV; keys past Nk and padded d skipped,
     * keys no query sees get 0. */
    const float sc = (float)a.scale;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int kr = 16 * kw + g + 8 * r;
        if (kr >= kvalid)
            continue;
        float *dkp = elem<float>(a.dk, b, j0 + kr, hk), *dvp = elem<float>(a.dv, b, j0 + kr, hk);
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            const int c = dbase + dt * 8 + 2 * t4;
            if (c < a.d) {
                *reinterpret_cast<float2 *>(dkp + c) =
                    make_float2(dk[dt][2 * r] * sc, dk[dt][2 * r + 1] * sc);
                *reinterpret_cast<float2 *>(dvp + c) = make_float2(dv[dt][2 * r], dv[dt][2 * r + 1]);
            }
        }
    }
}

template <int D, int BR, int DH, bool kSplit, int NW = 4, bool kLo = false>
static fg_status launch(const AttnArgs &a, cudaStream_t st)
{
    using Tile = BwdTile<D, BR, DH, NW, kLo>;
    return with_mode(a, [&](auto mode, auto drop) {
        auto kern =
            bwd_kernel<D, BR, DH, decltype(mode)::value, decltype(drop)::value, kSplit, NW, kLo>;
        FG_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)Tile::kSmem));
        const int64_t nkb = (a.Nk + Tile::kBc - 1) / Tile::kBc;
        /* Slices past the real head dim have nothing to write; pairs
         * cover both halves in one launch. */
        for (int slice = 0; slice < (Tile::kPair ? 1 : D / DH) && slice * DH < a.d; slice++)
            FG_TRY(launch_grids(heads_fastest(decltype(mode)::value == 2, a.causal), nkb, a.Hk, a.B,
                                [&](dim3 grid, int64_t c) {
                                    kern<<<grid, Tile::kThreads, Tile::kSmem, st>>>(a, slice,
                                                                                    (int)c);
                                }));
        return FG_OK;
    });
}

/* Queries per step and d slice per padded head dim: 64 rows where two
 * blocks still fit an H100's SM (d <= 64), 32 above; d = 256 in halves.
 * kNarrow: 32 rows at d <= 64 too, which 3xTF32 takes for masked work
 * (causal, the variants): the diagonal's partly dead steps cost less, and
 * its fragments' split halves fit (no spills, where 64 rows spill 228-464
 * bytes). Unmasked work keeps 64 despite the spills: on an H200 (N 4k,
 * session 41) 32 rows ran d 32 / 64 at 37.0 / 36.6 TFLOP/s against 38.4
 * with 64, and causal at 35.9 / 35.2 against 33.8 / 32.5. */
template <int D, bool kNarrow = false> struct BwdCfg {
    static constexpr int kBr = D <= 64 && !kNarrow ? 64 : 32;
    static constexpr int kDh = D == 256 ? 128 : D;
    typedef BwdTile<D, kBr, kDh> Tile;
};

} /* namespace tf32 */

fg_status attn_tf32_bwd(const AttnArgs &a, size_t smem_limit, cudaStream_t st, bool *ran)
{
    *ran = false;
    const tf32::Prec prec = tf32::precision(a, true);
    if (prec == tf32::Prec::kNone)
        return FG_OK;
    if (a.deterministic && attn_fp32_dq_smem(a.d) > smem_limit)
        return FG_OK; /* the strict path decides where its dQ runs */
    return f32::with_pad_d(a.d, [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        using Cfg = tf32::BwdCfg<D>;
        using CfgS = tf32::BwdCfg<D, true>;
        /* No 3xTF32 backward at d = 256: it recomputes S per d half, three
         * MMAs a product each time, and ran at 11.2-11.5 TFLOP/s where the
         * SIMT kernels give 15.6-17.9 (H200, N 4k, session 40). */
        constexpr bool kSplitHere = tf32::kHaveSplit && D <= 128;
        const bool split = prec == tf32::Prec::kSplit;
        /* d = 256: pairs of warps (BwdTile::kPair), 8 warps a block,
         * unless FG_ATTN_TF32_PAIR=0: then TF32 runs the two launches of
         * d halves (each recomputing S^T and dP^T, 4 warps and 208 KiB a
         * block) and 3xTF32 the SIMT kernels (3xTF32 ran those launches
         * at 11.2-11.5 TFLOP/s against SIMT's 15.6-17.9, session 40). */
        if constexpr (D == 256) {
            using Pair = tf32::BwdTile<D, Cfg::kBr, Cfg::kDh, 8>;
            if (Pair::kSmem <= smem_limit && !env_is("FG_ATTN_TF32_PAIR", "0")) {
                *ran = true;
                bool done = false;
                if constexpr (tf32::kHaveSplit)
                    if (split) {
                        FG_TRY((tf32::launch<D, Cfg::kBr, Cfg::kDh, true, 8>(a, st)));
                        done = true;
                    }
                if (!done)
                    FG_TRY((tf32::launch<D, Cfg::kBr, Cfg::kDh, false, 8>(a, st)));
                return a.deterministic ? attn_fp32_dq(a, st) : FG_OK;
            }
        }
        /* d = 128, 3xTF32: 8 warps and 128 keys a block, Q_i and dO_i
         * split once a step into shared memory for all of them (every
         * warp split both tiles twice a step in registers). */
        using Lo = tf32::BwdTile<D, Cfg::kBr, Cfg::kDh, 8, true>;
        const bool tiles = D == 128 && split && Lo::kSmem <= smem_limit &&
                           !env_is("FG_ATTN_TF32X3_TILES", "0");
        const bool narrow = split && !tiles && (a.causal || a.variant);
        const size_t smem = tiles ? Lo::kSmem : narrow ? CfgS::Tile::kSmem : Cfg::Tile::kSmem;
        if (smem > smem_limit || (split && !kSplitHere))
            return FG_OK; /* *ran stays false: the SIMT kernels run */
        *ran = true;
        if constexpr (kSplitHere) {
            if constexpr (D == 128)
                if (tiles)
                    FG_TRY((tf32::launch<D, Cfg::kBr, Cfg::kDh, true, 8, true>(a, st)));
            if (narrow)
                FG_TRY((tf32::launch<D, CfgS::kBr, CfgS::kDh, true>(a, st)));
            else if (split && !tiles)
                FG_TRY((tf32::launch<D, Cfg::kBr, Cfg::kDh, true>(a, st)));
        }
        if (!split)
            FG_TRY((tf32::launch<D, Cfg::kBr, Cfg::kDh, false>(a, st)));
        return a.deterministic ? attn_fp32_dq(a, st) : FG_OK;
    });
}

} /* namespace fg */
