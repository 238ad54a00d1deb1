/* SPDX-License-Identifier: MIT */
/* tests/test_util.h - shared helpers for the Check suites: seeded random
 * inputs (a fresh seed each run, printed, overridable with FG_TEST_SEED),
 * NaN poisoning, error metrics, GPU detection that keeps CUDA out of the
 * parent process (Check forks each test), and test registration that
 * FG_TEST_ONLY can narrow to single tests and iterations (fgt_add_loop). */
#ifndef FG_TESTS_TEST_UTIL_H
#define FG_TESTS_TEST_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <flashgrad/flashgrad.h>

/* A softcap in fp16 / bf16 on the CUDA kernels (tanh.approx.f32: 2^-11
 * relative on logits up to the cap), against the fp64 oracle: O and the
 * gradients within FGT_LOWP_VARIANT_TOL (test_variants' bound), m and l
 * within these (test_gpu_attention's test_softcap_stats, test_gpu_varlen). */
#define FGT_LOWP_VARIANT_TOL(dt) ((dt) == FG_FP16 ? 6e-3 : 4e-2)
#define FGT_SOFTCAP_TOL_M 2e-3
#define FGT_SOFTCAP_TOL_L 5e-3

/* splitmix64: tiny, good enough for test data. */
typedef struct { uint64_t s; } fgt_rng;

static inline uint64_t fgt_next(fgt_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline double fgt_uniform(fgt_rng *r)
{
    return (double)(fgt_next(r) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static inline int64_t fgt_int(fgt_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(fgt_next(r) % (uint64_t)(hi - lo + 1));
}

/* The run's base seed: FG_TEST_SEED or time ^ pid, printed once. */
static inline uint64_t fgt_base_seed(void)
{
    static uint64_t seed;
    static int have;
    if (!have) {
        const char *e = getenv("FG_TEST_SEED");
        seed = e ? strtoull(e, NULL, 0)
                 : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
        have = 1;
        fprintf(stderr, "test seed: FG_TEST_SEED=%llu\n",
                (unsigned long long)seed);
    }
    return seed;
}

static inline fgt_rng fgt_rng_for(uint64_t salt)
{
    fgt_rng r = {fgt_base_seed() ^ (salt * 0xD1342543DE82EF95ull)};
    fgt_next(&r);
    return r;
}

static inline void fgt_fill(double *x, size_t n, fgt_rng *r, double amp)
{
    for (size_t i = 0; i < n; i++)
        x[i] = amp * fgt_uniform(r);
}

/* x is BSHD [B, S, H, d] (S <= d): row (b, s, h) becomes the unit vector
 * e_s; the dropout-mask recovery tests use it as V and dO. */
static inline void fgt_unit_rows(double *x, int64_t B, int64_t S, int64_t H,
                                 int64_t d)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                x[((b * S + s) * H + h) * d + s] = 1.0;
}

static inline void fgt_poison_d(double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

static inline void fgt_poison_f(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* max |a - ref| / max(max |ref|, floor); NaN anywhere gives +inf. The
 * floor keeps an (exactly) zero reference, e.g. dQ when Nk = 1, from turning
 * rounding noise into an enormous relative error. */
static inline double fgt_rel_err_floor(const double *a, const double *ref,
                                       size_t n, double floor_)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i]))
            return INFINITY;
        double e = fabs(a[i] - ref[i]);
        if (e > num)
            num = e;
        if (fabs(ref[i]) > den)
            den = fabs(ref[i]);
    }
    return num / (den > floor_ ? den : floor_);
}

static inline double fgt_rel_err(const double *a, const double *ref, size_t n)
{
    return fgt_rel_err_floor(a, ref, n, 1e-300);
}

/* ||a - ref||_2 / max(||ref||_2, floor * sqrt(n)); NaN gives +inf. */
static inline double fgt_rms_err(const double *a, const double *ref, size_t n,
                                 double floor_)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i]))
            return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    den = sqrt(den);
    const double f = floor_ * sqrt((double)n);
    return sqrt(num) / (den > f ? den : f);
}

static inline double fgt_max_abs(const double *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

/* Relative error of stats m where -inf must match exactly. The
 * denominator is at least 0.1: a single row's max logit can cancel to
 * ~0.01, where one fp32 rounding of the dot product is already 1e-5 of it
 * (seen with FG_TEST_SEED=1882789943199061, N = 1). */
static inline double fgt_stats_err(const double *a, const double *ref,
                                   size_t n)
{
    double num = 0, den = 0.1;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i]) || isinf(a[i])) {
            if (a[i] != ref[i])
                return INFINITY;
            continue;
        }
        if (isnan(a[i]))
            return INFINITY;
        if (fabs(a[i] - ref[i]) > num)
            num = fabs(a[i] - ref[i]);
        if (fabs(ref[i]) > den)
            den = fabs(ref[i]);
    }
    return num / den;
}

static inline int fgt_all_finite(const double *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]))
            return 0;
    return 1;
}

/* 1 if a CUDA GPU is usable. Probed in a child process so the parent never
 * initialises CUDA before Check forks. */
static inline int fgt_gpu_present(void)
{
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        /* Why not: no GPU here, or (a CUDA build) no module found. */
        if (!fg_cuda_available()) {
            fprintf(stderr, "fg_cuda_available: %s\n", fg_last_error());
            _exit(1);
        }
        _exit(0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) < 0)
        return 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* FG_SANITIZE, as scripts/gpu-sanitize.sh sets it: 0 unset, 1 a
 * representative subset (memcheck, initcheck, synccheck), 2 "fast", the
 * smallest subset that still reaches every kernel family (racecheck,
 * whose shared-memory tracking makes each launch slow). */
static inline int fgt_sanitize_mode(void)
{
    const char *e = getenv("FG_SANITIZE");
    if (!e)
        return 0;
    return strcmp(e, "fast") == 0 ? 2 : 1;
}
/* FG_SANITIZE=det (gpu-phases.sh detsan): a suite's deterministic
 * backward cases alone (fgt_sanitize_mode() reads it as 1) */
static inline int fgt_sanitize_det(void)
{
    const char *e = getenv("FG_SANITIZE");
    return e && strcmp(e, "det") == 0;
}

/* Kernel switches: environment variables that tests set (FG_ATTN_KERNEL,
 * FG_GEMM_LT, ...). Under CK_FORK=no (the compute-sanitizer runs) the
 * tests share one process, so a test failing between its setenv and its
 * reset would leave the switch set for every later test.
 * FGT_SWITCHES_SAVE(names), names a static array of the suite's switches,
 * records the values the suite started with; fgt_switches_restore, as a
 * checked fixture (setup and teardown), puts them back around each test,
 * and fgt_switch_restore puts back one (a test's own reset: a suite
 * started with a switch set keeps it; a name not saved fails the test). */
typedef struct {
    const char *const *names; /* the suite's array */
    char **start;             /* their values when saved; NULL: unset */
    int n;
} fgt_switches;

static inline fgt_switches *fgt_switch_table(void)
{
    static fgt_switches t;
    return &t;
}

static inline void fgt_switches_save(const char *const *names, int n)
{
    fgt_switches *t = fgt_switch_table();
    t->names = names;
    t->start = calloc((size_t)n, sizeof *t->start);
    if (!t->start) {
        fprintf(stderr, "fgt_switches_save: out of memory\n");
        exit(EXIT_FAILURE);
    }
    for (int i = 0; i < n; i++) {
        const char *v = getenv(names[i]);
        t->start[i] = v ? strdup(v) : NULL;
    }
    t->n = n;
}
#define FGT_SWITCHES_SAVE(names) fgt_switches_save((names), (int)(sizeof(names) / sizeof((names)[0])))

static inline void fgt_switch_restore(const char *name)
{
    const fgt_switches *t = fgt_switch_table();
    for (int i = 0; i < t->n; i++) {
        if (strcmp(t->names[i], name) != 0)
            continue;
        if (t->start[i])
            setenv(name, t->start[i], 1);
        else
            unsetenv(name);
        return;
    }
    ck_abort_msg("fgt_switch_restore: %s is not among the suite's saved switches", name);
}

static inline void fgt_switches_restore(void)
{
    const fgt_switches *t = fgt_switch_table();
    for (int i = 0; i < t->n; i++)
        fgt_switch_restore(t->names[i]);
}

/* FG_TEST_ONLY="name[:i[-j]][,...]": register only the named tests and,
 * for a loop test, iterations i..j (inclusive), e.g.
 * FG_TEST_ONLY=test_variants:14-15 tests/test_gpu_attention runs two
 * variant cases in seconds where CK_RUN_CASE=core takes four minutes of
 * device time. Unset, fgt_add_loop / fgt_add_test register every test as
 * tcase_add_loop_test / tcase_add_test do; every Check suite registers
 * through them (FGT_TEST / FGT_LOOP included; the dist suites, MPI and
 * NCCL programs without Check, ignore FG_TEST_ONLY). A malformed
 * entry stops the suite (exit 2), and a suite whose registrations it
 * matches none of fails (fgt_run_suite) rather than pass with nothing run. */
static int fgt_only_seen, fgt_only_added; /* registrations under FG_TEST_ONLY: asked, made */

static inline void fgt_add_loop(TCase *tc, const TTest *t, int lo, int hi)
{
    const char *e = getenv("FG_TEST_ONLY");
    if (!e || !*e) {
        tcase_add_loop_test(tc, t, lo, hi);
        return;
    }
    fgt_only_seen++;
    const size_t n = strlen(t->name);
    for (const char *p = e; *p;) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        if ((size_t)(end - p) >= n && strncmp(p, t->name, n) == 0 &&
            (p + n == end || p[n] == ':')) {
            long a = lo, b = hi - 1L; /* inclusive */
            if (p + n < end) {
                char *q;
                a = b = strtol(p + n + 1, &q, 10);
                if (q != p + n + 1 && *q == '-')
                    b = strtol(q + 1, &q, 10);
                if (q == p + n + 1 || q != end || b < a) {
                    fprintf(stderr, "FG_TEST_ONLY: bad entry \"%.*s\" (name, name:i or name:i-j)\n",
                            (int)(end - p), p);
                    exit(2);
                }
            }
            if (a < lo)
                a = lo;
            if (b > hi - 1L)
                b = hi - 1L;
            if (a <= b) {
                fprintf(stderr, "FG_TEST_ONLY: %s %ld..%ld\n", t->name, a, b);
                tcase_add_loop_test(tc, t, (int)a, (int)b + 1);
                fgt_only_added++;
            }
        }
        p = *end ? end + 1 : end;
    }
}

static inline void fgt_add_test(TCase *tc, const TTest *t) { fgt_add_loop(tc, t, 0, 1); }

/* Runs a suite with CK_NORMAL output; the process exit status. */
static inline int fgt_run_suite(Suite *s)
{
    const char *only = getenv("FG_TEST_ONLY");
    if (only && *only && fgt_only_seen && !fgt_only_added) {
        fprintf(stderr, "FG_TEST_ONLY=%s: no test of this suite matches\n", only);
        return EXIT_FAILURE;
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif /* FG_TESTS_TEST_UTIL_H */
