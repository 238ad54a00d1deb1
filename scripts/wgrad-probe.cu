// SPDX-License-Identifier: MIT
/* scripts/wgrad-probe.cu - what makes the GPT-2-small step's weight
 * gradients slow under cuBLASLt (doc/training.md, session 46): the fp32 C
 * (a gradient summed in fp32, C += product), the bias gradient in the
 * epilogue (BGRADA), the split-K reduction scheme or the workspace size;
 * and two other homes for a bias gradient: one more output row from a
 * column of ones stored after x's features, and fc2's dX GEMM with the
 * DGELU_BGRAD epilogue (b1's gradient beside DGELU). Each form is timed
 * with the heuristic's first algorithm and the best of its first eight.
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
    int ones; /* x's extra columns (a one, then zeros) given to the GEMM as rows */
    size_t ws_mib;
};

static const Form kForms[] = {
    {"fp32 C +=, bias grad (the library's)", true, true, true, false, 0, 32},
    {"fp32 C +=, no bias grad", true, true, false, false, 0, 32},
    {"fp32 C =, no bias grad", true, false, false, false, 0, 32},
    {"fp32 C +=, bias grad, 128 MiB workspace", true, true, true, false, 0, 128},
    {"fp32 C +=, bias grad, in-place split-K", true, true, true, true, 0, 32},
    {"bf16 C =, no bias grad (PyTorch's)", false, false, false, true, 0, 32},
    {"bf16 C =, bias grad", false, false, true, true, 0, 32},
    /* the bias gradient as one more output row: x stored [T, I + 8] with
     * a column of ones after its I features, C [I + 1, O]; session 47:
     * 1.2-3x the time, the odd size leaves one slow algorithm. With the
     * seven zero columns after it too, C [I + 8, O], the sizes stay
     * multiples of eight: at 65536 tokens QKV 0.342 ms (plain 0.343), fc
     * 0.429-0.443 (0.408), projection 0.129 (0.122), fc2 0.419 (0.403),
     * against 0.08 / 0.11 / 0.03 / 0.03 ms of column sums (the library's
     * ones column for QKV and fc: lib/ops/ops_linear_master.c) */
    {"fp32 C +=, ones column of x (I + 1 rows)", true, true, false, false, 1, 32},
    {"fp32 C +=, ones column of x (I + 8 rows)", true, true, false, false, 8, 32},
    {"fp32 C =, ones column of x (I + 8 rows)", true, false, false, false, 8, 32},
};

/* One GEMM form: cuBLASLt's first eight algorithms timed. */
struct Gemm {
    uint64_t m, n, k;
    cublasOperation_t opa, opb;
    uint64_t lda, ldb, ldc;
    cudaDataType tc;
    cublasLtEpilogue_t epi;
    const void *bias, *aux;
    int32_t bias_type;
    int64_t aux_ld;
    float beta;
    bool inplace;
    size_t ws_mib;
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

static void run(cublasLtHandle_t h, const Gemm &g, const void *A, const void *B, void *C, void *ws,
                const char *label, double gflop)
{
    cublasLtMatmulDesc_t op;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &g.opa, sizeof g.opa));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &g.opb, sizeof g.opb));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epi, sizeof g.epi));
    if (g.bias) {
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &g.bias_type,
                                          sizeof g.bias_type));
    }
    if (g.aux) {
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
        CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof g.aux_ld));
    }
    const bool ta = g.opa == CUBLAS_OP_T, tb = g.opb == CUBLAS_OP_T;
    cublasLtMatrixLayout_t la, lb, lc;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
    CB(cublasLtMatrixLayoutCreate(&lc, g.tc, g.m, g.n, g.ldc));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    const size_t wsb = g.ws_mib << 20;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    const uint32_t red = g.inplace ? CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                   : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red));
    cublasLtMatmulHeuristicResult_t hr[8];
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 8, hr, &found);
    float first = -1.f, best = -1.f;
    int bi = -1;
    for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && i < found; i++) {
        const float ms = time_algo(h, op, &hr[i].algo, la, lb, lc, A, B, C, &g.beta, ws, wsb);
        if (i == 0)
            first = ms;
        if (ms > 0 && (best < 0 || ms < best)) {
            best = ms;
            bi = i;
        }
    }
    printf("%-66s first %.4f ms (%3.0f TF/s)  best %.4f ms (%3.0f TF/s, #%d of %d)\n", label, first,
           first > 0 ? gflop / first : 0., best, best > 0 ? gflop / best : 0., bi, found);
    fflush(stdout);
    CB(cublasLtMatmulPreferenceDestroy(pref));
    CB(cublasLtMatrixLayoutDestroy(la));
    CB(cublasLtMatrixLayoutDestroy(lb));
    CB(cublasLtMatrixLayoutDestroy(lc));
    CB(cublasLtMatmulDescDestroy(op));
}

int main(int argc, char **argv)
{
    const long T = argc > 1 ? atol(argv[1]) : 65536;
    const int shapes[4][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}}; /* O, I */
    const char *names[4] = {"QKV", "projection", "fc", "fc2"};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, cuBLASLt %zu, tokens %ld\n", prop.name, cublasLtGetVersion(), T);
    const size_t big = (size_t)T * 3080; /* [T, 3072] with room for a padded row */
    __nv_bfloat16 *dy, *x, *aux, *w;
    float *c, *bias;
    CK(cudaMalloc(&dy, big * 2));
    CK(cudaMalloc(&x, big * 2));
    CK(cudaMalloc(&aux, big * 2));
    CK(cudaMalloc(&w, (size_t)3072 * 768 * 2));
    CK(cudaMalloc(&c, (size_t)3080 * 3080 * 4));
    CK(cudaMalloc(&bias, 3072 * 4));
    fill<<<1024, 256>>>(dy, big, 1);
    fill<<<1024, 256>>>(x, big, 2);
    fill<<<1024, 256>>>(aux, big, 3);
    fill<<<1024, 256>>>(w, (size_t)3072 * 768, 4);
    CK(cudaGetLastError());
    CK(cudaMemset(c, 0, (size_t)3080 * 3080 * 4));
    void *ws;
    CK(cudaMalloc(&ws, (size_t)128 << 20));
    cublasLtHandle_t h;
    CB(cublasLtCreate(&h));
    char label[160];
    /* weight gradients: dW^T (O x I) = dY (O x T, op N) X^T (X: I x T, op T) */
    for (int s = 0; s < 4; s++) {
        const uint64_t m = shapes[s][0], n = shapes[s][1];
        for (const Form &f : kForms) {
            Gemm g = {};
            g.m = m;
            g.n = n + (uint64_t)f.ones;
            g.k = (uint64_t)T;
            g.opa = CUBLAS_OP_N;
            g.opb = CUBLAS_OP_T;
            g.lda = m;
            g.ldb = f.ones ? n + 8 : n;
            g.ldc = m;
            g.tc = f.c32 ? CUDA_R_32F : CUDA_R_16BF;
            g.epi = f.bgrad ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_DEFAULT;
            g.bias = f.bgrad ? bias : nullptr;
            g.bias_type = f.c32 ? CUDA_R_32F : CUDA_R_16BF;
            g.beta = f.beta1 ? 1.f : 0.f;
            g.inplace = f.inplace;
            g.ws_mib = f.ws_mib;
            snprintf(label, sizeof label, "%-10s %4lu x %4lu  %s", names[s], (unsigned long)m,
                     (unsigned long)n, f.name);
            run(h, g, dy, x, c, ws, label, 2.0 * m * n * T / 1e9);
        }
    }
    /* the MLP's hidden gradient, fc2's dX: dH^T (3072 x T) = W2 (3072 x 768)
     * dY^T (768 x T), times gelu'(h) from the aux (DGELU), with or without
     * b1's gradient (dH's sums over T) in the same epilogue */
    const cublasLtEpilogue_t dg[3] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_DGELU,
                                      CUBLASLT_EPILOGUE_DGELU_BGRAD};
    const char *dgn[3] = {"plain", "DGELU (the library's)", "DGELU_BGRAD (b1's gradient too)"};
    for (int e = 0; e < 3; e++)
        for (int bt = 0; bt < (e == 2 ? 2 : 1); bt++) {
            Gemm g = {};
            g.m = 3072;
            g.n = (uint64_t)T;
            g.k = 768;
            g.opa = CUBLAS_OP_N;
            g.opb = CUBLAS_OP_N;
            g.lda = 3072;
            g.ldb = 768;
            g.ldc = 3072;
            g.tc = CUDA_R_16BF;
            g.epi = dg[e];
            g.aux = e ? aux : nullptr;
            g.aux_ld = 3072;
            g.bias = e == 2 ? bias : nullptr;
            g.bias_type = bt ? CUDA_R_32F : CUDA_R_16BF;
            g.inplace = true;
            g.ws_mib = 32;
            snprintf(label, sizeof label, "fc2 dX     %ld x 3072 x 768  %s%s", T, dgn[e],
                     e == 2 ? (bt ? ", fp32 bias" : ", bf16 bias") : "");
            run(h, g, w, dy, x, ws, label, 2.0 * 3072 * 768 * T / 1e9);
        }
    CB(cublasLtDestroy(h));
    void *bufs[] = {ws, dy, x, aux, w, c, bias};
    for (void *b : bufs)
        CK(cudaFree(b));
    return 0;
}
