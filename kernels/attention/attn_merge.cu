/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_merge.cu - fg_attention_merge on CUDA: one warp per
 * query row reads every part's (m, l), forms the weights and streams the d
 * columns of the parts' O. Operands may each be fp32, fp64, fp16 or bf16
 * (the statistics fp32, or fp64 with fp64 O); arithmetic in fp64 when some
 * operand is fp64, else fp32. Validation is done by
 * lib/attention/attention_merge.c. */
#include <cuda_runtime.h>

#include "lib/attention/attention_merge.h"
#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/dtype_access.cuh"

namespace {

using fg::ld_dt;
using fg::st_dt;

/* Parts per launch: the arguments travel by value (kernel parameter
 * space), more parts are folded in by further launches. */
constexpr int kMaxParts = 16;
constexpr int kWarps = 4;

struct MergeArgs {
    int n;
    fg_attn_merge_operand parts[kMaxParts];
    fg_attn_merge_operand out;
    long long Nq, H, d, rows;
};

template <class A> __device__ __forceinline__ A ex(A x);
template <> __device__ __forceinline__ float ex<float>(float x)
{
    return expf(x);
}
template <> __device__ __forceinline__ double ex<double>(double x)
{
    return exp(x);
}

template <class A> __global__ void merge_kernel(const MergeArgs a)
{
    const int lane = threadIdx.x & 31;
    const long long r =
        (long long)blockIdx.x * kWarps + (long long)(threadIdx.x >> 5);
    if (r >= a.rows)
        return; /* whole warp */
    const long long i = r % a.Nq, bh = r / a.Nq;
    const long long b = bh / a.H, h = bh % a.H;
    A w[kMaxParts];
    A mx = -(A)INFINITY;
    bool poison = false; /* a NaN part: the row is NaN (attention_merge.c) */
    for (int k = 0; k < a.n; k++) {
        const A lk = ld_dt<A>(a.parts[k].l, a.parts[k].st_dtype, r);
        const A mk = ld_dt<A>(a.parts[k].m, a.parts[k].st_dtype, r);
        poison |= !(lk >= 0) || isnan(mk) || (lk > 0 && mk == (A)INFINITY);
        w[k] = lk > 0 ? mk : -(A)INFINITY; /* m of the parts that see keys */
        if (lk > 0 && mk > mx)
            mx = mk;
    }
    A L = 0;
    for (int k = 0; k < a.n; k++) {
        const A lk = ld_dt<A>(a.parts[k].l, a.parts[k].st_dtype, r);
        w[k] = w[k] == -(A)INFINITY ? (A)0 : lk * ex<A>(w[k] - mx);
        L += w[k];
    }
    const A inv = L > 0 ? (A)1 / L : (A)0;
    for (int k = 0; k < a.n; k++)
        w[k] *= inv;
    const fg_attn_merge_operand &y = a.out;
    for (long long c = lane; c < a.d; c += 32) {
        A acc = 0;
        for (int k = 0; k < a.n; k++) {
            const fg_attn_merge_operand &x = a.parts[k];
            if (w[k] != 0)
                acc += w[k] * ld_dt<A>(x.o, x.o_dtype,
                                    b * x.sb + i * x.ss + h * x.sh + c);
        }
        st_dt<A>(y.o, y.o_dtype, b * y.sb + i * y.ss + h * y.sh + c,
                 poison ? (A)NAN : acc);
    }
    /* Every lane has read the row's statistics before they are replaced
     * (the output may be one of the parts). */
    __syncwarp();
    if (lane == 0) {
        st_dt<A>(y.m, y.st_dtype, r, poison ? (A)NAN : L > 0 ? mx : -(A)INFINITY);
        st_dt<A>(y.l, y.st_dtype, r, poison ? (A)NAN : L);
    }
}

} // namespace

extern "C" fg_status fg_attn_cuda_merge(const fg_attn_merge_problem *mp)
{
    cudaStream_t stream = (cudaStream_t)mp->stream;
    MergeArgs a;
    a.Nq = mp->Nq;
    a.H = mp->H;
    a.d = mp->d;
    a.rows = mp->B * mp->H * mp->Nq;
    a.out = mp->out;
    const long long blocks = (a.rows + kWarps - 1) / kWarps;
    if (blocks > 0x7fffffffLL)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "fg_attention_merge: %lld rows exceed one CUDA grid",
                        a.rows);
    /* A part the output aliases is read by the first launch, before any
     * launch writes the output. */
    int first = 0;
    for (int k = 0; k < mp->n; k++)
        if (mp->parts[k].o == mp->out.o || mp->parts[k].m == mp->out.m)
            first = k;
    int done = 0;
    while (done < mp->n) {
        /* Later launches fold the output so far in as their part 0. */
        int n = 0;
        if (done > 0)
            a.parts[n++] = mp->out;
        while (n < kMaxParts && done < mp->n) {
            const int k = done == 0 ? first : done <= first ? done - 1 : done;
            a.parts[n++] = mp->parts[k];
            done++;
        }
        a.n = n;
        if (mp->acc_fp64)
            merge_kernel<double><<<(unsigned)blocks, 32 * kWarps, 0, stream>>>(a);
        else
            merge_kernel<float><<<(unsigned)blocks, 32 * kWarps, 0, stream>>>(a);
        FG_CUDA_TRY_LAUNCH();
    }
    return FG_OK;
}
