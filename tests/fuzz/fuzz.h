/*
 * Shared by the libFuzzer targets (tests/fuzz/fuzz_*.c). Each target defines
 * LLVMFuzzerTestOneInput and nothing else; `make fuzz` links it with
 * -fsanitize=fuzzer, and the regression replay (replay.c, in make test)
 * links the same file with a main that feeds it every file of its corpus
 * and of tests/fuzz/regress/<target>/, without clang.
 *
 * A target aborts (FUZZ_CHECK) when a parser breaks a promise of its
 * header that memory checks alone would not catch: an accepted value that
 * does not round-trip, a message past its buffer.
 */
#ifndef HC_FUZZ_H
#define HC_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed\n", __FILE__,       \
                    __LINE__, #cond);                                         \
            abort();                                                          \
        }                                                                     \
    } while (0)

/* The library logs every rejected input at WARN: quiet, for speed. */
__attribute__((constructor)) static void fuzz_quiet(void)
{
    setenv("HCOLL_DEBUG", "NONE", 0);
}

/* FUZZ_VERBOSE=1: targets say what an input did (for writing seeds). */
#define FUZZ_SAY(...)                                                         \
    do {                                                                      \
        if (getenv("FUZZ_VERBOSE"))                                           \
            fprintf(stderr, __VA_ARGS__);                                     \
    } while (0)

/* data as a NUL-terminated string (cut at the first NUL); free() it. */
static inline char *fuzz_str(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* An error text must be a terminated string that fits its buffer. */
static inline void fuzz_check_err(const char *err, size_t errlen)
{
    FUZZ_CHECK(memchr(err, '\0', errlen) != NULL);
}

#endif
