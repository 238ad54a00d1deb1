/* SPDX-License-Identifier: MIT */
/* tools/train/signals.c - SIGINT/SIGTERM: checkpoint, then die of it. */
#include <signal.h>
#include <string.h>

#include "signals.h"

static volatile sig_atomic_t caught;

static void on_signal(int sig)
{
    caught = sig; /* SA_RESETHAND: the next one takes the default action */
}

void signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int signals_caught(void) { return caught; }

int signals_exit(int sig)
{
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    return 128 + sig;
}
