/* SPDX-License-Identifier: MIT */
/* lib/ops/ops_attention.c - FlashAttention as a recorded op.
 *
 * The forward calls fg_attention_forward() on the tensors' own strides (a
 * slice of a fused QKV projection goes in without a copy) and keeps Q, K,
 * V, O and the row statistics m, l; the backward calls
 * fg_attention_backward() with the same parameters (seed and offset
 * included), which recomputes the attention matrix block by block. The
 * node therefore holds O(B * N * H * d) bytes, never O(N^2) (an additive
 * bias, its optional fourth input, is saved as the caller's tensor: no
 * copy). fg_attention_qkvpacked runs the same on three column views of
 * one qkv tensor, and its backward writes dq, dk, dv as the matching
 * views of one d(qkv), so no split backward has to gather them. */
#include <stdlib.h>
#include <string.h>

#include "flashgrad/attention.h"
#include "flashgrad/cuda.h"
#include "ops_internal.h"
#include "kernels/runtime/profile.h"

void fg_attention_options_init(fg_attention_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->window_left = o->window_right = -1;
}

/* The node's copy of the parameters: the block mask struct travels with
 * them (its arrays stay the caller's); cu_seqlens and seqused_k live in
 * the node's saved tensor 6 (offsets_tensor), and their host values right
 * after this struct in the node's extra (the backward's host copies,
 * use_offsets: what it validates, so it never copies the device arrays
 * back). */
typedef struct attn_extra {
    fg_attn_params p;
    fg_attn_block_mask bm;
} attn_extra;

/* The op's device copy of the host offsets: cu_seqlens_q, cu_seqlens_k
 * ([n_seq + 1] each, if given) then seqused_k, as raw 4-byte words in an
 * fp32 tensor (there is no integer dtype; the bits are copied, never
 * converted). *host: the same *words words on the host (the calls'
 * host copies, use_offsets; the node keeps a copy), freed by the caller;
 * NULL and 0 when there are no offsets. */
static fg_status offsets_tensor(const fg_attention_options *o, int64_t B,
                                fg_device dev, fg_tensor **out, int64_t *n_cu,
                                int32_t **host, int64_t *words)
{
    *out = NULL;
    *host = NULL;
    *n_cu = o->cu_seqlens_q ? o->n_seq + 1 : 0;
    const int64_t n_used = o->seqused_k ? B : 0;
    *words = 2 * *n_cu + n_used;
    if (!*words)
        return FG_OK;
    int32_t *h = malloc(sizeof(int32_t) * (size_t)*words);
    if (!h)
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "offsets copy");
    if (*n_cu) {
        memcpy(h, o->cu_seqlens_q, sizeof(int32_t) * (size_t)*n_cu);
        memcpy(h + *n_cu, o->cu_seqlens_k, sizeof(int32_t) * (size_t)*n_cu);
    }
    if (n_used)
        memcpy(h + 2 * *n_cu, o->seqused_k, sizeof(int32_t) * (size_t)n_used);
    *host = h;
    return fg_tensor_from_host(FG_FP32, dev, FG_SHAPE(*words), h, out);
}

/* Points p's cu_seqlens and seqused_k into the offsets tensor t, and
 * their host copies into h, the same words on the host (laid out as
 * offsets_tensor lays them: 2 n_cu + (has_used ? B : 0)), so the
 * attention validates those and never copies the device arrays back. */
static void use_offsets(fg_attn_params *p, const fg_tensor *t,
                        const int32_t *h, int64_t n_cu, int has_used)
{
    const int32_t *base = t ? (const int32_t *)fg_tensor_base(t) : NULL;
    p->cu_seqlens_q = n_cu ? base : NULL;
    p->cu_seqlens_k = n_cu ? base + n_cu : NULL;
    p->seqused_k = has_used ? base + 2 * n_cu : NULL;
    p->cu_seqlens_q_host = n_cu ? h : NULL;
    p->cu_seqlens_k_host = n_cu ? h + n_cu : NULL;
    p->seqused_k_host = has_used ? h + 2 * n_cu : NULL;
}

/* The longest sequence of a host offsets array (at least 1; bad offsets
 * are left to the attention's validation). */
static int64_t longest(const int32_t *cu, int64_t n_seq)
{
    int64_t mx = 1;
    for (int64_t b = 0; b < n_seq; b++)
        if ((int64_t)cu[b + 1] - cu[b] > mx)
            mx = (int64_t)cu[b + 1] - cu[b];
    return mx;
}

static fg_attn_tensor attn_view(const fg_tensor *t)
{
    fg_attn_tensor a = {fg_tensor_base(t), t->dtype, t->stride[0],
                        t->stride[1], t->stride[2]};
    return a;
}

/* The bias tensor t as an fg_attn_bias over [B, H, Nq, Nk] (full): its
 * dimensions align right, missing and size-1 ones broadcast (stride 0). */
static fg_status bias_desc(const fg_tensor *t, const int64_t full[4],
                           fg_attn_bias *out, const char *fn)
{
    if (t->nd < 1 || t->nd > 4)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: bias must have 1 to 4 dimensions, got %d", fn,
                        t->nd);
    int64_t st[4];
    for (int x = 0; x < 4; x++) {
        const int src = x - (4 - t->nd);
        const int64_t size = src >= 0 ? t->shape[src] : 1;
        if (size != 1 && size != full[x])
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: bias dimension %d has size %lld; it must be "
                            "1 or %lld to broadcast to [B, H, Nq, Nk]",
                            fn, x, (long long)size, (long long)full[x]);
        st[x] = size == 1 ? 0 : t->stride[src];
    }
    out->data = fg_tensor_base(t);
    out->dtype = t->dtype;
    out->stride_b = st[0];
    out->stride_h = st[1];
    out->stride_q = st[2];
    out->stride_k = st[3];
    return FG_OK;
}

/* Operand the kernels accept: last dimension contiguous, else a copy. */
static fg_status kernel_operand(fg_tensor *t, fg_arena *dom, fg_tensor **out)
{
    const int last = t->nd - 1;
    if (t->stride[last] == 1 || t->shape[last] == 1) {
        *out = fg_tensor_retain(t);
        return FG_OK;
    }
    return fg_copy_raw(t, t->dtype, dom, out);
}

/* Columns [j C, (j + 1) C) of a [B, N, 3 C] tensor t (last dimension
 * contiguous) as [B, N, H, d] views, j = 0, 1, 2: the q, k and v of a
 * fused projection, or their gradients in one d(qkv) buffer. The three
 * are disjoint column ranges, so kernels writing them never overlap. */
static fg_status qkv_parts(fg_tensor *t, int64_t H, fg_arena *dom,
                           fg_tensor *parts[3])
{
    const int64_t C = t->shape[2] / 3, d = C / H;
    const int64_t shape[4] = {t->shape[0], t->shape[1], H, d},
                  stride[4] = {t->stride[0], t->stride[1], d, 1};
    for (int j = 0; j < 3; j++) {
        fg_status s = fg_tensor_view_new(dom, t, 4, shape, stride,
                                         t->offset + j * C, &parts[j]);
        if (s != FG_OK) {
            for (int i = 0; i < j; i++)
                fg_tensor_free(parts[i]);
            return s;
        }
    }
    return FG_OK;
}

/* The gradients the backward writes: dq, dk, dv as tensors of their own
 * (fg_attention), or as the three column ranges of one d(qkv) shaped like
 * the op's input (fg_attention_qkvpacked), returned in *dqkv. */
static fg_status new_grads(fg_node *n, int packed, int zero, fg_arena *dom,
                           fg_tensor *d[3], fg_tensor **dqkv)
{
    if (packed) {
        /* d(qkv) is shaped from the saved q view: qkv may not need a
         * gradient (a bias alone may), and then it has no edge whose
         * metadata fg_node_input_meta could read. */
        const fg_tensor *q = fg_node_saved(n, 0);
        const int64_t shape[3] = {q->shape[0], q->shape[1],
                                  3 * q->shape[2] * q->shape[3]};
        FG_TRY(fg_tensor_new(dom, q->dtype, q->device, 3, shape, dqkv));
        fg_status s = zero ? fg_tensor_zero_storage(*dqkv) : FG_OK;
        if (s == FG_OK)
            s = qkv_parts(*dqkv, fg_node_saved(n, 0)->shape[2], dom, d);
        if (s != FG_OK)
            fg_tensor_free(*dqkv);
        return s;
    }
    fg_status s = FG_OK;
    for (int j = 0; j < 3 && s == FG_OK; j++)
        s = fg_tensor_new_like(dom, fg_node_saved(n, j), zero, &d[j]);
    if (s != FG_OK)
        for (int j = 0; j < 3; j++)
            fg_tensor_free(d[j]);
    return s;
}

/* Both ops' backward; packed: the node's inputs are qkv [+ bias], its
 * output and incoming gradient [B, N, H d]. */
static fg_status attention_backward_impl(fg_node *n, fg_tensor *const *g,
                                         fg_tensor **gin, int packed)
{
    const attn_extra *ex = fg_node_extra(n);
    fg_attn_params pp = ex->p;
    if (pp.block_mask)
        pp.block_mask = &ex->bm;
    if (pp.cu_seqlens_q || pp.seqused_k) { /* packed: p.batch = n_seq */
        const int64_t n_cu = pp.cu_seqlens_q ? pp.batch + 1 : 0;
        use_offsets(&pp, fg_node_saved(n, 6), (const int32_t *)(ex + 1), n_cu,
                    pp.seqused_k != NULL);
    }
    const fg_attn_params *p = &pp;
    const fg_tensor *q = fg_node_saved(n, 0), *k = fg_node_saved(n, 1),
                    *v = fg_node_saved(n, 2), *o = fg_node_saved(n, 3),
                    *m = fg_node_saved(n, 4), *l = fg_node_saved(n, 5);
    fg_arena *dom = fg_bw_domain();
    fg_tensor *g4 = NULL, *dout = NULL, *d[3] = {NULL}, *dqkv = NULL,
              *db = NULL;
    /* [B, N, H d] -> [B, N, H, d]: a view unless g's strides forbid it */
    fg_status s = packed ? fg_reshape_raw(g[0], 4, o->shape, dom, &g4) : FG_OK;
    if (s == FG_OK)
        s = kernel_operand(packed ? g4 : g[0], dom, &dout);
    fg_tensor_free(g4);
    /* Packed rows past the last offset are not written: their gradient
     * is 0. */
    if (s == FG_OK)
        s = new_grads(n, packed, ex->p.cu_seqlens_q != NULL, dom, d, &dqkv);
    /* The bias (saved[6]) and, when it needs a gradient, dbias like it. */
    fg_attn_bias bias, dbias;
    const int bias_in = packed ? 1 : 3;
    if (s == FG_OK && pp.bias) {
        const fg_tensor *bt = fg_node_saved(n, 6);
        const int64_t full[4] = {pp.batch, pp.heads_q, pp.seqlen_q,
                                 pp.seqlen_k};
        s = bias_desc(bt, full, &bias, "fg_attention backward");
        pp.bias = &bias;
        pp.dbias = NULL;
        if (s == FG_OK && fg_node_needs_grad(n, bias_in)) {
            s = fg_tensor_new_like(dom, bt, 0, &db);
            if (s == FG_OK)
                s = bias_desc(db, full, &dbias, "fg_attention backward");
            pp.dbias = &dbias;
        }
    }
    if (s == FG_OK) {
        fg_attn_tensor tq = attn_view(q), tk = attn_view(k), tv = attn_view(v),
                       to = attn_view(o), tdo = attn_view(dout),
                       tdq = attn_view(d[0]), tdk = attn_view(d[1]),
                       tdv = attn_view(d[2]);
        fg_attn_stats stt = {fg_tensor_base(m), fg_tensor_base(l), m->dtype};
        s = fg_attention_backward(p, &tq, &tk, &tv, &to, &tdo, &stt, &tdq, &tdk,
                                  &tdv);
    }
    fg_tensor_free(dout);
    if (s != FG_OK || packed) /* d[] are views of dqkv when packed */
        for (int j = 0; j < 3; j++)
            fg_tensor_free(d[j]);
    if (s != FG_OK) {
        fg_tensor_free(dqkv);
        fg_tensor_free(db);
        return s;
    }
    if (packed) {
        gin[0] = dqkv;
    } else {
        for (int j = 0; j < 3; j++)
            gin[j] = d[j];
    }
    if (db)
        gin[bias_in] = db;
    return FG_OK;
}

static fg_status attention_backward(fg_node *n, fg_tensor *const *g,
                                    fg_tensor **gin)
{
    return attention_backward_impl(n, g, gin, 0);
}

static fg_status attention_qkv_backward(fg_node *n, fg_tensor *const *g,
                                        fg_tensor **gin)
{
    return attention_backward_impl(n, g, gin, 1);
}

static const fg_op_def attention_def = {"AttentionBackward",
                                        attention_backward, NULL};
static const fg_op_def attention_qkv_def = {"AttentionQKVPackedBackward",
                                            attention_qkv_backward, NULL};

/* What both ops run once q, k and v are tensors of their own or views of
 * one qkv: shape checks against the options, the forward into a new O,
 * and the node (def, inputs in[0..n_in): q, k, v or qkv, then the bias
 * when there is one). qkv: the result is O viewed as [B, N, H d]. */
static fg_status attention_run(const char *fn, const fg_op_def *def,
                               fg_tensor *q, fg_tensor *k, fg_tensor *v,
                               fg_tensor *const *in, int n_in,
                               const fg_attention_options *opt, int qkv,
                               fg_tensor **out)
{
    if (k->dtype != q->dtype || v->dtype != q->dtype ||
        k->device != q->device || v->device != q->device)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: q, k and v must share dtype and device", fn);
    if (q->nd != 4 || k->nd != 4 || v->nd != 4)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: q, k, v must be 4-d [B, N, heads, head_dim]", fn);
    const fg_attention_options o = *opt;
    const int varlen = o.cu_seqlens_q != NULL;
    /* Before longest() reads either array. */
    if (!o.cu_seqlens_q != !o.cu_seqlens_k || (varlen && o.n_seq < 1))
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: cu_seqlens_q and cu_seqlens_k go together, "
                        "with n_seq >= 1 (got %lld)",
                        fn, (long long)o.n_seq);
    if (varlen && q->shape[0] != 1)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: with cu_seqlens q, k, v are [1, total, heads, d]",
                        fn);
    if (!fg_same_shape(4, k->shape, 4, v->shape) ||
        k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3]) {
        char a[96], b[96], c[96];
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: shapes q %s, k %s, v %s do not fit [B, Nq, H, d], "
                        "[B, Nk, Hk, d], [B, Nk, Hk, d]",
                        fn, fg_fmt_shape(a, sizeof a, 4, q->shape),
                        fg_fmt_shape(b, sizeof b, 4, k->shape),
                        fg_fmt_shape(c, sizeof c, 4, v->shape));
    }
    fg_attn_params p;
    fg_attn_params_init(&p, q->shape[0], q->shape[1], k->shape[1],
                        q->shape[2], k->shape[2], q->shape[3]);
    if (varlen) { /* n_seq sequences; the grid follows the longest */
        p.batch = o.n_seq;
        p.seqlen_q = longest(o.cu_seqlens_q, o.n_seq);
        p.seqlen_k = longest(o.cu_seqlens_k, o.n_seq);
        p.total_q = q->shape[1];
        p.total_k = k->shape[1];
    }
    p.device = q->device;
    if (q->device == FG_DEVICE_CUDA) /* the context stream, like every op */
        p.cuda_stream = fg_cuda_get_stream();
    p.softmax_scale = o.scale;
    p.causal = o.causal;
    p.dropout_p = o.dropout_p;
    p.seed = o.seed;
    p.offset = o.offset;
    p.block_q = o.block_q;
    p.block_k = o.block_k;
    p.num_threads = o.num_threads;
    p.deterministic = o.deterministic || fg_get_deterministic();
    p.causal_align = o.causal_align;
    p.window_left = o.window_left;
    p.window_right = o.window_right;
    p.softcap = o.softcap;
    p.alibi_slopes = o.alibi_slopes;
    p.alibi_stride_b = o.alibi_stride_b;
    p.block_mask = o.block_mask;
    fg_attn_bias bias;
    if (o.bias) {
        FG_TRY(fg_op_check(fn, o.bias, "bias"));
        if (o.bias->device != q->device)
            return fg_error(FG_ERR_INVALID_ARGUMENT,
                            "%s: bias must be on q's device", fn);
        const int64_t full[4] = {p.batch, p.heads_q, p.seqlen_q, p.seqlen_k};
        FG_TRY(bias_desc(o.bias, full, &bias, fn));
        p.bias = &bias; /* the node keeps the tensor, not this struct */
    }
    attn_extra ex;
    memset(&ex, 0, sizeof ex);

    fg_arena *dom = fg_alloc_domain(in, n_in);
    fg_tensor *qc = NULL, *kc = NULL, *vc = NULL, *y = NULL, *m = NULL,
              *l = NULL, *offs = NULL, *res = NULL;
    /* [B, H, Nq] dense, [1, H, total_q] packed: the attention's layouts */
    const int64_t sshape[3] = {q->shape[0], q->shape[2], q->shape[1]};
    const fg_dtype sdt = q->dtype == FG_FP64 ? FG_FP64 : FG_FP32;
    int64_t n_cu = 0, words = 0;
    int32_t *host = NULL; /* the offsets' words on the host */
    fg_status s = offsets_tensor(&o, p.batch, q->device, &offs, &n_cu, &host, &words);
    if (s == FG_OK)
        use_offsets(&p, offs, host, n_cu, o.seqused_k != NULL);
    if (s == FG_OK)
        s = kernel_operand(q, dom, &qc);
    if (s == FG_OK)
        s = kernel_operand(k, dom, &kc);
    if (s == FG_OK)
        s = kernel_operand(v, dom, &vc);
    if (s == FG_OK) /* packed tail rows (past the offsets) read 0 */
        s = fg_tensor_new_like(dom, q, varlen, &y);
    if (s == FG_OK)
        s = fg_tensor_new(dom, sdt, q->device, 3, sshape, &m);
    if (s == FG_OK)
        s = fg_tensor_new(dom, sdt, q->device, 3, sshape, &l);
    if (s == FG_OK) {
        fg_attn_tensor tq = attn_view(qc), tk = attn_view(kc),
                       tv = attn_view(vc), to = attn_view(y);
        fg_attn_stats stt = {fg_tensor_base(m), fg_tensor_base(l), sdt};
        /* Validates everything (sizes, head_dim, p, scale) before writing;
         * the offsets from their host words (never read back from the
         * device tensor made of them) */
        s = fg_attention_forward(&p, &tq, &tk, &tv, &to, &stt);
    }
    if (s == FG_OK && qkv) { /* the node saves y, the caller gets res */
        const int64_t C = y->shape[2] * y->shape[3];
        const int64_t shape[3] = {y->shape[0], y->shape[1], C},
                      stride[3] = {y->shape[1] * C, C, 1};
        s = fg_tensor_view_new(dom, y, 3, shape, stride, y->offset, &res);
    } else if (s == FG_OK) {
        res = fg_tensor_retain(y);
    }
    if (s == FG_OK && fg_ag_should_record(in, n_in)) {
        /* saved[6]: the offsets (packed / key padding) or the bias; the
         * attention refuses a bias with either, so never both. */
        fg_tensor *saved[7] = {qc, kc, vc, y, m, l, offs ? offs : o.bias};
        ex.p = p; /* p.bias only flags a bias: saved[6] holds it */
        /* the host copies point into `host`, freed below: the backward
         * points them into the node's own words (use_offsets) */
        ex.p.cu_seqlens_q_host = ex.p.cu_seqlens_k_host = ex.p.seqused_k_host = NULL;
        if (p.block_mask)
            ex.bm = *p.block_mask;
        /* ex, then the offsets' host words (the backward's use_offsets) */
        const size_t hb = sizeof(int32_t) * (size_t)words;
        unsigned char *xb = malloc(sizeof ex + hb);
        if (!xb) {
            s = FG_FAIL(FG_ERR_OUT_OF_MEMORY, "attention node");
        } else {
            memcpy(xb, &ex, sizeof ex);
            if (hb)
                memcpy(xb + sizeof ex, host, hb);
            s = fg_ag_record(def, in, n_in, &res, 1, saved, saved[6] ? 7 : 6, xb,
                             sizeof ex + hb, NULL);
            free(xb);
        }
    }
    free(host);
    fg_tensor *tmp[] = {qc, kc, vc, y, m, l, offs};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        fg_tensor_free(tmp[i]);
    if (s != FG_OK) {
        fg_tensor_free(res);
        return s;
    }
    *out = res;
    return FG_OK;
}

static fg_status fg_attention_impl(fg_tensor *q, fg_tensor *k, fg_tensor *v,
                                   const fg_attention_options *opt,
                                   fg_tensor **out)
{
    static const char fn[] = "fg_attention";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, q, "q"));
    FG_TRY(fg_op_check(fn, k, "k"));
    FG_TRY(fg_op_check(fn, v, "v"));
    fg_attention_options o;
    fg_attention_options_init(&o);
    if (opt)
        o = *opt;
    /* The bias is the op's fourth input (no edge without one). */
    fg_tensor *in[4] = {q, k, v, o.bias};
    return attention_run(fn, &attention_def, q, k, v, in, o.bias ? 4 : 3, &o,
                         0, out);
}

fg_status fg_attention(fg_tensor *q, fg_tensor *k, fg_tensor *v,
                       const fg_attention_options *opt, fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_ATTENTION, fg_attention_impl(q, k, v, opt, out));
}

static fg_status fg_attention_qkvpacked_impl(fg_tensor *qkv, int64_t heads,
                                             const fg_attention_options *opt,
                                             fg_tensor **out)
{
    static const char fn[] = "fg_attention_qkvpacked";
    FG_TRY(fg_op_check_out(fn, out));
    FG_TRY(fg_op_check(fn, qkv, "qkv"));
    if (qkv->nd != 3) {
        char a[96];
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: qkv must be 3-d [B, N, 3 * heads * head_dim], "
                        "got %s",
                        fn, fg_fmt_shape(a, sizeof a, qkv->nd, qkv->shape));
    }
    const int64_t cols = qkv->shape[2];
    if (heads < 1 || cols == 0 || cols % 3 || (cols / 3) % heads)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: qkv's last dimension (%lld) is not 3 * heads * "
                        "head_dim for heads = %lld and a head_dim >= 1",
                        fn, (long long)cols, (long long)heads);
    fg_attention_options o;
    fg_attention_options_init(&o);
    if (opt)
        o = *opt;
    if (o.cu_seqlens_q && qkv->shape[0] != 1)
        return fg_error(FG_ERR_INVALID_ARGUMENT,
                        "%s: with cu_seqlens qkv is [1, total, 3 * heads * "
                        "head_dim]",
                        fn);
    fg_tensor *in[2] = {qkv, o.bias}, *qkvc = NULL, *parts[3] = {NULL};
    fg_arena *dom = fg_alloc_domain(in, o.bias ? 2 : 1);
    /* The views need contiguous columns (the kernels' head_dim). */
    fg_status s = kernel_operand(qkv, dom, &qkvc);
    if (s == FG_OK)
        s = qkv_parts(qkvc, heads, dom, parts);
    if (s == FG_OK)
        s = attention_run(fn, &attention_qkv_def, parts[0], parts[1], parts[2],
                          in, o.bias ? 2 : 1, &o, 1, out);
    for (int j = 0; j < 3; j++)
        fg_tensor_free(parts[j]);
    fg_tensor_free(qkvc);
    return s;
}

fg_status fg_attention_qkvpacked(fg_tensor *qkv, int64_t heads,
                                 const fg_attention_options *opt,
                                 fg_tensor **out)
{
    FG_PROF_RETURN(FG_PROF_ATTENTION,
                   fg_attention_qkvpacked_impl(qkv, heads, opt, out));
}
