/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_mma.cu - fast fp16/bf16 FlashAttention backward on tensor
 * cores (mma.sync m16n8k16, sm_80+), FlashAttention-2 style.
 *
 * One block per (K/V block of Bc = 16*W keys, K/V head, batch); warp w owns
 * keys 16w..16w+15, so its dK and dV accumulators (fp32, registers) never
 * need another warp. For each query head of the group and each query block
 * of Br rows (Q_i, dO_i double-buffered with cp.async):
 *   S^T  = K Q_i^T                  P^T = exp2(S^T scale log2e - lse2)
 *   dV  += (P^T * Z) dO_i           dP^T = (V dO_i^T) * Z
 *   dS^T = P^T * (dP^T - D_i)       dK  += dS^T Q_i
 *   dQ_i += dS K  (dS through shared memory, fp32 atomics)
 * Computing the transposed scores keeps P^T and dS^T in the accumulator
 * layout that is also the A-fragment layout of the dV/dK products, so they
 * go from registers to tensor cores without a round trip. lse2 = log2 of
 * the softmax normaliser from the forward's m and l (+inf for empty rows).
 * D = rowsum(dO * O) and the dQ conversion are the general path's kernels.
 * For d = 256 the dK/dV accumulators do not fit in registers: two launches
 * each own half of d (and recompute S and dP); the first also does dQ.
 *
 * kMode: 0 no mask or bottom-right causal (the tuned paths; a.causal picks
 * causal at run time), 2 the variants:
 * only the band's and the block lists' query blocks are visited, softcap
 * and ALiBi modify S^T, and dS^T takes the softcap's exact 1 - tanh^2;
 * 4 the variants with an additive bias (its own instantiation, as in the
 * forward) and dbias (attn_bias.cu): each visible pair's dS, before the
 * softcap's factor, stored (nothing broadcast) or added by fp32 atomics
 * (broadcast), by the first d slice's launch only; the deterministic
 * broadcast pass is attn_bias.cu's own kernel.
 * kRagged (kMode 2): packed batches and key padding, each sequence a
 * problem of its own (seq_args); keys past a sequence's used length get
 * zero dK, dV, as in the general kernel. */
#include "attn_common.cuh"
#include "attn_kernels.h"
#include "attn_mma_tile.cuh"
#include "kernels/runtime/cuda_check.h"
#include "mma_sm80.cuh"

namespace fg {

/* D: head dim (padded); W: warps (16 keys each); BR: queries per inner
 * step; DH: width of the d slice whose dK/dV this launch accumulates (D, or
 * D/2 for d = 256, run as two launches over the two halves). */
template <int D, int W, int BR, int DH> struct BwdTile {
    static constexpr int kWarps = W;
    static constexpr int kThreads = 32 * W;
    static constexpr int kBc = 16 * W; /* keys per block */
    static constexpr int kBr = BR;     /* queries per inner step */
    static constexpr int kC = D / 8;   /* 16-byte chunks per row */
    /* K, V; Q and dO double-buffered; dS [Br][Bc]; lse2 and D per query. */
    static constexpr size_t kSmem = (size_t)(2 * kBc * D + 4 * kBr * D + kBr * kBc) * 2 +
                                    2 * 2 * kBr * sizeof(float);
};

/* Where one kernel serves both dropout settings (dropout a run-time flag,
 * a.dropout; without it the keep bits are all ones and keep_scale 1, so
 * P z and dP z round as without dropout): half the kernels to build, only
 * where the merged kernel spills no more than the one without dropout
 * (ptxas -v, sm_80 and sm_90, session 13): not at d = 128 (4-12 bytes
 * against none). */
template <int D, int kMode> struct BwdMmaDropRT {
    static constexpr bool value = kMode == 4 || D != 128;
};

template <typename T, int D, int W, int BR, int DH, int kMode, bool kDropout, bool kRagged>
__global__ void __launch_bounds__(32 * W)
attn_bwd_mma_kernel(const AttnArgs args, const int dslice)
{
    /* kRagged: sequence blockIdx.z's lengths, shift and moved operands;
     * nk_rows its key rows, padded ones included (dK, dV written) */
    AttnArgs seq;
    int nk_rows = 0;
    if constexpr (kRagged)
        seq = seq_args<T, float>(args, blockIdx.z, &nk_rows);
    const AttnArgs &a = kRagged ? seq : args;
    const bool drop = kDropout && (!BwdMmaDropRT<D, kMode>::value || a.dropout);
    constexpr bool kMasked = kMode == 2 || kMode == 4, kBias = kMode == 4;
    /* Plain causal: a runtime flag, not an instantiation (build time; see
     * fwd_mask). The variants' band carries their causality. */
    const bool causal = !kMasked && a.causal;
    using Tile = BwdTile<D, W, BR, DH>;
    constexpr int Bc = Tile::kBc, Br = Tile::kBr, C = Tile::kC;
    constexpr int QT = Br / 8; /* n8 tiles over queries in S^T */
    constexpr int DT = DH / 8; /* n8 tiles over this launch's d slice */
    const int dbase = dslice * DH; /* first column of the slice */
    constexpr int NT = Tile::kThreads;
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t sK = smem_u32(smem);
    const uint32_t sV = sK + Bc * D * 2;
    const uint32_t sQ0 = sV + Bc * D * 2;          /* + buf * 2*Br*D*2 */
    const uint32_t qbuf = 2 * Br * D * 2;
    const uint32_t sdS = sQ0 + 2 * qbuf;           /* dS^T [Bc][Br], swizzled */
    float *lse2_s = (float *)(smem + (sdS - sK) + Br * Bc * 2); /* [2][Br] */
    float *D_s = lse2_s + 2 * Br;                               /* [2][Br] */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int64_t j0 = (int64_t)blockIdx.x * Bc;
    const int hk = blockIdx.y, b = blockIdx.z;
    if (kRagged && j0 >= nk_rows) /* the grid covers the longest sequence */
        return;
    /* keys loaded (seen); kRagged: a block past the used keys loads none */
    const int kvalid = (int)(kRagged ? max((int64_t)0, min((int64_t)Bc, (int64_t)a.Nk - j0))
                                     : min((int64_t)Bc, (int64_t)a.Nk - j0));
    /* key rows whose dK, dV this block writes */
    const int kout = kRagged ? (int)min((int64_t)Bc, (int64_t)nk_rows - j0) : kvalid;
    const float scale_log2 = (float)(a.scale * 1.4426950408889634);
    /* kBias: whether this launch writes dbias pairs from its registers */
    const bool dbias_out = kBias && dslice == 0 &&
                           (a.dbias_mode == kDbiasStore || a.dbias_mode == kDbiasAtomic);

    load_rows<T, D>(sK, a.k, b, j0, hk, Bc, kvalid, a.d, NT);
    load_rows<T, D>(sV, a.v, b, j0, hk, Bc, kvalid, a.d, NT);
    cp_async_commit();

    QuerySteps steps; /* the (head, query block) steps */
    steps.init(a, kMasked, causal, b, hk, j0, Bc, Br);
    const int64_t total = kRagged && kvalid == 0 ? 0 : steps.total;

    /* Issue the loads of step `st` into buffer st & 1. */
    auto issue = [&](int64_t st) {
        int gh;
        int64_t i0;
        steps.locate(a, b, hk, j0, Bc, Br, st, &gh, &i0);
        const int h = hk * a.group + gh;
        const int valid = (int)min((int64_t)Br, (int64_t)a.Nq - i0);
        const uint32_t buf = (uint32_t)(st & 1) * qbuf;
        load_rows<T, D>(sQ0 + buf, a.q, b, i0, h, Br, valid, a.d, NT);
        load_rows<T, D>(sQ0 + buf + Br * D * 2, a.dout, b, i0, h, Br, valid, a.d, NT);
        /* m, l, D: [B, H, Nq], or [H, total_q] packed (stat_row0) */
        const int64_t srow = stat_row_of<kRagged>(a, b, h, (int64_t)b * a.H + h);
        for (int r = threadIdx.x; r < Br; r += NT) {
            const int64_t i = i0 + r;
            float lse = INFINITY, dd = 0.f;
            if (i < a.Nq) {
                lse = stat_lse2(a, srow + i);
                dd = ((const float *)a.D)[srow + i];
            }
            lse2_s[(st & 1) * Br + r] = lse;
            D_s[(st & 1) * Br + r] = dd;
        }
        cp_async_commit();
    };

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[i][e] = dv[i][e] = 0.f;

    if (total > 0)
        issue(0);
    for (int64_t st = 0; st < total; st++) {
        int gh;
        int64_t i0;
        const bool dead = steps.locate(a, b, hk, j0, Bc, Br, st, &gh, &i0) && kMasked;
        const int h = hk * a.group + gh;
        const int64_t bh = (int64_t)b * a.H + h;
        const uint32_t sQ = sQ0 + (uint32_t)(st & 1) * qbuf, sdO = sQ + Br * D * 2;
        const float *lse2 = lse2_s + (st & 1) * Br, *Dv = D_s + (st & 1) * Br;
        if (st + 1 < total) {
            issue(st + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        /* S^T = K Q_i^T for this warp's 16 keys (Alg4 L.12). */
        float s[QT][4], dp[QT][4];
#pragma unroll
        for (int i = 0; i < QT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t ak[4], av[4];
            const int row = warp * 16 + (lane & 15), ch = kk * 2 + (lane >> 4);
            ldmatrix_x4(ak, sK + swz(row, ch, C));
            ldmatrix_x4(av, sV + swz(row, ch, C));
#pragma unroll
            for (int n2 = 0; n2 < QT / 2; n2++) {
                uint32_t bq[4], bg[4];
                const int n = n2 * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int kc = kk * 2 + ((lane >> 3) & 1);
                ldmatrix_x4(bq, sQ + swz(n, kc, C));
                ldmatrix_x4(bg, sdO + swz(n, kc, C));
                Mma<T>::run(s[2 * n2], ak, bq[0], bq[1]);
                Mma<T>::run(s[2 * n2 + 1], ak, bq[2], bq[3]);
                /* dP^T = V dO_i^T (Alg4 L.18) */
                Mma<T>::run(dp[2 * n2], av, bg[0], bg[1]);
                Mma<T>::run(dp[2 * n2 + 1], av, bg[2], bg[3]);
            }
        }

        /* P^T (Alg4 L.13-14), dropout (L.15-16, 19), dS^T (L.21). Element
         * e of tile qt: key j = j0 + 16 warp + g + 8 (e >> 1), query
         * i = i0 + 8 qt + 2 t4 + (e & 1). kMasked: softcap and ALiBi on the
         * raw S^T first; the mask is the rows each of this thread's two keys
         * is seen by (the band of this warp's 16 keys decides whether). */
        const BwdMask mk = bwd_mask<kMasked, Bc, Br>(a, causal, dead, i0, j0, warp, g);
        const float slope = kMasked && a.alibi ? a.alibi[b * a.alibi_sb + h] : 0.f;
        uint32_t pf[QT / 2][4], sf[QT / 2][4]; /* A fragments for dV, dK */
        uint32_t keep = 0; /* bwd_dropout_bits of the current 16 queries */
        static_assert(QT % 2 == 0, "dropout draws 16 queries at a time");
#pragma unroll
        for (int qt = 0; qt < QT; qt++) {
            float p[4], ds[4];
            /* Alg4 L.15: the keep bits of 16 queries, drawn at even qt */
            if (kDropout && !(qt & 1)) /* without dropout: all kept, z = 1 */
                keep = drop ? bwd_dropout_bits(a, bh, i0 + 8 * qt, j0 + 16 * warp, g, t4) : ~0u;
            /* lse2 and D of this thread's two queries in one load each */
            const float2 L = *reinterpret_cast<const float2 *>(lse2 + 8 * qt + 2 * t4);
            const float2 Dq = *reinterpret_cast<const float2 *>(Dv + 8 * qt + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = 8 * qt + 2 * t4 + (e & 1);
                const int64_t i = i0 + qi, j = j0 + 16 * warp + g + 8 * (e >> 1);
                const float lse = (e & 1) ? L.y : L.x;
                float dl = 0.f;
                const bool vis = bwd_elem<false, kMasked, kDropout>(
                    a, mk, s[qt][e], dp[qt][e], lse, (e & 1) ? Dq.y : Dq.x, qi, e >> 1, i, j,
                    slope, scale_log2, (keep >> (4 * (qt & 1) + e)) & 1u,
                    kBias ? raw_bias<T>(a, b, h, i, j) : 0.f, kBias, &p[e], &ds[e],
                    kBias ? &dl : nullptr);
                /* a row that saw no key (lse2 = +inf) has dS = 0 by
                 * definition, even where dP is NaN: left as zeroed */
                if (dbias_out && vis && i < a.Nq && j < a.Nk && lse < INFINITY)
                    dbias_put_pair<T, float>(a, b, h, i, j, dl);
            }
            const int kk = qt >> 1, half = (qt & 1) * 2;
            pf[kk][half] = pack2<T>(p[0], p[1]);
            pf[kk][half + 1] = pack2<T>(p[2], p[3]);
            sf[kk][half] = pack2<T>(ds[0], ds[1]);
            sf[kk][half + 1] = pack2<T>(ds[2], ds[3]);
            /* dS^T to shared memory for dQ, [key][query]: the two queries
             * of a register pair are adjacent, one 4-byte store each. */
            unsigned char *dsm = smem + (sdS - sK);
            const int key0 = 16 * warp + g;
            *reinterpret_cast<uint32_t *>(dsm + swz(key0, qt, Br / 8) + 4 * t4) =
                sf[kk][half];
            *reinterpret_cast<uint32_t *>(dsm + swz(key0 + 8, qt, Br / 8) + 4 * t4) =
                sf[kk][half + 1];
        }

        /* dV += (P^T Z) dO_i (Alg4 L.17), dK += dS^T Q_i (L.23). */
#pragma unroll
        for (int kk = 0; kk < QT / 2; kk++) {
#pragma unroll
            for (int d2 = 0; d2 < DH / 16; d2++) {
                uint32_t bg[4], bq[4];
                const int k = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                const int ch = dbase / 8 + d2 * 2 + (lane >> 4);
                ldmatrix_x4_trans(bg, sdO + swz(k, ch, C));
                ldmatrix_x4_trans(bq, sQ + swz(k, ch, C));
                Mma<T>::run(dv[2 * d2], pf[kk], bg[0], bg[1]);
                Mma<T>::run(dv[2 * d2 + 1], pf[kk], bg[2], bg[3]);
                Mma<T>::run(dk[2 * d2], sf[kk], bq[0], bq[1]);
                Mma<T>::run(dk[2 * d2 + 1], sf[kk], bq[2], bq[3]);
            }
        }
        __syncthreads(); /* dS complete in shared memory */

        /* dQ_i += scale dS K (Alg4 L.22), by the first slice's launch only:
         * warp w takes query m-tile w % (Br/16) and a 1/parts slice of d;
         * fp32 atomics into the accumulator. */
        if (dslice == 0 && !a.deterministic) {
            constexpr int MTS = Br / 16, parts = W / MTS, DW = D / parts;
            const int mt = warp % MTS, part = warp / MTS;
            float q[DW / 8][4];
#pragma unroll
            for (int i = 0; i < DW / 8; i++)
                q[i][0] = q[i][1] = q[i][2] = q[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < Bc / 16; kk++) {
                uint32_t af[4];
                /* A = dS (queries x keys) from the [key][query] tile */
                ldmatrix_x4_trans(af, sdS + swz(kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                mt * 2 + ((lane >> 3) & 1), Br / 8));
#pragma unroll
                for (int d2 = 0; d2 < DW / 16; d2++) {
                    uint32_t bk[4];
                    const int k = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                    ldmatrix_x4_trans(bk, sK + swz(k, (part * DW) / 8 + d2 * 2 + (lane >> 4), C));
                    Mma<T>::run(q[2 * d2], af, bk[0], bk[1]);
                    Mma<T>::run(q[2 * d2 + 1], af, bk[2], bk[3]);
                }
            }
            const float sc = (float)a.scale;
            const int64_t srow = stat_row_of<kRagged>(a, b, h, bh);
            float *dqa = (float *)a.dq_acc + (srow + i0) * (int64_t)a.d;
            dq_tile_red<DW>(a, dqa, q, sc, i0, mt, part, g, t4);
        }
        __syncthreads(); /* dS and this Q/dO buffer are reused */
    }

    /* Alg4 L.25: dK = scale * acc, dV; rows past Nk and padded d skipped. */
    const float sc = (float)a.scale;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int kr = 16 * warp + g + 8 * r;
        if (kr >= kout)
            continue;
        T *dkp = elem<T>(a.dk, b, j0 + kr, hk), *dvp = elem<T>(a.dv, b, j0 + kr, hk);
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            const int c = dbase + dt * 8 + 2 * t4;
            if (c < a.d) {
                *reinterpret_cast<uint32_t *>(dkp + c) =
                    pack2<T>(dk[dt][2 * r] * sc, dk[dt][2 * r + 1] * sc);
                *reinterpret_cast<uint32_t *>(dvp + c) =
                    pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
            }
        }
    }
}

template <typename T, int D, int W, int BR, int DH, int kMode, bool kDropout,
          bool kRagged = false>
static fg_status launch(const AttnArgs &a, cudaStream_t st)
{
    using Tile = BwdTile<D, W, BR, DH>;
    constexpr bool kDr = kDropout || BwdMmaDropRT<D, kMode>::value;
    auto kern = attn_bwd_mma_kernel<T, D, W, BR, DH, kMode, kDr, kRagged>;
    FG_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)Tile::kSmem));
    dim3 grid((unsigned)((a.Nk + Tile::kBc - 1) / Tile::kBc), (unsigned)a.Hk,
              (unsigned)a.B);
    /* Slices past the real head dim have nothing to write. */
    for (int slice = 0; slice < D / DH && slice * DH < a.d; slice++) {
        kern<<<grid, Tile::kThreads, Tile::kSmem, st>>>(a, slice);
        FG_CUDA_TRY_LAUNCH();
    }
    return FG_OK;
}

template <typename T, int D, int W, int BR, int DH>
static fg_status launch_opts(const AttnArgs &a, cudaStream_t st)
{
    if (a.cu_q || a.seqused_k) /* a.variant is set too */
        return a.dropout ? launch<T, D, W, BR, DH, 2, true, true>(a, st)
                         : launch<T, D, W, BR, DH, 2, false, true>(a, st);
    if (a.bias) /* never with cu_seqlens; one kernel for both dropout settings */
        return launch<T, D, W, BR, DH, 4, true>(a, st);
    if (a.variant)
        return a.dropout ? launch<T, D, W, BR, DH, 2, true>(a, st)
                         : launch<T, D, W, BR, DH, 2, false>(a, st);
    return a.dropout ? launch<T, D, W, BR, DH, 0, true>(a, st)
                     : launch<T, D, W, BR, DH, 0, false>(a, st);
}

/* Tile configurations per padded head dim. */
#define FG_BWD_CFG64 64, 8, 64, 64
#define FG_BWD_CFG128 128, 8, 64, 128
#define FG_BWD_CFG256 256, 4, 32, 128

template <typename T>
static fg_status launch_dim(const AttnArgs &a, cudaStream_t st)
{
    if (a.d <= 64)
        return launch_opts<T, FG_BWD_CFG64>(a, st);
    if (a.d <= 128)
        return launch_opts<T, FG_BWD_CFG128>(a, st);
    return launch_opts<T, FG_BWD_CFG256>(a, st);
}

bool attn_bwd_mma_supported(int d, size_t smem_limit)
{
    const size_t need = d <= 64 ? BwdTile<FG_BWD_CFG64>::kSmem
                        : d <= 128 ? BwdTile<FG_BWD_CFG128>::kSmem
                                   : BwdTile<FG_BWD_CFG256>::kSmem;
    return need <= smem_limit;
}

fg_status attn_bwd_mma_dispatch(fg_dtype dt, const AttnArgs &a, cudaStream_t st)
{
    if (dt == FG_BF16)
        return launch_dim<__nv_bfloat16>(a, st);
    return launch_dim<__half>(a, st);
}

} /* namespace fg */
