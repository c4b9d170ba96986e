/*
 * The TCP transport's hello and region keys, against a peer written here
 * from the protocol's description (src/inter/tcp_hello.c), not with the
 * transport's own code: a thread plays the other end of one transport,
 * honest or not.
 *   - acceptor: idle strangers, garbage, a hello for another instance, a
 *     wrong MAC, a MAC with one bit flipped, a replayed hello + response
 *     are all dropped while the honest dialer still connects at once;
 *   - dialer: an acceptor whose challenge MAC has one bit flipped ends
 *     connect with HCOLL_ERR_MISMATCH, an honest one connects;
 *   - a timeout names who is missing and what was dropped;
 *   - accept4 failing with EMFILE does not spin;
 *   - a put naming a guessed or send-only region key is refused, nothing
 *     written.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "common/ranks.h"
#include "common/seam.h"
#include "base/err.h"
#include "boot/hmac.h"
#include "inter/tcp_priv.h"

#define TEST_TIMEOUT_S 60

static const unsigned char tp_key[HC_TP_KEY_BYTES] = "test_tcp_hello's key";
static hc_errbuf_t eb;

/* The transport under test is position `me` of 2; the fake exchange gives
 * the other position `other` (an address the thread may listen on). */
static tcp_addr_t g_mine, g_other;
static volatile int g_exchanged;

static hcoll_status_t fake_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    int me = *(int *)ctx;
    memcpy(&g_mine, mine, sizeof g_mine);
    memcpy((char *)all + (size_t)me * len, mine, len);
    memcpy((char *)all + (size_t)(1 - me) * len, &g_other, len);
    __atomic_store_n(&g_exchanged, 1, __ATOMIC_RELEASE);
    return HCOLL_SUCCESS;
}

static hc_transport_t *make_tr(int me, int timeout_ms)
{
    hc_errbuf_init(&eb);
    hc_transport_params_t p = { .rank = me, .nranks = 2, .bind_addr = "127.0.0.1",
                                .ifname = "lo", .log_rank = me, .timeout_ms = timeout_ms,
                                .nsocks_perpeer = 1, .errbuf = &eb, .gpu = -1,
                                .auth_key = tp_key, .mac = hc_hmac_sha256 };
    hc_transport_t *tr = NULL;
    ck_assert_int_eq(hc_tcp_ops.create(&p, &tr), HCOLL_SUCCESS);
    return tr;
}

/* The hello's MAC as the protocol defines it. */
static void spec_mac(const char *label, uint64_t token, uint32_t acc, uint32_t dia,
                     const unsigned char *nd, const unsigned char *na, unsigned char *out)
{
    hc_hmac_t h;
    unsigned char k[HC_SHA256_BYTES];
    hc_hmac_sha256(tp_key, sizeof tp_key, "hcoll-tcp-hello-v1", 18, k);
    uint32_t w[4] = { acc, dia, 0 /* sock */, 1 /* nsocks */ };
    hc_hmac_init(&h, k, sizeof k);
    hc_hmac_update(&h, label, 4);
    hc_hmac_update(&h, &token, 8);
    hc_hmac_update(&h, w, sizeof w);
    hc_hmac_update(&h, nd, HC_TCP_NONCE);
    hc_hmac_update(&h, na, HC_TCP_NONCE);
    hc_hmac_final(&h, out);
}

static int dial_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int io_all(int fd, void *buf, size_t len, int writing)
{
    for (size_t done = 0; done < len;) {
        struct pollfd pf = { fd, writing ? POLLOUT : POLLIN, 0 };
        if (poll(&pf, 1, 5000) != 1)
            return -1;
        ssize_t n = writing ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, len - done, 0);
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

/* 1 when the far end closed fd within ms (what a refusal looks like). */
static int closed_within(int fd, int ms)
{
    char c;
    struct pollfd pf = { fd, POLLIN, 0 };
    return poll(&pf, 1, ms) == 1 && recv(fd, &c, 1, 0) <= 0;
}

/* ------------------------------------------------------------------------ */
/* The acceptor refuses every kind of stranger, takes the honest dialer      */
/* ------------------------------------------------------------------------ */

typedef struct dialer {
    int port;
    int fails;      /* refusals that did not happen */
    char why[256];
    double t_honest; /* when the honest dial started */
} dialer_t;

static void note_fail(dialer_t *d, const char *what)
{
    d->fails++;
    snprintf(d->why, sizeof d->why, "%s", what);
}

/* Hello for rank 0 socket 0 with nonce nd; reads the challenge's nonce. */
static int hello(int fd, uint64_t token, const unsigned char *nd, unsigned char *na_out)
{
    tcp_hello_t h = { HC_TCP_HELLO_MAGIC, 0, 0, 1, token, { 0 } };
    memcpy(h.nonce, nd, HC_TCP_NONCE);
    tcp_chal_t c;
    if (io_all(fd, &h, sizeof h, 1) || io_all(fd, &c, sizeof c, 0) ||
        c.magic != HC_TCP_CHAL_MAGIC)
        return -1;
    memcpy(na_out, c.nonce, HC_TCP_NONCE);
    /* The acceptor proved the key over our nonce and its own. */
    unsigned char want[HC_SHA256_BYTES];
    spec_mac("acc", token, 1, 0, nd, c.nonce, want);
    return memcmp(want, c.mac, sizeof want) ? -1 : 0;
}

static int respond(int fd, const unsigned char *mac)
{
    tcp_resp_t r = { HC_TCP_RESP_MAGIC, 0, { 0 } };
    memcpy(r.mac, mac, sizeof r.mac);
    return io_all(fd, &r, sizeof r, 1);
}

static void attack_macs(dialer_t *d, uint64_t token)
{
    unsigned char nd[HC_TCP_NONCE] = "fixed nonce Nd!", na[HC_TCP_NONCE], na2[HC_TCP_NONCE];
    unsigned char mac[HC_SHA256_BYTES];
    /* A random MAC. */
    int fd = dial_port(d->port);
    if (fd < 0 || hello(fd, token, nd, na) != 0) {
        note_fail(d, "no valid challenge to a plausible hello");
    } else {
        memset(mac, 0xA5, sizeof mac);
        if (respond(fd, mac) != 0 || !closed_within(fd, 3000))
            note_fail(d, "a wrong MAC was not refused");
    }
    close(fd);
    /* The right MAC with one bit of its last byte flipped. */
    fd = dial_port(d->port);
    if (fd < 0 || hello(fd, token, nd, na) != 0) {
        note_fail(d, "no valid challenge (bit flip)");
    } else {
        spec_mac("dia", token, 1, 0, nd, na, mac);
        mac[HC_SHA256_BYTES - 1] ^= 0x01;
        if (respond(fd, mac) != 0 || !closed_within(fd, 3000))
            note_fail(d, "a MAC with one bit flipped was not refused");
    }
    close(fd);
    /* Replay: what an honest dialer sent on one connection (hello with nd,
     * the response to the challenge na), sent again on another. */
    fd = dial_port(d->port);
    if (fd < 0 || hello(fd, token, nd, na) != 0)
        note_fail(d, "no valid challenge (recording)");
    spec_mac("dia", token, 1, 0, nd, na, mac);
    close(fd); /* the recording: never completed here, or it would take the slot */
    fd = dial_port(d->port);
    if (fd < 0 || hello(fd, token, nd, na2) != 0) {
        note_fail(d, "no valid challenge (replay)");
    } else {
        if (memcmp(na, na2, sizeof na) == 0)
            note_fail(d, "the acceptor's nonce repeated");
        if (respond(fd, mac) != 0 || !closed_within(fd, 3000))
            note_fail(d, "a replayed response was not refused");
    }
    close(fd);
}

static void *dialer_main(void *arg)
{
    dialer_t *d = arg;
    while (!__atomic_load_n(&g_exchanged, __ATOMIC_ACQUIRE))
        usleep(1000);
    uint64_t token = g_mine.token;
    int idle[12];
    for (int i = 0; i < 12; i++) /* held open, silent, until the end */
        idle[i] = dial_port(d->port);
    int fd = dial_port(d->port);
    char junk[sizeof(tcp_hello_t)];
    memset(junk, 'G', sizeof junk);
    if (fd < 0 || io_all(fd, junk, sizeof junk, 1) != 0 || !closed_within(fd, 3000))
        note_fail(d, "garbage was not refused");
    close(fd);
    unsigned char nd[HC_TCP_NONCE] = "other nonce....", na[HC_TCP_NONCE];
    fd = dial_port(d->port);
    if (fd < 0 || hello(fd, token ^ 1, nd, na) == 0 || !closed_within(fd, 3000))
        note_fail(d, "a hello for another instance was answered");
    close(fd);
    attack_macs(d, token);
    /* The honest dialer, with the strangers still connected. */
    d->t_honest = hct_now_ms();
    fd = dial_port(d->port);
    unsigned char mac[HC_SHA256_BYTES];
    if (fd < 0 || hello(fd, token, nd, na) != 0) {
        note_fail(d, "the honest dialer got no valid challenge");
    } else {
        spec_mac("dia", token, 1, 0, nd, na, mac);
        hc_tcp_hdr_t put = { HC_TCP_MAGIC_PUT, 77, 0, 0, 0 };
        if (respond(fd, mac) != 0 || io_all(fd, &put, sizeof put, 1) != 0)
            note_fail(d, "the honest dialer could not send");
    }
    usleep(500 * 1000); /* let the put be read before the close */
    close(fd);
    for (int i = 0; i < 12; i++)
        close(idle[i]);
    return NULL;
}

START_TEST(test_acceptor_refuses_strangers)
{
    int me = 1, peer = 0;
    g_other = (tcp_addr_t){ HC_TCP_ADDR_MAGIC, htonl(INADDR_LOOPBACK), 1, 0, 0 };
    hc_transport_t *tr = make_tr(me, 10000);
    dialer_t d = { .port = hc_tcp_listen_port(tr) };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, dialer_main, &d), 0);
    hc_ep_t *ep;
    hcoll_status_t st = hc_tcp_ops.connect(tr, &peer, 1, fake_allgather, &me, &ep);
    double took = hct_now_ms() - d.t_honest;
    ck_assert_msg(st == HCOLL_SUCCESS, "connect: %s", eb.msg);
    uint32_t imm = 0;
    int got = hct_wait_comps(&hc_tcp_ops, tr, HC_COMP_IMM, 1, &imm, 5000, &st);
    pthread_join(th, NULL);
    ck_assert_msg(d.fails == 0, "%d failure(s), last: %s", d.fails, d.why);
    ck_assert_msg(got == 1 && imm == 77, "the honest dialer's put did not land");
    /* 12 idle strangers ahead of it cost the honest dialer nothing. */
    ck_assert_msg(took < 1000, "the honest dialer waited %.0f ms", took);
    hc_tcp_ops.destroy(tr, 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* The dialer checks the acceptor's proof                                     */
/* ------------------------------------------------------------------------ */

typedef struct acceptor {
    int lfd;
    int flip;      /* flip a bit of the challenge's MAC */
    int resp_ok;   /* the dialer's response carried the right MAC */
} acceptor_t;

static void *acceptor_main(void *arg)
{
    acceptor_t *a = arg;
    int fd = accept(a->lfd, NULL, NULL);
    tcp_hello_t h;
    if (fd < 0 || io_all(fd, &h, sizeof h, 0) != 0)
        goto out;
    tcp_chal_t c = { HC_TCP_CHAL_MAGIC, 0, "acceptor nonce.", { 0 } };
    spec_mac("acc", h.token, 1, 0, h.nonce, c.nonce, c.mac);
    c.mac[7] ^= (unsigned char)(a->flip ? 0x10 : 0);
    tcp_resp_t r;
    if (io_all(fd, &c, sizeof c, 1) != 0)
        goto out;
    if (!a->flip && io_all(fd, &r, sizeof r, 0) == 0) {
        unsigned char want[HC_SHA256_BYTES];
        spec_mac("dia", h.token, 1, 0, h.nonce, c.nonce, want);
        a->resp_ok = r.magic == HC_TCP_RESP_MAGIC && memcmp(want, r.mac, sizeof want) == 0;
    }
    usleep(200 * 1000);
out:
    if (fd >= 0)
        close(fd);
    return NULL;
}

static hcoll_status_t dial_fake(int flip, acceptor_t *a)
{
    int me = 0, peer = 1;
    a->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    a->flip = flip;
    a->resp_ok = 0;
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(a->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(a->lfd, 4), 0);
    getsockname(a->lfd, (struct sockaddr *)&sa, &sl);
    g_other = (tcp_addr_t){ HC_TCP_ADDR_MAGIC, sa.sin_addr.s_addr, ntohs(sa.sin_port), 1,
                            0x1234567812345678ull };
    hc_transport_t *tr = make_tr(me, 3000);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, acceptor_main, a), 0);
    hc_ep_t *ep;
    hcoll_status_t st = hc_tcp_ops.connect(tr, &peer, 1, fake_allgather, &me, &ep);
    pthread_join(th, NULL);
    close(a->lfd);
    hc_tcp_ops.destroy(tr, 0);
    return st;
}

START_TEST(test_dialer_checks_acceptor)
{
    acceptor_t a;
    hcoll_status_t st = dial_fake(1, &a);
    ck_assert_msg(st == HCOLL_ERR_MISMATCH, "flipped: %s (%s)", hcoll_status_name(st), eb.msg);
    ck_assert_msg(strstr(eb.msg, "did not prove"), "message: %s", eb.msg);
    st = dial_fake(0, &a);
    ck_assert_msg(st == HCOLL_SUCCESS, "honest: %s (%s)", hcoll_status_name(st), eb.msg);
    ck_assert_msg(a.resp_ok, "the dialer's response MAC is not the protocol's");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A timeout names the missing peer and the strangers                         */
/* ------------------------------------------------------------------------ */

#define FLOOD 40

static void *garbage_main(void *arg)
{
    int port = *(int *)arg;
    for (int i = 0; i < FLOOD; i++) {
        int fd = dial_port(port);
        char junk[64];
        memset(junk, 'x', sizeof junk);
        if (fd >= 0 && io_all(fd, junk, sizeof junk, 1) == 0)
            closed_within(fd, 3000);
        if (fd >= 0)
            close(fd);
    }
    return NULL;
}

/* Lines of f that contain what. */
static int count_lines(FILE *f, const char *what)
{
    char line[1024];
    int n = 0;
    rewind(f);
    while (fgets(line, sizeof line, f))
        n += strstr(line, what) != NULL;
    return n;
}

/* Nobody dials; a flood of garbage connections arrives instead. The
 * timeout names the missing rank and the count of strangers, and the log
 * (stderr here) gets three lines, not one per stranger. */
START_TEST(test_timeout_names_what_happened)
{
    int me = 1, peer = 0;
    g_other = (tcp_addr_t){ HC_TCP_ADDR_MAGIC, htonl(INADDR_LOOPBACK), 1, 0, 0 };
    hc_transport_t *tr = make_tr(me, 2500);
    int port = hc_tcp_listen_port(tr);
    FILE *log = tmpfile();
    ck_assert_ptr_nonnull(log);
    int saved = dup(2);
    dup2(fileno(log), 2);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, garbage_main, &port), 0);
    hc_ep_t *ep;
    double t0 = hct_now_ms();
    hcoll_status_t st = hc_tcp_ops.connect(tr, &peer, 1, fake_allgather, &me, &ep);
    double dt = hct_now_ms() - t0;
    pthread_join(th, NULL);
    dup2(saved, 2);
    close(saved);
    ck_assert_int_eq(st, HCOLL_ERR_TIMEOUT);
    ck_assert_msg(dt > 2400 && dt < 5000, "gave up after %.0f ms", dt);
    ck_assert_msg(strstr(eb.msg, "from rank 0 (0 of 1 socket(s))"), "message: %s", eb.msg);
    unsigned dropped = 0;
    const char *d = strstr(eb.msg, "dropped strangers: ");
    ck_assert_msg(d && sscanf(d, "dropped strangers: %u not a hello", &dropped) == 1,
                  "message: %s", eb.msg);
    ck_assert_msg(dropped >= 10, "only %u strangers came in time", dropped);
    int lines = count_lines(log, "");
    ck_assert_msg(lines <= 3 && count_lines(log, "dropped") == 3,
                  "%d log lines for %u strangers", lines, dropped);
    fclose(log);
    hc_tcp_ops.destroy(tr, 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* accept4 out of descriptors does not spin                                   */
/* ------------------------------------------------------------------------ */

START_TEST(test_accept_emfile_no_spin)
{
    int me = 1, peer = 0;
    g_other = (tcp_addr_t){ HC_TCP_ADDR_MAGIC, htonl(INADDR_LOOPBACK), 1, 0, 0 };
    hc_transport_t *tr = make_tr(me, 1200);
    int knock = dial_port(hc_tcp_listen_port(tr)); /* waits in the backlog */
    ck_assert_int_ge(knock, 0);
    /* No descriptor left: the lowest free one is the limit. */
    int lowest = dup(0);
    ck_assert_int_ge(lowest, 0);
    close(lowest);
    struct rlimit old, lim;
    getrlimit(RLIMIT_NOFILE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)lowest;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &lim), 0);
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    hc_ep_t *ep;
    hcoll_status_t st = hc_tcp_ops.connect(tr, &peer, 1, fake_allgather, &me, &ep);
    getrusage(RUSAGE_SELF, &r1);
    setrlimit(RLIMIT_NOFILE, &old);
    double cpu_ms = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1e3 +
                    (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) / 1e3 +
                    (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1e3 +
                    (double)(r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e3;
    ck_assert_int_eq(st, HCOLL_ERR_TIMEOUT);
    ck_assert_msg(strstr(eb.msg, "accept: Too many open files"), "message: %s", eb.msg);
    /* Waiting costs ~2 ms of CPU; a loop that spins on the failing accept
     * burns what the scheduler gives it of the 1.2 s, even on a host so
     * loaded that this is only a few percent. */
    ck_assert_msg(cpu_ms < 60, "%.0f ms of CPU in a 1.2 s wait", cpu_ms);
    close(knock);
    hc_tcp_ops.destroy(tr, 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Region keys: random, and none for a send-only region                      */
/* ------------------------------------------------------------------------ */

typedef struct guesser {
    int port;
    uint64_t key; /* the key to put to */
    int fails;
} guesser_t;

static void *guesser_main(void *arg)
{
    guesser_t *g = arg;
    while (!__atomic_load_n(&g_exchanged, __ATOMIC_ACQUIRE))
        usleep(1000);
    unsigned char nd[HC_TCP_NONCE] = "guesser nonce..", na[HC_TCP_NONCE], mac[HC_SHA256_BYTES];
    int fd = dial_port(g->port);
    if (fd < 0 || hello(fd, g_mine.token, nd, na) != 0) {
        g->fails++;
    } else {
        spec_mac("dia", g_mine.token, 1, 0, nd, na, mac);
        hc_tcp_hdr_t put = { HC_TCP_MAGIC_PUT, 5, g->key, 0, 8 };
        char bytes[8] = "OVERRUN";
        if (respond(fd, mac) || io_all(fd, &put, sizeof put, 1) || io_all(fd, bytes, 8, 1))
            g->fails++;
        closed_within(fd, 3000);
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

/* Rank 1 registers a send-only region, then a target; a peer with the
 * connection (it passed the hello) puts to key `key`. */
static void put_to_key(int which)
{
    int me = 1, peer = 0;
    g_exchanged = 0;
    g_other = (tcp_addr_t){ HC_TCP_ADDR_MAGIC, htonl(INADDR_LOOPBACK), 1, 0, 0 };
    hc_transport_t *tr = make_tr(me, 5000);
    char sendbuf[64], target[64];
    memset(sendbuf, 's', sizeof sendbuf);
    memset(target, 't', sizeof target);
    hc_mr_t *smr, *tmr, *tmr2;
    hc_rkey_t rk, rk2;
    ck_assert_int_eq(hc_tcp_ops.mr_reg(tr, sendbuf, sizeof sendbuf, &smr, NULL), HCOLL_SUCCESS);
    ck_assert_int_eq(hc_tcp_ops.mr_reg(tr, target, sizeof target, &tmr, &rk), HCOLL_SUCCESS);
    ck_assert_int_eq(hc_tcp_ops.mr_reg(tr, target, 32, &tmr2, &rk2), HCOLL_SUCCESS);
    /* Not sequential, so not guessable from another one. */
    ck_assert(rk.w[0] != 0 && rk2.w[0] != 0 && rk.w[0] != rk2.w[0]);
    ck_assert(rk.w[0] > 3 && rk.w[0] - rk2.w[0] != 1 && rk2.w[0] - rk.w[0] != 1);
    /* which 0: the key the send-only region had when ids counted from 1;
     * 1: the next key after a known one; 2: the known one (positive). */
    guesser_t g = { hc_tcp_listen_port(tr), which == 0 ? 1 : which == 1 ? rk.w[0] + 1 : rk.w[0],
                    0 };
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, guesser_main, &g), 0);
    hc_ep_t *ep;
    hcoll_status_t st = hc_tcp_ops.connect(tr, &peer, 1, fake_allgather, &me, &ep);
    ck_assert_msg(st == HCOLL_SUCCESS, "connect: %s", eb.msg);
    int got = hct_wait_comps(&hc_tcp_ops, tr, HC_COMP_IMM, 1, NULL, 5000, &st);
    hc_tcp_ops.destroy(tr, 0);
    pthread_join(th, NULL);
    ck_assert_int_eq(g.fails, 0);
    for (size_t i = 0; i < sizeof sendbuf; i++)
        ck_assert_int_eq(sendbuf[i], 's');
    if (which == 2) {
        ck_assert_msg(got == 1 && st == HCOLL_SUCCESS, "the right key: %s", eb.msg);
        ck_assert(memcmp(target, "OVERRUN", 8) == 0);
        return;
    }
    ck_assert_msg(st == HCOLL_ERR_NETWORK, "guess %d: %s (%s)", which, hcoll_status_name(st),
                  eb.msg);
    ck_assert_msg(strstr(eb.msg, "names no registered region"), "message: %s", eb.msg);
    for (size_t i = 0; i < sizeof target; i++)
        ck_assert_int_eq(target[i], 't');
}

START_TEST(test_region_keys)
{
    put_to_key(0);
    put_to_key(1);
    put_to_key(2);
}
END_TEST

static Suite *hello_suite(void)
{
    Suite *s = suite_create("tcp_hello");
    TCase *tc = tcase_create("tcp_hello");
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    tcase_add_test(tc, test_acceptor_refuses_strangers);
    tcase_add_test(tc, test_dialer_checks_acceptor);
    tcase_add_test(tc, test_timeout_names_what_happened);
    tcase_add_test(tc, test_accept_emfile_no_spin);
    tcase_add_test(tc, test_region_keys);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(hello_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
