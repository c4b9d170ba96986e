/*
 * A registration that fails fails that call only (issue 19 item 3), on the
 * emulated libibverbs (HCOLL_NET=ib) through the public API.
 *
 * One rank (the last, on another node than rank 0) has every registration
 * refused during one call (HCMOCK_IB_REG_FAIL: ENOMEM as a locked-memory
 * limit gives, or EOPNOTSUPP), at each place a call registers in turn:
 *   host   the three-stage all-reduce's pipelined shards, the ring plan's
 *          buffers, the reduce-scatter's and all-gather's permuted vector
 *          (per piece), the broadcast chain's shard: each in the ring's
 *          stage (and the permuted vector kept registered), so each kind
 *          runs on a new communicator, whose first call registers them
 * on 2x2 (three stages, several pieces) and 3x1 (the ring of every rank).
 *   device (emulated CUDA driver, staged through pinned host memory): the
 *          staging buffers, registered at the device path's set-up (the
 *          first device call), which then fails on every rank, naming the
 *          registration; host calls go on
 *   device on GPUDirect rings: the caller's buffer (or, reduce-scatter and
 *          all-gather with three stages, hcoll's permuted vector),
 *          registered when the worker's ring starts: the ring voids the
 *          call; on 3x1, and on 2x2 / 3x2 (three stages: the node's other
 *          rails hear it in a node barrier at the call's end), each
 *          collective as an _async call, whose request fails
 * Every rank must return an error, the odd rank's message naming the
 * registration and the others' naming that rank and the registration; no
 * recvbuf may change; and the next 3 calls of that kind on the same
 * communicator must succeed bit for bit (integers).
 *
 * Before the fix the three-stage all-reduce, the reduce-scatter and the
 * all-gather registered inside the running ring: the failure broke the
 * ring, and every later call failed.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"
#include "hcoll.h"

#if HCOLL_BUILD_VERBS

#define TEST_TIMEOUT_S 120
#define MAX_RANKS 6
#define SENTINEL 0x5a5a5a5a
#define AR_COUNT (96 * 1024 + 5) /* int32: past HCOLL_SMALL_BYTES, many pieces */
#define RSAG_COUNT 20003         /* int32 per rank */
#define BC_BYTES (300 * 1024 + 3)

enum kind { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST, K_COUNT };
static const char *const kind_name[K_COUNT] = { "allreduce", "reduce_scatter", "allgather",
                                                "broadcast" };

typedef struct world {
    hct_id_slot_t slot;
    hct_id_slot_t kslot[K_COUNT]; /* a communicator per kind (host; device, three stages) */
    int noagree;      /* HCOLL_CHECK_ARGS=0: the ring voids the call */
    int noloop;       /* device: the NIC refuses the GPUDirect flush QP */
    int per_node;     /* device, three stages: ranks (GPUs, NICs) per node */
    char logdir[64];  /* device cases: each rank's log */
} world_t;

static uint64_t mock_stat(const char *name)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    uint64_t (*stat)(const char *) = h ? (uint64_t(*)(const char *))dlsym(h, "hcmock_verbs_stat")
                                       : NULL;
    uint64_t v = stat ? stat(name) : UINT64_MAX;
    if (h)
        dlclose(h);
    return v;
}

static int32_t val(int rank, size_t i, int it)
{
    return (int32_t)((size_t)rank * 7 + i % 1009 + (size_t)it * 3);
}

/* Fresh inputs of a call of kind k (iteration it) in in, and out (the
 * output) SENTINEL first; a broadcast works in out alone. */
static void fill(enum kind k, int rank, int nranks, int it, int32_t *in, int32_t *out)
{
    switch (k) {
    case K_ALLREDUCE:
        for (size_t i = 0; i < AR_COUNT; i++) {
            in[i] = val(rank, i, it);
            out[i] = SENTINEL;
        }
        break;
    case K_REDUCE_SCATTER:
        for (size_t i = 0; i < (size_t)nranks * RSAG_COUNT; i++)
            in[i] = val(rank, i, it);
        for (size_t i = 0; i < RSAG_COUNT; i++)
            out[i] = SENTINEL;
        break;
    case K_ALLGATHER:
        for (size_t i = 0; i < RSAG_COUNT; i++)
            in[i] = val(rank, i, it);
        for (size_t i = 0; i < (size_t)nranks * RSAG_COUNT; i++)
            out[i] = SENTINEL;
        break;
    default: {
        unsigned char *o = (unsigned char *)out;
        for (size_t i = 0; i < BC_BYTES; i++)
            o[i] = rank == 0 ? (unsigned char)(i * 13 + (size_t)it) : 0x5a;
    }
    }
}

/* The bytes of in and out that a call of kind k uses. */
static size_t in_bytes(enum kind k, int nranks)
{
    return k == K_ALLREDUCE        ? AR_COUNT * sizeof(int32_t)
           : k == K_REDUCE_SCATTER ? (size_t)nranks * RSAG_COUNT * sizeof(int32_t)
           : k == K_ALLGATHER      ? RSAG_COUNT * sizeof(int32_t)
                                   : 0;
}

static size_t out_bytes(enum kind k, int nranks)
{
    return k == K_ALLREDUCE        ? AR_COUNT * sizeof(int32_t)
           : k == K_REDUCE_SCATTER ? RSAG_COUNT * sizeof(int32_t)
           : k == K_ALLGATHER      ? (size_t)nranks * RSAG_COUNT * sizeof(int32_t)
                                   : BC_BYTES;
}

/* Call kind k on in and out (host or device buffers, stream NULL or
 * not), blocking where req is NULL, else _async into *req. */
static hcoll_status_t issue(hcoll_comm_t comm, enum kind k, void *in, void *out, void *stream,
                            hcoll_request_t *req)
{
    switch (k) {
    case K_ALLREDUCE:
        return req ? hcoll_allreduce_async(comm, in, out, AR_COUNT, HCOLL_INT32, HCOLL_SUM,
                                           stream, req)
                   : hcoll_allreduce(comm, in, out, AR_COUNT, HCOLL_INT32, HCOLL_SUM, stream);
    case K_REDUCE_SCATTER:
        return req ? hcoll_reduce_scatter_async(comm, in, out, RSAG_COUNT, HCOLL_INT32,
                                                HCOLL_SUM, stream, req)
                   : hcoll_reduce_scatter(comm, in, out, RSAG_COUNT, HCOLL_INT32, HCOLL_SUM,
                                          stream);
    case K_ALLGATHER:
        return req ? hcoll_allgather_async(comm, in, out, RSAG_COUNT, HCOLL_INT32, stream, req)
                   : hcoll_allgather(comm, in, out, RSAG_COUNT, HCOLL_INT32, stream);
    default:
        /* Rooted at rank 0: the chain reaches the odd rank's node last. */
        return req ? hcoll_broadcast_async(comm, out, out, BC_BYTES, HCOLL_UINT8, 0, stream, req)
                   : hcoll_broadcast(comm, out, out, BC_BYTES, HCOLL_UINT8, 0, stream);
    }
}

/* One host call of kind k (iteration it), with fresh inputs; returns its
 * status. */
static hcoll_status_t call(hcoll_comm_t comm, enum kind k, int rank, int nranks, int it,
                           int32_t *in, int32_t *out)
{
    fill(k, rank, nranks, it, in, out);
    return issue(comm, k, in, out, NULL, NULL);
}

/* The output of a call that went through, exactly. */
static int check_ok(enum kind k, int rank, int nranks, int it, const int32_t *out)
{
    switch (k) {
    case K_ALLREDUCE:
        for (size_t i = 0; i < AR_COUNT; i++) {
            int32_t want = 0;
            for (int r = 0; r < nranks; r++)
                want += val(r, i, it);
            HCT_REQUIRE(out[i] == want, "rank %d: allreduce %d: [%zu] = %d, want %d", rank, it, i,
                        out[i], want);
        }
        break;
    case K_REDUCE_SCATTER:
        for (size_t i = 0; i < RSAG_COUNT; i++) {
            int32_t want = 0;
            for (int r = 0; r < nranks; r++)
                want += val(r, (size_t)rank * RSAG_COUNT + i, it);
            HCT_REQUIRE(out[i] == want, "rank %d: reduce_scatter %d: [%zu] = %d, want %d", rank,
                        it, i, out[i], want);
        }
        break;
    case K_ALLGATHER:
        for (size_t i = 0; i < (size_t)nranks * RSAG_COUNT; i++) {
            const int32_t want = val((int)(i / RSAG_COUNT), i % RSAG_COUNT, it);
            HCT_REQUIRE(out[i] == want, "rank %d: allgather %d: [%zu] = %d, want %d", rank, it, i,
                        out[i], want);
        }
        break;
    default: {
        const unsigned char *o = (const unsigned char *)out;
        for (size_t i = 0; i < BC_BYTES; i++)
            HCT_REQUIRE(o[i] == (unsigned char)(i * 13 + (size_t)it),
                        "rank %d: broadcast %d: byte %zu is %u", rank, it, i, o[i]);
    }
    }
    return 0;
}

/* After the failed call: recvbuf as it was (nothing moved). */
static int check_untouched(enum kind k, int rank, int nranks, const int32_t *out)
{
    if (k == K_BROADCAST) {
        const unsigned char *o = (const unsigned char *)out;
        for (size_t i = 0; i < BC_BYTES && rank != 0; i++)
            HCT_REQUIRE(o[i] == 0x5a, "rank %d: broadcast: byte %zu is %u after the failure",
                        rank, i, o[i]);
        return 0;
    }
    const size_t n = k == K_ALLREDUCE    ? AR_COUNT
                     : k == K_ALLGATHER ? (size_t)nranks * RSAG_COUNT
                                        : RSAG_COUNT;
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(out[i] == SENTINEL, "rank %d: %s: recvbuf[%zu] is %d after the failure", rank,
                    kind_name[k], i, out[i]);
    return 0;
}

/* A call with rank odd's registrations refused (errno err) failed on this
 * rank as it should: the odd rank's message names the registration, the
 * others' name that rank and the registration. */
static int failed_alike(hcoll_comm_t comm, hcoll_status_t st, const char *what, int rank, int odd,
                        int err)
{
    const char *msg = hcoll_comm_last_error(comm);
    fprintf(stderr, "rank %d: %s with rank %d's registrations refused (%s): %s: %s\n", rank,
            what, odd, strerror(err), hcoll_status_name(st), msg);
    HCT_REQUIRE(st != HCOLL_SUCCESS, "rank %d: %s went through", rank, what);
    char want[64];
    snprintf(want, sizeof want, "rank %d could not take part", odd);
    HCT_REQUIRE(rank == odd ? strstr(msg, "registering") && strstr(msg, strerror(err))
                            : strstr(msg, want) && strstr(msg, "registering its buffers"),
                "rank %d: %s: the message does not name the registration: %s", rank, what, msg);
    return 0;
}

static int rank_host(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    if (w->noagree)
        setenv("HCOLL_CHECK_ARGS", "0", 1);
    setenv("HCOLL_NET", "ib", 1);
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 20000;
    cfg.net = "ib";
    cfg.chunk_bytes = 4096; /* pieces of 32 KiB on 2x2: many of them */
    const int odd = nranks - 1;
    const size_t cap = (size_t)nranks * RSAG_COUNT > AR_COUNT ? (size_t)nranks * RSAG_COUNT
                                                              : AR_COUNT;
    int32_t *in = malloc(cap * sizeof *in), *out = malloc(cap * sizeof *out + BC_BYTES);
    HCT_REQUIRE(in && out, "no memory");
    /* Each kind on a new communicator: what a call registers once and
     * keeps (the ring's stage, hcoll's own permuted vector) is then
     * registered in the refused call. */
    for (int k = 0; k < K_COUNT; k++) {
        hcoll_comm_t comm;
        HCT_REQUIRE(hct_share_unique_id(&w->kslot[k], rank, 20000, &id) == 0,
                    "no unique id");
        HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
        const int err = k % 2 ? EOPNOTSUPP : ENOMEM;
        char inj[16];
        snprintf(inj, sizeof inj, "%d", err);
        const uint64_t before = mock_stat("injected_reg_failures");
        if (rank == odd)
            setenv("HCMOCK_IB_REG_FAIL", inj, 1);
        hcoll_status_t st = call(comm, (enum kind)k, rank, nranks, 0, in, out);
        unsetenv("HCMOCK_IB_REG_FAIL");
        if (failed_alike(comm, st, kind_name[k], rank, odd, err))
            return 1;
        HCT_REQUIRE(rank != odd || mock_stat("injected_reg_failures") > before,
                    "rank %d: %s registered nothing", rank, kind_name[k]);
        /* Without the agreement the ring ran (void): recvbuf is undefined. */
        if (!w->noagree && check_untouched((enum kind)k, rank, nranks, out))
            return 1;
        hcoll_status_t ae = HCOLL_ERR_INTERNAL;
        HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
        HCT_REQUIRE(ae == HCOLL_SUCCESS, "rank %d: %s: the communicator failed: %s", rank,
                    kind_name[k], hcoll_status_name(ae));
        /* The same communicator goes on. */
        for (int it = 1; it <= 3; it++) {
            HCT_OK(comm, call(comm, (enum kind)k, rank, nranks, it, in, out));
            if (check_ok((enum kind)k, rank, nranks, it, out))
                return 1;
        }
        HCT_OK(comm, hcoll_comm_destroy(comm));
    }
    free(in);
    free(out);
    return 0;
}

static void run_host(int nranks, int per_node, int noagree)
{
    world_t *w = hct_shared_alloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    w->noagree = noagree;
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = per_node, .timeout_ms = 90000 };
    hct_result_t res[MAX_RANKS];
    const double t0 = hct_now_ms();
    int bad = hct_run(&o, rank_host, w, res);
    fprintf(stderr, "[time] %dx%d: %.1f s\n", nranks / per_node, per_node,
            (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
    hct_shared_free(w, sizeof *w);
}

START_TEST(regfail_host_2x2)
{
    run_host(4, 2, 0);
}
END_TEST

START_TEST(regfail_host_3x1)
{
    run_host(3, 1, 0);
}
END_TEST

/* HCOLL_CHECK_ARGS=0: nothing pinned ahead, no agreement; the refusal
 * comes inside the running ring, which voids that operation (every rank
 * fails it, naming the rank) and goes on. Before: the ring broke, and with
 * it the communicator. With several ranks per node (three stages) only
 * the odd rank's rail hears the void; its ranks tell their nodes' others
 * through the node's closing step: every rank of every node fails the
 * call, with the message, and the next calls are exact. Before that, the
 * other rails finished their part and the communicator ended. */
START_TEST(regfail_host_noagree_2x2)
{
    run_host(4, 2, 1);
}
END_TEST

START_TEST(regfail_host_noagree_3x2)
{
    run_host(6, 2, 1);
}
END_TEST

START_TEST(regfail_host_noagree_3x1)
{
    run_host(3, 1, 1);
}
END_TEST

/* ---- device buffers, staged ---------------------------------------------- */

static int rank_dev_staged(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    setenv("HCOLL_NET", "ib", 1);
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    setenv("HCOLL_SYSFS_ROOT", "tests/fixtures/sysfs-mockib", 1);
    setenv("HCMOCK_IB_SYSFS", "tests/fixtures/sysfs-mockib", 1);
    setenv("HCOLL_NET_GDR_LEVEL", "LOC", 1); /* stage 2 through host memory */
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu && gpu_mock_driver(), "rank %d: no mock GPU", rank);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 20000;
    cfg.net = "ib";
    HCT_REQUIRE(hct_share_unique_id(&w->slot, rank, 20000, &id) == 0, "no unique id");
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    const int odd = nranks - 1;
    const size_t n = 100000;
    hc_cu_dptr_t d;
    GPU_OK(cu->mem_alloc(&d, n * sizeof(int32_t)));
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    if (rank == odd)
        setenv("HCMOCK_IB_REG_FAIL", "12", 1);
    void *p = (void *)(uintptr_t)d;
    hcoll_status_t st = hcoll_allreduce(comm, p, p, n, HCOLL_INT32, HCOLL_SUM, stream);
    unsetenv("HCMOCK_IB_REG_FAIL");
    const char *msg = hcoll_comm_last_error(comm);
    fprintf(stderr, "rank %d: first device all-reduce, rank %d's registrations refused: %s: %s\n",
            rank, odd, hcoll_status_name(st), msg);
    HCT_REQUIRE(st != HCOLL_SUCCESS, "rank %d: the device set-up went through", rank);
    char want[64];
    snprintf(want, sizeof want, "rank %d could not set up", odd);
    HCT_REQUIRE(rank == odd ? strstr(msg, "registering") != NULL : strstr(msg, want) != NULL,
                "rank %d: the message does not name the registration: %s", rank, msg);
    GPU_OK(cu->stream_synchronize(stream));
    hcoll_status_t ae = HCOLL_ERR_INTERNAL;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "rank %d: the communicator failed: %s (%s)", rank,
                hcoll_status_name(ae), hcoll_comm_last_error(comm));
    /* Host calls go on, bit for bit. */
    int32_t *in = malloc(AR_COUNT * sizeof *in), *out = malloc(AR_COUNT * sizeof *out);
    HCT_REQUIRE(in && out, "no memory");
    for (int it = 1; it <= 3; it++) {
        HCT_OK(comm, call(comm, K_ALLREDUCE, rank, nranks, it, in, out));
        if (check_ok(K_ALLREDUCE, rank, nranks, it, out))
            return 1;
    }
    free(in);
    free(out);
    GPU_OK(cu->stream_destroy(stream));
    GPU_OK(cu->mem_free(d));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(regfail_dev_staged_setup)
{
    char cuda[4096];
    if (!hct_mock_cuda_built(cuda, sizeof cuda)) {
        printf("SKIP: needs the emulated CUDA driver (%s)\n", cuda);
        return;
    }
    world_t *w = hct_shared_alloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 90000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_dev_staged, w, res);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr)", bad);
    hct_shared_free(w, sizeof *w);
}
END_TEST

/* ---- device buffers on the GPUDirect ring -------------------------------- */

/* A device all-reduce of n int32 on d (in place), values of iteration it;
 * 1 when the result is not exact. */
static int dev_fill(const hc_cu_api_t *cu, void *stream, hc_cu_dptr_t d, int32_t *h, size_t n,
                    int rank, int it)
{
    for (size_t i = 0; i < n; i++)
        h[i] = val(rank, i, it);
    GPU_OK(cu->memcpy_htod_async(d, h, n * sizeof *h, stream));
    return 0;
}

static int dev_check(const hc_cu_api_t *cu, void *stream, hc_cu_dptr_t d, int32_t *h, size_t n,
                     int rank, int nranks, int it)
{
    GPU_OK(cu->memcpy_dtoh_async(h, d, n * sizeof *h, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < n; i++) {
        int32_t want = 0;
        for (int r = 0; r < nranks; r++)
            want += val(r, i, it);
        HCT_REQUIRE(h[i] == want, "rank %d: device all-reduce %d: [%zu] = %d, want %d", rank, it,
                    i, h[i], want);
    }
    return 0;
}

/* This rank's log has a line with needle in it. */
static int dev_logged(const world_t *w, int rank, const char *needle)
{
    char path[128], line[512];
    snprintf(path, sizeof path, "%s/rank.%d.log", w->logdir, (int)getpid());
    FILE *f = fopen(path, "r");
    HCT_REQUIRE(f, "rank %d: no log %s", rank, path);
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    HCT_REQUIRE(found, "rank %d: the log %s does not say '%s'", rank, path, needle);
    return 0;
}

/* This rank's log says that stage 2 runs on device memory (GPUDirect). */
static int dev_logged_gdr(const world_t *w, int rank)
{
    return dev_logged(w, rank, "stage 2 on device memory (GPUDirect RDMA)");
}

/* The environment of the GPUDirect cases: each GPU beside its NIC
 * (sysfs-mockib), sm_80 (flush reads), each rank's log in w->logdir. 1
 * where the fixture is missing. */
static int dev_gdr_env(const world_t *w)
{
    if (w->noloop) /* the flush QP cannot be made */
        setenv("HCMOCK_IB_LOOPBACK_FAIL", "95", 1);
    setenv("HCOLL_NET", "ib", 1);
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    setenv("HCOLL_DEBUG", "INFO", 1);
    setenv("HCOLL_DEBUG_SUBSYS", "GDR", 1);
    char path[128];
    snprintf(path, sizeof path, "%s/rank.%%p.log", w->logdir);
    setenv("HCOLL_DEBUG_FILE", path, 1);
    setenv("HCMOCK_CC", "8.0", 1); /* flush reads too */
    char root[4096];
    HCT_REQUIRE(realpath("tests/fixtures/sysfs-mockib", root), "no tests/fixtures/sysfs-mockib");
    setenv("HCOLL_SYSFS_ROOT", root, 1);
    setenv("HCMOCK_IB_SYSFS", root, 1);
    return 0;
}

static int rank_dev_gdr(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    if (dev_gdr_env(w))
        return 1;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu && gpu_mock_driver(), "rank %d: no mock GPU", rank);
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 20000;
    cfg.net = "ib";
    HCT_REQUIRE(hct_share_unique_id(&w->slot, rank, 20000, &id) == 0, "no unique id");
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    const int odd = nranks - 1;
    const size_t n = 100003;
    int32_t *h = malloc(n * sizeof *h);
    HCT_REQUIRE(h, "no memory");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    /* The first device call sets the path up; it runs on the GPUDirect ring. */
    hc_cu_dptr_t a, b;
    GPU_OK(cu->mem_alloc(&a, n * sizeof *h));
    void *ap = (void *)(uintptr_t)a;
    if (dev_fill(cu, stream, a, h, n, rank, 0))
        return 1;
    HCT_OK(comm, hcoll_allreduce(comm, ap, ap, n, HCOLL_INT32, HCOLL_SUM, stream));
    if (dev_check(cu, stream, a, h, n, rank, nranks, 0))
        return 1;
    if (w->noloop) { /* host staging instead, and it works */
        if (dev_logged(w, rank, "no GPUDirect flush reads") ||
            dev_logged(w, rank, "stage 2 staged through pinned host memory"))
            return 1;
        HCT_OK(comm, hcoll_comm_destroy(comm));
        GPU_OK(cu->stream_destroy(stream));
        GPU_OK(cu->mem_free(a));
        free(h);
        return 0;
    }
    if (dev_logged_gdr(w, rank))
        return 1;
    /* A new allocation, which the worker registers when the ring starts:
     * refused on the odd rank. */
    GPU_OK(cu->mem_alloc(&b, n * sizeof *h));
    void *bp = (void *)(uintptr_t)b;
    if (dev_fill(cu, stream, b, h, n, rank, 1))
        return 1;
    const uint64_t before = mock_stat("injected_reg_failures");
    if (rank == odd)
        setenv("HCMOCK_IB_REG_FAIL", "12", 1);
    hcoll_request_t req = NULL;
    HCT_OK(comm, hcoll_allreduce_async(comm, bp, bp, n, HCOLL_INT32, HCOLL_SUM, stream, &req));
    hcoll_status_t st = hcoll_wait(req);
    unsetenv("HCMOCK_IB_REG_FAIL");
    hcoll_request_free(req);
    const char *msg = hcoll_comm_last_error(comm);
    fprintf(stderr, "rank %d: GPUDirect all-reduce, rank %d's registrations refused: %s: %s\n",
            rank, odd, hcoll_status_name(st), msg);
    HCT_REQUIRE(st != HCOLL_SUCCESS, "rank %d: the call went through", rank);
    HCT_REQUIRE(rank != odd || mock_stat("injected_reg_failures") > before,
                "rank %d: nothing was registered", rank);
    char want[64];
    snprintf(want, sizeof want, "rank %d could not take part", odd);
    HCT_REQUIRE(rank == odd ? strstr(msg, "registering") && strstr(msg, strerror(ENOMEM))
                            : strstr(msg, want) && strstr(msg, "registering its buffers"),
                "rank %d: the message does not name the registration: %s", rank, msg);
    GPU_OK(cu->stream_synchronize(stream)); /* released: no gate left shut */
    hcoll_status_t ae = HCOLL_ERR_INTERNAL;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "rank %d: the communicator failed: %s (%s)", rank,
                hcoll_status_name(ae), hcoll_comm_last_error(comm));
    /* The same buffer, registered now, and the first one: bit for bit. */
    for (int it = 2; it <= 4; it++) {
        hc_cu_dptr_t d = it == 3 ? a : b;
        void *dp = (void *)(uintptr_t)d;
        if (dev_fill(cu, stream, d, h, n, rank, it))
            return 1;
        HCT_OK(comm, hcoll_allreduce(comm, dp, dp, n, HCOLL_INT32, HCOLL_SUM, stream));
        if (dev_check(cu, stream, d, h, n, rank, nranks, it))
            return 1;
    }
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "rank %d: the communicator failed later: %s (%s)", rank,
                hcoll_status_name(ae), hcoll_comm_last_error(comm));
    free(h);
    GPU_OK(cu->stream_destroy(stream));
    GPU_OK(cu->mem_free(a));
    GPU_OK(cu->mem_free(b));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

/* The device cases' world: each rank's log in a directory of its own
 * (removed after a pass), nranks of per_node each under fn. */
static void run_dev(hct_rank_fn fn, int nranks, int per_node, int noloop)
{
    char cuda[4096];
    if (!hct_mock_cuda_built(cuda, sizeof cuda)) {
        printf("SKIP: needs the emulated CUDA driver (%s)\n", cuda);
        return;
    }
    world_t *w = hct_shared_alloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    w->noloop = noloop;
    w->per_node = per_node;
    snprintf(w->logdir, sizeof w->logdir, "/tmp/hcoll-regfail.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(w->logdir));
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = per_node, .timeout_ms = 90000 };
    hct_result_t res[MAX_RANKS];
    const double t0 = hct_now_ms();
    int bad = hct_run(&o, fn, w, res);
    fprintf(stderr, "[time] device %dx%d: %.1f s\n", nranks / per_node, per_node,
            (hct_now_ms() - t0) / 1e3);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr; logs in %s)", bad, w->logdir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", w->logdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", w->logdir);
    hct_shared_free(w, sizeof *w);
}

/* Device buffers on the GPUDirect ring (3 nodes, one GPU and NIC each):
 * the caller's buffer is registered by the worker when the ring starts;
 * a refusal there voids that operation on every rank (the _async request
 * fails, the stream is released) and the communicator goes on. Before:
 * the ring broke, and the communicator with it. */
static void run_dev_gdr(int noloop)
{
    run_dev(rank_dev_gdr, noloop ? 2 : 3, 1, noloop);
}

START_TEST(regfail_dev_gdr_3x1)
{
    run_dev_gdr(0);
}
END_TEST

/* ---- device buffers, three stages, on the GPUDirect rings ---------------- */

/* A device call of kind k (iteration it) on din / dout (apart, but for a
 * broadcast, which works in dout), through the host images hin / hout:
 * fresh inputs copied in on stream, then the call (req NULL: blocking,
 * else _async). 1 where a copy failed. */
static int dev_issue(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, enum kind k,
                     int rank, int nranks, int it, hc_cu_dptr_t din, hc_cu_dptr_t dout,
                     int32_t *hin, int32_t *hout, hcoll_request_t *req, hcoll_status_t *st_out)
{
    fill(k, rank, nranks, it, hin, hout);
    if (in_bytes(k, nranks))
        GPU_OK(cu->memcpy_htod_async(din, hin, in_bytes(k, nranks), stream));
    GPU_OK(cu->memcpy_htod_async(dout, hout, out_bytes(k, nranks), stream));
    *st_out = issue(comm, k, (void *)(uintptr_t)din, (void *)(uintptr_t)dout, stream, req);
    return 0;
}

/* The output of a device call that went through, exactly. */
static int dev_check_ok(const hc_cu_api_t *cu, void *stream, enum kind k, int rank, int nranks,
                        int it, hc_cu_dptr_t dout, int32_t *hout)
{
    GPU_OK(cu->memcpy_dtoh_async(hout, dout, out_bytes(k, nranks), stream));
    GPU_OK(cu->stream_synchronize(stream));
    return check_ok(k, rank, nranks, it, hout);
}

/* Kind k on fresh allocations, which the worker registers when its rail's
 * ring starts: refused on the odd rank in an _async call, which must fail
 * on every rank alike and release the stream; then 3 calls bit for bit. */
static int dev3_kind(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, enum kind k,
                     int rank, int nranks, int32_t *hin, int32_t *hout)
{
    const int odd = nranks - 1;
    const size_t ib = in_bytes(k, nranks);
    hc_cu_dptr_t din = 0, dout;
    if (ib)
        GPU_OK(cu->mem_alloc(&din, ib));
    GPU_OK(cu->mem_alloc(&dout, out_bytes(k, nranks)));
    const uint64_t before = mock_stat("injected_reg_failures");
    if (rank == odd)
        setenv("HCMOCK_IB_REG_FAIL", "12", 1);
    hcoll_request_t req = NULL;
    hcoll_status_t st;
    if (dev_issue(comm, cu, stream, k, rank, nranks, 0, din, dout, hin, hout, &req, &st))
        return 1;
    HCT_OK(comm, st);
    st = hcoll_wait(req);
    unsetenv("HCMOCK_IB_REG_FAIL");
    hcoll_request_free(req);
    if (failed_alike(comm, st, kind_name[k], rank, odd, ENOMEM))
        return 1;
    HCT_REQUIRE(rank != odd || mock_stat("injected_reg_failures") > before,
                "rank %d: %s: nothing was registered", rank, kind_name[k]);
    GPU_OK(cu->stream_synchronize(stream)); /* released: no gate left shut */
    hcoll_status_t ae = HCOLL_ERR_INTERNAL;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "rank %d: %s: the communicator failed: %s (%s)", rank,
                kind_name[k], hcoll_status_name(ae), hcoll_comm_last_error(comm));
    for (int it = 1; it <= 3; it++) {
        if (dev_issue(comm, cu, stream, k, rank, nranks, it, din, dout, hin, hout, NULL, &st))
            return 1;
        HCT_OK(comm, st);
        if (dev_check_ok(cu, stream, k, rank, nranks, it, dout, hout))
            return 1;
    }
    if (ib)
        GPU_OK(cu->mem_free(din));
    GPU_OK(cu->mem_free(dout));
    return 0;
}

/* A blocking all-reduce refused the same way has returned before its
 * ring ran: its failure is the communicator's async error, on every rank
 * of every node (as with one rank per node), seen once a later call has
 * gone through the executor after it. */
static int dev3_blocking(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                         int nranks, int32_t *hin, int32_t *hout)
{
    const int odd = nranks - 1;
    hc_cu_dptr_t din, dout;
    GPU_OK(cu->mem_alloc(&din, in_bytes(K_ALLREDUCE, nranks)));
    GPU_OK(cu->mem_alloc(&dout, out_bytes(K_ALLREDUCE, nranks)));
    if (rank == odd)
        setenv("HCMOCK_IB_REG_FAIL", "12", 1);
    hcoll_status_t st;
    if (dev_issue(comm, cu, stream, K_ALLREDUCE, rank, nranks, 0, din, dout, hin, hout, NULL,
                  &st))
        return 1;
    HCT_OK(comm, st);
    st = hcoll_barrier(comm); /* behind it in the executor */
    unsetenv("HCMOCK_IB_REG_FAIL");
    GPU_OK(cu->stream_synchronize(stream)); /* released */
    hcoll_status_t ae = HCOLL_SUCCESS;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    fprintf(stderr, "rank %d: blocking device all-reduce, rank %d's registrations refused: "
            "barrier %s, async error %s: %s\n", rank, odd, hcoll_status_name(st),
            hcoll_status_name(ae), hcoll_comm_last_error(comm));
    HCT_REQUIRE(ae == HCOLL_ERR_RDMA, "rank %d: the refused blocking call's async error is %s",
                rank, hcoll_status_name(ae));
    GPU_OK(cu->mem_free(din));
    GPU_OK(cu->mem_free(dout));
    return 0;
}

/* Kind k on a communicator of its own (a reduce-scatter's or
 * all-gather's ring runs in hcoll's permuted vector, allocated by the
 * first such call, and registered then: the refusal must meet it new):
 * the first device call sets the path up (GPUDirect rings, one a rail),
 * then dev3_kind. */
static int dev3_comm(world_t *w, enum kind k, int rank, int nranks, const hc_cu_api_t *cu,
                     void *stream, int32_t *hin, int32_t *hout)
{
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 20000;
    cfg.net = "ib";
    HCT_REQUIRE(hct_share_unique_id(&w->kslot[k], rank, 20000, &id) == 0, "no unique id");
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    hc_cu_dptr_t a, b;
    GPU_OK(cu->mem_alloc(&a, AR_COUNT * sizeof(int32_t)));
    GPU_OK(cu->mem_alloc(&b, AR_COUNT * sizeof(int32_t)));
    hcoll_status_t st;
    if (dev_issue(comm, cu, stream, K_ALLREDUCE, rank, nranks, 0, a, b, hin, hout, NULL, &st))
        return 1;
    HCT_OK(comm, st);
    if (dev_check_ok(cu, stream, K_ALLREDUCE, rank, nranks, 0, b, hout) ||
        dev_logged_gdr(w, rank) || dev3_kind(comm, cu, stream, k, rank, nranks, hin, hout))
        return 1;
    GPU_OK(cu->mem_free(a));
    GPU_OK(cu->mem_free(b));
    hcoll_status_t ae = HCOLL_ERR_INTERNAL;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
    HCT_REQUIRE(ae == HCOLL_SUCCESS, "rank %d: %s: the communicator failed later: %s (%s)", rank,
                kind_name[k], hcoll_status_name(ae), hcoll_comm_last_error(comm));
    if (k == K_ALLREDUCE && dev3_blocking(comm, cu, stream, rank, nranks, hin, hout))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

static int rank_dev_gdr3(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    if (dev_gdr_env(w))
        return 1;
    const hc_cu_api_t *cu = gpu_open(rank % w->per_node); /* its own GPU, beside its NIC */
    HCT_REQUIRE(cu && gpu_mock_driver(), "rank %d: no mock GPU", rank);
    const size_t cap = (size_t)nranks * RSAG_COUNT > AR_COUNT ? (size_t)nranks * RSAG_COUNT
                                                              : AR_COUNT;
    int32_t *hin = malloc(cap * sizeof *hin), *hout = malloc(cap * sizeof *hout + BC_BYTES);
    HCT_REQUIRE(hin && hout, "no memory");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    for (int k = 0; k < K_COUNT; k++)
        if (dev3_comm(w, (enum kind)k, rank, nranks, cu, stream, hin, hout))
            return 1;
    free(hin);
    free(hout);
    GPU_OK(cu->stream_destroy(stream));
    return 0;
}

/* Device buffers with three stages (2 GPUs and NICs per node, NCCL's node
 * steps on the caller's stream, a GPUDirect ring per rail): the odd rank
 * refuses the registration of each collective's buffers when its rail's
 * ring starts. That ring voids the call; the node's other rails hear it
 * in one node barrier at the call's end (coll_rail.c): every rank of
 * every node fails the _async call (the odd rank naming the registration,
 * the others naming it), every stream is released, and the next calls are
 * exact; a blocking all-reduce refused alike leaves the void's status as
 * every rank's async error. Before: the refusing rail's ranks failed the
 * communicator, the other rails' ranks succeeded with garbage (and after
 * a blocking call failed ~15 s later with HCOLL_ERR_PEER_FAILED). */
static void run_dev_gdr3(int nnodes)
{
    run_dev(rank_dev_gdr3, nnodes * 2, 2, 0);
}

START_TEST(regfail_dev_gdr_2x2)
{
    run_dev_gdr3(2);
}
END_TEST

START_TEST(regfail_dev_gdr_3x2)
{
    run_dev_gdr3(3);
}
END_TEST

/* Issue 19 item 3: a NIC that refuses the loopback QP of GPUDirect flush
 * reads (sm_80 needs them) leaves stage 2 on host staging; init and the
 * device all-reduce go through. */
START_TEST(fallback_flush_qp_refused)
{
    run_dev_gdr(1);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ib_regfail");
    TCase *t = tcase_create("regfail");
    tcase_set_timeout(t, TEST_TIMEOUT_S);
    tcase_add_test(t, regfail_host_2x2);
    tcase_add_test(t, regfail_host_3x1);
    tcase_add_test(t, regfail_dev_staged_setup);
    tcase_add_test(t, regfail_host_noagree_3x1);
    tcase_add_test(t, regfail_host_noagree_2x2);
    tcase_add_test(t, regfail_host_noagree_3x2);
    tcase_add_test(t, regfail_dev_gdr_3x1);
    tcase_add_test(t, regfail_dev_gdr_2x2);
    tcase_add_test(t, regfail_dev_gdr_3x2);
    tcase_add_test(t, fallback_flush_qp_refused);
    suite_add_tcase(s, t);
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
