/* SPDX-License-Identifier: MIT */
/* tests/naive_attention.c - see naive_attention.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "naive_attention.h"
#include "ref_dropout.h"

#define IDX(b, n, h, N, Hh, d) ((((b) * (N) + (n)) * (Hh) + (h)) * (d))

static int64_t iprime(const naive_shape *s, int64_t i)
{
    return s->top_left ? i : i + (s->Nk - s->Nq);
}

/* The mask of attention.h written out pair by pair. */
static int visible(const naive_shape *s, int64_t b, int64_t h, int64_t i,
                   int64_t j)
{
    const int64_t ip = iprime(s, i);
    if (s->seqused_k && j >= s->seqused_k[b])
        return 0;
    if (s->causal && j > ip)
        return 0;
    /* As differences of positions: a window up to INT64_MAX cannot
     * overflow them. */
    if (s->window && s->window_left >= 0 && ip - j > s->window_left)
        return 0;
    if (s->window && s->window_right >= 0 && j - ip > s->window_right)
        return 0;
    if (s->block_map) {
        const int64_t nqb = (s->Nq + 127) / 128, nkb = (s->Nk + 127) / 128;
        const int64_t mb = s->map_b > 1 ? b : 0, mh = s->map_h > 1 ? h : 0;
        if (!s->block_map[((mb * s->map_h + mh) * nqb + i / 128) * nkb + j / 128])
            return 0;
    }
    return 1;
}

/* Final logit of a visible pair from scale * q.k; *dcap = d logit / d x. */
static double score(const naive_shape *s, int64_t b, int64_t h, int64_t i,
                    int64_t j, double x, double *dcap)
{
    double dc = 1.0;
    if (s->softcap > 0) {
        const double t = tanh(x / s->softcap);
        x = s->softcap * t;
        dc = 1.0 - t * t;
    }
    if (s->alibi)
        x -= (double)s->alibi[b * s->alibi_sb + h] * fabs((double)(iprime(s, i) - j));
    if (s->bias)
        x += s->bias[b * s->bias_sb + h * s->bias_sh + i * s->bias_sq +
                     j * s->bias_sk];
    if (dcap)
        *dcap = dc;
    return x;
}

/* P (softmax probabilities) of one (b, h): [Nq, Nk]; also m and l rows. */
static void probs(const naive_shape *s, const double *q, const double *k,
                  int64_t b, int64_t h, double *P, double *m, double *l)
{
    const int64_t hk = h / (s->H / s->Hk), d = s->d;
    for (int64_t i = 0; i < s->Nq; i++) {
        double mx = -INFINITY;
        double *row = P + i * s->Nk;
        for (int64_t j = 0; j < s->Nk; j++) {
            if (!visible(s, b, h, i, j)) {
                row[j] = -INFINITY;
                continue;
            }
            const double *qi = q + IDX(b, i, h, s->Nq, s->H, d);
            const double *kj = k + IDX(b, j, hk, s->Nk, s->Hk, d);
            double acc = 0;
            for (int64_t x = 0; x < d; x++)
                acc += qi[x] * kj[x];
            row[j] = score(s, b, h, i, j, acc * s->scale, NULL);
            if (row[j] > mx)
                mx = row[j];
        }
        double sum = 0;
        for (int64_t j = 0; j < s->Nk; j++) {
            row[j] = mx == -INFINITY ? 0.0 : exp(row[j] - mx);
            sum += row[j];
        }
        for (int64_t j = 0; j < s->Nk; j++)
            row[j] = sum > 0 ? row[j] / sum : 0.0;
        if (m)
            m[i] = mx;
        if (l)
            l[i] = sum;
    }
}

static double dropfac(const naive_shape *s, int64_t b, int64_t h, int64_t i,
                      int64_t j)
{
    if (!s->keep)
        return 1.0;
    return s->keep[((b * s->H + h) * s->Nq + i) * s->Nk + j] ? ref_keep_scale(s->p)
                                                             : 0.0;
}

void naive_attention_forward(const naive_shape *s, const double *q,
                             const double *k, const double *v, double *o,
                             double *m, double *l)
{
    double *P = malloc(sizeof(double) * (size_t)(s->Nq * s->Nk));
    const int64_t d = s->d;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++) {
            const int64_t hk = h / (s->H / s->Hk);
            const int64_t row0 = (b * s->H + h) * s->Nq;
            probs(s, q, k, b, h, P, m ? m + row0 : NULL, l ? l + row0 : NULL);
            for (int64_t i = 0; i < s->Nq; i++) {
                double *oi = o + IDX(b, i, h, s->Nq, s->H, d);
                for (int64_t x = 0; x < d; x++)
                    oi[x] = 0;
                for (int64_t j = 0; j < s->Nk; j++) {
                    const double pij = P[i * s->Nk + j] * dropfac(s, b, h, i, j);
                    const double *vj = v + IDX(b, j, hk, s->Nk, s->Hk, d);
                    for (int64_t x = 0; x < d; x++)
                        oi[x] += pij * vj[x];
                }
            }
        }
    free(P);
}

void naive_attention_backward(const naive_shape *s, const double *q,
                              const double *k, const double *v,
                              const double *dout, double *dq, double *dk,
                              double *dv)
{
    naive_attention_backward_ds(s, q, k, v, dout, dq, dk, dv, NULL);
}

void naive_attention_backward_ds(const naive_shape *s, const double *q,
                                 const double *k, const double *v,
                                 const double *dout, double *dq, double *dk,
                                 double *dv, double *ds_out)
{
    const int64_t d = s->d, Nq = s->Nq, Nk = s->Nk;
    double *P = malloc(sizeof(double) * (size_t)(Nq * Nk));
    double *dP = malloc(sizeof(double) * (size_t)(Nq * Nk));
    memset(dq, 0, sizeof(double) * (size_t)(s->B * Nq * s->H * d));
    memset(dk, 0, sizeof(double) * (size_t)(s->B * Nk * s->Hk * d));
    memset(dv, 0, sizeof(double) * (size_t)(s->B * Nk * s->Hk * d));
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++) {
            const int64_t hk = h / (s->H / s->Hk);
            probs(s, q, k, b, h, P, NULL, NULL);
            /* O = (P * Z) V: dV += (P*Z)^T dO, d(P) = (dO V^T) * Z. */
            for (int64_t i = 0; i < Nq; i++) {
                const double *gi = dout + IDX(b, i, h, Nq, s->H, d);
                for (int64_t j = 0; j < Nk; j++) {
                    const double z = dropfac(s, b, h, i, j);
                    const double *vj = v + IDX(b, j, hk, Nk, s->Hk, d);
                    double *dvj = dv + IDX(b, j, hk, Nk, s->Hk, d);
                    double acc = 0;
                    for (int64_t x = 0; x < d; x++) {
                        dvj[x] += P[i * Nk + j] * z * gi[x];
                        acc += gi[x] * vj[x];
                    }
                    dP[i * Nk + j] = acc * z;
                }
            }
            /* softmax backward: dS = P * (dP - sum_j P dP). */
            for (int64_t i = 0; i < Nq; i++) {
                double dot = 0;
                for (int64_t j = 0; j < Nk; j++)
                    dot += P[i * Nk + j] * dP[i * Nk + j];
                const double *qi = q + IDX(b, i, h, Nq, s->H, d);
                double *dqi = dq + IDX(b, i, h, Nq, s->H, d);
                for (int64_t j = 0; j < Nk; j++) {
                    double dcap = 1.0;
                    if (P[i * Nk + j] != 0) { /* recompute the softcap slope */
                        const double *kj = k + IDX(b, j, hk, Nk, s->Hk, d);
                        double acc = 0;
                        for (int64_t x = 0; x < d; x++)
                            acc += qi[x] * kj[x];
                        score(s, b, h, i, j, acc * s->scale, &dcap);
                    }
                    const double dlogit = P[i * Nk + j] * (dP[i * Nk + j] - dot);
                    if (ds_out)
                        ds_out[((b * s->H + h) * Nq + i) * Nk + j] = dlogit;
                    const double ds = dlogit * dcap * s->scale;
                    const double *kj = k + IDX(b, j, hk, Nk, s->Hk, d);
                    double *dkj = dk + IDX(b, j, hk, Nk, s->Hk, d);
                    for (int64_t x = 0; x < d; x++) {
                        dqi[x] += ds * kj[x];
                        dkj[x] += ds * qi[x];
                    }
                }
            }
        }
    free(P);
    free(dP);
}

/* Sequence b of a packed batch as a dense problem of batch 1; *keep gets
 * its slice of the dropout mask (freed by the caller). */
static naive_shape seq_shape(const naive_shape *s, const int32_t *cu_q,
                             const int32_t *cu_k, int64_t b, uint8_t **keep)
{
    naive_shape t = *s;
    t.B = 1;
    t.Nq = cu_q[b + 1] - cu_q[b];
    t.Nk = cu_k[b + 1] - cu_k[b];
    t.alibi = s->alibi ? s->alibi + b * s->alibi_sb : NULL;
    t.seqused_k = s->seqused_k ? s->seqused_k + b : NULL;
    t.block_map = NULL;
    *keep = NULL;
    if (s->keep) {
        *keep = malloc((size_t)(s->H * t.Nq * t.Nk) + 1);
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < t.Nq; i++)
                for (int64_t j = 0; j < t.Nk; j++)
                    (*keep)[(h * t.Nq + i) * t.Nk + j] =
                        s->keep[((b * s->H + h) * s->Nq + i) * s->Nk + j];
        t.keep = *keep;
    }
    return t;
}

void naive_varlen_forward(const naive_shape *s, const int32_t *cu_q,
                          const int32_t *cu_k, int64_t total_q,
                          const double *q, const double *k, const double *v,
                          double *o, double *m, double *l)
{
    const int64_t d = s->d;
    for (int64_t b = 0; b < s->B; b++) {
        uint8_t *keep;
        const naive_shape t = seq_shape(s, cu_q, cu_k, b, &keep);
        double *ms = malloc(sizeof(double) * (size_t)(s->H * t.Nq) + 1);
        double *ls = malloc(sizeof(double) * (size_t)(s->H * t.Nq) + 1);
        naive_attention_forward(&t, q + cu_q[b] * s->H * d, k + cu_k[b] * s->Hk * d,
                                v + cu_k[b] * s->Hk * d, o + cu_q[b] * s->H * d,
                                ms, ls);
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < t.Nq; i++) {
                m[h * total_q + cu_q[b] + i] = ms[h * t.Nq + i];
                l[h * total_q + cu_q[b] + i] = ls[h * t.Nq + i];
            }
        free(ms);
        free(ls);
        free(keep);
    }
}

void naive_varlen_backward(const naive_shape *s, const int32_t *cu_q,
                           const int32_t *cu_k, const double *q,
                           const double *k, const double *v,
                           const double *dout, double *dq, double *dk,
                           double *dv)
{
    const int64_t d = s->d, qs = s->H * d, ks = s->Hk * d;
    for (int64_t b = 0; b < s->B; b++) {
        uint8_t *keep;
        const naive_shape t = seq_shape(s, cu_q, cu_k, b, &keep);
        naive_attention_backward(&t, q + cu_q[b] * qs, k + cu_k[b] * ks,
                                 v + cu_k[b] * ks, dout + cu_q[b] * qs,
                                 dq + cu_q[b] * qs, dk + cu_k[b] * ks,
                                 dv + cu_k[b] * ks);
        free(keep);
    }
}
