/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_bias.c - the attention bias and its gradient on the CUDA
 * kernels (general, for fp16/bf16 on Hopper the sm90 wgmma kernels, and
 * the sm80 mma.sync kernels through FG_ATTN_KERNEL=mma)
 * against the CPU fp64 oracle (itself checked against the
 * naive reference in test_attention_bias): every broadcast pattern, fp64,
 * fp32, fp16 and bf16 operands, fp32 or operand-dtype bias and dbias,
 * strided bias layouts, with the variants (causal, window, ALiBi, softcap,
 * dropout, GQA, block-sparse, BHSD), a bias the wgmma forward reads by
 * TMA and the same without; the three ways dbias is produced
 * (direct stores, atomics into dbias or into a scratch, the deterministic
 * pass), a bitwise rerun with deterministic = 1, and a -inf row. Exits 77
 * without a GPU.
 *
 * Inputs and bias are rounded to their dtypes; the oracle runs in fp64 on
 * the rounded values. Errors are max-abs relative to max(max |ref|, 0.1):
 * fp64 1e-12 (dbias 1e-10: atomics sum in another order; fp32 bias/dbias
 * 1e-4: the oracle's fp32 dbias sums in fp32, and a row's dS sums to 0, so
 * a wholly broadcast dbias is all cancellation), fp32 2e-5 (dbias 1e-4: broadcast sums of up to B*H*Nq fp32
 * terms), fp16 2e-3 and bf16 1.6e-2 (the general kernels compute in fp32
 * and round each output once: a half-ulp is 4.9e-4 and 3.9e-3; the
 * tolerance is 4x that; the tensor-core route gets 4x more, see g_fast).
 * m and l (fp32 for fp16/bf16) 1e-4. */
#include <check.h>
#include <cuda_runtime.h>

#include "bias_util.h"
#include "ref_dropout.h"
#include "flashgrad/cuda.h"

#define CK_CUDA(call)                                                       \
    do {                                                                    \
        cudaError_t e_ = (call);                                            \
        ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call,                   \
                      cudaGetErrorString(e_));                              \
    } while (0)

typedef struct bgcase {
    int64_t B, Nq, Nk, H, Hk, d;
    int causal, bhsd, window, softcap, alibi, sparse;
    double p;
    int bcast, layout, dlayout;
    int bias_f32, dbias_f32; /* 1: fp32 bias / dbias, 0: operands' dtype */
    int deterministic;
    int minus_inf_row;       /* bias row (0, 0, 2) all -inf */
} bgcase;

/* One run's results, as doubles (BSHD / [B, H, Nq] / stored dbias). */
typedef struct bout {
    double *t[4]; /* O, dQ, dK, dV */
    double *m, *l, *db;
    void *db_raw; /* dbias bytes as written (bitwise comparisons) */
    size_t db_bytes;
    int pad_ok;
} bout;

static void bout_free(bout *o)
{
    for (int i = 0; i < 4; i++)
        free(o->t[i]);
    free(o->m); free(o->l); free(o->db); free(o->db_raw);
}

static fg_attn_tensor lay(const bgcase *c, fg_dtype dt, void *p, int64_t S,
                          int64_t Hh)
{
    return c->bhsd ? fg_attn_bhsd(p, dt, S, Hh, c->d)
                   : fg_attn_bshd(p, dt, S, Hh, c->d);
}

/* Inputs, block map and slopes of a case (host; freed by the caller). */
typedef struct binputs {
    double *in[4];        /* q, k, v, dO: BSHD, rounded to the dtype */
    float slopes[64];
    uint8_t *map;
    int32_t *storage;     /* host block mask (CPU run) */
    fg_attn_block_mask bm;
    fgt_bias bias;        /* in the case's dtype and layout */
} binputs;

static void params_of(const bgcase *c, fg_attn_params *p)
{
    fg_attn_params_init(p, c->B, c->Nq, c->Nk, c->H, c->Hk, c->d);
    p->causal = c->causal;
    p->dropout_p = c->p;
    p->seed = 99;
    p->offset = 7;
    if (c->window) {
        p->window_left = 17;
        p->window_right = 9;
    }
    p->softcap = c->softcap ? 3.0 : 0;
    p->deterministic = c->deterministic;
}

/* Copies a host buffer of n bytes to the device. */
static void *to_dev(const void *host, size_t n)
{
    void *d;
    CK_CUDA(cudaMalloc(&d, n));
    CK_CUDA(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice));
    return d;
}

/* Runs forward + backward on device dev (CPU: fp64 operands, dense fp64
 * bias with the same values; CUDA: dtype dt, the case's bias buffer). */
/* o_bwd (CPU runs only, BSHD doubles or NULL): the O the backward reads
 * instead of the forward's own (r->t[0] stays the forward's O). */
static void run_on(const bgcase *c, fg_dtype dt, fg_device dev,
                   const binputs *x, const double *o_bwd, bout *r)
{
    memset(r, 0, sizeof *r);
    const int gpu = dev == FG_DEVICE_CUDA;
    const fg_dtype odt = gpu ? dt : FG_FP64;
    /* t: 0 q, 1 k, 2 v, 3 dO, 4 O, 5 dQ, 6 dK, 7 dV; kl: K-like shape */
    static const int kl[8] = {0, 1, 1, 0, 0, 0, 1, 1};
    const int64_t S[2] = {c->Nq, c->Nk}, Hh[2] = {c->H, c->Hk};
    const size_t es = fg_dtype_size(odt);
    void *buf[8];
    fg_attn_tensor t[8];
    for (int i = 0; i < 8; i++) {
        const int sh = kl[i];
        const size_t n = (size_t)(c->B * S[sh] * Hh[sh] * c->d);
        void *host = malloc(n * es);
        memset(host, 0xff, n * es);
        t[i] = lay(c, odt, host, S[sh], Hh[sh]);
        if (i < 4)
            for (int64_t b = 0; b < c->B; b++)
                for (int64_t s2 = 0; s2 < S[sh]; s2++)
                    for (int64_t h = 0; h < Hh[sh]; h++)
                        for (int64_t e = 0; e < c->d; e++)
                            fgt_store(odt, host, b * t[i].stride_b + s2 * t[i].stride_s +
                                                     h * t[i].stride_h + e,
                                      x->in[i][((b * S[sh] + s2) * Hh[sh] + h) * c->d + e]);
        buf[i] = gpu ? to_dev(host, n * es) : host;
        if (gpu)
            free(host);
        t[i].data = buf[i];
    }
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    const fg_dtype sd = odt == FG_FP64 ? FG_FP64 : FG_FP32;
    const size_t ss = fg_dtype_size(sd);
    void *hm = malloc(ns * ss), *hl = malloc(ns * ss);
    memset(hm, 0xff, ns * ss);
    memset(hl, 0xff, ns * ss);
    void *m = gpu ? to_dev(hm, ns * ss) : hm, *l = gpu ? to_dev(hl, ns * ss) : hl;
    fg_attn_stats st = {m, l, sd};

    fgt_bias bias, dbias;
    if (gpu) {
        bias = x->bias;
    } else { /* the same values, fp64, dense */
        fgt_bias_init(&bias, c->B, c->H, c->Nq, c->Nk, c->bcast, FG_FP64, FGT_BL_DENSE);
        for (size_t e = 0; e < fgt_bias_count(&bias); e++)
            ((double *)bias.host)[fgt_bias_off(&bias, e)] = x->bias.vals[e];
    }
    fgt_bias_init(&dbias, c->B, c->H, c->Nq, c->Nk, c->bcast,
                  gpu ? (c->dbias_f32 ? FG_FP32 : dt) : FG_FP64,
                  gpu ? c->dlayout : FGT_BL_DENSE);
    fg_attn_bias bd = bias.desc, dd = dbias.desc;
    const size_t bbytes = bias.n * fg_dtype_size(bias.desc.dtype);
    const size_t dbytes = dbias.n * fg_dtype_size(dbias.desc.dtype);
    if (gpu) {
        bd.data = to_dev(bias.host, bbytes);
        dd.data = to_dev(dbias.host, dbytes); /* 0xff poison, padding too */
    }
    fg_attn_params p;
    params_of(c, &p);
    p.device = dev;
    p.bias = &bd;
    p.dbias = &dd;
    float *slopes_dev = NULL;
    int32_t *bm_dev = NULL;
    fg_attn_block_mask bm = x->bm;
    if (c->alibi) {
        p.alibi_slopes = x->slopes;
        p.alibi_stride_b = c->H;
        if (gpu) {
            slopes_dev = to_dev(x->slopes, sizeof(float) * (size_t)(c->B * c->H));
            p.alibi_slopes = slopes_dev;
        }
    }
    if (c->sparse) {
        const int64_t nqb = (c->Nq + 127) / 128, nkb = (c->Nk + 127) / 128;
        const size_t nst = (size_t)fg_attn_block_mask_storage(1, 1, nqb, nkb);
        if (gpu) {
            bm_dev = to_dev(x->storage, nst * sizeof(int32_t));
            /* same carve, device base */
            const ptrdiff_t o1 = x->bm.kv_index - x->storage, o2 = x->bm.q_count - x->storage,
                            o3 = x->bm.q_index - x->storage;
            bm.kv_count = bm_dev;
            bm.kv_index = bm_dev + o1;
            bm.q_count = bm_dev + o2;
            bm.q_index = bm_dev + o3;
        }
        p.block_mask = &bm;
    }
    ck_assert_msg(fg_attention_forward(&p, &t[0], &t[1], &t[2], &t[4], &st) == FG_OK,
                  "fwd: %s", fg_last_error());
    double *o_fwd = NULL;
    if (o_bwd && !gpu) { /* keep the forward's O, hand the backward o_bwd */
        const size_t n = (size_t)(c->B * c->Nq * c->H * c->d);
        o_fwd = malloc(n * sizeof(double));
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t s2 = 0; s2 < c->Nq; s2++)
                for (int64_t h = 0; h < c->H; h++)
                    for (int64_t e = 0; e < c->d; e++) {
                        const size_t ix = (size_t)(((b * c->Nq + s2) * c->H + h) * c->d + e);
                        double *o = (double *)buf[4] + b * t[4].stride_b +
                                    s2 * t[4].stride_s + h * t[4].stride_h + e;
                        o_fwd[ix] = *o;
                        *o = o_bwd[ix];
                    }
    }
    ck_assert_msg(fg_attention_backward(&p, &t[0], &t[1], &t[2], &t[4], &t[3], &st,
                                        &t[5], &t[6], &t[7]) == FG_OK,
                  "bwd: %s", fg_last_error());
    if (gpu) {
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaMemcpy(dbias.host, dd.data, dbytes, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(hm, m, ns * ss, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(hl, l, ns * ss, cudaMemcpyDeviceToHost));
    }
    /* Outputs back to BSHD doubles. */
    for (int i = 4; i < 8; i++) {
        const int sh = kl[i];
        const size_t n = (size_t)(c->B * S[sh] * Hh[sh] * c->d);
        void *host = buf[i];
        if (gpu) {
            host = malloc(n * es);
            CK_CUDA(cudaMemcpy(host, buf[i], n * es, cudaMemcpyDeviceToHost));
        }
        fg_attn_tensor tt = lay(c, odt, host, S[sh], Hh[sh]);
        double *out = malloc(n * sizeof(double));
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t s2 = 0; s2 < S[sh]; s2++)
                for (int64_t h = 0; h < Hh[sh]; h++)
                    for (int64_t e = 0; e < c->d; e++)
                        out[((b * S[sh] + s2) * Hh[sh] + h) * c->d + e] =
                            fgt_load(odt, host, b * tt.stride_b + s2 * tt.stride_s +
                                                    h * tt.stride_h + e);
        r->t[i - 4] = out;
        if (i == 4 && o_fwd) {
            free(out);
            r->t[0] = o_fwd;
        }
        if (gpu)
            free(host);
    }
    r->m = malloc(ns * 8);
    r->l = malloc(ns * 8);
    for (size_t i = 0; i < ns; i++) {
        r->m[i] = fgt_load(sd, hm, (int64_t)i);
        r->l[i] = fgt_load(sd, hl, (int64_t)i);
    }
    r->db = fgt_bias_read(&dbias);
    r->pad_ok = fgt_bias_padding_intact(&dbias);
    r->db_bytes = dbytes;
    r->db_raw = malloc(dbytes);
    memcpy(r->db_raw, dbias.host, dbytes);
    for (int i = 0; i < 8; i++) {
        if (gpu)
            CK_CUDA(cudaFree(buf[i]));
        else
            free(buf[i]);
    }
    if (gpu) {
        CK_CUDA(cudaFree(m));
        CK_CUDA(cudaFree(l));
        CK_CUDA(cudaFree(bd.data));
        CK_CUDA(cudaFree(dd.data));
        if (slopes_dev)
            CK_CUDA(cudaFree(slopes_dev));
        if (bm_dev)
            CK_CUDA(cudaFree(bm_dev));
    } else {
        fgt_bias_free(&bias);
    }
    free(hm);
    free(hl);
    fgt_bias_free(&dbias);
}

static void inputs_make(const bgcase *c, fg_dtype dt, uint64_t salt, binputs *x)
{
    memset(x, 0, sizeof *x);
    fgt_rng rng = fgt_rng_for(salt);
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t n[4] = {nq, nk, nk, nq};
    for (int i = 0; i < 4; i++) {
        x->in[i] = malloc(n[i] * 8);
        fgt_fill(x->in[i], n[i], &rng, 1.0);
        for (size_t e = 0; e < n[i]; e++)
            x->in[i][e] = fgt_round_to(dt, x->in[i][e]);
    }
    for (int i = 0; i < 64; i++)
        x->slopes[i] = (float)(0.05 + 0.4 * fabs(fgt_uniform(&rng)));
    if (c->sparse) {
        const int64_t nqb = (c->Nq + 127) / 128, nkb = (c->Nk + 127) / 128;
        x->map = malloc((size_t)(nqb * nkb));
        for (int64_t i = 0; i < nqb * nkb; i++)
            x->map[i] = fgt_uniform(&rng) < 0.4;
        x->storage = malloc(sizeof(int32_t) *
                            (size_t)fg_attn_block_mask_storage(1, 1, nqb, nkb));
        ck_assert(fg_attn_block_mask_build(&x->bm, x->map, 1, 1, nqb, nkb,
                                           x->storage, FG_DEVICE_CPU) == FG_OK);
    }
    fgt_bias_init(&x->bias, c->B, c->H, c->Nq, c->Nk, c->bcast,
                  c->bias_f32 ? FG_FP32 : dt, c->layout);
    fgt_bias_fill(&x->bias, &rng, 2.0, 0);
    for (int64_t j = 0; c->minus_inf_row && j < c->Nk; j++)
        fgt_bias_set(&x->bias, 0, 0, 2, j, -INFINITY);
}

static void inputs_free(binputs *x)
{
    for (int i = 0; i < 4; i++)
        free(x->in[i]);
    free(x->map);
    free(x->storage);
    fgt_bias_free(&x->bias);
}

static double tol_for(fg_dtype dt)
{
    switch (dt) {
    case FG_FP64: return 1e-12;
    case FG_FP32: return 2e-5;
    case FG_FP16: return 2e-3;
    default: return 1.6e-2;
    }
}

/* Set by tests that run fp16/bf16 on the default route (on Hopper the
 * wgmma kernels, which round P and dS to the dtype before the second
 * products: 4x the general kernels' tolerance for O, dQ, dK, dV; dbias is
 * formed in fp32 there too and keeps 2x). */
static int g_fast;

/* GPU (dtype dt) against the CPU fp64 oracle. */
static void check_case(const bgcase *c, fg_dtype dt, uint64_t salt)
{
    binputs x;
    inputs_make(c, dt, salt, &x);
    bout ref, gpu;
    /* The reference backward reads the GPU's O: D = rowsum(dO * O) then
     * carries the same rounding of O. A dbias summed over keys is
     * sum_j dS_ij = rowsum(P dP) - D_i, which is 0 up to exactly that
     * rounding, so against the oracle's own O a low-precision O alone
     * would fail any relative bound (FlashAttention's D always comes from
     * the stored O). */
    run_on(c, dt, FG_DEVICE_CUDA, &x, NULL, &gpu);
    run_on(c, dt, FG_DEVICE_CPU, &x, gpu.t[0], &ref);
    const int fast = g_fast && (dt == FG_FP16 || dt == FG_BF16);
    const double tol = tol_for(dt) * (fast ? 4 : 1);
    double tol_db = dt == FG_FP32 ? 1e-4 : tol_for(dt) * (fast ? 2 : 1);
    /* Summed over keys, dbias is sum_j dS_ij, whose terms cancel to almost
     * nothing (rowsum(P dP) - D), added by fp32 atomics in a random order:
     * 1.0e-4 to 1.2e-4 seen on an H100 against the 1e-4 of the other
     * patterns. */
    if (dt == FG_FP32 && (c->bcast & FGT_BC_K))
        tol_db = 5e-4;
    if (dt == FG_FP64)
        tol_db = (c->bias_f32 || c->dbias_f32) ? 1e-4 : 1e-10;
    const double tol_stats = dt == FG_FP64 ? 1e-12 : (dt == FG_FP32 ? 2e-5 : 1e-4);
    static const char *nm[4] = {"O", "dQ", "dK", "dV"};
    const size_t nq = (size_t)(c->B * c->Nq * c->H * c->d);
    const size_t nk = (size_t)(c->B * c->Nk * c->Hk * c->d);
    const size_t n[4] = {nq, nq, nk, nk};
    const size_t ns = (size_t)(c->B * c->H * c->Nq);
    const int64_t ext[4] = {c->bcast & FGT_BC_B ? 1 : c->B, c->bcast & FGT_BC_H ? 1 : c->H,
                            c->bcast & FGT_BC_Q ? 1 : c->Nq, c->bcast & FGT_BC_K ? 1 : c->Nk};
    const size_t nb = (size_t)(ext[0] * ext[1] * ext[2] * ext[3]);
#define GSHAPE "%s bcast=%d layout=%d/%d f32=%d/%d det=%d B=%lld Nq=%lld Nk=%lld H=%lld " \
               "Hk=%lld d=%lld causal=%d win=%d cap=%d alibi=%d sparse=%d p=%g"
#define GARGS fg_dtype_name(dt), c->bcast, c->layout, c->dlayout, c->bias_f32,          \
              c->dbias_f32, c->deterministic, (long long)c->B, (long long)c->Nq,        \
              (long long)c->Nk, (long long)c->H, (long long)c->Hk, (long long)c->d,    \
              c->causal, c->window, c->softcap, c->alibi, c->sparse, c->p
    for (int i = 0; i < 4; i++) {
        const double e = fgt_rel_err_floor(gpu.t[i], ref.t[i], n[i], 0.1);
        ck_assert_msg(e <= tol, "%s err %.3g, " GSHAPE, nm[i], e, GARGS);
    }
    const double em = fgt_stats_err(gpu.m, ref.m, ns), el = fgt_stats_err(gpu.l, ref.l, ns);
    ck_assert_msg(em <= tol_stats && el <= tol_stats, "m/l err %.3g/%.3g, " GSHAPE, em,
                  el, GARGS);
    const double eb = fgt_rel_err_floor(gpu.db, ref.db, nb, 0.1);
    ck_assert_msg(eb <= tol_db, "dbias err %.3g, " GSHAPE, eb, GARGS);
    ck_assert_msg(gpu.pad_ok, "dbias padding written, " GSHAPE, GARGS);
    if (c->minus_inf_row) {
        ck_assert(isinf(gpu.m[2]) && gpu.m[2] < 0 && gpu.l[2] == 0);
        for (int64_t e = 0; e < c->d; e++)
            ck_assert(gpu.t[0][2 * c->H * c->d + e] == 0);
        ck_assert(fgt_all_finite(gpu.db, nb));
    }
    bout_free(&ref);
    bout_free(&gpu);
    inputs_free(&x);
}

/* Case _i of the pattern grid: broadcast pattern _i % 16 with variants and
 * dtypes of bias and dbias varied along. */
static bgcase grid_case(int i)
{
    bgcase c;
    memset(&c, 0, sizeof c);
    c.B = 2; c.H = 4; c.Hk = i % 3 == 0 ? 1 : 2; c.d = i % 2 ? 64 : 32;
    c.Nq = 70 + 13 * (i % 5); c.Nk = 90 + 29 * (i % 4);
    c.bcast = i % 16;
    c.causal = i % 2;
    c.alibi = i % 3 == 0;
    c.softcap = i % 4 == 1;
    c.p = i % 5 == 2 ? 0.15 : 0;
    c.window = i % 6 == 3;
    c.sparse = i % 7 == 4;
    if (c.sparse) {
        c.Nq = 260;
        c.Nk = 300;
    }
    c.bhsd = i % 2 == 0;
    c.layout = i % 3;
    c.dlayout = (i + 1) % 3;
    c.bias_f32 = (i / 2) % 2;
    c.dbias_f32 = (i / 4) % 2;
    return c;
}

/* Every dtype on the general kernels (FG_ATTN_KERNEL=general), then
 * fp16/bf16 on the default route (the sm90 wgmma kernels on Hopper). */
START_TEST(test_patterns)
{
    static const fg_dtype dts[4] = {FG_FP32, FG_FP16, FG_BF16, FG_FP64};
    setenv("FG_ATTN_KERNEL", "general", 1);
    for (int k = 0; k < 4; k++) {
        bgcase c = grid_case(_i);
        check_case(&c, dts[k], 500 + (uint64_t)(_i * 4 + k));
    }
    fgt_switch_restore("FG_ATTN_KERNEL");
    g_fast = 1;
    for (int k = 1; k < 3; k++) {
        bgcase c = grid_case(_i);
        check_case(&c, dts[k], 600 + (uint64_t)(_i * 4 + k));
    }
}
END_TEST

/* deterministic = 1: dbias (deterministic pass for broadcast patterns,
 * direct stores otherwise) and dQ are bitwise identical across reruns,
 * and correct. _i 5, 6: d = 256 (on Hopper the split-d kernel's own dQ
 * turns with a bias, kMode 4): unmasked with nothing broadcast, then
 * causal with ALiBi and softcap and dbias by the deterministic pass. */
START_TEST(test_deterministic_bitwise)
{
    static const int patterns[7] = {FGT_BC_B | FGT_BC_H, FGT_BC_H | FGT_BC_Q,
                                    FGT_BC_B | FGT_BC_Q, FGT_BC_K, 0, 0,
                                    FGT_BC_B | FGT_BC_H};
    static const fg_dtype dts[2] = {FG_FP32, FG_BF16};
    g_fast = 1; /* bf16 on the default route */
    for (int k = 0; k < 2; k++) {
        bgcase c = grid_case(5 + _i);
        c.bcast = patterns[_i];
        if (_i >= 5) { /* no block mask: that takes the strict dQ pass */
            c.d = 256;
            c.sparse = c.window = 0;
            c.p = 0;
            c.causal = c.alibi = c.softcap = _i == 6;
        }
        c.deterministic = 1;
        check_case(&c, dts[k], 700 + (uint64_t)(_i * 2 + k));
        binputs x;
        inputs_make(&c, dts[k], 800 + (uint64_t)_i, &x);
        bout r1, r2;
        run_on(&c, dts[k], FG_DEVICE_CUDA, &x, NULL, &r1);
        run_on(&c, dts[k], FG_DEVICE_CUDA, &x, NULL, &r2);
        ck_assert(r1.db_bytes == r2.db_bytes &&
                  memcmp(r1.db_raw, r2.db_raw, r1.db_bytes) == 0);
        const size_t nq = (size_t)(c.B * c.Nq * c.H * c.d);
        ck_assert(memcmp(r1.t[1], r2.t[1], nq * sizeof(double)) == 0);
        bout_free(&r1);
        bout_free(&r2);
        inputs_free(&x);
    }
}
END_TEST

/* A row whose bias is -inf everywhere (O = 0, m = -inf, l = 0, nothing
 * NaN), dbias by atomics: i = 0 through the scratch (bf16 dbias), 1 in
 * place (fp32). */
static bgcase minus_inf_case(int i)
{
    bgcase c = grid_case(1);
    c.minus_inf_row = 1;
    c.bcast = FGT_BC_B; /* [H, Nq, Nk]: atomics */
    c.dbias_f32 = i;
    c.causal = 0;
    return c;
}

START_TEST(test_minus_inf_row)
{
    bgcase c = minus_inf_case(_i);
    g_fast = 1;
    check_case(&c, FG_BF16, 900 + (uint64_t)_i);
}
END_TEST

/* The sm_80 mma.sync kernels (FG_ATTN_KERNEL=mma sets the Hopper ones
 * aside), fp16 and bf16: _i < 16 the pattern grid; 16, 17 the -inf row
 * (atomics through the scratch, in place); 18-21 d = 256 (two launches,
 * each half of d: dbias from the first only) and d = 128 with partial
 * query and key blocks, through every dbias mode (stores, atomics via
 * scratch and in place, the deterministic pass). */
START_TEST(test_sm80)
{
    bgcase c;
    if (_i < 16) {
        c = grid_case(_i);
    } else if (_i < 18) {
        c = minus_inf_case(_i - 16);
    } else {
        static const int pats[4] = {0, FGT_BC_B, FGT_BC_H, FGT_BC_B | FGT_BC_H};
        const int k = _i - 18;
        memset(&c, 0, sizeof c);
        c.B = 2; c.H = 4; c.Hk = 2; c.d = k < 2 ? 256 : 128;
        c.Nq = 200; c.Nk = 264;
        c.bcast = pats[k];
        c.dbias_f32 = k == 2;
        c.deterministic = k == 3;
        c.causal = k % 2;
        c.softcap = k == 1;
        c.p = k == 2 ? 0.1 : 0;
        c.alibi = k == 3;
        c.layout = k % 3;
        c.dlayout = (k + 1) % 3;
    }
    setenv("FG_ATTN_KERNEL", "mma", 1);
    g_fast = 1;
    check_case(&c, FG_FP16, 1500 + (uint64_t)_i);
    check_case(&c, FG_BF16, 1600 + (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_KERNEL");
}
END_TEST

/* A larger problem through every dbias mode (bf16, d = 128): dense (0),
 * atomics (1), the deterministic pass (2); on Hopper the broadcast dbias
 * by the wgmma kernel's vector reductions (1, 3, 4): over batch into a
 * bf16 dbias through the scratch with a partial last key chunk (3: Nk =
 * 1004), over heads into an fp32 dbias in place (4); and a dense dbias
 * with no mask, which the kernel writes whole without zeroing first (5). */
START_TEST(test_larger)
{
    bgcase c;
    memset(&c, 0, sizeof c);
    c.B = 2; c.H = 8; c.Hk = 8; c.d = 128; c.Nq = c.Nk = 1000; c.causal = _i < 3;
    c.bcast = _i == 0 || _i == 5 ? 0 : _i == 3 ? FGT_BC_B : _i == 4 ? FGT_BC_H
                                                                   : FGT_BC_B | FGT_BC_H;
    c.deterministic = _i == 2;
    if (_i == 3) {
        c.Nq = 997;
        c.Nk = 1004;
        c.p = 0.1;
    }
    c.dbias_f32 = _i == 4;
    c.alibi = _i == 4;
    g_fast = 1;
    check_case(&c, _i == 4 ? FG_FP16 : FG_BF16, 1000 + (uint64_t)_i);
}
END_TEST

/* A 16-bit bias the wgmma forward reads by TMA (keys contiguous, rows of
 * a multiple of 8 elements, batch and head dense or broadcast): every head
 * dim, both dtypes, partial query tiles and key panels, with the variants;
 * with FG_ATTN_BIAS_TMA=1 at d = 128 also the backward's kMode 5 (bias and
 * dbias by TMA), with FG_ATTN_BIAS_TMA=0 the per-element loads throughout. */
START_TEST(test_bias_tma)
{
    static const int pats[4] = {0, FGT_BC_B, FGT_BC_H, FGT_BC_B | FGT_BC_H};
    bgcase c;
    memset(&c, 0, sizeof c);
    c.B = 2; c.H = 4; c.Hk = _i % 2 ? 2 : 4;
    c.d = _i % 3 == 0 ? 64 : _i % 3 == 1 ? 128 : 256;
    c.Nq = 200 + 56 * (_i % 2);
    c.Nk = _i == 7 ? 392 : 136 + 128 * (_i % 3);
    /* d = 128 (i = 1, 4): nothing broadcast and a dense 16-bit dbias, so
     * the backward's kMode 5 moves both by TMA (softcap at i = 1, dropout
     * at i = 4); the rest take kMode 4 */
    const int tma_bwd = _i == 1 || _i == 4;
    c.bcast = tma_bwd ? 0 : pats[_i % 4];
    c.causal = _i % 2;
    c.window = _i == 2 || _i == 5;
    c.alibi = _i % 3 == 2;
    c.softcap = _i == 1 || _i == 3 || _i == 6;
    c.p = _i == 4 ? 0.1 : 0;
    c.sparse = _i == 7;
    c.layout = FGT_BL_DENSE;
    c.dlayout = tma_bwd ? FGT_BL_DENSE : _i % 3;
    c.dbias_f32 = tma_bwd ? 0 : _i % 2;
    g_fast = 1;
    const fg_dtype dt = _i % 2 ? FG_FP16 : FG_BF16;
    check_case(&c, dt, 1100 + (uint64_t)_i); /* the default: forward by TMA */
    setenv("FG_ATTN_BIAS_TMA", "1", 1);      /* and the backward's kMode 5 */
    check_case(&c, dt, 1300 + (uint64_t)_i);
    setenv("FG_ATTN_BIAS_TMA", "0", 1);      /* neither */
    check_case(&c, dt, 1200 + (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_BIAS_TMA");
}
END_TEST

/* A dbias broadcast over the batch (0: bf16 through the scratch, ALiBi
 * and dropout) or the heads (1: fp32 in place, causal, GQA) at d = 128,
 * small enough for racecheck's subset: on Hopper the wgmma kernel's
 * vector reductions of its dS panel (with the batch-first grid at 0),
 * partial query tiles and a partial last key chunk (Nk = 260). */
START_TEST(test_bias_reduce)
{
    bgcase c;
    memset(&c, 0, sizeof c);
    c.B = 2; c.H = 4; c.Hk = _i ? 2 : 4; c.d = 128; c.Nq = 200; c.Nk = 260;
    c.bcast = _i ? FGT_BC_H : FGT_BC_B;
    c.dbias_f32 = _i;
    c.causal = _i;
    c.alibi = !_i;
    c.p = _i ? 0 : 0.1;
    c.layout = FGT_BL_DENSE;
    c.dlayout = FGT_BL_DENSE;
    g_fast = 1;
    check_case(&c, _i ? FG_FP16 : FG_BF16, 1400 + (uint64_t)_i);
}
END_TEST

/* The autograd op on CUDA (fp32, bias [H, Nq, Nk] requiring grad) gives
 * the CPU op's O and gradients of q and bias within 2e-5 relative. */
static void op_grads(fg_device dev, const double *h[5], const int64_t *sh[5],
                     const int nd[5], const size_t n[5], double *res[3])
{
    fg_tensor *t[5];
    for (int x = 0; x < 5; x++) {
        ck_assert(fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU, nd[x], sh[x], h[x],
                                      &t[x]) == FG_OK);
        fg_tensor *c = NULL;
        ck_assert(fg_tensor_full(FG_FP32, dev, nd[x], sh[x], 0, &c) == FG_OK);
        ck_assert(fg_tensor_copy(c, t[x]) == FG_OK);
        fg_tensor_free(t[x]);
        t[x] = c;
        if (x < 4)
            ck_assert(fg_tensor_set_requires_grad(t[x], 1) == FG_OK);
    }
    fg_attention_options o;
    fg_attention_options_init(&o);
    o.causal = 1;
    o.bias = t[3];
    fg_tensor *out = NULL;
    ck_assert_msg(fg_attention(t[0], t[1], t[2], &o, &out) == FG_OK, "%s",
                  fg_last_error());
    ck_assert_msg(fg_backward_with(out, t[4]) == FG_OK, "%s", fg_last_error());
    const fg_tensor *src[3] = {out, fg_tensor_grad(t[0]), fg_tensor_grad(t[3])};
    const size_t cnt[3] = {n[0], n[0], n[3]};
    for (int x = 0; x < 3; x++) {
        res[x] = malloc(cnt[x] * sizeof(double));
        ck_assert(src[x] != NULL);
        ck_assert(fg_tensor_copy_to_host(src[x], FG_FP64, res[x], (int64_t)cnt[x]) ==
                  FG_OK);
    }
    fg_tensor_free(out);
    for (int x = 0; x < 5; x++)
        fg_tensor_free(t[x]);
}

START_TEST(test_autograd_op)
{
    const int64_t B = 2, Nq = 50, Nk = 70, H = 4, Hk = 2, d = 32;
    const int64_t sq[4] = {B, Nq, H, d}, sk[4] = {B, Nk, Hk, d}, sb[3] = {H, Nq, Nk};
    const int64_t *sh[5] = {sq, sk, sk, sb, sq};
    const int nd[5] = {4, 4, 4, 3, 4};
    const size_t n[5] = {(size_t)(B * Nq * H * d), (size_t)(B * Nk * Hk * d),
                         (size_t)(B * Nk * Hk * d), (size_t)(H * Nq * Nk),
                         (size_t)(B * Nq * H * d)};
    fgt_rng rng = fgt_rng_for(1300);
    double *h[5];
    for (int x = 0; x < 5; x++) {
        h[x] = malloc(n[x] * sizeof(double));
        fgt_fill(h[x], n[x], &rng, 1.0);
        for (size_t e = 0; e < n[x]; e++)
            h[x][e] = (float)h[x][e];
    }
    double *cpu[3], *gpu[3];
    op_grads(FG_DEVICE_CPU, (const double **)h, sh, nd, n, cpu);
    op_grads(FG_DEVICE_CUDA, (const double **)h, sh, nd, n, gpu);
    static const char *nm[3] = {"O", "dQ", "dbias"};
    const size_t cnt[3] = {n[0], n[0], n[3]};
    for (int x = 0; x < 3; x++) {
        const double e = fgt_rel_err_floor(gpu[x], cpu[x], cnt[x], 0.1);
        ck_assert_msg(e <= (x == 2 ? 1e-4 : 2e-5), "%s err %.3g", nm[x], e);
        free(cpu[x]);
        free(gpu[x]);
    }
    for (int x = 0; x < 5; x++)
        free(h[x]);
}
END_TEST

/* Kernel switches the tests set, restored around each test (test_util.h:
 * under CK_FORK=no a failed test would leave them set). */
static const char *const g_switches[] = {"FG_ATTN_KERNEL", "FG_ATTN_BIAS_TMA"};

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU bias suite\n");
        return 77;
    }
    fgt_base_seed();
    FGT_SWITCHES_SAVE(g_switches);
    Suite *s = suite_create("gpu_bias");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 900);
    tcase_add_checked_fixture(tc, fgt_switches_restore, fgt_switches_restore);
    /* racecheck (FG_SANITIZE=fast): four patterns (both head dims, GQA,
     * causal, ALiBi, softcap, dropout, every bias/dbias dtype pair), one
     * deterministic and one -inf case, two TMA cases and the two
     * reduction cases; not the larger shapes. */
    const int fast = fgt_sanitize_mode() == 2;
    /* FG_SANITIZE=det: the deterministic cases alone (as test_gpu_attention's;
     * 5 and 6 run the d = 256 bias kernel's kDet form) */
    if (fgt_sanitize_det()) {
        fgt_add_loop(tc, test_deterministic_bitwise, 0, 7);
        suite_add_tcase(s, tc);
        return fgt_run_suite(s);
    }
    fgt_add_loop(tc, test_patterns, 0, fast ? 4 : 16);
    fgt_add_loop(tc, test_deterministic_bitwise, 0, fast ? 1 : 7);
    fgt_add_loop(tc, test_minus_inf_row, 0, fast ? 1 : 2);
    fgt_add_loop(tc, test_bias_tma, 0, fast ? 2 : 8);
    fgt_add_loop(tc, test_bias_reduce, 0, 2);
    /* racecheck: one grid case (GQA, causal, ALiBi); the bias adds no
     * shared-memory traffic to the sm80 kernels, and this suite's racecheck
     * run is already the sweep's longest (341 s, session 36) */
    fgt_add_loop(tc, test_sm80, 0, fast ? 1 : 22);
    if (!fast)
        fgt_add_loop(tc, test_larger, 0, 6);
    fgt_add_test(tc, test_autograd_op);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
