/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_mode2.cu - the sm_90a wgmma backward's
 * kMode 2 kernels (the variants: band, block lists, softcap, ALiBi), every
 * dtype, head dim and dropout setting (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE(, 2)
FG_BWD_WGMMA_WIDE(, 2)

} /* namespace fg */
