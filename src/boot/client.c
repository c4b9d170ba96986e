/*
 * A non-root rank's side of the rendezvous: connect to the root (retrying
 * while it is not listening yet), answer its challenge, check that the
 * root holds the key too, send this rank's record and wait for the table.
 *
 *   connect ─► CHALLENGE ─► AUTH ─► AUTH_OK (MAC checked) ─► RECORD ─► TABLE
 *
 * The root may drop a connection before authentication when a flood of
 * strangers fills its pending table; the client then retries until its
 * deadline. Once connected, the root is the one that knows who is
 * missing, so the wait for the table runs HC_BOOT_VERDICT_GRACE_MS past
 * this rank's own deadline to hear its verdict.
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

/* One attempt at the handshake. *retry_out = 1 when the root dropped us in
 * a way worth retrying (evicted under a flood). */
static hcoll_status_t client_handshake(hc_boot_t *b, int fd, const unsigned char *key,
                                       size_t rec_len, double deadline, int *retry_out)
{
    char as[80];
    unsigned char hb[HC_BWIRE_HDR_BYTES];
    hc_bwire_hdr_t h;
    char why[96];
    *retry_out = 0;
    hcoll_status_t st = hc_bio_recv(b, fd, hb, sizeof hb, deadline);
    if (st == HCOLL_ERR_PEER_FAILED) {
        *retry_out = 1;
        return st;
    }
    if (st != HCOLL_SUCCESS)
        return hc_bio_err(b, st, 0, "init: waiting for the root's challenge", b->timeout_ms);
    hc_bwire_unpack(hb, &h);
    if (!hc_bwire_sane(&h, why, sizeof why) || h.type != HC_BMSG_CHALLENGE ||
        h.len != HC_BWIRE_NONCE_BYTES)
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NETWORK,
                          "init: %s does not speak the hcoll bootstrap protocol (%s)",
                          hc_sockaddr_str(&b->root, as, sizeof as),
                          hc_bwire_sane(&h, why, sizeof why) ? "unexpected first message" : why);
    unsigned char nonce_s[HC_BWIRE_NONCE_BYTES];
    st = hc_bio_recv(b, fd, nonce_s, HC_BWIRE_NONCE_BYTES, deadline);
    if (st != HCOLL_SUCCESS) {
        *retry_out = st == HCOLL_ERR_PEER_FAILED;
        return *retry_out ? st : hc_bio_err(b, st, 0, "init: reading the challenge", b->timeout_ms);
    }

    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES];
    unsigned char *a = m + HC_BWIRE_HDR_BYTES;
    hc_bwire_pack(m, HC_BMSG_AUTH, HC_BWIRE_AUTH_BYTES, 0);
    hc_bwire_put32(a, (uint32_t)b->rank);
    hc_bwire_put32(a + 4, (uint32_t)b->nranks);
    hc_bwire_put32(a + 8, (uint32_t)rec_len);
    if (hc_random_bytes(a + 12, HC_BWIRE_NONCE_BYTES) != 0)
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_SYSTEM, "init: getrandom: %s",
                          strerror(errno));
    hc_bwire_mac(key, 'C', nonce_s, a + 12, (uint32_t)b->rank, (uint32_t)b->nranks,
                 (uint32_t)rec_len, a + 12 + HC_BWIRE_NONCE_BYTES);
    st = hc_bio_send(b, fd, m, sizeof m, deadline);
    if (st != HCOLL_SUCCESS) {
        *retry_out = st == HCOLL_ERR_PEER_FAILED;
        return *retry_out ? st
                          : hc_bio_err(b, st, 0, "init: sending the authentication", b->timeout_ms);
    }

    unsigned char ok[HC_BWIRE_MAC_BYTES], want[HC_BWIRE_MAC_BYTES];
    st = hc_bio_recv_msg(b, fd, 0, HC_BMSG_AUTH_OK, 0, ok, HC_BWIRE_MAC_BYTES, deadline,
                         "init: authentication");
    if (st != HCOLL_SUCCESS)
        return st;
    hc_bwire_mac(key, 'S', nonce_s, a + 12, (uint32_t)b->rank, (uint32_t)b->nranks,
                 (uint32_t)rec_len, want);
    if (!hc_ct_equal(ok, want, HC_BWIRE_MAC_BYTES))
        return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_MISMATCH,
                          "init: the process at %s did not prove that it holds the job's "
                          "secret (wrong unique id, or someone else listens there)",
                          hc_sockaddr_str(&b->root, as, sizeof as));
    return HCOLL_SUCCESS;
}

/* Wait for the table (or the root's verdict) up to the init deadline,
 * showing the root that this rank is alive and watching that it is. */
static hcoll_status_t client_wait_table(hc_boot_t *b, int fd, unsigned char *recs,
                                        size_t len, double deadline)
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

hcoll_status_t hc_boot_client_rendezvous(hc_boot_t *b, const unsigned char *key, const void *rec,
                                         size_t rec_len, unsigned char *recs)
{
    /* The root may start late (init's arrival timeout); once it answers,
     * each step of the handshake has the set-up timeout. */
    const double t0 = hc_now_ms(), arrive = t0 + (double)b->init_timeout_ms;
    hcoll_status_t st;
    int fd = -1;
    double deadline = arrive;
    for (;;) {
        HC_CHECK(client_connect(b, arrive, &fd), out);
        int retry;
        deadline = hc_now_ms() + (double)b->timeout_ms;
        st = client_handshake(b, fd, key, rec_len, deadline, &retry);
        if (st == HCOLL_SUCCESS)
            break;
        close(fd);
        fd = -1;
        if (!retry)
            goto out;
        if (hc_now_ms() + HC_BIO_CONNECT_RETRY_MS >= arrive) {
            char as[80];
            st = hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_TIMEOUT,
                            "init: the root (rank 0) at %s kept closing the connection before "
                            "authentication for %lld ms (HCOLL_INIT_TIMEOUT_MS)",
                            hc_sockaddr_str(&b->root, as, sizeof as),
                            (long long)b->init_timeout_ms);
            goto out;
        }
        HC_INFO(HC_BOOT, b->rank, "bootstrap: the root closed the connection before "
                                  "authentication; retrying");
        usleep(HC_BIO_CONNECT_RETRY_MS * 1000);
    }
    b->conn[0] = fd;

    st = hc_bio_send_msg(b, fd, HC_BMSG_RECORD, 0, rec, rec_len, deadline);
    if (st != HCOLL_SUCCESS) {
        st = hc_bio_err(b, st, 0, "init: sending this rank's record", b->timeout_ms);
        goto out;
    }
    /* The root is the one that knows who is missing: give its verdict a
     * moment past our own deadline to arrive. */
    st = client_wait_table(b, fd, recs, (size_t)b->nranks * rec_len,
                           arrive + HC_BOOT_VERDICT_GRACE_MS);
    if (st != HCOLL_SUCCESS)
        goto out;
    HC_TRACE(HC_BOOT, b->rank, "bootstrap: joined in %.0f ms", hc_now_ms() - t0);
    return HCOLL_SUCCESS;

out:
    return st;
}
