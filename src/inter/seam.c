/*
 * What both transports share below the ops table: the FIFO of completions
 * found and not yet reported through poll, and the sticky-failure recorder
 * (the first failure is recorded and logged, cascades only return it).
 * Transports call these; this file calls no transport, so the calls run
 * one way: selector -> transports -> seam.
 */
#include "inter/transport.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/err.h"
#include "base/log.h"

int hc_compq_push(hc_compq_t *q, const hc_comp_t *c)
{
    if (q->count == q->cap) {
        size_t ncap = q->cap ? q->cap * 2 : 256;
        hc_comp_t *n = malloc(ncap * sizeof *n);
        if (!n)
            return -1;
        for (size_t i = 0; i < q->count; i++)
            n[i] = q->buf[(q->head + i) % q->cap];
        free(q->buf);
        q->buf = n;
        q->cap = ncap;
        q->head = 0;
    }
    q->buf[(q->head + q->count) % q->cap] = *c;
    q->count++;
    return 0;
}

int hc_compq_pop(hc_compq_t *q, hc_comp_t *out, int max)
{
    int k = 0;
    while (k < max && q->count) {
        out[k++] = q->buf[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    return k;
}

void hc_compq_free(hc_compq_t *q)
{
    free(q->buf);
    memset(q, 0, sizeof *q);
}

hcoll_status_t hc_tp_failv(const hc_transport_params_t *p, hcoll_status_t *err, hcoll_status_t st,
                           const char *who, const char *fmt, va_list ap)
{
    if (*err != HCOLL_SUCCESS)
        return *err;
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    *err = st;
    hc_err_set(p->errbuf, HC_NET, p->log_rank, st, "%s: %s", who, msg);
    return st;
}

static atomic_uint_least64_t tp_counters[HC_TP_NCOUNTERS];

void hc_tp_count(enum hc_tp_counter which)
{
    atomic_fetch_add_explicit(&tp_counters[which], 1, memory_order_relaxed);
}

uint64_t hc_tp_counter(enum hc_tp_counter which)
{
    return atomic_load_explicit(&tp_counters[which], memory_order_relaxed);
}

int hc_tp_wait_fd(const hc_transport_params_t *p, int fd, short ev, int timeout_ms)
{
    struct pollfd pf[2] = { { fd, ev, 0 }, { p->cancel_fd ? *p->cancel_fd : -1, POLLIN, 0 } };
    int n = poll(pf, p->cancel_fd ? 2 : 1, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -1;
    if (p->cancel_fd && pf[1].revents)
        return -2;
    return n > 0 ? 1 : 0;
}

int hc_tp_cancelled(const hc_transport_params_t *p)
{
    if (!p->cancel_fd)
        return 0;
    struct pollfd pf = { *p->cancel_fd, POLLIN, 0 };
    return poll(&pf, 1, 0) > 0;
}

int hc_tp_random(void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = getrandom((char *)buf + done, len - done, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}
