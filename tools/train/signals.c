/* tools/train/signals.c - Ctrl-C handling. */
#include "signals.h"

volatile sig_atomic_t interrupted;
/* The first Ctrl-C asks the loop to checkpoint and stop at the next step
 * boundary; a second one kills the program as usual. */
static void on_sigint(int sig)
{
    interrupted = 1;
    signal(sig, SIG_DFL);
}

void signals_install(void)
{
    signal(SIGINT, on_sigint);
}
