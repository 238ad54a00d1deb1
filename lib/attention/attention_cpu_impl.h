/* SPDX-License-Identifier: MIT */
/* lib/attention/attention_cpu_impl.h - the tiled FlashAttention forward and backward on
 * the CPU, instantiated by attention_cpu.c for T = float and T = double.
 *
 * The tiling mirrors the GPU kernels: a query block of Br rows stays "on
 * chip" (thread-local tiles) while K/V blocks of Bc rows stream past it.
 * Arithmetic is done in T, as the GPU accumulates fp32 for fp32 inputs.
 * Line numbers "Alg1 L.." / "Alg4 L.." refer to Algorithms 1 and 4 of
 * Dao et al., arXiv 2205.14135; the loop order and the end-of-loop
 * normalisation follow FlashAttention-2 (query blocks outer; D = rowsum(dO*O)).
 *
 * Masks and score modifiers (window, causal alignment, block mask, softcap,
 * ALiBi) follow attention.h: the band limits which K/V blocks a query block
 * visits (and which query rows a K/V block is visited by), the block mask
 * lists them, and score_mod() turns scale * q.k into the final logit.
 *
 * Expects: T, SFX (name suffix), EXP and TANH (for T). */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

/* Element (b, s, h, 0) of a strided operand. */
static inline T *FN(at)(const fg_attn_tensor *t, int64_t b, int64_t s,
                        int64_t h)
{
    return (T *)t->data + b * t->stride_b + s * t->stride_s + h * t->stride_h;
}

/* Scale kept probabilities by 256/T (1 / the keep probability), zero dropped ones. */
static inline void FN(apply_dropout)(T *row, const uint8_t *keep, int64_t n,
                                     T keep_scale)
{
    for (int64_t c = 0; c < n; c++)
        row[c] = keep[c] ? row[c] * keep_scale : (T)0;
}

/* Columns [*c_lo, *c_hi) of the tile of keys j0 .. j0+cols-1 that row i
 * sees through the band (empty when *c_hi <= *c_lo). */
static inline void FN(row_cols)(const fg_attn_problem *pb, int64_t i,
                                int64_t j0, int64_t cols, int64_t *c_lo,
                                int64_t *c_hi)
{
    *c_lo = 0;
    *c_hi = cols;
    if (pb->band) {
        *c_lo = fg_attn_clamp(fg_attn_key_begin(pb, i) - j0, 0, cols);
        *c_hi = fg_attn_clamp(fg_attn_key_end(pb, i) - j0, 0, cols);
    }
}

/* s[c] += bias[b, h, i, j0 + c] over [c_lo, c_hi) (bias fp32 or T). */
static inline void FN(add_bias)(const fg_attn_problem *pb, T *s, int64_t b,
                                int64_t h, int64_t i, int64_t j0,
                                int64_t c_lo, int64_t c_hi)
{
    const fg_attn_bias *t = &pb->bias;
    const int64_t off = fg_attn_bias_off(t, b, h, i, j0), sk = t->stride_k;
    if (t->dtype == FG_FP32) {
        const float *x = (const float *)t->data + off;
        for (int64_t c = c_lo; c < c_hi; c++)
            s[c] += (T)x[c * sk];
    } else {
        const T *x = (const T *)t->data + off;
        for (int64_t c = c_lo; c < c_hi; c++)
            s[c] += x[c * sk];
    }
}

/* The final logits of row i over columns [c_lo, c_hi): s holds
 * scale * q.k on entry. Softcap, then ALiBi, then the bias (attention.h);
 * dcap, if not NULL, receives d(capped)/d(scaled) = 1 - tanh^2 for the
 * backward. */
static inline void FN(score_mod)(const fg_attn_problem *pb, T *s, T *dcap,
                                 int64_t b, int64_t h, int64_t i, int64_t j0,
                                 int64_t c_lo, int64_t c_hi)
{
    if (pb->softcap > 0) {
        const T cap = (T)pb->softcap, inv = (T)1 / cap;
        for (int64_t c = c_lo; c < c_hi; c++) {
            const T t = TANH(s[c] * inv);
            s[c] = cap * t;
            if (dcap)
                dcap[c] = (T)1 - t * t;
        }
    }
    if (pb->alibi) {
        const T slope = (T)pb->alibi[b * pb->alibi_sb + h];
        const int64_t ip = i + pb->causal_shift;
        for (int64_t c = c_lo; c < c_hi; c++) {
            const int64_t dist = ip - (j0 + c);
            s[c] -= slope * (T)(dist < 0 ? -dist : dist);
        }
    }
    if (pb->bias.data)
        FN(add_bias)(pb, s, b, h, i, j0, c_lo, c_hi);
}

/* The spans of indices [lo, hi) a block walks: the band's range, cut to the
 * listed sparse blocks when there is a block mask (list != NULL). Span n of
 * count; returns 0 when it is empty. */
static inline int FN(span)(int64_t lo, int64_t hi, const int32_t *list,
                           int32_t n, int64_t *s_lo, int64_t *s_hi)
{
    if (!list) {
        *s_lo = lo;
        *s_hi = hi;
    } else {
        const int64_t a = (int64_t)list[n] * FG_ATTN_SPARSE_BLOCK;
        *s_lo = a > lo ? a : lo;
        *s_hi = a + FG_ATTN_SPARSE_BLOCK < hi ? a + FG_ATTN_SPARSE_BLOCK : hi;
    }
    return *s_hi > *s_lo;
}

/* ---- forward --------------------------------------------------------- */

typedef struct FN(fwd_ws) {
    T *q;   /* [Br, d]  query tile */
    T *kt;  /* [d, Bc]  K tile, transposed so S = Q K^T is an axpy over c */
    T *v;   /* [Bc, d]  V tile */
    T *s;   /* [Br, Bc] scores, then probabilities */
    T *acc; /* [Br, d]  unnormalised O accumulator */
    T *m;   /* [Br]     running row max */
    T *l;   /* [Br]     running row sum */
    uint8_t *keep; /* [Bc] dropout flags of one row */
} FN(fwd_ws);

static size_t FN(fwd_ws_bytes)(int64_t Br, int64_t Bc, int64_t d)
{
    /* Rounded to 64 bytes: thread t's tiles start at t * bytes. */
    size_t b = sizeof(T) * (size_t)(2 * Br * d + 2 * Bc * d + Br * Bc + 2 * Br) +
               (size_t)Bc;
    return (b + 63) & ~(size_t)63;
}

static void FN(fwd_ws_carve)(FN(fwd_ws) *w, void *mem, int64_t Br, int64_t Bc,
                             int64_t d)
{
    T *p = (T *)mem;
    w->q = p;   p += Br * d;
    w->kt = p;  p += d * Bc;
    w->v = p;   p += Bc * d;
    w->s = p;   p += Br * Bc;
    w->acc = p; p += Br * d;
    w->m = p;   p += Br;
    w->l = p;   p += Br;
    w->keep = (uint8_t *)p;
}

/* One query block i0 .. i0+rows-1 of head h in batch b. */
static void FN(fwd_block)(const fg_attn_problem *pb, FN(fwd_ws) *w, int64_t b,
                          int64_t h, int64_t i0, const fg_attn_tensor *q,
                          const fg_attn_tensor *k, const fg_attn_tensor *v,
                          const fg_attn_tensor *o, const fg_attn_stats *st)
{
    const int64_t d = pb->d, Bc = pb->block_k, hk = h / pb->group;
    const int64_t rows = pb->Nq - i0 < pb->block_q ? pb->Nq - i0 : pb->block_q;
    const T scale = (T)pb->scale, keep_scale = (T)pb->keep_scale;
    const int dropout = pb->dropout_p > 0.0;

    /* Alg1 L.8: load Q_i; L.2-4 (FA2 form): O_i = 0, l_i = 0, m_i = -inf. */
    for (int64_t r = 0; r < rows; r++) {
        const T *src = FN(at)(q, b, i0 + r, h);
        for (int64_t x = 0; x < d; x++)
            w->q[r * d + x] = src[x];
        for (int64_t x = 0; x < d; x++)
            w->acc[r * d + x] = 0;
        w->m[r] = -(T)INFINITY;
        w->l[r] = 0;
    }

    /* The band (causal, window) bounds the keys any row of the block sees:
     * K/V blocks outside are skipped, not computed and masked; with a block
     * mask only the listed blocks are walked (block-sparse FlashAttention). */
    const int64_t kb_lo = fg_attn_key_begin(pb, i0);
    const int64_t kb_hi = fg_attn_key_end(pb, i0 + rows - 1);
    int32_t nspans = 1;
    const int32_t *list = NULL;
    if (pb->sparse)
        list = fg_attn_kv_list(pb, b, h, i0 / FG_ATTN_SPARSE_BLOCK, &nspans);

    for (int32_t sp = 0; sp < nspans; sp++) {
    int64_t s_lo, s_hi;
    if (!FN(span)(kb_lo, kb_hi, list, sp, &s_lo, &s_hi))
        continue;
    for (int64_t j0 = s_lo; j0 < s_hi; j0 += Bc) {
        const int64_t cols = s_hi - j0 < Bc ? s_hi - j0 : Bc;
        /* Alg1 L.6: load K_j, V_j. */
        for (int64_t c = 0; c < cols; c++) {
            const T *ks = FN(at)(k, b, j0 + c, hk);
            const T *vs = FN(at)(v, b, j0 + c, hk);
            for (int64_t x = 0; x < d; x++) {
                w->kt[x * Bc + c] = ks[x];
                w->v[c * d + x] = vs[x];
            }
        }

        for (int64_t r = 0; r < rows; r++) {
            T *s = w->s + r * Bc;
            int64_t c_lo, c_hi; /* the keys of this tile row r sees */
            FN(row_cols)(pb, i0 + r, j0, cols, &c_lo, &c_hi);
            if (c_hi <= c_lo)
                continue;
            /* Alg1 L.9: S_ij = scale * Q_i K_j^T, then the score mods. */
            for (int64_t c = c_lo; c < c_hi; c++)
                s[c] = 0;
            for (int64_t x = 0; x < d; x++) {
                const T qx = w->q[r * d + x];
                const T *kr = w->kt + x * Bc;
                for (int64_t c = c_lo; c < c_hi; c++)
                    s[c] += qx * kr[c];
            }
            for (int64_t c = c_lo; c < c_hi; c++)
                s[c] *= scale;
            FN(score_mod)(pb, s, NULL, b, h, i0 + r, j0, c_lo, c_hi);
            /* Alg1 L.10: row max of the block, new running max. A NaN
             * score wins the max, so the row becomes NaN, never "empty". */
            T mx = w->m[r];
            for (int64_t c = c_lo; c < c_hi; c++)
                if (s[c] > mx || s[c] != s[c])
                    mx = s[c];
            if (mx == -(T)INFINITY)
                continue; /* nothing visible yet in this row */
            /* P~ = exp(S - m_new), rowsum; Alg1 L.11: rescale l by
             * exp(m_old - m_new). */
            const T alpha = EXP(w->m[r] - mx); /* exp(-inf) = 0 at start */
            T sum = 0;
            for (int64_t c = 0; c < c_lo; c++)
                s[c] = 0;
            for (int64_t c = c_lo; c < c_hi; c++) {
                s[c] = EXP(s[c] - mx);
                sum += s[c];
            }
            for (int64_t c = c_hi; c < cols; c++)
                s[c] = 0;
            w->l[r] = alpha * w->l[r] + sum;
            w->m[r] = mx;
            /* Dropout hits the probabilities feeding O, not the normaliser. */
            if (dropout) {
                fg_dropout_row(pb, b, h, i0 + r, j0, cols, w->keep);
                FN(apply_dropout)(s, w->keep, cols, keep_scale);
            }
            /* Alg1 L.12: O_i = diag(alpha) O_i + P~ V_j (unnormalised). */
            T *acc = w->acc + r * d;
            for (int64_t x = 0; x < d; x++)
                acc[x] *= alpha;
            for (int64_t c = c_lo; c < c_hi; c++) {
                const T pc = s[c];
                const T *vr = w->v + c * d;
                for (int64_t x = 0; x < d; x++)
                    acc[x] += pc * vr[x];
            }
        }
    }
    }

    /* Normalise once (FA2) and write O, m, l (Alg1 L.12-13). Fully masked
     * rows keep l = 0 and get O = 0; NaN rows stay NaN. */
    T *m_out = (T *)st->m + b * pb->st_b + h * pb->st_h + i0;
    T *l_out = (T *)st->l + b * pb->st_b + h * pb->st_h + i0;
    for (int64_t r = 0; r < rows; r++) {
        T *dst = FN(at)(o, b, i0 + r, h);
        const T inv = w->l[r] == 0 ? (T)0 : (T)1 / w->l[r];
        for (int64_t x = 0; x < d; x++)
            dst[x] = w->acc[r * d + x] * inv;
        m_out[r] = w->m[r];
        l_out[r] = w->l[r];
    }
}

static fg_status FN(forward)(const fg_attn_problem *pb, const fg_attn_tensor *q,
                             const fg_attn_tensor *k, const fg_attn_tensor *v,
                             const fg_attn_tensor *o, const fg_attn_stats *st)
{
    const int64_t Br = pb->block_q, Bc = pb->block_k, d = pb->d;
    const int64_t nqb = (pb->Nq + Br - 1) / Br;
    const int64_t ntasks = pb->B * pb->H * nqb;
    const int nt = fg_cpu_threads(pb->num_threads, ntasks,
                                  (double)pb->B * pb->H * pb->Nq * pb->Nk * d);
    const size_t wsb = FN(fwd_ws_bytes)(Br, Bc, d);
    /* All workspace up front: an allocation failure leaves O untouched. */
    char *mem = (char *)fg_cpu_workspace(wsb * (size_t)nt);
    if (!mem)
        return fg_error(FG_ERR_OUT_OF_MEMORY,
                        "fg_attention_forward: cannot allocate %zu bytes of "
                        "CPU workspace",
                        wsb * (size_t)nt);
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        FN(fwd_ws) w;
        FN(fwd_ws_carve)(&w, mem + wsb * (size_t)fg_cpu_thread_id(), Br, Bc, d);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < ntasks; t++) {
            const int64_t ib = t % nqb, bh = t / nqb;
            const int64_t b = bh / pb->H, h = bh % pb->H;
            if (!fg_attn_ragged(pb)) {
                FN(fwd_block)(pb, &w, b, h, ib * Br, q, k, v, o, st);
                continue;
            }
            /* Packed or key-padded: sequence b as a problem of its own
             * (Nq is the longest sequence: blocks past this one's end
             * have nothing to do). */
            const fg_attn_tensor *in[4] = {q, o, k, v};
            fg_attn_tensor t1[4];
            fg_attn_problem sp;
            fg_attn_stats st1;
            const fg_attn_seq sq =
                fg_attn_seq_views(pb, b, &sp, in, 2, 4, t1, st, &st1);
            if (ib * Br < sq.nq)
                FN(fwd_block)(&sp, &w, b, h, ib * Br, &t1[0], &t1[2], &t1[3],
                              &t1[1], &st1);
        }
    }
    return FG_OK;
}

/* ---- backward -------------------------------------------------------- */

typedef struct FN(bwd_ws) {
    T *kt;  /* [d, Bc]  K_j transposed (S = Q K^T) */
    T *vt;  /* [d, Bc]  V_j transposed (dP = dO V^T) */
    T *kr;  /* [Bc, d]  K_j row-major (dQ += dS K) */
    T *dk;  /* [Bc, d]  dK_j accumulator */
    T *dv;  /* [Bc, d]  dV_j accumulator */
    T *p;   /* [Bc]     one row of P */
    T *pd;  /* [Bc]     P with dropout applied */
    T *dp;  /* [Bc]     one row of dP, then dS */
    T *dcap; /* [Bc]    softcap derivative 1 - tanh^2 of one row */
    uint8_t *keep; /* [Bc] */
} FN(bwd_ws);

static size_t FN(bwd_ws_bytes)(int64_t Bc, int64_t d)
{
    size_t b = sizeof(T) * (size_t)(5 * Bc * d + 4 * Bc) + (size_t)Bc;
    return (b + 63) & ~(size_t)63;
}

static void FN(bwd_ws_carve)(FN(bwd_ws) *w, void *mem, int64_t Bc, int64_t d)
{
    T *p = (T *)mem;
    w->kt = p; p += d * Bc;
    w->vt = p; p += d * Bc;
    w->kr = p; p += Bc * d;
    w->dk = p; p += Bc * d;
    w->dv = p; p += Bc * d;
    w->p = p;  p += Bc;
    w->pd = p; p += Bc;
    w->dp = p; p += Bc;
    w->dcap = p; p += Bc;
    w->keep = (uint8_t *)p;
}

/* Row i of (b, h) against the loaded K_j^T, V_j^T tile, columns
 * [c_lo, c_hi) (Alg4 L.12-21): w->p = P, w->pd = P with dropout (when on),
 * w->dp = dS at the final logit, P (dP - D_i) (what dBias receives), and
 * w->dcap = 1 - tanh^2 of the softcap. Returns the P that feeds dV. */
static const T *FN(bwd_row)(const fg_attn_problem *pb, FN(bwd_ws) *w,
                            int64_t b, int64_t h, int64_t i, int64_t j0,
                            int64_t cols, int64_t c_lo, int64_t c_hi,
                            const T *qi, const T *doi, T mi, T li, T Di)
{
    const int64_t d = pb->d, Bc = pb->block_k;
    const T scale = (T)pb->scale, keep_scale = (T)pb->keep_scale;
    const int dropout = pb->dropout_p > 0.0;
    /* Alg4 L.12-14: S = scale Q_i K_j^T, score mods, P = exp(S - m) / l. */
    T *p = w->p;
    for (int64_t c = c_lo; c < c_hi; c++)
        p[c] = 0;
    for (int64_t x = 0; x < d; x++) {
        const T qx = qi[x];
        const T *kr = w->kt + x * Bc;
        for (int64_t c = c_lo; c < c_hi; c++)
            p[c] += qx * kr[c];
    }
    for (int64_t c = c_lo; c < c_hi; c++)
        p[c] *= scale;
    FN(score_mod)(pb, p, w->dcap, b, h, i, j0, c_lo, c_hi);
    const T inv_l = (T)1 / li;
    for (int64_t c = c_lo; c < c_hi; c++)
        p[c] = EXP(p[c] - mi) * inv_l;
    /* Alg4 L.15-16: regenerate the mask, P_dropped = P*Z/(1-p). */
    const T *pd = p;
    if (dropout) {
        fg_dropout_row(pb, b, h, i, j0, cols, w->keep);
        for (int64_t c = c_lo; c < c_hi; c++)
            w->pd[c] = w->keep[c] ? p[c] * keep_scale : (T)0;
        pd = w->pd;
    }
    /* Alg4 L.18-19: dP = (dO_i V_j^T) * Z/(1-p). */
    T *dp = w->dp;
    for (int64_t c = c_lo; c < c_hi; c++)
        dp[c] = 0;
    for (int64_t x = 0; x < d; x++) {
        const T gx = doi[x];
        const T *vr = w->vt + x * Bc;
        for (int64_t c = c_lo; c < c_hi; c++)
            dp[c] += gx * vr[c];
    }
    if (dropout)
        for (int64_t c = c_lo; c < c_hi; c++)
            dp[c] = w->keep[c] ? dp[c] * keep_scale : (T)0;
    /* Alg4 L.20-21: dS = P * (dP - D_i), D_i precomputed (FA2). */
    for (int64_t c = c_lo; c < c_hi; c++)
        dp[c] = p[c] * (dp[c] - Di);
    return pd;
}

/* Loads K_j^T and V_j^T of (b, hk) (cols keys from j0) into w. */
static void FN(load_kv_t)(const fg_attn_problem *pb, FN(bwd_ws) *w,
                          const fg_attn_tensor *k, const fg_attn_tensor *v,
                          int64_t b, int64_t hk, int64_t j0, int64_t cols)
{
    const int64_t d = pb->d, Bc = pb->block_k;
    for (int64_t c = 0; c < cols; c++) {
        const T *ks = FN(at)(k, b, j0 + c, hk);
        const T *vs = FN(at)(v, b, j0 + c, hk);
        for (int64_t x = 0; x < d; x++) {
            w->kt[x * Bc + c] = ks[x];
            w->vt[x * Bc + c] = vs[x];
        }
    }
}

/* All K/V blocks of K/V head hk in batch b, for every query head of its
 * group. One task owns dK/dV of that head and dQ of the group's query heads,
 * so tasks never write the same element and the sums have a fixed order. */
static void FN(bwd_task)(const fg_attn_problem *pb, FN(bwd_ws) *w, int64_t b,
                         int64_t hk, const fg_attn_tensor *q,
                         const fg_attn_tensor *k, const fg_attn_tensor *v,
                         const fg_attn_tensor *dout, const fg_attn_stats *st,
                         const T *D, const fg_attn_tensor *dq,
                         const fg_attn_tensor *dk, const fg_attn_tensor *dv)
{
    const int64_t d = pb->d, Bc = pb->block_k, Nq = pb->Nq;
    const T scale = (T)pb->scale;

    for (int64_t g = 0; g < pb->group; g++) {
        const int64_t h = hk * pb->group + g;
        for (int64_t i = 0; i < Nq; i++) {
            T *dst = FN(at)(dq, b, i, h);
            for (int64_t x = 0; x < d; x++)
                dst[x] = 0;
        }
    }

    for (int64_t j0 = 0; j0 < pb->Nk; j0 += Bc) {
        const int64_t cols = pb->Nk - j0 < Bc ? pb->Nk - j0 : Bc;
        /* Alg4 L.8: load K_j, V_j; L.9: dK_j = dV_j = 0 (on chip). */
        FN(load_kv_t)(pb, w, k, v, b, hk, j0, cols);
        for (int64_t c = 0; c < cols; c++) {
            const T *ks = FN(at)(k, b, j0 + c, hk);
            for (int64_t x = 0; x < d; x++) {
                w->kr[c * d + x] = ks[x];
                w->dk[c * d + x] = 0;
                w->dv[c * d + x] = 0;
            }
        }
        /* The band bounds the query rows that see any of these keys; with
         * a block mask only the listed query blocks are walked. */
        const int64_t qb_lo = fg_attn_query_begin(pb, j0);
        const int64_t qb_hi = fg_attn_query_end(pb, j0 + cols - 1);
        for (int64_t g = 0; g < pb->group; g++) {
            const int64_t h = hk * pb->group + g;
            const int64_t row0 = b * pb->st_b + h * pb->st_h;
            const T *mrow = (const T *)st->m + row0;
            const T *lrow = (const T *)st->l + row0;
            int32_t nspans = 1;
            const int32_t *list = NULL;
            if (pb->sparse)
                list = fg_attn_q_list(pb, b, h, j0 / FG_ATTN_SPARSE_BLOCK,
                                      &nspans);
            /* Alg4 L.10-11: stream the query rows of this head past K_j,
             * V_j (the CPU works row by row; Br only sizes the forward). */
            for (int32_t sp = 0; sp < nspans; sp++) {
            int64_t s_lo, s_hi;
            if (!FN(span)(qb_lo, qb_hi, list, sp, &s_lo, &s_hi))
                continue;
            for (int64_t i = s_lo; i < s_hi; i++) {
                int64_t c_lo, c_hi;
                FN(row_cols)(pb, i, j0, cols, &c_lo, &c_hi);
                /* A fully masked row (l = 0) has P = 0 and no gradient; a
                 * NaN row (l NaN) goes on and spreads its NaN. */
                if (c_hi <= c_lo || lrow[i] == 0)
                    continue;
                const T *qi = FN(at)(q, b, i, h);
                const T *doi = FN(at)(dout, b, i, h);
                T *dqi = FN(at)(dq, b, i, h);
                const T *pd = FN(bwd_row)(pb, w, b, h, i, j0, cols, c_lo,
                                          c_hi, qi, doi, mrow[i], lrow[i],
                                          D[row0 + i]);
                /* Alg4 L.17: dV_j += P_dropped^T dO_i. */
                for (int64_t c = c_lo; c < c_hi; c++) {
                    const T pc = pd[c];
                    T *dvr = w->dv + c * d;
                    for (int64_t x = 0; x < d; x++)
                        dvr[x] += pc * doi[x];
                }
                /* Through the softcap dS is times 1 - tanh^2 (ALiBi and
                 * the bias are shifts and pass it unchanged). */
                T *dp = w->dp;
                if (pb->softcap > 0)
                    for (int64_t c = c_lo; c < c_hi; c++)
                        dp[c] *= w->dcap[c];
                /* Alg4 L.22: dQ_i += scale dS K_j; L.23: dK_j += scale
                 * dS^T Q_i. */
                for (int64_t c = c_lo; c < c_hi; c++) {
                    const T ds = dp[c] * scale;
                    const T *kr = w->kr + c * d;
                    T *dkr = w->dk + c * d;
                    for (int64_t x = 0; x < d; x++) {
                        dqi[x] += ds * kr[x];
                        dkr[x] += ds * qi[x];
                    }
                }
            }
            }
        }
        /* Alg4 L.25: write dK_j, dV_j. */
        for (int64_t c = 0; c < cols; c++) {
            T *dks = FN(at)(dk, b, j0 + c, hk);
            T *dvs = FN(at)(dv, b, j0 + c, hk);
            for (int64_t x = 0; x < d; x++) {
                dks[x] = w->dk[c * d + x];
                dvs[x] = w->dv[c * d + x];
            }
        }
    }
}

/* ---- dBias ---------------------------------------------------------- */

/* dBias = dS at the final logit, P (dP - D), summed over the dimensions
 * dbias broadcasts. A pass of its own after the main backward: task t owns
 * a disjoint set of dbias elements (one (b, h, query block), with the
 * broadcast dimensions collapsed), zeroes them and adds every
 * contribution in a fixed order (b, h, query row, key ascending), so the
 * result is bit-identical for any thread count. It recomputes S and dP
 * (as the forward walks the keys) rather than storing anything Nq x Nk. */
typedef struct FN(dbias_tasks) {
    int64_t nb, nh, nqb; /* extents of the task grid */
} FN(dbias_tasks);

static FN(dbias_tasks) FN(dbias_grid)(const fg_attn_problem *pb)
{
    const fg_attn_bias *t = &pb->dbias;
    FN(dbias_tasks) g;
    g.nb = t->stride_b ? pb->B : 1;
    g.nh = t->stride_h ? pb->H : 1;
    g.nqb = t->stride_q ? (pb->Nq + pb->block_q - 1) / pb->block_q : 1;
    return g;
}

/* dbias[b, h, i, j] += x (strides are 0 on broadcast dimensions). */
static inline void FN(dbias_add)(const fg_attn_bias *t, int64_t b, int64_t h,
                                 int64_t i, int64_t j0, const T *x,
                                 int64_t c_lo, int64_t c_hi)
{
    const int64_t off = fg_attn_bias_off(t, b, h, i, j0), sk = t->stride_k;
    if (t->dtype == FG_FP32 && sk == 0) { /* the row's sum in T, then once */
        T acc = 0;
        for (int64_t c = c_lo; c < c_hi; c++)
            acc += x[c];
        *((float *)t->data + off) += (float)acc;
    } else if (t->dtype == FG_FP32) {
        float *y = (float *)t->data + off;
        for (int64_t c = c_lo; c < c_hi; c++)
            y[c * sk] += (float)x[c];
    } else {
        T *y = (T *)t->data + off;
        for (int64_t c = c_lo; c < c_hi; c++)
            y[c * sk] += x[c];
    }
}

static void FN(dbias_task)(const fg_attn_problem *pb, FN(bwd_ws) *w,
                           const FN(dbias_tasks) *g, int64_t t,
                           const fg_attn_tensor *q, const fg_attn_tensor *k,
                           const fg_attn_tensor *v, const fg_attn_tensor *dout,
                           const fg_attn_stats *st, const T *D)
{
    const fg_attn_bias *db = &pb->dbias;
    const int64_t Br = pb->block_q, Bc = pb->block_k;
    const int64_t tq = t % g->nqb, th = t / g->nqb % g->nh,
                  tb = t / g->nqb / g->nh;
    /* The rows of this task, and which (b, h) it sums over. */
    const int64_t i_lo = db->stride_q ? tq * Br : 0;
    const int64_t i_hi = db->stride_q ? (i_lo + Br < pb->Nq ? i_lo + Br : pb->Nq)
                                      : pb->Nq;
    const int64_t b_lo = db->stride_b ? tb : 0, b_hi = db->stride_b ? tb + 1 : pb->B;
    const int64_t h_lo = db->stride_h ? th : 0, h_hi = db->stride_h ? th + 1 : pb->H;
    /* Zero the owned elements (each once: broadcast strides are 0). */
    const int64_t zi = db->stride_q ? i_hi - i_lo : 1;
    const int64_t zj = db->stride_k ? pb->Nk : 1;
    for (int64_t r = 0; r < zi; r++)
        for (int64_t j = 0; j < zj; j++) {
            const int64_t off = fg_attn_bias_off(db, tb, th, i_lo + r, j);
            if (db->dtype == FG_FP32)
                ((float *)db->data)[off] = 0;
            else
                ((T *)db->data)[off] = 0;
        }
    for (int64_t b = b_lo; b < b_hi; b++)
        for (int64_t h = h_lo; h < h_hi; h++) {
            const int64_t hk = h / pb->group, row0 = (b * pb->H + h) * pb->Nq;
            const T *ms = (const T *)st->m, *ls = (const T *)st->l;
            for (int64_t i0 = i_lo; i0 < i_hi; i0 += Br) {
                const int64_t rows = i_hi - i0 < Br ? i_hi - i0 : Br;
                /* The forward's key walk of this query block. */
                const int64_t kb_lo = fg_attn_key_begin(pb, i0);
                const int64_t kb_hi = fg_attn_key_end(pb, i0 + rows - 1);
                int32_t nspans = 1;
                const int32_t *list = NULL;
                if (pb->sparse)
                    list = fg_attn_kv_list(pb, b, h, i0 / FG_ATTN_SPARSE_BLOCK,
                                           &nspans);
                for (int32_t sp = 0; sp < nspans; sp++) {
                    int64_t s_lo, s_hi;
                    if (!FN(span)(kb_lo, kb_hi, list, sp, &s_lo, &s_hi))
                        continue;
                    for (int64_t j0 = s_lo; j0 < s_hi; j0 += Bc) {
                        const int64_t cols = s_hi - j0 < Bc ? s_hi - j0 : Bc;
                        FN(load_kv_t)(pb, w, k, v, b, hk, j0, cols);
                        for (int64_t i = i0; i < i0 + rows; i++) {
                            int64_t c_lo, c_hi;
                            FN(row_cols)(pb, i, j0, cols, &c_lo, &c_hi);
                            if (c_hi <= c_lo || ls[row0 + i] == 0)
                                continue;
                            FN(bwd_row)(pb, w, b, h, i, j0, cols, c_lo, c_hi,
                                        FN(at)(q, b, i, h),
                                        FN(at)(dout, b, i, h), ms[row0 + i],
                                        ls[row0 + i], D[row0 + i]);
                            FN(dbias_add)(db, b, h, i, j0, w->dp, c_lo, c_hi);
                        }
                    }
                }
            }
        }
}

static fg_status FN(backward)(const fg_attn_problem *pb,
                              const fg_attn_tensor *q, const fg_attn_tensor *k,
                              const fg_attn_tensor *v, const fg_attn_tensor *o,
                              const fg_attn_tensor *dout,
                              const fg_attn_stats *st,
                              const fg_attn_tensor *dq,
                              const fg_attn_tensor *dk,
                              const fg_attn_tensor *dv)
{
    const int64_t Bc = pb->block_k, d = pb->d;
    /* D has the layout of the stats: [B, H, Nq], or [H, total_q] packed. */
    const int64_t nrows = pb->varlen ? pb->H * pb->total_q : pb->B * pb->H * pb->Nq;
    const int64_t rows_per_h = pb->varlen ? pb->total_q : pb->Nq;
    const int64_t owned = pb->varlen ? pb->cu_q[pb->B] : pb->Nq;
    const int64_t ntasks = pb->B * pb->Hk;
    const FN(dbias_tasks) g = FN(dbias_grid)(pb);
    const int64_t nbias = pb->dbias.data ? g.nb * g.nh * g.nqb : 0;
    const int nt = fg_cpu_threads(pb->num_threads, ntasks > nbias ? ntasks : nbias,
                                  3.0 * pb->B * pb->H * pb->Nq * pb->Nk * pb->d);
    const size_t wsb = FN(bwd_ws_bytes)(Bc, d);
    /* D [B, H, Nq] and per-thread tiles, allocated before any write. */
    const size_t dbytes = (sizeof(T) * (size_t)nrows + 63) & ~(size_t)63;
    char *mem = (char *)fg_cpu_workspace(dbytes + wsb * (size_t)nt);
    T *D = (T *)mem;
    mem += dbytes;
    if (!D) {
        return fg_error(FG_ERR_OUT_OF_MEMORY,
                        "fg_attention_backward: cannot allocate %zu bytes of "
                        "CPU workspace",
                        sizeof(T) * (size_t)nrows + wsb * (size_t)nt);
    }
    /* Preprocessing (FA2): D_i = rowsum(dO_i * O_i). */
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t r = 0; r < nrows; r++) {
        /* Packed: row i of head h is packed row i (batch index 0, whose
         * stride is unused); rows past cu_q[B] belong to no sequence. */
        const int64_t i = r % rows_per_h, bh = r / rows_per_h;
        const int64_t b = pb->varlen ? 0 : bh / pb->H;
        const int64_t h = pb->varlen ? bh : bh % pb->H;
        D[r] = 0;
        if (i >= owned)
            continue;
        const T *oi = FN(at)(o, b, i, h);
        const T *gi = FN(at)(dout, b, i, h);
        T acc = 0;
        for (int64_t x = 0; x < d; x++)
            acc += gi[x] * oi[x];
        D[r] = acc;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        FN(bwd_ws) w;
        FN(bwd_ws_carve)(&w, mem + wsb * (size_t)fg_cpu_thread_id(), Bc, d);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < ntasks; t++) {
            const int64_t b = t / pb->Hk, hk = t % pb->Hk;
            if (!fg_attn_ragged(pb)) {
                FN(bwd_task)(pb, &w, b, hk, q, k, v, dout, st, D, dq, dk, dv);
                continue;
            }
            const fg_attn_tensor *in[7] = {q, dout, dq, k, v, dk, dv};
            fg_attn_tensor t1[7];
            fg_attn_problem sp;
            fg_attn_stats st1;
            const fg_attn_seq sq =
                fg_attn_seq_views(pb, b, &sp, in, 3, 7, t1, st, &st1);
            FN(bwd_task)(&sp, &w, b, hk, &t1[0], &t1[3], &t1[4], &t1[1], &st1,
                         D + (pb->varlen ? sq.q0 : 0), &t1[2], &t1[5], &t1[6]);
            /* Padded keys are seen by no query: zero gradient. */
            for (int64_t j = sq.used; j < sq.nk; j++) {
                T *dks = FN(at)(&t1[5], b, j, hk);
                T *dvs = FN(at)(&t1[6], b, j, hk);
                for (int64_t x = 0; x < d; x++)
                    dks[x] = dvs[x] = 0;
            }
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < nbias; t++)
            FN(dbias_task)(pb, &w, &g, t, q, k, v, dout, st, D);
    }
    return FG_OK;
}

#undef FN
#undef CAT
#undef CAT_
