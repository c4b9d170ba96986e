/*
 * Where real CUDA drivers differ from a naive reading of the API, each
 * through the public device all-reduce with forked ranks over TCP (one per
 * emulated node, GPU 0):
 *   - capture_other_thread: an application thread captures a CUDA graph
 *     in global mode while another thread makes the communicator's first
 *     device call (its set-up allocates, loads the kernels, synchronises
 *     and polls events): the call works and the capture stays valid,
 *     because hcoll makes those calls in relaxed capture mode;
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

typedef struct shared {
    hct_id_slot_t id;
} shared_t;

static hcoll_comm_t rank_init(shared_t *sh, int rank, int nranks)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    setenv("HCOLL_NET", "tcp", 1);
    if (hct_share_unique_id(&sh->id, rank, 20000, &id) != 0)
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
    hcoll_comm_t comm = rank_init(sh, rank, nranks);
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

int main(void)
{
    char why[256];
    if (gpu_probe(why, sizeof why) < 1)
        HCT_SKIP_ALL("no GPU: %s", why);
    Suite *s = suite_create("gpu_driver");
    TCase *tc = tcase_create("driver");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, capture_other_thread);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
