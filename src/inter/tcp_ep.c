/*
 * TCP transport, the data path: puts queued per socket and written by
 * poll(), frames parsed as they arrive, completions reported.
 *
 *   sender                                   receiver (rail address)
 *   put(lmr+loff, rkey+roff, len, imm)
 *     │ sendmsg([hdr | lmr+loff..len])  ───►  recv(hdr) → validate against
 *     │   (straight from the source,          region(rkey): off+len ≤ size
 *     │    no copy)                           recv(region+roff, len)   ← direct
 *     ▼                                         ▼
 *   HC_COMP_PUT when the kernel took         HC_COMP_IMM(imm) when the last
 *   the last byte                            payload byte is in place
 *
 * Puts are queued and written by the next poll(), several frames per
 * sendmsg (see hc_tcp_put).
 *
 * Progress engine: no thread. poll() drives every socket of the instance
 * through one epoll set, from the thread that asks for completions. The
 * kernel's socket buffers keep the link busy while that thread reduces a
 * chunk, and on small machines a second thread per rank would only compete with the
 * reduction for the same cores and add a hand-off per message.
 *
 * Receive copies: headers are read into a small per-socket buffer, so a few
 * payload bytes that arrive in the same read (at most HC_TCP_RXBUF) are
 * copied from there; the rest of a payload is recv()'d straight into the
 * registered region, in reads of up to HCOLL_TCP_RCVLOWAT bytes that the
 * socket's low-water mark gathers (sock_set_lowat).
 */
#include "inter/tcp_priv.h"
#include "base/clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static int cq_push(hc_transport_t *tr, const hc_comp_t *c)
{
    return hc_compq_push(&tr->cq, c);
}

/* ------------------------------------------------------------------------ */
/* Sending                                                                    */
/* ------------------------------------------------------------------------ */

static hcoll_status_t sock_failed_io(tcp_sock_t *s, int err, const char *what)
{
    hc_ep_t *ep = s->ep;
    hc_transport_t *tr = ep->tr;
    hc_tcp_sock_unwatch(tr, s);
    if (err == ETIMEDOUT)
        return hc_tcp_fail(tr, HCOLL_ERR_TIMEOUT,
                           "link to rank %d went silent for %d ms (%s: %s)",
                           hc_tp_rank(&tr->p, ep->peer), tr->p.timeout_ms, what, strerror(err));
    return hc_tcp_fail(tr, HCOLL_ERR_PEER_FAILED, "connection to rank %d failed (%s: %s)%s",
                       hc_tp_rank(&tr->p, ep->peer), what, strerror(err),
                       ep->bye ? " after it closed" : "");
}

static void sock_want_out(hc_transport_t *tr, tcp_sock_t *s, int on)
{
    if (s->want_out == on || !s->in_epoll)
        return;
    struct epoll_event ev = { .events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = s };
    epoll_ctl(tr->epfd, EPOLL_CTL_MOD, s->fd, &ev);
    s->want_out = on;
}

/* Write as much of the queue as the socket takes, several frames per
 * sendmsg, header and payload straight from where they are. */
static hcoll_status_t sock_flush(tcp_sock_t *s)
{
    hc_transport_t *tr = s->ep->tr;
    while (s->txcount > 0) {
        struct iovec iov[HC_TCP_IOV_MAX];
        int niov = 0;
        for (size_t i = 0; i < s->txcount && niov + 2 <= HC_TCP_IOV_MAX; i++) {
            tx_entry_t *e = &s->txq[(s->txhead + i) % s->txcap];
            if (e->done < HC_TCP_HDR) {
                iov[niov].iov_base = (char *)&e->hdr + e->done;
                iov[niov].iov_len = HC_TCP_HDR - e->done;
                niov++;
                if (e->len) {
                    iov[niov].iov_base = (void *)e->src;
                    iov[niov].iov_len = e->len;
                    niov++;
                }
            } else {
                iov[niov].iov_base = (void *)(e->src + (e->done - HC_TCP_HDR));
                iov[niov].iov_len = e->len - (e->done - HC_TCP_HDR);
                niov++;
            }
        }
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)niov };
        ssize_t n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                sock_want_out(tr, s, 1);
                return HCOLL_SUCCESS;
            }
            return sock_failed_io(s, errno, "send");
        }
        size_t left = (size_t)n;
        while (left > 0 && s->txcount) {
            tx_entry_t *e = &s->txq[s->txhead];
            size_t need = HC_TCP_HDR + e->len - e->done;
            size_t take = left < need ? left : need;
            e->done += take;
            left -= take;
            if (e->done < HC_TCP_HDR + e->len)
                break;
            if (e->signal) {
                hc_comp_t c = { HC_COMP_PUT, s->ep->peer, e->hdr.imm, e->wr_id };
                if (cq_push(tr, &c) != 0)
                    return hc_tcp_fail(tr, HCOLL_ERR_NO_MEMORY,
                                       "out of memory for completions");
            }
            s->txhead = (s->txhead + 1) % s->txcap;
            s->txcount--;
        }
    }
    sock_want_out(tr, s, 0);
    return HCOLL_SUCCESS;
}

static hcoll_status_t sock_enqueue(tcp_sock_t *s, const tx_entry_t *e)
{
    hc_transport_t *tr = s->ep->tr;
    if (s->txcount == s->txcap) {
        size_t ncap = s->txcap ? s->txcap * 2 : 64;
        tx_entry_t *n = malloc(ncap * sizeof *n);
        if (!n)
            return hc_tcp_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory queueing a put");
        for (size_t i = 0; i < s->txcount; i++)
            n[i] = s->txq[(s->txhead + i) % s->txcap];
        free(s->txq);
        s->txq = n;
        s->txcap = ncap;
        s->txhead = 0;
    }
    s->txq[(s->txhead + s->txcount) % s->txcap] = *e;
    s->txcount++;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_tcp_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                          uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id)
{
    hc_transport_t *tr = ep->tr;
    if (tr->err)
        return tr->err;
    if (len && (!lmr || loff > lmr->len || len > lmr->len - loff))
        return hc_tcp_fail(tr, HCOLL_ERR_INTERNAL,
                           "put to rank %d: local range %zu+%zu outside its region (%zu bytes)",
                           hc_tp_rank(&tr->p, ep->peer), loff, len, lmr ? lmr->len : 0);
    tx_entry_t e = { { HC_TCP_MAGIC_PUT, imm, rkey ? rkey->w[0] : 0, roff, len },
                     len ? lmr->base + loff : NULL, len, 0, wr_id, 1 };
    switch (ep->corrupt) {
    case HC_TCP_CORRUPT_MAGIC: e.hdr.magic = 0xdeadbeefu; break;
    case HC_TCP_CORRUPT_KEY: e.hdr.key = UINT64_MAX - 7; break;
    case HC_TCP_CORRUPT_OFFSET: e.hdr.off = (rkey ? rkey->w[1] : 0) + 4096; break;
    case HC_TCP_CORRUPT_LENGTH: e.hdr.len = (rkey ? rkey->w[1] : 0) - roff + 1; break;
    default: break;
    }
    ep->corrupt = HC_TCP_CORRUPT_NONE;
    tcp_sock_t *s = &ep->socks[ep->rr++ % (unsigned)ep->nsocks];
    if (s->fd < 0 || !s->in_epoll)
        return hc_tcp_fail(tr, HCOLL_ERR_PEER_FAILED, "put to rank %d: connection is closed%s",
                           hc_tp_rank(&tr->p, ep->peer),
                           ep->bye ? " (that rank destroyed its communicator: it said goodbye "
                                     "while this rank still had data for it)"
                                   : "");
    hcoll_status_t st = sock_enqueue(s, &e);
    if (st != HCOLL_SUCCESS)
        return st;
    /* Not sent here: the next poll writes every queued put in one sendmsg.
     * A user issues its puts in bursts (the ring: a credit and the next
     * chunk, a descriptor and the first chunk) and polls right after, so
     * a burst leaves as one segment and wakes the peer once, not once per
     * put; on a busy host each wake-up costs tens of microseconds. */
    return HCOLL_SUCCESS;
}

void hc_tcp_ep_corrupt_next(hc_ep_t *ep, int mode)
{
    ep->corrupt = mode;
}

/* ------------------------------------------------------------------------ */
/* Receiving                                                                  */
/* ------------------------------------------------------------------------ */

static hcoll_status_t deliver_imm(tcp_sock_t *s, uint32_t imm)
{
    hc_comp_t c = { HC_COMP_IMM, s->ep->peer, imm, 0 };
    if (cq_push(s->ep->tr, &c) != 0)
        return hc_tcp_fail(s->ep->tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
    return HCOLL_SUCCESS;
}

/* Parse whole headers out of rxbuf; a payload that is not all there yet
 * switches the socket to direct reads into the region. */
static hcoll_status_t parse_frames(tcp_sock_t *s)
{
    hc_ep_t *ep = s->ep;
    hc_transport_t *tr = ep->tr;
    while (!s->rx_payload && s->rxfill - s->rxpos >= HC_TCP_HDR) {
        hc_tcp_hdr_t h;
        memcpy(&h, s->rxbuf + s->rxpos, sizeof h);
        if (h.magic == HC_TCP_MAGIC_BYE) {
            ep->bye = 1;
            s->rxpos += HC_TCP_HDR;
            continue;
        }
        if (h.magic != HC_TCP_MAGIC_PUT) {
            hc_tcp_sock_unwatch(tr, s);
            return hc_tcp_fail(tr, HCOLL_ERR_NETWORK,
                               "bad frame from rank %d: magic 0x%08x is not a put",
                               hc_tp_rank(&tr->p, ep->peer), h.magic);
        }
        char *dst = NULL;
        if (h.key != 0 || h.len != 0) {
            hc_mr_t *mr = hc_tcp_mr_find(tr, h.key);
            if (!mr) {
                hc_tcp_sock_unwatch(tr, s);
                return hc_tcp_fail(tr, HCOLL_ERR_NETWORK,
                                   "bad frame from rank %d: key %llu names no registered "
                                   "region",
                                   hc_tp_rank(&tr->p, ep->peer), (unsigned long long)h.key);
            }
            if (h.off > mr->len || h.len > mr->len - h.off) {
                hc_tcp_sock_unwatch(tr, s);
                return hc_tcp_fail(tr, HCOLL_ERR_NETWORK,
                                   "bad frame from rank %d: %llu bytes at offset %llu "
                                   "overflow the %zu-byte region %llu",
                                   hc_tp_rank(&tr->p, ep->peer), (unsigned long long)h.len,
                                   (unsigned long long)h.off, mr->len, (unsigned long long)h.key);
            }
            dst = mr->base + h.off;
        }
        s->rxpos += HC_TCP_HDR;
        size_t avail = s->rxfill - s->rxpos;
        size_t take = h.len < avail ? (size_t)h.len : avail;
        if (take)
            memcpy(dst, s->rxbuf + s->rxpos, take);
        s->rxpos += take;
        if (take == h.len) {
            hcoll_status_t st = deliver_imm(s, h.imm);
            if (st != HCOLL_SUCCESS)
                return st;
        } else {
            s->rx_payload = 1;
            s->rx_dst = dst + take;
            s->rx_left = (size_t)h.len - take;
            s->rx_imm = h.imm;
        }
    }
    return HCOLL_SUCCESS;
}

static hcoll_status_t sock_read_some(tcp_sock_t *s)
{
    hc_ep_t *ep = s->ep;
    hc_transport_t *tr = ep->tr;
    /* Bounded so that one busy socket cannot starve the others. */
    for (int iter = 0; iter < 64 && s->in_epoll; iter++) {
        ssize_t n;
        size_t asked;
        tr->nrecv++;
        if (s->rx_payload) {
            asked = s->rx_left;
            n = recv(s->fd, s->rx_dst, asked, MSG_DONTWAIT);
        } else {
            if (s->rxpos) {
                memmove(s->rxbuf, s->rxbuf + s->rxpos, s->rxfill - s->rxpos);
                s->rxfill -= s->rxpos;
                s->rxpos = 0;
            }
            asked = HC_TCP_RXBUF - s->rxfill;
            n = recv(s->fd, s->rxbuf + s->rxfill, asked, MSG_DONTWAIT);
        }
        if (n == 0) {
            hc_tcp_sock_unwatch(tr, s);
            if (ep->bye && !s->rx_payload && s->rxfill == s->rxpos)
                return HCOLL_SUCCESS;
            return hc_tcp_fail(tr, HCOLL_ERR_PEER_FAILED,
                               "rank %d closed the connection without saying goodbye (process "
                               "exited or was killed)",
                               hc_tp_rank(&tr->p, ep->peer));
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return HCOLL_SUCCESS;
            if (ep->bye) {
                hc_tcp_sock_unwatch(tr, s);
                return HCOLL_SUCCESS;
            }
            return sock_failed_io(s, errno, "recv");
        }
        if (s->rx_payload) {
            s->rx_dst += n;
            s->rx_left -= (size_t)n;
            if (s->rx_left == 0) {
                s->rx_payload = 0;
                hcoll_status_t st = deliver_imm(s, s->rx_imm);
                if (st != HCOLL_SUCCESS)
                    return st;
            }
        } else {
            s->rxfill += (size_t)n;
            hcoll_status_t st = parse_frames(s);
            if (st != HCOLL_SUCCESS)
                return st;
        }
        /* A short read emptied the receive queue: the next recv would only
         * say EAGAIN (a third of the reads, bench/PROFILE.md); the epoll
         * set is level-triggered, so bytes that come meanwhile wake us. */
        if ((size_t)n < asked)
            return HCOLL_SUCCESS;
    }
    return HCOLL_SUCCESS;
}

/* While a payload comes in, SO_RCVLOWAT = what is left of it (at most
 * HCOLL_TCP_RCVLOWAT): epoll then wakes this thread once per that many
 * bytes instead of once per segment or two, and one recv takes them all.
 * Never above what is left, so the payload's last byte always wakes us
 * (FIN and errors wake us regardless), and back to 1 for headers. Capped
 * at a quarter of the receive buffer: above about half of it, the kernel
 * grows the buffer and clamps the advertised window to the low-water mark
 * (tcp_set_rcvlowat), which would cap the flow. A failed setsockopt only
 * leaves the wake-ups as they were. */
static void sock_set_lowat(tcp_sock_t *s)
{
    size_t cap = s->ep->tr->rcvlowat;
    size_t want = s->rx_payload && s->rx_left < cap ? s->rx_left : cap;
    if (!s->rx_payload || want < HC_TCP_LOWAT_MIN)
        want = 1; /* a few segments: not worth the system call */
    if (want > 1 && want > (size_t)s->rcvbuf / 4) { /* autotuning may have grown it */
        socklen_t len = sizeof s->rcvbuf;
        if (getsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &s->rcvbuf, &len) != 0)
            s->rcvbuf = 0;
        if (want > (size_t)s->rcvbuf / 4)
            want = (size_t)s->rcvbuf / 4 > 1 ? (size_t)s->rcvbuf / 4 : 1;
    }
    if ((int)want == s->lowat || (want == 1 && s->lowat == 0))
        return;
    int v = (int)want;
    if (setsockopt(s->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0) {
        s->ep->tr->lowat_raised += v > 1 && s->lowat <= 1;
        s->lowat = v;
    }
}

uint64_t hc_tcp_lowat_raised(const hc_transport_t *tr)
{
    return tr->lowat_raised;
}

void hc_tcp_io_calls(const hc_transport_t *tr, uint64_t *nrecv_out, uint64_t *nwait_out)
{
    *nrecv_out = tr->nrecv;
    *nwait_out = tr->nwait;
}

static hcoll_status_t sock_read(tcp_sock_t *s)
{
    hcoll_status_t st = sock_read_some(s);
    if (st == HCOLL_SUCCESS && s->in_epoll && s->ep->tr->rcvlowat > 1)
        sock_set_lowat(s);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Progress                                                                   */
/* ------------------------------------------------------------------------ */

static hcoll_status_t progress(hc_transport_t *tr, int wait_ms)
{
    hcoll_status_t st;
    for (int i = 0; i < tr->neps; i++) {
        hc_ep_t *ep = tr->eps[i];
        for (int k = 0; k < ep->nsocks; k++) {
            tcp_sock_t *s = &ep->socks[k];
            if (s->txcount && !s->want_out && s->in_epoll && (st = sock_flush(s)) != HCOLL_SUCCESS)
                return st;
        }
    }
    /* A caller that would wait gets what the sends completed at once, and
     * looks at the sockets in its next call: a look that could not wait
     * would cost one more system call (about 1 µs on a paravirtualised
     * host, a 4 KiB all-reduce sends once and reads once). A caller that
     * never waits (the ring's busy loop) reads every time. */
    if (tr->cq.count && wait_ms > 0)
        return HCOLL_SUCCESS;
    struct epoll_event evs[32];
    tr->nwait++;
    int n = epoll_wait(tr->epfd, evs, 32, wait_ms);
    if (n < 0) {
        if (errno == EINTR)
            return HCOLL_SUCCESS;
        return hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "epoll_wait: %s", strerror(errno));
    }
    for (int i = 0; i < n; i++) {
        tcp_sock_t *s = evs[i].data.ptr;
        if (!s->in_epoll)
            continue;
        if ((evs[i].events & EPOLLOUT) && (st = sock_flush(s)) != HCOLL_SUCCESS)
            return st;
        if ((evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) &&
            (st = sock_read(s)) != HCOLL_SUCCESS)
            return st;
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_tcp_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                           int *n_out)
{
    *n_out = 0;
    if (tr->err)
        return tr->err;
    /* One epoll_wait: it returns as soon as a socket is ready, so a look
     * without waiting first would only add a system call. What was read
     * may complete nothing (a payload's first part): the caller polls
     * again, as "up to wait_ms" allows. */
    hcoll_status_t st = progress(tr, wait_ms);
    if (st != HCOLL_SUCCESS)
        return st;
    *n_out = hc_compq_pop(&tr->cq, comps, max);
    return HCOLL_SUCCESS;
}

void hc_tcp_say_goodbye(hc_transport_t *tr)
{
    /* Say goodbye on every socket and give the kernel a bounded moment to
     * take it; an orderly peer then reads EOF as the end, not as a
     * failure. */
    for (int i = 0; i < tr->neps; i++)
        for (int k = 0; k < tr->eps[i]->nsocks; k++) {
            tcp_sock_t *s = &tr->eps[i]->socks[k];
            tx_entry_t e = { { HC_TCP_MAGIC_BYE, 0, 0, 0, 0 }, NULL, 0, 0, 0, 0 };
            if (s->in_epoll)
                sock_enqueue(s, &e);
        }
    double deadline = hc_now_ms() + (tr->p.timeout_ms < 1000 ? tr->p.timeout_ms : 1000);
    for (;;) {
        int pending = 0;
        for (int i = 0; i < tr->neps; i++)
            for (int k = 0; k < tr->eps[i]->nsocks; k++) {
                tcp_sock_t *s = &tr->eps[i]->socks[k];
                if (s->in_epoll && s->txcount && sock_flush(s) == HCOLL_SUCCESS && s->txcount)
                    pending = 1;
            }
        if (!pending || tr->err || hc_now_ms() > deadline)
            break;
        usleep(1000);
    }
}
