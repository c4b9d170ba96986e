/*
 * The all-reduce executor.
 *
 * Three-stage plan, one vector of S bytes cut into pieces p0 p1 p2 ...:
 *
 *   executor thread   RS(p0) RS(p1) AG(p0) RS(p2) AG(p1) ... AG(pK-1)
 *   ring thread              ring(p0)  ring(p1)   ring(p2) ...
 *                     (ring(k) overlaps RS(k+1) and AG(k-1))
 *
 *   RS(p)   intra-node reduce-scatter: local rank i now holds shard i of p
 *   ring(p) shard i of p all-reduced among the ranks with local rank i, one
 *           per node, over rail i (in place in recvbuf)
 *   AG(p)   intra-node all-gather: every local rank holds all of p
 *
 * Small vectors (at most HCOLL_SMALL_BYTES) take the latency path instead:
 *
 *   executor thread   AR(all)            ring(all, on rail i)
 *   AR(all)   the intra stage fused into one step (every local rank folds
 *             all L contributions: intra->ops->allreduce)
 *   ring(all) every local rank runs its rail's ring over the whole node sum,
 *             on the executor's own thread; no intra all-gather follows
 *
 * A small all-reduce costs synchronisations, not bytes: this path has one
 * intra-node step instead of two and no hand-off to the ring thread and
 * back (each a futex wake and a trip through the scheduler, tens of us on
 * a busy host), for L times the bytes on the wire. Every local rank feeds
 * its ring the same bits (the fused fold has RS's fixed order) and every
 * rail's ring has the same node order, so all ranks still end with the
 * same bits. The threshold must be equal on every rank (checked at init).
 *
 * Requests: hcoll_allreduce_async queues a request for the communicator's
 * worker thread, which runs them one at a time in issue order. A blocking
 * hcoll_allreduce waits for earlier requests and then runs on the caller's
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
 * coll_dev.c; the public entry points are src/api/allreduce.c.
 */
#include "core/coll.h"
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
#include "core/comm.h"
#include "core/ringdrv.h"
#include "core/memreg.h"
#include "core/request.h"
#include "core/ringthr.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"
#include "inter/ring.h"
#include "intra/intra.h"

/* Pieces of the pipeline hold this many ring chunks per shard: enough to
 * keep the ring's slots busy, small enough that the pipeline fills fast. */
#define PIECE_CHUNKS 4

typedef struct hc_group_ag {
    hc_boot_t *boot;
    int nranks;     /* of the communicator */
    int nmembers;
    int *members;   /* communicator ranks, in group order */
} hc_group_ag_t;

struct hc_coll {
    struct hcoll_comm *comm;
    enum hc_plan plan;
    hc_intra_t *intra;
    hc_ring_t *ring;
    hc_group_ag_t intra_ag, ring_ag;
    size_t piece_bytes;
    size_t small_bytes; /* latency path up to this many bytes (HCOLL_SMALL_BYTES) */

    /* Requests and the executor role. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct hcoll_request *head, *tail;
    int exec_busy;
    int waiters;   /* blocking callers queued behind earlier requests */
    int worker_started;
    int stopping;
    pthread_t worker;
    hcoll_status_t failed; /* sticky; HCOLL_SUCCESS while healthy */
    hcoll_stage_times_t last_times;
    int have_last_times;
    hc_coll_dev_t *dev; /* device-buffer path (coll_dev.c); CUDA only once used */

    hc_ringthr_t *ringthr; /* the ring thread (three-stage plan only) */
    struct hcoll_mem *mems; /* registered ranges (memreg.c), under the executor role */
};

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
/* Executing one all-reduce                                                   */
/* ------------------------------------------------------------------------ */

/* The ring over buf on the calling thread, until done, an error or abort. */
static hcoll_status_t ring_run_here(hc_coll_t *co, const void *send, void *recv, size_t count,
                                    hcoll_dtype_t dtype, hcoll_op_t op)
{
    struct hcoll_comm *c = co->comm;
    const hc_ringdrv_op_t rop = { send, recv, count, dtype, op, c->nranks, 0 };
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank, "the all-reduce" };
    return hc_ringdrv_run(co->ring, &rop, &env);
}

/* Latency path of the three-stage plan (see the top of the file). The ring
 * thread is idle: run_3stage waits for every job it posts, and the ring is
 * handed over under the ring thread's lock, so this thread may drive the ring itself. */
static hcoll_status_t run_3stage_small(hc_coll_t *co, struct hcoll_request *rq)
{
    double t = hc_now_us();
    hcoll_status_t st = co->intra->ops->allreduce(co->intra, rq->sendbuf, rq->recvbuf, rq->count,
                                                  rq->dtype, rq->op, NULL);
    /* One fused stage: split it evenly, as the one-node plan does. */
    rq->times.intra_rs_us = rq->times.intra_ag_us = (hc_now_us() - t) / 2;
    if (st != HCOLL_SUCCESS)
        return st;
    t = hc_now_us();
    st = ring_run_here(co, rq->recvbuf, rq->recvbuf, rq->count, rq->dtype, rq->op);
    rq->times.inter_us = hc_now_us() - t;
    return st;
}

static hcoll_status_t run_3stage(hc_coll_t *co, struct hcoll_request *rq)
{
    struct hcoll_comm *c = co->comm;
    const hc_intra_ops_t *iops = co->intra->ops;
    const size_t esize = hcoll_dtype_size(rq->dtype);
    const int L = c->local_size;
    const unsigned char *send = rq->sendbuf;
    unsigned char *recv = rq->recvbuf;
    size_t piece = co->piece_bytes / esize;
    if (piece < (size_t)L)
        piece = (size_t)L;
    const size_t npieces = (rq->count + piece - 1) / piece;
    hcoll_status_t st = HCOLL_SUCCESS, rst;
    double t;

    /* Stage 2 of piece k is waited for only after stage 1 of piece k+1. */
    uint64_t pending_id = 0;
    size_t pending_off = 0, pending_n = 0;
    int have_pending = 0;

    for (size_t k = 0; k <= npieces; k++) {
        if (k < npieces) {
            size_t off = k * piece;
            size_t n = rq->count - off < piece ? rq->count - off : piece;
            t = hc_now_us();
            st = iops->reduce_scatter(co->intra, send + off * esize, recv + off * esize, n,
                                      rq->dtype, rq->op, NULL);
            rq->times.intra_rs_us += hc_now_us() - t;
            if (st != HCOLL_SUCCESS) {
                /* The ring thread may still be reducing the previous piece
                 * in recvbuf: the buffers go back to the caller only after
                 * it is done with them. */
                if (have_pending)
                    hc_ringthr_wait(co->ringthr, pending_id, &rq->times.inter_us);
                break;
            }
            size_t soff, slen;
            hc_intra_shard(n, L, c->local_rank, &soff, &slen);
            unsigned char *shard = recv + (off + soff) * esize;
            const hc_ringdrv_op_t job = { shard, shard, slen, rq->dtype, rq->op, c->nranks, 0 };
            uint64_t id = hc_ringthr_post(co->ringthr, &job);
            if (have_pending) {
                rst = hc_ringthr_wait(co->ringthr, pending_id, &rq->times.inter_us);
                if (rst != HCOLL_SUCCESS) {
                    st = rst;
                    /* Let the ring thread finish the job just posted (it
                     * fails at once) before the buffers go back. */
                    hc_ringthr_wait(co->ringthr, id, &rq->times.inter_us);
                    break;
                }
                t = hc_now_us();
                st = iops->all_gather(co->intra, recv + pending_off * esize, pending_n,
                                      rq->dtype, NULL);
                rq->times.intra_ag_us += hc_now_us() - t;
                if (st != HCOLL_SUCCESS) {
                    hc_ringthr_wait(co->ringthr, id, &rq->times.inter_us);
                    break;
                }
            }
            pending_id = id;
            pending_off = off;
            pending_n = n;
            have_pending = 1;
        } else if (have_pending) {
            st = hc_ringthr_wait(co->ringthr, pending_id, &rq->times.inter_us);
            if (st != HCOLL_SUCCESS)
                break;
            t = hc_now_us();
            st = iops->all_gather(co->intra, recv + pending_off * esize, pending_n, rq->dtype,
                                  NULL);
            rq->times.intra_ag_us += hc_now_us() - t;
        }
    }
    return st;
}

static hcoll_status_t run_op(hc_coll_t *co, struct hcoll_request *rq)
{
    struct hcoll_comm *c = co->comm;
    double t0 = hc_now_us(), t;
    hcoll_status_t st = HCOLL_SUCCESS;
    /* The same on every rank: count and dtype must be, and so must the knob. */
    const int small = rq->count * hcoll_dtype_size(rq->dtype) <= co->small_bytes;
    memset(&rq->times, 0, sizeof rq->times);

    switch (co->plan) {
    case HC_PLAN_SINGLE:
        /* count 0 may come with NULL buffers, which memcpy must not see. */
        if (rq->sendbuf != rq->recvbuf && rq->count > 0)
            memcpy(rq->recvbuf, rq->sendbuf, rq->count * hcoll_dtype_size(rq->dtype));
        break;
    case HC_PLAN_INTRA: {
        const hc_intra_ops_t *iops = co->intra->ops;
        t = hc_now_us();
        if (small) {
            st = iops->allreduce(co->intra, rq->sendbuf, rq->recvbuf, rq->count, rq->dtype,
                                 rq->op, NULL);
            /* One fused stage: split it evenly so the breakdown still adds up. */
            rq->times.intra_rs_us = rq->times.intra_ag_us = (hc_now_us() - t) / 2;
        } else {
            st = iops->reduce_scatter(co->intra, rq->sendbuf, rq->recvbuf, rq->count, rq->dtype,
                                      rq->op, NULL);
            rq->times.intra_rs_us = hc_now_us() - t;
            t = hc_now_us();
            if (st == HCOLL_SUCCESS)
                st = iops->all_gather(co->intra, rq->recvbuf, rq->count, rq->dtype, NULL);
            rq->times.intra_ag_us = hc_now_us() - t;
        }
        if (st == HCOLL_SUCCESS)
            hc_reduce_avg_finish(rq->recvbuf, rq->count, rq->dtype, rq->op, c->nranks);
        break;
    }
    case HC_PLAN_RING:
    case HC_PLAN_FLAT:
        t = hc_now_us();
        st = ring_run_here(co, rq->sendbuf, rq->recvbuf, rq->count, rq->dtype, rq->op);
        rq->times.inter_us = hc_now_us() - t;
        break;
    case HC_PLAN_3STAGE:
        st = small ? run_3stage_small(co, rq) : run_3stage(co, rq);
        break;
    }
    rq->times.total_us = hc_now_us() - t0;
    return st;
}

/* ------------------------------------------------------------------------ */
/* Requests and the worker                                                    */
/* ------------------------------------------------------------------------ */

/* Run rq as the executor (the caller holds the role). Records the sticky
 * failure and the last times. */
static hcoll_status_t execute(hc_coll_t *co, struct hcoll_request *rq)
{
    struct hcoll_comm *c = co->comm;
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

    if (rq->dev) {
        st = hc_coll_dev_execute(co->dev, rq->dev, HCOLL_SUCCESS, &rq->times);
        rq->dev = NULL;
    } else {
        st = run_op(co, rq);
    }

    /* Whatever failed (this rank's intra stage, a peer, an abort), the ring
     * neighbours may be blocked on this rank: reset the connections now so
     * that the failure travels round the ring in milliseconds rather than
     * one deadline per hop. The ring thread is idle here: run_3stage waits
     * for every job it posted. */
    if (st != HCOLL_SUCCESS)
        hc_ring_fail(co->ring, st);

    pthread_mutex_lock(&co->lock);
    if (st != HCOLL_SUCCESS && co->failed == HCOLL_SUCCESS)
        co->failed = st;
    if (st == HCOLL_SUCCESS) {
        co->last_times = rq->times;
        co->have_last_times = 1;
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

        hcoll_status_t st = execute(co, rq);

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

hcoll_status_t hc_coll_allreduce(hc_coll_t *co, const void *sendbuf, void *recvbuf, size_t count,
                                 hcoll_dtype_t dtype, hcoll_op_t op, void *stream,
                                 struct hcoll_request **req_out)
{
    struct hcoll_comm *comm = co->comm;
    hcoll_status_t st;
    /* This thread is the worker inside a completion callback: a blocking
     * call would wait for the requests queued behind the callback. */
    if (!req_out && hc_request_in_callback(co))
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INVALID_ARG,
                          "a blocking all-reduce from a completion callback of the same "
                          "communicator would deadlock; use hcoll_allreduce_async");
    /* Device buffers: the GPU stages go on the stream now, the host stage
     * is queued as a request like any other (coll_dev.c). */
    hc_dev_op_t *dop = NULL;
    if (hc_coll_dev_wanted(sendbuf, recvbuf, stream)) {
        st = hc_coll_dev_enqueue(co->dev, sendbuf, recvbuf, count, dtype, op, stream, &dop);
        if (!dop)
            return st;
        /* An op comes back with an error when its stream already waits for
         * it: it is queued anyway, to release that stream in order. */
        if (st != HCOLL_SUCCESS)
            req_out = NULL;
    } else {
        st = hc_coll_check_args(comm, sendbuf, recvbuf, count, dtype, op, 0);
        if (st != HCOLL_SUCCESS)
            return st;
    }
    const hcoll_status_t dev_st = st;

    struct hcoll_request *rq = calloc(1, sizeof *rq);
    if (!rq)
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a request");
    hc_request_init(rq, co);
    rq->sendbuf = sendbuf;
    rq->recvbuf = recvbuf;
    rq->count = count;
    rq->dtype = dtype;
    rq->op = op;
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

    /* Blocking: after every earlier request, on this thread. An abort from
     * another thread sends waiting callers away before the memory goes. */
    co->waiters++;
    while ((co->head || co->exec_busy) && !co->stopping)
        pthread_cond_wait(&co->cond, &co->lock);
    co->waiters--;
    if (co->stopping) {
        pthread_cond_broadcast(&co->cond);
        pthread_mutex_unlock(&co->lock);
        hc_request_destroy(rq);
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_ABORTED,
                          "the communicator was aborted while this call waited for "
                          "earlier requests");
    }
    co->exec_busy = 1;
    pthread_mutex_unlock(&co->lock);

    st = execute(co, rq);

    pthread_mutex_lock(&co->lock);
    co->exec_busy = 0;
    pthread_cond_broadcast(&co->cond);
    pthread_mutex_unlock(&co->lock);
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
    pthread_mutex_lock(&co->lock);
    co->waiters++;
    while ((co->head || co->exec_busy) && !co->stopping)
        pthread_cond_wait(&co->cond, &co->lock);
    co->waiters--;
    if (co->stopping) {
        pthread_cond_broadcast(&co->cond);
        pthread_mutex_unlock(&co->lock);
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                          "%s: the communicator is being destroyed", what);
    }
    co->exec_busy = 1;
    pthread_mutex_unlock(&co->lock);
    return HCOLL_SUCCESS;
}

static void exec_leave(hc_coll_t *co)
{
    pthread_mutex_lock(&co->lock);
    co->exec_busy = 0;
    pthread_cond_broadcast(&co->cond);
    pthread_mutex_unlock(&co->lock);
}

hcoll_status_t hc_coll_mem_register(hc_coll_t *co, void *ptr, size_t bytes,
                                    struct hcoll_mem **handle_out)
{
    hcoll_status_t st = exec_enter(co, "hcoll_mem_register");
    if (st != HCOLL_SUCCESS)
        return st;
    st = hc_memreg_add(&co->mems, co->ring, &co->comm->err, co->comm->rank, ptr, bytes,
                       handle_out);
    exec_leave(co);
    return st;
}

hcoll_status_t hc_coll_mem_deregister(hc_coll_t *co, struct hcoll_mem *handle)
{
    hcoll_status_t st = exec_enter(co, "hcoll_mem_deregister");
    if (st != HCOLL_SUCCESS)
        return st;
    st = hc_memreg_remove(&co->mems, co->ring, &co->comm->err, co->comm->rank, handle);
    exec_leave(co);
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
    hc_memreg_clear(&co->mems, co->ring); /* registrations left: freed, no leak */
    /* Device path: the worker has released every stream it queued; free
     * the flag only once the streams are past it. Before the ring goes. */
    hc_coll_dev_destroy(co->dev, aborting);
    /* A ring that failed or is aborted resets its connections so peers
     * fail fast; otherwise they get an orderly goodbye. */
    if (aborting)
        hc_ring_fail(co->ring, HCOLL_ERR_ABORTED);
    hc_ring_destroy(co->ring);
    hc_intra_destroy(co->intra);
    free(co->intra_ag.members);
    free(co->ring_ag.members);
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
 * on the same call and hang until the deadline: refuse at init instead. */
static hcoll_status_t small_bytes_agree(hc_coll_t *co)
{
    struct hcoll_comm *c = co->comm;
    uint64_t mine = co->small_bytes;
    uint64_t *all = calloc((size_t)c->nranks, sizeof *all);
    if (!all)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the set-up exchange");
    hcoll_status_t st = hc_boot_allgather(c->boot, &mine, all, sizeof mine);
    for (int r = 0; st == HCOLL_SUCCESS && r < c->nranks; r++)
        if (all[r] != mine)
            st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_MISMATCH,
                            "HCOLL_SMALL_BYTES is %llu on rank %d but %llu on rank %d; it "
                            "must be equal on every rank",
                            (unsigned long long)all[r], r, (unsigned long long)mine, c->rank);
    free(all);
    return st;
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
            .timeout_ms = (int)c->params.timeout_ms,
            .nsocks_perpeer = (int)c->params.nsocks_perpeer,
            .socket_buf = c->params.socket_buf,
            .errbuf = &c->err,
            .has_gpu = c->gpu >= 0,
            .gpu = c->gpu,
            .peer_ranks = co->ring_ag.members, /* position -> rank, for messages */
            .settings = &c->params,
        },
        .chunk_bytes = c->params.chunk_bytes,
        .nslots = 0,
        .allgather = group_allgather,
        .ag_ctx = &co->ring_ag,
    };
    st = hc_ring_create(&rp, &co->ring);
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
    c->coll = co;

    if (c->rank == 0)
        HC_INFO(HC_INIT, c->rank, "all-reduce plan: %s (%d nodes x %d ranks%s)",
                hc_coll_plan_name(co->plan), c->nnodes, c->local_size,
                c->uniform ? "" : ", unequal");

    if (co->plan == HC_PLAN_INTRA || co->plan == HC_PLAN_3STAGE)
        HC_CHECK(small_bytes_agree(co), out);

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
    } else if (co->plan == HC_PLAN_3STAGE) {
        HC_CHECK(group_init(&co->ring_ag, c, c->nnodes), out);
        for (int n = 0; n < c->nnodes; n++)
            co->ring_ag.members[n] = hc_comm_rank_at(c, n, c->local_rank);
        HC_CHECK(ring_setup(co, c->nnodes, c->node), out);
        const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank,
                                       "the inter-node stage" };
        HC_CHECK(hc_ringthr_start(co->ring, &env, &co->ringthr), out);
    }
    /* Device-buffer path: bookkeeping only; CUDA and NCCL are set up by the
     * first device call (coll_dev.c), so host-only users never pay. */
    HC_CHECK(hc_coll_dev_create(c, co->plan, co->ring, group_allgather, &co->intra_ag,
                                co->piece_bytes, &co->dev),
             out);
    return HCOLL_SUCCESS;

out:
    /* c->coll is set: the caller's hc_coll_destroy frees the rest. */
    return st;
}
