/*
 * Verbs memory registration (issue 19: item 4 and the registration items;
 * issue 16: send-only buffers), through hcoll's verbs transport (hc_ib_ops)
 * on forked ranks over the emulated libibverbs and CUDA driver:
 *   reg_send_only         a region registered without an rkey (a send
 *                         buffer) is refused to a peer's put with a remote
 *                         access error; a receive region beside it takes
 *                         puts; a send-only entry never serves a lookup
 *                         that hands out an rkey
 *   reg_whole_allocation  N registrations of sub-ranges of one CUDA
 *                         allocation cost one registration (the whole
 *                         allocation); freed and reallocated at the same
 *                         address, it is registered again, and a put into
 *                         the new buffer lands (no stale region); a freed
 *                         buffer nothing looks up again loses its idle
 *                         entry at the next registration of another
 *   reg_flush_landed      on a platform whose NIC writes into device memory
 *                         show only after a read of the buffer they landed
 *                         in, an immediate is reported with its payload
 *                         visible, another device buffer live beside it
 *   reg_relaxed_ordering  regions carry IBV_ACCESS_RELAXED_ORDERING by
 *                         default; HCOLL_IB_PCI_RELAXED_ORDERING=0 turns it
 *                         off; a provider that refuses the flag, or lacks
 *                         ibv_reg_mr_iova2, costs nothing but the flag
 *   reg_flush_c2c         the flush decision: ordering attribute, C2C link
 *                         with the NIC on the GPU's switch, the knob; and a
 *                         transport on an emulated Grace Hopper flushes
 * Each failed before its fix. Skips (77) without rdma-core headers.
 */
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
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

#include "inter/ib/ib_priv.h"
#include "sys/pci.h"

#define TEST_TIMEOUT_S 60

typedef struct shm_ag {
    hct_barrier_t bar;
    int nranks;
    char slot[2][256];
    char root[200];
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

/* A transport of rank of n; with gpu >= 0, GPUDirect for that GPU on the
 * tree shm->root (sysfs-mockib). Connected to the other rank when n is 2. */
static int open_tr(shm_ag_t *shm, int rank, int n, int gpu, hc_transport_t **tr,
                   hc_ep_t **ep)
{
    static hc_params_t settings; /* create reads it; not kept */
    hc_transport_params_t p;
    HCT_REQUIRE(hct_ib_params(rank, n, &eb, &settings, &p) == HCOLL_SUCCESS, "%s", eb.msg);
    if (gpu >= 0) {
        snprintf(settings.sysfs_root, sizeof settings.sysfs_root, "%s", shm->root);
        p.has_gpu = 1;
        p.gpu = gpu;
    }
    HCT_REQUIRE(hc_ib_ops.create(&p, tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    if (n == 2) {
        int peer = 1 - rank;
        ag_ctx_t ag = { shm, rank };
        HCT_REQUIRE(hc_ib_ops.connect(*tr, &peer, 1, shm_allgather, &ag, ep) == HCOLL_SUCCESS,
                    "connect: %s", eb.msg);
    }
    return 0;
}

static void run2(shm_ag_t *shm, int nranks, hct_rank_fn fn)
{
    shm->nranks = nranks;
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = 1, .timeout_ms = 40000 };
    hct_result_t res[2];
    ck_assert_int_eq(hct_run(&o, fn, shm, res), 0);
}

static shm_ag_t *shm_new(int gpu)
{
    shm_ag_t *shm = hct_shared_alloc(sizeof *shm);
    ck_assert_ptr_nonnull(shm);
    if (gpu) {
        char root[PATH_MAX];
        ck_assert_ptr_nonnull(realpath("tests/fixtures/sysfs-mockib", root));
        snprintf(shm->root, sizeof shm->root, "%.199s", root);
    }
    return shm;
}

static int no_cuda(const char *test)
{
    char cuda[PATH_MAX];
    if (hct_mock_cuda_built(cuda, sizeof cuda))
        return 0;
    printf("SKIP: %s: needs the emulated CUDA driver (%s)\n", test, cuda);
    return 1;
}

/* ---- send-only regions ---------------------------------------------------- */

#define SO_BYTES 65536

static int rank_send_only(int rank, int n, void *arg)
{
    shm_ag_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    hc_transport_t *tr;
    hc_ep_t *ep = NULL;
    if (open_tr(shm, rank, n, -1, &tr, &ep))
        return 1;
    unsigned char *send = malloc(SO_BYTES), *recv = malloc(SO_BYTES);
    HCT_REQUIRE(send && recv, "malloc");
    memset(send, 0x5a, SO_BYTES);
    memset(recv, 0, SO_BYTES);
    hc_mr_t *smr, *rmr, *again;
    hc_rkey_t keys[2], all[4]; /* [0] the receive region, [1] the send region's raw key */
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, send, SO_BYTES, &smr, NULL) == HCOLL_SUCCESS, "send reg: %s",
                eb.msg);
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, recv, SO_BYTES, &rmr, &keys[0]) == HCOLL_SUCCESS,
                "recv reg: %s", eb.msg);
    /* A peer that learned the send region's key anyway (a guess, a leak). */
    keys[1].w[0] = (uintptr_t)send;
    keys[1].w[1] = smr->ent->mr->rkey;
    /* The send range asked for again with an rkey: a region of its own. */
    uint64_t regs0 = mock_stat("mr_registrations");
    hc_rkey_t k2;
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, send + 4096, 4096, &again, &k2) == HCOLL_SUCCESS, "reg: %s",
                eb.msg);
    HCT_REQUIRE(again->ent != smr->ent && mock_stat("mr_registrations") == regs0 + 1,
                "a lookup handing out an rkey was served by the send-only entry");
    hc_ib_ops.mr_dereg(tr, again);
    HCT_REQUIRE(shm_allgather(&ag, keys, all, sizeof keys) == HCOLL_SUCCESS, "exchange");
    const hc_rkey_t *peer = &all[2 * (1 - rank)];
    hcoll_status_t st;
    if (rank == 0) {
        /* Into the peer's receive region: lands. */
        HCT_REQUIRE(hc_ib_ops.put(ep, smr, 0, &peer[0], 0, SO_BYTES, 1, 1) == HCOLL_SUCCESS,
                    "put: %s", eb.msg);
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, 1, NULL, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == 1, "put to the receive region: %s", eb.msg);
        HCT_REQUIRE(shm_allgather(&ag, keys, all, sizeof keys) == HCOLL_SUCCESS, "barrier");
        /* Into the peer's send region: the NIC refuses. */
        HCT_REQUIRE(hc_ib_ops.put(ep, smr, 0, &peer[1], 0, 64, 3, 3) == HCOLL_SUCCESS, "put: %s",
                    eb.msg);
        hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, 1, NULL, 10000, &st);
        HCT_REQUIRE(st == HCOLL_ERR_RDMA && strstr(eb.msg, "remote access error"),
                    "a put into a send-only region: %s: %s", hcoll_status_name(st), eb.msg);
    } else {
        uint32_t imm;
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, 1, &imm, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == 1 && imm == 1, "immediate: %s", eb.msg);
        for (size_t i = 0; i < SO_BYTES; i++)
            HCT_REQUIRE(recv[i] == 0x5a, "receive byte %zu is 0x%02x", i, recv[i]);
        HCT_REQUIRE(shm_allgather(&ag, keys, all, sizeof keys) == HCOLL_SUCCESS, "barrier");
        /* The refused put fails this side's QP too; the send buffer is intact. */
        hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, 1, NULL, 10000, &st);
        for (size_t i = 0; i < SO_BYTES; i++)
            HCT_REQUIRE(send[i] == 0x5a, "send byte %zu was overwritten: 0x%02x", i, send[i]);
    }
    hc_ib_ops.mr_dereg(tr, smr);
    hc_ib_ops.mr_dereg(tr, rmr);
    hc_ib_ops.destroy(tr, 0);
    free(send);
    free(recv);
    return 0;
}

START_TEST(reg_send_only)
{
    shm_ag_t *shm = shm_new(0);
    run2(shm, 2, rank_send_only);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ---- whole CUDA allocations, buffer ids ------------------------------------ */

#define WA_BYTES (4u << 20)
#define WA_PARTS 8

static unsigned char pat(size_t i, int round)
{
    return (unsigned char)(i * 131 + (i >> 9) + 7 + round * 29);
}

static int rank_whole_alloc(int rank, int n, void *arg)
{
    shm_ag_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    setenv("HCMOCK_CC", "9.0", 1); /* no flush reads: registrations alone are counted */
    setenv("HCMOCK_IB_SYSFS", shm->root, 1);
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu && gpu_mock_driver(), "no GPU 0 from the mock CUDA driver");
    void *cuh = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *(*d2h)(uint64_t, size_t) = (void *(*)(uint64_t, size_t))dlsym(cuh, "hcmock_dev_to_host");
    HCT_REQUIRE(d2h, "the libcuda.so.1 loaded is not the mock");
    hc_transport_t *tr;
    hc_ep_t *ep = NULL;
    if (open_tr(shm, rank, n, 0, &tr, &ep))
        return 1;
    HCT_REQUIRE(hc_ib_ops.gdr(tr), "GPUDirect is off: %s", tr->gdr_why);
    hc_cu_dptr_t d0 = 0;
    for (int round = 0; round < 2; round++) {
        hc_cu_dptr_t d;
        HCT_REQUIRE(cu->mem_alloc(&d, WA_BYTES) == HC_CU_SUCCESS, "cuMemAlloc");
        if (round == 0)
            d0 = d;
        else
            HCT_REQUIRE(d == d0, "the mock driver did not reuse the freed addresses");
        unsigned char *view = d2h(d, WA_BYTES);
        for (size_t i = 0; i < WA_BYTES; i++)
            view[i] = rank == 0 ? pat(i, round) : 0xA5;
        const uint64_t regs0 = mock_stat("mr_registrations");
        hc_mr_t *mr[WA_PARTS];
        hc_rkey_t rk[WA_PARTS], all[2];
        const size_t part = WA_BYTES / WA_PARTS;
        for (int k = 0; k < WA_PARTS; k++)
            HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (char *)(uintptr_t)d + (size_t)k * part, part, &mr[k],
                                         &rk[k]) == HCOLL_SUCCESS,
                        "reg part %d: %s", k, eb.msg);
        const uint64_t regs = mock_stat("mr_registrations") - regs0;
        HCT_REQUIRE(regs == 1, "round %d: %d sub-ranges of one allocation cost %llu registrations",
                    round, WA_PARTS, (unsigned long long)regs);
        /* Every part's key reaches its own bytes: rank 0 writes part k
         * through part k's key. */
        hcoll_status_t st;
        for (int k = 0; k < WA_PARTS; k++) {
            HCT_REQUIRE(shm_allgather(&ag, &rk[k], all, sizeof rk[k]) == HCOLL_SUCCESS, "keys");
            if (rank == 0) {
                HCT_REQUIRE(hc_ib_ops.put(ep, mr[k], 0, &all[1], 0, part, 100u + (unsigned)k,
                                          (uint64_t)k) == HCOLL_SUCCESS,
                            "put: %s", eb.msg);
                int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, 1, NULL, 10000, &st);
                HCT_REQUIRE(st == HCOLL_SUCCESS && got == 1, "round %d part %d: %s", round, k,
                            eb.msg);
            } else {
                uint32_t imm;
                int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, 1, &imm, 10000, &st);
                HCT_REQUIRE(st == HCOLL_SUCCESS && got == 1 && imm == 100u + (unsigned)k,
                            "round %d part %d: %s", round, k, eb.msg);
            }
        }
        if (rank == 1)
            for (size_t i = 0; i < WA_BYTES; i++)
                HCT_REQUIRE(view[i] == pat(i, round), "round %d: device byte %zu is 0x%02x",
                            round, i, view[i]);
        HCT_REQUIRE(shm_allgather(&ag, &rk[0], all, sizeof rk[0]) == HCOLL_SUCCESS, "barrier");
        for (int k = 0; k < WA_PARTS; k++)
            hc_ib_ops.mr_dereg(tr, mr[k]);
        /* Freed with its entry idle in the cache: the next round's
         * allocation at the same address must not find it. */
        HCT_REQUIRE(cu->mem_free(d) == HC_CU_SUCCESS, "cuMemFree");
    }
    HCT_REQUIRE(tr->mrc.stale >= 1, "the freed allocation's entry was never dropped");
    /* A freed buffer that nothing looks up again: its entry goes at the
     * next registration of any other buffer. */
    hc_cu_dptr_t dc, dd;
    hc_mr_t *mc, *md;
    hc_rkey_t kc, kd;
    HCT_REQUIRE(cu->mem_alloc(&dc, 1u << 20) == HC_CU_SUCCESS, "cuMemAlloc");
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)dc, 4096, &mc, &kc) == HCOLL_SUCCESS,
                "reg: %s", eb.msg);
    hc_ib_ops.mr_dereg(tr, mc);
    const uint64_t stale0 = tr->mrc.stale, live0 = mock_stat("live_mrs");
    HCT_REQUIRE(cu->mem_free(dc) == HC_CU_SUCCESS, "cuMemFree");
    /* A size no freed buffer had: fresh addresses, overlapping no entry. */
    HCT_REQUIRE(cu->mem_alloc(&dd, 24u << 20) == HC_CU_SUCCESS, "cuMemAlloc");
    for (const hc_mrc_entry_t *e = tr->mrc.list; e; e = e->next)
        HCT_REQUIRE((uintptr_t)e->base >= dd + (24u << 20) || (uintptr_t)e->base + e->len <= dd,
                    "the new buffer overlaps a cached entry");
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)dd, 4096, &md, &kd) == HCOLL_SUCCESS,
                "reg: %s", eb.msg);
    for (const hc_mrc_entry_t *e = tr->mrc.list; e; e = e->next)
        HCT_REQUIRE((uintptr_t)e->base != dc, "the freed buffer's idle entry stayed");
    HCT_REQUIRE(tr->mrc.stale == stale0 + 1 && mock_stat("live_mrs") == live0,
                "the freed buffer's idle entry stayed (stale %llu -> %llu, live regions %llu -> "
                "%llu)", (unsigned long long)stale0, (unsigned long long)tr->mrc.stale,
                (unsigned long long)live0, (unsigned long long)mock_stat("live_mrs"));
    hc_ib_ops.mr_dereg(tr, md);
    cu->mem_free(dd);
    hc_ib_ops.destroy(tr, 1);
    dlclose(cuh);
    return 0;
}

START_TEST(reg_whole_allocation)
{
    if (no_cuda("reg_whole_allocation"))
        return;
    shm_ag_t *shm = shm_new(1);
    run2(shm, 2, rank_whole_alloc);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ---- flush reads of the landed buffer --------------------------------------- */

#define FL_BYTES (1u << 20)

static int rank_flush_landed(int rank, int n, void *arg)
{
    shm_ag_t *shm = arg;
    ag_ctx_t ag = { shm, rank };
    setenv("HCMOCK_CC", "8.0", 1);          /* flush reads */
    setenv("HCMOCK_IB_GDR_LAZY", "1", 1);   /* writes show only after a read of their buffer */
    setenv("HCMOCK_IB_SYSFS", shm->root, 1);
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu && gpu_mock_driver(), "no GPU 0 from the mock CUDA driver");
    void *cuh = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *(*d2h)(uint64_t, size_t) = (void *(*)(uint64_t, size_t))dlsym(cuh, "hcmock_dev_to_host");
    HCT_REQUIRE(d2h, "the libcuda.so.1 loaded is not the mock");
    hc_transport_t *tr;
    hc_ep_t *ep = NULL;
    if (open_tr(shm, rank, n, 0, &tr, &ep))
        return 1;
    HCT_REQUIRE(hc_ib_ops.gdr(tr) && tr->flush, "GPUDirect with flushes is off: %s", tr->gdr_why);
    /* Two device buffers live: the target, and another one beside it. */
    hc_cu_dptr_t dt, dother;
    HCT_REQUIRE(cu->mem_alloc(&dother, 65536) == HC_CU_SUCCESS &&
                    cu->mem_alloc(&dt, FL_BYTES) == HC_CU_SUCCESS,
                "cuMemAlloc");
    unsigned char *view = d2h(dt, FL_BYTES);
    for (size_t i = 0; i < FL_BYTES; i++)
        view[i] = rank == 0 ? pat(i, 3) : 0xA5;
    hc_mr_t *mr, *omr;
    hc_rkey_t rk, ork, all[2];
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)dother, 65536, &omr, &ork) ==
                    HCOLL_SUCCESS, "reg: %s", eb.msg);
    HCT_REQUIRE(hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)dt, FL_BYTES, &mr, &rk) == HCOLL_SUCCESS,
                "reg: %s", eb.msg);
    HCT_REQUIRE(shm_allgather(&ag, &rk, all, sizeof rk) == HCOLL_SUCCESS, "keys");
    hcoll_status_t st;
    const int nput = 8;
    const size_t piece = FL_BYTES / (size_t)nput;
    if (rank == 0) {
        for (int k = 0; k < nput; k++)
            HCT_REQUIRE(hc_ib_ops.put(ep, mr, (size_t)k * piece, &all[1], (size_t)k * piece,
                                      piece, 700u + (unsigned)k, (uint64_t)k) == HCOLL_SUCCESS,
                        "put: %s", eb.msg);
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_PUT, nput, NULL, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == nput, "completions %d: %s", got, eb.msg);
    } else {
        /* Immediates reported have their payloads visible (a write that
         * no flush pushed ahead stays invisible for good). */
        uint32_t imms[8];
        int got = hct_wait_comps(&hc_ib_ops, tr, HC_COMP_IMM, nput, imms, 10000, &st);
        HCT_REQUIRE(st == HCOLL_SUCCESS && got == nput, "immediates %d/%d: %s: %s", got, nput,
                    hcoll_status_name(st), eb.msg);
        for (int k = 0; k < nput; k++) {
            const size_t off = (size_t)(imms[k] - 700u) * piece;
            for (size_t i = off; i < off + piece; i++)
                HCT_REQUIRE(view[i] == pat(i, 3),
                            "immediate %u reported before its payload was visible: byte %zu is "
                            "0x%02x (the flush read did not read the buffer it landed in)",
                            imms[k], i, view[i]);
        }
        HCT_REQUIRE(mock_stat("gdr_writes_held") > 0, "no device write was held");
    }
    HCT_REQUIRE(shm_allgather(&ag, &rk, all, sizeof rk) == HCOLL_SUCCESS, "barrier");
    hc_ib_ops.mr_dereg(tr, mr);
    hc_ib_ops.mr_dereg(tr, omr);
    hc_ib_ops.destroy(tr, 1);
    cu->mem_free(dt);
    cu->mem_free(dother);
    dlclose(cuh);
    return 0;
}

START_TEST(reg_flush_landed)
{
    if (no_cuda("reg_flush_landed"))
        return;
    shm_ag_t *shm = shm_new(1);
    run2(shm, 2, rank_flush_landed);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ---- relaxed ordering ------------------------------------------------------ */

/* One host registration under the current environment: how many of the
 * regions made carried the relaxed-ordering flag. */
static int ro_regs(shm_ag_t *shm, uint64_t *ro_out)
{
    hc_transport_t *tr;
    if (open_tr(shm, 0, 1, -1, &tr, NULL))
        return 1;
    const uint64_t ro0 = mock_stat("relaxed_ordering_registrations");
    void *buf = malloc(SO_BYTES);
    hc_mr_t *mr;
    hc_rkey_t rk;
    HCT_REQUIRE(buf && hc_ib_ops.mr_reg(tr, buf, SO_BYTES, &mr, &rk) == HCOLL_SUCCESS,
                "reg: %s", eb.msg);
    *ro_out = mock_stat("relaxed_ordering_registrations") - ro0;
    hc_ib_ops.mr_dereg(tr, mr);
    hc_ib_ops.destroy(tr, 0);
    free(buf);
    return 0;
}

static int rank_relaxed(int rank, int n, void *arg)
{
    (void)rank;
    (void)n;
    shm_ag_t *shm = arg;
    uint64_t ro;
    if (ro_regs(shm, &ro))
        return 1;
    HCT_REQUIRE(ro == 1, "default: %llu relaxed-ordering regions, want 1", (unsigned long long)ro);
    setenv("HCOLL_IB_PCI_RELAXED_ORDERING", "0", 1);
    if (ro_regs(shm, &ro))
        return 1;
    HCT_REQUIRE(ro == 0, "knob 0: %llu relaxed-ordering regions", (unsigned long long)ro);
    unsetenv("HCOLL_IB_PCI_RELAXED_ORDERING");
    setenv("HCMOCK_IB_RO", "0", 1); /* the NIC refuses the flag: registered without it */
    if (ro_regs(shm, &ro))
        return 1;
    HCT_REQUIRE(ro == 0, "refused flag: %llu relaxed-ordering regions", (unsigned long long)ro);
    unsetenv("HCMOCK_IB_RO");
    setenv("HCMOCK_IB_IOVA2", "0", 1); /* no ibv_reg_mr_iova2 to speak of */
    setenv("HCOLL_IB_PCI_RELAXED_ORDERING", "1", 1);
    if (ro_regs(shm, &ro))
        return 1;
    HCT_REQUIRE(ro == 0, "no iova2: %llu relaxed-ordering regions", (unsigned long long)ro);
    return 0;
}

START_TEST(reg_relaxed_ordering)
{
    shm_ag_t *shm = shm_new(0);
    run2(shm, 1, rank_relaxed);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ---- the flush decision ------------------------------------------------------ */

static int rank_c2c(int rank, int n, void *arg)
{
    shm_ag_t *shm = arg;
    /* Grace Hopper: sm_90 that orders the NIC's writes for itself, but
     * the CPU hears of them over C2C; GPU 0 and mlx5_0 share a switch. */
    setenv("HCMOCK_CC", "9.0", 1);
    setenv("HCMOCK_RDMA_ORDERING", "100", 1);
    setenv("HCMOCK_C2C", "1", 1);
    setenv("HCMOCK_IB_SYSFS", shm->root, 1);
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu && gpu_mock_driver(), "no GPU 0 from the mock CUDA driver");
    HCT_REQUIRE(hc_gdr_gpu_c2c(0) == 1, "the C2C link is not seen");
    hc_transport_t *tr;
    if (open_tr(shm, rank, n, 0, &tr, NULL))
        return 1;
    HCT_REQUIRE(tr->gdr && tr->flush, "GPUDirect %d, flush %d on a C2C host: %s", tr->gdr,
                tr->flush, tr->gdr_why);
    hc_ib_ops.destroy(tr, 0);
    return 0;
}

START_TEST(reg_flush_c2c)
{
    /* knob, cc, ordering, C2C, GPU-NIC distance */
    ck_assert_int_eq(hc_gdr_flush_decide_path(-1, 8, -1, 0, HC_PCI_PXB), 1); /* Ampere */
    ck_assert_int_eq(hc_gdr_flush_decide_path(-1, 9, -1, 0, HC_PCI_PXB), 0); /* Hopper, PCIe */
    ck_assert_int_eq(hc_gdr_flush_decide_path(-1, 9, 0, 0, HC_PCI_PXB), 1);  /* orders nothing */
    ck_assert_int_eq(hc_gdr_flush_decide_path(-1, 8, 100, 0, HC_PCI_PXB), 0); /* owner */
    ck_assert_int_eq(hc_gdr_flush_decide_path(-1, 9, 100, 1, HC_PCI_PXB), 1); /* C2C, switch */
    ck_assert_int_eq(hc_gdr_flush_decide_path(-1, 9, 200, 1, HC_PCI_PIX), 1);
    ck_assert_int_eq(hc_gdr_flush_decide_path(-1, 9, 100, 1, HC_PCI_PHB), 0); /* via the CPU */
    ck_assert_int_eq(hc_gdr_flush_decide_path(-1, 9, 100, -1, HC_PCI_PXB), 0); /* unknown */
    ck_assert_int_eq(hc_gdr_flush_decide_path(0, 9, 100, 1, HC_PCI_PXB), 0);   /* forced */
    ck_assert_int_eq(hc_gdr_flush_decide_path(1, 9, 100, 0, HC_PCI_PXB), 1);
    if (no_cuda("reg_flush_c2c"))
        return;
    shm_ag_t *shm = shm_new(1);
    run2(shm, 1, rank_c2c);
    hct_shared_free(shm, sizeof *shm);
}
END_TEST

/* ---------------------------------------------------------------------------- */

static Suite *suite(void)
{
    Suite *s = suite_create("ib_reg");
    TCase *t = tcase_create("reg");
    tcase_set_timeout(t, TEST_TIMEOUT_S);
    tcase_add_test(t, reg_send_only);
    tcase_add_test(t, reg_whole_allocation);
    tcase_add_test(t, reg_flush_landed);
    tcase_add_test(t, reg_relaxed_ordering);
    tcase_add_test(t, reg_flush_c2c);
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
