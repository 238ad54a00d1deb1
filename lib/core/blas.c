/* SPDX-License-Identifier: MIT */
/* lib/core/blas.c - GEMM through CBLAS when available, else a loop. */
#include <limits.h>
#include <string.h>

#include "config.h"

#ifdef FG_HAVE_CBLAS
#include <cblas.h>
#endif

#include "blas.h"

static _Thread_local int tls_force_loop;

void fg_gemm_force_loop(int on) { tls_force_loop = on; }

const char *fg_gemm_backend(void)
{
#ifdef FG_HAVE_CBLAS
    return "cblas";
#else
    return "loop";
#endif
}

/* Work (M*N*K) above which the loop runs on several threads. */
#define PAR_WORK (1 << 18)

/* ---- loop fallback -------------------------------------------------------- */

/* Rows of C computed independently (in parallel). Accumulation in the
 * operand type, k ascending, so results do not depend on threads. */
#define DEF_LOOP(NAME, T)                                                    \
    static void NAME(int64_t M, int64_t N, int64_t K, T alpha, const T *A,  \
                     int64_t a_rs, int64_t a_cs, const T *B, int64_t b_rs,  \
                     int64_t b_cs, T beta, T *C, int64_t c_rs, int64_t c_cs) \
    {                                                                        \
        const int par = (double)M * N * K > PAR_WORK;                        \
        if (b_cs == 1 && c_cs == 1) { /* axpy over contiguous B rows */      \
            _Pragma("omp parallel for if (par)")                             \
            for (int64_t i = 0; i < M; i++) {                                \
                T *c = C + i * c_rs;                                         \
                for (int64_t j = 0; j < N; j++)                              \
                    c[j] = beta == 0 ? 0 : beta * c[j];                      \
                for (int64_t k = 0; k < K; k++) {                            \
                    const T a = alpha * A[i * a_rs + k * a_cs];              \
                    const T *b = B + k * b_rs;                               \
                    for (int64_t j = 0; j < N; j++)                          \
                        c[j] += a * b[j];                                    \
                }                                                            \
            }                                                                \
            return;                                                          \
        }                                                                    \
        _Pragma("omp parallel for if (par)")                                 \
        for (int64_t i = 0; i < M; i++)                                      \
            for (int64_t j = 0; j < N; j++) { /* dot products */             \
                T acc = 0;                                                   \
                const T *a = A + i * a_rs, *b = B + j * b_cs;                \
                for (int64_t k = 0; k < K; k++)                              \
                    acc += a[k * a_cs] * b[k * b_rs];                        \
                T *c = C + i * c_rs + j * c_cs;                              \
                *c = alpha * acc + (beta == 0 ? 0 : beta * *c);              \
            }                                                                \
    }

DEF_LOOP(loop_f32, float)
DEF_LOOP(loop_f64, double)

/* ---- CBLAS ----------------------------------------------------------------- */

#ifdef FG_HAVE_CBLAS
/* Expresses a rows x cols operand with strides (rs, cs) as a row-major
 * matrix, transposed or not, with a leading dimension BLAS accepts. */
static int blas_operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                        int *trans, int64_t *ld)
{
    if (cs == 1 || cols == 1) {
        *ld = rows == 1 ? (cols > 1 ? cols : 1) : rs;
        if (*ld >= (cols > 1 ? cols : 1) && *ld <= INT_MAX) {
            *trans = 0;
            return 1;
        }
    }
    if (rs == 1 || rows == 1) {
        *ld = cols == 1 ? (rows > 1 ? rows : 1) : cs;
        if (*ld >= (rows > 1 ? rows : 1) && *ld <= INT_MAX) {
            *trans = 1;
            return 1;
        }
    }
    return 0;
}

static int try_blas(fg_dtype dt, int64_t M, int64_t N, int64_t K,
                    double alpha, const void *A, int64_t a_rs, int64_t a_cs,
                    const void *B, int64_t b_rs, int64_t b_cs, double beta,
                    void *C, int64_t c_rs, int64_t c_cs)
{
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return 0;
    int ta, tb, tc;
    int64_t lda, ldb, ldc;
    if (!blas_operand(M, N, c_rs, c_cs, &tc, &ldc))
        return 0;
    if (tc) /* C^T = B^T A^T: swap the operands, C becomes row-major */
        return try_blas(dt, N, M, K, alpha, B, b_cs, b_rs, A, a_cs, a_rs,
                        beta, C, c_cs, c_rs);
    if (!blas_operand(M, K, a_rs, a_cs, &ta, &lda) ||
        !blas_operand(K, N, b_rs, b_cs, &tb, &ldb))
        return 0;
    const enum CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans,
                               opb = tb ? CblasTrans : CblasNoTrans;
    if (dt == FG_FP32) {
        cblas_sgemm(CblasRowMajor, opa, opb, (int)M, (int)N, (int)K,
                    (float)alpha, A, (int)lda, B, (int)ldb, (float)beta, C,
                    (int)ldc);
        return 1;
    }
#ifdef FG_HAVE_CBLAS_DGEMM
    cblas_dgemm(CblasRowMajor, opa, opb, (int)M, (int)N, (int)K, alpha, A,
                (int)lda, B, (int)ldb, beta, C, (int)ldc);
    return 1;
#else
    return 0; /* fp64 stays on the loop */
#endif
}
#endif

void fg_gemm(fg_dtype dt, int64_t M, int64_t N, int64_t K, double alpha,
             const void *A, int64_t a_rs, int64_t a_cs, const void *B,
             int64_t b_rs, int64_t b_cs, double beta, void *C, int64_t c_rs,
             int64_t c_cs)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* C = beta C */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                int64_t o = i * c_rs + j * c_cs;
                if (dt == FG_FP32)
                    ((float *)C)[o] =
                        beta == 0 ? 0.0f : (float)beta * ((float *)C)[o];
                else
                    ((double *)C)[o] = beta == 0 ? 0.0 : beta * ((double *)C)[o];
            }
        return;
    }
#ifdef FG_HAVE_CBLAS
    if (!tls_force_loop && try_blas(dt, M, N, K, alpha, A, a_rs, a_cs, B,
                                    b_rs, b_cs, beta, C, c_rs, c_cs))
        return;
#endif
    if (dt == FG_FP32)
        loop_f32(M, N, K, (float)alpha, A, a_rs, a_cs, B, b_rs, b_cs,
                 (float)beta, C, c_rs, c_cs);
    else
        loop_f64(M, N, K, alpha, A, a_rs, a_cs, B, b_rs, b_cs, beta, C, c_rs,
                 c_cs);
}
