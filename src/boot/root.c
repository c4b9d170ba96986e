/*
 * The root's side of the rendezvous (rank 0): one poll loop over the
 * listener, the not-yet-authenticated connections and the registered
 * ranks, so that a slow or hostile connection never stalls the others.
 *
 *   rank k ──connect──────────► root   accept: a pending entry, P_AUTH_HDR
 *          ◄── CHALLENGE nonce_s ──     (sent at once, never blocks)
 *          ── AUTH rank nranks  ──►     P_AUTH_HDR ─► P_AUTH_BODY
 *             rec_len nonce_c MAC       MAC checked first, then the claims
 *          ◄── AUTH_OK MAC ─────────    (or ERROR with the reason, dropped)
 *          ── RECORD ────────────►     P_REC_HDR ─► P_REC_BODY: the record
 *                                       lands in its slot; k is registered
 *          ◄── TABLE ──────────────     once all nranks-1 ranks are in
 *
 * Each pending connection is a small state machine fed by non-blocking
 * reads (root_pend_progress). At most HC_BOOT_PENDING_MAX are kept (the
 * oldest goes when a new one arrives) and each has auth_ms (a quarter of
 * the timeout, clamped to 1..10 s) to finish the handshake. A registered
 * rank must stay silent until the table: readable means it died.
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

enum pend_state { P_AUTH_HDR, P_AUTH_BODY, P_REC_HDR, P_REC_BODY };

typedef struct pend {
    int fd;
    int state;
    int rank;       /* claimed, once authenticated */
    double deadline;
    uint64_t born;  /* arrival order, for evicting the oldest */
    size_t got;
    unsigned char buf[HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES];
    unsigned char nonce_s[HC_BWIRE_NONCE_BYTES];
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
    int lfd;
    double deadline;
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
        HC_WARN(HC_BOOT, 0, "bootstrap: dropped connection from %s: %s", p->peer, why);
    }
    if (p->state >= P_REC_HDR)
        rc->claimed[p->rank] = 0;
    close(p->fd);
    rc->pend[i] = rc->pend[--rc->npend];
}

static void pend_reject(root_ctx_t *rc, int i, hcoll_status_t st, const char *text)
{
    hc_bio_send_error_nb(rc->pend[i].fd, st, text);
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
        hc_bio_peer_str(fd, p->peer, sizeof p->peer);
        hc_bio_nodelay(fd);
        unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_NONCE_BYTES];
        if (hc_random_bytes(p->nonce_s, HC_BWIRE_NONCE_BYTES) != 0) {
            pend_drop(rc, rc->npend - 1, "getrandom: %s", strerror(errno));
            continue;
        }
        hc_bwire_pack(m, HC_BMSG_CHALLENGE, HC_BWIRE_NONCE_BYTES, 0);
        memcpy(m + HC_BWIRE_HDR_BYTES, p->nonce_s, HC_BWIRE_NONCE_BYTES);
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
    const unsigned char *a = p->buf + HC_BWIRE_HDR_BYTES;
    uint32_t rank = hc_bwire_get32(a), nranks = hc_bwire_get32(a + 4);
    uint32_t rec_len = hc_bwire_get32(a + 8);
    const unsigned char *nonce_c = a + 12, *mac = a + 12 + HC_BWIRE_NONCE_BYTES;
    unsigned char want[HC_BWIRE_MAC_BYTES];
    char text[160];

    /* The MAC first: nothing an unauthenticated peer claims is looked at. */
    hc_bwire_mac(rc->key, 'C', p->nonce_s, nonce_c, rank, nranks, rec_len, want);
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
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES];
    hc_bwire_pack(m, HC_BMSG_AUTH_OK, HC_BWIRE_MAC_BYTES, 0);
    hc_bwire_mac(rc->key, 'S', p->nonce_s, nonce_c, rank, nranks, rec_len,
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
        case P_AUTH_HDR: dst = p->buf + p->got, need = HC_BWIRE_HDR_BYTES; break;
        case P_AUTH_BODY:
            dst = p->buf + p->got, need = HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES;
            break;
        case P_REC_HDR: dst = p->buf + p->got, need = HC_BWIRE_HDR_BYTES; break;
        default: /* the record lands straight in its slot of the table */
            dst = rc->recs + (size_t)p->rank * rc->rec_len + (p->got - HC_BWIRE_HDR_BYTES);
            need = HC_BWIRE_HDR_BYTES + rc->rec_len;
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

        hc_bwire_hdr_t h;
        char why[96];
        switch (p->state) {
        case P_AUTH_HDR:
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
            if (h.type != HC_BMSG_AUTH || h.len != HC_BWIRE_AUTH_BYTES) {
                pend_drop(rc, i, "expected an AUTH message of %d bytes, got type %u with "
                                 "length %u", HC_BWIRE_AUTH_BYTES, h.type, h.len);
                return 0;
            }
            p->state = P_AUTH_BODY;
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

    int np = 0;
    pf[np++] = (struct pollfd){ b->abort_fd, POLLIN, 0 };
    pf[np++] = (struct pollfd){ rc->lfd, POLLIN, 0 };
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
        root_accept(rc, rc->lfd);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_boot_root_rendezvous(hc_boot_t *b, int lfd, const unsigned char *key,
                                       const void *rec, size_t rec_len, unsigned char *recs)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const double t0 = hc_now_ms(), deadline = t0 + (double)b->init_timeout_ms;
    root_ctx_t *rc = calloc(1, sizeof *rc);
    struct pollfd *pf = calloc((size_t)b->nranks + HC_BOOT_PENDING_MAX + 2, sizeof *pf);
    char *claimed = calloc((size_t)b->nranks, 1);
    double *heard = calloc((size_t)b->nranks, sizeof *heard);
    if (!rc || !pf || !claimed || !heard) {
        st = hc_err_set(b->eb, HC_BOOT, 0, HCOLL_ERR_NO_MEMORY, "bootstrap: out of memory");
        goto clean_ctx;
    }
    rc->b = b;
    rc->key = key;
    rc->rec_len = rec_len;
    rc->recs = recs;
    rc->claimed = claimed;
    rc->heard = heard;
    rc->lfd = lfd;
    rc->deadline = deadline;
    rc->pf = pf;
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
    if (lfd >= 0)
        close(lfd);
    free(claimed);
    free(heard);
    free(pf);
    free(rc);
    return st;
}
