/*
 * Registered buffers (hcoll_mem_register / hcoll_mem_deregister) through
 * the public API, on the emulated libibverbs (tests/mock/verbs.c counts
 * every ibv_reg_mr as "mr_registrations") and on TCP.
 *
 *   verbs  a registered 64 MiB buffer all-reduced 100 times costs one
 *          registration; the same loop without it costs one per call;
 *          likewise on 2 nodes x 2 (three stages, a ring per rail)
 *   errors NULL, 0 bytes, overlaps, duplicates, unknown or twice
 *          deregistered handles; destroy with registrations left frees
 *          them (no verbs object left, ASan-clean)
 *   tcp    registration is accepted and changes nothing but the record
 *   colls  reduce-scatter, all-gather and broadcast on unregistered
 *          buffers register nothing per call (2 x 2, and the ring plan);
 *          hcoll's permuted vector refused its registration: the calls
 *          go through in the ring's stage
 */
#include <check.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "hc_build.h"
#include "hcoll.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
/* Ranks end with _exit, which skips LeakSanitizer's check: run it here. */
#define LEAK_CHECK() (__lsan_do_recoverable_leak_check() == 0)
#else
#define LEAK_CHECK() 1
#endif

#if HCOLL_BUILD_VERBS

#define BIG_COUNT ((size_t)16 << 20) /* 64 MiB of int32 */
#define ITERS 100
#define BASELINE_ITERS 4

typedef struct mr_arg {
    hct_id_slot_t slot;
    const char *net;
    size_t count; /* elements all-reduced per call */
    int staged;   /* unregistered calls run in the ring's stage (ring.h) */
} mr_arg_t;

/* A counter of the emulated provider (UINT64_MAX where it is not loaded). */
static uint64_t mock_count(const char *name)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    uint64_t (*stat)(const char *) = h ? (uint64_t(*)(const char *))dlsym(h, "hcmock_verbs_stat")
                                       : NULL;
    return stat ? stat(name) : UINT64_MAX;
}

static uint64_t regs(void)
{
    return mock_count("mr_registrations");
}

/* iters all-reduces (MAX, in place) of count elements: rank r contributes
 * r + 1, so every round, and every later one, yields n exactly. */
static int loop(hcoll_comm_t comm, int32_t *buf, size_t count, int iters, int rank, int n)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = rank + 1;
    for (int k = 0; k < iters; k++) {
        HCT_OK(comm, hcoll_allreduce(comm, buf, buf, count, HCOLL_INT32, HCOLL_MAX, NULL));
        HCT_REQUIRE(buf[0] == n && buf[count / 2] == n && buf[count - 1] == n,
                    "round %d: %d %d %d, want %d", k, buf[0], buf[count / 2], buf[count - 1], n);
    }
    for (size_t i = 0; i < count; i++)
        HCT_REQUIRE(buf[i] == n, "element %zu is %d, want %d", i, buf[i], n);
    return 0;
}

static int errors(hcoll_comm_t comm, int32_t *buf)
{
    hcoll_mem_t h = NULL, h2 = NULL;
    HCT_REQUIRE(hcoll_mem_register(NULL, buf, 64, &h) == HCOLL_ERR_INVALID_ARG, "NULL comm");
    HCT_REQUIRE(hcoll_mem_register(comm, NULL, 64, &h) == HCOLL_ERR_INVALID_ARG, "NULL ptr");
    HCT_REQUIRE(hcoll_mem_register(comm, buf, 0, &h) == HCOLL_ERR_INVALID_ARG, "0 bytes");
    HCT_REQUIRE(hcoll_mem_register(comm, buf, 64, NULL) == HCOLL_ERR_INVALID_ARG, "NULL out");
    HCT_REQUIRE(h == NULL, "handle written on failure");
    HCT_OK(comm, hcoll_mem_register(comm, buf + 16, 4096, &h));
    HCT_REQUIRE(hcoll_mem_register(comm, buf + 16, 4096, &h2) == HCOLL_ERR_INVALID_ARG,
                "duplicate registration accepted");
    HCT_REQUIRE(hcoll_mem_register(comm, buf, 128, &h2) == HCOLL_ERR_INVALID_ARG,
                "overlap from below accepted");
    HCT_REQUIRE(hcoll_mem_register(comm, buf + 100, 8192, &h2) == HCOLL_ERR_INVALID_ARG,
                "overlap from inside accepted");
    HCT_REQUIRE(strstr(hcoll_comm_last_error(comm), "overlaps"), "message: %s",
                hcoll_comm_last_error(comm));
    /* Adjacent is not overlapping. */
    HCT_OK(comm, hcoll_mem_register(comm, buf, 64, &h2));
    int bogus;
    HCT_REQUIRE(hcoll_mem_deregister(comm, (hcoll_mem_t)(void *)&bogus) == HCOLL_ERR_INVALID_ARG,
                "unknown handle accepted");
    HCT_OK(comm, hcoll_mem_deregister(comm, h2));
    HCT_REQUIRE(hcoll_mem_deregister(comm, h2) == HCOLL_ERR_INVALID_ARG,
                "deregistered twice");
    HCT_OK(comm, hcoll_mem_deregister(comm, NULL));
    HCT_OK(comm, hcoll_mem_deregister(comm, h));
    hcoll_rdma_counters_t k = { 0 };
    HCT_REQUIRE(hcoll_rdma_counters(NULL) == HCOLL_ERR_INVALID_ARG, "counters NULL");
    HCT_REQUIRE(hcoll_rdma_counters(&k) == HCOLL_ERR_INVALID_ARG, "counters size 0");
    /* An older, shorter struct: only the fields that fit are written. */
    struct {
        size_t size;
        uint64_t registrations;
        uint64_t canary;
    } old = { offsetof(hcoll_rdma_counters_t, deregistrations), 0, 0x5a5a };
    HCT_OK(comm, hcoll_rdma_counters((hcoll_rdma_counters_t *)(void *)&old));
    HCT_REQUIRE(old.canary == 0x5a5a, "wrote past the caller's size");
    return 0;
}

/* This rank's communicator over net, on loopback. */
static int comm_open(hct_id_slot_t *slot, const char *net, int rank, int n, hcoll_comm_t *out)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 20000;
    cfg.net = net;
    HCT_REQUIRE(hct_share_unique_id(slot, rank, 20000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(out, n, rank, &id, &cfg));
    return 0;
}

/* After destroy: no verbs object left (ib), nothing leaked. */
static int left_clean(int rank, int ib)
{
    if (ib) {
        char who[32];
        snprintf(who, sizeof who, "rank %d", rank);
        if (hct_mock_clean(who, 1) || hct_mock_released(who))
            return 1;
    }
    HCT_REQUIRE(LEAK_CHECK(), "rank %d: leaks (see the report above)", rank);
    return 0;
}

static int rank_memreg(int rank, int n, void *argp)
{
    mr_arg_t *a = argp;
    hcoll_comm_t comm;
    if (comm_open(&a->slot, a->net, rank, n, &comm))
        return 1;
    const int ib = strcmp(a->net, "ib") == 0;
    int32_t *buf = malloc(BIG_COUNT * sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    if (errors(comm, buf))
        return 1;

    /* Without a registration: at least one registration per call where
     * the ring registers the caller's buffer (past the stage's size), the
     * stage's own once (its first growth) where the calls run in it. */
    uint64_t r0 = regs();
    if (loop(comm, buf, a->count, BASELINE_ITERS, rank, n))
        return 1;
    uint64_t r1 = regs();
    if (ib && !a->staged)
        HCT_REQUIRE(r1 - r0 >= BASELINE_ITERS, "%d calls without registration: %llu regs",
                    BASELINE_ITERS, (unsigned long long)(r1 - r0));
    if (ib && a->staged)
        HCT_REQUIRE(r1 - r0 <= 1, "%d staged calls without registration: %llu regs",
                    BASELINE_ITERS, (unsigned long long)(r1 - r0));

    /* Registered: one registration, then none for 100 calls. */
    hcoll_mem_t h;
    hcoll_rdma_counters_t k1 = HCOLL_RDMA_COUNTERS_INITIALIZER, k2 = k1, k3 = k1;
    HCT_OK(comm, hcoll_rdma_counters(&k1));
    HCT_OK(comm, hcoll_mem_register(comm, buf, BIG_COUNT * sizeof *buf, &h));
    HCT_OK(comm, hcoll_rdma_counters(&k2));
    uint64_t r2 = regs();
    if (ib)
        HCT_REQUIRE(r2 - r1 == 1, "hcoll_mem_register: %llu registrations",
                    (unsigned long long)(r2 - r1));
    if (loop(comm, buf, a->count, ITERS, rank, n))
        return 1;
    uint64_t r3 = regs();
    HCT_OK(comm, hcoll_rdma_counters(&k3));
    /* The public counters agree with the provider's own count. */
    HCT_REQUIRE(k2.registrations - k1.registrations == (ib ? 1u : 0u) &&
                    k3.registrations == k2.registrations,
                "hcoll_rdma_counters: %llu registrations to register, %llu for %d calls",
                (unsigned long long)(k2.registrations - k1.registrations),
                (unsigned long long)(k3.registrations - k2.registrations), ITERS);
    HCT_REQUIRE(!ib || k3.cache_hits - k2.cache_hits >= ITERS,
                "hcoll_rdma_counters: %llu cache hits for %d calls in a registered buffer",
                (unsigned long long)(k3.cache_hits - k2.cache_hits), ITERS);
    if (ib)
        HCT_REQUIRE(r3 == r2, "%d calls in a registered buffer: %llu registrations", ITERS,
                    (unsigned long long)(r3 - r2));
    fprintf(stderr, "rank %d (%s): %llu registrations for %d calls unregistered, %llu for "
            "registering + %d calls\n",
            rank, a->net, (unsigned long long)(r1 - r0), BASELINE_ITERS,
            (unsigned long long)(r3 - r1), ITERS);
    HCT_OK(comm, hcoll_mem_deregister(comm, h));

    /* Destroy with registrations outstanding: freed, nothing left. */
    hcoll_mem_t left[2];
    HCT_OK(comm, hcoll_mem_register(comm, buf, 4096, &left[0]));
    HCT_OK(comm, hcoll_mem_register(comm, buf + 4096, 4096, &left[1]));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    /* The handles are invalid now; forget them so that the leak check
     * sees whether destroy freed what they pointed to. */
    volatile hcoll_mem_t *lp = left;
    lp[0] = lp[1] = NULL;
    free(buf);
    return left_clean(rank, ib);
}

/* ---- reduce-scatter, all-gather and broadcast: nothing registered per call ---- */

#define COLL_WARM 2  /* calls that may grow the stage or register hcoll's vector */
#define COLL_CALLS 4 /* calls that must register nothing */

/* One collective, warm + COLL_CALLS times on unregistered buffers; the
 * registrations of the last COLL_CALLS into *regs_out. kind: 0
 * reduce-scatter, 1 all-gather, 2 broadcast (root nranks - 1). */
static int coll_loop(hcoll_comm_t comm, int kind, size_t count, int warm, int rank, int n,
                     uint64_t *regs_out)
{
    const size_t total = count * (size_t)n;
    int32_t *send = malloc(total * sizeof *send), *recv = malloc(total * sizeof *recv);
    HCT_REQUIRE(send && recv, "no memory");
    uint64_t r0 = 0;
    for (int it = 0; it < warm + COLL_CALLS; it++) {
        if (it == warm)
            r0 = regs();
        for (size_t i = 0; i < total; i++)
            send[i] = (int32_t)((i * 7 + (size_t)rank * 3 + (size_t)it) % 1000);
        memset(recv, 0xee, total * sizeof *recv);
        if (kind == 0)
            HCT_OK(comm, hcoll_reduce_scatter(comm, send, recv, count, HCOLL_INT32, HCOLL_SUM,
                                              NULL));
        else if (kind == 1)
            HCT_OK(comm, hcoll_allgather(comm, send + (size_t)rank * count, recv, count,
                                         HCOLL_INT32, NULL));
        else
            HCT_OK(comm, hcoll_broadcast(comm, send, recv, total, HCOLL_INT32, n - 1, NULL));
        const size_t len = kind == 0 ? count : total;
        for (size_t i = 0; i < len; i++) {
            int32_t want = 0;
            if (kind == 0)
                for (int r = 0; r < n; r++)
                    want += (int32_t)((((size_t)rank * count + i) * 7 + (size_t)r * 3 +
                                       (size_t)it) % 1000);
            else
                want = (int32_t)((i * 7 + (kind == 1 ? i / count : (size_t)n - 1) * 3 +
                                  (size_t)it) % 1000);
            HCT_REQUIRE(recv[i] == want, "kind %d call %d: element %zu is %d, want %d", kind,
                        it, i, recv[i], want);
        }
    }
    *regs_out = regs() - r0;
    free(send);
    free(recv);
    return 0;
}

typedef struct colls_arg {
    hct_id_slot_t slot;
    size_t count; /* elements per block */
    int warm;     /* calls before the counted ones */
    unsigned long long regs[4][3];
} colls_arg_t;

static int rank_colls(int rank, int n, void *argp)
{
    colls_arg_t *a = argp;
    hcoll_comm_t comm;
    if (comm_open(&a->slot, "ib", rank, n, &comm))
        return 1;
    for (int kind = 0; kind < 3; kind++) {
        uint64_t r = 0;
        if (coll_loop(comm, kind, a->count, a->warm, rank, n, &r))
            return 1;
        a->regs[rank][kind] = (unsigned long long)r;
    }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return left_clean(rank, 1);
}

/* Before: each call registered the caller's buffers (or hcoll's permuted
 * vector) once per ring job and deregistered them after. */
static void run_colls(size_t count, int nranks, int per_node, int warm)
{
    colls_arg_t *a = hct_shared_alloc(sizeof *a);
    memset(a, 0, sizeof *a);
    a->count = count;
    a->warm = warm;
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = per_node, .timeout_ms = 100000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_colls, a, res);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
    static const char *names[] = { "reduce-scatter", "all-gather", "broadcast" };
    for (int r = 0; r < nranks; r++)
        for (int k = 0; k < 3; k++) {
            fprintf(stderr, "%d x %d, %zu elements per block, rank %d: %s: %llu "
                    "registration(s) in %d calls after %d\n", nranks / per_node, per_node,
                    count, r, names[k], a->regs[r][k], COLL_CALLS, warm);
            ck_assert_msg(a->regs[r][k] == 0, "rank %d: %s registered %llu time(s) in %d "
                          "calls on unregistered buffers", r, names[k], a->regs[r][k],
                          COLL_CALLS);
        }
    hct_shared_free(a, sizeof *a);
}

/* hcoll's permuted vector refused its registration (one rank, ENOMEM as
 * `ulimit -l` gives) while the ring's stage already holds the jobs (an
 * all-reduce grew it): the reduce-scatter goes through on every rank, and
 * so do the next calls, in the stage, registering nothing. */
#define VREF_COUNT 5000 /* int32 per block: small jobs, within the stage, but past
                          * the inline limits (80 KB in all: the ring's phases run) */

static int rank_vector_refused(int rank, int n, void *argp)
{
    colls_arg_t *a = argp;
    hcoll_comm_t comm;
    if (comm_open(&a->slot, "ib", rank, n, &comm))
        return 1;
    const size_t big = (size_t)1 << 20; /* 4 MiB all-reduced: the stage grows */
    int32_t *buf = malloc(big * sizeof *buf), *out = malloc(VREF_COUNT * sizeof *out);
    HCT_REQUIRE(buf && out, "no memory");
    for (size_t i = 0; i < big; i++)
        buf[i] = rank + 1;
    HCT_OK(comm, hcoll_allreduce(comm, buf, buf, big, HCOLL_INT32, HCOLL_MAX, NULL));
    const int odd = n - 1;
    const uint64_t refused0 = mock_count("injected_reg_failures");
    uint64_t r0 = 0;
    for (int it = 0; it < 4; it++) {
        if (it == 0 && rank == odd)
            setenv("HCMOCK_IB_REG_FAIL", "12", 1);
        if (it == 1) {
            unsetenv("HCMOCK_IB_REG_FAIL");
            r0 = regs();
        }
        for (size_t i = 0; i < (size_t)n * VREF_COUNT; i++)
            buf[i] = (int32_t)(i % 977) + rank + it;
        HCT_OK(comm, hcoll_reduce_scatter(comm, buf, out, VREF_COUNT, HCOLL_INT32, HCOLL_SUM,
                                          NULL));
        for (size_t i = 0; i < VREF_COUNT; i++) {
            const size_t g = (size_t)rank * VREF_COUNT + i;
            const int32_t want = (int32_t)((size_t)n * (g % 977) + (size_t)n * (size_t)it) +
                                 n * (n - 1) / 2;
            HCT_REQUIRE(out[i] == want, "call %d: element %zu is %d, want %d", it, i, out[i],
                        want);
        }
    }
    HCT_REQUIRE(rank != odd || mock_count("injected_reg_failures") > refused0,
                "rank %d: the permuted vector's registration was not refused", rank);
    a->regs[rank][0] = (unsigned long long)(regs() - r0);
    free(buf);
    free(out);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return left_clean(rank, 1);
}

START_TEST(colls_ib_vector_refused)
{
    colls_arg_t *a = hct_shared_alloc(sizeof *a);
    memset(a, 0, sizeof *a);
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 2, .timeout_ms = 100000 };
    hct_result_t res[4];
    ck_assert_int_eq(hct_run(&o, rank_vector_refused, a, res), 0);
    for (int r = 0; r < 4; r++)
        ck_assert_msg(a->regs[r][0] == 0, "rank %d: %llu registrations in 3 calls after the "
                      "refusal (the stage should hold them)", r, a->regs[r][0]);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* Three stages: the rings work in hcoll's permuted vector (kept
 * registered) and the broadcast's chain in the stage. 4 MiB per call. */
START_TEST(colls_ib_2x2_unregistered) { run_colls(1 << 18, 4, 2, COLL_WARM); }
END_TEST

/* The ring plan: the reduce-scatter reads sendbuf itself, the all-gather
 * works in recvbuf itself, the chain in recvbuf: all in the stage. */
START_TEST(colls_ib_ring_unregistered) { run_colls(1 << 17, 2, 1, COLL_WARM); }
END_TEST

/* 2 x 2, 64 elements per block (1 KiB in all): every call travels with
 * the argument agreement, which registers nothing, the first call
 * included (before, the first one grew the ring's stage or registered
 * hcoll's permuted vector for ring jobs that never ran). */
START_TEST(colls_ib_inline_unregistered) { run_colls(64, 4, 2, 0); }
END_TEST

static void run(const char *net, size_t count, int nranks, int per_node)
{
    mr_arg_t *a = hct_shared_alloc(sizeof *a);
    memset(a, 0, sizeof *a);
    a->net = net;
    a->count = count;
    /* Three stages: shards of pieces, always within the stage's 4 MiB. */
    a->staged = per_node > 1 || count * sizeof(int32_t) <= ((size_t)4 << 20);
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = per_node, .timeout_ms = 100000 };
    hct_result_t res[4];
    double t0 = hct_now_ms();
    int bad = hct_run(&o, rank_memreg, a, res);
    fprintf(stderr, "[time] memreg %s, %d ranks, %zu elements: %.1f s\n", net, nranks, count,
            (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "memreg over %s: %d rank(s) failed (see stderr)", net, bad);
    hct_shared_free(a, sizeof *a);
}

START_TEST(memreg_ib_64mib) { run("ib", BIG_COUNT, 2, 1); }
END_TEST

/* Three stages: each rail's ring works on shards inside the range. */
START_TEST(memreg_ib_2x2) { run("ib", 1 << 20, 4, 2); }
END_TEST

START_TEST(memreg_tcp) { run("tcp", 1 << 16, 2, 1); }
END_TEST

int main(int argc, char **argv)
{
    (void)argc;
    int rc = hct_mockib_enter(argv);
    if (rc != 0)
        return rc;
    unsetenv("HCOLL_HOSTID");
    Suite *s = suite_create("memreg");
    TCase *tc = tcase_create("memreg");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, memreg_ib_64mib);
    tcase_add_test(tc, memreg_ib_2x2);
    tcase_add_test(tc, memreg_tcp);
    tcase_add_test(tc, colls_ib_2x2_unregistered);
    tcase_add_test(tc, colls_ib_ring_unregistered);
    tcase_add_test(tc, colls_ib_inline_unregistered);
    tcase_add_test(tc, colls_ib_vector_refused);
    suite_add_tcase(s, tc);
    return hct_mockib_run(s);
}

#else /* !HCOLL_BUILD_VERBS */

int main(void)
{
    printf("SKIP: hcoll was built without rdma-core headers: no verbs transport to test\n");
    return 77;
}

#endif
