/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bias.cu - the gradient of the additive attention
 * bias (attention.h). The backward's main kernel (general, or sm90 wgmma)
 * forms dS = P (dP - D) for every visible pair anyway; how it reaches dbias
 * depends on dbias's broadcast (AttnArgs::dbias_mode, chosen in
 * attn_launch.cu):
 *   kDbiasStore   nothing broadcast: each element is one pair; dbias is
 *                 zeroed here, the main kernel stores the visited pairs;
 *   kDbiasAtomic  broadcast: the main kernel adds with atomics into
 *                 dbias_acc (dbias itself when it has the accumulator type,
 *                 else a zeroed scratch of dbias's shape converted here);
 *   kDbiasPass    broadcast with deterministic = 1: attn_bwd_dbias_kernel
 *                 below recomputes P and dS and sums the broadcast
 *                 dimensions in a fixed order (bitwise reproducible).
 * Nothing Nq x Nk is allocated beyond dbias's own shape. */
#include "attn_bwd_tile.cuh"
#include "attn_kernels.h"
#include "kernels/runtime/cuda_check.h"

namespace fg {

/* The stored extents of dbias (1 on broadcast dimensions). */
struct DbiasExt {
    int64_t e[4];
    __host__ __device__ int64_t count() const { return e[0] * e[1] * e[2] * e[3]; }
};

static DbiasExt dbias_ext(const AttnArgs &a)
{
    const int64_t full[4] = {a.B, a.H, a.Nq, a.Nk};
    DbiasExt x;
    for (int k = 0; k < 4; k++)
        x.e[k] = a.dbias_s[k] ? full[k] : 1;
    return x;
}

/* Every stored dbias element = 0, or (from_scratch) its dbias_acc sum. One
 * block a stored row (b, h, i), its threads over the keys: the index
 * arithmetic once a row, coalesced where the keys are (the flat loop with
 * four 64-bit divisions an element took 3 ms of a 5 ms backward for a
 * [8,16,2k,2k] bf16 dbias on an H200). */
template <typename T>
__global__ void dbias_write_kernel(const AttnArgs a, DbiasExt x, int from_scratch)
{
    typedef typename AccOf<T>::type A;
    const int64_t rows = x.e[0] * x.e[1] * x.e[2];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const int64_t i = row % x.e[2], h = row / x.e[2] % x.e[1];
        const int64_t b = row / (x.e[2] * x.e[1]);
        const int64_t off = b * a.dbias_s[0] + h * a.dbias_s[1] + i * a.dbias_s[2];
        const int64_t src = b * a.dbias_acc_s[0] + h * a.dbias_acc_s[1] + i * a.dbias_acc_s[2];
        for (int64_t j = threadIdx.x; j < x.e[3]; j += blockDim.x) {
            const A v = from_scratch ? ((const A *)a.dbias_acc)[src + j * a.dbias_acc_s[3]] : A(0);
            if (a.dbias_f32)
                ((float *)a.dbias)[off + j * a.dbias_s[3]] = (float)v;
            else
                ((T *)a.dbias)[off + j * a.dbias_s[3]] = from_acc<T>(v);
        }
    }
}

/* Do dbias's stored elements fill one span of memory exactly (row-major
 * in some order of its stored dimensions)? Then a memset zeroes it. */
static bool dbias_one_span(const AttnArgs &a, const DbiasExt &x)
{
    int64_t st[4], ex[4];
    int n = 0;
    for (int k = 0; k < 4; k++)
        if (x.e[k] > 1) {
            st[n] = a.dbias_s[k];
            ex[n++] = x.e[k];
        }
    for (int p = 1; p < n; p++) /* by stride, smallest first */
        for (int q = p; q > 0 && st[q] < st[q - 1]; q--) {
            const int64_t t0 = st[q], t1 = ex[q];
            st[q] = st[q - 1], ex[q] = ex[q - 1];
            st[q - 1] = t0, ex[q - 1] = t1;
        }
    int64_t want = 1;
    for (int p = 0; p < n; p++) {
        if (st[p] != want)
            return false;
        want *= ex[p];
    }
    return true;
}

/* Is key block j0 / 128 listed for query block i0 / 128 of (b, h)? */
__device__ __forceinline__ bool block_listed(const AttnArgs &a, int64_t b, int64_t h,
                                             int64_t i0, int64_t j0)
{
    int n = 0;
    const int32_t *list = block_list(a, true, b, h, i0 / FG_ATTN_SPARSE_BLOCK, &n);
    const int32_t kb = (int32_t)(j0 / FG_ATTN_SPARSE_BLOCK);
    for (int x = 0; x < n && x < a.nkb; x++)
        if (list[x] == kb)
            return true;
    return false;
}

/* Deterministic dbias: one block per stored (b', h') and tile of its stored
 * rows x columns (Br x Bc; a broadcast query or key dimension is one row or
 * column summing all of them). It walks the (b, h, query block, key block)
 * tiles that map onto its tile in a fixed order, recomputes P, dP and
 * dS = P (dP - D) as the backward does, and adds them into a tile in
 * shared memory, each element always by the same thread in the same
 * order; the tile is written once. */
template <typename T>
__global__ void __launch_bounds__(kThreads)
attn_bwd_dbias_kernel(const AttnArgs a, int n_col_tiles)
{
    typedef typename AccOf<T>::type A;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int d = a.d, Br = a.Br, Bc = a.Bc, ld = d + 1;
    const RowBlockSmem<A> sm(smem_raw, a, Br * Bc);
    A *Qs = sm.Qs, *dOs = sm.dOs, *Ks = sm.Ks, *Vs = sm.Vs, *P = sm.P, *dP = sm.dP;
    A *acc = sm.acc, *ms = sm.ms, *ls = sm.ls, *Ds = sm.Ds, *dcap = sm.dcap;

    const bool qb = a.dbias_s[2] == 0, kb = a.dbias_s[3] == 0;
    const int64_t tile_q = blockIdx.x / n_col_tiles, tile_k = blockIdx.x % n_col_tiles;
    const int64_t ob = blockIdx.z, oh = blockIdx.y; /* 0 where broadcast */
    const int64_t i_lo = qb ? 0 : tile_q * Br, i_hi = qb ? a.Nq : min((int64_t)a.Nq, i_lo + Br);
    const int64_t j_lo = kb ? 0 : tile_k * Bc, j_hi = kb ? a.Nk : min((int64_t)a.Nk, j_lo + Bc);
    const int64_t b_lo = a.dbias_s[0] ? ob : 0, b_hi = a.dbias_s[0] ? ob + 1 : a.B;
    const int64_t h_lo = a.dbias_s[1] ? oh : 0, h_hi = a.dbias_s[1] ? oh + 1 : a.H;

    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x)
        acc[idx] = 0;
    for (int64_t j0 = j_lo; j0 < j_hi; j0 += Bc) {
        const int cols = (int)min((int64_t)Bc, a.Nk - j0);
        for (int64_t b = b_lo; b < b_hi; b++)
            for (int64_t h = h_lo; h < h_hi; h++) {
                const int64_t bh = b * a.H + h, hk = h / a.group;
                const A slope = alibi_slope<A>(a, b, h);
                bool kv_loaded = false;
                for (int64_t i0 = i_lo; i0 < i_hi; i0 += Br) {
                    const int rows = (int)min((int64_t)Br, a.Nq - i0);
                    /* Tiles outside the band or the block mask add nothing
                     * (the decision is uniform over the block). */
                    if (j0 >= band_key_end(a, i0 + rows - 1) ||
                        j0 + cols <= band_key_begin(a, i0) ||
                        (a.sparse && !block_listed(a, b, h, i0, j0)))
                        continue;
                    __syncthreads(); /* previous tiles consumed */
                    if (!kv_loaded) {
                        load_tile<T, A>(Ks, ld, a.k, b, j0, hk, Bc, cols, d);
                        load_tile<T, A>(Vs, ld, a.v, b, j0, hk, Bc, cols, d);
                        kv_loaded = true;
                    }
                    load_tile<T, A>(Qs, ld, a.q, b, i0, h, Br, rows, d);
                    load_tile<T, A>(dOs, ld, a.dout, b, i0, h, Br, rows, d);
                    load_row_stats<A>(a, bh * a.Nq, i0, Br, rows, ms, ls, Ds);
                    __syncthreads();
                    bwd_recompute<T, A>(a, Qs, dOs, Ks, Vs, ms, ls, P, dP, dcap, b, h,
                                        i0, j0, slope);
                    __syncthreads();
                    if (a.dropout) {
                        apply_dropout<A>(a, dP, (A *)nullptr, Bc, Br, Bc, bh, i0, j0);
                        __syncthreads();
                    }
                    /* dS of the visible pairs, 0 elsewhere (even where dP
                     * is NaN: a masked pair has no gradient). */
                    for (int idx = threadIdx.x; idx < Br * Bc; idx += blockDim.x) {
                        const int r = idx / Bc, c = idx - r * Bc;
                        const bool ok = r < rows && c < cols && ls[r] != A(0) &&
                                        visible(a, i0 + r, j0 + c);
                        dP[idx] = ok ? P[idx] * (dP[idx] - Ds[r]) : A(0);
                    }
                    __syncthreads();
                    /* Into the tile: element (r', c') sums the rows (query
                     * broadcast) and/or columns (key broadcast) it covers,
                     * in ascending order. */
                    const int orows = qb ? 1 : Br, ocols = kb ? 1 : Bc;
                    for (int idx = threadIdx.x; idx < orows * ocols; idx += blockDim.x) {
                        const int ro = idx / ocols, co = idx - ro * ocols;
                        A sum = 0;
                        for (int r = qb ? 0 : ro; r < (qb ? rows : ro + 1); r++)
                            for (int c = kb ? 0 : co; c < (kb ? cols : co + 1); c++)
                                sum += dP[r * Bc + c];
                        acc[ro * Bc + co] += sum;
                    }
                }
            }
    }
    __syncthreads();
    const int orows = (int)(qb ? 1 : i_hi - i_lo), ocols = (int)(kb ? 1 : j_hi - j_lo);
    for (int idx = threadIdx.x; idx < orows * ocols; idx += blockDim.x) {
        const int ro = idx / ocols, co = idx - ro * ocols;
        const int64_t off = ob * a.dbias_s[0] + oh * a.dbias_s[1] +
                            (i_lo + ro) * a.dbias_s[2] + (j_lo + co) * a.dbias_s[3];
        const A v = acc[ro * Bc + co];
        if (a.dbias_f32)
            ((float *)a.dbias)[off] = (float)v;
        else
            ((T *)a.dbias)[off] = from_acc<T>(v);
    }
}

template <typename T>
static fg_status dbias_write(const AttnArgs &a, int from_scratch, cudaStream_t st)
{
    const DbiasExt x = dbias_ext(a);
    if (x.count() == 0)
        return FG_OK;
    if (!from_scratch && dbias_one_span(a, x)) {
        const size_t es = a.dbias_f32 ? sizeof(float) : sizeof(T);
        FG_CUDA_TRY(cudaMemsetAsync(a.dbias, 0, (size_t)x.count() * es, st));
        return FG_OK;
    }
    const int64_t rows = x.e[0] * x.e[1] * x.e[2];
    const unsigned threads = x.e[3] >= 256 ? 256 : (unsigned)((x.e[3] + 31) / 32 * 32);
    const unsigned blocks = (unsigned)min(rows, (int64_t)1 << 20);
    dbias_write_kernel<T><<<blocks, threads, 0, st>>>(a, x, from_scratch);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
static fg_status dbias_pass(AttnArgs a, size_t smem_limit, cudaStream_t st)
{
    typedef typename AccOf<T>::type A;
    const int ncap = a.softcap > 0.f;
    int t = 0;
    FG_TRY(pick_bwd_tile([&](int x) { return bwd_dbias_smem_bytes(x, x, a.d, sizeof(A), ncap); },
                         smem_limit, a.d, "deterministic dbias", &t));
    a.Br = a.Bc = t;
    const DbiasExt x = dbias_ext(a);
    const int64_t nrow = a.dbias_s[2] ? (a.Nq + t - 1) / t : 1;
    const int64_t ncol = a.dbias_s[3] ? (a.Nk + t - 1) / t : 1;
    if (nrow * ncol > INT32_MAX)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "fg_attention_backward: too many dbias tiles");
    const size_t smem = bwd_dbias_smem_bytes(t, t, a.d, sizeof(A), ncap);
    FG_CUDA_TRY(cudaFuncSetAttribute(attn_bwd_dbias_kernel<T>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
    dim3 grid((unsigned)(nrow * ncol), (unsigned)x.e[1], (unsigned)x.e[0]);
    attn_bwd_dbias_kernel<T><<<grid, kThreads, smem, st>>>(a, (int)ncol);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
static fg_status dbias_stage(const AttnArgs &a, bool after, size_t smem_limit,
                             cudaStream_t st)
{
    switch (a.dbias_mode) {
    case kDbiasStore: /* zero the pairs the main kernel does not visit */
        return after ? FG_OK : dbias_write<T>(a, 0, st);
    case kDbiasAtomic:
        if (a.dbias_acc == a.dbias) /* in place: zero it first */
            return after ? FG_OK : dbias_write<T>(a, 0, st);
        return after ? dbias_write<T>(a, 1, st) : FG_OK; /* scratch zeroed by the launcher */
    case kDbiasPass:
        return after ? dbias_pass<T>(a, smem_limit, st) : FG_OK;
    }
    return FG_OK;
}

static fg_status dbias_dispatch(fg_dtype dt, const AttnArgs &a, bool after,
                                size_t smem_limit, cudaStream_t st)
{
    if (a.dbias_mode == kDbiasNone)
        return FG_OK;
    switch (dt) {
    case FG_FP64: return dbias_stage<double>(a, after, smem_limit, st);
    case FG_FP32: return dbias_stage<float>(a, after, smem_limit, st);
    case FG_FP16: return dbias_stage<__half>(a, after, smem_limit, st);
    case FG_BF16: return dbias_stage<__nv_bfloat16>(a, after, smem_limit, st);
    }
    return fg_error(FG_ERR_INTERNAL, "attn dbias: dtype %d", (int)dt);
}

fg_status attn_dbias_before(fg_dtype dt, const AttnArgs &a, cudaStream_t st)
{
    return dbias_dispatch(dt, a, false, 0, st);
}

fg_status attn_dbias_after(fg_dtype dt, const AttnArgs &a, size_t smem_limit,
                           cudaStream_t st)
{
    return dbias_dispatch(dt, a, true, smem_limit, st);
}

} /* namespace fg */
