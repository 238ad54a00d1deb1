/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_reduce.c - sum and mean over dimensions, and the reduction of a
 * broadcast gradient back to an input's shape. Sums run in double per row,
 * in a fixed order (deterministic, and accurate in fp32). On CUDA the
 * sums are fixed-order two-pass reductions (kernels/ops/ops_ew.cu). */
#include "config.h"

#include <string.h>

#include "ops_internal.h"
#ifdef FG_HAVE_CUDA
#include "cuda_ops_ew.h"
#endif

static void reduce_row(void *c, char **p, const int64_t *s, int64_t n)
{
    fg_dtype dt = *(const fg_dtype *)c;
    char *o = p[0];
    const char *x = p[1];
    if (s[0] == 0) { /* the row collapses into one output element */
        double acc = 0;
        if (dt == FG_FP32)
            for (int64_t i = 0; i < n; i++, x += s[1])
                acc += *(const float *)x;
        else
            for (int64_t i = 0; i < n; i++, x += s[1])
                acc += *(const double *)x;
        if (dt == FG_FP32)
            *(float *)o += (float)acc;
        else
            *(double *)o += acc;
        return;
    }
    if (dt == FG_FP32)
        for (int64_t i = 0; i < n; i++, o += s[0], x += s[1])
            *(float *)o += *(const float *)x;
    else
        for (int64_t i = 0; i < n; i++, o += s[0], x += s[1])
            *(double *)o += *(const double *)x;
}

/* out (zeroed) += x, where out_str are out's strides over x's shape (0 on
 * the dimensions being summed). */
static void reduce_into(fg_tensor *out, const int64_t *out_str,
                        const fg_tensor *x)
{
    fg_iter it;
    char *base[2] = {fg_tensor_base(out), fg_tensor_base(x)};
    const int64_t *str[2] = {out_str, x->stride};
    size_t es = fg_dtype_size(x->dtype), ess[2] = {es, es};
    fg_iter_init(&it, x->nd, x->shape, 2, base, str, ess);
    fg_iter_run(&it, reduce_row, &out->dtype);
}

fg_status fg_sum_to_shape(fg_tensor *g, int nd, const int64_t *shape,
                          fg_tensor **out)
{
    if (fg_same_shape(g->nd, g->shape, nd, shape)) {
        *out = fg_tensor_retain(g);
        return FG_OK;
    }
    if (g->device != FG_DEVICE_CPU && g->device != FG_DEVICE_CUDA)
        return fg_op_unsupported("sum_to_shape", g->device);
    fg_tensor *r;
    FG_TRY(fg_tensor_new(fg_bw_domain(), g->dtype, g->device, nd, shape, &r));
    int64_t rs[FG_MAX_DIMS];
    fg_broadcast_strides(r, g->nd, g->shape, rs);
    fg_status s = FG_OK;
    if (g->device == FG_DEVICE_CPU) {
        s = fg_tensor_zero_storage(r);
        if (s == FG_OK)
            reduce_into(r, rs, g);
    } else {
#ifdef FG_HAVE_CUDA
        s = fg_cuda_sum_reduce(r, rs, g, 1.0); /* writes every element */
#else
        s = fg_op_unsupported("sum_to_shape", g->device);
#endif
    }
    if (s != FG_OK) {
        fg_tensor_free(r);
        return s;
    }
    *out = r;
    return FG_OK;
}

/* ---- sum / mean ---------------------------------------------------------- */

typedef struct sum_extra {
    double k;                       /* 1 (sum) or 1/count (mean) */
    int keepdim;
    unsigned char red[FG_MAX_DIMS]; /* input dims reduced */
} sum_extra;

/* g's strides expanded over the input shape: 0 on reduced dimensions. */
static void expand_strides(const sum_extra *ex, int nd_in,
                           const fg_tensor *g, int64_t *str)
{
    const int keepdim = ex->keepdim;
    for (int d = 0, j = 0; d < nd_in; d++) {
        if (ex->red[d]) {
            str[d] = 0;
            j += keepdim;
        } else {
            str[d] = g->stride[j++];
        }
    }
}

static fg_status sum_backward(fg_node *n, fg_tensor *const *g,
                              fg_tensor **gin)
{
    const sum_extra *ex = fg_node_extra(n);
    fg_meta m;
    fg_node_input_meta(n, 0, &m);
    fg_tensor v = *g[0]; /* a stack view of g broadcast to the input */
    v.nd = m.nd;
    memcpy(v.shape, m.shape, sizeof v.shape);
    expand_strides(ex, m.nd, g[0], v.stride);
    v.numel = m.numel;
    return fg_ew_unary_raw(FG_EW_SCALE, &v, ex->k, fg_bw_domain(), &gin[0]);
}

static const fg_op_def sum_def = {"SumBackward", sum_backward, NULL};
static const fg_op_def mean_def = {"MeanBackward", sum_backward, NULL};

static fg_status reduce_op(const char *fn, int mean, fg_tensor *x,
                           const int *dims, int n_dims, int keepdim,
                           fg_tensor **out)
{
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, x, "x"));
    sum_extra ex;
    memset(&ex, 0, sizeof ex);
    ex.keepdim = keepdim != 0;
    if (n_dims < 0 || (n_dims > 0 && !dims))
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: bad dims list", fn);
    for (int i = 0; i < n_dims; i++) {
        int d = fg_norm_dim(dims[i], x->nd);
        if (d < 0)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: dim %d out of range for %d dimensions", fn,
                            dims[i], x->nd);
        if (ex.red[d])
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: dim %d listed twice", fn, dims[i]);
        ex.red[d] = 1;
    }
    if (n_dims == 0)
        for (int d = 0; d < x->nd; d++)
            ex.red[d] = 1;
    int nd = 0;
    int64_t shape[FG_MAX_DIMS], count = 1;
    for (int d = 0; d < x->nd; d++) {
        if (ex.red[d])
            count *= x->shape[d];
        if (!ex.red[d] || keepdim)
            shape[nd++] = ex.red[d] ? 1 : x->shape[d];
    }
    if (x->device != FG_DEVICE_CPU && x->device != FG_DEVICE_CUDA)
        return fg_op_unsupported(fn, x->device);
    ex.k = mean ? 1.0 / (double)count : 1.0; /* count 0: NaN, as 0/0 */
    fg_tensor *y;
    FG_TRY(fg_tensor_new(fg_alloc_domain(&x, 1), x->dtype, x->device, nd,
                         shape, &y));
    int64_t ystr[FG_MAX_DIMS];
    expand_strides(&ex, x->nd, y, ystr);
    fg_status s = FG_OK;
    if (x->device == FG_DEVICE_CPU) {
        s = fg_tensor_zero_storage(y);
        if (s == FG_OK)
            reduce_into(y, ystr, x);
        if (s == FG_OK && mean) {
            char *p = fg_tensor_base(y); /* host memory, contiguous, ours */
            for (int64_t i = 0; i < y->numel; i++)
                if (y->dtype == FG_FP32)
                    ((float *)p)[i] = (float)(((float *)p)[i] * ex.k);
                else
                    ((double *)p)[i] *= ex.k;
        }
    } else {
#ifdef FG_HAVE_CUDA
        /* the kernel applies the mean's scale: no host access to y */
        s = fg_cuda_sum_reduce(y, ystr, x, ex.k);
#else
        s = fg_op_unsupported(fn, x->device);
#endif
    }
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    FG_TRY(fg_op_finish(mean ? &mean_def : &sum_def, &x, 1, &y, 1, NULL, 0,
                        &ex, sizeof ex));
    *out = y;
    return FG_OK;
}

fg_status fg_sum(fg_tensor *x, const int *dims, int n_dims, int keepdim,
                 fg_tensor **out)
{
    return reduce_op("fg_sum", 0, x, dims, n_dims, keepdim, out);
}

fg_status fg_mean(fg_tensor *x, const int *dims, int n_dims, int keepdim,
                  fg_tensor **out)
{
    return reduce_op("fg_mean", 1, x, dims, n_dims, keepdim, out);
}
