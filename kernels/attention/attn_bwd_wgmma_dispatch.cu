/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_dispatch.cu - the sm_90a wgmma backward's
 * dispatch: the kernel instantiation a call takes (kMode, dropout, padded
 * head dim), tile sizes and TMA maps. The kernels are built in
 * attn_bwd_wgmma_mode<k>.cu. */
#include "attn_bwd_wgmma.cuh"

#include <stdlib.h>
#include <string.h>

namespace fg {

/* FG_ATTN_BWD_WIDE=0: the 64-query kernels instead of the wide ones
 * (kWide, attn_bwd_wgmma.cuh), for measurements and for the tests that
 * keep both paths covered. Read per call, as FG_ATTN_BIAS_TMA below. */
static bool bwd_wide()
{
    return !env_is("FG_ATTN_BWD_WIDE", "0");
}

/* Does a d <= 64 call take the wide kernels? Not with a bias (kModes 4
 * and 5 stay 64-query) or when the strict kernel computes dQ
 * (a.deterministic still set: attn_bwd.cu clears it when the kernel sums
 * dQ by turns, a.dq_sem, which the wide kernels do too, since session
 * 31); plain, causal, variant and packed / key-padded calls (kModes 0-3,
 * 6, 7) do: H200, session 30, +11-19% backward at d = 64 on the variants
 * and packed batches. */
static bool wide_call(const AttnArgs &a)
{
    if (a.deterministic || !bwd_wide())
        return false;
    return a.cu_q || a.seqused_k || !a.bias;
}

/* Can the call take the 80-query d = 128 kernel (kQ80,
 * attn_bwd_wgmma.cuh)? d in (64, 128], kMode 0 (neither causal nor a
 * variant, which covers masks, modifiers, a bias, block masks, packed and
 * key-padded batches: launch_opts's last case), no dropout, not
 * deterministic (the turns count 64-query tiles), and Nq >= 2048: below,
 * the 64-query kernel was 1.0-1.6% faster (H200, sessions 57-58: N 1k,
 * 1.5k; the 80-query one +1.5% at 2k, +3% at 4k). FG_ATTN_BWD_Q80=0
 * keeps the 64-query kernel, =1 takes the 80-query one at every Nq
 * (tests, comparisons). Read per call; attn_bwd_wgmma_maps records the
 * choice. */
static bool q80_call(const AttnArgs &a)
{
    if (a.d <= 64 || a.d > 128 || a.causal || a.variant || a.dropout || a.deterministic ||
        env_is("FG_ATTN_BWD_Q80", "0"))
        return false;
    return a.Nq >= 2048 || env_is("FG_ATTN_BWD_Q80", "1");
}

int64_t attn_bwd_wgmma_nq_pad(const AttnArgs &a)
{
    const int64_t m = q80_call(a) ? 320 : 128; /* 320: 64 and 80 divide it */
    return ((int64_t)a.Nq + m - 1) / m * m;
}

int attn_bwd_wgmma_dq_tile_q(const void *maps) { return ((const BwdMaps *)maps)->q80 ? 80 : 64; }

/* kW: the wide kernels (d = 64 only, wide_call). */
template <typename T, int D, bool kW>
static fg_status launch_opts(const AttnArgs &a, const BwdMaps &m, cudaStream_t st)
{
    const bool mods = a.softcap > 0.f || a.alibi; /* else kModes 6, 7: masks alone */
    if ((a.cu_q || a.seqused_k) && !mods)
        return a.dropout ? launch<T, D, 7, true, kW>(a, m, st)
                         : launch<T, D, 7, false, kW>(a, m, st);
    if (a.cu_q || a.seqused_k)
        return a.dropout ? launch<T, D, 3, true, kW>(a, m, st)
                         : launch<T, D, 3, false, kW>(a, m, st);
    if constexpr (!kW) {
        if constexpr (D == 128) /* BwdBiasTile: the bias (and dbias) by TMA */
            if (a.bias && (m.bias_flags & 1))
                return a.dropout ? launch<T, D, 5, true>(a, m, st)
                                 : launch<T, D, 5, false>(a, m, st);
        if (a.bias)
            return a.dropout ? launch<T, D, 4, true>(a, m, st)
                             : launch<T, D, 4, false>(a, m, st);
    }
    if (a.variant && !mods)
        return a.dropout ? launch<T, D, 6, true, kW>(a, m, st)
                         : launch<T, D, 6, false, kW>(a, m, st);
    if (a.variant)
        return a.dropout ? launch<T, D, 2, true, kW>(a, m, st)
                         : launch<T, D, 2, false, kW>(a, m, st);
    if (a.causal)
        return a.dropout ? launch<T, D, 1, true, kW>(a, m, st)
                         : launch<T, D, 1, false, kW>(a, m, st);
    if constexpr (D == 128 && !kW)
        if (m.q80)
            return launch<T, 128, 0, false, false, true>(a, m, st);
    return a.dropout ? launch<T, D, 0, true, kW>(a, m, st)
                     : launch<T, D, 0, false, kW>(a, m, st);
}

template <typename T>
static fg_status launch_dim(const AttnArgs &a, const BwdMaps &m, cudaStream_t st)
{
    if (a.d <= 64)
        return wide_call(a) ? launch_opts<T, 64, true>(a, m, st)
                            : launch_opts<T, 64, false>(a, m, st);
    if (a.d <= 128)
        return launch_opts<T, 128, false>(a, m, st);
    return launch_opts<T, 256, false>(a, m, st);
}

int attn_bwd_wgmma_dpad(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

size_t attn_bwd_wgmma_smem(const AttnArgs &a)
{
    const bool ragged = a.cu_q || a.seqused_k; /* kMode 3 / 7's AttnArgs, at most */
    /* the dropout word exchange (BwdDropX) of the kernels without a bias,
     * whether or not this call drops (some serve both) */
    if (a.d <= 64) { /* or the wide kernels' (no bias parts) */
        const size_t narrow = BwdWgTile<64>::kSmem + (ragged ? BwdSeqSmem<64, 3>::kBytes : 0) +
                              (a.bias ? 0 : BwdDropX<64, 0, true>::kBytes);
        const size_t wide = BwdTile<64, true>::kSmem + (ragged ? BwdSeqSmem<64, 3>::kBytes : 0) +
                            BwdDropX<64, 0, true, true>::kBytes;
        return narrow > wide ? narrow : wide;
    }
    if (a.d <= 128) { /* kMode 5's bias stages at most, or the 80-query kernel */
        const size_t q64 = BwdWgTile<128>::kSmem + (a.bias ? BwdBiasTile<128, 5>::kBytes : 0) +
                           (ragged ? BwdSeqSmem<128, 3>::kBytes : 0) +
                           (a.bias ? 0 : BwdDropX<128, 0, true>::kBytes);
        const size_t q80 = q80_call(a) ? BwdTile<128, false, true>::kSmem : 0;
        return q64 > q80 ? q64 : q80;
    }
    return BwdWgTile<256>::kSmem;
}

static int bwd_keys(int d)
{
    return d <= 64 ? BwdWgTile<64>::kBc : d <= 128 ? BwdWgTile<128>::kBc
                                                      : BwdWgTile<256>::kBc;
}

/* bias_flags 5's condition: dbias_acc (fp32) broadcast over batch and/or
 * heads only, keys contiguous, every row start 16-byte aligned. */
static bool dbias_red_ok(const AttnArgs &a)
{
    const int64_t *s = a.dbias_acc_s;
    return a.dbias_acc && (uintptr_t)a.dbias_acc % 16 == 0 && s[3] == 1 &&
           (s[2] != 0 || a.Nq == 1) && s[0] % 4 == 0 && s[1] % 4 == 0 && s[2] % 4 == 0 &&
           s[0] >= 0 && s[1] >= 0 && s[2] >= 0;
}

/* Does the kernel write every element of a dense dbias (bias_flags 3: each
 * visited tile stored whole, zeros where p = 0) because it visits every
 * tile (no mask)? Then nothing needs zeroing first. */
bool attn_bwd_wgmma_covers_dbias(const AttnArgs &a, const void *maps)
{
    const BwdMaps *m = (const BwdMaps *)maps;
    return m->bias_flags == 3 && a.dbias_mode == kDbiasStore && !a.causal && !a.band &&
           !a.sparse && !a.cu_q && !a.seqused_k;
}

bool attn_bwd_wgmma_maps(const AttnArgs &a, void *maps)
{
    BwdMaps *m = (BwdMaps *)maps;
    memset(m, 0, sizeof *m);
    const int bc = bwd_keys(a.d), br = 64;
    /* the 80-query kernel where the stats were padded for it */
    m->q80 = q80_call(a) && a.nq_pad > 0 && a.nq_pad % 320 == 0;
    const int qbox = m->q80 ? 80 : br; /* Q and dO: a step's rows in one box */
    if (!make_operand_tmap(&m->q, a, a.q, false, qbox) ||
        !make_operand_tmap(&m->o, a, a.dout, false, qbox) ||
        !make_operand_tmap(&m->k, a, a.k, true, bc) || !make_operand_tmap(&m->v, a, a.v, true, bc))
        return false;
    /* kMode 5 (BwdBiasTile: d in (64, 128]) where TMA can read the bias and
     * either there is no dbias (bias_flags 1), or TMA can store it, nothing
     * broadcast (3), or it is broadcast over batch and/or heads only and
     * summed in an fp32 dbias_acc whose rows vector reductions can reach
     * (5: keys contiguous, 16-byte aligned rows); otherwise kMode 4's
     * per-element path (0), which FG_ATTN_BIAS_TMA=0 forces, as in the
     * forward (tests, comparisons). */
    if (a.bias && a.d > 64 && a.d <= 128 && !env_is("FG_ATTN_BIAS_TMA", "0") &&
        make_bias_tmap(&m->bias, a, a.bias, a.bias_s, a.bias_f32, br)) {
        if (a.dbias_mode == kDbiasNone)
            m->bias_flags = 1;
        else if (a.dbias_mode == kDbiasStore &&
                 make_bias_tmap(&m->dbias, a, a.dbias, a.dbias_s, a.dbias_f32, br))
            m->bias_flags = 3;
        else if (a.dbias_mode == kDbiasAtomic && dbias_red_ok(a))
            m->bias_flags = 5 | (a.dbias_acc_s[0] == 0 && a.B > 1 &&
                                         (a.Nk + bwd_keys(a.d) - 1) / bwd_keys(a.d) <= 65535
                                     ? 8
                                     : 0);
    }
    return true;
}

size_t attn_bwd_wgmma_maps_size() { return sizeof(BwdMaps); }

fg_status attn_bwd_wgmma_dispatch(fg_dtype dt, const AttnArgs &a, const void *maps,
                                  cudaStream_t st)
{
    const BwdMaps &m = *(const BwdMaps *)maps;
    /* dK and dV through shared memory (AttnArgs::dkv_staged; the kernels
     * at d <= 128) where every row of dK and dV starts 16-byte aligned
     * (session 34, H200, d = 128: +5-8% at N <= 2k, even at 8k);
     * FG_ATTN_BWD_EPI=0: from registers (tests, comparisons) */
    AttnArgs w = a;
    w.dkv_staged = !env_is("FG_ATTN_BWD_EPI", "0") && vec16_ok(a.dk) && vec16_ok(a.dv);
    if (dt == FG_BF16)
        return launch_dim<__nv_bfloat16>(w, m, st);
    return launch_dim<__half>(w, m, st);
}

} /* namespace fg */
