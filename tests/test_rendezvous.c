/* SPDX-License-Identifier: MIT */
/* tests/test_rendezvous.c - the arrival check of fg_comm_init_nccl_file
 * (lib/dist/comm.c), without NCCL: ranks are forked processes that call
 * fg_rendezvous_arrive on files in a fresh directory. All arriving pass,
 * a late one included; a missing rank makes the others fail within the
 * timeout with that rank named; a file an earlier run left (another id)
 * does not count; every rank's file is gone afterwards. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/dist/comm_internal.h"
#include "test_ops_util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A fresh directory and the id path inside it. */
static void fresh(char *dir, size_t n, char *path, size_t pn)
{
    snprintf(dir, n, "/tmp/fg-rz-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, pn, "%s/id", dir);
}

static void make_id(unsigned char *id, int salt)
{
    for (int i = 0; i < FG_NCCL_ID_BYTES; i++)
        id[i] = (unsigned char)(i * 37 + salt * 101 + 1);
}

/* Forks one process per rank in `ranks` (delays in ms before arriving);
 * codes[i]: 0 passed, 1 FG_ERR_COMM with "rank <missing>" in the message,
 * 2 anything else. */
static void run(const char *path, int nranks, const int *ranks,
                const int *delay_ms, int n, double timeout_s, int missing,
                int *codes)
{
    pid_t pid[8];
    for (int i = 0; i < n; i++) {
        pid[i] = fork();
        ck_assert_int_ge(pid[i], 0);
        if (pid[i] == 0) {
            unsigned char id[FG_NCCL_ID_BYTES];
            make_id(id, 1);
            usleep((useconds_t)delay_ms[i] * 1000);
            fg_status s = fg_rendezvous_arrive(path, ranks[i], nranks, id,
                                               timeout_s);
            if (s == FG_OK) {
                /* NCCL's init would run here; every rank passed */
                usleep(50 * 1000);
                fg_rendezvous_leave(path, ranks[i]);
                _exit(0);
            }
            char want[32];
            snprintf(want, sizeof want, "(rank %d first)", missing);
            _exit(s == FG_ERR_COMM && strstr(fg_last_error(), want) ? 1 : 2);
        }
    }
    for (int i = 0; i < n; i++) {
        int st = 0;
        ck_assert_int_eq(waitpid(pid[i], &st, 0), pid[i]);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 3;
    }
}

static int exists(const char *path, int rank)
{
    char p[256];
    snprintf(p, sizeof p, "%s.arrived.%d", path, rank);
    return access(p, F_OK) == 0;
}

START_TEST(test_all_arrive)
{
    char dir[64], path[128];
    fresh(dir, sizeof dir, path, sizeof path);
    const int ranks[4] = {0, 1, 2, 3}, delay[4] = {0, 30, 250, 5};
    int codes[4];
    const double t0 = now_s();
    run(path, 4, ranks, delay, 4, 10.0, -1, codes);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(codes[i] == 0, "rank %d: code %d", i, codes[i]);
        ck_assert(!exists(path, i));
    }
    ck_assert(now_s() - t0 < 5.0); /* waited for the late rank, not the timeout */
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(test_missing_rank)
{
    char dir[64], path[128];
    fresh(dir, sizeof dir, path, sizeof path);
    /* rank 1's file from an earlier run: another id */
    unsigned char old[FG_NCCL_ID_BYTES];
    make_id(old, 2);
    char stale[256];
    snprintf(stale, sizeof stale, "%s.arrived.1", path);
    FILE *f = fopen(stale, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(old, 1, sizeof old, f), sizeof old);
    ck_assert_int_eq(fclose(f), 0);
    const int ranks[2] = {0, 2}, delay[2] = {0, 0};
    int codes[2];
    const double t0 = now_s();
    run(path, 3, ranks, delay, 2, 0.5, 1, codes);
    const double took = now_s() - t0;
    for (int i = 0; i < 2; i++)
        ck_assert_msg(codes[i] == 1, "rank %d: code %d", ranks[i], codes[i]);
    ck_assert_msg(took >= 0.5 && took < 5.0, "took %g s", took);
    ck_assert(!exists(path, 0) && !exists(path, 2));
    ck_assert(exists(path, 1)); /* not ours to remove */
    ck_assert_int_eq(remove(stale), 0);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(test_bad_path)
{
    char path[5000];
    memset(path, 'a', sizeof path - 1);
    path[sizeof path - 1] = '\0';
    unsigned char id[FG_NCCL_ID_BYTES];
    make_id(id, 1);
    FGT_FAILS(fg_rendezvous_arrive(path, 0, 2, id, 0.1), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_rendezvous_arrive("/nonexistent-dir/fg/id", 0, 2, id, 0.1), FG_ERR_IO);
}
END_TEST

FGT_MAIN_BEGIN("rendezvous")
FGT_TEST(test_all_arrive)
FGT_TEST(test_missing_rank)
FGT_TEST(test_bad_path)
FGT_MAIN_END()
