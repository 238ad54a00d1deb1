/* SPDX-License-Identifier: MIT */
/* lib/dist/comm_internal.h - the communicator object shared by the generic
 * layer (comm.c: validation, dispatch, NCCL bootstrap), the MPI backend
 * (comm_mpi.c) and the NCCL backend (kernels/dist/comm_nccl.cu). Each
 * backend fills a vtable; a build without a backend links its stub, whose
 * constructor reports "built without ...". Backends may assume validated
 * arguments. */
#ifndef FG_LIB_DIST_COMM_INTERNAL_H
#define FG_LIB_DIST_COMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "flashgrad/dist.h"
#include "lib/core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the entry points of a missing backend report. */
#define FG_NO_MPI(fn)                                                       \
    fg_error(FG_ERR_UNSUPPORTED,                                            \
             "%s: flashgrad was built without MPI (configure --with-mpi; "  \
             "Debian: libopenmpi-dev)", fn)
#define FG_NO_NCCL(fn)                                                      \
    fg_error(FG_ERR_UNSUPPORTED,                                            \
             "%s: flashgrad was built without NCCL (configure --with-nccl, " \
             "needs CUDA)", fn)

/* Every backend request starts with this header. */
struct fg_comm_request {
    fg_comm *comm;
};

/* req == NULL: the blocking form. */
typedef struct fg_comm_vtable {
    fg_status (*allreduce)(fg_comm *c, const void *send, void *recv,
                           size_t count, fg_dtype dt, fg_reduce_op op,
                           fg_comm_request **req);
    fg_status (*broadcast)(fg_comm *c, void *buf, size_t count, fg_dtype dt,
                           int root, fg_comm_request **req);
    fg_status (*allgather)(fg_comm *c, const void *send, void *recv,
                           size_t count, fg_dtype dt, fg_comm_request **req);
    fg_status (*reduce_scatter)(fg_comm *c, const void *send, void *recv,
                                size_t count, fg_dtype dt, fg_reduce_op op,
                                fg_comm_request **req);
    fg_status (*sendrecv)(fg_comm *c, const void *send, size_t send_count,
                          int dest, void *recv, size_t recv_count, int src,
                          fg_dtype dt, fg_comm_request **req);
    fg_status (*barrier)(fg_comm *c);
    fg_status (*test)(fg_comm_request *r, int *done);
    fg_status (*wait)(fg_comm_request *r); /* frees r */
    void (*destroy)(fg_comm *c);           /* the backend state */
} fg_comm_vtable;

struct fg_comm {
    const fg_comm_vtable *vt;
    fg_comm_backend backend;
    fg_device device;
    int rank, size;
    int local_rank, local_size;
    int cuda_device;   /* NCCL; -1 for MPI */
    int fixed_order;   /* MPI: rank-order reductions */
    void *impl;        /* backend state */
    int check_args;    /* MPI: compare collective arguments across ranks */
};

/* New communicator with the common fields set (calloc'd; NULL on OOM). */
fg_comm *fg_comm_alloc(const fg_comm_vtable *vt, fg_comm_backend b,
                       fg_device dev, int rank, int size);

/* ---- MPI (lib/dist/comm_mpi.c or comm_mpi_stub.c) ---------------------- */
fg_status fg_mpi_comm_create(int *argc, char ***argv, const void *mpi_comm,
                             fg_comm **out);
fg_status fg_mpi_finalize(void);
/* The element-wise maximum and minimum of sig[0..n) (n <= 8) over the
 * ranks, by one blocking all-reduce. */
fg_status fg_mpi_args_range(fg_comm *c, const int64_t *sig, int n,
                            int64_t *hi, int64_t *lo);

/* ---- NCCL (kernels/dist/comm_nccl.cu or nccl_stub.c) -------------------- */
#define FG_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */
fg_status fg_nccl_unique_id(unsigned char id[FG_NCCL_ID_BYTES]);
/* Joins as rank of size on CUDA device `device` (>= 0). */
fg_status fg_nccl_comm_create(const unsigned char id[FG_NCCL_ID_BYTES],
                              int rank, int size, int device, fg_comm **out);
fg_status fg_nccl_comm_create_all(const int *devices, int n, fg_comm **comms);
fg_status fg_nccl_device_count(int *n);
/* fg_comm_init_nccl_file's arrival check: rank writes its arrival file
 * (id_path.arrived.rank, holding id) and waits up to timeout_s for the
 * other nranks - 1 to hold the same id; FG_ERR_COMM naming the first
 * missing rank otherwise (its own file then removed). Leave removes the
 * file once NCCL's init has returned. */
fg_status fg_rendezvous_arrive(const char *id_path, int rank, int nranks,
                               const unsigned char *id, double timeout_s);
void fg_rendezvous_leave(const char *id_path, int rank);
fg_status fg_nccl_group(int start);
void *fg_nccl_stream(const fg_comm *c);

/* Small helpers for the layers above the communicator (comm.c). */
/* All-reduce of n host doubles, whatever the communicator's device (NCCL
 * stages them through device memory). */
fg_status fg_comm_allreduce_host_f64(fg_comm *c, double *x, int n,
                                     fg_reduce_op op);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_DIST_COMM_INTERNAL_H */
