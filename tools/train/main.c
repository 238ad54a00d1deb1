/* SPDX-License-Identifier: MIT */
/* tools/train/main.c - flashgrad-train: trains a small GPT with flashgrad.
 *
 *   flashgrad-train                      built-in task: sort digits
 *   flashgrad-train --data FILE          character-level language model
 *   flashgrad-train --resume DIR/last.ckpt   continue a run
 *   flashgrad-train --help               every option
 *
 * Everything that can be checked is checked before step 1 (options, data,
 * device, output paths); then the loop prints progress lines, evaluates,
 * keeps last.ckpt and best.ckpt in the run's folder, and on SIGINT or
 * SIGTERM saves and dies of the signal. doc/training.md has the details. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <flashgrad/flashgrad.h>

#include "run.h"
#include "signals.h"
#include "util.h"

int lib_error(int code)
{
    /* Out of memory (the GPU's, mostly) is the one library error a user
     * fixes with an option: say which. */
    if (fg_last_status() == FG_ERR_OUT_OF_MEMORY)
        return complain(code, "%s (memory ran out: a smaller --batch, with a larger --accum to "
                        "keep the tokens a step, or a smaller model needs less)", fg_last_error());
    return complain(code, "%s", fg_last_error());
}

/* Setup failures of the library are the settings' fault when it says the
 * arguments are invalid: nothing was trained. */
static int setup_error(void)
{
    return lib_error(fg_last_status() == FG_ERR_INVALID_ARGUMENT ? EXIT_USAGE
                                                                 : EXIT_FAIL);
}

/* ---- before step 1 ---------------------------------------------------------- */

/* The settings: the command line, on top of the resumed run's. */
static int read_settings(run *r, int argc, char **argv)
{
    opt_given given;
    memset(&given, 0, sizeof given);
    opts_defaults(&r->o);
    int rc = opts_parse_args(&r->o, argc - 1, argv + 1, &given);
    if (rc == OPTS_HELP)
        opts_usage(stdout);
    else if (rc == OPTS_VERSION)
        printf("flashgrad-train (flashgrad %s)\n", fg_version());
    if (rc < 0)
        return -1; /* main: EXIT_OK */
    if (rc || !r->o.resume[0])
        return rc ? rc : opts_finish(&r->o, &given);
    char resume[PATH_CAP];
    snprintf(resume, sizeof resume, "%s", r->o.resume);
    if ((rc = ckpt_read_run(r, resume)))
        return rc;
    memset(&given, 0, sizeof given);
    opts_parse_args(&r->o, argc - 1, argv + 1, &given); /* checked above */
    if (!r->o.data[0] != !r->from.data[0])
        return complain(EXIT_USAGE, "%s is a %s run: --data cannot change "
                        "that", resume, r->from.data[0] ? "text"
                                                        : "sort-task");
    return opts_finish(&r->o, &given);
}

static int pick_device(run *r)
{
    const char *name = r->o.device;
    r->dev = FG_DEVICE_CPU;
    if (!strcmp(name, "cpu"))
        return 0;
    if (fg_cuda_available()) {
        /* A GPU is there; can this build put a tensor on it? */
        fg_tensor *t = NULL;
        if (fg_tensor_empty(FG_FP32, FG_DEVICE_CUDA, FG_SHAPE(1), &t) ==
            FG_OK) {
            fg_tensor_free(t);
            r->dev = FG_DEVICE_CUDA;
            return 0;
        }
        if (!strcmp(name, "cuda"))
            return complain(EXIT_USAGE, "--device cuda: the GPU is not "
                            "usable (%s)", fg_last_error());
    } else if (!strcmp(name, "cuda")) {
        /* A build without CUDA says so through any CUDA call. */
        const int built = fg_cuda_synchronize() != FG_ERR_UNSUPPORTED;
        return complain(EXIT_USAGE, "--device cuda: no CUDA device (%s)",
                        built ? "no GPU or no driver found"
                              : "this flashgrad was built without CUDA");
    }
    fg_clear_error();
    return 0;
}

/* Text resumed: the same text, or (--allow-new-data) one the vocabulary
 * covers. */
static int check_resumed_data(run *r)
{
    const run_origin *g = &r->from;
    if (!r->d.text)
        return 0;
    if (!g->has_fingerprint) {
        printf("note: %s keeps no fingerprint of its text (an older "
               "flashgrad-train wrote it): the data is not checked\n",
               r->o.resume);
        return 0;
    }
    if ((g->fnv != r->d.fnv || g->nbytes != r->d.nbytes) &&
        !r->o.allow_new_data)
        return complain(EXIT_USAGE, "%s is not the text %s was trained on "
                        "(%lld bytes, FNV-1a %016llx; it was %s, %lld bytes, "
                        "%016llx); --allow-new-data trains on it anyway",
                        r->o.data, r->o.resume, (long long)r->d.nbytes,
                        (unsigned long long)r->d.fnv, g->data,
                        (long long)g->nbytes, (unsigned long long)g->fnv);
    return data_use_vocab(&r->d, g->vocab, g->n_vocab, r->o.resume);
}

static int build_model(run *r)
{
    opts *o = &r->o;
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.device = r->dev;
    c.dtype = !strcmp(o->dtype, "fp64") ? FG_FP64 : FG_FP32;
    c.vocab = r->d.vocab;
    c.ctx = r->d.T;
    c.n_layer = o->layers;
    c.n_head = o->heads;
    c.n_embd = o->width;
    c.dropout = o->dropout;
    c.attn_window = o->window;
    c.attn_softcap = o->softcap;
    c.alibi = (int)o->alibi;
    if (fg_gpt_create(&c, (uint64_t)o->seed, &r->m) != FG_OK)
        return setup_error();
    int n;
    const fg_param *ps = fg_gpt_params(r->m, &n);
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    oc.lr = o->lr;
    oc.weight_decay = o->wd;
    oc.beta2 = o->beta2;
    if (r->world > 1) {
        const int rc = dist_create(r, &oc);
        if (rc)
            return rc;
    } else if (fg_adamw_create(ps, n, &oc, &r->opt) != FG_OK) {
        return setup_error();
    }
    fg_generator_init(&r->st.rng, (uint64_t)o->seed ^ 0xD50F);
    r->st.data_rng = (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + 1;
    r->st.best_val = INFINITY;
    if (o->resume[0] &&
        (r->dp ? fg_dp_checkpoint_load(r->dp, o->resume, r->m, &r->st)
               : fg_checkpoint_load(o->resume, r->m, r->opt, &r->st)) != FG_OK)
        return complain(EXIT_USAGE, "--resume: %s", fg_last_error());
    /* Under mpirun the batch holds every rank's rows. */
    const int64_t rows = o->batch * o->accum * r->world, T = r->d.T;
    r->x = malloc((size_t)(rows * T) * sizeof *r->x);
    r->y = malloc((size_t)(rows * T) * sizeof *r->y);
    if (!r->x || !r->y)
        return complain(EXIT_USAGE, "out of memory for a batch of %lld x "
                        "%lld tokens", (long long)rows, (long long)T);
    if (fg_arena_create(0, &r->arena) != FG_OK)
        return lib_error(EXIT_FAIL);
    /* Training FLOPs per token (forward + backward), as in PaLM, nanoGPT
     * and llm.c: 6 per parameter, plus the attention scores and their
     * weighted sum, 12 * layers * width * T (the causal mask's skipped
     * half is counted, so the numbers compare with theirs). */
    r->flops_per_token = 6.0 * (double)fg_gpt_num_params(r->m) +
                         12.0 * (double)(o->layers * o->width * T);
    /* The MFU's divisor: given, or the dense peak of the GPU the trainer
     * is tuned on (the library cannot name the GPU; doc/training.md). */
    const int cuda = r->dev == FG_DEVICE_CUDA;
    if (o->peak_tflops >= 0)
        r->peak_flops = o->peak_tflops * 1e12;
    else
        r->peak_flops = !cuda ? 0 : r->amp ? 989e12 : 67e12;
    return 0;
}

/* The run's folder: given, kept by the resumed run, or a new
 * runs/YYYYmmdd-HHMMSS (-2, -3... when taken). */
static int make_out_dir(run *r)
{
    opts *o = &r->o;
    char dir[PATH_CAP];
    if (!o->out_dir[0]) {
        char stamp[64];
        const time_t t = time(NULL);
        strftime(stamp, sizeof stamp, "runs/%Y%m%d-%H%M%S", localtime(&t));
        if (mkdir_p("runs"))
            return complain(EXIT_USAGE, "cannot create runs/: %s",
                            strerror(errno));
        for (int i = 1;; i++) {
            snprintf(dir, sizeof dir, i > 1 ? "%s-%d" : "%s", stamp, i);
            if (mkdir(dir, 0777) == 0)
                break;
            if (errno != EEXIST || i > 1000)
                return complain(EXIT_USAGE, "cannot create %s: %s", dir,
                                strerror(errno));
        }
    } else {
        const int e = mkdir_p(o->out_dir);
        if (e)
            return complain(EXIT_USAGE, "--out-dir %s: %s", o->out_dir,
                            strerror(e));
        snprintf(dir, sizeof dir, "%s", o->out_dir);
    }
    if (path_abs(dir, o->out_dir, sizeof o->out_dir))
        return complain(EXIT_USAGE, "--out-dir: path too long");
    snprintf(r->out, sizeof r->out, "%s", o->out_dir);
    char cfg[PATH_CAP];
    path_join(r->out, "config", cfg, sizeof cfg);
    char last[PATH_CAP];
    path_join(r->out, "last.ckpt", last, sizeof last);
    if (!o->resume[0] && access(cfg, F_OK) == 0 && access(last, F_OK) != 0)
        return complain(EXIT_USAGE, "%s already holds a run (%s) that left "
                        "no last.ckpt to resume from: remove the folder or "
                        "choose another --out-dir", r->out, cfg);
    if (!o->resume[0] && access(cfg, F_OK) == 0)
        return complain(EXIT_USAGE, "%s already holds a run (%s): continue "
                        "it with --resume %s/last.ckpt, or choose another "
                        "--out-dir", r->out, cfg, r->out);
    return 0;
}

/* out: the given path made absolute, "" for 'none', or DIR/name. */
static int output_path(run *r, char *setting, const char *name, char *out)
{
    if (!strcmp(setting, "none")) {
        out[0] = 0;
        return 0;
    }
    if (setting[0] ? path_abs(setting, out, PATH_CAP)
                   : path_join(r->out, name, out, PATH_CAP))
        return complain(EXIT_USAGE, "path too long: %s", setting);
    if (setting[0])
        strcpy(setting, out); /* kept absolute for --resume elsewhere */
    return 0;
}

/* The run's arithmetic as the config file and the header name it. */
static const char *precision(const run *r)
{
    if (r->amp)
        return r->amp_dt == FG_FP16 ? "fp16 autocast" : "bf16 autocast";
    return strcmp(r->o.dtype, "auto") ? r->o.dtype : "fp32";
}

static int write_config(run *r)
{
    FILE *f = fopen(r->config, "w");
    if (!f)
        return complain(EXIT_USAGE, "%s: %s", r->config, strerror(errno));
    fprintf(f, "# flashgrad-train (flashgrad %s): this run's settings, one "
               "option per line\n# device %s, %s, %lld parameters\n",
            fg_version(), fg_device_name(r->dev), precision(r),
            (long long)fg_gpt_num_params(r->m));
    opts_write(&r->o, f, 0);
    if (fclose(f) != 0)
        return complain(EXIT_USAGE, "%s: %s", r->config, strerror(errno));
    return 0;
}

/* Two outputs on one file would overwrite each other (--log DIR/config,
 * --ckpt DIR/best.ckpt, ...): the same path, or names of one file. */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return !strcmp(a, b) || (stat(a, &sa) == 0 && stat(b, &sb) == 0 &&
                             sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
}

static int distinct_outputs(const run *r)
{
    const char *path[] = {r->config, r->ckpt, r->best, r->log, r->plot,
                          r->samples};
    const char *what[] = {"the run's config", "--ckpt", "the best checkpoint",
                          "--log", "--plot", "the samples"};
    for (int i = 0; i < 6; i++)
        for (int j = i + 1; j < 6; j++)
            if (path[i][0] && path[j][0] && same_file(path[i], path[j]))
                return complain(EXIT_USAGE, "%s and %s would both be %s",
                                what[i], what[j], path[i]);
    return 0;
}

static int open_outputs(run *r)
{
    opts *o = &r->o;
    int rc;
    if (r->rank > 0) { /* rank 0 writes; the others only join its saves */
        if (strcmp(o->ckpt, "none")) {
            snprintf(r->ckpt, sizeof r->ckpt, "(rank 0)");
            snprintf(r->best, sizeof r->best, "(rank 0)");
        }
        return 0;
    }
    if ((rc = make_out_dir(r)) ||
        (rc = output_path(r, o->ckpt, "last.ckpt", r->ckpt)) ||
        (rc = output_path(r, o->log, "log.csv", r->log)) ||
        (rc = output_path(r, o->plot, "loss.png", r->plot)))
        return rc;
    if (!r->log[0])
        r->plot[0] = 0; /* the plot is drawn from the log */
    path_join(r->out, "config", r->config, sizeof r->config);
    if (r->ckpt[0])
        path_join(r->out, "best.ckpt", r->best, sizeof r->best);
    if (r->d.text)
        path_join(r->out, "samples.txt", r->samples, sizeof r->samples);
    if ((rc = distinct_outputs(r)))
        return rc;
    /* Every path is tried now, not after hours of training. */
    if ((r->ckpt[0] && (rc = check_writable(r->ckpt, "--ckpt"))) ||
        (r->best[0] && (rc = check_writable(r->best, "best checkpoint"))) ||
        (r->plot[0] && (rc = check_writable(r->plot, "--plot"))) ||
        (rc = write_config(r)) || (rc = report_open_csv(r)))
        return rc;
    return 0;
}

static void print_header(run *r)
{
    const opts *o = &r->o;
    char what[PATH_CAP + 64];
    if (r->d.text)
        snprintf(what, sizeof what, "%s (%lld bytes, vocabulary %lld%s)",
                 o->data, (long long)r->d.nbytes, (long long)r->d.vocab,
                 o->bytes ? ", raw bytes" : "");
    else
        snprintf(what, sizeof what, "task: sort %lld digits of %lld, exact "
                 "match on held-out sequences", (long long)o->sort_len,
                 (long long)o->sort_digits);
    printf("flashgrad %s | %s\n", fg_version(), what);
    const double tokens = (double)(o->batch * o->accum * r->d.T * r->world);
    char peak[96];
    if (r->peak_flops > 0)
        snprintf(peak, sizeof peak, "MFU of %.4g TFLOP/s per device%s",
                 r->peak_flops / 1e12, o->peak_tflops < 0
                     ? " (H100 SXM default; set --peak-tflops)" : "");
    else
        snprintf(peak, sizeof peak, "MFU needs --peak-tflops");
    printf("model: %lld parameters | %s, %s%s, %lld thread%s | %.4g MFLOP "
           "per token (6N + 12 L C T), %.4g GFLOP per step | %s\n",
           (long long)fg_gpt_num_params(r->m), fg_device_name(r->dev),
           precision(r), r->amp ? ", fp32 parameters" : "",
           (long long)o->threads, o->threads == 1 ? "" : "s",
           r->flops_per_token / 1e6, r->flops_per_token * tokens / 1e9, peak);
    if (r->world > 1)
        printf("data parallel: %d ranks (%s), %lld sequences per rank and "
               "micro-batch%s\n", r->world,
               fg_comm_get_backend(r->comm) == FG_COMM_NCCL ? "NCCL" : "MPI",
               (long long)o->batch, o->zero1 ? ", ZeRO-1" : "");
    printf("run folder: %s\n", r->out);
    printf("config:\n");
    opts_write(o, stdout, 78);
    if (o->resume[0])
        printf("resumed from %s at step %lld (%.0f s trained before)\n",
               o->resume, (long long)r->st.step, r->elapsed0);
    fflush(stdout);
}

static int setup(run *r, int argc, char **argv)
{
    opts *o = &r->o;
    int rc = read_settings(r, argc, argv);
    if (rc)
        return rc;
    char abs[PATH_CAP];
    if (o->data[0] && path_abs(o->data, abs, sizeof abs) != 0)
        return complain(EXIT_USAGE, "--data: path too long");
    if (o->data[0])
        strcpy(o->data, abs); /* kept absolute: --resume from elsewhere */
    fg_set_num_threads((int)o->threads);
    fg_set_deterministic((int)o->deterministic);
    if ((rc = dist_init(r)) || (rc = dist_check_settings(r)))
        return rc;
    /* Under mpirun every step below runs to its verdict on every rank, and
     * the ranks agree on it before the next collective (dist_agree). */
    rc = pick_device(r);
    const int cuda = r->dev == FG_DEVICE_CUDA;
    const int fp16 = !strcmp(o->dtype, "fp16");
    r->amp = fp16 || !strcmp(o->dtype, "bf16") ||
             (!strcmp(o->dtype, "auto") && cuda);
    r->amp_dt = fp16 ? FG_FP16 : FG_BF16;
    if (!rc && r->amp && !cuda)
        rc = complain(EXIT_USAGE, "--dtype %s needs --device cuda", o->dtype);
    /* fp16's range needs loss scaling (PyTorch's GradScaler); any other
     * dtype takes it on request (power-of-two scales change no bit) */
    r->scaled = fp16 || o->loss_scale > 0;
    if (r->scaled) {
        fg_grad_scaler_init(&r->scaler);
        if (o->loss_scale > 0)
            r->scaler.scale = o->loss_scale;
        if (r->from.has_scaler) /* --resume: where the run was */
            r->scaler = r->from.scaler;
    }
    if (!rc && o->gemm_autotune && o->deterministic)
        rc = complain(EXIT_USAGE, "--gemm-autotune 1 picks GEMM algorithms "
                                  "by timing: not with --deterministic 1");
    if (!rc && o->gemm_autotune && cuda &&
        fg_cuda_set_gemm_autotune(1) != FG_OK)
        rc = lib_error(EXIT_FAIL);
    if (!rc && r->amp && fg_autocast_begin(r->amp_dt) != FG_OK) /* the whole run */
        rc = lib_error(EXIT_FAIL);
    if (!rc)
        rc = data_open(&r->d, o);
    if (!rc && o->resume[0])
        rc = check_resumed_data(r);
    if ((rc = dist_agree(r, rc)) || (rc = dist_agree(r, build_model(r))) ||
        (rc = dist_agree(r, open_outputs(r))))
        return rc;
    print_header(r);
    return 0;
}

/* ---- training ---------------------------------------------------------------- */

/* Validation loss, held-out accuracy (sort), and best.ckpt. */
static int evaluate(run *r, double *val, double *acc, int *stop)
{
    const opts *o = &r->o;
    int rc = eval_loss(r, 1, val);
    if (rc)
        return rc;
    char extra[64] = "";
    if (!r->d.text) {
        if (fg_sort_task_accuracy(r->m, &r->d.task, o->eval_examples,
                                  (uint64_t)o->seed + 1000, acc) != FG_OK)
            return lib_error(EXIT_FAIL);
        snprintf(extra, sizeof extra, " | held-out acc %5.1f%%", 100 * *acc);
        *stop = o->target_acc > 0 && *acc >= o->target_acc;
    }
    /* The ranks hold the same parameters, so their numbers agree; rank 0's
     * verdict makes sure (best.ckpt is a collective save). */
    int verdict[2] = {*val < r->st.best_val, *stop};
    if ((rc = dist_follow_rank0(r, verdict, 2)))
        return rc;
    const int best = verdict[0];
    *stop = verdict[1];
    printf("eval at step %lld | val loss %.4f%s%s\n", (long long)r->st.step,
           *val, extra, best && r->best[0] ? " | best so far: best.ckpt" : "");
    if (best) {
        r->st.best_val = *val;
        return ckpt_save(r, r->best, NULL);
    }
    return 0;
}

/* Final numbers; the exit status of a run that went to the end. */
static int finish(run *r)
{
    const opts *o = &r->o;
    if (r->d.text) {
        double tr, val;
        int rc;
        if ((rc = eval_loss(r, 0, &tr)) || (rc = eval_loss(r, 1, &val)))
            return rc;
        printf("final: train loss %.4f | val loss %.4f\n", tr, val);
        return r->rank == 0 ? write_samples(r) : 0;
    }
    double acc;
    if (fg_sort_task_accuracy(r->m, &r->d.task, o->final_examples,
                              (uint64_t)o->seed + 2000, &acc) != FG_OK)
        return lib_error(EXIT_FAIL);
    printf("held-out exact-match accuracy: %.2f%% (%lld sequences never "
           "seen in training)\n", 100 * acc, (long long)o->final_examples);
    return acc >= 0.99 ? EXIT_OK : EXIT_ACCURACY;
}

/* Ends the --profile-steps region after step `last` and prints it. */
static int end_profile(run *r, int64_t first, int64_t last)
{
    fg_profile p;
    if (fg_profile_end(&p) != FG_OK)
        return lib_error(EXIT_FAIL);
    if (last >= first)
        report_profile(&p, first, last - first + 1);
    return 0;
}

static int train(run *r)
{
    const opts *o = &r->o;
    const int64_t B = o->batch, T = r->d.T;
    fg_lr_schedule sched = {o->lr, o->min_lr, o->warmup, o->steps};
    const int64_t start = r->st.step;
    interval iv;
    memset(&iv, 0, sizeof iv);
    int stop = 0, sig = 0, rc = 0, profiling = 0;
    signals_install();
    r->t0 = now();
    /* --profile-steps: from the second step (the first warms caches) */
    const int64_t prof_first = start + 2, prof_last = start + 1 +
                                                      o->profile_steps;
    while (r->st.step < o->steps && !stop &&
           !(sig = dist_signal(r, signals_caught()))) {
        if (o->profile_steps && r->st.step + 1 == prof_first) {
            if (fg_profile_begin(r->dev) != FG_OK)
                return lib_error(EXIT_FAIL);
            profiling = 1;
        }
        /* Under mpirun every rank draws the whole batch (the same data
         * state everywhere) and trains on its own rows of it. */
        const int64_t rows = B * o->accum, mine = r->rank * rows * T;
        if (data_batch(&r->d, 0, &r->st.data_rng, rows * r->world, r->x,
                       r->y) != FG_OK)
            return lib_error(EXIT_FAIL);
        fg_step_stats ss;
        const double lr = fg_lr_at(&sched, r->st.step), t = now();
        /* Dropout: rank r's own stream (seed moved by r), at rank 0's
         * offset, so a checkpoint's generator restores every rank. */
        fg_generator g = r->st.rng;
        g.seed += (uint64_t)r->rank * 0x9E3779B97F4A7C15ull;
        fg_grad_scaler *sc = r->scaled ? &r->scaler : NULL;
        if ((r->dp ? fg_dp_train_step_scaled(r->dp, r->m, r->x + mine,
                                             r->y + mine, B, T,
                                             (int)o->accum, o->clip, lr, &g,
                                             r->arena, sc, &ss)
                   : fg_gpt_train_step_scaled(r->m, r->opt, r->x, r->y, B, T,
                                              (int)o->accum, o->clip, lr, &g,
                                              r->arena, sc, &ss)) != FG_OK)
            return lib_error(EXIT_FAIL);
        r->st.rng.offset = g.offset;
        iv.train_s += now() - t;
        if (profiling && (r->st.step + 1 == prof_last ||
                          r->st.step + 1 == o->steps)) {
            profiling = 0;
            if ((rc = end_profile(r, prof_first, r->st.step + 1)))
                return rc;
        }
        r->st.step++;
        iv.steps++;
        iv.loss += ss.loss;
        iv.gnorm = ss.grad_norm;
        iv.lr = lr;
        if (!isfinite(ss.loss))
            return complain(EXIT_FAIL, "the loss is %g at step %lld (try a "
                            "lower --lr)", ss.loss, (long long)r->st.step);
        const int64_t s = r->st.step;
        const int last = s == o->steps, eval = s % o->eval_interval == 0 ||
                                               last;
        double val = -1, acc = -1;
        if (s % o->print_interval == 0 || eval)
            report_progress(r, &iv);
        if (eval && (rc = evaluate(r, &val, &acc, &stop)))
            return rc;
        if (s % o->print_interval == 0 || eval) {
            report_row(r, &iv, val, acc);
            memset(&iv, 0, sizeof iv);
        }
        /* Rank 0 samples; every rank learns its outcome, or one that
         * failed there would leave the others in the next step's
         * collectives (no mpirun kills them under --rendezvous). */
        if (r->d.text && o->sample_interval && s % o->sample_interval == 0 &&
            !last && (rc = dist_agree(r, r->rank == 0 ? write_samples(r) : 0)))
            return rc;
        if (o->ckpt_interval && s % o->ckpt_interval == 0 && !last && !stop &&
            (rc = ckpt_save(r, r->ckpt, "periodic")))
            return rc;
    }
    if (profiling && (rc = end_profile(r, prof_first, r->st.step)))
        return rc; /* stopped early: the steps profiled so far */
    const double wall = now() - r->t0;
    char w[32];
    if (sig) {
        printf("\n%s at step %lld: saving and stopping\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", (long long)r->st.step);
        ckpt_save(r, r->ckpt, sig == SIGINT ? "SIGINT" : "SIGTERM");
        if (r->csv)
            fclose(r->csv);
        r->csv = NULL;
        report_plot(r);
        fflush(stdout);
        return signals_exit(sig);
    }
    if (stop)
        printf("target accuracy %.1f%% reached at step %lld\n",
               100 * o->target_acc, (long long)r->st.step);
    printf("trained %lld steps in %s (%.1f s)\n",
           (long long)(r->st.step - start), hms(wall, w), wall);
    /* What the run needed of the GPU (the caching allocator's peak since
     * the start, evaluations included, and what it holds from the
     * driver): how close a batch is to the largest that fits. */
    fg_cuda_memory_stats ms;
    if (r->dev == FG_DEVICE_CUDA && fg_cuda_memory_get_stats(&ms) == FG_OK)
        printf("device memory: peak %.2f GiB in use, %.2f GiB held from "
               "the driver\n", (double)ms.peak_live_bytes / (1 << 30),
               (double)ms.cached_bytes / (1 << 30));
    rc = finish(r);
    /* The final checkpoint below is collective: a rank whose final
     * numbers or samples failed stops every rank here. */
    const int agreed =
        dist_agree(r, rc != EXIT_OK && rc != EXIT_ACCURACY ? rc : 0);
    if (agreed)
        return agreed; /* this rank's own failure, or EXIT_FAIL */
    const int saved = ckpt_save(r, r->ckpt, "final");
    if (r->csv)
        fclose(r->csv);
    r->csv = NULL;
    const int plotted = report_plot(r);
    if ((sig = signals_caught())) /* arrived after the loop: saved above */
        return signals_exit(sig);
    return saved ? saved : plotted ? plotted : rc;
}

int main(int argc, char **argv)
{
    /* A dead gnuplot must not kill the trainer through its pipe. */
    signal(SIGPIPE, SIG_IGN);
    run *r = calloc(1, sizeof *r);
    if (!r)
        return EXIT_FAIL;
    int rc = setup(r, argc, argv);
    if (rc < 0)
        rc = EXIT_OK; /* --help, --version */
    else if (rc == 0)
        rc = train(r);
    if (r->csv)
        fclose(r->csv);
    fg_arena_free(r->arena);
    fg_adamw_free(r->opt);
    dist_free(r);
    fg_gpt_free(r->m);
    data_release(&r->d);
    free(r->x);
    free(r->y);
    free(r);
    return rc;
}
