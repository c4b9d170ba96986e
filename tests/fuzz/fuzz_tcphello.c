/* The TCP data connections' hello (inter/tcp_hello.c): HELLO, CHALLENGE and
 * RESPONSE as the real handshake loop (hc_tcp_handshake) reads them, on
 * both sides, over loopback sockets. The input picks a role:
 *   - acceptor (a position with one lower peer): up to 6 connections are
 *     made to its port first, each sending a hello built from fields (the
 *     peer's own, or one field of the input's) or raw bytes, perhaps a
 *     forged response after it, then ending its sending side or staying
 *     silent; then the real peer (a thread of this target, written from
 *     the protocol) dials each of its sockets, or never comes;
 *   - dialer (a position with one higher peer): a thread of this target
 *     plays the acceptor, and answers each connection as a script of up to
 *     4 steps says: honestly, with one bit of its challenge flipped, with a
 *     short raw challenge and a close, or with a close at once; after the
 *     script it answers honestly or stops accepting.
 * Promises checked beyond memory safety:
 *   - both ends prove the key: the acceptor's challenge and the dialer's
 *     response carry the right MAC, and the dialer's hellos name it, its
 *     socket, its socket count and the acceptor's token;
 *   - the acceptor places a socket if and only if the peer, holding the
 *     key, dialed it, and then it is the peer's connection of that index:
 *     no stranger's bytes, not even the peer's exact hello, make one;
 *   - the dialer fails with MISMATCH on a challenge with any bit flipped
 *     but the pad's, never answers it, and dials again after a close or a
 *     short challenge: it succeeds exactly when the script lets every
 *     socket be answered honestly first;
 *   - otherwise the handshake fails with TIMEOUT, with a message; a
 *     failed acceptor places nothing, a failed dialer only sockets that
 *     were answered honestly;
 *   - every connection it drops is closed, and nothing else is left open.
 * The deadline is 30 ms when the outcome is a timeout (the wait is all such
 * an input costs) and 10 s otherwise, so a loaded host never fails a
 * handshake that should succeed. */
#include "fuzz.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "boot/hmac.h"
#include "inter/tcp_priv.h"

#define HL_MAXCONN 6
#define HL_MAXSTEP 4
#define HL_LONG_MS 10000

static const uint8_t hl_key[HC_TP_KEY_BYTES] = "fuzz_tcphello's hello key......";

static struct {
    const uint8_t *p;
    size_t n;
} F;

static unsigned take8(void)
{
    if (!F.n)
        return 0;
    F.n--;
    return *F.p++;
}

static uint32_t take32(void)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 8 | take8();
    return v;
}

static uint64_t take64(void)
{
    uint64_t hi = take32();
    return hi << 32 | take32();
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    FUZZ_CHECK(d != NULL);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* The wire's MAC, written from tcp_hello.c's comment: HMAC(K, side | token
 * | acceptor | dialer | sock | nsocks | Nd | Na). */
static void hl_mac(const char side[4], uint64_t token, int acc, int dia, int sock, int ns,
                   const uint8_t *nd, const uint8_t *na, uint8_t out[HC_TP_MAC_BYTES])
{
    uint8_t m[4 + 8 + 16 + 2 * HC_TCP_NONCE];
    const uint32_t w[4] = { (uint32_t)acc, (uint32_t)dia, (uint32_t)sock, (uint32_t)ns };
    memcpy(m, side, 4);
    memcpy(m + 4, &token, 8);
    memcpy(m + 12, w, 16);
    memcpy(m + 28, nd, HC_TCP_NONCE);
    memcpy(m + 28 + HC_TCP_NONCE, na, HC_TCP_NONCE);
    hc_hmac_sha256(hl_key, sizeof hl_key, m, sizeof m, out);
}

/* Exactly len bytes within ms: 0, or -1 (closed, reset or late). */
static int hl_recv(int fd, void *buf, size_t len, int ms)
{
    size_t have = 0;
    while (have < len) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, ms) <= 0)
            return -1;
        ssize_t n = recv(fd, (char *)buf + have, len - have, 0);
        if (n <= 0)
            return -1;
        have += (size_t)n;
    }
    return 0;
}

static int hl_send(int fd, const void *buf, size_t len)
{
    return len == 0 || send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

static int hl_listen(uint16_t *port_out)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 32) == 0);
    FUZZ_CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    *port_out = ntohs(a.sin_port);
    return fd;
}

static int hl_dial(uint16_t port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons(port) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

static uint16_t port_of(int fd, int peer)
{
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    FUZZ_CHECK((peer ? getpeername(fd, (struct sockaddr *)&a, &al)
                     : getsockname(fd, (struct sockaddr *)&a, &al)) == 0);
    return ntohs(a.sin_port);
}

/* The transport under test: what tcp_create and hc_tcp_connect would have
 * set up for the handshake, with one endpoint of ns sockets. */
typedef struct hl_side {
    hc_transport_t tr;
    hc_ep_t ep, *eps[1];
    tcp_sock_t socks[2];
    tcp_addr_t all[4];
    int peers[1];
    hc_errbuf_t eb;
} hl_side_t;

static void side_init(hl_side_t *s, int me, int peer, int ns, uint64_t token)
{
    memset(s, 0, sizeof *s);
    hc_errbuf_init(&s->eb);
    hc_transport_t *tr = &s->tr;
    tr->p = (hc_transport_params_t){ .rank = me, .nranks = 4, .bind_addr = "127.0.0.1",
                                     .ifname = "fz", .log_rank = me, .timeout_ms = 30,
                                     .nsocks_perpeer = ns, .errbuf = &s->eb };
    snprintf(tr->bind_addr, sizeof tr->bind_addr, "127.0.0.1");
    tr->ip.s_addr = htonl(INADDR_LOOPBACK);
    tr->token = token;
    memcpy(tr->hkey, hl_key, sizeof tr->hkey);
    tr->mac = hc_hmac_sha256;
    tr->epfd = -1;
    uint16_t port;
    tr->listen_fd = hl_listen(&port);
    FUZZ_CHECK(fcntl(tr->listen_fd, F_SETFL, O_NONBLOCK) == 0);
    tr->port = port;
    s->ep = (hc_ep_t){ .tr = tr, .peer = peer, .nsocks = ns, .socks = s->socks };
    for (int k = 0; k < 2; k++)
        s->socks[k] = (tcp_sock_t){ .fd = -1, .ep = &s->ep };
    s->eps[0] = &s->ep;
    s->peers[0] = peer;
}

/* ---- acceptor role: strangers, then perhaps the peer -------------------- */

typedef struct hl_peer {
    uint16_t port;
    int me, lo, ns;
    uint64_t token;
    int fd[2];
    int chal_ok;  /* every challenge carried the acceptor's proof */
} hl_peer_t;

static void *peer_run(void *arg)
{
    hl_peer_t *pp = arg;
    pp->chal_ok = 1;
    for (int k = 0; k < pp->ns; k++) {
        int fd = pp->fd[k] = hl_dial(pp->port);
        tcp_hello_t h = { HC_TCP_HELLO_MAGIC, (uint32_t)pp->lo, (uint32_t)k, (uint32_t)pp->ns,
                          pp->token, { 0 } };
        FUZZ_CHECK(hc_tp_random(h.nonce, sizeof h.nonce) == 0);
        tcp_chal_t c;
        if (hl_send(fd, &h, sizeof h) != 0 || hl_recv(fd, &c, sizeof c, HL_LONG_MS) != 0) {
            pp->chal_ok = 0;
            return NULL;
        }
        uint8_t want[HC_TP_MAC_BYTES];
        hl_mac("acc", pp->token, pp->me, pp->lo, k, pp->ns, h.nonce, c.nonce, want);
        if (c.magic != HC_TCP_CHAL_MAGIC || memcmp(want, c.mac, sizeof want) != 0) {
            pp->chal_ok = 0;
            return NULL;
        }
        tcp_resp_t r = { HC_TCP_RESP_MAGIC, 0, { 0 } };
        hl_mac("dia", pp->token, pp->me, pp->lo, k, pp->ns, h.nonce, c.nonce, r.mac);
        FUZZ_CHECK(hl_send(fd, &r, sizeof r) == 0);
    }
    return NULL;
}

/* A stranger's bytes: a hello from fields, perhaps a response after it, or
 * raw bytes. Returns their length; *silent: keep the sending side open. */
static size_t stranger_bytes(const hl_side_t *s, uint8_t *b, int *silent)
{
    const unsigned mode = take8();
    const int lo = s->peers[0], ns = s->tr.p.nsocks_perpeer;
    tcp_hello_t h = { HC_TCP_HELLO_MAGIC, (uint32_t)lo, take8() % (unsigned)ns, (uint32_t)ns,
                      s->tr.token, { 0 } };
    *silent = (mode >> 7) & 1;
    switch (mode & 7) {
    case 0: break;                                 /* the peer's own hello */
    case 1: h.magic = take32(); break;
    case 2: h.rank = take8() % 6; break;           /* another position */
    case 3: h.sock_idx = take32(); break;
    case 4: h.nsocks = take8() % 4; break;
    case 5: h.token ^= (uint64_t)1 << (take8() % 64); break;
    default: {                                     /* raw bytes */
        size_t len = take8() % 121;
        for (size_t i = 0; i < len; i++)
            b[i] = (uint8_t)take8();
        return len;
    }
    }
    for (size_t i = 0; i < sizeof h.nonce; i++)
        h.nonce[i] = (uint8_t)take8();
    memcpy(b, &h, sizeof h);
    size_t len = sizeof h, cut = (mode >> 3) & 15;
    if (cut && cut < 8) /* a short hello */
        return cut * 5;
    if (cut >= 8) { /* a forged response after it: a right magic, the input's MAC */
        tcp_resp_t r = { HC_TCP_RESP_MAGIC, take32(), { 0 } };
        for (size_t i = 0; i < sizeof r.mac; i++)
            r.mac[i] = (uint8_t)take8();
        memcpy(b + len, &r, sizeof r);
        len += sizeof r - (cut == 15 ? 1 : 0);
    }
    return len;
}

static void run_acceptor(unsigned shape)
{
    const int ns = 1 + (int)((shape >> 1) & 1), me = 1 + (int)((shape >> 2) % 3);
    const int lo = (int)(take8() % (unsigned)me), nconn = (int)((shape >> 4) % (HL_MAXCONN + 1));
    const int with_peer = !((shape >> 7) & 1);
    hl_side_t *s = calloc(1, sizeof *s);
    FUZZ_CHECK(s != NULL);
    side_init(s, me, lo, ns, take64());
    int conn[HL_MAXCONN];
    uint8_t b[128];
    for (int k = 0; k < nconn; k++) {
        int silent;
        size_t len = stranger_bytes(s, b, &silent);
        conn[k] = hl_dial((uint16_t)s->tr.port);
        FUZZ_CHECK(hl_send(conn[k], b, len) == 0);
        if (!silent)
            shutdown(conn[k], SHUT_WR);
    }
    hl_peer_t pp = { .port = (uint16_t)s->tr.port, .me = me, .lo = lo, .ns = ns,
                     .token = s->tr.token, .fd = { -1, -1 } };
    pthread_t th = 0;
    if (with_peer)
        FUZZ_CHECK(pthread_create(&th, NULL, peer_run, &pp) == 0);
    const double deadline = hc_now_ms() + (with_peer ? HL_LONG_MS : 30);
    hcoll_status_t st = hc_tcp_handshake(&s->tr, s->all, s->peers, 1, s->eps, deadline);
    if (with_peer)
        pthread_join(th, NULL);
    FUZZ_SAY("tcphello: acceptor %d, peer %d, %d socket(s), %d strangers, peer %s: %s %s\n", me,
             lo, ns, nconn, with_peer ? "comes" : "does not", hcoll_strerror(st),
             hc_errbuf_get(&s->eb));
    if (with_peer) {
        FUZZ_CHECK(st == HCOLL_SUCCESS && pp.chal_ok);
        for (int k = 0; k < ns; k++)
            FUZZ_CHECK(port_of(s->socks[k].fd, 1) == port_of(pp.fd[k], 0));
    } else {
        FUZZ_CHECK(st == HCOLL_ERR_TIMEOUT && hc_errbuf_get(&s->eb)[0] != '\0');
        FUZZ_CHECK(s->socks[0].fd == -1 && s->socks[1].fd == -1);
    }
    for (int k = 0; k < 2; k++) {
        if (s->socks[k].fd >= 0)
            close(s->socks[k].fd);
        if (pp.fd[k] >= 0)
            close(pp.fd[k]);
    }
    for (int k = 0; k < nconn; k++)
        close(conn[k]);
    close(s->tr.listen_fd);
    hc_errbuf_fini(&s->eb);
    free(s);
}

/* ---- dialer role: the acceptor answers as the script says --------------- */

enum { S_HONEST, S_FLIP, S_SHORT, S_CLOSE };

typedef struct hl_step {
    int kind;
    size_t pos;   /* S_FLIP: the challenge's byte, and bit */
    int bit;
    size_t len;   /* S_SHORT: raw bytes sent */
    uint8_t raw[sizeof(tcp_chal_t)];
} hl_step_t;

typedef struct hl_acc {
    int listen_fd;
    int me, hi, ns;
    uint64_t token;
    hl_step_t steps[HL_MAXSTEP];
    int nsteps, go_away;
    int stop;       /* __atomic */
    int fd[2];      /* the honestly answered connection of each socket index */
    int placed;
    int hello_ok;   /* every hello named the dialer, its socket and our token */
    int resp_ok;    /* every response to an honest challenge proved the key */
    int answered_forged;
} hl_acc_t;

static int pad_byte(size_t pos)
{
    return pos >= offsetof(tcp_chal_t, pad) && pos < offsetof(tcp_chal_t, pad) + 4;
}

/* One accepted connection, answered as step says; the fd is closed unless
 * it is kept as a placed socket. */
static void acc_one(hl_acc_t *a, int fd, const hl_step_t *step)
{
    tcp_hello_t h;
    if (step->kind == S_CLOSE || hl_recv(fd, &h, sizeof h, HL_LONG_MS) != 0) {
        close(fd);
        return;
    }
    if (h.magic != HC_TCP_HELLO_MAGIC || h.rank != (uint32_t)a->me ||
        h.nsocks != (uint32_t)a->ns || h.sock_idx >= (uint32_t)a->ns || h.token != a->token) {
        a->hello_ok = 0;
        close(fd);
        return;
    }
    if (step->kind == S_SHORT) {
        (void)hl_send(fd, step->raw, step->len);
        close(fd);
        return;
    }
    tcp_chal_t c = { HC_TCP_CHAL_MAGIC, 0, { 0 }, { 0 } };
    FUZZ_CHECK(hc_tp_random(c.nonce, sizeof c.nonce) == 0);
    hl_mac("acc", a->token, a->hi, a->me, (int)h.sock_idx, a->ns, h.nonce, c.nonce, c.mac);
    uint8_t want[HC_TP_MAC_BYTES];
    hl_mac("dia", a->token, a->hi, a->me, (int)h.sock_idx, a->ns, h.nonce, c.nonce, want);
    const int forged = step->kind == S_FLIP && !pad_byte(step->pos);
    if (step->kind == S_FLIP)
        ((uint8_t *)&c)[step->pos] ^= (uint8_t)(1u << step->bit);
    tcp_resp_t r;
    if (hl_send(fd, &c, sizeof c) != 0 || hl_recv(fd, &r, sizeof r, HL_LONG_MS) != 0) {
        close(fd);
        return;
    }
    if (forged) {
        a->answered_forged = 1;
        close(fd);
        return;
    }
    if (r.magic != HC_TCP_RESP_MAGIC || memcmp(r.mac, want, sizeof want) != 0 ||
        a->fd[h.sock_idx] >= 0) {
        a->resp_ok = 0;
        close(fd);
        return;
    }
    a->fd[h.sock_idx] = fd;
    a->placed++;
}

static void *acc_run(void *arg)
{
    hl_acc_t *a = arg;
    const hl_step_t honest = { .kind = S_HONEST };
    int used = 0;
    while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
        if (used >= a->nsteps && a->go_away) {
            poll(NULL, 0, 2);
            continue;
        }
        struct pollfd p = { a->listen_fd, POLLIN, 0 };
        if (poll(&p, 1, 5) <= 0)
            continue;
        int fd = accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        acc_one(a, fd, used < a->nsteps ? &a->steps[used] : &honest);
        used++;
    }
    return NULL;
}

/* What the dialer must do with this script, taking the steps in order. */
static hcoll_status_t expected(const hl_acc_t *a)
{
    int placed = 0;
    for (int i = 0; i < a->nsteps; i++) {
        const hl_step_t *s = &a->steps[i];
        if (s->kind == S_FLIP && !pad_byte(s->pos))
            return HCOLL_ERR_MISMATCH;
        if ((s->kind == S_HONEST || s->kind == S_FLIP) && ++placed == a->ns)
            return HCOLL_SUCCESS;
    }
    return a->go_away ? HCOLL_ERR_TIMEOUT : HCOLL_SUCCESS;
}

static void run_dialer(unsigned shape)
{
    const int ns = 1 + (int)((shape >> 1) & 1), me = (int)((shape >> 2) % 3);
    const int hi = me + 1 + (int)(take8() % (unsigned)(3 - me));
    hl_side_t *s = calloc(1, sizeof *s);
    hl_acc_t *a = calloc(1, sizeof *a);
    FUZZ_CHECK(s && a);
    side_init(s, me, hi, ns, take64());
    uint16_t port;
    *a = (hl_acc_t){ .listen_fd = hl_listen(&port), .me = me, .hi = hi, .ns = ns,
                     .token = take64(), .go_away = (shape >> 6) & 1,
                     .fd = { -1, -1 }, .hello_ok = 1, .resp_ok = 1 };
    s->all[hi] = (tcp_addr_t){ HC_TCP_ADDR_MAGIC, htonl(INADDR_LOOPBACK), port, (uint32_t)hi,
                               a->token };
    a->nsteps = (int)(take8() % (HL_MAXSTEP + 1));
    for (int i = 0; i < a->nsteps; i++) {
        hl_step_t *sp = &a->steps[i];
        sp->kind = (int)(take8() % 4);
        sp->pos = take8() % sizeof(tcp_chal_t);
        sp->bit = (int)(take8() % 8);
        sp->len = take8() % sizeof(tcp_chal_t);
        for (size_t k = 0; k < sp->len; k++)
            sp->raw[k] = (uint8_t)take8();
    }
    const hcoll_status_t want = expected(a);
    pthread_t th;
    FUZZ_CHECK(pthread_create(&th, NULL, acc_run, a) == 0);
    const double deadline = hc_now_ms() + (want == HCOLL_ERR_TIMEOUT ? 30 : HL_LONG_MS);
    hcoll_status_t st = hc_tcp_handshake(&s->tr, s->all, s->peers, 1, s->eps, deadline);
    __atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    FUZZ_SAY("tcphello: dialer %d, peer %d, %d socket(s), %d step(s)%s: %s (expected %s) %s\n",
             me, hi, ns, a->nsteps, a->go_away ? ", then none" : "", hcoll_strerror(st),
             hcoll_strerror(want), hc_errbuf_get(&s->eb));
    FUZZ_CHECK(a->hello_ok && a->resp_ok && !a->answered_forged);
    FUZZ_CHECK(st == want);
    if (st == HCOLL_SUCCESS)
        FUZZ_CHECK(a->placed == ns);
    else
        FUZZ_CHECK(hc_errbuf_get(&s->eb)[0] != '\0');
    /* A socket in place (on failure too: the endpoint's, closed with it)
     * is the one answered honestly for its index. */
    for (int k = 0; k < ns; k++)
        if (s->socks[k].fd >= 0)
            FUZZ_CHECK(a->fd[k] >= 0 && port_of(s->socks[k].fd, 0) == port_of(a->fd[k], 1));
    for (int k = 0; k < 2; k++) {
        if (s->socks[k].fd >= 0)
            close(s->socks[k].fd);
        if (a->fd[k] >= 0)
            close(a->fd[k]);
    }
    close(a->listen_fd);
    close(s->tr.listen_fd);
    hc_errbuf_fini(&s->eb);
    free(a);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 2048)
        return 0;
    F.p = data;
    F.n = size;
    const int fds_before = open_fds();
    const unsigned shape = take8();
    if (shape & 1)
        run_dialer(shape);
    else
        run_acceptor(shape);
    FUZZ_CHECK(open_fds() == fds_before);
    return 0;
}
