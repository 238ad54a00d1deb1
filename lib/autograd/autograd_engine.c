/* SPDX-License-Identifier: MIT */
/* lib/autograd/autograd_engine.c - the backward pass.
 *
 * 1. Collect the nodes reachable from the output's grad_fn (depth-first),
 *    checking that none was freed and that no saved tensor was modified,
 *    and count for every leaf how many edges lead to it. Nothing has been
 *    changed if this fails.
 * 2. Sort them by recording order, newest first. A node's consumers were
 *    recorded after it, so when a node comes up every gradient for its
 *    outputs has been summed into its grad_buf: this replays the tape
 *    backwards.
 * 3. For each node: tensor hooks of its outputs, pre-hooks, retain_grad
 *    updates, the backward function, post-hooks; then route the input
 *    gradients to the producing nodes' grad_buf or to the leaves. A leaf
 *    is finished as soon as its last edge has delivered: tensor hooks,
 *    .grad += grad, post-accumulate hooks. */
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "autograd_internal.h"
#include "lib/core/error.h"
#ifdef FG_HAVE_CUDA
#include "cuda_backend.h"
#endif
#include "tensor_iter.h"
#include "kernels/runtime/profile.h"

/* The profiler's family of a node's backward (profile.h), by its op. */
static int op_family(const fg_op_def *op)
{
    static const struct {
        const char *name;
        int family;
    } known[] = {{"MatmulBackward", FG_PROF_GEMM},
                 {"LinearBackward", FG_PROF_GEMM},
                 {"MlpBackward", FG_PROF_GEMM},
                 {"AttentionBackward", FG_PROF_ATTENTION},
                 {"AttentionQKVPackedBackward", FG_PROF_ATTENTION},
                 {"LayerNormBackward", FG_PROF_LAYERNORM},
                 {"DropoutAddLayerNormBackward", FG_PROF_LAYERNORM},
                 {"CrossEntropyBackward", FG_PROF_XENT}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(op->name, known[i].name))
            return known[i].family;
    return FG_PROF_OTHER;
}

typedef struct engine {
    uint64_t epoch;
    unsigned flags;
    fg_arena *dom; /* scratch */
    fg_node **nodes;
    int64_t n_nodes, cap_nodes;
    fg_tensor **scratch; /* replacement arrays for node hooks */
    int scratch_len;
    /* fg_grad: capture instead of accumulating */
    int capture;
    fg_tensor *const *targets;
    int n_targets;
    fg_tensor **captured;
} engine;

/* ---- small helpers --------------------------------------------------- */

static int push_node(engine *e, fg_node ***v, int64_t *n, int64_t *cap,
                     fg_node *x)
{
    if (*n == *cap) {
        int64_t nc = *cap ? 2 * *cap : 64;
        fg_node **p = fg_mem_alloc(e->dom, (size_t)nc * sizeof *p);
        if (!p)
            return 0;
        if (*n)
            memcpy(p, *v, (size_t)*n * sizeof *p);
        fg_mem_free(e->dom, *v, (size_t)*cap * sizeof *p);
        *v = p;
        *cap = nc;
    }
    (*v)[(*n)++] = x;
    return 1;
}

typedef struct add_ctx {
    fg_dtype dst, src;
} add_ctx;

static void add_row(void *c, char **p, const int64_t *s, int64_t n)
{
    const add_ctx *ac = c;
    const fg_dtype dt = ac->dst;
    char *d = p[0], *x = p[1];
    if (ac->src != dt) { /* src rounded to dst's dtype first, as by a cast */
        for (int64_t i = 0; i < n; i++, d += s[0], x += s[1]) {
            char v[8];
            fg_store_elem(v, dt, fg_load_elem(x, ac->src));
            if (dt == FG_FP32)
                *(float *)d += *(const float *)v;
            else if (dt == FG_FP64)
                *(double *)d += *(const double *)v;
            else
                fg_store_elem(d, dt, fg_load_elem(d, dt) + fg_load_elem(v, dt));
        }
    } else if (dt == FG_FP32) {
        for (int64_t i = 0; i < n; i++, d += s[0], x += s[1])
            *(float *)d += *(const float *)x;
    } else if (dt == FG_FP64) {
        for (int64_t i = 0; i < n; i++, d += s[0], x += s[1])
            *(double *)d += *(const double *)x;
    } else {
        for (int64_t i = 0; i < n; i++, d += s[0], x += s[1])
            fg_store_elem(d, dt, fg_load_elem(d, dt) + fg_load_elem(x, dt));
    }
}

static fg_status grad_accumulate_cpu(fg_tensor *dst, const fg_tensor *src)
{
    fg_iter it;
    char *base[2] = {fg_tensor_base(dst), fg_tensor_base(src)};
    const int64_t *str[2] = {dst->stride, src->stride};
    size_t es[2] = {fg_dtype_size(dst->dtype), fg_dtype_size(src->dtype)};
    fg_iter_init(&it, dst->nd, dst->shape, 2, base, str, es);
    add_ctx ac = {dst->dtype, src->dtype};
    fg_iter_run_parallel(&it, add_row, &ac);
    return FG_OK;
}

fg_status fg_grad_accumulate(fg_tensor *dst, const fg_tensor *src)
{
#ifdef FG_HAVE_CUDA
    if (dst->device == FG_DEVICE_CUDA) /* in place: same index in and out */
        FG_PROF_RETURN(FG_PROF_OTHER, fg_cuda_accumulate(dst, src));
#endif
    FG_PROF_RETURN(FG_PROF_OTHER, grad_accumulate_cpu(dst, src));
}

/* dst += src, same shape and dtype (dst contiguous). */
static fg_status add_into(fg_tensor *dst, const fg_tensor *src)
{
    return fg_grad_accumulate(dst, src);
}

/* Contiguous copy of g in domain a. */
static fg_status clone(fg_arena *a, const fg_tensor *g, fg_tensor **out)
{
    FG_TRY(fg_tensor_new_like(a, g, 0, out));
    fg_status s = fg_copy_strided(*out, g);
    if (s != FG_OK) {
        fg_tensor_free(*out);
        *out = NULL;
    }
    return s;
}

/* *slot += g, consuming the reference g. */
static fg_status accumulate(fg_arena *a, fg_tensor **slot, fg_tensor *g)
{
    fg_tensor *s = *slot;
    if (!g)
        return FG_OK;
    if (!s) {
        *slot = g;
        return FG_OK;
    }
    fg_status st;
    if (fg_grad_exclusive(s)) {
        st = add_into(s, g);
        fg_tensor_free(g);
    } else if (fg_grad_exclusive(g)) {
        st = add_into(g, s);
        fg_tensor_free(s);
        *slot = g;
    } else {
        fg_tensor *sum;
        st = clone(a, s, &sum);
        if (st != FG_OK) {
            fg_tensor_free(g);
            return st;
        }
        st = add_into(sum, g);
        fg_tensor_free(s);
        fg_tensor_free(g);
        *slot = sum;
    }
    return st;
}

static int matches(const fg_tensor *g, int nd, const int64_t *shape,
                   fg_dtype dt, fg_device dev)
{
    return fg_same_shape(g->nd, g->shape, nd, shape) && g->dtype == dt &&
           g->device == dev;
}

/* Replaces *g by the hook's replacement r after checking it. */
static fg_status take_replacement(fg_tensor **g, fg_tensor *r, int nd,
                                  const int64_t *shape, fg_dtype dt,
                                  fg_device dev, const char *what)
{
    if (!r)
        return FG_OK;
    if (!matches(r, nd, shape, dt, dev)) {
        fg_tensor_free(r);
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                       "%s returned a gradient of the wrong shape, dtype or "
                       "device",
                       what);
    }
    fg_tensor_free(*g);
    *g = r;
    return FG_OK;
}

static fg_status hook_failed(fg_status s, const char *kind)
{
    return FG_FAIL(s, "%s failed (%s)", kind, fg_status_string(s));
}

/* ---- hook visitors --------------------------------------------------- */

typedef struct tensor_hook_ctx {
    fg_tensor **g;
    int nd;
    const int64_t *shape;
    fg_dtype dt;
    fg_device dev;
} tensor_hook_ctx;

static fg_status visit_tensor_hook(void *c, fg_hook *h)
{
    tensor_hook_ctx *tc = c;
    fg_tensor *r = NULL;
    if (!*tc->g)
        return FG_OK;
    fg_status s = ((fg_tensor_hook_fn)h->fn)(*tc->g, &r, h->user);
    if (s != FG_OK) {
        fg_tensor_free(r);
        return hook_failed(s, "a tensor hook");
    }
    return take_replacement(tc->g, r, tc->nd, tc->shape, tc->dt, tc->dev,
                            "a tensor hook");
}

typedef struct node_hook_ctx {
    engine *e;
    fg_node *n;
    fg_tensor **gout;
    fg_tensor **gin;
} node_hook_ctx;

static void free_all(fg_tensor **rep, int n)
{
    for (int i = 0; i < n; i++) {
        fg_tensor_free(rep[i]);
        rep[i] = NULL;
    }
}

static fg_status visit_pre_hook(void *c, fg_hook *h)
{
    node_hook_ctx *nc = c;
    fg_node *n = nc->n;
    fg_tensor **rep = nc->e->scratch;
    memset(rep, 0, sizeof *rep * (size_t)n->n_outputs);
    fg_status s = ((fg_node_pre_hook_fn)h->fn)(n, nc->gout, n->n_outputs,
                                                rep, h->user);
    if (s != FG_OK) {
        free_all(rep, n->n_outputs);
        return hook_failed(s, "a node pre-hook");
    }
    for (int i = 0; i < n->n_outputs; i++) {
        const fg_meta *m = &n->out_meta[i];
        if (s == FG_OK)
            s = take_replacement(&nc->gout[i], rep[i], m->nd, m->shape,
                                 m->dtype, m->device, "a node pre-hook");
        else
            fg_tensor_free(rep[i]);
        rep[i] = NULL;
    }
    return s;
}

static fg_status visit_post_hook(void *c, fg_hook *h)
{
    node_hook_ctx *nc = c;
    fg_node *n = nc->n;
    fg_tensor **rep = nc->e->scratch;
    memset(rep, 0, sizeof *rep * (size_t)n->n_inputs);
    fg_status s = ((fg_node_post_hook_fn)h->fn)(
        n, nc->gin, n->n_inputs, nc->gout, n->n_outputs, rep, h->user);
    if (s != FG_OK) {
        free_all(rep, n->n_inputs);
        return hook_failed(s, "a node post-hook");
    }
    for (int i = 0; i < n->n_inputs; i++) {
        if (s == FG_OK && rep[i] && fg_node_needs_grad(n, i)) {
            fg_meta m;
            fg_node_input_meta(n, i, &m);
            s = take_replacement(&nc->gin[i], rep[i], m.nd, m.shape, m.dtype,
                                 m.device, "a node post-hook");
        } else {
            fg_tensor_free(rep[i]); /* failed, or nowhere to send it */
        }
        rep[i] = NULL;
    }
    return s;
}

static fg_status visit_retain(void *c, fg_hook *h)
{
    node_hook_ctx *nc = c;
    fg_tensor *t = h->user, *g = nc->gout[h->output_nr];
    if (!g)
        return FG_OK;
    if (!t->grad)
        return clone(t->obj.arena, g, &t->grad);
    FG_TRY(add_into(t->grad, g));
    fg_tensor_bump_version(t->grad);
    return FG_OK;
}

static fg_status visit_post_acc(void *c, fg_hook *h)
{
    fg_status s = ((fg_post_accumulate_hook_fn)h->fn)((fg_tensor *)c,
                                                      h->user);
    return s == FG_OK ? s : hook_failed(s, "a post-accumulate hook");
}

/* ---- leaves ---------------------------------------------------------- */

static fg_status finish_leaf(engine *e, fg_tensor *leaf)
{
    fg_tensor *g = leaf->bw_grad;
    leaf->bw_grad = NULL;
    if (!g)
        return FG_OK;
    tensor_hook_ctx tc = {&g, leaf->nd, leaf->shape, leaf->dtype,
                          leaf->device};
    fg_status s = fg_hooks_fire(leaf->hooks, FG_HOOK_TENSOR, -1,
                                visit_tensor_hook, &tc);
    if (s == FG_OK && e->capture) {
        for (int j = 0; j < e->n_targets; j++)
            if (e->targets[j] == leaf && !e->captured[j])
                e->captured[j] = fg_tensor_retain(g);
    } else if (s == FG_OK) {
        if (!leaf->grad) {
            if (fg_grad_exclusive(g) && g->obj.arena == leaf->obj.arena) {
                leaf->grad = g; /* adopt: nobody else sees it */
                g = NULL;
            } else {
                s = clone(leaf->obj.arena, g, &leaf->grad);
            }
        } else {
            s = add_into(leaf->grad, g);
            fg_tensor_bump_version(leaf->grad);
        }
        if (s == FG_OK)
            s = fg_hooks_fire(leaf->hooks, FG_HOOK_POST_ACC, -1,
                              visit_post_acc, leaf);
    }
    fg_tensor_free(g);
    return s;
}

/* The last edge of a leaf whose backward added its gradient straight into
 * .grad (fg_op_def.backward_acc): what finish_leaf does after its add. */
static fg_status leaf_accumulated(fg_tensor *leaf)
{
    leaf->bw_deps--;
    fg_tensor_bump_version(leaf->grad);
    return fg_hooks_fire(leaf->hooks, FG_HOOK_POST_ACC, -1, visit_post_acc,
                         leaf);
}

static int has_hook(const struct fg_hook *h, int kind)
{
    for (; h; h = h->next)
        if (h->kind == kind)
            return 1;
    return 0;
}

/* Where input i's gradient may be added by the node's backward itself
 * (fg_op_def.backward_acc), or NULL. A leaf's .grad: the leaf's last edge
 * with nothing pending and no tensor hook to see the gradient first. A
 * producing node's gradient already pending (a fork such as the residual
 * stream, whose other use ran first): the sum accumulate() would make in
 * place anyway (its hooks would see the same total; like a leaf's, a
 * tensor hook keeps the general path), never when another input of n
 * routes to the same buffer (the order of the two adds is accumulate()'s).
 * Neither with a node post-hook, which must see the gradient, nor under
 * fg_grad's capture. */
static fg_tensor *direct_target(const engine *e, const fg_node *n, int i)
{
    if (e->capture || has_hook(n->hooks, FG_HOOK_POST))
        return NULL;
    const fg_edge *ed = &n->edges[i];
    const fg_tensor *leaf = ed->leaf;
    fg_tensor *g;
    if (leaf) {
        if (!leaf->grad || leaf->bw_deps != 1 || leaf->bw_grad ||
            has_hook(leaf->hooks, FG_HOOK_TENSOR))
            return NULL;
        g = leaf->grad;
    } else if (ed->node) {
        g = ed->node->grad_buf[ed->output_nr];
        if (!g || !fg_grad_exclusive(g) ||
            has_hook(ed->node->hooks, FG_HOOK_TENSOR))
            return NULL;
        for (int j = 0; j < n->n_inputs; j++)
            if (j != i && n->edges[j].node == ed->node &&
                n->edges[j].output_nr == ed->output_nr)
                return NULL;
    } else {
        return NULL;
    }
    fg_meta m;
    fg_node_input_meta(n, i, &m);
    if (!matches(g, m.nd, m.shape, m.dtype, m.device) ||
        !fg_tensor_is_contiguous(g))
        return NULL;
    return g;
}

/* One edge delivered (g may be NULL: nothing flowed). */
static fg_status leaf_receive(engine *e, fg_tensor *leaf, fg_tensor *g)
{
    fg_status s = accumulate(e->dom, &leaf->bw_grad, g);
    if (s != FG_OK)
        return s;
    if (--leaf->bw_deps == 0)
        return finish_leaf(e, leaf);
    return FG_OK;
}

/* ---- collection ------------------------------------------------------ */

static int cmp_seq_desc(const void *a, const void *b)
{
    const fg_node *x = *(fg_node *const *)a, *y = *(fg_node *const *)b;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

static fg_status collect(engine *e, fg_node *root)
{
    fg_node **stack = NULL;
    int64_t sn = 0, scap = 0;
    fg_status st = FG_OK;
    int maxio = 1;
    if (!push_node(e, &stack, &sn, &scap, root))
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "backward scratch");
    root->bw_epoch = e->epoch;
    while (sn > 0 && st == FG_OK) {
        fg_node *n = stack[--sn];
        if (n->freed) {
            st = FG_FAIL(FG_ERR_STATE,
                         "trying to backward through %s a second time: its "
                         "saved tensors were freed by the first backward "
                         "(pass FG_BACKWARD_RETAIN_GRAPH to keep them)",
                         n->op->name);
            break;
        }
        for (int i = 0; i < n->n_saved; i++) {
            const fg_saved *sv = &n->saved[i];
            if (sv->t && sv->t->storage->version != sv->version) {
                st = FG_FAIL(FG_ERR_STATE,
                             "a tensor saved by %s was modified in place "
                             "(version %llu, saved at %llu)",
                             n->op->name,
                             (unsigned long long)sv->t->storage->version,
                             (unsigned long long)sv->version);
                break;
            }
        }
        if (!push_node(e, &e->nodes, &e->n_nodes, &e->cap_nodes, n)) {
            st = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "backward scratch");
            break;
        }
        if (n->n_inputs > maxio)
            maxio = n->n_inputs;
        if (n->n_outputs > maxio)
            maxio = n->n_outputs;
        for (int i = 0; i < n->n_inputs && st == FG_OK; i++) {
            fg_edge *ed = &n->edges[i];
            if (ed->leaf) {
                if (ed->leaf->bw_epoch != e->epoch) {
                    ed->leaf->bw_epoch = e->epoch;
                    ed->leaf->bw_deps = 0;
                }
                ed->leaf->bw_deps++;
            } else if (ed->node && ed->node->bw_epoch != e->epoch) {
                ed->node->bw_epoch = e->epoch;
                if (!push_node(e, &stack, &sn, &scap, ed->node))
                    st = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "backward scratch");
            }
        }
    }
    fg_mem_free(e->dom, stack, (size_t)scap * sizeof *stack);
    if (st != FG_OK)
        return st;
    e->scratch = fg_mem_alloc(e->dom, (size_t)maxio * sizeof(fg_tensor *));
    if (!e->scratch)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "backward scratch");
    e->scratch_len = maxio;
    qsort(e->nodes, (size_t)e->n_nodes, sizeof *e->nodes, cmp_seq_desc);
    return FG_OK;
}

/* ---- one node -------------------------------------------------------- */

static fg_status run_node(engine *e, fg_node *n)
{
    fg_tensor **g = n->grad_buf;
    fg_status s = FG_OK;
    for (int i = 0; i < n->n_outputs && s == FG_OK; i++) {
        const fg_meta *m = &n->out_meta[i];
        tensor_hook_ctx tc = {&g[i], m->nd, m->shape, m->dtype, m->device};
        s = fg_hooks_fire(n->hooks, FG_HOOK_TENSOR, i, visit_tensor_hook,
                          &tc);
    }
    fg_tensor *gin_local[8];
    fg_tensor **gin = gin_local;
    if (n->n_inputs > 8) {
        gin = fg_mem_alloc(e->dom, sizeof *gin * (size_t)n->n_inputs);
        if (!gin)
            return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "backward scratch");
    }
    memset(gin, 0, sizeof *gin * (size_t)n->n_inputs);
    node_hook_ctx nc = {e, n, g, gin};
    if (s == FG_OK)
        s = fg_hooks_fire(n->hooks, FG_HOOK_PRE, -1, visit_pre_hook, &nc);
    if (s == FG_OK && !e->capture)
        s = fg_hooks_fire(n->hooks, FG_HOOK_RETAIN, -1, visit_retain, &nc);
    if (s == FG_OK && e->capture)
        for (int j = 0; j < e->n_targets; j++) {
            fg_tensor *t = e->targets[j];
            if (t->grad_fn == n && g[t->output_nr] && !e->captured[j])
                e->captured[j] = fg_tensor_retain(g[t->output_nr]);
        }

    int any = 0;
    for (int i = 0; i < n->n_outputs; i++)
        any |= g[i] != NULL;
    /* Inputs whose gradient the backward adds into the leaf's .grad. */
    fg_tensor *acc_local[8], **acc = NULL;
    int n_acc = 0;
    if (s == FG_OK && any && n->op->backward_acc && n->n_inputs <= 8) {
        acc = acc_local;
        for (int i = 0; i < n->n_inputs; i++)
            n_acc += (acc[i] = direct_target(e, n, i)) != NULL;
    }
    if (s == FG_OK && any) {
        s = fg_arena_push(n->obj.arena);
        if (s == FG_OK) {
            const int prof = fg_prof_active
                                 ? fg_prof_enter_slow(op_family(n->op),
                                                      n->op->name)
                                 : -1;
            s = n_acc || !n->op->backward
                    ? n->op->backward_acc(n, g, gin, n_acc ? acc : NULL)
                    : n->op->backward(n, g, gin);
            fg_prof_leave(prof);
            fg_arena_pop(n->obj.arena);
        }
        for (int i = 0; i < n->n_inputs && s == FG_OK; i++) {
            if (!gin[i])
                continue;
            fg_meta m;
            if (!fg_node_needs_grad(n, i)) {
                fg_tensor_free(gin[i]);
                gin[i] = NULL;
                continue;
            }
            fg_node_input_meta(n, i, &m);
            if (!matches(gin[i], m.nd, m.shape, m.dtype, m.device))
                s = FG_FAIL(FG_ERR_INTERNAL,
                            "%s produced a gradient of the wrong shape for "
                            "input %d",
                            n->op->name, i);
        }
        if (s == FG_OK)
            s = fg_hooks_fire(n->hooks, FG_HOOK_POST, -1, visit_post_hook,
                              &nc);
    }
    for (int i = 0; i < n->n_outputs; i++) {
        fg_tensor_free(g[i]);
        g[i] = NULL;
    }
    if (!(e->flags & FG_BACKWARD_RETAIN_GRAPH))
        fg_node_release_saved(n);
    /* Route: every edge is delivered (possibly nothing) exactly once. */
    for (int i = 0; i < n->n_inputs; i++) {
        fg_edge *ed = &n->edges[i];
        fg_tensor *gi = gin[i];
        gin[i] = NULL;
        if (s != FG_OK) {
            fg_tensor_free(gi);
        } else if (n_acc && acc[i]) {
            fg_tensor_free(gi); /* NULL by the contract */
            if (ed->leaf)   /* a producing node's buffer holds the sum */
                s = leaf_accumulated(ed->leaf);
        } else if (ed->leaf) {
            s = leaf_receive(e, ed->leaf, gi);
        } else if (ed->node) {
            s = accumulate(e->dom, &ed->node->grad_buf[ed->output_nr], gi);
        } else {
            fg_tensor_free(gi);
        }
    }
    if (gin != gin_local)
        fg_mem_free(e->dom, gin, sizeof *gin * (size_t)n->n_inputs);
    return s;
}

/* After a failure: drop every pending gradient. */
static void cleanup(engine *e)
{
    for (int64_t k = 0; k < e->n_nodes; k++) {
        fg_node *n = e->nodes[k];
        for (int i = 0; i < n->n_outputs; i++) {
            fg_tensor_free(n->grad_buf[i]);
            n->grad_buf[i] = NULL;
        }
        for (int i = 0; i < n->n_inputs; i++)
            if (n->edges[i].leaf) {
                fg_tensor_free(n->edges[i].leaf->bw_grad);
                n->edges[i].leaf->bw_grad = NULL;
            }
    }
}

/* ---- entry points -------------------------------------------------------- */

/* Passes running on this thread. A hook that starts another one would
 * share the nodes' grad_buf and the leaves' bookkeeping with the pass that
 * called it (the nested pass freed the gradient the hook was handed), so
 * backward is not re-entrant: such a call is refused. */
static _Thread_local int tls_passes;

static fg_status run(engine *e, fg_tensor *out, fg_tensor *grad,
                     const char *fn)
{
    if (tls_passes > 0)
        return fg_error(FG_ERR_STATE,
                        "%s: called while a backward pass is running on this "
                        "thread (from a hook?); backward is not re-entrant",
                        fn);
    if (!out)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: output is NULL", fn);
    if (!out->requires_grad)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: the output does not require grad (no input "
                        "requires grad, or it was computed under no_grad)",
                        fn);
    if (!grad && out->numel != 1)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: the output has %lld elements; a gradient can "
                        "only be implied for a one-element output (use "
                        "fg_backward_with)",
                        fn, (long long)out->numel);
    if (grad && !matches(grad, out->nd, out->shape, out->dtype, out->device))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: the gradient's shape, dtype or device differs "
                        "from the output's",
                        fn);
    e->epoch = fg_ag_next_epoch();
    e->dom = fg_alloc_domain(&out, 1);
    tls_passes++;
    fg_status s = FG_OK;
    if (out->grad_fn)
        s = collect(e, out->grad_fn);
    if (s == FG_OK) {
        fg_tensor *seed = grad ? fg_tensor_retain(grad) : NULL;
        if (!seed) {
            s = fg_tensor_new_like(e->dom, out, 0, &seed);
            if (s == FG_OK)
                s = fg_fill_strided(seed, 1.0);
            if (s != FG_OK) {
                fg_tensor_free(seed);
                seed = NULL;
            }
        }
        fg_no_grad_begin();
        if (s == FG_OK && out->grad_fn) {
            out->grad_fn->grad_buf[out->output_nr] = seed;
            for (int64_t k = 0; k < e->n_nodes && s == FG_OK; k++)
                s = run_node(e, e->nodes[k]);
        } else if (s == FG_OK) { /* the output is a leaf */
            out->bw_epoch = e->epoch;
            out->bw_deps = 1;
            s = leaf_receive(e, out, seed);
        }
        fg_no_grad_end();
        if (s != FG_OK)
            cleanup(e);
    }
    fg_mem_free(e->dom, e->nodes, (size_t)e->cap_nodes * sizeof *e->nodes);
    fg_mem_free(e->dom, e->scratch,
                (size_t)e->scratch_len * sizeof *e->scratch);
    tls_passes--;
    return s;
}

fg_status fg_backward_ex(fg_tensor *out, fg_tensor *grad, unsigned flags)
{
    engine e = {0};
    e.flags = flags;
    return run(&e, out, grad, "fg_backward");
}

fg_status fg_backward(fg_tensor *loss)
{
    return fg_backward_ex(loss, NULL, 0);
}

fg_status fg_backward_with(fg_tensor *out, fg_tensor *grad)
{
    if (!grad)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "grad is NULL");
    return fg_backward_ex(out, grad, 0);
}

fg_status fg_grad(fg_tensor *out, fg_tensor *grad, fg_tensor *const *inputs,
                  int n, fg_tensor **grads, unsigned flags)
{
    if (n < 1 || !inputs || !grads)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "need n >= 1 inputs and "
                                                "a grads array");
    for (int i = 0; i < n; i++)
        if (!inputs[i] || !inputs[i]->requires_grad)
            return FG_FAIL(FG_ERR_INVALID_ARGUMENT,
                           "input %d is NULL or does not require grad", i);
    fg_tensor *local[16], **cap = local;
    if (n > 16) {
        cap = fg_mem_alloc(NULL, sizeof *cap * (size_t)n);
        if (!cap)
            return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "fg_grad scratch");
    }
    memset(cap, 0, sizeof *cap * (size_t)n);
    engine e = {0};
    e.flags = flags;
    e.capture = 1;
    e.targets = inputs;
    e.n_targets = n;
    e.captured = cap;
    fg_status s = run(&e, out, grad, "fg_grad");
    for (int i = 0; i < n; i++) {
        if (s == FG_OK)
            grads[i] = cap[i];
        else
            fg_tensor_free(cap[i]);
    }
    if (cap != local)
        fg_mem_free(NULL, cap, sizeof *cap * (size_t)n);
    return s;
}

fg_status fg_graph_free(fg_tensor *t)
{
    if (!t)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor is NULL");
    if (!t->grad_fn)
        return FG_OK;
    engine e = {0};
    e.epoch = fg_ag_next_epoch();
    e.dom = fg_alloc_domain(&t, 1);
    fg_node **stack = NULL;
    int64_t sn = 0, scap = 0;
    if (!push_node(&e, &stack, &sn, &scap, t->grad_fn))
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "scratch");
    t->grad_fn->bw_epoch = e.epoch;
    fg_status s = FG_OK;
    while (sn > 0) {
        fg_node *n = stack[--sn];
        if (!n->freed)
            fg_node_release_saved(n);
        for (int i = 0; i < n->n_inputs; i++) {
            fg_node *m = n->edges[i].node;
            if (m && m->bw_epoch != e.epoch) {
                m->bw_epoch = e.epoch;
                if (!push_node(&e, &stack, &sn, &scap, m)) {
                    s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "scratch");
                    sn = 0;
                    break;
                }
            }
        }
    }
    fg_mem_free(e.dom, stack, (size_t)scap * sizeof *stack);
    return s;
}
