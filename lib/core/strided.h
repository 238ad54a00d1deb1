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

/* Largest element offset reached, or -1 if it overflows int64 or a stride is
 * negative. Views with a zero extent have offset span 0. */
int64_t fg_view_max_offset(const fg_view *v);

/* 1 if two distinct indices of v address the same element (or overlap). */
int fg_view_self_overlaps(const fg_view *v);

/* 1 if some byte of a is also a byte of b. Exact for views of the same
 * element size and stride pattern (e.g. packed QKV); otherwise decided by
 * comparing byte ranges, which may report overlap for interleaved views. */
int fg_views_overlap(const fg_view *a, const fg_view *b);

#endif /* FG_LIB_STRIDED_H */
