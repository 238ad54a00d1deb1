/* SPDX-License-Identifier: MIT */
/* lib/autograd/tensor_create.c - public creation functions, the random generator,
 * host copies, fill, item and printing. */
#include <math.h>
#include <string.h>

#include "config.h"

#include "autograd_internal.h"
#include "cuda_backend.h"
#include "lib/core/error.h"
#include "lib/core/philox.h"
#include "tensor_internal.h"
#include "tensor_iter.h"

/* ---- raw host <-> storage copies -------------------------------------- */

static fg_status raw_from_host(void *dst, fg_device dev, const void *src,
                               size_t bytes)
{
#ifdef FG_HAVE_CUDA
    if (dev == FG_DEVICE_CUDA)
        return fg_cuda_memcpy_h2d(dst, src, bytes);
#endif
    (void)dev;
    if (bytes)
        memcpy(dst, src, bytes);
    return FG_OK;
}

static fg_status raw_to_host(void *dst, fg_device dev, const void *src,
                             size_t bytes)
{
#ifdef FG_HAVE_CUDA
    if (dev == FG_DEVICE_CUDA)
        return fg_cuda_memcpy_d2h(dst, src, bytes);
#endif
    (void)dev;
    if (bytes)
        memcpy(dst, src, bytes);
    return FG_OK;
}

/* ---- creation -------------------------------------------------------- */

static fg_status create(const char *fn, fg_dtype dt, fg_device dev, int nd,
                        const int64_t *shape, fg_tensor **out)
{
    if (!out)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    FG_TRY(fg_check_shape(nd, shape, NULL, fn));
    return fg_tensor_new(fg_alloc_domain(NULL, 0), dt, dev, nd, shape, out);
}

fg_status fg_tensor_empty(fg_dtype dt, fg_device dev, int nd,
                          const int64_t *shape, fg_tensor **out)
{
    return create("fg_tensor_empty", dt, dev, nd, shape, out);
}

fg_status fg_tensor_zeros(fg_dtype dt, fg_device dev, int nd,
                          const int64_t *shape, fg_tensor **out)
{
    fg_tensor *t;
    if (!out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "out is NULL");
    FG_TRY(create("fg_tensor_zeros", dt, dev, nd, shape, &t));
    fg_status s = fg_tensor_zero_storage(t); /* 0.0 is all-zero bits */
    if (s != FG_OK) {
        fg_tensor_free(t);
        return s;
    }
    *out = t;
    return FG_OK;
}

fg_status fg_tensor_full(fg_dtype dt, fg_device dev, int nd,
                         const int64_t *shape, double value, fg_tensor **out)
{
    fg_tensor *t;
    if (!out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "out is NULL");
    FG_TRY(create("fg_tensor_full", dt, dev, nd, shape, &t));
    fg_status s = fg_fill_strided(t, value);
    if (s != FG_OK) {
        fg_tensor_free(t);
        return s;
    }
    *out = t;
    return FG_OK;
}

fg_status fg_tensor_ones(fg_dtype dt, fg_device dev, int nd,
                         const int64_t *shape, fg_tensor **out)
{
    return fg_tensor_full(dt, dev, nd, shape, 1.0, out);
}

fg_status fg_tensor_scalar(fg_dtype dt, fg_device dev, double value,
                           fg_tensor **out)
{
    return fg_tensor_full(dt, dev, 0, NULL, value, out);
}

fg_status fg_tensor_from_host(fg_dtype dt, fg_device dev, int nd,
                              const int64_t *shape, const void *src,
                              fg_tensor **out)
{
    fg_tensor *t;
    if (!src || !out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "src or out is NULL");
    FG_TRY(create("fg_tensor_from_host", dt, dev, nd, shape, &t));
    fg_status s = raw_from_host(t->storage->data, dev, src,
                                t->storage->nbytes);
    if (s != FG_OK) {
        fg_tensor_free(t);
        return s;
    }
    *out = t;
    return FG_OK;
}

/* ---- generator --------------------------------------------------------- */

void fg_generator_init(fg_generator *g, uint64_t seed)
{
    if (g) {
        g->seed = seed;
        g->offset = 0;
    }
}

fg_status fg_generator_next(fg_generator *g, uint64_t *seed, uint64_t *offset)
{
    if (!g || !seed || !offset)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    *seed = g->seed;
    *offset = g->offset++;
    return FG_OK;
}

/* Stream tag in counter word z, so random tensors and dropout masks drawn
 * with the same (seed, offset) differ. */
#define RAND_TAG 0x52414E44u /* "RAND" */

typedef struct rand_ctx {
    uint64_t seed, offset;
    double a, b; /* uniform: lo, hi-lo; normal: mean, std */
    int normal;
    fg_dtype dt;
} rand_ctx;

static fg_u32x4 rand_block(const rand_ctx *rc, uint64_t call)
{
    fg_u32x4 c = {(uint32_t)call, (uint32_t)(call >> 32), RAND_TAG,
                  (uint32_t)rc->offset};
    fg_u32x2 k = {(uint32_t)rc->seed,
                  (uint32_t)(rc->seed >> 32) ^ (uint32_t)(rc->offset >> 32)};
    return fg_philox4x32_10(c, k);
}

/* [0, 1) with 53 random bits. */
static double u01(uint32_t hi, uint32_t lo)
{
    uint64_t v = ((uint64_t)hi << 32) | lo;
    return (double)(v >> 11) * (1.0 / 9007199254740992.0);
}

static fg_status fill_random(rand_ctx *rc, const char *fn, fg_dtype dt,
                             fg_device dev, int nd, const int64_t *shape,
                             fg_tensor **out)
{
    fg_tensor *t;
    if (!out)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    /* Drawn on the host (same values on every device): into the result on
     * the CPU, into a host staging tensor that is uploaded otherwise. */
    if (dev == FG_DEVICE_CPU) {
        FG_TRY(create(fn, dt, dev, nd, shape, &t));
    } else {
        FG_TRY(fg_check_shape(nd, shape, NULL, fn));
        FG_TRY(fg_tensor_new(NULL, dt, FG_DEVICE_CPU, nd, shape, &t));
    }
    const int64_t n = t->numel;
    char *base = t->storage->data;
    const size_t es = fg_dtype_size(dt);
#pragma omp parallel for if (n > 65536)
    for (int64_t c = 0; c < (n + 1) / 2; c++) {
        fg_u32x4 r = rand_block(rc, (uint64_t)c);
        double v0, v1;
        if (rc->normal) {
            double u1 = 1.0 - u01(r.x, r.y), u2 = u01(r.z, r.w);
            double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
            v0 = rc->a + rc->b * rad * cos(th);
            v1 = rc->a + rc->b * rad * sin(th);
        } else {
            v0 = rc->a + rc->b * u01(r.x, r.y);
            v1 = rc->a + rc->b * u01(r.z, r.w);
        }
        fg_store_elem(base + (size_t)(2 * c) * es, dt, v0);
        if (2 * c + 1 < n)
            fg_store_elem(base + (size_t)(2 * c + 1) * es, dt, v1);
    }
    if (dev == FG_DEVICE_CPU) {
        *out = t;
        return FG_OK;
    }
    fg_tensor *d = NULL;
    fg_status s = create(fn, dt, dev, nd, shape, &d);
    if (s == FG_OK)
        s = raw_from_host(d->storage->data, dev, base, t->storage->nbytes);
    fg_tensor_free(t);
    if (s != FG_OK) {
        fg_tensor_free(d);
        return s;
    }
    *out = d;
    return FG_OK;
}

fg_status fg_tensor_rand_uniform(fg_generator *g, double lo, double hi,
                                 fg_dtype dt, fg_device dev, int nd,
                                 const int64_t *shape, fg_tensor **out)
{
    if (!g)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "generator is NULL");
    if (!isfinite(lo) || !isfinite(hi) || !(hi >= lo) || !isfinite(hi - lo))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "need finite lo <= hi with a finite hi - lo, got "
                       "[%g, %g)",
                       lo, hi);
    rand_ctx rc = {g->seed, g->offset, lo, hi - lo, 0, dt};
    FG_TRY(fill_random(&rc, "fg_tensor_rand_uniform", dt, dev, nd, shape,
                       out));
    g->offset++;
    return FG_OK;
}

fg_status fg_tensor_rand_normal(fg_generator *g, double mean, double std,
                                fg_dtype dt, fg_device dev, int nd,
                                const int64_t *shape, fg_tensor **out)
{
    if (!g)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "generator is NULL");
    if (!isfinite(mean) || !isfinite(std) || std < 0)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "need finite mean and std >= 0, got %g, %g", mean,
                       std);
    rand_ctx rc = {g->seed, g->offset, mean, std, 1, dt};
    FG_TRY(fill_random(&rc, "fg_tensor_rand_normal", dt, dev, nd, shape,
                       out));
    g->offset++;
    return FG_OK;
}

/* ---- host copies, fill, item -------------------------------------------- */

/* In-place writes: refused on leaves requiring grad while recording (they
 * would silently change what the graph differentiates). */
static fg_status check_writable(const fg_tensor *t, const char *fn)
{
    if (t->requires_grad && !t->grad_fn && fg_grad_enabled())
        return fg_error(FG_ERR_STATE,
                        "%s: in-place write to a leaf that requires grad; "
                        "wrap it in fg_no_grad_begin()/fg_no_grad_end()",
                        fn);
    return FG_OK;
}

/* A host buffer described as a contiguous tensor (no allocation). */
static void host_view(fg_tensor *h, fg_storage *s, const fg_tensor *like,
                      fg_dtype dt, const void *p)
{
    memset(h, 0, sizeof *h);
    memset(s, 0, sizeof *s);
    s->data = (void *)p;
    s->device = FG_DEVICE_CPU;
    s->nbytes = (size_t)like->numel * fg_dtype_size(dt);
    h->storage = s;
    h->nd = like->nd;
    memcpy(h->shape, like->shape, sizeof h->shape);
    fg_contiguous_strides(h->nd, h->shape, h->stride);
    h->numel = like->numel;
    h->dtype = dt;
    h->device = FG_DEVICE_CPU;
}

static fg_status check_host(const fg_tensor *t, fg_dtype dt, const void *p,
                            int64_t n, const char *fn)
{
    if (!t || !p)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    if (fg_dtype_size(dt) == 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn,
                        (int)dt);
    if (n != t->numel)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: buffer has %lld elements, tensor %lld", fn,
                        (long long)n, (long long)t->numel);
    /* A host buffer inside the tensor's own storage would be read while it
     * is written (a transposed view copied onto its data came out wrong):
     * refused, as fg_tensor_copy refuses overlapping views. */
    if (t->device == FG_DEVICE_CPU && n > 0) {
        const uintptr_t lo = (uintptr_t)p,
                        hi = lo + (uintptr_t)n * fg_dtype_size(dt),
                        slo = (uintptr_t)t->storage->data,
                        shi = slo + t->storage->nbytes;
        if (lo < shi && slo < hi)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: the host buffer overlaps the tensor's own "
                            "storage",
                            fn);
    }
    return FG_OK;
}

/* dst = src for any pair of devices (src broadcast to dst's shape, any
 * dtypes and strides). Across devices the data crosses once, contiguous,
 * in src's dtype; conversion and striding happen on the destination. */
static fg_status copy_any(fg_tensor *dst, const fg_tensor *src)
{
    if (dst->device == src->device)
        return fg_copy_strided(dst, src);
    /* src may be a stack view of a host buffer: never retain or free it */
    const fg_tensor *sc = src;
    fg_tensor *own = NULL, *dc = NULL;
    fg_status s = FG_OK;
    /* contiguous staging copy on src's device, then one on dst's */
    if (!fg_tensor_is_contiguous(src)) {
        s = fg_tensor_new(NULL, src->dtype, src->device, src->nd, src->shape,
                          &own);
        if (s == FG_OK)
            s = fg_copy_strided(own, src);
        sc = own;
    }
    if (s == FG_OK)
        s = fg_tensor_new(NULL, src->dtype, dst->device, src->nd, src->shape,
                          &dc);
    if (s == FG_OK) {
        size_t bytes = (size_t)src->numel * fg_dtype_size(src->dtype);
        s = src->device == FG_DEVICE_CPU
                ? raw_from_host(fg_tensor_base(dc), dst->device,
                                fg_tensor_base(sc), bytes)
                : raw_to_host(fg_tensor_base(dc), src->device,
                              fg_tensor_base(sc), bytes);
    }
    if (s == FG_OK)
        s = fg_copy_strided(dst, dc);
    fg_tensor_free(own);
    fg_tensor_free(dc);
    return s;
}

fg_status fg_tensor_copy_to_host(const fg_tensor *t, fg_dtype host_dtype,
                                 void *dst, int64_t n)
{
    FG_TRY(check_host(t, host_dtype, dst, n, "fg_tensor_copy_to_host"));
    if (t->device != FG_DEVICE_CPU && host_dtype == t->dtype &&
        fg_tensor_is_contiguous(t))
        return raw_to_host(dst, t->device, fg_tensor_base(t),
                           (size_t)n * fg_dtype_size(host_dtype));
    fg_tensor h;
    fg_storage s;
    host_view(&h, &s, t, host_dtype, dst);
    return copy_any(&h, t);
}

fg_status fg_tensor_copy_from_host(fg_tensor *t, fg_dtype host_dtype,
                                   const void *src, int64_t n)
{
    static const char fn[] = "fg_tensor_copy_from_host";
    FG_TRY(check_host(t, host_dtype, src, n, fn));
    FG_TRY(check_writable(t, fn));
    fg_tensor h;
    fg_storage s;
    host_view(&h, &s, t, host_dtype, src);
    if (t->device != FG_DEVICE_CPU && host_dtype == t->dtype &&
        fg_tensor_is_contiguous(t))
        FG_TRY(raw_from_host(fg_tensor_base(t), t->device, src,
                             (size_t)n * fg_dtype_size(host_dtype)));
    else
        FG_TRY(copy_any(t, &h));
    fg_tensor_bump_version(t);
    return FG_OK;
}

fg_status fg_tensor_copy(fg_tensor *dst, const fg_tensor *src)
{
    static const char fn[] = "fg_tensor_copy";
    if (!dst || !src)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    if (!fg_same_shape(dst->nd, dst->shape, src->nd, src->shape))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "shapes differ");
    FG_TRY(check_writable(dst, fn));
    int same_view = dst->storage == src->storage &&
                    dst->offset == src->offset && dst->dtype == src->dtype &&
                    !memcmp(dst->stride, src->stride,
                            sizeof(int64_t) * (size_t)dst->nd);
    if (!same_view && fg_tensors_may_overlap(dst, src))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "dst and src overlap in memory");
    FG_TRY(copy_any(dst, src));
    fg_tensor_bump_version(dst);
    return FG_OK;
}

fg_status fg_tensor_to(const fg_tensor *t, fg_device dev, fg_tensor **out)
{
    if (!t || !out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    fg_tensor *y;
    FG_TRY(create("fg_tensor_to", t->dtype, dev, t->nd, t->shape, &y));
    fg_status s = copy_any(y, t);
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    *out = y;
    return FG_OK;
}

fg_status fg_tensor_fill(fg_tensor *t, double value)
{
    if (!t)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor is NULL");
    FG_TRY(check_writable(t, "fg_tensor_fill"));
    FG_TRY(fg_fill_strided(t, value));
    fg_tensor_bump_version(t);
    return FG_OK;
}

fg_status fg_tensor_item(const fg_tensor *t, double *value)
{
    if (!t || !value)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    if (t->numel != 1)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "tensor has %lld elements, not 1",
                       (long long)t->numel);
    unsigned char buf[8];
    FG_TRY(raw_to_host(buf, t->device, fg_tensor_base(t),
                       fg_dtype_size(t->dtype)));
    *value = fg_load_elem(buf, t->dtype);
    return FG_OK;
}

/* ---- printing ---------------------------------------------------------- */

#define PRINT_EDGE 3 /* elements shown at each end of a long dimension */

static int print_rec(FILE *f, const fg_tensor *t, int d, const char *p,
                     int indent)
{
    size_t es = fg_dtype_size(t->dtype);
    int64_t n = t->shape[d];
    if (fputc('[', f) == EOF)
        return -1;
    for (int64_t i = 0; i < n; i++) {
        if (n > 2 * PRINT_EDGE && i == PRINT_EDGE) {
            fprintf(f, d == t->nd - 1 ? "..., " : "...,\n%*s", indent + 1,
                    "");
            i = n - PRINT_EDGE;
        }
        const char *q = p + (size_t)(i * t->stride[d]) * es;
        if (d == t->nd - 1) {
            if (fprintf(f, "%.6g", fg_load_elem(q, t->dtype)) < 0)
                return -1;
        } else if (print_rec(f, t, d + 1, q, indent + 1) < 0) {
            return -1;
        }
        if (i + 1 < n)
            fprintf(f, d == t->nd - 1 ? ", " : ",\n%*s", indent + 1, "");
    }
    return fputc(']', f) == EOF ? -1 : 0;
}

fg_status fg_tensor_print(const fg_tensor *t, const char *name, FILE *f)
{
    if (!t)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor is NULL");
    if (!f)
        f = stderr;
    fprintf(f, "%s%stensor %s %s shape [", name ? name : "", name ? ": " : "",
            fg_dtype_name(t->dtype), fg_device_name(t->device));
    for (int i = 0; i < t->nd; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    fprintf(f, "] strides [");
    for (int i = 0; i < t->nd; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)t->stride[i]);
    fprintf(f, "]");
    if (t->requires_grad)
        fprintf(f, " requires_grad");
    if (t->grad_fn)
        fprintf(f, " grad_fn=%s", t->grad_fn->op->name);
    if (t->obj.arena)
        fprintf(f, " (arena)");
    fputc('\n', f);
    int rc = 0;
    fg_tensor *h = NULL;
    if (t->device != FG_DEVICE_CPU) { /* print a host copy */
        fg_status s = fg_tensor_to(t, FG_DEVICE_CPU, &h);
        if (s != FG_OK)
            return s;
        t = h;
    }
    if (t->nd == 0) {
        rc = fprintf(f, "%.6g\n", fg_load_elem(fg_tensor_base(t), t->dtype)) <
             0;
    } else if (t->numel == 0) {
        rc = fprintf(f, "[]\n") < 0;
    } else {
        rc = print_rec(f, t, 0, fg_tensor_base(t), 0) < 0 ||
             fputc('\n', f) == EOF;
    }
    fg_tensor_free(h);
    if (rc || ferror(f))
        return FG_FAIL(FG_ERR_IO, "writing failed");
    return FG_OK;
}
