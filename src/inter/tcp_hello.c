/*
 * TCP transport, making the connections: every socket of a connect() is
 * dialled or accepted by one event loop, each connection with its own
 * state and deadline, so a stranger on the port costs the real peers
 * nothing but a slot, and a real peer is never queued behind one.
 *
 *   dialer (lower position)                    acceptor (higher position)
 *   connect (non-blocking) ──────────────────► accept4 (non-blocking; up to
 *                                               HC_TCP_PEND_MAX at once)
 *   HELLO {pos, sock, nsocks, token, Nd} ────► token, pos, sock plausible?
 *                                               else dropped as a stranger
 *          ◄──────────────────────────────── CHAL {Na, MAC(K, "acc" ctx Nd Na)}
 *   the acceptor's MAC right? else MISMATCH
 *   RESP {MAC(K, "dia" ctx Nd Na)} ──────────► MAC right? the socket is the
 *   the socket is the peer's                   peer's; else dropped
 *
 *   K   = MAC(communicator key, "hcoll-tcp-hello-v1") (tcp.c, at create)
 *   ctx = acceptor's token, acceptor's and dialer's positions, sock, nsocks
 *   Nd, Na: 16 fresh random bytes per connection and side, so a recorded
 *   exchange proves nothing on another connection.
 *
 * A dialer whose connection is refused, reset or closed before the
 * challenge (an acceptor that evicted it, or not yet listening) dials
 * again with a growing pause until the deadline. An acceptor gives each
 * accepted connection HC_TCP_HELLO_MS to finish the hello, and when
 * HC_TCP_PEND_MAX are pending evicts the oldest that has sent nothing
 * valid. accept4 failing for lack of descriptors (EMFILE...) pauses the
 * listener HC_TCP_ACCEPT_PAUSE_MS instead of spinning; pending hellos go on.
 *
 * The log: the first dropped connection is a WARN naming its address and
 * why; later ones are only counted, and connect() ends with one WARN line
 * of the counts, so a flood of strangers writes two lines per connect.
 */
#include "inter/tcp_priv.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"

#define HC_TCP_PEND_MAX 64
#define HC_TCP_HELLO_MS 2000
#define HC_TCP_ACCEPT_PAUSE_MS 100
#define HC_TCP_REDIAL_MAX_MS 200

enum pstate { P_FREE = 0, P_WAIT, P_CONNECTING, P_SEND, P_RECV };

/* Why a connection was dropped (counted for the summary). */
enum drop_why { D_GARBAGE, D_TOKEN, D_PEER, D_MAC, D_SILENT, D_CLOSED, D_EVICTED, D_DUP, D_N };
static const char *const drop_names[D_N] = {
    "not a hello",       "a hello for another instance", "not an expected peer/socket",
    "wrong MAC",         "silent past its deadline",     "closed during the hello",
    "evicted (too many pending)", "a duplicate of a connected socket",
};

typedef struct pend {
    int state;
    int fd;
    int dialer;
    int peer_i;       /* index into peers[]; acceptor: -1 until the hello */
    int sock_idx;
    int stage;        /* 0 hello, 1 challenge, 2 response */
    double deadline;  /* acceptor: this connection's; dialer: P_WAIT's wake-up */
    int backoff_ms;   /* dialer: next pause before dialling again */
    int last_err;     /* dialer: why the last attempt ended (errno) */
    double born;      /* acceptor: accept time (eviction picks the oldest) */
    size_t need, have;
    unsigned char buf[96];
    unsigned char nd[HC_TCP_NONCE], na[HC_TCP_NONCE];
    char from[INET_ADDRSTRLEN + 8];
} pend_t;

typedef struct hs {
    hc_transport_t *tr;
    const tcp_addr_t *all;
    const int *peers;
    int npeers;
    hc_ep_t **eps;
    double deadline;
    pend_t *p;
    int np;            /* dialers first, then HC_TCP_PEND_MAX acceptor slots */
    int ndial;
    int left;          /* sockets not yet in place */
    int expect;        /* of which accepted */
    double listen_wake;
    int accept_err;    /* last accept4 errno that paused the listener */
    unsigned drops[D_N];
    unsigned ndrops;
} hs_t;

/* The MAC of one side over the connection's context and both nonces. */
static void hello_mac(const hc_transport_t *tr, const char label[4], uint64_t token, int acc,
                      int dia, int sock, const pend_t *p, unsigned char out[HC_TP_MAC_BYTES])
{
    unsigned char m[4 + 8 + 16 + 2 * HC_TCP_NONCE];
    uint32_t w[4] = { (uint32_t)acc, (uint32_t)dia, (uint32_t)sock,
                      (uint32_t)tr->p.nsocks_perpeer };
    memcpy(m, label, 4);
    memcpy(m + 4, &token, 8);
    memcpy(m + 12, w, 16);
    memcpy(m + 28, p->nd, HC_TCP_NONCE);
    memcpy(m + 28 + HC_TCP_NONCE, p->na, HC_TCP_NONCE);
    tr->mac(tr->hkey, sizeof tr->hkey, m, sizeof m, out);
}

/* Equal in time independent of where the first difference is. */
static int ct_equal(const unsigned char *a, const unsigned char *b, size_t n)
{
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

static void pend_close(pend_t *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    p->state = P_FREE;
}

static void drop(hs_t *h, pend_t *p, enum drop_why why)
{
    hc_transport_t *tr = h->tr;
    if (h->ndrops++ == 0)
        HC_WARN(HC_NET, tr->p.log_rank,
                "tcp rank %d: dropped a connection from %s on %s:%d: %s (later ones are "
                "counted, not logged)",
                tr->p.log_rank, p->from, tr->bind_addr, tr->port, drop_names[why]);
    h->drops[why]++;
    pend_close(p);
}

/* ---- dialling ----------------------------------------------------------- */

static void send_stage(pend_t *p, const void *msg, size_t len, int stage)
{
    memcpy(p->buf, msg, len);
    p->need = len;
    p->have = 0;
    p->stage = stage;
    p->state = P_SEND;
}

static void recv_stage(pend_t *p, size_t len, int stage)
{
    p->need = len;
    p->have = 0;
    p->stage = stage;
    p->state = P_RECV;
}

/* The attempt ended before the peer proved anything: dial again later. */
static void redial_later(pend_t *p, int err)
{
    pend_close(p);
    p->last_err = err;
    p->state = P_WAIT;
    p->deadline = hc_now_ms() + p->backoff_ms;
    p->backoff_ms = p->backoff_ms * 2 > HC_TCP_REDIAL_MAX_MS ? HC_TCP_REDIAL_MAX_MS
                                                             : p->backoff_ms * 2;
}

static hcoll_status_t dial_hello(hs_t *h, pend_t *p)
{
    hc_transport_t *tr = h->tr;
    const tcp_addr_t *to = &h->all[h->peers[p->peer_i]];
    if (hc_tp_random(p->nd, sizeof p->nd) != 0)
        return hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "getrandom for a hello nonce: %s",
                           strerror(errno));
    tcp_hello_t m = { HC_TCP_HELLO_MAGIC, (uint32_t)tr->p.rank, (uint32_t)p->sock_idx,
                      (uint32_t)tr->p.nsocks_perpeer, to->token, { 0 } };
    memcpy(m.nonce, p->nd, sizeof m.nonce);
    send_stage(p, &m, sizeof m, 0);
    return HCOLL_SUCCESS;
}

static hcoll_status_t dial_start(hs_t *h, pend_t *p)
{
    hc_transport_t *tr = h->tr;
    const tcp_addr_t *to = &h->all[h->peers[p->peer_i]];
    struct sockaddr_in src = { .sin_family = AF_INET, .sin_addr = tr->ip, .sin_port = 0 };
    struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons((uint16_t)to->port) };
    dst.sin_addr.s_addr = to->ip;
    p->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (p->fd < 0)
        return hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "socket: %s", strerror(errno));
    hc_tcp_set_bufs(tr, p->fd);
    /* Bind before connect: the rail's traffic leaves from its address. */
    if (bind(p->fd, (struct sockaddr *)&src, sizeof src) != 0) {
        int err = errno;
        pend_close(p);
        return hc_tcp_fail(tr, HCOLL_ERR_NETWORK, "cannot bind to %s for rank %d: %s",
                           tr->bind_addr, hc_tp_rank(&tr->p, h->peers[p->peer_i]),
                           strerror(err));
    }
    if (connect(p->fd, (struct sockaddr *)&dst, sizeof dst) == 0)
        return dial_hello(h, p);
    if (errno != EINPROGRESS) {
        redial_later(p, errno);
        return HCOLL_SUCCESS;
    }
    p->state = P_CONNECTING;
    return HCOLL_SUCCESS;
}

static hcoll_status_t dial_connected(hs_t *h, pend_t *p)
{
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err) {
        redial_later(p, err);
        return HCOLL_SUCCESS;
    }
    return dial_hello(h, p);
}

/* The challenge arrived: check the acceptor's proof, answer with ours. */
static hcoll_status_t dial_challenge(hs_t *h, pend_t *p)
{
    hc_transport_t *tr = h->tr;
    const tcp_addr_t *to = &h->all[h->peers[p->peer_i]];
    tcp_chal_t c;
    memcpy(&c, p->buf, sizeof c);
    memcpy(p->na, c.nonce, sizeof p->na);
    unsigned char want[HC_TP_MAC_BYTES];
    hello_mac(tr, "acc", to->token, h->peers[p->peer_i], tr->p.rank, p->sock_idx, p, want);
    if (c.magic != HC_TCP_CHAL_MAGIC || !ct_equal(want, c.mac, sizeof want)) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &to->ip, ip, sizeof ip);
        return hc_tcp_fail(tr, HCOLL_ERR_MISMATCH,
                           "the listener at %s:%u (rank %d's address) did not prove the "
                           "communicator's key in its hello: not rank %d, or another job",
                           ip, to->port, hc_tp_rank(&tr->p, h->peers[p->peer_i]),
                           hc_tp_rank(&tr->p, h->peers[p->peer_i]));
    }
    tcp_resp_t r = { HC_TCP_RESP_MAGIC, 0, { 0 } };
    hello_mac(tr, "dia", to->token, h->peers[p->peer_i], tr->p.rank, p->sock_idx, p, r.mac);
    send_stage(p, &r, sizeof r, 2);
    return HCOLL_SUCCESS;
}

/* ---- accepting ---------------------------------------------------------- */

/* The hello of an accepted connection arrived: a plausible one gets the
 * challenge, anything else is a stranger. */
static hcoll_status_t acc_hello(hs_t *h, pend_t *p)
{
    hc_transport_t *tr = h->tr;
    tcp_hello_t m;
    memcpy(&m, p->buf, sizeof m);
    if (m.magic != HC_TCP_HELLO_MAGIC) {
        drop(h, p, D_GARBAGE);
        return HCOLL_SUCCESS;
    }
    if (m.token != tr->token) {
        drop(h, p, D_TOKEN);
        return HCOLL_SUCCESS;
    }
    int slot = -1;
    if (m.nsocks == (uint32_t)tr->p.nsocks_perpeer && m.sock_idx < m.nsocks)
        for (int i = 0; i < h->npeers; i++)
            if ((uint32_t)h->peers[i] == m.rank && h->peers[i] < tr->p.rank &&
                h->eps[i]->socks[m.sock_idx].fd < 0)
                slot = i;
    if (slot < 0) {
        drop(h, p, D_PEER);
        return HCOLL_SUCCESS;
    }
    p->peer_i = slot;
    p->sock_idx = (int)m.sock_idx;
    memcpy(p->nd, m.nonce, sizeof p->nd);
    if (hc_tp_random(p->na, sizeof p->na) != 0)
        return hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "getrandom for a hello nonce: %s",
                           strerror(errno));
    tcp_chal_t c = { HC_TCP_CHAL_MAGIC, 0, { 0 }, { 0 } };
    memcpy(c.nonce, p->na, sizeof c.nonce);
    hello_mac(tr, "acc", tr->token, tr->p.rank, (int)m.rank, p->sock_idx, p, c.mac);
    send_stage(p, &c, sizeof c, 1);
    return HCOLL_SUCCESS;
}

static void acc_response(hs_t *h, pend_t *p)
{
    hc_transport_t *tr = h->tr;
    tcp_resp_t r;
    memcpy(&r, p->buf, sizeof r);
    unsigned char want[HC_TP_MAC_BYTES];
    hello_mac(tr, "dia", tr->token, tr->p.rank, h->peers[p->peer_i], p->sock_idx, p, want);
    if (r.magic != HC_TCP_RESP_MAGIC || !ct_equal(want, r.mac, sizeof want)) {
        drop(h, p, D_MAC);
        return;
    }
    tcp_sock_t *s = &h->eps[p->peer_i]->socks[p->sock_idx];
    if (s->fd >= 0) {
        drop(h, p, D_DUP);
        return;
    }
    s->fd = p->fd;
    p->fd = -1;
    p->state = P_FREE;
    h->left--;
    h->expect--;
}

static pend_t *acc_slot(hs_t *h)
{
    /* The oldest that has sent nothing valid; failing that, the oldest: a
     * real dialer finishes in a round trip, and one evicted dials again. */
    pend_t *oldest = NULL, *quiet = NULL;
    for (int i = h->ndial; i < h->np; i++) {
        pend_t *p = &h->p[i];
        if (p->state == P_FREE)
            return p;
        if (!oldest || p->born < oldest->born)
            oldest = p;
        if (p->stage == 0 && (!quiet || p->born < quiet->born))
            quiet = p;
    }
    pend_t *v = quiet ? quiet : oldest;
    if (v)
        drop(h, v, D_EVICTED);
    return v;
}

/* Take what the backlog holds, without blocking. */
static void acc_drain(hs_t *h)
{
    hc_transport_t *tr = h->tr;
    for (int k = 0; k < 2 * HC_TCP_PEND_MAX; k++) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(tr->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (h->accept_err != errno)
                    HC_WARN(HC_NET, tr->p.log_rank,
                            "tcp rank %d: accept on %s:%d: %s; pausing the listener %d ms",
                            tr->p.log_rank, tr->bind_addr, tr->port, strerror(errno),
                            HC_TCP_ACCEPT_PAUSE_MS);
                h->accept_err = errno;
                h->listen_wake = hc_now_ms() + HC_TCP_ACCEPT_PAUSE_MS;
            }
            return; /* EAGAIN: drained; ECONNABORTED and the like: next poll */
        }
        pend_t *p = acc_slot(h);
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->peer_i = -1;
        p->born = hc_now_ms();
        p->deadline = p->born + HC_TCP_HELLO_MS;
        snprintf(p->from, sizeof p->from, "?");
        inet_ntop(AF_INET, &sa.sin_addr, p->from, sizeof p->from);
        snprintf(p->from + strlen(p->from), sizeof p->from - strlen(p->from), ":%u",
                 ntohs(sa.sin_port));
        recv_stage(p, sizeof(tcp_hello_t), 0);
    }
}

/* ---- the loop ----------------------------------------------------------- */

/* A step of p's message is complete: the next one. */
static hcoll_status_t advance(hs_t *h, pend_t *p)
{
    if (p->dialer) {
        switch (p->stage) {
        case 0: recv_stage(p, sizeof(tcp_chal_t), 1); return HCOLL_SUCCESS;
        case 1: return dial_challenge(h, p);
        default:
            h->eps[p->peer_i]->socks[p->sock_idx].fd = p->fd;
            p->fd = -1;
            p->state = P_FREE;
            h->left--;
            return HCOLL_SUCCESS;
        }
    }
    switch (p->stage) {
    case 0: return acc_hello(h, p);
    case 1: recv_stage(p, sizeof(tcp_resp_t), 2); return HCOLL_SUCCESS;
    default: acc_response(h, p); return HCOLL_SUCCESS;
    }
}

/* Move p's bytes; on a finished step, advance. */
static hcoll_status_t pend_io(hs_t *h, pend_t *p, short revents)
{
    if (p->state == P_CONNECTING)
        return revents ? dial_connected(h, p) : HCOLL_SUCCESS;
    while (p->have < p->need) {
        ssize_t n = p->state == P_SEND
                        ? send(p->fd, p->buf + p->have, p->need - p->have,
                               MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(p->fd, p->buf + p->have, p->need - p->have, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return HCOLL_SUCCESS;
        if (n <= 0) {
            int err = n == 0 ? ECONNRESET : errno;
            if (p->dialer)
                redial_later(p, err);
            else
                drop(h, p, D_CLOSED);
            return HCOLL_SUCCESS;
        }
        p->have += (size_t)n;
    }
    return advance(h, p);
}

/* "N garbage, M wrong MAC" of the drops so far, into buf. */
static void drop_counts(const hs_t *h, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int w = 0; w < D_N; w++)
        if (h->drops[w] && o < len) {
            int n = snprintf(buf + o, len - o, "%s%u %s", o ? ", " : "", h->drops[w],
                             drop_names[w]);
            o += n > 0 ? (size_t)n : 0;
        }
}

/* The deadline passed: say who is missing and what was seen instead. */
static hcoll_status_t hs_timeout(hs_t *h)
{
    hc_transport_t *tr = h->tr;
    char miss[192] = "", drops[160];
    size_t o = 0;
    for (int i = 0; i < h->npeers && o < sizeof miss; i++) {
        int got = 0, want = tr->p.nsocks_perpeer, mid = 0, err = 0;
        for (int k = 0; k < want; k++)
            got += h->eps[i]->socks[k].fd >= 0;
        if (got == want)
            continue;
        for (int j = 0; j < h->np; j++)
            if (h->p[j].state != P_FREE && h->p[j].peer_i == i) {
                mid |= h->p[j].state == P_RECV || h->p[j].state == P_SEND;
                err = h->p[j].last_err ? h->p[j].last_err : err;
            }
        int n = snprintf(miss + o, sizeof miss - o, "%s%s rank %d (%d of %d socket(s)%s%s%s)",
                         o ? "; " : "", tr->p.rank < h->peers[i] ? "to" : "from",
                         hc_tp_rank(&tr->p, h->peers[i]), got, want,
                         mid ? ", hello under way" : "",
                         err ? ", last attempt: " : "", err ? strerror(err) : "");
        o += n > 0 ? (size_t)n : 0;
    }
    drop_counts(h, drops, sizeof drops);
    return hc_tcp_fail(tr, HCOLL_ERR_TIMEOUT,
                       "%d data connection(s) not made within %d ms: %s%s%s%s%s%s", h->left,
                       tr->p.timeout_ms, miss, h->ndrops ? "; dropped strangers: " : "",
                       drops, h->accept_err ? "; accept: " : "",
                       h->accept_err ? strerror(h->accept_err) : "",
                       h->ndrops ? "" : (h->expect ? "; no stranger seen" : ""));
}

/* One line for the connections dropped after the first (logged at once). */
static void hs_summary(const hs_t *h)
{
    if (h->ndrops < 2)
        return;
    char drops[160];
    drop_counts(h, drops, sizeof drops);
    HC_WARN(HC_NET, h->tr->p.log_rank, "tcp rank %d: dropped %u connection(s) on %s:%d: %s",
            h->tr->p.log_rank, h->ndrops, h->tr->bind_addr, h->tr->port, drops);
}

static int build_fds(hs_t *h, struct pollfd *fds, int *who, double now, double *wake)
{
    int n = 0;
    *wake = h->deadline;
    if (h->tr->p.cancel_fd) {
        fds[n] = (struct pollfd){ *h->tr->p.cancel_fd, POLLIN, 0 };
        who[n++] = -2;
    }
    if (h->expect > 0) {
        if (now >= h->listen_wake) {
            fds[n] = (struct pollfd){ h->tr->listen_fd, POLLIN, 0 };
            who[n++] = -1;
        } else if (h->listen_wake < *wake) {
            *wake = h->listen_wake;
        }
    }
    for (int i = 0; i < h->np; i++) {
        pend_t *p = &h->p[i];
        if (p->state == P_FREE)
            continue;
        if (p->state != P_WAIT && !p->dialer && p->deadline < *wake)
            *wake = p->deadline;
        if (p->state == P_WAIT) {
            if (p->deadline < *wake)
                *wake = p->deadline;
            continue;
        }
        fds[n] = (struct pollfd){ p->fd, p->state == P_RECV ? POLLIN : POLLOUT, 0 };
        who[n++] = i;
    }
    return n;
}

/* Deadlines of accepted connections and wake-ups of waiting dialers. */
static hcoll_status_t timers(hs_t *h, double now)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    for (int i = 0; i < h->np && st == HCOLL_SUCCESS; i++) {
        pend_t *p = &h->p[i];
        if (p->state == P_WAIT && now >= p->deadline)
            st = dial_start(h, p);
        else if (p->state != P_FREE && p->state != P_WAIT && !p->dialer && now >= p->deadline)
            drop(h, p, D_SILENT);
    }
    return st;
}

static hcoll_status_t hs_loop(hs_t *h)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    struct pollfd *fds = calloc((size_t)h->np + 2, sizeof *fds);
    int *who = calloc((size_t)h->np + 2, sizeof *who);
    if (!fds || !who) {
        st = hc_tcp_fail(h->tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto clean_fds;
    }
    while (h->left > 0) {
        double now = hc_now_ms(), wake;
        if (now >= h->deadline) {
            st = hs_timeout(h);
            break;
        }
        int n = build_fds(h, fds, who, now, &wake);
        int ms = (int)(wake - now) + 1;
        int pr = poll(fds, (nfds_t)n, ms > 0 ? ms : 0);
        if (pr < 0 && errno != EINTR) {
            st = hc_tcp_fail(h->tr, HCOLL_ERR_SYSTEM, "poll: %s", strerror(errno));
            break;
        }
        for (int i = 0; pr > 0 && i < n && st == HCOLL_SUCCESS; i++) {
            if (!fds[i].revents)
                continue;
            if (who[i] == -2)
                st = hc_tcp_fail(h->tr, HCOLL_ERR_ABORTED,
                                 "connecting cancelled: the communicator was aborted or "
                                 "destroyed during its set-up");
            else if (who[i] == -1)
                acc_drain(h);
            else if (h->p[who[i]].state != P_FREE)
                st = pend_io(h, &h->p[who[i]], fds[i].revents);
        }
        if (st == HCOLL_SUCCESS)
            st = timers(h, hc_now_ms());
        if (st != HCOLL_SUCCESS)
            break;
    }
clean_fds:
    free(who);
    free(fds);
    return st;
}

hcoll_status_t hc_tcp_handshake(hc_transport_t *tr, const tcp_addr_t *all, const int *peers,
                                int npeers, hc_ep_t **eps, double deadline)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const int ns = tr->p.nsocks_perpeer;
    hs_t h = { .tr = tr, .all = all, .peers = peers, .npeers = npeers, .eps = eps,
               .deadline = deadline };
    for (int i = 0; i < npeers; i++) {
        if (tr->p.rank < peers[i])
            h.ndial += ns;
        else
            h.expect += ns;
    }
    h.left = h.ndial + h.expect;
    h.np = h.ndial + (h.expect ? HC_TCP_PEND_MAX : 0);
    h.p = calloc((size_t)(h.np ? h.np : 1), sizeof *h.p);
    if (!h.p)
        return hc_tcp_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
    for (int i = 0; i < h.np; i++)
        h.p[i].fd = -1;
    for (int i = 0, d = 0; i < npeers; i++)
        for (int k = 0; tr->p.rank < peers[i] && k < ns; k++, d++) {
            pend_t *p = &h.p[d];
            p->dialer = 1;
            p->peer_i = i;
            p->sock_idx = k;
            p->backoff_ms = 10;
            p->state = P_WAIT; /* dialled by the first timers() */
            p->deadline = 0;
        }
    HC_CHECK(timers(&h, hc_now_ms()), clean_pend);
    HC_CHECK(hs_loop(&h), clean_pend);
clean_pend:
    hs_summary(&h);
    for (int i = 0; i < h.np; i++)
        if (h.p[i].fd >= 0)
            close(h.p[i].fd);
    free(h.p);
    return st;
}
