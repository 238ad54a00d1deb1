/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fp32_bwd.cu - strict fp32 FlashAttention backward:
 * register-blocked SIMT FMA (attn_fp32.cuh), Algorithm 4 of Dao et al. in
 * FlashAttention-2's form (D = rowsum(dO * O) precomputed by attn_bwd.cu's
 * attn_bwd_preprocess).
 *
 *  - bwd_kernel: one block per (BC keys, K/V head, batch). K_j, V_j stay in
 *    shared memory, dK_j and dV_j in registers (thread: 4 keys times
 *    D / (256 / (BC / 4)) columns) while the query blocks of every head of
 *    the group stream past. The block computes S^T = K Q^T and
 *    dP^T = V dO^T (thread: 4 keys times BR / 16 or BR / 32 rows), P from
 *    m and l, the dropout mask (one Philox call per row covers the
 *    thread's 4 keys), dS = P (dP - D) (times 1 - tanh^2 with softcap),
 *    stores P^T (dropped) and dS^T, then dV += P^T dO, dK += dS^T Q and,
 *    unless deterministic, dQ += dS K into the fp32 accumulator by atomics
 *    (attn_bwd.cu's attn_bwd_write_dq then writes dQ).
 *  - dq_kernel (deterministic = 1): one block per (64 query rows, head,
 *    batch) streams the K/V blocks past, recomputes S, dP and dS in the
 *    row layout of the forward and sums dQ in registers in a fixed order:
 *    bitwise-reproducible, no atomics.
 * BR (query rows per step) is 64, or 32 where 64 does not fit the GPU's
 * shared memory (A100: d >= 128). */
#include "attn_fp32.cuh"
#include "attn_kernels.h"
#include "kernels/runtime/cuda_check.h"

namespace fg {
namespace f32 {

template <int D, int BR, int BC>
__global__ void __launch_bounds__(kThreads, 1) bwd_kernel(const AttnArgs args)
{
    constexpr int LD = D + 4, LDP = BR + 4;
    constexpr int TXK = kThreads / (BC / 4); /* lanes per 4-key group */
    constexpr int TN = BR / TXK;             /* rows per thread: tl + TXK w */
    constexpr int VK = cmin(4, D / TXK), NK = D / (TXK * VK);
    constexpr int QL = kThreads / (BR / 4); /* dQ: rows 4 qg + u, column lanes */
    constexpr int VQ = cmin(4, D / QL), NQ = D / (QL * VQ);
    const int hk = blockIdx.y, b = blockIdx.z;
    int nk_rows;
    const AttnArgs a = seq_args<float, float>(args, b, &nk_rows);
    const int64_t j0 = (int64_t)blockIdx.x * BC;
    if (j0 >= nk_rows)
        return;
    extern __shared__ __align__(16) float smem[];
    float *Ks = smem, *Vs = Ks + BC * LD, *Qs = Vs + BC * LD, *dOs = Qs + BR * LD;
    float *PT = dOs + BR * LD, *dST = PT + BC * LDP;
    float *ms = dST + BC * LDP, *ls = ms + BR, *Ds = ls + BR;
    const int kg = threadIdx.x / TXK, tl = threadIdx.x % TXK;
    const int qg = threadIdx.x / QL, ql = threadIdx.x % QL;
    /* cols keys are seen; cols_out rows are written (padded keys: 0). */
    const int cols = (int)max((int64_t)0, min((int64_t)BC, a.Nk - j0));
    const int cols_out = (int)min((int64_t)BC, nk_rows - j0);
    const float scale = (float)a.scale, ks = (float)a.keep_scale;
    const bool softcap = a.softcap > 0.f;

    load_rows<D, BC>(Ks, a.k, b, j0, hk, cols, a.d);
    load_rows<D, BC>(Vs, a.v, b, j0, hk, cols, a.d);
    float dk[4][VK * NK], dv[4][VK * NK];
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int x = 0; x < VK * NK; x++)
            dk[u][x] = dv[u][x] = 0.f;

    const int64_t q_lo = band_query_begin(a, j0);
    const int64_t q_hi = cols > 0 ? band_query_end(a, j0 + cols - 1) : q_lo;
    for (int g = 0; g < a.group; g++) {
        const int h = hk * a.group + g;
        const int64_t bh = (int64_t)b * a.H + h, row0 = stat_row0(a, b, h);
        const float slope = alibi_slope<float>(a, b, h);
        int nspan = 1;
        const int32_t *list =
            a.sparse ? block_list(a, false, b, h, j0 / FG_ATTN_SPARSE_BLOCK, &nspan) : nullptr;
        for (int sp = 0; sp < nspan; sp++) {
            int64_t s_lo, s_hi;
            if (!walk_span(list, nspan, a.nqb, sp, q_lo, q_hi, BR, &s_lo, &s_hi))
                continue;
            for (int64_t i0 = s_lo; i0 < s_hi; i0 += BR) {
                const int rows = (int)min((int64_t)BR, a.Nq - i0);
                __syncthreads(); /* the previous step's tiles are consumed */
                /* Alg4 L.11: Q_i, dO_i, m_i, l_i, D_i on chip. */
                load_rows<D, BR>(Qs, a.q, b, i0, h, rows, a.d);
                load_rows<D, BR>(dOs, a.dout, b, i0, h, rows, a.d);
                for (int r = threadIdx.x; r < BR; r += kThreads) {
                    const bool in = r < rows;
                    ms[r] = in ? ((const float *)a.m)[row0 + i0 + r] : 0.f;
                    ls[r] = in ? ((const float *)a.l)[row0 + i0 + r] : 0.f;
                    Ds[r] = in ? ((const float *)a.D)[row0 + i0 + r] : 0.f;
                }
                __syncthreads();
                /* Alg4 L.12, L.18 transposed: S^T = K_j Q_i^T, dP^T = V_j dO_i^T. */
                float s[4][TN], dp[4][TN];
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int w = 0; w < TN; w++)
                        s[u][w] = dp[u][w] = 0.f;
                gemm_nt<D, LD, 4, TN, TXK>(s, Ks, 4 * kg, Qs, tl);
                gemm_nt<D, LD, 4, TN, TXK>(dp, Vs, 4 * kg, dOs, tl);
#pragma unroll
                for (int w = 0; w < TN; w++) {
                    const int r = tl + TXK * w;
                    const int64_t i = i0 + r;
                    const float mr = ms[r], lr = ls[r], Dr = Ds[r];
                    const float inv = lr != 0.f ? 1.f / lr : 0.f;
                    /* Alg4 L.15: this row's mask of the thread's 4 keys. */
                    const uint32_t keep =
                        a.dropout ? keep_bits4(a, bh, i, j0 + 4 * kg) : 0xfu;
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const int64_t j = j0 + 4 * kg + u;
                        const bool ok = i < a.Nq && lr != 0.f && visible(a, i, j);
                        float dc = 1.f;
                        const float x = score_mod<float>(a, s[u][w] * scale, slope, i, j, &dc);
                        /* Alg4 L.13-14, 16, 19-21. */
                        const float p = ok ? __expf(x - mr) * inv : 0.f;
                        const float z = a.dropout ? ((keep >> u) & 1u ? ks : 0.f) : 1.f;
                        const float ds = p * (dp[u][w] * z - Dr);
                        PT[(4 * kg + u) * LDP + r] = p * z;
                        dST[(4 * kg + u) * LDP + r] = softcap ? ds * dc : ds;
                    }
                }
                __syncthreads();
                /* Alg4 L.17: dV_j += P~^T dO_i; L.23: dK_j += dS^T Q_i (scaled at the end). */
                gemm_nn<BR, LDP, LD, VK, NK, TXK * VK>(dv, PT, 4 * kg, dOs, VK * tl);
                gemm_nn<BR, LDP, LD, VK, NK, TXK * VK>(dk, dST, 4 * kg, Qs, VK * tl);
                if (a.deterministic)
                    continue;
                /* Alg4 L.22: dQ_i += scale dS K_j, one column chunk at a time
                 * (fewer live registers), added to the accumulator. */
                float *dqa = (float *)a.dq_acc + (row0 + i0) * a.d;
#pragma unroll 1
                for (int c = 0; c < NQ; c++) {
                    float acc[4][VQ];
#pragma unroll
                    for (int u = 0; u < 4; u++)
#pragma unroll
                        for (int e = 0; e < VQ; e++)
                            acc[u][e] = 0.f;
                    const int x0 = VQ * ql + c * QL * VQ;
                    gemm_tn<BC, LDP, LD, VQ, 1, 0>(acc, dST, 4 * qg, Ks, x0);
#pragma unroll
                    for (int u = 0; u < 4; u++)
#pragma unroll
                        for (int e = 0; e < VQ; e++)
                            if (4 * qg + u < rows && x0 + e < a.d && acc[u][e] != 0.f)
                                atomicAdd(dqa + (4 * qg + u) * a.d + x0 + e, acc[u][e] * scale);
                }
            }
        }
    }
    /* Alg4 L.25: dK_j, dV_j; keys no query sees (padding) get 0. */
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int c = 4 * kg + u;
        if (c >= cols_out)
            continue;
        float *dkr = elem<float>(a.dk, b, j0 + c, hk), *dvr = elem<float>(a.dv, b, j0 + c, hk);
#pragma unroll
        for (int n = 0; n < NK; n++)
#pragma unroll
            for (int e = 0; e < VK; e++) {
                const int x = n * TXK * VK + VK * tl + e;
                if (x < a.d) {
                    dkr[x] = c < cols ? dk[u][n * VK + e] * scale : 0.f;
                    dvr[x] = c < cols ? dv[u][n * VK + e] : 0.f;
                }
            }
    }
}

/* Deterministic dQ: the forward's row layout (attn_fp32_fwd.cu). */
template <int D>
__global__ void __launch_bounds__(kThreads, 1) dq_kernel(const AttnArgs args)
{
    typedef Cfg<D> C;
    constexpr int BR = kBr, BC = C::BC, LD = C::LD, LDP = C::LDP, TN = C::TN;
    constexpr int VEC = C::VEC, NCH = C::NCH;
    const int h = blockIdx.y, b = blockIdx.z;
    int nk_rows;
    const AttnArgs a = seq_args<float, float>(args, b, &nk_rows);
    const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BR;
    if (i0 >= a.Nq)
        return;
    extern __shared__ __align__(16) float smem[];
    float *Qs = smem, *Ks = Qs + BR * LD, *Vs = Ks + BC * LD, *dSt = Vs + BC * LD;
    float *dOs = dSt + BC * LDP;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int hk = h / a.group;
    const int rows = (int)min((int64_t)BR, a.Nq - i0);
    const int64_t r0 = i0 + 4 * ty, bh = (int64_t)b * a.H + h;
    const int64_t srow = stat_row0(a, b, h) + r0;
    const float slope = alibi_slope<float>(a, b, h), ks = (float)a.keep_scale;
    const bool softcap = a.softcap > 0.f;

    load_rows<D, BR>(Qs, a.q, b, i0, h, rows, a.d);
    load_rows<D, BR>(dOs, a.dout, b, i0, h, rows, a.d);
    float dq[4][VEC * NCH], mr[4], inv[4], Dr[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const bool in = 4 * ty + u < rows;
        const float lr = in ? ((const float *)a.l)[srow + u] : 0.f;
        mr[u] = in ? ((const float *)a.m)[srow + u] : 0.f;
        Dr[u] = in ? ((const float *)a.D)[srow + u] : 0.f;
        inv[u] = lr != 0.f ? 1.f / lr : 0.f; /* 0: the row saw nothing, P = 0 */
#pragma unroll
        for (int x = 0; x < VEC * NCH; x++)
            dq[u][x] = 0.f;
    }

    const int64_t k_lo = band_key_begin(a, i0), k_hi = band_key_end(a, i0 + rows - 1);
    int nspan = 1;
    const int32_t *list =
        a.sparse ? block_list(a, true, b, h, i0 / FG_ATTN_SPARSE_BLOCK, &nspan) : nullptr;
    for (int sp = 0; sp < nspan; sp++) {
        int64_t s_lo, s_hi;
        if (!walk_span(list, nspan, a.nkb, sp, k_lo, k_hi, BC, &s_lo, &s_hi))
            continue;
        for (int64_t j0 = s_lo; j0 < s_hi; j0 += BC) {
            const int cols = (int)min((int64_t)BC, a.Nk - j0);
            __syncthreads();
            load_rows<D, BC>(Ks, a.k, b, j0, hk, cols, a.d);
            load_rows<D, BC>(Vs, a.v, b, j0, hk, cols, a.d);
            __syncthreads();
            float s[4][TN], dp[4][TN], dc[4][TN];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int w = 0; w < TN; w++)
                    s[u][w] = dp[u][w] = 0.f;
            gemm_nt<D, LD, 4, TN, 16>(s, Qs, 4 * ty, Ks, tx);
            gemm_nt<D, LD, 4, TN, 16>(dp, dOs, 4 * ty, Vs, tx);
            row_logits<TN>(a, s, r0, j0, tx, slope, dc);
            RowDrop z;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (a.dropout)
                    z.draw(a, bh, r0 + u, j0, tx, BC);
#pragma unroll
                for (int w = 0; w < TN; w++) {
                    /* s = -inf outside the mask: P = 0 there. */
                    const float p = inv[u] != 0.f ? __expf(s[u][w] - mr[u]) * inv[u] : 0.f;
                    const float zf = a.dropout ? (z.kept(j0, w, tx) ? ks : 0.f) : 1.f;
                    const float ds = p * (dp[u][w] * zf - Dr[u]);
                    s[u][w] = softcap ? ds * dc[u][w] : ds;
                }
            }
#pragma unroll
            for (int w = 0; w < TN; w++)
                *(float4 *)(dSt + (tx + 16 * w) * LDP + 4 * ty) =
                    make_float4(s[0][w], s[1][w], s[2][w], s[3][w]);
            __syncthreads();
            gemm_tn<BC, LDP, LD, VEC, NCH, 16 * VEC>(dq, dSt, 4 * ty, Ks, VEC * tx);
        }
    }
    const float f[4] = {(float)a.scale, (float)a.scale, (float)a.scale, (float)a.scale};
    store_row_tile<VEC, NCH>(a.dq, b, r0, h, rows, a.d, tx, dq, f);
}

template <int D, int BR, int BC>
static fg_status launch_main(const AttnArgs &a, cudaStream_t st)
{
    constexpr size_t smem = bwd_smem<D, BR, BC>();
    FG_CUDA_TRY(cudaFuncSetAttribute(bwd_kernel<D, BR, BC>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((a.Nk + BC - 1) / BC), (unsigned)a.Hk, (unsigned)a.B);
    bwd_kernel<D, BR, BC><<<grid, kThreads, smem, st>>>(a);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* The main kernel with BR = 64 where it fits, else 32, then (deterministic)
 * the dQ kernel; nothing is launched (*ran = false) when neither fits. */
template <int D>
static fg_status launch(const AttnArgs &a, size_t limit, cudaStream_t st, bool *ran)
{
    constexpr int BC = Cfg<D>::BC;
    const bool big = bwd_smem<D, 64, BC>() <= limit;
    if (!big && bwd_smem<D, 32, BC>() > limit)
        return FG_OK;
    if (a.deterministic && dq_smem<D>() > limit)
        return FG_OK;
    FG_TRY((big ? launch_main<D, 64, BC>(a, st) : launch_main<D, 32, BC>(a, st)));
    *ran = true;
    if (!a.deterministic)
        return FG_OK;
    return launch_rows(dq_kernel<D>, dq_smem<D>(), a, st);
}

} /* namespace f32 */

size_t attn_fp32_dq_smem(int d)
{
    const int D = f32::pad_d(d);
    return D == 32 ? f32::dq_smem<32>() : D == 64 ? f32::dq_smem<64>()
           : D == 128 ? f32::dq_smem<128>() : f32::dq_smem<256>();
}

fg_status attn_fp32_dq(const AttnArgs &a, cudaStream_t st)
{
    return f32::with_pad_d(a.d, [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        return f32::launch_rows(f32::dq_kernel<D>, f32::dq_smem<D>(), a, st);
    });
}

fg_status attn_fp32_bwd(const AttnArgs &a, size_t smem_limit, cudaStream_t st, bool *ran)
{
    *ran = false;
    if (!f32::usable(a))
        return FG_OK;
    return f32::with_pad_d(a.d, [&](auto dim) {
        return f32::launch<decltype(dim)::value>(a, smem_limit, st, ran);
    });
}

} /* namespace fg */
