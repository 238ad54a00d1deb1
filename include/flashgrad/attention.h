/* SPDX-License-Identifier: MIT */
/* flashgrad/attention.h - the low-level FlashAttention API.
 *
 * Computes, for every batch b and query head h,
 *
 *     S = scale * Q K^T            (Nq x Nk, never stored)
 *     P = softmax(S) (row-wise, after masking)
 *     O = dropout(P) V
 *
 * with the FlashAttention algorithm (Dao et al., arXiv 2205.14135): the
 * forward streams K/V blocks past a query block keeping a running row max m
 * and row sum l, and saves only O, m and l; the backward recomputes S and P
 * block by block from Q, K, V, m, l and the dropout seed. Nothing of size
 * Nq x Nk is ever allocated.
 *
 * Operands. Q is [B, Nq, H, d]; K and V are [B, Nk, Hk, d]; O, dO, dQ like
 * Q; dK, dV like K. Each is an fg_attn_tensor: a data pointer, a dtype and
 * three element strides (batch, sequence, head); the head dimension d is
 * contiguous. BSHD and BHSD layouts (and packed QKV) need no copies:
 *
 *     fg_attn_tensor q = fg_attn_bshd(ptr, FG_FP32, Nq, H, d);
 *     fg_attn_tensor k = fg_attn_bhsd(ptr, FG_FP32, Nk, Hk, d);
 *
 * GQA / MQA: H must be a multiple of Hk; query head h reads K/V head
 * h / (H / Hk). dK and dV sum over the query heads of each group.
 *
 * Row statistics (fg_attn_stats): m[b,h,i] = max_j S_ij and
 * l[b,h,i] = sum_j exp(S_ij - m[b,h,i]) over unmasked j, contiguous
 * [B, H, Nq]. They are float32 for fp32/fp16/bf16 operands and float64 for
 * fp64 operands (so the fp64 path stays a full-precision oracle). A row with
 * every key masked has m = -INFINITY, l = 0, O = 0 and zero gradients.
 * logsumexp = m + log(l).
 *
 * Masks and score modifiers (all optional, all combinable with each other,
 * with dropout, GQA/MQA and strided layouts). Write i' = i + shift for
 * query row i, where shift = Nk - Nq with the default bottom-right
 * alignment (FlashAttention >= 2.1) and shift = 0 with top-left alignment
 * (causal_align = FG_ATTN_ALIGN_TOP_LEFT, PyTorch's is_causal). Key j is
 * visible to query i iff j < Nk and
 *
 *     causal:        j <= i'
 *     window_left:   j >= i' - window_left    (-1 or >= 2^62: unbounded)
 *     window_right:  j <= i' + window_right   (-1 or >= 2^62: unbounded)
 *     block mask:    key block j / 128 is listed for query block i / 128
 *
 * and the score of a visible pair is
 *
 *     S_ij = scale q_i . k_j                     (plain)
 *     S_ij <- softcap * tanh(S_ij / softcap)     (softcap > 0)
 *     S_ij <- S_ij - slope[b, h] * |i' - j|      (alibi_slopes != NULL)
 *     S_ij <- S_ij + bias[b, h, i, j]            (bias != NULL)
 *
 * in that order (softcap, then ALiBi, then the bias, then the mask), as
 * FlashAttention-2 does for the first two; the backward differentiates the
 * softcap exactly (dS_raw = dS (1 - tanh^2)). With Nq > Nk and bottom-right
 * causal the first Nq - Nk query rows see no key at all.
 *
 * Bias (fg_attn_bias, any broadcast through zero strides): fp32 or the
 * operands' dtype. A masked pair's bias is never read; a -inf bias masks
 * its pair (a row whose visible keys all have -inf bias behaves as a fully
 * masked row: O = 0, m = -inf, l = 0), a NaN bias makes its row NaN. The
 * backward writes dbias = dL/dS_ij at the bias (after the softcap chain:
 * P (dP - D), not times 1 - tanh^2), summed over the dimensions bias
 * broadcasts; dbias must broadcast exactly where bias does (on dimensions
 * of extent > 1), has its own strides and dtype (fp32 or the operands'),
 * is overwritten (masked pairs get 0) and may overlap nothing else. dbias
 * is summed in a fixed order on the CPU and, with deterministic = 1, on
 * CUDA (otherwise broadcast sums use atomics there). Nothing Nq x Nk is
 * allocated. Bias is not supported with cu_seqlens / seqused_k. On CUDA,
 * fp16/bf16 bias problems take the tensor-core kernels (Hopper's sm_90a
 * ones, elsewhere the sm_80 ones; forward and backward); fp32/fp64 run
 * them on the general kernels (doc/performance.md).
 *
 * Dropout (probability p in [0, 1)) is applied to P after normalisation.
 * The keep decision for element (b, h, i, j) is a pure function of
 * (seed, offset, b, h, i, j): one 8-bit draw per element, 16 draws per
 * Philox4x32-7 call (Random123's philox4x32 with 7 rounds, as
 * FlashAttention-2's dropout; cuRAND's device API has only the 10-round
 * generator):
 *
 *     key     = { lo32(seed), hi32(seed) ^ hi32(offset) }
 *     counter = { (j / 32) * 4 + (j / 2) % 4,  (i / 16) * 8 + i % 8,
 *                 b * H + h,  lo32(offset) }
 *     r       = word (j % 2 + 2 * ((j / 16) % 2)) of Philox4x32_7(counter, key)
 *     u       = byte ((i / 8) % 2 + 2 * ((j / 8) % 2)) of r (byte 0 = low 8 bits)
 *     keep   <=> u < T,  T = round((1 - p) * 256)  (fg_attention_dropout_threshold)
 *
 * and kept values are scaled by 256 / T. So p has a resolution of 1/256:
 * the effective drop probability is 1 - T/256 (p = 0.1 gives 0.1016,
 * p = 0.2 gives 0.1992), and the scale 256/T keeps the expectation of
 * the output exactly P V. One call covers rows i, i + 8 and columns
 * 32c + 8n + 2q + e (n < 4, e < 2), exactly what one GPU thread holds of a
 * tile, which is what makes dropout cheap in the tensor-core kernels
 * (doc/design.md). The CPU and CUDA implementations produce identical masks;
 * the backward regenerates the mask from (seed, offset), nothing mask-shaped
 * is stored. Use a fresh offset (or seed) for every call that needs a new mask.
 *
 * NaN in, NaN out: a NaN in any score a row sees makes that row's O, m and
 * l NaN, and every gradient it touches NaN (a NaN is never mistaken for a
 * masked row).
 *
 * Supported: head_dim a multiple of 8 in [8, 256]; seqlen_q, seqlen_k and
 * batch * heads_q in [1, 2^31); block_q, block_k <= 1024.
 * Devices and dtypes: CPU fp32/fp64; CUDA when the build and machine have it.
 * Every variant runs on every path; on CUDA, fp16/bf16 variants take the
 * tensor-core kernels, the Hopper (sm_90a) wgmma ones or elsewhere the
 * sm_80 mma.sync ones, like plain attention. The one fallback: operands
 * that are not 16-byte aligned (a pointer or a stride not a multiple of 8
 * elements) run on the general kernels (correct, plain-FMA speed), as
 * plain attention does (doc/performance.md). fp32 on CUDA is strict fp32
 * (every output within 1e-5 of max |output| against fp64 in the GPU
 * suite): on sm_80+ tensor cores by 3xTF32 (each operand split into a
 * TF32 part and a TF32 remainder, three products summed in fp32, each
 * k step's products apart; CUTLASS's fast-accurate fp32) where the
 * tensor-core kernels below take the problem (the backward at head dims
 * above 128 only where a block gets 221 KiB of shared memory: H100,
 * H200), else on register-blocked
 * SIMT fp32 kernels (fp32 FMAs) with every variant but a bias (the
 * general kernels); fp64 runs on the general kernels. An infinite input
 * may give NaN on the 3xTF32 path where fp32 gives an infinity (inf - inf
 * in the split); ./configure --disable-attn-tf32x3 builds without it.
 * With fg_cuda_set_attention_allow_tf32(1) (flashgrad/cuda.h; off by
 * default) fp32 runs on TF32 tensor cores (sm_80+ mma.sync, one rounded
 * product; 4-10x the SIMT kernels) with every mask, score modifier and
 * dropout (the same keep mask bit for bit). Problems they do not take stay
 * on the SIMT kernels: packed or key-padded batches, operands not 16-byte
 * aligned (a pointer, or a stride not a multiple of 4 elements), tiles too
 * big for the GPU's shared memory (the d = 256 backward on GPUs with less
 * than 205 KiB per block, e.g. an A100); with deterministic = 1 the
 * backward's dQ comes from the SIMT kernel, except on the Hopper kernels
 * without a block mask (see deterministic below); the strict
 * 3xTF32 mode above has the same cover. FG_ATTN_KERNEL=simt forces the
 * SIMT kernels for fp32, the switch notwithstanding (testing and
 * comparison). TF32 error: Q, K, V, dO
 * and the intermediate P and dS are rounded to 10 mantissa bits (2^-11
 * relative), products are summed in fp32, so every output stays within
 * 2^-11 (1 + scale max|q_i| max|k_j|) of max |output| (the bound the GPU
 * suite tests; the error grows with sqrt(d) through that product).
 * A bias, packed batches and key padding are the exceptions: in fp16/bf16
 * they run on the Hopper and the sm_80 kernels, in fp32 on the general
 * kernels, not the TF32 ones (doc/performance.md). The Hopper kernels load whole tiles of K and V
 * (and, backward, of Q and dO), so the last tile of a packed sequence also
 * reads rows outside it (the next sequence's, or padding past seqused_k);
 * they are masked, but an inf or NaN in such a row still turns the rows or
 * keys that see the tile NaN (0 * inf). Keep padding finite (e.g. zeroed),
 * or set FG_ATTN_KERNEL=mma (the sm_80 kernels) or general: those never
 * read those rows.
 *
 * Errors: every function validates all arguments before it writes anything;
 * on failure it returns a status, fg_last_error() explains it and every
 * output is left untouched. Outputs may not overlap each other or any input
 * (inputs may alias each other, e.g. Q == K). */
#ifndef FLASHGRAD_ATTENTION_H
#define FLASHGRAD_ATTENTION_H

#include <stdint.h>
#include "flashgrad/export.h"
#include "flashgrad/status.h"
#include "flashgrad/types.h"

FG_BEGIN_DECLS

/* Largest head dimension any device supports. */
#define FG_ATTN_MAX_HEAD_DIM 256

/* A strided [B, S, heads, d] operand. Strides are in elements, d is
 * contiguous (stride 1). */
typedef struct fg_attn_tensor {
    void *data;
    fg_dtype dtype;
    int64_t stride_b; /* between batches */
    int64_t stride_s; /* between sequence positions */
    int64_t stride_h; /* between heads */
} fg_attn_tensor;

/* Row statistics m and l, each contiguous [B, H, Nq]. */
typedef struct fg_attn_stats {
    void *m;
    void *l;
    fg_dtype dtype; /* FG_FP64 for fp64 operands, FG_FP32 otherwise */
} fg_attn_stats;

/* Causal alignment (fg_attn_params.causal_align). */
enum {
    FG_ATTN_ALIGN_BOTTOM_RIGHT = 0, /* i' = i + Nk - Nq (FlashAttention) */
    FG_ATTN_ALIGN_TOP_LEFT = 1      /* i' = i (PyTorch is_causal) */
};

/* Block-sparse attention (the block-sparse FlashAttention of Dao et al.,
 * given the FlexAttention way): the sequence is cut into blocks of
 * FG_ATTN_SPARSE_BLOCK queries and keys; for each (b, h, query block) a
 * count and an ascending list of the key blocks to visit, and the
 * transposed lists the backward walks. Unlisted blocks are never loaded or
 * computed. The arrays are int32, contiguous, on the operands' device:
 *
 *     kv_count [mb, mh, nqb]         kv_index [mb, mh, nqb, nkb]
 *     q_count  [mb, mh, nkb]         q_index  [mb, mh, nkb, nqb]
 *
 * with nqb = ceil(Nq / 128), nkb = ceil(Nk / 128), and mb in {1, B},
 * mh in {1, H} (1 broadcasts over that dimension). Only the first count
 * entries of each list are read. fg_attn_block_mask_build() fills all four
 * from a dense boolean block map; the two views must describe the same set
 * of blocks. */
#define FG_ATTN_SPARSE_BLOCK 128
typedef struct fg_attn_block_mask {
    int64_t batch, heads;     /* mb, mh: 1 or the problem's B, H */
    int64_t q_blocks, k_blocks; /* nqb, nkb */
    const int32_t *kv_count, *kv_index;
    const int32_t *q_count, *q_index;
} fg_attn_block_mask;

/* An additive score bias (fg_attn_params.bias) or its gradient
 * (fg_attn_params.dbias): element (b, h, i, j) lives at
 * data[b*stride_b + h*stride_h + i*stride_q + j*stride_k] (element
 * strides). A zero stride broadcasts over that dimension, so [Nq, Nk],
 * [H, Nq, Nk], [B, 1, 1, Nk] and [B, H, Nq, Nk] all fit. */
typedef struct fg_attn_bias {
    void *data;
    fg_dtype dtype;  /* FG_FP32 or the operands' dtype */
    int64_t stride_b, stride_h, stride_q, stride_k;
} fg_attn_bias;

/* Problem description shared by forward and backward. Fill it with
 * fg_attn_params_init(), then change what you need. */
typedef struct fg_attn_params {
    int64_t batch;     /* B  >= 1 */
    int64_t seqlen_q;  /* Nq >= 1 */
    int64_t seqlen_k;  /* Nk >= 1 */
    int64_t heads_q;   /* H  >= 1 */
    int64_t heads_kv;  /* Hk >= 1, divides H */
    int64_t head_dim;  /* d, multiple of 8 in [8, 256] */
    fg_device device;  /* where all pointers live; default CPU */
    double softmax_scale; /* 0 -> 1/sqrt(d); else in (0, FLT_MAX] for every
                             dtype; overflowing scores: doc/reliability.md */
    int causal;        /* bottom-right aligned causal mask */
    double dropout_p;  /* in [0, 1) */
    uint64_t seed;     /* dropout RNG key */
    uint64_t offset;   /* dropout RNG stream offset */
    int block_q;       /* CPU tile rows Br, 0 -> default (64) */
    int block_k;       /* CPU tile columns Bc, 0 -> default (64) */
    int num_threads;   /* CPU threads, 0 -> OpenMP default, at most 1024;
                          capped at the processor count; result is
                          identical for every thread count */
    void *cuda_stream; /* cudaStream_t for device = CUDA, NULL = default
                          stream; CUDA calls are asynchronous on it */
    int deterministic; /* CUDA backward: dQ summed in a fixed order
                          instead of by atomics, so reruns are bitwise
                          identical. The Hopper fp16/bf16 kernels
                          without a block mask add each 64-query tile
                          of dQ in a fixed order of key blocks (d <= 128:
                          0.85-1.00x the default's speed on an H200,
                          d = 256: 0.89-0.93x);
                          elsewhere a separate dQ pass (much slower).
                          The order, and so the bits, can differ between
                          GPU models (it depends on the SM count). The
                          CPU backend is always deterministic. */
    /* Variants (see the top of this file); fg_attn_params_init() sets
     * none of them. */
    int causal_align;      /* FG_ATTN_ALIGN_BOTTOM_RIGHT or _TOP_LEFT; also
                              aligns the window and ALiBi distance */
    int64_t window_left;   /* >= -1; -1 (the default) = unbounded */
    int64_t window_right;  /* >= -1; -1 (the default) = unbounded */
    double softcap;        /* 0 = off, else in [FLT_MIN, FLT_MAX] (it and
                              its inverse normal fp32 numbers) */
    const float *alibi_slopes; /* NULL = off, else fp32 slopes on the
                              operands' device, finite, [H] or [B, H] */
    int64_t alibi_stride_b; /* elements between batches of the slopes: 0 for
                              [H] (shared by every batch), H for [B, H] */
    const fg_attn_block_mask *block_mask; /* NULL = dense */
    /* Additive bias (see fg_attn_bias): S_ij += bias[b, h, i, j] after
     * softcap and ALiBi, before the mask. NULL = none. */
    const fg_attn_bias *bias;
    /* Backward only: where to write dL/dbias, with zero strides exactly
     * where bias has them (broadcast dimensions are summed). Overwritten.
     * NULL = not wanted. Forward ignores it. */
    const fg_attn_bias *dbias;
    /* Packed variable-length batches (FlashAttention's varlen API; NULL =
     * dense; give both or neither). Q, O, dO, dQ are [total_q, H, d] and
     * K, V, dK, dV [total_k, Hk, d] (stride_s and stride_h used, stride_b
     * ignored); sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1
     * of Q and cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1 of K/V. Both are
     * int32 [B+1] on the operands' device: cu[0] = 0, non-decreasing,
     * cu[B] <= total, every length <= seqlen_q / seqlen_k (which are the
     * maximum lengths; zero-length sequences are allowed). Stats m, l are
     * [H, total_q] (one entry per packed token and head). Every mask and
     * modifier works per sequence, with sequence-local positions: i' =
     * i + len_k(b) - len_q(b) bottom-right, i top-left; dropout draws
     * element (b, h, i, j) with sequence-local i, j. Block masks cannot be
     * combined with cu_seqlens (FG_ERR_UNSUPPORTED). Rows past cu[B]
     * belong to no sequence: they are neither read nor written (their
     * O, m, l, dQ, dK, dV keep their contents). On CUDA the validation
     * copies the B+1 offsets to the host (once when cu_seqlens_k ==
     * cu_seqlens_q, else twice), so the call waits for cuda_stream and
     * cannot be captured in a CUDA graph, unless the host copies below
     * are given. Which kernels run them: the top of this file. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int64_t total_q, total_k;  /* rows of the packed buffers, < 2^31 */
    /* Key padding (NULL = none): int32 [B] on the operands' device; keys at
     * or past seqused_k[b] of sequence b are masked, as by a key-padding
     * mask: 0 <= seqused_k[b] <= the sequence's key length (Nk dense).
     * Works dense or packed. It masks, it does not move the causal corner
     * (unlike FlashAttention's seqused_k, where it also sets the bottom-
     * right alignment): i' is still computed from len_k(b). Padded keys
     * get dK = dV = 0; a row that sees no key gets O = 0, m = -inf,
     * l = 0. On CUDA the values are validated through a host copy (one
     * synchronisation, as for cu_seqlens) unless seqused_k_host is given. */
    const int32_t *seqused_k;
    /* Host copies of cu_seqlens_q, cu_seqlens_k and seqused_k (NULL =
     * none; each only beside its array), for CUDA calls that must not
     * wait: when every array the call gives has its copy here, the
     * validation reads the copies and nothing is copied back from the
     * device. The caller guarantees that the device arrays hold the same
     * values when the kernels run on cuda_stream: the kernels read the
     * device arrays, and a copy that differs from them is undefined
     * behaviour (as a wrong max_seqlen is in FlashAttention). On the CPU
     * the arrays themselves are validated and a copy must equal its array
     * (FG_ERR_INVALID_ARGUMENT otherwise). The autograd op
     * (fg_attention_options) makes its own. */
    const int32_t *cu_seqlens_q_host;
    const int32_t *cu_seqlens_k_host;
    const int32_t *seqused_k_host;
} fg_attn_params;

/* Defaults: CPU, scale 1/sqrt(d), no causal mask, no dropout. */
FG_API void fg_attn_params_init(fg_attn_params *p, int64_t batch,
                                int64_t seqlen_q, int64_t seqlen_k,
                                int64_t heads_q, int64_t heads_kv,
                                int64_t head_dim);

/* Contiguous [B, S, H, d] and [B, H, S, d] views of a buffer. When a size
 * is negative or the strides' products (S * H * d) overflow int64, all
 * three strides are FG_ATTN_STRIDE_BAD and every entry point rejects the
 * tensor with FG_ERR_INVALID_ARGUMENT and a message that says so (no
 * undefined arithmetic, no wrapped stride that looks valid). */
#define FG_ATTN_STRIDE_BAD INT64_MIN
FG_API fg_attn_tensor fg_attn_bshd(void *data, fg_dtype dtype, int64_t seqlen,
                                   int64_t heads, int64_t head_dim);
FG_API fg_attn_tensor fg_attn_bhsd(void *data, fg_dtype dtype, int64_t seqlen,
                                   int64_t heads, int64_t head_dim);

/* Forward: writes O (like Q) and the statistics m, l. */
FG_API fg_status fg_attention_forward(const fg_attn_params *p,
                                      const fg_attn_tensor *q,
                                      const fg_attn_tensor *k,
                                      const fg_attn_tensor *v,
                                      const fg_attn_tensor *o,
                                      const fg_attn_stats *stats);

/* Backward: from the forward's inputs, O, the statistics and dO, writes
 * dQ, dK, dV (overwritten, not accumulated). Uses the same params (seed
 * and offset included) as the forward. Extra memory: O(B * H * Nq) for
 * D = rowsum(dO * O), plus per-thread tiles. */
FG_API fg_status fg_attention_backward(const fg_attn_params *p,
                                       const fg_attn_tensor *q,
                                       const fg_attn_tensor *k,
                                       const fg_attn_tensor *v,
                                       const fg_attn_tensor *o,
                                       const fg_attn_tensor *dout,
                                       const fg_attn_stats *stats,
                                       const fg_attn_tensor *dq,
                                       const fg_attn_tensor *dk,
                                       const fg_attn_tensor *dv);

/* Debugging/testing: the dropout keep-mask the kernels use, as bytes
 * (1 keep, 0 drop) in a contiguous host buffer [B, H, Nq, Nk]. Only
 * batch, seqlen_q, seqlen_k, heads_q, dropout_p, seed, offset and device
 * are read (the mask ignores causal masking). On CUDA the mask is computed
 * by a GPU kernel with cuRAND, so comparing both devices checks the RNG
 * mapping bit for bit. */
FG_API fg_status fg_attention_dropout_mask(const fg_attn_params *p,
                                           uint8_t *mask);

/* The CPU backend keeps one workspace per calling thread and reuses it, so
 * repeated calls of the same (or smaller) size do not allocate. This frees
 * the calling thread's workspace now; a thread's exit also frees it. */
FG_API void fg_attention_release_workspace(void);

/* Block masks from a dense boolean block map. map is uint8
 * [mb, mh, nqb, nkb] (nonzero = visit) on `device`; storage is int32 on the
 * same device with room for fg_attn_block_mask_storage(mb, mh, nqb, nkb)
 * elements, and holds all four arrays of *out afterwards. On CUDA the
 * build runs on the default stream and is complete on return. */
FG_API int64_t fg_attn_block_mask_storage(int64_t mb, int64_t mh,
                                          int64_t nqb, int64_t nkb);
FG_API fg_status fg_attn_block_mask_build(fg_attn_block_mask *out,
                                          const uint8_t *map, int64_t mb,
                                          int64_t mh, int64_t nqb,
                                          int64_t nkb, int32_t *storage,
                                          fg_device device);

/* Attention dropout's keep threshold T = round((1 - p) * 256), in
 * [0, 256], used above (kept values are scaled by 256 / T). */
FG_API uint32_t fg_attention_dropout_threshold(double p);

/* The elementwise dropout ops' keep threshold T = floor((1 - p) * 2^24)
 * (24-bit draws; fg_dropout in flashgrad/autograd.h). */
FG_API uint32_t fg_dropout_threshold(double p);

/* ---- merging partial results ------------------------------------------------
 * Attention over keys that are the disjoint union of key sets K_1 .. K_n
 * (with their V_i) is the merge of the attentions over each set. With
 * (O_i, m_i, l_i) from fg_attention_forward on (Q, K_i, V_i):
 *
 *     m = max_i m_i,   w_i = l_i exp(m_i - m),   l = sum_i w_i,
 *     O = sum_i (w_i / l) O_i
 *
 * (the union's softmax normaliser is the parts' normalisers brought to a
 * common max; logsumexp = m + log l). This is exact up to rounding. A part
 * in which a row sees no key (m_i = -inf, l_i = 0) contributes nothing; a
 * row that no part sees gets m = -inf, l = 0, O = 0, as from the forward.
 * A part whose row is NaN (l or m NaN, l < 0, or m = +inf with l > 0, as
 * a NaN or +inf score leaves it) makes the merged row's O, m and l NaN,
 * as attention over all the keys would; a NaN in a part's O reaches the
 * merged O through its weight.
 * Used by ring attention (flashgrad/dist.h), split-K decoding and any
 * attention computed in pieces.
 *
 * Backward of a split attention: call fg_attention_backward on each part
 * (Q, K_i, V_i) with the MERGED O and the MERGED stats m, l (and the same
 * dO). The backward recomputes P_ij = exp(S_ij - m_i) / l_i and
 * D_i = rowsum(dO_i * O_i); with the global m, l and O these are the
 * probabilities and D of the whole attention, so part i yields exactly the
 * dK_i, dV_i of its keys and its share of dQ, and dQ = sum_i dQ_i (up to
 * the rounding of that sum). With a part's own m_i, l_i, O_i the result
 * would be the gradient of a different function.
 *
 * Masks: each part's call describes its own (queries, keys) block. For
 * causal attention cut into equal chunks of length c along both the query
 * and the key sequence, block (query chunk a, key chunk b) is full
 * (causal = 0) for b < a, empty (skip it) for b > a, and for b == a it is
 * plain causal with Nq == Nk == c. With dropout each part draws its mask
 * with part-local key indices, so a split run uses a different (equally
 * valid) mask than the unsplit call; the merge itself is exact either way.
 *
 * fg_attention_merge reads batch, seqlen_q, heads_q, head_dim, device,
 * num_threads and cuda_stream of p (nothing else). o_parts[i] and
 * stats_parts[i] are the n_parts >= 1 inputs; o, stats the output, which
 * may be exactly one of the parts (same pointers and strides: in-place
 * accumulation, O_acc = merge(O_acc, O_new)) but may not overlap an input
 * otherwise. Each O has its own dtype and strides ([B, Nq, H, d], d
 * contiguous); each stats' dtype follows its O (fp64 for fp64, fp32
 * otherwise). CPU: fp32/fp64. CUDA: also fp16/bf16 O (e.g. bf16 parts
 * merged into an fp32 accumulator), asynchronous on cuda_stream.
 * Arithmetic is fp64 when any O is fp64, else fp32. The result does not
 * depend on num_threads. */
FG_API fg_status fg_attention_merge(const fg_attn_params *p, int n_parts,
                                    const fg_attn_tensor *o_parts,
                                    const fg_attn_stats *stats_parts,
                                    const fg_attn_tensor *o,
                                    const fg_attn_stats *stats);

FG_END_DECLS

#endif /* FLASHGRAD_ATTENTION_H */
