/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_tile.cuh - the backward's per-tile pieces shared
 * by the general backward kernels (attn_bwd.cu) and the deterministic dbias
 * pass (attn_bias.cu): row statistics, the recomputation of P and dP, and
 * the store of one dS into dbias. */
#ifndef FG_KERNELS_ATTN_BWD_TILE_CUH
#define FG_KERNELS_ATTN_BWD_TILE_CUH

#include "attn_common.cuh"

namespace fg {

/* m, l and D of query rows i0 .. i0+Br-1 of (b, h) into shared memory;
 * rows past the end read as l = 0 (P = 0). */
template <typename A>
__device__ __forceinline__ void load_row_stats(const AttnArgs &a, int64_t row0,
                                               int64_t i0, int Br, int rows,
                                               A *ms, A *ls, A *Ds)
{
    for (int r = threadIdx.x; r < Br; r += blockDim.x) {
        const bool in = r < rows;
        ms[r] = in ? ((const A *)a.m)[row0 + i0 + r] : A(0);
        ls[r] = in ? ((const A *)a.l)[row0 + i0 + r] : A(0);
        Ds[r] = in ? ((const A *)a.D)[row0 + i0 + r] : A(0);
    }
}

/* Alg4 L.12-14: P = exp(score_mod(scale Q_i K_j^T) + bias - m) / l, masked
 * entries 0 (and, with softcap, dcap = 1 - tanh^2); L.18: dP = dO_i V_j^T
 * (before dropout). Rows with l = 0 saw nothing: P = 0; a NaN row keeps
 * its NaN. */
template <typename T, typename A>
__device__ __forceinline__ void bwd_recompute(const AttnArgs &a, const A *Qs,
                                              const A *dOs, const A *Ks,
                                              const A *Vs, const A *ms,
                                              const A *ls, A *P, A *dP, A *dcap,
                                              int64_t b, int64_t h, int64_t i0,
                                              int64_t j0, A slope)
{
    const int d = a.d, Br = a.Br, Bc = a.Bc, ld = d + 1;
    const A scale = (A)a.scale;
    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
        const int r = idx / Bc, c = idx - r * Bc;
        const A *qr = Qs + r * ld, *gr = dOs + r * ld;
        const A *kc = Ks + c * ld, *vc = Vs + c * ld;
        A s = 0, dp = 0;
        for (int x = 0; x < d; x++) {
            s += qr[x] * kc[x];
            dp += gr[x] * vc[x];
        }
        const bool ok = i0 + r < a.Nq && ls[r] != A(0) && visible(a, i0 + r, j0 + c);
        A dc = A(1);
        A x = score_mod<A>(a, s * scale, slope, i0 + r, j0 + c, &dc);
        if (a.bias && ok)
            x += bias_at<T, A>(a, b, h, i0 + r, j0 + c);
        P[idx] = ok ? fast_exp(x - ms[r]) / ls[r] : A(0);
        dP[idx] = dp;
        if (dcap)
            dcap[idx] = dc;
    }
}

/* Shared memory of the kernels that stream K/V blocks past one query block
 * (deterministic dQ, deterministic dbias): Q_i, dO_i, K_j, V_j (rows
 * padded to d + 1), P, dP -> dS, an accumulator tile of x_elems, m, l, D,
 * and with softcap the [Br, Bc] 1 - tanh^2. */
template <typename A>
struct RowBlockSmem {
    A *Qs, *dOs, *Ks, *Vs, *P, *dP, *acc, *ms, *ls, *Ds, *dcap;
    __device__ RowBlockSmem(unsigned char *raw, const AttnArgs &a, int x_elems)
    {
        const int Br = a.Br, Bc = a.Bc, ld = a.d + 1;
        Qs = (A *)raw;
        dOs = Qs + Br * ld;
        Ks = dOs + Br * ld;
        Vs = Ks + Bc * ld;
        P = Vs + Bc * ld;
        dP = P + Br * Bc;
        acc = dP + Br * Bc;
        ms = acc + x_elems;
        ls = ms + Br;
        Ds = ls + Br;
        dcap = a.softcap > 0.f ? Ds + Br : nullptr;
    }
};

/* dbias (modes kDbiasStore / kDbiasAtomic) += dS of pair (i0 + r, j0 + c)
 * of (b, h), when the pair is inside the problem and visible in a row that
 * saw a key (a masked pair's dS is 0 by definition, even where dP is NaN). */
template <typename T, typename A>
__device__ __forceinline__ void dbias_put(const AttnArgs &a, const A *ls, int64_t b,
                                          int64_t h, int64_t i0, int64_t j0, int r,
                                          int c, A ds)
{
    const int64_t i = i0 + r, j = j0 + c;
    if (i >= a.Nq || ls[r] == A(0) || !visible(a, i, j))
        return;
    dbias_put_pair<T, A>(a, b, h, i, j, ds);
}

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_BWD_TILE_CUH */
