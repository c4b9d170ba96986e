/*
 * TCP transport, connection set-up: the sockets of every endpoint, dialled
 * or accepted, with the options the data path relies on.
 *
 * The lower rank of a pair dials (bound to its rail address first, so
 * traffic leaves on that NIC), the higher accepts; a hello naming the
 * acceptor's random token (learnt only through the bootstrap exchange)
 * tells real peers from strangers knocking on the port. Everything here
 * blocks, up to the instance's timeout.
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

/* Buffer sizes must be set before listen/connect to affect window scaling. */
void hc_tcp_set_bufs(const hc_transport_t *tr, int fd)
{
    if (tr->p.socket_buf) {
        int v = (int)tr->p.socket_buf;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
    }
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

/* Blocking-with-deadline transfer of a small message during set-up. */
static int io_full(int fd, void *buf, size_t len, int writing, double deadline)
{
    size_t done = 0;
    while (done < len) {
        int left = (int)(deadline - hc_now_ms());
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd pfd = { fd, writing ? POLLOUT : POLLIN, 0 };
        int pr = poll(&pfd, 1, left);
        if (pr < 0 && errno != EINTR)
            return -errno;
        if (pr <= 0)
            continue;
        ssize_t n = writing ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, (char *)buf + done, len - done, MSG_DONTWAIT);
        if (n == 0 && !writing)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            return -errno;
        }
        done += (size_t)n;
    }
    return 0;
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

/* The communicator's set-up was cancelled (abort or destroy during a
 * non-blocking init): end at once instead of at the deadline. */
static hcoll_status_t tcp_cancelled(hc_transport_t *tr)
{
    return hc_tcp_fail(tr, HCOLL_ERR_ABORTED,
                       "connecting cancelled: the communicator was aborted or destroyed "
                       "during its set-up");
}

static hcoll_status_t dial(hc_transport_t *tr, const tcp_addr_t *to, int sock_idx,
                           double deadline, int *fd_out)
{
    struct sockaddr_in src = { .sin_family = AF_INET, .sin_addr = tr->ip, .sin_port = 0 };
    struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons((uint16_t)to->port) };
    dst.sin_addr.s_addr = to->ip;
    char dstname[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &dst.sin_addr, dstname, sizeof dstname);
    int err = 0;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "socket: %s", strerror(errno));
        hc_tcp_set_bufs(tr, fd);
        /* Bind before connect: the rail's traffic leaves from its address. */
        if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) {
            err = errno;
            close(fd);
            return hc_tcp_fail(tr, HCOLL_ERR_NETWORK, "cannot bind to %s for rank %u: %s",
                               tr->bind_addr, to->rank, strerror(err));
        }
        int rc = connect(fd, (struct sockaddr *)&dst, sizeof dst);
        if (rc != 0 && errno == EINPROGRESS) {
            int left = (int)(deadline - hc_now_ms());
            rc = left > 0 ? hc_tp_wait_fd(&tr->p, fd, POLLOUT, left) : 0;
            if (rc == -2) {
                close(fd);
                return tcp_cancelled(tr);
            }
            if (rc == 1) {
                socklen_t el = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                rc = err ? -1 : 0;
                errno = err;
            } else {
                rc = -1;
                errno = ETIMEDOUT;
            }
        }
        if (rc == 0) {
            tcp_hello_t h = { HC_TCP_HELLO_MAGIC, (uint32_t)tr->p.rank, (uint32_t)sock_idx,
                              (uint32_t)tr->p.nsocks_perpeer, to->token };
            int wr = io_full(fd, &h, sizeof h, 1, deadline);
            if (wr == 0) {
                *fd_out = fd;
                return HCOLL_SUCCESS;
            }
            errno = -wr;
        }
        err = errno;
        close(fd);
        if (hc_now_ms() >= deadline || (err != ECONNREFUSED && err != EINTR && err != EAGAIN))
            break;
        if (hc_tp_cancelled(&tr->p))
            return tcp_cancelled(tr);
        usleep(10000);
    }
    return hc_tcp_fail(tr, err == ETIMEDOUT ? HCOLL_ERR_TIMEOUT : HCOLL_ERR_NETWORK,
                       "cannot connect to rank %u at %s:%u: %s", to->rank, dstname, to->port,
                       strerror(err));
}

/* Take the expected connections from lower ranks, one hello each, until
 * every socket of theirs is in place or the deadline passes. */
static hcoll_status_t accept_peers(hc_transport_t *tr, const int *peers, int npeers,
                                   hc_ep_t **eps, int expect, double deadline)
{
    const int me = tr->p.rank, ns = tr->p.nsocks_perpeer;
    while (expect > 0) {
        int left = (int)(deadline - hc_now_ms());
        int pr = left > 0 ? hc_tp_wait_fd(&tr->p, tr->listen_fd, POLLIN, left) : 0;
        if (pr == -2)
            return tcp_cancelled(tr);
        if (pr == 0 && left > 0 && hc_now_ms() < deadline)
            continue; /* EINTR */
        if (pr <= 0)
            return hc_tcp_fail(tr, HCOLL_ERR_TIMEOUT,
                               "%d connection(s) from lower ranks did not arrive within %d ms",
                               expect, tr->p.timeout_ms);
        int fd = accept4(tr->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            continue;
        /* A stranger that connects and stays silent must not eat the whole
         * deadline of the real peers: give a hello one second. */
        tcp_hello_t h;
        double hd = hc_now_ms() + 1000;
        int rr = io_full(fd, &h, sizeof h, 0, hd < deadline ? hd : deadline);
        int slot = -1;
        if (rr == 0 && h.magic == HC_TCP_HELLO_MAGIC && h.token == tr->token &&
            h.nsocks == (uint32_t)ns && h.sock_idx < (uint32_t)ns) {
            for (int i = 0; i < npeers; i++)
                if ((uint32_t)peers[i] == h.rank && peers[i] < me &&
                    eps[i]->socks[h.sock_idx].fd < 0)
                    slot = i;
        }
        if (slot < 0) {
            HC_WARN(HC_NET, tr->p.log_rank,
                    "tcp rank %d: rejected a connection on %s:%d that is not an expected peer",
                    tr->p.log_rank, tr->bind_addr, tr->port);
            close(fd);
            continue;
        }
        eps[slot]->socks[h.sock_idx].fd = fd;
        expect--;
    }
    return HCOLL_SUCCESS;
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
    /* Dial first: the peers' listeners exist since create(), and the
     * kernel completes our handshakes from its backlog before they accept. */
    int expect = 0;
    for (int i = 0; i < npeers; i++) {
        if (me < peers[i]) {
            for (int k = 0; k < ns; k++)
                HC_CHECK(dial(tr, &all[peers[i]], k, deadline, &eps[i]->socks[k].fd), clean_eps);
        } else {
            expect += ns;
        }
    }
    HC_CHECK(accept_peers(tr, peers, npeers, eps, expect, deadline), clean_eps);
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
