/* kernels/ops/gemm_lt.cu - the GEMM with the bias in its epilogue (fg_linear
 * on CUDA), through cuBLASLt: C = A W + bias in one kernel instead of a
 * GEMM and an add. Row-major onto column-major as in gemm_cuda.cu: cuBLASLt
 * computes C^T (N x M) = W^T (N x K) A^T (K x M), whose rows are C's
 * columns, so CUBLASLT_EPILOGUE_BIAS's per-row bias is the [N] bias. */
#include <mutex>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/device.h"
#include "lib/ops/cuda_ops_blas.h"
#include "gemm_types.cuh"

namespace {

constexpr size_t kWorkspace = (size_t)4 << 20; /* bytes, per call */

std::mutex g_lt_mu;
cublasLtHandle_t g_lt = nullptr; /* process-wide, as the cuBLAS handle */

fg_status lt_handle(cublasLtHandle_t *out)
{
    std::lock_guard<std::mutex> lock(g_lt_mu);
    if (!g_lt)
        FG_CUBLAS_TRY(cublasLtCreate(&g_lt));
    *out = g_lt;
    return FG_OK;
}

/* Descriptors released on every path out. */
struct LtCall {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    void *ws = nullptr;
    ~LtCall()
    {
        if (pref)
            cublasLtMatmulPreferenceDestroy(pref);
        if (c)
            cublasLtMatrixLayoutDestroy(c);
        if (b)
            cublasLtMatrixLayoutDestroy(b);
        if (a)
            cublasLtMatrixLayoutDestroy(a);
        if (op)
            cublasLtMatmulDescDestroy(op);
        if (ws) /* the call is enqueued: single-stream reuse is safe */
            fg_cuda_mem_free(ws, kWorkspace);
    }
};

} // namespace

extern "C" fg_status fg_cuda_gemm_bias(fg_dtype dt, int64_t M, int64_t N,
                                       int64_t K, const void *A,
                                       const void *W, const void *bias,
                                       void *C, int *done)
{
    *done = 0;
    if (M <= 0 || N <= 0 || K <= 0 || M > INT32_MAX || N > INT32_MAX ||
        K > INT32_MAX)
        return FG_OK; /* the unfused path handles (or rejects) these */
    if (dt != FG_FP64 && dt != FG_FP32 && dt != FG_FP16 && dt != FG_BF16)
        return FG_OK;
    cudaDataType ty;
    cublasComputeType_t ct;
    fg_gemm_types(dt, &ty, &ct);
    const cudaDataType scale = dt == FG_FP64 ? CUDA_R_64F : CUDA_R_32F;
    cublasLtHandle_t h = nullptr;
    FG_TRY(lt_handle(&h));
    LtCall lc;
    FG_CUBLAS_TRY(cublasLtMatmulDescCreate(&lc.op, ct, scale));
    const cublasOperation_t nt = CUBLAS_OP_N;
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    FG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        lc.op, CUBLASLT_MATMUL_DESC_TRANSA, &nt, sizeof nt));
    FG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        lc.op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
    FG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        lc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    FG_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(
        lc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    /* column-major: W^T is N x K (ld N), A^T is K x M (ld K), C^T N x M */
    FG_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&lc.a, ty, (uint64_t)N,
                                             (uint64_t)K, N));
    FG_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&lc.b, ty, (uint64_t)K,
                                             (uint64_t)M, K));
    FG_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&lc.c, ty, (uint64_t)N,
                                             (uint64_t)M, N));
    FG_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&lc.pref));
    const size_t ws = kWorkspace;
    FG_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        lc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* split-K partials summed in the compute type, never in bf16/fp16 (as
     * gemm_cuda.cu's DISALLOW_REDUCED_PRECISION_REDUCTION) */
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_INPLACE |
                         CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    FG_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(
        lc.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red,
        sizeof red));
    cublasLtMatmulHeuristicResult_t hr;
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        h, lc.op, lc.a, lc.b, lc.c, lc.c, lc.pref, 1, &hr, &found);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS &&
                                              found == 0))
        return FG_OK; /* no fused kernel for this: *done stays 0 */
    FG_CUBLAS_TRY(hs);
    FG_TRY(fg_cuda_mem_alloc(kWorkspace, &lc.ws));
    const double ad = 1.0, bd = 0.0;
    const float af = 1.0f, bf = 0.0f;
    const void *alpha = dt == FG_FP64 ? (const void *)&ad : (const void *)&af;
    const void *beta = dt == FG_FP64 ? (const void *)&bd : (const void *)&bf;
    FG_CUBLAS_TRY(cublasLtMatmul(h, lc.op, alpha, W, lc.a, A, lc.b, beta, C,
                                 lc.c, C, lc.c, &hr.algo, lc.ws, kWorkspace,
                                 fg_cuda_stream()));
    *done = 1;
    return FG_OK;
}
