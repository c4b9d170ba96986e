/*
 * CUDA events (event.h): the polling wait, timing events and the list of
 * events that callers' streams must pass.
 */
#include "gdr/event.h"

#include <stdlib.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"

hcoll_status_t hc_gdr_cu_fail(const hc_gdr_report_t *rp, hc_cu_res_t r, const char *what)
{
    char eb[200];
    return hc_err_set(rp->err, HC_GDR, rp->rank, HCOLL_ERR_CUDA, "%s: %s", what,
                      hc_gdr_cu_errstr(r, eb, sizeof eb));
}

/* The one polling loop: timeout_ms < 0 none; knob names the deadline in
 * the message; watch (may be NULL) between sleeps, every WATCH_MS. */
#define WATCH_MS 10
static hcoll_status_t event_poll(const hc_cu_api_t *cu, void *ev, int timeout_ms,
                                 const char *knob, int check_abort, const hc_gdr_report_t *rp,
                                 const char *what, hc_gdr_watch_fn watch, void *arg)
{
    const double t0 = hc_now_ms(), deadline = t0 + timeout_ms;
    double next_watch = t0 + WATCH_MS;
    long sleep_ns = 2000;
    for (int spins = 0;; spins++) {
        hc_cu_res_t r = cu->event_query(ev);
        if (r == HC_CU_SUCCESS)
            return HCOLL_SUCCESS;
        if (r != HC_CU_ERROR_NOT_READY)
            return hc_gdr_cu_fail(rp, r, what);
        if (check_abort && rp->aborted && atomic_load(rp->aborted))
            return hc_err_set(rp->err, HC_COLL, rp->rank, HCOLL_ERR_ABORTED,
                              "communicator aborted while waiting for %s", what);
        if (spins > 64) {
            const double now = hc_now_ms();
            if (timeout_ms >= 0 && now > deadline)
                return hc_err_set(rp->err, HC_GDR, rp->rank, HCOLL_ERR_TIMEOUT,
                                  "%s did not happen within %d ms (%s)", what, timeout_ms, knob);
            if (watch && now >= next_watch) {
                hcoll_status_t st = watch(arg);
                if (st != HCOLL_SUCCESS)
                    return st;
                next_watch = now + WATCH_MS;
            }
            struct timespec ts = { 0, sleep_ns };
            nanosleep(&ts, NULL);
            if (sleep_ns < 200000)
                sleep_ns *= 2;
        }
    }
}

hcoll_status_t hc_gdr_event_wait(const hc_cu_api_t *cu, void *ev, int timeout_ms,
                                 int check_abort, const hc_gdr_report_t *rp, const char *what)
{
    return event_poll(cu, ev, timeout_ms, "HCOLL_TIMEOUT_MS", check_abort, rp, what, NULL, NULL);
}

hcoll_status_t hc_gdr_event_wait_watched(const hc_cu_api_t *cu, void *ev, int op_timeout_ms,
                                         const hc_gdr_report_t *rp, const char *what,
                                         hc_gdr_watch_fn watch, void *arg)
{
    return event_poll(cu, ev, op_timeout_ms, "HCOLL_OP_TIMEOUT_MS", 1, rp, what, watch, arg);
}

void *hc_gdr_tev_mark(const hc_cu_api_t *cu, void *stream)
{
    void *e = NULL;
    if (cu->event_create(&e, 0) != HC_CU_SUCCESS)
        return NULL;
    if (cu->event_record(e, stream) != HC_CU_SUCCESS) {
        cu->event_destroy(e);
        return NULL;
    }
    return e;
}

double hc_gdr_tev_us(const hc_cu_api_t *cu, void *a, void *b)
{
    float ms = 0;
    if (!a || !b || cu->event_elapsed(&ms, a, b) != HC_CU_SUCCESS)
        return -1;
    return ms * 1e3;
}

void hc_gdr_evlist_init(hc_gdr_evlist_t *l)
{
    pthread_mutex_init(&l->lock, NULL);
    l->ev = NULL;
    l->n = l->cap = 0;
}

void hc_gdr_evlist_add(hc_gdr_evlist_t *l, const hc_cu_api_t *cu, void *ev, int timeout_ms,
                       const hc_gdr_report_t *rp)
{
    pthread_mutex_lock(&l->lock);
    size_t keep = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (cu->event_query(l->ev[i]) == HC_CU_SUCCESS)
            cu->event_destroy(l->ev[i]);
        else
            l->ev[keep++] = l->ev[i];
    }
    l->n = keep;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        void **p = realloc(l->ev, cap * sizeof *p);
        if (!p) {
            /* Without a slot, wait for the GPU to pass it now (rare). */
            pthread_mutex_unlock(&l->lock);
            hc_gdr_event_wait(cu, ev, timeout_ms, 0, rp, "the end of a device all-reduce");
            cu->event_destroy(ev);
            return;
        }
        l->ev = p;
        l->cap = cap;
    }
    l->ev[l->n++] = ev;
    pthread_mutex_unlock(&l->lock);
}

hcoll_status_t hc_gdr_evlist_drain(hc_gdr_evlist_t *l, const hc_cu_api_t *cu, int timeout_ms,
                                   const hc_gdr_report_t *rp)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    for (size_t i = 0; i < l->n; i++) {
        if (st == HCOLL_SUCCESS)
            st = hc_gdr_event_wait(cu, l->ev[i], timeout_ms, 0, rp,
                                   "a stream to pass hcoll's all-reduce");
        if (st == HCOLL_SUCCESS)
            cu->event_destroy(l->ev[i]);
    }
    free(l->ev);
    l->ev = NULL;
    l->n = l->cap = 0;
    pthread_mutex_destroy(&l->lock);
    return st;
}
