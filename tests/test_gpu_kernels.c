/*
 * GPU reduction kernels against the host kernels (base/reduce.h) on the
 * same inputs: every dtype x op, sizes from 1 element to 256 MiB, aligned
 * and misaligned, in place and not, with NaN, infinities, signed zeros,
 * subnormals and overflowing values among the floats. Results must be bit
 * for bit equal, except that a NaN only has to be a NaN (the GPU returns
 * the canonical NaN, the host the first operand's payload). Then the AVG
 * division, and the kernel's bandwidth against the device-to-device copy
 * bandwidth measured in the same run (goal: >= 0.85x, counting 3 bytes
 * moved per output byte for the kernel, 2 for the copy).
 *
 * Needs a GPU; prints "SKIP: no GPU: <why>" and exits 77 otherwise.
 * Runs without Check's fork (CUDA does not survive fork).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/reduce.h"
#include "common/ranks.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"

static const hc_cu_api_t *cu;
static hc_gdr_kern_t *kern;
/* On the emulated driver (tests/mock/cuda.c) the "GPU" is the host's two
 * cores: the largest sizes shrink and the bandwidth is printed, not
 * judged. */
static const char *mock;

static const hcoll_dtype_t dtypes[] = {
    HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16, HCOLL_FLOAT64,
    HCOLL_INT8,    HCOLL_UINT8,   HCOLL_INT32,    HCOLL_INT64,
};
static const hcoll_op_t ops[] = { HCOLL_SUM, HCOLL_PROD, HCOLL_MAX, HCOLL_MIN, HCOLL_AVG };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Mostly ordinary values of a few magnitudes, 1 in 64 a special one. */
static void fill(void *p, size_t n, hcoll_dtype_t dt)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        double v = ((double)(r >> 11) / (double)(1ull << 53) - 0.5) * 8.0;
        int special = (r & 63) == 0;
        int which = (int)((r >> 6) & 7);
        static const double specials[8] = { NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e-40, 7e4, 1e-7 };
        if (special)
            v = specials[which];
        switch (dt) {
        case HCOLL_FLOAT32: ((float *)p)[i] = (float)v; break;
        case HCOLL_FLOAT64: ((double *)p)[i] = v; break;
        case HCOLL_FLOAT16: ((uint16_t *)p)[i] = hc_float_to_half((float)v); break;
        case HCOLL_BFLOAT16: ((uint16_t *)p)[i] = hc_float_to_bf16((float)v); break;
        case HCOLL_INT8:
        case HCOLL_UINT8: ((uint8_t *)p)[i] = (uint8_t)r; break;
        case HCOLL_INT32: ((uint32_t *)p)[i] = (uint32_t)(r >> 17); break;
        case HCOLL_INT64: ((uint64_t *)p)[i] = r * 0x2545F4914F6CDD1Dull; break;
        default: break;
        }
    }
}

static int is_nan(const void *p, size_t i, hcoll_dtype_t dt)
{
    switch (dt) {
    case HCOLL_FLOAT32: return isnan(((const float *)p)[i]);
    case HCOLL_FLOAT64: return isnan(((const double *)p)[i]);
    case HCOLL_FLOAT16: return (((const uint16_t *)p)[i] & 0x7fff) > 0x7c00;
    case HCOLL_BFLOAT16: return (((const uint16_t *)p)[i] & 0x7fff) > 0x7f80;
    default: return 0;
    }
}

/* Index of the first difference, or -1. */
static long compare(const void *gpu, const void *host, size_t n, hcoll_dtype_t dt)
{
    size_t es = hcoll_dtype_size(dt);
    if (memcmp(gpu, host, n * es) == 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)gpu + i * es, (const char *)host + i * es, es) != 0 &&
            !(is_nan(gpu, i, dt) && is_nan(host, i, dt)))
            return (long)i;
    return -1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One case: returns a message on failure, NULL when equal. */
static const char *run_case(hcoll_dtype_t dt, hcoll_op_t op, size_t n, size_t mis, int inplace,
                            char *msg, size_t msglen)
{
    size_t es = hcoll_dtype_size(dt), bytes = (n + mis) * es;
    unsigned char *a = malloc(bytes), *b = malloc(bytes), *ref = malloc(bytes),
                  *got = malloc(bytes);
    hc_cu_dptr_t da = 0, db = 0, dd = 0;
    const char *fail = NULL;
    if (!a || !b || !ref || !got) {
        fail = "out of host memory";
        goto out;
    }
    fill(a, n + mis, dt);
    fill(b, n + mis, dt);
    if (cu->mem_alloc(&da, bytes) || cu->mem_alloc(&db, bytes) ||
        (!inplace && cu->mem_alloc(&dd, bytes))) {
        fail = "cuMemAlloc failed";
        goto out;
    }
    cu->memcpy_htod_async(da, a, bytes, NULL);
    cu->memcpy_htod_async(db, b, bytes, NULL);
    hc_cu_dptr_t dst = inplace ? da : dd;
    hc_cu_res_t r = hc_gdr_kern_reduce(kern, dst + mis * es, da + mis * es, db + mis * es, n, dt,
                                       op, NULL);
    if (r != HC_CU_SUCCESS || cu->stream_synchronize(NULL) != HC_CU_SUCCESS) {
        snprintf(msg, msglen, "launch failed (CUresult %d)", r);
        fail = msg;
        goto out;
    }
    cu->memcpy_dtoh_async(got, dst, bytes, NULL);
    cu->stream_synchronize(NULL);
    hc_reduce(ref + mis * es, a + mis * es, b + mis * es, n, dt, op);
    long i = compare(got + mis * es, ref + mis * es, n, dt);
    if (i >= 0) {
        uint64_t g = 0, h = 0, x = 0, y = 0;
        memcpy(&g, got + (mis + (size_t)i) * es, es);
        memcpy(&h, ref + (mis + (size_t)i) * es, es);
        memcpy(&x, a + (mis + (size_t)i) * es, es);
        memcpy(&y, b + (mis + (size_t)i) * es, es);
        snprintf(msg, msglen,
                 "%s %s n=%zu offset=%zu%s: element %ld: gpu 0x%llx host 0x%llx (inputs 0x%llx "
                 "0x%llx)",
                 hcoll_dtype_name(dt), hcoll_op_name(op), n, mis, inplace ? " in place" : "", i,
                 (unsigned long long)g, (unsigned long long)h, (unsigned long long)x,
                 (unsigned long long)y);
        fail = msg;
    }
out:
    if (da)
        cu->mem_free(da);
    if (db)
        cu->mem_free(db);
    if (dd)
        cu->mem_free(dd);
    free(a);
    free(b);
    free(ref);
    free(got);
    return fail;
}

START_TEST(every_dtype_and_op)
{
    static const size_t sizes[] = { 1, 3, 17, 1000, 65541, 4194307 };
    char msg[400];
    int cases = 0;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
                for (size_t mis = 0; mis < 2; mis++) {
                    const char *f = run_case(dtypes[d], ops[o], sizes[s], mis, (int)(s & 1),
                                             msg, sizeof msg);
                    ck_assert_msg(f == NULL, "%s", f);
                    cases++;
                }
    printf("kernels: %d cases equal to the host kernels\n", cases);
}
END_TEST

START_TEST(large_256mib)
{
    char msg[400];
    /* 256 MiB per buffer (32 MiB on the emulated driver). */
    const size_t big = mock ? 32u << 20 : 256u << 20;
    ck_assert_msg(!run_case(HCOLL_FLOAT32, HCOLL_SUM, big / 4, 0, 0, msg, sizeof msg), "%s", msg);
    ck_assert_msg(!run_case(HCOLL_BFLOAT16, HCOLL_MAX, big / 2, 0, 1, msg, sizeof msg), "%s", msg);
    ck_assert_msg(!run_case(HCOLL_FLOAT16, HCOLL_SUM, big / 2 - 3, 1, 0, msg, sizeof msg), "%s",
                  msg);
}
END_TEST

START_TEST(avg_division)
{
    static const int nranks[] = { 1, 3, 8, 24 };
    static const size_t n = 100003;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (size_t k = 0; k < sizeof nranks / sizeof nranks[0]; k++) {
            hcoll_dtype_t dt = dtypes[d];
            size_t bytes = n * hcoll_dtype_size(dt);
            unsigned char *h = malloc(bytes), *got = malloc(bytes);
            fill(h, n, dt);
            hc_cu_dptr_t p;
            ck_assert_int_eq(cu->mem_alloc(&p, bytes), 0);
            cu->memcpy_htod_async(p, h, bytes, NULL);
            ck_assert_int_eq(hc_gdr_kern_avg(kern, p, n, dt, nranks[k], NULL), 0);
            cu->memcpy_dtoh_async(got, p, bytes, NULL);
            ck_assert_int_eq(cu->stream_synchronize(NULL), 0);
            hc_reduce_avg_finish(h, n, dt, HCOLL_AVG, nranks[k]);
            long i = compare(got, h, n, dt);
            ck_assert_msg(i < 0, "avg %s / %d: element %ld differs", hcoll_dtype_name(dt),
                          nranks[k], i);
            cu->mem_free(p);
            free(h);
            free(got);
        }
}
END_TEST

/* The scaling kernel (PREMUL_SUM, AVG's 1/n without NCCL) against
 * hc_reduce_scale: a scalar passed by value, and one element of the dtype
 * read from device memory (widened as hc_scalar_load does), out of place
 * and in place. */
START_TEST(scale)
{
    static const size_t n = 100003;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (int from_dev = 0; from_dev < 2; from_dev++) {
            hcoll_dtype_t dt = dtypes[d];
            size_t bytes = n * hcoll_dtype_size(dt);
            unsigned char *h = malloc(bytes), *got = malloc(bytes), k[8];
            fill(h, n, dt);
            fill(k, 1, dt); /* a random scalar of the dtype */
            hc_scalar_t s = hc_scalar_load(k, dt);
            if (!from_dev && hc_dtype_is_float(dt) && dt != HCOLL_FLOAT64)
                s.f32 = 1.0f / 3.0f; /* AVG's: not a value of the half types */
            uint64_t kbits = 0;
            memcpy(&kbits, &s, sizeof s);
            hc_cu_dptr_t src, dst, kp;
            ck_assert_int_eq(cu->mem_alloc(&src, bytes), 0);
            ck_assert_int_eq(cu->mem_alloc(&dst, bytes), 0);
            ck_assert_int_eq(cu->mem_alloc(&kp, 8), 0);
            cu->memcpy_htod_async(src, h, bytes, NULL);
            cu->memcpy_htod_async(kp, k, 8, NULL);
            hc_cu_dptr_t out = from_dev ? src : dst; /* in place with a device scalar */
            ck_assert_int_eq(hc_gdr_kern_scale(kern, out, src, n, dt, from_dev ? kp : 0, kbits,
                                               NULL),
                             0);
            cu->memcpy_dtoh_async(got, out, bytes, NULL);
            ck_assert_int_eq(cu->stream_synchronize(NULL), 0);
            hc_reduce_scale(h, h, n, dt, s);
            long i = compare(got, h, n, dt);
            ck_assert_msg(i < 0, "scale %s (%s scalar): element %ld differs", hcoll_dtype_name(dt),
                          from_dev ? "device" : "host", i);
            cu->mem_free(src);
            cu->mem_free(dst);
            cu->mem_free(kp);
            free(h);
            free(got);
        }
}
END_TEST

START_TEST(bandwidth)
{
    const size_t bytes = mock ? 16u << 20 : 256u << 20;
    const int iters = mock ? 3 : 50;
    hc_cu_dptr_t a, b, d;
    ck_assert_int_eq(cu->mem_alloc(&a, bytes), 0);
    ck_assert_int_eq(cu->mem_alloc(&b, bytes), 0);
    ck_assert_int_eq(cu->mem_alloc(&d, bytes), 0);
    cu->memset_d32(a, 0x3f800000u, bytes / 4);
    cu->memset_d32(b, 0x3f800000u, bytes / 4);

    for (int i = 0; i < 3; i++)
        cu->memcpy_dtod_async(d, a, bytes, NULL);
    cu->stream_synchronize(NULL);
    double t = now_s();
    for (int i = 0; i < iters; i++)
        cu->memcpy_dtod_async(d, a, bytes, NULL);
    cu->stream_synchronize(NULL);
    double copy_gbs = 2.0 * bytes * iters / (now_s() - t) / 1e9;

    static const hcoll_dtype_t bench_dt[] = { HCOLL_FLOAT32, HCOLL_BFLOAT16, HCOLL_FLOAT16 };
    int below = 0;
    for (size_t k = 0; k < sizeof bench_dt / sizeof bench_dt[0]; k++) {
        hcoll_dtype_t dt = bench_dt[k];
        size_t n = bytes / hcoll_dtype_size(dt);
        for (int i = 0; i < 3; i++)
            hc_gdr_kern_reduce(kern, d, a, b, n, dt, HCOLL_SUM, NULL);
        cu->stream_synchronize(NULL);
        t = now_s();
        for (int i = 0; i < iters; i++)
            hc_gdr_kern_reduce(kern, d, a, b, n, dt, HCOLL_SUM, NULL);
        ck_assert_int_eq(cu->stream_synchronize(NULL), 0);
        double k_gbs = 3.0 * bytes * iters / (now_s() - t) / 1e9;
        printf("BENCH kernel %-8s sum %zuMiB: %7.1f GB/s  d2d copy %7.1f GB/s  ratio %.2f%s\n",
               hcoll_dtype_name(dt), bytes >> 20, k_gbs, copy_gbs, k_gbs / copy_gbs,
               mock                     ? "  (mock driver, meaningless)"
               : k_gbs / copy_gbs >= 0.85 ? ""
                                          : "  (below the 0.85 goal)");
        below += !mock && k_gbs / copy_gbs < 0.85;
    }
    fflush(stdout);
    cu->mem_free(a);
    cu->mem_free(b);
    cu->mem_free(d);
    ck_assert_msg(below == 0, "%d kernels below 0.85x of the copy bandwidth", below);
}
END_TEST

int main(void)
{
    char why[256];
    if (gpu_probe(why, sizeof why) < 1)
        HCT_SKIP_ALL("no GPU: %s", why);
    if (!HCOLL_BUILD_KERNELS)
        HCT_SKIP_ALL("this build has no GPU kernels (nvcc was not found at build time)");
    cu = gpu_open(0);
    if (!cu)
        return 1;
    mock = gpu_mock_driver();
    if (mock)
        printf("note: running on the emulated CUDA driver (%s): sizes capped, bandwidth not "
               "judged\n",
               mock);
    if (hc_gdr_kern_load(&kern, why, sizeof why) != HCOLL_SUCCESS) {
        fprintf(stderr, "FAIL: kernels do not load: %s\n", why);
        return 1;
    }
    Suite *s = suite_create("gpu_kernels");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, every_dtype_and_op);
    tcase_add_test(tc, large_256mib);
    tcase_add_test(tc, avg_division);
    tcase_add_test(tc, scale);
    tcase_add_test(tc, bandwidth);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    hc_gdr_kern_unload(kern);
    return failed ? 1 : 0;
}
