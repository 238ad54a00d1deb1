/* SPDX-License-Identifier: MIT */
/* kernels/attention/tma_map.h - host side of the Hopper TMA loads: a 4-D tensor map
 * (d, S, heads, batch) over a strided attention operand whose boxes are one
 * 64-element panel of `box_rows` rows with the 128-byte swizzle, i.e. the
 * shared-memory panel layout of wgmma_sm90.cuh. */
#ifndef FG_KERNELS_TMA_MAP_H
#define FG_KERNELS_TMA_MAP_H

#include <cuda.h>

#include "attn_traits.cuh"

namespace fg {

/* False (and nothing reported) when the driver lacks
 * cuTensorMapEncodeTiled or rejects the operand (e.g. a zero stride); the
 * caller then uses a kernel without TMA. Out-of-range rows and columns of
 * a box read as zeros. */
bool make_panel_tmap(CUtensorMap *map, const Operand &t, int d, int64_t S,
                     int64_t heads, int64_t B, int box_rows);

/* make_panel_tmap over one attention operand: a query-side one (Q, O, dO:
 * keys = false) or a key-side one (K, V), dense [B, S, heads, d] or, for a
 * packed batch (a.cu_q), [1, total, heads, d]. */
bool make_operand_tmap(CUtensorMap *map, const AttnArgs &a, const Operand &t, bool keys,
                       int box_rows);

/* A 16-bit additive bias or its gradient (ptr with element strides s[4],
 * as a.bias / a.dbias; f32 = 1 for an fp32 one) as a map of (key, query,
 * head, batch) with [box_rows] x 64 boxes (the wgmma kernels' bias
 * stages): only where TMA can read it as is, i.e. keys contiguous
 * (s[3] = 1), rows not broadcast, the pointer and every non-zero stride
 * 16-byte multiples, no packed batch; a broadcast head or batch (stride 0)
 * becomes an extent of 1 read at coordinate 0. False otherwise: the
 * kernels then read (write) it per element. */
bool make_bias_tmap(CUtensorMap *map, const AttnArgs &a, const void *ptr, const int64_t *s,
                    int f32, int box_rows);

} /* namespace fg */

#endif /* FG_KERNELS_TMA_MAP_H */
