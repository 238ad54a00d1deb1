/* SPDX-License-Identifier: MIT */
/* lib/core/dropout_map.h - the (seed, offset, b, h, i, j) -> Philox counter,
 * word and byte mapping of attention dropout, shared verbatim by the CPU
 * code and the CUDA kernels so both draw the same mask (documented in
 * attention.h and doc/design.md).
 *
 * One Philox4x32-10 call yields 16 bytes, one 8-bit draw per element, for
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

#if defined(__CUDACC__)
#  define FG_HD static __host__ __device__ __forceinline__
#else
#  define FG_HD static inline
#endif

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

#endif /* FG_LIB_DROPOUT_MAP_H */
