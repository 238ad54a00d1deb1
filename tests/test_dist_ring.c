/* SPDX-License-Identifier: MIT */
/* tests/test_dist_ring.c - ring attention under mpirun against
 * single-process attention over the whole sequence (every rank computes
 * the reference from the same global Q, K, V, dO and compares its rows):
 * contiguous and zigzag layouts, causal or not, GQA, fp64 and fp32, one
 * case with packed-QKV strides.
 *
 * Tolerances, relative to the largest reference element: fp64 1e-12,
 * fp32 2e-5 for O, l, dQ, dK, dV; m exactly (both sides take the max of
 * the same scores). */
#include "dist_util.h"

typedef struct rcase {
    const char *name;
    fg_ring_layout layout;
    int causal;
    fg_dtype dt;
    int64_t B, n, H, Hk, d; /* n: tokens per rank */
    int packed;             /* q, k, v (and grads) as views of one [B, n, 3, H, d] */
    double softcap;
} rcase;

static double get(const void *p, fg_dtype dt, int64_t i)
{
    return dt == FG_FP64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static void set(void *p, fg_dtype dt, int64_t i, double x)
{
    if (dt == FG_FP64)
        ((double *)p)[i] = x;
    else
        ((float *)p)[i] = (float)x;
}

/* Element (b, s, h, x) of a strided operand. */
static int64_t at(const fg_attn_tensor *t, int64_t b, int64_t s, int64_t h,
                  int64_t x)
{
    return b * t->stride_b + s * t->stride_s + h * t->stride_h + x;
}

static void compare(const char *name, const char *what, const double *got,
                    const double *want, size_t n, double tol)
{
    const double e = fgd_rel_err(got, want, n);
    FGD_CHECK(e <= tol, "%s: %s rel error %.3g > %.3g", name, what, e, tol);
    if (fgd_rank == 0 && getenv("FG_TEST_VERBOSE"))
        printf("  %-34s %-3s rel %.3g\n", name, what, e);
}

static void run(fg_comm *c, const rcase *rc)
{
    const int N = fgd_size;
    const fg_dtype dt = rc->dt, sdt = dt == FG_FP64 ? FG_FP64 : FG_FP32;
    const size_t es = fg_dtype_size(dt), ses = fg_dtype_size(sdt);
    const int64_t B = rc->B, n = rc->n, H = rc->H, Hk = rc->Hk, d = rc->d;
    const int64_t Nt = n * N;
    const double tol = dt == FG_FP64 ? 1e-12 : 2e-5;

    /* Global operands and the single-process reference. */
    const int64_t gq = B * Nt * H * d, gk = B * Nt * Hk * d, gs = B * H * Nt;
    void *Q = malloc(gq * es), *K = malloc(gk * es), *V = malloc(gk * es),
         *G = malloc(gq * es), *O = malloc(gq * es), *M = malloc(gs * ses),
         *L = malloc(gs * ses), *DQ = malloc(gq * es), *DK = malloc(gk * es),
         *DV = malloc(gk * es);
    uint64_t seed = 4242;
    for (int64_t i = 0; i < gq; i++) {
        set(Q, dt, i, 1.5 * fgd_uniform(&seed));
        set(G, dt, i, fgd_uniform(&seed));
    }
    for (int64_t i = 0; i < gk; i++) {
        set(K, dt, i, 1.5 * fgd_uniform(&seed));
        set(V, dt, i, fgd_uniform(&seed));
    }
    fg_attn_params gp;
    fg_attn_params_init(&gp, B, Nt, Nt, H, Hk, d);
    gp.causal = rc->causal;
    gp.softcap = rc->softcap;
    gp.block_q = gp.block_k = 8;
    fg_attn_tensor tQ = fg_attn_bshd(Q, dt, Nt, H, d),
                   tK = fg_attn_bshd(K, dt, Nt, Hk, d),
                   tV = fg_attn_bshd(V, dt, Nt, Hk, d),
                   tO = fg_attn_bshd(O, dt, Nt, H, d),
                   tG = fg_attn_bshd(G, dt, Nt, H, d),
                   tDQ = fg_attn_bshd(DQ, dt, Nt, H, d),
                   tDK = fg_attn_bshd(DK, dt, Nt, Hk, d),
                   tDV = fg_attn_bshd(DV, dt, Nt, Hk, d);
    fg_attn_stats tS = {M, L, sdt};
    FGD_OK(fg_attention_forward(&gp, &tQ, &tK, &tV, &tO, &tS));
    FGD_OK(fg_attention_backward(&gp, &tQ, &tK, &tV, &tO, &tG, &tS, &tDQ,
                                 &tDK, &tDV));

    /* This rank's tokens: contiguous [B, n, heads, d] buffers, or views of
     * one packed [B, n, 3, H, d] buffer per (inputs, gradients). */
    const int64_t lq = B * n * H * d, lk = B * n * Hk * d, ls = B * H * n;
    void *pk_in = NULL, *pk_gr = NULL;
    fg_attn_tensor q, k, v, dq, dk, dv;
    void *bq = NULL, *bk = NULL, *bv = NULL, *bdq = NULL, *bdk = NULL, *bdv = NULL;
    if (rc->packed) {
        pk_in = calloc((size_t)(3 * lq), es);
        pk_gr = calloc((size_t)(3 * lq), es);
        q = fg_attn_bshd(pk_in, dt, n, 3 * H, d);
        q.stride_h = d;
        k = q;
        k.data = (char *)pk_in + (size_t)(H * d) * es;
        v = q;
        v.data = (char *)pk_in + (size_t)(2 * H * d) * es;
        dq = q;
        dq.data = pk_gr;
        dk = k;
        dk.data = (char *)pk_gr + (size_t)(H * d) * es;
        dv = v;
        dv.data = (char *)pk_gr + (size_t)(2 * H * d) * es;
    } else {
        bq = malloc(lq * es);
        bk = malloc(lk * es);
        bv = malloc(lk * es);
        bdq = malloc(lq * es);
        bdk = malloc(lk * es);
        bdv = malloc(lk * es);
        q = fg_attn_bshd(bq, dt, n, H, d);
        k = fg_attn_bshd(bk, dt, n, Hk, d);
        v = fg_attn_bshd(bv, dt, n, Hk, d);
        dq = fg_attn_bshd(bdq, dt, n, H, d);
        dk = fg_attn_bshd(bdk, dt, n, Hk, d);
        dv = fg_attn_bshd(bdv, dt, n, Hk, d);
    }
    void *bo = malloc(lq * es), *bg = malloc(lq * es), *bm = malloc(ls * ses),
         *bl = malloc(ls * ses);
    fg_attn_tensor o = fg_attn_bshd(bo, dt, n, H, d),
                   g = fg_attn_bshd(bg, dt, n, H, d);
    fg_attn_stats st = {bm, bl, sdt};
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t gi = fg_ring_position(rc->layout, N, fgd_rank, n, i);
            for (int64_t x = 0; x < d; x++) {
                for (int64_t h = 0; h < H; h++) {
                    set(q.data, dt, at(&q, b, i, h, x),
                        get(Q, dt, at(&tQ, b, gi, h, x)));
                    set(g.data, dt, at(&g, b, i, h, x),
                        get(G, dt, at(&tG, b, gi, h, x)));
                }
                for (int64_t h = 0; h < Hk; h++) {
                    set(k.data, dt, at(&k, b, i, h, x),
                        get(K, dt, at(&tK, b, gi, h, x)));
                    set(v.data, dt, at(&v, b, i, h, x),
                        get(V, dt, at(&tV, b, gi, h, x)));
                }
            }
        }
    fg_attn_params p;
    fg_attn_params_init(&p, B, n, n, H, Hk, d);
    p.causal = rc->causal;
    p.softcap = rc->softcap;
    p.block_q = p.block_k = 4;
    FGD_OK(fg_ring_attention_forward(c, rc->layout, &p, &q, &k, &v, &o, &st));
    FGD_OK(fg_ring_attention_backward(c, rc->layout, &p, &q, &k, &v, &o, &g,
                                      &st, &dq, &dk, &dv));

    /* This rank's rows of the reference, side by side with the results. */
    double *got = malloc(sizeof(double) * (size_t)lq),
           *want = malloc(sizeof(double) * (size_t)lq);
    struct {
        const char *what;
        const fg_attn_tensor *loc, *ref;
        int64_t heads;
    } ops[] = {{"O", &o, &tO, H},
               {"dQ", &dq, &tDQ, H},
               {"dK", &dk, &tDK, Hk},
               {"dV", &dv, &tDV, Hk}};
    for (size_t w = 0; w < sizeof ops / sizeof *ops; w++) {
        size_t m = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < n; i++) {
                const int64_t gi =
                    fg_ring_position(rc->layout, N, fgd_rank, n, i);
                for (int64_t h = 0; h < ops[w].heads; h++)
                    for (int64_t x = 0; x < d; x++, m++) {
                        got[m] = get(ops[w].loc->data, dt,
                                     at(ops[w].loc, b, i, h, x));
                        want[m] = get(ops[w].ref->data, dt,
                                      at(ops[w].ref, b, gi, h, x));
                    }
            }
        compare(rc->name, ops[w].what, got, want, m, tol);
    }
    size_t m = 0, m_bad = 0;
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < n; i++, m++) {
            const int64_t gi = fg_ring_position(rc->layout, N, fgd_rank, n, i);
            got[m] = get(bl, sdt, bh * n + i);
            want[m] = get(L, sdt, bh * Nt + gi);
            m_bad += get(bm, sdt, bh * n + i) != get(M, sdt, bh * Nt + gi);
        }
    compare(rc->name, "l", got, want, m, tol);
    FGD_CHECK(m_bad == 0, "%s: %zu values of m differ", rc->name, m_bad);

    free(got);
    free(want);
    if (rc->packed) {
        free(pk_in);
        free(pk_gr);
    } else {
        free(bq); free(bk); free(bv); free(bdq); free(bdk); free(bdv);
    }
    free(bo); free(bg); free(bm); free(bl);
    free(Q); free(K); free(V); free(G); free(O); free(M); free(L);
    free(DQ); free(DK); free(DV);
}

static void test_errors(fg_comm *c)
{
    float buf[4 * 8 * 8] = {0}, m[8], l[8];
    fg_attn_params p;
    fg_attn_params_init(&p, 1, 3, 3, 1, 1, 8);
    fg_attn_tensor t = fg_attn_bshd(buf, FG_FP32, 3, 1, 8);
    fg_attn_stats st = {m, l, FG_FP32};
    FGD_CHECK(fg_ring_attention_forward(c, FG_RING_ZIGZAG, &p, &t, &t, &t, &t,
                                        &st) == FG_ERR_INVALID_ARGUMENT &&
                  strstr(fg_last_error(), "even"),
              "zigzag with odd n: %s", fg_last_error());
    p.seqlen_q = p.seqlen_k = 4;
    p.dropout_p = 0.1;
    FGD_CHECK(fg_ring_attention_forward(c, FG_RING_CONTIGUOUS, &p, &t, &t, &t,
                                        &t, &st) == FG_ERR_UNSUPPORTED,
              "dropout");
    p.dropout_p = 0;
    p.seqlen_k = 2;
    FGD_CHECK(fg_ring_attention_forward(c, FG_RING_CONTIGUOUS, &p, &t, &t, &t,
                                        &t, &st) == FG_ERR_INVALID_ARGUMENT,
              "seqlen_q != seqlen_k");
    p.seqlen_k = 4;
    p.window_left = 2;
    FGD_CHECK(fg_ring_attention_forward(c, FG_RING_CONTIGUOUS, &p, &t, &t, &t,
                                        &t, &st) == FG_ERR_UNSUPPORTED,
              "sliding window");
    p.window_left = -1;
    p.device = FG_DEVICE_CUDA;
    FGD_CHECK(fg_ring_attention_forward(c, FG_RING_CONTIGUOUS, &p, &t, &t, &t,
                                        &t, &st) == FG_ERR_INVALID_ARGUMENT,
              "CUDA operands on an MPI communicator");
    FGD_CHECK(fg_ring_position(FG_RING_ZIGZAG, 4, 1, 6, 4) == 19 &&
                  fg_ring_position(FG_RING_ZIGZAG, 4, 1, 6, 2) == 5 &&
                  fg_ring_position(FG_RING_CONTIGUOUS, 4, 1, 6, 2) == 8,
              "fg_ring_position");
}

int main(int argc, char **argv)
{
    fg_comm *c = fgd_init(&argc, &argv, 100);
    const rcase cases[] = {
        {"zigzag causal fp64 GQA", FG_RING_ZIGZAG, 1, FG_FP64, 2, 10, 4, 2, 16, 0, 0},
        {"zigzag causal fp32", FG_RING_ZIGZAG, 1, FG_FP32, 1, 14, 2, 2, 8, 0, 0},
        {"contiguous causal fp64", FG_RING_CONTIGUOUS, 1, FG_FP64, 2, 7, 2, 1, 8, 0, 0},
        {"contiguous full fp32 GQA", FG_RING_CONTIGUOUS, 0, FG_FP32, 1, 9, 4, 1, 16, 0, 0},
        {"zigzag full fp64", FG_RING_ZIGZAG, 0, FG_FP64, 1, 8, 2, 2, 8, 0, 0},
        {"contiguous causal fp32 packed", FG_RING_CONTIGUOUS, 1, FG_FP32, 2, 6, 2, 2, 8, 1, 0},
        {"zigzag causal fp64 packed", FG_RING_ZIGZAG, 1, FG_FP64, 1, 12, 3, 3, 8, 1, 0},
        {"zigzag causal fp64 softcap", FG_RING_ZIGZAG, 1, FG_FP64, 2, 8, 2, 1, 8, 0, 2.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        run(c, &cases[i]);
    test_errors(c);
    return fgd_finish(c, "test_dist_ring");
}
