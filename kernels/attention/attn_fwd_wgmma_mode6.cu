/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_fwd_wgmma_mode6.cu - the sm_90a wgmma forward's
 * kMode 6 kernels (kMode 2's variants with masks alone: no
 * softcap, ALiBi or bias), every dtype, head dim and dropout setting
 * (attn_fwd_wgmma.cuh). */
#include "attn_fwd_wgmma.cuh"

namespace fg {

FG_FWD_WGMMA_MODE(, 6)

} /* namespace fg */
