/*
 * Where real NICs and hosts differ from a happy path (issue 19 items 3, 4,
 * 5, 9, 10), on the emulated libibverbs and CUDA driver, through the public
 * API with HCOLL_NET=ib, 2 emulated nodes of 1 rank:
 *   faults_dmabuf_refused  a NIC that refuses dma-buf (EOPNOTSUPP) on a host
 *                          without nvidia-peermem: device all-reduces are
 *                          staged, and host all-reduces after them work
 *   faults_gdr_dmabuf_only a host with dma-buf and no peermem, a platform
 *                          that does not order the NIC's writes (the NIC's
 *                          writes to device memory stay invisible until a
 *                          flush read), 64 KiB host pages, buffers at offsets
 *                          that are not 64 KiB-aligned: GPUDirect is on, the
 *                          flush word goes through dma-buf, flushes happen,
 *                          results are exact
 *   faults_gdr_managed     managed memory on a GPUDirect ring (peermem) is
 *                          staged through device memory, not failed
 *   faults_async_*         an async event (port down, fatal QP, responder
 *                          access error, CQ overrun) is named in the error
 *   faults_fork            a fork with regions live is safe (ibv_fork_init
 *                          came before the first registration)
 *   faults_memlock         a host buffer over the locked-memory limit fails
 *                          its call with a message naming the limit, and the
 *                          next call works
 *
 * The whole program runs with 64 KiB pages (LD_PRELOAD of
 * libhcmock_page.so), as on an aarch64 host with a 64 KiB-page kernel.
 * Each case failed before its fix.
 */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"
#include "hcoll.h"

#if HCOLL_BUILD_VERBS

#define TEST_TIMEOUT_S 90
#define NR 2

typedef struct fault_arg {
    hct_id_slot_t slot;
    char logdir[128];
    char root[PATH_MAX]; /* the sysfs tree of this case */
    char fault[32];      /* faults_async_*: what rank 0 injects */
    char msg[NR][400];
} fault_arg_t;

static fault_arg_t *arg_new(int peermem)
{
    fault_arg_t *a = hct_shared_alloc(sizeof *a);
    ck_assert_ptr_nonnull(a);
    snprintf(a->logdir, sizeof a->logdir, "/tmp/hcmock-ibf-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(a->logdir));
    /* sysfs-mockib: each GPU beside its NIC; without memory_peers, a host
     * where only dma-buf can reach device memory. */
    snprintf(a->root, sizeof a->root, "%s/sysfs", a->logdir);
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "cp -a tests/fixtures/sysfs-mockib %s%s%s%s", a->root,
             peermem ? "" : " && rm -rf ", peermem ? "" : a->root,
             peermem ? "" : "/sys/kernel/mm/memory_peers");
    ck_assert_int_eq(system(cmd), 0);
    return a;
}

static void arg_free(fault_arg_t *a)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", a->logdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", a->logdir);
    hct_shared_free(a, sizeof *a);
}

static void rank_env(const fault_arg_t *a)
{
    setenv("HCOLL_NET", "ib", 1);
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    setenv("HCOLL_DEBUG", "INFO", 1);
    setenv("HCOLL_DEBUG_SUBSYS", "NET,INIT,GDR", 1);
    setenv("HCOLL_SYSFS_ROOT", a->root, 1);
    setenv("HCMOCK_IB_SYSFS", a->root, 1);
    char path[256];
    snprintf(path, sizeof path, "%s/rank.%%p.log", a->logdir);
    setenv("HCOLL_DEBUG_FILE", path, 1);
}

static int comm_open(fault_arg_t *a, int rank, hcoll_comm_t *comm)
{
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 20000;
    cfg.net = "ib";
    HCT_REQUIRE(hct_share_unique_id(&a->slot, rank, 20000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(comm, NR, rank, &id, &cfg));
    return 0;
}

/* A host all-reduce of n floats (rank + i % 7 each), checked. */
static int host_allreduce(hcoll_comm_t comm, int rank, size_t n)
{
    float *b = malloc(n * sizeof *b);
    HCT_REQUIRE(b, "no memory");
    for (size_t i = 0; i < n; i++)
        b[i] = (float)(rank + (int)(i % 7));
    HCT_OK(comm, hcoll_allreduce(comm, b, b, n, HCOLL_FLOAT32, HCOLL_SUM, NULL));
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(b[i] == (float)(1 + 2 * (int)(i % 7)), "rank %d: element %zu is %g", rank, i,
                    b[i]);
    free(b);
    return 0;
}

/* A device all-reduce of n floats at byte offset off of a fresh 4 MiB
 * allocation (so that the buffer is 4 KiB- but not 64 KiB-aligned). */
static int dev_allreduce(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                         size_t n, size_t off)
{
    const size_t bytes = n * sizeof(float);
    float *h = malloc(bytes);
    HCT_REQUIRE(h && off + bytes <= (4u << 20), "no memory");
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(rank + (int)(i % 5));
    hc_cu_dptr_t mem;
    GPU_OK(cu->mem_alloc(&mem, 4u << 20));
    hc_cu_dptr_t d = mem + off;
    GPU_OK(cu->memcpy_htod_async(d, h, bytes, stream));
    void *p = (void *)(uintptr_t)d;
    HCT_OK(comm, hcoll_allreduce(comm, p, p, n, HCOLL_FLOAT32, HCOLL_SUM, stream));
    GPU_OK(cu->memcpy_dtoh_async(h, d, bytes, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(h[i] == (float)(1 + 2 * (int)(i % 5)), "rank %d: device element %zu is %g",
                    rank, i, h[i]);
    GPU_OK(cu->mem_free(mem));
    free(h);
    return 0;
}

/* How many rank logs of a hold a line matching the grep pattern. */
static int logs_with(const fault_arg_t *a, const char *pattern)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -l -e '%s' %s/rank.*.log 2>/dev/null | wc -l", pattern,
             a->logdir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    int n = -1;
    ck_assert_int_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

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

static void run(fault_arg_t *a, int (*fn)(int, int, void *))
{
    hct_opts_t o = { .nranks = NR, .ranks_per_node = 1, .timeout_ms = 60000 };
    hct_result_t res[NR];
    int bad = hct_run(&o, fn, a, res);
    ck_assert_msg(bad == 0, "%d rank(s) failed (see stderr; logs in %s)", bad, a->logdir);
}

static int skip_without_cuda(void)
{
    char cuda[PATH_MAX];
    if (hct_mock_cuda_built(cuda, sizeof cuda))
        return 0;
    printf("SKIP: needs the emulated CUDA driver (%s)\n", cuda);
    return 1;
}

/* ---- item 3: dma-buf refused, no peermem --------------------------------- */

static int rank_dmabuf_refused(int rank, int n, void *argp)
{
    (void)n;
    fault_arg_t *a = argp;
    rank_env(a);
    setenv("HCMOCK_DMABUF", "2", 1);    /* the GPU exports dma-bufs */
    setenv("HCMOCK_IB_DMABUF", "0", 1); /* the NIC's driver cannot import them */
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu && gpu_mock_driver(), "rank %d: no mock GPU", rank);
    hcoll_comm_t comm;
    if (comm_open(a, rank, &comm))
        return 1;
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    if (dev_allreduce(comm, cu, stream, rank, 300000, 8192) || host_allreduce(comm, rank, 100000) ||
        dev_allreduce(comm, cu, stream, rank, 1000, 0) || host_allreduce(comm, rank, 1u << 20))
        return 1;
    GPU_OK(cu->stream_destroy(stream));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(faults_dmabuf_refused)
{
    if (skip_without_cuda())
        return;
    fault_arg_t *a = arg_new(0);
    run(a, rank_dmabuf_refused);
    ck_assert_int_eq(logs_with(a, "refuses dma-buf registration"), NR);
    ck_assert_int_eq(logs_with(a, "staged through pinned host memory"), NR);
    arg_free(a);
}
END_TEST

/* ---- items 4 and 5: GPUDirect on a dma-buf-only host, flushed ------------ */

static int rank_gdr_dmabuf_only(int rank, int n, void *argp)
{
    (void)n;
    fault_arg_t *a = argp;
    rank_env(a);
    setenv("HCMOCK_DMABUF", "2", 1);
    setenv("HCMOCK_CC", "9.0", 1);             /* Hopper: "no flush" by generation */
    setenv("HCMOCK_RDMA_ORDERING", "0", 1);    /* but this platform orders nothing */
    setenv("HCMOCK_IB_GDR_LAZY", "1", 1);      /* so writes show only after a flush read */
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu && gpu_mock_driver(), "rank %d: no mock GPU", rank);
    HCT_REQUIRE(sysconf(_SC_PAGESIZE) == 65536, "rank %d: pages are not 64 KiB here", rank);
    hcoll_comm_t comm;
    if (comm_open(a, rank, &comm))
        return 1;
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    if (dev_allreduce(comm, cu, stream, rank, 300000, 8192) ||
        dev_allreduce(comm, cu, stream, rank, 70001, 4096 + 512) ||
        host_allreduce(comm, rank, 100000))
        return 1;
    HCT_REQUIRE(mock_stat("gdr_writes_held") > 0, "rank %d: no device write was held", rank);
    HCT_REQUIRE(mock_stat("dmabuf_registrations") > 0, "rank %d: nothing went through dma-buf",
                rank);
    GPU_OK(cu->stream_destroy(stream));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(faults_gdr_dmabuf_only)
{
    if (skip_without_cuda())
        return;
    fault_arg_t *a = arg_new(0);
    run(a, rank_gdr_dmabuf_only);
    ck_assert_int_eq(logs_with(a, "stage 2 on device memory (GPUDirect RDMA)"), NR);
    ck_assert_int_eq(logs_with(a, "registration through dma-buf, flush on"), NR);
    arg_free(a);
}
END_TEST

/* ---- item 6: managed memory on a GPUDirect ring --------------------------- */

static int rank_gdr_managed(int rank, int n, void *argp)
{
    (void)n;
    fault_arg_t *a = argp;
    rank_env(a);
    setenv("HCMOCK_CC", "8.0", 1); /* flush reads too */
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu && gpu_mock_driver(), "rank %d: no mock GPU", rank);
    void *lib = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
    int (*alloc_managed)(hc_cu_dptr_t *, size_t, unsigned) =
        lib ? (int (*)(hc_cu_dptr_t *, size_t, unsigned))dlsym(lib, "cuMemAllocManaged") : NULL;
    HCT_REQUIRE(alloc_managed, "no cuMemAllocManaged");
    hcoll_comm_t comm;
    if (comm_open(a, rank, &comm))
        return 1;
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    const size_t cnt = 200000;
    hc_cu_dptr_t m;
    GPU_OK(alloc_managed(&m, cnt * sizeof(float), 1));
    float *f = (float *)(uintptr_t)m; /* host-addressable, as managed memory is */
    for (int it = 0; it < 2; it++) {
        for (size_t i = 0; i < cnt; i++)
            f[i] = (float)(rank + (int)(i % 3));
        HCT_OK(comm, hcoll_allreduce(comm, f, f, cnt, HCOLL_FLOAT32, HCOLL_SUM, stream));
        GPU_OK(cu->stream_synchronize(stream));
        hcoll_status_t ae = HCOLL_SUCCESS;
        HCT_OK(comm, hcoll_comm_get_async_error(comm, &ae));
        HCT_REQUIRE(ae == HCOLL_SUCCESS, "rank %d: managed all-reduce: %s (%s)", rank,
                    hcoll_status_name(ae), hcoll_comm_last_error(comm));
        for (size_t i = 0; i < cnt; i++)
            HCT_REQUIRE(f[i] == (float)(1 + 2 * (int)(i % 3)), "rank %d: managed element %zu is %g",
                        rank, i, f[i]);
    }
    if (dev_allreduce(comm, cu, stream, rank, 100000, 0) || host_allreduce(comm, rank, 100000))
        return 1;
    GPU_OK(cu->mem_free(m));
    GPU_OK(cu->stream_destroy(stream));
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(faults_gdr_managed)
{
    if (skip_without_cuda())
        return;
    fault_arg_t *a = arg_new(1);
    run(a, rank_gdr_managed);
    ck_assert_int_eq(logs_with(a, "stage 2 on device memory (GPUDirect RDMA)"), NR);
    arg_free(a);
}
END_TEST

/* ---- item 9: async events -------------------------------------------------- */

static int rank_async(int rank, int n, void *argp)
{
    (void)n;
    fault_arg_t *a = argp;
    rank_env(a);
    hcoll_comm_t comm;
    if (comm_open(a, rank, &comm))
        return 1;
    if (host_allreduce(comm, rank, 100000))
        return 1;
    if (rank == 0) {
        void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
        int (*inject)(const char *) = h ? (int (*)(const char *))dlsym(h,
                                                                       "hcmock_verbs_inject_async")
                                        : NULL;
        HCT_REQUIRE(inject && inject(a->fault) == 0, "cannot inject %s", a->fault);
    }
    /* Rank 0's next call fails, naming the cause; rank 1's fails too. */
    hcoll_status_t st = HCOLL_SUCCESS;
    float *b = calloc(1u << 18, sizeof *b);
    HCT_REQUIRE(b, "no memory");
    for (int i = 0; i < 50 && st == HCOLL_SUCCESS; i++)
        st = hcoll_allreduce(comm, b, b, 1u << 18, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", hcoll_comm_last_error(comm));
    HCT_REQUIRE(st != HCOLL_SUCCESS, "rank %d: 50 all-reduces after %s went through", rank,
                a->fault);
    free(b);
    hcoll_comm_destroy(comm);
    return 0;
}

static void run_async(const char *fault, const char *want)
{
    fault_arg_t *a = arg_new(1);
    snprintf(a->fault, sizeof a->fault, "%s", fault);
    run(a, rank_async);
    fprintf(stderr, "%s: rank 0: %s\n", fault, a->msg[0]);
    ck_assert_msg(strstr(a->msg[0], want), "rank 0 after %s: '%s' lacks '%s'", fault, a->msg[0],
                  want);
    arg_free(a);
}

START_TEST(faults_async_port_down)
{
    run_async("port_down", "went down (IBV_EVENT_PORT_ERR)");
}
END_TEST

START_TEST(faults_async_qp_fatal)
{
    run_async("qp_fatal", "fatal error (IBV_EVENT_QP_FATAL)");
}
END_TEST

START_TEST(faults_async_access_err)
{
    run_async("access_err", "responder access error");
}
END_TEST

/* Nothing but the event says so: completions just stop coming. */
START_TEST(faults_async_cq_overrun)
{
    run_async("cq_overrun", "overran, completions were lost (IBV_EVENT_CQ_ERR)");
}
END_TEST

/* ---- item 10: fork with regions live --------------------------------------- */

static int rank_fork(int rank, int n, void *argp)
{
    (void)n;
    fault_arg_t *a = argp;
    rank_env(a);
    hcoll_comm_t comm;
    if (comm_open(a, rank, &comm) || host_allreduce(comm, rank, 100000))
        return 1;
    HCT_REQUIRE(mock_stat("live_mrs") > 0, "rank %d: no region is live", rank);
    pid_t pid = fork(); /* as hcoll_perf --plot starts gnuplot */
    if (pid == 0)
        _exit(0);
    HCT_REQUIRE(pid > 0, "fork");
    waitpid(pid, NULL, 0);
    HCT_REQUIRE(mock_stat("unsafe_forks") == 0,
                "rank %d: forked with live regions and no ibv_fork_init", rank);
    if (host_allreduce(comm, rank, 100000))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return 0;
}

START_TEST(faults_fork)
{
    fault_arg_t *a = arg_new(1);
    run(a, rank_fork);
    ck_assert_int_eq(logs_with(a, "fork safety: ibv_fork_init done"), NR);
    arg_free(a);
}
END_TEST

/* ---------------------------------------------------------------------------- */

static Suite *suite(void)
{
    Suite *s = suite_create("ib_faults");
    TCase *t = tcase_create("faults");
    tcase_set_timeout(t, TEST_TIMEOUT_S);
    tcase_add_test(t, faults_dmabuf_refused);
    tcase_add_test(t, faults_gdr_dmabuf_only);
    tcase_add_test(t, faults_gdr_managed);
    tcase_add_test(t, faults_async_port_down);
    tcase_add_test(t, faults_async_qp_fatal);
    tcase_add_test(t, faults_async_access_err);
    tcase_add_test(t, faults_async_cq_overrun);
    tcase_add_test(t, faults_fork);
    suite_add_tcase(s, t);
    return s;
}

int main(int argc, char **argv)
{
    (void)argc;
    /* 64 KiB pages for the whole run (carried by the re-execution). */
    if (!getenv("HCMOCK_IB_TEST_CHILD")) {
        const char *build = getenv("HCOLL_TEST_BUILD");
        char shim[PATH_MAX], abs[PATH_MAX];
        snprintf(shim, sizeof shim, "%s/mock/libhcmock_page.so", build && *build ? build : "build");
        if (!realpath(shim, abs)) {
            printf("SKIP: %s not built (make tests)\n", shim);
            return 77;
        }
        char preload[2 * PATH_MAX + 2];
        snprintf(preload, sizeof preload, "%s", abs);
#ifdef __SANITIZE_ADDRESS__
        /* make test-asan: ASan's runtime must be the first library loaded,
         * ahead of the preloaded shim, or the program refuses to start. */
        Dl_info di;
        void *asan = dlsym(RTLD_DEFAULT, "__asan_init");
        if (asan && dladdr(asan, &di) && di.dli_fname)
            snprintf(preload, sizeof preload, "%s:%s", di.dli_fname, abs);
#endif
        setenv("LD_PRELOAD", preload, 1);
        setenv("HCMOCK_PAGE_SIZE", "65536", 1);
    }
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
