/* kernels/ops/ops_layernorm.cu - layernorm forward (saves only mean and rstd)
 * and backward (dx by row kernels; dweight / dbias as deterministic
 * two-stage column sums; entry points in lib/ops/cuda_ops_nn.h). */
#include "ops_nn_common.cuh"

namespace {

/* ---- layernorm ---------------------------------------------------------- */

/* Two passes for mean and variance (as the CPU: no cancellation), a third
 * to write y. The row stays in L1/L2 between passes. */
template <typename T, int V>
__global__ void ln_fwd_kernel(const T *__restrict__ x, const T *__restrict__ w,
                              int64_t ws, const T *__restrict__ b, int64_t bs,
                              int64_t R, int64_t C, typename Num<T>::A eps,
                              T *__restrict__ y,
                              typename Num<T>::A *__restrict__ mean,
                              typename Num<T>::A *__restrict__ rstd)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * C;
    T *yr = y + row * C;
    const int64_t step = (int64_t)blockDim.x * V;
    A sum = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++)
            sum += v[k];
    }
    const A mu = row_sum(sum) / (A)C;
    A sq = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A d = v[k] - mu;
            sq += d * d;
        }
    }
    const A rs = A(1) / d_sqrt(row_sum(sq) / (A)C + eps);
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A v[V];
        load_vec<T, V>(xr + j, v);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A wv = w ? Num<T>::ld(w[(j + k) * ws]) : A(1);
            const A bv = b ? Num<T>::ld(b[(j + k) * bs]) : A(0);
            v[k] = (v[k] - mu) * rs * wv + bv;
        }
        store_vec<T, V>(yr + j, v);
    }
}

/* dx = rstd (wg - mean(wg) - xhat mean(wg xhat)), wg = g * w. */
template <typename T, int V>
__global__ void ln_bwd_dx_kernel(const T *__restrict__ x,
                                 const T *__restrict__ w, int64_t ws,
                                 const typename Num<T>::A *__restrict__ mean,
                                 const typename Num<T>::A *__restrict__ rstd,
                                 const T *__restrict__ g, int64_t R,
                                 int64_t C, T *__restrict__ dx)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * C, *gr = g + row * C;
    T *dr = dx + row * C;
    const A mu = mean[row], rs = rstd[row];
    const int64_t step = (int64_t)blockDim.x * V;
    A s1 = A(0), s2 = A(0);
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A xv[V], gv[V];
        load_vec<T, V>(xr + j, xv);
        load_vec<T, V>(gr + j, gv);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A xh = (xv[k] - mu) * rs;
            const A wg = gv[k] * (w ? Num<T>::ld(w[(j + k) * ws]) : A(1));
            s1 += wg;
            s2 += wg * xh;
        }
    }
    s1 = row_sum(s1) / (A)C;
    s2 = row_sum(s2) / (A)C;
    for (int64_t j = (int64_t)threadIdx.x * V; j < C; j += step) {
        A xv[V], gv[V];
        load_vec<T, V>(xr + j, xv);
        load_vec<T, V>(gr + j, gv);
#pragma unroll
        for (int k = 0; k < V; k++) {
            const A xh = (xv[k] - mu) * rs;
            const A wg = gv[k] * (w ? Num<T>::ld(w[(j + k) * ws]) : A(1));
            gv[k] = rs * (wg - s1 - xh * s2);
        }
        store_vec<T, V>(dr + j, gv);
    }
}

/* dw / db, stage 1: block (32 columns) x (LN_COL_Y row lanes) sums a chunk
 * of rows of its columns in fp64, lanes combined in order; one partial per
 * (chunk, column). Stage 2 sums the partials in chunk order. */
#define LN_COL_Y 8

template <typename T>
__global__ void ln_bwd_cols_kernel(const T *__restrict__ x,
                                   const typename Num<T>::A *__restrict__ mean,
                                   const typename Num<T>::A *__restrict__ rstd,
                                   const T *__restrict__ g, int64_t R,
                                   int64_t C, int64_t rows_per_chunk,
                                   double *__restrict__ pw,
                                   double *__restrict__ pb)
{
    typedef typename Num<T>::A A;
    __shared__ double sw[LN_COL_Y][32], sb[LN_COL_Y][32];
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    double aw = 0.0, ab = 0.0;
    if (col < C) {
        for (int64_t r = r0 + threadIdx.y; r < r1; r += LN_COL_Y) {
            const A gv = Num<T>::ld(g[r * C + col]);
            const A xh = (Num<T>::ld(x[r * C + col]) - mean[r]) * rstd[r];
            aw += (double)gv * (double)xh;
            ab += (double)gv;
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && col < C) {
        double tw = 0.0, tb = 0.0;
#pragma unroll
        for (int k = 0; k < LN_COL_Y; k++) {
            tw += sw[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
        }
        pw[(int64_t)blockIdx.y * C + col] = tw;
        pb[(int64_t)blockIdx.y * C + col] = tb;
    }
}

template <typename T>
__global__ void ln_bwd_cols_final(const double *__restrict__ pw,
                                  const double *__restrict__ pb,
                                  int64_t nchunks, int64_t C,
                                  T *__restrict__ dw, T *__restrict__ db)
{
    for (int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; col < C;
         col += (int64_t)gridDim.x * blockDim.x) {
        double tw = 0.0, tb = 0.0;
        for (int64_t k = 0; k < nchunks; k++) {
            tw += pw[k * C + col];
            tb += pb[k * C + col];
        }
        if (dw)
            dw[col] = Num<T>::st_d(tw);
        if (db)
            db[col] = Num<T>::st_d(tb);
    }
}

/* ---- layernorm ---------------------------------------------------------- */

template <typename T>
fg_status ln_fwd_t(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                   double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd)
{
    typedef typename Num<T>::A A;
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    const T *xp = dptr<T>(x), *wp = dptr<T>(w), *bp = dptr<T>(b);
    const int64_t ws = w ? w->stride[0] : 0, bs = b ? b->stride[0] : 0;
    T *yp = dptr<T>(y);
    A *mp = dptr<A>(mean), *rp = dptr<A>(rstd);
    cudaStream_t st = fg_cuda_stream();
    RowLaunch L;
    FG_TRY(row_launch(R, C, "fg_layernorm", &L));
    constexpr int VW = vec_width<T>();
    if (C % VW == 0 && aligned16(xp) && aligned16(yp))
        ln_fwd_kernel<T, VW><<<L.grid, L.block, 0, st>>>(xp, wp, ws, bp, bs, R,
                                                         C, (A)eps, yp, mp, rp);
    else
        ln_fwd_kernel<T, 1><<<L.grid, L.block, 0, st>>>(xp, wp, ws, bp, bs, R,
                                                        C, (A)eps, yp, mp, rp);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status ln_cols_launch(const fg_tensor *x, const fg_tensor *mean,
                         const fg_tensor *rstd, const fg_tensor *g, int64_t R,
                         int64_t C, int64_t rpc, int64_t nchunks, double *pw,
                         double *pb, fg_tensor *dw, fg_tensor *db)
{
    typedef typename Num<T>::A A;
    cudaStream_t st = fg_cuda_stream();
    const int64_t gx = (C + 31) / 32;
    if (gx > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "layernorm backward: too many columns (%lld)",
                        (long long)C);
    ln_bwd_cols_kernel<T><<<dim3((unsigned)gx, (unsigned)nchunks),
                            dim3(32, LN_COL_Y), 0, st>>>(
        dptr<T>(x), dptr<A>(mean), dptr<A>(rstd), dptr<T>(g), R, C, rpc, pw,
        pb);
    FG_CUDA_TRY_LAUNCH();
    ln_bwd_cols_final<T><<<fg_cuda_grid(C, 256), 256, 0, st>>>(
        pw, pb, nchunks, C, dptr<T>(dw), dptr<T>(db));
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status ln_bwd_t(const fg_tensor *x, const fg_tensor *w,
                   const fg_tensor *mean, const fg_tensor *rstd,
                   const fg_tensor *g, fg_tensor *dx, fg_tensor *dw,
                   fg_tensor *db)
{
    typedef typename Num<T>::A A;
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    cudaStream_t st = fg_cuda_stream();
    if (dx) {
        const T *xp = dptr<T>(x), *wp = dptr<T>(w), *gp = dptr<T>(g);
        const int64_t ws = w ? w->stride[0] : 0;
        T *dp = dptr<T>(dx);
        const A *mp = dptr<A>(mean), *rp = dptr<A>(rstd);
        RowLaunch L;
        FG_TRY(row_launch(R, C, "layernorm backward", &L));
        constexpr int VW = vec_width<T>();
        if (C % VW == 0 && aligned16(xp) && aligned16(gp) && aligned16(dp))
            ln_bwd_dx_kernel<T, VW><<<L.grid, L.block, 0, st>>>(
                xp, wp, ws, mp, rp, gp, R, C, dp);
        else
            ln_bwd_dx_kernel<T, 1><<<L.grid, L.block, 0, st>>>(
                xp, wp, ws, mp, rp, gp, R, C, dp);
        FG_CUDA_TRY_LAUNCH();
    }
    if (!dw && !db)
        return FG_OK;
    /* Chunks of >= 128 rows, at most 1024 of them (gridDim.y <= 65535). */
    int64_t rpc = 128;
    if (R > rpc * 1024)
        rpc = (R + 1023) / 1024;
    const int64_t nchunks = (R + rpc - 1) / rpc;
    const size_t pbytes = sizeof(double) * (size_t)(nchunks * C);
    double *pw = nullptr, *pb = nullptr;
    fg_status s = fg_cuda_mem_alloc(pbytes, (void **)&pw);
    if (s == FG_OK)
        s = fg_cuda_mem_alloc(pbytes, (void **)&pb);
    if (s == FG_OK)
        s = ln_cols_launch<T>(x, mean, rstd, g, R, C, rpc, nchunks, pw, pb, dw,
                              db);
    scratch_free(pw, pbytes);
    scratch_free(pb, pbytes);
    return s;
}

} /* namespace */

/* ---- entry points --------------------------------------------------------- */

extern "C" fg_status fg_cuda_layernorm_forward(const fg_tensor *x,
                                               const fg_tensor *weight,
                                               const fg_tensor *bias,
                                               double eps, fg_tensor *y,
                                               fg_tensor *mean, fg_tensor *rstd)
{
    if (x->numel == 0)
        return FG_OK;
    NN_BY_DTYPE(x->dtype, "fg_layernorm", ln_fwd_t, x, weight, bias, eps, y,
                mean, rstd);
}

extern "C" fg_status fg_cuda_layernorm_backward(
    const fg_tensor *x, const fg_tensor *weight, const fg_tensor *mean,
    const fg_tensor *rstd, const fg_tensor *g, fg_tensor *dx, fg_tensor *dw,
    fg_tensor *db)
{
    const int64_t C = x->shape[x->nd - 1];
    if (C == 0)
        return FG_OK;
    if (x->numel == 0) { /* no rows: the column sums are 0 */
        const size_t bytes = (size_t)C * fg_esize(x->dtype);
        if (dw)
            FG_TRY(fg_cuda_memset_zero(fg_tensor_base(dw), bytes));
        if (db)
            FG_TRY(fg_cuda_memset_zero(fg_tensor_base(db), bytes));
        return FG_OK;
    }
    NN_BY_DTYPE(x->dtype, "layernorm backward", ln_bwd_t, x, weight, mean,
                rstd, g, dx, dw, db);
}
