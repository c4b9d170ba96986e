/*
 * The rendezvous root's limits on pending connections (boot/root.c), each
 * against a client written here from the protocol (HELLO, CHALLENGE,
 * AUTH, AUTH_OK, RECORD, TABLE):
 *   handshake_cap      HC_BOOT_HANDSHAKE_MAX connections hold their
 *                      challenge; one more HELLO is dropped without one,
 *                      none of the 64 is; once one of them leaves, a new
 *                      HELLO is challenged and joins as a rank
 *   emfile_evicts_fresh  the root out of file descriptors (RLIMIT_NOFILE
 *                      lowered in its forked process) while one
 *                      connection holds its challenge and strays fill the
 *                      rest: accept's EMFILE evicts strays that sent
 *                      nothing (long before their handshake deadline),
 *                      never the connection in its handshake, which then
 *                      joins as a rank beside a real rank 1
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "boot/boot.h"
#include "boot/wire.h"
#include "common/ranks.h"

static const unsigned char lim_key[HC_BOOT_KEY_BYTES] = "test_boot_limits' key";

/* timeout 40 s: each connection has 10 s for its handshake (root.c), far
 * longer than anything here waits, so that only the limits drop one. */
static void lim_args(hc_boot_args_t *ba, int rank, int nranks, int port)
{
    memset(ba, 0, sizeof *ba);
    ba->rank = rank;
    ba->nranks = nranks;
    ba->root.sin.sin_family = AF_INET;
    ba->root.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ba->root.sin.sin_port = htons((uint16_t)port);
    ba->listen_fd = -1;
    memcpy(ba->key, lim_key, sizeof ba->key);
    ba->authenticated = 1;
    ba->timeout_ms = 40000;
    ba->init_timeout_ms = 30000;
}

static int root_listen(hc_boot_args_t *ba, int *port_out)
{
    hc_sockaddr_t any = ba->root;
    int lfd = -1;
    if (hc_boot_socket(&any, HC_BOOT_SOCK_LISTEN, NULL, 0, "test", &lfd, &any) != HCOLL_SUCCESS)
        return -1;
    ba->listen_fd = lfd;
    *port_out = ntohs(any.sin.sin_port);
    return 0;
}

static int dial(int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* len bytes within ms: 0; -1 at EOF or error; -2 nothing in time. */
static int recv_within(int fd, void *buf, size_t len, int ms)
{
    unsigned char *p = buf;
    double end = hct_now_ms() + ms;
    while (len) {
        int left = (int)(end - hct_now_ms());
        struct pollfd pf = { fd, POLLIN, 0 };
        if (left <= 0 || poll(&pf, 1, left) <= 0)
            return -2;
        ssize_t n = recv(fd, p, len, 0);
        if (n <= 0)
            return -1;
        p += n, len -= (size_t)n;
    }
    return 0;
}

/* HELLO, then the root's CHALLENGE: 0 with its nonce; -1 dropped (EOF
 * without a challenge); -2 nothing within ms; -3 something else. */
static int hello(int fd, unsigned char nonce_s[HC_BWIRE_NONCE_BYTES], int ms)
{
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_CHALLENGE_BYTES];
    hc_bwire_hdr_t h;
    hc_bwire_pack(m, HC_BMSG_HELLO, 0, 0);
    if (send(fd, m, HC_BWIRE_HDR_BYTES, MSG_NOSIGNAL) != HC_BWIRE_HDR_BYTES)
        return -1;
    int rc = recv_within(fd, m, sizeof m, ms);
    if (rc != 0)
        return rc;
    hc_bwire_unpack(m, &h);
    if (h.type != HC_BMSG_CHALLENGE || h.len != HC_BWIRE_CHALLENGE_BYTES ||
        hc_bwire_get32(m + HC_BWIRE_HDR_BYTES + HC_BWIRE_NONCE_BYTES + HC_BWIRE_SALT_BYTES) != 0)
        return -3;
    memcpy(nonce_s, m + HC_BWIRE_HDR_BYTES, HC_BWIRE_NONCE_BYTES);
    return 0;
}

/* AUTH as rank of nranks (the key as it is: no stretching), AUTH_OK,
 * RECORD rec, then the TABLE into table. 0, or which step failed. */
static int join(int fd, const unsigned char *nonce_s, int rank, int nranks, uint64_t rec,
                uint64_t *table)
{
    unsigned char m[HC_BWIRE_HDR_BYTES + HC_BWIRE_AUTH_BYTES], *a = m + HC_BWIRE_HDR_BYTES;
    unsigned char ok[HC_BWIRE_HDR_BYTES + HC_BWIRE_MAC_BYTES];
    hc_bwire_hdr_t h;
    hc_bwire_pack(m, HC_BMSG_AUTH, HC_BWIRE_AUTH_BYTES, 0);
    hc_bwire_put32(a, (uint32_t)rank);
    hc_bwire_put32(a + 4, (uint32_t)nranks);
    hc_bwire_put32(a + 8, sizeof rec);
    memset(a + 12, rank, HC_BWIRE_NONCE_BYTES);
    hc_bwire_mac(lim_key, 'C', nonce_s, a + 12, (uint32_t)rank, (uint32_t)nranks, sizeof rec,
                 a + 12 + HC_BWIRE_NONCE_BYTES);
    if (send(fd, m, sizeof m, MSG_NOSIGNAL) != (ssize_t)sizeof m)
        return 1;
    if (recv_within(fd, ok, sizeof ok, 10000) != 0)
        return 2;
    hc_bwire_unpack(ok, &h);
    if (h.type != HC_BMSG_AUTH_OK)
        return 3;
    unsigned char r[HC_BWIRE_HDR_BYTES + sizeof rec];
    hc_bwire_pack(r, HC_BMSG_RECORD, sizeof rec, 0);
    memcpy(r + HC_BWIRE_HDR_BYTES, &rec, sizeof rec);
    if (send(fd, r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r)
        return 4;
    for (;;) { /* heartbeats may come first */
        if (recv_within(fd, ok, HC_BWIRE_HDR_BYTES, 20000) != 0)
            return 5;
        hc_bwire_unpack(ok, &h);
        if (h.type != HC_BMSG_BEAT)
            break;
    }
    if (h.type != HC_BMSG_TABLE || h.len != (uint32_t)nranks * sizeof rec)
        return 6;
    return recv_within(fd, table, h.len, 10000) == 0 ? 0 : 7;
}

/* ------------------------------------------------------------------------ */
/* HC_BOOT_HANDSHAKE_MAX connections in the handshake                        */
/* ------------------------------------------------------------------------ */

typedef struct cap_root {
    hc_boot_args_t ba;
    hcoll_status_t st;
    uint64_t all[2];
} cap_root_t;

static void *cap_root_thread(void *arg)
{
    cap_root_t *c = arg;
    uint64_t rec = 100;
    hc_boot_t *b = NULL;
    c->st = hc_boot_create(&c->ba, &rec, sizeof rec, c->all, &b);
    hc_boot_destroy(b);
    return NULL;
}

START_TEST(handshake_cap)
{
    enum { N = HC_BOOT_HANDSHAKE_MAX };
    cap_root_t c;
    int port = 0;
    lim_args(&c.ba, 0, 2, 0);
    ck_assert_int_eq(root_listen(&c.ba, &port), 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, cap_root_thread, &c), 0);

    static int fd[N + 2];
    unsigned char nonce[HC_BWIRE_NONCE_BYTES];
    for (int i = 0; i < N; i++) {
        fd[i] = dial(port);
        ck_assert_msg(fd[i] >= 0, "dial %d: %s", i, strerror(errno));
        int rc = hello(fd[i], nonce, 10000);
        ck_assert_msg(rc == 0, "connection %d of %d: no challenge (%d)", i + 1, N, rc);
    }
    /* One more: its HELLO is dropped, and it gets no challenge. */
    fd[N] = dial(port);
    ck_assert_int_ge(fd[N], 0);
    int rc = hello(fd[N], nonce, 10000);
    ck_assert_msg(rc == -1, "HELLO number %d was not dropped (%d)", N + 1, rc);
    /* The 64 that hold their challenge were kept. */
    for (int i = 0; i < N; i++) {
        struct pollfd pf = { fd[i], POLLIN, 0 };
        ck_assert_msg(poll(&pf, 1, 0) == 0, "connection %d was dropped", i + 1);
    }
    /* One leaves: the next HELLO is challenged, and joins. */
    close(fd[0]);
    usleep(100 * 1000);
    fd[N + 1] = dial(port);
    ck_assert_int_ge(fd[N + 1], 0);
    rc = hello(fd[N + 1], nonce, 10000);
    ck_assert_msg(rc == 0, "a HELLO after one left got no challenge (%d)", rc);
    uint64_t table[2] = { 0, 0 };
    rc = join(fd[N + 1], nonce, 1, 2, 101, table);
    ck_assert_msg(rc == 0, "join failed at step %d", rc);
    pthread_join(t, NULL);
    ck_assert_msg(c.st == HCOLL_SUCCESS, "root: %s", hcoll_status_name(c.st));
    ck_assert(table[0] == 100 && table[1] == 101);
    ck_assert(c.all[0] == 100 && c.all[1] == 101);
    for (int i = 1; i < N + 2; i++)
        close(fd[i]);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Out of file descriptors: only connections that sent nothing are evicted  */
/* ------------------------------------------------------------------------ */

#define ROOM 4   /* connections the root has fds for */
#define STRAYS 8

typedef struct emf_arg {
    volatile int port, ready, strays_in, rank1_go;
    volatile int evicted, evicted_ms;
    char failure[256];
} emf_arg_t;

static int wait_flag(volatile int *f, int ms)
{
    double end = hct_now_ms() + ms;
    while (!__atomic_load_n(f, __ATOMIC_ACQUIRE)) {
        if (hct_now_ms() > end)
            return -1;
        usleep(1000);
    }
    return 0;
}

static int emf_root(emf_arg_t *a)
{
    hc_boot_args_t ba;
    hc_boot_t *b;
    uint64_t rec = 100, all[3];
    int port;
    lim_args(&ba, 0, 3, 0);
    HCT_REQUIRE(root_listen(&ba, &port) == 0, "listen");
    /* Every fd below the lowest free one is in use: the boot's eventfd
     * takes that one, and ROOM connections the ones above it. */
    int lowest = dup(0);
    HCT_REQUIRE(lowest >= 0, "dup");
    close(lowest);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = (rlim_t)lowest + 1 + ROOM;
    HCT_REQUIRE(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
    a->port = port;
    __atomic_store_n(&a->ready, 1, __ATOMIC_RELEASE);
    HCT_OK(NULL, hc_boot_create(&ba, &rec, sizeof rec, all, &b));
    HCT_REQUIRE(all[0] == 100 && all[1] == 101 && all[2] == 102, "table");
    hc_boot_destroy(b);
    return 0;
}

static int emf_rank1(emf_arg_t *a)
{
    hc_boot_args_t ba;
    hc_boot_t *b;
    uint64_t rec = 101, all[3];
    HCT_REQUIRE(wait_flag(&a->rank1_go, 20000) == 0, "never told to start");
    lim_args(&ba, 1, 3, a->port);
    HCT_OK(NULL, hc_boot_create(&ba, &rec, sizeof rec, all, &b));
    HCT_REQUIRE(all[0] == 100 && all[1] == 101 && all[2] == 102, "table");
    hc_boot_destroy(b);
    return 0;
}

/* Rank 2 by hand: its connection takes its challenge first, then strays
 * connect past the root's fds; it answers only after rank 1 started. */
static int emf_attacker(emf_arg_t *a)
{
    unsigned char nonce[HC_BWIRE_NONCE_BYTES];
    HCT_REQUIRE(wait_flag(&a->ready, 20000) == 0, "root never ready");
    int h = dial(a->port);
    HCT_REQUIRE(h >= 0, "dial");
    HCT_REQUIRE(hello(h, nonce, 10000) == 0, "no challenge for the handshaker");
    int s[STRAYS];
    double t0 = hct_now_ms();
    for (int i = 0; i < STRAYS; i++) {
        s[i] = dial(a->port); /* the kernel's backlog takes it */
        HCT_REQUIRE(s[i] >= 0, "stray %d", i);
    }
    /* More strays than fds: accept fails with EMFILE, and the root evicts
     * the oldest stray, long before its 10 s handshake deadline. */
    int closed = 0;
    while (!closed && hct_now_ms() - t0 < 3000) {
        for (int i = 0; i < STRAYS && !closed; i++) {
            char c;
            struct pollfd pf = { s[i], POLLIN, 0 };
            closed = poll(&pf, 1, 0) == 1 && recv(s[i], &c, 1, MSG_DONTWAIT) <= 0;
        }
        usleep(5000);
    }
    a->evicted = closed;
    a->evicted_ms = (int)(hct_now_ms() - t0);
    HCT_REQUIRE(closed, "no stray was evicted within 3 s: EMFILE made no room");
    __atomic_store_n(&a->rank1_go, 1, __ATOMIC_RELEASE);
    usleep(500 * 1000); /* rank 1 comes in: more EMFILE, more evictions */
    uint64_t table[3] = { 0, 0, 0 };
    int rc = join(h, nonce, 2, 3, 102, table);
    HCT_REQUIRE(rc == 0, "the connection in its handshake was dropped (join step %d)", rc);
    HCT_REQUIRE(table[0] == 100 && table[1] == 101 && table[2] == 102, "table");
    for (int i = 0; i < STRAYS; i++)
        close(s[i]);
    close(h);
    return 0;
}

static int rank_emf(int rank, int nranks, void *argp)
{
    (void)nranks;
    emf_arg_t *a = argp;
    return rank == 0 ? emf_root(a) : rank == 1 ? emf_rank1(a) : emf_attacker(a);
}

START_TEST(emfile_evicts_fresh)
{
    emf_arg_t *a = hct_shared_alloc(sizeof *a);
    hct_opts_t o = { .nranks = 3, .ranks_per_node = 0, .timeout_ms = 30000 };
    hct_result_t res[3];
    ck_assert_int_eq(hct_run(&o, rank_emf, a, res), 0);
    printf("emfile: first stray evicted after %d ms\n", a->evicted_ms);
    ck_assert(a->evicted);
    hct_shared_free(a, sizeof *a);
}
END_TEST

int main(void)
{
    unsetenv("HCOLL_TIMEOUT_MS");
    unsetenv("HCOLL_DEBUG_FILE");
    setenv("HCOLL_DEBUG", "NONE", 0); /* the drops are WARNs */
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("boot_limits");
    TCase *tc = tcase_create("limits");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, handshake_cap);
    tcase_add_test(tc, emfile_evicts_fresh);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
