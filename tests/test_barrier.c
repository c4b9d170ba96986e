/*
 * The barrier (src/core/barrier.c, src/inter/dissem.c) end to end, through
 * communicators of forked ranks grouped into emulated nodes, on every plan:
 *
 *   shape   plan     what runs
 *   1x1     single   nothing
 *   1x4     intra    the node's barrier
 *   4x1     ring     dissemination over 4 ranks (2 rounds)
 *   5x1     ring     dissemination over 5 (3 rounds, partners wrap)
 *   2x2     3stage   intra, then one dissemination per rail
 *   3x2     3stage   the same over 3 nodes
 *   2,1,2   flat     dissemination over all 5 ranks
 *
 * Cases:
 *   late      one rank (each in turn) enters 300 ms after the others: every
 *             other rank's barrier takes at least that long, then 1000
 *             barriers in a row where nobody leaves before the last one
 *             entered (a counter in shared memory), and the async twin
 *             interleaved with all-reduces
 *   mismatch  ranks that call an all-reduce where the others call a
 *             barrier: everybody fails within a second (MISMATCH, or the
 *             reset it causes), with the operation timeout far away
 *   abort     a watchdog aborts rank 0 while every rank waits for a late
 *             one: rank 0 ends at once, the others soon after
 *   death     a rank SIGKILLed or SIGSTOPped while the others wait for it
 *             in a barrier: the survivors fail promptly (stopped: within
 *             HCOLL_LIVENESS_MS + 1 s)
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
#define LATE_MS 300
#define NBARRIERS 1000
#define LIVENESS_MS 1000

typedef struct world {
    hct_id_slot_t slot;
    char name[32];
    int nranks;
    int node_of[MAX_RANKS];
    int victim;
    volatile double event_ms;
    volatile int victim_in;    /* the victim reached its fatal point */
    volatile int done;         /* survivors finished */
    int sig;                   /* death: what the victim raises */
    volatile pid_t pid[MAX_RANKS];
    volatile double late_in[3];  /* when the late rank entered, per round */
    hct_barrier_t bar;
    volatile int entered[NBARRIERS];
    char msg[MAX_RANKS][200];
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

static int open_comm(world_t *w, int rank, int nranks, hcoll_comm_t *comm_out)
{
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-bar-%d-%s-node%d", (int)getppid(), w->name,
             w->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = TIMEOUT_MS;
    HCT_REQUIRE(hct_share_unique_id(&w->slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(comm_out, nranks, rank, &id, &cfg));
    return 0;
}

static void run_shape(const char *name, const int *node_sizes, int nnodes, hct_rank_fn fn,
                      int victim, int victim_sig)
{
    world_t *w = world_new(name, node_sizes, nnodes);
    w->victim = victim;
    w->sig = victim_sig;
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = w->nranks, .timeout_ms = 60000 };
    hct_result_t res[MAX_RANKS];
    hct_run(&o, fn, w, res);
    fprintf(stderr, "[time] %s: %.1f s\n", name, (hct_now_ms() - t0) / 1e3);
    for (int r = 0; r < w->nranks; r++) {
        if (r == victim && victim_sig)
            ck_assert_msg(res[r].signaled && res[r].sig == SIGKILL,
                          "%s: victim %d did not die of SIGKILL", name, r);
        else
            ck_assert_msg(res[r].exited && res[r].code == 0, "%s: rank %d failed (see stderr)",
                          name, r);
    }
    hct_shared_free(w, sizeof *w);
}

/* ---- late ranks, 1000 in a row, async ------------------------------------- */

/* The others leave only after the late rank entered (the shared clock is
 * CLOCK_MONOTONIC). How long their barriers last is not checked: a loaded
 * host can release a rank from the shm sync after the late one entered
 * (CI at load 36 saw 300 ms), and then it passes at once, rightly. */
static int one_late(world_t *w, hcoll_comm_t comm, int rank, int late, int round)
{
    HCT_REQUIRE(hct_barrier_wait(&w->bar, w->nranks, TIMEOUT_MS) == 0, "sync");
    if (rank == late) {
        usleep(LATE_MS * 1000);
        w->late_in[round] = hct_now_ms();
    }
    HCT_OK(comm, hcoll_barrier(comm));
    const double out = hct_now_ms(), in = w->late_in[round];
    HCT_REQUIRE(rank == late || (in > 0 && out >= in),
                "%s rank %d: left %.0f ms before late rank %d entered", w->name, rank,
                in > 0 ? in - out : -1.0, late);
    return 0;
}

static int rank_late(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, &comm))
        return 1;
    /* The last rank, the first, and one in the middle of the last node. */
    const int lates[3] = { nranks - 1, 0, nranks / 2 };
    for (int i = 0; i < 3; i++)
        if (one_late(w, comm, rank, lates[i], i))
            return 1;

    const double t0 = hct_now_ms();
    for (int i = 0; i < NBARRIERS; i++) {
        if (i % 100 == 0 && rank == (i / 100) % nranks)
            usleep(2000);
        __atomic_fetch_add(&w->entered[i], 1, __ATOMIC_SEQ_CST);
        hcoll_status_t st = hcoll_barrier(comm);
        HCT_REQUIRE(st == HCOLL_SUCCESS, "%s rank %d: barrier %d -> %s (%s)", w->name, rank, i,
                    hcoll_status_name(st), hcoll_comm_last_error(comm));
        int in = __atomic_load_n(&w->entered[i], __ATOMIC_SEQ_CST);
        HCT_REQUIRE(in == nranks, "%s rank %d: left barrier %d when %d of %d had entered",
                    w->name, rank, i, in, nranks);
    }
    if (rank == 0)
        fprintf(stderr, "[time] %s: %d barriers, %.1f us each\n", w->name, NBARRIERS,
                (hct_now_ms() - t0) * 1e3 / NBARRIERS);
    /* Latency alone: nobody sleeps (the figure in the report). */
    const double t1 = hct_now_ms();
    for (int i = 0; i < NBARRIERS; i++)
        HCT_OK(comm, hcoll_barrier(comm));
    if (rank == 0)
        fprintf(stderr, "[time] %s: barrier latency %.1f us\n", w->name,
                (hct_now_ms() - t1) * 1e3 / NBARRIERS);

    /* The async twin, between all-reduces: each result proves its order. */
    enum { NQ = 9 };
    hcoll_request_t rq[NQ];
    int32_t v[NQ];
    for (int k = 0; k < NQ; k++) {
        if (k % 3 == 1) {
            HCT_OK(comm, hcoll_barrier_async(comm, &rq[k]));
        } else {
            v[k] = rank + k;
            HCT_OK(comm, hcoll_allreduce_async(comm, &v[k], &v[k], 1, HCOLL_INT32, HCOLL_SUM,
                                               NULL, &rq[k]));
        }
    }
    for (int k = 0; k < NQ; k++) {
        HCT_OK(comm, hcoll_wait(rq[k]));
        HCT_OK(comm, hcoll_request_free(rq[k]));
        HCT_REQUIRE(k % 3 == 1 || v[k] == nranks * (nranks - 1) / 2 + nranks * k,
                    "%s rank %d: all-reduce %d gave %d", w->name, rank, k, (int)v[k]);
    }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(late_small)
{
    run_shape("1x1", (int[]){ 1 }, 1, rank_late, -1, 0);
    run_shape("1x4", (int[]){ 4 }, 1, rank_late, -1, 0);
}
END_TEST

START_TEST(late_ring)
{
    run_shape("4x1", (int[]){ 1, 1, 1, 1 }, 4, rank_late, -1, 0);
    run_shape("5x1", (int[]){ 1, 1, 1, 1, 1 }, 5, rank_late, -1, 0);
}
END_TEST

START_TEST(late_3stage)
{
    run_shape("2x2", (int[]){ 2, 2 }, 2, rank_late, -1, 0);
    run_shape("3x2", (int[]){ 2, 2, 2 }, 3, rank_late, -1, 0);
}
END_TEST

START_TEST(late_flat)
{
    run_shape("2-1-2", (int[]){ 2, 1, 2 }, 3, rank_late, -1, 0);
}
END_TEST

/* ---- a barrier against an all-reduce ------------------------------------- */

/* Ranks whose bit is set in the victim mask call an all-reduce where the
 * others call a barrier (after one good barrier). */
static int rank_mismatch(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    setenv("HCOLL_OP_TIMEOUT_MS", "20000", 1); /* far beyond the bound below */
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, &comm))
        return 1;
    HCT_OK(comm, hcoll_barrier(comm));
    /* Nobody fails (and resets its links) before all are out of it. */
    HCT_REQUIRE(hct_barrier_wait(&w->bar, nranks, TIMEOUT_MS) == 0, "sync");
    const double t = hct_now_ms();
    int32_t x = 1;
    const int other = w->victim >> rank & 1;
    hcoll_status_t st = other ? hcoll_allreduce(comm, &x, &x, 1, HCOLL_INT32, HCOLL_SUM, NULL)
                              : hcoll_barrier(comm);
    const double dt = hct_now_ms() - t;
    snprintf(w->msg[rank], sizeof w->msg[rank], "%s", hcoll_comm_last_error(comm));
    HCT_REQUIRE(st == HCOLL_ERR_MISMATCH || st == HCOLL_ERR_PEER_FAILED,
                "%s rank %d (%s): %s (%s)", w->name, rank, other ? "all-reduce" : "barrier",
                hcoll_status_name(st), w->msg[rank]);
    HCT_REQUIRE(dt < 1500, "%s rank %d: failed after %.0f ms", w->name, rank, dt);
    __atomic_fetch_add(&w->done, 1, __ATOMIC_SEQ_CST);
    /* Someone must have said what happened, not only that a peer left. */
    HCT_REQUIRE(hct_barrier_wait(&w->bar, nranks, TIMEOUT_MS) == 0, "sync");
    int named = 0;
    for (int r = 0; r < nranks; r++)
        named += strstr(w->msg[r], "barrier") != NULL || strstr(w->msg[r], "MISMATCH") ||
                 strstr(w->msg[r], "disagree") || strstr(w->msg[r], "mismatch");
    HCT_REQUIRE(named > 0, "%s: no rank named the mismatch (rank 0: %s)", w->name, w->msg[0]);
    hcoll_comm_destroy(comm);
    return 0;
}

START_TEST(mismatch)
{
    run_shape("m4x1", (int[]){ 1, 1, 1, 1 }, 4, rank_mismatch, 1 << 2, 0);
    run_shape("m5x1", (int[]){ 1, 1, 1, 1, 1 }, 5, rank_mismatch, 1 << 1 | 1 << 2, 0);
    /* A whole node calls the all-reduce: only the rails can tell. */
    run_shape("m2x2", (int[]){ 2, 2 }, 2, rank_mismatch, 1 << 2 | 1 << 3, 0);
    /* One rank of a node: its node's segment tells. */
    run_shape("m2x2b", (int[]){ 2, 2 }, 2, rank_mismatch, 1 << 1, 0);
}
END_TEST

/* ---- abort and death ----------------------------------------------------- */

static void *watchdog(void *p)
{
    void **a = p;
    world_t *w = a[0];
    usleep(500 * 1000);
    w->event_ms = hct_now_ms();
    hcoll_comm_abort(a[1]);
    return NULL;
}

/* The victim stays out of the barrier until the others are done; rank 0
 * (not the victim) is aborted by a watchdog meanwhile. */
static int rank_abort(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    setenv("HCOLL_OP_TIMEOUT_MS", "0", 1); /* no limit: only the abort ends it */
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, &comm))
        return 1;
    HCT_OK(comm, hcoll_barrier(comm));
    if (rank == w->victim) {
        const double end = hct_now_ms() + TIMEOUT_MS;
        while (__atomic_load_n(&w->done, __ATOMIC_SEQ_CST) < nranks - 1 && hct_now_ms() < end)
            usleep(1000);
        hcoll_comm_destroy(comm);
        return 0;
    }
    pthread_t th;
    void *a[2] = { w, comm };
    if (rank == 0)
        HCT_REQUIRE(pthread_create(&th, NULL, watchdog, a) == 0, "pthread_create");
    hcoll_status_t st = hcoll_barrier(comm);
    const double dt = hct_now_ms() - w->event_ms;
    __atomic_fetch_add(&w->done, 1, __ATOMIC_SEQ_CST);
    if (rank == 0) {
        pthread_join(th, NULL);
        HCT_REQUIRE(st == HCOLL_ERR_ABORTED, "%s rank 0: %s", w->name, hcoll_status_name(st));
        /* No operation timeout: only the abort can end it. 5 s tells that
         * from a hang on a host at load 30 (600 ms seen). */
        HCT_REQUIRE(dt < 5000, "%s: the abort took %.0f ms to end the barrier", w->name, dt);
        return 0;
    }
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_ABORTED, "%s rank %d: %s (%s)",
                w->name, rank, hcoll_status_name(st), hcoll_comm_last_error(comm));
    HCT_REQUIRE(w->event_ms > 0 && dt < 5000, "%s rank %d heard of the abort after %.0f ms: %s",
                w->name, rank, dt, hcoll_comm_last_error(comm));
    hcoll_comm_destroy(comm);
    return 0;
}

START_TEST(abort_in_barrier)
{
    run_shape("a4x1", (int[]){ 1, 1, 1, 1 }, 4, rank_abort, 2, 0);
    run_shape("a2x2", (int[]){ 2, 2 }, 2, rank_abort, 3, 0);
}
END_TEST

/* The victim kills or stops itself after the first barrier; the others
 * wait for it in the second. A stopped victim is killed by rank 0 once the
 * survivors are done. */
static int rank_death(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    char lv[16];
    snprintf(lv, sizeof lv, "%d", LIVENESS_MS);
    setenv("HCOLL_LIVENESS_MS", lv, 1);
    setenv("HCOLL_OP_TIMEOUT_MS", "0", 1);
    w->pid[rank] = getpid();
    hcoll_comm_t comm;
    if (open_comm(w, rank, nranks, &comm))
        return 1;
    HCT_OK(comm, hcoll_barrier(comm));
    if (rank == w->victim) {
        usleep(200 * 1000); /* the others are waiting by now */
        w->event_ms = hct_now_ms();
        raise(w->sig);
        return 1; /* not reached: killed */
    }
    hcoll_status_t st = hcoll_barrier(comm);
    const double dt = hct_now_ms() - w->event_ms;
    __atomic_fetch_add(&w->done, 1, __ATOMIC_SEQ_CST);
    const int stopped = w->sig == SIGSTOP;
    if (rank == 0) {
        const double end = hct_now_ms() + TIMEOUT_MS;
        while (__atomic_load_n(&w->done, __ATOMIC_SEQ_CST) < nranks - 1 && hct_now_ms() < end)
            usleep(1000);
        if (stopped)
            kill(w->pid[w->victim], SIGKILL);
    }
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_TIMEOUT, "%s rank %d: %s (%s)",
                w->name, rank, hcoll_status_name(st), hcoll_comm_last_error(comm));
    HCT_REQUIRE(dt < (stopped ? LIVENESS_MS + 1000 : 1000),
                "%s rank %d failed %.0f ms after the %s: %s", w->name, rank, dt,
                stopped ? "stop" : "kill", hcoll_comm_last_error(comm));
    hcoll_comm_destroy(comm);
    return 0;
}

START_TEST(death_in_barrier)
{
    run_shape("d2x2", (int[]){ 2, 2 }, 2, rank_death, 3, SIGKILL);
    run_shape("d4x1", (int[]){ 1, 1, 1, 1 }, 4, rank_death, 2, SIGSTOP);
    run_shape("d3x2", (int[]){ 2, 2, 2 }, 3, rank_death, 4, SIGSTOP);
}
END_TEST

int main(void)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_OP_TIMEOUT_MS");
    unsetenv("HCOLL_LIVENESS_MS");
    unsetenv("HCOLL_DEBUG_FILE");

    Suite *s = suite_create("barrier");
    TCase *late = tcase_create("late");
    tcase_add_test(late, late_small);
    tcase_add_test(late, late_ring);
    tcase_add_test(late, late_3stage);
    tcase_add_test(late, late_flat);
    TCase *mis = tcase_create("mismatch");
    tcase_add_test(mis, mismatch);
    TCase *ab = tcase_create("abort");
    tcase_add_test(ab, abort_in_barrier);
    TCase *death = tcase_create("death");
    tcase_add_test(death, death_in_barrier);
    TCase *all[] = { late, mis, ab, death };
    for (int i = 0; i < 4; i++) {
        tcase_set_timeout(all[i], 120);
        suite_add_tcase(s, all[i]);
    }

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf == 0 ? 0 : 1;
}
