/* SPDX-License-Identifier: MIT */
/* tools/train/util.c - messages, clocks, paths. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "options.h"
#include "util.h"

int complain(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("flashgrad-train: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *hms(double s, char *buf)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        sprintf(buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        sprintf(buf, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

int path_join(const char *dir, const char *name, char *out, size_t cap)
{
    const int n = snprintf(out, cap, "%s%s%s", dir,
                           dir[0] && dir[strlen(dir) - 1] != '/' ? "/" : "",
                           name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int path_abs(const char *in, char *out, size_t cap)
{
    /* Resolved (no "..", no symlinks) when it or its folder exists. */
    char buf[PATH_MAX], dir[PATH_CAP];
    if (realpath(in, buf)) {
        const int n = snprintf(out, cap, "%s", buf);
        return n < 0 || (size_t)n >= cap ? -1 : 0;
    }
    const char *slash = strrchr(in, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - in) : 1,
             slash ? (slash == in ? "/" : in) : ".");
    if (realpath(dir, buf))
        return path_join(buf, slash ? slash + 1 : in, out, cap);
    if (in[0] == '/' || !getcwd(dir, sizeof dir)) {
        const int n = snprintf(out, cap, "%s", in);
        return n < 0 || (size_t)n >= cap ? -1 : 0;
    }
    return path_join(dir, in, out, cap);
}

int mkdir_p(const char *dir)
{
    char p[PATH_CAP];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return ENAMETOOLONG;
    for (char *s = p + 1;; s++) {
        const char c = *s;
        if (c != '/' && c)
            continue;
        *s = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return errno;
        *s = c;
        if (!c)
            break;
    }
    struct stat sb;
    if (stat(p, &sb) != 0)
        return errno;
    return S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
}

int check_writable(const char *path, const char *what)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return complain(EXIT_USAGE, "%s %s: is a directory", what, path);
    char dir[PATH_CAP], probe[PATH_CAP + 64];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir] = 0; /* keep "/" itself */
    else
        strcpy(dir, ".");
    snprintf(probe, sizeof probe, "%s/.flashgrad-train-probe-%ld", dir,
             (long)getpid());
    const int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return complain(EXIT_USAGE, "%s %s: cannot write in %s: %s", what,
                        path, dir, strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}
