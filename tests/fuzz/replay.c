/*
 * Runs a fuzz target on files without libFuzzer (make test has no clang):
 *   replay_<target> FILE_OR_DIR...
 * feeds each regular file (a directory: each file in it) to
 * LLVMFuzzerTestOneInput once. A target aborts on a broken promise, and
 * the sanitizer builds (make test-asan) catch memory errors, so a crash
 * input kept in tests/fuzz/regress/<target>/ fails make test until fixed.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t m;
    while (buf && (m = fread(buf + n, 1, cap - n, f)) > 0) {
        n += m;
        if (n == cap)
            buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf)
        return 1;
    /* An exact-size copy, so that a read past the input is a read past a
     * heap block (ASan sees it). */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0)
            continue; /* a target with no regressions yet has no folder */
        if (!S_ISDIR(sb.st_mode)) {
            bad |= run_file(argv[i]), files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            bad |= run_file(p), files++;
        }
        if (d)
            closedir(d);
    }
    printf("replayed %d input(s)\n", files);
    return bad;
}
