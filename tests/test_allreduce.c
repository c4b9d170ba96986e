/*
 * The public all-reduce end to end, through communicators of forked ranks
 * grouped into emulated nodes (HCOLL_HOSTID):
 *
 *   shape (nodes x ranks)     plan the communicator picks
 *   1x1                       single (a copy)
 *   1x4                       intra  (shared memory only)
 *   4x1                       ring   (one rank per node)
 *   nodes of 2,2,1 ranks      flat   (ring over all ranks)
 *   2x2 2x3 3x2 2x4           3stage (intra RS -> ring per rail -> intra AG)
 *
 * Inputs are small integers (powers of two for a floating PROD), so every
 * order of reduction gives the same exact result: results are compared bit
 * for bit with a reference computed here. Arbitrary floats are checked only
 * for bitwise agreement across ranks (each rank stores a hash of its result
 * in shared memory; the parent compares). Then: requests (ordering, test,
 * free, stage times), abort with queued requests, a rank killed mid-series,
 * argument errors and the sticky failure afterwards.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/elems.h"
#include "common/ranks.h"
#include "gdr/gdr.h"

#define MAX_RANKS 8
#define MAX_CASES 1200
#define TIMEOUT_MS 20000
/* Deadline of every wait in the failure tests. */
#define FAIL_TIMEOUT_MS 3000
/* The abort and kill tests: their failures travel by a reset cascade in
 * milliseconds, and they require it within half the timeout. A longer
 * timeout keeps "waited out the deadline" (a regression) far from what a
 * machine at load 30 takes to schedule the survivors (2.4 s seen). */
#define CASCADE_TIMEOUT_MS 10000
#define GUARD 64

/* ------------------------------------------------------------------------ */
/* Element helpers and the reference                                          */
/* ------------------------------------------------------------------------ */

static const hcoll_dtype_t all_dtypes[] = {
    HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16, HCOLL_FLOAT64,
    HCOLL_INT8,    HCOLL_UINT8,   HCOLL_INT32,    HCOLL_INT64,
};
static const hcoll_op_t all_ops[] = { HCOLL_SUM, HCOLL_PROD, HCOLL_MAX, HCOLL_MIN, HCOLL_AVG };
#define NDTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))
#define NOPS ((int)(sizeof all_ops / sizeof all_ops[0]))

static uint64_t mix(uint64_t h)
{
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    return h;
}

enum kind { K_EXACT, K_INEXACT, K_NAN };

/* Rank r's input element i: values for which any order of reduction is
 * exact (sums stay below 2^8 in magnitude, products are signed powers of
 * two for floating types and wrap mod 2^k for integers). */
static double gen(enum kind k, hcoll_op_t op, hcoll_dtype_t dt, int r, int n, size_t i)
{
    uint64_t h = mix((uint64_t)i * 1000003u + (uint64_t)r * 7919u + (uint64_t)op * 104729u);
    const int uns = dt == HCOLL_UINT8;
    if (k == K_INEXACT) {
        /* Arbitrary values in [-8, 8) with full mantissas. */
        return ((double)(h >> 11) / 9007199254740992.0 - 0.5) * 16.0;
    }
    if (k == K_NAN && (i % 5) == 0 && (int)((i / 5) % (size_t)n) == r)
        return NAN;
    switch (op) {
    case HCOLL_AVG:
        /* Floats are pre-multiplied by 1/n: multiples of n keep every
         * product and sum exact. */
        if (is_float(dt))
            return (double)n * ((double)(h % 7) - 3.0);
        return uns ? (double)(h % 4) : (double)(h % 7) - 3.0;
    case HCOLL_SUM:
        return uns ? (double)(h % 4) : (double)(h % 7) - 3.0;
    case HCOLL_PROD:
        if (is_float(dt)) {
            static const double t[5] = { 1, -1, 2, -2, 0.5 };
            return t[h % 5];
        }
        if (uns)
            return (double)(1 + h % 3);
        static const double t[4] = { 1, -1, 2, -3 };
        return t[h % 4];
    default: /* MAX, MIN */
        if (uns)
            return (double)(h % 256);
        return is_float(dt) ? ((double)(h % 201) - 100.0) / 4.0 : (double)(h % 201) - 100.0;
    }
}

/* AVG of floats pre-multiplies each input by the float 1/n (FLOAT64: the
 * double), rounding the product to the type (hcoll.h). */
static double avg_term(hcoll_dtype_t dt, int n, double v)
{
    switch (dt) {
    case HCOLL_FLOAT64: return v * (1.0 / n);
    case HCOLL_FLOAT32: return (float)v * (1.0f / (float)n);
    case HCOLL_FLOAT16: return h2f(f2h((float)v * (1.0f / (float)n)));
    default: return bf2f(f2bf((float)v * (1.0f / (float)n)));
    }
}

/* The expected bits of element i, written to want (esize bytes). */
static void reference(enum kind k, hcoll_op_t op, hcoll_dtype_t dt, int n, size_t i, void *want)
{
    if (is_float(dt)) {
        double acc = gen(k, op, dt, 0, n, i);
        int nan = isnan(acc);
        if (op == HCOLL_AVG)
            acc = avg_term(dt, n, acc);
        for (int r = 1; r < n; r++) {
            double v = gen(k, op, dt, r, n, i);
            nan |= isnan(v);
            switch (op) {
            case HCOLL_SUM: acc += v; break;
            case HCOLL_AVG: acc += avg_term(dt, n, v); break;
            case HCOLL_PROD: acc *= v; break;
            case HCOLL_MAX: acc = v > acc ? v : acc; break;
            case HCOLL_MIN: acc = v < acc ? v : acc; break;
            default: break;
            }
        }
        if (nan)
            acc = NAN;
        put(dt, want, 0, acc);
        return;
    }
    uint64_t acc = (uint64_t)(int64_t)gen(k, op, dt, 0, n, i);
    for (int r = 1; r < n; r++) {
        uint64_t v = (uint64_t)(int64_t)gen(k, op, dt, r, n, i);
        switch (op) {
        case HCOLL_SUM: case HCOLL_AVG: acc += v; break;
        case HCOLL_PROD: acc *= v; break;
        case HCOLL_MAX: acc = (int64_t)v > (int64_t)acc ? v : acc; break;
        case HCOLL_MIN: acc = (int64_t)v < (int64_t)acc ? v : acc; break;
        default: break;
        }
    }
    if (op == HCOLL_AVG)
        acc = (uint64_t)((int64_t)acc / n); /* truncates toward zero */
    unsigned char *p = want;
    switch (dt) {
    case HCOLL_INT8: case HCOLL_UINT8: { uint8_t x = (uint8_t)acc; memcpy(p, &x, 1); break; }
    case HCOLL_INT32: { uint32_t x = (uint32_t)acc; memcpy(p, &x, 4); break; }
    case HCOLL_INT64: memcpy(p, &acc, 8); break;
    default: break;
    }
}

static void fill_input(enum kind k, hcoll_op_t op, hcoll_dtype_t dt, int r, int n, void *buf,
                       size_t count)
{
    for (size_t i = 0; i < count; i++)
        put(dt, buf, i, gen(k, op, dt, r, n, i));
}

static uint64_t fnv(const void *p, size_t len)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

typedef struct ar_case {
    hcoll_dtype_t dtype;
    hcoll_op_t op;
    size_t count;
    int inplace;
    enum kind kind;
} ar_case_t;

static void case_str(const ar_case_t *c, char *out, size_t len)
{
    static const char *kinds[] = { "exact", "inexact", "nan" };
    snprintf(out, len, "%s %s count %zu %s (%s)", hcoll_dtype_name(c->dtype),
             hcoll_op_name(c->op), c->count, c->inplace ? "in place" : "out of place",
             kinds[c->kind]);
}

/*
 * Check recv against the reference: exact cases bit for bit (NaN where
 * expected), inexact ones within a loose bound of the double sum. Prints
 * the first wrong element and returns non-zero.
 */
static int check_result(const char *shape, int rank, int n, const ar_case_t *c, const void *recv)
{
    const size_t es = hcoll_dtype_size(c->dtype);
    unsigned char want[8];
    char desc[96];
    for (size_t i = 0; i < c->count; i++) {
        const unsigned char *got = (const unsigned char *)recv + i * es;
        if (c->kind == K_INEXACT) {
            double ref = 0, mag = 0;
            for (int r = 0; r < n; r++) {
                unsigned char tmp[8];
                put(c->dtype, tmp, 0, gen(K_INEXACT, c->op, c->dtype, r, n, i));
                double v = get(c->dtype, tmp, 0);
                ref += v;
                mag += fabs(v);
            }
            if (c->op == HCOLL_AVG)
                ref /= n, mag /= n;
            double eps = c->dtype == HCOLL_FLOAT64 ? 1e-12
                       : c->dtype == HCOLL_FLOAT32 ? 1e-5
                       : c->dtype == HCOLL_FLOAT16 ? 4e-3 : 3e-2;
            double g = get(c->dtype, recv, i);
            if (!(fabs(g - ref) <= eps * (mag + 1))) {
                case_str(c, desc, sizeof desc);
                fprintf(stderr, "%s rank %d: %s: element %zu is %.9g, want about %.9g\n", shape,
                        rank, desc, i, g, ref);
                return 1;
            }
            continue;
        }
        reference(c->kind, c->op, c->dtype, n, i, want);
        if (is_float(c->dtype) && isnan(get(c->dtype, want, 0))) {
            if (isnan(get(c->dtype, got, 0)))
                continue;
        } else if (memcmp(got, want, es) == 0) {
            continue;
        }
        uint64_t gb = 0, wb = 0;
        memcpy(&gb, got, es);
        memcpy(&wb, want, es);
        case_str(c, desc, sizeof desc);
        fprintf(stderr,
                "%s rank %d: %s: first wrong element %zu: got %.9g (0x%llx), want %.9g (0x%llx)\n",
                shape, rank, desc, i, get(c->dtype, got, 0), (unsigned long long)gb,
                get(c->dtype, want, 0), (unsigned long long)wb);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Shapes                                                                     */
/* ------------------------------------------------------------------------ */

enum { EXTRA_MODERATE = 1, EXTRA_LARGE = 2, EXTRA_HUGE = 4, EXTRA_ALL_INPLACE = 8 };

typedef struct shape_arg {
    hct_id_slot_t slot;
    char name[32];
    int nranks;
    int node_of[MAX_RANKS];
    size_t chunk_bytes; /* 0: default */
    int extras;
    const char *plan;   /* expected text of the plan line rank 0 logs */
    const char *small;  /* HCOLL_SMALL_BYTES for every rank; NULL: default */
    int ncases;
    uint64_t hash[MAX_CASES][MAX_RANKS];
} shape_arg_t;

static int shape_nnodes(const shape_arg_t *a)
{
    int m = 0;
    for (int r = 0; r < a->nranks; r++)
        m = a->node_of[r] > m ? a->node_of[r] : m;
    return m + 1;
}

/* The cases, identical on every rank (they must issue the same sequence). */
static int build_cases(const shape_arg_t *a, ar_case_t *cases)
{
    const int N = shape_nnodes(a);
    int L = 0; /* node 0's size: the same number on every rank */
    for (int r = 0; r < a->nranks; r++)
        L += a->node_of[r] == 0;
    size_t counts[] = { 0, 1, (size_t)(L > 1 ? L - 1 : 2), (size_t)(L * N + 1), 13, 97, 1009 };
    const int ncounts = (int)(sizeof counts / sizeof counts[0]);
    int nc = 0, k = 0;
    for (int d = 0; d < NDTYPES; d++)
        for (int o = 0; o < NOPS; o++)
            for (int j = 0; j < ncounts; j++, k++) {
                ar_case_t c = { all_dtypes[d], all_ops[o], counts[j], k & 1, K_EXACT };
                cases[nc++] = c;
                if (a->extras & EXTRA_ALL_INPLACE) {
                    c.inplace = !c.inplace;
                    cases[nc++] = c;
                }
            }
    /* Many pipeline pieces (with a 4 KiB chunk) for every dtype and op. */
    if (a->extras & EXTRA_MODERATE)
        for (int d = 0; d < NDTYPES; d++)
            for (int o = 0; o < NOPS; o++, k++)
                cases[nc++] = (ar_case_t){ all_dtypes[d], all_ops[o], 70001, k & 1, K_EXACT };
    if (a->extras & EXTRA_LARGE) {
        const size_t big = ((size_t)1 << 20) + 3;
        cases[nc++] = (ar_case_t){ HCOLL_FLOAT32, HCOLL_SUM, big, 0, K_EXACT };
        cases[nc++] = (ar_case_t){ HCOLL_BFLOAT16, HCOLL_AVG, big, 1, K_EXACT };
        cases[nc++] = (ar_case_t){ HCOLL_INT64, HCOLL_MAX, big, 0, K_EXACT };
    }
    /* Arbitrary floats: only bitwise agreement (and a loose bound). */
    static const hcoll_dtype_t fl[4] = { HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16,
                                         HCOLL_FLOAT64 };
    for (int d = 0; d < 4; d++) {
        cases[nc++] = (ar_case_t){ fl[d], HCOLL_SUM, 70001, d & 1, K_INEXACT };
        cases[nc++] = (ar_case_t){ fl[d], HCOLL_AVG, 1009, !(d & 1), K_INEXACT };
        cases[nc++] = (ar_case_t){ fl[d], d & 1 ? HCOLL_MIN : HCOLL_MAX, 1009, d & 1, K_NAN };
    }
    if (a->extras & EXTRA_HUGE)
        cases[nc++] = (ar_case_t){ HCOLL_FLOAT32, HCOLL_SUM, (size_t)16 << 20, 1, K_EXACT };
    return nc;
}

static void set_hostid(const char *tag, int node)
{
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-ar-%d-%s-node%d", (int)getppid(), tag, node);
    setenv("HCOLL_HOSTID", hostid, 1);
}

static int open_comm(hct_id_slot_t *slot, int rank, int nranks, int timeout_ms, size_t chunk,
                     hcoll_comm_t *comm_out)
{
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = timeout_ms;
    cfg.chunk_bytes = chunk;
    HCT_REQUIRE(hct_share_unique_id(slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(comm_out, nranks, rank, &id, &cfg));
    return 0;
}

/* Stage times of a finished all-reduce, as the plan says they must look. */
static int check_times(const char *shape, const char *plan, const hcoll_stage_times_t *t)
{
    HCT_REQUIRE(t->total_us > 0, "%s: total_us %.1f", shape, t->total_us);
    if (strstr(plan, "single"))
        HCT_REQUIRE(t->intra_rs_us == 0 && t->inter_us == 0 && t->intra_ag_us == 0,
                    "%s: single rank, stages %.1f/%.1f/%.1f", shape, t->intra_rs_us, t->inter_us,
                    t->intra_ag_us);
    else if (strstr(plan, "one node"))
        HCT_REQUIRE(t->intra_rs_us > 0 && t->intra_ag_us > 0 && t->inter_us == 0,
                    "%s: one node, stages %.1f/%.1f/%.1f", shape, t->intra_rs_us, t->inter_us,
                    t->intra_ag_us);
    else if (strstr(plan, "three"))
        HCT_REQUIRE(t->intra_rs_us > 0 && t->intra_ag_us > 0 && t->inter_us > 0,
                    "%s: 3 stages, stages %.1f/%.1f/%.1f", shape, t->intra_rs_us, t->inter_us,
                    t->intra_ag_us);
    else
        HCT_REQUIRE(t->intra_rs_us == 0 && t->intra_ag_us == 0 && t->inter_us > 0,
                    "%s: ring, stages %.1f/%.1f/%.1f", shape, t->intra_rs_us, t->inter_us,
                    t->intra_ag_us);
    HCT_REQUIRE(t->intra_rs_us <= t->total_us * 1.01 + 1 && t->inter_us <= t->total_us * 1.01 + 1,
                "%s: a stage (%.1f, %.1f) longer than the whole (%.1f)", shape, t->intra_rs_us,
                t->inter_us, t->total_us);
    return 0;
}

static int run_case(shape_arg_t *a, hcoll_comm_t comm, int rank, int ci, const ar_case_t *c,
                    unsigned char *send, unsigned char *recv)
{
    const size_t es = hcoll_dtype_size(c->dtype), bytes = c->count * es;
    const int n = a->nranks;
    unsigned char *in = c->inplace ? recv : send;
    memset(recv, 0xa5, bytes + GUARD);
    fill_input(c->kind, c->op, c->dtype, rank, n, in, c->count);
    uint64_t send_hash = c->inplace ? 0 : fnv(send, bytes);
    char desc[96];
    case_str(c, desc, sizeof desc);

    hcoll_status_t st = hcoll_allreduce(comm, in, recv, c->count, c->dtype, c->op, NULL);
    if (st != HCOLL_SUCCESS) {
        fprintf(stderr, "%s rank %d: %s: hcoll_allreduce -> %s (%s)\n", a->name, rank, desc,
                hcoll_status_name(st), hcoll_comm_last_error(comm));
        return 1;
    }
    if (check_result(a->name, rank, n, c, recv))
        return 1;
    for (size_t g = 0; g < GUARD; g++)
        HCT_REQUIRE(recv[bytes + g] == 0xa5, "%s rank %d: %s: wrote %zu bytes past the end",
                    a->name, rank, desc, g + 1);
    HCT_REQUIRE(c->inplace || fnv(send, bytes) == send_hash, "%s rank %d: %s: sendbuf changed",
                a->name, rank, desc);
    a->hash[ci][rank] = fnv(recv, bytes);
    return 0;
}

static int rank_shape(int rank, int nranks, void *argp)
{
    shape_arg_t *a = argp;
    char logpath[128];
    set_hostid(a->name, a->node_of[rank]);
    if (a->small)
        setenv("HCOLL_SMALL_BYTES", a->small, 1);
    if (rank == 0) {
        /* Rank 0 names the plan at INFO (INIT). */
        /* Named after the parent, which removes it whatever happens. */
        snprintf(logpath, sizeof logpath, "/tmp/hct-ar-%d-%s.log", (int)getppid(), a->name);
        unlink(logpath);
        setenv("HCOLL_DEBUG", "INFO", 1);
        setenv("HCOLL_DEBUG_SUBSYS", "INIT", 1);
        setenv("HCOLL_DEBUG_FILE", logpath, 1);
    }
    hcoll_comm_t comm;
    if (open_comm(&a->slot, rank, nranks, TIMEOUT_MS, a->chunk_bytes, &comm))
        return 1;
    int L, N;
    HCT_OK(comm, hcoll_comm_local_size(comm, &L));
    HCT_OK(comm, hcoll_comm_node_count(comm, &N));
    HCT_REQUIRE(N == shape_nnodes(a), "%s: %d nodes", a->name, N);

    /* Nothing finished yet: no times. */
    hcoll_stage_times_t t;
    HCT_REQUIRE(hcoll_comm_last_stage_times(comm, &t) == HCOLL_ERR_INVALID_ARG,
                "%s: stage times before the first all-reduce", a->name);

    static ar_case_t cases[MAX_CASES];
    const int nc = build_cases(a, cases);
    ar_case_t big = { HCOLL_FLOAT32, HCOLL_SUM, 262147, 1, K_EXACT };
    size_t maxbytes = big.count * hcoll_dtype_size(big.dtype);
    for (int i = 0; i < nc; i++)
        if (cases[i].count * hcoll_dtype_size(cases[i].dtype) > maxbytes)
            maxbytes = cases[i].count * hcoll_dtype_size(cases[i].dtype);
    unsigned char *send = malloc(maxbytes + GUARD), *recv = malloc(maxbytes + GUARD);
    HCT_REQUIRE(send && recv, "no memory");
    if (rank == 0)
        a->ncases = nc;

    for (int i = 0; i < nc; i++) {
        if (run_case(a, comm, rank, i, &cases[i], send, recv)) {
            /* Let the other ranks fail now rather than at the deadline. */
            hcoll_comm_abort(comm);
            return 1;
        }
    }

    /* A vector large enough that every stage of the plan takes time. */
    if (run_case(a, comm, rank, nc, &big, send, recv)) {
        hcoll_comm_abort(comm);
        return 1;
    }
    HCT_OK(comm, hcoll_comm_last_stage_times(comm, &t));
    if (check_times(a->name, a->plan, &t))
        return 1;
    hcoll_status_t ae;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "%s: async error %s", a->name, hcoll_status_name(ae));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    free(send);
    free(recv);

    if (rank == 0) {
        FILE *f = fopen(logpath, "r");
        HCT_REQUIRE(f, "%s: no log %s", a->name, logpath);
        char line[1024];
        int found = 0;
        while (fgets(line, sizeof line, f))
            found |= strstr(line, "all-reduce plan: ") && strstr(line, a->plan);
        fclose(f);
        unlink(logpath);
        HCT_REQUIRE(found, "%s: rank 0 did not log the plan '%s'", a->name, a->plan);
    }
    return 0;
}

/* Run one shape: nodes of the given sizes (ranks in node order), with
 * HCOLL_SMALL_BYTES = small (NULL: the default). */
static void run_shape_small(const char *name, const int *node_sizes, int nnodes, size_t chunk,
                            int extras, const char *plan, const char *small)
{
    shape_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    snprintf(a->name, sizeof a->name, "%s", name);
    for (int nd = 0; nd < nnodes; nd++)
        for (int k = 0; k < node_sizes[nd]; k++)
            a->node_of[a->nranks++] = nd;
    a->chunk_bytes = chunk;
    a->extras = extras;
    a->plan = plan;
    a->small = small;
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = a->nranks, .ranks_per_node = 0, .timeout_ms = 110000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_shape, a, res);
    char logpath[128];
    snprintf(logpath, sizeof logpath, "/tmp/hct-ar-%d-%s.log", (int)getpid(), name);
    unlink(logpath);
    fprintf(stderr, "[time] shape %s: %.1f s (%d cases)\n", name, (hct_now_ms() - t0) / 1e3,
            a->ncases + 1);
    ck_assert_msg(bad == 0, "shape %s: %d rank(s) failed (see stderr)", name, bad);
    /* Every rank holds the same bits. */
    for (int i = 0; i <= a->ncases; i++)
        for (int r = 1; r < a->nranks; r++)
            ck_assert_msg(a->hash[i][r] == a->hash[i][0],
                          "shape %s: case %d: rank %d's result differs from rank 0's", name, i,
                          r);
    hct_shared_free(a, sizeof *a);
}

static void run_shape(const char *name, const int *node_sizes, int nnodes, size_t chunk,
                      int extras, const char *plan)
{
    run_shape_small(name, node_sizes, nnodes, chunk, extras, plan, NULL);
}

static const char *const PLAN_SINGLE = "single rank";
static const char *const PLAN_INTRA = "one node: intra-node all-reduce";
static const char *const PLAN_RING = "one rank per node: inter-node ring";
static const char *const PLAN_FLAT = "unequal nodes: flat ring";
static const char *const PLAN_3STAGE = "three stages";

START_TEST(shape_1x1)
{
    run_shape("1x1", (int[]){ 1 }, 1, 0, EXTRA_ALL_INPLACE | EXTRA_LARGE, PLAN_SINGLE);
}
END_TEST

START_TEST(shape_1x4)
{
    run_shape("1x4", (int[]){ 4 }, 1, 4096, EXTRA_ALL_INPLACE | EXTRA_MODERATE | EXTRA_LARGE,
              PLAN_INTRA);
}
END_TEST

START_TEST(shape_4x1)
{
    run_shape("4x1", (int[]){ 1, 1, 1, 1 }, 4, 4096,
              EXTRA_ALL_INPLACE | EXTRA_MODERATE | EXTRA_LARGE, PLAN_RING);
}
END_TEST

START_TEST(shape_2_2_1)
{
    run_shape("2-2-1", (int[]){ 2, 2, 1 }, 3, 4096, EXTRA_ALL_INPLACE | EXTRA_MODERATE | EXTRA_LARGE,
              PLAN_FLAT);
    run_shape("1-3", (int[]){ 1, 3 }, 2, 0, 0, PLAN_FLAT);
}
END_TEST

START_TEST(shape_2x2)
{
    run_shape("2x2", (int[]){ 2, 2 }, 2, 0,
              EXTRA_ALL_INPLACE | EXTRA_MODERATE | EXTRA_LARGE | EXTRA_HUGE, PLAN_3STAGE);
}
END_TEST

START_TEST(shape_2x3)
{
    run_shape("2x3", (int[]){ 3, 3 }, 2, 4096, EXTRA_ALL_INPLACE | EXTRA_MODERATE, PLAN_3STAGE);
}
END_TEST

START_TEST(shape_3x2)
{
    run_shape("3x2", (int[]){ 2, 2, 2 }, 3, 4096,
              EXTRA_ALL_INPLACE | EXTRA_MODERATE | EXTRA_LARGE, PLAN_3STAGE);
}
END_TEST

START_TEST(shape_2x4)
{
    run_shape("2x4", (int[]){ 4, 4 }, 2, 4096, EXTRA_ALL_INPLACE | EXTRA_MODERATE | EXTRA_LARGE,
              PLAN_3STAGE);
}
END_TEST

/*
 * The latency path (HCOLL_SMALL_BYTES) against the pipelined one, for every
 * dtype x op on the plans that have both: forced for every size (with
 * several fused steps and ring chunks: 4 KiB chunks), and turned off (the
 * default shapes above run small counts through it).
 */
START_TEST(small_path_always)
{
    const int extras = EXTRA_ALL_INPLACE | EXTRA_MODERATE;
    run_shape_small("1x4-small", (int[]){ 4 }, 1, 4096, extras, PLAN_INTRA, "1G");
    run_shape_small("2x2-small", (int[]){ 2, 2 }, 2, 0, extras | EXTRA_LARGE, PLAN_3STAGE, "1G");
    run_shape_small("2x3-small", (int[]){ 3, 3 }, 2, 4096, extras, PLAN_3STAGE, "1G");
    run_shape_small("3x2-small", (int[]){ 2, 2, 2 }, 3, 4096, extras, PLAN_3STAGE, "1G");
}
END_TEST

START_TEST(small_path_never)
{
    run_shape_small("1x4-big", (int[]){ 4 }, 1, 4096, EXTRA_ALL_INPLACE, PLAN_INTRA, "0");
    run_shape_small("2x2-big", (int[]){ 2, 2 }, 2, 0, EXTRA_ALL_INPLACE, PLAN_3STAGE, "0");
    run_shape_small("3x2-big", (int[]){ 2, 2, 2 }, 3, 4096, EXTRA_ALL_INPLACE, PLAN_3STAGE, "0");
}
END_TEST

/* Ranks that disagree on HCOLL_SMALL_BYTES would take different paths on
 * the same call: every rank's init refuses, and says why in one warning
 * (the failure is logged where it is decided, not again by init). */
typedef struct small_mismatch {
    hct_id_slot_t slot;
    hcoll_status_t st[MAX_RANKS];
    int named[MAX_RANKS];
    int logged[MAX_RANKS]; /* warnings that name HCOLL_SMALL_BYTES */
} small_mismatch_t;

/* Lines of the file at path that contain needle; -1 when unreadable. */
static int count_lines_with(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static int rank_small_mismatch(int rank, int nranks, void *argp)
{
    small_mismatch_t *m = argp;
    set_hostid("small-mismatch", rank / 2);
    setenv("HCOLL_SMALL_BYTES", rank == 3 ? "1K" : "64K", 1);
    /* Each rank logs to its own file, and removes it once counted. */
    char logpath[128];
    snprintf(logpath, sizeof logpath, "/tmp/hct-ar-%d-small-mismatch-%d.log", (int)getppid(),
             rank);
    unlink(logpath);
    setenv("HCOLL_DEBUG", "WARN", 1);
    setenv("HCOLL_DEBUG_FILE", logpath, 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = FAIL_TIMEOUT_MS;
    HCT_REQUIRE(hct_share_unique_id(&m->slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    hcoll_comm_t comm = NULL;
    m->st[rank] = hcoll_comm_init(&comm, nranks, rank, &id, &cfg);
    m->named[rank] = strstr(hcoll_comm_last_error(NULL), "HCOLL_SMALL_BYTES") != NULL;
    if (comm)
        hcoll_comm_destroy(comm);
    m->logged[rank] = count_lines_with(logpath, "HCOLL_SMALL_BYTES");
    unlink(logpath);
    return 0;
}

START_TEST(small_bytes_mismatch)
{
    small_mismatch_t *m = hct_shared_alloc(sizeof *m);
    ck_assert_ptr_nonnull(m);
    hct_opts_t o = { .nranks = 4, .timeout_ms = 30000 };
    hct_result_t res[MAX_RANKS];
    ck_assert_int_eq(hct_run(&o, rank_small_mismatch, m, res), 0);
    for (int r = 0; r < 4; r++) {
        ck_assert_msg(m->st[r] == HCOLL_ERR_MISMATCH, "rank %d: %s", r,
                      hcoll_status_name(m->st[r]));
        ck_assert_msg(m->named[r], "rank %d: the message does not name HCOLL_SMALL_BYTES", r);
        ck_assert_msg(m->logged[r] == 1, "rank %d: the mismatch is logged %d times, not once", r,
                      m->logged[r]);
    }
    hct_shared_free(m, sizeof *m);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Requests                                                                   */
/* ------------------------------------------------------------------------ */

#define NREQ 16

typedef struct world {
    hct_id_slot_t slot;
    char name[32];
    int nranks;
    int node_of[MAX_RANKS];
    size_t chunk_bytes;
    const char *plan;
    volatile int flag[4];
    hct_barrier_t bar;
    uint64_t hash[NREQ][MAX_RANKS];
} world_t;

static world_t *world_new(const char *name, const int *node_sizes, int nnodes, size_t chunk,
                          const char *plan)
{
    world_t *w = hct_shared_alloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    snprintf(w->name, sizeof w->name, "%s", name);
    for (int nd = 0; nd < nnodes; nd++)
        for (int k = 0; k < node_sizes[nd]; k++)
            w->node_of[w->nranks++] = nd;
    w->chunk_bytes = chunk;
    w->plan = plan;
    return w;
}

/* Wait until a flag in shared memory is set by another rank. */
static int wait_flag(volatile int *f, int timeout_ms)
{
    double deadline = hct_now_ms() + timeout_ms;
    while (!__atomic_load_n(f, __ATOMIC_ACQUIRE)) {
        if (hct_now_ms() > deadline)
            return -1;
        usleep(200);
    }
    return 0;
}

static void set_flag(volatile int *f)
{
    __atomic_store_n(f, 1, __ATOMIC_RELEASE);
}

/* Issue (count, dtype, op) as a request on fresh buffers. */
typedef struct req_slot {
    ar_case_t c;
    unsigned char *send, *recv;
    hcoll_request_t req;
} req_slot_t;

static int req_issue(hcoll_comm_t comm, int rank, int n, req_slot_t *s)
{
    const size_t bytes = s->c.count * hcoll_dtype_size(s->c.dtype);
    if (!s->recv) {
        s->send = malloc(bytes + GUARD);
        s->recv = malloc(bytes + GUARD);
        HCT_REQUIRE(s->send && s->recv, "no memory");
    }
    memset(s->recv, 0xa5, bytes + GUARD);
    unsigned char *in = s->c.inplace ? s->recv : s->send;
    fill_input(s->c.kind, s->c.op, s->c.dtype, rank, n, in, s->c.count);
    HCT_OK(comm, hcoll_allreduce_async(comm, in, s->recv, s->c.count, s->c.dtype, s->c.op, NULL,
                                       &s->req));
    return 0;
}

static int req_check(const char *shape, int rank, int n, const req_slot_t *s)
{
    const size_t bytes = s->c.count * hcoll_dtype_size(s->c.dtype);
    if (check_result(shape, rank, n, &s->c, s->recv))
        return 1;
    for (size_t g = 0; g < GUARD; g++)
        HCT_REQUIRE(s->recv[bytes + g] == 0xa5, "%s: wrote past the end", shape);
    return 0;
}

static void req_release(req_slot_t *s)
{
    free(s->send);
    free(s->recv);
    s->send = s->recv = NULL;
}

static int rank_async(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    set_hostid(w->name, w->node_of[rank]);
    hcoll_comm_t comm;
    if (open_comm(&w->slot, rank, nranks, TIMEOUT_MS, w->chunk_bytes, &comm))
        return 1;
    const int n = nranks;
    hcoll_stage_times_t t;
    int d;

    /* A: 16 requests of different sizes, types and ops, back to back. */
    static const size_t counts[NREQ] = { 1,     1000, 70001, 13, 262147, 0,  5,   4097,
                                         100, 65536, 3,     200003, 7,  999, 31, 50000 };
    req_slot_t rs[NREQ];
    memset(rs, 0, sizeof rs);
    /* Rank 0 issues first and looks at its requests before anybody else
     * has issued: none can be finished yet. */
    if (rank != 0)
        HCT_REQUIRE(wait_flag(&w->flag[0], TIMEOUT_MS) == 0, "rank 0 never issued");
    for (int k = 0; k < NREQ; k++) {
        rs[k].c = (ar_case_t){ all_dtypes[k % NDTYPES], all_ops[k % NOPS], counts[k], k & 1,
                               K_EXACT };
        if (req_issue(comm, rank, n, &rs[k]))
            return 1;
    }
    if (rank == 0 && n > 1) {
        for (int k = 0; k < NREQ; k++) {
            HCT_OK(comm, hcoll_test(rs[k].req, &d));
            HCT_REQUIRE(d == 0, "%s: request %d done before the peers issued it", w->name, k);
            HCT_REQUIRE(hcoll_request_stage_times(rs[k].req, &t) == HCOLL_IN_PROGRESS,
                        "%s: stage times of a running request", w->name);
        }
    }
    if (rank == 0)
        set_flag(&w->flag[0]);

    /* Poll from the newest down: when request k is done, every earlier one
     * must be done too (they complete in issue order). */
    int done[NREQ] = { 0 }, ndone = 0;
    const double deadline = hct_now_ms() + TIMEOUT_MS;
    while (ndone < NREQ) {
        HCT_REQUIRE(hct_now_ms() < deadline, "%s: %d of %d requests done at the deadline",
                    w->name, ndone, NREQ);
        for (int k = NREQ - 1; k >= 0; k--) {
            if (done[k])
                continue;
            hcoll_status_t st = hcoll_test(rs[k].req, &d);
            HCT_REQUIRE(st == HCOLL_SUCCESS, "%s: request %d -> %s (%s)", w->name, k,
                        hcoll_status_name(st), hcoll_comm_last_error(comm));
            if (!d)
                continue;
            for (int j = 0; j < k; j++) {
                if (done[j])
                    continue;
                HCT_OK(comm, hcoll_test(rs[j].req, &d));
                HCT_REQUIRE(d == 1, "%s: request %d done before request %d", w->name, k, j);
                done[j] = 1, ndone++;
            }
            done[k] = 1, ndone++;
        }
        usleep(50);
    }
    for (int k = 0; k < NREQ; k++) {
        if (req_check(w->name, rank, n, &rs[k]))
            return 1;
        w->hash[k][rank] = fnv(rs[k].recv, rs[k].c.count * hcoll_dtype_size(rs[k].c.dtype));
        HCT_OK(comm, hcoll_request_stage_times(rs[k].req, &t));
        HCT_REQUIRE(t.total_us > 0 || rs[k].c.count == 0, "%s: request %d total_us %.1f",
                    w->name, k, t.total_us);
        HCT_OK(comm, hcoll_wait(rs[k].req)); /* again: still its status */
        HCT_OK(comm, hcoll_request_free(rs[k].req));
        req_release(&rs[k]);
    }
    /* The last finished one was an asynchronous one. */
    HCT_OK(comm, hcoll_comm_last_stage_times(comm, &t));

    /* B: freeing a request that has not finished waits for it. */
    req_slot_t b = { .c = { HCOLL_FLOAT32, HCOLL_SUM, 262147, 1, K_EXACT } };
    if (rank != 0)
        HCT_REQUIRE(wait_flag(&w->flag[1], TIMEOUT_MS) == 0, "rank 0 never issued B");
    if (req_issue(comm, rank, n, &b))
        return 1;
    if (rank == 0 && n > 1) {
        HCT_OK(comm, hcoll_test(b.req, &d));
        HCT_REQUIRE(d == 0, "%s: B done before the peers issued it", w->name);
    }
    if (rank == 0)
        set_flag(&w->flag[1]);
    HCT_OK(comm, hcoll_request_free(b.req));
    if (req_check(w->name, rank, n, &b))
        return 1;
    req_release(&b);

    /* C: a blocking call issued behind requests runs after them: its input
     * is the last request's output. */
    req_slot_t c[4];
    memset(c, 0, sizeof c);
    for (int k = 0; k < 4; k++) {
        c[k].c = (ar_case_t){ HCOLL_INT32, HCOLL_SUM, 200003, 1, K_EXACT };
        if (req_issue(comm, rank, n, &c[k]))
            return 1;
    }
    int32_t *out = malloc(200003 * sizeof *out);
    HCT_REQUIRE(out, "no memory");
    HCT_OK(comm, hcoll_allreduce(comm, c[3].recv, out, 200003, HCOLL_INT32, HCOLL_SUM, NULL));
    for (int k = 0; k < 4; k++) {
        HCT_OK(comm, hcoll_test(c[k].req, &d));
        HCT_REQUIRE(d == 1, "%s: blocking call returned before request %d finished", w->name, k);
        if (req_check(w->name, rank, n, &c[k]))
            return 1;
    }
    for (size_t i = 0; i < 200003; i++) {
        int32_t want;
        reference(K_EXACT, HCOLL_SUM, HCOLL_INT32, n, i, &want);
        HCT_REQUIRE(out[i] == want * n, "%s: blocking after requests: element %zu is %d, want %d",
                    w->name, i, out[i], want * n);
    }
    HCT_OK(comm, hcoll_comm_last_stage_times(comm, &t));
    if (check_times(w->name, w->plan, &t))
        return 1;
    for (int k = 0; k < 4; k++) {
        HCT_OK(comm, hcoll_request_free(c[k].req));
        req_release(&c[k]);
    }
    free(out);

    /* D: edge cases of the request calls. */
    hcoll_request_t r0 = NULL;
    HCT_REQUIRE(hcoll_test(NULL, &d) == HCOLL_ERR_INVALID_ARG, "test(NULL)");
    HCT_REQUIRE(hcoll_wait(NULL) == HCOLL_ERR_INVALID_ARG, "wait(NULL)");
    HCT_REQUIRE(hcoll_request_free(NULL) == HCOLL_SUCCESS, "free(NULL)");
    HCT_REQUIRE(hcoll_request_stage_times(NULL, &t) == HCOLL_ERR_INVALID_ARG, "times(NULL)");
    HCT_REQUIRE(hcoll_allreduce_async(comm, NULL, NULL, 0, HCOLL_FLOAT32, HCOLL_SUM, NULL,
                                      NULL) == HCOLL_ERR_INVALID_ARG,
                "async without req_out");
    HCT_REQUIRE(strstr(hcoll_comm_last_error(comm), "req_out"), "message '%s'",
                hcoll_comm_last_error(comm));
    HCT_OK(comm, hcoll_allreduce_async(comm, NULL, NULL, 0, HCOLL_INT8, HCOLL_MAX, NULL, &r0));
    HCT_OK(comm, hcoll_wait(r0));
    HCT_OK(comm, hcoll_request_stage_times(r0, &t));
    HCT_OK(comm, hcoll_request_free(r0));

    /* E: destroy waits for the requests still queued; they outlive it. */
    req_slot_t e[3];
    memset(e, 0, sizeof e);
    for (int k = 0; k < 3; k++) {
        e[k].c = (ar_case_t){ HCOLL_FLOAT64, HCOLL_MIN, 100003, k & 1, K_EXACT };
        if (req_issue(comm, rank, n, &e[k]))
            return 1;
    }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    for (int k = 0; k < 3; k++) {
        hcoll_status_t st = hcoll_test(e[k].req, &d);
        HCT_REQUIRE(d == 1 && st == HCOLL_SUCCESS, "%s: request %d after destroy: done %d, %s",
                    w->name, k, d, hcoll_status_name(st));
        if (req_check(w->name, rank, n, &e[k]))
            return 1;
        HCT_REQUIRE(hcoll_request_free(e[k].req) == HCOLL_SUCCESS, "free after destroy");
        req_release(&e[k]);
    }
    return 0;
}

static void run_async(const char *name, const int *node_sizes, int nnodes, size_t chunk,
                      const char *plan)
{
    world_t *w = world_new(name, node_sizes, nnodes, chunk, plan);
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = w->nranks, .timeout_ms = 100000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_async, w, res);
    fprintf(stderr, "[time] requests %s: %.1f s\n", name, (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "requests on %s: %d rank(s) failed (see stderr)", name, bad);
    for (int k = 0; k < NREQ; k++)
        for (int r = 1; r < w->nranks; r++)
            ck_assert_msg(w->hash[k][r] == w->hash[k][0],
                          "requests on %s: request %d: rank %d's result differs from rank 0's",
                          name, k, r);
    hct_shared_free(w, sizeof *w);
}

START_TEST(requests_3stage)
{
    run_async("2x2", (int[]){ 2, 2 }, 2, 4096, PLAN_3STAGE);
}
END_TEST

START_TEST(requests_other_plans)
{
    run_async("1x1", (int[]){ 1 }, 1, 0, PLAN_SINGLE);
    run_async("1x3", (int[]){ 3 }, 1, 0, PLAN_INTRA);
    run_async("3x1", (int[]){ 1, 1, 1 }, 3, 0, PLAN_RING);
    run_async("2-1", (int[]){ 2, 1 }, 2, 0, PLAN_FLAT);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Failures: abort, killed ranks, sticky errors                               */
/* ------------------------------------------------------------------------ */

/* Names in /dev/shm that begin with "hcoll-". */
typedef struct shm_list {
    int n;
    char names[64][256];
} shm_list_t;

static void shm_scan(shm_list_t *l)
{
    l->n = 0;
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) && l->n < 64)
        if (strncmp(e->d_name, "hcoll-", 6) == 0)
            snprintf(l->names[l->n++], sizeof l->names[0], "%s", e->d_name);
    closedir(d);
}

/* A segment that appeared during the test and is still there. Another
 * program's short-lived segment is given two seconds to go away. */
static const char *shm_leftover(const shm_list_t *before)
{
    static shm_list_t after;
    for (int pass = 0; pass < 2; pass++) {
        shm_scan(&after);
        const char *left = NULL;
        for (int i = 0; i < after.n && !left; i++) {
            int old = 0;
            for (int j = 0; j < before->n; j++)
                old |= strcmp(after.names[i], before->names[j]) == 0;
            if (!old)
                left = after.names[i];
        }
        if (!left || pass == 1)
            return left;
        sleep(2);
    }
    return NULL;
}

static int is_failure(hcoll_status_t st)
{
    return st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_ABORTED || st == HCOLL_ERR_TIMEOUT;
}

/*
 * After the communicator failed with `first`: the next call fails at once
 * with the same status and a message, and the async error says so too.
 */
static int check_sticky(const char *shape, int rank, hcoll_comm_t comm, hcoll_status_t first)
{
    float x[4] = { 1, 2, 3, 4 };
    double t0 = hct_now_ms();
    hcoll_status_t st = hcoll_allreduce(comm, x, x, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    double dt = hct_now_ms() - t0;
    HCT_REQUIRE(st == first, "%s rank %d: call after the failure -> %s, first error was %s",
                shape, rank, hcoll_status_name(st), hcoll_status_name(first));
    HCT_REQUIRE(dt < 500, "%s rank %d: call after the failure took %.0f ms", shape, rank, dt);
    HCT_REQUIRE(strlen(hcoll_comm_last_error(comm)) > 0, "%s: no message", shape);
    hcoll_request_t rq;
    st = hcoll_allreduce_async(comm, x, x, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL, &rq);
    if (st == HCOLL_SUCCESS) {
        st = hcoll_wait(rq);
        hcoll_request_free(rq);
    }
    HCT_REQUIRE(st == first, "%s rank %d: request after the failure -> %s", shape, rank,
                hcoll_status_name(st));
    hcoll_status_t ae;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == first, "%s rank %d: async error %s, first error %s", shape, rank,
                hcoll_status_name(ae), hcoll_status_name(first));
    return 0;
}

typedef struct fail_arg {
    world_t w;
    int victim;
    int delay_us;      /* kill: how long into the call */
    double event_ms;   /* when the abort or the kill happened */
    double noticed_ms[MAX_RANKS];
    int calls_before[MAX_RANKS];
} fail_arg_t;

#define ABORT_NREQ 6
#define ABORT_COUNT ((size_t)1 << 20)

/*
 * Every rank issues requests 0 and 1; the aborter issues 2..5 too, waits
 * for request 0 and aborts with the rest queued. The others issue 2..5
 * only after the abort: those can never have run anywhere.
 */
static int rank_abort(int rank, int nranks, void *argp)
{
    fail_arg_t *a = argp;
    world_t *w = &a->w;
    set_hostid(w->name, w->node_of[rank]);
    hcoll_comm_t comm;
    if (open_comm(&w->slot, rank, nranks, CASCADE_TIMEOUT_MS, w->chunk_bytes, &comm))
        return 1;
    req_slot_t rs[ABORT_NREQ];
    memset(rs, 0, sizeof rs);
    for (int k = 0; k < ABORT_NREQ; k++)
        rs[k].c = (ar_case_t){ HCOLL_FLOAT32, HCOLL_SUM, k == 0 ? 4099 : ABORT_COUNT, 1,
                               K_EXACT };
    for (int k = 0; k < 2; k++)
        if (req_issue(comm, rank, nranks, &rs[k]))
            return 1;

    if (rank == a->victim) {
        for (int k = 2; k < ABORT_NREQ; k++)
            if (req_issue(comm, rank, nranks, &rs[k]))
                return 1;
        HCT_OK(comm, hcoll_wait(rs[0].req));
        a->event_ms = hct_now_ms();
        HCT_OK(NULL, hcoll_comm_abort(comm));
        set_flag(&w->flag[0]);
        /* comm is gone; the requests are not. */
        for (int k = 0; k < ABORT_NREQ; k++) {
            hcoll_status_t st = hcoll_wait(rs[k].req);
            if (k == 0)
                HCT_REQUIRE(st == HCOLL_SUCCESS, "%s aborter: request 0 -> %s", w->name,
                            hcoll_status_name(st));
            else if (k >= 2)
                HCT_REQUIRE(st == HCOLL_ERR_ABORTED, "%s aborter: queued request %d -> %s",
                            w->name, k, hcoll_status_name(st));
            else
                HCT_REQUIRE(st == HCOLL_SUCCESS || st == HCOLL_ERR_ABORTED,
                            "%s aborter: running request 1 -> %s", w->name,
                            hcoll_status_name(st));
            int d;
            HCT_REQUIRE(hcoll_test(rs[k].req, &d) == st && d == 1, "test after wait");
            HCT_REQUIRE(hcoll_request_free(rs[k].req) == HCOLL_SUCCESS, "free");
            req_release(&rs[k]);
        }
        return 0;
    }

    HCT_REQUIRE(wait_flag(&w->flag[0], TIMEOUT_MS) == 0, "no abort");
    for (int k = 2; k < ABORT_NREQ; k++)
        if (req_issue(comm, rank, nranks, &rs[k]))
            return 1;
    hcoll_status_t first = HCOLL_SUCCESS;
    for (int k = 0; k < ABORT_NREQ; k++) {
        hcoll_status_t st = hcoll_wait(rs[k].req);
        double now = hct_now_ms();
        if (k == 0)
            HCT_REQUIRE(st == HCOLL_SUCCESS, "%s rank %d: request 0 -> %s (%s)", w->name, rank,
                        hcoll_status_name(st), hcoll_comm_last_error(comm));
        else if (k >= 2 || st != HCOLL_SUCCESS)
            HCT_REQUIRE(is_failure(st), "%s rank %d: request %d after the abort -> %s (%s)",
                        w->name, rank, k, hcoll_status_name(st), hcoll_comm_last_error(comm));
        if (st != HCOLL_SUCCESS && first == HCOLL_SUCCESS) {
            first = st;
            fprintf(stderr, "  %s rank %d: request %d -> %s after %.0f ms: %s\n", w->name, rank,
                    k, hcoll_status_name(st), now - a->event_ms, hcoll_comm_last_error(comm));
            a->noticed_ms[rank] = now - a->event_ms;
            /* The contract is timeout + 1 s; the library does better:
             * a failing rank resets its connections, so the failure travels
             * in milliseconds. Half the timeout catches a regression to
             * waiting out the deadline. */
            HCT_REQUIRE(now - a->event_ms <= CASCADE_TIMEOUT_MS / 2,
                        "%s rank %d: noticed the abort after %.0f ms", w->name, rank,
                        now - a->event_ms);
        }
        if (st != HCOLL_SUCCESS)
            HCT_REQUIRE(st == first, "%s rank %d: request %d -> %s after %s", w->name, rank, k,
                        hcoll_status_name(st), hcoll_status_name(first));
        HCT_OK(comm, hcoll_request_free(rs[k].req));
        req_release(&rs[k]);
    }
    if (check_sticky(w->name, rank, comm, first))
        return 1;
    double t0 = hct_now_ms();
    HCT_OK(comm, hcoll_comm_destroy(comm));
    HCT_REQUIRE(hct_now_ms() - t0 < 2000, "%s rank %d: destroy took %.0f ms", w->name, rank,
                hct_now_ms() - t0);
    return 0;
}

static void run_abort(const char *name, const int *node_sizes, int nnodes, int victim)
{
    fail_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    world_t *w = world_new(name, node_sizes, nnodes, 0, NULL);
    a->w = *w;
    hct_shared_free(w, sizeof *w);
    a->victim = victim;
    shm_list_t before;
    shm_scan(&before);
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = a->w.nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_abort, a, res);
    double worst = 0;
    for (int r = 0; r < a->w.nranks; r++)
        worst = a->noticed_ms[r] > worst ? a->noticed_ms[r] : worst;
    fprintf(stderr, "[time] abort %s (rank %d aborts): %.1f s, slowest rank noticed in %.0f ms\n",
            name, victim, (hct_now_ms() - t0) / 1e3, worst);
    ck_assert_msg(bad == 0, "abort on %s by rank %d: %d rank(s) failed (see stderr)", name,
                  victim, bad);
    const char *left = shm_leftover(&before);
    ck_assert_msg(left == NULL, "abort on %s: /dev/shm/%s left behind", name, left);
    hct_shared_free(a, sizeof *a);
}

START_TEST(abort_with_queued_requests)
{
    run_abort("2x2", (int[]){ 2, 2 }, 2, 0);
    run_abort("2x2", (int[]){ 2, 2 }, 2, 3);
    run_abort("1x3", (int[]){ 3 }, 1, 1);
    run_abort("3x1", (int[]){ 1, 1, 1 }, 3, 2);
}
END_TEST

/*
 * hcoll_comm_abort from another thread while this thread's blocking call
 * waits behind queued requests: the call returns an error, the requests
 * end, and nothing touches the freed communicator (run under ASan and TSan
 * to see the latter). The peers issue nothing until the abort is done, so
 * the first request is stuck waiting for them when the abort comes.
 */
typedef struct thr_abort {
    hcoll_comm_t comm;
    fail_arg_t *a;
    pid_t tid;   /* the caller's thread */
    int in_call; /* set just before the blocking call */
} thr_abort_t;

/* 1 when thread tid of this process sleeps in the kernel (state S). */
static int thread_sleeping(pid_t tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name in parentheses may hold spaces */
    return p && p[1] == ' ' && p[2] == 'S';
}

/* Abort once the caller is blocked in its call: asleep for 50 ms on end
 * after it said it is calling. A fixed delay (it was 30 ms) let the abort
 * come, on a loaded host or under a sanitizer, before the call was made,
 * and the call then ran on the freed communicator (a hang, or a report). */
static void *abort_later(void *p)
{
    thr_abort_t *t = p;
    const double give_up = hct_now_ms() + TIMEOUT_MS;
    double asleep_since = -1;
    while (hct_now_ms() < give_up) {
        const double now = hct_now_ms();
        if (__atomic_load_n(&t->in_call, __ATOMIC_ACQUIRE) && thread_sleeping(t->tid)) {
            if (asleep_since < 0)
                asleep_since = now;
            else if (now - asleep_since >= 50)
                break;
        } else {
            asleep_since = -1;
        }
        usleep(1000);
    }
    t->a->event_ms = hct_now_ms();
    hcoll_comm_abort(t->comm);
    return NULL;
}

static int rank_abort_blocked(int rank, int nranks, void *argp)
{
    fail_arg_t *a = argp;
    world_t *w = &a->w;
    set_hostid(w->name, w->node_of[rank]);
    hcoll_comm_t comm;
    if (open_comm(&w->slot, rank, nranks, FAIL_TIMEOUT_MS, w->chunk_bytes, &comm))
        return 1;
    req_slot_t rs[4];
    memset(rs, 0, sizeof rs);
    float *x = calloc(ABORT_COUNT, sizeof *x);
    HCT_REQUIRE(x, "no memory");
    if (rank != a->victim)
        HCT_REQUIRE(wait_flag(&w->flag[0], TIMEOUT_MS) == 0, "no abort");
    for (int k = 0; k < 4; k++) {
        rs[k].c = (ar_case_t){ HCOLL_FLOAT32, HCOLL_SUM, ABORT_COUNT, 1, K_EXACT };
        if (req_issue(comm, rank, nranks, &rs[k]))
            return 1;
    }
    pthread_t th;
    thr_abort_t t = { comm, a, gettid(), 0 };
    if (rank == a->victim)
        HCT_REQUIRE(pthread_create(&th, NULL, abort_later, &t) == 0, "pthread_create");
    __atomic_store_n(&t.in_call, 1, __ATOMIC_RELEASE);
    hcoll_status_t st = hcoll_allreduce(comm, x, x, ABORT_COUNT, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    const double returned_ms = hct_now_ms();
    __atomic_store_n(&t.in_call, 0, __ATOMIC_RELEASE);
    if (rank == a->victim) {
        pthread_join(th, NULL);
        set_flag(&w->flag[0]);
        const double dt = returned_ms - a->event_ms;
        HCT_REQUIRE(st == HCOLL_ERR_ABORTED, "%s aborter: blocked call -> %s", w->name,
                    hcoll_status_name(st));
        HCT_REQUIRE(dt < 2000, "%s aborter: blocked call returned %.0f ms after the abort",
                    w->name, dt);
    } else {
        HCT_REQUIRE(is_failure(st), "%s rank %d: blocking call -> %s", w->name, rank,
                    hcoll_status_name(st));
    }
    for (int k = 0; k < 4; k++) {
        hcoll_status_t rst = hcoll_wait(rs[k].req);
        HCT_REQUIRE(rank == a->victim ? rst == HCOLL_ERR_ABORTED : is_failure(rst),
                    "%s rank %d: request %d -> %s", w->name, rank, k, hcoll_status_name(rst));
        HCT_REQUIRE(hcoll_request_free(rs[k].req) == HCOLL_SUCCESS, "free");
        req_release(&rs[k]);
    }
    if (rank != a->victim)
        HCT_OK(comm, hcoll_comm_destroy(comm));
    free(x);
    return 0;
}

START_TEST(abort_while_blocked_behind_requests)
{
    static const struct {
        const char *name;
        int sizes[4], nnodes;
    } shapes[] = { { "1x2", { 2 }, 1 }, { "2x1", { 1, 1 }, 2 }, { "2x2", { 2, 2 }, 2 } };
#ifndef ABORT_BLOCKED_REPEAT /* -DABORT_BLOCKED_REPEAT=20 to hunt races under ASan */
#define ABORT_BLOCKED_REPEAT 1
#endif
    for (int i0 = 0; i0 < 3 * ABORT_BLOCKED_REPEAT; i0++) {
        int i = i0 % 3;
        fail_arg_t *a = hct_shared_alloc(sizeof *a);
        ck_assert_ptr_nonnull(a);
        world_t *w = world_new(shapes[i].name, shapes[i].sizes, shapes[i].nnodes, 0, NULL);
        a->w = *w;
        hct_shared_free(w, sizeof *w);
        a->victim = 0;
        const double t0 = hct_now_ms();
        hct_opts_t o = { .nranks = a->w.nranks, .timeout_ms = 60000 };
        hct_result_t res[MAX_RANKS];
        int bad = hct_run(&o, rank_abort_blocked, a, res);
        fprintf(stderr, "[time] abort while blocked %s: %.1f s\n", shapes[i].name,
                (hct_now_ms() - t0) / 1e3);
        hct_shared_free(a, sizeof *a);
        ck_assert_msg(bad == 0, "%s: %d rank(s) failed (see stderr)", shapes[i].name, bad);
    }
}
END_TEST

#define KILL_COUNT ((size_t)1 << 20)
#define KILL_CALLS 400

static void *killer_main(void *p)
{
    fail_arg_t *a = p;
    usleep((useconds_t)a->delay_us);
    a->event_ms = hct_now_ms();
    raise(SIGKILL);
    return NULL;
}

/* A series of large all-reduces; the victim dies of SIGKILL inside its
 * fourth one. The survivors fail within the timeout plus a second. */
static int rank_kill(int rank, int nranks, void *argp)
{
    fail_arg_t *a = argp;
    world_t *w = &a->w;
    set_hostid(w->name, w->node_of[rank]);
    hcoll_comm_t comm;
    if (open_comm(&w->slot, rank, nranks, CASCADE_TIMEOUT_MS, w->chunk_bytes, &comm))
        return 1;
    float *buf = malloc(KILL_COUNT * sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    for (size_t i = 0; i < KILL_COUNT; i++)
        buf[i] = (float)(i % 3);
    for (int it = 0; it < KILL_CALLS; it++) {
        if (rank == a->victim && it == 3) {
            pthread_t th;
            HCT_REQUIRE(pthread_create(&th, NULL, killer_main, a) == 0, "pthread_create");
        }
        hcoll_status_t st =
            hcoll_allreduce(comm, buf, buf, KILL_COUNT, HCOLL_FLOAT32, HCOLL_MAX, NULL);
        if (st == HCOLL_SUCCESS)
            continue;
        double now = hct_now_ms();
        HCT_REQUIRE(rank != a->victim, "%s victim: %s before it died", w->name,
                    hcoll_status_name(st));
        a->calls_before[rank] = it;
        a->noticed_ms[rank] = now - a->event_ms;
        fprintf(stderr, "  %s rank %d: call %d -> %s after %.0f ms: %s\n", w->name, rank, it,
                hcoll_status_name(st), now - a->event_ms, hcoll_comm_last_error(comm));
        HCT_REQUIRE(a->event_ms > 0, "%s rank %d: call %d -> %s (%s) before the kill", w->name,
                    rank, it, hcoll_status_name(st), hcoll_comm_last_error(comm));
        HCT_REQUIRE(is_failure(st), "%s rank %d: -> %s (%s)", w->name, rank,
                    hcoll_status_name(st), hcoll_comm_last_error(comm));
        /* The contract is timeout + 1 s; a reset cascade makes it
         * milliseconds, and half the timeout catches a regression. */
        HCT_REQUIRE(now - a->event_ms <= CASCADE_TIMEOUT_MS / 2,
                    "%s rank %d: failed %.0f ms after the kill (%s)", w->name, rank,
                    now - a->event_ms, hcoll_status_name(st));
        if (check_sticky(w->name, rank, comm, st))
            return 1;
        double t0 = hct_now_ms();
        HCT_OK(comm, hcoll_comm_destroy(comm));
        HCT_REQUIRE(hct_now_ms() - t0 < 2000, "%s rank %d: destroy took %.0f ms", w->name, rank,
                    hct_now_ms() - t0);
        free(buf);
        return 0;
    }
    HCT_REQUIRE(0, "%s rank %d: %d all-reduces and no failure", w->name, rank, KILL_CALLS);
}

static void run_kill(const char *name, const int *node_sizes, int nnodes, size_t chunk,
                     int victim, int delay_us)
{
    fail_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    world_t *w = world_new(name, node_sizes, nnodes, chunk, NULL);
    a->w = *w;
    hct_shared_free(w, sizeof *w);
    a->victim = victim;
    a->delay_us = delay_us;
    shm_list_t before;
    shm_scan(&before);
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = a->w.nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    hct_run(&o, rank_kill, a, res);
    double worst = 0;
    for (int r = 0; r < a->w.nranks; r++)
        worst = a->noticed_ms[r] > worst ? a->noticed_ms[r] : worst;
    fprintf(stderr, "[time] kill %s (rank %d, %d us into a call): %.1f s, slowest survivor "
                    "failed %.0f ms after the kill\n",
            name, victim, delay_us, (hct_now_ms() - t0) / 1e3, worst);
    for (int r = 0; r < a->w.nranks; r++) {
        if (r == victim)
            ck_assert_msg(res[r].signaled && res[r].sig == SIGKILL,
                          "kill on %s: the victim did not die of SIGKILL", name);
        else
            ck_assert_msg(res[r].exited && res[r].code == 0,
                          "kill on %s: survivor %d failed (see stderr)", name, r);
    }
    const char *left = shm_leftover(&before);
    ck_assert_msg(left == NULL, "kill on %s: /dev/shm/%s left behind", name, left);
    hct_shared_free(a, sizeof *a);
}

START_TEST(kill_intra)
{
    run_kill("1x4", (int[]){ 4 }, 1, 0, 2, 2000);
    run_kill("1x4", (int[]){ 4 }, 1, 4096, 0, 20000);
}
END_TEST

START_TEST(kill_inter)
{
    run_kill("4x1", (int[]){ 1, 1, 1, 1 }, 4, 0, 1, 2000);
    run_kill("2-2-1", (int[]){ 2, 2, 1 }, 3, 0, 4, 10000);
}
END_TEST

START_TEST(kill_3stage)
{
    run_kill("2x2", (int[]){ 2, 2 }, 2, 4096, 3, 2000);
    run_kill("2x2", (int[]){ 2, 2 }, 2, 0, 1, 20000);
    run_kill("3x2", (int[]){ 2, 2, 2 }, 3, 4096, 0, 10000);
}
END_TEST

/*
 * Once hcoll_allreduce has returned, even with an error, the library must
 * not touch the caller's buffers. Here stage 1 of piece 1 fails on node 0
 * (rank 1 passes a shorter count: the shm backend reports MISMATCH) while
 * the ring job of piece 0 is still waiting for node 1, which starts late.
 * Rank 0 then zeroes its recvbuf and looks again once node 1 is through.
 */
#define LATE_PIECE 8192 /* fp32 elements per piece: 4096 B chunk x 4 x L=2 */

static int rank_late_write(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    set_hostid(w->name, w->node_of[rank]);
    /* No agreement first: the shm step itself must find the mismatch, in
     * the middle of the pipeline (the agreement would stop it before). */
    setenv("HCOLL_CHECK_ARGS", "0", 1);
    hcoll_comm_t comm;
    if (open_comm(&w->slot, rank, nranks, 1500, 4096, &comm))
        return 1;
    const size_t count = rank == 1 ? LATE_PIECE + 100 : 3 * LATE_PIECE;
    float *buf = malloc(3 * LATE_PIECE * sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    for (size_t i = 0; i < 3 * LATE_PIECE; i++)
        buf[i] = 1.0f;
    HCT_REQUIRE(hct_barrier_wait(&w->bar, nranks, TIMEOUT_MS) == 0, "barrier");
    if (w->node_of[rank] == 1)
        usleep(600 * 1000);
    double t0 = hct_now_ms();
    hcoll_status_t st = hcoll_allreduce(comm, buf, buf, count, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    double dt = hct_now_ms() - t0;
    HCT_REQUIRE(st != HCOLL_SUCCESS, "%s rank %d: mismatched counts succeeded", w->name, rank);
    fprintf(stderr, "  %s rank %d: -> %s after %.0f ms: %s\n", w->name, rank,
            hcoll_status_name(st), dt, hcoll_comm_last_error(comm));
    if (rank == 2)
        set_flag(&w->flag[0]);
    if (rank == 0) {
        /* Zero, so that a late reduction into place shows too. */
        memset(buf, 0, 3 * LATE_PIECE * sizeof *buf);
        HCT_REQUIRE(wait_flag(&w->flag[0], TIMEOUT_MS) == 0, "node 1 never returned");
        usleep(100 * 1000);
        const unsigned char *b = (const unsigned char *)buf;
        size_t changed = 0, first = 0, last = 0;
        for (size_t i = 0; i < 3 * LATE_PIECE * sizeof *buf; i++)
            if (b[i] != 0) {
                first = changed++ ? first : i;
                last = i;
            }
        HCT_REQUIRE(changed == 0,
                    "%s rank 0: %zu bytes of recvbuf (first %zu, last %zu; float %zu is %g) "
                    "changed after hcoll_allreduce had returned %s",
                    w->name, changed, first, last, first / 4, buf[first / 4],
                    hcoll_status_name(st));
    }
    double t1 = hct_now_ms();
    HCT_OK(comm, hcoll_comm_destroy(comm));
    HCT_REQUIRE(hct_now_ms() - t1 < 2000, "%s rank %d: destroy took %.0f ms", w->name, rank,
                hct_now_ms() - t1);
    free(buf);
    return 0;
}

START_TEST(error_leaves_buffers_alone)
{
    world_t *w = world_new("2x2", (int[]){ 2, 2 }, 2, 4096, PLAN_3STAGE);
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = w->nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_late_write, w, res);
    fprintf(stderr, "[time] error leaves buffers alone: %.1f s\n", (hct_now_ms() - t0) / 1e3);
    hct_shared_free(w, sizeof *w);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Argument validation                                                        */
/* ------------------------------------------------------------------------ */

static int expect_err(hcoll_comm_t comm, hcoll_status_t got, hcoll_status_t want,
                      const char *what, const char *needle)
{
    HCT_REQUIRE(got == want, "%s -> %s, want %s", what, hcoll_status_name(got),
                hcoll_status_name(want));
    const char *msg = hcoll_comm_last_error(comm);
    HCT_REQUIRE(strstr(msg, needle), "%s: message '%s' does not mention '%s'", what, msg,
                needle);
    return 0;
}

static int rank_args(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    set_hostid(w->name, w->node_of[rank]);
    float a[64], b[64];
    hcoll_request_t rq = (hcoll_request_t)&a[0]; /* must stay untouched */

    /* No communicator: the message is this thread's. */
    if (expect_err(NULL, hcoll_allreduce(NULL, a, b, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL),
                   HCOLL_ERR_INVALID_ARG, "NULL comm", "comm"))
        return 1;
    if (expect_err(NULL,
                   hcoll_allreduce_async(NULL, a, b, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL, &rq),
                   HCOLL_ERR_INVALID_ARG, "async NULL comm", "comm"))
        return 1;
    HCT_REQUIRE(rq == (hcoll_request_t)&a[0], "req_out written on failure");

    hcoll_comm_t comm;
    if (open_comm(&w->slot, rank, nranks, TIMEOUT_MS, 0, &comm))
        return 1;
    struct {
        const void *s;
        void *r;
        size_t count;
        int dtype, op;
        void *stream;
        hcoll_status_t want;
        const char *what, *needle;
    } bad[] = {
        { NULL, b, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL, HCOLL_ERR_INVALID_ARG, "NULL sendbuf",
          "sendbuf" },
        { a, NULL, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL, HCOLL_ERR_INVALID_ARG, "NULL recvbuf",
          "recvbuf" },
        { a, b, 4, HCOLL_DTYPE_COUNT_, HCOLL_SUM, NULL, HCOLL_ERR_INVALID_ARG, "bad dtype",
          "dtype" },
        { a, b, 4, -1, HCOLL_SUM, NULL, HCOLL_ERR_INVALID_ARG, "negative dtype", "dtype" },
        { a, b, 4, HCOLL_FLOAT32, HCOLL_OP_COUNT_, NULL, HCOLL_ERR_INVALID_ARG, "bad op", "op" },
        { a, b, 4, HCOLL_INT8, 77, NULL, HCOLL_ERR_INVALID_ARG, "bad op (int8)", "op" },
        { a, a + 1, 8, HCOLL_FLOAT32, HCOLL_SUM, NULL, HCOLL_ERR_INVALID_ARG, "overlap after",
          "overlap" },
        { a + 3, a, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL, HCOLL_ERR_INVALID_ARG, "overlap before",
          "overlap" },
        { a, (char *)a + 1, 2, HCOLL_FLOAT64, HCOLL_MAX, NULL, HCOLL_ERR_INVALID_ARG,
          "overlap by a byte", "overlap" },
        /* Host buffers with a stream: "no device path here" without a CUDA
         * driver, "host memory with a stream" with one. */
        { a, b, 4, HCOLL_FLOAT32, HCOLL_SUM, (void *)0x1000,
          hc_gdr_cu(NULL, 0) ? HCOLL_ERR_INVALID_ARG : HCOLL_ERR_UNSUPPORTED, "stream",
          "stream" },
        { a, b, SIZE_MAX / 2, HCOLL_FLOAT32, HCOLL_SUM, NULL, HCOLL_ERR_INVALID_ARG,
          "huge count", "count" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hcoll_status_t st = hcoll_allreduce(comm, bad[i].s, bad[i].r, bad[i].count,
                                            (hcoll_dtype_t)bad[i].dtype, (hcoll_op_t)bad[i].op,
                                            bad[i].stream);
        if (expect_err(comm, st, bad[i].want, bad[i].what, bad[i].needle))
            return 1;
        rq = (hcoll_request_t)&a[0];
        st = hcoll_allreduce_async(comm, bad[i].s, bad[i].r, bad[i].count,
                                   (hcoll_dtype_t)bad[i].dtype, (hcoll_op_t)bad[i].op,
                                   bad[i].stream, &rq);
        if (expect_err(comm, st, bad[i].want, bad[i].what, bad[i].needle))
            return 1;
        HCT_REQUIRE(rq == (hcoll_request_t)&a[0], "%s: req_out written on failure",
                    bad[i].what);
    }
    /* Argument errors are local: the communicator still works. */
    hcoll_status_t ae;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "async error %s after argument errors",
                hcoll_status_name(ae));
    HCT_OK(comm, hcoll_allreduce(comm, NULL, NULL, 0, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    HCT_OK(comm, hcoll_allreduce(comm, a, NULL, 0, HCOLL_BFLOAT16, HCOLL_AVG, NULL));
    for (int i = 0; i < 64; i++)
        a[i] = (float)(i + rank);
    HCT_OK(comm, hcoll_allreduce(comm, a, b, 64, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    for (int i = 0; i < 64; i++)
        HCT_REQUIRE(b[i] == (float)(nranks * i + nranks * (nranks - 1) / 2),
                    "after argument errors: element %d is %g", i, b[i]);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(argument_errors)
{
    world_t *w = world_new("1x2", (int[]){ 2 }, 1, 0, PLAN_INTRA);
    hct_opts_t o = { .nranks = w->nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_args, w, res);
    hct_shared_free(w, sizeof *w);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);

    /* The same from a one-rank communicator in this process. */
    w = world_new("1x1", (int[]){ 1 }, 1, 0, PLAN_SINGLE);
    ck_assert_int_eq(rank_args(0, 1, w), 0);
    hct_shared_free(w, sizeof *w);
}
END_TEST

/* ------------------------------------------------------------------------ */

int main(void)
{
    /* Loopback only, whatever this host has. */
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_CHUNK_BYTES");
    unsetenv("HCOLL_DEBUG_FILE");
    unsetenv("HCOLL_SMALL_BYTES");

    Suite *s = suite_create("allreduce");
    TCase *shapes = tcase_create("shapes");
    tcase_set_timeout(shapes, 120);
    tcase_add_test(shapes, shape_1x1);
    tcase_add_test(shapes, shape_1x4);
    tcase_add_test(shapes, shape_4x1);
    tcase_add_test(shapes, shape_2_2_1);
    tcase_add_test(shapes, shape_2x2);
    tcase_add_test(shapes, shape_2x3);
    tcase_add_test(shapes, shape_3x2);
    tcase_add_test(shapes, shape_2x4);
    tcase_add_test(shapes, small_path_always);
    tcase_add_test(shapes, small_path_never);
    tcase_add_test(shapes, small_bytes_mismatch);
    suite_add_tcase(s, shapes);

    TCase *req = tcase_create("requests");
    tcase_set_timeout(req, 120);
    tcase_add_test(req, requests_3stage);
    tcase_add_test(req, requests_other_plans);
    tcase_add_test(req, argument_errors);
    suite_add_tcase(s, req);

    TCase *fail = tcase_create("failures");
    tcase_set_timeout(fail, 120);
    tcase_add_test(fail, abort_with_queued_requests);
    tcase_add_test(fail, abort_while_blocked_behind_requests);
    tcase_add_test(fail, kill_intra);
    tcase_add_test(fail, kill_inter);
    tcase_add_test(fail, kill_3stage);
    tcase_add_test(fail, error_leaves_buffers_alone);
    suite_add_tcase(s, fail);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
