/* SPDX-License-Identifier: MIT */
/* kernels/ops/ops_nn.cu - embedding (gather forward; backward as a
 * deterministic scatter-add: a host-built CSR of the positions per used
 * row, segments of it summed in position order, then each row's segments
 * in order, no atomics) and
 * dropout (cuRAND's Philox with the CPU's key and counter, so masks match
 * the CPU bit for bit; entry points in lib/ops/cuda_ops_nn.h). The other nn
 * ops are in ops_softmax.cu and ops_layernorm.cu. */
#include "ops_nn_common.cuh"

namespace {

/* ---- embedding ---------------------------------------------------------- */

/* y[i, :] = w[idx[i], :]: a plain copy of U-sized words (any dtype). */
template <typename U>
__global__ void emb_fwd_kernel(const U *__restrict__ w, int64_t s0, int64_t s1,
                               const int64_t *__restrict__ idx, int64_t n,
                               int64_t C, U *__restrict__ y)
{
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const U *src = w + idx[i] * s0;
        U *dst = y + i * C;
        for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
            dst[j] = src[j * s1];
    }
}

/* The backward in two passes over a host-built CSR (positions grouped by
 * vocabulary row, in position order), deterministic without atomics. A
 * character vocabulary's rows are few and uneven (a space is ~15% of the
 * text: 2500 of a GPT-2-small batch's 16k positions), so one thread per
 * (row, column) walking a whole row left the step waiting on the longest
 * row (0.55 ms on an H200, 2.5 ms with one block per row before that).
 * Pass 1: segment s (at most kEmbSeg positions [sb[s], sb[s+1]) of one
 * row) sums its g rows in position order into part[s, :] in the compute
 * type, a thread per (segment, column), the loads of 8 positions in
 * flight. Pass 2: dw[urow[u], :] = the row's segments useg[u] ..
 * useg[u+1] - 1 summed in order, rounded once. */
constexpr int64_t kEmbSeg = 64;

template <typename T>
__global__ void emb_bwd_part_kernel(const T *__restrict__ g,
                                    const int64_t *__restrict__ sb,
                                    const int64_t *__restrict__ pos,
                                    int64_t nseg, int64_t C,
                                    typename Num<T>::A *__restrict__ part)
{
    typedef typename Num<T>::A A;
    constexpr int kIlp = 8;
    for (int64_t sg = blockIdx.x; sg < nseg; sg += gridDim.x) {
        const int64_t k0 = sb[sg], k1 = sb[sg + 1];
        for (int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
             j < C; j += (int64_t)gridDim.y * blockDim.x) {
            A acc = A(0);
            int64_t k = k0;
            for (; k + kIlp <= k1; k += kIlp) {
                A v[kIlp];
#pragma unroll
                for (int t = 0; t < kIlp; t++)
                    v[t] = Num<T>::ld(g[pos[k + t] * C + j]);
#pragma unroll
                for (int t = 0; t < kIlp; t++)
                    acc += v[t];
            }
            for (; k < k1; k++)
                acc += Num<T>::ld(g[pos[k] * C + j]);
            part[sg * C + j] = acc;
        }
    }
}

template <typename T>
__global__ void emb_bwd_sum_kernel(const typename Num<T>::A *__restrict__ part,
                                   const int64_t *__restrict__ urow,
                                   const int64_t *__restrict__ useg,
                                   int64_t nu, int64_t C, T *__restrict__ dw)
{
    typedef typename Num<T>::A A;
    for (int64_t u = blockIdx.x; u < nu; u += gridDim.x) {
        const int64_t s0 = useg[u], s1 = useg[u + 1];
        T *dst = dw + urow[u] * C;
        for (int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
             j < C; j += (int64_t)gridDim.y * blockDim.x) {
            A acc = part[s0 * C + j];
            for (int64_t sg = s0 + 1; sg < s1; sg++)
                acc += part[sg * C + j];
            dst[j] = Num<T>::st(acc);
        }
    }
}

/* ---- dropout ------------------------------------------------------------ */

/* One Philox call per group b of 4 elements, the mapping of dropout_apply
 * in lib/ops/ops_nn.c; the product is taken in fp64 and rounded once, so fp32
 * and fp64 results equal the CPU's bit for bit. */
template <typename T>
__global__ void dropout_kernel(const T *__restrict__ src, T *__restrict__ dst,
                               int64_t n, uint2 key, uint32_t off_lo,
                               uint32_t thr, double scale)
{
    const int64_t groups = (n + 3) / 4;
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         b < groups; b += (int64_t)gridDim.x * blockDim.x) {
        const uint4 ctr = make_uint4((uint32_t)b, (uint32_t)((uint64_t)b >> 32),
                                     FG_NN_DROPOUT_TAG, off_lo);
        const uint4 r = curand_Philox4x32_10(ctr, key);
        const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int64_t e = 4 * b + k;
            if (e < n) {
                /* times 0 when dropped: NaN and inf give NaN (the CPU op) */
                const double v = (double)Num<T>::ld(src[e]) *
                                 ((words[k] >> 8) < thr ? scale : 0.0);
                dst[e] = Num<T>::st_d(v);
            }
        }
    }
}

/* The 4 elements at p (aligned to their size) in one or two vector
 * accesses: fg_dropout_add's group, a quarter of the load instructions. */
template <typename T> __device__ __forceinline__ void ld4(const T *p, T *e)
{
    if constexpr (sizeof(T) == 2) {
        const uint2 r = *reinterpret_cast<const uint2 *>(p);
        memcpy(e, &r, 8);
    } else {
        static_assert(sizeof(T) == 4 || sizeof(T) == 8, "element size");
        const uint4 *q = reinterpret_cast<const uint4 *>(p);
#pragma unroll
        for (int i = 0; i < (int)sizeof(T) / 4; i++) {
            const uint4 r = q[i];
            memcpy(reinterpret_cast<char *>(e) + 16 * i, &r, 16);
        }
    }
}
template <typename T> __device__ __forceinline__ void st4(T *p, const T *e)
{
    if constexpr (sizeof(T) == 2) {
        uint2 r;
        memcpy(&r, e, 8);
        *reinterpret_cast<uint2 *>(p) = r;
    } else {
        uint4 *q = reinterpret_cast<uint4 *>(p);
#pragma unroll
        for (int i = 0; i < (int)sizeof(T) / 4; i++) {
            uint4 r;
            memcpy(&r, reinterpret_cast<const char *>(e) + 16 * i, 16);
            q[i] = r;
        }
    }
}

/* fg_dropout_add: Tx the residual stream's dtype, Tv the branch's. Forward
 * (x non-NULL): y = x + round_v(v * (keep ? scale : 0)) with v = b; backward
 * (x NULL): y = db = round_v(round_v(g) * (keep ? scale : 0)) with g = b in
 * Tx. Each rounding of the unfused dropout -> cast -> add chain is kept, so
 * results equal it bit for bit. Tb is b's storage type (Tv or Tx). With
 * vec (n a multiple of 4, every pointer aligned to 4 elements) a group's
 * elements move as vectors. */
template <typename Tx, typename Tv, typename Tb, typename Ty>
__global__ void dropout_add_kernel(const Tx *__restrict__ x,
                                   const Tb *__restrict__ b,
                                   Ty *__restrict__ y, int64_t n, uint2 key,
                                   uint32_t off_lo, uint32_t thr, double scale,
                                   bool vec)
{
    const int64_t groups = (n + 3) / 4;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
         g < groups; g += (int64_t)gridDim.x * blockDim.x) {
        uint32_t words[4] = {0, 0, 0, 0}; /* p = 0: keep all, no draw */
        if (thr < (1u << 24)) {
            const uint4 r = curand_Philox4x32_10(
                make_uint4((uint32_t)g, (uint32_t)((uint64_t)g >> 32),
                           FG_NN_DROPOUT_TAG, off_lo),
                key);
            words[0] = r.x, words[1] = r.y, words[2] = r.z, words[3] = r.w;
        }
        Tx xs[4];
        Tb bs[4];
        Ty ys[4];
        if (vec) {
            ld4(b + 4 * g, bs);
            if (x)
                ld4(x + 4 * g, xs);
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int64_t e = 4 * g + k;
                if (e < n) {
                    bs[k] = b[e];
                    if (x)
                        xs[k] = x[e];
                }
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const Tv bv = Num<Tv>::st(Num<Tb>::ld(bs[k])); /* exact forward */
            /* __dmul_rn: never contracted with the add below into an FMA
             * (fp64 has no rounding between them), which the unfused
             * chain cannot do either */
            const Tv v = Num<Tv>::st_d(__dmul_rn(
                (double)Num<Tv>::ld(bv), (words[k] >> 8) < thr ? scale : 0.0));
            if (x)
                ys[k] = Num<Ty>::st(Num<Tx>::ld(xs[k]) +
                                    (typename Num<Tx>::A)Num<Tv>::ld(v));
            else
                ys[k] = (Ty)v;
        }
        if (vec) {
            st4(y + 4 * g, ys);
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (4 * g + k < n)
                    y[4 * g + k] = ys[k];
        }
    }
}

/* ---- embedding ---------------------------------------------------------- */

template <typename U>
fg_status emb_fwd_launch(const fg_tensor *w, const int64_t *didx, int64_t n,
                         fg_tensor *y)
{
    const int64_t C = w->shape[1];
    emb_fwd_kernel<U><<<fg_cuda_grid(n, 1), 128, 0, fg_cuda_stream()>>>(
        dptr<const U>(w), w->stride[0], w->stride[1], didx, n, C, dptr<U>(y));
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* dcsr: urow [nu], useg [nu + 1], sb [nseg + 1], pos [n] (device). */
template <typename T>
fg_status emb_bwd_launch(const fg_tensor *g, const int64_t *dcsr, int64_t nu,
                         int64_t nseg, void *part, fg_tensor *dw)
{
    typedef typename Num<T>::A A;
    const int64_t C = dw->shape[1];
    const int64_t *urow = dcsr, *useg = dcsr + nu, *sb = useg + nu + 1,
                  *pos = sb + nseg + 1;
    const int64_t tiles = (C + 127) / 128;
    const unsigned ty = (unsigned)(tiles < 65535 ? tiles : 65535);
    emb_bwd_part_kernel<T><<<dim3(fg_cuda_grid(nseg, 1), ty), 128, 0,
                             fg_cuda_stream()>>>(dptr<T>(g), sb, pos, nseg, C,
                                                 (A *)part);
    FG_CUDA_TRY_LAUNCH();
    emb_bwd_sum_kernel<T><<<dim3(fg_cuda_grid(nu, 1), ty), 128, 0,
                            fg_cuda_stream()>>>((const A *)part, urow, useg,
                                                nu, C, dptr<T>(dw));
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* ---- dropout ------------------------------------------------------------ */

template <typename T>
fg_status dropout_t(const fg_tensor *src, fg_tensor *dst, uint2 key,
                    uint32_t off_lo, uint32_t thr, double scale)
{
    const int64_t n = src->numel, groups = (n + 3) / 4;
    dropout_kernel<T><<<fg_cuda_grid(groups, 256), 256, 0, fg_cuda_stream()>>>(
        dptr<T>(src), dptr<T>(dst), n, key, off_lo, thr, scale);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename Tx, typename Tv>
fg_status dropout_add_t(const fg_tensor *x, const fg_tensor *b, fg_tensor *y,
                        uint2 key, uint32_t off_lo, uint32_t thr, double scale)
{
    const int64_t n = b->numel, groups = (n + 3) / 4;
    const dim3 grid = fg_cuda_grid(groups, 256);
    const size_t bs = fg_esize(b->dtype), ys = fg_esize(y->dtype);
    const bool vec = n % 4 == 0 &&
                     (uintptr_t)fg_tensor_base(b) % (4 * bs) == 0 &&
                     (uintptr_t)fg_tensor_base(y) % (4 * ys) == 0 &&
                     (!x || (uintptr_t)fg_tensor_base(x) % (4 * ys) == 0);
    if (x) /* forward: b is the branch (Tv), y the stream (Tx) */
        dropout_add_kernel<Tx, Tv, Tv, Tx><<<grid, 256, 0, fg_cuda_stream()>>>(
            dptr<const Tx>(x), dptr<const Tv>(b), dptr<Tx>(y), n, key, off_lo,
            thr, scale, vec);
    else /* backward: b is the gradient (Tx), y the branch's (Tv) */
        dropout_add_kernel<Tx, Tv, Tx, Tv><<<grid, 256, 0, fg_cuda_stream()>>>(
            nullptr, dptr<const Tx>(b), dptr<Tv>(y), n, key, off_lo, thr,
            scale, vec);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename T>
fg_status dropout_add_same(const fg_tensor *x, const fg_tensor *b,
                           fg_tensor *y, uint2 key, uint32_t off_lo,
                           uint32_t thr, double scale)
{
    return dropout_add_t<T, T>(x, b, y, key, off_lo, thr, scale);
}

} /* namespace */

/* ---- entry points --------------------------------------------------------- */

extern "C" fg_status fg_cuda_embedding_forward(const fg_tensor *weight,
                                               const int64_t *indices,
                                               int64_t n, fg_tensor *y)
{
    if (n == 0 || weight->shape[1] == 0)
        return FG_OK;
    const size_t ibytes = sizeof(int64_t) * (size_t)n;
    int64_t *didx = nullptr;
    FG_TRY(fg_cuda_mem_alloc(ibytes, (void **)&didx));
    fg_status s = fg_cuda_memcpy_h2d(didx, indices, ibytes);
    if (s == FG_OK) {
        switch (fg_esize(weight->dtype)) {
        case 8: s = emb_fwd_launch<uint64_t>(weight, didx, n, y); break;
        case 4: s = emb_fwd_launch<uint32_t>(weight, didx, n, y); break;
        default: s = emb_fwd_launch<uint16_t>(weight, didx, n, y); break;
        }
    }
    scratch_free(didx, ibytes);
    return s;
}

extern "C" fg_status fg_cuda_embedding_backward(const fg_tensor *g,
                                                const int64_t *indices,
                                                int64_t n, fg_tensor *dw)
{
    static const char fn[] = "embedding backward";
    if (dw->numel == 0)
        return FG_OK;
    FG_TRY(fg_cuda_memset_zero(fg_tensor_base(dw),
                               (size_t)dw->numel * fg_esize(dw->dtype)));
    if (n == 0)
        return FG_OK;
    if (dw->dtype != FG_FP64 && dw->dtype != FG_FP32 && dw->dtype != FG_FP16 &&
        dw->dtype != FG_BF16)
        return bad_dtype(fn, dw->dtype);
    const int64_t V = dw->shape[0], C = dw->shape[1];
    /* CSR by counting sort on the host: used rows (ascending), their
     * segments of at most kEmbSeg positions, and the positions of each row
     * in position order, packed in one buffer for a single copy. */
    int64_t *cnt = (int64_t *)calloc((size_t)V, sizeof(int64_t));
    if (!cnt)
        return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: host scratch", fn);
    for (int64_t i = 0; i < n; i++)
        cnt[indices[i]]++;
    int64_t nu = 0, nseg = 0;
    for (int64_t v = 0; v < V; v++)
        if (cnt[v]) {
            nu++;
            nseg += (cnt[v] + kEmbSeg - 1) / kEmbSeg;
        }
    const size_t cbytes = sizeof(int64_t) * (size_t)(2 * nu + nseg + 2 + n);
    int64_t *csr = (int64_t *)malloc(cbytes);
    if (!csr) {
        free(cnt);
        return fg_error(FG_ERR_OUT_OF_MEMORY, "%s: host scratch", fn);
    }
    int64_t *urow = csr, *useg = csr + nu, *sb = useg + nu + 1,
            *pos = sb + nseg + 1;
    int64_t u = 0, off = 0, sg = 0;
    for (int64_t v = 0; v < V; v++) {
        if (!cnt[v])
            continue;
        const int64_t c = cnt[v];
        urow[u] = v;
        useg[u++] = sg;
        for (int64_t k = 0; k < c; k += kEmbSeg)
            sb[sg++] = off + k;
        cnt[v] = off; /* from here on: the row's fill cursor */
        off += c;
    }
    useg[nu] = sg;
    sb[nseg] = off;
    for (int64_t i = 0; i < n; i++)
        pos[cnt[indices[i]]++] = i;
    free(cnt);

    /* Device scratch sized for the worst case (every position its own row),
     * not for this batch: a size that depends only on the shapes keeps the
     * caching allocator from seeing new sizes in later training steps. */
    const int64_t nu_max = V < n ? V : n, nseg_max = nu_max + n / kEmbSeg;
    const size_t wbytes =
        sizeof(int64_t) * (size_t)(2 * nu_max + nseg_max + 2 + n);
    const size_t pbytes = (size_t)nseg_max * (size_t)C *
                          (dw->dtype == FG_FP64 ? sizeof(double) : sizeof(float));
    int64_t *dcsr = nullptr;
    void *part = nullptr;
    fg_status s = fg_cuda_mem_alloc(wbytes, (void **)&dcsr);
    if (s == FG_OK)
        s = fg_cuda_mem_alloc(pbytes, &part);
    if (s == FG_OK)
        s = fg_cuda_memcpy_h2d(dcsr, csr, cbytes);
    free(csr); /* H2D has returned: the source may be reused */
    if (s == FG_OK) {
        switch (dw->dtype) {
        case FG_FP64: s = emb_bwd_launch<double>(g, dcsr, nu, nseg, part, dw); break;
        case FG_FP32: s = emb_bwd_launch<float>(g, dcsr, nu, nseg, part, dw); break;
        case FG_FP16: s = emb_bwd_launch<__half>(g, dcsr, nu, nseg, part, dw); break;
        default: s = emb_bwd_launch<__nv_bfloat16>(g, dcsr, nu, nseg, part, dw); break;
        }
    }
    scratch_free(part, pbytes);
    scratch_free(dcsr, wbytes);
    return s;
}

extern "C" fg_status fg_cuda_dropout(const fg_tensor *src, fg_tensor *dst,
                                     double p, uint64_t seed, uint64_t offset)
{
    if (src->numel == 0)
        return FG_OK;
    const uint2 key = make_uint2((uint32_t)seed, (uint32_t)(seed >> 32) ^
                                                     (uint32_t)(offset >> 32));
    const uint32_t thr = fg_dropout_threshold(p);
    const double scale = 1.0 / (1.0 - p);
    NN_BY_DTYPE(src->dtype, "fg_dropout", dropout_t, src, dst, key,
                (uint32_t)offset, thr, scale);
}

extern "C" fg_status fg_cuda_dropout_add(const fg_tensor *x,
                                         const fg_tensor *b, fg_tensor *y,
                                         double p, uint64_t seed,
                                         uint64_t offset)
{
    if (b->numel == 0)
        return FG_OK;
    const uint2 key = make_uint2((uint32_t)seed, (uint32_t)(seed >> 32) ^
                                                     (uint32_t)(offset >> 32));
    const uint32_t thr = fg_dropout_threshold(p), lo = (uint32_t)offset;
    const double scale = 1.0 / (1.0 - p);
    const fg_dtype xt = x ? x->dtype : b->dtype, vt = x ? b->dtype : y->dtype;
    if (vt == xt)
        NN_BY_DTYPE(xt, "fg_dropout_add", dropout_add_same, x, b, y, key,
                    lo, thr, scale);
    if (xt == FG_FP32 && vt == FG_BF16)
        return dropout_add_t<float, __nv_bfloat16>(x, b, y, key, lo, thr,
                                                   scale);
    if (xt == FG_FP32 && vt == FG_FP16)
        return dropout_add_t<float, __half>(x, b, y, key, lo, thr, scale);
    return bad_dtype("fg_dropout_add", vt);
}
