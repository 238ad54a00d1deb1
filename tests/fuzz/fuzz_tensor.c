/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_tensor.c - libFuzzer target for tensor creation, views
 * (slice, narrow, reshape, permute, transpose, split, detach), concat and
 * contiguous.
 *
 * The bytes are a program over a pool of six tensors. Each tensor has a
 * shadow: its shape and row-major values, kept by an independent model of
 * tensor.h and autograd.h (extent rules and the FG_MAX_NUMEL limit in
 * 128-bit arithmetic, Python's slice rule, reshape's -1, permutation
 * checks, concat/split sums). Every call must succeed exactly when the
 * model says so; a failure must leave the output pointers untouched and
 * set a message; a success must give the model's shape and values, stay
 * inside its storage (checked through the internal header), and report
 * contiguity as defined (row-major strides over the dims of extent > 1, or
 * no elements). Values are small integers, exact in fp32 and fp64. */
#include "fuzz_util.h" /* first: it defines _GNU_SOURCE */

#include <flashgrad/flashgrad.h>

#include "lib/autograd/tensor_internal.h"

enum { NSLOT = 6, MAXN = 4096 };

typedef struct slot {
    fg_tensor *t;
    int nd;
    int64_t shape[FG_MAX_DIMS];
    int64_t numel;
    double *v; /* numel values, row-major */
} slot;

static slot pool[NSLOT];

static fg_tensor *const SENTINEL = (fg_tensor *)(uintptr_t)0x5e5e;

static void slot_clear(slot *s)
{
    fg_tensor_free(s->t);
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* Saturating product (the model's sizes may be absurd). */
static __int128 sat_mul(__int128 a, __int128 b)
{
    const __int128 cap = (__int128)1 << 100;
    if (a == 0 || b == 0)
        return 0;
    return a > cap / b ? cap : a * b;
}

/* tensor.h's shape rule: extents >= 0, non-zero product <= FG_MAX_NUMEL. */
static int shape_ok(int nd, const int64_t *shape)
{
    __int128 p = 1;
    for (int i = 0; i < nd; i++) {
        if (shape[i] < 0)
            return 0;
        if (shape[i] > 0)
            p = sat_mul(p, shape[i]);
    }
    return p <= FG_MAX_NUMEL;
}

static int64_t numel_of(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    return n;
}

static int norm_dim(int64_t d, int nd)
{
    if (d < 0)
        d += nd;
    return d >= 0 && d < nd ? (int)d : -1;
}

/* Row-major strides of a shape (for index arithmetic on shadows). */
static void rm_strides(int nd, const int64_t *shape, int64_t *st)
{
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        st[i] = s;
        s *= shape[i];
    }
}

/* Checks t against the expected shape and values. */
static void verify(const fg_tensor *t, int nd, const int64_t *shape,
                   const double *vals, const char *op)
{
    FZ_CHECK(fg_tensor_ndim(t) == nd, "%s: %d dims, expected %d", op,
             fg_tensor_ndim(t), nd);
    for (int i = 0; i < nd; i++)
        FZ_CHECK(fg_tensor_shape(t)[i] == shape[i],
                 "%s: extent %d is %lld, expected %lld", op, i,
                 (long long)fg_tensor_shape(t)[i], (long long)shape[i]);
    const int64_t n = numel_of(nd, shape);
    FZ_CHECK(fg_tensor_numel(t) == n, "%s: numel %lld, expected %lld", op,
             (long long)fg_tensor_numel(t), (long long)n);
    /* Inside its storage, non-negative strides. */
    const int64_t es = (int64_t)fg_dtype_size(t->dtype);
    int64_t hi = t->offset;
    FZ_CHECK(t->offset >= 0, "%s: negative offset", op);
    for (int i = 0; i < nd; i++) {
        FZ_CHECK(t->stride[i] >= 0, "%s: negative stride", op);
        if (n > 0)
            hi += (shape[i] - 1) * t->stride[i];
    }
    if (n > 0)
        FZ_CHECK((hi + 1) * es <= (int64_t)t->storage->nbytes,
                 "%s: element offset %lld beyond a storage of %zu bytes", op,
                 (long long)hi, t->storage->nbytes);
    /* Contiguity as documented. */
    int contig = 1;
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        if (shape[i] != 1 && t->stride[i] != s)
            contig = 0;
        s *= shape[i];
    }
    if (n == 0)
        contig = 1;
    FZ_CHECK(fg_tensor_is_contiguous(t) == contig,
             "%s: is_contiguous %d, expected %d", op,
             fg_tensor_is_contiguous(t), contig);
    if (n == 0)
        return;
    double *got = malloc(sizeof *got * (size_t)n);
    FZ_CHECK(fg_tensor_copy_to_host(t, FG_FP64, got, n) == FG_OK,
             "%s: copy_to_host: %s", op, fg_last_error());
    for (int64_t e = 0; e < n; e++)
        FZ_CHECK(got[e] == vals[e], "%s: element %lld is %g, expected %g",
                 op, (long long)e, got[e], vals[e]);
    free(got);
}

/* The outcome of one call against the model's verdict. */
static void outcome(fg_status s, int valid, fg_tensor *const *outs, int n,
                    const char *op)
{
    FZ_CHECK((s == FG_OK) == valid, "%s returned %s, the model says %s (%s)",
             op, fg_status_string(s), valid ? "valid" : "invalid",
             fg_last_error());
    if (s != FG_OK) {
        FZ_CHECK(fg_last_error()[0] != '\0', "%s: no message", op);
        for (int i = 0; i < n; i++)
            FZ_CHECK(outs[i] == SENTINEL, "%s: a failed call set out[%d]",
                     op, i);
    }
}

static void store(int at, fg_tensor *t, int nd, const int64_t *shape,
                  double *vals, const char *op)
{
    verify(t, nd, shape, vals, op);
    slot_clear(&pool[at]);
    pool[at].t = t;
    pool[at].nd = nd;
    memcpy(pool[at].shape, shape, sizeof(int64_t) * (size_t)nd);
    pool[at].numel = numel_of(nd, shape);
    pool[at].v = vals;
}

static int64_t pick_extent(fz *f)
{
    static const int64_t e[] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 1,
                                FG_MAX_NUMEL, FG_MAX_NUMEL + 1, INT64_MAX,
                                (int64_t)1 << 62, (int64_t)1 << 58, -1,
                                (int64_t)1 << 30};
    return FZ_PICK(f, e);
}

static int64_t pick_index(fz *f)
{
    static const int64_t e[] = {0, 1, 2, 3, 4, 5, -1, -2, -3, -5, 1,
                                INT64_MAX, INT64_MIN, INT64_MAX - 1,
                                INT64_MIN + 1, (int64_t)1 << 62};
    return FZ_PICK(f, e);
}

/* ---- operations ----------------------------------------------------------- */

static void op_create(fz *f, uint64_t *rng)
{
    const int at = fz_u8(f) % NSLOT;
    const fg_dtype dt = fz_u8(f) & 1 ? FG_FP64 : FG_FP32;
    const int nd = fz_u8(f) % 5 + (fz_u8(f) == 0xff ? 5 : 0); /* 9: bad */
    int64_t shape[16];
    for (int i = 0; i < nd; i++)
        shape[i] = pick_extent(f);
    const int kind = fz_u8(f) % 4;
    const int valid = nd <= FG_MAX_DIMS && shape_ok(nd, shape);
    const int64_t n = valid ? numel_of(nd, shape) : 0;
    if (valid && n > MAXN)
        return; /* fine, but too large to allocate here */
    double *vals = malloc(sizeof *vals * (size_t)(n ? n : 1));
    const double fillv = (double)(int)(fz_mix(rng) % 17) - 8;
    for (int64_t e = 0; e < n; e++)
        vals[e] = kind == 0 ? 0.0 : kind == 1 ? fillv
                : (double)(int)(fz_mix(rng) % 17) - 8;
    fg_tensor *t = SENTINEL;
    fg_status s;
    switch (kind) {
    case 0: s = fg_tensor_zeros(dt, FG_DEVICE_CPU, nd, shape, &t); break;
    case 1: s = fg_tensor_full(dt, FG_DEVICE_CPU, nd, shape, fillv, &t); break;
    case 2:
        s = fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU, nd, shape, vals, &t);
        if (s == FG_OK && dt == FG_FP32) { /* and a cast through the API */
            fg_tensor *c = SENTINEL;
            FZ_CHECK(fg_cast(t, FG_FP32, &c) == FG_OK, "cast: %s",
                     fg_last_error());
            fg_tensor_free(t);
            t = c;
        }
        break;
    default:
        s = fg_tensor_empty(dt, FG_DEVICE_CPU, nd, shape, &t);
        if (s == FG_OK)
            FZ_CHECK(fg_tensor_copy_from_host(t, FG_FP64, vals, n) == FG_OK,
                     "copy_from_host: %s", fg_last_error());
        break;
    }
    outcome(s, valid, &t, 1, "create");
    if (s != FG_OK) {
        free(vals);
        return;
    }
    if (fz_u8(f) & 1) /* recorded graphs too */
        FZ_CHECK(fg_tensor_set_requires_grad(t, 1) == FG_OK, "requires_grad");
    store(at, t, nd, shape, vals, "create");
}

/* Values of x sliced on dim at first + a * step, a < len. */
static double *gather_slice(const slot *x, int dim, int64_t first,
                            int64_t len, int64_t step, int64_t *shape)
{
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->nd);
    shape[dim] = len;
    const int64_t n = numel_of(x->nd, shape);
    double *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    int64_t xs[FG_MAX_DIMS], ys[FG_MAX_DIMS];
    rm_strides(x->nd, x->shape, xs);
    rm_strides(x->nd, shape, ys);
    for (int64_t e = 0; e < n; e++) {
        int64_t src = 0, rem = e;
        for (int i = 0; i < x->nd; i++) {
            int64_t idx = rem / ys[i];
            rem %= ys[i];
            src += (i == dim ? first + idx * step : idx) * xs[i];
        }
        v[e] = x->v[src];
    }
    return v;
}

static void op_slice(fz *f, int narrow)
{
    const slot *x = &pool[fz_u8(f) % NSLOT];
    const int at = fz_u8(f) % NSLOT;
    const int64_t rawdim = (int8_t)fz_u8(f) % 6;
    int64_t a = pick_index(f), b = pick_index(f);
    int64_t step = narrow ? 1 : pick_index(f);
    int dim = x->t ? norm_dim(rawdim, x->nd) : -1;
    int valid = dim >= 0 && step >= 1;
    int64_t first = 0, len = 0;
    if (valid) {
        const __int128 n = x->shape[dim];
        __int128 s = a;
        if (s < 0)
            s += n;
        if (narrow) {
            valid = s >= 0 && s <= n && b >= 0 && b <= n - s;
            first = (int64_t)s;
            len = b;
        } else {
            __int128 e = b;
            if (e < 0)
                e += n;
            s = s < 0 ? 0 : s > n ? n : s;
            e = e < 0 ? 0 : e > n ? n : e;
            first = (int64_t)s;
            len = e <= s ? 0 : (int64_t)((e - s + step - 1) / step);
        }
    }
    fg_tensor *y = SENTINEL;
    const fg_status s = narrow ? fg_narrow(x->t, (int)rawdim, a, b, &y)
                               : fg_slice(x->t, (int)rawdim, a, b, step, &y);
    outcome(s, valid, &y, 1, narrow ? "narrow" : "slice");
    if (s != FG_OK)
        return;
    int64_t shape[FG_MAX_DIMS];
    double *v = gather_slice(x, dim, first, len, step, shape);
    store(at, y, x->nd, shape, v, narrow ? "narrow" : "slice");
}

static void op_reshape(fz *f)
{
    const slot *x = &pool[fz_u8(f) % NSLOT];
    const int at = fz_u8(f) % NSLOT;
    const int nd = fz_u8(f) % 5;
    int64_t shape[FG_MAX_DIMS];
    static const int64_t ex[] = {-1, 0, 1, 2, 3, 4, 6, 8, 12, 16, -1, 2,
                                 INT64_MAX, (int64_t)1 << 62, -2};
    for (int i = 0; i < nd; i++)
        shape[i] = FZ_PICK(f, ex);
    int valid = x->t != NULL, infer = -1;
    __int128 known = 1;
    for (int i = 0; valid && i < nd; i++) {
        if (shape[i] == -1 && infer < 0)
            infer = i;
        else if (shape[i] < 0)
            valid = 0;
        else
            known = sat_mul(known, shape[i]);
    }
    int64_t out[FG_MAX_DIMS];
    memcpy(out, shape, sizeof out);
    if (valid && infer >= 0) {
        valid = known != 0 && x->numel % known == 0;
        if (valid) {
            out[infer] = (int64_t)(x->numel / known);
            known = x->numel;
        }
    }
    valid = valid && known == x->numel && shape_ok(nd, out);
    fg_tensor *y = SENTINEL;
    const fg_status s = fg_reshape(x->t, nd, shape, &y);
    outcome(s, valid, &y, 1, "reshape");
    if (s != FG_OK)
        return;
    double *v = malloc(sizeof *v * (size_t)(x->numel ? x->numel : 1));
    if (x->numel)
        memcpy(v, x->v, sizeof *v * (size_t)x->numel);
    store(at, y, nd, out, v, "reshape");
}

static void op_permute(fz *f, int transpose)
{
    const slot *x = &pool[fz_u8(f) % NSLOT];
    const int at = fz_u8(f) % NSLOT;
    int perm[FG_MAX_DIMS], p[FG_MAX_DIMS], seen[FG_MAX_DIMS] = {0};
    const int nd = x->t ? x->nd : 0;
    int valid = x->t != NULL, d0 = 0, d1 = 0;
    fg_tensor *y = SENTINEL;
    fg_status s;
    if (transpose) {
        d0 = (int8_t)fz_u8(f) % 6;
        d1 = (int8_t)fz_u8(f) % 6;
        const int a = norm_dim(d0, nd), b = norm_dim(d1, nd);
        valid = valid && a >= 0 && b >= 0;
        for (int i = 0; i < nd; i++)
            p[i] = i;
        if (valid) {
            p[a] = b;
            p[b] = a;
        }
        s = fg_transpose(x->t, d0, d1, &y);
    } else {
        for (int i = 0; i < nd; i++) {
            perm[i] = (int8_t)fz_u8(f) % 6;
            p[i] = norm_dim(perm[i], nd);
            if (p[i] < 0 || seen[p[i]]++)
                valid = 0;
        }
        s = fg_permute(x->t, perm, &y);
    }
    outcome(s, valid, &y, 1, transpose ? "transpose" : "permute");
    if (s != FG_OK)
        return;
    int64_t shape[FG_MAX_DIMS], xs[FG_MAX_DIMS], ys[FG_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        shape[i] = x->shape[p[i]];
    rm_strides(nd, x->shape, xs);
    rm_strides(nd, shape, ys);
    double *v = malloc(sizeof *v * (size_t)(x->numel ? x->numel : 1));
    for (int64_t e = 0; e < x->numel; e++) {
        int64_t src = 0, rem = e;
        for (int i = 0; i < nd; i++) {
            src += rem / ys[i] * xs[p[i]];
            rem %= ys[i];
        }
        v[e] = x->v[src];
    }
    store(at, y, nd, shape, v, transpose ? "transpose" : "permute");
}

static void op_concat(fz *f)
{
    const int n = fz_u8(f) % 5; /* 0 is invalid */
    const slot *xs[4];
    fg_tensor *ts[4];
    for (int i = 0; i < n; i++) {
        xs[i] = &pool[fz_u8(f) % NSLOT];
        ts[i] = xs[i]->t;
    }
    const int at = fz_u8(f) % NSLOT;
    const int rawdim = (int8_t)fz_u8(f) % 6;
    int valid = n >= 1, dim = -1;
    for (int i = 0; valid && i < n; i++)
        valid = xs[i]->t && fg_tensor_dtype(ts[i]) == fg_tensor_dtype(ts[0]) &&
                xs[i]->nd == xs[0]->nd;
    int64_t shape[FG_MAX_DIMS];
    if (valid) {
        dim = norm_dim(rawdim, xs[0]->nd);
        valid = dim >= 0;
    }
    if (valid) {
        memcpy(shape, xs[0]->shape, sizeof shape);
        __int128 sum = 0;
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < xs[0]->nd; k++)
                if (k != dim && xs[i]->shape[k] != xs[0]->shape[k])
                    valid = 0;
            sum += xs[i]->shape[dim];
        }
        valid = valid && sum <= INT64_MAX;
        if (valid) {
            shape[dim] = (int64_t)sum;
            valid = shape_ok(xs[0]->nd, shape);
        }
    }
    if (valid && numel_of(xs[0]->nd, shape) > MAXN)
        return; /* repeated concats would grow without bound */
    fg_tensor *y = SENTINEL;
    const fg_status s = fg_concat(n ? ts : NULL, n, rawdim, &y);
    outcome(s, valid, &y, 1, "concat");
    if (s != FG_OK)
        return;
    const int nd = xs[0]->nd;
    const int64_t total = numel_of(nd, shape);
    double *v = malloc(sizeof *v * (size_t)(total ? total : 1));
    int64_t ys[FG_MAX_DIMS];
    rm_strides(nd, shape, ys);
    for (int64_t e = 0; e < total; e++) {
        int64_t idx[FG_MAX_DIMS] = {0}, rem = e;
        for (int i = 0; i < nd; i++) {
            idx[i] = rem / ys[i];
            rem %= ys[i];
        }
        int part = 0;
        while (idx[dim] >= xs[part]->shape[dim])
            idx[dim] -= xs[part++]->shape[dim];
        int64_t ps[FG_MAX_DIMS], src = 0;
        rm_strides(nd, xs[part]->shape, ps);
        for (int i = 0; i < nd; i++)
            src += idx[i] * ps[i];
        v[e] = xs[part]->v[src];
    }
    store(at, y, nd, shape, v, "concat");
}

static void op_split(fz *f)
{
    const slot *x = &pool[fz_u8(f) % NSLOT];
    const int n = fz_u8(f) % 5; /* 0 is invalid */
    const int rawdim = (int8_t)fz_u8(f) % 6;
    int64_t sizes[4];
    const int dim = x->t ? norm_dim(rawdim, x->nd) : -1;
    const int64_t ext = dim >= 0 ? x->shape[dim] : 0;
    for (int i = 0; i < n; i++) {
        const uint8_t c = fz_u8(f);
        sizes[i] = c < 200 ? c % 4 : c < 230 ? ext : pick_index(f);
    }
    if (n >= 2 && (fz_u8(f) & 1)) { /* often make the sum right */
        __int128 rest = ext;
        for (int i = 0; i < n - 1; i++)
            rest -= sizes[i];
        if (rest >= 0)
            sizes[n - 1] = (int64_t)rest;
    }
    int valid = dim >= 0 && n >= 1;
    __int128 sum = 0;
    for (int i = 0; valid && i < n; i++) {
        valid = sizes[i] >= 0 && sizes[i] <= ext;
        sum += sizes[i];
    }
    valid = valid && sum == ext;
    fg_tensor *ys[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    const fg_status s = fg_split(x->t, rawdim, n ? sizes : NULL, n, ys);
    outcome(s, valid, ys, n, "split");
    if (s != FG_OK)
        return;
    /* Keep the parts in consecutive slots after x's (x stays alive). */
    const int xi = (int)(x - pool);
    int64_t first = 0;
    slot src = *x; /* shadow copy: a part may replace x's slot */
    src.v = malloc(sizeof(double) * (size_t)(x->numel ? x->numel : 1));
    if (x->numel)
        memcpy(src.v, x->v, sizeof(double) * (size_t)x->numel);
    fg_tensor *keep = fg_tensor_retain(x->t);
    for (int i = 0; i < n; i++) {
        int64_t shape[FG_MAX_DIMS];
        double *v = gather_slice(&src, dim, first, sizes[i], 1, shape);
        first += sizes[i];
        store((xi + 1 + i) % NSLOT, ys[i], src.nd, shape, v, "split");
    }
    free(src.v);
    fg_tensor_free(keep);
}

static void op_copy_like(fz *f, int detach)
{
    const slot *x = &pool[fz_u8(f) % NSLOT];
    const int at = fz_u8(f) % NSLOT;
    fg_tensor *y = SENTINEL;
    const fg_status s = detach ? fg_detach(x->t, &y) : fg_contiguous(x->t, &y);
    outcome(s, x->t != NULL, &y, 1, detach ? "detach" : "contiguous");
    if (s != FG_OK)
        return;
    if (!detach)
        FZ_CHECK(fg_tensor_is_contiguous(y), "contiguous gave a "
                                             "non-contiguous tensor");
    double *v = malloc(sizeof *v * (size_t)(x->numel ? x->numel : 1));
    if (x->numel)
        memcpy(v, x->v, sizeof *v * (size_t)x->numel);
    int64_t shape[FG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    store(at, y, x->nd, shape, v, detach ? "detach" : "contiguous");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    uint64_t rng = size;
    for (int steps = 0; f.n > 0 && steps < 64; steps++) {
        switch (fz_u8(&f) % 12) {
        case 0:
        case 1: op_create(&f, &rng); break;
        case 2: op_slice(&f, 0); break;
        case 3: op_slice(&f, 1); break;
        case 4: op_reshape(&f); break;
        case 5: op_permute(&f, 0); break;
        case 6: op_permute(&f, 1); break;
        case 7: op_concat(&f); break;
        case 8: op_split(&f); break;
        case 9: op_copy_like(&f, 0); break;
        case 10: op_copy_like(&f, 1); break;
        default: slot_clear(&pool[fz_u8(&f) % NSLOT]); break;
        }
    }
    for (int i = 0; i < NSLOT; i++)
        slot_clear(&pool[i]);
    return 0;
}
