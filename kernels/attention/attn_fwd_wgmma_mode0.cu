/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma_mode0.cu - the sm_90a wgmma forward's
 * kMode 0 kernels (no mask), every dtype, head dim and dropout setting
 * (attn_fwd_wgmma.cuh). */
#include "attn_fwd_wgmma.cuh"

namespace fg {

FG_FWD_WGMMA_MODE(, 0)

} /* namespace fg */
