/* kernels/attention/attn_bwd_wgmma_mode4.cu - the sm_90a wgmma backward's
 * kMode 4 kernels (the variants with a bias and dbias), every dtype and
 * head dim, dropout a run-time flag (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE_RT(, 4)

} /* namespace fg */
