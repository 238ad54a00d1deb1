/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_mode3.cu - the sm_90a wgmma backward's
 * kMode 3 kernels (the variants of a packed or key-padded batch), every dtype,
 * head dim and dropout setting (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE(, 3)
FG_BWD_WGMMA_WIDE(, 3)

} /* namespace fg */
