/* SPDX-License-Identifier: MIT */
/* tools/train/options.h - flashgrad-train's settings: one table gives the
 * parser, the help text, the config print and the lines kept in
 * checkpoints, so the four cannot drift apart. */
#ifndef FG_TRAIN_OPTIONS_H
#define FG_TRAIN_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

enum { PATH_CAP = 4096 };

/* Exit statuses (--help lists them; 130 and 143 come from the signal). */
enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,     /* error while training: I/O, library, divergence */
    EXIT_USAGE = 2,    /* bad option, input or output path: nothing trained */
    EXIT_ACCURACY = 3  /* sort task: final accuracy below 99% */
};

typedef struct opts {
    /* data */
    char data[PATH_CAP]; /* text file; "": the sort task */
    int64_t bytes;       /* read --data as raw bytes, text or not */
    int64_t sort_len, sort_digits;
    /* model */
    int64_t layers, heads, width, ctx;
    double dropout;
    int64_t window, alibi; /* attention variants (0 = off) */
    double softcap;
    /* optimisation */
    int64_t steps, batch, accum, warmup, seed;
    double lr, min_lr, wd, beta2, clip;
    double loss_scale; /* first loss scale (0: 2^16 with fp16, else none) */
    /* machine */
    char device[8], dtype[8];
    int64_t threads, deterministic, gemm_autotune, zero1;
    double bucket_mb; /* data parallel: all-reduce bucket MiB (0: the library's) */
    /* progress and evaluation */
    int64_t print_interval, eval_interval, eval_batches, eval_examples,
        final_examples;
    double target_acc, peak_tflops; /* -1: auto */
    /* outputs ("" paths: derived from out_dir) */
    char out_dir[PATH_CAP], ckpt[PATH_CAP], log[PATH_CAP], plot[PATH_CAP];
    int64_t ckpt_interval, sample_interval, samples, sample_len, top_k;
    double temperature;
    char sample_mode[12]; /* cache|shift|recompute */
    /* this invocation only, never kept in checkpoints */
    char resume[PATH_CAP];
    int64_t allow_new_data;
    int64_t profile_steps; /* 0: no profile */
    /* several GPU processes without MPI (dist.c): "" = not used */
    char rendezvous[PATH_CAP];
    int64_t rank, world_size; /* world_size 0: not given */
} opts;

/* Which options a command line gave (index into the option table). */
typedef struct opt_given {
    unsigned char on[64];
} opt_given;

void opts_defaults(opts *o);
void opts_usage(FILE *f);

/* opts_parse_args found --help (or -h) or --version: the caller prints
 * the text (opts_usage, the version line) and exits with EXIT_OK. */
enum { OPTS_HELP = -1, OPTS_VERSION = -2 };

/* The command line (argv without the program name) on top of *o.
 * Returns 0, EXIT_USAGE (message printed) or OPTS_HELP / OPTS_VERSION;
 * prints nothing else and never exits, so a fuzzer can call it. given may
 * be NULL. */
int opts_parse_args(opts *o, int argc, char **argv, opt_given *given);

/* Where the parser's messages ("flashgrad-train: ...\n", one per
 * rejection) go: stderr by default (f = NULL). Not thread-safe. */
void opts_set_messages(FILE *f);

/* One run setting from a checkpoint's lines (`src` names the file in
 * messages); 0 or EXIT_USAGE. */
int opts_apply(opts *o, const char *name, const char *value,
               const char *src);

/* Fills the defaults that depend on the mode (sort or text) and checks
 * the settings against each other; 0 or EXIT_USAGE (printed). */
int opts_finish(opts *o, const opt_given *given);

/* Every run setting of the mode as "--name value" lines (the config file
 * and checkpoints); with wrap > 0, as a command line wrapped at that
 * width and indented (the config print). */
void opts_write(const opts *o, FILE *f, int wrap);

/* Strict numbers: the whole string, in range; 0 or EXIT_USAGE with a
 * message naming `what`. */
int parse_i64(const char *what, const char *s, int64_t lo, int64_t hi,
              int64_t *out);

#endif
