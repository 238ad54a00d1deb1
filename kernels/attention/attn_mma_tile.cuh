/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_mma_tile.cuh - the per-tile steps shared by the
 * mma.sync kernels, fp16/bf16 (attn_fwd_mma.cu, attn_bwd_mma.cu) and TF32
 * (attn_tf32_fwd.cu, attn_tf32_bwd.cu): they work on accumulators in the
 * mma C layout, which m16n8k16 and m16n8k8 share.
 *
 * Forward: a warp's S tile s[MT][NT][4] of raw scores q.k, element e of
 * tile (mt, nt) at row row_w + 16 mt + 8 (e >> 1) and key j0 + 8 nt +
 * 2 t4 + (e & 1) (row_w = the warp's first row + lane / 4, t4 = lane % 4).
 * Backward: element e of a warp's S^T tile qt at key j0 + 16 warp + g +
 * 8 (e >> 1) and query i0 + 8 qt + 2 t4 + (e & 1).
 *
 * kPrecise (TF32): the softcap uses tanhf, not tanh.approx, whose 2^-11
 * relative error on a logit of up to the cap would exceed the TF32 error;
 * fp16/bf16 outputs round it away.
 *
 * An additive bias (fp16/bf16 kernels, kMasked) enters as raw_bias, in the
 * raw units of q.k, after softcap and ALiBi (attention.h's order). */
#ifndef FG_KERNELS_ATTN_MMA_TILE_CUH
#define FG_KERNELS_ATTN_MMA_TILE_CUH

#include <type_traits>

#include "attn_common.cuh"

namespace fg {

/* f(x, i, j) for every element x of a warp's forward S tile, at query i
 * and key j (the layout above). */
template <int MT, int NT, typename F>
__device__ __forceinline__ void fwd_each(float (&s)[MT][NT][4], int64_t row_w, int64_t j0,
                                         int t4, F f)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                f(s[mt][nt][e], row_w + mt * 16 + (e >> 1) * 8, j0 + nt * 8 + 2 * t4 + (e & 1));
}

/* kMasked: softcap and ALiBi on the raw scores (back in raw units). */
template <bool kPrecise, int MT, int NT>
__device__ __forceinline__ void fwd_score_mods(const AttnArgs &a, float (&s)[MT][NT][4],
                                               float slope, int64_t row_w, int64_t j0, int t4)
{
    fwd_each(s, row_w, j0, t4, [&](float &x, int64_t i, int64_t j) {
        x = raw_score_mod<kPrecise>(a, x, slope, i, j);
    });
}

/* bias[b, h, i, j] / scale, the raw-score units the kernels keep S in;
 * pairs past the problem (padded rows, keys past Nk) read nothing. */
template <typename T>
__device__ __forceinline__ float raw_bias(const AttnArgs &a, int64_t b, int64_t h, int64_t i,
                                          int64_t j)
{
    return i < a.Nq && j < a.Nk ? bias_at<T, float>(a, b, h, i, j) * (float)(1.0 / a.scale)
                                : 0.f;
}

/* Forward: S += the bias, after fwd_score_mods and before the mask (which
 * sets masked pairs to -inf whatever their bias). */
template <typename T, int MT, int NT>
__device__ __forceinline__ void fwd_bias(const AttnArgs &a, float (&s)[MT][NT][4], int64_t b,
                                         int64_t h, int64_t row_w, int64_t j0, int t4)
{
    fwd_each(s, row_w, j0, t4,
             [&](float &x, int64_t i, int64_t j) { x += raw_bias<T>(a, b, h, i, j); });
}

/* -inf outside the mask, only on blocks that cross the causal diagonal,
 * the band's edges (this warp's rows), a dead block-list entry or the end
 * of the keys. `causal` (plain bottom-right causal, false with kMasked,
 * whose band holds it) is a warp-uniform runtime flag rather than a
 * template one: one instantiation fewer per kernel (build time), and its
 * per-element test runs only on the tiles that need a mask. */
template <bool kMasked, int Bc, int MT, int NT>
__device__ __forceinline__ void fwd_mask(const AttnArgs &a, bool causal, float (&s)[MT][NT][4],
                                         const BlockWalk &walk, int jb, int64_t i0, int64_t j0,
                                         int warp, int64_t row_w, int t4)
{
    const bool dead = kMasked && walk.dead(jb);
    const int64_t wr0 = i0 + warp * 16 * MT; /* this warp's first row */
    const bool need_mask =
        j0 + Bc > a.Nk || (causal && j0 + Bc - 1 > i0 + a.shift) ||
        (kMasked && (dead || !inside_band(a, wr0, wr0 + 16 * MT - 1, j0, Bc)));
    if (kMasked && need_mask) { /* the keys each of this thread's rows sees */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int2 c = dead ? make_int2(Bc, -1)
                                    : band_cols(a, row_w + mt * 16 + 8 * r, j0, Bc);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int col = nt * 8 + 2 * t4 + e;
                        if (col < c.x || col > c.y)
                            s[mt][nt][2 * r + e] = -INFINITY;
                    }
            }
    } else if (need_mask) { /* each row's column limit (row_key_limit) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int lim = row_key_limit(a, causal, row_w + mt * 16 + 8 * r, j0, Bc);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (nt * 8 + 2 * t4 + e >= lim)
                            s[mt][nt][2 * r + e] = -INFINITY;
            }
    }
}

/* Zeroes MT x NT accumulator tiles of mma.sync (S before Q K^T, O). */
template <int MT, int NT>
__device__ __forceinline__ void frag_zero(float (&x)[MT][NT][4])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NT; i++)
            x[mt][i][0] = x[mt][i][1] = x[mt][i][2] = x[mt][i][3] = 0.f;
}

/* The forward's running state before the first key block (Alg1 L.2):
 * O = 0, m = -inf, l = 0. */
template <int MT, int DT>
__device__ __forceinline__ void fwd_state_init(float (&o)[MT][DT][4], float (&m_raw)[MT][2],
                                               float (&l_part)[MT][2])
{
    frag_zero(o);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m_raw[mt][0] = m_raw[mt][1] = -INFINITY;
        l_part[mt][0] = l_part[mt][1] = 0.f;
    }
}

/* Online softmax (Alg1 L.10-11) of rows g and g+8 of each m-tile: s
 * becomes P~ = exp2(s scale log2e - m), m_raw the running raw max, l_part
 * this lane's share of l, and O is rescaled by alpha. */
template <int MT, int NT, int DT>
__device__ __forceinline__ void fwd_softmax(float (&s)[MT][NT][4], float (&m_raw)[MT][2],
                                            float (&l_part)[MT][2], float (&o)[MT][DT][4],
                                            float scale_log2)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m_raw[mt][r];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                mx = fmax_nan(mx, fmax_nan(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
            mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float ms = mx == -INFINITY ? 0.f : mx * scale_log2;
            alpha[r] = mx == -INFINITY ? 1.f : exp2_fast(m_raw[mt][r] * scale_log2 - ms);
            m_raw[mt][r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2_fast(fmaf(s[mt][nt][2 * r + e], scale_log2, -ms));
                    s[mt][nt][2 * r + e] = p;
                    sum += p;
                }
            l_part[mt][r] = l_part[mt][r] * alpha[r] + sum;
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[mt][dt][0] *= alpha[0];
            o[mt][dt][1] *= alpha[0];
            o[mt][dt][2] *= alpha[1];
            o[mt][dt][3] *= alpha[1];
        }
    }
}

/* Zeroes the dropped P (256/T is applied at the end): one Philox call per
 * 16 elements, rows row_w + 16 mt + {0, 8} and 32 keys (j0 % 32 == 0). */
template <int MT, int NT>
__device__ __forceinline__ void fwd_dropout(const AttnArgs &a, float (&s)[MT][NT][4], int64_t j0,
                                            int64_t row_w, int64_t bh, int t4)
{
    static_assert(NT % 4 == 0, "dropout draws 32 keys per call");
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int c = 0; c < NT / 4; c++)
            fwd_dropout32(a, bh, row_w + mt * 16, j0 + 32 * c, t4,
                          [&](int n, int r, int e) { s[mt][4 * c + n][2 * r + e] = 0.f; });
}

/* The backward step's per-warp mask: whether any element needs one, and
 * then the query rows [x, y] of the block that see each of this thread's
 * two keys (the band's, or up to Nk and, with the runtime flag causal as
 * in fwd_mask, from the diagonal on). */
struct BwdMask {
    bool need;
    int2 rr[2];
};
template <bool kMasked, int Bc, int Br>
__device__ __forceinline__ BwdMask bwd_mask(const AttnArgs &a, bool causal, bool dead,
                                            int64_t i0, int64_t j0, int warp, int g)
{
    BwdMask m;
    m.need = j0 + Bc > a.Nk || i0 + Br > a.Nq || (causal && j0 + Bc - 1 > i0 + a.shift) ||
             (kMasked && (dead || !inside_band(a, i0, i0 + Br - 1, j0 + 16 * warp, 16)));
    m.rr[0] = m.rr[1] = make_int2(0, Br - 1);
    if (m.need)
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int64_t j = j0 + 16 * warp + g + 8 * k;
            if (kMasked) {
                m.rr[k] = dead ? make_int2(Br, -1) : band_rows(a, j, i0, Br);
            } else if (j >= a.Nk) {
                m.rr[k] = make_int2(Br, -1);
            } else if (causal) { /* i >= j - shift (past Nq, lse2 = +inf: P = 0) */
                m.rr[k].x = (int)max((int64_t)0, min(j - a.shift - i0, (int64_t)Br));
            }
        }
    return m;
}

/* One element of the backward (Alg4 L.13-16, 19-21): from the raw score s
 * and dP^T of query i (row qi of the block), key j (half kh of this
 * thread's keys), P = exp2(logit scale log2e - lse2) with the mask, the
 * dropout factor z (from `kept`, bwd_dropout_bits), *p = P z (for dV) and
 * *ds = P (dP z - D) (times the softcap's 1 - tanh^2). braw: the pair's
 * raw_bias, added when `biased` (the callers' constant); *dl, when
 * asked, dS before the softcap's factor (dbias, attention.h). Returns
 * whether the mask lets the pair through. */
template <bool kPrecise, bool kMasked, bool kDropout>
__device__ __forceinline__ bool bwd_elem(const AttnArgs &a, const BwdMask &mk, float s, float dp,
                                         float lse, float Dv, int qi, int kh, int64_t i,
                                         int64_t j, float slope, float scale_log2, bool kept,
                                         float braw, bool biased, float *p, float *ds,
                                         float *dl = nullptr)
{
    const bool mods = kMasked && (a.softcap > 0.f || a.alibi);
    float x = mods ? raw_score_mod<kPrecise>(a, s, slope, i, j) : s;
    if (biased) /* a compile-time false without a bias: no add of 0 */
        x += braw;
    float pe = exp2_fast(fmaf(x, scale_log2, -lse));
    const bool vis = !(mk.need && (qi < mk.rr[kh].x || qi > mk.rr[kh].y));
    if (!vis)
        pe = 0.f;
    const float z = !kDropout ? 1.f : kept ? (float)a.keep_scale : 0.f;
    *p = pe * z;
    *ds = pe * (dp * z - Dv);
    if (dl)
        *dl = *ds;
    if (kMasked && a.softcap > 0.f) { /* exact: times 1 - tanh^2 */
        if (kPrecise || biased) { /* from s: P no longer gives the logit */
            const float y = s * (float)a.scale * (1.f / a.softcap);
            const float th = kPrecise ? tanhf(y) : tanh_fast(y);
            *ds *= 1.f - th * th;
        } else {
            *ds *= softcap_grad(a, pe, lse, slope, i, j);
        }
    }
    return vis;
}

/* dQ_i += scale dS K (Alg4 L.22) from one warp's m16 tile of products q:
 * rows mt 16 + g (+ 8) of the query block at i0, columns part DW + 8 nt +
 * 2 t4 (+ 1), into the fp32 accumulator rows at dqa (row stride d) by
 * fp32 reductions (one vector red.global.add.v2.f32 a pair on sm_90);
 * rows past a.Nq and columns past a.d are skipped. */
template <int DW>
__device__ __forceinline__ void dq_tile_red(const AttnArgs &a, float *dqa,
                                            const float (&q)[DW / 8][4], float sc, int64_t i0,
                                            int mt, int part, int g, int t4)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int qi = mt * 16 + g + 8 * r;
        if (i0 + qi >= a.Nq)
            continue;
#pragma unroll
        for (int nt = 0; nt < DW / 8; nt++) {
            const int c = part * DW + nt * 8 + 2 * t4;
            if (c < a.d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                atomicAdd(reinterpret_cast<float2 *>(dqa + qi * a.d + c),
                          make_float2(q[nt][2 * r] * sc, q[nt][2 * r + 1] * sc));
#else
                atomicAdd(dqa + qi * a.d + c, q[nt][2 * r] * sc);
                atomicAdd(dqa + qi * a.d + c + 1, q[nt][2 * r + 1] * sc);
#endif
            }
        }
    }
}

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_MMA_TILE_CUH */
