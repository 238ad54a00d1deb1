/* SPDX-License-Identifier: MIT */
/* tests/test_reliability.c - regressions for the defects of issue 25: size
 * and stride arithmetic that overflowed (huge extents of empty tensors,
 * slice steps, concat/split sums, batch * heads), contiguity of empty
 * tensors, the per-thread attention workspace at thread exit, the
 * num_threads and softmax_scale bounds, and the strided overlap check,
 * which is compared with a brute-force enumeration. */
#include <float.h>
#include <pthread.h>
#include <stdint.h>

#include "lib/core/strided.h"
#include "naive_attention.h"
#include "flashgrad/nn.h"
#include "test_ops_util.h"

/* ---- size arithmetic ---------------------------------------------------- */

START_TEST(test_empty_with_huge_extents)
{
    fg_tensor *t = (fg_tensor *)0x1; /* must stay untouched on failure */
    FGT_FAILS(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU,
                              FG_SHAPE(0, INT64_MAX, 2), &t),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_tensor_empty(FG_FP64, FG_DEVICE_CPU,
                              FG_SHAPE(0, (int64_t)1 << 62), &t),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_tensor_empty(FG_FP64, FG_DEVICE_CPU,
                              FG_SHAPE(1 << 20, 0, 1 << 20, 1 << 20), &t),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(t, (fg_tensor *)0x1);
    /* The limit itself is accepted for an empty tensor, and its strides
     * are the products of the extents. */
    FGT_OK(fg_tensor_empty(FG_FP32, FG_DEVICE_CPU,
                           FG_SHAPE(0, FG_MAX_NUMEL), &t));
    ck_assert_int_eq(fg_tensor_numel(t), 0);
    ck_assert_int_eq(fg_tensor_strides(t)[0], FG_MAX_NUMEL);
    ck_assert_int_eq(fg_tensor_strides(t)[1], 1);
    fg_tensor *r = (fg_tensor *)0x1;
    /* Reshape of an empty tensor: the zero must not hide the product. */
    FGT_FAILS(fg_reshape(t, FG_SHAPE(0, INT64_MAX, INT64_MAX), &r),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(r, (fg_tensor *)0x1);
    FGT_OK(fg_reshape(t, FG_SHAPE(FG_MAX_NUMEL, 0, 1), &r));
    fg_tensor_free(r);
    fg_tensor_free(t);
}
END_TEST

/* Python's len(range(start, stop, step)) for step > 0 after clamping, in
 * 128-bit arithmetic: the reference for fg_slice. */
static int64_t py_slice_len(int64_t n, int64_t start, int64_t stop,
                            int64_t step, int64_t *first)
{
    __int128 s = start, e = stop;
    if (s < 0)
        s += n;
    if (e < 0)
        e += n;
    s = s < 0 ? 0 : s > n ? n : s;
    e = e < 0 ? 0 : e > n ? n : e;
    *first = (int64_t)s;
    return e <= s ? 0 : (int64_t)((e - s + step - 1) / step);
}

START_TEST(test_slice_steps)
{
    fgt_rng rng = fgt_rng_for(101);
    int64_t sh[] = {4, 4};
    fg_tensor *x = fgt_rand(&rng, FG_FP64, 2, sh, 1.0, 0, 0);
    double *hx = fgt_host(x);
    const int64_t big[] = {INT64_MAX, INT64_MAX - 1, INT64_MIN, INT64_MIN + 1,
                           (int64_t)1 << 62, -((int64_t)1 << 62)};
    for (int it = 0; it < 2000; it++) {
        int64_t v[3];
        for (int k = 0; k < 3; k++)
            v[k] = fgt_int(&rng, 0, 3) == 0 ? big[fgt_int(&rng, 0, 5)]
                                             : fgt_int(&rng, -6, 6);
        int64_t start = v[0], stop = v[1];
        int64_t step = it == 0                ? INT64_MAX
                       : v[2] == INT64_MIN ? INT64_MAX
                       : v[2] > 0          ? v[2]
                                           : -v[2];
        if (it == 0) {
            start = 0;
            stop = 4;
        }
        if (step < 1)
            step = 1;
        const int dim = (int)fgt_int(&rng, 0, 1);
        fg_tensor *y = NULL;
        FGT_OK(fg_slice(x, dim, start, stop, step, &y));
        int64_t first;
        const int64_t len = py_slice_len(4, start, stop, step, &first);
        ck_assert_msg(fg_tensor_size(y, dim) == len && fg_tensor_size(y, 1 - dim) == 4,
                      "slice(%lld, %lld, %lld) on dim %d: extent %lld, "
                      "Python gives %lld", (long long)start, (long long)stop,
                      (long long)step, dim, (long long)fg_tensor_size(y, dim),
                      (long long)len);
        double *hy = fgt_host(y);
        for (int64_t a = 0; a < len; a++)
            for (int64_t b = 0; b < 4; b++) {
                const int64_t src = first + a * step; /* a < len: no overflow */
                const double ref = dim == 0 ? hx[src * 4 + b] : hx[b * 4 + src];
                const double got = dim == 0 ? hy[a * 4 + b] : hy[b * len + a];
                ck_assert(got == ref);
            }
        free(hy);
        fg_tensor_free(y);
    }
    free(hx);
    fg_tensor_free(x);
}
END_TEST

START_TEST(test_concat_split_sums)
{
    /* 64 empty parts of 2^58 along dim 1 sum to 2^64, which wrapped to 0. */
    fg_tensor *parts[64];
    for (int i = 0; i < 64; i++)
        FGT_OK(fg_tensor_empty(FG_FP32, FG_DEVICE_CPU,
                               FG_SHAPE(0, (int64_t)1 << 58), &parts[i]));
    fg_tensor *y = (fg_tensor *)0x1;
    FGT_FAILS(fg_concat(parts, 64, 1, &y), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_concat(parts, 4, 1, &y), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(y, (fg_tensor *)0x1);
    FGT_OK(fg_concat(parts, 64, 0, &y)); /* [0, 2^58]: fine */
    ck_assert_int_eq(fg_tensor_size(y, 0), 0);
    ck_assert_int_eq(fg_tensor_size(y, 1), (int64_t)1 << 58);
    fg_tensor_free(y);
    fgt_free_all(parts, 64);

    /* 33 x E + 32 = 2^64 + E for E = 2^59 - 1: the sum wrapped to E. */
    const int64_t E = FG_MAX_NUMEL;
    fg_tensor *x;
    FGT_OK(fg_tensor_empty(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(E, 0), &x));
    int64_t sizes[34];
    for (int i = 0; i < 33; i++)
        sizes[i] = E;
    sizes[33] = 32;
    fg_tensor *outs[34];
    for (int i = 0; i < 34; i++)
        outs[i] = (fg_tensor *)0x1;
    FGT_FAILS(fg_split(x, 0, sizes, 34, outs), FG_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 34; i++)
        ck_assert_ptr_eq(outs[i], (fg_tensor *)0x1);
    const int64_t ok_sizes[] = {E - 5, 5};
    FGT_OK(fg_split(x, 0, ok_sizes, 2, outs));
    ck_assert_int_eq(fg_tensor_size(outs[0], 0), E - 5);
    ck_assert_int_eq(fg_tensor_size(outs[1], 0), 5);
    fgt_free_all(outs, 2);
    fg_tensor_free(x);
}
END_TEST

/* Poisoned attention buffers for the parameter checks below. */
enum { PB = 1, PN = 4, PH = 2, PD = 8, PE = PB * PN * PH * PD };

typedef struct small_attn {
    double q[PE], k[PE], v[PE], o[PE], m[PB * PH * PN], l[PB * PH * PN];
    fg_attn_tensor tq, tk, tv, to;
    fg_attn_stats st;
} small_attn;

static void small_attn_init(small_attn *a, fg_dtype dt)
{
    fgt_rng r = fgt_rng_for(7);
    fgt_fill(a->q, PE, &r, 1.0);
    fgt_fill(a->k, PE, &r, 1.0);
    fgt_fill(a->v, PE, &r, 1.0);
    if (dt == FG_FP32) /* the first half of each buffer as floats */
        for (int i = 0; i < PE; i++) {
            ((float *)a->q)[i] = (float)a->q[i];
            ((float *)a->k)[i] = (float)a->k[i];
            ((float *)a->v)[i] = (float)a->v[i];
        }
    memset(a->o, 0x5A, sizeof a->o);
    memset(a->m, 0x5A, sizeof a->m);
    memset(a->l, 0x5A, sizeof a->l);
    a->tq = fg_attn_bshd(a->q, dt, PN, PH, PD);
    a->tk = fg_attn_bshd(a->k, dt, PN, PH, PD);
    a->tv = fg_attn_bshd(a->v, dt, PN, PH, PD);
    a->to = fg_attn_bshd(a->o, dt, PN, PH, PD);
    a->st.m = a->m;
    a->st.l = a->l;
    a->st.dtype = dt;
}

static int small_attn_untouched(const small_attn *a)
{
    const unsigned char *p = (const unsigned char *)a->o;
    for (size_t i = 0; i < sizeof a->o; i++)
        if (p[i] != 0x5A)
            return 0;
    p = (const unsigned char *)a->m;
    for (size_t i = 0; i < sizeof a->m + sizeof a->l; i++)
        if (p[i] != 0x5A)
            return 0;
    return 1;
}

START_TEST(test_attention_param_bounds)
{
    static small_attn a;
    fg_attn_params p;
    /* batch * heads_q = 2^62 * 4 wrapped; 2^62 alone is refused too. */
    const int64_t huge[][2] = {{(int64_t)1 << 62, 4}, {(int64_t)1 << 62, 1},
                               {(int64_t)1 << 31, 1}, {1 << 16, 1 << 15}};
    for (int i = 0; i < 4; i++) {
        small_attn_init(&a, FG_FP64);
        fg_attn_params_init(&p, huge[i][0], PN, PN, huge[i][1], 1, PD);
        FGT_FAILS(fg_attention_forward(&p, &a.tq, &a.tk, &a.tv, &a.to, &a.st),
                  FG_ERR_UNSUPPORTED);
        ck_assert(small_attn_untouched(&a));
    }
    /* A scale that is inf in fp32 gave NaN with FG_OK; the bound is the
     * same for fp64 operands. */
    const fg_dtype dts[] = {FG_FP32, FG_FP64};
    for (int i = 0; i < 2; i++) {
        small_attn_init(&a, dts[i]);
        fg_attn_params_init(&p, PB, PN, PN, PH, PH, PD);
        p.softmax_scale = 1e39;
        FGT_FAILS(fg_attention_forward(&p, &a.tq, &a.tk, &a.tv, &a.to, &a.st),
                  FG_ERR_INVALID_ARGUMENT);
        ck_assert(small_attn_untouched(&a));
        p.softmax_scale = INFINITY;
        FGT_FAILS(fg_attention_forward(&p, &a.tq, &a.tk, &a.tv, &a.to, &a.st),
                  FG_ERR_INVALID_ARGUMENT);
        p.num_threads = 1025;
        p.softmax_scale = 0;
        FGT_FAILS(fg_attention_forward(&p, &a.tq, &a.tk, &a.tv, &a.to, &a.st),
                  FG_ERR_INVALID_ARGUMENT);
        ck_assert(small_attn_untouched(&a));
    }
    /* FLT_MAX itself is accepted: with inputs of 3e-20 the scores are of
     * order 1 and the result is the reference's. */
    small_attn_init(&a, FG_FP64);
    for (int i = 0; i < PE; i++) { /* scores of order 1 */
        a.q[i] *= 3e-20;
        a.k[i] *= 3e-20;
    }
    fg_attn_params_init(&p, PB, PN, PN, PH, PH, PD);
    p.softmax_scale = FLT_MAX;
    FGT_OK(fg_attention_forward(&p, &a.tq, &a.tk, &a.tv, &a.to, &a.st));
    double ro[PE], rm[PB * PH * PN], rl[PB * PH * PN];
    naive_shape ns = {PB, PN, PN, PH, PH, PD, FLT_MAX, 0, 0, NULL};
    naive_attention_forward(&ns, a.q, a.k, a.v, ro, rm, rl);
    ck_assert_msg(fgt_rel_err(a.o, ro, PE) <= 1e-12, "O err %g",
                  fgt_rel_err(a.o, ro, PE));
}
END_TEST

/* fg_attn_bshd/bhsd multiplied the sizes unchecked (undefined on
 * overflow; a wrapped stride could look valid). Now the strides are
 * FG_ATTN_STRIDE_BAD and every entry point refuses them, saying why. */
START_TEST(test_layout_overflow)
{
    const int64_t big = (int64_t)1 << 40;
    const int64_t sizes[][3] = {{big, big, 8},   {1, big, (int64_t)1 << 30},
                                {INT64_MAX, 1, 8}, {-1, 2, 8},
                                {4, -2, 8},      {4, 2, -8},
                                {(int64_t)1 << 31, 1 << 24, 256}}; /* 2^63 */
    for (int i = 0; i < 7; i++)
        for (int bhsd = 0; bhsd < 2; bhsd++) {
            const int64_t *z = sizes[i];
            fg_attn_tensor t = bhsd ? fg_attn_bhsd(NULL, FG_FP32, z[0], z[1], z[2])
                                    : fg_attn_bshd(NULL, FG_FP32, z[0], z[1], z[2]);
            ck_assert_int_eq(t.stride_b, FG_ATTN_STRIDE_BAD);
            ck_assert_int_eq(t.stride_s, FG_ATTN_STRIDE_BAD);
            ck_assert_int_eq(t.stride_h, FG_ATTN_STRIDE_BAD);
            ck_assert_int_eq(t.dtype, FG_FP32);
        }
    /* Products just below 2^63 are still computed exactly. */
    const int64_t s = (int64_t)1 << 31, h = (int64_t)1 << 23, d = 256;
    fg_attn_tensor t = fg_attn_bshd(NULL, FG_FP64, s, h, d);
    ck_assert_int_eq(t.stride_b, s * h * d);
    ck_assert_int_eq(t.stride_s, h * d);
    ck_assert_int_eq(t.stride_h, d);
    t = fg_attn_bhsd(NULL, FG_FP64, s, h, d);
    ck_assert_int_eq(t.stride_b, s * h * d);
    ck_assert_int_eq(t.stride_s, d);
    ck_assert_int_eq(t.stride_h, s * d);

    /* Each operand of each entry point, in turn, with such strides. */
    static small_attn a;
    static double dq[PE], dk[PE], dv[PE], dout[PE];
    const fg_attn_tensor bad = fg_attn_bshd(a.q, FG_FP64, big, big, PD);
    fgt_rng r = fgt_rng_for(13);
    fg_attn_params p;
    fg_attn_params_init(&p, PB, PN, PN, PH, PH, PD);
    for (int which = 0; which < 8; which++) {
        small_attn_init(&a, FG_FP64);
        fgt_poison_d(dq, PE);
        fgt_poison_d(dk, PE);
        fgt_poison_d(dv, PE);
        fgt_fill(dout, PE, &r, 1.0);
        fg_attn_tensor t8[8] = {a.tq, a.tk, a.tv, a.to,
                                fg_attn_bshd(dout, FG_FP64, PN, PH, PD),
                                fg_attn_bshd(dq, FG_FP64, PN, PH, PD),
                                fg_attn_bshd(dk, FG_FP64, PN, PH, PD),
                                fg_attn_bshd(dv, FG_FP64, PN, PH, PD)};
        t8[which] = bad;
        fg_status st;
        if (which < 4) {
            st = fg_attention_forward(&p, &t8[0], &t8[1], &t8[2], &t8[3],
                                      &a.st);
            ck_assert_int_eq(st, FG_ERR_INVALID_ARGUMENT);
            ck_assert(small_attn_untouched(&a));
            ck_assert_ptr_nonnull(strstr(fg_last_error(), "overflows int64"));
        }
        st = fg_attention_backward(&p, &t8[0], &t8[1], &t8[2], &t8[3], &t8[4],
                                   &a.st, &t8[5], &t8[6], &t8[7]);
        ck_assert_int_eq(st, FG_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_nonnull(strstr(fg_last_error(), "overflows int64"));
        for (int e = 0; e < PE; e++)
            ck_assert(isnan(dq[e]) && isnan(dk[e]) && isnan(dv[e]));
    }
    /* The merge's O. */
    small_attn_init(&a, FG_FP64);
    FGT_FAILS(fg_attention_merge(&p, 1, &bad, &a.st, &a.to, &a.st),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "overflow int64"));
    ck_assert(small_attn_untouched(&a));
}
END_TEST

static int os_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

/* num_threads = 1000 started 1000 OS threads whatever the machine. */
START_TEST(test_num_threads_capped)
{
    const int64_t H = 1024; /* >= 1000 independent tasks */
    const size_t n = (size_t)H * 8;
    float *q = calloc(n, sizeof *q), *o = malloc(n * sizeof *o);
    float *m = malloc((size_t)H * sizeof *m), *l = malloc((size_t)H * sizeof *l);
    fg_attn_params p;
    fg_attn_params_init(&p, 1, 1, 1, H, H, 8);
    p.num_threads = 1000;
    fg_attn_tensor tq = fg_attn_bshd(q, FG_FP32, 1, H, 8);
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP32, 1, H, 8);
    fg_attn_stats st = {m, l, FG_FP32};
    FGT_OK(fg_attention_forward(&p, &tq, &tq, &tq, &to, &st));
    const long procs = sysconf(_SC_NPROCESSORS_ONLN);
    const int t = os_threads();
    /* OpenMP keeps its pool alive after the call, so it can be counted. */
    if (t >= 0)
        ck_assert_msg(t <= procs + 1, "%d OS threads on %ld processors", t,
                      procs);
    for (size_t i = 0; i < n; i++)
        ck_assert(o[i] == 0.0f); /* V = 0 */
    free(q);
    free(o);
    free(m);
    free(l);
}
END_TEST

/* ---- empty tensors are contiguous ------------------------------------ */

START_TEST(test_empty_contiguous)
{
    fg_tensor *x, *y, *p;
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, 0, 3), &x));
    ck_assert(fg_tensor_is_contiguous(x));
    FGT_OK(fg_contiguous(x, &y));
    ck_assert(fg_tensor_is_contiguous(y));
    ck_assert_ptr_eq(y, x); /* nothing to copy */
    fg_tensor_free(y);
    const int perm[] = {2, 1, 0};
    FGT_OK(fg_permute(x, perm, &p));
    ck_assert(fg_tensor_is_contiguous(p));
    FGT_OK(fg_contiguous(p, &y));
    ck_assert(fg_tensor_is_contiguous(y));
    ck_assert_int_eq(fg_tensor_size(y, 0), 3);
    ck_assert_int_eq(fg_tensor_numel(y), 0);
    fg_tensor_free(y);
    fg_tensor_free(p);
    /* A non-empty permuted view is still not contiguous. */
    fg_tensor *z;
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, 1, 3), &z));
    FGT_OK(fg_permute(z, perm, &p));
    ck_assert(!fg_tensor_is_contiguous(p));
    FGT_OK(fg_contiguous(p, &y));
    ck_assert(fg_tensor_is_contiguous(y));
    fgt_free_all((fg_tensor *[]){y, p, z, x}, 4);
}
END_TEST

/* ---- the workspace of exited threads ---------------------------------- */

enum { WN = 128, WD = 128 };

static void *attn_once(void *arg)
{
    float *buf = arg; /* q = k = v, then o */
    float *o = buf + WN * WD, *m = o + WN * WD, *l = m + WN;
    fg_attn_params p;
    fg_attn_params_init(&p, 1, WN, WN, 1, 1, WD);
    p.num_threads = 1; /* the workspace belongs to this thread */
    p.block_q = p.block_k = WN;
    fg_attn_tensor t = fg_attn_bshd(buf, FG_FP32, WN, 1, WD);
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP32, WN, 1, WD);
    fg_attn_stats st = {m, l, FG_FP32};
    return (void *)(intptr_t)fg_attention_forward(&p, &t, &t, &t, &to, &st);
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1, rss = -1;
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = -1;
    fclose(f);
    return rss < 0 ? -1 : rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* ASan's quarantine holds freed memory, so RSS cannot tell a leak there;
 * LeakSanitizer reports one at exit instead. */
#if defined(__SANITIZE_ADDRESS__)
#define FGT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FGT_ASAN 1
#endif
#endif
#ifndef FGT_ASAN
#define FGT_ASAN 0
#endif

/* Each thread's workspace (~330 KiB here, all touched) used to stay
 * allocated after the thread exited: 300 threads grew RSS by ~100 MiB. */
START_TEST(test_workspace_freed_at_thread_exit)
{
    float *buf = calloc((size_t)(2 * WN * WD + 2 * WN), sizeof *buf);
    fgt_rng r = fgt_rng_for(9);
    for (int i = 0; i < WN * WD; i++)
        buf[i] = (float)fgt_uniform(&r);
    long before = 0;
    for (int i = 0; i < 300; i++) {
        if (i == 20) /* allocator warm */
            before = rss_kib();
        pthread_t t;
        void *res;
        ck_assert(pthread_create(&t, NULL, attn_once, buf) == 0);
        ck_assert(pthread_join(t, &res) == 0);
        ck_assert_int_eq((int)(intptr_t)res, FG_OK);
    }
    const long after = rss_kib();
    if (!FGT_ASAN && before > 0 && after > 0)
        ck_assert_msg(after - before < 16 * 1024,
                      "RSS grew by %ld KiB over 280 short-lived threads",
                      after - before);
    /* Releasing on a thread that never ran attention is harmless. */
    fg_attention_release_workspace();
    fg_attention_release_workspace();
    free(buf);
}
END_TEST

/* ---- the overlap check against brute force ------------------------------ */

/* A random small view: nd in [1, 4], extents in [0, 4] (mostly >= 1),
 * strides in [0, 12] and sometimes a dense contiguous innermost dim. */
static void random_view(fgt_rng *r, fg_view *v, const char *base,
                        size_t esize)
{
    v->base = base;
    v->esize = esize;
    v->nd = (int)fgt_int(r, 1, 4);
    for (int k = 0; k < v->nd; k++) {
        v->ext[k] = fgt_int(r, 0, 24) == 0 ? 0 : fgt_int(r, 1, 4);
        v->str[k] = fgt_int(r, 0, 12);
    }
    if (fgt_int(r, 0, 1)) { /* innermost dense, as attention's d */
        v->ext[v->nd - 1] = fgt_int(r, 1, 8);
        v->str[v->nd - 1] = 1;
    }
}

/* Every element offset of v (count returned; 0 when empty). */
static int64_t all_offsets(const fg_view *v, int64_t *out)
{
    int64_t n = 1;
    for (int k = 0; k < v->nd; k++)
        n *= v->ext[k];
    for (int64_t e = 0; e < n; e++) {
        int64_t rem = e, off = 0;
        for (int k = v->nd - 1; k >= 0; k--) {
            off += (rem % v->ext[k]) * v->str[k];
            rem /= v->ext[k];
        }
        out[e] = off;
    }
    return n;
}

static int brute_self(const fg_view *v)
{
    static int64_t off[4096];
    const int64_t n = all_offsets(v, off);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i + 1; j < n; j++)
            if (off[i] == off[j])
                return 1;
    return 0;
}

static int brute_pair(const fg_view *a, const fg_view *b)
{
    static int64_t oa[4096], ob[4096];
    const int64_t na = all_offsets(a, oa), nb = all_offsets(b, ob);
    for (int64_t i = 0; i < na; i++)
        for (int64_t j = 0; j < nb; j++) {
            const char *sa = a->base + oa[i] * (int64_t)a->esize;
            const char *sb = b->base + ob[j] * (int64_t)b->esize;
            if (sa < sb + b->esize && sb < sa + a->esize)
                return 1;
        }
    return 0;
}

START_TEST(test_overlap_brute_force)
{
    fgt_rng r = fgt_rng_for(31);
    static char arena[1 << 14];
    int self_hits = 0, pair_hits = 0;
    for (int it = 0; it < 40000; it++) {
        fg_view a, b;
        random_view(&r, &a, arena + 64 * fgt_int(&r, 0, 3), 4);
        ck_assert_int_eq(fg_view_self_overlaps(&a), brute_self(&a));
        self_hits += brute_self(&a);
        /* b: a's pattern shifted (packed QKV), or a different one, maybe
         * of another element size or misaligned. */
        if (fgt_int(&r, 0, 2) == 0) {
            b = a;
            b.base = arena + 4 * fgt_int(&r, 0, 80) + fgt_int(&r, 0, 1) * 2;
        } else {
            const size_t es[] = {2, 4, 8};
            random_view(&r, &b, arena + fgt_int(&r, 0, 300),
                        es[fgt_int(&r, 0, 2)]);
        }
        const int want = brute_pair(&a, &b);
        pair_hits += want;
        ck_assert_msg(fg_views_overlap(&a, &b) == want &&
                          fg_views_overlap(&b, &a) == want,
                      "iteration %d: pair overlap should be %d (a: %d dims, "
                      "base +%td; b: %d dims, base +%td, element %zu)",
                      it, want, a.nd, a.base - arena, b.nd, b.base - arena,
                      b.esize);
    }
    /* Both answers were exercised. */
    ck_assert(self_hits > 1000 && self_hits < 39000);
    ck_assert(pair_hits > 1000 && pair_hits < 39000);
}
END_TEST

/* Past the exactness limit the answer is conservative ("overlap") unless
 * the strides are nested; nested layouts are exact at any size. */
START_TEST(test_overlap_limit)
{
    fg_view v = {(const char *)0x1000, 4, 3, {1 << 10, 1 << 10, 2},
                 {1, 1 << 10, (int64_t)1 << 20}};
    ck_assert_int_eq(fg_view_self_overlaps(&v), 0); /* nested */
    /* Not nested, not overlapping (the top dim is peeled, 2^19 blocks
     * remain: over the limit). */
    fg_view w = {(const char *)0x1000, 4, 3, {1 << 9, 1 << 10, 1 << 9},
                 {3, 1000, 1 << 22}};
    ck_assert_int_eq(fg_view_self_overlaps(&w), 1);
    w.ext[0] = 1 << 7; /* 2^17 blocks: decided exactly */
    ck_assert_int_eq(fg_view_self_overlaps(&w), 0);
}
END_TEST

/* The reported false rejection: O strides (76, 84, 95), B = H = Nq = 2,
 * d = 8, plus random strided O layouts of that size through the API: a call
 * is refused exactly when O aliases itself, and the accepted ones match
 * the reference. */
START_TEST(test_attention_strided_outputs)
{
    enum { B = 2, N = 2, H = 2, D = 8, E = B * N * H * D };
    fgt_rng r = fgt_rng_for(41);
    double q[E], k[E], v[E], ro[E], rm[B * H * N], rl[B * H * N];
    fgt_fill(q, E, &r, 1.0);
    fgt_fill(k, E, &r, 1.0);
    fgt_fill(v, E, &r, 1.0);
    naive_shape ns = {B, N, N, H, H, D, 1.0 / sqrt(D), 0, 0, NULL};
    naive_attention_forward(&ns, q, k, v, ro, rm, rl);
    static double obuf[4096];
    double m[B * H * N], l[B * H * N];
    fg_attn_params p;
    fg_attn_params_init(&p, B, N, N, H, H, D);
    fg_attn_tensor tq = fg_attn_bshd(q, FG_FP64, N, H, D);
    fg_attn_tensor tk = fg_attn_bshd(k, FG_FP64, N, H, D);
    fg_attn_tensor tv = fg_attn_bshd(v, FG_FP64, N, H, D);
    fg_attn_stats st = {m, l, FG_FP64};
    int accepted = 0;
    for (int it = 0; it < 3000; it++) {
        int64_t s[3] = {76, 84, 95};
        if (it > 0)
            for (int x = 0; x < 3; x++)
                s[x] = fgt_int(&r, 0, 120);
        fg_attn_tensor to = {obuf, FG_FP64, s[0], s[1], s[2]};
        fg_view ov = {(const char *)obuf, 8, 4, {B, N, H, D},
                      {s[0], s[1], s[2], 1}};
        const int aliases = brute_self(&ov);
        fgt_poison_d(obuf, 4096);
        const fg_status got = fg_attention_forward(&p, &tq, &tk, &tv, &to, &st);
        ck_assert_msg(got == (aliases ? FG_ERR_INVALID_ARGUMENT : FG_OK),
                      "strides (%lld, %lld, %lld): %s (%s)", (long long)s[0],
                      (long long)s[1], (long long)s[2], fg_status_string(got),
                      fg_last_error());
        if (got != FG_OK)
            continue;
        accepted++;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < N; i++)
                for (int h = 0; h < H; h++)
                    for (int x = 0; x < D; x++) {
                        const double o = obuf[b * s[0] + i * s[1] + h * s[2] + x];
                        const double want = ro[((b * N + i) * H + h) * D + x];
                        ck_assert_msg(fabs(o - want) <= 1e-13,
                                      "strides (%lld, %lld, %lld): O %g vs %g",
                                      (long long)s[0], (long long)s[1],
                                      (long long)s[2], o, want);
                    }
    }
    ck_assert_int_gt(accepted, 100);
}
END_TEST

/* ---- variant parameters at the edges of their range --------------------- */

/* O, dq, dk, dv (host, concatenated) of fg_attention with options o on
 * fixed fp64 inputs; NULL when the call is refused. */
static double *attn_run(const fg_attention_options *o, fg_status *status)
{
    enum { B = 1, N = 37, H = 2, D = 8, E = B * N * H * D };
    fgt_rng r = fgt_rng_for(53);
    const int64_t shape[4] = {B, N, H, D};
    fg_tensor *q = fgt_rand(&r, FG_FP64, 4, shape, 1.5, 0.01, 1),
              *k = fgt_rand(&r, FG_FP64, 4, shape, 1.5, 0.01, 1),
              *v = fgt_rand(&r, FG_FP64, 4, shape, 1.5, 0.01, 1),
              *g = fgt_rand(&r, FG_FP64, 4, shape, 1.0, 0.01, 0), *out = NULL;
    double *res = NULL;
    *status = fg_attention(q, k, v, o, &out);
    if (*status == FG_OK) {
        FGT_OK(fg_backward_with(out, g));
        res = malloc(sizeof(double) * 4 * E);
        fg_tensor *t[4] = {out, fg_tensor_grad(q), fg_tensor_grad(k),
                           fg_tensor_grad(v)};
        for (int i = 0; i < 4; i++) {
            double *h = fgt_host(t[i]);
            memcpy(res + i * E, h, sizeof(double) * E);
            free(h);
        }
    }
    fg_tensor *all[] = {q, k, v, g, out};
    fgt_free_all(all, 5);
    return res;
}

/* A window of INT64_MAX overflowed i' +- window into an empty band: zero
 * output (window_right) or, causal, a right forward with zero gradients
 * (window_left). A window of 2^62 or more is now unbounded: bit for bit
 * the result without one. */
START_TEST(test_huge_window)
{
    const int64_t n4 = 4 * 1 * 37 * 2 * 8;
    const int64_t wins[] = {INT64_MAX, INT64_MAX - 1, (int64_t)1 << 62};
    for (int causal = 0; causal < 2; causal++)
        for (int side = 0; side < 2; side++)
            for (int w = 0; w < 3; w++) {
                fg_attention_options o;
                fg_attention_options_init(&o);
                o.causal = causal;
                fg_status s;
                double *want = attn_run(&o, &s);
                ck_assert(want != NULL);
                if (side)
                    o.window_left = wins[w];
                else
                    o.window_right = wins[w];
                double *got = attn_run(&o, &s);
                ck_assert_msg(got != NULL, "window %lld: %s", (long long)wins[w],
                              fg_last_error());
                for (int64_t i = 0; i < n4; i++)
                    ck_assert_msg(got[i] == want[i],
                                  "causal %d, window_%s %lld: element %lld "
                                  "%g, unbounded %g",
                                  causal, side ? "left" : "right",
                                  (long long)wins[w], (long long)i, got[i],
                                  want[i]);
                free(want);
                free(got);
            }
    /* Just below 2^62 is still a bound, and a safe one: a window of
     * 2^62 - 1 sees everything too. */
    fg_attention_options o;
    fg_attention_options_init(&o);
    fg_status s;
    double *want = attn_run(&o, &s);
    o.window_left = o.window_right = ((int64_t)1 << 62) - 1;
    double *got = attn_run(&o, &s);
    ck_assert(got != NULL);
    for (int64_t i = 0; i < n4; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= 1e-12 * (1 + fabs(want[i])),
                      "window 2^62 - 1: element %lld %g vs %g", (long long)i,
                      got[i], want[i]);
    free(want);
    free(got);
}
END_TEST

/* A softcap whose fp32 value or inverse is inf (or subnormal) made every
 * fp32 output NaN with FG_OK; fp64 takes the same bounds. */
START_TEST(test_softcap_range)
{
    static small_attn a;
    const fg_dtype dts[] = {FG_FP32, FG_FP64};
    const double bad[] = {1e300, (double)FLT_MAX * 2, 1e-39, 1e-300};
    for (int i = 0; i < 2; i++) {
        fg_attn_params p;
        for (int j = 0; j < 4; j++) {
            small_attn_init(&a, dts[i]);
            fg_attn_params_init(&p, PB, PN, PN, PH, PH, PD);
            p.softcap = bad[j];
            FGT_FAILS(fg_attention_forward(&p, &a.tq, &a.tk, &a.tv, &a.to,
                                           &a.st),
                      FG_ERR_INVALID_ARGUMENT);
            ck_assert(small_attn_untouched(&a));
        }
        const double good[] = {FLT_MIN, FLT_MAX};
        for (int j = 0; j < 2; j++) {
            small_attn_init(&a, dts[i]);
            fg_attn_params_init(&p, PB, PN, PN, PH, PH, PD);
            p.softcap = good[j];
            FGT_OK(fg_attention_forward(&p, &a.tq, &a.tk, &a.tv, &a.to, &a.st));
            const int n = PE;
            for (int e = 0; e < n; e++) {
                const double x = dts[i] == FG_FP32 ? ((float *)a.o)[e] : a.o[e];
                ck_assert_msg(isfinite(x), "softcap %g: O[%d] = %g", good[j],
                              e, x);
            }
        }
    }
}
END_TEST

/* eps below the smallest normal number of the compute type: a constant
 * row's rstd was inf in fp32, and its gradient NaN. */
START_TEST(test_layernorm_tiny_eps)
{
    fg_tensor *x32 = NULL, *x64 = NULL, *y = (fg_tensor *)0x1;
    FGT_OK(fg_tensor_full(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(3, 4), 0.5, &x32));
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(3, 4), 0.5, &x64));
    FGT_OK(fg_tensor_set_requires_grad(x32, 1));
    FGT_OK(fg_tensor_set_requires_grad(x64, 1));
    FGT_FAILS(fg_layernorm(x32, NULL, NULL, 1e-320, &y), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_layernorm(x32, NULL, NULL, FLT_MIN / 2, &y),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_layernorm(x64, NULL, NULL, 1e-320, &y), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(y, (fg_tensor *)0x1);
    fg_tensor *xs[] = {x32, x64};
    const double eps[] = {FLT_MIN, DBL_MIN};
    for (int i = 0; i < 2; i++) { /* the smallest accepted: all finite */
        fg_tensor *out = NULL, *loss = NULL;
        FGT_OK(fg_layernorm(xs[i], NULL, NULL, eps[i], &out));
        FGT_OK(fg_sum(out, NULL, 0, 0, &loss));
        FGT_OK(fg_backward(loss));
        double *h = fgt_host(out), *dx = fgt_host(fg_tensor_grad(xs[i]));
        for (int e = 0; e < 12; e++)
            ck_assert_msg(h[e] == 0 && isfinite(dx[e]), "eps %g: y %g, dx %g",
                          eps[i], h[e], dx[e]);
        free(h);
        free(dx);
        fg_tensor_free(out);
        fg_tensor_free(loss);
    }
    fg_tensor_free(x32);
    fg_tensor_free(x64);
}
END_TEST

/* A dropped NaN or inf was written as a literal 0: NaN in, 0 out. Now it
 * is multiplied by 0 (NaN, as PyTorch's x * mask * scale), forward and
 * backward, in fg_dropout and the fused fg_dropout_add. */
START_TEST(test_dropout_keeps_nan)
{
    enum { N = 64 };
    fg_tensor *x = NULL, *z = NULL, *y = NULL, *y2 = NULL, *l = NULL;
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(N), NAN, &x));
    FGT_OK(fg_tensor_set_requires_grad(x, 1));
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(N), 1.0, &z));
    FGT_OK(fg_dropout(x, 0.5, 3, 0, &y));
    FGT_OK(fg_dropout_add(z, x, 0.5, 3, 0, &y2));
    double *h = fgt_host(y), *h2 = fgt_host(y2);
    for (int i = 0; i < N; i++)
        ck_assert_msg(isnan(h[i]) && isnan(h2[i]), "element %d: %g, %g", i,
                      h[i], h2[i]);
    free(h);
    free(h2);
    /* backward: an inf upstream gradient through dropped elements */
    fg_tensor *g = NULL, *x1 = NULL, *y3 = NULL;
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(N), 2.0, &x1));
    FGT_OK(fg_tensor_set_requires_grad(x1, 1));
    FGT_OK(fg_dropout(x1, 0.5, 3, 0, &y3));
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(N), INFINITY, &g));
    FGT_OK(fg_backward_with(y3, g));
    double *dx = fgt_host(fg_tensor_grad(x1)), *fy = fgt_host(y3);
    for (int i = 0; i < N; i++) /* kept: 2 * 2 = 4 and inf; dropped: 0, NaN */
        ck_assert_msg(fy[i] == 4 ? dx[i] == INFINITY : fy[i] == 0 && isnan(dx[i]),
                      "element %d: y %g, dx %g", i, fy[i], dx[i]);
    free(dx);
    free(fy);
    fg_tensor *all[] = {x, z, y, y2, l, g, x1, y3};
    fgt_free_all(all, 8);
}
END_TEST

/* Tensor-layer edges from a probe: an arena of SIZE_MAX - 100 bytes
 * wrapped its chunk size to a 1-byte block (heap overflow at the first
 * tensor); a host buffer inside the tensor's own storage was read while it
 * was written; rand_uniform over [-1e308, 1e308) filled inf with FG_OK. */
START_TEST(test_tensor_layer_edges)
{
    fg_arena *a = (fg_arena *)0x1;
    const size_t huge[] = {SIZE_MAX - 100, SIZE_MAX, SIZE_MAX / 2 + 1};
    for (int i = 0; i < 3; i++) {
        FGT_FAILS(fg_arena_create(huge[i], &a), FG_ERR_OUT_OF_MEMORY);
        ck_assert_ptr_eq(a, (fg_arena *)0x1);
    }
    FGT_OK(fg_arena_create(1 << 16, &a));
    FGT_OK(fg_arena_push(a));
    fg_tensor *t = NULL;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(4, 4), &t));
    FGT_OK(fg_arena_pop(a));
    fg_arena_free(a);

    fg_tensor *m = NULL, *mt = NULL;
    const double v[4] = {1, 2, 3, 4};
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 2), &m));
    FGT_OK(fg_tensor_copy_from_host(m, FG_FP64, v, 4));
    FGT_OK(fg_transpose(m, 0, 1, &mt));
    double *own = fg_tensor_data(m);
    FGT_FAILS(fg_tensor_copy_to_host(mt, FG_FP64, own, 4),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_tensor_copy_from_host(mt, FG_FP64, own + 1, 2 * 2),
              FG_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 4; i++) /* untouched */
        ck_assert(own[i] == v[i]);
    double h[4];
    FGT_OK(fg_tensor_copy_to_host(mt, FG_FP64, h, 4));
    ck_assert(h[0] == 1 && h[1] == 3 && h[2] == 2 && h[3] == 4);

    fg_generator g;
    fg_generator_init(&g, 1);
    fg_tensor *r = (fg_tensor *)0x1;
    FGT_FAILS(fg_tensor_rand_uniform(&g, -1e308, 1e308, FG_FP64, FG_DEVICE_CPU,
                                     FG_SHAPE(8), &r),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(r, (fg_tensor *)0x1);
    fg_tensor *all[] = {m, mt};
    fgt_free_all(all, 2);
}
END_TEST

/* n_head was a divisor before it was checked (C / 0). */
START_TEST(test_nn_attention_bad_heads)
{
    fg_nn_attention a;
    fg_generator gen;
    fg_generator_init(&gen, 5);
    FGT_OK(fg_nn_attention_init(&a, 16, 2, 0.0, 0.02, &gen, FG_FP32,
                                FG_DEVICE_CPU));
    fg_tensor *x = NULL, *y = (fg_tensor *)0x1;
    FGT_OK(fg_tensor_full(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(1, 3, 16), 0.25, &x));
    const int64_t heads[] = {0, -2, 3};
    for (int i = 0; i < 3; i++) {
        a.n_head = heads[i];
        FGT_FAILS(fg_nn_attention_forward(&a, x, NULL, &y),
                  FG_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_eq(y, (fg_tensor *)0x1);
    }
    a.n_head = 2;
    fg_nn_attention_release(&a);
    fg_tensor_free(x);
}
END_TEST

FGT_MAIN_BEGIN("reliability")
FGT_TEST(test_empty_with_huge_extents)
FGT_TEST(test_slice_steps)
FGT_TEST(test_concat_split_sums)
FGT_TEST(test_attention_param_bounds)
FGT_TEST(test_layout_overflow)
FGT_TEST(test_num_threads_capped)
FGT_TEST(test_empty_contiguous)
FGT_TEST(test_workspace_freed_at_thread_exit)
FGT_TEST(test_overlap_brute_force)
FGT_TEST(test_overlap_limit)
FGT_TEST(test_attention_strided_outputs)
FGT_TEST(test_huge_window)
FGT_TEST(test_softcap_range)
FGT_TEST(test_layernorm_tiny_eps)
FGT_TEST(test_nn_attention_bad_heads)
FGT_TEST(test_dropout_keeps_nan)
FGT_TEST(test_tensor_layer_edges)
FGT_MAIN_END()
