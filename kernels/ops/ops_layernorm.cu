/* SPDX-License-Identifier: MIT */
/* kernels/ops/ops_layernorm.cu - layernorm forward and backward (entry points
 * in lib/ops/cuda_ops_nn.h).
 *
 * Rows of up to ln_reg_max<A>() elements (8192; 4096 in fp64) live in
 * registers, ln_elems<A>() per thread, with 16-byte loads where alignment
 * allows: the forward reads x once; the backward reads x and g once,
 * writes dx and accumulates its rows' dweight / dbias in registers, one
 * partial row per block, which a second kernel sums in a fixed order
 * (deterministic, no atomics; the block count follows the visible SM
 * count and the kernel's occupancy, so bits are reproducible on one
 * device configuration and build).
 * Longer rows take the general kernels: three passes, then column sums in
 * kernels of their own.
 *
 * y (and so g) may be narrower than x: fp16/bf16 for fp32 x, fp32 for fp64
 * x (fg_layernorm_cast). Every kernel is one template for both cases and
 * only the store of y (load of g) differs, and every product that meets an
 * add is an explicit fma or rounded multiply, so the narrow y is bit for
 * bit the rounding of the same-dtype kernel's y.
 *
 * fg_dropout_add_layernorm's kernels are the register kernels with a
 * residual join (LnJoin): the forward first makes x + dropout(b) (stored,
 * then normalized from the registers), the backward ends with the
 * branch's gradient from the final dx; one pass each way instead of two. */
#include <atomic>

#include "ops_nn_common.cuh"

namespace {

#define LN_TPR_MAX 512   /* threads per row, at most */
#define LN_BLOCK 256     /* threads per block when rows are short */

/* ---- element helpers ------------------------------------------------------ */

template <int B> struct Bytes;
template <> struct Bytes<2> { typedef unsigned short type; };
template <> struct Bytes<4> { typedef unsigned int type; };
template <> struct Bytes<8> { typedef uint2 type; };
template <> struct Bytes<16> { typedef uint4 type; };

__device__ __forceinline__ float d_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double d_fma(double a, double b, double c) { return __fma_rn(a, b, c); }

/* A compute value to storage type S with one rounding (S may be narrower
 * than the compute type's own storage). */
template <typename S> __device__ __forceinline__ S to_s(float v) { return Num<S>::st(v); }
template <typename S> __device__ __forceinline__ S to_s(double v) { return Num<S>::st_d(v); }

/* V elements of S at p (aligned to V * sizeof(S) when V > 1), in A. */
template <typename S, int V, typename A>
__device__ __forceinline__ void load_n(const S *p, A *out)
{
    typedef typename Bytes<sizeof(S) * V>::type R;
    const R raw = *reinterpret_cast<const R *>(p);
    const S *e = reinterpret_cast<const S *>(&raw);
#pragma unroll
    for (int k = 0; k < V; k++)
        out[k] = (A)Num<S>::ld(e[k]);
}

/* The V elements of S held in raw (as load_n reads them), in A. */
template <typename S, int V, typename R, typename A>
__device__ __forceinline__ void raw_n(const R &raw, A *out)
{
    static_assert(sizeof(R) == sizeof(S) * V, "one vector");
    const S *e = reinterpret_cast<const S *>(&raw);
#pragma unroll
    for (int k = 0; k < V; k++)
        out[k] = (A)Num<S>::ld(e[k]);
}

template <typename S, int V, typename A>
__device__ __forceinline__ void store_n(S *p, const A *in)
{
    typedef typename Bytes<sizeof(S) * V>::type R;
    R raw;
    S *e = reinterpret_cast<S *>(&raw);
#pragma unroll
    for (int k = 0; k < V; k++)
        e[k] = to_s<S>(in[k]);
    *reinterpret_cast<R *>(p) = raw;
}

/* weight / bias elements j..j+V-1 (dflt when the vector is absent); a
 * contiguous vector is 16-byte aligned whenever V > 1 (the host checks). */
template <typename T, int V>
__device__ __forceinline__ void load_par(const T *p, int64_t s, int64_t j,
                                         typename Num<T>::A dflt,
                                         typename Num<T>::A *out)
{
    if (!p) {
#pragma unroll
        for (int k = 0; k < V; k++)
            out[k] = dflt;
    } else if (s == 1) {
        load_n<T, V>(p + j, out);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++)
            out[k] = Num<T>::ld(p[(j + k) * s]);
    }
}

/* The residual join of fg_dropout_add_layernorm (fg_dropout_add's roundings,
 * ops_nn.cu's dropout_add_kernel, so the fused op equals the chain bit for
 * bit): forward x' = x + round_v(b * (keep ? scale : 0)), stored to xo;
 * backward db = round_v(round_v(dx) * (keep ? scale : 0)) from the final
 * dx. Applied per 4-element vector (V = 4, C % 4 == 0): one Philox group,
 * word k for element k, as fg_dropout's mask. */
template <typename T, typename Tv> struct LnJoin {
    const Tv *b; /* forward: the branch [R, C] */
    T *xo;       /* forward: x + dropout(b) [R, C] */
    Tv *db;      /* backward: the branch's gradient [R, C] */
    uint2 key;
    uint32_t off_lo, thr;
    double scale;
};

/* The keep bits of elements e .. e + 3 (e % 4 == 0): bit k for element
 * e + k (a mask, not four factors: registers are the backward's limit). */
template <typename T, typename Tv>
__device__ __forceinline__ unsigned join_keep(const LnJoin<T, Tv> &J,
                                              int64_t e)
{
    if (J.thr >= (1u << 24))
        return 0xfu; /* p = 0: keep all, no draw */
    const uint64_t g = (uint64_t)e >> 2;
    const uint4 r = curand_Philox4x32_10(
        make_uint4((uint32_t)g, (uint32_t)(g >> 32), FG_NN_DROPOUT_TAG,
                   J.off_lo),
        J.key);
    return ((r.x >> 8) < J.thr ? 1u : 0u) | ((r.y >> 8) < J.thr ? 2u : 0u) |
           ((r.z >> 8) < J.thr ? 4u : 0u) | ((r.w >> 8) < J.thr ? 8u : 0u);
}

/* v (x's 4 elements from e) += the dropped branch (its 4 elements at e,
 * raw as loaded: the caller loads every vector first); stores the sum to
 * xo. __dmul_rn: never contracted with the add (as in the chain). */
template <typename T, typename Tv, typename A>
__device__ __forceinline__ void join_forward(const LnJoin<T, Tv> &J,
                                             int64_t e, A *v,
                                             const typename Bytes<4 * sizeof(Tv)>::type &raw)
{
    const unsigned keep = join_keep(J, e);
    const Tv *bv = reinterpret_cast<const Tv *>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const Tv d = Num<Tv>::st_d(__dmul_rn(
            (double)Num<Tv>::ld(bv[k]), (keep >> k) & 1u ? J.scale : 0.0));
        v[k] = Num<T>::ld(Num<T>::st(v[k] + (A)Num<Tv>::ld(d)));
    }
    store_n<T, 4>(J.xo + e, v);
}

/* The branch's gradient from the final dx (d, as stored) at e .. e + 3. */
template <typename T, typename Tv, typename A>
__device__ __forceinline__ void join_backward(const LnJoin<T, Tv> &J,
                                              int64_t e, const A *d)
{
    const unsigned keep = join_keep(J, e);
    typedef typename Bytes<4 * sizeof(Tv)>::type R;
    R raw;
    Tv *o = reinterpret_cast<Tv *>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const Tv g = Num<Tv>::st(Num<T>::ld(Num<T>::st(d[k])));
        o[k] = Num<Tv>::st_d(__dmul_rn((double)Num<Tv>::ld(g),
                                       (keep >> k) & 1u ? J.scale : 0.0));
    }
    *reinterpret_cast<R *>(J.db + e) = raw;
}

/* The barrier of group_sums: the whole block (__syncthreads), or with
 * rowbar only the blockDim.x threads of this thread's row, at named
 * barrier 1 + threadIdx.y (a block has at most 8 rows: LN_BLOCK / 32), so
 * a row's warps wait for each other and not for the block's other rows
 * (FG_LN_ROW_BARRIERS=1, an experiment: ncu put 7% of the stall samples
 * of the GPT-2-small forward and backward kernels behind the block
 * barrier). The sums and their order are the same either way. */
__device__ __forceinline__ void row_sync(bool rowbar)
{
    if (rowbar)
        asm volatile("bar.sync %0, %1;" ::"r"(1 + (int)threadIdx.y), "r"((int)blockDim.x)
                     : "memory");
    else
        __syncthreads();
}

/* N sums over the blockDim.x threads of one row (threadIdx.y picks the
 * row); every thread gets them, added in a fixed order. Barriers: every
 * thread of the block (rowbar: of the row) calls it. sh: 32 * N
 * entries. */
template <int N, typename A>
__device__ __forceinline__ void group_sums(A (&v)[N], A *sh, bool rowbar)
{
#pragma unroll
    for (int n = 0; n < N; n++)
        v[n] = warp_sum(v[n]);
    const int nw = blockDim.x >> 5;
    if (nw == 1)
        return;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    A *part = sh + threadIdx.y * nw * N;
    row_sync(rowbar); /* a previous call's readers are done */
    if (lane == 0)
#pragma unroll
        for (int n = 0; n < N; n++)
            part[w * N + n] = v[n];
    row_sync(rowbar);
#pragma unroll
    for (int n = 0; n < N; n++) {
        A t = part[n];
        for (int k = 1; k < nw; k++)
            t += part[k * N + n];
        v[n] = t;
    }
}

/* ---- register kernels (C <= ln_reg_max<A>()) ------------------------------ */

/* Elements per thread in compute type A: 16 (8 in fp64, whose backward
 * would spill) - x and g of a row plus the thread's dw / db sums. */
template <typename A> __host__ __device__ constexpr int ln_elems() { return sizeof(A) == 8 ? 8 : 16; }
template <typename A> constexpr int64_t ln_reg_max() { return (int64_t)LN_TPR_MAX * ln_elems<A>(); }

/* Thread x of a row owns elements (i * blockDim.x + x) * V + 0..V-1,
 * i < ln_elems<A>() / V; f(i, j) runs for each of its vectors inside the
 * row, j the vector's first column (i stays a compile-time index, so the
 * arrays it indexes stay in registers). */
template <int NV, int V, typename F>
__device__ __forceinline__ void for_own(int64_t C, F f)
{
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int64_t j = ((int64_t)i * blockDim.x + threadIdx.x) * V;
        if (j < C)
            f(i, j);
    }
}

/* The raw vector of the branch's 4 elements (JOIN only; a placeholder
 * otherwise, where 4 elements of y may have no vector type). */
template <bool JOIN, size_t N> struct JoinRaw { typedef int type; };
template <size_t N> struct JoinRaw<true, N> { typedef typename Bytes<N>::type type; };

/* Mean and variance in two passes over the registers. JOIN: the row is
 * x + dropout(J.b) (join_forward; V == 4). */
template <typename T, typename To, int V, bool JOIN = false>
__global__ void __launch_bounds__(LN_TPR_MAX)
ln_fwd_reg(const T *__restrict__ x, const T *__restrict__ w, int64_t ws,
           const T *__restrict__ b, int64_t bs, int64_t R, int64_t C,
           typename Num<T>::A eps, To *__restrict__ y,
           typename Num<T>::A *__restrict__ mean,
           typename Num<T>::A *__restrict__ rstd, LnJoin<T, To> J, bool rowbar)
{
    typedef typename Num<T>::A A;
    constexpr int NV = ln_elems<A>() / V;
    __shared__ A sh[32];
    const int64_t row = row_index();
    const bool live = row < R;
    const T *xr = x + (live ? row : 0) * C;
    /* every load first, branch-free (lanes past the row read its start
     * and zero it), then the arithmetic: as in ln_bwd_reg, one round trip
     * for the row instead of one per vector */
    typedef typename JoinRaw<JOIN, 4 * sizeof(To)>::type Rb;
    A v[NV][V], s[1] = {A(0)};
    Rb braw[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int64_t j = ((int64_t)i * blockDim.x + threadIdx.x) * V;
        const bool own = live && j < C;
        load_n<T, V>(xr + (own ? j : 0), v[i]);
        if constexpr (JOIN) {
            static_assert(V == 4, "one Philox group per vector");
            braw[i] = *reinterpret_cast<const Rb *>(J.b + (own ? row * C + j : 0));
        }
#pragma unroll
        for (int k = 0; k < V; k++)
            v[i][k] = own ? v[i][k] : A(0);
    }
#pragma unroll
    for (int i = 0; i < NV; i++) {
        if constexpr (JOIN) {
            const int64_t j = ((int64_t)i * blockDim.x + threadIdx.x) * V;
            if (live && j < C)
                join_forward(J, row * C + j, v[i], braw[i]);
        }
#pragma unroll
        for (int k = 0; k < V; k++)
            s[0] += v[i][k];
    }
    group_sums(s, sh, rowbar);
    const A mu = s[0] / (A)C;
    s[0] = A(0);
    for_own<NV, V>(C, [&](int i, int64_t) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A d = v[i][k] - mu;
            s[0] = d_fma(d, d, s[0]);
        }
    });
    group_sums(s, sh, rowbar);
    const A rs = A(1) / d_sqrt(s[0] / (A)C + eps);
    if (!live)
        return;
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    To *yr = y + row * C;
    for_own<NV, V>(C, [&](int i, int64_t j) {
        A wv[V], bv[V];
        load_par<T, V>(w, ws, j, A(1), wv);
        load_par<T, V>(b, bs, j, A(0), bv);
#pragma unroll
        for (int k = 0; k < V; k++)
            v[i][k] = d_fma((v[i][k] - mu) * rs, wv[k], bv[k]);
        store_n<To, V>(yr + j, v[i]);
    });
}

/* dx = rstd (wg - mean(wg) - xhat mean(wg xhat)), wg = g w, for the rows
 * blockIdx.x * blockDim.y + threadIdx.y + k * gridDim.x * blockDim.y; each
 * thread sums g xhat and g of its columns over its rows, the block's rows
 * are combined in a fixed order (smem: 2 C values when blockDim.y > 1) and
 * stored as partial row blockIdx.x of pw / pb ([gridDim.x, C]; NULL when
 * dw and db are not wanted). dx may be NULL. The thread's running sums
 * live in shared memory (ln_bwd_smem: slot s of thread t at s * threads +
 * t, private to the thread, so no barrier guards them), not registers:
 * in registers they took 32 of the kernel's 101 and held it to two
 * 256-thread blocks an SM, half the forward's loads in flight. JOIN:
 * the branch's gradient from the final dx too (join_backward; V == 4, dx
 * non-NULL). NVX: vectors per thread when fewer than ln_elems / V cover
 * the row (3 at C = 768 with 64 threads of 4: the registers a fourth
 * would hold let the accumulating backward load its old dx at once). */
template <typename T, typename Tg, int V, bool JOIN = false, int NVX = 0>
__global__ void __launch_bounds__(LN_TPR_MAX, JOIN || V > 1 ? 2 : 0)
ln_bwd_reg(const T *__restrict__ x, const T *__restrict__ w, int64_t ws,
           const typename Num<T>::A *__restrict__ mean,
           const typename Num<T>::A *__restrict__ rstd,
           const Tg *__restrict__ g, int64_t R, int64_t C,
           T *__restrict__ dx, bool dx_acc, typename Num<T>::A *__restrict__ pw,
           typename Num<T>::A *__restrict__ pb, LnJoin<T, Tg> J, bool rowbar)
{
    typedef typename Num<T>::A A;
    constexpr int NV = NVX ? NVX : ln_elems<A>() / V;
    /* the old dx of the accumulation loaded at once where registers allow
     * (ptxas: 64 a thread, no spill), else vector by vector */
    constexpr bool kOldAtOnce = NV * V <= 12;
    __shared__ A sh[64];
    extern __shared__ __align__(16) unsigned char ln_smem[];
    const int nthr = (int)(blockDim.x * blockDim.y),
              tid = (int)(threadIdx.y * blockDim.x + threadIdx.x);
    /* after the 2 C values of the row groups' combination */
    A *aw = reinterpret_cast<A *>(ln_smem) + (blockDim.y > 1 ? 2 * C : 0) + tid;
    A *ab = aw + NV * V * nthr;
    if (pw)
#pragma unroll
        for (int e = 0; e < NV * V; e++)
            aw[e * nthr] = ab[e * nthr] = A(0);
    const int64_t step = (int64_t)gridDim.x * blockDim.y;
    /* base is block-uniform: every thread makes the same trips (barriers) */
    for (int64_t base = (int64_t)blockIdx.x * blockDim.y; base < R;
         base += step) {
        const int64_t row = base + threadIdx.y;
        const bool live = row < R;
        const A mu = live ? mean[row] : A(0), rs = live ? rstd[row] : A(0);
        const T *xr = x + (live ? row : 0) * C;
        const Tg *gr = g + (live ? row : 0) * C;
        /* Every load of the row group first (x, g and the weight), then
         * the arithmetic. Loaded and used vector by vector, each vector's
         * loads sat behind a branch after the last one's math: one round
         * trip per vector (H200, 16384 x 768: 2.2 TB/s). Branch-free loads
         * (lanes past the row read its start and zero it) keep them in
         * flight together. */
        A xh[NV][V], wg[NV][V], s[2] = {A(0), A(0)};
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int64_t j = ((int64_t)i * blockDim.x + threadIdx.x) * V;
            const bool own = live && j < C;
            A wv[V];
            load_n<T, V>(xr + (own ? j : 0), xh[i]);
            load_n<Tg, V>(gr + (own ? j : 0), wg[i]);
            load_par<T, V>(w, ws, own ? j : 0, A(1), wv);
#pragma unroll
            for (int k = 0; k < V; k++) {
                xh[i][k] = own ? xh[i][k] : A(0);
                wg[i][k] = own ? wg[i][k] : A(0);
            }
            /* g's own sums (dw, db) now, then g w in its place: the only
             * form the rest needs */
            if (own) {
#pragma unroll
                for (int k = 0; k < V; k++) {
                    xh[i][k] = (xh[i][k] - mu) * rs;
                    const A gk = wg[i][k];
                    if (pw) {
                        const int e = (i * V + k) * nthr;
                        aw[e] = d_fma(gk, xh[i][k], aw[e]);
                        ab[e] += gk;
                    }
                    wg[i][k] = mul_rn(gk, wv[k]);
                    s[0] += wg[i][k];
                    s[1] = d_fma(wg[i][k], xh[i][k], s[1]);
                }
            }
        }
        group_sums(s, sh, rowbar);
        const A m1 = s[0] / (A)C, m2 = s[1] / (A)C;
        if (!live || !dx)
            continue;
        T *dr = dx + row * C;
        A old[kOldAtOnce ? NV : 1][V];
        if (kOldAtOnce && dx_acc)
#pragma unroll
            for (int i = 0; i < (kOldAtOnce ? NV : 1); i++) {
                const int64_t j = ((int64_t)i * blockDim.x + threadIdx.x) * V;
                load_n<T, V>(dr + (j < C ? j : 0), old[i]);
            }
        for_own<NV, V>(C, [&](int i, int64_t j) {
            A d[V];
            if (!kOldAtOnce && dx_acc)
                load_n<T, V>(dr + j, old[0]);
#pragma unroll
            for (int k = 0; k < V; k++) {
                d[k] = mul_rn(rs, d_fma(-xh[i][k], m2, wg[i][k] - m1));
                if (dx_acc) /* dx rounded, then the accumulation's add */
                    d[k] = add_rn(old[kOldAtOnce ? i : 0][k],
                                  Num<T>::ld(Num<T>::st(d[k])));
            }
            store_n<T, V>(dr + j, d);
            if constexpr (JOIN) {
                static_assert(V == 4, "one Philox group per vector");
                join_backward(J, row * C + j, d);
            }
        });
    }
    if (!pw)
        return;
    /* row groups into group 0, highest first: a fixed order */
    A *cw = reinterpret_cast<A *>(ln_smem), *cb = cw + C;
    for (int r = (int)blockDim.y - 1; r >= 1; r--) {
        const bool first = r == (int)blockDim.y - 1;
        if ((int)threadIdx.y == r)
            for_own<NV, V>(C, [&](int i, int64_t j) {
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const int e = (i * V + k) * nthr;
                    cw[j + k] = first ? aw[e] : cw[j + k] + aw[e];
                    cb[j + k] = first ? ab[e] : cb[j + k] + ab[e];
                }
            });
        __syncthreads();
    }
    if (threadIdx.y != 0)
        return;
    A *pwr = pw + (int64_t)blockIdx.x * C, *pbr = pb + (int64_t)blockIdx.x * C;
    const bool more = blockDim.y > 1;
    for_own<NV, V>(C, [&](int i, int64_t j) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int e = (i * V + k) * nthr;
            pwr[j + k] = more ? cw[j + k] + aw[e] : aw[e];
            pbr[j + k] = more ? cb[j + k] + ab[e] : ab[e];
        }
    });
}

/* ---- general kernels (any C; scalar loads) -------------------------------- */

/* Two passes for mean and variance (no cancellation), a third to write y;
 * the row stays in L1/L2 between passes. Launch: row_launch. */
template <typename T, typename To>
__global__ void ln_fwd_rows(const T *__restrict__ x, const T *__restrict__ w,
                            int64_t ws, const T *__restrict__ b, int64_t bs,
                            int64_t R, int64_t C, typename Num<T>::A eps,
                            To *__restrict__ y,
                            typename Num<T>::A *__restrict__ mean,
                            typename Num<T>::A *__restrict__ rstd)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * C;
    To *yr = y + row * C;
    A sum = A(0);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        sum += Num<T>::ld(xr[j]);
    const A mu = row_sum(sum) / (A)C;
    A sq = A(0);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        const A d = Num<T>::ld(xr[j]) - mu;
        sq = d_fma(d, d, sq);
    }
    const A rs = A(1) / d_sqrt(row_sum(sq) / (A)C + eps);
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        A wv, bv;
        load_par<T, 1>(w, ws, j, A(1), &wv);
        load_par<T, 1>(b, bs, j, A(0), &bv);
        yr[j] = to_s<To>(d_fma((Num<T>::ld(xr[j]) - mu) * rs, wv, bv));
    }
}

template <typename T, typename Tg>
__global__ void ln_bwd_dx_rows(const T *__restrict__ x,
                               const T *__restrict__ w, int64_t ws,
                               const typename Num<T>::A *__restrict__ mean,
                               const typename Num<T>::A *__restrict__ rstd,
                               const Tg *__restrict__ g, int64_t R, int64_t C,
                               T *__restrict__ dx, bool dx_acc)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * C;
    const Tg *gr = g + row * C;
    const A mu = mean[row], rs = rstd[row];
    A s1 = A(0), s2 = A(0);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        A wv;
        load_par<T, 1>(w, ws, j, A(1), &wv);
        const A xh = (Num<T>::ld(xr[j]) - mu) * rs;
        const A wg = mul_rn((A)Num<Tg>::ld(gr[j]), wv);
        s1 += wg;
        s2 = d_fma(wg, xh, s2);
    }
    const A m1 = row_sum(s1) / (A)C, m2 = row_sum(s2) / (A)C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        A wv;
        load_par<T, 1>(w, ws, j, A(1), &wv);
        const A xh = (Num<T>::ld(xr[j]) - mu) * rs;
        const A wg = mul_rn((A)Num<Tg>::ld(gr[j]), wv);
        A d = mul_rn(rs, d_fma(-xh, m2, wg - m1));
        if (dx_acc) /* dx rounded, then the accumulation's add */
            d = add_rn(Num<T>::ld(dx[row * C + j]), Num<T>::ld(Num<T>::st(d)));
        dx[row * C + j] = Num<T>::st(d);
    }
}

/* Sums a and b over the Y row lanes (threadIdx.y) of each column
 * (threadIdx.x, 32 of them) in lane order; lane 0 gets the totals. */
template <int Y, typename P>
__device__ __forceinline__ void lanes_sum(P &a, P &b)
{
    __shared__ P sa[Y][32], sb[Y][32];
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0) {
        P ta = P(0), tb = P(0);
#pragma unroll
        for (int k = 0; k < Y; k++) {
            ta += sa[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
        }
        a = ta;
        b = tb;
    }
}

/* dw / db partials of the general path: block (32 columns) x (LN_COL_Y row
 * lanes) sums a chunk of rows of its columns, lanes combined in order; one
 * partial per (chunk, column). */
#define LN_COL_Y 8

template <typename T, typename Tg>
__global__ void ln_bwd_cols(const T *__restrict__ x,
                            const typename Num<T>::A *__restrict__ mean,
                            const typename Num<T>::A *__restrict__ rstd,
                            const Tg *__restrict__ g, int64_t R, int64_t C,
                            int64_t rows_per_chunk,
                            typename Num<T>::A *__restrict__ pw,
                            typename Num<T>::A *__restrict__ pb)
{
    typedef typename Num<T>::A A;
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    A aw = A(0), ab = A(0);
    if (col < C) {
        for (int64_t r = r0 + threadIdx.y; r < r1; r += LN_COL_Y) {
            const A gv = (A)Num<Tg>::ld(g[r * C + col]);
            const A xh = (Num<T>::ld(x[r * C + col]) - mean[r]) * rstd[r];
            aw = d_fma(gv, xh, aw);
            ab += gv;
        }
    }
    lanes_sum<LN_COL_Y>(aw, ab);
    if (threadIdx.y == 0 && col < C) {
        pw[(int64_t)blockIdx.y * C + col] = aw;
        pb[(int64_t)blockIdx.y * C + col] = ab;
    }
}

/* dw, db = the n partial rows [n, C] summed per column in fp64, one
 * rounding to T: block (32 columns) x (LN_SUM_Y lanes), lane l summing
 * rows l, l + LN_SUM_Y, ... in order, then the lanes in order (many
 * short chains: a column's few hundred dependent loads in one thread
 * would take longer than the backward itself). Either output may be
 * NULL. With acc the sums are added to dw / db (in T, as
 * fg_grad_accumulate adds the rounded sums). */
#define LN_SUM_Y 32

/* *d = t rounded to T, or *d += that (the rounded sum added in T's
 * compute type, as fg_grad_accumulate adds). */
template <typename T>
__device__ __forceinline__ void ln_put(T *d, double t, bool acc)
{
    const T r = Num<T>::st_d(t);
    *d = acc ? Num<T>::st(Num<T>::ld(*d) + Num<T>::ld(r)) : r;
}

template <typename T, typename P>
__global__ void ln_partials_sum(const P *__restrict__ pw,
                                const P *__restrict__ pb, int64_t n,
                                int64_t C, T *__restrict__ dw,
                                T *__restrict__ db, bool acc)
{
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double tw = 0.0, tb = 0.0;
    if (col < C)
        for (int64_t k = threadIdx.y; k < n; k += LN_SUM_Y) {
            tw += (double)pw[k * C + col];
            tb += (double)pb[k * C + col];
        }
    lanes_sum<LN_SUM_Y>(tw, tb);
    if (threadIdx.y != 0 || col >= C)
        return;
    if (dw)
        ln_put(dw + col, tw, acc);
    if (db)
        ln_put(db + col, tb, acc);
}

/* ---- host side ------------------------------------------------------------ */

/* s = the status of the launch just made (the caller still frees its
 * scratch). */
#define LN_LAUNCHED(s, what)                                                \
    do {                                                                    \
        const cudaError_t e_ = cudaGetLastError();                          \
        if (e_ != cudaSuccess)                                              \
            (s) = fg_cuda_status(e_, what, __FILE__, __LINE__);             \
    } while (0)

/* FG_LN_ROW_BARRIERS=1: the register kernels' rows meet at barriers of
 * their own (row_sync), read once per process. */
inline bool ln_row_barriers()
{
    static const bool on = [] {
        const char *v = getenv("FG_LN_ROW_BARRIERS");
        return v && v[0] == '1' && !v[1];
    }();
    return on;
}

/* Shape of the register kernels for rows of C: threads per row (a power of
 * two, 32 .. LN_TPR_MAX, C <= tpr * e, e elements per thread) and rows
 * per block. */
struct LnShape {
    int tpr, rpb;
};

inline LnShape ln_shape(int64_t C, int e)
{
    int tpr = 32;
    while ((int64_t)tpr * e < C)
        tpr *= 2;
    return {tpr, tpr >= LN_BLOCK ? 1 : LN_BLOCK / tpr};
}

inline bool par_vec_ok(const void *p, int64_t s)
{
    return !p || s != 1 || aligned16(p);
}

template <typename T, typename To = T>
fg_status ln_fwd_t(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                   double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd)
{
    typedef typename Num<T>::A A;
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    const T *xp = dptr<T>(x), *wp = dptr<T>(w), *bp = dptr<T>(b);
    const int64_t ws = w ? w->stride[0] : 0, bs = b ? b->stride[0] : 0;
    To *yp = dptr<To>(y);
    A *mp = dptr<A>(mean), *rp = dptr<A>(rstd);
    cudaStream_t st = fg_cuda_stream();
    if (C > ln_reg_max<A>()) {
        RowLaunch L;
        FG_TRY(row_launch(R, C, "fg_layernorm", &L));
        ln_fwd_rows<T, To><<<L.grid, L.block, 0, st>>>(xp, wp, ws, bp, bs, R,
                                                       C, (A)eps, yp, mp, rp);
        FG_CUDA_TRY_LAUNCH();
        return FG_OK;
    }
    const LnShape S = ln_shape(C, ln_elems<A>());
    const int64_t grid = (R + S.rpb - 1) / S.rpb;
    if (grid > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "fg_layernorm: too many rows (%lld)", (long long)R);
    const dim3 block((unsigned)S.tpr, (unsigned)S.rpb);
    constexpr int VW = vec_width<T>();
    if (C % VW == 0 && aligned16(xp) && aligned16(yp) && par_vec_ok(wp, ws) &&
        par_vec_ok(bp, bs))
        ln_fwd_reg<T, To, VW><<<(unsigned)grid, block, 0, st>>>(
            xp, wp, ws, bp, bs, R, C, (A)eps, yp, mp, rp, LnJoin<T, To>{},
            ln_row_barriers());
    else
        ln_fwd_reg<T, To, 1><<<(unsigned)grid, block, 0, st>>>(
            xp, wp, ws, bp, bs, R, C, (A)eps, yp, mp, rp, LnJoin<T, To>{},
            ln_row_barriers());
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* Blocks of the fused backward: one full wave of resident blocks (no
 * tail), fewer when there are fewer row groups. The wave is cached per
 * kernel (cache), keyed by device, block size and shared memory: the
 * occupancy query costs more host time than the launch. */
template <typename K>
fg_status ln_bwd_grid(K kernel, int threads, size_t smem, int64_t groups,
                      std::atomic<unsigned long long> &cache, int *grid)
{
    int dev = 0;
    FG_CUDA_TRY(cudaGetDevice(&dev));
    /* dev < 256, threads < 2^16, smem < 2^24: 48 bits, the wave in 16 */
    const unsigned long long key = ((unsigned long long)dev << 40) |
                                   ((unsigned long long)threads << 24) |
                                   (unsigned long long)smem;
    unsigned long long c = cache.load(std::memory_order_relaxed);
    if (!c || (c >> 16) != key) {
        int sms = 0, per_sm = 0;
        FG_CUDA_TRY(cudaDeviceGetAttribute(
            &sms, cudaDevAttrMultiProcessorCount, dev));
        FG_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, kernel, threads, smem));
        long long wave = (long long)sms * (per_sm > 0 ? per_sm : 1);
        c = (key << 16) | (unsigned long long)(wave < 0xffff ? wave : 0xffff);
        if (dev < 256)
            cache.store(c, std::memory_order_relaxed);
    }
    const int64_t wave = (int64_t)(c & 0xffff);
    *grid = (int)(wave < groups ? wave : groups);
    return FG_OK;
}

/* ln_bwd_reg's dynamic shared memory: the row groups' combination (2 C
 * values when a block has several rows) and every thread's running sums
 * (2 e each, e its elements), when dw or db is wanted. */
inline size_t ln_bwd_smem(size_t asize, const LnShape &S, int64_t C, int e,
                          bool cols)
{
    if (!cols)
        return 0;
    const size_t comb = S.rpb > 1 ? 2 * (size_t)C : 0;
    return asize * (comb + 2 * (size_t)e * (size_t)(S.tpr * S.rpb));
}

/* Lets kernel take smem bytes of dynamic shared memory (over 48 KB with
 * the static sh[64] needs the opt-in: a 512-thread row's sums take 48 KB
 * with three vectors a thread, 64 KB with four). */
template <typename K>
fg_status ln_bwd_smem_allow(K kernel, size_t smem)
{
    if (smem + 64 * sizeof(double) <= 48 * 1024)
        return FG_OK;
    FG_CUDA_TRY(cudaFuncSetAttribute(kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
    return FG_OK;
}

/* Runs fill(pw, pb), the kernel writing n partial rows [n, C] of dw / db
 * into scratch (NULL, NULL when neither is wanted), then sums them into
 * dw / db (added to them with acc); frees the scratch. */
template <typename T, typename F>
fg_status ln_with_partials(int64_t n, int64_t C, fg_tensor *dw, fg_tensor *db,
                           bool acc, F fill)
{
    typedef typename Num<T>::A A;
    const bool cols = dw || db;
    const size_t bytes = cols ? sizeof(A) * (size_t)n * (size_t)C : 0;
    A *pw = nullptr, *pb = nullptr;
    fg_status s = FG_OK;
    if (cols) {
        s = fg_cuda_mem_alloc(bytes, (void **)&pw);
        if (s == FG_OK)
            s = fg_cuda_mem_alloc(bytes, (void **)&pb);
    }
    if (s == FG_OK)
        s = fill(pw, pb);
    if (s == FG_OK && cols) { /* (C + 31) / 32 < 2^31: the callers checked */
        ln_partials_sum<T, A>
            <<<(unsigned)((C + 31) / 32), dim3(32, LN_SUM_Y), 0,
               fg_cuda_stream()>>>(pw, pb, n, C, dptr<T>(dw), dptr<T>(db),
                                   acc);
        LN_LAUNCHED(s, "ln_partials_sum launch");
    }
    scratch_free(pw, bytes);
    scratch_free(pb, bytes);
    return s;
}

template <typename T, typename Tg, int V, bool JOIN, int NVX>
fg_status ln_bwd_reg_run(const T *xp, const T *wp, int64_t ws,
                         const typename Num<T>::A *mp,
                         const typename Num<T>::A *rp, const Tg *gp, int64_t R,
                         int64_t C, T *dp, bool dx_acc, fg_tensor *dw,
                         fg_tensor *db, bool cols_acc, LnJoin<T, Tg> J)
{
    typedef typename Num<T>::A A;
    const LnShape S = ln_shape(C, ln_elems<A>());
    const int e = NVX ? NVX * V : ln_elems<A>();
    const size_t smem = ln_bwd_smem(sizeof(A), S, C, e, dw || db);
    auto kernel = ln_bwd_reg<T, Tg, V, JOIN, NVX>;
    auto same = ln_bwd_reg<T, T, V, false, NVX>;
    FG_TRY(ln_bwd_smem_allow(kernel, smem));
    FG_TRY(ln_bwd_smem_allow(same, smem));
    /* The wave of the same-dtype kernel, so that a narrow g gives the same
     * partial rows (and so the same dw / db bits) as that g widened. */
    static std::atomic<unsigned long long> wave_cache{0};
    int grid = 0;
    FG_TRY(ln_bwd_grid(same, S.tpr * S.rpb, smem, (R + S.rpb - 1) / S.rpb,
                       wave_cache, &grid));
    return ln_with_partials<T>(grid, C, dw, db, cols_acc, [&](A *pw, A *pb) {
        fg_status s = FG_OK;
        kernel<<<grid, dim3((unsigned)S.tpr, (unsigned)S.rpb), smem,
                 fg_cuda_stream()>>>(xp, wp, ws, mp, rp, gp, R, C, dp, dx_acc, pw,
                                     pb, J, ln_row_barriers());
        LN_LAUNCHED(s, "ln_bwd_reg launch");
        return s;
    });
}

/* The register backward, with three vectors a thread where four are the
 * default and three cover the row (C = 384, 768, 1536, 3072 in fp32):
 * the same threads own the same elements and do the same arithmetic in
 * the same order, so the bits do not change. */
template <typename T, typename Tg, int V, bool JOIN = false>
fg_status ln_bwd_reg_launch(const T *xp, const T *wp, int64_t ws,
                            const typename Num<T>::A *mp,
                            const typename Num<T>::A *rp, const Tg *gp,
                            int64_t R, int64_t C, T *dp, bool dx_acc,
                            fg_tensor *dw, fg_tensor *db, bool cols_acc,
                            LnJoin<T, Tg> J = LnJoin<T, Tg>{})
{
    typedef typename Num<T>::A A;
    if constexpr (ln_elems<A>() / V == 4) {
        const LnShape S = ln_shape(C, ln_elems<A>());
        if ((int64_t)S.tpr * V * 3 >= C)
            return ln_bwd_reg_run<T, Tg, V, JOIN, 3>(
                xp, wp, ws, mp, rp, gp, R, C, dp, dx_acc, dw, db, cols_acc, J);
    }
    return ln_bwd_reg_run<T, Tg, V, JOIN, 0>(xp, wp, ws, mp, rp, gp, R, C, dp,
                                             dx_acc, dw, db, cols_acc, J);
}

/* The general backward: dx by rows, dw / db by column chunks. */
template <typename T, typename Tg>
fg_status ln_bwd_general(const T *xp, const T *wp, int64_t ws,
                         const typename Num<T>::A *mp,
                         const typename Num<T>::A *rp, const Tg *gp, int64_t R,
                         int64_t C, T *dp, bool dx_acc, fg_tensor *dw,
                         fg_tensor *db, bool cols_acc)
{
    typedef typename Num<T>::A A;
    cudaStream_t st = fg_cuda_stream();
    if (dp) {
        RowLaunch L;
        FG_TRY(row_launch(R, C, "layernorm backward", &L));
        ln_bwd_dx_rows<T, Tg><<<L.grid, L.block, 0, st>>>(xp, wp, ws, mp, rp,
                                                          gp, R, C, dp, dx_acc);
        FG_CUDA_TRY_LAUNCH();
    }
    if (!dw && !db)
        return FG_OK;
    const int64_t gx = (C + 31) / 32;
    if (gx > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "layernorm backward: too many columns (%lld)",
                        (long long)C);
    /* Chunks of >= 128 rows, at most 1024 of them (gridDim.y <= 65535). */
    int64_t rpc = 128;
    if (R > rpc * 1024)
        rpc = (R + 1023) / 1024;
    const int64_t nchunks = (R + rpc - 1) / rpc;
    return ln_with_partials<T>(nchunks, C, dw, db, cols_acc,
                               [&](A *pw, A *pb) {
        fg_status s = FG_OK;
        ln_bwd_cols<T, Tg><<<dim3((unsigned)gx, (unsigned)nchunks),
                             dim3(32, LN_COL_Y), 0, st>>>(xp, mp, rp, gp, R, C,
                                                          rpc, pw, pb);
        LN_LAUNCHED(s, "ln_bwd_cols launch");
        return s;
    });
}

template <typename T, typename Tg = T>
fg_status ln_bwd_t(const fg_tensor *x, const fg_tensor *w,
                   const fg_tensor *mean, const fg_tensor *rstd,
                   const fg_tensor *g, fg_tensor *dx, bool dx_acc,
                   fg_tensor *dw, fg_tensor *db, bool cols_acc)
{
    typedef typename Num<T>::A A;
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    const T *xp = dptr<T>(x), *wp = dptr<T>(w);
    const Tg *gp = dptr<Tg>(g);
    const int64_t ws = w ? w->stride[0] : 0;
    T *dp = dptr<T>(dx);
    const A *mp = dptr<A>(mean), *rp = dptr<A>(rstd);
    if (!dp && !dw && !db)
        return FG_OK;
    if (C > ln_reg_max<A>())
        return ln_bwd_general<T, Tg>(xp, wp, ws, mp, rp, gp, R, C, dp, dx_acc,
                                     dw, db, cols_acc);
    constexpr int VW = vec_width<T>();
    if (C % VW == 0 && aligned16(xp) && aligned16(gp) &&
        (!dp || aligned16(dp)) && par_vec_ok(wp, ws))
        return ln_bwd_reg_launch<T, Tg, VW>(xp, wp, ws, mp, rp, gp, R, C, dp,
                                            dx_acc, dw, db, cols_acc);
    return ln_bwd_reg_launch<T, Tg, 1>(xp, wp, ws, mp, rp, gp, R, C, dp,
                                       dx_acc, dw, db, cols_acc);
}

/* ---- fg_dropout_add_layernorm: the join kernels ---------------------------- */

/* Where the join kernels apply: an fp32 stream, rows of C % 4 == 0 within
 * the register kernels, 16-byte aligned operands (vectors of 4 elements,
 * one Philox group each). Elsewhere the caller runs the two ops' kernels. */
inline bool join_ok(int64_t R, int64_t C, const void *const *ptrs, int n)
{
    if (R <= 0 || C <= 0 || C % 4 != 0 || C > ln_reg_max<float>())
        return false;
    for (int i = 0; i < n; i++)
        if (!aligned16(ptrs[i]))
            return false;
    return true;
}

template <typename Tv>
LnJoin<float, Tv> make_join(double p, uint64_t seed, uint64_t offset)
{
    LnJoin<float, Tv> J{};
    J.key = make_uint2((uint32_t)seed,
                       (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32));
    J.off_lo = (uint32_t)offset;
    J.thr = fg_dropout_threshold(p);
    J.scale = 1.0 / (1.0 - p);
    return J;
}

template <typename Tv>
fg_status join_fwd_t(const fg_tensor *x, const fg_tensor *b, double p,
                     uint64_t seed, uint64_t offset, const fg_tensor *w,
                     const fg_tensor *bias, double eps, fg_tensor *y,
                     fg_tensor *h, fg_tensor *mean, fg_tensor *rstd)
{
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    const LnShape S = ln_shape(C, ln_elems<float>());
    const int64_t grid = (R + S.rpb - 1) / S.rpb;
    if (grid > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "fg_dropout_add_layernorm: too many rows (%lld)",
                        (long long)R);
    LnJoin<float, Tv> J = make_join<Tv>(p, seed, offset);
    J.b = dptr<Tv>(b);
    J.xo = dptr<float>(y);
    const int64_t ws = w ? w->stride[0] : 0, bs = bias ? bias->stride[0] : 0;
    ln_fwd_reg<float, Tv, 4, true>
        <<<(unsigned)grid, dim3((unsigned)S.tpr, (unsigned)S.rpb), 0,
           fg_cuda_stream()>>>(dptr<float>(x), dptr<float>(w), ws,
                               dptr<float>(bias), bs, R, C, (float)eps,
                               dptr<Tv>(h), dptr<float>(mean),
                               dptr<float>(rstd), J, ln_row_barriers());
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename Tv>
fg_status join_bwd_t(const fg_tensor *y, const fg_tensor *w,
                     const fg_tensor *mean, const fg_tensor *rstd,
                     const fg_tensor *gh, fg_tensor *dx, bool dx_acc,
                     fg_tensor *db, double p, uint64_t seed, uint64_t offset,
                     fg_tensor *dw, fg_tensor *dbias, bool cols_acc)
{
    const int64_t C = y->shape[y->nd - 1], R = y->numel / C;
    LnJoin<float, Tv> J = make_join<Tv>(p, seed, offset);
    J.db = dptr<Tv>(db);
    return ln_bwd_reg_launch<float, Tv, 4, true>(
        dptr<float>(y), dptr<float>(w), w ? w->stride[0] : 0,
        dptr<float>(mean), dptr<float>(rstd), dptr<Tv>(gh), R, C,
        dptr<float>(dx), dx_acc, dw, dbias, cols_acc, J);
}

/* Calls F<T, Ty>(args...) for x's storage type T and y's Ty: equal, or
 * fp16/bf16 for fp32, or fp32 for fp64. */
#define LN_BY_DTYPES(xdt, ydt, fn, F, ...)                                  \
    do {                                                                    \
        if ((xdt) == (ydt)) {                                               \
            NN_BY_DTYPE(xdt, fn, F, __VA_ARGS__);                           \
        }                                                                   \
        if ((xdt) == FG_FP32 && (ydt) == FG_BF16)                           \
            return F<float, __nv_bfloat16>(__VA_ARGS__);                    \
        if ((xdt) == FG_FP32 && (ydt) == FG_FP16)                           \
            return F<float, __half>(__VA_ARGS__);                           \
        if ((xdt) == FG_FP64 && (ydt) == FG_FP32)                           \
            return F<double, float>(__VA_ARGS__);                           \
        return fg_error(FG_ERR_UNSUPPORTED,                                 \
                        "%s: %s output of %s input is not supported", fn,   \
                        fg_dtype_name(ydt), fg_dtype_name(xdt));            \
    } while (0)

} /* namespace */

/* ---- entry points --------------------------------------------------------- */

extern "C" fg_status fg_cuda_layernorm_forward(const fg_tensor *x,
                                               const fg_tensor *weight,
                                               const fg_tensor *bias,
                                               double eps, fg_tensor *y,
                                               fg_tensor *mean, fg_tensor *rstd)
{
    if (x->numel == 0)
        return FG_OK;
    LN_BY_DTYPES(x->dtype, y->dtype, "fg_layernorm", ln_fwd_t, x, weight,
                 bias, eps, y, mean, rstd);
}

extern "C" fg_status fg_cuda_layernorm_backward(
    const fg_tensor *x, const fg_tensor *weight, const fg_tensor *mean,
    const fg_tensor *rstd, const fg_tensor *g, fg_tensor *dx, int acc,
    fg_tensor *dw, fg_tensor *db)
{
    const int64_t C = x->shape[x->nd - 1];
    const bool cols_acc = (acc & FG_LN_ACC_COLS) != 0;
    if (C == 0 || (x->numel == 0 && cols_acc)) /* nothing to add */
        return FG_OK;
    if (x->numel == 0) { /* no rows: the column sums are 0 */
        const size_t bytes = (size_t)C * fg_esize(x->dtype);
        if (dw)
            FG_TRY(fg_cuda_memset_zero(fg_tensor_base(dw), bytes));
        if (db)
            FG_TRY(fg_cuda_memset_zero(fg_tensor_base(db), bytes));
        return FG_OK;
    }
    LN_BY_DTYPES(x->dtype, g->dtype, "layernorm backward", ln_bwd_t, x,
                 weight, mean, rstd, g, dx, dx && (acc & FG_LN_ACC_DX), dw, db,
                 cols_acc);
}

extern "C" fg_status fg_cuda_dropout_add_layernorm_forward(
    const fg_tensor *x, const fg_tensor *b, double p, uint64_t seed,
    uint64_t offset, const fg_tensor *weight, const fg_tensor *bias,
    double eps, fg_tensor *y, fg_tensor *h, fg_tensor *mean, fg_tensor *rstd,
    int *done)
{
    *done = 0;
    const int64_t C = x->nd ? x->shape[x->nd - 1] : 0;
    const void *ptrs[4] = {fg_tensor_base(x), fg_tensor_base(b),
                           fg_tensor_base(y), fg_tensor_base(h)};
    if (x->dtype != FG_FP32 || b->dtype != h->dtype ||
        !join_ok(C ? x->numel / C : 0, C, ptrs, 4) ||
        !par_vec_ok(weight ? fg_tensor_base(weight) : nullptr,
                    weight ? weight->stride[0] : 0) ||
        !par_vec_ok(bias ? fg_tensor_base(bias) : nullptr,
                    bias ? bias->stride[0] : 0))
        return FG_OK;
    fg_status s = FG_OK;
    if (b->dtype == FG_BF16)
        s = join_fwd_t<__nv_bfloat16>(x, b, p, seed, offset, weight, bias,
                                      eps, y, h, mean, rstd);
    else if (b->dtype == FG_FP16)
        s = join_fwd_t<__half>(x, b, p, seed, offset, weight, bias, eps, y, h,
                               mean, rstd);
    else
        return FG_OK;
    if (s == FG_OK)
        *done = 1;
    return s;
}

extern "C" fg_status fg_cuda_dropout_add_layernorm_backward(
    const fg_tensor *y, const fg_tensor *weight, const fg_tensor *mean,
    const fg_tensor *rstd, const fg_tensor *gh, fg_tensor *dx, int acc,
    fg_tensor *db, double p, uint64_t seed, uint64_t offset, fg_tensor *dw,
    fg_tensor *dbias, int *done)
{
    const bool dx_acc = (acc & FG_LN_ACC_DX) != 0,
               cols_acc = (acc & FG_LN_ACC_COLS) != 0;
    *done = 0;
    const int64_t C = y->nd ? y->shape[y->nd - 1] : 0;
    const void *ptrs[4] = {fg_tensor_base(y), fg_tensor_base(gh),
                           fg_tensor_base(dx), fg_tensor_base(db)};
    if (y->dtype != FG_FP32 || gh->dtype != db->dtype ||
        !join_ok(C ? y->numel / C : 0, C, ptrs, 4) ||
        !par_vec_ok(weight ? fg_tensor_base(weight) : nullptr,
                    weight ? weight->stride[0] : 0))
        return FG_OK;
    fg_status s = FG_OK;
    if (gh->dtype == FG_BF16)
        s = join_bwd_t<__nv_bfloat16>(y, weight, mean, rstd, gh, dx, dx_acc,
                                      db, p, seed, offset, dw, dbias,
                                      cols_acc);
    else if (gh->dtype == FG_FP16)
        s = join_bwd_t<__half>(y, weight, mean, rstd, gh, dx, dx_acc, db, p,
                               seed, offset, dw, dbias, cols_acc);
    else
        return FG_OK;
    if (s == FG_OK)
        *done = 1;
    return s;
}
