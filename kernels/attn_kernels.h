/* kernels/attn_kernels.h - launchers of the CUDA attention kernels, called
 * by attn_launch.cu once the public API has validated the problem. */
#ifndef FG_KERNELS_ATTN_KERNELS_H
#define FG_KERNELS_ATTN_KERNELS_H

#include "attn_traits.cuh"

namespace fg {

/* Forward: writes O, m, l. smem_limit = the device's opt-in per-block
 * shared memory. */
fg_status attn_fwd_dispatch(fg_dtype dt, const AttnArgs &a, size_t smem_limit,
                            cudaStream_t st);
/* Backward: needs a.D ([B,H,Nq]) and a.dq_acc ([B,H,Nq,d], zeroed) in the
 * accumulator type; writes dQ, dK, dV. */
fg_status attn_bwd_dispatch(fg_dtype dt, const AttnArgs &a, size_t smem_limit,
                            cudaStream_t st);

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_KERNELS_H */
