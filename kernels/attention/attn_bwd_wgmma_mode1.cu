/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_mode1.cu - the sm_90a wgmma backward's
 * kMode 1 kernels (bottom-right causal), every dtype, head dim and dropout
 * setting (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE(, 1)
FG_BWD_WGMMA_WIDE(, 1)

} /* namespace fg */
