/*
 * The public API over the verbs transport: hcoll_comm_init and
 * hcoll_allreduce with HCOLL_NET=ib on the emulated libibverbs
 * (tests/mock/verbs.c) and the RoCE fixture tree tests/fixtures/sysfs-roce:
 * 2 and 4 emulated nodes and 2 x 2 (two NICs per node), host and device
 * buffers (the emulated CUDA driver, GPUDirect through nvidia-peermem, a
 * dma-buf export that fails), results compared bit for bit, the NET/IB log
 * line, barriers between the all-reduces, and a rank killed mid-transfer.
 * regress_* cases are library bugs
 * this emulation exposed at this level, one case each (each failed before
 * its fix).
 *
 * main re-executes this program inside the emulation (common/mockib.h).
 * Skips (77) when hcoll was built without rdma-core headers or the mock is
 * not built.
 */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"
#include "hcoll.h"

#if HCOLL_BUILD_VERBS

#define TEST_TIMEOUT_S 60
#define MAXR 4

/* ------------------------------------------------------------------------ */
/* api_*: the public all-reduce over HCOLL_NET=ib                             */
/* ------------------------------------------------------------------------ */

typedef struct api_arg {
    hct_id_slot_t slot;
    char logdir[128];
    int kill_victim;       /* -1: none */
    int per_node;          /* device cases: local rank = rank % per_node = its GPU */
    int dmabuf;            /* device cases: the GPU claims dma-buf, whose export fails */
    int one_queue;         /* device cases: CUDA_DEVICE_MAX_CONNECTIONS=1 */
    volatile double kill_ms;
    volatile double noticed_ms[MAXR];
    int fault_sig;          /* live_* cases: SIGSTOP or SIGKILL */
    volatile int ready;     /* live_* cases: the victim is parked */
    volatile int done[MAXR];
    char msg[MAXR][400];
} api_arg_t;

typedef struct ar_case {
    hcoll_dtype_t dt;
    hcoll_op_t op;
    size_t count;
    int inplace;
} ar_case_t;

static const ar_case_t ar_cases[] = {
    { HCOLL_FLOAT32, HCOLL_SUM, 1, 0 },        { HCOLL_FLOAT32, HCOLL_SUM, 1000, 1 },
    { HCOLL_INT32, HCOLL_MAX, 70001, 0 },      { HCOLL_FLOAT64, HCOLL_SUM, 300007, 1 },
    { HCOLL_INT8, HCOLL_MIN, 77777, 0 },       { HCOLL_BFLOAT16, HCOLL_SUM, 123457, 0 },
    { HCOLL_FLOAT16, HCOLL_MAX, 65536, 1 },    { HCOLL_INT64, HCOLL_SUM, 262144, 0 },
    { HCOLL_FLOAT32, HCOLL_SUM, 1u << 20, 0 }, /* 4 MiB */
};
#define NCASES (int)(sizeof ar_cases / sizeof ar_cases[0])

/* Small integers: every order of reduction gives the same exact value. */
static int64_t val(int rank, size_t i)
{
    return (int64_t)((i * 7 + (size_t)rank * 3) % 11) - 5;
}

static void put_elem(hcoll_dtype_t dt, void *buf, size_t i, int64_t v)
{
    switch (dt) {
    case HCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case HCOLL_FLOAT64: ((double *)buf)[i] = (double)v; break;
    case HCOLL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case HCOLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case HCOLL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HCOLL_INT64: ((int64_t *)buf)[i] = v; break;
    case HCOLL_FLOAT16: {
        /* Integers |v| < 2048 are exact in binary16. */
        uint16_t h = 0;
        if (v) {
            uint32_t a = (uint32_t)(v < 0 ? -v : v);
            int e = 31 - __builtin_clz(a);
            h = (uint16_t)(((e + 15) << 10) | ((a << (10 - e)) & 0x3ff));
            if (v < 0)
                h |= 0x8000;
        }
        ((uint16_t *)buf)[i] = h;
        break;
    }
    case HCOLL_BFLOAT16: {
        float f = (float)v;
        uint32_t x;
        memcpy(&x, &f, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(x >> 16);
        break;
    }
    default: break;
    }
}

static int64_t ref(hcoll_op_t op, int n, size_t i)
{
    int64_t r = val(0, i);
    for (int k = 1; k < n; k++) {
        int64_t v = val(k, i);
        r = op == HCOLL_SUM ? r + v : op == HCOLL_MAX ? (v > r ? v : r) : (v < r ? v : r);
    }
    return r;
}

static int open_comm(api_arg_t *a, int rank, int n, int timeout_ms, hcoll_comm_t *comm)
{
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = timeout_ms;
    cfg.net = "ib";
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(comm, n, rank, &id, &cfg));
    return 0;
}

static void api_env(const char *logdir)
{
    setenv("HCOLL_NET", "ib", 1);
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    setenv("HCOLL_DEBUG", "INFO", 1);
    setenv("HCOLL_DEBUG_SUBSYS", "NET,INIT", 1);
    char path[256];
    snprintf(path, sizeof path, "%s/rank.%%p.log", logdir);
    setenv("HCOLL_DEBUG_FILE", path, 1);
}

static int rank_api(int rank, int n, void *argp)
{
    api_arg_t *a = argp;
    api_env(a->logdir);
    hcoll_comm_t comm;
    if (open_comm(a, rank, n, 20000, &comm))
        return 1;
    for (int ci = 0; ci < NCASES; ci++) {
        const ar_case_t *c = &ar_cases[ci];
        const size_t es = hcoll_dtype_size(c->dt), bytes = c->count * es;
        unsigned char *in = malloc(bytes), *out = malloc(bytes + 64), *want = malloc(bytes);
        HCT_REQUIRE(in && out && want, "no memory");
        memset(out, 0x5a, bytes + 64);
        for (size_t i = 0; i < c->count; i++) {
            put_elem(c->dt, c->inplace ? out : in, i, val(rank, i));
            put_elem(c->dt, want, i, ref(c->op, n, i));
        }
        /* Barriers (dissemination over verbs: zero-byte writes with an
         * immediate) between the all-reduces. */
        for (int b = 0; b < 20; b++)
            HCT_OK(comm, hcoll_barrier(comm));
        hcoll_status_t st = hcoll_allreduce(comm, c->inplace ? out : in, out, c->count, c->dt,
                                            c->op, NULL);
        HCT_REQUIRE(st == HCOLL_SUCCESS, "rank %d: %zu x %s %s: %s (%s)", rank, c->count,
                    hcoll_dtype_name(c->dt), hcoll_op_name(c->op), hcoll_status_name(st),
                    hcoll_comm_last_error(comm));
        for (size_t i = 0; i < bytes; i++)
            HCT_REQUIRE(out[i] == want[i], "rank %d: %zu x %s %s: byte %zu is 0x%02x, not 0x%02x",
                        rank, c->count, hcoll_dtype_name(c->dt), hcoll_op_name(c->op), i, out[i],
                        want[i]);
        for (size_t i = bytes; i < bytes + 64; i++)
            HCT_REQUIRE(out[i] == 0x5a, "rank %d: wrote past the end", rank);
        free(in);
        free(out);
        free(want);
    }
    char who[32];
    snprintf(who, sizeof who, "rank %d", rank);
    if (hct_mock_clean(who, 1))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return hct_mock_released(who);
}

/* Every rank's log has the NET/IB choice line at INFO. */
static void check_logs(const char *dir, int n, const char *const *devs)
{
    char cmd[512];
    for (int r = 0; r < n; r++) {
        snprintf(cmd, sizeof cmd, "grep -h 'NET/IB: rank %d -> \\[[0-9]*\\]%s:1/RoCE' %s/rank.*.log",
                 r, devs[r], dir);
        FILE *p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        char line[512] = "";
        char *got = fgets(line, sizeof line, p);
        pclose(p);
        ck_assert_msg(got != NULL, "no line 'NET/IB: rank %d -> [i]%s:1/RoCE' in %s/rank.*.log", r,
                      devs[r], dir);
        ck_assert_msg(strstr(line, " INFO ") || strstr(line, "INFO"), "%s", line);
    }
}

static api_arg_t *api_arg_new(void)
{
    api_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    snprintf(a->logdir, sizeof a->logdir, "/tmp/hcmock-ib-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(a->logdir));
    a->kill_victim = -1;
    return a;
}

static void api_arg_free(api_arg_t *a)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", a->logdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", a->logdir);
    hct_shared_free(a, sizeof *a);
}

static void run_api(int n, int per_node, const char *const *devs, int tx_delay_us)
{
    api_arg_t *a = api_arg_new();
    char delay[32];
    snprintf(delay, sizeof delay, "%d", tx_delay_us);
    setenv("HCMOCK_IB_TX_DELAY_US", delay, 1);
    hct_opts_t o = { .nranks = n, .ranks_per_node = per_node, .timeout_ms = 50000 };
    hct_result_t res[MAXR];
    double t0 = hct_now_ms();
    int bad = hct_run(&o, rank_api, a, res);
    fprintf(stderr, "api %d ranks, %d per node: %.1f s\n", n, per_node, (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
    check_logs(a->logdir, n, devs);
    api_arg_free(a);
    unsetenv("HCMOCK_IB_TX_DELAY_US");
}

START_TEST(api_allreduce_2)
{
    const char *devs[] = { "mlx5_bond_0", "mlx5_bond_0" };
    run_api(2, 1, devs, 0);
}
END_TEST

START_TEST(api_allreduce_4)
{
    const char *devs[] = { "mlx5_bond_0", "mlx5_bond_0", "mlx5_bond_0", "mlx5_bond_0" };
    /* Every WR waits 0.5 ms before the NIC reads its source: a buffer or
     * staging slot reused before its completion would send new bytes. */
    run_api(4, 1, devs, 500);
}
END_TEST

/* Two NICs per node: local rank 1 takes mlx5_bond_1, whose only usable GID
 * is a global IPv6 one. */
START_TEST(api_allreduce_2x2)
{
    const char *devs[] = { "mlx5_bond_0", "mlx5_bond_1", "mlx5_bond_0", "mlx5_bond_1" };
    run_api(4, 2, devs, 0);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* qps_*: HCOLL_IB_QPS_PER_PEER: every collective with puts striped over     */
/* 2 or 4 QPs per peer (credits and completions per QP)                       */
/* ------------------------------------------------------------------------ */

#define QPS_RS   100003 /* floats per rank */
#define QPS_AG   77777  /* int32 per rank */
#define QPS_BC   (1u << 20)
#define QPS_BARS 400    /* past a credit update (RQ_DEPTH / 4) on every QP */

static int qps_allreduce(hcoll_comm_t comm, int rank, int n, const ar_case_t *c)
{
    const size_t bytes = c->count * hcoll_dtype_size(c->dt);
    unsigned char *in = malloc(bytes), *out = malloc(bytes), *want = malloc(bytes);
    HCT_REQUIRE(in && out && want, "no memory");
    for (size_t i = 0; i < c->count; i++) {
        put_elem(c->dt, in, i, val(rank, i));
        put_elem(c->dt, want, i, ref(c->op, n, i));
    }
    HCT_OK(comm, hcoll_allreduce(comm, in, out, c->count, c->dt, c->op, NULL));
    HCT_REQUIRE(memcmp(out, want, bytes) == 0, "rank %d: %zu x %s %s: wrong result", rank,
                c->count, hcoll_dtype_name(c->dt), hcoll_op_name(c->op));
    free(in);
    free(out);
    free(want);
    return 0;
}

static int qps_others(hcoll_comm_t comm, int rank, int n)
{
    float *rs_in = malloc((size_t)n * QPS_RS * sizeof *rs_in), *rs_out = malloc(QPS_RS * 4);
    int32_t *ag_in = malloc(QPS_AG * 4), *ag_out = malloc((size_t)n * QPS_AG * 4);
    float *bc = malloc(QPS_BC * sizeof *bc);
    HCT_REQUIRE(rs_in && rs_out && ag_in && ag_out && bc, "no memory");
    for (size_t i = 0; i < (size_t)n * QPS_RS; i++)
        rs_in[i] = (float)val(rank, i);
    for (size_t i = 0; i < QPS_AG; i++)
        ag_in[i] = (int32_t)(i * 31 + (size_t)rank);
    for (size_t i = 0; i < QPS_BC; i++)
        bc[i] = rank == n - 1 ? (float)(i % 1000) : -1.0f;
    HCT_OK(comm, hcoll_reduce_scatter(comm, rs_in, rs_out, QPS_RS, HCOLL_FLOAT32, HCOLL_SUM,
                                      NULL));
    for (size_t i = 0; i < QPS_RS; i++)
        HCT_REQUIRE(rs_out[i] == (float)ref(HCOLL_SUM, n, (size_t)rank * QPS_RS + i),
                    "rank %d: reduce-scatter element %zu is %g", rank, i, (double)rs_out[i]);
    HCT_OK(comm, hcoll_allgather(comm, ag_in, ag_out, QPS_AG, HCOLL_INT32, NULL));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < QPS_AG; i++)
            HCT_REQUIRE(ag_out[(size_t)r * QPS_AG + i] == (int32_t)(i * 31 + (size_t)r),
                        "rank %d: all-gather element %zu of rank %d", rank, i, r);
    HCT_OK(comm, hcoll_broadcast(comm, bc, bc, QPS_BC, HCOLL_FLOAT32, n - 1, NULL));
    for (size_t i = 0; i < QPS_BC; i++)
        HCT_REQUIRE(bc[i] == (float)(i % 1000), "rank %d: broadcast element %zu", rank, i);
    for (int b = 0; b < QPS_BARS; b++)
        HCT_OK(comm, hcoll_barrier(comm));
    free(rs_in);
    free(rs_out);
    free(ag_in);
    free(ag_out);
    free(bc);
    return 0;
}

static int rank_qps(int rank, int n, void *argp)
{
    api_arg_t *a = argp;
    api_env(a->logdir);
    char qps[8];
    snprintf(qps, sizeof qps, "%d", a->per_node);
    setenv("HCOLL_IB_QPS_PER_PEER", qps, 1);
    hcoll_comm_t comm;
    if (open_comm(a, rank, n, 20000, &comm))
        return 1;
    static const int cases[] = { 1, 2, 3, 5, 8 };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        if (qps_allreduce(comm, rank, n, &ar_cases[cases[k]]))
            return 1;
    if (qps_others(comm, rank, n))
        return 1;
    char who[32];
    snprintf(who, sizeof who, "rank %d", rank);
    if (hct_mock_clean(who, 1))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return hct_mock_released(who);
}

static void run_qps(int n, int qps)
{
    api_arg_t *a = api_arg_new();
    a->per_node = qps; /* the QP count, for rank_qps */
    /* Sources read late: a slot or buffer reused before its completion on
     * any of the QPs would send new bytes. */
    setenv("HCMOCK_IB_TX_DELAY_US", "200", 1);
    hct_opts_t o = { .nranks = n, .ranks_per_node = 1, .timeout_ms = 50000 };
    hct_result_t res[MAXR];
    int bad = hct_run(&o, rank_qps, a, res);
    unsetenv("HCMOCK_IB_TX_DELAY_US");
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
    /* Every connection says it runs on that many QPs. */
    char cmd[400], want[32];
    snprintf(want, sizeof want, "(%d QPs)", qps);
    snprintf(cmd, sizeof cmd, "grep -h 'NET/IB: rank [0-9] -> rank [0-9] via' %s/rank.*.log",
             a->logdir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char line[512];
    int lines = 0;
    while (fgets(line, sizeof line, p)) {
        ck_assert_msg(strstr(line, want), "a connection not on %d QPs: %s", qps, line);
        lines++;
    }
    pclose(p);
    ck_assert_int_ge(lines, n); /* each rank to its next at least */
    api_arg_free(a);
}

START_TEST(qps_per_peer_2) { run_qps(4, 2); }
END_TEST

START_TEST(qps_per_peer_4) { run_qps(2, 4); }
END_TEST

/* The public all-reduce on device buffers (emulated CUDA driver) with
 * HCOLL_NET=ib: each rank's GPU sits beside its NIC in sysfs-mockib and
 * nvidia-peermem is there, so stage 2 runs on device memory (GPUDirect):
 * the NIC writes device staging slots and the reduction kernels reduce
 * there. sm_80, so every landing also takes a flush read. */
static int api_device_scaled(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                             int n);
static int api_device_bcast(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                            int n);
static int api_device_rsag(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                           int n);

static int rank_api_device(int rank, int n, void *argp)
{
    api_arg_t *a = argp;
    api_env(a->logdir);
    setenv("HCOLL_DEBUG_SUBSYS", "NET,INIT,GDR", 1);
    setenv("HCMOCK_CC", "8.0", 1);
    /* The tree where each GPU shares a PCIe switch with its own NIC. */
    char root[PATH_MAX];
    HCT_REQUIRE(realpath("tests/fixtures/sysfs-mockib", root), "no tests/fixtures/sysfs-mockib");
    setenv("HCOLL_SYSFS_ROOT", root, 1);
    setenv("HCMOCK_IB_SYSFS", root, 1);
    if (a->dmabuf)
        setenv("HCMOCK_DMABUF", "1", 1);
    if (a->one_queue) /* every stream shares one in-order hardware queue */
        setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
    const int local = rank % a->per_node;
    const hc_cu_api_t *cu = gpu_open(local); /* current at init: the comm's GPU */
    HCT_REQUIRE(cu, "rank %d: no (mock) GPU %d", rank, local);
    HCT_REQUIRE(gpu_mock_driver(), "rank %d: the libcuda.so.1 loaded is not the mock", rank);
    hcoll_comm_t comm;
    if (open_comm(a, rank, n, 20000, &comm))
        return 1;
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    for (int ci = 0; ci < NCASES; ci++) {
        const ar_case_t *c = &ar_cases[ci];
        const size_t es = hcoll_dtype_size(c->dt), bytes = c->count * es;
        unsigned char *in = malloc(bytes), *out = malloc(bytes), *want = malloc(bytes);
        HCT_REQUIRE(in && out && want, "no memory");
        for (size_t i = 0; i < c->count; i++) {
            put_elem(c->dt, in, i, val(rank, i));
            put_elem(c->dt, want, i, ref(c->op, n, i));
        }
        hc_cu_dptr_t ds, dr;
        GPU_OK(cu->mem_alloc(&ds, bytes));
        GPU_OK(cu->mem_alloc(&dr, bytes));
        GPU_OK(cu->memcpy_htod_async(c->inplace ? dr : ds, in, bytes, stream));
        void *sp = (void *)(uintptr_t)(c->inplace ? dr : ds), *rp = (void *)(uintptr_t)dr;
        hcoll_status_t st = hcoll_allreduce(comm, sp, rp, c->count, c->dt, c->op, stream);
        HCT_REQUIRE(st == HCOLL_SUCCESS, "rank %d: device %zu x %s %s: %s (%s)", rank, c->count,
                    hcoll_dtype_name(c->dt), hcoll_op_name(c->op), hcoll_status_name(st),
                    hcoll_comm_last_error(comm));
        GPU_OK(cu->memcpy_dtoh_async(out, dr, bytes, stream));
        GPU_OK(cu->stream_synchronize(stream));
        for (size_t i = 0; i < bytes; i++)
            HCT_REQUIRE(out[i] == want[i],
                        "rank %d: device %zu x %s %s: byte %zu is 0x%02x, not 0x%02x", rank,
                        c->count, hcoll_dtype_name(c->dt), hcoll_op_name(c->op), i, out[i],
                        want[i]);
        GPU_OK(cu->mem_free(ds));
        GPU_OK(cu->mem_free(dr));
        free(in);
        free(out);
        free(want);
    }
    if (api_device_scaled(comm, cu, stream, rank, n) ||
        api_device_bcast(comm, cu, stream, rank, n) ||
        api_device_rsag(comm, cu, stream, rank, n))
        return 1;
    char who[32];
    snprintf(who, sizeof who, "rank %d", rank);
    if (hct_mock_clean(who, 1))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    GPU_OK(cu->stream_destroy(stream));
    return hct_mock_released(who);
}

/* Scaled ops on the GPUDirect ring (hcoll's scaling kernel on the stream,
 * then the ring sums device memory): fp16 AVG of 40000 (the sum of two is
 * past fp16's 65504, the pre-multiplied one is not), and PREMUL_SUM of
 * float32 with a host and a device scalar, (rank + 1) / 4, exact. */
static int api_device_scaled(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                             int n)
{
    const size_t count = 70001;
    uint16_t *h = malloc(count * 2);
    float *f = malloc(count * 4);
    HCT_REQUIRE(h && f, "no memory");
    hc_cu_dptr_t db, df, dk;
    GPU_OK(cu->mem_alloc(&db, count * 2));
    GPU_OK(cu->mem_alloc(&df, count * 4));
    GPU_OK(cu->mem_alloc(&dk, 4));
    for (size_t i = 0; i < count; i++)
        h[i] = 0x78e2; /* 40000 */
    GPU_OK(cu->memcpy_htod_async(db, h, count * 2, stream));
    HCT_OK(comm, hcoll_allreduce(comm, (void *)(uintptr_t)db, (void *)(uintptr_t)db, count,
                                 HCOLL_FLOAT16, HCOLL_AVG, stream));
    GPU_OK(cu->memcpy_dtoh_async(h, db, count * 2, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < count; i++)
        HCT_REQUIRE(h[i] == 0x78e2, "rank %d: GPUDirect fp16 AVG of 40000: element %zu is 0x%04x",
                    rank, i, h[i]);
    float s = (float)(rank + 1) / 4.0f;
    GPU_OK(cu->memcpy_htod_async(dk, &s, 4, stream));
    for (int how = 0; how < 2; how++) {
        hcoll_op_t op;
        HCT_OK(comm, hcoll_op_create_premul_sum(
                         comm, how ? (void *)(uintptr_t)dk : (void *)&s, HCOLL_FLOAT32,
                         how ? HCOLL_SCALAR_DEVICE : HCOLL_SCALAR_HOST_IMMEDIATE, &op));
        for (size_t i = 0; i < count; i++)
            f[i] = (float)val(rank, i);
        GPU_OK(cu->memcpy_htod_async(df, f, count * 4, stream));
        HCT_OK(comm, hcoll_allreduce(comm, (void *)(uintptr_t)df, (void *)(uintptr_t)df, count,
                                     HCOLL_FLOAT32, op, stream));
        GPU_OK(cu->memcpy_dtoh_async(f, df, count * 4, stream));
        GPU_OK(cu->stream_synchronize(stream));
        HCT_OK(comm, hcoll_op_destroy(comm, op));
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += (float)(r + 1) / 4.0f * (float)val(r, i);
            HCT_REQUIRE(f[i] == want, "rank %d: GPUDirect PREMUL_SUM (%s scalar): element %zu "
                        "is %g, want %g", rank, how ? "device" : "host", i, f[i], want);
        }
    }
    GPU_OK(cu->mem_free(db));
    GPU_OK(cu->mem_free(df));
    GPU_OK(cu->mem_free(dk));
    free(h);
    free(f);
    return 0;
}

/* Device broadcasts from every root over the GPUDirect ring (the chain
 * on device memory; with 2 per node, NCCL's broadcast on the root's node
 * and all-gather on the others): 1, 7 and 300007 floats, bit for bit. */
static int api_device_bcast(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                            int n)
{
    static const size_t counts[] = { 1, 7, 300007 };
    for (int root = 0; root < n; root++)
        for (size_t k = 0; k < 3; k++) {
            const size_t bytes = counts[k] * 4;
            unsigned char *h = malloc(bytes);
            HCT_REQUIRE(h, "no memory");
            for (size_t i = 0; i < bytes; i++)
                h[i] = rank == root ? (unsigned char)(i * 29 + (size_t)root) : 0xee;
            hc_cu_dptr_t d;
            GPU_OK(cu->mem_alloc(&d, bytes));
            GPU_OK(cu->memcpy_htod_async(d, h, bytes, stream));
            void *p = (void *)(uintptr_t)d;
            HCT_OK(comm, hcoll_broadcast(comm, p, p, counts[k], HCOLL_FLOAT32, root, stream));
            GPU_OK(cu->memcpy_dtoh_async(h, d, bytes, stream));
            GPU_OK(cu->stream_synchronize(stream));
            for (size_t i = 0; i < bytes; i++)
                HCT_REQUIRE(h[i] == (unsigned char)(i * 29 + (size_t)root),
                            "rank %d: GPUDirect broadcast of %zu floats from %d: byte %zu is "
                            "0x%02x", rank, counts[k], root, i, h[i]);
            GPU_OK(cu->mem_free(d));
            free(h);
        }
    return 0;
}

/* Device reduce-scatter (SUM) and all-gather over the GPUDirect ring
 * (with 2 per node: NCCL's reduce-scatter / all-gather of the permuted
 * vector around it): 1 and 70001 floats per rank, bit for bit. */
static int api_device_rsag(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                           int n)
{
    static const size_t counts[] = { 1, 70001 };
    for (size_t k = 0; k < 2; k++) {
        const size_t B = counts[k], all = (size_t)n * B;
        float *h = malloc(all * 4);
        HCT_REQUIRE(h, "no memory");
        hc_cu_dptr_t ds, dr;
        GPU_OK(cu->mem_alloc(&ds, all * 4));
        GPU_OK(cu->mem_alloc(&dr, all * 4));
        for (size_t i = 0; i < all; i++)
            h[i] = (float)val(rank, i);
        GPU_OK(cu->memcpy_htod_async(ds, h, all * 4, stream));
        HCT_OK(comm, hcoll_reduce_scatter(comm, (void *)(uintptr_t)ds, (void *)(uintptr_t)dr, B,
                                          HCOLL_FLOAT32, HCOLL_SUM, stream));
        GPU_OK(cu->memcpy_dtoh_async(h, dr, B * 4, stream));
        GPU_OK(cu->stream_synchronize(stream));
        for (size_t i = 0; i < B; i++)
            HCT_REQUIRE(h[i] == (float)ref(HCOLL_SUM, n, (size_t)rank * B + i),
                        "rank %d: GPUDirect reduce_scatter of %zu: element %zu is %g", rank, B,
                        i, h[i]);
        for (size_t i = 0; i < B; i++)
            h[i] = (float)val(rank, i);
        GPU_OK(cu->memcpy_htod_async(ds, h, B * 4, stream));
        HCT_OK(comm, hcoll_allgather(comm, (void *)(uintptr_t)ds, (void *)(uintptr_t)dr, B,
                                     HCOLL_FLOAT32, stream));
        GPU_OK(cu->memcpy_dtoh_async(h, dr, all * 4, stream));
        GPU_OK(cu->stream_synchronize(stream));
        for (size_t i = 0; i < all; i++)
            HCT_REQUIRE(h[i] == (float)val((int)(i / B), i % B),
                        "rank %d: GPUDirect allgather of %zu: element %zu is %g", rank, B, i,
                        h[i]);
        GPU_OK(cu->mem_free(ds));
        GPU_OK(cu->mem_free(dr));
        free(h);
    }
    return 0;
}

static void run_api_device_q(int n, int per_node, int dmabuf, int one_queue)
{
    char cuda[PATH_MAX];
    if (!hct_mock_cuda_built(cuda, sizeof cuda)) {
        printf("SKIP: api_device: needs the emulated CUDA driver (%s)\n", cuda);
        return;
    }
    api_arg_t *a = api_arg_new();
    a->per_node = per_node;
    a->dmabuf = dmabuf;
    a->one_queue = one_queue;
    hct_opts_t o = { .nranks = n, .ranks_per_node = per_node,
                     .timeout_ms = one_queue ? 30000 : 60000 };
    hct_result_t res[MAXR];
    double t0 = hct_now_ms();
    int bad = hct_run(&o, rank_api_device, a, res);
    fprintf(stderr, "api device %d ranks, %d per node: %.1f s\n", n, per_node,
            (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
    /* Every rank says that stage 2 ran on device memory, with GPUDirect. */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "grep -l 'stage 2 on device memory (GPUDirect RDMA)' %s/rank.*.log | wc -l",
             a->logdir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int nlogs = 0;
    ck_assert_int_eq(fscanf(p, "%d", &nlogs), 1);
    pclose(p);
    ck_assert_msg(nlogs == n, "%d of %d ranks logged stage 2 on device memory (logs in %s)",
                  nlogs, n, a->logdir);
    if (dmabuf) {
        /* dma-buf was chosen, its export failed, peermem took over. */
        snprintf(cmd, sizeof cmd, "grep -l 'nvidia-peermem instead' %s/rank.*.log | wc -l",
                 a->logdir);
        p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        ck_assert_int_eq(fscanf(p, "%d", &nlogs), 1);
        pclose(p);
        ck_assert_msg(nlogs == n, "%d of %d ranks fell back from dma-buf to peermem (logs in %s)",
                      nlogs, n, a->logdir);
    }
    api_arg_free(a);
}

static void run_api_device(int n, int per_node, int dmabuf)
{
    run_api_device_q(n, per_node, dmabuf, 0);
}

START_TEST(api_device_gdr_2) { run_api_device(2, 1, 0); }
END_TEST

/* The GPU says dma-buf, the export fails: registration falls back to
 * nvidia-peermem instead of failing. */
START_TEST(api_device_gdr_dmabuf_fallback) { run_api_device(2, 1, 1); }
END_TEST

/* Two GPUs and NICs per node: NCCL (emulated) for the intra-node stages,
 * one GPUDirect ring per rail. */
START_TEST(api_device_gdr_2x2) { run_api_device(4, 2, 0); }
END_TEST

/* The GPUDirect all-reduce, reduce-scatter and all-gather with every
 * stream on one in-order hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, as
 * Megatron-LM sets): the ring's reductions are enqueued at call time
 * behind gates that the ring opens as messages land, so nothing waits for
 * work submitted after it (test_gpu_queues covers the staged plans). */
START_TEST(api_device_gdr_one_queue_2) { run_api_device_q(2, 1, 0, 1); }
END_TEST
START_TEST(api_device_gdr_one_queue_2x2) { run_api_device_q(4, 2, 0, 1); }
END_TEST

static void *killer(void *p)
{
    api_arg_t *a = p;
    usleep(3000);
    a->kill_ms = hct_now_ms();
    raise(SIGKILL);
    return NULL;
}

#define KILL_TIMEOUT_MS 3000

static int rank_api_kill(int rank, int n, void *argp)
{
    api_arg_t *a = argp;
    api_env(a->logdir);
    hcoll_comm_t comm;
    if (open_comm(a, rank, n, KILL_TIMEOUT_MS, &comm))
        return 1;
    const size_t count = 1u << 20;
    float *buf = malloc(count * sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    for (size_t i = 0; i < count; i++)
        buf[i] = (float)(i % 5);
    for (int it = 0; it < 40; it++) {
        if (rank == a->kill_victim && it == 2) {
            pthread_t th;
            HCT_REQUIRE(pthread_create(&th, NULL, killer, a) == 0, "pthread_create");
        }
        hcoll_status_t st = hcoll_allreduce(comm, buf, buf, count, HCOLL_FLOAT32, HCOLL_MAX, NULL);
        if (st == HCOLL_SUCCESS)
            continue;
        a->noticed_ms[rank] = hct_now_ms();
        snprintf(a->msg[rank], sizeof a->msg[rank], "%s", hcoll_comm_last_error(comm));
        HCT_REQUIRE(rank != a->kill_victim, "victim failed first: %s", a->msg[rank]);
        HCT_REQUIRE(a->kill_ms > 0, "failed before the kill: %s", a->msg[rank]);
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_NETWORK ||
                        st == HCOLL_ERR_RDMA || st == HCOLL_ERR_TIMEOUT,
                    "rank %d: %s", rank, a->msg[rank]);
        hcoll_comm_destroy(comm);
        free(buf);
        char who[32];
        snprintf(who, sizeof who, "survivor %d", rank);
        return hct_mock_released(who);
    }
    HCT_REQUIRE(0, "rank %d: 40 all-reduces and no failure", rank);
}

START_TEST(api_peer_killed)
{
    setenv("HCMOCK_IB_RETRY_MS", "1000", 1);
    api_arg_t *a = api_arg_new();
    a->kill_victim = 2;
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 1, .timeout_ms = 40000 };
    hct_result_t res[MAXR];
    hct_run(&o, rank_api_kill, a, res);
    ck_assert_msg(res[2].signaled && res[2].sig == SIGKILL, "the victim did not die of SIGKILL");
    for (int r = 0; r < 4; r++) {
        if (r == 2)
            continue;
        double dt = a->noticed_ms[r] - a->kill_ms;
        fprintf(stderr, "api_peer_killed: rank %d failed %.0f ms after the kill: %s\n", r, dt,
                a->msg[r]);
        ck_assert_msg(res[r].exited && res[r].code == 0, "survivor %d failed: %s", r, a->msg[r]);
        ck_assert_msg(dt <= KILL_TIMEOUT_MS + 1000, "rank %d noticed after %.0f ms", r, dt);
        /* The message names a cause, not just a status. */
        ck_assert_msg(strstr(a->msg[r], "rank") &&
                          (strstr(a->msg[r], "retry counter exceeded") ||
                           strstr(a->msg[r], "flushed") || strstr(a->msg[r], "closed") ||
                           strstr(a->msg[r], "no progress") || strstr(a->msg[r], "reset") ||
                           strstr(a->msg[r], "failed")),
                      "rank %d: %s", r, a->msg[r]);
    }
    api_arg_free(a);
    unsetenv("HCMOCK_IB_RETRY_MS");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* live_*: liveness over verbs, where the RC retry limit alone takes ~34 s   */
/* (HCMOCK_IB_RETRY_MS lets the emulation wait that long): a stopped rank is */
/* found within HCOLL_LIVENESS_MS + 1 s, a killed one within 1 s.            */
/* ------------------------------------------------------------------------ */

#define LIVE_MS 2000

static int rank_api_live(int rank, int n, void *argp)
{
    api_arg_t *a = argp;
    api_env(a->logdir);
    setenv("HCOLL_LIVENESS_MS", "2000", 1);
    hcoll_comm_t comm;
    if (open_comm(a, rank, n, 20000, &comm))
        return 1;
    const size_t count = 1u << 18;
    float *buf = malloc(count * sizeof *buf);
    HCT_REQUIRE(buf, "no memory");
    for (int it = 0; it < 100000; it++) {
        if (rank == a->kill_victim && it == 2) {
            a->ready = 1;
            for (;;)
                pause(); /* stopped, then killed, by the parent */
        }
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)(i % 5);
        hcoll_status_t st = hcoll_allreduce(comm, buf, buf, count, HCOLL_FLOAT32, HCOLL_MAX, NULL);
        if (st == HCOLL_SUCCESS)
            continue;
        a->noticed_ms[rank] = hct_now_ms();
        snprintf(a->msg[rank], sizeof a->msg[rank], "%s", hcoll_comm_last_error(comm));
        HCT_REQUIRE(a->kill_ms > 0, "failed before the fault: %s", a->msg[rank]);
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED || st == HCOLL_ERR_RDMA, "rank %d: %s", rank,
                    a->msg[rank]);
        break;
    }
    hcoll_comm_destroy(comm);
    free(buf);
    a->done[rank] = 1;
    return 0;
}

static void live_parent(const pid_t *pids, int n, void *argp)
{
    api_arg_t *a = argp;
    const double deadline = hct_now_ms() + 30000;
    while (!a->ready && hct_now_ms() < deadline)
        usleep(1000);
    usleep(200000); /* the survivors are in their third call */
    a->kill_ms = hct_now_ms();
    kill(pids[a->kill_victim], a->fault_sig);
    for (int r = 0; r < n; r++)
        while (r != a->kill_victim && !a->done[r] && hct_now_ms() < deadline)
            usleep(1000);
    kill(pids[a->kill_victim], SIGKILL); /* stopped or not, it goes now */
}

static void run_api_live(int sig, double bound_ms)
{
    setenv("HCMOCK_IB_RETRY_MS", "60000", 1);
    api_arg_t *a = api_arg_new();
    a->kill_victim = 2;
    a->fault_sig = sig;
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 1, .timeout_ms = 40000,
                     .on_started = live_parent };
    hct_result_t res[MAXR];
    hct_run(&o, rank_api_live, a, res);
    int named = 0;
    for (int r = 0; r < 4; r++) {
        if (r == a->kill_victim)
            continue;
        double dt = a->noticed_ms[r] - a->kill_ms;
        fprintf(stderr, "live signal %d: rank %d failed %.0f ms after the fault: %s\n", sig, r,
                dt, a->msg[r]);
        ck_assert_msg(res[r].exited && res[r].code == 0, "survivor %d failed: %s", r, a->msg[r]);
        ck_assert_msg(dt >= 0 && dt <= bound_ms, "rank %d noticed after %.0f ms", r, dt);
        /* The rail by its NIC, not by the IP interface of its address. */
        named += strstr(a->msg[r], "rank 2") && strstr(a->msg[r], "rail 0 (mlx5_bond_0 port 1");
    }
    ck_assert_msg(named > 0, "no survivor named rank 2 and its rail's NIC (rail 0 (mlx5_bond_0 "
                  "port 1...))");
    api_arg_free(a);
    unsetenv("HCMOCK_IB_RETRY_MS");
}

START_TEST(live_peer_stopped) { run_api_live(SIGSTOP, LIVE_MS + 1000); }
END_TEST

START_TEST(live_peer_killed) { run_api_live(SIGKILL, 1000); }
END_TEST

/* ------------------------------------------------------------------------ */
/* regress_*: library bugs this emulation exposed, one case each; each      */
/* failed before its fix.                                                     */
/* ------------------------------------------------------------------------ */

/* const void *sendbuf may be read-only memory, which a NIC cannot pin
 * writable: registering every buffer with LOCAL_WRITE | REMOTE_WRITE
 * failed on it. */
static int rank_ro_sendbuf(int rank, int n, void *argp)
{
    api_arg_t *a = argp;
    api_env(a->logdir);
    hcoll_comm_t comm;
    if (open_comm(a, rank, n, 10000, &comm))
        return 1;
    const size_t count = 1u << 18;
    float *in = mmap(NULL, count * 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    HCT_REQUIRE(in != MAP_FAILED, "mmap");
    for (size_t i = 0; i < count; i++)
        in[i] = (float)(i % 3);
    HCT_REQUIRE(mprotect(in, count * 4, PROT_READ) == 0, "mprotect");
    float *out = malloc(count * 4);
    HCT_OK(comm, hcoll_allreduce(comm, in, out, count, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    HCT_REQUIRE(out[count - 1] == (float)((count - 1) % 3) * (float)n, "result");
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(regress_readonly_sendbuf)
{
    api_arg_t *a = api_arg_new();
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_ro_sendbuf, a, res), 0);
    api_arg_free(a);
}
END_TEST

/* HCOLL_NET=auto must fall back to TCP when a rank's own NIC cannot do
 * RoCE: on sysfs-roce, local rank 2 gets mlx5_bond_2 (link-local GIDs
 * only); asking about local rank 0's NIC alone picked verbs for all. */
static int rank_auto(int rank, int n, void *argp)
{
    api_arg_t *a = argp;
    api_env(a->logdir);
    setenv("HCOLL_NET", "auto", 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 10000;
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, n, rank, &id, &cfg));
    float v = 1;
    HCT_OK(comm, hcoll_allreduce(comm, &v, &v, 1, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    HCT_REQUIRE(v == (float)n, "result %f", v);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(regress_auto_per_rank_nic)
{
    api_arg_t *a = api_arg_new();
    hct_opts_t o = { .nranks = 6, .ranks_per_node = 3, .timeout_ms = 30000 };
    hct_result_t res[6];
    ck_assert_int_eq(hct_run(&o, rank_auto, a, res), 0);
    api_arg_free(a);
}
END_TEST

/* A failing rank must tell its peers: a peer with nothing in flight
 * towards it never notices destroyed QPs, and survivors two hops away
 * waited for the whole HCOLL_TIMEOUT_MS, where TCP's resets make it
 * milliseconds (the bound test_allreduce's kill tests hold TCP to: half
 * the timeout). */
START_TEST(regress_failure_not_propagated)
{
    setenv("HCMOCK_IB_RETRY_MS", "1000", 1);
    api_arg_t *a = api_arg_new();
    a->kill_victim = 2;
    hct_opts_t o = { .nranks = 4, .ranks_per_node = 1, .timeout_ms = 40000 };
    hct_result_t res[MAXR];
    hct_run(&o, rank_api_kill, a, res);
    for (int r = 0; r < 4; r++) {
        if (r == 2)
            continue;
        double dt = a->noticed_ms[r] - a->kill_ms;
        ck_assert_msg(dt <= KILL_TIMEOUT_MS / 2, "rank %d noticed after %.0f ms: %s", r, dt,
                      a->msg[r]);
    }
    api_arg_free(a);
    unsetenv("HCMOCK_IB_RETRY_MS");
}
END_TEST

/* A host-only job over HCOLL_NET=ib must not load and initialise the CUDA
 * driver (gdr.h: "host-only programs never pay for cuInit"), as asking
 * hc_gdr_ptr_kind about every registered buffer did (it dlopens
 * libcuda.so.1 and calls cuInit). TCP never did. */
static int rank_no_cuda(int rank, int n, void *argp)
{
    api_arg_t *a = argp;
    api_env(a->logdir);
    hcoll_comm_t comm;
    if (open_comm(a, rank, n, 10000, &comm))
        return 1;
    static float b[1 << 18];
    HCT_OK(comm, hcoll_allreduce(comm, b, b, 1 << 18, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
    HCT_REQUIRE(!h, "rank %d: a host-only all-reduce over verbs loaded libcuda.so.1", rank);
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(regress_host_only_loads_cuda)
{
    api_arg_t *a = api_arg_new();
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[MAXR];
    ck_assert_int_eq(hct_run(&o, rank_no_cuda, a, res), 0);
    api_arg_free(a);
}
END_TEST

/* ------------------------------------------------------------------------ */

static Suite *suite(void)
{
    Suite *s = suite_create("ib_api");
    TCase *a = tcase_create("api");
    tcase_set_timeout(a, TEST_TIMEOUT_S);
    tcase_add_test(a, api_allreduce_2);
    tcase_add_test(a, api_allreduce_4);
    tcase_add_test(a, api_device_gdr_2);
    tcase_add_test(a, api_device_gdr_2x2);
    tcase_add_test(a, api_device_gdr_dmabuf_fallback);
    tcase_add_test(a, api_device_gdr_one_queue_2);
    tcase_add_test(a, api_device_gdr_one_queue_2x2);
    tcase_add_test(a, api_allreduce_2x2);
    tcase_add_test(a, api_peer_killed);
    tcase_add_test(a, live_peer_stopped);
    tcase_add_test(a, live_peer_killed);
    tcase_add_test(a, qps_per_peer_2);
    tcase_add_test(a, qps_per_peer_4);
    suite_add_tcase(s, a);
    TCase *b = tcase_create("regress");
    tcase_set_timeout(b, TEST_TIMEOUT_S);
    tcase_add_test(b, regress_readonly_sendbuf);
    tcase_add_test(b, regress_auto_per_rank_nic);
    tcase_add_test(b, regress_failure_not_propagated);
    tcase_add_test(b, regress_host_only_loads_cuda);
    suite_add_tcase(s, b);
    return s;
}

int main(int argc, char **argv)
{
    (void)argc;
    int rc = hct_mockib_enter(argv);
    if (rc != 0)
        return rc;
    return hct_mockib_run(suite());
}

#else /* !HCOLL_BUILD_VERBS */

int main(void)
{
    printf("SKIP: hcoll was built without rdma-core headers: no verbs transport to test\n");
    return 77;
}

#endif
