/*
 * The emulated libibverbs itself (tests/mock/verbs.c, built as
 * build/mock/libibverbs.so.1), through the verbs API as hcoll reaches it,
 * on the RoCE fixture tree tests/fixtures/sysfs-roce (bonded NICs, RoCE v2
 * GIDs with IPv4-mapped addresses): discovery from sysfs, registration
 * rules, the RC state table, WRITE_WITH_IMM and READ, queue limits, and
 * the failures a NIC reports (remote access, RNR, retries exceeded, wrong
 * GID, CQ overrun). The transport tests (test_ib_transport) and the API
 * tests (test_ib_api) trust this emulation because of these cases.
 *
 * main re-executes this program inside the emulation (common/mockib.h).
 * Skips (77) when hcoll was built without rdma-core headers or the mock is
 * not built.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "common/mockib.h"
#include "common/ranks.h"
#include "hc_build.h"

#if HCOLL_BUILD_VERBS
#include <infiniband/verbs.h>
#undef ibv_query_port
#undef ibv_reg_mr

#define TEST_TIMEOUT_S 60


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
    int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
    void (*ack_async_event)(struct ibv_async_event *);
    int (*inject_async)(const char *);
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
    int (*fork_init)(void);
    enum ibv_fork_status (*is_fork_initialized)(void);
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
    L(get_async_event, "ibv_get_async_event");
    L(ack_async_event, "ibv_ack_async_event");
    L(inject_async, "hcmock_verbs_inject_async");
    L(reg_dmabuf_mr, "ibv_reg_dmabuf_mr");
    L(fork_init, "ibv_fork_init");
    L(is_fork_initialized, "ibv_is_fork_initialized");
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
    /* As on a NIC: polling goes on answering (what fit, then nothing), and
     * only the async event says that completions were lost. */
    ck_assert_int_eq(ibv_poll_cq(r.b.cq, 3, wc), 2);
    ck_assert_int_eq(ibv_poll_cq(r.b.cq, 3, wc), 0);
    ck_assert_uint_eq(V.stat("cq_overruns"), 1);
    int fl = fcntl(r.ctx->async_fd, F_GETFL);
    ck_assert_int_eq(fcntl(r.ctx->async_fd, F_SETFL, fl | O_NONBLOCK), 0);
    struct ibv_async_event ev;
    ck_assert_int_eq(V.get_async_event(r.ctx, &ev), 0);
    ck_assert_int_eq(ev.event_type, IBV_EVENT_CQ_ERR);
    ck_assert_ptr_eq(ev.element.cq, r.b.cq);
    V.ack_async_event(&ev);
    errno = 0;
    ck_assert_int_eq(V.get_async_event(r.ctx, &ev), -1);
    ck_assert_int_eq(errno, EAGAIN);
    rig_close(&r);
}
END_TEST

/* Injected faults come as async events with their effect: a port that
 * goes down reads DOWN and fails every QP; a fatal QP fails. dma-buf: the
 * probe NCCL uses (fd -1) answers EBADF where import exists and EOPNOTSUPP
 * under HCMOCK_IB_DMABUF=0. fork: counted as unsafe with live MRs unless
 * ibv_fork_init came first (which is too late once an MR exists). */
START_TEST(mock_async_dmabuf_fork)
{
    rig_t r;
    rig_open(&r, 16, 16, 64, 64);
    connect_pair(r.ctx, &r.a, &r.b, 7, 12);
    int fl = fcntl(r.ctx->async_fd, F_GETFL);
    ck_assert_int_eq(fcntl(r.ctx->async_fd, F_SETFL, fl | O_NONBLOCK), 0);
    struct ibv_async_event ev;
    ck_assert_int_eq(V.inject_async("qp_fatal"), 0);
    ck_assert_int_eq(V.get_async_event(r.ctx, &ev), 0);
    ck_assert_int_eq(ev.event_type, IBV_EVENT_QP_FATAL);
    ck_assert(ev.element.qp == r.a.qp || ev.element.qp == r.b.qp);
    ck_assert_int_eq(ev.element.qp->state, IBV_QPS_ERR);
    V.ack_async_event(&ev);
    ck_assert_int_eq(V.inject_async("port_down"), 0);
    ck_assert_int_eq(V.get_async_event(r.ctx, &ev), 0);
    ck_assert_int_eq(ev.event_type, IBV_EVENT_PORT_ERR);
    ck_assert_int_eq(ev.element.port_num, 1);
    V.ack_async_event(&ev);
    struct ibv_port_attr pa;
    ck_assert_int_eq(port_query(r.ctx, 1, &pa), 0);
    ck_assert_int_eq(pa.state, IBV_PORT_DOWN);
    ck_assert_int_eq(r.b.qp->state, IBV_QPS_ERR);
    ck_assert_int_eq(V.inject_async("no_such_fault"), -1);

    errno = 0;
    ck_assert_ptr_null(V.reg_dmabuf_mr(r.pd, 0, 0, 0, -1, 0));
    ck_assert_int_eq(errno, EBADF);
    setenv("HCMOCK_IB_DMABUF", "0", 1);
    errno = 0;
    ck_assert_ptr_null(V.reg_dmabuf_mr(r.pd, 0, 0, 0, -1, 0));
    ck_assert_int_eq(errno, EOPNOTSUPP);
    unsetenv("HCMOCK_IB_DMABUF");

    static char buf[4096];
    rig_mr(&r, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    ck_assert_int_eq(V.is_fork_initialized(), IBV_FORK_DISABLED);
    ck_assert_int_eq(V.fork_init(), EINVAL); /* an MR exists already */
    uint64_t before = V.stat("unsafe_forks");
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    ck_assert_int_gt(pid, 0);
    waitpid(pid, NULL, 0);
    ck_assert_uint_eq(V.stat("unsafe_forks"), before + 1);
    rig_close(&r);
}
END_TEST

/* ------------------------------------------------------------------------ */

static Suite *suite(void)
{
    Suite *s = suite_create("mock_verbs");
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
    tcase_add_test(m, mock_async_dmabuf_fork);
    suite_add_tcase(s, m);
    return s;
}

int main(int argc, char **argv)
{
    (void)argc;
    int rc = hct_mockib_enter(argv);
    if (rc != 0)
        return rc;
    char why[300];
    if (vfns_load(why, sizeof why) != 0) {
        printf("FAIL: %s (LD_LIBRARY_PATH=%s)\n", why, getenv("LD_LIBRARY_PATH"));
        return 1;
    }
    return hct_mockib_run(suite());
}

#else /* !HCOLL_BUILD_VERBS */

int main(void)
{
    printf("SKIP: hcoll was built without rdma-core headers: no verbs emulation to test\n");
    return 77;
}

#endif
