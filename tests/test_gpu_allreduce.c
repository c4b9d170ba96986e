/*
 * The public all-reduce on device buffers, with forked ranks over TCP:
 *   - 2 and 4 ranks, one per emulated node (HCOLL_HOSTID), all on GPU 0:
 *     the host-staged ring plan; every dtype x op on exact inputs, in place
 *     and not, counts 0, 1, primes, several staging pieces;
 *   - 2 nodes x 2 ranks (NCCL reduce-scatter/all-gather) only with >= 2
 *     GPUs: ranks of one node sharing a GPU cannot form an NCCL
 *     communicator, so a one-GPU machine skips it and says so;
 *   - stream semantics: the stream is held by a wait the test controls, the
 *     call still returns at once (the host is not blocked), the request is
 *     not complete, and after the test releases the stream a kernel queued
 *     behind the all-reduce sees its result;
 *   - argument errors: device memory with stream CU_STREAM_PER_THREAD,
 *     host memory with a stream, a stream under graph capture (also as the
 *     very first device call), buffers on another GPU than the one current
 *     at init;
 *   - destroy does not wait for the application's own held streams;
 *   - a device request's completion callback runs once, by hcoll_wait;
 *   - a bandwidth line per size (BENCH), for scripts/gpu-check.sh.
 * Needs a GPU; prints "SKIP: no GPU: <why>" and exits 77 otherwise.
 */
#include <check.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ranks.h"
#include "base/reduce.h"
#include "gdr/mem.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"

#define TIMEOUT_MS 120000
static int ngpus;

typedef struct shared {
    hct_id_slot_t id;
    hct_barrier_t bar;
} shared_t;

typedef struct job {
    shared_t *sh;
    int rpn;   /* ranks per node */
    int bench;
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
    cfg.timeout_ms = 60000;
    if (hcoll_comm_init(&comm, nranks, rank, &id, &cfg) != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: init: %s\n", rank, hcoll_comm_last_error(NULL));
        return NULL;
    }
    return comm;
}

/* Exact inputs: small integers (powers of two for PROD), so any order of
 * reduction gives the same bits. Element i of rank r. */
static double input(int r, size_t i, hcoll_op_t op)
{
    if (op == HCOLL_PROD)
        return (i + (size_t)r) % 3 == 0 ? 2.0 : 1.0;
    return (double)((i * 7 + (size_t)r * 13) % 23) - 11.0;
}

static void store(void *p, size_t i, hcoll_dtype_t dt, double v)
{
    switch (dt) {
    case HCOLL_FLOAT32: ((float *)p)[i] = (float)v; break;
    case HCOLL_FLOAT64: ((double *)p)[i] = v; break;
    case HCOLL_FLOAT16: ((uint16_t *)p)[i] = hc_float_to_half((float)v); break;
    case HCOLL_BFLOAT16: ((uint16_t *)p)[i] = hc_float_to_bf16((float)v); break;
    case HCOLL_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case HCOLL_UINT8: ((uint8_t *)p)[i] = (uint8_t)(int)v; break;
    case HCOLL_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case HCOLL_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: break;
    }
}

/* The expected result: the inputs of all ranks reduced on the host with
 * the library's host kernels in rank order (exact inputs: order-free).
 * AVG of floats pre-multiplies each input by 1/n, then sums (hcoll.h); the
 * ranks here are powers of two, so 1/n is exact in every type and NCCL's
 * scalar (1/n in the type) and the host's (the float 1/n) agree. */
static void expected(void *out, size_t n, hcoll_dtype_t dt, hcoll_op_t op, int nranks)
{
    size_t es = hcoll_dtype_size(dt);
    unsigned char *tmp = malloc(n * es + 1);
    const int scaled = op == HCOLL_AVG && hc_dtype_is_float(dt);
    const hc_scalar_t k = hc_scalar_avg(dt, nranks);
    for (size_t i = 0; i < n; i++)
        store(out, i, dt, input(0, i, op));
    if (scaled)
        hc_reduce_scale(out, out, n, dt, k);
    for (int r = 1; r < nranks; r++) {
        for (size_t i = 0; i < n; i++)
            store(tmp, i, dt, input(r, i, op));
        if (scaled)
            hc_reduce_scale(tmp, tmp, n, dt, k);
        hc_reduce(out, out, tmp, n, dt, scaled ? HCOLL_SUM : op);
    }
    if (!scaled)
        hc_reduce_avg_finish(out, n, dt, op, nranks);
    free(tmp);
}

/* fp16 AVG of 20000 gives 20000 (the sum, 80000 on 4 ranks, is past
 * fp16's 65504); PREMUL_SUM with a host scalar ((rank + 1) / 4, exact) and
 * a device scalar read when the call runs (so changing it between calls
 * changes the result): by NCCL's PreMulSum, or without an NCCL stage by
 * hcoll's scaling kernel; a build without the kernels refuses it there as
 * unsupported. */
static int check_scaled(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                        int nranks, int nccl)
{
    const size_t n = 4099;
    uint16_t *h = malloc(n * 2);
    float *f = malloc(n * 4), *g = malloc(n * 4);
    HCT_REQUIRE(h && f && g, "no memory");
    hc_cu_dptr_t b, fb, sc;
    GPU_OK(cu->mem_alloc(&b, n * 2));
    GPU_OK(cu->mem_alloc(&fb, n * 4));
    GPU_OK(cu->mem_alloc(&sc, 64));
    for (size_t i = 0; i < n; i++)
        h[i] = 0x74e2; /* 20000 */
    GPU_OK(cu->memcpy_htod_async(b, h, n * 2, stream));
    HCT_OK(comm, hcoll_allreduce(comm, (void *)(uintptr_t)b, (void *)(uintptr_t)b, n,
                                 HCOLL_FLOAT16, HCOLL_AVG, stream));
    GPU_OK(cu->memcpy_dtoh_async(h, b, n * 2, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(h[i] == 0x74e2, "rank %d: fp16 AVG of 20000: element %zu is 0x%04x", rank,
                    i, h[i]);

    float s = (float)(rank + 1) / 4.0f;
    hcoll_op_t op;
    HCT_OK(comm, hcoll_op_create_premul_sum(comm, &s, HCOLL_FLOAT32,
                                            HCOLL_SCALAR_HOST_IMMEDIATE, &op));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)input(rank, i, HCOLL_SUM);
    GPU_OK(cu->memcpy_htod_async(fb, f, n * 4, stream));
    HCT_OK(comm, hcoll_allreduce(comm, (void *)(uintptr_t)fb, (void *)(uintptr_t)fb, n,
                                 HCOLL_FLOAT32, op, stream));
    GPU_OK(cu->memcpy_dtoh_async(g, fb, n * 4, stream));
    GPU_OK(cu->stream_synchronize(stream));
    HCT_OK(comm, hcoll_op_destroy(comm, op));
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++)
            want += (float)(r + 1) / 4.0f * (float)input(r, i, HCOLL_SUM);
        HCT_REQUIRE(g[i] == want, "rank %d: PREMUL_SUM (host scalar): element %zu is %g, want %g",
                    rank, i, g[i], want);
    }

    GPU_OK(cu->memcpy_htod_async(sc, &s, 4, stream));
    GPU_OK(cu->stream_synchronize(stream));
    HCT_OK(comm, hcoll_op_create_premul_sum(comm, (void *)(uintptr_t)sc, HCOLL_FLOAT32,
                                            HCOLL_SCALAR_DEVICE, &op));
    /* A device-scalar op on host buffers is refused. */
    HCT_REQUIRE(hcoll_allreduce(comm, f, g, n, HCOLL_FLOAT32, op, NULL) == HCOLL_ERR_INVALID_ARG,
                "a device-scalar op on host buffers was accepted");
    for (int pass = 1; pass <= 2; pass++) {
        float sv = s * (float)pass; /* changed between calls: read at run time */
        GPU_OK(cu->memcpy_htod_async(sc, &sv, 4, stream));
        GPU_OK(cu->memcpy_htod_async(fb, f, n * 4, stream));
        hcoll_status_t st = hcoll_allreduce(comm, (void *)(uintptr_t)fb, (void *)(uintptr_t)fb,
                                            n, HCOLL_FLOAT32, op, stream);
        if (!nccl && !HCOLL_BUILD_KERNELS) {
            HCT_REQUIRE(st == HCOLL_ERR_UNSUPPORTED, "device scalar without NCCL or kernels: %s",
                        hcoll_status_name(st));
            break;
        }
        HCT_OK(comm, st);
        GPU_OK(cu->memcpy_dtoh_async(g, fb, n * 4, stream));
        GPU_OK(cu->stream_synchronize(stream));
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < nranks; r++)
                want += (float)(r + 1) / 4.0f * (float)pass * (float)input(r, i, HCOLL_SUM);
            HCT_REQUIRE(g[i] == want,
                        "rank %d: PREMUL_SUM (device scalar, pass %d): element %zu is %g, "
                        "want %g", rank, pass, i, g[i], want);
        }
    }
    HCT_OK(comm, hcoll_op_destroy(comm, op));
    GPU_OK(cu->mem_free(b));
    GPU_OK(cu->mem_free(fb));
    GPU_OK(cu->mem_free(sc));
    free(h);
    free(f);
    free(g);
    return 0;
}

static int check_one(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                     int nranks, size_t n, hcoll_dtype_t dt, hcoll_op_t op, int inplace)
{
    size_t es = hcoll_dtype_size(dt), bytes = n * es + 16;
    unsigned char *h = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
    hc_cu_dptr_t s, r;
    GPU_OK(cu->mem_alloc(&s, bytes));
    GPU_OK(cu->mem_alloc(&r, bytes));
    for (size_t i = 0; i < n; i++)
        store(h, i, dt, input(rank, i, op));
    GPU_OK(cu->memcpy_htod_async(s, h, n * es + (n == 0), stream));
    GPU_OK(cu->memset_d32(r, 0xdeadbeef, bytes / 4));
    /* Memsets go on the legacy stream, unordered with a non-blocking one. */
    GPU_OK(cu->stream_synchronize(NULL));
    hc_cu_dptr_t dst = inplace ? s : r;
    HCT_OK(comm, hcoll_allreduce(comm, (void *)(uintptr_t)s, (void *)(uintptr_t)dst, n, dt, op,
                                 stream));
    GPU_OK(cu->memcpy_dtoh_async(got, dst, n * es + (n == 0), stream));
    GPU_OK(cu->stream_synchronize(stream));
    expected(want, n, dt, op, nranks);
    HCT_REQUIRE(memcmp(got, want, n * es) == 0, "rank %d: %s %s n=%zu%s: wrong result", rank,
                hcoll_dtype_name(dt), hcoll_op_name(op), n, inplace ? " in place" : "");
    cu->mem_free(s);
    cu->mem_free(r);
    free(h);
    free(want);
    free(got);
    return 0;
}

/* Completion callback of a device request: how often, with what. */
typedef struct dev_cb {
    int calls;
    hcoll_status_t status;
} dev_cb_t;

static void dev_cb(hcoll_request_t req, hcoll_status_t st, void *arg)
{
    (void)req;
    dev_cb_t *c = arg;
    c->status = st;
    __atomic_add_fetch(&c->calls, 1, __ATOMIC_SEQ_CST);
}

/* A device request completes with the whole all-reduce: once hcoll_wait
 * returns, the result is in device memory even for a stream that is not
 * ordered after the call; and its stage times cover every stage the plan
 * has (the NCCL ones from CUDA events). */
static int check_request(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int nranks,
                         int nccl_stages)
{
    const size_t n = 3000017; /* several segments */
    float *h = malloc(n * sizeof *h);
    HCT_REQUIRE(h, "no memory");
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(i % 7);
    hc_cu_dptr_t b;
    GPU_OK(cu->mem_alloc(&b, n * sizeof *h));
    GPU_OK(cu->memcpy_htod_async(b, h, n * sizeof *h, stream));
    hcoll_request_t req;
    HCT_OK(comm, hcoll_allreduce_async(comm, (void *)(uintptr_t)b, (void *)(uintptr_t)b, n,
                                       HCOLL_FLOAT32, HCOLL_SUM, stream, &req));
    dev_cb_t cb = { 0, HCOLL_ERR_INTERNAL };
    HCT_OK(comm, hcoll_request_set_callback(req, dev_cb, &cb));
    HCT_OK(comm, hcoll_wait(req));
    /* The callback runs when the request completes (stage 3 passed), and
     * hcoll_wait returns only after it. */
    HCT_REQUIRE(__atomic_load_n(&cb.calls, __ATOMIC_SEQ_CST) == 1 && cb.status == HCOLL_SUCCESS,
                "device request callback: %d calls, %s", cb.calls, hcoll_status_name(cb.status));
    void *other;
    GPU_OK(cu->stream_create(&other, HC_CU_STREAM_NON_BLOCKING));
    GPU_OK(cu->memcpy_dtoh_async(h, b, n * sizeof *h, other));
    GPU_OK(cu->stream_synchronize(other));
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(h[i] == (float)(i % 7) * (float)nranks,
                    "after hcoll_wait, element %zu = %g (the all-gather had not finished?)", i,
                    h[i]);
    hcoll_stage_times_t t;
    HCT_OK(comm, hcoll_request_stage_times(req, &t));
    HCT_REQUIRE(t.inter_us > 0 && t.total_us > 0, "inter %.1f us, total %.1f us", t.inter_us,
                t.total_us);
    if (nccl_stages)
        HCT_REQUIRE(t.intra_rs_us >= 0 && t.intra_ag_us >= 0,
                    "NCCL stages untimed: rs %.1f us, ag %.1f us", t.intra_rs_us, t.intra_ag_us);
    else
        HCT_REQUIRE(t.intra_rs_us == 0 && t.intra_ag_us == 0,
                    "one rank per node has no intra stage: rs %.1f, ag %.1f", t.intra_rs_us,
                    t.intra_ag_us);
    HCT_OK(comm, hcoll_request_free(req));
    GPU_OK(cu->stream_destroy(other));
    GPU_OK(cu->mem_free(b));
    free(h);
    return 0;
}

static int rank_correctness(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    const hc_cu_api_t *cu = gpu_open(ngpus > 1 ? (rank % j->rpn) % ngpus : 0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    static const hcoll_dtype_t dts[] = { HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16,
                                         HCOLL_FLOAT64, HCOLL_INT8,    HCOLL_UINT8,
                                         HCOLL_INT32,   HCOLL_INT64 };
    static const hcoll_op_t ops[] = { HCOLL_SUM, HCOLL_PROD, HCOLL_MAX, HCOLL_MIN, HCOLL_AVG };
    for (size_t d = 0; d < 8; d++)
        for (size_t o = 0; o < 5; o++)
            if (check_one(comm, cu, stream, rank, nranks, 1001, dts[d], ops[o], (int)(o & 1)))
                return 1;
    static const size_t sizes[] = { 0, 1, 3, 65537, 3000017 }; /* the last: several pieces */
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        if (check_one(comm, cu, stream, rank, nranks, sizes[k], HCOLL_FLOAT32, HCOLL_SUM, 0) ||
            check_one(comm, cu, stream, rank, nranks, sizes[k], HCOLL_BFLOAT16, HCOLL_AVG, 1))
            return 1;
    if (check_request(comm, cu, stream, nranks, j->rpn > 1) ||
        check_scaled(comm, cu, stream, rank, nranks, j->rpn > 1))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    cu->stream_destroy(stream);
    return 0;
}

/* The host is not blocked, and the stream orders what follows. */
static int rank_stream(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    const size_t n = 1 << 20;
    hc_cu_dptr_t buf, gate, two;
    GPU_OK(cu->mem_alloc(&buf, n * 4));
    GPU_OK(cu->mem_alloc(&two, n * 4));
    GPU_OK(cu->mem_alloc(&gate, 64));
    GPU_OK(cu->memset_d32(gate, 0, 1));
    GPU_OK(cu->memset_d32(buf, 0x3f800000u, n)); /* 1.0f */
    GPU_OK(cu->stream_synchronize(NULL)); /* memsets: legacy stream, unordered with ours */
    /* Hold the stream until this rank opens the gate. */
    GPU_OK(cu->stream_wait_value32(stream, gate, 1, HC_CU_STREAM_WAIT_VALUE_GEQ));
    double t0 = hct_now_ms();
    hcoll_request_t req;
    HCT_OK(comm, hcoll_allreduce_async(comm, (void *)(uintptr_t)buf, (void *)(uintptr_t)buf, n,
                                       HCOLL_FLOAT32, HCOLL_SUM, stream, &req));
    /* A second, blocking-API call behind it, also returning at once. */
    HCT_OK(comm, hcoll_allreduce(comm, (void *)(uintptr_t)buf, (void *)(uintptr_t)buf, n,
                                 HCOLL_FLOAT32, HCOLL_SUM, stream));
    double dt = hct_now_ms() - t0;
    HCT_REQUIRE(dt < 5000, "enqueueing took %.0f ms: the host was blocked", dt);
    /* A kernel behind the all-reduces: two = buf + buf. */
    hc_gdr_kern_t *k = NULL;
    char why[200];
    int have_k = hc_gdr_kern_load(&k, why, sizeof why) == HCOLL_SUCCESS;
    if (have_k)
        GPU_OK(hc_gdr_kern_reduce(k, two, buf, buf, n, HCOLL_FLOAT32, HCOLL_SUM, stream));
    usleep(200000);
    int done = 1;
    HCT_OK(comm, hcoll_test(req, &done));
    HCT_REQUIRE(!done, "the request completed while its stream was held");
    /* Open the gate (from another stream: ours is held). */
    void *s2;
    GPU_OK(cu->stream_create(&s2, HC_CU_STREAM_NON_BLOCKING));
    GPU_OK(cu->stream_write_value32(s2, gate, 1, HC_CU_STREAM_WRITE_VALUE_DEFAULT));
    HCT_OK(comm, hcoll_wait(req));
    HCT_OK(comm, hcoll_request_free(req));
    GPU_OK(cu->stream_synchronize(stream));
    float *h = malloc(n * 4);
    GPU_OK(cu->memcpy_dtoh_async(h, have_k ? two : buf, n * 4, stream));
    GPU_OK(cu->stream_synchronize(stream));
    /* 1 → nranks → nranks², doubled by the kernel. */
    float want = (float)(nranks * nranks) * (have_k ? 2.0f : 1.0f);
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(h[i] == want, "element %zu = %g, want %g", i, h[i], want);
    free(h);
    if (k)
        hc_gdr_kern_unload(k);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

typedef int (*begin_capture_fn)(void *, int);
typedef int (*end_capture_fn)(void *, void **);

static int rank_errors(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    hc_cu_dptr_t d;
    GPU_OK(cu->mem_alloc(&d, 4096));
    float host[16] = { 0 };
    void *dp = (void *)(uintptr_t)d;
    /* CU_STREAM_PER_THREAD names another stream on each thread. */
    hcoll_status_t st = hcoll_allreduce(comm, dp, dp, 16, HCOLL_FLOAT32, HCOLL_SUM, (void *)0x2);
    HCT_REQUIRE(st == HCOLL_ERR_INVALID_ARG &&
                    strstr(hcoll_comm_last_error(comm), "CU_STREAM_PER_THREAD"),
                "device memory with stream 0x2: %s: %s", hcoll_status_name(st),
                hcoll_comm_last_error(comm));
    st = hcoll_allreduce(comm, host, host, 16, HCOLL_FLOAT32, HCOLL_SUM, stream);
    HCT_REQUIRE(st == HCOLL_ERR_INVALID_ARG && strstr(hcoll_comm_last_error(comm), "host memory"),
                "host memory with a stream: %s: %s", hcoll_status_name(st),
                hcoll_comm_last_error(comm));
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    begin_capture_fn begin = lib ? (begin_capture_fn)dlsym(lib, "cuStreamBeginCapture_v2") : NULL;
    end_capture_fn end = lib ? (end_capture_fn)dlsym(lib, "cuStreamEndCapture") : NULL;
    if (begin && end) {
        GPU_OK(begin(stream, 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */));
        st = hcoll_allreduce(comm, dp, dp, 16, HCOLL_FLOAT32, HCOLL_SUM, stream);
        void *graph = NULL;
        end(stream, &graph);
        HCT_REQUIRE(st == HCOLL_ERR_UNSUPPORTED &&
                        strstr(hcoll_comm_last_error(comm), "CUDA graph"),
                    "under capture: %s: %s", hcoll_status_name(st), hcoll_comm_last_error(comm));
    }
    /* The refusals are local; the communicator still works. */
    HCT_OK(comm, hcoll_allreduce(comm, dp, dp, 16, HCOLL_FLOAT32, HCOLL_SUM, stream));
    GPU_OK(cu->stream_synchronize(stream));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

/* 16 floats of value v on the device, all-reduced (SUM) on stream, and
 * checked against v * nranks. */
static int sum_small(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, hc_cu_dptr_t d,
                     int nranks, float v)
{
    float h[16];
    for (int i = 0; i < 16; i++)
        h[i] = v;
    GPU_OK(cu->memcpy_htod_async(d, h, sizeof h, stream));
    void *dp = (void *)(uintptr_t)d;
    HCT_OK(comm, hcoll_allreduce(comm, dp, dp, 16, HCOLL_FLOAT32, HCOLL_SUM, stream));
    GPU_OK(cu->memcpy_dtoh_async(h, d, sizeof h, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (int i = 0; i < 16; i++)
        HCT_REQUIRE(h[i] == v * (float)nranks, "element %d = %g, want %g", i, h[i],
                    v * (float)nranks);
    return 0;
}

/* The communicator's very first device call comes under graph capture: it
 * is refused as a capture (not as a failed set-up, which would stick), and
 * the next call, after the capture, sets up and works. */
static int rank_capture_first(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    (void)rank;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    begin_capture_fn begin = lib ? (begin_capture_fn)dlsym(lib, "cuStreamBeginCapture_v2") : NULL;
    end_capture_fn end = lib ? (end_capture_fn)dlsym(lib, "cuStreamEndCapture") : NULL;
    HCT_REQUIRE(begin && end, "the driver has no stream capture");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    /* A blocking stream, as cudaStreamCreate makes by default. */
    void *stream;
    GPU_OK(cu->stream_create(&stream, 0));
    hc_cu_dptr_t d;
    GPU_OK(cu->mem_alloc(&d, 4096));
    void *dp = (void *)(uintptr_t)d;
    GPU_OK(begin(stream, 0 /* CU_STREAM_CAPTURE_MODE_GLOBAL */));
    hcoll_status_t st = hcoll_allreduce(comm, dp, dp, 16, HCOLL_FLOAT32, HCOLL_SUM, stream);
    void *graph = NULL;
    end(stream, &graph);
    HCT_REQUIRE(st == HCOLL_ERR_UNSUPPORTED && strstr(hcoll_comm_last_error(comm), "CUDA graph"),
                "first call under capture: %s: %s", hcoll_status_name(st),
                hcoll_comm_last_error(comm));
    if (sum_small(comm, cu, stream, d, nranks, 1.5f) != 0)
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

/* The application's gate: opened by a thread of its own after GATE_MS,
 * the way an application releases a stream it holds (so a destroy that
 * waits for that stream ends then, and the test fails instead of hanging). */
#define GATE_MS 3000
typedef struct gate {
    const hc_cu_api_t *cu;
    void *ctx;
    hc_cu_dptr_t word;
    atomic_int opened;
    int rc;
} gate_t;

static void *gate_opener(void *arg)
{
    gate_t *g = arg;
    void *s = NULL;
    usleep(GATE_MS * 1000);
    atomic_store(&g->opened, 1);
    if (g->cu->ctx_set_current(g->ctx) != HC_CU_SUCCESS ||
        g->cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) != HC_CU_SUCCESS ||
        g->cu->stream_write_value32(s, g->word, 1, HC_CU_STREAM_WRITE_VALUE_DEFAULT) !=
            HC_CU_SUCCESS)
        g->rc = 1;
    if (s)
        g->cu->stream_destroy(s);
    return NULL;
}

/* hcoll_comm_destroy returns while the application's own stream is held by
 * a wait that the application releases only later (from another thread):
 * nothing destroy frees may synchronise the device (cuMemFree,
 * cuMemFreeHost, cuModuleUnload do on real drivers). */
static int rank_destroy_not_held(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    (void)rank;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream, *other;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    GPU_OK(cu->stream_create(&other, HC_CU_STREAM_NON_BLOCKING));
    hc_cu_dptr_t d;
    static gate_t gate;
    gate.cu = cu;
    GPU_OK(cu->ctx_get_current(&gate.ctx));
    GPU_OK(cu->mem_alloc(&d, 4096));
    GPU_OK(cu->mem_alloc(&gate.word, 64));
    static const uint32_t zero = 0;
    GPU_OK(cu->memcpy_htod_async(gate.word, &zero, sizeof zero, other));
    GPU_OK(cu->stream_synchronize(other));
    if (sum_small(comm, cu, stream, d, nranks, 2.0f) != 0)
        return 1;
    /* The application's stream now waits for the application. */
    GPU_OK(cu->stream_wait_value32(other, gate.word, 1, HC_CU_STREAM_WAIT_VALUE_GEQ));
    pthread_t th;
    HCT_REQUIRE(pthread_create(&th, NULL, gate_opener, &gate) == 0, "pthread_create");
    double t0 = hct_now_ms();
    hcoll_status_t st = hcoll_comm_destroy(comm);
    double ms = hct_now_ms() - t0;
    int opened = atomic_load(&gate.opened);
    pthread_join(th, NULL);
    HCT_REQUIRE(gate.rc == 0, "the gate could not be opened");
    GPU_OK(cu->stream_synchronize(other));
    HCT_REQUIRE(st == HCOLL_SUCCESS, "hcoll_comm_destroy: %s", hcoll_status_name(st));
    HCT_REQUIRE(!opened, "hcoll_comm_destroy returned only after the application released "
                "its held stream (%.0f ms): it waited for that stream", ms);
    /* The staging buffers went back to the GPU's pool, for the next one. */
    int cudev = -1;
    GPU_OK(cu->device_get(&cudev, 0));
    HCT_REQUIRE(hc_gdr_pin_idle(cudev) >= 2, "%zu pinned buffers idle after destroy, want 2",
                hc_gdr_pin_idle(cudev));
    return 0;
}

/* The communicator's GPU is the device current at hcoll_comm_init:
 * buffers on another GPU are refused, locally and with a message. */
static int rank_wrong_gpu(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    (void)rank;
    const hc_cu_api_t *cu = gpu_open(1);
    HCT_REQUIRE(cu, "no GPU 1");
    hc_cu_dptr_t d1;
    GPU_OK(cu->mem_alloc(&d1, 4096));
    void *s1;
    GPU_OK(cu->stream_create(&s1, HC_CU_STREAM_NON_BLOCKING));
    HCT_REQUIRE(gpu_open(0), "no GPU 0");
    hcoll_comm_t comm = rank_init(j, rank, nranks); /* on GPU 0 */
    HCT_REQUIRE(comm, "init failed");
    void *p1 = (void *)(uintptr_t)d1;
    hcoll_status_t st = hcoll_allreduce(comm, p1, p1, 16, HCOLL_FLOAT32, HCOLL_SUM, s1);
    HCT_REQUIRE(st == HCOLL_ERR_INVALID_ARG &&
                    strstr(hcoll_comm_last_error(comm), "current device at hcoll_comm_init"),
                "buffers on GPU 1, communicator on GPU 0: %s: %s", hcoll_status_name(st),
                hcoll_comm_last_error(comm));
    void *s0;
    GPU_OK(cu->stream_create(&s0, HC_CU_STREAM_NON_BLOCKING));
    hc_cu_dptr_t d0;
    GPU_OK(cu->mem_alloc(&d0, 4096));
    if (sum_small(comm, cu, s0, d0, nranks, 3.0f) != 0)
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static int rank_bench(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    static const size_t sizes[] = { 1u << 20, 16u << 20, 64u << 20 };
    for (size_t k = 0; k < 3; k++) {
        hc_cu_dptr_t b;
        GPU_OK(cu->mem_alloc(&b, sizes[k]));
        void *p = (void *)(uintptr_t)b;
        size_t n = sizes[k] / 4;
        HCT_OK(comm, hcoll_allreduce(comm, p, p, n, HCOLL_FLOAT32, HCOLL_SUM, stream));
        GPU_OK(cu->stream_synchronize(stream));
        int iters = 5;
        double t = hct_now_ms();
        for (int i = 0; i < iters; i++)
            HCT_OK(comm, hcoll_allreduce(comm, p, p, n, HCOLL_FLOAT32, HCOLL_SUM, stream));
        GPU_OK(cu->stream_synchronize(stream));
        double ms = (hct_now_ms() - t) / iters;
        if (rank == 0)
            printf("BENCH device allreduce %d ranks (1/node, TCP, staged) %6zu MiB: %8.2f ms  "
                   "busbw %6.2f GB/s%s\n",
                   nranks, sizes[k] >> 20, ms,
                   2.0 * (nranks - 1) / nranks * sizes[k] / (ms / 1e3) / 1e9,
                   gpu_mock_driver() ? "  (mock driver, meaningless)" : "");
        fflush(stdout);
        cu->mem_free(b);
    }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static void run(hct_rank_fn fn, int nranks, int rpn)
{
    shared_t *sh = hct_shared_alloc(sizeof *sh);
    job_t j = { sh, rpn, 0 };
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = rpn, .timeout_ms = TIMEOUT_MS };
    hct_result_t res[8];
    int bad = hct_run(&o, fn, &j, res);
    hct_shared_free(sh, sizeof *sh);
    ck_assert_msg(bad == 0, "%d of %d ranks failed (see stderr)", bad, nranks);
}

START_TEST(ring_2_nodes) { run(rank_correctness, 2, 1); }
END_TEST
START_TEST(ring_4_nodes) { run(rank_correctness, 4, 1); }
END_TEST
START_TEST(three_stage_2x2)
{
    if (ngpus < 2) {
        printf("SKIP: 2x2 needs 2 GPUs (ranks of one node sharing a GPU cannot form an NCCL "
               "communicator); this machine has %d\n", ngpus);
        return;
    }
    run(rank_correctness, 4, 2);
}
END_TEST
START_TEST(stream_not_blocked) { run(rank_stream, 2, 1); }
END_TEST
START_TEST(argument_errors) { run(rank_errors, 2, 1); }
END_TEST
START_TEST(capture_first_call) { run(rank_capture_first, 2, 1); }
END_TEST
START_TEST(destroy_not_held) { run(rank_destroy_not_held, 2, 1); }
END_TEST
START_TEST(wrong_gpu)
{
    if (ngpus < 2) {
        printf("SKIP: wrong_gpu needs 2 GPUs; this machine has %d\n", ngpus);
        return;
    }
    run(rank_wrong_gpu, 2, 1);
}
END_TEST
START_TEST(bench_2) { run(rank_bench, 2, 1); }
END_TEST
START_TEST(bench_4) { run(rank_bench, 4, 1); }
END_TEST

int main(void)
{
    char why[256];
    ngpus = gpu_probe(why, sizeof why);
    if (ngpus < 1)
        HCT_SKIP_ALL("no GPU: %s", why);
    Suite *s = suite_create("gpu_allreduce");
    TCase *tc = tcase_create("device");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, ring_2_nodes);
    tcase_add_test(tc, ring_4_nodes);
    tcase_add_test(tc, three_stage_2x2);
    tcase_add_test(tc, stream_not_blocked);
    tcase_add_test(tc, argument_errors);
    tcase_add_test(tc, capture_first_call);
    tcase_add_test(tc, destroy_not_held);
    tcase_add_test(tc, wrong_gpu);
    tcase_add_test(tc, bench_2);
    tcase_add_test(tc, bench_4);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
