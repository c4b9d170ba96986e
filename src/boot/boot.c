/*
 * The bootstrap star (see boot.h for the protocol):
 *
 *   rendezvous                         set-up collectives
 *   rank k ──connect──► root           rank k ── UP(len) ──► root
 *          ◄─CHALLENGE─                                    gathers all
 *          ──AUTH─────►                rank k ◄─ DOWN(nranks*len) ── root
 *          ◄─AUTH_OK───
 *          ──RECORD───►
 *          ◄─TABLE──── (once all ranks are in)
 *
 * The root's rendezvous is one poll loop over the listener, the
 * not-yet-authenticated connections (each a small state machine fed by
 * non-blocking reads) and the registered ranks (watched for EOF), so that a
 * slow or hostile connection never stalls the others.
 */
#include "boot/boot.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "boot/hmac.h"
#include "base/log.h"

#define WIRE_MAGIC 0x48434254u /* "HCBT" */
#define WIRE_VERSION 1u
#define HDR_BYTES 16
#define NONCE_BYTES 32
#define MAC_BYTES HC_SHA256_BYTES
#define AUTH_BYTES (12 + NONCE_BYTES + MAC_BYTES)
#define ERRTEXT_MAX 256
#define CONNECT_RETRY_MS 50

enum msg_type {
    MSG_CHALLENGE = 1,
    MSG_AUTH = 2,
    MSG_AUTH_OK = 3,
    MSG_RECORD = 4,
    MSG_TABLE = 5,
    MSG_ERROR = 6,
    MSG_UP = 7,
    MSG_DOWN = 8,
};

enum coll_op { OP_ALLGATHER = 1, OP_BCAST = 2, OP_BARRIER = 3 };
static const char *const op_names[] = { "?", "allgather", "bcast", "barrier" };

typedef struct hdr {
    uint32_t magic;
    uint16_t version, type;
    uint32_t len, arg;
} hdr_t;

struct hc_boot {
    int rank, nranks;
    int64_t timeout_ms;
    hc_errbuf_t *eb;
    /* Root: conn[r] for r >= 1. Other ranks: conn[0] is the root. */
    int *conn;
    int abort_fd;
    atomic_int aborted;
    atomic_int broken; /* hcoll_status_t that broke it */
    uint32_t seq;
    hc_sockaddr_t root;
    pthread_mutex_t call_lock;
    int saved_errno;
};

/* ------------------------------------------------------------------------ */

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void hdr_pack(unsigned char *p, unsigned type, uint32_t len, uint32_t arg)
{
    put32(p, WIRE_MAGIC);
    p[4] = (unsigned char)(WIRE_VERSION >> 8), p[5] = (unsigned char)WIRE_VERSION;
    p[6] = (unsigned char)(type >> 8), p[7] = (unsigned char)type;
    put32(p + 8, len);
    put32(p + 12, arg);
}

static void hdr_unpack(const unsigned char *p, hdr_t *h)
{
    h->magic = get32(p);
    h->version = (uint16_t)(p[4] << 8 | p[5]);
    h->type = (uint16_t)(p[6] << 8 | p[7]);
    h->len = get32(p + 8);
    h->arg = get32(p + 12);
}

/* Longest message body of each type a receiver is ever willing to read,
 * before it compares with the exact length it expects. */
static int hdr_sane(const hdr_t *h, char *why, size_t whylen)
{
    if (h->magic != WIRE_MAGIC) {
        snprintf(why, whylen, "bad magic 0x%08x", h->magic);
        return 0;
    }
    if (h->version != WIRE_VERSION) {
        snprintf(why, whylen, "protocol version %u (this library speaks %u)", h->version,
                 WIRE_VERSION);
        return 0;
    }
    if (h->type < MSG_CHALLENGE || h->type > MSG_DOWN) {
        snprintf(why, whylen, "unknown message type %u", h->type);
        return 0;
    }
    if (h->type == MSG_ERROR && h->len > ERRTEXT_MAX) {
        snprintf(why, whylen, "error text of %u bytes (at most %d)", h->len, ERRTEXT_MAX);
        return 0;
    }
    return 1;
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static const char *peer_str(int fd, char *buf, size_t len)
{
    hc_sockaddr_t a;
    socklen_t l = sizeof a;
    memset(&a, 0, sizeof a);
    if (getpeername(fd, &a.sa, &l) != 0)
        snprintf(buf, len, "(unknown peer)");
    else
        hc_sockaddr_str(&a, buf, len);
    return buf;
}

/* Keep what a peer sent us printable before it goes into a log line. */
static void sanitize(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            *s = '?';
}

static int is_aborted(hc_boot_t *b)
{
    return atomic_load(&b->aborted);
}

static hcoll_status_t aborted_err(hc_boot_t *b, const char *what)
{
    return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_ABORTED,
                      "%s: the communicator was aborted", what);
}

/*
 * Wait until fd is ready for events, the deadline passes or the boot is
 * aborted. Returns SUCCESS, TIMEOUT or ABORTED without recording an error:
 * the caller knows what it was waiting for.
 */
static hcoll_status_t wait_fd(hc_boot_t *b, int fd, short events, double deadline)
{
    for (;;) {
        if (is_aborted(b))
            return HCOLL_ERR_ABORTED;
        double left = deadline - hc_now_ms();
        if (left <= 0)
            return HCOLL_ERR_TIMEOUT;
        struct pollfd p[2] = { { fd, events, 0 }, { b->abort_fd, POLLIN, 0 } };
        int n = poll(p, 2, (int)(left + 0.999));
        if (n < 0 && errno != EINTR) {
            b->saved_errno = errno;
            return HCOLL_ERR_SYSTEM;
        }
        if (n > 0 && p[1].revents)
            return HCOLL_ERR_ABORTED;
        if (n > 0 && p[0].revents)
            return HCOLL_SUCCESS;
    }
}

/* Full send/receive on a non-blocking socket. EOF, reset and broken pipe
 * are HCOLL_ERR_PEER_FAILED; the caller words the error. */
static hcoll_status_t io_send(hc_boot_t *b, int fd, const void *buf, size_t len, double deadline)
{
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            hcoll_status_t st = wait_fd(b, fd, POLLOUT, deadline);
            if (st != HCOLL_SUCCESS)
                return st;
            continue;
        }
        b->saved_errno = n < 0 ? errno : EPIPE;
        return HCOLL_ERR_PEER_FAILED;
    }
    return HCOLL_SUCCESS;
}

static hcoll_status_t io_recv(hc_boot_t *b, int fd, void *buf, size_t len, double deadline)
{
    char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) {
            b->saved_errno = 0;
            return HCOLL_ERR_PEER_FAILED;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            hcoll_status_t st = wait_fd(b, fd, POLLIN, deadline);
            if (st != HCOLL_SUCCESS)
                return st;
            continue;
        }
        b->saved_errno = errno;
        return HCOLL_ERR_PEER_FAILED;
    }
    return HCOLL_SUCCESS;
}

static hcoll_status_t send_msg(hc_boot_t *b, int fd, unsigned type, uint32_t arg,
                               const void *body, size_t len, double deadline)
{
    unsigned char h[HDR_BYTES];
    hdr_pack(h, type, (uint32_t)len, arg);
    hcoll_status_t st = io_send(b, fd, h, sizeof h, deadline);
    if (st == HCOLL_SUCCESS && len)
        st = io_send(b, fd, body, len, deadline);
    return st;
}

/* Words a failed transfer with peer `who` during `what`, and records it. */
static hcoll_status_t io_err(hc_boot_t *b, hcoll_status_t st, int who, const char *what,
                             int64_t waited_ms)
{
    switch (st) {
    case HCOLL_ERR_ABORTED:
        return aborted_err(b, what);
    case HCOLL_ERR_TIMEOUT:
        return hc_err_set(b->eb, HC_BOOT, b->rank, st,
                          "%s: rank %d did not answer within %lld ms (HCOLL_TIMEOUT_MS)", what,
                          who, (long long)waited_ms);
    case HCOLL_ERR_PEER_FAILED:
        if (b->saved_errno)
            return hc_err_set(b->eb, HC_BOOT, b->rank, st, "%s: connection to rank %d failed: %s",
                              what, who, strerror(b->saved_errno));
        return hc_err_set(b->eb, HC_BOOT, b->rank, st,
                          "%s: rank %d closed its connection (it failed or aborted)", what, who);
    default:
        return hc_err_set(b->eb, HC_BOOT, b->rank, st, "%s: poll: %s", what,
                          strerror(b->saved_errno));
    }
}

static hcoll_status_t status_from_wire(uint32_t v)
{
    if (v <= HCOLL_IN_PROGRESS || v >= HCOLL_STATUS_COUNT_)
        return HCOLL_ERR_PEER_FAILED;
    return (hcoll_status_t)v;
}

/*
 * Receive one message of the given type, arg and exact length from rank
 * who. An ERROR message instead becomes this call's error, carrying the
 * sender's status and text.
 */
static hcoll_status_t recv_msg(hc_boot_t *b, int fd, int who, unsigned type, uint32_t arg,
                               void *body, size_t len, double deadline, const char *what)
{
    unsigned char hb[HDR_BYTES];
    const double t0 = hc_now_ms();
    hcoll_status_t st = io_recv(b, fd, hb, sizeof hb, deadline);
    if (st != HCOLL_SUCCESS)
        return io_err(b, st, who, what, (int64_t)(deadline - t0));
    hdr_t h;
    char why[96];
    hdr_unpack(hb, &h);
    if (!hdr_sane(&h, why, sizeof why))
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NETWORK,
                          "%s: rank %d sent a malformed message (%s)", what, who, why);
    if (h.type == MSG_ERROR) {
        char text[ERRTEXT_MAX + 1];
        st = io_recv(b, fd, text, h.len, deadline);
        text[st == HCOLL_SUCCESS ? h.len : 0] = '\0';
        sanitize(text);
        return hc_err_set(b->eb, HC_BOOT, b->rank, status_from_wire(h.arg),
                          "%s: rank %d reports: %s", what, who, text[0] ? text : "(no text)");
    }
    if (h.type != type || h.arg != arg) {
        if (h.type == type && (type == MSG_UP || type == MSG_DOWN)) {
            unsigned op = h.arg >> 24, myop = arg >> 24;
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_MISMATCH,
                              "%s: rank %d is in %s #%u while this rank is in %s #%u "
                              "(set-up collectives called in a different order)",
                              what, who, op < 4 ? op_names[op] : "?", h.arg & 0xffffff,
                              myop < 4 ? op_names[myop] : "?", arg & 0xffffff);
        }
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NETWORK,
                          "%s: rank %d sent message type %u where %u was expected", what, who,
                          h.type, type);
    }
    if (h.len != len)
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_MISMATCH,
                          "%s: rank %d sent %u bytes where %zu were expected (len differs "
                          "between ranks)",
                          what, who, h.len, len);
    if (len) {
        st = io_recv(b, fd, body, len, deadline);
        if (st != HCOLL_SUCCESS)
            return io_err(b, st, who, what, (int64_t)(deadline - t0));
    }
    return HCOLL_SUCCESS;
}

/* Best-effort ERROR to a peer that we are about to leave: never blocks. */
static void send_error_nb(int fd, hcoll_status_t st, const char *text)
{
    unsigned char m[HDR_BYTES + ERRTEXT_MAX];
    size_t n = strlen(text);
    if (n > ERRTEXT_MAX)
        n = ERRTEXT_MAX;
    hdr_pack(m, MSG_ERROR, (uint32_t)n, (uint32_t)st);
    memcpy(m + HDR_BYTES, text, n);
    ssize_t r = send(fd, m, HDR_BYTES + n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)r;
}

static const char *errtext(hc_boot_t *b)
{
    return hc_errbuf_get(b->eb ? b->eb : hc_errbuf_thread());
}

/*
 * A collective failed half-way: nothing can be resumed consistently, so
 * the root tells every rank why and every connection is shut (not closed,
 * so that another thread's poll on it stays valid until destroy).
 */
static void boot_break(hc_boot_t *b, hcoll_status_t st)
{
    int expected = HCOLL_SUCCESS;
    if (!atomic_compare_exchange_strong(&b->broken, &expected, (int)st))
        return;
    if (b->rank == 0) {
        for (int r = 1; r < b->nranks; r++) {
            if (b->conn[r] < 0)
                continue;
            if (st != HCOLL_ERR_ABORTED)
                send_error_nb(b->conn[r], st, errtext(b));
            shutdown(b->conn[r], SHUT_RDWR);
        }
    } else if (b->conn[0] >= 0) {
        shutdown(b->conn[0], SHUT_RDWR);
    }
}

/* ------------------------------------------------------------------------ */
/* Keys and MACs                                                             */
/* ------------------------------------------------------------------------ */

void hc_boot_key_from_string(const char *secret, unsigned char key_out[HC_BOOT_KEY_BYTES])
{
    hc_sha256_t s;
    hc_sha256_init(&s);
    hc_sha256_update(&s, "hcoll-secret-v1:", 16);
    hc_sha256_update(&s, secret, strlen(secret));
    hc_sha256_final(&s, key_out);
}

void hc_boot_key_public(unsigned char key_out[HC_BOOT_KEY_BYTES])
{
    hc_sha256("hcoll-unauthenticated-v1", 24, key_out);
}

static void auth_mac(const unsigned char *key, char side, const unsigned char *nonce_s,
                     const unsigned char *nonce_c, uint32_t rank, uint32_t nranks,
                     uint32_t rec_len, unsigned char out[MAC_BYTES])
{
    unsigned char nums[13];
    nums[0] = (unsigned char)side;
    put32(nums + 1, rank);
    put32(nums + 5, nranks);
    put32(nums + 9, rec_len);
    hc_hmac_t h;
    hc_hmac_init(&h, key, HC_BOOT_KEY_BYTES);
    hc_hmac_update(&h, "hcoll-boot-v1", 13);
    hc_hmac_update(&h, nonce_s, NONCE_BYTES);
    hc_hmac_update(&h, nonce_c, NONCE_BYTES);
    hc_hmac_update(&h, nums, sizeof nums);
    hc_hmac_final(&h, out);
}

/* ------------------------------------------------------------------------ */
/* Listening                                                                 */
/* ------------------------------------------------------------------------ */

int hc_boot_listen(const hc_sockaddr_t *addr, hc_sockaddr_t *addr_out, char *err, size_t errlen)
{
    char as[80];
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (addr->sa.sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, &addr->sa, hc_sockaddr_len(addr)) != 0) {
        snprintf(err, errlen, "cannot bind the rendezvous listener to %s: %s%s",
                 hc_sockaddr_str(addr, as, sizeof as), strerror(errno),
                 errno == EADDRNOTAVAIL ? " (the root address must be one of rank 0's own)" : "");
        close(fd);
        return -1;
    }
    if (listen(fd, 128) != 0) {
        snprintf(err, errlen, "listen on %s: %s", hc_sockaddr_str(addr, as, sizeof as),
                 strerror(errno));
        close(fd);
        return -1;
    }
    if (addr_out) {
        socklen_t l = sizeof *addr_out;
        memset(addr_out, 0, sizeof *addr_out);
        getsockname(fd, &addr_out->sa, &l);
    }
    return fd;
}

/* ------------------------------------------------------------------------ */
/* Root side of the rendezvous                                               */
/* ------------------------------------------------------------------------ */

enum pend_state { P_AUTH_HDR, P_AUTH_BODY, P_REC_HDR, P_REC_BODY };

typedef struct pend {
    int fd;
    int state;
    int rank;       /* claimed, once authenticated */
    double deadline;
    uint64_t born;  /* arrival order, for evicting the oldest */
    size_t got;
    unsigned char buf[HDR_BYTES + AUTH_BYTES];
    unsigned char nonce_s[NONCE_BYTES];
    char peer[64];
} pend_t;

typedef struct root_ctx {
    hc_boot_t *b;
    const unsigned char *key;
    size_t rec_len;
    unsigned char *recs;
    pend_t pend[HC_BOOT_PENDING_MAX];
    int npend;
    uint64_t born_seq;
    char *claimed; /* nranks: authenticated (pending or registered) */
    int nreg;
    double auth_ms;
} root_ctx_t;

static void pend_drop(root_ctx_t *rc, int i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pend_drop(root_ctx_t *rc, int i, const char *fmt, ...)
{
    pend_t *p = &rc->pend[i];
    if (fmt) {
        char why[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        HC_WARN(HC_BOOT, 0, "bootstrap: dropped connection from %s: %s", p->peer, why);
    }
    if (p->state >= P_REC_HDR)
        rc->claimed[p->rank] = 0;
    close(p->fd);
    rc->pend[i] = rc->pend[--rc->npend];
}

static void pend_reject(root_ctx_t *rc, int i, hcoll_status_t st, const char *text)
{
    send_error_nb(rc->pend[i].fd, st, text);
    pend_drop(rc, i, "%s", text);
}

static void root_accept(root_ctx_t *rc, int lfd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* Out of fds: the listener stays readable, so pause rather than
             * spin until the deadline. Anything else is EAGAIN or transient. */
            if (errno == EMFILE || errno == ENFILE)
                usleep(10 * 1000);
            return;
        }
        if (rc->npend == HC_BOOT_PENDING_MAX) {
            /* Evict the oldest: a flood of idle connections then delays a
             * real rank by at most one retry instead of locking it out. */
            int old = 0;
            for (int i = 1; i < rc->npend; i++)
                if (rc->pend[i].born < rc->pend[old].born)
                    old = i;
            pend_drop(rc, old, "too many unauthenticated connections (at most %d); "
                               "dropping the oldest", HC_BOOT_PENDING_MAX);
        }
        pend_t *p = &rc->pend[rc->npend++];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->state = P_AUTH_HDR;
        p->rank = -1;
        p->born = rc->born_seq++;
        p->deadline = hc_now_ms() + rc->auth_ms;
        peer_str(fd, p->peer, sizeof p->peer);
        set_nodelay(fd);
        unsigned char m[HDR_BYTES + NONCE_BYTES];
        if (hc_random_bytes(p->nonce_s, NONCE_BYTES) != 0) {
            pend_drop(rc, rc->npend - 1, "getrandom: %s", strerror(errno));
            continue;
        }
        hdr_pack(m, MSG_CHALLENGE, NONCE_BYTES, 0);
        memcpy(m + HDR_BYTES, p->nonce_s, NONCE_BYTES);
        /* A fresh socket's send buffer is empty, so this never blocks; a
         * short write means the peer is already gone. */
        if (send(fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof m)
            pend_drop(rc, rc->npend - 1, "could not send the challenge");
        else
            HC_TRACE(HC_BOOT, 0, "bootstrap: connection from %s, challenge sent", p->peer);
    }
}

static int looks_like_http(const unsigned char *b)
{
    static const char *const verbs[] = { "GET ", "POST", "HEAD", "PUT ", "OPTI", "CONN",
                                         "DELE", "PATC", "PRI " };
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (memcmp(b, verbs[i], 4) == 0)
            return 1;
    return 0;
}

/* Check the AUTH body; returns 1 when the connection is now authenticated
 * and answered, 0 when it was dropped. */
static int root_auth(root_ctx_t *rc, int i)
{
    pend_t *p = &rc->pend[i];
    hc_boot_t *b = rc->b;
    const unsigned char *a = p->buf + HDR_BYTES;
    uint32_t rank = get32(a), nranks = get32(a + 4), rec_len = get32(a + 8);
    const unsigned char *nonce_c = a + 12, *mac = a + 12 + NONCE_BYTES;
    unsigned char want[MAC_BYTES];
    char text[160];

    /* The MAC first: nothing an unauthenticated peer claims is looked at. */
    auth_mac(rc->key, 'C', p->nonce_s, nonce_c, rank, nranks, rec_len, want);
    if (!hc_ct_equal(want, mac, MAC_BYTES)) {
        pend_reject(rc, i, HCOLL_ERR_MISMATCH,
                    "authentication failed: the peer does not hold this job's secret "
                    "(wrong unique id or HCOLL_SECRET)");
        return 0;
    }
    if (nranks != (uint32_t)b->nranks || rec_len != rc->rec_len) {
        snprintf(text, sizeof text,
                 "rank %u was started with nranks %u (record %u bytes) but the root has "
                 "nranks %d (record %zu bytes)",
                 rank, nranks, rec_len, b->nranks, rc->rec_len);
        pend_reject(rc, i, HCOLL_ERR_MISMATCH, text);
        return 0;
    }
    if (rank == 0 || rank >= nranks) {
        snprintf(text, sizeof text, "rank %u is not a valid non-root rank of %u", rank, nranks);
        pend_reject(rc, i, HCOLL_ERR_INVALID_ARG, text);
        return 0;
    }
    if (rc->claimed[rank]) {
        snprintf(text, sizeof text, "duplicate rank %u: another process already joined as rank %u",
                 rank, rank);
        pend_reject(rc, i, HCOLL_ERR_INVALID_ARG, text);
        return 0;
    }
    unsigned char m[HDR_BYTES + MAC_BYTES];
    hdr_pack(m, MSG_AUTH_OK, MAC_BYTES, 0);
    auth_mac(rc->key, 'S', p->nonce_s, nonce_c, rank, nranks, rec_len, m + HDR_BYTES);
    if (send(p->fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof m) {
        pend_drop(rc, i, "rank %u: could not send the authentication answer", rank);
        return 0;
    }
    p->rank = (int)rank;
    p->state = P_REC_HDR;
    p->got = 0;
    rc->claimed[rank] = 1;
    HC_TRACE(HC_BOOT, 0, "bootstrap: %s authenticated as rank %u", p->peer, rank);
    return 1;
}

/* Feed one readable pending connection. Returns 1 when it became a
 * registered rank (and left the pending table), 0 otherwise. */
static int root_pend_progress(root_ctx_t *rc, int i)
{
    hc_boot_t *b = rc->b;
    for (;;) {
        pend_t *p = &rc->pend[i];
        unsigned char *dst;
        size_t need;
        switch (p->state) {
        case P_AUTH_HDR: dst = p->buf + p->got, need = HDR_BYTES; break;
        case P_AUTH_BODY: dst = p->buf + p->got, need = HDR_BYTES + AUTH_BYTES; break;
        case P_REC_HDR: dst = p->buf + p->got, need = HDR_BYTES; break;
        default: /* the record lands straight in its slot of the table */
            dst = rc->recs + (size_t)p->rank * rc->rec_len + (p->got - HDR_BYTES);
            need = HDR_BYTES + rc->rec_len;
            break;
        }
        ssize_t n = need > p->got ? recv(p->fd, dst, need - p->got, 0) : 0;
        if (n == 0 && need > p->got) {
            if (p->state == P_AUTH_HDR && p->got == 0)
                pend_drop(rc, i, "closed before sending anything (a port scan?)");
            else
                pend_drop(rc, i, "closed during the handshake after %zu bytes", p->got);
            return 0;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                pend_drop(rc, i, "recv: %s", strerror(errno));
            return 0;
        }
        p->got += (size_t)n;
        if (p->got < need)
            continue;

        hdr_t h;
        char why[96];
        switch (p->state) {
        case P_AUTH_HDR:
            hdr_unpack(p->buf, &h);
            if (h.magic != WIRE_MAGIC) {
                pend_drop(rc, i, "not an hcoll bootstrap client (%s)",
                          looks_like_http(p->buf) ? "an HTTP request" : "bad magic");
                return 0;
            }
            if (!hdr_sane(&h, why, sizeof why)) {
                pend_drop(rc, i, "%s", why);
                return 0;
            }
            if (h.type != MSG_AUTH || h.len != AUTH_BYTES) {
                pend_drop(rc, i, "expected an AUTH message of %d bytes, got type %u with "
                                 "length %u", AUTH_BYTES, h.type, h.len);
                return 0;
            }
            p->state = P_AUTH_BODY;
            break;
        case P_AUTH_BODY:
            if (!root_auth(rc, i))
                return 0;
            break;
        case P_REC_HDR:
            hdr_unpack(p->buf, &h);
            if (!hdr_sane(&h, why, sizeof why) || h.type != MSG_RECORD || h.len != rc->rec_len) {
                pend_drop(rc, i, "rank %d: expected its record (%zu bytes), got type %u length %u",
                          p->rank, rc->rec_len, h.type, h.len);
                return 0;
            }
            p->state = P_REC_BODY;
            break;
        default:
            b->conn[p->rank] = p->fd;
            rc->nreg++;
            HC_TRACE(HC_BOOT, 0, "bootstrap: rank %d joined from %s (%d of %d)", p->rank,
                     p->peer, rc->nreg + 1, b->nranks);
            rc->pend[i] = rc->pend[--rc->npend];
            return 1;
        }
    }
}

/* "3,5-7" */
static void format_ranks(const char *present, int n, char *out, size_t len)
{
    size_t o = 0;
    out[0] = '\0';
    for (int r = 0; r < n && o + 16 < len; r++) {
        if (present[r])
            continue;
        int e = r;
        while (e + 1 < n && !present[e + 1])
            e++;
        o += (size_t)snprintf(out + o, len - o, e > r ? "%s%d-%d" : "%s%d", o ? "," : "", r, e);
        r = e;
    }
    if (o + 16 >= len)
        snprintf(out + len - 5, 5, "...");
}

static hcoll_status_t root_rendezvous(hc_boot_t *b, int lfd, const unsigned char *key,
                                      const void *rec, size_t rec_len, unsigned char *recs)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const double t0 = hc_now_ms(), deadline = t0 + (double)b->timeout_ms;
    root_ctx_t *rc = calloc(1, sizeof *rc);
    struct pollfd *pf = calloc((size_t)b->nranks + HC_BOOT_PENDING_MAX + 2, sizeof *pf);
    char *claimed = calloc((size_t)b->nranks, 1);
    if (!rc || !pf || !claimed) {
        st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_NO_MEMORY, "bootstrap: out of memory");
        goto out;
    }
    rc->b = b;
    rc->key = key;
    rc->rec_len = rec_len;
    rc->recs = recs;
    rc->claimed = claimed;
    claimed[0] = 1;
    memcpy(recs, rec, rec_len);
    {
        double a = (double)b->timeout_ms / 4;
        rc->auth_ms = a < 1000 ? 1000 : a > 10000 ? 10000 : a;
    }

    while (rc->nreg < b->nranks - 1) {
        double now = hc_now_ms();
        /* Expire unauthenticated connections that took too long. */
        for (int i = 0; i < rc->npend;) {
            if (now >= rc->pend[i].deadline)
                pend_drop(rc, i, "did not complete the handshake within %.0f ms", rc->auth_ms);
            else
                i++;
        }
        if (now >= deadline) {
            char missing[200];
            char *present = calloc((size_t)b->nranks, 1);
            if (present) {
                present[0] = 1;
                for (int r = 1; r < b->nranks; r++)
                    present[r] = b->conn[r] >= 0;
                format_ranks(present, b->nranks, missing, sizeof missing);
                free(present);
            } else {
                snprintf(missing, sizeof missing, "?");
            }
            st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_TIMEOUT,
                            "init: rank(s) %s of %d never joined within %lld ms "
                            "(HCOLL_TIMEOUT_MS); %d of %d ranks are here",
                            missing, b->nranks, (long long)b->timeout_ms, rc->nreg + 1, b->nranks);
            goto fail;
        }
        double wake = deadline;
        for (int i = 0; i < rc->npend; i++)
            if (rc->pend[i].deadline < wake)
                wake = rc->pend[i].deadline;

        int np = 0;
        pf[np++] = (struct pollfd){ b->abort_fd, POLLIN, 0 };
        pf[np++] = (struct pollfd){ lfd, POLLIN, 0 };
        for (int i = 0; i < rc->npend; i++)
            pf[np++] = (struct pollfd){ rc->pend[i].fd, POLLIN, 0 };
        const int reg0 = np;
        for (int r = 1; r < b->nranks; r++)
            if (b->conn[r] >= 0)
                pf[np++] = (struct pollfd){ b->conn[r], POLLIN, 0 };
        int n = poll(pf, (nfds_t)np, (int)(wake - now + 0.999));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_SYSTEM, "init: poll: %s",
                            strerror(errno));
            goto fail;
        }
        if (n == 0)
            continue;
        if (pf[0].revents) {
            st = aborted_err(b, "init");
            goto fail;
        }
        /* A registered rank must stay silent until the table: readable
         * means it died (EOF) or broke protocol. */
        for (int k = reg0; k < np; k++) {
            if (!pf[k].revents)
                continue;
            int r = 1;
            while (b->conn[r] != pf[k].fd)
                r++;
            st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_PEER_FAILED,
                            "init: rank %d closed its connection before every rank had "
                            "joined (it failed or was killed)",
                            r);
            goto fail;
        }
        /* Pending connections: walk a snapshot of the fds, since progress
         * reorders the table. */
        for (int k = 2; k < reg0; k++) {
            if (!pf[k].revents)
                continue;
            for (int i = 0; i < rc->npend; i++) {
                if (rc->pend[i].fd == pf[k].fd) {
                    root_pend_progress(rc, i);
                    break;
                }
            }
        }
        if (pf[1].revents)
            root_accept(rc, lfd);
    }

    while (rc->npend > 0)
        pend_drop(rc, 0, "every rank has joined; the rendezvous is closed");
    close(lfd);
    lfd = -1;
    for (int r = 1; r < b->nranks; r++) {
        st = send_msg(b, b->conn[r], MSG_TABLE, 0, recs, (size_t)b->nranks * rec_len, deadline);
        if (st != HCOLL_SUCCESS) {
            st = io_err(b, st, r, "init: sending the rank table", b->timeout_ms);
            goto fail;
        }
    }
    HC_INFO(HC_BOOT, 0, "bootstrap: all %d ranks joined in %.0f ms", b->nranks, hc_now_ms() - t0);
    goto out;

fail:
    while (rc->npend > 0)
        pend_drop(rc, 0, NULL);
    for (int r = 1; r < b->nranks; r++) {
        if (b->conn[r] >= 0) {
            send_error_nb(b->conn[r], st, errtext(b));
            shutdown(b->conn[r], SHUT_RDWR);
        }
    }
out:
    if (lfd >= 0)
        close(lfd);
    free(claimed);
    free(pf);
    free(rc);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Rank side of the rendezvous                                               */
/* ------------------------------------------------------------------------ */

/* Connect with retries until the deadline: the root may not listen yet. */
static hcoll_status_t client_connect(hc_boot_t *b, double deadline, int *fd_out)
{
    char as[80];
    int last_err = 0;
    while (!is_aborted(b)) {
        int fd = socket(b->root.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_SYSTEM, "init: socket: %s",
                              strerror(errno));
        int rc = connect(fd, &b->root.sa, hc_sockaddr_len(&b->root));
        if (rc != 0 && errno == EINPROGRESS) {
            hcoll_status_t st = wait_fd(b, fd, POLLOUT, deadline);
            if (st == HCOLL_SUCCESS) {
                int e = 0;
                socklen_t l = sizeof e;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l);
                rc = e ? -1 : 0;
                errno = e;
            } else if (st == HCOLL_ERR_ABORTED) {
                close(fd);
                break;
            } else {
                rc = -1;
                errno = ETIMEDOUT;
            }
        }
        if (rc == 0) {
            set_nodelay(fd);
            *fd_out = fd;
            return HCOLL_SUCCESS;
        }
        last_err = errno;
        close(fd);
        if (hc_now_ms() + CONNECT_RETRY_MS >= deadline)
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_TIMEOUT,
                              "init: could not reach the root (rank 0) at %s within %lld ms "
                              "(HCOLL_TIMEOUT_MS): %s; rank 0 is missing or unreachable",
                              hc_sockaddr_str(&b->root, as, sizeof as), (long long)b->timeout_ms,
                              strerror(last_err));
        struct pollfd p = { b->abort_fd, POLLIN, 0 };
        poll(&p, 1, CONNECT_RETRY_MS);
    }
    return aborted_err(b, "init");
}

/* One attempt at the handshake. *retry_out = 1 when the root dropped us in
 * a way worth retrying (evicted under a flood). */
static hcoll_status_t client_handshake(hc_boot_t *b, int fd, const unsigned char *key,
                                       size_t rec_len, double deadline, int *retry_out)
{
    char as[80];
    unsigned char hb[HDR_BYTES];
    hdr_t h;
    char why[96];
    *retry_out = 0;
    hcoll_status_t st = io_recv(b, fd, hb, sizeof hb, deadline);
    if (st == HCOLL_ERR_PEER_FAILED) {
        *retry_out = 1;
        return st;
    }
    if (st != HCOLL_SUCCESS)
        return io_err(b, st, 0, "init: waiting for the root's challenge", b->timeout_ms);
    hdr_unpack(hb, &h);
    if (!hdr_sane(&h, why, sizeof why) || h.type != MSG_CHALLENGE || h.len != NONCE_BYTES)
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NETWORK,
                          "init: %s does not speak the hcoll bootstrap protocol (%s)",
                          hc_sockaddr_str(&b->root, as, sizeof as),
                          hdr_sane(&h, why, sizeof why) ? "unexpected first message" : why);
    unsigned char nonce_s[NONCE_BYTES];
    st = io_recv(b, fd, nonce_s, NONCE_BYTES, deadline);
    if (st != HCOLL_SUCCESS) {
        *retry_out = st == HCOLL_ERR_PEER_FAILED;
        return *retry_out ? st : io_err(b, st, 0, "init: reading the challenge", b->timeout_ms);
    }

    unsigned char m[HDR_BYTES + AUTH_BYTES];
    unsigned char *a = m + HDR_BYTES;
    hdr_pack(m, MSG_AUTH, AUTH_BYTES, 0);
    put32(a, (uint32_t)b->rank);
    put32(a + 4, (uint32_t)b->nranks);
    put32(a + 8, (uint32_t)rec_len);
    if (hc_random_bytes(a + 12, NONCE_BYTES) != 0)
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_SYSTEM, "init: getrandom: %s",
                          strerror(errno));
    auth_mac(key, 'C', nonce_s, a + 12, (uint32_t)b->rank, (uint32_t)b->nranks,
             (uint32_t)rec_len, a + 12 + NONCE_BYTES);
    st = io_send(b, fd, m, sizeof m, deadline);
    if (st != HCOLL_SUCCESS) {
        *retry_out = st == HCOLL_ERR_PEER_FAILED;
        return *retry_out ? st : io_err(b, st, 0, "init: sending the authentication", b->timeout_ms);
    }

    unsigned char ok[MAC_BYTES], want[MAC_BYTES];
    st = recv_msg(b, fd, 0, MSG_AUTH_OK, 0, ok, MAC_BYTES, deadline, "init: authentication");
    if (st != HCOLL_SUCCESS)
        return st;
    auth_mac(key, 'S', nonce_s, a + 12, (uint32_t)b->rank, (uint32_t)b->nranks,
             (uint32_t)rec_len, want);
    if (!hc_ct_equal(ok, want, MAC_BYTES))
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_MISMATCH,
                          "init: the process at %s did not prove that it holds the job's "
                          "secret (wrong unique id, or someone else listens there)",
                          hc_sockaddr_str(&b->root, as, sizeof as));
    return HCOLL_SUCCESS;
}

static hcoll_status_t client_rendezvous(hc_boot_t *b, const unsigned char *key, const void *rec,
                                        size_t rec_len, unsigned char *recs)
{
    const double t0 = hc_now_ms(), deadline = t0 + (double)b->timeout_ms;
    hcoll_status_t st;
    int fd = -1;
    for (;;) {
        HC_CHECK(client_connect(b, deadline, &fd), fail);
        int retry;
        st = client_handshake(b, fd, key, rec_len, deadline, &retry);
        if (st == HCOLL_SUCCESS)
            break;
        close(fd);
        fd = -1;
        if (!retry)
            goto fail;
        if (hc_now_ms() + CONNECT_RETRY_MS >= deadline) {
            char as[80];
            st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_TIMEOUT,
                            "init: the root (rank 0) at %s kept closing the connection before "
                            "authentication for %lld ms (HCOLL_TIMEOUT_MS)",
                            hc_sockaddr_str(&b->root, as, sizeof as), (long long)b->timeout_ms);
            goto fail;
        }
        HC_INFO(HC_BOOT, b->rank, "bootstrap: the root closed the connection before "
                                  "authentication; retrying");
        usleep(CONNECT_RETRY_MS * 1000);
    }
    b->conn[0] = fd;

    st = send_msg(b, fd, MSG_RECORD, 0, rec, rec_len, deadline);
    if (st != HCOLL_SUCCESS) {
        st = io_err(b, st, 0, "init: sending this rank's record", b->timeout_ms);
        goto fail;
    }
    /* The root is the one that knows who is missing: give its verdict a
     * moment past our own deadline to arrive. */
    st = recv_msg(b, fd, 0, MSG_TABLE, 0, recs, (size_t)b->nranks * rec_len,
                  deadline + HC_BOOT_VERDICT_GRACE_MS, "init: waiting for every rank to join");
    if (st != HCOLL_SUCCESS)
        goto fail;
    HC_TRACE(HC_BOOT, b->rank, "bootstrap: joined in %.0f ms", hc_now_ms() - t0);
    return HCOLL_SUCCESS;

fail:
    return st;
}

/* ------------------------------------------------------------------------ */

hcoll_status_t hc_boot_create(const hc_boot_args_t *args, const void *rec, size_t rec_len,
                              void *all_recs_out, hc_boot_t **boot_out)
{
    hcoll_status_t st;
    int lfd = args->listen_fd;
    if (args->nranks < 1 || args->rank < 0 || args->rank >= args->nranks || rec_len == 0 ||
        rec_len > HC_BOOT_REC_MAX || args->timeout_ms <= 0 ||
        (size_t)args->nranks > HC_BOOT_COLL_MAX / rec_len) {
        st = hc_err_set(args->eb, HC_BOOT, args->rank, HCOLL_ERR_INVALID_ARG,
                        "bootstrap: bad arguments (rank %d of %d, record %zu bytes)", args->rank,
                        args->nranks, rec_len);
        goto err_args;
    }
    hc_boot_t *b = calloc(1, sizeof *b);
    if (!b) {
        st = hc_err_set(args->eb, HC_BOOT, args->rank, HCOLL_ERR_NO_MEMORY, "out of memory");
        goto err_args;
    }
    b->rank = args->rank;
    b->nranks = args->nranks;
    b->timeout_ms = args->timeout_ms;
    b->eb = args->eb;
    b->root = args->root;
    atomic_init(&b->aborted, 0);
    atomic_init(&b->broken, HCOLL_SUCCESS);
    pthread_mutex_init(&b->call_lock, NULL);
    b->conn = malloc((size_t)b->nranks * sizeof *b->conn);
    if (!b->conn) {
        st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NO_MEMORY, "out of memory");
        goto err_boot;
    }
    for (int r = 0; r < b->nranks; r++)
        b->conn[r] = -1;
    b->abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (b->abort_fd < 0) {
        st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_SYSTEM, "eventfd: %s", strerror(errno));
        goto err_conn;
    }

    if (b->rank == 0) {
        if (lfd < 0) {
            char err[200];
            lfd = hc_boot_listen(&b->root, &b->root, err, sizeof err);
            if (lfd < 0) {
                st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_NETWORK, "init: %s", err);
                goto err_abortfd;
            }
        } else {
            socklen_t l = sizeof b->root;
            getsockname(lfd, &b->root.sa, &l);
            set_nonblock(lfd);
        }
        if (hc_log_enabled(HC_LOG_INFO, HC_BOOT)) {
            char as[80];
            HC_INFO(HC_BOOT, 0, "bootstrap: root listening on %s for %d ranks (%s)",
                    hc_sockaddr_str(&b->root, as, sizeof as), b->nranks,
                    args->authenticated ? "authenticated" : "NOT authenticated");
        }
        /* root_rendezvous owns lfd from here and closes it in every case. */
        st = root_rendezvous(b, lfd, args->key, rec, rec_len, all_recs_out);
        lfd = -1;
    } else {
        st = client_rendezvous(b, args->key, rec, rec_len, all_recs_out);
    }
    if (st != HCOLL_SUCCESS)
        goto err_conns;
    *boot_out = b;
    return HCOLL_SUCCESS;

err_conns:
    for (int r = 0; r < b->nranks; r++)
        if (b->conn[r] >= 0)
            close(b->conn[r]);
err_abortfd:
    close(b->abort_fd);
err_conn:
    free(b->conn);
err_boot:
    pthread_mutex_destroy(&b->call_lock);
    free(b);
err_args:
    if (lfd >= 0)
        close(lfd);
    return st;
}

void hc_boot_set_errbuf(hc_boot_t *b, hc_errbuf_t *eb)
{
    b->eb = eb;
}

hcoll_status_t hc_boot_status(const hc_boot_t *b)
{
    return (hcoll_status_t)atomic_load(&((hc_boot_t *)b)->broken);
}

const hc_sockaddr_t *hc_boot_root_addr(const hc_boot_t *b)
{
    return &b->root;
}

/* ------------------------------------------------------------------------ */
/* Collectives                                                               */
/* ------------------------------------------------------------------------ */

/* Root: receive UP(len) from every rank in parallel (so that whichever
 * rank fails first is noticed at once), each into all + r*len. */
static hcoll_status_t root_gather(hc_boot_t *b, uint32_t arg, unsigned char *all, size_t len,
                                  double deadline, const char *what)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const int n = b->nranks;
    size_t *got = calloc((size_t)n, sizeof *got);
    unsigned char(*hb)[HDR_BYTES] = calloc((size_t)n, HDR_BYTES);
    struct pollfd *pf = calloc((size_t)n + 1, sizeof *pf);
    int *who = calloc((size_t)n + 1, sizeof *who);
    if (!got || !hb || !pf || !who) {
        st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_NO_MEMORY, "%s: out of memory", what);
        goto out;
    }
    int left = n - 1;
    const double t0 = hc_now_ms();
    while (left > 0) {
        int np = 0;
        pf[np++] = (struct pollfd){ b->abort_fd, POLLIN, 0 };
        for (int r = 1; r < n; r++) {
            if (got[r] < HDR_BYTES + len) {
                who[np] = r;
                pf[np++] = (struct pollfd){ b->conn[r], POLLIN, 0 };
            }
        }
        double wait = deadline - hc_now_ms();
        if (wait <= 0) {
            char *present = calloc((size_t)n, 1);
            char list[160] = "?";
            if (present) {
                for (int r = 0; r < n; r++)
                    present[r] = r == 0 || got[r] == HDR_BYTES + len;
                format_ranks(present, n, list, sizeof list);
                free(present);
            }
            st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_TIMEOUT,
                            "%s: rank(s) %s did not take part within %.0f ms (HCOLL_TIMEOUT_MS)",
                            what, list, deadline - t0);
            goto out;
        }
        int k = poll(pf, (nfds_t)np, (int)(wait + 0.999));
        if (k < 0 && errno != EINTR) {
            st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_SYSTEM, "%s: poll: %s", what,
                            strerror(errno));
            goto out;
        }
        if (k <= 0)
            continue;
        if (pf[0].revents) {
            st = aborted_err(b, what);
            goto out;
        }
        for (int i = 1; i < np; i++) {
            if (!pf[i].revents)
                continue;
            const int r = who[i];
            for (;;) {
                unsigned char *dst = got[r] < HDR_BYTES ? hb[r] + got[r]
                                                        : all + (size_t)r * len + (got[r] - HDR_BYTES);
                size_t want = got[r] < HDR_BYTES ? HDR_BYTES - got[r] : HDR_BYTES + len - got[r];
                if (want == 0)
                    break;
                ssize_t m = recv(b->conn[r], dst, want, 0);
                if (m < 0 && errno == EINTR)
                    continue;
                if (m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    break;
                if (m <= 0) {
                    b->saved_errno = m < 0 ? errno : 0;
                    st = io_err(b, HCOLL_ERR_PEER_FAILED, r, what, 0);
                    goto out;
                }
                got[r] += (size_t)m;
                if (got[r] == HDR_BYTES) {
                    hdr_t h;
                    char why[96];
                    hdr_unpack(hb[r], &h);
                    if (!hdr_sane(&h, why, sizeof why) || h.type != MSG_UP) {
                        st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_NETWORK,
                                        "%s: rank %d sent an unexpected message (type %u)", what,
                                        r, h.type);
                        goto out;
                    }
                    if (h.arg != arg) {
                        unsigned op = h.arg >> 24;
                        st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_MISMATCH,
                                        "%s: rank %d is in %s #%u (set-up collectives called in "
                                        "a different order)",
                                        what, r, op < 4 ? op_names[op] : "?", h.arg & 0xffffff);
                        goto out;
                    }
                    if (h.len != len) {
                        st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_MISMATCH,
                                        "%s: rank %d contributes %u bytes, this rank %zu (len "
                                        "differs between ranks)", what, r, h.len, len);
                        goto out;
                    }
                }
            }
            if (got[r] == HDR_BYTES + len)
                left--;
        }
    }
out:
    free(who);
    free(pf);
    free(hb);
    free(got);
    return st;
}

static hcoll_status_t coll_enter(hc_boot_t *b, const char *what)
{
    pthread_mutex_lock(&b->call_lock);
    if (is_aborted(b))
        return aborted_err(b, what);
    hcoll_status_t broken = hc_boot_status(b);
    if (broken != HCOLL_SUCCESS)
        return hc_err_set(b->eb, HC_BOOT, b->rank, broken,
                          "%s: the bootstrap failed earlier (%s) and cannot be used any more",
                          what, hcoll_status_name(broken));
    return HCOLL_SUCCESS;
}

static hcoll_status_t coll_run(hc_boot_t *b, unsigned op, const void *mine, void *out,
                               size_t len, int root)
{
    char what[48];
    hcoll_status_t st;
    const uint32_t seq = b->seq++ & 0xffffff;
    const uint32_t arg = (uint32_t)op << 24 | seq;
    snprintf(what, sizeof what, "bootstrap %s #%u", op_names[op], seq);
    HC_CHECK(coll_enter(b, what), out);
    const double deadline = hc_now_ms() + (double)b->timeout_ms;
    const size_t total = op == OP_BCAST ? len : (size_t)b->nranks * len;

    if (b->rank == 0) {
        if (op == OP_BCAST) {
            if (root != 0)
                HC_CHECK(recv_msg(b, b->conn[root], root, MSG_UP, arg, out, len, deadline, what),
                         fail);
        } else {
            if (len)
                memcpy(out, mine, len);
            HC_CHECK(root_gather(b, arg, out, len, deadline, what), fail);
        }
        for (int r = 1; r < b->nranks; r++) {
            if (op == OP_BCAST && r == root)
                continue;
            st = send_msg(b, b->conn[r], MSG_DOWN, arg, out, total, deadline);
            if (st != HCOLL_SUCCESS) {
                st = io_err(b, st, r, what, b->timeout_ms);
                goto fail;
            }
        }
    } else {
        if (op != OP_BCAST || root == b->rank) {
            st = send_msg(b, b->conn[0], MSG_UP, arg, op == OP_BCAST ? out : mine, len, deadline);
            if (st != HCOLL_SUCCESS) {
                st = io_err(b, st, 0, what, b->timeout_ms);
                goto fail;
            }
        }
        /* As at init, the root names whoever is missing: give its verdict
         * a moment past our own deadline. */
        if (op != OP_BCAST || root != b->rank)
            HC_CHECK(recv_msg(b, b->conn[0], 0, MSG_DOWN, arg, out, total,
                              deadline + HC_BOOT_VERDICT_GRACE_MS, what),
                     fail);
    }
    pthread_mutex_unlock(&b->call_lock);
    return HCOLL_SUCCESS;

fail:
    boot_break(b, st);
out:
    pthread_mutex_unlock(&b->call_lock);
    return st;
}

hcoll_status_t hc_boot_allgather(void *boot, const void *mine, void *all_out, size_t len)
{
    hc_boot_t *b = boot;
    if (!b || (len && (!mine || !all_out)) || len > HC_BOOT_COLL_MAX / (size_t)b->nranks)
        return hc_err_set(b ? b->eb : NULL, HC_BOOT, b ? b->rank : -1, HCOLL_ERR_INVALID_ARG,
                          "bootstrap allgather: bad arguments (len %zu)", len);
    return coll_run(b, OP_ALLGATHER, mine, all_out, len, 0);
}

hcoll_status_t hc_boot_bcast(void *boot, void *buf, size_t len, int root)
{
    hc_boot_t *b = boot;
    if (!b || (len && !buf) || len > HC_BOOT_COLL_MAX || root < 0 || root >= b->nranks)
        return hc_err_set(b ? b->eb : NULL, HC_BOOT, b ? b->rank : -1, HCOLL_ERR_INVALID_ARG,
                          "bootstrap bcast: bad arguments (len %zu, root %d)", len, root);
    return coll_run(b, OP_BCAST, buf, buf, len, root);
}

hcoll_status_t hc_boot_barrier(void *boot)
{
    hc_boot_t *b = boot;
    if (!b)
        return hc_err_set(NULL, HC_BOOT, -1, HCOLL_ERR_INVALID_ARG, "bootstrap barrier: NULL");
    return coll_run(b, OP_BARRIER, NULL, NULL, 0, 0);
}

void hc_boot_abort(hc_boot_t *b)
{
    if (!b || atomic_exchange(&b->aborted, 1))
        return;
    uint64_t one = 1;
    ssize_t w = write(b->abort_fd, &one, sizeof one);
    (void)w;
    /* Shut, do not close: a call blocked in poll on these fds in another
     * thread must not see them reused. Peers see EOF and fail promptly. */
    for (int r = 0; r < b->nranks; r++)
        if (b->conn[r] >= 0)
            shutdown(b->conn[r], SHUT_RDWR);
}

void hc_boot_destroy(hc_boot_t *b)
{
    if (!b)
        return;
    /* Wait for a call in flight on another thread (hc_boot_abort made it
     * return promptly). */
    pthread_mutex_lock(&b->call_lock);
    for (int r = 0; r < b->nranks; r++)
        if (b->conn[r] >= 0)
            close(b->conn[r]);
    close(b->abort_fd);
    pthread_mutex_unlock(&b->call_lock);
    pthread_mutex_destroy(&b->call_lock);
    free(b->conn);
    free(b);
}
