/* SPDX-License-Identifier: MIT */
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
    /* Variants (attention.h), zero = off. */
    int top_left;        /* causal/window/ALiBi alignment i' = i */
    int window;          /* use window_left/right (-1 = unbounded) */
    int64_t window_left, window_right;
    double softcap;      /* > 0: S <- c tanh(S / c) */
    const float *alibi;  /* slope of (b, h) = alibi[b * alibi_sb + h] */
    int64_t alibi_sb;
    /* Dense block map [mb, mh, nqb, nkb] of 128 x 128 blocks (nonzero =
     * visible), or NULL. */
    const uint8_t *block_map;
    int64_t map_b, map_h;
    /* Key padding: keys j >= seqused_k[b] are masked (NULL = none). */
    const int32_t *seqused_k;
    /* Additive bias added to the logit of a visible pair after ALiBi:
     * element (b, h, i, j) at bias[b*bias_sb + h*bias_sh + i*bias_sq +
     * j*bias_sk], or NULL. */
    const double *bias;
    int64_t bias_sb, bias_sh, bias_sq, bias_sk;
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

/* Packed batches: sequence b is rows cu_q[b] .. cu_q[b+1]-1 of the
 * contiguous [total_q, H, d] arrays q, o, dout, dq (cu_k: k, v, dk, dv
 * [total_k, Hk, d]); s->Nq, s->Nk are the maximum lengths, s->keep (if
 * any) the [B, H, Nq, Nk] mask with sequence-local i, j, s->seqused_k
 * per sequence. Each sequence runs through the dense reference above on
 * its own. Stats are [H, total_q]. Rows past cu[B] are not written. */
void naive_varlen_forward(const naive_shape *s, const int32_t *cu_q,
                          const int32_t *cu_k, int64_t total_q,
                          const double *q, const double *k, const double *v,
                          double *o, double *m, double *l);
void naive_varlen_backward(const naive_shape *s, const int32_t *cu_q,
                           const int32_t *cu_k, const double *q,
                           const double *k, const double *v,
                           const double *dout, double *dq, double *dk,
                           double *dv);
/* The same, and ds = dL/d(final logit) of every pair, dense [B, H, Nq, Nk]
 * (0 for masked pairs; the gradient of the bias before any broadcast sum),
 * when ds is not NULL. */
void naive_attention_backward_ds(const naive_shape *s, const double *q,
                                 const double *k, const double *v,
                                 const double *dout, double *dq, double *dk,
                                 double *dv, double *ds);

#endif /* FG_TESTS_NAIVE_ATTENTION_H */
