/* tools/train/run.h - the state of one training run, shared by the
 * trainer's files. */
#ifndef FG_TRAIN_RUN_H
#define FG_TRAIN_RUN_H

#include <flashgrad/flashgrad.h>

#include "options.h"

#define CHECK(expr)                                                       \
    do {                                                                  \
        if ((expr) != FG_OK) {                                            \
            fprintf(stderr, "flashgrad-train: %s\n", fg_last_error());    \
            return 1;                                                     \
        }                                                                 \
    } while (0)

typedef struct run {
    opts o;
    fg_sort_task task;
    fg_text_data text;
    int is_text;
    int64_t T;
    fg_gpt *m;
    fg_adamw *opt;
    fg_train_state st;
    int64_t *x, *y;
} run;

/* Saves the run's checkpoint (unless --ckpt none); 0 or 1 (printed). */
int run_save(run *r, const char *why);

#endif
