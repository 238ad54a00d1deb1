/* SPDX-License-Identifier: MIT */
/* kernels/ops/gemm_cuda.cu - every matrix product of the CUDA ops, through
 * cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx). No GEMM kernel is
 * written here: the only kernels are a batched strided 2-D copy (packing
 * operands cuBLAS cannot read as they are) and C = beta * C for K == 0.
 *
 * Row-major onto column-major. flashgrad describes every operand as a
 * row-major-indexed matrix with arbitrary element strides: X[i][j] at
 * X + i*rs + j*cs. cuBLAS reads a column-major matrix Y (r x c, leading
 * dimension ld) as Y(i, j) at Y + i + j*ld. Hence:
 *   - an operand with cs == 1 and rs = ld >= cols ("row-major", layout
 *     trans 0) is, to cuBLAS, the column-major matrix X^T (cols x rows);
 *   - an operand with rs == 1 and cs = ld >= rows ("column-major", layout
 *     trans 1) is, to cuBLAS, X itself (rows x cols).
 * We want C = A B with C row-major (M x N, ldc = c_rs). cuBLAS sees that
 * memory as C^T (N x M), and C^T = B^T A^T, so the call is
 *   cublasGemmEx(opB, opA, m = N, n = M, k = K, B, ldb, A, lda, C, ldc)
 * where cuBLAS's first operand must be B^T (N x K): a row-major B already
 * is B^T to cuBLAS (op N); a column-major B is B to cuBLAS (op T). Its
 * second operand must be A^T (K x M): a row-major A is A^T (op N), a
 * column-major A is A (op T). cuBLAS's leading-dimension rules (lda >= m
 * for op N, >= k for op T; ldb >= k for N, >= n for T; ldc >= m) are then
 * exactly "ld >= the other extent" of fg_cuda_gemm_layout.
 * A column-major C (c_rs == 1) is handled by computing the transposed
 * problem C^T = B^T A^T, whose output is row-major: swap M/N, swap A/B,
 * and swap each operand's rs/cs. */
#include <limits.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "lib/autograd/cuda_backend.h"
#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/cuda_context.h"
#include "lib/ops/cuda_ops_blas.h"
#include "gemm_types.cuh"

namespace {

constexpr int kBlock = 256;

/* dst(b, r, c) = src(b, r, c) for b < batch, r < rows, c < cols; every
 * side with its own strides. T only carries the bits (same dtype). */
template <typename T>
__global__ void copy2d_kernel(T *dst, int64_t d_rs, int64_t d_cs,
                              int64_t d_sb, const T *src, int64_t s_rs,
                              int64_t s_cs, int64_t s_sb, int64_t rows,
                              int64_t cols, int64_t total)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
         i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % cols, t = i / cols;
        const int64_t r = t % rows, b = t / rows;
        dst[b * d_sb + r * d_rs + c * d_cs] =
            src[b * s_sb + r * s_rs + c * s_cs];
    }
}

fg_status copy2d(size_t es, void *dst, int64_t d_rs, int64_t d_cs,
                 int64_t d_sb, const void *src, int64_t s_rs, int64_t s_cs,
                 int64_t s_sb, int64_t rows, int64_t cols, int64_t batch)
{
    const int64_t total = batch * rows * cols;
    if (total <= 0)
        return FG_OK;
    const unsigned grid = fg_cuda_grid(total, kBlock);
    cudaStream_t st = fg_cuda_stream();
#define FG_COPY2D(T)                                                          \
    copy2d_kernel<T><<<grid, kBlock, 0, st>>>(                                \
        (T *)dst, d_rs, d_cs, d_sb, (const T *)src, s_rs, s_cs, s_sb, rows,   \
        cols, total)
    if (es == 8)
        FG_COPY2D(uint64_t);
    else if (es == 4)
        FG_COPY2D(uint32_t);
    else
        FG_COPY2D(uint16_t);
#undef FG_COPY2D
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* Arithmetic type per storage type for C = beta * C. */
__device__ inline float to_acc(float x) { return x; }
__device__ inline double to_acc(double x) { return x; }
__device__ inline float to_acc(__half x) { return __half2float(x); }
__device__ inline float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline void from_acc(float *p, float x) { *p = x; }
__device__ inline void from_acc(double *p, double x) { *p = x; }
__device__ inline void from_acc(__half *p, float x) { *p = __float2half_rn(x); }
__device__ inline void from_acc(__nv_bfloat16 *p, float x)
{
    *p = __float2bfloat16_rn(x);
}

/* C = beta * C (beta == 0: zeros, NaNs dropped), for K == 0. */
template <typename T, typename A>
__global__ void scale2d_kernel(T *c, int64_t rs, int64_t cs, int64_t sb,
                               int64_t rows, int64_t cols, int64_t total,
                               A beta)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
         i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i % cols, t = i / cols;
        const int64_t r = t % rows, b = t / rows;
        T *p = c + b * sb + r * rs + j * cs;
        from_acc(p, beta == A(0) ? A(0) : beta * to_acc(*p));
    }
}

fg_status scale_c(fg_dtype dt, void *C, int64_t rs, int64_t cs, int64_t sb,
                  int64_t rows, int64_t cols, int64_t batch, double beta)
{
    if (beta == 1.0)
        return FG_OK;
    const int64_t total = batch * rows * cols;
    if (total <= 0)
        return FG_OK;
    const unsigned grid = fg_cuda_grid(total, kBlock);
    cudaStream_t st = fg_cuda_stream();
    switch (dt) {
    case FG_FP64:
        scale2d_kernel<double, double><<<grid, kBlock, 0, st>>>(
            (double *)C, rs, cs, sb, rows, cols, total, beta);
        break;
    case FG_FP32:
        scale2d_kernel<float, float><<<grid, kBlock, 0, st>>>(
            (float *)C, rs, cs, sb, rows, cols, total, (float)beta);
        break;
    case FG_FP16:
        scale2d_kernel<__half, float><<<grid, kBlock, 0, st>>>(
            (__half *)C, rs, cs, sb, rows, cols, total, (float)beta);
        break;
    default:
        scale2d_kernel<__nv_bfloat16, float><<<grid, kBlock, 0, st>>>(
            (__nv_bfloat16 *)C, rs, cs, sb, rows, cols, total, (float)beta);
        break;
    }
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* A scratch block from the caching allocator, released on scope exit (the
 * work using it is already enqueued: single-stream reuse is safe). */
struct Scratch {
    void *p = nullptr;
    size_t bytes = 0;
    fg_status alloc(size_t b)
    {
        fg_status s = fg_cuda_mem_alloc(b, &p);
        if (s == FG_OK)
            bytes = b;
        else
            p = nullptr;
        return s;
    }
    ~Scratch()
    {
        if (p)
            fg_cuda_mem_free(p, bytes);
    }
};

/* An operand cuBLAS cannot read as it is, copied to a contiguous
 * row-major [nb, rows, cols] block (nb = 1 when shared by the batch). */
fg_status pack(size_t es, int64_t rows, int64_t cols, const void **x,
               int64_t *rs, int64_t *cs, int64_t *sb, int64_t batch,
               Scratch *buf)
{
    const int64_t nb = *sb == 0 ? 1 : batch;
    FG_TRY(buf->alloc((size_t)(nb * rows * cols) * es));
    FG_TRY(copy2d(es, buf->p, cols, 1, rows * cols, *x, *rs, *cs, *sb, rows,
                  cols, nb));
    *x = buf->p;
    *rs = cols;
    *cs = 1;
    *sb = *sb == 0 ? 0 : rows * cols;
    return FG_OK;
}

/* The cuBLAS call for a row-major C (ldc), operands already expressible:
 * C^T (N x M) = op(B) op(A) in cuBLAS's column-major view (see the top). */
fg_status cublas_gemm(fg_dtype dt, int64_t M, int64_t N, int64_t K,
                      double alpha, const void *A, int ta, int64_t lda,
                      const void *B, int tb, int64_t ldb, double beta,
                      void *C, int64_t ldc, int64_t batch, int64_t sA,
                      int64_t sB, int64_t sC)
{
    cudaDataType ty;
    cublasComputeType_t ct;
    fg_gemm_types(dt, &ty, &ct);
    /* 64F compute takes double scalars; every other compute type here
     * takes float scalars. */
    const double ad = alpha, bd = beta;
    const float af = (float)alpha, bf = (float)beta;
    const void *pa = dt == FG_FP64 ? (const void *)&ad : (const void *)&af;
    const void *pb = dt == FG_FP64 ? (const void *)&bd : (const void *)&bf;
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* B */
    const cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* A */
    cublasHandle_t h;
    FG_TRY(fg_cuda_cublas(&h));
    FG_CUBLAS_TRY(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    /* The shared handle's math mode must not let TF32 in behind
     * fg_cuda_tf32_allowed() (TF32_TENSOR_OP_MATH would, even with
     * COMPUTE_32F), and 16-bit GEMMs must reduce split-K partials in fp32,
     * not in the output type. */
    FG_CUBLAS_TRY(cublasSetMathMode(
        h, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    const size_t es = fg_dtype_size(dt);
    if (batch == 1) {
        FG_CUBLAS_TRY(cublasGemmEx(h, opa, opb, (int)N, (int)M, (int)K, pa, B,
                                   ty, (int)ldb, A, ty, (int)lda, pb, C, ty,
                                   (int)ldc, ct, CUBLAS_GEMM_DEFAULT));
        fg_cuda_mark_written(C, (size_t)((M - 1) * ldc + N) * es);
        return FG_OK;
    }
    /* batchCount is an int: very long batches go in slices. */
    for (int64_t b0 = 0; b0 < batch; b0 += INT_MAX) {
        const int64_t nb = batch - b0 < INT_MAX ? batch - b0 : INT_MAX;
        FG_CUBLAS_TRY(cublasGemmStridedBatchedEx(
            h, opa, opb, (int)N, (int)M, (int)K, pa,
            (const char *)B + (size_t)(b0 * sB) * es, ty, (int)ldb,
            (long long)sB, (const char *)A + (size_t)(b0 * sA) * es, ty,
            (int)lda, (long long)sA, pb, (char *)C + (size_t)(b0 * sC) * es,
            ty, (int)ldc, (long long)sC, (int)nb, ct, CUBLAS_GEMM_DEFAULT));
        fg_cuda_mark_written((char *)C + (size_t)(b0 * sC) * es,
                             (size_t)((nb - 1) * sC + (M - 1) * ldc + N) * es);
    }
    return FG_OK;
}

/* C row-major (layout trans 0): pack what cuBLAS cannot read, then call. */
fg_status gemm_row_major_c(fg_dtype dt, int64_t M, int64_t N, int64_t K,
                           double alpha, const void *A, int64_t a_rs,
                           int64_t a_cs, const void *B, int64_t b_rs,
                           int64_t b_cs, double beta, void *C, int64_t c_rs,
                           int64_t c_cs, int64_t batch, int64_t sA,
                           int64_t sB, int64_t sC)
{
    int tc, ta, tb;
    int64_t ldc, lda, ldb;
    if (!fg_cuda_gemm_layout(M, N, c_rs, c_cs, &tc, &ldc) || tc)
        return FG_FAIL(FG_ERR_STATE, "internal: C layout not row-major");
    const size_t es = fg_dtype_size(dt);
    Scratch pa, pb; /* outlive the enqueued cuBLAS call's enqueueing */
    if (!fg_cuda_gemm_layout(M, K, a_rs, a_cs, &ta, &lda)) {
        FG_TRY(pack(es, M, K, &A, &a_rs, &a_cs, &sA, batch, &pa));
        if (!fg_cuda_gemm_layout(M, K, a_rs, a_cs, &ta, &lda))
            return FG_FAIL(FG_ERR_STATE, "internal: packed A unusable");
    }
    if (!fg_cuda_gemm_layout(K, N, b_rs, b_cs, &tb, &ldb)) {
        FG_TRY(pack(es, K, N, &B, &b_rs, &b_cs, &sB, batch, &pb));
        if (!fg_cuda_gemm_layout(K, N, b_rs, b_cs, &tb, &ldb))
            return FG_FAIL(FG_ERR_STATE, "internal: packed B unusable");
    }
    return cublas_gemm(dt, M, N, K, alpha, A, ta, lda, B, tb, ldb, beta, C,
                       ldc, batch, sA, sB, sC);
}

} // namespace

extern "C" fg_status fg_cuda_gemm(fg_dtype dt, int64_t M, int64_t N,
                                  int64_t K, double alpha, const void *A,
                                  int64_t a_rs, int64_t a_cs, const void *B,
                                  int64_t b_rs, int64_t b_cs, double beta,
                                  void *C, int64_t c_rs, int64_t c_cs,
                                  int64_t batch, int64_t sA, int64_t sB,
                                  int64_t sC)
{
    if (dt != FG_FP64 && dt != FG_FP32 && dt != FG_FP16 && dt != FG_BF16)
        return FG_FAIL(FG_ERR_UNSUPPORTED, "dtype %d", (int)dt);
    if (M <= 0 || N <= 0 || batch <= 0)
        return FG_OK;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return FG_FAIL(FG_ERR_UNSUPPORTED,
                       "GEMM of %lld x %lld x %lld exceeds cuBLAS's int "
                       "dimensions",
                       (long long)M, (long long)N, (long long)K);
    const size_t es = fg_dtype_size(dt);
    if (batch > 1 && sC == 0) {
        /* Every batch adds into the one C: in order, on the stream. */
        for (int64_t b = 0; b < batch; b++)
            FG_TRY(fg_cuda_gemm(dt, M, N, K, alpha,
                                (const char *)A + (size_t)(b * sA) * es, a_rs,
                                a_cs, (const char *)B + (size_t)(b * sB) * es,
                                b_rs, b_cs, b ? 1.0 : beta, C, c_rs, c_cs, 1,
                                0, 0, 0));
        return FG_OK;
    }
    if (K <= 0) /* an empty sum: C = beta C */
        return scale_c(dt, C, c_rs, c_cs, sC, M, N, batch, beta);
    int tc;
    int64_t ldc;
    if (!fg_cuda_gemm_layout(M, N, c_rs, c_cs, &tc, &ldc)) {
        /* Compute into a contiguous [batch, M, N] scratch, scatter back. */
        Scratch t;
        FG_TRY(t.alloc((size_t)(batch * M * N) * es));
        if (beta != 0.0)
            FG_TRY(copy2d(es, t.p, N, 1, M * N, C, c_rs, c_cs, sC, M, N,
                          batch));
        FG_TRY(gemm_row_major_c(dt, M, N, K, alpha, A, a_rs, a_cs, B, b_rs,
                                b_cs, beta, t.p, N, 1, batch, sA, sB, M * N));
        return copy2d(es, C, c_rs, c_cs, sC, t.p, N, 1, M * N, M, N, batch);
    }
    if (tc) /* column-major C: C^T = B^T A^T has a row-major output */
        return gemm_row_major_c(dt, N, M, K, alpha, B, b_cs, b_rs, A, a_cs,
                                a_rs, beta, C, c_cs, c_rs, batch, sB, sA, sC);
    return gemm_row_major_c(dt, M, N, K, alpha, A, a_rs, a_cs, B, b_rs, b_cs,
                            beta, C, c_rs, c_cs, batch, sA, sB, sC);
}
