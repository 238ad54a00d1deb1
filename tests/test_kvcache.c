/* SPDX-License-Identifier: MIT */
/* tests/test_kvcache.c - the GPT's KV cache on the CPU: cached logits equal
 * the full forward's (fp64 to 1e-12, fp32 to 1e-5) for every attention
 * variant, sampling with the cache gives the recomputing sampler's tokens
 * (greedy and seeded, past the context), the shift mode follows its
 * policy, and bad calls are refused without changing the cache. */
#include "test_ops_util.h"
#include "kvcache_check.h"

START_TEST(test_cached_logits)
{
    const kvc_variant *v = &KVC_VARIANTS[_i];
    fgt_rng r = fgt_rng_for(100 + (uint64_t)_i);
    const fg_dtype dts[2] = {FG_FP64, FG_FP32};
    const double tols[2] = {1e-12, 1e-5};
    for (int d = 0; d < 2; d++) {
        fg_gpt *m = kvc_model(v, dts[d], FG_DEVICE_CPU, 9, fgt_next(&r));
        kvc_check_logits(m, 1, tols[d], &r); /* one token at a time */
        kvc_check_logits(m, 4, tols[d], &r); /* a prefill, then steps */
        kvc_check_logits(m, 9, tols[d], &r); /* the whole context at once */
        fg_gpt_free(m);
    }
}
END_TEST

START_TEST(test_sampling_equal)
{
    const kvc_variant *v = &KVC_VARIANTS[_i];
    fgt_rng r = fgt_rng_for(200 + (uint64_t)_i);
    const fg_dtype dts[2] = {FG_FP64, FG_FP32};
    for (int d = 0; d < 2; d++) {
        fg_gpt *m = kvc_model(v, dts[d], FG_DEVICE_CPU, 7, fgt_next(&r));
        kvc_check_sampling(m, &r);
        fg_gpt_free(m);
    }
}
END_TEST

START_TEST(test_errors)
{
    fg_gpt *m = kvc_model(&KVC_VARIANTS[0], FG_FP32, FG_DEVICE_CPU, 6, 3);
    fg_gpt *other = kvc_model(&KVC_VARIANTS[0], FG_FP32, FG_DEVICE_CPU, 6, 4);
    fg_gpt_kv_cache *kv = NULL;
    FGT_FAILS(fg_gpt_kv_cache_create(NULL, 1, &kv), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gpt_kv_cache_create(m, 0, &kv), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gpt_kv_cache_create(m, 1, NULL), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(kv);
    FGT_OK(fg_gpt_kv_cache_create(m, 1, &kv));
    ck_assert_int_eq(fg_gpt_kv_cache_length(kv), 0);
    const int64_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, bad[2] = {1, 17};
    fg_tensor *lg = NULL;
    FGT_OK(fg_gpt_forward_cached(m, kv, tok, 4, &lg));
    fg_tensor_free(lg);
    lg = NULL;
    /* refused, the cache unchanged: too long, bad ids, T = 0, NULLs, the
     * cache of another model */
    FGT_FAILS(fg_gpt_forward_cached(m, kv, tok, 3, &lg),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gpt_forward_cached(m, kv, bad, 2, &lg),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gpt_forward_cached(m, kv, tok, 0, &lg),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gpt_forward_cached(m, kv, NULL, 1, &lg),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gpt_forward_cached(m, kv, tok, 1, NULL),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_gpt_forward_cached(other, kv, tok, 1, &lg),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(lg);
    ck_assert_int_eq(fg_gpt_kv_cache_length(kv), 4);
    FGT_OK(fg_gpt_forward_cached(m, kv, tok + 4, 2, &lg)); /* fills it */
    ck_assert_int_eq(fg_gpt_kv_cache_length(kv), 6);
    fg_tensor_free(lg);
    fg_gpt_kv_cache_reset(kv);
    ck_assert_int_eq(fg_gpt_kv_cache_length(kv), 0);
    ck_assert_int_eq(fg_gpt_kv_cache_length(NULL), 0);
    fg_gpt_kv_cache_free(kv);
    fg_gpt_kv_cache_free(NULL);
    /* sampling: an unknown mode, a bad temperature */
    int64_t s[4] = {1};
    fg_sample_options o;
    fg_sample_options_init(&o);
    ck_assert_int_eq(o.mode, FG_SAMPLE_CACHE);
    o.mode = (fg_sample_mode)7;
    FGT_FAILS(fg_gpt_sample(m, s, 1, 3, &o), FG_ERR_INVALID_ARGUMENT);
    fg_gpt_free(m);
    fg_gpt_free(other);
}
END_TEST

/* NaN in a parameter reaches the cached logits as NaN (never a silent
 * number), like the full forward's. */
START_TEST(test_nan_propagates)
{
    fg_gpt *m = kvc_model(&KVC_VARIANTS[0], FG_FP64, FG_DEVICE_CPU, 5, 8);
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    fg_no_grad_begin();
    FGT_OK(fg_tensor_fill(ps[n - 1].tensor, NAN)); /* ln_f bias */
    fg_no_grad_end();
    fg_gpt_kv_cache *kv;
    FGT_OK(fg_gpt_kv_cache_create(m, 1, &kv));
    const int64_t tok[2] = {3, 4};
    fg_tensor *lg;
    FGT_OK(fg_gpt_forward_cached(m, kv, tok, 2, &lg));
    double *h = fgt_host(lg);
    for (int v = 0; v < 17; v++)
        ck_assert(isnan(h[v]));
    free(h);
    fg_tensor_free(lg);
    fg_gpt_kv_cache_free(kv);
    fg_gpt_free(m);
}
END_TEST

FGT_MAIN_BEGIN("kvcache")
FGT_LOOP(test_cached_logits, KVC_NVARIANTS)
FGT_LOOP(test_sampling_equal, KVC_NVARIANTS)
FGT_TEST(test_errors)
FGT_TEST(test_nan_propagates)
FGT_MAIN_END()
