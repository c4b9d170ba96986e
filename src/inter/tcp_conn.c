/*
 * TCP transport, connection set-up: the sockets of every endpoint, dialled
 * or accepted, with the options the data path relies on.
 *
 * The lower rank of a pair dials (bound to its rail address first, so
 * traffic leaves on that NIC), the higher accepts; the hello that proves
 * both ends hold the communicator's key, and the loop that runs every
 * dial and accept at once, are in tcp_hello.c. Everything here blocks, up
 * to the instance's timeout.
 */
#include "inter/tcp_priv.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"

static int set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

/* A silent link must surface within the deadline: TCP_USER_TIMEOUT bounds
 * unacknowledged data, keepalive probes an idle connection. */
static void set_data_opts(const hc_transport_t *tr, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int idle = tr->p.timeout_ms / 2000;
    if (idle < 1)
        idle = 1;
    int intvl = idle / 3 > 0 ? idle / 3 : 1, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    unsigned ut = (unsigned)tr->p.timeout_ms;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
}

static hc_ep_t *ep_new(hc_transport_t *tr, int peer)
{
    hc_ep_t *ep = calloc(1, sizeof *ep);
    if (!ep)
        return NULL;
    ep->tr = tr;
    ep->peer = peer;
    ep->nsocks = tr->p.nsocks_perpeer;
    ep->socks = calloc((size_t)ep->nsocks, sizeof *ep->socks);
    if (!ep->socks) {
        free(ep);
        return NULL;
    }
    for (int i = 0; i < ep->nsocks; i++) {
        ep->socks[i].fd = -1;
        ep->socks[i].ep = ep;
    }
    return ep;
}

void hc_tcp_ep_free(hc_ep_t *ep)
{
    for (int i = 0; i < ep->nsocks; i++) {
        if (ep->socks[i].fd >= 0)
            close(ep->socks[i].fd);
        free(ep->socks[i].txq);
    }
    free(ep->socks);
    free(ep);
}

/* Every socket of eps non-blocking, with the data options, in the epoll
 * set. */
static hcoll_status_t watch_sockets(hc_transport_t *tr, hc_ep_t **eps, int npeers)
{
    for (int i = 0; i < npeers; i++) {
        for (int k = 0; k < eps[i]->nsocks; k++) {
            tcp_sock_t *s = &eps[i]->socks[k];
            set_nonblock(s->fd, 1);
            set_data_opts(tr, s->fd);
            struct epoll_event ev = { .events = EPOLLIN, .data.ptr = s };
            if (epoll_ctl(tr->epfd, EPOLL_CTL_ADD, s->fd, &ev) != 0)
                return hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "epoll_ctl: %s", strerror(errno));
            s->in_epoll = 1;
        }
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_tcp_connect(hc_transport_t *tr, const int *peers, int npeers,
                              hc_allgather_fn allgather, void *ag_ctx, hc_ep_t **eps_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const int n = tr->p.nranks, me = tr->p.rank, ns = tr->p.nsocks_perpeer;
    const double deadline = hc_now_ms() + tr->p.timeout_ms;
    tcp_addr_t mine = { HC_TCP_ADDR_MAGIC, tr->ip.s_addr, (uint32_t)tr->port, (uint32_t)me,
                        tr->token };
    tcp_addr_t *all = calloc((size_t)n, sizeof *all);
    hc_ep_t **eps = calloc((size_t)(npeers > 0 ? npeers : 1), sizeof *eps);
    if (!all || !eps) {
        st = hc_tcp_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto clean_arrays;
    }
    HC_CHECK(allgather(ag_ctx, &mine, all, sizeof mine), clean_arrays);
    for (int i = 0; i < npeers; i++) {
        int p = peers[i];
        if (p < 0 || p >= n || p == me || all[p].magic != HC_TCP_ADDR_MAGIC ||
            all[p].rank != (uint32_t)p) {
            st = hc_tcp_fail(tr, HCOLL_ERR_INVALID_ARG,
                             "peer %d: no valid address from the exchange", p);
            goto clean_eps;
        }
        eps[i] = ep_new(tr, p);
        if (!eps[i]) {
            st = hc_tcp_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
            goto clean_eps;
        }
    }
    /* The peers' listeners exist since create(), so dialling can start at
     * once; accepting goes on in the same loop. */
    HC_CHECK(hc_tcp_handshake(tr, all, peers, npeers, eps, deadline), clean_eps);
    HC_CHECK(watch_sockets(tr, eps, npeers), clean_eps);
    hc_ep_t **grown = realloc(tr->eps, (size_t)(tr->neps + npeers) * sizeof *grown);
    if (!grown) {
        st = hc_tcp_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto clean_eps;
    }
    tr->eps = grown;
    for (int i = 0; i < npeers; i++) {
        tr->eps[tr->neps++] = eps[i];
        eps_out[i] = eps[i];
        HC_TRACE(HC_NET, tr->p.log_rank, "tcp rank %d: connected to rank %d (%d socket(s))",
                 tr->p.log_rank, hc_tp_rank(&tr->p, peers[i]), ns);
    }
    free(eps);
    free(all);
    return HCOLL_SUCCESS;

clean_eps:
    for (int i = 0; i < npeers; i++)
        if (eps[i]) {
            for (int k = 0; k < eps[i]->nsocks; k++)
                hc_tcp_sock_unwatch(tr, &eps[i]->socks[k]);
            hc_tcp_ep_free(eps[i]);
        }
clean_arrays:
    free(eps);
    free(all);
    return st;
}
