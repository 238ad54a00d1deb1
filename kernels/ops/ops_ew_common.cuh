/* SPDX-License-Identifier: MIT */
/* kernels/ops/ops_ew_common.cuh - what the elementwise and reduction kernel
 * files share: the dtype load/store helpers (fp64 computes in fp64; fp32,
 * fp16 and bf16 in fp32, rounded to nearest even when stored) and the
 * geometry that drops size-1 dimensions and merges runs every operand
 * walks as one. Included by ops_ew.cu and ops_reduce.cu; everything is in
 * an anonymous namespace (one copy per file). */
#ifndef FG_KERNELS_OPS_EW_COMMON_CUH
#define FG_KERNELS_OPS_EW_COMMON_CUH

#include <cmath>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "lib/autograd/cuda_backend.h"
#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/cuda_context.h"
#include "lib/ops/cuda_ops_ew.h"
#include "lib/ops/ops_internal.h"
#include "lib/autograd/tensor_iter.h"

namespace {


constexpr int kBlock = 256; /* every kernel here assumes this block size */
constexpr int kUnroll = 4;  /* elements per thread in the contiguous paths */

/* ---- dtypes -------------------------------------------------------------- */

template <class T> struct Num;
template <> struct Num<double> {
    typedef double Acc;
    static __device__ __forceinline__ double ld(double v) { return v; }
    static __device__ __forceinline__ double st(double v) { return v; }
};
template <> struct Num<float> {
    typedef float Acc;
    static __device__ __forceinline__ float ld(float v) { return v; }
    static __device__ __forceinline__ float st(float v) { return v; }
};
template <> struct Num<__half> {
    typedef float Acc;
    static __device__ __forceinline__ float ld(__half v)
    {
        return __half2float(v);
    }
    static __device__ __forceinline__ __half st(float v)
    {
        return __float2half_rn(v);
    }
};
template <> struct Num<__nv_bfloat16> {
    typedef float Acc;
    static __device__ __forceinline__ float ld(__nv_bfloat16 v)
    {
        return __bfloat162float(v);
    }
    static __device__ __forceinline__ __nv_bfloat16 st(float v)
    {
        return __float2bfloat16_rn(v);
    }
};

/* S -> D through their compute types: fp64 -> fp16 goes via fp32, as the
 * CPU's fg_store_elem does, so both devices round the same way. */
template <class D, class S> __device__ __forceinline__ D cvt(S v)
{
    return Num<D>::st((typename Num<D>::Acc)Num<S>::ld(v));
}

/* Runs the statements (which must return) with T the storage type of dt;
 * falls through for an unknown dtype. */
#define FG_DTYPE_SWITCH(dt, T, ...)                                         \
    switch (dt) {                                                           \
    case FG_FP64: { typedef double T; __VA_ARGS__; }                        \
    case FG_FP32: { typedef float T; __VA_ARGS__; }                         \
    case FG_FP16: { typedef __half T; __VA_ARGS__; }                        \
    case FG_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; }                 \
    }

fg_status bad_dtype(const char *fn, fg_dtype dt)
{
    return fg_error(FG_ERR_INTERNAL, "%s: unknown dtype %d", fn, (int)dt);
}

/* ---- geometry ------------------------------------------------------------ */

/* N operands over one shape (element strides), dimensions coalesced; passed
 * to kernels by value. */
template <int N> struct Geo {
    int nd; /* >= 1 */
    int64_t shape[FG_MAX_DIMS];
    int64_t st[N][FG_MAX_DIMS];
};

/* Drops extent-1 dimensions and merges neighbours that every operand walks
 * as one run, so contiguous tensors become one dimension of stride 1. */
template <int N>
void geo_build(Geo<N> *g, int nd, const int64_t *shape,
               const int64_t *const *st)
{
    memset(g, 0, sizeof *g);
    int n = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1)
            continue;
        bool merge = n > 0;
        for (int k = 0; k < N && merge; k++)
            merge = g->st[k][n - 1] == st[k][d] * shape[d];
        if (merge) {
            g->shape[n - 1] *= shape[d];
        } else {
            g->shape[n] = shape[d];
            n++;
        }
        for (int k = 0; k < N; k++)
            g->st[k][n - 1] = st[k][d];
    }
    if (n == 0) { /* one element */
        g->shape[0] = 1;
        n = 1;
    }
    g->nd = n;
}

template <int N> bool geo_contiguous(const Geo<N> &g)
{
    for (int k = 0; k < N; k++)
        if (g.st[k][0] != 1)
            return false;
    return g.nd == 1;
}

/* Element offsets of row-major index i. Idx is uint32_t when the index
 * fits (cheaper division), uint64_t otherwise; offsets are 64-bit. The
 * loop runs over fixed indices so the geometry stays in parameter space.
 * Host-callable too, so the index math can be checked without a GPU. */
template <int N, class Idx>
__host__ __device__ __forceinline__ void geo_offsets(const Geo<N> &g, Idx i,
                                            int64_t (&off)[N])
{
#pragma unroll
    for (int k = 0; k < N; k++)
        off[k] = 0;
#pragma unroll
    for (int d = FG_MAX_DIMS - 1; d > 0; d--) {
        if (d < g.nd) {
            const Idx ext = (Idx)g.shape[d];
            const Idx q = i / ext;
            const int64_t r = (int64_t)(i - q * ext);
#pragma unroll
            for (int k = 0; k < N; k++)
                off[k] += r * g.st[k][d];
            i = q;
        }
    }
#pragma unroll
    for (int k = 0; k < N; k++)
        off[k] += (int64_t)i * g.st[k][0];
}

/* Blocks for the kUnroll-per-thread contiguous kernels. */
unsigned grid_unrolled(int64_t n)
{
    return fg_cuda_grid((n + kUnroll - 1) / kUnroll, kBlock);
}

/* Both operands on the device: a host pointer in a kernel would be an
 * illegal address long after the call returned. */
inline fg_status check_device(const char *fn, const fg_tensor *t)
{
    if (t->device != FG_DEVICE_CUDA)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: a %s tensor among CUDA operands (copy it with "
                        "fg_tensor_to first)",
                        fn, fg_device_name(t->device));
    return FG_OK;
}

} // namespace

#endif /* FG_KERNELS_OPS_EW_COMMON_CUH */
