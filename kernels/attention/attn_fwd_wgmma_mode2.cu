/* kernels/attention/attn_fwd_wgmma_mode2.cu - the sm_90a wgmma forward's
 * kMode 2 kernels (the variants: band, block lists, softcap, ALiBi, bias),
 * every dtype and head dim, dropout a run-time flag (attn_fwd_wgmma.cuh). */
#include "attn_fwd_wgmma.cuh"

namespace fg {

FG_FWD_WGMMA_MODE_RT(, 2)

} /* namespace fg */
