/* SPDX-License-Identifier: MIT */
/* tools/train/run.h - one training run: settings, data, model, optimizer,
 * outputs; shared by the trainer's files. */
#ifndef FG_TRAIN_RUN_H
#define FG_TRAIN_RUN_H

#include <stdio.h>

#include <flashgrad/flashgrad.h>

#include "data.h"
#include "options.h"

/* What a checkpoint says about its run besides the settings. */
typedef struct run_origin {
    int has_fingerprint;  /* written by a flashgrad-train that keeps it */
    double elapsed;       /* seconds trained before */
    int64_t nbytes;       /* text: size and FNV-1a of the trained text */
    uint64_t fnv;
    unsigned char vocab[256];
    int n_vocab;          /* 0: none kept */
    char data[PATH_CAP];  /* the text it was trained on ("": sort) */
    int has_scaler;       /* the loss scaler's state at the save */
    fg_grad_scaler scaler;
} run_origin;

typedef struct run {
    opts o;               /* the settings, as kept in checkpoints */
    run_origin from;      /* with --resume */
    /* outputs, resolved ("" = off) */
    char out[PATH_CAP], config[PATH_CAP], ckpt[PATH_CAP], best[PATH_CAP],
        log[PATH_CAP], plot[PATH_CAP], samples[PATH_CAP];
    FILE *csv;
    dataset d;
    fg_device dev;
    int amp;              /* autocast to amp_dt (bf16 / fp16) */
    fg_dtype amp_dt;
    fg_grad_scaler scaler; /* dynamic loss scaling, when scaled */
    int scaled;
    fg_gpt *m;
    fg_adamw *opt;
    fg_train_state st;
    fg_arena *arena;
    int64_t *x, *y;
    double elapsed0;      /* seconds trained before this process */
    double t0;            /* this process's start of training */
    double flops_per_token;
    double peak_flops;    /* one device's, for the MFU (0: none) */
    /* several processes (dist.c); one process: world 1, the rest NULL */
    int rank, world;
    fg_comm *host;        /* MPI: the ranks (NULL under --rendezvous) */
    fg_comm *comm;        /* the gradients': host (CPU) or NCCL (GPU) */
    fg_tensor *agree_buf; /* --rendezvous: device scratch of the small
                             all-reduces (allocated once: a rank whose
                             allocation failed would skip a collective) */
    fg_dp *dp;            /* owns the optimizer; r->opt stays NULL */
} run;

/* Prints the library's last error; returns code. */
int lib_error(int code);

/* ---- run_ckpt.c: checkpoints ---------------------------------------------- */
/* The settings and origin of the checkpoint at path into r->o and
 * r->from (r->o starts from the defaults); 0 or EXIT_USAGE. */
int ckpt_read_run(run *r, const char *path);
/* Saves the model to path ("": off), saying why unless why is NULL; 0 or
 * EXIT_FAIL (printed). */
int ckpt_save(run *r, const char *path, const char *why);

/* ---- dist.c: data parallel (mpirun or --rendezvous) ------------------------- */
/* Joins the other ranks (mpirun, --rendezvous) before anything touches
 * CUDA (NCCL picks the GPU); silences stdout except on rank 0. */
int dist_init(run *r);
/* The data-parallel state over r->m's parameters (replaces r->opt). */
int dist_create(run *r, const fg_adamw_config *oc);
/* The signal every rank acts on at this step (0: none). */
int dist_signal(run *r, int sig);
/* rc, or EXIT_FAIL where another rank's rc was not 0 (collective). */
int dist_agree(run *r, int rc);
/* Rank 0's flags (n <= 4 values 0/1) on every rank (collective; 0 or
 * EXIT_FAIL). Decisions that lead to collectives (a best.ckpt save, a
 * stop) are rank 0's, so no rank waits in one the others skip. */
int dist_follow_rank0(run *r, int *v, int n);
/* EXIT_USAGE on every rank where some rank's settings (the options kept in
 * checkpoints, --resume, the rank count) differ from rank 0's. */
int dist_check_settings(run *r);
void dist_free(run *r);

/* ---- report.c: progress, CSV, plot ------------------------------------------ */
/* Opens the CSV log: a new one with its header (replacing a file of that
 * name), or on resume the old one cut back to the resumed step and
 * appended to; 0 or EXIT_USAGE. */
int report_open_csv(run *r);
typedef struct interval {
    int64_t steps;        /* steps in the interval */
    double loss, gnorm, lr, train_s; /* loss summed; seconds training */
} interval;
void report_progress(run *r, const interval *iv);
/* One CSV row (val/acc < 0: none). */
void report_row(run *r, const interval *iv, double val, double acc);
/* The --profile-steps table: per-step time of each kernel family, the
 * rest of the wall time, steps first..first+steps-1. */
void report_profile(const fg_profile *p, int64_t first, int64_t steps);
/* Draws the loss curve; 0, or EXIT_FAIL when gnuplot is there and fails. */
int report_plot(run *r);

/* ---- evaluate.c --------------------------------------------------------------- */
/* Mean loss over --eval-batches fixed batches of the split. */
int eval_loss(run *r, int split, double *out);
/* Writes --samples samples (text), printed and appended to samples.txt. */
int write_samples(run *r);

#endif
