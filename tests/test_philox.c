/* SPDX-License-Identifier: MIT */
/* tests/test_philox.c - the host Philox4x32-10 and -7 against published
 * known-answer vectors (Random123's kat_vectors for philox4x32_10, which
 * cuRAND's generator reproduces, and philox4x32_7, the attention dropout's
 * generator), and the dropout word mapping of attention.h: the keep bit of
 * chosen elements (b, h, i, j) rebuilt from the documented formula with the
 * test's own Philox (ref_dropout.h), which passes the same known answers,
 * and two words pinned by value. */
#include <check.h>
#include <stdlib.h>

#include "lib/core/dropout_map.h"
#include "lib/core/philox.h"
#include "ref_dropout.h"
#include "test_util.h"

typedef struct { int rounds; fg_u32x4 ctr; fg_u32x2 key; fg_u32x4 out; } kat;

static const kat kats[] = {
    {10, {0, 0, 0, 0}, {0, 0},
     {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {10, {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {10, {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    {7, {0, 0, 0, 0}, {0, 0},
     {0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}},
    {7, {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}},
    {7, {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}},
};
#define N_KATS ((int)(sizeof kats / sizeof kats[0]))

START_TEST(test_kat)
{
    const kat *t = &kats[_i];
    const fg_u32x4 r = t->rounds == 7 ? fg_philox4x32_7(t->ctr, t->key)
                                      : fg_philox4x32_10(t->ctr, t->key);
    ck_assert_msg(r.x == t->out.x && r.y == t->out.y && r.z == t->out.z &&
                      r.w == t->out.w,
                  "KAT %d (%d rounds): got %08x %08x %08x %08x", _i, t->rounds,
                  r.x, r.y, r.z, r.w);
    /* the attention dropout's generator is the seven-round one */
    if (t->rounds == 7) {
        const fg_u32x4 d = fg_dropout_philox(t->ctr, t->key);
        ck_assert(d.x == r.x && d.y == r.y && d.z == r.z && d.w == r.w);
    }
    /* The reference the mapping tests rely on passes them too. */
    const uint32_t c[4] = {t->ctr.x, t->ctr.y, t->ctr.z, t->ctr.w};
    const uint32_t k[2] = {t->key.x, t->key.y};
    uint32_t o[4];
    ref_philox4x32(c, k, t->rounds, o);
    ck_assert_msg(o[0] == t->out.x && o[1] == t->out.y && o[2] == t->out.z &&
                      o[3] == t->out.w,
                  "reference KAT %d: got %08x %08x %08x %08x", _i, o[0], o[1],
                  o[2], o[3]);
}
END_TEST

/* The keep bit of element (b, h, i, j) as fg_attention_dropout_mask
 * reports it (a [B, H, Nq, Nk] mask just large enough). */
static int library_keep(uint64_t seed, uint64_t offset, double p, int64_t H,
                        int64_t b, int64_t h, int64_t i, int64_t j)
{
    fg_attn_params prm;
    fg_attn_params_init(&prm, b + 1, i + 1, j + 1, H, 1, 8);
    prm.dropout_p = p;
    prm.seed = seed;
    prm.offset = offset;
    const size_t n = (size_t)((b + 1) * H * (i + 1) * (j + 1));
    uint8_t *mask = malloc(n);
    ck_assert(fg_attention_dropout_mask(&prm, mask) == FG_OK);
    const int keep = mask[((b * H + h) * (i + 1) + i) * (j + 1) + j];
    free(mask);
    return keep;
}

/* Three elements of one call pinned by value: seed 0x0123456789abcdef,
 * offset 0xfedcba9876543210, H = 4, (b, h) = (1, 2) give key
 * {0x89abcdef, 0x01234567 ^ 0xfedcba98}; (i, j) = (3, 5), (11, 12) and
 * (3, 21) all have counter {(j / 32) * 4 + (j / 2) % 4 = 2, (i / 16) * 8 +
 * i % 8 = 3, 6, 0x76543210}, whose Philox4x32-7 words are 377cdc2e
 * c53c62aa 435e0ea6 e3a01d9d. (3, 5) reads word 1, byte 0 (0xaa = 170);
 * (11, 12) word 0, byte 3 (0x37 = 55); (3, 21) word 3, byte 0 (0x9d =
 * 157). T = round((1 - p) 256): T(0.3) = 179, T(0.35) = 166, T(0.4) =
 * 154, T(0.7) = 77, T(0.8) = 51. */
START_TEST(test_mapping_pinned)
{
    const uint64_t seed = 0x0123456789abcdefull, off = 0xfedcba9876543210ull;
    const uint32_t ctr[4] = {2, 3, 6, 0x76543210u};
    const uint32_t key[2] = {0x89abcdefu, 0x01234567u ^ 0xfedcba98u};
    const fg_u32x4 r = fg_dropout_philox((fg_u32x4){ctr[0], ctr[1], ctr[2],
                                                    ctr[3]},
                                         (fg_u32x2){key[0], key[1]});
    ck_assert(r.x == 0x377cdc2eu && r.y == 0xc53c62aau &&
              r.z == 0x435e0ea6u && r.w == 0xe3a01d9du);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.05), 243);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.1), 230);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.2), 205);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.3), 179);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.35), 166);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.4), 154);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.7), 77);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.8), 51);
    ck_assert_int_eq(fg_attention_dropout_threshold(0.0), 256);
    ck_assert_int_eq(library_keep(seed, off, 0.3, 4, 1, 2, 3, 5), 1);
    ck_assert_int_eq(library_keep(seed, off, 0.35, 4, 1, 2, 3, 5), 0);
    ck_assert_int_eq(library_keep(seed, off, 0.7, 4, 1, 2, 11, 12), 1);
    ck_assert_int_eq(library_keep(seed, off, 0.8, 4, 1, 2, 11, 12), 0);
    ck_assert_int_eq(library_keep(seed, off, 0.35, 4, 1, 2, 3, 21), 1);
    ck_assert_int_eq(library_keep(seed, off, 0.4, 4, 1, 2, 3, 21), 0);
}
END_TEST

/* Random elements, seeds and offsets (high halves included, so the key's
 * hi32(seed) ^ hi32(offset) and every counter word matter): the library's
 * keep bit is the documented formula's. */
START_TEST(test_mapping_random)
{
    fgt_rng rng = fgt_rng_for(17);
    for (int t = 0; t < 200; t++) {
        const uint64_t seed = fgt_next(&rng), off = fgt_next(&rng);
        const double p = (double)fgt_int(&rng, 1, 99) / 100.0;
        const int64_t H = fgt_int(&rng, 1, 5), b = fgt_int(&rng, 0, 2),
                      h = fgt_int(&rng, 0, H - 1), i = fgt_int(&rng, 0, 70),
                      j = fgt_int(&rng, 0, 140);
        ck_assert_msg(library_keep(seed, off, p, H, b, h, i, j) ==
                          ref_dropout_keep(seed, off, p, H, b, h, i, j),
                      "seed %016llx offset %016llx p %g H %lld (b, h, i, j) "
                      "= (%lld, %lld, %lld, %lld)",
                      (unsigned long long)seed, (unsigned long long)off, p,
                      (long long)H, (long long)b, (long long)h, (long long)i,
                      (long long)j);
    }
}
END_TEST

int main(void)
{
    fgt_base_seed();
    Suite *s = suite_create("philox");
    TCase *tc = tcase_create("kat");
    fgt_add_loop(tc, test_kat, 0, N_KATS);
    fgt_add_test(tc, test_mapping_pinned);
    fgt_add_test(tc, test_mapping_random);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
