/*
 * Requests: test, wait, free, stage times and the completion callback
 * (request.h says who runs the callback, and when).
 */
#include "core/request.h"
#include "core/coll.h"

#include <stdlib.h>
#include <unistd.h>

#include "base/err.h"
#include "base/pid.h"
#include "base/log.h"

/* The executor whose callback this thread, hcoll's worker, is running;
 * NULL elsewhere. Per thread, so it names one communicator's worker. */
static __thread const void *tls_cb_owner;

void hc_request_init(struct hcoll_request *rq, const void *owner)
{
    pthread_mutex_init(&rq->lock, NULL);
    pthread_cond_init(&rq->cond, NULL);
    rq->owner = owner;
    rq->owner_pid = hc_pid();
}

/* In a forked child, a request is a copy that nothing will complete: its
 * executor's thread exists only in the parent, so a wait would last
 * forever, and its lock may have been held by that thread at the fork.
 * Every call on it is refused, before the lock is touched. */
static hcoll_status_t refuse_forked(const struct hcoll_request *rq, const char *what)
{
    if (hc_pid() == rq->owner_pid)
        return HCOLL_SUCCESS;
    return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG,
                      "%s in a forked child (pid %d) of the request's process %d: refused, "
                      "only that process can complete it",
                      what, (int)getpid(), rq->owner_pid);
}

void hc_request_destroy(struct hcoll_request *rq)
{
    pthread_mutex_destroy(&rq->lock);
    pthread_cond_destroy(&rq->cond);
    free(rq);
}

int hc_request_in_callback(const void *owner)
{
    return owner && tls_cb_owner == owner;
}

const void *hc_request_callback_owner(void)
{
    return tls_cb_owner;
}

/* Run the callback taken under rq->lock (cb_running set by the caller),
 * then let waiters go; frees rq if the callback asked to. Called without
 * the lock; rq must not be touched by the caller afterwards. */
static void run_callback(struct hcoll_request *rq, hcoll_request_cb_t cb, void *arg,
                         hcoll_status_t st, int on_worker)
{
    const void *saved = tls_cb_owner;
    if (on_worker)
        tls_cb_owner = rq->owner;
    cb(rq, st, arg);
    tls_cb_owner = saved;

    pthread_mutex_lock(&rq->lock);
    rq->cb_running = 0;
    int free_now = rq->free_pending;
    pthread_cond_broadcast(&rq->cond);
    pthread_mutex_unlock(&rq->lock);
    if (free_now)
        hc_request_destroy(rq);
}

void hc_request_complete(struct hcoll_request *rq, hcoll_status_t st)
{
    pthread_mutex_lock(&rq->lock);
    rq->status = st;
    rq->done = 1;
    hcoll_request_cb_t cb = rq->cb;
    void *arg = rq->cb_arg;
    if (cb) {
        rq->cb_running = 1;
        rq->cb_thread = pthread_self();
    }
    pthread_cond_broadcast(&rq->cond);
    pthread_mutex_unlock(&rq->lock);
    if (cb)
        run_callback(rq, cb, arg, st, 1);
}

hcoll_status_t hc_request_set_callback(struct hcoll_request *rq, hcoll_request_cb_t cb, void *arg)
{
    hcoll_status_t fst = refuse_forked(rq, "hcoll_request_set_callback");
    if (fst != HCOLL_SUCCESS)
        return fst;
    pthread_mutex_lock(&rq->lock);
    if (rq->cb_set) {
        pthread_mutex_unlock(&rq->lock);
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG,
                          "this request already has a completion callback");
    }
    rq->cb_set = 1;
    if (!rq->done) {
        rq->cb = cb;
        rq->cb_arg = arg;
        pthread_mutex_unlock(&rq->lock);
        return HCOLL_SUCCESS;
    }
    hcoll_status_t st = rq->status;
    rq->cb_running = 1;
    rq->cb_thread = pthread_self();
    pthread_mutex_unlock(&rq->lock);
    run_callback(rq, cb, arg, st, 0);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_request_test(struct hcoll_request *rq, int *done_out)
{
    hcoll_status_t fst = refuse_forked(rq, "hcoll_test");
    if (fst != HCOLL_SUCCESS)
        return fst;
    pthread_mutex_lock(&rq->lock);
    int done = rq->done;
    hcoll_status_t st = done ? rq->status : HCOLL_SUCCESS;
    pthread_mutex_unlock(&rq->lock);
    *done_out = done;
    return st;
}

/* With rq->lock held: is this thread the one running rq's callback? */
static int in_own_callback(const struct hcoll_request *rq)
{
    return rq->cb_running && pthread_equal(rq->cb_thread, pthread_self());
}

hcoll_status_t hc_request_wait(struct hcoll_request *rq)
{
    hcoll_status_t fst = refuse_forked(rq, "hcoll_wait");
    if (fst != HCOLL_SUCCESS)
        return fst;
    pthread_mutex_lock(&rq->lock);
    if (!rq->done && hc_request_in_callback(rq->owner)) {
        pthread_mutex_unlock(&rq->lock);
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG,
                          "a completion callback waited for a later request of its own "
                          "communicator, which can only complete after the callback returns");
    }
    /* No deadline of its own: every wait of the operation ends (a dead
     * peer through liveness, a late one at HCOLL_OP_TIMEOUT_MS, an abort
     * at once), so the request completes; with HCOLL_OP_TIMEOUT_MS=0 it
     * waits as long as the late peers stay alive. Once done,
     * a callback running on another thread is waited for, so that the
     * owner sees its effects. */
    while (!rq->done || (rq->cb_running && !in_own_callback(rq)))
        pthread_cond_wait(&rq->cond, &rq->lock);
    hcoll_status_t st = rq->status;
    pthread_mutex_unlock(&rq->lock);
    return st;
}

hcoll_status_t hc_request_free(struct hcoll_request *rq)
{
    /* The child's copy is left alone too, as a forked child leaves its
     * parent's communicators: its memory goes with the child. */
    hcoll_status_t fst = refuse_forked(rq, "hcoll_request_free");
    if (fst != HCOLL_SUCCESS)
        return fst;
    pthread_mutex_lock(&rq->lock);
    int own = in_own_callback(rq);
    if (own)
        rq->free_pending = 1; /* run_callback frees it once the callback returns */
    pthread_mutex_unlock(&rq->lock);
    if (own)
        return HCOLL_SUCCESS;
    hcoll_status_t st = hc_request_wait(rq);
    pthread_mutex_lock(&rq->lock);
    int done = rq->done;
    pthread_mutex_unlock(&rq->lock);
    if (!done)
        return st; /* from a callback, a request that cannot finish before it returns */
    hc_request_destroy(rq);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_request_times(struct hcoll_request *rq, hcoll_stage_times_t *times_out)
{
    hcoll_status_t fst = refuse_forked(rq, "hcoll_request_stage_times");
    if (fst != HCOLL_SUCCESS)
        return fst;
    /* The executor writes times without the lock, before it marks the
     * request done under it: read them only once done (ThreadSanitizer). */
    hcoll_stage_times_t t;
    pthread_mutex_lock(&rq->lock);
    int done = rq->done;
    if (done)
        t = rq->times;
    pthread_mutex_unlock(&rq->lock);
    if (!done)
        return HCOLL_IN_PROGRESS;
    *times_out = t;
    return HCOLL_SUCCESS;
}
