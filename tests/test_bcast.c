/*
 * Broadcast and barrier end to end, through communicators of forked ranks
 * grouped into emulated nodes (HCOLL_HOSTID), on every plan:
 *
 *   shape          plan
 *   1x1            single
 *   1x3            intra (shared memory only)
 *   3x1            ring (one rank per node)
 *   2,1            flat (nodes of different sizes)
 *   2x2 2x3 3x2    3stage
 *
 * Broadcast: from every root, counts 0, 1, 7, 4093 and 2^20+3, in and out
 * of place, several dtypes; the root's bytes are random (NaNs, -0.0 and
 * all), and every rank must get them bit for bit, write nothing past the
 * end and leave the root's sendbuf alone. Requests of all three kinds
 * interleaved; a root or a size that differs across ranks fails on every
 * rank with HCOLL_ERR_MISMATCH. Barrier: 1000 in a row, with a rank late in
 * turn, and no rank may leave before every rank has entered (a counter in
 * shared memory). A killed rank makes the others fail promptly.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"

#define MAX_RANKS 8
#define TIMEOUT_MS 20000
#define FAIL_TIMEOUT_MS 3000
#define GUARD 64
#define BIG_COUNT (((size_t)1 << 20) + 3)
#define NBARRIERS 1000

static const size_t counts[] = { 0, 1, 7, 4093, BIG_COUNT };
#define NCOUNTS ((int)(sizeof counts / sizeof counts[0]))
static const hcoll_dtype_t dtypes[] = { HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_INT8,
                                        HCOLL_FLOAT64, HCOLL_INT32,   HCOLL_BFLOAT16 };
#define NDTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

typedef struct world {
    hct_id_slot_t slot;
    char name[32];
    int nranks;
    int node_of[MAX_RANKS];
    int victim;
    double event_ms;
    double noticed_ms[MAX_RANKS];
    hct_id_slot_t slot2; /* a second communicator */
    hct_barrier_t bar;
    volatile int entered[NBARRIERS];
} world_t;

static world_t *world_new(const char *name, const int *node_sizes, int nnodes)
{
    world_t *w = hct_shared_alloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    snprintf(w->name, sizeof w->name, "%s", name);
    for (int nd = 0; nd < nnodes; nd++)
        for (int k = 0; k < node_sizes[nd]; k++)
            w->node_of[w->nranks++] = nd;
    w->victim = -1;
    return w;
}

static int open_comm_at(world_t *w, hct_id_slot_t *slot, int rank, int nranks, int timeout_ms,
                       hcoll_comm_t *comm_out)
{
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-bc-%d-%s-node%d", (int)getppid(), w->name,
             w->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = timeout_ms;
    cfg.chunk_bytes = 4096; /* many chunks and pieces even for small vectors */
    HCT_REQUIRE(hct_share_unique_id(slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(comm_out, nranks, rank, &id, &cfg));
    return 0;
}

static int open_comm(world_t *w, int rank, int nranks, int timeout_ms, hcoll_comm_t *comm_out)
{
    return open_comm_at(w, &w->slot, rank, nranks, timeout_ms, comm_out);
}

/* The root's bytes for one case: every rank can compute them. */
static void fill(unsigned char *p, size_t bytes, uint64_t seed)
{
    uint64_t h = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < bytes; i++) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        p[i] = (unsigned char)(h >> 24);
    }
}

/* One broadcast, checked. */
static int bcast_case(world_t *w, hcoll_comm_t comm, int rank, int root, size_t count,
                      hcoll_dtype_t dt, int inplace, unsigned char *send, unsigned char *recv,
                      unsigned char *want)
{
    const size_t bytes = count * hcoll_dtype_size(dt);
    const uint64_t seed = (uint64_t)root * 1000003u + count * 31u + (uint64_t)dt;
    fill(want, bytes, seed);
    memset(recv, 0xa5, bytes + GUARD);
    const void *sb = NULL;
    if (rank == root) {
        if (inplace) {
            memcpy(recv, want, bytes);
            sb = recv;
        } else {
            memcpy(send, want, bytes);
            sb = send;
        }
    } else if (inplace) {
        sb = recv; /* ignored off the root */
    }
    hcoll_status_t st = hcoll_broadcast(comm, sb, recv, count, dt, root, NULL);
    HCT_REQUIRE(st == HCOLL_SUCCESS, "%s rank %d: root %d count %zu %s%s -> %s (%s)", w->name,
                rank, root, count, hcoll_dtype_name(dt), inplace ? " in place" : "",
                hcoll_status_name(st), hcoll_comm_last_error(comm));
    for (size_t i = 0; i < bytes; i++)
        HCT_REQUIRE(recv[i] == want[i], "%s rank %d: root %d count %zu %s: byte %zu is %02x, "
                    "want %02x", w->name, rank, root, count, hcoll_dtype_name(dt), i, recv[i],
                    want[i]);
    for (size_t g = 0; g < GUARD; g++)
        HCT_REQUIRE(recv[bytes + g] == 0xa5, "%s rank %d: wrote %zu bytes past the end",
                    w->name, rank, g + 1);
    if (rank == root && !inplace)
        HCT_REQUIRE(memcmp(send, want, bytes) == 0, "%s rank %d: sendbuf changed", w->name, rank);
    return 0;
}

static int rank_shape(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, TIMEOUT_MS, &comm))
        return 1;
    const size_t max = BIG_COUNT * 8 + GUARD;
    unsigned char *send = malloc(max), *recv = malloc(max), *want = malloc(max);
    HCT_REQUIRE(send && recv && want, "no memory");
    int k = 0;
    for (int root = 0; root < nranks; root++) {
        for (int ci = 0; ci < NCOUNTS; ci++, k++) {
            hcoll_dtype_t dt = dtypes[k % NDTYPES];
            /* The big vector once per root, alternately in place. */
            int first = counts[ci] == BIG_COUNT ? root % 2 : 0;
            int last = counts[ci] == BIG_COUNT ? root % 2 : 1;
            for (int ip = first; ip <= last; ip++)
                if (bcast_case(w, comm, rank, root, counts[ci], dt, ip, send, recv, want)) {
                    hcoll_comm_abort(comm);
                    return 1;
                }
        }
    }
    hcoll_stage_times_t t;
    HCT_OK(comm, hcoll_comm_last_stage_times(comm, &t));
    HCT_REQUIRE(t.total_us > 0, "%s: total_us %.1f", w->name, t.total_us);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    free(send);
    free(recv);
    free(want);
    return 0;
}

static void run_shape(const char *name, const int *node_sizes, int nnodes,
                      hct_rank_fn fn)
{
    world_t *w = world_new(name, node_sizes, nnodes);
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = w->nranks, .timeout_ms = 100000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, fn, w, res);
    fprintf(stderr, "[time] %s: %.1f s\n", name, (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "%s: %d rank(s) failed (see stderr)", name, bad);
    hct_shared_free(w, sizeof *w);
}

START_TEST(bcast_small_plans)
{
    run_shape("1x1", (int[]){ 1 }, 1, rank_shape);
    run_shape("1x3", (int[]){ 3 }, 1, rank_shape);
}
END_TEST

START_TEST(bcast_3x1)
{
    run_shape("3x1", (int[]){ 1, 1, 1 }, 3, rank_shape);
}
END_TEST

START_TEST(bcast_2x2)
{
    run_shape("2x2", (int[]){ 2, 2 }, 2, rank_shape);
}
END_TEST

START_TEST(bcast_2x3)
{
    run_shape("2x3", (int[]){ 3, 3 }, 2, rank_shape);
}
END_TEST

START_TEST(bcast_3x2)
{
    run_shape("3x2", (int[]){ 2, 2, 2 }, 3, rank_shape);
}
END_TEST

START_TEST(bcast_uneven)
{
    run_shape("2-1", (int[]){ 2, 1 }, 2, rank_shape);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Requests of every kind, interleaved                                        */
/* ------------------------------------------------------------------------ */

#define NREQ 9

static int rank_async(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, TIMEOUT_MS, &comm))
        return 1;
    const size_t n = 50003;
    static int32_t buf[NREQ][50003];
    hcoll_request_t rq[NREQ];
    for (int k = 0; k < NREQ; k++) {
        const int root = k % nranks;
        switch (k % 3) {
        case 0:
            for (size_t i = 0; i < n; i++)
                buf[k][i] = rank == root ? (int32_t)(i * 7 + (size_t)k) : -1;
            HCT_OK(comm, hcoll_broadcast_async(comm, buf[k], buf[k], n, HCOLL_INT32, root, NULL,
                                               &rq[k]));
            break;
        case 1:
            for (size_t i = 0; i < n; i++)
                buf[k][i] = rank + 1;
            HCT_OK(comm, hcoll_allreduce_async(comm, buf[k], buf[k], n, HCOLL_INT32, HCOLL_SUM,
                                               NULL, &rq[k]));
            break;
        default:
            HCT_OK(comm, hcoll_barrier_async(comm, &rq[k]));
        }
    }
    for (int k = NREQ - 1; k >= 0; k--) {
        HCT_OK(comm, hcoll_wait(rq[k]));
        hcoll_stage_times_t t;
        HCT_OK(comm, hcoll_request_stage_times(rq[k], &t));
        HCT_REQUIRE(t.total_us > 0, "request %d: total_us %.1f", k, t.total_us);
        HCT_OK(comm, hcoll_request_free(rq[k]));
    }
    for (int k = 0; k < NREQ; k++)
        for (size_t i = 0; k % 3 != 2 && i < n; i++) {
            int32_t want = k % 3 == 0 ? (int32_t)(i * 7 + (size_t)k) : nranks * (nranks + 1) / 2;
            HCT_REQUIRE(buf[k][i] == want, "%s rank %d: request %d element %zu is %d, want %d",
                        w->name, rank, k, i, buf[k][i], want);
        }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(requests_all_kinds)
{
    run_shape("2x2", (int[]){ 2, 2 }, 2, rank_async);
    run_shape("3x1", (int[]){ 1, 1, 1 }, 3, rank_async);
    run_shape("1x3", (int[]){ 3 }, 1, rank_async);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Mismatched arguments and bad input                                         */
/* ------------------------------------------------------------------------ */

static int rank_mismatch(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, TIMEOUT_MS, &comm))
        return 1;
    static float buf[1000];
    /* Root: rank 1 names itself, the others rank 0. */
    hcoll_status_t st = hcoll_broadcast(comm, buf, buf, 1000, HCOLL_FLOAT32, rank == 1 ? 1 : 0,
                                        NULL);
    HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "%s rank %d: different roots -> %s (%s)", w->name,
                rank, hcoll_status_name(st), hcoll_comm_last_error(comm));
    HCT_REQUIRE(strstr(hcoll_comm_last_error(comm), "root") != NULL, "%s: message '%s'",
                w->name, hcoll_comm_last_error(comm));
    /* Every rank failed alike after a complete exchange: not sticky. */
    buf[5] = rank == 2 ? 5.5f : 0.0f;
    HCT_OK(comm, hcoll_broadcast(comm, buf, buf, 1000, HCOLL_FLOAT32, 2, NULL));
    HCT_REQUIRE(buf[5] == 5.5f, "%s rank %d: after the mismatch got %g", w->name, rank, buf[5]);
    hcoll_status_t ae;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "%s: async error %s", w->name, hcoll_status_name(ae));
    HCT_OK(comm, hcoll_comm_destroy(comm));

    /* A fresh communicator: the size differs on the last rank. */
    if (open_comm_at(w, &w->slot2, rank, nranks, TIMEOUT_MS, &comm))
        return 1;
    st = hcoll_broadcast(comm, buf, buf, rank == nranks - 1 ? 999 : 1000, HCOLL_FLOAT32, 0, NULL);
    HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "%s rank %d: different counts -> %s (%s)", w->name,
                rank, hcoll_status_name(st), hcoll_comm_last_error(comm));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(bcast_mismatch)
{
    run_shape("m2x2", (int[]){ 2, 2 }, 2, rank_mismatch);
    run_shape("m3x1", (int[]){ 1, 1, 1 }, 3, rank_mismatch);
    run_shape("m1x3", (int[]){ 3 }, 1, rank_mismatch);
}
END_TEST

static int rank_args(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, TIMEOUT_MS, &comm))
        return 1;
    float x[4] = { 0 };
    struct {
        hcoll_status_t st;
        const char *what;
    } c[] = {
        { hcoll_broadcast(comm, x, x, 4, HCOLL_FLOAT32, -1, NULL), "root -1" },
        { hcoll_broadcast(comm, x, x, 4, HCOLL_FLOAT32, nranks, NULL), "root = size" },
        { hcoll_broadcast(comm, x, NULL, 4, HCOLL_FLOAT32, 0, NULL), "recvbuf NULL" },
        /* Every rank names itself the root: each refuses on its own. */
        { hcoll_broadcast(comm, NULL, x, 4, HCOLL_FLOAT32, rank, NULL), "root's sendbuf NULL" },
        { hcoll_broadcast(comm, x, x, 4, (hcoll_dtype_t)99, 0, NULL), "dtype 99" },
        { hcoll_broadcast(comm, x, x + 1, 3, HCOLL_FLOAT32, rank, NULL), "overlap" },
        { hcoll_broadcast_async(comm, x, x, 4, HCOLL_FLOAT32, 0, NULL, NULL), "req_out NULL" },
        { hcoll_barrier_async(comm, NULL), "barrier req_out NULL" },
        { hcoll_broadcast(NULL, x, x, 4, HCOLL_FLOAT32, 0, NULL), "comm NULL" },
        { hcoll_barrier(NULL), "barrier comm NULL" },
    };
    /* A stream with host buffers is refused, clearly and locally: no CUDA
     * driver here (HCOLL_ERR_UNSUPPORTED), or host memory with a stream
     * where there is one (HCOLL_ERR_INVALID_ARG). Device broadcasts are
     * test_gpu_coll's. */
    hcoll_status_t dst = hcoll_broadcast(comm, x, x, 4, HCOLL_FLOAT32, 0, (void *)0x1);
    const char *dmsg = hcoll_comm_last_error(comm);
    HCT_REQUIRE((dst == HCOLL_ERR_UNSUPPORTED && strstr(dmsg, "CUDA stream") != NULL) ||
                    (dst == HCOLL_ERR_INVALID_ARG && strstr(dmsg, "host memory") != NULL),
                "%s rank %d: broadcast of host buffers with a stream -> %s (%s)", w->name, rank,
                hcoll_status_name(dst), dmsg);
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        HCT_REQUIRE(c[i].st == HCOLL_ERR_INVALID_ARG, "%s rank %d: %s -> %s", w->name, rank,
                    c[i].what, hcoll_status_name(c[i].st));
    }
    /* Bad arguments are not sticky: the communicator still works, and a
     * NULL sendbuf off the root and NULL buffers with count 0 are fine. */
    x[0] = rank == 1 ? 42.0f : 0.0f;
    HCT_OK(comm, hcoll_broadcast(comm, rank == 1 ? x : NULL, x, 4, HCOLL_FLOAT32, 1, NULL));
    HCT_REQUIRE(x[0] == 42.0f, "%s rank %d: got %g", w->name, rank, x[0]);
    HCT_OK(comm, hcoll_broadcast(comm, NULL, NULL, 0, HCOLL_FLOAT32, 0, NULL));
    HCT_OK(comm, hcoll_barrier(comm));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(argument_errors)
{
    run_shape("a2x2", (int[]){ 2, 2 }, 2, rank_args);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Barrier                                                                    */
/* ------------------------------------------------------------------------ */

static int rank_barrier(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, TIMEOUT_MS, &comm))
        return 1;
    const double t0 = hct_now_ms();
    for (int i = 0; i < NBARRIERS; i++) {
        /* One rank in turn comes late, so a barrier that let anyone through
         * early would show. */
        if (i % 50 == 0 && rank == (i / 50) % nranks)
            usleep(2000);
        __atomic_fetch_add(&w->entered[i], 1, __ATOMIC_SEQ_CST);
        hcoll_status_t st = hcoll_barrier(comm);
        HCT_REQUIRE(st == HCOLL_SUCCESS, "%s rank %d: barrier %d -> %s (%s)", w->name, rank, i,
                    hcoll_status_name(st), hcoll_comm_last_error(comm));
        int in = __atomic_load_n(&w->entered[i], __ATOMIC_SEQ_CST);
        HCT_REQUIRE(in == nranks, "%s rank %d: left barrier %d when only %d of %d had entered",
                    w->name, rank, i, in, nranks);
    }
    const double ms = hct_now_ms() - t0;
    if (rank == 0)
        fprintf(stderr, "[time] %s: %d barriers, %.1f us each\n", w->name, NBARRIERS,
                ms * 1e3 / NBARRIERS);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(barrier_1000)
{
    run_shape("b2x2", (int[]){ 2, 2 }, 2, rank_barrier);
    run_shape("b3x1", (int[]){ 1, 1, 1 }, 3, rank_barrier);
    run_shape("b1x3", (int[]){ 3 }, 1, rank_barrier);
    run_shape("b2-1", (int[]){ 2, 1 }, 2, rank_barrier);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A killed rank                                                              */
/* ------------------------------------------------------------------------ */

static void *killer_main(void *p)
{
    world_t *w = p;
    usleep(1000);
    w->event_ms = hct_now_ms();
    raise(SIGKILL);
    return NULL;
}

/* Barriers and broadcasts in turn; the victim dies in its 20th call. */
static int rank_kill(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, FAIL_TIMEOUT_MS, &comm))
        return 1;
    static unsigned char buf[1 << 20];
    for (int it = 0; it < 100000; it++) {
        if (rank == w->victim && it == 20) {
            pthread_t th;
            HCT_REQUIRE(pthread_create(&th, NULL, killer_main, w) == 0, "pthread_create");
        }
        hcoll_status_t st = it % 2 ? hcoll_barrier(comm)
                                   : hcoll_broadcast(comm, buf, buf, sizeof buf, HCOLL_UINT8,
                                                     it % nranks, NULL);
        if (st == HCOLL_SUCCESS)
            continue;
        double now = hct_now_ms();
        HCT_REQUIRE(rank != w->victim, "%s victim: %s before it died", w->name,
                    hcoll_status_name(st));
        HCT_REQUIRE(w->event_ms > 0, "%s rank %d: call %d -> %s (%s) before the kill", w->name,
                    rank, it, hcoll_status_name(st), hcoll_comm_last_error(comm));
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_TIMEOUT ||
                        st == HCOLL_ERR_ABORTED,
                    "%s rank %d: -> %s", w->name, rank, hcoll_status_name(st));
        w->noticed_ms[rank] = now - w->event_ms;
        HCT_REQUIRE(now - w->event_ms <= FAIL_TIMEOUT_MS / 2 + 500,
                    "%s rank %d: failed %.0f ms after the kill", w->name, rank,
                    now - w->event_ms);
        /* Sticky: the next call fails at once with the same error. */
        HCT_REQUIRE(hcoll_barrier(comm) == st, "%s rank %d: not sticky", w->name, rank);
        HCT_OK(comm, hcoll_comm_destroy(comm));
        return 0;
    }
    HCT_REQUIRE(0, "%s rank %d: no failure", w->name, rank);
}

static void run_kill(const char *name, const int *node_sizes, int nnodes, int victim)
{
    world_t *w = world_new(name, node_sizes, nnodes);
    w->victim = victim;
    hct_opts_t o = { .nranks = w->nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    hct_run(&o, rank_kill, w, res);
    double worst = 0;
    for (int r = 0; r < w->nranks; r++) {
        worst = w->noticed_ms[r] > worst ? w->noticed_ms[r] : worst;
        if (r == victim)
            ck_assert_msg(res[r].signaled && res[r].sig == SIGKILL,
                          "kill on %s: the victim did not die of SIGKILL", name);
        else
            ck_assert_msg(res[r].exited && res[r].code == 0,
                          "kill on %s: survivor %d failed (see stderr)", name, r);
    }
    fprintf(stderr, "[time] kill %s: slowest survivor failed %.0f ms after the kill\n", name,
            worst);
    hct_shared_free(w, sizeof *w);
}

START_TEST(kill_rank)
{
    run_kill("k2x2", (int[]){ 2, 2 }, 2, 3);
    run_kill("k3x1", (int[]){ 1, 1, 1 }, 3, 1);
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

    Suite *s = suite_create("bcast");
    TCase *bc = tcase_create("broadcast");
    tcase_set_timeout(bc, 120);
    tcase_add_test(bc, bcast_small_plans);
    tcase_add_test(bc, bcast_3x1);
    tcase_add_test(bc, bcast_2x2);
    tcase_add_test(bc, bcast_2x3);
    tcase_add_test(bc, bcast_3x2);
    tcase_add_test(bc, bcast_uneven);
    tcase_add_test(bc, requests_all_kinds);
    tcase_add_test(bc, bcast_mismatch);
    tcase_add_test(bc, argument_errors);
    suite_add_tcase(s, bc);

    TCase *bar = tcase_create("barrier");
    tcase_set_timeout(bar, 120);
    tcase_add_test(bar, barrier_1000);
    tcase_add_test(bar, kill_rank);
    suite_add_tcase(s, bar);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
