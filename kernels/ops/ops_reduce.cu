/* SPDX-License-Identifier: MIT */
/* kernels/ops/ops_reduce.cu - the deterministic sum reduction behind
 * fg_sum / fg_mean and the gradients of broadcast dimensions, and the
 * column sums of fp16 / bf16 layers' bias gradients: no float
 * atomics; when a few outputs each sum many elements the range is split
 * into chunks whose partial sums a second kernel adds in a fixed order.
 * The split depends only on shapes, so results are bitwise reproducible
 * across runs and GPUs. */
#include "ops_ew_common.cuh"

namespace {

/* ---- sum reduction ------------------------------------------------------- */

/* x's dimensions split into kept ones (an output index o walks them
 * row-major) and summed ones (a reduced index r walks them row-major),
 * each list coalesced. Each output's reduced range is cut into S chunks
 * of `chunk` elements when the outputs alone are too few to fill the GPU
 * (partials per chunk, then an in-order second pass). */
struct RedGeo {
    int nk, nr;
    int64_t M, R, S, chunk;
    int64_t kshape[FG_MAX_DIMS], kx[FG_MAX_DIMS], ko[FG_MAX_DIMS];
    int64_t rshape[FG_MAX_DIMS], rx[FG_MAX_DIMS];
};

/* Threads in flight we aim for: about one fully occupied H100 (132 SMs
 * x 2048 threads). A constant rather than the device's SM count, so the summation
 * order, hence the result bits, is the same on every GPU. */
constexpr int64_t kTargetThreads = 1 << 18;
constexpr int64_t kMaxSplit = 4096;     /* partials per output */
constexpr int64_t kMinChunkThread = 32; /* reduced elements per thread */
constexpr int64_t kMinChunkWarp = 1024; /* ... per warp (32 per lane) */
/* Inner-dimension sums shorter than this use a thread per output: a warp
 * per output would leave most lanes idle. */
constexpr int64_t kWarpMinR = 32;

void red_build(RedGeo *g, const fg_tensor *x, const int64_t *out_str)
{
    memset(g, 0, sizeof *g);
    g->M = g->R = 1;
    int prev = -1; /* previous non-unit dimension: 0 kept, 1 summed */
    for (int d = 0; d < x->nd; d++) {
        const int64_t e = x->shape[d], xs = x->stride[d];
        if (e == 1)
            continue;
        if (out_str[d] == 0) {
            if (prev == 1 && g->rx[g->nr - 1] == xs * e) {
                g->rshape[g->nr - 1] *= e;
            } else {
                g->rshape[g->nr++] = e;
            }
            g->rx[g->nr - 1] = xs;
            g->R *= e;
            prev = 1;
        } else {
            if (prev == 0 && g->kx[g->nk - 1] == xs * e &&
                g->ko[g->nk - 1] == out_str[d] * e) {
                g->kshape[g->nk - 1] *= e;
            } else {
                g->kshape[g->nk++] = e;
            }
            g->kx[g->nk - 1] = xs;
            g->ko[g->nk - 1] = out_str[d];
            g->M *= e;
            prev = 0;
        }
    }
}

/* x and out offsets of output o. */
__host__ __device__ __forceinline__ void
kept_offsets(const RedGeo &g, int64_t o, int64_t &xo, int64_t &oo)
{
    xo = oo = 0;
#pragma unroll
    for (int d = FG_MAX_DIMS - 1; d > 0; d--) {
        if (d < g.nk) {
            const int64_t q = o / g.kshape[d], r = o - q * g.kshape[d];
            xo += r * g.kx[d];
            oo += r * g.ko[d];
            o = q;
        }
    }
    if (g.nk > 0) {
        xo += o * g.kx[0];
        oo += o * g.ko[0];
    }
}

/* x offset of reduced index r (relative to the output's base). */
__host__ __device__ __forceinline__ int64_t red_offset(const RedGeo &g,
                                                       int64_t r)
{
    int64_t off = 0;
#pragma unroll
    for (int d = FG_MAX_DIMS - 1; d > 0; d--) {
        if (d < g.nr) {
            const int64_t q = r / g.rshape[d];
            off += (r - q * g.rshape[d]) * g.rx[d];
            r = q;
        }
    }
    return g.nr > 0 ? off + r * g.rx[0] : 0;
}

template <class T>
__device__ __forceinline__ void red_store(T *out, int64_t oo,
                                          typename Num<T>::Acc acc,
                                          double scale)
{
    /* scaled in double, as the CPU's mean does, then rounded once more */
    out[oo] = Num<T>::st((typename Num<T>::Acc)((double)acc * scale));
}

/* Fixed-order butterfly: lane 0 always ends with the same sum. */
template <class A> __device__ __forceinline__ A warp_sum(A v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

/* One thread per (output, chunk), adjacent threads on adjacent outputs:
 * coalesced when the kept dimensions are the inner ones (bias gradients,
 * [rows, C] -> [C]), and cheap when each output sums few elements. Writes
 * the output when S == 1, else part[s * M + o]. */
template <class T>
__global__ void sum_thread_kernel(T *out, const T *x,
                                  typename Num<T>::Acc *part,
                                  const __grid_constant__ RedGeo g,
                                  double scale)
{
    typedef typename Num<T>::Acc A;
    const int64_t units = g.M * g.S;
    for (int64_t u = (int64_t)blockIdx.x * kBlock + threadIdx.x; u < units;
         u += (int64_t)gridDim.x * kBlock) {
        const int64_t o = u % g.M, s = u / g.M;
        int64_t xo, oo;
        kept_offsets(g, o, xo, oo);
        const int64_t r0 = s * g.chunk;
        const int64_t r1 = r0 + g.chunk < g.R ? r0 + g.chunk : g.R;
        A acc = 0;
        if (g.nr == 1) {
            const int64_t rs = g.rx[0];
            const T *p = x + xo + r0 * rs;
#pragma unroll 4
            for (int64_t r = r0; r < r1; r++, p += rs)
                acc += Num<T>::ld(*p);
        } else {
            for (int64_t r = r0; r < r1; r++)
                acc += Num<T>::ld(x[xo + red_offset(g, r)]);
        }
        if (g.S == 1)
            red_store(out, oo, acc, scale);
        else
            part[s * g.M + o] = acc;
    }
}

/* One warp per (output, chunk), lanes striding the reduced elements: for
 * sums along the innermost (stride-1) dimension. */
template <class T>
__global__ void sum_warp_kernel(T *out, const T *x, typename Num<T>::Acc *part,
                                const __grid_constant__ RedGeo g, double scale)
{
    typedef typename Num<T>::Acc A;
    const int lane = threadIdx.x & 31;
    const int64_t units = g.M * g.S;
    const int64_t nwarps = (int64_t)gridDim.x * (kBlock / 32);
    /* u is uniform across the warp, so the shuffles see every lane */
    for (int64_t u = ((int64_t)blockIdx.x * kBlock + threadIdx.x) >> 5;
         u < units; u += nwarps) {
        const int64_t o = u % g.M, s = u / g.M;
        int64_t xo, oo;
        kept_offsets(g, o, xo, oo);
        const int64_t r0 = s * g.chunk;
        const int64_t r1 = r0 + g.chunk < g.R ? r0 + g.chunk : g.R;
        A acc = 0;
        if (g.nr == 1) {
            const int64_t rs = g.rx[0];
            for (int64_t r = r0 + lane; r < r1; r += 32)
                acc += Num<T>::ld(x[xo + r * rs]);
        } else {
            for (int64_t r = r0 + lane; r < r1; r += 32)
                acc += Num<T>::ld(x[xo + red_offset(g, r)]);
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            if (g.S == 1)
                red_store(out, oo, acc, scale);
            else
                part[s * g.M + o] = acc;
        }
    }
}

/* Second pass, few partials per output: a thread per output, summing
 * part[0..S) in order (reads coalesced across outputs). */
template <class T>
__global__ void sum_finish_thread_kernel(T *out,
                                         const typename Num<T>::Acc *part,
                                         const __grid_constant__ RedGeo g,
                                         double scale)
{
    typedef typename Num<T>::Acc A;
    for (int64_t o = (int64_t)blockIdx.x * kBlock + threadIdx.x; o < g.M;
         o += (int64_t)gridDim.x * kBlock) {
        A acc = 0;
        for (int64_t s = 0; s < g.S; s++)
            acc += part[s * g.M + o];
        int64_t xo, oo;
        kept_offsets(g, o, xo, oo);
        red_store(out, oo, acc, scale);
    }
}

/* Second pass, many partials per output: a warp per output. */
template <class T>
__global__ void sum_finish_warp_kernel(T *out,
                                       const typename Num<T>::Acc *part,
                                       const __grid_constant__ RedGeo g,
                                       double scale)
{
    typedef typename Num<T>::Acc A;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = (int64_t)gridDim.x * (kBlock / 32);
    for (int64_t o = ((int64_t)blockIdx.x * kBlock + threadIdx.x) >> 5;
         o < g.M; o += nwarps) {
        A acc = 0;
        for (int64_t s = lane; s < g.S; s += 32)
            acc += part[s * g.M + o];
        acc = warp_sum(acc);
        if (lane == 0) {
            int64_t xo, oo;
            kept_offsets(g, o, xo, oo);
            red_store(out, oo, acc, scale);
        }
    }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

fg_status launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FG_OK
                            : fg_cuda_status(e, what, __FILE__, __LINE__);
}

/* Picks the kernel (true: a warp per output) and the split S of the
 * reduced range: split only while the outputs alone cannot fill the GPU,
 * and only into chunks long enough to be worth a partial. */
bool red_plan(RedGeo *g)
{
    const bool warp =
        g->nr > 0 && g->rx[g->nr - 1] == 1 && g->R >= kWarpMinR;
    const int64_t want = warp ? kTargetThreads / 32 : kTargetThreads;
    int64_t S = ceil_div(want, g->M);
    const int64_t by_len =
        ceil_div(g->R, warp ? kMinChunkWarp : kMinChunkThread);
    S = S < by_len ? S : by_len;
    S = S < kMaxSplit ? S : kMaxSplit;
    S = S > 1 ? S : 1;
    g->chunk = ceil_div(g->R, S);
    g->S = ceil_div(g->R, g->chunk); /* no empty chunk */
    return warp;
}

template <class T>
fg_status sum_launch(fg_tensor *out, const fg_tensor *x, RedGeo g,
                     double scale)
{
    typedef typename Num<T>::Acc A;
    const bool warp = red_plan(&g);
    T *po = (T *)fg_tensor_base(out);
    const T *px = (const T *)fg_tensor_base(x);
    A *part = NULL;
    const size_t part_bytes = (size_t)(g.M * g.S) * sizeof(A);
    if (g.S > 1)
        FG_TRY(fg_cuda_mem_alloc(part_bytes, (void **)&part));
    cudaStream_t st = fg_cuda_stream();
    const int64_t units = g.M * g.S;
    if (warp)
        sum_warp_kernel<T><<<fg_cuda_grid(units * 32, kBlock), kBlock, 0, st>>>(
            po, px, part, g, scale);
    else
        sum_thread_kernel<T><<<fg_cuda_grid(units, kBlock), kBlock, 0, st>>>(
            po, px, part, g, scale);
    fg_status s = launched("sum reduction kernel");
    if (s == FG_OK && g.S > 1) {
        if (g.S <= 64)
            sum_finish_thread_kernel<T>
                <<<fg_cuda_grid(g.M, kBlock), kBlock, 0, st>>>(po, part, g,
                                                              scale);
        else
            sum_finish_warp_kernel<T>
                <<<fg_cuda_grid(g.M * 32, kBlock), kBlock, 0, st>>>(
                    po, part, g, scale);
        s = launched("sum reduction finishing kernel");
    }
    /* safe right away: the next user of the block runs after these kernels
     * on the same stream */
    if (part)
        fg_cuda_mem_free(part, part_bytes);
    return s;
}

/* ---- column sums (bias gradients) ----------------------------------------- */

/* A block sums a tile of 32 * V columns over one chunk of rows: lane l of
 * each of the 8 warps owns V adjacent columns (one 16-byte load a row when
 * V = 8) and takes every 8th row of the chunk, four rows in flight. The
 * cuBLASLt bias-gradient epilogue this replaces slowed the weight-gradient
 * GEMM by 15-45% (scripts/wgrad-probe.cu, GPT-2-small's shapes on an
 * H200); in that model's step one more read of gy costs about as much
 * (doc/training.md, session 46), and the sums no longer depend on which
 * GEMM algorithm ran. */
constexpr int kCsWarps = kBlock / 32;
/* Blocks aimed for (a constant, as above): about four an SM, each thread
 * with four 16-byte loads in flight, keeps HBM busy; more chunks would
 * only lengthen the finishing sums. */
constexpr int kCsBlocks = 512;
constexpr int64_t kCsMinChunk = 64; /* rows a chunk, at least */

/* V elements at p (one 16-byte load when V = 8) in fp32; ops_nn_common's
 * load_vec is the same for the other Num family, which this file cannot
 * include beside its own. */
template <class T, int V>
__device__ __forceinline__ void cs_load(const T *p, float *v)
{
    if constexpr (V == 1) {
        v[0] = Num<T>::ld(*p);
    } else {
        static_assert(sizeof(T) * V == 16, "16-byte vectors");
        const uint4 q = __ldg(reinterpret_cast<const uint4 *>(p));
        const T *e = reinterpret_cast<const T *>(&q);
#pragma unroll
        for (int i = 0; i < V; i++)
            v[i] = Num<T>::ld(e[i]);
    }
}

/* part[chunk, column] = the chunk's sum (fixed order: each thread's rows in
 * turn, then the 8 warps in order). */
template <class T, int V>
__global__ void __launch_bounds__(kBlock)
    col_sums_kernel(float *part, const T *x, int64_t rows, int64_t cols,
                    int64_t chunk)
{
    __shared__ float sm[kCsWarps][32 * V];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t c0 = ((int64_t)blockIdx.x * 32 + lane) * V,
                  r0 = (int64_t)blockIdx.y * chunk,
                  r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; i++)
        acc[i] = 0.f;
    if (c0 < cols) {
        const T *p = x + c0;
        int64_t r = r0 + w;
        for (; r + 3 * kCsWarps < r1; r += 4 * kCsWarps) {
            float v[4][V];
#pragma unroll
            for (int k = 0; k < 4; k++)
                cs_load<T, V>(p + (r + k * kCsWarps) * cols, v[k]);
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int i = 0; i < V; i++)
                    acc[i] += v[k][i];
        }
        for (; r < r1; r += kCsWarps) {
            float v[V];
            cs_load<T, V>(p + r * cols, v);
#pragma unroll
            for (int i = 0; i < V; i++)
                acc[i] += v[i];
        }
    }
#pragma unroll
    for (int i = 0; i < V; i++)
        sm[w][lane * V + i] = acc[i];
    __syncthreads();
    for (int j = threadIdx.x; j < 32 * V; j += kBlock) {
        const int64_t c = (int64_t)blockIdx.x * 32 * V + j;
        if (c < cols) {
            float t = 0.f;
#pragma unroll
            for (int k = 0; k < kCsWarps; k++)
                t += sm[k][j];
            part[blockIdx.y * cols + c] = t;
        }
    }
}

/* out[column] = its chunks' partials (out[column] + them with acc, in
 * fp32: the bits of fg_grad_accumulate's add of a fresh sum): a warp per
 * column, lane l adding chunks l, l + 32, ... in turn, then warp_sum's
 * fixed butterfly. */
template <class O>
__global__ void col_sums_finish_kernel(O *out, const float *part,
                                       int64_t cols, int64_t S, bool acc)
{
    const int64_t c = ((int64_t)blockIdx.x * kBlock + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (c >= cols) /* c is the warp's: whole warps leave together */
        return;
    float t = 0.f;
    for (int64_t s = lane; s < S; s += 32)
        t += part[s * cols + c];
    t = warp_sum(t);
    if (lane == 0)
        out[c] = Num<O>::st(acc ? Num<O>::ld(out[c]) +
                                       Num<O>::ld(Num<O>::st(t))
                                 : t);
}

template <class T>
fg_status col_sums_launch(fg_tensor *out, const fg_tensor *x, int64_t rows,
                          int64_t cols, bool acc)
{
    const T *px = (const T *)fg_tensor_base(x);
    const bool vec = cols % 8 == 0 && ((uintptr_t)px & 15) == 0;
    const int64_t tiles = ceil_div(cols, vec ? 256 : 32);
    int64_t S = ceil_div(kCsBlocks, tiles);
    const int64_t by_len = ceil_div(rows, kCsMinChunk);
    S = S < by_len ? S : by_len;
    S = S < 65535 ? S : 65535; /* gridDim.y */
    const int64_t chunk = ceil_div(rows, S);
    S = ceil_div(rows, chunk);
    /* the finishing kernel: a warp per column, no grid-stride loop */
    const int64_t fin = ceil_div(cols * 32, kBlock);
    if (tiles > INT32_MAX || fin > INT32_MAX)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "fg_cuda_col_sums: %lld columns is too many",
                        (long long)cols);
    float *part = NULL;
    const size_t part_bytes = (size_t)(S * cols) * sizeof(float);
    FG_TRY(fg_cuda_mem_alloc(part_bytes, (void **)&part));
    cudaStream_t st = fg_cuda_stream();
    const dim3 grid((unsigned)tiles, (unsigned)S);
    if (vec)
        col_sums_kernel<T, 8><<<grid, kBlock, 0, st>>>(part, px, rows, cols,
                                                      chunk);
    else
        col_sums_kernel<T, 1><<<grid, kBlock, 0, st>>>(part, px, rows, cols,
                                                      chunk);
    fg_status s = launched("column sums kernel");
    if (s == FG_OK) {
        const unsigned nb = (unsigned)fin;
        if (out->dtype == FG_FP32)
            col_sums_finish_kernel<float><<<nb, kBlock, 0, st>>>(
                (float *)fg_tensor_base(out), part, cols, S, acc);
        else
            col_sums_finish_kernel<T><<<nb, kBlock, 0, st>>>(
                (T *)fg_tensor_base(out), part, cols, S, acc);
        s = launched("column sums finishing kernel");
    }
    fg_cuda_mem_free(part, part_bytes); /* stream-ordered, as sum_launch's */
    return s;
}


} // namespace

/* ---- entry points -------------------------------------------------------- */

extern "C" fg_status fg_cuda_sum_reduce(fg_tensor *out, const int64_t *out_str,
                                        const fg_tensor *x, double scale)
{
    static const char fn[] = "fg_cuda_sum_reduce";
    FG_TRY(check_device(fn, out));
    FG_TRY(check_device(fn, x));
    if (out->dtype != x->dtype)
        return fg_error(FG_ERR_INTERNAL, "%s: dtypes %s -> %s differ", fn,
                        fg_dtype_name(x->dtype), fg_dtype_name(out->dtype));
    if (out->numel == 0)
        return FG_OK;
    if (x->numel == 0) /* empty sums: 0, times scale (NaN for a 0/0 mean) */
        return fg_cuda_fill_strided(out, 0.0 * scale);
    RedGeo g;
    red_build(&g, x, out_str);
    FG_DTYPE_SWITCH(x->dtype, T, return sum_launch<T>(out, x, g, scale))
    return bad_dtype(fn, x->dtype);
}

extern "C" fg_status fg_cuda_col_sums(fg_tensor *out, const fg_tensor *x,
                                      int accumulate)
{
    static const char fn[] = "fg_cuda_col_sums";
    FG_TRY(check_device(fn, out));
    FG_TRY(check_device(fn, x));
    if (x->nd < 1 || !fg_tensor_is_contiguous(x) ||
        !fg_tensor_is_contiguous(out) || out->numel != x->shape[x->nd - 1] ||
        (x->dtype != FG_BF16 && x->dtype != FG_FP16) ||
        (out->dtype != FG_FP32 && out->dtype != x->dtype))
        return fg_error(FG_ERR_INTERNAL,
                        "%s: wants a contiguous fp16 / bf16 x [..., C] and a "
                        "contiguous out [C] in fp32 or x's dtype",
                        fn);
    const int64_t cols = out->numel;
    if (cols == 0)
        return FG_OK;
    const int64_t rows = x->numel / cols;
    if (rows == 0) /* empty sums: 0, which leaves an accumulation as it is */
        return accumulate ? FG_OK : fg_cuda_fill_strided(out, 0.0);
    if (x->dtype == FG_BF16)
        return col_sums_launch<__nv_bfloat16>(out, x, rows, cols,
                                              accumulate != 0);
    return col_sums_launch<__half>(out, x, rows, cols, accumulate != 0);
}
