/*
 * The root's side of the rendezvous (rank 0): one poll loop over the
 * listener, the not-yet-registered connections and the registered ranks,
 * so that a slow or hostile connection never stalls the others.
 *
 *   rank k ──connect──────────► root   accept: a pending entry, P_HELLO
 *          ── HELLO ─────────────►     ("fresh": evictable until then)
 *          ◄── CHALLENGE ──────────     nonce_s, salt, kdf_iters: P_AUTH_HDR
 *          ── AUTH rank nranks  ──►     P_AUTH_HDR ─► P_AUTH_BODY
 *             rec_len nonce_c MAC       MAC checked first, then the claims
 *          ◄── AUTH_OK MAC ─────────    (or REFUSE with its MAC and the reason,
 *                                        or ERROR when the MAC was wrong)
 *          ── RECORD ────────────►     P_REC_HDR ─► P_REC_BODY: the record
 *                                       lands in its slot; k is registered
 *          ◄── TABLE ──────────────     once all nranks-1 ranks are in
 *
 * Each pending connection is a small state machine fed by non-blocking
 * reads (root_pend_progress). Under a flood (boot.h, HC_BOOT_PENDING_MAX):
 * at most HC_BOOT_PENDING_MAX fresh connections, the oldest evicted for a
 * newcomer, and at most HC_BOOT_HANDSHAKE_MAX past their HELLO, never
 * evicted; each turn of the loop serves what is readable, then accepts at
 * most HC_BOOT_ACCEPT_BATCH, so a burst cannot starve the handshakes in
 * flight. Each connection has auth_ms (a quarter of the timeout, clamped to
 * 1..10 s) to finish the handshake. Out of file descriptors, the root
 * evicts a fresh connection, or else stops polling the listener for a
 * growing pause. A registered rank must stay silent until the table
 * (heartbeats aside): readable otherwise means it died.
 */
#include "boot/rendezvous.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "boot/hmac.h"
#include "boot/io.h"

enum pend_state { P_HELLO, P_AUTH_HDR, P_AUTH_BODY, P_REC_HDR, P_REC_BODY };

#define ROOT_PEND_CAP (HC_BOOT_PENDING_MAX + HC_BOOT_HANDSHAKE_MAX)
/* Drops logged as WARN per rendezvous; the rest at TRACE, counted in one
 * WARN at the end, so that a flood of strangers does not flood the log. */
#define ROOT_DROP_WARN_MAX 32
/* The listener's pause when accept runs out of file descriptors. */
#define ROOT_EMFILE_PAUSE_MIN_MS 10
#define ROOT_EMFILE_PAUSE_MAX_MS 250

typedef struct pend {
    int fd;
    int state;
    int rank;       /* claimed, once authenticated */
    double deadline;
    uint64_t born;  /* arrival order, for evicting the oldest fresh one */
    size_t got;
    unsigned char buf[HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES];
    unsigned char nonce_s[HC_BWIRE_NONCE_BYTES];
    char peer[64];
} pend_t;

typedef struct root_ctx {
    hc_boot_t *b;
    size_t rec_len;
    unsigned char *recs;
    pend_t pend[ROOT_PEND_CAP];
    int npend, nfresh;
    uint64_t born_seq;
    char *claimed; /* nranks: authenticated (pending or registered) */
    int nreg;
    double auth_ms;
    int lfd;
    double lfd_paused_until; /* out of fds: the listener rests until then */
    double emfile_pause_ms;
    double deadline;
    int ndrops;
    struct pollfd *pf; /* abort_fd, lfd, pending, registered */
    double *heard;     /* nranks: last sign of life of a registered rank */
    double next_beat;  /* when the root beats to the registered ranks next */
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
        if (++rc->ndrops <= ROOT_DROP_WARN_MAX)
            HC_WARN(HC_BOOT, 0, "bootstrap: dropped connection from %s: %s%s", p->peer, why,
                    rc->ndrops == ROOT_DROP_WARN_MAX ? " (further drops are logged at TRACE)"
                                                     : "");
        else
            HC_TRACE(HC_BOOT, 0, "bootstrap: dropped connection from %s: %s", p->peer, why);
    }
    if (p->state >= P_REC_HDR)
        rc->claimed[p->rank] = 0;
    if (p->state == P_HELLO)
        rc->nfresh--;
    close(p->fd);
    rc->pend[i] = rc->pend[--rc->npend];
}

static void pend_reject(root_ctx_t *rc, int i, hcoll_status_t st, const char *text)
{
    hc_bio_send_error_nb(rc->pend[i].fd, st, text);
    pend_drop(rc, i, "%s", text);
}

/* Refuse an AUTH whose MAC was right: the refusal carries a MAC of its
 * own, so the client can tell it from a stranger's ERROR and honour it. */
static void pend_refuse(root_ctx_t *rc, int i, hcoll_status_t st, const char *text)
{
    pend_t *p = &rc->pend[i];
    const unsigned char *nonce_c = p->buf + HC_BWIRE_HDR_BYTES + 12;
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES + HC_BWIRE_ERRTEXT_MAX];
    size_t n = strlen(text);
    if (n > HC_BWIRE_ERRTEXT_MAX)
        n = HC_BWIRE_ERRTEXT_MAX;
    hc_bwire_pack(m, HC_BMSG_REFUSE, (uint32_t)(HC_BWIRE_MAC_BYTES + n), (uint32_t)st);
    hc_bwire_refuse_mac(rc->b->key, p->nonce_s, nonce_c, (uint32_t)st, text, n,
                        m + HC_BWIRE_HDR_BYTES);
    memcpy(m + HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES, text, n);
    ssize_t w = send(p->fd, m, HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES + n,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    pend_drop(rc, i, "%s", text);
}

/* The oldest connection that has sent nothing valid, or -1. */
static int pend_oldest_fresh(const root_ctx_t *rc)
{
    int old = -1;
    for (int i = 0; i < rc->npend; i++)
        if (rc->pend[i].state == P_HELLO && (old < 0 || rc->pend[i].born < rc->pend[old].born))
            old = i;
    return old;
}

static int root_pend_progress(root_ctx_t *rc, int i);

/* A new connection (fd non-blocking): a fresh pending entry, evicting
 * the oldest fresh one when they are at their cap; its HELLO is read at
 * once when it is already there. */
static void root_adopt(root_ctx_t *rc, int fd, double now)
{
    if (rc->nfresh == HC_BOOT_PENDING_MAX)
        pend_drop(rc, pend_oldest_fresh(rc),
                  "too many connections that sent nothing valid (at most %d); dropping "
                  "the oldest", HC_BOOT_PENDING_MAX);
    pend_t *p = &rc->pend[rc->npend++];
    memset(p, 0, sizeof *p);
    p->fd = fd;
    p->state = P_HELLO;
    p->rank = -1;
    p->born = rc->born_seq++;
    p->deadline = now + rc->auth_ms;
    rc->nfresh++;
    hc_bio_peer_str(fd, p->peer, sizeof p->peer);
    hc_bio_nodelay(fd);
    HC_TRACE(HC_BOOT, 0, "bootstrap: connection from %s", p->peer);
    root_pend_progress(rc, rc->npend - 1);
}

/* Accept at most HC_BOOT_ACCEPT_BATCH connections, and read each one's
 * HELLO at once when it is already there (a rank that waited in the
 * backlog). */
static void root_accept(root_ctx_t *rc, double now)
{
    for (int k = 0; k < HC_BOOT_ACCEPT_BATCH; k++) {
        int fd = accept4(rc->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EMFILE && errno != ENFILE)
                return; /* EAGAIN, or a connection that died in the backlog */
            /* Out of fds: make room by evicting a stranger that has sent
             * nothing valid; with none, rest the listener instead of
             * spinning on it (it stays readable) until the deadline. */
            int old = pend_oldest_fresh(rc);
            if (old >= 0) {
                pend_drop(rc, old, "out of file descriptors (%s): dropping the oldest "
                                   "connection that sent nothing valid", strerror(errno));
                continue;
            }
            if (rc->emfile_pause_ms == ROOT_EMFILE_PAUSE_MIN_MS)
                HC_WARN(HC_BOOT, 0, "bootstrap: cannot accept: %s; pausing the listener",
                        strerror(errno));
            rc->lfd_paused_until = now + rc->emfile_pause_ms;
            rc->emfile_pause_ms *= 2;
            if (rc->emfile_pause_ms > ROOT_EMFILE_PAUSE_MAX_MS)
                rc->emfile_pause_ms = ROOT_EMFILE_PAUSE_MAX_MS;
            return;
        }
        rc->emfile_pause_ms = ROOT_EMFILE_PAUSE_MIN_MS;
        root_adopt(rc, fd, now);
    }
}

/* A HELLO came: challenge the connection, which may then not be evicted. */
static int root_challenge(root_ctx_t *rc, int i)
{
    pend_t *p = &rc->pend[i];
    if (rc->npend - rc->nfresh >= HC_BOOT_HANDSHAKE_MAX) {
        pend_drop(rc, i, "too many connections in the handshake (at most %d)",
                  HC_BOOT_HANDSHAKE_MAX);
        return 0;
    }
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_CHALLENGE_BYTES];
    unsigned char *c = m + HC_BWIRE_HDR_BYTES;
    if (hc_random_bytes(p->nonce_s, HC_BWIRE_NONCE_BYTES) != 0) {
        pend_drop(rc, i, "getrandom: %s", strerror(errno));
        return 0;
    }
    hc_bwire_pack(m, HC_BMSG_CHALLENGE, HC_BWIRE_CHALLENGE_BYTES, 0);
    memcpy(c, p->nonce_s, HC_BWIRE_NONCE_BYTES);
    memcpy(c + HC_BWIRE_NONCE_BYTES, rc->b->salt, HC_BWIRE_SALT_BYTES);
    hc_bwire_put32(c + HC_BWIRE_NONCE_BYTES + HC_BWIRE_SALT_BYTES, rc->b->kdf_iters);
    /* The connection has sent nothing but its HELLO, so its send buffer is
     * empty and this never blocks; a short write means the peer is gone. */
    if (send(p->fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof m) {
        pend_drop(rc, i, "could not send the challenge");
        return 0;
    }
    p->state = P_AUTH_HDR;
    p->got = 0;
    rc->nfresh--;
    HC_TRACE(HC_BOOT, 0, "bootstrap: challenge sent to %s", p->peer);
    return 1;
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
    const unsigned char *a = p->buf + HC_BWIRE_HDR_BYTES;
    uint32_t rank = hc_bwire_get32(a), nranks = hc_bwire_get32(a + 4);
    uint32_t rec_len = hc_bwire_get32(a + 8);
    const unsigned char *nonce_c = a + 12, *mac = a + 12 + HC_BWIRE_NONCE_BYTES;
    unsigned char want[HC_BWIRE_MAC_BYTES];
    char text[160];

    /* The MAC first: nothing an unauthenticated peer claims is looked at. */
    hc_bwire_mac(b->key, 'C', p->nonce_s, nonce_c, rank, nranks, rec_len, want);
    if (!hc_ct_equal(want, mac, HC_BWIRE_MAC_BYTES)) {
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
        pend_refuse(rc, i, HCOLL_ERR_MISMATCH, text);
        return 0;
    }
    if (rank == 0 || rank >= nranks) {
        snprintf(text, sizeof text, "rank %u is not a valid non-root rank of %u", rank, nranks);
        pend_refuse(rc, i, HCOLL_ERR_INVALID_ARG, text);
        return 0;
    }
    if (rc->claimed[rank]) {
        snprintf(text, sizeof text, "duplicate rank %u: another process already joined as rank %u",
                 rank, rank);
        pend_refuse(rc, i, HCOLL_ERR_INVALID_ARG, text);
        return 0;
    }
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES];
    hc_bwire_pack(m, HC_BMSG_AUTH_OK, HC_BWIRE_MAC_BYTES, 0);
    hc_bwire_mac(b->key, 'S', p->nonce_s, nonce_c, rank, nranks, rec_len,
                 m + HC_BWIRE_HDR_BYTES);
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

/* A complete header in state P_HELLO or P_AUTH_HDR: 1 when it is the one
 * expected (and the connection moved on), 0 when it was dropped. */
static int root_first_hdr(root_ctx_t *rc, int i, unsigned type, uint32_t len)
{
    pend_t *p = &rc->pend[i];
    hc_bwire_hdr_t h;
    char why[96];
    hc_bwire_unpack(p->buf, &h);
    if (h.magic != HC_BWIRE_MAGIC) {
        pend_drop(rc, i, "not an hcoll bootstrap client (%s)",
                  looks_like_http(p->buf) ? "an HTTP request" : "bad magic");
        return 0;
    }
    if (!hc_bwire_sane(&h, why, sizeof why)) {
        pend_drop(rc, i, "%s", why);
        return 0;
    }
    if (h.type != type || h.len != len) {
        pend_drop(rc, i, "expected %s (%u bytes), got type %u with length %u",
                  type == HC_BMSG_HELLO ? "a HELLO" : "an AUTH message", len, h.type, h.len);
        return 0;
    }
    if (type == HC_BMSG_HELLO)
        return root_challenge(rc, i);
    p->state = P_AUTH_BODY;
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
        case P_AUTH_BODY:
            dst = p->buf + p->got, need = HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES;
            break;
        case P_REC_BODY: /* the record lands straight in its slot of the table */
            dst = rc->recs + (size_t)p->rank * rc->rec_len + (p->got - HC_BWIRE_HDR_BYTES);
            need = HC_BWIRE_HDR_BYTES + rc->rec_len;
            break;
        default: dst = p->buf + p->got, need = HC_BWIRE_HDR_BYTES; break;
        }
        ssize_t n = need > p->got ? recv(p->fd, dst, need - p->got, 0) : 0;
        if (n == 0 && need > p->got) {
            if (p->state == P_HELLO && p->got == 0)
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

        hc_bwire_hdr_t h;
        char why[96];
        switch (p->state) {
        case P_HELLO:
            if (!root_first_hdr(rc, i, HC_BMSG_HELLO, 0))
                return 0;
            break;
        case P_AUTH_HDR:
            if (!root_first_hdr(rc, i, HC_BMSG_AUTH, HC_BWIRE_AUTH_BYTES))
                return 0;
            break;
        case P_AUTH_BODY:
            if (!root_auth(rc, i))
                return 0;
            break;
        case P_REC_HDR:
            hc_bwire_unpack(p->buf, &h);
            if (!hc_bwire_sane(&h, why, sizeof why) || h.type != HC_BMSG_RECORD ||
                h.len != rc->rec_len) {
                pend_drop(rc, i, "rank %d: expected its record (%zu bytes), got type %u length %u",
                          p->rank, rc->rec_len, h.type, h.len);
                return 0;
            }
            p->state = P_REC_BODY;
            break;
        default:
            b->conn[p->rank] = p->fd;
            rc->heard[p->rank] = hc_now_ms();
            rc->nreg++;
            HC_TRACE(HC_BOOT, 0, "bootstrap: rank %d joined from %s (%d of %d)", p->rank,
                     p->peer, rc->nreg + 1, b->nranks);
            rc->pend[i] = rc->pend[--rc->npend];
            return 1;
        }
    }
}

/* The deadline passed: name the ranks that never joined. */
static hcoll_status_t root_missing(root_ctx_t *rc)
{
    hc_boot_t *b = rc->b;
    char missing[200];
    char *present = calloc((size_t)b->nranks, 1);
    if (present) {
        present[0] = 1;
        for (int r = 1; r < b->nranks; r++)
            present[r] = b->conn[r] >= 0;
        hc_bio_format_ranks(present, b->nranks, missing, sizeof missing);
        free(present);
    } else {
        snprintf(missing, sizeof missing, "?");
    }
    return hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_TIMEOUT,
                      "init: rank(s) %s of %d never joined within %lld ms "
                      "(HCOLL_INIT_TIMEOUT_MS); %d of %d ranks are here",
                      missing, b->nranks, (long long)b->init_timeout_ms, rc->nreg + 1,
                      b->nranks);
}

/* While the rendezvous waits for late ranks (HCOLL_INIT_TIMEOUT_MS), the
 * ranks already here and the root show each other they are alive: a
 * joined rank that froze is named after HCOLL_LIVENESS_MS, not at the
 * arrival deadline. */
static hcoll_status_t root_liveness(root_ctx_t *rc, double now)
{
    hc_boot_t *b = rc->b;
    if (b->liveness_ms <= 0)
        return HCOLL_SUCCESS;
    const int beat = now >= rc->next_beat;
    if (beat)
        rc->next_beat = now + hc_bio_beat_ms(b);
    for (int r = 1; r < b->nranks; r++) {
        if (b->conn[r] < 0)
            continue;
        if (beat)
            hc_bio_beat_nb(b->conn[r]);
        if (now - rc->heard[r] > (double)b->liveness_ms)
            return hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_PEER_FAILED,
                              "init: rank %d joined and then showed no sign of life for %.0f ms "
                              "(stopped or hung; HCOLL_LIVENESS_MS)",
                              r, now - rc->heard[r]);
    }
    return HCOLL_SUCCESS;
}

/* One poll over the listener, the pending connections and the registered
 * ranks, and whatever it found to do. A failure is recorded. */
static hcoll_status_t root_poll_once(root_ctx_t *rc, double now)
{
    hc_boot_t *b = rc->b;
    struct pollfd *pf = rc->pf;
    double wake = rc->deadline;
    if (b->liveness_ms > 0 && rc->next_beat < wake)
        wake = rc->next_beat;
    for (int i = 0; i < rc->npend; i++)
        if (rc->pend[i].deadline < wake)
            wake = rc->pend[i].deadline;
    const int listening = now >= rc->lfd_paused_until;
    if (!listening && rc->lfd_paused_until < wake)
        wake = rc->lfd_paused_until;

    int np = 0;
    pf[np++] = (struct pollfd){ b->abort_fd, POLLIN, 0 };
    /* A resting listener stays in the set with no events, so the indices
     * below do not move. */
    pf[np++] = (struct pollfd){ rc->lfd, listening ? POLLIN : 0, 0 };
    for (int i = 0; i < rc->npend; i++)
        pf[np++] = (struct pollfd){ rc->pend[i].fd, POLLIN, 0 };
    const int reg0 = np;
    for (int r = 1; r < b->nranks; r++)
        if (b->conn[r] >= 0)
            pf[np++] = (struct pollfd){ b->conn[r], POLLIN, 0 };
    int n = poll(pf, (nfds_t)np, (int)(wake - now + 0.999));
    if (n < 0 && errno == EINTR)
        return HCOLL_SUCCESS;
    if (n < 0)
        return hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_SYSTEM, "init: poll: %s",
                          strerror(errno));
    if (n == 0)
        return HCOLL_SUCCESS;
    if (pf[0].revents)
        return hc_bio_aborted(b, "init");
    /* A registered rank sends nothing but heartbeats until the table:
     * anything else means it died (EOF) or broke protocol. */
    for (int k = reg0; k < np; k++) {
        if (!pf[k].revents)
            continue;
        int r = 1;
        while (b->conn[r] != pf[k].fd)
            r++;
        int beat = hc_bio_take_beat(pf[k].fd);
        if (beat > 0)
            rc->heard[r] = hc_now_ms();
        if (beat >= 0)
            continue;
        return hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_PEER_FAILED,
                          "init: rank %d closed its connection before every rank had "
                          "joined (it failed or was killed)",
                          r);
    }
    /* Pending connections first, then new ones: walk a snapshot of the
     * fds, since progress reorders the table. */
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
        root_accept(rc, hc_now_ms());
    return HCOLL_SUCCESS;
}

/* The session key: the key as given, or stretched over a salt drawn for
 * this job, which every CHALLENGE carries. */
static hcoll_status_t root_session_key(hc_boot_t *b)
{
    if (hc_random_bytes(b->salt, sizeof b->salt) != 0)
        return hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_SYSTEM, "init: getrandom: %s",
                          strerror(errno));
    if (b->kdf_iters == 0) {
        memcpy(b->key, b->prekey, sizeof b->key);
    } else {
        const double t0 = hc_now_ms();
        hc_bwire_kdf(b->prekey, b->salt, b->kdf_iters, b->key);
        HC_INFO(HC_BOOT, 0, "bootstrap: secret stretched with %u PBKDF2 iterations in %.0f ms",
                b->kdf_iters, hc_now_ms() - t0);
    }
    b->have_key = 1;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_boot_root_open(hc_boot_t *b, const void *rec, size_t rec_len,
                                 unsigned char *recs, hc_boot_root_t **rc_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    root_ctx_t *rc = calloc(1, sizeof *rc);
    struct pollfd *pf = calloc((size_t)b->nranks + ROOT_PEND_CAP + 2, sizeof *pf);
    char *claimed = calloc((size_t)b->nranks, 1);
    double *heard = calloc((size_t)b->nranks, sizeof *heard);
    if (!rc || !pf || !claimed || !heard) {
        st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_NO_MEMORY, "bootstrap: out of memory");
        goto clean_ctx;
    }
    HC_CHECK(root_session_key(b), clean_ctx);
    rc->b = b;
    rc->rec_len = rec_len;
    rc->recs = recs;
    rc->claimed = claimed;
    rc->heard = heard;
    rc->lfd = -1;
    rc->emfile_pause_ms = ROOT_EMFILE_PAUSE_MIN_MS;
    rc->deadline = hc_now_ms() + (double)b->init_timeout_ms;
    rc->pf = pf;
    claimed[0] = 1;
    memcpy(recs, rec, rec_len);
    {
        double a = (double)b->timeout_ms / 4;
        rc->auth_ms = a < 1000 ? 1000 : a > 10000 ? 10000 : a;
    }
    *rc_out = rc;
    return HCOLL_SUCCESS;

clean_ctx:
    free(claimed);
    free(heard);
    free(pf);
    free(rc);
    return st;
}

void hc_boot_root_adopt(hc_boot_root_t *rc, int fd)
{
    root_adopt(rc, fd, hc_now_ms());
}

int hc_boot_root_serve(hc_boot_root_t *rc)
{
    int fds[ROOT_PEND_CAP], n = rc->npend;
    for (int k = 0; k < n; k++)
        fds[k] = rc->pend[k].fd;
    /* Progress reorders the table: find each connection again. */
    for (int k = 0; k < n; k++)
        for (int i = 0; i < rc->npend; i++)
            if (rc->pend[i].fd == fds[k]) {
                root_pend_progress(rc, i);
                break;
            }
    return rc->nreg;
}

void hc_boot_root_close(hc_boot_root_t *rc)
{
    if (!rc)
        return;
    while (rc->npend > 0)
        pend_drop(rc, 0, NULL);
    free(rc->claimed);
    free(rc->heard);
    free(rc->pf);
    free(rc);
}

hcoll_status_t hc_boot_root_rendezvous(hc_boot_t *b, int lfd, const void *rec, size_t rec_len,
                                       unsigned char *recs)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const double t0 = hc_now_ms(), deadline = t0 + (double)b->init_timeout_ms;
    root_ctx_t *rc = NULL;
    HC_CHECK(hc_boot_root_open(b, rec, rec_len, recs, &rc), clean_lfd);
    rc->lfd = lfd;
    rc->deadline = deadline;

    while (rc->nreg < b->nranks - 1) {
        double now = hc_now_ms();
        /* Expire connections that took too long over the handshake. */
        for (int i = 0; i < rc->npend;) {
            if (now >= rc->pend[i].deadline)
                pend_drop(rc, i, "did not complete the handshake within %.0f ms", rc->auth_ms);
            else
                i++;
        }
        if (now >= deadline) {
            st = root_missing(rc);
            goto clean_ranks;
        }
        HC_CHECK(root_liveness(rc, now), clean_ranks);
        HC_CHECK(root_poll_once(rc, now), clean_ranks);
    }

    while (rc->npend > 0)
        pend_drop(rc, 0, "every rank has joined; the rendezvous is closed");
    close(lfd);
    lfd = -1;
    for (int r = 1; r < b->nranks; r++) {
        st = hc_bio_send_msg(b, b->conn[r], HC_BMSG_TABLE, 0, recs, (size_t)b->nranks * rec_len,
                             deadline);
        if (st != HCOLL_SUCCESS) {
            st = hc_bio_err(b, st, r, "init: sending the rank table", b->timeout_ms);
            goto clean_ranks;
        }
    }
    if (rc->ndrops > ROOT_DROP_WARN_MAX)
        HC_WARN(HC_BOOT, 0, "bootstrap: dropped %d stray connections during the rendezvous "
                            "(%d of them logged at TRACE only)",
                rc->ndrops, rc->ndrops - ROOT_DROP_WARN_MAX);
    HC_INFO(HC_BOOT, 0, "bootstrap: all %d ranks joined in %.0f ms", b->nranks, hc_now_ms() - t0);
    goto clean_ctx;

clean_ranks:
    /* Tell every registered rank why, and let no pending one in. */
    while (rc->npend > 0)
        pend_drop(rc, 0, NULL);
    for (int r = 1; r < b->nranks; r++) {
        if (b->conn[r] >= 0) {
            hc_bio_send_error_nb(b->conn[r], st, hc_bio_errtext(b));
            shutdown(b->conn[r], SHUT_RDWR);
        }
    }
clean_ctx:
    hc_boot_root_close(rc);
clean_lfd:
    if (lfd >= 0)
        close(lfd);
    return st;
}
