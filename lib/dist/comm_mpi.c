/* SPDX-License-Identifier: MIT */
/* lib/dist/comm_mpi.c - the MPI backend of the communicator (CPU buffers).
 *
 * Plain operations are MPI's nonblocking collectives (MPI_Iallreduce, ...);
 * a blocking call is the nonblocking one plus its wait. fp16/bf16
 * reductions go through an fp32 copy (MPI has no such types) and are
 * rounded once at the end; AVG is SUM then a division by the size.
 *
 * Fixed-order reductions (fg_comm_set_fixed_order, the default) are a
 * reduce-scatter in rank order plus an all-gather, made of point-to-point
 * messages: rank r receives block r of every rank, sums the blocks in rank
 * order 0, 1, ..., N-1 (so the sum is the sequential ((x0 + x1) + x2) ...)
 * and sends its result to every rank. Point-to-point, not MPI collectives,
 * because the request advances its own second phase from fg_comm_test: a
 * collective started there could be issued in a different order on
 * different ranks, which MPI forbids; tagged messages match by tag. */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "lib/autograd/tensor_internal.h"
#include "lib/core/error.h"

/* Record the failing MPI call (file, line, MPI's message) as FG_ERR_COMM. */
static fg_status mpi_fail(int rc, const char *call, const char *file,
                          int line)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    return fg_error(FG_ERR_COMM, "%s:%d: %s failed: %s", file, line, call,
                    msg);
}

#define FG_MPI_TRY(call)                                                    \
    do {                                                                    \
        int fg_mpi_rc_ = (call);                                            \
        if (fg_mpi_rc_ != MPI_SUCCESS)                                      \
            return mpi_fail(fg_mpi_rc_, #call, __FILE__, __LINE__);         \
    } while (0)

/* Tag 0: sendrecv; fixed-order phases use 1 .. tag_ub. */
#define TAG_SENDRECV 0

typedef struct mpi_impl {
    MPI_Comm comm;
    unsigned long seq; /* fixed-order operations so far: their tags */
    int tag_ub;
} mpi_impl;

static int g_initialized_by_us; /* MPI_Init was ours */
static int g_live;              /* communicators alive */

static MPI_Comm comm_of(const fg_comm *c)
{
    return ((const mpi_impl *)c->impl)->comm;
}

static MPI_Datatype mpi_type(fg_dtype dt)
{
    switch (dt) {
    case FG_FP64: return MPI_DOUBLE;
    case FG_FP16:
    case FG_BF16: return MPI_UINT16_T; /* moved, never reduced, as is */
    default: return MPI_FLOAT;
    }
}

static int is_half(fg_dtype dt) { return dt == FG_FP16 || dt == FG_BF16; }

static fg_status check_count(size_t n, const char *fn)
{
    if (n > INT_MAX)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: %zu elements in one MPI message (at most %d; use "
                        "smaller buckets or buffers)", fn, n, INT_MAX);
    return FG_OK;
}

/* ---- fp16 / bf16 staging ----------------------------------------------------- */

static void to_f32(float *dst, const void *src, size_t n, fg_dtype dt)
{
    const uint16_t *h = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = dt == FG_FP16 ? fg_half_to_float(h[i]) : fg_bf16_to_float(h[i]);
}

static void from_f32(void *dst, const float *src, size_t n, fg_dtype dt)
{
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++)
        h[i] = dt == FG_FP16 ? fg_float_to_half(src[i]) : fg_float_to_bf16(src[i]);
}

/* x /= n in the working type (fp32 or fp64). */
static void divide(void *x, size_t count, int f64, int n)
{
    if (f64) {
        double *p = x;
        for (size_t i = 0; i < count; i++)
            p[i] /= n;
    } else {
        float *p = x;
        for (size_t i = 0; i < count; i++)
            p[i] /= (float)n;
    }
}

/* ---- requests -------------------------------------------------------------------- */

enum { K_PLAIN, K_FIXED };

typedef struct mpi_req {
    fg_comm_request base;
    int kind;
    int phase;   /* K_FIXED: 0 exchange blocks, 1 gather results, 2 done */
    int gather;  /* K_FIXED: all-reduce (1) or reduce-scatter (0) */
    int done;
    MPI_Request *reqs;
    int nreq;
    /* the operation */
    fg_dtype dt;
    fg_reduce_op op;
    size_t count;  /* all-reduce: elements; reduce-scatter: per rank */
    void *recv;    /* the caller's result */
    /* working buffers (fp32 for fp32/fp16/bf16, fp64 for fp64) */
    int f64;
    void *work;    /* result in the working type, when not recv itself */
    size_t work_n;
    const void *src; /* K_FIXED: the contribution, in the working type */
    float *staged;   /* fp32 copy of an fp16/bf16 contribution (owned) */
    void *blocks;    /* K_FIXED: N received blocks */
    size_t chunk;    /* K_FIXED: elements per block */
    int tag;
} mpi_req;

static mpi_req *req_new(fg_comm *c, int kind, int max_reqs)
{
    mpi_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->base.comm = c;
    r->kind = kind;
    r->reqs = calloc((size_t)(max_reqs > 0 ? max_reqs : 1), sizeof *r->reqs);
    if (!r->reqs) {
        free(r);
        return NULL;
    }
    return r;
}

static void req_free(mpi_req *r)
{
    if (!r)
        return;
    /* After a failed wait some transfers may still be active (a peer that
     * sent or expected other sizes): MPI may yet write into their buffers,
     * and a cancelled send can wait forever, so those buffers are leaked
     * rather than freed under it. */
    int active = 0;
    for (int i = 0; i < r->nreq; i++)
        active |= r->reqs[i] != MPI_REQUEST_NULL;
    free(r->reqs);
    if (!active) {
        free(r->work);
        free(r->blocks);
        free(r->staged);
    }
    free(r);
}

static size_t wsize(const mpi_req *r) { return r->f64 ? 8 : 4; }

static char *at(const void *p, size_t i, size_t es)
{
    return (char *)p + i * es;
}

/* Fixed order: block j of the contribution is [j * chunk, ...) clipped to
 * the buffer. */
static size_t block_len(const mpi_req *r, int j)
{
    const size_t total = r->gather ? r->count : r->count * (size_t)
                                                    r->base.comm->size;
    const size_t b = (size_t)j * r->chunk;
    return b >= total ? 0 : (total - b < r->chunk ? total - b : r->chunk);
}

static fg_status fixed_exchange(mpi_req *r)
{
    fg_comm *c = r->base.comm;
    mpi_impl *im = c->impl;
    MPI_Comm comm = im->comm;
    const MPI_Datatype t = r->f64 ? MPI_DOUBLE : MPI_FLOAT;
    const size_t es = wsize(r), mine = block_len(r, c->rank);
    r->nreq = 0;
    for (int j = 0; j < c->size; j++) {
        if (j == c->rank)
            continue;
        FG_MPI_TRY(MPI_Irecv(at(r->blocks, (size_t)j * r->chunk, es),
                             (int)mine, t, j, r->tag, comm,
                             &r->reqs[r->nreq++]));
        FG_MPI_TRY(MPI_Isend(at(r->src, (size_t)j * r->chunk, es),
                             (int)block_len(r, j), t, j, r->tag, comm,
                             &r->reqs[r->nreq++]));
    }
    return FG_OK;
}

/* Sum this rank's block over the ranks, in rank order, into dst. */
#define SUM_BLOCKS(T)                                                       \
    do {                                                                    \
        T *d = dst;                                                         \
        for (size_t e = 0; e < n; e++) {                                    \
            T acc = 0;                                                      \
            for (int j = 0; j < c->size; j++) {                             \
                const T *x = j == c->rank ? (const T *)own                  \
                                          : (const T *)r->blocks +          \
                                                (size_t)j * r->chunk;       \
                acc = j == 0 ? x[e] : acc + x[e];                           \
            }                                                               \
            d[e] = acc;                                                     \
        }                                                                   \
    } while (0)

static void fixed_reduce(mpi_req *r, void *dst)
{
    fg_comm *c = r->base.comm;
    const size_t n = block_len(r, c->rank), es = wsize(r);
    const void *own = at(r->src, (size_t)c->rank * r->chunk, es);
    if (r->f64)
        SUM_BLOCKS(double);
    else
        SUM_BLOCKS(float);
    if (r->op == FG_REDUCE_AVG)
        divide(dst, n, r->f64, c->size);
}

static fg_status fixed_gather(mpi_req *r, void *res)
{
    fg_comm *c = r->base.comm;
    MPI_Comm comm = comm_of(c);
    const MPI_Datatype t = r->f64 ? MPI_DOUBLE : MPI_FLOAT;
    const size_t es = wsize(r);
    r->nreq = 0;
    for (int j = 0; j < c->size; j++) {
        if (j == c->rank)
            continue;
        FG_MPI_TRY(MPI_Irecv(at(res, (size_t)j * r->chunk, es),
                             (int)block_len(r, j), t, j, r->tag + 1, comm,
                             &r->reqs[r->nreq++]));
        FG_MPI_TRY(MPI_Isend(at(res, (size_t)c->rank * r->chunk, es),
                             (int)block_len(r, c->rank), t, j, r->tag + 1,
                             comm, &r->reqs[r->nreq++]));
    }
    return FG_OK;
}

/* The messages of the current phase have completed: do what follows. */
static fg_status finish_phase(mpi_req *r)
{
    fg_comm *c = r->base.comm;
    if (r->kind == K_PLAIN) {
        /* work holds the result in the working type when recv cannot. */
        void *res = r->work ? r->work : r->recv;
        if (r->op == FG_REDUCE_AVG)
            divide(res, r->work_n, r->f64, c->size);
        if (r->work && is_half(r->dt))
            from_f32(r->recv, r->work, r->work_n, r->dt);
        else if (r->work)
            memcpy(r->recv, r->work, r->work_n * wsize(r));
        r->done = 1;
        return FG_OK;
    }
    if (r->phase == 0) {
        /* All-reduce: the result is assembled in recv (or, for fp16/bf16,
         * in the fp32 work buffer); reduce-scatter: straight into recv or
         * the work buffer. Element-wise sums read block e of every source
         * before writing it, so the in-place forms are safe. */
        const size_t es = wsize(r);
        void *res = r->work ? r->work : r->recv;
        void *dst = r->gather ? at(res, (size_t)c->rank * r->chunk, es) : res;
        fixed_reduce(r, dst);
        if (r->gather) {
            r->phase = 1;
            return fixed_gather(r, res);
        }
    }
    if (r->work && is_half(r->dt))
        from_f32(r->recv, r->work, r->work_n, r->dt);
    r->phase = 2;
    r->done = 1;
    return FG_OK;
}

static fg_status advance(mpi_req *r, int block)
{
    while (!r->done) {
        if (r->nreq > 0) {
            if (block) {
                FG_MPI_TRY(MPI_Waitall(r->nreq, r->reqs, MPI_STATUSES_IGNORE));
            } else {
                int flag = 0;
                FG_MPI_TRY(MPI_Testall(r->nreq, r->reqs, &flag,
                                       MPI_STATUSES_IGNORE));
                if (!flag)
                    return FG_OK;
            }
            r->nreq = 0;
        }
        FG_TRY(finish_phase(r));
    }
    return FG_OK;
}

static fg_status mpi_test(fg_comm_request *q, int *done)
{
    mpi_req *r = (mpi_req *)q;
    FG_TRY(advance(r, 0));
    *done = r->done;
    return FG_OK;
}

static fg_status mpi_wait(fg_comm_request *q)
{
    mpi_req *r = (mpi_req *)q;
    fg_status s = advance(r, 1);
    req_free(r);
    return s;
}

/* Hands the request out, or (blocking form) completes it. */
static fg_status issue(mpi_req *r, fg_status s, fg_comm_request **req)
{
    if (s != FG_OK) {
        req_free(r);
        return s;
    }
    if (req) {
        *req = &r->base;
        return FG_OK;
    }
    return mpi_wait(&r->base);
}

/* ---- fixed-order reductions ------------------------------------------------------ */

static fg_status fixed_start(fg_comm *c, const void *send, void *recv,
                             size_t count, fg_dtype dt, fg_reduce_op op,
                             int gather, fg_comm_request **req)
{
    mpi_impl *im = c->impl;
    const int N = c->size;
    mpi_req *r = req_new(c, K_FIXED, 2 * N);
    if (!r)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "request");
    r->gather = gather;
    r->dt = dt;
    r->op = op;
    r->count = count;
    r->recv = recv;
    r->f64 = dt == FG_FP64;
    const size_t total = gather ? count : count * (size_t)N;
    r->chunk = gather ? (count + (size_t)N - 1) / (size_t)N : count;
    /* Two tags per operation, the same sequence on every rank. */
    r->tag = 1 + (int)(2 * (im->seq++ % (unsigned long)((im->tag_ub - 1) / 2)));
    fg_status s = FG_OK;
    const size_t es = wsize(r);
    if (is_half(dt)) {
        /* Result (count elements either way) and contribution in fp32. */
        r->work_n = count;
        r->work = malloc(r->work_n * sizeof(float) + 1);
        r->staged = malloc(total * sizeof(float) + 1);
        if (!r->staged || !r->work)
            return issue(r, FG_FAIL(FG_ERR_OUT_OF_MEMORY, "fp32 staging"),
                         req);
        to_f32(r->staged, send, total, dt);
        r->src = r->staged;
    } else {
        r->src = send;
    }
    r->blocks = malloc((size_t)N * r->chunk * es + 1);
    if (!r->blocks)
        s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "%zu bytes of receive blocks",
                    (size_t)N * r->chunk * es);
    if (s == FG_OK)
        s = fixed_exchange(r);
    return issue(r, s, req);
}

/* ---- operations -------------------------------------------------------------------- */

/* A request for one of MPI's reductions, with count result elements. */
static mpi_req *reduction_req(fg_comm *c, void *recv, size_t count,
                              fg_dtype dt, fg_reduce_op op)
{
    mpi_req *r = req_new(c, K_PLAIN, 1);
    if (!r)
        return NULL;
    r->dt = dt;
    r->op = op;
    r->recv = recv;
    r->f64 = dt == FG_FP64;
    r->work_n = count;
    return r;
}

static fg_status mpi_allreduce(fg_comm *c, const void *send, void *recv,
                               size_t count, fg_dtype dt, fg_reduce_op op,
                               fg_comm_request **req)
{
    FG_TRY(check_count(count, "fg_comm_allreduce"));
    if (c->fixed_order && c->size > 1)
        return fixed_start(c, send, recv, count, dt, op, 1, req);
    mpi_req *r = reduction_req(c, recv, count, dt, op);
    if (!r)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "request");
    const void *sbuf = send == recv ? MPI_IN_PLACE : send;
    void *rbuf = recv;
    if (is_half(dt)) {
        r->work = malloc(count * sizeof(float) + 1);
        if (!r->work)
            return issue(r, FG_FAIL(FG_ERR_OUT_OF_MEMORY, "fp32 staging"), req);
        to_f32(r->work, send, count, dt);
        sbuf = MPI_IN_PLACE;
        rbuf = r->work;
    }
    const MPI_Datatype t = r->f64 ? MPI_DOUBLE : MPI_FLOAT;
    int rc = MPI_Iallreduce(sbuf, rbuf, (int)count, t, MPI_SUM, comm_of(c),
                            &r->reqs[0]);
    r->nreq = 1;
    fg_status s = rc == MPI_SUCCESS ? FG_OK
                                    : mpi_fail(rc, "MPI_Iallreduce", __FILE__,
                                               __LINE__);
    return issue(r, s, req);
}

static fg_status mpi_reduce_scatter(fg_comm *c, const void *send, void *recv,
                                    size_t count, fg_dtype dt,
                                    fg_reduce_op op, fg_comm_request **req)
{
    FG_TRY(check_count(count * (size_t)c->size, "fg_comm_reduce_scatter"));
    if (c->fixed_order && c->size > 1)
        return fixed_start(c, send, recv, count, dt, op, 0, req);
    mpi_req *r = reduction_req(c, recv, count, dt, op);
    if (!r)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "request");
    const size_t total = count * (size_t)c->size;
    const void *sbuf = send;
    void *rbuf = recv;
    /* MPI wants distinct buffers: the in-place form and fp16/bf16 receive
     * into a working copy. */
    const size_t es = r->f64 ? 8 : 4;
    const int in_place = (const char *)recv ==
                         (const char *)send + (size_t)c->rank * count *
                                                  fg_dtype_size(dt);
    if (in_place || is_half(dt)) {
        r->work = malloc(count * es + 1);
        if (!r->work)
            return issue(r, FG_FAIL(FG_ERR_OUT_OF_MEMORY, "work buffer"), req);
        rbuf = r->work;
    }
    if (is_half(dt)) {
        r->staged = malloc(total * sizeof(float) + 1);
        if (!r->staged)
            return issue(r, FG_FAIL(FG_ERR_OUT_OF_MEMORY, "fp32 staging"), req);
        to_f32(r->staged, send, total, dt);
        sbuf = r->staged;
    }
    const MPI_Datatype t = r->f64 ? MPI_DOUBLE : MPI_FLOAT;
    int rc = MPI_Ireduce_scatter_block(sbuf, rbuf, (int)count, t, MPI_SUM,
                                       comm_of(c), &r->reqs[0]);
    r->nreq = 1;
    fg_status s = rc == MPI_SUCCESS ? FG_OK
                                    : mpi_fail(rc, "MPI_Ireduce_scatter_block",
                                               __FILE__, __LINE__);
    return issue(r, s, req);
}

/* Operations without arithmetic: one request, nothing to do at the end. */
static fg_status plain(fg_comm *c, int rc, const char *call, mpi_req *r,
                       fg_comm_request **req)
{
    fg_status s = rc == MPI_SUCCESS ? FG_OK
                                    : mpi_fail(rc, call, __FILE__, __LINE__);
    return issue(r, s, req);
}

static fg_status mpi_broadcast(fg_comm *c, void *buf, size_t count,
                               fg_dtype dt, int root, fg_comm_request **req)
{
    FG_TRY(check_count(count, "fg_comm_broadcast"));
    mpi_req *r = req_new(c, K_PLAIN, 1);
    if (!r)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "request");
    r->op = FG_REDUCE_SUM;
    r->nreq = 1;
    return plain(c, MPI_Ibcast(buf, (int)count, mpi_type(dt), root,
                               comm_of(c), &r->reqs[0]),
                 "MPI_Ibcast", r, req);
}

static fg_status mpi_allgather(fg_comm *c, const void *send, void *recv,
                               size_t count, fg_dtype dt,
                               fg_comm_request **req)
{
    FG_TRY(check_count(count * (size_t)c->size, "fg_comm_allgather"));
    mpi_req *r = req_new(c, K_PLAIN, 1);
    if (!r)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "request");
    r->op = FG_REDUCE_SUM;
    r->nreq = 1;
    const int in_place = (const char *)send ==
                         (const char *)recv + (size_t)c->rank * count *
                                                  fg_dtype_size(dt);
    const MPI_Datatype t = mpi_type(dt);
    return plain(c, MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)count,
                                   t, recv, (int)count, t, comm_of(c),
                                   &r->reqs[0]),
                 "MPI_Iallgather", r, req);
}

static fg_status mpi_sendrecv(fg_comm *c, const void *send, size_t send_count,
                              int dest, void *recv, size_t recv_count, int src,
                              fg_dtype dt, fg_comm_request **req)
{
    FG_TRY(check_count(send_count, "fg_comm_sendrecv"));
    FG_TRY(check_count(recv_count, "fg_comm_sendrecv"));
    mpi_req *r = req_new(c, K_PLAIN, 2);
    if (!r)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "request");
    r->op = FG_REDUCE_SUM;
    const MPI_Datatype t = mpi_type(dt);
    int rc = MPI_SUCCESS;
    const char *call = "MPI_Irecv";
    if (src >= 0)
        rc = MPI_Irecv(recv, (int)recv_count, t, src, TAG_SENDRECV,
                       comm_of(c), &r->reqs[r->nreq++]);
    if (rc == MPI_SUCCESS && dest >= 0) {
        call = "MPI_Isend";
        rc = MPI_Isend(send, (int)send_count, t, dest, TAG_SENDRECV,
                       comm_of(c), &r->reqs[r->nreq++]);
    }
    return plain(c, rc, call, r, req);
}

static fg_status mpi_barrier(fg_comm *c)
{
    FG_MPI_TRY(MPI_Barrier(comm_of(c)));
    return FG_OK;
}

static void mpi_destroy(fg_comm *c)
{
    mpi_impl *im = c->impl;
    if (!im)
        return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Comm_free(&im->comm);
    free(im);
    c->impl = NULL;
    g_live--;
}

static const fg_comm_vtable mpi_vt = {
    mpi_allreduce, mpi_broadcast, mpi_allgather, mpi_reduce_scatter,
    mpi_sendrecv,  mpi_barrier,   mpi_test,      mpi_wait,
    mpi_destroy,
};

/* ---- construction ---------------------------------------------------------------- */

static fg_status ensure_init(int *argc, char ***argv)
{
    int inited = 0, fin = 0;
    FG_MPI_TRY(MPI_Finalized(&fin));
    if (fin)
        return FG_FAIL(FG_ERR_STATE, "MPI was already finalised");
    FG_MPI_TRY(MPI_Initialized(&inited));
    if (inited)
        return FG_OK;
    int provided = 0;
    FG_MPI_TRY(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    g_initialized_by_us = 1;
    /* Our MPI: errors come back as statuses (an MPI error that Open MPI
     * raises on the world communicator would otherwise abort the job);
     * an application that initialised MPI keeps its own handler. */
    FG_MPI_TRY(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    return FG_OK;
}

static fg_status setup(fg_comm *c, MPI_Comm comm)
{
    mpi_impl *im = c->impl;
    FG_MPI_TRY(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    FG_MPI_TRY(MPI_Comm_rank(comm, &c->rank));
    FG_MPI_TRY(MPI_Comm_size(comm, &c->size));
    /* Ranks on this host, for picking a GPU. */
    MPI_Comm node;
    FG_MPI_TRY(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, c->rank,
                                   MPI_INFO_NULL, &node));
    int rc = MPI_Comm_rank(node, &c->local_rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(node, &c->local_size);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Comm_rank/size(node)", __FILE__, __LINE__);
    void *ub = NULL;
    int flag = 0;
    FG_MPI_TRY(MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag));
    im->tag_ub = flag && ub ? *(int *)ub : 32767;
    return FG_OK;
}

fg_status fg_mpi_comm_create(int *argc, char ***argv, const void *mpi_comm,
                             fg_comm **out)
{
    if (mpi_comm) {
        int inited = 0;
        FG_MPI_TRY(MPI_Initialized(&inited));
        if (!inited)
            return FG_FAIL(FG_ERR_STATE, "MPI is not initialised");
    } else {
        FG_TRY(ensure_init(argc, argv));
    }
    fg_comm *c = fg_comm_alloc(&mpi_vt, FG_COMM_MPI, FG_DEVICE_CPU, 0, 1);
    mpi_impl *im = calloc(1, sizeof *im);
    if (!c || !im) {
        free(c);
        free(im);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "communicator");
    }
    c->impl = im;
    c->fixed_order = 1;
    /* FG_DIST_CHECK=1: every collective compares its arguments across the
     * ranks first (fg_comm_set_check_args), like a debug mode; agreed on
     * below, so that one rank's environment cannot make the mismatch. */
    const char *chk = getenv("FG_DIST_CHECK");
    c->check_args = chk && chk[0] && strcmp(chk, "0") != 0;
    const MPI_Comm base = mpi_comm ? *(const MPI_Comm *)mpi_comm
                                   : MPI_COMM_WORLD;
    int rc = MPI_Comm_dup(base, &im->comm);
    if (rc != MPI_SUCCESS) {
        free(im);
        free(c);
        return mpi_fail(rc, "MPI_Comm_dup", __FILE__, __LINE__);
    }
    g_live++;
    fg_status s = setup(c, im->comm);
    if (s == FG_OK) {
        rc = MPI_Allreduce(MPI_IN_PLACE, &c->check_args, 1, MPI_INT, MPI_MAX,
                           im->comm);
        if (rc != MPI_SUCCESS)
            s = mpi_fail(rc, "MPI_Allreduce", __FILE__, __LINE__);
    }
    if (s != FG_OK) {
        fg_comm_free(c);
        return s;
    }
    *out = c;
    return FG_OK;
}

fg_status fg_mpi_args_range(fg_comm *c, const int64_t *sig, int n,
                            int64_t *hi, int64_t *lo)
{
    if (n < 1 || n > 8)
        return FG_FAIL(FG_ERR_INTERNAL, "fg_mpi_args_range: n = %d", n);
    const mpi_impl *im = c->impl;
    int64_t in[16], out[16]; /* the values, then their negations: one MAX */
    for (int i = 0; i < n; i++) {
        in[i] = sig[i];
        in[n + i] = -sig[i];
    }
    FG_MPI_TRY(MPI_Allreduce(in, out, 2 * n, MPI_INT64_T, MPI_MAX, im->comm));
    for (int i = 0; i < n; i++) {
        hi[i] = out[i];
        lo[i] = -out[n + i];
    }
    return FG_OK;
}

fg_status fg_mpi_finalize(void)
{
    int fin = 0;
    FG_MPI_TRY(MPI_Finalized(&fin));
    if (!g_initialized_by_us || fin)
        return FG_OK;
    if (g_live > 0)
        return FG_FAIL(FG_ERR_STATE, "%d communicator(s) still alive: "
                       "fg_comm_free them first", g_live);
    FG_MPI_TRY(MPI_Finalize());
    return FG_OK;
}
