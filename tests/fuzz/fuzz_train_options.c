/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_train_options.c - libFuzzer target for flashgrad-train's
 * option parser (tools/train/options.c): opts_parse_args + opts_finish on
 * a command line, or opts_apply on checkpoint lines.
 *
 * The bytes build the arguments from a subset of the options (every kind:
 * whole numbers, decimals, word lists, paths, flags, mode-specific and
 * command-line-only ones), values near and past each documented range
 * (--help), junk, and raw bytes. An independent model of the documented
 * rules (strict numbers, ranges with open ends, "--name=value", a value
 * that is another option, modes, --min-lr <= --lr, --allow-new-data with
 * --resume) must agree with the parser's status exactly whenever every
 * option named is one the model knows. Always: a rejection prints one
 * "flashgrad-train: " message and an acceptance prints nothing; accepted
 * values are the last ones given; the settings that opts_write keeps
 * (config file, checkpoints) read back, through the command line and
 * through opts_apply, to the same settings. */
#include "fuzz_util.h" /* first: it defines _GNU_SOURCE */

#include <errno.h>
#include <math.h>

#include "../../tools/train/options.h"

enum { SORT = 1, TEXT = 2, BOTH = 3, CMD = 4 };
enum { M_INT, M_REAL, M_STR, M_FLAG, M_HELP, M_VERSION };

/* The options the model knows, with --help's ranges and modes. */
typedef struct mopt {
    const char *name;
    int kind, mode;
    size_t off, cap;       /* field in opts; string capacity */
    int64_t ilo, ihi;      /* M_INT */
    double lo, hi;         /* M_REAL ... */
    int lo_open, hi_open;  /* ... with open ends */
    const char *words[5];  /* M_STR: the accepted values, or none */
} mopt;

#define FLD(f) .off = offsetof(opts, f), .cap = sizeof(((opts *)0)->f)
static const mopt MODEL[] = {
    {"--data", M_STR, BOTH, FLD(data)},
    {"--bytes", M_FLAG, TEXT, FLD(bytes)},
    {"--sort-len", M_INT, SORT, FLD(sort_len), .ilo = 2, .ihi = 64},
    {"--ctx", M_INT, TEXT, FLD(ctx), .ilo = 1, .ihi = 1 << 24},
    {"--dropout", M_REAL, BOTH, FLD(dropout), .lo = 0, .hi = 1, .hi_open = 1},
    {"--softcap", M_REAL, BOTH, FLD(softcap), .lo = 0, .hi = 1e6},
    {"--steps", M_INT, BOTH, FLD(steps), .ilo = 1, .ihi = 1000000000000},
    {"--lr", M_REAL, BOTH, FLD(lr), .lo = 0, .hi = 10, .lo_open = 1},
    {"--min-lr", M_REAL, BOTH, FLD(min_lr), .lo = 0, .hi = 10},
    {"--seed", M_INT, BOTH, FLD(seed), .ilo = 0, .ihi = INT64_MAX},
    {"--device", M_STR, BOTH, FLD(device), .words = {"cpu", "cuda", "auto"}},
    {"--dtype", M_STR, BOTH, FLD(dtype),
     .words = {"auto", "fp32", "fp64", "bf16", "fp16"}},
    {"--samples", M_INT, TEXT, FLD(samples), .ilo = 0, .ihi = 1000},
    {"--target-acc", M_REAL, SORT, FLD(target_acc), .lo = 0, .hi = 1},
    {"--out-dir", M_STR, BOTH, FLD(out_dir)},
    {"--resume", M_STR, CMD, FLD(resume)},
    {"--allow-new-data", M_FLAG, CMD, FLD(allow_new_data)},
    {.name = "--help", .kind = M_HELP, .mode = CMD},
    {.name = "--version", .kind = M_VERSION, .mode = CMD},
};
enum { NMODEL = sizeof MODEL / sizeof *MODEL, MAXARGS = 24 };
enum { I_SORT_LEN = 2, I_CTX = 3, I_LR = 7, I_MIN_LR = 8, I_RESUME = 15,
       I_ALLOW = 16 };

/* Names that are surely no option of flashgrad-train. */
static const char *const NOT_OPTIONS[] = {"--", "--bogus", "--Steps",
                                          "--steps2", "--lr-"};

/* What a name is to the model: an index into MODEL, or one of these. */
enum { N_UNKNOWN = -1, N_UNSURE = -2 };

static int classify(const char *s, size_t len)
{
    if (len < 2 || strncmp(s, "--", 2))
        return N_UNKNOWN; /* every option starts with -- */
    for (int i = 0; i < NMODEL; i++)
        if (strlen(MODEL[i].name) == len && !memcmp(MODEL[i].name, s, len))
            return i;
    for (size_t i = 0; i < sizeof NOT_OPTIONS / sizeof *NOT_OPTIONS; i++)
        if (strlen(NOT_OPTIONS[i]) == len && !memcmp(NOT_OPTIONS[i], s, len))
            return N_UNKNOWN;
    return N_UNSURE;
}

/* ---- the model's value rules ------------------------------------------------ */

/* -?[0-9]+ in [lo, hi], without strtoll. */
static int int_ok(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    const int neg = s[0] == '-';
    const char *p = s + neg;
    if (!*p)
        return 0;
    uint64_t mag = 0;
    int big = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        const unsigned dgt = (unsigned)(*p - '0');
        if (mag > (UINT64_MAX - dgt) / 10)
            big = 1;
        else
            mag = mag * 10 + dgt;
    }
    if (big || mag > (uint64_t)INT64_MAX + neg)
        return 0;
    const int64_t v = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    *out = v;
    return v >= lo && v <= hi;
}

static int real_ok(const mopt *m, const char *s, double *out)
{
    if (!(s[0] == '-' || s[0] == '.' || (s[0] >= '0' && s[0] <= '9')))
        return 0;
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v) || v < m->lo || v > m->hi ||
        (m->lo_open && v == m->lo) || (m->hi_open && v == m->hi))
        return 0;
    *out = v;
    return 1;
}

static int str_ok(const mopt *m, const char *s)
{
    if (!s[0] || strlen(s) >= m->cap || strchr(s, '\n'))
        return 0;
    if (!m->words[0])
        return 1;
    for (int w = 0; w < 5 && m->words[w]; w++)
        if (!strcmp(m->words[w], s))
            return 1;
    return 0;
}

/* The model's settings: the last value of each option given. */
typedef struct mstate {
    int given[NMODEL];
    int64_t i[NMODEL];
    double r[NMODEL];
    const char *s[NMODEL];
    int exact; /* 0: a name the model does not know was used */
} mstate;

static int set_value(mstate *ms, int k, const char *v)
{
    const mopt *m = &MODEL[k];
    switch (m->kind) {
    case M_INT: return int_ok(v, m->ilo, m->ihi, &ms->i[k]);
    case M_REAL: return real_ok(m, v, &ms->r[k]);
    case M_FLAG: return 1;
    default: ms->s[k] = v; return str_ok(m, v);
    }
}

/* opts_parse_args in the model: 0, EXIT_USAGE, OPTS_HELP or OPTS_VERSION. */
static int model_parse(mstate *ms, int argc, char **argv)
{
    for (int a = 0; a < argc; a++) {
        const char *t = argv[a];
        if (!strcmp(t, "-h"))
            return OPTS_HELP;
        if (strncmp(t, "--", 2))
            return EXIT_USAGE;
        const char *eq = strchr(t, '=');
        const int k = classify(t, eq ? (size_t)(eq - t) : strlen(t));
        if (k == N_UNSURE)
            ms->exact = 0;
        if (k < 0)
            return EXIT_USAGE;
        if (MODEL[k].kind == M_HELP)
            return OPTS_HELP;
        if (MODEL[k].kind == M_VERSION)
            return OPTS_VERSION;
        const char *v = NULL;
        if (MODEL[k].kind == M_FLAG && eq)
            return EXIT_USAGE;
        if (MODEL[k].kind != M_FLAG) {
            v = eq ? eq + 1 : a + 1 < argc ? argv[++a] : NULL;
            if (!v)
                return EXIT_USAGE;
            if (!eq && !strncmp(v, "--", 2)) {
                const int kv = classify(v, strcspn(v, "="));
                if (kv == N_UNSURE)
                    ms->exact = 0;
                if (kv >= 0)
                    return EXIT_USAGE; /* "needs a value (got the option)" */
            }
        }
        if (!set_value(ms, k, v))
            return EXIT_USAGE;
        ms->given[k] = 1;
    }
    return 0;
}

/* opts_finish in the model: modes, --min-lr <= --lr, --allow-new-data. */
static int model_finish(const mstate *ms)
{
    const int mode = ms->given[0] ? TEXT : SORT;
    const int64_t sort_len = ms->given[I_SORT_LEN] ? ms->i[I_SORT_LEN] : 8;
    for (int k = 0; k < NMODEL; k++) {
        if (!ms->given[k] || MODEL[k].mode & (mode | CMD))
            continue;
        if (k == I_CTX && ms->i[k] == 2 * sort_len)
            continue; /* the sort task's own context, said explicitly */
        return EXIT_USAGE;
    }
    const double lr = ms->given[I_LR] ? ms->r[I_LR] : 3e-3;
    if (ms->given[I_MIN_LR] && ms->r[I_MIN_LR] > lr)
        return EXIT_USAGE;
    if (ms->given[I_ALLOW] && !ms->given[I_RESUME])
        return EXIT_USAGE;
    return 0;
}

/* ---- building the arguments ------------------------------------------------- */

static char long_path[4097]; /* 4095 and 4096 bytes: at and past PATH_CAP */

static const char *const JUNK[] = {
    "", " 5", "5 ", "+5", "5x", "0x10", "1e3", "1.5e2", "-0", "007", "-",
    ".", ".5", "-.5", "1.", "1e", "1e-400", "1e400", "nan", "inf", "-inf",
    "0x1p-3", "99999999999999999999", "9223372036854775807",
    "9223372036854775808", "-9223372036854775808", "cpu", "cuda", "auto",
    "fp32", "fp64", "bf16", "cp", "cpux", "gpu", "auto|cpu", "cpu|cuda",
    "a\nb", "x/y", "--steps", "--steps=3", "--help", "--bogus", "--", "-5",
    "10.000001", "0.99999999999999999", "1", "0", "3e-3", "2e-3"};

static char *value(fz *f, const mopt *m, char *buf, size_t cap)
{
    const uint8_t c = fz_u8(f);
    if (c % 4 == 0)
        return (char *)FZ_PICK(f, JUNK);
    if (m && m->kind == M_INT && c % 4 == 1) {
        const int64_t picks[] = {m->ilo, m->ihi, m->ilo - 1, 2 * m->ilo,
                                 m->ihi / 2, m->ihi - 1};
        const uint8_t w = fz_u8(f);
        if (w < 128)
            snprintf(buf, cap, "%lld", (long long)FZ_PICK(f, picks));
        else if (!(w & 1))
            snprintf(buf, cap, "%lld", (long long)m->ihi);
        else if (m->ihi == INT64_MAX)
            snprintf(buf, cap, "9223372036854775808");
        else
            snprintf(buf, cap, "%lld", (long long)m->ihi + 1);
        return buf;
    }
    if (m && m->kind == M_REAL && c % 4 == 1) {
        const double picks[] = {m->lo, m->hi, -m->hi, m->hi * 1.5,
                                m->lo + (m->hi - m->lo) / 3,
                                nextafter(m->hi, 0), nextafter(m->lo, 1)};
        snprintf(buf, cap, "%.17g", FZ_PICK(f, picks));
        return buf;
    }
    if (m && m->kind == M_STR && m->words[0] && c % 4 == 1) {
        int n = 0;
        while (n < 5 && m->words[n])
            n++;
        return (char *)m->words[fz_u8(f) % n];
    }
    if (c % 4 == 2) { /* at or past the path capacity */
        const size_t len = 4094 + fz_u8(f) % 3;
        memset(long_path, 'p', len);
        long_path[len] = '\0';
        return long_path;
    }
    size_t n = fz_u8(f) % 12, k = 0;
    for (; k < n && k + 1 < cap && f->n; k++) {
        const uint8_t b = fz_u8(f);
        buf[k] = (char)(b ? b : '0');
    }
    buf[k] = '\0';
    return buf;
}

/* Arguments from the bytes into argv (pointers into store). */
static int build_args(fz *f, char **argv, char store[][64])
{
    int argc = 0;
    while (f->n && argc < MAXARGS) {
        char *buf = store[argc];
        const uint8_t c = fz_u8(f);
        const mopt *m = &MODEL[fz_u8(f) % NMODEL];
        if (c % 8 < 5) { /* an option, its value alone or after '=' */
            if ((c & 0x40) && m->kind != M_HELP && m->kind != M_VERSION) {
                char vb[64];
                const char *v = value(f, m, vb, sizeof vb);
                if (strlen(v) > 40)
                    v = "x";
                snprintf(buf, 64, "%s=%s", m->name, v);
                argv[argc++] = buf;
                continue;
            }
            argv[argc++] = (char *)m->name;
            if (m->kind <= M_STR && argc < MAXARGS && !(c & 0x80)) {
                argv[argc] = value(f, m, store[argc], 64);
                argc++;
            }
        } else if (c % 8 == 5) {
            static const char *const h[] = {"-h", "--help", "--version",
                                            "-h=1", "--help=x", "-v"};
            argv[argc++] = (char *)FZ_PICK(f, h);
        } else if (c % 8 == 6) {
            argv[argc++] = value(f, NULL, buf, 64); /* raw */
        } else {
            argv[argc++] = value(f, m, buf, 64);
        }
    }
    return argc;
}

/* ---- checks ------------------------------------------------------------------- */

/* One rejection message, or none. */
static void check_message(const char *msg, size_t len, int rc, const char *src)
{
    if (rc != EXIT_USAGE) {
        FZ_CHECK(len == 0, "status %d but a message: %s", rc, msg);
        return;
    }
    char want[64];
    snprintf(want, sizeof want, "flashgrad-train: %s", src);
    FZ_CHECK(len > strlen(want) && !strncmp(msg, want, strlen(want)) &&
                 msg[len - 1] == '\n',
             "a rejection's message is not 'flashgrad-train: %s...\\n': %s",
             src, msg);
}

/* Accepted values are the last ones given. */
static void check_values(const opts *o, const mstate *ms)
{
    for (int k = 0; k < NMODEL; k++) {
        if (!ms->given[k])
            continue;
        const mopt *m = &MODEL[k];
        const char *p = (const char *)o + m->off;
        if (m->kind == M_INT || m->kind == M_FLAG) {
            const int64_t want = m->kind == M_FLAG ? 1 : ms->i[k];
            FZ_CHECK(*(const int64_t *)p == want, "%s is %lld, given %lld",
                     m->name, (long long)*(const int64_t *)p, (long long)want);
        } else if (m->kind == M_REAL) {
            FZ_CHECK(*(const double *)p == ms->r[k], "%s is %.17g, given %.17g",
                     m->name, *(const double *)p, ms->r[k]);
        } else if (m->kind == M_STR) {
            FZ_CHECK(!strcmp(p, ms->s[k]), "%s is '%s', given '%s'", m->name,
                     p, ms->s[k]);
        }
    }
}

static char *written(const opts *o, int wrap)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    FZ_CHECK(f, "open_memstream failed");
    opts_write(o, f, wrap);
    fclose(f);
    return buf;
}

/* The kept settings read back to the same settings: as "--name=value"
 * arguments, and as checkpoint lines through opts_apply. */
static void check_round_trip(const opts *o)
{
    char *text = written(o, 0);
    char *lines = strdup(text);
    FZ_CHECK(lines, "strdup failed");
    char *args[128];
    char *name[128], *val[128];
    int n = 0;
    for (char *save = NULL, *l = strtok_r(lines, "\n", &save); l && n < 128;
         l = strtok_r(NULL, "\n", &save), n++) {
        args[n] = strdup(l);
        char *sp = strchr(args[n], ' ');
        if (sp)
            *sp = '=';
        name[n] = l;
        val[n] = strchr(l, ' ');
        if (val[n])
            *val[n]++ = '\0';
    }
    opts a, b;
    opts_defaults(&a);
    opt_given given;
    memset(&given, 0, sizeof given);
    int rc = opts_parse_args(&a, n, args, &given);
    FZ_CHECK(rc == 0, "the written settings do not parse back (%d):\n%s", rc,
             text);
    FZ_CHECK(opts_finish(&a, &given) == 0, "written settings refused:\n%s",
             text);
    opts_defaults(&b);
    for (int i = 0; i < n; i++)
        FZ_CHECK(opts_apply(&b, name[i], val[i], "ckpt") == 0,
                 "opts_apply refused its own line %s", name[i]);
    FZ_CHECK(opts_finish(&b, NULL) == 0, "applied settings refused:\n%s",
             text);
    char *ta = written(&a, 0), *tb = written(&b, 0);
    FZ_CHECK(!strcmp(ta, text), "parsed back differently:\n%s\nvs\n%s", ta,
             text);
    FZ_CHECK(!strcmp(tb, text), "applied back differently:\n%s\nvs\n%s", tb,
             text);
    char *wrapped = written(o, 80); /* the config print */
    FZ_CHECK(!strncmp(wrapped, "  --", 4), "config print: %.40s", wrapped);
    for (int i = 0; i < n; i++)
        free(args[i]);
    free(wrapped);
    free(ta);
    free(tb);
    free(lines);
    free(text);
}

/* Checkpoint lines: each (name, value) through opts_apply. */
static void fuzz_apply(fz *f, FILE *mf, char **mbuf, size_t *mlen)
{
    opts o;
    opts_defaults(&o);
    while (f->n) {
        const uint8_t c = fz_u8(f);
        const int k = fz_u8(f) % NMODEL;
        char nb[64], vb[64];
        const char *name = MODEL[k].name;
        int kn = k;
        if (c & 1) {
            name = value(f, NULL, nb, sizeof nb);
            kn = classify(name, strlen(name));
        }
        const char *v = c & 2 ? NULL : value(f, &MODEL[k], vb, sizeof vb);
        mstate ms;
        memset(&ms, 0, sizeof ms);
        int want = EXIT_USAGE;
        if (kn >= 0 && MODEL[kn].mode != CMD) {
            if (MODEL[kn].kind == M_FLAG)
                want = v && v[0] ? EXIT_USAGE : 0;
            else
                want = v && set_value(&ms, kn, v) ? 0 : EXIT_USAGE;
        }
        rewind(mf);
        const int rc = opts_apply(&o, name, v, "ckpt");
        fflush(mf);
        const size_t len = (size_t)ftell(mf);
        FZ_CHECK(*mbuf, "open_memstream has no buffer");
        (*mbuf)[len] = '\0';
        FZ_CHECK(rc == 0 || rc == EXIT_USAGE, "opts_apply returned %d", rc);
        if (kn != N_UNSURE)
            FZ_CHECK(rc == want, "opts_apply(%s, %s) returned %d, the model "
                     "says %d", name, v ? v : "NULL", rc, want);
        check_message(*mbuf, len, rc, "ckpt: ");
        if (rc == 0 && kn >= 0) {
            ms.given[kn] = 1;
            check_values(&o, &ms);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    char *mbuf = NULL;
    size_t mlen = 0;
    FILE *mf = open_memstream(&mbuf, &mlen);
    FZ_CHECK(mf, "open_memstream failed");
    opts_set_messages(mf);
    if (fz_u8(&f) & 1) {
        fuzz_apply(&f, mf, &mbuf, &mlen);
    } else {
        static char store[MAXARGS][64];
        char *argv[MAXARGS + 1];
        const int argc = build_args(&f, argv, store);
        argv[argc] = NULL;
        mstate ms;
        memset(&ms, 0, sizeof ms);
        ms.exact = 1;
        int want = model_parse(&ms, argc, argv);
        opts o;
        opts_defaults(&o);
        opt_given given;
        memset(&given, 0, sizeof given);
        int rc = opts_parse_args(&o, argc, argv, &given);
        fflush(mf);
        FZ_CHECK(rc == 0 || rc == EXIT_USAGE || rc == OPTS_HELP ||
                     rc == OPTS_VERSION, "opts_parse_args returned %d", rc);
        if (ms.exact)
            FZ_CHECK(rc == want, "opts_parse_args returned %d, the model "
                     "says %d (%s)", rc, want, mbuf ? mbuf : "");
        check_message(mbuf, mlen, rc, "");
        if (rc == 0) {
            if (ms.exact)
                check_values(&o, &ms);
            rc = opts_finish(&o, &given);
            fflush(mf);
            FZ_CHECK(rc == 0 || rc == EXIT_USAGE, "opts_finish: %d", rc);
            if (ms.exact)
                FZ_CHECK(rc == model_finish(&ms), "opts_finish returned %d, "
                         "the model says %d (%s)", rc, model_finish(&ms),
                         mbuf ? mbuf : "");
            check_message(mbuf, mlen, rc, "");
            if (rc == 0) {
                if (ms.exact)
                    check_values(&o, &ms);
                check_round_trip(&o);
            }
        }
    }
    opts_set_messages(NULL);
    fclose(mf);
    free(mbuf);
    return 0;
}
