/* tools/train/run_ckpt.c - the trainer's checkpoints. */
#include <stdio.h>
#include <string.h>

#include "run.h"

int run_save(run *r, const char *why)
{
    if (!strcmp(r->o.ckpt, "none"))
        return 0;
    char meta[2048];
    opts_describe(&r->o, meta, sizeof meta);
    if (fg_checkpoint_save(r->o.ckpt, r->m, r->opt, &r->st, meta) != FG_OK) {
        fprintf(stderr, "flashgrad-train: %s\n", fg_last_error());
        return 1;
    }
    printf("checkpoint (%s): %s at step %lld\n", why, r->o.ckpt,
           (long long)r->st.step);
    return 0;
}

