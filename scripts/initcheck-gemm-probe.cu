// SPDX-License-Identifier: MIT
/* scripts/initcheck-gemm-probe.cu - does compute-sanitizer's initcheck see
 * the stores of a cuBLASLt bf16 GEMM? (doc/reliability.md, session 15)
 *
 *   nvcc -arch=sm_90 -o probe scripts/initcheck-gemm-probe.cu -lcublasLt -lcublas
 *   compute-sanitizer --tool initcheck ./probe lt fresh 256 384 384
 *
 * API: lt (cublasLtMatmul, as lib/cuda gemm_lt.cu calls it: beta 0, C = D)
 * or ex (cublasGemmEx). D: fresh (cudaMalloc'd, never written before the
 * GEMM) or nan (filled with bf16 NaN first). A reader kernel then loads
 * every element of D and counts NaNs: with "nan" a count of 0 shows the
 * GEMM wrote every element; with "fresh" initcheck reports any load it did
 * not see written. No library code: only CUDA, cuBLAS and cuBLASLt. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <string.h>

#define PROBE_FAIL_EXIT 2
#include "probe-check.h"

/* nan[0] += NaNs in d, sum[0] += sum of d (fp32, one atomic per thread) */
__global__ void read_all(const __nv_bfloat16 *d, size_t n, unsigned *nan, float *sum)
{
    unsigned c = 0;
    float s = 0.f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = __bfloat162float(d[i]);
        c += isnan(v);
        s += isnan(v) ? 0.f : v;
    }
    atomicAdd(nan, c);
    atomicAdd(sum, s);
}

int main(int argc, char **argv)
{
    if (argc != 6 || (strcmp(argv[1], "lt") && strcmp(argv[1], "ex")) ||
        (strcmp(argv[2], "fresh") && strcmp(argv[2], "nan"))) {
        fprintf(stderr, "usage: %s lt|ex fresh|nan M N K\n", argv[0]);
        return 2;
    }
    const int M = atoi(argv[3]), N = atoi(argv[4]), K = atoi(argv[5]);
    const bool lt = !strcmp(argv[1], "lt"), poison = !strcmp(argv[2], "nan");
    /* column-major: D [M, N] = A [M, K] B [K, N] */
    __nv_bfloat16 *hA = (__nv_bfloat16 *)malloc((size_t)M * K * 2),
                  *hB = (__nv_bfloat16 *)malloc((size_t)K * N * 2);
    unsigned s = 12345;
    double want = 0; /* sum of D in exact arithmetic of the bf16 inputs */
    float *fa = (float *)malloc((size_t)M * K * 4), *fb = (float *)malloc((size_t)K * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++) {
        s = s * 1664525u + 1013904223u;
        hA[i] = __float2bfloat16((float)(s >> 8) / 16777216.f - 0.5f);
        fa[i] = __bfloat162float(hA[i]);
    }
    for (size_t i = 0; i < (size_t)K * N; i++) {
        s = s * 1664525u + 1013904223u;
        hB[i] = __float2bfloat16((float)(s >> 8) / 16777216.f - 0.5f);
        fb[i] = __bfloat162float(hB[i]);
    }
    for (int k = 0; k < K; k++) { /* sum_ij A_ik B_kj = (sum_i A_ik)(sum_j B_kj) */
        double ra = 0, rb = 0;
        for (int i = 0; i < M; i++)
            ra += fa[(size_t)k * M + i];
        for (int j = 0; j < N; j++)
            rb += fb[(size_t)j * K + k];
        want += ra * rb;
    }
    __nv_bfloat16 *A, *B, *D;
    unsigned *nan;
    float *sum;
    CK(cudaMalloc(&A, (size_t)M * K * 2));
    CK(cudaMalloc(&B, (size_t)K * N * 2));
    CK(cudaMalloc(&D, (size_t)M * N * 2));
    CK(cudaMalloc(&nan, 4));
    CK(cudaMalloc(&sum, 4));
    CK(cudaMemcpy(A, hA, (size_t)M * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, hB, (size_t)K * N * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(nan, 0, 4));
    CK(cudaMemset(sum, 0, 4));
    if (poison)
        CK(cudaMemset(D, 0xff, (size_t)M * N * 2)); /* 0xffff: a bf16 NaN */
    const float one = 1.f, zero = 0.f;
    if (lt) {
        cublasLtHandle_t h;
        CB(cublasLtCreate(&h));
        cublasLtMatmulDesc_t op;
        CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasLtMatrixLayout_t la, lb, ld;
        CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, M, K, M));
        CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, N, K));
        CB(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, M, N, M));
        cublasLtMatmulPreference_t pref;
        CB(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws_bytes = 32u << 20;
        void *ws;
        CK(cudaMalloc(&ws, ws_bytes));
        CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws_bytes, sizeof ws_bytes));
        cublasLtMatmulHeuristicResult_t hr;
        int found = 0;
        CB(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &hr, &found));
        if (!found) {
            fprintf(stderr, "no cuBLASLt algorithm\n");
            return 2;
        }
        CB(cublasLtMatmul(h, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &hr.algo, ws, ws_bytes,
                          0));
        CK(cudaDeviceSynchronize());
        CK(cudaFree(ws));
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
        cublasLtDestroy(h);
    } else {
        cublasHandle_t h;
        CB(cublasCreate(&h));
        CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, A, CUDA_R_16BF, M, B,
                        CUDA_R_16BF, K, &zero, D, CUDA_R_16BF, M, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
        CK(cudaDeviceSynchronize());
        cublasDestroy(h);
    }
    read_all<<<64, 256>>>(D, (size_t)M * N, nan, sum);
    CK(cudaGetLastError());
    unsigned hn;
    float hs;
    CK(cudaMemcpy(&hn, nan, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hs, sum, 4, cudaMemcpyDeviceToHost));
    /* bf16 outputs round each element: a loose check that every one is there */
    const bool ok = hn == 0 && fabs(hs - want) <= 1e-2 * (fabs(want) + M * (double)N * 0.05);
    printf("probe %s %s %dx%dx%d: NaNs in D %u, sum %.4f (want %.4f): %s\n", argv[1], argv[2], M,
           N, K, hn, hs, want, ok ? "every element written" : "NOT all written");
    return ok ? 0 : 1;
}
