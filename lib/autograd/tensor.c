/* SPDX-License-Identifier: MIT */
/* lib/autograd/tensor.c - the tensor core: reference-counted objects, storages,
 * handles and views, accessors, strided copy/fill and dtype conversion. */
#include <stdatomic.h>
#include <string.h>

#include "autograd_internal.h"
#include "config.h"
#include "cuda_backend.h"
#include "lib/core/error.h"
#include "tensor_internal.h"
#include "tensor_iter.h"

/* ---- memory accounting ------------------------------------------------- */

static atomic_uint_fast64_t g_allocs, g_frees;
static atomic_int_fast64_t g_live;

void fg_memstat_alloc(size_t bytes)
{
    atomic_fetch_add_explicit(&g_allocs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_live, (int64_t)bytes, memory_order_relaxed);
}

void fg_memstat_free(size_t bytes)
{
    atomic_fetch_add_explicit(&g_frees, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&g_live, (int64_t)bytes, memory_order_relaxed);
}

void fg_memory_get_stats(fg_memory_stats *st)
{
    if (!st)
        return;
    st->host_allocs = atomic_load(&g_allocs);
    st->host_frees = atomic_load(&g_frees);
    st->host_live_bytes = atomic_load(&g_live);
}

static void storage_drop(fg_storage *s);

/* ---- objects ------------------------------------------------------------- */

void *fg_obj_new(fg_arena *a, size_t bytes, fg_obj_kind kind)
{
    fg_obj *o = fg_mem_alloc(a, bytes);
    if (!o)
        return NULL;
    memset(o, 0, bytes);
    o->arena = a;
    o->block_bytes = bytes;
    o->refcount = 1;
    o->kind = kind;
    if (a)
        fg_arena_link(a, o);
    return o;
}

void fg_obj_retain(fg_obj *o)
{
    if (o)
        o->refcount++;
}

void fg_obj_drop_refs(fg_obj *o)
{
    switch (o->kind) {
    case FG_OBJ_TENSOR: fg_tensor_drop_refs((fg_tensor *)o); break;
    case FG_OBJ_NODE: fg_node_drop_refs((fg_node *)o); break;
    case FG_OBJ_STORAGE: storage_drop((fg_storage *)o); break;
    default: break;
    }
}

void fg_obj_release(fg_obj *o)
{
    /* During its arena's reset an object is about to be forgotten anyway. */
    if (!o || fg_arena_resetting(o->arena))
        return;
    if (--o->refcount > 0)
        return;
    fg_obj_drop_refs(o);
    if (o->arena)
        fg_arena_unlink(o->arena, o);
    fg_mem_free(o->arena, o, o->block_bytes);
}

/* ---- storage ------------------------------------------------------------- */

#define STORAGE_HDR \
    ((sizeof(fg_storage) + FG_ALIGN - 1) / FG_ALIGN * FG_ALIGN)

/* The per-device allocation point. A CPU storage is one block, header and
 * data; a CUDA storage is a host header (heap or arena, like any object)
 * pointing at a block of the caching device allocator. */
static fg_status storage_new(fg_arena *a, fg_device dev, size_t nbytes,
                             fg_storage **out)
{
    const int cuda = dev == FG_DEVICE_CUDA;
    if (dev != FG_DEVICE_CPU && !cuda)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "unknown device %d", (int)dev);
#ifndef FG_HAVE_CUDA
    if (cuda)
        return FG_FAIL(FG_ERR_UNSUPPORTED,
                       "cuda tensors: flashgrad was built without CUDA "
                       "(configure --with-cuda)");
#endif
    if (nbytes > SIZE_MAX - STORAGE_HDR - FG_ALIGN)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "tensor of %zu bytes", nbytes);
    void *dev_data = NULL;
#ifdef FG_HAVE_CUDA
    if (cuda && nbytes)
        FG_TRY(fg_cuda_mem_alloc(nbytes, &dev_data));
#endif
    const size_t block = STORAGE_HDR + (cuda ? 0 : nbytes);
    /* Header and data are one block; only the header is zeroed. */
    fg_storage *s = fg_mem_alloc(a, block);
    if (!s) {
#ifdef FG_HAVE_CUDA
        fg_cuda_mem_free(dev_data, nbytes);
#endif
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY,
                       "cannot allocate a tensor of %zu bytes", nbytes);
    }
    memset(s, 0, sizeof *s);
    s->obj.arena = a;
    s->obj.block_bytes = block;
    s->obj.refcount = 1;
    s->obj.kind = FG_OBJ_STORAGE;
    if (a)
        fg_arena_link(a, &s->obj);
    s->device = dev;
    s->nbytes = nbytes;
    s->data = cuda ? dev_data : (char *)s + STORAGE_HDR;
    *out = s;
    return FG_OK;
}

/* A storage references nothing but, on CUDA, its device block. */
static void storage_drop(fg_storage *s)
{
#ifdef FG_HAVE_CUDA
    if (s->device == FG_DEVICE_CUDA && s->data) {
        fg_cuda_mem_free(s->data, s->nbytes);
        s->data = NULL;
    }
#else
    (void)s;
#endif
}

/* ---- tensors ------------------------------------------------------------- */

fg_status fg_check_shape(int nd, const int64_t *shape, int64_t *numel,
                         const char *fn)
{
    if (nd < 0 || nd > FG_MAX_DIMS)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %d dimensions (must be in [0, %d])", fn, nd,
                        FG_MAX_DIMS);
    if (nd > 0 && !shape)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: shape is NULL", fn);
    /* The product skips zero extents: an empty tensor's strides are still
     * products of its other extents, so [0, 2^62, 4] would overflow them. */
    int64_t n = 1, nz = 1;
    for (int i = 0; i < nd; i++) {
        if (shape[i] < 0)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: extent %lld of dimension %d is negative", fn,
                            (long long)shape[i], i);
        if (shape[i] == 0) {
            n = 0;
            continue;
        }
        if (__builtin_mul_overflow(nz, shape[i], &nz) || nz > FG_MAX_NUMEL)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: shape too large (the product of the non-zero "
                            "extents must be at most FG_MAX_NUMEL = 2^59 - 1)",
                            fn);
    }
    if (numel)
        *numel = n ? nz : 0;
    return FG_OK;
}

void fg_contiguous_strides(int nd, const int64_t *shape, int64_t *stride)
{
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}

fg_status fg_tensor_new(fg_arena *a, fg_dtype dt, fg_device dev, int nd,
                        const int64_t *shape, fg_tensor **out)
{
    int64_t numel;
    FG_TRY(fg_check_shape(nd, shape, &numel, "fg_tensor_new"));
    size_t es = fg_dtype_size(dt);
    if (es == 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "unknown dtype %d", (int)dt);
    if (dev != FG_DEVICE_CPU && dev != FG_DEVICE_CUDA)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "unknown device %d",
                       (int)dev);
    fg_storage *s = NULL;
    FG_TRY(storage_new(a, dev, (size_t)numel * es, &s));
    fg_tensor *t = fg_obj_new(a, sizeof *t, FG_OBJ_TENSOR);
    if (!t) {
        fg_obj_release(&s->obj);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "cannot allocate a tensor");
    }
    t->storage = s;
    t->nd = nd;
    for (int i = 0; i < nd; i++)
        t->shape[i] = shape[i];
    fg_contiguous_strides(nd, shape, t->stride);
    t->numel = numel;
    t->dtype = dt;
    t->device = dev;
    *out = t;
    return FG_OK;
}

fg_status fg_tensor_new_like(fg_arena *a, const fg_tensor *t, int zero,
                             fg_tensor **out)
{
    FG_TRY(fg_tensor_new(a, t->dtype, t->device, t->nd, t->shape, out));
    if (zero) {
        fg_status st = fg_tensor_zero_storage(*out);
        if (st != FG_OK) {
            fg_tensor_free(*out);
            *out = NULL;
            return st;
        }
    }
    return FG_OK;
}

fg_status fg_tensor_view_new(fg_arena *a, const fg_tensor *t, int nd,
                             const int64_t *shape, const int64_t *stride,
                             int64_t offset, fg_tensor **out)
{
    fg_tensor *v = fg_obj_new(a, sizeof *v, FG_OBJ_TENSOR);
    if (!v)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "cannot allocate a view");
    v->storage = t->storage;
    fg_obj_retain(&t->storage->obj);
    v->offset = offset;
    v->nd = nd;
    v->numel = 1;
    for (int i = 0; i < nd; i++) {
        v->shape[i] = shape[i];
        v->stride[i] = stride[i];
        v->numel *= shape[i];
    }
    v->dtype = t->dtype;
    v->device = t->device;
    *out = v;
    return FG_OK;
}

void fg_tensor_drop_refs(fg_tensor *t)
{
    if (t->retain_hook) {
        fg_hook_detach(t->retain_hook);
        fg_hook_unref(t->retain_hook);
        t->retain_hook = NULL;
    }
    fg_hooks_detach_all(&t->hooks);
    fg_obj_release(t->grad ? &t->grad->obj : NULL);
    fg_obj_release(t->grad_fn ? &t->grad_fn->obj : NULL);
    fg_obj_release(t->bw_grad ? &t->bw_grad->obj : NULL);
    fg_obj_release(t->lowp ? &t->lowp->obj : NULL);
    fg_obj_release(&t->storage->obj);
    t->grad = t->bw_grad = t->lowp = NULL;
    t->grad_fn = NULL;
}

fg_tensor *fg_tensor_retain(fg_tensor *t)
{
    if (t)
        fg_obj_retain(&t->obj);
    return t;
}

void fg_tensor_free(fg_tensor *t)
{
    if (t)
        fg_obj_release(&t->obj);
}

char *fg_tensor_elem_ptr(const fg_tensor *t, int64_t e)
{
    int64_t off = t->offset;
    for (int d = t->nd - 1; d >= 0; d--) {
        off += (e % t->shape[d]) * t->stride[d];
        e /= t->shape[d];
    }
    return (char *)t->storage->data + (size_t)off * fg_dtype_size(t->dtype);
}

int fg_tensors_may_overlap(const fg_tensor *t, const fg_tensor *u)
{
    if (t->storage != u->storage || t->numel == 0 || u->numel == 0)
        return 0;
    int64_t t_lo = t->offset, t_hi = t->offset, u_lo = u->offset,
            u_hi = u->offset;
    for (int i = 0; i < t->nd; i++)
        t_hi += (t->shape[i] - 1) * t->stride[i];
    for (int i = 0; i < u->nd; i++)
        u_hi += (u->shape[i] - 1) * u->stride[i];
    const int64_t ts = (int64_t)fg_esize(t->dtype),
                  us = (int64_t)fg_esize(u->dtype);
    /* byte ranges [lo * es, (hi + 1) * es) intersect */
    return t_lo * ts < (u_hi + 1) * us && u_lo * us < (t_hi + 1) * ts;
}

/* ---- accessors ----------------------------------------------------------- */

int fg_tensor_ndim(const fg_tensor *t) { return t ? t->nd : 0; }
const int64_t *fg_tensor_shape(const fg_tensor *t)
{
    return t ? t->shape : NULL;
}
const int64_t *fg_tensor_strides(const fg_tensor *t)
{
    return t ? t->stride : NULL;
}
int64_t fg_tensor_size(const fg_tensor *t, int dim)
{
    if (!t)
        return 0;
    int d = fg_norm_dim(dim, t->nd);
    return d < 0 ? 0 : t->shape[d];
}
int64_t fg_tensor_numel(const fg_tensor *t) { return t ? t->numel : 0; }
size_t fg_tensor_nbytes(const fg_tensor *t)
{
    return t ? (size_t)t->numel * fg_dtype_size(t->dtype) : 0;
}
fg_dtype fg_tensor_dtype(const fg_tensor *t) { return t ? t->dtype : FG_FP32; }
fg_device fg_tensor_device(const fg_tensor *t)
{
    return t ? t->device : FG_DEVICE_CPU;
}
void *fg_tensor_data(const fg_tensor *t) { return t ? fg_tensor_base(t) : NULL; }

int fg_tensor_is_contiguous(const fg_tensor *t)
{
    if (!t)
        return 0;
    if (t->numel == 0) /* no element to be out of place (as in PyTorch) */
        return 1;
    int64_t s = 1;
    for (int i = t->nd - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s)
            return 0;
        s *= t->shape[i];
    }
    return 1;
}

int fg_tensor_shares_storage(const fg_tensor *t, const fg_tensor *u)
{
    return t && u && t->storage == u->storage;
}

/* ---- dtype conversion -------------------------------------------------- */

float fg_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f,
             man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) |
                   ((man & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t fg_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal */
        if (ax < 0x33000000u)
            return (uint16_t)sign;
        uint32_t man = (ax & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(ax >> 23); /* 14 .. 24 */
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t q = r >> 13, rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1)))
        q++;
    return (uint16_t)(sign | q);
}

float fg_bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t fg_float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

double fg_load_elem(const void *p, fg_dtype dt)
{
    switch (dt) {
    case FG_FP32: return *(const float *)p;
    case FG_FP64: return *(const double *)p;
    case FG_FP16: return fg_half_to_float(*(const uint16_t *)p);
    case FG_BF16: return fg_bf16_to_float(*(const uint16_t *)p);
    }
    return 0;
}

void fg_store_elem(void *p, fg_dtype dt, double v)
{
    switch (dt) {
    case FG_FP32: *(float *)p = (float)v; break;
    case FG_FP64: *(double *)p = v; break;
    case FG_FP16: *(uint16_t *)p = fg_float_to_half((float)v); break;
    case FG_BF16: *(uint16_t *)p = fg_float_to_bf16((float)v); break;
    }
}

/* ---- strided copy and fill ------------------------------------------- */

typedef struct cast_ctx {
    fg_dtype dst, src;
} cast_ctx;

static void copy_row(void *c, char **p, const int64_t *s, int64_t n)
{
    const cast_ctx *cc = c;
    char *d = p[0], *x = p[1];
    size_t es = fg_dtype_size(cc->dst);
    if (cc->dst == cc->src) {
        if (s[0] == (int64_t)es && s[1] == (int64_t)es) {
            memmove(d, x, (size_t)n * es);
            return;
        }
        for (int64_t i = 0; i < n; i++, d += s[0], x += s[1])
            memcpy(d, x, es);
    } else if (cc->dst == FG_FP64 && cc->src == FG_FP32) {
        for (int64_t i = 0; i < n; i++, d += s[0], x += s[1])
            *(double *)d = *(const float *)x;
    } else if (cc->dst == FG_FP32 && cc->src == FG_FP64) {
        for (int64_t i = 0; i < n; i++, d += s[0], x += s[1])
            *(float *)d = (float)*(const double *)x;
    } else {
        for (int64_t i = 0; i < n; i++, d += s[0], x += s[1])
            fg_store_elem(d, cc->dst, fg_load_elem(x, cc->src));
    }
}

fg_status fg_copy_strided(fg_tensor *dst, const fg_tensor *src)
{
#ifdef FG_HAVE_CUDA
    if (dst->device == FG_DEVICE_CUDA)
        return fg_cuda_copy_strided(dst, src);
#endif
    fg_iter it;
    char *base[2] = {fg_tensor_base(dst), fg_tensor_base(src)};
    int64_t sstr[FG_MAX_DIMS];
    fg_broadcast_strides(src, dst->nd, dst->shape, sstr);
    const int64_t *str[2] = {dst->stride, sstr};
    size_t es[2] = {fg_dtype_size(dst->dtype), fg_dtype_size(src->dtype)};
    fg_iter_init(&it, dst->nd, dst->shape, 2, base, str, es);
    cast_ctx cc = {dst->dtype, src->dtype};
    fg_iter_run_parallel(&it, copy_row, &cc);
    return FG_OK;
}

typedef struct fill_ctx {
    fg_dtype dt;
    double v;
} fill_ctx;

static void fill_row(void *c, char **p, const int64_t *s, int64_t n)
{
    const fill_ctx *fc = c;
    char *d = p[0];
    if (fc->dt == FG_FP32) {
        float v = (float)fc->v;
        for (int64_t i = 0; i < n; i++, d += s[0])
            *(float *)d = v;
    } else if (fc->dt == FG_FP64) {
        for (int64_t i = 0; i < n; i++, d += s[0])
            *(double *)d = fc->v;
    } else {
        for (int64_t i = 0; i < n; i++, d += s[0])
            fg_store_elem(d, fc->dt, fc->v);
    }
}

fg_status fg_fill_strided(fg_tensor *t, double v)
{
#ifdef FG_HAVE_CUDA
    if (t->device == FG_DEVICE_CUDA)
        return fg_cuda_fill_strided(t, v);
#endif
    fg_iter it;
    char *base[1] = {fg_tensor_base(t)};
    const int64_t *str[1] = {t->stride};
    size_t es[1] = {fg_dtype_size(t->dtype)};
    fg_iter_init(&it, t->nd, t->shape, 1, base, str, es);
    fill_ctx fc = {t->dtype, v};
    fg_iter_run_parallel(&it, fill_row, &fc);
    return FG_OK;
}

fg_status fg_tensor_zero_storage(fg_tensor *t)
{
#ifdef FG_HAVE_CUDA
    if (t->device == FG_DEVICE_CUDA)
        return fg_cuda_memset_zero(t->storage->data, t->storage->nbytes);
#endif
    memset(t->storage->data, 0, t->storage->nbytes);
    return FG_OK;
}
