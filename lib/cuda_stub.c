/* lib/cuda_stub.c - the CUDA backend entry points of a build without CUDA:
 * each reports FG_ERR_UNSUPPORTED, so callers get a status, not a link error. */
#include <string.h>

#include "attention_internal.h"
#include "flashgrad/cuda.h"
#include "error.h"

#define NO_CUDA(fn)                                                         \
    fg_error(FG_ERR_UNSUPPORTED,                                            \
             "%s: flashgrad was built without CUDA (configure --with-cuda)", \
             fn)

int fg_cuda_available(void) { return 0; }

fg_status fg_cuda_check_pointer(const void *ptr, const char *what)
{
    (void)ptr;
    (void)what;
    return NO_CUDA("device pointer check");
}

fg_status fg_attn_cuda_forward(const fg_attn_problem *pb,
                               const fg_attn_tensor *q, const fg_attn_tensor *k,
                               const fg_attn_tensor *v, const fg_attn_tensor *o,
                               const fg_attn_stats *st)
{
    (void)pb; (void)q; (void)k; (void)v; (void)o; (void)st;
    return NO_CUDA("fg_attention_forward");
}

fg_status fg_attn_cuda_backward(const fg_attn_problem *pb,
                                const fg_attn_tensor *q,
                                const fg_attn_tensor *k,
                                const fg_attn_tensor *v,
                                const fg_attn_tensor *o,
                                const fg_attn_tensor *dout,
                                const fg_attn_stats *st,
                                const fg_attn_tensor *dq,
                                const fg_attn_tensor *dk,
                                const fg_attn_tensor *dv)
{
    (void)pb; (void)q; (void)k; (void)v; (void)o; (void)dout; (void)st;
    (void)dq; (void)dk; (void)dv;
    return NO_CUDA("fg_attention_backward");
}

fg_status fg_attn_cuda_dropout_mask(const fg_attn_problem *pb, uint8_t *mask)
{
    (void)pb;
    (void)mask;
    return NO_CUDA("fg_attention_dropout_mask");
}

/* ---- flashgrad/cuda.h --------------------------------------------------- */

fg_status fg_cuda_set_stream(void *stream)
{
    (void)stream;
    return NO_CUDA("fg_cuda_set_stream");
}

void *fg_cuda_get_stream(void) { return NULL; }

fg_status fg_cuda_synchronize(void) { return NO_CUDA("fg_cuda_synchronize"); }

fg_status fg_cuda_set_allow_tf32(int allow)
{
    (void)allow;
    return NO_CUDA("fg_cuda_set_allow_tf32");
}

fg_status fg_cuda_memory_get_stats(fg_cuda_memory_stats *st)
{
    if (st)
        memset(st, 0, sizeof *st);
    return NO_CUDA("fg_cuda_memory_get_stats");
}

fg_status fg_cuda_memory_reset_peak(void)
{
    return NO_CUDA("fg_cuda_memory_reset_peak");
}

fg_status fg_cuda_empty_cache(void) { return NO_CUDA("fg_cuda_empty_cache"); }
