/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_step.c - the per-parameter work of a GPU training step
 * (issue 22): fg_cuda_zero_many zeroes exactly its ranges (odd sizes and
 * offsets, more than one launch's worth) and fg_zero_grad every gradient;
 * a bf16 cast's backward adding into the fp32 .grad equals the cast +
 * accumulation it replaces bit for bit (a no-op tensor hook forces the
 * general path); in bf16 autocast training every parameter's cached copy
 * equals fg_cast of the parameter bit for bit after each AdamW update,
 * which wrote it in place (the same buffer every step, nothing recast);
 * fg_linear (cuBLASLt bias epilogue forward, the bias gradient in the
 * weight gradient's BGRADA epilogue backward; one node) against an fp64
 * reference in fp64, fp32 and bf16, and its bias gradient accumulating
 * into an fp32 .grad under bf16 autocast over two backwards; fg_mlp
 * (GELU and bias gradients in epilogues) against an fp64 reference and
 * against the unfused kernels in fp64, fp32 and bf16; the GPU AdamW equal
 * to the CPU's bit for bit (vector and tail elements, fp32 and fp64).
 * Exits 77 without a GPU (CUDA is touched only inside the forked tests). */
#include <math.h>
#include <string.h>

#include "test_ops_util.h"

#include "flashgrad/cuda.h"
#include "kernels/runtime/device.h"
#include "lib/autograd/cuda_backend.h"
#include "lib/ops/cuda_ops_ew.h"
#include "lib/ops/ops_internal.h"
#include "lib/ops/ops_linear_internal.h"
#include "lib/train/train_internal.h"

START_TEST(test_zero_many)
{
    enum { NR = 300, BYTES = 1 << 22 };
    unsigned char *h = malloc(BYTES), *back = malloc(BYTES);
    fgt_rng r = fgt_rng_for(0x2e60);
    for (int i = 0; i < BYTES; i++)
        h[i] = (unsigned char)(1 + fgt_int(&r, 0, 254)); /* never zero */
    void *d = NULL;
    FGT_OK(fg_cuda_mem_alloc(BYTES, &d));
    FGT_OK(fg_cuda_memcpy_h2d(d, h, BYTES));
    void *ptrs[NR];
    size_t bytes[NR];
    size_t at = 0;
    for (int i = 0; i < NR; i++) { /* odd offsets, sizes 0 .. ~40 KiB */
        at += (size_t)fgt_int(&r, 0, 17);
        bytes[i] = i % 50 == 7 ? 40000 + (size_t)fgt_int(&r, 0, 99)
                               : (size_t)fgt_int(&r, 0, 3000);
        ck_assert(at + bytes[i] <= BYTES);
        ptrs[i] = (char *)d + at;
        memset(h + at, 0, bytes[i]);
        at += bytes[i];
    }
    FGT_OK(fg_cuda_zero_many(ptrs, bytes, NR));
    FGT_OK(fg_cuda_memcpy_d2h(back, d, BYTES));
    for (int i = 0; i < BYTES; i++)
        ck_assert_msg(back[i] == h[i], "byte %d: %u, want %u", i, back[i],
                      h[i]);
    fg_cuda_mem_free(d, BYTES);
    free(h);
    free(back);
}
END_TEST

START_TEST(test_zero_grad_many)
{
    enum { NT = 140 };
    fgt_rng r = fgt_rng_for(0x2e61);
    fg_tensor *ts[NT];
    for (int i = 0; i < NT; i++) {
        const fg_dtype dt = i % 3 ? FG_FP32 : FG_BF16;
        const int64_t n = 1 + fgt_int(&r, 0, i % 9 ? 300 : 20000);
        FGT_OK(fg_tensor_zeros(dt, FG_DEVICE_CUDA, FG_SHAPE(n), &ts[i]));
        FGT_OK(fg_tensor_set_requires_grad(ts[i], 1));
        fg_tensor *s = NULL; /* .grad = 1 through a backward */
        FGT_OK(fg_sum(ts[i], NULL, 0, 0, &s));
        FGT_OK(fg_backward(s));
        fg_tensor_free(s);
    }
    FGT_OK(fg_zero_grad(ts, NT));
    for (int i = 0; i < NT; i++) {
        double *h = fgt_host(fg_tensor_grad(ts[i]));
        for (int64_t j = 0; j < fg_tensor_numel(ts[i]); j++)
            ck_assert_msg(h[j] == 0 && !signbit(h[j]), "tensor %d [%lld]: %g",
                          i, (long long)j, h[j]);
        free(h);
    }
    fgt_free_all(ts, NT);
}
END_TEST

/* sum(x @ fg_cast(w, bf16) * u), backward (u: a random upstream). */
static void cast_step(fg_tensor *w, fg_tensor *x, fg_tensor *u)
{
    fg_tensor *wc = NULL, *y = NULL, *yu = NULL, *l = NULL;
    FGT_OK(fg_cast(w, FG_BF16, &wc));
    FGT_OK(fg_matmul(x, wc, 0, 0, &y));
    FGT_OK(fg_mul(y, u, &yu));
    FGT_OK(fg_sum(yu, NULL, 0, 0, &l));
    FGT_OK(fg_backward(l));
    fg_tensor *all[] = {wc, y, yu, l};
    fgt_free_all(all, 4);
}

START_TEST(test_cast_backward_direct)
{
    enum { M = 67, K = 45, N = 129 };
    fgt_rng r = fgt_rng_for(0x2e62);
    fg_tensor *wc = fgt_rand(&r, FG_FP64, FG_SHAPE(K, N), 1.0, 0.01, 0);
    fg_tensor *xc = fgt_rand(&r, FG_FP64, FG_SHAPE(M, K), 1.0, 0.01, 0);
    fg_tensor *uc = fgt_rand(&r, FG_FP64, FG_SHAPE(M, N), 1.0, 0.01, 0);
    fg_tensor *w = fgt_to_cuda(wc, FG_FP32, 1),
              *w2 = fgt_to_cuda(wc, FG_FP32, 1);
    fg_tensor *x = fgt_to_cuda(xc, FG_BF16, 0),
              *u = fgt_to_cuda(uc, FG_BF16, 0);
    fg_hook *h = NULL;
    FGT_OK(fg_tensor_register_hook(w2, fgt_noop_hook, NULL, &h));
    for (int k = 0; k < 3; k++) { /* k > 0: adds into an existing .grad */
        cast_step(w, x, u);
        cast_step(w2, x, u);
    }
    double *g = fgt_host(fg_tensor_grad(w)), *g2 = fgt_host(fg_tensor_grad(w2));
    ck_assert(memcmp(g, g2, sizeof(double) * K * N) == 0);
    ck_assert(fgt_all_finite(g, K * N));
    free(g);
    free(g2);
    fg_hook_remove(h);
    fg_tensor *all[] = {wc, xc, uc, w, w2, x, u};
    fgt_free_all(all, 7);
}
END_TEST

/* Every parameter's autocast copy: fg_cast's bits, current, and (after
 * the first step) the buffer the first step made. */
static void check_copies(const fg_gpt *m, void **seen, int first)
{
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    int with_copy = 0;
    for (int i = 0; i < n; i++) {
        fg_tensor *p = ps[i].tensor, *c = p->lowp, *ref = NULL;
        if (!c)
            continue;
        with_copy++;
        ck_assert_msg(p->lowp_version == p->storage->version &&
                          p->lowp_sversion == c->storage->version,
                      "%s: copy not current after AdamW", ps[i].name);
        if (first)
            seen[i] = fg_tensor_data(c);
        else
            ck_assert_msg(seen[i] == fg_tensor_data(c),
                          "%s: copy reallocated", ps[i].name);
        FGT_OK(fg_cast(p, FG_BF16, &ref));
        double *a = fgt_host(c), *b = fgt_host(ref);
        ck_assert_msg(!memcmp(a, b, sizeof(double) *
                                        (size_t)fg_tensor_numel(p)),
                      "%s: AdamW's copy differs from fg_cast", ps[i].name);
        free(a);
        free(b);
        fg_tensor_free(ref);
    }
    ck_assert_int_gt(with_copy, 0);
}

START_TEST(test_adamw_writes_copies)
{
    static const fg_sort_task task = {6, 10};
    enum { B = 16 };
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = fg_sort_task_vocab(&task);
    c.ctx = fg_sort_task_seqlen(&task);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 64;
    c.dropout = 0.1;
    c.device = FG_DEVICE_CUDA;
    fg_gpt *m = NULL;
    FGT_OK(fg_gpt_create(&c, 7, &m));
    fg_adamw *o = fgt_adamw_for(m);
    int n;
    fg_gpt_params(m, &n);
    fg_arena *a;
    FGT_OK(fg_arena_create(0, &a));
    fg_generator g;
    fg_generator_init(&g, 11);
    const int64_t T = fg_sort_task_seqlen(&task);
    int64_t *x = malloc(sizeof(int64_t) * B * (size_t)T),
            *y = malloc(sizeof(int64_t) * B * (size_t)T);
    void **seen = calloc((size_t)n, sizeof *seen);
    uint64_t r = fgt_base_seed() | 1;
    for (int step = 0; step < 4; step++) {
        FGT_OK(fg_sort_task_batch(&task, 0, &r, B, x, y));
        fg_step_stats st;
        FGT_OK(fg_autocast_begin(FG_BF16));
        FGT_OK(fg_gpt_train_step(m, o, x, y, B / 2, T, 2, 1.0, 3e-3, &g, a, /* 2 x B/2 rows */
                                 &st));
        FGT_OK(fg_autocast_end());
        ck_assert(isfinite(st.loss) && isfinite(st.grad_norm));
        check_copies(m, seen, step == 0);
    }
    free(seen);
    free(x);
    free(y);
    fg_arena_free(a);
    fg_adamw_free(o);
    fg_gpt_free(m);
}
END_TEST

/* fg_linear on the GPU (the bias in cuBLASLt's epilogue) against an fp64
 * reference on the same rounded values: y = x w + b, and with upstream u:
 * dx = u w^T, dw = x^T u, db = sum of u over rows. Errors are max-abs
 * relative to max |reference|; bf16 allows a few roundings of 2^-8 (the
 * inputs, the output, the gradients), fp32 1e-5, fp64 1e-12. */
static void check_linear(fg_dtype dt, double tol, int lt)
{
    enum { B = 3, T = 37, K = 64, N = 96, MR = B * T };
    fgt_rng r = fgt_rng_for(0x2e63 + dt);
    fg_tensor *xc = fgt_rand(&r, FG_FP64, FG_SHAPE(B, T, K), 1.0, 0.01, 0);
    fg_tensor *wc = fgt_rand(&r, FG_FP64, FG_SHAPE(K, N), 0.2, 0.001, 0);
    fg_tensor *bc = fgt_rand(&r, FG_FP64, FG_SHAPE(N), 1.0, 0.01, 0);
    fg_tensor *uc = fgt_rand(&r, FG_FP64, FG_SHAPE(B, T, N), 1.0, 0.01, 0);
    fg_tensor *x = fgt_to_cuda(xc, dt, 1), *w = fgt_to_cuda(wc, dt, 1),
              *b = fgt_to_cuda(bc, dt, 1), *u = fgt_to_cuda(uc, dt, 0),
              *y = NULL;
    double *hx = fgt_host(x), *hw = fgt_host(w), *hb = fgt_host(b),
           *hu = fgt_host(u); /* the values as rounded to dt */
    FGT_OK(fg_linear(x, w, b, &y));
    if (lt && dt != FG_FP64) /* cuBLASLt has the BIAS epilogue for these */
        ck_assert_str_eq(fg_node_name(fg_tensor_grad_fn(y)), "LinearBackward");
    FGT_OK(fg_backward_with(y, u));
    double *yr = calloc(MR * N, sizeof *yr), *dxr = calloc(MR * K, 8),
           *dwr = calloc(K * N, 8), *dbr = calloc(N, 8);
    for (int m = 0; m < MR; m++)
        for (int n = 0; n < N; n++) {
            double acc = hb[n];
            for (int k = 0; k < K; k++)
                acc += hx[m * K + k] * hw[k * N + n];
            yr[m * N + n] = acc;
            const double g = hu[m * N + n];
            dbr[n] += g;
            for (int k = 0; k < K; k++) {
                dxr[m * K + k] += g * hw[k * N + n];
                dwr[k * N + n] += hx[m * K + k] * g;
            }
        }
    const struct {
        const char *what;
        const fg_tensor *t;
        const double *ref;
        int64_t n;
    } outs[] = {{"y", y, yr, MR * N},
                {"dx", fg_tensor_grad(x), dxr, MR * K},
                {"dw", fg_tensor_grad(w), dwr, K * N},
                {"db", fg_tensor_grad(b), dbr, N}};
    for (int i = 0; i < 4; i++) {
        double *got = fgt_host(outs[i].t);
        const double err = fgt_max_diff(got, outs[i].ref, outs[i].n) /
                           fgt_max_abs(outs[i].ref, (size_t)outs[i].n);
        ck_assert_msg(err <= tol, "%s %s: error %.3g > %.3g",
                      fg_dtype_name(dt), outs[i].what, err, tol);
        free(got);
    }
    double *bufs[] = {hx, hw, hb, hu, yr, dxr, dwr, dbr};
    for (int i = 0; i < 8; i++)
        free(bufs[i]);
    fg_tensor *all[] = {xc, wc, bc, uc, x, w, b, u, y};
    fgt_free_all(all, 9);
}

/* A Linear test's fp64 operands, drawn in this order: x [B, T, K], w
 * [K, N], b [N] and the upstream gradient u [B, T, N]. */
static void linear_draw(fgt_rng *r, int64_t B, int64_t T, int64_t K,
                        int64_t N, fg_tensor **xc, fg_tensor **wc,
                        fg_tensor **bc, fg_tensor **uc)
{
    *xc = fgt_rand(r, FG_FP64, FG_SHAPE(B, T, K), 1.0, 0.01, 0);
    *wc = fgt_rand(r, FG_FP64, FG_SHAPE(K, N), 0.2, 0.001, 0);
    *bc = fgt_rand(r, FG_FP64, FG_SHAPE(N), 1.0, 0.01, 0);
    *uc = fgt_rand(r, FG_FP64, FG_SHAPE(B, T, N), 1.0, 0.01, 0);
}

/* The bias gradient from the weight gradient's epilogue (BGRADA) under
 * bf16 autocast: fp32 master w and b used through their cached bf16
 * copies, so the bf16 db the epilogue writes (overwriting a fresh buffer)
 * reaches b.grad through the cast's accumulation. Two backwards of two
 * graphs must leave twice one backward's gradients (PyTorch semantics:
 * .grad accumulates). Reference: fp64 sums of the bf16 values; each
 * backward rounds dw and db to bf16 once (2^-9 relative), so 2^-7 of
 * the largest entry. */
START_TEST(test_linear_bgrad_accumulates)
{
    enum { B = 2, T = 45, K = 64, N = 72, MR = B * T };
    fgt_rng r = fgt_rng_for(0x2e64);
    fg_tensor *xc, *wc, *bc, *uc;
    linear_draw(&r, B, T, K, N, &xc, &wc, &bc, &uc);
    fg_tensor *x = fgt_to_cuda(xc, FG_BF16, 0),
              *u = fgt_to_cuda(uc, FG_BF16, 0),
              *w = fgt_to_cuda(wc, FG_FP32, 1),
              *b = fgt_to_cuda(bc, FG_FP32, 1);
    double *hx = fgt_host(x), *hu = fgt_host(u), *dwr, *dbr;
    fgt_weight_grad_ref(hx, hu, MR, K, N, &dwr, &dbr);
    for (int pass = 1; pass <= 2; pass++) {
        fg_tensor *wa = NULL, *ba = NULL, *y = NULL;
        FGT_OK(fg_cast_param(w, FG_BF16, &wa));
        FGT_OK(fg_cast_param(b, FG_BF16, &ba));
        FGT_OK(fg_linear(x, wa, ba, &y));
        ck_assert_str_eq(fg_node_name(fg_tensor_grad_fn(y)), "LinearBackward");
        FGT_OK(fg_backward_with(y, u));
        const struct {
            const char *what;
            const fg_tensor *g;
            const double *ref;
            int n;
        } gs[] = {{"dw", fg_tensor_grad(w), dwr, K * N},
                  {"db", fg_tensor_grad(b), dbr, N}};
        for (int i = 0; i < 2; i++) {
            ck_assert(fg_tensor_dtype(gs[i].g) == FG_FP32);
            double *got = fgt_host(gs[i].g);
            for (int j = 0; j < gs[i].n; j++)
                got[j] /= pass;
            const double err = fgt_max_diff(got, gs[i].ref, gs[i].n) /
                               fgt_max_abs(gs[i].ref, (size_t)gs[i].n);
            ck_assert_msg(err <= 0.0078125, "pass %d %s: error %.3g", pass,
                          gs[i].what, err);
            free(got);
        }
        fg_tensor *all[] = {wa, ba, y};
        fgt_free_all(all, 3);
    }
    double *bufs[] = {hx, hu, dwr, dbr};
    for (int i = 0; i < 4; i++)
        free(bufs[i]);
    fg_tensor *all[] = {xc, wc, bc, uc, x, u, w, b};
    fgt_free_all(all, 8);
}
END_TEST

static double gelu_d(double v)
{
    return 0.5 * v * (1.0 + tanh(0.7978845608028654 *
                                 (v + 0.044715 * v * v * v)));
}
static double gelu_grad_d(double v)
{
    const double k = 0.7978845608028654, c = 0.044715,
                 t = tanh(k * (v + c * v * v * v));
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * c * v * v);
}

enum { MB = 3, MT = 37, MR = MB * MT, MC = 64, MH = 256, MD = 64 };

/* y = gelu(x w1 + b1) w2 + b2 and its gradients for upstream u, in fp64
 * loops over the given (already rounded) values: out[0] y, then dx, dw1,
 * db1, dw2, db2. */
static void mlp_reference(double *const *in, const double *u, double **out)
{
    const double *x = in[0], *w1 = in[1], *b1 = in[2], *w2 = in[3],
                 *b2 = in[4];
    double *h = calloc(MR * MH, 8), *dh = calloc(MR * MH, 8);
    for (int m = 0; m < MR; m++)
        for (int j = 0; j < MH; j++) {
            double acc = b1[j], da = 0;
            for (int k = 0; k < MC; k++)
                acc += x[m * MC + k] * w1[k * MH + j];
            h[m * MH + j] = acc;
            for (int d = 0; d < MD; d++)
                da += u[m * MD + d] * w2[j * MD + d];
            dh[m * MH + j] = da * gelu_grad_d(acc);
        }
    for (int m = 0; m < MR; m++) {
        for (int d = 0; d < MD; d++) {
            double acc = b2[d];
            for (int j = 0; j < MH; j++)
                acc += gelu_d(h[m * MH + j]) * w2[j * MD + d];
            out[0][m * MD + d] = acc;
            out[5][d] += u[m * MD + d];
        }
        for (int j = 0; j < MH; j++) {
            const double g = dh[m * MH + j], a = gelu_d(h[m * MH + j]);
            out[3][j] += g;
            for (int k = 0; k < MC; k++) {
                out[1][m * MC + k] += g * w1[k * MH + j];
                out[2][k * MH + j] += x[m * MC + k] * g;
            }
            for (int d = 0; d < MD; d++)
                out[4][j * MD + d] += a * u[m * MD + d];
        }
    }
    free(h);
    free(dh);
}

/* Element counts of the MLP reference's outputs: y, dx, dw1, db1, dw2, db2. */
static const int64_t mlp_n[6] = {MR * MD, MR * MC, MC * MH, MH, MH * MD, MD};

/* The upstream gradient: *uc drawn from r (fp64), *u on the device in dt,
 * *hu its rounded values; ref[0..5] the fp64 reference of y and the five
 * gradients from the inputs' values hv and hu (mlp_ref_free). */
static void mlp_upstream_ref(fgt_rng *r, fg_dtype dt, double *const *hv,
                             fg_tensor **uc, fg_tensor **u, double **hu,
                             double **ref)
{
    *uc = fgt_rand(r, FG_FP64, FG_SHAPE(MB, MT, MD), 1.0, 0.01, 0);
    *u = fgt_to_cuda(*uc, dt, 0);
    *hu = fgt_host(*u);
    for (int i = 0; i < 6; i++)
        ref[i] = calloc((size_t)mlp_n[i], 8);
    mlp_reference(hv, *hu, ref);
}

/* The host buffers of mlp_upstream_ref and the inputs' values. */
static void mlp_ref_free(double **ref, double **hv, double *hu)
{
    for (int i = 0; i < 6; i++)
        free(ref[i]);
    for (int i = 0; i < 5; i++)
        free(hv[i]);
    free(hu);
}

/* fg_mlp on the GPU (GELU_AUX_BIAS and BIAS forward; BGRADA for dw2/db2
 * and dw1/db1, DGELU and a plain GEMM backward) against the fp64
 * reference on the same rounded values and against the unfused kernels (fg_linear, fg_gelu,
 * fg_linear) on the GPU. Errors: max-abs relative to max |reference|.
 * tol: fp64 1e-12; fp32 1e-3 (cuBLASLt's GELU is the tanh form, but its
 * tanh may be a hardware approximation of ~2^-11; the measured errors are
 * printed); bf16 2^-5 (the inputs are exact, but h, gelu(h), y and every
 * gradient are rounded to bf16 once or twice on the way). */
static void check_mlp(fg_dtype dt, double tol)
{
    static const int64_t shapes[5][3] = {
        {MB, MT, MC}, {MC, MH, 0}, {MH, 0, 0}, {MH, MD, 0}, {MD, 0, 0}};
    static const int nds[5] = {3, 2, 1, 2, 1};
    static const double amp[5] = {1.5, 0.25, 0.5, 0.1, 0.5};
    static const char *const names[6] = {"y", "dx", "dw1", "db1", "dw2",
                                         "db2"};
    fgt_rng r = fgt_rng_for(0x2e65 + dt);
    fg_tensor *f[5], *uf[5], *hc[5];
    double *hv[5];
    for (int i = 0; i < 5; i++) {
        hc[i] = fgt_rand(&r, FG_FP64, nds[i], shapes[i], amp[i], 0.001, 0);
        f[i] = fgt_to_cuda(hc[i], dt, 1);
        uf[i] = fgt_to_cuda(hc[i], dt, 1);
        hv[i] = fgt_host(f[i]); /* the values as rounded to dt */
    }
    fg_tensor *uc, *u;
    double *hu, *ref[6];
    mlp_upstream_ref(&r, dt, hv, &uc, &u, &hu, ref);
    const int64_t *n = mlp_n;
    fg_tensor *y = NULL, *yu = NULL, *h = NULL, *a = NULL;
    FGT_OK(fg_mlp(f[0], f[1], f[2], f[3], f[4], &y));
    ck_assert_str_eq(fg_node_name(fg_tensor_grad_fn(y)), "MlpBackward");
    FGT_OK(fg_backward_with(y, u));
    FGT_OK(fg_linear(uf[0], uf[1], uf[2], &h));
    FGT_OK(fg_gelu(h, &a));
    FGT_OK(fg_linear(a, uf[3], uf[4], &yu));
    FGT_OK(fg_backward_with(yu, u));
    for (int i = 0; i < 6; i++) {
        const fg_tensor *got = i ? fg_tensor_grad(f[i - 1]) : y,
                        *unf = i ? fg_tensor_grad(uf[i - 1]) : yu;
        double *g = fgt_host(got), *gu = fgt_host(unf);
        const double scale = fgt_max_abs(ref[i], (size_t)n[i]),
                     err = fgt_max_diff(g, ref[i], n[i]) / scale,
                     err_u = fgt_max_diff(g, gu, n[i]) / scale;
        fprintf(stderr, "fg_mlp %s %s: error %.3g (fused vs unfused %.3g)\n",
                fg_dtype_name(dt), names[i], err, err_u);
        ck_assert_msg(err <= tol && err_u <= tol,
                      "%s %s: error %.3g, vs unfused %.3g > %.3g",
                      fg_dtype_name(dt), names[i], err, err_u, tol);
        free(g);
        free(gu);
    }
    mlp_ref_free(ref, hv, hu);
    fgt_free_all(f, 5);
    fgt_free_all(uf, 5);
    fgt_free_all(hc, 5);
    fg_tensor *all[] = {uc, u, y, yu, h, a};
    fgt_free_all(all, 6);
}

/* Loop index 1 of both: FG_GEMM_LT=0, the unfused paths (where cuBLASLt
 * has no algorithm), against the same references. */
START_TEST(test_mlp_epilogues)
{
    if (_i == 1)
        setenv("FG_GEMM_LT", "0", 1);
    else
        fgt_switch_restore("FG_GEMM_LT");
    check_mlp(FG_FP64, 1e-12);
    check_mlp(FG_FP32, 1e-3);
    check_mlp(FG_BF16, 0.03125);
}
END_TEST

START_TEST(test_linear_epilogue)
{
    if (_i == 1) /* unfused: the bias is its own op (AddBackward) */
        setenv("FG_GEMM_LT", "0", 1);
    else
        fgt_switch_restore("FG_GEMM_LT");
    check_linear(FG_FP64, 1e-12, _i == 0);
    check_linear(FG_FP32, 1e-5, _i == 0);
    check_linear(FG_BF16, 3 * 0.0078125, _i == 0);
}
END_TEST

/* 0 if the two tensors hold the same bits (compared as fp64 on the host:
 * exact for fp32, bf16). */
static int same_bits(const fg_tensor *a, const fg_tensor *b)
{
    const int64_t n = fg_tensor_numel(a);
    double *ha = fgt_host(a), *hb = fgt_host(b);
    const int d = n != fg_tensor_numel(b) ||
                  memcmp(ha, hb, sizeof(double) * (size_t)n) != 0;
    free(ha);
    free(hb);
    return d;
}

/* fg_cuda_col_sums (the bias gradients of fp16 / bf16 layers) against fp64
 * sums of the same 16-bit values: fp32 out within 1e-4 of the column's sum
 * of magnitudes (fp32 sums of chunks of rows, then of the chunks),
 * out in x's dtype within its rounding on top. Shapes: the 16-byte path
 * (columns a multiple of 8: a partial 256-column tile, many row chunks)
 * and the scalar one (13 columns, one row, rows not a multiple of the
 * chunk). Every output poisoned first; a second call gives the same bits;
 * accumulating into 0.375 gives 0.375 + the fresh sum, rounded once in
 * fp32 (fg_grad_accumulate's add, which the master layers' bias gradient
 * saves). */
START_TEST(test_col_sums)
{
    static const int64_t cases[][2] = {
        {1, 13}, {37, 768}, {8191, 40}, {1000, 13}, {20000, 2304}, {0, 24}};
    fgt_rng r = fgt_rng_for(0x2e69);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int k = 0; k < 3; k++) {
            const fg_dtype dt = k == 1 ? FG_FP16 : FG_BF16,
                           odt = k == 2 ? FG_BF16 : FG_FP32;
            const int64_t R = cases[c][0], C = cases[c][1], shape[2] = {R, C};
            fg_tensor *xc = fgt_rand(&r, FG_FP64, 2, shape, 2.0, 0.0, 0);
            fg_tensor *x = fgt_to_cuda(xc, dt, 0), *o1 = NULL, *o2 = NULL,
                      *o3 = NULL;
            FGT_OK(fg_tensor_zeros(odt, FG_DEVICE_CUDA, 1, &C, &o1));
            FGT_OK(fg_tensor_zeros(odt, FG_DEVICE_CUDA, 1, &C, &o2));
            FGT_OK(fg_tensor_zeros(odt, FG_DEVICE_CUDA, 1, &C, &o3));
            FGT_OK(fg_tensor_fill(o1, NAN));
            FGT_OK(fg_tensor_fill(o2, NAN));
            FGT_OK(fg_tensor_fill(o3, 0.375));
            FGT_OK(fg_cuda_col_sums(o1, x, 0));
            FGT_OK(fg_cuda_col_sums(o2, x, 0));
            FGT_OK(fg_cuda_col_sums(o3, x, 1));
            double *hx = fgt_host(x), *got = fgt_host(o1),
                   *acc = fgt_host(o3);
            for (int64_t j = 0; j < C; j++) {
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < R; i++) {
                    ref += hx[i * C + j];
                    mag += fabs(hx[i * C + j]);
                }
                const double tol = 1e-4 * mag +
                                   (odt == FG_BF16 ? 0.0078125 * fabs(ref) : 0);
                ck_assert_msg(fabs(got[j] - ref) <= tol,
                              "rows %lld cols %lld (%s -> %s) column %lld: "
                              "%.9g against %.9g",
                              (long long)R, (long long)C, fg_dtype_name(dt),
                              fg_dtype_name(odt), (long long)j, got[j], ref);
            }
            ck_assert_msg(!same_bits(o1, o2), "rows %lld cols %lld: a second "
                          "call gave other bits", (long long)R, (long long)C);
            for (int64_t j = 0; odt == FG_FP32 && j < C; j++) {
                const float want = 0.375f + (float)got[j];
                ck_assert_msg((float)acc[j] == want,
                              "rows %lld cols %lld column %lld: accumulated "
                              "%.9g, want %.9g",
                              (long long)R, (long long)C, (long long)j,
                              acc[j], (double)want);
            }
            free(hx);
            free(got);
            free(acc);
            fg_tensor *all[] = {xc, x, o1, o2, o3};
            fgt_free_all(all, 5);
        }
    }
}
END_TEST

/* fg_linear_master (the nn Linear under bf16 autocast): y and dx are the
 * cast path's bits (fg_cast_param + fg_linear: the same cached copies and
 * GEMMs); dW and db reach the fp32 parameters unrounded. Reference: fp64
 * sums over the bf16 values of x and u (the fp32 GEMM's error is about
 * rows * 2^-24 relative: 1e-5 bounds it at 8192 rows). Two backwards of
 * two graphs: the second adds into .grad inside the GEMM (C += x^T gy,
 * out-of-place split-K); parameters with a tensor hook take the general
 * path (a fresh fp32 gradient, then the engine's addition), and the two
 * must agree bit for bit (the engine's backward_acc contract). 8192 rows
 * against a 128 x 192 weight: the long-K shape that uses split-K. Loop
 * index: cuBLASLt's own split with db by fg_cuda_col_sums, then the
 * unfused path that runs where cuBLASLt has no algorithm (FG_GEMM_LT=0),
 * then db in the GEMM's epilogue (FG_GEMM_BGRAD=1). A switch is read once per
 * process: each test runs in a child of its own (under CK_FORK=no, the
 * sanitizer runs', the first setting holds). */
START_TEST(test_linear_master)
{
    if (_i == 1) /* the unfused path (cuBLASLt refused) */
        setenv("FG_GEMM_LT", "0", 1);
    if (_i == 2) /* db in the GEMM's epilogue instead of fg_cuda_col_sums */
        setenv("FG_GEMM_BGRAD", "1", 1);
    enum { B = 4, T = 2048, K = 128, N = 192, MR = B * T };
    fgt_rng r = fgt_rng_for(0x2e66);
    fg_tensor *xc, *wc, *bc, *uc;
    linear_draw(&r, B, T, K, N, &xc, &wc, &bc, &uc);
    /* x, p[0], p[1]: x, w, b; xh, p[2], p[3]: hooked twins; xr, p[4],
     * p[5]: the cast path */
    fg_tensor *x = fgt_to_cuda(xc, FG_BF16, 1),
              *xh = fgt_to_cuda(xc, FG_BF16, 1),
              *xr = fgt_to_cuda(xc, FG_BF16, 1),
              *u = fgt_to_cuda(uc, FG_BF16, 0);
    fg_tensor *p[6];
    for (int i = 0; i < 6; i++)
        p[i] = fgt_to_cuda(i % 2 ? bc : wc, FG_FP32, 1);
    fg_hook *hk[2] = {NULL, NULL};
    FGT_OK(fg_tensor_register_hook(p[2], fgt_noop_hook, NULL, &hk[0]));
    FGT_OK(fg_tensor_register_hook(p[3], fgt_noop_hook, NULL, &hk[1]));
    double *hx = fgt_host(x), *hu = fgt_host(u), *dwr, *dbr;
    fgt_weight_grad_ref(hx, hu, MR, K, N, &dwr, &dbr);
    for (int pass = 1; pass <= 2; pass++) {
        fg_tensor *y = NULL, *y2 = NULL, *yc = NULL, *wa = NULL, *ba = NULL;
        FGT_OK(fg_linear_master(x, p[0], p[1], &y));
        ck_assert_str_eq(fg_node_name(fg_tensor_grad_fn(y)), "LinearBackward");
        FGT_OK(fg_linear_master(xh, p[2], p[3], &y2));
        FGT_OK(fg_cast_param(p[4], FG_BF16, &wa));
        FGT_OK(fg_cast_param(p[5], FG_BF16, &ba));
        FGT_OK(fg_linear(xr, wa, ba, &yc));
        ck_assert(fg_tensor_dtype(y) == FG_BF16);
        ck_assert_msg(!same_bits(y, yc), "y differs from the cast path");
        FGT_OK(fg_backward_with(y, u));
        FGT_OK(fg_backward_with(y2, u));
        FGT_OK(fg_backward_with(yc, u));
        ck_assert_msg(!same_bits(fg_tensor_grad(x), fg_tensor_grad(xr)),
                      "pass %d: dx differs from the cast path", pass);
        const double *refs[2] = {dwr, dbr};
        const int64_t ns[2] = {K * N, N};
        for (int i = 0; i < 2; i++) {
            const fg_tensor *g = fg_tensor_grad(p[i]);
            ck_assert(fg_tensor_dtype(g) == FG_FP32);
            ck_assert_msg(!same_bits(g, fg_tensor_grad(p[2 + i])),
                          "pass %d: %s by the GEMM's C += differs from the "
                          "engine's addition",
                          pass, i ? "db" : "dw");
            double *got = fgt_host(g);
            for (int j = 0; j < ns[i]; j++)
                got[j] /= pass;
            const double err = fgt_max_diff(got, refs[i], ns[i]) /
                               fgt_max_abs(refs[i], (size_t)ns[i]);
            fprintf(stderr, "fg_linear_master (%s) pass %d %s: error %.3g\n",
                    _i == 1 ? "unfused" : _i == 2 ? "BGRAD epilogue"
                                                  : "cuBLASLt",
                    pass, i ? "db" : "dw", err);
            ck_assert_msg(err <= 1e-5, "pass %d %s: error %.3g", pass,
                          i ? "db" : "dw", err);
            free(got);
        }
        fg_tensor *all[] = {y, y2, yc, wa, ba};
        fgt_free_all(all, 5);
    }
    fg_hook_remove(hk[0]);
    fg_hook_remove(hk[1]);
    double *bufs[] = {hx, hu, dwr, dbr};
    for (int i = 0; i < 4; i++)
        free(bufs[i]);
    fgt_free_all(p, 6);
    fg_tensor *all[] = {xc, wc, bc, uc, x, xh, xr, u};
    fgt_free_all(all, 8);
}
END_TEST

/* fg_mlp_master against fg_mlp on the cast parameters: y and dx bit for
 * bit; the four parameter gradients in fp32 within the bf16 bound of
 * check_mlp (2^-5 of the largest entry: h, gelu(h) and dh are bf16 on
 * both paths) of the fp64 reference, and hooked twins (general path) bit
 * for bit equal, over two backwards. Loop index 1: the unfused path
 * (FG_GEMM_LT=0, as where cuBLASLt has no algorithm). */
START_TEST(test_mlp_master)
{
    if (_i == 1)
        setenv("FG_GEMM_LT", "0", 1);
    static const int64_t shapes[5][3] = {
        {MB, MT, MC}, {MC, MH, 0}, {MH, 0, 0}, {MH, MD, 0}, {MD, 0, 0}};
    static const int nds[5] = {3, 2, 1, 2, 1};
    static const double amp[5] = {1.5, 0.25, 0.5, 0.1, 0.5};
    static const char *const names[5] = {"dx", "dw1", "db1", "dw2", "db2"};
    fgt_rng r = fgt_rng_for(0x2e67);
    fg_tensor *hc[5], *m[5], *t[5], *c[5];
    double *hv[5];
    for (int i = 0; i < 5; i++) {
        hc[i] = fgt_rand(&r, FG_FP64, nds[i], shapes[i], amp[i], 0.001, 0);
        const fg_dtype dt = i ? FG_FP32 : FG_BF16;
        m[i] = fgt_to_cuda(hc[i], dt, 1);
        t[i] = fgt_to_cuda(hc[i], dt, 1); /* hooked twins (t[0]: x unused) */
        c[i] = fgt_to_cuda(hc[i], dt, 1); /* the cast path */
        double *h = fgt_host(m[i]);
        if (i) { /* the reference uses the bf16 copies' values */
            fg_tensor *lo = NULL;
            FGT_OK(fg_cast(m[i], FG_BF16, &lo));
            free(h);
            h = fgt_host(lo);
            fg_tensor_free(lo);
        }
        hv[i] = h;
    }
    fg_hook *hk[4];
    for (int i = 0; i < 4; i++)
        FGT_OK(fg_tensor_register_hook(t[i + 1], fgt_noop_hook, NULL, &hk[i]));
    fg_tensor *uc, *u;
    double *hu, *ref[6];
    mlp_upstream_ref(&r, FG_BF16, hv, &uc, &u, &hu, ref);
    const int64_t *n = mlp_n;
    for (int pass = 1; pass <= 2; pass++) {
        fg_tensor *y = NULL, *y2 = NULL, *yc = NULL, *ca[4] = {NULL};
        FGT_OK(fg_mlp_master(m[0], m[1], m[2], m[3], m[4], &y));
        ck_assert_str_eq(fg_node_name(fg_tensor_grad_fn(y)), "MlpBackward");
        FGT_OK(fg_mlp_master(m[0], t[1], t[2], t[3], t[4], &y2));
        for (int i = 0; i < 4; i++)
            FGT_OK(fg_cast_param(c[i + 1], FG_BF16, &ca[i]));
        FGT_OK(fg_mlp(c[0], ca[0], ca[1], ca[2], ca[3], &yc));
        ck_assert_msg(!same_bits(y, yc), "y differs from the cast path");
        FGT_OK(fg_backward_with(y, u));
        FGT_OK(fg_backward_with(y2, u));
        FGT_OK(fg_backward_with(yc, u));
        for (int i = 0; i < 5; i++) {
            const fg_tensor *g = fg_tensor_grad(m[i]);
            if (i == 0) { /* x got both y's and y2's gradients */
                fg_tensor *half = NULL;
                FGT_OK(fg_scale(fg_tensor_grad(m[0]), 0.5, &half));
                ck_assert_msg(!same_bits(half, fg_tensor_grad(c[0])),
                              "pass %d: dx differs from the cast path", pass);
                fg_tensor_free(half);
                continue;
            }
            ck_assert(fg_tensor_dtype(g) == FG_FP32);
            ck_assert_msg(!same_bits(g, fg_tensor_grad(t[i])),
                          "pass %d: %s by backward_acc differs from the "
                          "general path",
                          pass, names[i]);
            double *got = fgt_host(g);
            for (int j = 0; j < n[i + 1]; j++)
                got[j] /= pass;
            const double err =
                fgt_max_diff(got, ref[i + 1], n[i + 1]) /
                fgt_max_abs(ref[i + 1], (size_t)n[i + 1]);
            fprintf(stderr, "fg_mlp_master pass %d %s: error %.3g\n", pass,
                    names[i], err);
            ck_assert_msg(err <= 0.03125, "pass %d %s: error %.3g", pass,
                          names[i], err);
            free(got);
        }
        fg_tensor *all[] = {y, y2, yc};
        fgt_free_all(all, 3);
        fgt_free_all(ca, 4);
    }
    for (int i = 0; i < 4; i++)
        fg_hook_remove(hk[i]);
    mlp_ref_free(ref, hv, hu);
    fgt_free_all(hc, 5);
    fgt_free_all(m, 5);
    fgt_free_all(t, 5);
    fgt_free_all(c, 5);
    fg_tensor *all[] = {uc, u};
    fgt_free_all(all, 2);
}
END_TEST

/* The GPU AdamW against the CPU's, bit for bit (optim_cuda.cu mirrors
 * lib/train/optim.c rounding by rounding): fp32 and fp64 parameters whose
 * lengths leave tails past the 16-byte vectors and cross the 4096-element
 * chunks, with and without weight decay, over three steps with fresh
 * gradients (.grad = u through sum(p * u), exact). */
START_TEST(test_adamw_matches_cpu)
{
    enum { NP = 5 };
    fgt_rng r = fgt_rng_for(0xada3);
    const int64_t len[NP] = {4097, 3, 64 * 33, 129, 8195};
    const fg_dtype dts[NP] = {FG_FP32, FG_FP32, FG_FP32, FG_FP64, FG_FP64};
    fg_tensor *p[2][NP];
    fg_param par[2][NP];
    for (int i = 0; i < NP; i++) {
        p[0][i] = fgt_rand(&r, dts[i], FG_SHAPE(len[i]), 1.0, 0.0, 1);
        p[1][i] = fgt_to_cuda(p[0][i], dts[i], 1);
        for (int dv = 0; dv < 2; dv++) {
            memset(&par[dv][i], 0, sizeof par[dv][i]);
            par[dv][i].tensor = p[dv][i];
            par[dv][i].decay = i % 2;
            snprintf(par[dv][i].name, sizeof par[dv][i].name, "p%d", i);
        }
    }
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    fg_adamw *o[2] = {NULL, NULL};
    for (int dv = 0; dv < 2; dv++)
        FGT_OK(fg_adamw_create(par[dv], NP, &oc, &o[dv]));
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < NP; i++) {
            fg_tensor *u[2], *pu = NULL, *l = NULL;
            u[0] = fgt_rand(&r, dts[i], FG_SHAPE(len[i]), 1.0, 0.0, 0);
            u[1] = fgt_to_cuda(u[0], dts[i], 0);
            for (int dv = 0; dv < 2; dv++) {
                FGT_OK(fg_mul(p[dv][i], u[dv], &pu));
                FGT_OK(fg_sum(pu, NULL, 0, 0, &l));
                FGT_OK(fg_backward(l));
                fg_tensor_free(pu);
                fg_tensor_free(l);
            }
            fgt_free_all(u, 2);
        }
        for (int dv = 0; dv < 2; dv++) {
            FGT_OK(fg_adamw_step(o[dv], 1e-2));
            FGT_OK(fg_zero_grad(p[dv], NP));
        }
    }
    for (int i = 0; i < NP; i++) {
        fg_tensor *st[2][3];
        for (int dv = 0; dv < 2; dv++) {
            st[dv][0] = p[dv][i];
            FGT_OK(fg_adamw_state(o[dv], i, &st[dv][1], &st[dv][2]));
        }
        for (int w = 0; w < 3; w++) {
            double *a = fgt_host(st[0][w]), *b = fgt_host(st[1][w]);
            for (int64_t j = 0; j < len[i]; j++)
                ck_assert_msg(memcmp(&a[j], &b[j], sizeof(double)) == 0,
                              "param %d (%s) %s [%lld]: CPU %.17g, GPU %.17g",
                              i, fg_dtype_name(dts[i]), w ? (w == 1 ? "m" : "v") : "p",
                              (long long)j, a[j], b[j]);
            free(a);
            free(b);
        }
    }
    for (int dv = 0; dv < 2; dv++) {
        fg_adamw_free(o[dv]);
        fgt_free_all(p[dv], NP);
    }
}
END_TEST

/* The training step's fused clip + AdamW (fg_adamw_step_clip: the norm,
 * then the update scaling each gradient as it reads it) against
 * fg_clip_grad_norm + fg_adamw_step on the GPU: the same norm, parameters
 * and moments bit for bit, clipping (max_norm 0.5), not clipping (1e9)
 * and measuring only (0); .grad stays unscaled on the fused path. */
/* The fused-update tests' parameters: FFNP random tensors (fp32 and fp64,
 * odd and even sizes), `copies` identical sets on the GPU, each with an
 * AdamW of its own. */
enum { FNP = 4 };
static const int64_t flen[FNP] = {4097, 3, 2112, 130};
static const fg_dtype fdts[FNP] = {FG_FP32, FG_FP32, FG_FP64, FG_FP32};
static void param_copies(fgt_rng *r, int copies, fg_tensor *(*p)[FNP],
                         fg_param (*par)[FNP], fg_adamw **o)
{
    for (int i = 0; i < FNP; i++) {
        fg_tensor *c = fgt_rand(r, fdts[i], FG_SHAPE(flen[i]), 1.0, 0.0, 0);
        for (int f = 0; f < copies; f++) {
            p[f][i] = fgt_to_cuda(c, fdts[i], 1);
            memset(&par[f][i], 0, sizeof par[f][i]);
            par[f][i].tensor = p[f][i];
            par[f][i].decay = i % 2;
        }
        fg_tensor_free(c);
    }
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    for (int f = 0; f < copies; f++)
        FGT_OK(fg_adamw_create(par[f], FNP, &oc, &o[f]));
}

START_TEST(test_adamw_clip_fused)
{
    fgt_rng r = fgt_rng_for(0xc11f);
    const double maxn[3] = {0.5, 1e9, 0};
    fg_tensor *p[2][FNP];
    fg_param par[2][FNP];
    fg_adamw *o[2] = {NULL, NULL};
    param_copies(&r, 2, p, par, o);
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < FNP; i++) {
            fg_tensor *uc = fgt_rand(&r, fdts[i], FG_SHAPE(flen[i]), 1.0, 0.0, 0);
            fg_tensor *u = fgt_to_cuda(uc, fdts[i], 0), *pu = NULL, *l = NULL;
            for (int f = 0; f < 2; f++) {
                FGT_OK(fg_mul(p[f][i], u, &pu));
                FGT_OK(fg_sum(pu, NULL, 0, 0, &l));
                FGT_OK(fg_backward(l));
                fg_tensor_free(pu);
                fg_tensor_free(l);
            }
            fg_tensor_free(u);
            fg_tensor_free(uc);
        }
        double *g0 = fgt_host(fg_tensor_grad(p[1][0])), na = -1, nb = -2;
        FGT_OK(fg_clip_grad_norm(par[0], FNP, maxn[step], &na));
        FGT_OK(fg_adamw_step(o[0], 1e-2));
        FGT_OK(fg_adamw_step_clip(o[1], 1e-2, maxn[step], &nb));
        ck_assert_msg(memcmp(&na, &nb, sizeof na) == 0,
                      "step %d: norm %.17g, fused %.17g", step, na, nb);
        double *g1 = fgt_host(fg_tensor_grad(p[1][0]));
        ck_assert(memcmp(g0, g1, sizeof(double) * (size_t)flen[0]) == 0);
        free(g0);
        free(g1);
        for (int f = 0; f < 2; f++)
            FGT_OK(fg_zero_grad(p[f], FNP));
    }
    for (int i = 0; i < FNP; i++) {
        fg_tensor *st[2][3];
        for (int f = 0; f < 2; f++) {
            st[f][0] = p[f][i];
            FGT_OK(fg_adamw_state(o[f], i, &st[f][1], &st[f][2]));
        }
        for (int w = 0; w < 3; w++) {
            double *a = fgt_host(st[0][w]), *b = fgt_host(st[1][w]);
            ck_assert_msg(memcmp(a, b, sizeof(double) * (size_t)flen[i]) == 0,
                          "param %d, tensor %d: fused differs", i, w);
            free(a);
            free(b);
        }
    }
    for (int f = 0; f < 2; f++) {
        fg_adamw_free(o[f]);
        fgt_free_all(p[f], FNP);
    }
}
END_TEST

/* Loss scaling on the GPU: gradients of loss * 2^(10 + step) through
 * fg_adamw_step_unscale (the unscale folded into the fused update) give
 * the unscaled step's norm, parameters and moments bit for bit (clipping,
 * not clipping, measuring only); fg_grad_scaler_unscale (the clip
 * kernels) likewise against fg_clip_grad_norm; gradients that hold an inf
 * skip the step: nothing changes, the step count included, and the
 * gradients are left as they were. */
static void scaled_backward(fg_tensor *p, fg_tensor *u, double scale)
{
    fg_tensor *pu = NULL, *l = NULL, *ls = NULL;
    FGT_OK(fg_mul(p, u, &pu));
    FGT_OK(fg_sum(pu, NULL, 0, 0, &l));
    if (scale > 0x1p100) { /* in two: each factor stays finite in fp32 */
        fg_tensor *l1 = NULL;
        FGT_OK(fg_scale(l, 0x1p100, &l1));
        FGT_OK(fg_scale(l1, scale / 0x1p100, &ls));
        fg_tensor_free(l1);
    } else
        FGT_OK(fg_scale(l, scale, &ls));
    FGT_OK(fg_backward(ls));
    fg_tensor_free(pu);
    fg_tensor_free(l);
    fg_tensor_free(ls);
}

START_TEST(test_adamw_unscale_fused)
{
    enum { F = 3 }; /* plain, fused unscale, unscale + step */
    fgt_rng r = fgt_rng_for(0x5ca1e);
    const double maxn[3] = {0.5, 1e9, 0};
    fg_tensor *p[F][FNP];
    fg_param par[F][FNP];
    fg_adamw *o[F] = {NULL, NULL, NULL};
    param_copies(&r, F, p, par, o);
    fg_grad_scaler sc;
    fg_grad_scaler_init(&sc);
    for (int step = 0; step < 4; step++) {
        /* the last step's scale, 2^200 (two fg_scale of 2^100: one would
         * be refused as inf in fp32), overflows the fp32 gradients to inf */
        const double scale = ldexp(1, step < 3 ? 10 + step : 200);
        sc.scale = step < 3 ? scale : 1; /* for fg_grad_scaler_unscale */
        for (int i = 0; i < FNP; i++) {
            fg_tensor *uc = fgt_rand(&r, fdts[i], FG_SHAPE(flen[i]), 1.0, 0.0, 0);
            fg_tensor *u = fgt_to_cuda(uc, fdts[i], 0);
            for (int f = 0; f < F; f++)
                scaled_backward(p[f][i], u, f ? scale : 1.0);
            fg_tensor_free(u);
            fg_tensor_free(uc);
        }
        if (step == 3) {
            double *before[F][FNP];
            for (int f = 1; f < F; f++)
                for (int i = 0; i < FNP; i++)
                    before[f][i] = fgt_host(p[f][i]);
            double *g_before = fgt_host(fg_tensor_grad(p[2][0])), nb = 0;
            int skipped = 0, inf = 0;
            const int64_t t = fg_adamw_steps(o[1]);
            FGT_OK(fg_adamw_step_unscale(o[1], 1e-2, 0.5, 1.0 / scale, &nb,
                                         &skipped));
            ck_assert(skipped && !isfinite(nb));
            ck_assert_int_eq(fg_adamw_steps(o[1]), t);
            FGT_OK(fg_grad_scaler_unscale(&sc, par[2], FNP, 0.5, &nb, &inf));
            ck_assert(inf && !isfinite(nb));
            double *g_after = fgt_host(fg_tensor_grad(p[2][0]));
            ck_assert(!memcmp(g_before, g_after,
                              sizeof(double) * (size_t)flen[0]));
            free(g_before);
            free(g_after);
            for (int f = 1; f < F; f++)
                for (int i = 0; i < FNP; i++) {
                    double *now = fgt_host(p[f][i]);
                    ck_assert(!memcmp(now, before[f][i],
                                      sizeof(double) * (size_t)flen[i]));
                    free(now);
                    free(before[f][i]);
                }
            break;
        }
        double na = -1, nb = -2, nc = -3;
        int skipped = 1, inf = 1;
        FGT_OK(fg_adamw_step_clip(o[0], 1e-2, maxn[step], &na));
        FGT_OK(fg_adamw_step_unscale(o[1], 1e-2, maxn[step], 1.0 / scale,
                                     &nb, &skipped));
        FGT_OK(fg_grad_scaler_unscale(&sc, par[2], FNP, maxn[step], &nc,
                                      &inf));
        FGT_OK(fg_adamw_step(o[2], 1e-2));
        ck_assert(!skipped && !inf);
        ck_assert_msg(na == nb && na == nc, "step %d: norm %.17g, fused "
                      "unscale %.17g, unscale %.17g", step, na, nb, nc);
        for (int f = 0; f < F; f++)
            FGT_OK(fg_zero_grad(p[f], FNP));
    }
    for (int i = 0; i < FNP; i++) {
        fg_tensor *st[F][3];
        for (int f = 0; f < F; f++) {
            st[f][0] = p[f][i];
            FGT_OK(fg_adamw_state(o[f], i, &st[f][1], &st[f][2]));
        }
        for (int w = 0; w < 3; w++) {
            double *a = fgt_host(st[0][w]);
            for (int f = 1; f < F; f++) {
                double *b = fgt_host(st[f][w]);
                ck_assert_msg(!memcmp(a, b, sizeof(double) * (size_t)flen[i]),
                              "param %d, tensor %d: path %d differs", i, w, f);
                free(b);
            }
            free(a);
        }
    }
    for (int f = 0; f < F; f++) {
        fg_adamw_free(o[f]);
        fgt_free_all(p[f], FNP);
    }
}
END_TEST

/* Kernel switches the tests set, restored around each test (test_util.h:
 * under CK_FORK=no a failed test would leave them set). */
static const char *const g_switches[] = {"FG_GEMM_LT", "FG_GEMM_BGRAD"};

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU step suite\n");
        return 77;
    }
    fgt_base_seed();
    FGT_SWITCHES_SAVE(g_switches);
    Suite *s = suite_create("gpu_step");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, fgt_switches_restore, fgt_switches_restore);
    fgt_add_test(tc, test_zero_many);
    fgt_add_test(tc, test_zero_grad_many);
    fgt_add_test(tc, test_cast_backward_direct);
    fgt_add_test(tc, test_adamw_writes_copies);
    fgt_add_test(tc, test_adamw_matches_cpu);
    fgt_add_test(tc, test_adamw_clip_fused);
    fgt_add_test(tc, test_adamw_unscale_fused);
    fgt_add_loop(tc, test_linear_epilogue, 0, 2);
    fgt_add_test(tc, test_linear_bgrad_accumulates);
    fgt_add_loop(tc, test_mlp_epilogues, 0, 2);
    fgt_add_test(tc, test_col_sums);
    fgt_add_loop(tc, test_linear_master, 0, 3);
    fgt_add_loop(tc, test_mlp_master, 0, 2);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
