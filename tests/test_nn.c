/* SPDX-License-Identifier: MIT */
/* tests/test_nn.c - nn layers, the GPT model, AdamW, clipping, schedule:
 * shapes and initialisation, the loss at init, gradients of the whole
 * model (gradcheck, fp64), the LR schedule, clipping, and overfitting one
 * small batch to a loss below 0.05. */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_ops_util.h"

static fg_gpt *small_model(fg_dtype dt, double dropout, int tie, uint64_t seed)
{
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = 13;
    c.ctx = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.dropout = dropout;
    c.tie_weights = tie;
    c.dtype = dt;
    fg_gpt *m;
    FGT_OK(fg_gpt_create(&c, seed, &m));
    return m;
}

START_TEST(test_params_and_init)
{
    fg_gpt *m = small_model(FG_FP32, 0, 1, 1);
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    ck_assert_int_eq(n, 2 + 12 * 2 + 2);
    /* C=16, V=13, ctx=8: wte 208, wpe 128, per block 2*16*4 + 16*48+48 +
     * 16*16+16 + 16*64+64 + 64*16+16, ln_f 32 */
    const int64_t blk = 4 * 16 + 16 * 48 + 48 + 16 * 16 + 16 + 16 * 64 + 64 +
                        64 * 16 + 16;
    ck_assert_int_eq(fg_gpt_num_params(m), 208 + 128 + 2 * blk + 32);
    for (int i = 0; i < n; i++) {
        ck_assert(fg_tensor_requires_grad(ps[i].tensor));
        ck_assert_int_eq(ps[i].decay, fg_tensor_ndim(ps[i].tensor) == 2);
    }
    /* residual projections: std 0.02 / sqrt(2 * 2) = 0.01 */
    const float *w = fg_tensor_data(ps[2 + 4].tensor); /* h0.attn.proj.w */
    ck_assert_str_eq(ps[2 + 4].name, "h0.attn.proj.w");
    double ss = 0;
    for (int i = 0; i < 256; i++)
        ss += (double)w[i] * w[i];
    ck_assert(fabs(sqrt(ss / 256) - 0.01) < 0.003);
    fg_gpt_free(m);
    fg_gpt *u = small_model(FG_FP32, 0, 0, 1);
    fg_gpt_params(u, &n);
    ck_assert_int_eq(n, 2 + 12 * 2 + 3); /* untied: own LM head */
    fg_gpt_free(u);
}
END_TEST

START_TEST(test_forward_shapes_and_initial_loss)
{
    fg_gpt *m = small_model(FG_FP32, 0, 1, 2);
    int64_t tok[2 * 8], tgt[2 * 8];
    for (int i = 0; i < 16; i++) {
        tok[i] = (i * 5) % 13;
        tgt[i] = (i * 7) % 13;
    }
    fg_tensor *lg, *loss;
    FGT_OK(fg_gpt_forward(m, tok, 2, 8, tgt, NULL, &lg, &loss));
    ck_assert_int_eq(fg_tensor_ndim(lg), 3);
    ck_assert_int_eq(fg_tensor_size(lg, 2), 13);
    ck_assert(fabs(fgt_item(loss) - log(13.0)) < 0.05); /* ~uniform */
    fg_tensor_free(lg);
    fg_tensor_free(loss);
    /* errors: bad token, too long */
    tok[3] = 13;
    FGT_FAILS(fg_gpt_forward(m, tok, 2, 8, NULL, NULL, &lg, NULL),
              FG_ERR_INVALID_ARGUMENT);
    tok[3] = 0;
    FGT_FAILS(fg_gpt_forward(m, tok, 1, 9, NULL, NULL, &lg, NULL),
              FG_ERR_INVALID_ARGUMENT);
    /* B * T past FG_MAX_NUMEL: refused before the tokens are read (B * T
     * overflowed, and the token check read past the array) */
    FGT_FAILS(fg_gpt_forward(m, tok, (int64_t)1 << 61, 8, NULL, NULL, &lg,
                             NULL),
              FG_ERR_INVALID_ARGUMENT);
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = 5;
    c.n_embd = 20; /* head size 5: not a multiple of 8 */
    fg_gpt *bad = NULL;
    FGT_FAILS(fg_gpt_create(&c, 1, &bad), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(bad);
    /* variant settings attention would refuse at the first forward, and
     * an alibi flag that is not 0 or 1, are refused at creation */
    c.n_embd = 16;
    c.n_head = 2;
    c.attn_softcap = 1e-39;
    FGT_FAILS(fg_gpt_create(&c, 1, &bad), FG_ERR_INVALID_ARGUMENT);
    c.attn_softcap = 1e300;
    FGT_FAILS(fg_gpt_create(&c, 1, &bad), FG_ERR_INVALID_ARGUMENT);
    c.attn_softcap = 0;
    c.alibi = 2;
    FGT_FAILS(fg_gpt_create(&c, 1, &bad), FG_ERR_INVALID_ARGUMENT);
    c.alibi = -1;
    FGT_FAILS(fg_gpt_create(&c, 1, &bad), FG_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(bad);
    c.alibi = 1;
    c.attn_softcap = 30;
    FGT_OK(fg_gpt_create(&c, 1, &bad));
    fg_gpt_free(bad);
    fg_gpt_free(m);
}
END_TEST

/* Gradcheck through the whole model (fp64, dropout on with fixed masks):
 * the loss as a function of the LN-f weight, a block's QKV bias and the
 * position embedding. */
typedef struct gc_ctx {
    fg_gpt *m;
    const int64_t *tok, *tgt;
} gc_ctx;

static fg_status gc_fn(fg_tensor *const *in, int n, fg_tensor **out,
                       void *user)
{
    gc_ctx *c = user;
    fg_generator g;
    fg_generator_init(&g, 77); /* the same masks on every evaluation */
    fg_nn_mode mode = {1, &g};
    return fg_gpt_forward(c->m, c->tok, 2, 6, c->tgt, &mode, NULL, out);
}

START_TEST(test_gpt_gradcheck)
{
    fg_gpt *m = small_model(FG_FP64, 0.1, 1, 3);
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    int64_t tok[12], tgt[12];
    for (int i = 0; i < 12; i++) {
        tok[i] = (i * 5 + 1) % 13;
        tgt[i] = i % 4 == 0 ? -1 : (i * 3) % 13;
    }
    gc_ctx c = {m, tok, tgt};
    fg_tensor *in[3] = {ps[n - 2].tensor, ps[2 + 12 + 3].tensor,
                        ps[1].tensor};
    ck_assert_str_eq(ps[2 + 12 + 3].name, "h1.attn.qkv.b");
    fgt_gradcheck("gpt", gc_fn, &c, in, 3, 0);
    fg_gpt_free(m);
}
END_TEST

/* The GPT's attention variants: ALiBi drops the learned positions; a
 * window of 1 in 2 layers means position t sees tokens t-2 .. t only
 * (changing token 0 leaves positions >= 3 unchanged); the whole model
 * passes gradcheck with window, ALiBi and softcap on; a checkpoint keeps
 * the options. */
START_TEST(test_gpt_variants)
{
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = 13;
    c.ctx = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.dtype = FG_FP64;
    c.attn_window = 1;
    c.alibi = 1;
    c.attn_softcap = 2.0;
    fg_gpt *m, *plain = small_model(FG_FP64, 0, 1, 3);
    FGT_OK(fg_gpt_create(&c, 3, &m));
    int n, n0;
    const fg_param *ps = fg_gpt_params(m, &n);
    fg_gpt_params(plain, &n0);
    ck_assert_int_eq(n, n0 - 1);
    for (int i = 0; i < n; i++)
        ck_assert_str_ne(ps[i].name, "wpe");

    int64_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tok2[8];
    memcpy(tok2, tok, sizeof tok);
    tok2[0] = 12;
    fg_tensor *l1, *l2;
    FGT_OK(fg_gpt_forward(m, tok, 1, 8, NULL, NULL, &l1, NULL));
    FGT_OK(fg_gpt_forward(m, tok2, 1, 8, NULL, NULL, &l2, NULL));
    const double *a = fg_tensor_data(l1), *b = fg_tensor_data(l2);
    for (int t = 0; t < 8; t++) {
        double diff = 0;
        for (int v = 0; v < 13; v++)
            diff = fmax(diff, fabs(a[t * 13 + v] - b[t * 13 + v]));
        if (t >= 3)
            ck_assert_msg(diff == 0, "position %d sees token 0", t);
        else
            ck_assert_msg(diff > 0, "position %d ignores token 0", t);
    }
    fg_tensor_free(l1);
    fg_tensor_free(l2);

    int64_t tgt[12];
    for (int i = 0; i < 12; i++)
        tgt[i] = i % 4 == 0 ? -1 : (i * 3) % 13;
    int64_t tk[12];
    for (int i = 0; i < 12; i++)
        tk[i] = (i * 5 + 1) % 13;
    gc_ctx g = {m, tk, tgt};
    fg_tensor *in[2] = {ps[3].tensor, ps[0].tensor}; /* wte, ln1 w/b, qkv.w */
    ck_assert_str_eq(ps[3].name, "h0.attn.qkv.w");
    fgt_gradcheck("gpt variants", gc_fn, &g, in, 2, 0);

    char path[] = "/tmp/fg_test_variants_XXXXXX";
    int fd = mkstemp(path);
    ck_assert(fd >= 0);
    close(fd);
    fg_train_state st;
    memset(&st, 0, sizeof st);
    FGT_OK(fg_checkpoint_save(path, m, NULL, &st, NULL));
    fg_gpt_config back;
    FGT_OK(fg_checkpoint_peek(path, &back, NULL, NULL, 0));
    ck_assert(back.attn_window == 1 && back.alibi == 1 && back.attn_softcap == 2.0);
    FGT_FAILS(fg_checkpoint_load(path, plain, NULL, NULL), FG_ERR_IO);
    ck_assert(strstr(fg_last_error(), "window 1, alibi 1, softcap 2"));
    unlink(path);
    fg_gpt_free(m);
    fg_gpt_free(plain);
}
END_TEST

/* Packing: documents of 5, 6 and 5 tokens in one [2, 8] batch give, per
 * document, the logits of running it alone (attention stays inside a
 * document, positions restart); the packed model passes gradcheck. */
typedef struct pk_ctx {
    fg_gpt *m;
    const int64_t *tok, *tgt;
    const fg_nn_seqs *seqs;
} pk_ctx;

static fg_status pk_fn(fg_tensor *const *in, int n, fg_tensor **out,
                       void *user)
{
    (void)in;
    (void)n;
    pk_ctx *c = user;
    fg_nn_mode mode = {0, NULL, c->seqs};
    return fg_gpt_forward(c->m, c->tok, 2, 8, c->tgt, &mode, NULL, out);
}

START_TEST(test_gpt_packed)
{
    fg_gpt *m = small_model(FG_FP64, 0, 1, 5);
    const int32_t cu[4] = {0, 5, 11, 16};
    int64_t tok[16], tgt[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = (i * 7 + 3) % 13;
        tgt[i] = (i * 5 + 2) % 13;
    }
    fg_nn_seqs seqs = {NULL, cu, 3};
    fg_nn_mode mode = {0, NULL, &seqs};
    fg_tensor *lg;
    FGT_OK(fg_gpt_forward(m, tok, 2, 8, NULL, &mode, &lg, NULL));
    const double *a = fg_tensor_data(lg);
    for (int s = 0; s < 3; s++) {
        fg_tensor *one;
        FGT_OK(fg_gpt_forward(m, tok + cu[s], 1, cu[s + 1] - cu[s], NULL,
                              NULL, &one, NULL));
        const double *b = fg_tensor_data(one);
        for (int i = 0; i < (cu[s + 1] - cu[s]) * 13; i++)
            ck_assert_msg(fabs(a[cu[s] * 13 + i] - b[i]) <= 1e-12,
                          "document %d logit %d: %g vs %g", s, i,
                          a[cu[s] * 13 + i], b[i]);
        fg_tensor_free(one);
    }
    fg_tensor_free(lg);
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    pk_ctx c = {m, tok, tgt, &seqs};
    fg_tensor *in[2] = {ps[1].tensor, ps[2 + 2].tensor};
    ck_assert_str_eq(ps[1].name, "wpe");
    ck_assert_str_eq(ps[2 + 2].name, "h0.attn.qkv.w");
    fgt_gradcheck("gpt packed", pk_fn, &c, in, 2, 0);
    /* Offsets that do not cover the batch are refused. */
    const int32_t short_cu[3] = {0, 5, 15};
    fg_nn_seqs bad = {NULL, short_cu, 2};
    mode.seqs = &bad;
    FGT_FAILS(fg_gpt_forward(m, tok, 2, 8, NULL, &mode, &lg, NULL),
              FG_ERR_INVALID_ARGUMENT);
    fg_gpt_free(m);
}
END_TEST

/* Key padding: a padded batch (row 1 has 5 real tokens, padding targets
 * -1) has the loss of its real tokens, i.e. of the unpadded rows; the
 * padding tokens' values do not matter. */
START_TEST(test_gpt_padded)
{
    fg_gpt *m = small_model(FG_FP64, 0, 0, 9);
    const int32_t len[2] = {8, 5};
    int64_t tok[16], tgt[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = (i * 3 + 1) % 13;
        tgt[i] = i >= 8 + 5 ? -1 : (i * 11 + 4) % 13;
    }
    fg_nn_seqs seqs = {len, NULL, 0};
    fg_nn_mode mode = {0, NULL, &seqs};
    fg_tensor *loss, *l0, *l1;
    FGT_OK(fg_gpt_forward(m, tok, 2, 8, tgt, &mode, NULL, &loss));
    FGT_OK(fg_gpt_forward(m, tok, 1, 8, tgt, NULL, NULL, &l0));
    FGT_OK(fg_gpt_forward(m, tok + 8, 1, 5, tgt + 8, NULL, NULL, &l1));
    const double want = (8 * *(double *)fg_tensor_data(l0) +
                         5 * *(double *)fg_tensor_data(l1)) / 13;
    const double got = *(double *)fg_tensor_data(loss);
    ck_assert_msg(fabs(got - want) <= 1e-12, "%.15g vs %.15g", got, want);
    /* Other padding tokens, same loss. */
    for (int i = 13; i < 16; i++)
        tok[i] = (tok[i] + 5) % 13;
    fg_tensor *loss2;
    FGT_OK(fg_gpt_forward(m, tok, 2, 8, tgt, &mode, NULL, &loss2));
    ck_assert(fabs(*(double *)fg_tensor_data(loss2) - got) <= 1e-13);
    const int32_t bad_len[2] = {8, 9};
    seqs.lengths = bad_len;
    FGT_FAILS(fg_gpt_forward(m, tok, 2, 8, tgt, &mode, NULL, &loss2),
              FG_ERR_INVALID_ARGUMENT);
    fg_tensor *all[] = {loss, l0, l1, loss2};
    for (int i = 0; i < 4; i++)
        fg_tensor_free(all[i]);
    fg_gpt_free(m);
}
END_TEST

START_TEST(test_lr_schedule)
{
    fg_lr_schedule s = {1e-3, 1e-4, 10, 110};
    ck_assert(fabs(fg_lr_at(&s, 0) - 1e-4) < 1e-12);
    ck_assert(fabs(fg_lr_at(&s, 9) - 1e-3) < 1e-12);
    ck_assert(fabs(fg_lr_at(&s, 10) - 1e-3) < 1e-12);
    ck_assert(fabs(fg_lr_at(&s, 60) - 5.5e-4) < 1e-12); /* cosine middle */
    ck_assert(fabs(fg_lr_at(&s, 110) - 1e-4) < 1e-12);
    ck_assert(fabs(fg_lr_at(&s, 500) - 1e-4) < 1e-12);
    for (int i = 11; i < 110; i++)
        ck_assert(fg_lr_at(&s, i) <= fg_lr_at(&s, i - 1));
    /* a negative step is step 0 (it was 0 / 0 = NaN without warmup) */
    ck_assert(fg_lr_at(&s, -5) == fg_lr_at(&s, 0));
    fg_lr_schedule flat = {1e-3, 1e-4, 0, 100};
    ck_assert(fg_lr_at(&flat, -1) == 1e-3 && fg_lr_at(&flat, 0) == 1e-3);
}
END_TEST

START_TEST(test_clip_and_adamw)
{
    fg_tensor *w, *b;
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2, 2), 1.0, &w));
    FGT_OK(fg_tensor_full(FG_FP64, FG_DEVICE_CPU, FG_SHAPE(2), 1.0, &b));
    FGT_OK(fg_tensor_set_requires_grad(w, 1));
    FGT_OK(fg_tensor_set_requires_grad(b, 1));
    fg_param ps[2] = {{w, "w", 1}, {b, "b", 0}};
    fg_tensor *s1, *s2, *l;
    FGT_OK(fg_scale(w, 3.0, &s1)); /* d/dw sum(3w + 4b) = 3, d/db = 4 */
    FGT_OK(fg_sum(s1, NULL, 0, 0, &s2));
    fg_tensor *t, *u;
    FGT_OK(fg_scale(b, 4.0, &t));
    FGT_OK(fg_sum(t, NULL, 0, 0, &u));
    FGT_OK(fg_add(s2, u, &l));
    FGT_OK(fg_backward(l));
    double norm;
    FGT_OK(fg_clip_grad_norm(ps, 2, 0, &norm));
    ck_assert(fabs(norm - sqrt(4 * 9 + 2 * 16.0)) < 1e-12);
    FGT_OK(fg_clip_grad_norm(ps, 2, 1.0, &norm));
    FGT_OK(fg_clip_grad_norm(ps, 2, 0, &norm));
    ck_assert(fabs(norm - 1.0) < 1e-5);
    /* NaN max_norm skipped clipping silently */
    FGT_FAILS(fg_clip_grad_norm(ps, 2, NAN, &norm), FG_ERR_INVALID_ARGUMENT);
    fg_adamw_config oc;
    fg_adamw *opt = (fg_adamw *)0x1;
    /* non-finite or negative settings (inf weight decay sent the weights
     * to -inf; a negative config lr trained backwards) */
    for (int bad = 0; bad < 5; bad++) {
        fg_adamw_config_init(&oc);
        switch (bad) {
        case 0: oc.weight_decay = INFINITY; break;
        case 1: oc.eps = INFINITY; break;
        case 2: oc.lr = -1; break;
        case 3: oc.lr = NAN; break;
        default: oc.beta2 = 1; break;
        }
        FGT_FAILS(fg_adamw_create(ps, 2, &oc, &opt), FG_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_eq(opt, (fg_adamw *)0x1);
    }
    fg_adamw_config_init(&oc);
    oc.weight_decay = 0.5;
    FGT_OK(fg_adamw_create(ps, 2, &oc, &opt));
    FGT_OK(fg_adamw_step(opt, 0.1));
    /* step 1: the update is lr * sign(g) (bias-corrected); decay on w only */
    const double *wd = fg_tensor_data(w), *bd = fg_tensor_data(b);
    ck_assert(fabs(wd[0] - (1 * (1 - 0.1 * 0.5) - 0.1)) < 1e-6);
    ck_assert(fabs(bd[0] - (1 - 0.1)) < 1e-6);
    ck_assert_int_eq(fg_adamw_steps(opt), 1);
    fg_adamw_free(opt);
    fg_tensor *all[] = {s1, s2, t, u, l, w, b};
    fgt_free_all(all, 7);
}
END_TEST

/* The test: one small batch, overfitted below 0.05. */
START_TEST(test_overfit_one_batch)
{
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = 16;
    c.ctx = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    fg_gpt *m;
    FGT_OK(fg_gpt_create(&c, 11, &m));
    enum { B = 4, T = 16 };
    int64_t tok[B * T], tgt[B * T];
    uint64_t r = 5;
    for (int i = 0; i < B * T; i++)
        tok[i] = (int64_t)(fg_rng_next(&r) % 16);
    for (int i = 0; i < B * T; i++)
        tgt[i] = (int64_t)(fg_rng_next(&r) % 16); /* arbitrary: memorise */
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    oc.weight_decay = 0;
    fg_adamw *opt;
    FGT_OK(fg_adamw_create(ps, n, &oc, &opt));
    fg_tensor **pt = malloc((size_t)n * sizeof *pt);
    for (int i = 0; i < n; i++)
        pt[i] = ps[i].tensor;
    fg_arena *a;
    FGT_OK(fg_arena_create(0, &a));
    double first = 0, loss = 0;
    for (int it = 0; it < 300; it++) {
        FGT_OK(fg_arena_reset(a));
        FGT_OK(fg_arena_push(a));
        fg_tensor *l;
        FGT_OK(fg_gpt_forward(m, tok, B, T, tgt, NULL, NULL, &l));
        loss = fgt_item(l);
        FGT_OK(fg_backward(l));
        FGT_OK(fg_arena_pop(a));
        if (it == 0)
            first = loss;
        if (loss < 0.05)
            break;
        double norm;
        FGT_OK(fg_clip_grad_norm(ps, n, 1.0, &norm));
        FGT_OK(fg_adamw_step(opt, 1e-2));
        FGT_OK(fg_zero_grad(pt, n));
    }
    fprintf(stderr, "overfit: loss %g -> %g\n", first, loss);
    ck_assert_msg(loss < 0.05, "loss %g -> %g", first, loss);
    fg_arena_free(a);
    free(pt);
    fg_adamw_free(opt);
    fg_gpt_free(m);
}
END_TEST

/* Two micro-batches of 4 give the update of one batch of 8 (every target
 * counted, so the mean of the two means is the overall mean). */
START_TEST(test_gradient_accumulation)
{
    enum { T = 8 };
    int64_t x[8 * T], y[8 * T];
    uint64_t r = 21;
    for (int i = 0; i < 8 * T; i++) {
        x[i] = (int64_t)(fg_rng_next(&r) % 13);
        y[i] = (int64_t)(fg_rng_next(&r) % 13);
    }
    fg_gpt *a = small_model(FG_FP64, 0, 1, 8),
           *b = small_model(FG_FP64, 0, 1, 8);
    int n;
    const fg_param *pa = fg_gpt_params(a, &n), *pb = fg_gpt_params(b, NULL);
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    fg_adamw *oa, *ob;
    FGT_OK(fg_adamw_create(pa, n, &oc, &oa));
    FGT_OK(fg_adamw_create(pb, n, &oc, &ob));
    fg_step_stats sa, sb;
    for (int it = 0; it < 3; it++) {
        FGT_OK(fg_gpt_train_step(a, oa, x, y, 8, T, 1, 0.5, 1e-2, NULL, NULL,
                                 &sa));
        FGT_OK(fg_gpt_train_step(b, ob, x, y, 4, T, 2, 0.5, 1e-2, NULL, NULL,
                                 &sb));
        ck_assert(fabs(sa.loss - sb.loss) < 1e-12);
        ck_assert(fabs(sa.grad_norm - sb.grad_norm) < 1e-10);
    }
    for (int i = 0; i < n; i++) {
        const double *u = fg_tensor_data(pa[i].tensor),
                     *v = fg_tensor_data(pb[i].tensor);
        for (int64_t j = 0; j < fg_tensor_numel(pa[i].tensor); j++)
            ck_assert_msg(fabs(u[j] - v[j]) < 1e-9, "%s[%lld]", pa[i].name,
                          (long long)j);
        ck_assert_ptr_nonnull(fg_tensor_grad(pa[i].tensor));
    }
    fg_adamw_free(oa);
    fg_adamw_free(ob);
    fg_gpt_free(a);
    fg_gpt_free(b);
}
END_TEST

START_TEST(test_text_data)
{
    char path[64];
    sprintf(path, "test_nn_text_%ld.txt", (long)getpid());
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 50; i++)
        fputs("abcab\n", f);
    fclose(f);
    fg_text_data d;
    FGT_OK(fg_text_data_load(path, &d));
    ck_assert_int_eq(d.vocab, 4); /* '\n' a b c */
    ck_assert_int_eq(d.itos[0], '\n');
    ck_assert_int_eq(d.stoi['c'], 3);
    ck_assert_int_eq(d.n, 300);
    ck_assert_int_eq(d.n_train, 270);
    int64_t x[3 * 10], y[3 * 10];
    uint64_t r = 1;
    for (int split = 0; split < 2; split++) {
        FGT_OK(fg_text_data_batch(&d, split, &r, 3, 10, x, y));
        for (int b = 0; b < 3; b++)
            for (int i = 0; i + 1 < 10; i++)
                ck_assert_int_eq(y[b * 10 + i], x[b * 10 + i + 1]);
    }
    FGT_FAILS(fg_text_data_batch(&d, 1, &r, 1, 40, x, y),
              FG_ERR_INVALID_ARGUMENT); /* val split has 30 characters */
    fg_text_data_release(&d);
    remove(path);
    FGT_FAILS(fg_text_data_load("/nonexistent/file", &d), FG_ERR_IO);
    /* a FIFO nothing writes to: refused at once (its open used to block
     * forever), as an empty file */
    char fifo[64];
    snprintf(fifo, sizeof fifo, "test_nn_fifo_%ld", (long)getpid());
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    FGT_FAILS(fg_text_data_load(fifo, &d), FG_ERR_IO);
    ck_assert_msg(strstr(fg_last_error(), "fewer than 100 bytes"), "%s",
                  fg_last_error());
    remove(fifo);
}
END_TEST

START_TEST(test_sampling)
{
    fg_gpt *m = small_model(FG_FP32, 0, 1, 4);
    int64_t a[20] = {1, 2}, b[20] = {1, 2};
    fg_sample_options o;
    fg_sample_options_init(&o);
    o.seed = 9;
    o.top_k = 3;
    o.temperature = 0.8;
    FGT_OK(fg_gpt_sample(m, a, 2, 18, &o)); /* longer than ctx 8 */
    FGT_OK(fg_gpt_sample(m, b, 2, 18, &o));
    for (int i = 0; i < 20; i++) {
        ck_assert_int_eq(a[i], b[i]);
        ck_assert(a[i] >= 0 && a[i] < 13);
    }
    o.top_k = 1; /* greedy: the argmax */
    FGT_OK(fg_gpt_sample(m, a, 2, 1, &o));
    fg_tensor *lg;
    FGT_OK(fg_gpt_forward(m, a, 1, 2, NULL, NULL, &lg, NULL));
    double *h = fgt_host(lg);
    int best = 0;
    for (int v = 1; v < 13; v++)
        if (h[13 + v] > h[13 + best])
            best = v;
    ck_assert_int_eq(a[2], best);
    free(h);
    fg_tensor_free(lg);
    o.top_k = 0;
    o.temperature = 0; /* greedy too */
    FGT_OK(fg_gpt_sample(m, a, 2, 1, &o));
    ck_assert_int_eq(a[2], best);
    /* A tiny temperature is greedy too: logits / 1e-310 overflowed to
     * inf, and inf - inf drew arbitrary tokens. */
    o.temperature = 1e-310;
    for (int mode = 0; mode < 3; mode++) {
        const fg_sample_mode modes[3] = {FG_SAMPLE_RECOMPUTE, FG_SAMPLE_CACHE,
                                         FG_SAMPLE_CACHE_SHIFT};
        int64_t t0[12] = {1, 2}, t1[12] = {1, 2};
        o.mode = modes[mode];
        FGT_OK(fg_gpt_sample(m, t1, 2, 10, &o));
        o.temperature = 0;
        FGT_OK(fg_gpt_sample(m, t0, 2, 10, &o));
        o.temperature = 1e-310;
        for (int i = 0; i < 12; i++)
            ck_assert_msg(t0[i] == t1[i], "mode %d, token %d: %lld vs greedy "
                          "%lld", mode, i, (long long)t1[i], (long long)t0[i]);
    }
    o.mode = FG_SAMPLE_CACHE;
    o.temperature = -1;
    FGT_FAILS(fg_gpt_sample(m, a, 2, 1, &o), FG_ERR_INVALID_ARGUMENT);
    o.temperature = NAN;
    FGT_FAILS(fg_gpt_sample(m, a, 2, 1, &o), FG_ERR_INVALID_ARGUMENT);
    /* A diverged model (NaN logits): an error, not token V - 1 or 0. */
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    fg_no_grad_begin();
    FGT_OK(fg_tensor_fill(ps[n - 1].tensor, NAN));
    fg_no_grad_end();
    const double temps[2] = {0.0, 1.0};
    for (int t = 0; t < 2; t++) {
        o.temperature = temps[t];
        FGT_FAILS(fg_gpt_sample(m, a, 2, 1, &o), FG_ERR_STATE);
        ck_assert_msg(strstr(fg_last_error(), "not finite"), "%s",
                      fg_last_error());
    }
    fg_gpt_free(m);
}
END_TEST

/* The profiler's regions: one at a time, CUDA refused without it, and a
 * forward + backward counted in each family it touches. */
START_TEST(test_profile_regions)
{
    fg_profile p;
    FGT_FAILS(fg_profile_end(&p), FG_ERR_STATE);
    if (!fg_cuda_available())
        FGT_FAILS(fg_profile_begin(FG_DEVICE_CUDA), FG_ERR_UNSUPPORTED);
    FGT_OK(fg_profile_begin(FG_DEVICE_CPU));
    FGT_FAILS(fg_profile_begin(FG_DEVICE_CPU), FG_ERR_STATE);
    fg_gpt *m = small_model(FG_FP32, 0, 1, 5);
    const int64_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {2, 3, 4, 5, 6,
                                                          7, 8, 9};
    fg_tensor *loss;
    FGT_OK(fg_gpt_forward(m, x, 1, 8, y, NULL, NULL, &loss));
    FGT_OK(fg_backward(loss));
    FGT_OK(fg_profile_end(&p));
    /* 2 layers: 4 products each and the head, forward and backward */
    ck_assert_int_eq(p.calls[FG_PROF_GEMM], 18);
    ck_assert_int_eq(p.calls[FG_PROF_ATTENTION], 4);
    ck_assert_int_eq(p.calls[FG_PROF_LAYERNORM], 10);
    ck_assert_int_eq(p.calls[FG_PROF_XENT], 2);
    ck_assert_int_eq(p.calls[FG_PROF_OPTIMIZER], 0);
    ck_assert(p.calls[FG_PROF_OTHER] > 0);
    double sum = 0;
    for (int f = 0; f < FG_PROF_NFAMILIES; f++) {
        ck_assert(p.ms[f] >= 0);
        sum += p.ms[f];
    }
    ck_assert(sum <= p.wall_ms * 1.001 + 1e-3);
    /* By operation: every outermost call under one name, largest time
     * first, summing to the families' figures. */
    fg_profile_op ops[128];
    const int n_ops = fg_profile_ops(ops, 128);
    ck_assert_int_gt(n_ops, 5);
    ck_assert_int_le(n_ops, 128);
    ck_assert_int_eq(fg_profile_ops(NULL, 0), n_ops);
    double ms[FG_PROF_NFAMILIES] = {0};
    int64_t calls[FG_PROF_NFAMILIES] = {0};
    int xent_fwd = 0, xent_bwd = 0;
    for (int i = 0; i < n_ops; i++) {
        ck_assert_ptr_nonnull(ops[i].name);
        ck_assert(ops[i].family >= 0 && ops[i].family < FG_PROF_NFAMILIES);
        ck_assert(ops[i].calls > 0 && ops[i].ms >= 0);
        if (i > 0)
            ck_assert(ops[i - 1].ms >= ops[i].ms);
        for (int j = 0; j < i; j++) /* one entry per (family, name) */
            ck_assert(ops[j].family != ops[i].family ||
                      strcmp(ops[j].name, ops[i].name) != 0);
        ms[ops[i].family] += ops[i].ms;
        calls[ops[i].family] += ops[i].calls;
        if (!strcmp(ops[i].name, "fg_cross_entropy"))
            xent_fwd = (int)ops[i].calls * (ops[i].family == FG_PROF_XENT);
        if (!strcmp(ops[i].name, "CrossEntropyBackward"))
            xent_bwd = (int)ops[i].calls * (ops[i].family == FG_PROF_XENT);
    }
    for (int f = 0; f < FG_PROF_NFAMILIES; f++) {
        ck_assert_int_eq(calls[f], p.calls[f]);
        ck_assert(fabs(ms[f] - p.ms[f]) <= 1e-9 * (1 + p.ms[f]));
    }
    ck_assert_int_eq(xent_fwd, 1);
    ck_assert_int_eq(xent_bwd, 1);
    ck_assert_str_eq(fg_profile_family_name(FG_PROF_GEMM), "GEMM");
    ck_assert_str_eq(fg_profile_family_name(99), "?");
    fg_tensor_free(loss);
    fg_gpt_free(m);
}
END_TEST

FGT_MAIN_BEGIN("nn")
FGT_TEST(test_params_and_init)
FGT_TEST(test_forward_shapes_and_initial_loss)
FGT_TEST(test_gpt_gradcheck)
FGT_TEST(test_gpt_variants)
FGT_TEST(test_gpt_packed)
FGT_TEST(test_gpt_padded)
FGT_TEST(test_lr_schedule)
FGT_TEST(test_clip_and_adamw)
FGT_TEST(test_overfit_one_batch)
FGT_TEST(test_sampling)
FGT_TEST(test_gradient_accumulation)
FGT_TEST(test_text_data)
FGT_TEST(test_profile_regions)
FGT_MAIN_END()
