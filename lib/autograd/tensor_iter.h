/* SPDX-License-Identifier: MIT */
/* lib/autograd/tensor_iter.h - strided iteration over up to six operands of a
 * common (broadcast) shape: the loop nest behind elementwise ops, copies and
 * reductions. Dimensions are coalesced where every operand allows it, and
 * the innermost run is handed to a row callback, so contiguous tensors
 * become one long row. */
#ifndef FG_LIB_TENSOR_ITER_H
#define FG_LIB_TENSOR_ITER_H

#include <stddef.h>
#include <stdint.h>

#include "tensor_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FG_ITER_MAX_OPS 6

typedef struct fg_iter {
    int nd;   /* >= 1 after coalescing */
    int nops;
    int64_t numel;
    int64_t shape[FG_MAX_DIMS];
    int64_t stride[FG_ITER_MAX_OPS][FG_MAX_DIMS]; /* bytes */
    char *base[FG_ITER_MAX_OPS];
} fg_iter;

/* p[k] points at the first element of operand k in this row, s[k] is its
 * byte stride along the row, n the row length. */
typedef void (*fg_iter_row_fn)(void *ctx, char **p, const int64_t *s,
                               int64_t n);

/* strides[k] are operand k's element strides for `shape` (0 where it is
 * broadcast); esize[k] its element size. */
void fg_iter_init(fg_iter *it, int nd, const int64_t *shape, int nops,
                  char *const *base, const int64_t *const *strides,
                  const size_t *esize);
/* Rows in row-major order. */
void fg_iter_run(const fg_iter *it, fg_iter_row_fn fn, void *ctx);
/* Rows split over OpenMP threads when the iteration is large. Only for
 * callbacks whose writes never collide across rows (no reduction into a
 * broadcast operand). */
void fg_iter_run_parallel(const fg_iter *it, fg_iter_row_fn fn, void *ctx);

/* Shape of broadcasting a with b; 0 if incompatible. */
int fg_broadcast_shapes(int nd_a, const int64_t *sa, int nd_b,
                        const int64_t *sb, int *nd, int64_t *shape);
/* t's element strides viewed with shape (nd, shape) it broadcasts to
 * (right-aligned; 0 on broadcast dimensions). */
void fg_broadcast_strides(const fg_tensor *t, int nd, const int64_t *shape,
                          int64_t *strides);

/* Calls fn once per position of x's shape with dimension `dim` removed:
 * p[k] is the first element of the row of operand k along dim, s[k] its
 * byte stride along dim, n = extent of dim. Operands share x's shape (and
 * may have different strides). Rows run in parallel when large. */
typedef void (*fg_lane_fn)(void *ctx, char **p, const int64_t *s, int64_t n);
void fg_for_each_lane(int nd, const int64_t *shape, int dim, int nops,
                      char *const *base, const int64_t *const *strides,
                      const size_t *esize, int parallel, fg_lane_fn fn,
                      void *ctx);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_TENSOR_ITER_H */
