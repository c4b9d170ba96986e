/*
 * Error plumbing. Errors travel as hcoll_status_t through HC_CHECK, which
 * jumps to a cleanup label; only the function that first sees an error
 * records its message (hc_err_set), so each failure is described once.
 *
 * Messages land in an hc_errbuf_t: each communicator owns one, and calls
 * that have no communicator yet use the calling thread's own.
 */
#ifndef HC_ERR_H
#define HC_ERR_H

#include <pthread.h>
#include <stdarg.h>

#include "hcoll.h"

#define HC_ERRMSG_MAX 512

typedef struct hc_errbuf {
    pthread_mutex_t lock;
    char msg[HC_ERRMSG_MAX];
} hc_errbuf_t;

void hc_errbuf_init(hc_errbuf_t *eb);
void hc_errbuf_fini(hc_errbuf_t *eb);

/* The calling thread's buffer, for calls without a communicator. */
hc_errbuf_t *hc_errbuf_thread(void);

/*
 * Record a message in eb (NULL: the thread's buffer), log it at WARN with
 * the given subsystem and rank, and return st so callers can write
 *   return hc_err_set(eb, HC_NET, rank, HCOLL_ERR_NETWORK, "...", ...);
 */
hcoll_status_t hc_err_set(hc_errbuf_t *eb, unsigned subsys, int rank, hcoll_status_t st,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* As hc_err_set, but logged at INFO: for repeats of an error already
 * reported at WARN (every call after a sticky failure), so that a job
 * with many queued requests does not print one warning per request. */
hcoll_status_t hc_err_repeat(hc_errbuf_t *eb, unsigned subsys, int rank, hcoll_status_t st,
                             const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The current message, copied under eb's lock into a buffer of the calling
 * thread's, valid until that thread's next hc_errbuf_get. */
const char *hc_errbuf_get(hc_errbuf_t *eb);

#define HC_CHECK(expr, label)                                                 \
    do {                                                                      \
        st = (expr);                                                          \
        if (st != HCOLL_SUCCESS)                                              \
            goto label;                                                       \
    } while (0)

#define HC_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
