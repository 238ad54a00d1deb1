/* kernels/attn_bwd_wgmma.cu - fp16/bf16 FlashAttention backward for Hopper
 * (sm_90a) on warpgroup MMA (wgmma).
 *
 * One block of two warpgroups per (K/V block, K/V head, batch); K_j and V_j
 * stay in shared memory, dK_j and dV_j accumulate in registers (fp32). For
 * each query head of the group and each query block of 64 rows (Q_i, dO_i
 * double-buffered with cp.async), Alg. 4 lines 11-23 in five wgmma GEMMs:
 *   S^T  = K Q_i^T      dP^T = V dO_i^T       (A, B from shared memory)
 *   P^T  = exp2(S^T scale log2e - lse2), dropout, dS^T = P^T (dP^T - D_i)
 *   dV  += P^T dO_i     dK  += dS^T Q_i       (A from registers, B = dO/Q
 *                                              read MN-major)
 *   dQ_i += dS K                              (A = dS^T from shared memory
 *                                              read MN-major; fp32 atomics)
 * Computing the transposed scores leaves P^T and dS^T in the accumulator
 * layout, which is the A-register layout of the dV / dK products.
 * Work split (kSplitD): for d <= 128 warpgroup w owns keys 64w..64w+63
 * (Bc = 128) and the full width of dK/dV; for d = 256 the accumulators of
 * 64 keys do not fit one warpgroup, so both own the same 64 keys (Bc = 64),
 * each recomputes S^T and dP^T and accumulates one 128-wide half of dK/dV.
 * The dQ product is split over the two warpgroups by columns. */
#include "attn_common.cuh"
#include "attn_kernels.h"
#include "cuda_check.h"
#include "wgmma_sm90.cuh"

namespace fg {

template <int D> struct BwdWgTile {
    static constexpr bool kSplitD = D == 256;
    static constexpr int kThreads = 256;           /* two warpgroups */
    static constexpr int kBc = kSplitD ? 64 : 128;  /* keys per block */
    static constexpr int kBr = 64;                  /* queries per step */
    static constexpr int kDH = kSplitD ? D / 2 : D; /* dK/dV width per WG */
    static constexpr int kDQ = D / 2;               /* dQ width per WG */
    /* K, V; Q and dO double-buffered; dS^T [Bc][Br]; lse2, D per query
     * (two buffers); 1024 for alignment. */
    static constexpr size_t kSmem = (size_t)(2 * kBc * D + 4 * kBr * D + kBc * kBr) * 2 +
                                    4 * kBr * sizeof(float) + 1024;
};

template <typename T, int D, bool kCausal, bool kDropout>
__global__ void __launch_bounds__(256, 1)
attn_bwd_wgmma_kernel(const AttnArgs a)
{
#ifdef FG_WGMMA_ENABLED
    using Tile = BwdWgTile<D>;
    constexpr int Bc = Tile::kBc, Br = Tile::kBr, DH = Tile::kDH, DQ = Tile::kDQ;
    constexpr int NT = Tile::kThreads;
    constexpr uint32_t qtile = Br * D * 2;   /* bytes of one Q or dO tile */
    extern __shared__ unsigned char smem[];
    const uint32_t base = smem_u32(smem);
    const uint32_t sK = (base + 1023) & ~1023u;
    const uint32_t sV = sK + Bc * D * 2;
    const uint32_t sQ0 = sV + Bc * D * 2;    /* buffer b: Q at + 2b qtile, dO after */
    const uint32_t sdS = sQ0 + 4 * qtile;    /* dS^T [Bc][Br], one 64-wide panel */
    float *lse2_s = (float *)(smem + (sdS - base) + Bc * Br * 2); /* [2][Br] */
    float *D_s = lse2_s + 2 * Br;                                 /* [2][Br] */

    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int key_base = Tile::kSplitD ? 0 : 64 * wg; /* this WG's keys */
    const int dslice = Tile::kSplitD ? DH * wg : 0;   /* its dK/dV columns */
    const int64_t j0 = (int64_t)blockIdx.x * Bc;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int kvalid = (int)min((int64_t)Bc, (int64_t)a.Nk - j0);
    const float scale_log2 = (float)(a.scale * 1.4426950408889634);

    load_panels<T, D>(sK, a.k, b, j0, hk, Bc, kvalid, a.d, NT);
    load_panels<T, D>(sV, a.v, b, j0, hk, Bc, kvalid, a.d, NT);
    cp_async_commit();

    /* Query blocks to visit: causal skips rows that see none of our keys. */
    int64_t i_first = 0;
    if (kCausal)
        i_first = max((int64_t)0, j0 - a.shift);
    const int64_t ib_first = i_first / Br;
    const int64_t nqb = a.Nq > i_first ? (a.Nq + Br - 1) / Br - ib_first : 0;
    const int64_t total = nqb * a.group; /* (head, query block) steps */

    auto issue = [&](int64_t st) {
        const int gh = (int)(st / nqb);
        const int64_t i0 = (ib_first + st % nqb) * Br;
        const int h = hk * a.group + gh;
        const int valid = (int)min((int64_t)Br, (int64_t)a.Nq - i0);
        const uint32_t buf = sQ0 + (uint32_t)(st & 1) * 2 * qtile;
        load_panels<T, D>(buf, a.q, b, i0, h, Br, valid, a.d, NT);
        load_panels<T, D>(buf + qtile, a.dout, b, i0, h, Br, valid, a.d, NT);
        const int64_t bh = (int64_t)b * a.H + h;
        for (int r = threadIdx.x; r < Br; r += NT) {
            const int64_t i = i0 + r;
            float lse = INFINITY, dd = 0.f;
            if (i < a.Nq) {
                const float l = ((const float *)a.l)[bh * a.Nq + i];
                const float m = ((const float *)a.m)[bh * a.Nq + i];
                if (l > 0.f)
                    lse = m * 1.4426950408889634f + __log2f(l);
                dd = ((const float *)a.D)[bh * a.Nq + i];
            }
            lse2_s[(st & 1) * Br + r] = lse;
            D_s[(st & 1) * Br + r] = dd;
        }
        cp_async_commit();
    };

    float dk[DH / 2], dv[DH / 2];
#pragma unroll
    for (int i = 0; i < DH / 2; i++)
        dk[i] = dv[i] = 0.f;

    if (total > 0)
        issue(0);
    for (int64_t st = 0; st < total; st++) {
        const int gh = (int)(st / nqb);
        const int64_t i0 = (ib_first + st % nqb) * Br;
        const int h = hk * a.group + gh;
        const int64_t bh = (int64_t)b * a.H + h;
        const uint32_t sQ = sQ0 + (uint32_t)(st & 1) * 2 * qtile, sdO = sQ + qtile;
        const float *lse2 = lse2_s + (st & 1) * Br, *Dv = D_s + (st & 1) * Br;
        if (st + 1 < total) {
            issue(st + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async();
        __syncthreads();

        /* S^T = K Q_i^T (Alg4 L.12) and dP^T = V dO_i^T (L.18): 64 keys x
         * 64 queries each, reduced over d in k16 steps; two commit groups,
         * so P^T is computed while dP^T is still on the tensor cores, and
         * dS^T while dV's product is. */
        float s[Br / 2], dp[Br / 2];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            WgmmaOp<T, Br>::template ss<0, 0>(
                s, wg_desc(sK + (kk >> 2) * Bc * 128 + key_base * 128 + (kk & 3) * 32, 16, 1024),
                wg_desc(sQ + (kk >> 2) * Br * 128 + (kk & 3) * 32, 16, 1024), kk > 0);
        wg_commit();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            WgmmaOp<T, Br>::template ss<0, 0>(
                dp, wg_desc(sV + (kk >> 2) * Bc * 128 + key_base * 128 + (kk & 3) * 32, 16, 1024),
                wg_desc(sdO + (kk >> 2) * Br * 128 + (kk & 3) * 32, 16, 1024), kk > 0);
        wg_commit();
        wg_wait<1>(); /* S^T */
        wg_fence_regs(s);

        /* P^T (Alg4 L.13-14) and dropout (L.15-16). Element i: key j = j0
         * + key_base + 16 warp + g + 8 ((i >> 1) & 1), query i0 + 8 (i >> 2)
         * + 2 t4 + (i & 1). s keeps P^T (before dropout) for dS^T; bit i of
         * `keep` records the dropout decision. */
        const bool need_mask = j0 + Bc > a.Nk || i0 + Br > a.Nq ||
                               (kCausal && j0 + Bc - 1 > i0 + a.shift);
        const uint2 key = make_uint2(fg_dropout_key_x(a.seed, a.offset),
                                     fg_dropout_key_y(a.seed, a.offset));
        const float ks = (float)a.keep_scale;
        uint32_t keep = 0;
        uint32_t pf[Br / 16][4], sf[Br / 16][4]; /* A fragments for dV, dK */
#pragma unroll
        for (int qt = 0; qt < Br / 8; qt++) {
            float p[4];
            const float2 L = *reinterpret_cast<const float2 *>(lse2 + 8 * qt + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t j = j0 + key_base + 16 * warp + g + 8 * (e >> 1);
                const int64_t i = i0 + 8 * qt + 2 * t4 + (e & 1);
                float pe = exp2f(fmaf(s[4 * qt + e], scale_log2, -((e & 1) ? L.y : L.x)));
                if (need_mask && (j >= a.Nk || (kCausal && j > i + a.shift)))
                    pe = 0.f;
                s[4 * qt + e] = pe;
                p[e] = pe;
                if (kDropout) {
                    const uint4 w = curand_Philox4x32_10(
                        make_uint4(fg_dropout_ctr_x(j), fg_dropout_ctr_y(i),
                                   fg_dropout_ctr_z(bh), fg_dropout_ctr_w(a.offset)),
                        key);
                    const uint32_t word = (j & 3) == 0 ? w.x : (j & 3) == 1 ? w.y
                                        : (j & 3) == 2 ? w.z : w.w;
                    const bool kp = fg_dropout_keep(word, a.keep_threshold);
                    keep |= (uint32_t)kp << (4 * qt + e);
                    p[e] = kp ? pe * ks : 0.f;
                }
            }
            pf[qt >> 1][(qt & 1) * 2] = pack2<T>(p[0], p[1]);
            pf[qt >> 1][(qt & 1) * 2 + 1] = pack2<T>(p[2], p[3]);
        }

        /* dV += (P^T Z) dO_i (Alg4 L.17): B read MN-major, 16 queries per
         * k-step, LBO = one d panel of Br rows. */
        const uint32_t boff = (dslice / 64) * Br * 128;
        wg_fence();
        wg_fence_regs(dv);
#pragma unroll
        for (int kk = 0; kk < Br / 16; kk++)
            WgmmaOp<T, DH>::template rs<1>(dv, pf[kk],
                                           wg_desc(sdO + boff + kk * 2048, Br * 128, 1024), 1);
        wg_commit();
        wg_wait<1>(); /* dP^T (dV's product may still run) */
        wg_fence_regs(dp);

        /* dS^T = P^T (dP^T Z - D_i) (Alg4 L.19-21), to registers for dK
         * and to shared memory ([key][query], one panel) for dQ. */
#pragma unroll
        for (int qt = 0; qt < Br / 8; qt++) {
            float ds[4];
            const float2 Dq = *reinterpret_cast<const float2 *>(Dv + 8 * qt + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float z = !kDropout ? 1.f : ((keep >> (4 * qt + e)) & 1) ? ks : 0.f;
                ds[e] = s[4 * qt + e] * (dp[4 * qt + e] * z - ((e & 1) ? Dq.y : Dq.x));
            }
            const int kk = qt >> 1, half = (qt & 1) * 2;
            sf[kk][half] = pack2<T>(ds[0], ds[1]);
            sf[kk][half + 1] = pack2<T>(ds[2], ds[3]);
            if (!Tile::kSplitD || wg == 0) {
                const int key0 = key_base + 16 * warp + g;
                unsigned char *dsm = smem + (sdS - base);
                *reinterpret_cast<uint32_t *>(dsm + pswz(key0, qt, Bc) + 4 * t4) = sf[kk][half];
                *reinterpret_cast<uint32_t *>(dsm + pswz(key0 + 8, qt, Bc) + 4 * t4) =
                    sf[kk][half + 1];
            }
        }

        /* dK += dS^T Q_i (Alg4 L.23). */
        wg_fence();
        wg_fence_regs(dk);
#pragma unroll
        for (int kk = 0; kk < Br / 16; kk++)
            WgmmaOp<T, DH>::template rs<1>(dk, sf[kk],
                                           wg_desc(sQ + boff + kk * 2048, Br * 128, 1024), 1);
        wg_commit();

        fence_proxy_async(); /* dS^T stores -> wgmma reads */
        __syncthreads();

        /* dQ_i += scale dS K (Alg4 L.22): A = dS (queries x keys) read
         * MN-major from dS^T, B = K read MN-major; this WG's DQ columns. */
        if (!a.deterministic) {
            float q[DQ / 2];
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < Bc / 16; kk++) {
                const uint64_t da = wg_desc(sdS + kk * 16 * 128, Bc * 128, 1024);
                /* column wg*DQ: panel (wg*DQ)/64, and for DQ = 32 half a
                 * 128-byte row into it (the swizzle is address-based) */
                const uint32_t col = (uint32_t)(wg * DQ);
                const uint64_t db = wg_desc(sK + (col / 64) * Bc * 128 + (col % 64) * 2 +
                                                kk * 16 * 128,
                                            Bc * 128, 1024);
                WgmmaOp<T, DQ>::template ss<1, 1>(q, da, db, kk > 0);
            }
            wg_commit();
            wg_wait<0>();
            wg_fence_regs(q);
            const float sc = (float)a.scale;
            float *dqa = (float *)a.dq_acc + (bh * a.Nq + i0) * (int64_t)a.d;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int qi = 16 * warp + g + 8 * r;
                if (i0 + qi >= a.Nq)
                    continue;
#pragma unroll
                for (int n = 0; n < DQ / 8; n++) {
                    const int c = wg * DQ + n * 8 + 2 * t4;
                    if (c < a.d)
                        atomicAdd(reinterpret_cast<float2 *>(dqa + qi * a.d + c),
                                  make_float2(q[4 * n + 2 * r] * sc, q[4 * n + 2 * r + 1] * sc));
                }
            }
        } else {
            wg_wait<0>();
        }
        /* The dV/dK wgmma read pf/sf asynchronously: keep them live (in
         * their registers) until it has completed. */
#pragma unroll
        for (int kk = 0; kk < Br / 16; kk++)
#pragma unroll
            for (int x = 0; x < 4; x++)
                asm volatile("" : "+r"(pf[kk][x]), "+r"(sf[kk][x])::"memory");
        wg_fence_regs(dk);
        wg_fence_regs(dv);
        __syncthreads(); /* dS^T and this Q/dO buffer are reused */
    }

    /* Alg4 L.25: dK = scale * acc, dV; rows past Nk and padded d skipped. */
    const float sc = (float)a.scale;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int kr = key_base + 16 * warp + g + 8 * r;
        if (kr >= kvalid)
            continue;
        T *dkp = elem<T>(a.dk, b, j0 + kr, hk), *dvp = elem<T>(a.dv, b, j0 + kr, hk);
#pragma unroll
        for (int n = 0; n < DH / 8; n++) {
            const int c = dslice + n * 8 + 2 * t4;
            if (c < a.d) {
                *reinterpret_cast<uint32_t *>(dkp + c) =
                    pack2<T>(dk[4 * n + 2 * r] * sc, dk[4 * n + 2 * r + 1] * sc);
                *reinterpret_cast<uint32_t *>(dvp + c) = pack2<T>(dv[4 * n + 2 * r], dv[4 * n + 2 * r + 1]);
            }
        }
    }
#endif
}

template <typename T, int D, bool kCausal, bool kDropout>
static fg_status launch(const AttnArgs &a, cudaStream_t st)
{
    using Tile = BwdWgTile<D>;
    auto kern = attn_bwd_wgmma_kernel<T, D, kCausal, kDropout>;
    FG_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)Tile::kSmem));
    dim3 grid((unsigned)((a.Nk + Tile::kBc - 1) / Tile::kBc), (unsigned)a.Hk,
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

size_t attn_bwd_wgmma_smem(int d)
{
    return d <= 64 ? BwdWgTile<64>::kSmem : d <= 128 ? BwdWgTile<128>::kSmem
                                                     : BwdWgTile<256>::kSmem;
}

fg_status attn_bwd_wgmma_dispatch(fg_dtype dt, const AttnArgs &a, cudaStream_t st)
{
    if (dt == FG_BF16)
        return launch_dim<__nv_bfloat16>(a, st);
    return launch_dim<__half>(a, st);
}

} /* namespace fg */
