/* tools/train/options.h - flashgrad-train's settings: defaults, parsing,
 * help, and the string kept in checkpoints. */
#ifndef FG_TRAIN_OPTIONS_H
#define FG_TRAIN_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

typedef struct opts {
    char data[1024];   /* text file; empty: the sort task */
    int sort_len, sort_digits;
    int64_t layers, heads, width, ctx;
    int64_t batch, accum, steps, warmup;
    double lr, min_lr, wd, clip, dropout, beta2;
    int deterministic;
    uint64_t seed;
    char device[8], dtype[8];
    int64_t eval_interval, eval_examples, final_examples, eval_batches;
    double target_acc;
    char ckpt[1024], resume[1024], log[1024], plot[1024];
    int samples, sample_len, top_k;
    int threads;
    double temperature;
} opts;

void opts_defaults(opts *o);
void opts_usage(FILE *f);
int opts_parse(opts *o, int argc, char **argv, int from_ckpt);
void opts_describe(const opts *o, char *buf, size_t n);
int opts_parse_string(opts *o, char *s);

#endif
