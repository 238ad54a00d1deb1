/* kernels/attn_fwd_wgmma.cu - fp16/bf16 FlashAttention forward for Hopper
 * (sm_90a) on warpgroup MMA (wgmma).
 *
 * One block of kWG warpgroups per (query block, head, batch); warpgroup w
 * owns 64 query rows, so the online softmax stays inside a warp (quad
 * shuffles) as in the sm_80 kernel. Per key block (Alg. 1 lines 6-12):
 *   S = Q K_j^T      wgmma, A = Q and B = K from shared memory (K-major),
 *   softmax          registers (accumulator layout = mma.sync C layout),
 *   O += P V_j       wgmma, A = P from registers (bf16/fp16), B = V from
 *                    shared memory read MN-major (transposed).
 * K/V tiles are double-buffered with 16-byte cp.async into 128-byte
 * swizzled panels (wgmma_sm90.cuh); the loads of K_{j+1} and V_j overlap
 * the MMAs of block j, and the softmax of block j overlaps the P V product
 * of block j-1 (see the loop). Masks only on boundary blocks; O
 * normalised once.
 * Every head dim in [8, 256] runs here (padded to 64/128/256); the same
 * alignment rule as the sm_80 path applies. */
#include "attn_common.cuh"
#include "attn_kernels.h"
#include "cuda_check.h"
#include "wgmma_sm90.cuh"

#include <stdlib.h>
#include <string.h>

namespace fg {

template <int D> struct FwdWgTile {
    static constexpr int kWG = 2;                 /* consumer warpgroups */
    static constexpr int kThreads = kWG * 128;
    static constexpr int kBr = 64 * kWG;          /* query rows per block */
    /* keys per block: S (kBc / 2 regs) + O (D / 2 regs) must fit. */
    static constexpr int kBc = D == 256 ? 64 : 128;
    static constexpr size_t kSmem =
        (size_t)(kBr * D + 4 * kBc * D) * 2 + 1024; /* Q + 2x(K, V) + align */
};

template <typename T, int D, bool kCausal, bool kDropout>
__global__ void __launch_bounds__(FwdWgTile<D>::kThreads, 1)
attn_fwd_wgmma_kernel(const AttnArgs a)
{
#ifdef FG_WGMMA_ENABLED
    using Tile = FwdWgTile<D>;
    constexpr int Br = Tile::kBr, Bc = Tile::kBc;
    constexpr int SR = Bc / 2; /* S registers per thread */
    constexpr int OR = D / 2;  /* O registers per thread */
    extern __shared__ unsigned char smem[];
    /* wgmma's swizzle atoms need 1024-byte alignment. */
    const uint32_t sQ = (smem_u32(smem) + 1023) & ~1023u;
    const uint32_t sK0 = sQ + Br * D * 2, sV0 = sK0 + Bc * D * 2;
    const uint32_t kv_stride = 2 * Bc * D * 2;

    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int mblk = kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int64_t i0 = (int64_t)mblk * Br;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
    const int64_t bh = (int64_t)b * a.H + h;
    const int rows = (int)min((int64_t)Br, a.Nq - i0);

    int64_t n_keys = a.Nk;
    if (kCausal) {
        const int64_t last = i0 + rows - 1 + a.shift + 1;
        n_keys = last < 0 ? 0 : min(last, n_keys);
    }
    const int nblocks = (int)((n_keys + Bc - 1) / Bc);

    /* Stage K_0 (with Q); iteration j then loads K_{j+1} and V_j, so the
     * V block a P V product reads lags its K block by one. */
    load_panels<T, D>(sQ, a.q, b, i0, h, Br, rows, a.d, Tile::kThreads);
    if (nblocks > 0)
        load_panels<T, D>(sK0, a.k, b, 0, hk, Bc, (int)min((int64_t)Bc, (int64_t)a.Nk),
                          a.d, Tile::kThreads);
    cp_async_commit();

    float o[OR];
#pragma unroll
    for (int i = 0; i < OR; i++)
        o[i] = 0.f;
    float m_raw[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.f, 0.f};
    const float scale_log2 = (float)(a.scale * 1.4426950408889634);
    /* This thread's rows: row_w and row_w + 8. */
    const int64_t row_w = i0 + wg * 64 + warp * 16 + g;
    const uint32_t sQw = sQ + wg * 64 * 128; /* this warpgroup's 64 rows */
    uint32_t pf[Bc / 16][4]; /* P_{j-1} as A fragments */

    /* O += P_{j-1} V_{j-1}: two n8 accumulator tiles of S are the A
     * fragment of one k16 step; V read transposed, 16 rows per step. */
    auto issue_pv = [&](uint32_t sV) {
        wg_fence();
        wg_fence_regs(o);
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++)
            WgmmaOp<T, D>::template rs<1>(o, pf[kk],
                                          wg_desc(sV + kk * 16 * 128, Bc * 128, 1024), 1);
        wg_commit();
    };

    /* Software pipeline (FA3's intra-warpgroup overlap): iteration j issues
     * S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back, then runs the
     * softmax of S_j while the P V product is still on the tensor cores;
     * O is rescaled by alpha_j once that product has landed. */
    for (int jb = 0; jb < nblocks; jb++) {
        const int64_t j0 = (int64_t)jb * Bc;
        const uint32_t sK = sK0 + (jb & 1) * kv_stride;
        {
            const int64_t jn = j0 + Bc;
            if (jb + 1 < nblocks) /* K_{j+1} */
                load_panels<T, D>(sK0 + ((jb + 1) & 1) * kv_stride, a.k, b, jn, hk, Bc,
                                  (int)min((int64_t)Bc, a.Nk - jn), a.d, Tile::kThreads);
            /* V_j */
            load_panels<T, D>(sV0 + (jb & 1) * kv_stride, a.v, b, j0, hk, Bc,
                              (int)min((int64_t)Bc, a.Nk - j0), a.d, Tile::kThreads);
            cp_async_commit();
            cp_async_wait<1>(); /* K_j and V_{j-1} have landed */
        }
        fence_proxy_async();
        __syncthreads();

        /* S = Q_i K_j^T (Alg1 L.9): D/16 k-steps, 32 bytes apart inside a
         * 128-byte swizzled row, 64 columns per panel. */
        float s[SR];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint32_t koff = (kk & 3) * 32;
            const uint64_t dq = wg_desc(sQw + (kk >> 2) * Br * 128 + koff, 16, 1024);
            const uint64_t dk = wg_desc(sK + (kk >> 2) * Bc * 128 + koff, 16, 1024);
            WgmmaOp<T, Bc>::template ss<0, 0>(s, dq, dk, kk > 0);
        }
        wg_commit();
        if (jb > 0) {
            issue_pv(sV0 + ((jb - 1) & 1) * kv_stride);
            wg_wait<1>(); /* S_j done; the P V product may still run */
        } else {
            wg_wait<0>();
        }
        wg_fence_regs(s);

        const bool need_mask = j0 + Bc > a.Nk ||
                               (kCausal && j0 + Bc - 1 > i0 + wg * 64 + a.shift);
        if (need_mask) {
#pragma unroll
            for (int i = 0; i < SR; i++) {
                const int64_t r = row_w + ((i >> 1) & 1) * 8;
                const int64_t j = j0 + (i >> 2) * 8 + 2 * t4 + (i & 1);
                if (j >= a.Nk || (kCausal && j > r + a.shift))
                    s[i] = -INFINITY;
            }
        }

        /* Online softmax (Alg1 L.10-11) on rows g (r = 0) and g + 8. */
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m_raw[r];
#pragma unroll
            for (int n = 0; n < Bc / 8; n++)
                mx = fmaxf(mx, fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float ms = mx == -INFINITY ? 0.f : mx * scale_log2;
            alpha[r] = mx == -INFINITY ? 1.f : exp2f(m_raw[r] * scale_log2 - ms);
            m_raw[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < Bc / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2f(fmaf(s[4 * n + 2 * r + e], scale_log2, -ms));
                    s[4 * n + 2 * r + e] = p;
                    sum += p;
                }
            l_part[r] = l_part[r] * alpha[r] + sum;
        }

        if (kDropout) { /* zero dropped P; 1/(1-p) is applied at the end */
            const uint2 key = make_uint2(fg_dropout_key_x(a.seed, a.offset),
                                         fg_dropout_key_y(a.seed, a.offset));
#pragma unroll
            for (int n = 0; n < Bc / 8; n++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int64_t j = j0 + n * 8 + 2 * t4;
                    const uint4 w = curand_Philox4x32_10(
                        make_uint4(fg_dropout_ctr_x(j), fg_dropout_ctr_y(row_w + 8 * r),
                                   fg_dropout_ctr_z(bh), fg_dropout_ctr_w(a.offset)),
                        key);
                    const uint32_t w0 = (j & 2) ? w.z : w.x, w1 = (j & 2) ? w.w : w.y;
                    if (!fg_dropout_keep(w0, a.keep_threshold))
                        s[4 * n + 2 * r] = 0.f;
                    if (!fg_dropout_keep(w1, a.keep_threshold))
                        s[4 * n + 2 * r + 1] = 0.f;
                }
        }

        /* The P V product has landed: O *= alpha_j (it already holds
         * P_{j-1} V_{j-1}, which alpha_j rescales too), then P_j -> pf. */
        wg_wait<0>();
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                asm volatile("" : "+r"(pf[kk][x])::"memory");
        wg_fence_regs(o);
#pragma unroll
        for (int i = 0; i < OR; i++)
            o[i] *= alpha[(i >> 1) & 1];
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++) {
            pf[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
            pf[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
            pf[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
            pf[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
        }
        __syncthreads(); /* K_j and V_{j-1} buffers are refilled next */
    }
    if (nblocks > 0) { /* the last P V product */
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();
        issue_pv(sV0 + ((nblocks - 1) & 1) * kv_stride);
        wg_wait<0>();
        wg_fence_regs(o);
    }

    /* Epilogue: full row sums over the quad, O / l * 1/(1-p), m and l. */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = l_part[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int64_t i = row_w + 8 * r;
        const float inv = l > 0.f ? (float)a.keep_scale / l : 0.f;
        if (i < a.Nq) {
            T *dst = elem<T>(a.o, b, i, h);
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                const int c = n * 8 + 2 * t4;
                if (c < a.d)
                    *reinterpret_cast<uint32_t *>(dst + c) =
                        pack2<T>(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
            }
            if (t4 == 0) {
                const float mr = m_raw[r];
                ((float *)a.m)[bh * a.Nq + i] =
                    mr == -INFINITY ? -INFINITY : mr * (float)a.scale;
                ((float *)a.l)[bh * a.Nq + i] = l;
            }
        }
    }
#endif
}

template <typename T, int D, bool kCausal, bool kDropout>
static fg_status launch(const AttnArgs &a, cudaStream_t st)
{
    using Tile = FwdWgTile<D>;
    auto kern = attn_fwd_wgmma_kernel<T, D, kCausal, kDropout>;
    FG_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)Tile::kSmem));
    dim3 grid((unsigned)((a.Nq + Tile::kBr - 1) / Tile::kBr), (unsigned)a.H,
              (unsigned)a.B);
    kern<<<grid, Tile::kThreads, Tile::kSmem, st>>>(a);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T, int D>
static fg_status launch_opts(const AttnArgs &a, cudaStream_t st)
{
    if (a.causal)
        return a.dropout ? launch<T, D, true, true>(a, st) : launch<T, D, true, false>(a, st);
    return a.dropout ? launch<T, D, false, true>(a, st) : launch<T, D, false, false>(a, st);
}

template <typename T>
static fg_status launch_dim(const AttnArgs &a, cudaStream_t st)
{
    if (a.d <= 64)
        return launch_opts<T, 64>(a, st);
    if (a.d <= 128)
        return launch_opts<T, 128>(a, st);
    return launch_opts<T, 256>(a, st);
}

/* 1 in the sm_90a image, 0 in every other (sm_80 SASS, PTX): reading it
 * tells which image the runtime loaded for the current device. */
__device__ int fg_wgmma_image =
#ifdef FG_WGMMA_ENABLED
    1;
#else
    0;
#endif

bool wgmma_usable()
{
    const char *force = getenv("FG_ATTN_KERNEL");
    if (force && (strcmp(force, "mma") == 0 || strcmp(force, "general") == 0))
        return false;
    static int cached[64]; /* per device: 0 unknown, 1 yes, 2 no */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return false;
    if (!cached[dev]) {
        int major = 0, minor = 0, img = 0;
        bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                  major == 9 && minor == 0 &&
                  cudaMemcpyFromSymbol(&img, fg_wgmma_image, sizeof img) == cudaSuccess &&
                  img == 1;
        cudaGetLastError(); /* a failed probe is an answer, not an error */
        cached[dev] = ok ? 1 : 2;
    }
    return cached[dev] == 1;
}

size_t attn_fwd_wgmma_smem(int d)
{
    return d <= 64 ? FwdWgTile<64>::kSmem : d <= 128 ? FwdWgTile<128>::kSmem
                                                     : FwdWgTile<256>::kSmem;
}

fg_status attn_fwd_wgmma_dispatch(fg_dtype dt, const AttnArgs &a, cudaStream_t st)
{
    if (dt == FG_BF16)
        return launch_dim<__nv_bfloat16>(a, st);
    return launch_dim<__half>(a, st);
}

} /* namespace fg */
