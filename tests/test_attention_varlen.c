/* SPDX-License-Identifier: MIT */
/* tests/test_attention_varlen.c - packed variable-length batches
 * (cu_seqlens_q/k) and key padding (seqused_k) on the CPU against the
 * naive fp64 reference run on each sequence alone (tests/naive_attention.c),
 * with every variant (causal both alignments, window, ALiBi, softcap,
 * dropout, GQA); equivalences with dense calls; the rejection of bad
 * offsets with nothing written.
 * Tolerances (max-abs error relative to max |reference|, gradients with a
 * 0.1 floor): fp64 1e-12, fp32 2e-5, as test_attention_variants. */
#include <check.h>

#include "varlen_harness.h"

#define TOL_F64 1e-12
#define TOL_F32 2e-5

/* Runs c through the library on the CPU in c's dtype. */
static void run_cpu(const vl_case *c, const vl_data *d, vl_out *r,
                    fg_status *fwd, fg_status *bwd)
{
    vl_run(c, d, c->dtype, NULL, r, fwd, bwd);
}

#define VSHAPE "B=%lld H=%lld Hk=%lld d=%lld causal=%d tl=%d win=%d cap=%g " \
               "alibi=%d p=%g used=%d %s Br=%d Bc=%d"
#define VARGS (long long)c->B, (long long)c->H, (long long)c->Hk,          \
              (long long)c->d, c->causal, c->top_left, c->window,          \
              c->softcap, c->alibi, c->p, c->use_used,                     \
              fg_dtype_name(c->dtype), c->block_q, c->block_k

static void check_case(const vl_case *c, uint64_t salt)
{
    vl_data d;
    vl_make(c, salt, &d);
    vl_out r, ref;
    fg_status fwd, bwd;
    run_cpu(c, &d, &r, &fwd, &bwd);
    ck_assert_msg(fwd == FG_OK, "forward: %s", fg_last_error());
    ck_assert_msg(bwd == FG_OK, "backward: %s", fg_last_error());
    vl_reference(c, &d, &ref);
    const vl_err e = vl_compare(c, &d, &r, &ref);
    const double tol = c->dtype == FG_FP64 ? TOL_F64 : TOL_F32;
    ck_assert_msg(r.tails_nan, "a row past cu_seqlens[B] was written");
    ck_assert_msg(e.o <= tol, "O err %.3g, " VSHAPE, e.o, VARGS);
    ck_assert_msg(e.m <= tol, "m err %.3g, " VSHAPE, e.m, VARGS);
    ck_assert_msg(e.l <= tol, "l err %.3g, " VSHAPE, e.l, VARGS);
    ck_assert_msg(e.dq <= tol, "dQ err %.3g, " VSHAPE, e.dq, VARGS);
    ck_assert_msg(e.dk <= tol, "dK err %.3g, " VSHAPE, e.dk, VARGS);
    ck_assert_msg(e.dv <= tol, "dV err %.3g, " VSHAPE, e.dv, VARGS);
    vl_out_free(&r);
    vl_out_free(&ref);
    vl_free(&d);
}

static void set_lengths(vl_case *c, int64_t B, const int32_t *lq,
                        const int32_t *lk)
{
    c->B = B;
    for (int64_t b = 0; b < B; b++) {
        c->lq[b] = lq[b];
        c->lk[b] = lk ? lk[b] : lq[b];
    }
}

/* Mixed lengths with a zero-length sequence, lq != lk both ways, a
 * one-token batch, all keys padded, each variant and combinations. */
static vl_case grid_case(int i)
{
    static const int32_t mixed[] = {5, 0, 17, 64, 1, 33};
    static const int32_t lq2[] = {3, 20, 0, 9, 40}, lk2[] = {10, 7, 5, 0, 41};
    static const int32_t one[] = {1};
    vl_case c = {0};
    c.H = 2; c.Hk = 1; c.d = 16;
    switch (i) {
    case 0: /* bottom-right causal, GQA, tail rows */
        set_lengths(&c, 6, mixed, NULL);
        c.causal = 1; c.H = 4; c.Hk = 2; c.pad_q = 3; c.pad_k = 2;
        break;
    case 1: /* bottom-right causal, lq != lk (rows with no key) */
        set_lengths(&c, 5, lq2, lk2); c.causal = 1;
        break;
    case 2: /* top-left causal, lq != lk */
        set_lengths(&c, 5, lq2, lk2); c.causal = 1; c.top_left = 1;
        break;
    case 3: /* window + ALiBi [B, H] + softcap, heads-major storage */
        set_lengths(&c, 5, lq2, lk2); c.window = 1; c.window_left = 4;
        c.window_right = 2; c.alibi = 2; c.softcap = 3.0; c.hmajor = 1;
        break;
    case 4: /* dropout + GQA + causal + key padding */
        set_lengths(&c, 6, mixed, NULL); c.causal = 1; c.H = 4; c.Hk = 1;
        c.p = 0.2; c.seed = 99; c.offset = 5; c.use_used = 1;
        for (int b = 0; b < 6; b++)
            c.used[b] = mixed[b] / 2;
        break;
    case 5: /* one token */
        set_lengths(&c, 1, one, NULL); c.causal = 1;
        break;
    case 6: /* every key padded: every row sees nothing */
        set_lengths(&c, 5, lq2, lk2); c.use_used = 1; c.alibi = 1;
        break;
    default: /* everything: top-left, window, ALiBi [H], softcap, dropout,
              * key padding, heads-major, tail rows */
        set_lengths(&c, 5, lq2, lk2); c.causal = 1; c.top_left = 1;
        c.window = 1; c.window_left = 6; c.window_right = -1; c.alibi = 1;
        c.softcap = 2.0; c.p = 0.1; c.seed = 3; c.use_used = 1;
        c.hmajor = 1; c.pad_q = 4; c.pad_k = 1; c.H = 4; c.Hk = 2;
        for (int b = 0; b < 5; b++)
            c.used[b] = lk2[b] - lk2[b] / 3;
        break;
    }
    return c;
}
#define N_GRID 8

START_TEST(test_varlen_grid)
{
    const int blocks[][2] = {{0, 0}, {16, 16}, {7, 13}, {64, 5}};
    for (int dt = 0; dt < 2; dt++) {
        vl_case c = grid_case(_i);
        c.dtype = dt ? FG_FP32 : FG_FP64;
        c.block_q = blocks[(_i + dt) % 4][0];
        c.block_k = blocks[(_i + dt) % 4][1];
        c.threads = 1 + (_i % 3);
        check_case(&c, 5000 + (uint64_t)_i * 2 + (uint64_t)dt);
    }
}
END_TEST

/* Random lengths and options on every run, drawn from the test seed. */
START_TEST(test_varlen_random)
{
    fgt_rng rng = fgt_rng_for(717 + (uint64_t)_i);
    vl_case c;
    vl_random(&rng, 70, 3, 30, &c);
    c.block_q = (int)fgt_int(&rng, 0, 40);
    c.block_k = (int)fgt_int(&rng, 0, 40);
    c.threads = (int)fgt_int(&rng, 0, 3);
    c.dtype = fgt_int(&rng, 0, 1) ? FG_FP32 : FG_FP64;
    check_case(&c, 6000 + (uint64_t)_i);
}
END_TEST

/* Every row with no visible key (zero-length key sequences, all keys
 * padded, rows above a bottom-right diagonal) has O = 0, m = -inf,
 * l = 0, dQ = 0; padded keys get dK = dV = 0. */
START_TEST(test_empty_rows)
{
    vl_case c = grid_case(6);
    c.dtype = FG_FP32;
    vl_data d;
    vl_make(&c, 77, &d);
    vl_out r;
    fg_status fwd, bwd;
    run_cpu(&c, &d, &r, &fwd, &bwd);
    ck_assert_msg(fwd == FG_OK && bwd == FG_OK, "%s", fg_last_error());
    for (int64_t h = 0; h < c.H; h++)
        for (int64_t t = 0; t < d.cu_q[c.B]; t++) {
            ck_assert(isinf(r.m[h * d.total_q + t]) && r.m[h * d.total_q + t] < 0);
            ck_assert(r.l[h * d.total_q + t] == 0);
        }
    for (int64_t i = 0; i < d.cu_q[c.B] * c.H * c.d; i++)
        ck_assert(r.o[i] == 0 && r.dq[i] == 0);
    for (int64_t i = 0; i < d.cu_k[c.B] * c.Hk * c.d; i++)
        ck_assert(r.dk[i] == 0 && r.dv[i] == 0);
    vl_out_free(&r);
    vl_free(&d);
}
END_TEST

/* Sequence b of the packed run == a dense call on that sequence alone
 * (same tiles, same code: equal to the last bit on the CPU). */
START_TEST(test_equals_dense_per_sequence)
{
    static const int32_t lq[] = {7, 30, 1, 64}, lk[] = {9, 30, 12, 50};
    vl_case c = {0};
    set_lengths(&c, 4, lq, lk);
    c.H = 4; c.Hk = 2; c.d = 24; c.causal = 1; c.alibi = 1; c.softcap = 4.0;
    c.window = 1; c.window_left = 20; c.window_right = -1;
    c.dtype = _i ? FG_FP32 : FG_FP64;
    vl_data d;
    vl_make(&c, 88 + (uint64_t)_i, &d);
    vl_out r;
    fg_status fwd, bwd;
    run_cpu(&c, &d, &r, &fwd, &bwd);
    ck_assert_msg(fwd == FG_OK && bwd == FG_OK, "%s", fg_last_error());
    for (int64_t b = 0; b < c.B; b++) {
        vl_case s = c;
        const int32_t q1[] = {lq[b]}, k1[] = {lk[b]};
        set_lengths(&s, 1, q1, k1);
        vl_data sd = d; /* the sequence's rows of the same inputs */
        sd.cu_q[1] = lq[b];
        sd.cu_k[1] = lk[b];
        sd.Nq = lq[b];
        sd.Nk = lk[b];
        sd.total_q = lq[b];
        sd.total_k = lk[b];
        sd.q = d.q + d.cu_q[b] * c.H * c.d;
        sd.g = d.g + d.cu_q[b] * c.H * c.d;
        sd.k = d.k + d.cu_k[b] * c.Hk * c.d;
        sd.v = d.v + d.cu_k[b] * c.Hk * c.d;
        vl_out one;
        s.dense = 1; /* a plain dense call */
        run_cpu(&s, &sd, &one, &fwd, &bwd);
        ck_assert_msg(fwd == FG_OK && bwd == FG_OK, "%s", fg_last_error());
        const size_t nq = (size_t)(lq[b] * c.H * c.d);
        const size_t nk = (size_t)(lk[b] * c.Hk * c.d);
        const size_t oq = (size_t)(d.cu_q[b] * c.H * c.d);
        const size_t ok = (size_t)(d.cu_k[b] * c.Hk * c.d);
        ck_assert(memcmp(one.o, r.o + oq, nq * sizeof(double)) == 0);
        ck_assert(memcmp(one.dq, r.dq + oq, nq * sizeof(double)) == 0);
        ck_assert(memcmp(one.dk, r.dk + ok, nk * sizeof(double)) == 0);
        ck_assert(memcmp(one.dv, r.dv + ok, nk * sizeof(double)) == 0);
        for (int64_t h = 0; h < c.H; h++)
            for (int64_t i = 0; i < lq[b]; i++) {
                ck_assert(one.m[h * lq[b] + i] == r.m[h * d.total_q + d.cu_q[b] + i]);
                ck_assert(one.l[h * lq[b] + i] == r.l[h * d.total_q + d.cu_q[b] + i]);
            }
        vl_out_free(&one);
    }
    vl_out_free(&r);
    vl_free(&d);
}
END_TEST

/* Dense [B, N, H, d] fp64 operands of the seqused_k test. */
enum { SB = 3, SNQ = 40, SNK = 50, SH = 2, SD = 16 };
typedef struct sq_run {
    double o[SB * SNQ * SH * SD], dq[SB * SNQ * SH * SD];
    double dk[SB * SNK * SH * SD], dv[SB * SNK * SH * SD];
    double m[SB * SH * SNQ], l[SB * SH * SNQ];
} sq_run;

/* Forward + backward of batches [b, b + nb) of in (q, k, v, dO) with p
 * (batch = nb) into r at the same offsets. */
static void sq_call(const fg_attn_params *p, double *const *in, int64_t b,
                    sq_run *r)
{
    const int64_t qo = b * SNQ * SH * SD, ko = b * SNK * SH * SD;
    fg_attn_tensor t[8] = {
        fg_attn_bshd(in[0] + qo, FG_FP64, SNQ, SH, SD),
        fg_attn_bshd(in[1] + ko, FG_FP64, SNK, SH, SD),
        fg_attn_bshd(in[2] + ko, FG_FP64, SNK, SH, SD),
        fg_attn_bshd(in[3] + qo, FG_FP64, SNQ, SH, SD),
        fg_attn_bshd(r->o + qo, FG_FP64, SNQ, SH, SD),
        fg_attn_bshd(r->dq + qo, FG_FP64, SNQ, SH, SD),
        fg_attn_bshd(r->dk + ko, FG_FP64, SNK, SH, SD),
        fg_attn_bshd(r->dv + ko, FG_FP64, SNK, SH, SD),
    };
    fg_attn_stats st = {r->m + b * SH * SNQ, r->l + b * SH * SNQ, FG_FP64};
    ck_assert(fg_attention_forward(p, &t[0], &t[1], &t[2], &t[4], &st) == FG_OK);
    ck_assert(fg_attention_backward(p, &t[0], &t[1], &t[2], &t[4], &t[3], &st,
                                    &t[5], &t[6], &t[7]) == FG_OK);
}

/* Dense batch with seqused_k == a dense call per batch over its first
 * seqused_k keys (top-left causal, so the corner does not depend on the
 * key count); padded keys get zero dK, dV, with dropout too. */
START_TEST(test_seqused_equals_truncated)
{
    const int32_t used[SB] = {50, 17, 1};
    const size_t nq = SB * SNQ * SH * SD, nk = SB * SNK * SH * SD;
    fgt_rng rng = fgt_rng_for(91);
    double *in[4];
    for (int i = 0; i < 4; i++) {
        in[i] = malloc(sizeof(double) * (i == 1 || i == 2 ? nk : nq));
        fgt_fill(in[i], i == 1 || i == 2 ? nk : nq, &rng, 1.0);
    }
    sq_run *padded = malloc(sizeof *padded), *one = malloc(sizeof *one);
    fg_attn_params p;
    fg_attn_params_init(&p, SB, SNQ, SNK, SH, SH, SD);
    p.causal = 1;
    p.causal_align = FG_ATTN_ALIGN_TOP_LEFT;
    p.seqused_k = used;
    for (int drop = 1; drop >= 0; drop--) {
        fgt_poison_d((double *)padded, sizeof *padded / sizeof(double));
        p.dropout_p = drop ? 0.1 : 0;
        p.seed = 5;
        sq_call(&p, in, 0, padded);
        for (int64_t b = 0; b < SB; b++) {
            const int64_t qo = b * SNQ * SH * SD, ko = b * SNK * SH * SD;
            for (int64_t j = used[b] * SH * SD; j < SNK * SH * SD; j++)
                ck_assert(padded->dk[ko + j] == 0 && padded->dv[ko + j] == 0);
            if (drop) /* batch 1 alone would draw b = 0's mask */
                continue;
            fg_attn_params p1 = p;
            p1.batch = 1;
            p1.seqlen_k = used[b];
            p1.seqused_k = NULL;
            sq_call(&p1, in, b, one);
            for (int64_t i = 0; i < SNQ * SH * SD; i++)
                ck_assert(fabs(one->o[qo + i] - padded->o[qo + i]) <= 1e-13 &&
                          fabs(one->dq[qo + i] - padded->dq[qo + i]) <= 1e-12);
            for (int64_t i = 0; i < used[b] * SH * SD; i++)
                ck_assert(fabs(one->dk[ko + i] - padded->dk[ko + i]) <= 1e-12 &&
                          fabs(one->dv[ko + i] - padded->dv[ko + i]) <= 1e-12);
            for (int64_t i = b * SH * SNQ; i < (b + 1) * SH * SNQ; i++)
                ck_assert(one->m[i] == padded->m[i] &&
                          fabs(one->l[i] - padded->l[i]) <= 1e-12 * one->l[i]);
        }
    }
    for (int i = 0; i < 4; i++)
        free(in[i]);
    free(padded);
    free(one);
}
END_TEST

/* Bad offsets and lengths are refused before anything is written. */
START_TEST(test_bad_offsets)
{
    const int64_t d = 8, total = 20;
    float q[40 * 8] = {0}, o[20 * 8], m[20], l[20];
    int32_t cq[4], ck[4], used[3];
    struct { const char *want; int what; fg_status st; } bad[] = {
        {"cu_seqlens_q[0] must be 0", 0, FG_ERR_INVALID_ARGUMENT},
        {"non-decreasing", 1, FG_ERR_INVALID_ARGUMENT},
        {"past the 20 rows", 2, FG_ERR_INVALID_ARGUMENT},
        {"more than the maximum", 3, FG_ERR_INVALID_ARGUMENT},
        {"seqused_k[1]", 4, FG_ERR_INVALID_ARGUMENT},
        {"given together", 5, FG_ERR_INVALID_ARGUMENT},
        {"block masks", 6, FG_ERR_UNSUPPORTED},
        {"total_q", 7, FG_ERR_INVALID_ARGUMENT},
        {"seqused_k[0]", 8, FG_ERR_INVALID_ARGUMENT},
        {"cu_seqlens_k", 9, FG_ERR_INVALID_ARGUMENT},
        {"output o overlaps q", 10, FG_ERR_INVALID_ARGUMENT},
        {"cu_seqlens_q_host differs from cu_seqlens_q", 11, FG_ERR_INVALID_ARGUMENT},
        {"seqused_k_host is given without seqused_k", 12, FG_ERR_INVALID_ARGUMENT},
        {"cu_seqlens_k_host is not 4-byte aligned", 13, FG_ERR_INVALID_ARGUMENT},
        {"seqused_k_host differs", 14, FG_ERR_INVALID_ARGUMENT},
    };
    int32_t hq[4], hk[5], hu[3];
    int32_t lists[16] = {0};
    fg_attn_block_mask bm = {1, 1, 1, 1, lists, lists + 1, lists + 2, lists + 3};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int32_t good_q[4] = {0, 5, 5, 12}, good_k[4] = {0, 6, 10, 20};
        memcpy(cq, good_q, sizeof cq);
        memcpy(ck, good_k, sizeof ck);
        used[0] = 6; used[1] = 4; used[2] = 10;
        for (int x = 0; x < 20 * 8; x++)
            o[x] = 1234.5f;
        for (int x = 0; x < 20; x++)
            m[x] = l[x] = 1234.5f;
        fg_attn_params p;
        fg_attn_params_init(&p, 3, 10, 10, 1, 1, d);
        p.cu_seqlens_q = cq;
        p.cu_seqlens_k = ck;
        p.total_q = p.total_k = total;
        switch (bad[i].what) {
        case 0: cq[0] = 1; break;
        case 1: cq[2] = 4; break;
        case 2: ck[3] = 21; ck[2] = 11; break;
        case 3: ck[2] = 17; break; /* length 11 > 10 */
        case 4: p.seqused_k = used; used[1] = 5; break;
        case 5: p.cu_seqlens_k = NULL; break;
        case 6: p.block_mask = &bm; break;
        case 7: p.total_q = -1; break;
        case 8: p.cu_seqlens_q = p.cu_seqlens_k = NULL; p.seqused_k = used;
                p.seqlen_k = 5; used[0] = -1; break;
        case 9: p.cu_seqlens_k = (const int32_t *)((const char *)ck + 2); break;
        case 10: break; /* O over Q's last packed row: they overlap */
        case 11: /* host copies: on the CPU each must equal its array */
            memcpy(hq, cq, sizeof hq);
            hq[2] = 6;
            p.cu_seqlens_q_host = hq;
            break;
        case 12: p.seqused_k_host = used; break;
        case 13: memcpy(hk, ck, sizeof ck);
                 p.cu_seqlens_k_host = (const int32_t *)((const char *)hk + 2); break;
        case 14: /* the offsets' copies right, seqused_k's not */
            p.seqused_k = used;
            memcpy(hu, used, sizeof hu);
            hu[2] = 9;
            p.cu_seqlens_q_host = cq;
            p.cu_seqlens_k_host = ck;
            p.seqused_k_host = hu;
            break;
        }
        fg_attn_tensor t = {q, FG_FP32, 0, d, d};
        fg_attn_tensor to = {o, FG_FP32, 0, d, d};
        fg_attn_stats st = {m, l, FG_FP32};
        fg_attn_tensor tq_end = {q + 19 * 8, FG_FP32, 0, d, d};
        const fg_status s = fg_attention_forward(
            &p, &t, &t, &t, bad[i].what == 10 ? &tq_end : &to, &st);
        ck_assert_msg(s == bad[i].st, "case %zu: status %d", i, (int)s);
        const char *msg = fg_last_error();
        ck_assert_msg(strstr(msg, bad[i].want), "case %zu: message '%s'", i, msg);
        for (int x = 0; x < 20 * 8; x++)
            ck_assert(o[x] == 1234.5f);
        for (int x = 0; x < 20; x++)
            ck_assert(m[x] == 1234.5f && l[x] == 1234.5f);
        for (int x = 0; x < 40 * 8; x++)
            ck_assert(q[x] == 0);
    }
}
END_TEST

/* Host copies of the offsets (cu_seqlens_q_host, ...): equal to their
 * arrays, they change nothing (forward and backward bit for bit, fp64),
 * whichever of them are given. */
START_TEST(test_host_copies)
{
    vl_case c = {0};
    const int32_t lq[3] = {5, 0, 7}, lk[3] = {6, 4, 10};
    set_lengths(&c, 3, lq, lk);
    c.H = 2;
    c.Hk = 1;
    c.d = 8;
    c.causal = 1;
    c.use_used = 1;
    c.dtype = FG_FP64;
    vl_data d;
    vl_make(&c, 4242, &d);
    vl_out r0;
    fg_status f0, b0;
    run_cpu(&c, &d, &r0, &f0, &b0);
    ck_assert_msg(f0 == FG_OK && b0 == FG_OK, "%s", fg_last_error());
    for (int mask = 1; mask < 8; mask++) { /* bit 0 q, 1 k, 2 seqused_k */
        c.host_copies = mask;
        vl_out r;
        fg_status f, b;
        run_cpu(&c, &d, &r, &f, &b);
        ck_assert_msg(f == FG_OK && b == FG_OK, "copies %d: %s", mask, fg_last_error());
        const int diff = vl_bitwise_diff(&c, &d, &r, &r0);
        ck_assert_msg(diff < 0, "copies %d: output %d differs", mask, diff);
        vl_out_free(&r);
    }
    vl_out_free(&r0);
    vl_free(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attention_varlen");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    fgt_add_loop(tc, test_varlen_grid, 0, N_GRID);
    fgt_add_loop(tc, test_varlen_random, 0, 16);
    fgt_add_test(tc, test_empty_rows);
    fgt_add_loop(tc, test_equals_dense_per_sequence, 0, 2);
    fgt_add_test(tc, test_seqused_equals_truncated);
    fgt_add_test(tc, test_bad_offsets);
    fgt_add_test(tc, test_host_copies);
    suite_add_tcase(s, tc);
    return fgt_run_suite(s);
}
