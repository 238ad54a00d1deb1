/* SPDX-License-Identifier: MIT */
/* bench/bench_ring.c - ring attention (fg_ring_attention_forward/backward)
 * over the GPUs of one host, one process per GPU, against single-GPU
 * attention at the per-rank length on the same GPUs, interleaved.
 *
 *   for r in 0 .. W-1: bench_ring --rendezvous FILE --rank r --world-size W
 *       [--N tokens] [--B 1] [--H 16] [--d 128] [--causal 1]
 *       [--layout zigzag|contiguous] [--dtype bf16|fp16] [--rounds 3]
 *       [--reps 5] [--check]
 *
 * Inputs are standard normal: every rank draws the same global Q, K, V, dO
 * [B, N, H, d] and copies out its own rows (fg_ring_position), so --check
 * can compare the ring's O, dQ, dK, dV with single-GPU attention over the
 * whole sequence, which every rank computes on its own GPU (the largest
 * error of the ranks is printed, relative to each tensor's largest
 * element). TFLOP/s follow the FlashAttention convention: forward
 * 4 B H N^2 d, halved when causal, backward 2.5x; the ring's per-GPU
 * figure divides the whole sequence's FLOPs by W and by the slowest rank's
 * median time; the single-GPU figure is attention over n = N / W tokens.
 * Each round times --reps ring steps and --reps single-GPU steps (CUDA
 * events on the context stream); the best round's median is printed.
 * A rank that fails exits and leaves the others waiting: stop them. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include <flashgrad/cuda.h>
#include <flashgrad/flashgrad.h>

#include "bench_cuda.h"

typedef struct cfg {
    const char *rdv;
    int rank, world, causal, rounds, reps, check;
    int64_t N, B, H, d;
    fg_ring_layout layout;
    fg_dtype dt;
} cfg;

static int usage(void)
{
    fprintf(stderr, "usage: bench_ring --rendezvous FILE --rank R "
                    "--world-size W [--N n] [--B b] [--H h] [--d d] "
                    "[--causal 0|1] [--layout zigzag|contiguous] "
                    "[--dtype bf16|fp16] [--rounds r] [--reps r] [--check]\n");
    return 2;
}

/* A whole number, all of v; 0 where it is not one. */
static int whole(const char *v, long long *out)
{
    char *end;
    errno = 0;
    *out = strtoll(v, &end, 10);
    return errno == 0 && end != v && *end == '\0';
}

static int parse(cfg *c, int argc, char **argv)
{
    *c = (cfg){.rank = -1, .world = 0, .causal = 1, .rounds = 3, .reps = 5,
               .N = 131072, .B = 1, .H = 16, .d = 128,
               .layout = FG_RING_ZIGZAG, .dt = FG_BF16};
    /* the numeric options: whole numbers in [0, 2^30] */
    const struct { const char *name; int *i; int64_t *l; } nums[] = {
        {"--rank", &c->rank, NULL},     {"--world-size", &c->world, NULL},
        {"--causal", &c->causal, NULL}, {"--rounds", &c->rounds, NULL},
        {"--reps", &c->reps, NULL},     {"--N", NULL, &c->N},
        {"--B", NULL, &c->B},           {"--H", NULL, &c->H},
        {"--d", NULL, &c->d}};
    const int nnums = (int)(sizeof nums / sizeof *nums);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check")) {
            c->check = 1;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--rendezvous"))
            c->rdv = v;
        else if (!strcmp(a, "--layout") && !strcmp(v, "zigzag"))
            c->layout = FG_RING_ZIGZAG;
        else if (!strcmp(a, "--layout") && !strcmp(v, "contiguous"))
            c->layout = FG_RING_CONTIGUOUS;
        else if (!strcmp(a, "--dtype") && !strcmp(v, "bf16"))
            c->dt = FG_BF16;
        else if (!strcmp(a, "--dtype") && !strcmp(v, "fp16"))
            c->dt = FG_FP16;
        else {
            int k = 0;
            while (k < nnums && strcmp(a, nums[k].name))
                k++;
            long long n;
            if (k == nnums || !whole(v, &n) || n < 0 || n > (1ll << 30))
                return usage();
            if (nums[k].i)
                *nums[k].i = (int)n;
            else
                *nums[k].l = (int64_t)n;
        }
    }
    if (!c->rdv || c->world < 1 || c->rank < 0 || c->rank >= c->world ||
        c->N <= 0 || c->N % (2 * c->world) || c->B <= 0 || c->H <= 0 ||
        c->d <= 0 || c->rounds < 1 || c->reps < 1)
        return usage();
    return 0;
}

/* This rank's rows of a global [B, N, H, d] tensor into [B, n, H, d], one
 * device copy per contiguous run of global positions. */
static void gather_rows(const cfg *c, const fg_tensor *g, fg_tensor *loc)
{
    const int64_t n = c->N / c->world, row = c->H * c->d;
    const size_t es = fg_dtype_size(c->dt);
    const char *src = fg_tensor_data(g);
    char *dst = fg_tensor_data(loc);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < n;) {
            const int64_t g0 = fg_ring_position(c->layout, c->world, c->rank,
                                                n, i);
            int64_t len = 1;
            while (i + len < n &&
                   fg_ring_position(c->layout, c->world, c->rank, n,
                                    i + len) == g0 + len)
                len++;
            CK(cudaMemcpy(dst + (size_t)((b * n + i) * row) * es,
                          src + (size_t)((b * c->N + g0) * row) * es,
                          (size_t)(len * row) * es, cudaMemcpyDeviceToDevice));
            i += len;
        }
}

static fg_tensor *normal(fg_generator *gen, const cfg *c, int64_t len)
{
    const int64_t shape[4] = {c->B, len, c->H, c->d};
    fg_tensor *t;
    FG(fg_tensor_rand_normal(gen, 0, 1, c->dt, FG_DEVICE_CUDA, 4, shape, &t));
    return t;
}

static fg_tensor *empty(fg_dtype dt, int nd, int64_t a, int64_t b, int64_t h,
                        int64_t d)
{
    const int64_t shape[4] = {a, b, h, d};
    fg_tensor *t;
    FG(fg_tensor_empty(dt, FG_DEVICE_CUDA, nd, shape, &t));
    return t;
}

/* One attention problem's buffers: q k v o do dq dk dv, m, l. */
typedef struct prob {
    fg_tensor *t[8], *m, *l;
    fg_attn_tensor a[8];
    fg_attn_stats st;
} prob;

static void prob_make(prob *p, const cfg *c, int64_t len, fg_generator *gen)
{
    for (int i = 0; i < 8; i++) {
        p->t[i] = (i < 3 || i == 4) ? normal(gen, c, len)
                                    : empty(c->dt, 4, c->B, len, c->H, c->d);
        p->a[i] = fg_attn_bshd(fg_tensor_data(p->t[i]), c->dt, len, c->H,
                               c->d);
    }
    p->m = empty(FG_FP32, 3, c->B, c->H, len, 1);
    p->l = empty(FG_FP32, 3, c->B, c->H, len, 1);
    p->st = (fg_attn_stats){fg_tensor_data(p->m), fg_tensor_data(p->l),
                            FG_FP32};
}

static void prob_free(prob *p)
{
    for (int i = 0; i < 8; i++)
        fg_tensor_free(p->t[i]);
    fg_tensor_free(p->m);
    fg_tensor_free(p->l);
}

static void step(fg_comm *comm, const cfg *c, const fg_attn_params *ap,
                 prob *p, int ring, float *fwd_ms, float *bwd_ms)
{
    cudaStream_t s = (cudaStream_t)fg_cuda_get_stream();
    cudaEvent_t e[3];
    for (int i = 0; i < 3; i++)
        CK(cudaEventCreate(&e[i]));
    CK(cudaEventRecord(e[0], s));
    if (ring)
        FG(fg_ring_attention_forward(comm, c->layout, ap, &p->a[0], &p->a[1],
                                     &p->a[2], &p->a[3], &p->st));
    else
        FG(fg_attention_forward(ap, &p->a[0], &p->a[1], &p->a[2], &p->a[3],
                                &p->st));
    CK(cudaEventRecord(e[1], s));
    if (ring)
        FG(fg_ring_attention_backward(comm, c->layout, ap, &p->a[0], &p->a[1],
                                      &p->a[2], &p->a[3], &p->a[4], &p->st,
                                      &p->a[5], &p->a[6], &p->a[7]));
    else
        FG(fg_attention_backward(ap, &p->a[0], &p->a[1], &p->a[2], &p->a[3],
                                 &p->a[4], &p->st, &p->a[5], &p->a[6],
                                 &p->a[7]));
    CK(cudaEventRecord(e[2], s));
    CK(cudaEventSynchronize(e[2]));
    CK(cudaEventElapsedTime(fwd_ms, e[0], e[1]));
    CK(cudaEventElapsedTime(bwd_ms, e[1], e[2]));
    for (int i = 0; i < 3; i++)
        CK(cudaEventDestroy(e[i]));
}

static float median(float *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, bench_cmp_float);
    return x[n / 2];
}

/* Largest value over the ranks of v[0..n) (an NCCL all-gather). */
static void max_over_ranks(fg_comm *comm, double *v, int n)
{
    const int w = fg_comm_size(comm);
    const int64_t one[1] = {n}, all[1] = {(int64_t)n * w};
    fg_tensor *t, *g;
    FG(fg_tensor_from_host(FG_FP64, FG_DEVICE_CUDA, 1, one, v, &t));
    FG(fg_tensor_empty(FG_FP64, FG_DEVICE_CUDA, 1, all, &g));
    FG(fg_comm_allgather(comm, fg_tensor_data(t), fg_tensor_data(g),
                         (size_t)n, FG_FP64));
    double *h = malloc(sizeof(double) * (size_t)(n * w));
    if (!h) {
        fprintf(stderr, "bench_ring: out of host memory\n");
        exit(1);
    }
    FG(fg_tensor_copy_to_host(g, FG_FP64, h, (int64_t)n * w));
    for (int r = 0; r < w; r++)
        for (int i = 0; i < n; i++)
            v[i] = fmax(v[i], h[r * n + i]);
    free(h);
    fg_tensor_free(t);
    fg_tensor_free(g);
}

/* max |a - b| / max |b| over this rank's rows. */
static double rel_err(const fg_tensor *got, const fg_tensor *want)
{
    const int64_t n = fg_tensor_numel(got);
    float *a = malloc(sizeof(float) * (size_t)n),
          *b = malloc(sizeof(float) * (size_t)n);
    if (!a || !b) {
        fprintf(stderr, "bench_ring: out of host memory\n");
        exit(1);
    }
    FG(fg_tensor_copy_to_host(got, FG_FP32, a, n));
    FG(fg_tensor_copy_to_host(want, FG_FP32, b, n));
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]);
        num = e != e ? INFINITY : fmax(num, e);
        den = fmax(den, fabs((double)b[i]));
    }
    free(a);
    free(b);
    return num / (den > 0 ? den : 1);
}

int main(int argc, char **argv)
{
    cfg c;
    if (parse(&c, argc, argv))
        return 2;
    fg_comm *comm;
    FG(fg_comm_init_nccl_file(c.rdv, c.rank, c.world, -1, 300.0, &comm));
    const int64_t n = c.N / c.world;
    /* Global inputs, identical on every rank (same generator), then ours. */
    fg_generator gen;
    fg_generator_init(&gen, 2026);
    fg_tensor *gq = normal(&gen, &c, c.N), *gk = normal(&gen, &c, c.N),
              *gv = normal(&gen, &c, c.N), *gdo = normal(&gen, &c, c.N);
    prob ring, one;
    fg_generator_init(&gen, 7 + (uint64_t)c.rank);
    prob_make(&ring, &c, n, &gen);
    prob_make(&one, &c, n, &gen);
    fg_tensor *src[4] = {gq, gk, gv, gdo};
    const int slot[4] = {0, 1, 2, 4};
    for (int i = 0; i < 4; i++) {
        gather_rows(&c, src[i], ring.t[slot[i]]);
        if (!c.check) { /* only --check needs the whole sequence again */
            fg_tensor_free(src[i]);
            src[i] = NULL;
        }
    }
    fg_attn_params rp, op;
    fg_attn_params_init(&rp, c.B, n, n, c.H, c.H, c.d);
    rp.device = FG_DEVICE_CUDA;
    rp.causal = c.causal;
    op = rp; /* single-GPU attention at the per-rank length */

    float *rf = malloc(sizeof(float) * c.reps), *rb = malloc(sizeof(float) * c.reps),
          *of = malloc(sizeof(float) * c.reps), *ob = malloc(sizeof(float) * c.reps);
    if (!rf || !rb || !of || !ob) {
        fprintf(stderr, "bench_ring: out of host memory\n");
        return 1;
    }
    double best[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    for (int w = 0; w < 2; w++) { /* warm-up */
        float a, b;
        step(comm, &c, &rp, &ring, 1, &a, &b);
        step(comm, &c, &op, &one, 0, &a, &b);
    }
    for (int round = 0; round < c.rounds; round++) {
        for (int i = 0; i < c.reps; i++) {
            FG(fg_comm_barrier(comm));
            step(comm, &c, &rp, &ring, 1, &rf[i], &rb[i]);
        }
        for (int i = 0; i < c.reps; i++)
            step(comm, &c, &op, &one, 0, &of[i], &ob[i]);
        /* the ring step lasts as long as its slowest rank */
        double med[4] = {median(rf, c.reps), median(rb, c.reps),
                         median(of, c.reps), median(ob, c.reps)};
        max_over_ranks(comm, med, 4);
        for (int k = 0; k < 4; k++)
            best[k] = fmin(best[k], med[k]);
    }
    const double half = c.causal ? 0.5 : 1.0;
    const double f_ring = 4.0 * c.B * c.H * (double)c.N * c.N * c.d * half /
                          c.world,
                 f_one = 4.0 * c.B * c.H * (double)n * n * c.d * half;
    const double tf[4] = {f_ring / best[0] / 1e9, 2.5 * f_ring / best[1] / 1e9,
                          f_one / best[2] / 1e9, 2.5 * f_one / best[3] / 1e9};

    double err[4] = {-1, -1, -1, -1};
    if (c.check) { /* the whole sequence on this GPU; compare our rows */
        prob full;
        fg_generator_init(&gen, 99);
        prob_make(&full, &c, c.N, &gen);
        for (int i = 0; i < 4; i++) {
            FG(fg_tensor_copy(full.t[slot[i]], src[i]));
        }
        fg_attn_params fp;
        fg_attn_params_init(&fp, c.B, c.N, c.N, c.H, c.H, c.d);
        fp.device = FG_DEVICE_CUDA;
        fp.causal = c.causal;
        float a, b;
        step(comm, &c, &fp, &full, 0, &a, &b);
        const int outs[4] = {3, 5, 6, 7}; /* O, dQ, dK, dV */
        fg_tensor *mine = empty(c.dt, 4, c.B, n, c.H, c.d);
        for (int i = 0; i < 4; i++) {
            gather_rows(&c, full.t[outs[i]], mine);
            err[i] = rel_err(ring.t[outs[i]], mine);
        }
        fg_tensor_free(mine);
        prob_free(&full);
        max_over_ranks(comm, err, 4);
    }
    if (c.rank == 0) {
        printf("ring attention: %d GPUs, %s, N = %lld (n = %lld per rank), "
               "B %lld, H %lld, d %lld, %s, %s; best of %d rounds' medians "
               "(%d reps)\n", c.world, fg_dtype_name(c.dt), (long long)c.N,
               (long long)n, (long long)c.B, (long long)c.H, (long long)c.d,
               c.causal ? "causal" : "full",
               c.layout == FG_RING_ZIGZAG ? "zigzag" : "contiguous", c.rounds,
               c.reps);
        printf("| GPUs | N | n | ring fwd ms | ring bwd ms | ring fwd TF/GPU "
               "| ring bwd TF/GPU | 1-GPU fwd TF (n) | 1-GPU bwd TF (n) | "
               "fwd ratio | bwd ratio |\n");
        printf("| %d | %lld | %lld | %.2f | %.2f | %.0f | %.0f | %.0f | %.0f "
               "| %.2f | %.2f |\n", c.world, (long long)c.N, (long long)n,
               best[0], best[1], tf[0], tf[1], tf[2], tf[3], tf[0] / tf[2],
               tf[1] / tf[3]);
        if (c.check)
            printf("check against 1-GPU attention over N = %lld (max over "
                   "ranks of max|diff| / max|ref|): O %.2e dQ %.2e dK %.2e "
                   "dV %.2e\n", (long long)c.N, err[0], err[1], err[2],
                   err[3]);
        fflush(stdout);
    }
    FG(fg_comm_barrier(comm));
    prob_free(&ring);
    prob_free(&one);
    for (int i = 0; i < 4; i++)
        fg_tensor_free(src[i]);
    free(rf);
    free(rb);
    free(of);
    free(ob);
    fg_comm_free(comm);
    return 0;
}
