/* SPDX-License-Identifier: MIT */
/* tests/test_checkpoint.c - checkpoints: round trip of parameters,
 * optimizer moments and training state; a run resumed from a checkpoint
 * continues bit for bit like the uninterrupted run (dropout on); truncated,
 * corrupted, foreign and mismatched files are rejected with a clear error
 * and leave the model untouched; saving is atomic under concurrent savers,
 * cleans up the temporaries of dead saves, and errors carry the system's
 * reason. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/core/byteorder.h"
#include "test_ops_util.h"

static const fg_sort_task TASK = {4, 6};
enum { B = 16 };

static fg_gpt *model(uint64_t seed, int64_t width)
{
    fg_gpt_config c;
    fg_gpt_config_init(&c);
    c.vocab = fg_sort_task_vocab(&TASK);
    c.ctx = fg_sort_task_seqlen(&TASK);
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = width;
    c.dropout = 0.1;
    fg_gpt *m;
    FGT_OK(fg_gpt_create(&c, seed, &m));
    return m;
}

static void train(fg_gpt *m, fg_adamw *o, fg_train_state *st, int steps)
{
    const int64_t T = fg_sort_task_seqlen(&TASK);
    int64_t x[B * 8], y[B * 8];
    for (int i = 0; i < steps; i++) {
        FGT_OK(fg_sort_task_batch(&TASK, 0, &st->data_rng, B, x, y));
        FGT_OK(fg_gpt_train_step(m, o, x, y, B / 2, T, 2, 0.5,
                                 1e-3 * (1 + st->step % 3), &st->rng, NULL,
                                 NULL));
        st->step++;
    }
}

static void init_state(fg_train_state *st)
{
    memset(st, 0, sizeof *st);
    fg_generator_init(&st->rng, 42);
    st->data_rng = 17;
    st->best_val = 1.5;
}

/* 1 if every parameter of a and b is bitwise equal. */
static int same_params(const fg_gpt *a, const fg_gpt *b)
{
    int n, nb;
    const fg_param *pa = fg_gpt_params(a, &n), *pb = fg_gpt_params(b, &nb);
    ck_assert_int_eq(n, nb);
    for (int i = 0; i < n; i++)
        if (memcmp(fg_tensor_data(pa[i].tensor), fg_tensor_data(pb[i].tensor),
                   fg_tensor_nbytes(pa[i].tensor)))
            return 0;
    return 1;
}

static void tmp_path(char *buf, const char *tag)
{
    sprintf(buf, "test_checkpoint_%s_%ld.ckpt", tag, (long)getpid());
}

/* A width-32 model and its optimizer after `steps` steps from seed. */
static fg_gpt *trained(uint64_t seed, int steps, fg_adamw **o, fg_train_state *st)
{
    fg_gpt *m = model(seed, 32);
    *o = fgt_adamw_for(m);
    init_state(st);
    train(m, *o, st, steps);
    return m;
}

/* The bytes of file path (malloc'd), *size their number. */
static unsigned char *read_whole(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    rewind(f);
    unsigned char *buf = malloc(*size ? *size : 1);
    ck_assert_uint_eq(fread(buf, 1, *size, f), *size);
    fclose(f);
    return buf;
}

START_TEST(test_round_trip)
{
    char path[256];
    tmp_path(path, "rt");
    fg_adamw *o;
    fg_train_state st;
    fg_gpt *m = trained(1, 3, &o, &st);
    FGT_OK(fg_checkpoint_save(path, m, o, &st, "--task sort"));
    fg_gpt_config cfg;
    fg_train_state st2;
    char meta[64];
    FGT_OK(fg_checkpoint_peek(path, &cfg, &st2, meta, sizeof meta));
    ck_assert_str_eq(meta, "--task sort");
    ck_assert_int_eq(cfg.n_embd, 32);
    ck_assert(cfg.dropout == 0.1);
    fg_gpt *m2 = model(2, 32);
    fg_adamw *o2 = fgt_adamw_for(m2);
    ck_assert(!same_params(m, m2));
    memset(&st2, 0, sizeof st2);
    FGT_OK(fg_checkpoint_load(path, m2, o2, &st2));
    ck_assert(same_params(m, m2));
    ck_assert(memcmp(&st, &st2, sizeof st) == 0);
    ck_assert_int_eq(fg_adamw_steps(o2), 3);
    int n;
    fg_gpt_params(m, &n);
    for (int i = 0; i < n; i++) {
        fg_tensor *a, *b, *c, *d;
        FGT_OK(fg_adamw_state(o, i, &a, &b));
        FGT_OK(fg_adamw_state(o2, i, &c, &d));
        ck_assert(!memcmp(fg_tensor_data(a), fg_tensor_data(c),
                          fg_tensor_nbytes(a)));
        ck_assert(!memcmp(fg_tensor_data(b), fg_tensor_data(d),
                          fg_tensor_nbytes(b)));
    }
    /* Parameters only (no optimizer) also load. */
    fg_gpt *m3 = model(3, 32);
    FGT_OK(fg_checkpoint_load(path, m3, NULL, NULL));
    ck_assert(same_params(m, m3));
    /* A model of another shape is refused. */
    fg_gpt *w = model(1, 48);
    FGT_FAILS(fg_checkpoint_load(path, w, NULL, NULL), FG_ERR_IO);
    ck_assert(strstr(fg_last_error(), "config"));
    remove(path);
    fg_gpt_free(w);
    fg_gpt_free(m3);
    fg_adamw_free(o2);
    fg_gpt_free(m2);
    fg_adamw_free(o);
    fg_gpt_free(m);
}
END_TEST

START_TEST(test_resume_is_bitwise_identical)
{
    char path[256];
    tmp_path(path, "resume");
    /* uninterrupted: 10 steps */
    fg_adamw *oa;
    fg_train_state sa;
    fg_gpt *a = trained(5, 10, &oa, &sa);
    /* interrupted after 4, resumed in a fresh process-like setup */
    fg_adamw *ob;
    fg_train_state sb;
    fg_gpt *b = trained(5, 4, &ob, &sb);
    FGT_OK(fg_checkpoint_save(path, b, ob, &sb, NULL));
    fg_adamw_free(ob);
    fg_gpt_free(b);
    fg_gpt *c = model(99, 32);
    fg_adamw *oc = fgt_adamw_for(c);
    fg_train_state sc;
    memset(&sc, 0, sizeof sc);
    FGT_OK(fg_checkpoint_load(path, c, oc, &sc));
    ck_assert_int_eq(sc.step, 4);
    train(c, oc, &sc, 6);
    ck_assert_msg(same_params(a, c), "resumed run differs");
    ck_assert(memcmp(&sa, &sc, sizeof sa) == 0);
    remove(path);
    fg_adamw_free(oc);
    fg_gpt_free(c);
    fg_adamw_free(oa);
    fg_gpt_free(a);
}
END_TEST

static void write_bytes(const char *path, const unsigned char *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

START_TEST(test_bad_files_rejected)
{
    char path[256], bad[256];
    tmp_path(path, "good");
    tmp_path(bad, "bad");
    fg_gpt *m = model(1, 32);
    fg_adamw *o = fgt_adamw_for(m);
    fg_train_state st;
    init_state(&st);
    FGT_OK(fg_checkpoint_save(path, m, o, &st, "meta"));
    size_t size;
    unsigned char *buf = read_whole(path, &size);
    fg_gpt *t = model(7, 32);
    fg_adamw *ot = fgt_adamw_for(t);
    fg_gpt *ref = model(7, 32);
    /* truncated anywhere */
    const size_t cuts[] = {0, 5, 8, 20, 31, 200, size / 2, size - 9, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        write_bytes(bad, buf, cuts[i]);
        FGT_FAILS(fg_checkpoint_load(bad, t, ot, &st), FG_ERR_IO);
        ck_assert_msg(strstr(fg_last_error(), "truncated") ||
                          (cuts[i] < 8 && strstr(fg_last_error(), "magic")),
                      "cut %zu: %s", cuts[i], fg_last_error());
        FGT_FAILS(fg_checkpoint_peek(bad, NULL, NULL, NULL, 0), FG_ERR_IO);
    }
    /* one flipped bit anywhere after the magic */
    const size_t flips[] = {9, 30, 100, size / 3, size - 20, size - 3};
    for (size_t i = 0; i < sizeof flips / sizeof *flips; i++) {
        buf[flips[i]] ^= 0x10;
        write_bytes(bad, buf, size);
        FGT_FAILS(fg_checkpoint_load(bad, t, ot, &st), FG_ERR_IO);
        ck_assert_msg(strstr(fg_last_error(), "checksum") ||
                          strstr(fg_last_error(), "version") ||
                          strstr(fg_last_error(), "truncated") ||
                          strstr(fg_last_error(), "trailing"),
                      "flip at %zu: %s", flips[i], fg_last_error());
        buf[flips[i]] ^= 0x10;
    }
    /* not a checkpoint; extra bytes; missing file */
    write_bytes(bad, (const unsigned char *)"hello world, not a checkpoint",
                29);
    FGT_FAILS(fg_checkpoint_load(bad, t, NULL, NULL), FG_ERR_IO);
    ck_assert(strstr(fg_last_error(), "magic"));
    unsigned char *longer = calloc(size + 4, 1);
    memcpy(longer, buf, size);
    write_bytes(bad, longer, size + 4);
    FGT_FAILS(fg_checkpoint_load(bad, t, NULL, NULL), FG_ERR_IO);
    free(longer);
    FGT_FAILS(fg_checkpoint_load("/nonexistent/x.ckpt", t, NULL, NULL),
              FG_ERR_IO);
    /* after all of that the model is untouched */
    ck_assert(same_params(t, ref));
    ck_assert_int_eq(fg_adamw_steps(ot), 0);
    /* the intact file still loads */
    write_bytes(bad, buf, size);
    FGT_OK(fg_checkpoint_load(bad, t, ot, &st));
    ck_assert(same_params(t, m));
    remove(bad);
    remove(path);
    free(buf);
    fg_gpt_free(ref);
    fg_adamw_free(ot);
    fg_gpt_free(t);
    fg_adamw_free(o);
    fg_gpt_free(m);
}
END_TEST

/* Files in dir whose name starts with prefix. */
static int count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* Two processes save different models to one path, over and over; the
 * file left is whole and is one of the two, and no temporary remains. */
START_TEST(test_concurrent_savers)
{
    char path[256], prefix[300];
    tmp_path(path, "race");
    snprintf(prefix, sizeof prefix, "%s.tmp.", path);
    enum { ROUNDS = 25 };
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        ck_assert_int_ge(kids[k], 0);
        if (kids[k] == 0) {
            fg_gpt *m = model(100 + (uint64_t)k, 32);
            fg_adamw *o = fgt_adamw_for(m);
            fg_train_state st;
            init_state(&st);
            st.step = k;
            int bad = 0;
            for (int i = 0; i < ROUNDS; i++)
                bad += fg_checkpoint_save(path, m, o, &st, k ? "b" : "a") !=
                       FG_OK;
            if (bad)
                fprintf(stderr, "saver %d: %s\n", k, fg_last_error());
            _exit(bad ? 1 : 0);
        }
    }
    for (int k = 0; k < 2; k++) {
        int status;
        ck_assert_int_eq(waitpid(kids[k], &status, 0), kids[k]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "saver %d failed", k);
    }
    fg_gpt *got = model(7, 32), *a = model(100, 32), *b = model(101, 32);
    fg_adamw *og = fgt_adamw_for(got);
    fg_train_state st;
    char meta[8];
    FGT_OK(fg_checkpoint_load(path, got, og, &st));
    FGT_OK(fg_checkpoint_peek(path, NULL, NULL, meta, sizeof meta));
    const int is_b = same_params(got, b);
    ck_assert(is_b || same_params(got, a));
    ck_assert_str_eq(meta, is_b ? "b" : "a");
    ck_assert_int_eq(st.step, is_b);
    ck_assert_int_eq(count_prefixed(".", prefix), 0);
    remove(path);
    fg_adamw_free(og);
    fg_gpt_free(b);
    fg_gpt_free(a);
    fg_gpt_free(got);
}
END_TEST

/* A temporary nobody holds (a save that was killed) goes at the next save;
 * one a live saver holds (locked) stays. */
START_TEST(test_stale_temporaries_removed)
{
    char path[256], dead[300], live[300], other[300];
    tmp_path(path, "stale");
    snprintf(dead, sizeof dead, "%s.tmp.AbC123", path);
    snprintf(live, sizeof live, "%s.tmp.LiVe99", path);
    snprintf(other, sizeof other, "%s.tmp.keep-me-too", path);
    const char *files[] = {dead, live, other};
    for (int i = 0; i < 3; i++)
        write_bytes(files[i], (const unsigned char *)"partial", 7);
    const int fd = open(live, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(flock(fd, LOCK_EX), 0);
    fg_gpt *m = model(1, 32);
    fg_train_state st;
    init_state(&st);
    FGT_OK(fg_checkpoint_save(path, m, NULL, &st, NULL));
    ck_assert_msg(access(dead, F_OK) != 0, "stale temporary kept");
    ck_assert_msg(access(live, F_OK) == 0, "a live saver's file removed");
    ck_assert_msg(access(other, F_OK) == 0, "not a temporary, removed");
    FGT_OK(fg_checkpoint_load(path, m, NULL, NULL));
    close(fd);
    remove(live);
    remove(other);
    remove(path);
    fg_gpt_free(m);
}
END_TEST

/* Directories and unwritable places give clear errors with the reason. */
START_TEST(test_io_errors_are_clear)
{
    fg_gpt *m = model(1, 32);
    fg_train_state st;
    init_state(&st);
    char dir[256], file[256], below[300];
    tmp_path(dir, "dir");
    tmp_path(file, "file");
    ck_assert_int_eq(mkdir(dir, 0777), 0);
    FGT_FAILS(fg_checkpoint_load(dir, m, NULL, NULL), FG_ERR_IO);
    ck_assert_msg(strstr(fg_last_error(), "is a directory"), "%s",
                  fg_last_error());
    FGT_FAILS(fg_checkpoint_peek(dir, NULL, NULL, NULL, 0), FG_ERR_IO);
    ck_assert(strstr(fg_last_error(), "is a directory"));
    FGT_FAILS(fg_checkpoint_save(dir, m, NULL, &st, NULL), FG_ERR_IO);
    ck_assert_msg(strstr(fg_last_error(), "is a directory"), "%s",
                  fg_last_error());
    FGT_FAILS(fg_checkpoint_load("/nonexistent/x.ckpt", m, NULL, NULL),
              FG_ERR_IO);
    ck_assert_msg(strstr(fg_last_error(), strerror(ENOENT)), "%s",
                  fg_last_error());
    /* Below a regular file: fails even for root. */
    write_bytes(file, (const unsigned char *)"x", 1);
    snprintf(below, sizeof below, "%s/x.ckpt", file);
    FGT_FAILS(fg_checkpoint_save(below, m, NULL, &st, NULL), FG_ERR_IO);
    ck_assert_msg(strstr(fg_last_error(), strerror(ENOTDIR)), "%s",
                  fg_last_error());
    FGT_FAILS(fg_checkpoint_save("/nonexistent/x.ckpt", m, NULL, &st, NULL),
              FG_ERR_IO);
    ck_assert_msg(strstr(fg_last_error(), strerror(ENOENT)), "%s",
                  fg_last_error());
    FGT_FAILS(fg_checkpoint_save("", m, NULL, &st, NULL),
              FG_ERR_INVALID_ARGUMENT);
    rmdir(dir);
    remove(file);
    fg_gpt_free(m);
}
END_TEST

/* A FIFO: saving renamed a regular file over it (as it would over
 * /dev/null, for root), and loading waited forever for a writer. Both
 * are refused now, and the FIFO is left as it was. */
START_TEST(test_special_files)
{
    fg_gpt *m = model(1, 32);
    fg_train_state st;
    init_state(&st);
    char fifo[256];
    tmp_path(fifo, "fifo");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    FGT_FAILS(fg_checkpoint_save(fifo, m, NULL, &st, NULL), FG_ERR_IO);
    ck_assert_msg(strstr(fg_last_error(), "not a regular file"), "%s",
                  fg_last_error());
    struct stat sb;
    ck_assert(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
    FGT_FAILS(fg_checkpoint_load(fifo, m, NULL, NULL), FG_ERR_IO);
    ck_assert_msg(strstr(fg_last_error(), "not a regular file"), "%s",
                  fg_last_error());
    FGT_FAILS(fg_checkpoint_peek(fifo, NULL, NULL, NULL, 0), FG_ERR_IO);
    /* a link to it is followed: the same */
    char link[300];
    snprintf(link, sizeof link, "%s.lnk", fifo);
    ck_assert_int_eq(symlink(fifo, link), 0);
    FGT_FAILS(fg_checkpoint_save(link, m, NULL, &st, NULL), FG_ERR_IO);
    ck_assert(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
    remove(link);
    remove(fifo);
    fg_gpt_free(m);
}
END_TEST

/* The byte helpers against encodings built by shifts (independent of the
 * host's order): swapping a little-endian encoding gives the big-endian
 * one and back, per element, for widths 2, 4 and 8; fg_le_elems turns host
 * values into their little-endian encoding. */
START_TEST(test_byte_order_helpers)
{
    static const uint64_t vals[3] = {0x0123456789abcdefull, 0xfedcba9876543210ull,
                                     0x00ff00ff11223344ull};
    for (size_t w = 2; w <= 8; w *= 2) {
        unsigned char le[24], be[24], x[24];
        for (int e = 0; e < 3; e++)
            for (size_t i = 0; i < w; i++) {
                le[e * w + i] = (unsigned char)(vals[e] >> (8 * i));
                be[e * w + i] = (unsigned char)(vals[e] >> (8 * (w - 1 - i)));
            }
        memcpy(x, le, 3 * w);
        fg_swap_elems(x, 3 * w, w);
        ck_assert(memcmp(x, be, 3 * w) == 0);
        fg_swap_elems(x, 3 * w, w);
        ck_assert(memcmp(x, le, 3 * w) == 0);
    }
    const uint32_t u[2] = {0x3f800000u, 0xc0490fdbu}; /* 1.0f, -3.14159f */
    unsigned char h[8], want[8];
    memcpy(h, u, sizeof u);
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 4; i++)
            want[4 * e + i] = (unsigned char)(u[e] >> (8 * i));
    fg_le_elems(h, sizeof h, 4);
    ck_assert(memcmp(h, want, sizeof h) == 0);
}
END_TEST

/* A checkpoint's tensor payloads are little-endian (optim.h: a file
 * written on one machine loads on another): every parameter's values, and
 * the first moments, appear in the file as their shift-built little-endian
 * encoding. */
START_TEST(test_payload_little_endian)
{
    char path[256];
    tmp_path(path, "le");
    fg_adamw *o;
    fg_train_state st;
    fg_gpt *m = trained(5, 2, &o, &st); /* moments not zero */
    FGT_OK(fg_checkpoint_save(path, m, o, &st, NULL));
    size_t size;
    unsigned char *buf = read_whole(path, &size);
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    for (int i = 0; i < n; i++)
        for (int which = 0; which < 2; which++) {
            fg_tensor *t = ps[i].tensor, *mt, *vt;
            if (which == 1) {
                FGT_OK(fg_adamw_state(o, i, &mt, &vt));
                t = mt;
            }
            ck_assert_int_eq(fg_tensor_dtype(t), FG_FP32);
            const size_t nb = fg_tensor_nbytes(t);
            const unsigned char *data = fg_tensor_data(t);
            unsigned char *want = malloc(nb);
            for (size_t e = 0; e < nb / 4; e++) {
                uint32_t v;
                memcpy(&v, data + 4 * e, 4);
                for (int k = 0; k < 4; k++)
                    want[4 * e + k] = (unsigned char)(v >> (8 * k));
            }
            int found = 0;
            for (size_t at = 0; at + nb <= size && !found; at++)
                found = memcmp(buf + at, want, nb) == 0;
            ck_assert_msg(found, "%s%s: payload not little-endian in the file", ps[i].name,
                          which ? ".m" : "");
            free(want);
        }
    free(buf);
    remove(path);
    fg_adamw_free(o);
    fg_gpt_free(m);
}
END_TEST

FGT_MAIN_BEGIN("checkpoint")
FGT_TEST(test_round_trip)
FGT_TEST(test_resume_is_bitwise_identical)
FGT_TEST(test_bad_files_rejected)
FGT_TEST(test_concurrent_savers)
FGT_TEST(test_stale_temporaries_removed)
FGT_TEST(test_io_errors_are_clear)
FGT_TEST(test_special_files)
FGT_TEST(test_byte_order_helpers)
FGT_TEST(test_payload_little_endian)
FGT_MAIN_END()
