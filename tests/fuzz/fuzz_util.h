/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_util.h - helpers of the libFuzzer targets: a reader that
 * decodes the input bytes (zeros once they run out), an oracle check that
 * aborts (libFuzzer then keeps the input), and a path that names a buffer
 * without touching the disk. */
#ifndef FG_TESTS_FUZZ_UTIL_H
#define FG_TESTS_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline uint8_t fz_u8(fz *f)
{
    if (!f->n)
        return 0;
    f->n--;
    return *f->p++;
}

static inline uint16_t fz_u16(fz *f)
{
    const uint16_t lo = fz_u8(f);
    return (uint16_t)(lo | (uint16_t)fz_u8(f) << 8);
}

static inline uint64_t fz_u64(fz *f)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)fz_u8(f) << (8 * i);
    return v;
}

/* One of n values picked by the next byte. */
#define FZ_PICK(f, arr) ((arr)[fz_u8(f) % (sizeof(arr) / sizeof((arr)[0]))])

/* For the oracle's own loops: coverage of them would only slow the fuzzer
 * (and steer it toward the checker instead of the library). */
#if defined(__clang__) && __clang_major__ >= 13
#define FZ_ORACLE __attribute__((no_sanitize("coverage")))
#else
#define FZ_ORACLE
#endif

/* splitmix64 for input values derived from the bytes. */
static inline uint64_t fz_mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* An oracle violation: report and abort, so libFuzzer saves the input. */
#define FZ_CHECK(cond, ...)                                              \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__,       \
                    __LINE__, #cond);                                    \
            fprintf(stderr, __VA_ARGS__);                                \
            fputc('\n', stderr);                                         \
            abort();                                                     \
        }                                                                \
    } while (0)

/* An in-memory file holding data[0..n-1]; its path (/proc/self/fd/N) in
 * path. Returns the descriptor (close it when done) or -1. */
static inline int fz_memfile(const uint8_t *data, size_t n, char *path,
                             size_t cap)
{
    const int fd = memfd_create("fg-fuzz", 0);
    if (fd < 0)
        return -1;
    size_t done = 0;
    while (done < n) {
        const ssize_t w = write(fd, data + done, n - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif /* FG_TESTS_FUZZ_UTIL_H */
