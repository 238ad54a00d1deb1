/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_attention.c - libFuzzer target for the attention API's
 * argument validation, with an fp64 reference check on every accepted call.
 *
 * The bytes choose tiny sizes (sometimes invalid ones; sometimes sequences
 * of 120 to 159, so a block mask has one or two 128-blocks a side), dtype, causal,
 * dropout, scale, tiles, threads, the variants (fuzz_attn_variants.h:
 * causal alignment, window, softcap, ALiBi, block mask), and for every
 * operand a place in one
 * shared buffer and its strides (contiguous BSHD/BHSD, random, negative,
 * misaligned, NULL), so operands often alias. An independent model of
 * attention.h's rules (sizes, values, alignment, and a byte-by-byte map of
 * which operand owns which byte) says whether the call is valid; the
 * library must agree exactly. A rejected call must leave every byte of the
 * buffer as it was; an accepted one must change only output bytes and match
 * tests/naive_attention.c (fp64, dropout mask from tests/ref_dropout.h).
 * Forward, then backward with the forward's outputs, then the dropout
 * mask. */
#include "fuzz_util.h" /* first: it defines _GNU_SOURCE */

#include <float.h>
#include <math.h>

#include <flashgrad/flashgrad.h>

#include "../naive_attention.h"
#include "../ref_dropout.h"
#include "fuzz_attn_variants.h"

/* A region holds the largest contiguous operand (159 x 2 x 8 fp64) and
 * its start offset; the arena, the ten regions. */
enum { ARENA = 1 << 18, REGION = 24 << 10, NOPS = 10 };
enum { Q, K, V, O, M, L, DO, DQ, DK, DV };

static _Alignas(64) unsigned char arena[ARENA];
static unsigned char snap[ARENA];
static uint16_t owner[ARENA]; /* bit i: operand i owns the byte */
static size_t used;           /* operands lie in arena[0, used) */

typedef struct problem {
    int64_t B, Nq, Nk, H, Hk, d;
    int sizes_ok;
    fg_dtype dt;
    size_t es;
    fg_attn_params p;
    int values_ok; /* scale, dropout, tiles, threads, dtype */
    int numeric;   /* compare with the reference (moderate scale) */
    fg_attn_tensor t[NOPS];
    fg_attn_stats st;
    int64_t maxoff[NOPS]; /* element offset span, -1: not placeable */
    int op_ok[NOPS];      /* pointer, alignment, strides, dtype */
} problem;

static int64_t op_seq(const problem *pb, int i)
{
    return (i == K || i == V || i == DK || i == DV) ? pb->Nk : pb->Nq;
}
static int64_t op_heads(const problem *pb, int i)
{
    return (i == K || i == V || i == DK || i == DV) ? pb->Hk : pb->H;
}

/* Element offset of (b, s, h, x) in operand i (tensors only). */
static int64_t elem_off(const problem *pb, int i, int64_t b, int64_t s,
                        int64_t h, int64_t x)
{
    const fg_attn_tensor *t = &pb->t[i];
    return b * t->stride_b + s * t->stride_s + h * t->stride_h + x;
}

static void decode_sizes(fz *f, problem *pb)
{
    pb->B = 1 + fz_u8(f) % 2;
    pb->Nq = 1 + fz_u8(f) % 5;
    pb->Nk = 1 + fz_u8(f) % 5;
    pb->Hk = 1 + fz_u8(f) % 2;
    pb->H = pb->Hk * (1 + fz_u8(f) % 3);
    pb->d = 8 * (1 + fz_u8(f) % 2);
    pb->sizes_ok = 1;
    switch (fz_u8(f) % 24) { /* rarely, a size the API must refuse */
    case 0: pb->B = 0; break;
    case 1: pb->d = 12; break;
    case 2: pb->d = 264; break;
    case 3: pb->H = pb->Hk * 2 + 1; pb->Hk = 2; break;
    case 4: pb->Nq = -1; break;
    case 5: pb->B = (int64_t)1 << 62; break;
    case 6: pb->Hk = 0; break;
    case 7: pb->Nk = (int64_t)1 << 31; break;
    case 8: pb->B = (int64_t)1 << 62; pb->H = pb->Hk = 4; break;
    case 20: case 21: case 22: case 23: /* long: several sparse blocks */
        pb->B = pb->Hk = 1;
        pb->H = 1 + pb->H % 2;
        pb->d = 8;
        pb->Nq = 120 + fz_u8(f) % 40; /* one or two 128-blocks */
        pb->Nk = 120 + fz_u8(f) % 40;
        return;
    default: return;
    }
    pb->sizes_ok = 0;
}

static void decode_values(fz *f, problem *pb)
{
    static const fg_dtype dts[] = {FG_FP32, FG_FP32, FG_FP32, FG_FP64,
                                   FG_FP64, FG_FP64, FG_FP16, FG_FP32};
    pb->dt = FZ_PICK(f, dts);
    pb->es = fg_dtype_size(pb->dt);
    fg_attn_params *p = &pb->p;
    fg_attn_params_init(p, pb->B, pb->Nq, pb->Nk, pb->H, pb->Hk, pb->d);
    p->causal = fz_u8(f) & 1;
    const uint8_t pd = fz_u8(f);
    p->dropout_p = pd < 128 ? 0.0 : pd == 255 ? 1.0 : pd == 254 ? NAN
                 : pd == 253 ? -0.1 : (pd - 128) / 128.0;
    p->seed = fz_u64(f);
    p->offset = fz_u64(f);
    const uint8_t sc = fz_u8(f);
    static const double wild[] = {1e39, INFINITY, NAN, -1.0, FLT_MAX, 1e30,
                                  1e-40};
    pb->numeric = 1;
    if (sc < 160) {
        p->softmax_scale = 0.0;
    } else if (sc < 240) {
        p->softmax_scale = (sc - 159) / 16.0;
    } else {
        p->softmax_scale = wild[(sc - 240) % 7];
        pb->numeric = 0;
    }
    static const int blocks[] = {0, 1, 2, 3, 7, 16, 1024, 1025, -1};
    p->block_q = FZ_PICK(f, blocks);
    p->block_k = FZ_PICK(f, blocks);
    static const int threads[] = {0, 1, 2, 3, 2000, -1};
    p->num_threads = FZ_PICK(f, threads);
    const double s = p->softmax_scale, dp = p->dropout_p;
    pb->values_ok = isfinite(s) && s >= 0 && s <= FLT_MAX && dp >= 0 &&
                    dp < 1 && p->block_q >= 0 && p->block_q <= 1024 &&
                    p->block_k >= 0 && p->block_k <= 1024 &&
                    p->num_threads >= 0 && p->num_threads <= 1024 &&
                    (pb->dt == FG_FP32 || pb->dt == FG_FP64);
}

/* Place operand i: `separate` gives it its own region (the valid case is
 * common), else anywhere. Returns 0 when it cannot fit in the buffer. */
static int decode_operand(fz *f, problem *pb, int i, int separate)
{
    int *ok = &pb->op_ok[i];
    *ok = 1;
    const size_t es = pb->es;
    const uint8_t mode = fz_u8(f);
    size_t base = separate ? (size_t)i * REGION + (fz_u8(f) % 16) * es
                           : (fz_u16(f) % (ARENA / 2)) / es * es;
    if (mode == 0xff) /* misaligned */
        base += 1;
    void *ptr = mode == 0xfe ? NULL : arena + base;
    *ok = *ok && ptr && base % es == 0;
    if (i == M || i == L) {
        void **slot = i == M ? &pb->st.m : &pb->st.l;
        *slot = ptr;
        pb->maxoff[i] = pb->sizes_ok ? pb->B * pb->H * pb->Nq - 1 : -1;
    } else {
        const int64_t S = op_seq(pb, i), Hh = op_heads(pb, i), d = pb->d;
        fg_attn_tensor *t = &pb->t[i];
        if (mode % 4 < 2 && pb->sizes_ok) {
            *t = mode % 4 == 0 ? fg_attn_bshd(ptr, pb->dt, S, Hh, d)
                               : fg_attn_bhsd(ptr, pb->dt, S, Hh, d);
        } else {
            t->data = ptr;
            t->dtype = pb->dt;
            t->stride_b = fz_u8(f);
            t->stride_s = fz_u8(f) % 64;
            t->stride_h = fz_u8(f) % 64;
            if (mode % 4 == 3) { /* one negative stride */
                const int64_t neg = -(int64_t)(fz_u8(f) % 8) - 1;
                switch (mode / 4 % 3) {
                case 0: t->stride_b = neg; break;
                case 1: t->stride_s = neg; break;
                default: t->stride_h = neg; break;
                }
                *ok = 0;
            }
        }
        pb->maxoff[i] = -1;
        if (pb->sizes_ok && t->stride_b >= 0 && t->stride_s >= 0 &&
            t->stride_h >= 0)
            pb->maxoff[i] = elem_off(pb, i, pb->B - 1, S - 1, Hh - 1, d - 1);
    }
    const size_t end = base + (size_t)(pb->maxoff[i] + 1) * es;
    if (ptr && pb->maxoff[i] >= 0 && end > ARENA)
        return 0;
    if (end > used)
        used = end;
    return 1;
}

/* Marks the bytes of operand i in owner[]; 1 if two of its elements share
 * a byte. */
FZ_ORACLE static int mark(const problem *pb, int i)
{
    const size_t es = pb->es;
    const uint16_t bit = (uint16_t)(1u << i);
    int self = 0;
    const unsigned char *base =
        i == M ? pb->st.m : i == L ? pb->st.l : pb->t[i].data;
    if (i == M || i == L) {
        for (int64_t e = 0; e <= pb->maxoff[i]; e++)
            for (size_t c = 0; c < es; c++)
                owner[base - arena + e * es + c] |= bit;
        return 0;
    }
    const int64_t S = op_seq(pb, i), Hh = op_heads(pb, i);
    for (int64_t b = 0; b < pb->B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < Hh; h++)
                for (int64_t x = 0; x < pb->d; x++)
                    for (size_t c = 0; c < es; c++) {
                        uint16_t *w = &owner[base - arena +
                                             elem_off(pb, i, b, s, h, x) * es +
                                             c];
                        self |= (*w & bit) != 0;
                        *w |= bit;
                    }
    return self;
}

/* Valid placement: no output shares a byte with itself (distinct
 * elements) or with any other operand of the call. */
FZ_ORACLE static int placement_ok(const problem *pb, const int *ops, int n,
                        uint16_t out_mask)
{
    memset(owner, 0, sizeof owner[0] * used);
    int self = 0;
    for (int k = 0; k < n; k++)
        if (mark(pb, ops[k]) && (out_mask >> ops[k] & 1))
            self = 1;
    if (self)
        return 0;
    for (size_t b = 0; b < used; b++) {
        const uint16_t w = owner[b];
        if ((w & out_mask) && (w & (w - 1))) /* an output and another */
            return 0;
    }
    return 1;
}

static int ops_ok(const problem *pb, const int *ops, int n)
{
    for (int k = 0; k < n; k++)
        if (!pb->op_ok[ops[k]])
            return 0;
    return 1;
}

static double load(const problem *pb, const void *p)
{
    return pb->dt == FG_FP64 ? *(const double *)p : *(const float *)p;
}

/* Operand i as a contiguous BSHD fp64 array, read from `mem` (the arena or
 * its snapshot). */
FZ_ORACLE static double *gather(const problem *pb, int i, const unsigned char *mem)
{
    const int64_t S = op_seq(pb, i), Hh = op_heads(pb, i), d = pb->d;
    double *out = malloc(sizeof(double) * (size_t)(pb->B * S * Hh * d));
    const unsigned char *base =
        mem + ((const unsigned char *)pb->t[i].data - arena);
    for (int64_t b = 0; b < pb->B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < Hh; h++)
                for (int64_t x = 0; x < d; x++)
                    out[((b * S + s) * Hh + h) * d + x] =
                        load(pb, base + elem_off(pb, i, b, s, h, x) * pb->es);
    return out;
}

FZ_ORACLE static double *gather_stats(const problem *pb, const void *ptr)
{
    const int64_t n = pb->B * pb->H * pb->Nq;
    double *out = malloc(sizeof(double) * (size_t)n);
    for (int64_t e = 0; e < n; e++)
        out[e] = load(pb, (const unsigned char *)ptr + e * pb->es);
    return out;
}

/* |a - ref| <= tol * max(1, max |ref|); -inf only where ref is -inf. */
FZ_ORACLE static void compare(const char *what, const double *a, const double *ref,
                    int64_t n, double tol)
{
    double scale = 1;
    for (int64_t e = 0; e < n; e++)
        if (isfinite(ref[e]) && fabs(ref[e]) > scale)
            scale = fabs(ref[e]);
    for (int64_t e = 0; e < n; e++) {
        if (isinf(ref[e]) || isinf(a[e])) {
            FZ_CHECK(a[e] == ref[e], "%s[%lld] = %g, reference %g", what,
                     (long long)e, a[e], ref[e]);
            continue;
        }
        FZ_CHECK(fabs(a[e] - ref[e]) <= tol * scale,
                 "%s[%lld] = %.17g, reference %.17g", what, (long long)e,
                 a[e], ref[e]);
    }
}

/* Only bytes owned by the given outputs may differ from the snapshot. */
FZ_ORACLE static void only_outputs_changed(uint16_t out_mask, const char *call)
{
    FZ_CHECK(memcmp(arena + used, snap + used, ARENA - used) == 0,
             "%s wrote past every operand", call);
    for (size_t c = 0; c < used; c += 64) {
        const size_t len = used - c < 64 ? used - c : 64;
        if (memcmp(arena + c, snap + c, len) == 0)
            continue;
        for (size_t b = c; b < c + len; b++)
            if (!(owner[b] & out_mask))
                FZ_CHECK(arena[b] == snap[b],
                         "%s changed byte %zu, which is no output's", call,
                         b);
    }
}

FZ_ORACLE static void fill_arena(const problem *pb, uint64_t seed)
{
    /* Finite values in [-2, 2) of the operand type everywhere, so any
     * element an operand reaches holds a plain number. */
    const size_t n = (used + 7) / 8; /* the rest is never read */
    if (pb->dt == FG_FP64)
        for (size_t e = 0; e < n; e++)
            ((double *)arena)[e] = (double)(fz_mix(&seed) >> 11) * 0x1p-51 - 2;
    else
        for (size_t e = 0; e < 2 * n; e++)
            ((float *)arena)[e] = (float)((fz_mix(&seed) >> 40) * 0x1p-22 - 2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    problem pb;
    memset(&pb, 0, sizeof pb);
    used = 0;
    decode_sizes(&f, &pb);
    decode_values(&f, &pb);
    static fz_variants var;
    memset(&var, 0, sizeof var);
    var.ok = 1;
    if (pb.sizes_ok) /* the variants' arrays are sized by B and H */
        fv_decode(&f, &pb.p, &var);
    const uint8_t flags = fz_u8(&f);
    const int separate = !(flags & 1);
    int stats_ok = 1;
    pb.st.dtype = pb.dt == FG_FP64 ? FG_FP64 : FG_FP32;
    if (pb.dt == FG_FP16)
        pb.es = 2;
    for (int i = 0; i < NOPS; i++)
        if (!decode_operand(&f, &pb, i, separate))
            return 0; /* would reach past the buffer */
    if (flags & 2) { /* one operand of another dtype */
        const int i = 1 + fz_u8(&f) % 3;
        pb.t[i].dtype = pb.dt == FG_FP64 ? FG_FP32 : FG_FP64;
        pb.op_ok[i] = 0;
    }
    if (flags & 4) { /* stats of the wrong dtype */
        pb.st.dtype = pb.st.dtype == FG_FP64 ? FG_FP32 : FG_FP64;
        stats_ok = 0;
    }
    if (pb.dt == FG_FP16)
        pb.st.dtype = FG_FP32;
    uint64_t seed = fz_u64(&f) ^ size;
    fill_arena(&pb, seed);

    /* ---- forward ---- */
    static const int fwd_ops[] = {Q, K, V, O, M, L};
    const uint16_t fwd_out = 1u << O | 1u << M | 1u << L;
    const int fwd_valid = pb.sizes_ok && pb.values_ok && stats_ok && var.ok &&
                          ops_ok(&pb, fwd_ops, 6) &&
                          placement_ok(&pb, fwd_ops, 6, fwd_out);
    memcpy(snap, arena, ARENA);
    fg_clear_error();
    fg_status s = fg_attention_forward(&pb.p, &pb.t[Q], &pb.t[K], &pb.t[V],
                                       &pb.t[O], &pb.st);
    FZ_CHECK((s == FG_OK) == fwd_valid,
             "forward returned %s, the model says %s (%s)",
             fg_status_string(s), fwd_valid ? "valid" : "invalid",
             fg_last_error());
    if (s != FG_OK) {
        FZ_CHECK(fg_last_error()[0] != '\0', "no message for %s",
                 fg_status_string(s));
        FZ_CHECK(memcmp(arena, snap, ARENA) == 0,
                 "a rejected forward wrote to memory");
        return 0;
    }
    only_outputs_changed(fwd_out, "forward");
    const double tol = pb.dt == FG_FP64 ? 1e-10 : 2e-4;
    naive_shape ns = {.B = pb.B, .Nq = pb.Nq, .Nk = pb.Nk, .H = pb.H,
                      .Hk = pb.Hk, .d = pb.d,
                      .scale = pb.p.softmax_scale > 0
                                   ? pb.p.softmax_scale
                                   : 1.0 / sqrt((double)pb.d),
                      .causal = pb.p.causal, .p = pb.p.dropout_p};
    fv_reference(&pb.p, &var, &ns);
    const int64_t nmask = pb.B * pb.H * pb.Nq * pb.Nk;
    uint8_t *mask = malloc((size_t)nmask);
    ref_dropout_mask(pb.p.seed, pb.p.offset, pb.p.dropout_p, pb.B, pb.H,
                     pb.Nq, pb.Nk, mask);
    if (pb.p.dropout_p > 0)
        ns.keep = mask;
    double *q = gather(&pb, Q, snap), *k = gather(&pb, K, snap),
           *v = gather(&pb, V, snap);
    const int64_t nq = pb.B * pb.Nq * pb.H * pb.d,
                  nk = pb.B * pb.Nk * pb.Hk * pb.d, ns_ = pb.B * pb.H * pb.Nq;
    if (pb.numeric) {
        double *ro = malloc(sizeof(double) * (size_t)nq),
               *rm = malloc(sizeof(double) * (size_t)ns_),
               *rl = malloc(sizeof(double) * (size_t)ns_);
        naive_attention_forward(&ns, q, k, v, ro, rm, rl);
        double *o = gather(&pb, O, arena), *m = gather_stats(&pb, pb.st.m),
               *l = gather_stats(&pb, pb.st.l);
        compare("O", o, ro, nq, tol);
        compare("m", m, rm, ns_, tol);
        compare("l", l, rl, ns_, tol);
        free(o); free(m); free(l); free(ro); free(rm); free(rl);
    }

    /* ---- backward, from the forward's O, m, l ---- */
    if (flags & 8) {
        static const int bwd_ops[] = {Q, K, V, O, DO, M, L, DQ, DK, DV};
        const uint16_t bwd_out = 1u << DQ | 1u << DK | 1u << DV;
        const int bwd_valid = ops_ok(&pb, bwd_ops, 10) &&
                              placement_ok(&pb, bwd_ops, 10, bwd_out);
        memcpy(snap, arena, ARENA);
        fg_clear_error();
        s = fg_attention_backward(&pb.p, &pb.t[Q], &pb.t[K], &pb.t[V],
                                  &pb.t[O], &pb.t[DO], &pb.st, &pb.t[DQ],
                                  &pb.t[DK], &pb.t[DV]);
        FZ_CHECK((s == FG_OK) == bwd_valid,
                 "backward returned %s, the model says %s (%s)",
                 fg_status_string(s), bwd_valid ? "valid" : "invalid",
                 fg_last_error());
        if (s != FG_OK) {
            FZ_CHECK(memcmp(arena, snap, ARENA) == 0,
                     "a rejected backward wrote to memory");
        } else {
            only_outputs_changed(bwd_out, "backward");
            if (pb.numeric) {
                double *g = gather(&pb, DO, snap);
                double *rq = malloc(sizeof(double) * (size_t)nq),
                       *rk = malloc(sizeof(double) * (size_t)nk),
                       *rv = malloc(sizeof(double) * (size_t)nk);
                naive_attention_backward(&ns, q, k, v, g, rq, rk, rv);
                double *dq = gather(&pb, DQ, arena),
                       *dk = gather(&pb, DK, arena),
                       *dv = gather(&pb, DV, arena);
                const double btol = pb.dt == FG_FP64 ? 1e-9 : 1e-3;
                compare("dQ", dq, rq, nq, btol);
                compare("dK", dk, rk, nk, btol);
                compare("dV", dv, rv, nk, btol);
                free(g); free(rq); free(rk); free(rv);
                free(dq); free(dk); free(dv);
            }
        }
    }

    /* ---- the dropout mask of the same parameters ---- */
    if (flags & 16) {
        uint8_t *got = malloc((size_t)nmask);
        memset(got, 7, (size_t)nmask);
        s = fg_attention_dropout_mask(&pb.p, got);
        FZ_CHECK(s == FG_OK, "dropout mask: %s", fg_last_error());
        FZ_CHECK(memcmp(got, mask, (size_t)nmask) == 0,
                 "dropout mask differs from the documented mapping");
        free(got);
    }
    free(mask);
    free(q);
    free(k);
    free(v);
    return 0;
}
