/* SPDX-License-Identifier: MIT */
/* flashgrad/autograd.h - reverse-mode automatic differentiation: the tape,
 * backward, gradient hooks, and the differentiable ops.
 *
 * The tape. Ops run eagerly. When grad mode is on and an input requires
 * grad, the op records a node: edges to the nodes (or leaf tensors) its
 * inputs came from, the tensors its backward needs ("saved tensors"), and
 * its backward function; the output's grad_fn points at the node. Nodes are
 * numbered in recording order, so walking the nodes reachable from a loss
 * in reverse order replays the tape backwards.
 *
 *     fg_tensor_set_requires_grad(w, 1);          // a parameter (leaf)
 *     fg_matmul(x, w, 0, 0, &y);                  // records MatmulBackward
 *     fg_cross_entropy(y, targets, n, -1, &loss);
 *     fg_backward(loss);                          // w's .grad += dloss/dw
 *
 * Gradients accumulate into the .grad of leaves (tensors created by the
 * user with requires_grad set); zero them with fg_zero_grad() between
 * steps. Non-leaf tensors keep a .grad only after fg_tensor_retain_grad().
 * After a backward the graph's saved tensors are freed, unless
 * FG_BACKWARD_RETAIN_GRAPH is passed; a second backward through a freed
 * graph fails with FG_ERR_STATE. Each saved tensor remembers the version
 * of its storage: if it was modified in place (fg_tensor_copy_from_host,
 * fg_tensor_fill, fg_tensor_copy) before the backward, the backward fails
 * with FG_ERR_STATE instead of computing a wrong gradient.
 *
 * Hooks (PyTorch semantics, C callbacks with a `void *user`):
 *   - tensor hooks    hook(grad) -> replacement or none, when the tensor's
 *                     gradient is complete (summed over all its uses);
 *   - node pre-hooks  hook(grad_outputs) -> replacements, before the node;
 *   - node post-hooks hook(grad_inputs, grad_outputs) -> replacements of
 *                     grad_inputs, after the node;
 *   - post-accumulate hooks on leaves, after .grad was updated (an
 *     optimizer step can run there).
 * For each node: tensor hooks of its outputs -> pre-hooks -> retain_grad
 * update -> the node's backward -> post-hooks; for a leaf: tensor hooks ->
 * .grad += grad -> post-accumulate hooks. Within a kind, hooks fire in
 * registration order. Each registration can return a handle (fg_hook *)
 * that removes the hook. Hooks run with grad mode off. Backward is not
 * re-entrant: fg_backward* or fg_grad called from a hook (while a pass
 * runs on that thread) returns FG_ERR_STATE.
 *
 * Errors and ownership are as everywhere in flashgrad (status.h,
 * tensor.h): ops return new references through `fg_tensor **out`, never
 * steal references, validate every argument before writing anything, and
 * leave *out untouched on failure.
 *
 * Devices: ops dispatch on the tensors' device, CPU or CUDA (doc/gpu.md;
 * on CUDA they run on the context stream of cuda.h). All inputs of an op
 * must share device and dtype: fp32 or fp64, and on CUDA also fp16 and
 * bf16 storage (computed in fp32). */
#ifndef FLASHGRAD_AUTOGRAD_H
#define FLASHGRAD_AUTOGRAD_H

#include <stdint.h>

#include "flashgrad/attention.h"
#include "flashgrad/export.h"
#include "flashgrad/status.h"
#include "flashgrad/tensor.h"
#include "flashgrad/types.h"

FG_BEGIN_DECLS

typedef struct fg_node fg_node;
typedef struct fg_hook fg_hook;

/* ---- grad mode (thread-local) ------------------------------------------ */

/* Between begin and end, ops record nothing. Calls nest. begin only
 * increments a per-thread counter, so it cannot fail; end without begin is
 * FG_ERR_STATE. */
FG_API void fg_no_grad_begin(void);
FG_API fg_status fg_no_grad_end(void);
/* 1 if ops record on this thread now. */
FG_API int fg_grad_enabled(void);

/* ---- autograd state of tensors --------------------------------------- */

/* Marks a leaf as requiring grad (a parameter). Only leaves (no grad_fn)
 * of a floating dtype can be changed; FG_ERR_STATE otherwise. */
FG_API fg_status fg_tensor_set_requires_grad(fg_tensor *t, int requires);
FG_API int fg_tensor_requires_grad(const fg_tensor *t);
/* 1 if t has no grad_fn (created by the user, or not requiring grad). */
FG_API int fg_tensor_is_leaf(const fg_tensor *t);
/* Borrowed .grad (NULL until a backward reached t). */
FG_API fg_tensor *fg_tensor_grad(const fg_tensor *t);
/* Borrowed node that produced t (NULL for leaves). */
FG_API fg_node *fg_tensor_grad_fn(const fg_tensor *t);
/* Keep the gradient of a non-leaf in its .grad (accumulated like a leaf's).
 * No-op on leaves; FG_ERR_STATE if t does not require grad. */
FG_API fg_status fg_tensor_retain_grad(fg_tensor *t);
/* Sets .grad to zero in place (no allocation); no-op without .grad. */
FG_API fg_status fg_tensor_zero_grad(fg_tensor *t);
/* fg_tensor_zero_grad on each of n tensors (NULL entries skipped); the
 * contiguous CUDA gradients among them are zeroed by one kernel launch
 * (per 128), not one memset each. Stops at the first failure. */
FG_API fg_status fg_zero_grad(fg_tensor *const *tensors, int n);
/* Drops .grad (the next backward allocates a fresh one). */
FG_API fg_status fg_tensor_clear_grad(fg_tensor *t);

/* ---- backward ---------------------------------------------------------- */

/* Keep the saved tensors after the backward, so it can run again. */
#define FG_BACKWARD_RETAIN_GRAPH 1u

/* Backward from a one-element loss (implicit gradient 1). */
FG_API fg_status fg_backward(fg_tensor *loss);
/* Backward from `out` with gradient `grad` (same shape and dtype). */
FG_API fg_status fg_backward_with(fg_tensor *out, fg_tensor *grad);
/* Both of the above with flags; grad NULL means 1 for a one-element out.
 * Failures found before any gradient is computed (not requiring grad,
 * non-scalar without grad, shape/dtype mismatch, freed graph, saved tensor
 * modified) change nothing. A hook failing or an allocation failing in the
 * middle stops the pass with that status: leaves processed so far keep
 * their updated .grad. */
FG_API fg_status fg_backward_ex(fg_tensor *out, fg_tensor *grad,
                                unsigned flags);

/* Gradients of `out` (seeded with `grad`, or 1 if NULL for a one-element
 * out) with respect to inputs[0..n-1], returned as new references in
 * grads[] (NULL where an input does not influence out), without touching
 * any .grad (like torch.autograd.grad). Inputs may be leaves or non-leaf
 * tensors of the graph. Tensor hooks fire; post-accumulate hooks and
 * retain_grad updates do not. */
FG_API fg_status fg_grad(fg_tensor *out, fg_tensor *grad,
                         fg_tensor *const *inputs, int n, fg_tensor **grads,
                         unsigned flags);

/* Frees the saved tensors of every node reachable from t, as a backward
 * without FG_BACKWARD_RETAIN_GRAPH would (memory is returned now; the
 * nodes themselves go with the last tensor using them). */
FG_API fg_status fg_graph_free(fg_tensor *t);

/* ---- nodes --------------------------------------------------------------- */

/* Name of the node's op, e.g. "MatmulBackward" ("" for NULL). */
FG_API const char *fg_node_name(const fg_node *n);
FG_API int fg_node_num_inputs(const fg_node *n);
FG_API int fg_node_num_outputs(const fg_node *n);
/* Bytes the node holds for its backward: the bytes of the views of its
 * saved tensors (numel * element size each) plus its own copies (e.g. the
 * indices of an embedding). 0 once the graph has been freed. */
FG_API size_t fg_node_saved_bytes(const fg_node *n);
/* 1 once the saved tensors were released (after backward). */
FG_API int fg_node_is_freed(const fg_node *n);

/* ---- hooks --------------------------------------------------------------- */

/* A hook may return a replacement gradient in *replace (a new reference;
 * autograd takes it over) or leave it NULL to keep the gradient. It must
 * not modify the gradients it is given in place. A status other than FG_OK
 * aborts the backward with that status. Gradient pointers may be NULL
 * where no gradient flows (e.g. an unused output of a split). */
typedef fg_status (*fg_tensor_hook_fn)(fg_tensor *grad, fg_tensor **replace,
                                       void *user);
typedef fg_status (*fg_node_pre_hook_fn)(fg_node *node,
                                         fg_tensor *const *grad_outputs,
                                         int n_outputs, fg_tensor **replace,
                                         void *user);
typedef fg_status (*fg_node_post_hook_fn)(fg_node *node,
                                          fg_tensor *const *grad_inputs,
                                          int n_inputs,
                                          fg_tensor *const *grad_outputs,
                                          int n_outputs, fg_tensor **replace,
                                          void *user);
typedef fg_status (*fg_post_accumulate_hook_fn)(fg_tensor *leaf, void *user);

/* Registration. `handle` may be NULL (the hook then lives as long as the
 * tensor or node). A non-NULL handle must eventually be passed to
 * fg_hook_remove() or fg_hook_handle_free(). A hook on a non-leaf tensor is
 * attached to its grad_fn (as in PyTorch), so it fires even after the
 * tensor handle is freed. */
FG_API fg_status fg_tensor_register_hook(fg_tensor *t, fg_tensor_hook_fn fn,
                                         void *user, fg_hook **handle);
/* Leaves requiring grad only (FG_ERR_STATE otherwise). */
FG_API fg_status fg_tensor_register_post_accumulate_hook(
    fg_tensor *t, fg_post_accumulate_hook_fn fn, void *user,
    fg_hook **handle);
FG_API fg_status fg_node_register_pre_hook(fg_node *n, fg_node_pre_hook_fn fn,
                                           void *user, fg_hook **handle);
FG_API fg_status fg_node_register_post_hook(fg_node *n,
                                            fg_node_post_hook_fn fn,
                                            void *user, fg_hook **handle);
/* Unregisters the hook (if its owner still exists) and frees the handle.
 * NULL-safe; like the other releasing functions it cannot fail. */
FG_API void fg_hook_remove(fg_hook *handle);
/* Frees the handle, leaving the hook registered. NULL-safe. */
FG_API void fg_hook_handle_free(fg_hook *handle);

/* ---- elementwise ops ----------------------------------------------------- */
/* Binary ops broadcast like NumPy: shapes are aligned at the last
 * dimension, and each pair of extents must be equal or one of them 1. */

FG_API fg_status fg_add(fg_tensor *a, fg_tensor *b, fg_tensor **out);
FG_API fg_status fg_sub(fg_tensor *a, fg_tensor *b, fg_tensor **out);
FG_API fg_status fg_mul(fg_tensor *a, fg_tensor *b, fg_tensor **out);
FG_API fg_status fg_div(fg_tensor *a, fg_tensor *b, fg_tensor **out);
/* s * x and x + s. */
FG_API fg_status fg_scale(fg_tensor *x, double s, fg_tensor **out);
FG_API fg_status fg_add_scalar(fg_tensor *x, double s, fg_tensor **out);
FG_API fg_status fg_exp(fg_tensor *x, fg_tensor **out);
FG_API fg_status fg_log(fg_tensor *x, fg_tensor **out);
FG_API fg_status fg_tanh(fg_tensor *x, fg_tensor **out);
FG_API fg_status fg_relu(fg_tensor *x, fg_tensor **out);
/* GELU, tanh approximation (GPT-2):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
FG_API fg_status fg_gelu(fg_tensor *x, fg_tensor **out);
/* Converts between fp32 and fp64, and on CUDA also to and from fp16/bf16
 * (round to nearest even; the gradient is converted back). */
FG_API fg_status fg_cast(fg_tensor *x, fg_dtype dt, fg_tensor **out);
/* gelu(x + bias), bias [C] over the last dimension of x [..., C], as one
 * fused pass on the GPU (forward and backward; x + bias is never stored):
 * the first layer of a transformer MLP. The node saves x and bias. */
FG_API fg_status fg_bias_gelu(fg_tensor *x, fg_tensor *bias,
                              fg_tensor **out);

/* ---- matrix products ------------------------------------------------------ */

/* C = op(A) op(B) over the last two dimensions, with op(X) = X^T when the
 * trans flag is set: op(a) is [..., M, K], op(b) [..., K, N], the result
 * [..., M, N]. Both need >= 2 dimensions; leading (batch) dimensions
 * broadcast, so a [B, T, C] x [C, D] product is one GEMM. Uses CBLAS when
 * the build has it (configure --with-blas), else a plain loop. */
FG_API fg_status fg_matmul(fg_tensor *a, fg_tensor *b, int trans_a,
                           int trans_b, fg_tensor **out);

/* ---- reductions ---------------------------------------------------------- */

/* Sum / mean over the n_dims dimensions in dims (negative counts from the
 * end; dims NULL with n_dims 0 reduces everything to a 0-d scalar).
 * keepdim keeps the reduced dimensions with extent 1. */
FG_API fg_status fg_sum(fg_tensor *x, const int *dims, int n_dims,
                        int keepdim, fg_tensor **out);
FG_API fg_status fg_mean(fg_tensor *x, const int *dims, int n_dims,
                         int keepdim, fg_tensor **out);

/* ---- shape ops ------------------------------------------------------------ */
/* reshape, permute, transpose, slice, narrow and split return views that
 * share x's storage (reshape copies only when the strides make a view
 * impossible); concat and contiguous copy. Negative dims count from the
 * end. */

/* One extent may be -1 (inferred). */
FG_API fg_status fg_reshape(fg_tensor *x, int nd, const int64_t *shape,
                            fg_tensor **out);
/* perm is a permutation of 0..ndim-1: out dim i is x dim perm[i]. */
FG_API fg_status fg_permute(fg_tensor *x, const int *perm, fg_tensor **out);
FG_API fg_status fg_transpose(fg_tensor *x, int dim0, int dim1,
                              fg_tensor **out);
/* Python-style x[..., start:end:step, ...] on dimension dim: negative
 * start/end count from the end, both are clamped to [0, extent], step >= 1
 * (an empty result is allowed). */
FG_API fg_status fg_slice(fg_tensor *x, int dim, int64_t start, int64_t end,
                          int64_t step, fg_tensor **out);
/* Elements start .. start+length-1 of dimension dim (must be in range). */
FG_API fg_status fg_narrow(fg_tensor *x, int dim, int64_t start,
                           int64_t length, fg_tensor **out);
/* Joins n >= 1 tensors along dim (other extents equal). */
FG_API fg_status fg_concat(fg_tensor *const *xs, int n, int dim,
                           fg_tensor **out);
/* Splits dim into n consecutive views of sizes[0..n-1] (summing to the
 * extent), recorded as one node with n outputs. outs[] gets n references. */
FG_API fg_status fg_split(fg_tensor *x, int dim, const int64_t *sizes, int n,
                          fg_tensor **outs);
/* x itself (a new reference) if contiguous, else a contiguous copy. */
FG_API fg_status fg_contiguous(fg_tensor *x, fg_tensor **out);
/* A view of x outside the graph (requires_grad 0, no grad_fn). */
FG_API fg_status fg_detach(fg_tensor *x, fg_tensor **out);

/* ---- neural-network ops ----------------------------------------------------- */

/* Softmax / log-softmax along dim. */
FG_API fg_status fg_softmax(fg_tensor *x, int dim, fg_tensor **out);
FG_API fg_status fg_log_softmax(fg_tensor *x, int dim, fg_tensor **out);
/* Layer normalisation over the last dimension C:
 * (x - mean) / sqrt(var + eps) * weight + bias, biased variance;
 * weight and bias are [C] or NULL (1 and 0). eps at least the smallest
 * normal number of the compute type (FLT_MIN; DBL_MIN for fp64 x), so
 * that a constant row's 1 / sqrt(eps) is finite. */
FG_API fg_status fg_layernorm(fg_tensor *x, fg_tensor *weight,
                              fg_tensor *bias, double eps, fg_tensor **out);
/* fg_layernorm with the output written in out_dtype: x's dtype, fp16/bf16
 * for an fp32 x (CUDA only: mixed precision's activations), or fp32 for
 * an fp64 x. The math is fg_layernorm's in x's precision, rounded once
 * into out_dtype, so the result equals fg_cast(fg_layernorm(...),
 * out_dtype) bit for bit without the x-dtype intermediate. Backward: the
 * incoming gradient in out_dtype, dx, dweight and dbias in x's dtype
 * (the math in x's precision, as fg_layernorm's). */
FG_API fg_status fg_layernorm_cast(fg_tensor *x, fg_tensor *weight,
                                   fg_tensor *bias, double eps,
                                   fg_dtype out_dtype, fg_tensor **out);
/* out[i..., :] = weight[indices[i...], :]: weight [V, C], indices a
 * row-major host array of shape (nd, shape), each in [0, V); out is
 * [shape..., C]. The indices are copied. Backward: scatter-add. */
FG_API fg_status fg_embedding(fg_tensor *weight, const int64_t *indices,
                              int nd, const int64_t *shape, fg_tensor **out);
/* Mean over rows of -log_softmax(logits)[row, target[row]]: logits
 * [..., V] has R = numel / V rows, targets is a host array of n_targets = R
 * class indices in [0, V) or equal to ignore_index (those rows are left
 * out of the mean; with every row ignored the loss is 0). Fused: saves the
 * per-row logsumexp, not the softmax. The result is a 0-d tensor. */
FG_API fg_status fg_cross_entropy(fg_tensor *logits, const int64_t *targets,
                                  int64_t n_targets, int64_t ignore_index,
                                  fg_tensor **out);
/* Inverted dropout with probability p in [0, 1): kept elements are scaled
 * by 1/(1-p). Element e (row-major) is kept iff
 * (word (e % 4) of Philox4x32_10({lo32(e/4), hi32(e/4), 0x44524F50,
 * lo32(offset)}, {lo32(seed), hi32(seed) ^ hi32(offset)}) >> 8) <
 * fg_dropout_threshold(p); the backward regenerates the mask, nothing
 * mask-shaped is stored. Dropped elements are multiplied by 0, so a NaN or
 * inf among them gives NaN, as in PyTorch. Draw (seed, offset) from an
 * fg_generator for a fresh mask per call. */
FG_API fg_status fg_dropout(fg_tensor *x, double p, uint64_t seed,
                            uint64_t offset, fg_tensor **out);
/* out = x + dropout(b): a residual branch b joining the stream x, fused
 * into one kernel forward and one backward. The mask is fg_dropout's for
 * (p, seed, offset) and every rounding of fg_add(x, fg_cast(fg_dropout(b,
 * ...), dtype of x)) is kept, so the result equals that chain's bit for
 * bit. x and b have one shape (no broadcasting) and one device; b has x's
 * dtype, or is fp16/bf16 with an fp32 x (autocast's branch, on CUDA). out
 * has x's dtype; p = 0 adds b unmasked. Gradients: dx = g, db = the mask
 * applied to g rounded to b's dtype. */
FG_API fg_status fg_dropout_add(fg_tensor *x, fg_tensor *b, double p,
                                uint64_t seed, uint64_t offset,
                                fg_tensor **out);
/* y = fg_dropout_add(x, b, p, seed, offset) and h =
 * fg_layernorm_cast(y, weight, bias, eps, out_dtype): a residual branch
 * joining the stream and the normalization the next sublayer reads, with
 * both ops' rules and bit for bit their results, forward and backward.
 * On CUDA, for an fp32 x with b and h both fp16 or both bf16 (autocast's
 * residual stream), C % 4 == 0 and C <= 8192, one kernel each way instead
 * of two: y is not read back to be normalized, and the backward makes
 * y's total gradient (the incoming one plus the layernorm's) and b's in
 * one pass. Elsewhere the two ops run in turn (the same results). On
 * failure neither output is set. */
FG_API fg_status fg_dropout_add_layernorm(fg_tensor *x, fg_tensor *b,
                                          double p, uint64_t seed,
                                          uint64_t offset, fg_tensor *weight,
                                          fg_tensor *bias, double eps,
                                          fg_dtype out_dtype, fg_tensor **y,
                                          fg_tensor **h);

/* Options of fg_attention (fill with fg_attention_options_init(), which
 * zeroes them: no mask, no dropout, default scale, tiles and threads). */
typedef struct fg_attention_options {
    int causal;         /* bottom-right aligned causal mask */
    double dropout_p;   /* in [0, 1) */
    uint64_t seed;      /* dropout RNG (see attention.h) */
    uint64_t offset;
    double scale;       /* 0 -> 1/sqrt(head_dim) */
    int block_q;        /* CPU tiles, 0 -> default */
    int block_k;
    int num_threads;    /* CPU threads, 0 -> OpenMP default */
    int deterministic;  /* CUDA backward: dQ without atomics, bitwise
                           reproducible (the CPU is always deterministic) */
    /* Variants, as in fg_attn_params (attention.h); the init function sets
     * both windows to -1 (unbounded). The slopes and the block mask's
     * arrays are read again by the backward: keep them alive (and
     * unchanged) until it has run; the fg_attn_block_mask struct itself is
     * copied. */
    int causal_align;
    int64_t window_left, window_right;
    double softcap;
    const float *alibi_slopes; /* fp32 on q's device, [H] or [B, H] */
    int64_t alibi_stride_b;    /* 0 for [H], H for [B, H] */
    const fg_attn_block_mask *block_mask;
    /* Packed batches and key padding (attention.h), as HOST int32 arrays
     * that the op copies to q's device (they need not outlive the call;
     * the node keeps its copy for the backward). With cu_seqlens_q/k
     * ([n_seq + 1] each), q is [1, total_q, H, d] and k, v
     * [1, total_k, Hk, d], holding n_seq sequences back to back; O is
     * like q and the saved statistics [1, H, total_q]; rows past the last
     * offsets are 0 in O and in the gradients. seqused_k ([n_seq]
     * packed, [B] dense) masks the keys of sequence b at or past
     * seqused_k[b]. NULL = off. The op validates them from its host
     * copies, so on CUDA neither its forward nor its backward waits for
     * the stream to check them (fg_attention_forward() would). */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int64_t n_seq;
    const int32_t *seqused_k;
    /* Additive score bias (attention.h), NULL = none: a tensor on q's
     * device, fp32 or q's dtype, of shape [B, H, Nq, Nk] or any shape that
     * broadcasts to it numpy-style (trailing dimensions aligned; each
     * dimension 1 or the full size, e.g. [Nq, Nk], [H, Nq, Nk],
     * [B, 1, 1, Nk]). It is an input of the op: when it requires grad it
     * receives dL/dbias (summed over its broadcast dimensions). */
    fg_tensor *bias;
} fg_attention_options;
FG_API void fg_attention_options_init(fg_attention_options *o);

/* FlashAttention (attention.h) as a recorded op. q is [B, Nq, H, d], k and
 * v are [B, Nk, Hk, d] (H a multiple of Hk); they may be strided views, e.g.
 * the split of a fused QKV projection, and are passed to the kernels without
 * copies when their last dimension is contiguous. The result O is a
 * contiguous [B, Nq, H, d]. The node saves only Q, K, V, O, the row
 * statistics m and l ([B, H, Nq] each, fp32 for fp32 and fp64 for fp64)
 * and the dropout seed/offset: nothing of size Nq x Nk. With cu_seqlens
 * the maximum lengths are taken from the offsets; on CUDA the call
 * copies the offsets to the device and validates its host copies
 * (attention.h's cu_seqlens_q_host): no synchronisation. */
FG_API fg_status fg_attention(fg_tensor *q, fg_tensor *k, fg_tensor *v,
                              const fg_attention_options *opt,
                              fg_tensor **out);

/* fg_attention on a fused projection: qkv is [B, N, 3 * heads * d], its
 * last dimension the columns of Q, then K, then V (what a Linear of
 * width 3 C writes; [B, N, 3, heads, d] in memory), and the result O a
 * contiguous [B, N, heads * d]. The op takes strided views of qkv as
 * fg_attention's q, k and v (no copy when qkv's last dimension is
 * contiguous, else one copy of qkv) and computes the same O bit for bit;
 * its backward (one node, "AttentionQKVPackedBackward") writes dQ, dK and
 * dV into the three column ranges of one gradient shaped like qkv, where
 * fg_split + fg_attention would make three and copy them into one. Every
 * option of fg_attention applies (heads are equal: no GQA); with
 * cu_seqlens, qkv is [1, total, 3 * heads * d]. */
FG_API fg_status fg_attention_qkvpacked(fg_tensor *qkv, int64_t heads,
                                        const fg_attention_options *opt,
                                        fg_tensor **out);

FG_END_DECLS

#endif /* FLASHGRAD_AUTOGRAD_H */
