/* SPDX-License-Identifier: MIT */
/* lib/autograd/tensor_lowp.c - a parameter's low-precision copy for autocast
 * (tensor_internal.h says when it is valid). The copy lives on the heap
 * with the parameter and goes with it. */
#include "lib/core/error.h"
#include "tensor_internal.h"

static int lowp_current(const fg_tensor *t, fg_dtype dt)
{
    const fg_tensor *c = t->lowp;
    return c && c->dtype == dt && t->lowp_version == t->storage->version &&
           t->lowp_sversion == c->storage->version;
}

static void lowp_mark(fg_tensor *t)
{
    t->lowp_version = t->storage->version;
    t->lowp_sversion = t->lowp->storage->version;
}

fg_status fg_tensor_lowp(fg_tensor *t, fg_dtype dt, fg_tensor **out)
{
    if (!fg_tensor_is_contiguous(t))
        return FG_FAIL(FG_ERR_INTERNAL, "a strided parameter");
    if (!lowp_current(t, dt)) {
        fg_tensor *c = t->lowp;
        if (!c || c->dtype != dt || c->storage->obj.refcount > 1) {
            fg_tensor *n = NULL;
            FG_TRY(fg_tensor_new(NULL, dt, t->device, t->nd, t->shape, &n));
            fg_tensor_free(c);
            t->lowp = c = n;
        }
        FG_TRY(fg_copy_strided(c, t));
        fg_tensor_bump_version(c);
        lowp_mark(t);
    }
    *out = t->lowp;
    return FG_OK;
}

fg_tensor *fg_tensor_lowp_target(const fg_tensor *t)
{
    const fg_tensor *c = t->lowp;
    return c && c->storage->obj.refcount == 1 &&
                   fg_tensor_is_contiguous(c)
               ? t->lowp
               : NULL;
}

void fg_tensor_lowp_updated(fg_tensor *t, fg_tensor *target)
{
    fg_tensor_bump_version(t);
    if (target && target == t->lowp) {
        fg_tensor_bump_version(target);
        lowp_mark(t);
    }
}
