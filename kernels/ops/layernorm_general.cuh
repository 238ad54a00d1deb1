/* SPDX-License-Identifier: MIT */
/* kernels/ops/layernorm_general.cuh - the layernorm's general kernels (any
 * row length, scalar loads: three passes, column sums by kernels of their
 * own) and ln_partials_sum, which sums the partial dweight / dbias rows of
 * either kind in a fixed order. Included by ops_layernorm.cu alone
 * (anonymous namespace). */
#ifndef FG_KERNELS_OPS_LAYERNORM_GENERAL_CUH
#define FG_KERNELS_OPS_LAYERNORM_GENERAL_CUH

#include "layernorm_reg.cuh"

namespace {

/* ---- general kernels (any C; scalar loads) -------------------------------- */

/* Two passes for mean and variance (no cancellation), a third to write y;
 * the row stays in L1/L2 between passes. Launch: row_launch. */
template <typename T, typename To>
__global__ void ln_fwd_rows(const T *__restrict__ x, const T *__restrict__ w,
                            int64_t ws, const T *__restrict__ b, int64_t bs,
                            int64_t R, int64_t C, typename Num<T>::A eps,
                            To *__restrict__ y,
                            typename Num<T>::A *__restrict__ mean,
                            typename Num<T>::A *__restrict__ rstd)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * C;
    To *yr = y + row * C;
    A sum = A(0);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
        sum += Num<T>::ld(xr[j]);
    const A mu = row_sum(sum) / (A)C;
    A sq = A(0);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        const A d = Num<T>::ld(xr[j]) - mu;
        sq = d_fma(d, d, sq);
    }
    const A rs = A(1) / d_sqrt(row_sum(sq) / (A)C + eps);
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        A wv, bv;
        load_par<T, 1>(w, ws, j, A(1), &wv);
        load_par<T, 1>(b, bs, j, A(0), &bv);
        yr[j] = to_s<To>(d_fma((Num<T>::ld(xr[j]) - mu) * rs, wv, bv));
    }
}

template <typename T, typename Tg>
__global__ void ln_bwd_dx_rows(const T *__restrict__ x,
                               const T *__restrict__ w, int64_t ws,
                               const typename Num<T>::A *__restrict__ mean,
                               const typename Num<T>::A *__restrict__ rstd,
                               const Tg *__restrict__ g, int64_t R, int64_t C,
                               T *__restrict__ dx, bool dx_acc)
{
    typedef typename Num<T>::A A;
    const int64_t row = row_index();
    if (row >= R)
        return;
    const T *xr = x + row * C;
    const Tg *gr = g + row * C;
    const A mu = mean[row], rs = rstd[row];
    A s1 = A(0), s2 = A(0);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        A wv;
        load_par<T, 1>(w, ws, j, A(1), &wv);
        const A xh = (Num<T>::ld(xr[j]) - mu) * rs;
        const A wg = mul_rn((A)Num<Tg>::ld(gr[j]), wv);
        s1 += wg;
        s2 = d_fma(wg, xh, s2);
    }
    const A m1 = row_sum(s1) / (A)C, m2 = row_sum(s2) / (A)C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        A wv;
        load_par<T, 1>(w, ws, j, A(1), &wv);
        const A xh = (Num<T>::ld(xr[j]) - mu) * rs;
        const A wg = mul_rn((A)Num<Tg>::ld(gr[j]), wv);
        A d = mul_rn(rs, d_fma(-xh, m2, wg - m1));
        if (dx_acc) /* dx rounded, then the accumulation's add */
            d = add_rn(Num<T>::ld(dx[row * C + j]), Num<T>::ld(Num<T>::st(d)));
        dx[row * C + j] = Num<T>::st(d);
    }
}

/* Sums a and b over the Y row lanes (threadIdx.y) of each column
 * (threadIdx.x, 32 of them) in lane order; lane 0 gets the totals. */
template <int Y, typename P>
__device__ __forceinline__ void lanes_sum(P &a, P &b)
{
    __shared__ P sa[Y][32], sb[Y][32];
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0) {
        P ta = P(0), tb = P(0);
#pragma unroll
        for (int k = 0; k < Y; k++) {
            ta += sa[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
        }
        a = ta;
        b = tb;
    }
}

/* dw / db partials of the general path: block (32 columns) x (LN_COL_Y row
 * lanes) sums a chunk of rows of its columns, lanes combined in order; one
 * partial per (chunk, column). */
#define LN_COL_Y 8

template <typename T, typename Tg>
__global__ void ln_bwd_cols(const T *__restrict__ x,
                            const typename Num<T>::A *__restrict__ mean,
                            const typename Num<T>::A *__restrict__ rstd,
                            const Tg *__restrict__ g, int64_t R, int64_t C,
                            int64_t rows_per_chunk,
                            typename Num<T>::A *__restrict__ pw,
                            typename Num<T>::A *__restrict__ pb)
{
    typedef typename Num<T>::A A;
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
    A aw = A(0), ab = A(0);
    if (col < C) {
        for (int64_t r = r0 + threadIdx.y; r < r1; r += LN_COL_Y) {
            const A gv = (A)Num<Tg>::ld(g[r * C + col]);
            const A xh = (Num<T>::ld(x[r * C + col]) - mean[r]) * rstd[r];
            aw = d_fma(gv, xh, aw);
            ab += gv;
        }
    }
    lanes_sum<LN_COL_Y>(aw, ab);
    if (threadIdx.y == 0 && col < C) {
        pw[(int64_t)blockIdx.y * C + col] = aw;
        pb[(int64_t)blockIdx.y * C + col] = ab;
    }
}

/* dw, db = the n partial rows [n, C] summed per column in fp64, one
 * rounding to T: block (32 columns) x (LN_SUM_Y lanes), lane l summing
 * rows l, l + LN_SUM_Y, ... in order, then the lanes in order (many
 * short chains: a column's few hundred dependent loads in one thread
 * would take longer than the backward itself). Either output may be
 * NULL. With acc the sums are added to dw / db (in T, as
 * fg_grad_accumulate adds the rounded sums). */
#define LN_SUM_Y 32

/* *d = t rounded to T, or *d += that (the rounded sum added in T's
 * compute type, as fg_grad_accumulate adds). */
template <typename T>
__device__ __forceinline__ void ln_put(T *d, double t, bool acc)
{
    const T r = Num<T>::st_d(t);
    *d = acc ? Num<T>::st(Num<T>::ld(*d) + Num<T>::ld(r)) : r;
}

template <typename T, typename P>
__global__ void ln_partials_sum(const P *__restrict__ pw,
                                const P *__restrict__ pb, int64_t n,
                                int64_t C, T *__restrict__ dw,
                                T *__restrict__ db, bool acc)
{
    const int64_t col = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double tw = 0.0, tb = 0.0;
    if (col < C)
        for (int64_t k = threadIdx.y; k < n; k += LN_SUM_Y) {
            tw += (double)pw[k * C + col];
            tb += (double)pb[k * C + col];
        }
    lanes_sum<LN_SUM_Y>(tw, tb);
    if (threadIdx.y != 0 || col >= C)
        return;
    if (dw)
        ln_put(dw + col, tw, acc);
    if (db)
        ln_put(db + col, tb, acc);
}

} // namespace

#endif /* FG_KERNELS_OPS_LAYERNORM_GENERAL_CUH */
