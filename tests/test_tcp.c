/*
 * What only the TCP transport promises: transport choice, headers that lie
 * about their target rejected before a byte is written, a stranger on the
 * port, a hello that never comes, a connect cancelled while it waits (the
 * communicator's cancel eventfd), a bind address that is not one, payloads
 * gathered by the socket's low-water mark (HCOLL_TCP_RCVLOWAT); and the
 * completion FIFO both transports report through. What every transport
 * promises (puts landing, a peer that dies, an orderly close...) is in
 * test_transport.c, run on TCP there.
 * All traffic on 127.0.0.0/8, ranks forked by tests/common/ranks.h.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "common/ranks.h"
#include "common/seam.h"
#include "base/config.h"
#include "base/err.h"
#include "boot/hmac.h"
#include "inter/tcp.h"
#include "inter/transport.h"

#define TEST_TIMEOUT_S 120
#define MAXR 8

/* Address exchange over shared memory, standing in for the bootstrap. */
typedef struct shm_ag {
    hct_barrier_t bar;
    int nranks;
    volatile int port[MAXR];
    char slot[MAXR][512];
} shm_ag_t;

typedef struct ag_ctx {
    shm_ag_t *shm;
    int rank;
} ag_ctx_t;

static hcoll_status_t shm_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    ag_ctx_t *c = ctx;
    memcpy(c->shm->slot[c->rank], mine, len);
    if (hct_barrier_wait(&c->shm->bar, c->shm->nranks, 20000) != 0)
        return HCOLL_ERR_TIMEOUT;
    for (int i = 0; i < c->shm->nranks; i++)
        memcpy((char *)all + (size_t)i * len, c->shm->slot[i], len);
    if (hct_barrier_wait(&c->shm->bar, c->shm->nranks, 20000) != 0)
        return HCOLL_ERR_TIMEOUT;
    return HCOLL_SUCCESS;
}

static hc_errbuf_t eb; /* per forked rank */
/* The data connections' hello key (a communicator passes its own). */
static const unsigned char tp_key[HC_TP_KEY_BYTES] = "test_tcp's data hello key";

static hc_transport_params_t tparams(int rank, int n, int nsocks, int timeout_ms)
{
    static char addr[MAXR][32];
    snprintf(addr[rank], sizeof addr[rank], "127.0.0.%d", rank + 1);
    hc_errbuf_init(&eb);
    hc_transport_params_t p = { rank, n, addr[rank], "lo", rank, rank, timeout_ms, nsocks, 0,
                                &eb, 0, -1, NULL, NULL, NULL, tp_key, hc_hmac_sha256 };
    return p;
}

/* This rank's transport with params p, connected to the other of two
 * ranks through ag; 0 on success. */
static int connect_pair(const hc_transport_params_t *p, ag_ctx_t *ag, hc_transport_t **tr_out,
                        hc_ep_t **ep_out)
{
    HCT_REQUIRE(hc_tcp_ops.create(p, tr_out) == HCOLL_SUCCESS, "create");
    int peer = 1 - ag->rank;
    HCT_REQUIRE(hc_tcp_ops.connect(*tr_out, &peer, 1, shm_allgather, ag, ep_out) ==
                    HCOLL_SUCCESS, "connect: %s", eb.msg);
    return 0;
}

/* Fork nranks ranks running fn over one shared address exchange for the
 * first two (a third, where there is one, is a stranger); 0 when all
 * passed. */
static int run_ranks(hct_rank_fn fn, int nranks, int timeout_ms)
{
    shm_ag_t *shm = hct_shared_alloc(sizeof *shm);
    shm->nranks = 2;
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = 1, .timeout_ms = timeout_ms };
    hct_result_t res[3];
    int bad = hct_run(&o, fn, shm, res);
    hct_shared_free(shm, sizeof *shm);
    return bad;
}

/* ------------------------------------------------------------------------ */

START_TEST(test_select)
{
    const hc_transport_ops_t *ops = NULL;
    hc_params_t cfg;
    char err[256];
    ck_assert_int_eq(hc_params_load(&cfg, NULL, err, sizeof err), HCOLL_SUCCESS);
    hc_select_params_t sp = { .settings = &cfg, .rank = -1, .local_rank = 0, .gpu = -1 };
    cfg.net = HC_NET_TCP;
    ck_assert_int_eq(hc_transport_select(&sp, &ops), HCOLL_SUCCESS);
    ck_assert_ptr_eq(ops, &hc_tcp_ops);
    ops = NULL;
    cfg.net = HC_NET_AUTO;
    ck_assert_int_eq(hc_transport_select(&sp, &ops), HCOLL_SUCCESS);
    ck_assert_ptr_eq(ops, &hc_tcp_ops);
    ops = NULL;
    hc_errbuf_t e;
    hc_errbuf_init(&e);
    cfg.net = HC_NET_IB;
    sp.errbuf = &e;
    ck_assert_int_eq(hc_transport_select(&sp, &ops), HCOLL_ERR_UNSUPPORTED);
    ck_assert_ptr_null(ops);
    ck_assert_ptr_nonnull(strstr(hc_errbuf_get(&e), "verbs transport is not built"));
    hc_errbuf_fini(&e);
}
END_TEST

/* ------------------------------------------------------------------------ */

static int rank_corrupt(int rank, int n, void *arg)
{
    shm_ag_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    for (int mode = HC_TCP_CORRUPT_MAGIC; mode <= HC_TCP_CORRUPT_LENGTH; mode++) {
        hc_transport_params_t p = tparams(rank, n, 1, 10000);
        hc_transport_t *tr;
        hc_ep_t *ep;
        if (connect_pair(&p, &ag, &tr, &ep))
            return 1;
        enum { LEN = 8192 };
        unsigned char *buf = malloc(3 * LEN);
        memset(buf, 0x5A, 3 * LEN);
        hc_mr_t *mr;
        hc_rkey_t rk, rks[2];
        /* The region is the middle third; the rest must stay 0x5A. */
        HCT_REQUIRE(hc_tcp_ops.mr_reg(tr, buf + LEN, LEN, &mr, &rk) == HCOLL_SUCCESS, "reg");
        HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "keys");
        hcoll_status_t st;
        if (rank == 0) {
            memset(buf, 0xEE, 3 * LEN);
            hc_tcp_ep_corrupt_next(ep, mode);
            HCT_REQUIRE(hc_tcp_ops.put(ep, mr, 0, &rks[1], 100, 4096, 7, 0) == HCOLL_SUCCESS,
                        "put");
            hct_wait_comps(&hc_tcp_ops, tr, HC_COMP_PUT, 1, NULL, 5000, &st);
        } else {
            hct_wait_comps(&hc_tcp_ops, tr, HC_COMP_IMM, 1, NULL, 5000, &st);
            HCT_REQUIRE(st == HCOLL_ERR_NETWORK, "mode %d: got %s (%s)", mode,
                        hcoll_status_name(st), eb.msg);
            HCT_REQUIRE(strstr(eb.msg, "bad frame"), "message: %s", eb.msg);
            for (size_t i = 0; i < 3 * LEN; i++)
                HCT_REQUIRE(buf[i] == 0x5A, "mode %d: byte %zu written", mode, i);
            /* Sticky: later calls report it too. */
            HCT_REQUIRE(hc_tcp_ops.put(ep, mr, 0, &rks[0], 0, 1, 1, 0) == HCOLL_ERR_NETWORK,
                        "sticky");
        }
        HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
        hc_tcp_ops.destroy(tr, 0);
        free(buf);
    }
    return 0;
}

START_TEST(test_corrupt_frames)
{
    ck_assert_int_eq(run_ranks(rank_corrupt, 2, 60000), 0);
}
END_TEST

/* ------------------------------------------------------------------------ */

/* Ranks 0 and 1 form the transport; process 2 knocks on rank 1's port with
 * garbage first. The real connection must still be made. */
static int rank_stranger(int rank, int n, void *arg)
{
    (void)n;
    shm_ag_t *shm = arg;
    if (rank == 2) {
        while (!shm->port[1])
            usleep(1000);
        for (int k = 0; k < 3; k++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)shm->port[1]) };
            inet_pton(AF_INET, "127.0.0.2", &sa.sin_addr);
            HCT_REQUIRE(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "knock");
            char junk[64];
            memset(junk, k == 0 ? 'G' : 0, sizeof junk);
            if (k < 2)
                (void)!write(fd, junk, (size_t)(k == 0 ? 64 : 24));
            if (k == 2)
                usleep(100000); /* connected but silent for a while */
            close(fd);
        }
        __atomic_store_n(&shm->port[2], 1, __ATOMIC_RELEASE);
        return 0;
    }
    ag_ctx_t ag = { shm, rank };
    hc_transport_params_t p = tparams(rank, 2, 1, 10000);
    hc_transport_t *tr;
    HCT_REQUIRE(hc_tcp_ops.create(&p, &tr) == HCOLL_SUCCESS, "create");
    shm->port[rank] = hc_tcp_listen_port(tr);
    while (!__atomic_load_n(&shm->port[2], __ATOMIC_ACQUIRE))
        usleep(1000);
    int peer = 1 - rank;
    hc_ep_t *ep;
    HCT_REQUIRE(hc_tcp_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep) == HCOLL_SUCCESS,
                "connect: %s", eb.msg);
    hcoll_status_t st;
    if (rank == 0) {
        HCT_REQUIRE(hc_tcp_ops.put(ep, NULL, 0, NULL, 0, 0, 77, 0) == HCOLL_SUCCESS, "put");
        hct_wait_comps(&hc_tcp_ops, tr, HC_COMP_PUT, 1, NULL, 5000, &st);
    } else {
        uint32_t imm = 0;
        int got = hct_wait_comps(&hc_tcp_ops, tr, HC_COMP_IMM, 1, &imm, 5000, &st);
        HCT_REQUIRE(got == 1 && imm == 77, "notification over the real connection");
    }
    HCT_REQUIRE(st == HCOLL_SUCCESS, "%s", eb.msg);
    hct_barrier_wait(&shm->bar, 2, 10000);
    hc_tcp_ops.destroy(tr, 1);
    return 0;
}

START_TEST(test_stranger)
{
    ck_assert_int_eq(run_ranks(rank_stranger, 3, 30000), 0);
}
END_TEST

/* ------------------------------------------------------------------------ */

/* Rank 0 dials with a different socket count, so rank 1 rejects its hellos
 * and must give up with HCOLL_ERR_TIMEOUT at its deadline. */
static int rank_no_hello(int rank, int n, void *arg)
{
    shm_ag_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_transport_params_t p = tparams(rank, n, rank == 0 ? 1 : 2, 1500);
    hc_transport_t *tr;
    HCT_REQUIRE(hc_tcp_ops.create(&p, &tr) == HCOLL_SUCCESS, "create");
    int peer = 1 - rank;
    hc_ep_t *ep;
    double t0 = hct_now_ms();
    hcoll_status_t st = hc_tcp_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep);
    double dt = hct_now_ms() - t0;
    if (rank == 1) {
        HCT_REQUIRE(st == HCOLL_ERR_TIMEOUT, "got %s (%s)", hcoll_status_name(st), eb.msg);
        HCT_REQUIRE(dt > 1000 && dt < 4000, "gave up after %.0f ms", dt);
    }
    hc_tcp_ops.destroy(tr, 0);
    return 0;
}

/* A connect cancelled through params.cancel_fd (what abort or destroy of
 * a communicator still setting up writes) ends at once, not at its
 * deadline: rank 1 waits to accept hellos that rank 0's wrong socket count
 * makes it reject, with a 20 s deadline; its eventfd is written after
 * 300 ms. */
static void *write_cancel(void *arg)
{
    usleep(300 * 1000);
    uint64_t one = 1;
    ssize_t w = write(*(int *)arg, &one, sizeof one);
    (void)w;
    return NULL;
}

static int rank_cancel(int rank, int n, void *arg)
{
    shm_ag_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    int cfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    HCT_REQUIRE(cfd >= 0, "eventfd");
    hc_transport_params_t p = tparams(rank, n, rank == 0 ? 1 : 2, rank == 0 ? 1500 : 20000);
    p.cancel_fd = &cfd;
    hc_transport_t *tr;
    HCT_REQUIRE(hc_tcp_ops.create(&p, &tr) == HCOLL_SUCCESS, "create");
    int peer = 1 - rank;
    hc_ep_t *ep;
    pthread_t th;
    if (rank == 1)
        HCT_REQUIRE(pthread_create(&th, NULL, write_cancel, &cfd) == 0, "pthread_create");
    double t0 = hct_now_ms();
    hcoll_status_t st = hc_tcp_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep);
    double dt = hct_now_ms() - t0;
    if (rank == 1) {
        pthread_join(th, NULL);
        HCT_REQUIRE(st == HCOLL_ERR_ABORTED, "got %s (%s)", hcoll_status_name(st), eb.msg);
        HCT_REQUIRE(strstr(eb.msg, "cancelled"), "message: %s", eb.msg);
        HCT_REQUIRE(dt < 1300, "the cancelled connect returned after %.0f ms", dt);
    }
    hc_tcp_ops.destroy(tr, 0);
    close(cfd);
    return 0;
}

START_TEST(test_connect_cancel)
{
    ck_assert_int_eq(run_ranks(rank_cancel, 2, 30000), 0);
}
END_TEST

START_TEST(test_connect_timeout)
{
    ck_assert_int_eq(run_ranks(rank_no_hello, 2, 30000), 0);
}
END_TEST

START_TEST(test_bad_bind)
{
    hc_errbuf_t e;
    hc_errbuf_init(&e);
    hc_transport_params_t p = { 0, 2, "not-an-ip", "lo", 0, 0, 1000, 1, 0, &e, 0, -1, NULL, NULL,
                                NULL, tp_key, hc_hmac_sha256 };
    hc_transport_t *tr = NULL;
    ck_assert_int_eq(hc_tcp_ops.create(&p, &tr), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_null(tr);
    hc_tcp_ops.destroy(NULL, 1);
    hc_errbuf_fini(&e);
}
END_TEST

/* The completion FIFO both transports report through: order kept across
 * growth while the contents wrap around the buffer's end. */
START_TEST(test_compq_fifo)
{
    hc_compq_t q = { 0 };
    hc_comp_t out[8];
    uint64_t next_in = 0, next_out = 0;
    /* Push 5, pop 3 at a time, so the head walks round while it grows. */
    for (int round = 0; round < 400; round++) {
        for (int k = 0; k < 5; k++) {
            hc_comp_t c = { HC_COMP_PUT, 0, 0, next_in++ };
            ck_assert_int_eq(hc_compq_push(&q, &c), 0);
        }
        int n = hc_compq_pop(&q, out, 3);
        ck_assert_int_eq(n, 3);
        for (int k = 0; k < n; k++)
            ck_assert_uint_eq(out[k].wr_id, next_out++);
    }
    ck_assert_uint_eq(q.count, next_in - next_out);
    ck_assert_uint_ge(q.cap, q.count);
    int n;
    while ((n = hc_compq_pop(&q, out, 8)) > 0)
        for (int k = 0; k < n; k++)
            ck_assert_uint_eq(out[k].wr_id, next_out++);
    ck_assert_uint_eq(next_out, next_in);
    ck_assert_int_eq(hc_compq_pop(&q, out, 8), 0);
    hc_compq_free(&q);
    ck_assert_ptr_null(q.buf);
}
END_TEST

/* ------------------------------------------------------------------------ */

/* HCOLL_TCP_RCVLOWAT: the receiver gathers a payload's bytes with the
 * socket's low-water mark, never above what is left of it. Rank 0 sends
 * payloads one at a time (each waits for the previous one's arrival, so
 * nothing follows a payload's last byte that could wake the receiver) from
 * a small send buffer, so each arrives in pieces; sizes leave odd rests
 * above and below the mark. A mark left above the rest hangs a payload
 * (its notification never comes within the deadline). Run with the knob
 * (arg 1) and without (arg 0): the data must be the same, the mark raised
 * only with it. */
typedef struct lowat_arg {
    shm_ag_t ag;
    size_t cap;
} lowat_arg_t;

static int rank_lowat(int rank, int n, void *arg)
{
    lowat_arg_t *la = arg;
    ag_ctx_t ag = { &la->ag, rank };
    hc_transport_params_t p = tparams(rank, n, 1, 10000);
    hc_params_t cfg;
    char err[256];
    HCT_REQUIRE(hc_params_load(&cfg, NULL, err, sizeof err) == HCOLL_SUCCESS, "%s", err);
    cfg.tcp_rcvlowat = la->cap;
    p.settings = &cfg;
    if (rank == 0)
        p.socket_buf = 16384; /* the sender's queue drains in pieces */
    hc_transport_t *tr;
    hc_ep_t *ep;
    if (connect_pair(&p, &ag, &tr, &ep))
        return 1;
    static const size_t sizes[] = { 1 << 20, 100003, 65536 + 17, 300001, 16385, 70000, 3 };
    enum { MAX = 1 << 20 };
    unsigned char *buf = malloc(MAX);
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(hc_tcp_ops.mr_reg(tr, buf, MAX, &mr, &rk) == HCOLL_SUCCESS, "reg");
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "keys");
    hcoll_status_t st;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const size_t len = sizes[k];
        if (rank == 0) {
            for (size_t i = 0; i < len; i++)
                buf[i] = (unsigned char)(i * 7 + k);
            HCT_REQUIRE(hc_tcp_ops.put(ep, mr, 0, &rks[1], 0, len, (uint32_t)k, 0) ==
                            HCOLL_SUCCESS, "put");
            hct_wait_comps(&hc_tcp_ops, tr, HC_COMP_PUT, 1, NULL, 5000, &st);
            HCT_REQUIRE(st == HCOLL_SUCCESS, "put %zu: %s", len, eb.msg);
        } else {
            memset(buf, 0, MAX);
            uint32_t imm = UINT32_MAX;
            int got = hct_wait_comps(&hc_tcp_ops, tr, HC_COMP_IMM, 1, &imm, 5000, &st);
            HCT_REQUIRE(got == 1 && imm == k, "payload of %zu bytes (cap %zu): %d arrived, %s",
                        len, la->cap, got, eb.msg);
            for (size_t i = 0; i < len; i++)
                HCT_REQUIRE(buf[i] == (unsigned char)(i * 7 + k), "size %zu: byte %zu", len, i);
        }
        HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
    }
    if (rank == 1 && la->cap)
        HCT_REQUIRE(hc_tcp_lowat_raised(tr) > 0, "the low-water mark was never raised");
    if (rank == 1 && !la->cap)
        HCT_REQUIRE(hc_tcp_lowat_raised(tr) == 0, "raised without the knob");
    hc_tcp_ops.destroy(tr, 1);
    free(buf);
    return 0;
}

START_TEST(test_rcvlowat)
{
    lowat_arg_t *la = hct_shared_alloc(sizeof *la);
    la->ag.nranks = 2;
    la->cap = _i ? 256 * 1024 : 0;
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_lowat, la, res), 0);
    hct_shared_free(la, sizeof *la);
}
END_TEST

/* A small message costs one recv and one epoll_wait on its receiver, and
 * its sender's own completion no look at the sockets: a system call is
 * about 1 µs on a paravirtualised host, where a 4 KiB all-reduce's rank
 * made ten. Two ranks bounce a 4 KiB put (header and payload in one
 * frame) ROUNDS times, each waiting for the other's before sending; the
 * slices are long, so a wait that times out (the peer descheduled for a
 * second) is rare enough to stay inside the bound. Fails if the payload's
 * tail takes a second recv or the wait looks once without waiting first
 * (3 recvs and 2-3 epoll_waits per message). */
static int rank_pingpong(int rank, int n, void *arg)
{
    enum { ROUNDS = 200, LEN = 4096 };
    shm_ag_t *sag = arg;
    ag_ctx_t ag = { sag, rank };
    hc_transport_params_t p = tparams(rank, n, 1, 10000);
    hc_transport_t *tr;
    hc_ep_t *ep;
    if (connect_pair(&p, &ag, &tr, &ep))
        return 1;
    static unsigned char buf[2 * LEN];
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(hc_tcp_ops.mr_reg(tr, buf, sizeof buf, &mr, &rk) == HCOLL_SUCCESS, "reg");
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "keys");
    uint64_t r0, w0, r1, w1;
    hc_tcp_io_calls(tr, &r0, &w0);
    for (int k = 0; k < ROUNDS; k++) {
        if ((k & 1) == rank) { /* send: the payload from the first half, into the second */
            memset(buf, k, LEN);
            HCT_REQUIRE(hc_tcp_ops.put(ep, mr, 0, &rks[1 - rank], LEN, LEN, (uint32_t)k, 0) ==
                            HCOLL_SUCCESS, "put %d", k);
        }
        int put_done = (k & 1) != rank, landed = (k & 1) == rank;
        double deadline = hct_now_ms() + 10000;
        while ((!put_done || !landed) && hct_now_ms() < deadline) {
            hc_comp_t c[4];
            int got = 0;
            HCT_REQUIRE(hc_tcp_ops.poll(tr, c, 4, 1000, &got) == HCOLL_SUCCESS, "poll: %s",
                        eb.msg);
            for (int i = 0; i < got; i++) {
                put_done |= c[i].kind == HC_COMP_PUT;
                landed |= c[i].kind == HC_COMP_IMM && c[i].imm == (uint32_t)k;
            }
        }
        HCT_REQUIRE(put_done && landed, "round %d never completed", k);
        if ((k & 1) != rank)
            for (int i = 0; i < LEN; i++)
                HCT_REQUIRE(buf[LEN + i] == (unsigned char)k, "round %d: byte %d", k, i);
    }
    hc_tcp_io_calls(tr, &r1, &w1);
    const uint64_t landed = ROUNDS / 2;
    fprintf(stderr, "rank %d: %d puts of %d bytes landed here: %llu recv, %llu epoll_wait\n",
            rank, (int)landed, LEN, (unsigned long long)(r1 - r0), (unsigned long long)(w1 - w0));
    HCT_REQUIRE(r1 - r0 <= landed + landed / 8, "%llu recv calls for %llu messages",
                (unsigned long long)(r1 - r0), (unsigned long long)landed);
    HCT_REQUIRE(w1 - w0 <= landed + landed / 4, "%llu epoll_wait calls for %llu messages",
                (unsigned long long)(w1 - w0), (unsigned long long)landed);
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
    hc_tcp_ops.destroy(tr, 1);
    return 0;
}

START_TEST(test_small_message_calls)
{
    ck_assert_int_eq(run_ranks(rank_pingpong, 2, 60000), 0);
}
END_TEST

static Suite *tcp_suite(void)
{
    Suite *s = suite_create("tcp");
    TCase *tc = tcase_create("tcp");
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    tcase_add_test(tc, test_select);
    tcase_add_test(tc, test_compq_fifo);
    tcase_add_test(tc, test_bad_bind);
    tcase_add_test(tc, test_corrupt_frames);
    tcase_add_test(tc, test_stranger);
    tcase_add_test(tc, test_connect_timeout);
    tcase_add_test(tc, test_connect_cancel);
    tcase_add_loop_test(tc, test_rcvlowat, 0, 2);
    tcase_add_test(tc, test_small_message_calls);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tcp_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
