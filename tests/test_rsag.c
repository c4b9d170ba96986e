/*
 * Reduce-scatter and all-gather end to end, through communicators of forked
 * ranks grouped into emulated nodes (HCOLL_HOSTID), on every plan:
 *
 *   layout (ranks' nodes)     plan
 *   1x1                       single
 *   1x4                       intra (shared memory only)
 *   4x1                       ring (one rank per node)
 *   2x2 2x3 3x2               3stage
 *   0,1,0,1 (interleaved)     3stage with ranks that are not node-major
 *   0,0,1 (uneven)            flat
 *
 * 2x2 and 3x2 run again with HCOLL_CHECK_ARGS=0: a few bytes travel with
 * the argument agreement (hcoll_comm_last_algo "rd"), so without it the
 * ring's phases run at the small counts too ("ring-rsag"). 2x2 and 2x3
 * run again with slow given links, where count 7 travels split (each
 * rail's rd on its local rank's shard, then the node's all-gather).
 *
 * Reduce-scatter: counts 0, 1, 7, 4093 and 2^20+3, in and out of place,
 * fp32 SUM, AVG, MAX, int32 AVG and an fp32 PREMUL_SUM with a scalar per
 * rank. Inputs are chosen so that every order of reduction gives the same
 * bits (small integers; for float AVG one power of two per element, times
 * 1/n), so every rank checks its block bit for bit against a serial
 * reference; also nothing written past the end, the sendbuf (and in place
 * the other blocks) untouched. All-gather: the same counts, random bytes
 * of several dtypes, bit for bit. The _async twins interleaved with
 * all-reduces, with completion callbacks (exactly once); split
 * communicators (one rank per node on each rail, one node); mismatched
 * arguments (count, dtype, op, collective) fail on every rank with
 * HCOLL_ERR_MISMATCH and leave the communicator usable; a rank calling the
 * all-reduce against reduce-scatters fails everywhere instead of hanging;
 * a killed rank makes the others fail promptly.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"

#define MAX_RANKS 8
#define TIMEOUT_MS 20000
#define GUARD 64
#define BIG_COUNT (((size_t)1 << 20) + 3)

static const size_t counts[] = { 0, 1, 7, 4093, BIG_COUNT };
#define NCOUNTS ((int)(sizeof counts / sizeof counts[0]))

typedef struct world {
    hct_id_slot_t slot, slot2;
    char name[32];
    int nranks;
    int node_of[MAX_RANKS];
    int nocheck; /* HCOLL_CHECK_ARGS=0: no agreement, so the ring's phases at every count */
} world_t;

static world_t *world_new(const char *name, const int *node_of, int nranks)
{
    world_t *w = hct_shared_alloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->nranks = nranks;
    memcpy(w->node_of, node_of, (size_t)nranks * sizeof *node_of);
    return w;
}

static int open_comm_at(world_t *w, hct_id_slot_t *slot, int rank, int nranks,
                        hcoll_comm_t *comm_out)
{
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-rsag-%d-%s-node%d", (int)getppid(), w->name,
             w->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.chunk_bytes = 4096; /* many chunks and pieces even for small vectors */
    HCT_REQUIRE(hct_share_unique_id(slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    setenv("HCOLL_CHECK_ARGS", w->nocheck ? "0" : "1", 1);
    /* Given link figures (fast links): the inline limits are the cap, on
     * every host, whatever a probe would find under load. A "split" world:
     * slow links, so that inline vectors of 64 bytes and more travel split
     * (one shard per rail, then the node's all-gather: "rd-split"). */
    setenv("HCOLL_ALGO_MODEL", strstr(w->name, "split") ? "1:10" : "100:1000", 1);
    hcoll_status_t st = hcoll_comm_init(comm_out, nranks, rank, &id, &cfg);
    unsetenv("HCOLL_CHECK_ARGS");
    unsetenv("HCOLL_ALGO_MODEL");
    HCT_OK(NULL, st);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Inputs and the serial reference                                            */
/* ------------------------------------------------------------------------ */

enum rs_case { RS_SUM, RS_AVG, RS_MAX, RS_IAVG, RS_PREMUL, RS_NCASES };
static const char *const case_names[] = { "fp32 sum", "fp32 avg", "fp32 max", "int32 avg",
                                          "fp32 premul" };

static float premul_scalar(int rank)
{
    static const float s[] = { 0.5f, 2.0f, 0.25f };
    return s[rank % 3];
}

/* Rank r's element g (of its nranks x count sendbuf) for case cs: values
 * whose sums are exact in any order. */
static float fval(int cs, int r, int nranks, size_t g)
{
    if (cs == RS_AVG) { /* one power of two per element, from one rank */
        if ((g + (size_t)r) % (size_t)nranks != 0)
            return 0.0f;
        float v = (float)(1u << ((g / 3 + (size_t)r) % 7));
        return (g & 1) ? -v : v;
    }
    return (float)((int)(((size_t)r * 7 + g * 13) % 61) - 30);
}

static int32_t ival(int r, size_t g)
{
    return (int32_t)(((size_t)r * 17 + g * 31) % 1001) - 500;
}

static void fill_input(int cs, int rank, int nranks, void *buf, size_t n)
{
    for (size_t g = 0; g < n; g++) {
        if (cs == RS_IAVG)
            ((int32_t *)buf)[g] = ival(rank, g);
        else
            ((float *)buf)[g] = fval(cs, rank, nranks, g);
    }
}

/* The reference of element g of the full vector (rank order fold; exact). */
static uint32_t ref_bits(int cs, int nranks, size_t g)
{
    uint32_t bits;
    if (cs == RS_IAVG) {
        int64_t sum = 0;
        for (int r = 0; r < nranks; r++)
            sum += ival(r, g);
        int32_t v = (int32_t)(sum / nranks);
        memcpy(&bits, &v, 4);
        return bits;
    }
    float acc = 0.0f;
    const float inv = 1.0f / (float)nranks;
    for (int r = 0; r < nranks; r++) {
        float v = fval(cs, r, nranks, g);
        switch (cs) {
        case RS_MAX: acc = r == 0 || v > acc ? v : acc; break;
        case RS_AVG: acc += v * inv; break;
        case RS_PREMUL: acc += v * premul_scalar(r); break;
        default: acc += v; break;
        }
    }
    memcpy(&bits, &acc, 4);
    return bits;
}

/* ------------------------------------------------------------------------ */
/* One reduce-scatter, one all-gather                                         */
/* ------------------------------------------------------------------------ */

static int rs_case(world_t *w, hcoll_comm_t comm, int rank, int cs, size_t count, int inplace,
                   unsigned char *big, unsigned char *out)
{
    const int n = w->nranks;
    const size_t total = count * (size_t)n, bytes = count * 4;
    fill_input(cs, rank, n, big, total);
    memset(big + total * 4, 0xa5, GUARD);
    memset(out, 0xa5, bytes + GUARD);
    hcoll_op_t op = cs == RS_MAX ? HCOLL_MAX : cs == RS_SUM ? HCOLL_SUM : HCOLL_AVG;
    hcoll_dtype_t dt = cs == RS_IAVG ? HCOLL_INT32 : HCOLL_FLOAT32;
    if (cs == RS_PREMUL) {
        float s = premul_scalar(rank);
        HCT_OK(comm, hcoll_op_create_premul_sum(comm, &s, HCOLL_FLOAT32,
                                                HCOLL_SCALAR_HOST_IMMEDIATE, &op));
    }
    unsigned char *recv = inplace ? big + (size_t)rank * bytes : out;
    hcoll_status_t st = hcoll_reduce_scatter(comm, count ? big : NULL, count ? recv : NULL,
                                             count, dt, op, NULL);
    if (cs == RS_PREMUL)
        HCT_OK(comm, hcoll_op_destroy(comm, op));
    HCT_REQUIRE(st == HCOLL_SUCCESS, "%s rank %d: rs %s count %zu%s -> %s (%s)", w->name, rank,
                case_names[cs], count, inplace ? " in place" : "", hcoll_status_name(st),
                hcoll_comm_last_error(comm));
    for (size_t i = 0; i < count; i++) {
        uint32_t got, want = ref_bits(cs, n, (size_t)rank * count + i);
        memcpy(&got, recv + i * 4, 4);
        HCT_REQUIRE(got == want, "%s rank %d: rs %s count %zu%s: element %zu is %08x, want %08x",
                    w->name, rank, case_names[cs], count, inplace ? " in place" : "", i, got,
                    want);
    }
    /* The rest of sendbuf (all of it out of place) is left alone. */
    for (int b = 0; b < n; b++) {
        if (inplace && b == rank)
            continue;
        for (size_t i = 0; i < count; i++) {
            size_t g = (size_t)b * count + i;
            uint32_t got, want;
            memcpy(&got, big + g * 4, 4);
            if (cs == RS_IAVG) {
                int32_t v = ival(rank, g);
                memcpy(&want, &v, 4);
            } else {
                float v = fval(cs, rank, n, g);
                memcpy(&want, &v, 4);
            }
            HCT_REQUIRE(got == want, "%s rank %d: rs %s count %zu: sendbuf element %zu changed",
                        w->name, rank, case_names[cs], count, g);
        }
    }
    for (size_t g = 0; g < GUARD; g++) {
        HCT_REQUIRE(big[total * 4 + g] == 0xa5, "%s rank %d: wrote past sendbuf", w->name, rank);
        HCT_REQUIRE(inplace || out[bytes + g] == 0xa5, "%s rank %d: rs wrote %zu bytes past "
                    "recvbuf", w->name, rank, g + 1);
    }
    return 0;
}

static void fill_bytes(unsigned char *p, size_t bytes, uint64_t seed)
{
    uint64_t h = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < bytes; i++) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        p[i] = (unsigned char)(h >> 24);
    }
}

static int ag_case(world_t *w, hcoll_comm_t comm, int rank, size_t count, hcoll_dtype_t dt,
                   int inplace, unsigned char *big, unsigned char *in, unsigned char *want)
{
    const int n = w->nranks;
    const size_t bytes = count * hcoll_dtype_size(dt), total = bytes * (size_t)n;
    for (int r = 0; r < n; r++)
        fill_bytes(want + (size_t)r * bytes, bytes, (uint64_t)r * 7919 + count * 31 + dt);
    memset(big, 0xa5, total + GUARD);
    unsigned char *send = inplace ? big + (size_t)rank * bytes : in;
    memcpy(send, want + (size_t)rank * bytes, bytes);
    hcoll_status_t st =
        hcoll_allgather(comm, count ? send : NULL, count ? big : NULL, count, dt, NULL);
    HCT_REQUIRE(st == HCOLL_SUCCESS, "%s rank %d: ag %s count %zu%s -> %s (%s)", w->name, rank,
                hcoll_dtype_name(dt), count, inplace ? " in place" : "", hcoll_status_name(st),
                hcoll_comm_last_error(comm));
    for (size_t i = 0; i < total; i++)
        HCT_REQUIRE(big[i] == want[i], "%s rank %d: ag %s count %zu%s: byte %zu (block %zu) is "
                    "%02x, want %02x", w->name, rank, hcoll_dtype_name(dt), count,
                    inplace ? " in place" : "", i, i / bytes, big[i], want[i]);
    for (size_t g = 0; g < GUARD; g++)
        HCT_REQUIRE(big[total + g] == 0xa5, "%s rank %d: ag wrote past recvbuf", w->name, rank);
    if (!inplace)
        HCT_REQUIRE(memcmp(in, want + (size_t)rank * bytes, bytes) == 0,
                    "%s rank %d: ag changed sendbuf", w->name, rank);
    return 0;
}

static const hcoll_dtype_t ag_dtypes[] = { HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_INT8,
                                           HCOLL_FLOAT64, HCOLL_INT32, HCOLL_BFLOAT16 };

/* A vector of a few bytes across nodes travels with the argument
 * agreement (rd); without the agreement, the ring's phases. In a split
 * world, count 7 (at least 64 bytes in all) travels split. */
static int algo_is(world_t *w, hcoll_comm_t comm, int rank, const char *what, size_t count)
{
    int nnodes;
    const char *name;
    HCT_OK(comm, hcoll_comm_node_count(comm, &nnodes));
    HCT_OK(comm, hcoll_comm_last_algo(comm, &name));
    const char *want = nnodes == 1 ? NULL : w->nocheck ? "ring-rsag" : "rd";
    if (count == 7)
        want = strstr(w->name, "split") ? "rd-split" : NULL;
    HCT_REQUIRE(!want || strcmp(name, want) == 0, "%s rank %d: a %s of count %zu ran '%s', want "
                "'%s'", w->name, rank, what, count, name, want);
    return 0;
}

static int rank_layout(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm_at(w, &w->slot, rank, nranks, &comm))
        return 1;
    const size_t max = BIG_COUNT * 8 * (size_t)nranks + GUARD;
    unsigned char *big = malloc(max), *small = malloc(BIG_COUNT * 8 + GUARD),
                  *want = malloc(max);
    HCT_REQUIRE(big && small && want, "no memory");
    int rc = 0;
    for (int ci = 0; ci < NCOUNTS && !rc; ci++) {
        const size_t count = counts[ci];
        /* The big vector (many pieces), once each way: by layout, fp32
         * sum out of place or int32 avg (the ring divides) in place; an
         * all-gather in place. Every case at the other counts. */
        const int bigc = count == BIG_COUNT, odd = w->node_of[nranks - 1] % 2;
        for (int cs = 0; cs < RS_NCASES && !rc; cs++)
            for (int ip = 0; ip < 2 && !rc; ip++) {
                if (bigc && !(cs == RS_SUM && !ip && !odd) && !(cs == RS_IAVG && ip && odd))
                    continue;
                rc = rs_case(w, comm, rank, cs, count, ip, big, small);
            }
        if (!rc && (count == 1 || count == 7))
            rc = algo_is(w, comm, rank, "reduce-scatter", count);
        for (int ip = bigc; ip < 2 && !rc; ip++)
            rc = ag_case(w, comm, rank, count, ag_dtypes[(ci + ip) % 6], ip, big, small, want);
        if (!rc && (count == 1 || count == 7))
            rc = algo_is(w, comm, rank, "all-gather", count);
    }
    if (rc) {
        hcoll_comm_abort(comm);
        return rc;
    }
    hcoll_stage_times_t t;
    HCT_OK(comm, hcoll_comm_last_stage_times(comm, &t));
    HCT_REQUIRE(t.total_us > 0, "%s: total_us %.1f", w->name, t.total_us);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    free(big);
    free(small);
    free(want);
    return 0;
}

static void run_world(const char *name, const int *node_of, int nranks, hct_rank_fn fn)
{
    world_t *w = world_new(name, node_of, nranks);
    w->nocheck = strstr(name, "nocheck") != NULL;
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, fn, w, res);
    fprintf(stderr, "[time] %s: %.1f s\n", name, (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "%s: %d rank(s) failed (see stderr)", name, bad);
    hct_shared_free(w, sizeof *w);
}

#define RUN(name, fn, ...)                                                      \
    do {                                                                        \
        const int nodes_[] = { __VA_ARGS__ };                                   \
        run_world(name, nodes_, (int)(sizeof nodes_ / sizeof nodes_[0]), fn);   \
    } while (0)

START_TEST(layout_small_plans)
{
    RUN("1x1", rank_layout, 0);
    RUN("1x4", rank_layout, 0, 0, 0, 0);
}
END_TEST

START_TEST(layout_4x1)
{
    RUN("4x1", rank_layout, 0, 1, 2, 3);
}
END_TEST

START_TEST(layout_2x2)
{
    RUN("2x2", rank_layout, 0, 0, 1, 1);
    RUN("2x2-nocheck", rank_layout, 0, 0, 1, 1);
    RUN("2x2-split", rank_layout, 0, 0, 1, 1);
}
END_TEST

START_TEST(layout_3x2)
{
    RUN("3x2", rank_layout, 0, 0, 1, 1, 2, 2);
    RUN("3x2-nocheck", rank_layout, 0, 0, 1, 1, 2, 2);
}
END_TEST

START_TEST(layout_2x3)
{
    RUN("2x3", rank_layout, 0, 0, 0, 1, 1, 1);
    RUN("2x3-split", rank_layout, 0, 0, 0, 1, 1, 1);
}
END_TEST

START_TEST(layout_interleaved)
{
    RUN("0101", rank_layout, 0, 1, 0, 1);
}
END_TEST

START_TEST(layout_uneven)
{
    RUN("0-0-1", rank_layout, 0, 0, 1);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Async twins and callbacks                                                  */
/* ------------------------------------------------------------------------ */

#define NREQ 12
#define ACOUNT 3001

static void cb_count(hcoll_request_t req, hcoll_status_t st, void *arg)
{
    (void)req;
    atomic_int *n = arg;
    atomic_fetch_add(n, st == HCOLL_SUCCESS ? 1 : 1000);
}

static int rank_async(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm_at(w, &w->slot, rank, nranks, &comm))
        return 1;
    const size_t n = ACOUNT, total = n * (size_t)nranks;
    static int32_t in[NREQ][ACOUNT * MAX_RANKS], out[NREQ][ACOUNT * MAX_RANKS];
    static atomic_int calls[NREQ];
    hcoll_request_t rq[NREQ];
    for (int k = 0; k < NREQ; k++) {
        for (size_t g = 0; g < total; g++)
            in[k][g] = (int32_t)(g * 3 + (size_t)k) + rank;
        switch (k % 3) {
        case 0:
            HCT_OK(comm, hcoll_reduce_scatter_async(comm, in[k], out[k], n, HCOLL_INT32,
                                                    HCOLL_SUM, NULL, &rq[k]));
            break;
        case 1:
            HCT_OK(comm, hcoll_allgather_async(comm, in[k], out[k], n, HCOLL_INT32, NULL,
                                               &rq[k]));
            break;
        default:
            HCT_OK(comm, hcoll_allreduce_async(comm, in[k], out[k], total, HCOLL_INT32,
                                               HCOLL_SUM, NULL, &rq[k]));
        }
        HCT_OK(comm, hcoll_request_set_callback(rq[k], cb_count, &calls[k]));
    }
    for (int k = NREQ - 1; k >= 0; k--) {
        HCT_OK(comm, hcoll_wait(rq[k]));
        hcoll_stage_times_t t;
        HCT_OK(comm, hcoll_request_stage_times(rq[k], &t));
        HCT_REQUIRE(t.total_us > 0, "request %d: total_us %.1f", k, t.total_us);
        HCT_OK(comm, hcoll_request_free(rq[k]));
        HCT_REQUIRE(atomic_load(&calls[k]) == 1, "%s rank %d: request %d: callback ran %d "
                    "times", w->name, rank, k, atomic_load(&calls[k]));
    }
    const int32_t rsum = nranks * (nranks - 1) / 2;
    for (int k = 0; k < NREQ; k++) {
        for (size_t i = 0; i < (k % 3 == 0 ? n : total); i++) {
            int32_t want;
            if (k % 3 == 0) /* my block, summed */
                want = nranks * (int32_t)(((size_t)rank * n + i) * 3 + (size_t)k) + rsum;
            else if (k % 3 == 1) /* block r = rank r's first n elements */
                want = (int32_t)((i % n) * 3 + (size_t)k) + (int32_t)(i / n);
            else
                want = nranks * (int32_t)(i * 3 + (size_t)k) + rsum;
            HCT_REQUIRE(out[k][i] == want, "%s rank %d: request %d element %zu is %d, want %d",
                        w->name, rank, k, i, out[k][i], want);
        }
    }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(async_and_callbacks)
{
    RUN("a2x2", rank_async, 0, 0, 1, 1);
    RUN("a3x1", rank_async, 0, 1, 2);
    RUN("a1x3", rank_async, 0, 0, 0);
    RUN("a0-0-1", rank_async, 0, 0, 1);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Split communicators                                                        */
/* ------------------------------------------------------------------------ */

/* A 2x2 world split by local rank (two groups of one rank per node, each
 * on its own rail) and by node (two one-node groups), used at once:
 * each child's ranks, blocks and maps are its own. */
static int rank_split(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t world, rail, node;
    if (open_comm_at(w, &w->slot, rank, nranks, &world))
        return 1;
    int lr;
    HCT_OK(world, hcoll_comm_local_rank(world, &lr));
    HCT_OK(world, hcoll_comm_split(world, lr, rank, NULL, &rail));
    HCT_OK(world, hcoll_comm_split(world, w->node_of[rank], -rank, NULL, &node));
    hcoll_comm_t kids[2] = { rail, node };
    for (int k = 0; k < 2; k++) {
        int cr, cn;
        HCT_OK(kids[k], hcoll_comm_rank(kids[k], &cr));
        HCT_OK(kids[k], hcoll_comm_size(kids[k], &cn));
        enum { C = 5003 };
        static int32_t in[C * MAX_RANKS], out[C], all[C * MAX_RANKS];
        for (int g = 0; g < C * cn; g++)
            in[g] = g * 5 + cr * 11 + k;
        HCT_OK(kids[k], hcoll_reduce_scatter(kids[k], in, out, C, HCOLL_INT32, HCOLL_SUM, NULL));
        for (int i = 0; i < C; i++) {
            int32_t want = cn * ((cr * C + i) * 5 + k) + 11 * cn * (cn - 1) / 2;
            HCT_REQUIRE(out[i] == want, "%s rank %d child %d (rank %d of %d): rs element %d "
                        "is %d, want %d", w->name, rank, k, cr, cn, i, out[i], want);
        }
        HCT_OK(kids[k], hcoll_allgather(kids[k], out, all, C, HCOLL_INT32, NULL));
        for (int g = 0; g < C * cn; g++) {
            int32_t want = cn * (g * 5 + k) + 11 * cn * (cn - 1) / 2;
            HCT_REQUIRE(all[g] == want, "%s rank %d child %d: ag element %d is %d, want %d",
                        w->name, rank, k, g, all[g], want);
        }
    }
    HCT_OK(node, hcoll_comm_destroy(node));
    HCT_OK(rail, hcoll_comm_destroy(rail));
    HCT_OK(world, hcoll_comm_destroy(world));
    return 0;
}

START_TEST(split_children)
{
    RUN("s2x2", rank_split, 0, 0, 1, 1);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Mismatched arguments and bad input                                         */
/* ------------------------------------------------------------------------ */

static int expect_mismatch(world_t *w, hcoll_comm_t comm, int rank, hcoll_status_t st,
                           const char *what)
{
    HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "%s rank %d: %s -> %s (%s)", w->name, rank, what,
                hcoll_status_name(st), hcoll_comm_last_error(comm));
    /* Every rank failed alike after a complete exchange: not sticky. */
    static int32_t v[64];
    for (int i = 0; i < 64; i++)
        v[i] = rank;
    HCT_OK(comm, hcoll_allreduce(comm, v, v, 64, HCOLL_INT32, HCOLL_SUM, NULL));
    HCT_REQUIRE(v[7] == w->nranks * (w->nranks - 1) / 2, "%s: after %s got %d", w->name, what,
                v[7]);
    return 0;
}

static int rank_mismatch(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm_at(w, &w->slot, rank, nranks, &comm))
        return 1;
    static float big[1000 * MAX_RANKS], small[1000];
    const int last = rank == nranks - 1;
    hcoll_status_t st;
    st = hcoll_reduce_scatter(comm, big, small, last ? 999 : 1000, HCOLL_FLOAT32, HCOLL_SUM,
                              NULL);
    if (expect_mismatch(w, comm, rank, st, "rs counts"))
        return 1;
    st = hcoll_reduce_scatter(comm, big, small, 500, last ? HCOLL_INT32 : HCOLL_FLOAT32,
                              HCOLL_SUM, NULL);
    if (expect_mismatch(w, comm, rank, st, "rs dtypes"))
        return 1;
    st = hcoll_reduce_scatter(comm, big, small, 500, HCOLL_FLOAT32, last ? HCOLL_MAX : HCOLL_SUM,
                              NULL);
    if (expect_mismatch(w, comm, rank, st, "rs ops"))
        return 1;
    st = last ? hcoll_allgather(comm, small, big, 700, HCOLL_FLOAT32, NULL)
              : hcoll_reduce_scatter(comm, big, small, 700, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    if (expect_mismatch(w, comm, rank, st, "rs against ag"))
        return 1;
    st = hcoll_allgather(comm, small, big, last ? 3 : 4, HCOLL_FLOAT32, NULL);
    if (expect_mismatch(w, comm, rank, st, "ag counts"))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));

    /* Against an all-reduce, which checks nothing first: every rank fails
     * (the data plane then is sticky-failed), none hangs. */
    if (open_comm_at(w, &w->slot2, rank, nranks, &comm))
        return 1;
    st = last ? hcoll_allreduce(comm, big, big, 1000, HCOLL_FLOAT32, HCOLL_SUM, NULL)
              : hcoll_reduce_scatter(comm, big, small, 1000, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    HCT_REQUIRE(st != HCOLL_SUCCESS, "%s rank %d: rs against all-reduce succeeded", w->name,
                rank);
    hcoll_comm_abort(comm);
    return 0;
}

START_TEST(mismatch)
{
    RUN("m2x2", rank_mismatch, 0, 0, 1, 1);
    RUN("m3x1", rank_mismatch, 0, 1, 2);
    RUN("m1x3", rank_mismatch, 0, 0, 0);
    RUN("m0-0-1", rank_mismatch, 0, 0, 1);
}
END_TEST

static int rank_args(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm_at(w, &w->slot, rank, nranks, &comm))
        return 1;
    static float x[4 * MAX_RANKS], y[4];
    hcoll_request_t rq;
    struct {
        hcoll_status_t st;
        const char *what;
    } c[] = {
        { hcoll_reduce_scatter(comm, NULL, y, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL), "rs send NULL" },
        { hcoll_reduce_scatter(comm, x, NULL, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL), "rs recv NULL" },
        { hcoll_reduce_scatter(comm, x, y, 4, (hcoll_dtype_t)99, HCOLL_SUM, NULL), "rs dtype" },
        { hcoll_reduce_scatter(comm, x, y, 4, HCOLL_FLOAT32, (hcoll_op_t)77, NULL), "rs op" },
        /* Overlapping, but not at this rank's block. */
        { hcoll_reduce_scatter(comm, x, x + 4 * ((rank + 1) % nranks) + 1, 4, HCOLL_FLOAT32,
                               HCOLL_SUM, NULL), "rs overlap" },
        { hcoll_reduce_scatter(comm, x, y, (size_t)-1 / 2, HCOLL_FLOAT32, HCOLL_SUM, NULL),
          "rs huge" },
        { hcoll_reduce_scatter_async(comm, x, y, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL, NULL),
          "rs req_out NULL" },
        { hcoll_allgather(comm, NULL, x, 4, HCOLL_FLOAT32, NULL), "ag send NULL" },
        { hcoll_allgather(comm, y, x, 4, (hcoll_dtype_t)-1, NULL), "ag dtype" },
        { hcoll_allgather(comm, x + 1, x, 4, HCOLL_FLOAT32, NULL), "ag overlap" },
        { hcoll_allgather_async(comm, y, x, 4, HCOLL_FLOAT32, NULL, NULL), "ag req_out NULL" },
        { hcoll_allgather(NULL, y, x, 4, HCOLL_FLOAT32, NULL), "ag comm NULL" },
        { hcoll_reduce_scatter(NULL, x, y, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL), "rs comm NULL" },
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        HCT_REQUIRE(c[i].st == HCOLL_ERR_INVALID_ARG, "%s rank %d: %s -> %s", w->name, rank,
                    c[i].what, hcoll_status_name(c[i].st));
    /* Host buffers with a stream are refused, clearly and locally: no CUDA
     * driver here (HCOLL_ERR_UNSUPPORTED), or host memory with a stream
     * (HCOLL_ERR_INVALID_ARG). Device buffers are test_gpu_coll's. */
    hcoll_status_t st = hcoll_reduce_scatter(comm, x, y, 4, HCOLL_FLOAT32, HCOLL_SUM, (void *)1);
    const char *smsg = hcoll_comm_last_error(comm);
    HCT_REQUIRE((st == HCOLL_ERR_UNSUPPORTED && strstr(smsg, "CUDA stream") != NULL) ||
                    (st == HCOLL_ERR_INVALID_ARG && strstr(smsg, "host memory") != NULL),
                "rs with a stream -> %s (%s)", hcoll_status_name(st), smsg);
    st = hcoll_allgather_async(comm, y, x, 4, HCOLL_FLOAT32, (void *)1, &rq);
    HCT_REQUIRE(st == HCOLL_ERR_UNSUPPORTED || st == HCOLL_ERR_INVALID_ARG,
                "ag with a stream -> %s", hcoll_status_name(st));
    /* None of it is sticky; in place and count 0 with NULL work. */
    for (int i = 0; i < 4 * nranks; i++)
        x[i] = (float)(i + rank);
    HCT_OK(comm, hcoll_reduce_scatter(comm, x, x + 4 * rank, 4, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    HCT_REQUIRE(x[4 * rank + 1] == (float)(nranks * (4 * rank + 1) + nranks * (nranks - 1) / 2),
                "%s rank %d: in place got %g", w->name, rank, x[4 * rank + 1]);
    HCT_OK(comm, hcoll_reduce_scatter(comm, NULL, NULL, 0, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    HCT_OK(comm, hcoll_allgather(comm, NULL, NULL, 0, HCOLL_FLOAT32, NULL));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

/* ------------------------------------------------------------------------ */
/* A killed rank                                                              */
/* ------------------------------------------------------------------------ */

#define FAIL_TIMEOUT_MS 3000

typedef struct kill_world {
    world_t w;
    volatile double kill_ms;
} kill_world_t;

/* Reduce-scatters and all-gathers of many pieces in turn; the last rank
 * SIGKILLs itself in its 6th call. The others must fail, promptly (within
 * the liveness and set-up deadlines), never hang, and stay failed. A
 * "split" world: 8 elements per rank under slow given links, so every call
 * travels split with the agreement ("rd-split") and the victim's rail
 * partner fails in its rd while its local peer waits in the node's
 * all-gather for the shard (the failing rank poisons the node). */
static int rank_kill(int rank, int nranks, void *argp)
{
    kill_world_t *kw = argp;
    world_t *w = &kw->w;
    hcoll_comm_t comm;
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-rsag-%d-%s-node%d", (int)getppid(), w->name,
             w->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = FAIL_TIMEOUT_MS;
    cfg.chunk_bytes = 4096;
    HCT_REQUIRE(hct_share_unique_id(&w->slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    const int split = strstr(w->name, "split") != NULL;
    if (split)
        setenv("HCOLL_ALGO_MODEL", "1:10", 1);
    hcoll_status_t ist = hcoll_comm_init(&comm, nranks, rank, &id, &cfg);
    unsetenv("HCOLL_ALGO_MODEL");
    HCT_OK(NULL, ist);
    const size_t n = split ? 8 : 1 << 18;
    float *big = calloc(n * (size_t)nranks, 4), *small = calloc(n, 4);
    HCT_REQUIRE(big && small, "no memory");
    for (int it = 0; it < 10000; it++) {
        if (rank == nranks - 1 && it == 5) {
            kw->kill_ms = hct_now_ms();
            raise(SIGKILL);
        }
        hcoll_status_t st = it % 2 ? hcoll_allgather(comm, small, big, n, HCOLL_FLOAT32, NULL)
                                   : hcoll_reduce_scatter(comm, big, small, n, HCOLL_FLOAT32,
                                                          HCOLL_SUM, NULL);
        if (st == HCOLL_SUCCESS && split && it == 0) {
            const char *name = NULL;
            HCT_OK(comm, hcoll_comm_last_algo(comm, &name));
            HCT_REQUIRE(strcmp(name, "rd-split") == 0, "%s rank %d: ran '%s', want rd-split",
                        w->name, rank, name);
        }
        if (st == HCOLL_SUCCESS)
            continue;
        const double late = hct_now_ms() - kw->kill_ms;
        HCT_REQUIRE(kw->kill_ms > 0, "%s rank %d: call %d -> %s (%s) before the kill", w->name,
                    rank, it, hcoll_status_name(st), hcoll_comm_last_error(comm));
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_TIMEOUT ||
                        st == HCOLL_ERR_ABORTED,
                    "%s rank %d: -> %s (%s)", w->name, rank, hcoll_status_name(st),
                    hcoll_comm_last_error(comm));
        HCT_REQUIRE(late <= FAIL_TIMEOUT_MS + 1000, "%s rank %d: failed %.0f ms after the kill",
                    w->name, rank, late);
        HCT_REQUIRE(hcoll_reduce_scatter(comm, big, small, n, HCOLL_FLOAT32, HCOLL_SUM, NULL) ==
                        st,
                    "%s rank %d: not sticky", w->name, rank);
        HCT_OK(comm, hcoll_comm_destroy(comm));
        return 0;
    }
    HCT_REQUIRE(0, "%s rank %d: no failure", w->name, rank);
}

static void run_kill(const char *name, const int *node_of, int nranks)
{
    kill_world_t *kw = hct_shared_alloc(sizeof *kw);
    ck_assert_ptr_nonnull(kw);
    snprintf(kw->w.name, sizeof kw->w.name, "%s", name);
    kw->w.nranks = nranks;
    memcpy(kw->w.node_of, node_of, (size_t)nranks * sizeof *node_of);
    hct_opts_t o = { .nranks = nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    hct_run(&o, rank_kill, kw, res);
    for (int r = 0; r < nranks; r++) {
        if (r == nranks - 1)
            ck_assert_msg(res[r].signaled && res[r].sig == SIGKILL,
                          "kill on %s: the victim did not die of SIGKILL", name);
        else
            ck_assert_msg(res[r].exited && res[r].code == 0,
                          "kill on %s: survivor %d failed (see stderr)", name, r);
    }
    hct_shared_free(kw, sizeof *kw);
}

START_TEST(kill_rank)
{
    run_kill("k2x2", (int[]){ 0, 0, 1, 1 }, 4);
    run_kill("k2x2-split", (int[]){ 0, 0, 1, 1 }, 4);
    run_kill("k3x1", (int[]){ 0, 1, 2 }, 3);
}
END_TEST

START_TEST(argument_errors)
{
    RUN("e2x2", rank_args, 0, 0, 1, 1);
}
END_TEST

int main(void)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_CHUNK_BYTES");
    unsetenv("HCOLL_DEBUG_FILE");
    unsetenv("HCOLL_SMALL_BYTES");

    Suite *s = suite_create("rsag");
    TCase *tc = tcase_create("rsag");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, layout_small_plans);
    tcase_add_test(tc, layout_4x1);
    tcase_add_test(tc, layout_2x2);
    tcase_add_test(tc, layout_3x2);
    tcase_add_test(tc, layout_2x3);
    tcase_add_test(tc, layout_interleaved);
    tcase_add_test(tc, layout_uneven);
    tcase_add_test(tc, async_and_callbacks);
    tcase_add_test(tc, split_children);
    tcase_add_test(tc, mismatch);
    tcase_add_test(tc, argument_errors);
    tcase_add_test(tc, kill_rank);
    suite_add_tcase(s, tc);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
