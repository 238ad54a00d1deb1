/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_shape.c - reshape, permute, transpose, slice, narrow, split
 * (views on the input's storage), concat and contiguous (copies), detach. */
#include "config.h"

#include <string.h>

#include "ops_internal.h"

/* ---- raw helpers ----------------------------------------------------------- */

/* PyTorch's computeStride: walk the old dimensions in contiguous chunks
 * and lay the new dimensions over each chunk. */
int fg_view_strides(const fg_tensor *x, int nd, const int64_t *shape,
                    int64_t *stride)
{
    if (x->numel == 0 || x->nd == 0) {
        fg_contiguous_strides(nd, shape, stride);
        return 1;
    }
    int view_d = nd - 1;
    int64_t chunk_base = x->stride[x->nd - 1], tensor_numel = 1,
            view_numel = 1;
    for (int td = x->nd - 1; td >= 0; td--) {
        tensor_numel *= x->shape[td];
        if (td == 0 || (x->shape[td - 1] != 1 &&
                        x->stride[td - 1] != tensor_numel * chunk_base)) {
            while (view_d >= 0 &&
                   (view_numel < tensor_numel || shape[view_d] == 1)) {
                stride[view_d] = view_numel * chunk_base;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel)
                return 0;
            if (td > 0) {
                chunk_base = x->stride[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

fg_status fg_contiguous_raw(fg_tensor *x, fg_arena *dom, fg_tensor **out)
{
    if (fg_tensor_is_contiguous(x)) {
        *out = fg_tensor_retain(x);
        return FG_OK;
    }
    return fg_copy_raw(x, x->dtype, dom, out);
}

fg_status fg_reshape_raw(fg_tensor *x, int nd, const int64_t *shape,
                         fg_arena *dom, fg_tensor **out)
{
    int64_t stride[FG_MAX_DIMS];
    if (fg_view_strides(x, nd, shape, stride))
        return fg_tensor_view_new(dom, x, nd, shape, stride, x->offset, out);
    fg_tensor *c;
    FG_TRY(fg_copy_raw(x, x->dtype, dom, &c));
    fg_contiguous_strides(nd, shape, stride);
    fg_status s = fg_tensor_view_new(dom, c, nd, shape, stride, c->offset, out);
    fg_tensor_free(c);
    return s;
}

/* A stack view of t: narrowed to [start, start + step*len) on dim. With
 * len <= 1 the stride is never used and stride * step may overflow, so it
 * is kept; otherwise step * (len - 1) < extent bounds the product. An
 * empty view keeps the offset: chains of empty slices at start = extent
 * would otherwise add up past int64. */
static fg_tensor slice_view(const fg_tensor *t, int dim, int64_t start,
                            int64_t len, int64_t step)
{
    fg_tensor v = *t;
    if (len > 0)
        v.offset += start * t->stride[dim];
    v.shape[dim] = len;
    if (len > 1)
        v.stride[dim] *= step;
    v.numel = 1;
    for (int i = 0; i < v.nd; i++)
        v.numel *= v.shape[i];
    return v;
}

/* ---- reshape ------------------------------------------------------------- */

static fg_status reshape_backward(fg_node *n, fg_tensor *const *g,
                                  fg_tensor **gin)
{
    fg_meta m;
    fg_node_input_meta(n, 0, &m);
    return fg_reshape_raw(g[0], m.nd, m.shape, fg_bw_domain(), &gin[0]);
}
static const fg_op_def reshape_def = {"ReshapeBackward", reshape_backward, NULL};

fg_status fg_reshape(fg_tensor *x, int nd, const int64_t *shape,
                     fg_tensor **out)
{
    static const char fn[] = "fg_reshape";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    if (nd < 0 || nd > FG_MAX_DIMS || (nd > 0 && !shape))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad shape (nd = %d)", nd);
    int64_t sh[FG_MAX_DIMS], known = 1;
    int infer = -1;
    for (int i = 0; i < nd; i++) {
        sh[i] = shape[i];
        if (shape[i] == -1 && infer < 0) {
            infer = i;
        } else if (shape[i] < 0) {
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "extent %lld at dimension %d", (long long)shape[i],
                           i);
        } else {
            if (shape[i] > 0 && known > INT64_MAX / shape[i])
                return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "shape too large");
            known *= shape[i];
        }
    }
    if (infer >= 0) {
        if (known == 0 || x->numel % known != 0)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "cannot infer dimension %d: %lld elements over %lld",
                           infer, (long long)x->numel, (long long)known);
        sh[infer] = x->numel / known;
        known = x->numel;
    }
    /* An empty x lets zero hide huge extents from the product above. */
    FG_TRY(fg_check_shape(nd, sh, NULL, fn));
    if (known != x->numel) {
        char a[128], b[128];
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "cannot reshape %s (%lld elements) to %s",
                       fg_fmt_shape(a, sizeof a, x->nd, x->shape),
                       (long long)x->numel, fg_fmt_shape(b, sizeof b, nd, sh));
    }
    fg_tensor *y;
    FG_TRY(fg_reshape_raw(x, nd, sh, fg_alloc_domain(&x, 1), &y));
    FG_TRY(fg_op_finish(&reshape_def, &x, 1, &y, 1, NULL, 0, NULL, 0));
    *out = y;
    return FG_OK;
}

/* ---- permute / transpose -------------------------------------------------- */

static void permuted(const fg_tensor *x, const int *perm, int64_t *shape,
                     int64_t *stride)
{
    for (int i = 0; i < x->nd; i++) {
        shape[i] = x->shape[perm[i]];
        stride[i] = x->stride[perm[i]];
    }
}

static fg_status permute_backward(fg_node *n, fg_tensor *const *g,
                                  fg_tensor **gin)
{
    const int *perm = fg_node_extra(n);
    int inv[FG_MAX_DIMS];
    for (int i = 0; i < g[0]->nd; i++)
        inv[perm[i]] = i;
    int64_t shape[FG_MAX_DIMS], stride[FG_MAX_DIMS];
    permuted(g[0], inv, shape, stride);
    return fg_tensor_view_new(fg_bw_domain(), g[0], g[0]->nd, shape, stride,
                              g[0]->offset, &gin[0]);
}
static const fg_op_def permute_def = {"PermuteBackward", permute_backward, NULL};

fg_status fg_permute(fg_tensor *x, const int *perm, fg_tensor **out)
{
    static const char fn[] = "fg_permute";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    if (!perm && x->nd > 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "perm is NULL");
    int p[FG_MAX_DIMS], seen[FG_MAX_DIMS] = {0};
    for (int i = 0; i < x->nd; i++) {
        p[i] = fg_norm_dim(perm[i], x->nd);
        if (p[i] < 0 || seen[p[i]]++)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "perm is not a permutation of 0..%d", x->nd - 1);
    }
    int64_t shape[FG_MAX_DIMS], stride[FG_MAX_DIMS];
    permuted(x, p, shape, stride);
    fg_tensor *y;
    FG_TRY(fg_tensor_view_new(fg_alloc_domain(&x, 1), x, x->nd, shape, stride,
                              x->offset, &y));
    FG_TRY(fg_op_finish(&permute_def, &x, 1, &y, 1, NULL, 0, p,
                        sizeof(int) * FG_MAX_DIMS));
    *out = y;
    return FG_OK;
}

fg_status fg_transpose(fg_tensor *x, int dim0, int dim1, fg_tensor **out)
{
    static const char fn[] = "fg_transpose";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    int a = fg_norm_dim(dim0, x->nd), b = fg_norm_dim(dim1, x->nd);
    if (a < 0 || b < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "dims %d, %d out of range for %d dimensions", dim0,
                       dim1, x->nd);
    int perm[FG_MAX_DIMS];
    for (int i = 0; i < x->nd; i++)
        perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    return fg_permute(x, perm, out);
}

/* ---- slice / narrow -------------------------------------------------------- */

typedef struct slice_extra {
    int dim;
    int64_t start, len, step;
} slice_extra;

static fg_status slice_backward(fg_node *n, fg_tensor *const *g,
                                fg_tensor **gin)
{
    const slice_extra *ex = fg_node_extra(n);
    fg_meta m;
    fg_node_input_meta(n, 0, &m);
    fg_tensor *z;
    FG_TRY(fg_tensor_new(fg_bw_domain(), m.dtype, m.device, m.nd, m.shape,
                         &z));
    fg_status s = fg_tensor_zero_storage(z);
    fg_tensor v = slice_view(z, ex->dim, ex->start, ex->len, ex->step);
    if (s == FG_OK)
        s = fg_copy_strided(&v, g[0]);
    if (s != FG_OK) {
        fg_tensor_free(z);
        return s;
    }
    gin[0] = z;
    return FG_OK;
}
static const fg_op_def slice_def = {"SliceBackward", slice_backward, NULL};

static fg_status slice_impl(fg_tensor *x, int dim, int64_t start,
                            int64_t len, int64_t step, fg_tensor **out)
{
    fg_tensor v = slice_view(x, dim, start, len, step), *y;
    FG_TRY(fg_tensor_view_new(fg_alloc_domain(&x, 1), x, v.nd, v.shape,
                              v.stride, v.offset, &y));
    slice_extra ex = {dim, start, len, step};
    FG_TRY(fg_op_finish(&slice_def, &x, 1, &y, 1, NULL, 0, &ex, sizeof ex));
    *out = y;
    return FG_OK;
}

fg_status fg_slice(fg_tensor *x, int dim, int64_t start, int64_t end,
                   int64_t step, fg_tensor **out)
{
    static const char fn[] = "fg_slice";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    int d = fg_norm_dim(dim, x->nd);
    if (d < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "dim %d out of range for %d dimensions", dim, x->nd);
    if (step < 1)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "step %lld (must be >= 1)",
                       (long long)step);
    int64_t n = x->shape[d];
    if (start < 0)
        start += n;
    if (end < 0)
        end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    /* ceil((end - start) / step) without forming end - start + step - 1,
     * which overflows for a huge step. */
    const int64_t len = end > start ? (end - start - 1) / step + 1 : 0;
    return slice_impl(x, d, start, len, step, out);
}

fg_status fg_narrow(fg_tensor *x, int dim, int64_t start, int64_t length,
                    fg_tensor **out)
{
    static const char fn[] = "fg_narrow";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    int d = fg_norm_dim(dim, x->nd);
    if (d < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "dim %d out of range for %d dimensions", dim, x->nd);
    int64_t n = x->shape[d];
    if (start < 0)
        start += n;
    if (start < 0 || length < 0 || start > n || length > n - start)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "[%lld, %lld + %lld) is not within [0, %lld)",
                       (long long)start, (long long)start, (long long)length,
                       (long long)n);
    return slice_impl(x, d, start, length, 1, out);
}

/* ---- concat / split ------------------------------------------------------- */

/* Extra of concat and split: the dim, then n extents. */
typedef struct parts_extra {
    int dim, n;
    int64_t sizes[]; /* n */
} parts_extra;

static fg_status concat_backward(fg_node *n, fg_tensor *const *g,
                                 fg_tensor **gin)
{
    const parts_extra *ex = fg_node_extra(n);
    int64_t off = 0;
    for (int i = 0; i < ex->n; i++) {
        if (fg_node_needs_grad(n, i)) {
            fg_tensor v = slice_view(g[0], ex->dim, off, ex->sizes[i], 1);
            FG_TRY(fg_tensor_view_new(fg_bw_domain(), g[0], v.nd, v.shape,
                                      v.stride, v.offset, &gin[i]));
        }
        off += ex->sizes[i];
    }
    return FG_OK;
}
static const fg_op_def concat_def = {"ConcatBackward", concat_backward, NULL};

static fg_status split_backward(fg_node *n, fg_tensor *const *g,
                                fg_tensor **gin)
{
    const parts_extra *ex = fg_node_extra(n);
    fg_meta m;
    fg_node_input_meta(n, 0, &m);
    fg_tensor *z;
    FG_TRY(fg_tensor_new(fg_bw_domain(), m.dtype, m.device, m.nd, m.shape,
                         &z));
    int64_t off = 0;
    for (int i = 0; i < ex->n; i++) {
        fg_tensor v = slice_view(z, ex->dim, off, ex->sizes[i], 1);
        fg_status s = g[i] ? fg_copy_strided(&v, g[i])
                           : fg_fill_strided(&v, 0.0); /* no gradient */
        if (s != FG_OK) {
            fg_tensor_free(z);
            return s;
        }
        off += ex->sizes[i];
    }
    gin[0] = z;
    return FG_OK;
}
static const fg_op_def split_def = {"SplitBackward", split_backward, NULL};

/* Most parts of a concat or split (their extents live in the node). */
#define MAX_PARTS 64

fg_status fg_concat(fg_tensor *const *xs, int n, int dim, fg_tensor **out)
{
    static const char fn[] = "fg_concat";
    FG_TRY(fg_op_check_out(fn, out));
    if (!xs || n < 1 || n > MAX_PARTS)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "need 1 to %d tensors, got %d", MAX_PARTS, n);
    for (int i = 0; i < n; i++) {
        FG_TRY(fg_op_check(fn, xs[i], "xs[i]"));
        if (xs[i]->dtype != xs[0]->dtype || xs[i]->device != xs[0]->device ||
            xs[i]->nd != xs[0]->nd)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "tensor %d differs in dtype, device or rank", i);
    }
    const fg_tensor *x0 = xs[0];
    int d = fg_norm_dim(dim, x0->nd);
    if (d < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "dim %d out of range for %d dimensions", dim, x0->nd);
    union {
        parts_extra ex;
        char buf[sizeof(parts_extra) + MAX_PARTS * sizeof(int64_t)];
    } u;
    u.ex.dim = d;
    u.ex.n = n;
    int64_t shape[FG_MAX_DIMS];
    memcpy(shape, x0->shape, sizeof shape);
    shape[d] = 0;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < x0->nd; k++)
            if (k != d && xs[i]->shape[k] != x0->shape[k])
                return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                               "tensor %d has extent %lld at dimension %d, "
                               "tensor 0 has %lld",
                               i, (long long)xs[i]->shape[k], k,
                               (long long)x0->shape[k]);
        u.ex.sizes[i] = xs[i]->shape[d];
        if (__builtin_add_overflow(shape[d], xs[i]->shape[d], &shape[d]))
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "the extents at dimension %d overflow int64", d);
    }
    /* The parts may be empty while the result is not: check its size. */
    FG_TRY(fg_check_shape(x0->nd, shape, NULL, fn));
    fg_tensor *y;
    FG_TRY(fg_tensor_new(fg_alloc_domain(xs, n), x0->dtype, x0->device,
                         x0->nd, shape, &y));
    int64_t off = 0;
    for (int i = 0; i < n; i++) { /* fg_copy_strided dispatches per device */
        fg_tensor v = slice_view(y, d, off, u.ex.sizes[i], 1);
        fg_status s = fg_copy_strided(&v, xs[i]);
        if (s != FG_OK) {
            fg_tensor_free(y);
            return s;
        }
        off += u.ex.sizes[i];
    }
    FG_TRY(fg_op_finish(&concat_def, xs, n, &y, 1, NULL, 0, &u.ex,
                        sizeof(parts_extra) + (size_t)n * sizeof(int64_t)));
    *out = y;
    return FG_OK;
}

fg_status fg_split(fg_tensor *x, int dim, const int64_t *sizes, int n,
                   fg_tensor **outs)
{
    static const char fn[] = "fg_split";
    FG_TRY(fg_op_check_out(fn, outs));
    FG_TRY(fg_op_check(fn, x, "x"));
    if (!sizes || n < 1 || n > MAX_PARTS)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "need 1 to %d sizes, got %d", MAX_PARTS, n);
    int d = fg_norm_dim(dim, x->nd);
    if (d < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "dim %d out of range for %d dimensions", dim, x->nd);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 0 || sizes[i] > x->shape[d] ||
            __builtin_add_overflow(total, sizes[i], &total))
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "size %d is %lld (dimension %d has %lld)", i,
                           (long long)sizes[i], d, (long long)x->shape[d]);
    }
    if (total != x->shape[d])
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "sizes add up to %lld, dimension %d has %lld",
                       (long long)total, d, (long long)x->shape[d]);
    union {
        parts_extra ex;
        char buf[sizeof(parts_extra) + MAX_PARTS * sizeof(int64_t)];
    } u;
    u.ex.dim = d;
    u.ex.n = n;
    fg_tensor *ys[MAX_PARTS];
    fg_arena *dom = fg_alloc_domain(&x, 1);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        fg_tensor v = slice_view(x, d, off, sizes[i], 1);
        fg_status s = fg_tensor_view_new(dom, x, v.nd, v.shape, v.stride,
                                         v.offset, &ys[i]);
        if (s != FG_OK) {
            for (int j = 0; j < i; j++)
                fg_tensor_free(ys[j]);
            return s;
        }
        u.ex.sizes[i] = sizes[i];
        off += sizes[i];
    }
    FG_TRY(fg_op_finish(&split_def, &x, 1, ys, n, NULL, 0, &u.ex,
                        sizeof(parts_extra) + (size_t)n * sizeof(int64_t)));
    for (int i = 0; i < n; i++)
        outs[i] = ys[i];
    return FG_OK;
}

/* ---- contiguous / detach ------------------------------------------------- */

static fg_status contiguous_backward(fg_node *n, fg_tensor *const *g,
                                     fg_tensor **gin)
{
    (void)n;
    gin[0] = fg_tensor_retain(g[0]);
    return FG_OK;
}
static const fg_op_def contiguous_def = {"ContiguousBackward",
                                         contiguous_backward, NULL};

fg_status fg_contiguous(fg_tensor *x, fg_tensor **out)
{
    static const char fn[] = "fg_contiguous";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    if (fg_tensor_is_contiguous(x)) {
        *out = fg_tensor_retain(x);
        return FG_OK;
    }
    fg_tensor *y;
    FG_TRY(fg_copy_raw(x, x->dtype, fg_alloc_domain(&x, 1), &y));
    FG_TRY(fg_op_finish(&contiguous_def, &x, 1, &y, 1, NULL, 0, NULL, 0));
    *out = y;
    return FG_OK;
}

fg_status fg_detach(fg_tensor *x, fg_tensor **out)
{
    if (!x || !out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    return fg_tensor_view_new(fg_alloc_domain(&x, 1), x, x->nd, x->shape,
                              x->stride, x->offset, out);
}
