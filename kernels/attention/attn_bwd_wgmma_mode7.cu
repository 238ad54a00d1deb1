/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_mode7.cu - the sm_90a wgmma backward's
 * kMode 7 kernels (kMode 3's packed or key-padded batches with masks
 * alone), every dtype, head dim and dropout setting (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE(, 7)
FG_BWD_WGMMA_WIDE(, 7)

} /* namespace fg */
