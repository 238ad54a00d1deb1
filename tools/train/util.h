/* SPDX-License-Identifier: MIT */
/* tools/train/util.h - small helpers shared by the trainer's files:
 * messages, clocks, paths. */
#ifndef FG_TRAIN_UTIL_H
#define FG_TRAIN_UTIL_H

#include <stddef.h>

#if defined(__GNUC__)
#define TR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TR_PRINTF(a, b)
#endif

/* Prints "flashgrad-train: MESSAGE" to stderr; returns code. */
int complain(int code, const char *fmt, ...) TR_PRINTF(2, 3);

/* Seconds on a monotonic clock. */
double now(void);
/* "m:ss" or "h:mm:ss" into buf (at least 32 bytes). */
const char *hms(double s, char *buf);

/* in made absolute against the current directory, resolved as far as it
 * exists (the file itself need not); 0, or -1 when it does not fit. */
int path_abs(const char *in, char *out, size_t cap);
/* dir + "/" + name; 0 or -1 (too long). */
int path_join(const char *dir, const char *name, char *out, size_t cap);
/* mkdir -p; 0 or an errno value. */
int mkdir_p(const char *dir);
/* 0 when a file can be created or replaced at path (a probe file is
 * created and removed beside it); else prints why, naming `what`, and
 * returns EXIT_USAGE. */
int check_writable(const char *path, const char *what);

#endif
