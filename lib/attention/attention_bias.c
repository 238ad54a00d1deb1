/* SPDX-License-Identifier: MIT */
/* lib/attention/attention_bias.c - validation of the additive score bias
 * (fg_attn_params.bias) and of its gradient (fg_attn_params.dbias): dtype,
 * pointers, strides, extent, the broadcast pattern and aliasing, all before
 * anything is written. */
#include <stdint.h>
#include <string.h>

#include "config.h"

#include "attention_internal.h"
#include "kernels/runtime/device.h"
#include "lib/core/error.h"
#include "lib/core/strided.h"

/* The bias as a strided view over [B, H, Nq, Nk]. Broadcast dimensions
 * (zero stride) get extent 1: the view is then exactly the set of elements
 * the kernels address, so aliasing tests are not confused by them. */
static fg_view bias_view(const fg_attn_bias *t, const fg_attn_problem *pb)
{
    const int64_t ext[4] = {pb->B, pb->H, pb->Nq, pb->Nk};
    const int64_t str[4] = {t->stride_b, t->stride_h, t->stride_q,
                            t->stride_k};
    fg_view v;
    memset(&v, 0, sizeof v);
    v.base = (const char *)t->data;
    v.esize = fg_dtype_size(t->dtype);
    v.nd = 4;
    for (int x = 0; x < 4; x++) {
        v.ext[x] = str[x] == 0 ? 1 : ext[x];
        v.str[x] = str[x];
    }
    return v;
}

/* Checks one of bias/dbias and returns its normalised copy in *out (strides
 * of extent-1 dimensions zeroed, so zero stride == broadcast). */
static fg_status check_one(const fg_attn_bias *t, const char *name,
                           const fg_attn_problem *pb, fg_device dev,
                           fg_attn_bias *out, fg_view *view, const char *fn)
{
    if (t->dtype != FG_FP32 && t->dtype != pb->dtype)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s dtype must be fp32 or the operands' %s, got "
                        "%s",
                        fn, name, fg_dtype_name(pb->dtype),
                        fg_dtype_size(t->dtype) ? fg_dtype_name(t->dtype)
                                                : "an unknown dtype");
    if (!t->data)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s data is NULL", fn,
                        name);
    const size_t es = fg_dtype_size(t->dtype);
    if ((uintptr_t)t->data % es != 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s pointer %p is not aligned to its %zu-byte "
                        "element",
                        fn, name, t->data, es);
    if (t->stride_b < 0 || t->stride_h < 0 || t->stride_q < 0 ||
        t->stride_k < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s has a negative stride (%lld, %lld, %lld, "
                        "%lld)",
                        fn, name, (long long)t->stride_b,
                        (long long)t->stride_h, (long long)t->stride_q,
                        (long long)t->stride_k);
    if (dev == FG_DEVICE_CUDA)
        FG_TRY(fg_cuda_check_pointer(t->data, name));
    *out = *t;
    if (pb->B == 1)
        out->stride_b = 0;
    if (pb->H == 1)
        out->stride_h = 0;
    if (pb->Nq == 1)
        out->stride_q = 0;
    if (pb->Nk == 1)
        out->stride_k = 0;
    *view = bias_view(out, pb);
    if (fg_view_max_offset(view) < 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s strides overflow 64-bit offsets", fn, name);
    return FG_OK;
}

fg_status fg_attn_check_bias(const fg_attn_params *p, fg_attn_problem *pb,
                             const fg_view *views, int n_views, int n_in,
                             int backward, const char *fn)
{
    memset(&pb->bias, 0, sizeof pb->bias);
    memset(&pb->dbias, 0, sizeof pb->dbias);
    const fg_attn_bias *db = backward ? p->dbias : NULL;
    if (!p->bias && !db)
        return FG_OK;
    if (p->cu_seqlens_q || p->cu_seqlens_k || p->seqused_k)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: bias with varlen is not supported", fn);
    if (!p->bias)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: dbias is set but bias is NULL", fn);
    const int n_ops = n_views - 2; /* then stats.m, stats.l */
    fg_view bv;
    FG_TRY(check_one(p->bias, "bias", pb, p->device, &pb->bias, &bv, fn));
    /* An input may alias other inputs, never an output. */
    for (int i = n_in; i < n_views; i++) {
        if (i >= n_ops && backward)
            continue; /* the backward reads the stats */
        if (fg_views_overlap(&bv, &views[i]))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: bias overlaps an output in memory", fn);
    }
    if (!db)
        return FG_OK;
    fg_attn_bias d;
    fg_view dv;
    FG_TRY(check_one(db, "dbias", pb, p->device, &d, &dv, fn));
    const int64_t bs[4] = {pb->bias.stride_b, pb->bias.stride_h,
                           pb->bias.stride_q, pb->bias.stride_k};
    const int64_t ds[4] = {d.stride_b, d.stride_h, d.stride_q, d.stride_k};
    static const char *dims[4] = {"batch", "head", "query", "key"};
    for (int x = 0; x < 4; x++)
        if ((bs[x] == 0) != (ds[x] == 0))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: dbias must broadcast (zero stride) exactly "
                            "where bias does; they differ in the %s dimension",
                            fn, dims[x]);
    if (fg_view_self_overlaps(&dv))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: dbias has strides (%lld, %lld, %lld, %lld) under "
                        "which distinct elements alias",
                        fn, (long long)db->stride_b, (long long)db->stride_h,
                        (long long)db->stride_q, (long long)db->stride_k);
    if (fg_views_overlap(&dv, &bv))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: dbias overlaps bias in memory", fn);
    for (int i = 0; i < n_views; i++)
        if (fg_views_overlap(&dv, &views[i]))
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: dbias overlaps another operand in memory",
                            fn);
    pb->dbias = d;
    return FG_OK;
}
