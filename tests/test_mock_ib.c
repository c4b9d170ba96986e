/*
 * The verbs transport end to end, on the emulated libibverbs of
 * tests/mock/verbs.c (build/mock/libibverbs.so.1) and the RoCE fixture tree
 * tests/fixtures/sysfs-roce (bonded NICs, RoCE v2 GIDs with IPv4-mapped
 * addresses):
 *
 *   mock_*   the emulation itself, through the verbs API: discovery from
 *            sysfs, registration rules, the RC state table, WRITE_WITH_IMM
 *            and READ, queue limits, and the failures a NIC reports
 *            (remote access, RNR, retries exceeded, wrong GID, CQ overrun)
 *   seam_*   hcoll's verbs transport (hc_ib_create and hc_ib_ops) on two
 *            forked ranks: puts landing with their immediates, a put past
 *            the peer's region, a peer that dies; GPUDirect: device memory
 *            of the emulated CUDA driver (tests/mock/cuda.c) registered
 *            through nvidia-peermem and written by the NIC, immediates held
 *            back by flush reads (sm_80), on tests/fixtures/sysfs-mockib
 *   api_*    hcoll_allreduce with HCOLL_NET=ib on 2 and 4 emulated nodes
 *            and on 2 x 2 (two NICs per node), results compared bit for
 *            bit, the NET/IB log line, and a rank killed mid-transfer
 *   regress_* library bugs this emulation exposed, one case each (each
 *            failed before its fix)
 *
 * dlopen reads LD_LIBRARY_PATH when the process starts, so main re-executes
 * this program with LD_LIBRARY_PATH=$HCOLL_TEST_BUILD/mock and
 * HCOLL_SYSFS_ROOT set. Skips (77) when hcoll was built without rdma-core
 * headers or the mock is not built.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "common/ranks.h"
#include "common/seam.h"
#include "gpu/gpuhelp.h"
#include "base/config.h"
#include "base/err.h"
#include "hc_build.h"
#include "inter/ib/ib.h"
#include "inter/transport.h"

#if HCOLL_BUILD_VERBS
#include <infiniband/verbs.h>
#undef ibv_query_port
#undef ibv_reg_mr

#define TEST_TIMEOUT_S 60
#define MAXR 4

/* ------------------------------------------------------------------------ */
/* The mock, reached as hcoll reaches libibverbs                              */
/* ------------------------------------------------------------------------ */

typedef struct vfns {
    void *h;
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    int (*query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*destroy_qp)(struct ibv_qp *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    const char *(*hcmock_verbs)(void);
    uint64_t (*stat)(const char *);
} vfns_t;

static vfns_t V;

static int vfns_load(char *why, size_t len)
{
    V.h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!V.h) {
        snprintf(why, len, "dlopen libibverbs.so.1: %s", dlerror());
        return -1;
    }
#define L(f, n)                                                                              \
    do {                                                                                     \
        *(void **)&V.f = dlsym(V.h, n);                                                      \
        if (!V.f) {                                                                          \
            snprintf(why, len, "the libibverbs.so.1 found lacks %s (not the mock?)", n);     \
            return -1;                                                                       \
        }                                                                                    \
    } while (0)
    L(hcmock_verbs, "hcmock_verbs");
    L(stat, "hcmock_verbs_stat");
    L(get_device_list, "ibv_get_device_list");
    L(free_device_list, "ibv_free_device_list");
    L(get_device_name, "ibv_get_device_name");
    L(open_device, "ibv_open_device");
    L(close_device, "ibv_close_device");
    L(query_port, "ibv_query_port");
    L(query_gid, "ibv_query_gid");
    L(alloc_pd, "ibv_alloc_pd");
    L(dealloc_pd, "ibv_dealloc_pd");
    L(create_cq, "ibv_create_cq");
    L(destroy_cq, "ibv_destroy_cq");
    L(create_qp, "ibv_create_qp");
    L(modify_qp, "ibv_modify_qp");
    L(destroy_qp, "ibv_destroy_qp");
    L(reg_mr, "ibv_reg_mr");
    L(dereg_mr, "ibv_dereg_mr");
#undef L
    if (strcmp(V.hcmock_verbs(), "hcoll-mock-verbs") != 0) {
        snprintf(why, len, "hcmock_verbs() says '%s'", V.hcmock_verbs());
        return -1;
    }
    return 0;
}

/* What verbs.h's inline ibv_query_port does, without linking the library:
 * the extended op the provider put in its verbs_context. */
static int port_query(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (!vctx)
        return -1;
    return vctx->query_port(ctx, port, attr, sizeof *attr);
}

static struct ibv_context *open_dev(const char *name)
{
    int n = 0;
    struct ibv_device **l = V.get_device_list(&n);
    struct ibv_context *c = NULL;
    for (int i = 0; l && i < n; i++)
        if (strcmp(V.get_device_name(l[i]), name) == 0)
            c = V.open_device(l[i]);
    V.free_device_list(l);
    return c;
}

/* ------------------------------------------------------------------------ */
/* mock_*: two QPs of one context wired to each other                         */
/* ------------------------------------------------------------------------ */

#define GID_V2_IPV4 3 /* mlx5_bond_0: ::ffff:10.0.0.1, RoCE v2 */

typedef struct qpe {
    struct ibv_cq *cq;
    struct ibv_qp *qp;
} qpe_t;

static qpe_t qp_new(struct ibv_context *ctx, struct ibv_pd *pd, int sq, int rq, int cqe)
{
    qpe_t e;
    e.cq = V.create_cq(ctx, cqe, NULL, NULL, 0);
    ck_assert_ptr_nonnull(e.cq);
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = e.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = (uint32_t)sq;
    ia.cap.max_recv_wr = (uint32_t)rq;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = 64;
    e.qp = V.create_qp(pd, &ia);
    ck_assert_ptr_nonnull(e.qp);
    ck_assert_uint_lt(e.qp->qp_num, 1u << 24);
    return e;
}

static int to_init(struct ibv_qp *qp, int access)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = (unsigned)access;
    return V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                   IBV_QP_ACCESS_FLAGS);
}

static void rtr_attr(struct ibv_context *ctx, uint32_t dqpn, struct ibv_qp_attr *a)
{
    memset(a, 0, sizeof *a);
    a->qp_state = IBV_QPS_RTR;
    a->path_mtu = IBV_MTU_4096;
    a->dest_qp_num = dqpn;
    a->rq_psn = 1000;
    a->max_dest_rd_atomic = 1;
    a->min_rnr_timer = 12;
    a->ah_attr.port_num = 1;
    a->ah_attr.is_global = 1;
    a->ah_attr.grh.sgid_index = GID_V2_IPV4;
    a->ah_attr.grh.hop_limit = 255;
    ck_assert_int_eq(V.query_gid(ctx, 1, GID_V2_IPV4, &a->ah_attr.grh.dgid), 0);
}

#define RTR_MASK                                                                          \
    (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |      \
     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define RTS_MASK                                                                          \
    (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | \
     IBV_QP_MAX_QP_RD_ATOMIC)

static void rts_attr(struct ibv_qp_attr *a, int rnr_retry)
{
    memset(a, 0, sizeof *a);
    a->qp_state = IBV_QPS_RTS;
    a->timeout = 14;
    a->retry_cnt = 7;
    a->rnr_retry = (uint8_t)rnr_retry;
    a->sq_psn = 1000;
    a->max_rd_atomic = 1;
}

/* Both QPs to RTS, pointing at each other. */
static void connect_pair(struct ibv_context *ctx, qpe_t *a, qpe_t *b, int rnr_retry,
                         int b_min_rnr_timer)
{
    const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ck_assert_int_eq(to_init(a->qp, acc), 0);
    ck_assert_int_eq(to_init(b->qp, acc), 0);
    struct ibv_qp_attr at;
    rtr_attr(ctx, b->qp->qp_num, &at);
    ck_assert_int_eq(V.modify_qp(a->qp, &at, RTR_MASK), 0);
    rtr_attr(ctx, a->qp->qp_num, &at);
    at.min_rnr_timer = (uint8_t)b_min_rnr_timer;
    ck_assert_int_eq(V.modify_qp(b->qp, &at, RTR_MASK), 0);
    rts_attr(&at, rnr_retry);
    ck_assert_int_eq(V.modify_qp(a->qp, &at, RTS_MASK), 0);
    ck_assert_int_eq(V.modify_qp(b->qp, &at, RTS_MASK), 0);
}

/* A context, a PD and two QPs, torn down in reverse order: everything is
 * released explicitly, as ibv_close_device(3) asks. */
typedef struct rig {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    qpe_t a, b;
    struct ibv_mr *mrs[8];
    int nmr;
} rig_t;

static void rig_open(rig_t *r, int sq, int rq, int cqe_a, int cqe_b)
{
    memset(r, 0, sizeof *r);
    r->ctx = open_dev("mlx5_bond_0");
    ck_assert_ptr_nonnull(r->ctx);
    r->pd = V.alloc_pd(r->ctx);
    ck_assert_ptr_nonnull(r->pd);
    r->a = qp_new(r->ctx, r->pd, sq, rq, cqe_a);
    r->b = qp_new(r->ctx, r->pd, sq, rq, cqe_b);
}

static struct ibv_mr *rig_mr(rig_t *r, void *p, size_t len, int access)
{
    struct ibv_mr *m = V.reg_mr(r->pd, p, len, access);
    ck_assert_ptr_nonnull(m);
    r->mrs[r->nmr++] = m;
    return m;
}

static void rig_close(rig_t *r)
{
    if (r->a.qp)
        ck_assert_int_eq(V.destroy_qp(r->a.qp), 0);
    if (r->b.qp)
        ck_assert_int_eq(V.destroy_qp(r->b.qp), 0);
    ck_assert_int_eq(V.destroy_cq(r->a.cq), 0);
    ck_assert_int_eq(V.destroy_cq(r->b.cq), 0);
    while (r->nmr)
        ck_assert_int_eq(V.dereg_mr(r->mrs[--r->nmr]), 0);
    ck_assert_int_eq(V.dealloc_pd(r->pd), 0);
    ck_assert_int_eq(V.close_device(r->ctx), 0);
}

static int post_write(struct ibv_qp *qp, int opcode, void *src, uint32_t len, uint32_t lkey,
                      uint64_t raddr, uint32_t rkey, uint32_t imm_host, uint64_t wr_id,
                      int flags)
{
    struct ibv_sge sge = { (uintptr_t)src, len, lkey };
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.opcode = (enum ibv_wr_opcode)opcode;
    wr.send_flags = (unsigned)flags;
    if (len) {
        wr.sg_list = &sge;
        wr.num_sge = 1;
    }
    wr.imm_data = htonl(imm_host);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(qp, &wr, &bad);
}

static int post_recv0(struct ibv_qp *qp, uint64_t wr_id)
{
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    return ibv_post_recv(qp, &wr, &bad);
}

/* Wait for n completions on cq (up to ms); returns how many came. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, int ms)
{
    int got = 0;
    double deadline = hct_now_ms() + ms;
    while (got < n && hct_now_ms() < deadline) {
        int k = ibv_poll_cq(cq, n - got, wc + got);
        if (k < 0)
            return k;
        got += k;
        if (!k)
            usleep(200);
    }
    return got;
}

START_TEST(mock_discovery)
{
    int n = 0;
    struct ibv_device **l = V.get_device_list(&n);
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq(n, 4);
    ck_assert_str_eq(V.get_device_name(l[0]), "mlx5_4");
    ck_assert_str_eq(V.get_device_name(l[1]), "mlx5_bond_0");
    ck_assert_ptr_null(l[4]);
    V.free_device_list(l);

    struct ibv_context *ctx = open_dev("mlx5_bond_0");
    ck_assert_ptr_nonnull(ctx);
    /* The extended op, as hcoll calls it. */
    struct ibv_port_attr pa;
    ck_assert_int_eq(port_query(ctx, 1, &pa), 0);
    ck_assert_int_eq(pa.state, IBV_PORT_ACTIVE);
    ck_assert_int_eq(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
    ck_assert_int_eq(pa.active_mtu, IBV_MTU_4096);
    ck_assert_int_eq(pa.gid_tbl_len, 6);
    ck_assert_int_eq(pa.lid, 0);
    /* ... and the exported compat entry point. */
    memset(&pa, 0, sizeof pa);
    ck_assert_int_eq(V.query_port(ctx, 1, (struct _compat_ibv_port_attr *)&pa), 0);
    ck_assert_int_eq(pa.state, IBV_PORT_ACTIVE);
    ck_assert_int_ne(port_query(ctx, 2, &pa), 0);
    union ibv_gid g;
    ck_assert_int_eq(V.query_gid(ctx, 1, GID_V2_IPV4, &g), 0);
    const uint8_t want[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1 };
    ck_assert_mem_eq(g.raw, want, 16);
    ck_assert_int_ne(V.query_gid(ctx, 1, 6, &g), 0);
    ck_assert_int_eq(V.close_device(ctx), 0);

    ctx = open_dev("mlx5_4");
    ck_assert_ptr_nonnull(ctx);
    ck_assert_int_eq(port_query(ctx, 1, &pa), 0);
    ck_assert_int_eq(pa.state, IBV_PORT_DOWN);
    V.close_device(ctx);
}
END_TEST

START_TEST(mock_mr_rules)
{
    struct ibv_context *ctx = open_dev("mlx5_bond_0");
    ck_assert_ptr_nonnull(ctx);
    struct ibv_pd *pd = V.alloc_pd(ctx);
    ck_assert_ptr_nonnull(pd);
    static char buf[8192];
    errno = 0;
    ck_assert_ptr_null(V.reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE));
    ck_assert_int_eq(errno, EINVAL);
    ck_assert_ptr_null(V.reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE));
    ck_assert_int_eq(errno, EINVAL);
    /* Unmapped memory cannot be pinned. */
    char *gone = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(gone, MAP_FAILED);
    munmap(gone, 65536);
    ck_assert_ptr_null(V.reg_mr(pd, gone, 4096, IBV_ACCESS_LOCAL_WRITE));
    ck_assert_int_eq(errno, EFAULT);
    /* Read-only memory: fine for local reads, not with write access. */
    char *ro = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(ro, MAP_FAILED);
    ck_assert_ptr_null(V.reg_mr(pd, ro, 8192, IBV_ACCESS_LOCAL_WRITE));
    ck_assert_int_eq(errno, EFAULT);
    struct ibv_mr *rom = V.reg_mr(pd, ro, 8192, IBV_ACCESS_REMOTE_READ);
    ck_assert_ptr_nonnull(rom);
    struct ibv_mr *m1 = V.reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_mr *m2 = V.reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ck_assert_ptr_nonnull(m1);
    ck_assert_ptr_nonnull(m2);
    ck_assert_uint_ne(m1->lkey, m2->lkey);
    ck_assert_uint_ne(m1->rkey, m2->rkey);
    ck_assert_uint_ne(m1->lkey, m1->rkey);
    /* A PD with live regions cannot go. */
    ck_assert_int_eq(V.dealloc_pd(pd), EBUSY);
    ck_assert_int_eq(V.dereg_mr(m1), 0);
    ck_assert_int_eq(V.dereg_mr(m2), 0);
    ck_assert_int_eq(V.dereg_mr(rom), 0);
    munmap(ro, 8192);
    ck_assert_int_eq(V.dealloc_pd(pd), 0);
    V.close_device(ctx);
}
END_TEST

START_TEST(mock_qp_state_machine)
{
    struct ibv_context *ctx = open_dev("mlx5_bond_0");
    struct ibv_pd *pd = V.alloc_pd(ctx);
    qpe_t a = qp_new(ctx, pd, 8, 8, 32);
    qpe_t b = qp_new(ctx, pd, 8, 8, 32);
    ck_assert_uint_ne(a.qp->qp_num, b.qp->qp_num);
    static char buf[64];
    struct ibv_mr *mr = V.reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    /* Posting a send before RTS is refused. */
    ck_assert_int_eq(post_write(a.qp, IBV_WR_RDMA_WRITE, buf, 8, mr->lkey, 0, 0, 0, 1, 0), EINVAL);
    /* A receive in RESET too, in INIT it is fine. */
    ck_assert_int_eq(post_recv0(a.qp, 1), EINVAL);
    struct ibv_qp_attr at;
    rtr_attr(ctx, b.qp->qp_num, &at);
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTR_MASK), EINVAL); /* RESET -> RTR */
    memset(&at, 0, sizeof at);
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    ck_assert_int_eq(V.modify_qp(a.qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT),
                     EINVAL); /* no access flags */
    ck_assert_int_eq(to_init(a.qp, IBV_ACCESS_LOCAL_WRITE), 0);
    ck_assert_int_eq(post_recv0(a.qp, 1), 0);
    rtr_attr(ctx, b.qp->qp_num, &at);
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTR_MASK & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
    at.ah_attr.is_global = 0;
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTR_MASK), EINVAL); /* RoCE needs a GRH */
    rtr_attr(ctx, b.qp->qp_num, &at);
    at.ah_attr.grh.sgid_index = 5; /* an all-zero entry */
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTR_MASK), EINVAL);
    rtr_attr(ctx, b.qp->qp_num, &at);
    at.ah_attr.grh.sgid_index = 1; /* link-local IPv6 source, IPv4 destination */
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTR_MASK), EHOSTUNREACH);
    rtr_attr(ctx, b.qp->qp_num, &at);
    at.dest_qp_num = 1u << 24;
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTR_MASK), EINVAL);
    rtr_attr(ctx, b.qp->qp_num, &at);
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTR_MASK), 0);
    ck_assert_int_eq(post_write(a.qp, IBV_WR_RDMA_WRITE, buf, 8, mr->lkey, 0, 0, 0, 1, 0), EINVAL);
    rts_attr(&at, 7);
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTS_MASK | IBV_QP_DEST_QPN), EINVAL);
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTS_MASK & ~IBV_QP_SQ_PSN), EINVAL);
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTS_MASK), 0);
    ck_assert_int_eq(V.modify_qp(a.qp, &at, RTS_MASK), EINVAL); /* RTS -> RTS takes no PSN */
    /* A CQ in use cannot go. */
    ck_assert_int_eq(V.destroy_cq(a.cq), EBUSY);
    at.qp_state = IBV_QPS_ERR;
    ck_assert_int_eq(V.modify_qp(a.qp, &at, IBV_QP_STATE), 0);
    struct ibv_wc wc;
    ck_assert_int_eq(poll_n(a.cq, &wc, 1, 1000), 1); /* the receive posted in INIT flushes */
    ck_assert_int_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
    ck_assert_uint_eq(wc.wr_id, 1);
    ck_assert_int_eq(V.dereg_mr(mr), 0);
    ck_assert_int_eq(V.destroy_qp(a.qp), 0);
    ck_assert_int_eq(V.destroy_qp(b.qp), 0);
    ck_assert_int_eq(V.destroy_cq(a.cq), 0);
    ck_assert_int_eq(V.destroy_cq(b.cq), 0);
    ck_assert_int_eq(V.dealloc_pd(pd), 0);
    ck_assert_int_eq(V.close_device(ctx), 0);
}
END_TEST

START_TEST(mock_write_imm_and_read)
{
    rig_t r;
    rig_open(&r, 16, 16, 64, 64);
    connect_pair(r.ctx, &r.a, &r.b, 7, 12);
    const size_t big = 3u << 20;
    unsigned char *src = malloc(big), *dst = calloc(1, big + 64), *rd = calloc(1, 4096);
    ck_assert(src && dst && rd);
    for (size_t i = 0; i < big; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *ms = rig_mr(&r, src, big, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *md = rig_mr(&r, dst, big + 64, rw);
    struct ibv_mr *mrd = rig_mr(&r, rd, 4096, IBV_ACCESS_LOCAL_WRITE);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(post_recv0(r.b.qp, 100 + (uint64_t)i), 0);
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, src, (uint32_t)big, ms->lkey,
                                (uintptr_t)dst + 17, md->rkey, 0x01020304, 1, IBV_SEND_SIGNALED),
                     0);
    /* Zero bytes: the immediate is all it carries; no key is checked. */
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0, 0, 77, 2,
                                IBV_SEND_SIGNALED),
                     0);
    /* Inline: the source may die right after the post. */
    {
        uint64_t word = 0x1122334455667788ull;
        ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, &word, 8, 0, (uintptr_t)dst,
                                    md->rkey, 0, 3, IBV_SEND_SIGNALED | IBV_SEND_INLINE),
                         0);
        word = 0;
    }
    struct ibv_wc wc[8];
    ck_assert_int_eq(poll_n(r.a.cq, wc, 3, 5000), 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(wc[i].status, IBV_WC_SUCCESS);
        ck_assert_int_eq(wc[i].opcode, IBV_WC_RDMA_WRITE);
        ck_assert_uint_eq(wc[i].wr_id, (uint64_t)i + 1);
    }
    ck_assert_int_eq(poll_n(r.b.cq, wc, 2, 5000), 2);
    ck_assert_int_eq(wc[0].status, IBV_WC_SUCCESS);
    ck_assert_int_eq(wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    ck_assert(wc[0].wc_flags & IBV_WC_WITH_IMM);
    ck_assert_uint_eq(wc[0].imm_data, htonl(0x01020304)); /* network order, as posted */
    ck_assert_uint_eq(wc[0].byte_len, big);
    ck_assert_uint_eq(wc[0].wr_id, 100);
    ck_assert_uint_eq(wc[0].qp_num, r.b.qp->qp_num);
    ck_assert_uint_eq(ntohl(wc[1].imm_data), 77);
    ck_assert_uint_eq(wc[1].byte_len, 0);
    ck_assert_mem_eq(dst + 17, src, big);
    uint64_t w;
    memcpy(&w, dst, 8);
    ck_assert_uint_eq(w, 0x1122334455667788ull);
    ck_assert_uint_eq(dst[big + 17], 0);
    /* RDMA read of 100 bytes of the target back. */
    struct ibv_sge sge = { (uintptr_t)rd, 100, mrd->lkey };
    struct ibv_send_wr rwr, *bad;
    memset(&rwr, 0, sizeof rwr);
    rwr.wr_id = 9;
    rwr.opcode = IBV_WR_RDMA_READ;
    rwr.send_flags = IBV_SEND_SIGNALED;
    rwr.sg_list = &sge;
    rwr.num_sge = 1;
    rwr.wr.rdma.remote_addr = (uintptr_t)dst + 17;
    rwr.wr.rdma.rkey = md->rkey;
    ck_assert_int_eq(ibv_post_send(r.a.qp, &rwr, &bad), 0);
    ck_assert_int_eq(poll_n(r.a.cq, wc, 1, 5000), 1);
    ck_assert_int_eq(wc[0].status, IBV_WC_SUCCESS);
    ck_assert_int_eq(wc[0].opcode, IBV_WC_RDMA_READ);
    ck_assert_uint_eq(wc[0].byte_len, 100);
    ck_assert_mem_eq(rd, src, 100);
    ck_assert_uint_eq(V.stat("rnr_naks"), 0);
    ck_assert_uint_ge(V.stat("writes"), 3);
    rig_close(&r);
    free(src);
    free(dst);
    free(rd);
}
END_TEST

START_TEST(mock_queue_limits)
{
    rig_t r;
    rig_open(&r, 4, 2, 64, 64);
    connect_pair(r.ctx, &r.a, &r.b, 7, 12);
    static char dst[4096];
    struct ibv_mr *md = rig_mr(&r, dst, sizeof dst,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    /* Receive queue: 2 outstanding at most. */
    ck_assert_int_eq(post_recv0(r.b.qp, 1), 0);
    ck_assert_int_eq(post_recv0(r.b.qp, 2), 0);
    ck_assert_int_eq(post_recv0(r.b.qp, 3), ENOMEM);
    /* Send queue: 4 outstanding; a slot frees when its completion is polled. */
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, NULL, 0, 0, (uintptr_t)dst,
                                    md->rkey, 0, (uint64_t)i, IBV_SEND_SIGNALED),
                         0);
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, NULL, 0, 0, 0, 0, 0, 9,
                                IBV_SEND_SIGNALED),
                     ENOMEM);
    usleep(100000); /* all four acknowledged by now, none polled */
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, NULL, 0, 0, 0, 0, 0, 9,
                                IBV_SEND_SIGNALED),
                     ENOMEM);
    struct ibv_wc wc[8];
    ck_assert_int_eq(poll_n(r.a.cq, wc, 4, 5000), 4);
    /* Unsignaled WRs hold their slots until a later signaled one is polled. */
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, NULL, 0, 0, 0, 0, 0, 20, 0), 0);
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, NULL, 0, 0, 0, 0, 0, 21,
                                IBV_SEND_SIGNALED),
                     0);
    usleep(100000);
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, NULL, 0, 0, 0, 0, 0, 22, 0), ENOMEM);
    ck_assert_int_eq(poll_n(r.a.cq, wc, 1, 5000), 1);
    ck_assert_uint_eq(wc[0].wr_id, 21);
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, NULL, 0, 0, 0, 0, 0, 22,
                                IBV_SEND_SIGNALED),
                     0);
    /* Inline data larger than the QP's max_inline_data is refused. */
    static char big[128];
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, big, sizeof big, 0, (uintptr_t)dst,
                                md->rkey, 0, 23, IBV_SEND_SIGNALED | IBV_SEND_INLINE),
                     ENOMEM);
    ck_assert_int_eq(poll_n(r.a.cq, wc, 1, 5000), 1);
    rig_close(&r);
}
END_TEST

START_TEST(mock_remote_access_error)
{
    rig_t r;
    rig_open(&r, 16, 16, 64, 64);
    connect_pair(r.ctx, &r.a, &r.b, 7, 12);
    static char src[256], dst[128];
    struct ibv_mr *ms = rig_mr(&r, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *md = rig_mr(&r, dst, sizeof dst,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ck_assert_int_eq(post_recv0(r.b.qp, 50), 0);
    /* 256 bytes into a 128-byte region, then one more WR behind it. */
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, src, 256, ms->lkey, (uintptr_t)dst,
                                md->rkey, 0, 1, IBV_SEND_SIGNALED),
                     0);
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, src, 8, ms->lkey, (uintptr_t)dst,
                                md->rkey, 0, 2, 0),
                     0);
    struct ibv_wc wc[4];
    ck_assert_int_eq(poll_n(r.a.cq, wc, 2, 5000), 2);
    ck_assert_int_eq(wc[0].status, IBV_WC_REM_ACCESS_ERR);
    ck_assert_uint_eq(wc[0].wr_id, 1);
    ck_assert_int_eq(wc[1].status, IBV_WC_WR_FLUSH_ERR); /* flushed although unsignaled */
    ck_assert_uint_eq(wc[1].wr_id, 2);
    /* The responder's QP is in error too: its receive flushes. */
    ck_assert_int_eq(poll_n(r.b.cq, wc, 1, 5000), 1);
    ck_assert_int_eq(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    ck_assert_uint_eq(wc[0].wr_id, 50);
    /* Posting to a QP in error completes at once with a flush. */
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, src, 8, ms->lkey, 0, 0, 0, 3, 0), 0);
    ck_assert_int_eq(poll_n(r.a.cq, wc, 1, 5000), 1);
    ck_assert_int_eq(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    ck_assert_uint_eq(V.stat("rem_access_errors"), 1);
    rig_close(&r);
}
END_TEST

START_TEST(mock_rnr_retry_exceeded)
{
    rig_t r;
    rig_open(&r, 16, 16, 64, 64);
    connect_pair(r.ctx, &r.a, &r.b, 1, 20); /* two tries, 10.24 ms apart */
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0, 0, 5, 1,
                                IBV_SEND_SIGNALED),
                     0);
    struct ibv_wc wc;
    double t0 = hct_now_ms();
    ck_assert_int_eq(poll_n(r.a.cq, &wc, 1, 5000), 1);
    ck_assert_int_eq(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
    ck_assert_double_lt(hct_now_ms() - t0, 2000);
    ck_assert_uint_ge(V.stat("rnr_exceeded"), 1);
    rig_close(&r);
}
END_TEST

START_TEST(mock_peer_gone)
{
    setenv("HCMOCK_IB_RETRY_MS", "300", 1);
    rig_t r;
    rig_open(&r, 16, 16, 64, 64);
    connect_pair(r.ctx, &r.a, &r.b, 7, 12);
    ck_assert_int_eq(V.destroy_qp(r.b.qp), 0);
    r.b.qp = NULL;
    double t0 = hct_now_ms();
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE, NULL, 0, 0, 0, 0, 0, (uint64_t)i,
                                    IBV_SEND_SIGNALED),
                         0);
    struct ibv_wc wc[3];
    ck_assert_int_eq(poll_n(r.a.cq, wc, 3, 5000), 3);
    double dt = hct_now_ms() - t0;
    ck_assert_int_eq(wc[0].status, IBV_WC_RETRY_EXC_ERR);
    ck_assert_int_eq(wc[1].status, IBV_WC_WR_FLUSH_ERR);
    ck_assert_int_eq(wc[2].status, IBV_WC_WR_FLUSH_ERR);
    ck_assert_msg(dt > 250 && dt < 1500, "retries exceeded after %.0f ms (window 300)", dt);
    rig_close(&r);
    unsetenv("HCMOCK_IB_RETRY_MS");
}
END_TEST

/* A wrong destination GID: nothing ever answers, as on a real fabric. */
START_TEST(mock_wrong_gid)
{
    setenv("HCMOCK_IB_RETRY_MS", "300", 1);
    rig_t r;
    rig_open(&r, 16, 16, 64, 64);
    const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ck_assert_int_eq(to_init(r.a.qp, acc), 0);
    ck_assert_int_eq(to_init(r.b.qp, acc), 0);
    struct ibv_qp_attr at;
    rtr_attr(r.ctx, r.b.qp->qp_num, &at);
    at.ah_attr.grh.dgid.raw[15] = 9; /* ::ffff:10.0.0.9, nobody's */
    ck_assert_int_eq(V.modify_qp(r.a.qp, &at, RTR_MASK), 0);
    rtr_attr(r.ctx, r.a.qp->qp_num, &at);
    ck_assert_int_eq(V.modify_qp(r.b.qp, &at, RTR_MASK), 0);
    rts_attr(&at, 7);
    ck_assert_int_eq(V.modify_qp(r.a.qp, &at, RTS_MASK), 0);
    ck_assert_int_eq(V.modify_qp(r.b.qp, &at, RTS_MASK), 0);
    ck_assert_int_eq(post_recv0(r.b.qp, 1), 0);
    ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0, 0, 1, 1,
                                IBV_SEND_SIGNALED),
                     0);
    struct ibv_wc wc;
    ck_assert_int_eq(poll_n(r.a.cq, &wc, 1, 5000), 1);
    ck_assert_int_eq(wc.status, IBV_WC_RETRY_EXC_ERR);
    ck_assert_int_eq(ibv_poll_cq(r.b.cq, 1, &wc), 0); /* nothing arrived */
    ck_assert_uint_ge(V.stat("dropped_conns"), 1);
    rig_close(&r);
    unsetenv("HCMOCK_IB_RETRY_MS");
}
END_TEST

START_TEST(mock_cq_overrun)
{
    rig_t r;
    rig_open(&r, 16, 16, 64, 2); /* B: two entries for three receives */
    connect_pair(r.ctx, &r.a, &r.b, 7, 12);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(post_recv0(r.b.qp, (uint64_t)i), 0);
        ck_assert_int_eq(post_write(r.a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0, 0, 1,
                                    (uint64_t)i, IBV_SEND_SIGNALED),
                         0);
    }
    struct ibv_wc wc[3];
    ck_assert_int_eq(poll_n(r.a.cq, wc, 3, 5000), 3);
    ck_assert_int_lt(ibv_poll_cq(r.b.cq, 3, wc), 0);
    ck_assert_uint_eq(V.stat("cq_overruns"), 1);
    rig_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* seam_*: hcoll's verbs transport on two forked ranks                        */
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

static hcoll_status_t seam_create(int rank, int n, hc_transport_t **tr_out)
{
    hc_errbuf_init(&eb);
    hc_transport_params_t p = { rank, n, "127.0.0.1", "lo", 0, rank, 10000, 1, 0, &eb, 0, -1,
                                NULL };
    hc_ib_config_t cfg;
    char err[256];
    hcoll_status_t st = hc_ib_config_from_env(&cfg, err, sizeof err);
    if (st != HCOLL_SUCCESS)
        return st;
    cfg.local_rank = 0;
    return hc_ib_create(&p, &cfg, tr_out);
}

/* No RNR, no overrun, no drop, no retries: the credit scheme held. */
static int mock_clean(const char *who, int need_writes)
{
    static const char *const bad[] = { "rnr_naks", "cq_overruns", "dropped_conns",
                                       "muted_conns", "retry_exceeded", "loc_prot_errors" };
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    HCT_REQUIRE(h, "%s: libibverbs.so.1 is not loaded: hcoll did not use verbs", who);
    uint64_t (*stat)(const char *) = (uint64_t(*)(const char *))dlsym(h, "hcmock_verbs_stat");
    HCT_REQUIRE(stat, "%s: not the mock", who);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        HCT_REQUIRE(stat(bad[i]) == 0, "%s: the mock counted %llu %s", who,
                    (unsigned long long)stat(bad[i]), bad[i]);
    HCT_REQUIRE(!need_writes || stat("writes") > 0, "%s: no RDMA write went through the mock",
                who);
    dlclose(h);
    return 0;
}

/* After teardown every verbs object hcoll created is gone: a leaked MR
 * pins memory, a leaked QP keeps a peer's connection half open. */
static int mock_released(const char *who)
{
    static const char *const live[] = { "live_contexts", "live_pds", "live_mrs", "live_cqs",
                                        "live_qps" };
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    HCT_REQUIRE(h, "%s: libibverbs.so.1 is not loaded", who);
    uint64_t (*stat)(const char *) = (uint64_t(*)(const char *))dlsym(h, "hcmock_verbs_stat");
    HCT_REQUIRE(stat, "%s: not the mock", who);
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
        HCT_REQUIRE(stat(live[i]) == 0, "%s: %llu verbs object(s) left after teardown (%s)", who,
                    (unsigned long long)stat(live[i]), live[i]);
    dlclose(h);
    return 0;
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
        HCT_REQUIRE(mock_clean("seam rank 1", 1) == 0, "mock counters");
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
    return mock_released(rank ? "seam rank 1" : "seam rank 0");
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
    return mock_released("seam survivor");
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

    hc_errbuf_init(&eb);
    hc_transport_params_t p = { rank, n, "127.0.0.1", "lo", 0, rank, 10000, 1, 0, &eb, 1, 0, NULL };
    hc_ib_config_t cfg;
    char err[256];
    HCT_REQUIRE(hc_ib_config_from_env(&cfg, err, sizeof err) == HCOLL_SUCCESS, "%s", err);
    snprintf(cfg.sysfs_root, sizeof cfg.sysfs_root, "%s", a->root);
    cfg.gpu = 0;
    cfg.local_rank = 0;
    hc_transport_t *tr;
    HCT_REQUIRE(hc_ib_create(&p, &cfg, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
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
    HCT_REQUIRE(mock_clean(rank ? "gdr rank 1" : "gdr rank 0", rank == 0) == 0, "mock counters");
    HCT_REQUIRE(shm_allgather(&ag, &rk, rks, sizeof rk) == HCOLL_SUCCESS, "barrier");
    hc_ib_ops.mr_dereg(tr, mr);
    hc_ib_ops.destroy(tr, 1);
    /* Too far for HCOLL_NET_GDR_LEVEL=LOC: device memory is refused, the
     * caller is told to stage it. */
    cfg.gdr_level = 0;
    HCT_REQUIRE(hc_ib_create(&p, &cfg, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
    st = hc_ib_ops.mr_reg(tr, (void *)(uintptr_t)dbuf, GDR_BYTES, &mr, &rk);
    HCT_REQUIRE(st == HCOLL_ERR_UNSUPPORTED && strstr(eb.msg, "stage it through host memory"),
                "device memory with GDR off: %s: %s", hcoll_status_name(st), eb.msg);
    hc_ib_ops.destroy(tr, 0);
    cu->mem_free(dbuf);
    dlclose(cuh);
    return mock_released(rank ? "gdr rank 1" : "gdr rank 0");
}

START_TEST(seam_gdr_peermem)
{
    const char *build = getenv("HCOLL_TEST_BUILD");
    char cuda[PATH_MAX];
    snprintf(cuda, sizeof cuda, "%s/mock/libcuda.so.1", build && *build ? build : "build");
    if (access(cuda, R_OK) != 0) {
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
    hc_errbuf_init(&eb);
    hc_transport_params_t p = { rank, n, "127.0.0.1", "lo", 0, rank, 10000, 1, 0, &eb, 1, 0, NULL };
    hc_ib_config_t cfg;
    char err[256];
    HCT_REQUIRE(hc_ib_config_from_env(&cfg, err, sizeof err) == HCOLL_SUCCESS, "%s", err);
    snprintf(cfg.sysfs_root, sizeof cfg.sysfs_root, "%s", a->root);
    cfg.gpu = 0;
    cfg.local_rank = 0;
    hc_transport_t *tr;
    HCT_REQUIRE(hc_ib_create(&p, &cfg, &tr) == HCOLL_SUCCESS, "create: %s", eb.msg);
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
    const char *build = getenv("HCOLL_TEST_BUILD");
    char cuda[PATH_MAX];
    snprintf(cuda, sizeof cuda, "%s/mock/libcuda.so.1", build && *build ? build : "build");
    if (access(cuda, R_OK) != 0) {
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

/* ------------------------------------------------------------------------ */
/* api_*: the public all-reduce over HCOLL_NET=ib                             */
/* ------------------------------------------------------------------------ */

typedef struct api_arg {
    hct_id_slot_t slot;
    char logdir[128];
    int kill_victim;       /* -1: none */
    int per_node;          /* device cases: local rank = rank % per_node = its GPU */
    int dmabuf;            /* device cases: the GPU claims dma-buf, whose export fails */
    volatile double kill_ms;
    volatile double noticed_ms[MAXR];
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
    if (mock_clean(who, 1))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    return mock_released(who);
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

/* The public all-reduce on device buffers (emulated CUDA driver) with
 * HCOLL_NET=ib: each rank's GPU sits beside its NIC in sysfs-mockib and
 * nvidia-peermem is there, so stage 2 runs on device memory (GPUDirect):
 * the NIC writes device staging slots and the reduction kernels reduce
 * there. sm_80, so every landing also takes a flush read. */
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
    char who[32];
    snprintf(who, sizeof who, "rank %d", rank);
    if (mock_clean(who, 1))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    GPU_OK(cu->stream_destroy(stream));
    return mock_released(who);
}

static void run_api_device(int n, int per_node, int dmabuf)
{
    const char *build = getenv("HCOLL_TEST_BUILD");
    char cuda[PATH_MAX];
    snprintf(cuda, sizeof cuda, "%s/mock/libcuda.so.1", build && *build ? build : "build");
    if (access(cuda, R_OK) != 0) {
        printf("SKIP: api_device: needs the emulated CUDA driver (%s)\n", cuda);
        return;
    }
    api_arg_t *a = api_arg_new();
    a->per_node = per_node;
    a->dmabuf = dmabuf;
    hct_opts_t o = { .nranks = n, .ranks_per_node = per_node, .timeout_ms = 60000 };
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
        return mock_released(who);
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
/* regress_*: library bugs this emulation exposed, one case each; each      */
/* failed before its fix.                                                     */
/* ------------------------------------------------------------------------ */


/* const void *sendbuf may be read-only memory; ib.c registers every buffer
 * with LOCAL_WRITE | REMOTE_WRITE, which a NIC cannot pin read-only. */
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
 * only), while transport.c asks about local rank 0's NIC only. */
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

/* A rank that fails destroys its QPs, which a peer with nothing in flight
 * towards it never notices: survivors two hops away wait for the whole
 * HCOLL_TIMEOUT_MS, where TCP's resets make it milliseconds (the bound
 * test_allreduce's kill tests hold TCP to: half the timeout). */
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

/* ib.c names a failed completion's operation and direction from wc.opcode,
 * which verbs leaves undefined unless the status is success: a write to
 * rank 1 that ran out of retries is reported as "operation from rank 1". */
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

/* A host-only job over HCOLL_NET=ib must not load and initialise the CUDA
 * driver (gdr.h: "host-only programs never pay for cuInit"); ib_mr_reg
 * asks hc_gdr_ptr_kind about every buffer, which dlopens libcuda.so.1 and
 * calls cuInit. TCP does not. */
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
    Suite *s = suite_create("mock_ib");
    TCase *m = tcase_create("mock");
    tcase_set_timeout(m, TEST_TIMEOUT_S);
    tcase_add_test(m, mock_discovery);
    tcase_add_test(m, mock_mr_rules);
    tcase_add_test(m, mock_qp_state_machine);
    tcase_add_test(m, mock_write_imm_and_read);
    tcase_add_test(m, mock_queue_limits);
    tcase_add_test(m, mock_remote_access_error);
    tcase_add_test(m, mock_rnr_retry_exceeded);
    tcase_add_test(m, mock_peer_gone);
    tcase_add_test(m, mock_wrong_gid);
    tcase_add_test(m, mock_cq_overrun);
    suite_add_tcase(s, m);
    TCase *t = tcase_create("seam");
    tcase_set_timeout(t, TEST_TIMEOUT_S);
    tcase_add_test(t, seam_puts);
    tcase_add_test(t, seam_peer_killed);
    tcase_add_test(t, seam_gdr_peermem);
    suite_add_tcase(s, t);
    TCase *a = tcase_create("api");
    tcase_set_timeout(a, TEST_TIMEOUT_S);
    tcase_add_test(a, api_allreduce_2);
    tcase_add_test(a, api_allreduce_4);
    tcase_add_test(a, api_device_gdr_2);
    tcase_add_test(a, api_device_gdr_2x2);
    tcase_add_test(a, api_device_gdr_dmabuf_fallback);
    tcase_add_test(a, api_allreduce_2x2);
    tcase_add_test(a, api_peer_killed);
    suite_add_tcase(s, a);
    TCase *b = tcase_create("regress");
    tcase_set_timeout(b, TEST_TIMEOUT_S);
    tcase_add_test(b, regress_gdr_freed_flush_source);
    tcase_add_test(b, regress_readonly_sendbuf);
    tcase_add_test(b, regress_auto_per_rank_nic);
    tcase_add_test(b, regress_failure_not_propagated);
    tcase_add_test(b, regress_error_opcode);
    tcase_add_test(b, regress_host_only_loads_cuda);
    suite_add_tcase(s, b);
    return s;
}

/* dlopen("libibverbs.so.1") must find the mock: the loader reads
 * LD_LIBRARY_PATH at exec, so set it and start over. */
static int reexec(char **argv)
{
    const char *build = getenv("HCOLL_TEST_BUILD");
    char mock[PATH_MAX], dir[PATH_MAX], lib[PATH_MAX + 32];
    snprintf(mock, sizeof mock, "%s/mock", build && *build ? build : "build");
    snprintf(lib, sizeof lib, "%s/libibverbs.so.1", mock);
    if (access(lib, R_OK) != 0 || !realpath(mock, dir)) {
        printf("SKIP: %s not built (make tests)\n", lib);
        return 77;
    }
    const char *old = getenv("LD_LIBRARY_PATH");
    size_t ldlen = strlen(dir) + (old ? strlen(old) : 0) + 2;
    char *ld = malloc(ldlen);
    if (!ld)
        return 1;
    snprintf(ld, ldlen, "%s%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
    setenv("LD_LIBRARY_PATH", ld, 1);
    free(ld);
    if (!getenv("HCOLL_SYSFS_ROOT")) {
        char root[PATH_MAX];
        if (!realpath("tests/fixtures/sysfs-roce", root)) {
            printf("SKIP: tests/fixtures/sysfs-roce not found (run from the source tree)\n");
            return 77;
        }
        setenv("HCOLL_SYSFS_ROOT", root, 1);
    }
    setenv("HCMOCK_IB_TEST_CHILD", "1", 1);
    execv("/proc/self/exe", argv);
    perror("execv /proc/self/exe");
    return 1;
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("HCMOCK_IB_TEST_CHILD"))
        return reexec(argv);
    char why[300];
    if (vfns_load(why, sizeof why) != 0) {
        printf("FAIL: %s (LD_LIBRARY_PATH=%s)\n", why, getenv("LD_LIBRARY_PATH"));
        return 1;
    }
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#else /* !HCOLL_BUILD_VERBS */

int main(void)
{
    printf("SKIP: hcoll was built without rdma-core headers: no verbs transport to test\n");
    return 77;
}

#endif
