/* SPDX-License-Identifier: MIT */
/* tools/train/data.c - the trainer's data: the sort task or a text file,
 * checked before step 1. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data.h"
#include "util.h"

static unsigned char byte_at(const fg_text_data *t, int64_t i)
{
    return t->itos[t->ids[i]];
}

/* Length of the valid UTF-8 sequence at i (1-4), or 0 if invalid
 * (overlong forms, surrogates and code points above U+10FFFF included). */
static int utf8_len(const fg_text_data *t, int64_t i)
{
    const unsigned char c = byte_at(t, i);
    int n;
    unsigned lo = 0x80, hi = 0xBF; /* range of the first continuation */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    if (i + n > t->n)
        return 0;
    for (int k = 1; k < n; k++) {
        const unsigned char b = byte_at(t, i + k);
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF))
            return 0;
    }
    return n;
}

/* NULL if the text reads as text: UTF-8 without NUL bytes, and at most
 * 1% control characters other than tab, line and page breaks. Else why
 * not, in why. */
static const char *not_text(const fg_text_data *t, char *why, size_t n)
{
    int64_t ctrl = 0;
    for (int64_t i = 0; i < t->n;) {
        const unsigned char c = byte_at(t, i);
        const int len = utf8_len(t, i);
        if (!c || !len) {
            snprintf(why, n, "%s at byte %lld", c ? "invalid UTF-8" :
                     "a NUL byte", (long long)i);
            return why;
        }
        ctrl += (c < 0x20 && !strchr("\t\n\v\f\r", c)) || c == 0x7F;
        i += len;
    }
    if (ctrl * 100 > t->n) {
        snprintf(why, n, "%lld control characters in %lld bytes",
                 (long long)ctrl, (long long)t->n);
        return why;
    }
    return NULL;
}

static uint64_t fnv1a(const fg_text_data *t)
{
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < t->n; i++)
        h = (h ^ byte_at(t, i)) * 1099511628211ull;
    return h;
}

fg_status data_batch(const dataset *d, int split, uint64_t *rng,
                     int64_t rows, int64_t *x, int64_t *y)
{
    if (d->text)
        return fg_text_data_batch(&d->td, split, rng, rows, d->T, x, y);
    return fg_sort_task_batch(&d->task, split, rng, rows, x, y);
}

/* One sequence from each split, so an empty split fails before step 1. */
static int probe_splits(const dataset *d)
{
    int64_t *x = malloc((size_t)d->T * 2 * sizeof *x);
    if (!x)
        return complain(EXIT_FAIL, "out of memory");
    for (int split = 0; split < 2; split++) {
        uint64_t rng = 1;
        if (data_batch(d, split, &rng, 1, x, x + d->T) != FG_OK) {
            free(x);
            return complain(EXIT_USAGE, "the %s split is unusable: %s",
                            split ? "validation" : "training",
                            fg_last_error());
        }
    }
    free(x);
    return 0;
}

int data_open(dataset *d, const opts *o)
{
    memset(d, 0, sizeof *d);
    d->text = o->data[0] != 0;
    d->T = o->ctx;
    if (!d->text) {
        d->task.len = (int)o->sort_len;
        d->task.digits = (int)o->sort_digits;
        d->vocab = fg_sort_task_vocab(&d->task);
        return probe_splits(d);
    }
    struct stat sb;
    if (stat(o->data, &sb) != 0)
        return complain(EXIT_USAGE, "--data %s: %s", o->data,
                        strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return complain(EXIT_USAGE, "--data %s: is a directory", o->data);
    if (fg_text_data_load(o->data, &d->td) != FG_OK)
        return complain(EXIT_USAGE, "%s", fg_last_error());
    d->vocab = d->td.vocab;
    d->nbytes = d->td.n;
    d->fnv = fnv1a(&d->td);
    char why[128];
    if (!o->bytes && not_text(&d->td, why, sizeof why)) {
        fprintf(stderr, "flashgrad-train: %s does not look like text (%s); "
                        "--bytes trains on its raw bytes anyway\n",
                o->data, why);
        return EXIT_USAGE;
    }
    const int64_t n_val = d->td.n - d->td.n_train;
    const int64_t shortest = n_val < d->td.n_train ? n_val : d->td.n_train;
    if (shortest < d->T + 1) {
        fprintf(stderr, "flashgrad-train: --ctx %lld needs windows of %lld "
                        "characters, but the %s split of %s has %lld (of "
                        "%lld bytes); use a smaller --ctx or a longer text\n",
                (long long)d->T, (long long)d->T + 1,
                shortest == n_val ? "validation" : "training", o->data,
                (long long)shortest, (long long)d->td.n);
        return EXIT_USAGE;
    }
    return probe_splits(d);
}

int data_use_vocab(dataset *d, const unsigned char *itos, int n,
                   const char *ckpt)
{
    int map[256];
    for (int c = 0; c < 256; c++)
        map[c] = -1;
    for (int i = 0; i < n; i++)
        map[itos[i]] = i;
    for (int64_t v = 0; v < d->td.vocab; v++)
        if (map[d->td.itos[v]] < 0) {
            const unsigned char c = d->td.itos[v];
            fprintf(stderr, "flashgrad-train: the text has the character "
                            "0x%02x ('%c') that the vocabulary of %s lacks\n",
                    c, c >= 0x20 && c < 0x7F ? c : '?', ckpt);
            return EXIT_USAGE;
        }
    for (int64_t i = 0; i < d->td.n; i++)
        d->td.ids[i] = map[d->td.itos[d->td.ids[i]]];
    memset(d->td.itos, 0, sizeof d->td.itos);
    memcpy(d->td.itos, itos, (size_t)n);
    for (int c = 0; c < 256; c++)
        d->td.stoi[c] = map[c];
    d->td.vocab = d->vocab = n;
    return 0;
}

void data_release(dataset *d)
{
    if (d->text)
        fg_text_data_release(&d->td);
}
