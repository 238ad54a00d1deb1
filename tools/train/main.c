/* tools/train/main.c - flashgrad-train: trains a small GPT with flashgrad.
 *
 *   flashgrad-train                      built-in task: sort digits
 *   flashgrad-train --data FILE          character-level language model
 *   flashgrad-train --help               every option
 *
 * Prints one progress line per interval, writes a CSV log (and a PNG loss
 * curve when gnuplot is installed), saves a checkpoint at the end and on
 * Ctrl-C, and resumes bit for bit from one (--resume). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flashgrad/flashgrad.h>

#include "options.h"
#include "report.h"
#include "run.h"
#include "signals.h"

/* Mean loss over the text split's fixed evaluation windows (no dropout). */
static int eval_loss(run *r, int split, double *out)
{
    const int64_t B = r->o.batch, T = r->T;
    uint64_t rng = r->o.seed * 31 + (uint64_t)split;
    double sum = 0;
    fg_no_grad_begin();
    for (int64_t i = 0; i < r->o.eval_batches; i++) {
        fg_tensor *loss = NULL;
        double l = 0;
        fg_status s = fg_text_data_batch(&r->text, split, &rng, B, T, r->x,
                                         r->y);
        if (s == FG_OK)
            s = fg_gpt_forward(r->m, r->x, B, T, r->y, NULL, NULL, &loss);
        if (s == FG_OK)
            s = fg_tensor_item(loss, &l);
        fg_tensor_free(loss);
        if (s != FG_OK) {
            fg_no_grad_end();
            fprintf(stderr, "flashgrad-train: %s\n", fg_last_error());
            return 1;
        }
        sum += l;
    }
    fg_no_grad_end();
    *out = sum / (double)r->o.eval_batches;
    return 0;
}

static int setup(run *r, int argc, char **argv)
{
    opts *o = &r->o;
    opts_defaults(o);
    if (opts_parse(o, argc - 1, argv + 1, 0) != 0)
        return 2;
    if (o->resume[0]) { /* the run's own options, then the command line's */
        char meta[2048];
        CHECK(fg_checkpoint_peek(o->resume, NULL, NULL, meta, sizeof meta));
        opts cmd = *o;
        opts_defaults(o);
        if (opts_parse_string(o, meta) != 0)
            return 2;
        opts_parse(o, argc - 1, argv + 1, 0); /* overrides, e.g. --steps */
        (void)cmd;
    }
    r->is_text = o->data[0] != 0;
    if (!o->steps)
        o->steps = r->is_text ? 2000 : 800;
    if (!o->batch)
        o->batch = r->is_text ? 32 : 64;
    if (o->min_lr < 0)
        o->min_lr = o->lr / 10;
    if (!o->ctx)
        o->ctx = r->is_text ? 64 : 2 * o->sort_len;
    if (o->steps <= 0 || o->batch <= 0 || o->accum < 1 || o->warmup < 0 ||
        o->eval_interval <= 0 || o->eval_examples <= 0 ||
        o->final_examples <= 0 || o->samples < 0 || o->sample_len <= 0 ||
        !(o->lr > 0) || !(o->dropout >= 0 && o->dropout < 1)) {
        fprintf(stderr, "flashgrad-train: counts must be positive, lr > 0, "
                        "dropout in [0, 1) (see --help)\n");
        return 2;
    }
    if (strchr(o->data, ' ')) {
        fprintf(stderr, "flashgrad-train: --data path must not contain "
                        "spaces (it is stored in checkpoints)\n");
        return 2;
    }
    return 0;
}

static fg_device pick_device(const char *name, int *ok)
{
    *ok = 1;
    if (!strcmp(name, "cpu"))
        return FG_DEVICE_CPU;
    if (!strcmp(name, "cuda"))
        return FG_DEVICE_CUDA;
    if (strcmp(name, "auto")) {
        *ok = 0;
        return FG_DEVICE_CPU;
    }
    /* auto: CUDA when a GPU is present and this build can train on it. */
    fg_tensor *t = NULL;
    if (fg_cuda_available() &&
        fg_tensor_empty(FG_FP32, FG_DEVICE_CUDA, FG_SHAPE(1), &t) == FG_OK) {
        fg_tensor_free(t);
        return FG_DEVICE_CUDA;
    }
    fg_clear_error();
    return FG_DEVICE_CPU;
}

int main(int argc, char **argv)
{
    run R = {0}, *r = &R;
    int rc = setup(r, argc, argv);
    if (rc)
        return rc;
    opts *o = &r->o;
    fg_set_num_threads(o->threads);
    fg_set_deterministic(o->deterministic);
    int dev_ok;
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.device = pick_device(o->device, &dev_ok);
    if (!strcmp(o->dtype, "auto"))
        strcpy(o->dtype, c.device == FG_DEVICE_CUDA ? "bf16" : "fp32");
    int bf16 = !strcmp(o->dtype, "bf16");
    if (!dev_ok || (strcmp(o->dtype, "fp32") && strcmp(o->dtype, "fp64") &&
                    !bf16) ||
        (bf16 && c.device != FG_DEVICE_CUDA)) {
        fprintf(stderr, "flashgrad-train: bad --device or --dtype (bf16 "
                        "needs cuda)\n");
        return 2;
    }
    c.dtype = strcmp(o->dtype, "fp64") ? FG_FP32 : FG_FP64;
    if (bf16) /* the whole run: parameters fp32, compute in bf16 */
        CHECK(fg_autocast_begin(FG_BF16));
    if (r->is_text) {
        CHECK(fg_text_data_load(o->data, &r->text));
        c.vocab = r->text.vocab;
        r->T = o->ctx;
    } else {
        r->task.len = o->sort_len;
        r->task.digits = o->sort_digits;
        c.vocab = fg_sort_task_vocab(&r->task);
        r->T = fg_sort_task_seqlen(&r->task);
        o->ctx = r->T;
    }
    c.ctx = o->ctx;
    c.n_layer = o->layers;
    c.n_head = o->heads;
    c.n_embd = o->width;
    c.dropout = o->dropout;
    CHECK(fg_gpt_create(&c, o->seed, &r->m));
    int n;
    const fg_param *ps = fg_gpt_params(r->m, &n);
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    oc.lr = o->lr;
    oc.weight_decay = o->wd;
    oc.beta2 = o->beta2;
    CHECK(fg_adamw_create(ps, n, &oc, &r->opt));
    fg_generator_init(&r->st.rng, o->seed ^ 0xD50F);
    r->st.data_rng = o->seed * 0x9E3779B97F4A7C15ull + 1;
    r->st.best_val = INFINITY;
    if (o->resume[0]) {
        CHECK(fg_checkpoint_load(o->resume, r->m, r->opt, &r->st));
        printf("resumed from %s at step %lld\n", o->resume,
               (long long)r->st.step);
    }
    const int64_t B = o->batch, T = r->T, rows = B * o->accum;
    r->x = malloc((size_t)(rows * T) * sizeof *r->x);
    r->y = malloc((size_t)(rows * T) * sizeof *r->y);
    fg_arena *arena;
    CHECK(fg_arena_create(0, &arena));
    if (!r->x || !r->y)
        return 1;
    char desc[2048];
    opts_describe(o, desc, sizeof desc);
    printf("flashgrad %s | %s | %s on %s, %s | %lld parameters\n",
           fg_version(),
           r->is_text ? o->data : "task: sort digits",
           r->is_text ? "char LM" : "exact match on held-out sequences",
           fg_device_name(c.device), bf16 ? "bf16 autocast, fp32 params"
                                          : fg_dtype_name(c.dtype),
           (long long)fg_gpt_num_params(r->m));
    printf("config: %s\n", desc);
    FILE *csv = NULL;
    if (strcmp(o->log, "none")) {
        csv = fopen(o->log, r->st.step ? "a" : "w");
        if (!csv) {
            fprintf(stderr, "flashgrad-train: cannot write %s\n", o->log);
            return 1;
        }
        if (!r->st.step)
            fprintf(csv, "step,loss,val_loss,accuracy,grad_norm,lr,"
                         "ms_per_step,tokens_per_s,elapsed_s\n");
    }
    signals_install();
    fg_lr_schedule sched = {o->lr, o->min_lr, o->warmup, o->steps};
    const double t0 = now();
    double t_int = t0, loss_sum = 0, gn = 0, lr = 0, acc = -1, val = NAN;
    int64_t int_steps = 0, start = r->st.step;
    int stop = 0;
    while (r->st.step < o->steps && !stop) {
        if (interrupted) {
            printf("\ninterrupted at step %lld\n", (long long)r->st.step);
            run_save(r, "Ctrl-C");
            if (csv)
                fclose(csv);
            return 130;
        }
        if (r->is_text)
            CHECK(fg_text_data_batch(&r->text, 0, &r->st.data_rng, rows, T,
                                     r->x, r->y));
        else
            CHECK(fg_sort_task_batch(&r->task, 0, &r->st.data_rng, rows,
                                     r->x, r->y));
        lr = fg_lr_at(&sched, r->st.step);
        fg_step_stats ss;
        CHECK(fg_gpt_train_step(r->m, r->opt, r->x, r->y, B, T,
                                (int)o->accum, o->clip, lr, &r->st.rng,
                                arena, &ss));
        r->st.step++;
        loss_sum += ss.loss;
        gn = ss.grad_norm;
        int_steps++;
        if (!isfinite(ss.loss)) {
            fprintf(stderr, "flashgrad-train: loss is %g at step %lld\n",
                    ss.loss, (long long)r->st.step);
            return 1;
        }
        if (r->st.step % o->eval_interval && r->st.step != o->steps)
            continue;
        const double t1 = now(), ms = (t1 - t_int) * 1e3 / int_steps;
        char extra[96] = "", eta[32];
        if (r->is_text) {
            if (eval_loss(r, 1, &val))
                return 1;
            snprintf(extra, sizeof extra, " | val %.4f", val);
        } else {
            CHECK(fg_sort_task_accuracy(r->m, &r->task, o->eval_examples,
                                        o->seed + 1000, &acc));
            snprintf(extra, sizeof extra, " | held-out acc %5.1f%%",
                     100 * acc);
            stop = acc >= o->target_acc;
        }
        const double tps = (double)(rows * T) / (ms / 1e3);
        printf("step %5lld/%lld | loss %.4f%s | gnorm %.3f | lr %.2e | "
               "%.1f ms/step | %.0f tok/s | ETA %s\n",
               (long long)r->st.step, (long long)o->steps,
               loss_sum / int_steps, extra, gn, lr, ms, tps,
               hms((double)(o->steps - r->st.step) * ms / 1e3, eta));
        fflush(stdout);
        if (csv) {
            fprintf(csv, "%lld,%.6f,", (long long)r->st.step,
                    loss_sum / int_steps);
            if (r->is_text)
                fprintf(csv, "%.6f,", val);
            else
                fprintf(csv, ",");
            if (acc >= 0)
                fprintf(csv, "%.6f", acc);
            fprintf(csv, ",%.6f,%.6e,%.3f,%.1f,%.2f\n", gn, lr, ms, tps,
                    now() - t0);
            fflush(csv);
        }
        loss_sum = 0;
        int_steps = 0;
        t_int = now();
    }
    const double wall = now() - t0;
    char w[32];
    if (stop)
        printf("target accuracy %.1f%% reached at step %lld\n",
               100 * o->target_acc, (long long)r->st.step);
    printf("trained %lld steps in %s (%.1f s)\n",
           (long long)(r->st.step - start), hms(wall, w), wall);
    if (csv)
        fclose(csv);
    int ret = 0;
    if (r->is_text) {
        double tr;
        if (eval_loss(r, 0, &tr) || eval_loss(r, 1, &val))
            return 1;
        printf("final: train loss %.4f | val loss %.4f\n", tr, val);
        fg_sample_options so;
        fg_sample_options_init(&so);
        so.temperature = o->temperature;
        so.top_k = o->top_k;
        int64_t *tok = malloc((size_t)(o->sample_len + 1) * sizeof *tok);
        for (int i = 0; tok && i < o->samples; i++) {
            so.seed = o->seed + (uint64_t)i;
            tok[0] = r->text.stoi['\n'] >= 0 ? r->text.stoi['\n'] : 0;
            CHECK(fg_gpt_sample(r->m, tok, 1, o->sample_len, &so));
            printf("---- sample %d (temperature %.2f, top-k %d) ----\n",
                   i + 1, o->temperature, o->top_k);
            for (int j = 1; j <= o->sample_len; j++)
                putchar(r->text.itos[tok[j]]);
            printf("\n");
        }
        free(tok);
        fg_text_data_release(&r->text);
    } else {
        CHECK(fg_sort_task_accuracy(r->m, &r->task, o->final_examples,
                                    o->seed + 2000, &acc));
        printf("held-out exact-match accuracy: %.2f%% (%lld sequences never "
               "seen in training)\n",
               100 * acc, (long long)o->final_examples);
        ret = acc >= 0.99 ? 0 : 3;
    }
    if (run_save(r, "final"))
        ret = 1;
    report_plot(o);
    fg_arena_free(arena);
    fg_adamw_free(r->opt);
    fg_gpt_free(r->m);
    free(r->x);
    free(r->y);
    return ret;
}
