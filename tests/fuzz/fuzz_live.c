/* The liveness link's hello (inter/ring_live.c): the 8 bytes {"HCLV",
 * position} a ring position sends when it dials its next, and that
 * live_accept reads from whatever connects to its liveness port. The input
 * is a script of up to 6 connections made to one position's liveness port
 * before it links (each sends a hello built from fields, or raw bytes, and
 * then closes its sending side), and whether prev's own hello comes last.
 * Then the position links for real (hc_ring_live_connect): it dials its
 * next (a listener of this target) and accepts its prev.
 * Promises checked beyond memory safety:
 *   - the dial sends exactly {"HCLV", rank};
 *   - the link from prev comes up if and only if some connection's first 8
 *     bytes are prev's hello, and it is the first such connection;
 *   - otherwise the set-up fails with TIMEOUT and a message naming the link;
 *   - every connection refused is closed, and nothing else is left open.
 * The set-up deadline is 30 ms when no connection carries prev's hello
 * (the wait is all such an input costs) and 10 s otherwise, so that a
 * loaded host never fails a link that should come up. */
#include "fuzz.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/err.h"
#include "inter/ring_priv.h"

#define LV_MAGIC 0x48434c56u /* "HCLV", as ring_live.c sends it */
#define LV_MAXCONN 6

typedef struct lv_hello {
    uint32_t magic;
    uint32_t pos;
} lv_hello_t;

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
    lv_hello_t h = { LV_MAGIC, (uint32_t)prev };
    unsigned mode = take8();
    switch (mode & 3) {
    case 0: break;                                        /* prev's hello */
    case 1: h.pos = (uint32_t)(take8() % (unsigned)(n + 2)); break; /* a position */
    case 2: h.magic = take32(); break;                    /* a wrong magic, mostly */
    default: {                                            /* raw bytes */
        size_t len = take8() % 17;
        for (size_t i = 0; i < len; i++)
            b[i] = (uint8_t)take8();
        return len;
    }
    }
    memcpy(b, &h, sizeof h);
    size_t len = sizeof h, extra = (mode >> 2) & 3, cut = (mode >> 4) & 7;
    if (cut && cut < len) /* a short hello */
        return cut;
    for (size_t i = 0; i < extra; i++) /* beats or a goodbye after it */
        b[len++] = (mode >> 6) & 1 ? 'q' : 'b';
    return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 512)
        return 0;
    F.p = data;
    F.n = size;
    const unsigned shape = take8();
    const int n = 2 + (int)(shape % 4), rank = (int)(take8() % (unsigned)n);
    const int nconn = (int)((shape >> 2) % (LV_MAXCONN + 1)), prev_last = !((shape >> 5) & 1);
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
                                       .ifname = "fz", .errbuf = &eb };
    uint32_t ip = 0, port = 0;
    FUZZ_CHECK(hc_ring_live_listen(r, &ip, &port) == HCOLL_SUCCESS && port != 0);

    int conn[LV_MAXCONN + 1], nc = 0, want = -1;
    uint16_t local[LV_MAXCONN + 1];
    uint8_t b[32];
    for (int k = 0; k < nconn + prev_last; k++) {
        size_t len;
        if (k < nconn) {
            len = script_bytes(r->prev, n, b);
        } else {
            lv_hello_t h = { LV_MAGIC, (uint32_t)r->prev };
            memcpy(b, &h, sizeof h);
            len = sizeof h;
        }
        lv_hello_t got;
        memcpy(&got, b, sizeof got);
        if (want < 0 && len >= sizeof got && got.magic == LV_MAGIC && got.pos == (uint32_t)r->prev)
            want = k;
        conn[nc] = lv_connect((uint16_t)port, b, len, &local[nc]);
        nc++;
    }

    r->p.tp.timeout_ms = want < 0 ? 30 : 10000;
    uint16_t next_port;
    int next_l = lv_listen(&next_port);
    hcoll_status_t st = hc_ring_live_connect(r, htonl(INADDR_LOOPBACK), next_port);
    FUZZ_SAY("live: %d connections, prev's hello at %d: %s %s\n", nc, want, hcoll_strerror(st),
             hc_errbuf_get(&eb));
    FUZZ_CHECK(r->live_listen == -1);
    if (want < 0) {
        FUZZ_CHECK(st == HCOLL_ERR_TIMEOUT);
        /* (Under load even the dial to next can miss 30 ms.) */
        FUZZ_CHECK(strstr(hc_errbuf_get(&eb), "from prev") != NULL ||
                   strstr(hc_errbuf_get(&eb), "to next") != NULL);
        FUZZ_CHECK(r->live[0].fd == -1 && r->live[1].fd == -1);
    } else {
        FUZZ_CHECK(st == HCOLL_SUCCESS);
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        FUZZ_CHECK(getpeername(r->live[1].fd, (struct sockaddr *)&a, &al) == 0);
        FUZZ_CHECK(ntohs(a.sin_port) == local[want]);
        /* The dial's hello, as next receives it. */
        int nfd = accept(next_l, NULL, NULL);
        FUZZ_CHECK(nfd >= 0);
        lv_hello_t h;
        FUZZ_CHECK(recv(nfd, &h, sizeof h, MSG_WAITALL) == (ssize_t)sizeof h);
        FUZZ_CHECK(h.magic == LV_MAGIC && h.pos == (uint32_t)rank);
        close(nfd);
        hc_ring_live_close(r, 0);
    }
    close(next_l);
    for (int k = 0; k < nc; k++)
        close(conn[k]);
    free(r);
    hc_errbuf_fini(&eb);
    FUZZ_CHECK(open_fds() == fds_before);
    return 0;
}
