/*
 * hcoll's verbs transport through its ops table (hc_ib_ops), on two
 * forked ranks over the emulated libibverbs (tests/mock/verbs.c) and the
 * RoCE fixture tree tests/fixtures/sysfs-roce: puts landing with their
 * immediates, more puts than receive credits, a put past the peer's
 * region, a peer that dies; GPUDirect: device memory of the emulated CUDA
 * driver (tests/mock/cuda.c) registered through nvidia-peermem and written
 * by the NIC, immediates held back by flush reads (sm_80), on
 * tests/fixtures/sysfs-mockib. regress_* cases are transport bugs this
 * emulation exposed, one case each (each failed before its fix).
 *
 * A transport is built as common/mockib.h shows: settings from this test's
 * environment (hc_params_load), then hc_ib_ops.create. main re-executes
 * this program inside the emulation. Skips (77) when hcoll was built
 * without rdma-core headers or the mock is not built.
 */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "common/seam.h"
#include "gpu/gpuhelp.h"
#include "base/config.h"
#include "base/err.h"
#include "hc_build.h"
#include "inter/transport.h"

#if HCOLL_BUILD_VERBS

#define TEST_TIMEOUT_S 60
#define MAXR 4

/* ------------------------------------------------------------------------ */
/* Two forked ranks, their exchange in shared memory                         */
/* ------------------------------------------------------------------------ */


typedef struct shm_ag {
    hct_barrier_t bar;
    int nranks;
    char slot[MAXR][4096];
} shm_ag_t;

typedef struct ag_ctx {
    shm_ag_t *shm;
    int rank;
} ag_ctx_t;

static hcoll_status_t shm_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    ag_ctx_t *c = ctx;
    if (len > sizeof c->shm->slot[0])
        return HCOLL_ERR_INTERNAL;
    memcpy(c->shm->slot[c->rank], mine, len);
    if (hct_barrier_wait(&c->shm->bar, c->shm->nranks, 20000) != 0)
        return HCOLL_ERR_TIMEOUT;
    for (int i = 0; i < c->shm->nranks; i++)
        memcpy((char *)all + (size_t)i * len, c->shm->slot[i], len);
    if (hct_barrier_wait(&c->shm->bar, c->shm->nranks, 20000) != 0)
        return HCOLL_ERR_TIMEOUT;
    return HCOLL_SUCCESS;
}

static hc_errbuf_t eb; /* per forked rank */

/* Rank rank of n on the first port of the fixture tree, no GPU. */
static hcoll_status_t seam_create(int rank, int n, hc_transport_t **tr_out)
{
    hc_params_t settings;
    hc_transport_params_t p;
    hcoll_status_t st = hct_ib_params(rank, n, &eb, &settings, &p);
    if (st != HCOLL_SUCCESS)
        return st;
    return hc_ib_ops.create(&p, tr_out);
}

#define REGION ((4u << 20) + 16)
static const struct { size_t off, len; } puts_tab[] = {
    { 0, 0 }, { 0, 1 }, { 17, 4095 }, { 5000, 1 << 20 }, { 3u << 20, (1u << 20) + 3 },
    { 100, 31 }, { (1u << 20) + 7, 65536 },
};
#define NPUTS (int)(sizeof puts_tab / sizeof puts_tab[0])

static unsigned char pat(size_t i)
{
    return (unsigned char)(i * 131 + (i >> 9) + 7);
}

static int rank_seam_puts(int rank, int n, void *arg)
{
    shm_ag_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_transport_t *tr;
    HCT_REQUIRE(seam_create(rank, n, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    int peer = 1 - rank;
    hc_ep_t *ep;
    HCT_REQUIRE(hc_ib_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep) == HCOLL_SUCCESS,
                "connect: %s", eb.msg);
    unsigned char *buf = malloc(REGION);
    HCT_REQUIRE(buf, "malloc");
    if (rank == 0)
        for (size_t i = 0; i < REGION; i++)
            buf[i] = pat(i);
    else
        memset(buf, 0xA5, REGION);
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, buf, REGION, &mr, &rk) == HCOLL_SUCCESS, "reg: %s", eb.msg);
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "exchange keys");
    hcoll_status_t st;
    if (rank == 0) {
        /* Each put several times over: more puts than receive credits. */
        int total = 0;
        for (int round = 0; round < 120; round++)
            for (int k = 0; k < NPUTS; k++, total++)
                HCT_REQUIRE(hc_ib_ops.put(ep, mr, puts_tab[k].off, &rks[1], puts_tab[k].off,
                                          round < 100 ? 0 : puts_tab[k].len,
                                          1000u + (unsigned)k, (uint64_t)total) == HCOLL_SUCCESS,
                            "put %d: %s", k, eb.msg);
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, total, NULL, 20000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == total, "local completions %d/%d: %s", got,
                    total, eb.msg);
        uint32_t imm = 0;
        got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, 1, &imm, 20000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == 1 && imm == 4242u, "notify: %d %s", got,
                    eb.msg);
        /* Once rank 1 has its notify completion (else it could be flushed). */
        hc_rkey_t scratch[2];
        HCT_REQUIRE(shm_allgather(&ag, &rk, scratch, sizeof rk) == HCOLL_SUCCESS, "barrier");
        /* Past the end of the peer's region: the NIC refuses. */
        HCT_REQUIRE(hc_ib_ops.put(ep, mr, 0, &rks[1], REGION - 8, 64, 1, 7) == HCOLL_SUCCESS,
                    "bad put: %s", eb.msg);
        hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, 1, NULL, 5000, &st);
        HCT_REQUIRE(st == HCOLL_ERR_RDMA && strstr(eb.msg, "remote access error"),
                    "put past the region: %s: %s", hcoll_status_name(st), eb.msg);
    } else {
        const int total = 120 * NPUTS;
        uint32_t *imms = malloc((size_t)total * sizeof *imms);
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, total, imms, 20000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == total, "immediates %d/%d: %s", got, total,
                    eb.msg);
        int seen[NPUTS] = { 0 };
        for (int k = 0; k < total; k++) {
            HCT_REQUIRE(imms[k] >= 1000u && imms[k] < 1000u + NPUTS, "imm %u", imms[k]);
            seen[imms[k] - 1000u]++;
        }
        for (int k = 0; k < NPUTS; k++)
            HCT_REQUIRE(seen[k] == 120, "immediate %d seen %d times", k, seen[k]);
        free(imms);
        unsigned char *want = malloc(REGION);
        memset(want, 0xA5, REGION);
        for (int k = 0; k < NPUTS; k++)
            for (size_t i = puts_tab[k].off; i < puts_tab[k].off + puts_tab[k].len; i++)
                want[i] = pat(i);
        HCT_REQUIRE(memcmp(want, buf, REGION) == 0, "region contents");
        free(want);
        HCT_REQUIRE(hct_mock_clean("seam rank 1", 1) == 0, "mock counters");
        HCT_REQUIRE(hc_ib_ops.put(ep, NULL, 0, NULL, 0, 0, 4242u, 99) == HCOLL_SUCCESS, "notify");
        got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, 1, NULL, 10000, &st);
        HCT_REQUIRE(got == 1, "notify completion: %s", eb.msg);
        hc_rkey_t scratch[2];
        HCT_REQUIRE(shm_allgather(&ag, &rk, scratch, sizeof rk) == HCOLL_SUCCESS, "barrier");
        /* Rank 0's bad put kills this QP too: pending receives flush. */
        hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, 1, NULL, 5000, &st);
        HCT_REQUIRE(st == HCOLL_ERR_RDMA && strstr(eb.msg, "flushed"),
                    "after the peer's bad put: %s: %s", hcoll_status_name(st), eb.msg);
    }
    hc_ib_ops.mr_dereg(tr, mr);
    hc_ib_ops.destroy(tr, 0);
    free(buf);
    return hct_mock_released(rank ? "seam rank 1" : "seam rank 0");
}

START_TEST(seam_puts)
{
    shm_ag_t *shm = hct_shared_alloc(sizeof *shm);
    shm->nranks = 2;
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 50000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_seam_puts, shm, res), 0);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

typedef struct kill_arg {
    shm_ag_t ag;
    volatile double kill_ms;
    volatile double noticed_ms;
    char msg[512];
} kill_arg_t;

static int rank_seam_kill(int rank, int n, void *argp)
{
    kill_arg_t *a = argp;
    ag_ctx_t ag = { &a->ag, rank };
    hc_transport_t *tr;
    HCT_REQUIRE(seam_create(rank, n, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    int peer = 1 - rank;
    hc_ep_t *ep;
    HCT_REQUIRE(hc_ib_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep) == HCOLL_SUCCESS,
                "connect: %s", eb.msg);
    static unsigned char buf[1 << 20];
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, buf, sizeof buf, &mr, &rk) == HCOLL_SUCCESS, "reg");
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "exchange keys");
    if (rank == 1) {
        a->kill_ms = hct_now_ms();
        raise(SIGKILL);
    }
    while (!a->kill_ms)
        usleep(100);
    /* Keep writing to the dead peer until the transport says so. */
    hcoll_status_t st = HCOLL_SUCCESS;
    for (int i = 0; st == HCOLL_SUCCESS && hct_now_ms() - a->kill_ms < 10000; i++) {
        st = hc_ib_ops.put(ep, mr, 0, &rks[1], 0, sizeof buf, (uint32_t)i, (uint64_t)i);
        if (st == HCOLL_SUCCESS) {
            int k;
            hc_comp_t c[16];
            st = hc_ib_ops.poll(tr, c, 16, 10, &k);
        }
    }
    a->noticed_ms = hct_now_ms();
    snprintf(a->msg, sizeof a->msg, "%s", eb.msg);
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "%s", a->msg);
    HCT_REQUIRE(strstr(eb.msg, "transport retry counter exceeded"), "%s", a->msg);
    hc_ib_ops.mr_dereg(tr, mr);
    hc_ib_ops.destroy(tr, 0);
    return hct_mock_released("seam survivor");
}

START_TEST(seam_peer_killed)
{
    setenv("HCMOCK_IB_RETRY_MS", "1000", 1);
    kill_arg_t *a = hct_shared_alloc(sizeof *a);
    a->ag.nranks = 2;
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[2];
    hct_run(&o, rank_seam_kill, a, res);
    ck_assert_msg(res[1].signaled && res[1].sig == SIGKILL, "rank 1 did not die of SIGKILL");
    ck_assert_msg(res[0].exited && res[0].code == 0, "survivor failed: %s", a->msg);
    double dt = a->noticed_ms - a->kill_ms;
    fprintf(stderr, "seam_peer_killed: survivor failed %.0f ms after the kill: %s\n", dt, a->msg);
    ck_assert_msg(dt < 1000 + 1000, "noticed after %.0f ms", dt);
    hct_shared_free(a, sizeof *a);
    unsetenv("HCMOCK_IB_RETRY_MS");
}
END_TEST

/* GPUDirect through nvidia-peermem: device buffers of the emulated CUDA
 * driver registered as they are, written by the NIC, immediates delivered
 * only after a flush read (compute capability 8.0). The tree is
 * sysfs-mockib, where GPU 0 and mlx5_0 share a PCIe switch. */
typedef struct gdr_arg {
    shm_ag_t ag;
    char root[200];
} gdr_arg_t;

#define GDR_BYTES (1u << 20)

static int rank_seam_gdr(int rank, int n, void *argp)
{
    gdr_arg_t *a = argp;
    ag_ctx_t ag = { &a->ag, rank };
    setenv("HCMOCK_CC", "8.0", 1);
    setenv("HCMOCK_IB_SYSFS", a->root, 1);
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU 0 from the mock CUDA driver");
    hc_cu_dptr_t dbuf = 0;
    HCT_REQUIRE(cu->mem_alloc(&dbuf, GDR_BYTES) == HC_CU_SUCCESS, "cuMemAlloc");
    void *cuh = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *(*d2h)(uint64_t, size_t) = (void *(*)(uint64_t, size_t))dlsym(cuh, "hcmock_dev_to_host");
    HCT_REQUIRE(d2h, "the libcuda.so.1 loaded is not the mock");
    unsigned char *view = d2h(dbuf, GDR_BYTES); /* the test's window on device memory */
    for (size_t i = 0; i < GDR_BYTES; i++)
        view[i] = rank == 0 ? pat(i) : 0xA5;

    hc_params_t settings;
    hc_transport_params_t p;
    HCT_REQUIRE(hct_ib_params(rank, n, &eb, &settings, &p) == HCOLL_SUCCESS, "%s", eb.msg);
    snprintf(settings.sysfs_root, sizeof settings.sysfs_root, "%s", a->root);
    p.has_gpu = 1;
    p.gpu = 0;
    hc_transport_t *tr;
    HCT_REQUIRE(hc_ib_ops.create(&p, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    int peer = 1 - rank;
    hc_ep_t *ep;
    HCT_REQUIRE(hc_ib_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep) == HCOLL_SUCCESS,
                "connect: %s", eb.msg);
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)dbuf, GDR_BYTES, &mr, &rk) ==
                    HCOLL_SUCCESS,
                "registering device memory: %s", eb.msg);
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "exchange keys");
    hcoll_status_t st;
    const int nput = 16;
    const size_t piece = GDR_BYTES / (size_t)nput;
    if (rank == 0) {
        for (int k = 0; k < nput; k++)
            HCT_REQUIRE(hc_ib_ops.put(ep, mr, (size_t)k * piece, &rks[1], (size_t)k * piece,
                                      piece, 500u + (unsigned)k, (uint64_t)k) == HCOLL_SUCCESS,
                        "put: %s", eb.msg);
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, nput, NULL, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == nput, "completions %d/%d: %s", got, nput,
                    eb.msg);
    } else {
        uint32_t imms[16];
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, nput, imms, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == nput, "immediates %d/%d: %s", got, nput,
                    eb.msg);
        for (size_t i = 0; i < GDR_BYTES; i++)
            HCT_REQUIRE(view[i] == pat(i), "device byte %zu is 0x%02x", i, view[i]);
        /* Each immediate waited for a one-word RDMA read of device memory. */
        void *vh = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
        uint64_t (*stat)(const char *) = (uint64_t(*)(const char *))dlsym(vh, "hcmock_verbs_stat");
        HCT_REQUIRE(stat && stat("reads") > 0, "no flush read went through the mock");
        dlclose(vh);
    }
    HCT_REQUIRE(hct_mock_clean(rank ? "gdr rank 1" : "gdr rank 0", rank == 0) == 0, "mock counters");
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
    hc_ib_ops.mr_dereg(tr, mr);
    hc_ib_ops.destroy(tr, 1);
    /* Too far for HCOLL_NET_GDR_LEVEL=LOC: device memory is refused, the
     * caller is told to stage it. */
    settings.gdr_level = HC_GDR_LOC;
    HCT_REQUIRE(hc_ib_ops.create(&p, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    st = hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)dbuf, GDR_BYTES, &mr, &rk);
    HCT_REQUIRE(st == HCOLL_ERR_UNSUPPORTED && strstr(eb.msg, "stage it through host memory"),
                "device memory with GDR off: %s: %s", hcoll_status_name(st), eb.msg);
    hc_ib_ops.destroy(tr, 0);
    cu->mem_free(dbuf);
    dlclose(cuh);
    return hct_mock_released(rank ? "gdr rank 1" : "gdr rank 0");
}

START_TEST(seam_gdr_peermem)
{
    char cuda[PATH_MAX];
    if (!hct_mock_cuda_built(cuda, sizeof cuda)) {
        printf("SKIP: seam_gdr_peermem: %s not built\n", cuda);
        return;
    }
    gdr_arg_t *a = hct_shared_alloc(sizeof *a);
    a->ag.nranks = 2;
    char root[PATH_MAX];
    ck_assert_ptr_nonnull(realpath("tests/fixtures/sysfs-mockib", root));
    ck_assert_uint_lt(strlen(root), sizeof a->root);
    snprintf(a->root, sizeof a->root, "%.199s", root);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 40000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_seam_gdr, a, res), 0);
    hct_shared_free(a, sizeof *a);
}
END_TEST


/* A library bug this found: the flush reads targeted the first device
 * region ever registered, which the registration cache kept after its last
 * user; once the application freed that buffer, every later flush read
 * failed and the transport died on an unrelated transfer. */
static int rank_seam_gdr_stale_flush(int rank, int n, void *argp)
{
    gdr_arg_t *a = argp;
    ag_ctx_t ag = { &a->ag, rank };
    setenv("HCMOCK_CC", "8.0", 1);
    setenv("HCMOCK_IB_SYSFS", a->root, 1);
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU 0 from the mock CUDA driver");
    hc_params_t settings;
    hc_transport_params_t p;
    HCT_REQUIRE(hct_ib_params(rank, n, &eb, &settings, &p) == HCOLL_SUCCESS, "%s", eb.msg);
    snprintf(settings.sysfs_root, sizeof settings.sysfs_root, "%s", a->root);
    p.has_gpu = 1;
    p.gpu = 0;
    hc_transport_t *tr;
    HCT_REQUIRE(hc_ib_ops.create(&p, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    int peer = 1 - rank;
    hc_ep_t *ep;
    HCT_REQUIRE(hc_ib_ops.connect(tr, &peer, 1, shm_allgather, &ag, &ep) == HCOLL_SUCCESS,
                "connect: %s", eb.msg);
    /* Buffer A: registered, released (the cache keeps it), freed. */
    hc_cu_dptr_t da = 0, db = 0;
    HCT_REQUIRE(cu->mem_alloc(&da, 4096) == HC_CU_SUCCESS, "cuMemAlloc");
    hc_mr_t *mr;
    hc_rkey_t rk, rks[2];
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)da, 4096, &mr, &rk) == HCOLL_SUCCESS,
                "reg A: %s", eb.msg);
    hc_ib_ops.mr_dereg(tr, mr);
    HCT_REQUIRE(cu->mem_free(da) == HC_CU_SUCCESS, "cuMemFree");
    /* Buffer B: a transfer into it must work. */
    HCT_REQUIRE(cu->mem_alloc(&db, 4096) == HC_CU_SUCCESS, "cuMemAlloc");
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)db, 4096, &mr, &rk) == HCOLL_SUCCESS,
                "reg B: %s", eb.msg);
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "exchange keys");
    hcoll_status_t st;
    if (rank == 0) {
        HCT_REQUIRE(hc_ib_ops.put(ep, mr, 0, &rks[1], 0, 4096, 7, 7) == HCOLL_SUCCESS, "put");
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, 1, NULL, 5000, &st);
        HCT_REQUIRE(got == 1, "completion: %s", eb.msg);
    } else {
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, 1, NULL, 5000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == 1,
                    "a put into live buffer B failed because buffer A was freed: %s", eb.msg);
    }
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
    hc_ib_ops.mr_dereg(tr, mr);
    hc_ib_ops.destroy(tr, 1);
    cu->mem_free(db);
    return 0;
}

START_TEST(regress_gdr_freed_flush_source)
{
    char cuda[PATH_MAX];
    if (!hct_mock_cuda_built(cuda, sizeof cuda)) {
        printf("SKIP: regress_gdr_freed_flush_source: needs the emulated CUDA driver (%s)\n",
               cuda);
        return;
    }
    gdr_arg_t *a = hct_shared_alloc(sizeof *a);
    a->ag.nranks = 2;
    char root[PATH_MAX];
    ck_assert_ptr_nonnull(realpath("tests/fixtures/sysfs-mockib", root));
    snprintf(a->root, sizeof a->root, "%.199s", root);
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, rank_seam_gdr_stale_flush, a, res), 0);
    hct_shared_free(a, sizeof *a);
}
END_TEST

/* A failed completion's operation and direction were named from
 * wc.opcode, which verbs leaves undefined unless the status is success: a
 * write to rank 1 that ran out of retries read "operation from rank 1". */
static int rank_opcode_text(int rank, int n, void *argp)
{
    kill_arg_t *a = argp;
    if (rank_seam_kill(rank, n, argp))
        return 1;
    HCT_REQUIRE(!strstr(a->msg, "from rank 1"), "a failed write to rank 1 reads: %s", a->msg);
    return 0;
}

START_TEST(regress_error_opcode)
{
    setenv("HCMOCK_IB_RETRY_MS", "300", 1);
    kill_arg_t *a = hct_shared_alloc(sizeof *a);
    a->ag.nranks = 2;
    hct_opts_t o = { .nranks = 2, .ranks_per_node = 1, .timeout_ms = 30000 };
    hct_result_t res[2];
    hct_run(&o, rank_opcode_text, a, res);
    ck_assert_msg(res[0].exited && res[0].code == 0, "%s", a->msg);
    hct_shared_free(a, sizeof *a);
    unsetenv("HCMOCK_IB_RETRY_MS");
}
END_TEST

/* ------------------------------------------------------------------------ */

static Suite *suite(void)
{
    Suite *s = suite_create("ib_transport");
    TCase *t = tcase_create("seam");
    tcase_set_timeout(t, TEST_TIMEOUT_S);
    tcase_add_test(t, seam_puts);
    tcase_add_test(t, seam_peer_killed);
    tcase_add_test(t, seam_gdr_peermem);
    suite_add_tcase(s, t);
    TCase *b = tcase_create("regress");
    tcase_set_timeout(b, TEST_TIMEOUT_S);
    tcase_add_test(b, regress_gdr_freed_flush_source);
    tcase_add_test(b, regress_error_opcode);
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
