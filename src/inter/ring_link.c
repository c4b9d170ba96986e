/*
 * Setting up the ring's liveness links (ring_live.c carries them): each
 * rank dials next and accepts prev on its rail address, and both ends of a
 * link prove that they hold the communicator's key before it counts, as the
 * TCP data connections do (tcp_hello.c).
 *
 *   dialer (prev)                             acceptor (next)
 *   HELLO {"HCLV", pos, nd}  ───────────────►
 *                            ◄─────────────── CHAL {"HCLC", na, MAC("acc")}
 *   RESP  {"HCLR", MAC("dia")} ─────────────►
 *   MAC(side) = HMAC-SHA-256(K, side | acceptor pos | dialer pos | nd | na),
 *   K = HMAC-SHA-256(communicator key, "hcoll-live-hello-v1").
 *
 * The nonces are fresh per connection, so a recorded hello proves nothing
 * the next time. Dialing and accepting run in one poll loop: every rank
 * dials before it accepts, so a dial that waited for its challenge before
 * accepting would wait in a circle. Strangers on the port are handled side
 * by side, each with a one-second deadline, and a full table evicts the
 * oldest connection that has not yet sent a plausible hello: a flood of
 * idle connections cannot delay prev by a second each.
 */
#include "inter/ring_priv.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"

#define LINK_HELLO_MAGIC 0x48434c56u /* "HCLV" */
#define LINK_CHAL_MAGIC 0x48434c43u  /* "HCLC" */
#define LINK_RESP_MAGIC 0x48434c52u  /* "HCLR" */
#define LINK_NONCE 16
#define LINK_PEND 8          /* connections accepted side by side */
#define LINK_PEND_MS 1000    /* what one of them may take for its hello */
#define LINK_REDIAL_MS 20

typedef struct link_hello {
    uint32_t magic, pos;
    uint8_t nonce[LINK_NONCE];
} link_hello_t;

typedef struct link_chal {
    uint32_t magic, pad;
    uint8_t nonce[LINK_NONCE];
    uint8_t mac[HC_TP_MAC_BYTES];
} link_chal_t;

typedef struct link_resp {
    uint32_t magic, pad;
    uint8_t mac[HC_TP_MAC_BYTES];
} link_resp_t;

/* One connection in progress: the dial (state DIAL_*) or an accepted one
 * (ACC_*). */
enum { L_FREE, DIAL_CONNECT, DIAL_CHAL, ACC_HELLO, ACC_RESP, L_DONE };

typedef struct link_conn {
    int fd, state;
    double deadline;     /* accepted: hello/response by then, or dropped */
    uint8_t nd[LINK_NONCE], na[LINK_NONCE];
    uint8_t buf[sizeof(link_chal_t)];
    size_t have;
} link_conn_t;

typedef struct link_setup {
    hc_ring_t *r;
    uint8_t key[HC_TP_MAC_BYTES];
    uint32_t next_ip, next_port;
    double deadline, redial_at;
    link_conn_t out;
    link_conn_t in[LINK_PEND];
    int in_fd;           /* prev's link once proven, else -1 */
    int bad_next;        /* next's listener failed the proof */
} link_setup_t;

static void link_mac(const link_setup_t *s, const char side[4], int acc, int dia,
                     const link_conn_t *c, uint8_t out[HC_TP_MAC_BYTES])
{
    uint8_t m[4 + 8 + 2 * LINK_NONCE];
    const uint32_t w[2] = { (uint32_t)acc, (uint32_t)dia };
    memcpy(m, side, 4);
    memcpy(m + 4, w, 8);
    memcpy(m + 12, c->nd, LINK_NONCE);
    memcpy(m + 12 + LINK_NONCE, c->na, LINK_NONCE);
    s->r->p.tp.mac(s->key, sizeof s->key, m, sizeof m, out);
}

static int mac_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (size_t i = 0; i < HC_TP_MAC_BYTES; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

static void conn_close(link_conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->state = L_FREE;
    c->have = 0;
}

/* Read towards `want` bytes: 1 when they are all there, 0 not yet, -1 the
 * peer closed or failed. */
static int conn_fill(link_conn_t *c, size_t want)
{
    while (c->have < want) {
        ssize_t n = recv(c->fd, c->buf + c->have, want - c->have, MSG_DONTWAIT);
        if (n > 0)
            c->have += (size_t)n;
        else if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        else
            return -1;
    }
    return 1;
}

static int send_all(int fd, const void *m, size_t len)
{
    return send(fd, m, len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)len ? 0 : -1;
}

/* ---- the dial ---------------------------------------------------------- */

static void dial_start(link_setup_t *s)
{
    hc_ring_t *r = s->r;
    link_conn_t *c = &s->out;
    struct sockaddr_in me = { .sin_family = AF_INET }, to = { .sin_family = AF_INET };
    inet_pton(AF_INET, r->p.tp.bind_addr, &me.sin_addr);
    to.sin_addr.s_addr = s->next_ip;
    to.sin_port = htons((uint16_t)s->next_port);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0 || bind(c->fd, (struct sockaddr *)&me, sizeof me) != 0 ||
        (connect(c->fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS)) {
        conn_close(c);
        s->redial_at = hc_now_ms() + LINK_REDIAL_MS;
        return;
    }
    c->state = DIAL_CONNECT;
}

static void dial_retry(link_setup_t *s)
{
    conn_close(&s->out);
    s->redial_at = hc_now_ms() + LINK_REDIAL_MS;
}

static void dial_io(link_setup_t *s)
{
    link_conn_t *c = &s->out;
    if (c->state == DIAL_CONNECT) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        link_hello_t h = { LINK_HELLO_MAGIC, (uint32_t)s->r->rank, { 0 } };
        if (err || hc_tp_random(c->nd, sizeof c->nd) != 0) {
            dial_retry(s);
            return;
        }
        memcpy(h.nonce, c->nd, sizeof h.nonce);
        if (send_all(c->fd, &h, sizeof h) != 0) {
            dial_retry(s);
            return;
        }
        c->state = DIAL_CHAL;
        return;
    }
    int got = conn_fill(c, sizeof(link_chal_t));
    if (got < 0)
        dial_retry(s); /* next dropped us (its table was full): dial again */
    if (got <= 0)
        return;
    link_chal_t ch;
    memcpy(&ch, c->buf, sizeof ch);
    memcpy(c->na, ch.nonce, sizeof c->na);
    uint8_t want[HC_TP_MAC_BYTES];
    link_mac(s, "acc", s->r->next, s->r->rank, c, want);
    if (ch.magic != LINK_CHAL_MAGIC || !mac_equal(want, ch.mac)) {
        s->bad_next = 1;
        return;
    }
    link_resp_t rs = { LINK_RESP_MAGIC, 0, { 0 } };
    link_mac(s, "dia", s->r->next, s->r->rank, c, rs.mac);
    if (send_all(c->fd, &rs, sizeof rs) != 0) {
        dial_retry(s);
        return;
    }
    c->state = L_DONE;
}

/* ---- accepting --------------------------------------------------------- */

/* A slot for a new connection: a free one, else the oldest that has not
 * sent a plausible hello (it is dropped), else none. */
static link_conn_t *acc_slot(link_setup_t *s)
{
    link_conn_t *old = NULL;
    for (int i = 0; i < LINK_PEND; i++) {
        link_conn_t *c = &s->in[i];
        if (c->state == L_FREE)
            return c;
        if (c->state == ACC_HELLO && (!old || c->deadline < old->deadline))
            old = c;
    }
    if (old)
        conn_close(old);
    return old;
}

static void acc_new(link_setup_t *s)
{
    int fd;
    while ((fd = accept4(s->r->live_listen, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        link_conn_t *c = acc_slot(s);
        if (!c) {
            close(fd);
            continue;
        }
        *c = (link_conn_t){ .fd = fd, .state = ACC_HELLO,
                            .deadline = hc_now_ms() + LINK_PEND_MS };
    }
}

static void acc_io(link_setup_t *s, link_conn_t *c)
{
    hc_ring_t *r = s->r;
    if (c->state == ACC_HELLO) {
        int got = conn_fill(c, sizeof(link_hello_t));
        if (got <= 0) {
            if (got < 0)
                conn_close(c);
            return;
        }
        link_hello_t h;
        memcpy(&h, c->buf, sizeof h);
        if (h.magic != LINK_HELLO_MAGIC || h.pos != (uint32_t)r->prev ||
            hc_tp_random(c->na, sizeof c->na) != 0) {
            conn_close(c);
            return;
        }
        memcpy(c->nd, h.nonce, sizeof c->nd);
        link_chal_t ch = { LINK_CHAL_MAGIC, 0, { 0 }, { 0 } };
        memcpy(ch.nonce, c->na, sizeof ch.nonce);
        link_mac(s, "acc", r->rank, r->prev, c, ch.mac);
        c->have = 0;
        c->state = ACC_RESP;
        if (send_all(c->fd, &ch, sizeof ch) != 0)
            conn_close(c);
        return;
    }
    int got = conn_fill(c, sizeof(link_resp_t));
    if (got <= 0) {
        if (got < 0)
            conn_close(c);
        return;
    }
    link_resp_t rs;
    memcpy(&rs, c->buf, sizeof rs);
    uint8_t want[HC_TP_MAC_BYTES];
    link_mac(s, "dia", r->rank, r->prev, c, want);
    if (rs.magic != LINK_RESP_MAGIC || !mac_equal(want, rs.mac)) {
        conn_close(c);
        return;
    }
    s->in_fd = c->fd;
    c->fd = -1;
    c->state = L_FREE;
}

/* ---- the loop ---------------------------------------------------------- */

/* 0 both links up, -1 past the deadline, -2 cancelled, -3 next failed the
 * proof. */
static int link_loop(link_setup_t *s)
{
    hc_ring_t *r = s->r;
    const int *cancel = r->p.tp.cancel_fd;
    for (;;) {
        double now = hc_now_ms();
        if (s->bad_next)
            return -3;
        if (s->out.state == L_DONE && s->in_fd >= 0)
            return 0;
        if (now >= s->deadline)
            return -1;
        if (s->out.state == L_FREE && now >= s->redial_at)
            dial_start(s);
        struct pollfd p[3 + LINK_PEND];
        link_conn_t *who[3 + LINK_PEND];
        nfds_t n = 0;
        double wake = s->deadline;
        if (s->out.state == DIAL_CONNECT || s->out.state == DIAL_CHAL) {
            p[n] = (struct pollfd){ s->out.fd, s->out.state == DIAL_CONNECT ? POLLOUT : POLLIN, 0 };
            who[n++] = &s->out;
        } else if (s->out.state == L_FREE && s->redial_at < wake) {
            wake = s->redial_at;
        }
        for (int i = 0; i < LINK_PEND; i++) {
            link_conn_t *c = &s->in[i];
            if (c->state == L_FREE)
                continue;
            if (now >= c->deadline) {
                conn_close(c); /* a stranger, or prev too slow: it dials again */
                continue;
            }
            p[n] = (struct pollfd){ c->fd, POLLIN, 0 };
            who[n++] = c;
            if (c->deadline < wake)
                wake = c->deadline;
        }
        const nfds_t nconn = n;
        if (s->in_fd < 0)
            p[n++] = (struct pollfd){ r->live_listen, POLLIN, 0 };
        if (cancel)
            p[n++] = (struct pollfd){ *cancel, POLLIN, 0 };
        int ms = (int)(wake - now) + 1;
        if (poll(p, n, ms < 1 ? 1 : ms) < 0 && errno != EINTR)
            return -1;
        if (cancel && p[n - 1].revents)
            return -2;
        for (nfds_t k = 0; k < nconn; k++) {
            if (!p[k].revents)
                continue;
            if (who[k] == &s->out)
                dial_io(s);
            else
                acc_io(s, who[k]);
        }
        if (s->in_fd < 0 && p[nconn].revents)
            acc_new(s);
    }
}

static hcoll_status_t link_failed(hc_ring_t *r, int rc, int to_next)
{
    if (rc == -2)
        return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_ABORTED,
                          "ring liveness: linking cancelled: the communicator was aborted "
                          "or destroyed during its set-up");
    if (rc == -3)
        return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_MISMATCH,
                          "ring liveness: the listener at rank %d's liveness address did not "
                          "prove the communicator's key: not rank %d, or another job",
                          hc_tp_rank(&r->p.tp, r->next), hc_tp_rank(&r->p.tp, r->next));
    return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_TIMEOUT,
                      "ring liveness: no link %s rank %d on rail %d (%s) within %d ms",
                      to_next ? "to next" : "from prev",
                      hc_tp_rank(&r->p.tp, to_next ? r->next : r->prev), r->p.tp.rail,
                      r->p.tp.bind_addr, r->p.tp.timeout_ms);
}

hcoll_status_t hc_ring_live_connect(hc_ring_t *r, uint32_t next_ip, uint32_t next_port)
{
    if (r->live_listen < 0)
        return HCOLL_SUCCESS;
    if (!r->p.tp.auth_key || !r->p.tp.mac) {
        close(r->live_listen);
        r->live_listen = -1;
        return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_INVALID_ARG,
                          "ring liveness: no communicator key to prove the links with");
    }
    link_setup_t s = { .r = r, .next_ip = next_ip, .next_port = next_port,
                       .deadline = hc_now_ms() + r->p.tp.timeout_ms, .in_fd = -1 };
    s.out.fd = -1;
    for (int i = 0; i < LINK_PEND; i++)
        s.in[i].fd = -1;
    r->p.tp.mac(r->p.tp.auth_key, HC_TP_KEY_BYTES, "hcoll-live-hello-v1", 19, s.key);
    const int rc = link_loop(&s);
    explicit_bzero(s.key, sizeof s.key);
    for (int i = 0; i < LINK_PEND; i++)
        conn_close(&s.in[i]);
    close(r->live_listen);
    r->live_listen = -1;
    if (rc != 0) {
        const int to_next = s.out.state != L_DONE;
        conn_close(&s.out);
        if (s.in_fd >= 0)
            close(s.in_fd);
        return link_failed(r, rc, to_next);
    }
    hc_ring_live_up(r, s.out.fd, s.in_fd);
    return HCOLL_SUCCESS;
}
