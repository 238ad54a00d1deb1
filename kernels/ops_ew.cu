/* kernels/ops_ew.cu - the CUDA kernels behind strided copy and fill, the
 * elementwise ops (binary with broadcasting, unary) and the deterministic
 * sum reduction. fp64 computes in fp64; fp32, fp16 and bf16 compute in
 * fp32 and round to nearest even when stored. Every launch goes to the
 * context stream; zero-size tensors launch nothing. */
#include <cmath>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "cuda_ops_ew.h"
#include "ops_internal.h"
#include "tensor_iter.h"

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

/* ---- copy and fill ------------------------------------------------------- */

/* Each thread handles kUnroll elements kBlock apart, so every load and
 * store stays coalesced and the loads are all in flight before stores. */
template <class D, class S>
__global__ void copy_contig_kernel(D *dst, const S *src, int64_t n)
{
    const int64_t step = (int64_t)gridDim.x * kBlock * kUnroll;
    for (int64_t base = (int64_t)blockIdx.x * kBlock * kUnroll + threadIdx.x;
         base < n; base += step) {
        S v[kUnroll];
#pragma unroll
        for (int j = 0; j < kUnroll; j++)
            if (base + j * kBlock < n)
                v[j] = src[base + j * kBlock];
#pragma unroll
        for (int j = 0; j < kUnroll; j++)
            if (base + j * kBlock < n)
                dst[base + j * kBlock] = cvt<D, S>(v[j]);
    }
}

template <class D, class S, class Idx>
__global__ void copy_strided_kernel(D *dst, const S *src, int64_t n,
                                    const __grid_constant__ Geo<2> g)
{
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kBlock) {
        int64_t off[2];
        geo_offsets<2, Idx>(g, (Idx)i, off);
        dst[off[0]] = cvt<D, S>(src[off[1]]);
    }
}

template <class D, class S>
fg_status copy_launch(fg_tensor *dst, const fg_tensor *src, const Geo<2> &g)
{
    D *pd = (D *)fg_tensor_base(dst);
    const S *ps = (const S *)fg_tensor_base(src);
    const int64_t n = dst->numel;
    cudaStream_t s = fg_cuda_stream();
    if (geo_contiguous(g))
        copy_contig_kernel<D, S><<<grid_unrolled(n), kBlock, 0, s>>>(pd, ps, n);
    else if (n <= (int64_t)UINT32_MAX)
        copy_strided_kernel<D, S, uint32_t>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(pd, ps, n, g);
    else
        copy_strided_kernel<D, S, uint64_t>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(pd, ps, n, g);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <class D>
fg_status copy_from(fg_tensor *dst, const fg_tensor *src, const Geo<2> &g)
{
    FG_DTYPE_SWITCH(src->dtype, S, return copy_launch<D, S>(dst, src, g))
    return bad_dtype("fg_cuda_copy_strided", src->dtype);
}

template <class T>
__global__ void fill_contig_kernel(T *p, int64_t n, double v)
{
    const T t = Num<T>::st((typename Num<T>::Acc)v);
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kBlock)
        p[i] = t;
}

template <class T, class Idx>
__global__ void fill_strided_kernel(T *p, int64_t n, double v,
                                    const __grid_constant__ Geo<1> g)
{
    const T t = Num<T>::st((typename Num<T>::Acc)v);
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kBlock) {
        int64_t off[1];
        geo_offsets<1, Idx>(g, (Idx)i, off);
        p[off[0]] = t;
    }
}

template <class T> fg_status fill_launch(fg_tensor *t, double v)
{
    const int64_t *st[1] = {t->stride};
    Geo<1> g;
    geo_build(&g, t->nd, t->shape, st);
    T *p = (T *)fg_tensor_base(t);
    const int64_t n = t->numel;
    cudaStream_t s = fg_cuda_stream();
    if (geo_contiguous(g) && v == 0.0 && !std::signbit(v)) {
        /* +0.0 is all-zero bytes in every dtype */
        FG_CUDA_TRY(cudaMemsetAsync(p, 0, (size_t)n * sizeof(T), s));
        return FG_OK;
    }
    if (geo_contiguous(g))
        fill_contig_kernel<T>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(p, n, v);
    else if (n <= (int64_t)UINT32_MAX)
        fill_strided_kernel<T, uint32_t>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(p, n, v, g);
    else
        fill_strided_kernel<T, uint64_t>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(p, n, v, g);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* ---- elementwise --------------------------------------------------------- */

constexpr double kGeluC = 0.7978845608028654; /* sqrt(2/pi) */
constexpr double kGeluA = 0.044715;

/* The CPU's formulas (lib/ops_elementwise.c), per compute type. */
__device__ __forceinline__ double f_exp(double x) { return exp(x); }
__device__ __forceinline__ float f_exp(float x) { return expf(x); }
__device__ __forceinline__ double f_log(double x) { return log(x); }
__device__ __forceinline__ float f_log(float x) { return logf(x); }
__device__ __forceinline__ double f_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float f_tanh(float x) { return tanhf(x); }

template <class A> __device__ __forceinline__ A f_gelu(A x)
{
    const A c = (A)kGeluC, a = (A)kGeluA;
    return (A)0.5 * x * ((A)1 + f_tanh(c * (x + a * x * x * x)));
}
template <class A> __device__ __forceinline__ A f_gelu_grad(A x)
{
    const A c = (A)kGeluC, a = (A)kGeluA;
    const A x2 = x * x, t = f_tanh(c * (x + a * x * x2));
    return (A)0.5 * ((A)1 + t) +
           (A)0.5 * x * ((A)1 - t * t) * c * ((A)1 + (A)3 * a * x2);
}

#define FG_BIN_OP(NAME, EXPR)                                               \
    struct NAME {                                                           \
        template <class A> __device__ __forceinline__ A operator()(A a, A b) \
            const                                                           \
        {                                                                   \
            return (EXPR);                                                  \
        }                                                                   \
    };
FG_BIN_OP(OpAdd, a + b)
FG_BIN_OP(OpSub, a - b)
FG_BIN_OP(OpMul, a * b)
FG_BIN_OP(OpDiv, a / b)
FG_BIN_OP(OpTanhGrad, a * ((A)1 - b * b))
FG_BIN_OP(OpReluGrad, b > (A)0 ? a : (A)0)
FG_BIN_OP(OpGeluGrad, a * f_gelu_grad(b))

#define FG_UN_OP(NAME, EXPR)                                                \
    struct NAME {                                                           \
        template <class A> __device__ __forceinline__ A operator()(A x, A k) \
            const                                                           \
        {                                                                   \
            (void)k;                                                        \
            return (EXPR);                                                  \
        }                                                                   \
    };
FG_UN_OP(OpExp, f_exp(x))
FG_UN_OP(OpLog, f_log(x))
FG_UN_OP(OpTanh, f_tanh(x))
FG_UN_OP(OpRelu, x > (A)0 ? x : (A)0)
FG_UN_OP(OpGelu, f_gelu(x))
FG_UN_OP(OpScale, k * x)
FG_UN_OP(OpAddScalar, x + k)

/* The hot path of training: y, a, b contiguous and of one shape. */
template <class T, class Op>
__global__ void bin_contig_kernel(T *y, const T *a, const T *b, int64_t n,
                                  Op op)
{
    typedef typename Num<T>::Acc A;
    const int64_t step = (int64_t)gridDim.x * kBlock * kUnroll;
    for (int64_t base = (int64_t)blockIdx.x * kBlock * kUnroll + threadIdx.x;
         base < n; base += step) {
        A va[kUnroll], vb[kUnroll];
#pragma unroll
        for (int j = 0; j < kUnroll; j++) {
            const int64_t i = base + j * kBlock;
            va[j] = i < n ? Num<T>::ld(a[i]) : (A)0;
            vb[j] = i < n ? Num<T>::ld(b[i]) : (A)0;
        }
#pragma unroll
        for (int j = 0; j < kUnroll; j++)
            if (base + j * kBlock < n)
                y[base + j * kBlock] = Num<T>::st(op(va[j], vb[j]));
    }
}

/* Any strides, 0 on broadcast dimensions. */
template <class T, class Op, class Idx>
__global__ void bin_strided_kernel(T *y, const T *a, const T *b, int64_t n,
                                   const __grid_constant__ Geo<3> g, Op op)
{
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kBlock) {
        int64_t off[3];
        geo_offsets<3, Idx>(g, (Idx)i, off);
        y[off[0]] =
            Num<T>::st(op(Num<T>::ld(a[off[1]]), Num<T>::ld(b[off[2]])));
    }
}

template <class T, class Op>
__global__ void un_contig_kernel(T *y, const T *x, int64_t n,
                                 typename Num<T>::Acc k, Op op)
{
    typedef typename Num<T>::Acc A;
    const int64_t step = (int64_t)gridDim.x * kBlock * kUnroll;
    for (int64_t base = (int64_t)blockIdx.x * kBlock * kUnroll + threadIdx.x;
         base < n; base += step) {
        A v[kUnroll];
#pragma unroll
        for (int j = 0; j < kUnroll; j++) {
            const int64_t i = base + j * kBlock;
            v[j] = i < n ? Num<T>::ld(x[i]) : (A)0;
        }
#pragma unroll
        for (int j = 0; j < kUnroll; j++)
            if (base + j * kBlock < n)
                y[base + j * kBlock] = Num<T>::st(op(v[j], k));
    }
}

template <class T, class Op, class Idx>
__global__ void un_strided_kernel(T *y, const T *x, int64_t n,
                                  typename Num<T>::Acc k,
                                  const __grid_constant__ Geo<2> g, Op op)
{
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kBlock) {
        int64_t off[2];
        geo_offsets<2, Idx>(g, (Idx)i, off);
        y[off[0]] = Num<T>::st(op(Num<T>::ld(x[off[1]]), k));
    }
}

template <class T, class Op>
fg_status bin_launch(fg_tensor *y, const fg_tensor *a, const fg_tensor *b,
                     Op op)
{
    int64_t sa[FG_MAX_DIMS], sb[FG_MAX_DIMS];
    fg_broadcast_strides(a, y->nd, y->shape, sa);
    fg_broadcast_strides(b, y->nd, y->shape, sb);
    const int64_t *st[3] = {y->stride, sa, sb};
    Geo<3> g;
    geo_build(&g, y->nd, y->shape, st);
    T *py = (T *)fg_tensor_base(y);
    const T *pa = (const T *)fg_tensor_base(a),
            *pb = (const T *)fg_tensor_base(b);
    const int64_t n = y->numel;
    cudaStream_t s = fg_cuda_stream();
    if (geo_contiguous(g))
        bin_contig_kernel<T, Op>
            <<<grid_unrolled(n), kBlock, 0, s>>>(py, pa, pb, n, op);
    else if (n <= (int64_t)UINT32_MAX)
        bin_strided_kernel<T, Op, uint32_t>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(py, pa, pb, n, g, op);
    else
        bin_strided_kernel<T, Op, uint64_t>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(py, pa, pb, n, g, op);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <class Op>
fg_status bin_dtype(fg_tensor *y, const fg_tensor *a, const fg_tensor *b,
                    Op op)
{
    FG_DTYPE_SWITCH(y->dtype, T, return bin_launch<T, Op>(y, a, b, op))
    return bad_dtype("fg_cuda_ew_binary", y->dtype);
}

template <class T, class Op>
fg_status un_launch(fg_tensor *y, const fg_tensor *x, double k, Op op)
{
    const int64_t *st[2] = {y->stride, x->stride};
    Geo<2> g;
    geo_build(&g, y->nd, y->shape, st);
    T *py = (T *)fg_tensor_base(y);
    const T *px = (const T *)fg_tensor_base(x);
    const int64_t n = y->numel;
    const typename Num<T>::Acc kk = (typename Num<T>::Acc)k;
    cudaStream_t s = fg_cuda_stream();
    if (geo_contiguous(g))
        un_contig_kernel<T, Op><<<grid_unrolled(n), kBlock, 0, s>>>(py, px, n,
                                                                    kk, op);
    else if (n <= (int64_t)UINT32_MAX)
        un_strided_kernel<T, Op, uint32_t>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(py, px, n, kk, g, op);
    else
        un_strided_kernel<T, Op, uint64_t>
            <<<fg_cuda_grid(n, kBlock), kBlock, 0, s>>>(py, px, n, kk, g, op);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <class Op>
fg_status un_dtype(fg_tensor *y, const fg_tensor *x, double k, Op op)
{
    FG_DTYPE_SWITCH(y->dtype, T, return un_launch<T, Op>(y, x, k, op))
    return bad_dtype("fg_cuda_ew_unary", y->dtype);
}


/* ---- sum reduction ------------------------------------------------------- */

/* x's dimensions split into kept ones (an output index o walks them
 * row-major) and summed ones (a reduced index r walks them row-major),
 * each list coalesced. Each output's reduced range is cut into S chunks
 * of `chunk` elements when the outputs alone are too few to fill the GPU
 * (partials per chunk, then an in-order second pass). */
struct RedGeo {
    int nk, nr;
    int64_t M, R, S, chunk;
    int64_t kshape[FG_MAX_DIMS], kx[FG_MAX_DIMS], ko[FG_MAX_DIMS];
    int64_t rshape[FG_MAX_DIMS], rx[FG_MAX_DIMS];
};

/* Threads in flight we aim for: about one fully occupied H100 (132 SMs
 * x 2048 threads). A constant rather than the device's SM count, so the summation
 * order, hence the result bits, is the same on every GPU. */
constexpr int64_t kTargetThreads = 1 << 18;
constexpr int64_t kMaxSplit = 4096;     /* partials per output */
constexpr int64_t kMinChunkThread = 32; /* reduced elements per thread */
constexpr int64_t kMinChunkWarp = 1024; /* ... per warp (32 per lane) */
/* Inner-dimension sums shorter than this use a thread per output: a warp
 * per output would leave most lanes idle. */
constexpr int64_t kWarpMinR = 32;

void red_build(RedGeo *g, const fg_tensor *x, const int64_t *out_str)
{
    memset(g, 0, sizeof *g);
    g->M = g->R = 1;
    int prev = -1; /* previous non-unit dimension: 0 kept, 1 summed */
    for (int d = 0; d < x->nd; d++) {
        const int64_t e = x->shape[d], xs = x->stride[d];
        if (e == 1)
            continue;
        if (out_str[d] == 0) {
            if (prev == 1 && g->rx[g->nr - 1] == xs * e) {
                g->rshape[g->nr - 1] *= e;
            } else {
                g->rshape[g->nr++] = e;
            }
            g->rx[g->nr - 1] = xs;
            g->R *= e;
            prev = 1;
        } else {
            if (prev == 0 && g->kx[g->nk - 1] == xs * e &&
                g->ko[g->nk - 1] == out_str[d] * e) {
                g->kshape[g->nk - 1] *= e;
            } else {
                g->kshape[g->nk++] = e;
            }
            g->kx[g->nk - 1] = xs;
            g->ko[g->nk - 1] = out_str[d];
            g->M *= e;
            prev = 0;
        }
    }
}

/* x and out offsets of output o. */
__host__ __device__ __forceinline__ void
kept_offsets(const RedGeo &g, int64_t o, int64_t &xo, int64_t &oo)
{
    xo = oo = 0;
#pragma unroll
    for (int d = FG_MAX_DIMS - 1; d > 0; d--) {
        if (d < g.nk) {
            const int64_t q = o / g.kshape[d], r = o - q * g.kshape[d];
            xo += r * g.kx[d];
            oo += r * g.ko[d];
            o = q;
        }
    }
    if (g.nk > 0) {
        xo += o * g.kx[0];
        oo += o * g.ko[0];
    }
}

/* x offset of reduced index r (relative to the output's base). */
__host__ __device__ __forceinline__ int64_t red_offset(const RedGeo &g,
                                                       int64_t r)
{
    int64_t off = 0;
#pragma unroll
    for (int d = FG_MAX_DIMS - 1; d > 0; d--) {
        if (d < g.nr) {
            const int64_t q = r / g.rshape[d];
            off += (r - q * g.rshape[d]) * g.rx[d];
            r = q;
        }
    }
    return g.nr > 0 ? off + r * g.rx[0] : 0;
}

template <class T>
__device__ __forceinline__ void red_store(T *out, int64_t oo,
                                          typename Num<T>::Acc acc,
                                          double scale)
{
    /* scaled in double, as the CPU's mean does, then rounded once more */
    out[oo] = Num<T>::st((typename Num<T>::Acc)((double)acc * scale));
}

/* Fixed-order butterfly: lane 0 always ends with the same sum. */
template <class A> __device__ __forceinline__ A warp_sum(A v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

/* One thread per (output, chunk), adjacent threads on adjacent outputs:
 * coalesced when the kept dimensions are the inner ones (bias gradients,
 * [rows, C] -> [C]), and cheap when each output sums few elements. Writes
 * the output when S == 1, else part[s * M + o]. */
template <class T>
__global__ void sum_thread_kernel(T *out, const T *x,
                                  typename Num<T>::Acc *part,
                                  const __grid_constant__ RedGeo g,
                                  double scale)
{
    typedef typename Num<T>::Acc A;
    const int64_t units = g.M * g.S;
    for (int64_t u = (int64_t)blockIdx.x * kBlock + threadIdx.x; u < units;
         u += (int64_t)gridDim.x * kBlock) {
        const int64_t o = u % g.M, s = u / g.M;
        int64_t xo, oo;
        kept_offsets(g, o, xo, oo);
        const int64_t r0 = s * g.chunk;
        const int64_t r1 = r0 + g.chunk < g.R ? r0 + g.chunk : g.R;
        A acc = 0;
        if (g.nr == 1) {
            const int64_t rs = g.rx[0];
            const T *p = x + xo + r0 * rs;
#pragma unroll 4
            for (int64_t r = r0; r < r1; r++, p += rs)
                acc += Num<T>::ld(*p);
        } else {
            for (int64_t r = r0; r < r1; r++)
                acc += Num<T>::ld(x[xo + red_offset(g, r)]);
        }
        if (g.S == 1)
            red_store(out, oo, acc, scale);
        else
            part[s * g.M + o] = acc;
    }
}

/* One warp per (output, chunk), lanes striding the reduced elements: for
 * sums along the innermost (stride-1) dimension. */
template <class T>
__global__ void sum_warp_kernel(T *out, const T *x, typename Num<T>::Acc *part,
                                const __grid_constant__ RedGeo g, double scale)
{
    typedef typename Num<T>::Acc A;
    const int lane = threadIdx.x & 31;
    const int64_t units = g.M * g.S;
    const int64_t nwarps = (int64_t)gridDim.x * (kBlock / 32);
    /* u is uniform across the warp, so the shuffles see every lane */
    for (int64_t u = ((int64_t)blockIdx.x * kBlock + threadIdx.x) >> 5;
         u < units; u += nwarps) {
        const int64_t o = u % g.M, s = u / g.M;
        int64_t xo, oo;
        kept_offsets(g, o, xo, oo);
        const int64_t r0 = s * g.chunk;
        const int64_t r1 = r0 + g.chunk < g.R ? r0 + g.chunk : g.R;
        A acc = 0;
        if (g.nr == 1) {
            const int64_t rs = g.rx[0];
            for (int64_t r = r0 + lane; r < r1; r += 32)
                acc += Num<T>::ld(x[xo + r * rs]);
        } else {
            for (int64_t r = r0 + lane; r < r1; r += 32)
                acc += Num<T>::ld(x[xo + red_offset(g, r)]);
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            if (g.S == 1)
                red_store(out, oo, acc, scale);
            else
                part[s * g.M + o] = acc;
        }
    }
}

/* Second pass, few partials per output: a thread per output, summing
 * part[0..S) in order (reads coalesced across outputs). */
template <class T>
__global__ void sum_finish_thread_kernel(T *out,
                                         const typename Num<T>::Acc *part,
                                         const __grid_constant__ RedGeo g,
                                         double scale)
{
    typedef typename Num<T>::Acc A;
    for (int64_t o = (int64_t)blockIdx.x * kBlock + threadIdx.x; o < g.M;
         o += (int64_t)gridDim.x * kBlock) {
        A acc = 0;
        for (int64_t s = 0; s < g.S; s++)
            acc += part[s * g.M + o];
        int64_t xo, oo;
        kept_offsets(g, o, xo, oo);
        red_store(out, oo, acc, scale);
    }
}

/* Second pass, many partials per output: a warp per output. */
template <class T>
__global__ void sum_finish_warp_kernel(T *out,
                                       const typename Num<T>::Acc *part,
                                       const __grid_constant__ RedGeo g,
                                       double scale)
{
    typedef typename Num<T>::Acc A;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = (int64_t)gridDim.x * (kBlock / 32);
    for (int64_t o = ((int64_t)blockIdx.x * kBlock + threadIdx.x) >> 5;
         o < g.M; o += nwarps) {
        A acc = 0;
        for (int64_t s = lane; s < g.S; s += 32)
            acc += part[s * g.M + o];
        acc = warp_sum(acc);
        if (lane == 0) {
            int64_t xo, oo;
            kept_offsets(g, o, xo, oo);
            red_store(out, oo, acc, scale);
        }
    }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

fg_status launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FG_OK
                            : fg_cuda_status(e, what, __FILE__, __LINE__);
}

/* Picks the kernel (true: a warp per output) and the split S of the
 * reduced range: split only while the outputs alone cannot fill the GPU,
 * and only into chunks long enough to be worth a partial. */
bool red_plan(RedGeo *g)
{
    const bool warp =
        g->nr > 0 && g->rx[g->nr - 1] == 1 && g->R >= kWarpMinR;
    const int64_t want = warp ? kTargetThreads / 32 : kTargetThreads;
    int64_t S = ceil_div(want, g->M);
    const int64_t by_len =
        ceil_div(g->R, warp ? kMinChunkWarp : kMinChunkThread);
    S = S < by_len ? S : by_len;
    S = S < kMaxSplit ? S : kMaxSplit;
    S = S > 1 ? S : 1;
    g->chunk = ceil_div(g->R, S);
    g->S = ceil_div(g->R, g->chunk); /* no empty chunk */
    return warp;
}

template <class T>
fg_status sum_launch(fg_tensor *out, const fg_tensor *x, RedGeo g,
                     double scale)
{
    typedef typename Num<T>::Acc A;
    const bool warp = red_plan(&g);
    T *po = (T *)fg_tensor_base(out);
    const T *px = (const T *)fg_tensor_base(x);
    A *part = NULL;
    const size_t part_bytes = (size_t)(g.M * g.S) * sizeof(A);
    if (g.S > 1)
        FG_TRY(fg_cuda_mem_alloc(part_bytes, (void **)&part));
    cudaStream_t st = fg_cuda_stream();
    const int64_t units = g.M * g.S;
    if (warp)
        sum_warp_kernel<T><<<fg_cuda_grid(units * 32, kBlock), kBlock, 0, st>>>(
            po, px, part, g, scale);
    else
        sum_thread_kernel<T><<<fg_cuda_grid(units, kBlock), kBlock, 0, st>>>(
            po, px, part, g, scale);
    fg_status s = launched("sum reduction kernel");
    if (s == FG_OK && g.S > 1) {
        if (g.S <= 64)
            sum_finish_thread_kernel<T>
                <<<fg_cuda_grid(g.M, kBlock), kBlock, 0, st>>>(po, part, g,
                                                              scale);
        else
            sum_finish_warp_kernel<T>
                <<<fg_cuda_grid(g.M * 32, kBlock), kBlock, 0, st>>>(
                    po, part, g, scale);
        s = launched("sum reduction finishing kernel");
    }
    /* safe right away: the next user of the block runs after these kernels
     * on the same stream */
    if (part)
        fg_cuda_mem_free(part, part_bytes);
    return s;
}

/* Both operands on the device: a host pointer in a kernel would be an
 * illegal address long after the call returned. */
fg_status check_device(const char *fn, const fg_tensor *t)
{
    if (t->device != FG_DEVICE_CUDA)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: a %s tensor among CUDA operands (copy it with "
                        "fg_tensor_to first)",
                        fn, fg_device_name(t->device));
    return FG_OK;
}

} // namespace

/* ---- entry points -------------------------------------------------------- */

extern "C" fg_status fg_cuda_copy_strided(fg_tensor *dst, const fg_tensor *src)
{
    static const char fn[] = "fg_cuda_copy_strided";
    FG_TRY(check_device(fn, dst));
    FG_TRY(check_device(fn, src));
    if (dst->numel == 0)
        return FG_OK;
    int64_t ss[FG_MAX_DIMS];
    fg_broadcast_strides(src, dst->nd, dst->shape, ss);
    const int64_t *st[2] = {dst->stride, ss};
    Geo<2> g;
    geo_build(&g, dst->nd, dst->shape, st);
    if (dst->dtype == src->dtype && geo_contiguous(g)) {
        char *pd = fg_tensor_base(dst);
        const char *ps = fg_tensor_base(src);
        if (pd != ps)
            FG_CUDA_TRY(cudaMemcpyAsync(
                pd, ps, (size_t)dst->numel * fg_dtype_size(dst->dtype),
                cudaMemcpyDeviceToDevice, fg_cuda_stream()));
        return FG_OK;
    }
    FG_DTYPE_SWITCH(dst->dtype, D, return copy_from<D>(dst, src, g))
    return bad_dtype(fn, dst->dtype);
}

extern "C" fg_status fg_cuda_fill_strided(fg_tensor *t, double v)
{
    FG_TRY(check_device("fg_cuda_fill_strided", t));
    if (t->numel == 0)
        return FG_OK;
    FG_DTYPE_SWITCH(t->dtype, T, return fill_launch<T>(t, v))
    return bad_dtype("fg_cuda_fill_strided", t->dtype);
}

extern "C" fg_status fg_cuda_ew_binary(fg_ew_binary op, fg_tensor *y,
                                       const fg_tensor *a, const fg_tensor *b)
{
    static const char fn[] = "fg_cuda_ew_binary";
    FG_TRY(check_device(fn, y));
    FG_TRY(check_device(fn, a));
    FG_TRY(check_device(fn, b));
    if (a->dtype != y->dtype || b->dtype != y->dtype)
        return fg_error(FG_ERR_INTERNAL, "%s: dtypes %s, %s -> %s differ", fn,
                        fg_dtype_name(a->dtype), fg_dtype_name(b->dtype),
                        fg_dtype_name(y->dtype));
    if (y->numel == 0)
        return FG_OK;
    switch (op) {
    case FG_EW_ADD: return bin_dtype(y, a, b, OpAdd());
    case FG_EW_SUB: return bin_dtype(y, a, b, OpSub());
    case FG_EW_MUL: return bin_dtype(y, a, b, OpMul());
    case FG_EW_DIV: return bin_dtype(y, a, b, OpDiv());
    case FG_EW_TANH_GRAD: return bin_dtype(y, a, b, OpTanhGrad());
    case FG_EW_RELU_GRAD: return bin_dtype(y, a, b, OpReluGrad());
    case FG_EW_GELU_GRAD: return bin_dtype(y, a, b, OpGeluGrad());
    case FG_EW_COUNT_BINARY: break;
    }
    return fg_error(FG_ERR_INTERNAL, "%s: unknown op %d", fn, (int)op);
}

extern "C" fg_status fg_cuda_ew_unary(fg_ew_unary op, fg_tensor *y,
                                      const fg_tensor *x, double k)
{
    static const char fn[] = "fg_cuda_ew_unary";
    FG_TRY(check_device(fn, y));
    FG_TRY(check_device(fn, x));
    if (x->dtype != y->dtype)
        return fg_error(FG_ERR_INTERNAL, "%s: dtypes %s -> %s differ", fn,
                        fg_dtype_name(x->dtype), fg_dtype_name(y->dtype));
    if (y->numel == 0)
        return FG_OK;
    switch (op) {
    case FG_EW_EXP: return un_dtype(y, x, k, OpExp());
    case FG_EW_LOG: return un_dtype(y, x, k, OpLog());
    case FG_EW_TANH: return un_dtype(y, x, k, OpTanh());
    case FG_EW_RELU: return un_dtype(y, x, k, OpRelu());
    case FG_EW_GELU: return un_dtype(y, x, k, OpGelu());
    case FG_EW_SCALE: return un_dtype(y, x, k, OpScale());
    case FG_EW_ADD_SCALAR: return un_dtype(y, x, k, OpAddScalar());
    case FG_EW_COUNT_UNARY: break;
    }
    return fg_error(FG_ERR_INTERNAL, "%s: unknown op %d", fn, (int)op);
}

extern "C" fg_status fg_cuda_sum_reduce(fg_tensor *out, const int64_t *out_str,
                                        const fg_tensor *x, double scale)
{
    static const char fn[] = "fg_cuda_sum_reduce";
    FG_TRY(check_device(fn, out));
    FG_TRY(check_device(fn, x));
    if (out->dtype != x->dtype)
        return fg_error(FG_ERR_INTERNAL, "%s: dtypes %s -> %s differ", fn,
                        fg_dtype_name(x->dtype), fg_dtype_name(out->dtype));
    if (out->numel == 0)
        return FG_OK;
    if (x->numel == 0) /* empty sums: 0, times scale (NaN for a 0/0 mean) */
        return fg_cuda_fill_strided(out, 0.0 * scale);
    RedGeo g;
    red_build(&g, x, out_str);
    FG_DTYPE_SWITCH(x->dtype, T, return sum_launch<T>(out, x, g, scale))
    return bad_dtype(fn, x->dtype);
}
