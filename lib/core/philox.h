/* SPDX-License-Identifier: MIT */
/* lib/core/philox.h - Philox4x32-10 (Salmon et al., SC'11), bit-identical to
 * cuRAND's device generator (curand_philox4x32_x.h). The CUDA kernels call
 * cuRAND's own curand_Philox4x32_10(); this host version lets the CPU path
 * reproduce the same dropout masks. Known-answer tests in tests/. */
#ifndef FG_LIB_PHILOX_H
#define FG_LIB_PHILOX_H

#include <stdint.h>

#define FG_PHILOX_M0 0xD2511F53u
#define FG_PHILOX_M1 0xCD9E8D57u
#define FG_PHILOX_W0 0x9E3779B9u
#define FG_PHILOX_W1 0xBB67AE85u

typedef struct fg_u32x4 { uint32_t x, y, z, w; } fg_u32x4;
typedef struct fg_u32x2 { uint32_t x, y; } fg_u32x2;

/* One round: two 32x32->64 multiplies, outputs crossed and keyed. */
static inline fg_u32x4 fg_philox_round(fg_u32x4 c, fg_u32x2 k)
{
    uint64_t p0 = (uint64_t)FG_PHILOX_M0 * c.x;
    uint64_t p1 = (uint64_t)FG_PHILOX_M1 * c.z;
    fg_u32x4 r;
    r.x = (uint32_t)(p1 >> 32) ^ c.y ^ k.x;
    r.y = (uint32_t)p1;
    r.z = (uint32_t)(p0 >> 32) ^ c.w ^ k.y;
    r.w = (uint32_t)p0;
    return r;
}

/* Ten rounds with the Weyl key schedule between them. */
static inline fg_u32x4 fg_philox4x32_10(fg_u32x4 c, fg_u32x2 k)
{
    for (int i = 0; i < 9; i++) {
        c = fg_philox_round(c, k);
        k.x += FG_PHILOX_W0;
        k.y += FG_PHILOX_W1;
    }
    return fg_philox_round(c, k);
}

#endif /* FG_LIB_PHILOX_H */
