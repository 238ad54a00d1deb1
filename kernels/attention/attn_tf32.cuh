/* kernels/attention/attn_tf32.cuh - the pieces shared by the TF32 attention
 * kernels (attn_tf32_fwd.cu, attn_tf32_bwd.cu): fp32 tiles in shared
 * memory, their rounding to TF32, and the m16n8k8 fragment loads.
 *
 * Tiles are fp32, row-major, rows padded to D + 4 floats. Then the eight
 * 16-byte rows of one ldmatrix phase fall in distinct bank groups (row r at
 * chunk r (D/4 + 1), odd), and a scalar read of element (2t + e, g) over
 * a warp (t = lane % 4, g = lane / 4) hits banks 8t + g: all distinct, so
 * no swizzle is needed. Tiles arrive by cp.async and each thread rounds
 * the chunks it copied to TF32 in place (cvt.rna) before the barrier that
 * publishes them, so fragments need no conversion when read.
 *
 * ldmatrix (.b16) moves 32-bit data unchanged: lane L receives row L / 4,
 * 4-byte word L % 4 of each 8 x 16-byte matrix, which is the m16n8k8 TF32
 * A layout for a row-major [m][k] tile and the B layout for an [n][k] one
 * (S = Q K^T, S^T = K Q^T, dP^T = V dO^T).
 *
 * A product whose A operand comes from an accumulator (P V, P^T dO,
 * dS^T Q, dS K) uses a pair permutation of the contraction index: k index
 * t stands for element 2t of the 8-slice, t + 4 for 2t + 1. The C layout
 * (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) is then the A layout with no
 * shuffle (c_to_a), and the B operand is read as rows 2t and 2t + 1 of a
 * row-major [k][n] tile (ldb_pairs). The sum runs over the same terms. */
#ifndef FG_KERNELS_ATTN_TF32_CUH
#define FG_KERNELS_ATTN_TF32_CUH

#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "attn_fp32.cuh"
#include "attn_kernels.h"
#include "attn_mma_tile.cuh"
#include "kernels/runtime/cuda_context.h"
#include "mma_sm80.cuh"

namespace fg {
namespace tf32 {

/* Async copy of rows s0 .. s0+rows-1 of head h into a [rows][D + 4] fp32
 * tile; rows >= valid and columns >= d are zero-filled. */
template <int D>
__device__ __forceinline__ void load_rows(uint32_t sbase, const Operand &t, int64_t b,
                                          int64_t s0, int64_t h, int rows, int valid, int d,
                                          int nthreads)
{
    constexpr int C = D / 4; /* 16-byte chunks per row */
    const float *base = (const float *)t.ptr + b * t.sb + h * t.sh;
    for (int idx = threadIdx.x; idx < rows * C; idx += nthreads) {
        const int r = idx / C, c = idx - r * C;
        const bool ok = r < valid && c * 4 < d;
        const float *src = ok ? base + (s0 + r) * t.ss + c * 4 : base;
        cp_async16(sbase + (uint32_t)(r * (D + 4) + c * 4) * 4, src, ok ? 16 : 0);
    }
}

/* Rounds the chunks this thread copied with load_rows (same rows,
 * nthreads) to TF32 in place; call after its cp.async group landed and
 * before the barrier that hands the tile to the other warps. */
template <int D>
__device__ __forceinline__ void round_rows(float *tile, int rows, int nthreads)
{
    constexpr int C = D / 4;
    for (int idx = threadIdx.x; idx < rows * C; idx += nthreads) {
        const int r = idx / C, c = idx - r * C;
        float4 *p = (float4 *)(tile + r * (D + 4) + c * 4);
        float4 v = *p;
        v.x = __uint_as_float(to_tf32(v.x));
        v.y = __uint_as_float(to_tf32(v.y));
        v.z = __uint_as_float(to_tf32(v.z));
        v.w = __uint_as_float(to_tf32(v.w));
        *p = v;
    }
}

/* A fragment (rows m0 .. m0+15, k0 .. k0+7) of a row-major [m][k] tile
 * with LD floats per row, at shared address `tile`. */
template <int LD>
__device__ __forceinline__ void lda_rows(uint32_t a[4], uint32_t tile, int m0, int k0)
{
    const int lane = threadIdx.x & 31;
    const int r = m0 + (lane & 7) + 8 * ((lane >> 3) & 1), c = k0 + 4 * (lane >> 4);
    ldmatrix_x4(a, tile + (uint32_t)(r * LD + c) * 4);
}

/* B fragments of two n8 tiles (n0 .. n0+7: b[0], b[1]; n0+8 ..: b[2],
 * b[3]) over k0 .. k0+7 of an [n][k] tile. */
template <int LD>
__device__ __forceinline__ void ldb_rows(uint32_t b[4], uint32_t tile, int n0, int k0)
{
    const int lane = threadIdx.x & 31;
    const int r = n0 + (lane & 7) + 8 * (lane >> 4), c = k0 + 4 * ((lane >> 3) & 1);
    ldmatrix_x4(b, tile + (uint32_t)(r * LD + c) * 4);
}

/* B fragment, pair-permuted, of k0 .. k0+7, n0 .. n0+7 of a row-major
 * [k][n] tile (already TF32). */
template <int LD>
__device__ __forceinline__ void ldb_pairs(const float *tile, int k0, int n0, uint32_t *b0,
                                          uint32_t *b1)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float *p = tile + (k0 + 2 * t) * LD + n0 + g;
    *b0 = __float_as_uint(p[0]);
    *b1 = __float_as_uint(p[LD]);
}

/* A fragment, pair-permuted, of rows m0 .. m0+15 over k0 .. k0+7 from a
 * transposed, row-major [k][m] tile (dS^T for dQ = dS K). */
template <int LD>
__device__ __forceinline__ void lda_pairs_t(uint32_t a[4], const float *tile, int k0, int m0)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float *p = tile + (k0 + 2 * t) * LD + m0 + g;
    a[0] = __float_as_uint(p[0]);
    a[1] = __float_as_uint(p[8]);
    a[2] = __float_as_uint(p[LD]);
    a[3] = __float_as_uint(p[LD + 8]);
}

/* An accumulator tile (fp32) as the pair-permuted A fragment, rounded. */
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c[4])
{
    a[0] = to_tf32(c[0]);
    a[1] = to_tf32(c[2]);
    a[2] = to_tf32(c[1]);
    a[3] = to_tf32(c[3]);
}

/* The operand rows the kernels copy with cp.async: 16-byte aligned
 * pointers, strides multiples of 4 floats. */
inline bool aligned(const Operand &t)
{
    return (uintptr_t)t.ptr % 16 == 0 && t.sb % 4 == 0 && t.ss % 4 == 0 && t.sh % 4 == 0;
}

/* Whether the TF32 kernels take a problem: the opt-in is on, and the
 * sm80 kernels' cover (every mask and score modifier; no bias, no packed
 * or key-padded batch), aligned operands, not FG_ATTN_KERNEL=general. */
inline bool usable(const AttnArgs &a, bool backward)
{
    const char *force = getenv("FG_ATTN_KERNEL");
    if (!fg_cuda_attention_tf32_allowed() || (force && strcmp(force, "general") == 0) ||
        !sm80_supports(a))
        return false;
    bool ok = aligned(a.q) && aligned(a.k) && aligned(a.v) && aligned(a.o);
    if (backward)
        ok = ok && aligned(a.dout) && aligned(a.dq) && aligned(a.dk) && aligned(a.dv);
    return ok;
}

/* f(integral_constant<int, kMode>, integral_constant<bool, kDropout>)
 * for a's instantiation: 2 the variants, 1 plain causal, 0 no mask (the
 * sm80 kernels' kMode). */
template <typename F> inline fg_status with_mode(const AttnArgs &a, F f)
{
    using Drop = std::true_type;
    using Keep = std::false_type;
    if (a.variant)
        return a.dropout ? f(std::integral_constant<int, 2>(), Drop())
                         : f(std::integral_constant<int, 2>(), Keep());
    if (a.causal)
        return a.dropout ? f(std::integral_constant<int, 1>(), Drop())
                         : f(std::integral_constant<int, 1>(), Keep());
    return a.dropout ? f(std::integral_constant<int, 0>(), Drop())
                     : f(std::integral_constant<int, 0>(), Keep());
}

} /* namespace tf32 */
} /* namespace fg */

#endif /* FG_KERNELS_ATTN_TF32_CUH */
