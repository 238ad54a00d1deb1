/* SPDX-License-Identifier: MIT */
/* tests/test_errors.c - the error model: every bad argument gives the right
 * status and a message, and leaves every output byte untouched. */
#include <check.h>
#include <pthread.h>

#include "test_util.h"

#define B 2
#define N 9
#define H 2
#define D 16
#define NE (B * N * H * D)
#define NS (B * H * N)
#define SENT 0x5A

/* Buffers with room for misaligned and oversized views. */
static float q[NE], k[NE], v[NE], o[NE], g[NE], dq[NE], dk[NE], dv[NE];
static float m[NS], l[NS];
static double m64[NS], l64[NS];
static double q64[NE];

typedef struct fixture {
    fg_attn_params p;
    fg_attn_tensor q, k, v, o, g, dq, dk, dv;
    fg_attn_stats st;
} fixture;

static void setup_fixture(fixture *f)
{
    fgt_rng r = fgt_rng_for(5);
    for (int i = 0; i < NE; i++) {
        q[i] = (float)fgt_uniform(&r);
        k[i] = (float)fgt_uniform(&r);
        v[i] = (float)fgt_uniform(&r);
        g[i] = (float)fgt_uniform(&r);
    }
    memset(o, SENT, sizeof o);
    memset(dq, SENT, sizeof dq);
    memset(dk, SENT, sizeof dk);
    memset(dv, SENT, sizeof dv);
    memset(m, SENT, sizeof m);
    memset(l, SENT, sizeof l);
    fg_attn_params_init(&f->p, B, N, N, H, H, D);
    f->q = fg_attn_bshd(q, FG_FP32, N, H, D);
    f->k = fg_attn_bshd(k, FG_FP32, N, H, D);
    f->v = fg_attn_bshd(v, FG_FP32, N, H, D);
    f->o = fg_attn_bshd(o, FG_FP32, N, H, D);
    f->g = fg_attn_bshd(g, FG_FP32, N, H, D);
    f->dq = fg_attn_bshd(dq, FG_FP32, N, H, D);
    f->dk = fg_attn_bshd(dk, FG_FP32, N, H, D);
    f->dv = fg_attn_bshd(dv, FG_FP32, N, H, D);
    f->st.m = m;
    f->st.l = l;
    f->st.dtype = FG_FP32;
}

static int untouched(const void *buf, size_t n)
{
    const unsigned char *c = buf;
    for (size_t i = 0; i < n; i++)
        if (c[i] != SENT)
            return 0;
    return 1;
}

static fg_status run_fwd(fixture *f)
{
    fg_clear_error();
    return fg_attention_forward(&f->p, &f->q, &f->k, &f->v, &f->o, &f->st);
}

static fg_status run_bwd(fixture *f)
{
    fg_clear_error();
    return fg_attention_backward(&f->p, &f->q, &f->k, &f->v, &f->o, &f->g,
                                 &f->st, &f->dq, &f->dk, &f->dv);
}

/* Expect status s, a message containing `needle`, and untouched outputs. */
static void expect(fg_status got, fg_status want, const char *needle,
                   const char *what)
{
    ck_assert_msg(got == want, "%s: got %s (%s), want %s", what,
                  fg_status_string(got), fg_last_error(),
                  fg_status_string(want));
    ck_assert_msg(fg_last_status() == want, "%s: last status not recorded", what);
    ck_assert_msg(strlen(fg_last_error()) > 10, "%s: no message", what);
    ck_assert_msg(strstr(fg_last_error(), needle) != NULL,
                  "%s: message '%s' lacks '%s'", what, fg_last_error(), needle);
    ck_assert_msg(untouched(o, sizeof o) && untouched(m, sizeof m) &&
                      untouched(l, sizeof l),
                  "%s: forward outputs were written", what);
    ck_assert_msg(untouched(dq, sizeof dq) && untouched(dk, sizeof dk) &&
                      untouched(dv, sizeof dv),
                  "%s: gradients were written", what);
}

/* Each case mutates a fresh fixture; both forward and backward must reject. */
typedef void (*mutate_fn)(fixture *f);
typedef struct bad_case {
    const char *what;
    mutate_fn mutate;
    fg_status want;
    const char *needle;
    int fwd, bwd; /* which calls it applies to */
} bad_case;

static void null_q(fixture *f) { f->q.data = NULL; }
static void null_dk(fixture *f) { f->dk.data = NULL; }
static void null_m(fixture *f) { f->st.m = NULL; }
static void zero_batch(fixture *f) { f->p.batch = 0; }
static void neg_seq(fixture *f) { f->p.seqlen_k = -3; }
static void zero_d(fixture *f) { f->p.head_dim = 0; }
static void d_12(fixture *f) { f->p.head_dim = 12; }
static void d_264(fixture *f) { f->p.head_dim = 264; }
static void gqa_bad(fixture *f) { f->p.heads_kv = 3; f->p.heads_q = 2; }
static void p_neg(fixture *f) { f->p.dropout_p = -0.1; }
static void p_one(fixture *f) { f->p.dropout_p = 1.0; }
static void p_nan(fixture *f) { f->p.dropout_p = NAN; }
static void scale_neg(fixture *f) { f->p.softmax_scale = -1.0; }
static void scale_inf(fixture *f) { f->p.softmax_scale = INFINITY; }
static void block_neg(fixture *f) { f->p.block_q = -1; }
static void fp16_cpu(fixture *f)
{
    f->q.dtype = f->k.dtype = f->v.dtype = f->o.dtype = f->g.dtype = FG_FP16;
    f->dq.dtype = f->dk.dtype = f->dv.dtype = FG_FP16;
}
static void dtype_mismatch(fixture *f) { f->k = fg_attn_bshd(q64, FG_FP64, N, H, D); }
static void dtype_bad(fixture *f) { f->v.dtype = (fg_dtype)42; }
static void stats_dtype(fixture *f) { f->st.m = m64; f->st.l = l64; f->st.dtype = FG_FP64; }
static void misaligned(fixture *f) { f->q.data = (char *)q + 2; f->q.stride_b -= 1; }
static void o_is_q(fixture *f) { f->o.data = q; }
static void o_overlaps_k(fixture *f) { f->o.data = k + 5; f->o.stride_b = 0; }
static void o_self_alias(fixture *f) { f->o.stride_s = 0; }
static void o_strides_overlap(fixture *f) { f->o.stride_h = 8; }
static void m_is_l(fixture *f) { f->st.l = f->st.m; }
static void m_in_o(fixture *f) { f->st.m = o; }
static void dq_is_dk(fixture *f) { f->dk.data = dq; }
static void dv_is_g(fixture *f) { f->dv.data = g; }
static void neg_stride(fixture *f) { f->k.stride_s = -f->k.stride_s; }
static void cuda_dev(fixture *f) { f->p.device = FG_DEVICE_CUDA; }
static void bad_dev(fixture *f) { f->p.device = (fg_device)7; }
static void huge_stride(fixture *f) { f->v.stride_b = INT64_MAX - 5; }
static void dq_self_alias(fixture *f) { f->dq.stride_h = 0; }

static const bad_case bad[] = {
    {"NULL q data", null_q, FG_ERR_INVALID_ARGUMENT, "q data is NULL", 1, 1},
    {"NULL dk data", null_dk, FG_ERR_INVALID_ARGUMENT, "dk data is NULL", 0, 1},
    {"NULL m", null_m, FG_ERR_INVALID_ARGUMENT, "stats.m", 1, 1},
    {"batch 0", zero_batch, FG_ERR_INVALID_ARGUMENT, "batch=0", 1, 1},
    {"seqlen_k < 0", neg_seq, FG_ERR_INVALID_ARGUMENT, "seqlen_k=-3", 1, 1},
    {"head_dim 0", zero_d, FG_ERR_INVALID_ARGUMENT, "head_dim=0", 1, 1},
    {"head_dim 12", d_12, FG_ERR_UNSUPPORTED, "head_dim 12", 1, 1},
    {"head_dim 264", d_264, FG_ERR_UNSUPPORTED, "head_dim 264", 1, 1},
    {"H % Hk", gqa_bad, FG_ERR_INVALID_ARGUMENT, "multiple of heads_kv", 1, 1},
    {"p < 0", p_neg, FG_ERR_INVALID_ARGUMENT, "dropout_p", 1, 1},
    {"p = 1", p_one, FG_ERR_INVALID_ARGUMENT, "dropout_p", 1, 1},
    {"p NaN", p_nan, FG_ERR_INVALID_ARGUMENT, "dropout_p", 1, 1},
    {"scale < 0", scale_neg, FG_ERR_INVALID_ARGUMENT, "softmax_scale", 1, 1},
    {"scale inf", scale_inf, FG_ERR_INVALID_ARGUMENT, "softmax_scale", 1, 1},
    {"block_q < 0", block_neg, FG_ERR_INVALID_ARGUMENT, "block_q", 1, 1},
    {"fp16 on CPU", fp16_cpu, FG_ERR_UNSUPPORTED, "fp16", 1, 1},
    {"dtype mismatch", dtype_mismatch, FG_ERR_INVALID_ARGUMENT, "dtype mismatch", 1, 1},
    {"unknown dtype", dtype_bad, FG_ERR_INVALID_ARGUMENT, "dtype", 1, 1},
    {"stats dtype", stats_dtype, FG_ERR_INVALID_ARGUMENT, "stats must be fp32", 1, 1},
    {"misaligned q", misaligned, FG_ERR_INVALID_ARGUMENT, "not aligned", 1, 1},
    {"o == q", o_is_q, FG_ERR_INVALID_ARGUMENT, "overlaps", 1, 0},
    {"o overlaps k", o_overlaps_k, FG_ERR_INVALID_ARGUMENT, "o", 1, 0},
    {"o stride_s 0", o_self_alias, FG_ERR_INVALID_ARGUMENT, "alias", 1, 0},
    {"o heads overlap", o_strides_overlap, FG_ERR_INVALID_ARGUMENT, "alias", 1, 0},
    {"m == l", m_is_l, FG_ERR_INVALID_ARGUMENT, "overlaps", 1, 0},
    {"m inside o", m_in_o, FG_ERR_INVALID_ARGUMENT, "overlaps", 1, 0},
    {"dq == dk", dq_is_dk, FG_ERR_INVALID_ARGUMENT, "overlaps", 0, 1},
    {"dv == dout", dv_is_g, FG_ERR_INVALID_ARGUMENT, "overlaps", 0, 1},
    {"negative stride", neg_stride, FG_ERR_INVALID_ARGUMENT, "negative stride", 1, 1},
    {"unknown device", bad_dev, FG_ERR_INVALID_ARGUMENT, "device", 1, 1},
    {"dq stride_h 0", dq_self_alias, FG_ERR_INVALID_ARGUMENT, "alias", 0, 1},
    {"stride overflow", huge_stride, FG_ERR_INVALID_ARGUMENT, "overflow", 1, 1},
};

START_TEST(test_bad_input)
{
    const bad_case *c = &bad[_i];
    fixture f;
    if (c->fwd) {
        setup_fixture(&f);
        c->mutate(&f);
        expect(run_fwd(&f), c->want, c->needle, c->what);
    }
    if (c->bwd) {
        setup_fixture(&f);
        c->mutate(&f);
        expect(run_bwd(&f), c->want, c->needle, c->what);
    }
}
END_TEST

/* Host pointers with device = cuda: unsupported without CUDA, no device
 * without a GPU, invalid argument (not device memory) with one. */
START_TEST(test_cuda_device_host_pointer)
{
    fixture f;
    setup_fixture(&f);
    cuda_dev(&f);
    fg_status s = run_fwd(&f);
    ck_assert_msg(s == FG_ERR_UNSUPPORTED || s == FG_ERR_NO_DEVICE ||
                      s == FG_ERR_INVALID_ARGUMENT,
                  "got %s: %s", fg_status_string(s), fg_last_error());
    ck_assert(strlen(fg_last_error()) > 10);
    ck_assert(untouched(o, sizeof o) && untouched(m, sizeof m));
}
END_TEST

/* The TF32 attention switch: off by default; without CUDA it reports
 * FG_ERR_UNSUPPORTED naming itself and reads 0. */
START_TEST(test_attention_tf32_switch)
{
    ck_assert_int_eq(fg_cuda_get_attention_allow_tf32(), 0);
    fg_clear_error();
    const fg_status s = fg_cuda_set_attention_allow_tf32(1);
    if (s == FG_OK) {
        ck_assert_int_eq(fg_cuda_get_attention_allow_tf32(), 1);
        ck_assert_int_eq(fg_cuda_set_attention_allow_tf32(0), FG_OK);
    } else {
        ck_assert_msg(s == FG_ERR_UNSUPPORTED, "got %s", fg_status_string(s));
        ck_assert(strstr(fg_last_error(), "fg_cuda_set_attention_allow_tf32") != NULL);
    }
    ck_assert_int_eq(fg_cuda_get_attention_allow_tf32(), 0);
}
END_TEST

/* The GEMM autotune switch, likewise (unless FG_GEMM_AUTOTUNE is set in
 * the environment, which turns it on whatever the switch says). */
START_TEST(test_gemm_autotune_switch)
{
    if (getenv("FG_GEMM_AUTOTUNE"))
        return;
    ck_assert_int_eq(fg_cuda_get_gemm_autotune(), 0);
    fg_clear_error();
    const fg_status s = fg_cuda_set_gemm_autotune(1);
    if (s == FG_OK) {
        ck_assert_int_eq(fg_cuda_get_gemm_autotune(), 1);
        ck_assert_int_eq(fg_cuda_set_gemm_autotune(0), FG_OK);
    } else {
        ck_assert_msg(s == FG_ERR_UNSUPPORTED, "got %s", fg_status_string(s));
        ck_assert(strstr(fg_last_error(), "fg_cuda_set_gemm_autotune") !=
                  NULL);
    }
    ck_assert_int_eq(fg_cuda_get_gemm_autotune(), 0);
}
END_TEST

START_TEST(test_null_structs)
{
    fixture f;
    setup_fixture(&f);
    fg_clear_error();
    ck_assert(fg_attention_forward(NULL, &f.q, &f.k, &f.v, &f.o, &f.st) ==
              FG_ERR_INVALID_ARGUMENT);
    ck_assert(strstr(fg_last_error(), "params") != NULL);
    ck_assert(fg_attention_forward(&f.p, &f.q, NULL, &f.v, &f.o, &f.st) ==
              FG_ERR_INVALID_ARGUMENT);
    ck_assert(strstr(fg_last_error(), "k is NULL") != NULL);
    ck_assert(fg_attention_forward(&f.p, &f.q, &f.k, &f.v, &f.o, NULL) ==
              FG_ERR_INVALID_ARGUMENT);
    ck_assert(fg_attention_backward(&f.p, &f.q, &f.k, &f.v, &f.o, &f.g, &f.st,
                                    &f.dq, &f.dk, NULL) == FG_ERR_INVALID_ARGUMENT);
    ck_assert(fg_attention_dropout_mask(&f.p, NULL) == FG_ERR_INVALID_ARGUMENT);
    ck_assert(untouched(o, sizeof o) && untouched(dq, sizeof dq));
    /* The valid call goes through after all that. */
    ck_assert(run_fwd(&f) == FG_OK);
    ck_assert(run_bwd(&f) == FG_OK);
    ck_assert(!untouched(o, sizeof o) && !untouched(dv, sizeof dv));
}
END_TEST

static void *thread_fail(void *arg)
{
    (void)arg;
    fg_attn_params p;
    fg_attn_params_init(&p, 0, 1, 1, 1, 1, 8);
    fg_attention_forward(&p, NULL, NULL, NULL, NULL, NULL);
    return strstr(fg_last_error(), "batch=0") ? (void *)1 : NULL;
}

START_TEST(test_thread_local)
{
    fg_clear_error();
    ck_assert_str_eq(fg_last_error(), "");
    ck_assert(fg_last_status() == FG_OK);
    pthread_t t;
    void *res = NULL;
    ck_assert(pthread_create(&t, NULL, thread_fail, NULL) == 0);
    ck_assert(pthread_join(t, &res) == 0);
    ck_assert_msg(res == (void *)1, "thread saw no message");
    ck_assert_str_eq(fg_last_error(), ""); /* main thread unaffected */
}
END_TEST

START_TEST(test_status_strings)
{
    for (int s = FG_OK; s <= FG_ERR_COMM; s++) {
        const char *str = fg_status_string((fg_status)s);
        ck_assert(str && *str && strcmp(str, "unknown status") != 0);
    }
    ck_assert_str_eq(fg_status_string((fg_status)99), "unknown status");
    ck_assert_str_eq(fg_dtype_name(FG_BF16), "bf16");
    ck_assert_uint_eq(fg_dtype_size(FG_FP64), 8);
    ck_assert_uint_eq(fg_dtype_size((fg_dtype)9), 0);
    ck_assert(strlen(fg_version()) >= 5);
    ck_assert_uint_eq(fg_dropout_threshold(0.0), 1u << 24);
    ck_assert_uint_eq(fg_dropout_threshold(0.5), 1u << 23);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("core");
    fgt_add_loop(tc, test_bad_input, 0, (int)(sizeof bad / sizeof bad[0]));
    fgt_add_test(tc, test_cuda_device_host_pointer);
    fgt_add_test(tc, test_attention_tf32_switch);
    fgt_add_test(tc, test_gemm_autotune_switch);
    fgt_add_test(tc, test_null_structs);
    fgt_add_test(tc, test_thread_local);
    fgt_add_test(tc, test_status_strings);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
