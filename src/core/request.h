/*
 * One non-blocking operation (hcoll_request_t) and its completion
 * callback. The executor (coll.c) fills the arguments and completes it;
 * the owner tests, waits, sets a callback and frees it (request.c).
 *
 * Exactly once: rq->lock guards done, status and the callback, so the
 * completer and hcoll_request_set_callback agree on who runs it: a
 * callback set before completion is taken by the completer, one set after
 * runs at once on the setter's thread. While it runs, waiters and a free
 * from another thread hold off; a free from the callback itself is
 * deferred until the callback returns.
 */
#ifndef HC_CORE_REQUEST_H
#define HC_CORE_REQUEST_H

#include <pthread.h>

#include "core/coll.h"
#include "hcoll.h"

struct hc_dev_op;

struct hcoll_request {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    hcoll_status_t status;
    hcoll_stage_times_t times;

    hc_coll_args_t args; /* used only by the executor */
    struct hcoll_request *next;
    /* Device-buffer call (coll_dev.c): its host stage, run by execute. */
    struct hc_dev_op *dev;
    /* Nobody waits for it (a blocking call with a stream returned once
     * enqueued): the worker frees it when done. */
    int detached;

    /* Completion callback (hcoll_request_set_callback). */
    const void *owner;       /* the executor it belongs to (compared only) */
    int owner_pid;           /* the process it was issued in (fork) */
    hcoll_request_cb_t cb;
    void *cb_arg;
    int cb_set;              /* set once, never cleared */
    int cb_running;
    pthread_t cb_thread;
    int free_pending;        /* freed from its own callback */
};

/* Initialise a calloc'ed request of executor owner. */
void hc_request_init(struct hcoll_request *rq, const void *owner);

/* Mark rq done with st, then run its callback (if one is set) on this
 * thread, hcoll's. rq may be gone when this returns if its callback freed
 * it, or if its owner did once it saw it done. */
void hc_request_complete(struct hcoll_request *rq, hcoll_status_t st);

/* Release a request nobody else can see (never handed out). */
void hc_request_destroy(struct hcoll_request *rq);

/* 1 when this thread is running a completion callback of a request of
 * executor owner, on hcoll's thread: a blocking call there deadlocks. */
int hc_request_in_callback(const void *owner);

#endif
