/* SPDX-License-Identifier: MIT */
/* flashgrad/dist.h - distributed training: a communicator with two
 * backends, data parallelism (bucketed gradient all-reduce overlapping the
 * backward, optional ZeRO-1) and ring attention (sequence parallelism).
 * doc/distributed.md has the launch recipes and the guarantees.
 *
 * Backends. MPI (Open MPI) moves CPU buffers and starts the processes
 * (mpirun), also across machines. NCCL moves CUDA buffers; its ranks find
 * each other through a unique id that MPI broadcasts (multi-node, as in
 * llm.c), that rank 0 writes to a file all ranks can read (one host, no
 * MPI), or that one process uses to drive several GPUs. flashgrad carries
 * no transport of its own. A build without a backend still has every
 * function: they return FG_ERR_UNSUPPORTED ("flashgrad was built without
 * MPI" / "... without NCCL"); fg_comm_backend_available() says which exist.
 *
 * Buffers and ranks. Operations take raw buffers of `count` elements of an
 * fg_dtype (fp32, fp64, fp16, bf16): host memory for an MPI communicator,
 * device memory for an NCCL one. Every rank of a communicator must issue
 * the same operations in the same order (MPI and NCCL rules).
 *
 * Completion. MPI: a blocking call returns when its buffers are final. NCCL:
 * like every flashgrad CUDA call, operations are asynchronous in stream
 * order on the communicator's stream (the flashgrad context stream,
 * fg_cuda_get_stream(), unless the communicator drives one of several GPUs
 * of the process): later work on that stream sees the result; the host is
 * not blocked (fg_cuda_synchronize() waits), except in fg_comm_barrier.
 *
 * Nonblocking operations (fg_comm_i*) return a request and run while the
 * caller computes; the buffers belong to the operation until
 * fg_comm_wait(), which every request must reach (it frees the request).
 * MPI: Open MPI advances nonblocking operations inside MPI calls, so long
 * computations should call fg_comm_test() now and then (the data-parallel
 * hooks do). NCCL: the operation runs on a side stream after the work
 * already enqueued on the communicator's stream; fg_comm_wait() makes that
 * stream wait for it (no host blocking).
 *
 * Errors: MPI and NCCL failures are FG_ERR_COMM with the call, file, line
 * and the library's message; communicators are set to return errors, never
 * to abort. The library never exits. */
#ifndef FLASHGRAD_DIST_H
#define FLASHGRAD_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "flashgrad/attention.h"
#include "flashgrad/export.h"
#include "flashgrad/nn.h"
#include "flashgrad/optim.h"
#include "flashgrad/status.h"
#include "flashgrad/tensor.h"
#include "flashgrad/types.h"

FG_BEGIN_DECLS

typedef struct fg_comm fg_comm;
typedef struct fg_comm_request fg_comm_request;

typedef enum fg_comm_backend {
    FG_COMM_MPI = 1,  /* CPU buffers */
    FG_COMM_NCCL = 2  /* CUDA buffers */
} fg_comm_backend;

typedef enum fg_reduce_op {
    FG_REDUCE_SUM = 0,
    FG_REDUCE_AVG = 1 /* sum / size */
} fg_reduce_op;

/* 1 if this build has the backend (it may still fail to start). */
FG_API int fg_comm_backend_available(fg_comm_backend b);

/* ---- communicators ------------------------------------------------------- */

/* MPI over all processes of the job (a duplicate of MPI_COMM_WORLD).
 * Initialises MPI (MPI_Init_thread, FUNNELED) unless the program already
 * did; argc/argv may be NULL. */
FG_API fg_status fg_comm_init_mpi(int *argc, char ***argv, fg_comm **out);
/* MPI over an existing communicator: mpi_comm points to an MPI_Comm (it
 * is duplicated; MPI must be initialised). */
FG_API fg_status fg_comm_init_mpi_comm(const void *mpi_comm, fg_comm **out);

/* NCCL over the ranks of an MPI communicator (any number of hosts): rank 0
 * creates the unique id, MPI broadcasts it, every rank joins on CUDA
 * device `device` (-1: its rank on the host modulo the device count).
 * Collective over `mpi`, which stays usable and independent of the new
 * communicator (free them in any order). */
FG_API fg_status fg_comm_init_nccl_mpi(fg_comm *mpi, int device,
                                       fg_comm **out);
/* NCCL among nranks processes of one host, without MPI: rank 0 writes the
 * unique id to id_path (atomically: a temporary file renamed into place),
 * the others wait up to timeout_s seconds (<= 0: 60) for it to appear.
 * Then every rank writes id_path.arrived.RANK and waits up to timeout_s
 * for all nranks to have done so before NCCL's init (which would wait
 * forever for a rank that never starts): FG_ERR_COMM naming the missing
 * rank. Use a path no earlier run left behind (the files are removed once
 * every rank has joined). device -1: rank modulo the device count. */
FG_API fg_status fg_comm_init_nccl_file(const char *id_path, int rank,
                                        int nranks, int device,
                                        double timeout_s, fg_comm **out);
/* One process driving n GPUs (ncclCommInitAll): comms[i] is rank i on
 * devices[i], each with its own stream (fg_comm_get_stream). Issue one
 * operation per communicator between fg_comm_group_start() and
 * fg_comm_group_end() (blocking forms only). NCCL refuses two ranks on one
 * device. */
FG_API fg_status fg_comm_init_nccl_devices(const int *devices, int n,
                                           fg_comm **comms);
FG_API fg_status fg_comm_group_start(void);
FG_API fg_status fg_comm_group_end(void);

/* Frees a communicator (NULL-safe; NCCL: on every rank, after its last
 * operation). */
FG_API void fg_comm_free(fg_comm *c);
/* MPI_Finalize, if flashgrad initialised MPI and no communicator is left;
 * call once at the end of the program. No-op otherwise. */
FG_API fg_status fg_dist_finalize(void);

FG_API int fg_comm_rank(const fg_comm *c);
FG_API int fg_comm_size(const fg_comm *c);
/* Rank among the processes of this host (device selection). */
FG_API int fg_comm_local_rank(const fg_comm *c);
FG_API fg_comm_backend fg_comm_get_backend(const fg_comm *c);
/* FG_DEVICE_CPU (MPI) or FG_DEVICE_CUDA (NCCL). */
FG_API fg_device fg_comm_device(const fg_comm *c);
/* The CUDA device of an NCCL communicator (-1 for MPI). */
FG_API int fg_comm_cuda_device(const fg_comm *c);
/* cudaStream_t the communicator's operations are ordered on (NULL for MPI,
 * and for an NCCL communicator that follows the context stream). */
FG_API void *fg_comm_get_stream(const fg_comm *c);

/* Fixed-order reduction (MPI; default on): all-reduce and reduce-scatter
 * sum the ranks' contributions in rank order, ((x0 + x1) + x2) + ..., with
 * point-to-point messages (N - 1 per rank and phase), so results are
 * bitwise reproducible and equal to a sequential accumulation. Off: MPI's
 * own algorithms, whose order depends on the size and the ranks. NCCL
 * always uses its own (deterministic for a fixed topology); setting it
 * there is FG_ERR_UNSUPPORTED. */
FG_API fg_status fg_comm_set_fixed_order(fg_comm *c, int on);
/* Argument check (MPI; off by default, FG_DIST_CHECK=1 in the environment
 * turns it on for new communicators): each collective and barrier first
 * compares its operation, count, dtype, reduction and root across the
 * ranks with one small blocking all-reduce; if they differ, or a rank
 * refused its own arguments, every rank returns FG_ERR_INVALID_ARGUMENT
 * naming the difference (without it, mismatched ranks may wait forever or
 * read what was never sent). One latency per operation, for which the
 * nonblocking forms block; a debugging aid. NCCL: FG_ERR_UNSUPPORTED. */
FG_API fg_status fg_comm_set_check_args(fg_comm *c, int on);

/* ---- operations -------------------------------------------------------------
 * Reductions (SUM, AVG) on fp32 and fp64 run in the buffer's type; fp16
 * and bf16 are summed in fp32 and rounded once (MPI), or natively (NCCL).
 * `send == recv` is the in-place form of all-reduce. */

FG_API fg_status fg_comm_allreduce(fg_comm *c, const void *send, void *recv,
                                   size_t count, fg_dtype dt,
                                   fg_reduce_op op);
/* buf (count elements) from root to every rank. */
FG_API fg_status fg_comm_broadcast(fg_comm *c, void *buf, size_t count,
                                   fg_dtype dt, int root);
/* recv[r * count ...] = send of rank r (recv holds size * count). In place
 * when send == recv + rank * count. */
FG_API fg_status fg_comm_allgather(fg_comm *c, const void *send, void *recv,
                                   size_t count, fg_dtype dt);
/* recv (count elements) = reduction over ranks of block `rank` of send
 * (send holds size * count). In place when recv == send + rank * count
 * (the other blocks of send are then undefined). */
FG_API fg_status fg_comm_reduce_scatter(fg_comm *c, const void *send,
                                        void *recv, size_t count, fg_dtype dt,
                                        fg_reduce_op op);
/* Sends send_count elements to rank dest and receives recv_count from rank
 * src (either rank may be -1: no send / no receive). The ring's step. */
FG_API fg_status fg_comm_sendrecv(fg_comm *c, const void *send,
                                  size_t send_count, int dest, void *recv,
                                  size_t recv_count, int src, fg_dtype dt);
/* Returns once every rank has entered (NCCL: and the communicator's stream
 * has drained). */
FG_API fg_status fg_comm_barrier(fg_comm *c);

/* Nonblocking forms: *req receives the request (NULL on failure). */
FG_API fg_status fg_comm_iallreduce(fg_comm *c, const void *send, void *recv,
                                    size_t count, fg_dtype dt,
                                    fg_reduce_op op, fg_comm_request **req);
FG_API fg_status fg_comm_ibroadcast(fg_comm *c, void *buf, size_t count,
                                    fg_dtype dt, int root,
                                    fg_comm_request **req);
FG_API fg_status fg_comm_iallgather(fg_comm *c, const void *send, void *recv,
                                    size_t count, fg_dtype dt,
                                    fg_comm_request **req);
FG_API fg_status fg_comm_ireduce_scatter(fg_comm *c, const void *send,
                                         void *recv, size_t count,
                                         fg_dtype dt, fg_reduce_op op,
                                         fg_comm_request **req);
FG_API fg_status fg_comm_isendrecv(fg_comm *c, const void *send,
                                   size_t send_count, int dest, void *recv,
                                   size_t recv_count, int src, fg_dtype dt,
                                   fg_comm_request **req);
/* Advances the operation; *done = 1 once fg_comm_wait would not block
 * (NCCL: once the device finished it). */
FG_API fg_status fg_comm_test(fg_comm_request *req, int *done);
/* Completes the operation (see Completion above) and frees the request,
 * also when it fails. NULL-safe. */
FG_API fg_status fg_comm_wait(fg_comm_request *req);

/* ---- data parallelism ----------------------------------------------------------
 * Every rank holds the whole model and trains on its own rows; after each
 * backward the gradients are averaged over the ranks, so all ranks take the
 * same optimizer step. The gradients live in one flat buffer cut into
 * buckets (parameters in reverse order, as the backward produces them);
 * each parameter's .grad is a view of its place there. A post-accumulate
 * hook (autograd.h) on every parameter counts the parameters of its bucket
 * and, when the bucket is complete, starts its nonblocking all-reduce (in
 * bucket order, the same on every rank): the reduction of the last layers
 * runs while the backward computes the first ones.
 *
 * ZeRO-1 (zero1 = 1): the AdamW moments are sharded: each bucket is
 * reduce-scattered instead of all-reduced, rank r updates the r-th slice of
 * every bucket with moments for that slice only, and the updated slices are
 * all-gathered back into every rank's parameters (through the gradient
 * buffer, so the step leaves the gradients zero). Optimizer memory per rank
 * is 1/N of the full AdamW's.
 *
 * Equivalence (doc/distributed.md): N ranks with B rows each compute the
 * parameters of one process running the same N * B rows as N micro-batches
 * of B (fg_gpt_train_step with accum = N), bitwise, when N is a power of
 * two and the reduction is in fixed order (MPI default), without ZeRO-1 or
 * with ZeRO-1 while clipping does not trigger (its norm is summed in
 * another order). Otherwise (NCCL, other N) they agree up to the rounding
 * of the reduction order. */

typedef struct fg_dp fg_dp;

typedef struct fg_dp_config {
    size_t bucket_bytes; /* gradient bucket size; 0: 4 MiB (MPI); NCCL: an
                            eighth of the gradients' bytes, within 25 MiB ..
                            64 MiB */
    int zero1;           /* shard the AdamW moments (ZeRO stage 1) */
    int overlap;         /* 1 (default): start buckets from the backward's
                            hooks; 0: all after the backward */
    fg_adamw_config adamw;
} fg_dp_config;
/* Defaults: the backend's bucket size (bucket_bytes 0), no ZeRO-1, overlap
 * on, fg_adamw_config_init. */
FG_API void fg_dp_config_init(fg_dp_config *c);

/* Data parallelism over comm for n parameters (fp32 or fp64, all on the
 * communicator's device, contiguous; the array is copied). Collective:
 * rank 0's parameter values are broadcast to all ranks, the gradient
 * buffer is allocated and every .grad becomes a view of it (existing
 * gradients are copied in), the hooks are registered and the optimizer
 * (full or sharded) is created. comm must outlive the fg_dp. */
FG_API fg_status fg_dp_create(fg_comm *comm, const fg_param *params, int n,
                              const fg_dp_config *c, fg_dp **out);
/* Removes the hooks and frees everything; the .grad views stay valid. */
FG_API void fg_dp_free(fg_dp *dp);

/* Whether the next backward completes a step (1: its hooks start the
 * reductions) or only accumulates (0, like DDP's no_sync: gradient
 * accumulation over micro-batches). Reset to 0 by fg_dp_finish_backward. */
FG_API fg_status fg_dp_set_sync(fg_dp *dp, int sync);
/* After the synchronising backward: starts the buckets that did not
 * complete (parameters without a gradient keep theirs), waits for all and
 * leaves in every .grad (ZeRO-1: in the rank's slices of it) the mean over
 * ranks. */
FG_API fg_status fg_dp_finish_backward(fg_dp *dp);
/* Global gradient norm (all ranks agree); clips when it exceeds
 * max_norm > 0, as fg_clip_grad_norm. */
FG_API fg_status fg_dp_clip_grad_norm(fg_dp *dp, double max_norm,
                                      double *norm);
/* The AdamW step (lr < 0: the config's); ZeRO-1: the rank's slices, then
 * the parameters' all-gather (gradients are left zero). */
FG_API fg_status fg_dp_step(fg_dp *dp, double lr);
/* Zeroes the gradients (the buffer; the views stay). */
FG_API fg_status fg_dp_zero_grad(fg_dp *dp);
/* The optimizer (borrowed): the full AdamW, or with ZeRO-1 the one over
 * this rank's slices (NULL if the rank owns no element). */
FG_API fg_adamw *fg_dp_optimizer(const fg_dp *dp);

/* fg_gpt_train_step on this rank's rows (x, y: accum * B * T ids each) with
 * the reduction above: micro-batches 0..accum-2 accumulate locally, the
 * last one synchronises; then clip, step, zero. stats->loss is the mean
 * over all ranks, grad_norm the global norm. m's parameters must be the
 * ones dp was created with. */
FG_API fg_status fg_dp_train_step(fg_dp *dp, const fg_gpt *m,
                                  const int64_t *x, const int64_t *y,
                                  int64_t B, int64_t T, int accum,
                                  double clip, double lr, fg_generator *rng,
                                  fg_arena *arena, fg_step_stats *stats);

/* fg_dp_train_step with loss scaling (optim.h's fg_gpt_train_step_scaled):
 * the decision to skip is taken on the global norm, so every rank skips
 * the same steps and their scalers stay equal. scale NULL: exactly
 * fg_dp_train_step. */
FG_API fg_status fg_dp_train_step_scaled(fg_dp *dp, const fg_gpt *m,
                                         const int64_t *x, const int64_t *y,
                                         int64_t B, int64_t T, int accum,
                                         double clip, double lr,
                                         fg_generator *rng, fg_arena *arena,
                                         fg_grad_scaler *scale,
                                         fg_step_stats *stats);

/* Flags (bits 0-7) this rank hands to the next fg_dp_train_step, which
 * reduces them with its loss (no collective or host synchronisation of
 * their own) and then clears them; fg_dp_flags returns the OR over every
 * rank from the last step (0 before the first). A way for every rank to
 * agree, at the same step, on what one saw, e.g. a signal asking to stop. */
FG_API fg_status fg_dp_set_flags(fg_dp *dp, unsigned flags);
FG_API unsigned fg_dp_flags(const fg_dp *dp);

/* Checkpoints of a data-parallel run (format of optim.h). Save is
 * collective: with ZeRO-1 the moments are gathered to rank 0, which writes
 * the file; the others only take part. Load: every rank reads the file
 * (shared or copied), takes the parameters and its optimizer state (its
 * slices with ZeRO-1). */
FG_API fg_status fg_dp_checkpoint_save(fg_dp *dp, const char *path,
                                       const fg_gpt *m,
                                       const fg_train_state *st,
                                       const char *meta);
FG_API fg_status fg_dp_checkpoint_load(fg_dp *dp, const char *path,
                                       fg_gpt *m, fg_train_state *st);

typedef struct fg_dp_stats {
    int buckets;             /* buckets of the gradient buffer */
    size_t buffer_bytes;     /* its size (with ZeRO-1 padding) */
    int64_t shard_elements;  /* elements this rank's optimizer updates */
    int64_t steps;           /* synchronised backwards so far */
    int64_t started_in_backward; /* buckets started from hooks, in total */
} fg_dp_stats;
FG_API fg_status fg_dp_get_stats(const fg_dp *dp, fg_dp_stats *st);

/* ---- ring attention --------------------------------------------------------------
 * Sequence parallelism for attention over Ntot = size * n tokens: every
 * rank holds n of them (Q, K, V, O, dO, dQ, dK, dV of [B, n, heads, d],
 * stats [B, H, n]); K and V travel around the ring (rank r sends to r + 1)
 * while each rank attends its queries to the block it holds, the next
 * transfer overlapping the current block's compute; the partial results
 * are merged with fg_attention_merge. The backward sends K, V around again
 * with dK, dV accumulators that return to their owner, and computes each
 * block with the merged O, m, l (attention.h: backward of a split
 * attention). Results equal single-process attention over the whole
 * sequence up to rounding: forward, m, l and every gradient.
 *
 * Layouts: FG_RING_CONTIGUOUS gives rank r tokens [r n, (r + 1) n).
 * FG_RING_ZIGZAG cuts the sequence into 2 * size chunks of n / 2 and gives
 * rank r chunks r and 2 size - 1 - r (in that order), which balances causal
 * work: every rank computes the same number of blocks. fg_ring_position()
 * maps local to global positions.
 *
 * p describes the local problem: seqlen_q = seqlen_k = n (the same on
 * every rank; even for zigzag), heads, head_dim, scale; causal is the
 * global causal mask (Nq = Nk overall, so corners coincide). softcap
 * applies as usual; dropout, sliding windows, ALiBi and block masks (which
 * would see block-local positions) are FG_ERR_UNSUPPORTED. Device: the communicator's (CPU with
 * MPI, CUDA with NCCL); p->device must match. Block calls use p's tiles,
 * threads and stream. Temporary memory: about 4 K/V blocks plus fp32
 * accumulators for fp16/bf16. */

typedef enum fg_ring_layout {
    FG_RING_CONTIGUOUS = 0,
    FG_RING_ZIGZAG = 1
} fg_ring_layout;

/* Global position of local position i (0 <= i < n) of `rank`. */
FG_API int64_t fg_ring_position(fg_ring_layout layout, int size, int rank,
                                int64_t n, int64_t i);

/* Forward: writes the rank's O and stats (as fg_attention_forward on the
 * whole sequence would for these rows). Collective. */
FG_API fg_status fg_ring_attention_forward(fg_comm *c, fg_ring_layout layout,
                                           const fg_attn_params *p,
                                           const fg_attn_tensor *q,
                                           const fg_attn_tensor *k,
                                           const fg_attn_tensor *v,
                                           const fg_attn_tensor *o,
                                           const fg_attn_stats *stats);
/* Backward: from the forward's O and stats and dO, writes the rank's dQ,
 * dK, dV (overwritten). Collective. */
FG_API fg_status fg_ring_attention_backward(
    fg_comm *c, fg_ring_layout layout, const fg_attn_params *p,
    const fg_attn_tensor *q, const fg_attn_tensor *k, const fg_attn_tensor *v,
    const fg_attn_tensor *o, const fg_attn_tensor *dout,
    const fg_attn_stats *stats, const fg_attn_tensor *dq,
    const fg_attn_tensor *dk, const fg_attn_tensor *dv);

FG_END_DECLS

#endif /* FLASHGRAD_DIST_H */
