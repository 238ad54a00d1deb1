/* SPDX-License-Identifier: MIT */
/* lib/autograd/autograd_internal.h - graph nodes, hooks and the recording helpers
 * the ops use. */
#ifndef FG_LIB_AUTOGRAD_INTERNAL_H
#define FG_LIB_AUTOGRAD_INTERNAL_H

#include "flashgrad/autograd.h"
#include "tensor_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Computes grad_in[i] (a new reference, or NULL for "zero") for every input
 * i with fg_node_needs_grad(n, i), from grad_out[0..n_outputs-1] (entries
 * may be NULL: zero). Runs with grad mode off; tensors it creates go to the
 * node's domain. Saved tensors: fg_node_saved(n, i). */
typedef fg_status (*fg_backward_fn)(fg_node *n, fg_tensor *const *grad_out,
                                    fg_tensor **grad_in);

/* Optional variant of the backward that adds input i's gradient straight
 * into acc[i] where acc[i] is non-NULL (a leaf's .grad: contiguous, of the
 * input's shape, dtype and device), leaving grad_in[i] NULL; entries with
 * acc[i] NULL are as in fg_backward_fn. The engine offers it only when
 * that add is all the leaf would do with the gradient (its last edge, no
 * tensor hooks, nothing else pending), and it must give the same bits as
 * backward followed by .grad += grad_in[i]: it saves the launch and the
 * temporary of a separate accumulation (the cast of a weight). An op
 * whose backward is NULL gets this one with acc NULL where nothing is
 * offered (one function for both). */
typedef fg_status (*fg_backward_acc_fn)(fg_node *n, fg_tensor *const *grad_out,
                                        fg_tensor **grad_in,
                                        fg_tensor *const *acc);

typedef struct fg_op_def {
    const char *name;        /* "AddBackward" */
    fg_backward_fn backward; /* NULL: backward_acc with acc NULL */
    fg_backward_acc_fn backward_acc; /* NULL: none */
} fg_op_def;

/* Where the gradient of an input goes: the node that produced it (and which
 * of its outputs), or the leaf itself, or nowhere. */
typedef struct fg_edge {
    fg_node *node;   /* owned reference */
    fg_tensor *leaf; /* owned reference */
    int output_nr;
} fg_edge;

/* What a node must know about each output to check and create gradients. */
typedef struct fg_meta {
    int nd;
    int64_t shape[FG_MAX_DIMS];
    int64_t numel;
    fg_dtype dtype;
    fg_device device;
} fg_meta;

typedef struct fg_saved {
    fg_tensor *t;     /* owned reference (outputs are saved as detached
                         aliases, so no cycle through grad_fn) */
    uint64_t version; /* storage version when saved */
} fg_saved;

typedef enum fg_hook_kind {
    FG_HOOK_TENSOR = 1,   /* owner: leaf tensor, or node (with output_nr) */
    FG_HOOK_POST_ACC = 2, /* owner: leaf tensor */
    FG_HOOK_PRE = 3,      /* owner: node */
    FG_HOOK_POST = 4,     /* owner: node */
    FG_HOOK_RETAIN = 5    /* owner: node; user = the tensor (weak) */
} fg_hook_kind;

typedef void (*fg_hook_generic_fn)(void);

/* Heap-allocated always (handles may outlive an arena step). `refs`
 * counts the owner's list (while linked), the caller's handle, and for a
 * retain record the tensor's pointer to it. */
struct fg_hook {
    struct fg_hook *next;
    int kind;
    int output_nr;
    fg_hook_generic_fn fn; /* the typed callback, cast by kind */
    void *user;
    void *owner; /* fg_tensor * or fg_node *; NULL once detached */
    int owner_is_node;
    int refs;
};

struct fg_node {
    fg_obj obj;
    const fg_op_def *op;
    uint64_t seq; /* recording order: consumers have larger numbers */
    int n_inputs, n_outputs, n_saved;
    int freed;    /* saved tensors released */
    fg_edge *edges;      /* n_inputs */
    fg_meta *out_meta;   /* n_outputs */
    fg_saved *saved;     /* n_saved */
    fg_tensor **grad_buf; /* n_outputs; gradients being summed (engine) */
    void *extra;         /* op parameters, extra_bytes, 16-aligned */
    size_t extra_bytes;
    struct fg_hook *hooks; /* node hooks in registration order */
    uint64_t bw_epoch;   /* last backward that reached this node */
};

/* ---- recording ------------------------------------------------------- */

/* 1 if grad mode is on and some input requires grad. */
int fg_ag_should_record(fg_tensor *const *inputs, int n);
/* Records a node for an op that produced outputs[0..n_out-1] from
 * inputs[0..n_in-1] (NULL inputs allowed: no edge). Saves saved[] (outputs
 * among them are saved as detached aliases) and copies extra. Marks the
 * outputs requires_grad with this grad_fn. On failure nothing is changed
 * (the op then frees its outputs). *node (optional) is borrowed. */
fg_status fg_ag_record(const fg_op_def *op, fg_tensor *const *inputs,
                       int n_in, fg_tensor *const *outputs, int n_out,
                       fg_tensor *const *saved, int n_saved,
                       const void *extra, size_t extra_bytes, fg_node **node);

static inline void *fg_node_extra(const fg_node *n) { return n->extra; }
static inline fg_tensor *fg_node_saved(const fg_node *n, int i)
{
    return n->saved[i].t;
}
/* Only a gradient nobody else can see may be summed into (or written) in
 * place: the engine's pending gradients, a backward's incoming ones. */
static inline int fg_grad_exclusive(const fg_tensor *t)
{
    return t->obj.refcount == 1 && t->storage->obj.refcount == 1 &&
           !t->grad_fn && fg_tensor_is_contiguous(t);
}
static inline int fg_node_needs_grad(const fg_node *n, int i)
{
    return n->edges[i].node != NULL || n->edges[i].leaf != NULL;
}

/* Next node sequence number (global, atomic). */
uint64_t fg_ag_next_seq(void);
/* Engine epochs: a fresh number per backward pass. */
uint64_t fg_ag_next_epoch(void);
/* Releases the saved tensors of n and marks it freed. */
void fg_node_release_saved(fg_node *n);

/* ---- hooks (autograd_hooks.c) ------------------------------------------ */

/* Appends a hook to a list (registration order). */
fg_status fg_hook_add(struct fg_hook **list, void *owner, int owner_is_node,
                      int kind, int output_nr, fg_hook_generic_fn fn,
                      void *user,
                      fg_hook **handle);
/* Detaches and releases every hook of a dying owner. */
void fg_hooks_detach_all(struct fg_hook **list);
/* Detaches h from its owner's list, if still attached. */
void fg_hook_detach(struct fg_hook *h);
void fg_hook_unref(struct fg_hook *h);
/* Calls fn(ctx, hook) for each hook of `kind` (and output_nr, if >= 0) in
 * registration order, robust to hooks registering or removing hooks.
 * Stops at the first failure. */
typedef fg_status (*fg_hook_visit_fn)(void *ctx, struct fg_hook *h);
fg_status fg_hooks_fire(struct fg_hook *list, int kind, int output_nr,
                        fg_hook_visit_fn fn, void *ctx);

/* ---- helpers for backward functions ------------------------------------ */

/* Shape, dtype and device the gradient of input i must have; only for
 * inputs with fg_node_needs_grad(n, i). */
void fg_node_input_meta(const fg_node *n, int i, fg_meta *m);
/* 1 if a and b have the same shape. */
int fg_same_shape(int nd_a, const int64_t *sa, int nd_b, const int64_t *sb);
/* dst += src elementwise (same shape and device; src any dtype, converted
 * to dst's first, as a cast then an add would; dst contiguous). The
 * engine's gradient accumulation, one kernel on CUDA. No version bump. */
fg_status fg_grad_accumulate(fg_tensor *dst, const fg_tensor *src);
/* Gradient g (shape of a broadcast result) summed down to `shape`
 * (NumPy broadcasting rules). Returns a new reference; g itself (retained)
 * when the shapes already agree. */
fg_status fg_sum_to_shape(fg_tensor *g, int nd, const int64_t *shape,
                          fg_tensor **out);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_AUTOGRAD_INTERNAL_H */
