/* SPDX-License-Identifier: MIT */
/* tests/test_tensor.c - tensors: creation, accessors, views sharing storage,
 * host copies with dtype conversion (fp16/bf16 exhaustively), item, print,
 * the generator, arenas, and argument errors. */
#include "test_ops_util.h"
#include "lib/autograd/tensor_internal.h"

START_TEST(test_create)
{
    fg_tensor *t = NULL;
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, 3, 4), &t));
    ck_assert_int_eq(fg_tensor_ndim(t), 3);
    ck_assert_int_eq(fg_tensor_numel(t), 24);
    ck_assert_uint_eq(fg_tensor_nbytes(t), 96);
    ck_assert_int_eq(fg_tensor_size(t, -1), 4);
    ck_assert_int_eq(fg_tensor_size(t, 3), 0);
    ck_assert_int_eq(fg_tensor_strides(t)[0], 12);
    ck_assert_int_eq(fg_tensor_strides(t)[2], 1);
    ck_assert(fg_tensor_is_contiguous(t));
    ck_assert_int_eq(fg_tensor_dtype(t), FG_FP32);
    ck_assert_int_eq(fg_tensor_device(t), FG_DEVICE_CPU);
    ck_assert(((uintptr_t)fg_tensor_data(t) % 64) == 0);
    for (int i = 0; i < 24; i++)
        ck_assert(((float *)fg_tensor_data(t))[i] == 0.0f);
    fg_tensor_free(t);

    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(5), -2.5, &t));
    for (int i = 0; i < 5; i++)
        ck_assert(((double *)fg_tensor_data(t))[i] == -2.5);
    fg_tensor_free(t);

    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(3, 0), &t));
    ck_assert_int_eq(fg_tensor_numel(t), 0);
    fg_tensor_free(t);

    FGT_OK(fg_tensor_scalar(FG_FP64, FG_DEVICE_CPU, 7.25, &t));
    ck_assert_int_eq(fg_tensor_ndim(t), 0);
    ck_assert(fgt_item(t) == 7.25);
    fg_tensor_free(t);

    const double src[6] = {1, 2, 3, 4, 5, 6};
    FGT_OK(fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 3), src,
                               &t));
    ck_assert(memcmp(fg_tensor_data(t), src, sizeof src) == 0);
    /* retain/free pairs */
    ck_assert_ptr_eq(fg_tensor_retain(t), t);
    fg_tensor_free(t);
    ck_assert(((double *)fg_tensor_data(t))[5] == 6);
    fg_tensor_free(t);
    fg_tensor_free(NULL);
}
END_TEST

START_TEST(test_create_errors)
{
    fg_tensor *t = (fg_tensor *)0x1;
    int64_t big[FG_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    FGT_FAILS(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_MAX_DIMS + 1, big,
                              &t),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, -1), &t),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, 2, NULL, &t),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_tensor_zeros((fg_dtype)9, FG_DEVICE_CPU, FG_SHAPE(2), &t),
              FG_ERR_INVALID_ARGUMENT);
    if (!fg_cuda_available()) { /* no CUDA build, or no GPU: a status */
        fg_clear_error();
        fg_status cs = fg_tensor_zeros(FG_FP32, FG_DEVICE_CUDA, FG_SHAPE(2),
                                       &t);
        ck_assert_msg(cs == FG_ERR_UNSUPPORTED || cs == FG_ERR_NO_DEVICE,
                      "cuda tensor without a GPU: %s: %s",
                      fg_status_string(cs), fg_last_error());
        ck_assert(fg_last_error()[0] != '\0');
    }
    FGT_FAILS(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2), NULL),
              FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_tensor_from_host(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2), NULL,
                                  &t),
              FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_eq(t, (fg_tensor *)0x1); /* never written on failure */
    /* accessors on NULL */
    ck_assert_int_eq(fg_tensor_numel(NULL), 0);
    ck_assert_ptr_null(fg_tensor_shape(NULL));
    ck_assert_ptr_null(fg_tensor_data(NULL));
}
END_TEST

START_TEST(test_host_copies)
{
    fgt_rng r = fgt_rng_for(100);
    double h[24], back[24];
    float f[24];
    fgt_fill(h, 24, &r, 3.0);
    fg_tensor *t;
    FGT_OK(fg_tensor_empty(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, 3, 4), &t));
    FGT_OK(fg_tensor_copy_from_host(t, FG_FP64, h, 24));
    FGT_OK(fg_tensor_copy_to_host(t, FG_FP32, f, 24));
    FGT_OK(fg_tensor_copy_to_host(t, FG_FP64, back, 24));
    for (int i = 0; i < 24; i++) {
        ck_assert(f[i] == (float)h[i]);
        ck_assert(back[i] == (double)(float)h[i]);
    }
    /* Wrong count: error, destination untouched. */
    for (int i = 0; i < 24; i++)
        back[i] = 1234.5;
    FGT_FAILS(fg_tensor_copy_to_host(t, FG_FP64, back, 23),
              FG_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 24; i++)
        ck_assert(back[i] == 1234.5);
    /* Strided source: a transposed view copies out in logical order. */
    fg_tensor *tt;
    FGT_OK(fg_transpose(t, 0, 2, &tt)); /* [4, 3, 2] */
    FGT_OK(fg_tensor_copy_to_host(tt, FG_FP64, back, 24));
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++)
                ck_assert(back[(a * 3 + b) * 2 + c] ==
                          (double)(float)h[(c * 3 + b) * 4 + a]);
    fg_tensor_free(tt);
    fg_tensor_free(t);

    /* fp16 / bf16 storage: exact for representable values. */
    const double vals[6] = {0.0, -1.5, 0.25, 65504.0, -3.0517578125e-05, 2.0};
    double out[6];
    fg_tensor *h16, *b16;
    FGT_OK(fg_tensor_empty(FG_FP16, FG_DEVICE_CPU, FG_SHAPE(6), &h16));
    FGT_OK(fg_tensor_copy_from_host(h16, FG_FP64, vals, 6));
    FGT_OK(fg_tensor_copy_to_host(h16, FG_FP64, out, 6));
    for (int i = 0; i < 6; i++)
        ck_assert_msg(out[i] == vals[i], "fp16 %g -> %g", vals[i], out[i]);
    FGT_OK(fg_tensor_full(FG_BF16, FG_DEVICE_CPU, FG_SHAPE(3), 1.5, &b16));
    FGT_OK(fg_tensor_copy_to_host(b16, FG_FP64, out, 3));
    ck_assert(out[0] == 1.5 && out[2] == 1.5);
    fg_tensor_free(h16);
    fg_tensor_free(b16);
}
END_TEST

/* Every binary16 value converts to float and back to itself; rounding of
 * float -> half is to nearest even (checked against the neighbours). */
START_TEST(test_half_conversion)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fg_half_to_float((uint16_t)h);
        if (isnan(f)) {
            ck_assert(isnan(fg_half_to_float(fg_float_to_half(f))));
            continue;
        }
        ck_assert_msg(fg_float_to_half(f) == h, "half %04x -> %g -> %04x", h,
                      f, fg_float_to_half(f));
        uint16_t b = (uint16_t)h;
        ck_assert(fg_float_to_bf16(fg_bf16_to_float(b)) == b ||
                  isnan(fg_bf16_to_float(b)));
    }
    /* Ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 -> even (1). */
    ck_assert_uint_eq(fg_float_to_half(1.0f + 0x1p-11f), 0x3c00);
    ck_assert_uint_eq(fg_float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);
    ck_assert_uint_eq(fg_float_to_half(70000.0f), 0x7c00); /* overflow */
    ck_assert_uint_eq(fg_float_to_half(0x1p-25f), 0x0000); /* tie to 0 */
    ck_assert_uint_eq(fg_float_to_half(0x1.8p-25f), 0x0001);
    ck_assert_uint_eq(fg_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
}
END_TEST

START_TEST(test_views_share_storage)
{
    fgt_rng r = fgt_rng_for(101);
    fg_tensor *x = fgt_rand(&r, FG_FP64, FG_SHAPE(4, 6), 1.0, 0, 0);
    double *hx = fgt_host(x);
    fg_tensor *v[6];
    FGT_OK(fg_reshape(x, FG_SHAPE(2, -1, 3), &v[0])); /* [2, 4, 3] view */
    ck_assert_int_eq(fg_tensor_size(v[0], 1), 4);
    FGT_OK(fg_transpose(x, 0, 1, &v[1]));              /* [6, 4] */
    ck_assert(!fg_tensor_is_contiguous(v[1]));
    FGT_OK(fg_slice(x, 1, -5, 100, 2, &v[2]));         /* cols 1, 3, 5 */
    ck_assert_int_eq(fg_tensor_size(v[2], 1), 3);
    FGT_OK(fg_narrow(x, 0, 1, 2, &v[3]));              /* rows 1, 2 */
    int perm[2] = {1, 0};
    FGT_OK(fg_permute(x, perm, &v[4]));
    FGT_OK(fg_detach(x, &v[5]));
    for (int i = 0; i < 6; i++)
        ck_assert(fg_tensor_shares_storage(x, v[i]));
    double e;
    FGT_FAILS(fg_tensor_copy_to_host(v[2], FG_FP64, &e, 1),
              FG_ERR_INVALID_ARGUMENT);
    double sl[12];
    FGT_OK(fg_tensor_copy_to_host(v[2], FG_FP64, sl, 12));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            ck_assert(sl[i * 3 + j] == hx[i * 6 + 1 + 2 * j]);
    /* A write through a view is seen by the base. */
    FGT_OK(fg_tensor_fill(v[3], 9.0));
    double *after = fgt_host(x);
    for (int i = 0; i < 24; i++)
        ck_assert(after[i] == ((i / 6 == 1 || i / 6 == 2) ? 9.0 : hx[i]));
    /* Reshape of a non-viewable layout copies. */
    fg_tensor *c;
    FGT_OK(fg_reshape(v[1], FG_SHAPE(24), &c));
    ck_assert(!fg_tensor_shares_storage(c, x));
    fg_tensor *same;
    FGT_OK(fg_contiguous(x, &same));
    ck_assert_ptr_eq(same, x);
    fg_tensor_free(same);
    FGT_OK(fg_contiguous(v[1], &same));
    ck_assert(fg_tensor_is_contiguous(same) && same != v[1]);
    fg_tensor_free(same);
    /* Reshape to split a dimension of a slice stays a view (fused QKV). */
    fg_tensor *qkv, *q, *q4;
    FGT_OK(fg_tensor_zeros(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 5, 48), &qkv));
    FGT_OK(fg_narrow(qkv, 2, 16, 16, &q));
    FGT_OK(fg_reshape(q, FG_SHAPE(2, 5, 2, 8), &q4));
    ck_assert(fg_tensor_shares_storage(q4, qkv));
    ck_assert_int_eq(fg_tensor_strides(q4)[1], 48);
    ck_assert_int_eq(fg_tensor_strides(q4)[2], 8);
    fg_tensor *bad;
    FGT_FAILS(fg_reshape(x, FG_SHAPE(5, -1), &bad), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_narrow(x, 0, 3, 2, &bad), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_slice(x, 0, 0, 2, 0, &bad), FG_ERR_INVALID_ARGUMENT);
    int badperm[2] = {0, 0};
    FGT_FAILS(fg_permute(x, badperm, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_tensor_free(qkv);
    fg_tensor_free(q);
    fg_tensor_free(q4);
    fg_tensor_free(c);
    fgt_free_all(v, 6);
    fg_tensor_free(x);
    free(hx);
    free(after);
}
END_TEST

START_TEST(test_item_fill_copy)
{
    fg_tensor *a, *b, *s;
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(2, 2), &a));
    double v;
    FGT_FAILS(fg_tensor_item(a, &v), FG_ERR_INVALID_ARGUMENT);
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(1, 1), 3.0, &s));
    ck_assert(fgt_item(s) == 3.0);
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 2), 0.5, &b));
    FGT_OK(fg_tensor_copy(a, b)); /* fp64 -> fp32 */
    ck_assert(((float *)fg_tensor_data(a))[3] == 0.5f);
    fg_tensor *at;
    FGT_OK(fg_transpose(a, 0, 1, &at));
    FGT_FAILS(fg_tensor_copy(a, at), FG_ERR_INVALID_ARGUMENT); /* overlap */
    FGT_FAILS(fg_tensor_copy(a, s), FG_ERR_INVALID_ARGUMENT);  /* shape */
    /* Leaves requiring grad refuse in-place writes unless no_grad. */
    FGT_OK(fg_tensor_set_requires_grad(b, 1));
    FGT_FAILS(fg_tensor_fill(b, 1.0), FG_ERR_STATE);
    ck_assert(((double *)fg_tensor_data(b))[0] == 0.5);
    fg_no_grad_begin();
    FGT_OK(fg_tensor_fill(b, 1.0));
    FGT_OK(fg_no_grad_end());
    ck_assert(((double *)fg_tensor_data(b))[0] == 1.0);
    fg_tensor_free(at);
    fg_tensor_free(a);
    fg_tensor_free(b);
    fg_tensor_free(s);
}
END_TEST

START_TEST(test_print)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    fg_tensor *t, *big;
    const double src[6] = {1, 2, 3, 4, 5, 6.5};
    FGT_OK(fg_tensor_from_host(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 3), src,
                               &t));
    FGT_OK(fg_tensor_print(t, "t", f));
    FGT_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(20, 20), &big));
    FGT_OK(fg_tensor_print(big, NULL, f));
    fclose(f);
    ck_assert_msg(strstr(buf, "t: tensor fp64 cpu shape [2, 3]") != NULL, "%s",
                  buf);
    ck_assert_msg(strstr(buf, "[[1, 2, 3],\n [4, 5, 6.5]]") != NULL, "%s", buf);
    ck_assert_msg(strstr(buf, "...") != NULL, "%s", buf);
    free(buf);
    fg_tensor_free(t);
    fg_tensor_free(big);
}
END_TEST

START_TEST(test_generator)
{
    fg_generator g, g2;
    fg_generator_init(&g, fgt_base_seed());
    g2 = g;
    fg_tensor *a, *b, *c, *n;
    FGT_OK(fg_tensor_rand_uniform(&g, -2, 3, FG_FP64, FG_DEVICE_CPU,
                                  FG_SHAPE(1001), &a));
    FGT_OK(fg_tensor_rand_uniform(&g2, -2, 3, FG_FP64, FG_DEVICE_CPU,
                                  FG_SHAPE(1001), &b));
    ck_assert_int_eq(g.offset, 1);
    ck_assert(memcmp(fg_tensor_data(a), fg_tensor_data(b), 1001 * 8) == 0);
    FGT_OK(fg_tensor_rand_uniform(&g, -2, 3, FG_FP64, FG_DEVICE_CPU,
                                  FG_SHAPE(1001), &c));
    ck_assert(memcmp(fg_tensor_data(a), fg_tensor_data(c), 1001 * 8) != 0);
    const double *pa = fg_tensor_data(a);
    double mn = 1e9, mx = -1e9;
    for (int i = 0; i < 1001; i++) {
        mn = pa[i] < mn ? pa[i] : mn;
        mx = pa[i] > mx ? pa[i] : mx;
    }
    ck_assert(mn >= -2 && mx < 3 && mx - mn > 4.5);
    /* Normal: 40000 samples, mean and std within 5 standard errors. */
    FGT_OK(fg_tensor_rand_normal(&g, 1.0, 2.0, FG_FP32, FG_DEVICE_CPU,
                                 FG_SHAPE(200, 200), &n));
    const float *pn = fg_tensor_data(n);
    double s = 0, s2 = 0;
    for (int i = 0; i < 40000; i++) {
        s += pn[i];
        s2 += (double)pn[i] * pn[i];
    }
    double mean = s / 40000, sd = sqrt(s2 / 40000 - mean * mean);
    ck_assert_msg(fabs(mean - 1.0) < 5 * 2.0 / 200, "mean %g", mean);
    ck_assert_msg(fabs(sd - 2.0) < 0.05, "std %g", sd);
    uint64_t seed, off;
    FGT_OK(fg_generator_next(&g, &seed, &off));
    ck_assert(seed == fgt_base_seed() && off == 3 && g.offset == 4);
    FGT_FAILS(fg_generator_next(NULL, &seed, &off), FG_ERR_INVALID_ARGUMENT);
    fg_tensor *bad;
    FGT_FAILS(fg_tensor_rand_uniform(&g, 1, 0, FG_FP32, FG_DEVICE_CPU,
                                     FG_SHAPE(2), &bad),
              FG_ERR_INVALID_ARGUMENT);
    fg_tensor_free(a);
    fg_tensor_free(b);
    fg_tensor_free(c);
    fg_tensor_free(n);
}
END_TEST

START_TEST(test_arena_basics)
{
    fg_arena *a;
    fg_arena_stats st;
    FGT_OK(fg_arena_create(4096, &a));
    FGT_FAILS(fg_arena_pop(a), FG_ERR_STATE);
    FGT_OK(fg_arena_push(a));
    fg_tensor *x, *y, *z;
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(100, 100), &x));
    FGT_OK(fg_scale(x, 2.0, &y));
    FGT_OK(fg_arena_get_stats(a, &st));
    ck_assert_uint_eq(st.live_objects, 4); /* 2 tensors + 2 storages */
    ck_assert_uint_ge(st.chunk_allocs, 2); /* 4 KiB could not hold them */
    fg_tensor_free(y); /* its blocks go to the free list ... */
    FGT_OK(fg_scale(x, 3.0, &z)); /* ... and are reused */
    fg_arena_stats st2;
    FGT_OK(fg_arena_get_stats(a, &st2));
    ck_assert_uint_eq(st2.used, st.used);
    ck_assert(((float *)fg_tensor_data(z))[9999] == 3.0f);
    FGT_FAILS(fg_arena_pop(NULL), FG_ERR_STATE); /* not the top */
    FGT_OK(fg_arena_pop(a));
    /* Reset with live handles: they are taken back, no leak. */
    FGT_OK(fg_arena_reset(a));
    FGT_OK(fg_arena_get_stats(a, &st));
    ck_assert_uint_eq(st.live_objects, 0);
    ck_assert_uint_eq(st.used, 0);
    ck_assert_uint_ge(st.capacity, st2.used);
    ck_assert_uint_ge(st.high_water, st2.used);
    /* Merged into one chunk: the same work now needs no new chunk. */
    uint64_t chunks = st.chunk_allocs;
    FGT_OK(fg_arena_push(a));
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(100, 100), &x));
    FGT_OK(fg_scale(x, 2.0, &y));
    FGT_OK(fg_arena_pop(a));
    FGT_OK(fg_arena_get_stats(a, &st));
    ck_assert_uint_eq(st.chunk_allocs, chunks);
    /* Ops on arena inputs with no arena pushed allocate in the input's. */
    FGT_OK(fg_scale(y, 2.0, &z));
    FGT_OK(fg_arena_get_stats(a, &st2));
    ck_assert_uint_eq(st2.live_objects, st.live_objects + 2);
    fg_arena_free(a);
    FGT_FAILS(fg_arena_create(0, NULL), FG_ERR_INVALID_ARGUMENT);
    FGT_FAILS(fg_arena_get_stats(NULL, &st), FG_ERR_INVALID_ARGUMENT);
    /* push(NULL) forces the heap */
    FGT_OK(fg_arena_push(NULL));
    FGT_OK(fg_tensor_ones(FG_FP32, FG_DEVICE_CPU, FG_SHAPE(3), &x));
    FGT_OK(fg_arena_pop(NULL));
    fg_tensor_free(x);
}
END_TEST

FGT_MAIN_BEGIN("tensor")
FGT_TEST(test_create)
FGT_TEST(test_create_errors)
FGT_TEST(test_host_copies)
FGT_TEST(test_half_conversion)
FGT_TEST(test_views_share_storage)
FGT_TEST(test_item_fill_copy)
FGT_TEST(test_print)
FGT_TEST(test_generator)
FGT_TEST(test_arena_basics)
FGT_MAIN_END()
