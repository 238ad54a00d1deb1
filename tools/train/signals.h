/* tools/train/signals.h - Ctrl-C asks the loop to checkpoint and stop. */
#ifndef FG_TRAIN_SIGNALS_H
#define FG_TRAIN_SIGNALS_H

#include <signal.h>

extern volatile sig_atomic_t interrupted;
void signals_install(void);

#endif
