/* SPDX-License-Identifier: MIT */
/* kernels/ops/ops_layernorm.cu - layernorm forward and backward (entry points
 * in lib/ops/cuda_ops_nn.h): the launches; the kernels are in
 * layernorm_reg.cuh (rows in registers) and layernorm_general.cuh.
 *
 * Rows of up to ln_reg_max<A>() elements (8192; 4096 in fp64) live in
 * registers, ln_elems<A>() per thread, with 16-byte loads where alignment
 * allows: the forward reads x once; the backward reads x and g once,
 * writes dx and accumulates its rows' dweight / dbias in registers, one
 * partial row per block, which a second kernel sums in a fixed order
 * (deterministic, no atomics; the block count follows the visible SM
 * count and the kernel's occupancy, so bits are reproducible on one
 * device configuration and build).
 * Longer rows take the general kernels: three passes, then column sums in
 * kernels of their own.
 *
 * y (and so g) may be narrower than x: fp16/bf16 for fp32 x, fp32 for fp64
 * x (fg_layernorm_cast). Every kernel is one template for both cases and
 * only the store of y (load of g) differs, and every product that meets an
 * add is an explicit fma or rounded multiply, so the narrow y is bit for
 * bit the rounding of the same-dtype kernel's y.
 *
 * fg_dropout_add_layernorm's kernels are the register kernels with a
 * residual join (LnJoin): the forward first makes x + dropout(b) (stored,
 * then normalized from the registers), the backward ends with the
 * branch's gradient from the final dx; one pass each way instead of two. */
#include <atomic>

#include "layernorm_general.cuh"
#include "layernorm_reg.cuh"
#include "ops_nn_common.cuh"

namespace {

/* ---- host side ------------------------------------------------------------ */

/* s = the status of the launch just made (the caller still frees its
 * scratch). */
#define LN_LAUNCHED(s, what)                                                \
    do {                                                                    \
        const cudaError_t e_ = cudaGetLastError();                          \
        if (e_ != cudaSuccess)                                              \
            (s) = fg_cuda_status(e_, what, __FILE__, __LINE__);             \
    } while (0)

/* Shape of the register kernels for rows of C: threads per row (a power of
 * two, 32 .. LN_TPR_MAX, C <= tpr * e, e elements per thread) and rows
 * per block. */
struct LnShape {
    int tpr, rpb;
};

inline LnShape ln_shape(int64_t C, int e)
{
    int tpr = 32;
    while ((int64_t)tpr * e < C)
        tpr *= 2;
    return {tpr, tpr >= LN_BLOCK ? 1 : LN_BLOCK / tpr};
}

inline bool par_vec_ok(const void *p, int64_t s)
{
    return !p || s != 1 || aligned16(p);
}

template <typename T, typename To = T>
fg_status ln_fwd_t(const fg_tensor *x, const fg_tensor *w, const fg_tensor *b,
                   double eps, fg_tensor *y, fg_tensor *mean, fg_tensor *rstd)
{
    typedef typename Num<T>::A A;
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    const T *xp = dptr<T>(x), *wp = dptr<T>(w), *bp = dptr<T>(b);
    const int64_t ws = w ? w->stride[0] : 0, bs = b ? b->stride[0] : 0;
    To *yp = dptr<To>(y);
    A *mp = dptr<A>(mean), *rp = dptr<A>(rstd);
    cudaStream_t st = fg_cuda_stream();
    if (C > ln_reg_max<A>()) {
        RowLaunch L;
        FG_TRY(row_launch(R, C, "fg_layernorm", &L));
        ln_fwd_rows<T, To><<<L.grid, L.block, 0, st>>>(xp, wp, ws, bp, bs, R,
                                                       C, (A)eps, yp, mp, rp);
        FG_CUDA_TRY_LAUNCH();
        return FG_OK;
    }
    const LnShape S = ln_shape(C, ln_elems<A>());
    const int64_t grid = (R + S.rpb - 1) / S.rpb;
    if (grid > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "fg_layernorm: too many rows (%lld)", (long long)R);
    const dim3 block((unsigned)S.tpr, (unsigned)S.rpb);
    constexpr int VW = vec_width<T>();
    if (C % VW == 0 && aligned16(xp) && aligned16(yp) && par_vec_ok(wp, ws) &&
        par_vec_ok(bp, bs))
        ln_fwd_reg<T, To, VW><<<(unsigned)grid, block, 0, st>>>(
            xp, wp, ws, bp, bs, R, C, (A)eps, yp, mp, rp, LnJoin<T, To>{});
    else
        ln_fwd_reg<T, To, 1><<<(unsigned)grid, block, 0, st>>>(
            xp, wp, ws, bp, bs, R, C, (A)eps, yp, mp, rp, LnJoin<T, To>{});
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

/* Blocks of the fused backward: one full wave of resident blocks (no
 * tail), fewer when there are fewer row groups. The wave is cached per
 * kernel (cache), keyed by device, block size and shared memory: the
 * occupancy query costs more host time than the launch. */
template <typename K>
fg_status ln_bwd_grid(K kernel, int threads, size_t smem, int64_t groups,
                      std::atomic<unsigned long long> &cache, int *grid)
{
    int dev = 0;
    FG_CUDA_TRY(cudaGetDevice(&dev));
    /* dev < 256, threads < 2^16, smem < 2^24: 48 bits, the wave in 16 */
    const unsigned long long key = ((unsigned long long)dev << 40) |
                                   ((unsigned long long)threads << 24) |
                                   (unsigned long long)smem;
    unsigned long long c = cache.load(std::memory_order_relaxed);
    if (!c || (c >> 16) != key) {
        int sms = 0, per_sm = 0;
        FG_CUDA_TRY(cudaDeviceGetAttribute(
            &sms, cudaDevAttrMultiProcessorCount, dev));
        FG_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, kernel, threads, smem));
        long long wave = (long long)sms * (per_sm > 0 ? per_sm : 1);
        c = (key << 16) | (unsigned long long)(wave < 0xffff ? wave : 0xffff);
        if (dev < 256)
            cache.store(c, std::memory_order_relaxed);
    }
    const int64_t wave = (int64_t)(c & 0xffff);
    *grid = (int)(wave < groups ? wave : groups);
    return FG_OK;
}

/* ln_bwd_reg's dynamic shared memory: the row groups' combination (2 C
 * values when a block has several rows) and every thread's running sums
 * (2 e each, e its elements), when dw or db is wanted. */
inline size_t ln_bwd_smem(size_t asize, const LnShape &S, int64_t C, int e,
                          bool cols)
{
    if (!cols)
        return 0;
    const size_t comb = S.rpb > 1 ? 2 * (size_t)C : 0;
    return asize * (comb + 2 * (size_t)e * (size_t)(S.tpr * S.rpb));
}

/* Lets kernel take smem bytes of dynamic shared memory (over 48 KB with
 * the static sh[64] needs the opt-in: a 512-thread row's sums take 48 KB
 * with three vectors a thread, 64 KB with four). */
template <typename K>
fg_status ln_bwd_smem_allow(K kernel, size_t smem)
{
    if (smem + 64 * sizeof(double) <= 48 * 1024)
        return FG_OK;
    FG_CUDA_TRY(cudaFuncSetAttribute(kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
    return FG_OK;
}

/* Runs fill(pw, pb), the kernel writing n partial rows [n, C] of dw / db
 * into scratch (NULL, NULL when neither is wanted), then sums them into
 * dw / db (added to them with acc); frees the scratch. */
template <typename T, typename F>
fg_status ln_with_partials(int64_t n, int64_t C, fg_tensor *dw, fg_tensor *db,
                           bool acc, F fill)
{
    typedef typename Num<T>::A A;
    const bool cols = dw || db;
    const size_t bytes = cols ? sizeof(A) * (size_t)n * (size_t)C : 0;
    A *pw = nullptr, *pb = nullptr;
    fg_status s = FG_OK;
    if (cols) {
        s = fg_cuda_mem_alloc(bytes, (void **)&pw);
        if (s == FG_OK)
            s = fg_cuda_mem_alloc(bytes, (void **)&pb);
    }
    if (s == FG_OK)
        s = fill(pw, pb);
    if (s == FG_OK && cols) { /* (C + 31) / 32 < 2^31: the callers checked */
        ln_partials_sum<T, A>
            <<<(unsigned)((C + 31) / 32), dim3(32, LN_SUM_Y), 0,
               fg_cuda_stream()>>>(pw, pb, n, C, dptr<T>(dw), dptr<T>(db),
                                   acc);
        LN_LAUNCHED(s, "ln_partials_sum launch");
    }
    scratch_free(pw, bytes);
    scratch_free(pb, bytes);
    return s;
}

template <typename T, typename Tg, int V, bool JOIN, int NVX>
fg_status ln_bwd_reg_run(const T *xp, const T *wp, int64_t ws,
                         const typename Num<T>::A *mp,
                         const typename Num<T>::A *rp, const Tg *gp, int64_t R,
                         int64_t C, T *dp, bool dx_acc, fg_tensor *dw,
                         fg_tensor *db, bool cols_acc, LnJoin<T, Tg> J)
{
    typedef typename Num<T>::A A;
    const LnShape S = ln_shape(C, ln_elems<A>());
    const int e = NVX ? NVX * V : ln_elems<A>();
    const size_t smem = ln_bwd_smem(sizeof(A), S, C, e, dw || db);
    auto kernel = ln_bwd_reg<T, Tg, V, JOIN, NVX>;
    auto same = ln_bwd_reg<T, T, V, false, NVX>;
    FG_TRY(ln_bwd_smem_allow(kernel, smem));
    FG_TRY(ln_bwd_smem_allow(same, smem));
    /* The wave of the same-dtype kernel, so that a narrow g gives the same
     * partial rows (and so the same dw / db bits) as that g widened. */
    static std::atomic<unsigned long long> wave_cache{0};
    int grid = 0;
    FG_TRY(ln_bwd_grid(same, S.tpr * S.rpb, smem, (R + S.rpb - 1) / S.rpb,
                       wave_cache, &grid));
    return ln_with_partials<T>(grid, C, dw, db, cols_acc, [&](A *pw, A *pb) {
        fg_status s = FG_OK;
        kernel<<<grid, dim3((unsigned)S.tpr, (unsigned)S.rpb), smem,
                 fg_cuda_stream()>>>(xp, wp, ws, mp, rp, gp, R, C, dp, dx_acc, pw,
                                     pb, J);
        LN_LAUNCHED(s, "ln_bwd_reg launch");
        return s;
    });
}

/* The register backward, with three vectors a thread where four are the
 * default and three cover the row (C = 384, 768, 1536, 3072 in fp32):
 * the same threads own the same elements and do the same arithmetic in
 * the same order, so the bits do not change. */
template <typename T, typename Tg, int V, bool JOIN = false>
fg_status ln_bwd_reg_launch(const T *xp, const T *wp, int64_t ws,
                            const typename Num<T>::A *mp,
                            const typename Num<T>::A *rp, const Tg *gp,
                            int64_t R, int64_t C, T *dp, bool dx_acc,
                            fg_tensor *dw, fg_tensor *db, bool cols_acc,
                            LnJoin<T, Tg> J = LnJoin<T, Tg>{})
{
    typedef typename Num<T>::A A;
    if constexpr (ln_elems<A>() / V == 4) {
        const LnShape S = ln_shape(C, ln_elems<A>());
        if ((int64_t)S.tpr * V * 3 >= C)
            return ln_bwd_reg_run<T, Tg, V, JOIN, 3>(
                xp, wp, ws, mp, rp, gp, R, C, dp, dx_acc, dw, db, cols_acc, J);
    }
    return ln_bwd_reg_run<T, Tg, V, JOIN, 0>(xp, wp, ws, mp, rp, gp, R, C, dp,
                                             dx_acc, dw, db, cols_acc, J);
}

/* The general backward: dx by rows, dw / db by column chunks. */
template <typename T, typename Tg>
fg_status ln_bwd_general(const T *xp, const T *wp, int64_t ws,
                         const typename Num<T>::A *mp,
                         const typename Num<T>::A *rp, const Tg *gp, int64_t R,
                         int64_t C, T *dp, bool dx_acc, fg_tensor *dw,
                         fg_tensor *db, bool cols_acc)
{
    typedef typename Num<T>::A A;
    cudaStream_t st = fg_cuda_stream();
    if (dp) {
        RowLaunch L;
        FG_TRY(row_launch(R, C, "layernorm backward", &L));
        ln_bwd_dx_rows<T, Tg><<<L.grid, L.block, 0, st>>>(xp, wp, ws, mp, rp,
                                                          gp, R, C, dp, dx_acc);
        FG_CUDA_TRY_LAUNCH();
    }
    if (!dw && !db)
        return FG_OK;
    const int64_t gx = (C + 31) / 32;
    if (gx > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "layernorm backward: too many columns (%lld)",
                        (long long)C);
    /* Chunks of >= 128 rows, at most 1024 of them (gridDim.y <= 65535). */
    int64_t rpc = 128;
    if (R > rpc * 1024)
        rpc = (R + 1023) / 1024;
    const int64_t nchunks = (R + rpc - 1) / rpc;
    return ln_with_partials<T>(nchunks, C, dw, db, cols_acc,
                               [&](A *pw, A *pb) {
        fg_status s = FG_OK;
        ln_bwd_cols<T, Tg><<<dim3((unsigned)gx, (unsigned)nchunks),
                             dim3(32, LN_COL_Y), 0, st>>>(xp, mp, rp, gp, R, C,
                                                          rpc, pw, pb);
        LN_LAUNCHED(s, "ln_bwd_cols launch");
        return s;
    });
}

template <typename T, typename Tg = T>
fg_status ln_bwd_t(const fg_tensor *x, const fg_tensor *w,
                   const fg_tensor *mean, const fg_tensor *rstd,
                   const fg_tensor *g, fg_tensor *dx, bool dx_acc,
                   fg_tensor *dw, fg_tensor *db, bool cols_acc)
{
    typedef typename Num<T>::A A;
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    const T *xp = dptr<T>(x), *wp = dptr<T>(w);
    const Tg *gp = dptr<Tg>(g);
    const int64_t ws = w ? w->stride[0] : 0;
    T *dp = dptr<T>(dx);
    const A *mp = dptr<A>(mean), *rp = dptr<A>(rstd);
    if (!dp && !dw && !db)
        return FG_OK;
    if (C > ln_reg_max<A>())
        return ln_bwd_general<T, Tg>(xp, wp, ws, mp, rp, gp, R, C, dp, dx_acc,
                                     dw, db, cols_acc);
    constexpr int VW = vec_width<T>();
    if (C % VW == 0 && aligned16(xp) && aligned16(gp) &&
        (!dp || aligned16(dp)) && par_vec_ok(wp, ws))
        return ln_bwd_reg_launch<T, Tg, VW>(xp, wp, ws, mp, rp, gp, R, C, dp,
                                            dx_acc, dw, db, cols_acc);
    return ln_bwd_reg_launch<T, Tg, 1>(xp, wp, ws, mp, rp, gp, R, C, dp,
                                       dx_acc, dw, db, cols_acc);
}

/* ---- fg_dropout_add_layernorm: the join kernels ---------------------------- */

/* Where the join kernels apply: an fp32 stream, rows of C % 4 == 0 within
 * the register kernels, 16-byte aligned operands (vectors of 4 elements,
 * one Philox group each). Elsewhere the caller runs the two ops' kernels. */
inline bool join_ok(int64_t R, int64_t C, const void *const *ptrs, int n)
{
    if (R <= 0 || C <= 0 || C % 4 != 0 || C > ln_reg_max<float>())
        return false;
    for (int i = 0; i < n; i++)
        if (!aligned16(ptrs[i]))
            return false;
    return true;
}

template <typename Tv>
LnJoin<float, Tv> make_join(double p, uint64_t seed, uint64_t offset)
{
    LnJoin<float, Tv> J{};
    J.key = make_uint2((uint32_t)seed,
                       (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32));
    J.off_lo = (uint32_t)offset;
    J.thr = fg_dropout_threshold(p);
    J.scale = 1.0 / (1.0 - p);
    return J;
}

template <typename Tv>
fg_status join_fwd_t(const fg_tensor *x, const fg_tensor *b, double p,
                     uint64_t seed, uint64_t offset, const fg_tensor *w,
                     const fg_tensor *bias, double eps, fg_tensor *y,
                     fg_tensor *h, fg_tensor *mean, fg_tensor *rstd)
{
    const int64_t C = x->shape[x->nd - 1], R = x->numel / C;
    const LnShape S = ln_shape(C, ln_elems<float>());
    const int64_t grid = (R + S.rpb - 1) / S.rpb;
    if (grid > 0x7fffffff)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "fg_dropout_add_layernorm: too many rows (%lld)",
                        (long long)R);
    LnJoin<float, Tv> J = make_join<Tv>(p, seed, offset);
    J.b = dptr<Tv>(b);
    J.xo = dptr<float>(y);
    static_assert(FG_ONES_PAD == 8, "ln_fwd_reg writes 8 padding elements");
    J.ldy = h->ones_col ? C + FG_ONES_PAD : C; /* dal_new_h's layout */
    const int64_t ws = w ? w->stride[0] : 0, bs = bias ? bias->stride[0] : 0;
    ln_fwd_reg<float, Tv, 4, true>
        <<<(unsigned)grid, dim3((unsigned)S.tpr, (unsigned)S.rpb), 0,
           fg_cuda_stream()>>>(dptr<float>(x), dptr<float>(w), ws,
                               dptr<float>(bias), bs, R, C, (float)eps,
                               dptr<Tv>(h), dptr<float>(mean),
                               dptr<float>(rstd), J);
    FG_CUDA_TRY_LAUNCH();
    return FG_OK;
}

template <typename Tv>
fg_status join_bwd_t(const fg_tensor *y, const fg_tensor *w,
                     const fg_tensor *mean, const fg_tensor *rstd,
                     const fg_tensor *gh, fg_tensor *dx, bool dx_acc,
                     fg_tensor *db, double p, uint64_t seed, uint64_t offset,
                     fg_tensor *dw, fg_tensor *dbias, bool cols_acc)
{
    const int64_t C = y->shape[y->nd - 1], R = y->numel / C;
    LnJoin<float, Tv> J = make_join<Tv>(p, seed, offset);
    J.db = dptr<Tv>(db);
    return ln_bwd_reg_launch<float, Tv, 4, true>(
        dptr<float>(y), dptr<float>(w), w ? w->stride[0] : 0,
        dptr<float>(mean), dptr<float>(rstd), dptr<Tv>(gh), R, C,
        dptr<float>(dx), dx_acc, dw, dbias, cols_acc, J);
}

/* Calls F<T, Ty>(args...) for x's storage type T and y's Ty: equal, or
 * fp16/bf16 for fp32, or fp32 for fp64. */
#define LN_BY_DTYPES(xdt, ydt, fn, F, ...)                                  \
    do {                                                                    \
        if ((xdt) == (ydt)) {                                               \
            NN_BY_DTYPE(xdt, fn, F, __VA_ARGS__);                           \
        }                                                                   \
        if ((xdt) == FG_FP32 && (ydt) == FG_BF16)                           \
            return F<float, __nv_bfloat16>(__VA_ARGS__);                    \
        if ((xdt) == FG_FP32 && (ydt) == FG_FP16)                           \
            return F<float, __half>(__VA_ARGS__);                           \
        if ((xdt) == FG_FP64 && (ydt) == FG_FP32)                           \
            return F<double, float>(__VA_ARGS__);                           \
        return fg_error(FG_ERR_UNSUPPORTED,                                 \
                        "%s: %s output of %s input is not supported", fn,   \
                        fg_dtype_name(ydt), fg_dtype_name(xdt));            \
    } while (0)

} /* namespace */

/* ---- entry points --------------------------------------------------------- */

extern "C" fg_status fg_cuda_layernorm_forward(const fg_tensor *x,
                                               const fg_tensor *weight,
                                               const fg_tensor *bias,
                                               double eps, fg_tensor *y,
                                               fg_tensor *mean, fg_tensor *rstd)
{
    if (x->numel == 0)
        return FG_OK;
    LN_BY_DTYPES(x->dtype, y->dtype, "fg_layernorm", ln_fwd_t, x, weight,
                 bias, eps, y, mean, rstd);
}

extern "C" fg_status fg_cuda_layernorm_backward(
    const fg_tensor *x, const fg_tensor *weight, const fg_tensor *mean,
    const fg_tensor *rstd, const fg_tensor *g, fg_tensor *dx, int acc,
    fg_tensor *dw, fg_tensor *db)
{
    const int64_t C = x->shape[x->nd - 1];
    const bool cols_acc = (acc & FG_LN_ACC_COLS) != 0;
    if (C == 0 || (x->numel == 0 && cols_acc)) /* nothing to add */
        return FG_OK;
    if (x->numel == 0) { /* no rows: the column sums are 0 */
        const size_t bytes = (size_t)C * fg_esize(x->dtype);
        if (dw)
            FG_TRY(fg_cuda_memset_zero(fg_tensor_base(dw), bytes));
        if (db)
            FG_TRY(fg_cuda_memset_zero(fg_tensor_base(db), bytes));
        return FG_OK;
    }
    LN_BY_DTYPES(x->dtype, g->dtype, "layernorm backward", ln_bwd_t, x,
                 weight, mean, rstd, g, dx, dx && (acc & FG_LN_ACC_DX), dw, db,
                 cols_acc);
}

extern "C" fg_status fg_cuda_dropout_add_layernorm_forward(
    const fg_tensor *x, const fg_tensor *b, double p, uint64_t seed,
    uint64_t offset, const fg_tensor *weight, const fg_tensor *bias,
    double eps, fg_tensor *y, fg_tensor *h, fg_tensor *mean, fg_tensor *rstd,
    int *done)
{
    *done = 0;
    const int64_t C = x->nd ? x->shape[x->nd - 1] : 0;
    const void *ptrs[4] = {fg_tensor_base(x), fg_tensor_base(b),
                           fg_tensor_base(y), fg_tensor_base(h)};
    if (x->dtype != FG_FP32 || b->dtype != h->dtype ||
        !join_ok(C ? x->numel / C : 0, C, ptrs, 4) ||
        !par_vec_ok(weight ? fg_tensor_base(weight) : nullptr,
                    weight ? weight->stride[0] : 0) ||
        !par_vec_ok(bias ? fg_tensor_base(bias) : nullptr,
                    bias ? bias->stride[0] : 0))
        return FG_OK;
    fg_status s = FG_OK;
    if (b->dtype == FG_BF16)
        s = join_fwd_t<__nv_bfloat16>(x, b, p, seed, offset, weight, bias,
                                      eps, y, h, mean, rstd);
    else if (b->dtype == FG_FP16)
        s = join_fwd_t<__half>(x, b, p, seed, offset, weight, bias, eps, y, h,
                               mean, rstd);
    else
        return FG_OK;
    if (s == FG_OK)
        *done = 1;
    return s;
}

extern "C" fg_status fg_cuda_dropout_add_layernorm_backward(
    const fg_tensor *y, const fg_tensor *weight, const fg_tensor *mean,
    const fg_tensor *rstd, const fg_tensor *gh, fg_tensor *dx, int acc,
    fg_tensor *db, double p, uint64_t seed, uint64_t offset, fg_tensor *dw,
    fg_tensor *dbias, int *done)
{
    const bool dx_acc = (acc & FG_LN_ACC_DX) != 0,
               cols_acc = (acc & FG_LN_ACC_COLS) != 0;
    *done = 0;
    const int64_t C = y->nd ? y->shape[y->nd - 1] : 0;
    const void *ptrs[4] = {fg_tensor_base(y), fg_tensor_base(gh),
                           fg_tensor_base(dx), fg_tensor_base(db)};
    if (y->dtype != FG_FP32 || gh->dtype != db->dtype ||
        !join_ok(C ? y->numel / C : 0, C, ptrs, 4) ||
        !par_vec_ok(weight ? fg_tensor_base(weight) : nullptr,
                    weight ? weight->stride[0] : 0))
        return FG_OK;
    fg_status s = FG_OK;
    if (gh->dtype == FG_BF16)
        s = join_bwd_t<__nv_bfloat16>(y, weight, mean, rstd, gh, dx, dx_acc,
                                      db, p, seed, offset, dw, dbias,
                                      cols_acc);
    else if (gh->dtype == FG_FP16)
        s = join_bwd_t<__half>(y, weight, mean, rstd, gh, dx, dx_acc, db, p,
                               seed, offset, dw, dbias, cols_acc);
    else
        return FG_OK;
    if (s == FG_OK)
        *done = 1;
    return s;
}
