/* SPDX-License-Identifier: MIT */
/* kernels/runtime/cuda_context.h - the process-wide CUDA context every kernel
 * launch and library call goes through (C++/CUDA side): the stream, the
 * cuBLAS handle and the TF32 opt-ins (GEMMs, attention). Defined in
 * kernels/cuda_context.cu. */
#ifndef FG_KERNELS_CUDA_CONTEXT_H
#define FG_KERNELS_CUDA_CONTEXT_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "lib/core/error.h"

/* The stream all flashgrad work is enqueued on (fg_cuda_set_stream();
 * default: the legacy default stream, 0). */
cudaStream_t fg_cuda_stream(void);
/* The context's cuBLAS handle, created on first use and bound to the
 * current stream; FG_ERR_CUDA with cuBLAS's message if creation fails. */
fg_status fg_cuda_cublas(cublasHandle_t *out);
/* The cuBLAS handle's workspace (32 MiB), creating the handle if needed:
 * cuBLASLt calls share it, as every GEMM is enqueued on the one stream
 * and so never overlaps another. */
fg_status fg_cuda_gemm_workspace(void **ws, size_t *bytes);
/* 1 when the user allowed TF32 tensor-core math for fp32 GEMMs. */
int fg_cuda_tf32_allowed(void);
/* 1 when the user allowed TF32 tensor cores for fp32 attention
 * (fg_cuda_set_attention_allow_tf32). */
int fg_cuda_attention_tf32_allowed(void);
/* Tells compute-sanitizer that [p, p + bytes) holds written data from
 * this point of the context stream on (NVTX's memory API; a no-op unless
 * a tool is attached). For outputs of cuBLAS/cuBLASLt kernels
 * whose stores initcheck does not see (Hopper's nvjet GEMMs: every
 * element of their C reported uninitialized although each one is written,
 * scripts/initcheck-gemm-probe.cu), so that initcheck stays meaningful
 * for the rest of the library. Never for memory our own kernels write. */
void fg_cuda_mark_written(const void *p, size_t bytes);
/* cuBLAS status -> fg_status with file/line (never exits). */
fg_status fg_cublas_status(cublasStatus_t s, const char *what,
                           const char *file, int line);
#define FG_CUBLAS_TRY(call)                                                 \
    do {                                                                    \
        cublasStatus_t fg_cb_s_ = (call);                                   \
        if (fg_cb_s_ != CUBLAS_STATUS_SUCCESS)                              \
            return fg_cublas_status(fg_cb_s_, #call, __FILE__, __LINE__);   \
    } while (0)

/* Grid size for n work items of `block` threads each, capped so a
 * grid-stride loop covers the rest. */
static inline unsigned fg_cuda_grid(int64_t n, int block)
{
    int64_t g = (n + block - 1) / block;
    if (g < 1)
        g = 1;
    return (unsigned)(g > 65535 * 8 ? 65535 * 8 : g);
}

#endif /* FG_KERNELS_CUDA_CONTEXT_H */
