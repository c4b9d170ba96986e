/*
 * TCP transport: emulates RDMA write-with-immediate over plain sockets.
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
 * sendmsg (see tcp_put).
 *
 * Progress engine: no thread. poll() drives every socket of the instance
 * through one epoll set, from the thread that asks for completions (the
 * ring's caller today, the communicator's progress thread later). The
 * kernel's socket buffers keep the link busy while that thread reduces a
 * chunk, and on small machines a second thread per rank would only compete
 * with the reduction for the same cores and add a hand-off per message.
 *
 * Connections: the lower rank of a pair dials (bound to its rail address
 * first, so traffic leaves on that NIC), the higher accepts; a hello naming
 * the acceptor's random token (learnt only through the bootstrap exchange)
 * tells real peers from strangers knocking on the port.
 *
 * Receive copies: headers are read into a small per-socket buffer, so a few
 * payload bytes that arrive in the same read (at most HC_TCP_RXBUF) are
 * copied from there; the rest of a payload is recv()'d straight into the
 * registered region.
 */
#include "inter/tcp.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"

#define HC_TCP_ADDR_MAGIC  0x48434144u /* "HCAD" */
#define HC_TCP_HELLO_MAGIC 0x4843484cu /* "HCHL" */
#define HC_TCP_RXBUF       4096
#define HC_TCP_IOV_MAX     64
#define HC_TCP_HDR         ((size_t)sizeof(hc_tcp_hdr_t))

/* Published through the allgather. */
typedef struct tcp_addr {
    uint32_t magic;
    uint32_t ip;     /* network order */
    uint32_t port;   /* host order */
    uint32_t rank;
    uint64_t token;  /* random per instance: proves a dialer saw this blob */
} tcp_addr_t;

/* First bytes a dialer sends. */
typedef struct tcp_hello {
    uint32_t magic;
    uint32_t rank;
    uint32_t sock_idx;
    uint32_t nsocks;
    uint64_t token; /* the acceptor's token */
} tcp_hello_t;

struct hc_mr {
    uint64_t id;
    char *base;
    size_t len;
    struct hc_mr *next;
};

typedef struct tx_entry {
    hc_tcp_hdr_t hdr;
    const char *src;
    size_t len;  /* payload bytes actually sent (hdr.len may be corrupted) */
    size_t done; /* bytes of header + payload written so far */
    uint64_t wr_id;
    int signal;  /* report HC_COMP_PUT */
} tx_entry_t;

typedef struct tcp_sock {
    int fd;
    hc_ep_t *ep;
    int in_epoll;
    int want_out;                  /* EPOLLOUT armed */
    tx_entry_t *txq;               /* circular */
    size_t txcap, txhead, txcount;
    /* receive state */
    int rx_payload;                /* 1: reading a payload directly */
    char *rx_dst;
    size_t rx_left;
    uint32_t rx_imm;
    size_t rxpos, rxfill;
    char rxbuf[HC_TCP_RXBUF];
} tcp_sock_t;

struct hc_ep {
    hc_transport_t *tr;
    int peer;
    int nsocks;
    tcp_sock_t *socks;
    unsigned rr;
    int bye;      /* peer said goodbye: its EOF is not a failure */
    int corrupt;  /* enum hc_tcp_corrupt, test hook */
};

struct hc_transport {
    hc_transport_params_t p;
    char bind_addr[64];
    char ifname[64];
    struct in_addr ip;
    int listen_fd;
    int port;
    int epfd;
    uint64_t token;
    hc_mr_t *mrs;
    uint64_t next_mr_id;
    hc_ep_t **eps;
    int neps;
    hc_compq_t cq; /* found, not yet reported */
    hcoll_status_t err; /* sticky: the first failure */
};

/* ------------------------------------------------------------------------ */
/* Errors                                                                     */
/* ------------------------------------------------------------------------ */

static hcoll_status_t tr_fail(hc_transport_t *tr, hcoll_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The first failure is recorded and logged; later ones (cascades of the
 * first) only return the sticky status. */
static hcoll_status_t tr_fail(hc_transport_t *tr, hcoll_status_t st, const char *fmt, ...)
{
    char who[96];
    snprintf(who, sizeof who, "tcp rank %d (%s)", tr->p.log_rank, tr->bind_addr);
    va_list ap;
    va_start(ap, fmt);
    st = hc_tp_failv(&tr->p, &tr->err, st, who, fmt, ap);
    va_end(ap);
    return st;
}

static void sock_unwatch(hc_transport_t *tr, tcp_sock_t *s)
{
    if (s->in_epoll) {
        epoll_ctl(tr->epfd, EPOLL_CTL_DEL, s->fd, NULL);
        s->in_epoll = 0;
    }
}

/* ------------------------------------------------------------------------ */
/* Socket set-up                                                              */
/* ------------------------------------------------------------------------ */

static int set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

/* Buffer sizes must be set before listen/connect to affect window scaling. */
static void set_bufs(const hc_transport_t *tr, int fd)
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

static hcoll_status_t tcp_create(const hc_transport_params_t *params, hc_transport_t **tr_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_transport_t *tr = calloc(1, sizeof *tr);
    if (!tr)
        return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_NO_MEMORY,
                          "tcp: out of memory creating the transport");
    tr->p = *params;
    tr->listen_fd = tr->epfd = -1;
    tr->next_mr_id = 1;
    if (tr->p.nsocks_perpeer < 1)
        tr->p.nsocks_perpeer = 1;
    if (tr->p.timeout_ms < 1)
        tr->p.timeout_ms = 1;
    snprintf(tr->bind_addr, sizeof tr->bind_addr, "%s",
             params->bind_addr ? params->bind_addr : "");
    snprintf(tr->ifname, sizeof tr->ifname, "%s", params->ifname ? params->ifname : "?");
    tr->p.bind_addr = tr->bind_addr;
    tr->p.ifname = tr->ifname;

    if (inet_pton(AF_INET, tr->bind_addr, &tr->ip) != 1) {
        st = tr_fail(tr, HCOLL_ERR_INVALID_ARG, "bind address '%s' is not an IPv4 address",
                     tr->bind_addr);
        goto fail_free;
    }
    if (getrandom(&tr->token, sizeof tr->token, 0) != (ssize_t)sizeof tr->token)
        tr->token = ((uint64_t)getpid() << 32) ^ (uint64_t)(hc_now_ms() * 1e3);

    tr->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (tr->listen_fd < 0) {
        st = tr_fail(tr, HCOLL_ERR_SYSTEM, "socket: %s", strerror(errno));
        goto fail_free;
    }
    set_bufs(tr, tr->listen_fd);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr = tr->ip, .sin_port = 0 };
    if (bind(tr->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(tr->listen_fd, 128) != 0) {
        st = tr_fail(tr, HCOLL_ERR_NETWORK, "cannot listen on %s: %s", tr->bind_addr,
                     strerror(errno));
        goto fail_listen;
    }
    socklen_t sl = sizeof sa;
    getsockname(tr->listen_fd, (struct sockaddr *)&sa, &sl);
    tr->port = ntohs(sa.sin_port);

    tr->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (tr->epfd < 0) {
        st = tr_fail(tr, HCOLL_ERR_SYSTEM, "epoll_create1: %s", strerror(errno));
        goto fail_listen;
    }
    HC_INFO(HC_NET, tr->p.log_rank,
            "rank %d -> rail %d %s %s (tcp port %d, ring position %d, %d socket%s per peer)",
            tr->p.log_rank, tr->p.rail, tr->ifname, tr->bind_addr, tr->port, tr->p.rank,
            tr->p.nsocks_perpeer, tr->p.nsocks_perpeer > 1 ? "s" : "");
    *tr_out = tr;
    return HCOLL_SUCCESS;

fail_listen:
    close(tr->listen_fd);
fail_free:
    free(tr);
    return st;
}

int hc_tcp_listen_port(const hc_transport_t *tr)
{
    return tr->port;
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

static void ep_free(hc_ep_t *ep)
{
    for (int i = 0; i < ep->nsocks; i++) {
        if (ep->socks[i].fd >= 0)
            close(ep->socks[i].fd);
        free(ep->socks[i].txq);
    }
    free(ep->socks);
    free(ep);
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
            return tr_fail(tr, HCOLL_ERR_SYSTEM, "socket: %s", strerror(errno));
        set_bufs(tr, fd);
        /* Bind before connect: the rail's traffic leaves from its address. */
        if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) {
            err = errno;
            close(fd);
            return tr_fail(tr, HCOLL_ERR_NETWORK, "cannot bind to %s for rank %u: %s",
                           tr->bind_addr, to->rank, strerror(err));
        }
        int rc = connect(fd, (struct sockaddr *)&dst, sizeof dst);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd pfd = { fd, POLLOUT, 0 };
            int left = (int)(deadline - hc_now_ms());
            rc = left > 0 ? poll(&pfd, 1, left) : 0;
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
        usleep(10000);
    }
    return tr_fail(tr, err == ETIMEDOUT ? HCOLL_ERR_TIMEOUT : HCOLL_ERR_NETWORK,
                   "cannot connect to rank %u at %s:%u: %s", to->rank, dstname, to->port,
                   strerror(err));
}

static hcoll_status_t tcp_connect(hc_transport_t *tr, const int *peers, int npeers,
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
        st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto out_free;
    }
    HC_CHECK(allgather(ag_ctx, &mine, all, sizeof mine), out_free);
    for (int i = 0; i < npeers; i++) {
        int p = peers[i];
        if (p < 0 || p >= n || p == me || all[p].magic != HC_TCP_ADDR_MAGIC ||
            all[p].rank != (uint32_t)p) {
            st = tr_fail(tr, HCOLL_ERR_INVALID_ARG, "peer %d: no valid address from the exchange",
                         p);
            goto out_eps;
        }
        eps[i] = ep_new(tr, p);
        if (!eps[i]) {
            st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
            goto out_eps;
        }
    }
    /* Dial first: the peers' listeners exist since create(), and the
     * kernel completes our handshakes from its backlog before they accept. */
    int expect = 0;
    for (int i = 0; i < npeers; i++) {
        if (me < peers[i]) {
            for (int k = 0; k < ns; k++)
                HC_CHECK(dial(tr, &all[peers[i]], k, deadline, &eps[i]->socks[k].fd), out_eps);
        } else {
            expect += ns;
        }
    }
    while (expect > 0) {
        int left = (int)(deadline - hc_now_ms());
        struct pollfd pfd = { tr->listen_fd, POLLIN, 0 };
        int pr = left > 0 ? poll(&pfd, 1, left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            st = tr_fail(tr, HCOLL_ERR_TIMEOUT,
                         "%d connection(s) from lower ranks did not arrive within %d ms", expect,
                         tr->p.timeout_ms);
            goto out_eps;
        }
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
    for (int i = 0; i < npeers; i++) {
        for (int k = 0; k < ns; k++) {
            tcp_sock_t *s = &eps[i]->socks[k];
            set_nonblock(s->fd, 1);
            set_data_opts(tr, s->fd);
            struct epoll_event ev = { .events = EPOLLIN, .data.ptr = s };
            if (epoll_ctl(tr->epfd, EPOLL_CTL_ADD, s->fd, &ev) != 0) {
                st = tr_fail(tr, HCOLL_ERR_SYSTEM, "epoll_ctl: %s", strerror(errno));
                goto out_eps;
            }
            s->in_epoll = 1;
        }
    }
    hc_ep_t **grown = realloc(tr->eps, (size_t)(tr->neps + npeers) * sizeof *grown);
    if (!grown) {
        st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto out_eps;
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

out_eps:
    for (int i = 0; i < npeers; i++)
        if (eps[i]) {
            for (int k = 0; k < eps[i]->nsocks; k++)
                sock_unwatch(tr, &eps[i]->socks[k]);
            ep_free(eps[i]);
        }
out_free:
    free(eps);
    free(all);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Memory regions                                                             */
/* ------------------------------------------------------------------------ */

static hcoll_status_t tcp_mr_reg(hc_transport_t *tr, void *base, size_t len, hc_mr_t **mr_out,
                                 hc_rkey_t *rkey_out)
{
    hc_mr_t *mr = calloc(1, sizeof *mr);
    if (!mr)
        return tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory registering %zu bytes", len);
    /* Ids are never reused, so a stale key can never hit a newer region. */
    mr->id = tr->next_mr_id++;
    mr->base = base;
    mr->len = len;
    mr->next = tr->mrs;
    tr->mrs = mr;
    rkey_out->w[0] = mr->id;
    rkey_out->w[1] = len;
    *mr_out = mr;
    return HCOLL_SUCCESS;
}

static void tcp_mr_dereg(hc_transport_t *tr, hc_mr_t *mr)
{
    if (!mr)
        return;
    for (hc_mr_t **pp = &tr->mrs; *pp; pp = &(*pp)->next)
        if (*pp == mr) {
            *pp = mr->next;
            break;
        }
    free(mr);
}

static hc_mr_t *mr_find(hc_transport_t *tr, uint64_t id)
{
    /* Most-recent first; a ring holds a handful of regions. */
    for (hc_mr_t *mr = tr->mrs; mr; mr = mr->next)
        if (mr->id == id)
            return mr;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Completions                                                                */
/* ------------------------------------------------------------------------ */

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
    sock_unwatch(tr, s);
    if (err == ETIMEDOUT)
        return tr_fail(tr, HCOLL_ERR_TIMEOUT, "link to rank %d went silent for %d ms (%s: %s)",
                       hc_tp_rank(&tr->p, ep->peer), tr->p.timeout_ms, what, strerror(err));
    return tr_fail(tr, HCOLL_ERR_PEER_FAILED, "connection to rank %d failed (%s: %s)%s",
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
                    return tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
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
            return tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory queueing a put");
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

static hcoll_status_t tcp_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                              uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id)
{
    hc_transport_t *tr = ep->tr;
    if (tr->err)
        return tr->err;
    if (len && (!lmr || loff > lmr->len || len > lmr->len - loff))
        return tr_fail(tr, HCOLL_ERR_INTERNAL,
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
        return tr_fail(tr, HCOLL_ERR_PEER_FAILED, "put to rank %d: connection is closed",
                       hc_tp_rank(&tr->p, ep->peer));
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
        return tr_fail(s->ep->tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
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
            sock_unwatch(tr, s);
            return tr_fail(tr, HCOLL_ERR_NETWORK,
                           "bad frame from rank %d: magic 0x%08x is not a put",
                           hc_tp_rank(&tr->p, ep->peer), h.magic);
        }
        char *dst = NULL;
        if (h.key != 0 || h.len != 0) {
            hc_mr_t *mr = mr_find(tr, h.key);
            if (!mr) {
                sock_unwatch(tr, s);
                return tr_fail(tr, HCOLL_ERR_NETWORK,
                               "bad frame from rank %d: key %llu names no registered region",
                               hc_tp_rank(&tr->p, ep->peer), (unsigned long long)h.key);
            }
            if (h.off > mr->len || h.len > mr->len - h.off) {
                sock_unwatch(tr, s);
                return tr_fail(tr, HCOLL_ERR_NETWORK,
                               "bad frame from rank %d: %llu bytes at offset %llu overflow the "
                               "%zu-byte region %llu",
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

static hcoll_status_t sock_read(tcp_sock_t *s)
{
    hc_ep_t *ep = s->ep;
    hc_transport_t *tr = ep->tr;
    /* Bounded so that one busy socket cannot starve the others. */
    for (int iter = 0; iter < 64 && s->in_epoll; iter++) {
        ssize_t n;
        if (s->rx_payload) {
            n = recv(s->fd, s->rx_dst, s->rx_left, MSG_DONTWAIT);
        } else {
            if (s->rxpos) {
                memmove(s->rxbuf, s->rxbuf + s->rxpos, s->rxfill - s->rxpos);
                s->rxfill -= s->rxpos;
                s->rxpos = 0;
            }
            n = recv(s->fd, s->rxbuf + s->rxfill, HC_TCP_RXBUF - s->rxfill, MSG_DONTWAIT);
        }
        if (n == 0) {
            sock_unwatch(tr, s);
            if (ep->bye && !s->rx_payload && s->rxfill == s->rxpos)
                return HCOLL_SUCCESS;
            return tr_fail(tr, HCOLL_ERR_PEER_FAILED,
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
                sock_unwatch(tr, s);
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
    }
    return HCOLL_SUCCESS;
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
    if (tr->cq.count)
        wait_ms = 0;
    struct epoll_event evs[32];
    int n = epoll_wait(tr->epfd, evs, 32, wait_ms);
    if (n < 0) {
        if (errno == EINTR)
            return HCOLL_SUCCESS;
        return tr_fail(tr, HCOLL_ERR_SYSTEM, "epoll_wait: %s", strerror(errno));
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

static hcoll_status_t tcp_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                               int *n_out)
{
    *n_out = 0;
    if (tr->err)
        return tr->err;
    hcoll_status_t st = progress(tr, 0);
    if (st == HCOLL_SUCCESS && tr->cq.count == 0 && wait_ms > 0)
        st = progress(tr, wait_ms);
    if (st != HCOLL_SUCCESS)
        return st;
    *n_out = hc_compq_pop(&tr->cq, comps, max);
    return HCOLL_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Close                                                                      */
/* ------------------------------------------------------------------------ */

static void tcp_destroy(hc_transport_t *tr, int graceful)
{
    if (!tr)
        return;
    graceful = graceful && tr->err == HCOLL_SUCCESS;
    if (graceful) {
        /* Say goodbye on every socket and give the kernel a bounded moment
         * to take it; an orderly peer then reads EOF as the end, not as a
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
                    if (s->in_epoll && s->txcount && sock_flush(s) == HCOLL_SUCCESS &&
                        s->txcount)
                        pending = 1;
                }
            if (!pending || tr->err || hc_now_ms() > deadline)
                break;
            usleep(1000);
        }
    }
    for (int i = 0; i < tr->neps; i++) {
        hc_ep_t *ep = tr->eps[i];
        for (int k = 0; k < ep->nsocks; k++) {
            tcp_sock_t *s = &ep->socks[k];
            if (s->fd < 0)
                continue;
            if (graceful) {
                /* Unread bytes at close() turn the FIN into a reset. */
                char sink[4096];
                while (recv(s->fd, sink, sizeof sink, MSG_DONTWAIT) > 0)
                    ;
            } else {
                struct linger lg = { 1, 0 }; /* reset: peers learn at once */
                setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            }
        }
        ep_free(ep);
    }
    free(tr->eps);
    while (tr->mrs)
        tcp_mr_dereg(tr, tr->mrs);
    hc_compq_free(&tr->cq);
    close(tr->epfd);
    close(tr->listen_fd);
    free(tr);
}

const hc_transport_ops_t hc_tcp_ops = {
    .name = "tcp",
    .create = tcp_create,
    .connect = tcp_connect,
    .mr_reg = tcp_mr_reg,
    .mr_dereg = tcp_mr_dereg,
    .put = tcp_put,
    .poll = tcp_poll,
    .destroy = tcp_destroy,
};
