/* SPDX-License-Identifier: MIT */
/* kernels/runtime/profile.h - the timing scopes behind flashgrad/profile.h,
 * placed around the ops' work by the layers above (attention, autograd,
 * ops, train). */
#ifndef FG_KERNELS_RUNTIME_PROFILE_H
#define FG_KERNELS_RUNTIME_PROFILE_H

#include "flashgrad/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nonzero while a region runs: the only cost of a scope when profiling
 * is off. */
extern int fg_prof_active;

/* Opens a scope of `family` for the operation `name` (a string that
 * outlives the region: a literal, __func__ or an op's static name; NULL:
 * the family's name); the token goes to fg_prof_leave. */
int fg_prof_enter_slow(int family, const char *name);
void fg_prof_leave_slow(int token);
static inline int fg_prof_enter(int family, const char *name)
{
    return fg_prof_active ? fg_prof_enter_slow(family, name) : -1;
}
static inline void fg_prof_leave(int token)
{
    if (token != -1)
        fg_prof_leave_slow(token);
}

/* `return call;` timed as `family` under the enclosing function's name
 * (call yields an fg_status); FG_PROF_RETURN_AS names it. */
#define FG_PROF_RETURN(family, call) FG_PROF_RETURN_AS(family, __func__, call)
#define FG_PROF_RETURN_AS(family, name, call)                               \
    do {                                                                    \
        const int fg_prof_t_ = fg_prof_enter(family, name);                 \
        const fg_status fg_prof_s_ = (call);                                \
        fg_prof_leave(fg_prof_t_);                                          \
        return fg_prof_s_;                                                  \
    } while (0)

/* CUDA events (kernels/runtime/cuda_profile.cu; FG_ERR_UNSUPPORTED
 * without CUDA): event i recorded on the context stream now; the
 * milliseconds between events a and b (both complete); all destroyed. */
fg_status fg_prof_cuda_record(int i);
fg_status fg_prof_cuda_elapsed(int a, int b, float *ms);
void fg_prof_cuda_release(void);

#ifdef __cplusplus
}
#endif

#endif /* FG_KERNELS_RUNTIME_PROFILE_H */
