/* lib/ops/ops_linear.c - the Linear layer's op (fg_linear), one node whose
 * bias add and bias gradient run in cuBLASLt epilogues on CUDA
 * (kernels/ops/gemm_lt.cu). Wherever cuBLASLt declines a GEMM that step
 * runs as the unfused ops run it (fg_matmul, fg_add and their backwards),
 * so the CPU's bits are theirs. */
#include <string.h>

#include "config.h"

#include "ops_internal.h"
#include "cuda_ops_blas.h" /* fg_lt_epilogue (plain C) */
#include "kernels/runtime/profile.h"

#ifdef FG_HAVE_CUDA
static int64_t rows(const fg_tensor *t)
{
    return t->numel / t->shape[t->nd - 1];
}
#endif

/* c = op(a) op(b) and epilogue e in one cuBLASLt GEMM, every tensor
 * contiguous on CUDA (a matrix is [rows, last dim]). *done 0 where it does
 * not apply (not CUDA, or no cuBLASLt kernel): nothing written. */
static fg_status lt(fg_lt_epilogue e, const fg_tensor *a, int ta,
                    const fg_tensor *b, int tb, fg_tensor *c,
                    const fg_tensor *bias, fg_tensor *aux, int *done)
{
    *done = 0;
#ifdef FG_HAVE_CUDA
    if (c->device != FG_DEVICE_CUDA)
        return FG_OK;
    fg_cuda_lt_gemm q;
    memset(&q, 0, sizeof q);
    q.dt = c->dtype;
    q.M = rows(c);
    q.N = c->shape[c->nd - 1];
    q.K = ta ? rows(a) : a->shape[a->nd - 1];
    q.A = fg_tensor_base(a);
    q.B = fg_tensor_base(b);
    q.ta = ta;
    q.tb = tb;
    q.C = fg_tensor_base(c);
    q.epilogue = e;
    q.bias = bias ? fg_tensor_base(bias) : NULL;
    q.aux = aux ? fg_tensor_base(aux) : NULL;
    return fg_cuda_gemm_lt(&q, done);
#else
    (void)e, (void)a, (void)ta, (void)b, (void)tb, (void)c, (void)bias;
    (void)aux;
    return FG_OK;
#endif
}

/* A new contiguous tensor like t with its last dimension n, in dom. */
static fg_status new_last(fg_arena *dom, const fg_tensor *t, int64_t n,
                          fg_tensor **out)
{
    int64_t shape[FG_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->nd);
    shape[t->nd - 1] = n;
    return fg_tensor_new(dom, t->dtype, t->device, t->nd, shape, out);
}

static fg_status new_meta(const fg_meta *m, fg_tensor **out)
{
    return fg_tensor_new(fg_bw_domain(), m->dtype, m->device, m->nd,
                         m->shape, out);
}

/* The gradients of y = x w (+ b) for gy (all contiguous): *dx = gy w^T
 * (nx), *dw = x^T gy (nw), *db = gy's column sums (nb; b's meta bm). On
 * CUDA two GEMMs writing fresh tensors, db in dw's epilogue (no memset, no
 * reduction kernel); whatever cuBLASLt declines as fg_matmul's backward
 * and fg_add's reduction compute it. */
static fg_status linear_grads(fg_tensor *x, fg_tensor *w, fg_tensor *gy,
                              int nx, int nw, int nb, const fg_meta *bm,
                              fg_tensor **dx, fg_tensor **dw, fg_tensor **db)
{
    fg_arena *dom = fg_bw_domain();
    int dx_done = !nx, dw_done = !nw, db_done = !nb;
    fg_status s = FG_OK;
    if (nw && x->device == FG_DEVICE_CUDA) {
        s = fg_tensor_new(dom, w->dtype, w->device, 2, w->shape, dw);
        if (s == FG_OK && nb)
            s = new_meta(bm, db);
        if (s == FG_OK)
            s = lt(nb ? FG_LT_BGRAD_B : FG_LT_DEFAULT, x, 1, gy, 0, *dw,
                   nb ? *db : NULL, NULL, &dw_done);
        db_done = !nb || dw_done;
    }
    if (s == FG_OK && nx && x->device == FG_DEVICE_CUDA) {
        s = new_last(dom, gy, w->shape[0], dx);
        if (s == FG_OK)
            s = lt(FG_LT_DEFAULT, gy, 0, w, 1, *dx, NULL, NULL, &dx_done);
    }
    if (s == FG_OK && (!dx_done || !dw_done)) {
        fg_tensor *gx = NULL, *gw = NULL;
        s = fg_matmul_grads(x, 0, w, 0, gy, !dx_done, !dw_done, &gx, &gw);
        if (s == FG_OK && gx) {
            fg_tensor_free(*dx);
            *dx = gx;
        }
        if (s == FG_OK && gw) {
            fg_tensor_free(*dw);
            *dw = gw;
        }
    }
    if (s == FG_OK && !db_done) {
        fg_tensor_free(*db);
        *db = NULL;
        s = fg_sum_to_shape(gy, bm->nd, bm->shape, db);
    }
    return s;
}

static void free_grads(fg_tensor **gin, int n)
{
    for (int i = 0; i < n; i++) {
        fg_tensor_free(gin[i]);
        gin[i] = NULL;
    }
}

/* ---- fg_linear ---------------------------------------------------------- */

/* Inputs x, w, b; saved x, w (contiguous, one dtype, on CUDA). */
static fg_status linear_backward(fg_node *n, fg_tensor *const *g,
                                 fg_tensor **gin)
{
    fg_tensor *gy = NULL;
    FG_TRY(fg_contiguous_raw(g[0], fg_bw_domain(), &gy));
    fg_meta bm;
    fg_node_input_meta(n, 2, &bm);
    fg_status s = linear_grads(fg_node_saved(n, 0), fg_node_saved(n, 1), gy,
                               fg_node_needs_grad(n, 0),
                               fg_node_needs_grad(n, 1),
                               fg_node_needs_grad(n, 2), &bm, &gin[0],
                               &gin[1], &gin[2]);
    fg_tensor_free(gy);
    if (s != FG_OK)
        free_grads(gin, 3);
    return s;
}

static const fg_op_def linear_def = {"LinearBackward", linear_backward, NULL};

/* Every operand contiguous, one dtype, x [..., K], w [K, N], b [N]. */
static int linear_shapes(const fg_tensor *x, const fg_tensor *w,
                         const fg_tensor *b)
{
    return w->dtype == x->dtype && b->dtype == x->dtype &&
           w->device == x->device && b->device == x->device && x->nd >= 2 &&
           w->nd == 2 && b->nd == 1 && fg_tensor_is_contiguous(x) &&
           fg_tensor_is_contiguous(w) && fg_tensor_is_contiguous(b) &&
           x->shape[x->nd - 1] == w->shape[0] && b->shape[0] == w->shape[1] &&
           x->numel > 0 && w->numel > 0;
}

/* The one-node form, on CUDA only: *y NULL (and FG_OK) when it does not
 * apply or cuBLASLt has no bias epilogue for it. */
static fg_status linear_fused(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                              fg_tensor **y)
{
    *y = NULL;
    if (x->device != FG_DEVICE_CUDA || !linear_shapes(x, w, b))
        return FG_OK;
    fg_tensor *in[3] = {x, w, b}, *out;
    FG_TRY(new_last(fg_alloc_domain(in, 3), x, w->shape[1], &out));
    int done = 0;
    fg_status s = lt(FG_LT_BIAS, x, 0, w, 0, out, b, NULL, &done);
    if (s != FG_OK || !done) {
        fg_tensor_free(out);
        return s;
    }
    FG_TRY(fg_op_finish(&linear_def, in, 3, &out, 1, in, 2, NULL, 0));
    *y = out;
    return FG_OK;
}

static fg_status fg_linear_impl(fg_tensor *x, fg_tensor *w, fg_tensor *b,
                                fg_tensor **out)
{
    FG_TRY(fg_op_check_out("fg_linear", out));
    if (!b)
        return fg_matmul(x, w, 0, 0, out);
    FG_TRY(fg_op_check2("fg_linear", x, w));
    FG_TRY(fg_op_check2("fg_linear", x, b));
    fg_tensor *y = NULL;
    FG_TRY(linear_fused(x, w, b, &y));
    if (y) {
        *out = y;
        return FG_OK;
    }
    /* Elsewhere the two ops it fuses (the CPU's bits are theirs). */
    fg_tensor *t = NULL;
    FG_TRY(fg_matmul(x, w, 0, 0, &t));
    fg_status s = fg_add(t, b, out);
    fg_tensor_free(t);
    return s;
}

fg_status fg_linear(fg_tensor *x, fg_tensor *w, fg_tensor *b, fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_GEMM, fg_linear_impl(x, w, b, out));
}

