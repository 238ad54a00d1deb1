/* SPDX-License-Identifier: MIT */
/* kernels/backend/backend.h - the seam between libflashgrad.so and its CUDA
 * backend module, libflashgrad-cuda.so (doc/design.md, section 8.1).
 *
 * The library proper holds no CUDA code, so it loads and runs without any
 * CUDA library installed. Every CUDA entry point the C layers call (the
 * functions of kernels/runtime/device.h, lib/autograd/cuda_backend.h,
 * lib/ops/cuda_ops_*.h, the fg_attn_cuda_* of attention_internal.h and
 * attention_merge.h, the fg_dist_cuda_* of lib/dist/dist_internal.h, the
 * NCCL backend's fg_nccl_* of lib/dist/comm_internal.h, and the public
 * flashgrad/cuda.h and fg_cuda_available) is, in the library, a
 * trampoline of the same name (kernels/backend/loader.c) that loads the
 * module on first use and calls through the table below. The module
 * exports one symbol, fg_cuda_backend_get, which returns that table; the
 * few core functions the kernels call in turn (error reporting, dtype
 * names, ...) reach it as a table of pointers (fg_cuda_core), so the module
 * does not link against libflashgrad.so and works with a static core too.
 *
 * Both tables are generated from the lists below: a new entry point is one
 * line in FG_CUDA_ENTRY_POINTS (plus its declaration in its layer's
 * header), a new core function the kernels need one line in
 * FG_CUDA_CORE_FUNCTIONS (the module's link, made with -z defs, names any
 * that is missing). Changing either list changes the tables' size, which
 * the loader checks; bump FG_CUDA_BACKEND_ABI when an entry's meaning or
 * signature changes.
 *
 * NCCL lives in the module too (kernels/dist/comm_nccl.cu, or its stub in a
 * build without NCCL), so the library reaches NCCL only through this table.
 *
 * In a build with --disable-shared the kernels are linked into the static
 * library directly, and none of this is compiled. */
#ifndef FG_KERNELS_BACKEND_BACKEND_H
#define FG_KERNELS_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "flashgrad/attention.h"
#include "flashgrad/cuda.h"
#include "flashgrad/types.h"
#include "kernels/runtime/device.h"
#include "kernels/runtime/profile.h"
#include "lib/attention/attention_internal.h"
#include "lib/attention/attention_merge.h"
#include "lib/autograd/cuda_backend.h"
#include "lib/autograd/tensor_iter.h"
#include "lib/ops/cuda_ops_blas.h"
#include "lib/ops/cuda_ops_ew.h"
#include "lib/ops/cuda_ops_nn.h"
#include "lib/dist/comm_internal.h"
#include "lib/dist/dist_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FG_CUDA_BACKEND_ABI 6
#define FG_CUDA_BACKEND_NAME "libflashgrad-cuda.so"

/* F(ret, name, params, args, fallback): an entry point returning a value;
 * `fallback` is what its trampoline returns when the module cannot be
 * loaded (fg_cuda_backend_fail records why and returns the status).
 * V(name, params, args): one returning nothing (a no-op without module). */
#define FG_CUDA_ENTRY_POINTS(F, V)                                             \
    /* flashgrad/types.h, flashgrad/cuda.h */                                  \
    F(int, fg_cuda_available, (void), (), (fg_cuda_backend_fail(NULL), 0))      \
    F(fg_status, fg_cuda_set_stream, (void *stream), (stream),                 \
      fg_cuda_backend_fail("fg_cuda_set_stream"))                              \
    F(void *, fg_cuda_get_stream, (void), (), NULL)                            \
    F(fg_status, fg_cuda_synchronize, (void), (),                              \
      fg_cuda_backend_fail("fg_cuda_synchronize"))                             \
    F(fg_status, fg_cuda_set_allow_tf32, (int allow), (allow),                 \
      fg_cuda_backend_fail("fg_cuda_set_allow_tf32"))                          \
    F(fg_status, fg_cuda_set_attention_allow_tf32, (int allow), (allow),       \
      fg_cuda_backend_fail("fg_cuda_set_attention_allow_tf32"))                \
    F(int, fg_cuda_get_attention_allow_tf32, (void), (), 0)                    \
    F(fg_status, fg_cuda_set_gemm_autotune, (int on), (on),                    \
      fg_cuda_backend_fail("fg_cuda_set_gemm_autotune"))                       \
    F(int, fg_cuda_get_gemm_autotune, (void), (), 0)                           \
    F(fg_status, fg_cuda_memory_get_stats, (fg_cuda_memory_stats * st), (st), \
      fg_cuda_backend_fail_stats(st))                                          \
    F(fg_status, fg_cuda_memory_reset_peak, (void), (),                        \
      fg_cuda_backend_fail("fg_cuda_memory_reset_peak"))                       \
    F(fg_status, fg_cuda_empty_cache, (void), (),                              \
      fg_cuda_backend_fail("fg_cuda_empty_cache"))                             \
    /* kernels/runtime/device.h */                                             \
    F(fg_status, fg_cuda_mem_alloc, (size_t bytes, void **out), (bytes, out),  \
      fg_cuda_backend_fail("device memory"))                                   \
    V(fg_cuda_mem_free, (void *p, size_t bytes), (p, bytes))                   \
    F(fg_status, fg_cuda_mem_alloc_persistent, (size_t bytes, void **out),     \
      (bytes, out), fg_cuda_backend_fail("device memory"))                     \
    V(fg_cuda_mem_free_persistent, (void *p), (p))                             \
    F(fg_status, fg_cuda_memcpy_h2d,                                           \
      (void *dst, const void *src, size_t bytes), (dst, src, bytes),           \
      fg_cuda_backend_fail("device copy"))                                     \
    F(fg_status, fg_cuda_memcpy_d2h,                                           \
      (void *dst, const void *src, size_t bytes), (dst, src, bytes),           \
      fg_cuda_backend_fail("device copy"))                                     \
    F(fg_status, fg_cuda_memcpy_d2d,                                           \
      (void *dst, const void *src, size_t bytes), (dst, src, bytes),           \
      fg_cuda_backend_fail("device copy"))                                     \
    F(fg_status, fg_cuda_memset_zero, (void *dst, size_t bytes), (dst, bytes), \
      fg_cuda_backend_fail("device memset"))                                   \
    F(fg_status, fg_cuda_check_pointer, (const void *ptr, const char *what),   \
      (ptr, what), fg_cuda_backend_fail("device pointer check"))               \
    /* kernels/runtime/profile.h */                                            \
    F(fg_status, fg_prof_cuda_record, (int i), (i),                            \
      fg_cuda_backend_fail("fg_profile_begin"))                                \
    F(fg_status, fg_prof_cuda_elapsed, (int a, int b, float *ms), (a, b, ms),  \
      fg_cuda_backend_fail("fg_profile_end"))                                  \
    V(fg_prof_cuda_release, (void), ())                                        \
    /* lib/attention/attention_internal.h */                                   \
    F(fg_status, fg_attn_cuda_forward,                                         \
      (const fg_attn_problem *pb, const fg_attn_tensor *q,                     \
       const fg_attn_tensor *k, const fg_attn_tensor *v,                       \
       const fg_attn_tensor *o, const fg_attn_stats *st),                      \
      (pb, q, k, v, o, st), fg_cuda_backend_fail("fg_attention_forward"))      \
    F(fg_status, fg_attn_cuda_backward,                                        \
      (const fg_attn_problem *pb, const fg_attn_tensor *q,                     \
       const fg_attn_tensor *k, const fg_attn_tensor *v,                       \
       const fg_attn_tensor *o, const fg_attn_tensor *dout,                    \
       const fg_attn_stats *st, const fg_attn_tensor *dq,                      \
       const fg_attn_tensor *dk, const fg_attn_tensor *dv),                    \
      (pb, q, k, v, o, dout, st, dq, dk, dv),                                  \
      fg_cuda_backend_fail("fg_attention_backward"))                           \
    F(fg_status, fg_attn_cuda_dropout_mask,                                    \
      (const fg_attn_problem *pb, uint8_t *mask), (pb, mask),                  \
      fg_cuda_backend_fail("fg_attention_dropout_mask"))                       \
    F(fg_status, fg_attn_cuda_read_ints,                                       \
      (int32_t *host, const int32_t *dev, int64_t n, void *stream),            \
      (host, dev, n, stream), fg_cuda_backend_fail("fg_attention_forward"))    \
    F(fg_status, fg_attn_cuda_block_mask_build,                                \
      (const fg_attn_block_mask *m, const uint8_t *map), (m, map),             \
      fg_cuda_backend_fail("fg_attn_block_mask_build"))                        \
    /* lib/attention/attention_merge.h */                                      \
    F(fg_status, fg_attn_cuda_merge, (const fg_attn_merge_problem *mp), (mp), \
      fg_cuda_backend_fail("fg_attention_merge"))                              \
    /* lib/autograd/cuda_backend.h */                                          \
    F(fg_status, fg_cuda_copy_strided, (fg_tensor * dst, const fg_tensor *src), \
      (dst, src), fg_cuda_backend_fail("fg_tensor_copy"))                      \
    F(fg_status, fg_cuda_fill_strided, (fg_tensor * t, double v), (t, v),       \
      fg_cuda_backend_fail("fg_tensor_fill"))                                  \
    F(fg_status, fg_cuda_accumulate, (fg_tensor * dst, const fg_tensor *src),   \
      (dst, src), fg_cuda_backend_fail("gradient accumulation"))               \
    F(fg_status, fg_cuda_zero_many, (void *const *ptrs, const size_t *bytes, \
      int n), (ptrs, bytes, n), fg_cuda_backend_fail("fg_zero_grad"))         \
    /* lib/ops/cuda_ops_blas.h (the rest is below) */                         \
    F(fg_status, fg_cuda_gemm_lt, (const fg_cuda_lt_gemm *g, int *done),      \
      (g, done), fg_cuda_backend_fail("fg_linear"))                            \
    /* lib/ops/cuda_ops_ew.h */                                                \
    F(fg_status, fg_cuda_ew_binary,                                            \
      (fg_ew_binary op, fg_tensor *y, const fg_tensor *a, const fg_tensor *b), \
      (op, y, a, b), fg_cuda_backend_fail("elementwise op"))                   \
    F(fg_status, fg_cuda_ew_unary,                                             \
      (fg_ew_unary op, fg_tensor *y, const fg_tensor *x, double k),            \
      (op, y, x, k), fg_cuda_backend_fail("elementwise op"))                   \
    F(fg_status, fg_cuda_bias_gelu,                                            \
      (fg_tensor * y, const fg_tensor *x, const fg_tensor *b), (y, x, b),      \
      fg_cuda_backend_fail("fg_bias_gelu"))                                    \
    F(fg_status, fg_cuda_bias_gelu_backward,                                   \
      (fg_tensor * dx, const fg_tensor *g, const fg_tensor *x,                 \
       const fg_tensor *b),                                                    \
      (dx, g, x, b), fg_cuda_backend_fail("fg_bias_gelu"))                     \
    F(fg_status, fg_cuda_sum_reduce,                                           \
      (fg_tensor * out, const int64_t *out_str, const fg_tensor *x,            \
       double scale),                                                          \
      (out, out_str, x, scale), fg_cuda_backend_fail("fg_sum"))                \
    F(fg_status, fg_cuda_col_sums,                                             \
      (fg_tensor * out, const fg_tensor *x, int accumulate),                   \
      (out, x, accumulate), fg_cuda_backend_fail("a bias gradient"))           \
    /* lib/ops/cuda_ops_nn.h */                                                \
    F(fg_status, fg_cuda_softmax_forward,                                      \
      (const fg_tensor *x, fg_tensor *y, int dim, int is_log),                 \
      (x, y, dim, is_log), fg_cuda_backend_fail("fg_softmax"))                 \
    F(fg_status, fg_cuda_softmax_backward,                                     \
      (const fg_tensor *g, const fg_tensor *y, fg_tensor *dx, int dim,         \
       int is_log),                                                            \
      (g, y, dx, dim, is_log), fg_cuda_backend_fail("fg_softmax"))             \
    F(fg_status, fg_cuda_cross_entropy_forward,                                \
      (const fg_tensor *x, const int64_t *targets, int64_t ignore_index,       \
       int64_t count, fg_tensor *lse, fg_tensor *loss),                        \
      (x, targets, ignore_index, count, lse, loss),                            \
      fg_cuda_backend_fail("fg_cross_entropy"))                                \
    F(fg_status, fg_cuda_cross_entropy_backward,                               \
      (const fg_tensor *x, const fg_tensor *lse, const int64_t *targets,       \
       int64_t ignore_index, int64_t count, const fg_tensor *g,                \
       fg_tensor *dx),                                                         \
      (x, lse, targets, ignore_index, count, g, dx),                           \
      fg_cuda_backend_fail("fg_cross_entropy"))                                \
    F(fg_status, fg_cuda_layernorm_forward,                                    \
      (const fg_tensor *x, const fg_tensor *weight, const fg_tensor *bias,     \
       double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd),            \
      (x, weight, bias, eps, y, mean, rstd),                                   \
      fg_cuda_backend_fail("fg_layernorm"))                                    \
    F(fg_status, fg_cuda_layernorm_backward,                                   \
      (const fg_tensor *x, const fg_tensor *weight, const fg_tensor *mean,     \
       const fg_tensor *rstd, const fg_tensor *g, fg_tensor *dx, int acc,      \
       fg_tensor *dw, fg_tensor *db),                                          \
      (x, weight, mean, rstd, g, dx, acc, dw, db),                             \
      fg_cuda_backend_fail("fg_layernorm"))                                    \
    F(fg_status, fg_cuda_embedding_forward,                                    \
      (const fg_tensor *weight, const int64_t *indices, int64_t n,             \
       fg_tensor *y),                                                          \
      (weight, indices, n, y), fg_cuda_backend_fail("fg_embedding"))           \
    F(fg_status, fg_cuda_embedding_backward,                                   \
      (const fg_tensor *g, const int64_t *indices, int64_t n, fg_tensor *dw),  \
      (g, indices, n, dw), fg_cuda_backend_fail("fg_embedding"))               \
    F(fg_status, fg_cuda_dropout,                                              \
      (const fg_tensor *src, fg_tensor *dst, double p, uint64_t seed,          \
       uint64_t offset),                                                       \
      (src, dst, p, seed, offset), fg_cuda_backend_fail("fg_dropout"))         \
    F(fg_status, fg_cuda_dropout_add,                                          \
      (const fg_tensor *x, const fg_tensor *b, fg_tensor *y, double p,         \
       uint64_t seed, uint64_t offset),                                        \
      (x, b, y, p, seed, offset), fg_cuda_backend_fail("fg_dropout_add"))      \
    F(fg_status, fg_cuda_dropout_add_layernorm_forward,                        \
      (const fg_tensor *x, const fg_tensor *b, double p, uint64_t seed,        \
       uint64_t offset, const fg_tensor *weight, const fg_tensor *bias,        \
       double eps, fg_tensor *y, fg_tensor *h, fg_tensor *mean,                \
       fg_tensor *rstd, int *done),                                            \
      (x, b, p, seed, offset, weight, bias, eps, y, h, mean, rstd, done),      \
      fg_cuda_backend_fail("fg_dropout_add_layernorm"))                        \
    F(fg_status, fg_cuda_dropout_add_layernorm_backward,                       \
      (const fg_tensor *y, const fg_tensor *weight, const fg_tensor *mean,     \
       const fg_tensor *rstd, const fg_tensor *gh, fg_tensor *dx, int acc,     \
       fg_tensor *db, double p, uint64_t seed, uint64_t offset,                \
       fg_tensor *dw, fg_tensor *dbias, int *done),                            \
      (y, weight, mean, rstd, gh, dx, acc, db, p, seed, offset, dw, dbias,     \
       done),                                                                  \
      fg_cuda_backend_fail("fg_dropout_add_layernorm"))                        \
    /* lib/ops/cuda_ops_blas.h */                                              \
    F(fg_status, fg_cuda_gemm,                                                 \
      (fg_dtype dt, int64_t M, int64_t N, int64_t K, double alpha,             \
       const void *A, int64_t a_rs, int64_t a_cs, const void *B, int64_t b_rs, \
       int64_t b_cs, double beta, void *C, int64_t c_rs, int64_t c_cs,         \
       int64_t batch, int64_t sA, int64_t sB, int64_t sC),                     \
      (dt, M, N, K, alpha, A, a_rs, a_cs, B, b_rs, b_cs, beta, C, c_rs, c_cs,  \
       batch, sA, sB, sC),                                                     \
      fg_cuda_backend_fail("fg_matmul"))                                       \
    V(fg_cuda_optim_cache_free, (fg_cuda_optim_cache * c), (c))                \
    F(fg_status, fg_cuda_adamw_step,                                           \
      (fg_cuda_optim_cache * *cache, const fg_cuda_adamw_param *ps, int n,     \
       const fg_cuda_adamw_hparams *h),                                        \
      (cache, ps, n, h), fg_cuda_backend_fail("fg_adamw_step"))                \
    F(fg_status, fg_cuda_adamw_step_clip,                                      \
      (fg_cuda_optim_cache * *cache, const fg_cuda_adamw_param *ps, int n,     \
       const fg_cuda_adamw_hparams *h, const fg_cuda_clip *c, double *norm),   \
      (cache, ps, n, h, c, norm),                                              \
      fg_cuda_backend_fail("fg_adamw_step"))                                   \
    F(fg_status, fg_cuda_clip_grad_norm,                                       \
      (const fg_cuda_grad *gs, int n, const fg_cuda_clip *c, double *norm),    \
      (gs, n, c, norm), fg_cuda_backend_fail("fg_clip_grad_norm"))             \
    /* lib/dist/dist_internal.h */                                             \
    F(fg_status, fg_dist_cuda_copy4d,                                          \
      (void *dst, const int64_t dst_str[3], const void *src,                   \
       const int64_t src_str[3], int64_t B, int64_t S, int64_t Hh, int64_t d,  \
       size_t es),                                                             \
      (dst, dst_str, src, src_str, B, S, Hh, d, es),                           \
      fg_cuda_backend_fail("ring attention (strided copy)"))                   \
    F(fg_status, fg_dist_cuda_add,                                             \
      (void *dst, fg_dtype dst_dt, const void *src, fg_dtype src_dt,           \
       int64_t n),                                                             \
      (dst, dst_dt, src, src_dt, n),                                           \
      fg_cuda_backend_fail("ring attention (accumulate)"))                     \
    /* lib/dist/comm_internal.h: the NCCL backend */                           \
    F(fg_status, fg_nccl_unique_id, (unsigned char id[FG_NCCL_ID_BYTES]),      \
      (id), fg_cuda_backend_fail("NCCL unique id"))                            \
    F(fg_status, fg_nccl_comm_create,                                          \
      (const unsigned char id[FG_NCCL_ID_BYTES], int rank, int size,           \
       int device, fg_comm **out),                                             \
      (id, rank, size, device, out),                                           \
      fg_cuda_backend_fail("NCCL communicator"))                               \
    F(fg_status, fg_nccl_comm_create_all,                                      \
      (const int *devices, int n, fg_comm **comms), (devices, n, comms),       \
      fg_cuda_backend_fail("fg_comm_init_nccl_devices"))                       \
    F(fg_status, fg_nccl_device_count, (int *n), (n),                          \
      (*n = 0, fg_cuda_backend_fail("NCCL device count")))                     \
    F(fg_status, fg_nccl_group, (int start), (start),                          \
      fg_cuda_backend_fail(start ? "fg_comm_group_start"                       \
                                 : "fg_comm_group_end"))                       \
    F(void *, fg_nccl_stream, (const fg_comm *c), (c), NULL)

/* F(ret, name, params, args) and V(name, params, args): core functions the
 * kernels call, besides fg_error and fg_error_at (variadic: see
 * fg_cuda_core). */
#define FG_CUDA_CORE_FUNCTIONS(F, V)                                              \
    F(size_t, fg_dtype_size, (fg_dtype dt), (dt))                              \
    F(const char *, fg_dtype_name, (fg_dtype dt), (dt))                        \
    F(const char *, fg_device_name, (fg_device dev), (dev))                    \
    F(int, fg_tensor_is_contiguous, (const fg_tensor *t), (t))                 \
    F(uint32_t, fg_dropout_threshold, (double p), (p))                         \
    F(int, fg_get_deterministic, (void), ())                                   \
    V(fg_broadcast_strides,                                                    \
      (const fg_tensor *t, int nd, const int64_t *shape, int64_t *strides),    \
      (t, nd, shape, strides))                                                 \
    /* the NCCL backend's communicators (lib/dist/comm.c) */                   \
    F(fg_comm *, fg_comm_alloc,                                                \
      (const fg_comm_vtable *vt, fg_comm_backend b, fg_device dev, int rank,   \
       int size),                                                              \
      (vt, b, dev, rank, size))                                                \
    V(fg_comm_free, (fg_comm * c), (c))

#define FG_CUDA_MEMBER_(ret, name, params, ...) ret(*name) params;
#define FG_CUDA_VMEMBER_(name, params, args) void(*name) params;

/* What the module hands the library. `size` and `abi` must match the
 * library's; `version` is the module's PACKAGE_VERSION, for messages. */
typedef struct fg_cuda_backend {
    int abi;
    size_t size;
    const char *version;
    FG_CUDA_ENTRY_POINTS(FG_CUDA_MEMBER_, FG_CUDA_VMEMBER_)
} fg_cuda_backend;

/* What the library hands the module. The module formats fg_error's
 * message itself and passes it on as "%s". */
typedef struct fg_cuda_core {
    int abi;
    size_t size;
    fg_status (*fg_error)(fg_status s, const char *fmt, ...);
    fg_status (*fg_error_at)(fg_status s, const char *func, const char *fmt,
                             ...);
    FG_CUDA_CORE_FUNCTIONS(FG_CUDA_MEMBER_, FG_CUDA_VMEMBER_)
} fg_cuda_core;

/* The module's one exported symbol: its table if `abi` is the one it was
 * built for (else NULL); `core` stays valid while the module is loaded. */
const fg_cuda_backend *fg_cuda_backend_get(int abi, const fg_cuda_core *core);
typedef const fg_cuda_backend *(*fg_cuda_backend_get_fn)(
    int abi, const fg_cuda_core *core);
#define FG_CUDA_BACKEND_GET "fg_cuda_backend_get"

/* Library side (kernels/backend/loader.c): record why the module is not
 * usable, as "WHAT: REASON", and return the status (FG_ERR_UNSUPPORTED
 * when it is not installed or cannot be loaded). NULL `what` records the
 * reason alone. */
fg_status fg_cuda_backend_fail(const char *what);
/* The same for fg_cuda_memory_get_stats, which zeroes *st first. */
fg_status fg_cuda_backend_fail_stats(fg_cuda_memory_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* FG_KERNELS_BACKEND_BACKEND_H */
