/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd.cu - FlashAttention backward, general CUDA kernels.
 *
 *  1. attn_bwd_preprocess: D = rowsum(dO * O) per query row (FA2;
 *     attn_bwd_rows.cuh, with the other per-row passes).
 *  2. attn_bwd_kernel: one thread block per (K/V block j, K/V head, batch).
 *     K_j, V_j and the dK_j, dV_j accumulators stay on chip while every
 *     query block of every query head of the group streams past; S and P are
 *     recomputed from Q, K, m, l and the dropout mask regenerated from the
 *     seed (Algorithm 4 of Dao et al.). dQ is accumulated with atomics into
 *     a [B, H, Nq, d] buffer of the accumulator type (so fp32/fp64 summation
 *     order varies between runs at the rounding level).
 *  3. attn_bwd_write_dq: that buffer converted to dQ's dtype and strides.
 * With params.deterministic the main kernels skip dQ and attn_bwd_dq_kernel
 * computes it per query block in a fixed order (bitwise-reproducible),
 * except the wgmma kernels at d <= 128 without a block mask: they add each
 * dQ tile in a fixed order of key blocks (turn counters) and step 3 runs.
 * Nothing of size Nq x Nk exists anywhere. */
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "attn_bwd_rows.cuh"
#include "attn_bwd_tile.cuh"
#include "attn_kernels.h"
#include "kernels/runtime/cuda_check.h"

namespace fg {

template <typename T>
__global__ void __launch_bounds__(kThreads)
attn_bwd_kernel(const AttnArgs args)
{
    typedef typename AccOf<T>::type A;
    const int hk = blockIdx.y, b = blockIdx.z;
    int nk_rows;
    const AttnArgs a = seq_args<T, A>(args, b, &nk_rows);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int d = a.d, Br = a.Br, Bc = a.Bc, ld = d + 1;
    A *Ks = (A *)smem_raw;
    A *Vs = Ks + Bc * ld;
    A *dKs = Vs + Bc * ld;
    A *dVs = dKs + Bc * d;
    A *Qs = dVs + Bc * d;
    A *dOs = Qs + Br * ld;
    A *P = dOs + Br * ld;
    A *dP = P + Br * Bc;
    A *PD = dP + Br * Bc; /* P with dropout applied (aliases P without) */
    A *ms = PD + Br * Bc, *ls = ms + Br, *Ds = ls + Br;
    A *dcap = a.softcap > 0.f ? Ds + Br : nullptr; /* [Br, Bc] 1 - tanh^2 */

    const int64_t j0 = (int64_t)blockIdx.x * Bc;
    if (j0 >= nk_rows) /* the grid covers the longest sequence */
        return;
    /* cols keys are seen; cols_out rows are written (padded keys: 0). */
    const int cols = (int)max((int64_t)0, min((int64_t)Bc, a.Nk - j0));
    const int cols_out = (int)min((int64_t)Bc, nk_rows - j0);
    const A scale = (A)a.scale;

    /* Alg4 L.8-9: K_j, V_j on chip, dK_j = dV_j = 0. */
    load_tile<T, A>(Ks, ld, a.k, b, j0, hk, Bc, cols, d);
    load_tile<T, A>(Vs, ld, a.v, b, j0, hk, Bc, cols, d);
    for (int idx = threadIdx.x; idx < Bc * d; idx += blockDim.x)
        dKs[idx] = dVs[idx] = 0;

    /* The band bounds the query rows that see any of these keys; with a
     * block mask only the listed query 128-blocks are walked. */
    const int64_t q_lo = band_query_begin(a, j0);
    const int64_t q_hi = cols > 0 ? band_query_end(a, j0 + cols - 1) : q_lo;
    const A *Pdrop = a.dropout ? PD : P;

    for (int g = 0; g < a.group; g++) {
        const int h = hk * a.group + g;
        const int64_t bh = (int64_t)b * a.H + h, row0 = stat_row0(a, b, h);
        const A slope = alibi_slope<A>(a, b, h);
        int nspan = 1;
        const int32_t *list =
            a.sparse ? block_list(a, false, b, h, j0 / FG_ATTN_SPARSE_BLOCK, &nspan) : nullptr;
        for (int sp = 0; sp < nspan; sp++) {
        int64_t s_lo, s_hi;
        if (!walk_span(list, nspan, a.nqb, sp, q_lo, q_hi, Br, &s_lo, &s_hi))
            continue;
        for (int64_t i0 = s_lo; i0 < s_hi; i0 += Br) {
            const int rows = (int)min((int64_t)Br, a.Nq - i0);
            __syncthreads(); /* previous tiles consumed */
            /* Alg4 L.11: Q_i, dO_i, m_i, l_i (and D_i) on chip. */
            load_tile<T, A>(Qs, ld, a.q, b, i0, h, Br, rows, d);
            load_tile<T, A>(dOs, ld, a.dout, b, i0, h, Br, rows, d);
            load_row_stats<A>(a, row0, i0, Br, rows, ms, ls, Ds);
            __syncthreads();
            bwd_recompute<T, A>(a, Qs, dOs, Ks, Vs, ms, ls, P, dP, dcap, b, h, i0, j0, slope);
            __syncthreads();
            if (a.dropout) {
                /* Alg4 L.15-16, 19: Z from the seed; dP *= Z, PD = P * Z. */
                apply_dropout<A>(a, dP, PD, Bc, Br, Bc, bh, i0, j0);
                __syncthreads();
                for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x)
                    PD[idx] *= P[idx];
            }
            /* Alg4 L.21: dS = P * (dP - D), in place of dP; through the
             * softcap times 1 - tanh^2 (ALiBi passes dS unchanged). */
            for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
                const int r = idx / Bc;
                const A ds = P[idx] * (dP[idx] - Ds[r]);
                /* dbias gets dS at the biased logit, before the softcap. */
                if (a.dbias_mode == kDbiasStore || a.dbias_mode == kDbiasAtomic)
                    dbias_put<T, A>(a, ls, b, h, i0, j0, r, idx - r * Bc, ds);
                dP[idx] = dcap ? ds * dcap[idx] : ds;
            }
            __syncthreads();
            /* Alg4 L.17: dV_j += PD^T dO_i; L.23: dK_j += scale dS^T Q_i. */
            for (int idx = threadIdx.x; idx < Bc * d; idx += blockDim.x) {
                const int c = idx / d, x = idx - c * d;
                A dv = 0, dk = 0;
                for (int r = 0; r < rows; r++) {
                    dv += Pdrop[r * Bc + c] * dOs[r * ld + x];
                    dk += dP[r * Bc + c] * Qs[r * ld + x];
                }
                dVs[idx] += dv;
                dKs[idx] += dk * scale;
            }
            /* Alg4 L.22: dQ_i += scale dS K_j (atomics across K/V blocks;
             * in deterministic mode attn_bwd_dq_kernel does it instead). */
            A *dqa = (A *)a.dq_acc + (row0 + i0) * d;
            for (int idx = threadIdx.x; idx < (a.deterministic ? 0 : rows * d);
                 idx += blockDim.x) {
                const int r = idx / d, x = idx - r * d;
                A acc = 0;
                for (int c = 0; c < cols; c++)
                    acc += dP[r * Bc + c] * Ks[c * ld + x];
                if (acc != A(0))
                    atomicAdd(dqa + idx, acc * scale);
            }
        }
        }
    }
    __syncthreads();
    /* Alg4 L.25: write dK_j, dV_j; keys no query sees (padding) get 0. */
    for (int idx = threadIdx.x; idx < cols_out * d; idx += blockDim.x) {
        const int c = idx / d, x = idx - c * d;
        elem<T>(a.dk, b, j0 + c, hk)[x] = from_acc<T>(c < cols ? dKs[idx] : A(0));
        elem<T>(a.dv, b, j0 + c, hk)[x] = from_acc<T>(c < cols ? dVs[idx] : A(0));
    }
}

/* Deterministic dQ (no atomics): one block per (query block, head, batch)
 * streams the K/V blocks past its Q_i, dO_i, recomputes P and dS exactly as
 * the main kernel does, and sums dQ_i += scale dS K_j in a fixed order in
 * shared memory; dQ is written once. Costs a second recomputation of S and
 * dP. */
template <typename T>
__global__ void __launch_bounds__(kThreads)
attn_bwd_dq_kernel(const AttnArgs args)
{
    typedef typename AccOf<T>::type A;
    const int h = blockIdx.y, b = blockIdx.z;
    int nk_rows;
    const AttnArgs a = seq_args<T, A>(args, b, &nk_rows);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int d = a.d, Br = a.Br, Bc = a.Bc, ld = d + 1;
    const RowBlockSmem<A> sm(smem_raw, a, Br * d); /* acc: the dQ_i sums */
    A *Qs = sm.Qs, *dOs = sm.dOs, *Ks = sm.Ks, *Vs = sm.Vs, *P = sm.P, *dP = sm.dP;
    A *dQs = sm.acc, *ms = sm.ms, *ls = sm.ls, *Ds = sm.Ds, *dcap = sm.dcap;

    const int64_t i0 = (int64_t)blockIdx.x * Br;
    if (i0 >= a.Nq)
        return;
    const int hk = h / a.group;
    const int64_t bh = (int64_t)b * a.H + h;
    const int rows = (int)min((int64_t)Br, (int64_t)a.Nq - i0);
    const A scale = (A)a.scale;

    load_tile<T, A>(Qs, ld, a.q, b, i0, h, Br, rows, d);
    load_tile<T, A>(dOs, ld, a.dout, b, i0, h, Br, rows, d);
    for (int idx = threadIdx.x; idx < Br * d; idx += blockDim.x)
        dQs[idx] = 0;
    load_row_stats<A>(a, stat_row0(a, b, h), i0, Br, rows, ms, ls, Ds);
    /* The same key walk as the forward (band, block lists). */
    const int64_t k_lo = band_key_begin(a, i0), k_hi = band_key_end(a, i0 + rows - 1);
    const A slope = alibi_slope<A>(a, b, h);
    int nspan = 1;
    const int32_t *list = a.sparse ? block_list(a, true, b, h, i0 / FG_ATTN_SPARSE_BLOCK, &nspan)
                                   : nullptr;
    for (int sp = 0; sp < nspan; sp++) {
    int64_t s_lo, s_hi;
    if (!walk_span(list, nspan, a.nkb, sp, k_lo, k_hi, Bc, &s_lo, &s_hi))
        continue;
    for (int64_t j0 = s_lo; j0 < s_hi; j0 += Bc) {
        const int cols = (int)min((int64_t)Bc, (int64_t)a.Nk - j0);
        __syncthreads();
        load_tile<T, A>(Ks, ld, a.k, b, j0, hk, Bc, cols, d);
        load_tile<T, A>(Vs, ld, a.v, b, j0, hk, Bc, cols, d);
        __syncthreads();
        bwd_recompute<T, A>(a, Qs, dOs, Ks, Vs, ms, ls, P, dP, dcap, b, h, i0, j0, slope);
        __syncthreads();
        if (a.dropout) {
            apply_dropout<A>(a, dP, (A *)nullptr, Bc, Br, Bc, bh, i0, j0);
            __syncthreads();
        }
        for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
            const A ds = P[idx] * (dP[idx] - Ds[idx / Bc]);
            dP[idx] = dcap ? ds * dcap[idx] : ds;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
            const int r = idx / d, x = idx - r * d;
            A acc = 0;
            for (int c = 0; c < cols; c++)
                acc += dP[r * Bc + c] * Ks[c * ld + x];
            dQs[idx] += acc * scale;
        }
    }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
        const int r = idx / d, x = idx - r * d;
        elem<T>(a.dq, b, i0 + r, h)[x] = from_acc<T>(dQs[idx]);
    }
}

template <typename T>
static fg_status launch_bwd_dq(AttnArgs a, size_t smem_limit, cudaStream_t st)
{
    typedef typename AccOf<T>::type A;
    const int ncap = a.softcap > 0.f;
    int t = 0;
    FG_TRY(pick_bwd_tile([&](int x) { return bwd_dq_smem_bytes(x, x, a.d, sizeof(A), ncap); },
                         smem_limit, a.d, "deterministic dQ", &t));
    a.Br = a.Bc = t;
    const size_t smem = bwd_dq_smem_bytes(t, t, a.d, sizeof(A), ncap);
    FG_CUDA_TRY(cudaFuncSetAttribute(attn_bwd_dq_kernel<T>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
    dim3 grid((unsigned)((a.Nq + t - 1) / t), (unsigned)a.H, (unsigned)a.B);
    attn_bwd_dq_kernel<T><<<grid, kThreads, smem, st>>>(a);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
static fg_status launch_bwd(fg_dtype dt, AttnArgs a, size_t smem_limit, cudaStream_t st)
{
    typedef typename AccOf<T>::type A;
    const int ncap = a.softcap > 0.f;
    const int t = pick_tile([&](int x) { return bwd_smem_bytes(x, x, a.d, sizeof(A), ncap); },
                            smem_limit);
    if (t == 0)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "fg_attention_backward: head_dim %d needs more shared "
                        "memory than this GPU has",
                        a.d);
    a.Br = a.Bc = t;
    bool fp32 = false; /* the fp32 kernels ran, deterministic dQ included */
    bool det_tiles = false; /* the wgmma kernel summed dQ in a fixed order */
    /* The sm90 wgmma kernels (fp16/bf16; their TMA maps built here) */
    alignas(64) unsigned char maps[1024];
    const bool wg = sizeof(T) == 2 && a.lse2p && mma_path_ok(a, true) && wgmma_usable() &&
                    attn_bwd_wgmma_smem(a) <= smem_limit &&
                    attn_bwd_wgmma_maps_size() <= sizeof maps && attn_bwd_wgmma_maps(a, maps);
    /* D, the wgmma path's padded stats and the zeroed dq_acc: one pass
     * where it applies, else a memset, D, and the stats below */
    bool prepped = false;
    if (wg) {
        a.dq_tile_d = attn_bwd_wgmma_dpad(a.d); /* the layout it accumulates dQ in */
        a.dq_tile_q = attn_bwd_wgmma_dq_tile_q(maps);
        FG_TRY(launch_bwd_prep_tiled<T>(a, st, &prepped));
    }
    if (!prepped) {
        if (a.dq_zero)
            FG_CUDA_TRY(cudaMemsetAsync(a.dq_acc, 0, a.dq_zero, st));
        FG_TRY(launch_bwd_preprocess<T>(a, st)); /* nothing for an empty packed batch */
    }
    /* dbias zeroed before the main kernel, unless that kernel writes all of it */
    if (!(wg && attn_bwd_wgmma_covers_dbias(a, maps)))
        FG_TRY(attn_dbias_before(dt, a, st));
    if (std::is_same<T, float>::value) { /* tensor cores (TF32, 3xTF32), else SIMT */
        FG_TRY(attn_tf32_bwd(a, smem_limit, st, &fp32));
        if (!fp32)
            FG_TRY(attn_fp32_bwd(a, smem_limit, st, &fp32));
    }
    if (fp32) {
        if (a.deterministic)
            return FG_OK;
    } else if (wg) {
        if (!prepped) {
            const int64_t n = (int64_t)a.B * a.H * a.nq_pad;
            attn_bwd_pad_stats<<<(unsigned)min((n + 255) / 256, (int64_t)65535), 256, 0, st>>>(a);
            FG_CUDA_TRY_LAUNCH();
        }
        /* Deterministic: dQ summed in a fixed order by the kernel itself
         * where it has turn counters (attn_launch.cu: no block mask);
         * FG_ATTN_DET_DQ=0 keeps the strict dQ kernel (comparisons). */
        AttnArgs w = a;
        det_tiles = a.deterministic && a.dq_sem && !env_is("FG_ATTN_DET_DQ", "0");
        if (det_tiles)
            w.deterministic = 0;
        else
            w.dq_sem = nullptr;
        FG_TRY(attn_bwd_wgmma_dispatch(AccOf<T>::is_bf16 ? FG_BF16 : FG_FP16, w, maps, st));
    } else if (sizeof(T) == 2 && mma_path_ok(a, true) &&
               attn_bwd_mma_supported(a.d, smem_limit)) {
        FG_TRY(attn_bwd_mma_dispatch(sizeof(T) == 2 && AccOf<T>::is_bf16 ? FG_BF16
                                                                        : FG_FP16,
                                     a, st));
    } else {
        const size_t smem = bwd_smem_bytes(t, t, a.d, sizeof(A), ncap);
        FG_CUDA_TRY(cudaFuncSetAttribute(attn_bwd_kernel<T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem));
        dim3 grid((unsigned)((a.Nk + t - 1) / t), (unsigned)a.Hk, (unsigned)a.B);
        attn_bwd_kernel<T><<<grid, kThreads, smem, st>>>(a);
        FG_CUDA_TRY_LAUNCH();
    }
    if (a.deterministic && !det_tiles)
        return launch_bwd_dq<T>(a, smem_limit, st);
    return launch_bwd_write_dq<T>(a, st);
}

fg_status attn_bwd_dispatch(fg_dtype dt, const AttnArgs &a, size_t smem_limit,
                            cudaStream_t st)
{
    fg_status s = FG_OK;
    switch (dt) {
    case FG_FP64: s = launch_bwd<double>(dt, a, smem_limit, st); break;
    case FG_FP32: s = launch_bwd<float>(dt, a, smem_limit, st); break;
    case FG_FP16: s = launch_bwd<__half>(dt, a, smem_limit, st); break;
    case FG_BF16: s = launch_bwd<__nv_bfloat16>(dt, a, smem_limit, st); break;
    default:
        return fg_error(FG_ERR_INTERNAL, "attn_bwd_dispatch: dtype %d", (int)dt);
    }
    FG_TRY(s);
    return attn_dbias_after(dt, a, smem_limit, st);
}

} /* namespace fg */
