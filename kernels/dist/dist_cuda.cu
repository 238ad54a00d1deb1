/* SPDX-License-Identifier: MIT */
/* kernels/dist/dist_cuda.cu - the two device helpers of ring attention
 * (lib/dist/ring.c): a strided [B, S, H, d] copy (packing K/V for the ring,
 * writing dK/dV/dQ and the statistics back into the caller's layout) and a
 * converting accumulate dst += src (partial gradients into fp32 or fp64
 * accumulators). Both on the flashgrad context stream. */
#include <cuda_runtime.h>

#include "lib/dist/dist_internal.h"
#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/cuda_context.h"
#include "kernels/runtime/dtype_access.cuh"

namespace {

template <class E>
__global__ void copy4d_kernel(E *dst, long long db, long long ds, long long dh,
                              const E *src, long long sb, long long ss,
                              long long sh, long long S, long long H,
                              long long d, long long total)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
         e < total; e += (long long)gridDim.x * blockDim.x) {
        const long long x = e % d, r = e / d;
        const long long h = r % H, bs = r / H;
        const long long s = bs % S, b = bs / S;
        dst[b * db + s * ds + h * dh + x] = src[b * sb + s * ss + h * sh + x];
    }
}

template <class A>
__global__ void add_kernel(void *dst, fg_dtype ddt, const void *src,
                           fg_dtype sdt, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        fg::st_dt<A>(dst, ddt, i,
                     fg::ld_dt<A>(dst, ddt, i) + fg::ld_dt<A>(src, sdt, i));
    }
}

} // namespace

extern "C" fg_status fg_dist_cuda_copy4d(void *dst, const int64_t dst_str[3],
                                         const void *src,
                                         const int64_t src_str[3], int64_t B,
                                         int64_t S, int64_t Hh, int64_t d,
                                         size_t es)
{
    const long long total = (long long)(B * S * Hh * d);
    if (total == 0)
        return FG_OK;
    const int block = 256;
    const unsigned grid = fg_cuda_grid(total, block);
    cudaStream_t st = fg_cuda_stream();
#define FG_COPY4D(E)                                                        \
    copy4d_kernel<E><<<grid, block, 0, st>>>(                               \
        (E *)dst, dst_str[0], dst_str[1], dst_str[2], (const E *)src,       \
        src_str[0], src_str[1], src_str[2], S, Hh, d, total)
    switch (es) {
    case 2: FG_COPY4D(unsigned short); break;
    case 4: FG_COPY4D(float); break;
    case 8: FG_COPY4D(double); break;
    default:
        return fg_error(FG_ERR_INTERNAL, "copy4d: element size %zu", es);
    }
#undef FG_COPY4D
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

extern "C" fg_status fg_dist_cuda_add(void *dst, fg_dtype dst_dt,
                                      const void *src, fg_dtype src_dt,
                                      int64_t n)
{
    if (n == 0)
        return FG_OK;
    const int block = 256;
    const unsigned grid = fg_cuda_grid(n, block);
    cudaStream_t st = fg_cuda_stream();
    if (dst_dt == FG_FP64)
        add_kernel<double><<<grid, block, 0, st>>>(dst, dst_dt, src, src_dt, n);
    else
        add_kernel<float><<<grid, block, 0, st>>>(dst, dst_dt, src, src_dt, n);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}
