/* tools/train/options.c - flashgrad-train's options. */
#include <stdlib.h>
#include <string.h>

#include "options.h"

void opts_defaults(opts *o)
{
    memset(o, 0, sizeof *o);
    o->sort_len = 8;
    o->sort_digits = 10;
    o->layers = 2;
    o->heads = 4;
    o->width = 64;
    o->ctx = 0; /* sort: 2 * len; text: 64 */
    o->batch = 0; /* sort: 64; text: 32 */
    o->accum = 1;
    o->steps = 0; /* sort: 1500; text: 2000 */
    o->warmup = 100;
    o->lr = 3e-3;
    o->min_lr = -1; /* lr / 10 */
    o->wd = 0.1;
    o->beta2 = 0.95;
    o->clip = 1.0;
    o->dropout = 0;
    o->seed = 1337;
    strcpy(o->device, "auto");
    strcpy(o->dtype, "auto");
    o->eval_interval = 100;
    o->eval_examples = 1000;
    o->final_examples = 10000;
    o->eval_batches = 10;
    o->target_acc = 0.999;
    strcpy(o->ckpt, "flashgrad-train.ckpt");
    strcpy(o->log, "flashgrad-train.csv");
    strcpy(o->plot, "flashgrad-train.png");
    o->samples = 2;
    o->sample_len = 300;
    o->top_k = 0;
    o->temperature = 0.8;
    o->threads = 1;
}

void opts_usage(FILE *f)
{
    fprintf(f,
"usage: flashgrad-train [options]\n"
"Trains a small GPT. Without --data: the built-in task (sort a sequence of\n"
"digits), reporting exact-match accuracy on held-out sequences.\n"
"  --data FILE          character-level model of a text file (90/10 split)\n"
"  --sort-len N         digits per sequence (default 8)\n"
"  --sort-digits N      distinct digits (default 10)\n"
"  --layers N --heads N --width N      model size (2, 4, 64)\n"
"  --ctx N              context (text; default 64)\n"
"  --batch N            sequences per micro-batch (sort 64, text 32)\n"
"  --accum N            micro-batches per step (1)\n"
"  --steps N            optimizer steps (sort 800, text 2000)\n"
"  --lr X --min-lr X --warmup N        warmup + cosine schedule\n"
"                       (lr 3e-3, min-lr lr/10, warmup 100)\n"
"  --wd X               AdamW weight decay (0.1)\n"
"  --clip X             gradient clipping by global norm (1.0; 0 = off)\n"
"  --dropout X          dropout (0)\n"
"  --seed N             seed of init, data and dropout (1337)\n"
"  --device cpu|cuda|auto   (auto: cuda when a GPU is usable, else cpu)\n"
"  --dtype auto|fp32|fp64|bf16  bf16: fp32 parameters, bf16 matrix\n"
"                       products and attention (CUDA; like torch.autocast);\n"
"                       auto: bf16 on cuda, fp32 on cpu\n"
"  --beta2 X            AdamW beta2 (0.95)\n"
"  --deterministic 0|1  bitwise-reproducible CUDA steps (attention dQ\n"
"                       without atomics; the CPU always is) (0)\n"
"  --threads N          CPU threads (1: toy models are too small to gain\n"
"                       from more; 0 = OpenMP default)\n"
"  --eval-interval N    steps between progress lines/evaluations (100)\n"
"  --eval-examples N    held-out sequences per evaluation (sort, 1000)\n"
"  --final-examples N   held-out sequences for the final accuracy (10000)\n"
"  --target-acc X       stop once an evaluation reaches it (sort, 0.999)\n"
"  --ckpt PATH          checkpoint written at the end and on Ctrl-C\n"
"                       (flashgrad-train.ckpt; 'none' to skip)\n"
"  --resume PATH        continue a run from its checkpoint\n"
"  --log PATH           CSV log (flashgrad-train.csv)\n"
"  --plot PATH          loss curve PNG via gnuplot (flashgrad-train.png;\n"
"                       'none' to skip)\n"
"  --samples N --sample-len N --temperature X --top-k N   text samples\n");
}

/* ---- option parsing (also used for the options saved in checkpoints) --- */

int opts_parse(opts *o, int argc, char **argv, int from_ckpt)
{
    for (int i = 0; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) {
            opts_usage(stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "flashgrad-train: %s needs a value\n", k);
            return -1;
        }
        i++;
#define S(name, field)                                                    \
        if (!strcmp(k, name)) {                                           \
            snprintf(o->field, sizeof o->field, "%s", v);                 \
            continue;                                                     \
        }
#define I(name, field)                                                    \
        if (!strcmp(k, name)) {                                           \
            o->field = strtoll(v, NULL, 10);                              \
            continue;                                                     \
        }
#define D(name, field)                                                    \
        if (!strcmp(k, name)) {                                           \
            o->field = strtod(v, NULL);                                   \
            continue;                                                     \
        }
        S("--data", data) I("--sort-len", sort_len)
        I("--sort-digits", sort_digits) I("--layers", layers)
        I("--heads", heads) I("--width", width) I("--ctx", ctx)
        I("--batch", batch) I("--accum", accum) I("--steps", steps)
        I("--warmup", warmup) D("--lr", lr) D("--min-lr", min_lr)
        D("--wd", wd) D("--clip", clip) D("--dropout", dropout)
        I("--seed", seed) S("--device", device) S("--dtype", dtype)
        I("--eval-interval", eval_interval)
        I("--eval-examples", eval_examples)
        I("--final-examples", final_examples)
        D("--target-acc", target_acc) I("--samples", samples)
        I("--sample-len", sample_len) D("--temperature", temperature)
        I("--top-k", top_k) I("--threads", threads)
        D("--beta2", beta2) I("--deterministic", deterministic)
        if (!from_ckpt) {
            S("--ckpt", ckpt) S("--resume", resume) S("--log", log)
            S("--plot", plot)
        }
#undef S
#undef I
#undef D
        fprintf(stderr, "flashgrad-train: unknown option %s (see --help)\n",
                k);
        return -1;
    }
    return 0;
}

/* The options that define a run, as a string stored in the checkpoint. */
void opts_describe(const opts *o, char *buf, size_t n)
{
    snprintf(buf, n,
             "--data %s --sort-len %d --sort-digits %d --layers %lld "
             "--heads %lld --width %lld --ctx %lld --batch %lld --accum %lld "
             "--steps %lld --warmup %lld --lr %.17g --min-lr %.17g --wd %.17g "
             "--clip %.17g --dropout %.17g --seed %llu --dtype %s --beta2 %.17g "
             "--deterministic %d",
             o->data[0] ? o->data : "-", o->sort_len, o->sort_digits,
             (long long)o->layers, (long long)o->heads, (long long)o->width,
             (long long)o->ctx, (long long)o->batch, (long long)o->accum,
             (long long)o->steps, (long long)o->warmup, o->lr, o->min_lr,
             o->wd, o->clip, o->dropout, (unsigned long long)o->seed,
             o->dtype, o->beta2, o->deterministic);
}

int opts_parse_string(opts *o, char *s)
{
    char *argv[64];
    int argc = 0;
    for (char *t = strtok(s, " "); t && argc < 64; t = strtok(NULL, " "))
        argv[argc++] = t;
    if (opts_parse(o, argc, argv, 1) != 0)
        return -1;
    if (!strcmp(o->data, "-"))
        o->data[0] = 0;
    return 0;
}

