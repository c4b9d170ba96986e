/*
 * Ranks that disagree, through communicators of forked ranks grouped into
 * emulated nodes (HCOLL_HOSTID): 2x2, 3x1 and 2x3 (three-stage and ring
 * plans), over TCP.
 *
 * One rank (the last: on another node than rank 0) passes another count,
 * dtype, op, root or collective, for every host collective, out of place
 * and in place, blocking and async, small (latency path) and large
 * (pipelined). Every rank must return HCOLL_ERR_MISMATCH, with a message
 * naming the field and the odd rank; no recvbuf may change (the root's
 * too); and the next matching call must succeed with the right result.
 *
 * With HCOLL_CHECK_ARGS=0 (no agreement), on one node: local ranks that
 * disagree on the dtype or the op alone are caught by the shared-memory
 * step's own comparison (every local rank returns HCOLL_ERR_MISMATCH).
 *
 * On the emulated verbs provider (3x1 and 2x2, HCOLL_NET=ib): one rank's
 * host buffer cannot be registered (HCMOCK_IB_MEMLOCK_KB, as
 * RLIMIT_MEMLOCK): the all-reduce and the broadcast fail on every
 * rank with that rank's status, no recvbuf changes, and the next calls
 * work. (Without the agreement the ring's own registration fails half-way
 * and the communicator with it.)
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "hc_build.h"

#define MAX_RANKS 6
#define TIMEOUT_MS 20000
#define BIG (64 * 1024 + 5) /* floats: past HCOLL_SMALL_BYTES, several pieces */
#define SENTINEL 1234.5f

typedef struct world {
    hct_id_slot_t slot[4];
    char name[32];
    int nranks;
    int node_of[MAX_RANKS];
} world_t;

static int open_comm(world_t *w, int k, int rank, int nranks, hcoll_comm_t *comm_out)
{
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-mism-%d-%s-node%d", (int)getppid(), w->name,
             w->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.chunk_bytes = 4096; /* many chunks and pieces for the large case */
    if (getenv("HCT_MISM_IB")) {
        setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
        cfg.net = "ib";
        cfg.chunk_bytes = 65536;
    }
    HCT_REQUIRE(hct_share_unique_id(&w->slot[k], rank, TIMEOUT_MS, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(comm_out, nranks, rank, &id, &cfg));
    return 0;
}

static float *fill(size_t n, float v)
{
    float *b = malloc((n ? n : 1) * sizeof *b);
    for (size_t i = 0; b && i < n; i++)
        b[i] = v;
    return b;
}

/* What every rank checks after a call that must fail: MISMATCH, the field
 * and the odd rank named, buf[0..n) still SENTINEL. */
static int expect(const world_t *w, hcoll_comm_t comm, int rank, hcoll_status_t st,
                  const char *what, const char *field, int odd, const float *buf, size_t n)
{
    const char *msg = hcoll_comm_last_error(comm);
    HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "%s rank %d: %s -> %s (%s)", w->name, rank, what,
                hcoll_status_name(st), msg);
    char want[32];
    snprintf(want, sizeof want, "rank %d passed", odd);
    HCT_REQUIRE(strstr(msg, field) && strstr(msg, want),
                "%s rank %d: %s: the message does not name '%s' and '%s': %s", w->name, rank,
                what, field, want, msg);
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(buf[i] == SENTINEL, "%s rank %d: %s: recvbuf[%zu] is %g after the mismatch",
                    w->name, rank, what, i, buf[i]);
    return 0;
}

/* The communicator still works: a matching all-reduce of n floats. */
static int still_works(const world_t *w, hcoll_comm_t comm, int rank, size_t n, const char *after)
{
    float *v = fill(n, (float)rank);
    HCT_REQUIRE(v, "no memory");
    HCT_OK(comm, hcoll_allreduce(comm, v, v, n, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    const float want = (float)(w->nranks * (w->nranks - 1) / 2);
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(v[i] == want, "%s rank %d: after %s, element %zu is %g, want %g", w->name,
                    rank, after, i, v[i], want);
    free(v);
    return 0;
}

#define EXPECT(st, what, field, buf, n)                                         \
    do {                                                                        \
        if (expect(w, comm, rank, (st), (what), (field), odd, (buf), (n)) ||     \
            still_works(w, comm, rank, 33, (what)))                              \
            return 1;                                                           \
    } while (0)

static int rank_allreduce(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, 0, rank, nranks, &comm))
        return 1;
    const int odd = nranks - 1, me = rank == odd;
    float *in = fill(BIG, 1.0f), *out = fill(BIG, SENTINEL);
    HCT_REQUIRE(in && out, "no memory");
    hcoll_status_t st;

    st = hcoll_allreduce(comm, in, out, me ? 99 : 100, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    EXPECT(st, "small count", "count", out, BIG);
    st = hcoll_allreduce(comm, in, out, BIG - (me ? 1 : 0), HCOLL_FLOAT32, HCOLL_SUM, NULL);
    EXPECT(st, "large count", "count", out, BIG);
    /* In place: the vector must stay as it was. */
    st = hcoll_allreduce(comm, out, out, 100, me ? HCOLL_INT32 : HCOLL_FLOAT32, HCOLL_SUM, NULL);
    EXPECT(st, "in-place dtype", "dtype", out, BIG);
    st = hcoll_allreduce(comm, out, out, BIG, HCOLL_FLOAT32, me ? HCOLL_MAX : HCOLL_SUM, NULL);
    EXPECT(st, "in-place large op", "op", out, BIG);
    st = hcoll_allreduce(comm, in, out, 64, HCOLL_FLOAT32, me ? HCOLL_AVG : HCOLL_SUM, NULL);
    EXPECT(st, "AVG against SUM", "op", out, BIG);
    /* The small call travels with the agreement (up to chunk_bytes less its
     * header here): one rank's count past that limit, the others' within. */
    st = hcoll_allreduce(comm, in, out, me ? 2048 : 100, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    EXPECT(st, "count across the agreement's inline limit", "count", out, BIG);
    /* In place and scaled (AVG scales the input first): still untouched. */
    st = hcoll_allreduce(comm, out, out, 64, HCOLL_FLOAT32, me ? HCOLL_SUM : HCOLL_AVG, NULL);
    EXPECT(st, "in-place AVG against SUM", "op", out, BIG);

    /* Async: the request reports it, and the next request runs. */
    hcoll_request_t rq;
    HCT_OK(comm, hcoll_allreduce_async(comm, in, out, me ? 7 : 8, HCOLL_FLOAT32, HCOLL_SUM, NULL,
                                       &rq));
    st = hcoll_wait(rq);
    hcoll_request_free(rq);
    EXPECT(st, "async count", "count", out, BIG);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    free(in);
    free(out);
    return 0;
}

static int rank_others(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, 1, rank, nranks, &comm))
        return 1;
    const int odd = nranks - 1, me = rank == odd;
    float *in = fill(BIG * MAX_RANKS, 2.0f), *out = fill(BIG * MAX_RANKS, SENTINEL);
    HCT_REQUIRE(in && out, "no memory");
    hcoll_status_t st;

    /* Broadcast: the root's recvbuf (out of place) stays too. */
    st = hcoll_broadcast(comm, in, out, 100, HCOLL_FLOAT32, me ? 1 : 0, NULL);
    EXPECT(st, "broadcast root", "root", out, 100);
    st = hcoll_broadcast(comm, in, out, me ? BIG - 1 : BIG, HCOLL_FLOAT32, 0, NULL);
    EXPECT(st, "broadcast large count", "count", out, BIG);
    st = hcoll_reduce_scatter(comm, in, out, 50, me ? HCOLL_INT32 : HCOLL_FLOAT32, HCOLL_SUM,
                              NULL);
    EXPECT(st, "reduce_scatter dtype", "dtype", out, BIG);
    st = hcoll_reduce_scatter(comm, in, out, BIG, HCOLL_FLOAT32, me ? HCOLL_MIN : HCOLL_SUM,
                              NULL);
    EXPECT(st, "reduce_scatter large op", "op", out, BIG);
    st = hcoll_allgather(comm, in, out, me ? 30 : 31, HCOLL_FLOAT32, NULL);
    EXPECT(st, "allgather count", "count", out, 31 * nranks);
    /* In place: block rank of out is the input, the rest must stay. */
    st = hcoll_allgather(comm, out + (size_t)rank * 40, out, 40, me ? HCOLL_INT32 : HCOLL_FLOAT32,
                         NULL);
    EXPECT(st, "in-place allgather dtype", "dtype", out, 40 * (size_t)nranks);
    /* Another collective in the place of one. */
    st = me ? hcoll_barrier(comm)
            : hcoll_allreduce(comm, in, out, 16, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    EXPECT(st, "barrier against allreduce", "collective", out, BIG);
    st = me ? hcoll_allreduce(comm, in, out, 16, HCOLL_FLOAT32, HCOLL_SUM, NULL)
            : hcoll_broadcast(comm, in, out, 16, HCOLL_FLOAT32, 0, NULL);
    EXPECT(st, "allreduce against broadcast", "collective", out, BIG);
    HCT_OK(comm, hcoll_barrier(comm));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    free(in);
    free(out);
    return 0;
}

/* HCOLL_CHECK_ARGS=0, one node: the shared-memory step's own comparison
 * catches a dtype or an op that differs (the count is tested elsewhere).
 * Such a failure is not agreed, so each case takes its own communicator. */
static int rank_intra(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    setenv("HCOLL_CHECK_ARGS", "0", 1);
    const int me = rank == nranks - 1;
    float *buf = fill(1024, 1.0f);
    HCT_REQUIRE(buf, "no memory");
    for (int k = 0; k < 4; k++) {
        hcoll_comm_t comm;
        if (open_comm(w, k, rank, nranks, &comm))
            return 1;
        const int big = k & 1; /* the fused step, or RS then AG */
        const size_t n = big ? 1024 : 16;
        hcoll_status_t st =
            k < 2 ? hcoll_allreduce(comm, buf, buf, n, me ? HCOLL_INT32 : HCOLL_FLOAT32,
                                    HCOLL_SUM, NULL)
                  : hcoll_allreduce(comm, buf, buf, n, HCOLL_FLOAT32, me ? HCOLL_MAX : HCOLL_SUM,
                                    NULL);
        HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "%s rank %d: %s %s -> %s (%s)", w->name, rank,
                    k < 2 ? "dtype" : "op", big ? "large" : "small", hcoll_status_name(st),
                    hcoll_comm_last_error(comm));
        hcoll_comm_abort(comm);
    }
    free(buf);
    return 0;
}

/* One rank over the locked-memory limit (verbs only). */
#define REG_BYTES (8u << 20)
static int rank_memlock(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, 0, rank, nranks, &comm))
        return 1;
    const int odd = nranks - 1, me = rank == odd;
    const size_t n = REG_BYTES / sizeof(float);
    float *buf = fill(n, SENTINEL), *src = fill(n, 1.0f);
    HCT_REQUIRE(buf && src, "no memory");
    /* 2x2: the broadcast pins its chain's shard first (4 MiB here, over
     * the limit with the ring's own regions). */
    for (int k = 0; k < 2; k++) {
        const char *what = k ? "broadcast" : "allreduce";
        if (me)
            setenv("HCMOCK_IB_MEMLOCK_KB", "4096", 1);
        hcoll_status_t st = k ? hcoll_broadcast(comm, src, buf, n, HCOLL_FLOAT32, 0, NULL)
                              : hcoll_allreduce(comm, buf, buf, n, HCOLL_FLOAT32, HCOLL_SUM, NULL);
        unsetenv("HCMOCK_IB_MEMLOCK_KB");
        const char *msg = hcoll_comm_last_error(comm);
        /* Three stages (ranks sharing a node): the all-reduce registers
         * nothing of the caller's, its ring jobs (shards of pieces) run in
         * the ring's stage, registered once (ring.h, HC_RING_STAGE_MAX), so
         * the limit does not touch it. The ring plan's 8 MiB are past the
         * stage: registered, refused. */
        int shared = 0;
        for (int r = 1; r < nranks; r++)
            shared |= w->node_of[r] == w->node_of[0];
        if (k == 0 && shared) {
            HCT_REQUIRE(st == HCOLL_SUCCESS, "%s rank %d: allreduce under a limit -> %s (%s)",
                        w->name, rank, hcoll_status_name(st), msg);
            for (size_t i = 0; i < n; i++)
                HCT_REQUIRE(buf[i] == SENTINEL * (float)nranks, "%s rank %d: recvbuf[%zu] is %g",
                            w->name, rank, i, buf[i]);
            for (size_t i = 0; i < n; i++)
                buf[i] = SENTINEL;
            continue;
        }
        HCT_REQUIRE(st != HCOLL_SUCCESS && st != HCOLL_ERR_MISMATCH,
                    "%s rank %d: %s over the limit -> %s (%s)", w->name, rank, what,
                    hcoll_status_name(st), msg);
        char want[64];
        snprintf(want, sizeof want, "rank %d could not take part", odd);
        HCT_REQUIRE(me ? strstr(msg, "ulimit") != NULL : strstr(msg, want) != NULL,
                    "%s rank %d: %s: the message does not say who: %s", w->name, rank, what, msg);
        for (size_t i = 0; i < n; i++)
            HCT_REQUIRE(buf[i] == SENTINEL, "%s rank %d: %s: recvbuf[%zu] is %g after the "
                        "failure", w->name, rank, what, i, buf[i]);
    }
    /* Nothing is sticky: the same calls go through now. */
    HCT_OK(comm, hcoll_broadcast(comm, src, buf, n, HCOLL_FLOAT32, 0, NULL));
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(buf[i] == 1.0f, "%s rank %d: element %zu is %g after the broadcast", w->name,
                    rank, i, buf[i]);
    HCT_OK(comm, hcoll_allreduce(comm, buf, buf, n, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(buf[i] == (float)nranks, "%s rank %d: element %zu is %g after the failures",
                    w->name, rank, i, buf[i]);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    free(buf);
    free(src);
    return 0;
}

static void run_world(const char *name, const int *node_of, int nranks, hct_rank_fn fn)
{
    world_t *w = hct_shared_alloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->nranks = nranks;
    memcpy(w->node_of, node_of, (size_t)nranks * sizeof *node_of);
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

START_TEST(allreduce_2x2) { RUN("a2x2", rank_allreduce, 0, 0, 1, 1); }
END_TEST
START_TEST(allreduce_3x1) { RUN("a3x1", rank_allreduce, 0, 1, 2); }
END_TEST
START_TEST(allreduce_2x3) { RUN("a2x3", rank_allreduce, 0, 0, 0, 1, 1, 1); }
END_TEST
START_TEST(others_2x2) { RUN("o2x2", rank_others, 0, 0, 1, 1); }
END_TEST
START_TEST(others_3x1) { RUN("o3x1", rank_others, 0, 1, 2); }
END_TEST
START_TEST(others_2x3) { RUN("o2x3", rank_others, 0, 0, 0, 1, 1, 1); }
END_TEST
START_TEST(intra_dtype_op) { RUN("i1x3", rank_intra, 0, 0, 0); }
END_TEST

/* The emulation is loaded when the process starts (common/mockib.h): this
 * case runs the program again with HCT_MISM_IB=1, which enters it. */
static char **prog_argv;

START_TEST(memlock_2x2_ib)
{
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("HCT_MISM_IB", "1", 1);
        execv("/proc/self/exe", prog_argv);
        _exit(127);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "the verbs case died of signal %d", WTERMSIG(status));
    ck_assert_msg(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77,
                  "the verbs case failed (exit %d, see stderr)", WEXITSTATUS(status));
}
END_TEST

static int ib_main(char **argv)
{
#if HCOLL_BUILD_VERBS
    int rc = hct_mockib_enter(argv);
    if (rc != 0)
        return rc;
    static const int layouts[2][5] = { { 3, 0, 1, 2 }, { 4, 0, 0, 1, 1 } };
    int bad = 0;
    for (int l = 0; l < 2 && bad == 0; l++) {
        world_t *w = hct_shared_alloc(sizeof *w);
        w->nranks = layouts[l][0];
        snprintf(w->name, sizeof w->name, "memlock-ib-%s", l ? "2x2" : "3x1");
        memcpy(w->node_of, &layouts[l][1], (size_t)w->nranks * sizeof(int));
        hct_opts_t o = { .nranks = w->nranks, .timeout_ms = 60000 };
        hct_result_t res[MAX_RANKS];
        bad = hct_run(&o, rank_memlock, w, res);
        hct_shared_free(w, sizeof *w);
    }
    return bad == 0 ? 0 : 1;
#else
    (void)argv;
    printf("SKIP: hcoll was built without rdma-core headers\n");
    return 77;
#endif
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("HCT_MISM_IB"))
        return ib_main(argv);
    prog_argv = argv;
    Suite *s = suite_create("mismatch");
    TCase *tc = tcase_create("mismatch");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, allreduce_2x2);
    tcase_add_test(tc, allreduce_3x1);
    tcase_add_test(tc, allreduce_2x3);
    tcase_add_test(tc, others_2x2);
    tcase_add_test(tc, others_3x1);
    tcase_add_test(tc, others_2x3);
    tcase_add_test(tc, intra_dtype_op);
    tcase_add_test(tc, memlock_2x2_ib);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
