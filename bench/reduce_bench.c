/*
 * reduce_bench: memory bandwidth of the host reduction kernels.
 *
 * A kernel dst = a op b streams three buffers (3 x n x size bytes), so it
 * is judged against the simplest code that moves the same bytes: a float
 * loop c[i] = a[i] + b[i], compiled here with the library's own flags.
 * Two versions of that loop run (plain, which GCC 12 leaves scalar at -O2,
 * and the same in explicit SSE2 vectors); the faster one is the bound, so a
 * slow bound cannot flatter the kernels. memcpy is shown for scale only: it
 * moves two buffers, and glibc may use non-temporal stores for it.
 *
 * Fairness on a shared, noisy machine: each repetition of a kernel is
 * followed by one of the bound loop, on buffers of its own, and a row's
 * ratio divides the two best times, so both saw the same conditions.
 * Buffers are far larger than the caches and every page is touched before
 * timing. -o shifts all six buffers by the same number of bytes past a
 * 64-byte boundary, as a ring chunk at an arbitrary element offset is.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/reduce.h"

#define BENCH_DEFAULT_BYTES (64ull << 20)
#define BENCH_DEFAULT_ITERS 10
#define BENCH_GOAL_F32 0.9
#define BENCH_GOAL_HALF 0.8
#define BENCH_GOAL_INT_AVG 0.8 /* integer avg_finish */

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* noinline, so the compiler sees an opaque call, as it does for the
 * library's kernels; bench_keep keeps the stores alive. */
__attribute__((noinline)) static void bench_add_f32(float *c, const float *a, const float *b,
                                                    size_t n)
{
    for (size_t i = 0; i < n; i++)
        c[i] = a[i] + b[i];
}

typedef float bench_f32x4_t __attribute__((vector_size(16)));

__attribute__((noinline)) static void bench_add_f32_sse2(float *c, const float *a,
                                                         const float *b, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        bench_f32x4_t x, y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        x += y;
        memcpy(c + i, &x, sizeof x);
    }
    for (; i < n; i++)
        c[i] = a[i] + b[i];
}

/* Tells the compiler the buffer's contents are used. */
static void bench_keep(const void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

typedef enum bench_what {
    BENCH_ADD,       /* plain c = a + b loop */
    BENCH_ADD_SSE2,  /* the same in SSE2 vectors */
    BENCH_MEMCPY,
    BENCH_REDUCE,    /* hc_reduce(c, a, b) */
    BENCH_IN_PLACE,  /* hc_reduce(c, c, b) */
    BENCH_AVG_FINISH /* hc_reduce_avg_finish(c), on a fresh copy of a */
} bench_what_t;

typedef struct bench_ctx {
    unsigned char *a, *b, *c;    /* the kernels' operands */
    float *fa, *fb, *fc;         /* the bound loop's own */
    size_t bytes;
    int iters;
    bench_what_t bound;          /* the faster c = a + b loop */
} bench_ctx_t;

/* One timed run. */
static double bench_run(const bench_ctx_t *ctx, bench_what_t what, hcoll_dtype_t dt,
                        hcoll_op_t op)
{
    size_t nf = ctx->bytes / sizeof(float);
    size_t n = what >= BENCH_REDUCE ? ctx->bytes / hcoll_dtype_size(dt) : 0;

    /* Each finish divides fresh data, so values never drift into
     * subnormals (slow on some CPUs) over the repetitions. */
    if (what == BENCH_AVG_FINISH)
        memcpy(ctx->c, ctx->a, ctx->bytes);

    double t0 = bench_now();
    switch (what) {
    case BENCH_ADD:
        bench_add_f32(ctx->fc, ctx->fa, ctx->fb, nf);
        break;
    case BENCH_ADD_SSE2:
        bench_add_f32_sse2(ctx->fc, ctx->fa, ctx->fb, nf);
        break;
    case BENCH_MEMCPY:
        memcpy(ctx->fc, ctx->fa, ctx->bytes);
        break;
    case BENCH_REDUCE:
        hc_reduce(ctx->c, ctx->a, ctx->b, n, dt, op);
        break;
    case BENCH_IN_PLACE:
        hc_reduce(ctx->c, ctx->c, ctx->b, n, dt, op);
        break;
    case BENCH_AVG_FINISH:
        hc_reduce_avg_finish(ctx->c, n, dt, HCOLL_AVG, 2);
        break;
    }
    bench_keep(ctx->c);
    bench_keep(ctx->fc);
    return bench_now() - t0;
}

/* Best times of `what` and of `against`, run alternately; one warm-up of
 * each first. */
static void bench_pair(const bench_ctx_t *ctx, bench_what_t what, bench_what_t against,
                       hcoll_dtype_t dt, hcoll_op_t op, double *t_what, double *t_against)
{
    double best = 1e30, best_b = 1e30;

    for (int it = 0; it <= ctx->iters; it++) {
        double t = bench_run(ctx, what, dt, op);
        double tb = bench_run(ctx, against, dt, op);
        if (it == 0)
            continue;
        best = t < best ? t : best;
        best_b = tb < best_b ? tb : best_b;
    }
    *t_what = best;
    *t_against = best_b;
}

/* Ordinary values near 1: products stay normal, max/min do real work. */
static void bench_fill(const bench_ctx_t *ctx, hcoll_dtype_t dt)
{
    size_t sz = hcoll_dtype_size(dt), n = ctx->bytes / sz;

    for (size_t i = 0; i < n; i++) {
        double va = 1.0 + (double)(i % 7) * 0.125, vb = 1.0 - (double)(i % 5) * 0.0625;
        unsigned char *pa = ctx->a + i * sz, *pb = ctx->b + i * sz;
        switch (dt) {
        case HCOLL_FLOAT32: {
            float x = (float)va, y = (float)vb;
            memcpy(pa, &x, 4);
            memcpy(pb, &y, 4);
            break;
        }
        case HCOLL_FLOAT64:
            memcpy(pa, &va, 8);
            memcpy(pb, &vb, 8);
            break;
        case HCOLL_FLOAT16:
        case HCOLL_BFLOAT16: {
            uint16_t x, y;
            if (dt == HCOLL_FLOAT16) {
                x = hc_float_to_half((float)va);
                y = hc_float_to_half((float)vb);
            } else {
                x = hc_float_to_bf16((float)va);
                y = hc_float_to_bf16((float)vb);
            }
            memcpy(pa, &x, 2);
            memcpy(pb, &y, 2);
            break;
        }
        default: {
            uint64_t x = i * 7 + 3, y = i * 13 + 1;
            memcpy(pa, &x, sz);
            memcpy(pb, &y, sz);
            break;
        }
        }
    }
    memset(ctx->c, 0, ctx->bytes);
}

static void bench_usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [-s BYTES] [-i ITERS] [-o OFFSET]\n"
            "  -s BYTES  bytes per operand buffer, suffix k/m/g allowed (default 64m)\n"
            "  -i ITERS  timed repetitions per kernel, best one reported (default %d)\n"
            "  -o OFFSET every buffer starts OFFSET bytes past a 64-byte boundary\n"
            "            (0, 8, ..., 56; default 0)\n"
            "Measures each host reduction kernel (dst = a op b) in GB/s, counting\n"
            "3 x n x size bytes, against a c[i] = a[i] + b[i] float loop run\n"
            "alternately with it.\n",
            argv0, BENCH_DEFAULT_ITERS);
}

/* A byte count with an optional binary suffix; 0 on a malformed value. */
static unsigned long long bench_parse_bytes(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;

    if (errno || end == s || s[0] == '-')
        return 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end != '\0' || v > (~0ull >> shift))
        return 0;
    return v << shift;
}

static int bench_parse_args(int argc, char **argv, unsigned long long *bytes_out,
                            int *iters_out, size_t *off_out)
{
    unsigned long long bytes = BENCH_DEFAULT_BYTES;
    long iters = BENCH_DEFAULT_ITERS;
    int opt;

    while ((opt = getopt(argc, argv, "s:i:o:h")) != -1) {
        switch (opt) {
        case 'o': {
            char *end;
            errno = 0;
            long off = strtol(optarg, &end, 10);
            /* Whole elements of every type, as ring offsets are. */
            if (errno || end == optarg || *end != '\0' || off < 0 || off > 56 || off % 8) {
                fprintf(stderr, "%s: -o: need 0, 8, ..., 56, got '%s'\n", argv[0], optarg);
                return 2;
            }
            *off_out = (size_t)off;
            break;
        }
        case 's':
            bytes = bench_parse_bytes(optarg);
            if (bytes < 64 || bytes > (1ull << 40)) {
                fprintf(stderr, "%s: -s: need a size from 64 bytes to 1 TiB, got '%s'\n",
                        argv[0], optarg);
                return 2;
            }
            break;
        case 'i': {
            char *end;
            errno = 0;
            iters = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end != '\0' || iters < 1 || iters > 100000) {
                fprintf(stderr, "%s: -i: need a count from 1 to 100000, got '%s'\n", argv[0],
                        optarg);
                return 2;
            }
            break;
        }
        case 'h':
            return 1;
        default:
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
        return 2;
    }
    *bytes_out = bytes & ~63ull; /* whole elements of every type */
    *iters_out = (int)iters;
    return 0;
}

static void bench_row(const char *name, double gbs, double ratio)
{
    printf("%-26s %8.2f %8.2f\n", name, gbs, ratio);
}

int main(int argc, char **argv)
{
    static const hcoll_dtype_t dtypes[] = {
        HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16, HCOLL_FLOAT64,
        HCOLL_INT8,    HCOLL_UINT8,   HCOLL_INT32,    HCOLL_INT64,
    };
    static const hcoll_op_t ops[] = { HCOLL_SUM, HCOLL_PROD, HCOLL_MAX, HCOLL_MIN, HCOLL_AVG };
    unsigned long long bytes;
    int iters;
    size_t off = 0;

    switch (bench_parse_args(argc, argv, &bytes, &iters, &off)) {
    case 0:
        break;
    case 1:
        bench_usage(stdout, argv[0]);
        return 0;
    default:
        bench_usage(stderr, argv[0]);
        return 2;
    }

    bench_ctx_t ctx = { .bytes = (size_t)bytes, .iters = iters };
    void *p[6] = { NULL };
    for (int k = 0; k < 6; k++) {
        if (posix_memalign(&p[k], 64, ctx.bytes + 64)) {
            fprintf(stderr, "%s: cannot allocate 6 x %zu bytes\n", argv[0], ctx.bytes);
            for (int j = 0; j < k; j++)
                free(p[j]);
            return 1;
        }
    }
    ctx.a = (unsigned char *)p[0] + off;
    ctx.b = (unsigned char *)p[1] + off;
    ctx.c = (unsigned char *)p[2] + off;
    ctx.fa = (float *)((char *)p[3] + off);
    ctx.fb = (float *)((char *)p[4] + off);
    ctx.fc = (float *)((char *)p[5] + off);
    /* Touch every page of all six buffers before any timing. */
    size_t nf = ctx.bytes / sizeof(float);
    for (size_t i = 0; i < nf; i++) {
        ctx.fa[i] = 1.0f + (float)(i % 7) * 0.125f;
        ctx.fb[i] = 1.0f - (float)(i % 5) * 0.0625f;
    }
    memset(ctx.fc, 0, ctx.bytes);
    bench_fill(&ctx, HCOLL_FLOAT32);

    const double traffic3 = 3.0 * (double)ctx.bytes;
    const double traffic2 = 2.0 * (double)ctx.bytes;
    double t_plain, t_sse2, t_cpy, t_b;

    printf("reduce_bench: impl %s, %.1f MiB per operand at offset %zu, best of %d\n",
           hc_reduce_impl_name(), (double)ctx.bytes / (1 << 20), off, ctx.iters);

    bench_pair(&ctx, BENCH_ADD, BENCH_ADD_SSE2, HCOLL_FLOAT32, HCOLL_SUM, &t_plain, &t_sse2);
    ctx.bound = t_plain <= t_sse2 ? BENCH_ADD : BENCH_ADD_SSE2;
    double t_bound0 = t_plain <= t_sse2 ? t_plain : t_sse2;
    bench_pair(&ctx, BENCH_MEMCPY, ctx.bound, HCOLL_FLOAT32, HCOLL_SUM, &t_cpy, &t_b);

    printf("%-26s %8s %8s\n", "kernel", "GB/s", "x bound");
    bench_row("c=a+b float loop", traffic3 / t_plain / 1e9, t_bound0 / t_plain);
    bench_row("c=a+b float loop, SSE2", traffic3 / t_sse2 / 1e9, t_bound0 / t_sse2);
    bench_row("memcpy (2 x bytes)", traffic2 / t_cpy / 1e9, (traffic2 / t_cpy) / (traffic3 / t_b));

    double ratio_sum[HCOLL_DTYPE_COUNT_] = { 0 };
    double worst_int_avg = 1e30;
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
        hcoll_dtype_t dt = dtypes[t];
        char name[64];
        double tk;

        bench_fill(&ctx, dt);
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            bench_pair(&ctx, BENCH_REDUCE, ctx.bound, dt, ops[o], &tk, &t_b);
            snprintf(name, sizeof name, "%s %s", hcoll_dtype_name(dt), hcoll_op_name(ops[o]));
            bench_row(name, traffic3 / tk / 1e9, t_b / tk);
            if (ops[o] == HCOLL_SUM)
                ratio_sum[dt] = t_b / tk;
        }
        if (dt == HCOLL_FLOAT32) {
            bench_pair(&ctx, BENCH_IN_PLACE, ctx.bound, dt, HCOLL_SUM, &tk, &t_b);
            bench_row("float32 sum, dst == a", traffic3 / tk / 1e9, t_b / tk);
        }
        /* The finish reads and writes one buffer: 2 x n x size bytes. */
        bench_pair(&ctx, BENCH_AVG_FINISH, ctx.bound, dt, HCOLL_AVG, &tk, &t_b);
        snprintf(name, sizeof name, "%s avg_finish", hcoll_dtype_name(dt));
        double r_fin = (traffic2 / tk) / (traffic3 / t_b);
        bench_row(name, traffic2 / tk / 1e9, r_fin);
        if (!hc_dtype_is_float(dt) && r_fin < worst_int_avg)
            worst_int_avg = r_fin;
    }

    double r32 = ratio_sum[HCOLL_FLOAT32], r16 = ratio_sum[HCOLL_FLOAT16];
    double rbf = ratio_sum[HCOLL_BFLOAT16];
    printf("bound: %s (the faster c=a+b loop), run alternately with each row\n",
           ctx.bound == BENCH_ADD ? "plain loop" : "SSE2 loop");
    printf("goal: fp32 sum >= %.1fx bound: %.2f %s\n", BENCH_GOAL_F32, r32,
           r32 >= BENCH_GOAL_F32 ? "PASS" : "MISS");
    printf("goal: bf16/fp16 sum >= %.1fx bound: bf16 %.2f, fp16 %.2f %s\n", BENCH_GOAL_HALF,
           rbf, r16, rbf >= BENCH_GOAL_HALF && r16 >= BENCH_GOAL_HALF ? "PASS" : "MISS");
    printf("goal: integer avg_finish >= %.1fx bound: worst %.2f %s\n", BENCH_GOAL_INT_AVG,
           worst_int_avg, worst_int_avg >= BENCH_GOAL_INT_AVG ? "PASS" : "MISS");

    for (int k = 0; k < 6; k++)
        free(p[k]);
    return 0;
}
