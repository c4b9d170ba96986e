/*
 * Connection I/O of a bootstrap (see io.h): the deadline- and abort-aware
 * transfers, framed messages and error wording shared by the root, the
 * client and the set-up collectives, plus the rendezvous listener.
 */
#include "boot/io.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

void hc_bio_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

void hc_bio_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

const char *hc_bio_peer_str(int fd, char *buf, size_t len)
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

hcoll_status_t hc_bio_aborted(hc_boot_t *b, const char *what)
{
    return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_ABORTED,
                      "%s: the communicator was aborted", what);
}

hcoll_status_t hc_bio_wait(hc_boot_t *b, int fd, short events, double deadline)
{
    for (;;) {
        if (hc_bio_is_aborted(b))
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

hcoll_status_t hc_bio_send(hc_boot_t *b, int fd, const void *buf, size_t len, double deadline)
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
            hcoll_status_t st = hc_bio_wait(b, fd, POLLOUT, deadline);
            if (st != HCOLL_SUCCESS)
                return st;
            continue;
        }
        b->saved_errno = n < 0 ? errno : EPIPE;
        return HCOLL_ERR_PEER_FAILED;
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_bio_recv(hc_boot_t *b, int fd, void *buf, size_t len, double deadline)
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
            hcoll_status_t st = hc_bio_wait(b, fd, POLLIN, deadline);
            if (st != HCOLL_SUCCESS)
                return st;
            continue;
        }
        b->saved_errno = errno;
        return HCOLL_ERR_PEER_FAILED;
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_bio_send_msg(hc_boot_t *b, int fd, unsigned type, uint32_t arg,
                               const void *body, size_t len, double deadline)
{
    unsigned char h[HC_BWIRE_HDR_BYTES];
    hc_bwire_pack(h, type, (uint32_t)len, arg);
    hcoll_status_t st = hc_bio_send(b, fd, h, sizeof h, deadline);
    if (st == HCOLL_SUCCESS && len)
        st = hc_bio_send(b, fd, body, len, deadline);
    return st;
}

hcoll_status_t hc_bio_err(hc_boot_t *b, hcoll_status_t st, int who, const char *what,
                          int64_t waited_ms)
{
    switch (st) {
    case HCOLL_ERR_ABORTED:
        return hc_bio_aborted(b, what);
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

hcoll_status_t hc_bio_recv_msg(hc_boot_t *b, int fd, int who, unsigned type, uint32_t arg,
                               void *body, size_t len, double deadline, const char *what)
{
    unsigned char hb[HC_BWIRE_HDR_BYTES];
    const double t0 = hc_now_ms();
    hc_bwire_hdr_t h;
    char why[96];
    hcoll_status_t st;
    do {
        /* A heartbeat the rendezvous left in flight says nothing here. */
        st = hc_bio_recv(b, fd, hb, sizeof hb, deadline);
        if (st != HCOLL_SUCCESS)
            return hc_bio_err(b, st, who, what, (int64_t)(deadline - t0));
        hc_bwire_unpack(hb, &h);
        if (!hc_bwire_sane(&h, why, sizeof why))
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_NETWORK,
                              "%s: rank %d sent a malformed message (%s)", what, who, why);
    } while (h.type == HC_BMSG_BEAT && h.len == 0 && type != HC_BMSG_BEAT);
    if (h.type == HC_BMSG_ERROR) {
        char text[HC_BWIRE_ERRTEXT_MAX + 1];
        st = hc_bio_recv(b, fd, text, h.len, deadline);
        text[st == HCOLL_SUCCESS ? h.len : 0] = '\0';
        hc_bwire_sanitize(text);
        return hc_err_set(b->eb, HC_BOOT, b->rank, hc_bwire_status(h.arg),
                          "%s: rank %d reports: %s", what, who, text[0] ? text : "(no text)");
    }
    if (h.type != type || h.arg != arg) {
        if (h.type == type && (type == HC_BMSG_UP || type == HC_BMSG_DOWN)) {
            unsigned op = h.arg >> 24, myop = arg >> 24;
            return hc_err_set(b->eb, HC_BOOT, b->rank, HCOLL_ERR_MISMATCH,
                              "%s: rank %d is in %s #%u while this rank is in %s #%u "
                              "(set-up collectives called in a different order)",
                              what, who, hc_bwire_op_name(op), h.arg & 0xffffff,
                              hc_bwire_op_name(myop), arg & 0xffffff);
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
        st = hc_bio_recv(b, fd, body, len, deadline);
        if (st != HCOLL_SUCCESS)
            return hc_bio_err(b, st, who, what, (int64_t)(deadline - t0));
    }
    return HCOLL_SUCCESS;
}

void hc_bio_send_error_nb(int fd, hcoll_status_t st, const char *text)
{
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_ERRTEXT_MAX];
    size_t n = strlen(text);
    if (n > HC_BWIRE_ERRTEXT_MAX)
        n = HC_BWIRE_ERRTEXT_MAX;
    hc_bwire_pack(m, HC_BMSG_ERROR, (uint32_t)n, (uint32_t)st);
    memcpy(m + HC_BWIRE_HDR_BYTES, text, n);
    ssize_t r = send(fd, m, HC_BWIRE_HDR_BYTES + n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)r;
}

const char *hc_bio_errtext(hc_boot_t *b)
{
    return hc_errbuf_get(b->eb ? b->eb : hc_errbuf_thread());
}

void hc_bio_break(hc_boot_t *b, hcoll_status_t st)
{
    int expected = HCOLL_SUCCESS;
    if (!atomic_compare_exchange_strong(&b->broken, &expected, (int)st))
        return;
    if (b->rank == 0) {
        for (int r = 1; r < b->nranks; r++) {
            if (b->conn[r] < 0)
                continue;
            if (st != HCOLL_ERR_ABORTED)
                hc_bio_send_error_nb(b->conn[r], st, hc_bio_errtext(b));
            shutdown(b->conn[r], SHUT_RDWR);
        }
    } else if (b->conn[0] >= 0) {
        shutdown(b->conn[0], SHUT_RDWR);
    }
}

hcoll_status_t hc_boot_socket(const hc_sockaddr_t *addr, int flags, hc_errbuf_t *eb, int rank,
                              const char *what, int *fd_out, hc_sockaddr_t *addr_out)
{
    char as[80];
    hcoll_status_t st;
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return hc_err_set(eb, HC_BOOT, rank, HCOLL_ERR_NETWORK, "%s: socket: %s", what,
                          strerror(errno));
    int one = 1;
    if ((flags & HC_BOOT_SOCK_REUSEPORT) &&
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
        st = hc_err_set(eb, HC_BOOT, rank, HCOLL_ERR_NETWORK, "%s: SO_REUSEPORT: %s", what,
                        strerror(errno));
        goto clean_socket;
    }
    if (flags & HC_BOOT_SOCK_REUSEADDR)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (addr->sa.sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, &addr->sa, hc_sockaddr_len(addr)) != 0) {
        const int e = errno;
        st = hc_err_set(eb, HC_BOOT, rank, HCOLL_ERR_NETWORK,
                        "%s: cannot bind the rendezvous listener to %s: %s%s", what,
                        hc_sockaddr_str(addr, as, sizeof as), strerror(e),
                        e == EADDRNOTAVAIL ? " (the root address must be one of rank 0's own)"
                        : e == EADDRINUSE && (flags & HC_BOOT_SOCK_REUSEPORT)
                            ? " (the port is held by a process that is not the id's maker, or "
                              "by another user)"
                            : "");
        goto clean_socket;
    }
    if ((flags & HC_BOOT_SOCK_LISTEN) && listen(fd, HC_BOOT_BACKLOG) != 0) {
        st = hc_err_set(eb, HC_BOOT, rank, HCOLL_ERR_NETWORK, "%s: listen on %s: %s", what,
                        hc_sockaddr_str(addr, as, sizeof as), strerror(errno));
        goto clean_socket;
    }
    if (addr_out) {
        socklen_t l = sizeof *addr_out;
        memset(addr_out, 0, sizeof *addr_out);
        if (getsockname(fd, &addr_out->sa, &l) != 0) {
            st = hc_err_set(eb, HC_BOOT, rank, HCOLL_ERR_NETWORK, "%s: getsockname: %s", what,
                            strerror(errno));
            goto clean_socket;
        }
    }
    *fd_out = fd;
    return HCOLL_SUCCESS;

clean_socket:
    close(fd);
    return st;
}

/* "3,5-7" */
void hc_bio_format_ranks(const char *present, int n, char *out, size_t len)
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

int hc_bio_beat_ms(const hc_boot_t *b)
{
    int64_t ms = b->liveness_ms / 8;
    return ms < 5 ? 5 : ms > 1000 ? 1000 : (int)ms;
}

void hc_bio_beat_nb(int fd)
{
    unsigned char m[HC_BWIRE_HDR_BYTES];
    hc_bwire_pack(m, HC_BMSG_BEAT, 0, 0);
    /* 16 bytes into a socket that carries nothing else while the
     * rendezvous waits: it fits, or the peer is long gone. */
    (void)send(fd, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

int hc_bio_take_beat(int fd)
{
    unsigned char hb[HC_BWIRE_HDR_BYTES];
    ssize_t n = recv(fd, hb, sizeof hb, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0 && n < (ssize_t)sizeof hb) {
        /* Part of a header: the rest is on its way, unless the peer has
         * shut its side (then the waits that call this would spin on the
         * readable socket until their deadline). */
        struct pollfd p = { fd, POLLRDHUP, 0 };
        return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) ? -1 : 0;
    }
    if (n != (ssize_t)sizeof hb)
        return n < 0 && (errno == EAGAIN || errno == EINTR) ? 0 : -1;
    hc_bwire_hdr_t h;
    char why[96];
    hc_bwire_unpack(hb, &h);
    if (!hc_bwire_sane(&h, why, sizeof why) || h.type != HC_BMSG_BEAT || h.len != 0)
        return -1;
    return recv(fd, hb, sizeof hb, MSG_DONTWAIT) == (ssize_t)sizeof hb ? 1 : -1;
}
