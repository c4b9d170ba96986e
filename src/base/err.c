#include "base/err.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"

void hc_errbuf_init(hc_errbuf_t *eb)
{
    pthread_mutex_init(&eb->lock, NULL);
    eb->msg[0] = '\0';
}

void hc_errbuf_fini(hc_errbuf_t *eb)
{
    pthread_mutex_destroy(&eb->lock);
}

/* Thread-local rather than global: two threads initialising two
 * communicators never see each other's messages. */
static __thread hc_errbuf_t tls_errbuf = { PTHREAD_MUTEX_INITIALIZER, "" };

hc_errbuf_t *hc_errbuf_thread(void)
{
    return &tls_errbuf;
}

static hcoll_status_t err_record(hc_errbuf_t *eb, hc_log_level_t level, unsigned subsys,
                                 int rank, hcoll_status_t st, const char *fmt, va_list ap)
{
    /* Leave room for the status name in front. */
    char msg[HC_ERRMSG_MAX - 64];
    vsnprintf(msg, sizeof msg, fmt, ap);

    if (!eb)
        eb = &tls_errbuf;
    pthread_mutex_lock(&eb->lock);
    snprintf(eb->msg, sizeof eb->msg, "%s: %s", hcoll_status_name(st), msg);
    pthread_mutex_unlock(&eb->lock);
    hc_log(level, subsys, rank, "%s: %s", hcoll_status_name(st), msg);
    return st;
}

hcoll_status_t hc_err_set(hc_errbuf_t *eb, unsigned subsys, int rank, hcoll_status_t st,
                          const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_record(eb, HC_LOG_WARN, subsys, rank, st, fmt, ap);
    va_end(ap);
    return st;
}

hcoll_status_t hc_err_repeat(hc_errbuf_t *eb, unsigned subsys, int rank, hcoll_status_t st,
                             const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_record(eb, HC_LOG_INFO, subsys, rank, st, fmt, ap);
    va_end(ap);
    return st;
}

const char *hc_errbuf_get(hc_errbuf_t *eb)
{
    /* A copy taken under the lock, one per thread: eb->msg itself may be
     * rewritten by a failing call on another thread while the caller reads
     * (hcoll_comm_last_error is callable from any thread at any time), and
     * a torn message would be worse than an old one. */
    static __thread char copy[HC_ERRMSG_MAX];
    pthread_mutex_lock(&eb->lock);
    memcpy(copy, eb->msg, sizeof copy);
    pthread_mutex_unlock(&eb->lock);
    copy[sizeof copy - 1] = '\0';
    return copy;
}
