/* SPDX-License-Identifier: MIT */
/* tests/test_gpu_dist.c - the distributed pieces on GPUs, without MPI (the
 * GPU machine has none). Exits 77 without a GPU.
 *
 *  1. fg_attention_merge on CUDA (fp32, fp16, bf16 parts; bf16 parts into
 *     an fp32 accumulator; in place; more parts than one launch takes)
 *     against the formula in fp64 on the host. Tolerances: fp32 1e-6,
 *     fp16 2e-3, bf16 1e-2 (one rounding of the output).
 *  2. Causal attention cut into 8 chunks on one GPU, the blocks ring
 *     attention computes: each query chunk merges its key-chunk blocks
 *     (full, diagonal causal), each block's backward uses the merged O, m,
 *     l; against the unsplit GPU attention: fp32 1e-4, bf16 3e-2.
 *  3. NCCL with one rank, bootstrapped through an id file: every
 *     operation, nonblocking forms, barrier; ring attention (zigzag, N = 1)
 *     against fg_attention_* on the GPU; the data-parallel GPT step against
 *     fg_gpt_train_step (bitwise: one rank's average is a copy).
 *  4. Several processes through an id file (fork + exec of this program):
 *     with >= 2 GPUs, min(GPUs, 4) ranks run all-reduce, ring attention and
 *     the data-parallel step against single-GPU references (fp32 2e-5 on
 *     parameters, 1e-4 on attention). With one GPU two ranks share it if
 *     NCCL allows; NCCL normally refuses ("Duplicate GPU"), which is
 *     reported and skipped.
 * Parts 3 and 4 are skipped in a build without NCCL. */
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cuda_runtime.h>

#include "dist_util.h"

/* ---- device buffers through flashgrad tensors (host side in fp64) -------- */

static fg_tensor *dev(const double *x, int64_t n, fg_dtype dt)
{
    fg_tensor *t = NULL;
    FGD_OK(fg_tensor_empty(dt, FG_DEVICE_CUDA, FG_SHAPE(n), &t));
    if (x)
        FGD_OK(fg_tensor_copy_from_host(t, FG_FP64, x, n));
    return t;
}

static double *host(const fg_tensor *t)
{
    const int64_t n = fg_tensor_numel(t);
    double *h = malloc(sizeof(double) * (size_t)(n ? n : 1));
    FGD_OK(fg_tensor_copy_to_host(t, FG_FP64, h, n));
    return h;
}

static void *ptr(const fg_tensor *t, int64_t elems)
{
    return (char *)fg_tensor_data(t) +
           (size_t)elems * fg_dtype_size(fg_tensor_dtype(t));
}

static double *rnd(int64_t n, uint64_t *s, double amp)
{
    double *x = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = amp * fgd_uniform(s);
    return x;
}

static void report(const char *name, const char *what, double e, double tol)
{
    FGD_CHECK(e <= tol, "%s: %s rel error %.3g > %.3g", name, what, e, tol);
    printf("  %-40s %-4s rel %.3g (tol %.0e)\n", name, what, e, tol);
}

/* ---- 1. the merge kernel --------------------------------------------------- */

static void merge_case(const char *name, int n, fg_dtype pdt, fg_dtype odt,
                       int in_place, double tol)
{
    const int64_t B = 2, Nq = 37, H = 3, d = 40;
    const int64_t no = B * Nq * H * d, ns = B * H * Nq;
    uint64_t s = 99 + (uint64_t)n;
    fg_attn_tensor *op = calloc((size_t)n, sizeof *op);
    fg_attn_stats *sp = calloc((size_t)n, sizeof *sp);
    fg_tensor **to = calloc((size_t)n, sizeof *to), **tm = calloc((size_t)n, sizeof *tm),
              **tl = calloc((size_t)n, sizeof *tl);
    double **ho = calloc((size_t)n, sizeof *ho), **hm = calloc((size_t)n, sizeof *hm),
           **hl = calloc((size_t)n, sizeof *hl);
    for (int k = 0; k < n; k++) {
        double *o = rnd(no, &s, 1), *m = rnd(ns, &s, 3), *l = rnd(ns, &s, 1);
        for (int64_t i = 0; i < ns; i++) {
            l[i] += 2;
            if ((i + k) % 11 == 0) { /* rows this part does not see */
                m[i] = -INFINITY;
                l[i] = 0;
            }
        }
        to[k] = dev(o, no, pdt);
        tm[k] = dev(m, ns, FG_FP32);
        tl[k] = dev(l, ns, FG_FP32);
        free(o);
        ho[k] = host(to[k]); /* as rounded to the part's dtype */
        hm[k] = m;
        hl[k] = l;
        op[k] = fg_attn_bshd(fg_tensor_data(to[k]), pdt, Nq, H, d);
        sp[k] = (fg_attn_stats){fg_tensor_data(tm[k]), fg_tensor_data(tl[k]),
                                FG_FP32};
    }
    fg_tensor *oo = in_place ? to[0] : dev(NULL, no, odt);
    fg_tensor *om = in_place ? tm[0] : dev(NULL, ns, FG_FP32);
    fg_tensor *ol = in_place ? tl[0] : dev(NULL, ns, FG_FP32);
    fg_attn_tensor out = fg_attn_bshd(fg_tensor_data(oo), in_place ? pdt : odt,
                                      Nq, H, d);
    fg_attn_stats ost = {fg_tensor_data(om), fg_tensor_data(ol), FG_FP32};
    fg_attn_params p;
    fg_attn_params_init(&p, B, Nq, Nq, H, H, d);
    p.device = FG_DEVICE_CUDA;
    p.cuda_stream = fg_cuda_get_stream();
    FGD_OK(fg_attention_merge(&p, n, op, sp, &out, &ost));
    double *go = host(oo), *gm = host(om), *gl = host(ol);
    double *wo = calloc((size_t)no, sizeof(double)), *wl = calloc((size_t)ns, sizeof(double));
    size_t m_bad = 0;
    for (int64_t r = 0; r < ns; r++) {
        const int64_t i = r % Nq, bh = r / Nq, b = bh / H, h = bh % H;
        double mx = -INFINITY, L = 0;
        for (int k = 0; k < n; k++)
            if (hl[k][r] > 0 && hm[k][r] > mx)
                mx = hm[k][r];
        for (int k = 0; k < n; k++)
            if (hl[k][r] > 0)
                L += hl[k][r] * exp(hm[k][r] - mx);
        wl[r] = L;
        m_bad += L > 0 ? gm[r] != (double)(float)mx : gm[r] != -INFINITY;
        for (int64_t x = 0; x < d; x++) {
            const int64_t e = ((b * Nq + i) * H + h) * d + x;
            double acc = 0;
            for (int k = 0; k < n; k++)
                if (hl[k][r] > 0)
                    acc += hl[k][r] * exp(hm[k][r] - mx) / L * ho[k][e];
            wo[e] = acc;
        }
    }
    report(name, "O", fgd_rel_err(go, wo, (size_t)no), tol);
    report(name, "l", fgd_rel_err(gl, wl, (size_t)ns), 1e-6);
    FGD_CHECK(m_bad == 0, "%s: %zu values of m wrong", name, m_bad);
    free(go); free(gm); free(gl); free(wo); free(wl);
    if (!in_place) {
        fg_tensor_free(oo);
        fg_tensor_free(om);
        fg_tensor_free(ol);
    }
    for (int k = 0; k < n; k++) {
        fg_tensor_free(to[k]); fg_tensor_free(tm[k]); fg_tensor_free(tl[k]);
        free(ho[k]); free(hm[k]); free(hl[k]);
    }
    free(op); free(sp); free(to); free(tm); free(tl); free(ho); free(hm); free(hl);
}

static void test_merge(void)
{
    printf("1. fg_attention_merge on CUDA\n");
    merge_case("fp32, 3 parts", 3, FG_FP32, FG_FP32, 0, 1e-6);
    merge_case("fp32, 20 parts (two launches)", 20, FG_FP32, FG_FP32, 0, 1e-6);
    merge_case("fp32, 5 parts, in place", 5, FG_FP32, FG_FP32, 1, 1e-6);
    merge_case("fp16, 4 parts", 4, FG_FP16, FG_FP16, 0, 2e-3);
    merge_case("bf16, 4 parts", 4, FG_BF16, FG_BF16, 0, 1e-2);
    merge_case("bf16 parts into fp32", 4, FG_BF16, FG_FP32, 0, 1e-6);
}

/* ---- a global problem and its unsplit reference on the GPU ---------------- */

typedef struct gprob {
    int64_t B, Nt, H, Hk, d, nq, nk;
    fg_dtype dt;
    double *hq, *hk, *hv, *hg;         /* inputs (host, as drawn) */
    fg_tensor *Q, *K, *V, *G;          /* inputs on the device */
    fg_attn_tensor tq, tk, tv, tg;     /* their [B, Nt, heads, d] views */
    double *ro, *rl, *rdq, *rdk, *rdv; /* the reference (host) */
    fg_attn_params p;                  /* the unsplit problem */
} gprob;

static void gprob_init(gprob *g, fg_dtype dt, int64_t B, int64_t Nt,
                       int64_t H, int64_t Hk, int64_t d, int causal,
                       uint64_t seed)
{
    memset(g, 0, sizeof *g);
    g->B = B; g->Nt = Nt; g->H = H; g->Hk = Hk; g->d = d; g->dt = dt;
    g->nq = B * Nt * H * d;
    g->nk = B * Nt * Hk * d;
    const int64_t ns = B * H * Nt;
    g->hq = rnd(g->nq, &seed, 1.5);
    g->hk = rnd(g->nk, &seed, 1.5);
    g->hv = rnd(g->nk, &seed, 1);
    g->hg = rnd(g->nq, &seed, 1);
    g->Q = dev(g->hq, g->nq, dt);
    g->K = dev(g->hk, g->nk, dt);
    g->V = dev(g->hv, g->nk, dt);
    g->G = dev(g->hg, g->nq, dt);
    fg_tensor *O = dev(NULL, g->nq, dt), *M = dev(NULL, ns, FG_FP32),
              *L = dev(NULL, ns, FG_FP32), *DQ = dev(NULL, g->nq, dt),
              *DK = dev(NULL, g->nk, dt), *DV = dev(NULL, g->nk, dt);
    fg_attn_params_init(&g->p, B, Nt, Nt, H, Hk, d);
    g->p.causal = causal;
    g->p.device = FG_DEVICE_CUDA;
    g->p.cuda_stream = fg_cuda_get_stream();
    g->tq = fg_attn_bshd(ptr(g->Q, 0), dt, Nt, H, d);
    g->tk = fg_attn_bshd(ptr(g->K, 0), dt, Nt, Hk, d);
    g->tv = fg_attn_bshd(ptr(g->V, 0), dt, Nt, Hk, d);
    g->tg = fg_attn_bshd(ptr(g->G, 0), dt, Nt, H, d);
    fg_attn_tensor to = fg_attn_bshd(ptr(O, 0), dt, Nt, H, d),
                   tdq = fg_attn_bshd(ptr(DQ, 0), dt, Nt, H, d),
                   tdk = fg_attn_bshd(ptr(DK, 0), dt, Nt, Hk, d),
                   tdv = fg_attn_bshd(ptr(DV, 0), dt, Nt, Hk, d);
    fg_attn_stats ts = {ptr(M, 0), ptr(L, 0), FG_FP32};
    FGD_OK(fg_attention_forward(&g->p, &g->tq, &g->tk, &g->tv, &to, &ts));
    FGD_OK(fg_attention_backward(&g->p, &g->tq, &g->tk, &g->tv, &to, &g->tg,
                                 &ts, &tdq, &tdk, &tdv));
    g->ro = host(O);
    g->rl = host(L);
    g->rdq = host(DQ);
    g->rdk = host(DK);
    g->rdv = host(DV);
    fg_tensor *tmp[] = {O, M, L, DQ, DK, DV};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        fg_tensor_free(tmp[i]);
}

static void gprob_free(gprob *g)
{
    fg_tensor *t[] = {g->Q, g->K, g->V, g->G};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        fg_tensor_free(t[i]);
    double *h[] = {g->hq, g->hk, g->hv, g->hg, g->ro, g->rl, g->rdq, g->rdk,
                   g->rdv};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        free(h[i]);
}

/* ---- 2. causal attention in chunks on one GPU -------------------------------- */

/* Query chunk a merges blocks (a, b <= a) (bf16: into an fp32
 * accumulator, then back to bf16 for the backward), and every block's
 * backward runs with the merged O, m and l; against the unsplit attention. */
static void chunked_case(fg_dtype dt, double tol)
{
    const int64_t B = 2, H = 4, Hk = 2, d = 64, c = 16, nc = 8, Nt = c * nc;
    const int64_t qc = B * c * H * d, kc = B * c * Hk * d, sc = B * H * c;
    gprob g;
    gprob_init(&g, dt, B, Nt, H, Hk, d, 1, 7);
    double *go = calloc((size_t)g.nq, sizeof(double)),
           *gdq = calloc((size_t)g.nq, sizeof(double)),
           *gdk = calloc((size_t)g.nk, sizeof(double)),
           *gdv = calloc((size_t)g.nk, sizeof(double));
    fg_tensor *PO = dev(NULL, qc * nc, dt), *PM = dev(NULL, sc * nc, FG_FP32),
              *PL = dev(NULL, sc * nc, FG_FP32), *AO = dev(NULL, qc, FG_FP32),
              *AM = dev(NULL, sc, FG_FP32), *AL = dev(NULL, sc, FG_FP32),
              *OD = dev(NULL, qc, dt), *BQ = dev(NULL, qc, dt),
              *BK = dev(NULL, kc, dt), *BV = dev(NULL, kc, dt);
    fg_attn_params pb = g.p, pm = g.p;
    pb.seqlen_q = pb.seqlen_k = pm.seqlen_q = pm.seqlen_k = c;
    pm.causal = 0;
    fg_attn_tensor ao = fg_attn_bshd(ptr(AO, 0), FG_FP32, c, H, d),
                   od = fg_attn_bshd(ptr(OD, 0), dt, c, H, d),
                   bq = fg_attn_bshd(ptr(BQ, 0), dt, c, H, d),
                   bk = fg_attn_bshd(ptr(BK, 0), dt, c, Hk, d),
                   bv = fg_attn_bshd(ptr(BV, 0), dt, c, Hk, d);
    fg_attn_stats ast = {ptr(AM, 0), ptr(AL, 0), FG_FP32};
    fg_attn_tensor op[8];
    fg_attn_stats sp[8];
    for (int64_t a = 0; a < nc; a++) {
        fg_attn_tensor qa = g.tq, ga = g.tg, kb[8], vb[8];
        qa.data = ptr(g.Q, a * c * H * d);
        ga.data = ptr(g.G, a * c * H * d);
        for (int64_t b = 0; b <= a; b++) {
            kb[b] = g.tk;
            vb[b] = g.tv;
            kb[b].data = ptr(g.K, b * c * Hk * d);
            vb[b].data = ptr(g.V, b * c * Hk * d);
            op[b] = fg_attn_bshd(ptr(PO, b * qc), dt, c, H, d);
            sp[b] = (fg_attn_stats){ptr(PM, b * sc), ptr(PL, b * sc), FG_FP32};
            pb.causal = b == a;
            FGD_OK(fg_attention_forward(&pb, &qa, &kb[b], &vb[b], &op[b],
                                        &sp[b]));
        }
        FGD_OK(fg_attention_merge(&pm, (int)a + 1, op, sp, &ao, &ast));
        FGD_OK(fg_attention_merge(&pm, 1, &ao, &ast, &od, &ast));
        double *h = host(OD);
        for (int64_t bb = 0; bb < B; bb++)
            memcpy(go + (bb * Nt + a * c) * H * d, h + bb * c * H * d,
                   sizeof(double) * (size_t)(c * H * d));
        free(h);
        for (int64_t b = 0; b <= a; b++) {
            pb.causal = b == a;
            FGD_OK(fg_attention_backward(&pb, &qa, &kb[b], &vb[b], &od, &ga,
                                         &ast, &bq, &bk, &bv));
            double *x = host(BQ), *y = host(BK), *z = host(BV);
            for (int64_t bb = 0; bb < B; bb++) {
                for (int64_t e = 0; e < c * H * d; e++)
                    gdq[(bb * Nt + a * c) * H * d + e] += x[bb * c * H * d + e];
                for (int64_t e = 0; e < c * Hk * d; e++) {
                    gdk[(bb * Nt + b * c) * Hk * d + e] += y[bb * c * Hk * d + e];
                    gdv[(bb * Nt + b * c) * Hk * d + e] += z[bb * c * Hk * d + e];
                }
            }
            free(x); free(y); free(z);
        }
    }
    const char *name = dt == FG_BF16 ? "causal, 8 chunks, bf16" : "causal, 8 chunks, fp32";
    report(name, "O", fgd_rel_err(go, g.ro, (size_t)g.nq), tol);
    report(name, "dQ", fgd_rel_err(gdq, g.rdq, (size_t)g.nq), tol);
    report(name, "dK", fgd_rel_err(gdk, g.rdk, (size_t)g.nk), tol);
    report(name, "dV", fgd_rel_err(gdv, g.rdv, (size_t)g.nk), tol);
    fg_tensor *all[] = {PO, PM, PL, AO, AM, AL, OD, BQ, BK, BV};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fg_tensor_free(all[i]);
    free(go); free(gdq); free(gdk); free(gdv);
    gprob_free(&g);
}

/* ---- 3 / 4: NCCL ---------------------------------------------------------------- */

static void test_ops(fg_comm *c)
{
    const int N = fg_comm_size(c), r = fg_comm_rank(c);
    const fg_dtype dts[] = {FG_FP32, FG_FP64, FG_FP16, FG_BF16};
    const int64_t n = 1000;
    for (int i = 0; i < 4; i++) {
        double *x = malloc(sizeof(double) * (size_t)(n * N)), *want =
                                                            malloc(sizeof(double) * (size_t)n);
        for (int64_t e = 0; e < n; e++) {
            x[e] = (double)((e * 5 + r) % 9 - 4) / 4;
            want[e] = 0;
            for (int q = 0; q < N; q++)
                want[e] += (double)((e * 5 + q) % 9 - 4) / 4;
        }
        fg_tensor *t = dev(x, n, dts[i]);
        FGD_OK(fg_comm_allreduce(c, fg_tensor_data(t), fg_tensor_data(t),
                                 (size_t)n, dts[i], FG_REDUCE_SUM));
        double *g = host(t);
        FGD_CHECK(fgd_rel_err(g, want, (size_t)n) == 0, "NCCL allreduce sum %s",
                  fg_dtype_name(dts[i]));
        free(g);
        fg_comm_request *rq = NULL;
        FGD_OK(fg_comm_iallreduce(c, fg_tensor_data(t), fg_tensor_data(t),
                                  (size_t)n, dts[i], FG_REDUCE_AVG, &rq));
        int done = 0;
        FGD_OK(fg_comm_test(rq, &done));
        FGD_OK(fg_comm_wait(rq));
        g = host(t);
        FGD_CHECK(fgd_rel_err(g, want, (size_t)n) <= (N & (N - 1) ? 1e-2 : 0),
                  "NCCL iallreduce avg %s", fg_dtype_name(dts[i]));
        free(g);
        /* all-gather (in place: rank r's block at r * n), then
         * reduce-scatter and broadcast */
        fg_tensor *big = dev(NULL, n * N, dts[i]);
        double *blk = malloc(sizeof(double) * (size_t)(n * N));
        for (int64_t e = 0; e < n * N; e++)
            blk[e] = (e / n == r) ? r + (double)(e % n % 5) : -1;
        FGD_OK(fg_tensor_copy_from_host(big, FG_FP64, blk, n * N));
        FGD_OK(fg_comm_allgather(c, ptr(big, r * n), fg_tensor_data(big),
                                 (size_t)n, dts[i]));
        g = host(big);
        int ok = 1;
        for (int64_t e = 0; e < n * N; e++)
            ok &= g[e] == (double)(e / n) + (double)(e % n % 5);
        FGD_CHECK(ok, "NCCL allgather %s", fg_dtype_name(dts[i]));
        free(g);
        fg_tensor *one = dev(NULL, n, dts[i]);
        FGD_OK(fg_comm_reduce_scatter(c, fg_tensor_data(big),
                                      fg_tensor_data(one), (size_t)n, dts[i],
                                      FG_REDUCE_SUM));
        g = host(one);
        ok = 1;
        for (int64_t e = 0; e < n; e++)
            ok &= g[e] == N * ((double)r + (double)(e % 5));
        FGD_CHECK(ok, "NCCL reduce_scatter %s", fg_dtype_name(dts[i]));
        free(g);
        FGD_OK(fg_comm_broadcast(c, fg_tensor_data(one), (size_t)n, dts[i],
                                 N - 1));
        g = host(one);
        FGD_CHECK(g[3] == N * ((double)(N - 1) + 3), "NCCL broadcast %s",
                  fg_dtype_name(dts[i]));
        free(g);
        fg_tensor_free(one);
        fg_tensor_free(big);
        fg_tensor_free(t);
        free(blk);
        free(x);
        free(want);
    }
    /* around the ring (to oneself with one rank) */
    double v[4] = {r, r, r, r};
    fg_tensor *snd = dev(v, 4, FG_FP32), *rcv = dev(NULL, 4, FG_FP32);
    FGD_OK(fg_comm_sendrecv(c, fg_tensor_data(snd), 4, (r + 1) % N,
                            fg_tensor_data(rcv), 4, (r + N - 1) % N, FG_FP32));
    double *g = host(rcv);
    FGD_CHECK(g[0] == (r + N - 1) % N, "NCCL sendrecv: %g", g[0]);
    free(g);
    fg_tensor_free(snd);
    fg_tensor_free(rcv);
    FGD_OK(fg_comm_barrier(c));
    FGD_CHECK(fg_comm_device(c) == FG_DEVICE_CUDA &&
                  fg_comm_get_backend(c) == FG_COMM_NCCL,
              "NCCL properties");
}

/* This rank's rows of a global [B, Nt, heads, d] array, as [B, n, heads,
 * d] (a new buffer). */
static double *rows_of(const double *g, int64_t B, int64_t Nt, int64_t n,
                       int64_t heads, int64_t d, fg_ring_layout layout,
                       int N, int r)
{
    double *x = malloc(sizeof(double) * (size_t)(B * n * heads * d));
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t gi = fg_ring_position(layout, N, r, n, i);
            memcpy(x + (b * n + i) * heads * d, g + (b * Nt + gi) * heads * d,
                   sizeof(double) * (size_t)(heads * d));
        }
    return x;
}

/* Ring attention on this rank's rows against the unsplit attention on the
 * GPU (every rank computes it from the same global data). */
static void test_ring(fg_comm *c, fg_ring_layout layout, int causal,
                      fg_dtype dt, double tol)
{
    const int N = fg_comm_size(c), r = fg_comm_rank(c);
    const int64_t B = 2, H = 4, Hk = 2, d = 64, n = 32, Nt = n * N;
    const int64_t lq = B * n * H * d, lk = B * n * Hk * d, ls = B * H * n;
    gprob g;
    gprob_init(&g, dt, B, Nt, H, Hk, d, causal, 11);
    double *xq = rows_of(g.hq, B, Nt, n, H, d, layout, N, r),
           *xg = rows_of(g.hg, B, Nt, n, H, d, layout, N, r),
           *xk = rows_of(g.hk, B, Nt, n, Hk, d, layout, N, r),
           *xv = rows_of(g.hv, B, Nt, n, Hk, d, layout, N, r);
    fg_tensor *q = dev(xq, lq, dt), *k = dev(xk, lk, dt), *v = dev(xv, lk, dt), *gr = dev(xg, lq, dt),
              *o = dev(NULL, lq, dt), *m = dev(NULL, ls, FG_FP32), *l = dev(NULL, ls, FG_FP32),
              *dq = dev(NULL, lq, dt), *dk = dev(NULL, lk, dt), *dv = dev(NULL, lk, dt);
    fg_attn_params lp;
    fg_attn_params_init(&lp, B, n, n, H, Hk, d);
    lp.causal = causal;
    lp.device = FG_DEVICE_CUDA;
    fg_attn_tensor aq = fg_attn_bshd(ptr(q, 0), dt, n, H, d), ak = fg_attn_bshd(ptr(k, 0), dt, n, Hk, d),
                   av = fg_attn_bshd(ptr(v, 0), dt, n, Hk, d), ag = fg_attn_bshd(ptr(gr, 0), dt, n, H, d),
                   ao = fg_attn_bshd(ptr(o, 0), dt, n, H, d), adq = fg_attn_bshd(ptr(dq, 0), dt, n, H, d),
                   adk = fg_attn_bshd(ptr(dk, 0), dt, n, Hk, d), adv = fg_attn_bshd(ptr(dv, 0), dt, n, Hk, d);
    fg_attn_stats as = {ptr(m, 0), ptr(l, 0), FG_FP32};
    FGD_OK(fg_ring_attention_forward(c, layout, &lp, &aq, &ak, &av, &ao, &as));
    FGD_OK(fg_ring_attention_backward(c, layout, &lp, &aq, &ak, &av, &ao, &ag, &as, &adq, &adk, &adv));
    double *got[5] = {host(o), host(l), host(dq), host(dk), host(dv)};
    /* the reference's rows of this rank */
    double *want[5] = {rows_of(g.ro, B, Nt, n, H, d, layout, N, r),
                       malloc(sizeof(double) * (size_t)ls),
                       rows_of(g.rdq, B, Nt, n, H, d, layout, N, r),
                       rows_of(g.rdk, B, Nt, n, Hk, d, layout, N, r),
                       rows_of(g.rdv, B, Nt, n, Hk, d, layout, N, r)};
    for (int64_t bh = 0; bh < B * H; bh++) /* l: [B, H, N] rows */
        for (int64_t i = 0; i < n; i++)
            want[1][bh * n + i] =
                g.rl[bh * Nt + fg_ring_position(layout, N, r, n, i)];
    const char *what[5] = {"O", "l", "dQ", "dK", "dV"};
    const int64_t len[5] = {lq, ls, lq, lk, lk};
    char name[96];
    snprintf(name, sizeof name, "ring N=%d %s %s %s", N,
             layout == FG_RING_ZIGZAG ? "zigzag" : "contiguous",
             causal ? "causal" : "full", fg_dtype_name(dt));
    for (int i = 0; i < 5; i++) {
        const double e = fgd_rel_err(got[i], want[i], (size_t)len[i]);
        if (r == 0)
            report(name, what[i], e, tol);
        else
            FGD_CHECK(e <= tol, "%s on rank %d: %s rel error %.3g", name, r,
                      what[i], e);
        free(got[i]);
        free(want[i]);
    }
    fg_tensor *all[] = {q, k, v, gr, o, m, l, dq, dk, dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        fg_tensor_free(all[i]);
    free(xq); free(xg); free(xk); free(xv);
    gprob_free(&g);
}

/* The data-parallel GPT step against one process on all the rows as N
 * micro-batches. */
static void test_dp(fg_comm *c)
{
    const int N = fg_comm_size(c), r = fg_comm_rank(c);
    const fg_sort_task task = {6, 8};
    fg_gpt_config gc;
    fg_gpt_config_init(&gc);
    gc.vocab = fg_sort_task_vocab(&task);
    gc.ctx = fg_sort_task_seqlen(&task);
    gc.n_embd = 64;
    gc.device = FG_DEVICE_CUDA;
    fg_gpt *a = NULL, *b = NULL;
    FGD_OK(fg_gpt_create(&gc, 3, &a));
    FGD_OK(fg_gpt_create(&gc, 3, &b));
    int n;
    const fg_param *pa = fg_gpt_params(a, &n);
    fg_dp_config dc;
    fg_dp_config_init(&dc);
    dc.bucket_bytes = 32768;
    fg_dp *dp = NULL;
    FGD_OK(fg_dp_create(c, pa, n, &dc, &dp));
    const fg_param *pb = fg_gpt_params(b, &n);
    fg_adamw *ob = NULL;
    FGD_OK(fg_adamw_create(pb, n, &dc.adamw, &ob));
    const int64_t T = fg_sort_task_seqlen(&task), Bn = 4;
    int64_t *x = malloc(sizeof(int64_t) * (size_t)(N * Bn * T)),
            *y = malloc(sizeof(int64_t) * (size_t)(N * Bn * T));
    fg_generator g1, g2;
    fg_generator_init(&g1, 1);
    g2 = g1;
    for (int s = 0; s < 3; s++) {
        uint64_t rng = 5 + (uint64_t)s;
        FGD_OK(fg_sort_task_batch(&task, 0, &rng, N * Bn, x, y));
        FGD_OK(fg_dp_train_step(dp, a, x + r * Bn * T, y + r * Bn * T, Bn, T,
                                1, 1.0, -1, &g1, NULL, NULL));
        FGD_OK(fg_gpt_train_step(b, ob, x, y, Bn, T, N, 1.0, -1, &g2, NULL,
                                 NULL));
    }
    double num = 0, den = 1e-30;
    int same = 1;
    for (int i = 0; i < n; i++) {
        double *u = host(pa[i].tensor), *w = host(pb[i].tensor);
        const int64_t k = fg_tensor_numel(pa[i].tensor);
        for (int64_t j = 0; j < k; j++) {
            num = fmax(num, fabs(u[j] - w[j]));
            den = fmax(den, fabs(w[j]));
            same &= u[j] == w[j];
        }
        free(u);
        free(w);
    }
    char name[64];
    snprintf(name, sizeof name, "data-parallel GPT, N=%d", N);
    if (r == 0)
        report(name, "W", num / den, N == 1 ? 0 : 2e-5);
    else
        FGD_CHECK(num / den <= 2e-5, "%s on rank %d: %.3g", name, r, num / den);
    if (r == 0)
        printf("  %-40s      parameters %s\n", name,
               same ? "bitwise equal" : "equal within rounding");
    fg_dp_free(dp);
    fg_adamw_free(ob);
    fg_gpt_free(a);
    fg_gpt_free(b);
    free(x);
    free(y);
}

/* NCCL's default bucket size (fg_dp_config bucket_bytes 0): an eighth of
 * the gradients' bytes within 25 .. 64 MiB. np fp32 parameters of `mib`
 * MiB each; buckets take whole parameters until they reach the size. */
static void dp_default_buckets(fg_comm *c, int np, int mib, int want)
{
    fg_param ps[64];
    memset(ps, 0, sizeof ps);
    for (int i = 0; i < np; i++) {
        FGD_OK(fg_tensor_zeros(FG_FP32, FG_DEVICE_CUDA, FG_SHAPE((int64_t)mib << 18),
                               &ps[i].tensor));
        FGD_OK(fg_tensor_set_requires_grad(ps[i].tensor, 1));
        snprintf(ps[i].name, sizeof ps[i].name, "p%d", i);
    }
    fg_dp *dp = NULL;
    FGD_OK(fg_dp_create(c, ps, np, NULL, &dp));
    fg_dp_stats st = {0};
    if (dp)
        FGD_OK(fg_dp_get_stats(dp, &st));
    FGD_CHECK(st.buckets == want, "%d x %d MiB of gradients: %d default buckets, "
              "want %d", np, mib, st.buckets, want);
    fg_dp_free(dp);
    for (int i = 0; i < np; i++)
        fg_tensor_free(ps[i].tensor);
}

static void test_dp_buckets(fg_comm *c)
{
    dp_default_buckets(c, 48, 1, 2);  /* 48 MiB: 25 MiB buckets (25 + 23) */
    dp_default_buckets(c, 64, 5, 8);  /* 320 MiB: 40 MiB, 8 parameters each */
    dp_default_buckets(c, 60, 12, 10); /* 720 MiB: 64 MiB, 6 parameters each (72 >= 64) */
    printf("  default bucket sizes (25 MiB, 1/8 of the gradients, 64 MiB): done\n");
}

/* A rank of the multi-process part (exec'd by run_ranks). Exit 3: NCCL
 * would not start (e.g. two ranks on one GPU). */
static int child(int rank, int n, const char *path)
{
    fgd_rank = rank;
    fgd_size = n;
    /* Under compute-sanitizer (FG_SANITIZE) CUDA and NCCL start many
     * times slower, more so beside other sanitizer runs: a rank killed by
     * this alarm there failed a session 11 sweep. */
    const unsigned slow = getenv("FG_SANITIZE") ? 8 : 1;
    alarm(45 * slow); /* a rank left waiting in NCCL's init when another quit */
    fg_comm *c = NULL;
    fg_status s = fg_comm_init_nccl_file(path, rank, n, -1, 30 * (int)slow, &c);
    if (s != FG_OK) {
        fprintf(stderr, "[rank %d] NCCL init: %s\n", rank, fg_last_error());
        return 3;
    }
    alarm(300 * slow);
    test_ops(c);
    test_ring(c, FG_RING_ZIGZAG, 1, FG_FP32, 1e-4);
    test_ring(c, FG_RING_CONTIGUOUS, 0, FG_BF16, 3e-2);
    test_dp(c);
    fg_comm_free(c);
    return fgd_failed ? 1 : 0;
}

static int run_ranks(const char *self, int n)
{
    char path[128], rs[16], ns[16];
    snprintf(path, sizeof path, "/tmp/fg-nccl-id-%ld", (long)getpid());
    snprintf(ns, sizeof ns, "%d", n);
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        snprintf(rs, sizeof rs, "%d", r);
        pids[r] = fork();
        if (pids[r] == 0) {
            execl(self, self, "--rank", rs, ns, path, (char *)NULL);
            _exit(127);
        }
    }
    /* 3: some rank could not start NCCL (the others may then have died
     * of their alarm); 1: a rank failed its checks. */
    int failed = 0, refused = 0;
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        refused |= code == 3;
        failed |= code != 0 && code != 3;
    }
    remove(path);
    return refused ? 3 : failed;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--rank"))
        return child(atoi(argv[2]), atoi(argv[3]), argv[4]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!fg_cuda_available()) {
        printf("skipped: no usable GPU (%s)\n", fg_last_error());
        return 77;
    }
    /* The multi-process part: its ranks are fresh processes (fork + exec,
     * so no CUDA state is inherited). */
    const int nccl = fg_comm_backend_available(FG_COMM_NCCL);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess)
        ndev = 0;
    if (nccl) {
        char self[4096];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        self[k > 0 ? k : 0] = 0;
        const int n = ndev >= 2 ? (ndev < 4 ? ndev : 4) : 2;
        printf("4. NCCL, %d processes on %s (id through a file)\n", n,
               ndev >= 2 ? "separate GPUs" : "one GPU");
        const int rc = run_ranks(self, n);
        if (rc == 3 && ndev < 2)
            printf("  skipped: NCCL refused two ranks on one GPU (expected "
                   "on a one-GPU machine; the ranks' messages are above)\n");
        else
            FGD_CHECK(rc == 0, "multi-process NCCL part failed (exit %d)", rc);
        if (rc == 0)
            printf("  %d ranks: all-reduce, ring attention, data-parallel "
                   "step: done\n", n);
    }
    test_merge();
    printf("2. causal attention in chunks (ring blocks) on one GPU\n");
    chunked_case(FG_FP32, 1e-4);
    chunked_case(FG_BF16, 3e-2);
    if (nccl) {
        printf("3. NCCL, one rank\n");
        char path[128];
        snprintf(path, sizeof path, "/tmp/fg-nccl-id-1-%ld", (long)getpid());
        fg_comm *c = NULL;
        FGD_OK(fg_comm_init_nccl_file(path, 0, 1, -1, 10, &c));
        test_ops(c);
        test_ring(c, FG_RING_ZIGZAG, 1, FG_FP32, 1e-4);
        test_ring(c, FG_RING_CONTIGUOUS, 0, FG_BF16, 3e-2);
        test_dp(c);
        test_dp_buckets(c);
        fg_comm_free(c);
        FGD_CHECK(access(path, F_OK) != 0, "id file left behind");
        /* A world of 2 whose rank 1 never starts: the arrival check fails
         * after its timeout, before NCCL's init would wait forever. */
        fg_comm *c2 = NULL;
        alarm(60); /* a hang fails the suite instead of stalling it */
        const fg_status s2 = fg_comm_init_nccl_file(path, 0, 2, -1, 1.0, &c2);
        alarm(0);
        FGD_CHECK(s2 == FG_ERR_COMM && !c2 && strstr(fg_last_error(), "(rank 1 first)"),
                  "a missing rank: %s, %s", fg_status_string(s2), fg_last_error());
        FGD_CHECK(access(path, F_OK) != 0, "id file left behind by a failed rendezvous");
        /* One process driving the GPUs (up to 2): a grouped all-reduce. */
        const int nd = ndev >= 2 ? 2 : 1;
        int devs[2] = {0, 1};
        fg_comm *cs[2] = {NULL, NULL};
        FGD_OK(fg_comm_init_nccl_devices(devs, nd, cs));
        float *buf[2] = {NULL, NULL};
        const float one[2] = {1, 2};
        for (int i = 0; i < nd; i++) {
            FGD_CHECK(cudaSetDevice(i) == cudaSuccess &&
                          cudaMalloc((void **)&buf[i], sizeof one) == cudaSuccess &&
                          cudaMemcpy(buf[i], one, sizeof one,
                                     cudaMemcpyHostToDevice) == cudaSuccess,
                      "device %d buffer", i);
        }
        FGD_OK(fg_comm_group_start());
        for (int i = 0; i < nd; i++)
            FGD_OK(fg_comm_allreduce(cs[i], buf[i], buf[i], 2, FG_FP32,
                                     FG_REDUCE_SUM));
        FGD_OK(fg_comm_group_end());
        for (int i = 0; i < nd; i++) {
            float got[2] = {0, 0};
            cudaSetDevice(i);
            cudaStreamSynchronize((cudaStream_t)fg_comm_get_stream(cs[i]));
            cudaMemcpy(got, buf[i], sizeof got, cudaMemcpyDeviceToHost);
            FGD_CHECK(got[0] == nd && got[1] == 2 * nd,
                      "grouped all-reduce over %d GPUs of one process: %g %g",
                      nd, got[0], got[1]);
            FGD_CHECK(fg_comm_get_stream(cs[i]) != NULL, "own stream");
            cudaFree(buf[i]);
        }
        cudaSetDevice(0);
        for (int i = 0; i < nd; i++)
            fg_comm_free(cs[i]);
        printf("  one process, %d GPU(s), grouped all-reduce: done\n", nd);
    } else {
        printf("3./4. skipped: built without NCCL\n");
    }
    printf("test_gpu_dist: %d checks, %d failed\n", fgd_checks, fgd_failed);
    return fgd_failed ? 1 : 0;
}
