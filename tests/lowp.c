/* SPDX-License-Identifier: MIT */
/* tests/lowp.c - see lowp.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowp.h"
#include "lib/autograd/tensor_internal.h"

/* The library's own converters (lib/autograd/tensor.c), so the tests round exactly
 * as fg_tensor copies do. */
uint16_t fgt_f32_to_bf16(float f) { return fg_float_to_bf16(f); }
float fgt_bf16_to_f32(uint16_t h) { return fg_bf16_to_float(h); }
uint16_t fgt_f32_to_f16(float f) { return fg_float_to_half(f); }
float fgt_f16_to_f32(uint16_t h) { return fg_half_to_float(h); }

double fgt_round_to(fg_dtype dt, double x)
{
    switch (dt) {
    case FG_FP16: return fgt_f16_to_f32(fgt_f32_to_f16((float)x));
    case FG_BF16: return fgt_bf16_to_f32(fgt_f32_to_bf16((float)x));
    case FG_FP32: return (float)x;
    default: return x;
    }
}

#define IDX(b, n, h, N, Hh, d) ((((b) * (N) + (n)) * (Hh) + (h)) * (d))

void naive_attention_lowp(const naive_shape *s, fg_dtype dt, const double *q,
                          const double *k, const double *v, const double *dout,
                          double *o, double *dq, double *dk, double *dv)
{
    const int64_t d = s->d, Nq = s->Nq, Nk = s->Nk, G = s->H / s->Hk;
    const size_t nk = (size_t)(s->B * Nk * s->Hk * d);
    memset(dk, 0, nk * sizeof(double));
    memset(dv, 0, nk * sizeof(double));
    float *P = malloc(sizeof(float) * (size_t)(Nq * Nk));
    float *Z = malloc(sizeof(float) * (size_t)(Nq * Nk));
    float *dS = malloc(sizeof(float) * (size_t)(Nq * Nk));
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++) {
            const int64_t hk = h / G;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 8)
#endif
            for (int64_t i = 0; i < Nq; i++) {
                /* S = round(scale * Q K^T), P = round(softmax(S)). */
                float mx = -INFINITY;
                float *p = P + i * Nk, *z = Z + i * Nk;
                const double *qi = q + IDX(b, i, h, Nq, s->H, d);
                for (int64_t j = 0; j < Nk; j++) {
                    const int vis = !s->causal || j <= i + (Nk - Nq);
                    float acc = 0;
                    const double *kj = k + IDX(b, j, hk, Nk, s->Hk, d);
                    for (int64_t x = 0; x < d; x++)
                        acc += (float)qi[x] * (float)kj[x];
                    p[j] = vis ? (float)fgt_round_to(dt, acc * s->scale) : -INFINITY;
                    mx = fmaxf(mx, p[j]);
                    z[j] = s->keep ? (s->keep[((b * s->H + h) * Nq + i) * Nk + j]
                                          ? (float)(1.0 / (1.0 - s->p)) : 0.0f)
                                   : 1.0f;
                }
                float sum = 0;
                for (int64_t j = 0; j < Nk; j++) {
                    p[j] = mx == -INFINITY ? 0.0f : expf(p[j] - mx);
                    sum += p[j];
                }
                for (int64_t j = 0; j < Nk; j++)
                    p[j] = sum > 0 ? (float)fgt_round_to(dt, p[j] / sum) : 0.0f;
                /* O = round((P * Z) V). */
                double *oi = o + IDX(b, i, h, Nq, s->H, d);
                for (int64_t x = 0; x < d; x++) {
                    float acc = 0;
                    for (int64_t j = 0; j < Nk; j++)
                        acc += (float)fgt_round_to(dt, p[j] * z[j]) *
                               (float)v[IDX(b, j, hk, Nk, s->Hk, d) + x];
                    oi[x] = fgt_round_to(dt, acc);
                }
                /* dP = round(dO V^T) * Z, D = rowsum(dO * O),
                 * dS = round(P * (dP - D)). */
                const double *gi = dout + IDX(b, i, h, Nq, s->H, d);
                float D = 0;
                for (int64_t x = 0; x < d; x++)
                    D += (float)gi[x] * (float)oi[x];
                for (int64_t j = 0; j < Nk; j++) {
                    float acc = 0;
                    const double *vj = v + IDX(b, j, hk, Nk, s->Hk, d);
                    for (int64_t x = 0; x < d; x++)
                        acc += (float)gi[x] * (float)vj[x];
                    const float dp = (float)fgt_round_to(dt, acc) * z[j];
                    dS[i * Nk + j] = (float)fgt_round_to(dt, p[j] * (dp - D));
                }
                /* dQ = round(scale * dS K). */
                double *dqi = dq + IDX(b, i, h, Nq, s->H, d);
                for (int64_t x = 0; x < d; x++) {
                    float acc = 0;
                    for (int64_t j = 0; j < Nk; j++)
                        acc += dS[i * Nk + j] * (float)k[IDX(b, j, hk, Nk, s->Hk, d) + x];
                    dqi[x] = fgt_round_to(dt, acc * s->scale);
                }
            }
            /* dK += scale dS^T Q, dV += (P*Z)^T dO (fp32 accumulation over
             * the group, rounded at the end below). */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 8)
#endif
            for (int64_t j = 0; j < Nk; j++) {
                double *dkj = dk + IDX(b, j, hk, Nk, s->Hk, d);
                double *dvj = dv + IDX(b, j, hk, Nk, s->Hk, d);
                for (int64_t x = 0; x < d; x++) {
                    float ak = 0, av = 0;
                    for (int64_t i = 0; i < Nq; i++) {
                        ak += dS[i * Nk + j] * (float)q[IDX(b, i, h, Nq, s->H, d) + x];
                        av += (float)fgt_round_to(dt, P[i * Nk + j] * Z[i * Nk + j]) *
                              (float)dout[IDX(b, i, h, Nq, s->H, d) + x];
                    }
                    dkj[x] += (double)(ak * (float)s->scale);
                    dvj[x] += (double)av;
                }
            }
        }
    for (size_t i = 0; i < nk; i++) {
        dk[i] = fgt_round_to(dt, dk[i]);
        dv[i] = fgt_round_to(dt, dv[i]);
    }
    free(P);
    free(Z);
    free(dS);
}
