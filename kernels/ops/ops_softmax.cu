/* SPDX-License-Identifier: MIT */
/* kernels/ops/ops_softmax.cu - softmax / log_softmax (forward, backward; the
 * last dim by row kernels: a warp per row up to 2048 elements, else a
 * block; other dims by a strided kernel) and the fused
 * softmax-cross-entropy (one pass over the logits for the row statistics,
 * per-row losses reduced in a fixed order; entry points in
 * lib/ops/cuda_ops_nn.h). */
#include "ops_nn_common.cuh"

namespace {

/* ---- softmax / log_softmax ---------------------------------------------- */

/* x, y: [R, D] contiguous. Same semantics as the CPU: an all -inf row
 * yields NaN (0/0), like softmax_lane in lib/ops_softmax.c. */
template <typename T, int V>
__global__ void softmax_rows_kernel(const T *__restrict__ x, T *__restrict__ y,
                                    int64_t R, int64_t D, int is_log)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * D;
    T *yr = y + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    A m = neg_inf<A>(), s = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            ms_add(m, s, v[k]);
    }
    row_ms(m, s);
    if (m == neg_inf<A>())
        m = A(0);
    const A lse = d_log(s);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            v[k] = is_log ? (v[k] - m) - lse : d_exp(v[k] - m) / s;
        store_vec<T, V>(yr + j, v);
    }
}

/* x, y: [O, D, I] contiguous with I > 1 (softmax along a non-last dim):
 * one thread per (o, i) lane; neighbouring threads read neighbouring i. */
template <typename T>
__global__ void softmax_cols_kernel(const T *__restrict__ x, T *__restrict__ y,
                                    int64_t O, int64_t D, int64_t I,
                                    int is_log)
{
    typedef typename Num<T>::A A;
    const int64_t total = O * I;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = t / I, i = t - o * I;
        const T *xp = x + o * D * I + i;
        T *yp = y + o * D * I + i;
        A m = neg_inf<A>(), s = A(0);
        for (int64_t d = 0; d < D; d++)
            ms_add(m, s, Num<T>::ld(xp[d * I]));
        if (m == neg_inf<A>())
            m = A(0);
        const A lse = d_log(s);
        for (int64_t d = 0; d < D; d++) {
            const A v = Num<T>::ld(xp[d * I]) - m;
            yp[d * I] = Num<T>::st(is_log ? v - lse : d_exp(v) / s);
        }
    }
}

/* softmax: dx = y (g - sum g y); log_softmax: dx = g - exp(y) sum g. */
template <typename T, int V>
__global__ void softmax_bwd_rows_kernel(const T *__restrict__ g,
                                        const T *__restrict__ y,
                                        T *__restrict__ dx, int64_t R,
                                        int64_t D, int is_log)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *gr = g + row * D, *yr = y + row * D;
    T *dr = dx + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    A dot = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A gv[V], yv[V];
        load_vec<T, V>(gr + j, gv);
        load_vec<T, V>(yr + j, yv);
#pragma unroll
        for (int k = 0; k < V; k++)
            dot += is_log ? gv[k] : gv[k] * yv[k];
    }
    dot = row_sum(dot);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A gv[V], yv[V];
        load_vec<T, V>(gr + j, gv);
        load_vec<T, V>(yr + j, yv);
#pragma unroll
        for (int k = 0; k < V; k++)
            gv[k] = is_log ? gv[k] - d_exp(yv[k]) * dot : yv[k] * (gv[k] - dot);
        store_vec<T, V>(dr + j, gv);
    }
}

template <typename T>
__global__ void softmax_bwd_cols_kernel(const T *__restrict__ g,
                                        const T *__restrict__ y,
                                        T *__restrict__ dx, int64_t O,
                                        int64_t D, int64_t I, int is_log)
{
    typedef typename Num<T>::A A;
    const int64_t total = O * I;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = t / I, i = t - o * I, base = o * D * I + i;
        A dot = A(0);
        for (int64_t d = 0; d < D; d++) {
            const A gv = Num<T>::ld(g[base + d * I]);
            dot += is_log ? gv : gv * Num<T>::ld(y[base + d * I]);
        }
        for (int64_t d = 0; d < D; d++) {
            const A gv = Num<T>::ld(g[base + d * I]),
                    yv = Num<T>::ld(y[base + d * I]);
            dx[base + d * I] =
                Num<T>::st(is_log ? gv - d_exp(yv) * dot : yv * (gv - dot));
        }
    }
}

/* ---- cross-entropy ------------------------------------------------------ */

/* One pass over each row of logits: lse[r] and the row's loss
 * (lse - x[target], 0 for an ignored row). */
template <typename T, int V>
__global__ void ce_fwd_kernel(const T *__restrict__ x,
                              const int64_t *__restrict__ tgt, int64_t R,
                              int64_t D, int64_t ignore,
                              typename Num<T>::A *__restrict__ lse,
                              typename Num<T>::A *__restrict__ rowloss)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    A m = neg_inf<A>(), s = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            ms_add(m, s, v[k]);
    }
    row_ms(m, s);
    if (threadIdx.x == 0) {
        const A l = m + d_log(s);
        lse[row] = l;
        const int64_t t = tgt[row];
        rowloss[row] = t == ignore ? A(0) : l - Num<T>::ld(xr[t]);
    }
}

/* loss = sum(rowloss) / count in fp64 with one block: a fixed order. */
template <typename A>
__global__ void ce_loss_kernel(const A *__restrict__ rowloss, int64_t R,
                               int64_t count, A *__restrict__ loss)
{
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < R; i += blockDim.x)
        acc += (double)rowloss[i];
    acc = row_sum(acc); /* blockDim.x > 32, blockDim.y == 1 */
    if (threadIdx.x == 0)
        *loss = (A)(count ? acc / (double)count : 0.0);
}

/* dx = (exp(x - lse) - onehot) * g / count; g read here, on the device. */
template <typename T, int V>
__global__ void ce_bwd_kernel(const T *__restrict__ x,
                              const typename Num<T>::A *__restrict__ lse,
                              const int64_t *__restrict__ tgt,
                              const void *__restrict__ g, int gdt, int64_t R,
                              int64_t D, int64_t ignore, int64_t count,
                              T *__restrict__ dx)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const int64_t t = tgt[row];
    const T *xr = x + row * D;
    T *dr = dx + row * D;
    const int64_t step = (int64_t)blockDim.x * V;
    if (t == ignore) {
        A z[V];
#pragma unroll
        for (int k = 0; k < V; k++)
            z[k] = A(0);
        for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step)
            store_vec<T, V>(dr + j, z);
        return;
    }
    const A scale = count ? (A)(load_scalar(g, gdt) / (double)count) : A(0);
    const A l = lse[row];
    for (int64_t j = (int64_t)threadIdx.x * V; j < D; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            v[k] = scale * (d_exp(v[k] - l) - (j + k == t ? A(1) : A(0)));
        store_vec<T, V>(dr + j, v);
    }
}

/* ---- softmax ------------------------------------------------------------ */

template <typename T>
fg_status softmax_fwd_t(const fg_tensor *x, fg_tensor *y, int dim, int is_log)
{
    int64_t O, D, I;
    split_dim(x, dim, &O, &D, &I);
    const T *xp = dptr<T>(x);
    T *yp = dptr<T>(y);
    cudaStream_t st = fg_cuda_stream();
    if (I == 1) {
        RowLaunch L;
        FG_TRY(row_launch(O, D, "fg_softmax", &L));
        constexpr int VW = vec_width<T>();
        if (D % VW == 0 && aligned16(xp) && aligned16(yp))
            softmax_rows_kernel<T, VW><<<L.grid, L.block, 0, st>>>(xp, yp, O, D,
                                                                   is_log);
        else
            softmax_rows_kernel<T, 1><<<L.grid, L.block, 0, st>>>(xp, yp, O, D,
                                                                  is_log);
    } else {
        softmax_cols_kernel<T><<<fg_cuda_grid(O * I, 256), 256, 0, st>>>(
            xp, yp, O, D, I, is_log);
    }
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status softmax_bwd_t(const fg_tensor *g, const fg_tensor *y, fg_tensor *dx,
                        int dim, int is_log)
{
    int64_t O, D, I;
    split_dim(y, dim, &O, &D, &I);
    const T *gp = dptr<T>(g), *yp = dptr<T>(y);
    T *dp = dptr<T>(dx);
    cudaStream_t st = fg_cuda_stream();
    if (I == 1) {
        RowLaunch L;
        FG_TRY(row_launch(O, D, "softmax backward", &L));
        constexpr int VW = vec_width<T>();
        if (D % VW == 0 && aligned16(gp) && aligned16(yp) && aligned16(dp))
            softmax_bwd_rows_kernel<T, VW><<<L.grid, L.block, 0, st>>>(
                gp, yp, dp, O, D, is_log);
        else
            softmax_bwd_rows_kernel<T, 1><<<L.grid, L.block, 0, st>>>(
                gp, yp, dp, O, D, is_log);
    } else {
        softmax_bwd_cols_kernel<T><<<fg_cuda_grid(O * I, 256), 256, 0, st>>>(
            gp, yp, dp, O, D, I, is_log);
    }
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* ---- cross-entropy ------------------------------------------------------ */

template <typename T>
fg_status ce_fwd_launch(const fg_tensor *x, const int64_t *dtgt, int64_t R,
                        int64_t D, int64_t ignore, int64_t count,
                        typename Num<T>::A *rowloss, fg_tensor *lse,
                        fg_tensor *loss)
{
    typedef typename Num<T>::A A;
    const T *xp = dptr<T>(x);
    A *lp = dptr<A>(lse);
    cudaStream_t st = fg_cuda_stream();
    RowLaunch L;
    FG_TRY(row_launch(R, D, "fg_cross_entropy", &L));
    constexpr int VW = vec_width<T>();
    if (D % VW == 0 && aligned16(xp))
        ce_fwd_kernel<T, VW><<<L.grid, L.block, 0, st>>>(xp, dtgt, R, D, ignore,
                                                         lp, rowloss);
    else
        ce_fwd_kernel<T, 1><<<L.grid, L.block, 0, st>>>(xp, dtgt, R, D, ignore,
                                                        lp, rowloss);
    FG_CUDA_TRY_LAUNCH();
    ce_loss_kernel<A><<<1, 512, 0, st>>>(rowloss, R, count, dptr<A>(loss));
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status ce_fwd_t(const fg_tensor *x, const int64_t *targets, int64_t ignore,
                   int64_t count, fg_tensor *lse, fg_tensor *loss)
{
    typedef typename Num<T>::A A;
    const int64_t D = x->shape[x->nd - 1], R = x->numel / D;
    const size_t tbytes = sizeof(int64_t) * (size_t)R,
                 lbytes = sizeof(A) * (size_t)R;
    int64_t *dtgt = nullptr;
    A *rowloss = nullptr;
    fg_status s = fg_cuda_mem_alloc(tbytes, (void **)&dtgt);
    if (s == FG_OK)
        s = fg_cuda_mem_alloc(lbytes, (void **)&rowloss);
    if (s == FG_OK)
        s = fg_cuda_memcpy_h2d(dtgt, targets, tbytes);
    if (s == FG_OK)
        s = ce_fwd_launch<T>(x, dtgt, R, D, ignore, count, rowloss, lse, loss);
    scratch_free(dtgt, tbytes);
    scratch_free(rowloss, lbytes);
    return s;
}

template <typename T>
fg_status ce_bwd_launch(const fg_tensor *x, const fg_tensor *lse,
                        const int64_t *dtgt, int64_t R, int64_t D,
                        int64_t ignore, int64_t count, const fg_tensor *g,
                        fg_tensor *dx)
{
    typedef typename Num<T>::A A;
    const T *xp = dptr<T>(x);
    const A *lp = dptr<A>(lse);
    const void *gp = fg_tensor_base(g);
    T *dp = dptr<T>(dx);
    cudaStream_t st = fg_cuda_stream();
    RowLaunch L;
    FG_TRY(row_launch(R, D, "cross-entropy backward", &L));
    constexpr int VW = vec_width<T>();
    if (D % VW == 0 && aligned16(xp) && aligned16(dp))
        ce_bwd_kernel<T, VW><<<L.grid, L.block, 0, st>>>(
            xp, lp, dtgt, gp, (int)g->dtype, R, D, ignore, count, dp);
    else
        ce_bwd_kernel<T, 1><<<L.grid, L.block, 0, st>>>(
            xp, lp, dtgt, gp, (int)g->dtype, R, D, ignore, count, dp);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status ce_bwd_t(const fg_tensor *x, const fg_tensor *lse,
                   const int64_t *targets, int64_t ignore, int64_t count,
                   const fg_tensor *g, fg_tensor *dx)
{
    const int64_t D = x->shape[x->nd - 1], R = x->numel / D;
    const size_t tbytes = sizeof(int64_t) * (size_t)R;
    int64_t *dtgt = nullptr;
    fg_status s = fg_cuda_mem_alloc(tbytes, (void **)&dtgt);
    if (s == FG_OK)
        s = fg_cuda_memcpy_h2d(dtgt, targets, tbytes);
    if (s == FG_OK)
        s = ce_bwd_launch<T>(x, lse, dtgt, R, D, ignore, count, g, dx);
    scratch_free(dtgt, tbytes);
    return s;
}

} /* namespace */

/* ---- entry points --------------------------------------------------------- */

extern "C" fg_status fg_cuda_softmax_forward(const fg_tensor *x, fg_tensor *y,
                                             int dim, int is_log)
{
    if (x->numel == 0)
        return FG_OK;
    NN_BY_DTYPE(x->dtype, "fg_softmax", softmax_fwd_t, x, y, dim, is_log);
}

extern "C" fg_status fg_cuda_softmax_backward(const fg_tensor *g,
                                              const fg_tensor *y, fg_tensor *dx,
                                              int dim, int is_log)
{
    if (y->numel == 0)
        return FG_OK;
    NN_BY_DTYPE(y->dtype, "softmax backward", softmax_bwd_t, g, y, dx, dim,
                is_log);
}

extern "C" fg_status fg_cuda_cross_entropy_forward(const fg_tensor *x,
                                                   const int64_t *targets,
                                                   int64_t ignore_index,
                                                   int64_t count, fg_tensor *lse,
                                                   fg_tensor *loss)
{
    if (x->numel == 0) /* no rows: loss 0, as on the CPU */
        return fg_cuda_memset_zero(fg_tensor_base(loss),
                                   fg_esize(loss->dtype));
    NN_BY_DTYPE(x->dtype, "fg_cross_entropy", ce_fwd_t, x, targets,
                ignore_index, count, lse, loss);
}

extern "C" fg_status fg_cuda_cross_entropy_backward(
    const fg_tensor *x, const fg_tensor *lse, const int64_t *targets,
    int64_t ignore_index, int64_t count, const fg_tensor *g, fg_tensor *dx)
{
    if (x->numel == 0)
        return FG_OK;
    NN_BY_DTYPE(x->dtype, "cross-entropy backward", ce_bwd_t, x, lse, targets,
                ignore_index, count, g, dx);
}
