/* The liveness links' set-up (inter/ring_link.c): what a ring position
 * reads from whatever connects to its liveness port, and the handshake
 * with prev and next. The input is a script of up to 6 connections made to
 * the position's liveness port before it links (each sends a hello built
 * from fields, or raw bytes, and then closes its sending side), and whether
 * prev itself comes last. Then the position links for real
 * (hc_ring_live_connect): it dials its next (played by a thread of this
 * target, tests/live_peer.h, which also plays prev), and accepts prev.
 * Promises checked beyond memory safety:
 *   - the dial proves the communicator's key to next;
 *   - the link from prev comes up if and only if prev, holding the key,
 *     dialed, and then it is prev's connection: no stranger's bytes, not
 *     even prev's exact hello, make one;
 *   - otherwise the set-up fails with TIMEOUT and a message naming the link;
 *   - every connection refused is closed, and nothing else is left open.
 * The set-up deadline is 30 ms when prev does not come (the wait is all
 * such an input costs) and 10 s otherwise, so that a loaded host never
 * fails a link that should come up. */
#include "fuzz.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "inter/ring_priv.h"
#include "../live_peer.h"

#define LV_MAXCONN 6

static const uint8_t lv_key[32] = "fuzz_live's communicator key...";

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

static int lv_listen(uint16_t *port_out)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 8) == 0);
    FUZZ_CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    *port_out = ntohs(a.sin_port);
    return fd;
}

/* One connection to the position's liveness port that sends len bytes,
 * then ends its sending side; its local port, to know it when accepted. */
static int lv_connect(uint16_t port, const void *bytes, size_t len, uint16_t *local_out)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons(port) };
    socklen_t al = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    FUZZ_CHECK(len == 0 || send(fd, bytes, len, MSG_NOSIGNAL) == (ssize_t)len);
    shutdown(fd, SHUT_WR);
    FUZZ_CHECK(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    *local_out = ntohs(a.sin_port);
    return fd;
}

/* The bytes of connection k from the script: 0..16, built or raw. */
static size_t script_bytes(int prev, int n, uint8_t *b)
{
    lp_hello_t h = { LP_HELLO, (uint32_t)prev, { 0 } };
    unsigned mode = take8();
    switch (mode & 3) {
    case 0: break;                                        /* prev's hello */
    case 1: h.pos = (uint32_t)(take8() % (unsigned)(n + 2)); break; /* a position */
    case 2: h.magic = take32(); break;                    /* a wrong magic, mostly */
    default: {                                            /* raw bytes */
        size_t len = take8() % 49;
        for (size_t i = 0; i < len; i++)
            b[i] = (uint8_t)take8();
        return len;
    }
    }
    for (size_t i = 0; i < sizeof h.nonce; i++)
        h.nonce[i] = (uint8_t)take8();
    memcpy(b, &h, sizeof h);
    size_t len = sizeof h, cut = (mode >> 4) & 31;
    if (cut && cut < len) /* a short hello */
        return cut;
    switch ((mode >> 2) & 3) {
    case 1: b[len++] = 'b'; b[len++] = 'b'; break;        /* beats after it */
    case 2: {                                             /* a forged response */
        lp_resp_t r = { LP_RESP, 0, { 0 } };
        for (size_t i = 0; i < sizeof r.mac; i++)
            r.mac[i] = (uint8_t)take8();
        memcpy(b + len, &r, sizeof r);
        len += sizeof r;
        break;
    }
    case 3: b[len++] = 'q'; break;                        /* a goodbye */
    default: break;
    }
    return len;
}

/* The thread that plays prev (when it comes) and then next. */
typedef struct lv_peers {
    uint16_t port;
    int next_l, rank, prev, next, with_prev;
    int prev_fd, prev_chal_ok, next_ok;
} lv_peers_t;

static void *lv_peers_run(void *arg)
{
    lv_peers_t *pp = arg;
    if (pp->with_prev)
        pp->prev_fd = lp_prev(pp->port, lv_key, pp->rank, pp->prev, 0, &pp->prev_chal_ok);
    pp->next_ok = lp_next(pp->next_l, lv_key, pp->next, pp->rank, 0);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 1024)
        return 0;
    F.p = data;
    F.n = size;
    const unsigned shape = take8();
    const int n = 2 + (int)(shape % 4), rank = (int)(take8() % (unsigned)n);
    const int nconn = (int)((shape >> 2) % (LV_MAXCONN + 1)), with_prev = !((shape >> 5) & 1);
    const int fds_before = open_fds();
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    hc_ring_t *r = calloc(1, sizeof *r);
    FUZZ_CHECK(r != NULL);
    r->rank = rank;
    r->n = n;
    r->next = (rank + 1) % n;
    r->prev = (rank + n - 1) % n;
    r->p.liveness_ms = 60000;
    r->p.tp = (hc_transport_params_t){ .rank = rank, .nranks = n, .bind_addr = "127.0.0.1",
                                       .ifname = "fz", .errbuf = &eb, .auth_key = lv_key,
                                       .mac = hc_hmac_sha256 };
    uint32_t ip = 0, port = 0;
    FUZZ_CHECK(hc_ring_live_listen(r, &ip, &port) == HCOLL_SUCCESS && port != 0);

    int conn[LV_MAXCONN];
    uint16_t local[LV_MAXCONN];
    uint8_t b[128];
    for (int k = 0; k < nconn; k++) {
        size_t len = script_bytes(r->prev, n, b);
        conn[k] = lv_connect((uint16_t)port, b, len, &local[k]);
    }

    r->p.tp.timeout_ms = with_prev ? 10000 : 30;
    uint16_t next_port;
    lv_peers_t pp = { .port = (uint16_t)port, .rank = rank, .prev = r->prev, .next = r->next,
                      .with_prev = with_prev, .prev_fd = -1 };
    pp.next_l = lv_listen(&next_port);
    pthread_t th;
    FUZZ_CHECK(pthread_create(&th, NULL, lv_peers_run, &pp) == 0);
    hcoll_status_t st = hc_ring_live_connect(r, htonl(INADDR_LOOPBACK), next_port);
    pthread_join(th, NULL);
    FUZZ_SAY("live: %d strangers, prev %s: %s %s\n", nconn, with_prev ? "comes" : "does not",
             hcoll_strerror(st), hc_errbuf_get(&eb));
    FUZZ_CHECK(r->live_listen == -1);
    if (!with_prev) {
        FUZZ_CHECK(st == HCOLL_ERR_TIMEOUT);
        /* (Under load even the link to next can miss 30 ms.) */
        FUZZ_CHECK(strstr(hc_errbuf_get(&eb), "from prev") != NULL ||
                   strstr(hc_errbuf_get(&eb), "to next") != NULL);
        FUZZ_CHECK(r->live[0].fd == -1 && r->live[1].fd == -1);
    } else {
        FUZZ_CHECK(st == HCOLL_SUCCESS);
        FUZZ_CHECK(pp.prev_fd >= 0 && pp.prev_chal_ok && pp.next_ok == 1);
        struct sockaddr_in a;
        socklen_t al = sizeof a, pl = sizeof a;
        FUZZ_CHECK(getpeername(r->live[1].fd, (struct sockaddr *)&a, &al) == 0);
        const uint16_t got = ntohs(a.sin_port);
        FUZZ_CHECK(getsockname(pp.prev_fd, (struct sockaddr *)&a, &pl) == 0);
        FUZZ_CHECK(got == ntohs(a.sin_port));
        hc_ring_live_close(r, 0);
    }
    if (pp.prev_fd >= 0)
        close(pp.prev_fd);
    close(pp.next_l);
    for (int k = 0; k < nconn; k++)
        close(conn[k]);
    free(r);
    hc_errbuf_fini(&eb);
    FUZZ_CHECK(open_fds() == fds_before);
    return 0;
}
