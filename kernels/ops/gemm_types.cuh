/* SPDX-License-Identifier: MIT */
/* kernels/ops/gemm_types.cuh - the storage and compute types of a flashgrad
 * GEMM in cuBLAS's terms, shared by gemm_cuda.cu (cuBLAS) and gemm_lt.cu
 * (cuBLASLt) so both products compute alike: fp64 in fp64, fp32 in fp32
 * (TF32 only with fg_cuda_set_allow_tf32), fp16/bf16 accumulating in fp32. */
#ifndef FG_KERNELS_OPS_GEMM_TYPES_CUH
#define FG_KERNELS_OPS_GEMM_TYPES_CUH

#include <cublas_v2.h>

#include "kernels/runtime/cuda_context.h"

/* Any dtype other than fp64/fp32/fp16 is taken as bf16 (callers check). */
static inline void fg_gemm_types(fg_dtype dt, cudaDataType *ty,
                                 cublasComputeType_t *ct)
{
    switch (dt) {
    case FG_FP64: *ty = CUDA_R_64F; *ct = CUBLAS_COMPUTE_64F; break;
    case FG_FP32:
        *ty = CUDA_R_32F;
        *ct = fg_cuda_tf32_allowed() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                     : CUBLAS_COMPUTE_32F;
        break;
    case FG_FP16: *ty = CUDA_R_16F; *ct = CUBLAS_COMPUTE_32F; break;
    default: *ty = CUDA_R_16BF; *ct = CUBLAS_COMPUTE_32F; break;
    }
}

#endif /* FG_KERNELS_OPS_GEMM_TYPES_CUH */
