/*
 * The TCP transport without a random source: getrandom failing must fail
 * create (the instance token) or connect (a hello nonce, on either side)
 * with a message naming getrandom, and never connect with a guessable
 * nonce instead. getrandom is replaced here for the whole program (the
 * library is linked statically, so its calls land here); it fails only on
 * the threads that asked for it.
 *
 * Two transports, positions 0 (the dialer) and 1 (the acceptor), run on
 * two threads of this process over loopback.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/err.h"
#include "boot/hmac.h"
#include "inter/tcp_priv.h"

static __thread int fail_random; /* this thread's getrandom fails */
static int refused;              /* calls refused, all threads */

ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
    if (fail_random) {
        __atomic_add_fetch(&refused, 1, __ATOMIC_RELAXED);
        errno = ENOSYS;
        return -1;
    }
    return syscall(SYS_getrandom, buf, len, flags);
}

static const unsigned char key[HC_TP_KEY_BYTES] = "test_tcp_random's key";

/* The address exchange between the two threads. */
static pthread_barrier_t ag_bar;
static unsigned char ag_buf[2][256];

static hcoll_status_t thread_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    int me = *(int *)ctx;
    if (len > sizeof ag_buf[0])
        abort();
    memcpy(ag_buf[me], mine, len);
    pthread_barrier_wait(&ag_bar);
    memcpy(all, ag_buf[0], len);
    memcpy((char *)all + len, ag_buf[1], len);
    pthread_barrier_wait(&ag_bar);
    return HCOLL_SUCCESS;
}

typedef struct side {
    int me;
    int fail;              /* fail getrandom from connect on */
    hc_errbuf_t eb;
    hcoll_status_t create_st, connect_st;
    char msg[512];
} side_t;

static hcoll_status_t make(side_t *s, hc_transport_t **tr)
{
    hc_transport_params_t p = { .rank = s->me, .nranks = 2, .bind_addr = "127.0.0.1",
                                .ifname = "lo", .log_rank = s->me, .timeout_ms = 1500,
                                .nsocks_perpeer = 1, .errbuf = &s->eb, .gpu = -1,
                                .auth_key = key, .mac = hc_hmac_sha256 };
    return hc_tcp_ops.create(&p, tr);
}

static void *side_thread(void *arg)
{
    side_t *s = arg;
    hc_transport_t *tr = NULL;
    hc_errbuf_init(&s->eb);
    s->create_st = make(s, &tr);
    s->connect_st = s->create_st;
    if (s->create_st != HCOLL_SUCCESS) { /* still take part in the exchange */
        snprintf(s->msg, sizeof s->msg, "create: %s", hc_errbuf_get(&s->eb));
        pthread_barrier_wait(&ag_bar);
        pthread_barrier_wait(&ag_bar);
        hc_errbuf_fini(&s->eb);
        return NULL;
    }
    int peer = 1 - s->me;
    hc_ep_t *ep = NULL;
    fail_random = s->fail;
    s->connect_st = hc_tcp_ops.connect(tr, &peer, 1, thread_allgather, &s->me, &ep);
    fail_random = 0;
    snprintf(s->msg, sizeof s->msg, "%s", hc_errbuf_get(&s->eb));
    hc_tcp_ops.destroy(tr, 0);
    hc_errbuf_fini(&s->eb);
    return NULL;
}

/* Connect positions 0 and 1, getrandom failing on position failing. */
static void run_pair(int failing, side_t side[2])
{
    pthread_t t[2];
    pthread_barrier_init(&ag_bar, NULL, 2);
    __atomic_store_n(&refused, 0, __ATOMIC_RELAXED);
    for (int i = 0; i < 2; i++) {
        memset(&side[i], 0, sizeof side[i]);
        side[i].me = i;
        side[i].fail = i == failing;
        ck_assert_int_eq(pthread_create(&t[i], NULL, side_thread, &side[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&ag_bar);
}

START_TEST(control_pair_connects)
{
    /* Without a failure the same pair connects: the failures below are the
     * missing random source's. */
    side_t side[2];
    run_pair(-1, side);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(side[i].connect_st == HCOLL_SUCCESS, "position %d: %s", i, side[i].msg);
}
END_TEST

START_TEST(create_fails)
{
    side_t s = { .me = 0 };
    hc_transport_t *tr = NULL;
    hc_errbuf_init(&s.eb);
    __atomic_store_n(&refused, 0, __ATOMIC_RELAXED);
    fail_random = 1;
    hcoll_status_t st = make(&s, &tr);
    fail_random = 0;
    ck_assert_int_gt(refused, 0);
    ck_assert_msg(st == HCOLL_ERR_SYSTEM, "create -> %s", hcoll_status_name(st));
    ck_assert_ptr_null(tr);
    ck_assert_msg(strstr(hc_errbuf_get(&s.eb), "getrandom"), "%s", hc_errbuf_get(&s.eb));
    hc_errbuf_fini(&s.eb);
}
END_TEST

/* Position `failing` (0 dials, 1 accepts) has no random source from its
 * connect on: it fails naming getrandom, and the pair never connects. */
static void check_hello_fails(int failing)
{
    side_t side[2];
    run_pair(failing, side);
    ck_assert_msg(__atomic_load_n(&refused, __ATOMIC_RELAXED) > 0,
                  "connect never asked getrandom");
    const side_t *f = &side[failing], *o = &side[1 - failing];
    ck_assert_msg(f->connect_st == HCOLL_ERR_SYSTEM, "failing side: %s (%s)",
                  hcoll_status_name(f->connect_st), f->msg);
    ck_assert_msg(strstr(f->msg, "getrandom for a hello nonce"), "%s", f->msg);
    ck_assert_msg(o->connect_st != HCOLL_SUCCESS, "the other side connected");
}

START_TEST(dialer_nonce_fails)
{
    check_hello_fails(0);
}
END_TEST

START_TEST(acceptor_nonce_fails)
{
    check_hello_fails(1);
}
END_TEST

int main(void)
{
    setenv("HCOLL_DEBUG", "NONE", 0);
    Suite *s = suite_create("tcp_random");
    TCase *tc = tcase_create("getrandom");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, control_pair_connects);
    tcase_add_test(tc, create_fails);
    tcase_add_test(tc, dialer_nonce_fails);
    tcase_add_test(tc, acceptor_nonce_fails);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
