/* kernels/ops_nn.cu - CUDA kernels of the nn ops (entry points declared in
 * lib/cuda_ops_nn.h): softmax / log_softmax, softmax-cross-entropy,
 * layernorm, embedding, dropout.
 *
 * Row kernels (softmax over the last dim, cross-entropy, layernorm) give a
 * row to one warp (rows <= 2048 long, 4 rows per block) or to a whole
 * block (longer rows, blockDim.y == 1), reduce with warp shuffles (xor
 * butterflies, so every lane ends with the bit-identical value) and, for
 * blocks, one shared-memory step. Contiguous rows whose length and base
 * pointers allow it are read and written with 16-byte vectors. Reduction
 * orders depend only on the shapes: results are deterministic.
 * fp64 computes in fp64; fp32, fp16 and bf16 in fp32 (stores round to
 * nearest even). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <curand_kernel.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "cuda_ops_nn.h"
#include "flashgrad/attention.h" /* fg_dropout_threshold */

namespace {

/* ---- element types ------------------------------------------------------ */

/* A: the compute type; ld/st convert storage <-> compute, st_d stores a
 * double with a single rounding. */
template <typename T> struct Num;
template <> struct Num<double> {
    typedef double A;
    static __device__ __forceinline__ double ld(double v) { return v; }
    static __device__ __forceinline__ double st(double v) { return v; }
    static __device__ __forceinline__ double st_d(double v) { return v; }
};
template <> struct Num<float> {
    typedef float A;
    static __device__ __forceinline__ float ld(float v) { return v; }
    static __device__ __forceinline__ float st(float v) { return v; }
    static __device__ __forceinline__ float st_d(double v) { return (float)v; }
};
template <> struct Num<__half> {
    typedef float A;
    static __device__ __forceinline__ float ld(__half v) { return __half2float(v); }
    static __device__ __forceinline__ __half st(float v) { return __float2half_rn(v); }
    static __device__ __forceinline__ __half st_d(double v) { return __double2half(v); }
};
template <> struct Num<__nv_bfloat16> {
    typedef float A;
    static __device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ __nv_bfloat16 st(float v) { return __float2bfloat16_rn(v); }
    static __device__ __forceinline__ __nv_bfloat16 st_d(double v) { return __double2bfloat16(v); }
};

/* Accurate (not fast-math) exp/log/sqrt for both compute types: fp32
 * results must stay within 1e-5 of the CPU's fp64 computation. */
__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_log(float x) { return logf(x); }
__device__ __forceinline__ double d_log(double x) { return log(x); }
__device__ __forceinline__ float d_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double d_sqrt(double x) { return sqrt(x); }

/* A product rounded on its own (never fused into a following add). */
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

template <typename A> __device__ __forceinline__ A neg_inf() { return (A)(-INFINITY); }

/* A 0-dim scalar of any dtype (the loss gradient), read on the device. */
__device__ __forceinline__ double load_scalar(const void *p, int dt)
{
    switch (dt) {
    case FG_FP64: return *(const double *)p;
    case FG_FP32: return *(const float *)p;
    case FG_FP16: return __half2float(*(const __half *)p);
    default: return __bfloat162float(*(const __nv_bfloat16 *)p);
    }
}

/* V consecutive elements at p (16-byte aligned when V > 1) to compute type. */
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T *p, typename Num<T>::A *out)
{
    if constexpr (V == 1) {
        out[0] = Num<T>::ld(p[0]);
    } else {
        static_assert(sizeof(T) * V == 16, "16-byte vectors");
        const uint4 raw = *reinterpret_cast<const uint4 *>(p);
        const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int k = 0; k < V; k++)
            out[k] = Num<T>::ld(e[k]);
    }
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T *p, const typename Num<T>::A *in)
{
    if constexpr (V == 1) {
        p[0] = Num<T>::st(in[0]);
    } else {
        static_assert(sizeof(T) * V == 16, "16-byte vectors");
        uint4 raw;
        T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int k = 0; k < V; k++)
            e[k] = Num<T>::st(in[k]);
        *reinterpret_cast<uint4 *>(p) = raw;
    }
}

/* ---- row reductions ----------------------------------------------------- */

template <typename A> __device__ __forceinline__ A warp_sum(A v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the threads of a row: a warp, or the whole block when
 * blockDim.x > 32 (then blockDim.y == 1, so the branch and its barriers are
 * block-uniform). Every thread gets the same value. */
template <typename A> __device__ A row_sum(A v)
{
    v = warp_sum(v);
    if (blockDim.x > 32) {
        __shared__ A part[32];
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        __syncthreads(); /* a previous call's readers are done with part */
        if (lane == 0)
            part[w] = v;
        __syncthreads();
        v = lane < (int)(blockDim.x >> 5) ? part[lane] : A(0);
        v = warp_sum(v);
    }
    return v;
}

/* Online softmax statistics: running max m and sum s of exp(x - m). */
template <typename A> __device__ __forceinline__ void ms_add(A &m, A &s, A v)
{
    if (v > m) {
        s = s * d_exp(m - v) + A(1);
        m = v;
    } else if (v != neg_inf<A>()) { /* -inf adds 0 (and would be NaN if m is -inf) */
        s += d_exp(v - m);
    }
}

/* Merge of two partial (m, s); symmetric in its arguments bit for bit, so
 * a butterfly leaves the same pair in every lane. */
template <typename A>
__device__ __forceinline__ void ms_merge(A &m, A &s, A m2, A s2)
{
    const A mn = m2 > m ? m2 : m;
    if (mn == neg_inf<A>()) { /* both empty (s may carry a NaN) */
        s = s + s2;
        return;
    }
    /* explicit roundings: an FMA contraction would break the symmetry */
    s = mul_rn(s, d_exp(m - mn)) + mul_rn(s2, d_exp(m2 - mn));
    m = mn;
}

template <typename A> __device__ __forceinline__ void warp_ms(A &m, A &s)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const A m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const A s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
}

/* (m, s) over the threads of a row, as row_sum. */
template <typename A> __device__ void row_ms(A &m, A &s)
{
    warp_ms(m, s);
    if (blockDim.x > 32) {
        __shared__ A pm[32], ps[32];
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        __syncthreads();
        if (lane == 0) {
            pm[w] = m;
            ps[w] = s;
        }
        __syncthreads();
        const bool have = lane < (int)(blockDim.x >> 5);
        m = have ? pm[lane] : neg_inf<A>();
        s = have ? ps[lane] : A(0);
        warp_ms(m, s);
    }
}

/* The row handled by this thread's warp / block. */
__device__ __forceinline__ int64_t row_index()
{
    return (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
}

/* ---- softmax / log_softmax ---------------------------------------------- */

/* x, y: [R, D] contiguous. Same semantics as the CPU: an all -inf row
 * yields NaN (0/0), like softmax_lane in lib/ops_softmax.c. */
template <typename T, int V>
__global__ void softmax_rows_kernel(const T *__restrict__ x, T *__restrict__ y,
                                    int64_t R, int64_t D, int is_log)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * D;
    T *yr = y + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    A m = neg_inf<A>(), s = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            ms_add(m, s, v[k]);
    }
    row_ms(m, s);
    if (m == neg_inf<A>())
        m = A(0);
    const A lse = d_log(s);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            v[k] = is_log ? (v[k] - m) - lse : d_exp(v[k] - m) / s;
        store_vec<T, V>(yr + j, v);
    }
}

/* x, y: [O, D, I] contiguous with I > 1 (softmax along a non-last dim):
 * one thread per (o, i) lane; neighbouring threads read neighbouring i. */
template <typename T>
__global__ void softmax_cols_kernel(const T *__restrict__ x, T *__restrict__ y,
                                    int64_t O, int64_t D, int64_t I,
                                    int is_log)
{
    typedef typename Num<T>::A A;
    const int64_t total = O * I;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = t / I, i = t - o * I;
        const T *xp = x + o * D * I + i;
        T *yp = y + o * D * I + i;
        A m = neg_inf<A>(), s = A(0);
        for (int64_t d = 0; d < D; d++)
            ms_add(m, s, Num<T>::ld(xp[d * I]));
        if (m == neg_inf<A>())
            m = A(0);
        const A lse = d_log(s);
        for (int64_t d = 0; d < D; d++) {
            const A v = Num<T>::ld(xp[d * I]) - m;
            yp[d * I] = Num<T>::st(is_log ? v - lse : d_exp(v) / s);
        }
    }
}

/* softmax: dx = y (g - sum g y); log_softmax: dx = g - exp(y) sum g. */
template <typename T, int V>
__global__ void softmax_bwd_rows_kernel(const T *__restrict__ g,
                                        const T *__restrict__ y,
                                        T *__restrict__ dx, int64_t R,
                                        int64_t D, int is_log)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *gr = g + row * D, *yr = y + row * D;
    T *dr = dx + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    A dot = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A gv[V], yv[V];
        load_vec<T, V>(gr + j, gv);
        load_vec<T, V>(yr + j, yv);
#pragma unroll
        for (int k = 0; k < V; k++)
            dot += is_log ? gv[k] : gv[k] * yv[k];
    }
    dot = row_sum(dot);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A gv[V], yv[V];
        load_vec<T, V>(gr + j, gv);
        load_vec<T, V>(yr + j, yv);
#pragma unroll
        for (int k = 0; k < V; k++)
            gv[k] = is_log ? gv[k] - d_exp(yv[k]) * dot : yv[k] * (gv[k] - dot);
        store_vec<T, V>(dr + j, gv);
    }
}

template <typename T>
__global__ void softmax_bwd_cols_kernel(const T *__restrict__ g,
                                        const T *__restrict__ y,
                                        T *__restrict__ dx, int64_t O,
                                        int64_t D, int64_t I, int is_log)
{
    typedef typename Num<T>::A A;
    const int64_t total = O * I;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = t / I, i = t - o * I, base = o * D * I + i;
        A dot = A(0);
        for (int64_t d = 0; d < D; d++) {
            const A gv = Num<T>::ld(g[base + d * I]);
            dot += is_log ? gv : gv * Num<T>::ld(y[base + d * I]);
        }
        for (int64_t d = 0; d < D; d++) {
            const A gv = Num<T>::ld(g[base + d * I]),
                    yv = Num<T>::ld(y[base + d * I]);
            dx[base + d * I] =
                Num<T>::st(is_log ? gv - d_exp(yv) * dot : yv * (gv - dot));
        }
    }
}

/* ---- cross-entropy ------------------------------------------------------ */

/* One pass over each row of logits: lse[r] and the row's loss
 * (lse - x[target], 0 for an ignored row). */
template <typename T, int V>
__global__ void ce_fwd_kernel(const T *__restrict__ x,
                              const int64_t *__restrict__ tgt, int64_t R,
                              int64_t D, int64_t ignore,
                              typename Num<T>::A *__restrict__ lse,
                              typename Num<T>::A *__restrict__ rowloss)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    A m = neg_inf<A>(), s = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            ms_add(m, s, v[k]);
    }
    row_ms(m, s);
    if (threadIdx.x == 0) {
        const A l = m + d_log(s);
        lse[row] = l;
        const int64_t t = tgt[row];
        rowloss[row] = t == ignore ? A(0) : l - Num<T>::ld(xr[t]);
    }
}

/* loss = sum(rowloss) / count in fp64 with one block: a fixed order. */
template <typename A>
__global__ void ce_loss_kernel(const A *__restrict__ rowloss, int64_t R,
                               int64_t count, A *__restrict__ loss)
{
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < R; i += blockDim.x)
        acc += (double)rowloss[i];
    acc = row_sum(acc); /* blockDim.x > 32, blockDim.y == 1 */
    if (threadIdx.x == 0)
        *loss = (A)(count ? acc / (double)count : 0.0);
}

/* dx = (exp(x - lse) - onehot) * g / count; g read here, on the device. */
template <typename T, int V>
__global__ void ce_bwd_kernel(const T *__restrict__ x,
                              const typename Num<T>::A *__restrict__ lse,
                              const int64_t *__restrict__ tgt,
                              const void *__restrict__ g, int gdt, int64_t R,
                              int64_t D, int64_t ignore, int64_t count,
                              T *__restrict__ dx)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const int64_t t = tgt[row];
    const T *xr = x + row * D;
    T *dr = dx + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    if (t == ignore) {
        A z[V];
#pragma unroll
        for (int k = 0; k < V; k++)
            z[k] = A(0);
        for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step)
            store_vec<T, V>(dr + j, z);
        return;
    }
    const A scale = count ? (A)(load_scalar(g, gdt) / (double)count) : A(0);
    const A l = lse[row];
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            v[k] = scale * (d_exp(v[k] - l) - (j + k == t ? A(1) : A(0)));
        store_vec<T, V>(dr + j, v);
    }
}

/* ---- layernorm ---------------------------------------------------------- */

/* Two passes for mean and variance (as the CPU: no cancellation), a third
 * to write y. The row stays in L1/L2 between passes. */
template <typename T, int V>
__global__ void ln_fwd_kernel(const T *__restrict__ x, const T *__restrict__ w,
                              int64_t ws, const T *__restrict__ b, int64_t bs,
                              int64_t R, int64_t C, typename Num<T>::A eps,
                              T *__restrict__ y,
                              typename Num<T>::A *__restrict__ mean,
                              typename Num<T>::A *__restrict__ rstd)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * C;
    T *yr = y + row * C;
    const int64_t step = (int64_t)blockDim.x * V;
    A sum = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            sum += v[k];
    }
    const A mu = row_sum(sum) / (A)C;
    A sq = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A d = v[k] - mu;
            sq += d * d;
        }
    }
    const A rs = A(1) / d_sqrt(row_sum(sq) / (A)C + eps);
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A wv = w ? Num<T>::ld(w[(j + k) * ws]) : A(1);
            const A bv = b ? Num<T>::ld(b[(j + k) * bs]) : A(0);
            v[k] = (v[k] - mu) * rs * wv + bv;
        }
        store_vec<T, V>(yr + j, v);
    }
}

/* dx = rstd (wg - mean(wg) - xhat mean(wg xhat)), wg = g * w. */
template <typename T, int V>
__global__ void ln_bwd_dx_kernel(const T *__restrict__ x,
                                 const T *__restrict__ w, int64_t ws,
                                 const typename Num<T>::A *__restrict__ mean,
                                 const typename Num<T>::A *__restrict__ rstd,
                                 const T *__restrict__ g, int64_t R,
                                 int64_t C, T *__restrict__ dx)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * C, *gr = g + row * C;
    T *dr = dx + row * C;
    const A mu = mean[row], rs = rstd[row];
    const int64_t step = (int64_t)blockDim.x * V;
    A s1 = A(0), s2 = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A xv[V], gv[V];
        load_vec<T, V>(xr + j, xv);
        load_vec<T, V>(gr + j, gv);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A xh = (xv[k] - mu) * rs;
            const A wg = gv[k] * (w ? Num<T>::ld(w[(j + k) * ws]) : A(1));
            s1 += wg;
            s2 += wg * xh;
        }
    }
    s1 = row_sum(s1) / (A)C;
    s2 = row_sum(s2) / (A)C;
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A xv[V], gv[V];
        load_vec<T, V>(xr + j, xv);
        load_vec<T, V>(gr + j, gv);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A xh = (xv[k] - mu) * rs;
            const A wg = gv[k] * (w ? Num<T>::ld(w[(j + k) * ws]) : A(1));
            gv[k] = rs * (wg - s1 - xh * s2);
        }
        store_vec<T, V>(dr + j, gv);
    }
}

/* dw / db, stage 1: block (32 columns) x (LN_COL_Y row lanes) sums a chunk
 * of rows of its columns in fp64, lanes combined in order; one partial per
 * (chunk, column). Stage 2 sums the partials in chunk order. */
#define LN_COL_Y 8

template <typename T>
__global__ void ln_bwd_cols_kernel(const T *__restrict__ x,
                                   const typename Num<T>::A *__restrict__ mean,
                                   const typename Num<T>::A *__restrict__ rstd,
                                   const T *__restrict__ g, int64_t R,
                                   int64_t C, int64_t rows_per_chunk,
                                   double *__restrict__ pw,
                                   double *__restrict__ pb)
{
    typedef typename Num<T>::A A;
    __shared__ double sw[LN_COL_Y][32], sb[LN_COL_Y][32];
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    double aw = 0.0, ab = 0.0;
    if (col < C) {
        for (int64_t r = r0 + threadIdx.y; r < r1; r += LN_COL_Y) {
            const A gv = Num<T>::ld(g[r * C + col]);
            const A xh = (Num<T>::ld(x[r * C + col]) - mean[r]) * rstd[r];
            aw += (double)gv * (double)xh;
            ab += (double)gv;
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        double tw = 0.0, tb = 0.0;
#pragma unroll
        for (int k = 0; k < LN_COL_Y; k++) {
            tw += sw[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
        }
        pw[(int64_t)blockIdx.y * C + col] = tw;
        pb[(int64_t)blockIdx.y * C + col] = tb;
    }
}

template <typename T>
__global__ void ln_bwd_cols_final(const double *__restrict__ pw,
                                  const double *__restrict__ pb,
                                  int64_t nchunks, int64_t C,
                                  T *__restrict__ dw, T *__restrict__ db)
{
    for (int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; col < C;
         col += (int64_t)gridDim.x * blockDim.x) {
        double tw = 0.0, tb = 0.0;
        for (int64_t k = 0; k < nchunks; k++) {
            tw += pw[k * C + col];
            tb += pb[k * C + col];
        }
        if (dw)
            dw[col] = Num<T>::st_d(tw);
        if (db)
            db[col] = Num<T>::st_d(tb);
    }
}

/* ---- embedding ---------------------------------------------------------- */

/* y[i, :] = w[idx[i], :]: a plain copy of U-sized words (any dtype). */
template <typename U>
__global__ void emb_fwd_kernel(const U *__restrict__ w, int64_t s0, int64_t s1,
                               const int64_t *__restrict__ idx, int64_t n,
                               int64_t C, U *__restrict__ y)
{
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const U *src = w + idx[i] * s0;
        U *dst = y + i * C;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
            dst[j] = src[j * s1];
    }
}

/* One block per used vocab row u: dw[urow[u], :] = sum of g[pos[k], :] for
 * k in [start[u], start[u+1]), in position order (the CPU's order too). */
template <typename T>
__global__ void emb_bwd_kernel(const T *__restrict__ g,
                               const int64_t *__restrict__ urow,
                               const int64_t *__restrict__ start,
                               const int64_t *__restrict__ pos, int64_t nu,
                               int64_t C, T *__restrict__ dw)
{
    typedef typename Num<T>::A A;
    for (int64_t u = blockIdx.x; u < nu; u += gridDim.x) {
        const int64_t k0 = start[u], k1 = start[u + 1];
        T *dst = dw + urow[u] * C;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
            A acc = A(0);
            for (int64_t k = k0; k < k1; k++)
                acc += Num<T>::ld(g[pos[k] * C + j]);
            dst[j] = Num<T>::st(acc);
        }
    }
}

/* ---- dropout ------------------------------------------------------------ */

/* One Philox call per group b of 4 elements, the mapping of dropout_apply
 * in lib/ops_nn.c; the product is taken in fp64 and rounded once, so fp32
 * and fp64 results equal the CPU's bit for bit. */
template <typename T>
__global__ void dropout_kernel(const T *__restrict__ src, T *__restrict__ dst,
                               int64_t n, uint2 key, uint32_t off_lo,
                               uint32_t thr, double scale)
{
    const int64_t groups = (n + 3) / 4;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         b < groups; b += (int64_t)gridDim.x * blockDim.x) {
        const uint4 ctr = make_uint4((uint32_t)b, (uint32_t)((uint64_t)b >> 32),
                                     FG_NN_DROPOUT_TAG, off_lo);
        const uint4 r = curand_Philox4x32_10(ctr, key);
        const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int64_t e = 4 * b + k;
            if (e < n) {
                const double v = (words[k] >> 8) < thr
                                     ? (double)Num<T>::ld(src[e]) * scale
                                     : 0.0;
                dst[e] = Num<T>::st_d(v);
            }
        }
    }
}

/* ---- host side ---------------------------------------------------------- */

template <typename T> T *dptr(const fg_tensor *t)
{
    return t ? reinterpret_cast<T *>(fg_tensor_base(t)) : nullptr;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

fg_status bad_dtype(const char *fn, fg_dtype dt)
{
    return fg_error(FG_ERR_UNSUPPORTED, "%s: dtype %s is not supported on CUDA",
                    fn, fg_dtype_name(dt));
}

/* Calls F<T>(args...) for the storage type T of dtype dt. */
#define NN_BY_DTYPE(dt, fn, F, ...)                                         \
    switch (dt) {                                                           \
    case FG_FP64: return F<double>(__VA_ARGS__);                            \
    case FG_FP32: return F<float>(__VA_ARGS__);                             \
    case FG_FP16: return F<__half>(__VA_ARGS__);                            \
    case FG_BF16: return F<__nv_bfloat16>(__VA_ARGS__);                     \
    default: return bad_dtype(fn, dt);                                      \
    }

/* Launch shape of a row kernel: a warp per row (4 rows per block) up to
 * 2048 elements, else one block of 64..1024 threads (~32+ elements each). */
struct RowLaunch {
    dim3 grid, block;
};

fg_status row_launch(int64_t R, int64_t D, const char *fn, RowLaunch *L)
{
    int tpr = 32, rpb = 4;
    if (D > 2048) {
        tpr = 64;
        while (tpr < 1024 && (int64_t)tpr * 32 < D)
            tpr *= 2;
        rpb = 1;
    }
    const int64_t g = (R + rpb - 1) / rpb;
    if (g > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: too many rows (%lld)", fn,
                        (long long)R);
    L->grid = dim3((unsigned)g);
    L->block = dim3((unsigned)tpr, (unsigned)rpb);
    return FG_OK;
}

/* Elements per 16-byte vector. */
template <typename T> constexpr int vec_width() { return (int)(16 / sizeof(T)); }

/* [O, D, I] around dim (row-major). */
void split_dim(const fg_tensor *t, int dim, int64_t *O, int64_t *D, int64_t *I)
{
    *O = 1;
    *I = 1;
    for (int i = 0; i < dim; i++)
        *O *= t->shape[i];
    *D = t->shape[dim];
    for (int i = dim + 1; i < t->nd; i++)
        *I *= t->shape[i];
}

/* Frees device scratch (NULL-safe): after the kernels using it were
 * enqueued, which is safe on the one stream. */
void scratch_free(void *p, size_t bytes)
{
    if (p)
        fg_cuda_mem_free(p, bytes);
}

/* ---- softmax ------------------------------------------------------------ */

template <typename T>
fg_status softmax_fwd_t(const fg_tensor *x, fg_tensor *y, int dim, int is_log)
{
    int64_t O, D, I;
    split_dim(x, dim, &O, &D, &I);
    const T *xp = dptr<T>(x);
    T *yp = dptr<T>(y);
    cudaStream_t st = fg_cuda_stream();
    if (I == 1) {
        RowLaunch L;
        FG_TRY(row_launch(O, D, "fg_softmax", &L));
        constexpr int VW = vec_width<T>();
        if (D % VW == 0 && aligned16(xp) && aligned16(yp))
            softmax_rows_kernel<T, VW><<<L.grid, L.block, 0, st>>>(xp, yp, O, D,
                                                                   is_log);
        else
            softmax_rows_kernel<T, 1><<<L.grid, L.block, 0, st>>>(xp, yp, O, D,
                                                                  is_log);
    } else {
        softmax_cols_kernel<T><<<fg_cuda_grid(O * I, 256), 256, 0, st>>>(
            xp, yp, O, D, I, is_log);
    }
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status softmax_bwd_t(const fg_tensor *g, const fg_tensor *y, fg_tensor *dx,
                        int dim, int is_log)
{
    int64_t O, D, I;
    split_dim(y, dim, &O, &D, &I);
    const T *gp = dptr<T>(g), *yp = dptr<T>(y);
    T *dp = dptr<T>(dx);
    cudaStream_t st = fg_cuda_stream();
    if (I == 1) {
        RowLaunch L;
        FG_TRY(row_launch(O, D, "softmax backward", &L));
        constexpr int VW = vec_width<T>();
        if (D % VW == 0 && aligned16(gp) && aligned16(yp) && aligned16(dp))
            softmax_bwd_rows_kernel<T, VW><<<L.grid, L.block, 0, st>>>(
                gp, yp, dp, O, D, is_log);
        else
            softmax_bwd_rows_kernel<T, 1><<<L.grid, L.block, 0, st>>>(
                gp, yp, dp, O, D, is_log);
    } else {
        softmax_bwd_cols_kernel<T><<<fg_cuda_grid(O * I, 256), 256, 0, st>>>(
            gp, yp, dp, O, D, I, is_log);
    }
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* ---- cross-entropy ------------------------------------------------------ */

template <typename T>
fg_status ce_fwd_launch(const fg_tensor *x, const int64_t *dtgt, int64_t R,
                        int64_t D, int64_t ignore, int64_t count,
                        typename Num<T>::A *rowloss, fg_tensor *lse,
                        fg_tensor *loss)
{
    typedef typename Num<T>::A A;
    const T *xp = dptr<T>(x);
    A *lp = dptr<A>(lse);
    cudaStream_t st = fg_cuda_stream();
    RowLaunch L;
    FG_TRY(row_launch(R, D, "fg_cross_entropy", &L));
    constexpr int VW = vec_width<T>();
    if (D % VW == 0 && aligned16(xp))
        ce_fwd_kernel<T, VW><<<L.grid, L.block, 0, st>>>(xp, dtgt, R, D, ignore,
                                                         lp, rowloss);
    else
        ce_fwd_kernel<T, 1><<<L.grid, L.block, 0, st>>>(xp, dtgt, R, D, ignore,
                                                        lp, rowloss);
    FG_CUDA_TRY_LAUNCH();
    ce_loss_kernel<A><<<1, 512, 0, st>>>(rowloss, R, count, dptr<A>(loss));
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status ce_fwd_t(const fg_tensor *x, const int64_t *targets, int64_t ignore,
                   int64_t count, fg_tensor *lse, fg_tensor *loss)
{
    typedef typename Num<T>::A A;
    const int64_t D = x->shape[x->nd - 1], R = x->numel / D;
    const size_t tbytes = sizeof(int64_t) * (size_t)R,
                 lbytes = sizeof(A) * (size_t)R;
    int64_t *dtgt = nullptr;
    A *rowloss = nullptr;
    fg_status s = fg_cuda_mem_alloc(tbytes, (void **)&dtgt);
    if (s == FG_OK)
        s = fg_cuda_mem_alloc(lbytes, (void **)&rowloss);
    if (s == FG_OK)
        s = fg_cuda_memcpy_h2d(dtgt, targets, tbytes);
    if (s == FG_OK)
        s = ce_fwd_launch<T>(x, dtgt, R, D, ignore, count, rowloss, lse, loss);
    scratch_free(dtgt, tbytes);
    scratch_free(rowloss, lbytes);
    return s;
}

template <typename T>
fg_status ce_bwd_launch(const fg_tensor *x, const fg_tensor *lse,
                        const int64_t *dtgt, int64_t R, int64_t D,
                        int64_t ignore, int64_t count, const fg_tensor *g,
                        fg_tensor *dx)
{
    typedef typename Num<T>::A A;
    const T *xp = dptr<T>(x);
    const A *lp = dptr<A>(lse);
    const void *gp = fg_tensor_base(g);
    T *dp = dptr<T>(dx);
    cudaStream_t st = fg_cuda_stream();
    RowLaunch L;
    FG_TRY(row_launch(R, D, "cross-entropy backward", &L));
    constexpr int VW = vec_width<T>();
    if (D % VW == 0 && aligned16(xp) && aligned16(dp))
        ce_bwd_kernel<T, VW><<<L.grid, L.block, 0, st>>>(
            xp, lp, dtgt, gp, (int)g->dtype, R, D, ignore, count, dp);
    else
        ce_bwd_kernel<T, 1><<<L.grid, L.block, 0, st>>>(
            xp, lp, dtgt, gp, (int)g->dtype, R, D, ignore, count, dp);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status ce_bwd_t(const fg_tensor *x, const fg_tensor *lse,
                   const int64_t *targets, int64_t ignore, int64_t count,
                   const fg_tensor *g, fg_tensor *dx)
{
    const int64_t D = x->shape[x->nd - 1], R = x->numel / D;
    const size_t tbytes = sizeof(int64_t) * (size_t)R;
    int64_t *dtgt = nullptr;
    fg_status s = fg_cuda_mem_alloc(tbytes, (void **)&dtgt);
    if (s == FG_OK)
        s = fg_cuda_memcpy_h2d(dtgt, targets, tbytes);
    if (s == FG_OK)
        s = ce_bwd_launch<T>(x, lse, dtgt, R, D, ignore, count, g, dx);
    scratch_free(dtgt, tbytes);
    return s;
}

/* ---- layernorm ---------------------------------------------------------- */

template <typename T>
fg_status ln_fwd_t(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                   double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd)
{
    typedef typename Num<T>::A A;
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    const T *xp = dptr<T>(x), *wp = dptr<T>(w), *bp = dptr<T>(b);
    const int64_t ws = w ? w->stride[0] : 0, bs = b ? b->stride[0] : 0;
    T *yp = dptr<T>(y);
    A *mp = dptr<A>(mean), *rp = dptr<A>(rstd);
    cudaStream_t st = fg_cuda_stream();
    RowLaunch L;
    FG_TRY(row_launch(R, C, "fg_layernorm", &L));
    constexpr int VW = vec_width<T>();
    if (C % VW == 0 && aligned16(xp) && aligned16(yp))
        ln_fwd_kernel<T, VW><<<L.grid, L.block, 0, st>>>(xp, wp, ws, bp, bs, R,
                                                         C, (A)eps, yp, mp, rp);
    else
        ln_fwd_kernel<T, 1><<<L.grid, L.block, 0, st>>>(xp, wp, ws, bp, bs, R,
                                                        C, (A)eps, yp, mp, rp);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status ln_cols_launch(const fg_tensor *x, const fg_tensor *mean,
                         const fg_tensor *rstd, const fg_tensor *g, int64_t R,
                         int64_t C, int64_t rpc, int64_t nchunks, double *pw,
                         double *pb, fg_tensor *dw, fg_tensor *db)
{
    typedef typename Num<T>::A A;
    cudaStream_t st = fg_cuda_stream();
    const int64_t gx = (C + 31) / 32;
    if (gx > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "layernorm backward: too many columns (%lld)",
                        (long long)C);
    ln_bwd_cols_kernel<T><<<dim3((unsigned)gx, (unsigned)nchunks),
                            dim3(32, LN_COL_Y), 0, st>>>(
        dptr<T>(x), dptr<A>(mean), dptr<A>(rstd), dptr<T>(g), R, C, rpc, pw,
        pb);
    FG_CUDA_TRY_LAUNCH();
    ln_bwd_cols_final<T><<<fg_cuda_grid(C, 256), 256, 0, st>>>(
        pw, pb, nchunks, C, dptr<T>(dw), dptr<T>(db));
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status ln_bwd_t(const fg_tensor *x, const fg_tensor *w,
                   const fg_tensor *mean, const fg_tensor *rstd,
                   const fg_tensor *g, fg_tensor *dx, fg_tensor *dw,
                   fg_tensor *db)
{
    typedef typename Num<T>::A A;
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    cudaStream_t st = fg_cuda_stream();
    if (dx) {
        const T *xp = dptr<T>(x), *wp = dptr<T>(w), *gp = dptr<T>(g);
        const int64_t ws = w ? w->stride[0] : 0;
        T *dp = dptr<T>(dx);
        const A *mp = dptr<A>(mean), *rp = dptr<A>(rstd);
        RowLaunch L;
        FG_TRY(row_launch(R, C, "layernorm backward", &L));
        constexpr int VW = vec_width<T>();
        if (C % VW == 0 && aligned16(xp) && aligned16(gp) && aligned16(dp))
            ln_bwd_dx_kernel<T, VW><<<L.grid, L.block, 0, st>>>(
                xp, wp, ws, mp, rp, gp, R, C, dp);
        else
            ln_bwd_dx_kernel<T, 1><<<L.grid, L.block, 0, st>>>(
                xp, wp, ws, mp, rp, gp, R, C, dp);
        FG_CUDA_TRY_LAUNCH();
    }
    if (!dw && !db)
        return FG_OK;
    /* Chunks of >= 128 rows, at most 1024 of them (gridDim.y <= 65535). */
    int64_t rpc = 128;
    if (R > rpc * 1024)
        rpc = (R + 1023) / 1024;
    const int64_t nchunks = (R + rpc - 1) / rpc;
    const size_t pbytes = sizeof(double) * (size_t)(nchunks * C);
    double *pw = nullptr, *pb = nullptr;
    fg_status s = fg_cuda_mem_alloc(pbytes, (void **)&pw);
    if (s == FG_OK)
        s = fg_cuda_mem_alloc(pbytes, (void **)&pb);
    if (s == FG_OK)
        s = ln_cols_launch<T>(x, mean, rstd, g, R, C, rpc, nchunks, pw, pb, dw,
                              db);
    scratch_free(pw, pbytes);
    scratch_free(pb, pbytes);
    return s;
}

/* ---- embedding ---------------------------------------------------------- */

template <typename U>
fg_status emb_fwd_launch(const fg_tensor *w, const int64_t *didx, int64_t n,
                         fg_tensor *y)
{
    const int64_t C = w->shape[1];
    emb_fwd_kernel<U><<<fg_cuda_grid(n, 1), 128, 0, fg_cuda_stream()>>>(
        dptr<const U>(w), w->stride[0], w->stride[1], didx, n, C, dptr<U>(y));
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status emb_bwd_launch(const fg_tensor *g, const int64_t *dcsr, int64_t nu,
                         fg_tensor *dw)
{
    const int64_t C = dw->shape[1];
    emb_bwd_kernel<T><<<fg_cuda_grid(nu, 1), 128, 0, fg_cuda_stream()>>>(
        dptr<T>(g), dcsr, dcsr + nu, dcsr + 2 * nu + 1, nu, C, dptr<T>(dw));
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* ---- dropout ------------------------------------------------------------ */

template <typename T>
fg_status dropout_t(const fg_tensor *src, fg_tensor *dst, uint2 key,
                    uint32_t off_lo, uint32_t thr, double scale)
{
    const int64_t n = src->numel, groups = (n + 3) / 4;
    dropout_kernel<T><<<fg_cuda_grid(groups, 256), 256, 0, fg_cuda_stream()>>>(
        dptr<T>(src), dptr<T>(dst), n, key, off_lo, thr, scale);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

} /* namespace */

/* ---- entry points --------------------------------------------------------- */

extern "C" fg_status fg_cuda_softmax_forward(const fg_tensor *x, fg_tensor *y,
                                             int dim, int is_log)
{
    if (x->numel == 0)
        return FG_OK;
    NN_BY_DTYPE(x->dtype, "fg_softmax", softmax_fwd_t, x, y, dim, is_log);
}

extern "C" fg_status fg_cuda_softmax_backward(const fg_tensor *g,
                                              const fg_tensor *y, fg_tensor *dx,
                                              int dim, int is_log)
{
    if (y->numel == 0)
        return FG_OK;
    NN_BY_DTYPE(y->dtype, "softmax backward", softmax_bwd_t, g, y, dx, dim,
                is_log);
}

extern "C" fg_status fg_cuda_cross_entropy_forward(const fg_tensor *x,
                                                   const int64_t *targets,
                                                   int64_t ignore_index,
                                                   int64_t count, fg_tensor *lse,
                                                   fg_tensor *loss)
{
    if (x->numel == 0) /* no rows: loss 0, as on the CPU */
        return fg_cuda_memset_zero(fg_tensor_base(loss),
                                   fg_esize(loss->dtype));
    NN_BY_DTYPE(x->dtype, "fg_cross_entropy", ce_fwd_t, x, targets,
                ignore_index, count, lse, loss);
}

extern "C" fg_status fg_cuda_cross_entropy_backward(
    const fg_tensor *x, const fg_tensor *lse, const int64_t *targets,
    int64_t ignore_index, int64_t count, const fg_tensor *g, fg_tensor *dx)
{
    if (x->numel == 0)
        return FG_OK;
    NN_BY_DTYPE(x->dtype, "cross-entropy backward", ce_bwd_t, x, lse, targets,
                ignore_index, count, g, dx);
}

extern "C" fg_status fg_cuda_layernorm_forward(const fg_tensor *x,
                                               const fg_tensor *weight,
                                               const fg_tensor *bias,
                                               double eps, fg_tensor *y,
                                               fg_tensor *mean, fg_tensor *rstd)
{
    if (x->numel == 0)
        return FG_OK;
    NN_BY_DTYPE(x->dtype, "fg_layernorm", ln_fwd_t, x, weight, bias, eps, y,
                mean, rstd);
}

extern "C" fg_status fg_cuda_layernorm_backward(
    const fg_tensor *x, const fg_tensor *weight, const fg_tensor *mean,
    const fg_tensor *rstd, const fg_tensor *g, fg_tensor *dx, fg_tensor *dw,
    fg_tensor *db)
{
    const int64_t C = x->shape[x->nd - 1];
    if (C == 0)
        return FG_OK;
    if (x->numel == 0) { /* no rows: the column sums are 0 */
        const size_t bytes = (size_t)C * fg_esize(x->dtype);
        if (dw)
            FG_TRY(fg_cuda_memset_zero(fg_tensor_base(dw), bytes));
        if (db)
            FG_TRY(fg_cuda_memset_zero(fg_tensor_base(db), bytes));
        return FG_OK;
    }
    NN_BY_DTYPE(x->dtype, "layernorm backward", ln_bwd_t, x, weight, mean,
                rstd, g, dx, dw, db);
}

extern "C" fg_status fg_cuda_embedding_forward(const fg_tensor *weight,
                                               const int64_t *indices,
                                               int64_t n, fg_tensor *y)
{
    if (n == 0 || weight->shape[1] == 0)
        return FG_OK;
    const size_t ibytes = sizeof(int64_t) * (size_t)n;
    int64_t *didx = nullptr;
    FG_TRY(fg_cuda_mem_alloc(ibytes, (void **)&didx));
    fg_status s = fg_cuda_memcpy_h2d(didx, indices, ibytes);
    if (s == FG_OK) {
        switch (fg_esize(weight->dtype)) {
        case 8: s = emb_fwd_launch<uint64_t>(weight, didx, n, y); break;
        case 4: s = emb_fwd_launch<uint32_t>(weight, didx, n, y); break;
        default: s = emb_fwd_launch<uint16_t>(weight, didx, n, y); break;
        }
    }
    scratch_free(didx, ibytes);
    return s;
}

extern "C" fg_status fg_cuda_embedding_backward(const fg_tensor *g,
                                                const int64_t *indices,
                                                int64_t n, fg_tensor *dw)
{
    static const char fn[] = "embedding backward";
    if (dw->numel == 0)
        return FG_OK;
    FG_TRY(fg_cuda_memset_zero(fg_tensor_base(dw),
                               (size_t)dw->numel * fg_esize(dw->dtype)));
    if (n == 0)
        return FG_OK;
    if (dw->dtype != FG_FP64 && dw->dtype != FG_FP32 && dw->dtype != FG_FP16 &&
        dw->dtype != FG_BF16)
        return bad_dtype(fn, dw->dtype);
    const int64_t V = dw->shape[0];
    /* CSR by counting sort on the host: used rows (ascending), their start
     * offsets (nu + 1) and the positions using each row, in position order,
     * packed in one buffer for a single copy. */
    int64_t *cnt = (int64_t *)calloc((size_t)V, sizeof(int64_t));
    if (!cnt)
        return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: host scratch", fn);
    for (int64_t i = 0; i < n; i++)
        cnt[indices[i]]++;
    int64_t nu = 0;
    for (int64_t v = 0; v < V; v++)
        nu += cnt[v] != 0;
    const size_t cbytes = sizeof(int64_t) * (size_t)(2 * nu + 1 + n);
    int64_t *csr = (int64_t *)malloc(cbytes);
    if (!csr) {
        free(cnt);
        return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: host scratch", fn);
    }
    int64_t *urow = csr, *start = csr + nu, *pos = csr + 2 * nu + 1;
    int64_t u = 0, off = 0;
    for (int64_t v = 0; v < V; v++) {
        if (!cnt[v])
            continue;
        urow[u] = v;
        start[u] = off;
        const int64_t c = cnt[v];
        cnt[v] = off; /* from here on: the row's fill cursor */
        off += c;
        u++;
    }
    start[nu] = off;
    for (int64_t i = 0; i < n; i++)
        pos[cnt[indices[i]]++] = i;
    free(cnt);

    /* Device scratch sized for the worst case (every position its own row),
     * not for this batch: a size that depends only on the shapes keeps the
     * caching allocator from seeing new sizes in later training steps. */
    const int64_t nu_max = V < n ? V : n;
    const size_t wbytes = sizeof(int64_t) * (size_t)(2 * nu_max + 1 + n);
    int64_t *dcsr = nullptr;
    fg_status s = fg_cuda_mem_alloc(wbytes, (void **)&dcsr);
    if (s == FG_OK)
        s = fg_cuda_memcpy_h2d(dcsr, csr, cbytes);
    free(csr); /* H2D has returned: the source may be reused */
    if (s == FG_OK) {
        switch (dw->dtype) {
        case FG_FP64: s = emb_bwd_launch<double>(g, dcsr, nu, dw); break;
        case FG_FP32: s = emb_bwd_launch<float>(g, dcsr, nu, dw); break;
        case FG_FP16: s = emb_bwd_launch<__half>(g, dcsr, nu, dw); break;
        default: s = emb_bwd_launch<__nv_bfloat16>(g, dcsr, nu, dw); break;
        }
    }
    scratch_free(dcsr, wbytes);
    return s;
}

extern "C" fg_status fg_cuda_dropout(const fg_tensor *src, fg_tensor *dst,
                                     double p, uint64_t seed, uint64_t offset)
{
    if (src->numel == 0)
        return FG_OK;
    const uint2 key = make_uint2((uint32_t)seed, (uint32_t)(seed >> 32) ^
                                                     (uint32_t)(offset >> 32));
    const uint32_t thr = fg_dropout_threshold(p);
    const double scale = 1.0 / (1.0 - p);
    NN_BY_DTYPE(src->dtype, "fg_dropout", dropout_t, src, dst, key,
                (uint32_t)offset, thr, scale);
}
