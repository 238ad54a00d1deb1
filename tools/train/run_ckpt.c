/* SPDX-License-Identifier: MIT */
/* tools/train/run_ckpt.c - the trainer's checkpoints: the library's file
 * plus, in its meta text, every run setting, the time trained so far, and
 * for text the vocabulary and a fingerprint of the text, so that --resume
 * can restore the run and refuse other data. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"
#include "util.h"

/* The meta text: this line, then "--option value" lines (options.c) and
 * "@key value" lines (@loss-scale: the loss scaler's scale, good steps
 * and skipped steps). Checkpoints of the first flashgrad-train hold one
 * space-separated line of options instead; they still load. */
static const char META_MAGIC[] = "flashgrad-train-run 2";
enum { META_CAP = 1 << 16 };

int ckpt_save(run *r, const char *path, const char *why)
{
    if (!path[0])
        return 0;
    char *meta = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&meta, &len);
    if (!f)
        return complain(EXIT_FAIL, "out of memory");
    fprintf(f, "%s\n", META_MAGIC);
    opts_write(&r->o, f, 0);
    fprintf(f, "@elapsed %.3f\n", r->elapsed0 + now() - r->t0);
    if (r->scaled) /* exact (%a): the resumed run scales as this one */
        fprintf(f, "@loss-scale %a %lld %lld\n", r->scaler.scale,
                (long long)r->scaler.good_steps,
                (long long)r->scaler.skipped);
    if (r->d.text) {
        fprintf(f, "@data-bytes %lld\n@data-fnv1a %016llx\n@vocab ",
                (long long)r->d.nbytes, (unsigned long long)r->d.fnv);
        for (int64_t i = 0; i < r->d.td.vocab; i++)
            fprintf(f, "%02x", r->d.td.itos[i]);
        fputc('\n', f);
    }
    fclose(f);
    /* Data parallel: collective, rank 0 writes. */
    const fg_status s =
        r->dp ? fg_dp_checkpoint_save(r->dp, path, r->m, &r->st, meta)
              : fg_checkpoint_save(path, r->m, r->opt, &r->st, meta);
    free(meta);
    if (s != FG_OK)
        return lib_error(EXIT_FAIL);
    if (why)
        printf("checkpoint (%s): %s at step %lld\n", why, path,
               (long long)r->st.step);
    return 0;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* One "@key value" line. */
static int read_state(run_origin *g, const char *key, const char *v,
                      const char *src)
{
    char *end = NULL;
    if (!strcmp(key, "@elapsed"))
        g->elapsed = strtod(v, &end);
    else if (!strcmp(key, "@data-bytes"))
        g->nbytes = strtoll(v, &end, 10);
    else if (!strcmp(key, "@data-fnv1a")) {
        g->fnv = strtoull(v, &end, 16);
        g->has_fingerprint = 1;
    } else if (!strcmp(key, "@vocab")) {
        const size_t n = strlen(v);
        for (size_t i = 0; i + 1 < n && i / 2 < 256; i += 2) {
            const int hi = hexval(v[i]), lo = hexval(v[i + 1]);
            if (hi < 0 || lo < 0)
                break;
            g->vocab[g->n_vocab++] = (unsigned char)(hi << 4 | lo);
        }
        end = (char *)v + 2 * g->n_vocab;
    } else if (!strcmp(key, "@loss-scale")) {
        fg_grad_scaler *sc = &g->scaler;
        fg_grad_scaler_init(sc);
        sc->scale = strtod(v, &end);
        if (end != v && *end == ' ')
            sc->good_steps = strtoll(end + 1, &end, 10);
        if (end && *end == ' ')
            sc->skipped = strtoll(end + 1, &end, 10);
        if (!(sc->scale > 0) || !isfinite(sc->scale) || sc->good_steps < 0 ||
            sc->skipped < 0)
            return complain(EXIT_USAGE, "%s: bad value of %s", src, key);
        g->has_scaler = 1;
    } else
        return complain(EXIT_USAGE, "%s: unknown entry %s", src, key);
    if (!end || end == v || *end)
        return complain(EXIT_USAGE, "%s: bad value of %s", src, key);
    return 0;
}

int ckpt_read_run(run *r, const char *path)
{
    char *meta = malloc(META_CAP), src[PATH_CAP + 16];
    if (!meta)
        return complain(EXIT_FAIL, "out of memory");
    snprintf(src, sizeof src, "checkpoint %s", path);
    if (fg_checkpoint_peek(path, NULL, NULL, meta, META_CAP) != FG_OK) {
        free(meta);
        return complain(EXIT_USAGE, "--resume: %s", fg_last_error());
    }
    opts_defaults(&r->o);
    memset(&r->from, 0, sizeof r->from);
    int rc = 0;
    const size_t ml = strlen(META_MAGIC);
    if (!strncmp(meta, META_MAGIC, ml) && meta[ml] == '\n') {
        char *save = NULL;
        for (char *l = strtok_r(meta + ml + 1, "\n", &save); l && !rc;
             l = strtok_r(NULL, "\n", &save)) {
            char *v = strchr(l, ' ');
            if (v)
                *v++ = 0;
            rc = l[0] == '@' ? read_state(&r->from, l, v ? v : "", src)
                             : opts_apply(&r->o, l, v, src);
        }
    } else { /* the first trainer's "--name value ..." line */
        char *save = NULL, *k, *v;
        while (!rc && (k = strtok_r(save ? NULL : meta, " ", &save)) &&
               (v = strtok_r(NULL, " ", &save)))
            if (strcmp(k, "--data") || strcmp(v, "-"))
                rc = opts_apply(&r->o, k, v, src);
    }
    free(meta);
    snprintf(r->from.data, sizeof r->from.data, "%s", r->o.data);
    r->elapsed0 = r->from.elapsed;
    return rc;
}
