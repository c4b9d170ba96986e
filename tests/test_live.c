/*
 * Liveness: a late rank is waited for, a frozen or dead one is found.
 * 2 emulated nodes x 2 ranks over TCP on loopback, HCOLL_LIVENESS_MS 2 s:
 *
 *   late_rank_waited  rank 3 spends 6 s elsewhere before its 3rd all-reduce
 *                     (with HCOLL_TIMEOUT_MS at 1.5 s): every rank succeeds,
 *                     bit for bit, and the others did wait for it
 *   stopped_rank      rank 1 is SIGSTOPped between all-reduces: every
 *                     survivor fails within liveness + 1 s, and the ones that
 *                     waited for it directly name it ("no sign of life")
 *   killed_rank       rank 1 is SIGKILLed: every survivor fails within 1 s
 *   op_timeout        HCOLL_OP_TIMEOUT_MS still bounds a wait for a rank
 *                     that is alive and never calls
 *   abort_while_late  rank 0 waits for late rank 3 with the operation timeout
 *                     off; a watchdog's hcoll_comm_abort ends its call at once
 *   init_late_rank    rank 3 calls init 3 s after the others (HCOLL_TIMEOUT_MS
 *                     1.5 s, HCOLL_INIT_TIMEOUT_MS 30 s): init succeeds
 *   init_stopped_rank rank 2 joins the rendezvous and is SIGSTOPped while it
 *                     waits for rank 3, which never comes: ranks 0 and 1 fail
 *                     within liveness + 1 s, naming rank 2
 *   early_destroy     4 nodes x 1: rank 3 destroys its communicator (an
 *                     orderly goodbye) instead of joining an all-reduce, with
 *                     the operation timeout off: every other rank fails within
 *                     liveness + 1 s, and one of them says why
 *
 * The victim is stopped and killed by the parent (on_started), which always
 * ends with SIGKILL, and hct_run's deadline SIGKILLs whatever is left.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "hcoll.h"

#define NR 4
#define LIVENESS_MS 2000
#define LATE_MS 6000
#define COUNT 300000 /* floats: the three-stage pipeline, several pieces */

typedef struct live_arg {
    hct_id_slot_t slot;
    int victim;
    int sig;                /* 0: late-rank case */
    int op_timeout_ms;      /* 0: default */
    volatile int ready;     /* the victim finished its warm-up calls */
    volatile int done[NR];  /* survivors: finished (either way) */
    volatile double fault_ms;
    volatile double noticed_ms[NR];
    volatile double call_ms[NR]; /* late case: longest all-reduce */
    char msg[NR][400];
} live_arg_t;

static void live_env(int timeout_ms, int op_timeout_ms)
{
    char v[32];
    setenv("HCOLL_NET", "tcp", 1);
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    snprintf(v, sizeof v, "%d", LIVENESS_MS);
    setenv("HCOLL_LIVENESS_MS", v, 1);
    snprintf(v, sizeof v, "%d", timeout_ms);
    setenv("HCOLL_TIMEOUT_MS", v, 1);
    if (op_timeout_ms) {
        snprintf(v, sizeof v, "%d", op_timeout_ms);
        setenv("HCOLL_OP_TIMEOUT_MS", v, 1);
    }
}

static int open_comm(live_arg_t *a, int rank, hcoll_comm_t *comm)
{
    hcoll_unique_id_t id;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(comm, NR, rank, &id, NULL));
    return 0;
}

static float val(int rank, size_t i, int it)
{
    return (float)((int)((i * 7 + (size_t)rank * 3 + (size_t)it) % 11) - 5);
}

/* One all-reduce of iteration it, checked bit for bit. */
static int one_allreduce(hcoll_comm_t comm, int rank, int it, float *buf, size_t n)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = val(rank, i, it);
    HCT_OK(comm, hcoll_allreduce(comm, buf, buf, n, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < NR; r++)
            want += val(r, i, it);
        HCT_REQUIRE(memcmp(&buf[i], &want, sizeof want) == 0,
                    "rank %d it %d: element %zu is %g, want %g", rank, it, i, buf[i], want);
    }
    return 0;
}

static int rank_late(int rank, int nranks, void *argp)
{
    (void)nranks;
    live_arg_t *a = argp;
    live_env(1500, 0);
    hcoll_comm_t comm;
    if (open_comm(a, rank, &comm))
        return 1;
    float *buf = malloc(COUNT * sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    for (int it = 0; it < 5; it++) {
        if (rank == a->victim && it == 2)
            usleep(LATE_MS * 1000);
        double t0 = hct_now_ms();
        /* Even iterations take the latency path, odd ones three stages. */
        if (one_allreduce(comm, rank, it, buf, it % 2 ? COUNT : 1000))
            return 1;
        double dt = hct_now_ms() - t0;
        if (dt > a->call_ms[rank])
            a->call_ms[rank] = dt;
    }
    free(buf);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(late_rank_waited)
{
    live_arg_t *a = hct_shared_alloc(sizeof *a);
    a->victim = 3;
    hct_opts_t o = { .nranks = NR, .ranks_per_node = 2, .timeout_ms = 40000 };
    hct_result_t res[NR];
    int bad = hct_run(&o, rank_late, a, res);
    ck_assert_msg(bad == 0, "%d rank(s) failed: a late rank was taken for a dead one", bad);
    for (int r = 0; r < NR; r++)
        if (r != a->victim)
            ck_assert_msg(a->call_ms[r] > LATE_MS - 1500, "rank %d waited only %.0f ms", r,
                          a->call_ms[r]);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* Survivors call until the fault shows; the victim calls until stopped. */
static int rank_fault(int rank, int nranks, void *argp)
{
    (void)nranks;
    live_arg_t *a = argp;
    live_env(20000, a->op_timeout_ms);
    hcoll_comm_t comm;
    if (open_comm(a, rank, &comm))
        return 1;
    float *buf = malloc(COUNT * sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    for (int it = 0; it < 100000; it++) {
        if (it == 2 && rank == a->victim) {
            a->ready = 1;
            for (;;)
                pause(); /* stopped, then killed, by the parent */
        }
        if (it == 2 && a->sig == 0)
            a->fault_ms = hct_now_ms(); /* op_timeout: the victim never calls */
        for (size_t i = 0; i < COUNT; i++)
            buf[i] = val(rank, i, it);
        hcoll_status_t st =
            hcoll_allreduce(comm, buf, buf, it % 2 ? COUNT : 1000, HCOLL_FLOAT32, HCOLL_SUM, NULL);
        if (st == HCOLL_SUCCESS)
            continue;
        a->noticed_ms[rank] = hct_now_ms();
        snprintf(a->msg[rank], sizeof a->msg[rank], "%s", hcoll_comm_last_error(comm));
        HCT_REQUIRE(a->fault_ms > 0, "rank %d failed before the fault: %s", rank, a->msg[rank]);
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_TIMEOUT, "rank %d: %s -> %s",
                    rank, hcoll_status_name(st), a->msg[rank]);
        break;
    }
    hcoll_comm_destroy(comm);
    free(buf);
    a->done[rank] = 1;
    return 0;
}

static void fault_parent(const pid_t *pids, int n, void *argp)
{
    live_arg_t *a = argp;
    double deadline = hct_now_ms() + 20000;
    while (!a->ready && hct_now_ms() < deadline)
        usleep(1000);
    if (a->sig) {
        usleep(200000); /* the survivors are in their third call by now */
        a->fault_ms = hct_now_ms();
        kill(pids[a->victim], a->sig);
    }
    for (int r = 0; r < n; r++)
        while (r != a->victim && !a->done[r] && hct_now_ms() < deadline)
            usleep(1000);
    kill(pids[a->victim], SIGKILL); /* stopped or not, it goes now */
}

static void run_fault(int sig, int op_timeout_ms, double bound_ms, const char *want)
{
    live_arg_t *a = hct_shared_alloc(sizeof *a);
    a->victim = 1;
    a->sig = sig;
    a->op_timeout_ms = op_timeout_ms;
    hct_opts_t o = { .nranks = NR, .ranks_per_node = 2, .timeout_ms = 40000,
                     .on_started = fault_parent };
    hct_result_t res[NR];
    hct_run(&o, rank_fault, a, res);
    int named = 0;
    for (int r = 0; r < NR; r++) {
        if (r == a->victim)
            continue;
        double dt = a->noticed_ms[r] - a->fault_ms;
        fprintf(stderr, "signal %d: rank %d failed %.0f ms after the fault: %s\n", sig, r, dt,
                a->msg[r]);
        ck_assert_msg(res[r].exited && res[r].code == 0, "survivor %d: %s", r, a->msg[r]);
        ck_assert_msg(dt >= 0 && dt <= bound_ms, "rank %d noticed after %.0f ms (bound %.0f)", r,
                      dt, bound_ms);
        named += strstr(a->msg[r], want) != NULL && strstr(a->msg[r], "rank 1") != NULL;
    }
    ck_assert_msg(named > 0, "no survivor said '%s' about rank 1", want);
    hct_shared_free(a, sizeof *a);
}

START_TEST(stopped_rank)
{
    run_fault(SIGSTOP, 0, LIVENESS_MS + 1000, "no sign of life");
}
END_TEST

START_TEST(killed_rank)
{
    run_fault(SIGKILL, 0, 1000, "rank 1");
}
END_TEST

START_TEST(op_timeout)
{
    run_fault(0, 3000, 3000 + 1500, "no progress");
}
END_TEST

/* ---- abort ----------------------------------------------------------------- */

typedef struct wd {
    hcoll_comm_t comm;
    live_arg_t *a;
} wd_t;

static void *watchdog(void *p)
{
    wd_t *w = p;
    usleep(1000 * 1000);
    w->a->fault_ms = hct_now_ms();
    hcoll_comm_abort(w->comm);
    return NULL;
}

static int rank_abort_late(int rank, int nranks, void *argp)
{
    (void)nranks;
    live_arg_t *a = argp;
    live_env(20000, 0);
    setenv("HCOLL_OP_TIMEOUT_MS", "0", 1); /* no limit: only the abort ends it */
    hcoll_comm_t comm;
    if (open_comm(a, rank, &comm))
        return 1;
    float *buf = calloc(COUNT, sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    if (rank == 3) { /* late until the others are done */
        double end = hct_now_ms() + 20000;
        while ((!a->done[0] || !a->done[1] || !a->done[2]) && hct_now_ms() < end)
            usleep(1000);
        hcoll_comm_destroy(comm);
        free(buf);
        return 0;
    }
    wd_t w = { comm, a };
    pthread_t th;
    if (rank == 0)
        HCT_REQUIRE(pthread_create(&th, NULL, watchdog, &w) == 0, "pthread_create");
    hcoll_status_t st = hcoll_allreduce(comm, buf, buf, COUNT, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    double dt = hct_now_ms() - a->fault_ms;
    a->done[rank] = 1;
    free(buf);
    if (rank == 0) {
        pthread_join(th, NULL);
        HCT_REQUIRE(st == HCOLL_ERR_ABORTED, "rank 0: %s", hcoll_status_name(st));
        HCT_REQUIRE(dt < 500, "the abort took %.0f ms to end the call", dt);
        return 0; /* comm is gone */
    }
    /* Rank 1 waits in the ring for rank 3, rank 2 in the node's segment:
     * both hear of the abort at once, not when rank 3 comes. */
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_ABORTED, "rank %d: %s", rank,
                hcoll_status_name(st));
    HCT_REQUIRE(dt < 1000, "rank %d heard of the abort after %.0f ms: %s", rank, dt,
                hcoll_comm_last_error(comm));
    hcoll_comm_destroy(comm);
    return 0;
}

START_TEST(abort_while_late)
{
    live_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = NR, .ranks_per_node = 2, .timeout_ms = 30000 };
    hct_result_t res[NR];
    ck_assert_int_eq(hct_run(&o, rank_abort_late, a, res), 0);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ---- init ---------------------------------------------------------------- */

static int rank_init_late(int rank, int nranks, void *argp)
{
    (void)nranks;
    live_arg_t *a = argp;
    live_env(1500, 0);
    setenv("HCOLL_INIT_TIMEOUT_MS", "30000", 1);
    if (rank == 3)
        usleep(3000 * 1000);
    hcoll_comm_t comm;
    if (open_comm(a, rank, &comm))
        return 1;
    float buf[1000];
    if (one_allreduce(comm, rank, 0, buf, 1000))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(init_late_rank)
{
    live_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = NR, .ranks_per_node = 2, .timeout_ms = 30000 };
    hct_result_t res[NR];
    ck_assert_int_eq(hct_run(&o, rank_init_late, a, res), 0);
    hct_shared_free(a, sizeof *a);
}
END_TEST

static int rank_init_stop(int rank, int nranks, void *argp)
{
    (void)nranks;
    live_arg_t *a = argp;
    live_env(1500, 0);
    setenv("HCOLL_INIT_TIMEOUT_MS", "30000", 1);
    if (rank == 3) { /* never comes; stays until the others have their verdict */
        double end = hct_now_ms() + 20000;
        while ((!a->done[0] || !a->done[1]) && hct_now_ms() < end)
            usleep(1000);
        return 0;
    }
    if (rank == a->victim)
        a->ready = 1; /* the parent stops it once it is in the rendezvous */
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    hcoll_status_t st = hcoll_comm_init(&comm, NR, rank, &id, NULL);
    a->noticed_ms[rank] = hct_now_ms();
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", hcoll_comm_last_error(NULL));
    a->done[rank] = 1;
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "rank %d: init -> %s (%s)", rank,
                hcoll_status_name(st), a->msg[rank]);
    return 0;
}

static void init_stop_parent(const pid_t *pids, int n, void *argp)
{
    (void)n;
    live_arg_t *a = argp;
    double deadline = hct_now_ms() + 20000;
    while (!a->ready && hct_now_ms() < deadline)
        usleep(1000);
    usleep(500000); /* it has joined and waits for rank 3 */
    a->fault_ms = hct_now_ms();
    kill(pids[a->victim], SIGSTOP);
    while ((!a->done[0] || !a->done[1]) && hct_now_ms() < deadline)
        usleep(1000);
    kill(pids[a->victim], SIGKILL);
}

START_TEST(init_stopped_rank)
{
    live_arg_t *a = hct_shared_alloc(sizeof *a);
    a->victim = 2;
    hct_opts_t o = { .nranks = NR, .ranks_per_node = 2, .timeout_ms = 30000,
                     .on_started = init_stop_parent };
    hct_result_t res[NR];
    hct_run(&o, rank_init_stop, a, res);
    for (int r = 0; r < 2; r++) {
        double dt = a->noticed_ms[r] - a->fault_ms;
        fprintf(stderr, "init: rank %d failed %.0f ms after SIGSTOP: %s\n", r, dt, a->msg[r]);
        ck_assert_msg(res[r].exited && res[r].code == 0, "rank %d: %s", r, a->msg[r]);
        ck_assert_msg(dt >= 0 && dt <= LIVENESS_MS + 1000, "rank %d after %.0f ms", r, dt);
        ck_assert_msg(strstr(a->msg[r], "rank 2") && strstr(a->msg[r], "no sign of life"),
                      "rank %d: %s", r, a->msg[r]);
    }
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ---- a rank that leaves in order while the others still call ---------- */

static int rank_early_destroy(int rank, int nranks, void *argp)
{
    (void)nranks;
    live_arg_t *a = argp;
    live_env(20000, 0);
    setenv("HCOLL_OP_TIMEOUT_MS", "0", 1); /* nothing else would end the wait */
    hcoll_comm_t comm;
    if (open_comm(a, rank, &comm))
        return 1;
    float *buf = malloc(COUNT * sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    if (one_allreduce(comm, rank, 0, buf, COUNT))
        return 1;
    if (rank == 3) {
        HCT_OK(NULL, hcoll_comm_destroy(comm));
        a->fault_ms = hct_now_ms();
        free(buf);
        return 0;
    }
    hcoll_status_t st = hcoll_allreduce(comm, buf, buf, COUNT, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    double dt = hct_now_ms() - a->fault_ms;
    free(buf);
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "rank %d: %s", rank, hcoll_status_name(st));
    HCT_REQUIRE(a->fault_ms > 0 && dt < LIVENESS_MS + 1000,
                "rank %d failed %.0f ms after rank 3 left", rank, dt);
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", hcoll_comm_last_error(comm));
    hcoll_comm_destroy(comm);
    return 0;
}

START_TEST(early_destroy)
{
    live_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = NR, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[NR];
    ck_assert_int_eq(hct_run(&o, rank_early_destroy, a, res), 0);
    /* The first to notice names the cause; the others may hear of it as
     * that rank's own failure. */
    int named = 0;
    for (int r = 0; r < 3; r++)
        named |= strstr(a->msg[r], "rank 3") != NULL &&
                 strstr(a->msg[r], "destroyed its communicator") != NULL;
    ck_assert_msg(named, "no rank named rank 3's early destroy: '%s' / '%s' / '%s'", a->msg[0],
                  a->msg[1], a->msg[2]);
    hct_shared_free(a, sizeof *a);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("live");
    TCase *t = tcase_create("tcp");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, late_rank_waited);
    tcase_add_test(t, stopped_rank);
    tcase_add_test(t, killed_rank);
    tcase_add_test(t, op_timeout);
    tcase_add_test(t, abort_while_late);
    tcase_add_test(t, init_late_rank);
    tcase_add_test(t, init_stopped_rank);
    tcase_add_test(t, early_destroy);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
