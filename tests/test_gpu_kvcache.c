/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_kvcache.c - the GPT's KV cache on the GPU, for every
 * attention variant: cached logits equal the full forward's (fp64 to
 * 1e-10, fp32 to 1e-4, bf16 autocast to 3e-2 of the largest logit), and in
 * fp64 sampling with the cache gives the recomputing sampler's tokens
 * (greedy and seeded, past the context; fp32 and bf16 round the one-row
 * products differently from the T-row ones, so nearly tied logits of a
 * random model may part there). Exits 77 without a GPU (CUDA is touched
 * only inside the forked tests). */
#include "test_ops_util.h"
#include "kvcache_check.h"

#include "flashgrad/cuda.h"

/* Under compute-sanitizer (every launch slowed by the tool): shorter
 * contexts and chunks, the same code paths; 2 (FG_SANITIZE=fast, racecheck,
 * the slowest tool) the shortest. */
static int g_sanitize;
static int ctx_len(void) { return g_sanitize == 2 ? 6 : g_sanitize ? 12 : 40; }
static int chunk_len(void) { return g_sanitize == 2 ? 3 : g_sanitize ? 5 : 17; }

START_TEST(test_cached_logits_gpu)
{
    const kvc_variant *v = &KVC_VARIANTS[_i];
    fgt_rng r = fgt_rng_for(300 + (uint64_t)_i);
    const fg_dtype dts[3] = {FG_FP64, FG_FP32, FG_FP32};
    const double tols[3] = {1e-10, 1e-4, 3e-2};
    for (int d = 0; d < 3; d++) {
        fg_gpt *m = kvc_model(v, dts[d], FG_DEVICE_CUDA, ctx_len(), fgt_next(&r));
        if (d == 2) /* keys, queries and products in bf16 */
            FGT_OK(fg_autocast_begin(FG_BF16));
        kvc_check_logits(m, 1, tols[d], &r);
        kvc_check_logits(m, chunk_len(), tols[d], &r);
        if (d == 2)
            FGT_OK(fg_autocast_end());
        fg_gpt_free(m);
    }
}
END_TEST

START_TEST(test_sampling_equal_gpu)
{
    const kvc_variant *v = &KVC_VARIANTS[_i];
    fgt_rng r = fgt_rng_for(400 + (uint64_t)_i);
    fg_gpt *m = kvc_model(v, FG_FP64, FG_DEVICE_CUDA, g_sanitize ? 8 : 24,
                          fgt_next(&r));
    kvc_check_sampling(m, &r);
    fg_gpt_free(m);
}
END_TEST

/* The cache's dtype is fixed by its first forward: a later one under
 * another autocast is refused (FG_ERR_STATE), and the cache is emptied. */
START_TEST(test_autocast_change_refused)
{
    fg_gpt *m = kvc_model(&KVC_VARIANTS[0], FG_FP32, FG_DEVICE_CUDA, 8, 5);
    fg_gpt_kv_cache *kv;
    FGT_OK(fg_gpt_kv_cache_create(m, 1, &kv));
    const int64_t tok[2] = {1, 2};
    fg_tensor *lg = NULL;
    FGT_OK(fg_autocast_begin(FG_BF16));
    FGT_OK(fg_gpt_forward_cached(m, kv, tok, 1, &lg));
    FGT_OK(fg_autocast_end());
    fg_tensor_free(lg);
    lg = NULL;
    FGT_FAILS(fg_gpt_forward_cached(m, kv, tok + 1, 1, &lg), FG_ERR_STATE);
    ck_assert_ptr_null(lg);
    ck_assert_int_eq(fg_gpt_kv_cache_length(kv), 0);
    fg_gpt_kv_cache_free(kv);
    fg_gpt_free(m);
}
END_TEST

int main(void)
{
    if (!fgt_gpu_present()) {
        fprintf(stderr, "no CUDA GPU: skipping the GPU KV-cache suite\n");
        return 77;
    }
    fgt_base_seed();
    Suite *s = suite_create("gpu_kvcache");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    g_sanitize = fgt_sanitize_mode();
    if (g_sanitize) {
        /* under compute-sanitizer: the plain model and the one with every
         * variant (each token is dozens of small launches); racecheck's
         * subset: the model with every variant only */
        if (g_sanitize == 1)
            fgt_add_loop(tc, test_cached_logits_gpu, 0, 1);
        fgt_add_loop(tc, test_cached_logits_gpu, KVC_NVARIANTS - 1,
                     KVC_NVARIANTS);
        if (g_sanitize == 1)
            fgt_add_loop(tc, test_sampling_equal_gpu, 0, 1);
    } else {
        fgt_add_loop(tc, test_cached_logits_gpu, 0, KVC_NVARIANTS);
        fgt_add_loop(tc, test_sampling_equal_gpu, 0, KVC_NVARIANTS);
    }
    fgt_add_test(tc, test_autocast_change_refused);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
