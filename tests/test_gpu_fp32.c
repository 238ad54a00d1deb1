/* tests/test_gpu_fp32.c - the strict fp32 CUDA attention kernels
 * (kernels/attention/attn_fp32_*.cu) against the CPU fp64 oracle. Exits 77
 * (skip) without a GPU.
 *
 *  - Accuracy: inputs U(-1, 1) rounded to fp32, fresh per run; the fp64
 *    reference runs on the rounded inputs. O, dQ, dK and dV must be within
 *    1e-5 of max(max |ref|, 0.1) (test_gpu_attention.c's measure), m and l
 *    within 1e-5, over head dims 32..256 (and padded ones), odd lengths,
 *    Nq != Nk, causal, windows, softcap, ALiBi, dropout and GQA, with the
 *    atomic dQ and with deterministic = 1. Outputs are NaN-poisoned first.
 *  - Dropout: the mask the kernels apply, recovered from O (forward) and
 *    dV (backward) with Q = 0 and V, dO identity-like, equals the mask of
 *    the documented mapping (tests/ref_dropout.h) bit for bit.
 *  - Determinism: with deterministic = 1 two backward runs are bitwise
 *    identical. */
#include <check.h>
#include <cuda_runtime.h>

#include "ref_dropout.h"
#include "test_util.h"

#define CK_CUDA(call)                                                       \
    do {                                                                    \
        cudaError_t e_ = (call);                                            \
        ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call,                   \
                      cudaGetErrorString(e_));                              \
    } while (0)

typedef struct fcase {
    int64_t B, Nq, Nk, H, Hk, d;
    int causal;
    int window;        /* use wl, wr */
    int64_t wl, wr;
    double softcap;
    int alibi;         /* 1: slopes [H], 2: [B, H] */
    double p;          /* dropout */
} fcase;

static const fcase cases[] = {
    /* B   Nq    Nk  H  Hk    d  causal window wl wr softcap alibi p */
    {1, 257, 257, 2, 2, 32, 1, 0, 0, 0, 0, 0, 0.0},
    {2, 200, 200, 4, 2, 64, 1, 0, 0, 0, 0, 0, 0.1},
    {1, 300, 300, 2, 1, 128, 0, 1, 100, 0, 0, 0, 0.0},
    {1, 129, 191, 2, 2, 256, 0, 0, 0, 0, 20.0, 1, 0.1},
    {1, 1000, 1000, 2, 2, 128, 1, 0, 0, 0, 0, 0, 0.0},
    {1, 65, 7, 2, 2, 40, 1, 0, 0, 0, 0, 0, 0.2},
    {2, 7, 300, 2, 1, 96, 0, 0, 0, 0, 0, 2, 0.0},
    {1, 333, 333, 2, 2, 256, 1, 0, 0, 0, 0, 0, 0.1},
    {1, 190, 250, 3, 1, 64, 0, 1, 30, 20, 15.0, 1, 0.15},
    {1, 4097, 4097, 1, 1, 128, 1, 0, 0, 0, 0, 0, 0.0},
};

/* Host fp64 BSHD arrays -> device fp32 (NULL: NaN-poisoned output). */
static float *to_dev(const double *src, size_t n)
{
    float *dev;
    CK_CUDA(cudaMalloc((void **)&dev, n * sizeof(float)));
    if (!src) {
        CK_CUDA(cudaMemset(dev, 0xff, n * sizeof(float)));
        return dev;
    }
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = (float)src[i];
    CK_CUDA(cudaMemcpy(dev, h, n * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    return dev;
}

static double *from_dev(const float *dev, size_t n)
{
    float *h = malloc(n * sizeof(float));
    CK_CUDA(cudaMemcpy(h, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    double *out = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        out[i] = h[i];
    free(h);
    return out;
}

/* One run: [0] O [1] dQ [2] dK [3] dV, stats m, l (fp64 copies). */
typedef struct res {
    double *t[4], *m, *l;
} res;

static void res_free(res *r)
{
    for (int i = 0; i < 4; i++)
        free(r->t[i]);
    free(r->m);
    free(r->l);
}

static void sizes(const fcase *c, size_t n[4], size_t *ns)
{
    n[0] = n[1] = (size_t)(c->B * c->Nq * c->H * c->d);
    n[2] = n[3] = (size_t)(c->B * c->Nk * c->Hk * c->d);
    *ns = (size_t)(c->B * c->H * c->Nq);
}

/* in[]: Q, K, V, dO (BSHD fp64). */
static void run_cpu(const fcase *c, const fg_attn_params *p0, double *in[4], res *r)
{
    fg_attn_params p = *p0;
    p.device = FG_DEVICE_CPU;
    size_t n[4], ns;
    sizes(c, n, &ns);
    for (int i = 0; i < 4; i++)
        r->t[i] = malloc(n[i] * sizeof(double));
    r->m = malloc(ns * sizeof(double));
    r->l = malloc(ns * sizeof(double));
    fg_attn_tensor q = fg_attn_bshd(in[0], FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor k = fg_attn_bshd(in[1], FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor v = fg_attn_bshd(in[2], FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor g = fg_attn_bshd(in[3], FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor o = fg_attn_bshd(r->t[0], FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor dq = fg_attn_bshd(r->t[1], FG_FP64, c->Nq, c->H, c->d);
    fg_attn_tensor dk = fg_attn_bshd(r->t[2], FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_tensor dv = fg_attn_bshd(r->t[3], FG_FP64, c->Nk, c->Hk, c->d);
    fg_attn_stats st = {r->m, r->l, FG_FP64};
    ck_assert_msg(fg_attention_forward(&p, &q, &k, &v, &o, &st) == FG_OK, "cpu: %s",
                  fg_last_error());
    ck_assert_msg(fg_attention_backward(&p, &q, &k, &v, &o, &g, &st, &dq, &dk, &dv) == FG_OK,
                  "cpu: %s", fg_last_error());
}

static void run_gpu(const fcase *c, const fg_attn_params *p0, double *in[4], res *r)
{
    fg_attn_params p = *p0;
    p.device = FG_DEVICE_CUDA;
    size_t n[4], ns;
    sizes(c, n, &ns);
    float *dev_in[4], *dev_out[4], *m, *l;
    for (int i = 0; i < 4; i++) {
        dev_in[i] = to_dev(in[i], n[i == 1 || i == 2 ? 2 : 0]);
        dev_out[i] = to_dev(NULL, n[i]);
    }
    m = to_dev(NULL, ns);
    l = to_dev(NULL, ns);
    fg_attn_tensor q = fg_attn_bshd(dev_in[0], FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor k = fg_attn_bshd(dev_in[1], FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_tensor v = fg_attn_bshd(dev_in[2], FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_tensor g = fg_attn_bshd(dev_in[3], FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor o = fg_attn_bshd(dev_out[0], FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor dq = fg_attn_bshd(dev_out[1], FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor dk = fg_attn_bshd(dev_out[2], FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_tensor dv = fg_attn_bshd(dev_out[3], FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_stats st = {m, l, FG_FP32};
    ck_assert_msg(fg_attention_forward(&p, &q, &k, &v, &o, &st) == FG_OK, "gpu: %s",
                  fg_last_error());
    ck_assert_msg(fg_attention_backward(&p, &q, &k, &v, &o, &g, &st, &dq, &dk, &dv) == FG_OK,
                  "gpu: %s", fg_last_error());
    CK_CUDA(cudaDeviceSynchronize());
    for (int i = 0; i < 4; i++) {
        r->t[i] = from_dev(dev_out[i], n[i]);
        CK_CUDA(cudaFree(dev_in[i]));
        CK_CUDA(cudaFree(dev_out[i]));
    }
    r->m = from_dev(m, ns);
    r->l = from_dev(l, ns);
    CK_CUDA(cudaFree(m));
    CK_CUDA(cudaFree(l));
}

/* The params of c; ALiBi slopes go to *hslopes (CPU) and *dslopes (GPU). */
static void make_params(const fcase *c, fgt_rng *rng, int det, fg_attn_params *p,
                        float *hslopes, float **dslopes)
{
    fg_attn_params_init(p, c->B, c->Nq, c->Nk, c->H, c->Hk, c->d);
    p->causal = c->causal;
    p->dropout_p = c->p;
    p->seed = fgt_next(rng);
    p->offset = fgt_next(rng) >> 7;
    p->deterministic = det;
    if (c->window) {
        p->window_left = c->wl;
        p->window_right = c->wr;
    }
    p->softcap = c->softcap;
    *dslopes = NULL;
    if (c->alibi) {
        const int64_t n = (c->alibi == 2 ? c->B : 1) * c->H;
        for (int64_t i = 0; i < n; i++)
            hslopes[i] = (float)(0.02 + 0.3 * fabs(fgt_uniform(rng)));
        CK_CUDA(cudaMalloc((void **)dslopes, sizeof(float) * (size_t)n));
        CK_CUDA(cudaMemcpy(*dslopes, hslopes, sizeof(float) * (size_t)n,
                           cudaMemcpyHostToDevice));
        p->alibi_slopes = hslopes;
        p->alibi_stride_b = c->alibi == 2 ? c->H : 0;
    }
}

static const char *names[4] = {"O", "dQ", "dK", "dV"};

static void check_case(const fcase *c, int det, uint64_t salt)
{
    size_t n[4], ns;
    sizes(c, n, &ns);
    fgt_rng rng = fgt_rng_for(salt);
    double *in[4];
    for (int i = 0; i < 4; i++) {
        const size_t m = n[i == 1 || i == 2 ? 2 : 0];
        in[i] = malloc(m * sizeof(double));
        fgt_fill(in[i], m, &rng, 1.0);
        for (size_t e = 0; e < m; e++)
            in[i][e] = (float)in[i][e];
    }
    fg_attn_params p, pg;
    float slopes[64], *dslopes;
    make_params(c, &rng, det, &p, slopes, &dslopes);
    pg = p;
    if (dslopes)
        pg.alibi_slopes = dslopes;
    res ref, gpu;
    run_cpu(c, &p, in, &ref);
    run_gpu(c, &pg, in, &gpu);
    for (int i = 0; i < 4; i++) {
        const double e = fgt_rel_err_floor(gpu.t[i], ref.t[i], n[i], 0.1);
        ck_assert_msg(e <= 1e-5 && fgt_all_finite(gpu.t[i], n[i]),
                      "fp32 %s err %.3g > 1e-5 (B=%lld Nq=%lld Nk=%lld H=%lld Hk=%lld "
                      "d=%lld causal=%d win=%d(%lld,%lld) cap=%g alibi=%d p=%g det=%d)",
                      names[i], e, (long long)c->B, (long long)c->Nq, (long long)c->Nk,
                      (long long)c->H, (long long)c->Hk, (long long)c->d, c->causal,
                      c->window, (long long)c->wl, (long long)c->wr, c->softcap, c->alibi,
                      c->p, det);
    }
    ck_assert_msg(fgt_stats_err(gpu.m, ref.m, ns) <= 1e-5, "m err %g",
                  fgt_stats_err(gpu.m, ref.m, ns));
    ck_assert_msg(fgt_stats_err(gpu.l, ref.l, ns) <= 1e-5, "l err %g",
                  fgt_stats_err(gpu.l, ref.l, ns));
    res_free(&ref);
    res_free(&gpu);
    for (int i = 0; i < 4; i++)
        free(in[i]);
    if (dslopes)
        CK_CUDA(cudaFree(dslopes));
}

START_TEST(test_fp32_vs_cpu)
{
    check_case(&cases[_i], 0, 9100 + (uint64_t)_i);
}
END_TEST

START_TEST(test_fp32_deterministic_vs_cpu)
{
    check_case(&cases[_i], 1, 9200 + (uint64_t)_i);
}
END_TEST

/* The mask the kernels apply: with Q = 0 every visible probability is
 * 1/Nk, so with V[j] = e_j, O[i][j] = keep(i, j) / ((1 - p) Nk); with
 * dO[i] = e_i, dV[j][i] = P_ij keep(i, j) / (1 - p). Nq, Nk <= d. */
static void mask_case(int64_t N, int64_t d, uint64_t salt)
{
    const fcase c = {2, N, N, 2, 2, d, 0, 0, 0, 0, 0, 0, 0.3};
    size_t n[4], ns;
    sizes(&c, n, &ns);
    double *in[4];
    for (int i = 0; i < 4; i++)
        in[i] = calloc(n[i == 1 || i == 2 ? 2 : 0], sizeof(double));
    fgt_rng rng = fgt_rng_for(salt);
    fgt_fill(in[1], n[2], &rng, 1.0);
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t s = 0; s < N; s++)
            for (int64_t h = 0; h < c.H; h++) {
                in[2][((b * N + s) * c.H + h) * d + s] = 1.0;
                in[3][((b * N + s) * c.H + h) * d + s] = 1.0;
            }
    fg_attn_params p;
    float slopes[1], *dslopes;
    make_params(&c, &rng, 0, &p, slopes, &dslopes);
    res gpu;
    run_gpu(&c, &p, in, &gpu);
    uint8_t *mask = malloc((size_t)(c.B * c.H * N * N));
    ref_dropout_mask(p.seed, p.offset, c.p, c.B, c.H, N, N, mask);
    int64_t bad_o = 0, bad_dv = 0, kept = 0;
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.H; h++)
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < N; j++) {
                    const int keep = mask[((b * c.H + h) * N + i) * N + j];
                    kept += keep;
                    bad_o += (gpu.t[0][((b * N + i) * c.H + h) * d + j] != 0) != keep;
                    bad_dv += (gpu.t[3][((b * N + j) * c.H + h) * d + i] != 0) != keep;
                }
    ck_assert_msg(bad_o == 0 && bad_dv == 0,
                  "N=%lld d=%lld: %lld forward and %lld backward mask bits differ",
                  (long long)N, (long long)d, (long long)bad_o, (long long)bad_dv);
    /* not a vacuous mask: about 70% kept */
    ck_assert(kept > c.B * c.H * N * N / 2 && kept < c.B * c.H * N * N * 9 / 10);
    res_free(&gpu);
    free(mask);
    for (int i = 0; i < 4; i++)
        free(in[i]);
}

START_TEST(test_fp32_dropout_mask)
{
    mask_case(64, 64, 9300);
    mask_case(100, 128, 9301); /* two key blocks, a partial one */
    mask_case(61, 256, 9302);  /* d = 256: 32-key blocks */
    mask_case(32, 32, 9303);
}
END_TEST

START_TEST(test_fp32_deterministic_reruns)
{
    const fcase *c = &cases[1]; /* GQA + causal + dropout */
    size_t n[4], ns;
    sizes(c, n, &ns);
    fgt_rng rng = fgt_rng_for(9400);
    double *in[4];
    for (int i = 0; i < 4; i++) {
        in[i] = malloc(n[i == 1 || i == 2 ? 2 : 0] * sizeof(double));
        fgt_fill(in[i], n[i == 1 || i == 2 ? 2 : 0], &rng, 1.0);
    }
    fg_attn_params p;
    float slopes[1], *dslopes;
    make_params(c, &rng, 1, &p, slopes, &dslopes);
    res r1, r2;
    run_gpu(c, &p, in, &r1);
    run_gpu(c, &p, in, &r2);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(memcmp(r1.t[i], r2.t[i], n[i] * sizeof(double)) == 0,
                      "%s differs between deterministic runs", names[i]);
    res_free(&r1);
    res_free(&r2);
    for (int i = 0; i < 4; i++)
        free(in[i]);
}
END_TEST

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU fp32 attention suite\n");
        return 77;
    }
    fgt_base_seed();
    Suite *s = suite_create("gpu_fp32");
    TCase *tc = tcase_create("strict");
    tcase_set_timeout(tc, 900);
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    tcase_add_loop_test(tc, test_fp32_vs_cpu, 0, ncases);
    tcase_add_loop_test(tc, test_fp32_deterministic_vs_cpu, 0, ncases);
    tcase_add_test(tc, test_fp32_dropout_mask);
    tcase_add_test(tc, test_fp32_deterministic_reruns);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
