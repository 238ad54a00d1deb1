/* SPDX-License-Identifier: MIT */
/* lib/dist/comm.c - the communicator API of dist.h: argument validation
 * (all of it before a backend is reached), dispatch to the MPI or NCCL
 * backend, and the NCCL bootstraps that need no CUDA themselves (unique id
 * over MPI or through a file). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"

#include "comm_internal.h"
#include "lib/core/error.h"
#include "kernels/runtime/device.h"

fg_comm *fg_comm_alloc(const fg_comm_vtable *vt, fg_comm_backend b,
                       fg_device dev, int rank, int size)
{
    fg_comm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->vt = vt;
    c->backend = b;
    c->device = dev;
    c->rank = rank;
    c->size = size;
    c->local_rank = rank;
    c->local_size = size;
    c->cuda_device = -1;
    return c;
}

int fg_comm_backend_available(fg_comm_backend b)
{
#ifdef FG_HAVE_MPI
    if (b == FG_COMM_MPI)
        return 1;
#endif
#ifdef FG_HAVE_NCCL
    if (b == FG_COMM_NCCL)
        return 1;
#endif
    (void)b;
    return 0;
}

/* ---- validation -------------------------------------------------------------- */

static fg_status check_comm(const fg_comm *c, const char *fn)
{
    if (!c)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: communicator is NULL",
                        fn);
    return FG_OK;
}

/* count elements of dt at p on the communicator's device; *bytes gets the
 * size of n_blocks * count elements. */
static fg_status check_buf(const fg_comm *c, const void *p, size_t count,
                           size_t n_blocks, fg_dtype dt, const char *what,
                           const char *fn, size_t *bytes)
{
    const size_t es = fg_dtype_size(dt);
    if (es == 0)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: unknown dtype %d", fn,
                        (int)dt);
    if (count > SIZE_MAX / es / (n_blocks ? n_blocks : 1))
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s size overflows", fn,
                        what);
    if (bytes)
        *bytes = count * n_blocks * es;
    if (count == 0)
        return FG_OK;
    if (!p)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    if ((uintptr_t)p % es)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: %s is not aligned to its %zu-byte element", fn,
                        what, es);
    if (c->device == FG_DEVICE_CUDA) {
        fg_status s = fg_cuda_check_pointer(p, what);
        if (s != FG_OK)
            return fg_error(s, "%s: NCCL needs device buffers: %s", fn,
                            fg_last_error());
    }
    return FG_OK;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const char *x = a, *y = b;
    return na && nb && x < y + nb && y < x + na;
}

static fg_status check_op(fg_reduce_op op, const char *fn)
{
    if (op != FG_REDUCE_SUM && op != FG_REDUCE_AVG)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: unknown reduce op %d",
                        fn, (int)op);
    return FG_OK;
}

static fg_status check_rank(const fg_comm *c, int r, int allow_none,
                            const char *what, const char *fn)
{
    if ((allow_none && r == -1) || (r >= 0 && r < c->size))
        return FG_OK;
    return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s %d is not a rank of a "
                    "communicator of size %d%s", fn, what, r, c->size,
                    allow_none ? " (or -1)" : "");
}

static fg_status check_req(fg_comm_request **req, const char *fn)
{
    if (!req)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: req is NULL", fn);
    *req = NULL;
    return FG_OK;
}

/* ---- argument agreement (fg_comm_set_check_args) ------------------------------- */

enum { ARGS_ALLREDUCE = 1, ARGS_BROADCAST, ARGS_ALLGATHER, ARGS_REDUCE_SCATTER,
       ARGS_BARRIER };

/* With checking on, every rank's collective first compares (refused here?,
 * operation, count, dtype, reduction, root) with the others', so that a
 * rank whose arguments differ, or were refused, fails every rank instead
 * of leaving the others waiting or reading what was never sent. `local`
 * is this rank's validation; what it returns is the call's verdict. */
static fg_status agree(fg_comm *c, fg_status local, int kind, size_t count,
                       fg_dtype dt, int op, int root, const char *fn)
{
    if (!c || !c->check_args || c->size < 2)
        return local;
    const int64_t cap = INT64_MAX / 2; /* its negation must exist */
    const int64_t sig[6] = {local != FG_OK, kind,
                            count > (size_t)cap ? cap : (int64_t)count,
                            (int64_t)dt, op, root};
    static const char *const what[6] = {"", "operation", "count", "dtype",
                                        "reduction", "root"};
    int64_t hi[6], lo[6];
    const fg_status s = fg_mpi_args_range(c, sig, 6, hi, lo);
    if (local != FG_OK) /* its own message stands */
        return local;
    if (s != FG_OK)
        return s;
    if (hi[0])
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: another rank's arguments were refused "
                        "(argument check)", fn);
    if (hi[3] != lo[3])
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: the ranks' dtype differs, from %s to %s "
                        "(argument check)",
                        fn, fg_dtype_name((fg_dtype)lo[3]),
                        fg_dtype_name((fg_dtype)hi[3]));
    for (int i = 1; i < 6; i++)
        if (hi[i] != lo[i])
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: the ranks' %s differs, from %lld to %lld "
                            "(argument check)",
                            fn, what[i], (long long)lo[i], (long long)hi[i]);
    return FG_OK;
}

/* The MPI-only switches: fixed-order reductions and the argument check. */
static fg_status set_mpi_switch(fg_comm *c, int check, int on, const char *fn)
{
    FG_TRY(check_comm(c, fn));
    if (c->backend != FG_COMM_MPI)
        return fg_error(FG_ERR_UNSUPPORTED, "%s: %s", fn,
                        check ? "the argument check runs over MPI only"
                              : "NCCL chooses its own reduction order");
    *(check ? &c->check_args : &c->fixed_order) = on != 0;
    return FG_OK;
}

fg_status fg_comm_set_check_args(fg_comm *c, int on)
{
    return set_mpi_switch(c, 1, on, __func__);
}

/* ---- operations ---------------------------------------------------------------- */

/* Each operation's checks are a function of their own, whose verdict
 * goes through agree() before the backend runs; `pre` is what the
 * nonblocking form found of req (FG_OK for the blocking one). */
static fg_status allreduce_args(fg_comm *c, const void *send, void *recv,
                                size_t count, fg_dtype dt, fg_reduce_op op,
                                const char *fn)
{
    size_t nb;
    FG_TRY(check_comm(c, fn));
    FG_TRY(check_op(op, fn));
    FG_TRY(check_buf(c, send, count, 1, dt, "send", fn, &nb));
    FG_TRY(check_buf(c, recv, count, 1, dt, "recv", fn, NULL));
    if (send != recv && overlap(send, nb, recv, nb))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: send and recv overlap without being equal", fn);
    return FG_OK;
}

static fg_status allreduce(fg_comm *c, const void *send, void *recv,
                           size_t count, fg_dtype dt, fg_reduce_op op,
                           fg_comm_request **req, const char *fn,
                           fg_status pre)
{
    const fg_status v =
        pre ? pre : allreduce_args(c, send, recv, count, dt, op, fn);
    FG_TRY(agree(c, v, ARGS_ALLREDUCE, count, dt, op, -1, fn));
    return c->vt->allreduce(c, send, recv, count, dt, op, req);
}

fg_status fg_comm_allreduce(fg_comm *c, const void *send, void *recv,
                            size_t count, fg_dtype dt, fg_reduce_op op)
{
    return allreduce(c, send, recv, count, dt, op, NULL, __func__, FG_OK);
}

fg_status fg_comm_iallreduce(fg_comm *c, const void *send, void *recv,
                             size_t count, fg_dtype dt, fg_reduce_op op,
                             fg_comm_request **req)
{
    return allreduce(c, send, recv, count, dt, op, req, __func__,
                     check_req(req, __func__));
}

static fg_status broadcast_args(fg_comm *c, void *buf, size_t count,
                                fg_dtype dt, int root, const char *fn)
{
    FG_TRY(check_comm(c, fn));
    FG_TRY(check_rank(c, root, 0, "root", fn));
    return check_buf(c, buf, count, 1, dt, "buf", fn, NULL);
}

static fg_status broadcast(fg_comm *c, void *buf, size_t count, fg_dtype dt,
                           int root, fg_comm_request **req, const char *fn,
                           fg_status pre)
{
    const fg_status v = pre ? pre : broadcast_args(c, buf, count, dt, root, fn);
    FG_TRY(agree(c, v, ARGS_BROADCAST, count, dt, 0, root, fn));
    return c->vt->broadcast(c, buf, count, dt, root, req);
}

fg_status fg_comm_broadcast(fg_comm *c, void *buf, size_t count, fg_dtype dt,
                            int root)
{
    return broadcast(c, buf, count, dt, root, NULL, __func__, FG_OK);
}

fg_status fg_comm_ibroadcast(fg_comm *c, void *buf, size_t count, fg_dtype dt,
                             int root, fg_comm_request **req)
{
    return broadcast(c, buf, count, dt, root, req, __func__,
                     check_req(req, __func__));
}

static fg_status allgather_args(fg_comm *c, const void *send, void *recv,
                                size_t count, fg_dtype dt, const char *fn)
{
    size_t ns, nr;
    FG_TRY(check_comm(c, fn));
    FG_TRY(check_buf(c, send, count, 1, dt, "send", fn, &ns));
    FG_TRY(check_buf(c, recv, count, (size_t)c->size, dt, "recv", fn, &nr));
    const char *own = (const char *)recv + (size_t)c->rank * ns;
    if (send != own && overlap(send, ns, recv, nr))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: send overlaps recv without being recv + rank * "
                        "count (the in-place form)", fn);
    return FG_OK;
}

static fg_status allgather(fg_comm *c, const void *send, void *recv,
                           size_t count, fg_dtype dt, fg_comm_request **req,
                           const char *fn, fg_status pre)
{
    const fg_status v =
        pre ? pre : allgather_args(c, send, recv, count, dt, fn);
    FG_TRY(agree(c, v, ARGS_ALLGATHER, count, dt, 0, -1, fn));
    return c->vt->allgather(c, send, recv, count, dt, req);
}

fg_status fg_comm_allgather(fg_comm *c, const void *send, void *recv,
                            size_t count, fg_dtype dt)
{
    return allgather(c, send, recv, count, dt, NULL, __func__, FG_OK);
}

fg_status fg_comm_iallgather(fg_comm *c, const void *send, void *recv,
                             size_t count, fg_dtype dt, fg_comm_request **req)
{
    return allgather(c, send, recv, count, dt, req, __func__,
                     check_req(req, __func__));
}

static fg_status reduce_scatter_args(fg_comm *c, const void *send, void *recv,
                                     size_t count, fg_dtype dt,
                                     fg_reduce_op op, const char *fn)
{
    size_t ns, nr;
    FG_TRY(check_comm(c, fn));
    FG_TRY(check_op(op, fn));
    FG_TRY(check_buf(c, send, count, (size_t)c->size, dt, "send", fn, &ns));
    FG_TRY(check_buf(c, recv, count, 1, dt, "recv", fn, &nr));
    const char *own = (const char *)send + (size_t)c->rank * nr;
    if ((const char *)recv != own && overlap(send, ns, recv, nr))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: recv overlaps send without being send + rank * "
                        "count (the in-place form)", fn);
    return FG_OK;
}

static fg_status reduce_scatter(fg_comm *c, const void *send, void *recv,
                                size_t count, fg_dtype dt, fg_reduce_op op,
                                fg_comm_request **req, const char *fn,
                                fg_status pre)
{
    const fg_status v =
        pre ? pre : reduce_scatter_args(c, send, recv, count, dt, op, fn);
    FG_TRY(agree(c, v, ARGS_REDUCE_SCATTER, count, dt, op, -1, fn));
    return c->vt->reduce_scatter(c, send, recv, count, dt, op, req);
}

fg_status fg_comm_reduce_scatter(fg_comm *c, const void *send, void *recv,
                                 size_t count, fg_dtype dt, fg_reduce_op op)
{
    return reduce_scatter(c, send, recv, count, dt, op, NULL, __func__, FG_OK);
}

fg_status fg_comm_ireduce_scatter(fg_comm *c, const void *send, void *recv,
                                  size_t count, fg_dtype dt, fg_reduce_op op,
                                  fg_comm_request **req)
{
    return reduce_scatter(c, send, recv, count, dt, op, req, __func__,
                          check_req(req, __func__));
}

static fg_status sendrecv(fg_comm *c, const void *send, size_t send_count,
                          int dest, void *recv, size_t recv_count, int src,
                          fg_dtype dt, fg_comm_request **req, const char *fn)
{
    size_t ns, nr;
    FG_TRY(check_comm(c, fn));
    FG_TRY(check_rank(c, dest, 1, "dest", fn));
    FG_TRY(check_rank(c, src, 1, "src", fn));
    if (dest < 0)
        send_count = 0;
    if (src < 0)
        recv_count = 0;
    FG_TRY(check_buf(c, send, send_count, 1, dt, "send", fn, &ns));
    FG_TRY(check_buf(c, recv, recv_count, 1, dt, "recv", fn, &nr));
    if (overlap(send, ns, recv, nr))
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: send and recv overlap",
                        fn);
    return c->vt->sendrecv(c, send, send_count, dest, recv, recv_count, src, dt,
                           req);
}

fg_status fg_comm_sendrecv(fg_comm *c, const void *send, size_t send_count,
                           int dest, void *recv, size_t recv_count, int src,
                           fg_dtype dt)
{
    return sendrecv(c, send, send_count, dest, recv, recv_count, src, dt, NULL,
                    __func__);
}

fg_status fg_comm_isendrecv(fg_comm *c, const void *send, size_t send_count,
                            int dest, void *recv, size_t recv_count, int src,
                            fg_dtype dt, fg_comm_request **req)
{
    FG_TRY(check_req(req, __func__));
    return sendrecv(c, send, send_count, dest, recv, recv_count, src, dt, req,
                    __func__);
}

fg_status fg_comm_barrier(fg_comm *c)
{
    FG_TRY(check_comm(c, __func__));
    FG_TRY(agree(c, FG_OK, ARGS_BARRIER, 0, FG_FP32, 0, -1, __func__));
    return c->vt->barrier(c);
}

fg_status fg_comm_test(fg_comm_request *req, int *done)
{
    if (!req || !done)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "fg_comm_test: req and done must not be NULL");
    return req->comm->vt->test(req, done);
}

fg_status fg_comm_wait(fg_comm_request *req)
{
    if (!req)
        return FG_OK;
    return req->comm->vt->wait(req);
}

/* ---- properties ---------------------------------------------------------------- */

int fg_comm_rank(const fg_comm *c) { return c ? c->rank : 0; }
int fg_comm_size(const fg_comm *c) { return c ? c->size : 0; }
int fg_comm_local_rank(const fg_comm *c) { return c ? c->local_rank : 0; }
fg_comm_backend fg_comm_get_backend(const fg_comm *c)
{
    return c ? c->backend : FG_COMM_MPI;
}
fg_device fg_comm_device(const fg_comm *c)
{
    return c ? c->device : FG_DEVICE_CPU;
}
int fg_comm_cuda_device(const fg_comm *c) { return c ? c->cuda_device : -1; }

void *fg_comm_get_stream(const fg_comm *c)
{
    return c && c->backend == FG_COMM_NCCL ? fg_nccl_stream(c) : NULL;
}

fg_status fg_comm_set_fixed_order(fg_comm *c, int on)
{
    return set_mpi_switch(c, 0, on, __func__);
}

void fg_comm_free(fg_comm *c)
{
    if (!c)
        return;
    c->vt->destroy(c);
    free(c);
}

/* ---- construction ---------------------------------------------------------------- */

fg_status fg_comm_init_mpi(int *argc, char ***argv, fg_comm **out)
{
    if (!out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    return fg_mpi_comm_create(argc, argv, NULL, out);
}

fg_status fg_comm_init_mpi_comm(const void *mpi_comm, fg_comm **out)
{
    if (!out || !mpi_comm)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "mpi_comm and out must not "
                       "be NULL");
    *out = NULL;
    return fg_mpi_comm_create(NULL, NULL, mpi_comm, out);
}

fg_status fg_dist_finalize(void) { return fg_mpi_finalize(); }

static fg_status pick_device(int device, int local_rank, int *dev)
{
    int n = 0;
    FG_TRY(fg_nccl_device_count(&n));
    if (n < 1)
        return fg_error(FG_ERR_NO_DEVICE, "NCCL: no CUDA device");
    if (device >= n)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "NCCL: device %d, but only %d are visible", device, n);
    *dev = device >= 0 ? device : local_rank % n;
    return FG_OK;
}

fg_status fg_comm_init_nccl_mpi(fg_comm *mpi, int device, fg_comm **out)
{
    if (!out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    FG_TRY(check_comm(mpi, __func__));
    if (mpi->backend != FG_COMM_MPI)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "needs an MPI communicator");
    if (!fg_comm_backend_available(FG_COMM_NCCL)) /* before any collective */
        return FG_NO_NCCL(__func__);
    /* Rank 0's status travels with the id, so a failure there cannot leave
     * the other ranks waiting in NCCL. */
    _Alignas(8) unsigned char msg[FG_NCCL_ID_BYTES + 8];
    memset(msg, 0, sizeof msg);
    fg_status s = FG_OK;
    if (mpi->rank == 0) {
        s = fg_nccl_unique_id(msg + 8);
        msg[0] = (unsigned char)s;
    }
    fg_status b = fg_comm_broadcast(mpi, msg, sizeof msg / 4, FG_FP32, 0);
    if (b != FG_OK)
        return b;
    if (msg[0] != FG_OK)
        return mpi->rank == 0 ? s
                              : FG_FAIL(FG_ERR_COMM, "rank 0 could not create "
                                        "the NCCL unique id");
    int dev;
    FG_TRY(pick_device(device, mpi->local_rank, &dev));
    FG_TRY(fg_nccl_comm_create(msg + 8, mpi->rank, mpi->size, dev, out));
    (*out)->local_rank = mpi->local_rank;
    (*out)->local_size = mpi->local_size;
    return FG_OK;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rank 0's side of the file bootstrap: PATH.tmp.PID renamed into place, so
 * a reader never sees a partial id. */
static fg_status write_id(const char *path, const unsigned char *id)
{
    char tmp[4096];
    int w = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (w < 0 || (size_t)w >= sizeof tmp)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "id path too long");
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return FG_FAIL(FG_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    size_t n = fwrite(id, 1, FG_NCCL_ID_BYTES, f);
    int bad = n != FG_NCCL_ID_BYTES;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        fg_status s = FG_FAIL(FG_ERR_IO, "cannot write %s: %s", path,
                              strerror(errno));
        remove(tmp);
        return s;
    }
    return FG_OK;
}

static fg_status read_id(const char *path, double timeout_s, unsigned char *id)
{
    const double t0 = now_s();
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t n = fread(id, 1, FG_NCCL_ID_BYTES, f);
            fclose(f);
            if (n == FG_NCCL_ID_BYTES)
                return FG_OK;
        }
        if (now_s() - t0 > timeout_s)
            return FG_FAIL(FG_ERR_COMM,
                           "no NCCL id in %s after %g s (is rank 0 running, "
                           "with the same path?)", path, timeout_s);
        sleep_ms(10);
    }
}

/* Rank r's arrival file: "<id_path>.arrived.<r>", holding the id it
 * joins with, so that files a crashed earlier run left are not mistaken
 * for this run's. */
static int arrival_path(char *buf, size_t n, const char *id_path, int rank)
{
    const int w = snprintf(buf, n, "%s.arrived.%d", id_path, rank);
    return w >= 0 && (size_t)w < n;
}

fg_status fg_rendezvous_arrive(const char *id_path, int rank, int nranks,
                               const unsigned char *id, double timeout_s)
{
    char path[4096];
    if (!arrival_path(path, sizeof path, id_path, rank))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "id path too long");
    FG_TRY(write_id(path, id));
    /* Poll the others' files until each has held our id once (a rank that
     * gives up removes its file: it still counts as arrived). */
    unsigned char *seen = calloc((size_t)nranks, 1);
    if (!seen) {
        fg_rendezvous_leave(id_path, rank);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "rendezvous of %d ranks", nranks);
    }
    seen[rank] = 1;
    const double t0 = now_s();
    int missing = -1, n_missing = 0;
    for (int last = 0;;) {
        n_missing = 0;
        for (int r = 0; r < nranks; r++) {
            if (seen[r])
                continue;
            unsigned char got[FG_NCCL_ID_BYTES];
            FILE *f = arrival_path(path, sizeof path, id_path, r) ? fopen(path, "rb") : NULL;
            seen[r] = f && fread(got, 1, sizeof got, f) == sizeof got &&
                      !memcmp(got, id, sizeof got);
            if (f)
                fclose(f);
            if (!seen[r] && !n_missing++)
                missing = r;
        }
        if (!n_missing || last)
            break;
        last = now_s() - t0 > timeout_s; /* one more look after the deadline */
        if (!last)
            sleep_ms(10);
    }
    free(seen);
    if (!n_missing)
        return FG_OK;
    fg_rendezvous_leave(id_path, rank);
    return FG_FAIL(FG_ERR_COMM,
                   "rank %d: %d of %d ranks (rank %d first) did not arrive at %s "
                   "within %g s (are they running, with the same path and "
                   "world size?)", rank, n_missing, nranks, missing, id_path,
                   timeout_s);
}

void fg_rendezvous_leave(const char *id_path, int rank)
{
    char path[4096];
    if (arrival_path(path, sizeof path, id_path, rank))
        remove(path);
}

fg_status fg_comm_init_nccl_file(const char *id_path, int rank, int nranks,
                                 int device, double timeout_s, fg_comm **out)
{
    if (!out)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    if (!id_path || !*id_path || nranks < 1 || rank < 0 || rank >= nranks)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "need an id path and 0 <= rank (%d) < nranks (%d)",
                       rank, nranks);
    if (!fg_comm_backend_available(FG_COMM_NCCL))
        return FG_NO_NCCL(__func__);
    if (timeout_s <= 0)
        timeout_s = 60;
    unsigned char id[FG_NCCL_ID_BYTES];
    int dev;
    FG_TRY(pick_device(device, rank, &dev));
    if (rank == 0) {
        FG_TRY(fg_nccl_unique_id(id));
        FG_TRY(write_id(id_path, id));
    } else {
        FG_TRY(read_id(id_path, timeout_s, id));
    }
    /* Every rank waits until all have the id before NCCL's init, which
     * would wait forever for a rank that never starts (a wrong world
     * size, a crash at startup): with this the ranks fail after
     * timeout_s with the missing rank named. Left: a rank arriving just
     * as the others' time runs out can still leave some inside the init. */
    fg_status s = nranks > 1 ? fg_rendezvous_arrive(id_path, rank, nranks, id, timeout_s)
                             : FG_OK;
    if (s == FG_OK) {
        s = fg_nccl_comm_create(id, rank, nranks, dev, out);
        /* Every rank has read the id and passed the arrival check once
         * its init returns (the init needs all of them). */
        if (nranks > 1)
            fg_rendezvous_leave(id_path, rank);
    }
    if (rank == 0)
        remove(id_path);
    return s;
}

fg_status fg_comm_init_nccl_devices(const int *devices, int n, fg_comm **comms)
{
    if (!devices || n < 1 || !comms)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "need n >= 1 devices and "
                       "room for n communicators");
    for (int i = 0; i < n; i++)
        comms[i] = NULL;
    return fg_nccl_comm_create_all(devices, n, comms);
}

fg_status fg_comm_group_start(void) { return fg_nccl_group(1); }
fg_status fg_comm_group_end(void) { return fg_nccl_group(0); }

fg_status fg_comm_allreduce_host_f64(fg_comm *c, double *x, int n,
                                     fg_reduce_op op)
{
    if (c->device == FG_DEVICE_CPU)
        return fg_comm_allreduce(c, x, x, (size_t)n, FG_FP64, op);
#ifdef FG_HAVE_CUDA
    if (fg_nccl_stream(c))
        return FG_FAIL(FG_ERR_UNSUPPORTED, "a communicator with its own "
                       "stream (one of several GPUs of a process)");
    void *d = NULL;
    const size_t nb = sizeof(double) * (size_t)n;
    FG_TRY(fg_cuda_mem_alloc(nb, &d));
    fg_status s = fg_cuda_memcpy_h2d(d, x, nb);
    if (s == FG_OK)
        s = fg_comm_allreduce(c, d, d, (size_t)n, FG_FP64, op);
    if (s == FG_OK) /* waits for the reduction: same stream */
        s = fg_cuda_memcpy_d2h(x, d, nb);
    fg_cuda_mem_free(d, nb);
    return s;
#else
    return FG_NO_CUDA(__func__);
#endif
}
