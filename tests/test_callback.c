/*
 * Completion callbacks (hcoll_request_set_callback), through communicators
 * of forked ranks on one host (two emulated nodes of two ranks: the
 * three-stage plan, so requests complete on hcoll's worker thread).
 *
 * Each rank checks: every callback runs exactly once; one set before
 * completion runs on hcoll's thread, one set after completion at once on
 * the caller's; hcoll_wait returns after the callback; a second callback
 * is refused; a callback may free its own request (the ASan build finds a
 * leak or a use after free); blocking calls from a callback are refused
 * rather than deadlocking; requests that fail (abort) get their callback
 * with the error; many requests in flight each get theirs once.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "hcoll.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
/* Ranks end with _exit, which skips LeakSanitizer's check: run it here. */
#define LEAK_CHECK() (__lsan_do_recoverable_leak_check() == 0)
#else
#define LEAK_CHECK() 1
#endif

#define TIMEOUT_MS 20000
#define NFLIGHT 48
#define COUNT 4099

typedef struct world {
    hct_id_slot_t slot;
    volatile int issued_b;  /* rank 0 has set its callback on request B */
    volatile int issued_e;  /* rank 0 has set its callback on request E */
    volatile int aborted;   /* rank 0 has aborted (phase F) */
} world_t;

/* What one callback saw. */
typedef struct cb_rec {
    atomic_int calls;
    hcoll_status_t status;
    pthread_t thread;
    hcoll_request_t req;
    int req_matches;          /* the callback got its own request */
    /* For the callbacks that try calls from inside. */
    hcoll_comm_t comm;
    pthread_t caller;         /* calls that would really run there are skipped */
    hcoll_status_t inner_register;
    hcoll_status_t inner_blocking, inner_destroy, inner_test, inner_wait, inner_free;
    int inner_done;
} cb_rec_t;

static void cb_count(hcoll_request_t req, hcoll_status_t st, void *arg)
{
    cb_rec_t *r = arg;
    r->status = st;
    r->thread = pthread_self();
    r->req_matches = (req == r->req);
    atomic_fetch_add(&r->calls, 1);
}

/* Frees its own request (the binding pattern), after looking at it. */
static void cb_free(hcoll_request_t req, hcoll_status_t st, void *arg)
{
    cb_rec_t *r = arg;
    r->status = st;
    r->thread = pthread_self();
    r->inner_test = hcoll_test(req, &r->inner_done);
    r->inner_wait = hcoll_wait(req);
    r->inner_free = hcoll_request_free(req);
    atomic_fetch_add(&r->calls, 1);
}

/* Tries what must be refused on hcoll's thread. */
static void cb_blocking(hcoll_request_t req, hcoll_status_t st, void *arg)
{
    cb_rec_t *r = arg;
    (void)req;
    int x = 1;
    r->status = st;
    r->thread = pthread_self();
    if (!pthread_equal(r->thread, r->caller)) {
        r->inner_blocking = hcoll_allreduce(r->comm, &x, &x, 1, HCOLL_INT32, HCOLL_SUM, NULL);
        r->inner_destroy = hcoll_comm_destroy(r->comm);
        r->inner_wait = hcoll_comm_abort(r->comm);
        hcoll_mem_t h;
        r->inner_register = hcoll_mem_register(r->comm, &x, sizeof x, &h);
    }
    atomic_fetch_add(&r->calls, 1);
}

static void fill(int *buf, size_t n, int rank, int k)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (int)((i + (size_t)k) % 97) + rank;
}

static int check(const int *buf, size_t n, int nranks, int k)
{
    for (size_t i = 0; i < n; i++) {
        int want = ((int)((i + (size_t)k) % 97)) * nranks + nranks * (nranks - 1) / 2;
        HCT_REQUIRE(buf[i] == want, "request %d: element %zu is %d, want %d", k, i, buf[i], want);
    }
    return 0;
}

static int wait_calls(cb_rec_t *r, int n, int timeout_ms)
{
    double deadline = hct_now_ms() + timeout_ms;
    for (int k = 0; k < n; k++)
        while (atomic_load(&r[k].calls) == 0) {
            HCT_REQUIRE(hct_now_ms() < deadline, "callback %d of %d never ran", k, n);
            usleep(200);
        }
    return 0;
}

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

/* A: many in flight, each with a counting callback set right after issue
 * (before or after completion, whichever comes). hcoll_wait returns only
 * once the callback has run. */
static int phase_many(hcoll_comm_t comm, int rank, int n)
{
    static cb_rec_t rec[NFLIGHT];
    static int buf[NFLIGHT][COUNT];
    hcoll_request_t req[NFLIGHT];
    for (int k = 0; k < NFLIGHT; k++) {
        fill(buf[k], COUNT, rank, k);
        HCT_OK(comm, hcoll_allreduce_async(comm, buf[k], buf[k], COUNT, HCOLL_INT32, HCOLL_SUM,
                                           NULL, &req[k]));
        rec[k].req = req[k];
        HCT_OK(comm, hcoll_request_set_callback(req[k], cb_count, &rec[k]));
    }
    for (int k = 0; k < NFLIGHT; k++) {
        HCT_OK(comm, hcoll_wait(req[k]));
        HCT_REQUIRE(atomic_load(&rec[k].calls) == 1, "request %d: %d calls right after wait", k,
                    atomic_load(&rec[k].calls));
        HCT_REQUIRE(rec[k].status == HCOLL_SUCCESS && rec[k].req_matches,
                    "request %d: callback got %s, own request %d", k,
                    hcoll_status_name(rec[k].status), rec[k].req_matches);
        if (check(buf[k], COUNT, n, k))
            return 1;
        /* Once only, and a second callback is refused. */
        HCT_REQUIRE(hcoll_request_set_callback(req[k], cb_count, &rec[k]) ==
                        HCOLL_ERR_INVALID_ARG, "request %d: a second callback accepted", k);
        HCT_OK(comm, hcoll_request_free(req[k]));
        HCT_REQUIRE(atomic_load(&rec[k].calls) == 1, "request %d: %d calls", k,
                    atomic_load(&rec[k].calls));
    }
    return 0;
}

/* B: set before completion (the peers issue only once rank 0 has set it):
 * runs on hcoll's thread. C: set after completion: at once, on this one. */
static int phase_threads(hcoll_comm_t comm, world_t *w, int rank, int n)
{
    static int buf[COUNT];
    cb_rec_t b = { 0 }, c = { 0 };
    hcoll_request_t req;
    if (rank != 0)
        HCT_REQUIRE(wait_flag(&w->issued_b, TIMEOUT_MS) == 0, "rank 0 never issued B");
    fill(buf, COUNT, rank, 1);
    HCT_OK(comm, hcoll_allreduce_async(comm, buf, buf, COUNT, HCOLL_INT32, HCOLL_SUM, NULL, &req));
    b.req = req;
    HCT_OK(comm, hcoll_request_set_callback(req, cb_count, &b));
    if (rank == 0) {
        int d;
        HCT_OK(comm, hcoll_test(req, &d));
        HCT_REQUIRE(d == 0 && atomic_load(&b.calls) == 0, "B finished before the peers issued it");
        __atomic_store_n(&w->issued_b, 1, __ATOMIC_RELEASE);
    }
    HCT_OK(comm, hcoll_wait(req));
    HCT_REQUIRE(atomic_load(&b.calls) == 1, "B: %d calls", atomic_load(&b.calls));
    if (rank == 0)
        HCT_REQUIRE(!pthread_equal(b.thread, pthread_self()),
                    "B: set before completion, ran on the caller's thread");
    if (check(buf, COUNT, n, 1))
        return 1;
    HCT_OK(comm, hcoll_request_free(req));

    fill(buf, COUNT, rank, 2);
    HCT_OK(comm, hcoll_allreduce_async(comm, buf, buf, COUNT, HCOLL_INT32, HCOLL_SUM, NULL, &req));
    HCT_OK(comm, hcoll_wait(req));
    c.req = req;
    HCT_OK(comm, hcoll_request_set_callback(req, cb_count, &c));
    HCT_REQUIRE(atomic_load(&c.calls) == 1, "C: callback had not run when set returned");
    HCT_REQUIRE(pthread_equal(c.thread, pthread_self()), "C: ran on another thread");
    HCT_REQUIRE(c.status == HCOLL_SUCCESS, "C: status %s", hcoll_status_name(c.status));
    HCT_OK(comm, hcoll_request_free(req));
    HCT_REQUIRE(atomic_load(&c.calls) == 1, "C: %d calls", atomic_load(&c.calls));
    return check(buf, COUNT, n, 2);
}

/* D: callbacks that free their own request, on hcoll's thread and on the
 * caller's; the caller never touches those requests again. */
static int phase_free(hcoll_comm_t comm, int rank, int n)
{
    enum { NF = 16 };
    static cb_rec_t rec[NF + 1];
    static int buf[NF + 1][COUNT];
    hcoll_request_t req;
    for (int k = 0; k < NF; k++) {
        fill(buf[k], COUNT, rank, k);
        HCT_OK(comm, hcoll_allreduce_async(comm, buf[k], buf[k], COUNT, HCOLL_INT32, HCOLL_SUM,
                                           NULL, &req));
        HCT_OK(comm, hcoll_request_set_callback(req, cb_free, &rec[k]));
    }
    if (wait_calls(rec, NF, TIMEOUT_MS))
        return 1;
    fill(buf[NF], COUNT, rank, NF);
    HCT_OK(comm, hcoll_allreduce_async(comm, buf[NF], buf[NF], COUNT, HCOLL_INT32, HCOLL_SUM,
                                       NULL, &req));
    HCT_OK(comm, hcoll_wait(req));
    HCT_OK(comm, hcoll_request_set_callback(req, cb_free, &rec[NF])); /* frees req */
    for (int k = 0; k <= NF; k++) {
        HCT_REQUIRE(atomic_load(&rec[k].calls) == 1, "free %d: %d calls", k,
                    atomic_load(&rec[k].calls));
        HCT_REQUIRE(rec[k].status == HCOLL_SUCCESS && rec[k].inner_test == HCOLL_SUCCESS &&
                        rec[k].inner_done == 1 && rec[k].inner_wait == HCOLL_SUCCESS &&
                        rec[k].inner_free == HCOLL_SUCCESS,
                    "free %d: status %s, test %s/%d, wait %s, free %s", k,
                    hcoll_status_name(rec[k].status), hcoll_status_name(rec[k].inner_test),
                    rec[k].inner_done, hcoll_status_name(rec[k].inner_wait),
                    hcoll_status_name(rec[k].inner_free));
        if (check(buf[k], COUNT, n, k))
            return 1;
    }
    HCT_REQUIRE(pthread_equal(rec[NF].thread, pthread_self()), "free after completion: thread");
    return 0;
}

/* E: a blocking all-reduce or a destroy from a callback on hcoll's thread
 * is refused, not a deadlock. */
static int phase_blocking(hcoll_comm_t comm, world_t *w, int rank, int n)
{
    static int buf[COUNT];
    cb_rec_t r = { 0 };
    r.comm = comm;
    r.caller = pthread_self();
    hcoll_request_t req;
    if (rank != 0)
        HCT_REQUIRE(wait_flag(&w->issued_e, TIMEOUT_MS) == 0, "rank 0 never issued E");
    fill(buf, COUNT, rank, 3);
    HCT_OK(comm, hcoll_allreduce_async(comm, buf, buf, COUNT, HCOLL_INT32, HCOLL_SUM, NULL, &req));
    HCT_OK(comm, hcoll_request_set_callback(req, cb_blocking, &r));
    if (rank == 0)
        __atomic_store_n(&w->issued_e, 1, __ATOMIC_RELEASE);
    HCT_OK(comm, hcoll_wait(req));
    HCT_REQUIRE(rank != 0 || !pthread_equal(r.thread, pthread_self()),
                "E: set before completion, ran on the caller's thread");
    HCT_REQUIRE(atomic_load(&r.calls) == 1, "blocking: %d calls", atomic_load(&r.calls));
    if (!pthread_equal(r.thread, pthread_self())) {
        HCT_REQUIRE(r.inner_blocking == HCOLL_ERR_INVALID_ARG,
                    "hcoll_allreduce from a callback -> %s", hcoll_status_name(r.inner_blocking));
        HCT_REQUIRE(r.inner_destroy == HCOLL_ERR_INVALID_ARG,
                    "hcoll_comm_destroy from a callback -> %s",
                    hcoll_status_name(r.inner_destroy));
        HCT_REQUIRE(r.inner_register == HCOLL_ERR_INVALID_ARG,
                    "hcoll_mem_register from a callback -> %s",
                    hcoll_status_name(r.inner_register));
        HCT_REQUIRE(r.inner_wait == HCOLL_ERR_INVALID_ARG,
                    "hcoll_comm_abort from a callback -> %s", hcoll_status_name(r.inner_wait));
    }
    HCT_OK(comm, hcoll_request_free(req));
    return check(buf, COUNT, n, 3);
}

/* F: rank 0 issues requests the peers never issue and aborts: every one
 * gets its callback once, with an error. */
static int phase_abort(hcoll_comm_t comm, world_t *w, int rank)
{
    enum { NA = 4 };
    static int buf[NA][COUNT];
    cb_rec_t rec[NA];
    memset(rec, 0, sizeof rec);
    if (rank != 0) {
        HCT_REQUIRE(wait_flag(&w->aborted, TIMEOUT_MS) == 0, "rank 0 never aborted");
        HCT_OK(comm, hcoll_comm_destroy(comm));
        return 0;
    }
    hcoll_request_t req[NA];
    for (int k = 0; k < NA; k++) {
        HCT_OK(comm, hcoll_allreduce_async(comm, buf[k], buf[k], COUNT, HCOLL_INT32, HCOLL_SUM,
                                           NULL, &req[k]));
        rec[k].req = req[k];
        HCT_OK(comm, hcoll_request_set_callback(req[k], cb_count, &rec[k]));
    }
    usleep(20000);
    HCT_OK(NULL, hcoll_comm_abort(comm));
    __atomic_store_n(&w->aborted, 1, __ATOMIC_RELEASE);
    for (int k = 0; k < NA; k++) {
        hcoll_status_t st = hcoll_wait(req[k]);
        HCT_REQUIRE(st != HCOLL_SUCCESS, "aborted request %d succeeded", k);
        HCT_REQUIRE(atomic_load(&rec[k].calls) == 1, "aborted request %d: %d calls", k,
                    atomic_load(&rec[k].calls));
        HCT_REQUIRE(rec[k].status == st, "aborted request %d: callback got %s, wait %s", k,
                    hcoll_status_name(rec[k].status), hcoll_status_name(st));
        HCT_OK(NULL, hcoll_request_free(req[k]));
    }
    return 0;
}

static int rank_main(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-cb-%d-node%d", (int)getppid(), rank / 2);
    setenv("HCOLL_HOSTID", hostid, 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 10000;
    HCT_REQUIRE(hct_share_unique_id(&w->slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    int nodes;
    HCT_OK(comm, hcoll_comm_node_count(comm, &nodes));
    HCT_REQUIRE(nodes == 2, "%d nodes", nodes);

    HCT_REQUIRE(hcoll_request_set_callback(NULL, cb_count, NULL) == HCOLL_ERR_INVALID_ARG,
                "set_callback(NULL req)");
    if (phase_many(comm, rank, nranks) || phase_threads(comm, w, rank, nranks) ||
        phase_free(comm, rank, nranks) || phase_blocking(comm, w, rank, nranks)) {
        hcoll_comm_abort(comm);
        return 1;
    }
    hcoll_request_t req;
    int x = 1;
    HCT_OK(comm, hcoll_allreduce_async(comm, &x, &x, 1, HCOLL_INT32, HCOLL_SUM, NULL, &req));
    HCT_REQUIRE(hcoll_request_set_callback(req, NULL, NULL) == HCOLL_ERR_INVALID_ARG,
                "set_callback(NULL cb)");
    HCT_OK(comm, hcoll_request_free(req));
    HCT_REQUIRE(x == nranks, "x = %d", x);
    if (phase_abort(comm, w, rank))
        return 1;
    HCT_REQUIRE(LEAK_CHECK(), "rank %d: leaks (see the report above)", rank);
    return 0;
}

START_TEST(callbacks_2x2)
{
    world_t *w = hct_shared_alloc(sizeof *w);
    memset(w, 0, sizeof *w);
    hct_opts_t o = { .nranks = 4, .timeout_ms = 60000 };
    hct_result_t res[4];
    const double t0 = hct_now_ms();
    int bad = hct_run(&o, rank_main, w, res);
    fprintf(stderr, "[time] callbacks 2x2: %.1f s\n", (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "callbacks: %d rank(s) failed (see stderr)", bad);
    hct_shared_free(w, sizeof *w);
}
END_TEST

int main(void)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_DEBUG_FILE");
    Suite *s = suite_create("callback");
    TCase *tc = tcase_create("callbacks");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, callbacks_2x2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
