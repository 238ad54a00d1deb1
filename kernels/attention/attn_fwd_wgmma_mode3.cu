/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma_mode3.cu - the sm_90a wgmma forward's
 * kMode 3 kernels (the variants of a packed or key-padded batch), every dtype,
 * head dim and dropout setting (attn_fwd_wgmma.cuh). */
#include "attn_fwd_wgmma.cuh"

namespace fg {

FG_FWD_WGMMA_MODE(, 3)

} /* namespace fg */
