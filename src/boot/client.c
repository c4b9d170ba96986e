/*
 * A non-root rank's side of the rendezvous: connect to the root (retrying
 * while it is not listening yet), say HELLO, answer its challenge, check
 * that the root holds the key too, send this rank's record and wait for
 * the table.
 *
 *   connect ─► HELLO ─► CHALLENGE ─► AUTH ─► AUTH_OK (MAC checked)
 *           ─► RECORD ─► TABLE
 *
 * Retries: the root may drop a connection before AUTH_OK (a flood of
 * strangers filled its table, or it was slow); the client then starts
 * over on a new connection, with a fresh nonce, until its deadline. A
 * refusal counts only when the root proved it holds the key (a REFUSE
 * whose MAC is right, or an ERROR after AUTH_OK): a stranger's ERROR, or a
 * refusal this rank cannot check (its secret is wrong), is retried, and
 * after HC_BOOT_UNVERIFIED_MAX of them init fails with MISMATCH quoting
 * the last one as unverified. Once connected, the root is the one that
 * knows who is missing, so the wait for the table runs
 * HC_BOOT_VERDICT_GRACE_MS past this rank's own deadline to hear its
 * verdict.
 */
#include "boot/rendezvous.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "boot/hmac.h"
#include "boot/io.h"

/* How one handshake attempt ended, when it did not succeed (the values
 * rendezvous.h gives for hc_boot_client_handshake). */
enum hs_end {
    HS_FATAL,      /* recorded: the error of init */
    HS_DROPPED,    /* closed or silent before AUTH_OK: retry */
    HS_UNVERIFIED, /* refused by a peer that proved nothing: retry, counted */
};

static hcoll_status_t client_connect(hc_boot_t *b, double deadline, int *fd_out)
{
    char as[80];
    int last_err = 0;
    while (!hc_bio_is_aborted(b)) {
        int fd = socket(b->root.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_SYSTEM, "init: socket: %s",
                              strerror(errno));
        int rc = connect(fd, &b->root.sa, hc_sockaddr_len(&b->root));
        if (rc != 0 && errno == EINPROGRESS) {
            hcoll_status_t st = hc_bio_wait(b, fd, POLLOUT, deadline);
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
            hc_bio_nodelay(fd);
            *fd_out = fd;
            return HCOLL_SUCCESS;
        }
        last_err = errno;
        close(fd);
        if (hc_now_ms() + HC_BIO_CONNECT_RETRY_MS >= deadline)
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_TIMEOUT,
                              "init: could not reach the root (rank 0) at %s within %lld ms "
                              "(HCOLL_INIT_TIMEOUT_MS): %s; rank 0 is missing or unreachable",
                              hc_sockaddr_str(&b->root, as, sizeof as),
                              (long long)b->init_timeout_ms,
                              strerror(last_err));
        struct pollfd p = { b->abort_fd, POLLIN, 0 };
        poll(&p, 1, HC_BIO_CONNECT_RETRY_MS);
    }
    return hc_bio_aborted(b, "init");
}

/* The root's challenge: its nonce, and the session key for its salt (a
 * retry with the same salt reuses the key derived before). */
static hcoll_status_t client_challenge(hc_boot_t *b, int fd, double deadline,
                                       unsigned char nonce_s[HC_BWIRE_NONCE_BYTES], int *end,
                                       char *why, size_t whylen)
{
    char as[80], bad[96];
    unsigned char hb[HC_BWIRE_HDR_BYTES], c[HC_BWIRE_CHALLENGE_BYTES];
    hc_bwire_hdr_t h;
    *end = HS_DROPPED;
    hcoll_status_t st = hc_bio_send_msg(b, fd, HC_BMSG_HELLO, 0, NULL, 0, deadline);
    if (st == HCOLL_SUCCESS)
        st = hc_bio_recv(b, fd, hb, sizeof hb, deadline);
    if (st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_TIMEOUT)
        return st;
    *end = HS_FATAL;
    if (st != HCOLL_SUCCESS)
        return hc_bio_err(b, st, 0, "init: waiting for the root's challenge", b->timeout_ms);
    hc_bwire_unpack(hb, &h);
    const int sane = hc_bwire_sane(&h, bad, sizeof bad);
    if (sane && h.type == HC_BMSG_ERROR) {
        /* Nothing proves who sent it: not a reason to give up yet. */
        *end = HS_UNVERIFIED;
        const size_t n = h.len < whylen ? h.len : 0;
        st = hc_bio_recv(b, fd, why, n, deadline);
        why[st == HCOLL_SUCCESS ? n : 0] = '\0';
        hc_bwire_sanitize(why);
        return HCOLL_ERR_PEER_FAILED;
    }
    if (!sane || h.type != HC_BMSG_CHALLENGE || h.len != HC_BWIRE_CHALLENGE_BYTES)
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NETWORK,
                          "init: %s does not speak this version of the hcoll bootstrap "
                          "protocol (%s)",
                          hc_sockaddr_str(&b->root, as, sizeof as),
                          sane ? "unexpected first message" : bad);
    st = hc_bio_recv(b, fd, c, sizeof c, deadline);
    if (st != HCOLL_SUCCESS) {
        *end = st == HCOLL_ERR_PEER_FAILED ? HS_DROPPED : HS_FATAL;
        return *end == HS_DROPPED ? st
                                  : hc_bio_err(b, st, 0, "init: reading the challenge",
                                               b->timeout_ms);
    }
    const unsigned char *salt = c + HC_BWIRE_NONCE_BYTES;
    uint32_t iters = hc_bwire_get32(salt + HC_BWIRE_SALT_BYTES);
    if (iters != b->kdf_iters)
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_MISMATCH,
                          "init: rank 0 stretches the secret with %u PBKDF2 iterations and "
                          "this rank with %u (0: a unique id's key, used as it is): "
                          "HCOLL_KDF_ITERS must be the same on every rank",
                          iters, b->kdf_iters);
    memcpy(nonce_s, c, HC_BWIRE_NONCE_BYTES);
    if (!b->have_key || memcmp(b->salt, salt, HC_BWIRE_SALT_BYTES) != 0) {
        if (iters)
            hc_bwire_kdf(b->prekey, salt, iters, b->key);
        else
            memcpy(b->key, b->prekey, sizeof b->key);
        memcpy(b->salt, salt, HC_BWIRE_SALT_BYTES);
        b->have_key = 1;
    }
    *end = HS_DROPPED;
    return HCOLL_SUCCESS;
}

/* The root's answer to AUTH: AUTH_OK with its MAC, or a refusal, honoured
 * only when its MAC proves the root holds the key. */
static hcoll_status_t client_answer(hc_boot_t *b, int fd, const unsigned char *nonce_s,
                                    const unsigned char *nonce_c, size_t rec_len,
                                    double deadline, int *end, char *why, size_t whylen)
{
    char as[80], bad[96];
    unsigned char hb[HC_BWIRE_HDR_BYTES], body[HC_BWIRE_MAC_BYTES + HC_BWIRE_ERRTEXT_MAX + 1];
    unsigned char want[HC_BWIRE_MAC_BYTES];
    hc_bwire_hdr_t h;
    *end = HS_DROPPED;
    hcoll_status_t st = hc_bio_recv(b, fd, hb, sizeof hb, deadline);
    if (st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_TIMEOUT)
        return st;
    *end = HS_FATAL;
    if (st != HCOLL_SUCCESS)
        return hc_bio_err(b, st, 0, "init: authentication", b->timeout_ms);
    hc_bwire_unpack(hb, &h);
    const int sane = hc_bwire_sane(&h, bad, sizeof bad);
    const int ok = sane && h.type == HC_BMSG_AUTH_OK && h.len == HC_BWIRE_MAC_BYTES;
    if (!ok && (!sane || (h.type != HC_BMSG_ERROR && h.type != HC_BMSG_REFUSE)))
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NETWORK,
                          "init: authentication: the root at %s sent %s",
                          hc_sockaddr_str(&b->root, as, sizeof as),
                          sane ? "a message out of order" : bad);
    st = hc_bio_recv(b, fd, body, h.len, deadline);
    if (st != HCOLL_SUCCESS) {
        *end = HS_DROPPED;
        return st;
    }
    if (ok) {
        hc_bwire_mac(b->key, 'S', nonce_s, nonce_c, (uint32_t)b->rank, (uint32_t)b->nranks,
                     (uint32_t)rec_len, want);
        if (!hc_ct_equal(body, want, HC_BWIRE_MAC_BYTES))
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_MISMATCH,
                              "init: the process at %s did not prove that it holds the job's "
                              "secret (wrong unique id, or someone else listens there)",
                              hc_sockaddr_str(&b->root, as, sizeof as));
        return HCOLL_SUCCESS;
    }
    const size_t mac = h.type == HC_BMSG_REFUSE ? HC_BWIRE_MAC_BYTES : 0;
    char *text = (char *)body + mac;
    text[h.len - mac] = '\0';
    if (mac) {
        hc_bwire_refuse_mac(b->key, nonce_s, nonce_c, h.arg, text, h.len - mac, want);
        if (hc_ct_equal(body, want, HC_BWIRE_MAC_BYTES)) {
            hc_bwire_sanitize(text);
            return hc_err_set(b->eb, HC_BOOT, b->rank, hc_bwire_status(h.arg),
                              "init: the root refused this rank: %s", text);
        }
    }
    *end = HS_UNVERIFIED;
    size_t n = strlen(text) < whylen ? strlen(text) : whylen - 1;
    memcpy(why, text, n);
    why[n] = '\0';
    hc_bwire_sanitize(why);
    return HCOLL_ERR_PEER_FAILED;
}

/* One attempt at the handshake on a new connection: HELLO, CHALLENGE,
 * AUTH (with a fresh nonce), the answer. On failure *end says what to do. */
hcoll_status_t hc_boot_client_handshake(hc_boot_t *b, int fd, size_t rec_len, double deadline,
                                        int *end, char *why, size_t whylen)
{
    unsigned char nonce_s[HC_BWIRE_NONCE_BYTES];
    hcoll_status_t st = client_challenge(b, fd, deadline, nonce_s, end, why, whylen);
    if (st != HCOLL_SUCCESS)
        return st;
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES];
    unsigned char *a = m + HC_BWIRE_HDR_BYTES;
    hc_bwire_pack(m, HC_BMSG_AUTH, HC_BWIRE_AUTH_BYTES, 0);
    hc_bwire_put32(a, (uint32_t)b->rank);
    hc_bwire_put32(a + 4, (uint32_t)b->nranks);
    hc_bwire_put32(a + 8, (uint32_t)rec_len);
    if (hc_random_bytes(a + 12, HC_BWIRE_NONCE_BYTES) != 0) {
        *end = HS_FATAL;
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_SYSTEM, "init: getrandom: %s",
                          strerror(errno));
    }
    hc_bwire_mac(b->key, 'C', nonce_s, a + 12, (uint32_t)b->rank, (uint32_t)b->nranks,
                 (uint32_t)rec_len, a + 12 + HC_BWIRE_NONCE_BYTES);
    st = hc_bio_send(b, fd, m, sizeof m, deadline);
    if (st != HCOLL_SUCCESS) {
        *end = st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_TIMEOUT ? HS_DROPPED : HS_FATAL;
        return *end == HS_DROPPED
                   ? st
                   : hc_bio_err(b, st, 0, "init: sending the authentication", b->timeout_ms);
    }
    return client_answer(b, fd, nonce_s, a + 12, rec_len, deadline, end, why, whylen);
}

/* Wait for the table (or the root's verdict) up to the init deadline,
 * showing the root that this rank is alive and watching that it is. */
hcoll_status_t hc_boot_client_wait_table(hc_boot_t *b, int fd, unsigned char *recs, size_t len,
                                         double deadline)
{
    const char *what = "init: waiting for every rank to join";
    const int live = b->liveness_ms > 0;
    double heard = hc_now_ms(), next_beat = 0;
    for (;;) {
        double now = hc_now_ms();
        if (live && now >= next_beat) {
            hc_bio_beat_nb(fd);
            next_beat = now + hc_bio_beat_ms(b);
        }
        if (live && now - heard > (double)b->liveness_ms)
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_PEER_FAILED,
                              "%s: the root (rank 0) showed no sign of life for %.0f ms "
                              "(stopped or hung; HCOLL_LIVENESS_MS)", what, now - heard);
        double until = live && next_beat < deadline ? next_beat : deadline;
        hcoll_status_t st = hc_bio_wait(b, fd, POLLIN, until);
        if (st == HCOLL_ERR_TIMEOUT && until < deadline)
            continue;
        if (st != HCOLL_SUCCESS)
            return hc_bio_err(b, st, 0, what, b->init_timeout_ms);
        int beat = hc_bio_take_beat(fd);
        if (beat > 0)
            heard = hc_now_ms();
        else if (beat == 0)
            usleep(1000); /* a header on its way */
        else
            return hc_bio_recv_msg(b, fd, 0, HC_BMSG_TABLE, 0, recs, len, deadline, what);
    }
}

/* Connect and authenticate, starting over while the root drops this rank
 * before AUTH_OK; on success *fd_out is the authenticated connection. */
static hcoll_status_t client_join(hc_boot_t *b, size_t rec_len, double arrive, int *fd_out,
                                  double *deadline_out)
{
    char as[80], why[HC_BWIRE_ERRTEXT_MAX + 1] = "";
    int unverified = 0, tries = 0;
    hcoll_status_t st;
    for (;;) {
        int fd = -1, end;
        HC_CHECK(client_connect(b, arrive, &fd), out);
        tries++;
        *deadline_out = hc_now_ms() + (double)b->timeout_ms;
        st = hc_boot_client_handshake(b, fd, rec_len, *deadline_out, &end, why, sizeof why);
        if (st == HCOLL_SUCCESS) {
            *fd_out = fd;
            return st;
        }
        close(fd);
        if (end == HS_FATAL)
            goto out;
        if (end == HS_UNVERIFIED && ++unverified >= HC_BOOT_UNVERIFIED_MAX) {
            st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_MISMATCH,
                            "init: the root at %s refused this rank %d times without proving "
                            "that it holds the job's secret; its last, unverified, words: '%s' "
                            "(most likely this rank's HCOLL_SECRET or unique id differs from "
                            "rank 0's)",
                            hc_sockaddr_str(&b->root, as, sizeof as), unverified, why);
            goto out;
        }
        if (hc_now_ms() + HC_BIO_CONNECT_RETRY_MS >= arrive) {
            st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_TIMEOUT,
                            "init: the root (rank 0) at %s kept closing the connection before "
                            "authentication for %lld ms (%d attempts; HCOLL_INIT_TIMEOUT_MS)%s%s",
                            hc_sockaddr_str(&b->root, as, sizeof as),
                            (long long)b->init_timeout_ms, tries,
                            why[0] ? "; last unverified refusal: " : "", why);
            goto out;
        }
        HC_INFO(HC_BOOT, b->rank, "bootstrap: %s before authentication; retrying",
                end == HS_UNVERIFIED ? "refused by a peer that did not prove the secret"
                                     : "the root closed the connection or did not answer");
        struct pollfd p = { b->abort_fd, POLLIN, 0 };
        poll(&p, 1, HC_BIO_CONNECT_RETRY_MS);
    }
out:
    return st;
}

hcoll_status_t hc_boot_client_rendezvous(hc_boot_t *b, const void *rec, size_t rec_len,
                                         unsigned char *recs)
{
    /* The root may start late (init's arrival timeout); once it answers,
     * each step of the handshake has the set-up timeout. */
    const double t0 = hc_now_ms(), arrive = t0 + (double)b->init_timeout_ms;
    hcoll_status_t st;
    int fd = -1;
    double deadline;
    HC_CHECK(client_join(b, rec_len, arrive, &fd, &deadline), out);
    b->conn[0] = fd;

    st = hc_bio_send_msg(b, fd, HC_BMSG_RECORD, 0, rec, rec_len, deadline);
    if (st != HCOLL_SUCCESS) {
        st = hc_bio_err(b, st, 0, "init: sending this rank's record", b->timeout_ms);
        goto out;
    }
    /* The root is the one that knows who is missing: give its verdict a
     * moment past our own deadline to arrive. */
    st = hc_boot_client_wait_table(b, fd, recs, (size_t)b->nranks * rec_len,
                           arrive + HC_BOOT_VERDICT_GRACE_MS);
    if (st != HCOLL_SUCCESS)
        goto out;
    HC_TRACE(HC_BOOT, b->rank, "bootstrap: joined in %.0f ms", hc_now_ms() - t0);
    return HCOLL_SUCCESS;

out:
    return st;
}
