/* SPDX-License-Identifier: MIT */
/* kernels/runtime/cuda_alloc.cu - the caching device allocator and the copies of
 * lib/cuda_backend.h.
 *
 * Blocks are rounded up (512 B granularity below 1 MiB, 2 MiB above) and
 * kept in a free list per rounded size when released; a request takes a
 * free block of exactly its rounded size, else calls cudaMalloc. Exact
 * match makes the cache converge in one step: a training step repeats the
 * same sequence of sizes (kernels size their scratch by shapes, never by
 * data), so the second step finds every block the first one made, and
 * cudaMalloc is no longer called (fg_cuda_memory_get_stats counts the
 * calls; a test asserts it). A best-fit policy that lets a small request
 * take a larger free block was measured to need two more warm-up steps:
 * which block a request gets then depends on the pool's history.
 * Single-stream reuse needs no events: the next user of a block is
 * enqueued on the context stream after every kernel that used it before
 * (fg_cuda_set_stream drains the old stream before switching). */
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

#include "device.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "flashgrad/cuda.h"

namespace {
std::mutex g_mu;
std::map<size_t, std::vector<void *>> g_free; /* block size -> blocks */
std::unordered_map<void *, size_t> g_live;    /* block -> its size */
const bool g_trace = getenv("FG_CUDA_ALLOC_TRACE") != nullptr;
fg_cuda_memory_stats g_st;

size_t round_size(size_t b)
{
    if (b == 0)
        b = 1;
    const size_t small = 512, big = 2u << 20;
    return b < (1u << 20) ? (b + small - 1) / small * small
                          : (b + big - 1) / big * big;
}

/* Gives every free block back to the driver (caller holds g_mu). */
fg_status release_free_blocks(void)
{
    for (auto &kv : g_free) {
        for (void *p : kv.second) {
            FG_CUDA_TRY(cudaFree(p));
            g_st.device_frees++;
            g_st.cached_bytes -= (int64_t)kv.first;
        }
        kv.second.clear();
    }
    return FG_OK;
}
} // namespace

extern "C" fg_status fg_cuda_mem_alloc(size_t bytes, void **out)
{
    const size_t sz = round_size(bytes);
    std::lock_guard<std::mutex> lock(g_mu);
    g_st.requests++;
    auto it = g_free.find(sz);
    if (it != g_free.end() && !it->second.empty()) {
        *out = it->second.back();
        it->second.pop_back();
    } else {
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, sz);
        if (e == cudaErrorMemoryAllocation) {
            /* Out of memory: return the cache to the driver and retry once,
             * after the stream no longer uses any of it. */
            (void)cudaGetLastError();
            FG_CUDA_TRY(cudaStreamSynchronize(fg_cuda_stream()));
            FG_TRY(release_free_blocks());
            e = cudaMalloc(&p, sz);
        }
        if (e != cudaSuccess)
            return fg_cuda_status(e, "cudaMalloc", __FILE__, __LINE__);
        g_st.device_mallocs++;
        g_st.cached_bytes += (int64_t)sz;
        if (g_trace) /* FG_CUDA_ALLOC_TRACE=1: see where a cache miss is */
            fprintf(stderr, "flashgrad: cudaMalloc %zu bytes (request %zu, "
                            "%llu so far)\n", sz, bytes,
                    (unsigned long long)g_st.device_mallocs);
        *out = p;
    }
    g_live[*out] = sz;
    g_st.live_bytes += (int64_t)sz;
    if (g_st.live_bytes > g_st.peak_live_bytes)
        g_st.peak_live_bytes = g_st.live_bytes;
    return FG_OK;
}

extern "C" void fg_cuda_mem_free(void *p, size_t bytes)
{
    if (!p)
        return;
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_live.find(p);
    /* the recorded size (a best-fit block may exceed the request) */
    const size_t sz = it != g_live.end() ? it->second : round_size(bytes);
    if (it != g_live.end())
        g_live.erase(it);
    g_free[sz].push_back(p);
    g_st.live_bytes -= (int64_t)sz;
}

extern "C" fg_status fg_cuda_mem_alloc_persistent(size_t bytes, void **out)
{
    FG_CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
    std::lock_guard<std::mutex> lock(g_mu);
    g_st.device_mallocs++;
    return FG_OK;
}

extern "C" void fg_cuda_mem_free_persistent(void *p)
{
    if (!p)
        return;
    (void)cudaFree(p); /* synchronises; only at teardown or a resize */
    std::lock_guard<std::mutex> lock(g_mu);
    g_st.device_frees++;
}

extern "C" fg_status fg_cuda_memory_get_stats(fg_cuda_memory_stats *st)
{
    if (!st)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "st is NULL");
    std::lock_guard<std::mutex> lock(g_mu);
    *st = g_st;
    return FG_OK;
}

extern "C" fg_status fg_cuda_memory_reset_peak(void)
{
    std::lock_guard<std::mutex> lock(g_mu);
    g_st.peak_live_bytes = g_st.live_bytes;
    return FG_OK;
}

extern "C" fg_status fg_cuda_empty_cache(void)
{
    std::lock_guard<std::mutex> lock(g_mu);
    FG_CUDA_TRY(cudaStreamSynchronize(fg_cuda_stream()));
    return release_free_blocks();
}

/* ---- copies ---------------------------------------------------------- */

extern "C" fg_status fg_cuda_memcpy_h2d(void *dst, const void *src,
                                        size_t bytes)
{
    if (!bytes)
        return FG_OK;
    /* From pageable memory the call returns once the source is staged. */
    FG_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                fg_cuda_stream()));
    return FG_OK;
}

extern "C" fg_status fg_cuda_memcpy_d2h(void *dst, const void *src,
                                        size_t bytes)
{
    if (!bytes)
        return FG_OK;
    FG_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                                fg_cuda_stream()));
    FG_CUDA_TRY(cudaStreamSynchronize(fg_cuda_stream()));
    return FG_OK;
}

extern "C" fg_status fg_cuda_memcpy_d2d(void *dst, const void *src,
                                        size_t bytes)
{
    if (!bytes)
        return FG_OK;
    FG_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                fg_cuda_stream()));
    return FG_OK;
}

extern "C" fg_status fg_cuda_memset_zero(void *dst, size_t bytes)
{
    if (!bytes)
        return FG_OK;
    FG_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, fg_cuda_stream()));
    return FG_OK;
}
