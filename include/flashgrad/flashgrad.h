/* SPDX-License-Identifier: MIT */
/* flashgrad/flashgrad.h - umbrella header.
 *
 * flashgrad is a C library for training with FlashAttention: attention
 * kernels (forward and backward) on the CPU and on CUDA GPUs.
 *
 * Quick usage (CPU, fp32, Q/K/V in [B, N, H, d] layout):
 *
 *     #include <flashgrad/flashgrad.h>
 *
 *     fg_attn_params p;
 *     fg_attn_params_init(&p, B, N, N, H, H, d);   // batch, Nq, Nk, H, Hk, d
 *     p.causal = 1;
 *     fg_attn_tensor q = fg_attn_bshd(Q, FG_FP32, N, H, d);  // likewise k, v, o
 *     fg_attn_stats st = { m, l, FG_FP32 };                  // each [B, H, N]
 *     if (fg_attention_forward(&p, &q, &k, &v, &o, &st) != FG_OK)
 *         fprintf(stderr, "flashgrad: %s\n", fg_last_error());
 *     // ... later, with dO: fg_attention_backward(&p, &q, &k, &v, &o, &dO,
 *     //                                            &st, &dq, &dk, &dv);
 *
 * Every function returns an fg_status; fg_last_error() says what went wrong.
 * Headers: status.h (errors), types.h (dtypes, devices), attention.h (the
 * FlashAttention kernels), tensor.h (tensors, arenas, random generator),
 * autograd.h (the tape, hooks, differentiable ops), gradcheck.h, nn.h
 * (layers, the GPT model, toy data, sampling), optim.h (AdamW, clipping,
 * LR schedule, checkpoints), dist.h (MPI/NCCL communicator, data
 * parallelism, ring attention). */
#ifndef FLASHGRAD_FLASHGRAD_H
#define FLASHGRAD_FLASHGRAD_H

#include "flashgrad/export.h"
#include "flashgrad/status.h"
#include "flashgrad/types.h"
#include "flashgrad/attention.h"
#include "flashgrad/tensor.h"
#include "flashgrad/cuda.h"
#include "flashgrad/autograd.h"
#include "flashgrad/gradcheck.h"
#include "flashgrad/nn.h"
#include "flashgrad/optim.h"
#include "flashgrad/dist.h"
#include "flashgrad/profile.h"

#endif /* FLASHGRAD_FLASHGRAD_H */
