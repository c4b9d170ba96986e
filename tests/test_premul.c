/*
 * AVG of floating types (each input pre-multiplied by 1/n, then summed) and
 * PREMUL_SUM ops (hcoll_op_create_premul_sum), end to end through forked
 * ranks in emulated nodes, on every host plan:
 *
 *   1x1 single   1x4 intra   4x1 ring   2x2 three stages   nodes 2,2,1 flat
 *
 * Bit-exact references computed here, with the documented arithmetic
 * (hcoll.h): elements alternate between
 *   solo   one rank (i/2 mod n) holds an arbitrary value, the others 0:
 *          the result is that rank's rounded product, so the product's
 *          rounding (and that it is applied exactly once) is checked bit
 *          for bit on full mantissas;
 *   mixed  every rank holds a value whose product is exact (multiples of n
 *          for AVG, dyadic scalars for PREMUL_SUM), so the sums are exact
 *          in any order (with arbitrary scalars every element is solo).
 * Integers (PREMUL_SUM) wrap, exact in any order: every element is mixed.
 * Then fp16 AVG of 20000 on 4 ranks (the sum, 80000, is past fp16's 65504),
 * a PREMUL_SUM destroyed while its request is queued, and argument errors.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/elems.h"
#include "common/ranks.h"

#define MAX_RANKS 8
#define TIMEOUT_MS 20000

static uint64_t mix(uint64_t h)
{
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h ^= h >> 32;
    return h;
}

/* ------------------------------------------------------------------------ */
/* Cases and the reference                                                    */
/* ------------------------------------------------------------------------ */

/* A case: AVG (premul 0) or a PREMUL_SUM whose scalar on rank r is
 * scalar_of(kind, r). kind 0: dyadic ((r + 1) / 4, or r + 2 for integers),
 * kind 1: arbitrary (0.1 (r + 1) rounded to the dtype; 7 r - 3 for ints). */
typedef struct pm_case {
    hcoll_dtype_t dtype;
    int premul;     /* 0: HCOLL_AVG */
    int kind;
    size_t count;
    int inplace;
} pm_case_t;

/* Rank r's scalar as a double holding the value the library sees (the
 * scalar is one element of dtype). */
static double scalar_of(hcoll_dtype_t dt, int kind, int r)
{
    if (!is_float(dt))
        return kind ? 7.0 * r - 3.0 : r + 2.0;
    double v = kind ? 0.1 * (r + 1) : (r + 1) / 4.0;
    unsigned char t[8];
    put(dt, t, 0, v);
    return get(dt, t, 0);
}

/* The multiplier of case c on rank r in the precision the library uses. */
static double mult_of(const pm_case_t *c, int n, int r)
{
    if (!c->premul)
        return c->dtype == HCOLL_FLOAT64 ? 1.0 / n : (double)(1.0f / (float)n);
    return scalar_of(c->dtype, c->kind, r);
}

/* Rank r's input element i. */
static double input(const pm_case_t *c, int n, int r, size_t i)
{
    uint64_t h = mix((uint64_t)i * 1000003u + (uint64_t)r * 7919u + (uint64_t)c->dtype * 31u);
    if (!is_float(c->dtype))
        return (double)(int64_t)(h % 2001) - 1000.0;
    if (i % 2 == 0 || (c->premul && c->kind)) { /* solo (arbitrary scalars: always) */
        if ((int)((i / 2) % (size_t)n) != r)
            return 0.0;
        double v = ((double)(h >> 11) / 9007199254740992.0 - 0.5) * 64.0;
        return v == 0.0 ? 1.0 : v;
    }
    double k = (double)(h % 7) - 3.0;
    return c->premul ? k : k * n; /* dyadic scalars / multiples of n: exact products */
}

/* One product, rounded as the library rounds it: x as stored in dtype,
 * times s. */
static double product(hcoll_dtype_t dt, double x, double s)
{
    unsigned char t[8];
    put(dt, t, 0, x);
    x = get(dt, t, 0);
    switch (dt) {
    case HCOLL_FLOAT64: return x * s;
    case HCOLL_FLOAT32: return (float)x * (float)s;
    case HCOLL_FLOAT16: return h2f(f2h((float)x * (float)s));
    default: return bf2f(f2bf((float)x * (float)s));
    }
}

static void fill(const pm_case_t *c, int n, int r, void *buf)
{
    for (size_t i = 0; i < c->count; i++) {
        double v = input(c, n, r, i);
        unsigned char *p = (unsigned char *)buf + i * hcoll_dtype_size(c->dtype);
        if (is_float(c->dtype)) {
            put(c->dtype, buf, i, v);
            continue;
        }
        int64_t x = (int64_t)v;
        switch (c->dtype) {
        case HCOLL_INT8: case HCOLL_UINT8: { uint8_t y = (uint8_t)x; memcpy(p, &y, 1); break; }
        case HCOLL_INT32: { uint32_t y = (uint32_t)x; memcpy(p, &y, 4); break; }
        default: memcpy(p, &x, 8); break;
        }
    }
}

/* 0 when recv holds the reference; else prints the first difference. */
static int check(const char *shape, int rank, int n, const pm_case_t *c, const void *recv)
{
    const size_t es = hcoll_dtype_size(c->dtype);
    for (size_t i = 0; i < c->count; i++) {
        unsigned char want[8] = { 0 };
        if (is_float(c->dtype)) {
            double acc = 0;
            for (int r = 0; r < n; r++) /* exact: one non-zero term, or exact terms */
                acc += product(c->dtype, input(c, n, r, i), mult_of(c, n, r));
            put(c->dtype, want, 0, acc);
        } else {
            uint64_t acc = 0;
            for (int r = 0; r < n; r++)
                acc += (uint64_t)(int64_t)input(c, n, r, i) *
                       (uint64_t)(int64_t)scalar_of(c->dtype, c->kind, r);
            memcpy(want, &acc, es); /* little-endian: the low bytes */
        }
        const unsigned char *got = (const unsigned char *)recv + i * es;
        if (memcmp(got, want, es) != 0) {
            uint64_t g = 0, w = 0;
            memcpy(&g, got, es);
            memcpy(&w, want, es);
            fprintf(stderr,
                    "%s rank %d: %s %s kind %d count %zu %s: element %zu is 0x%llx (%.9g), "
                    "want 0x%llx (%.9g)\n",
                    shape, rank, hcoll_dtype_name(c->dtype), c->premul ? "premul" : "avg",
                    c->kind, c->count, c->inplace ? "in place" : "out of place", i,
                    (unsigned long long)g, get(c->dtype, got, 0), (unsigned long long)w,
                    get(c->dtype, want, 0));
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Shapes                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct shape {
    hct_id_slot_t slot;
    char name[32];
    int nranks;
    int node_of[MAX_RANKS];
} shape_t;

static void set_hostid(const shape_t *a, int rank)
{
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-pm-%d-%s-node%d", (int)getppid(), a->name,
             a->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
}

static int open_comm(shape_t *a, int rank, int nranks, hcoll_comm_t *comm_out)
{
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.chunk_bytes = 4096; /* many pipeline pieces for the larger counts */
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(comm_out, nranks, rank, &id, &cfg));
    return 0;
}

static int run_case(const shape_t *a, hcoll_comm_t comm, int rank, const pm_case_t *c,
                    unsigned char *send, unsigned char *recv)
{
    const int n = a->nranks;
    hcoll_op_t op = HCOLL_AVG;
    if (c->premul) {
        unsigned char s[8];
        double v = scalar_of(c->dtype, c->kind, rank);
        if (is_float(c->dtype)) {
            put(c->dtype, s, 0, v);
        } else {
            int64_t x = (int64_t)v;
            memcpy(s, &x, 8); /* little-endian: the low bytes are the dtype's */
        }
        HCT_OK(comm, hcoll_op_create_premul_sum(comm, s, c->dtype, HCOLL_SCALAR_HOST_IMMEDIATE,
                                                &op));
        memset(s, 0x55, sizeof s); /* read at create time: changing it now is harmless */
    }
    unsigned char *in = c->inplace ? recv : send;
    fill(c, n, rank, in);
    HCT_OK(comm, hcoll_allreduce(comm, in, recv, c->count, c->dtype, op, NULL));
    if (c->premul)
        HCT_OK(comm, hcoll_op_destroy(comm, op));
    return check(a->name, rank, n, c, recv);
}

static int rank_shape(int rank, int nranks, void *argp)
{
    shape_t *a = argp;
    set_hostid(a, rank);
    hcoll_comm_t comm;
    if (open_comm(a, rank, nranks, &comm))
        return 1;
    static const hcoll_dtype_t fl[] = { HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16,
                                        HCOLL_FLOAT64 };
    static const hcoll_dtype_t in[] = { HCOLL_INT8, HCOLL_UINT8, HCOLL_INT32, HCOLL_INT64 };
    static const size_t counts[] = { 1, 13, 1009, 70001 };
    size_t maxb = 70001 * 8;
    unsigned char *send = malloc(maxb), *recv = malloc(maxb);
    HCT_REQUIRE(send && recv, "no memory");
    int k = 0;
    for (int d = 0; d < 4; d++)
        for (int j = 0; j < 4; j++, k++) {
            pm_case_t avg = { fl[d], 0, 0, counts[j], k & 1 };
            pm_case_t dy = { fl[d], 1, 0, counts[j], !(k & 1) };
            pm_case_t ar = { fl[d], 1, 1, counts[j], k & 1 };
            pm_case_t it = { in[d], 1, j & 1, counts[j], k & 1 };
            if (run_case(a, comm, rank, &avg, send, recv) ||
                run_case(a, comm, rank, &dy, send, recv) ||
                run_case(a, comm, rank, &ar, send, recv) ||
                run_case(a, comm, rank, &it, send, recv)) {
                hcoll_comm_abort(comm); /* the others fail now, not at the deadline */
                return 1;
            }
        }
    free(send);
    free(recv);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static void run_shape(const char *name, const int *sizes, int nnodes, hct_rank_fn fn)
{
    shape_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    snprintf(a->name, sizeof a->name, "%s", name);
    for (int nd = 0; nd < nnodes; nd++)
        for (int k = 0; k < sizes[nd]; k++)
            a->node_of[a->nranks++] = nd;
    hct_opts_t o = { .nranks = a->nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, fn, a, res);
    ck_assert_msg(bad == 0, "shape %s: %d rank(s) failed (see stderr)", name, bad);
    hct_shared_free(a, sizeof *a);
}

START_TEST(exact_1x1) { run_shape("1x1", (int[]){ 1 }, 1, rank_shape); }
END_TEST
START_TEST(exact_1x4) { run_shape("1x4", (int[]){ 4 }, 1, rank_shape); }
END_TEST
START_TEST(exact_4x1) { run_shape("4x1", (int[]){ 1, 1, 1, 1 }, 4, rank_shape); }
END_TEST
START_TEST(exact_2x2) { run_shape("2x2", (int[]){ 2, 2 }, 2, rank_shape); }
END_TEST
START_TEST(exact_2_2_1) { run_shape("2_2_1", (int[]){ 2, 2, 1 }, 3, rank_shape); }
END_TEST

/* fp16 AVG of 20000 on 4 ranks: 20000 exactly (0x74e2) on every rank and
 * element, on the small (fused) and the pipelined paths, where a sum first
 * would overflow to inf. */
static int rank_fp16_20000(int rank, int nranks, void *argp)
{
    shape_t *a = argp;
    set_hostid(a, rank);
    hcoll_comm_t comm;
    if (open_comm(a, rank, nranks, &comm))
        return 1;
    static const size_t counts[] = { 1, 7, 4099, 100003 };
    uint16_t *buf = malloc(100003 * 2), *out = malloc(100003 * 2);
    HCT_REQUIRE(buf && out, "no memory");
    for (int j = 0; j < 4; j++) {
        for (size_t i = 0; i < counts[j]; i++)
            buf[i] = 0x74e2; /* 20000 */
        int inplace = j & 1;
        HCT_OK(comm, hcoll_allreduce(comm, buf, inplace ? buf : out, counts[j], HCOLL_FLOAT16,
                                     HCOLL_AVG, NULL));
        const uint16_t *res = inplace ? buf : out;
        for (size_t i = 0; i < counts[j]; i++)
            HCT_REQUIRE(res[i] == 0x74e2, "%s rank %d: count %zu: element %zu is 0x%04x, want "
                        "0x74e2 (20000)", a->name, rank, counts[j], i, res[i]);
    }
    /* Near the top of the range: 60000 (0x7b53) averages to 60000. */
    for (size_t i = 0; i < 4099; i++)
        buf[i] = 0x7b53;
    HCT_OK(comm, hcoll_allreduce(comm, buf, out, 4099, HCOLL_FLOAT16, HCOLL_AVG, NULL));
    for (size_t i = 0; i < 4099; i++)
        HCT_REQUIRE(out[i] == 0x7b53, "%s rank %d: 60000: element %zu is 0x%04x", a->name,
                    rank, i, out[i]);
    free(buf);
    free(out);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(fp16_20000_2x2) { run_shape("f2x2", (int[]){ 2, 2 }, 2, rank_fp16_20000); }
END_TEST
START_TEST(fp16_20000_1x4) { run_shape("f1x4", (int[]){ 4 }, 1, rank_fp16_20000); }
END_TEST
START_TEST(fp16_20000_4x1) { run_shape("f4x1", (int[]){ 1, 1, 1, 1 }, 4, rank_fp16_20000); }
END_TEST

/* A request keeps the scalar it was issued with: destroying the op while
 * the request is queued changes nothing. */
static int rank_async_destroy(int rank, int nranks, void *argp)
{
    shape_t *a = argp;
    set_hostid(a, rank);
    hcoll_comm_t comm;
    if (open_comm(a, rank, nranks, &comm))
        return 1;
    float s = 2.0f, x[1000], y[1000];
    for (int i = 0; i < 1000; i++)
        x[i] = (float)(i + rank);
    hcoll_op_t op;
    HCT_OK(comm, hcoll_op_create_premul_sum(comm, &s, HCOLL_FLOAT32,
                                            HCOLL_SCALAR_HOST_IMMEDIATE, &op));
    hcoll_request_t rq;
    HCT_OK(comm, hcoll_allreduce_async(comm, x, y, 1000, HCOLL_FLOAT32, op, NULL, &rq));
    HCT_OK(comm, hcoll_op_destroy(comm, op));
    HCT_OK(comm, hcoll_wait(rq));
    HCT_OK(comm, hcoll_request_free(rq));
    for (int i = 0; i < 1000; i++)
        HCT_REQUIRE(y[i] == 2.0f * (float)(nranks * i + nranks * (nranks - 1) / 2),
                    "element %d is %g", i, y[i]);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(async_then_destroy) { run_shape("async", (int[]){ 2, 2 }, 2, rank_async_destroy); }
END_TEST

/* ------------------------------------------------------------------------ */
/* Argument errors                                                            */
/* ------------------------------------------------------------------------ */

static int expect(hcoll_comm_t comm, hcoll_status_t got, hcoll_status_t want, const char *what,
                  const char *needle)
{
    HCT_REQUIRE(got == want, "%s -> %s, want %s", what, hcoll_status_name(got),
                hcoll_status_name(want));
    const char *msg = hcoll_comm_last_error(comm);
    HCT_REQUIRE(strstr(msg, needle), "%s: message '%s' lacks '%s'", what, msg, needle);
    return 0;
}

static int one_comm(hcoll_comm_t *comm_out)
{
    hcoll_unique_id_t id;
    HCT_OK(NULL, hcoll_get_unique_id(&id));
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    HCT_OK(NULL, hcoll_comm_init(comm_out, 1, 0, &id, &cfg));
    return 0;
}

static int rank_errors(int rank, int nranks, void *argp)
{
    (void)rank, (void)nranks, (void)argp;
    setenv("HCOLL_HOSTID", "hct-pm-errors", 1);
    hcoll_comm_t c, c2;
    if (one_comm(&c) || one_comm(&c2))
        return 1;
    float s = 0.5f, x[4] = { 1, 2, 3, 4 }, y[4];
    hcoll_op_t op = HCOLL_SUM, op2;
#define PM(comm, sc, dt, res, out) hcoll_op_create_premul_sum(comm, sc, dt, res, out)
    const hcoll_scalar_residence_t H = HCOLL_SCALAR_HOST_IMMEDIATE;
    if (expect(NULL, PM(NULL, &s, HCOLL_FLOAT32, H, &op), HCOLL_ERR_INVALID_ARG, "NULL comm",
               "comm") ||
        expect(c, PM(c, NULL, HCOLL_FLOAT32, H, &op), HCOLL_ERR_INVALID_ARG, "NULL scalar",
               "scalar") ||
        expect(c, PM(c, &s, HCOLL_FLOAT32, H, NULL), HCOLL_ERR_INVALID_ARG, "NULL op_out",
               "op_out") ||
        expect(c, PM(c, &s, HCOLL_DTYPE_COUNT_, H, &op), HCOLL_ERR_INVALID_ARG, "bad dtype",
               "dtype") ||
        expect(c, PM(c, &s, (hcoll_dtype_t)-1, H, &op), HCOLL_ERR_INVALID_ARG,
               "negative dtype", "dtype") ||
        expect(c, PM(c, &s, HCOLL_FLOAT32, (hcoll_scalar_residence_t)7, &op),
               HCOLL_ERR_INVALID_ARG, "bad residence", "residence") ||
        expect(c, PM(c, &s, HCOLL_FLOAT32, HCOLL_SCALAR_DEVICE, &op), HCOLL_ERR_INVALID_ARG,
               "device residence, host pointer", "device memory"))
        return 1;
    HCT_REQUIRE(op == HCOLL_SUM, "op_out written on failure");

    HCT_OK(c, PM(c, &s, HCOLL_FLOAT32, H, &op));
    HCT_OK(c2, PM(c2, &s, HCOLL_FLOAT32, H, &op2));
    HCT_REQUIRE((int)op >= (int)HCOLL_OP_COUNT_, "op %d is not above the built-in ops", (int)op);
    HCT_OK(c, hcoll_allreduce(c, x, y, 4, HCOLL_FLOAT32, op, NULL));
    HCT_REQUIRE(y[0] == 0.5f && y[3] == 2.0f, "1 rank: %g %g", y[0], y[3]);
    if (expect(c, hcoll_allreduce(c, x, y, 2, HCOLL_FLOAT64, op, NULL), HCOLL_ERR_INVALID_ARG,
               "another dtype", "made for float32") ||
        expect(c, hcoll_allreduce(c, x, y, 4, HCOLL_FLOAT32, op2, NULL), HCOLL_ERR_INVALID_ARG,
               "op of another communicator", "not made on this communicator") ||
        expect(c, hcoll_op_destroy(c, op2), HCOLL_ERR_INVALID_ARG,
               "destroy an op of another communicator", "not made on this communicator") ||
        expect(c, hcoll_op_destroy(c, HCOLL_SUM), HCOLL_ERR_INVALID_ARG, "destroy a built-in op",
               "not an op") ||
        expect(NULL, hcoll_op_destroy(NULL, op), HCOLL_ERR_INVALID_ARG, "destroy, NULL comm",
               "comm"))
        return 1;
    HCT_OK(c, hcoll_op_destroy(c, op));
    if (expect(c, hcoll_op_destroy(c, op), HCOLL_ERR_INVALID_ARG, "destroy twice",
               "destroyed") ||
        expect(c, hcoll_allreduce(c, x, y, 4, HCOLL_FLOAT32, op, NULL), HCOLL_ERR_INVALID_ARG,
               "use after destroy", "destroyed"))
        return 1;
    hcoll_request_t rq = NULL;
    if (expect(c, hcoll_allreduce_async(c, x, y, 4, HCOLL_FLOAT32, op, NULL, &rq),
               HCOLL_ERR_INVALID_ARG, "async use after destroy", "destroyed"))
        return 1;
    HCT_REQUIRE(rq == NULL, "req_out written on failure");
    /* The slot is reused, under a new handle: the old one stays dead. */
    HCT_OK(c, PM(c, &s, HCOLL_FLOAT32, H, &op2));
    HCT_REQUIRE(op2 != op, "a new op reuses a destroyed handle");
    if (expect(c, hcoll_allreduce(c, x, y, 4, HCOLL_FLOAT32, op, NULL), HCOLL_ERR_INVALID_ARG,
               "stale handle after reuse", "destroyed"))
        return 1;
    HCT_OK(c, hcoll_op_destroy(c, op2));
    /* Integer PREMUL_SUM is allowed: products wrap. */
    int32_t si = -3, xi[2] = { 5, INT32_MAX }, yi[2];
    HCT_OK(c, PM(c, &si, HCOLL_INT32, H, &op));
    HCT_OK(c, hcoll_allreduce(c, xi, yi, 2, HCOLL_INT32, op, NULL));
    HCT_REQUIRE(yi[0] == -15 && yi[1] == (int32_t)((uint32_t)INT32_MAX * (uint32_t)-3),
                "int32 premul: %d %d", yi[0], yi[1]);
    /* Argument errors are local: the communicator still works. */
    HCT_OK(c, hcoll_allreduce(c, x, y, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    HCT_OK(c, hcoll_comm_destroy(c)); /* live ops go with their communicator */
    HCT_OK(c2, hcoll_comm_destroy(c2));
    return 0;
}

START_TEST(argument_errors)
{
    hct_opts_t o = { .nranks = 1, .timeout_ms = 30000 };
    hct_result_t res[1];
    ck_assert_int_eq(hct_run(&o, rank_errors, NULL, res), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("premul");
    TCase *tc = tcase_create("exact");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, exact_1x1);
    tcase_add_test(tc, exact_1x4);
    tcase_add_test(tc, exact_4x1);
    tcase_add_test(tc, exact_2x2);
    tcase_add_test(tc, exact_2_2_1);
    suite_add_tcase(s, tc);
    tc = tcase_create("fp16");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fp16_20000_2x2);
    tcase_add_test(tc, fp16_20000_1x4);
    tcase_add_test(tc, fp16_20000_4x1);
    tcase_add_test(tc, async_then_destroy);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, argument_errors);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
