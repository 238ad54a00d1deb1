/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_rows.cuh - the per-row passes around every
 * backward kernel (attn_bwd.cu launches them):
 *  - attn_bwd_preprocess: D = rowsum(dO * O) per query row (FA2);
 *  - attn_bwd_pad_stats: lse2 and D into the wgmma backward's padded rows;
 *  - attn_bwd_prep_tiled: both and dq_acc's zeroing in one pass (the
 *    wgmma backward of a dense batch);
 *  - attn_bwd_write_dq(_tiled): the fp32 dQ accumulator converted to dQ's
 *    dtype and strides.
 * They move O(B H N d) bytes once, so they should run at memory speed: no
 * 64-bit division per element (the per-element form of write_dq spent
 * 318 us on 33M elements of an H200, 5x its memory time) and 16-byte
 * accesses where the operands allow. */
#ifndef FG_KERNELS_ATTN_BWD_ROWS_CUH
#define FG_KERNELS_ATTN_BWD_ROWS_CUH

#include "attn_common.cuh"
#include "kernels/runtime/cuda_check.h"

namespace fg {

/* One lane's share of rowsum(dO * O) over a row of d (d % 8 == 0) 2-byte
 * elements, 8 lanes a row: lane's 16-byte pieces lane, lane + 8, ... of
 * O and dO (none unless on). The row's sum is the 8 lanes' shuffle sum. */
template <typename T>
__device__ __forceinline__ float row_dot_vec8(const T *o, const T *g, int d, int lane, bool on)
{
    float acc = 0.f;
    for (int x = lane; on && x < d / 8; x += 8) {
        const uint4 ov = reinterpret_cast<const uint4 *>(o)[x];
        const uint4 gv = reinterpret_cast<const uint4 *>(g)[x];
        const T *oe = reinterpret_cast<const T *>(&ov), *ge = reinterpret_cast<const T *>(&gv);
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc += to_acc(oe[e]) * to_acc(ge[e]);
    }
    return acc;
}

/* kVec (fp16/bf16, vec16_ok O and dO, d % 8 == 0): 8 lanes per row, 16
 * bytes of O and dO per lane and step; else a warp per row, one element
 * per lane and step. */
template <typename T, bool kVec>
__global__ void __launch_bounds__(256) attn_bwd_preprocess(const AttnArgs a)
{
    typedef typename AccOf<T>::type A;
    constexpr int L = kVec ? 8 : 32, R = 32 / L; /* lanes per row, rows per warp */
    const int lane = threadIdx.x % L;
    const int64_t rows = stat_rows(a);
    /* the loop runs per warp (its shuffles need every lane) */
    for (int64_t wr = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; wr * R < rows;
         wr += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        const int64_t row = wr * R + (threadIdx.x & 31) / L;
        int64_t b = 0, h = 0, i = 0;
        bool owned = false;
        if (row < rows)
            stat_coords(a, row, &b, &h, &i, &owned);
        const T *o = elem<T>(a.o, b, i, h), *g = elem<T>(a.dout, b, i, h);
        A acc = 0;
        if constexpr (kVec) {
            acc = row_dot_vec8(o, g, a.d, lane, owned);
        } else {
            for (int x = lane; owned && x < a.d; x += L)
                acc += to_acc(o[x]) * to_acc(g[x]);
        }
#pragma unroll
        for (int s = L / 2; s > 0; s >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, s, L);
        if (lane == 0 && row < rows)
            ((A *)a.D)[row] = acc;
    }
}

/* lse2 = m log2(e) + log2(l) (+inf for empty rows) and D, into the padded
 * [B*H][nq_pad] arrays the wgmma backward bulk-copies per query block (a
 * packed batch too: row i of sequence b, whose stats are packed row
 * cu_q[b] + i of head h). */
__global__ void attn_bwd_pad_stats(const AttnArgs a)
{
    const int64_t n = (int64_t)a.B * a.H * a.nq_pad;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t bh = idx / a.nq_pad, i = idx % a.nq_pad;
        int64_t row = bh * a.Nq + i, nq = a.Nq;
        if (a.cu_q) {
            const int64_t b = bh / a.H, h = bh % a.H;
            nq = a.cu_q[b + 1] - a.cu_q[b];
            row = h * a.total_q + a.cu_q[b] + i;
        }
        float lse = INFINITY, dd = 0.f;
        if (i < nq) {
            lse = stat_lse2(a, row);
            dd = ((const float *)a.D)[row];
        }
        ((float *)a.lse2p)[idx] = lse;
        ((float *)a.Dp)[idx] = dd;
    }
}

/* The query rows of sequence b, head h in the tiled passes below: a
 * dense batch's, or packed rows cu_q[b] .. cu_q[b + 1] (operands in batch
 * 0, stats per packed token), clamped to Nq (nq_pad's rows). */
struct TileSeq {
    int64_t nq;   /* the sequence's query rows */
    int64_t ob;   /* operand batch index */
    int64_t orow; /* operand row of its row 0 */
    int64_t srow; /* stats row (m, l, D) of its row 0 */
};
/* f += g, lane by lane: the dQ writers' sum over the accumulator's copies */
__device__ __forceinline__ void add4(float4 &f, const float4 &g)
{
    f.x += g.x;
    f.y += g.y;
    f.z += g.z;
    f.w += g.w;
}

__device__ __forceinline__ TileSeq tile_seq(const AttnArgs &a, int b, int h)
{
    if (a.cu_q) {
        const int64_t r0 = a.cu_q[b];
        return {min((int64_t)a.cu_q[b + 1] - r0, (int64_t)a.Nq), 0, r0, h * a.total_q + r0};
    }
    return {a.Nq, b, 0, ((int64_t)b * a.H + h) * a.Nq};
}

/* The wgmma backward's prologue in one pass (what attn_bwd_preprocess,
 * attn_bwd_pad_stats and a memset of dq_acc do, for one launch instead of
 * three; GPT-2-small's attention spent about a tenth of its backward in
 * them): block (tile t, head h, sequence b) takes the sequence's query
 * rows 64 t .. 64 t + 63, 8 lanes a row, writes D, lse2p and Dp (padding
 * rows +inf / 0), and zeroes the tile's 64 x Dp floats of dq_acc in
 * every copy. O, dO: vec16_ok, d % 8 == 0. */
template <typename T>
__global__ void __launch_bounds__(256) attn_bwd_prep_tiled(const AttnArgs a)
{
    const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % 8;
    const int64_t bh = (int64_t)b * a.H + h, i0 = (int64_t)blockIdx.x * 64;
    const TileSeq sq = tile_seq(a, b, h);
    for (int r = threadIdx.x / 8; r < 64; r += 32) {
        const int64_t i = i0 + r;
        float acc = 0.f;
        if (i < sq.nq)
            acc = row_dot_vec8(elem<T>(a.o, sq.ob, sq.orow + i, h),
                               elem<T>(a.dout, sq.ob, sq.orow + i, h), a.d, lane, true);
#pragma unroll
        for (int s = 4; s > 0; s >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, s, 8);
        if (lane == 0) {
            const int64_t idx = bh * a.nq_pad + i, row = sq.srow + i;
            float lse = INFINITY;
            if (i < sq.nq) {
                lse = stat_lse2(a, row);
                ((float *)a.D)[row] = acc;
            }
            ((float *)a.lse2p)[idx] = lse;
            ((float *)a.Dp)[idx] = acc;
        }
    }
    const int64_t n4 = 64 * (int64_t)a.dq_tile_d / 4,
                  cs = (int64_t)a.B * a.H * a.nq_pad * a.dq_tile_d / 4; /* copy stride */
    float4 *tile = reinterpret_cast<float4 *>(a.dq_acc) + (bh * a.nq_pad + i0) * a.dq_tile_d / 4;
    for (int c = 0; c < max(a.dq_copies, 1); c++)
        for (int64_t w = threadIdx.x; w < n4; w += blockDim.x)
            tile[c * cs + w] = make_float4(0.f, 0.f, 0.f, 0.f);
}

/* dQ from the accumulator, a warp per row (its coordinates once), lanes
 * over the columns: row-major [rows][d] or the wgmma backward's tiles
 * (dq_tiled_index; a packed row as row i - cu_q[b] of its sequence b). */
template <typename T>
__global__ void __launch_bounds__(256) attn_bwd_write_dq(const AttnArgs a)
{
    typedef typename AccOf<T>::type A;
    const int lane = threadIdx.x & 31;
    const int64_t rows = stat_rows(a);
    for (int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows;
         row += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        int64_t b, h, i;
        bool owned;
        stat_coords(a, row, &b, &h, &i, &owned);
        if (!owned) /* packed rows past cu_q[B] are left alone */
            continue;
        T *dst = elem<T>(a.dq, b, i, h);
        const A *src = (const A *)a.dq_acc + row * a.d;
        if (a.dq_tile_d) {
            int64_t sb = b, si = i;
            if (a.cu_q) {
                sb = packed_seq(a.cu_q, a.B, i);
                si = i - a.cu_q[sb];
            }
            const int64_t cs = (int64_t)a.B * a.H * a.nq_pad * a.dq_tile_d; /* copy stride */
            const A sc = (A)a.scale; /* the wgmma kernels sum dS K unscaled */
            for (int x = lane; x < a.d; x += 32) {
                const int64_t bh = sb * a.H + h, np = a.nq_pad;
                const A *s0 = (const A *)a.dq_acc +
                              (a.dq_tile_q == 80 ? dq_t80_index(bh, np, a.dq_tile_d, si, x)
                                                 : dq_tiled_index(bh, np, a.dq_tile_d, si, x));
                A v = s0[0];
                for (int c = 1; c < a.dq_copies; c++) /* in order: bitwise repeatable */
                    v += s0[c * cs];
                dst[x] = from_acc<T>(v * sc);
            }
        } else {
            for (int x = lane; x < a.d; x += 32)
                dst[x] = from_acc<T>(src[x]);
        }
    }
}

/* The wgmma backward's dQ (fp16/bf16): block (tile t, head h, sequence
 * b) converts the 64 x Dp floats of tile t (a packed batch: rows past the
 * sequence's end are not its own). A work item is
 * rows ir and ir + 8 (ir & 8 = 0) by 8 columns c0 .. c0 + 7: in the tile
 * (dq_tiled_index) those are four consecutive float4, float4 k holding
 * columns c0 + 2k, c0 + 2k + 1 of row ir (x, y) and of row ir + 8 (z, w).
 * kVec (vec16_ok dQ): each row's 8 values leave as one 16-byte store. */
template <typename T, bool kVec>
__global__ void __launch_bounds__(256) attn_bwd_write_dq_tiled(const AttnArgs a)
{
    const int Dp = a.dq_tile_d, DQ = Dp / 2, chunks = Dp / 8;
    const int h = blockIdx.y, b = blockIdx.z;
    const int64_t i0 = (int64_t)blockIdx.x * 64;
    const TileSeq sq = tile_seq(a, b, h);
    if (i0 >= sq.nq)
        return;
    const float *tile = (const float *)a.dq_acc + (((int64_t)b * a.H + h) * a.nq_pad + i0) * Dp;
    for (int w = threadIdx.x; w < 32 * chunks; w += blockDim.x) {
        const int pr = w / chunks, c0 = (w % chunks) * 8;
        const int ir = (pr >> 3) * 16 + (pr & 7);
        const int run = (c0 / DQ) * 4 + (ir >> 4), cc = c0 % DQ;
        const float4 *src =
            reinterpret_cast<const float4 *>(tile + run * DQ * 16) + (cc >> 3) * 32 + (ir & 7) * 4;
        float4 f[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            f[k] = src[k];
        for (int c = 1; c < a.dq_copies; c++) { /* in order: bitwise repeatable */
            const float4 *sc = src + c * (((int64_t)a.B * a.H * a.nq_pad * Dp) / 4);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4 g = sc[k]; /* loaded first: add4(f[k], sc[k]) allocated
                                         * this pass's registers differently */
                add4(f[k], g);
            }
        }
        const float scale = (float)a.scale; /* the wgmma kernels sum dS K unscaled */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            f[k].x *= scale;
            f[k].y *= scale;
            f[k].z *= scale;
            f[k].w *= scale;
        }
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int64_t i = i0 + ir + 8 * half;
            if (i >= sq.nq)
                continue;
            T *dst = elem<T>(a.dq, sq.ob, sq.orow + i, h) + c0;
            uint32_t p[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                p[k] = half ? pack2<T>(f[k].z, f[k].w) : pack2<T>(f[k].x, f[k].y);
            if (kVec && c0 + 8 <= a.d) {
                *reinterpret_cast<uint4 *>(dst) = make_uint4(p[0], p[1], p[2], p[3]);
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (c0 + 2 * k < a.d)
                        dst[2 * k] = from_acc<T>(half ? f[k].z : f[k].x);
                    if (c0 + 2 * k + 1 < a.d)
                        dst[2 * k + 1] = from_acc<T>(half ? f[k].w : f[k].y);
                }
            }
        }
    }
}

/* The same for the 80-query transposed tiles (dq_t80_index, d = 128):
 * block (tile t, head h, sequence b) reads tile t's 80 x 128 floats in
 * order (a float4: d rows r, r + 8 by queries q, q + 1), transposes them
 * through shared memory (row stride 132 floats: the lanes of a warp write
 * 32 banks) and writes each query row's 8-column chunks. */
template <typename T, bool kVec>
__global__ void __launch_bounds__(256) attn_bwd_write_dq_t80(const AttnArgs a)
{
    constexpr int QT = 80, DP = 128, LD = DP + 4;
    __shared__ float4 sm4[QT * LD / 4]; /* [query][LD] floats */
    float *sm = reinterpret_cast<float *>(sm4);
    const int h = blockIdx.y, b = blockIdx.z;
    const int64_t i0 = (int64_t)blockIdx.x * QT;
    const TileSeq sq = tile_seq(a, b, h);
    if (i0 >= sq.nq)
        return;
    const int64_t cs = ((int64_t)a.B * a.H * a.nq_pad * DP) / 4; /* copy stride, float4 */
    const int64_t row0 = ((int64_t)b * a.H + h) * a.nq_pad + i0;
    const float4 *tile = reinterpret_cast<const float4 *>(a.dq_acc) + row0 * DP / 4;
    const float scale = (float)a.scale; /* the wgmma kernels sum dS K unscaled */
    for (int w = threadIdx.x; w < QT * DP / 4; w += blockDim.x) {
        float4 f = tile[w];
        for (int c = 1; c < a.dq_copies; c++) /* in order: bitwise repeatable */
            add4(f, tile[c * cs + w]);
        /* float4 w: run w / 320, fragment n = (w % 320) / 32, lane w % 32 */
        const int run = w / (QT * 4), n = (w % (QT * 4)) >> 5, lane = w & 31;
        const int r = 16 * run + (lane >> 2), q = 8 * n + 2 * (lane & 3);
        sm[q * LD + r] = f.x * scale;
        sm[(q + 1) * LD + r] = f.y * scale;
        sm[q * LD + r + 8] = f.z * scale;
        sm[(q + 1) * LD + r + 8] = f.w * scale;
    }
    __syncthreads();
    const int rows = (int)min((int64_t)QT, sq.nq - i0);
    for (int w = threadIdx.x; w < rows * (DP / 8); w += blockDim.x) {
        const int q = w / (DP / 8), c0 = (w % (DP / 8)) * 8;
        if (c0 >= a.d)
            continue;
        const float4 lo = sm4[(q * LD + c0) / 4], hi = sm4[(q * LD + c0) / 4 + 1];
        T *dst = elem<T>(a.dq, sq.ob, sq.orow + i0 + q, h) + c0;
        if (kVec && c0 + 8 <= a.d) {
            *reinterpret_cast<uint4 *>(dst) =
                make_uint4(pack2<T>(lo.x, lo.y), pack2<T>(lo.z, lo.w), pack2<T>(hi.x, hi.y),
                           pack2<T>(hi.z, hi.w));
        } else {
            const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            for (int k = 0; k < 8 && c0 + k < a.d; k++)
                dst[k] = from_acc<T>(v[k]);
        }
    }
}

/* Grid of a grid-stride pass of n work items, 256 threads a block. */
__host__ __forceinline__ unsigned rows_grid(int64_t n)
{
    const int64_t blocks = (n + 255) / 256;
    return (unsigned)(blocks < (1 << 20) ? blocks : (1 << 20));
}

template <typename T>
fg_status launch_bwd_preprocess(const AttnArgs &a, cudaStream_t st)
{
    const int64_t rows = stat_rows(a);
    if (rows <= 0)
        return FG_OK;
    bool vec = false;
    if constexpr (sizeof(T) == 2) {
        vec = a.d % 8 == 0 && vec16_ok(a.o) && vec16_ok(a.dout);
        if (vec)
            attn_bwd_preprocess<T, true><<<rows_grid(rows * 8), 256, 0, st>>>(a);
    }
    if (!vec)
        attn_bwd_preprocess<T, false><<<rows_grid(rows * 32), 256, 0, st>>>(a);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* attn_bwd_prep_tiled where it applies (fp16/bf16 on the wgmma path with
 * dq_tile_d set: dq_acc holds exactly the tiles, no turn counters,
 * 16-byte rows; packed batches too: H200, 8 x 2048 packed, d = 128, one
 * launch for the memset, preprocess and pad passes' 85 us); *done = false
 * otherwise, nothing launched. */
template <typename T>
fg_status launch_bwd_prep_tiled(const AttnArgs &a, cudaStream_t st, bool *done)
{
    *done = false;
    if constexpr (sizeof(T) == 2) {
        const size_t tiles = sizeof(float) * (size_t)a.B * a.H * a.nq_pad * a.dq_tile_d *
                             (size_t)(a.dq_copies > 1 ? a.dq_copies : 1);
        if (a.dq_sem || a.dq_zero != tiles || a.d % 8 != 0 ||
            !vec16_ok(a.o) || !vec16_ok(a.dout) || a.H > 65535 || a.B > 65535 ||
            a.nq_pad / 64 > INT32_MAX || stat_rows(a) <= 0)
            return FG_OK;
        dim3 grid((unsigned)(a.nq_pad / 64), (unsigned)a.H, (unsigned)a.B);
        attn_bwd_prep_tiled<T><<<grid, 256, 0, st>>>(a);
        FG_CUDA_TRY_LAUNCH();
        *done = true;
    }
    return FG_OK;
}

template <typename T>
fg_status launch_bwd_write_dq(const AttnArgs &a, cudaStream_t st)
{
    const int64_t rows = stat_rows(a);
    if (rows <= 0 || a.d <= 0)
        return FG_OK;
    bool tiled = false;
    if constexpr (sizeof(T) == 2) {
        /* packed batches too (H200, 8 x 2048 packed, d = 128: 162 us by
         * attn_bwd_write_dq's row walk, 47 us dense by this one) */
        tiled = a.dq_tile_d && a.H <= 65535 && a.B <= 65535;
        if (tiled && a.dq_tile_q == 80) {
            dim3 grid((unsigned)(a.nq_pad / 80), (unsigned)a.H, (unsigned)a.B);
            if (vec16_ok(a.dq))
                attn_bwd_write_dq_t80<T, true><<<grid, 256, 0, st>>>(a);
            else
                attn_bwd_write_dq_t80<T, false><<<grid, 256, 0, st>>>(a);
        } else if (tiled) {
            dim3 grid((unsigned)(a.nq_pad / 64), (unsigned)a.H, (unsigned)a.B);
            if (vec16_ok(a.dq))
                attn_bwd_write_dq_tiled<T, true><<<grid, 256, 0, st>>>(a);
            else
                attn_bwd_write_dq_tiled<T, false><<<grid, 256, 0, st>>>(a);
        }
    }
    if (!tiled)
        attn_bwd_write_dq<T><<<rows_grid(rows * 32), 256, 0, st>>>(a);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

} /* namespace fg */

#endif
