/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_attention.c - the CUDA attention kernels against the CPU
 * fp64 reference (itself checked against the naive computation in
 * test_attention_cpu). Exits 77 (skip) without a GPU; CUDA is touched only
 * inside the forked tests.
 *
 * Errors are relative to max(max |reference|, 0.1) (inputs are U(-1, 1);
 * the floor only matters for a reference that is zero up to cancellation,
 * e.g. dQ when Nk = 1). Tolerances:
 *   fp64 <= 1e-12, fp32 <= 1e-5;
 *   fp16/bf16 are judged against a naive implementation in the same dtype
 *   (tests/lowp.c: fp32 dot products, every intermediate rounded):
 *   - general kernels (fp32 inside, outputs rounded once):
 *       max error <= 1.0x the naive max error + half an ulp of max |ref|
 *     (the max alone is decided by how the largest outputs round, where the
 *     two land on either side of the exact value at random; doc/design.md),
 *     and RMS error <= 1.5x the naive RMS error as a guard against a
 *     systematic loss (typically 0.5-0.9x; one fresh-input run on short
 *     rows, Nk = 7 with dropout, measured 1.16x for dQ);
 *   - tensor-core kernels, which like FlashAttention-2/3 and cuDNN round P
 *     and dS to fp16/bf16 before the second product, so their error is of
 *     the naive one's size: max error <= 2x the naive max error (the bound
 *     FlashAttention-2's own tests use) + half an ulp of max |ref|, for the
 *     same reason as above (without it one fresh-input run, Nk = 7 with
 *     dropout, failed at 2.08x for dQ). */
#include <check.h>
#include <cuda_runtime.h>

#include "lowp.h"
#include "ref_dropout.h"
#include "test_util.h"
#include "flashgrad/cuda.h"

#define CK_CUDA(call)                                                       \
    do {                                                                    \
        cudaError_t e_ = (call);                                            \
        ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call,                   \
                      cudaGetErrorString(e_));                              \
    } while (0)

typedef struct gcase {
    int64_t B, Nq, Nk, H, Hk, d;
    int causal, bhsd;
    double p;
} gcase;

/* A device operand plus its host-side description. */
typedef struct dbuf {
    void *dev;
    fg_attn_tensor t; /* data = dev */
    size_t n;
} dbuf;

static fg_attn_tensor layout(const gcase *c, fg_dtype dt, void *ptr, int64_t S,
                             int64_t Hh)
{
    return c->bhsd ? fg_attn_bhsd(ptr, dt, S, Hh, c->d)
                   : fg_attn_bshd(ptr, dt, S, Hh, c->d);
}

/* Upload a BSHD double array into the case's layout and dtype; src NULL
 * gives a NaN-poisoned output buffer. */
static dbuf upload(const gcase *c, fg_dtype dt, const double *src, int64_t S,
                   int64_t Hh)
{
    dbuf b;
    b.n = (size_t)(c->B * S * Hh * c->d);
    const size_t bytes = b.n * fg_dtype_size(dt);
    CK_CUDA(cudaMalloc(&b.dev, bytes));
    b.t = layout(c, dt, b.dev, S, Hh);
    if (!src) {
        CK_CUDA(cudaMemset(b.dev, 0xff, bytes)); /* NaN in every dtype */
        return b;
    }
    void *host = malloc(bytes);
    for (int64_t bb = 0; bb < c->B; bb++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < Hh; h++)
                for (int64_t x = 0; x < c->d; x++)
                    fgt_store(dt, host, bb * b.t.stride_b + s * b.t.stride_s +
                                        h * b.t.stride_h + x,
                          src[((bb * S + s) * Hh + h) * c->d + x]);
    CK_CUDA(cudaMemcpy(b.dev, host, bytes, cudaMemcpyHostToDevice));
    free(host);
    return b;
}

static double *download(const gcase *c, fg_dtype dt, const dbuf *b, int64_t S,
                        int64_t Hh)
{
    const size_t bytes = b->n * fg_dtype_size(dt);
    void *host = malloc(bytes);
    CK_CUDA(cudaMemcpy(host, b->dev, bytes, cudaMemcpyDeviceToHost));
    double *out = malloc(b->n * sizeof(double));
    for (int64_t bb = 0; bb < c->B; bb++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < Hh; h++)
                for (int64_t x = 0; x < c->d; x++)
                    out[((bb * S + s) * Hh + h) * c->d + x] =
                        fgt_load(dt, host, bb * b->t.stride_b + s * b->t.stride_s +
                                           h * b->t.stride_h + x);
    free(host);
    return out;
}

/* Set by the deterministic-mode tests; reset_modes clears it. */
static int g_deterministic;

/* Each test starts from the suite's starting state, and leaves it
 * (CK_FORK=no: one process for all tests; test_util.h, kernel switches):
 * after test_deterministic every later test of a sanitizer run ran
 * deterministic before reset_modes. */
static const char *const g_switches[] = {"FG_ATTN_BWD_WIDE", "FG_ATTN_DET_DQ",
                                         "FG_ATTN_DET_COPIES", "FG_ATTN_KERNEL",
                                         "FG_ATTN_FWD_EPI", "FG_ATTN_BWD_EPI",
                                         "FG_ATTN_DET_ROTATE", "FG_ATTN_BWD_Q80"};

static void params_for(const gcase *c, fg_attn_params *p, uint64_t seed)
{
    fg_attn_params_init(p, c->B, c->Nq, c->Nk, c->H, c->Hk, c->d);
    p->deterministic = g_deterministic;
    p->causal = c->causal;
    p->dropout_p = c->p;
    p->seed = seed;
    p->offset = seed >> 7;
}

/* Q, K, V and dO of case c (BSHD, standard normal from rng), malloc'd. */
static void inputs_for(const gcase *c, fgt_rng *rng, double *in[4])
{
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t n[4] = {nq, nk, nk, nq};
    for (int i = 0; i < 4; i++) {
        in[i] = malloc(n[i] * 8);
        fgt_fill(in[i], n[i], rng, 1.0);
    }
}

/* Everything one case produces: [0] O, [1] dQ, [2] dK, [3] dV, and stats. */
typedef struct outs {
    double *t[4];
    double *m, *l;
} outs;

static void outs_free(outs *o)
{
    for (int i = 0; i < 4; i++)
        free(o->t[i]);
    free(o->m);
    free(o->l);
}

/* CPU fp64 reference through the public API (BSHD). */
static void cpu_ref(const gcase *c, const fg_attn_params *p0, double *in[4],
                    outs *r)
{
    fg_attn_params p = *p0;
    p.device = FG_DEVICE_CPU;
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    r->t[0] = malloc(nq * 8);
    r->t[1] = malloc(nq * 8);
    r->t[2] = malloc(nk * 8);
    r->t[3] = malloc(nk * 8);
    r->m = malloc(ns * 8);
    r->l = malloc(ns * 8);
    fg_attn_tensor tq = fg_attn_bshd(in[0], FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor tk = fg_attn_bshd(in[1], FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor tv = fg_attn_bshd(in[2], FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor tg = fg_attn_bshd(in[3], FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor to = fg_attn_bshd(r->t[0], FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor tdq = fg_attn_bshd(r->t[1], FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor tdk = fg_attn_bshd(r->t[2], FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor tdv = fg_attn_bshd(r->t[3], FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_stats st = {r->m, r->l, FG_FP64};
    ck_assert_msg(fg_attention_forward(&p, &tq, &tk, &tv, &to, &st) == FG_OK,
                  "cpu ref: %s", fg_last_error());
    ck_assert_msg(fg_attention_backward(&p, &tq, &tk, &tv, &to, &tg, &st, &tdq,
                                        &tdk, &tdv) == FG_OK,
                  "cpu ref: %s", fg_last_error());
}

/* Run the GPU forward + backward in dtype dt on inputs in[] (BSHD). */
static void gpu_run(const gcase *c, fg_dtype dt, const fg_attn_params *p0,
                    double *in[4], outs *r)
{
    fg_attn_params p = *p0;
    p.device = FG_DEVICE_CUDA;
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    dbuf q = upload(c, dt, in[0], c->Nq, c->H);
    dbuf k = upload(c, dt, in[1], c->Nk, c->Hk);
    dbuf v = upload(c, dt, in[2], c->Nk, c->Hk);
    dbuf g = upload(c, dt, in[3], c->Nq, c->H);
    dbuf o = upload(c, dt, NULL, c->Nq, c->H);
    dbuf dq = upload(c, dt, NULL, c->Nq, c->H);
    dbuf dk = upload(c, dt, NULL, c->Nk, c->Hk);
    dbuf dv = upload(c, dt, NULL, c->Nk, c->Hk);
    const fg_dtype sd = dt == FG_FP64 ? FG_FP64 : FG_FP32;
    const size_t ss = fg_dtype_size(sd);
    void *m, *l;
    CK_CUDA(cudaMalloc(&m, ns * ss));
    CK_CUDA(cudaMalloc(&l, ns * ss));
    CK_CUDA(cudaMemset(m, 0xff, ns * ss));
    CK_CUDA(cudaMemset(l, 0xff, ns * ss));
    fg_attn_stats st = {m, l, sd};
    ck_assert_msg(fg_attention_forward(&p, &q.t, &k.t, &v.t, &o.t, &st) == FG_OK,
                  "gpu fwd: %s", fg_last_error());
    ck_assert_msg(fg_attention_backward(&p, &q.t, &k.t, &v.t, &o.t, &g.t, &st,
                                        &dq.t, &dk.t, &dv.t) == FG_OK,
                  "gpu bwd: %s", fg_last_error());
    CK_CUDA(cudaDeviceSynchronize());
    r->t[0] = download(c, dt, &o, c->Nq, c->H);
    r->t[1] = download(c, dt, &dq, c->Nq, c->H);
    r->t[2] = download(c, dt, &dk, c->Nk, c->Hk);
    r->t[3] = download(c, dt, &dv, c->Nk, c->Hk);
    r->m = malloc(ns * 8);
    r->l = malloc(ns * 8);
    void *hm = malloc(ns * ss), *hl = malloc(ns * ss);
    CK_CUDA(cudaMemcpy(hm, m, ns * ss, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(hl, l, ns * ss, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < ns; i++) {
        r->m[i] = fgt_load(sd, hm, (int64_t)i);
        r->l[i] = fgt_load(sd, hl, (int64_t)i);
    }
    free(hm);
    free(hl);
    dbuf *all[] = {&q, &k, &v, &g, &o, &dq, &dk, &dv};
    for (int i = 0; i < 8; i++)
        CK_CUDA(cudaFree(all[i]->dev));
    CK_CUDA(cudaFree(m));
    CK_CUDA(cudaFree(l));
}

static const char *names[4] = {"O", "dQ", "dK", "dV"};

/* One case in one dtype: inputs rounded to the dtype, reference in fp64 on
 * the rounded inputs, GPU result compared with the tolerance above. */
static void run_case(const gcase *c, fg_dtype dt, uint64_t salt)
{
    const char *force = getenv("FG_ATTN_KERNEL");
    const int general = force && strcmp(force, "general") == 0;
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    size_t n[4] = {nq, nk, nk, nq};
    fgt_rng rng = fgt_rng_for(salt);
    double *in[4];
    for (int i = 0; i < 4; i++) {
        in[i] = malloc(n[i] * 8);
        fgt_fill(in[i], n[i], &rng, 1.0);
        for (size_t e = 0; e < n[i]; e++)
            in[i][e] = fgt_round_to(dt, in[i][e]);
    }
    fg_attn_params p;
    params_for(c, &p, fgt_next(&rng));
    outs ref, gpu;
    cpu_ref(c, &p, in, &ref);
    gpu_run(c, dt, &p, in, &gpu);
    size_t no[4] = {nq, nq, nk, nk};

    const double floor_ = 0.1;
    double tol[4], rms_tol[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    if (dt == FG_FP64 || dt == FG_FP32) {
        for (int i = 0; i < 4; i++)
            tol[i] = dt == FG_FP64 ? 1e-12 : 1e-5;
    } else {
        naive_shape s = {c->B, c->Nq, c->Nk, c->H, c->Hk, c->d,
                         1.0 / sqrt((double)c->d), c->causal, c->p, NULL};
        uint8_t *mask = NULL;
        if (c->p > 0) {
            mask = malloc((size_t)(c->B * c->H * c->Nq * c->Nk));
            ref_dropout_mask(p.seed, p.offset, c->p, c->B, c->H, c->Nq,
                             c->Nk, mask);
            s.keep = mask;
        }
        outs lp;
        for (int i = 0; i < 4; i++)
            lp.t[i] = malloc(no[i] * 8);
        lp.m = lp.l = NULL;
        naive_attention_lowp(&s, dt, in[0], in[1], in[2], in[3], lp.t[0],
                             lp.t[1], lp.t[2], lp.t[3]);
        const double half_ulp = dt == FG_BF16 ? 1.0 / 256 : 1.0 / 2048;
        for (int i = 0; i < 4; i++) {
            const double mx = fgt_max_abs(ref.t[i], no[i]);
            /* half an ulp of the largest |ref| (ulp <= 2^-7 / 2^-10 of it),
             * relative to the error's denominator */
            const double rnd = half_ulp * mx / (mx > floor_ ? mx : floor_);
            const double naive = fgt_rel_err_floor(lp.t[i], ref.t[i], no[i], floor_);
            if (general) {
                tol[i] = naive + rnd;
                rms_tol[i] = 1.5 * fgt_rms_err(lp.t[i], ref.t[i], no[i], floor_);
            } else {
                tol[i] = 2.0 * naive + rnd;
            }
        }
        outs_free(&lp);
        free(mask);
    }
    for (int i = 0; i < 4; i++) {
        const double e = fgt_rel_err_floor(gpu.t[i], ref.t[i], no[i], floor_);
        const double rms = fgt_rms_err(gpu.t[i], ref.t[i], no[i], floor_);
        ck_assert_msg(e <= tol[i] && rms <= rms_tol[i],
                      "%s %s max err %.3g (tol %.3g), rms err %.3g (tol %.3g) "
                      "(B=%lld Nq=%lld Nk=%lld H=%lld Hk=%lld d=%lld causal=%d "
                      "bhsd=%d p=%g)",
                      fg_dtype_name(dt), names[i], e, tol[i], rms, rms_tol[i],
                      (long long)c->B, (long long)c->Nq, (long long)c->Nk,
                      (long long)c->H, (long long)c->Hk, (long long)c->d,
                      c->causal, c->bhsd, c->p);
    }
    const double stol = dt == FG_FP64 ? 1e-12 : 1e-5;
    ck_assert_msg(fgt_stats_err(gpu.m, ref.m, ns) <= stol, "%s m err %g",
                  fg_dtype_name(dt), fgt_stats_err(gpu.m, ref.m, ns));
    ck_assert_msg(fgt_stats_err(gpu.l, ref.l, ns) <= stol, "%s l err %g",
                  fg_dtype_name(dt), fgt_stats_err(gpu.l, ref.l, ns));
    outs_free(&ref);
    outs_free(&gpu);
    for (int i = 0; i < 4; i++)
        free(in[i]);
}

/* N in {1, 7, 64, 65, 127, 1000, 4097}, Nq != Nk both ways, d in {16, 40,
 * 64, 96, 128, 256}, GQA/MQA, causal on/off, dropout on/off, both layouts;
 * the last three: the Hopper forward's wide key blocks (FwdWide:
 * unmasked, no dropout; 176 keys at d = 128, 80 at d = 256), several with
 * a partial last one. Every case runs in fp64, fp32, fp16 and bf16. */
static const gcase cases[] = {
    /* B   Nq    Nk   H  Hk   d  causal bhsd  p */
    {1, 1, 1, 1, 1, 16, 0, 0, 0.0},
    {2, 7, 7, 2, 2, 40, 1, 1, 0.1},
    {1, 64, 64, 4, 2, 64, 1, 0, 0.0},
    {2, 65, 65, 2, 1, 96, 0, 1, 0.2},
    {1, 127, 127, 2, 2, 128, 1, 0, 0.0},
    {1, 127, 64, 2, 2, 256, 1, 1, 0.1},
    {1, 64, 127, 2, 1, 256, 0, 0, 0.0},
    {1, 1000, 1000, 2, 2, 64, 1, 1, 0.0},
    {1, 1000, 1000, 1, 1, 128, 0, 0, 0.15},
    {1, 4097, 4097, 1, 1, 64, 1, 0, 0.0},
    {1, 4097, 4097, 1, 1, 128, 0, 1, 0.1},
    {2, 7, 65, 4, 1, 16, 1, 0, 0.0},
    {1, 65, 7, 2, 2, 40, 1, 1, 0.3},
    {1, 1000, 127, 2, 1, 96, 1, 0, 0.0},
    {1, 127, 1000, 2, 2, 256, 1, 1, 0.0},
    {3, 1, 64, 2, 2, 128, 1, 0, 0.2},
    {1, 64, 1, 2, 2, 64, 1, 1, 0.0},
    {1, 4097, 1000, 1, 1, 40, 1, 0, 0.0},
    {1, 7, 4097, 2, 1, 8, 0, 1, 0.5},
    {1, 300, 1000, 2, 1, 128, 0, 0, 0.0}, /* 5 blocks of 176 keys and 120 */
    {2, 177, 353, 2, 2, 96, 0, 1, 0.0},   /* 2 blocks and 1 key */
    {1, 100, 241, 2, 1, 256, 0, 1, 0.0},  /* d = 256: 3 blocks of 80 keys and 1 */
};

START_TEST(test_vs_cpu)
{
    const fg_dtype dts[4] = {FG_FP64, FG_FP32, FG_FP16, FG_BF16};
    for (int i = 0; i < 4; i++)
        run_case(&cases[_i], dts[i], 100 * (uint64_t)_i + (uint64_t)i);
}
END_TEST

/* The general (non-tensor-core) kernels in fp16/bf16: the fast path takes
 * these dtypes whenever it can, so force the general one here. */
START_TEST(test_general_lowp)
{
    setenv("FG_ATTN_KERNEL", "general", 1);
    run_case(&cases[_i], FG_BF16, 7000 + (uint64_t)_i);
    run_case(&cases[_i], FG_FP16, 7100 + (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_KERNEL");
}
END_TEST

/* The sm_80 tensor-core kernels (mma.sync): on a Hopper GPU the default
 * path is the wgmma one, so force the other here. Elsewhere this repeats
 * the default path. */
START_TEST(test_mma_lowp)
{
    setenv("FG_ATTN_KERNEL", "mma", 1);
    run_case(&cases[_i], FG_BF16, 7200 + (uint64_t)_i);
    run_case(&cases[_i], FG_FP16, 7300 + (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_KERNEL");
}
END_TEST

/* The default fp16/bf16 path on a handful of shapes covering every padded
 * head dim, causal, dropout, GQA and ragged lengths: the racecheck subset
 * (FG_SANITIZE=fast), where the fp32/fp64 references would take too long. */
static const int fast_cases[] = {2, 3, 4, 5, 6, 13, 19, 20}; /* 19, 20: 176-key blocks */

START_TEST(test_fast_path)
{
    run_case(&cases[fast_cases[_i]], FG_BF16, 7400 + (uint64_t)_i);
}
END_TEST

/* d <= 64, with and without dropout: the Hopper backward's wide kernels
 * (128 queries a step, dQ split by queries) by default, then the 64-query
 * ones (FG_ATTN_BWD_WIDE=0), each against the fp64 reference. Lengths
 * around the 128-row step (the last step half or wholly past Nq), both
 * causal alignments' shifts, GQA, d padded to 64, both layouts. */
static const gcase wide_cases[] = {
    /* B   Nq    Nk   H  Hk   d  causal bhsd  p */
    {2, 129, 129, 4, 2, 64, 0, 0, 0.0},
    {1, 200, 77, 2, 2, 64, 1, 1, 0.0},
    {1, 77, 300, 2, 1, 64, 1, 0, 0.0},
    {1, 256, 256, 3, 3, 64, 0, 1, 0.0},
    {2, 1, 130, 2, 2, 64, 0, 0, 0.0},
    {1, 1030, 1030, 2, 2, 48, 1, 0, 0.0},
    {1, 65, 1000, 2, 2, 32, 0, 1, 0.0},
    {2, 129, 129, 4, 2, 64, 0, 1, 0.2},
    {1, 300, 300, 2, 1, 64, 1, 0, 0.1},
    {1, 77, 300, 2, 2, 48, 1, 1, 0.15},
};

/* Case c in bf16 and fp16 with kernel switch sw as is (the default
 * kernel), then with sw=0 (the other one); salts bf16 + off, fp16 + off. */
static void run_switch_off(const gcase *c, const char *sw, uint64_t bf16, uint64_t fp16)
{
    for (int off = 0; off < 2; off++) {
        if (off)
            setenv(sw, "0", 1);
        run_case(c, FG_BF16, bf16 + (uint64_t)off);
        run_case(c, FG_FP16, fp16 + (uint64_t)off);
    }
    fgt_switch_restore(sw);
}

START_TEST(test_wide_d64)
{
    run_switch_off(&wide_cases[_i], "FG_ATTN_BWD_WIDE", 7500 + 10 * (uint64_t)_i,
                   7600 + 10 * (uint64_t)_i);
}
END_TEST

/* d in (64, 128], unmasked, without dropout: the Hopper backward's
 * 80-query kernel (dQ^T = K^T dS^T, 80-query transposed dQ tiles, stats
 * padded to 320 rows), forced at every Nq (FG_ATTN_BWD_Q80=1; by default
 * it serves Nq >= 2048), then the 64-query one (FG_ATTN_BWD_Q80=0), each
 * against the fp64 reference. Lengths around the 80-row step and the
 * 320-row padding (the last step partly or wholly past Nq), one past the
 * default's threshold, Nq != Nk, GQA / MQA, d padded to 128, both
 * layouts; the last case has dropout (never the 80-query kernel). */
static const gcase q80_cases[] = {
    /* B   Nq    Nk   H  Hk   d  causal bhsd  p */
    {2, 80, 128, 2, 2, 128, 0, 0, 0.0},
    {1, 81, 200, 4, 2, 128, 0, 1, 0.0},
    {2, 321, 129, 2, 1, 128, 0, 0, 0.0},
    {1, 1, 300, 2, 2, 128, 0, 1, 0.0},
    {1, 500, 500, 3, 3, 96, 0, 0, 0.0},
    {1, 639, 1000, 2, 2, 112, 0, 1, 0.0},
    {1, 2049, 700, 1, 1, 128, 0, 0, 0.0},
    {1, 160, 160, 2, 2, 128, 0, 0, 0.1},
};

START_TEST(test_q80_d128)
{
    setenv("FG_ATTN_BWD_Q80", "1", 1);
    run_switch_off(&q80_cases[_i], "FG_ATTN_BWD_Q80", 7700 + 10 * (uint64_t)_i,
                   7800 + 10 * (uint64_t)_i);
}
END_TEST

/* The Hopper kernels' two epilogues: O, dK and dV through shared memory
 * (the default: staged in the warps' rows of the Q and V tiles,
 * wgmma_epilogue.cuh) and from registers (FG_ATTN_FWD_EPI=0,
 * FG_ATTN_BWD_EPI=0), each against the fp64 reference, and bitwise equal
 * to each other: every padded head dim (d = 256's backward too since
 * session 54: each warpgroup's half of d through its own panels of V),
 * rows past Nq and Nk in the last tile, both layouts, GQA, causal,
 * dropout, the wide d = 64 backward. */
static const gcase epi_cases[] = {
    /* B   Nq    Nk   H  Hk   d  causal bhsd  p */
    {2, 65, 65, 4, 2, 128, 0, 0, 0.0},
    {1, 200, 77, 2, 2, 64, 1, 1, 0.1},
    {1, 77, 300, 2, 1, 40, 1, 0, 0.0},
    {1, 1000, 1000, 2, 2, 96, 0, 1, 0.2},
    {2, 129, 300, 4, 4, 256, 1, 0, 0.0},
    {1, 1, 130, 2, 2, 128, 0, 0, 0.0},
    {1, 100, 353, 2, 2, 128, 0, 0, 0.0}, /* 176-key forward blocks */
};

/* 1: through shared memory, 0: from registers */
static const char *const epi_sw[] = {"FG_ATTN_FWD_EPI", "FG_ATTN_BWD_EPI"};

/* The n switches sw to val; restore_switches: as before the test */
static void set_switches(const char *const *sw, int n, const char *val)
{
    for (int i = 0; i < n; i++)
        setenv(sw[i], val, 1);
}

static void restore_switches(const char *const *sw, int n)
{
    for (int i = 0; i < n; i++)
        fgt_switch_restore(sw[i]);
}

/* Case c in fp16 (inputs from seed) with the n switches sw at off, then
 * at on: O, dK, dV, m and l bitwise the same (not dQ: its sums arrive in
 * any order). The switches stay at on. */
static void same_bits(const gcase *c, uint64_t seed, const char *const *sw, int nsw,
                      const char *off_val, const char *on_val, const char *what)
{
    fgt_rng rng = fgt_rng_for(seed);
    double *in[4];
    inputs_for(c, &rng, in);
    fg_attn_params p;
    params_for(c, &p, fgt_next(&rng));
    outs off, on;
    set_switches(sw, nsw, off_val);
    gpu_run(c, FG_FP16, &p, in, &off);
    set_switches(sw, nsw, on_val);
    gpu_run(c, FG_FP16, &p, in, &on);
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    const size_t n[4] = {nq, nq, nk, nk};
    for (int i = 0; i < 4; i++)
        if (i != 1)
            ck_assert_msg(memcmp(off.t[i], on.t[i], n[i] * 8) == 0, "%s differs %s", names[i],
                          what);
    ck_assert(memcmp(off.m, on.m, ns * 8) == 0 && memcmp(off.l, on.l, ns * 8) == 0);
    outs_free(&off);
    outs_free(&on);
    for (int i = 0; i < 4; i++)
        free(in[i]);
}

START_TEST(test_staged_epilogue)
{
    const gcase *c = &epi_cases[_i];
    set_switches(epi_sw, 2, "1");
    run_case(c, FG_BF16, 7900 + (uint64_t)_i);
    set_switches(epi_sw, 2, "0");
    run_case(c, FG_BF16, 7900 + (uint64_t)_i);
    same_bits(c, 7950 + (uint64_t)_i, epi_sw, 2, "0", "1", "staged");
    restore_switches(epi_sw, 2);
}
END_TEST

/* Deterministic mode: dQ without atomics, reruns bitwise identical, and
 * still within the tolerances against the CPU reference. */
START_TEST(test_deterministic)
{
    static const gcase dc[] = {
        {2, 300, 257, 4, 2, 64, 1, 0, 0.1},
        {1, 129, 200, 2, 1, 128, 0, 1, 0.0},
        {1, 70, 90, 2, 2, 256, 1, 0, 0.2},
    };
    const fg_dtype dts[4] = {FG_FP64, FG_FP32, FG_FP16, FG_BF16};
    g_deterministic = 1;
    const gcase *c = &dc[_i];
    for (int di = 0; di < 4; di++) {
        run_case(c, dts[di], 8000 + 10 * (uint64_t)_i + (uint64_t)di);
        const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
        const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
        fgt_rng rng = fgt_rng_for(8500 + (uint64_t)_i);
        double *in[4];
        inputs_for(c, &rng, in);
        fg_attn_params p;
        params_for(c, &p, 99);
        outs r1, r2;
        gpu_run(c, dts[di], &p, in, &r1);
        gpu_run(c, dts[di], &p, in, &r2);
        size_t no[4] = {nq, nq, nk, nk};
        for (int t = 0; t < 4; t++)
            ck_assert_msg(memcmp(r1.t[t], r2.t[t], no[t] * 8) == 0,
                          "%s %s differs between deterministic reruns",
                          fg_dtype_name(dts[di]), names[t]);
        outs_free(&r1);
        outs_free(&r2);
        for (int i = 0; i < 4; i++)
            free(in[i]);
    }
}
END_TEST

/* The GPU mask (cuRAND's Philox) equals the CPU mask and the documented
 * mapping (tests/ref_dropout.h) bit for bit. */
START_TEST(test_dropout_mask)
{
    fg_attn_params p;
    fg_attn_params_init(&p, 2, 67, 301, 3, 1, 8);
    const double ps[] = {0.1, 0.5, 0.37};
    const size_t n = 2 * 3 * 67 * 301;
    uint8_t *a = malloc(n), *b = malloc(n);
    for (int t = 0; t < 3; t++) {
        p.dropout_p = ps[t];
        p.seed = fgt_next(&(fgt_rng){fgt_base_seed() + (uint64_t)t});
        p.offset = ((uint64_t)t << 32) | (uint64_t)(t * 977);
        p.device = FG_DEVICE_CPU;
        ck_assert(fg_attention_dropout_mask(&p, a) == FG_OK);
        p.device = FG_DEVICE_CUDA;
        memset(b, 7, n);
        ck_assert_msg(fg_attention_dropout_mask(&p, b) == FG_OK, "%s",
                      fg_last_error());
        ck_assert_msg(memcmp(a, b, n) == 0, "GPU and CPU masks differ (p=%g)",
                      ps[t]);
        ref_dropout_mask(p.seed, p.offset, p.dropout_p, 2, 3, 67, 301, a);
        ck_assert_msg(memcmp(a, b, n) == 0,
                      "GPU mask differs from the documented mapping (p=%g)",
                      ps[t]);
    }
    free(a);
    free(b);
}
END_TEST

/* The mask the attention kernels themselves apply, not the mask kernel's:
 * with Q = 0 every visible probability is 1/Nk' (Nk' the keys the row
 * sees), so with V[j] = e_j, O[i][j] = keep(i, j) 256/T / Nk' is nonzero
 * iff (i, j) is visible and kept; with dO[i] = e_i, dV[j][i] = P_ij
 * keep(i, j) 256/T likewise. Every bit of both must match the documented
 * mapping (tests/ref_dropout.h), on the default (Hopper wgmma on an H100),
 * mma.sync and general kernels, fp16 and bf16. Nq, Nk <= d. */
static void kernel_mask_case(int64_t N, int64_t d, int causal, fg_dtype dt,
                             const char *kernel, uint64_t salt)
{
    const gcase c = {2, N, N, 2, 2, d, causal, 0, 0.3};
    const size_t nq = (size_t)(c.B * N * c.H * d);
    double *in[4];
    for (int i = 0; i < 4; i++)
        in[i] = calloc(nq, sizeof(double));
    fgt_rng rng = fgt_rng_for(salt);
    fgt_fill(in[1], nq, &rng, 1.0);
    fgt_unit_rows(in[2], c.B, N, c.H, d);
    fgt_unit_rows(in[3], c.B, N, c.H, d);
    fg_attn_params p;
    params_for(&c, &p, fgt_next(&rng));
    if (kernel)
        setenv("FG_ATTN_KERNEL", kernel, 1);
    outs gpu;
    gpu_run(&c, dt, &p, in, &gpu);
    fgt_switch_restore("FG_ATTN_KERNEL");
    uint8_t *mask = malloc((size_t)(c.B * c.H * N * N));
    ref_dropout_mask(p.seed, p.offset, c.p, c.B, c.H, N, N, mask);
    int64_t bad_o, bad_dv;
    const int64_t kept = ref_mask_mismatch(mask, causal, gpu.t[0], gpu.t[3], c.B, c.H, N,
                                           d, &bad_o, &bad_dv);
    ck_assert_msg(bad_o == 0 && bad_dv == 0,
                  "%s %s N=%lld d=%lld causal=%d: %lld forward and %lld backward "
                  "mask bits differ", kernel ? kernel : "default", fg_dtype_name(dt),
                  (long long)N, (long long)d, causal, (long long)bad_o, (long long)bad_dv);
    const int64_t vis = c.B * c.H * (causal ? N * (N + 1) / 2 : N * N);
    ck_assert(kept > vis / 2 && kept < vis * 9 / 10); /* about 70% kept */
    outs_free(&gpu);
    free(mask);
    for (int i = 0; i < 4; i++)
        free(in[i]);
}

START_TEST(test_kernel_mask)
{
    static const char *kernels[] = {NULL, "mma", "general"};
    const char *k = kernels[_i];
    kernel_mask_case(128, 128, 0, FG_BF16, k, 9700);
    kernel_mask_case(128, 128, 1, FG_FP16, k, 9701);
    kernel_mask_case(256, 256, 0, FG_BF16, k, 9702); /* several tiles each way */
    kernel_mask_case(100, 128, 1, FG_BF16, k, 9703); /* partial tiles */
    kernel_mask_case(64, 64, 0, FG_FP16, k, 9704);
}
END_TEST

/* The same for d = 64 on the default path: the wide backward, then the
 * 64-query one (FG_ATTN_BWD_WIDE=0), causal and not, a partial step. */
START_TEST(test_wide_mask)
{
    for (int narrow = 0; narrow < 2; narrow++) {
        if (narrow)
            setenv("FG_ATTN_BWD_WIDE", "0", 1);
        kernel_mask_case(64, 64, 1, FG_BF16, NULL, 9710 + (uint64_t)narrow);
        kernel_mask_case(50, 64, 0, FG_FP16, NULL, 9712 + (uint64_t)narrow);
    }
    fgt_switch_restore("FG_ATTN_BWD_WIDE");
}
END_TEST

/* Finite-difference gradcheck of the GPU fp64 path (eps 1e-6,
 * |a - n| <= 1e-5 + 1e-3 |n|), causal and dropout. */
START_TEST(test_gradcheck_fp64)
{
    const gcase c = {1, 5, 7, 2, 1, 16, _i, _i, _i ? 0.25 : 0.0};
    const size_t nq = 5 * 2 * 16, nk = 7 * 16;
    size_t n[4] = {nq, nk, nk, nq};
    fgt_rng rng = fgt_rng_for(900 + (uint64_t)_i);
    double *in[4];
    for (int i = 0; i < 4; i++) {
        in[i] = malloc(n[i] * 8);
        fgt_fill(in[i], n[i], &rng, 1.5);
    }
    fg_attn_params p;
    params_for(&c, &p, 4242);
    outs base;
    gpu_run(&c, FG_FP64, &p, in, &base);
    const double eps = 1e-6;
    for (int t = 0; t < 3; t++) {
        for (size_t e = 0; e < n[t]; e += 3) { /* every third element */
            const double x0 = in[t][e];
            double L[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                in[t][e] = x0 + (sgn ? -eps : eps);
                outs r;
                gpu_run(&c, FG_FP64, &p, in, &r);
                L[sgn] = 0;
                for (size_t i = 0; i < nq; i++)
                    L[sgn] += r.t[0][i] * in[3][i];
                outs_free(&r);
            }
            in[t][e] = x0;
            const double num = (L[0] - L[1]) / (2 * eps);
            const double ana = base.t[1 + t][e];
            ck_assert_msg(fabs(ana - num) <= 1e-5 + 1e-3 * fabs(num),
                          "%s[%zu]: analytic %.10g numeric %.10g", names[1 + t],
                          e, ana, num);
        }
    }
    outs_free(&base);
    for (int i = 0; i < 4; i++)
        free(in[i]);
}
END_TEST

/* A softcap alone in fp16 / bf16: the fast kernels keep such scores in
 * tanh units (their own exponent, m = cap max t), so m and l, which
 * test_variants checks only in fp32 / fp64, are checked here too: against
 * the fp64 oracle on the same rounded inputs, O and the gradients as
 * test_variants, m and l within 2e-3 / 5e-3 (tanh.approx's 2^-11 relative
 * error on each logit). Caps from 5 to 50; the `neg` cases make every
 * logit of a row close to -cap (Q > 0, K < 0), far below 0. */
static const struct capcase {
    gcase g;
    double cap;
    int neg;
} capcases[] = {
    {{1, 300, 300, 2, 1, 128, 1, 0, 0.0}, 30.0, 0},
    {{2, 200, 333, 4, 2, 128, 0, 1, 0.1}, 41.0, 0},
    {{1, 257, 257, 2, 2, 64, 1, 0, 0.0}, 5.0, 0},
    {{1, 200, 260, 2, 1, 256, 0, 0, 0.0}, 30.0, 0},
    {{1, 300, 300, 2, 1, 128, 0, 0, 0.0}, 50.0, 0},
    {{1, 260, 260, 2, 1, 128, 1, 0, 0.0}, 41.0, 1},
    {{1, 200, 200, 2, 2, 64, 0, 0, 0.0}, 30.0, 1},
};

START_TEST(test_softcap_stats)
{
    const struct capcase *cc = &capcases[_i];
    const gcase *c = &cc->g;
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    const size_t no[4] = {nq, nq, nk, nk};
    const fg_dtype dts[2] = {FG_BF16, FG_FP16};
    for (int di = 0; di < 2; di++) {
        const fg_dtype dt = dts[di];
        fgt_rng rng = fgt_rng_for(1700 + 10 * (uint64_t)_i + (uint64_t)di);
        double *in[4];
        inputs_for(c, &rng, in);
        for (int i = 0; i < 4; i++) {
            const size_t n = i == 0 || i == 3 ? nq : nk;
            for (size_t e = 0; e < n; e++) {
                double x = in[i][e];
                if (cc->neg && i < 2) /* Q > 0, K < 0: every score negative */
                    x = (i == 0 ? 1.0 : -1.0) * (1.0 + 0.5 * fabs(x));
                in[i][e] = fgt_round_to(dt, x);
            }
        }
        fg_attn_params p;
        params_for(c, &p, fgt_next(&rng));
        p.softcap = cc->cap;
        outs ref, gpu;
        cpu_ref(c, &p, in, &ref);
        gpu_run(c, dt, &p, in, &gpu);
        const double tol = FGT_LOWP_VARIANT_TOL(dt);
        for (int i = 0; i < 4; i++) {
            const double e = fgt_rel_err_floor(gpu.t[i], ref.t[i], no[i], 0.1);
            ck_assert_msg(e <= tol, "softcap %g %s %s err %.3g > %.3g (d %lld, neg %d)",
                          cc->cap, fg_dtype_name(dt), names[i], e, tol, (long long)c->d,
                          cc->neg);
        }
        const double em = fgt_stats_err(gpu.m, ref.m, ns), el = fgt_stats_err(gpu.l, ref.l, ns);
        ck_assert_msg(em <= FGT_SOFTCAP_TOL_M && el <= FGT_SOFTCAP_TOL_L,
                      "softcap %g %s m err %.3g, l err %.3g (d %lld, neg %d)", cc->cap,
                      fg_dtype_name(dt), em, el, (long long)c->d, cc->neg);
        outs_free(&ref);
        outs_free(&gpu);
        for (int i = 0; i < 4; i++)
            free(in[i]);
    }
}
END_TEST

/* Nq > Nk causal: rows with no visible key give O = 0, dQ = 0, m = -inf,
 * l = 0, and nothing is NaN, in every dtype. */
START_TEST(test_fully_masked)
{
    const gcase c = {1, 70, 20, 2, 1, 32, 1, 0, 0.2};
    const fg_dtype dts[4] = {FG_FP64, FG_FP32, FG_FP16, FG_BF16};
    const size_t nq = 70 * 2 * 32, nk = 20 * 32;
    size_t n[4] = {nq, nk, nk, nq};
    /* di >= 4: fp16 / bf16 again with a softcap alone (the fast kernels
     * keep such scores in tanh units: their own exponent and m) */
    for (int di = 0; di < 6; di++) {
        const fg_dtype dt = dts[di < 4 ? di : di - 2];
        fgt_rng rng = fgt_rng_for(1300 + (uint64_t)di);
        double *in[4];
        for (int i = 0; i < 4; i++) {
            in[i] = malloc(n[i] * 8);
            fgt_fill(in[i], n[i], &rng, 1.0);
        }
        fg_attn_params p;
        params_for(&c, &p, 77);
        if (di >= 4)
            p.softcap = 30.0;
        outs r;
        gpu_run(&c, dt, &p, in, &r);
        ck_assert(fgt_all_finite(r.t[0], nq) && fgt_all_finite(r.t[1], nq));
        ck_assert(fgt_all_finite(r.t[2], nk) && fgt_all_finite(r.t[3], nk));
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < 50; i++) {
                ck_assert(isinf(r.m[h * 70 + i]) && r.l[h * 70 + i] == 0);
                for (int64_t x = 0; x < 32; x++) {
                    ck_assert(r.t[0][(i * 2 + h) * 32 + x] == 0);
                    ck_assert(r.t[1][(i * 2 + h) * 32 + x] == 0);
                }
            }
        outs_free(&r);
        for (int i = 0; i < 4; i++)
            free(in[i]);
    }
}
END_TEST

/* Attention variants (window, top-left causal, softcap, ALiBi,
 * block-sparse, with dropout and GQA) on the GPU against the CPU fp64
 * oracle (itself checked pair by pair against the naive reference in
 * test_attention_variants). fp64/fp32 as test_vs_cpu; fp16/bf16 (the naive
 * low-precision twin has no variants) within 6e-3 / 4e-2 of max |ref|
 * (a few ulps of the dtype: the plain cases above land near 1e-3 / 8e-3).
 * The GPU block-mask builder must give the CPU builder's lists bit for
 * bit. Sizes straddle the 64- and 128-blocks. Rows that see no key (the
 * last two cases: causal with Nq > Nk plus an emptied query block, and a
 * block map that keeps nothing) must give O = 0, dQ = 0, m = -inf, l = 0
 * exactly and no NaN anywhere. */
typedef struct vcase {
    gcase g;
    int top_left, window;
    int64_t wl, wr;
    double softcap;
    int alibi;     /* 1: [H], 2: [B, H] */
    double sparse; /* block keep probability, 0 = dense */
    int empty_qb;  /* leading query blocks whose map keeps nothing (-1: all) */
} vcase;

static const vcase vcases[] = {
    {{1, 129, 129, 2, 1, 64, 0, 0, 0.0}, 0, 1, 33, 17, 0, 0, 0},
    {{1, 300, 300, 2, 2, 128, 1, 1, 0.1}, 0, 1, 100, -1, 0, 0, 0},
    {{1, 257, 97, 2, 1, 64, 1, 0, 0.0}, 1, 0, 0, 0, 0, 0, 0},
    {{2, 200, 200, 4, 2, 64, 1, 0, 0.0}, 0, 0, 0, 0, 30.0, 0, 0},
    {{1, 255, 255, 4, 4, 128, 1, 1, 0.0}, 0, 0, 0, 0, 0, 1, 0},
    {{2, 140, 260, 2, 1, 32, 0, 0, 0.15}, 0, 0, 0, 0, 0, 2, 0},
    {{1, 384, 384, 2, 2, 64, 0, 0, 0.0}, 0, 0, 0, 0, 0, 0, 0.5},
    {{1, 300, 500, 4, 2, 128, 1, 1, 0.1}, 1, 1, 200, -1, 20.0, 1, 0.6},
    {{2, 256, 384, 4, 2, 256, 0, 1, 0.1}, 0, 0, 0, 0, 0, 2, 0.5, 0},
    {{1, 300, 200, 2, 1, 64, 1, 0, 0.1}, 0, 1, 40, -1, 15.0, 1, 0.7, 1},
    {{1, 200, 200, 2, 2, 128, 0, 0, 0.0}, 1, 0, 0, 0, 10.0, 0, 0.5, -1},
    /* masks alone (the wgmma kModes 6): d = 256 with dropout, GQA, a
     * causal window and a block map; d = 64 with dropout, MQA and a
     * two-sided window */
    {{2, 320, 320, 4, 2, 256, 1, 0, 0.1}, 0, 1, 128, -1, 0, 0, 0.6, 0},
    {{1, 333, 333, 2, 1, 64, 0, 0, 0.1}, 0, 1, 70, 70, 0, 0, 0, 0},
    /* ALiBi under a causal band (the wgmma kernels' alibi_acc: S starts
     * as the bias): bottom-right with Nk > Nq, a left window, [B, H]
     * slopes, dropout and GQA at d = 64 */
    {{2, 300, 420, 4, 2, 64, 1, 0, 0.1}, 0, 1, 150, -1, 0, 2, 0, 0},
    /* softcap + ALiBi without dropout (the cases above that combine them
     * carry dropout or d = 256, other Hopper backward kernels): d = 128
     * bottom-right causal, Nk > Nq, GQA; d = 64 (test_wide_variants too)
     * with a window and [B, H] slopes */
    {{1, 300, 420, 4, 2, 128, 1, 0, 0.0}, 0, 0, 0, 0, 30.0, 1, 0, 0},
    {{2, 333, 333, 4, 1, 64, 1, 1, 0.0}, 0, 1, 150, -1, 30.0, 2, 0, 0},
};

/* The d = 256 Hopper backward over several query steps per key block
 * (its warpgroups hand P^T and the dropout bits over through shared
 * memory every step): against the fp64 reference with the same masks and
 * modifiers (causal both ways, GQA, dropout, padded d, windows, block
 * maps, ALiBi, softcap). In the racecheck subset: these shapes showed the
 * session-35 report on that exchange. Cases 3-5, several query steps
 * per key block: bottom-right causal with more queries than keys (rows
 * with no key) and GQA with dropout, square causal, unmasked MQA with
 * dropout. */
static const gcase d256_cases[] = {
    /* B   Nq   Nk  H  Hk    d  causal bhsd  p */
    {1, 200, 300, 2, 1, 256, 1, 0, 0.1},
    {2, 129, 129, 4, 4, 256, 0, 1, 0.0},
    {1, 77, 200, 2, 2, 160, 1, 0, 0.0},
    {2, 300, 256, 4, 2, 256, 1, 0, 0.1},
    {1, 384, 384, 2, 2, 256, 1, 1, 0.0},
    {2, 200, 250, 2, 1, 256, 0, 0, 0.2},
};
#define N_D256 ((int)(sizeof d256_cases / sizeof d256_cases[0]))
static const vcase d256_vcases[] = {
    {{2, 256, 384, 4, 2, 256, 0, 1, 0.1}, 0, 0, 0, 0, 0, 2, 0.5, 0},
    {{2, 320, 320, 4, 2, 256, 1, 0, 0.1}, 0, 1, 128, -1, 0, 0, 0.6, 0},
    {{1, 200, 300, 2, 2, 256, 1, 0, 0.0}, 1, 0, 0, 0, 20.0, 1, 0, 0},
    {{1, 260, 330, 2, 1, 256, 1, 0, 0.0}, 0, 0, 0, 0, 0, 1, 0, 0}, /* ALiBi + causal */
    {{1, 200, 260, 2, 1, 256, 1, 0, 0.1}, 0, 0, 0, 0, 30.0, 0, 0, 0}, /* softcap alone */
};

static void run_variant(const vcase *vc, fg_dtype dt, uint64_t salt);

/* _i < N_D256: d256_cases[_i]; else d256_vcases[_i - N_D256] */
START_TEST(test_d256_steps)
{
    if (_i < N_D256) {
        run_case(&d256_cases[_i], FG_BF16, 7980 + (uint64_t)_i);
    } else {
        run_variant(&d256_vcases[_i - N_D256], FG_BF16, 8010 + (uint64_t)_i);
        run_variant(&d256_vcases[_i - N_D256], FG_FP16, 8020 + (uint64_t)_i);
    }
}
END_TEST

/* Set by test_deterministic_tiles: run_variant also checks reruns. */
static int g_det_reruns;

/* Deterministic mode (g_deterministic): two more runs bitwise identical
 * to the first; with FG_ATTN_DET_DQ=0 (the strict dQ kernel, an
 * independent sum), and with FG_ATTN_DET_COPIES=2 and 4 (other fixed
 * orders than the default one copy) and with FG_ATTN_DET_ROTATE=0 (the
 * unmasked kernels' blocks all walking from the first query step, another
 * order), O, dK and dV bitwise identical and dQ within 4 ulps of the
 * dtype (2^-8 fp16, 2^-5 bf16) of max |dQ|; each copies setting twice,
 * bitwise identical. `rotated` (an unmasked case): the strict dQ kernel's
 * run and FG_ATTN_DET_ROTATE=0 walk the query steps of each key block in
 * another order, so dK and dV are other fixed-order sums there: within
 * the same bound, not bitwise. */
static void det_reruns(const gcase *c, fg_dtype dt, const fg_attn_params *pg,
                       double *in[4], const outs *first, const size_t no[4], int rotated)
{
    outs prev = {{NULL}};
    for (int run = 0; run < 8; run++) {
        if (run == 2)
            setenv("FG_ATTN_DET_DQ", "0", 1);
        if (run >= 3 && run < 7)
            setenv("FG_ATTN_DET_COPIES", run < 5 ? "2" : "4", 1);
        if (run == 7)
            setenv("FG_ATTN_DET_ROTATE", "0", 1);
        outs r;
        gpu_run(c, dt, pg, in, &r);
        fgt_switch_restore("FG_ATTN_DET_DQ");
        fgt_switch_restore("FG_ATTN_DET_COPIES");
        fgt_switch_restore("FG_ATTN_DET_ROTATE");
        if (run == 4 || run == 6) /* the second run of a copies setting */
            ck_assert_msg(memcmp(r.t[1], prev.t[1], no[1] * 8) == 0,
                          "%s dQ differs between reruns with %s copies",
                          fg_dtype_name(dt), run == 4 ? "2" : "4");
        if (prev.t[0])
            outs_free(&prev);
        prev = r;
        for (int t = 0; t < 4; t++) {
            if ((run >= 2 && t == 1) || (rotated && (run == 2 || run == 7) && t >= 2)) {
                const double e = fgt_rel_err_floor(r.t[t], first->t[t], no[t], 0.1);
                ck_assert_msg(e <= (dt == FG_FP16 ? 0x1p-8 : 0x1p-5),
                              "%s %s: fixed-order sum vs %s %.3g", fg_dtype_name(dt), names[t],
                              run == 2 ? "strict kernel" : run == 7 ? "no rotation" : "other copies", e);
                continue;
            }
            ck_assert_msg(memcmp(r.t[t], first->t[t], no[t] * 8) == 0,
                          "%s %s differs between deterministic runs (run %d)",
                          fg_dtype_name(dt), names[t], run);
        }
    }
    outs_free(&prev);
}

static void run_variant(const vcase *vc, fg_dtype dt, uint64_t salt)
{
    const gcase *c = &vc->g;
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    size_t n[4] = {nq, nk, nk, nq}, no[4] = {nq, nq, nk, nk};
    fgt_rng rng = fgt_rng_for(salt);
    double *in[4];
    for (int i = 0; i < 4; i++) {
        in[i] = malloc(n[i] * 8);
        fgt_fill(in[i], n[i], &rng, 1.0);
        for (size_t e = 0; e < n[i]; e++)
            in[i][e] = fgt_round_to(dt, in[i][e]);
    }
    fg_attn_params p;
    params_for(c, &p, fgt_next(&rng));
    p.causal_align = vc->top_left ? FG_ATTN_ALIGN_TOP_LEFT : FG_ATTN_ALIGN_BOTTOM_RIGHT;
    if (vc->window) {
        p.window_left = vc->wl;
        p.window_right = vc->wr;
    }
    p.softcap = vc->softcap;
    fg_attn_params pg = p; /* the GPU's copy points at device data */
    float slopes[64], *dslopes = NULL;
    if (vc->alibi) {
        const int64_t ns_ = (vc->alibi == 2 ? c->B : 1) * c->H;
        for (int64_t i = 0; i < ns_; i++)
            slopes[i] = (float)(0.02 + 0.3 * fabs(fgt_uniform(&rng)));
        CK_CUDA(cudaMalloc((void **)&dslopes, sizeof(float) * (size_t)ns_));
        CK_CUDA(cudaMemcpy(dslopes, slopes, sizeof(float) * (size_t)ns_,
                           cudaMemcpyHostToDevice));
        p.alibi_slopes = slopes;
        pg.alibi_slopes = dslopes;
        p.alibi_stride_b = pg.alibi_stride_b = vc->alibi == 2 ? c->H : 0;
    }
    fg_attn_block_mask hbm, dbm;
    int32_t *hst = NULL, *dst = NULL;
    uint8_t *dmap = NULL;
    if (vc->sparse > 0) {
        const int64_t nqb = (c->Nq + 127) / 128, nkb = (c->Nk + 127) / 128;
        const size_t nm = (size_t)(c->B * c->H * nqb * nkb);
        uint8_t *map = malloc(nm);
        for (size_t i = 0; i < nm; i++)
            map[i] = 0.5 * (fgt_uniform(&rng) + 1) < vc->sparse &&
                     (vc->empty_qb < 0 ? 0 : (int64_t)(i / (size_t)nkb) % nqb >= vc->empty_qb);
        const int64_t nst = fg_attn_block_mask_storage(c->B, c->H, nqb, nkb);
        hst = malloc(sizeof(int32_t) * (size_t)nst);
        int32_t *back = malloc(sizeof(int32_t) * (size_t)nst);
        CK_CUDA(cudaMalloc((void **)&dst, sizeof(int32_t) * (size_t)nst));
        CK_CUDA(cudaMemset(dst, 0, sizeof(int32_t) * (size_t)nst));
        memset(hst, 0, sizeof(int32_t) * (size_t)nst);
        CK_CUDA(cudaMalloc((void **)&dmap, nm));
        CK_CUDA(cudaMemcpy(dmap, map, nm, cudaMemcpyHostToDevice));
        ck_assert(fg_attn_block_mask_build(&hbm, map, c->B, c->H, nqb, nkb, hst,
                                           FG_DEVICE_CPU) == FG_OK);
        ck_assert_msg(fg_attn_block_mask_build(&dbm, dmap, c->B, c->H, nqb, nkb,
                                               dst, FG_DEVICE_CUDA) == FG_OK,
                      "%s", fg_last_error());
        /* Unused list tails are not written: compare counts and the used
         * entries only. */
        CK_CUDA(cudaMemcpy(back, dst, sizeof(int32_t) * (size_t)nst,
                           cudaMemcpyDeviceToHost));
        for (int64_t r = 0; r < c->B * c->H * nqb; r++) {
            ck_assert_int_eq(back[r], hbm.kv_count[r]);
            for (int32_t x = 0; x < hbm.kv_count[r]; x++)
                ck_assert_int_eq(back[c->B * c->H * nqb + r * nkb + x],
                                 hbm.kv_index[r * nkb + x]);
        }
        free(back);
        free(map);
        p.block_mask = &hbm;
        pg.block_mask = &dbm;
    }
    outs ref, gpu;
    cpu_ref(c, &p, in, &ref);
    gpu_run(c, dt, &pg, in, &gpu);
    if (g_det_reruns)
        det_reruns(c, dt, &pg, in, &gpu, no,
                   !c->causal && !vc->window && !vc->top_left && vc->softcap == 0 &&
                       !vc->alibi && vc->sparse == 0);
    const double tol = dt == FG_FP64 ? 1e-12 : dt == FG_FP32 ? 1e-5 : FGT_LOWP_VARIANT_TOL(dt);
    for (int i = 0; i < 4; i++) {
        const double e = fgt_rel_err_floor(gpu.t[i], ref.t[i], no[i], 0.1);
        ck_assert_msg(e <= tol, "variant %s %s err %.3g > %.3g (Nq=%lld Nk=%lld "
                      "d=%lld win=%d(%lld,%lld) tl=%d cap=%g alibi=%d sparse=%g p=%g)",
                      fg_dtype_name(dt), names[i], e, tol, (long long)c->Nq,
                      (long long)c->Nk, (long long)c->d, vc->window,
                      (long long)vc->wl, (long long)vc->wr, vc->top_left,
                      vc->softcap, vc->alibi, vc->sparse, c->p);
    }
    /* Rows with no visible key: exact zeros and -inf, nothing NaN. */
    for (int i = 0; i < 4; i++)
        ck_assert_msg(fgt_all_finite(gpu.t[i], no[i]), "variant %s %s not finite",
                      fg_dtype_name(dt), names[i]);
    for (int64_t bh = 0; bh < c->B * c->H; bh++)
        for (int64_t i = 0; i < c->Nq; i++) {
            const int64_t r = bh * c->Nq + i;
            if (ref.l[r] != 0)
                continue;
            ck_assert_msg(isinf(gpu.m[r]) && gpu.m[r] < 0 && gpu.l[r] == 0,
                          "variant %s empty row %lld: m %g l %g", fg_dtype_name(dt),
                          (long long)i, gpu.m[r], gpu.l[r]);
            const int64_t b = bh / c->H, h = bh % c->H;
            const int64_t o = ((b * c->Nq + i) * c->H + h) * c->d;
            for (int64_t x = 0; x < c->d; x++)
                ck_assert(gpu.t[0][o + x] == 0 && gpu.t[1][o + x] == 0);
        }
    const double stol = dt == FG_FP64 ? 1e-12 : 1e-5;
    if (dt == FG_FP64 || dt == FG_FP32) {
        ck_assert_msg(fgt_stats_err(gpu.m, ref.m, ns) <= stol, "m err");
        ck_assert_msg(fgt_stats_err(gpu.l, ref.l, ns) <= stol, "l err");
    }
    outs_free(&ref);
    outs_free(&gpu);
    for (int i = 0; i < 4; i++)
        free(in[i]);
    free(hst);
    if (dslopes)
        CK_CUDA(cudaFree(dslopes));
    if (dst)
        CK_CUDA(cudaFree(dst));
    if (dmap)
        CK_CUDA(cudaFree(dmap));
}

START_TEST(test_variants)
{
    const fg_dtype dts[4] = {FG_FP64, FG_FP32, FG_FP16, FG_BF16};
    for (int i = 0; i < 4; i++)
        run_variant(&vcases[_i], dts[i], 7100 + 10 * (uint64_t)_i + (uint64_t)i);
}
END_TEST

/* The d <= 64 variant cases (windows, top-left causal, softcap, ALiBi,
 * block maps, dropout, GQA/MQA): the wide backward's kModes 2 and 6 by
 * default, then the 64-query ones (FG_ATTN_BWD_WIDE=0). */
static const int wide_vcases[] = {0, 2, 3, 5, 6, 9, 12, 13, 15};

START_TEST(test_wide_variants)
{
    for (int narrow = 0; narrow < 2; narrow++) {
        if (narrow)
            setenv("FG_ATTN_BWD_WIDE", "0", 1);
        run_variant(&vcases[wide_vcases[_i]], FG_BF16, 7700 + 10 * (uint64_t)_i + (uint64_t)narrow);
        run_variant(&vcases[wide_vcases[_i]], FG_FP16, 7800 + 10 * (uint64_t)_i + (uint64_t)narrow);
    }
    fgt_switch_restore("FG_ATTN_BWD_WIDE");
}
END_TEST

/* Deterministic mode on the wgmma backward (d <= 128, no block mask): each
 * dQ tile is summed in a fixed order of key blocks (turn counters, one
 * per 64-query tile; at d <= 64 by the wide kernels, two tiles a step,
 * and by the 64-query ones). Enough key blocks (Bc = 128) that the order matters:
 * plain (GQA, kMode 0: d = 128, and d = 64 with dropout; walks rotated,
 * dq_rotate), causal with dropout (kMode 1), top-left causal +
 * window + softcap and ALiBi (kMode 2), in fp16 and bf16: against the CPU
 * oracle as test_variants, reruns bitwise identical, and against the
 * strict dQ kernel (det_reruns). Other GPUs run the strict kernel: the
 * checks hold there too. */
static const vcase det_vcases[] = {
    {{1, 700, 1000, 2, 1, 128, 0, 0, 0.0}, 0, 0, 0, 0, 0, 0, 0, 0},
    {{2, 777, 777, 2, 2, 64, 1, 0, 0.1}, 0, 0, 0, 0, 0, 0, 0, 0},
    {{1, 900, 700, 4, 2, 128, 1, 1, 0.0}, 1, 1, 300, -1, 20.0, 0, 0, 0},
    {{1, 513, 1100, 2, 1, 64, 0, 0, 0.0}, 0, 0, 0, 0, 0, 2, 0, 0},
    /* unmasked at d = 64 (the wide kernels' rotated walk: 8 key blocks,
     * 10 steps of two heads) with dropout and GQA */
    {{2, 600, 900, 4, 2, 64, 0, 0, 0.1}, 0, 0, 0, 0, 0, 0, 0, 0},
    /* d = 256 (the split-d kernel's own turns, dq_add_split): unmasked
     * (15 key blocks of 64, the rotated walk), then causal with a window,
     * dropout and GQA (the last-to-first order) */
    {{1, 700, 900, 2, 1, 256, 0, 0, 0.0}, 0, 0, 0, 0, 0, 0, 0, 0},
    {{2, 400, 450, 4, 2, 256, 1, 0, 0.1}, 0, 1, 200, -1, 0, 0, 0, 0},
    /* d = 256, the score modifiers' kernels (kMode 2): top-left causal
     * with softcap and [B, H] ALiBi slopes, BHSD, Nq < Nk */
    {{1, 330, 520, 2, 2, 256, 1, 1, 0.0}, 1, 0, 0, 0, 15.0, 2, 0, 0},
};

/* The checked fixture of every test case (g_switches above). */
static void reset_modes(void)
{
    g_deterministic = 0;
    g_det_reruns = 0;
    fgt_switches_restore();
}

START_TEST(test_deterministic_tiles)
{
    g_deterministic = 1;
    g_det_reruns = 1;
    run_variant(&det_vcases[_i], FG_BF16, 8600 + 10 * (uint64_t)_i);
    run_variant(&det_vcases[_i], FG_FP16, 8601 + 10 * (uint64_t)_i);
    /* d <= 64: the above ran the wide kernels' turns (128-query steps,
     * two tiles a step); the 64-query kernels' turns too */
    if (det_vcases[_i].g.d <= 64) {
        setenv("FG_ATTN_BWD_WIDE", "0", 1);
        run_variant(&det_vcases[_i], FG_BF16, 8602 + 10 * (uint64_t)_i);
        fgt_switch_restore("FG_ATTN_BWD_WIDE");
    }
}
END_TEST

/* The racecheck subset of the variants and of the other kernel families:
 * bf16 variants on the fast kernels, and small shapes on the strict fp32
 * kernels (attn_fp32_*.cu) and the sm_80 (bf16) kernels. */
static const int fast_vcases[] = {0, 4, 7, 13};

START_TEST(test_fast_variants)
{
    run_variant(&vcases[fast_vcases[_i]], FG_BF16, 7900 + (uint64_t)_i);
}
END_TEST

/* Every variant case on the sm_80 mma kernels (forced, so Hopper runs
 * them too) in fp16 and bf16; reset_modes, the other checked fixture,
 * restores FG_ATTN_KERNEL even when a case fails. */
static void force_mma(void) { setenv("FG_ATTN_KERNEL", "mma", 1); }

START_TEST(test_mma_variants)
{
    run_variant(&vcases[_i], FG_FP16, 8100 + 10 * (uint64_t)_i);
    run_variant(&vcases[_i], FG_BF16, 8101 + 10 * (uint64_t)_i);
}
END_TEST

START_TEST(test_fast_other_kernels)
{
    run_case(&cases[1 + _i], FG_FP32, 7950 + (uint64_t)_i);
    setenv("FG_ATTN_KERNEL", "mma", 1);
    run_case(&cases[1 + _i], FG_BF16, 7960 + (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_KERNEL");
}
END_TEST

/* NaN in, NaN out on every path: a NaN in one query row makes that row's
 * O and m NaN (not a masked row) and its dQ NaN. */
START_TEST(test_nan_row)
{
    /* di < 6: d = 64, causal; di >= 6: fp16 / bf16 at d = 128 unmasked
     * (the Hopper backward's 80-query kernel, dQ^T tiles) */
    const gcase cs[2] = {{1, 130, 130, 2, 2, 64, 1, 0, 0.0}, {1, 130, 130, 2, 2, 128, 0, 0, 0.0}};
    const fg_dtype dts[4] = {FG_FP64, FG_FP32, FG_FP16, FG_BF16};
    for (int di = 0; di < 8; di++) { /* di 4, 5: fp16 / bf16, softcap alone */
        const gcase c = cs[di >= 6];
        const int64_t d = c.d;
        const fg_dtype dt = dts[di < 4 ? di : di < 6 ? di - 2 : di - 4];
        const size_t nq = (size_t)(130 * 2 * d);
        size_t n[4] = {nq, nq, nq, nq};
        fgt_rng rng = fgt_rng_for(1500 + (uint64_t)di);
        double *in[4];
        for (int i = 0; i < 4; i++) {
            in[i] = malloc(n[i] * 8);
            fgt_fill(in[i], n[i], &rng, 1.0);
        }
        in[0][(70 * 2 + 1) * d + 3] = NAN; /* query row 70, head 1 */
        fg_attn_params p;
        params_for(&c, &p, 91);
        if (di == 4 || di == 5)
            p.softcap = 30.0;
        outs r;
        gpu_run(&c, dt, &p, in, &r);
        for (int64_t i = 0; i < 130; i++) {
            const int bad = i == 70;
            ck_assert_msg(isnan(r.t[0][(i * 2 + 1) * d]) == bad,
                          "%s d %lld row %lld O", fg_dtype_name(dt), (long long)d, (long long)i);
            ck_assert_msg(isnan(r.m[130 + i]) == bad, "%s d %lld row %lld m",
                          fg_dtype_name(dt), (long long)d, (long long)i);
            ck_assert_msg(isnan(r.t[1][(i * 2 + 1) * d]) == bad,
                          "%s d %lld row %lld dQ", fg_dtype_name(dt), (long long)d, (long long)i);
            ck_assert(!isnan(r.t[0][(i * 2) * d])); /* head 0 untouched */
        }
        outs_free(&r);
        for (int i = 0; i < 4; i++)
            free(in[i]);
    }
}
END_TEST

/* No O(N^2) memory: at N = 32k (an N^2 fp32 matrix would be 4 GiB) the
 * forward + backward allocate only their O(B*H*N*d) workspace. */
START_TEST(test_no_quadratic_memory)
{
    const int64_t N = 32768, H = 2, d = 64;
    const size_t n = (size_t)(N * H * d);
    void *buf[8];
    for (int i = 0; i < 8; i++) {
        CK_CUDA(cudaMalloc(&buf[i], n * 2));
        CK_CUDA(cudaMemset(buf[i], 0x3c, n * 2)); /* 1.0 in bf16-ish bits */
    }
    void *m, *l;
    CK_CUDA(cudaMalloc(&m, (size_t)(H * N) * 4));
    CK_CUDA(cudaMalloc(&l, (size_t)(H * N) * 4));
    fg_attn_params p;
    fg_attn_params_init(&p, 1, N, N, H, H, d);
    p.device = FG_DEVICE_CUDA;
    p.causal = 1;
    p.dropout_p = 0.1;
    fg_attn_tensor t[8];
    for (int i = 0; i < 8; i++)
        t[i] = fg_attn_bshd(buf[i], FG_BF16, N, H, d);
    fg_attn_stats st = {m, l, FG_FP32};
    cudaMemPool_t pool;
    CK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t zero = 0, high = 0;
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
    size_t free0, free1, total;
    /* On the default stream (the library's context stream) the workspace
     * comes from flashgrad's caching allocator, on other streams from the
     * pool: measure both high-water marks. */
    fg_cuda_memory_stats ms0, ms1;
    ck_assert(fg_cuda_memory_reset_peak() == FG_OK);
    ck_assert(fg_cuda_memory_get_stats(&ms0) == FG_OK);
    CK_CUDA(cudaMemGetInfo(&free0, &total));
    ck_assert_msg(fg_attention_forward(&p, &t[0], &t[1], &t[2], &t[3], &st) == FG_OK,
                  "%s", fg_last_error());
    ck_assert_msg(fg_attention_backward(&p, &t[0], &t[1], &t[2], &t[3], &t[4], &st,
                                        &t[5], &t[6], &t[7]) == FG_OK,
                  "%s", fg_last_error());
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemGetInfo(&free1, &total));
    CK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
    ck_assert(fg_cuda_memory_get_stats(&ms1) == FG_OK);
    const uint64_t cached = (uint64_t)(ms1.peak_live_bytes - ms0.live_bytes);
    if (cached > high)
        high = cached;
    const double quad = (double)N * N * 4;
    const size_t expect = (size_t)(H * N) * 4 * (1 + d); /* D + dQ acc */
    fprintf(stderr, "N=%lld: workspace peak %.1f MiB (expected %.1f MiB), "
            "free memory change %.1f MiB; an N^2 fp32 matrix is %.0f MiB\n",
            (long long)N, high / 1048576.0, expect / 1048576.0,
            ((double)free0 - (double)free1) / 1048576.0, quad / 1048576.0);
    /* really measured, and O(N d): the allocator rounds to 2 MiB */
    ck_assert(high >= expect / 2 && high <= expect + (4 << 20));
    ck_assert((double)free0 - (double)free1 < quad / 16);
    for (int i = 0; i < 8; i++)
        CK_CUDA(cudaFree(buf[i]));
    CK_CUDA(cudaFree(m));
    CK_CUDA(cudaFree(l));
}
END_TEST

/* Host pointers with device = cuda are rejected with a status. */
START_TEST(test_host_pointer_rejected)
{
    float q[64], o[64], m[8], l[8];
    for (int i = 0; i < 64; i++)
        q[i] = 1.0f + i;
    memset(o, 0x5a, sizeof o);
    fg_attn_params p;
    fg_attn_params_init(&p, 1, 8, 8, 1, 1, 8);
    p.device = FG_DEVICE_CUDA;
    fg_attn_tensor t = fg_attn_bshd(q, FG_FP32, 8, 1, 8);
    fg_attn_tensor to = fg_attn_bshd(o, FG_FP32, 8, 1, 8);
    fg_attn_stats st = {m, l, FG_FP32};
    ck_assert(fg_attention_forward(&p, &t, &t, &t, &to, &st) ==
              FG_ERR_INVALID_ARGUMENT);
    ck_assert(strstr(fg_last_error(), "not device memory") != NULL);
    for (size_t i = 0; i < sizeof o; i++)
        ck_assert(((unsigned char *)o)[i] == 0x5a);
}
END_TEST

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU attention suite\n");
        return 77;
    }
    fgt_base_seed();
    FGT_SWITCHES_SAVE(g_switches);
    Suite *s = suite_create("gpu_attention");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 900);
    tcase_add_checked_fixture(tc, reset_modes, reset_modes);
    /* Under compute-sanitizer (FG_SANITIZE) run a representative subset. */
    const int sanitize = getenv("FG_SANITIZE") != NULL;
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    if (sanitize && strncmp(getenv("FG_SANITIZE"), "det", 3) == 0) { /* the deterministic dQ alone */
        /* det:<i>: its i-th case alone (det_vcases, then test_deterministic's
         * three), so that racecheck can run the cases as parallel processes */
        const int nv = (int)(sizeof det_vcases / sizeof det_vcases[0]);
        const char *sel = getenv("FG_SANITIZE") + 3;
        int lo = 0, hi = nv + 3;
        if (*sel == ':') {
            char *end;
            const long i = strtol(sel + 1, &end, 10);
            if (end == sel + 1 || *end != '\0' || i < 0 || i >= nv + 3) {
                fprintf(stderr, "FG_SANITIZE=det:<i>: i in 0..%d\n", nv + 2);
                return 1;
            }
            lo = (int)i;
            hi = (int)i + 1;
        } else if (*sel != '\0') {
            fprintf(stderr, "FG_SANITIZE: det or det:<i>\n");
            return 1;
        }
        if (lo < nv)
            fgt_add_loop(tc, test_deterministic_tiles, lo, hi < nv ? hi : nv);
        if (hi > nv)
            fgt_add_loop(tc, test_deterministic, lo > nv ? lo - nv : 0, hi - nv);
        suite_add_tcase(s, tc);
        return fgt_run_suite(s);
    }
    if (sanitize && strcmp(getenv("FG_SANITIZE"), "fast") == 0) {
        fgt_add_loop(tc, test_fast_path, 0,
                     (int)(sizeof fast_cases / sizeof fast_cases[0]));
        fgt_add_loop(tc, test_fast_variants, 0,
                     (int)(sizeof fast_vcases / sizeof fast_vcases[0]));
        fgt_add_loop(tc, test_staged_epilogue, 0, 3); /* the staging rows */
        /* the first three plain cases and one variant (racecheck's time) */
        fgt_add_loop(tc, test_d256_steps, 0, 3);
        fgt_add_loop(tc, test_d256_steps, N_D256, N_D256 + 1);
        fgt_add_loop(tc, test_fast_other_kernels, 0, 2);
        fgt_add_loop(tc, test_wide_d64, 0, 2);
        fgt_add_loop(tc, test_q80_d128, 1, 3);
        suite_add_tcase(s, tc);
        TCase *tm = tcase_create("mma_variants");
        tcase_set_timeout(tm, 900);
        tcase_add_checked_fixture(tm, reset_modes, reset_modes);
        tcase_add_checked_fixture(tm, force_mma, NULL);
        fgt_add_loop(tm, test_mma_variants, 7, 9); /* everything; sparse d = 256 */
        suite_add_tcase(s, tm);
        return fgt_run_suite(s);
    }
    fgt_add_loop(tc, test_vs_cpu, 0, sanitize ? 7 : ncases);
    fgt_add_loop(tc, test_general_lowp, 0, sanitize ? 4 : ncases);
    fgt_add_loop(tc, test_mma_lowp, 0, sanitize ? 4 : ncases);
    fgt_add_loop(tc, test_deterministic, 0, 3);
    fgt_add_loop(tc, test_deterministic_tiles, 0,
                 sanitize ? 2 : (int)(sizeof det_vcases / sizeof det_vcases[0]));
    fgt_add_loop(tc, test_fast_path, 0, (int)(sizeof fast_cases / sizeof fast_cases[0]));
    /* a case of its own, so CK_RUN_CASE=wide runs it alone */
    TCase *tw = tcase_create("wide");
    tcase_set_timeout(tw, 900);
    tcase_add_checked_fixture(tw, reset_modes, reset_modes);
    fgt_add_loop(tw, test_wide_d64, 0, (int)(sizeof wide_cases / sizeof wide_cases[0]));
    fgt_add_test(tw, test_wide_mask);
    fgt_add_loop(tw, test_q80_d128, 0, (int)(sizeof q80_cases / sizeof q80_cases[0]));
    fgt_add_loop(tw, test_staged_epilogue, 0,
                 (int)(sizeof epi_cases / sizeof epi_cases[0]));
    fgt_add_loop(tw, test_d256_steps, 0,
                 N_D256 + (int)(sizeof d256_vcases / sizeof d256_vcases[0]));
    fgt_add_loop(tw, test_wide_variants, 0,
                 (int)(sizeof wide_vcases / sizeof wide_vcases[0]));
    suite_add_tcase(s, tw);
    fgt_add_test(tc, test_dropout_mask);
    fgt_add_loop(tc, test_kernel_mask, 0, sanitize ? 1 : 3);
    fgt_add_test(tc, test_fully_masked);
    fgt_add_loop(tc, test_softcap_stats, 0,
                 (int)(sizeof capcases / sizeof capcases[0]));
    fgt_add_test(tc, test_host_pointer_rejected);
    fgt_add_loop(tc, test_variants, 0,
                 sanitize ? 3 : (int)(sizeof vcases / sizeof vcases[0]));
    fgt_add_test(tc, test_nan_row);
    if (!sanitize) {
        fgt_add_loop(tc, test_gradcheck_fp64, 0, 2);
        fgt_add_test(tc, test_no_quadratic_memory);
    }
    suite_add_tcase(s, tc);
    TCase *tm = tcase_create("mma_variants");
    tcase_set_timeout(tm, 900);
    tcase_add_checked_fixture(tm, reset_modes, reset_modes);
    tcase_add_checked_fixture(tm, force_mma, NULL);
    fgt_add_loop(tm, test_mma_variants, 0,
                 sanitize ? 3 : (int)(sizeof vcases / sizeof vcases[0]));
    suite_add_tcase(s, tm);
    return fgt_run_suite(s);
}
