/* SPDX-License-Identifier: MIT */
/* kernels/runtime/cuda_context.cu - the process-wide CUDA context: the stream all
 * work goes to, the cuBLAS handle (with a workspace from the caching
 * allocator, so cuBLAS allocates nothing per call), the TF32 opt-in, and the
 * public functions of flashgrad/cuda.h that manage them. */
#include <mutex>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExtMemCudaRt.h>

#include "device.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "flashgrad/cuda.h"

namespace {
std::mutex g_mu;
cudaStream_t g_stream = 0;
cublasHandle_t g_cublas = nullptr;
void *g_cublas_ws = nullptr;
int g_tf32 = 0;
/* fp32 attention on TF32 tensor cores (its own switch, like cuDNN's). */
int g_attn_tf32 = 0;
/* cuBLAS's recommended workspace on Hopper is 32 MiB; smaller GPUs need
 * less, but one fixed size keeps the memory plan simple. */
constexpr size_t kCublasWorkspace = 32u << 20;
} // namespace

cudaStream_t fg_cuda_stream(void) { return g_stream; }

int fg_cuda_tf32_allowed(void) { return g_tf32; }

int fg_cuda_attention_tf32_allowed(void) { return g_attn_tf32; }

void fg_cuda_mark_written(const void *p, size_t bytes)
{
    if (!p || !bytes)
        return;
    static const nvtxDomainHandle_t dom = nvtxDomainCreateA("flashgrad");
    nvtxMemVirtualRangeDesc_t range = {};
    range.size = bytes;
    range.ptr = p;
    nvtxMemMarkInitializedBatch_t batch = {};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof batch;
    batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    batch.regionDescCount = 1;
    batch.regionDescElementSize = sizeof range;
    batch.regionDescElements = &range;
    nvtxMemCudaMarkInitialized(dom, g_stream, 0, &batch);
}

fg_status fg_cublas_status(cublasStatus_t s, const char *what,
                           const char *file, int line)
{
    fg_status st = s == CUBLAS_STATUS_ALLOC_FAILED ? FG_ERR_OUT_OF_MEMORY
                   : s == CUBLAS_STATUS_NOT_SUPPORTED ? FG_ERR_UNSUPPORTED
                                                      : FG_ERR_CUDA;
    return fg_error(st, "%s:%d: %s failed: %s (%s)", file, line, what,
                    cublasGetStatusName(s), cublasGetStatusString(s));
}

fg_status fg_cuda_cublas(cublasHandle_t *out)
{
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_cublas) {
        cublasHandle_t h;
        FG_CUBLAS_TRY(cublasCreate(&h));
        void *ws = nullptr;
        fg_status s = fg_cuda_mem_alloc_persistent(kCublasWorkspace, &ws);
        if (s != FG_OK) {
            cublasDestroy(h);
            return s;
        }
        cublasStatus_t cs = cublasSetWorkspace(h, ws, kCublasWorkspace);
        if (cs == CUBLAS_STATUS_SUCCESS)
            cs = cublasSetStream(h, g_stream);
        if (cs != CUBLAS_STATUS_SUCCESS) {
            fg_cuda_mem_free_persistent(ws);
            cublasDestroy(h);
            return fg_cublas_status(cs, "cublas setup", __FILE__, __LINE__);
        }
        g_cublas = h;
        g_cublas_ws = ws;
    }
    *out = g_cublas;
    return FG_OK;
}

fg_status fg_cuda_gemm_workspace(void **ws, size_t *bytes)
{
    cublasHandle_t h;
    FG_TRY(fg_cuda_cublas(&h));
    std::lock_guard<std::mutex> lock(g_mu);
    *ws = g_cublas_ws;
    *bytes = kCublasWorkspace;
    return FG_OK;
}

extern "C" fg_status fg_cuda_set_stream(void *stream)
{
    std::lock_guard<std::mutex> lock(g_mu);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (s == g_stream)
        return FG_OK;
    /* Cached blocks were last used on the old stream: drain it so the new
     * stream may reuse them without events. */
    FG_CUDA_TRY(cudaStreamSynchronize(g_stream));
    if (g_cublas)
        FG_CUBLAS_TRY(cublasSetStream(g_cublas, s));
    g_stream = s;
    return FG_OK;
}

extern "C" void *fg_cuda_get_stream(void) { return g_stream; }

extern "C" fg_status fg_cuda_synchronize(void)
{
    FG_CUDA_TRY(cudaStreamSynchronize(g_stream));
    return FG_OK;
}

extern "C" fg_status fg_cuda_set_allow_tf32(int allow)
{
    g_tf32 = allow != 0;
    return FG_OK;
}

extern "C" fg_status fg_cuda_set_attention_allow_tf32(int allow)
{
    g_attn_tf32 = allow != 0;
    return FG_OK;
}

extern "C" int fg_cuda_get_attention_allow_tf32(void) { return g_attn_tf32; }
