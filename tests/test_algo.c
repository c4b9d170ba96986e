/*
 * Algorithm choice by size (core/algo.c) and the recursive doubling
 * (inter/rd.c), end to end through forked ranks in emulated nodes:
 *
 *   shape    plan     rd across N nodes
 *   2x2      3stage   N = 2: one round
 *   3x1      ring     N = 3: a fold, one round, an unfold
 *   3x2      3stage   N = 3, two rails
 *   2,2,1    flat     5 ranks: P = 4, one extra
 *
 * Every rank runs the same cases three times, on communicators made with
 * HCOLL_ALGO=rd, =ring and =auto: every dtype, every op with AVG and a
 * PREMUL_SUM op, counts 0, 1, 7, 4093, just below and above the
 * crossover (and past one rd segment under rd), in place and not. Inputs
 * are small integers, so any order of reduction is exact: results are
 * compared bit for bit with a reference here, and the hashes of every rank
 * and of the three algorithms must all be equal. hcoll_comm_last_algo must
 * name what ran. Then: a bad HCOLL_ALGO fails init with a message, and
 * ranks whose HCOLL_ALGO differs fail init with HCOLL_ERR_MISMATCH.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/elems.h"
#include "common/ranks.h"

#define MAX_RANKS 6
#define MAX_CASES 400
#define TIMEOUT_MS 30000
#define GUARD 32
#define CROSS_BYTES (64 << 10) /* counts around it: one rd slot of HCOLL_ALGO=rd:64K */
#define TABLE_RD_NODES 4        /* core/algo.c's table: rd from 4 nodes, and on 2x2 ... */
#define TABLE_RD_BYTES (256 << 10) /* ... up to 256 KiB */
#define INLINE_BYTES (64 << 10)    /* with the agreement, unless HCOLL_ALGO=ring (algo.h) */
#define NALGOS 3

static const char *const algos[NALGOS] = { "rd", "ring", "auto" };

static const hcoll_dtype_t dtypes[] = {
    HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16, HCOLL_FLOAT64,
    HCOLL_INT8,    HCOLL_UINT8,   HCOLL_INT32,    HCOLL_INT64,
};
#define NDT ((int)(sizeof dtypes / sizeof dtypes[0]))
#define OP_PREMUL ((hcoll_op_t)-1) /* stands for the PREMUL_SUM op made per dtype */
static const hcoll_op_t ops[] = { HCOLL_SUM, HCOLL_PROD, HCOLL_MAX,
                                  HCOLL_MIN, HCOLL_AVG,  OP_PREMUL };
#define NOPS ((int)(sizeof ops / sizeof ops[0]))

typedef struct tcase {
    hcoll_dtype_t dt;
    hcoll_op_t op;
    size_t count;
    int inplace;
} tcase_t;

typedef struct shape {
    hct_id_slot_t slot[NALGOS];
    char name[16];
    int nranks, nnodes;
    int node_of[MAX_RANKS];
    int ncases;
    uint64_t hash[NALGOS][MAX_CASES][MAX_RANKS];
} shape_t;

static uint64_t mix(uint64_t h)
{
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    return h;
}

/* Rank r's element i: sums, products and extremes of these are exact in
 * every dtype (AVG of floats: multiples of n, pre-scaled by 1/n exactly). */
static double gen(hcoll_op_t op, hcoll_dtype_t dt, int r, int n, size_t i)
{
    uint64_t h = mix((uint64_t)i * 1000003u + (uint64_t)r * 7919u + (uint64_t)(op + 3) * 104729u);
    const int uns = dt == HCOLL_UINT8;
    switch (op) {
    case HCOLL_PROD: return uns ? (double)(1 + h % 2) : (double)((int)(h % 3) - 1 ? 2 : -1);
    case HCOLL_MAX:
    case HCOLL_MIN: return uns ? (double)(h % 200) : (double)(h % 201) - 100.0;
    case HCOLL_AVG:
        if (is_float(dt))
            return (double)n * ((double)(h % 7) - 3.0);
        /* fall through */
    default: return uns ? (double)(h % 4) : (double)(h % 7) - 3.0;
    }
}

/* The expected element i as dtype bits in want. */
static void reference(hcoll_op_t op, hcoll_dtype_t dt, int n, size_t i, void *want)
{
    double acc = op == HCOLL_PROD ? 1 : op == HCOLL_MAX ? -1e9 : op == HCOLL_MIN ? 1e9 : 0;
    for (int r = 0; r < n; r++) {
        double v = gen(op, dt, r, n, i);
        switch ((int)op) {
        case HCOLL_PROD: acc *= v; break;
        case HCOLL_MAX: acc = v > acc ? v : acc; break;
        case HCOLL_MIN: acc = v < acc ? v : acc; break;
        case HCOLL_AVG: acc += is_float(dt) ? v / n : v; break;
        case OP_PREMUL: acc += 2 * v; break;
        default: acc += v; break;
        }
    }
    if (op == HCOLL_AVG && !is_float(dt))
        acc = (double)((int64_t)acc / n); /* C's division: toward zero */
    put(dt, want, 0, acc);
}

static uint64_t fnv(const void *p, size_t len)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int build_cases(tcase_t *c, int rd_segments)
{
    int nc = 0, k = 0;
    for (int d = 0; d < NDT; d++) {
        const size_t es = hcoll_dtype_size(dtypes[d]), x = CROSS_BYTES / es;
        const size_t counts[] = { 0, 1, 7, 4093, x, x + 1 };
        for (int o = 0; o < NOPS; o++)
            for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++, k++)
                c[nc++] = (tcase_t){ dtypes[d], ops[o], counts[j], k & 1 };
    }
    /* More than one rd slot (256 KiB): segments, under HCOLL_ALGO=rd. */
    if (rd_segments) {
        c[nc++] = (tcase_t){ HCOLL_FLOAT32, HCOLL_SUM, 150001, 0 };
        c[nc++] = (tcase_t){ HCOLL_INT8, HCOLL_MAX, 600001, 1 };
    }
    return nc;
}

static int run_one(shape_t *s, hcoll_comm_t comm, int a, int rank, int ci, const tcase_t *c,
                   unsigned char *send, unsigned char *recv)
{
    const int n = s->nranks;
    const size_t es = hcoll_dtype_size(c->dt), bytes = c->count * es;
    hcoll_op_t op = c->op;
    if (c->op == OP_PREMUL) {
        unsigned char two[8];
        put(c->dt, two, 0, 2.0);
        HCT_OK(comm, hcoll_op_create_premul_sum(comm, two, c->dt, HCOLL_SCALAR_HOST_IMMEDIATE,
                                                &op));
    }
    unsigned char *in = c->inplace ? recv : send;
    memset(recv, 0x5a, bytes + GUARD);
    for (size_t i = 0; i < c->count; i++)
        put(c->dt, in, i, gen(c->op, c->dt, rank, n, i));
    hcoll_status_t st = hcoll_allreduce(comm, in, recv, c->count, c->dt, op, NULL);
    if (c->op == OP_PREMUL)
        HCT_OK(comm, hcoll_op_destroy(comm, op));
    HCT_REQUIRE(st == HCOLL_SUCCESS, "%s %s rank %d case %d (%s op %d count %zu): %s (%s)",
                s->name, algos[a], rank, ci, hcoll_dtype_name(c->dt), (int)c->op, c->count,
                hcoll_status_name(st), hcoll_comm_last_error(comm));
    unsigned char want[8];
    for (size_t i = 0; i < c->count; i++) {
        reference(c->op, c->dt, n, i, want);
        HCT_REQUIRE(memcmp(recv + i * es, want, es) == 0,
                    "%s %s rank %d: %s op %d count %zu: element %zu is %g, want %g", s->name,
                    algos[a], rank, hcoll_dtype_name(c->dt), (int)c->op, c->count, i,
                    get(c->dt, recv, i), get(c->dt, want, 0));
    }
    for (size_t g = 0; g < GUARD; g++)
        HCT_REQUIRE(recv[bytes + g] == 0x5a, "%s %s rank %d: wrote past the end", s->name,
                    algos[a], rank);
    s->hash[a][ci][rank] = fnv(recv, bytes);

    /* What ran, as hcoll_comm_last_algo says. */
    const char *name = NULL;
    HCT_OK(comm, hcoll_comm_last_algo(comm, &name));
    const int rd = a == 0 || (a == 2 && ((bytes > 0 && bytes <= INLINE_BYTES) ||
                                         ((s->nnodes >= TABLE_RD_NODES ||
                                           (s->nnodes == 2 && s->nranks == 4)) &&
                                          bytes <= TABLE_RD_BYTES)));
    HCT_REQUIRE(rd ? strcmp(name, "rd") == 0 : strstr(name, "ring") != NULL,
                "%s %s: %zu bytes ran '%s'", s->name, algos[a], bytes, name);
    return 0;
}

static int rank_main(int rank, int nranks, void *arg)
{
    shape_t *s = arg;
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-algo-%d-%s-node%d", (int)getppid(), s->name,
             s->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    /* auto's limits from the fixed table (the probe's depend on the host's
     * load; test_algo_model.c covers the model). */
    setenv("HCOLL_ALGO_MODEL", "table", 1);
    static tcase_t cases[MAX_CASES];
    /* Room for the largest case and its guard (150001 float32 is 600004
     * bytes: a fixed 600001 let the guard's memset overrun it, ASan). */
    size_t maxb = 0;
    for (int i = 0, nc = build_cases(cases, 1); i < nc; i++)
        if (cases[i].count * hcoll_dtype_size(cases[i].dt) + GUARD > maxb)
            maxb = cases[i].count * hcoll_dtype_size(cases[i].dt) + GUARD;
    unsigned char *send = malloc(maxb), *recv = malloc(maxb);
    HCT_REQUIRE(send && recv, "no memory");
    for (int a = 0; a < NALGOS; a++) {
        const int nc = build_cases(cases, a == 0);
        if (rank == 0 && a == 0)
            s->ncases = nc;
        setenv("HCOLL_ALGO", algos[a], 1);
        hcoll_unique_id_t id;
        hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
        cfg.timeout_ms = TIMEOUT_MS;
        HCT_REQUIRE(hct_share_unique_id(&s->slot[a], rank, TIMEOUT_MS, &id) == 0, "no id");
        hcoll_comm_t comm;
        HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
        for (int i = 0; i < nc; i++)
            if (run_one(s, comm, a, rank, i, &cases[i], send, recv)) {
                hcoll_comm_abort(comm);
                return 1;
            }
        HCT_OK(comm, hcoll_comm_destroy(comm));
    }
    free(send);
    free(recv);
    return 0;
}

static void run_shape(const char *name, const int *sizes, int nnodes)
{
    shape_t *s = hct_shared_alloc(sizeof *s);
    ck_assert_ptr_nonnull(s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->nnodes = nnodes;
    for (int nd = 0; nd < nnodes; nd++)
        for (int k = 0; k < sizes[nd]; k++)
            s->node_of[s->nranks++] = nd;
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = s->nranks, .timeout_ms = 240000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_main, s, res);
    fprintf(stderr, "[time] algo shape %s: %.1f s\n", name, (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "shape %s: %d rank(s) failed (see stderr)", name, bad);
    /* One result everywhere: every rank, and rd, ring and auto alike. */
    for (int i = 0; i < s->ncases; i++)
        for (int a = 0; a < NALGOS; a++)
            for (int r = 0; r < s->nranks; r++) {
                /* The segment cases ran under rd only. */
                if (a > 0 && i >= s->ncases - 2)
                    continue;
                ck_assert_msg(s->hash[a][i][r] == s->hash[0][i][0],
                              "shape %s case %d: %s on rank %d differs from rd on rank 0",
                              name, i, algos[a], r);
            }
    hct_shared_free(s, sizeof *s);
}

START_TEST(rd_2x2) { run_shape("2x2", (int[]){ 2, 2 }, 2); }
END_TEST
START_TEST(rd_3x1) { run_shape("3x1", (int[]){ 1, 1, 1 }, 3); }
END_TEST
START_TEST(rd_3x2) { run_shape("3x2", (int[]){ 2, 2, 2 }, 3); }
END_TEST
START_TEST(rd_uneven) { run_shape("221", (int[]){ 2, 2, 1 }, 3); }
END_TEST

/* ------------------------------------------------------------------------ */
/* Bad and unequal HCOLL_ALGO                                                 */
/* ------------------------------------------------------------------------ */

typedef struct bad_arg {
    hct_id_slot_t slot;
    const char *value[2]; /* for even and odd ranks */
    hcoll_status_t want;
    const char *text;     /* in the message */
} bad_arg_t;

static int rank_bad(int rank, int nranks, void *argp)
{
    bad_arg_t *b = argp;
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-algo-bad-%d-node%d", (int)getppid(), rank / 2);
    setenv("HCOLL_HOSTID", hostid, 1);
    setenv("HCOLL_ALGO", b->value[rank & 1], 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = TIMEOUT_MS;
    HCT_REQUIRE(hct_share_unique_id(&b->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    hcoll_comm_t comm = NULL;
    hcoll_status_t st = hcoll_comm_init(&comm, nranks, rank, &id, &cfg);
    const char *msg = hcoll_comm_last_error(NULL);
    HCT_REQUIRE(st == b->want, "HCOLL_ALGO=%s: init -> %s, want %s", b->value[rank & 1],
                hcoll_status_name(st), hcoll_status_name(b->want));
    HCT_REQUIRE(msg && strstr(msg, b->text), "HCOLL_ALGO=%s: message '%s'", b->value[rank & 1],
                msg ? msg : "(none)");
    return 0;
}

static void run_bad(const char *even, const char *odd, hcoll_status_t want, const char *text)
{
    bad_arg_t *b = hct_shared_alloc(sizeof *b);
    ck_assert_ptr_nonnull(b);
    b->value[0] = even;
    b->value[1] = odd;
    b->want = want;
    b->text = text;
    hct_opts_t o = { .nranks = 4, .timeout_ms = 60000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_bad, b, res);
    ck_assert_msg(bad == 0, "HCOLL_ALGO=%s/%s: %d rank(s) failed", even, odd, bad);
    hct_shared_free(b, sizeof *b);
}

START_TEST(bad_value)
{
    run_bad("fastest", "fastest", HCOLL_ERR_INVALID_ARG, "HCOLL_ALGO: bad algorithm 'fastest'");
    run_bad("bcast=rd", "bcast=rd", HCOLL_ERR_INVALID_ARG, "unknown collective 'bcast'");
    run_bad("rd:12Q", "rd:12Q", HCOLL_ERR_INVALID_ARG, "HCOLL_ALGO: bad algorithm");
}
END_TEST

START_TEST(unequal_values)
{
    run_bad("rd", "allreduce=ring", HCOLL_ERR_MISMATCH, "HCOLL_ALGO");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("algo");
    TCase *t = tcase_create("rd");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, rd_2x2);
    tcase_add_test(t, rd_3x1);
    tcase_add_test(t, rd_3x2);
    tcase_add_test(t, rd_uneven);
    suite_add_tcase(s, t);
    TCase *b = tcase_create("knob");
    tcase_set_timeout(b, 120);
    tcase_add_test(b, bad_value);
    tcase_add_test(b, unequal_values);
    suite_add_tcase(s, b);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
