/* SPDX-License-Identifier: MIT */
/* kernels/ops/ops_nn_common.cuh - what the nn-op kernel files share: element
 * types (storage T, accumulator A), 16-byte vector loads, warp/block row
 * reductions (xor butterflies, so every lane ends with the bit-identical
 * value; orders depend only on shapes: deterministic), and the host-side
 * launch helpers. Included by ops_softmax.cu, ops_layernorm.cu and
 * ops_nn.cu; everything is in an anonymous namespace (one copy per file).
 * fp64 computes in fp64; fp32, fp16 and bf16 in fp32 (stores round to
 * nearest even). */
#ifndef FG_KERNELS_OPS_NN_COMMON_CUH
#define FG_KERNELS_OPS_NN_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <curand_kernel.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "lib/autograd/cuda_backend.h"
#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/cuda_context.h"
#include "lib/ops/cuda_ops_nn.h"
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
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

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

/* ---- host side ---------------------------------------------------------- */

template <typename T> T *dptr(const fg_tensor *t)
{
    return t ? reinterpret_cast<T *>(fg_tensor_base(t)) : nullptr;
}

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

inline fg_status bad_dtype(const char *fn, fg_dtype dt)
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

inline fg_status row_launch(int64_t R, int64_t D, const char *fn, RowLaunch *L)
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
inline void split_dim(const fg_tensor *t, int dim, int64_t *O, int64_t *D, int64_t *I)
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
inline void scratch_free(void *p, size_t bytes)
{
    if (p)
        fg_cuda_mem_free(p, bytes);
}

} /* namespace */

#endif /* FG_KERNELS_OPS_NN_COMMON_CUH */
