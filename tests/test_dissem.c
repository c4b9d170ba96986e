/*
 * The dissemination barrier's own interface (src/inter/dissem.h), one
 * position of 4 (rounds 0 and 1: signal 1 then 2, hear 3 then 2), over a
 * transport written here: signals are queued by the test, puts recorded.
 *
 * What it pins down: progress called while no barrier runs (before the
 * first, or between two) keeps what landed for the barrier to come and
 * sends nothing. It used to take the signals as the last barrier's (or,
 * before the first, as barrier 0's): it sent rounds of a barrier this
 * rank had not entered, lost them when it did enter, or failed a later
 * barrier's early signal as a mismatch. core/barrier.c never calls it so
 * today; the module promises it all the same.
 */
#include <check.h>
#include <string.h>

#include "base/err.h"
#include "inter/dissem.h"

struct hc_transport {
    int unused;
};
struct hc_ep {
    int peer;
};

/* The signal's immediate as dissem.c writes it: tag 0xb, seq, round. */
#define SIG(seq, k) (0xbu << 28 | ((uint32_t)(seq)&0xffffu) << 8 | ((uint32_t)(k)&0xffu))

static struct {
    struct hc_transport tr;
    struct hc_ep eps[4];
    hc_comp_t q[16];
    int nq;
    uint32_t put_imm[16];
    int put_peer[16];
    int nput;
} T;

static hcoll_status_t t_create(const hc_transport_params_t *p, hc_transport_t **out)
{
    (void)p;
    *out = &T.tr;
    return HCOLL_SUCCESS;
}

static hcoll_status_t t_connect(hc_transport_t *tr, const int *peers, int npeers,
                                hc_allgather_fn ag, void *ctx, hc_ep_t **eps_out)
{
    (void)tr, (void)ag, (void)ctx;
    ck_assert_int_le(npeers, 4);
    for (int i = 0; i < npeers; i++) {
        T.eps[i].peer = peers[i];
        eps_out[i] = &T.eps[i];
    }
    return HCOLL_SUCCESS;
}

static hcoll_status_t t_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                            uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id)
{
    (void)lmr, (void)loff, (void)rkey, (void)roff, (void)wr_id;
    ck_assert_uint_eq(len, 0);
    ck_assert_int_lt(T.nput, 16);
    T.put_imm[T.nput] = imm;
    T.put_peer[T.nput++] = ep->peer;
    return HCOLL_SUCCESS;
}

static hcoll_status_t t_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                             int *n_out)
{
    (void)tr, (void)wait_ms;
    int n = T.nq < max ? T.nq : max;
    memcpy(comps, T.q, (size_t)n * sizeof *comps);
    memmove(T.q, T.q + n, (size_t)(T.nq - n) * sizeof *T.q);
    T.nq -= n;
    *n_out = n;
    return HCOLL_SUCCESS;
}

static void t_destroy(hc_transport_t *tr, int graceful)
{
    (void)tr, (void)graceful;
}

static const hc_transport_ops_t t_ops = {
    .name = "script", .create = t_create, .connect = t_connect, .put = t_put,
    .poll = t_poll, .destroy = t_destroy,
};

static hcoll_status_t t_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    (void)ctx, (void)mine, (void)all, (void)len;
    return HCOLL_SUCCESS;
}

static hc_errbuf_t eb;

static hc_dissem_t *make(void)
{
    memset(&T, 0, sizeof T);
    hc_errbuf_init(&eb);
    const hc_dissem_params_t p = {
        .ops = &t_ops,
        .tp = { .rank = 0, .nranks = 4, .timeout_ms = 1000, .errbuf = &eb },
        .allgather = t_allgather,
        .op_timeout_ms = -1,
    };
    hc_dissem_t *d = NULL;
    ck_assert_int_eq(hc_dissem_create(&p, &d), HCOLL_SUCCESS);
    return d;
}

static void land(int from, uint32_t imm)
{
    ck_assert_int_lt(T.nq, 16);
    T.q[T.nq++] = (hc_comp_t){ .kind = HC_COMP_IMM, .peer = from, .imm = imm };
}

static int progress(hc_dissem_t *d)
{
    int done = -1;
    const hcoll_status_t st = hc_dissem_progress(d, 0, &done);
    ck_assert_msg(st == HCOLL_SUCCESS, "progress: %s: %s", hcoll_status_name(st),
                  hc_errbuf_get(&eb));
    return done;
}

/* Barrier seq, both rounds' signals already kept: entering sends round 0
 * to 1, the first progress round 1 to 2, and it is done. */
static void run_kept(hc_dissem_t *d, uint32_t seq)
{
    const int before = T.nput;
    ck_assert_int_eq(hc_dissem_start(d, seq), HCOLL_SUCCESS);
    ck_assert_int_eq(progress(d), 1);
    ck_assert_int_eq(T.nput, before + 2);
    ck_assert_uint_eq(T.put_imm[before], SIG(seq, 0));
    ck_assert_int_eq(T.put_peer[before], 1);
    ck_assert_uint_eq(T.put_imm[before + 1], SIG(seq, 1));
    ck_assert_int_eq(T.put_peer[before + 1], 2);
}

static void idle_before_first(uint32_t seq)
{
    hc_dissem_t *d = make();
    land(3, SIG(seq, 0));
    land(2, SIG(seq, 1));
    ck_assert_int_eq(progress(d), 1); /* no barrier: nothing to finish */
    ck_assert_int_eq(T.nput, 0);      /* and nothing sent for one not entered */
    ck_assert_int_eq(T.nq, 0);        /* but the signals were taken */
    run_kept(d, seq);
    hc_dissem_destroy(d);
    hc_errbuf_fini(&eb);
}

START_TEST(idle_before_first_seq0)
{
    idle_before_first(0);
}
END_TEST

START_TEST(idle_before_first_seq7)
{
    idle_before_first(7);
}
END_TEST

/* Barrier 3, an all-reduce (4), then barrier 5's signals land while this
 * rank is between operations. */
START_TEST(idle_between)
{
    hc_dissem_t *d = make();
    land(3, SIG(3, 0));
    land(2, SIG(3, 1));
    run_kept(d, 3);
    ck_assert_int_eq(progress(d), 1);
    ck_assert_int_eq(hc_dissem_absorb(d, 4, "an all-reduce"), HCOLL_SUCCESS);
    land(3, SIG(5, 0));
    ck_assert_int_eq(progress(d), 1);
    ck_assert_int_eq(T.nput, 2);
    land(2, SIG(5, 1));
    ck_assert_int_eq(progress(d), 1);
    ck_assert_int_eq(T.nput, 2);
    run_kept(d, 5);
    /* Right after a barrier, the next one's signal: kept too. */
    land(3, SIG(6, 0));
    ck_assert_int_eq(progress(d), 1);
    ck_assert_int_eq(hc_dissem_start(d, 6), HCOLL_SUCCESS);
    ck_assert_int_eq(progress(d), 0); /* round 0 heard, round 1 sent, not heard */
    ck_assert_int_eq(T.nput, 6);
    ck_assert_uint_eq(T.put_imm[5], SIG(6, 1));
    land(2, SIG(6, 1));
    ck_assert_int_eq(progress(d), 1);
    hc_dissem_destroy(d);
    hc_errbuf_fini(&eb);
}
END_TEST

static void idle_refused(const uint32_t *imm, const int *from, int n, int ran, const char *want)
{
    hc_dissem_t *d = make();
    if (ran) {
        land(3, SIG(3, 0));
        land(2, SIG(3, 1));
        run_kept(d, 3);
    }
    for (int i = 0; i < n; i++)
        land(from[i], imm[i]);
    int done = -1;
    ck_assert_int_eq(hc_dissem_progress(d, 0, &done), HCOLL_ERR_MISMATCH);
    ck_assert_msg(strstr(hc_errbuf_get(&eb), want), "message: %s", hc_errbuf_get(&eb));
    /* Sticky, and nothing was sent for it. */
    ck_assert_int_eq(hc_dissem_start(d, 4), HCOLL_ERR_MISMATCH);
    ck_assert_int_eq(T.nput, ran ? 2 : 0);
    hc_dissem_destroy(d);
    hc_errbuf_fini(&eb);
}

/* What a partner can never send between barriers: still a mismatch. */
START_TEST(idle_mismatch)
{
    /* A barrier this rank already ran (its signals all arrived). */
    idle_refused((const uint32_t[]){ SIG(3, 0) }, (const int[]){ 3 }, 1, 1, "already run");
    /* Two different barriers ahead of this rank. */
    idle_refused((const uint32_t[]){ SIG(4, 0), SIG(5, 1) }, (const int[]){ 3, 2 }, 2, 1,
                 "another as operation 5");
    idle_refused((const uint32_t[]){ SIG(9, 0), SIG(8, 0) }, (const int[]){ 3, 3 }, 2, 0,
                 "another as operation 8");
}
END_TEST

/* A barrier's early signal kept while idle, then this rank runs that
 * operation as an all-reduce: the absorb's mismatch, as before. */
START_TEST(idle_then_absorb)
{
    hc_dissem_t *d = make();
    land(3, SIG(4, 0));
    ck_assert_int_eq(progress(d), 1);
    ck_assert_int_eq(hc_dissem_absorb(d, 4, "an all-reduce"), HCOLL_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(hc_errbuf_get(&eb), "an all-reduce"));
    ck_assert_int_eq(T.nput, 0);
    hc_dissem_destroy(d);
    hc_errbuf_fini(&eb);
}
END_TEST

/* A signal for barrier 5 kept while idle, then this rank enters barrier 4:
 * the sender ran 4 as something else. A mismatch at once, not a signal
 * dropped (the fuzz target's crash: dropped, the later absorb of 5 passed). */
START_TEST(idle_then_other_barrier)
{
    hc_dissem_t *d = make();
    land(3, SIG(5, 0));
    ck_assert_int_eq(progress(d), 1);
    ck_assert_int_eq(hc_dissem_start(d, 4), HCOLL_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(hc_errbuf_get(&eb), "operation 5 before this rank entered"));
    ck_assert_int_eq(T.nput, 0);
    ck_assert_int_eq(hc_dissem_absorb(d, 5, "an all-reduce"), HCOLL_ERR_MISMATCH);
    hc_dissem_destroy(d);
    hc_errbuf_fini(&eb);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dissem");
    TCase *tc = tcase_create("idle");
    tcase_add_test(tc, idle_before_first_seq0);
    tcase_add_test(tc, idle_before_first_seq7);
    tcase_add_test(tc, idle_between);
    tcase_add_test(tc, idle_mismatch);
    tcase_add_test(tc, idle_then_absorb);
    tcase_add_test(tc, idle_then_other_barrier);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
