/* The bootstrap's messages after the rendezvous (boot/wire.c, io.c,
 * coll.c): what a peer's connection delivers to a set-up collective. The
 * input is the peer's byte stream, fed through real sockets into the real
 * receive paths: a non-root rank's DOWN (hc_bio_recv_msg: headers,
 * heartbeats, ERROR texts, lengths), or the root's gather of two ranks' UP
 * messages (gather_feed / gather_check_hdr), for an allgather, a broadcast
 * or a barrier. Byte 0 picks the role, the collective and a broadcast's
 * root, byte 1 the length this rank expects, byte 2 where the root's two
 * streams split. */
#include "fuzz.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "boot/io.h"

#define NR 3

static void feed(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        p += w, n -= (size_t)w;
    }
    shutdown(fd, SHUT_WR); /* then EOF: the peer is gone */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    const int root_role = data[0] & 1, op = (data[0] >> 1) % 3;
    const size_t len = data[1] % 48;
    const uint8_t *body = data + 3;
    const size_t nbody = size - 3, split = nbody ? data[2] % (nbody + 1) : 0;
    /* Well under a socket buffer, so that feed never blocks. */
    if (nbody > 64 * 1024)
        return 0;

    struct hc_boot b;
    memset(&b, 0, sizeof b);
    int conn[NR] = { -1, -1, -1 }, peer[NR] = { -1, -1, -1 };
    b.rank = root_role ? 0 : 1;
    b.nranks = NR;
    b.timeout_ms = 2000;
    b.init_timeout_ms = 2000;
    b.conn = conn;
    b.abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    atomic_init(&b.aborted, 0);
    atomic_init(&b.broken, HCOLL_SUCCESS);
    pthread_mutex_init(&b.call_lock, NULL);
    FUZZ_CHECK(b.abort_fd >= 0);
    for (int r = 0; r < NR; r++) {
        if (root_role ? r == 0 : r != 0)
            continue;
        int sv[2];
        FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
        conn[r] = sv[0], peer[r] = sv[1];
        hc_bio_nonblock(conn[r]);
    }
    if (root_role) {
        feed(peer[1], body, split);
        feed(peer[2], body + split, nbody - split);
    } else {
        feed(peer[0], body, nbody);
    }

    unsigned char mine[48], out[NR * 48];
    memset(mine, 0xa5, sizeof mine);
    hcoll_status_t st;
    if (op == 0)
        st = hc_boot_allgather(&b, mine, out, len);
    else if (op == 1)
        st = hc_boot_bcast(&b, out, len, root_role ? 1 + ((data[0] >> 3) & 1) : 0);
    else
        st = hc_boot_barrier(&b);
    /* Every failure leaves a message; a success took exactly what was due. */
    if (st != HCOLL_SUCCESS)
        FUZZ_CHECK(hc_bio_errtext(&b)[0] != '\0');
    for (int r = 0; r < NR; r++) {
        if (conn[r] >= 0)
            close(conn[r]);
        if (peer[r] >= 0)
            close(peer[r]);
    }
    close(b.abort_fd);
    pthread_mutex_destroy(&b.call_lock);
    return 0;
}
