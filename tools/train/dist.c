/* SPDX-License-Identifier: MIT */
/* tools/train/dist.c - flashgrad-train on several processes: data
 * parallelism (flashgrad/dist.h). Started by mpirun with N > 1 processes,
 * the trainer joins them with MPI (CPU) or NCCL over MPI (--device cuda;
 * one GPU per process, by its rank on the host); started N times with
 * --rendezvous FILE --rank R --world-size N, with NCCL through the file
 * (one host, no MPI). Every rank trains on its own rows of an N times
 * larger batch and the gradients are averaged: the run equals one process
 * with --accum N times larger (doc/distributed.md). Rank 0 prints, logs,
 * samples and writes checkpoints; the others stay silent. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"
#include "util.h"

/* Set by mpirun (Open MPI), by Hydra (MPICH) or by a PMIx launcher. */
static int launched_by_mpi(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") ||
           getenv("PMIX_RANK");
}

/* Only rank 0 speaks; errors (stderr) come from every rank. */
static int silence_others(const run *r)
{
    if (r->rank > 0 && !freopen("/dev/null", "w", stdout))
        return complain(EXIT_FAIL, "rank %d: cannot silence stdout", r->rank);
    return 0;
}

enum { AGREE_MAX = 4 }; /* values per sum_over_ranks */

/* --rendezvous: NCCL among the processes of this host, through a file. */
static int init_rendezvous(run *r)
{
    const opts *o = &r->o;
    if (launched_by_mpi())
        return complain(EXIT_USAGE, "--rendezvous is for processes started "
                        "without mpirun (under mpirun the ranks join by "
                        "MPI)");
    r->rank = (int)o->rank;
    r->world = (int)o->world_size;
    if (r->world == 1)
        return 0;
    if (!strcmp(o->device, "cpu") || !fg_cuda_available())
        return complain(EXIT_USAGE, "--rendezvous joins GPU processes "
                        "(NCCL); on the CPU start the ranks with mpirun");
    if (!fg_comm_backend_available(FG_COMM_NCCL))
        return complain(EXIT_USAGE, "--rendezvous: this flashgrad was built "
                        "without NCCL (configure --with-nccl)");
    int rc = silence_others(r);
    if (rc)
        return rc;
    /* Generous: the other processes may still be loading CUDA. */
    if (fg_comm_init_nccl_file(o->rendezvous, r->rank, r->world, -1, 300.0,
                               &r->comm) != FG_OK)
        return complain(EXIT_FAIL, "rank %d: --rendezvous %s: %s", r->rank,
                        o->rendezvous, fg_last_error());
    const int64_t shape[1] = {AGREE_MAX};
    if (fg_tensor_zeros(FG_FP64, FG_DEVICE_CUDA, 1, shape, &r->agree_buf) !=
        FG_OK)
        return lib_error(EXIT_FAIL);
    return 0;
}

int dist_init(run *r)
{
    r->world = 1;
    if (r->o.world_size)
        return init_rendezvous(r);
    if (!launched_by_mpi())
        return 0;
    if (!fg_comm_backend_available(FG_COMM_MPI))
        return complain(EXIT_USAGE, "started by mpirun, but this flashgrad "
                        "was built without MPI (configure --with-mpi)");
    if (fg_comm_init_mpi(NULL, NULL, &r->host) != FG_OK)
        return lib_error(EXIT_FAIL);
    r->rank = fg_comm_rank(r->host);
    r->world = fg_comm_size(r->host);
    if (r->world == 1) { /* mpirun -np 1: the one-process trainer */
        fg_comm_free(r->host);
        r->host = NULL;
        return 0;
    }
    int rc = silence_others(r);
    if (rc)
        return rc;
    /* NCCL picks this rank's GPU before anything touches CUDA. */
    const char *dev = r->o.device;
    const int cuda = !strcmp(dev, "cuda") ||
                     (!strcmp(dev, "auto") && fg_cuda_available() &&
                      fg_comm_backend_available(FG_COMM_NCCL));
    if (!cuda) {
        r->comm = r->host;
        return 0;
    }
    if (fg_comm_init_nccl_mpi(r->host, -1, &r->comm) != FG_OK)
        return complain(EXIT_USAGE, "--device cuda under mpirun: %s",
                        fg_last_error());
    return 0;
}

/* Sums n <= AGREE_MAX small host values over the ranks: through MPI where
 * the ranks have it, else through NCCL in r->agree_buf (--rendezvous). */
static fg_status sum_over_ranks(run *r, double *v, int n)
{
    if (r->host)
        return fg_comm_allreduce(r->host, v, v, n, FG_FP64, FG_REDUCE_SUM);
    double pad[AGREE_MAX] = {0};
    memcpy(pad, v, sizeof(double) * (size_t)n);
    fg_tensor *t = r->agree_buf;
    fg_status st = fg_tensor_copy_from_host(t, FG_FP64, pad, AGREE_MAX);
    /* The all-reduce runs even where the copy failed: the peers wait in it. */
    const fg_status ar = fg_comm_allreduce(r->comm, fg_tensor_data(t),
                                           fg_tensor_data(t), (size_t)n,
                                           FG_FP64, FG_REDUCE_SUM);
    if (st == FG_OK)
        st = ar;
    if (st == FG_OK)
        st = fg_tensor_copy_to_host(t, FG_FP64, pad, AGREE_MAX);
    memcpy(v, pad, sizeof(double) * (size_t)n);
    return st;
}

/* Rank 0's n <= AGREE_MAX values in v on every rank: the others add 0. */
static fg_status from_rank0(run *r, double *v, int n)
{
    if (r->rank != 0)
        memset(v, 0, sizeof(double) * (size_t)n);
    return sum_over_ranks(r, v, n);
}

/* FNV-1a of what must be equal on every rank. */
static uint64_t settings_hash(const run *r)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return 0;
    opts_write(&r->o, f, 0);
    fprintf(f, "--resume %s\nranks %d\n", r->o.resume, r->world);
    fclose(f);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; text && i < len; i++) {
        h ^= (unsigned char)text[i];
        h *= 1099511628211ull;
    }
    free(text);
    return h;
}

/* Under mpirun every rank gets the same command line; under --rendezvous
 * each has its own, and ranks with other steps, shapes or checkpoint
 * settings would issue other collectives and hang (or sum garbage). Rank
 * 0's hash, 60 bits in three exact 20-bit parts, reaches every rank. */
int dist_check_settings(run *r)
{
    if (!r->comm || r->world < 2)
        return 0;
    const uint64_t h = settings_hash(r) & ((1ull << 60) - 1);
    double v[3];
    for (int i = 0; i < 3; i++)
        v[i] = (double)((h >> (20 * i)) & 0xFFFFF);
    if (from_rank0(r, v, 3) != FG_OK)
        return lib_error(EXIT_FAIL);
    uint64_t h0 = 0;
    for (int i = 0; i < 3; i++)
        h0 |= (uint64_t)v[i] << (20 * i);
    const int rc = h0 == h ? 0
                 : complain(EXIT_USAGE, "rank %d: its settings differ from "
                            "rank 0's (every rank needs the same options, "
                            "--rank aside)", r->rank);
    return dist_agree(r, rc);
}

int dist_create(run *r, const fg_adamw_config *oc)
{
    int n;
    const fg_param *ps = fg_gpt_params(r->m, &n);
    fg_dp_config dc;
    fg_dp_config_init(&dc);
    dc.adamw = *oc;
    dc.zero1 = (int)r->o.zero1;
    if (r->o.bucket_mb > 0) { /* 0 bytes would mean the library's default */
        const double bytes = r->o.bucket_mb * 1048576.0;
        dc.bucket_bytes = bytes < 1.0 ? 1 : (size_t)bytes;
    }
    if (fg_comm_device(r->comm) != r->dev)
        return complain(EXIT_USAGE, "the ranks communicate %s buffers but "
                        "the model is on %s (--device)",
                        fg_device_name(fg_comm_device(r->comm)),
                        fg_device_name(r->dev));
    if (fg_dp_create(r->comm, ps, n, &dc, &r->dp) != FG_OK)
        return lib_error(EXIT_FAIL);
    return 0;
}

/* A verdict agreed by every rank: a step that failed on some ranks only
 * (rank 0's run folder, a data file one host lacks, rank 0's samples)
 * would otherwise leave the others waiting in the next collective
 * forever. */
int dist_agree(run *r, int rc)
{
    if (!r->comm || r->world < 2)
        return rc;
    double failed = rc != 0;
    if (sum_over_ranks(r, &failed, 1) != FG_OK)
        return rc ? rc : lib_error(EXIT_FAIL);
    if (rc)
        return rc;
    if (failed > 0)
        return complain(EXIT_FAIL, "rank %d: stopping, %g other rank(s) "
                        "failed (their messages say why)",
                        r->rank, failed);
    return 0;
}

int dist_follow_rank0(run *r, int *v, int n)
{
    if (!r->comm || r->world < 2)
        return 0;
    double x[AGREE_MAX];
    for (int i = 0; i < n; i++)
        x[i] = v[i];
    if (from_rank0(r, x, n) != FG_OK)
        return lib_error(EXIT_FAIL);
    for (int i = 0; i < n; i++)
        v[i] = x[i] != 0.0;
    return 0;
}

/* Every rank stops at the same step: a signal any rank caught counts for
 * all (mpirun forwards them, but not at the same instant). It travels in
 * the next step's own reduction (fg_dp_set_flags), so a signal caught
 * during step s stops every rank after step s + 1, without a collective
 * per step of its own (which would drain each GPU's stream every step). */
int dist_signal(run *r, int sig)
{
    if (!r->dp)
        return sig;
    const unsigned seen = fg_dp_flags(r->dp);
    const unsigned mine = (sig == SIGINT ? 1u : 0u) |
                          (sig != 0 && sig != SIGINT ? 2u : 0u);
    if (fg_dp_set_flags(r->dp, mine) != FG_OK)
        return sig ? sig : SIGTERM;
    return seen & 1u ? SIGINT : seen & 2u ? SIGTERM : 0;
}

void dist_free(run *r)
{
    fg_tensor_free(r->agree_buf);
    r->agree_buf = NULL;
    fg_dp_free(r->dp);
    r->dp = NULL;
    if (r->comm != r->host)
        fg_comm_free(r->comm);
    fg_comm_free(r->host);
    r->comm = r->host = NULL;
    fg_dist_finalize();
}
