/* SPDX-License-Identifier: MIT */
/* lib/train/data_tasks.c - the built-in algorithmic task (sorting digits) and
 * its exact-match evaluation. */
#include <stdlib.h>
#include <string.h>

#include "flashgrad/nn.h"
#include "lib/core/error.h"

uint64_t fg_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static fg_status check_task(const char *fn, const fg_sort_task *t)
{
    if (!t || t->len < 2 || t->len > 64 || t->digits < 2 || t->digits > 64)
        return fg_error_at(FG_ERR_INVALID_ARGUMENT, fn,
                           "sort task: len and digits must be in [2, 64]");
    return FG_OK;
}

int64_t fg_sort_task_vocab(const fg_sort_task *t)
{
    return t ? t->digits + 1 : 0;
}

int64_t fg_sort_task_seqlen(const fg_sort_task *t)
{
    return t ? 2 * (int64_t)t->len : 0;
}

/* Held out iff a hash of the digits falls in one eighth. */
static int held_out(const int64_t *a, int len)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < len; i++)
        h = (h ^ (uint64_t)a[i]) * 1099511628211ull;
    h ^= h >> 29;
    return (h & 7) == 0;
}

fg_status fg_sort_task_batch(const fg_sort_task *t, int split, uint64_t *rng,
                             int64_t B, int64_t *x, int64_t *y)
{
    FG_TRY(check_task(__func__, t));
    if (!rng || !x || !y || B <= 0 || (split != 0 && split != 1))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    const int L = t->len;
    const int64_t T = 2 * L;
    int64_t a[64], cnt[64];
    for (int64_t b = 0; b < B; b++) {
        int64_t tries = 0;
        do { /* rejection: about 8 tries per held-out example */
            for (int i = 0; i < L; i++)
                a[i] = (int64_t)(fg_rng_next(rng) % (uint64_t)t->digits);
            /* Tiny tasks (2 digits of 2, 4 of 2) have no held-out input
             * at all: fail instead of looping forever. A split with any
             * input is hit long before this bound (at least 1 in 256). */
            if (++tries > 1000000)
                return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                               "sort task with %d digits of %d: the %s "
                               "split has no inputs",
                               L, t->digits, split ? "held-out" : "training");
        } while (held_out(a, L) != split);
        memset(cnt, 0, sizeof cnt);
        for (int i = 0; i < L; i++)
            cnt[a[i]]++;
        int64_t sorted[64], k = 0;
        for (int dgt = 0; dgt < t->digits; dgt++)
            for (int64_t c = 0; c < cnt[dgt]; c++)
                sorted[k++] = dgt;
        int64_t *xs = x + b * T, *ys = y + b * T;
        for (int i = 0; i < L; i++) {
            xs[i] = a[i];
            ys[i] = -1;
        }
        xs[L] = t->digits; /* separator */
        for (int j = 0; j < L; j++) {
            if (j + 1 < L)
                xs[L + 1 + j] = sorted[j];
            ys[L + j] = sorted[j]; /* the separator predicts s_1 */
        }
    }
    return FG_OK;
}

fg_status fg_sort_task_accuracy(const fg_gpt *m, const fg_sort_task *t,
                                int64_t n, uint64_t seed, double *acc)
{
    FG_TRY(check_task(__func__, t));
    if (!m || n <= 0 || !acc)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    const int64_t T = fg_sort_task_seqlen(t), V = fg_sort_task_vocab(t),
                  BS = 256;
    if (fg_gpt_get_config(m)->vocab != V)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "model vocab %lld, task needs %lld",
                       (long long)fg_gpt_get_config(m)->vocab, (long long)V);
    int64_t *x = malloc((size_t)(BS * T) * sizeof *x),
            *y = malloc((size_t)(BS * T) * sizeof *y);
    double *lg = malloc((size_t)(BS * T * V) * sizeof *lg);
    if (!x || !y || !lg) {
        free(x);
        free(y);
        free(lg);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "evaluation buffers");
    }
    uint64_t rng = seed;
    int64_t good = 0;
    fg_status s = FG_OK;
    fg_no_grad_begin();
    for (int64_t done = 0; done < n && s == FG_OK;) {
        const int64_t B = n - done < BS ? n - done : BS;
        fg_tensor *logits = NULL;
        s = fg_sort_task_batch(t, 1, &rng, B, x, y);
        if (s == FG_OK)
            s = fg_gpt_forward(m, x, B, T, NULL, NULL, &logits, NULL);
        if (s == FG_OK)
            s = fg_tensor_copy_to_host(logits, FG_FP64, lg, B * T * V);
        fg_tensor_free(logits);
        for (int64_t b = 0; b < B && s == FG_OK; b++) {
            int ok = 1;
            for (int64_t i = t->len; i < T && ok; i++) {
                const double *r = lg + (b * T + i) * V;
                int64_t best = 0;
                for (int64_t v = 1; v < V; v++)
                    if (r[v] > r[best])
                        best = v;
                ok = best == y[b * T + i];
            }
            good += ok;
        }
        done += B;
    }
    fg_no_grad_end();
    free(x);
    free(y);
    free(lg);
    if (s == FG_OK)
        *acc = (double)good / (double)n;
    return s;
}
