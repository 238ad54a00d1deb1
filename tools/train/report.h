/* tools/train/report.h - timing, progress helpers, the loss plot. */
#ifndef FG_TRAIN_REPORT_H
#define FG_TRAIN_REPORT_H

#include "options.h"

double now(void);
const char *hms(double s, char *buf);
void report_plot(const opts *o);

#endif
