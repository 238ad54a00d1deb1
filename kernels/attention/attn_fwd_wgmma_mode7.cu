/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma_mode7.cu - the sm_90a wgmma forward's
 * kMode 7 kernels (kMode 3's packed or key-padded batches with masks
 * alone: no softcap, ALiBi or bias), every dtype, head dim and dropout
 * setting (attn_fwd_wgmma.cuh). */
#include "attn_fwd_wgmma.cuh"

namespace fg {

FG_FWD_WGMMA_MODE(, 7)

} /* namespace fg */
