/* SPDX-License-Identifier: MIT */
/* lib/autograd/autograd.c - grad mode, recording nodes on the tape, node lifetime,
 * and the autograd state of tensors (requires_grad, .grad, retain_grad). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "autograd_internal.h"
#include "lib/core/error.h"
#include "tensor_iter.h"
#ifdef FG_HAVE_CUDA
#include "cuda_backend.h"
#endif

/* ---- grad mode --------------------------------------------------------- */

static _Thread_local int tls_no_grad;

void fg_no_grad_begin(void) { tls_no_grad++; }

fg_status fg_no_grad_end(void)
{
    if (tls_no_grad == 0)
        return FG_FAIL(FG_ERR_STATE, "no matching fg_no_grad_begin()");
    tls_no_grad--;
    return FG_OK;
}

int fg_grad_enabled(void) { return tls_no_grad == 0; }

static atomic_uint_fast64_t g_seq, g_epoch;

uint64_t fg_ag_next_seq(void) { return atomic_fetch_add(&g_seq, 1) + 1; }
uint64_t fg_ag_next_epoch(void) { return atomic_fetch_add(&g_epoch, 1) + 1; }

/* ---- recording ----------------------------------------------------------- */

int fg_ag_should_record(fg_tensor *const *inputs, int n)
{
    if (!fg_grad_enabled())
        return 0;
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad)
            return 1;
    return 0;
}

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

fg_status fg_ag_record(const fg_op_def *op, fg_tensor *const *inputs,
                       int n_in, fg_tensor *const *outputs, int n_out,
                       fg_tensor *const *saved, int n_saved,
                       const void *extra, size_t extra_bytes, fg_node **node)
{
    fg_arena *a = fg_alloc_domain(inputs, n_in);
    const size_t off_edges = align16(sizeof(fg_node));
    const size_t off_meta = align16(off_edges + (size_t)n_in * sizeof(fg_edge));
    const size_t off_saved =
        align16(off_meta + (size_t)n_out * sizeof(fg_meta));
    const size_t off_gbuf =
        align16(off_saved + (size_t)n_saved * sizeof(fg_saved));
    const size_t off_extra =
        align16(off_gbuf + (size_t)n_out * sizeof(fg_tensor *));
    fg_node *n = fg_obj_new(a, off_extra + extra_bytes, FG_OBJ_NODE);
    if (!n)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "cannot record %s", op->name);
    char *base = (char *)n;
    n->op = op;
    n->edges = (fg_edge *)(base + off_edges);
    n->out_meta = (fg_meta *)(base + off_meta);
    n->saved = (fg_saved *)(base + off_saved);
    n->grad_buf = (fg_tensor **)(base + off_gbuf);
    n->extra = base + off_extra;
    n->extra_bytes = extra_bytes;
    if (extra_bytes)
        memcpy(n->extra, extra, extra_bytes);

    /* Saved tensors first: the only step that can still fail. */
    for (int i = 0; i < n_saved; i++) {
        fg_tensor *s = saved[i], *keep = s;
        for (int j = 0; j < n_out; j++)
            if (s == outputs[j]) { /* own output: detached alias */
                if (fg_tensor_view_new(a, s, s->nd, s->shape, s->stride,
                                       s->offset, &keep) != FG_OK) {
                    fg_obj_release(&n->obj);
                    return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "cannot record %s",
                                   op->name);
                }
                break;
            }
        if (keep == s && s)
            fg_tensor_retain(s);
        n->saved[i].t = keep;
        n->saved[i].version = s ? s->storage->version : 0;
        n->n_saved = i + 1;
    }

    n->seq = fg_ag_next_seq();
    n->n_inputs = n_in;
    for (int i = 0; i < n_in; i++) {
        fg_tensor *x = inputs[i];
        if (!x || !x->requires_grad)
            continue;
        if (x->grad_fn) {
            n->edges[i].node = x->grad_fn;
            n->edges[i].output_nr = x->output_nr;
            fg_obj_retain(&x->grad_fn->obj);
        } else {
            n->edges[i].leaf = fg_tensor_retain(x);
        }
    }
    n->n_outputs = n_out;
    for (int j = 0; j < n_out; j++) {
        fg_tensor *y = outputs[j];
        fg_meta *m = &n->out_meta[j];
        m->nd = y->nd;
        memcpy(m->shape, y->shape, sizeof m->shape);
        m->numel = y->numel;
        m->dtype = y->dtype;
        m->device = y->device;
        y->requires_grad = 1;
        y->grad_fn = n;
        y->output_nr = j;
        fg_obj_retain(&n->obj);
    }
    if (node)
        *node = n;
    fg_obj_release(&n->obj); /* the outputs hold it now */
    return FG_OK;
}

void fg_node_release_saved(fg_node *n)
{
    for (int i = 0; i < n->n_saved; i++) {
        fg_tensor_free(n->saved[i].t);
        n->saved[i].t = NULL;
    }
    n->freed = 1;
}

void fg_node_drop_refs(fg_node *n)
{
    fg_hooks_detach_all(&n->hooks);
    if (!n->freed)
        fg_node_release_saved(n);
    for (int i = 0; i < n->n_inputs; i++) {
        fg_obj_release(n->edges[i].node ? &n->edges[i].node->obj : NULL);
        fg_tensor_free(n->edges[i].leaf);
        n->edges[i].node = NULL;
        n->edges[i].leaf = NULL;
    }
    for (int j = 0; j < n->n_outputs; j++) {
        fg_tensor_free(n->grad_buf[j]);
        n->grad_buf[j] = NULL;
    }
}

/* ---- node queries -------------------------------------------------------- */

const char *fg_node_name(const fg_node *n) { return n ? n->op->name : ""; }
int fg_node_num_inputs(const fg_node *n) { return n ? n->n_inputs : 0; }
int fg_node_num_outputs(const fg_node *n) { return n ? n->n_outputs : 0; }
int fg_node_is_freed(const fg_node *n) { return n ? n->freed : 0; }

size_t fg_node_saved_bytes(const fg_node *n)
{
    if (!n || n->freed)
        return 0;
    size_t b = n->extra_bytes;
    for (int i = 0; i < n->n_saved; i++)
        if (n->saved[i].t)
            b += fg_tensor_nbytes(n->saved[i].t);
    return b;
}

/* ---- tensor autograd state ---------------------------------------------- */

fg_status fg_tensor_set_requires_grad(fg_tensor *t, int requires)
{
    if (!t)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor is NULL");
    if (t->grad_fn)
        return FG_FAIL(FG_ERR_STATE,
                       "requires_grad can only be changed on leaves (this "
                       "tensor comes from %s)",
                       t->grad_fn->op->name);
    t->requires_grad = requires != 0;
    return FG_OK;
}

int fg_tensor_requires_grad(const fg_tensor *t)
{
    return t ? t->requires_grad : 0;
}
int fg_tensor_is_leaf(const fg_tensor *t) { return t ? !t->grad_fn : 1; }
fg_tensor *fg_tensor_grad(const fg_tensor *t) { return t ? t->grad : NULL; }
fg_node *fg_tensor_grad_fn(const fg_tensor *t)
{
    return t ? t->grad_fn : NULL;
}

fg_status fg_tensor_retain_grad(fg_tensor *t)
{
    if (!t)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor is NULL");
    if (!t->requires_grad)
        return FG_FAIL(FG_ERR_STATE,
                       "retain_grad on a tensor that does not require grad");
    if (!t->grad_fn || t->retains_grad)
        return FG_OK;
    /* A retain record on grad_fn: the tensor keeps a handle share, so the
     * record outlives neither side (see fg_tensor_drop_refs). */
    FG_TRY(fg_hook_add(&t->grad_fn->hooks, t->grad_fn, 1, FG_HOOK_RETAIN,
                       t->output_nr, NULL, t, &t->retain_hook));
    t->retains_grad = 1;
    return FG_OK;
}

fg_status fg_tensor_zero_grad(fg_tensor *t)
{
    if (!t)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor is NULL");
    if (t->grad) {
        FG_TRY(fg_fill_strided(t->grad, 0.0));
        fg_tensor_bump_version(t->grad);
    }
    return FG_OK;
}

#ifdef FG_HAVE_CUDA
/* The contiguous CUDA gradients among tensors[0..n-1] zeroed by one
 * kernel (instead of one memset each); *done[i] set for those. */
static fg_status zero_cuda_grads(fg_tensor *const *tensors, int n,
                                 unsigned char *done)
{
    enum { kBatch = 128 };
    void *ptrs[kBatch];
    size_t bytes[kBatch];
    fg_tensor *owner[kBatch];
    int k = 0;
    for (int i = 0; i <= n; i++) {
        fg_tensor *g = i < n && tensors[i] ? tensors[i]->grad : NULL;
        if (g && g->device == FG_DEVICE_CUDA && fg_tensor_is_contiguous(g)) {
            ptrs[k] = fg_tensor_base(g);
            bytes[k] = (size_t)g->numel * fg_esize(g->dtype);
            owner[k++] = g;
            done[i] = 1;
        }
        if (k == kBatch || (i == n && k > 0)) {
            FG_TRY(fg_cuda_zero_many(ptrs, bytes, k));
            for (int j = 0; j < k; j++)
                fg_tensor_bump_version(owner[j]);
            k = 0;
        }
    }
    return FG_OK;
}
#endif

fg_status fg_zero_grad(fg_tensor *const *tensors, int n)
{
    if (n < 0 || (n > 0 && !tensors))
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "bad tensor list");
    unsigned char local[256], *done = local;
    if (n > 256 && !(done = calloc((size_t)n, 1)))
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "zero_grad scratch");
    if (done == local)
        memset(local, 0, sizeof local);
    fg_status s = FG_OK;
#ifdef FG_HAVE_CUDA
    s = zero_cuda_grads(tensors, n, done);
#endif
    for (int i = 0; i < n && s == FG_OK; i++)
        if (tensors[i] && !done[i])
            s = fg_tensor_zero_grad(tensors[i]);
    if (done != local)
        free(done);
    return s;
}

fg_status fg_tensor_clear_grad(fg_tensor *t)
{
    if (!t)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor is NULL");
    fg_tensor_free(t->grad);
    t->grad = NULL;
    return FG_OK;
}

/* ---- helpers for backward functions ------------------------------------ */

void fg_node_input_meta(const fg_node *n, int i, fg_meta *m)
{
    const fg_edge *ed = &n->edges[i];
    if (ed->leaf) {
        const fg_tensor *t = ed->leaf;
        m->nd = t->nd;
        memcpy(m->shape, t->shape, sizeof m->shape);
        m->numel = t->numel;
        m->dtype = t->dtype;
        m->device = t->device;
    } else {
        *m = ed->node->out_meta[ed->output_nr];
    }
}

int fg_same_shape(int nd_a, const int64_t *sa, int nd_b, const int64_t *sb)
{
    if (nd_a != nd_b)
        return 0;
    for (int i = 0; i < nd_a; i++)
        if (sa[i] != sb[i])
            return 0;
    return 1;
}
