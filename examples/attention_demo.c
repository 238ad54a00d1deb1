/* SPDX-License-Identifier: MIT */
/* examples/attention_demo.c - run flashgrad's attention forward + backward on
 * the CPU (fp64 and fp32, causal, with dropout) and check it against a naive
 * computation that materialises the full N x N attention matrix.
 *
 *   usage: attention_demo [N] [heads] [head_dim]      (default 256 4 64) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flashgrad/flashgrad.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static double urand(unsigned long long *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* Naive attention of one problem in fp64, BSHD layout, with keep mask. */
static void naive(int N, int H, int d, double scale, double p,
                  const unsigned char *keep, const double *q, const double *k,
                  const double *v, const double *dout, double *o, double *dq,
                  double *dk, double *dv)
{
    double *P = malloc(sizeof(double) * N * N), *dP = malloc(sizeof(double) * N * N);
    memset(dq, 0, sizeof(double) * N * H * d);
    memset(dk, 0, sizeof(double) * N * H * d);
    memset(dv, 0, sizeof(double) * N * H * d);
    for (int h = 0; h < H; h++) {
        for (int i = 0; i < N; i++) { /* P = softmax(causal(scale Q K^T)) */
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= i; j++) {
                double s = 0;
                for (int x = 0; x < d; x++)
                    s += q[(i * H + h) * d + x] * k[(j * H + h) * d + x];
                P[i * N + j] = s * scale;
                mx = fmax(mx, P[i * N + j]);
            }
            for (int j = 0; j < N; j++) {
                P[i * N + j] = j <= i ? exp(P[i * N + j] - mx) : 0.0;
                sum += P[i * N + j];
            }
            for (int j = 0; j < N; j++)
                P[i * N + j] /= sum;
        }
        for (int i = 0; i < N; i++) { /* O = dropout(P) V and its gradients */
            const unsigned char *z = keep + ((size_t)h * N + i) * N;
            for (int x = 0; x < d; x++) {
                double acc = 0;
                for (int j = 0; j < N; j++)
                    acc += P[i * N + j] * (z[j] / (1 - p)) * v[(j * H + h) * d + x];
                o[(i * H + h) * d + x] = acc;
            }
            double dot = 0;
            for (int j = 0; j < N; j++) {
                double acc = 0;
                for (int x = 0; x < d; x++) {
                    dv[(j * H + h) * d + x] += P[i * N + j] * (z[j] / (1 - p)) *
                                               dout[(i * H + h) * d + x];
                    acc += dout[(i * H + h) * d + x] * v[(j * H + h) * d + x];
                }
                dP[i * N + j] = acc * z[j] / (1 - p);
                dot += P[i * N + j] * dP[i * N + j];
            }
            for (int j = 0; j < N; j++) {
                double ds = P[i * N + j] * (dP[i * N + j] - dot) * scale;
                for (int x = 0; x < d; x++) {
                    dq[(i * H + h) * d + x] += ds * k[(j * H + h) * d + x];
                    dk[(j * H + h) * d + x] += ds * q[(i * H + h) * d + x];
                }
            }
        }
    }
    free(P);
    free(dP);
}

static double rel_err(const void *a, fg_dtype dt, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = dt == FG_FP64 ? ((const double *)a)[i] : ((const float *)a)[i];
        num = fmax(num, fabs(x - ref[i]));
        den = fmax(den, fabs(ref[i]));
    }
    return num / den;
}

int main(int argc, char **argv)
{
    const int N = argc > 1 ? atoi(argv[1]) : 256;
    const int H = argc > 2 ? atoi(argv[2]) : 4;
    const int d = argc > 3 ? atoi(argv[3]) : 64;
    const double p = 0.1;
    const size_t n = (size_t)N * H * d;
    if (N < 1 || H < 1 || d < 1 || N > 8192) {
        fprintf(stderr, "usage: %s [N<=8192] [heads] [head_dim]\n", argv[0]);
        return 2;
    }
    printf("flashgrad %s attention demo: B=1 N=%d H=%d d=%d causal dropout=%.1f\n",
           fg_version(), N, H, d, p);

    double *in[4], *ref[4]; /* q k v dout ; o dq dk dv */
    unsigned long long seed = (unsigned long long)time(NULL);
    for (int t = 0; t < 4; t++) {
        in[t] = malloc(n * sizeof(double));
        ref[t] = malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++)
            in[t][i] = urand(&seed);
    }
    fg_attn_params prm;
    fg_attn_params_init(&prm, 1, N, N, H, H, d);
    prm.causal = 1;
    prm.dropout_p = p;
    prm.seed = seed;
    unsigned char *keep = malloc((size_t)H * N * N);
    if (fg_attention_dropout_mask(&prm, keep) != FG_OK) {
        fprintf(stderr, "dropout mask: %s\n", fg_last_error());
        return 1;
    }
    double t0 = now();
    naive(N, H, d, 1.0 / sqrt((double)d), p, keep, in[0], in[1], in[2], in[3],
          ref[0], ref[1], ref[2], ref[3]);
    printf("naive fp64 (materialised %dx%d P per head): %.1f ms\n", N, N,
           1e3 * (now() - t0));

    int ok = 1;
    const fg_dtype dts[2] = {FG_FP64, FG_FP32};
    const double tols[2] = {1e-12, 1e-5};
    printf("%-6s %10s %10s %10s %10s %10s %10s  %s\n", "dtype", "fwd ms", "bwd ms",
           "err O", "err dQ", "err dK", "err dV", "check");
    for (int di = 0; di < 2; di++) {
        fg_dtype dt = dts[di];
        size_t es = fg_dtype_size(dt);
        void *buf[8]; /* q k v dout o dq dk dv */
        for (int t = 0; t < 8; t++)
            buf[t] = malloc(n * es);
        for (int t = 0; t < 4; t++)
            for (size_t i = 0; i < n; i++) {
                if (dt == FG_FP64)
                    ((double *)buf[t])[i] = in[t][i];
                else
                    ((float *)buf[t])[i] = (float)in[t][i];
            }
        fg_attn_tensor T[8];
        for (int t = 0; t < 8; t++)
            T[t] = fg_attn_bshd(buf[t], dt, N, H, d);
        void *m = malloc((size_t)H * N * es), *l = malloc((size_t)H * N * es);
        fg_attn_stats st = {m, l, dt};
        double t1 = now();
        fg_status s = fg_attention_forward(&prm, &T[0], &T[1], &T[2], &T[4], &st);
        double t2 = now();
        if (s == FG_OK)
            s = fg_attention_backward(&prm, &T[0], &T[1], &T[2], &T[4], &T[3], &st,
                                      &T[5], &T[6], &T[7]);
        double t3 = now();
        if (s != FG_OK) {
            fprintf(stderr, "flashgrad: %s\n", fg_last_error());
            return 1;
        }
        double e[4];
        int pass = 1;
        for (int t = 0; t < 4; t++) {
            e[t] = rel_err(buf[4 + t], dt, ref[t], n);
            pass &= e[t] <= tols[di];
        }
        ok &= pass;
        printf("%-6s %10.1f %10.1f %10.2e %10.2e %10.2e %10.2e  %s (tol %.0e)\n",
               fg_dtype_name(dt), 1e3 * (t2 - t1), 1e3 * (t3 - t2), e[0], e[1],
               e[2], e[3], pass ? "PASS" : "FAIL", tols[di]);
        for (int t = 0; t < 8; t++)
            free(buf[t]);
        free(m);
        free(l);
    }
    printf("extra memory: flashgrad keeps m, l (%d floats each); the naive "
           "version held %d x %d per head\n", H * N, N, N);
    for (int t = 0; t < 4; t++) {
        free(in[t]);
        free(ref[t]);
    }
    free(keep);
    printf("%s\n", ok ? "attention demo: PASS" : "attention demo: FAIL");
    return ok ? 0 : 1;
}
