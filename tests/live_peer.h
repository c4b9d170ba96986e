/*
 * The other ends of a ring position's liveness links (inter/ring_link.c),
 * written from the protocol, for tests and the fuzz target: a prev that
 * dials the position's liveness port and proves a key, and a next that
 * accepts the position's dial and checks its proof.
 *
 *   HELLO {"HCLV", pos, nd[16]}  CHAL {"HCLC", 0, na[16], mac[32]}
 *   RESP  {"HCLR", 0, mac[32]}
 *   mac = HMAC(K, side | acceptor pos | dialer pos | nd | na),
 *   K = HMAC(communicator key, "hcoll-live-hello-v1")
 */
#ifndef HC_TESTS_LIVE_PEER_H
#define HC_TESTS_LIVE_PEER_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "boot/hmac.h"

#define LP_HELLO 0x48434c56u
#define LP_CHAL 0x48434c43u
#define LP_RESP 0x48434c52u

typedef struct lp_hello {
    uint32_t magic, pos;
    uint8_t nonce[16];
} lp_hello_t;
typedef struct lp_chal {
    uint32_t magic, pad;
    uint8_t nonce[16];
    uint8_t mac[32];
} lp_chal_t;
typedef struct lp_resp {
    uint32_t magic, pad;
    uint8_t mac[32];
} lp_resp_t;

static inline void lp_mac(const uint8_t *commkey, const char side[4], int acc, int dia,
                          const uint8_t nd[16], const uint8_t na[16], uint8_t out[32])
{
    uint8_t k[32], m[44];
    const uint32_t w[2] = { (uint32_t)acc, (uint32_t)dia };
    hc_hmac_sha256(commkey, 32, "hcoll-live-hello-v1", 19, k);
    memcpy(m, side, 4);
    memcpy(m + 4, w, 8);
    memcpy(m + 12, nd, 16);
    memcpy(m + 28, na, 16);
    hc_hmac_sha256(k, 32, m, sizeof m, out);
}

/* Read exactly len bytes within ms: 0, or -1. */
static inline int lp_recv(int fd, void *buf, size_t len, int ms)
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

static inline int lp_dial(uint16_t port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons(port) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Play prev: dial port, say hello as position dia to acceptor position acc,
 * check the challenge against commkey (1 if it proved the key), answer it
 * (flip: with one bit of the MAC flipped). The socket, or -1. */
static inline int lp_prev(uint16_t port, const uint8_t *commkey, int acc, int dia, int flip,
                          int *chal_ok)
{
    int fd = lp_dial(port);
    if (fd < 0)
        return -1;
    lp_hello_t h = { LP_HELLO, (uint32_t)dia, { 0 } };
    for (int i = 0; i < 16; i++)
        h.nonce[i] = (uint8_t)(rand() & 0xff);
    lp_chal_t c;
    uint8_t want[32];
    if (send(fd, &h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h ||
        lp_recv(fd, &c, sizeof c, 10000) != 0) {
        close(fd);
        return -1;
    }
    lp_mac(commkey, "acc", acc, dia, h.nonce, c.nonce, want);
    *chal_ok = c.magic == LP_CHAL && memcmp(want, c.mac, 32) == 0;
    lp_resp_t r = { LP_RESP, 0, { 0 } };
    lp_mac(commkey, "dia", acc, dia, h.nonce, c.nonce, r.mac);
    if (flip)
        r.mac[31] ^= 1;
    if (send(fd, &r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Play next on listener lfd: accept the position's dial, expect its hello
 * as position dia, challenge it as position acc under commkey (flip: one
 * bit of our MAC flipped), and check its response. 1 when the position
 * proved the key, 0 when it did not answer or answered wrong, -1 on a
 * malformed hello. */
static inline int lp_next(int lfd, const uint8_t *commkey, int acc, int dia, int flip)
{
    struct pollfd p = { lfd, POLLIN, 0 };
    if (poll(&p, 1, 10000) <= 0)
        return 0;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return 0;
    lp_hello_t h;
    int ok = -1;
    if (lp_recv(fd, &h, sizeof h, 10000) == 0 && h.magic == LP_HELLO &&
        h.pos == (uint32_t)dia) {
        lp_chal_t c = { LP_CHAL, 0, { 0 }, { 0 } };
        for (int i = 0; i < 16; i++)
            c.nonce[i] = (uint8_t)(rand() & 0xff);
        lp_mac(commkey, "acc", acc, dia, h.nonce, c.nonce, c.mac);
        if (flip)
            c.mac[0] ^= 0x80;
        lp_resp_t r;
        uint8_t want[32];
        lp_mac(commkey, "dia", acc, dia, h.nonce, c.nonce, want);
        ok = send(fd, &c, sizeof c, MSG_NOSIGNAL) == (ssize_t)sizeof c &&
             lp_recv(fd, &r, sizeof r, flip ? 500 : 10000) == 0 && r.magic == LP_RESP &&
             memcmp(want, r.mac, 32) == 0;
    }
    close(fd);
    return ok;
}

#endif
