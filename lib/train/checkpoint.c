/* SPDX-License-Identifier: MIT */
/* lib/train/checkpoint.c - one-file checkpoints (format in optim.h):
 *
 *   "FGCKPT01" | u32 version | u32 0 | u64 body_len | body | u64 FNV-1a
 *
 * body: config, training state, meta text, optimizer flag and step, then
 * tensors (u16 name length, name, u32 dtype, u32 nd, i64 shape[nd],
 * u64 nbytes, raw bytes): every parameter, then (with an optimizer) the
 * first and second moments of each, named NAME.m / NAME.v. The whole file
 * is read and checked before anything is copied, so a bad file changes
 * nothing.
 *
 * Saving is crash- and race-safe: the bytes go to a temporary file of a
 * unique name beside PATH (PATH.tmp.XXXXXX), which is fsync'ed, renamed
 * over PATH and the directory fsync'ed; concurrent savers of one PATH
 * each rename a complete file, so PATH is always one of them. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "flashgrad/optim.h"
#include "lib/autograd/tensor_internal.h"
#include "lib/core/byteorder.h"
#include "lib/core/error.h"

static const char MAGIC[8] = {'F', 'G', 'C', 'K', 'P', 'T', '0', '1'};
enum { HEAD = 24 };

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* ---- writing: a growing buffer ------------------------------------------- */

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} wbuf;

static void put(wbuf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

/* Little-endian integers (the host order is not assumed). */
static void put_u64(wbuf *b, uint64_t v)
{
    unsigned char x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, 8);
}
static void put_u32(wbuf *b, uint32_t v)
{
    unsigned char x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, 4);
}
static void put_f64(wbuf *b, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    put_u64(b, v);
}

static void put_tensor(wbuf *b, const char *name, const char *suffix,
                       const fg_tensor *t)
{
    char nm[64];
    snprintf(nm, sizeof nm, "%s%s", name, suffix);
    const uint16_t len = (uint16_t)strlen(nm);
    unsigned char l2[2] = {(unsigned char)len, (unsigned char)(len >> 8)};
    put(b, l2, 2);
    put(b, nm, len);
    put_u32(b, (uint32_t)fg_tensor_dtype(t));
    put_u32(b, (uint32_t)fg_tensor_ndim(t));
    for (int i = 0; i < fg_tensor_ndim(t); i++)
        put_u64(b, (uint64_t)fg_tensor_shape(t)[i]);
    put_u64(b, fg_tensor_nbytes(t));
    const size_t nbytes = fg_tensor_nbytes(t);
    if (fg_tensor_device(t) == FG_DEVICE_CPU && !fg_host_big_endian()) {
        put(b, fg_tensor_data(t), nbytes);
        return;
    }
    /* Device tensors (contiguous parameters and optimizer state) go
     * through a host copy, as do host tensors on a big-endian host (the
     * payload is little-endian); a failure marks the buffer like an OOM. */
    void *tmp = malloc(nbytes ? nbytes : 1);
    if (!tmp) {
        b->oom = 1;
    } else if (fg_tensor_device(t) == FG_DEVICE_CPU) {
        memcpy(tmp, fg_tensor_data(t), nbytes);
    } else if (fg_tensor_copy_to_host(t, fg_tensor_dtype(t), tmp, fg_tensor_numel(t)) != FG_OK) {
        b->oom = 1;
    }
    if (!b->oom) {
        fg_le_elems(tmp, nbytes, fg_dtype_size(fg_tensor_dtype(t)));
        put(b, tmp, nbytes);
    }
    free(tmp);
}

/* dst (a parameter or optimizer state, any device) = the file's bytes at
 * src, little-endian: turned to host order in place first (src lies in
 * the loader's own copy of the file; a no-op on little-endian hosts).
 * Not recorded: parameters are leaves requiring grad. */
static fg_status load_tensor(fg_tensor *dst, const void *src)
{
    fg_le_elems((void *)src, fg_tensor_nbytes(dst), fg_dtype_size(fg_tensor_dtype(dst)));
    if (fg_tensor_device(dst) == FG_DEVICE_CPU) {
        memcpy(fg_tensor_data(dst), src, fg_tensor_nbytes(dst));
        fg_tensor_bump_version(dst); /* stales an autocast copy */
        return FG_OK;
    }
    fg_no_grad_begin();
    fg_status s = fg_tensor_copy_from_host(dst, fg_tensor_dtype(dst), src,
                                           fg_tensor_numel(dst));
    fg_no_grad_end();
    return s;
}

static void put_config(wbuf *b, const fg_gpt_config *c)
{
    put_u64(b, (uint64_t)c->vocab);
    put_u64(b, (uint64_t)c->ctx);
    put_u64(b, (uint64_t)c->n_layer);
    put_u64(b, (uint64_t)c->n_head);
    put_u64(b, (uint64_t)c->n_embd);
    put_f64(b, c->dropout);
    put_u64(b, (uint64_t)c->tie_weights);
    put_u64(b, (uint64_t)c->dtype);
    put_u64(b, (uint64_t)c->device);
    put_u64(b, (uint64_t)c->attn_window); /* version 2 */
    put_f64(b, c->attn_softcap);
    put_u64(b, (uint64_t)c->alibi);
}

/* ---- saving: a unique temporary, fsync, rename --------------------------- */

/* A saver holds an flock on its temporary until the rename, so a
 * temporary nobody has locked was left by a save that died (killed,
 * crashed) and the next save of the same PATH removes it. */
static const char TMP_TAG[] = ".tmp.";
enum { TMP_RAND = 6 };

/* dir (with its "/", or "" for the current one) and base name of path. */
static void split_path(const char *path, char *dir, size_t cap,
                       const char **base)
{
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    const size_t n = slash ? (size_t)(slash - path) + 1 : 0;
    snprintf(dir, cap, "%.*s", (int)n, path);
}

static void remove_stale_temporaries(const char *path)
{
    char dir[4096], prefix[4096], full[8192];
    const char *base;
    split_path(path, dir, sizeof dir, &base);
    snprintf(prefix, sizeof prefix, "%s%s", base, TMP_TAG);
    const size_t pn = strlen(prefix);
    DIR *d = opendir(dir[0] ? dir : ".");
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, pn) != 0 ||
            strlen(e->d_name) != pn + TMP_RAND)
            continue;
        snprintf(full, sizeof full, "%s%s", dir, e->d_name);
        const int fd = open(full, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue;
        struct stat a, b;
        /* Unlocked, and still the file of that name: an orphan. */
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 &&
            lstat(full, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev)
            unlink(full);
        close(fd);
    }
    closedir(d);
}

/* Creates and locks PATH.tmp.XXXXXX; returns the descriptor or -1 (errno).
 * Not mkstemp: its mode is 0600, where a checkpoint should get the
 * umask's permissions like any file the program writes. */
static int create_temporary(const char *path, char *tmp, size_t cap)
{
    static const char ALNUM[] = "abcdefghijklmnopqrstuvwxyz"
                                "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^
                 (uint64_t)getpid() << 12 ^ (uint64_t)(uintptr_t)tmp;
    for (int attempt = 0; attempt < 100; attempt++) {
        char suffix[TMP_RAND + 1];
        for (int i = 0; i < TMP_RAND; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            suffix[i] = ALNUM[(x >> 33) % (sizeof ALNUM - 1)];
        }
        suffix[TMP_RAND] = 0;
        if (snprintf(tmp, cap, "%s%s%s", path, TMP_TAG, suffix) >= (int)cap) {
            errno = ENAMETOOLONG;
            return -1;
        }
        const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                            0666);
        if (fd < 0 && errno == EEXIST)
            continue;
        if (fd < 0)
            return -1;
        /* A cleaner may have taken it between open and lock: then it is
         * locked by the cleaner or already unlinked; take another name. */
        struct stat sb;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &sb) == 0 &&
            sb.st_nlink > 0)
            return fd;
        close(fd);
    }
    errno = EEXIST;
    return -1;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        const ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* path = the n bytes at p, all or nothing, even across a crash. */
static fg_status write_atomically(const char *path, const unsigned char *p,
                                  size_t n)
{
    /* Only a regular file is replaced: the rename below would put one in
     * place of a directory's name, or of a device, FIFO or socket (say
     * /dev/null, for root). */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return fg_error_at(FG_ERR_IO, "fg_checkpoint_save",
                           S_ISDIR(sb.st_mode)
                               ? "%s: is a directory"
                               : "%s: exists and is not a regular file",
                           path);
    remove_stale_temporaries(path);
    char tmp[4096 + 16];
    const int fd = create_temporary(path, tmp, sizeof tmp);
    if (fd < 0)
        return fg_error_at(FG_ERR_IO, "fg_checkpoint_save",
                           "cannot create a temporary file beside %s: %s",
                           path, strerror(errno));
    const char *step = "writing";
    int bad = write_all(fd, p, n) != 0;
    if (!bad && (step = "syncing", fsync(fd) != 0))
        bad = 1;
    /* Renamed while still locked, so no cleaner takes it first. */
    if (!bad && (step = "renaming it to", rename(tmp, path) != 0))
        bad = 1;
    const int err = errno;
    if (bad)
        unlink(tmp);
    close(fd);
    if (bad)
        return fg_error_at(FG_ERR_IO, "fg_checkpoint_save", "%s %s: %s",
                           step, step[0] == 'r' ? path : tmp,
                           strerror(err));
    /* The rename is durable once the directory is on disk too. */
    char dir[4096];
    const char *base;
    split_path(path, dir, sizeof dir, &base);
    const int dfd = open(dir[0] ? dir : ".", O_RDONLY | O_DIRECTORY |
                                                 O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL)) {
        const int e = errno;
        if (dfd >= 0)
            close(dfd);
        return fg_error_at(FG_ERR_IO, "fg_checkpoint_save",
                           "%s written, but syncing its directory failed: "
                           "%s", path, strerror(e));
    }
    close(dfd);
    return FG_OK;
}

fg_status fg_checkpoint_save(const char *path, const fg_gpt *m,
                             const fg_adamw *opt, const fg_train_state *st,
                             const char *meta)
{
    if (!path || !m || !st)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    if (!path[0])
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "empty path");
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    wbuf b = {0};
    put(&b, MAGIC, 8);
    put_u32(&b, FG_CHECKPOINT_VERSION);
    put_u32(&b, 0);
    put_u64(&b, 0); /* body length, patched below */
    put_config(&b, fg_gpt_get_config(m));
    put_u64(&b, (uint64_t)st->step);
    put_u64(&b, st->rng.seed);
    put_u64(&b, st->rng.offset);
    put_u64(&b, st->data_rng);
    put_f64(&b, st->best_val);
    const size_t ml = meta ? strlen(meta) : 0;
    put_u64(&b, ml);
    put(&b, meta ? meta : "", ml);
    put_u64(&b, opt ? 1 : 0);
    put_u64(&b, (uint64_t)fg_adamw_steps(opt));
    put_u64(&b, (uint64_t)(opt ? 3 * n : n));
    for (int i = 0; i < n; i++)
        put_tensor(&b, ps[i].name, "", ps[i].tensor);
    for (int i = 0; opt && i < n; i++) {
        fg_tensor *mt, *vt;
        fg_status s = fg_adamw_state(opt, i, &mt, &vt);
        if (s != FG_OK) {
            free(b.p);
            return s;
        }
        put_tensor(&b, ps[i].name, ".m", mt);
        put_tensor(&b, ps[i].name, ".v", vt);
    }
    if (b.oom) {
        free(b.p);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY,
                       "checkpoint buffer (out of memory, or a device "
                       "tensor could not be copied to the host)");
    }
    const uint64_t body = b.n - HEAD;
    for (int i = 0; i < 8; i++)
        b.p[16 + i] = (unsigned char)(body >> (8 * i));
    put_u64(&b, fnv1a(b.p, b.n));
    if (b.oom) {
        free(b.p);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "checkpoint buffer");
    }
    const fg_status s = write_atomically(path, b.p, b.n);
    free(b.p);
    return s;
}

/* ---- reading ---------------------------------------------------------------- */

typedef struct rbuf {
    const unsigned char *p;
    size_t n, at;
    int bad;
} rbuf;

static const void *take(rbuf *r, size_t n)
{
    if (r->bad || n > r->n - r->at) {
        r->bad = 1;
        return NULL;
    }
    const void *q = r->p + r->at;
    r->at += n;
    return q;
}
static uint64_t get_u64(rbuf *r)
{
    const unsigned char *x = take(r, 8);
    uint64_t v = 0;
    for (int i = 0; x && i < 8; i++)
        v |= (uint64_t)x[i] << (8 * i);
    return v;
}
static uint32_t get_u32(rbuf *r)
{
    const unsigned char *x = take(r, 4);
    uint32_t v = 0;
    for (int i = 0; x && i < 4; i++)
        v |= (uint32_t)x[i] << (8 * i);
    return v;
}
static double get_f64(rbuf *r)
{
    uint64_t v = get_u64(r);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

typedef struct ckpt {
    unsigned char *file;
    size_t size;
    fg_gpt_config cfg;
    fg_train_state st;
    const char *meta;
    size_t meta_len;
    int has_opt;
    int64_t opt_steps;
    uint64_t n_tensors;
    rbuf tensors; /* positioned at the first tensor */
} ckpt;

/* Reads and checks the file up to the tensor list. */
static fg_status ckpt_open(const char *fn, const char *path, ckpt *c)
{
    memset(c, 0, sizeof *c);
    /* Non-blocking: opening a FIFO with no writer would wait forever; the
     * type check below then refuses it. Reads of a regular file ignore
     * the flag. */
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fg_error_at(FG_ERR_IO, fn, "cannot open %s: %s", path,
                           strerror(errno));
    struct stat sb;
    const char *kind = NULL;
    if (fstat(fd, &sb) != 0)
        kind = strerror(errno);
    else if (S_ISDIR(sb.st_mode))
        kind = "is a directory, not a checkpoint";
    else if (!S_ISREG(sb.st_mode))
        kind = "not a regular file";
    if (kind) {
        close(fd);
        return fg_error_at(FG_ERR_IO, fn, "%s: %s", path, kind);
    }
    c->size = (size_t)sb.st_size;
    c->file = malloc(c->size ? c->size : 1);
    if (!c->file) {
        close(fd);
        return fg_error_at(FG_ERR_OUT_OF_MEMORY, fn, "%s: %zu bytes", path,
                           c->size);
    }
    size_t got = 0;
    int rerr = 0;
    while (got < c->size) {
        const ssize_t k = read(fd, c->file + got, c->size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            rerr = k < 0 ? errno : 0;
            break;
        }
        got += (size_t)k;
    }
    close(fd);
    if (rerr) {
        free(c->file);
        c->file = NULL;
        return fg_error_at(FG_ERR_IO, fn, "reading %s: %s", path,
                           strerror(rerr));
    }
    const char *why = NULL;
    rbuf r = {c->file, got, 0, 0};
    uint64_t body = 0;
    uint32_t ver = 0;
    if (got != c->size)
        why = "shorter than when it was opened (changed while reading)";
    else if (got < 8 || memcmp(c->file, MAGIC, 8) != 0)
        why = "not a flashgrad checkpoint (bad magic)";
    else if (got < HEAD + 8)
        why = "truncated (shorter than the header)";
    if (!why) {
        take(&r, 8);
        ver = get_u32(&r);
        get_u32(&r);
        body = get_u64(&r);
        if (ver != FG_CHECKPOINT_VERSION && ver != 1) {
            free(c->file);
            return fg_error_at(FG_ERR_IO, fn,
                               "%s: format version %u, this library reads "
                               "version %d", path, ver,
                               FG_CHECKPOINT_VERSION);
        }
        if (body > got - HEAD - 8)
            why = "truncated (file shorter than its recorded length)";
        else if (body < got - HEAD - 8)
            why = "trailing bytes after the checksum";
    }
    if (!why) {
        uint64_t want = 0;
        for (int i = 0; i < 8; i++)
            want |= (uint64_t)c->file[HEAD + body + i] << (8 * i);
        if (fnv1a(c->file, HEAD + body) != want)
            why = "checksum mismatch (the file is corrupted)";
    }
    if (why) {
        free(c->file);
        c->file = NULL;
        return fg_error_at(FG_ERR_IO, fn, "%s: %s", path, why);
    }
    r.n = HEAD + body;
    fg_gpt_config *g = &c->cfg;
    memset(g, 0, sizeof *g);
    g->vocab = (int64_t)get_u64(&r);
    g->ctx = (int64_t)get_u64(&r);
    g->n_layer = (int64_t)get_u64(&r);
    g->n_head = (int64_t)get_u64(&r);
    g->n_embd = (int64_t)get_u64(&r);
    g->dropout = get_f64(&r);
    g->tie_weights = (int)get_u64(&r);
    g->dtype = (fg_dtype)get_u64(&r);
    g->device = (fg_device)get_u64(&r);
    if (ver >= 2) { /* version 1 had no attention variants */
        g->attn_window = (int64_t)get_u64(&r);
        g->attn_softcap = get_f64(&r);
        g->alibi = (int)get_u64(&r);
    }
    c->st.step = (int64_t)get_u64(&r);
    c->st.rng.seed = get_u64(&r);
    c->st.rng.offset = get_u64(&r);
    c->st.data_rng = get_u64(&r);
    c->st.best_val = get_f64(&r);
    c->meta_len = (size_t)get_u64(&r);
    c->meta = take(&r, c->meta_len);
    c->has_opt = (int)get_u64(&r);
    c->opt_steps = (int64_t)get_u64(&r);
    c->n_tensors = get_u64(&r);
    if (r.bad) {
        free(c->file);
        c->file = NULL;
        return fg_error_at(FG_ERR_IO, fn, "%s: malformed header", path);
    }
    c->tensors = r;
    return FG_OK;
}

fg_status fg_checkpoint_peek(const char *path, fg_gpt_config *cfg,
                             fg_train_state *st, char *meta, size_t meta_cap)
{
    if (!path)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL path");
    ckpt c;
    FG_TRY(ckpt_open(__func__, path, &c));
    if (cfg)
        *cfg = c.cfg;
    if (st)
        *st = c.st;
    if (meta && meta_cap) {
        size_t k = c.meta_len < meta_cap - 1 ? c.meta_len : meta_cap - 1;
        memcpy(meta, c.meta, k);
        meta[k] = 0;
    }
    free(c.file);
    return FG_OK;
}

/* Checks the next tensor record against t (name, dtype, shape); returns
 * its bytes or NULL (message in *why). */
static const void *next_tensor(rbuf *r, const char *name, const char *suffix,
                               const fg_tensor *t, char *why, size_t wn)
{
    char want[64];
    snprintf(want, sizeof want, "%s%s", name, suffix);
    const unsigned char *l2 = take(r, 2);
    const size_t len = l2 ? (size_t)(l2[0] | l2[1] << 8) : 0;
    const char *nm = take(r, len);
    const uint32_t dt = get_u32(r), nd = get_u32(r);
    int64_t shape[FG_MAX_DIMS] = {0};
    for (uint32_t i = 0; i < nd && i < FG_MAX_DIMS; i++)
        shape[i] = (int64_t)get_u64(r);
    const uint64_t nb = get_u64(r);
    const void *data = take(r, (size_t)nb);
    if (r->bad || nd > FG_MAX_DIMS) {
        snprintf(why, wn, "malformed tensor record (expected %s)", want);
        return NULL;
    }
    int same = len == strlen(want) && memcmp(nm, want, len) == 0 &&
               dt == (uint32_t)fg_tensor_dtype(t) &&
               nd == (uint32_t)fg_tensor_ndim(t) &&
               nb == fg_tensor_nbytes(t);
    for (uint32_t i = 0; same && i < nd; i++)
        same = shape[i] == fg_tensor_shape(t)[i];
    if (!same) {
        snprintf(why, wn, "tensor %.*s does not match the model's %s",
                 (int)(len < 60 ? len : 60), nm ? nm : "", want);
        return NULL;
    }
    return data;
}

fg_status fg_checkpoint_load(const char *path, fg_gpt *m, fg_adamw *opt,
                             fg_train_state *st)
{
    if (!path || !m)
        return FG_FAIL(FG_ERR_INVALID_ARGUMENT, "NULL argument");
    ckpt c;
    FG_TRY(ckpt_open(__func__, path, &c));
    const fg_gpt_config *mc = fg_gpt_get_config(m);
    int n;
    const fg_param *ps = fg_gpt_params(m, &n);
    char why[200] = "";
    if (mc->vocab != c.cfg.vocab || mc->ctx != c.cfg.ctx ||
        mc->n_layer != c.cfg.n_layer || mc->n_head != c.cfg.n_head ||
        mc->n_embd != c.cfg.n_embd || mc->tie_weights != c.cfg.tie_weights ||
        mc->dtype != c.cfg.dtype || mc->attn_window != c.cfg.attn_window ||
        mc->attn_softcap != c.cfg.attn_softcap || mc->alibi != c.cfg.alibi)
        snprintf(why, sizeof why,
                 "model config differs from the checkpoint's (vocab %lld, "
                 "ctx %lld, %lld layers, %lld heads, width %lld, window "
                 "%lld, alibi %d, softcap %g)",
                 (long long)c.cfg.vocab, (long long)c.cfg.ctx,
                 (long long)c.cfg.n_layer, (long long)c.cfg.n_head,
                 (long long)c.cfg.n_embd, (long long)c.cfg.attn_window,
                 c.cfg.alibi, c.cfg.attn_softcap);
    else if (opt && !c.has_opt)
        snprintf(why, sizeof why, "no optimizer state in the checkpoint");
    else if (c.n_tensors != (uint64_t)(c.has_opt ? 3 * n : n))
        snprintf(why, sizeof why, "%llu tensors, expected %d",
                 (unsigned long long)c.n_tensors, c.has_opt ? 3 * n : n);
    const void **src = calloc((size_t)(3 * n), sizeof *src);
    if (!src) {
        free(c.file);
        return FG_FAIL(FG_ERR_OUT_OF_MEMORY, "checkpoint index");
    }
    /* Pass 1: check every record. */
    rbuf r = c.tensors;
    for (int i = 0; !why[0] && i < n; i++)
        src[i] = next_tensor(&r, ps[i].name, "", ps[i].tensor, why,
                             sizeof why);
    for (int i = 0; !why[0] && c.has_opt && i < n; i++) {
        fg_tensor *mt = ps[i].tensor, *vt = ps[i].tensor;
        if (opt && fg_adamw_state(opt, i, &mt, &vt) != FG_OK) {
            snprintf(why, sizeof why, "optimizer has fewer parameters");
            break;
        }
        src[n + 2 * i] = next_tensor(&r, ps[i].name, ".m", mt, why,
                                     sizeof why);
        if (!why[0])
            src[n + 2 * i + 1] = next_tensor(&r, ps[i].name, ".v", vt, why,
                                             sizeof why);
    }
    if (!why[0] && r.at != r.n)
        snprintf(why, sizeof why, "unexpected data after the tensors");
    if (why[0]) {
        free(src);
        free(c.file);
        return FG_FAIL(FG_ERR_IO, "%s: %s", path, why);
    }
    /* Pass 2: copy (only a device error can fail here). */
    fg_status ls = FG_OK;
    for (int i = 0; i < n && ls == FG_OK; i++)
        ls = load_tensor(ps[i].tensor, src[i]);
    if (opt) {
        for (int i = 0; i < n && ls == FG_OK; i++) {
            fg_tensor *mt, *vt;
            fg_adamw_state(opt, i, &mt, &vt);
            ls = load_tensor(mt, src[n + 2 * i]);
            if (ls == FG_OK)
                ls = load_tensor(vt, src[n + 2 * i + 1]);
        }
        if (ls == FG_OK)
            fg_adamw_set_steps(opt, c.opt_steps);
    }
    if (ls != FG_OK) {
        free(src);
        free(c.file);
        return ls;
    }
    if (st)
        *st = c.st;
    free(src);
    free(c.file);
    return FG_OK;
}
