/* SPDX-License-Identifier: MIT */
/* tests/test_dist_comm.c - the MPI communicator under mpirun: all-reduce
 * (sum, avg; fp32, fp64, fp16, bf16; in place or not; fixed-order and MPI's
 * own), reduce-scatter, all-gather, broadcast, sendrecv around the ring,
 * the nonblocking forms, barrier and argument errors.
 *
 * Data are quarter integers in [-2, 2], so sums are exact in every dtype
 * and results are compared exactly; the fixed-order reduction is also
 * checked bitwise against a sequential fp32 sum of random data, which every
 * rank can regenerate for every other rank. Averages are exact for a power
 * of two ranks, otherwise within the dtype's rounding. */
#include "dist_util.h"
#include "lib/autograd/tensor_internal.h"

static const fg_dtype dtypes[] = {FG_FP32, FG_FP64, FG_FP16, FG_BF16};

static double quarter(int r, size_t i)
{
    return (double)((int)((i * 7 + (size_t)r * 3) % 17) - 8) / 4.0;
}

static void store(void *p, fg_dtype dt, size_t i, double x)
{
    switch (dt) {
    case FG_FP64: ((double *)p)[i] = x; break;
    case FG_FP16: ((uint16_t *)p)[i] = fg_float_to_half((float)x); break;
    case FG_BF16: ((uint16_t *)p)[i] = fg_float_to_bf16((float)x); break;
    default: ((float *)p)[i] = (float)x; break;
    }
}

static double load(const void *p, fg_dtype dt, size_t i)
{
    switch (dt) {
    case FG_FP64: return ((const double *)p)[i];
    case FG_FP16: return fg_half_to_float(((const uint16_t *)p)[i]);
    case FG_BF16: return fg_bf16_to_float(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static double avg_tol(fg_dtype dt)
{
    if ((fgd_size & (fgd_size - 1)) == 0)
        return 0; /* power of two: exact */
    return dt == FG_FP64 ? 1e-15 : dt == FG_FP32 ? 1e-6 : 1e-2;
}

static void check_values(const void *got, fg_dtype dt, size_t n, size_t off,
                         fg_reduce_op op, double tol, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < fgd_size; r++)
            want += quarter(r, off + i);
        if (op == FG_REDUCE_AVG)
            want /= fgd_size;
        const double g = load(got, dt, i);
        if (!(fabs(g - want) <= tol * fmax(1, fabs(want)))) {
            FGD_CHECK(0, "%s %s: element %zu is %.9g, want %.9g", what,
                      fg_dtype_name(dt), off + i, g, want);
            return;
        }
    }
    fgd_checks++;
}

/* "allreduce fixed avg in place" and the like, into buf[64]. */
static const char *label(char *buf, const char *op_name, int fixed, int op,
                         int inplace)
{
    snprintf(buf, 64, "%s%s%s%s", op_name, fixed ? " fixed" : "",
             op ? " avg" : " sum", inplace ? " in place" : "");
    return buf;
}

static void test_allreduce(fg_comm *c, int fixed)
{
    FGD_OK(fg_comm_set_fixed_order(c, fixed));
    const size_t counts[] = {0, 1, 7, 1001};
    for (size_t di = 0; di < 4; di++)
        for (size_t ci = 0; ci < 4; ci++)
            for (int op = 0; op < 2; op++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    const fg_dtype dt = dtypes[di];
                    const size_t n = counts[ci], es = fg_dtype_size(dt);
                    char *send = malloc(n * es + 8), *recv = malloc(n * es + 8);
                    for (size_t i = 0; i < n; i++)
                        store(send, dt, i, quarter(fgd_rank, i));
                    memset(recv, 0xff, n * es + 8);
                    if (inplace) {
                        memcpy(recv, send, n * es);
                        FGD_OK(fg_comm_allreduce(c, recv, recv, n, dt,
                                                 (fg_reduce_op)op));
                    } else {
                        FGD_OK(fg_comm_allreduce(c, send, recv, n, dt,
                                                 (fg_reduce_op)op));
                    }
                    char what[64];
                    label(what, "allreduce", fixed, op, inplace);
                    check_values(recv, dt, n, 0, (fg_reduce_op)op,
                                 op ? avg_tol(dt) : 0, what);
                    FGD_CHECK((unsigned char)recv[n * es] == 0xff,
                              "%s wrote past the end", what);
                    free(send);
                    free(recv);
                }
}

/* The fixed-order sum is the sequential one: ((x0 + x1) + x2) ... in fp32,
 * bit for bit, and identical on every rank. */
static void test_fixed_bitwise(fg_comm *c)
{
    FGD_OK(fg_comm_set_fixed_order(c, 1));
    const size_t n = 4099;
    float *mine = malloc(n * 4), *got = malloc(n * 4), *want = malloc(n * 4);
    for (int r = 0; r < fgd_size; r++) {
        uint64_t s = 1000 + (uint64_t)r;
        for (size_t i = 0; i < n; i++) {
            const float x = (float)(fgd_uniform(&s) * pow(10, (int)(i % 7) - 3));
            if (r == fgd_rank)
                mine[i] = x;
            want[i] = r == 0 ? x : want[i] + x;
        }
    }
    for (int op = 0; op < 2; op++) {
        FGD_OK(fg_comm_allreduce(c, mine, got, n, FG_FP32, (fg_reduce_op)op));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            const float w = op ? want[i] / (float)fgd_size : want[i];
            bad += memcmp(&got[i], &w, 4) != 0;
        }
        FGD_CHECK(bad == 0, "fixed-order allreduce (%s): %zu of %zu elements "
                  "differ from the sequential sum", op ? "avg" : "sum", bad, n);
        /* reduce-scatter: block `rank` of the same sums */
        const size_t per = n / (size_t)fgd_size;
        FGD_OK(fg_comm_reduce_scatter(c, mine, got, per, FG_FP32,
                                      (fg_reduce_op)op));
        bad = 0;
        for (size_t i = 0; i < per; i++) {
            const size_t e = (size_t)fgd_rank * per + i;
            const float w = op ? want[e] / (float)fgd_size : want[e];
            bad += memcmp(&got[i], &w, 4) != 0;
        }
        FGD_CHECK(bad == 0, "fixed-order reduce_scatter: %zu differ", bad);
    }
    free(mine);
    free(got);
    free(want);
}

static void test_reduce_scatter(fg_comm *c, int fixed)
{
    FGD_OK(fg_comm_set_fixed_order(c, fixed));
    const size_t per = 13, N = (size_t)fgd_size;
    for (size_t di = 0; di < 4; di++)
        for (int op = 0; op < 2; op++)
            for (int inplace = 0; inplace < 2; inplace++) {
                const fg_dtype dt = dtypes[di];
                const size_t es = fg_dtype_size(dt);
                char *send = malloc(N * per * es), *recv = malloc(per * es);
                for (size_t i = 0; i < N * per; i++)
                    store(send, dt, i, quarter(fgd_rank, i));
                char *out = inplace ? send + (size_t)fgd_rank * per * es : recv;
                FGD_OK(fg_comm_reduce_scatter(c, send, out, per, dt,
                                              (fg_reduce_op)op));
                char what[64];
                label(what, "reduce_scatter", fixed, op, inplace);
                check_values(out, dt, per, (size_t)fgd_rank * per,
                             (fg_reduce_op)op, op ? avg_tol(dt) : 0, what);
                free(send);
                free(recv);
            }
}

static void test_allgather_bcast(fg_comm *c)
{
    const size_t per = 9, N = (size_t)fgd_size;
    for (size_t di = 0; di < 4; di++)
        for (int inplace = 0; inplace < 2; inplace++) {
            const fg_dtype dt = dtypes[di];
            const size_t es = fg_dtype_size(dt);
            char *send = malloc(per * es), *recv = malloc(N * per * es);
            memset(recv, 0, N * per * es);
            char *src = inplace ? recv + (size_t)fgd_rank * per * es : send;
            for (size_t i = 0; i < per; i++)
                store(src, dt, i, quarter(fgd_rank, i));
            FGD_OK(fg_comm_allgather(c, src, recv, per, dt));
            int ok = 1;
            for (size_t r = 0; r < N; r++)
                for (size_t i = 0; i < per; i++)
                    ok &= load(recv, dt, r * per + i) == quarter((int)r, i);
            FGD_CHECK(ok, "allgather %s%s", fg_dtype_name(dt),
                      inplace ? " in place" : "");
            /* broadcast from the last rank */
            for (size_t i = 0; i < per; i++)
                store(send, dt, i, quarter(fgd_rank, i));
            FGD_OK(fg_comm_broadcast(c, send, per, dt, fgd_size - 1));
            ok = 1;
            for (size_t i = 0; i < per; i++)
                ok &= load(send, dt, i) == quarter(fgd_size - 1, i);
            FGD_CHECK(ok, "broadcast %s", fg_dtype_name(dt));
            free(send);
            free(recv);
        }
}

/* Around the ring: blocking, then several nonblocking rounds in flight at
 * once; the ends of an open chain use -1. */
static void test_sendrecv(fg_comm *c)
{
    const int next = (fgd_rank + 1) % fgd_size;
    const int prev = (fgd_rank + fgd_size - 1) % fgd_size;
    double out[5], in[5];
    for (int i = 0; i < 5; i++)
        out[i] = fgd_rank * 10 + i;
    FGD_OK(fg_comm_sendrecv(c, out, 5, next, in, 5, prev, FG_FP64));
    int ok = 1;
    for (int i = 0; i < 5; i++)
        ok &= in[i] == prev * 10 + i;
    FGD_CHECK(ok, "sendrecv ring");

    enum { R = 3 };
    float outs[R][64], ins[R][64];
    fg_comm_request *rq[R];
    for (int k = 0; k < R; k++) {
        for (int i = 0; i < 64; i++)
            outs[k][i] = (float)(fgd_rank * 1000 + k * 100 + i);
        FGD_OK(fg_comm_isendrecv(c, outs[k], 64, next, ins[k], 64, prev,
                                 FG_FP32, &rq[k]));
    }
    for (int k = R - 1; k >= 0; k--)
        FGD_OK(fg_comm_wait(rq[k]));
    ok = 1;
    for (int k = 0; k < R; k++)
        for (int i = 0; i < 64; i++)
            ok &= ins[k][i] == (float)(prev * 1000 + k * 100 + i);
    FGD_CHECK(ok, "isendrecv, %d rounds in flight", R);

    /* open chain 0 -> 1 -> ... -> N-1 */
    double x = fgd_rank, y = -1;
    FGD_OK(fg_comm_sendrecv(c, &x, 1, fgd_rank + 1 < fgd_size ? next : -1, &y,
                            1, fgd_rank > 0 ? prev : -1, FG_FP64));
    FGD_CHECK(fgd_rank == 0 ? y == -1 : y == prev, "chain: got %g", y);
}

/* Several nonblocking reductions in flight, advanced with fg_comm_test. */
static void test_nonblocking(fg_comm *c, int fixed)
{
    FGD_OK(fg_comm_set_fixed_order(c, fixed));
    enum { K = 4 };
    const size_t n = 257;
    float *buf[K];
    fg_comm_request *rq[K];
    for (int k = 0; k < K; k++) {
        buf[k] = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            buf[k][i] = (float)quarter(fgd_rank + k, i);
        FGD_OK(fg_comm_iallreduce(c, buf[k], buf[k], n, FG_FP32,
                                  FG_REDUCE_SUM, &rq[k]));
    }
    int spins = 0, all = 0;
    while (!all && spins < 1000000) {
        all = 1;
        for (int k = 0; k < K; k++) {
            int d = 0;
            FGD_OK(fg_comm_test(rq[k], &d));
            all &= d;
        }
        spins++;
    }
    for (int k = 0; k < K; k++) {
        FGD_OK(fg_comm_wait(rq[k]));
        int ok = 1;
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < fgd_size; r++)
                want += quarter(r + k, i);
            ok &= buf[k][i] == (float)want;
        }
        FGD_CHECK(ok, "iallreduce %d (fixed %d)", k, fixed);
        free(buf[k]);
    }
    fg_comm_request *rb;
    double z[3] = {fgd_rank, 1, 2};
    FGD_OK(fg_comm_ibroadcast(c, z, 3, FG_FP64, 0, &rb));
    FGD_OK(fg_comm_wait(rb));
    FGD_CHECK(z[0] == 0, "ibroadcast");
    FGD_OK(fg_comm_barrier(c));
}

static void test_errors(fg_comm *c)
{
    float a[8], b[8];
    fg_comm_request *rq = (fg_comm_request *)1;
    FGD_CHECK(fg_comm_allreduce(NULL, a, b, 8, FG_FP32, FG_REDUCE_SUM) ==
                  FG_ERR_INVALID_ARGUMENT, "NULL comm");
    FGD_CHECK(fg_comm_allreduce(c, a, a + 2, 4, FG_FP32, FG_REDUCE_SUM) ==
                  FG_ERR_INVALID_ARGUMENT, "overlapping all-reduce");
    FGD_CHECK(strstr(fg_last_error(), "overlap") != NULL, "message: %s",
              fg_last_error());
    FGD_CHECK(fg_comm_broadcast(c, a, 8, FG_FP32, fgd_size) ==
                  FG_ERR_INVALID_ARGUMENT, "bad root");
    FGD_CHECK(fg_comm_allreduce(c, a, b, 8, (fg_dtype)7, FG_REDUCE_SUM) ==
                  FG_ERR_INVALID_ARGUMENT, "bad dtype");
    FGD_CHECK(fg_comm_iallreduce(c, a, b, 8, FG_FP32, (fg_reduce_op)5, &rq) ==
                  FG_ERR_INVALID_ARGUMENT && rq == NULL, "bad op");
    FGD_CHECK(fg_comm_sendrecv(c, a, 1, -2, b, 1, 0, FG_FP32) ==
                  FG_ERR_INVALID_ARGUMENT, "bad dest");
    FGD_CHECK(fg_comm_allgather(c, a, NULL, 1, FG_FP32) ==
                  FG_ERR_INVALID_ARGUMENT, "NULL recv");
    fg_comm *n = NULL;
    fg_status s = fg_comm_init_nccl_mpi(c, -1, &n);
    if (fg_comm_backend_available(FG_COMM_NCCL))
        FGD_CHECK(s == FG_OK || s == FG_ERR_NO_DEVICE || s == FG_ERR_CUDA ||
                      s == FG_ERR_COMM, "NCCL over MPI: %s", fg_last_error());
    else
        FGD_CHECK(s == FG_ERR_UNSUPPORTED &&
                      strstr(fg_last_error(), "without NCCL"),
                  "NCCL in a build without it: %s", fg_last_error());
    fg_comm_free(n);
    FGD_CHECK(fg_comm_device(c) == FG_DEVICE_CPU &&
                  fg_comm_get_backend(c) == FG_COMM_MPI &&
                  fg_comm_local_rank(c) >= 0 && fg_comm_cuda_device(c) == -1,
              "properties");
}

/* The argument check: ranks whose counts, dtypes, reductions, roots or
 * operations differ, or one rank whose arguments are refused, fail on
 * every rank with FG_ERR_INVALID_ARGUMENT (without it: a hang on some
 * ranks, or data never sent). Matching calls still work under it. */
static void test_check_args(fg_comm *c)
{
    float a[16], b[16];
    for (int i = 0; i < 16; i++)
        a[i] = (float)quarter(fgd_rank, (size_t)i);
    FGD_CHECK(fg_comm_set_check_args(NULL, 1) == FG_ERR_INVALID_ARGUMENT,
              "NULL comm");
    FGD_OK(fg_comm_set_check_args(c, 1));
    const int last = fgd_size - 1, mixed = fgd_size > 1;
    FGD_OK(fg_comm_allreduce(c, a, b, 4, FG_FP32, FG_REDUCE_SUM));
    check_values(b, FG_FP32, 4, 0, FG_REDUCE_SUM, 0, "checked sum");
    fg_status s = fg_comm_allreduce(c, a, b, fgd_rank == last ? 8 : 4, FG_FP32,
                                    FG_REDUCE_SUM);
    FGD_CHECK(mixed ? s == FG_ERR_INVALID_ARGUMENT &&
                          strstr(fg_last_error(), "count differs")
                    : s == FG_OK,
              "counts: %s", fg_last_error());
    s = fg_comm_reduce_scatter(c, a, b, 2, FG_FP32,
                               fgd_rank == last ? FG_REDUCE_AVG : FG_REDUCE_SUM);
    FGD_CHECK(mixed ? s == FG_ERR_INVALID_ARGUMENT &&
                          strstr(fg_last_error(), "reduction differs")
                    : s == FG_OK,
              "reductions: %s", fg_last_error());
    s = fg_comm_broadcast(c, a, 4, FG_FP32, fgd_rank == last ? 0 : last);
    FGD_CHECK(mixed ? s == FG_ERR_INVALID_ARGUMENT &&
                          strstr(fg_last_error(), "root differs")
                    : s == FG_OK,
              "roots: %s", fg_last_error());
    /* one rank refuses its own arguments: every rank fails, that one with
     * its own reason */
    s = fg_comm_allgather(c, a, fgd_rank == last ? NULL : b, 2, FG_FP32);
    FGD_CHECK(s == FG_ERR_INVALID_ARGUMENT &&
                  strstr(fg_last_error(), fgd_rank == last ? "recv is NULL"
                                                           : "were refused"),
              "one rank refused: %s", fg_last_error());
    /* an all-reduce against a broadcast */
    s = fgd_rank == last ? fg_comm_broadcast(c, a, 4, FG_FP32, 0)
                         : fg_comm_allreduce(c, a, b, 4, FG_FP32, FG_REDUCE_SUM);
    FGD_CHECK(mixed ? s == FG_ERR_INVALID_ARGUMENT &&
                          strstr(fg_last_error(), "operation differs")
                    : s == FG_OK,
              "operations: %s", fg_last_error());
    FGD_OK(fg_comm_barrier(c));
    FGD_OK(fg_comm_set_check_args(c, 0));
}

int main(int argc, char **argv)
{
    fg_comm *c = fgd_init(&argc, &argv, 60);
    for (int fixed = 1; fixed >= 0; fixed--) {
        test_allreduce(c, fixed);
        test_reduce_scatter(c, fixed);
        test_nonblocking(c, fixed);
    }
    test_fixed_bitwise(c);
    test_allgather_bcast(c);
    test_sendrecv(c);
    test_errors(c);
    test_check_args(c);
    return fgd_finish(c, "test_dist_comm");
}
