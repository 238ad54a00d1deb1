/* SPDX-License-Identifier: MIT */
/* tests/lowp.h - host fp16/bf16 conversions (round to nearest even) and a
 * naive attention computed "in" fp16/bf16 the way a framework's math path
 * does: fp32 dot products, every intermediate matrix (S, P, O, dP, dS and
 * the gradients) rounded to the dtype. Its error against the fp64 reference
 * is the yardstick for the fused fp16/bf16 kernels. */
#ifndef FG_TESTS_LOWP_H
#define FG_TESTS_LOWP_H

#include <math.h>
#include <stdint.h>

#include <flashgrad/types.h>

#include "naive_attention.h"

uint16_t fgt_f32_to_f16(float f);
float fgt_f16_to_f32(uint16_t h);
uint16_t fgt_f32_to_bf16(float f);
float fgt_bf16_to_f32(uint16_t h);
/* Round x to dtype dt and back (fp16, bf16, fp32; fp64 unchanged). */
double fgt_round_to(fg_dtype dt, double x);

/* Element off of a host buffer of dtype dt, from / to a double. */
static inline void fgt_store(fg_dtype dt, void *buf, int64_t off, double x)
{
    switch (dt) {
    case FG_FP64: ((double *)buf)[off] = x; break;
    case FG_FP32: ((float *)buf)[off] = (float)x; break;
    case FG_FP16: ((uint16_t *)buf)[off] = fgt_f32_to_f16((float)x); break;
    case FG_BF16: ((uint16_t *)buf)[off] = fgt_f32_to_bf16((float)x); break;
    }
}

static inline double fgt_load(fg_dtype dt, const void *buf, int64_t off)
{
    switch (dt) {
    case FG_FP64: return ((const double *)buf)[off];
    case FG_FP32: return ((const float *)buf)[off];
    case FG_FP16: return fgt_f16_to_f32(((const uint16_t *)buf)[off]);
    case FG_BF16: return fgt_bf16_to_f32(((const uint16_t *)buf)[off]);
    }
    return NAN;
}

/* Forward and backward of naive attention with lowp rounding (BSHD arrays
 * of already-rounded inputs, results as doubles). */
void naive_attention_lowp(const naive_shape *s, fg_dtype dt, const double *q,
                          const double *k, const double *v, const double *dout,
                          double *o, double *dq, double *dk, double *dv);

#endif /* FG_TESTS_LOWP_H */
