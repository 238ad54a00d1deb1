/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_mode0.cu - the sm_90a wgmma backward's
 * kMode 0 kernels (no mask), every dtype, head dim and dropout setting,
 * and the 80-query d = 128 ones (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE(, 0)
FG_BWD_WGMMA_WIDE(, 0)
FG_BWD_WGMMA_Q80()

} /* namespace fg */
