/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fp32_fwd.cu - strict fp32 FlashAttention forward:
 * register-blocked SIMT FMA (attn_fp32.cuh).
 *
 * One block of 256 threads per (64 query rows, query head, batch). Q_i
 * stays in shared memory; K_j and V_j blocks of 64 keys (32 for d = 256)
 * stream past. Thread (ty, tx) computes the 4 x 4 (4 x 2) scores of rows
 * 4 ty + u and keys tx + 16 w in registers, runs the online softmax of
 * Algorithm 1 (m, l per row, reduced over the 16 lanes that share the
 * rows by shuffles), applies dropout to the P that feeds O, and stores
 * P^T; then it adds P V_j to its 4 x D/16 slice of O, kept in registers
 * and rescaled by alpha = exp(m_old - m_new). O is divided by l once at
 * the end (FlashAttention-2). Masks, softcap, ALiBi, GQA, strides, packed
 * batches and key padding work as in the general kernel (attn_fwd.cu) and
 * through the same helpers (attn_common.cuh); a bias takes the general
 * kernel. */
#include "attn_fp32.cuh"
#include "attn_kernels.h"
#include "kernels/runtime/cuda_check.h"

namespace fg {
namespace f32 {

template <int D>
__global__ void __launch_bounds__(kThreads, 1) fwd_kernel(const AttnArgs args)
{
    typedef Cfg<D> C;
    constexpr int BR = kBr, BC = C::BC, LD = C::LD, LDP = C::LDP, TN = C::TN;
    constexpr int VEC = C::VEC, NCH = C::NCH;
    const int h = blockIdx.y, b = blockIdx.z;
    int nk_rows;
    const AttnArgs a = seq_args<float, float>(args, b, &nk_rows);
    /* Heaviest query blocks first (the causal ones at the end). */
    const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BR;
    if (i0 >= a.Nq) /* the grid covers the longest sequence */
        return;
    extern __shared__ __align__(16) float smem[];
    float *Qs = smem, *Ks = Qs + BR * LD, *Vs = Ks + BC * LD, *Pt = Vs + BC * LD;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int hk = h / a.group;
    const int rows = (int)min((int64_t)BR, a.Nq - i0);
    const int64_t r0 = i0 + 4 * ty, bh = (int64_t)b * a.H + h;
    const float slope = alibi_slope<float>(a, b, h);

    load_rows<D, BR>(Qs, a.q, b, i0, h, rows, a.d);
    float o[4][VEC * NCH], m[4], l[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        m[u] = -INFINITY;
        l[u] = 0.f;
#pragma unroll
        for (int x = 0; x < VEC * NCH; x++)
            o[u][x] = 0.f;
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
            __syncthreads(); /* the previous block's K, V and P^T are consumed */
            load_rows<D, BC>(Ks, a.k, b, j0, hk, cols, a.d);
            load_rows<D, BC>(Vs, a.v, b, j0, hk, cols, a.d);
            __syncthreads();
            /* Alg1 L.9: S = scale Q_i K_j^T, score mods, mask. */
            float s[4][TN], dcap[4][TN]; /* dcap: the backward's, unused */
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int w = 0; w < TN; w++)
                    s[u][w] = 0.f;
            gemm_nt<D, LD, 4, TN, 16>(s, Qs, 4 * ty, Ks, tx);
            row_logits<TN>(a, s, r0, j0, tx, slope, dcap);
            /* Alg1 L.10-11: m_new, P~ = exp(S - m_new), l = alpha l + rowsum. */
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float mx = m[u];
#pragma unroll
                for (int w = 0; w < TN; w++)
                    mx = max_nan(mx, s[u][w]);
#pragma unroll
                for (int off = 8; off > 0; off >>= 1)
                    mx = max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                const bool empty = mx == -INFINITY;
                const float alpha = empty ? 1.f : __expf(m[u] - mx);
                float sum = 0.f;
#pragma unroll
                for (int w = 0; w < TN; w++) {
                    s[u][w] = empty ? 0.f : __expf(s[u][w] - mx);
                    sum += s[u][w];
                }
#pragma unroll
                for (int off = 8; off > 0; off >>= 1)
                    sum += __shfl_xor_sync(0xffffffffu, sum, off);
                l[u] = alpha * l[u] + sum;
                m[u] = mx;
#pragma unroll
                for (int x = 0; x < VEC * NCH; x++)
                    o[u][x] *= alpha;
            }
            /* Dropout hits the P that feeds O, not l. */
            if (a.dropout) {
                RowDrop z;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    z.draw(a, bh, r0 + u, j0, tx, BC);
#pragma unroll
                    for (int w = 0; w < TN; w++)
                        s[u][w] *= z.kept(j0, w, tx) ? (float)a.keep_scale : 0.f;
                }
            }
#pragma unroll
            for (int w = 0; w < TN; w++)
                *(float4 *)(Pt + (tx + 16 * w) * LDP + 4 * ty) =
                    make_float4(s[0][w], s[1][w], s[2][w], s[3][w]);
            __syncthreads();
            /* Alg1 L.12: O = diag(alpha) O + P V_j (unnormalised). */
            gemm_tn<BC, LDP, LD, VEC, NCH, 16 * VEC>(o, Pt, 4 * ty, Vs, VEC * tx);
        }
    }

    /* Epilogue: O = acc / l (0 for rows that saw nothing, NaN stays NaN),
     * and m, l as they stand. */
    float f[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
        f[u] = l[u] == 0.f ? 0.f : 1.f / l[u];
    store_row_tile<VEC, NCH>(a.o, b, r0, h, rows, a.d, tx, o, f);
    const int64_t srow = stat_row0(a, b, h) + r0;
#pragma unroll
    for (int u = 0; u < 4; u++)
        if (tx == 0 && 4 * ty + u < rows) {
            ((float *)a.m)[srow + u] = m[u];
            ((float *)a.l)[srow + u] = l[u];
        }
}

} /* namespace f32 */

fg_status attn_fp32_fwd(const AttnArgs &a, size_t smem_limit, cudaStream_t st, bool *ran)
{
    *ran = false;
    if (!f32::usable(a))
        return FG_OK;
    return f32::with_pad_d(a.d, [&](auto dim) {
        constexpr int D = decltype(dim)::value;
        if (f32::fwd_smem<D>() > smem_limit)
            return FG_OK; /* *ran stays false: the general kernel runs */
        *ran = true;
        return f32::launch_rows(f32::fwd_kernel<D>, f32::fwd_smem<D>(), a, st);
    });
}

} /* namespace fg */
