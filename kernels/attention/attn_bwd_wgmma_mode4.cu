/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_mode4.cu - the sm_90a wgmma backward's
 * kMode 4 kernels (the variants with a bias and dbias), every dtype, head dim
 * and dropout setting (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE(, 4)

} /* namespace fg */
