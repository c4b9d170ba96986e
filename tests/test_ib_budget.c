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
 *            <= 2 x a spinning poller's pickup (①) + 2 x the emulated round trip
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
 * budget_staging_registered_once: device buffers with GPUDirect off are
 * staged through hcoll's pinned host memory, which the ring registers for
 * every piece it moves; the emulated NIC charges HCMOCK_IB_REG_PAGE_NS per
 * page, and after the first calls no registration may happen at all.
 *
 * budget_small_puts_inline: puts of at most 64 bytes go inline (the NIC
 * takes the bytes with the work request, no second DMA read); the proof
 * is that the bytes are taken at posting: a source overwritten while the
 * emulated NIC holds the request (HCMOCK_IB_TX_DELAY_US) is not what lands.
 *
 * budget_long_wait_sleeps: a wait past HCOLL_IB_SPIN_US sleeps on the
 * CQs' completion channel: over waits of 40 ms it burns under 5% of a core
 * (getrusage), and takes its completion within a bound of a spinning
 * poller's pickup measured in the same run.
 *
 * budget_ring_offsets_aligned: every put of a ring all-reduce whose count
 * does not split evenly starts on a 64-byte boundary of its source and
 * target (the emulated NIC counts those that do not), so reductions and
 * copies get aligned vectors.
 *
 * budget_puts_chained: puts sent back to back leave in one chain of work
 * requests per QP (one ibv_post_send, one doorbell), on 1 and on 4 QPs per
 * peer (HCOLL_IB_QPS_PER_PEER); the emulated NIC counts the calls.
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
#include <sys/resource.h>
#include <unistd.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "common/seam.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"
#include "hcoll.h"

#if HCOLL_BUILD_VERBS

#define LAT_US   "10"  /* one-way: a round trip of 20 us plus the emulation's transit */
#define NPING    NITER
#define BLOCK    30    /* NITER is a multiple */
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

/* ①: the emulated wire, on a transport of the test's own beside hcoll's. */
typedef struct rt {
    hc_errbuf_t eb;
    hc_params_t settings;
    hc_transport_params_t tp;
    hc_transport_t *tr;
    hc_ep_t *ep;
    hc_mr_t *mr;
    hc_rkey_t rks[2];
    char buf[64];
    ag_ctx_t ag;
} rt_t;

static int rt_open(rt_t *t, budget_arg_t *a, int rank)
{
    t->ag = (ag_ctx_t){ a, rank };
    HCT_REQUIRE(hct_ib_params(rank, 2, &t->eb, &t->settings, &t->tp) == HCOLL_SUCCESS, "%s",
                t->eb.msg);
    HCT_REQUIRE(hc_ib_ops.create(&t->tp, &t->tr) == HCOLL_SUCCESS, "create: %s", t->eb.msg);
    int peer = 1 - rank;
    HCT_REQUIRE(hc_ib_ops.connect(t->tr, &peer, 1, shm_allgather, &t->ag, &t->ep) ==
                    HCOLL_SUCCESS,
                "connect: %s", t->eb.msg);
    hc_rkey_t rk;
    HCT_REQUIRE(hc_ib_ops.mr_reg(t->tr, t->buf, sizeof t->buf, &t->mr, &rk) == HCOLL_SUCCESS,
                "%s", t->eb.msg);
    HCT_REQUIRE(shm_allgather(&t->ag, &rk, t->rks, sizeof rk) == HCOLL_SUCCESS, "keys");
    return 0;
}

/* One ping-pong, microseconds as rank 0 sees it (-1: failed). */
static double rt_once(rt_t *t, int rank, int i)
{
    const double deadline = hct_now_ms() + 20000, t0 = hct_now_ms();
    if (rank == 1 && wait_imm(t->tr, deadline) != 0)
        return -1;
    if (hc_ib_ops.put(t->ep, t->mr, 0, &t->rks[1 - rank], 0, 8, (uint32_t)i, 0) != HCOLL_SUCCESS)
        return -1;
    if (rank == 0 && wait_imm(t->tr, deadline) != 0)
        return -1;
    return (hct_now_ms() - t0) * 1e3;
}

static int rt_close(rt_t *t)
{
    hc_rkey_t rk = { { 0, 0 } }, rks[2];
    /* Both sides' last puts have completed before the QPs go. */
    HCT_REQUIRE(shm_allgather(&t->ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "end");
    hc_ib_ops.mr_dereg(t->tr, t->mr);
    hc_ib_ops.destroy(t->tr, 1);
    return 0;
}

static int check_sum(const float *out, int rank, int n, int i)
{
    for (int k = 0; k < SMALL; k++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want += (float)(r + k + i);
        HCT_REQUIRE(out[k] == want, "rank %d: element %d is %g, not %g", rank, k, (double)out[k],
                    (double)want);
    }
    return 0;
}

/* One all-reduce of SMALL floats on comm, microseconds (-1: failed). */
static double ar_once(hcoll_comm_t comm, int rank, int n, int i)
{
    float in[SMALL], out[SMALL];
    for (int k = 0; k < SMALL; k++)
        in[k] = (float)(rank + k + i);
    double t0 = hct_now_ms();
    hcoll_status_t st = hcoll_allreduce(comm, in, out, SMALL, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    double us = (hct_now_ms() - t0) * 1e3;
    if (st != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: all-reduce %d: %s\n", rank, i, hcoll_comm_last_error(comm));
        return -1;
    }
    return check_sum(out, rank, n, i) ? -1 : us;
}

static int rank_budget(int rank, int n, void *argp)
{
    budget_arg_t *a = argp;
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    setenv("HCMOCK_IB_LAT_US", LAT_US, 1);
    rt_t rt;
    if (rt_open(&rt, a, rank))
        return 1;
    double t[NITER], u[NITER];
    /* How soon a spinning poller takes its completions here. */
    pickup_us(0.5, 1);
    for (int i = 0; i < NPING; i++)
        HCT_REQUIRE((t[i] = rt_once(&rt, rank, i)) >= 0, "ping %d: %s", i, rt.eb.msg);
    a->spin_pick_us[rank] = pickup_us(0.5, 1);
    /* ②: the call's own cost, no network. */
    hcoll_comm_t one, comm;
    hcoll_unique_id_t id1, id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    HCT_OK(NULL, hcoll_get_unique_id(&id1));
    HCT_OK(NULL, hcoll_comm_init(&one, 1, 0, &id1, &cfg));
    for (int i = 0; i < NITER; i++)
        HCT_REQUIRE((t[i] = ar_once(one, 0, 1, i)) >= 0, "one-rank all-reduce");
    a->local_us[rank] = median(t, NITER);
    HCT_OK(one, hcoll_comm_destroy(one));
    /* ③ */
    cfg.net = "ib";
    cfg.timeout_ms = 20000;
    /* The budget is the data path's: the argument agreement before each
     * call is one more small all-reduce, measured on its own (design.md). */
    setenv("HCOLL_CHECK_ARGS", "0", 1);
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(&comm, n, rank, &id, &cfg));
    for (int i = 0; i < 20; i++)
        HCT_REQUIRE(ar_once(comm, rank, n, i) >= 0, "warm-up");
    /* hcoll's pickup delays, with nothing else polling. */
    pickup_us(0.5, 1);
    for (int i = 0; i < NITER; i++)
        HCT_REQUIRE(ar_once(comm, rank, n, i) >= 0, "all-reduce %d", i);
    a->pick_us[rank] = pickup_us(0.5, 1);
    /* Round trips and all-reduces in blocks, in turn, so that both see the
     * same load; not one each in turn, where each would wait for the
     * other rank's end of the one before. */
    for (int i = 0; i < NITER; i += BLOCK) {
        for (int j = i; j < i + BLOCK; j++)
            HCT_REQUIRE((u[j] = rt_once(&rt, rank, j)) >= 0, "ping %d: %s", j, rt.eb.msg);
        for (int j = i; j < i + BLOCK; j++)
            HCT_REQUIRE((t[j] = ar_once(comm, rank, n, j)) >= 0, "all-reduce %d", j);
    }
    a->ar_us[rank] = median(t, NITER);
    if (rank == 0)
        a->rtt_us = median(u, NITER);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return rt_close(&rt);
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
    /* Twice the emulated round trip on top: a wait longer than
     * HCOLL_IB_SPIN_US sleeps in 20 us steps, by design. */
    const double pick_budget = 2 * spin + 4 * atoi(LAT_US);
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
                      "(2 x the emulated round trip): does its poll loop sleep?",
                      r, a->pick_us[r], pick_budget, spin, 4 * atoi(LAT_US));
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

/* ---- the staging pool registered once ------------------------------------- */

#define STG_COUNT (1u << 20) /* floats: 4 MiB, several staged pieces */
#define STG_CALLS 6

typedef struct stg_arg {
    hct_id_slot_t slot;
    char root[200];
    double us[2];            /* median call after the warm-up */
    unsigned long long regs[2]; /* registrations during those calls */
} stg_arg_t;

static int rank_staging(int rank, int n, void *argp)
{
    stg_arg_t *a = argp;
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    setenv("HCMOCK_CC", "8.0", 1);
    setenv("HCOLL_SYSFS_ROOT", a->root, 1);
    setenv("HCMOCK_IB_SYSFS", a->root, 1);
    setenv("HCOLL_NET_GDR_LEVEL", "LOC", 1); /* GPUDirect off: host staging */
    setenv("HCMOCK_IB_REG_PAGE_NS", "250", 1);
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "rank %d: no (mock) GPU 0", rank);
    hcoll_comm_t comm;
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.net = "ib";
    cfg.timeout_ms = 20000;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(&comm, n, rank, &id, &cfg));
    void *stream;
    HCT_REQUIRE(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING) == HC_CU_SUCCESS,
                "stream");
    const size_t bytes = STG_COUNT * sizeof(float);
    float *host = malloc(bytes);
    hc_cu_dptr_t d;
    HCT_REQUIRE(host && cu->mem_alloc(&d, bytes) == HC_CU_SUCCESS, "buffers");
    double t[STG_CALLS];
    uint64_t regs0 = 0;
    for (int i = 0; i < 2 + STG_CALLS; i++) {
        if (i == 2)
            regs0 = mock_stat("mr_registrations");
        for (size_t k = 0; k < STG_COUNT; k++)
            host[k] = (float)((k + (size_t)rank + (size_t)i) % 64);
        HCT_REQUIRE(cu->memcpy_htod_async(d, host, bytes, stream) == HC_CU_SUCCESS, "h2d");
        HCT_REQUIRE(cu->stream_synchronize(stream) == HC_CU_SUCCESS, "sync");
        double t0 = hct_now_ms();
        HCT_OK(comm, hcoll_allreduce(comm, (void *)(uintptr_t)d, (void *)(uintptr_t)d, STG_COUNT,
                                     HCOLL_FLOAT32, HCOLL_SUM, stream));
        HCT_REQUIRE(cu->stream_synchronize(stream) == HC_CU_SUCCESS, "sync");
        if (i >= 2)
            t[i - 2] = (hct_now_ms() - t0) * 1e3;
        HCT_REQUIRE(cu->memcpy_dtoh_async(host, d, bytes, stream) == HC_CU_SUCCESS, "d2h");
        HCT_REQUIRE(cu->stream_synchronize(stream) == HC_CU_SUCCESS, "sync");
        for (size_t k = 0; k < STG_COUNT; k += 4099) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += (float)((k + (size_t)r + (size_t)i) % 64);
            HCT_REQUIRE(host[k] == want, "rank %d call %d: element %zu is %g, not %g", rank, i,
                        k, (double)host[k], (double)want);
        }
    }
    a->regs[rank] = (unsigned long long)(mock_stat("mr_registrations") - regs0);
    a->us[rank] = median(t, STG_CALLS);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    cu->mem_free(d);
    cu->stream_destroy(stream);
    free(host);
    return 0;
}

START_TEST(budget_staging_registered_once)
{
    char cuda[PATH_MAX];
    if (!hct_mock_cuda_built(cuda, sizeof cuda)) {
        printf("SKIP: budget_staging_registered_once: %s not built\n", cuda);
        return;
    }
    stg_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    char root[PATH_MAX];
    ck_assert_ptr_nonnull(realpath("tests/fixtures/sysfs-mockib", root));
    ck_assert_uint_lt(strlen(root), sizeof a->root);
    snprintf(a->root, sizeof a->root, "%.199s", root);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_staging, a, res), 0);
    for (int r = 0; r < 2; r++) {
        fprintf(stderr, "rank %d: staged device all-reduce of %zu bytes: %.0f us median, %llu "
                "registration(s) in %d calls after the first two\n", r,
                (size_t)STG_COUNT * sizeof(float), a->us[r], a->regs[r], STG_CALLS);
        ck_assert_msg(a->regs[r] == 0, "rank %d: %llu registrations in %d staged calls after "
                      "the first two: the staging pool is registered per piece", r, a->regs[r],
                      STG_CALLS);
    }
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ---- inline puts ------------------------------------------------------------ */

static int rank_inline(int rank, int n, void *argp)
{
    (void)n;
    budget_arg_t *a = argp;
    setenv("HCMOCK_IB_TX_DELAY_US", "2000", 1);
    rt_t rt;
    if (rt_open(&rt, a, rank))
        return 1;
    hcoll_status_t st;
    static const size_t lens[] = { 1, 8, 64 };
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        if (rank == 0) {
            memset(rt.buf, 'A' + (int)i, sizeof rt.buf);
            HCT_REQUIRE(hc_ib_ops.put(rt.ep, rt.mr, 0, &rt.rks[1], 0, lens[i], (uint32_t)i, 0) ==
                            HCOLL_SUCCESS,
                        "put: %s", rt.eb.msg);
            memset(rt.buf, 'z', sizeof rt.buf); /* before the NIC got to it */
            int got = hct_wait_comps(&hc_ib_ops, rt.tr, HC_COMP_PUT, 1, NULL, 10000, &st);
            HCT_REQUIRE(st == HCOLL_SUCCESS && got == 1, "put completion: %s", rt.eb.msg);
        } else {
            int got = hct_wait_comps(&hc_ib_ops, rt.tr, HC_COMP_IMM, 1, NULL, 10000, &st);
            HCT_REQUIRE(st == HCOLL_SUCCESS && got == 1, "immediate: %s", rt.eb.msg);
            for (size_t k = 0; k < lens[i]; k++)
                HCT_REQUIRE(rt.buf[k] == 'A' + (int)i,
                            "a %zu-byte put: byte %zu is '%c', written after posting: the put "
                            "was not inline", lens[i], k, rt.buf[k]);
        }
        /* The next put only once this one was looked at: on a loaded host
         * a late poll would otherwise find two. */
        hc_rkey_t rk = { { 0, 0 } }, rks[2];
        HCT_REQUIRE(shm_allgather(&rt.ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
    }
    return rt_close(&rt);
}

START_TEST(budget_small_puts_inline)
{
    budget_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_inline, a, res), 0);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ---- long waits on a completion channel -------------------------------------- */

#define LONG_WAITS 8
#define LONG_MS    40 /* how long rank 1 waits for each put */

typedef struct long_arg {
    budget_arg_t b;
    double spin_pick_us;  /* rank 1: a spinning poller's pickup, median */
    double long_pick_us;  /* rank 1: the long waits' pickup, median */
    double cpu_frac;      /* rank 1: CPU time / wall time over the long waits */
} long_arg_t;

static double thread_cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* rank 1 waits in the transport's poll (wait_ms past the spin) while rank
 * 0 lets LONG_MS pass before its put. */
static int long_waits(rt_t *t, long_arg_t *a, int rank)
{
    hc_rkey_t rk = { { 0, 0 } }, rks[2];
    double cpu = 0, wall = 0;
    pickup_us(0.5, 1);
    for (int i = 0; i < LONG_WAITS; i++) {
        HCT_REQUIRE(shm_allgather(&t->ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
        if (rank == 0) {
            usleep(LONG_MS * 1000);
            HCT_REQUIRE(hc_ib_ops.put(t->ep, t->mr, 0, &t->rks[1], 0, 8, (uint32_t)i, 0) ==
                            HCOLL_SUCCESS,
                        "put: %s", t->eb.msg);
            hcoll_status_t st;
            HCT_REQUIRE(hct_wait_comps(&hc_ib_ops, t->tr, HC_COMP_PUT, 1, NULL, 10000, &st) == 1,
                        "put completion: %s", t->eb.msg);
            continue;
        }
        const double c0 = thread_cpu_ms(), w0 = hct_now_ms();
        int got = 0;
        while (!got && hct_now_ms() - w0 < 10000) {
            hc_comp_t comps[16];
            int n = 0;
            HCT_REQUIRE(hc_ib_ops.poll(t->tr, comps, 16, 5000, &n) == HCOLL_SUCCESS, "poll: %s",
                        t->eb.msg);
            for (int k = 0; k < n; k++)
                got |= comps[k].kind == HC_COMP_IMM;
        }
        HCT_REQUIRE(got, "no immediate in 10 s");
        cpu += thread_cpu_ms() - c0;
        wall += hct_now_ms() - w0;
    }
    if (rank == 1) {
        a->long_pick_us = pickup_us(0.5, 1);
        a->cpu_frac = cpu / wall;
    }
    return 0;
}

static int rank_long(int rank, int n, void *argp)
{
    (void)n;
    long_arg_t *a = argp;
    setenv("HCOLL_IB_SPIN_US", "50", 1);
    rt_t rt;
    if (rt_open(&rt, &a->b, rank))
        return 1;
    /* A spinning poller's pickup on this host now. */
    pickup_us(0.5, 1);
    for (int i = 0; i < 100; i++)
        HCT_REQUIRE(rt_once(&rt, rank, i) >= 0, "ping %d: %s", i, rt.eb.msg);
    if (rank == 1)
        a->spin_pick_us = pickup_us(0.5, 1);
    if (long_waits(&rt, a, rank))
        return 1;
    return rt_close(&rt);
}

START_TEST(budget_long_wait_sleeps)
{
    long_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_long, a, res), 0);
    printf("long waits (%d ms): pickup %.1f us (median; spinning %.1f us), CPU %.1f%% of the "
           "wait\n", LONG_MS, a->long_pick_us, a->spin_pick_us, a->cpu_frac * 100);
    /* Asleep on the channel's fd, not sweeping every 20 us. */
    ck_assert_msg(a->cpu_frac < 0.05, "a long wait burnt %.1f%% of a core",
                  a->cpu_frac * 100);
    /* Woken by the completion itself, not by a timer. */
    ck_assert_msg(a->long_pick_us <= 4 * a->spin_pick_us + 2000,
                  "a sleeping wait took its completion %.1f us after it arrived (spinning: "
                  "%.1f us)", a->long_pick_us, a->spin_pick_us);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ---- aligned ring offsets ------------------------------------------------------ */

#define ALN_COUNT 300007 /* floats: blocks of 150004 and 150003 when cut by elements */

typedef struct aln_arg {
    budget_arg_t b;
    unsigned long long misaligned[2];
} aln_arg_t;

static int rank_aligned(int rank, int n, void *argp)
{
    aln_arg_t *a = argp;
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    hcoll_comm_t comm;
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.net = "ib";
    cfg.timeout_ms = 20000;
    HCT_REQUIRE(hct_share_unique_id(&a->b.slot, rank, 20000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(&comm, n, rank, &id, &cfg));
    const size_t bytes = ((size_t)ALN_COUNT * 4 + 63) & ~(size_t)63;
    float *in = aligned_alloc(64, bytes), *out = aligned_alloc(64, bytes);
    HCT_REQUIRE(in && out, "no memory");
    for (size_t i = 0; i < ALN_COUNT; i++)
        in[i] = (float)((i + (size_t)rank) % 7);
    const uint64_t before = mock_stat("misaligned_writes");
    HCT_OK(comm, hcoll_allreduce(comm, in, out, ALN_COUNT, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    a->misaligned[rank] = (unsigned long long)(mock_stat("misaligned_writes") - before);
    for (size_t i = 0; i < ALN_COUNT; i++)
        HCT_REQUIRE(out[i] == (float)(i % 7 + (i + 1) % 7), "element %zu is %g", i,
                    (double)out[i]);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    free(in);
    free(out);
    return 0;
}

START_TEST(budget_ring_offsets_aligned)
{
    aln_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_aligned, a, res), 0);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(a->misaligned[r] == 0,
                      "rank %d: %llu puts of an all-reduce of %d floats started off a 64-byte "
                      "boundary", r, a->misaligned[r], ALN_COUNT);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ---- chained doorbells ------------------------------------------------------ */

#define CHAIN_PUTS 16 /* 4 KiB each: none inline */

typedef struct chain_arg {
    budget_arg_t b;
    unsigned long long calls[2]; /* rank 0's ibv_post_send calls for CHAIN_PUTS puts: 1, 4 QPs */
} chain_arg_t;

/* rank 0 puts CHAIN_PUTS chunks back to back, as the ring's send loop
 * does, then polls; the emulated NIC counts the ibv_post_send calls. */
static int chain_round(rt_t *t, hc_mr_t *mr, const hc_rkey_t *rk, int rank,
                       unsigned long long *calls_out)
{
    hcoll_status_t st;
    if (rank == 0) {
        const uint64_t before = mock_stat("post_send_calls");
        for (int k = 0; k < CHAIN_PUTS; k++)
            HCT_REQUIRE(hc_ib_ops.put(t->ep, mr, (size_t)k * 4096, rk, (size_t)k * 4096, 4096,
                                      (uint32_t)k, 0) == HCOLL_SUCCESS,
                        "put: %s", t->eb.msg);
        int got = hct_wait_comps(&hc_ib_ops, t->tr, HC_COMP_PUT, CHAIN_PUTS, NULL, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == CHAIN_PUTS, "puts %d/%d: %s", got, CHAIN_PUTS,
                    t->eb.msg);
        *calls_out = (unsigned long long)(mock_stat("post_send_calls") - before);
    } else {
        int got = hct_wait_comps(&hc_ib_ops, t->tr, HC_COMP_IMM, CHAIN_PUTS, NULL, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == CHAIN_PUTS, "immediates %d/%d: %s", got,
                    CHAIN_PUTS, t->eb.msg);
    }
    return 0;
}

static int rank_chain(int rank, int n, void *argp)
{
    (void)n;
    chain_arg_t *a = argp;
    for (int v = 0; v < 2; v++) {
        setenv("HCOLL_IB_QPS_PER_PEER", v ? "4" : "1", 1);
        rt_t rt;
        if (rt_open(&rt, &a->b, rank))
            return 1;
        char *big = calloc(CHAIN_PUTS, 4096);
        hc_mr_t *mr;
        hc_rkey_t rk, rks[2];
        HCT_REQUIRE(big && hc_ib_ops.mr_reg(rt.tr, big, CHAIN_PUTS * 4096, &mr, &rk) ==
                               HCOLL_SUCCESS,
                    "%s", rt.eb.msg);
        HCT_REQUIRE(shm_allgather(&rt.ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "keys");
        if (chain_round(&rt, mr, &rks[1], rank, &a->calls[v]))
            return 1;
        hc_ib_ops.mr_dereg(rt.tr, mr);
        if (rt_close(&rt))
            return 1;
        free(big);
    }
    return 0;
}

START_TEST(budget_puts_chained)
{
    chain_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_chain, a, res), 0);
    printf("%d puts: %llu ibv_post_send calls on 1 QP, %llu on 4 QPs\n", CHAIN_PUTS,
           a->calls[0], a->calls[1]);
    /* One doorbell per QP for the lot (a sweep may split it once). */
    ck_assert_msg(a->calls[0] <= 2, "%d puts took %llu ibv_post_send calls on one QP, not a "
                  "chain", CHAIN_PUTS, a->calls[0]);
    ck_assert_msg(a->calls[1] <= 8, "%d puts took %llu ibv_post_send calls on 4 QPs, not a "
                  "chain per QP", CHAIN_PUTS, a->calls[1]);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* ---- host all-reduces of unregistered buffers register nothing per call -- */

#define UNREG_CALLS 100
#define UNREG_COUNT (256 * 1024 + 7) /* int32, about 1 MiB: three stages on 2x2 */

typedef struct unreg_arg {
    hct_id_slot_t slot;
    uint64_t regs[6]; /* per rank, over the UNREG_CALLS calls */
} unreg_arg_t;

/* UNREG_CALLS all-reduces of a malloc'ed buffer nobody registered (a
 * fresh one each call, freed after it, so an address may come back),
 * after one call of warm-up: hcoll_rdma_counters' registrations must not
 * grow with the calls, and every result must be exact. */
static int rank_unreg(int rank, int n, void *argp)
{
    unreg_arg_t *a = argp;
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    setenv("HCMOCK_IB_REG_PAGE_NS", "250", 1); /* a registration costs per page */
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.net = "ib";
    cfg.timeout_ms = 20000;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, n, rank, &id, &cfg));
    hcoll_rdma_counters_t c0 = HCOLL_RDMA_COUNTERS_INITIALIZER, c1 = c0;
    for (int it = 0; it <= UNREG_CALLS; it++) {
        if (it == 1)
            HCT_OK(comm, hcoll_rdma_counters(&c0));
        int32_t *in = malloc(UNREG_COUNT * sizeof *in), *out = malloc(UNREG_COUNT * sizeof *out);
        HCT_REQUIRE(in && out, "no memory");
        for (size_t i = 0; i < UNREG_COUNT; i++)
            in[i] = (int32_t)(rank * 31 + (int)(i % 977) + it);
        HCT_OK(comm, hcoll_allreduce(comm, in, out, UNREG_COUNT, HCOLL_INT32, HCOLL_SUM, NULL));
        for (size_t i = 0; i < UNREG_COUNT; i++) {
            int32_t want = 0;
            for (int r = 0; r < n; r++)
                want += (int32_t)(r * 31 + (int)(i % 977) + it);
            HCT_REQUIRE(out[i] == want, "rank %d: call %d: [%zu] = %d, want %d", rank, it, i,
                        out[i], want);
        }
        free(in);
        free(out);
    }
    HCT_OK(comm, hcoll_rdma_counters(&c1));
    a->regs[rank] = c1.registrations - c0.registrations;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static void run_unreg(int nranks, int per_node)
{
    unreg_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = per_node, .timeout_ms = 80000 };
    hct_result_t res[6];
    int bad = hct_run(&o, rank_unreg, a, res);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
    for (int r = 0; r < nranks; r++) {
        fprintf(stderr, "%dx%d rank %d: %llu registration(s) over %d all-reduces of %zu bytes\n",
                nranks / per_node, per_node, r, (unsigned long long)a->regs[r], UNREG_CALLS,
                UNREG_COUNT * sizeof(int32_t));
        ck_assert_msg(a->regs[r] <= 2,
                      "rank %d: %llu registrations over %d all-reduces of an unregistered host "
                      "buffer: they grow with the calls",
                      r, (unsigned long long)a->regs[r], UNREG_CALLS);
    }
    hct_shared_free(a, sizeof *a);
}

START_TEST(budget_host_unregistered_2x2)
{
    run_unreg(4, 2);
}
END_TEST

START_TEST(budget_host_unregistered_3x1)
{
    run_unreg(3, 1);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ib_budget");
    TCase *t = tcase_create("budget");
    tcase_set_timeout(t, 90);
    tcase_add_test(t, budget_small_allreduce);
    tcase_add_test(t, budget_no_flush_for_host);
    tcase_add_test(t, budget_staging_registered_once);
    tcase_add_test(t, budget_small_puts_inline);
    tcase_add_test(t, budget_puts_chained);
    tcase_add_test(t, budget_long_wait_sleeps);
    tcase_add_test(t, budget_ring_offsets_aligned);
    tcase_add_test(t, budget_host_unregistered_2x2);
    tcase_add_test(t, budget_host_unregistered_3x1);
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
