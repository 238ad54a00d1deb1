/* SPDX-License-Identifier: MIT */
/* lib/core/blas.h - one GEMM entry point for every matrix product of the CPU
 * ops: CBLAS when configure found one (FG_HAVE_CBLAS), a plain OpenMP loop
 * otherwise or when the operands' strides cannot be expressed to BLAS. */
#ifndef FG_LIB_BLAS_H
#define FG_LIB_BLAS_H

#include <stdint.h>

#include "flashgrad/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C = alpha * A B + beta * C for an M x K matrix A, K x N B and M x N C,
 * each given by its base pointer and element strides between rows (rs) and
 * columns (cs); strides may be 0 on inputs (broadcast). dt is FG_FP32 or
 * FG_FP64. beta == 0 overwrites C (NaNs in C do not propagate). C must not
 * overlap A or B. */
void fg_gemm(fg_dtype dt, int64_t M, int64_t N, int64_t K, double alpha,
             const void *A, int64_t a_rs, int64_t a_cs, const void *B,
             int64_t b_rs, int64_t b_cs, double beta, void *C, int64_t c_rs,
             int64_t c_cs);

/* "cblas" or "loop": what fg_gemm uses for BLAS-friendly operands. */
const char *fg_gemm_backend(void);

/* Testing: with 1, fg_gemm always takes the loop (per thread). */
void fg_gemm_force_loop(int on);

#ifdef __cplusplus
}
#endif

#endif /* FG_LIB_BLAS_H */
