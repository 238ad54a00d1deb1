/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd.cu - FlashAttention forward, general CUDA kernel.
 *
 * One thread block per (query block of Br rows, query head, batch). K/V
 * blocks of Bc rows stream through shared memory past the resident Q block;
 * the running row max m, row sum l and the unnormalised O accumulator stay
 * on chip (Algorithm 1 of Dao et al., with FlashAttention-2's loop order and
 * single normalisation at the end). Only O, m and l are written. K/V blocks
 * entirely above the causal diagonal are never loaded. */
#include "attn_common.cuh"
#include "attn_kernels.h"
#include "kernels/runtime/cuda_check.h"

namespace fg {

/* S = scale * Q_i K_j^T on the [rows, cols] tile, then the score mods and
 * the bias; masked entries = -inf. */
template <typename T, typename A>
__device__ __forceinline__ void fwd_scores(const AttnArgs &a, const A *Qs,
                                           const A *Ks, A *S, int64_t b,
                                           int64_t h, int64_t i0, int64_t j0,
                                           A slope)
{
    const int d = a.d, Br = a.Br, Bc = a.Bc;
    const A scale = (A)a.scale;
    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
        const int r = idx / Bc, c = idx - r * Bc;
        const A *qr = Qs + r * d, *kc = Ks + c * (d + 1);
        A acc = 0;
        for (int x = 0; x < d; x++)
            acc += qr[x] * kc[x];
        A x = (A)-INFINITY;
        if (visible(a, i0 + r, j0 + c)) {
            x = score_mod<A>(a, acc * scale, slope, i0 + r, j0 + c, nullptr);
            if (a.bias && i0 + r < a.Nq) /* padded rows read no bias */
                x += bias_at<T, A>(a, b, h, i0 + r, j0 + c);
        }
        S[idx] = x;
    }
}

/* Online softmax over one tile (Alg1 L.10-11): one warp per row, new max,
 * P~ = exp(S - m_new) in place, l = alpha l + rowsum, alpha kept for the
 * O rescale. Rows with nothing visible so far keep P = 0, alpha = 1. */
template <typename A>
__device__ __forceinline__ void fwd_softmax(const AttnArgs &a, A *S, A *ms,
                                            A *ls, A *alpha)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5, Bc = a.Bc;
    for (int r = warp; r < a.Br; r += nwarps) {
        A *row = S + r * Bc;
        A mx = ms[r];
        for (int c = lane; c < Bc; c += 32)
            mx = max_nan(mx, row[c]);
        for (int o = 16; o > 0; o >>= 1)
            mx = max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        A sum = 0;
        const bool empty = mx == (A)-INFINITY;
        for (int c = lane; c < Bc; c += 32) {
            const A p = empty ? A(0) : fast_exp(row[c] - mx);
            row[c] = p;
            sum += p;
        }
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        __syncwarp(); /* every lane has read ms[r] before lane 0 updates it */
        if (lane == 0) {
            const A al = empty ? A(1) : fast_exp(ms[r] - mx); /* exp(-inf)=0 */
            alpha[r] = al;
            ls[r] = al * ls[r] + sum;
            ms[r] = mx;
        }
    }
}

/* O = diag(alpha) O + P V_j (Alg1 L.12, unnormalised). */
template <typename A>
__device__ __forceinline__ void fwd_pv(const AttnArgs &a, const A *S,
                                       const A *Vs, const A *alpha, A *Oacc,
                                       int cols)
{
    const int d = a.d, Bc = a.Bc;
    for (int idx = threadIdx.x; idx < a.Br * d; idx += blockDim.x) {
        const int r = idx / d, x = idx - r * d;
        const A *p = S + r * Bc;
        A acc = Oacc[idx] * alpha[r];
        for (int c = 0; c < cols; c++)
            acc += p[c] * Vs[c * d + x];
        Oacc[idx] = acc;
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
attn_fwd_kernel(const AttnArgs args)
{
    typedef typename AccOf<T>::type A;
    const int h = blockIdx.y, b = blockIdx.z;
    int nk_rows; /* padded keys need no output here */
    const AttnArgs a = seq_args<T, A>(args, b, &nk_rows);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int d = a.d, Br = a.Br, Bc = a.Bc;
    A *Qs = (A *)smem_raw;
    A *Ks = Qs + Br * d;
    A *Vs = Ks + Bc * (d + 1);
    A *S = Vs + Bc * d;
    A *Oacc = S + Br * Bc;
    A *ms = Oacc + Br * d, *ls = ms + Br, *alpha = ls + Br;

    const int64_t i0 = (int64_t)blockIdx.x * Br;
    if (i0 >= a.Nq) /* the grid covers the longest sequence */
        return;
    const int hk = h / a.group;
    const int rows = (int)min((int64_t)Br, a.Nq - i0);

    /* Alg1 L.8: Q_i on chip; O = 0, l = 0, m = -inf (FA2 form). */
    load_tile<T, A>(Qs, d, a.q, b, i0, h, Br, rows, d);
    for (int idx = threadIdx.x; idx < Br * d; idx += blockDim.x)
        Oacc[idx] = 0;
    for (int r = threadIdx.x; r < Br; r += blockDim.x) {
        ms[r] = (A)-INFINITY;
        ls[r] = 0;
    }

    /* The band (causal, window) bounds the keys any row sees: K/V blocks
     * outside are never loaded; with a block mask only the listed 128-blocks
     * are walked (block-sparse FlashAttention). */
    const int64_t k_lo = band_key_begin(a, i0), k_hi = band_key_end(a, i0 + rows - 1);
    const int64_t bh = (int64_t)b * a.H + h;
    const A slope = alibi_slope<A>(a, b, h);
    int nspan = 1;
    const int32_t *list = a.sparse ? block_list(a, true, b, h, i0 / FG_ATTN_SPARSE_BLOCK, &nspan)
                                   : nullptr;
    for (int sp = 0; sp < nspan; sp++) {
    int64_t s_lo, s_hi;
    if (!walk_span(list, nspan, a.nkb, sp, k_lo, k_hi, Bc, &s_lo, &s_hi))
        continue;
    for (int64_t j0 = s_lo; j0 < s_hi; j0 += Bc) {
        const int cols = (int)min((int64_t)Bc, a.Nk - j0);
        __syncthreads(); /* previous block's tiles are consumed */
        /* Alg1 L.6: K_j, V_j on chip. */
        load_tile<T, A>(Ks, d + 1, a.k, b, j0, hk, Bc, cols, d);
        load_tile<T, A>(Vs, d, a.v, b, j0, hk, Bc, cols, d);
        __syncthreads();
        fwd_scores<T, A>(a, Qs, Ks, S, b, h, i0, j0, slope); /* Alg1 L.9 + mods + mask */
        __syncthreads();
        fwd_softmax<A>(a, S, ms, ls, alpha);
        __syncthreads();
        if (a.dropout) { /* dropout hits the P that feeds O, not l */
            apply_dropout<A>(a, S, (A *)nullptr, Bc, rows, cols, bh, i0, j0);
            __syncthreads();
        }
        fwd_pv<A>(a, S, Vs, alpha, Oacc, cols);
    }
    }
    __syncthreads();

    /* Epilogue (Alg1 L.12-13, normalised once): O = acc / l; fully masked
     * rows (l = 0) get O = 0, NaN rows stay NaN. Stats: m and l as they
     * stand. */
    for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
        const int r = idx / d, x = idx - r * d;
        const A l = ls[r];
        elem<T>(a.o, b, i0 + r, h)[x] = from_acc<T>(l == A(0) ? A(0) : Oacc[idx] / l);
    }
    const int64_t row0 = stat_row0(a, b, h) + i0;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        ((A *)a.m)[row0 + r] = ms[r];
        ((A *)a.l)[row0 + r] = ls[r];
    }
}

template <typename T>
static fg_status launch_fwd(AttnArgs a, size_t smem_limit, cudaStream_t st)
{
    typedef typename AccOf<T>::type A;
    const int t = pick_tile([&](int x) { return fwd_smem_bytes(x, x, a.d, sizeof(A)); },
                            smem_limit);
    if (t == 0)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "fg_attention_forward: head_dim %d needs more shared "
                        "memory than this GPU has",
                        a.d);
    a.Br = a.Bc = t;
    const size_t smem = fwd_smem_bytes(t, t, a.d, sizeof(A));
    FG_CUDA_TRY(cudaFuncSetAttribute(attn_fwd_kernel<T>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
    dim3 grid((unsigned)((a.Nq + t - 1) / t), (unsigned)a.H, (unsigned)a.B);
    attn_fwd_kernel<T><<<grid, kThreads, smem, st>>>(a);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

fg_status attn_fwd_dispatch(fg_dtype dt, const AttnArgs &a, size_t smem_limit,
                            cudaStream_t st)
{
    if ((dt == FG_FP16 || dt == FG_BF16) && mma_path_ok(a, false)) {
        fg_status status = FG_OK;
        if (wgmma_usable() && attn_fwd_wgmma_smem(a.d) <= smem_limit &&
            attn_fwd_wgmma_dispatch(dt, a, st, &status))
            return status;
        /* The sm80 kernels run every mask and score modifier, packed or
         * padded batches (kMode 2) and a bias (kMode 4). */
        if (attn_fwd_mma_smem(a.d) <= smem_limit)
            return attn_fwd_mma_dispatch(dt, a, st);
    }
    if (dt == FG_FP32) { /* tensor cores (TF32 or 3xTF32), else SIMT */
        bool ran = false;
        FG_TRY(attn_tf32_fwd(a, smem_limit, st, &ran));
        if (!ran)
            FG_TRY(attn_fp32_fwd(a, smem_limit, st, &ran));
        if (ran)
            return FG_OK;
    }
    switch (dt) {
    case FG_FP64: return launch_fwd<double>(a, smem_limit, st);
    case FG_FP32: return launch_fwd<float>(a, smem_limit, st);
    case FG_FP16: return launch_fwd<__half>(a, smem_limit, st);
    case FG_BF16: return launch_fwd<__nv_bfloat16>(a, smem_limit, st);
    }
    return fg_error(FG_ERR_INTERNAL, "attn_fwd_dispatch: dtype %d", (int)dt);
}

} /* namespace fg */
