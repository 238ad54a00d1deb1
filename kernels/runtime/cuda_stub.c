/* SPDX-License-Identifier: MIT */
/* kernels/runtime/cuda_stub.c - the CUDA runtime entry points of a build
 * without CUDA (the attention ones are in kernels/attention/attn_stub.c):
 * each reports FG_ERR_UNSUPPORTED, so callers get a status, not a link error. */
#include <string.h>

#include "flashgrad/cuda.h"
#include "device.h"
#include "profile.h"
#include "lib/core/error.h"

int fg_cuda_available(void)
{
    FG_NO_CUDA("fg_cuda_available");
    return 0;
}

fg_status fg_cuda_check_pointer(const void *ptr, const char *what)
{
    (void)ptr;
    (void)what;
    return FG_NO_CUDA("device pointer check");
}

fg_status fg_cuda_set_stream(void *stream)
{
    (void)stream;
    return FG_NO_CUDA("fg_cuda_set_stream");
}

void *fg_cuda_get_stream(void) { return NULL; }

fg_status fg_cuda_synchronize(void) { return FG_NO_CUDA("fg_cuda_synchronize"); }

fg_status fg_cuda_set_allow_tf32(int allow)
{
    (void)allow;
    return FG_NO_CUDA("fg_cuda_set_allow_tf32");
}

fg_status fg_cuda_set_attention_allow_tf32(int allow)
{
    (void)allow;
    return FG_NO_CUDA("fg_cuda_set_attention_allow_tf32");
}

int fg_cuda_get_attention_allow_tf32(void) { return 0; }

fg_status fg_cuda_set_gemm_autotune(int on)
{
    (void)on;
    return FG_NO_CUDA("fg_cuda_set_gemm_autotune");
}

int fg_cuda_get_gemm_autotune(void) { return 0; }

fg_status fg_cuda_memory_get_stats(fg_cuda_memory_stats *st)
{
    if (st)
        memset(st, 0, sizeof *st);
    return FG_NO_CUDA("fg_cuda_memory_get_stats");
}

fg_status fg_cuda_memory_reset_peak(void)
{
    return FG_NO_CUDA("fg_cuda_memory_reset_peak");
}

fg_status fg_cuda_empty_cache(void) { return FG_NO_CUDA("fg_cuda_empty_cache"); }

fg_status fg_prof_cuda_record(int i)
{
    (void)i;
    return FG_NO_CUDA("fg_profile_begin");
}

fg_status fg_prof_cuda_elapsed(int a, int b, float *ms)
{
    (void)a;
    (void)b;
    *ms = 0;
    return FG_NO_CUDA("fg_profile_end");
}

void fg_prof_cuda_release(void) {}
