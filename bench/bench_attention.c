/* SPDX-License-Identifier: MIT */
/* bench/bench_attention.c - time flashgrad's CUDA attention forward and
 * backward. TFLOP/s use the FlashAttention convention: forward 4*B*H*N^2*d
 * (halved when causal), backward 2.5x forward. CUDA-event timing after
 * warm-up, median of the repetitions, standard-normal inputs rotated over
 * several buffer sets so the L2 does not hold them.
 *
 *   bench_attention [--csv FILE] [--reps R] [--quick] [--d D] [--N N]
 *                   [--causal 0|1]   (the last three select one cell; D
 *                              and N any positive values, not only the
 *                              grid's)
 *                   [--dropout P]    dropout probability (default 0)
 *                   [--deterministic] the deterministic backward (dQ in
 *                              a fixed order; bench/compare_det.py
 *                              compares it with the default)
 *                   [--dtype T]      bf16, fp16 or fp32 alone (fp32: the
 *                              strict fp32 kernels, 3xTF32 by default)
 *                   [--tokens T] [--hidden W]  B = T / N, H = W / d
 *                              (default 16384 and 2048; GPT-2-small's
 *                              attention: --tokens 16384 --hidden 768)
 *                   [--check]  also compare every cell's O, dQ, dK, dV with
 *                              the general kernels (fp32 inside; slow)
 *                   [--mem]    peak memory of fwd+bwd at N = 16k and 64k
 *   default grid: bf16/fp16, 16k tokens (B = 16384/N), hidden 2048
 *   (H = 2048/d), d in {64, 128, 256}, N in {512 .. 16384}, causal off/on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include <flashgrad/cuda.h>
#include <flashgrad/flashgrad.h>

#include "bench_cuda.h"

#define NSETS 3

/* Uniform in (0, 1) from a tiny LCG on the host (24 bits: float math). */
static float uniform01(unsigned long long *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return ((float)(*s >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

/* f in the storage dtype's bits at h[i] (fp16/bf16 from float, bf16 rounded
 * to nearest even; |f| < 10 here, so fp16 is a normal or subnormal half:
 * subnormals flushed to zero, truncated, fine for timing). */
static void store_as(unsigned char *h, size_t i, float f, fg_dtype dt)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (dt == FG_BF16) {
        const uint16_t b = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        memcpy(h + 2 * i, &b, 2);
    } else if (dt == FG_FP16) {
        const uint32_t sign = (u >> 16) & 0x8000u, ax = u & 0x7fffffffu;
        uint16_t b = (uint16_t)sign;
        if (ax >= 0x38800000u)
            b = (uint16_t)(sign | ((ax - ((127u - 15u) << 23)) >> 13));
        memcpy(h + 2 * i, &b, 2);
    } else if (dt == FG_FP32) {
        memcpy(h + 4 * i, &f, 4);
    } else {
        const double d = f;
        memcpy(h + 8 * i, &d, 8);
    }
}

/* Fill with standard-normal values (Box-Muller, both values of each pair,
 * in float: the 16k-token cells fill 12 buffers of 33.5M values, which the
 * double one-value-a-pair version took seconds a cell for), in the
 * storage dtype. */
static void fill_random(void *dev, size_t n, fg_dtype dt, unsigned long long *s)
{
    unsigned char *h = malloc(n * fg_dtype_size(dt));
    if (!h) {
        fprintf(stderr, "bench_attention: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i += 2) {
        const float u1 = uniform01(s), u2 = uniform01(s);
        const float r = sqrtf(-2.0f * logf(u1)), t = 6.2831853f * u2;
        store_as(h, i, r * cosf(t), dt);
        if (i + 1 < n)
            store_as(h, i + 1, r * sinf(t), dt);
    }
    CK(cudaMemcpy(dev, h, n * fg_dtype_size(dt), cudaMemcpyHostToDevice));
    free(h);
}

typedef struct result {
    double fwd_ms, bwd_ms, fwd_tf, bwd_tf, peak_mib;
    double check_err; /* max rel. error of O/dQ/dK/dV vs the general
                         kernels (fp32 inside) on the same inputs; <0: off */
} result;

static float half_bits_to_float(uint16_t h, fg_dtype dt)
{
    uint32_t u;
    if (dt == FG_BF16) {
        u = (uint32_t)h << 16;
    } else { /* IEEE half */
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu,
                 m = h & 0x3ffu;
        if (e == 0 && m == 0) {
            u = sign;
        } else if (e == 0) {
            float f = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
            memcpy(&u, &f, 4);
            u |= sign;
        } else if (e == 31) {
            u = sign | 0x7f800000u | (m << 13);
        } else {
            u = sign | ((e + 112u) << 23) | (m << 13);
        }
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Copy n device elements of dtype dt to a host float array. */
static float *to_host(const void *dev, size_t n, fg_dtype dt)
{
    float *f = malloc(n * sizeof(float));
    if (dt == FG_FP32) {
        CK(cudaMemcpy(f, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
        return f;
    }
    uint16_t *h = malloc(n * 2);
    CK(cudaMemcpy(h, dev, n * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        f[i] = half_bits_to_float(h[i], dt);
    free(h);
    return f;
}

/* Max over O, dQ, dK, dV of max|fast - general| / max|general|: a wrong
 * fast kernel cannot hide behind a good time. */
static double check_against_general(const fg_attn_params *p, fg_dtype dt,
                                    void *buf[8], void *m, void *l, size_t n,
                                    int N, int H, int d)
{
    fg_attn_tensor t[8];
    for (int i = 0; i < 8; i++)
        t[i] = fg_attn_bshd(buf[i], dt, N, H, d);
    fg_attn_stats st = {m, l, FG_FP32};
    float *out[2][4];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            setenv("FG_ATTN_KERNEL", "general", 1);
        FG(fg_attention_forward(p, &t[0], &t[1], &t[2], &t[3], &st));
        FG(fg_attention_backward(p, &t[0], &t[1], &t[2], &t[3], &t[4], &st,
                                 &t[5], &t[6], &t[7]));
        CK(cudaDeviceSynchronize());
        const int idx[4] = {3, 5, 6, 7};
        for (int k = 0; k < 4; k++)
            out[pass][k] = to_host(buf[idx[k]], n, dt);
    }
    unsetenv("FG_ATTN_KERNEL");
    double worst = 0;
    for (int k = 0; k < 4; k++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            double a = out[0][k][i], g = out[1][k][i];
            if (a != a)
                num = INFINITY;
            num = fmax(num, fabs(a - g));
            den = fmax(den, fabs(g));
        }
        worst = fmax(worst, num / (den > 0 ? den : 1));
        free(out[0][k]);
        free(out[1][k]);
    }
    return worst;
}

static result run(fg_dtype dt, int B, int N, int H, int d, int causal,
                  double dropout, int det, int reps, int check)
{
    const size_t n = (size_t)B * N * H * d, es = fg_dtype_size(dt);
    const size_t ns = (size_t)B * H * N;
    void *buf[NSETS][8];
    void *m[NSETS], *l[NSETS];
    unsigned long long seed = 12345;
    for (int s = 0; s < NSETS; s++) {
        for (int i = 0; i < 8; i++) {
            CK(cudaMalloc(&buf[s][i], n * es));
            /* Q, K, V, dO: random once, copied to the other sets (the sets
             * are there for their addresses: no operand stays in L2) */
            if (i < 5 && i != 3) {
                if (s == 0)
                    fill_random(buf[s][i], n, dt, &seed);
                else
                    CK(cudaMemcpy(buf[s][i], buf[0][i], n * es, cudaMemcpyDeviceToDevice));
            }
        }
        CK(cudaMalloc(&m[s], ns * 4));
        CK(cudaMalloc(&l[s], ns * 4));
    }
    fg_attn_params p;
    fg_attn_params_init(&p, B, N, N, H, H, d);
    p.device = FG_DEVICE_CUDA;
    p.causal = causal;
    p.dropout_p = dropout;
    p.deterministic = det;
    p.seed = 42;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float *tf = malloc(sizeof(float) * reps), *tb = malloc(sizeof(float) * reps);
    for (int it = -2; it < reps; it++) { /* two warm-up rounds */
        int s = (it + 2) % NSETS;
        fg_attn_tensor t[8];
        for (int i = 0; i < 8; i++)
            t[i] = fg_attn_bshd(buf[s][i], dt, N, H, d);
        fg_attn_stats st = {m[s], l[s], FG_FP32};
        CK(cudaEventRecord(e0, 0));
        FG(fg_attention_forward(&p, &t[0], &t[1], &t[2], &t[3], &st));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 0)
            tf[it] = ms;
        CK(cudaEventRecord(e0, 0));
        FG(fg_attention_backward(&p, &t[0], &t[1], &t[2], &t[3], &t[4], &st,
                                 &t[5], &t[6], &t[7]));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 0)
            tb[it] = ms;
    }
    qsort(tf, reps, sizeof(float), bench_cmp_float);
    qsort(tb, reps, sizeof(float), bench_cmp_float);
    result r;
    r.fwd_ms = tf[reps / 2];
    r.bwd_ms = tb[reps / 2];
    double flops = 4.0 * B * H * (double)N * N * d * (causal ? 0.5 : 1.0);
    r.fwd_tf = flops / (r.fwd_ms * 1e-3) / 1e12;
    r.bwd_tf = 2.5 * flops / (r.bwd_ms * 1e-3) / 1e12;
    size_t fr, tot;
    CK(cudaMemGetInfo(&fr, &tot));
    r.peak_mib = (double)(tot - fr) / 1048576.0;
    r.check_err = check ? check_against_general(&p, dt, buf[0], m[0], l[0], n,
                                                N, H, d)
                        : -1.0;
    for (int s = 0; s < NSETS; s++) {
        for (int i = 0; i < 8; i++)
            CK(cudaFree(buf[s][i]));
        CK(cudaFree(m[s]));
        CK(cudaFree(l[s]));
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    free(tf);
    free(tb);
    return r;
}

/* Peak device memory of one fwd+bwd including inputs, outputs, gradients
 * and workspace (bf16, B = 1, H = 16, d = 128), the figure PyTorch reports
 * as torch.cuda.max_memory_allocated. */
static double peak_memory_mib(int N)
{
    const int H = 16, d = 128;
    const size_t n = (size_t)N * H * d;
    void *buf[8], *m, *l;
    for (int i = 0; i < 8; i++) {
        CK(cudaMalloc(&buf[i], n * 2));
        CK(cudaMemset(buf[i], 0x3c, n * 2));
    }
    CK(cudaMalloc(&m, (size_t)H * N * 4));
    CK(cudaMalloc(&l, (size_t)H * N * 4));
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t zero = 0, high = 0;
    CK(cudaDeviceSynchronize());
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
    /* The workspace comes from the stream-ordered pool, or (on the library's
     * context stream, the default here) from flashgrad's caching allocator:
     * count the peak of both. */
    fg_cuda_memory_stats ms;
    FG(fg_cuda_memory_reset_peak());
    FG(fg_cuda_memory_get_stats(&ms));
    const int64_t live0 = ms.live_bytes;
    fg_attn_params p;
    fg_attn_params_init(&p, 1, N, N, H, H, d);
    p.device = FG_DEVICE_CUDA;
    fg_attn_tensor t[8];
    for (int i = 0; i < 8; i++)
        t[i] = fg_attn_bshd(buf[i], FG_BF16, N, H, d);
    fg_attn_stats st = {m, l, FG_FP32};
    FG(fg_attention_forward(&p, &t[0], &t[1], &t[2], &t[3], &st));
    FG(fg_attention_backward(&p, &t[0], &t[1], &t[2], &t[3], &t[4], &st, &t[5],
                             &t[6], &t[7]));
    CK(cudaDeviceSynchronize());
    CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
    FG(fg_cuda_memory_get_stats(&ms));
    high += (uint64_t)(ms.peak_live_bytes - live0);
    for (int i = 0; i < 8; i++)
        CK(cudaFree(buf[i]));
    CK(cudaFree(m));
    CK(cudaFree(l));
    return (8.0 * n * 2 + 2.0 * H * N * 4 + (double)high) / 1048576.0;
}

int main(int argc, char **argv)
{
    const char *csv_path = NULL;
    int reps = 10, quick = 0, one_d = 0, one_n = 0, one_causal = -1;
    int check = 0, mem = 0, det = 0, tokens = 16384, hidden = 2048;
    double dropout = 0;
    const char *one_dtype = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc)
            csv_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--check"))
            check = 1;
        else if (!strcmp(argv[i], "--mem"))
            mem = 1;
        else if (!strcmp(argv[i], "--d") && i + 1 < argc)
            one_d = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--N") && i + 1 < argc)
            one_n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--causal") && i + 1 < argc)
            one_causal = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dropout") && i + 1 < argc)
            dropout = atof(argv[++i]);
        else if (!strcmp(argv[i], "--deterministic"))
            det = 1;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc)
            hidden = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc)
            one_dtype = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--csv FILE] [--reps R] [--quick] "
                            "[--d D] [--N N] [--causal 0|1] [--dropout P] [--deterministic] "
                            "[--dtype bf16|fp16|fp32] [--tokens T] [--hidden W] [--check] [--mem]\n",
                    argv[0]);
            return 2;
        }
    }
    if (tokens <= 0 || hidden <= 0) {
        fprintf(stderr, "bench_attention: --tokens and --hidden must be positive\n");
        return 2;
    }
    if (!(dropout >= 0 && dropout < 1)) {
        fprintf(stderr, "bench_attention: --dropout must be in [0, 1)\n");
        return 2;
    }
    if (one_d < 0 || one_n < 0) {
        fprintf(stderr, "bench_attention: --d and --N must be positive\n");
        return 2;
    }
    if ((one_n > 0 && tokens / one_n < 1) || (one_d > 0 && hidden / one_d < 1)) {
        fprintf(stderr, "bench_attention: no cell: --tokens below --N or --hidden below --d\n");
        return 2;
    }
    fg_dtype dts[2] = {FG_BF16, FG_FP16};
    int ndt = quick ? 1 : 2;
    if (one_dtype) { /* the names fg_dtype_name gives */
        const fg_dtype known[3] = {FG_BF16, FG_FP16, FG_FP32};
        ndt = 0;
        for (int k = 0; k < 3 && !ndt; k++)
            if (!strcmp(one_dtype, fg_dtype_name(known[k])))
                dts[0] = known[k], ndt = 1;
        if (!ndt) {
            fprintf(stderr, "bench_attention: --dtype must be bf16, fp16 or fp32\n");
            return 2;
        }
    }
    if (!fg_cuda_available()) {
        fprintf(stderr, "bench_attention: no CUDA GPU\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("flashgrad %s on %s", fg_version(), prop.name);
    if (dropout > 0)
        printf(", dropout %g", dropout);
    if (det)
        printf(", deterministic backward");
    printf("\n");
    if (mem) {
        for (int N = 16384; N <= 65536; N *= 4)
            printf("peak memory fwd+bwd bf16 B=1 H=16 d=128 N=%d: %.0f MiB "
                   "(inputs, outputs, gradients, workspace)\n",
                   N, peak_memory_mib(N));
        return 0;
    }
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv)
        fprintf(csv, "dtype,d,N,B,H,causal,fwd_ms,bwd_ms,fwd_tflops,bwd_tflops,"
                     "check_err\n");
    printf("%-5s %4s %6s %4s %4s %6s %9s %9s %8s %8s %10s\n", "dtype", "d", "N", "B",
           "H", "causal", "fwd ms", "bwd ms", "fwd TF", "bwd TF", "check err");
    /* the grid, or the one head dim / length asked for (any value) */
    int ds[] = {64, 128, 256}, Ns[] = {512, 1024, 2048, 4096, 8192, 16384};
    int nd = 3, nn = 6;
    if (one_d > 0) {
        ds[0] = one_d;
        nd = 1;
    }
    if (one_n > 0) {
        Ns[0] = one_n;
        nn = 1;
    }
    for (int di = 0; di < ndt; di++)
        for (int a = 0; a < nd; a++)
            for (int b = 0; b < nn; b++)
                for (int causal = 0; causal < 2; causal++) {
                    const int d = ds[a], N = Ns[b];
                    if (quick && one_n <= 0 && N != 2048 && N != 8192)
                        continue;
                    if (one_causal >= 0 && causal != one_causal)
                        continue;
                    const int B = tokens / N, H = hidden / d;
                    if (B < 1 || H < 1)
                        continue;
                    result r = run(dts[di], B, N, H, d, causal, dropout, det, reps, check);
                    printf("%-5s %4d %6d %4d %4d %6d %9.3f %9.3f %8.1f %8.1f %10.2e%s\n",
                           fg_dtype_name(dts[di]), d, N, B, H, causal, r.fwd_ms,
                           r.bwd_ms, r.fwd_tf, r.bwd_tf, r.check_err,
                           r.check_err > 5e-2 ? "  CHECK FAILED" : "");
                    fflush(stdout);
                    if (csv)
                        fprintf(csv, "%s,%d,%d,%d,%d,%d,%.4f,%.4f,%.2f,%.2f,%.3e\n",
                                fg_dtype_name(dts[di]), d, N, B, H, causal,
                                r.fwd_ms, r.bwd_ms, r.fwd_tf, r.bwd_tf, r.check_err);
                }
    if (csv)
        fclose(csv);
    return 0;
}
