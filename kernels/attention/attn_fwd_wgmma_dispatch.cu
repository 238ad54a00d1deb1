/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma_dispatch.cu - the sm_90a wgmma forward's
 * dispatch: the kernel instantiation a call takes (kMode, dropout, padded
 * head dim), whether the sm_90a image is the one loaded, tile sizes and
 * TMA maps. The kernels are built in attn_fwd_wgmma_mode<k>.cu. */
#include "attn_fwd_wgmma.cuh"

#include <stdlib.h>
#include <string.h>

namespace fg {

/* The kMode a call takes: 7 / 3 a packed or key-padded batch (masks alone
 * or with modifiers), 6 / 2 the variants, 1 causal, 0 none. The tile
 * (FwdWide) and so the K/V maps depend on it too. */
static int fwd_kmode(const AttnArgs &a)
{
    /* kModes 6 and 7: masks alone (kmode_mods) */
    const bool mods = a.softcap > 0.f || a.alibi || a.bias;
    if (a.cu_q || a.seqused_k)
        return mods ? 3 : 7;
    if (a.variant)
        return mods ? 2 : 6;
    return a.causal ? 1 : 0;
}

template <typename T, int D, int WG>
static fg_status launch_opts(const AttnArgs &a, const FwdMaps &m, cudaStream_t st)
{
    switch (fwd_kmode(a)) {
    case 7:
        return a.dropout ? launch<T, D, WG, 7, true>(a, m, st) : launch<T, D, WG, 7, false>(a, m, st);
    case 3:
        return a.dropout ? launch<T, D, WG, 3, true>(a, m, st) : launch<T, D, WG, 3, false>(a, m, st);
    case 6:
        return a.dropout ? launch<T, D, WG, 6, true>(a, m, st) : launch<T, D, WG, 6, false>(a, m, st);
    case 2:
        return a.dropout ? launch<T, D, WG, 2, true>(a, m, st) : launch<T, D, WG, 2, false>(a, m, st);
    case 1:
        return a.dropout ? launch<T, D, WG, 1, true>(a, m, st) : launch<T, D, WG, 1, false>(a, m, st);
    default:
        return a.dropout ? launch<T, D, WG, 0, true>(a, m, st) : launch<T, D, WG, 0, false>(a, m, st);
    }
}

template <typename T>
static fg_status launch_dim(const AttnArgs &a, const FwdMaps &m, cudaStream_t st)
{
    if (a.d <= 64)
        return launch_opts<T, 64, FwdWG<64>::value>(a, m, st);
    if (a.d <= 128)
        return launch_opts<T, 128, FwdWG<128>::value>(a, m, st);
    return launch_opts<T, 256, FwdWG<256>::value>(a, m, st);
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
    if (env_is("FG_ATTN_KERNEL", "mma") || env_is("FG_ATTN_KERNEL", "general"))
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

/* wide: the call takes the kMode 0 kernel without dropout, whose tile
 * FwdWide may widen (fwd_kmode) */
template <int D> static void tile_of(bool wide, int *br, int *bc, size_t *smem)
{
    constexpr int wg = FwdWG<D>::value;
    using Plain = FwdWgTile<D, wg>;
    using Wide = FwdWgTile<D, wg, FwdWide<D, 0, false>::value>;
    *br = Plain::kBr;
    *bc = wide ? Wide::kBc : Plain::kBc;
    *smem = wide ? Wide::kSmem : Plain::kSmem;
}

static void fwd_tile(int d, bool wide, int *br, int *bc, size_t *smem)
{
    if (d <= 64)
        tile_of<64>(wide, br, bc, smem);
    else if (d <= 128)
        tile_of<128>(wide, br, bc, smem);
    else
        tile_of<256>(wide, br, bc, smem);
}

/* the most any of d's kernels asks for */
size_t attn_fwd_wgmma_smem(int d)
{
    int br, bc;
    size_t plain, wide;
    fwd_tile(d, false, &br, &bc, &plain);
    fwd_tile(d, true, &br, &bc, &wide);
    return plain > wide ? plain : wide;
}

bool attn_fwd_wgmma_dispatch(fg_dtype dt, const AttnArgs &a, cudaStream_t st,
                             fg_status *status)
{
    int br, bc;
    size_t smem;
    fwd_tile(a.d, fwd_kmode(a) == 0 && !a.dropout, &br, &bc, &smem);
    FwdMaps m;
    memset(&m, 0, sizeof m);
    m.kv_rows = bc;
    if (!make_operand_tmap(&m.q, a, a.q, false, br) ||
        !make_operand_tmap(&m.k, a, a.k, true, bc) ||
        !make_operand_tmap(&m.v, a, a.v, true, bc))
        return false;
    /* FG_ATTN_BIAS_TMA=0: the per-element bias loads (tests, comparisons) */
    m.bias_tma = a.variant && a.bias && !env_is("FG_ATTN_BIAS_TMA", "0") &&
                 make_bias_tmap(&m.bias, a, a.bias, a.bias_s, a.bias_f32, br);
    /* O through shared memory (AttnArgs::o_staged) where every row of O
     * starts 16-byte aligned; FG_ATTN_FWD_EPI=0: from registers (tests,
     * comparisons; session 34, H200: the same speed within noise, ncu
     * -0.6% at d = 128, N = 8k) */
    AttnArgs w = a;
    w.o_staged = !env_is("FG_ATTN_FWD_EPI", "0") && vec16_ok(a.o);
    *status = dt == FG_BF16 ? launch_dim<__nv_bfloat16>(w, m, st) : launch_dim<__half>(w, m, st);
    return true;
}

} /* namespace fg */
