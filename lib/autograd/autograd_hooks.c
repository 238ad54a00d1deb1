/* SPDX-License-Identifier: MIT */
/* lib/autograd/autograd_hooks.c - registering, removing and firing hooks.
 *
 * A hook record is shared by its owner's list and the caller's handle (and,
 * for retain_grad records, by the tensor), so it is counted: whichever side
 * goes last frees it. When the owner dies first the record is detached
 * (owner = NULL) and removing it through the handle is then a no-op. */
#include <string.h>

#include "autograd_internal.h"
#include "lib/core/error.h"

static fg_hook **owner_list(fg_hook *h)
{
    return h->owner_is_node ? &((fg_node *)h->owner)->hooks
                            : &((fg_tensor *)h->owner)->hooks;
}

void fg_hook_unref(fg_hook *h)
{
    if (h && --h->refs == 0)
        fg_mem_free(NULL, h, sizeof *h);
}

fg_status fg_hook_add(fg_hook **list, void *owner, int owner_is_node,
                      int kind, int output_nr, fg_hook_generic_fn fn, void *user,
                      fg_hook **handle)
{
    fg_hook *h = fg_mem_alloc(NULL, sizeof *h);
    if (!h)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "cannot allocate a hook");
    memset(h, 0, sizeof *h);
    h->kind = kind;
    h->output_nr = output_nr;
    h->fn = fn;
    h->user = user;
    h->owner = owner;
    h->owner_is_node = owner_is_node;
    h->refs = handle ? 2 : 1;
    while (*list)
        list = &(*list)->next;
    *list = h;
    if (handle)
        *handle = h;
    return FG_OK;
}

void fg_hook_detach(fg_hook *h)
{
    if (!h || !h->owner)
        return;
    for (fg_hook **p = owner_list(h); *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            break;
        }
    h->next = NULL;
    h->owner = NULL;
    fg_hook_unref(h);
}

void fg_hooks_detach_all(fg_hook **list)
{
    fg_hook *h = *list;
    *list = NULL;
    while (h) {
        fg_hook *next = h->next;
        h->next = NULL;
        h->owner = NULL;
        fg_hook_unref(h);
        h = next;
    }
}

void fg_hook_remove(fg_hook *handle)
{
    if (!handle)
        return;
    fg_hook_detach(handle);
    fg_hook_unref(handle);
}

void fg_hook_handle_free(fg_hook *handle) { fg_hook_unref(handle); }

fg_status fg_hooks_fire(fg_hook *list, int kind, int output_nr,
                        fg_hook_visit_fn fn, void *ctx)
{
    /* Snapshot with a reference each: a hook may remove others (or itself)
     * or add new ones while we walk; new ones fire next time. */
    fg_hook *local[16], **snap = local;
    int n = 0, cap = 16;
    for (fg_hook *h = list; h; h = h->next) {
        if (h->kind != kind || (output_nr >= 0 && h->output_nr != output_nr))
            continue;
        if (n == cap) {
            fg_hook **bigger = fg_mem_alloc(NULL, sizeof *snap * 2 * cap);
            if (!bigger) {
                for (int i = 0; i < n; i++)
                    fg_hook_unref(snap[i]);
                if (snap != local)
                    fg_mem_free(NULL, snap, sizeof *snap * cap);
                return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "hook list");
            }
            memcpy(bigger, snap, sizeof *snap * n);
            if (snap != local)
                fg_mem_free(NULL, snap, sizeof *snap * cap);
            snap = bigger;
            cap *= 2;
        }
        h->refs++;
        snap[n++] = h;
    }
    fg_status st = FG_OK;
    for (int i = 0; i < n; i++) {
        if (st == FG_OK && snap[i]->owner)
            st = fn(ctx, snap[i]);
        fg_hook_unref(snap[i]);
    }
    if (snap != local)
        fg_mem_free(NULL, snap, sizeof *snap * cap);
    return st;
}

/* ---- registration -------------------------------------------------------- */

fg_status fg_tensor_register_hook(fg_tensor *t, fg_tensor_hook_fn fn,
                                  void *user, fg_hook **handle)
{
    if (!t || !fn)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor or hook is NULL");
    if (!t->requires_grad)
        return FG_FAIL(FG_ERR_STATE, "cannot register a hook on a tensor "
                                     "that does not require grad");
    if (t->grad_fn)
        return fg_hook_add(&t->grad_fn->hooks, t->grad_fn, 1, FG_HOOK_TENSOR,
                           t->output_nr, (fg_hook_generic_fn)fn, user, handle);
    return fg_hook_add(&t->hooks, t, 0, FG_HOOK_TENSOR, 0, (fg_hook_generic_fn)fn, user,
                       handle);
}

fg_status fg_tensor_register_post_accumulate_hook(
    fg_tensor *t, fg_post_accumulate_hook_fn fn, void *user, fg_hook **handle)
{
    if (!t || !fn)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "tensor or hook is NULL");
    if (!t->requires_grad || t->grad_fn)
        return FG_FAIL(FG_ERR_STATE, "post-accumulate hooks need a leaf "
                                     "that requires grad");
    return fg_hook_add(&t->hooks, t, 0, FG_HOOK_POST_ACC, 0, (fg_hook_generic_fn)fn, user,
                       handle);
}

fg_status fg_node_register_pre_hook(fg_node *n, fg_node_pre_hook_fn fn,
                                    void *user, fg_hook **handle)
{
    if (!n || !fn)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "node or hook is NULL");
    return fg_hook_add(&n->hooks, n, 1, FG_HOOK_PRE, -1, (fg_hook_generic_fn)fn, user,
                       handle);
}

fg_status fg_node_register_post_hook(fg_node *n, fg_node_post_hook_fn fn,
                                     void *user, fg_hook **handle)
{
    if (!n || !fn)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "node or hook is NULL");
    return fg_hook_add(&n->hooks, n, 1, FG_HOOK_POST, -1, (fg_hook_generic_fn)fn, user,
                       handle);
}
