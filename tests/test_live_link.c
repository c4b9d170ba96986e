/*
 * The ring's liveness links prove the communicator's key at both ends
 * (inter/ring_link.c), and strangers on the liveness port cannot delay or
 * replace prev. One ring position (position 1 of 3) links on a thread of
 * this process; this thread plays its prev (position 0) and its next
 * (position 2) from the protocol (tests/live_peer.h), plus strangers.
 */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "inter/ring_priv.h"
#include "live_peer.h"

static const uint8_t key[32] = "test_live_link's communicator k";
static const uint8_t other_key[32] = "another job's communicator key!";

typedef struct pos {
    hc_ring_t *r;
    hc_errbuf_t eb;
    uint32_t port;       /* its liveness port */
    uint16_t next_port;  /* where it dials */
    hcoll_status_t st;
    double ms;           /* what hc_ring_live_connect took */
} pos_t;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

static int listener(uint16_t *port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert(fd >= 0);
    ck_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 16) == 0);
    ck_assert(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static void pos_init(pos_t *p, int timeout_ms)
{
    memset(p, 0, sizeof *p);
    hc_errbuf_init(&p->eb);
    hc_ring_t *r = calloc(1, sizeof *r);
    ck_assert(r != NULL);
    r->rank = 1;
    r->n = 3;
    r->next = 2;
    r->prev = 0;
    r->p.liveness_ms = 60000;
    r->p.tp = (hc_transport_params_t){ .rank = 1, .nranks = 3, .bind_addr = "127.0.0.1",
                                       .ifname = "lo", .errbuf = &p->eb,
                                       .timeout_ms = timeout_ms, .auth_key = key,
                                       .mac = hc_hmac_sha256 };
    uint32_t ip;
    ck_assert(hc_ring_live_listen(r, &ip, &p->port) == HCOLL_SUCCESS && p->port);
    p->r = r;
}

static void *pos_run(void *arg)
{
    pos_t *p = arg;
    double t0 = now_ms();
    p->st = hc_ring_live_connect(p->r, htonl(INADDR_LOOPBACK), p->next_port);
    p->ms = now_ms() - t0;
    return NULL;
}

static void pos_fini(pos_t *p)
{
    hc_ring_live_close(p->r, 0);
    free(p->r);
    hc_errbuf_fini(&p->eb);
}

static uint16_t local_port(int fd)
{
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    ck_assert(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
    return ntohs(a.sin_port);
}

/* Ten idle strangers, one that knows another key, one whose MAC is off by
 * one bit, then prev: the link from prev is prev's, at once. */
START_TEST(strangers_and_impostors)
{
    const int fds0 = open_fds();
    pos_t p;
    pos_init(&p, 20000);
    int nl = listener(&p.next_port);
    pthread_t th;
    pthread_create(&th, NULL, pos_run, &p);
    int idle[10];
    for (int i = 0; i < 10; i++)
        ck_assert((idle[i] = lp_dial((uint16_t)p.port)) >= 0);
    int chal_ok = 0;
    int imp = lp_prev((uint16_t)p.port, other_key, 1, 0, 0, &chal_ok);
    ck_assert_msg(imp >= 0, "the position did not challenge a plausible hello");
    ck_assert_msg(!chal_ok, "a challenge under another key passed");
    int miss = lp_prev((uint16_t)p.port, key, 1, 0, 1, &chal_ok);
    ck_assert(miss >= 0 && chal_ok);
    const double t_prev = now_ms();
    int prev = lp_prev((uint16_t)p.port, key, 1, 0, 0, &chal_ok);
    ck_assert_msg(prev >= 0 && chal_ok, "the position did not prove the key to prev");
    ck_assert_msg(lp_next(nl, key, 2, 1, 0) == 1, "the position's dial did not prove the key");
    pthread_join(th, NULL);
    ck_assert_msg(p.st == HCOLL_SUCCESS, "%s: %s", hcoll_status_name(p.st),
                  hc_errbuf_get(&p.eb));
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    ck_assert(getpeername(p.r->live[1].fd, (struct sockaddr *)&a, &al) == 0);
    ck_assert_msg(ntohs(a.sin_port) == local_port(prev),
                  "the link from prev is not prev's connection");
    /* The strangers cost nothing like a second each. */
    ck_assert_msg(now_ms() - t_prev < 2000, "prev linked %.0f ms after it dialed",
                  now_ms() - t_prev);
    pos_fini(&p);
    for (int i = 0; i < 10; i++)
        close(idle[i]);
    close(imp);
    close(miss);
    close(prev);
    close(nl);
    ck_assert_int_eq(open_fds(), fds0);
}
END_TEST

/* A next that cannot prove the key (its MAC one bit off) fails the set-up
 * with MISMATCH at once, naming it. */
START_TEST(next_without_the_key)
{
    const int fds0 = open_fds();
    pos_t p;
    pos_init(&p, 20000);
    int nl = listener(&p.next_port);
    pthread_t th;
    pthread_create(&th, NULL, pos_run, &p);
    ck_assert_int_eq(lp_next(nl, key, 2, 1, 1), 0);
    pthread_join(th, NULL);
    ck_assert_msg(p.st == HCOLL_ERR_MISMATCH, "%s: %s", hcoll_status_name(p.st),
                  hc_errbuf_get(&p.eb));
    ck_assert_msg(strstr(hc_errbuf_get(&p.eb), "did not prove"), "%s", hc_errbuf_get(&p.eb));
    ck_assert_msg(p.ms < 5000, "took %.0f ms", p.ms);
    pos_fini(&p);
    close(nl);
    ck_assert_int_eq(open_fds(), fds0);
}
END_TEST

/* Only strangers and another job's prev: no link from prev, TIMEOUT. */
START_TEST(no_prev_times_out)
{
    const int fds0 = open_fds();
    pos_t p;
    pos_init(&p, 1500);
    int nl = listener(&p.next_port);
    pthread_t th;
    pthread_create(&th, NULL, pos_run, &p);
    int chal_ok = 1;
    int imp = lp_prev((uint16_t)p.port, other_key, 1, 0, 0, &chal_ok);
    ck_assert(lp_next(nl, key, 2, 1, 0) == 1);
    pthread_join(th, NULL);
    ck_assert_msg(p.st == HCOLL_ERR_TIMEOUT, "%s: %s", hcoll_status_name(p.st),
                  hc_errbuf_get(&p.eb));
    ck_assert_msg(strstr(hc_errbuf_get(&p.eb), "from prev"), "%s", hc_errbuf_get(&p.eb));
    ck_assert(p.r->live[0].fd == -1 && p.r->live[1].fd == -1);
    pos_fini(&p);
    if (imp >= 0)
        close(imp);
    close(nl);
    ck_assert_int_eq(open_fds(), fds0);
}
END_TEST

int main(void)
{
    setenv("HCOLL_DEBUG", "NONE", 0);
    Suite *s = suite_create("live_link");
    TCase *tc = tcase_create("hello");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, strangers_and_impostors);
    tcase_add_test(tc, next_without_the_key);
    tcase_add_test(tc, no_prev_times_out);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
