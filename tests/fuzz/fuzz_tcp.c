/* TCP data frames (inter/tcp_ep.c): everything a peer's data connection
 * delivers after the hello, through the real receive path (hc_tcp_poll ->
 * sock_read -> parse_frames) of a transport whose one endpoint is a socket
 * the input is written into. Two registered regions (ids 1 and 2, 64 and
 * 4096 bytes, each its own heap block so that ASan sees a write past one)
 * are what frames may name. Every frame either lands inside its region or
 * fails the transport with a message; completions are only of whole
 * frames. */
#include "fuzz.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "inter/tcp_priv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 64 * 1024) /* under a socket buffer: the write never blocks */
        return 0;
    hc_transport_t tr;
    hc_ep_t ep, *eps[1] = { &ep };
    tcp_sock_t sock;
    hc_mr_t mr[2];
    memset(&tr, 0, sizeof tr);
    memset(&ep, 0, sizeof ep);
    memset(&sock, 0, sizeof sock);
    memset(mr, 0, sizeof mr);
    tr.p.rank = 0;
    tr.p.nranks = 2;
    tr.p.log_rank = 0;
    tr.p.nsocks_perpeer = 1;
    tr.listen_fd = -1;
    snprintf(tr.bind_addr, sizeof tr.bind_addr, "127.0.0.1");
    tr.epfd = epoll_create1(EPOLL_CLOEXEC);
    FUZZ_CHECK(tr.epfd >= 0);
    mr[0] = (hc_mr_t){ .id = 2, .remote = 1, .base = malloc(4096), .len = 4096 };
    mr[1] = (hc_mr_t){ .id = 1, .remote = 1, .base = malloc(64), .len = 64, .next = &mr[0] };
    FUZZ_CHECK(mr[0].base && mr[1].base);
    tr.mrs = &mr[1];
    tr.eps = eps;
    tr.neps = 1;
    ep.tr = &tr;
    ep.peer = 1;
    ep.nsocks = 1;
    ep.socks = &sock;

    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    sock.fd = sv[0];
    sock.ep = &ep;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &sock };
    FUZZ_CHECK(epoll_ctl(tr.epfd, EPOLL_CTL_ADD, sock.fd, &ev) == 0);
    sock.in_epoll = 1;
    for (size_t off = 0; off < size;) {
        ssize_t w = send(sv[1], data + off, size - off, MSG_NOSIGNAL);
        FUZZ_CHECK(w > 0);
        off += (size_t)w;
    }
    shutdown(sv[1], SHUT_WR);

    /* Until the transport fails or the connection is drained and closed;
     * each poll reads at most 64 chunks, so this ends. */
    hc_comp_t comps[16];
    hcoll_status_t st = HCOLL_SUCCESS;
    for (int i = 0; i < 100000 && st == HCOLL_SUCCESS && sock.in_epoll; i++) {
        int n = 0;
        st = hc_tcp_poll(&tr, comps, 16, 0, &n);
        for (int k = 0; k < n; k++)
            FUZZ_CHECK(comps[k].kind == HC_COMP_IMM && comps[k].peer == 1);
    }
    if (st != HCOLL_SUCCESS)
        FUZZ_CHECK(tr.err == st);
    hc_compq_free(&tr.cq);
    close(sv[0]);
    close(sv[1]);
    close(tr.epfd);
    free(mr[0].base);
    free(mr[1].base);
    return 0;
}
