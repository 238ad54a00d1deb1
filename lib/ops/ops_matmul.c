/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_matmul.c - batched matrix products with transposes and
 * broadcast batch dimensions, forward and backward, on fg_gemm.
 *
 * Every product here, forward or backward, is C[b] (+)= A[b] B[b] over a
 * broadcast batch shape, each operand a strided matrix per batch index (so
 * transposes are just swapped strides). Two layouts become one GEMM: a
 * weight shared by every batch ([B, T, C] x [C, D]: the batch folds into
 * the rows), and a weight gradient summed over the batch (the batch folds
 * into the inner dimension). Anything else loops over the batch; on the
 * GPU the innermost uniformly strided batch dimensions become one
 * strided-batched cuBLAS call per iteration of that loop. */
#include <string.h>

#include "config.h"

#include "lib/core/blas.h"
#include "ops_internal.h"
#include "kernels/runtime/profile.h"
#ifdef FG_HAVE_CUDA
#include "cuda_ops_blas.h"
#endif

typedef struct mat {
    char *base;
    int64_t bstr[FG_MAX_DIMS]; /* element strides per batch dim (0: bcast) */
    int64_t rs, cs;            /* element strides of the matrix */
} mat;

typedef struct bmm_problem {
    fg_dtype dt;
    fg_device dev;
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

/* One GEMM, C = A B + beta C, on the problem's device. */
static fg_status gemm1(const bmm_problem *p, int64_t M, int64_t N, int64_t K,
                       const char *A, int64_t a_rs, int64_t a_cs,
                       const char *B, int64_t b_rs, int64_t b_cs, double beta,
                       char *C, int64_t c_rs, int64_t c_cs)
{
#ifdef FG_HAVE_CUDA
    if (p->dev == FG_DEVICE_CUDA)
        return fg_cuda_gemm(p->dt, M, N, K, 1.0, A, a_rs, a_cs, B, b_rs, b_cs,
                            beta, C, c_rs, c_cs, 1, 0, 0, 0);
#endif
    fg_gemm(p->dt, M, N, K, 1.0, A, a_rs, a_cs, B, b_rs, b_cs, beta, C, c_rs,
            c_cs);
    return FG_OK;
}

#ifdef FG_HAVE_CUDA
/* The GPU's batch loop: the innermost batch dimensions that walk A, B and
 * C with one stride each (and along which C is not reduced: a
 * strided-batched call must not revisit a C block) become the batch of one
 * cublasGemmStridedBatchedEx; the outer dimensions loop, as on the CPU. */
static fg_status bmm_cuda(const bmm_problem *p, const mat *A, const mat *B,
                          const mat *C, int accumulate)
{
    const size_t es = fg_dtype_size(p->dt);
    int d[FG_MAX_DIMS], nd = 0;
    for (int i = 0; i < p->bnd; i++)
        if (p->bshape[i] != 1)
            d[nd++] = i;
    int L = 0; /* d[nd - L .. nd - 1] go to cuBLAS's batch */
    while (L < nd) {
        const int i = d[nd - 1 - L];
        if (C->bstr[i] == 0)
            break;
        if (L > 0) {
            const int j = d[nd - L]; /* the inner neighbour */
            if (A->bstr[i] != A->bstr[j] * p->bshape[j] ||
                B->bstr[i] != B->bstr[j] * p->bshape[j] ||
                C->bstr[i] != C->bstr[j] * p->bshape[j])
                break;
        }
        L++;
    }
    int64_t count = 1, sa = 0, sb = 0, sc = 0;
    for (int k = nd - L; k < nd; k++)
        count *= p->bshape[d[k]];
    if (L > 0) {
        sa = A->bstr[d[nd - 1]];
        sb = B->bstr[d[nd - 1]];
        sc = C->bstr[d[nd - 1]];
    }
    const int no = nd - L; /* outer dimensions d[0 .. no - 1] */
    int64_t idx[FG_MAX_DIMS] = {0};
    for (;;) {
        int64_t oa = 0, ob = 0, oc = 0;
        int c_reduced = 0;
        for (int k = 0; k < no; k++) {
            const int i = d[k];
            oa += idx[k] * A->bstr[i];
            ob += idx[k] * B->bstr[i];
            oc += idx[k] * C->bstr[i];
            c_reduced |= idx[k] > 0 && C->bstr[i] == 0;
        }
        /* A batch that revisits a C block must add to it. */
        const double bt = accumulate || c_reduced ? 1.0 : 0.0;
        FG_TRY(fg_cuda_gemm(p->dt, p->M, p->N, p->K, 1.0,
                            A->base + oa * (int64_t)es, A->rs, A->cs,
                            B->base + ob * (int64_t)es, B->rs, B->cs, bt,
                            C->base + oc * (int64_t)es, C->rs, C->cs, count,
                            sa, sb, sc));
        int k = no - 1;
        for (; k >= 0; k--) {
            if (++idx[k] < p->bshape[d[k]])
                break;
            idx[k] = 0;
        }
        if (k < 0)
            return FG_OK;
    }
}
#endif

/* C (+)= A B per batch. With `accumulate` C already holds values to add
 * to (it must when C is broadcast over a batch dim, i.e. a reduction). */
static fg_status bmm(const bmm_problem *p, const mat *A, const mat *B,
                     const mat *C, int accumulate)
{
    int64_t nb = 1, s1, s2;
    for (int i = 0; i < p->bnd; i++)
        nb *= p->bshape[i];
    if (nb == 0)
        return FG_OK;
    const size_t es = fg_dtype_size(p->dt);
    const double beta = accumulate ? 1.0 : 0.0;
    /* Shared B: fold the batch into the rows of A and C. */
    if (all_zero(p, B->bstr) && !all_zero(p, C->bstr) &&
        merges(p, A->bstr, p->M, A->rs, &s1) &&
        merges(p, C->bstr, p->M, C->rs, &s2))
        return gemm1(p, nb * p->M, p->N, p->K, A->base, s1, A->cs, B->base,
                     B->rs, B->cs, beta, C->base, s2, C->cs);
    /* C summed over the batch: fold the batch into the inner dimension. */
    if (all_zero(p, C->bstr) && merges(p, A->bstr, p->K, A->cs, &s1) &&
        merges(p, B->bstr, p->K, B->rs, &s2))
        return gemm1(p, p->M, p->N, nb * p->K, A->base, A->rs, s1, B->base,
                     s2, B->cs, beta, C->base, C->rs, C->cs);
#ifdef FG_HAVE_CUDA
    if (p->dev == FG_DEVICE_CUDA)
        return bmm_cuda(p, A, B, C, accumulate);
#endif
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
        FG_TRY(gemm1(p, p->M, p->N, p->K, A->base + (size_t)oa * es, A->rs,
                     A->cs, B->base + (size_t)ob * es, B->rs, B->cs, bt,
                     C->base + (size_t)oc * es, C->rs, C->cs));
        for (int i = p->bnd - 1; i >= 0; i--) {
            if (++idx[i] < p->bshape[i])
                break;
            idx[i] = 0;
        }
    }
    return FG_OK;
}

/* The tensor a GEMM reads for operand x: on the GPU, one whose matrix
 * dimensions have no unit stride (cuBLAS cannot read it) is copied to
 * contiguous once here instead of being packed for every GEMM. *tmp is
 * that copy, for the caller to free (NULL: x itself is used). */
static fg_status gemm_operand(const fg_tensor *x, fg_arena *dom,
                              const fg_tensor **use, fg_tensor **tmp)
{
    *use = x;
    *tmp = NULL;
#ifdef FG_HAVE_CUDA
    int tr;
    int64_t ld;
    if (x->device == FG_DEVICE_CUDA &&
        !fg_cuda_gemm_layout(x->shape[x->nd - 2], x->shape[x->nd - 1],
                             x->stride[x->nd - 2], x->stride[x->nd - 1], &tr,
                             &ld)) {
        FG_TRY(fg_contiguous_raw((fg_tensor *)x, dom, tmp));
        *use = *tmp;
    }
#else
    (void)dom;
#endif
    return FG_OK;
}

typedef struct mm_extra {
    int ta, tb;
} mm_extra;

static void problem(bmm_problem *p, const fg_tensor *a, const fg_tensor *b,
                    int ta, int tb)
{
    p->dt = a->dtype;
    p->dev = a->device;
    fg_broadcast_shapes(a->nd - 2, a->shape, b->nd - 2, b->shape, &p->bnd,
                        p->bshape);
    p->M = ta ? a->shape[a->nd - 1] : a->shape[a->nd - 2];
    p->K = ta ? a->shape[a->nd - 2] : a->shape[a->nd - 1];
    p->N = tb ? b->shape[b->nd - 2] : b->shape[b->nd - 1];
}

/* The per-device dispatch point of both passes: the CPU (fp32/fp64, on
 * fg_gemm) or, in CUDA builds, CUDA (fp64/fp32/fp16/bf16, on cuBLAS). */
static fg_status device_ok(const char *fn, fg_device dev, fg_dtype dt)
{
    if (dev == FG_DEVICE_CPU) {
        if (dt != FG_FP32 && dt != FG_FP64)
            return fg_error(FG_ERR_UNSUPPORTED,
                            "%s: %s on the CPU; CPU products are fp32/fp64",
                            fn, fg_dtype_name(dt));
        return FG_OK;
    }
#ifdef FG_HAVE_CUDA
    if (dev == FG_DEVICE_CUDA)
        return FG_OK;
#endif
    return fg_op_unsupported(fn, dev);
}

fg_status fg_matmul_grads(const fg_tensor *a0, int ta, const fg_tensor *b0,
                          int tb, fg_tensor *g, int need_a, int need_b,
                          fg_tensor **ga, fg_tensor **gb)
{
    bmm_problem p;
    problem(&p, a0, b0, ta, tb);
    FG_TRY(device_ok("MatmulBackward", g->device, g->dtype));
    fg_arena *dom = fg_bw_domain();
    const fg_tensor *a = a0, *b = b0, *gc = g;
    fg_tensor *tmp[3] = {NULL, NULL, NULL}, *da = NULL, *db = NULL;
    fg_status s = gemm_operand(g, dom, &gc, &tmp[0]);
    if (s == FG_OK)
        s = gemm_operand(a0, dom, &a, &tmp[1]);
    if (s == FG_OK)
        s = gemm_operand(b0, dom, &b, &tmp[2]);
    const mat dc = describe(gc, 0, &p);
    if (s == FG_OK && need_a) {
        /* op(a) grad [M, K] = dC [M, N] op(b)^T [N, K] */
        s = fg_tensor_new_like(dom, a0, 1, &da);
        if (s == FG_OK) {
            bmm_problem q = p;
            q.N = p.K;
            q.K = p.N;
            mat A = dc, B = describe(b, !tb, &p), C = describe(da, ta, &p);
            s = bmm(&q, &A, &B, &C, 1);
        }
    }
    if (s == FG_OK && need_b) {
        /* op(b) grad [K, N] = op(a)^T [K, M] dC [M, N] */
        s = fg_tensor_new_like(dom, b0, 1, &db);
        if (s == FG_OK) {
            bmm_problem q = p;
            q.M = p.K;
            q.K = p.M;
            mat A = describe(a, !ta, &p), B = dc, C = describe(db, tb, &p);
            s = bmm(&q, &A, &B, &C, 1);
        }
    }
    for (int i = 0; i < 3; i++)
        fg_tensor_free(tmp[i]);
    if (s != FG_OK) {
        fg_tensor_free(da);
        fg_tensor_free(db);
        return s;
    }
    *ga = da;
    *gb = db;
    return FG_OK;
}

static fg_status matmul_backward(fg_node *n, fg_tensor *const *g,
                                 fg_tensor **gin)
{
    const mm_extra *ex = fg_node_extra(n);
    return fg_matmul_grads(fg_node_saved(n, 0), ex->ta, fg_node_saved(n, 1),
                           ex->tb, g[0], fg_node_needs_grad(n, 0),
                           fg_node_needs_grad(n, 1), &gin[0], &gin[1]);
}

fg_status fg_matmul_raw(fg_tensor *a, int ta, fg_tensor *b, int tb,
                        fg_tensor *c, int accumulate)
{
    bmm_problem p;
    problem(&p, a, b, ta, tb);
    FG_TRY(device_ok("fg_matmul", a->device, a->dtype));
    fg_tensor *in[2] = {a, b};
    fg_arena *dom = fg_alloc_domain(in, 2);
    const fg_tensor *ua = a, *ub = b;
    fg_tensor *xa = NULL, *xb = NULL;
    fg_status s = gemm_operand(a, dom, &ua, &xa);
    if (s == FG_OK)
        s = gemm_operand(b, dom, &ub, &xb);
    if (s == FG_OK) {
        mat A = describe(ua, ta, &p), B = describe(ub, tb, &p),
            C = describe(c, 0, &p);
        s = bmm(&p, &A, &B, &C, accumulate);
    }
    fg_tensor_free(xa);
    fg_tensor_free(xb);
    return s;
}

static const fg_op_def matmul_def = {"MatmulBackward", matmul_backward, NULL};

static fg_status fg_matmul_impl(fg_tensor *a, fg_tensor *b, int trans_a,
                                int trans_b,
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
    FG_TRY(device_ok(fn, a->device, a->dtype));
    int64_t shape[FG_MAX_DIMS];
    memcpy(shape, p.bshape, sizeof(int64_t) * (size_t)p.bnd);
    shape[p.bnd] = p.M;
    shape[p.bnd + 1] = p.N;
    fg_tensor *in[2] = {a, b}, *y;
    fg_arena *dom = fg_alloc_domain(in, 2);
    FG_TRY(fg_tensor_new(dom, a->dtype, a->device, p.bnd + 2, shape, &y));
    fg_status s = fg_matmul_raw(a, trans_a, b, trans_b, y, 0);
    if (s != FG_OK) {
        fg_tensor_free(y);
        return s;
    }
    mm_extra ex = {trans_a, trans_b};
    FG_TRY(fg_op_finish(&matmul_def, in, 2, &y, 1, in, 2, &ex, sizeof ex));
    *out = y;
    return FG_OK;
}

fg_status fg_matmul(fg_tensor *a, fg_tensor *b, int trans_a, int trans_b,
                    fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_GEMM, fg_matmul_impl(a, b, trans_a, trans_b, out));
}
