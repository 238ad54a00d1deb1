/* tests/naive_attention.h - the textbook attention in fp64 with S and P
 * materialised: the reference the tiled implementations are tested against.
 * All arrays are contiguous BSHD ([B, N, H, d]); stats are [B, H, Nq]. */
#ifndef FG_TESTS_NAIVE_ATTENTION_H
#define FG_TESTS_NAIVE_ATTENTION_H

#include <stdint.h>

typedef struct naive_shape {
    int64_t B, Nq, Nk, H, Hk, d;
    double scale; /* resolved (not 0) */
    int causal;
    double p;            /* dropout probability */
    const uint8_t *keep; /* [B, H, Nq, Nk] mask, or NULL for no dropout */
} naive_shape;

/* O, m, l. Fully masked rows: O = 0, m = -inf, l = 0. */
void naive_attention_forward(const naive_shape *s, const double *q,
                             const double *k, const double *v, double *o,
                             double *m, double *l);

/* dQ, dK, dV from dO (straight from the formula, without reusing O). */
void naive_attention_backward(const naive_shape *s, const double *q,
                              const double *k, const double *v,
                              const double *dout, double *dq, double *dk,
                              double *dv);

#endif /* FG_TESTS_NAIVE_ATTENTION_H */
