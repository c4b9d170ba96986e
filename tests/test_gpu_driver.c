/*
 * Where real CUDA drivers differ from a naive reading of the API, each
 * through the public device all-reduce with forked ranks over TCP (one per
 * emulated node, GPU 0):
 *   - capture_other_thread: an application thread captures a CUDA graph
 *     in global mode while another thread makes the communicator's first
 *     device call (its set-up allocates, loads the kernels, synchronises
 *     and polls events): the call works and the capture stays valid,
 *     because hcoll makes those calls in relaxed capture mode;
 *   - no_memory_pools: a GPU without memory pools (cuMemFreeAsync fails):
 *     three communicators one after the other, each with all-reduces and
 *     growing reduce-scatters, lose no device memory (hcoll keeps its own
 *     for reuse instead of leaking it or freeing it with cuMemFree);
 *   - stream_handles: CU_STREAM_PER_THREAD (0x2) is each thread's own
 *     stream (the emulation is checked), and refused by hcoll with a
 *     message that says what to pass; NULL and CU_STREAM_LEGACY (0x1) with
 *     device buffers are the legacy stream, ordered after the
 *     application's blocking streams;
 * Needs a GPU (or the emulated driver); prints "SKIP: no GPU: <why>" and
 * exits 77 otherwise.
 */
#include <check.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"
#include "gdr/gdr.h"
#include "gpu/gpuhelp.h"

#define TIMEOUT_MS 60000

/* One id slot per communicator a test makes, in order. */
typedef struct shared {
    hct_id_slot_t id[4];
} shared_t;

static hcoll_comm_t rank_init(shared_t *sh, int k, int rank, int nranks)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    setenv("HCOLL_NET", "tcp", 1);
    if (hct_share_unique_id(&sh->id[k], rank, 20000, &id) != 0)
        return NULL;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 30000;
    if (hcoll_comm_init(&comm, nranks, rank, &id, &cfg) != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: init: %s\n", rank, hcoll_comm_last_error(NULL));
        return NULL;
    }
    return comm;
}

/* 64 floats of value v on the device, all-reduced (SUM) on stream, and
 * checked against v * nranks after the stream is synchronised. */
static int sum_check(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, hc_cu_dptr_t d,
                     int nranks, float v)
{
    float h[64];
    for (int i = 0; i < 64; i++)
        h[i] = v;
    GPU_OK(cu->memcpy_htod_async(d, h, sizeof h, stream));
    void *dp = (void *)(uintptr_t)d;
    HCT_OK(comm, hcoll_allreduce(comm, dp, dp, 64, HCOLL_FLOAT32, HCOLL_SUM, stream));
    GPU_OK(cu->memcpy_dtoh_async(h, d, sizeof h, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (int i = 0; i < 64; i++)
        HCT_REQUIRE(h[i] == v * (float)nranks, "element %d = %g, want %g", i, h[i],
                    v * (float)nranks);
    return 0;
}

/* ---- Graph capture on another thread ------------------------------------- */

typedef int (*begin_capture_fn)(void *, int);
typedef int (*end_capture_fn)(void *, void **);
typedef int (*graph_destroy_fn)(void *);

typedef struct capturer {
    const hc_cu_api_t *cu;
    void *ctx;
    begin_capture_fn begin;
    end_capture_fn end;
    graph_destroy_fn graph_destroy;
    hc_cu_dptr_t a, b;
    atomic_int capturing, done;
    int begin_rc, end_rc, graph;
} capturer_t;

/* The application's thread: a global-mode capture (PyTorch's default) of
 * a copy, held open until the other thread's device calls are over. */
static void *capture_main(void *arg)
{
    capturer_t *c = arg;
    void *s = NULL, *graph = NULL;
    c->begin_rc = c->cu->ctx_set_current(c->ctx);
    if (c->begin_rc == HC_CU_SUCCESS)
        c->begin_rc = c->cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING);
    if (c->begin_rc == HC_CU_SUCCESS)
        c->begin_rc = c->begin(s, 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */);
    if (c->begin_rc == HC_CU_SUCCESS)
        c->begin_rc = c->cu->memcpy_dtod_async(c->b, c->a, 256, s);
    atomic_store(&c->capturing, 1);
    if (c->begin_rc != HC_CU_SUCCESS)
        return NULL;
    for (int i = 0; i < 60000 && !atomic_load(&c->done); i++)
        usleep(1000);
    c->end_rc = c->end(s, &graph);
    c->graph = graph != NULL;
    if (graph && c->graph_destroy)
        c->graph_destroy(graph);
    c->cu->stream_destroy(s);
    return NULL;
}

static int rank_capture_other_thread(int rank, int nranks, void *arg)
{
    shared_t *sh = arg;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    static capturer_t c;
    c.cu = cu;
    c.begin = lib ? (begin_capture_fn)dlsym(lib, "cuStreamBeginCapture_v2") : NULL;
    c.end = lib ? (end_capture_fn)dlsym(lib, "cuStreamEndCapture") : NULL;
    c.graph_destroy = lib ? (graph_destroy_fn)dlsym(lib, "cuGraphDestroy") : NULL;
    HCT_REQUIRE(c.begin && c.end, "the driver has no stream capture");
    GPU_OK(cu->ctx_get_current(&c.ctx));
    hcoll_comm_t comm = rank_init(sh, 0, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    hc_cu_dptr_t d;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    GPU_OK(cu->mem_alloc(&d, 4096));
    GPU_OK(cu->mem_alloc(&c.a, 256));
    GPU_OK(cu->mem_alloc(&c.b, 256));
    pthread_t th;
    HCT_REQUIRE(pthread_create(&th, NULL, capture_main, &c) == 0, "pthread_create");
    while (!atomic_load(&c.capturing))
        usleep(1000);
    /* The first device call sets the path up while the other thread
     * captures; a second one runs on the set-up path. */
    int bad = c.begin_rc != HC_CU_SUCCESS || sum_check(comm, cu, stream, d, nranks, 1.5f) ||
              sum_check(comm, cu, stream, d, nranks, 2.0f);
    atomic_store(&c.done, 1);
    pthread_join(th, NULL);
    HCT_REQUIRE(c.begin_rc == HC_CU_SUCCESS, "the capture could not begin (CUresult %d)",
                c.begin_rc);
    HCT_REQUIRE(!bad, "device all-reduce during another thread's capture failed");
    HCT_REQUIRE(c.end_rc == HC_CU_SUCCESS && c.graph,
                "the application's capture was invalidated by hcoll's calls on another "
                "thread (cuStreamEndCapture: CUresult %d)",
                c.end_rc);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

/* ---- A GPU without memory pools ------------------------------------------ */

typedef int (*mem_get_info_fn)(size_t *, size_t *);

/* One communicator's life: all-reduces, and reduce-scatters of growing
 * sizes (each growth replaces the device vector behind the stream). */
static int pools_cycle(shared_t *sh, int k, int rank, int nranks, const hc_cu_api_t *cu,
                       void *stream, hc_cu_dptr_t d)
{
    hcoll_comm_t comm = rank_init(sh, k, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    if (sum_check(comm, cu, stream, d, nranks, 1.0f))
        return 1;
    for (size_t n = 64; n <= 4096; n *= 4) {
        float *h = malloc(n * nranks * sizeof *h);
        HCT_REQUIRE(h, "no memory");
        for (size_t i = 0; i < n * nranks; i++)
            h[i] = (float)(i % 7);
        hc_cu_dptr_t s, r;
        GPU_OK(cu->mem_alloc(&s, n * nranks * sizeof *h));
        GPU_OK(cu->mem_alloc(&r, n * sizeof *h));
        GPU_OK(cu->memcpy_htod_async(s, h, n * nranks * sizeof *h, stream));
        HCT_OK(comm, hcoll_reduce_scatter(comm, (void *)(uintptr_t)s, (void *)(uintptr_t)r, n,
                                          HCOLL_FLOAT32, HCOLL_SUM, stream));
        GPU_OK(cu->memcpy_dtoh_async(h, r, n * sizeof *h, stream));
        GPU_OK(cu->stream_synchronize(stream));
        for (size_t i = 0; i < n; i++)
            HCT_REQUIRE(h[i] == (float)(((size_t)rank * n + i) % 7) * (float)nranks,
                        "reduce-scatter of %zu: element %zu = %g", n, i, h[i]);
        GPU_OK(cu->mem_free(s));
        GPU_OK(cu->mem_free(r));
        free(h);
    }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

/* CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 0 (HCMOCK_MEMPOOLS=0 on the
 * emulated driver): cuMemFreeAsync fails, and hcoll's device memory must
 * neither leak with every communicator nor be freed with cuMemFree (which
 * waits for the application's streams): after the first communicator,
 * later ones reuse it, so the GPU's free memory stays put. */
static int rank_no_pools(int rank, int nranks, void *arg)
{
    shared_t *sh = arg;
    setenv("HCMOCK_MEMPOOLS", "0", 1); /* read at cuInit, below */
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    int cudev = -1, pools = -1;
    GPU_OK(cu->device_get(&cudev, 0));
    GPU_OK(cu->device_attr(&pools, 115 /* MEMORY_POOLS_SUPPORTED */, cudev));
    const int mock = gpu_mock_driver() != NULL;
    HCT_REQUIRE(!mock || pools == 0, "HCMOCK_MEMPOOLS=0 but the attribute says %d", pools);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    mem_get_info_fn info = lib ? (mem_get_info_fn)dlsym(lib, "cuMemGetInfo_v2") : NULL;
    HCT_REQUIRE(info, "the driver has no cuMemGetInfo_v2");
    void *stream;
    hc_cu_dptr_t d;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    GPU_OK(cu->mem_alloc(&d, 4096));
    size_t free1 = 0, free3 = 0, total;
    for (int cycle = 1; cycle <= 3; cycle++) {
        if (pools_cycle(sh, cycle, rank, nranks, cu, stream, d))
            return 1;
        GPU_OK(info(cycle == 1 ? &free1 : &free3, &total));
    }
    /* A real GPU's pools and caches move the figure: only the emulation's
     * is exact. */
    HCT_REQUIRE(!mock || free3 == free1,
                "device memory lost with each communicator: %zu bytes free after the first, "
                "%zu after the third",
                free1, free3);
    return 0;
}

/* ---- Stream handles 0, 0x1, 0x2 ---------------------------------------------- */

typedef struct holder {
    const hc_cu_api_t *cu;
    void *ctx;
    hc_cu_dptr_t gate;
    atomic_int held, release;
    int rc;
} holder_t;

/* Holds this thread's per-thread default stream on a gate until told,
 * then opens the gate from a stream of its own. */
static void *ptds_holder(void *arg)
{
    holder_t *h = arg;
    void *s = NULL;
    h->rc = h->cu->ctx_set_current(h->ctx) != HC_CU_SUCCESS ||
            h->cu->stream_wait_value32(HC_CU_STREAM_PER_THREAD, h->gate, 1,
                                       HC_CU_STREAM_WAIT_VALUE_GEQ) != HC_CU_SUCCESS;
    atomic_store(&h->held, 1);
    for (int i = 0; i < 5000 && !atomic_load(&h->release); i++)
        usleep(1000);
    if (h->cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS ||
        h->cu->stream_write_value32(s, h->gate, 1, HC_CU_STREAM_WRITE_VALUE_DEFAULT) !=
            HC_CU_SUCCESS ||
        h->cu->stream_synchronize(HC_CU_STREAM_PER_THREAD) != HC_CU_SUCCESS)
        h->rc = 1;
    if (s)
        h->cu->stream_destroy(s);
    return NULL;
}

/* The driver's handles: 0x2 is each thread's own stream (one held on
 * another thread does not hold this thread's); NULL and CU_STREAM_LEGACY
 * (0x1) with device buffers are the legacy stream, ordered after the
 * application's blocking streams; 0x2 is refused, saying what to pass. */
static int rank_stream_handles(int rank, int nranks, void *arg)
{
    shared_t *sh = arg;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    static holder_t h;
    h.cu = cu;
    GPU_OK(cu->ctx_get_current(&h.ctx));
    hc_cu_dptr_t d;
    GPU_OK(cu->mem_alloc(&d, 4096));
    GPU_OK(cu->mem_alloc(&h.gate, 64));
    static const uint32_t zero = 0;
    GPU_OK(cu->memcpy_htod_async(h.gate, &zero, sizeof zero, NULL));
    GPU_OK(cu->stream_synchronize(NULL));
    pthread_t th;
    HCT_REQUIRE(pthread_create(&th, NULL, ptds_holder, &h) == 0, "pthread_create");
    while (!atomic_load(&h.held))
        usleep(1000);
    double t0 = hct_now_ms();
    float one = 1.0f;
    int r = cu->memcpy_htod_async(d, &one, sizeof one, HC_CU_STREAM_PER_THREAD);
    if (r == HC_CU_SUCCESS)
        r = cu->stream_synchronize(HC_CU_STREAM_PER_THREAD);
    double ms = hct_now_ms() - t0;
    atomic_store(&h.release, 1);
    pthread_join(th, NULL);
    HCT_REQUIRE(r == HC_CU_SUCCESS && h.rc == 0, "per-thread streams: CUresult %d / %d", r,
                h.rc);
    HCT_REQUIRE(ms < 2000, "this thread's CU_STREAM_PER_THREAD waited %.0f ms for another "
                "thread's: the handle must name a stream per thread", ms);

    hcoll_comm_t comm = rank_init(sh, 0, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *dp = (void *)(uintptr_t)d;
    hcoll_status_t st = hcoll_allreduce(comm, dp, dp, 64, HCOLL_FLOAT32, HCOLL_SUM,
                                        HC_CU_STREAM_PER_THREAD);
    HCT_REQUIRE(st == HCOLL_ERR_INVALID_ARG &&
                    strstr(hcoll_comm_last_error(comm), "CU_STREAM_PER_THREAD") &&
                    strstr(hcoll_comm_last_error(comm), "CU_STREAM_LEGACY"),
                "stream 0x2: %s: %s", hcoll_status_name(st), hcoll_comm_last_error(comm));
    /* The input comes on a blocking stream of the application's, not
     * synchronised: the legacy stream is ordered after it. */
    void *blocking;
    GPU_OK(cu->stream_create(&blocking, 0));
    for (int k = 0; k < 2; k++) {
        void *legacy = k == 0 ? NULL : HC_CU_STREAM_LEGACY;
        float in[64], out[64];
        for (int i = 0; i < 64; i++)
            in[i] = (float)(i + k);
        GPU_OK(cu->memcpy_htod_async(d, in, sizeof in, blocking));
        HCT_OK(comm, hcoll_allreduce(comm, dp, dp, 64, HCOLL_FLOAT32, HCOLL_SUM, legacy));
        GPU_OK(cu->memcpy_dtoh_async(out, d, sizeof out, legacy));
        GPU_OK(cu->stream_synchronize(legacy));
        for (int i = 0; i < 64; i++)
            HCT_REQUIRE(out[i] == in[i] * (float)nranks, "stream %p: element %d = %g, want %g",
                        legacy, i, out[i], in[i] * (float)nranks);
    }
    GPU_OK(cu->stream_synchronize(blocking));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

/* ---- Harness ---------------------------------------------------------------- */

static void run(hct_rank_fn fn, int nranks)
{
    shared_t *sh = hct_shared_alloc(sizeof *sh);
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = 1, .timeout_ms = TIMEOUT_MS };
    hct_result_t res[8];
    int bad = hct_run(&o, fn, sh, res);
    hct_shared_free(sh, sizeof *sh);
    ck_assert_msg(bad == 0, "%d of %d ranks failed (see stderr)", bad, nranks);
}

START_TEST(capture_other_thread) { run(rank_capture_other_thread, 2); }
END_TEST
START_TEST(no_memory_pools) { run(rank_no_pools, 2); }
END_TEST
START_TEST(stream_handles) { run(rank_stream_handles, 2); }
END_TEST

int main(void)
{
    char why[256];
    if (gpu_probe(why, sizeof why) < 1)
        HCT_SKIP_ALL("no GPU: %s", why);
    Suite *s = suite_create("gpu_driver");
    TCase *tc = tcase_create("driver");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, capture_other_thread);
    tcase_add_test(tc, no_memory_pools);
    tcase_add_test(tc, stream_handles);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
