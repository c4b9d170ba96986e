/*
 * Ring all-reduce over the TCP transport, N = 2..8 ranks forked on this
 * host (one per emulated node, each on its own 127.0.0.x "rail").
 *
 * Correctness is checked bit for bit two ways:
 *   - "verifiable" inputs (nccl-tests' idea): small integers, ±1/±2/0.5
 *     factors, any values for MAX/MIN, so every order of reduction gives the
 *     same bits and the reference is a plain rank-order fold;
 *   - random floats, whose reference replays the ring's fixed chain order
 *     (block b: rank b, b+1, ..., b-1), and every rank's result must match.
 * Reduce-scatter and all-gather alone (position p ends with / starts from
 * block p), on host and on "device" buffers, and a neighbour in another
 * phase. Failures on purpose: a rank SIGKILLed or SIGSTOPped mid-operation,
 * and a corrupted frame. The schedule arithmetic (ring_sched.h) is checked on its
 * own, without ranks.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "base/err.h"
#include "base/reduce.h"
#include "boot/hmac.h"
#include "inter/ring.h"
#include "inter/ring_sched.h"
#include "inter/tcp.h"
#include "inter/transport.h"

#define TEST_TIMEOUT_S 240
#define MAXR 8

typedef struct shm {
    hct_barrier_t bar;
    int nranks;
    char slot[MAXR][256];
    /* fault tests */
    volatile int ops_done[MAXR];
    volatile int finished[MAXR];
    volatile int status[MAXR];
    volatile double t_err[MAXR];
    volatile double t_fault;
    int victim;
    /* cross-rank identity */
    volatile uint64_t hash[MAXR];
} shm_t;

typedef struct ag_ctx {
    shm_t *shm;
    int rank;
} ag_ctx_t;

static hcoll_status_t shm_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    ag_ctx_t *c = ctx;
    memcpy(c->shm->slot[c->rank], mine, len);
    if (hct_barrier_wait(&c->shm->bar, c->shm->nranks, 30000) != 0)
        return HCOLL_ERR_TIMEOUT;
    for (int i = 0; i < c->shm->nranks; i++)
        memcpy((char *)all + (size_t)i * len, c->shm->slot[i], len);
    if (hct_barrier_wait(&c->shm->bar, c->shm->nranks, 30000) != 0)
        return HCOLL_ERR_TIMEOUT;
    return HCOLL_SUCCESS;
}

static hc_errbuf_t eb; /* one per forked rank */
/* The data connections' hello key (a communicator passes its own). */
static const unsigned char tp_key[HC_TP_KEY_BYTES] = "test_ring's data hello key";

static hcoll_status_t ring_up(int rank, int n, ag_ctx_t *ag, uint64_t chunk, int nslots,
                              int nsocks, int timeout_ms, hc_ring_t **ring_out)
{
    static char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.%d", rank + 1);
    hc_errbuf_init(&eb);
    hc_ring_params_t p = {
        .ops = &hc_tcp_ops,
        .tp = { rank, n, addr, "lo", rank, rank, timeout_ms, nsocks, 0, &eb },
        .chunk_bytes = chunk,
        .nslots = nslots,
        .allgather = shm_allgather,
        .ag_ctx = ag,
    };
    p.tp.auth_key = tp_key;
    p.tp.mac = hc_hmac_sha256;
    return hc_ring_create(&p, ring_out);
}

static shm_t *shm_new(int n)
{
    shm_t *s = hct_shared_alloc(sizeof *s);
    s->nranks = n;
    return s;
}

/* ------------------------------------------------------------------------ */
/* Inputs and references                                                      */
/* ------------------------------------------------------------------------ */

static void put_val(void *buf, size_t i, hcoll_dtype_t dt, double v)
{
    switch (dt) {
    case HCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case HCOLL_FLOAT64: ((double *)buf)[i] = v; break;
    case HCOLL_FLOAT16: ((uint16_t *)buf)[i] = hc_float_to_half((float)v); break;
    case HCOLL_BFLOAT16: ((uint16_t *)buf)[i] = hc_float_to_bf16((float)v); break;
    case HCOLL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case HCOLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case HCOLL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HCOLL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
    }
}

/* Values whose reduction is exact in any order. */
static double verif_val(int r, size_t i, hcoll_dtype_t dt, hcoll_op_t op)
{
    const int uns = dt == HCOLL_UINT8;
    const size_t h = (size_t)r * 7 + i * 13 + (i >> 7);
    switch (op) {
    case HCOLL_SUM:
    case HCOLL_AVG:
        return uns ? (double)(h % 9) : (double)(h % 9) - 4;
    case HCOLL_PROD: {
        static const double f[4] = { 1, -1, 2, 0.5 };
        if (dt == HCOLL_FLOAT32 || dt == HCOLL_FLOAT64 || dt == HCOLL_FLOAT16 ||
            dt == HCOLL_BFLOAT16)
            return f[h % 4];
        return (double)(h % 3 + 1); /* integer products wrap: exact mod 2^k */
    }
    default:
        return uns ? (double)(h % 201) : (double)(h % 201) - 100;
    }
}

static void fill_verif(void *buf, size_t count, int r, hcoll_dtype_t dt, hcoll_op_t op)
{
    for (size_t i = 0; i < count; i++)
        put_val(buf, i, dt, verif_val(r, i, dt, op));
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill_random(void *buf, size_t count, int r, hcoll_dtype_t dt)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1);
    for (size_t i = 0; i < count; i++)
        put_val(buf, i, dt, ((double)(rng_next(&s) % 2000001) - 1000000.0) / 1234.567);
}

/* Rank-order fold of everyone's verifiable inputs. */
static void ref_verif(void *ref, void *tmp, size_t count, int n, hcoll_dtype_t dt, hcoll_op_t op)
{
    fill_verif(ref, count, 0, dt, op);
    for (int q = 1; q < n; q++) {
        fill_verif(tmp, count, q, dt, op);
        hc_reduce(ref, ref, tmp, count, dt, op);
    }
    hc_reduce_avg_finish(ref, count, dt, op, n);
}

/* The ring's own order: block b starts at rank b and is folded by b+1, ...
 * (partial first, the rank's own contribution second). */
static void ref_chain(void *ref, void *tmp, size_t count, int n, hcoll_dtype_t dt,
                      hcoll_op_t op)
{
    /* An all-reduce's blocks: units of 64 bytes, the first units%n one
     * unit longer, the last nonempty one clipped at count. */
    const size_t es = hcoll_dtype_size(dt), u = 64 / es, units = (count + u - 1) / u;
    const size_t base = units / (size_t)n, rem = units % (size_t)n;
    for (int b = 0; b < n; b++) {
        size_t off = ((size_t)b * base + ((size_t)b < rem ? (size_t)b : rem)) * u;
        size_t end = ((size_t)(b + 1) * base + ((size_t)b + 1 < rem ? (size_t)b + 1 : rem)) * u;
        off = off < count ? off : count;
        size_t cnt = (end < count ? end : count) - off;
        for (int k = 0; k < n; k++) {
            int q = (b + k) % n;
            fill_random(tmp, count, q, dt);
            if (k == 0)
                memcpy((char *)ref + off * es, (char *)tmp + off * es, cnt * es);
            else
                hc_reduce((char *)ref + off * es, (char *)ref + off * es, (char *)tmp + off * es,
                          cnt, dt, op);
        }
        hc_reduce_avg_finish((char *)ref + off * es, cnt, dt, op, n);
    }
}

static uint64_t fnv(const void *p, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* ------------------------------------------------------------------------ */
/* Every dtype × op, many counts, in place and not                            */
/* ------------------------------------------------------------------------ */

static int rank_matrix(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    /* Small chunks and few slots: multi-chunk pipelining and slot reuse
     * even at these counts. */
    HCT_REQUIRE(ring_up(rank, n, &ag, 96, 2, 1, 20000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    const size_t counts[] = { 0, 1, (size_t)n - 1, (size_t)n + 1, 13, 97, 1031 };
    const size_t maxc = 1031;
    char *send = malloc(maxc * 8), *recv = malloc(maxc * 8 + 8), *ref = malloc(maxc * 8),
         *tmp = malloc(maxc * 8);
    HCT_REQUIRE(send && recv && ref && tmp, "malloc");
    for (int dt = 0; dt < HCOLL_DTYPE_COUNT_; dt++) {
        const size_t es = hcoll_dtype_size(dt);
        for (int op = 0; op < HCOLL_OP_COUNT_; op++) {
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                size_t count = counts[ci];
                ref_verif(ref, tmp, count, n, dt, op);
                for (int inplace = 0; inplace < 2; inplace++) {
                    memset(recv, 0xCD, maxc * 8 + 8);
                    fill_verif(inplace ? recv : send, count, rank, dt, op);
                    hcoll_status_t st = hc_ring_allreduce(ring, inplace ? recv : send, recv, count,
                                                          dt, op);
                    HCT_REQUIRE(st == HCOLL_SUCCESS, "%s %s count %zu: %s", hcoll_dtype_name(dt),
                                hcoll_op_name(op), count, eb.msg);
                    HCT_REQUIRE(memcmp(recv, ref, count * es) == 0,
                                "%s %s count %zu %s: result differs from the reference",
                                hcoll_dtype_name(dt), hcoll_op_name(op), count,
                                inplace ? "in place" : "out of place");
                    for (size_t k = count * es; k < count * es + 8; k++)
                        HCT_REQUIRE((unsigned char)recv[k] == 0xCD, "wrote past the end");
                }
            }
        }
    }
    hc_ring_destroy(ring);
    free(send), free(recv), free(ref), free(tmp);
    return 0;
}

START_TEST(test_matrix)
{
    const int n = 2 + _i;
    shm_t *shm = shm_new(n);
    hct_opts_t o = { .nranks = n, .ranks_per_node = 1, .timeout_ms = 200000 };
    hct_result_t res[MAXR];
    double t0 = hct_now_ms();
    ck_assert_int_eq(hct_run(&o, rank_matrix, shm, res), 0);
    fprintf(stderr, "matrix N=%d: %.1f s\n", n, (hct_now_ms() - t0) / 1e3);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Large vectors, default chunking                                            */
/* ------------------------------------------------------------------------ */

typedef struct large_case {
    int n;
    size_t count;
    hcoll_dtype_t dt;
    uint64_t chunk;
    int nsocks;
} large_case_t;

static const large_case_t large_cases[] = {
    { 2, (1u << 20) + 3, HCOLL_FLOAT32, 1u << 20, 1 },
    { 3, (1u << 20) + 3, HCOLL_BFLOAT16, 1u << 20, 3 },
    { 4, (1u << 20) + 3, HCOLL_INT32, 64u << 10, 1 },
    { 7, (1u << 20) + 3, HCOLL_FLOAT64, 256u << 10, 2 },
    { 8, (1u << 20) + 3, HCOLL_FLOAT16, 1u << 20, 1 },
    /* 64 MiB of float32 */
    { 2, 16u << 20, HCOLL_FLOAT32, 1u << 20, 1 },
    { 5, 16u << 20, HCOLL_FLOAT32, 1u << 20, 1 },
};

static int rank_large(int rank, int n, void *arg)
{
    shm_t *shm = ((void **)arg)[0];
    const large_case_t *lc = ((void **)arg)[1];
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, lc->chunk, 0, lc->nsocks, 30000, &ring) == HCOLL_SUCCESS,
                "create: %s", eb.msg);
    const size_t es = hcoll_dtype_size(lc->dt), bytes = lc->count * es;
    char *send = malloc(bytes), *recv = malloc(bytes), *ref = malloc(bytes), *tmp = malloc(bytes);
    HCT_REQUIRE(send && recv && ref && tmp, "malloc");
    ref_verif(ref, tmp, lc->count, n, lc->dt, HCOLL_SUM);
    free(tmp);
    fill_verif(send, lc->count, rank, lc->dt, HCOLL_SUM);
    HCT_REQUIRE(hc_ring_allreduce(ring, send, recv, lc->count, lc->dt, HCOLL_SUM) ==
                    HCOLL_SUCCESS,
                "out of place: %s", eb.msg);
    HCT_REQUIRE(memcmp(recv, ref, bytes) == 0, "out of place: wrong result");
    HCT_REQUIRE(hc_ring_allreduce(ring, send, send, lc->count, lc->dt, HCOLL_SUM) ==
                    HCOLL_SUCCESS,
                "in place: %s", eb.msg);
    HCT_REQUIRE(memcmp(send, ref, bytes) == 0, "in place: wrong result");
    hc_ring_destroy(ring);
    free(send), free(recv), free(ref);
    return 0;
}

START_TEST(test_large)
{
    const large_case_t *lc = &large_cases[_i];
    shm_t *shm = shm_new(lc->n);
    void *arg[2] = { shm, (void *)lc };
    hct_opts_t o = { .nranks = lc->n, .ranks_per_node = 1, .timeout_ms = 200000 };
    hct_result_t res[MAXR];
    double t0 = hct_now_ms();
    ck_assert_int_eq(hct_run(&o, rank_large, arg, res), 0);
    fprintf(stderr, "large N=%d count %zu %s: %.1f s\n", lc->n, lc->count,
            hcoll_dtype_name(lc->dt), (hct_now_ms() - t0) / 1e3);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Random floats: the ring's chain order, the same bits on every rank         */
/* ------------------------------------------------------------------------ */

static int rank_chain(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 4096, 3, 2, 30000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    const hcoll_dtype_t dts[] = { HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16, HCOLL_FLOAT64 };
    const hcoll_op_t ops[] = { HCOLL_SUM, HCOLL_AVG, HCOLL_PROD };
    const size_t count = 100003;
    char *buf = malloc(count * 8), *ref = malloc(count * 8), *tmp = malloc(count * 8);
    for (size_t d = 0; d < 4; d++)
        for (size_t k = 0; k < 3; k++) {
            const size_t es = hcoll_dtype_size(dts[d]);
            ref_chain(ref, tmp, count, n, dts[d], ops[k]);
            fill_random(buf, count, rank, dts[d]);
            HCT_REQUIRE(hc_ring_allreduce(ring, buf, buf, count, dts[d], ops[k]) == HCOLL_SUCCESS,
                        "%s", eb.msg);
            HCT_REQUIRE(memcmp(buf, ref, count * es) == 0, "%s %s: differs from chain order",
                        hcoll_dtype_name(dts[d]), hcoll_op_name(ops[k]));
            shm->hash[rank] = fnv(buf, count * es);
            HCT_REQUIRE(hct_barrier_wait(&shm->bar, n, 30000) == 0, "barrier");
            for (int q = 0; q < n; q++)
                HCT_REQUIRE(shm->hash[q] == shm->hash[rank], "rank %d has other bits", q);
            HCT_REQUIRE(hct_barrier_wait(&shm->bar, n, 30000) == 0, "barrier");
        }
    hc_ring_destroy(ring);
    free(buf), free(ref), free(tmp);
    return 0;
}

START_TEST(test_chain_order)
{
    shm_t *shm = shm_new(5);
    hct_opts_t o = { .nranks = 5, .ranks_per_node = 1, .timeout_ms = 120000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_chain, shm, res), 0);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 1000 small calls back to back                                              */
/* ------------------------------------------------------------------------ */

static int rank_many(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 1u << 20, 0, 1, 20000, &ring) == HCOLL_SUCCESS,
                "create: %s", eb.msg);
    float send[7], recv[7];
    for (int it = 0; it < 1000; it++) {
        for (int i = 0; i < 7; i++)
            send[i] = (float)(rank * 3 + i + it % 5);
        float *out = (it & 1) ? send : recv;
        HCT_REQUIRE(hc_ring_allreduce(ring, send, out, 7, HCOLL_FLOAT32, HCOLL_SUM) ==
                        HCOLL_SUCCESS,
                    "call %d: %s", it, eb.msg);
        for (int i = 0; i < 7; i++) {
            float want = (float)(3 * n * (n - 1) / 2 + n * (i + it % 5));
            HCT_REQUIRE(out[i] == want, "call %d elem %d: %g != %g", it, i, out[i], want);
        }
    }
    hc_ring_destroy(ring);
    return 0;
}

START_TEST(test_many_small)
{
    shm_t *shm = shm_new(4);
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 1, .timeout_ms = 120000 };
    hct_result_t res[MAXR];
    double t0 = hct_now_ms();
    ck_assert_int_eq(hct_run(&o, rank_many, shm, res), 0);
    fprintf(stderr, "1000 small calls, N=4: %.2f s\n", (hct_now_ms() - t0) / 1e3);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* Ranks called with different counts (or dtypes): the descriptor of the
 * operation carries its arguments, so the neighbours fail with
 * HCOLL_ERR_MISMATCH at the start instead of through a frame that
 * overflows a region or a deadline. */
static int rank_mismatch(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 64u << 10, 0, 1, 5000, &ring) == HCOLL_SUCCESS,
                "create: %s", eb.msg);
    /* 100000: the descriptor path; 100: the small-vector gather mode, which
     * carries the arguments in a trailer behind each vector. */
    const size_t count = shm->victim ? 100 : 100000;
    float *buf = calloc(count + 1, sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    /* One good call first: the mismatch is in the second operation. */
    HCT_REQUIRE(hc_ring_allreduce(ring, buf, buf, count, HCOLL_FLOAT32, HCOLL_SUM) ==
                    HCOLL_SUCCESS,
                "first call: %s", eb.msg);
    /* Everyone is done with the first call before the odd one fails the
     * ring, which would otherwise cut a slower rank's first call short. */
    HCT_REQUIRE(hct_barrier_wait(&shm->bar, n, 10000) == 0, "barrier");
    size_t mine = rank == 1 ? count + 1 : count;
    hcoll_status_t st = hc_ring_allreduce(ring, buf, buf, mine, HCOLL_FLOAT32, HCOLL_SUM);
    shm->hash[rank] = (uint64_t)st;
    fprintf(stderr, "rank %d: %s (%s)\n", rank, hcoll_status_name(st), eb.msg);
    HCT_REQUIRE(st != HCOLL_SUCCESS, "a mismatched call succeeded");
    HCT_REQUIRE(st != HCOLL_ERR_TIMEOUT, "waited for the deadline: %s", eb.msg);
    hc_ring_destroy(ring);
    free(buf);
    return 0;
}

START_TEST(test_count_mismatch)
{
    shm_t *shm = shm_new(3);
    shm->victim = _i;
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_mismatch, shm, res), 0);
    int mismatch = 0;
    for (int r = 0; r < 3; r++)
        mismatch += shm->hash[r] == (uint64_t)HCOLL_ERR_MISMATCH;
    /* The ranks next to the odd one see it; the others see them leave. */
    ck_assert_msg(mismatch >= 1, "no rank reported HCOLL_ERR_MISMATCH");
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* The broadcast chain: every root, sizes of one element to many chunks,
 * interleaved with all-reduces (whose sequence numbers must stay in step),
 * random bytes that must arrive bit for bit. */
static int rank_bcast(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 4096, 0, 1, 20000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    static const size_t counts[] = { 1, 7, 1025, 100003 };
    uint32_t *buf = malloc(100003 * sizeof *buf), *want = malloc(100003 * sizeof *want);
    HCT_REQUIRE(buf && want, "no memory");
    for (int it = 0; it < 3; it++)
        for (int root = 0; root < n; root++)
            for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
                size_t cnt = counts[k];
                for (size_t i = 0; i < cnt; i++)
                    want[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)(root * 77 + it);
                for (size_t i = 0; i < cnt; i++)
                    buf[i] = rank == root ? want[i] : 0xdeadbeefu;
                hcoll_status_t st = hc_ring_bcast_start(ring, buf, cnt, HCOLL_INT32, root);
                int done = 0;
                while (st == HCOLL_SUCCESS && !done)
                    st = hc_ring_progress(ring, 1000, &done);
                HCT_REQUIRE(st == HCOLL_SUCCESS, "root %d count %zu: %s", root, cnt, eb.msg);
                HCT_REQUIRE(memcmp(buf, want, cnt * sizeof *buf) == 0,
                            "root %d count %zu: wrong bytes", root, cnt);
                if (k % 2 == 0) {
                    float x = 1.0f;
                    HCT_REQUIRE(hc_ring_allreduce(ring, &x, &x, 1, HCOLL_FLOAT32, HCOLL_SUM) ==
                                        HCOLL_SUCCESS &&
                                    x == (float)n,
                                "all-reduce between broadcasts: %s", eb.msg);
                }
            }
    hc_ring_destroy(ring);
    free(buf);
    free(want);
    return 0;
}

START_TEST(test_bcast_chain)
{
    const int n = 2 + _i;
    shm_t *shm = shm_new(n);
    hct_opts_t o = { .nranks = n, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_bcast, shm, res), 0);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* A rank that names another root: its descriptor's signature differs, so
 * a neighbour fails with HCOLL_ERR_MISMATCH rather than at the deadline. */
static int rank_bcast_mismatch(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 4096, 0, 1, 5000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    static char buf[10000];
    hcoll_status_t st = hc_ring_bcast_start(ring, buf, sizeof buf, HCOLL_UINT8, rank == 1);
    int done = 0;
    while (st == HCOLL_SUCCESS && !done)
        st = hc_ring_progress(ring, 1000, &done);
    shm->hash[rank] = (uint64_t)st;
    HCT_REQUIRE(st != HCOLL_SUCCESS, "a mismatched broadcast succeeded");
    HCT_REQUIRE(st != HCOLL_ERR_TIMEOUT, "waited for the deadline: %s", eb.msg);
    hc_ring_destroy(ring);
    return 0;
}

START_TEST(test_bcast_root_mismatch)
{
    shm_t *shm = shm_new(3);
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_bcast_mismatch, shm, res), 0);
    int mismatch = 0;
    for (int r = 0; r < 3; r++)
        mismatch += shm->hash[r] == (uint64_t)HCOLL_ERR_MISMATCH;
    ck_assert_msg(mismatch >= 1, "no rank reported HCOLL_ERR_MISMATCH");
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

START_TEST(test_single_rank)
{
    hc_errbuf_init(&eb);
    shm_t *shm = shm_new(1);
    ag_ctx_t ag = { shm, 0 };
    hc_ring_t *ring;
    ck_assert_int_eq(ring_up(0, 1, &ag, 4096, 0, 1, 1000, &ring), HCOLL_SUCCESS);
    int32_t a[5] = { 1, 2, 3, 4, 5 }, b[5];
    ck_assert_int_eq(hc_ring_allreduce(ring, a, b, 5, HCOLL_INT32, HCOLL_SUM), HCOLL_SUCCESS);
    ck_assert_mem_eq(a, b, sizeof a);
    ck_assert_int_eq(hc_ring_allreduce(ring, a, a, 5, HCOLL_INT32, HCOLL_AVG), HCOLL_SUCCESS);
    ck_assert_mem_eq(a, b, sizeof a);
    ck_assert_int_eq(hc_ring_allreduce(ring, a, b, 5, HCOLL_DTYPE_COUNT_, HCOLL_SUM),
                     HCOLL_ERR_INVALID_ARG);
    hc_ring_destroy(ring);
    hc_ring_destroy(NULL);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Failures                                                                   */
/* ------------------------------------------------------------------------ */

#define FAULT_TIMEOUT_MS 2000
#define FAULT_COUNT ((size_t)1 << 20) /* 4 MiB of float32 per call */

/* Loop all-reduces until one fails; record when and how. */
static int rank_until_error(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 256u << 10, 0, 1, FAULT_TIMEOUT_MS, &ring) == HCOLL_SUCCESS,
                "create: %s", eb.msg);
    float *buf = malloc(FAULT_COUNT * sizeof(float));
    for (size_t i = 0; i < FAULT_COUNT; i++)
        buf[i] = 1.0f;
    hcoll_status_t st = HCOLL_SUCCESS;
    for (int it = 0; it < 100000 && st == HCOLL_SUCCESS; it++) {
        if (rank == 0 && shm->victim == 0 && it == 3)
            hc_tcp_ep_corrupt_next(hc_ring_debug_ep_next(ring), HC_TCP_CORRUPT_OFFSET);
        st = hc_ring_allreduce(ring, buf, buf, FAULT_COUNT, HCOLL_FLOAT32, HCOLL_MAX);
        if (st == HCOLL_SUCCESS)
            __atomic_add_fetch(&shm->ops_done[rank], 1, __ATOMIC_RELEASE);
    }
    shm->t_err[rank] = hct_now_ms();
    shm->status[rank] = st;
    hc_ring_destroy(ring);
    __atomic_store_n(&shm->finished[rank], 1, __ATOMIC_RELEASE);
    free(buf);
    return 0;
}

static void wait_ops(shm_t *shm, int n, int k)
{
    double deadline = hct_now_ms() + 60000;
    for (int r = 0; r < n && hct_now_ms() < deadline; r++)
        while (__atomic_load_n(&shm->ops_done[r], __ATOMIC_ACQUIRE) < k &&
               hct_now_ms() < deadline)
            usleep(1000);
}

static void kill_victim(const pid_t *pids, int n, void *arg)
{
    shm_t *shm = arg;
    wait_ops(shm, n, 3);
    usleep(20000);
    shm->t_fault = hct_now_ms();
    kill(pids[shm->victim], SIGKILL);
}

static void stop_victim(const pid_t *pids, int n, void *arg)
{
    shm_t *shm = arg;
    wait_ops(shm, n, 3);
    usleep(20000);
    shm->t_fault = hct_now_ms();
    kill(pids[shm->victim], SIGSTOP);
    double deadline = hct_now_ms() + 30000;
    for (int r = 0; r < n; r++)
        while (r != shm->victim && !__atomic_load_n(&shm->finished[r], __ATOMIC_ACQUIRE) &&
               hct_now_ms() < deadline)
            usleep(1000);
    kill(pids[shm->victim], SIGKILL);
}

static void check_survivors(shm_t *shm, int n, const hct_result_t *res, int want_timeout)
{
    int timeouts = 0;
    for (int r = 0; r < n; r++) {
        if (r == shm->victim)
            continue;
        ck_assert_msg(res[r].exited && res[r].code == 0, "rank %d did not finish cleanly", r);
        hcoll_status_t st = shm->status[r];
        ck_assert_msg(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_TIMEOUT ||
                          st == HCOLL_ERR_NETWORK,
                      "rank %d: %s", r, hcoll_status_name(st));
        double dt = shm->t_err[r] - shm->t_fault;
        fprintf(stderr, "  rank %d: %s %.0f ms after the fault\n", r, hcoll_status_name(st), dt);
        ck_assert_msg(dt <= FAULT_TIMEOUT_MS + 1000, "rank %d took %.0f ms", r, dt);
        timeouts += st == HCOLL_ERR_TIMEOUT;
    }
    if (want_timeout)
        ck_assert_msg(timeouts > 0, "no survivor reported a timeout");
}

START_TEST(test_kill_rank)
{
    const int n = 4;
    shm_t *shm = shm_new(n);
    shm->victim = 2;
    hct_opts_t o = { .nranks = n, .ranks_per_node = 1, .timeout_ms = 60000,
                     .on_started = kill_victim };
    hct_result_t res[MAXR];
    hct_run(&o, rank_until_error, shm, res);
    ck_assert(res[2].signaled && res[2].sig == SIGKILL);
    check_survivors(shm, n, res, 0);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

START_TEST(test_stop_rank)
{
    const int n = 3;
    shm_t *shm = shm_new(n);
    shm->victim = 1;
    hct_opts_t o = { .nranks = n, .ranks_per_node = 1, .timeout_ms = 60000,
                     .on_started = stop_victim };
    hct_result_t res[MAXR];
    hct_run(&o, rank_until_error, shm, res);
    check_survivors(shm, n, res, 1);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* Liveness links: a neighbour that is late but beating is waited for past
 * the liveness period (no operation timeout); one that stops beating is
 * found within it, by both its neighbours, by name. The beats come from a
 * thread here, as from the communicator's liveness thread. */
#define LIVE_MS 500

typedef struct beater {
    hc_ring_t *ring;
    volatile int stop;
} beater_t;

static void *beat_main(void *p)
{
    beater_t *b = p;
    while (!b->stop) {
        hc_ring_live_beat(b->ring);
        hc_ring_live_poll(b->ring, 50);
    }
    return NULL;
}

typedef struct live_arg {
    shm_t *shm;
    atomic_int named; /* survivors whose message names rank 2 and its rail */
} live_arg_t;

static int rank_live(int rank, int n, void *arg)
{
    live_arg_t *la = arg;
    shm_t *shm = la->shm;
    ag_ctx_t ag = { shm, rank };
    static char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.%d", rank + 1);
    hc_errbuf_init(&eb);
    hc_ring_params_t p = {
        .ops = &hc_tcp_ops,
        .tp = { rank, n, addr, "lo", 0, rank, 2000, 1, 0, &eb },
        .chunk_bytes = 64u << 10,
        .allgather = shm_allgather,
        .ag_ctx = &ag,
        .op_timeout_ms = -1,
        .liveness_ms = LIVE_MS,
    };
    p.tp.auth_key = tp_key;
    p.tp.mac = hc_hmac_sha256;
    hc_ring_t *ring;
    HCT_REQUIRE(hc_ring_create(&p, &ring) == HCOLL_SUCCESS, "create: %s", eb.msg);
    beater_t b = { ring, 0 };
    pthread_t th;
    HCT_REQUIRE(pthread_create(&th, NULL, beat_main, &b) == 0, "pthread_create");
    float buf[50000];
    for (size_t i = 0; i < 50000; i++)
        buf[i] = 1.0f;
    if (rank == 2)
        usleep(3 * LIVE_MS * 1000);
    double t0 = hct_now_ms();
    HCT_REQUIRE(hc_ring_allreduce(ring, buf, buf, 50000, HCOLL_FLOAT32, HCOLL_SUM) == 0,
                "late rank: %s", eb.msg);
    HCT_REQUIRE(rank == 2 || hct_now_ms() - t0 > 2 * LIVE_MS, "did not wait for rank 2");
    if (rank == 2) { /* freeze: no beats, no call, until the others gave up */
        b.stop = 1;
        pthread_join(th, NULL);
        usleep(4 * LIVE_MS * 1000);
        hc_ring_destroy(ring);
        return 0;
    }
    t0 = hct_now_ms();
    hcoll_status_t st = hc_ring_allreduce(ring, buf, buf, 50000, HCOLL_FLOAT32, HCOLL_SUM);
    double ms = hct_now_ms() - t0;
    b.stop = 1;
    pthread_join(th, NULL);
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "frozen rank: %s (%s)", hcoll_status_name(st),
                eb.msg);
    /* Both survivors watch rank 2 (rank 1 as its next, rank 0 as its
     * prev); the first to notice names it, and the other may instead see
     * that first survivor's connections reset: either way within the
     * bound, and at least one names the frozen rank (checked below). */
    if (strstr(eb.msg, "no sign of life from rank 2") && strstr(eb.msg, "rail 0"))
        atomic_fetch_add(&la->named, 1);
    else
        HCT_REQUIRE(strstr(eb.msg, "connection to rank"), "message: %s", eb.msg);
    HCT_REQUIRE(ms < LIVE_MS + 600, "found after %.0f ms", ms);
    hc_ring_destroy(ring);
    return 0;
}

START_TEST(test_live_late_vs_frozen)
{
    const int n = 3;
    live_arg_t *la = hct_shared_alloc(sizeof *la);
    la->shm = shm_new(n);
    atomic_init(&la->named, 0);
    hct_opts_t o = { .nranks = n, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_live, la, res), 0);
    ck_assert_msg(atomic_load(&la->named) >= 1, "no survivor named the frozen rank 2");
    hct_shared_free(la->shm, sizeof *la->shm);
    hct_shared_free(la, sizeof *la);
}
END_TEST

/* Rank 0 sends one frame whose offset lies past rank 1's staging region:
 * rank 1 reports HCOLL_ERR_NETWORK, nobody crashes, everyone returns. */
static void note_fault_time(const pid_t *pids, int n, void *arg)
{
    (void)pids, (void)n;
    shm_t *shm = arg;
    shm->t_fault = hct_now_ms();
}

START_TEST(test_corrupt_frame)
{
    const int n = 3;
    shm_t *shm = shm_new(n);
    shm->victim = 0; /* the corrupter; it must fail too, but it is not checked for timing */
    hct_opts_t o = { .nranks = n, .ranks_per_node = 1, .timeout_ms = 60000,
                     .on_started = note_fault_time };
    hct_result_t res[MAXR];
    hct_run(&o, rank_until_error, shm, res);
    for (int r = 0; r < n; r++)
        ck_assert_msg(res[r].exited && res[r].code == 0, "rank %d crashed or failed", r);
    ck_assert_msg(shm->status[1] == HCOLL_ERR_NETWORK, "rank 1: %s",
                  hcoll_status_name(shm->status[1]));
    ck_assert_int_ne(shm->status[0], HCOLL_SUCCESS);
    ck_assert_int_ne(shm->status[2], HCOLL_SUCCESS);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Device mode (GPUDirect), with host memory standing in for the device       */
/* ------------------------------------------------------------------------ */

/* The ring's device operations done on host memory, counted, so that the
 * device-mode logic (device slots, devops reductions, no gather mode) runs
 * over TCP. fail_alloc: this rank cannot get device slots. */
typedef struct fakedev {
    int fail_alloc;
    int allocs, frees, reduces, avgs, copies;
} fakedev_t;

static hcoll_status_t fd_alloc(void *ctx, size_t bytes, void **out)
{
    fakedev_t *f = ctx;
    if (f->fail_alloc)
        return HCOLL_ERR_NO_MEMORY;
    *out = malloc(bytes);
    if (!*out)
        return HCOLL_ERR_NO_MEMORY;
    f->allocs++;
    return HCOLL_SUCCESS;
}

static void fd_free(void *ctx, void *p)
{
    fakedev_t *f = ctx;
    f->frees++;
    free(p);
}

static hcoll_status_t fd_reduce(void *ctx, void *dst, const void *a, const void *b, size_t count,
                                hcoll_dtype_t dtype, hcoll_op_t op)
{
    ((fakedev_t *)ctx)->reduces++;
    hc_reduce(dst, a, b, count, dtype, op);
    return HCOLL_SUCCESS;
}

static hcoll_status_t fd_avg(void *ctx, void *buf, size_t count, hcoll_dtype_t dtype,
                             hcoll_op_t op, int div)
{
    ((fakedev_t *)ctx)->avgs++;
    hc_reduce_avg_finish(buf, count, dtype, op, div);
    return HCOLL_SUCCESS;
}

static hcoll_status_t fd_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    ((fakedev_t *)ctx)->copies++;
    memcpy(dst, src, bytes);
    return HCOLL_SUCCESS;
}

static hcoll_status_t ring_run_device(hc_ring_t *ring, const void *s, void *r, size_t count,
                                      hcoll_dtype_t dt, hcoll_op_t op)
{
    int done = 0;
    hcoll_status_t st = hc_ring_start_device(ring, s, r, count, dt, op, 0);
    while (st == HCOLL_SUCCESS && !done)
        st = hc_ring_progress(ring, 20, &done);
    return st;
}

static int rank_device(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 4096, 0, 1, 20000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    fakedev_t f = { 0 };
    const hc_ring_devops_t ops = { &f, fd_alloc, fd_free, fd_reduce, fd_avg, fd_copy };
    /* Before enabling, device operations are refused. */
    float x[4] = { 0 };
    HCT_REQUIRE(hc_ring_start_device(ring, x, x, 4, HCOLL_FLOAT32, HCOLL_SUM, 0) ==
                    HCOLL_ERR_INVALID_ARG,
                "device start before enable was not refused");
    HCT_REQUIRE(hc_ring_enable_device(ring, &ops) == HCOLL_SUCCESS, "enable: %s", eb.msg);
    HCT_REQUIRE(f.allocs == 1, "%d slot allocations", f.allocs);
    /* Counts that take gather mode on host buffers, several chunks, uneven
     * blocks; AVG; in and out of place. */
    static const size_t counts[] = { 1, 7, 1000, 3001, 20011 };
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        const size_t cnt = counts[k];
        for (int pass = 0; pass < 2; pass++) {
            const hcoll_op_t op = pass ? HCOLL_AVG : HCOLL_SUM;
            float *in = malloc(cnt * 4), *out = malloc(cnt * 4);
            HCT_REQUIRE(in && out, "malloc");
            for (size_t i = 0; i < cnt; i++)
                in[i] = (float)((int)(i % 13) + rank * 4);
            float *dst = pass ? in : out; /* AVG in place */
            int before = f.reduces;
            HCT_REQUIRE(ring_run_device(ring, in, dst, cnt, HCOLL_FLOAT32, op) == HCOLL_SUCCESS,
                        "%zu %s: %s", cnt, hcoll_op_name(op), eb.msg);
            HCT_REQUIRE(f.reduces > before, "%zu: no device reduction ran", cnt);
            for (size_t i = 0; i < cnt; i++) {
                float sum = (float)(n * (int)(i % 13) + 4 * n * (n - 1) / 2);
                float want = pass ? sum / (float)n : sum;
                HCT_REQUIRE(dst[i] == want, "%zu %s elem %zu: %g != %g", cnt, hcoll_op_name(op),
                            i, dst[i], want);
            }
            free(in);
            free(out);
        }
    }
    HCT_REQUIRE(f.avgs > 0, "AVG never divided through the device operations");
    /* Host buffers still take the host path on the same ring. */
    int before = f.reduces;
    float h[5] = { 1, 2, 3, 4, 5 }, hr[5];
    HCT_REQUIRE(hc_ring_allreduce(ring, h, hr, 5, HCOLL_FLOAT32, HCOLL_SUM) == HCOLL_SUCCESS,
                "host after device: %s", eb.msg);
    HCT_REQUIRE(hr[4] == 5.0f * (float)n && f.reduces == before, "host call: %g, %d reduces",
                hr[4], f.reduces - before);
    hc_ring_disable_device(ring);
    HCT_REQUIRE(f.frees == f.allocs, "%d of %d slot allocations freed", f.frees, f.allocs);
    hc_ring_destroy(ring);
    return 0;
}

START_TEST(test_device_mode)
{
    shm_t *shm = shm_new(3);
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_device, shm, res), 0);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* One rank cannot get device slots: every rank's enable fails alike, and
 * the ring keeps working for host buffers. */
static int rank_device_refused(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 4096, 0, 1, 20000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    fakedev_t f = { .fail_alloc = rank == 1 };
    const hc_ring_devops_t ops = { &f, fd_alloc, fd_free, fd_reduce, fd_avg, fd_copy };
    hcoll_status_t st = hc_ring_enable_device(ring, &ops);
    HCT_REQUIRE(st == HCOLL_ERR_UNSUPPORTED && strstr(eb.msg, "rank 1 cannot take device"),
                "enable with rank 1 failing: %s: %s", hcoll_status_name(st), eb.msg);
    HCT_REQUIRE(f.frees == f.allocs, "slots of a failed enable not freed (%d of %d)", f.frees,
                f.allocs);
    float x[3] = { 1, 1, 1 };
    HCT_REQUIRE(hc_ring_start_device(ring, x, x, 3, HCOLL_FLOAT32, HCOLL_SUM, 0) ==
                    HCOLL_ERR_INVALID_ARG,
                "device start after a failed enable was not refused");
    float h[3] = { 1, 2, 3 }, hr[3];
    HCT_REQUIRE(hc_ring_allreduce(ring, h, hr, 3, HCOLL_FLOAT32, HCOLL_SUM) == HCOLL_SUCCESS,
                "host call after a failed enable: %s", eb.msg);
    HCT_REQUIRE(hr[2] == 3.0f * (float)n, "host result %g", hr[2]);
    hc_ring_destroy(ring);
    return 0;
}

START_TEST(test_device_refused_together)
{
    shm_t *shm = shm_new(3);
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_device_refused, shm, res), 0);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Reduce-scatter and all-gather alone                                        */
/* ------------------------------------------------------------------------ */

static hcoll_status_t ring_finish(hc_ring_t *ring, hcoll_status_t st)
{
    int done = 0;
    while (st == HCOLL_SUCCESS && !done)
        st = hc_ring_progress(ring, 1000, &done);
    return st;
}

/* Block p of the phases' split (ring_sched.h). */
static void phase_block(int n, size_t count, int p, size_t *off, size_t *cnt)
{
    hc_ring_sched_t g;
    hc_ring_sched_plan(&g, n, count, 4, 4096, 0, 1);
    *off = hc_ring_blk_off(&g, p);
    *cnt = hc_ring_blk_cnt(&g, p);
}

/* The reduce-scatter's own order: block b starts at position b+1 and is
 * folded by b+2, ..., b (one position later than the all-reduce's). */
static void ref_rs_chain(float *ref, float *tmp, size_t count, int n, int b)
{
    size_t off, cnt;
    phase_block(n, count, b, &off, &cnt);
    for (int k = 0; k < n; k++) {
        fill_random(tmp, count, (b + 1 + k) % n, HCOLL_FLOAT32);
        if (k == 0)
            memcpy(ref + off, tmp + off, cnt * 4);
        else
            hc_reduce(ref + off, ref + off, tmp + off, cnt, HCOLL_FLOAT32, HCOLL_SUM);
    }
}

/*
 * Position p ends the reduce-scatter with block p (exact inputs: the
 * rank-order fold; random floats: the chain order above, bit for bit) and
 * starts the all-gather from it; the phases interleave with all-reduces,
 * whose sequence numbers must stay in step; small chunks and two slots
 * pipeline even short vectors.
 */
static int rank_phases(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 96, 2, 1, 20000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    static const size_t counts[] = { 1, 7, 52, 1031, 20011 };
    static const hcoll_op_t ops[] = { HCOLL_SUM, HCOLL_AVG, HCOLL_MAX };
    static const hcoll_dtype_t dts[] = { HCOLL_FLOAT32, HCOLL_INT32, HCOLL_FLOAT16 };
    const size_t maxc = 20011;
    char *send = malloc(maxc * 4), *recv = malloc(maxc * 4 + 8), *ref = malloc(maxc * 4),
         *tmp = malloc(maxc * 4);
    HCT_REQUIRE(send && recv && ref && tmp, "malloc");
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        const size_t count = counts[ci];
        size_t off, cnt;
        phase_block(n, count, rank, &off, &cnt);
        for (size_t k = 0; k < 9; k++) {
            const hcoll_dtype_t dt = dts[k % 3];
            const hcoll_op_t op = ops[k / 3];
            const size_t es = hcoll_dtype_size(dt);
            const int inplace = (int)(k % 2);
            ref_verif(ref, tmp, count, n, dt, op);
            memset(recv, 0xCD, count * es + 8);
            fill_verif(inplace ? recv : send, count, rank, dt, op);
            hcoll_status_t st = hc_ring_rs_start(ring, inplace ? recv : send, recv, count, dt,
                                                 op, 0);
            st = ring_finish(ring, st);
            HCT_REQUIRE(st == HCOLL_SUCCESS, "rs %s %s count %zu: %s", hcoll_dtype_name(dt),
                        hcoll_op_name(op), count, eb.msg);
            HCT_REQUIRE(memcmp(recv + off * es, ref + off * es, cnt * es) == 0,
                        "rs %s %s count %zu%s: block %d differs from the reference",
                        hcoll_dtype_name(dt), hcoll_op_name(op), count,
                        inplace ? " in place" : "", rank);
            HCT_REQUIRE((unsigned char)recv[count * es] == 0xCD, "rs wrote past the end");
        }
        /* Random floats: the chain order, bit for bit. */
        fill_random(send, count, rank, HCOLL_FLOAT32);
        HCT_REQUIRE(ring_finish(ring, hc_ring_rs_start(ring, send, recv, count, HCOLL_FLOAT32,
                                                       HCOLL_SUM, 0)) == HCOLL_SUCCESS,
                    "rs random: %s", eb.msg);
        ref_rs_chain((float *)ref, (float *)tmp, count, n, rank);
        HCT_REQUIRE(memcmp(recv + off * 4, ref + off * 4, cnt * 4) == 0,
                    "rs random count %zu: not the chain order's bits", count);
        /* All-gather: my block in, everyone's out. */
        uint32_t *b = (uint32_t *)recv;
        for (size_t i = 0; i < count; i++)
            b[i] = i >= off && i < off + cnt ? (uint32_t)(i * 2654435761u) ^ (uint32_t)count
                                             : 0xdeadbeefu;
        HCT_REQUIRE(ring_finish(ring, hc_ring_ag_start(ring, recv, count, HCOLL_INT32)) ==
                        HCOLL_SUCCESS,
                    "ag count %zu: %s", count, eb.msg);
        for (size_t i = 0; i < count; i++)
            HCT_REQUIRE(b[i] == ((uint32_t)(i * 2654435761u) ^ (uint32_t)count),
                        "ag count %zu: element %zu is %08x", count, i, b[i]);
        float x = 1.0f;
        HCT_REQUIRE(hc_ring_allreduce(ring, &x, &x, 1, HCOLL_FLOAT32, HCOLL_SUM) ==
                            HCOLL_SUCCESS && x == (float)n,
                    "all-reduce between the phases: %s", eb.msg);
    }
    hc_ring_destroy(ring);
    free(send), free(recv), free(ref), free(tmp);
    return 0;
}

START_TEST(test_phases)
{
    const int n = 2 + _i;
    shm_t *shm = shm_new(n);
    hct_opts_t o = { .nranks = n, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[MAXR];
    const double t0 = hct_now_ms();
    ck_assert_int_eq(hct_run(&o, rank_phases, shm, res), 0);
    fprintf(stderr, "[time] phases on %d ranks: %.1f s\n", n, (hct_now_ms() - t0) / 1e3);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* Rank 1 starts another phase (_i 0: all-gather against reduce-scatters;
 * 1: the all-reduce): the descriptor's signature tells a neighbour, which
 * fails with HCOLL_ERR_MISMATCH; nobody succeeds, nobody waits for the
 * deadline. */
static int rank_phase_mismatch(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 4096, 0, 1, 5000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    static float buf[30000];
    hcoll_status_t st;
    if (rank != 1)
        st = hc_ring_rs_start(ring, buf, buf, 30000, HCOLL_FLOAT32, HCOLL_SUM, 0);
    else if (shm->victim == 0)
        st = hc_ring_ag_start(ring, buf, 30000, HCOLL_FLOAT32);
    else
        st = hc_ring_start(ring, buf, buf, 30000, HCOLL_FLOAT32, HCOLL_SUM, 0);
    st = ring_finish(ring, st);
    shm->hash[rank] = (uint64_t)st;
    fprintf(stderr, "rank %d: %s (%s)\n", rank, hcoll_status_name(st), eb.msg);
    HCT_REQUIRE(st != HCOLL_SUCCESS, "a mismatched phase succeeded");
    HCT_REQUIRE(st != HCOLL_ERR_TIMEOUT, "waited for the deadline: %s", eb.msg);
    hc_ring_destroy(ring);
    return 0;
}

START_TEST(test_phase_mismatch)
{
    shm_t *shm = shm_new(3);
    shm->victim = _i;
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_phase_mismatch, shm, res), 0);
    int mismatch = 0;
    for (int r = 0; r < 3; r++)
        mismatch += shm->hash[r] == (uint64_t)HCOLL_ERR_MISMATCH;
    ck_assert_msg(mismatch >= 1, "no rank reported HCOLL_ERR_MISMATCH");
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* The phases on "device" buffers (host memory behind the device
 * operations): the reduce-scatter reduces and divides through them. */
static int rank_device_phases(int rank, int n, void *arg)
{
    shm_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_ring_t *ring;
    HCT_REQUIRE(ring_up(rank, n, &ag, 4096, 0, 1, 20000, &ring) == HCOLL_SUCCESS, "create: %s",
                eb.msg);
    fakedev_t f = { 0 };
    const hc_ring_devops_t ops = { &f, fd_alloc, fd_free, fd_reduce, fd_avg, fd_copy };
    HCT_REQUIRE(hc_ring_enable_device(ring, &ops) == HCOLL_SUCCESS, "enable: %s", eb.msg);
    static const size_t counts[] = { 1, 7, 3001, 20011 };
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        const size_t cnt = counts[k];
        size_t off, bc;
        phase_block(n, cnt, rank, &off, &bc);
        int32_t *in = malloc(cnt * 4), *out = malloc(cnt * 4);
        HCT_REQUIRE(in && out, "malloc");
        for (size_t i = 0; i < cnt; i++)
            in[i] = (int32_t)(i % 13) + rank * 4;
        const int before = f.reduces, avgs = f.avgs;
        HCT_REQUIRE(ring_finish(ring, hc_ring_rs_start_device(ring, in, out, cnt, HCOLL_INT32,
                                                              HCOLL_AVG, 0)) == HCOLL_SUCCESS,
                    "device rs %zu: %s", cnt, eb.msg);
        HCT_REQUIRE(n == 1 || (f.reduces > before && f.avgs > avgs),
                    "device rs %zu: %d reduces, %d divisions", cnt, f.reduces - before,
                    f.avgs - avgs);
        for (size_t i = off; i < off + bc; i++) {
            int32_t want = (n * (int32_t)(i % 13) + 4 * n * (n - 1) / 2) / n;
            HCT_REQUIRE(out[i] == want, "device rs %zu elem %zu: %d != %d", cnt, i, out[i], want);
        }
        for (size_t i = 0; i < cnt; i++)
            in[i] = i >= off && i < off + bc ? (int32_t)(i * 3 + 1) : -1;
        HCT_REQUIRE(ring_finish(ring, hc_ring_ag_start_device(ring, in, cnt, HCOLL_INT32)) ==
                        HCOLL_SUCCESS,
                    "device ag %zu: %s", cnt, eb.msg);
        for (size_t i = 0; i < cnt; i++)
            HCT_REQUIRE(in[i] == (int32_t)(i * 3 + 1), "device ag %zu elem %zu: %d", cnt, i,
                        in[i]);
        free(in);
        free(out);
    }
    hc_ring_disable_device(ring);
    hc_ring_destroy(ring);
    return 0;
}

START_TEST(test_device_phases)
{
    shm_t *shm = shm_new(3);
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[MAXR];
    const double t0 = hct_now_ms();
    ck_assert_int_eq(hct_run(&o, rank_device_phases, shm, res), 0);
    fprintf(stderr, "[time] device phases: %.1f s\n", (hct_now_ms() - t0) / 1e3);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* The schedule, on its own                                                   */
/* ------------------------------------------------------------------------ */

/* Blocks cut the vector in N contiguous pieces, longer ones first and at
 * most one element longer; chunks cut each block in C contiguous pieces of
 * at most ce elements, the ones past a short block's end empty; there are
 * (N-1)*C messages per phase, or N-1 whole vectors in gather mode. */
static void check_sched(int n, size_t count, size_t es, size_t chunk, size_t gmax, int dev)
{
    hc_ring_sched_t g;
    hc_ring_sched_plan(&g, n, count, es, chunk, gmax, dev);
    ck_assert_int_eq(g.n, n);
    ck_assert_uint_eq(g.ce, chunk / es);
    size_t next = 0, maxblk = 0;
    for (int b = 0; b < n; b++) {
        ck_assert_uint_eq(hc_ring_blk_off(&g, b), next);
        size_t bc = hc_ring_blk_cnt(&g, b);
        ck_assert_uint_le(bc, count / (size_t)n + 1);
        ck_assert_uint_ge(bc, count / (size_t)n);
        if (b > 0)
            ck_assert_uint_le(bc, hc_ring_blk_cnt(&g, b - 1));
        maxblk = bc > maxblk ? bc : maxblk;
        next += bc;
    }
    ck_assert_uint_eq(next, count);
    ck_assert_int_eq(g.gather, !dev && count * es <= gmax &&
                                   (size_t)(n - 2) * count * es <=
                                       (size_t)n * HC_RING_GATHER_HOP_BYTES &&
                                   n - 1 <= HC_RING_EARLY_MAX);
    if (g.gather) {
        ck_assert_uint_eq(g.C, 1);
        ck_assert_uint_eq(g.nmsg, (size_t)(n - 1));
        return;
    }
    ck_assert_uint_eq(g.nmsg, (size_t)(n - 1) * g.C);
    ck_assert_uint_ge(g.C * g.ce, maxblk);
    if (maxblk)
        ck_assert_uint_lt((g.C - 1) * g.ce, maxblk);
    for (int b = 0; b < n; b++) {
        size_t at = hc_ring_blk_off(&g, b), end = at + hc_ring_blk_cnt(&g, b);
        for (size_t c = 0; c < g.C; c++) {
            size_t off, cnt;
            hc_ring_chunk_of(&g, b, c, &off, &cnt);
            ck_assert_uint_le(cnt, g.ce);
            if (at == end) {
                ck_assert_uint_eq(cnt, 0);
                ck_assert_uint_eq(off, hc_ring_blk_off(&g, b));
                continue;
            }
            ck_assert_uint_eq(off, at);
            ck_assert_uint_gt(cnt, 0);
            at += cnt;
        }
        ck_assert_uint_eq(at, end);
    }
}

/* An all-reduce's aligned blocks (hc_ring_sched_align): contiguous, each
 * starting on a 64-byte boundary, none longer than block 0 and none more
 * than a unit longer than count/N, chunks still cutting each block in
 * order; with 64-byte chunks every chunk starts on a boundary too. */
static void check_sched_aligned(int n, size_t count, size_t es, size_t chunk)
{
    hc_ring_sched_t g;
    hc_ring_sched_plan(&g, n, count, es, chunk, 0, 1);
    hc_ring_sched_align(&g, es);
    const size_t u = 64 / es;
    size_t next = 0;
    for (int b = 0; b < n; b++) {
        size_t at = hc_ring_blk_off(&g, b), bc = hc_ring_blk_cnt(&g, b);
        ck_assert_uint_eq(at, next);
        if (bc)
            ck_assert_uint_eq(at * es % 64, 0); /* empty ones sit at count */
        ck_assert_uint_le(bc, hc_ring_blk_cnt(&g, 0));
        ck_assert_uint_le(bc, (count + (size_t)n - 1) / (size_t)n + u);
        for (size_t c = 0; c < g.C; c++) {
            size_t off, cnt;
            hc_ring_chunk_of(&g, b, c, &off, &cnt);
            if (cnt == 0)
                continue;
            ck_assert_uint_eq(off, at + c * g.ce);
            if (chunk % 64 == 0)
                ck_assert_uint_eq(off * es % 64, 0);
        }
        next += bc;
    }
    ck_assert_uint_eq(next, count);
    ck_assert_uint_eq(g.nmsg, (size_t)(n - 1) * g.C);
    ck_assert_uint_ge(g.C * g.ce, hc_ring_blk_cnt(&g, 0));
}

START_TEST(test_schedule_aligned)
{
    static const size_t counts[] = { 0, 1, 15, 16, 17, 100, 1000, 4097, 12345, 300007 };
    static const size_t sizes[] = { 1, 2, 4, 8 };
    static const size_t chunks[] = { 64, 4096, 65536 };
    for (int n = 2; n <= 9; n++)
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++)
                for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++)
                    if (counts[i] * sizes[j] / chunks[k] <= 4096)
                        check_sched_aligned(n, counts[i], sizes[j], chunks[k]);
}
END_TEST

START_TEST(test_schedule)
{
    static const size_t counts[] = { 1, 2, 3, 7, 8, 9, 100, 1000, 4097, 12345, (1u << 20) + 3 };
    static const size_t sizes[] = { 1, 2, 4, 8 };
    static const size_t chunks[] = { 8, 64, 4096, 65536, 1u << 20 };
    for (int n = 2; n <= 9; n++)
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++)
                for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
                    if (counts[i] * sizes[j] / chunks[k] > 4096)
                        continue; /* thousands of chunks say nothing more */
                    size_t gvec = chunks[k] / (size_t)n & ~(size_t)63;
                    size_t gmax = gvec >= 16 ? gvec - 16 : 0;
                    check_sched(n, counts[i], sizes[j], chunks[k], gmax, 0);
                    check_sched(n, counts[i], sizes[j], chunks[k], gmax, 1);
                }
    /* Positions wrap both ways. */
    ck_assert_int_eq(hc_ring_mod(5, -1), 4);
    ck_assert_int_eq(hc_ring_mod(5, -11), 4);
    ck_assert_int_eq(hc_ring_mod(5, 7), 2);
    ck_assert_int_eq(hc_ring_mod(1, -3), 0);
}
END_TEST

static Suite *ring_suite(void)
{
    Suite *s = suite_create("ring");
    TCase *tc = tcase_create("schedule");
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    tcase_add_test(tc, test_schedule);
    tcase_add_test(tc, test_schedule_aligned);
    suite_add_tcase(s, tc);
    tc = tcase_create("correctness");
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    tcase_add_test(tc, test_single_rank);
    tcase_add_loop_test(tc, test_matrix, 0, MAXR - 1);
    tcase_add_loop_test(tc, test_large, 0, (int)(sizeof large_cases / sizeof large_cases[0]));
    tcase_add_test(tc, test_chain_order);
    tcase_add_test(tc, test_many_small);
    tcase_add_loop_test(tc, test_bcast_chain, 0, 3);
    tcase_add_test(tc, test_device_mode);
    tcase_add_test(tc, test_device_refused_together);
    tcase_add_loop_test(tc, test_phases, 0, 4);
    tcase_add_test(tc, test_device_phases);
    suite_add_tcase(s, tc);
    tc = tcase_create("faults");
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    tcase_add_test(tc, test_kill_rank);
    tcase_add_test(tc, test_stop_rank);
    tcase_add_test(tc, test_live_late_vs_frozen);
    tcase_add_test(tc, test_corrupt_frame);
    tcase_add_loop_test(tc, test_count_mismatch, 0, 2);
    tcase_add_test(tc, test_bcast_root_mismatch);
    tcase_add_loop_test(tc, test_phase_mismatch, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ring_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
