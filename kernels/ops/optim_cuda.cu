/* SPDX-License-Identifier: MIT */
/* kernels/ops/optim_cuda.cu - the optimizer on the GPU: one AdamW launch over
 * all parameters, and the global gradient norm with clipping.
 *
 * Multi-tensor layout: every tensor is cut into chunks of kChunk elements;
 * the launch has one block per chunk. A descriptor table in device memory
 * lists the tensors with the index of their first chunk, and each block
 * finds its tensor by binary search over that index. The table is cached
 * (host copy + device copy) and uploaded again only when it changes.
 *
 * AdamW arithmetic mirrors lib/train/optim.c's loop step by step: the same
 * double intermediates, the same rounding points to the storage type, and
 * explicit round-to-nearest intrinsics (__dmul_rn, __dadd_rn, ...) so nvcc
 * cannot contract a multiply-add into an FMA the CPU code does not do. The
 * result is bit-identical to the CPU for the same inputs.
 *
 * The norm is deterministic: each block sums its chunk's squares in fp64
 * in a fixed thread/tree order, one block then sums the per-chunk partials
 * in a fixed order; no atomics. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "lib/autograd/cuda_backend.h"
#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/cuda_context.h"
#include "lib/ops/cuda_ops_blas.h"

namespace {

constexpr int kBlock = 256;
constexpr int64_t kChunk = 4096; /* elements per block */
constexpr int kFinishBlock = 1024;

/* One tensor of the table. No padding (memcmp compares whole entries). */
struct Desc {
    void *p;         /* parameter (AdamW) */
    const void *g;   /* gradient */
    void *m, *v;     /* moments (AdamW) */
    long long numel;
    long long chunk0; /* global index of its first chunk */
    int dtype;
    int decay;
    void *lp;    /* the parameter's bf16/fp16 copy, or NULL (AdamW) */
    int lp_dtype;
    int pad;
};
static_assert(sizeof(Desc) == 72, "Desc must have no padding");

} // namespace

struct fg_cuda_optim_cache {
    Desc *host;  /* what the device copy holds */
    int n;       /* -1: nothing valid uploaded */
    void *dev;
    size_t dev_bytes;
};

namespace {

/* Makes the device table equal to d[0..n-1]; takes ownership of d. */
fg_status cache_upload(fg_cuda_optim_cache *c, Desc *d, int n)
{
    const size_t bytes = (size_t)n * sizeof(Desc);
    if (c->n == n && c->dev && memcmp(c->host, d, bytes) == 0) {
        free(d);
        return FG_OK;
    }
    c->n = -1;
    free(c->host);
    c->host = d;
    if (c->dev_bytes < bytes) {
        if (c->dev)
            fg_cuda_mem_free_persistent(c->dev);
        c->dev = nullptr;
        c->dev_bytes = 0;
        FG_TRY(fg_cuda_mem_alloc_persistent(bytes, &c->dev));
        c->dev_bytes = bytes;
    }
    /* Ordered after every launch that read the old table (one stream). */
    FG_TRY(fg_cuda_memcpy_h2d(c->dev, d, bytes));
    c->n = n;
    return FG_OK;
}

fg_status cache_get(fg_cuda_optim_cache **pc)
{
    if (!*pc) {
        fg_cuda_optim_cache *c =
            (fg_cuda_optim_cache *)calloc(1, sizeof(fg_cuda_optim_cache));
        if (!c)
            return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "optimizer table cache");
        c->n = -1;
        *pc = c;
    }
    return FG_OK;
}

/* The block's tensor: the last descriptor whose first chunk <= blockIdx. */
__device__ int find_desc(const Desc *d, int n)
{
    const long long b = blockIdx.x;
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (d[mid].chunk0 <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

struct Hp {
    double lr, b1, omb1, b2, omb2, eps, bc1, bc2, decay;
    const double *gscale; /* the clip factor on the device, or NULL (1) */
};

__device__ inline float to_t(double x, float *) { return __double2float_rn(x); }
__device__ inline double to_t(double x, double *) { return x; }
__device__ inline float sqrt_t(float x) { return __fsqrt_rn(x); }
/* The autocast copy of an updated value: through fp32, rounded to nearest
 * even, as fg_cast's kernel (cvt in ops_ew_common.cuh) does. */
__device__ inline void store_lowp(void *lp, int dt, long long j, double x)
{
    if (dt == FG_BF16)
        ((__nv_bfloat16 *)lp)[j] = __float2bfloat16_rn((float)x);
    else
        ((__half *)lp)[j] = __float2half_rn((float)x);
}
__device__ inline double sqrt_t(double x) { return __dsqrt_rn(x); }

/* lib/train/optim.c, per element (T = storage type, all else double):
 *   m = (T)(b1*m + (1-b1)*g)
 *   v = (T)(b2*v + (1-b2)*g*g)
 *   upd = (T)((m/bc1) / (sqrt((T)(v/bc2)) + eps))
 *   p = (T)(p*decay - lr*upd)
 * m and v are updated in place; returns the new p. */
template <typename T>
__device__ __forceinline__ T adamw_elem(T p, T g, T &m, T &v, double decay,
                                        double k, const Hp &h)
{
    if (k != 1.0) /* the clip's scaling, rounded as scale_range stores it */
        g = to_t(__dmul_rn((double)g, k), (T *)nullptr);
    const double gj = (double)g;
    const T mj = to_t(__dadd_rn(__dmul_rn(h.b1, (double)m), __dmul_rn(h.omb1, gj)),
                      (T *)nullptr);
    const T vj = to_t(__dadd_rn(__dmul_rn(h.b2, (double)v),
                                __dmul_rn(__dmul_rn(h.omb2, gj), gj)),
                      (T *)nullptr);
    m = mj;
    v = vj;
    const T den = sqrt_t(to_t(__ddiv_rn((double)vj, h.bc2), (T *)nullptr));
    const T upd = to_t(__ddiv_rn(__ddiv_rn((double)mj, h.bc1),
                                 __dadd_rn((double)den, h.eps)),
                       (T *)nullptr);
    return to_t(__dsub_rn(__dmul_rn((double)p, decay), __dmul_rn(h.lr, (double)upd)),
                (T *)nullptr);
}

/* 16 bytes of T at q (aligned) in one access. */
template <typename T> struct Vec16 {
    static constexpr int n = 16 / (int)sizeof(T);
    T e[n];
};
template <typename T> __device__ __forceinline__ Vec16<T> ld16(const T *q)
{
    const uint4 r = *reinterpret_cast<const uint4 *>(q);
    Vec16<T> o;
    memcpy(&o, &r, 16);
    return o;
}
template <typename T> __device__ __forceinline__ void st16(T *q, const Vec16<T> &o)
{
    uint4 r;
    memcpy(&r, &o, 16);
    *reinterpret_cast<uint4 *>(q) = r;
}

/* The range [begin, end) of one tensor. Where p, g, m, v (and the copy)
 * are aligned, each thread moves 16 bytes of each per step (4 floats or
 * 2 doubles) instead of one element: the same arithmetic per element, a
 * quarter of the load and store instructions; the rest one at a time. */
template <typename T>
__device__ void adamw_range(const Desc &d, long long begin, long long end,
                            double k, const Hp &h)
{
    T *p = (T *)d.p;
    const T *g = (const T *)d.g;
    T *m = (T *)d.m, *v = (T *)d.v;
    const double decay = d.decay ? h.decay : 1.0;
    constexpr int kV = Vec16<T>::n;
    const uintptr_t al = (uintptr_t)(p + begin) | (uintptr_t)(g + begin) |
                         (uintptr_t)(m + begin) | (uintptr_t)(v + begin);
    const bool vec = al % 16 == 0;
    long long j0 = begin;
    if (vec) {
        const long long nv = (end - begin) / kV;
        for (long long q = threadIdx.x; q < nv; q += blockDim.x) {
            const long long j = begin + q * kV;
            Vec16<T> pv = ld16(p + j), mv = ld16(m + j), vv = ld16(v + j);
            const Vec16<T> gv = ld16(g + j);
#pragma unroll
            for (int i = 0; i < kV; i++)
                pv.e[i] = adamw_elem(pv.e[i], gv.e[i], mv.e[i], vv.e[i], decay, k, h);
            st16(m + j, mv);
            st16(v + j, vv);
            st16(p + j, pv);
            if (d.lp)
#pragma unroll
                for (int i = 0; i < kV; i++)
                    store_lowp(d.lp, d.lp_dtype, j + i, (double)pv.e[i]);
        }
        j0 = begin + nv * kV;
    }
    for (long long j = j0 + threadIdx.x; j < end; j += blockDim.x) {
        T mj = m[j], vj = v[j];
        const T pj = adamw_elem(p[j], g[j], mj, vj, decay, k, h);
        m[j] = mj;
        v[j] = vj;
        p[j] = pj;
        if (d.lp)
            store_lowp(d.lp, d.lp_dtype, j, (double)pj);
    }
}

__global__ void adamw_kernel(const Desc *descs, int n, Hp h)
{
    __shared__ int s_i;
    if (threadIdx.x == 0)
        s_i = find_desc(descs, n);
    __syncthreads();
    const Desc d = descs[s_i];
    const long long begin = ((long long)blockIdx.x - d.chunk0) * kChunk;
    const long long end = begin + kChunk < d.numel ? begin + kChunk : d.numel;
    const double k = h.gscale ? *h.gscale : 1.0;
    if (k == 0.0) /* a skipped step (finish_kernel): nothing changes */
        return;
    if (d.dtype == FG_FP64)
        adamw_range<double>(d, begin, end, k, h);
    else
        adamw_range<float>(d, begin, end, k, h);
}

/* Sum of the block's values in a fixed order (warp tree, then warp 0). */
__device__ double block_sum(double x)
{
    __shared__ double warp_sums[32];
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_down_sync(0xffffffffu, x, o);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0)
        warp_sums[w] = x;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    x = threadIdx.x < nw ? warp_sums[threadIdx.x] : 0.0;
    if (w == 0)
        for (int o = 16; o > 0; o >>= 1)
            x += __shfl_down_sync(0xffffffffu, x, o);
    return x; /* valid in thread 0 */
}

template <typename T>
__device__ double sumsq_range(const T *g, long long begin, long long end)
{
    double acc = 0;
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) {
        const double x = (double)g[j];
        acc += x * x;
    }
    return acc;
}

__global__ void sumsq_kernel(const Desc *descs, int n, double *partials)
{
    __shared__ int s_i;
    if (threadIdx.x == 0)
        s_i = find_desc(descs, n);
    __syncthreads();
    const Desc d = descs[s_i];
    const long long begin = ((long long)blockIdx.x - d.chunk0) * kChunk;
    const long long end = begin + kChunk < d.numel ? begin + kChunk : d.numel;
    const double acc = d.dtype == FG_FP64
                           ? sumsq_range((const double *)d.g, begin, end)
                           : sumsq_range((const float *)d.g, begin, end);
    const double s = block_sum(acc);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = s;
}

/* out[0] = sqrt(sum of partials) * inv (the loss scale's inverse, 1
 * without one); out[1] = the gradients' factor, lib/train's
 * fg_clip_factor: inv times the clip factor max_norm / (norm + 1e-6)
 * when max_norm > 0 and the norm exceeds it (1: none); 0 when skip is
 * set and the norm is not finite (the step is skipped: nothing is scaled
 * or updated). */
__global__ void finish_kernel(const double *partials, long long np,
                              double max_norm, double inv, int skip,
                              double *out)
{
    double acc = 0;
    for (long long i = threadIdx.x; i < np; i += blockDim.x)
        acc += partials[i];
    const double ss = block_sum(acc);
    if (threadIdx.x == 0) {
        const double total = sqrt(ss) * inv;
        out[0] = total;
        out[1] = skip && !isfinite(total) ? 0.0
                 : inv * ((max_norm > 0 && total > max_norm)
                              ? max_norm / (total + 1e-6)
                              : 1.0);
    }
}

template <typename T>
__device__ void scale_range(T *g, long long begin, long long end, double k)
{
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x)
        g[j] = to_t(__dmul_rn((double)g[j], k), (T *)nullptr);
}

__global__ void scale_kernel(const Desc *descs, int n, const double *out)
{
    const double k = out[1];
    if (k == 1.0 || k == 0.0) /* not scaling, or a skipped step */
        return;
    __shared__ int s_i;
    if (threadIdx.x == 0)
        s_i = find_desc(descs, n);
    __syncthreads();
    const Desc d = descs[s_i];
    const long long begin = ((long long)blockIdx.x - d.chunk0) * kChunk;
    const long long end = begin + kChunk < d.numel ? begin + kChunk : d.numel;
    if (d.dtype == FG_FP64)
        scale_range((double *)d.g, begin, end, k);
    else
        scale_range((float *)d.g, begin, end, k);
}

/* Chunk numbering for a table already filled with numel; returns the
 * total number of chunks (the grid). */
fg_status number_chunks(Desc *d, int n, long long *total)
{
    long long c = 0;
    for (int i = 0; i < n; i++) {
        d[i].chunk0 = c;
        c += (d[i].numel + kChunk - 1) / kChunk;
    }
    if (c > INT32_MAX)
        return FG_FAIL(FG_ERR_UNSUPPORTED, "%lld chunks exceed the grid", c);
    *total = c;
    return FG_OK;
}

int dtype_ok(fg_dtype dt) { return dt == FG_FP32 || dt == FG_FP64; }

/* The norm table has no other owner: one process-wide cache. */
std::mutex g_norm_mu;
fg_cuda_optim_cache *g_norm_cache = nullptr;

} // namespace

extern "C" void fg_cuda_optim_cache_free(fg_cuda_optim_cache *c)
{
    if (!c)
        return;
    if (c->dev)
        fg_cuda_mem_free_persistent(c->dev);
    free(c->host);
    free(c);
}

/* The global norm of table's k gradients (chunks blocks) on the context
 * stream, out[0] = the norm and out[1] = the clip factor for max_norm,
 * then then(out), which launches the kernel that uses them (returning
 * its launch error, or cudaSuccess for none); *norm (optional) = the
 * norm, copied back after (this waits for the stream). what names the
 * kernels in an error. Shared by the clip and the clip folded into AdamW,
 * so both compute the norm with the same chunks and order: the same bits. */
template <typename F>
static fg_status norm_then(const Desc *table, int k, long long chunks,
                           const fg_cuda_clip &c, const char *what, F then,
                           double *norm)
{
    const size_t bytes = ((size_t)chunks + 2) * sizeof(double);
    void *scratch = nullptr;
    FG_TRY(fg_cuda_mem_alloc(bytes, &scratch));
    double *partials = (double *)scratch, *out = partials + chunks;
    cudaStream_t st = fg_cuda_stream();
    sumsq_kernel<<<(unsigned)chunks, kBlock, 0, st>>>(table, k, partials);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        finish_kernel<<<1, kFinishBlock, 0, st>>>(partials, chunks,
                                                  c.max_norm, c.inv_scale,
                                                  c.skip_nonfinite, out);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = then(out);
    if (e != cudaSuccess) {
        fg_cuda_mem_free(scratch, bytes);
        return fg_cuda_status(e, what, __FILE__, __LINE__);
    }
    fg_status s = FG_OK;
    if (norm) /* waits for the kernels; the scratch stays live until then */
        s = fg_cuda_memcpy_d2h(norm, out, sizeof(double));
    fg_cuda_mem_free(scratch, bytes);
    return s;
}

/* The AdamW table of ps uploaded into *cache (k tensors with elements,
 * *chunks blocks; 0: nothing to do) and the kernel's hyper-parameters. */
static fg_status adamw_prepare(fg_cuda_optim_cache **cache,
                               const fg_cuda_adamw_param *ps, int n,
                               const fg_cuda_adamw_hparams *h, int *kout,
                               long long *chunks, Hp *hp)
{
    *kout = 0;
    *chunks = 0;
    if (!cache || !h || n < 0 || (n > 0 && !ps))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    Desc *d = (Desc *)calloc(n > 0 ? (size_t)n : 1, sizeof(Desc));
    if (!d)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "optimizer table");
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!dtype_ok(ps[i].dtype) ||
            (ps[i].lowp && ps[i].lowp_dtype != FG_BF16 &&
             ps[i].lowp_dtype != FG_FP16)) {
            free(d);
            return FG_FAIL(FG_ERR_UNSUPPORTED,
                           "parameter %d: dtype %d (fp32/fp64 only), copy "
                           "dtype %d (bf16/fp16 only)", i, (int)ps[i].dtype,
                           (int)ps[i].lowp_dtype);
        }
        if (ps[i].numel <= 0)
            continue; /* nothing to update; keeps the table free of empties */
        d[k].p = ps[i].param;
        d[k].g = ps[i].grad;
        d[k].m = ps[i].m;
        d[k].v = ps[i].v;
        d[k].numel = ps[i].numel;
        d[k].dtype = (int)ps[i].dtype;
        d[k].decay = ps[i].decay != 0;
        d[k].lp = ps[i].lowp;
        d[k].lp_dtype = (int)ps[i].lowp_dtype;
        k++;
    }
    fg_status s = number_chunks(d, k, chunks);
    if (s != FG_OK || *chunks == 0) {
        free(d);
        return s;
    }
    s = cache_get(cache);
    if (s == FG_OK)
        s = cache_upload(*cache, d, k); /* owns d from here */
    else
        free(d);
    FG_TRY(s);
    hp->lr = h->lr;
    hp->b1 = h->beta1;
    hp->omb1 = 1 - h->beta1; /* the CPU's (1 - b1), same double */
    hp->b2 = h->beta2;
    hp->omb2 = 1 - h->beta2;
    hp->eps = h->eps;
    hp->bc1 = h->bc1;
    hp->bc2 = h->bc2;
    hp->decay = h->decay;
    hp->gscale = nullptr;
    *kout = k;
    return FG_OK;
}

extern "C" fg_status fg_cuda_adamw_step(fg_cuda_optim_cache **cache,
                                        const fg_cuda_adamw_param *ps, int n,
                                        const fg_cuda_adamw_hparams *h)
{
    int k = 0;
    long long chunks = 0;
    Hp hp;
    FG_TRY(adamw_prepare(cache, ps, n, h, &k, &chunks, &hp));
    if (chunks == 0)
        return FG_OK;
    adamw_kernel<<<(unsigned)chunks, kBlock, 0, fg_cuda_stream()>>>(
        (const Desc *)(*cache)->dev, k, hp);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

extern "C" fg_status fg_cuda_adamw_step_clip(fg_cuda_optim_cache **cache,
                                             const fg_cuda_adamw_param *ps,
                                             int n,
                                             const fg_cuda_adamw_hparams *h,
                                             const fg_cuda_clip *c,
                                             double *norm)
{
    if (!c)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL clip");
    int k = 0;
    long long chunks = 0;
    Hp hp;
    FG_TRY(adamw_prepare(cache, ps, n, h, &k, &chunks, &hp));
    if (chunks == 0) {
        if (norm)
            *norm = 0;
        return FG_OK;
    }
    /* The norm over the same table, in the same chunks and order as
     * fg_cuda_clip_grad_norm's (the parameters with gradients, in order):
     * the same bits; the update reads the factor from the device. */
    const Desc *table = (const Desc *)(*cache)->dev;
    return norm_then(
        table, k, chunks, *c, "adamw_step_clip kernels",
        [&](double *out) {
            hp.gscale = out + 1;
            adamw_kernel<<<(unsigned)chunks, kBlock, 0, fg_cuda_stream()>>>(
                table, k, hp);
            return cudaGetLastError();
        },
        norm);
}

extern "C" fg_status fg_cuda_clip_grad_norm(const fg_cuda_grad *gs, int n,
                                            const fg_cuda_clip *c,
                                            double *norm)
{
    if (n < 0 || (n > 0 && !gs) || !c)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    Desc *d = (Desc *)calloc(n > 0 ? (size_t)n : 1, sizeof(Desc));
    if (!d)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "gradient table");
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!dtype_ok(gs[i].dtype)) {
            free(d);
            return FG_FAIL(FG_ERR_UNSUPPORTED,
                           "gradient %d: dtype %d (fp32/fp64 only)", i,
                           (int)gs[i].dtype);
        }
        if (gs[i].numel <= 0)
            continue;
        d[k].g = gs[i].data;
        d[k].numel = gs[i].numel;
        d[k].dtype = (int)gs[i].dtype;
        k++;
    }
    long long chunks = 0;
    fg_status s = number_chunks(d, k, &chunks);
    if (s != FG_OK || chunks == 0) {
        free(d);
        if (s == FG_OK && norm)
            *norm = 0;
        return s;
    }
    std::lock_guard<std::mutex> lock(g_norm_mu);
    s = cache_get(&g_norm_cache);
    if (s == FG_OK)
        s = cache_upload(g_norm_cache, d, k); /* owns d from here */
    else
        free(d);
    FG_TRY(s);
    const Desc *table = (const Desc *)g_norm_cache->dev;
    return norm_then(
        table, k, chunks, *c, "clip_grad_norm kernels",
        [&](double *out) {
            if (!(c->max_norm > 0) && c->inv_scale == 1.0)
                return cudaSuccess;
            scale_kernel<<<(unsigned)chunks, kBlock, 0, fg_cuda_stream()>>>(
                table, k, out);
            return cudaGetLastError();
        },
        norm);
}
