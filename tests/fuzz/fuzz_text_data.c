/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_text_data.c - libFuzzer target for the character-level
 * text loader (fg_text_data_load, fg_text_data_batch in nn.h).
 *
 * The first 18 bytes choose B, T, the split and the sampler state; the rest
 * is the file, handed over as an in-memory file. A load must succeed exactly
 * when the file has at least 100 bytes, and then its vocabulary must be the
 * sorted set of distinct bytes, ids must decode back to the file, and the
 * split must be at 90%. A batch must succeed exactly when B, T > 0, the
 * split is 0 or 1 and it holds a window of T + 1 ids; every row of x must
 * then be a window of the split and y the same window shifted by one. */
#include "fuzz_util.h" /* first: it defines _GNU_SOURCE */

#include <flashgrad/flashgrad.h>

enum { MAX_BT = 1 << 16 }; /* most ids a batch may ask for here */

/* x and y of row b as a window of ids[lo, hi). */
static int row_is_window(const fg_text_data *d, int64_t lo, int64_t hi,
                         const int64_t *x, const int64_t *y, int64_t T)
{
    for (int64_t s = lo; s + T + 1 <= hi; s++)
        if (memcmp(x, d->ids + s, sizeof *x * (size_t)T) == 0 &&
            memcmp(y, d->ids + s + 1, sizeof *y * (size_t)T) == 0)
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    static const int64_t Bs[] = {1, 2, 3, 8, 0, -1, INT64_MAX};
    static const int64_t Ts[] = {1, 2, 7, 64, 0, -3, INT64_MAX,
                                 INT64_MAX - 1, (int64_t)1 << 62};
    const int64_t B = FZ_PICK(&f, Bs), T = FZ_PICK(&f, Ts);
    const int split = (int)(fz_u8(&f) % 3); /* 2 is invalid */
    uint64_t rng = fz_u64(&f);
    const uint64_t rng0 = rng;
    fz_u64(&f); /* reserved */
    const uint8_t *text = f.p;
    const size_t n = f.n;

    char path[64];
    const int fd = fz_memfile(text, n, path, sizeof path);
    if (fd < 0)
        return 0;
    fg_text_data d;
    fg_clear_error();
    const fg_status s = fg_text_data_load(path, &d);
    close(fd);
    FZ_CHECK((s == FG_OK) == (n >= 100), "load of %zu bytes: %s (%s)", n,
             fg_status_string(s), fg_last_error());
    if (s != FG_OK) {
        FZ_CHECK(fg_last_error()[0] != '\0', "no message");
        return 0;
    }
    /* Vocabulary: the distinct bytes, ascending; stoi inverts itos. */
    int seen[256] = {0};
    for (size_t i = 0; i < n; i++)
        seen[text[i]] = 1;
    int64_t v = 0;
    for (int c = 0; c < 256; c++) {
        if (!seen[c]) {
            FZ_CHECK(d.stoi[c] == -1, "absent byte %d has id %d", c,
                     d.stoi[c]);
            continue;
        }
        FZ_CHECK(d.stoi[c] == v && d.itos[v] == c, "byte %d: id %d", c,
                 d.stoi[c]);
        v++;
    }
    FZ_CHECK(d.vocab == v, "vocab %lld, %lld distinct bytes",
             (long long)d.vocab, (long long)v);
    FZ_CHECK(d.n == (int64_t)n && d.n_train == (int64_t)(n * 9 / 10),
             "n %lld n_train %lld for %zu bytes", (long long)d.n,
             (long long)d.n_train, n);
    for (size_t i = 0; i < n; i++)
        FZ_CHECK(d.ids[i] >= 0 && d.ids[i] < d.vocab &&
                     d.itos[d.ids[i]] == text[i],
                 "id %zu does not decode to the text", i);

    /* A batch: valid iff B, T > 0, split 0/1 and hi - lo >= T + 1. */
    const int64_t lo = split == 1 ? d.n_train : 0,
                  hi = split == 1 ? d.n : d.n_train;
    const int valid = B > 0 && T > 0 && split < 2 &&
                      (__int128)(hi - lo) >= (__int128)T + 1;
    if (valid && (__int128)B * T > MAX_BT) {
        fg_text_data_release(&d); /* too large to hand buffers for */
        return 0;
    }
    const size_t cap = valid ? (size_t)(B * T) : 1;
    int64_t *x = malloc(sizeof *x * cap), *y = malloc(sizeof *y * cap);
    x[0] = y[0] = -7;
    fg_clear_error();
    const fg_status bs = fg_text_data_batch(&d, split, &rng, B, T, x, y);
    FZ_CHECK((bs == FG_OK) == valid,
             "batch B %lld T %lld split %d over %lld ids: %s (%s)",
             (long long)B, (long long)T, split, (long long)(hi - lo),
             fg_status_string(bs), fg_last_error());
    if (bs != FG_OK) {
        FZ_CHECK(x[0] == -7 && y[0] == -7 && rng == rng0,
                 "a rejected batch wrote its outputs");
    } else {
        for (int64_t b = 0; b < B; b++)
            FZ_CHECK(row_is_window(&d, lo, hi, x + b * T, y + b * T, T),
                     "row %lld is not a window of split %d", (long long)b,
                     split);
    }
    free(x);
    free(y);
    fg_text_data_release(&d);
    FZ_CHECK(d.ids == NULL && d.n == 0, "release left data behind");
    return 0;
}
