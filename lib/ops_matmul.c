/* lib/ops_matmul.c - batched matrix products with transposes and
 * broadcast batch dimensions, forward and backward, on fg_gemm.
 *
 * Every product here, forward or backward, is C[b] (+)= A[b] B[b] over a
 * broadcast batch shape, each operand a strided matrix per batch index (so
 * transposes are just swapped strides). Two layouts become one GEMM: a
 * weight shared by every batch ([B, T, C] x [C, D]: the batch folds into
 * the rows), and a weight gradient summed over the batch (the batch folds
 * into the inner dimension). Anything else loops over the batch. */
#include <string.h>

#include "blas.h"
#include "ops_internal.h"

typedef struct mat {
    char *base;
    int64_t bstr[FG_MAX_DIMS]; /* element strides per batch dim (0: bcast) */
    int64_t rs, cs;            /* element strides of the matrix */
} mat;

typedef struct bmm_problem {
    fg_dtype dt;
    int bnd;
    int64_t bshape[FG_MAX_DIMS];
    int64_t M, N, K;
} bmm_problem;

/* t (>= 2 dims) as a matrix per batch index of bshape; trans swaps rows
 * and columns. */
static mat describe(const fg_tensor *t, int trans, const bmm_problem *p)
{
    mat m;
    m.base = fg_tensor_base(t);
    const int tb = t->nd - 2;
    for (int i = 0; i < p->bnd; i++) {
        int it = tb - p->bnd + i;
        m.bstr[i] = (it < 0 || (t->shape[it] == 1 && p->bshape[i] != 1))
                        ? 0
                        : t->stride[it];
    }
    m.rs = t->stride[t->nd - 2];
    m.cs = t->stride[t->nd - 1];
    if (trans) {
        int64_t x = m.rs;
        m.rs = m.cs;
        m.cs = x;
    }
    return m;
}

/* Can the batch dimensions followed by (extent, stride) be walked as one
 * dimension? If so, *stride is its stride. */
static int merges(const bmm_problem *p, const int64_t *bstr, int64_t extent,
                  int64_t last_stride, int64_t *stride)
{
    int64_t ext[FG_MAX_DIMS + 1], str[FG_MAX_DIMS + 1];
    int n = 0;
    for (int i = 0; i < p->bnd; i++)
        if (p->bshape[i] != 1) {
            ext[n] = p->bshape[i];
            str[n++] = bstr[i];
        }
    if (extent != 1) {
        ext[n] = extent;
        str[n++] = last_stride;
    }
    for (int i = 0; i + 1 < n; i++)
        if (str[i] != str[i + 1] * ext[i + 1])
            return 0;
    *stride = n ? str[n - 1] : 1;
    return 1;
}

static int all_zero(const bmm_problem *p, const int64_t *bstr)
{
    for (int i = 0; i < p->bnd; i++)
        if (p->bshape[i] != 1 && bstr[i] != 0)
            return 0;
    return 1;
}

/* C (+)= A B per batch. With `accumulate` C already holds values to add
 * to (it must when C is broadcast over a batch dim, i.e. a reduction). */
static void bmm(const bmm_problem *p, const mat *A, const mat *B, const mat *C,
                int accumulate)
{
    int64_t nb = 1, s1, s2;
    for (int i = 0; i < p->bnd; i++)
        nb *= p->bshape[i];
    if (nb == 0)
        return;
    const size_t es = fg_dtype_size(p->dt);
    const double beta = accumulate ? 1.0 : 0.0;
    /* Shared B: fold the batch into the rows of A and C. */
    if (all_zero(p, B->bstr) && !all_zero(p, C->bstr) &&
        merges(p, A->bstr, p->M, A->rs, &s1) &&
        merges(p, C->bstr, p->M, C->rs, &s2)) {
        fg_gemm(p->dt, nb * p->M, p->N, p->K, 1.0, A->base, s1, A->cs,
                B->base, B->rs, B->cs, beta, C->base, s2, C->cs);
        return;
    }
    /* C summed over the batch: fold the batch into the inner dimension. */
    if (all_zero(p, C->bstr) && merges(p, A->bstr, p->K, A->cs, &s1) &&
        merges(p, B->bstr, p->K, B->rs, &s2)) {
        fg_gemm(p->dt, p->M, p->N, nb * p->K, 1.0, A->base, A->rs, s1,
                B->base, s2, B->cs, beta, C->base, C->rs, C->cs);
        return;
    }
    int64_t idx[FG_MAX_DIMS] = {0};
    for (int64_t b = 0; b < nb; b++) {
        int64_t oa = 0, ob = 0, oc = 0;
        int c_reduced = 0;
        for (int i = 0; i < p->bnd; i++) {
            oa += idx[i] * A->bstr[i];
            ob += idx[i] * B->bstr[i];
            oc += idx[i] * C->bstr[i];
            c_reduced |= idx[i] > 0 && C->bstr[i] == 0;
        }
        /* A batch that revisits a C block must add to it. */
        const double bt = accumulate || c_reduced ? 1.0 : beta;
        fg_gemm(p->dt, p->M, p->N, p->K, 1.0, A->base + (size_t)oa * es,
                A->rs, A->cs, B->base + (size_t)ob * es, B->rs, B->cs, bt,
                C->base + (size_t)oc * es, C->rs, C->cs);
        for (int i = p->bnd - 1; i >= 0; i--) {
            if (++idx[i] < p->bshape[i])
                break;
            idx[i] = 0;
        }
    }
}

typedef struct mm_extra {
    int ta, tb;
} mm_extra;

static void problem(bmm_problem *p, const fg_tensor *a, const fg_tensor *b,
                    int ta, int tb)
{
    p->dt = a->dtype;
    fg_broadcast_shapes(a->nd - 2, a->shape, b->nd - 2, b->shape, &p->bnd,
                        p->bshape);
    p->M = ta ? a->shape[a->nd - 1] : a->shape[a->nd - 2];
    p->K = ta ? a->shape[a->nd - 2] : a->shape[a->nd - 1];
    p->N = tb ? b->shape[b->nd - 2] : b->shape[b->nd - 1];
}

static fg_status matmul_backward(fg_node *n, fg_tensor *const *g,
                                 fg_tensor **gin)
{
    const mm_extra *ex = fg_node_extra(n);
    const fg_tensor *a = fg_node_saved(n, 0), *b = fg_node_saved(n, 1);
    bmm_problem p;
    problem(&p, a, b, ex->ta, ex->tb);
    if (g[0]->device != FG_DEVICE_CPU)
        return fg_op_unsupported("MatmulBackward", g[0]->device);
    const mat dc = describe(g[0], 0, &p);
    fg_tensor *da = NULL, *db = NULL;
    if (fg_node_needs_grad(n, 0)) {
        /* op(a) grad [M, K] = dC [M, N] op(b)^T [N, K] */
        FG_TRY(fg_tensor_new_like(fg_bw_domain(), a, 1, &da));
        bmm_problem q = p;
        q.N = p.K;
        q.K = p.N;
        mat A = dc, B = describe(b, !ex->tb, &p), C = describe(da, ex->ta, &p);
        bmm(&q, &A, &B, &C, 1);
    }
    if (fg_node_needs_grad(n, 1)) {
        /* op(b) grad [K, N] = op(a)^T [K, M] dC [M, N] */
        fg_status s = fg_tensor_new_like(fg_bw_domain(), b, 1, &db);
        if (s != FG_OK) {
            fg_tensor_free(da);
            return s;
        }
        bmm_problem q = p;
        q.M = p.K;
        q.K = p.M;
        mat A = describe(a, !ex->ta, &p), B = dc, C = describe(db, ex->tb, &p);
        bmm(&q, &A, &B, &C, 1);
    }
    gin[0] = da;
    gin[1] = db;
    return FG_OK;
}

static const fg_op_def matmul_def = {"MatmulBackward", matmul_backward};

fg_status fg_matmul(fg_tensor *a, fg_tensor *b, int trans_a, int trans_b,
                    fg_tensor **out)
{
    static const char fn[] = "fg_matmul";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check2(fn, a, b));
    if (a->nd < 2 || b->nd < 2)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "operands need >= 2 dimensions (got %d and %d)", a->nd,
                       b->nd);
    trans_a = trans_a != 0;
    trans_b = trans_b != 0;
    bmm_problem p;
    int64_t kb = trans_b ? b->shape[b->nd - 1] : b->shape[b->nd - 2];
    char sa[128], sb[128];
    int nd;
    int64_t bs[FG_MAX_DIMS];
    if (!fg_broadcast_shapes(a->nd - 2, a->shape, b->nd - 2, b->shape, &nd,
                             bs))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "batch dimensions of %s and %s do not broadcast",
                       fg_fmt_shape(sa, sizeof sa, a->nd, a->shape),
                       fg_fmt_shape(sb, sizeof sb, b->nd, b->shape));
    problem(&p, a, b, trans_a, trans_b);
    if (p.K != kb)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "inner dimensions differ: %s%s x %s%s",
                       fg_fmt_shape(sa, sizeof sa, a->nd, a->shape),
                       trans_a ? "^T" : "",
                       fg_fmt_shape(sb, sizeof sb, b->nd, b->shape),
                       trans_b ? "^T" : "");
    if (p.bnd + 2 > FG_MAX_DIMS)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "too many dimensions");
    if (a->device != FG_DEVICE_CPU) /* the per-device dispatch point */
        return fg_op_unsupported(fn, a->device);
    int64_t shape[FG_MAX_DIMS];
    memcpy(shape, p.bshape, sizeof(int64_t) * (size_t)p.bnd);
    shape[p.bnd] = p.M;
    shape[p.bnd + 1] = p.N;
    fg_tensor *in[2] = {a, b}, *y;
    FG_TRY(fg_tensor_new(fg_alloc_domain(in, 2), a->dtype, a->device,
                         p.bnd + 2, shape, &y));
    mat A = describe(a, trans_a, &p), B = describe(b, trans_b, &p),
        C = describe(y, 0, &p);
    bmm(&p, &A, &B, &C, 0);
    mm_extra ex = {trans_a, trans_b};
    FG_TRY(fg_op_finish(&matmul_def, in, 2, &y, 1, in, 2, &ex, sizeof ex));
    *out = y;
    return FG_OK;
}
