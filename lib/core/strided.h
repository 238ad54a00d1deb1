/* SPDX-License-Identifier: MIT */
/* lib/core/strided.h - memory-overlap analysis of strided views, used to reject
 * outputs that alias inputs or each other before anything is written. */
#ifndef FG_LIB_STRIDED_H
#define FG_LIB_STRIDED_H

#include <stddef.h>
#include <stdint.h>

#define FG_VIEW_MAX_DIMS 8

/* A strided view: element (i0..in-1) lives at base + esize * sum(i_k*str_k).
 * Strides are in elements and non-negative. */
typedef struct fg_view {
    const char *base;
    size_t esize;
    int nd;
    int64_t ext[FG_VIEW_MAX_DIMS];
    int64_t str[FG_VIEW_MAX_DIMS];
} fg_view;

/* Exactness limit of the overlap tests: a view is a set of blocks of
 * consecutive elements (its dense innermost dimensions), one block per index
 * of its other dimensions. When deciding needs more than this many blocks
 * (2^18; they are enumerated and sorted, 2 MiB at most), the tests answer
 * "overlap", conservatively. Nested strides (each stride at least the span
 * of the smaller ones: every row-major layout and its permutations) and two
 * views of one stride pattern (packed QKV) are decided exactly at any
 * size, without enumerating. */
#define FG_OVERLAP_EXACT_LIMIT ((int64_t)1 << 18)

/* Largest element offset reached, or -1 if it overflows int64 or a stride is
 * negative. Views with a zero extent have offset span 0. */
int64_t fg_view_max_offset(const fg_view *v);

/* 1 if two distinct indices of v address the same element. Exact up to
 * FG_OVERLAP_EXACT_LIMIT; also 1 if a stride is negative or the offsets
 * overflow. */
int fg_view_self_overlaps(const fg_view *v);

/* 1 if some byte of a is also a byte of b (views of any element sizes).
 * Exact up to FG_OVERLAP_EXACT_LIMIT blocks of a and b together. */
int fg_views_overlap(const fg_view *a, const fg_view *b);

#endif /* FG_LIB_STRIDED_H */
