/* SPDX-License-Identifier: MIT */
/* tests/dist_util.h - shared pieces of the MPI test programs (run under
 * mpirun by tests/mpi-run.sh; plain C, no Check: Check forks, MPI ranks must
 * not). Every rank checks its own results; fgd_finish() combines the
 * verdicts so all ranks exit with the same status. A watchdog alarm turns a
 * hang (a rank missing from a collective) into a failure. */
#ifndef FG_TESTS_DIST_UTIL_H
#define FG_TESTS_DIST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <flashgrad/flashgrad.h>

static int fgd_rank, fgd_size, fgd_failed, fgd_checks;

#define FGD_CHECK(cond, ...)                                                \
    do {                                                                    \
        fgd_checks++;                                                       \
        if (!(cond)) {                                                      \
            fgd_failed++;                                                   \
            fprintf(stderr, "[rank %d] %s:%d: ", fgd_rank, __FILE__,        \
                    __LINE__);                                              \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

/* A call that must succeed; on failure the rank reports and stops (the
 * others then fail by the watchdog rather than hang forever). */
#define FGD_OK(call)                                                        \
    do {                                                                    \
        fg_status fgd_s_ = (call);                                          \
        if (fgd_s_ != FG_OK) {                                              \
            fprintf(stderr, "[rank %d] %s:%d: %s: %s\n", fgd_rank,          \
                    __FILE__, __LINE__, #call, fg_last_error());            \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

/* MPI communicator for the test, watchdog armed. */
static inline fg_comm *fgd_init(int *argc, char ***argv, unsigned watchdog_s)
{
    fg_comm *c = NULL;
    fg_status s = fg_comm_init_mpi(argc, argv, &c);
    if (s == FG_ERR_UNSUPPORTED) {
        fprintf(stderr, "skipped: %s\n", fg_last_error());
        exit(77);
    }
    if (s != FG_OK) {
        fprintf(stderr, "fg_comm_init_mpi: %s\n", fg_last_error());
        exit(1);
    }
    fgd_rank = fg_comm_rank(c);
    fgd_size = fg_comm_size(c);
    alarm(watchdog_s);
    fg_set_num_threads(1); /* ranks share the cores */
    return c;
}

/* Combines the verdicts, frees the communicator, finalises MPI; the exit
 * status for main. */
static inline int fgd_finish(fg_comm *c, const char *name)
{
    double f[2] = {(double)fgd_failed, (double)fgd_checks};
    FGD_OK(fg_comm_allreduce(c, f, f, 2, FG_FP64, FG_REDUCE_SUM));
    if (fgd_rank == 0)
        printf("%s: %d ranks, %.0f checks, %.0f failed\n", name, fgd_size,
               f[1], f[0]);
    fg_comm_free(c);
    FGD_OK(fg_dist_finalize());
    return f[0] == 0 ? 0 : 1;
}

/* splitmix64 */
static inline uint64_t fgd_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline double fgd_uniform(uint64_t *s)
{
    return (double)(fgd_next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* max |a - b| / max(max |b|, 1e-30) */
static inline double fgd_rel_err(const double *a, const double *b, size_t n)
{
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            return INFINITY;
        num = fmax(num, fabs(a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return num / den;
}

#endif /* FG_TESTS_DIST_UTIL_H */
