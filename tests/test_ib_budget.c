/*
 * A latency budget for small host all-reduces over the verbs transport, on
 * two emulated nodes (tests/mock/verbs.c) whose NIC has a one-way latency
 * of HCMOCK_IB_LAT_US. A real NIC's round trip is 2-5 us; a progress loop
 * that sleeps between sweeps (20 us plus the timer slack, about 70 us)
 * multiplies that, and no functional test notices.
 *
 *   rank 0                                   rank 1
 *   ① round trip: put+imm ──► spin ──► put+imm back   (the transport
 *      polled by this test without waiting: what the emulated wire costs,
 *      and how soon a spinning poller takes a completion here)
 *   ② local overhead: the same all-reduce on a one-rank communicator
 *   ③ the all-reduce on the two-node communicator, timed
 *
 *   budget    = ring steps x round trip (①) + local overhead (②)
 *   ③ median <= SLACK x budget
 *   pickup    = how long hcoll's completions sat in the CQ during ③
 *               (the emulation timestamps them), median
 *            <= 2 x a spinning poller's pickup (①) + the emulated round trip
 *
 * Every figure is this run's own median, so a slow or loaded host moves
 * the budget with the measurement. The pickup delay is what a sleeping
 * poller adds and the emulation's own transit is not: on a loaded host
 * it tells the two apart where end-to-end times cannot.
 *
 * budget_no_flush_for_host: a GPUDirect flush read (sm_80: one more round
 * trip on the loopback QP) holds back an immediate only when a device
 * region is registered; a ring that moves host memory pays none.
 *
 * main re-executes this program inside the emulation (common/mockib.h).
 * Skips (77) when hcoll was built without rdma-core headers or the mock is
 * not built.
 */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "common/seam.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"
#include "hcoll.h"

#if HCOLL_BUILD_VERBS

#define LAT_US   "10"  /* one-way: a round trip of 20 us plus the emulation's transit */
#define NPING    300
#define NITER    300
#define SLACK    2.0
#define SMALL    256   /* floats: the ring's gather path (n - 1 steps) */

typedef struct budget_arg {
    hct_barrier_t bar;
    hct_id_slot_t slot;
    char slot_ag[2][4096];
    double rtt_us;            /* rank 0's median round trip */
    double local_us[2];       /* each rank's one-rank all-reduce, median */
    double ar_us[2];          /* each rank's two-node all-reduce, median */
    double spin_pick_us[2];   /* completions' pickup delay, median: the test's spinning poller */
    double pick_us[2];        /* the same during the all-reduces: hcoll's poller */
} budget_arg_t;

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, dbl_cmp);
    return v[n / 2];
}

/* The emulation's pickup delays (tests/mock/verbs.c): quantile q, us. */
static double pickup_us(double q, int reset)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    double (*f)(double, int) = h ? (double (*)(double, int))dlsym(h, "hcmock_verbs_pickup_us")
                                 : NULL;
    return f ? f(q, reset) : -2;
}

typedef struct ag_ctx {
    budget_arg_t *a;
    int rank;
} ag_ctx_t;

static hcoll_status_t shm_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    ag_ctx_t *c = ctx;
    if (len > sizeof c->a->slot_ag[0])
        return HCOLL_ERR_INTERNAL;
    memcpy(c->a->slot_ag[c->rank], mine, len);
    if (hct_barrier_wait(&c->a->bar, 2, 20000) != 0)
        return HCOLL_ERR_TIMEOUT;
    for (int i = 0; i < 2; i++)
        memcpy((char *)all + (size_t)i * len, c->a->slot_ag[i], len);
    if (hct_barrier_wait(&c->a->bar, 2, 20000) != 0)
        return HCOLL_ERR_TIMEOUT;
    return HCOLL_SUCCESS;
}

/* Spin on the transport (wait_ms 0: no sleep of the library's) until an
 * immediate arrives; put completions are absorbed. */
static int wait_imm(hc_transport_t *tr, double deadline_ms)
{
    for (;;) {
        hc_comp_t comps[16];
        int n = 0;
        if (hc_ib_ops.poll(tr, comps, 16, 0, &n) != HCOLL_SUCCESS)
            return -1;
        for (int i = 0; i < n; i++)
            if (comps[i].kind == HC_COMP_IMM)
                return 0;
        if (hct_now_ms() > deadline_ms)
            return -1;
        sched_yield(); /* the emulated NIC's thread may need this core */
    }
}

/* ①: the emulated wire's round trip, measured on the transport itself. */
static int round_trip(budget_arg_t *a, int rank)
{
    hc_errbuf_t eb;
    hc_params_t settings;
    hc_transport_params_t tp;
    hc_transport_t *tr;
    ag_ctx_t ag = { a, rank };
    HCT_REQUIRE(hct_ib_params(rank, 2, &eb, &settings, &tp) == HCOLL_SUCCESS, "%s", eb.msg);
    HCT_REQUIRE(hc_ib_ops.create(&tp, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    int peer = 1 - rank;
    hc_ep_t *ep;
    HCT_REQUIRE(hc_ib_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep) == HCOLL_SUCCESS,
                "connect: %s", eb.msg);
    static char buf[64];
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, buf, sizeof buf, &mr, &rk) == HCOLL_SUCCESS, "%s", eb.msg);
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "exchange keys");
    double t[NPING];
    const double deadline = hct_now_ms() + 20000;
    pickup_us(0.5, 1);
    for (int i = 0; i < NPING; i++) {
        double t0 = hct_now_ms();
        if (rank == 1)
            HCT_REQUIRE(wait_imm(tr, deadline) == 0, "no ping %d: %s", i, eb.msg);
        HCT_REQUIRE(hc_ib_ops.put(ep, mr, 0, &rks[peer], 0, 8, (uint32_t)i, 0) == HCOLL_SUCCESS,
                    "put: %s", eb.msg);
        if (rank == 0)
            HCT_REQUIRE(wait_imm(tr, deadline) == 0, "no pong %d: %s", i, eb.msg);
        t[i] = (hct_now_ms() - t0) * 1e3;
    }
    if (rank == 0)
        a->rtt_us = median(t, NPING);
    a->spin_pick_us[rank] = pickup_us(0.5, 1);
    /* Both sides' last puts have completed before the QPs go. */
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "end");
    hc_ib_ops.mr_dereg(tr, mr);
    hc_ib_ops.destroy(tr, 1);
    return 0;
}

/* Median microseconds of NITER all-reduces of SMALL floats on comm. */
static int time_allreduce(hcoll_comm_t comm, int rank, int n, double *med_out, double *pick_out)
{
    float in[SMALL], out[SMALL];
    double t[NITER];
    for (int w = 0; w < 20; w++)
        HCT_OK(comm, hcoll_allreduce(comm, in, out, SMALL, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    pickup_us(0.5, 1);
    for (int i = 0; i < NITER; i++) {
        for (int k = 0; k < SMALL; k++)
            in[k] = (float)(rank + k + i);
        double t0 = hct_now_ms();
        HCT_OK(comm, hcoll_allreduce(comm, in, out, SMALL, HCOLL_FLOAT32, HCOLL_SUM, NULL));
        t[i] = (hct_now_ms() - t0) * 1e3;
        for (int k = 0; k < SMALL; k++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += (float)(r + k + i);
            HCT_REQUIRE(out[k] == want, "rank %d: element %d is %g, not %g", rank, k,
                        (double)out[k], (double)want);
        }
    }
    *med_out = median(t, NITER);
    *pick_out = pickup_us(0.5, 1);
    return 0;
}

static int rank_budget(int rank, int n, void *argp)
{
    budget_arg_t *a = argp;
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    setenv("HCMOCK_IB_LAT_US", LAT_US, 1);
    if (round_trip(a, rank))
        return 1;
    /* ②: the call's own cost, no network. */
    hcoll_comm_t one;
    hcoll_unique_id_t id1;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    HCT_OK(NULL, hcoll_get_unique_id(&id1));
    HCT_OK(NULL, hcoll_comm_init(&one, 1, 0, &id1, &cfg));
    double unused;
    if (time_allreduce(one, 0, 1, &a->local_us[rank], &unused))
        return 1;
    HCT_OK(one, hcoll_comm_destroy(one));
    /* ③ */
    hcoll_comm_t comm;
    hcoll_unique_id_t id;
    cfg.net = "ib";
    cfg.timeout_ms = 20000;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(&comm, n, rank, &id, &cfg));
    if (time_allreduce(comm, rank, n, &a->ar_us[rank], &a->pick_us[rank]))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(budget_small_allreduce)
{
    budget_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[2];
    int bad = hct_run(&o, rank_budget, a, res);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
    const int steps = 1; /* two nodes, the gather path: n - 1 */
    ck_assert_msg(a->spin_pick_us[0] >= 0 && a->pick_us[0] >= 0, "the emulation recorded no "
                  "completion pickups (%.1f, %.1f)", a->spin_pick_us[0], a->pick_us[0]);
    const double spin = a->spin_pick_us[0] < a->spin_pick_us[1] ? a->spin_pick_us[0]
                                                                 : a->spin_pick_us[1];
    const double pick_budget = 2 * spin + 2 * atoi(LAT_US);
    for (int r = 0; r < 2; r++) {
        const double budget = steps * a->rtt_us + a->local_us[r];
        fprintf(stderr,
                "rank %d: %d-float all-reduce %.1f us median; budget %.1f us = %d x round trip "
                "%.1f us (one-way %s us emulated) + local %.1f us; %.2f x budget\n",
                r, SMALL, a->ar_us[r], budget, steps, a->rtt_us, LAT_US, a->local_us[r],
                a->ar_us[r] / budget);
        fprintf(stderr, "rank %d: completions picked up after %.1f us (median), %.1f us by a "
                "spinning poller\n", r, a->pick_us[r], a->spin_pick_us[r]);
        ck_assert_msg(a->ar_us[r] <= SLACK * budget,
                      "rank %d: a %d-float all-reduce takes %.1f us, over %.1f x its budget of "
                      "%.1f us (%d x %.1f us round trip + %.1f us local)",
                      r, SMALL, a->ar_us[r], SLACK, budget, steps, a->rtt_us, a->local_us[r]);
        ck_assert_msg(a->pick_us[r] <= pick_budget,
                      "rank %d: hcoll took its completions %.1f us after they arrived (median), "
                      "over its budget of %.1f us = 2 x %.1f us (a spinning poller here) + %d us "
                      "(the emulated round trip): does its poll loop sleep?",
                      r, a->pick_us[r], pick_budget, spin, 2 * atoi(LAT_US));
    }
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ---- flush reads only where device memory can be written ----------------- */

typedef struct flush_arg {
    budget_arg_t b; /* its allgather */
    char root[200];
} flush_arg_t;

static uint64_t mock_stat(const char *name)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    uint64_t (*f)(const char *) = h ? (uint64_t(*)(const char *))dlsym(h, "hcmock_verbs_stat")
                                    : NULL;
    return f ? f(name) : UINT64_MAX;
}

/* nput puts of 4 KiB from rank 0 into rank 1's region rk; rank 1 waits
 * for their immediates. */
static int puts_to_1(hc_transport_t *tr, hc_ep_t *ep, hc_mr_t *mr, const hc_rkey_t *rk, int rank,
                     hc_errbuf_t *eb)
{
    const int nput = 16;
    hcoll_status_t st;
    if (rank == 0) {
        for (int k = 0; k < nput; k++)
            HCT_REQUIRE(hc_ib_ops.put(ep, mr, 0, rk, (size_t)k * 4096, 4096, (uint32_t)k, 0) ==
                            HCOLL_SUCCESS,
                        "put: %s", eb->msg);
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, nput, NULL, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == nput, "puts %d/%d: %s", got, nput, eb->msg);
    } else {
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, nput, NULL, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == nput, "immediates %d/%d: %s", got, nput,
                    eb->msg);
    }
    return 0;
}

static int rank_flush(int rank, int n, void *argp)
{
    flush_arg_t *a = argp;
    ag_ctx_t ag = { &a->b, rank };
    setenv("HCMOCK_CC", "8.0", 1); /* before Hopper: GPUDirect writes want a flush read */
    setenv("HCMOCK_IB_SYSFS", a->root, 1);
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU 0 from the mock CUDA driver");
    hc_errbuf_t eb;
    hc_params_t settings;
    hc_transport_params_t p;
    HCT_REQUIRE(hct_ib_params(rank, n, &eb, &settings, &p) == HCOLL_SUCCESS, "%s", eb.msg);
    snprintf(settings.sysfs_root, sizeof settings.sysfs_root, "%s", a->root);
    p.has_gpu = 1;
    p.gpu = 0;
    hc_transport_t *tr;
    HCT_REQUIRE(hc_ib_ops.create(&p, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    HCT_REQUIRE(hc_ib_ops.gdr && hc_ib_ops.gdr(tr), "GPUDirect is off on sysfs-mockib");
    int peer = 1 - rank;
    hc_ep_t *ep;
    HCT_REQUIRE(hc_ib_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep) == HCOLL_SUCCESS,
                "connect: %s", eb.msg);
    const size_t bytes = 16 * 4096;
    void *host = calloc(1, bytes);
    hc_cu_dptr_t dbuf = 0;
    HCT_REQUIRE(host && cu->mem_alloc(&dbuf, bytes) == HC_CU_SUCCESS, "buffers");
    hc_mr_t *hmr, *dmr = NULL;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, host, bytes, &hmr, &rk) == HCOLL_SUCCESS, "%s", eb.msg);
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "exchange keys");
    /* Host memory only, on both sides: nothing for a flush to order. */
    if (puts_to_1(tr, ep, hmr, &rks[1], rank, &eb))
        return 1;
    HCT_REQUIRE(rank == 0 || mock_stat("reads") == 0,
                "rank 1: %llu flush read(s) for immediates of puts into host memory",
                (unsigned long long)mock_stat("reads"));
    /* A device region on rank 1: its immediates wait for a flush read. */
    if (rank == 1)
        HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)dbuf, bytes, &dmr, &rk) ==
                        HCOLL_SUCCESS,
                    "registering device memory: %s", eb.msg);
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "exchange keys");
    if (puts_to_1(tr, ep, hmr, &rks[1], rank, &eb))
        return 1;
    HCT_REQUIRE(rank == 0 || mock_stat("reads") > 0,
                "rank 1: no flush read with a device region registered");
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
    hc_ib_ops.mr_dereg(tr, hmr);
    if (dmr)
        hc_ib_ops.mr_dereg(tr, dmr);
    hc_ib_ops.destroy(tr, 1);
    cu->mem_free(dbuf);
    free(host);
    return hct_mock_released(rank ? "flush rank 1" : "flush rank 0");
}

START_TEST(budget_no_flush_for_host)
{
    char cuda[PATH_MAX];
    if (!hct_mock_cuda_built(cuda, sizeof cuda)) {
        printf("SKIP: budget_no_flush_for_host: %s not built\n", cuda);
        return;
    }
    flush_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    char root[PATH_MAX];
    ck_assert_ptr_nonnull(realpath("tests/fixtures/sysfs-mockib", root));
    ck_assert_uint_lt(strlen(root), sizeof a->root);
    snprintf(a->root, sizeof a->root, "%.199s", root);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 40000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_flush, a, res), 0);
    hct_shared_free(a, sizeof *a);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ib_budget");
    TCase *t = tcase_create("budget");
    tcase_set_timeout(t, 90);
    tcase_add_test(t, budget_small_allreduce);
    tcase_add_test(t, budget_no_flush_for_host);
    suite_add_tcase(s, t);
    return s;
}

int main(int argc, char **argv)
{
    int rc = hct_mockib_enter(argv);
    if (rc != 0)
        return rc;
    (void)argc;
    return hct_mockib_run(suite());
}

#else

int main(void)
{
    printf("SKIP: hcoll was built without rdma-core headers (HCOLL_BUILD_VERBS=0)\n");
    return 77;
}

#endif
