/* SPDX-License-Identifier: MIT */
/* lib/core/philox.h - Philox4x32 (Salmon et al., SC'11): ten rounds,
 * bit-identical to cuRAND's device generator (curand_philox4x32_x.h; the
 * CUDA elementwise dropout calls cuRAND's own curand_Philox4x32_10, and
 * this host version reproduces it), and seven rounds, the attention
 * dropout's generator (dropout_map.h), shared verbatim by the CPU code and
 * the CUDA kernels. Known-answer tests (Random123's kat_vectors for both)
 * in tests/test_philox.c. */
#ifndef FG_LIB_PHILOX_H
#define FG_LIB_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#  define FG_PHILOX_HD static __host__ __device__ __forceinline__
#else
#  define FG_PHILOX_HD static inline
#endif

#define FG_PHILOX_M0 0xD2511F53u
#define FG_PHILOX_M1 0xCD9E8D57u
#define FG_PHILOX_W0 0x9E3779B9u
#define FG_PHILOX_W1 0xBB67AE85u

typedef struct fg_u32x4 { uint32_t x, y, z, w; } fg_u32x4;
typedef struct fg_u32x2 { uint32_t x, y; } fg_u32x2;

/* One round: two 32x32->64 multiplies, outputs crossed and keyed. On the
 * device as high and low halves (__umulhi and a 32-bit product, as
 * cuRAND's round): a 64-bit product takes an aligned register pair, which
 * cost the d = 64 attention forward 8 registers (ptxas) and a block an SM. */
FG_PHILOX_HD fg_u32x4 fg_philox_round(fg_u32x4 c, fg_u32x2 k)
{
#if defined(__CUDA_ARCH__)
    const uint32_t hi0 = __umulhi(FG_PHILOX_M0, c.x), lo0 = FG_PHILOX_M0 * c.x,
                   hi1 = __umulhi(FG_PHILOX_M1, c.z), lo1 = FG_PHILOX_M1 * c.z;
#else
    const uint64_t p0 = (uint64_t)FG_PHILOX_M0 * c.x,
                   p1 = (uint64_t)FG_PHILOX_M1 * c.z;
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0,
                   hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
#endif
    fg_u32x4 r;
    r.x = hi1 ^ c.y ^ k.x;
    r.y = lo1;
    r.z = hi0 ^ c.w ^ k.y;
    r.w = lo0;
    return r;
}

/* R rounds with the Weyl key schedule between them. */
#define FG_PHILOX_ROUNDS(R)                                                    \
    for (int i_ = 0; i_ < (R) - 1; i_++) {                                     \
        c = fg_philox_round(c, k);                                             \
        k.x += FG_PHILOX_W0;                                                   \
        k.y += FG_PHILOX_W1;                                                   \
    }                                                                          \
    return fg_philox_round(c, k)

FG_PHILOX_HD fg_u32x4 fg_philox4x32_10(fg_u32x4 c, fg_u32x2 k)
{
    FG_PHILOX_ROUNDS(10);
}

/* Seven rounds: the count Salmon et al. found Crush-resistant (passing
 * TestU01's BigCrush) for Philox4x32, ten being Random123's default with a
 * safety margin; FlashAttention-2's dropout uses seven too. 30% fewer
 * rounds where the attention kernels' dropout is bound by integer work
 * (d = 64: one call per 16 elements forward, 8 or 16 backward). */
FG_PHILOX_HD fg_u32x4 fg_philox4x32_7(fg_u32x4 c, fg_u32x2 k)
{
    FG_PHILOX_ROUNDS(7);
}

#undef FG_PHILOX_ROUNDS

#endif /* FG_LIB_PHILOX_H */
