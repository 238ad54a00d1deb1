/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_bwd_wgmma_mode5.cu - the sm_90a wgmma backward's
 * kMode 5 kernels (a bias, and dbias, that TMA moves; attn_bwd_wgmma.cuh's
 * BwdBiasTile): d = 128, both dtypes and dropout settings. */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_LAUNCH(, __half, 128, 5)
FG_BWD_WGMMA_LAUNCH(, __nv_bfloat16, 128, 5)

} /* namespace fg */
