/* SPDX-License-Identifier: MIT */
/* tests/gpu_op_harness.h - runs one autograd op (or a short composite) on
 * the GPU and on the CPU and compares forward outputs and every input's
 * gradient; shared by the GPU op suite and the GPU gradcheck suite.
 *
 * An op is a closure (the fg_gradcheck_fn signature) plus a description of
 * its inputs. gph_run() draws fresh seeded fp64 values (never zero), rounds
 * them to the dtype under test so that both sides see the same numbers,
 * runs the closure on fp64 CPU tensors (the reference) and on CUDA tensors
 * of the dtype, backpropagates the same random upstream gradient (also
 * rounded) through both, and asserts
 *
 *     err = max_i |gpu_i - cpu_i| / max_i |cpu_i|   <=  tol
 *
 * for the output and for the .grad of every input that requires grad
 * (max-abs error relative to the largest reference element; 0 when both
 * are exactly zero, +inf on any NaN). tol is gph_tolerance(dtype, depth):
 * see gpu_op_harness.c for how it is derived. */
#ifndef FG_TESTS_GPU_OP_HARNESS_H
#define FG_TESTS_GPU_OP_HARNESS_H

#include "test_ops_util.h"

#define GPH_MAX_IN 6

/* Bit mask of the dtypes a case runs in. */
enum {
    GPH_F64 = 1u << 0,
    GPH_F32 = 1u << 1,
    GPH_BF16 = 1u << 2,
    GPH_F16 = 1u << 3,
    GPH_DEFAULT = GPH_F64 | GPH_F32 | GPH_BF16, /* dtypes == 0 means this */
    GPH_ALL = GPH_DEFAULT | GPH_F16
};

/* One input tensor. Values are uniform in [-amp, amp) with |x| >= min_abs
 * (positive: in [min_abs, amp)); amp 0 means 1, and min_abs is at least
 * amp / 1000 so no input is ever zero. */
typedef struct gph_input {
    int nd;
    int64_t shape[FG_MAX_DIMS];
    double amp, min_abs;
    int positive;
    int no_grad; /* leave requires_grad off */
} gph_input;

typedef struct gph_case {
    const char *name;
    fg_gradcheck_fn fn;
    void *user;
    /* Optional: randomises the closure's own data (indices, targets,
     * dropout seeds) from the case's generator before inputs are drawn. */
    void (*setup)(void *user, fgt_rng *r);
    int n_in;
    gph_input in[GPH_MAX_IN];
    unsigned dtypes;  /* GPH_* mask; 0 = GPH_DEFAULT */
    int depth;        /* low-precision roundings on the longest forward or
                         backward path (0 = 2: output + one saved value) */
    double tol_floor; /* the op itself rounds (e.g. a cast through bf16):
                         tolerance at least this, in every dtype */
    int no_gradcheck; /* not differentiable by finite differences (casts
                         that round) */
    int fp32_out;     /* the output is fp32 for fp16/bf16 inputs (the
                         cross-entropy loss) */
} gph_case;

/* The tolerance for a dtype and depth (documented in the .c). */
double gph_tolerance(fg_dtype dt, int depth);
/* 1 if case c runs in dtype dt. */
int gph_case_has_dtype(const gph_case *c, fg_dtype dt);
/* fp64 host values for input i (numel doubles, caller frees), drawn from r
 * and rounded to dt. */
double *gph_draw(const gph_input *in, fgt_rng *r, fg_dtype dt);
/* Tensor of dtype dt on dev holding the host doubles h (converted). */
fg_tensor *gph_tensor(fg_dtype dt, fg_device dev, int nd,
                      const int64_t *shape, const double *h,
                      int requires_grad);
/* Inputs of case c as tensors of dt on dev, values drawn from r (the
 * setup hook is not called here). */
void gph_inputs(const gph_case *c, fgt_rng *r, fg_dtype dt, fg_device dev,
                fg_tensor **out);

/* The GPU-vs-CPU check of case c in dtype dt (Check assertions), values
 * drawn from a copy of *r (make it with fgt_rng_for in the test's own file:
 * the run's seed lives in each file's copy of test_util.h's statics).
 * FG_TEST_VERBOSE=1 prints every error and its tolerance. */
void gph_run(const gph_case *c, fg_dtype dt, fgt_rng *r);

/* The cases shared by both GPU op suites (gpu_op_harness.c): every op of
 * autograd.h, with broadcasting, odd shapes and strided views. */
extern const gph_case gph_cases[];
extern const int gph_n_cases;

/* dtype of test index i of a loop over cases x 4 dtypes. */
fg_dtype gph_dtype_at(int i);

#endif /* FG_TESTS_GPU_OP_HARNESS_H */
