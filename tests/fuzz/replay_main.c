/* SPDX-License-Identifier: MIT */
/* tests/fuzz/replay_main.c - runs a fuzz target over its committed corpus
 * without libFuzzer, so every build's `make check` replays the seeds and
 * any crash input added to tests/fuzz/corpus/NAME (gcc builds included;
 * under ASan/UBSan in CI's sanitizer run). The corpus folder is compiled
 * in (FZ_CORPUS); arguments, if any, name files to run instead. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: out of memory reading %s\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, n); /* aborts on an oracle violation */
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int fails = 0, runs = 0;
    for (int i = 1; i < argc; i++, runs++)
        fails += run_file(argv[i]);
    if (argc > 1)
        return fails ? 1 : 0;
    DIR *d = opendir(FZ_CORPUS);
    if (!d) {
        fprintf(stderr, "replay: no corpus folder %s\n", FZ_CORPUS);
        return 1;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", FZ_CORPUS, e->d_name);
        fails += run_file(path);
        runs++;
    }
    closedir(d);
    printf("replayed %d inputs of %s\n", runs, FZ_CORPUS);
    return fails || runs == 0 ? 1 : 0;
}
