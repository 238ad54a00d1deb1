/* SPDX-License-Identifier: MIT */
/* tools/train/options.c - flashgrad-train's option table and everything
 * derived from it: strict parsing, --help, the config print and the
 * settings kept in checkpoints. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <flashgrad/flashgrad.h>

#include "options.h"
#include "util.h"

enum kind { K_GROUP, K_INT, K_REAL, K_STR, K_FLAG, K_HELP, K_VERSION };
/* Where an option applies: the sort task, text mode, or only the
 * command line that gives it (never kept in checkpoints). */
enum { SORT = 1, TEXT = 2, BOTH = 3, CMD = 4 };

typedef struct spec {
    const char *name;
    enum kind kind;
    size_t off, size;
    int64_t ilo, ihi;       /* K_INT range */
    double lo, hi;          /* K_REAL range ... */
    int lo_open, hi_open;   /* ... with open ends */
    int scope;
    const char *arg;        /* metavar; "a|b|c" lists the accepted values */
    const char *help;
    const char *dflt;       /* default as shown by --help, when not the
                               value of opts_defaults ("" = none) */
} spec;

#define F(f) .off = offsetof(opts, f), .size = sizeof(((opts *)0)->f)
#define INT(n, f, l, h, sc, ...)                                          \
    {.name = n, .kind = K_INT, F(f), .ilo = l, .ihi = h, .scope = sc,     \
     .arg = "N", __VA_ARGS__}
#define REAL(n, f, l, h, lopen, hopen, sc, ...)                           \
    {.name = n, .kind = K_REAL, F(f), .lo = l, .hi = h, .lo_open = lopen,  \
     .hi_open = hopen, .scope = sc, .arg = "X", __VA_ARGS__}
#define STR(n, f, sc, a, ...)                                             \
    {.name = n, .kind = K_STR, F(f), .scope = sc, .arg = a, __VA_ARGS__}
#define FLAG(n, f, sc, ...)                                               \
    {.name = n, .kind = K_FLAG, F(f), .scope = sc, __VA_ARGS__}
#define GROUP(title) {.name = NULL, .kind = K_GROUP, .help = title}

static const int64_t BIG = 1000000000000; /* 1e12: "any count" */

static const spec SPECS[] = {
    GROUP("Data"),
    STR("--data", data, BOTH, "FILE",
        .help = "character-level model of a text file (first 90%\n"
                "train, last 10% validation); without it: the\n"
                "built-in task, sorting digits",
        .dflt = ""),
    FLAG("--bytes", bytes, TEXT,
         .help = "read FILE as raw bytes even when it is not text"),
    INT("--sort-len", sort_len, 2, 64, SORT, .help = "digits per sequence"),
    INT("--sort-digits", sort_digits, 2, 64, SORT,
        .help = "distinct digits"),
    GROUP("Model"),
    INT("--layers", layers, 1, 4096, BOTH, .help = "transformer blocks"),
    INT("--heads", heads, 1, 4096, BOTH,
        .help = "attention heads (width / heads: a multiple of 8)"),
    INT("--width", width, 8, 1 << 20, BOTH, .help = "embedding width"),
    INT("--ctx", ctx, 1, 1 << 24, TEXT,
        .help = "context length (the sort task's is 2 x --sort-len)",
        .dflt = "64"),
    REAL("--dropout", dropout, 0, 1, 0, 1, BOTH, .help = "dropout"),
    INT("--window", window, 0, 1 << 24, BOTH,
        .help = "sliding-window attention: each token sees itself and\n"
                "this many tokens before it (0 = the whole context)"),
    INT("--alibi", alibi, 0, 1, BOTH,
        .help = "1: ALiBi distance biases instead of learned positions"),
    REAL("--softcap", softcap, 0, 1e6, 0, 0, BOTH,
         .help = "cap attention scores at X tanh(s / X) (0 = off)"),
    GROUP("Optimisation"),
    INT("--steps", steps, 1, BIG, BOTH, .help = "optimizer steps",
        .dflt = "sort 800, text 2000"),
    INT("--batch", batch, 1, 1 << 24, BOTH,
        .help = "sequences per micro-batch", .dflt = "sort 64, text 32"),
    INT("--accum", accum, 1, 1 << 20, BOTH,
        .help = "micro-batches per step (gradient accumulation)"),
    REAL("--lr", lr, 0, 10, 1, 0, BOTH,
         .help = "peak learning rate (linear warmup, cosine decay)"),
    REAL("--min-lr", min_lr, 0, 10, 0, 0, BOTH,
         .help = "learning rate at the last step", .dflt = "lr / 10"),
    INT("--warmup", warmup, 0, BIG, BOTH, .help = "warmup steps"),
    REAL("--wd", wd, 0, 10, 0, 0, BOTH, .help = "AdamW weight decay"),
    REAL("--beta2", beta2, 0, 1, 0, 1, BOTH, .help = "AdamW beta2"),
    REAL("--clip", clip, 0, 1e9, 0, 0, BOTH,
         .help = "clip gradients to this global norm (0 = off)"),
    INT("--seed", seed, 0, INT64_MAX, BOTH,
        .help = "seed of init, data order and dropout"),
    GROUP("Machine"),
    STR("--device", device, BOTH, "cpu|cuda|auto",
        .help = "auto: cuda when a GPU is usable, else cpu"),
    STR("--dtype", dtype, BOTH, "auto|fp32|fp64|bf16|fp16",
        .help = "bf16: fp32 parameters, bf16 products and attention\n"
                "(cuda only); fp16: the same in fp16, with dynamic\n"
                "loss scaling (cuda only); auto: bf16 on cuda, fp32\n"
                "on cpu"),
    REAL("--loss-scale", loss_scale, 0, 0x1p64, 0, 0, BOTH,
         .help = "dynamic loss scaling's first scale (doubled after\n"
                 "2000 steps without an overflow, halved at one, which\n"
                 "skips the step); 0: 65536 with fp16, off otherwise",
         .dflt = "0"),
    INT("--threads", threads, 0, 4096, BOTH,
        .help = "CPU threads (0: OpenMP's default); toy models gain\n"
                "nothing from more than 1"),
    INT("--deterministic", deterministic, 0, 1, BOTH,
        .help = "bitwise-reproducible CUDA steps (the CPU always is)"),
    INT("--gemm-autotune", gemm_autotune, 0, 1, BOTH,
        .help = "1: time cuBLASLt's candidate algorithms for each GEMM\n"
                "shape on its first call and keep the fastest (cuda;\n"
                "the last bits may then differ between runs)"),
    INT("--zero1", zero1, 0, 1, BOTH,
        .help = "with several ranks (mpirun, --rendezvous): shard\n"
                "the AdamW moments across them (ZeRO-1)"),
    REAL("--bucket-mb", bucket_mb, 0, 1024, 0, 0, BOTH,
         .help = "with several ranks: MiB of gradients per all-reduce\n"
                 "bucket (0: the library's default, 4 with MPI;\n"
                 "with NCCL an eighth of the gradients, 25 to 64)"),
    GROUP("Progress and evaluation"),
    INT("--print-interval", print_interval, 1, BIG, BOTH,
        .help = "steps between progress lines (loss, speed, MFU, ETA)"),
    INT("--eval-interval", eval_interval, 1, BIG, BOTH,
        .help = "steps between evaluations (validation loss; held-out\n"
                "accuracy for the sort task) and best.ckpt updates"),
    INT("--eval-batches", eval_batches, 1, 1 << 20, BOTH,
        .help = "batches per validation loss"),
    INT("--eval-examples", eval_examples, 1, BIG, SORT,
        .help = "held-out sequences per accuracy evaluation"),
    INT("--final-examples", final_examples, 1, BIG, SORT,
        .help = "held-out sequences for the final accuracy"),
    REAL("--target-acc", target_acc, 0, 1, 0, 0, SORT,
         .help = "stop once an evaluation reaches it (0 = never)"),
    REAL("--peak-tflops", peak_tflops, -1, 1e6, 0, 0, BOTH,
         .help = "one device's peak TFLOP/s, the MFU's divisor; -1:\n"
                 "auto (cuda: an H100 SXM's dense peak, 989 bf16,\n"
                 "67 fp32/fp64; cpu: no MFU); 0: no MFU",
         .dflt = "-1"),
    GROUP("Outputs"),
    STR("--out-dir", out_dir, BOTH, "DIR",
        .help = "the run's folder: config, log.csv, loss.png,\n"
                "samples.txt, last.ckpt, best.ckpt",
        .dflt = "runs/YYYYmmdd-HHMMSS"),
    STR("--ckpt", ckpt, BOTH, "PATH",
        .help = "the last checkpoint ('none': no checkpoints at all)",
        .dflt = "DIR/last.ckpt"),
    INT("--ckpt-interval", ckpt_interval, 0, BIG, BOTH,
        .help = "steps between saves of the last checkpoint (0:\n"
                "only at exit, including Ctrl-C and SIGTERM)"),
    STR("--log", log, BOTH, "PATH", .help = "CSV log ('none' to skip)",
        .dflt = "DIR/log.csv"),
    STR("--plot", plot, BOTH, "PATH",
        .help = "loss curve PNG, drawn by gnuplot if installed\n"
                "('none' to skip)",
        .dflt = "DIR/loss.png"),
    INT("--sample-interval", sample_interval, 0, BIG, TEXT,
        .help = "steps between samples (0: only at the end)"),
    INT("--samples", samples, 0, 1000, TEXT,
        .help = "samples each time (printed, and kept in samples.txt)"),
    INT("--sample-len", sample_len, 1, 1 << 20, TEXT,
        .help = "characters per sample"),
    REAL("--temperature", temperature, 0, 100, 0, 0, TEXT,
         .help = "sampling temperature (0: greedy)"),
    INT("--top-k", top_k, 0, 256, TEXT,
        .help = "sample from the k likeliest characters (0 = all)"),
    STR("--sample-mode", sample_mode, TEXT, "cache|shift|recompute",
        .help = "KV cache (the recompute mode's text); shift: a cache\n"
                "that keeps the last ctx/2 tokens when full (other\n"
                "text past ctx, every token cheap); recompute: rerun\n"
                "the context for every token"),
    GROUP("This invocation"),
    STR("--resume", resume, CMD, "PATH",
        .help = "continue the run saved in a checkpoint: every setting\n"
                "comes back unless given again (e.g. more --steps)",
        .dflt = ""),
    INT("--profile-steps", profile_steps, 0, BIG, CMD,
        .help = "time N steps after the first by kernel family (GEMM,\n"
                "attention, layernorm, softmax-xent, optimizer, other\n"
                "kernels, the rest) and print the table (0 = off)"),
    FLAG("--allow-new-data", allow_new_data, CMD,
         .help = "with --resume: train on a text other than the\n"
                 "checkpoint's (its characters must be in the\n"
                 "vocabulary)"),
    STR("--rendezvous", rendezvous, CMD, "FILE",
        .help = "data parallel on the GPUs of one host without MPI:\n"
                "start one process per GPU with the same FILE (a\n"
                "fresh path; rank 0 writes NCCL's id there), its\n"
                "--rank and --world-size",
        .dflt = ""),
    INT("--rank", rank, 0, 1 << 20, CMD,
        .help = "with --rendezvous: this process's rank (its GPU is\n"
                "the rank modulo the GPU count)"),
    INT("--world-size", world_size, 1, 1 << 20, CMD,
        .help = "with --rendezvous: the number of processes",
        .dflt = ""),
    {.name = "--help", .kind = K_HELP, .scope = CMD,
     .help = "this text"},
    {.name = "--version", .kind = K_VERSION, .scope = CMD,
     .help = "the program's and the library's version"},
};
enum { NSPECS = sizeof SPECS / sizeof *SPECS };
_Static_assert(NSPECS <= sizeof(((opt_given *)0)->on),
               "opt_given is too small for the option table");

void opts_defaults(opts *o)
{
    memset(o, 0, sizeof *o);
    fg_gpt_config c; /* the model's shape: the library's defaults */
    fg_gpt_config_init(&c);
    o->sort_len = 8;
    o->sort_digits = 10;
    o->layers = c.n_layer;
    o->heads = c.n_head;
    o->width = c.n_embd;
    o->ctx = 0;    /* text: 64; sort: 2 * sort_len */
    o->steps = 0;  /* sort 800, text 2000 */
    o->batch = 0;  /* sort 64, text 32 */
    o->accum = 1;
    o->warmup = 100;
    o->lr = 3e-3;
    o->min_lr = -1; /* lr / 10 */
    o->wd = 0.1;
    o->beta2 = 0.95;
    o->clip = 1.0;
    o->seed = 1337;
    strcpy(o->device, "auto");
    strcpy(o->dtype, "auto");
    o->threads = 1;
    o->print_interval = 50;
    o->eval_interval = 100;
    o->eval_batches = 10;
    o->eval_examples = 1000;
    o->final_examples = 10000;
    o->target_acc = 0.999;
    o->ckpt_interval = 500;
    o->sample_interval = 500;
    o->samples = 2;
    o->sample_len = 300;
    o->temperature = 0.8;
    strcpy(o->sample_mode, "cache");
    o->peak_tflops = -1;
}

/* Shortest decimal that reads back as the same double. */
static const char *fmt_real(double v, char *buf, size_t n)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

static void *field(opts *o, const spec *s) { return (char *)o + s->off; }
static const void *cfield(const opts *o, const spec *s)
{
    return (const char *)o + s->off;
}

/* ---- --help ---------------------------------------------------------------- */

/* The help text, indented at col after its line breaks; returns the
 * length of its last line. */
static int print_help_text(FILE *f, const char *text, int col)
{
    int len = col;
    for (const char *p = text; *p; p++) {
        fputc(*p, f);
        len++;
        if (*p == '\n')
            len = fprintf(f, "%*s", col, "");
    }
    return len;
}

void opts_usage(FILE *f)
{
    opts d;
    opts_defaults(&d);
    fprintf(f,
"usage: flashgrad-train [options]\n"
"Trains a small GPT with flashgrad. Without --data: the built-in task (sort\n"
"a sequence of digits), reporting exact-match accuracy on held-out\n"
"sequences; with --data FILE: a character-level model of the text.\n");
    enum { COL = 26 };
    for (int i = 0; i < NSPECS; i++) {
        const spec *s = &SPECS[i];
        if (s->kind == K_GROUP) {
            fprintf(f, "\n%s:\n", s->help);
            continue;
        }
        char head[64];
        snprintf(head, sizeof head, "  %s%s%s", s->name, s->arg ? " " : "",
                 s->arg ? s->arg : "");
        fprintf(f, "%-*s", COL, head);
        if ((int)strlen(head) >= COL)
            fprintf(f, "\n%*s", COL, "");
        int len = print_help_text(f, s->help, COL);
        char buf[64], note[96];
        const char *dv = s->dflt;
        if (!dv && s->kind == K_INT)
            snprintf(buf, sizeof buf, "%lld",
                     (long long)*(const int64_t *)cfield(&d, s));
        if (!dv && s->kind == K_REAL)
            fmt_real(*(const double *)cfield(&d, s), buf, sizeof buf);
        if (!dv && s->kind == K_STR)
            snprintf(buf, sizeof buf, "%s", (const char *)cfield(&d, s));
        if (!dv && (s->kind == K_INT || s->kind == K_REAL || s->kind == K_STR))
            dv = buf;
        const char *mode = s->scope == SORT ? "sort task"
                         : s->scope == TEXT ? "text mode" : NULL;
        if (dv && dv[0])
            snprintf(note, sizeof note, " [%s%s%s]", dv, mode ? "; " : "",
                     mode ? mode : "");
        else if (mode)
            snprintf(note, sizeof note, " [%s]", mode);
        else
            note[0] = '\0';
        if (len + (int)strlen(note) > 79)
            fprintf(f, "\n%*s", COL - 1, "");
        fprintf(f, "%s\n", note);
    }
    fprintf(f,
"\nValues: whole numbers for N, decimals for X, both checked against the\n"
"option's range; --name=value works too. Brackets give the default and,\n"
"for options of one mode, the mode.\n"
"\nExit status:\n"
"  0    trained (sort task: final held-out accuracy >= 99%%)\n"
"  1    error while training (I/O, library error, non-finite loss)\n"
"  2    bad option, input or output path; nothing was trained\n"
"  3    sort task: final held-out accuracy below 99%%\n"
"  130  stopped by SIGINT (Ctrl-C), 143 by SIGTERM; a checkpoint was\n"
"       saved first (unless --ckpt none)\n");
}

/* ---- parsing ---------------------------------------------------------------- */

static FILE *msg_stream; /* NULL: stderr */

void opts_set_messages(FILE *f) { msg_stream = f; }

static FILE *msgs(void) { return msg_stream ? msg_stream : stderr; }

static const spec *find(const char *name, size_t len)
{
    for (int i = 0; i < NSPECS; i++)
        if (SPECS[i].name && strlen(SPECS[i].name) == len &&
            !strncmp(SPECS[i].name, name, len))
            return &SPECS[i];
    return NULL;
}

/* A bad value: the message, prefixed with its source (a checkpoint) when
 * it did not come from the command line. */
static int bad(const char *src, const char *fmt, ...) TR_PRINTF(2, 3);
static int bad(const char *src, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    FILE *f = msgs();
    fprintf(f, "flashgrad-train: %s%s", src ? src : "", src ? ": " : "");
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    va_end(ap);
    return EXIT_USAGE;
}

int parse_i64(const char *what, const char *s, int64_t lo, int64_t hi,
              int64_t *out)
{
    char *end;
    errno = 0;
    /* strtoll skips blanks and accepts "+": only digits with an optional
     * minus sign are a number here. */
    const long long v = (s[0] == '-' || isdigit((unsigned char)s[0]))
                            ? strtoll(s, &end, 10)
                            : (end = (char *)s, 0);
    if (end == s || *end)
        return bad(NULL, "%s: '%s' is not a whole number", what, s);
    if (errno == ERANGE || v < lo || v > hi)
        return bad(NULL, "%s: %s is out of range (%lld to %lld)", what, s,
                   (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

static int parse_real(const spec *sp, const char *s, double *out,
                      const char *src)
{
    char *end;
    errno = 0;
    const double v = (s[0] == '-' || s[0] == '.' ||
                      isdigit((unsigned char)s[0]))
                         ? strtod(s, &end)
                         : (end = (char *)s, 0);
    if (end == s || *end)
        return bad(src, "%s: '%s' is not a number", sp->name, s);
    char lo[32], hi[32];
    fmt_real(sp->lo, lo, sizeof lo);
    fmt_real(sp->hi, hi, sizeof hi);
    if (errno == ERANGE || !isfinite(v) || v < sp->lo || v > sp->hi ||
        (sp->lo_open && v == sp->lo) || (sp->hi_open && v == sp->hi)) {
        char range[80];
        snprintf(range, sizeof range, "%s%s, %s%s", sp->lo_open ? "(" : "[",
                 lo, hi, sp->hi_open ? ")" : "]");
        return bad(src, "%s: %s is out of range %s", sp->name, s, range);
    }
    *out = v;
    return 0;
}

/* value: NULL for a flag. */
static int set(opts *o, const spec *sp, const char *value, const char *src)
{
    void *p = field(o, sp);
    switch (sp->kind) {
    case K_FLAG:
        *(int64_t *)p = 1;
        return 0;
    case K_INT:
        if (src) { /* name the checkpoint in the message */
            char what[PATH_CAP + 64];
            snprintf(what, sizeof what, "%s: %s", src, sp->name);
            return parse_i64(what, value, sp->ilo, sp->ihi, p);
        }
        return parse_i64(sp->name, value, sp->ilo, sp->ihi, p);
    case K_REAL:
        return parse_real(sp, value, p, src);
    case K_STR:
        if (strlen(value) >= sp->size)
            return bad(src, "%s: value too long (%zu bytes at most)",
                       sp->name, sp->size - 1);
        if (!value[0] || strchr(value, '\n'))
            return bad(src, "%s: '%s' is empty or has a line break",
                       sp->name, value);
        if (strchr(sp->arg, '|')) { /* one of the listed words */
            const char *w = sp->arg;
            const size_t n = strlen(value);
            for (; w; w = strchr(w, '|') ? strchr(w, '|') + 1 : NULL)
                if (!strncmp(w, value, n) && (w[n] == '|' || !w[n]))
                    break;
            if (!w)
                return bad(src, "%s: '%s' is not one of %s", sp->name, value,
                           sp->arg);
        }
        strcpy(p, value);
        return 0;
    default:
        return bad(src, "%s cannot be set here", sp->name);
    }
}

int opts_parse_args(opts *o, int argc, char **argv, opt_given *given)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h"))
            a = "--help";
        if (strncmp(a, "--", 2) != 0)
            return bad(NULL, "unexpected argument '%s' (options start with "
                             "--; see --help)", a);
        const char *eq = strchr(a, '=');
        const size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const spec *sp = find(a, len);
        if (!sp)
            return bad(NULL, "unknown option %.*s (see --help)", (int)len, a);
        if (sp->kind == K_HELP)
            return OPTS_HELP;
        if (sp->kind == K_VERSION)
            return OPTS_VERSION;
        const char *v = NULL;
        if (sp->kind == K_FLAG && eq)
            return bad(NULL, "%s takes no value", sp->name);
        if (sp->kind != K_FLAG) {
            v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
            if (!v)
                return bad(NULL, "%s needs a value", sp->name);
            if (!eq && !strncmp(v, "--", 2) && find(v, strcspn(v, "=")))
                return bad(NULL, "%s needs a value (got the option %s)",
                           sp->name, v);
        }
        if (set(o, sp, v, NULL))
            return EXIT_USAGE;
        if (given)
            given->on[sp - SPECS] = 1;
    }
    return 0;
}

int opts_apply(opts *o, const char *name, const char *value, const char *src)
{
    if (!strcmp(name, "--peak-flops") && value) { /* older checkpoints */
        const spec *tf = find("--peak-tflops", 13);
        double v;
        if (parse_real(&(spec){.name = name, .hi = 1e30}, value, &v, src))
            return EXIT_USAGE;
        *(double *)field(o, tf) = v > 0 ? v / 1e12 : -1; /* 0 meant unset */
        return 0;
    }
    const spec *sp = find(name, strlen(name));
    if (!sp || sp->scope == CMD || sp->kind == K_GROUP)
        return bad(src, "unknown setting %s (written by a newer "
                        "flashgrad-train?)", name);
    if (sp->kind == K_FLAG && value && value[0])
        return bad(src, "%s takes no value", name);
    if (sp->kind != K_FLAG && !value)
        return bad(src, "%s has no value", name);
    return set(o, sp, value, src);
}

int opts_finish(opts *o, const opt_given *given)
{
    const int text = o->data[0] != 0, mode = text ? TEXT : SORT;
    for (int i = 0; given && i < NSPECS; i++) {
        const spec *sp = &SPECS[i];
        if (!given->on[i] || sp->scope & (mode | CMD))
            continue;
        if (sp == find("--ctx", 5) && o->ctx == 2 * o->sort_len)
            continue; /* the sort task's own context, said explicitly */
        return bad(NULL, "%s applies %s", sp->name,
                   text ? "to the sort task only (no --data)"
                        : "to text mode only (--data FILE)");
    }
    if (!text)
        o->ctx = 2 * o->sort_len;
    if (!o->ctx) {
        fg_gpt_config c;
        fg_gpt_config_init(&c);
        o->ctx = c.ctx;
    }
    if (!o->steps)
        o->steps = text ? 2000 : 800;
    if (!o->batch)
        o->batch = text ? 32 : 64;
    if (o->min_lr < 0)
        o->min_lr = o->lr / 10;
    if (o->min_lr > o->lr) {
        char a[32], b[32];
        return bad(NULL, "--min-lr %s is above --lr %s",
                   fmt_real(o->min_lr, a, sizeof a),
                   fmt_real(o->lr, b, sizeof b));
    }
    if (o->peak_tflops < 0 && o->peak_tflops != -1)
        return bad(NULL, "--peak-tflops: -1 (auto), 0 (off) or a peak");
    if (o->allow_new_data && !o->resume[0])
        return bad(NULL, "--allow-new-data goes with --resume");
    if (!o->rendezvous[0] != !o->world_size)
        return bad(NULL, "--rendezvous and --world-size go together");
    if (o->rank && !o->world_size)
        return bad(NULL, "--rank goes with --rendezvous and --world-size");
    if (o->world_size && o->rank >= o->world_size)
        return bad(NULL, "--rank %lld is not below --world-size %lld",
                   (long long)o->rank, (long long)o->world_size);
    return 0;
}

/* ---- writing ----------------------------------------------------------------- */

void opts_write(const opts *o, FILE *f, int wrap)
{
    const int mode = o->data[0] ? TEXT : SORT;
    int col = 0;
    for (int i = 0; i < NSPECS; i++) {
        const spec *sp = &SPECS[i];
        if (!(sp->scope & mode) || sp->scope & CMD)
            continue;
        const void *p = cfield(o, sp);
        char val[PATH_CAP];
        val[0] = 0;
        if (sp->kind == K_INT)
            snprintf(val, sizeof val, "%lld", (long long)*(const int64_t *)p);
        else if (sp->kind == K_REAL)
            fmt_real(*(const double *)p, val, sizeof val);
        else if (sp->kind == K_STR && !((const char *)p)[0])
            continue; /* unset path: derived */
        else if (sp->kind == K_STR)
            snprintf(val, sizeof val, "%s", (const char *)p);
        else if (sp->kind == K_FLAG && !*(const int64_t *)p)
            continue;
        const int n = (int)(strlen(sp->name) + (val[0] ? 1 + strlen(val) : 0));
        if (wrap <= 0) {
            fprintf(f, "%s%s%s\n", sp->name, val[0] ? " " : "", val);
            continue;
        }
        if (col && col + 1 + n > wrap) {
            fputc('\n', f);
            col = 0;
        }
        col += fprintf(f, "%s%s%s%s", col ? " " : "  ", sp->name,
                       val[0] ? " " : "", val);
    }
    if (wrap > 0 && col)
        fputc('\n', f);
}
