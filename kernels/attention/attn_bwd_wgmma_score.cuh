/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_score.cuh - the score tile of the sm_90a
 * wgmma backward (attn_bwd_wgmma.cuh), element by element: the score
 * modifiers and masks on S^T (softcap, ALiBi, an additive bias, causal,
 * window and block masks), P^T and the dropout decisions (Alg. 4 lines
 * 13-16), the softcap's factor in dS^T and dbias. A variant's per-element
 * work lives here; the kernel runs the products and hand-offs around it.
 *
 * Score-tile element x of a thread (S^T, dP^T, P^T, dS^T all share the
 * accumulator layout): key j0 + key_base + 16 warp + g + 8 ((x >> 1) & 1),
 * query i0 + 8 (x >> 2) + 2 t4 + (x & 1). One object a thread and step,
 * made where the kernel has the step's values. */
#ifndef FG_KERNELS_ATTN_BWD_WGMMA_SCORE_CUH
#define FG_KERNELS_ATTN_BWD_WGMMA_SCORE_CUH

#include "attn_bwd_wgmma_traits.cuh"
#include "attn_common.cuh"
#include "attn_dropout.cuh"
#include "wgmma_sm90.cuh"

#include <stdint.h>
#include <type_traits>

namespace fg {

template <typename T, int D, int kMode, bool kDropout, bool kWide, bool kQ80> struct BwdScore {
    using Tile = BwdTile<D, kWide, kQ80>;
    static constexpr bool kCausal = kMode == 1, kMasked = kMode >= 2;
    static constexpr bool kMods = kmode_mods(kMode); /* softcap, ALiBi (none in 6, 7) */
    static constexpr bool kBias = kMode == 4 || kMode == 5;
    static constexpr bool btma = BwdBiasTile<D, kMode>::value; /* the bias by TMA */
    static constexpr int Bc = Tile::kBc, Br = Tile::kBr;
    /* dropout keep bits, one per score element of a thread (Br / 2) */
    using Keep = typename std::conditional<(Br > 64), uint64_t, uint32_t>::type;

    /* The kernel's values by reference, as its lambdas captured them (as
     * BwdDQ does: copies can change the generated code). The block's: */
    const AttnArgs &a;
    const uint32_t &base;
    const int &b, &wg, &warp, &lane, &g, &t4, &key_base;
    const int64_t &j0;
    const bool &drop;
    float *const &xch; /* BwdDropX: the warp pairs' dropout words */
    const float &inv_scale, &inv_cap, &cap_k, &cap_k1, &cap_k2, &exp_k;
    const bool &cap_units; /* softcap alone: S^T kept as tanh (the kernel's note) */
    const int64_t &bias_s2, &bias_s3;
    const void *const &bias_p;
    const bool &bias_f32, &dbias_store, &dbias_atomic;
    const int64_t (&dbs)[4], (&dba)[4]; /* dbias's strides, dbias_acc's */
    /* the step's: */
    const int64_t &st, &i0, &bh;
    const bool &dead, &need_mask;
    const float &slope, &dist0, &ks; /* ALiBi's slope and base distance; 1 / (1 - p) */
    const float *const &lse2;
    const int64_t &bias_base, &dbias_base;
    const int &rows_left, &keys_left;
    const uint32_t &sBw; /* btma: this warpgroup's bias panel of the step's stage */

    /* ALiBi's |i - j + shift| of element e from the step's dist0 and a
     * compile-time offset, in 32-bit float (exact below 2^24). */
    __device__ __forceinline__ float alibi_dist(int e) const {
        return fabsf(dist0 + (float)(8 * (e >> 2) + (e & 1) - 8 * ((e >> 1) & 1)));
    }

    /* kBias: the bias of score element e (0 outside the problem): the
     * step's base offset and row / key bounds, and per element a
     * compile-time row and key offset (bias_at per element cost the index
     * arithmetic and parameter reloads every time). Loading all of them
     * before the S^T product instead spilled and ran slower. btma: from
     * the warpgroup's bias panel of the step's stage (sBw); element (query
     * q, key column c of the panel) at row q, chunk (c / 8) ^ (q % 8), so
     * this thread's element e at q = 8 (e >> 2) + 2 t4 + (e & 1), c = 16
     * warp + 8 ((e >> 1) & 1) + g. */
    __device__ __forceinline__ float bias_of(int e) const {
        if constexpr (kBias) {
            if (btma) {
                extern __shared__ unsigned char smem[]; /* the kernel's */
                const int q = 8 * (e >> 2) + 2 * t4 + (e & 1), ch = 2 * warp + ((e >> 1) & 1);
                return to_acc(*reinterpret_cast<const T *>(
                    smem + (sBw - base) + q * 128 + ((ch ^ (q & 7)) << 4) + 2 * g));
            }
            const int r = 8 * (e >> 2) + (e & 1), c = 8 * ((e >> 1) & 1);
            if (r >= rows_left || c >= keys_left)
                return 0.f;
            const int64_t off = bias_base + r * bias_s2 + c * bias_s3;
            return bias_f32 ? ((const float *)bias_p)[off] : to_acc(((const T *)bias_p)[off]);
        }
        return 0.f;
    }

    /* Lane L's row address for ldmatrix/stmatrix (.trans) of matrices
     * 4u .. 4u + 3 of the panel: matrix m = 4u + L / 8 holds queries
     * 8 (m / 2) .., key columns 16 warp + 8 (m % 2) ..; lane L gives row
     * L % 8. Its transposed fragment is elements 2m, 2m + 1 of the
     * accumulator layout (e = 4n + 2rr + (0, 1)). */
    __device__ __forceinline__ uint32_t bias_mat(int u) const {
        const int m = 4 * u + (lane >> 3), rho = lane & 7;
        return sBw + (uint32_t)((8 * (m >> 1) + rho) * 128 + (((2 * warp + (m & 1)) ^ rho) << 4));
    }

    /* bias_flags bit 2: a broadcast dbias (batch and/or head) as fp32
     * sums in dbias_acc (16-byte aligned rows, keys contiguous). The
     * warpgroup's dS panel, rounded to T by the stage, goes out as
     * vector reductions, 16 bytes of the panel (8 keys of a query row)
     * per thread and turn, rows of 256 bytes per 8 lanes; the per-pair
     * fp32 atomics of kMode 4 cost 4x the backward's time (H200,
     * [H, 2k, 2k] dbias). Keys past Nk: scalar atomics. */
    __device__ __forceinline__ void dbias_reduce(int64_t i0r, int hr) const {
        extern __shared__ unsigned char smem[]; /* the kernel's */
        float *dst = (float *)a.dbias_acc + b * dba[0] + (int64_t)hr * dba[1];
        const int tw = threadIdx.x % 128;
#pragma unroll
        for (int k = 0; k < Br * 8 / 128; k++) {
            const int u = tw + 128 * k, q = u >> 3, ch = u & 7;
            const int64_t i = i0r + q, j = j0 + key_base + 8 * ch;
            if (i >= a.Nq || j >= a.Nk)
                continue;
            const uint4 w = *reinterpret_cast<const uint4 *>(
                smem + (sBw - base) + q * 128 + ((ch ^ (q & 7)) << 4));
            const float2 f0 = unpack2<T>(w.x), f1 = unpack2<T>(w.y), f2 = unpack2<T>(w.z),
                         f3 = unpack2<T>(w.w);
            float *p = dst + i * dba[2] + j;
            if (j + 8 <= a.Nk) {
                red_add_v4(p, f0.x, f0.y, f1.x, f1.y);
                red_add_v4(p + 4, f2.x, f2.y, f3.x, f3.y);
            } else {
                const float f[8] = {f0.x, f0.y, f1.x, f1.y, f2.x, f2.y, f3.x, f3.y};
#pragma unroll
                for (int e = 0; e < 8; e++) /* constant indices: f stays in registers */
                    if (e < a.Nk - j)
                        atomicAdd(p + e, f[e]);
            }
        }
    }

    /* Score modifiers (kMasked: softcap, ALiBi; kBias: the bias) on the
     * raw S^T, then masked scores -> -inf -> P = 0. */
    __device__ __forceinline__ void mask(float (&x)[Br / 2]) const {
        if constexpr (kMasked) {
            if (kMods && cap_units) {
#pragma unroll
                for (int e = 0; e < Br / 2; e++)
                    x[e] = tanh_fast(x[e] * cap_k1);
            } else if (kMods && a.softcap > 0.f) { /* (cap t - ALiBi) / scale */
                const float sl = slope * inv_scale;
#pragma unroll
                for (int e = 0; e < Br / 2; e++) {
                    const float t = tanh_fast(x[e] * cap_k1);
                    x[e] = a.alibi ? fmaf(t, cap_k2, -sl * alibi_dist(e)) : t * cap_k2;
                }
            } else if (kMods && a.alibi) {
                /* ALiBi alone, in S's units: x - (slope / scale) |d|,
                 * two operations an element (the forward's alibi_acc,
                 * S^T starting as the bias, was 20% slower here: the
                 * d = 128 kernels' wgmmas serialised, ptxas C7512) */
                const float sl = slope * inv_scale;
#pragma unroll
                for (int e = 0; e < Br / 2; e++)
                    x[e] = fmaf(-sl, alibi_dist(e), x[e]);
            }
            if constexpr (kBias) { /* + bias in raw units (the scale is in exp2) */
                if (btma) { /* four transposed 8 x 8 loads per 32 elements */
#pragma unroll
                    for (int u = 0; u < Br / 16; u++) {
                        uint32_t r4[4];
                        ldmatrix_x4_trans(r4, bias_mat(u));
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const int e = 2 * (4 * u + j); /* matrix 4u + j: n = 2u + j / 2, rr = j % 2 */
                            const float2 v = unpack2<T>(r4[j]);
                            x[e] = fmaf(v.x, inv_scale, x[e]);
                            x[e + 1] = fmaf(v.y, inv_scale, x[e + 1]);
                        }
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < Br / 2; e++)
                        x[e] = fmaf(bias_of(e), inv_scale, x[e]);
                }
            }
            if (!need_mask)
                return;
            /* the rows each of this thread's two keys is seen by */
            int2 rr[2];
#pragma unroll
            for (int kk = 0; kk < 2; kk++)
                rr[kk] = dead ? make_int2(Br, -1)
                              : band_rows(a, j0 + key_base + 16 * warp + g + 8 * kk, i0, Br);
#pragma unroll
            for (int e = 0; e < Br / 2; e++) {
                const int off = 8 * (e >> 2) + 2 * t4 + (e & 1);
                const int2 r = rr[(e >> 1) & 1];
                if (off < r.x || off > r.y)
                    x[e] = -INFINITY;
            }
        } else { /* key j is seen by query i0 + off iff j < Nk and
                  * (causal) off >= j - shift - i0: off from a per-key
                  * lower limit, one 32-bit compare an element (as
                  * 64-bit i and j: four) */
            int lo[2];
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                const int64_t j = j0 + key_base + 16 * warp + g + 8 * kk;
                const int64_t l = j >= a.Nk ? Br : kCausal ? j - a.shift - i0 : 0;
                lo[kk] = (int)max((int64_t)0, min(l, (int64_t)Br));
            }
#pragma unroll
            for (int e = 0; e < Br / 2; e++)
                if (8 * (e >> 2) + 2 * t4 + (e & 1) < lo[(e >> 1) & 1])
                    x[e] = -INFINITY;
        }
    }

    /* dS^T through the softcap: times 1 - tanh^2, recovered from P
     * (softcap_grad, per step): t = tanh = (log2 p + lse2) ln2 / cap,
     * less the bias, plus ALiBi, over the cap. cap_rows(qt): lse2 ln2
     * / cap of query rows 8 qt + 2 t4 (+ 1), one load per four
     * elements; cap_grad(p, e, lc) with lc that of e's row. p = 0
     * (masked, log2 p = -inf) gives t = -1 by the clamp, so 0, as the
     * test p > 0 did (a NaN p still makes dS NaN through dl). */
    __device__ __forceinline__ float2 cap_rows(int qt) const {
        const float2 L = *reinterpret_cast<const float2 *>(lse2 + 8 * qt + 2 * t4);
        return make_float2(L.x * cap_k, L.y * cap_k);
    }

    __device__ __forceinline__ float cap_grad(float p, int e, float lc) const {
        if (!kMasked || !kMods || !(a.softcap > 0.f))
            return 1.f;
        float t = fmaf(__log2f(p), cap_k, lc);
        if constexpr (kBias)
            t = fmaf(-bias_of(e), inv_cap, t);
        if (a.alibi)
            t = fmaf(slope * inv_cap, alibi_dist(e), t);
        t = fmaxf(t, -1.f);
        return fmaf(-t, t, 1.f);
    }

    /* The softcap alone (cap_units, S^T = t after mask): the factor
     * 1 - t^2 kept from t itself as f16 pairs (Br / 4 registers) until
     * dS^T, instead of cap_grad's log2 of P, a third MUFU an element
     * beside the tanh and the exp2 (H200, softcap 30 + causal backward,
     * N 8k: d = 128 425-431 -> 468-469 TFLOP/s, d = 64 260 -> 320).
     * Masked t = -inf -> -1 -> 0, as cap_grad; f16's 2^-11 relative is
     * tanh.approx's own error. The kernel says where it is used (kCapG). */
    __device__ __forceinline__ void cap_keep(const float (&x)[Br / 2], uint32_t (&cg)[Br / 4]) const {
#pragma unroll
        for (int e = 0; e < Br / 2; e += 2) {
            const float t0 = fmaxf(x[e], -1.f), t1 = fmaxf(x[e + 1], -1.f);
            cg[e >> 1] = pack2<__half>(fmaf(-t0, t0, 1.f), fmaf(-t1, t1, 1.f));
        }
    }

    __device__ __forceinline__ float cap_kept(const uint32_t (&cg)[Br / 4], int e) const {
        const float2 f = unpack2<__half>(cg[e >> 1]);
        return (e & 1) ? f.y : f.x;
    }

    /* kBias: dbias += dS at the biased logit (before the softcap) for
     * pairs inside the problem that have a probability (masked pairs and
     * empty rows have p = 0); store when nothing is broadcast, fp32
     * atomics otherwise (dbias_base: the step's offset by the strides of
     * either). The deterministic pass runs after this kernel instead
     * (attn_bias.cu). */
    __device__ __forceinline__ void put_dbias(float p, int e, float dl) const {
        if constexpr (kBias) {
            const int r = 8 * (e >> 2) + (e & 1), c = 8 * ((e >> 1) & 1);
            if (!(dbias_store || dbias_atomic) || p == 0.f || r >= rows_left || c >= keys_left)
                return;
            if (dbias_store) {
                const int64_t off = dbias_base + r * dbs[2] + c * dbs[3];
                if (a.dbias_f32)
                    ((float *)a.dbias)[off] = dl;
                else
                    ((T *)a.dbias)[off] = from_acc<T>(dl);
            } else {
                atomicAdd((float *)a.dbias_acc + dbias_base + r * dba[2] + c * dba[3], dl);
            }
        }
    }

    /* P^T = exp2(S^T scale log2e - lse2) (Alg4 L.13-14) in place, and
     * the dropout decisions (L.15-16) as bits of `keep`. */
    __device__ __forceinline__ void probs(float (&x)[Br / 2], Keep &keep) const {
        keep = 0;
        const int64_t jw = j0 + key_base + 16 * warp;
        if constexpr (BwdDropX<D, kMode, kDropout, kWide>::value) {
            if (drop) { /* element e: bit e; half the calls here (BwdDropX) */
                constexpr int QB = Br / 16, HALF = QB / 2;
                const int side = warp & 1, pair = warp >> 1;
                uint2 *xb = reinterpret_cast<uint2 *>(xch) +
                            (((int)(st & 1) * 2 + wg) * 2 + pair) * QB * 32 + lane;
                uint2 own[HALF], other[HALF];
#pragma unroll
                for (int c = 0; c < HALF; c++) {
                    const int qb = side * HALF + c;
                    const uint4 w = dropout_call(a, bh, i0 + 16 * qb + 2 * t4 + (g & 1), jw + g);
                    own[c] = side ? make_uint2(w.z, w.w) : make_uint2(w.x, w.y);
                    xb[qb * 32] = side ? make_uint2(w.x, w.y) : make_uint2(w.z, w.w);
                }
                named_sync(5 + 2 * wg + pair, 64); /* the pair's words are in */
#pragma unroll
                for (int c = 0; c < HALF; c++)
                    other[c] = xb[((side ^ 1) * HALF + c) * 32];
#pragma unroll
                for (int qb = 0; qb < QB; qb++) {
                    const uint2 ws = (qb < HALF) == (side == 0) ? own[qb % HALF]
                                                                 : other[qb % HALF];
                    keep |= (Keep)bwd_dropout_bits_of(a, ws.x, ws.y, g) << (8 * qb);
                }
            }
        } else if (drop) { /* element e: bit e (bwd_dropout_bits per 16 queries) */
#pragma unroll
            for (int qb = 0; qb < Br / 16; qb++)
                keep |= (Keep)bwd_dropout_bits(a, bh, i0 + 16 * qb, jw, g, t4) << (8 * qb);
        }
        /* lse2 of queries 2 t4, 2 t4 + 1 as one float2 (elements e, e + 1)
         * saves 16 loads a step; with dropout at d >= 128 the pairs cost
         * registers (d = 128: 17 more spill loads and stores in the
         * loop), so there one at a time */
        if constexpr (!kDropout || D == 64) {
#pragma unroll
            for (int e = 0; e < Br / 2; e += 2) {
                const float2 L =
                    *reinterpret_cast<const float2 *>(lse2 + 8 * (e >> 2) + 2 * t4);
                x[e] = exp2_fast(fmaf(x[e], exp_k, -L.x));
                x[e + 1] = exp2_fast(fmaf(x[e + 1], exp_k, -L.y));
            }
        } else {
#pragma unroll
            for (int e = 0; e < Br / 2; e++) {
                const float L = lse2[8 * (e >> 2) + 2 * t4 + (e & 1)];
                x[e] = exp2_fast(fmaf(x[e], exp_k, -L));
            }
        }
    }

    /* Z of element e: 0 dropped, 1 / (1 - p) kept, 1 without dropout */
    __device__ __forceinline__ float zf(Keep keep, int e) const {
        return !drop ? 1.f : ((keep >> e) & 1) ? ks : 0.f;
    }
};

} // namespace fg

#endif
