/* kernels/attention/attn_bwd_wgmma_mode3.cu - the sm_90a wgmma backward's
 * kMode 3 kernels (the variants of a packed or key-padded batch), every
 * dtype and head dim, dropout a run-time flag (attn_bwd_wgmma.cuh). */
#include "attn_bwd_wgmma.cuh"

namespace fg {

FG_BWD_WGMMA_MODE_RT(, 3)

} /* namespace fg */
