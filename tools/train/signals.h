/* SPDX-License-Identifier: MIT */
/* tools/train/signals.h - SIGINT and SIGTERM stop the run cleanly: the
 * handler only records the signal; the loop saves a checkpoint at the next
 * step boundary, then signals_exit() dies of the same signal, so the shell
 * sees the conventional status (130, 143). A second signal kills at once. */
#ifndef FG_TRAIN_SIGNALS_H
#define FG_TRAIN_SIGNALS_H

void signals_install(void);
/* The signal caught so far, or 0. */
int signals_caught(void);
/* Restores the default action and re-raises sig; returns 128 + sig only
 * if the process somehow survives. */
int signals_exit(int sig);

#endif
