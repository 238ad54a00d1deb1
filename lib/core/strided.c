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
 * every index maps to a distinct offset. (A sufficient condition; the
 * layouts attention and tensors use all satisfy it.) */
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

int fg_view_self_overlaps(const fg_view *v)
{
    int64_t ext[FG_VIEW_MAX_DIMS], str[FG_VIEW_MAX_DIMS];
    int n = sorted_dims(v, ext, str);
    for (int k = 0; k < v->nd; k++)
        if (v->ext[k] == 0)
            return 0;
    return !nested(ext, str, n);
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

int fg_views_overlap(const fg_view *a, const fg_view *b)
{
    int64_t ma = fg_view_max_offset(a), mb = fg_view_max_offset(b);
    for (int k = 0; k < a->nd; k++)
        if (a->ext[k] == 0)
            return 0;
    for (int k = 0; k < b->nd; k++)
        if (b->ext[k] == 0)
            return 0;
    if (ma < 0 || mb < 0)
        return 1;
    uintptr_t alo = (uintptr_t)a->base, ahi = alo + (uintptr_t)(ma + 1) * a->esize;
    uintptr_t blo = (uintptr_t)b->base, bhi = blo + (uintptr_t)(mb + 1) * b->esize;
    if (ahi <= blo || bhi <= alo)
        return 0;
    /* Byte ranges intersect: exact test when both share one stride pattern. */
    if (a->esize != b->esize || a->nd != b->nd)
        return 1;
    for (int k = 0; k < a->nd; k++)
        if (a->ext[k] != b->ext[k] || a->str[k] != b->str[k])
            return 1;
    int64_t ext[FG_VIEW_MAX_DIMS], str[FG_VIEW_MAX_DIMS];
    int n = sorted_dims(a, ext, str);
    if (!nested(ext, str, n))
        return 1;
    intptr_t dbytes = (intptr_t)(blo - alo);
    if (dbytes % (intptr_t)a->esize != 0)
        return 1; /* elements straddle each other */
    return reachable((int64_t)(dbytes / (intptr_t)a->esize), ext, str, n);
}
