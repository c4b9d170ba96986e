/*
 * The device all-reduce when streams share hardware queues
 * (CUDA_DEVICE_MAX_CONNECTIONS, which Megatron-LM sets to 1): a queue runs
 * the work of all its streams in submission order, so a caller's stream
 * that waits for something hcoll submits later on another stream of the
 * same queue waits forever. The emulated driver models the queues
 * (tests/mock/cuda.c, "Hardware queues"); a real driver behaves the same.
 *
 *   - one queue for everything, 2 emulated nodes x 1 rank (the host-staged
 *     ring, several staging pieces) and x 2 ranks (NCCL reduce-scatter and
 *     all-gather around it, several segments of several pieces);
 *   - 4 queues and 8 application streams, the calls spread over all of
 *     them (two calls in flight on two streams before the host waits), so
 *     that some share a queue with hcoll's own streams whichever they are;
 *   - then a reduce-scatter and an all-gather (several staging pieces) on
 *     the last stream, which take the same gated path;
 *   - and broadcasts from every root (in place and not, one element and
 *     several staging pieces), also gated at call time: with 2 ranks per
 *     node the root's node runs NCCL's broadcast before the ring and the
 *     others NCCL's all-gather after it;
 *   - destroy behind an application's blocked stream returns at once;
 *   - the gate word where pinned memory's device address is not its host
 *     address (HCMOCK_PINNED_DEVPTR=1);
 *   - every result checked; each case under a short watchdog (a hang is a
 *     failure within seconds, not the suite's timeout).
 * Needs a GPU (or the emulation); prints "SKIP: no GPU: <why>" otherwise.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ranks.h"
#include "gpu/gpuhelp.h"

#define WATCHDOG_MS 40000
#define NSTREAMS 8
static int ngpus;

typedef struct shared {
    hct_id_slot_t id;
} shared_t;

typedef struct job {
    shared_t *sh;
    int rpn;     /* ranks per node */
    int conns;   /* CUDA_DEVICE_MAX_CONNECTIONS; 0: the destroy case (one queue) */
    int streams; /* application streams the calls rotate over */
    int pin_alias; /* HCMOCK_PINNED_DEVPTR: pinned memory's device address differs */
} job_t;

static hcoll_comm_t rank_init(job_t *j, int rank, int nranks)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    setenv("HCOLL_NET", "tcp", 1);
    if (hct_share_unique_id(&j->sh->id, rank, 20000, &id) != 0)
        return NULL;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 15000;
    cfg.chunk_bytes = 64 << 10; /* 1 MiB staging buffers: several pieces per call */
    if (hcoll_comm_init(&comm, nranks, rank, &id, &cfg) != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: init: %s\n", rank, hcoll_comm_last_error(NULL));
        return NULL;
    }
    return comm;
}

/* Exact in float32 whatever the order: small integers. */
static float input(int r, size_t i, int call)
{
    return (float)((i * 7 + (size_t)r * 13 + (size_t)call) % 23) - 11.0f;
}

typedef struct call {
    void *stream;
    hc_cu_dptr_t buf;
    float *host;
    size_t n;
} call_t;

static int call_start(hcoll_comm_t comm, const hc_cu_api_t *cu, call_t *c, int rank, int k)
{
    for (size_t i = 0; i < c->n; i++)
        c->host[i] = input(rank, i, k);
    GPU_OK(cu->memcpy_htod_async(c->buf, c->host, c->n * 4, c->stream));
    HCT_OK(comm, hcoll_allreduce(comm, (void *)(uintptr_t)c->buf, (void *)(uintptr_t)c->buf,
                                 c->n, HCOLL_FLOAT32, HCOLL_SUM, c->stream));
    GPU_OK(cu->memcpy_dtoh_async(c->host, c->buf, c->n * 4, c->stream));
    return 0;
}

static int call_check(const hc_cu_api_t *cu, call_t *c, int rank, int nranks, int k)
{
    GPU_OK(cu->stream_synchronize(c->stream));
    for (size_t i = 0; i < c->n; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++)
            want += input(r, i, k);
        HCT_REQUIRE(c->host[i] == want, "rank %d: call %d (n=%zu): element %zu is %g, want %g",
                    rank, k, c->n, i, c->host[i], want);
    }
    return 0;
}

/* Reduce-scatter then all-gather of B floats per rank on stream. */
static int rsag_check(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                      int nranks)
{
    const size_t B = 300007, all = B * (size_t)nranks;
    float *h = malloc(all * 4);
    HCT_REQUIRE(h, "no memory");
    hc_cu_dptr_t big, blk;
    GPU_OK(cu->mem_alloc(&big, all * 4));
    GPU_OK(cu->mem_alloc(&blk, B * 4));
    for (size_t i = 0; i < all; i++)
        h[i] = input(rank, i, 7);
    GPU_OK(cu->memcpy_htod_async(big, h, all * 4, stream));
    HCT_OK(comm, hcoll_reduce_scatter(comm, (void *)(uintptr_t)big, (void *)(uintptr_t)blk, B,
                                      HCOLL_FLOAT32, HCOLL_SUM, stream));
    GPU_OK(cu->memcpy_dtoh_async(h, blk, B * 4, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < B; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++)
            want += input(r, (size_t)rank * B + i, 7);
        HCT_REQUIRE(h[i] == want, "rank %d: reduce_scatter: element %zu is %g, want %g", rank,
                    i, h[i], want);
    }
    for (size_t i = 0; i < B; i++)
        h[i] = input(rank, i, 9);
    GPU_OK(cu->memcpy_htod_async(blk, h, B * 4, stream));
    HCT_OK(comm, hcoll_allgather(comm, (void *)(uintptr_t)blk, (void *)(uintptr_t)big, B,
                                 HCOLL_FLOAT32, stream));
    GPU_OK(cu->memcpy_dtoh_async(h, big, all * 4, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < all; i++)
        HCT_REQUIRE(h[i] == input((int)(i / B), i % B, 9),
                    "rank %d: allgather: element %zu is %g", rank, i, h[i]);
    cu->mem_free(big);
    cu->mem_free(blk);
    free(h);
    return 0;
}

/* Broadcasts from every root on stream: bytes that say where they came
 * from, bit for bit; out of place on the root for the odd sizes. */
static int bcast_check(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                       int nranks)
{
    static const size_t counts[] = { 1, 1000003, 7 };
    const size_t nmax = counts[1];
    unsigned char *h = malloc(nmax * 4);
    HCT_REQUIRE(h, "no memory");
    hc_cu_dptr_t src, dst;
    GPU_OK(cu->mem_alloc(&src, nmax * 4));
    GPU_OK(cu->mem_alloc(&dst, nmax * 4));
    for (int root = 0; root < nranks; root++)
        for (size_t k = 0; k < 3; k++) {
            const size_t n = counts[k], bytes = n * 4;
            const int inplace = k != 2;
            for (size_t i = 0; i < bytes; i++)
                h[i] = rank == root ? (unsigned char)(i * 31 + (size_t)root * 7 + k) : 0xee;
            GPU_OK(cu->memcpy_htod_async(inplace ? dst : src, h, bytes, stream));
            HCT_OK(comm, hcoll_broadcast(comm, (void *)(uintptr_t)(inplace ? dst : src),
                                         (void *)(uintptr_t)dst, n, HCOLL_FLOAT32, root, stream));
            GPU_OK(cu->memcpy_dtoh_async(h, dst, bytes, stream));
            GPU_OK(cu->stream_synchronize(stream));
            for (size_t i = 0; i < bytes; i++)
                HCT_REQUIRE(h[i] == (unsigned char)(i * 31 + (size_t)root * 7 + k),
                            "rank %d: broadcast of %zu floats from %d: byte %zu is 0x%02x", rank,
                            n, root, i, h[i]);
        }
    cu->mem_free(src);
    cu->mem_free(dst);
    free(h);
    return 0;
}

static hc_cu_dptr_t host_dptr(const hc_cu_api_t *cu, void *p);

static int rank_queues(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    char v[16];
    snprintf(v, sizeof v, "%d", j->conns);
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", v, 1); /* read at cuInit, as the driver does */
    if (j->pin_alias) /* the emulation only: a driver decides this itself */
        setenv("HCMOCK_PINNED_DEVPTR", "1", 1);
    const hc_cu_api_t *cu = gpu_open(ngpus > 1 ? (rank % j->rpn) % ngpus : 0);
    HCT_REQUIRE(cu, "no GPU");
    /* The application's streams first, so that hcoll's come after them in
     * the round-robin. */
    void *st[NSTREAMS];
    for (int s = 0; s < j->streams; s++)
        GPU_OK(cu->stream_create(&st[s], HC_CU_STREAM_NON_BLOCKING));
    if (j->pin_alias) { /* the knob took */
        void *p;
        GPU_OK(cu->host_alloc(&p, 64, 0));
        HCT_REQUIRE(host_dptr(cu, p) != (hc_cu_dptr_t)(uintptr_t)p,
                    "HCMOCK_PINNED_DEVPTR=1 but pinned memory's device address is its host one");
        cu->host_free(p);
    }
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    static const size_t sizes[] = { 3000017, 1001, 700001 };
    const size_t nmax = sizes[0];
    call_t c[2];
    for (int i = 0; i < 2; i++) {
        c[i].host = malloc(nmax * 4);
        HCT_REQUIRE(c[i].host, "no memory");
        GPU_OK(cu->mem_alloc(&c[i].buf, nmax * 4));
    }
    /* Two calls in flight at a time, on two streams, over every stream. */
    int k = 0;
    for (int s = 0; s < j->streams || k < 4; s += 2) {
        for (int i = 0; i < 2; i++) {
            c[i].stream = st[(s + i) % j->streams];
            c[i].n = sizes[(k + i) % 3];
            if (call_start(comm, cu, &c[i], rank, k + i) != 0)
                return 1;
        }
        for (int i = 0; i < 2; i++)
            if (call_check(cu, &c[i], rank, nranks, k + i) != 0)
                return 1;
        k += 2;
    }
    if (rsag_check(comm, cu, st[j->streams - 1], rank, nranks) != 0 ||
        bcast_check(comm, cu, st[j->streams - 1], rank, nranks) != 0)
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    for (int i = 0; i < 2; i++) {
        cu->mem_free(c[i].buf);
        free(c[i].host);
    }
    for (int s = 0; s < j->streams; s++)
        cu->stream_destroy(st[s]);
    return 0;
}

/* The device address of pinned host memory. */
static hc_cu_dptr_t host_dptr(const hc_cu_api_t *cu, void *p)
{
    hc_cu_dptr_t d = 0;
    return cu->host_get_device_pointer(&d, p, 0) == HC_CU_SUCCESS ? d : (hc_cu_dptr_t)(uintptr_t)p;
}

/* Destroy while the application's stream is blocked (one queue, on a
 * host word the test writes only after destroy returned): nothing destroy
 * waits for may be recorded then, or it sits behind that stream, and
 * destroy would wait out its drain deadlines (2 s each) and leak. */
static int rank_destroy_blocked(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
    const hc_cu_api_t *cu = gpu_open(ngpus > 1 ? (rank % j->rpn) % ngpus : 0);
    HCT_REQUIRE(cu, "no GPU");
    void *st;
    GPU_OK(cu->stream_create(&st, HC_CU_STREAM_NON_BLOCKING));
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    call_t c = { st, 0, malloc(300007 * 4), 300007 };
    HCT_REQUIRE(c.host, "no memory");
    GPU_OK(cu->mem_alloc(&c.buf, c.n * 4));
    if (call_start(comm, cu, &c, rank, 0) != 0 || call_check(cu, &c, rank, nranks, 0) != 0)
        return 1;
    uint32_t *word;
    GPU_OK(cu->host_alloc((void **)&word, 4096, 0));
    *(volatile uint32_t *)word = 0;
    GPU_OK(cu->stream_wait_value32(st, host_dptr(cu, word), 1, 0 /* GEQ */));
    const double t0 = hct_now_ms();
    HCT_OK(comm, hcoll_comm_destroy(comm));
    const double ms = hct_now_ms() - t0;
    __atomic_store_n(word, 1, __ATOMIC_RELEASE);
    GPU_OK(cu->stream_synchronize(st));
    HCT_REQUIRE(ms < 1000, "rank %d: destroy took %.0f ms behind a blocked stream", rank, ms);
    cu->host_free(word);
    cu->mem_free(c.buf);
    free(c.host);
    cu->stream_destroy(st);
    return 0;
}

static void run_pin(int nranks, int rpn, int conns, int streams, int pin_alias)
{
    shared_t *sh = hct_shared_alloc(sizeof *sh);
    job_t j = { sh, rpn, conns, streams, pin_alias };
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = rpn, .timeout_ms = WATCHDOG_MS };
    hct_result_t res[8];
    int bad = hct_run(&o, conns ? rank_queues : rank_destroy_blocked, &j, res);
    hct_shared_free(sh, sizeof *sh);
    ck_assert_msg(bad == 0,
                  "%d of %d ranks failed or hung (CUDA_DEVICE_MAX_CONNECTIONS=%d, %d streams; "
                  "see stderr)",
                  bad, nranks, conns, streams);
}

static void run(int nranks, int rpn, int conns, int streams)
{
    run_pin(nranks, rpn, conns, streams, 0);
}

static int need_2x2(void)
{
    if (ngpus >= 2)
        return 1;
    printf("SKIP: 2x2 needs 2 GPUs (ranks of one node sharing a GPU cannot form an NCCL "
           "communicator); this machine has %d\n", ngpus);
    return 0;
}

START_TEST(one_queue_ring_2x1) { run(2, 1, 1, 1); }
END_TEST
START_TEST(one_queue_3stage_2x2)
{
    if (need_2x2())
        run(4, 2, 1, 1);
}
END_TEST
START_TEST(one_queue_destroy_blocked_2x1) { run(2, 1, 0, 1); }
END_TEST
/* The gate word at the device address the driver gives for it, where that
 * is not its host address (the emulation's HCMOCK_PINNED_DEVPTR=1). */
START_TEST(one_queue_pinned_devptr_2x1) { run_pin(2, 1, 1, 1, 1); }
END_TEST
START_TEST(four_queues_8_streams_2x1) { run(2, 1, 4, NSTREAMS); }
END_TEST
START_TEST(four_queues_8_streams_2x2)
{
    if (need_2x2())
        run(4, 2, 4, NSTREAMS);
}
END_TEST

int main(void)
{
    char why[256];
    ngpus = gpu_probe(why, sizeof why);
    if (ngpus < 1)
        HCT_SKIP_ALL("no GPU: %s", why);
    Suite *s = suite_create("gpu_queues");
    TCase *tc = tcase_create("queues");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, one_queue_ring_2x1);
    tcase_add_test(tc, one_queue_3stage_2x2);
    tcase_add_test(tc, one_queue_destroy_blocked_2x1);
    tcase_add_test(tc, one_queue_pinned_devptr_2x1);
    tcase_add_test(tc, four_queues_8_streams_2x1);
    tcase_add_test(tc, four_queues_8_streams_2x2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
