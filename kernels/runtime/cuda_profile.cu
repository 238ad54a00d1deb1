/* SPDX-License-Identifier: MIT */
/* kernels/runtime/cuda_profile.cu - the CUDA events of the profiler
 * (kernels/runtime/profile.c): a pool grown on demand and kept until the
 * region ends. */
#include <cuda_runtime.h>

#include <vector>

#include "cuda_check.h"
#include "cuda_context.h"
#include "profile.h"

static std::vector<cudaEvent_t> g_events;

extern "C" fg_status fg_prof_cuda_record(int i)
{
    if (i < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "profile event %d", i);
    try {
        while ((int)g_events.size() <= i) {
            cudaEvent_t e;
            FG_CUDA_TRY(cudaEventCreate(&e));
            g_events.push_back(e);
        }
    } catch (...) {
        return fg_error(FG_ERR_OUT_OF_MEMORY, "profile events");
    }
    FG_CUDA_TRY(cudaEventRecord(g_events[(size_t)i], fg_cuda_stream()));
    return FG_OK;
}

extern "C" fg_status fg_prof_cuda_elapsed(int a, int b, float *ms)
{
    if (a < 0 || b < 0 || a >= (int)g_events.size() ||
        b >= (int)g_events.size())
        return fg_error(FG_ERR_INVALID_ARGUMENT, "profile events %d, %d",
                        a, b);
    FG_CUDA_TRY(cudaEventSynchronize(g_events[(size_t)b]));
    FG_CUDA_TRY(cudaEventElapsedTime(ms, g_events[(size_t)a],
                                     g_events[(size_t)b]));
    return FG_OK;
}

extern "C" void fg_prof_cuda_release(void)
{
    for (cudaEvent_t e : g_events)
        cudaEventDestroy(e); /* teardown: nothing to report to */
    g_events.clear();
}
