/* SPDX-License-Identifier: MIT */
/* lib/core/strided.c - see strided.h. */
#include <stdlib.h>
#include <string.h>

#include "strided.h"

int64_t fg_view_max_offset(const fg_view *v)
{
    int64_t off = 0;
    for (int k = 0; k < v->nd; k++) {
        if (v->ext[k] <= 0)
            return 0;
        if (v->str[k] < 0)
            return -1;
    }
    for (int k = 0; k < v->nd; k++) {
        int64_t e = v->ext[k] - 1;
        if (e > 0 && v->str[k] > (INT64_MAX - off) / e)
            return -1;
        off += e * v->str[k];
    }
    return off;
}

static int is_empty(const fg_view *v)
{
    for (int k = 0; k < v->nd; k++)
        if (v->ext[k] == 0)
            return 1;
    return 0;
}

/* Dimensions with extent > 1, sorted by stride ascending. */
static int sorted_dims(const fg_view *v, int64_t *ext, int64_t *str)
{
    int n = 0;
    for (int k = 0; k < v->nd; k++) {
        if (v->ext[k] <= 1)
            continue;
        int p = n++;
        while (p > 0 && str[p - 1] > v->str[k]) {
            ext[p] = ext[p - 1];
            str[p] = str[p - 1];
            p--;
        }
        ext[p] = v->ext[k];
        str[p] = v->str[k];
    }
    return n;
}

/* Nested strides: each stride clears the whole span of the smaller dims, so
 * every index maps to a distinct offset. */
static int nested(const int64_t *ext, const int64_t *str, int n)
{
    int64_t span = 1; /* offsets [0, span) reached by the dims below */
    for (int k = 0; k < n; k++) {
        if (str[k] < span)
            return 0;
        if (ext[k] - 1 > (INT64_MAX - 1) / str[k])
            return 0;
        span = str[k] * (ext[k] - 1) + span;
    }
    return 1;
}

/* Leading sorted dims that tile [0, block) densely (stride 1, then each
 * stride the product of the extents below): the view is a set of blocks of
 * `block` consecutive elements, one per index of the remaining dims. */
static int dense_prefix(const int64_t *ext, const int64_t *str, int n,
                        int64_t *block)
{
    int k = 0;
    int64_t b = 1;
    while (k < n && str[k] == b && !__builtin_mul_overflow(b, ext[k], &b))
        k++;
    /* On overflow b is garbage; the view's max offset fits, so it cannot
     * happen for a view that passed fg_view_max_offset. */
    *block = b;
    return k;
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* base + scale * sum_k a_k * str[k] for every 0 <= a_k < ext[k] over dims
 * [lo, hi), into out (count of them), sorted. */
static void enumerate_sorted(const int64_t *ext, const int64_t *str, int lo,
                             int hi, int64_t base, int64_t scale,
                             int64_t *out, int64_t count)
{
    int64_t idx[FG_VIEW_MAX_DIMS] = {0};
    int64_t off = 0;
    for (int64_t e = 0; e < count; e++) {
        out[e] = base + off * scale;
        for (int k = lo; k < hi; k++) { /* odometer */
            off += str[k];
            if (++idx[k] < ext[k])
                break;
            off -= str[k] * ext[k];
            idx[k] = 0;
        }
    }
    qsort(out, (size_t)count, sizeof *out, cmp_i64);
}

/* Product of ext[lo..hi) if it is at most FG_OVERLAP_EXACT_LIMIT, else -1. */
static int64_t count_of(const int64_t *ext, int lo, int hi)
{
    int64_t c = 1;
    for (int k = lo; k < hi; k++)
        if (__builtin_mul_overflow(c, ext[k], &c) ||
            c > FG_OVERLAP_EXACT_LIMIT)
            return -1;
    return c;
}

int fg_view_self_overlaps(const fg_view *v)
{
    if (is_empty(v))
        return 0;
    if (fg_view_max_offset(v) < 0)
        return 1;
    int64_t ext[FG_VIEW_MAX_DIMS], str[FG_VIEW_MAX_DIMS];
    const int n = sorted_dims(v, ext, str);
    if (n > 0 && str[0] == 0)
        return 1; /* a broadcast dimension */
    if (nested(ext, str, n))
        return 0; /* the common case, decided without enumerating */
    int64_t block;
    const int lo = dense_prefix(ext, str, n, &block);
    /* Peel dims from the top whose stride clears everything below them:
     * distinct indices there land in disjoint ranges. */
    int hi = n;
    for (;;) {
        int64_t below = 0; /* max offset of dims [0, hi - 1) */
        for (int k = 0; k < hi - 1; k++)
            below += (ext[k] - 1) * str[k];
        if (hi > lo && str[hi - 1] > below)
            hi--;
        else
            break;
    }
    if (hi <= lo)
        return 0;
    /* Dims [lo, hi) place blocks of [0, block): two distinct indices
     * collide iff their offsets differ by less than `block`. */
    const int64_t count = count_of(ext, lo, hi);
    if (count < 0)
        return 1; /* too large to decide exactly: conservative */
    int64_t *off = malloc(sizeof *off * (size_t)count);
    if (!off)
        return 1;
    enumerate_sorted(ext, str, lo, hi, 0, 1, off, count);
    int overlap = 0;
    for (int64_t e = 1; e < count && !overlap; e++)
        overlap = off[e] - off[e - 1] < block;
    free(off);
    return overlap;
}

/* Can delta be written as sum a_k*str_k with |a_k| < ext_k (k < n)? With
 * nested strides at most two choices of a_k keep the rest reachable. */
static int reachable(int64_t delta, const int64_t *ext, const int64_t *str,
                     int n)
{
    if (n == 0)
        return delta == 0;
    int64_t below = 0; /* max |sum| of the smaller dims */
    for (int k = 0; k < n - 1; k++)
        below += (ext[k] - 1) * str[k];
    int64_t s = str[n - 1], e = ext[n - 1];
    int64_t a = delta / s; /* truncates toward zero */
    for (int64_t c = a - 1; c <= a + 1; c++) {
        if (c <= -e || c >= e)
            continue;
        int64_t r = delta - c * s;
        if (r >= -below && r <= below && reachable(r, ext, str, n - 1))
            return 1;
    }
    return 0;
}

/* The byte ranges [start, start + len) of one view: one per index of its
 * non-dense dims, sorted; NULL when over the limit or out of memory. */
static int64_t *byte_blocks(const fg_view *v, int64_t base, int64_t *count,
                            int64_t *len)
{
    int64_t ext[FG_VIEW_MAX_DIMS], str[FG_VIEW_MAX_DIMS];
    const int n = sorted_dims(v, ext, str);
    int64_t block;
    const int lo = dense_prefix(ext, str, n, &block);
    *count = count_of(ext, lo, n);
    if (*count < 0)
        return NULL;
    int64_t *out = malloc(sizeof *out * (size_t)*count);
    if (out)
        enumerate_sorted(ext, str, lo, n, base, (int64_t)v->esize, out,
                         *count);
    *len = block * (int64_t)v->esize;
    return out;
}

/* Does a range of a (sorted starts, common length) meet one of b? */
static int ranges_meet(const int64_t *a, int64_t na, int64_t la,
                       const int64_t *b, int64_t nb, int64_t lb)
{
    int64_t i = 0, j = 0;
    while (i < na && j < nb) {
        if (a[i] + la <= b[j])
            i++;
        else if (b[j] + lb <= a[i])
            j++;
        else
            return 1;
    }
    return 0;
}

int fg_views_overlap(const fg_view *a, const fg_view *b)
{
    if (is_empty(a) || is_empty(b))
        return 0;
    int64_t ma = fg_view_max_offset(a), mb = fg_view_max_offset(b);
    if (ma < 0 || mb < 0 || ma >= INT64_MAX / 16 || mb >= INT64_MAX / 16)
        return 1;
    uintptr_t alo = (uintptr_t)a->base, ahi = alo + (uintptr_t)(ma + 1) * a->esize;
    uintptr_t blo = (uintptr_t)b->base, bhi = blo + (uintptr_t)(mb + 1) * b->esize;
    if (ahi <= blo || bhi <= alo)
        return 0;
    /* Byte ranges intersect. One stride pattern (packed QKV) with whole
     * elements between the bases: exact and cheap for nested strides. */
    int same = a->esize == b->esize && a->nd == b->nd;
    for (int k = 0; same && k < a->nd; k++)
        same = a->ext[k] == b->ext[k] && a->str[k] == b->str[k];
    int64_t ext[FG_VIEW_MAX_DIMS], str[FG_VIEW_MAX_DIMS];
    int n = sorted_dims(a, ext, str);
    const intptr_t dbytes = (intptr_t)(blo - alo);
    if (same && dbytes % (intptr_t)a->esize == 0 && nested(ext, str, n))
        return reachable((int64_t)(dbytes / (intptr_t)a->esize), ext, str, n);
    /* Otherwise compare the two sets of byte ranges, offsets relative to a
     * (the ranges intersect, so the distance fits). */
    const int64_t shift = (int64_t)dbytes;
    int64_t na, nb, la, lb;
    int64_t *ra = byte_blocks(a, 0, &na, &la);
    int64_t *rb = ra ? byte_blocks(b, shift, &nb, &lb) : NULL;
    int overlap = 1; /* over the limit or out of memory: conservative */
    if (ra && rb && na + nb <= FG_OVERLAP_EXACT_LIMIT)
        overlap = ranges_meet(ra, na, la, rb, nb, lb);
    free(ra);
    free(rb);
    return overlap;
}
