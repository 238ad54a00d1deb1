/* SPDX-License-Identifier: MIT */
/* lib/train/data_text.c - character-level text data: vocabulary, encoding,
 * train/validation split, random windows. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flashgrad/nn.h"
#include "lib/core/error.h"

fg_status fg_text_data_load(const char *path, fg_text_data *d)
{
    if (!path || !d)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    memset(d, 0, sizeof *d);
    /* Opened without blocking, so a FIFO that nothing writes to cannot
     * hang the open (its reads then see end of file); reads block again
     * after, for a pipe that does have a writer (process substitution). */
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    FILE *f = NULL;
    if (fd >= 0) {
        const int fl = fcntl(fd, F_GETFL);
        if (fl == -1 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == -1 ||
            !(f = fdopen(fd, "rb"))) {
            const int e = errno;
            close(fd);
            errno = e;
        }
    }
    if (!f)
        return FG_FAIL(FG_ERR_IO, "cannot open %s: %s", path,
                       strerror(errno));
    /* fopen opens a directory too; reading it would fail with EISDIR. */
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return FG_FAIL(FG_ERR_IO, "%s: is a directory", path);
    }
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            unsigned char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "reading %s", path);
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    const int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err || n < 100) {
        free(buf);
        return FG_FAIL(FG_ERR_IO, "%s: %s", path,
                       err ? strerror(err) : "fewer than 100 bytes");
    }
    int seen[256] = {0};
    for (size_t i = 0; i < n; i++)
        seen[buf[i]] = 1;
    for (int c = 0; c < 256; c++) {
        d->stoi[c] = -1;
        if (seen[c]) {
            d->stoi[c] = (int)d->vocab;
            d->itos[d->vocab++] = (unsigned char)c;
        }
    }
    d->ids = malloc(n * sizeof *d->ids);
    if (!d->ids) {
        free(buf);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "encoding %s", path);
    }
    for (size_t i = 0; i < n; i++)
        d->ids[i] = d->stoi[buf[i]];
    free(buf);
    d->n = (int64_t)n;
    d->n_train = (int64_t)(n * 9 / 10);
    return FG_OK;
}

void fg_text_data_release(fg_text_data *d)
{
    if (!d)
        return;
    free(d->ids);
    d->ids = NULL;
    d->n = d->n_train = 0;
}

fg_status fg_text_data_batch(const fg_text_data *d, int split, uint64_t *rng,
                             int64_t B, int64_t T, int64_t *x, int64_t *y)
{
    if (!d || !d->ids || !rng || !x || !y || B <= 0 || T <= 0 ||
        (split != 0 && split != 1))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad arguments");
    const int64_t lo = split ? d->n_train : 0,
                  hi = split ? d->n : d->n_train;
    if (hi - lo <= T) /* a window is T + 1 ids; T + 1 may overflow */
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "split %d has %lld characters, a window needs T + 1 "
                       "with T = %lld",
                       split, (long long)(hi - lo), (long long)T);
    for (int64_t b = 0; b < B; b++) {
        const int64_t st =
            lo + (int64_t)(fg_rng_next(rng) % (uint64_t)(hi - lo - T));
        memcpy(x + b * T, d->ids + st, (size_t)T * sizeof *x);
        memcpy(y + b * T, d->ids + st + 1, (size_t)T * sizeof *y);
    }
    return FG_OK;
}
