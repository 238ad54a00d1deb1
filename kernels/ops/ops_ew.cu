/* SPDX-License-Identifier: MIT */
/* kernels/ops/ops_ew.cu - the CUDA kernels behind strided copy and fill and
 * the elementwise ops (binary with broadcasting, unary). Every launch goes
 * to the context stream; zero-size tensors launch nothing. The sum
 * reduction is in ops_reduce.cu. */
#include "ops_ew_common.cuh"

namespace {

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

/* The CPU's formulas (lib/ops/ops_elementwise.c), per compute type. */
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

/* ---- zeroing many ranges -------------------------------------------------- */

/* Up to kZeroMax ranges by value (under the 4 KiB parameter limit); block b
 * zeroes chunk b - first[i] of range i, found by binary search. */
constexpr int kZeroMax = 128;
constexpr long long kZeroChunk = 16384; /* bytes per block, a multiple of 16 */
struct ZeroRanges {
    char *p[kZeroMax];
    long long bytes[kZeroMax];
    long long first[kZeroMax]; /* index of the range's first block */
    int n;
};

__global__ void zero_many_kernel(const __grid_constant__ ZeroRanges z)
{
    int lo = 0, hi = z.n - 1;
    const long long b = blockIdx.x;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (z.first[mid] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const long long begin = (b - z.first[lo]) * kZeroChunk;
    const long long end =
        begin + kZeroChunk < z.bytes[lo] ? begin + kZeroChunk : z.bytes[lo];
    char *p = z.p[lo];
    long long vend = begin; /* [begin, vend) in 16-byte stores */
    if (((uintptr_t)p & 15) == 0)
        vend = begin + ((end - begin) & ~15LL);
    for (long long j = begin + 16LL * threadIdx.x; j < vend; j += 16LL * kBlock)
        *(uint4 *)(p + j) = make_uint4(0, 0, 0, 0);
    for (long long j = vend + threadIdx.x; j < end; j += kBlock)
        p[j] = 0;
}

/* ---- accumulation across dtypes ---------------------------------------- */

/* dst += (D)src: src rounded to dst's dtype, then the add of OpAdd, so the
 * bits equal a cast kernel followed by an accumulation (the cast backward
 * of a bf16 weight adding into its fp32 .grad in one pass). */
template <class D, class S, class Idx>
__global__ void acc_convert_kernel(D *dst, const S *src, int64_t n,
                                   const __grid_constant__ Geo<2> g,
                                   bool contig)
{
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kBlock) {
        int64_t off[2];
        if (contig)
            off[0] = off[1] = i;
        else
            geo_offsets<2, Idx>(g, (Idx)i, off);
        dst[off[0]] = Num<D>::st(Num<D>::ld(dst[off[0]]) +
                                 Num<D>::ld(cvt<D, S>(src[off[1]])));
    }
}

template <class D, class S>
fg_status acc_launch(fg_tensor *dst, const fg_tensor *src)
{
    const int64_t *st[2] = {dst->stride, src->stride};
    Geo<2> g;
    geo_build(&g, dst->nd, dst->shape, st);
    D *pd = (D *)fg_tensor_base(dst);
    const S *ps = (const S *)fg_tensor_base(src);
    const int64_t n = dst->numel;
    const unsigned grid = fg_cuda_grid(n, kBlock);
    const bool c = geo_contiguous(g);
    cudaStream_t s = fg_cuda_stream();
    if (n <= (int64_t)UINT32_MAX)
        acc_convert_kernel<D, S, uint32_t>
            <<<grid, kBlock, 0, s>>>(pd, ps, n, g, c);
    else
        acc_convert_kernel<D, S, uint64_t>
            <<<grid, kBlock, 0, s>>>(pd, ps, n, g, c);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <class D> fg_status acc_from(fg_tensor *dst, const fg_tensor *src)
{
    FG_DTYPE_SWITCH(src->dtype, S, return acc_launch<D, S>(dst, src))
    return bad_dtype("fg_cuda_accumulate", src->dtype);
}

/* ---- fused bias + GELU ---------------------------------------------------- */

/* y = gelu(x + b[i % C]) (bwd: dx = g * gelu'(x + b)): one read of x and
 * one write instead of the two passes and the stored sum of add + gelu.
 * Measured in the GPT step on an H100: no faster than add + gelu (the
 * 64-bit index division per element; a column-per-thread layout that
 * keeps the bias in a register is the next thing to try). */
template <class T, bool BWD>
__global__ void bias_gelu_kernel(T *out, const T *g, const T *x, const T *b,
                                 int64_t n, int64_t C)
{
    typedef typename Num<T>::Acc A;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const A u = Num<T>::ld(x[i]) + Num<T>::ld(b[i % C]);
        out[i] = BWD ? Num<T>::st(Num<T>::ld(g[i]) * f_gelu_grad(u))
                     : Num<T>::st(f_gelu(u));
    }
}

template <class T, bool BWD>
fg_status bias_gelu_launch(fg_tensor *out, const fg_tensor *g,
                           const fg_tensor *x, const fg_tensor *b)
{
    const int64_t n = x->numel, C = b->numel;
    if (n == 0)
        return FG_OK;
    bias_gelu_kernel<T, BWD><<<fg_cuda_grid(n, kBlock), kBlock, 0,
                               fg_cuda_stream()>>>(
        (T *)fg_tensor_base(out), g ? (const T *)fg_tensor_base(g) : nullptr,
        (const T *)fg_tensor_base(x), (const T *)fg_tensor_base(b), n, C);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

fg_status bias_gelu_any(const char *fn, fg_tensor *out, const fg_tensor *g,
                        const fg_tensor *x, const fg_tensor *b)
{
    const fg_tensor *all[4] = {out, x, b, g};
    for (int i = 0; i < 4; i++) {
        if (!all[i])
            continue;
        FG_TRY(check_device(fn, all[i]));
        if (all[i]->dtype != x->dtype || !fg_tensor_is_contiguous(all[i]))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: operands must be contiguous and share x's "
                            "dtype", fn);
    }
    if (b->numel < 1 || x->numel % b->numel)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: bias of %lld elements",
                        fn, (long long)b->numel);
    if (g) {
        FG_DTYPE_SWITCH(x->dtype, T,
                        return bias_gelu_launch<T, true>(out, g, x, b));
    } else {
        FG_DTYPE_SWITCH(x->dtype, T,
                        return bias_gelu_launch<T, false>(out, g, x, b));
    }
    return fg_error(FG_ERR_UNSUPPORTED, "%s: dtype %d", fn, (int)x->dtype);
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

/* The tensor layer's gradient accumulation (lib/autograd/cuda_backend.h):
 * in place, the same index in and out. */
extern "C" fg_status fg_cuda_accumulate(fg_tensor *dst, const fg_tensor *src)
{
    if (src->dtype == dst->dtype)
        return fg_cuda_ew_binary(FG_EW_ADD, dst, dst, src);
    FG_TRY(check_device("fg_cuda_accumulate", dst));
    FG_TRY(check_device("fg_cuda_accumulate", src));
    if (dst->numel == 0)
        return FG_OK;
    FG_DTYPE_SWITCH(dst->dtype, D, return acc_from<D>(dst, src))
    return bad_dtype("fg_cuda_accumulate", dst->dtype);
}

extern "C" fg_status fg_cuda_zero_many(void *const *ptrs,
                                      const size_t *bytes, int n)
{
    for (int i = 0; i < n;) {
        ZeroRanges z;
        memset(&z, 0, sizeof z);
        long long blocks = 0;
        for (; i < n && z.n < kZeroMax; i++) {
            if (bytes[i] == 0)
                continue;
            z.p[z.n] = (char *)ptrs[i];
            z.bytes[z.n] = (long long)bytes[i];
            z.first[z.n++] = blocks;
            blocks += ((long long)bytes[i] + kZeroChunk - 1) / kZeroChunk;
        }
        if (blocks == 0)
            continue;
        if (blocks > INT32_MAX)
            return fg_error(FG_ERR_UNSUPPORTED,
                            "fg_cuda_zero_many: %lld blocks", blocks);
        zero_many_kernel<<<(unsigned)blocks, kBlock, 0, fg_cuda_stream()>>>(z);
        FG_CUDA_TRY_LAUNCH();
    }
    return FG_OK;
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

extern "C" fg_status fg_cuda_bias_gelu(fg_tensor *y, const fg_tensor *x,
                                       const fg_tensor *b)
{
    return bias_gelu_any("fg_bias_gelu", y, NULL, x, b);
}

extern "C" fg_status fg_cuda_bias_gelu_backward(fg_tensor *dx,
                                                const fg_tensor *g,
                                                const fg_tensor *x,
                                                const fg_tensor *b)
{
    return bias_gelu_any("BiasGeluBackward", dx, g, x, b);
}
