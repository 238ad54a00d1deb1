/* SPDX-License-Identifier: MIT */
/* flashgrad/types.h - element types and devices shared by every layer. */
#ifndef FLASHGRAD_TYPES_H
#define FLASHGRAD_TYPES_H

#include <stddef.h>
#include <stdint.h>
#include "flashgrad/export.h"

FG_BEGIN_DECLS

typedef enum fg_dtype {
    FG_FP32 = 0,
    FG_FP64 = 1,
    FG_FP16 = 2, /* IEEE binary16 storage (GPU kernels) */
    FG_BF16 = 3  /* bfloat16 storage (GPU kernels) */
} fg_dtype;

typedef enum fg_device {
    FG_DEVICE_CPU = 0,
    FG_DEVICE_CUDA = 1
} fg_device;

/* Size in bytes of one element (0 for an unknown dtype). */
FG_API size_t fg_dtype_size(fg_dtype dt);
/* "fp32", "fp64", "fp16", "bf16" or "?". */
FG_API const char *fg_dtype_name(fg_dtype dt);
/* "cpu", "cuda" or "?". */
FG_API const char *fg_device_name(fg_device dev);

/* Library version, "MAJOR.MINOR.PATCH". */
FG_API const char *fg_version(void);

/* CPU threads for flashgrad's OpenMP loops (n <= 0 keeps the OpenMP
 * default; n is capped at the processor count). flashgrad parallelises
 * around its matrix products, so this also pins an OpenBLAS backend to one
 * thread: its spinning worker threads would otherwise compete with ours for
 * the same cores (measured: 2 OpenMP threads on 2 cores ran the toy GPT
 * step 2.7x slower with OpenBLAS threads on). */
FG_API void fg_set_num_threads(int n);

/* Deterministic algorithms everywhere (like
 * torch.use_deterministic_algorithms): the CUDA attention backward then
 * computes dQ without atomics, so GPU training steps are bitwise
 * reproducible (a little slower). Every other flashgrad kernel is
 * deterministic anyway. Process-wide; off by default. */
FG_API void fg_set_deterministic(int on);
FG_API int fg_get_deterministic(void);

/* 1 if CUDA is usable now: the build has CUDA, its backend module is
 * installed and loads, a driver and a GPU are present. Else 0, and
 * fg_last_error() says which of those is missing. Never fails. */
FG_API int fg_cuda_available(void);

FG_END_DECLS

#endif /* FLASHGRAD_TYPES_H */
