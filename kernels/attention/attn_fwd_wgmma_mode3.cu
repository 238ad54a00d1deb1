/* kernels/attention/attn_fwd_wgmma_mode3.cu - the sm_90a wgmma forward's
 * kMode 3 kernels (the variants of a packed or key-padded batch), every
 * dtype and head dim, dropout a run-time flag (attn_fwd_wgmma.cuh). */
#include "attn_fwd_wgmma.cuh"

namespace fg {

FG_FWD_WGMMA_MODE_RT(, 3)

} /* namespace fg */
