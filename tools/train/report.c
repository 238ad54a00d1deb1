/* SPDX-License-Identifier: MIT */
/* tools/train/report.c - what a run shows: the progress line (loss,
 * speed, MFU, ETA), the CSV log, and the loss curve drawn by gnuplot. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "run.h"
#include "util.h"

static const char HEADER[] = "step,loss,val_loss,accuracy,grad_norm,lr,"
                             "ms_per_step,tokens_per_s,mfu,elapsed_s";

/* Keeps the header and the rows up to the resumed step: rows a killed run
 * wrote after its last checkpoint would otherwise appear twice. */
static int cut_back(const char *path, int64_t step)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? 0 : complain(EXIT_USAGE, "--log %s: %s",
                                              path, strerror(errno));
    char tmp[PATH_CAP + 8], line[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *t = fopen(tmp, "w");
    if (!t) {
        fclose(f);
        return complain(EXIT_USAGE, "--log %s: %s", tmp, strerror(errno));
    }
    int rc = 0, first = 1;
    while (!rc && fgets(line, sizeof line, f)) {
        if (first && strncmp(line, HEADER, strlen(HEADER)))
            rc = complain(EXIT_USAGE, "--log %s: not this trainer's CSV (its "
                          "header differs); give another --log", path);
        else if (first || strtoll(line, NULL, 10) <= step)
            fputs(line, t);
        first = 0;
    }
    if (ferror(f) && !rc)
        rc = complain(EXIT_USAGE, "--log %s: %s", path, strerror(errno));
    fclose(f);
    if ((fclose(t) != 0 || rename(tmp, path) != 0) && !rc)
        rc = complain(EXIT_USAGE, "--log %s: %s", path, strerror(errno));
    if (rc)
        remove(tmp);
    return rc;
}

int report_open_csv(run *r)
{
    if (!r->log[0])
        return 0;
    if (r->st.step > 0 && cut_back(r->log, r->st.step))
        return EXIT_USAGE;
    r->csv = fopen(r->log, r->st.step > 0 ? "a" : "w");
    if (!r->csv)
        return complain(EXIT_USAGE, "--log %s: %s", r->log, strerror(errno));
    if (ftell(r->csv) == 0)
        fprintf(r->csv, "%s\n", HEADER);
    fflush(r->csv);
    return 0;
}

/* Tokens per second and MFU (-1 without a peak) of an interval. */
static void speed(const run *r, const interval *iv, double *tps,
                  double *mfu)
{
    /* Every rank's tokens; the peak is one device's. */
    const double tokens = (double)(r->o.batch * r->o.accum * r->d.T) *
                          (double)r->world * (double)iv->steps;
    *tps = iv->train_s > 0 ? tokens / iv->train_s : 0;
    *mfu = r->peak_flops > 0 ? *tps * r->flops_per_token /
                                   (r->peak_flops * r->world)
                             : -1;
}

void report_progress(run *r, const interval *iv)
{
    double tps, mfu;
    speed(r, iv, &tps, &mfu);
    const double ms = iv->train_s * 1e3 / (double)iv->steps;
    char mf[32] = "", el[32], eta[32], sc[64] = "";
    if (mfu >= 0)
        snprintf(mf, sizeof mf, " | MFU %.1f%%", 100 * mfu);
    if (r->scaled) /* a skipped step's gnorm is inf or nan */
        snprintf(sc, sizeof sc, " | loss scale %g (%lld skipped)",
                 r->scaler.scale, (long long)r->scaler.skipped);
    printf("step %5lld/%lld | loss %.4f | gnorm %.3f | lr %.2e%s | "
           "%.1f ms/step | %.0f tok/s%s | elapsed %s | ETA %s\n",
           (long long)r->st.step, (long long)r->o.steps,
           iv->loss / (double)iv->steps, iv->gnorm, iv->lr, sc, ms, tps, mf,
           hms(r->elapsed0 + now() - r->t0, el),
           hms((double)(r->o.steps - r->st.step) * ms / 1e3, eta));
    fflush(stdout);
}

void report_row(run *r, const interval *iv, double val, double acc)
{
    if (!r->csv)
        return;
    double tps, mfu;
    speed(r, iv, &tps, &mfu);
    fprintf(r->csv, "%lld,%.6f,", (long long)r->st.step,
            iv->loss / (double)iv->steps);
    if (val >= 0)
        fprintf(r->csv, "%.6f", val);
    fputc(',', r->csv);
    if (acc >= 0)
        fprintf(r->csv, "%.6f", acc);
    fprintf(r->csv, ",%.6f,%.6e,%.3f,%.1f,", iv->gnorm, iv->lr,
            iv->train_s * 1e3 / (double)iv->steps, tps);
    if (mfu >= 0)
        fprintf(r->csv, "%.6f", mfu);
    fprintf(r->csv, ",%.2f\n", r->elapsed0 + now() - r->t0);
    fflush(r->csv);
}

void report_profile(const fg_profile *p, int64_t first, int64_t steps)
{
    const double n = (double)steps, wall = p->wall_ms / n;
    double sum = 0;
    printf("profile of step%s %lld..%lld (%s time per step; %s):\n"
           "  %-26s %9s %7s %8s\n", steps > 1 ? "s" : "", (long long)first,
           (long long)(first + steps - 1),
           p->device == FG_DEVICE_CUDA ? "GPU" : "wall-clock",
           p->device == FG_DEVICE_CUDA ? "CUDA events around each op"
                                       : "timers around each op",
           "family", "ms/step", "share", "calls");
    for (int f = 1; f <= FG_PROF_NFAMILIES; f++) { /* "other" last */
        const int i = f % FG_PROF_NFAMILIES;
        sum += p->ms[i];
        printf("  %-26s %9.3f %6.1f%% %8.1f\n", fg_profile_family_name(i),
               p->ms[i] / n, wall > 0 ? 100 * p->ms[i] / p->wall_ms : 0,
               (double)p->calls[i] / n);
    }
    printf("  %-26s %9.3f %6.1f%%\n  %-26s %9.3f\n",
           "launches, gaps, host (rest)", (p->wall_ms - sum) / n,
           wall > 0 ? 100 * (p->wall_ms - sum) / p->wall_ms : 0,
           "step (wall)", wall);
    /* By operation, largest first (fg_profile_ops): the "other kernels"
     * (the candidates for fusion), then the GEMMs, attention, layernorm
     * and optimizer (which forward or backward of them to look at). */
    fg_profile_op ops[128];
    const int n_ops = fg_profile_ops(ops, 128);
    for (int other = 1; other >= 0; other--) {
        int shown = 0;
        for (int i = 0; i < n_ops && i < 128 && shown < 12; i++) {
            const int is_other = ops[i].family == FG_PROF_OTHER || ops[i].family == -1;
            if (is_other != other)
                continue;
            if (!shown++)
                printf(other ? "  other kernels by operation:\n"
                             : "  the other families by operation:\n");
            printf("    %-*s %9.3f %6.1f%% %8.1f%s%s\n", other ? 24 : 28,
                   ops[i].name, ops[i].ms / n,
                   wall > 0 ? 100 * ops[i].ms / p->wall_ms : 0,
                   (double)ops[i].calls / n, other ? "" : "  ",
                   other ? "" : fg_profile_family_name(ops[i].family));
        }
    }
    fflush(stdout);
}

/* What the plot needs to know of the CSV: whether a row has a
 * validation loss (gnuplot warns about a curve without points) and the
 * range of the losses (a log scale only pays when it spans a decade). */
static void scan_csv(const char *path, int *has_val, double *lo, double *hi)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    *has_val = 0;
    *lo = INFINITY;
    *hi = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (!isdigit((unsigned char)line[0]))
            continue; /* the header */
        char *p = strchr(line, ','), *end;
        for (int col = 2; p && col <= 3; col++, p = strchr(p + 1, ',')) {
            const double v = strtod(p + 1, &end);
            if (end == p + 1 || !(v > 0))
                continue; /* empty field */
            *has_val |= col == 3;
            *lo = v < *lo ? v : *lo;
            *hi = v > *hi ? v : *hi;
        }
    }
    if (f)
        fclose(f);
}

/* s as a gnuplot single-quoted string ('' stands for '). */
static void gp_str(FILE *g, const char *s)
{
    fputc('\'', g);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', g);
        fputc(*s, g);
    }
    fputc('\'', g);
}

int report_plot(run *r)
{
    if (!r->plot[0] || !r->log[0])
        return 0;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("note: gnuplot is not installed, so no %s (%s has the "
               "numbers)\n", r->plot, r->log);
        return 0;
    }
    if (r->csv)
        fflush(r->csv);
    FILE *g = popen("gnuplot", "w");
    if (!g)
        return complain(EXIT_FAIL, "cannot run gnuplot: %s",
                        strerror(errno));
    char title[PATH_CAP + 64];
    if (r->d.text) {
        const char *base = strrchr(r->o.data, '/');
        snprintf(title, sizeof title, "flashgrad-train: %s, %lld steps",
                 base ? base + 1 : r->o.data, (long long)r->st.step);
    } else
        snprintf(title, sizeof title, "flashgrad-train: sorting %lld digits "
                 "of %lld, %lld steps", (long long)r->o.sort_len,
                 (long long)r->o.sort_digits, (long long)r->st.step);
    fprintf(g, "set terminal png size 900,%d noenhanced\nset output ",
            r->d.text ? 540 : 800);
    gp_str(g, r->plot);
    fprintf(g, "\nset datafile separator ','\nset grid\nset key top right\n"
               "set xlabel 'step'\nset format y '%%g'\nset xrange [0:%lld]\n",
            (long long)(r->st.step > 0 ? r->st.step : 1));
    if (!r->d.text)
        fprintf(g, "set multiplot layout 2,1 title ");
    else
        fprintf(g, "set title ");
    gp_str(g, title);
    /* Column 2 is the training loss averaged over each interval, column
     * 3 the validation loss at evaluations (empty in the other rows). */
    int val;
    double lo, hi;
    scan_csv(r->log, &val, &lo, &hi);
    fprintf(g, "\nset ylabel 'cross-entropy loss (nats/token)'\n%s\nplot ",
            hi > 10 * lo ? "set logscale y" : "unset logscale y");
    gp_str(g, r->log);
    fprintf(g, " using 1:2 skip 1 with lines lw 2 title 'train (interval "
               "mean)'");
    if (val)
        fprintf(g, ", '' using 1:3 skip 1 with linespoints lw 2 pt 7 ps 0.7 "
                   "title 'validation'");
    fputc('\n', g);
    if (!r->d.text && val)
        fprintf(g, "unset logscale y\nset yrange [0:100]\nset ylabel "
                   "'held-out exact match (%%)'\nset key bottom right\n"
                   "plot '' using 1:($4 * 100) skip 1 with linespoints "
                   "lw 2 pt 7 ps 0.7 title 'accuracy'\n");
    if (!r->d.text)
        fprintf(g, "unset multiplot\n");
    const int st = pclose(g);
    if (st != 0)
        return complain(EXIT_FAIL, "gnuplot could not draw %s (exit status "
                        "%d)", r->plot, WIFEXITED(st) ? WEXITSTATUS(st) : st);
    printf("loss curve: %s\n", r->plot);
    return 0;
}
