/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_common.c - argument checks, the dispatch fallback and recording
 * shared by every op. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_internal.h"

int fg_op_env_once(int *cache, const char *name, const char *value)
{
    if (*cache < 0) {
        const char *v = getenv(name);
        *cache = v && strcmp(v, value) == 0;
    }
    return *cache;
}

fg_status fg_op_check(const char *fn, const fg_tensor *t, const char *name)
{
    if (!t)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
    if (t->device != FG_DEVICE_CPU && t->device != FG_DEVICE_CUDA)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s has device %d", fn,
                        name, (int)t->device);
    /* The CPU kernels exist for fp32 and fp64; the CUDA kernels also take
     * fp16 and bf16 (computing in fp32) for mixed precision. */
    if (t->dtype == FG_FP32 || t->dtype == FG_FP64)
        return FG_OK;
    if ((t->dtype == FG_FP16 || t->dtype == FG_BF16) &&
        t->device == FG_DEVICE_CUDA)
        return FG_OK;
    if (t->dtype == FG_FP16 || t->dtype == FG_BF16)
        return fg_error(FG_ERR_UNSUPPORTED,
                        "%s: %s is a CPU %s tensor; CPU ops support fp32 and "
                        "fp64 (fp16 and bf16 only on CUDA)",
                        fn, name, fg_dtype_name(t->dtype));
    return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: %s has unknown dtype %d",
                    fn, name, (int)t->dtype);
}

fg_status fg_op_check2(const char *fn, const fg_tensor *a, const fg_tensor *b)
{
    FG_TRY(fg_op_check(fn, a, "a"));
    FG_TRY(fg_op_check(fn, b, "b"));
    if (a->dtype != b->dtype)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: dtype mismatch (%s and %s)", fn,
                        fg_dtype_name(a->dtype), fg_dtype_name(b->dtype));
    if (a->device != b->device)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: device mismatch (%s and %s)", fn,
                        fg_device_name(a->device), fg_device_name(b->device));
    return FG_OK;
}

fg_status fg_op_check_out(const char *fn, void *out)
{
    if (!out)
        return fg_error(FG_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    return FG_OK;
}

const char *fg_fmt_shape(char *buf, size_t size, int nd, const int64_t *shape)
{
    size_t n = 0;
    n += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < nd && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "",
                              (long long)shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
    return buf;
}

fg_status fg_op_unsupported(const char *fn, fg_device dev)
{
    return fg_error(FG_ERR_UNSUPPORTED,
                    "%s: not implemented for %s tensors yet", fn,
                    fg_device_name(dev));
}

fg_status fg_op_finish(const fg_op_def *op, fg_tensor *const *inputs,
                       int n_in, fg_tensor *const *outputs, int n_out,
                       fg_tensor *const *saved, int n_saved,
                       const void *extra, size_t extra_bytes)
{
    if (!fg_ag_should_record(inputs, n_in))
        return FG_OK;
    fg_status s = fg_ag_record(op, inputs, n_in, outputs, n_out, saved,
                               n_saved, extra, extra_bytes, NULL);
    if (s != FG_OK)
        for (int j = 0; j < n_out; j++)
            fg_tensor_free(outputs[j]);
    return s;
}
