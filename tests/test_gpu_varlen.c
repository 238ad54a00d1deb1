/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_varlen.c - packed variable-length batches and key padding
 * on CUDA against the CPU fp64 oracle (itself checked against the naive
 * reference in test_attention_varlen), in fp64, fp32, fp16 and bf16, with
 * the variants; deterministic dQ; rows past cu_seqlens[B] untouched; bad
 * device offsets refused with nothing written. Exits 77 (skip) without a
 * GPU; CUDA is touched only inside the forked tests.
 *
 * Errors are max-abs relative to max(max |oracle|, 0.1) for gradients,
 * max |oracle| for O. Tolerances: fp64 1e-12; fp32 2e-5; fp16 1e-3,
 * bf16 8e-3 on the general kernels (FG_ATTN_KERNEL=general): they compute
 * in fp32 and round each output once, i.e. half an ulp (2^-11 fp16, 2^-8
 * bf16 of max |oracle|) plus fp32 noise; inputs are rounded to the dtype
 * before the oracle sees them. Without it, fp16/bf16 on Hopper take the
 * wgmma kernels (kMode 3, forward and backward), which like FlashAttention
 * round P (and dS) to the dtype before their products: twice those
 * bounds. Stats are fp32 for every non-fp64 dtype: 1e-5
 * (1e-12 fp64). */
#include <check.h>
#include <cuda_runtime.h>

#define VL_LOWP
#include "varlen_harness.h"

#define CK_CUDA(call)                                                       \
    do {                                                                    \
        cudaError_t e_ = (call);                                            \
        ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call,                   \
                      cudaGetErrorString(e_));                              \
    } while (0)

static void *gpu_put(const void *host, size_t bytes)
{
    void *p = NULL;
    CK_CUDA(cudaMalloc(&p, bytes + 16));
    CK_CUDA(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void gpu_get(void *host, const void *dev, size_t bytes)
{
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

static void gpu_drop(void *dev)
{
    CK_CUDA(cudaFree(dev));
}

static const vl_dev g_gpu = {FG_DEVICE_CUDA, gpu_put, gpu_get, gpu_drop};

static double tol_of(fg_dtype dt)
{
    const char *force = getenv("FG_ATTN_KERNEL");
    const double fast = force && strcmp(force, "general") == 0 ? 1.0 : 2.0;
    switch (dt) {
    case FG_FP64: return 1e-12;
    case FG_FP32: return 2e-5;
    case FG_FP16: return 1e-3 * fast;
    default: return 8e-3 * fast;
    }
}

/* c in every dtype on the GPU against the CPU fp64 oracle on the same
 * (rounded) inputs. */
static void check_gpu(vl_case c, uint64_t salt)
{
    static const fg_dtype dts[4] = {FG_FP64, FG_FP32, FG_FP16, FG_BF16};
    for (int di = 0; di < 4; di++) {
        c.dtype = dts[di];
        vl_data d;
        vl_make(&c, salt + (uint64_t)di, &d);
        vl_out ref, gpu;
        fg_status fwd, bwd;
        c.o_as_stored = 1;
        vl_run(&c, &d, FG_FP64, NULL, &ref, &fwd, &bwd);
        c.o_as_stored = 0;
        ck_assert_msg(fwd == FG_OK && bwd == FG_OK, "cpu: %s", fg_last_error());
        vl_run(&c, &d, c.dtype, &g_gpu, &gpu, &fwd, &bwd);
        ck_assert_msg(fwd == FG_OK, "gpu fwd: %s", fg_last_error());
        ck_assert_msg(bwd == FG_OK, "gpu bwd: %s", fg_last_error());
        const vl_err e = vl_compare(&c, &d, &gpu, &ref);
        double tol = tol_of(c.dtype);
        /* fp16/bf16 on Hopper: the softcap runs through tanh.approx.f32,
         * which moves m and l by up to ~1e-5 relative (test_gpu_bias: 1e-4).
         * A softcap alone with a wide cap (cases 8, 9; the random cases'
         * caps are below 6): its 2^-11 on logits of up to cap, so
         * test_gpu_attention's test_softcap_stats bounds (m 2e-3, l 5e-3,
         * O and gradients 6e-3 / 4e-2). */
        const int cap_alone = c.softcap >= 10 && !c.alibi && c.dtype != FG_FP64 &&
                              c.dtype != FG_FP32;
        double stol_m = c.dtype == FG_FP64   ? 1e-12
                        : c.dtype == FG_FP32 ? 1e-5
                                             : 1e-4;
        double stol_l = stol_m;
        if (cap_alone) {
            tol = fmax(tol, FGT_LOWP_VARIANT_TOL(c.dtype));
            stol_m = FGT_SOFTCAP_TOL_M;
            stol_l = FGT_SOFTCAP_TOL_L;
        }
#define GSHAPE "%s B=%lld H=%lld Hk=%lld d=%lld causal=%d tl=%d win=%d " \
               "cap=%g alibi=%d p=%g used=%d dense=%d det=%d"
#define GARGS fg_dtype_name(c.dtype), (long long)c.B, (long long)c.H,      \
              (long long)c.Hk, (long long)c.d, c.causal, c.top_left,      \
              c.window, c.softcap, c.alibi, c.p, c.use_used, c.dense,     \
              c.deterministic
        ck_assert_msg(gpu.tails_nan, "a row past cu[B] was written, " GSHAPE, GARGS);
        ck_assert_msg(e.o <= tol, "O err %.3g, " GSHAPE, e.o, GARGS);
        ck_assert_msg(e.dq <= tol, "dQ err %.3g, " GSHAPE, e.dq, GARGS);
        ck_assert_msg(e.dk <= tol, "dK err %.3g, " GSHAPE, e.dk, GARGS);
        ck_assert_msg(e.dv <= tol, "dV err %.3g, " GSHAPE, e.dv, GARGS);
        ck_assert_msg(e.m <= stol_m, "m err %.3g, " GSHAPE, e.m, GARGS);
        ck_assert_msg(e.l <= stol_l, "l err %.3g, " GSHAPE, e.l, GARGS);
        vl_out_free(&ref);
        vl_out_free(&gpu);
        vl_free(&d);
    }
}

static void lengths(vl_case *c, int64_t B, const int32_t *lq, const int32_t *lk)
{
    c->B = B;
    for (int64_t b = 0; b < B; b++) {
        c->lq[b] = lq[b];
        c->lk[b] = lk[b];
    }
}

/* Lengths straddle the kernels' tiles (8 .. 64) and include 0 and 1. */
static vl_case gpu_case(int i)
{
    static const int32_t lq[] = {65, 0, 1, 130, 33, 7};
    static const int32_t lk[] = {70, 12, 0, 129, 64, 7};
    static const int32_t eq[] = {100, 100, 100};
    vl_case c = {0};
    lengths(&c, 6, lq, lk);
    c.H = 4; c.Hk = 2; c.d = 64; c.pad_q = 5; c.pad_k = 3;
    switch (i) {
    case 0: c.causal = 1; break;
    case 1: c.causal = 1; c.top_left = 1; c.hmajor = 1; c.d = 40; break;
    case 2: /* window + ALiBi + softcap + dropout */
        c.window = 1; c.window_left = 30; c.window_right = 5; c.alibi = 2;
        c.softcap = 4.0; c.p = 0.15; c.seed = 17; c.offset = 2;
        break;
    case 3: /* key padding, causal, MQA, dropout */
        c.causal = 1; c.Hk = 1; c.use_used = 1; c.p = 0.1; c.seed = 4;
        for (int b = 0; b < 6; b++)
            c.used[b] = lk[b] * 2 / 3;
        c.used[3] = 0; /* all keys padded */
        break;
    case 4: /* deterministic dQ, everything on, d = 128 */
        c.deterministic = 1; c.causal = 1; c.window = 1; c.window_left = 50;
        c.window_right = -1; c.alibi = 1; c.softcap = 3.0; c.use_used = 1;
        c.d = 128;
        for (int b = 0; b < 6; b++)
            c.used[b] = lk[b] - lk[b] / 4;
        break;
    case 6: /* masks alone at d = 128 (the wgmma kMode 7): causal window,
             * GQA, dropout */
        c.causal = 1; c.window = 1; c.window_left = 40; c.window_right = -1;
        c.d = 128; c.p = 0.1; c.seed = 23;
        break;
    case 7: /* masks alone at d = 256: key padding, top-left causal */
        c.causal = 1; c.top_left = 1; c.use_used = 1; c.d = 256;
        for (int b = 0; b < 6; b++)
            c.used[b] = lk[b] - lk[b] / 3;
        break;
    case 8: /* a softcap alone (the fast kernels keep such scores in tanh
             * units) at d = 128: causal window, GQA */
        c.causal = 1; c.window = 1; c.window_left = 45; c.window_right = -1;
        c.softcap = 30.0; c.d = 128;
        break;
    case 9: /* a softcap alone at d = 64: key padding, MQA, dropout */
        c.softcap = 20.0; c.Hk = 1; c.use_used = 1; c.p = 0.1; c.seed = 31;
        for (int b = 0; b < 6; b++)
            c.used[b] = lk[b] - lk[b] / 5;
        break;
    default: /* dense batch with key padding only */
        lengths(&c, 3, eq, eq);
        c.dense = 1; c.pad_q = c.pad_k = 0; c.causal = 1; c.use_used = 1;
        c.used[0] = 100; c.used[1] = 37; c.used[2] = 0; c.p = 0.1; c.seed = 9;
        break;
    }
    return c;
}
#define N_GPU_CASES 10

START_TEST(test_gpu_varlen_cases)
{
    check_gpu(gpu_case(_i), 900 + 10 * (uint64_t)_i);
}
END_TEST

/* The d <= 64 cases take the Hopper backward's 128-query kernels by
 * default (test_gpu_varlen_cases); these run them through its 64-query
 * ones (FG_ATTN_BWD_WIDE=0): causal both ways, window + ALiBi + softcap +
 * dropout, key padding with MQA and dropout, the dense batch with key
 * padding, a softcap alone with key padding and dropout. */
static const int narrow_cases[] = {0, 1, 2, 3, 5, 9};

START_TEST(test_gpu_varlen_narrow)
{
    setenv("FG_ATTN_BWD_WIDE", "0", 1);
    check_gpu(gpu_case(narrow_cases[_i]), 2900 + 10 * (uint64_t)_i);
    fgt_switch_restore("FG_ATTN_BWD_WIDE");
}
END_TEST

/* check_gpu of case i with the two switches names[0], names[1] set to
 * vals[0], vals[1], then put back as the suite started. */
static void check_with(const char *const *names, const char *const *vals, int n, int i,
                       uint64_t salt)
{
    for (int k = 0; k < n; k++)
        setenv(names[k], vals[k], 1);
    check_gpu(gpu_case(i), salt);
    for (int k = 0; k < n; k++)
        fgt_switch_restore(names[k]);
}

/* The Hopper kernels' outputs from registers (FG_ATTN_FWD_EPI=0,
 * FG_ATTN_BWD_EPI=0; the other cases take the default, through shared
 * memory, wgmma_epilogue.cuh) on packed and key-padded batches: a
 * sequence's last tile stops at its own length. */
START_TEST(test_gpu_varlen_regs)
{
    static const char *const names[2] = {"FG_ATTN_FWD_EPI", "FG_ATTN_BWD_EPI"};
    static const char *const vals[2] = {"0", "0"};
    check_with(names, vals, 2, _i, 3900 + 10 * (uint64_t)_i);
}
END_TEST

/* The sm_80 mma.sync kernels on packed and key-padded batches
 * (FG_ATTN_KERNEL=mma sets the Hopper ones aside; fp16/bf16 run in their
 * kMode 2 with kRagged, fp32/fp64 as without it): every case against the
 * fp64 reference. */
START_TEST(test_gpu_varlen_mma)
{
    static const char *const names[1] = {"FG_ATTN_KERNEL"};
    static const char *const vals[1] = {"mma"};
    check_with(names, vals, 1, _i, 4900 + 10 * (uint64_t)_i);
}
END_TEST

/* A one-token batch, and random lengths from the test seed. */
START_TEST(test_gpu_varlen_random)
{
    fgt_rng rng = fgt_rng_for(31 + (uint64_t)_i);
    vl_case c;
    vl_random(&rng, 200, 32, 80, &c); /* d up to 256 */
    if (_i == 0) { /* one token */
        c.B = 1;
        c.lq[0] = c.lk[0] = 1;
        c.used[0] = (int32_t)fgt_int(&rng, 0, 1);
    }
    c.deterministic = (int)fgt_int(&rng, 0, 1);
    check_gpu(c, 1900 + (uint64_t)_i * 8);
}
END_TEST

/* Device offsets that do not start at 0 are refused after the host copy,
 * with nothing written; host arrays with device = CUDA too, and right
 * device offsets whose host copies (cu_seqlens_q_host) are wrong. */
START_TEST(test_gpu_bad_offsets)
{
    const int64_t d = 8, total = 20;
    float host[20 * 8];
    for (int i = 0; i < 20 * 8; i++)
        host[i] = 1.0f;
    const int32_t bad_q[3] = {1, 5, 12}, good_k[3] = {0, 6, 10};
    const int32_t good_q[3] = {0, 5, 12}, falling_q[3] = {0, 5, 4};
    void *q = gpu_put(host, sizeof host), *o = gpu_put(host, sizeof host);
    void *m = gpu_put(host, 20 * 4), *l = gpu_put(host, 20 * 4);
    int32_t *cq = gpu_put(bad_q, sizeof bad_q), *ck = gpu_put(good_k, sizeof good_k);
    int32_t *cq_good = gpu_put(good_q, sizeof good_q);
    fg_attn_params p;
    fg_attn_params_init(&p, 2, 10, 10, 1, 1, d);
    p.device = FG_DEVICE_CUDA;
    p.cu_seqlens_q = cq;
    p.cu_seqlens_k = ck;
    p.total_q = p.total_k = total;
    fg_attn_tensor t = {q, FG_FP32, 0, d, d}, to = {o, FG_FP32, 0, d, d};
    fg_attn_stats st = {m, l, FG_FP32};
    ck_assert(fg_attention_forward(&p, &t, &t, &t, &to, &st) == FG_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fg_last_error(), "cu_seqlens_q[0]"), "%s", fg_last_error());
    p.cu_seqlens_q = bad_q; /* host memory */
    ck_assert(fg_attention_forward(&p, &t, &t, &t, &to, &st) == FG_ERR_INVALID_ARGUMENT);
    p.cu_seqlens_q = cq_good; /* right on the device, wrong in the copy */
    p.cu_seqlens_q_host = falling_q;
    p.cu_seqlens_k_host = good_k;
    ck_assert(fg_attention_forward(&p, &t, &t, &t, &to, &st) == FG_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fg_last_error(), "non-decreasing"), "%s", fg_last_error());
    float back[20 * 8];
    gpu_get(back, o, sizeof back);
    for (int i = 0; i < 20 * 8; i++)
        ck_assert(back[i] == 1.0f);
    gpu_get(back, m, 20 * 4);
    for (int i = 0; i < 20; i++)
        ck_assert(back[i] == 1.0f);
    void *all[] = {q, o, m, l, cq, ck, cq_good};
    for (int i = 0; i < 7; i++)
        gpu_drop(all[i]);
}
END_TEST

/* Host copies of the offsets (cu_seqlens_q_host, ...): with all of them
 * the call validates the copies and reads nothing back; with some it
 * reads the arrays back as without. Either way the outputs are bit for
 * bit those without copies (bf16; packed with key padding, causal, MQA
 * and dropout; packed causal). Bad copies: test_gpu_bad_offsets. */
START_TEST(test_gpu_host_copies)
{
    for (int ci = 0; ci < 2; ci++) {
        vl_case c = gpu_case(ci == 0 ? 3 : 0);
        c.dtype = FG_BF16;
        vl_data d;
        vl_make(&c, 5100 + (uint64_t)ci, &d);
        vl_out r0;
        fg_status f, b;
        vl_run(&c, &d, c.dtype, &g_gpu, &r0, &f, &b);
        ck_assert_msg(f == FG_OK && b == FG_OK, "%s", fg_last_error());
        static const int masks[3] = {7, 3, 1};
        for (int mi = 0; mi < 3; mi++) {
            c.host_copies = masks[mi];
            vl_out r;
            vl_run(&c, &d, c.dtype, &g_gpu, &r, &f, &b);
            ck_assert_msg(f == FG_OK && b == FG_OK, "copies %d: %s", masks[mi],
                          fg_last_error());
            const int diff = vl_bitwise_diff(&c, &d, &r, &r0);
            ck_assert_msg(diff < 0, "case %d, copies %d: output %d differs", ci, masks[mi],
                          diff);
            vl_out_free(&r);
        }
        vl_out_free(&r0);
        vl_free(&d);
    }
}
END_TEST

/* Kernel switches the tests set, restored around each test (test_util.h:
 * under CK_FORK=no a failed test would leave them set). */
static const char *const g_switches[] = {"FG_ATTN_BWD_WIDE", "FG_ATTN_FWD_EPI",
                                         "FG_ATTN_BWD_EPI", "FG_ATTN_KERNEL"};

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping\n");
        return 77;
    }
    FGT_SWITCHES_SAVE(g_switches);
    Suite *s = suite_create("gpu_varlen");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, fgt_switches_restore, fgt_switches_restore);
    /* racecheck (FG_SANITIZE=fast): causal, top-left and the combined
     * variant case, and two random batches (the one-token one first). */
    const int fast = fgt_sanitize_mode() == 2;
    fgt_add_loop(tc, test_gpu_varlen_cases, 0, fast ? 3 : N_GPU_CASES);
    fgt_add_loop(tc, test_gpu_varlen_random, 0, fast ? 2 : 6);
    fgt_add_test(tc, test_gpu_bad_offsets);
    fgt_add_test(tc, test_gpu_host_copies);
    fgt_add_loop(tc, test_gpu_varlen_narrow, 0,
                 fast ? 2 : (int)(sizeof narrow_cases / sizeof narrow_cases[0]));
    fgt_add_loop(tc, test_gpu_varlen_regs, 0, fast ? 2 : N_GPU_CASES);
    fgt_add_loop(tc, test_gpu_varlen_mma, 0, fast ? 2 : N_GPU_CASES);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
