/* SPDX-License-Identifier: MIT */
/* flashgrad/tensor.h - n-dimensional tensors, the activation arena, and the
 * counter-based random generator.
 *
 * A tensor is an opaque, reference-counted handle (fg_tensor *) on a
 * reference-counted storage: dtype, device, up to FG_MAX_DIMS dimensions
 * with a shape and element strides, and an element offset into the storage.
 * Views (reshape, permute, slice, ... in autograd.h) are new handles on the
 * same storage; the storage goes away with its last handle.
 *
 * Ownership. Every function that returns a tensor through an `fg_tensor **`
 * gives the caller one reference; fg_tensor_free() drops it. Functions that
 * take tensors never steal references (the autograd graph retains what it
 * needs, so freeing a tensor that a graph still uses is safe).
 *
 * Memory plan. Tensors are allocated either from the heap or from an arena
 * (fg_arena): while an arena is active on the thread (fg_arena_push), every
 * new tensor, view and graph node comes from it, and fg_arena_reset() takes
 * them all back at once. A training step run inside an arena that is reset
 * at the start of each step allocates nothing after the first step: the
 * arena's first reset merges its chunks into one block that the identical
 * allocation sequence of the next steps fits in, and blocks released during
 * a step are reused within it. Parameters and their .grad live on the heap
 * (create them with no arena active). See doc/autograd.md.
 *
 * Devices. Tensors carry a device: FG_DEVICE_CPU, or FG_DEVICE_CUDA when
 * fg_cuda_available() (device memory from the caching allocator of
 * cuda.h); otherwise creating a CUDA tensor fails with the reason. fp16
 * and bf16 tensors are storage for the GPU: on the CPU they can be
 * created, filled and copied, and the CPU ops accept fp32 and fp64.
 *
 * Threads. A tensor (and the graph behind it) must be used by one thread at
 * a time. The active-arena stack is per thread. */
#ifndef FLASHGRAD_TENSOR_H
#define FLASHGRAD_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "flashgrad/export.h"
#include "flashgrad/status.h"
#include "flashgrad/types.h"

FG_BEGIN_DECLS

/* Most dimensions a tensor can have. */
#define FG_MAX_DIMS 8

typedef struct fg_tensor fg_tensor;
typedef struct fg_arena fg_arena;

/* FG_SHAPE(2, 3, 4) expands to `3, (const int64_t[]){2, 3, 4}`, the
 * (nd, shape) argument pair used throughout:
 *     fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, 3), &t); */
#define FG_SHAPE(...)                                                     \
    (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),      \
        (const int64_t[]){__VA_ARGS__}

/* ---- random generator ------------------------------------------------ */

/* A counter-based generator: every draw hands out the pair (seed, offset)
 * and advances offset, so the consumer (dropout, attention dropout, random
 * tensor) derives all its bits from Philox4x32-10 keyed by that pair.
 * Results do not depend on threads or devices. Plain struct: copy it to
 * snapshot the state. */
typedef struct fg_generator {
    uint64_t seed;
    uint64_t offset; /* next offset to hand out */
} fg_generator;

/* Sets seed and offset 0. No-op on NULL. */
FG_API void fg_generator_init(fg_generator *g, uint64_t seed);

/* Returns the next (seed, offset) pair and advances the offset by one. */
FG_API fg_status fg_generator_next(fg_generator *g, uint64_t *seed,
                                   uint64_t *offset);

/* ---- creation -------------------------------------------------------- */

/* Most elements a tensor can have, counting only its non-zero extents
 * (2^59 - 1): every element and byte offset then fits in int64_t, and an
 * empty tensor cannot carry extents whose strides would overflow. */
#define FG_MAX_NUMEL (INT64_MAX / 16)

/* Contiguous row-major tensors. `nd` is in [0, FG_MAX_DIMS] (nd = 0 is a
 * scalar), every extent >= 0, and the product of the non-zero extents is at
 * most FG_MAX_NUMEL (every shape-making function checks this). `empty`
 * leaves the data uninitialised. */
FG_API fg_status fg_tensor_empty(fg_dtype dt, fg_device dev, int nd,
                                 const int64_t *shape, fg_tensor **out);
FG_API fg_status fg_tensor_zeros(fg_dtype dt, fg_device dev, int nd,
                                 const int64_t *shape, fg_tensor **out);
FG_API fg_status fg_tensor_ones(fg_dtype dt, fg_device dev, int nd,
                                const int64_t *shape, fg_tensor **out);
FG_API fg_status fg_tensor_full(fg_dtype dt, fg_device dev, int nd,
                                const int64_t *shape, double value,
                                fg_tensor **out);
/* A 0-dimensional tensor holding `value`. */
FG_API fg_status fg_tensor_scalar(fg_dtype dt, fg_device dev, double value,
                                  fg_tensor **out);
/* Copies numel elements of type `dt` from the host buffer `src`
 * (row-major). */
FG_API fg_status fg_tensor_from_host(fg_dtype dt, fg_device dev, int nd,
                                     const int64_t *shape, const void *src,
                                     fg_tensor **out);
/* Uniform in [lo, hi) / normal(mean, std), drawing one (seed, offset) pair
 * from g. Element e (row-major) uses Philox call e / 2 (two 64-bit words
 * per call; Box-Muller for the normal), so values do not depend on the
 * dtype's storage order or on threads. Values are drawn in fp64 and then
 * rounded to the dtype, which can round one up to hi itself (for [0, 1):
 * about 1 in 10^6 values in fp32, 1 in 4000 in fp16, 1 in 500 in bf16).
 * hi - lo must be finite. */
FG_API fg_status fg_tensor_rand_uniform(fg_generator *g, double lo, double hi,
                                        fg_dtype dt, fg_device dev, int nd,
                                        const int64_t *shape, fg_tensor **out);
FG_API fg_status fg_tensor_rand_normal(fg_generator *g, double mean,
                                       double std, fg_dtype dt, fg_device dev,
                                       int nd, const int64_t *shape,
                                       fg_tensor **out);

/* ---- references -------------------------------------------------------- */

/* Adds a reference and returns t (NULL-safe). */
FG_API fg_tensor *fg_tensor_retain(fg_tensor *t);
/* Drops one reference (NULL-safe). A heap tensor is freed with its last
 * reference; an arena tensor's memory returns to its arena. */
FG_API void fg_tensor_free(fg_tensor *t);

/* ---- accessors ------------------------------------------------------- */
/* Pure queries: they cannot fail, so they return values, not statuses.
 * On a NULL tensor they return 0 / NULL / FG_FP32 / FG_DEVICE_CPU. */

FG_API int fg_tensor_ndim(const fg_tensor *t);
/* Borrowed pointer to nd extents, valid while t lives. */
FG_API const int64_t *fg_tensor_shape(const fg_tensor *t);
/* Element strides (nd of them). */
FG_API const int64_t *fg_tensor_strides(const fg_tensor *t);
/* Extent of dimension dim (negative counts from the end); 0 if out of
 * range. */
FG_API int64_t fg_tensor_size(const fg_tensor *t, int dim);
FG_API int64_t fg_tensor_numel(const fg_tensor *t);
/* numel * element size. */
FG_API size_t fg_tensor_nbytes(const fg_tensor *t);
FG_API fg_dtype fg_tensor_dtype(const fg_tensor *t);
FG_API fg_device fg_tensor_device(const fg_tensor *t);
/* Address of element (0, ..., 0). Writing through it bypasses the version
 * check of saved tensors (see autograd.h): fine for optimizer updates of
 * parameters, not for tensors a graph still needs. */
FG_API void *fg_tensor_data(const fg_tensor *t);
/* 1 if row-major contiguous (always for a tensor with no elements). */
FG_API int fg_tensor_is_contiguous(const fg_tensor *t);
/* 1 if t and u share storage. */
FG_API int fg_tensor_shares_storage(const fg_tensor *t, const fg_tensor *u);

/* ---- data movement ----------------------------------------------------- */

/* Copies all n = numel elements (row-major order, any strides) to/from a
 * host buffer of type host_dtype, converting between fp32/fp64/fp16/bf16.
 * n must equal numel, and a host buffer may not overlap a CPU tensor's own
 * storage. Writing into a leaf that requires grad is refused with
 * FG_ERR_STATE while grad mode is on (use fg_no_grad_begin()).
 * Conversions round to nearest even; fp64 goes to fp16/bf16 through fp32
 * (two roundings, on the CPU and the GPU alike, as PyTorch converts), which
 * differs from one rounding for about 1 value in 2^16 next to a tie (and
 * takes doubles just under bf16's overflow threshold to inf). */
FG_API fg_status fg_tensor_copy_to_host(const fg_tensor *t,
                                        fg_dtype host_dtype, void *dst,
                                        int64_t n);
FG_API fg_status fg_tensor_copy_from_host(fg_tensor *t, fg_dtype host_dtype,
                                          const void *src, int64_t n);
/* dst = src elementwise (same shape, any dtypes and strides; not
 * recorded). The two may not overlap unless they are the same view. */
FG_API fg_status fg_tensor_copy(fg_tensor *dst, const fg_tensor *src);
/* Sets every element to value (not recorded; same rule as copy_from_host). */
FG_API fg_status fg_tensor_fill(fg_tensor *t, double value);
/* The value of a one-element tensor as a double. */
FG_API fg_status fg_tensor_item(const fg_tensor *t, double *value);

/* Debug print: dtype, device, shape, strides, autograd state, then the
 * values (at most 6 per dimension, the middle elided with "..."). `name`
 * may be NULL; f NULL prints to stderr. */
FG_API fg_status fg_tensor_print(const fg_tensor *t, const char *name,
                                 FILE *f);

/* ---- arenas -------------------------------------------------------------- */

/* An arena holds tensors, views, graph nodes and backward temporaries of
 * one step. initial_bytes (0: 1 MiB) is the first chunk; it grows by more
 * chunks as needed. More than SIZE_MAX / 2 bytes: FG_ERR_OUT_OF_MEMORY. */
FG_API fg_status fg_arena_create(size_t initial_bytes, fg_arena **out);
/* Resets (see below), then frees the arena and its chunks. NULL-safe. It
 * must not be on any thread's active stack. */
FG_API void fg_arena_free(fg_arena *a);
/* Takes back every object allocated from the arena: handles the caller
 * still holds become invalid and must not be used (not even freed).
 * References those objects held to heap objects (parameters, their .grad,
 * hooks) are dropped properly. Heap objects made from arena tensors (only
 * possible with fg_arena_push(NULL)) must be freed before the reset, and
 * so must objects of another arena made from this one's tensors (a view,
 * while another arena is pushed, of a tensor allocated here): resetting
 * or freeing this arena first leaves them pointing into it. If the
 * step needed more than one chunk, they are merged into one, so the next
 * identical step allocates nothing. */
FG_API fg_status fg_arena_reset(fg_arena *a);
/* Makes `a` this thread's active arena until the matching pop (a stack of
 * depth 16). Pushing NULL makes new objects go to the heap. With nothing
 * pushed, an op allocates from the arena of its first arena-allocated input
 * (backward: from the arena of the node), else from the heap. */
FG_API fg_status fg_arena_push(fg_arena *a);
/* Pops the top of the stack, which must be `a` (FG_ERR_STATE otherwise). */
FG_API fg_status fg_arena_pop(fg_arena *a);

typedef struct fg_arena_stats {
    size_t capacity;       /* bytes in all chunks */
    size_t used;           /* bytes handed out since the last reset */
    size_t high_water;     /* largest `used` seen at a reset */
    uint64_t chunk_allocs; /* chunks ever allocated (each is a malloc) */
    uint64_t resets;
    size_t live_objects;   /* tensors/nodes/storages not yet released */
} fg_arena_stats;
FG_API fg_status fg_arena_get_stats(const fg_arena *a, fg_arena_stats *st);

/* ---- memory accounting ----------------------------------------------- */

/* Process-wide counts (atomic counters; reading them cannot fail) of host
 * allocations made by the tensor/autograd layer
 * (heap objects, arena chunks, backward scratch). The attention backends
 * and BLAS allocate their own workspace and are not counted. */
typedef struct fg_memory_stats {
    uint64_t host_allocs;
    uint64_t host_frees;
    int64_t host_live_bytes;
} fg_memory_stats;
FG_API void fg_memory_get_stats(fg_memory_stats *st);

FG_END_DECLS

#endif /* FLASHGRAD_TENSOR_H */
