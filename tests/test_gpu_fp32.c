/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_fp32.c - the fp32 CUDA attention kernels against the CPU
 * fp64 oracle: strict fp32 on tensor cores (the 3xTF32 mode of
 * kernels/attention/attn_tf32_*.cu, the default where it applies) and on
 * the SIMT kernels (attn_fp32_*.cu; FG_ATTN_KERNEL=simt forces them, and
 * they take what the tensor-core kernels do not), and the TF32 opt-in.
 * Exits 77 (skip) without a GPU.
 *
 *  - Accuracy: inputs U(-a, a) (a = 1, or 3-4 for sharp softmaxes) rounded
 *    to fp32, fresh per run; the fp64 reference runs on the rounded inputs.
 *    For both strict paths O, dQ, dK and dV must be within 1e-5 of
 *    max(max |ref|, 0.1) (test_gpu_attention.c's measure), m and l within
 *    1e-5 (split_tol() below), over head dims 32..256 (and padded ones), odd lengths, Nq != Nk,
 *    causal, windows, softcap, ALiBi, dropout and GQA, with the atomic dQ
 *    and with deterministic = 1; the two paths must not be bitwise
 *    equal (3xTF32 did run: its sums go in another order). Outputs are
 *    NaN-poisoned first.
 *  - Dropout: the mask the kernels apply (3xTF32, SIMT and TF32),
 *    recovered from O (forward) and dV (backward) with Q = 0 and V, dO
 *    identity-like, equals the mask of the documented mapping
 *    (tests/ref_dropout.h) bit for bit.
 *  - Determinism: with deterministic = 1 two backward runs are bitwise
 *    identical (3xTF32 and SIMT).
 *  - Fallback: misaligned operands run on the SIMT kernels (bitwise the
 *    forced-SIMT results) within the strict bound, TF32 switch on or off.
 *  - TF32 (fg_cuda_set_attention_allow_tf32): the same cases and masks
 *    against the same oracle within the TF32 bound below; with the switch
 *    off again the results are bitwise those of a run before it was
 *    touched, and with it on they differ (TF32 did run); bad input is
 *    still refused before anything is written.
 *
 * The TF32 bound. TF32 keeps 10 mantissa bits: rounding (cvt.rna) moves a
 * value by at most u = 2^-11 relative. A logit scale q.k with both factors
 * rounded moves by at most 2u scale sum |q_x k_x| <= 2u sigma, sigma =
 * scale max|q_i| max|k_j| (about sqrt(d) / 3 for U(-1, 1) entries: the
 * error grows with sqrt(d)); P then moves by a factor in [e^-4u sigma,
 * e^4u sigma], and every later product adds one or two rounded factors
 * (P or dS, V, dO, Q, K: 2u relative per term). With aligned errors this
 * gives O errors up to (4 sigma + 2) u max|V|; independent roundings add
 * as a random walk instead. The tests require, for every output and m, l,
 * error <= u (1 + sigma) of max(max |ref|, 0.1): a CPU emulation of
 * exactly this rounding (inputs, P and dS to TF32, the rest fp64) over
 * these shapes stays at 0.02-0.3 of it, and bf16-sized rounding (2^-8)
 * would exceed it. */
#include "config.h" /* FG_ATTN_TF32X3 */

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
    double amp;        /* inputs U(-amp, amp); 0 means 1 */
} fcase;

/* Device copies are offset by g_shift floats (1: misaligned rows). */
static int64_t g_shift;

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
    /* logits of std ~3: a sharp softmax, where errors of S matter most */
    {2, 256, 256, 4, 1, 128, 1, 0, 0, 0, 0, 0, 0.0, 3.0},
    {1, 200, 180, 2, 2, 256, 0, 0, 0, 0, 0, 0, 0.1, 3.0},
    {1, 150, 150, 2, 2, 32, 0, 1, 20, 5, 0, 1, 0.0, 4.0},
};

/* Host fp64 BSHD arrays -> device fp32 at base + g_shift (NULL:
 * NaN-poisoned output); returns the base. */
static float *to_dev(const double *src, size_t n)
{
    float *dev;
    CK_CUDA(cudaMalloc((void **)&dev, (n + 4) * sizeof(float)));
    CK_CUDA(cudaMemset(dev, 0xff, (n + 4) * sizeof(float)));
    if (!src)
        return dev;
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = (float)src[i];
    CK_CUDA(cudaMemcpy(dev + g_shift, h, n * sizeof(float), cudaMemcpyHostToDevice));
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
    const int64_t z = g_shift;
    fg_attn_tensor q = fg_attn_bshd(dev_in[0] + z, FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor k = fg_attn_bshd(dev_in[1] + z, FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_tensor v = fg_attn_bshd(dev_in[2] + z, FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_tensor g = fg_attn_bshd(dev_in[3] + z, FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor o = fg_attn_bshd(dev_out[0] + z, FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor dq = fg_attn_bshd(dev_out[1] + z, FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor dk = fg_attn_bshd(dev_out[2] + z, FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_tensor dv = fg_attn_bshd(dev_out[3] + z, FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_stats st = {m, l, FG_FP32};
    ck_assert_msg(fg_attention_forward(&p, &q, &k, &v, &o, &st) == FG_OK, "gpu: %s",
                  fg_last_error());
    ck_assert_msg(fg_attention_backward(&p, &q, &k, &v, &o, &g, &st, &dq, &dk, &dv) == FG_OK,
                  "gpu: %s", fg_last_error());
    CK_CUDA(cudaDeviceSynchronize());
    for (int i = 0; i < 4; i++) {
        r->t[i] = from_dev(dev_out[i] + z, n[i]);
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

/* Fresh U(-1, 1) inputs Q, K, V, dO of c (BSHD), rounded to fp32 so the
 * fp64 oracle sees what the GPU sees. */
static void make_inputs(const fcase *c, fgt_rng *rng, double *in[4])
{
    size_t n[4], ns;
    sizes(c, n, &ns);
    for (int i = 0; i < 4; i++) {
        const size_t m = n[i == 1 || i == 2 ? 2 : 0];
        in[i] = malloc(m * sizeof(double));
        fgt_fill(in[i], m, rng, c->amp > 0 ? c->amp : 1.0);
        for (size_t e = 0; e < m; e++)
            in[i][e] = (float)in[i][e];
    }
}

/* u (1 + scale max|q_i| max|k_j|), the TF32 bound (top of the file). */
static double tf32_bound(const fcase *c, double *in[4])
{
    double qm = 0, km = 0;
    for (int t = 0; t < 2; t++) {
        const int64_t rows = t ? c->B * c->Nk * c->Hk : c->B * c->Nq * c->H;
        for (int64_t r = 0; r < rows; r++) {
            double n2 = 0;
            for (int64_t x = 0; x < c->d; x++)
                n2 += in[t][r * c->d + x] * in[t][r * c->d + x];
            double *mx = t ? &km : &qm;
            *mx = n2 > *mx ? n2 : *mx;
        }
    }
    return ldexp(1.0, -11) * (1.0 + sqrt(qm * km / (double)c->d));
}

static void set_tf32(int on)
{
    ck_assert_msg(fg_cuda_set_attention_allow_tf32(on) == FG_OK, "%s", fg_last_error());
    ck_assert_int_eq(fg_cuda_get_attention_allow_tf32(), on);
}

/* The GPU paths of check_case. PATH_DEFAULT is what fp32 runs by default
 * (3xTF32 where the tensor-core kernels take the problem; FG_ATTN_KERNEL
 * unset for the run), PATH_SIMT the SIMT kernels (FG_ATTN_KERNEL=simt),
 * PATH_TF32 the TF32 switch on for the run. */
enum { PATH_DEFAULT = 1, PATH_SIMT = 2, PATH_TF32 = 4 };

/* 3xTF32's bound: the strict one. The tensor cores truncate each MMA's
 * sum; with a k step's three MMAs going straight into the long-lived
 * accumulator the error grew with the row length (H100: 5.5e-5, dK at
 * N = 4097 causal, d = 128). Summed in a tile of their own (attn_tf32.cuh
 * `mma`, session 39) every output stayed at <= 0.31 of 1e-5 on an H200
 * (that dK 0.10; session 40). FG_TEST_SPLIT_TOL overrides it, to read the
 * margins of a trial (the err/tol lines). */
static double split_tol(void)
{
    const char *e = getenv("FG_TEST_SPLIT_TOL");
    return e && atof(e) > 0 ? atof(e) : 1e-5;
}

static void run_path(const fcase *c, const fg_attn_params *p, double *in[4], int path, res *r)
{
    if (path == PATH_DEFAULT)
        unsetenv("FG_ATTN_KERNEL");
    if (path == PATH_SIMT)
        setenv("FG_ATTN_KERNEL", "simt", 1);
    if (path == PATH_TF32)
        set_tf32(1);
    run_gpu(c, p, in, r);
    if (path == PATH_TF32)
        set_tf32(0);
    if (path == PATH_SIMT || path == PATH_DEFAULT)
        fgt_switch_restore("FG_ATTN_KERNEL");
}

/* Each GPU path in `paths` against one fp64 CPU oracle run: 1e-5 (SIMT),
 * split_tol() (3xTF32) or the TF32 bound. With both on aligned operands,
 * their O and dK must differ somewhere (else 3xTF32 did not run). */
static void check_case(const fcase *c, int det, int paths, uint64_t salt)
{
    static const char *pname[5] = {"", "fp32x3", "simt", "", "tf32"};
#ifndef FG_ATTN_TF32X3
    paths &= ~PATH_DEFAULT; /* 3xTF32 not built (--disable-attn-tf32x3) */
#endif
    size_t n[4], ns;
    sizes(c, n, &ns);
    fgt_rng rng = fgt_rng_for(salt);
    double *in[4];
    make_inputs(c, &rng, in);
    fg_attn_params p, pg;
    float slopes[64], *dslopes;
    make_params(c, &rng, det, &p, slopes, &dslopes);
    pg = p;
    if (dslopes)
        pg.alibi_slopes = dslopes;
    res ref, gpu[5];
    run_cpu(c, &p, in, &ref);
    for (int path = 1; path <= PATH_TF32; path <<= 1) {
        if (!(paths & path))
            continue;
        run_path(c, &pg, in, path, &gpu[path]);
        const res *g = &gpu[path];
        const double tol = path == PATH_TF32      ? tf32_bound(c, in)
                           : path == PATH_DEFAULT ? split_tol()
                                                  : 1e-5;
        double err[6];
        for (int i = 0; i < 4; i++)
            err[i] = fgt_rel_err_floor(g->t[i], ref.t[i], n[i], 0.1);
        err[4] = fgt_stats_err(g->m, ref.m, ns);
        err[5] = fgt_stats_err(g->l, ref.l, ns);
        /* the margins, for the log: O dQ dK dV m l as fractions of tol */
        printf("%s d=%lld N=%lld/%lld amp=%g det=%d: err/tol %.2f %.2f %.2f %.2f %.2f %.2f\n",
               pname[path], (long long)c->d, (long long)c->Nq, (long long)c->Nk,
               c->amp > 0 ? c->amp : 1.0, det, err[0] / tol, err[1] / tol, err[2] / tol,
               err[3] / tol, err[4] / tol, err[5] / tol);
        for (int i = 0; i < 4; i++) {
            const double e = err[i];
            ck_assert_msg(e <= tol && fgt_all_finite(g->t[i], n[i]),
                          "%s %s err %.3g > %.3g (B=%lld Nq=%lld Nk=%lld H=%lld Hk=%lld "
                          "d=%lld causal=%d win=%d(%lld,%lld) cap=%g alibi=%d p=%g amp=%g "
                          "det=%d)",
                          pname[path], names[i], e, tol, (long long)c->B, (long long)c->Nq,
                          (long long)c->Nk, (long long)c->H, (long long)c->Hk,
                          (long long)c->d, c->causal, c->window, (long long)c->wl,
                          (long long)c->wr, c->softcap, c->alibi, c->p, c->amp, det);
        }
        ck_assert_msg(err[4] <= tol, "%s m err %g > %g", pname[path], err[4], tol);
        ck_assert_msg(err[5] <= tol, "%s l err %g > %g", pname[path], err[5], tol);
    }
    if ((paths & PATH_DEFAULT) && (paths & PATH_SIMT)) {
        /* O and dK are deterministic on both paths (dQ's atomics are not) */
        const int same = memcmp(gpu[PATH_DEFAULT].t[0], gpu[PATH_SIMT].t[0], n[0] * 8) == 0 &&
                         memcmp(gpu[PATH_DEFAULT].t[2], gpu[PATH_SIMT].t[2], n[2] * 8) == 0;
        if (g_shift == 0)
            ck_assert_msg(!same, "O and dK bitwise the SIMT kernels': 3xTF32 did not run");
        else /* misaligned: the tensor-core kernels must leave it to SIMT */
            ck_assert_msg(same, "misaligned operands did not run on the SIMT kernels");
    }
    for (int path = 1; path <= PATH_TF32; path <<= 1)
        if (paths & path)
            res_free(&gpu[path]);
    res_free(&ref);
    for (int i = 0; i < 4; i++)
        free(in[i]);
    if (dslopes)
        CK_CUDA(cudaFree(dslopes));
}

START_TEST(test_fp32_vs_cpu)
{
    check_case(&cases[_i], 0, PATH_DEFAULT | PATH_SIMT, 9100 + (uint64_t)_i);
}
END_TEST

START_TEST(test_fp32_deterministic_vs_cpu)
{
    check_case(&cases[_i], 1, PATH_DEFAULT | PATH_SIMT, 9200 + (uint64_t)_i);
}
END_TEST

/* The mask the kernels apply: with Q = 0 every visible probability is
 * 1/Nk, so with V[j] = e_j, O[i][j] = keep(i, j) / ((1 - p) Nk); with
 * dO[i] = e_i, dV[j][i] = P_ij keep(i, j) / (1 - p). Nq, Nk <= d. */
static void mask_case(int64_t N, int64_t d, int path, uint64_t salt)
{
    const fcase c = {2, N, N, 2, 2, d, 0, 0, 0, 0, 0, 0, 0.3};
    size_t n[4], ns;
    sizes(&c, n, &ns);
    double *in[4];
    for (int i = 0; i < 4; i++)
        in[i] = calloc(n[i == 1 || i == 2 ? 2 : 0], sizeof(double));
    fgt_rng rng = fgt_rng_for(salt);
    fgt_fill(in[1], n[2], &rng, 1.0);
    fgt_unit_rows(in[2], c.B, N, c.H, d);
    fgt_unit_rows(in[3], c.B, N, c.H, d);
    fg_attn_params p;
    float slopes[1], *dslopes;
    make_params(&c, &rng, 0, &p, slopes, &dslopes);
    res gpu;
    run_path(&c, &p, in, path, &gpu);
    uint8_t *mask = malloc((size_t)(c.B * c.H * N * N));
    ref_dropout_mask(p.seed, p.offset, c.p, c.B, c.H, N, N, mask);
    int64_t bad_o, bad_dv;
    const int64_t kept = ref_mask_mismatch(mask, 0, gpu.t[0], gpu.t[3], c.B, c.H, N, d,
                                           &bad_o, &bad_dv);
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
    for (int path = PATH_DEFAULT; path <= PATH_SIMT; path <<= 1) {
        mask_case(64, 64, path, 9300);
        mask_case(100, 128, path, 9301); /* two key blocks, a partial one */
        mask_case(61, 256, path, 9302);  /* d = 256: 32-key blocks */
        mask_case(32, 32, path, 9303);
    }
}
END_TEST

/* The d = 256 cases on the kernels that GPUs without about 220 KiB of
 * shared memory per block (A100) take: the 4-warp forward tile
 * (FG_ATTN_TF32_WIDE=0) and, with FG_ATTN_TF32_PAIR=0, the backward in
 * two launches of d halves (TF32; strict fp32's backward then runs on
 * the SIMT kernels). An H100 or H200 runs the paired-warp backward
 * (3xTF32 and TF32) by default and the unpaired 8-warp forward. Strict,
 * deterministic and TF32. */
static const int d256_cases[] = {3, 7, 11};

START_TEST(test_d256_narrow)
{
    setenv("FG_ATTN_TF32_WIDE", "0", 1);
    setenv("FG_ATTN_TF32_PAIR", "0", 1);
    const fcase *c = &cases[d256_cases[_i]];
    check_case(c, 0, PATH_DEFAULT | PATH_SIMT, 9700 + (uint64_t)_i);
    check_case(c, 1, PATH_DEFAULT, 9710 + (uint64_t)_i);
    check_case(c, 0, PATH_TF32, 9720 + (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_TF32_PAIR");
    fgt_switch_restore("FG_ATTN_TF32_WIDE");
}
END_TEST

/* The d = 256 cases with FG_ATTN_TF32_PAIR=0 alone: the unpaired 8-warp
 * 3xTF32 forward (and the backward as in test_d256_narrow). */
START_TEST(test_d256_unpaired)
{
    setenv("FG_ATTN_TF32_PAIR", "0", 1);
    const fcase *c = &cases[d256_cases[_i]];
    check_case(c, 0, PATH_DEFAULT | PATH_SIMT, 9730 + (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_TF32_PAIR");
}
END_TEST

/* The 3xTF32 kernels at d = 128 split K and V (forward) or Q_i and dO_i
 * (backward) once per block into shared memory, for 8 warps;
 * FG_ATTN_TF32X3_TILES=0 keeps the 4-warp kernels that split them in
 * registers. The splits are the same values and every sum runs in the
 * same order, so O, m, l, dK and dV (dQ's atomics are not ordered) are
 * bitwise equal, and the register kernels hold the strict bound against
 * the oracle. Cases: window, causal over 1000 and 4097 rows, a sharp
 * softmax with GQA. */
static const int d128_cases[] = {2, 4, 8, 9};

START_TEST(test_d128_split_tiles)
{
#ifdef FG_ATTN_TF32X3
    const fcase *c = &cases[d128_cases[_i]];
    size_t n[4], ns;
    sizes(c, n, &ns);
    fgt_rng rng = fgt_rng_for(9800 + (uint64_t)_i);
    double *in[4];
    make_inputs(c, &rng, in);
    fg_attn_params p;
    float slopes[64], *dslopes;
    make_params(c, &rng, 0, &p, slopes, &dslopes);
    if (dslopes)
        p.alibi_slopes = dslopes;
    res tiles, regs;
    run_path(c, &p, in, PATH_DEFAULT, &tiles);
    setenv("FG_ATTN_TF32X3_TILES", "0", 1);
    run_path(c, &p, in, PATH_DEFAULT, &regs);
    fgt_switch_restore("FG_ATTN_TF32X3_TILES");
    static const int outs[3] = {0, 2, 3};
    for (int i = 0; i < 3; i++)
        ck_assert_msg(memcmp(tiles.t[outs[i]], regs.t[outs[i]], n[outs[i]] * 8) == 0,
                      "%s differs between the tile and register splits (d=128 Nq=%lld)",
                      names[outs[i]], (long long)c->Nq);
    ck_assert_msg(memcmp(tiles.m, regs.m, ns * 8) == 0 && memcmp(tiles.l, regs.l, ns * 8) == 0,
                  "m, l differ between the tile and register splits");
    res_free(&tiles);
    res_free(&regs);
    for (int i = 0; i < 4; i++)
        free(in[i]);
    if (dslopes)
        CK_CUDA(cudaFree(dslopes));
    setenv("FG_ATTN_TF32X3_TILES", "0", 1);
    check_case(c, 0, PATH_DEFAULT, 9810 + (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_TF32X3_TILES");
#endif
}
END_TEST

START_TEST(test_tf32_vs_cpu)
{
    check_case(&cases[_i], 0, PATH_TF32, 9500 + (uint64_t)_i);
}
END_TEST

START_TEST(test_tf32_deterministic_vs_cpu)
{
    check_case(&cases[_i], 1, PATH_TF32, 9600 + (uint64_t)_i);
}
END_TEST

/* The TF32 kernels apply the same mask: 1/Nk and the identity-like V and
 * dO are exact in TF32, so zero <=> dropped still holds. */
START_TEST(test_tf32_dropout_mask)
{
    mask_case(64, 64, PATH_TF32, 9700);
    mask_case(100, 128, PATH_TF32, 9701);
    mask_case(61, 256, PATH_TF32, 9702); /* d = 256: 32-key blocks, paired warps */
    mask_case(32, 32, PATH_TF32, 9703);
}
END_TEST

START_TEST(test_fp32_deterministic_reruns)
{
    const fcase *c = &cases[1]; /* GQA + causal + dropout */
    size_t n[4], ns;
    sizes(c, n, &ns);
    fgt_rng rng = fgt_rng_for(9400);
    double *in[4];
    make_inputs(c, &rng, in);
    fg_attn_params p;
    float slopes[1], *dslopes;
    make_params(c, &rng, 1, &p, slopes, &dslopes);
    for (int path = PATH_DEFAULT; path <= PATH_SIMT; path <<= 1) {
        res r1, r2;
        run_path(c, &p, in, path, &r1);
        run_path(c, &p, in, path, &r2);
        for (int i = 0; i < 4; i++)
            ck_assert_msg(memcmp(r1.t[i], r2.t[i], n[i] * sizeof(double)) == 0,
                          "%s differs between deterministic runs (%s)", names[i],
                          path == PATH_SIMT ? "simt" : "3xTF32");
        res_free(&r1);
        res_free(&r2);
    }
    for (int i = 0; i < 4; i++)
        free(in[i]);
}
END_TEST

/* Off by default; with it off again, results are bitwise those of a run
 * before it was touched (deterministic = 1, so dQ is too); with it on they
 * differ. */
START_TEST(test_tf32_switch)
{
    ck_assert_int_eq(fg_cuda_get_attention_allow_tf32(), 0);
    const fcase *c = &cases[1]; /* GQA + causal + dropout */
    size_t n[4], ns;
    sizes(c, n, &ns);
    fgt_rng rng = fgt_rng_for(9800);
    double *in[4];
    make_inputs(c, &rng, in);
    fg_attn_params p;
    float slopes[1], *dslopes;
    make_params(c, &rng, 1, &p, slopes, &dslopes);
    res before, on, after;
    run_gpu(c, &p, in, &before);
    set_tf32(1);
    run_gpu(c, &p, in, &on);
    set_tf32(0);
    run_gpu(c, &p, in, &after);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(memcmp(before.t[i], after.t[i], n[i] * sizeof(double)) == 0,
                      "%s: strict results changed after the TF32 switch", names[i]);
    ck_assert(memcmp(before.m, after.m, ns * sizeof(double)) == 0 &&
              memcmp(before.l, after.l, ns * sizeof(double)) == 0);
    ck_assert_msg(memcmp(before.t[0], on.t[0], n[0] * sizeof(double)) != 0 &&
                      memcmp(before.t[2], on.t[2], n[2] * sizeof(double)) != 0,
                  "O and dK with TF32 on are bitwise the strict ones: TF32 did not run");
    res_free(&before);
    res_free(&on);
    res_free(&after);
    for (int i = 0; i < 4; i++)
        free(in[i]);
}
END_TEST

/* Misaligned rows (4 bytes off) are left to the SIMT kernels, with the
 * TF32 switch on or off (then the tensor-core kernels' 3xTF32 mode must
 * not take them either: bitwise the forced-SIMT results), and meet the
 * strict bound; with TF32 on, bad input is refused before anything is
 * written. */
START_TEST(test_tf32_fallback_and_bad_input)
{
    g_shift = 1;
    check_case(&cases[3], 0, PATH_DEFAULT | PATH_SIMT, 9910);
    set_tf32(1); /* PATH_DEFAULT leaves it on */
    check_case(&cases[2], 0, PATH_DEFAULT, 9900);
    check_case(&cases[5], 1, PATH_DEFAULT, 9901);
    g_shift = 0;
    const fcase *c = &cases[0];
    size_t n[4], ns;
    sizes(c, n, &ns);
    float *dev[6];
    for (int i = 0; i < 4; i++) /* Q, K, V, O */
        dev[i] = to_dev(NULL, n[i == 1 || i == 2 ? 2 : 0]);
    dev[4] = to_dev(NULL, ns);
    dev[5] = to_dev(NULL, ns);
    fg_attn_params p;
    fg_attn_params_init(&p, c->B, c->Nq, c->Nk, c->H, c->Hk, c->d);
    p.device = FG_DEVICE_CUDA;
    p.dropout_p = 1.0; /* must be < 1 */
    fg_attn_tensor q = fg_attn_bshd(dev[0], FG_FP32, c->Nq, c->H, c->d);
    fg_attn_tensor k = fg_attn_bshd(dev[1], FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_tensor v = fg_attn_bshd(dev[2], FG_FP32, c->Nk, c->Hk, c->d);
    fg_attn_tensor o = fg_attn_bshd(dev[3], FG_FP32, c->Nq, c->H, c->d);
    fg_attn_stats st = {dev[4], dev[5], FG_FP32};
    ck_assert_int_eq(fg_attention_forward(&p, &q, &k, &v, &o, &st), FG_ERR_INVALID_ARGUMENT);
    ck_assert(strstr(fg_last_error(), "dropout") != NULL);
    CK_CUDA(cudaDeviceSynchronize());
    double *oh = from_dev(dev[3], n[0]), *mh = from_dev(dev[4], ns);
    for (size_t i = 0; i < n[0]; i++)
        ck_assert_msg(isnan(oh[i]), "O[%zu] was written", i);
    for (size_t i = 0; i < ns; i++)
        ck_assert_msg(isnan(mh[i]), "m[%zu] was written", i);
    set_tf32(0);
    free(oh);
    free(mh);
    for (int i = 0; i < 6; i++)
        CK_CUDA(cudaFree(dev[i]));
}
END_TEST

/* Kernel switches the tests set, restored around each test (test_util.h:
 * under CK_FORK=no a failed test would leave them set), and the TF32
 * opt-in turned off after each (not before: test_tf32_switch checks that
 * it starts off). */
static const char *const g_switches[] = {"FG_ATTN_KERNEL", "FG_ATTN_TF32_WIDE",
                                          "FG_ATTN_TF32X3_TILES", "FG_ATTN_TF32_PAIR"};

static void reset_paths(void)
{
    fgt_switches_restore();
    (void)fg_cuda_set_attention_allow_tf32(0);
}

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU fp32 attention suite\n");
        return 77;
    }
    fgt_base_seed();
    FGT_SWITCHES_SAVE(g_switches);
    Suite *s = suite_create("gpu_fp32");
    TCase *tc = tcase_create("strict");
    tcase_set_timeout(tc, 900);
    tcase_add_checked_fixture(tc, fgt_switches_restore, reset_paths);
    /* racecheck (FG_SANITIZE=fast): cases 0-3 reach every head-dim
     * bucket, GQA, dropout and every score modifier. */
    const int fast = fgt_sanitize_mode() == 2;
    const int ncases = fast ? 4 : (int)(sizeof cases / sizeof cases[0]);
    fgt_add_loop(tc, test_fp32_vs_cpu, 0, ncases);
    fgt_add_loop(tc, test_fp32_deterministic_vs_cpu, 0, fast ? 2 : ncases);
    fgt_add_test(tc, test_fp32_dropout_mask);
    fgt_add_test(tc, test_fp32_deterministic_reruns);
    fgt_add_loop(tc, test_d256_narrow, 0, fast ? 1 : 3);
    fgt_add_loop(tc, test_d256_unpaired, 0, fast ? 1 : 3);
    fgt_add_loop(tc, test_d128_split_tiles, 0, fast ? 1 : 4);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("tf32");
    tcase_set_timeout(tt, 900);
    tcase_add_checked_fixture(tt, fgt_switches_restore, reset_paths);
    fgt_add_loop(tt, test_tf32_vs_cpu, 0, ncases);
    fgt_add_loop(tt, test_tf32_deterministic_vs_cpu, 0, fast ? 2 : ncases);
    fgt_add_test(tt, test_tf32_dropout_mask);
    fgt_add_test(tt, test_tf32_switch);
    fgt_add_test(tt, test_tf32_fallback_and_bad_input);
    suite_add_tcase(s, tt);
    return fgt_run_suite(s);
}
