/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_checkpoint.c - libFuzzer target for the checkpoint loader
 * (fg_checkpoint_peek and fg_checkpoint_load in optim.h), through the
 * public API only: the bytes become an in-memory file.
 *
 * The first byte holds flags: bit 0 recomputes the trailing FNV-1a checksum
 * (optim.h documents it), so mutations get past the checksum to the parser;
 * bit 1 loads the AdamW moments too; bit 2 also peeks with a meta buffer of
 * the second byte's size. A load that fails must say why and leave the
 * model, the optimizer and the state untouched; one that succeeds is
 * undone before the next input, so every input sees the same model. The
 * seed corpus holds checkpoints fg_checkpoint_save wrote for this target's
 * model (with and without moments), each behind a flags byte. */
#include "fuzz_util.h" /* first: it defines _GNU_SOURCE */

#include <flashgrad/flashgrad.h>

static fg_gpt *model;
static fg_adamw *opt;
static int n_params;
static unsigned char *pristine; /* parameters, then m and v, as bytes */
static size_t pristine_bytes;

/* The tensors whose bytes a load may change: parameters, then moments. */
static size_t walk(int copy_in, unsigned char *buf)
{
    const fg_param *ps = fg_gpt_params(model, &n_params);
    size_t at = 0;
    for (int i = 0; i < n_params; i++) {
        fg_tensor *t[3] = {ps[i].tensor, NULL, NULL};
        fg_adamw_state(opt, i, &t[1], &t[2]);
        for (int k = 0; k < 3; k++) {
            const size_t nb = fg_tensor_nbytes(t[k]);
            if (buf && copy_in)
                memcpy(fg_tensor_data(t[k]), buf + at, nb);
            else if (buf)
                memcpy(buf + at, fg_tensor_data(t[k]), nb);
            at += nb;
        }
    }
    return at;
}

static void setup(void)
{
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = 5;
    c.ctx = 4;
    c.n_layer = 1;
    c.n_head = 1;
    c.n_embd = 8;
    if (fg_gpt_create(&c, 1, &model) != FG_OK)
        abort();
    const fg_param *ps = fg_gpt_params(model, &n_params);
    fg_adamw_config oc;
    fg_adamw_config_init(&oc);
    if (fg_adamw_create(ps, n_params, &oc, &opt) != FG_OK)
        abort();
    pristine_bytes = walk(0, NULL);
    pristine = malloc(pristine_bytes);
    walk(0, pristine);
}

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!model)
        setup();
    if (size < 2)
        return 0;
    const uint8_t flags = data[0], meta_cap = data[1];
    const size_t n = size - 2;
    unsigned char *file = malloc(n ? n : 1);
    memcpy(file, data + 2, n);
    if ((flags & 1) && n >= 8) {
        const uint64_t h = fnv1a(file, n - 8);
        for (int i = 0; i < 8; i++)
            file[n - 8 + i] = (unsigned char)(h >> (8 * i));
    }
    char path[64];
    const int fd = fz_memfile(file, n, path, sizeof path);
    free(file);
    if (fd < 0)
        return 0;

    if (flags & 4) {
        char meta[256];
        memset(meta, 0x55, sizeof meta);
        fg_gpt_config cfg;
        fg_train_state st;
        const fg_status s =
            fg_checkpoint_peek(path, &cfg, &st, meta_cap ? meta : NULL,
                               meta_cap);
        if (s == FG_OK && meta_cap) {
            FZ_CHECK(memchr(meta, 0, meta_cap) != NULL,
                     "peek left meta unterminated");
            FZ_CHECK(meta_cap == 255 || (unsigned char)meta[meta_cap] == 0x55,
                     "peek wrote past meta_cap");
        }
    }

    fg_train_state st, st0;
    memset(&st, 0xA5, sizeof st);
    st0 = st;
    const int64_t steps0 = fg_adamw_steps(opt);
    fg_clear_error();
    const fg_status s =
        fg_checkpoint_load(path, model, (flags & 2) ? opt : NULL, &st);
    close(fd);
    unsigned char *now = malloc(pristine_bytes);
    walk(0, now);
    if (s != FG_OK) {
        FZ_CHECK(fg_last_error()[0] != '\0', "no message for %s",
                 fg_status_string(s));
        FZ_CHECK(memcmp(now, pristine, pristine_bytes) == 0,
                 "a failed load changed the model or optimizer");
        FZ_CHECK(memcmp(&st, &st0, sizeof st) == 0 &&
                     fg_adamw_steps(opt) == steps0,
                 "a failed load changed the state");
    } else {
        walk(1, pristine); /* undo for the next input */
        fg_adamw_set_steps(opt, steps0);
    }
    free(now);
    return 0;
}
