/* SPDX-License-Identifier: MIT */
/* kernels/ops/layernorm_reg.cuh - the layernorm's register kernels and their
 * pieces (ops_layernorm.cu holds the launches and entry points): rows of up
 * to ln_reg_max<A>() elements (8192; 4096 in fp64) live in registers,
 * ln_elems<A>() per thread, with 16-byte loads where alignment allows; the
 * forward reads x once; the backward reads x and g once, writes dx and
 * accumulates its rows' dweight / dbias, one partial row per block, which
 * ln_partials_sum (layernorm_general.cuh) sums in a fixed order.
 * fg_dropout_add_layernorm's kernels are these with a residual join
 * (LnJoin). Included by ops_layernorm.cu alone (anonymous namespace). */
#ifndef FG_KERNELS_OPS_LAYERNORM_REG_CUH
#define FG_KERNELS_OPS_LAYERNORM_REG_CUH

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
    int64_t ldy; /* forward: y's row pitch, 0 for C; C + 8 writes each
                    row's ones column (1 then 7 zeros: FG_ONES_PAD) */
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

/* N sums over the blockDim.x threads of one row (threadIdx.y picks the
 * row); every thread gets them, added in a fixed order. Barriers: every
 * thread of the block calls it. sh: 32 * N entries. */
template <int N, typename A>
__device__ __forceinline__ void group_sums(A (&v)[N], A *sh)
{
#pragma unroll
    for (int n = 0; n < N; n++)
        v[n] = warp_sum(v[n]);
    const int nw = blockDim.x >> 5;
    if (nw == 1)
        return;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    A *part = sh + threadIdx.y * nw * N;
    __syncthreads(); /* a previous call's readers are done */
    if (lane == 0)
#pragma unroll
        for (int n = 0; n < N; n++)
            part[w * N + n] = v[n];
    __syncthreads();
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
           typename Num<T>::A *__restrict__ rstd, LnJoin<T, To> J)
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
    group_sums(s, sh);
    const A mu = s[0] / (A)C;
    s[0] = A(0);
    for_own<NV, V>(C, [&](int i, int64_t) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A d = v[i][k] - mu;
            s[0] = d_fma(d, d, s[0]);
        }
    });
    group_sums(s, sh);
    const A rs = A(1) / d_sqrt(s[0] / (A)C + eps);
    if (!live)
        return;
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    const int64_t ldy = JOIN && J.ldy ? J.ldy : C;
    To *yr = y + row * ldy;
    for_own<NV, V>(C, [&](int i, int64_t j) {
        A wv[V], bv[V];
        load_par<T, V>(w, ws, j, A(1), wv);
        load_par<T, V>(b, bs, j, A(0), bv);
#pragma unroll
        for (int k = 0; k < V; k++)
            v[i][k] = d_fma((v[i][k] - mu) * rs, wv[k], bv[k]);
        store_n<To, V>(yr + j, v[i]);
    });
    if constexpr (JOIN) {
        if (ldy == C + 8 && threadIdx.x == 0) {
            const A one[4] = {A(1), A(0), A(0), A(0)}, zero[4] = {};
            store_n<To, 4>(yr + C, one);
            store_n<To, 4>(yr + C + 4, zero);
        }
    }
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
           typename Num<T>::A *__restrict__ pb, LnJoin<T, Tg> J)
{
    typedef typename Num<T>::A A;
    constexpr int NV = NVX ? NVX : ln_elems<A>() / V;
    /* the old dx of the accumulation loaded at once where registers allow
     * (ptxas: 64 a thread, no spill), else vector by vector */
    constexpr bool kOldAtOnce = NV * V <= 12;
    /* and with x and g, before the sums, in the fp32 join kernels
     * (training's: 64 registers, no spill; in fp64 all three spill 64-88
     * bytes, the plain fp32 kernels 16 bytes on sm_80) */
    constexpr bool kOldEarly = kOldAtOnce && JOIN && sizeof(A) == 4;
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
        /* the accumulation's old dx with them (kOldEarly): its loads in
         * flight with x's and g's, not a second round trip after the sums */
        A old[kOldAtOnce ? NV : 1][V];
        if (kOldEarly && dx_acc && dx) {
            const T *dl = dx + (live ? row : 0) * C;
#pragma unroll
            for (int i = 0; i < (kOldAtOnce ? NV : 1); i++) {
                const int64_t j = ((int64_t)i * blockDim.x + threadIdx.x) * V;
                load_n<T, V>(dl + (live && j < C ? j : 0), old[i]);
            }
        }
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
        group_sums(s, sh);
        const A m1 = s[0] / (A)C, m2 = s[1] / (A)C;
        if (!live || !dx)
            continue;
        T *dr = dx + row * C;
        if (kOldAtOnce && !kOldEarly && dx_acc)
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

} // namespace

#endif /* FG_KERNELS_OPS_LAYERNORM_REG_CUH */
