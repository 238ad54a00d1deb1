/* SPDX-License-Identifier: MIT */
/* bench/bench_layernorm.c - time flashgrad's CUDA layernorm (fg_layernorm,
 * fg_layernorm_cast) forward and backward on GPT shapes, as training calls
 * it: through the op (allocation from the caching allocator, autograd
 * recording) and, for the backward, fg_grad on a retained graph (dx,
 * dweight and dbias; no .grad touched).
 *
 *   bench_layernorm [--reps R] [--batch K] [--rows N] [--cols C]
 *   default: rows 16384 (GPT-2-small: batch 16 x context 1024), C = 768
 *   and 3072, modes fp32 (x, y, g fp32), fp32->bf16 (fp32 x, bf16 y and
 *   g: the autocast path), bf16, and join (fg_dropout_add_layernorm: fp32
 *   x, a bf16 branch b with dropout 0.1, bf16 h; the backward from h's
 *   gradient alone, so without the GPT's pending gradient of the fp32
 *   output); R = 30 repetitions of K = 20 calls
 *   each between two CUDA events, after a warm-up; the median
 *   repetition / K is printed.
 *
 * Output, one line a (shape, mode):
 *   shape        mode          fwd_us  fwd_GB/s   bwd_us  bwd_GB/s
 * GB/s = the bytes the kernels must move / time: forward x read, y
 * written; backward x and g read, dx written (join: forward x and b read,
 * the fp32 sum and h written; backward the sum and g read, dx and db
 * written); the [C] vectors, mean and rstd are left out (< 0.1%). Inputs are rotated over three sets so that
 * no call finds its operands in L2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include <flashgrad/cuda.h>
#include <flashgrad/flashgrad.h>

#include "bench_cuda.h"

#define NSETS 3

typedef struct mode {
    const char *name;
    fg_dtype x, y;
    int join; /* fg_dropout_add_layernorm with a branch in y's dtype */
} mode;

/* One set of operands: x, weight, bias (requiring grad) and g in y's
 * dtype; y = the recorded forward (kept for the backward). */
typedef struct set {
    fg_tensor *x, *w, *b, *g, *y, *br; /* br: join's branch */
} set;

static void set_make(set *s, const mode *m, int64_t R, int64_t C,
                     fg_generator *gen)
{
    const fg_device dev = FG_DEVICE_CUDA;
    FG(fg_tensor_rand_normal(gen, 0.5, 2.0, m->x, dev, FG_SHAPE(R, C), &s->x));
    FG(fg_tensor_rand_normal(gen, 1.0, 0.1, m->x, dev, FG_SHAPE(C), &s->w));
    FG(fg_tensor_rand_normal(gen, 0.0, 0.1, m->x, dev, FG_SHAPE(C), &s->b));
    FG(fg_tensor_rand_normal(gen, 0.0, 1.0, m->y, dev, FG_SHAPE(R, C), &s->g));
    FG(fg_tensor_set_requires_grad(s->x, 1));
    FG(fg_tensor_set_requires_grad(s->w, 1));
    FG(fg_tensor_set_requires_grad(s->b, 1));
    s->y = s->br = NULL;
    if (m->join) {
        FG(fg_tensor_rand_normal(gen, 0.0, 1.0, m->y, dev, FG_SHAPE(R, C),
                                 &s->br));
        FG(fg_tensor_set_requires_grad(s->br, 1));
    }
}

static void set_free(set *s)
{
    fg_tensor *all[] = {s->x, s->w, s->b, s->g, s->y, s->br};
    for (int i = 0; i < 6; i++)
        fg_tensor_free(all[i]);
}

static fg_tensor *forward(set *s, const mode *m)
{
    fg_tensor *y = NULL, *sum = NULL;
    if (m->join) {
        FG(fg_dropout_add_layernorm(s->x, s->br, 0.1, 2205, 0, s->w, s->b,
                                    1e-5, m->y, &sum, &y));
        fg_tensor_free(sum); /* the node keeps what its backward needs */
    } else if (m->y == m->x)
        FG(fg_layernorm(s->x, s->w, s->b, 1e-5, &y));
    else
        FG(fg_layernorm_cast(s->x, s->w, s->b, 1e-5, m->y, &y));
    return y;
}

static void backward(set *s)
{
    fg_tensor *in[4] = {s->x, s->w, s->b, s->br}, *gr[4] = {NULL};
    const int n = s->br ? 4 : 3;
    FG(fg_grad(s->y, s->g, in, n, gr, FG_BACKWARD_RETAIN_GRAPH));
    for (int i = 0; i < n; i++)
        fg_tensor_free(gr[i]);
}

/* Median over reps of (time of K calls) / K, in microseconds. */
static double time_calls(set *sets, const mode *m, int bwd, int reps, int K)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float *t = malloc(sizeof(float) * (size_t)reps);
    cudaStream_t st = (cudaStream_t)fg_cuda_get_stream();
    for (int r = -3; r < reps; r++) { /* three warm-up rounds */
        CK(cudaEventRecord(e0, st));
        for (int k = 0; k < K; k++) {
            set *s = &sets[(k + (r + 3)) % NSETS];
            if (bwd) {
                backward(s);
            } else {
                fg_tensor *y = forward(s, m);
                fg_tensor_free(y);
            }
        }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0)
            t[r] = ms * 1000.0f / (float)K;
    }
    qsort(t, (size_t)reps, sizeof(float), bench_cmp_float);
    const double med = t[reps / 2];
    free(t);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return med;
}

static void bench(int64_t R, int64_t C, const mode *m, int reps, int K)
{
    fg_generator gen;
    fg_generator_init(&gen, 2205);
    set sets[NSETS];
    for (int i = 0; i < NSETS; i++) {
        set_make(&sets[i], m, R, C, &gen);
        sets[i].y = forward(&sets[i], m); /* the graph the backward reuses */
    }
    const double sx = (double)fg_dtype_size(m->x),
                 sy = (double)fg_dtype_size(m->y), n = (double)R * (double)C;
    const double fwd = time_calls(sets, m, 0, reps, K);
    const double bwd = time_calls(sets, m, 1, reps, K);
    /* join: + the branch read (forward) and its gradient written */
    const double fb = n * (sx + sy + (m->join ? sx + sy : 0)),
                 bb = n * (2 * sx + sy + (m->join ? sy : 0));
    char shape[32];
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)R, (long long)C);
    printf("%-12s %-12s %8.1f %9.0f %8.1f %9.0f\n", shape, m->name, fwd,
           fb / (fwd * 1e3), bwd, bb / (bwd * 1e3));
    fflush(stdout);
    for (int i = 0; i < NSETS; i++)
        set_free(&sets[i]);
}

int main(int argc, char **argv)
{
    int reps = 30, K = 20;
    int64_t R = 16384, cols[2] = {768, 3072};
    int ncols = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            R = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) {
            cols[0] = atoll(argv[++i]);
            ncols = 1;
        } else {
            fprintf(stderr, "usage: %s [--reps R] [--batch K] [--rows N] "
                            "[--cols C]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || K < 1 || R < 1 || cols[0] < 1) {
        fprintf(stderr, "reps, batch, rows and cols must be >= 1\n");
        return 2;
    }
    if (!fg_cuda_available()) {
        fprintf(stderr, "no CUDA device\n");
        return 77;
    }
    const mode modes[4] = {{"fp32", FG_FP32, FG_FP32, 0},
                           {"fp32->bf16", FG_FP32, FG_BF16, 0},
                           {"bf16", FG_BF16, FG_BF16, 0},
                           {"join", FG_FP32, FG_BF16, 1}};
    printf("%-12s %-12s %8s %9s %8s %9s\n", "shape", "mode", "fwd_us",
           "fwd_GB/s", "bwd_us", "bwd_GB/s");
    for (int c = 0; c < ncols; c++)
        for (int k = 0; k < 4; k++)
            bench(R, cols[c], &modes[k], reps, K);
    return 0;
}
