/* SPDX-License-Identifier: MIT */
/* kernels/attention/attn_kernels.h - launchers of the CUDA attention kernels, called
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

/* dbias around the backward (attn_bias.cu), by a.dbias_mode: before the
 * main kernel, zero what it stores or adds into; after it, convert the
 * scratch into dbias or run the deterministic pass. No-ops without dbias. */
fg_status attn_dbias_before(fg_dtype dt, const AttnArgs &a, cudaStream_t st);
fg_status attn_dbias_after(fg_dtype dt, const AttnArgs &a, size_t smem_limit,
                           cudaStream_t st);

/* Strict fp32 kernels (attn_fp32_fwd.cu, attn_fp32_bwd.cu): register-
 * blocked SIMT FMA. *ran = false when they do not take the problem (a
 * bias, FG_ATTN_KERNEL=general, or tiles too big for this GPU's shared
 * memory): then nothing was launched and the general kernels run. The
 * backward needs a.D filled and, unless deterministic, a.dq_acc zeroed
 * (row-major); with deterministic = 1 it writes dQ itself. */
fg_status attn_fp32_fwd(const AttnArgs &a, size_t smem_limit, cudaStream_t st, bool *ran);
fg_status attn_fp32_bwd(const AttnArgs &a, size_t smem_limit, cudaStream_t st, bool *ran);
/* The strict deterministic dQ kernel alone (deterministic = 1, a.D filled),
 * and its shared memory: the TF32 backward's deterministic dQ. */
fg_status attn_fp32_dq(const AttnArgs &a, cudaStream_t st);
size_t attn_fp32_dq_smem(int d);

/* Tensor-core fp32 kernels (attn_tf32_fwd.cu, attn_tf32_bwd.cu; sm_80+
 * mma.sync m16n8k8): TF32 when fg_cuda_set_attention_allow_tf32 is on,
 * else strict fp32 through the 3xTF32 split. *ran = false when they do not
 * take the problem (a bias, packed or key-padded batches, operands not
 * 16-byte aligned, FG_ATTN_KERNEL=general or =simt, or tiles too big for
 * the GPU's shared memory): nothing was launched and the SIMT fp32 kernels
 * run. The backward's contract is attn_fp32_bwd's; with deterministic = 1
 * its dQ comes from the SIMT dQ kernel (attn_fp32_dq). */
fg_status attn_tf32_fwd(const AttnArgs &a, size_t smem_limit, cudaStream_t st, bool *ran);
fg_status attn_tf32_bwd(const AttnArgs &a, size_t smem_limit, cudaStream_t st, bool *ran);

/* Tensor-core fp16/bf16 paths (sm_80+). */
fg_status attn_fwd_mma_dispatch(fg_dtype dt, const AttnArgs &a, cudaStream_t st);
size_t attn_fwd_mma_smem(int d);
fg_status attn_bwd_mma_dispatch(fg_dtype dt, const AttnArgs &a, cudaStream_t st);
bool attn_bwd_mma_supported(int d, size_t smem_limit);

/* Hopper wgmma paths (sm_90a). wgmma_usable() is true when the library
 * holds sm_90a code for the current device (a compute capability 9.0 GPU
 * and a build with 90 in --with-cuda-arch) and FG_ATTN_KERNEL is neither
 * "mma" (forces the sm_80 kernels) nor "general". */
bool wgmma_usable();
/* False when the operands cannot be described to the TMA engine (then
 * nothing was launched); otherwise *status is the launch's. */
bool attn_fwd_wgmma_dispatch(fg_dtype dt, const AttnArgs &a, cudaStream_t st,
                             fg_status *status);
size_t attn_fwd_wgmma_smem(int d);
/* Backward: the four tensor maps (Q, K, V, dO) go into `maps` (at least
 * attn_bwd_wgmma_maps_size() bytes, 64-byte aligned); false when the
 * operands cannot be described to the TMA engine. The launch needs
 * a.lse2p / a.Dp filled (attn_bwd.cu pads them). */
bool attn_bwd_wgmma_maps(const AttnArgs &a, void *maps);
size_t attn_bwd_wgmma_maps_size();
/* True when the kernel of these maps writes every element of dbias, so
 * attn_dbias_before's zeroing can be skipped. */
bool attn_bwd_wgmma_covers_dbias(const AttnArgs &a, const void *maps);
fg_status attn_bwd_wgmma_dispatch(fg_dtype dt, const AttnArgs &a, const void *maps,
                                  cudaStream_t st);
/* Dynamic shared memory of the call's kernel (a bias adds the stages of
 * BwdBiasTile at d <= 128). */
size_t attn_bwd_wgmma_smem(const AttnArgs &a);
/* The head dim the wgmma backward computes with (64, 128 or 256); its dQ
 * accumulator is [B*H][nq_pad][dpad] floats in the tiled layout
 * (AttnArgs::dq_tile_d). */
int attn_bwd_wgmma_dpad(int d);
/* Rows of lse2p / Dp / the tiled dq_acc per (b, h): Nq rounded up to 128,
 * or to 320 where the call may take the 80-query d = 128 kernel (q80_call
 * in attn_bwd_wgmma_dispatch.cu: its steps and transposed dQ tiles are 80
 * rows, the prep and write passes' tiles 64). */
int64_t attn_bwd_wgmma_nq_pad(const AttnArgs &a);
/* The query rows of one tile of the call's tiled dq_acc
 * (AttnArgs::dq_tile_q): 80 when attn_bwd_wgmma_maps chose the 80-query
 * kernel, else 64. */
int attn_bwd_wgmma_dq_tile_q(const void *maps);

/* The tensor-core kernels copy 16-byte row chunks: every operand pointer
 * must be 16-byte aligned and every stride a multiple of 8 elements.
 * FG_ATTN_KERNEL=general in the environment forces the general kernels
 * (tests and benchmarks use it to exercise both). */
bool mma_path_ok(const AttnArgs &a, bool backward);
/* What the TF32 kernels (attn_tf32.cuh) run: neither a bias nor packed
 * or key-padded batches. */
inline bool tf32_supports(const AttnArgs &a)
{
    return !a.bias && !a.cu_q && !a.seqused_k;
}

} /* namespace fg */

#endif /* FG_KERNELS_ATTN_KERNELS_H */
