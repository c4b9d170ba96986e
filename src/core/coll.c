/*
 * The executor: requests, the worker, the sticky failure, the data plane's
 * life. What one operation does is coll_run.c.
 *
 * Requests: a request is a kind (all-reduce, broadcast, barrier,
 * reduce-scatter, all-gather) and its
 * arguments (hc_coll_args_t). Every _async call queues one for the
 * communicator's worker thread, which runs them one at a time in issue
 * order. A blocking call waits for earlier requests and then runs on the caller's
 * thread, which saves a thread hand-off on every small call. Whoever runs
 * an operation holds the executor role (exec_busy) so only one runs at once.
 *
 * Failure: the first error of any operation is sticky. The communicator's
 * async error is set, queued requests fail with it, and later calls fail
 * at once: the ring and the segment are in an unknown state after a peer
 * died, so the only way forward is a new communicator.
 *
 * Around this file: the ring thread is ringthr.c, the loop that drives a
 * ring ringdrv.c, plan choice and argument checks plan.c, device buffers
 * coll_dev.c; the public entry points are src/api/allreduce.c and bcast.c.
 */
#include "core/coll_priv.h"
#include "base/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "core/coll_dev.h" /* device buffers (coll_dev.c) */
#include "inter/dissem.h"
#include "core/comm.h"
#include "core/memreg.h"
#include "core/request.h"
#include "core/ringdrv.h"
#include "core/ringthr.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"
#include "inter/rd.h"
#include "inter/ring.h"
#include "inter/tree.h"
#include "intra/intra.h"
#include "boot/hmac.h" /* the data connections' hello MAC */

/* HCOLL_OP_TIMEOUT_MS as the backends take it: 0 (no limit) is < 0 there. */
static int op_timeout(const struct hcoll_comm *c)
{
    return c->params.op_timeout_ms > 0 ? (int)c->params.op_timeout_ms : -1;
}

/* ------------------------------------------------------------------------ */
/* Set-up exchanges over a subset of ranks                                    */
/* ------------------------------------------------------------------------ */

/*
 * The bootstrap's allgather spans every rank; a ring or a node needs one
 * over its members only. Every rank takes part in the full exchange (all
 * groups are set up at the same point of init), and keeps its members'
 * entries.
 */
static hcoll_status_t group_allgather(void *ctx, const void *mine, void *all_out, size_t len)
{
    hc_group_ag_t *g = ctx;
    unsigned char *all = malloc((size_t)g->nranks * len);
    if (!all)
        return HCOLL_ERR_NO_MEMORY;
    hcoll_status_t st = hc_boot_allgather(g->boot, mine, all, len);
    if (st == HCOLL_SUCCESS)
        for (int i = 0; i < g->nmembers; i++)
            memcpy((unsigned char *)all_out + (size_t)i * len, all + (size_t)g->members[i] * len,
                   len);
    free(all);
    return st;
}

static hcoll_status_t group_init(hc_group_ag_t *g, struct hcoll_comm *c, int n)
{
    g->boot = c->boot;
    g->nranks = c->nranks;
    g->nmembers = n;
    g->members = calloc((size_t)n, sizeof *g->members);
    if (!g->members)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the set-up exchanges");
    return HCOLL_SUCCESS;
}


/* ------------------------------------------------------------------------ */
/* Requests and the worker                                                    */
/* ------------------------------------------------------------------------ */

/* Run rq as the executor (the caller holds the role): on a blocking
 * caller's thread (on_caller) or on the worker. Records the sticky
 * failure and the last times. */
static hcoll_status_t execute(hc_coll_t *co, struct hcoll_request *rq, int on_caller)
{
    struct hcoll_comm *c = co->comm;
    int agreed = 0;
    co->spin_us = on_caller ? (int)c->params.spin_us : 0;
    pthread_mutex_lock(&co->lock);
    hcoll_status_t st = co->failed;
    pthread_mutex_unlock(&co->lock);
    if (st == HCOLL_SUCCESS && atomic_load(&c->aborted))
        st = HCOLL_ERR_ABORTED;
    if (st != HCOLL_SUCCESS) {
        st = hc_err_repeat(&c->err, HC_COLL, c->rank, st,
                           "the communicator failed earlier (%s); create a new one",
                           hcoll_strerror(st));
        /* A device call's stream waits for its host stage: release it. */
        if (rq->dev)
            hc_coll_dev_execute(co->dev, rq->dev, st, &rq->times);
        rq->dev = NULL;
        return st;
    }

    /* Every rank executes the same operations in the same order: the
     * count names a call alike everywhere (the barrier's signals). */
    co->opseq++;
    const int unseen = rq->dev && rq->detached; /* a blocking device call */
    const uint64_t voided = hc_ring_voided(co->ring);
    if (rq->dev) {
        /* A device broadcast, reduce-scatter or all-gather moves nothing
         * across nodes until every rank agreed. */
        hcoll_status_t in = HCOLL_SUCCESS;
        if (rq->args.kind == HC_COLL_BROADCAST)
            in = hc_coll_bcast_agree(co, &rq->args, &rq->times, &agreed);
        else if (rq->args.kind != HC_COLL_ALLREDUCE) /* reduce-scatter, all-gather */
            in = hc_coll_dev_agree(co->dev, rq->dev, &agreed);
        st = hc_coll_dev_execute(co->dev, rq->dev, in, &rq->times);
        rq->dev = NULL;
    } else {
        st = hc_coll_run(co, &rq->args, &rq->times, &agreed);
    }
    if (st != HCOLL_SUCCESS && !agreed) /* a registration refused in the ring */
        agreed = hc_coll_void_agreed(co, voided);
    /* Every rank found the same argument mismatch after a complete
     * exchange: nothing is in flight, the communicator stays usable. A
     * blocking device call has already returned, and no request reports
     * to anybody: its mismatch is recorded as a failure, as any error of a
     * device call's host stage is, so that the async error shows it (but
     * without resetting the ring: every rank agreed, and a peer may still
     * be receiving the check's last message). */
    if (agreed) {
        if (unseen) {
            pthread_mutex_lock(&co->lock);
            if (co->failed == HCOLL_SUCCESS)
                co->failed = st;
            pthread_mutex_unlock(&co->lock);
            hc_comm_set_async_error(c, st);
        }
        return st;
    }

    /* Whatever failed (this rank's intra stage, a peer, an abort), the ring
     * neighbours may be blocked on this rank: reset the connections now so
     * that the failure travels round the ring in milliseconds rather than
     * one deadline per hop. The ring thread is idle here: run_3stage waits
     * for every job it posted. */
    if (st != HCOLL_SUCCESS) {
        hc_ring_fail(co->ring, st);
        hc_dissem_fail(co->dissem, st);
        hc_rd_fail(co->rd, st);
        hc_tree_fail(co->tree, st);
    }

    pthread_mutex_lock(&co->lock);
    if (st != HCOLL_SUCCESS && co->failed == HCOLL_SUCCESS)
        co->failed = st;
    if (st == HCOLL_SUCCESS) {
        co->last_times = rq->times;
        co->have_last_times = 1;
        co->last_algo = co->cur_algo;
    }
    pthread_mutex_unlock(&co->lock);
    if (st != HCOLL_SUCCESS)
        hc_comm_set_async_error(c, st);
    return st;
}

static void *worker_main(void *arg)
{
    hc_coll_t *co = arg;
    pthread_mutex_lock(&co->lock);
    for (;;) {
        while (!co->stopping && (!co->head || co->exec_busy))
            pthread_cond_wait(&co->cond, &co->lock);
        if (!co->head && co->stopping)
            break;
        if (!co->head)
            continue;
        struct hcoll_request *rq = co->head;
        co->head = rq->next;
        if (!co->head)
            co->tail = NULL;
        co->exec_busy = 1;
        pthread_mutex_unlock(&co->lock);

        hcoll_status_t st = execute(co, rq, 0);

        pthread_mutex_lock(&co->lock);
        co->exec_busy = 0;
        pthread_cond_broadcast(&co->cond);
        pthread_mutex_unlock(&co->lock);
        /* Completed outside co->lock: the owner may free rq at once. */
        /* rq->detached is read first: once complete, an owner may free rq. */
        int detached = rq->detached;
        hc_request_complete(rq, st); /* runs its callback, if any */
        if (detached)
            hc_request_free(rq);
        pthread_mutex_lock(&co->lock);
    }
    pthread_mutex_unlock(&co->lock);
    return NULL;
}

/* The checks of a host call of any kind, and the device stages of a device
 * all-reduce or broadcast (*dop_out then set, as hc_coll_dev_enqueue says). */
static hcoll_status_t submit_check(hc_coll_t *co, const hc_coll_args_t *a, void *stream,
                                   hc_dev_op_t **dop_out)
{
    struct hcoll_comm *comm = co->comm;
    *dop_out = NULL;
    switch (a->kind) {
    case HC_COLL_ALLREDUCE:
        /* Device buffers: the GPU stages go on the stream now, the host
         * stage is queued as a request like any other (coll_dev.c). */
        if (hc_coll_dev_wanted(a->sendbuf, a->recvbuf, stream))
            return hc_coll_dev_enqueue(co->dev, a->sendbuf, a->recvbuf, a->count, a->dtype,
                                       a->op, &a->ro, stream, dop_out);
        if (a->ro.dev_scalar)
            return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INVALID_ARG,
                              "allreduce: op %d has a device scalar and serves device "
                              "buffers only",
                              (int)a->op);
        return hc_coll_check_args(comm, a->sendbuf, a->recvbuf, a->count, a->dtype, a->ro.op,
                                  0);
    case HC_COLL_BROADCAST:
        if (hc_coll_dev_wanted(comm->rank == a->root ? a->sendbuf : NULL, a->recvbuf, stream))
            return hc_coll_dev_bcast_enqueue(co->dev, a->sendbuf, a->recvbuf, a->count, a->dtype,
                                             a->root, stream, dop_out);
        return hc_coll_check_bcast(comm, a->sendbuf, a->recvbuf, a->count, a->dtype, a->root);
    case HC_COLL_BARRIER:
        return HCOLL_SUCCESS;
    case HC_COLL_REDUCE_SCATTER:
    case HC_COLL_ALLGATHER:
        if (hc_coll_dev_wanted(a->sendbuf, a->recvbuf, stream))
            return hc_coll_dev_rsag_enqueue(co->dev, a->kind == HC_COLL_REDUCE_SCATTER,
                                            a->sendbuf, a->recvbuf, a->count, a->dtype, a->op,
                                            &a->ro, stream, dop_out);
        if (a->kind == HC_COLL_REDUCE_SCATTER && a->ro.dev_scalar)
            return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INVALID_ARG,
                              "reduce_scatter: op %d has a device scalar and serves device "
                              "buffers only",
                              (int)a->op);
        return hc_coll_check_rsag(comm, a->kind, a->sendbuf, a->recvbuf, a->count, a->dtype,
                                  a->kind == HC_COLL_REDUCE_SCATTER ? a->ro.op : HCOLL_SUM);
    }
    return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INTERNAL,
                      "unknown collective %d", (int)a->kind);
}

/* The executor role for a caller's thread, after every earlier request
 * (co->lock held; it is released while waiting). 1: taken; 0: the
 * communicator is stopping (abort or destroy sends waiting callers away
 * before the memory goes). Give it back with role_leave. */
static int role_take_locked(hc_coll_t *co)
{
    co->waiters++;
    while ((co->head || co->exec_busy) && !co->stopping)
        pthread_cond_wait(&co->cond, &co->lock);
    co->waiters--;
    if (co->stopping) {
        pthread_cond_broadcast(&co->cond);
        return 0;
    }
    co->exec_busy = 1;
    return 1;
}

static void role_leave(hc_coll_t *co)
{
    pthread_mutex_lock(&co->lock);
    co->exec_busy = 0;
    pthread_cond_broadcast(&co->cond);
    pthread_mutex_unlock(&co->lock);
}

hcoll_status_t hc_coll_submit(hc_coll_t *co, const hc_coll_args_t *args, void *stream,
                              struct hcoll_request **req_out)
{
    struct hcoll_comm *comm = co->comm;
    hc_dev_op_t *dop = NULL;
    hc_coll_args_t a = *args;
    hcoll_status_t st;
    a.user_op = args->op; /* the op the ranks agree on, before it resolves */
    /* This thread is the worker inside a completion callback: a blocking
     * call would wait for the requests queued behind the callback. */
    if (!req_out && hc_request_in_callback(co))
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INVALID_ARG,
                          "a blocking collective from a completion callback of the same "
                          "communicator would deadlock; use its _async form");
    const int reduces = a.kind == HC_COLL_ALLREDUCE || a.kind == HC_COLL_REDUCE_SCATTER;
    if (reduces && (st = hc_redop_resolve(comm, a.op, a.dtype, &a.ro)) != HCOLL_SUCCESS)
        return st;
    st = submit_check(co, &a, stream, &dop);
    if (dop) {
        /* An op comes back with an error when its stream already waits for
         * it: it is queued anyway, to release that stream in order. */
        if (st != HCOLL_SUCCESS)
            req_out = NULL;
    } else if (st != HCOLL_SUCCESS) {
        return st;
    }
    const hcoll_status_t dev_st = st;

    struct hcoll_request *rq = calloc(1, sizeof *rq);
    if (!rq)
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a request");
    hc_request_init(rq, co);
    rq->args = a;
    if (reduces)
        rq->args.op = a.ro.op;
    rq->dev = dop;
    rq->detached = dop && !req_out;

    pthread_mutex_lock(&co->lock);
    if (req_out || dop) {
        if (!co->worker_started) {
            int rc = pthread_create(&co->worker, NULL, worker_main, co);
            if (rc != 0) {
                pthread_mutex_unlock(&co->lock);
                st = hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_SYSTEM,
                                "cannot start the progress thread: %s", strerror(rc));
                if (dop) /* release its stream here, as nobody else will */
                    hc_coll_dev_execute(co->dev, dop, st, &rq->times);
                rq->done = 1;
                hc_request_free(rq);
                return st;
            }
            co->worker_started = 1;
        }
        if (co->tail)
            co->tail->next = rq;
        else
            co->head = rq;
        co->tail = rq;
        pthread_cond_broadcast(&co->cond);
        pthread_mutex_unlock(&co->lock);
        if (req_out)
            *req_out = rq;
        return dev_st;
    }

    /* Blocking: after every earlier request, on this thread. */
    if (!role_take_locked(co)) {
        /* Recorded before the lock goes: abort frees comm (its err too)
         * as soon as it sees this caller out. */
        st = hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_ABORTED,
                        "the communicator was aborted while this call waited for "
                        "earlier requests");
        pthread_mutex_unlock(&co->lock);
        hc_request_destroy(rq);
        return st;
    }
    pthread_mutex_unlock(&co->lock);
    st = execute(co, rq, 1);
    role_leave(co);
    hc_request_destroy(rq);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Registered buffers                                                         */
/* ------------------------------------------------------------------------ */

/* Take the executor role after every earlier request: the transport is
 * used by one thread at a time, and an operation in flight may be using
 * a range that is about to go. */
static hcoll_status_t exec_enter(hc_coll_t *co, const char *what)
{
    struct hcoll_comm *c = co->comm;
    if (hc_request_in_callback(co))
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "%s from a completion callback of the same communicator would "
                          "deadlock",
                          what);
    hcoll_status_t st = HCOLL_SUCCESS;
    pthread_mutex_lock(&co->lock);
    if (!role_take_locked(co)) /* recorded under the lock, as in hc_coll_submit */
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                        "%s: the communicator is being destroyed", what);
    pthread_mutex_unlock(&co->lock);
    return st;
}

hcoll_status_t hc_coll_mem_register(hc_coll_t *co, void *ptr, size_t bytes,
                                    struct hcoll_mem **handle_out)
{
    hcoll_status_t st = exec_enter(co, "hcoll_mem_register");
    if (st != HCOLL_SUCCESS)
        return st;
    st = hc_memreg_add(&co->mems, co->ring, &co->comm->err, co->comm->rank, ptr, bytes,
                       handle_out);
    role_leave(co);
    return st;
}

hcoll_status_t hc_coll_mem_deregister(hc_coll_t *co, struct hcoll_mem *handle)
{
    hcoll_status_t st = exec_enter(co, "hcoll_mem_deregister");
    if (st != HCOLL_SUCCESS)
        return st;
    st = hc_memreg_remove(&co->mems, co->ring, &co->comm->err, co->comm->rank, handle);
    role_leave(co);
    return st;
}

int hc_coll_last_times(hc_coll_t *co, hcoll_stage_times_t *times_out)
{
    pthread_mutex_lock(&co->lock);
    int have = co->have_last_times;
    hcoll_stage_times_t t = co->last_times;
    pthread_mutex_unlock(&co->lock);
    if (have)
        *times_out = t;
    return have;
}

const char *hc_coll_last_algo(hc_coll_t *co)
{
    pthread_mutex_lock(&co->lock);
    enum hc_algo a = co->have_last_times ? co->last_algo : HC_ALGO_NONE;
    pthread_mutex_unlock(&co->lock);
    return a == HC_ALGO_NONE ? NULL : hc_algo_name(a);
}

/* ------------------------------------------------------------------------ */
/* Creation and teardown                                                      */
/* ------------------------------------------------------------------------ */

void hc_coll_destroy(hc_coll_t *co, int aborting)
{
    if (!co)
        return;
    struct hcoll_comm *c = co->comm;

    if (aborting) {
        /* Make every blocked stage return: the shm waits watch this flag,
         * the ring drivers poll c->aborted every HC_RINGDRV_POLL_MS. */
        hc_intra_abort(co->intra);
    }
    /* Stop the worker after it has drained the queue; on abort each queued
     * request fails at once (execute sees c->aborted). */
    pthread_mutex_lock(&co->lock);
    co->stopping = 1;
    pthread_cond_broadcast(&co->cond);
    /* abort may come from another thread while a blocking all-reduce runs
     * on the caller's: it returns promptly now, and must be out before the
     * memory goes. */
    while (co->exec_busy || co->waiters)
        pthread_cond_wait(&co->cond, &co->lock);
    pthread_mutex_unlock(&co->lock);
    if (co->worker_started)
        pthread_join(co->worker, NULL);
    hc_ringthr_stop(co->ringthr);
    hc_live_stop(co->live);
    hc_memreg_clear(&co->mems, co->ring); /* registrations left: freed, no leak */
    hc_coll_rsag_free(co);
    /* Device path: the worker has released every stream it queued; free
     * the flag only once the streams are past it. Before the ring goes. */
    hc_coll_dev_destroy(co->dev, aborting);
    /* A ring that failed or is aborted resets its connections so peers
     * fail fast; otherwise they get an orderly goodbye. */
    if (aborting)
        hc_ring_fail(co->ring, HCOLL_ERR_ABORTED);
    if (aborting)
        hc_dissem_fail(co->dissem, HCOLL_ERR_ABORTED);
    if (aborting)
        hc_rd_fail(co->rd, HCOLL_ERR_ABORTED);
    if (aborting)
        hc_tree_fail(co->tree, HCOLL_ERR_ABORTED);
    hc_dissem_destroy(co->dissem);
    hc_rd_destroy(co->rd);
    hc_tree_destroy(co->tree);
    hc_ring_destroy(co->ring);
    hc_intra_destroy(co->intra);
    free(co->intra_ag.members);
    free(co->ring_ag.members);
    free(co->agree_buf);
    pthread_mutex_destroy(&co->lock);
    pthread_cond_destroy(&co->cond);
    c->coll = NULL;
    free(co);
}

/* The rail address rank r binds: the (rail)-th address of its node,
 * wrapping around when the node has fewer interfaces than rails. The rail
 * is the rank's own (comm.h: its local rank by default, kept from the
 * parent by a split), so a group of one rank per node keeps its NICs. */
static const hc_iface_t *rail_iface(const struct hcoll_comm *c, int r)
{
    const hc_peer_t *p = &c->peers[r];
    return &p->addrs[p->rail % p->naddrs];
}

/* Ranks that disagree on the latency threshold would run different stages
 * on the same call and hang until the deadline, and ranks that disagree on
 * HCOLL_CHECK_ARGS would run the agreement against data: refuse at init
 * instead. */
static hcoll_status_t knobs_agree(hc_coll_t *co)
{
    struct hcoll_comm *c = co->comm;
    enum { NKNOBS = 7 };
    static const char *const names[NKNOBS] = { "HCOLL_SMALL_BYTES", "HCOLL_CHECK_ARGS",
                                               "HCOLL_ALGO's rd limit",
                                               "the agreement's inline limit (HCOLL_ALGO=ring: 0)",
                                               "HCOLL_ALGO_MODEL (hashed)",
                                               "the broadcast's inline limit",
                                               "the inline split's limit" };
    /* Ranks that disagree on the model would not all probe: its hash. */
    uint64_t model = (uint64_t)co->model.mode * 0x9e3779b97f4a7c15ull;
    for (const unsigned char *p = (const unsigned char *)c->params.algo_model;
         co->model.mode == HC_MODEL_GIVEN && *p; p++)
        model = (model ^ *p) * 0x100000001b3ull;
    uint64_t mine[NKNOBS] = { co->small_bytes, (uint64_t)co->check_args, co->algo.rd_max,
                              co->inline_max,   model, co->inline_bcast,
                              co->inline_split };
    uint64_t(*all)[NKNOBS] = calloc((size_t)c->nranks, sizeof *all);
    if (!all)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the set-up exchange");
    hcoll_status_t st = hc_boot_allgather(c->boot, mine, all, sizeof mine);
    for (int r = 0; st == HCOLL_SUCCESS && r < c->nranks; r++)
        for (int k = 0; st == HCOLL_SUCCESS && k < NKNOBS; k++)
            if (all[r][k] != mine[k])
                st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_MISMATCH,
                                "%s is %llu on rank %d but %llu on rank %d; it must be equal "
                                "on every rank",
                                names[k], (unsigned long long)all[r][k], r,
                                (unsigned long long)mine[k], c->rank);
    free(all);
    return st;
}

/* The model's limits (algo_model.c), compared again: they derive from
 * figures every rank gathered, so they cannot differ unless a knob does. */
static hcoll_status_t algo_tune(hc_coll_t *co)
{
    hcoll_status_t st = hc_coll_algo_tune(co);
    return st == HCOLL_SUCCESS && co->model.chosen ? knobs_agree(co) : st;
}

static hcoll_status_t ring_setup(hc_coll_t *co, int nmembers, int position)
{
    struct hcoll_comm *c = co->comm;
    hcoll_status_t st;
    /* Every rank agrees over the bootstrap, so all rings pick alike. */
    hc_select_params_t sp = {
        .settings = &c->params,
        .rank = c->rank,
        .local_rank = c->peers[c->rank].rail, /* picks the NIC: the rail */
        .gpu = c->gpu,
        .errbuf = &c->err,
        .nranks = c->nranks,
        .allgather = hc_boot_allgather,
        .ag_ctx = c->boot,
    };
    const hc_transport_ops_t *ops;
    HC_CHECK(hc_transport_select(&sp, &ops), out);

    const hc_iface_t *ifc = rail_iface(c, c->rank);
    char addr[INET6_ADDRSTRLEN + 8];
    hc_sockaddr_str(&ifc->addr, addr, sizeof addr);
    hc_ring_params_t rp = {
        .ops = ops,
        .tp = {
            .rank = position,
            .nranks = nmembers,
            .bind_addr = addr,
            .ifname = ifc->name,
            .rail = c->peers[c->rank].rail,
            .log_rank = c->rank,
            .timeout_ms = (int)c->params.timeout_ms,  /* set-up */
            .nsocks_perpeer = (int)c->params.nsocks_perpeer,
            .socket_buf = c->params.socket_buf,
            .errbuf = &c->err,
            .has_gpu = c->gpu >= 0,
            .gpu = c->gpu,
            .peer_ranks = co->ring_ag.members, /* position -> rank, for messages */
            .settings = &c->params,
            .cancel_fd = &c->cancel_fd, /* abort/destroy during a non-blocking init */
            .auth_key = c->key,         /* TCP's hello (tcp_hello.c) */
            .mac = hc_hmac_sha256,
        },
        .chunk_bytes = c->params.chunk_bytes,
        .nslots = 0,
        .allgather = group_allgather,
        .ag_ctx = &co->ring_ag,
        .op_timeout_ms = op_timeout(c),
        .liveness_ms = (int)c->params.liveness_ms,
    };
    HC_CHECK(hc_ring_create(&rp, &co->ring), out);
    HC_CHECK(hc_coll_barrier_setup(co, ops, &rp.tp, group_allgather, &co->ring_ag,
                                   op_timeout(c)),
             out);
    st = hc_coll_rd_setup(co, ops, &rp.tp, group_allgather, &co->ring_ag, op_timeout(c));
    if (st == HCOLL_SUCCESS)
        st = hc_coll_tree_setup(co, ops, &rp.tp, group_allgather, &co->ring_ag, op_timeout(c));
out:
    return st;
}

hcoll_status_t hc_coll_create(struct hcoll_comm *c)
{
    hcoll_status_t st;
    hc_coll_t *co = calloc(1, sizeof *co);
    if (!co)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the data plane");
    co->comm = c;
    pthread_mutex_init(&co->lock, NULL);
    pthread_cond_init(&co->cond, NULL);
    co->plan = hc_coll_plan_for(c->nranks, c->nnodes, c->local_size, c->uniform);
    /* A piece holds PIECE_CHUNKS ring chunks per local rank's shard. */
    co->piece_bytes = (size_t)c->params.chunk_bytes * PIECE_CHUNKS * (size_t)c->local_size;
    co->small_bytes = (size_t)c->params.small_bytes;
    co->check_args = c->params.check_args != 0;
    c->coll = co;
    char amsg[HC_ERRMSG_MAX];
    if (hc_algo_parse(c->params.algo, co->plan, c->nnodes, c->local_size, &co->algo, amsg,
                      sizeof amsg) != HCOLL_SUCCESS) {
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG, "%s", amsg);
        goto out;
    }
    if (hc_algo_model_parse(c->params.algo_model, &co->model) != 0) {
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                        "HCOLL_ALGO_MODEL: bad value '%s' (expected probe, table or "
                        "ALPHA_US:MBPS, e.g. 50:117)",
                        c->params.algo_model);
        goto out;
    }

    if (c->rank == 0)
        HC_INFO(HC_INIT, c->rank, "all-reduce plan: %s (%d nodes x %d ranks%s)",
                hc_coll_plan_name(co->plan), c->nnodes, c->local_size,
                c->uniform ? "" : ", unequal");

    co->inline_max = co->plan == HC_PLAN_SINGLE
                         ? 0
                         : hc_algo_inline_max(&co->algo, co->check_args, c->params.chunk_bytes);
    co->inline_bcast = co->inline_max;
    co->inline_split = SIZE_MAX;
    if (co->inline_max &&
        !(co->agree_buf = aligned_alloc(64, (co->inline_max + 63) & ~(size_t)63))) {
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                        "no memory for the agreement's buffer");
        goto out;
    }
    if (co->plan != HC_PLAN_SINGLE)
        HC_CHECK(knobs_agree(co), out);

    if (co->plan == HC_PLAN_INTRA || co->plan == HC_PLAN_3STAGE) {
        /* A name unique to this communicator: rank 0 draws it for all. */
        uint64_t job = 0;
        if (c->rank == 0 && getrandom(&job, sizeof job, 0) != (ssize_t)sizeof job)
            job = (uint64_t)hc_now_us() ^ ((uint64_t)getpid() << 32);
        HC_CHECK(hc_boot_bcast(c->boot, &job, sizeof job, 0), out);
        HC_CHECK(group_init(&co->intra_ag, c, c->local_size), out);
        for (int i = 0; i < c->local_size; i++)
            co->intra_ag.members[i] = hc_comm_rank_at(c, c->node, i);
        char name[64];
        snprintf(name, sizeof name, "/hcoll-%016" PRIx64 "-n%d", job, c->node);
        hc_intra_params_t ip = {
            .local_rank = c->local_rank,
            .local_size = c->local_size,
            .name = name,
            .chunk_bytes = c->params.chunk_bytes,
            .timeout_ms = (int)c->params.timeout_ms,
            .op_timeout_ms = op_timeout(c),
            .liveness_ms = (int)c->params.liveness_ms,
            .errbuf = &c->err,
            .rank = c->rank,
            .allgather = group_allgather,
            .allgather_ctx = &co->intra_ag,
        };
        HC_CHECK(hc_intra_shm_ops.create(&ip, &co->intra), out);
    }

    if (co->plan == HC_PLAN_RING || co->plan == HC_PLAN_FLAT) {
        HC_CHECK(group_init(&co->ring_ag, c, c->nranks), out);
        for (int r = 0; r < c->nranks; r++)
            co->ring_ag.members[r] = r;
        HC_CHECK(ring_setup(co, c->nranks, c->rank), out);
        HC_CHECK(algo_tune(co), out);
    } else if (co->plan == HC_PLAN_3STAGE) {
        HC_CHECK(group_init(&co->ring_ag, c, c->nnodes), out);
        for (int n = 0; n < c->nnodes; n++)
            co->ring_ag.members[n] = hc_comm_rank_at(c, n, c->local_rank);
        HC_CHECK(ring_setup(co, c->nnodes, c->node), out);
        HC_CHECK(algo_tune(co), out);
        const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank,
                                       "the inter-node stage", co->intra, co->dissem };
        HC_CHECK(hc_ringthr_start(co->ring, &env, &co->ringthr), out);
    }
    /* Device-buffer path: bookkeeping only; CUDA and NCCL are set up by the
     * first device call (coll_dev.c), so host-only users never pay. */
    HC_CHECK(hc_live_start(co->intra, co->ring, (int)c->params.liveness_ms, &c->err, c->rank,
                           &co->live),
             out);
    HC_CHECK(hc_coll_dev_create(c, co->plan, co->ring, group_allgather, &co->intra_ag,
                                co->piece_bytes, &co->dev),
             out);
    return HCOLL_SUCCESS;

out:
    /* c->coll is set: the caller's hc_coll_destroy frees the rest. */
    return st;
}
