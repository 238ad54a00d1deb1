/* SPDX-License-Identifier: MIT */
/* tests/test_attention_merge.c - fg_attention_merge on the CPU: attention
 * over Nk keys equals the merge of the attentions over 2+ disjoint key sets
 * (contiguous cuts, interleaved strided sets, causal chunk pairs), forward
 * (O, m, l) and backward (each part's backward run with the merged O, m, l;
 * dQ summed, dK/dV per part); parts that see nothing, in-place merging,
 * thread-count independence and argument errors.
 *
 * Tolerances (relative to the largest reference element): fp64 1e-12,
 * fp32 2e-5 (O, l and every gradient); m is compared exactly, as both sides
 * take the max of the same scores. */
#include <check.h>

#include "config.h"
#include "test_util.h"

static double tol(fg_dtype dt) { return dt == FG_FP64 ? 1e-12 : 2e-5; }

/* A host buffer of n elements of dt (fp32/fp64). */
typedef struct buf {
    void *p;
    size_t n;
    fg_dtype dt;
} buf;

static buf mk(size_t n, fg_dtype dt)
{
    buf b = {calloc(n ? n : 1, fg_dtype_size(dt)), n, dt};
    ck_assert_ptr_nonnull(b.p);
    return b;
}

static void put(buf *b, const double *x)
{
    for (size_t i = 0; i < b->n; i++) {
        if (b->dt == FG_FP64)
            ((double *)b->p)[i] = x[i];
        else
            ((float *)b->p)[i] = (float)x[i];
    }
}

static double get(const buf *b, size_t i)
{
    return b->dt == FG_FP64 ? ((double *)b->p)[i] : ((float *)b->p)[i];
}

static double *dbl(const buf *b)
{
    double *x = malloc(sizeof(double) * (b->n ? b->n : 1));
    for (size_t i = 0; i < b->n; i++)
        x[i] = get(b, i);
    return x;
}

static buf rnd(size_t n, fg_dtype dt, fgt_rng *r, double amp)
{
    double *x = malloc(sizeof(double) * n);
    fgt_fill(x, n, r, amp);
    buf b = mk(n, dt);
    put(&b, x);
    free(x);
    return b;
}

static void rel_ok(const buf *a, const buf *ref, double t, const char *what)
{
    double *x = dbl(a), *y = dbl(ref);
    double e = fgt_rel_err_floor(x, y, a->n, 1e-30);
    free(x);
    free(y);
    ck_assert_msg(e <= t, "%s: relative error %.3g > %.3g", what, e, t);
}

static void m_exact(const buf *a, const buf *ref)
{
    for (size_t i = 0; i < a->n; i++)
        ck_assert_msg(get(a, i) == get(ref, i), "m[%zu]: %.17g vs %.17g", i,
                      get(a, i), get(ref, i));
}

typedef struct prob {
    int64_t B, Nq, Nk, H, Hk, d;
    fg_dtype dt;
    fg_dtype sdt;
    buf q, k, v, dout;
    /* the unsplit reference */
    buf o, m, l, dq, dk, dv;
} prob;

static fg_attn_params params(const prob *P, int64_t Nq, int64_t Nk,
                             int causal)
{
    fg_attn_params p;
    fg_attn_params_init(&p, P->B, Nq, Nk, P->H, P->Hk, P->d);
    p.causal = causal;
    p.block_q = 8; /* several tiles on small shapes */
    p.block_k = 8;
    return p;
}

static void prob_init(prob *P, fg_dtype dt, int64_t B, int64_t Nq, int64_t Nk,
                      int64_t H, int64_t Hk, int64_t d, int causal,
                      uint64_t salt)
{
    *P = (prob){B, Nq, Nk, H, Hk, d, dt, dt == FG_FP64 ? FG_FP64 : FG_FP32};
    fgt_rng r = fgt_rng_for(salt);
    const size_t nq = (size_t)(B * Nq * H * d), nk = (size_t)(B * Nk * Hk * d);
    const size_t ns = (size_t)(B * H * Nq);
    P->q = rnd(nq, dt, &r, 2.0);
    P->k = rnd(nk, dt, &r, 2.0);
    P->v = rnd(nk, dt, &r, 1.0);
    P->dout = rnd(nq, dt, &r, 1.0);
    P->o = mk(nq, dt);
    P->m = mk(ns, P->sdt);
    P->l = mk(ns, P->sdt);
    P->dq = mk(nq, dt);
    P->dk = mk(nk, dt);
    P->dv = mk(nk, dt);
    fg_attn_params p = params(P, Nq, Nk, causal);
    fg_attn_tensor tq = fg_attn_bshd(P->q.p, dt, Nq, H, d);
    fg_attn_tensor tk = fg_attn_bshd(P->k.p, dt, Nk, Hk, d);
    fg_attn_tensor tv = fg_attn_bshd(P->v.p, dt, Nk, Hk, d);
    fg_attn_tensor to = fg_attn_bshd(P->o.p, dt, Nq, H, d);
    fg_attn_tensor tg = fg_attn_bshd(P->dout.p, dt, Nq, H, d);
    fg_attn_tensor tdq = fg_attn_bshd(P->dq.p, dt, Nq, H, d);
    fg_attn_tensor tdk = fg_attn_bshd(P->dk.p, dt, Nk, Hk, d);
    fg_attn_tensor tdv = fg_attn_bshd(P->dv.p, dt, Nk, Hk, d);
    fg_attn_stats st = {P->m.p, P->l.p, P->sdt};
    ck_assert_msg(fg_attention_forward(&p, &tq, &tk, &tv, &to, &st) == FG_OK,
                  "%s", fg_last_error());
    ck_assert_msg(fg_attention_backward(&p, &tq, &tk, &tv, &to, &tg, &st, &tdq,
                                        &tdk, &tdv) == FG_OK,
                  "%s", fg_last_error());
}

static void prob_free(prob *P)
{
    buf *all[] = {&P->q, &P->k, &P->v, &P->dout, &P->o,
                  &P->m, &P->l, &P->dq, &P->dk, &P->dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]->p);
}

static char *elem(const buf *b, int64_t off)
{
    return (char *)b->p + (size_t)off * fg_dtype_size(b->dt);
}

/* ---- key splits -------------------------------------------------------------
 * Key set i is a K/V view: `start` keys in, `count` keys, every `step`-th
 * key (step 1: a contiguous cut; step s: an interleaved set). */
typedef struct keyset {
    int64_t start, count, step;
} keyset;

/* Key set ks of an operand of P ([B, Nk, Hk, d] in b). */
static fg_attn_tensor keyset_view(const prob *P, const buf *b,
                                  const keyset *ks)
{
    fg_attn_tensor t = fg_attn_bshd(elem(b, ks->start * P->Hk * P->d), P->dt,
                                    P->Nk, P->Hk, P->d);
    t.stride_s *= ks->step;
    return t;
}

static void split_check(fg_dtype dt, const keyset *ks, int n, int64_t Nk,
                        uint64_t salt)
{
    prob P;
    const int64_t B = 2, Nq = 13, H = 4, Hk = 2, d = 16;
    prob_init(&P, dt, B, Nq, Nk, H, Hk, d, 0, salt);
    const size_t nq = P.q.n, ns = P.m.n;
    fg_attn_tensor *op = calloc((size_t)n, sizeof *op);
    fg_attn_stats *sp = calloc((size_t)n, sizeof *sp);
    buf *po = calloc((size_t)n, sizeof *po), *pm = calloc((size_t)n, sizeof *pm),
        *pl = calloc((size_t)n, sizeof *pl);
    fg_attn_tensor tq = fg_attn_bshd(P.q.p, dt, Nq, H, d);
    for (int i = 0; i < n; i++) {
        fg_attn_params p = params(&P, Nq, ks[i].count, 0);
        fg_attn_tensor tk = keyset_view(&P, &P.k, &ks[i]),
                       tv = keyset_view(&P, &P.v, &ks[i]);
        po[i] = mk(nq, dt);
        pm[i] = mk(ns, P.sdt);
        pl[i] = mk(ns, P.sdt);
        op[i] = fg_attn_bshd(po[i].p, dt, Nq, H, d);
        sp[i] = (fg_attn_stats){pm[i].p, pl[i].p, P.sdt};
        ck_assert_msg(fg_attention_forward(&p, &tq, &tk, &tv, &op[i], &sp[i]) ==
                          FG_OK, "%s", fg_last_error());
    }
    buf o = mk(nq, dt), m = mk(ns, P.sdt), l = mk(ns, P.sdt);
    fg_attn_tensor to = fg_attn_bshd(o.p, dt, Nq, H, d);
    fg_attn_stats st = {m.p, l.p, P.sdt};
    fg_attn_params pm_ = params(&P, Nq, Nk, 0);
    ck_assert_msg(fg_attention_merge(&pm_, n, op, sp, &to, &st) == FG_OK, "%s",
                  fg_last_error());
    rel_ok(&o, &P.o, tol(dt), "O");
    rel_ok(&l, &P.l, tol(dt), "l");
    m_exact(&m, &P.m);

    /* Backward: every part with the merged O, m, l. */
    buf dq = mk(nq, dt), dqi = mk(nq, dt), dk = mk(P.dk.n, dt),
        dv = mk(P.dv.n, dt);
    fg_attn_tensor tg = fg_attn_bshd(P.dout.p, dt, Nq, H, d);
    fg_attn_tensor tdqi = fg_attn_bshd(dqi.p, dt, Nq, H, d);
    double *acc = calloc(nq, sizeof(double));
    for (int i = 0; i < n; i++) {
        fg_attn_params p = params(&P, Nq, ks[i].count, 0);
        fg_attn_tensor tk = keyset_view(&P, &P.k, &ks[i]),
                       tv = keyset_view(&P, &P.v, &ks[i]),
                       tdk = keyset_view(&P, &dk, &ks[i]),
                       tdv = keyset_view(&P, &dv, &ks[i]);
        ck_assert_msg(fg_attention_backward(&p, &tq, &tk, &tv, &to, &tg, &st,
                                            &tdqi, &tdk, &tdv) == FG_OK,
                      "%s", fg_last_error());
        for (size_t j = 0; j < nq; j++)
            acc[j] += get(&dqi, j);
    }
    put(&dq, acc);
    rel_ok(&dq, &P.dq, 4 * tol(dt), "dQ");
    rel_ok(&dk, &P.dk, tol(dt), "dK");
    rel_ok(&dv, &P.dv, tol(dt), "dV");
    free(acc);
    for (int i = 0; i < n; i++) {
        free(po[i].p);
        free(pm[i].p);
        free(pl[i].p);
    }
    free(po); free(pm); free(pl); free(op); free(sp);
    free(o.p); free(m.p); free(l.p);
    free(dq.p); free(dqi.p); free(dk.p); free(dv.p);
    prob_free(&P);
}

static fg_dtype dtype_of(int i) { return i ? FG_FP32 : FG_FP64; }

START_TEST(test_two_cuts)
{
    const keyset ks[] = {{0, 23, 1}, {23, 18, 1}};
    split_check(dtype_of(_i), ks, 2, 41, 1);
}
END_TEST

START_TEST(test_three_cuts)
{
    const keyset ks[] = {{0, 5, 1}, {5, 1, 1}, {6, 30, 1}};
    split_check(dtype_of(_i), ks, 3, 36, 2);
}
END_TEST

/* Even and odd keys: disjoint sets that are not ranges. */
START_TEST(test_interleaved)
{
    const keyset ks[] = {{0, 20, 2}, {1, 20, 2}};
    split_check(dtype_of(_i), ks, 2, 40, 3);
}
END_TEST

/* Causal attention over Nq = Nk = nc * c, cut into chunks of c on both
 * sides: block (a, b) is full for b < a, causal for b == a, skipped for
 * b > a. Query chunk a merges its blocks b <= a; key chunk b's gradient
 * sums the blocks' dK over a >= b. */
START_TEST(test_causal_chunks)
{
    const fg_dtype dt = dtype_of(_i);
    const int64_t B = 1, H = 2, Hk = 1, d = 8, c = 7, nc = 3, N = nc * c;
    prob P;
    prob_init(&P, dt, B, N, N, H, Hk, d, 1, 4);
    const size_t es = fg_dtype_size(dt);
    /* Per query chunk: O and stats of the merge, each contiguous. */
    const size_t nqc = (size_t)(B * c * H * d), nsc = (size_t)(B * H * c);
    buf o = mk(P.o.n, dt), m = mk(P.m.n, P.sdt), l = mk(P.l.n, P.sdt);
    buf dq = mk(P.dq.n, dt), dk = mk(P.dk.n, dt), dv = mk(P.dv.n, dt);
    double *dqacc = calloc(P.dq.n, sizeof(double));
    double *dkacc = calloc(P.dk.n, sizeof(double));
    double *dvacc = calloc(P.dv.n, sizeof(double));
    buf ts = mk(nqc * 3, dt); /* dQ, dK, dV of one block */
    for (int64_t a = 0; a < nc; a++) {
        buf po[3], pm[3], pl[3];
        fg_attn_tensor op[3];
        fg_attn_stats sp[3];
        fg_attn_tensor tq = fg_attn_bshd(elem(&P.q, a * c * H * d), dt, N, H, d);
        for (int64_t b = 0; b <= a; b++) {
            fg_attn_params p = params(&P, c, c, b == a);
            const keyset kb = {b * c, c, 1};
            fg_attn_tensor tk = keyset_view(&P, &P.k, &kb),
                           tv = keyset_view(&P, &P.v, &kb);
            po[b] = mk(nqc, dt);
            pm[b] = mk(nsc, P.sdt);
            pl[b] = mk(nsc, P.sdt);
            op[b] = fg_attn_bshd(po[b].p, dt, c, H, d);
            sp[b] = (fg_attn_stats){pm[b].p, pl[b].p, P.sdt};
            ck_assert_msg(fg_attention_forward(&p, &tq, &tk, &tv, &op[b],
                                               &sp[b]) == FG_OK,
                          "%s", fg_last_error());
        }
        /* Merge in place into part 0. */
        fg_attn_params pmg = params(&P, c, c, 0);
        ck_assert_msg(fg_attention_merge(&pmg, (int)a + 1, op, sp, &op[0],
                                         &sp[0]) == FG_OK,
                      "%s", fg_last_error());
        memcpy(elem(&o, a * c * H * d), po[0].p, nqc * es);
        for (int64_t h = 0; h < H; h++) {
            memcpy(elem(&m, h * N + a * c), elem(&pm[0], h * c),
                   (size_t)c * fg_dtype_size(P.sdt));
            memcpy(elem(&l, h * N + a * c), elem(&pl[0], h * c),
                   (size_t)c * fg_dtype_size(P.sdt));
        }
        /* Backward of every block of this query chunk, merged stats. */
        fg_attn_tensor tg = fg_attn_bshd(elem(&P.dout, a * c * H * d), dt, N,
                                         H, d);
        for (int64_t b = 0; b <= a; b++) {
            fg_attn_params p = params(&P, c, c, b == a);
            const keyset kb = {b * c, c, 1};
            fg_attn_tensor tk = keyset_view(&P, &P.k, &kb),
                           tv = keyset_view(&P, &P.v, &kb);
            fg_attn_tensor tdq = fg_attn_bshd(ts.p, dt, c, H, d);
            fg_attn_tensor tdk = fg_attn_bshd(elem(&ts, (int64_t)nqc), dt, c,
                                              Hk, d);
            fg_attn_tensor tdv = fg_attn_bshd(elem(&ts, 2 * (int64_t)nqc), dt,
                                              c, Hk, d);
            ck_assert_msg(fg_attention_backward(&p, &tq, &tk, &tv, &op[0], &tg,
                                                &sp[0], &tdq, &tdk, &tdv) ==
                              FG_OK, "%s", fg_last_error());
            for (int64_t j = 0; j < c * H * d; j++)
                dqacc[a * c * H * d + j] += get(&ts, (size_t)j);
            for (int64_t j = 0; j < c * Hk * d; j++) {
                dkacc[b * c * Hk * d + j] += get(&ts, nqc + (size_t)j);
                dvacc[b * c * Hk * d + j] += get(&ts, 2 * nqc + (size_t)j);
            }
        }
        for (int64_t b = 0; b <= a; b++) {
            free(po[b].p);
            free(pm[b].p);
            free(pl[b].p);
        }
    }
    rel_ok(&o, &P.o, tol(dt), "O");
    rel_ok(&l, &P.l, tol(dt), "l");
    m_exact(&m, &P.m);
    put(&dq, dqacc);
    put(&dk, dkacc);
    put(&dv, dvacc);
    rel_ok(&dq, &P.dq, 4 * tol(dt), "dQ");
    rel_ok(&dk, &P.dk, 4 * tol(dt), "dK");
    rel_ok(&dv, &P.dv, 4 * tol(dt), "dV");
    free(dqacc); free(dkacc); free(dvacc);
    free(o.p); free(m.p); free(l.p); free(dq.p); free(dk.p); free(dv.p);
    free(ts.p);
    prob_free(&P);
}
END_TEST

/* Two fp64 parts (o0, m0, l0) and (o1, m1, l1) and the output (o, m, l) of
 * a [1, Nq, 1 or 2, 8] problem, as the merge takes them. */
typedef struct two_parts {
    fg_attn_params p;
    fg_attn_tensor op[2], out;
    fg_attn_stats sp[2], st;
} two_parts;

static two_parts two(int64_t Nq, int64_t H, double *o0, double *m0,
                     double *l0, double *o1, double *m1, double *l1,
                     double *o, double *m, double *l)
{
    two_parts t;
    fg_attn_params_init(&t.p, 1, Nq, Nq, H, H, 8);
    t.op[0] = fg_attn_bshd(o0, FG_FP64, Nq, H, 8);
    t.op[1] = fg_attn_bshd(o1, FG_FP64, Nq, H, 8);
    t.sp[0] = (fg_attn_stats){m0, l0, FG_FP64};
    t.sp[1] = (fg_attn_stats){m1, l1, FG_FP64};
    t.out = fg_attn_bshd(o, FG_FP64, Nq, H, 8);
    t.st = (fg_attn_stats){m, l, FG_FP64};
    return t;
}

/* Rows no part sees: a part with m = -inf, l = 0 (and O garbage) is
 * ignored; with every part empty the row is O = 0, m = -inf, l = 0. */
START_TEST(test_empty_parts)
{
    const int64_t Nq = 3, H = 1;
    double o0[24], o1[24], m0[3], l0[3], m1[3], l1[3], o[24], m[3], l[3];
    fgt_rng r = fgt_rng_for(5);
    fgt_fill(o0, 24, &r, 1);
    for (int i = 0; i < 24; i++)
        o1[i] = NAN;
    for (int i = 0; i < 3; i++) {
        m0[i] = 0.25 * i;
        l0[i] = 1.5;
        m1[i] = -INFINITY;
        l1[i] = 0;
    }
    m0[2] = -INFINITY; /* row 2: nobody sees anything */
    l0[2] = 0;
    for (int i = 16; i < 24; i++)
        o0[i] = 0;
    two_parts t = two(Nq, H, o0, m0, l0, o1, m1, l1, o, m, l);
    ck_assert_msg(fg_attention_merge(&t.p, 2, t.op, t.sp, &t.out, &t.st) ==
                      FG_OK, "%s", fg_last_error());
    for (int i = 0; i < 16; i++)
        ck_assert_msg(o[i] == o0[i], "O[%d] = %g, want %g", i, o[i], o0[i]);
    for (int i = 16; i < 24; i++)
        ck_assert(o[i] == 0);
    ck_assert(m[0] == 0 && m[1] == 0.25 && l[0] == 1.5 && l[1] == 1.5);
    ck_assert(m[2] == -INFINITY && l[2] == 0);
}
END_TEST

/* NaN in, NaN out: a part whose row is NaN (l NaN, m NaN, l < 0, or
 * m = +inf with l > 0) made the merge drop it (a finite row) or give NaN O
 * with m = -inf ("no key seen"). Now the row is NaN in O, m and l; the
 * other rows are untouched by it. */
START_TEST(test_nan_parts)
{
    const int64_t Nq = 3, H = 1;
    double o0[24], o1[24], m0[3], l0[3], m1[3], l1[3], o[24], m[3], l[3];
    for (int bad = 0; bad < 4; bad++) {
        fgt_rng r = fgt_rng_for(7);
        fgt_fill(o0, 24, &r, 1);
        fgt_fill(o1, 24, &r, 1);
        for (int i = 0; i < 3; i++) {
            m0[i] = 0.5 * i;
            l0[i] = 1.5;
            m1[i] = 0.25;
            l1[i] = 2.0;
        }
        switch (bad) { /* row 1 of part 1 */
        case 0: l1[1] = NAN; break;
        case 1: m1[1] = NAN; break;
        case 2: l1[1] = -1; break;
        default: m1[1] = INFINITY; break;
        }
        two_parts t = two(Nq, H, o0, m0, l0, o1, m1, l1, o, m, l);
        ck_assert_msg(fg_attention_merge(&t.p, 2, t.op, t.sp, &t.out, &t.st) ==
                          FG_OK, "%s", fg_last_error());
        ck_assert_msg(isnan(m[1]) && isnan(l[1]), "case %d: m %g, l %g", bad,
                      m[1], l[1]);
        for (int c = 0; c < 8; c++)
            ck_assert_msg(isnan(o[8 + c]), "case %d: O[1][%d] = %g", bad, c,
                          o[8 + c]);
        for (int row = 0; row < 3; row += 2) {
            ck_assert(isfinite(m[row]) && l[row] > 0);
            for (int c = 0; c < 8; c++)
                ck_assert(isfinite(o[8 * row + c]));
        }
    }
}
END_TEST

/* In place (output = part 0) gives the bits of the out-of-place merge, for
 * any thread count. */
START_TEST(test_in_place_threads)
{
    const int64_t B = 2, Nq = 33, H = 3, d = 24;
    const size_t no = (size_t)(B * Nq * H * d), ns = (size_t)(B * H * Nq);
    fgt_rng r = fgt_rng_for(6);
    float *o[3], *m[3], *l[3];
    for (int i = 0; i < 3; i++) {
        o[i] = malloc(no * sizeof(float));
        m[i] = malloc(ns * sizeof(float));
        l[i] = malloc(ns * sizeof(float));
        for (size_t j = 0; j < no; j++)
            o[i][j] = (float)fgt_uniform(&r);
        for (size_t j = 0; j < ns; j++) {
            m[i][j] = (float)(3 * fgt_uniform(&r));
            l[i][j] = (float)(2 + fgt_uniform(&r));
        }
    }
    fg_attn_params p;
    fg_attn_params_init(&p, B, Nq, Nq, H, H, d);
    fg_attn_tensor op[3];
    fg_attn_stats sp[3];
    for (int i = 0; i < 3; i++) {
        op[i] = fg_attn_bshd(o[i], FG_FP32, Nq, H, d);
        sp[i] = (fg_attn_stats){m[i], l[i], FG_FP32};
    }
    float *ro = malloc(no * sizeof(float)), *rm = malloc(ns * sizeof(float)),
          *rl = malloc(ns * sizeof(float));
    fg_attn_tensor to = fg_attn_bshd(ro, FG_FP32, Nq, H, d);
    fg_attn_stats st = {rm, rl, FG_FP32};
    p.num_threads = 1;
    ck_assert(fg_attention_merge(&p, 3, op, sp, &to, &st) == FG_OK);
    p.num_threads = 3;
    ck_assert_msg(fg_attention_merge(&p, 3, op, sp, &op[0], &sp[0]) == FG_OK,
                  "%s", fg_last_error());
    ck_assert(memcmp(ro, o[0], no * sizeof(float)) == 0);
    ck_assert(memcmp(rm, m[0], ns * sizeof(float)) == 0);
    ck_assert(memcmp(rl, l[0], ns * sizeof(float)) == 0);
    for (int i = 0; i < 3; i++) {
        free(o[i]);
        free(m[i]);
        free(l[i]);
    }
    free(ro); free(rm); free(rl);
}
END_TEST

START_TEST(test_errors)
{
    const int64_t Nq = 4, H = 2;
    double o0[64], o1[64], m0[8], l0[8], m1[8], l1[8], o[64], m[8], l[8];
    memset(m0, 0, sizeof m0);
    memcpy(m1, m0, sizeof m0);
    for (int i = 0; i < 8; i++)
        l0[i] = l1[i] = 1;
    two_parts t = two(Nq, H, o0, m0, l0, o1, m1, l1, o, m, l);
    fg_attn_params p = t.p;
    fg_attn_tensor *op = t.op, to = t.out;
    fg_attn_stats *sp = t.sp, st = t.st;
    ck_assert_int_eq(fg_attention_merge(NULL, 2, op, sp, &to, &st),
                     FG_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fg_attention_merge(&p, 0, op, sp, &to, &st),
                     FG_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fg_attention_merge(&p, 2, op, sp, NULL, &st),
                     FG_ERR_INVALID_ARGUMENT);
    /* stats dtype must follow O */
    fg_attn_stats bad = {m, l, FG_FP32};
    ck_assert_int_eq(fg_attention_merge(&p, 2, op, sp, &to, &bad),
                     FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "stats of the output"));
    /* fp16 on the CPU */
    fg_attn_tensor h16 = to;
    h16.dtype = FG_FP16;
    fg_attn_stats s32 = {m, l, FG_FP32};
    ck_assert_int_eq(fg_attention_merge(&p, 1, &h16, &s32, &to, &st),
                     FG_ERR_UNSUPPORTED);
    /* an output overlapping a part without being it */
    fg_attn_tensor shifted = op[1];
    shifted.data = o1 + 8;
    ck_assert_int_eq(fg_attention_merge(&p, 1, op + 1, sp + 1, &shifted, &st),
                     FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "overlaps part 0"));
    /* stats overlapping O */
    fg_attn_stats inside = {o, o + 8, FG_FP64};
    ck_assert_int_eq(fg_attention_merge(&p, 2, op, sp, &to, &inside),
                     FG_ERR_INVALID_ARGUMENT);
#ifndef FG_HAVE_CUDA
    p.device = FG_DEVICE_CUDA;
    ck_assert_int_eq(fg_attention_merge(&p, 2, op, sp, &to, &st),
                     FG_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(fg_last_error(), "without CUDA"));
#endif
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("attention_merge");
    TCase *tc = tcase_create("merge");
    tcase_set_timeout(tc, 60);
    fgt_add_loop(tc, test_two_cuts, 0, 2);
    fgt_add_loop(tc, test_three_cuts, 0, 2);
    fgt_add_loop(tc, test_interleaved, 0, 2);
    fgt_add_loop(tc, test_causal_chunks, 0, 2);
    fgt_add_test(tc, test_empty_parts);
    fgt_add_test(tc, test_nan_parts);
    fgt_add_test(tc, test_in_place_threads);
    fgt_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return fgt_run_suite(suite()); }
