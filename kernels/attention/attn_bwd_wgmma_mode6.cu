/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_mode6.cu - the sm_90a wgmma backward's
 * kMode 6 kernels (kMode 2's variants with masks alone: no softcap, no
 * ALiBi), every dtype, head dim and dropout setting (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE(, 6)
FG_BWD_WGMMA_WIDE(, 6)

} /* namespace fg */
