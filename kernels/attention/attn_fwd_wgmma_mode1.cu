/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma_mode1.cu - the sm_90a wgmma forward's
 * kMode 1 kernels (bottom-right causal), every dtype, head dim and dropout
 * setting (attn_fwd_wgmma.cuh). */
#include "attn_fwd_wgmma.cuh"

namespace fg {

FG_FWD_WGMMA_MODE(, 1)

} /* namespace fg */
