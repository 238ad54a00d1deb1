/* SPDX-License-Identifier: MIT */
/* flashgrad/gradcheck.h - finite-difference check of the autograd
 * gradients of any function built from flashgrad ops (like
 * torch.autograd.gradcheck).
 *
 * For a function y = fn(x_1, ..., x_n), for every input that requires grad:
 *   numerical Jacobian   J_num[:, j] = (fn(x + eps e_j) - fn(x - eps e_j))
 *                                      / (2 eps), one pair per element j;
 *   analytical Jacobian  J_ana[k, :] = the vector-Jacobian product with the
 *                                      unit vector e_k, one backward per
 *                                      output element k;
 * and the check passes iff |J_ana - J_num| <= atol + rtol |J_num| for every
 * entry. The backward is run twice per output element and the two results
 * must agree bit for bit (reentrancy: no hidden state in the backward).
 * Fast mode compares v^T J u instead, for random v and u (entries of random
 * sign and magnitude in [0.5, 1), so no entry is all but ignored), per
 * input: one backward and two forwards per input.
 *
 * fn must be deterministic (use fixed dropout seeds) and must not keep
 * references to the inputs. gradcheck writes x +/- eps into the inputs'
 * storage and restores every element exactly; it never touches their
 * .grad. Inputs should be fp64 (fp32 is refused unless allow_fp32 is set:
 * the default tolerances are meaningless in single precision). */
#ifndef FLASHGRAD_GRADCHECK_H
#define FLASHGRAD_GRADCHECK_H

#include <stdint.h>

#include "flashgrad/export.h"
#include "flashgrad/status.h"
#include "flashgrad/tensor.h"

FG_BEGIN_DECLS

/* Builds *output (a new reference) from the inputs; a status other than
 * FG_OK aborts the check with that status. */
typedef fg_status (*fg_gradcheck_fn)(fg_tensor *const *inputs, int n_inputs,
                                     fg_tensor **output, void *user);

typedef struct fg_gradcheck_options {
    double eps;            /* 1e-6 */
    double atol;           /* 1e-5 */
    double rtol;           /* 1e-3 */
    int fast_mode;         /* 0: full Jacobians; 1: v^T J u per input */
    int check_reentrant;   /* 1: the backward twice must agree exactly */
    int allow_fp32;        /* 0: refuse fp32 inputs */
    uint64_t seed;         /* for fast mode's v and u */
} fg_gradcheck_options;

/* torch.autograd.gradcheck's defaults (listed above). */
FG_API void fg_gradcheck_options_init(fg_gradcheck_options *o);

/* The outcome. The worst entry is the one with the largest
 * |analytical - numerical| / (atol + rtol |numerical|). */
typedef struct fg_gradcheck_report {
    int passed;           /* 1 iff every entry is within tolerance and the
                             backward is reentrant */
    int reentrant;        /* 1 if both backward runs agreed exactly */
    int64_t n_checked;    /* entries (or fast-mode probes) compared */
    int64_t n_failed;     /* entries outside tolerance */
    int worst_input;      /* index into inputs[] (-1 if nothing checked) */
    int64_t worst_in_elem;  /* flat (row-major) element of that input;
                               -1 in fast mode */
    int64_t worst_out_elem; /* flat element of the output; -1 in fast mode */
    double worst_analytical;
    double worst_numerical;
    double worst_ratio;   /* |a - n| / (atol + rtol |n|); <= 1 passes */
    double max_abs_err;   /* largest |a - n| over all entries */
    char message[256];    /* one line: "ok" or what failed and where */
} fg_gradcheck_report;

/* Runs the check. Returns FG_OK when the check could be carried out -
 * whether it passed is report->passed - and an error status (with
 * fg_last_error()) when it could not: bad arguments, fn failing, an output
 * whose shape changes between calls, no input requiring grad. opts NULL
 * means the defaults. */
FG_API fg_status fg_gradcheck(fg_gradcheck_fn fn, void *user,
                              fg_tensor *const *inputs, int n_inputs,
                              const fg_gradcheck_options *opts,
                              fg_gradcheck_report *report);

FG_END_DECLS

#endif /* FLASHGRAD_GRADCHECK_H */
