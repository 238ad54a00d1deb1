/* SPDX-License-Identifier: MIT */
/* tests/ref_dropout.h - the attention dropout mask rebuilt from its
 * documentation alone, as the tests' reference: Philox4x32-7 written from
 * the Random123 specification (Salmon et al., SC'11; checked against the
 * Random123 known-answer vectors in test_philox.c) and the word mapping
 * stated in include/flashgrad/attention.h. Nothing here calls or includes
 * the library's own Philox or mapping (lib/core/philox.h, dropout_map.h),
 * so a mistake there cannot hide in the reference. */
#ifndef FG_TESTS_REF_DROPOUT_H
#define FG_TESTS_REF_DROPOUT_H

#include <math.h>
#include <stdint.h>

/* Philox4x32 with `rounds` rounds: ctr[4], key[2] in, out[4] out. The
 * round is Random123's philox4x32round: (hi0, lo0) = 0xD2511F53 * c0,
 * (hi1, lo1) = 0xCD9E8D57 * c2, c' = {hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1,
 * lo0}; the key is bumped by the Weyl constants between rounds. */
static inline void ref_philox4x32(const uint32_t ctr[4], const uint32_t key[2],
                                  int rounds, uint32_t out[4])
{
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < rounds; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t prod0 = 0xD2511F53ull * c[0];
        const uint64_t prod1 = 0xCD9E8D57ull * c[2];
        const uint32_t n0 = (uint32_t)(prod1 >> 32) ^ c[1] ^ k0;
        const uint32_t n2 = (uint32_t)(prod0 >> 32) ^ c[3] ^ k1;
        c[1] = (uint32_t)(prod1 & 0xffffffffu);
        c[3] = (uint32_t)(prod0 & 0xffffffffu);
        c[0] = n0;
        c[2] = n2;
    }
    for (int w = 0; w < 4; w++)
        out[w] = c[w];
}

/* T = round((1 - p) * 256), from attention.h. */
static inline uint32_t ref_keep_threshold(double p)
{
    return (uint32_t)floor((1.0 - p) * 256.0 + 0.5);
}

/* The factor a kept element is scaled by: 256 / T (0 when T = 0). */
static inline double ref_keep_scale(double p)
{
    const uint32_t t = ref_keep_threshold(p);
    return t ? 256.0 / t : 0.0;
}

/* The keep bit of element (b, h, i, j) for H query heads, per attention.h:
 *   key     = { lo32(seed), hi32(seed) ^ hi32(offset) }
 *   counter = { (j / 32) * 4 + (j / 2) % 4, (i / 16) * 8 + i % 8,
 *               b * H + h, lo32(offset) }
 *   r       = word (j % 2 + 2 * ((j / 16) % 2)) of Philox4x32_7(counter, key)
 *   u       = byte ((i / 8) % 2 + 2 * ((j / 8) % 2)) of r, byte 0 the low 8 bits
 *   keep   <=> u < T */
static inline int ref_dropout_keep(uint64_t seed, uint64_t offset, double p,
                                   int64_t H, int64_t b, int64_t h, int64_t i,
                                   int64_t j)
{
    const uint32_t key[2] = {(uint32_t)(seed & 0xffffffffu),
                             (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32)};
    const uint32_t ctr[4] = {(uint32_t)((j / 32) * 4 + (j / 2) % 4),
                             (uint32_t)((i / 16) * 8 + i % 8),
                             (uint32_t)(b * H + h),
                             (uint32_t)(offset & 0xffffffffu)};
    uint32_t r[4];
    ref_philox4x32(ctr, key, 7, r);
    const uint32_t word = r[j % 2 + 2 * ((j / 16) % 2)];
    const int byte = (int)((i / 8) % 2 + 2 * ((j / 8) % 2));
    return ((word >> (8 * byte)) & 0xffu) < ref_keep_threshold(p);
}

/* The whole mask, [B, H, Nq, Nk] bytes (1 keep, 0 drop), as
 * fg_attention_dropout_mask documents it. */
static inline void ref_dropout_mask(uint64_t seed, uint64_t offset, double p,
                                    int64_t B, int64_t H, int64_t Nq,
                                    int64_t Nk, uint8_t *mask)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Nq; i++)
                for (int64_t j = 0; j < Nk; j++)
                    mask[((b * H + h) * Nq + i) * Nk + j] = (uint8_t)
                        ref_dropout_keep(seed, offset, p, H, b, h, i, j);
}

/* The mask-recovery tests (V = dO = unit rows, Q = 0): compares which
 * entries of O [B, N, H, d] (O[i][j]) and dV (dV[j][i]) are nonzero with
 * `mask` (and, if causal, j <= i); counts the mismatches and returns the
 * number of kept visible entries. */
static inline int64_t ref_mask_mismatch(const uint8_t *mask, int causal,
                                        const double *o, const double *dv,
                                        int64_t B, int64_t H, int64_t N,
                                        int64_t d, int64_t *bad_o,
                                        int64_t *bad_dv)
{
    int64_t kept = 0;
    *bad_o = *bad_dv = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < N; j++) {
                    const int keep = mask[((b * H + h) * N + i) * N + j] &&
                                     (!causal || j <= i);
                    kept += keep;
                    *bad_o += (o[((b * N + i) * H + h) * d + j] != 0) != keep;
                    *bad_dv += (dv[((b * N + j) * H + h) * d + i] != 0) != keep;
                }
    return kept;
}

#endif /* FG_TESTS_REF_DROPOUT_H */
