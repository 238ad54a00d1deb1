/* tools/train/report.c - timing, progress helpers, the loss plot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "report.h"

double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *hms(double s, char *buf)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        sprintf(buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        sprintf(buf, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

void report_plot(const opts *o)
{
    if (!strcmp(o->plot, "none") || !strcmp(o->log, "none"))
        return;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("note: gnuplot not found, no loss-curve PNG (the CSV log %s "
               "has the numbers)\n", o->log);
        return;
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "gnuplot -e \"set terminal png size 800,500; set output '%s'; "
             "set datafile separator ','; set key autotitle columnhead; "
             "set xlabel 'step'; set ylabel 'loss'; set logscale y; "
             "plot '%s' using 1:2 with lines title 'train', "
             "'' using 1:3 with linespoints title 'val'\" 2>/dev/null",
             o->plot, o->log);
    if (system(cmd) == 0)
        printf("loss curve: %s\n", o->plot);
    else
        printf("note: gnuplot failed, no PNG\n");
}

