/*
 * CUDA events as the device executor uses them: waiting for one with a
 * deadline and an abort check, timing stages between two, and a list of
 * events that tell when callers' streams are past hcoll's work.
 *
 * Failures are recorded once, here, with hc_err_set into the errbuf given.
 */
#ifndef HC_GDR_EVENT_H
#define HC_GDR_EVENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "base/err.h"
#include "gdr/gdr.h"

/* Where a device-path failure is recorded: the errbuf and the rank for the
 * message, and the communicator's abort flag (NULL: never checked). */
typedef struct hc_gdr_report {
    hc_errbuf_t *err;
    int rank;
    atomic_int *aborted;
} hc_gdr_report_t;

/* Record a failed driver call: "what: CUDA_ERROR_...". Returns
 * HCOLL_ERR_CUDA. */
hcoll_status_t hc_gdr_cu_fail(const hc_gdr_report_t *rp, hc_cu_res_t r, const char *what);

/*
 * Poll ev until it completes: the only way to wait for GPU work with a
 * deadline and an abort check. A short spin keeps small calls fast; then
 * sleeps that grow to 200 us. check_abort: fail with HCOLL_ERR_ABORTED
 * once *rp->aborted is set. HCOLL_ERR_TIMEOUT after timeout_ms.
 */
hcoll_status_t hc_gdr_event_wait(const hc_cu_api_t *cu, void *ev, int timeout_ms,
                                 int check_abort, const hc_gdr_report_t *rp, const char *what);

/*
 * hc_gdr_event_wait for an event that other ranks hold up (a collective on
 * the caller's stream waits for late peers): no deadline while they are
 * alive, up to op_timeout_ms (< 0: none), with the abort check, and
 * watch(arg) every few milliseconds, whose failure (recorded by it) ends
 * the wait. HCOLL_ERR_TIMEOUT names HCOLL_OP_TIMEOUT_MS.
 */
typedef hcoll_status_t (*hc_gdr_watch_fn)(void *arg);
hcoll_status_t hc_gdr_event_wait_watched(const hc_cu_api_t *cu, void *ev, int op_timeout_ms,
                                         const hc_gdr_report_t *rp, const char *what,
                                         hc_gdr_watch_fn watch, void *arg);

/* ---- Timing ----------------------------------------------------------------
 * Best effort: an event that cannot be made leaves its stage untimed and
 * never fails the call. */

/* A timing event recorded on stream now, or NULL. */
void *hc_gdr_tev_mark(const hc_cu_api_t *cu, void *stream);

/* Microseconds from timing event a to b (both complete), or -1 when either
 * is NULL or the driver cannot tell. */
double hc_gdr_tev_us(const hc_cu_api_t *cu, void *a, void *b);

/* ---- Events streams must pass ----------------------------------------------
 * One per device call, recorded after its last work on the caller's
 * stream; completed ones are reaped as new ones come, so the list is as
 * long as the streams' backlog. Thread-safe. */
typedef struct hc_gdr_evlist {
    pthread_mutex_t lock;
    void **ev;
    size_t n, cap;
} hc_gdr_evlist_t;

void hc_gdr_evlist_init(hc_gdr_evlist_t *l);

/* Keep ev (takes it over). Without memory for it, wait for it now (up to
 * timeout_ms) and destroy it. */
void hc_gdr_evlist_add(hc_gdr_evlist_t *l, const hc_cu_api_t *cu, void *ev, int timeout_ms,
                       const hc_gdr_report_t *rp);

/* Wait (up to timeout_ms each) until every stream is past its event, then
 * free the list. HCOLL_ERR_TIMEOUT (or the driver's error) when one is
 * not: that event and those after it are left to the driver. */
hcoll_status_t hc_gdr_evlist_drain(hc_gdr_evlist_t *l, const hc_cu_api_t *cu, int timeout_ms,
                                   const hc_gdr_report_t *rp);

#endif
