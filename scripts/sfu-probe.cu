// SPDX-License-Identifier: MIT
/* scripts/sfu-probe.cu - how many 2^x and tanh a second the SFU gives in
 * fp32 and in the packed f16x2 / bf16x2 forms (doc/performance.md,
 * session 45): the softcap forward needs a tanh and a 2^x per score and is
 * bound by the SFU, so a packed form that did two elements per slot would
 * halve that. It does not on sm_90: ptxas splits each packed op into two
 * MUFU.*.F16 / .BF16 instructions, at fp32's rate per element.
 *
 *   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o sfu-probe scripts/sfu-probe.cu
 *   ./sfu-probe; cuobjdump -sass sfu-probe | grep -o 'MUFU[.A-Z0-9]*' | sort | uniq -c
 *
 * Eight independent chains a thread, 8 blocks of 256 threads an SM, the
 * second of two rounds printed. No library code: only CUDA. */
#include <cuda_runtime.h>

#include "probe-check.h"

enum { kIters = 2048, kChains = 8 };

__device__ __forceinline__ float op32(int k, float x)
{
    float y;
    if (k == 0)
        asm volatile("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    else
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return k == 0 ? y : y - 1.0f; /* keeps the chain's values small */
}
__device__ __forceinline__ unsigned op16(int k, unsigned x)
{
    unsigned y;
    if (k == 0)
        asm volatile("tanh.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x));
    else if (k == 1)
        asm volatile("tanh.approx.bf16x2 %0, %1;" : "=r"(y) : "r"(x));
    else if (k == 2)
        asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x));
    else
        asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
template <int K> __global__ void chains32(float *out, float seed)
{
    float v[kChains];
    for (int c = 0; c < kChains; c++)
        v[c] = seed * (float)(threadIdx.x + c);
    for (int i = 0; i < kIters; i++)
#pragma unroll
        for (int c = 0; c < kChains; c++)
            v[c] = op32(K, v[c]);
    float s = 0.f;
    for (int c = 0; c < kChains; c++)
        s += v[c];
    if (s == 12345.f) /* never: keeps the chains alive */
        out[0] = s;
}
template <int K> __global__ void chains16(unsigned *out, unsigned seed)
{
    unsigned v[kChains];
    for (int c = 0; c < kChains; c++)
        v[c] = seed ^ (threadIdx.x + c);
    for (int i = 0; i < kIters; i++)
#pragma unroll
        for (int c = 0; c < kChains; c++)
            v[c] = op16(K, v[c]);
    unsigned s = 0;
    for (int c = 0; c < kChains; c++)
        s ^= v[c];
    if (s == 12345u)
        out[0] = s;
}

int main(void)
{
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    float *out;
    CK(cudaMalloc(&out, 64));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int blocks = sms * 8, threads = 256;
    const double instr = (double)blocks * threads * kIters * kChains;
    static const char *names[] = {"tanh f32", "2^x f32", "tanh f16x2", "tanh bf16x2",
                                  "2^x f16x2", "2^x bf16x2"};
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 6; k++) {
            CK(cudaEventRecord(e0));
            switch (k) {
            case 0: chains32<0><<<blocks, threads>>>(out, 1e-3f); break;
            case 1: chains32<1><<<blocks, threads>>>(out, 1e-3f); break;
            case 2: chains16<0><<<blocks, threads>>>((unsigned *)out, 0x3c003c00u); break;
            case 3: chains16<1><<<blocks, threads>>>((unsigned *)out, 0x3f803f80u); break;
            case 4: chains16<2><<<blocks, threads>>>((unsigned *)out, 0x3c003c00u); break;
            default: chains16<3><<<blocks, threads>>>((unsigned *)out, 0x3f803f80u); break;
            }
            CK(cudaGetLastError());
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0.f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double elems = k < 2 ? instr : 2 * instr;
            if (round == 1)
                printf("%-12s %8.3f ms  %8.1f G ops/s  %8.1f G elements/s\n", names[k], ms,
                       instr / ms / 1e6, elems / ms / 1e6);
        }
    CK(cudaFree(out));
    return 0;
}
