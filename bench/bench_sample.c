/* SPDX-License-Identifier: MIT */
/* bench/bench_sample.c - generation speed of fg_gpt_sample with and without
 * the KV cache, on a GPT of a given shape (random weights: the speed does
 * not depend on them). Checks that the cached sampler gives the
 * recomputing one's tokens (same seed) and prints tokens/s of each mode.
 *
 *   bench_sample [--device cpu|cuda] [--bf16 0|1] [--fp64 0|1]
 *                [--layers L] [--heads H]
 *                [--width C] [--ctx T] [--vocab V] [--tokens N]
 *                [--prompt P] [--reps R]
 *   defaults: the baby GPT (6 layers, 6 heads, width 384, ctx 256, vocab
 *   65) on cuda when there is a GPU, bf16 autocast there, 255 new tokens
 *   after a 1-token prompt (the cache never overflows), 3 repetitions
 *   (the best is shown). The tokens of the two samplers are compared:
 *   in fp64 they must agree (exit status 1 otherwise); in fp32 and bf16
 *   the one-row products round differently from the T-row ones, so on a
 *   random model, whose logits are nearly tied, they may part (reported,
 *   status 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flashgrad/flashgrad.h>

#define FG(call)                                                            \
    do {                                                                    \
        if ((call) != FG_OK) {                                              \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,              \
                    fg_last_error());                                       \
            exit(2);                                                        \
        }                                                                   \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long arg(int argc, char **argv, const char *name, long dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return strtol(argv[i + 1], NULL, 10);
    return dflt;
}

/* Best-of-reps seconds to sample n_new tokens after the prompt in tok. */
static double time_mode(const fg_gpt *m, fg_sample_mode mode, int64_t *tok,
                        int64_t n_prompt, int64_t n_new, int reps)
{
    fg_sample_options o;
    fg_sample_options_init(&o);
    o.seed = 7;
    o.mode = mode;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t = now();
        FG(fg_gpt_sample(m, tok, n_prompt, n_new, &o));
        const double dt = now() - t;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    const char *dv = "auto";
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device"))
            dv = argv[i + 1];
    const int cuda = !strcmp(dv, "cuda") ||
                     (!strcmp(dv, "auto") && fg_cuda_available());
    const int bf16 = (int)arg(argc, argv, "--bf16", cuda);
    fg_set_num_threads(1);
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.n_layer = arg(argc, argv, "--layers", 6);
    c.n_head = arg(argc, argv, "--heads", 6);
    c.n_embd = arg(argc, argv, "--width", 384);
    c.ctx = arg(argc, argv, "--ctx", 256);
    c.vocab = arg(argc, argv, "--vocab", 65);
    c.device = cuda ? FG_DEVICE_CUDA : FG_DEVICE_CPU;
    c.dtype = arg(argc, argv, "--fp64", 0) ? FG_FP64 : FG_FP32;
    const int64_t n_prompt = arg(argc, argv, "--prompt", 1),
                  n_new = arg(argc, argv, "--tokens", c.ctx - 1);
    const int reps = (int)arg(argc, argv, "--reps", 3);
    if (n_prompt < 1 || n_new < 1 || reps < 1) {
        fprintf(stderr, "bench_sample: --prompt, --tokens, --reps >= 1\n");
        return 2;
    }
    fg_gpt *m;
    FG(fg_gpt_create(&c, 1, &m));
    if (bf16 && (!cuda || c.dtype == FG_FP64)) {
        fprintf(stderr, "bench_sample: --bf16 needs cuda and fp32\n");
        return 2;
    }
    if (bf16)
        FG(fg_autocast_begin(FG_BF16));
    const size_t n = (size_t)(n_prompt + n_new);
    int64_t *ref = calloc(n, sizeof *ref), *tok = calloc(n, sizeof *tok);
    if (!ref || !tok)
        return 2;
    for (int64_t i = 0; i < n_prompt; i++)
        ref[i] = tok[i] = i % c.vocab;
    printf("bench_sample: %s%s, %lld layers, %lld heads, width %lld, ctx "
           "%lld, vocab %lld; %lld new tokens after %lld, best of %d\n",
           cuda ? "cuda" : "cpu", bf16 ? " bf16" : "", (long long)c.n_layer,
           (long long)c.n_head, (long long)c.n_embd, (long long)c.ctx,
           (long long)c.vocab, (long long)n_new, (long long)n_prompt, reps);
    time_mode(m, FG_SAMPLE_CACHE, tok, n_prompt, 8, 1); /* warm-up */
    const double tr = time_mode(m, FG_SAMPLE_RECOMPUTE, ref, n_prompt, n_new,
                                reps);
    const double tc = time_mode(m, FG_SAMPLE_CACHE, tok, n_prompt, n_new,
                                reps);
    int64_t diff = -1;
    for (size_t i = 0; i < n && diff < 0; i++)
        if (tok[i] != ref[i])
            diff = (int64_t)i;
    const double ts = time_mode(m, FG_SAMPLE_CACHE_SHIFT, tok, n_prompt,
                                n_new, reps);
    printf("recompute   %8.3f s  %10.1f tok/s\n", tr, (double)n_new / tr);
    printf("kv cache    %8.3f s  %10.1f tok/s  (%.2fx; tokens %s)\n", tc,
           (double)n_new / tc, tr / tc,
           diff < 0 ? "identical" : "differ");
    printf("kv shift    %8.3f s  %10.1f tok/s\n", ts, (double)n_new / ts);
    if (diff >= 0)
        printf("first difference at token %lld: %lld with the cache, %lld "
               "without\n", (long long)diff, (long long)tok[diff],
               (long long)ref[diff]);
    if (bf16)
        fg_autocast_end();
    free(ref);
    free(tok);
    fg_gpt_free(m);
    return diff >= 0 && c.dtype == FG_FP64 && !bf16;
}
