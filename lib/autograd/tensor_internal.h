/* SPDX-License-Identifier: MIT */
/* lib/autograd/tensor_internal.h - the tensor object model shared by the tensor,
 * autograd and op files: reference-counted objects that live on the heap or
 * in an arena, storages, tensor handles, and allocation helpers. */
#ifndef FG_LIB_TENSOR_INTERNAL_H
#define FG_LIB_TENSOR_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "flashgrad/autograd.h"
#include "flashgrad/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every block handed out is aligned (and sized) to this. */
#define FG_ALIGN 64

typedef enum fg_obj_kind {
    FG_OBJ_STORAGE = 1,
    FG_OBJ_TENSOR = 2,
    FG_OBJ_NODE = 3
} fg_obj_kind;

/* Common header. Arena objects are on their arena's live list so a reset
 * can drop the references they hold to heap objects. Reference counts are
 * not atomic: one thread per graph (tensor.h). */
typedef struct fg_obj {
    fg_arena *arena;            /* NULL: heap */
    struct fg_obj *prev, *next; /* arena live list */
    size_t block_bytes;         /* size of the allocation */
    int32_t refcount;
    int32_t kind;
} fg_obj;

typedef struct fg_storage {
    fg_obj obj;
    fg_device device;
    size_t nbytes;
    void *data;        /* FG_ALIGN-aligned, right after the header */
    uint64_t version;  /* bumped by in-place writes (saved-tensor check) */
} fg_storage;

struct fg_hook;
struct fg_node;

struct fg_tensor {
    fg_obj obj;
    fg_storage *storage;
    int64_t offset; /* elements */
    int nd;
    int64_t shape[FG_MAX_DIMS];
    int64_t stride[FG_MAX_DIMS];
    int64_t numel;
    fg_dtype dtype;
    fg_device device;
    /* autograd */
    int requires_grad;
    int retains_grad;
    fg_tensor *grad;
    struct fg_node *grad_fn; /* owned reference */
    int output_nr;
    struct fg_hook *hooks;      /* leaf: tensor + post-accumulate hooks */
    struct fg_hook *retain_hook; /* non-leaf retain_grad record on grad_fn */
    /* backward scratch for leaves */
    uint64_t bw_epoch;
    int64_t bw_deps;
    fg_tensor *bw_grad;
    /* A parameter's low-precision copy for autocast (tensor_lowp.c): valid
     * while both storages are at the versions recorded here. */
    fg_tensor *lowp;
    uint64_t lowp_version, lowp_sversion;
    /* A layernorm output with a ones column (fg_dropout_add_layernorm_ones,
     * lib/ops): a [..., C] view whose rows lie C + FG_ONES_PAD elements
     * apart, the FG_ONES_PAD elements after each row holding 1, 0, ..., 0,
     * so a weight-gradient GEMM over the padded rows yields the bias
     * gradient as one more row (ops_linear_master.c). Set only by the op
     * that wrote the padding; views and copies do not inherit it. */
    int ones_col;
};

/* The padding of a ones_col tensor's rows (a multiple of 8 keeps cuBLASLt's
 * sizes and the rows' 16-byte alignment). */
#define FG_ONES_PAD 8

/* ---- memory ------------------------------------------------------------ */

/* Raw block of `bytes` from arena a (NULL: heap), FG_ALIGN-aligned; NULL
 * when out of memory (no message recorded). */
void *fg_mem_alloc(fg_arena *a, size_t bytes);
void fg_mem_free(fg_arena *a, void *p, size_t bytes);
/* The arena new objects go to: the top of the thread's stack when anything
 * is pushed, else the first arena among the given inputs, else NULL. */
fg_arena *fg_alloc_domain(fg_tensor *const *inputs, int n);

/* Zeroed object of `bytes` (>= sizeof(fg_obj)) with refcount 1, or NULL. */
void *fg_obj_new(fg_arena *a, size_t bytes, fg_obj_kind kind);
void fg_obj_retain(fg_obj *o);
void fg_obj_release(fg_obj *o);
/* Called by the arena on reset: drop the references an object holds. */
void fg_obj_drop_refs(fg_obj *o);
/* Arena side (tensor_arena.c). */
void fg_arena_link(fg_arena *a, fg_obj *o);
void fg_arena_unlink(fg_arena *a, fg_obj *o);
int fg_arena_resetting(const fg_arena *a);
/* Global allocation counters (tensor.c). */
void fg_memstat_alloc(size_t bytes);
void fg_memstat_free(size_t bytes);

/* Per-kind destructors (they release what the object references). */
void fg_tensor_drop_refs(fg_tensor *t);
void fg_node_drop_refs(struct fg_node *n);

/* ---- tensors ------------------------------------------------------------- */

/* Validates nd/shape and computes numel; FG_ERR_INVALID_ARGUMENT with a
 * message naming `fn` otherwise. */
fg_status fg_check_shape(int nd, const int64_t *shape, int64_t *numel,
                         const char *fn);
/* New contiguous tensor in domain a (uninitialised data). */
fg_status fg_tensor_new(fg_arena *a, fg_dtype dt, fg_device dev, int nd,
                        const int64_t *shape, fg_tensor **out);
/* Contiguous tensor like t (same shape, dtype, device) in domain a; zeroed
 * if zero is set. */
fg_status fg_tensor_new_like(fg_arena *a, const fg_tensor *t, int zero,
                             fg_tensor **out);
/* New handle on t's storage with the given geometry, in domain a. No
 * autograd state. */
fg_status fg_tensor_view_new(fg_arena *a, const fg_tensor *t, int nd,
                             const int64_t *shape, const int64_t *stride,
                             int64_t offset, fg_tensor **out);
/* Row-major contiguous strides for shape. */
void fg_contiguous_strides(int nd, const int64_t *shape, int64_t *stride);
/* Element address of flat (row-major) index e. */
char *fg_tensor_elem_ptr(const fg_tensor *t, int64_t e);
/* Element size of a valid dtype, inlined for inner loops. */
static inline size_t fg_esize(fg_dtype dt)
{
    return dt == FG_FP64 ? 8 : dt == FG_FP32 ? 4 : 2;
}
/* Base address (element 0). */
static inline char *fg_tensor_base(const fg_tensor *t)
{
    return (char *)t->storage->data + (size_t)t->offset * fg_esize(t->dtype);
}
/* dst = src (src broadcast to dst's shape; any dtypes). Both on one
 * device (CPU or CUDA: the CUDA path is asynchronous on the context
 * stream); no checks beyond that, no version bump. Fails only on CUDA
 * errors. */
fg_status fg_copy_strided(fg_tensor *dst, const fg_tensor *src);
/* Every element to v. No version bump. */
fg_status fg_fill_strided(fg_tensor *t, double v);
/* All bytes of t's storage to zero (0.0 in every dtype): memset on the
 * CPU, cudaMemsetAsync on CUDA. For freshly made contiguous tensors. */
fg_status fg_tensor_zero_storage(fg_tensor *t);
/* Bumps the storage version (in-place write). */
static inline void fg_tensor_bump_version(fg_tensor *t)
{
    t->storage->version++;
}
/* ---- low-precision copies of parameters (tensor_lowp.c) ------------------
 * An fp32/fp64 parameter used under autocast keeps its bf16/fp16 copy
 * between uses, so a step casts it once, not once per use; AdamW writes
 * the copy in its update kernel, so a training step casts nothing. Any
 * write through the library bumps the parameter's version and so makes
 * the copy stale; raw writes (fg_tensor_data) must bump it themselves. */

/* t's copy in dtype dt (a borrowed heap tensor), made or refreshed from t
 * if stale (one cast kernel). t contiguous. A copy some graph still holds
 * a view of is replaced, not overwritten. */
fg_status fg_tensor_lowp(fg_tensor *t, fg_dtype dt, fg_tensor **out);
/* The copy an in-place update of t may rewrite along with t: non-NULL
 * only when it exists and nothing else holds its storage. */
fg_tensor *fg_tensor_lowp_target(const fg_tensor *t);
/* After an in-place update of t: bumps t's version; if the update also
 * rewrote target (fg_tensor_lowp_target's answer, or NULL), that copy is
 * current again, else it is stale. */
void fg_tensor_lowp_updated(fg_tensor *t, fg_tensor *target);

/* 1 if every element of t and u can be a common byte (conservative). */
int fg_tensors_may_overlap(const fg_tensor *t, const fg_tensor *u);

/* Normalises a possibly negative dim for nd dimensions; -1 if invalid. */
static inline int fg_norm_dim(int dim, int nd)
{
    if (dim < 0)
        dim += nd;
    return (dim >= 0 && dim < nd) ? dim : -1;
}

/* fp16 / bf16 conversions (round to nearest even). */
float fg_half_to_float(uint16_t h);
uint16_t fg_float_to_half(float f);
float fg_bf16_to_float(uint16_t h);
uint16_t fg_float_to_bf16(float f);
/* Load/store one element of any dtype as double. */
double fg_load_elem(const void *p, fg_dtype dt);
void fg_store_elem(void *p, fg_dtype dt, double v);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_TENSOR_INTERNAL_H */
