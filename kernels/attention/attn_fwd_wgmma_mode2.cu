/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma_mode2.cu - the sm_90a wgmma forward's
 * kMode 2 kernels (the variants: band, block lists, softcap, ALiBi, bias),
 * every dtype, head dim and dropout setting (attn_fwd_wgmma.cuh). */
#include "attn_fwd_wgmma.cuh"

namespace fg {

FG_FWD_WGMMA_MODE(, 2)

} /* namespace fg */
