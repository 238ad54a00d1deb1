/* SPDX-License-Identifier: MIT */
/* kernels/dist/comm_nccl.cu - the NCCL backend of the communicator (CUDA
 * buffers). Host code only; compiled by nvcc with the other CUDA files so
 * it moves with them. The bootstraps that need no CUDA (unique id over MPI
 * or a file) are in lib/dist/comm.c.
 *
 * Streams: a communicator of a one-GPU process orders its work on the
 * flashgrad context stream (fg_cuda_stream() at call time); one of several
 * GPUs driven by one process has its own stream. Blocking operations are
 * enqueued there. Nonblocking ones run on a side stream that first waits
 * for an event recorded on the main stream (so they see the work enqueued
 * before them) and record an event that fg_comm_wait makes the main
 * stream wait for: communication overlaps the kernels enqueued meanwhile. */
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdlib.h>
#include <string.h>

#include "lib/dist/comm_internal.h"
#include "kernels/runtime/cuda_check.h"
#include "kernels/runtime/cuda_context.h"

static_assert(sizeof(ncclUniqueId) == FG_NCCL_ID_BYTES,
              "FG_NCCL_ID_BYTES must be sizeof(ncclUniqueId)");

/* NCCL result -> FG_ERR_COMM with file, line, call and NCCL's messages. */
static fg_status nccl_fail(ncclResult_t r, const char *call, const char *file,
                           int line, ncclComm_t comm)
{
    const char *last = ncclGetLastError(comm);
    return fg_error(FG_ERR_COMM, "%s:%d: %s failed: %s%s%s", file, line, call,
                    ncclGetErrorString(r), last && *last ? ": " : "",
                    last ? last : "");
}

#define FG_NCCL_TRY(comm, call)                                             \
    do {                                                                    \
        ncclResult_t fg_nc_r_ = (call);                                     \
        if (fg_nc_r_ != ncclSuccess)                                        \
            return nccl_fail(fg_nc_r_, #call, __FILE__, __LINE__, (comm));  \
    } while (0)

namespace {

struct NcclImpl {
    ncclComm_t comm;
    int device;
    cudaStream_t own;  /* multi-GPU process: this rank's stream; else null */
    cudaStream_t side; /* nonblocking operations */
    float *scratch;    /* barrier */
};

struct NcclReq {
    fg_comm_request base;
    cudaEvent_t done;
    cudaStream_t main;
};

int g_group_depth; /* fg_comm_group_start nesting */

NcclImpl *impl(const fg_comm *c) { return (NcclImpl *)c->impl; }

cudaStream_t main_stream(const NcclImpl *im)
{
    return im->own ? im->own : fg_cuda_stream();
}

ncclDataType_t nccl_type(fg_dtype dt)
{
    switch (dt) {
    case FG_FP64: return ncclFloat64;
    case FG_FP16: return ncclFloat16;
    case FG_BF16: return ncclBfloat16;
    default: return ncclFloat32;
    }
}

ncclRedOp_t nccl_op(fg_reduce_op op)
{
    return op == FG_REDUCE_AVG ? ncclAvg : ncclSum;
}

/* Makes the communicator's device current for one call (a process driving
 * several GPUs switches between them) and restores the previous one. */
struct DeviceGuard {
    int prev = -1;
    fg_status s = FG_OK;
    explicit DeviceGuard(const NcclImpl *im)
    {
        if (!im->own)
            return; /* one-GPU process: already current */
        cudaError_t e = cudaGetDevice(&prev);
        if (e == cudaSuccess)
            e = cudaSetDevice(im->device);
        if (e != cudaSuccess)
            s = fg_cuda_status(e, "cudaSetDevice", __FILE__, __LINE__);
    }
    ~DeviceGuard()
    {
        if (prev >= 0)
            cudaSetDevice(prev);
    }
};

/* The stream an operation goes on; for the nonblocking form the side
 * stream, after the main stream's work, with a new request. */
fg_status begin(fg_comm *c, fg_comm_request **req, cudaStream_t *st)
{
    NcclImpl *im = impl(c);
    cudaStream_t main = main_stream(im);
    if (!req) {
        *st = main;
        return FG_OK;
    }
    if (g_group_depth > 0)
        return fg_error(FG_ERR_STATE, "NCCL: nonblocking operations cannot "
                        "be grouped (use the blocking forms in a group)");
    NcclReq *r = (NcclReq *)calloc(1, sizeof *r);
    if (!r)
        return fg_error(FG_ERR_OUT_OF_MEMORY, "NCCL request");
    r->base.comm = c;
    r->main = main;
    cudaEvent_t ready;
    cudaError_t e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventRecord(ready, main);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(im->side, ready, 0);
        cudaEventDestroy(ready); /* the wait above is already enqueued */
    }
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(r);
        return fg_cuda_status(e, "cudaEventCreate/Record/StreamWaitEvent",
                              __FILE__, __LINE__);
    }
    *req = &r->base;
    *st = im->side;
    return FG_OK;
}

/* After the operation was enqueued (or failed to be). */
fg_status end(fg_comm_request **req, fg_status s)
{
    if (!req || !*req)
        return s;
    NcclReq *r = (NcclReq *)*req;
    if (s == FG_OK) {
        cudaError_t e = cudaEventRecord(r->done, impl(r->base.comm)->side);
        if (e == cudaSuccess)
            return FG_OK;
        s = fg_cuda_status(e, "cudaEventRecord", __FILE__, __LINE__);
    }
    cudaEventDestroy(r->done);
    free(r);
    *req = NULL;
    return s;
}

fg_status async_error(const NcclImpl *im)
{
    ncclResult_t ar = ncclSuccess;
    FG_NCCL_TRY(im->comm, ncclCommGetAsyncError(im->comm, &ar));
    if (ar != ncclSuccess && ar != ncclInProgress)
        return nccl_fail(ar, "NCCL (asynchronous)", __FILE__, __LINE__,
                         im->comm);
    return FG_OK;
}

} // namespace

/* ---- operations ---------------------------------------------------------------- */

#define NCCL_OP(call)                                                       \
    do {                                                                    \
        NcclImpl *im = impl(c);                                             \
        DeviceGuard g(im);                                                  \
        if (g.s != FG_OK)                                                   \
            return g.s;                                                     \
        cudaStream_t st;                                                    \
        FG_TRY(begin(c, req, &st));                                         \
        fg_status s = FG_OK;                                                \
        ncclResult_t r_ = (call);                                           \
        if (r_ != ncclSuccess)                                              \
            s = nccl_fail(r_, #call, __FILE__, __LINE__, im->comm);         \
        return end(req, s);                                                 \
    } while (0)

static fg_status n_allreduce(fg_comm *c, const void *send, void *recv,
                             size_t count, fg_dtype dt, fg_reduce_op op,
                             fg_comm_request **req)
{
    NCCL_OP(ncclAllReduce(send, recv, count, nccl_type(dt), nccl_op(op),
                          im->comm, st));
}

static fg_status n_broadcast(fg_comm *c, void *buf, size_t count, fg_dtype dt,
                             int root, fg_comm_request **req)
{
    NCCL_OP(ncclBroadcast(buf, buf, count, nccl_type(dt), root, im->comm, st));
}

static fg_status n_allgather(fg_comm *c, const void *send, void *recv,
                             size_t count, fg_dtype dt, fg_comm_request **req)
{
    NCCL_OP(ncclAllGather(send, recv, count, nccl_type(dt), im->comm, st));
}

static fg_status n_reduce_scatter(fg_comm *c, const void *send, void *recv,
                                  size_t count, fg_dtype dt, fg_reduce_op op,
                                  fg_comm_request **req)
{
    NCCL_OP(ncclReduceScatter(send, recv, count, nccl_type(dt), nccl_op(op),
                              im->comm, st));
}

/* Send and receive as one NCCL group, so neither waits for the other. */
static ncclResult_t send_recv(const void *send, size_t sc, int dest,
                              void *recv, size_t rc, int src, fg_dtype dt,
                              ncclComm_t comm, cudaStream_t st)
{
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess)
        return r;
    if (dest >= 0)
        r = ncclSend(send, sc, nccl_type(dt), dest, comm, st);
    if (r == ncclSuccess && src >= 0)
        r = ncclRecv(recv, rc, nccl_type(dt), src, comm, st);
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

static fg_status n_sendrecv(fg_comm *c, const void *send, size_t send_count,
                            int dest, void *recv, size_t recv_count, int src,
                            fg_dtype dt, fg_comm_request **req)
{
    NCCL_OP(send_recv(send, send_count, dest, recv, recv_count, src, dt,
                      im->comm, st));
}

static fg_status n_barrier(fg_comm *c)
{
    NcclImpl *im = impl(c);
    DeviceGuard g(im);
    if (g.s != FG_OK)
        return g.s;
    cudaStream_t st = main_stream(im);
    FG_NCCL_TRY(im->comm, ncclAllReduce(im->scratch, im->scratch, 1,
                                        ncclFloat32, ncclSum, im->comm, st));
    FG_CUDA_TRY(cudaStreamSynchronize(st));
    return async_error(im);
}

static fg_status n_test(fg_comm_request *q, int *done)
{
    NcclReq *r = (NcclReq *)q;
    cudaError_t e = cudaEventQuery(r->done);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return async_error(impl(q->comm));
    }
    FG_CUDA_TRY(e);
    *done = 1;
    return FG_OK;
}

static fg_status n_wait(fg_comm_request *q)
{
    NcclReq *r = (NcclReq *)q;
    NcclImpl *im = impl(q->comm);
    cudaError_t e = cudaStreamWaitEvent(r->main, r->done, 0);
    cudaEventDestroy(r->done);
    free(r);
    FG_CUDA_TRY(e);
    return async_error(im);
}

static void n_destroy(fg_comm *c)
{
    NcclImpl *im = impl(c);
    if (!im)
        return;
    DeviceGuard g(im);
    if (im->side) {
        cudaStreamSynchronize(im->side);
        cudaStreamDestroy(im->side);
    }
    if (im->own) {
        cudaStreamSynchronize(im->own);
        cudaStreamDestroy(im->own);
    }
    cudaFree(im->scratch);
    if (im->comm)
        ncclCommDestroy(im->comm);
    free(im);
    c->impl = nullptr;
}

static const fg_comm_vtable nccl_vt = {
    n_allreduce, n_broadcast, n_allgather, n_reduce_scatter,
    n_sendrecv,  n_barrier,   n_test,      n_wait,
    n_destroy,
};

/* ---- construction ---------------------------------------------------------------- */

/* Streams and scratch of a new rank on the current device. */
static fg_status wrap(ncclComm_t comm, int rank, int size, int device,
                      int own_stream, fg_comm **out)
{
    fg_comm *c = fg_comm_alloc(&nccl_vt, FG_COMM_NCCL, FG_DEVICE_CUDA, rank,
                               size);
    NcclImpl *im = (NcclImpl *)calloc(1, sizeof *im);
    if (!c || !im) {
        free(c);
        free(im);
        ncclCommDestroy(comm);
        return fg_error(FG_ERR_OUT_OF_MEMORY, "NCCL communicator");
    }
    c->impl = im;
    c->cuda_device = device;
    im->comm = comm;
    im->device = device;
    cudaError_t e = cudaStreamCreateWithFlags(&im->side,
                                              cudaStreamNonBlocking);
    if (e == cudaSuccess && own_stream)
        e = cudaStreamCreateWithFlags(&im->own, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&im->scratch, sizeof(float));
    if (e == cudaSuccess)
        e = cudaMemset(im->scratch, 0, sizeof(float));
    if (e != cudaSuccess) {
        fg_status s = fg_cuda_status(e, "cudaStreamCreate/cudaMalloc",
                                     __FILE__, __LINE__);
        fg_comm_free(c);
        return s;
    }
    *out = c;
    return FG_OK;
}

extern "C" fg_status fg_nccl_unique_id(unsigned char id[FG_NCCL_ID_BYTES])
{
    ncclUniqueId u;
    FG_NCCL_TRY(nullptr, ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof u);
    return FG_OK;
}

extern "C" fg_status fg_nccl_device_count(int *n)
{
    *n = 0;
    FG_CUDA_TRY(cudaGetDeviceCount(n));
    return FG_OK;
}

extern "C" fg_status fg_nccl_comm_create(const unsigned char id[FG_NCCL_ID_BYTES],
                                         int rank, int size, int device,
                                         fg_comm **out)
{
    /* A one-GPU process: its device becomes the current one for all of
     * flashgrad (the context stream and allocator follow it). */
    FG_CUDA_TRY(cudaSetDevice(device));
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclComm_t comm;
    FG_NCCL_TRY(nullptr, ncclCommInitRank(&comm, size, u, rank));
    return wrap(comm, rank, size, device, 0, out);
}

extern "C" fg_status fg_nccl_comm_create_all(const int *devices, int n,
                                             fg_comm **comms)
{
    ncclComm_t *raw = (ncclComm_t *)calloc((size_t)n, sizeof *raw);
    if (!raw)
        return fg_error(FG_ERR_OUT_OF_MEMORY, "NCCL communicators");
    int prev = 0;
    FG_CUDA_TRY(cudaGetDevice(&prev));
    ncclResult_t r = ncclCommInitAll(raw, n, devices);
    if (r != ncclSuccess) {
        free(raw);
        return nccl_fail(r, "ncclCommInitAll", __FILE__, __LINE__, nullptr);
    }
    fg_status s = FG_OK;
    for (int i = 0; i < n; i++) {
        cudaError_t e = s == FG_OK ? cudaSetDevice(devices[i]) : cudaSuccess;
        if (s == FG_OK && e != cudaSuccess)
            s = fg_cuda_status(e, "cudaSetDevice", __FILE__, __LINE__);
        if (s == FG_OK)
            s = wrap(raw[i], i, n, devices[i], 1, &comms[i]);
        else
            ncclCommDestroy(raw[i]);
    }
    cudaSetDevice(prev);
    free(raw);
    if (s != FG_OK)
        for (int i = 0; i < n; i++) {
            fg_comm_free(comms[i]);
            comms[i] = nullptr;
        }
    return s;
}

extern "C" fg_status fg_nccl_group(int start)
{
    if (start) {
        FG_NCCL_TRY(nullptr, ncclGroupStart());
        g_group_depth++;
        return FG_OK;
    }
    if (g_group_depth == 0)
        return fg_error(FG_ERR_STATE, "fg_comm_group_end without "
                        "fg_comm_group_start");
    g_group_depth--;
    FG_NCCL_TRY(nullptr, ncclGroupEnd());
    return FG_OK;
}

extern "C" void *fg_nccl_stream(const fg_comm *c)
{
    return c && c->impl ? (void *)impl(c)->own : nullptr;
}
