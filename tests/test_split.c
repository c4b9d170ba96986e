/*
 * Non-blocking init and hcoll_comm_split across forked ranks on loopback,
 * nodes emulated with HCOLL_HOSTID: every state of a background set-up
 * (in progress while a rank is missing, success, a set-up error, abort and
 * destroy during it, a collective called too early), and splits by local
 * rank and by node, reversed keys, NOCOLOR, bad arguments, parent and
 * children all-reducing at once from different threads, children destroyed
 * before and after their parent, and 200 split/destroy cycles that leak
 * nothing.
 */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "core/comm.h"

#define TIMEOUT_MS 20000

static hcoll_config_t cfg_make(int blocking)
{
    hcoll_config_t c = HCOLL_CONFIG_INITIALIZER;
    c.timeout_ms = TIMEOUT_MS;
    c.blocking = blocking;
    return c;
}

static int count_dir(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.' && strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* Wait until the set-up has ended; its status, or -1 after the deadline. */
static int wait_setup(hcoll_comm_t c, int ms)
{
    double end = hct_now_ms() + ms;
    hcoll_status_t ae = HCOLL_IN_PROGRESS;
    while (hct_now_ms() < end) {
        if (hcoll_comm_get_async_error(c, &ae) != HCOLL_SUCCESS)
            return -1;
        if (ae != HCOLL_IN_PROGRESS)
            return (int)ae;
        usleep(2000);
    }
    return -1;
}

/* All-reduce (rank+1)*(i+1) summed over the ranks of c, as int32, and check
 * every element exactly. `who` are the ranks of c in the caller's world. */
static int allreduce_check(hcoll_comm_t c, int myval, int expect, size_t n)
{
    int32_t *v = calloc(n, sizeof *v);
    if (!v)
        return 1;
    for (size_t i = 0; i < n; i++)
        v[i] = myval * (int32_t)(i % 97 + 1);
    hcoll_status_t st = hcoll_allreduce(c, v, v, n, HCOLL_INT32, HCOLL_SUM, NULL);
    int bad = st != HCOLL_SUCCESS;
    if (bad)
        fprintf(stderr, "allreduce: %s (%s)\n", hcoll_status_name(st), hcoll_comm_last_error(c));
    for (size_t i = 0; !bad && i < n; i++)
        if (v[i] != expect * (int32_t)(i % 97 + 1)) {
            fprintf(stderr, "element %zu: %d, expected %d\n", i, v[i],
                    expect * (int32_t)(i % 97 + 1));
            bad = 1;
        }
    free(v);
    return bad;
}

static int sum_ranks1(int nranks)
{
    return nranks * (nranks + 1) / 2;
}

/* ------------------------------------------------------------------------ */
/* Non-blocking init                                                          */
/* ------------------------------------------------------------------------ */

typedef struct nb_arg {
    hct_id_slot_t slot;
    hct_barrier_t bar;
    int late_rank;      /* joins 300 ms late */
    int mode;           /* 0 success, 1 set-up error, 2 abort, 3 destroy */
} nb_arg_t;

static int rank_nb_success(int rank, int nranks, nb_arg_t *a, const hcoll_unique_id_t *id)
{
    hcoll_comm_t c = NULL;
    hcoll_config_t cfg = cfg_make(0);
    if (rank == a->late_rank)
        usleep(300 * 1000);
    hcoll_status_t st = hcoll_comm_init(&c, nranks, rank, id, &cfg);
    HCT_REQUIRE(st == HCOLL_IN_PROGRESS && c, "init: %s", hcoll_status_name(st));
    int v = -1;
    HCT_OK(c, hcoll_comm_rank(c, &v));
    HCT_REQUIRE(v == rank, "rank %d", v);
    HCT_OK(c, hcoll_comm_size(c, &v));
    HCT_REQUIRE(v == nranks, "size %d", v);
    if (rank != a->late_rank) {
        /* The late rank is still missing: nothing can be ready. */
        hcoll_status_t ae;
        HCT_OK(c, hcoll_comm_get_async_error(c, &ae));
        HCT_REQUIRE(ae == HCOLL_IN_PROGRESS, "async error %s", hcoll_status_name(ae));
        HCT_REQUIRE(hcoll_comm_local_rank(c, &v) == HCOLL_IN_PROGRESS, "local_rank answered");
        HCT_REQUIRE(hcoll_comm_node_count(c, &v) == HCOLL_IN_PROGRESS, "node_count answered");
        int32_t x = 1;
        hcoll_request_t req = NULL;
        HCT_REQUIRE(hcoll_allreduce(c, &x, &x, 1, HCOLL_INT32, HCOLL_SUM, NULL) ==
                        HCOLL_IN_PROGRESS,
                    "allreduce too early");
        HCT_REQUIRE(strstr(hcoll_comm_last_error(c), "still being set up"), "message '%s'",
                    hcoll_comm_last_error(c));
        HCT_REQUIRE(hcoll_allreduce_async(c, &x, &x, 1, HCOLL_INT32, HCOLL_SUM, NULL, &req) ==
                            HCOLL_IN_PROGRESS && req == NULL,
                    "allreduce_async too early");
    }
    int s = wait_setup(c, TIMEOUT_MS);
    HCT_REQUIRE(s == HCOLL_SUCCESS, "set-up ended with %d (%s)", s, hcoll_comm_last_error(c));
    HCT_OK(c, hcoll_comm_local_rank(c, &v));
    HCT_REQUIRE(v == rank % 2, "local rank %d", v);
    HCT_REQUIRE(allreduce_check(c, rank + 1, sum_ranks1(nranks), 10000) == 0, "allreduce");
    HCT_OK(c, hcoll_comm_destroy(c));
    return 0;
}

/* Rank 0 alone sets up (rank 1 never comes) and is cancelled. */
static int rank_nb_cancel(int rank, int nranks, nb_arg_t *a, const hcoll_unique_id_t *id)
{
    if (rank != 0)
        return 0;
    const int fds0 = count_dir("/proc/self/fd", ""), thr0 = count_dir("/proc/self/task", "");
    hcoll_comm_t c = NULL;
    hcoll_config_t cfg = cfg_make(0);
    hcoll_status_t st = hcoll_comm_init(&c, nranks, rank, id, &cfg);
    HCT_REQUIRE(st == HCOLL_IN_PROGRESS && c, "init: %s", hcoll_status_name(st));
    usleep(100 * 1000);
    hcoll_status_t ae;
    HCT_OK(c, hcoll_comm_get_async_error(c, &ae));
    HCT_REQUIRE(ae == HCOLL_IN_PROGRESS, "async error %s", hcoll_status_name(ae));
    double t0 = hct_now_ms();
    if (a->mode == 2)
        HCT_OK(NULL, hcoll_comm_abort(c));
    else
        HCT_OK(NULL, hcoll_comm_destroy(c));
    double ms = hct_now_ms() - t0;
    HCT_REQUIRE(ms < 1000, "cancelling took %.0f ms", ms);
    /* One fewer: init took over the listener get_unique_id had parked. */
    HCT_REQUIRE(count_dir("/proc/self/fd", "") == fds0 - 1, "fds: %d before, %d after", fds0,
                count_dir("/proc/self/fd", ""));
    HCT_REQUIRE(count_dir("/proc/self/task", "") == thr0, "threads leaked");
    return 0;
}

/* Ranks disagree on HCOLL_SMALL_BYTES: the set-up fails with MISMATCH. */
static int rank_nb_error(int rank, int nranks, nb_arg_t *a, const hcoll_unique_id_t *id)
{
    (void)a;
    hcoll_comm_t c = NULL;
    hcoll_config_t cfg = cfg_make(0);
    setenv("HCOLL_SMALL_BYTES", rank == 1 ? "1K" : "2K", 1);
    hcoll_status_t st = hcoll_comm_init(&c, nranks, rank, id, &cfg);
    HCT_REQUIRE(st == HCOLL_IN_PROGRESS && c, "init: %s", hcoll_status_name(st));
    int s = wait_setup(c, TIMEOUT_MS);
    HCT_REQUIRE(s != -1 && s != HCOLL_SUCCESS, "set-up ended with %d", s);
    /* Rank 1 may see its peers leave rather than the mismatch itself. */
    HCT_REQUIRE(s == HCOLL_ERR_MISMATCH || s == HCOLL_ERR_PEER_FAILED, "status %s",
                hcoll_status_name((hcoll_status_t)s));
    if (s == HCOLL_ERR_MISMATCH)
        HCT_REQUIRE(strstr(hcoll_comm_last_error(c), "HCOLL_SMALL_BYTES"), "message '%s'",
                    hcoll_comm_last_error(c));
    int32_t x = 1;
    HCT_REQUIRE(hcoll_allreduce(c, &x, &x, 1, HCOLL_INT32, HCOLL_SUM, NULL) == (hcoll_status_t)s,
                "allreduce after a failed set-up");
    HCT_OK(NULL, hcoll_comm_destroy(c));
    return 0;
}

static int rank_nb(int rank, int nranks, void *argp)
{
    nb_arg_t *a = argp;
    hcoll_unique_id_t id;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    switch (a->mode) {
    case 0: return rank_nb_success(rank, nranks, a, &id);
    case 1: return rank_nb_error(rank, nranks, a, &id);
    default: return rank_nb_cancel(rank, nranks, a, &id);
    }
}

static void run_nb(int mode, int nranks, int rpn, int late)
{
    nb_arg_t *a = hct_shared_alloc(sizeof *a);
    a->mode = mode;
    a->late_rank = late;
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = rpn, .timeout_ms = 30000 };
    hct_result_t res[8];
    int bad = hct_run(&o, rank_nb, a, res);
    hct_shared_free(a, sizeof *a);
    ck_assert_msg(bad == 0, "mode %d: %d rank(s) failed", mode, bad);
}

START_TEST(nb_in_progress_then_success) { run_nb(0, 4, 2, 3); }
END_TEST
START_TEST(nb_setup_error) { run_nb(1, 2, 2, -1); }
END_TEST
START_TEST(nb_abort_during_init) { run_nb(2, 2, 1, -1); }
END_TEST
START_TEST(nb_destroy_during_init) { run_nb(3, 2, 1, -1); }
END_TEST

START_TEST(config_versions)
{
    /* A version-1 config (the struct before blocking and rail) is accepted,
     * its missing fields defaulted; a bad blocking value is refused. */
    hc_params_t p;
    char err[512];
    hcoll_config_t c = HCOLL_CONFIG_INITIALIZER;
    c.version = 1;
    c.size = offsetof(hcoll_config_t, blocking);
    c.blocking = 0; /* beyond its size: must be ignored */
    ck_assert_int_eq(hc_params_load(&p, &c, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.blocking, 1);
    ck_assert_int_eq(p.rail, -1);
    hcoll_config_t d = HCOLL_CONFIG_INITIALIZER;
    d.blocking = 2;
    ck_assert_int_eq(hc_params_load(&p, &d, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "blocking"));
    d.blocking = 0;
    d.rail = 3;
    ck_assert_int_eq(hc_params_load(&p, &d, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.blocking, 0);
    ck_assert_int_eq(p.rail, 3);
    d.rail = -7;
    ck_assert_int_eq(hc_params_load(&p, &d, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    /* HCOLL_RAIL applies when the field is -1; the field wins otherwise. */
    setenv("HCOLL_RAIL", "2", 1);
    d.rail = -1;
    ck_assert_int_eq(hc_params_load(&p, &d, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.rail, 2);
    d.rail = 1;
    ck_assert_int_eq(hc_params_load(&p, &d, err, sizeof err), HCOLL_SUCCESS);
    ck_assert_int_eq(p.rail, 1);
    setenv("HCOLL_RAIL", "x", 1);
    ck_assert_int_eq(hc_params_load(&p, NULL, err, sizeof err), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "HCOLL_RAIL"));
    unsetenv("HCOLL_RAIL");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Split                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct split_arg {
    hct_id_slot_t slot;
    int rpn;
    int mode;
} split_arg_t;

static int init_parent(split_arg_t *a, int rank, int nranks, hcoll_comm_t *c)
{
    hcoll_unique_id_t id;
    hcoll_config_t cfg = cfg_make(1);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, TIMEOUT_MS, &id) == 0, "no id");
    HCT_OK(NULL, hcoll_comm_init(c, nranks, rank, &id, &cfg));
    return 0;
}

/* Split by local rank with keys reversing the order, then by node; check
 * ranks, topology, rails and an all-reduce in each. */
static int rank_split_shapes(int rank, int nranks, void *argp)
{
    split_arg_t *a = argp;
    const int rpn = a->rpn, nnodes = nranks / rpn, lr = rank % rpn, node = rank / rpn;
    hcoll_comm_t p, d, n;
    if (init_parent(a, rank, nranks, &p))
        return 1;

    /* Data-parallel groups: one rank per node; key -rank reverses them. */
    HCT_OK(p, hcoll_comm_split(p, lr, -rank, NULL, &d));
    HCT_REQUIRE(d != NULL, "no child");
    int v;
    HCT_OK(d, hcoll_comm_size(d, &v));
    HCT_REQUIRE(v == nnodes, "dp size %d", v);
    HCT_OK(d, hcoll_comm_rank(d, &v));
    HCT_REQUIRE(v == nnodes - 1 - node, "dp rank %d", v);
    HCT_OK(d, hcoll_comm_local_size(d, &v));
    HCT_REQUIRE(v == 1, "dp local size %d", v);
    HCT_OK(d, hcoll_comm_node_count(d, &v));
    HCT_REQUIRE(v == nnodes, "dp node count %d", v);
    /* Rails kept: every member of group lr is on rail lr, not rail 0. */
    for (int r = 0; r < d->nranks; r++)
        HCT_REQUIRE(d->peers[r].rail == lr, "dp rank %d on rail %d", r, d->peers[r].rail);
    int expect = 0;
    for (int k = 0; k < nnodes; k++)
        expect += k * rpn + lr + 1;
    HCT_REQUIRE(allreduce_check(d, rank + 1, expect, 50000) == 0, "dp allreduce");

    /* Node groups. */
    HCT_OK(p, hcoll_comm_split(p, node, rank, NULL, &n));
    HCT_OK(n, hcoll_comm_size(n, &v));
    HCT_REQUIRE(v == rpn, "node size %d", v);
    HCT_OK(n, hcoll_comm_rank(n, &v));
    HCT_REQUIRE(v == lr, "node rank %d", v);
    HCT_OK(n, hcoll_comm_node_count(n, &v));
    HCT_REQUIRE(v == 1, "node count %d", v);
    expect = 0;
    for (int l = 0; l < rpn; l++)
        expect += node * rpn + l + 1;
    HCT_REQUIRE(allreduce_check(n, rank + 1, expect, 50000) == 0, "node allreduce");

    /* An explicit rail wins over the kept one. */
    hcoll_comm_t e;
    hcoll_config_t ec = cfg_make(1);
    ec.rail = 5;
    HCT_OK(p, hcoll_comm_split(p, 0, 0, &ec, &e));
    for (int r = 0; r < e->nranks; r++)
        HCT_REQUIRE(e->peers[r].rail == 5, "explicit rail: %d", e->peers[r].rail);
    HCT_OK(e, hcoll_comm_destroy(e));

    HCT_OK(d, hcoll_comm_destroy(d));
    HCT_OK(n, hcoll_comm_destroy(n));
    HCT_REQUIRE(allreduce_check(p, rank + 1, sum_ranks1(nranks), 1000) == 0, "parent");
    HCT_OK(p, hcoll_comm_destroy(p));
    return 0;
}

START_TEST(split_by_rail_and_node)
{
    split_arg_t *a = hct_shared_alloc(sizeof *a);
    a->rpn = 2;
    hct_opts_t o = { .nranks = 6, .ranks_per_node = 2, .timeout_ms = 40000 };
    hct_result_t res[6];
    int bad = hct_run(&o, rank_split_shapes, a, res);
    hct_shared_free(a, sizeof *a);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* NOCOLOR and bad arguments. */
static int rank_split_args(int rank, int nranks, void *argp)
{
    split_arg_t *a = argp;
    hcoll_comm_t p, c = (hcoll_comm_t)0x1;
    if (init_parent(a, rank, nranks, &p))
        return 1;
    HCT_OK(p, hcoll_comm_split(p, rank == 3 ? HCOLL_SPLIT_NOCOLOR : 7, 0, NULL, &c));
    if (rank == 3) {
        HCT_REQUIRE(c == NULL, "NOCOLOR gave a communicator");
    } else {
        int v;
        HCT_OK(c, hcoll_comm_size(c, &v));
        HCT_REQUIRE(v == 3, "size %d", v);
        HCT_REQUIRE(allreduce_check(c, rank + 1, 6, 100) == 0, "allreduce");
        HCT_OK(c, hcoll_comm_destroy(c));
    }

    /* Rank 2 passes color -5: every rank fails at once, with a message. */
    double t0 = hct_now_ms();
    hcoll_comm_t x = (hcoll_comm_t)0x1;
    hcoll_status_t st = hcoll_comm_split(p, rank == 2 ? -5 : 0, 0, NULL, &x);
    HCT_REQUIRE(st == HCOLL_ERR_INVALID_ARG && x == (hcoll_comm_t)0x1, "bad color: %s",
                hcoll_status_name(st));
    HCT_REQUIRE(hct_now_ms() - t0 < 5000, "bad color took %.0f ms", hct_now_ms() - t0);
    HCT_REQUIRE(strstr(hcoll_comm_last_error(p), rank == 2 ? "color -5" : "rank 2"),
                "message '%s'", hcoll_comm_last_error(p));
    /* NULL out on every rank. */
    st = hcoll_comm_split(p, 0, 0, NULL, NULL);
    HCT_REQUIRE(st == HCOLL_ERR_INVALID_ARG, "NULL out: %s", hcoll_status_name(st));
    HCT_REQUIRE(strstr(hcoll_comm_last_error(p), "newcomm_out is NULL"), "message '%s'",
                hcoll_comm_last_error(p));
    HCT_REQUIRE(hcoll_comm_split(NULL, 0, 0, NULL, &x) == HCOLL_ERR_INVALID_ARG, "NULL comm");
    /* A bad config on one rank. */
    hcoll_config_t bc = cfg_make(1);
    bc.blocking = 9;
    st = hcoll_comm_split(p, 0, 0, rank == 1 ? &bc : NULL, &x);
    HCT_REQUIRE(st == HCOLL_ERR_INVALID_ARG, "bad config: %s", hcoll_status_name(st));
    /* The parent is still fine. */
    HCT_REQUIRE(allreduce_check(p, rank + 1, sum_ranks1(nranks), 100) == 0, "parent");
    HCT_OK(p, hcoll_comm_destroy(p));
    return 0;
}

START_TEST(split_nocolor_and_bad_args)
{
    split_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 2, .timeout_ms = 30000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_split_args, a, res);
    hct_shared_free(a, sizeof *a);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* Parent and both children all-reduce at once, each from its own thread. */
typedef struct ar_job {
    hcoll_comm_t c;
    int myval, expect, iters;
    size_t n;
    int bad;
} ar_job_t;

static void *ar_thread(void *p)
{
    ar_job_t *j = p;
    for (int i = 0; i < j->iters && !j->bad; i++)
        j->bad = allreduce_check(j->c, j->myval, j->expect, j->n);
    return NULL;
}

static int rank_split_concurrent(int rank, int nranks, void *argp)
{
    split_arg_t *a = argp;
    const int rpn = a->rpn, lr = rank % rpn, node = rank / rpn, nnodes = nranks / rpn;
    hcoll_comm_t p, d, n;
    if (init_parent(a, rank, nranks, &p))
        return 1;
    HCT_OK(p, hcoll_comm_split(p, lr, rank, NULL, &d));
    /* Non-blocking child: ready in the background. */
    hcoll_config_t nb = cfg_make(0);
    hcoll_status_t st = hcoll_comm_split(p, node, rank, &nb, &n);
    HCT_REQUIRE(st == HCOLL_IN_PROGRESS || st == HCOLL_SUCCESS, "nb split %s",
                hcoll_status_name(st));
    HCT_REQUIRE(wait_setup(n, TIMEOUT_MS) == HCOLL_SUCCESS, "nb child: %s",
                hcoll_comm_last_error(n));

    int dexp = 0, nexp = 0;
    for (int k = 0; k < nnodes; k++)
        dexp += k * rpn + lr + 1;
    for (int l = 0; l < rpn; l++)
        nexp += node * rpn + l + 1;
    ar_job_t jobs[3] = {
        { p, rank + 1, sum_ranks1(nranks), 20, 300000, 0 },
        { d, rank + 1, dexp, 20, 200000, 0 },
        { n, rank + 1, nexp, 20, 100000, 0 },
    };
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        HCT_REQUIRE(pthread_create(&t[i], NULL, ar_thread, &jobs[i]) == 0, "thread");
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++)
        HCT_REQUIRE(!jobs[i].bad, "job %d failed", i);

    if (a->mode == 0) { /* children first */
        HCT_OK(d, hcoll_comm_destroy(d));
        HCT_OK(n, hcoll_comm_destroy(n));
        HCT_REQUIRE(allreduce_check(p, rank + 1, sum_ranks1(nranks), 1000) == 0, "parent");
        HCT_OK(p, hcoll_comm_destroy(p));
    } else { /* parent first: the children live on */
        HCT_OK(p, hcoll_comm_destroy(p));
        HCT_REQUIRE(allreduce_check(d, rank + 1, dexp, 1000) == 0, "dp after parent");
        HCT_REQUIRE(allreduce_check(n, rank + 1, nexp, 1000) == 0, "node after parent");
        HCT_OK(d, hcoll_comm_destroy(d));
        HCT_OK(n, hcoll_comm_destroy(n));
    }
    return 0;
}

static void run_concurrent(int mode)
{
    split_arg_t *a = hct_shared_alloc(sizeof *a);
    a->rpn = 2;
    a->mode = mode;
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 2, .timeout_ms = 60000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_split_concurrent, a, res);
    hct_shared_free(a, sizeof *a);
    ck_assert_msg(bad == 0, "mode %d: %d rank(s) failed", mode, bad);
}

START_TEST(split_concurrent_children_first) { run_concurrent(0); }
END_TEST
START_TEST(split_concurrent_parent_first) { run_concurrent(1); }
END_TEST

/* 200 split/destroy cycles, alternating rail groups (ring, sockets) and
 * node groups (shared memory): nothing may stay behind. */
static int rank_split_cycles(int rank, int nranks, void *argp)
{
    split_arg_t *a = argp;
    hcoll_comm_t p;
    if (init_parent(a, rank, nranks, &p))
        return 1;
    const int fds0 = count_dir("/proc/self/fd", ""), thr0 = count_dir("/proc/self/task", "");
    const int shm0 = count_dir("/dev/shm", "hcoll-");
    for (int it = 0; it < 200; it++) {
        hcoll_comm_t c;
        int color = it % 2 ? rank / 2 : rank % 2;
        HCT_OK(p, hcoll_comm_split(p, color, 0, NULL, &c));
        if (it % 50 == 0) {
            int32_t x = rank;
            HCT_OK(c, hcoll_allreduce(c, &x, &x, 1, HCOLL_INT32, HCOLL_SUM, NULL));
        }
        HCT_OK(c, hcoll_comm_destroy(c));
    }
    const int fds1 = count_dir("/proc/self/fd", ""), thr1 = count_dir("/proc/self/task", "");
    HCT_REQUIRE(fds0 == fds1, "fds %d before, %d after", fds0, fds1);
    HCT_REQUIRE(thr0 == thr1, "threads %d before, %d after", thr0, thr1);
    /* Every rank's children are gone before /dev/shm is counted. */
    HCT_OK(p, hc_boot_barrier(p->boot));
    const int shm1 = count_dir("/dev/shm", "hcoll-");
    HCT_REQUIRE(shm0 == shm1, "/dev/shm hcoll entries %d before, %d after", shm0, shm1);
    HCT_OK(p, hcoll_comm_destroy(p));
    return 0;
}

START_TEST(split_cycles_no_leaks)
{
    split_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 2, .timeout_ms = 120000 };
    hct_result_t res[4];
    int bad = hct_run(&o, rank_split_cycles, a, res);
    hct_shared_free(a, sizeof *a);
    ck_assert_int_eq(bad, 0);
}
END_TEST

int main(void)
{
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    unsetenv("HCOLL_HOSTID");
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_RAIL");
    unsetenv("HCOLL_SMALL_BYTES");
    Suite *s = suite_create("split");
    TCase *nb = tcase_create("nonblocking");
    tcase_set_timeout(nb, 120);
    tcase_add_test(nb, config_versions);
    tcase_add_test(nb, nb_in_progress_then_success);
    tcase_add_test(nb, nb_setup_error);
    tcase_add_test(nb, nb_abort_during_init);
    tcase_add_test(nb, nb_destroy_during_init);
    suite_add_tcase(s, nb);
    TCase *sp = tcase_create("split");
    tcase_set_timeout(sp, 200);
    tcase_add_test(sp, split_by_rail_and_node);
    tcase_add_test(sp, split_nocolor_and_bad_args);
    tcase_add_test(sp, split_concurrent_children_first);
    tcase_add_test(sp, split_concurrent_parent_first);
    tcase_add_test(sp, split_cycles_no_leaks);
    suite_add_tcase(s, sp);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
