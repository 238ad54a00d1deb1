/* SPDX-License-Identifier: MIT */
/* kernels/runtime/dtype_access.cuh - device load/store of one element of a
 * buffer whose dtype is known only at run time (fp32, fp64, fp16, bf16),
 * converted to and from the arithmetic type A. For kernels that mix
 * operand dtypes (the attention merge, ring attention's accumulators);
 * the branch is uniform across a warp. */
#ifndef FG_KERNELS_RUNTIME_DTYPE_ACCESS_CUH
#define FG_KERNELS_RUNTIME_DTYPE_ACCESS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashgrad/types.h"

namespace fg {

template <class A>
__device__ __forceinline__ A ld_dt(const void *p, fg_dtype dt, long long i)
{
    switch (dt) {
    case FG_FP64: return (A)((const double *)p)[i];
    case FG_FP16: return (A)__half2float(((const __half *)p)[i]);
    case FG_BF16: return (A)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return (A)((const float *)p)[i];
    }
}

/* Rounds to nearest even for fp16/bf16. */
template <class A>
__device__ __forceinline__ void st_dt(void *p, fg_dtype dt, long long i, A x)
{
    switch (dt) {
    case FG_FP64: ((double *)p)[i] = (double)x; break;
    case FG_FP16: ((__half *)p)[i] = __float2half_rn((float)x); break;
    case FG_BF16:
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)x);
        break;
    default: ((float *)p)[i] = (float)x; break;
    }
}

} // namespace fg

#endif /* FG_KERNELS_RUNTIME_DTYPE_ACCESS_CUH */
