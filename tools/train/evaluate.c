/* SPDX-License-Identifier: MIT */
/* tools/train/evaluate.c - validation loss and text samples. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"
#include "util.h"

int eval_loss(run *r, int split, double *out)
{
    const int64_t B = r->o.batch, T = r->d.T;
    /* The same batches at every evaluation: the curve shows the model
     * changing, not the sample. */
    uint64_t rng = (uint64_t)r->o.seed * 31 + (uint64_t)split;
    double sum = 0;
    fg_status s = FG_OK;
    fg_no_grad_begin();
    for (int64_t i = 0; i < r->o.eval_batches && s == FG_OK; i++) {
        fg_tensor *loss = NULL;
        double l = 0;
        s = data_batch(&r->d, split, &rng, B, r->x, r->y);
        if (s == FG_OK)
            s = fg_gpt_forward(r->m, r->x, B, T, r->y, NULL, NULL, &loss);
        if (s == FG_OK)
            s = fg_tensor_item(loss, &l);
        fg_tensor_free(loss);
        sum += l;
    }
    fg_no_grad_end();
    if (s != FG_OK)
        return lib_error(EXIT_FAIL);
    *out = sum / (double)r->o.eval_batches;
    return 0;
}

/* Printable on a terminal: --bytes text may hold anything. */
static void put_shown(const unsigned char *p, size_t n, int raw)
{
    for (size_t i = 0; i < n; i++) {
        if (raw || p[i] >= 0x20 || p[i] == '\n' || p[i] == '\t')
            putchar(p[i]);
        else
            printf("\\x%02x", p[i]);
    }
}

int write_samples(run *r)
{
    const opts *o = &r->o;
    if (!r->d.text || o->samples <= 0)
        return 0;
    int64_t *tok = malloc((size_t)(o->sample_len + 1) * sizeof *tok);
    unsigned char *txt = malloc((size_t)o->sample_len + 1);
    FILE *f = r->samples[0] ? fopen(r->samples, "a") : NULL;
    if (!tok || !txt) {
        free(tok);
        free(txt);
        if (f)
            fclose(f);
        return complain(EXIT_FAIL, "out of memory");
    }
    if (r->samples[0] && !f)
        fprintf(stderr, "flashgrad-train: warning: %s: %s\n", r->samples,
                strerror(errno));
    fg_sample_options so;
    fg_sample_options_init(&so);
    so.temperature = o->temperature;
    so.top_k = (int)o->top_k;
    so.mode = !strcmp(o->sample_mode, "shift")       ? FG_SAMPLE_CACHE_SHIFT
              : !strcmp(o->sample_mode, "recompute") ? FG_SAMPLE_RECOMPUTE
                                                     : FG_SAMPLE_CACHE;
    int rc = 0;
    for (int64_t i = 0; i < o->samples && !rc; i++) {
        so.seed = (uint64_t)o->seed + (uint64_t)i; /* same dice each time */
        tok[0] = r->d.td.stoi['\n'] >= 0 ? r->d.td.stoi['\n'] : 0;
        const double t0 = now();
        if (fg_gpt_sample(r->m, tok, 1, o->sample_len, &so) != FG_OK) {
            rc = lib_error(EXIT_FAIL);
            break;
        }
        const double dt = now() - t0;
        for (int64_t j = 1; j <= o->sample_len; j++)
            txt[j - 1] = r->d.td.itos[tok[j]];
        char head[128];
        snprintf(head, sizeof head, "---- sample %lld at step %lld "
                 "(temperature %g, top-k %lld) ----\n", (long long)i + 1,
                 (long long)r->st.step, o->temperature, (long long)o->top_k);
        fputs(head, stdout);
        put_shown(txt, (size_t)o->sample_len, !o->bytes);
        printf("\n(generated %lld tokens in %.3f s: %.0f tok/s, %s)\n",
               (long long)o->sample_len, dt,
               dt > 0 ? (double)o->sample_len / dt : 0, o->sample_mode);
        if (f) {
            fputs(head, f);
            fwrite(txt, 1, (size_t)o->sample_len, f);
            fputc('\n', f);
        }
    }
    if (f && fclose(f) != 0)
        fprintf(stderr, "flashgrad-train: warning: %s: %s\n", r->samples,
                strerror(errno));
    fflush(stdout);
    free(tok);
    free(txt);
    return rc;
}
