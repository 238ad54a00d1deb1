/* SPDX-License-Identifier: MIT */
/* kernels/attention/tma_map.cu - tensor maps for the Hopper TMA loads (tma_map.h).
 * The encoder is a driver entry point, fetched through the runtime so the
 * library does not link libcuda. */
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "tma_map.h"

namespace fg {

static PFN_cuTensorMapEncodeTiled_v12000 encoder()
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static bool tried = false;
    if (!tried) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                             cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        cudaGetLastError();
        tried = true;
    }
    return fn;
}

bool make_panel_tmap(CUtensorMap *map, const Operand &t, int d, int64_t S,
                     int64_t heads, int64_t B, int box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 fn = encoder();
    if (!fn || S <= 0 || box_rows > 256)
        return false;
    /* 16-bit elements; strides in bytes for dims 1..3 */
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)S, (cuuint64_t)heads,
                                (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)t.ss * 2, (cuuint64_t)t.sh * 2,
                                   (cuuint64_t)t.sb * 2};
    for (int i = 0; i < 3; i++)
        if (strides[i] == 0 || strides[i] % 16 || strides[i] >= ((cuuint64_t)1 << 40))
            return false;
    const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t estride[4] = {1, 1, 1, 1};
    return fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, t.ptr, dims, strides, box,
              estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
              CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool make_operand_tmap(CUtensorMap *map, const AttnArgs &a, const Operand &t, bool keys,
                       int box_rows)
{
    const int64_t heads = keys ? a.Hk : a.H;
    if (!a.cu_q)
        return make_panel_tmap(map, t, a.d, keys ? a.Nk : a.Nq, heads, a.B, box_rows);
    /* Packed operands have no batch stride; the unused one only has to be
     * valid for the encoder: the tensor's extent, the larger product. */
    const int64_t rows = keys ? a.total_k : a.total_q;
    Operand p = t;
    p.sb = t.ss * rows > t.sh * heads ? t.ss * rows : t.sh * heads;
    return make_panel_tmap(map, p, a.d, rows, heads, 1, box_rows);
}

bool make_bias_tmap(CUtensorMap *map, const AttnArgs &a, const void *ptr, const int64_t *s,
                    int f32, int box_rows)
{
    if (!ptr || f32 || a.cu_q || a.seqused_k || s[3] != 1 || (uintptr_t)ptr % 16)
        return false;
    /* A broadcast dimension has extent 1; its stride only has to be one
     * the encoder accepts. make_panel_tmap refuses the rest: a zero row
     * stride (broadcast rows), strides that are not 16-byte multiples, and
     * negative ones (huge as unsigned). */
    const int64_t fill = s[2] * a.Nq;
    Operand t = {};
    t.ptr = const_cast<void *>(ptr);
    t.ss = s[2];
    t.sh = s[1] ? s[1] : fill;
    t.sb = s[0] ? s[0] : fill;
    return make_panel_tmap(map, t, a.Nk, a.Nq, s[1] ? a.H : 1, s[0] ? a.B : 1, box_rows);
}

} /* namespace fg */
