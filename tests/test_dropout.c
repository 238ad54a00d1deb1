/* SPDX-License-Identifier: MIT */
/* tests/test_dropout.c - attention dropout: keep rate, determinism, offsets,
 * p = 0, the mask against the documented mapping (tests/ref_dropout.h),
 * and forward/backward against the naive reference with the reference's
 * mask. The GPU suite checks cuRAND's mask against the same reference;
 * Philox KATs live in test_philox. */
#include <check.h>

#include "attn_harness.h"
#include "lib/core/dropout_map.h"

/* Kept fraction over >= 10^6 elements within 5 sigma of T / 256, the
 * effective keep probability, which is within 1/512 of 1 - p. */
START_TEST(test_keep_rate)
{
    const double ps[] = {0.1, 0.5, 0.9, 0.3};
    const double p = ps[_i];
    fg_attn_params prm;
    fg_attn_params_init(&prm, 2, 500, 1003, 2, 1, 8);
    prm.dropout_p = p;
    prm.seed = fgt_next(&(fgt_rng){fgt_base_seed() + (uint64_t)_i});
    prm.offset = (uint64_t)_i * 7;
    const size_t n = 2 * 2 * 500 * 1003;
    uint8_t *mask = malloc(n);
    ck_assert(fg_attention_dropout_mask(&prm, mask) == FG_OK);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert(mask[i] <= 1);
        kept += mask[i];
    }
    const double q = fg_attention_dropout_threshold(p) / 256.0;
    const double sigma = sqrt(n * q * (1 - q));
    ck_assert_msg(fabs((double)kept - n * q) <= 5 * sigma,
                  "p=%g: kept %zu of %zu, expected %.0f +- %.0f", p, kept, n,
                  n * q, 5 * sigma);
    ck_assert(fabs(q - (1.0 - p)) <= 1.0 / 512.0);
    free(mask);
}
END_TEST

static void mask_of(uint64_t seed, uint64_t offset, uint8_t *mask)
{
    fg_attn_params prm;
    fg_attn_params_init(&prm, 2, 33, 70, 3, 1, 8);
    prm.dropout_p = 0.5;
    prm.seed = seed;
    prm.offset = offset;
    ck_assert(fg_attention_dropout_mask(&prm, mask) == FG_OK);
}

START_TEST(test_seed_offset)
{
    const size_t n = 2 * 3 * 33 * 70;
    uint8_t *a = malloc(n), *b = malloc(n);
    mask_of(11, 0, a);
    mask_of(11, 0, b);
    ck_assert(memcmp(a, b, n) == 0);
    mask_of(11, 1, b);
    ck_assert_msg(memcmp(a, b, n) != 0, "offset 1 gave the same mask");
    mask_of(11, 1ull << 32, b);
    ck_assert_msg(memcmp(a, b, n) != 0, "offset 2^32 gave the same mask");
    mask_of(12, 0, b);
    ck_assert_msg(memcmp(a, b, n) != 0, "seed 12 gave the same mask");
    mask_of(11ull | (1ull << 40), 0, b);
    ck_assert_msg(memcmp(a, b, n) != 0, "high seed bits ignored");
    /* A different offset is not just a shifted copy of the same stream. */
    size_t same = 0;
    mask_of(11, 1, b);
    for (size_t i = 0; i < n; i++)
        same += a[i] == b[i];
    ck_assert_msg(same > n / 2 - 300 && same < n / 2 + 300,
                  "masks for offsets 0 and 1 agree on %zu of %zu", same, n);
    /* The mask of an element does not depend on Nk (pure function of i, j). */
    fg_attn_params prm;
    fg_attn_params_init(&prm, 2, 33, 9, 3, 1, 8);
    prm.dropout_p = 0.5;
    prm.seed = 11;
    ck_assert(fg_attention_dropout_mask(&prm, b) == FG_OK);
    for (size_t r = 0; r < 2 * 3 * 33; r++)
        ck_assert(memcmp(a + r * 70, b + r * 9, 9) == 0);
    free(a);
    free(b);
}
END_TEST

/* The library's mask is the documented mapping's bit for bit
 * (tests/ref_dropout.h rebuilds it from attention.h with its own Philox),
 * for random seeds and offsets with their high halves set. */
START_TEST(test_mask_matches_reference)
{
    fgt_rng r = fgt_rng_for(90 + (uint64_t)_i);
    const int64_t B = fgt_int(&r, 1, 3), H = fgt_int(&r, 1, 4),
                  Nq = fgt_int(&r, 1, 40), Nk = fgt_int(&r, 1, 70);
    fg_attn_params prm;
    fg_attn_params_init(&prm, B, Nq, Nk, H, 1, 8);
    prm.dropout_p = (double)fgt_int(&r, 1, 999) / 1000.0;
    prm.seed = fgt_next(&r);
    prm.offset = fgt_next(&r);
    const size_t n = (size_t)(B * H * Nq * Nk);
    uint8_t *got = malloc(n), *want = malloc(n);
    memset(got, 7, n);
    ck_assert(fg_attention_dropout_mask(&prm, got) == FG_OK);
    ref_dropout_mask(prm.seed, prm.offset, prm.dropout_p, B, H, Nq, Nk, want);
    for (size_t e = 0; e < n; e++)
        ck_assert_msg(got[e] == want[e],
                      "element %zu of [%lld, %lld, %lld, %lld]: %d, the "
                      "documented mapping gives %d",
                      e, (long long)B, (long long)H, (long long)Nq,
                      (long long)Nk, got[e], want[e]);
    free(got);
    free(want);
}
END_TEST

/* Forward and backward with dropout equal the naive computation with the
 * same mask, across layouts, dtypes, causal, GQA and block sizes. */
START_TEST(test_against_naive)
{
    static const fgt_case cs[] = {
        {1, 33, 47, 2, 1, 16, 0, 0, FG_FP64, 0.2, 5, 0, 7, 9},
        {2, 65, 65, 2, 2, 32, 1, 1, FG_FP64, 0.5, 6, 1, 16, 16},
        {1, 80, 30, 4, 2, 8, 1, 0, FG_FP64, 0.1, 7, 2, 0, 0},
        {1, 33, 47, 2, 1, 16, 1, 1, FG_FP32, 0.3, 8, 3, 5, 11},
        {2, 129, 100, 2, 1, 64, 0, 0, FG_FP32, 0.7, 9, 4, 64, 64},
    };
    fgt_case c = cs[_i];
    fgt_result r;
    fgt_run_case(&c, 60 + (uint64_t)_i, 1, &r);
    const double tol = c.dtype == FG_FP64 ? 1e-12 : 1e-5;
    ck_assert(r.fwd == FG_OK && r.bwd == FG_OK);
    ck_assert(r.finite);
    ck_assert_msg(r.err_o <= tol, "O err %g", r.err_o);
    ck_assert_msg(r.err_m <= tol && r.err_l <= tol, "stats err %g %g", r.err_m,
                  r.err_l);
    ck_assert_msg(r.err_dq <= tol, "dQ err %g", r.err_dq);
    ck_assert_msg(r.err_dk <= tol, "dK err %g", r.err_dk);
    ck_assert_msg(r.err_dv <= tol, "dV err %g", r.err_dv);
    fgt_result_free(&r);
}
END_TEST

/* Same seed: bitwise identical outputs. p = 0: identical to no dropout
 * whatever the seed. A different offset: a different output. */
START_TEST(test_determinism_and_p0)
{
    fgt_case c = {2, 40, 50, 2, 2, 16, 1, 0, FG_FP32, 0.3, 77, 5};
    fgt_result a, b;
    fgt_run_case(&c, 81, 1, &a);
    fgt_run_case(&c, 81, 1, &b);
    ck_assert(memcmp(a.o, b.o, a.nq * 8) == 0);
    ck_assert(memcmp(a.dq, b.dq, a.nq * 8) == 0);
    ck_assert(memcmp(a.dk, b.dk, a.nk * 8) == 0);
    fgt_result_free(&b);
    c.offset = 6;
    fgt_run_case(&c, 81, 0, &b);
    ck_assert(memcmp(a.o, b.o, a.nq * 8) != 0);
    fgt_result_free(&a);
    fgt_result_free(&b);

    c.p = 0.0;
    c.seed = 0;
    c.offset = 0;
    fgt_run_case(&c, 82, 1, &a);
    c.seed = 123456;
    c.offset = 99;
    fgt_run_case(&c, 82, 1, &b);
    ck_assert(memcmp(a.o, b.o, a.nq * 8) == 0);
    ck_assert(memcmp(a.dv, b.dv, a.nk * 8) == 0);
    ck_assert(a.err_o <= 1e-5);
    fgt_result_free(&a);
    fgt_result_free(&b);
}
END_TEST

/* The CUDA backward's four-bytes-at-a-time keep test and its gather
 * (lib/core/dropout_map.h), against a byte-by-byte compare written here:
 * every threshold 0..256, every byte value in every byte position (random
 * neighbours), and random words. */
START_TEST(test_keep_bytes)
{
    fgt_rng r = fgt_rng_for(7);
    for (uint32_t t = 0; t <= 256; t++) {
        for (int n = 0; n < 4096; n++) {
            uint32_t w = (uint32_t)fgt_next(&r);
            if (n < 1024) { /* byte value n % 256 at position n / 256 */
                const int k = n >> 8;
                w = (w & ~(0xffu << (8 * k))) | ((uint32_t)(n & 255) << (8 * k));
            }
            uint32_t want = 0, bits = 0;
            for (int k = 0; k < 4; k++)
                if (((w >> (8 * k)) & 0xffu) < t) {
                    want |= 0x80u << (8 * k);
                    bits |= 1u << (4 * (k & 1) + 2 * (k >> 1));
                }
            const uint32_t got = fg_dropout_keep_bytes(w, t);
            ck_assert_msg(got == want, "t=%u w=%08x: %08x, want %08x", t, w, got, want);
            ck_assert_uint_eq(fg_dropout_gather_bytes(got, 0), bits);
            ck_assert_uint_eq(fg_dropout_gather_bytes(got, 1), bits << 1);
            ck_assert_uint_eq(fg_dropout_keep4(w, t),
                              (want >> 7 & 1) | (want >> 14 & 2) | (want >> 21 & 4) | (want >> 28 & 8));
        }
    }
}
END_TEST

int main(void)
{
    fgt_base_seed();
    Suite *s = suite_create("dropout");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    fgt_add_loop(tc, test_keep_rate, 0, 4);
    fgt_add_test(tc, test_seed_offset);
    fgt_add_loop(tc, test_mask_matches_reference, 0, 8);
    fgt_add_loop(tc, test_against_naive, 0, 5);
    fgt_add_test(tc, test_determinism_and_p0);
    fgt_add_test(tc, test_keep_bytes);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
