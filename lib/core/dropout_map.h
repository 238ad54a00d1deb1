/* lib/core/dropout_map.h - the (seed, offset, b, h, i, j) -> Philox counter/key
 * mapping of attention dropout, shared verbatim by the CPU code and the CUDA
 * kernels so both draw the same mask (documented in attention.h and
 * doc/design.md). */
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

/* counter = { j/4, i, b*H + h, lo32(offset) }; `bh` is b*H + h. One Philox
 * call yields the 32-bit words for the four columns 4*(j/4) .. 4*(j/4)+3. */
FG_HD uint32_t fg_dropout_ctr_x(int64_t j) { return (uint32_t)(j >> 2); }
FG_HD uint32_t fg_dropout_ctr_y(int64_t i) { return (uint32_t)i; }
FG_HD uint32_t fg_dropout_ctr_z(int64_t bh) { return (uint32_t)bh; }
FG_HD uint32_t fg_dropout_ctr_w(uint64_t offset) { return (uint32_t)offset; }

/* keep <=> top 24 bits of the word < threshold (see fg_dropout_threshold). */
FG_HD int fg_dropout_keep(uint32_t word, uint32_t threshold)
{
    return (word >> 8) < threshold;
}

#endif /* FG_LIB_DROPOUT_MAP_H */
