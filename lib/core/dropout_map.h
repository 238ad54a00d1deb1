/* SPDX-License-Identifier: MIT */
/* lib/core/dropout_map.h - the (seed, offset, b, h, i, j) -> Philox counter,
 * word and byte mapping of attention dropout, shared verbatim by the CPU
 * code and the CUDA kernels so both draw the same mask (documented in
 * attention.h and doc/design.md).
 *
 * One Philox4x32-7 call yields 16 bytes, one 8-bit draw per element, for
 * the 16 elements (i, j) with the same i / 16, i % 8, j / 32 and (j / 2) % 4:
 * rows i and i + 8, columns 32c + 8n + 2q + e for n = 0..3, e = 0..1. That
 * set is what one thread holds of a 16 x 32 tile in the mma/wgmma
 * accumulator layout (rows g, g + 8; columns 8n + 2q + e), so the forward
 * spends one call per 16 elements. In the backward's transposed tiles
 * (keys as rows) one word, 4 elements, belongs to each thread of a lane pair
 * in two warps; see fg_dropout_word. */
#ifndef FG_LIB_DROPOUT_MAP_H
#define FG_LIB_DROPOUT_MAP_H

#include <stdint.h>

#include "philox.h"

#if defined(__CUDACC__)
#  define FG_HD static __host__ __device__ __forceinline__
#else
#  define FG_HD static inline
#endif

/* The generator: Philox4x32-7 (philox.h) of (counter, key) below. */
FG_HD fg_u32x4 fg_dropout_philox(fg_u32x4 ctr, fg_u32x2 key)
{
    return fg_philox4x32_7(ctr, key);
}

/* key = { lo32(seed), hi32(seed) ^ hi32(offset) } */
FG_HD uint32_t fg_dropout_key_x(uint64_t seed, uint64_t offset)
{
    (void)offset;
    return (uint32_t)seed;
}
FG_HD uint32_t fg_dropout_key_y(uint64_t seed, uint64_t offset)
{
    return (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32);
}

/* counter = { (j / 32) * 4 + (j / 2) % 4, (i / 16) * 8 + i % 8, b*H + h,
 *             lo32(offset) }; `bh` is b*H + h. */
FG_HD uint32_t fg_dropout_ctr_x(int64_t j)
{
    return (uint32_t)(((j >> 5) << 2) | ((j >> 1) & 3));
}
FG_HD uint32_t fg_dropout_ctr_y(int64_t i)
{
    return (uint32_t)(((i >> 4) << 3) | (i & 7));
}
FG_HD uint32_t fg_dropout_ctr_z(int64_t bh) { return (uint32_t)bh; }
FG_HD uint32_t fg_dropout_ctr_w(uint64_t offset) { return (uint32_t)offset; }

/* Element (i, j) is byte fg_dropout_byte(i, j) (0 = least significant) of
 * word fg_dropout_word(j) (0..3 = x, y, z, w) of its call:
 *   word = j % 2 + 2 * ((j / 16) % 2),  byte = (i / 8) % 2 + 2 * ((j / 8) % 2).
 * A transposed tile's thread holds keys j and j + 8 (same word) of rows
 * i and i + 8: one word. */
FG_HD int fg_dropout_word(int64_t j) { return (int)((j & 1) | ((j >> 3) & 2)); }
FG_HD int fg_dropout_byte(int64_t i, int64_t j)
{
    return (int)(((i >> 3) & 1) | ((j >> 2) & 2));
}

/* keep <=> the element's byte < threshold, threshold in [0, 256]
 * (fg_attention_dropout_threshold). */
FG_HD int fg_dropout_keep8(uint32_t word, int byte, uint32_t threshold)
{
    return ((word >> (8 * byte)) & 0xffu) < threshold;
}

/* fg_dropout_keep8 for the four bytes of a word at once: bit k set <=>
 * byte k is kept. */
FG_HD uint32_t fg_dropout_keep4(uint32_t word, uint32_t threshold)
{
    return (uint32_t)(((word & 0xffu) < threshold) |
                      ((((word >> 8) & 0xffu) < threshold) << 1) |
                      ((((word >> 16) & 0xffu) < threshold) << 2) |
                      (((word >> 24) < threshold) << 3));
}

/* fg_dropout_keep4 four bytes at a time, without a compare per byte (the
 * CUDA backward's form): bit 7 of byte k of the result is set <=> byte k
 * of word < threshold, every other bit is clear. Per byte, (w | 0x80) -
 * (t & 0x7f) cannot borrow into the next byte and has bit 7 set <=> the
 * low 7 bits of w >= those of t; the bits 7 of w and t decide the rest.
 * threshold = 256 is taken as t_hi = 1, t_lo = 128 (every byte kept). */
FG_HD uint32_t fg_dropout_keep_bytes(uint32_t word, uint32_t threshold)
{
    const uint32_t lo = (threshold >= 256u ? 0x80u : threshold & 0x7fu) * 0x01010101u,
                   hi = (threshold >= 128u ? 0x80u : 0u) * 0x01010101u;
    const uint32_t r = (word | 0x80808080u) - lo;
    return ((~word & hi) | (~(word ^ hi) & ~r)) & 0x80808080u;
}
/* The flags of fg_dropout_keep_bytes gathered by one multiply: byte b's
 * to bit 4 (b % 2) + 2 (b / 2) + s (s = 0: bits 0, 4, 2, 6; s = 1: 1, 5,
 * 3, 7), the layout of the CUDA backward's transposed tiles. The high
 * word of flags * M holds them (M = 2^25 + 2^21 + 2^11 + 2^7, times 2^s);
 * the other partial products land on distinct bits outside them, so
 * nothing carries. */
FG_HD uint32_t fg_dropout_gather_bytes(uint32_t flags, int s)
{
    const uint32_t m = ((1u << 25) | (1u << 21) | (1u << 11) | (1u << 7)) << s;
    return (uint32_t)(((uint64_t)flags * m) >> 32) & (0x55u << s);
}
#endif /* FG_LIB_DROPOUT_MAP_H */
