/* SPDX-License-Identifier: MIT */
/* lib/autograd/tensor_iter.c - strided multi-operand iteration (see tensor_iter.h). */
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "tensor_iter.h"

/* Below this many elements threads cost more than they save. */
#define PAR_MIN_ELEMS 32768

void fg_iter_init(fg_iter *it, int nd, const int64_t *shape, int nops,
                  char *const *base, const int64_t *const *strides,
                  const size_t *esize)
{
    it->nops = nops;
    it->numel = 1;
    for (int k = 0; k < nops; k++)
        it->base[k] = base[k];
    /* Drop extent-1 dimensions (their strides never matter). */
    int m = 0;
    for (int d = 0; d < nd; d++) {
        it->numel *= shape[d];
        if (shape[d] == 1)
            continue;
        it->shape[m] = shape[d];
        for (int k = 0; k < nops; k++)
            it->stride[k][m] = strides[k][d] * (int64_t)esize[k];
        m++;
    }
    if (m == 0) {
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++)
            it->stride[k][0] = 0;
        m = 1;
    }
    /* Merge dimension d into d+1 when every operand steps through them as
     * one: stride[d] == stride[d+1] * shape[d+1]. */
    int out = 0;
    for (int d = 1; d < m; d++) {
        int ok = 1;
        for (int k = 0; k < nops; k++)
            if (it->stride[k][out] != it->stride[k][d] * it->shape[d]) {
                ok = 0;
                break;
            }
        if (ok) {
            it->shape[out] *= it->shape[d];
            for (int k = 0; k < nops; k++)
                it->stride[k][out] = it->stride[k][d];
        } else {
            out++;
            it->shape[out] = it->shape[d];
            for (int k = 0; k < nops; k++)
                it->stride[k][out] = it->stride[k][d];
        }
    }
    it->nd = out + 1;
}

/* Runs rows [r0, r1) of the iteration. */
static void run_rows(const fg_iter *it, int64_t r0, int64_t r1,
                     fg_iter_row_fn fn, void *ctx)
{
    const int nd = it->nd, nops = it->nops;
    const int64_t inner = it->shape[nd - 1];
    int64_t idx[FG_MAX_DIMS] = {0};
    char *p[FG_ITER_MAX_OPS];
    int64_t s[FG_ITER_MAX_OPS];
    for (int k = 0; k < nops; k++) {
        p[k] = it->base[k];
        s[k] = it->stride[k][nd - 1];
    }
    /* Position of row r0. */
    int64_t r = r0;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = r % it->shape[d];
        r /= it->shape[d];
        for (int k = 0; k < nops; k++)
            p[k] += idx[d] * it->stride[k][d];
    }
    for (int64_t row = r0; row < r1; row++) {
        char *q[FG_ITER_MAX_OPS];
        memcpy(q, p, sizeof(char *) * (size_t)nops);
        fn(ctx, q, s, inner);
        for (int d = nd - 2; d >= 0; d--) {
            for (int k = 0; k < nops; k++)
                p[k] += it->stride[k][d];
            if (++idx[d] < it->shape[d])
                break;
            for (int k = 0; k < nops; k++)
                p[k] -= it->stride[k][d] * it->shape[d];
            idx[d] = 0;
        }
    }
}

void fg_iter_run(const fg_iter *it, fg_iter_row_fn fn, void *ctx)
{
    if (it->numel == 0)
        return;
    run_rows(it, 0, it->numel / it->shape[it->nd - 1], fn, ctx);
}

/* `work` estimates the elements touched, to decide on threads. */
static void run_parallel(const fg_iter *it, fg_iter_row_fn fn, void *ctx,
                         int64_t work)
{
    if (it->numel == 0)
        return;
    const int64_t rows = it->numel / it->shape[it->nd - 1];
#ifdef _OPENMP
    if (work >= PAR_MIN_ELEMS && rows > 1 && !omp_in_parallel()) {
#pragma omp parallel
        {
            int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
            int64_t per = (rows + nt - 1) / nt;
            int64_t r0 = t * per, r1 = r0 + per < rows ? r0 + per : rows;
            if (r0 < r1)
                run_rows(it, r0, r1, fn, ctx);
        }
        return;
    }
#else
    (void)work;
#endif
    run_rows(it, 0, rows, fn, ctx);
}

void fg_iter_run_parallel(const fg_iter *it, fg_iter_row_fn fn, void *ctx)
{
    run_parallel(it, fn, ctx, it->numel);
}

int fg_broadcast_shapes(int nd_a, const int64_t *sa, int nd_b,
                        const int64_t *sb, int *nd, int64_t *shape)
{
    int n = nd_a > nd_b ? nd_a : nd_b;
    for (int i = 0; i < n; i++) {
        int ia = nd_a - n + i, ib = nd_b - n + i;
        int64_t ea = ia >= 0 ? sa[ia] : 1, eb = ib >= 0 ? sb[ib] : 1;
        if (ea != eb && ea != 1 && eb != 1)
            return 0;
        shape[i] = ea == 1 ? eb : ea;
    }
    *nd = n;
    return 1;
}

void fg_broadcast_strides(const fg_tensor *t, int nd, const int64_t *shape,
                          int64_t *strides)
{
    for (int i = 0; i < nd; i++) {
        int it = t->nd - nd + i;
        if (it < 0 || (t->shape[it] == 1 && shape[i] != 1))
            strides[i] = 0;
        else
            strides[i] = t->stride[it];
    }
}

typedef struct lane_ctx {
    fg_lane_fn fn;
    void *ctx;
    int nops;
    int64_t s[FG_ITER_MAX_OPS];
    int64_t n;
} lane_ctx;

static void lane_row(void *c, char **p, const int64_t *s, int64_t n)
{
    lane_ctx *lc = c;
    char *q[FG_ITER_MAX_OPS];
    for (int64_t j = 0; j < n; j++) {
        for (int k = 0; k < lc->nops; k++)
            q[k] = p[k] + j * s[k];
        lc->fn(lc->ctx, q, lc->s, lc->n);
    }
}

void fg_for_each_lane(int nd, const int64_t *shape, int dim, int nops,
                      char *const *base, const int64_t *const *strides,
                      const size_t *esize, int parallel, fg_lane_fn fn,
                      void *ctx)
{
    int64_t oshape[FG_MAX_DIMS];
    int64_t ostr[FG_ITER_MAX_OPS][FG_MAX_DIMS];
    const int64_t *optr[FG_ITER_MAX_OPS];
    lane_ctx lc = {fn, ctx, nops, {0}, shape[dim]};
    int m = 0;
    for (int d = 0; d < nd; d++) {
        if (d == dim)
            continue;
        oshape[m] = shape[d];
        for (int k = 0; k < nops; k++)
            ostr[k][m] = strides[k][d];
        m++;
    }
    for (int k = 0; k < nops; k++) {
        lc.s[k] = strides[k][dim] * (int64_t)esize[k];
        optr[k] = ostr[k];
    }
    if (shape[dim] == 0)
        return;
    fg_iter it;
    fg_iter_init(&it, m, oshape, nops, base, optr, esize);
    if (parallel)
        run_parallel(&it, lane_row, &lc, it.numel * shape[dim]);
    else
        fg_iter_run(&it, lane_row, &lc);
}
