/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_mma.cu - fast fp16/bf16 FlashAttention forward on tensor
 * cores (mma.sync m16n8k16, sm_80+), FlashAttention-2 style.
 *
 * One block of 4 warps per (query block, head, batch). Each warp owns 16 or
 * 32 query rows, so the online softmax needs no cross-warp reduction: row
 * max and row sum are reduced over the 4 lanes of a quad. S = Q K^T and
 * O += P V run on tensor cores with fp32 accumulators; P is converted to
 * fp16/bf16 in registers and fed straight to the P V product (the S
 * accumulator layout of two n8 tiles is the A-fragment layout of one k16
 * step). exp2 with scale*log2(e) folded into one FFMA; O normalised once at
 * the end; masks only on boundary blocks. K/V tiles are double-buffered
 * with 16-byte cp.async into XOR-swizzled shared memory.
 *
 * Head dims are padded up to 64, 128 or 256 (zero-filled columns), so every
 * d in [8, 256] takes this path; it needs 16-byte aligned rows (pointers and
 * strides multiples of 8 elements), otherwise the general kernel runs.
 *
 * kMode: 0 no mask or bottom-right causal (the tuned paths; a.causal picks
 * causal at run time), 2 the variants (band of any window or alignment,
 * block lists, softcap, ALiBi), kept in their own instantiation so the
 * tuned one carries none of their code; 4 the variants with an additive
 * bias (its own instantiation: in mode 2 the bias's loads took the d = 128
 * kernels from 8-104 to 352-416 bytes of spills, ptxas sm_80 and sm_90).
 * kRagged (kMode 2): packed batches and key padding (cu_seqlens,
 * seqused_k), each sequence a problem of its own (seq_args), as the
 * general kernel runs them. */
#include "attn_common.cuh"
#include "attn_kernels.h"
#include "attn_mma_tile.cuh"
#include "kernels/runtime/cuda_check.h"
#include "mma_sm80.cuh"

namespace fg {

template <int D> struct FwdTile {
    /* m16 tiles per warp: two for d <= 128, so every K/V fragment read from
     * shared memory feeds two MMAs (4 warps); one for d = 256, where the O
     * accumulator fills the register budget (8 warps). */
    static constexpr int kMT = D == 256 ? 1 : 2;
    static constexpr int kWarps = D == 256 ? 8 : 4;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kBr = 16 * kMT * kWarps;  /* 128 query rows */
    static constexpr int kBc = D == 256 ? 32 : 64; /* keys per block */
    static constexpr int kChunks = D / 8;         /* 16-byte chunks per row */
    static constexpr size_t kSmem =
        (size_t)(kBr * D + 4 * kBc * D) * 2;      /* Q + 2x(K, V) */
};

/* Where one kernel serves both dropout settings (dropout a run-time flag,
 * a.dropout): half the kernels to build, only where the merged kernel
 * spills no more than the one without dropout (ptxas -v, sm_80 and sm_90,
 * session 13): not the d = 128 variants (sm_80: 48 bytes against 4). */
template <int D, int kMode> struct FwdMmaDropRT {
    static constexpr bool value = kMode == 4 || !(D == 128 && kMode == 2);
};

template <typename T, int D, int kMode, bool kDropout, bool kRagged>
__global__ void __launch_bounds__(FwdTile<D>::kThreads, 1)
attn_fwd_mma_kernel(const AttnArgs args)
{
    /* kRagged: sequence blockIdx.z's lengths, shift and moved operands */
    AttnArgs seq;
    if constexpr (kRagged) {
        int nk_rows;
        seq = seq_args<T, float>(args, blockIdx.z, &nk_rows);
    }
    const AttnArgs &a = kRagged ? seq : args;
    constexpr bool kMasked = kMode == 2 || kMode == 4, kBias = kMode == 4;
    const bool drop = kDropout && (!FwdMmaDropRT<D, kMode>::value || a.dropout);
    /* Plain causal: a runtime flag, not an instantiation (build time; see
     * fwd_mask). The variants' band carries their causality. */
    const bool causal = !kMasked && a.causal;
    using Tile = FwdTile<D>;
    constexpr int Br = Tile::kBr, Bc = Tile::kBc, C = Tile::kChunks;
    constexpr int NT = Bc / 8;  /* n8 tiles of S */
    constexpr int DT = D / 8;   /* n8 tiles of O */
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t sQ = smem_u32(smem);
    const uint32_t sK0 = sQ + Br * D * 2, sV0 = sK0 + Bc * D * 2;
    const uint32_t kv_stride = 2 * Bc * D * 2; /* second buffer */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    /* Causal blocks near the end do the most work: launch them first. */
    const int mblk = kMasked || causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int64_t i0 = (int64_t)mblk * Br;
    const int h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
    const int64_t bh = (int64_t)b * a.H + h;
    if (kRagged && i0 >= a.Nq) /* the grid covers the longest sequence */
        return;
    const int rows = (int)min((int64_t)Br, a.Nq - i0);
    /* m, l: [B, H, Nq], or [H, total_q] packed (stat_row0) */
    const int64_t srow = stat_row_of<kRagged>(a, b, h, bh);

    /* The key blocks to visit: up to the diagonal, or (kMasked) the band's
     * and the block list's, so skipped blocks cost nothing. */
    const BlockWalk walk = fwd_key_walk(a, kMasked, causal, b, h, i0, rows, Bc);
    const int nblocks = walk.n;

    load_rows<T, D>(sQ, a.q, b, i0, h, Br, rows, a.d, Tile::kThreads);
    cp_async_commit();
    if (nblocks > 0) {
        const int64_t js = walk.start(0);
        const int valid = (int)min((int64_t)Bc, a.Nk - js);
        load_rows<T, D>(sK0, a.k, b, js, hk, Bc, valid, a.d, Tile::kThreads);
        load_rows<T, D>(sV0, a.v, b, js, hk, Bc, valid, a.d, Tile::kThreads);
    }
    cp_async_commit();

    constexpr int MT = Tile::kMT;
    float o[MT][DT][4], m_raw[MT][2], l_part[MT][2];
    fwd_state_init(o, m_raw, l_part);
    const float scale_log2 = (float)(a.scale * 1.4426950408889634);
    /* Rows of m-tile mt for this thread: row_g(mt) + 0 and + 8. */
    const int64_t row_w = i0 + warp * 16 * MT + g;
    const float slope = kMasked && a.alibi ? a.alibi[b * a.alibi_sb + h] : 0.f;

    for (int jb = 0; jb < nblocks; jb++) {
        const int64_t j0 = walk.start(jb);
        const uint32_t sK = sK0 + (jb & 1) * kv_stride, sV = sV0 + (jb & 1) * kv_stride;
        if (jb + 1 < nblocks) { /* prefetch the next K/V block */
            const int64_t jn = walk.start(jb + 1);
            const int valid = (int)min((int64_t)Bc, a.Nk - jn);
            const uint32_t nb = ((jb + 1) & 1) * kv_stride;
            load_rows<T, D>(sK0 + nb, a.k, b, jn, hk, Bc, valid, a.d, Tile::kThreads);
            load_rows<T, D>(sV0 + nb, a.v, b, jn, hk, Bc, valid, a.d, Tile::kThreads);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        /* S = Q_i K_j^T (Alg1 L.9) on tensor cores; each K fragment feeds
         * the MT m-tiles of this warp. */
        float s[MT][NT][4];
        frag_zero(s);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldmatrix_x4(af[mt], sQ + swz((warp * MT + mt) * 16 + (lane & 15),
                                             kk * 2 + (lane >> 4), C));
#pragma unroll
            for (int n2 = 0; n2 < NT / 2; n2++) {
                uint32_t bf[4];
                const int n = n2 * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldmatrix_x4(bf, sK + swz(n, kk * 2 + ((lane >> 3) & 1), C));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    Mma<T>::run(s[mt][2 * n2], af[mt], bf[0], bf[1]);
                    Mma<T>::run(s[mt][2 * n2 + 1], af[mt], bf[2], bf[3]);
                }
            }
        }

        /* Score modifiers, the mask, the online softmax (Alg1 L.10-11)
         * and dropout on the P that feeds O (attn_mma_tile.cuh). */
        if (kMasked && (a.softcap > 0.f || a.alibi))
            fwd_score_mods<false>(a, s, slope, row_w, j0, t4);
        if (kBias)
            fwd_bias<T>(a, s, b, h, row_w, j0, t4);
        fwd_mask<kMasked, Bc>(a, causal, s, walk, jb, i0, j0, warp, row_w, t4);
        fwd_softmax(s, m_raw, l_part, o, scale_log2);
        if (drop) /* 256/T is applied at the end */
            fwd_dropout(a, s, j0, row_w, bh, t4);

        /* O += P V_j (Alg1 L.12); P goes from accumulators to A fragments,
         * each V fragment feeds the MT m-tiles. */
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++) {
            uint32_t pf[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pf[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pf[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pf[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pf[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int d2 = 0; d2 < D / 16; d2++) {
                uint32_t bf[4];
                const int k = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                ldmatrix_x4_trans(bf, sV + swz(k, d2 * 2 + (lane >> 4), C));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    Mma<T>::run(o[mt][2 * d2], pf[mt], bf[0], bf[1]);
                    Mma<T>::run(o[mt][2 * d2 + 1], pf[mt], bf[2], bf[3]);
                }
            }
        }
        __syncthreads(); /* this buffer is refilled two iterations on */
    }

    /* Epilogue: full row sums over the quad, O / l * 256/T, m and l. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = l_part[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int64_t i = row_w + mt * 16 + 8 * r;
            const float inv = l != 0.f ? (float)a.keep_scale / l : 0.f;
            if (i < a.Nq) {
                T *dst = elem<T>(a.o, b, i, h);
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    const int c = dt * 8 + 2 * t4;
                    if (c < a.d)
                        *reinterpret_cast<uint32_t *>(dst + c) =
                            pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
                }
                if (t4 == 0) {
                    const float mr = m_raw[mt][r];
                    ((float *)a.m)[srow + i] = mr == -INFINITY ? -INFINITY : mr * (float)a.scale;
                    ((float *)a.l)[srow + i] = l;
                }
            }
        }
}

template <typename T, int D, int kMode, bool kDropout, bool kRagged = false>
static fg_status launch(const AttnArgs &a, cudaStream_t st)
{
    using Tile = FwdTile<D>;
    constexpr bool kDr = kDropout || FwdMmaDropRT<D, kMode>::value;
    auto kern = attn_fwd_mma_kernel<T, D, kMode, kDr, kRagged>;
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
    if (a.cu_q || a.seqused_k) /* a.variant is set too */
        return a.dropout ? launch<T, D, 2, true, true>(a, st)
                         : launch<T, D, 2, false, true>(a, st);
    if (a.bias) /* never with cu_seqlens; one kernel for both dropout settings */
        return launch<T, D, 4, true>(a, st);
    if (a.variant)
        return a.dropout ? launch<T, D, 2, true>(a, st) : launch<T, D, 2, false>(a, st);
    return a.dropout ? launch<T, D, 0, true>(a, st) : launch<T, D, 0, false>(a, st);
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

size_t attn_fwd_mma_smem(int d)
{
    return d <= 64 ? FwdTile<64>::kSmem : d <= 128 ? FwdTile<128>::kSmem
                                                   : FwdTile<256>::kSmem;
}

fg_status attn_fwd_mma_dispatch(fg_dtype dt, const AttnArgs &a, cudaStream_t st)
{
    if (dt == FG_BF16)
        return launch_dim<__nv_bfloat16>(a, st);
    return launch_dim<__half>(a, st);
}

} /* namespace fg */
