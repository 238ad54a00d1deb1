// SPDX-License-Identifier: MIT
/* scripts/wgrad-probe.cu - what makes the GPT-2-small step's weight
 * gradients slow under cuBLASLt (doc/training.md, session 46): the fp32 C
 * (a gradient summed in fp32, C += product), the bias gradient in the
 * epilogue (BGRADA), the split-K reduction scheme or the workspace size.
 * Each form of the four weight-gradient shapes is timed with the
 * heuristic's first algorithm and the best of its first eight.
 *
 *   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o wgrad-probe \
 *        scripts/wgrad-probe.cu -lcublasLt
 *   ./wgrad-probe [tokens]     (default 65536: batch 64 of 1024)
 *
 * The library's layout (kernels/ops/gemm_lt.cu): dW^T (O x I, col-major,
 * ld O) = dY^T-as-stored (O x T, op N) times X (I x T stored, op T), so
 * the bias gradient is the sum of cuBLASLt's A over k. No library code:
 * only CUDA and cuBLASLt. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "probe-check.h"

/* Standard-normal-ish values from a hash (Irwin-Hall of four uniforms). */
__global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.f;
        for (unsigned r = 0; r < 4; r++) {
            unsigned h = (unsigned)i * 2654435761u ^ (seed + r * 0x9E3779B9u);
            h ^= h >> 16;
            h *= 0x85EBCA6Bu;
            h ^= h >> 13;
            s += (h & 0xFFFFFF) * (1.0f / 16777216.0f);
        }
        p[i] = __float2bfloat16((s - 2.0f) * 1.7320508f);
    }
}

struct Form {
    const char *name;
    bool c32, beta1, bgrad, inplace;
    size_t ws_mib;
};

static const Form kForms[] = {
    {"fp32 C +=, bias grad (the library's)", true, true, true, false, 32},
    {"fp32 C +=, no bias grad", true, true, false, false, 32},
    {"fp32 C =, no bias grad", true, false, false, false, 32},
    {"fp32 C +=, bias grad, 128 MiB workspace", true, true, true, false, 128},
    {"fp32 C +=, bias grad, in-place split-K", true, true, true, true, 32},
    {"bf16 C =, no bias grad (PyTorch's)", false, false, false, true, 32},
    {"bf16 C =, bias grad", false, false, true, true, 32},
};

static float time_algo(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const cublasLtMatmulAlgo_t *algo,
                       cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                       const void *A, const void *B, void *C, const float *beta, void *ws, size_t wsb)
{
    const float alpha = 1.f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < 18; r++) {
        CK(cudaEventRecord(e0));
        if (cublasLtMatmul(h, op, &alpha, A, la, B, lb, beta, C, lc, C, lc, algo, ws, wsb, 0) !=
            CUBLAS_STATUS_SUCCESS)
            return -1.f;
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3)
            t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return t[t.size() / 2];
}

int main(int argc, char **argv)
{
    const long T = argc > 1 ? atol(argv[1]) : 65536;
    const int shapes[4][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}}; /* O, I */
    const char *names[4] = {"QKV", "projection", "fc", "fc2"};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, cuBLASLt %zu, tokens %ld\n", prop.name, cublasLtGetVersion(), T);
    __nv_bfloat16 *dy, *x;
    float *c, *bias;
    CK(cudaMalloc(&dy, (size_t)T * 3072 * 2));
    CK(cudaMalloc(&x, (size_t)T * 3072 * 2));
    CK(cudaMalloc(&c, (size_t)3072 * 3072 * 4));
    CK(cudaMalloc(&bias, 3072 * 4));
    fill<<<1024, 256>>>(dy, (size_t)T * 3072, 1);
    fill<<<1024, 256>>>(x, (size_t)T * 3072, 2);
    CK(cudaGetLastError());
    CK(cudaMemset(c, 0, (size_t)3072 * 3072 * 4));
    void *ws;
    CK(cudaMalloc(&ws, (size_t)128 << 20));
    cublasLtHandle_t h;
    CB(cublasLtCreate(&h));
    for (int s = 0; s < 4; s++) {
        const uint64_t m = shapes[s][0], n = shapes[s][1];
        const double tf = 2.0 * m * n * T / 1e9;
        for (const Form &f : kForms) {
            cublasLtMatmulDesc_t op;
            CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t tn = CUBLAS_OP_N, tt = CUBLAS_OP_T;
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tn, sizeof tn));
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tt, sizeof tt));
            const cublasLtEpilogue_t epi = f.bgrad ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_DEFAULT;
            CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
            if (f.bgrad) {
                const void *bp = bias;
                CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
                const int32_t bt = f.c32 ? CUDA_R_32F : CUDA_R_16BF;
                CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
            }
            cublasLtMatrixLayout_t la, lb, lc;
            CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, T, m));
            CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, T, n));
            CB(cublasLtMatrixLayoutCreate(&lc, f.c32 ? CUDA_R_32F : CUDA_R_16BF, m, n, m));
            cublasLtMatmulPreference_t pref;
            CB(cublasLtMatmulPreferenceCreate(&pref));
            const size_t wsb = f.ws_mib << 20;
            CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                    sizeof wsb));
            const uint32_t red = f.inplace ? CUBLASLT_REDUCTION_SCHEME_INPLACE |
                                                 CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                           : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
            CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red,
                                                    sizeof red));
            cublasLtMatmulHeuristicResult_t hr[8];
            int found = 0;
            const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 8, hr, &found);
            const float beta = f.beta1 ? 1.f : 0.f;
            float first = -1.f, best = -1.f;
            int bi = -1;
            for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && i < found; i++) {
                const float ms = time_algo(h, op, &hr[i].algo, la, lb, lc, dy, x, c, &beta, ws, wsb);
                if (i == 0)
                    first = ms;
                if (ms > 0 && (best < 0 || ms < best)) {
                    best = ms;
                    bi = i;
                }
            }
            printf("%-10s %4lu x %4lu  %-42s first %.4f ms (%3.0f TF/s)  best %.4f ms (%3.0f TF/s, #%d of %d)\n",
                   names[s], (unsigned long)m, (unsigned long)n, f.name, first, first > 0 ? tf / first : 0.,
                   best, best > 0 ? tf / best : 0., bi, found);
            fflush(stdout);
            CB(cublasLtMatmulPreferenceDestroy(pref));
            CB(cublasLtMatrixLayoutDestroy(la));
            CB(cublasLtMatrixLayoutDestroy(lb));
            CB(cublasLtMatrixLayoutDestroy(lc));
            CB(cublasLtMatmulDescDestroy(op));
        }
    }
    CB(cublasLtDestroy(h));
    CK(cudaFree(ws));
    CK(cudaFree(dy));
    CK(cudaFree(x));
    CK(cudaFree(c));
    CK(cudaFree(bias));
    return 0;
}
