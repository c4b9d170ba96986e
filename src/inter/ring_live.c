/*
 * The ring's liveness links: one small TCP connection to each neighbour,
 * bound to the rail address, that carries nothing but heartbeats.
 *
 *   rank k ──dial, keyed hello──► rank k+1      (link "next")
 *   rank k ◄────────accept─────── rank k-1      (link "prev")
 *   (set up by ring_link.c: both ends prove the communicator's key)
 *   every beat interval, on both links: one byte 'b'; a goodbye is 'q'
 *
 * Who does what: the communicator's liveness thread sends the beats and
 * reads the neighbours' (hc_ring_live_beat, hc_ring_live_poll); the thread
 * that waits in hc_ring_progress asks hc_ring_live_check, which reads only
 * atomics. A neighbour is dead when its link closes without a goodbye (the
 * process exited or was killed: found at once, on any transport) or when
 * nothing arrived on it for liveness_ms (the process is stopped or hung,
 * or the rail is down: the heartbeat travels on the rail, so the message
 * names it).
 *
 * Why a connection of its own rather than frames on the data path: verbs
 * has no cheap way to notice a silent peer short of the RC retry limit
 * (~34 s), and a heartbeat that shares the data sockets would wait behind
 * megabytes of queued payload and need a send lock between the liveness
 * thread and the ring's thread. One socket per neighbour serves TCP and
 * verbs alike, and never touches the transport's single-threaded state.
 */
#include "inter/ring_priv.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"

#define LIVE_BEAT 'b'
#define LIVE_BYE  'q'

static const char *const link_name[2] = { "next", "prev" };

hcoll_status_t hc_ring_live_listen(hc_ring_t *r, uint32_t *ip_out, uint32_t *port_out)
{
    hc_errbuf_t *eb = RING_ERRBUF(r);
    for (int i = 0; i < 2; i++) {
        r->live[i].fd = -1;
        atomic_init(&r->live[i].state, HC_RING_LIVE_OFF);
    }
    r->live_listen = -1;
    *ip_out = 0;
    *port_out = 0;
    if (r->p.liveness_ms <= 0)
        return HCOLL_SUCCESS;
    struct sockaddr_in a = { .sin_family = AF_INET };
    if (inet_pton(AF_INET, r->p.tp.bind_addr, &a.sin_addr) != 1)
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_INVALID_ARG,
                          "ring liveness: rail address '%s' is not IPv4", r->p.tp.bind_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_SYSTEM,
                          "ring liveness: cannot listen on %s: %s", r->p.tp.bind_addr,
                          strerror(e));
    }
    r->live_listen = fd;
    *ip_out = a.sin_addr.s_addr;
    *port_out = ntohs(a.sin_port);
    return HCOLL_SUCCESS;
}

void hc_ring_live_up(hc_ring_t *r, int out, int in)
{
    const int fds[2] = { out, in };
    const int64_t now = (int64_t)hc_now_ms();
    for (int i = 0; i < 2; i++) {
        int one = 1;
        setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        r->live[i].fd = fds[i];
        atomic_store(&r->live[i].last_ms, now);
        atomic_store(&r->live[i].state, HC_RING_LIVE_UP);
    }
}

void hc_ring_live_beat(hc_ring_t *r)
{
    const char b = LIVE_BEAT;
    for (int i = 0; r && i < 2; i++)
        if (atomic_load(&r->live[i].state) == HC_RING_LIVE_UP)
            (void)send(r->live[i].fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* A link ended: a goodbye before it means the neighbour left in order. */
static void live_closed(hc_ring_t *r, int i, const char *why)
{
    ring_live_t *l = &r->live[i];
    if (atomic_load(&l->state) != HC_RING_LIVE_UP)
        return;
    snprintf(l->why, sizeof l->why, "%s", why);
    atomic_store(&l->state, HC_RING_LIVE_DEAD);
}

void hc_ring_live_poll(hc_ring_t *r, int wait_ms)
{
    struct pollfd p[2];
    int idx[2], n = 0;
    for (int i = 0; r && i < 2; i++)
        if (atomic_load(&r->live[i].state) == HC_RING_LIVE_UP) {
            p[n] = (struct pollfd){ r->live[i].fd, POLLIN, 0 };
            idx[n++] = i;
        }
    if (n == 0) {
        usleep((useconds_t)wait_ms * 1000);
        return;
    }
    if (poll(p, (nfds_t)n, wait_ms) <= 0)
        return;
    for (int k = 0; k < n; k++) {
        if (!p[k].revents)
            continue;
        const int i = idx[k];
        char buf[256];
        ssize_t got = recv(r->live[i].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got > 0) {
            atomic_store(&r->live[i].last_ms, (int64_t)hc_now_ms());
            if (memchr(buf, LIVE_BYE, (size_t)got)) {
                atomic_store(&r->live[i].left_ms, (int64_t)hc_now_ms());
                atomic_store(&r->live[i].state, HC_RING_LIVE_LEFT);
            }
        } else if (got == 0) {
            live_closed(r, i, "closed its liveness link (process exited or was killed)");
        } else if (errno != EAGAIN && errno != EINTR) {
            char why[96];
            snprintf(why, sizeof why, "reset its liveness link (%s)", strerror(errno));
            live_closed(r, i, why);
        }
    }
}

int hc_ring_live_lost(hc_ring_t *r, char *why, size_t len)
{
    for (int i = 0; r && i < 2; i++)
        if (atomic_load(&r->live[i].state) == HC_RING_LIVE_DEAD) {
            snprintf(why, len, "ring rank %d (%s) %s", hc_tp_rank(&r->p.tp, i ? r->prev : r->next),
                     link_name[i], r->live[i].why);
            return 1;
        }
    return 0;
}

hcoll_status_t hc_ring_live_check(hc_ring_t *r)
{
    const double now = hc_now_ms();
    for (int i = 0; i < 2; i++) {
        ring_live_t *l = &r->live[i];
        const int st = atomic_load(&l->state);
        const int peer = i == 0 ? r->next : r->prev;
        const double quiet = now - (double)atomic_load(&l->last_ms);
        if (st == HC_RING_LIVE_DEAD)
            return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_PEER_FAILED,
                              "ring: rank %d (%s) %s; seen on rail %d (%s)",
                              hc_tp_rank(&r->p.tp, peer), link_name[i], l->why, r->p.tp.rail,
                              r->p.tp.ifname);
        if (st == HC_RING_LIVE_UP && quiet > r->p.liveness_ms)
            return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_PEER_FAILED,
                              "ring: no sign of life from rank %d (%s) for %.0f ms over rail %d "
                              "(%s, %s): the rank is stopped or hung, or the rail is down "
                              "(HCOLL_LIVENESS_MS=%d)",
                              hc_tp_rank(&r->p.tp, peer), link_name[i], quiet, r->p.tp.rail,
                              r->p.tp.ifname, r->p.tp.bind_addr,
                              r->p.liveness_ms);
    }
    return HCOLL_SUCCESS;
}

/* PEER_FAILED, recorded: the neighbour on link i said goodbye `since` ms ago
 * while an operation still needs it. */
static hcoll_status_t left_failed(hc_ring_t *r, int i, double since)
{
    return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_PEER_FAILED,
                      "ring: rank %d (%s) destroyed its communicator %.0f ms ago while "
                      "this operation still needs it: the ranks did not make the same "
                      "calls (did that rank stop early after an error of its own?); "
                      "seen on rail %d (%s)",
                      hc_tp_rank(&r->p.tp, i == 0 ? r->next : r->prev), link_name[i], since,
                      r->p.tp.rail, r->p.tp.ifname);
}

hcoll_status_t hc_ring_live_left_check(hc_ring_t *r, int need_next, int need_prev)
{
    const double now = hc_now_ms();
    for (int i = 0; i < 2; i++) {
        ring_live_t *l = &r->live[i];
        if (!(i == 0 ? need_next : need_prev) || atomic_load(&l->state) != HC_RING_LIVE_LEFT)
            continue;
        /* Data sent before the goodbye may still be on its way on the
         * data path: wait until the goodbye is old and nothing moved. */
        double since = now - (double)atomic_load(&l->left_ms);
        if (since < HC_RING_LEFT_GRACE_MS || now - r->last_activity < HC_RING_LEFT_GRACE_MS)
            continue;
        return left_failed(r, i, since);
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_ring_live_status(hc_ring_t *r)
{
    return r ? hc_ring_live_check(r) : HCOLL_SUCCESS;
}

hcoll_status_t hc_ring_live_left_status(hc_ring_t *r)
{
    const double now = hc_now_ms();
    for (int i = 0; r && i < 2; i++) {
        const double since = now - (double)atomic_load(&r->live[i].left_ms);
        if (atomic_load(&r->live[i].state) == HC_RING_LIVE_LEFT && since >= HC_RING_LEFT_GRACE_MS)
            return left_failed(r, i, since);
    }
    return HCOLL_SUCCESS;
}

void hc_ring_live_close(hc_ring_t *r, int graceful)
{
    const char b = LIVE_BYE;
    if (r->live_listen >= 0)
        close(r->live_listen);
    r->live_listen = -1;
    for (int i = 0; i < 2; i++) {
        ring_live_t *l = &r->live[i];
        if (l->fd < 0)
            continue;
        if (graceful)
            (void)send(l->fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        close(l->fd);
        l->fd = -1;
        atomic_store(&l->state, HC_RING_LIVE_OFF);
    }
}
