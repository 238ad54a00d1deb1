/* SPDX-License-Identifier: MIT */
/* tools/train/data.h - what the trainer learns from: the built-in sort task
 * or a text file, with the checks that keep a bad input from reaching
 * step 1, and the text's fingerprint kept in checkpoints. */
#ifndef FG_TRAIN_DATA_H
#define FG_TRAIN_DATA_H

#include <flashgrad/flashgrad.h>

#include "options.h"

typedef struct dataset {
    int text;            /* 0: the sort task */
    fg_sort_task task;
    fg_text_data td;     /* text: ids use the vocabulary td.itos */
    int64_t T, vocab;    /* sequence length, vocabulary size */
    int64_t nbytes;      /* text: file size and FNV-1a of its bytes */
    uint64_t fnv;
} dataset;

/* Loads and checks the data of o (text: really text unless --bytes, both
 * splits long enough for --ctx); 0 or EXIT_USAGE/EXIT_FAIL (printed). */
int data_open(dataset *d, const opts *o);
void data_release(dataset *d);

/* Re-encodes the text with a checkpoint's vocabulary (vocab bytes in
 * itos[0..n-1]): 0, or EXIT_USAGE when the text has a character the
 * vocabulary lacks (printed). */
int data_use_vocab(dataset *d, const unsigned char *itos, int n,
                   const char *ckpt);

/* rows sequences of split (0 train, 1 validation/held out). */
fg_status data_batch(const dataset *d, int split, uint64_t *rng,
                     int64_t rows, int64_t *x, int64_t *y);

#endif
