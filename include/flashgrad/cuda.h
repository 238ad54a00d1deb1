/* SPDX-License-Identifier: MIT */
/* flashgrad/cuda.h - the CUDA context: stream, memory, TF32, device copies.
 *
 * Tensors created with FG_DEVICE_CUDA live in device memory; every op of
 * autograd.h accepts them (all inputs of one op on one device) and runs on
 * the GPU with no host round-trip. Work is enqueued on one stream, the
 * context stream, and is asynchronous: functions that hand values to the
 * host (fg_tensor_item, fg_tensor_copy_to_host) wait for it.
 *
 * Device memory comes from a caching allocator: released blocks are kept
 * for reuse, so a training loop that repeats the same step calls cudaMalloc
 * only while the first step runs (fg_cuda_memory_get_stats counts the
 * calls). fg_cuda_empty_cache() gives cached blocks back to the driver.
 *
 * When CUDA cannot be used - a build without CUDA, or the CUDA backend
 * module (libflashgrad-cuda.so, doc/design.md 8.1) not installed or not
 * loadable - these functions return FG_ERR_UNSUPPORTED with the reason
 * (fg_cuda_get_stream returns NULL, fg_cuda_memory_get_stats zeroes *st). */
#ifndef FLASHGRAD_CUDA_H
#define FLASHGRAD_CUDA_H

#include <stdint.h>

#include "flashgrad/export.h"
#include "flashgrad/status.h"
#include "flashgrad/tensor.h"
#include "flashgrad/types.h"

FG_BEGIN_DECLS

/* Makes `stream` (a cudaStream_t; NULL: the legacy default stream) the
 * context stream. Waits for the work on the old stream first, so blocks
 * cached by the allocator are safe to reuse on the new one. */
FG_API fg_status fg_cuda_set_stream(void *stream);
/* The context stream (NULL: the default stream). */
FG_API void *fg_cuda_get_stream(void);
/* Waits for all work enqueued on the context stream. */
FG_API fg_status fg_cuda_synchronize(void);
/* Lets fp32 GEMMs use TF32 tensor cores (10-bit mantissa inputs; off by
 * default, as in PyTorch since 1.12). */
FG_API fg_status fg_cuda_set_allow_tf32(int allow);
/* Lets fp32 attention (fg_attention_forward/backward on CUDA) run on TF32
 * tensor cores: Q, K, V, dO and the intermediate P and dS are rounded to
 * a 10-bit mantissa before each product (fp32 accumulation), instead of
 * strict fp32 (the default: 3xTF32 on the same tensor cores, or SIMT
 * kernels, attention.h), at an error of about 2^-11
 * relative per product term (attention.h states the bound).
 * Process-wide, off by default, and separate from fg_cuda_set_allow_tf32
 * (like PyTorch's cudnn.allow_tf32 next to matmul.allow_tf32). Takes
 * effect at the next attention call. */
FG_API fg_status fg_cuda_set_attention_allow_tf32(int allow);
/* 1 when fp32 attention may use TF32 (the switch above), else 0; 0 too
 * when CUDA cannot be used. */
FG_API int fg_cuda_get_attention_allow_tf32(void);
/* Times cuBLASLt's candidate algorithms for each new GEMM shape of the
 * fused linear layers (fg_linear, fg_mlp, the nn layers under autocast)
 * on its first call and keeps the fastest (like PyTorch's
 * cudnn.benchmark): 0-13% faster GEMMs on an H200, but the choice, and so
 * the results' last bits, may differ between processes. Off by default
 * (the heuristic's first answer: reproducible); the environment variable
 * FG_GEMM_AUTOTUNE=1 turns it on too; fg_set_deterministic(1) keeps it
 * off whatever both say. Shapes already chosen keep their algorithm. */
FG_API fg_status fg_cuda_set_gemm_autotune(int on);
/* 1 when the switch above (or FG_GEMM_AUTOTUNE=1) is on, else 0; 0 too
 * when CUDA cannot be used. */
FG_API int fg_cuda_get_gemm_autotune(void);

typedef struct fg_cuda_memory_stats {
    uint64_t device_mallocs; /* cudaMalloc calls made by the allocator */
    uint64_t device_frees;   /* cudaFree calls (empty_cache) */
    uint64_t requests;       /* allocations served (cached or not) */
    int64_t live_bytes;      /* handed out and not yet released */
    int64_t peak_live_bytes; /* since start or the last reset_peak */
    int64_t cached_bytes;    /* held from the driver, live or free */
} fg_cuda_memory_stats;
FG_API fg_status fg_cuda_memory_get_stats(fg_cuda_memory_stats *st);
FG_API fg_status fg_cuda_memory_reset_peak(void);
/* Returns every free cached block to the driver. */
FG_API fg_status fg_cuda_empty_cache(void);

/* A new contiguous copy of t on device `dev` (same dtype; not recorded by
 * autograd, no grad). */
FG_API fg_status fg_tensor_to(const fg_tensor *t, fg_device dev,
                              fg_tensor **out);

FG_END_DECLS

#endif /* FLASHGRAD_CUDA_H */
