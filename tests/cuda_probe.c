/* SPDX-License-Identifier: MIT */
/* tests/cuda_probe.c - what a program linked against the installed library
 * sees of CUDA: fg_cuda_available() and its reason, and what creating a
 * CUDA tensor returns. Prints key=value lines for tests/check-packaging.sh. */
#include <stdio.h>

#include "flashgrad/flashgrad.h"

int main(void)
{
    int avail = fg_cuda_available();
    printf("available=%d\n", avail);
    printf("reason=%s\n", avail ? "" : fg_last_error());
    fg_clear_error();
    fg_tensor *t = NULL;
    fg_status s = fg_tensor_zeros(FG_FP32, FG_DEVICE_CUDA, FG_SHAPE(2, 3), &t);
    printf("tensor=%s\n", fg_status_string(s));
    printf("message=%s\n", s == FG_OK ? "" : fg_last_error());
    fg_tensor_free(t);
    /* The CPU keeps working whatever CUDA said. */
    double v = 0;
    s = fg_tensor_scalar(FG_FP32, FG_DEVICE_CPU, 2.0, &t);
    if (s == FG_OK)
        s = fg_tensor_item(t, &v);
    fg_tensor_free(t);
    printf("cpu=%s\n", s == FG_OK && v == 2.0 ? "ok" : fg_last_error());
    return s == FG_OK ? 0 : 1;
}
