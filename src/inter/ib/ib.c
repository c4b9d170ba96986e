/*
 * Verbs transport: one RC queue pair per peer on this rank's NIC.
 *
 *   rank A (NIC a)                                   rank B (NIC b)
 *   put(lmr+loff → rkey+roff, len, imm)
 *     ibv_post_send(RDMA_WRITE_WITH_IMM) ════RC QP════► payload lands at
 *       (needs a receive credit of B)                  rkey.addr + roff;
 *   send CQE ─► HC_COMP_PUT (wr_id)                    recv CQE(imm) ─► HC_COMP_IMM
 *                                                      repost the receive WR;
 *   credit word[B] ◄══ RDMA_WRITE (inline, 8 bytes) ══ every RQ_DEPTH/4 reposts
 *
 * Receive credits: a WRITE_WITH_IMM consumes one receive WR at the target
 * (zero-length: the immediate is all it carries). Each side keeps
 * RQ_DEPTH receives posted per QP and reposts one per receive completion;
 * it tells the sender how many it has reposted in total by writing that
 * count into the sender's credit word (a plain RDMA write, which consumes
 * no receive). The sender posts a put only while
 *   imm_sent < RQ_DEPTH + peer's reposted count,
 * and queues it locally otherwise, so the target never answers RNR. The
 * ring's staging-slot credits (zero-byte puts) sit on top of this and are
 * ordinary puts here.
 *
 * Send queue: every WR is signaled and one QP's send completions come in
 * posting order, so a FIFO per endpoint says what each completion was (a
 * user put, a credit write, a flush read).
 *
 * Address exchange (connect's allgather): one fixed-size blob per rank,
 * a header (LID, GID, GID index, MTU, PSN, credit region) then the QPN
 * this rank created for each other rank. A second allgather after RTR is a
 * barrier, so nobody sends into a QP that is not yet ready to receive.
 *
 * GPUDirect: device buffers are registered through dma-buf when kernel,
 * GPU and libibverbs support it, else through nvidia-peermem (plain
 * ibv_reg_mr on the device pointer), and only when the GPU-NIC PCI
 * distance is within HCOLL_NET_GDR_LEVEL; otherwise mr_reg refuses device
 * memory and the caller stages through host memory. Before Hopper a
 * completion can overtake the PCIe writes into GPU memory, so immediates
 * are held back until a one-word RDMA read of device memory (through a
 * loopback QP) has returned: PCIe reads push earlier writes ahead of them.
 *
 * None of this has run on an RDMA NIC yet: see the README.
 */
#include "inter/ib/ib.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "base/config.h"
#include "base/log.h"
#include "gdr/gdr.h"
#include "hc_build.h"
#include "sys/pci.h"

/* ------------------------------------------------------------------------ */
/* Pure helpers (built with or without verbs headers)                        */
/* ------------------------------------------------------------------------ */

const char *hc_ib_wc_status_text(int status, int roce)
{
    /* enum ibv_wc_status values: stable ABI since OFED 1.x. */
    switch (status) {
    case 0: return "success";
    case 1: return "local length error (a put larger than its local region)";
    case 2: return "local QP operation error";
    case 3: return "local EE context operation error";
    case 4: return "local protection error: the local buffer is not registered (or was freed)";
    case 5: return "work request flushed: the QP had already failed (see the first error)";
    case 6: return "memory window bind error";
    case 7: return "bad response from the peer";
    case 8: return "local access error";
    case 9: return "remote invalid request: the peer's QP rejected the operation";
    case 10:
        return "remote access error: the peer's region key or range is wrong (deregistered "
               "buffer, or a put past its end)";
    case 11: return "remote operation error at the peer";
    case 12:
        return roce ? "transport retry counter exceeded: peer unreachable over RoCE — check GID "
                      "index, traffic class/PFC and that both NICs reach each other"
                    : "transport retry counter exceeded: peer unreachable over InfiniBand — "
                      "check the subnet manager, the links and that the peer process is alive";
    case 13:
        return roce ? "receiver-not-ready retry exceeded: the peer posted no receive (is it "
                      "alive?) — on RoCE also check GID index, traffic class/PFC"
                    : "receiver-not-ready retry exceeded: the peer posted no receive (is it "
                      "alive and progressing?)";
    case 14: return "local RDD violation";
    case 15: return "remote invalid RD request";
    case 16: return "remote aborted";
    case 17: return "invalid EE context number";
    case 18: return "invalid EE context state";
    case 19: return "fatal error (the NIC or its driver failed)";
    case 20: return "response timeout";
    case 21: return "general error";
    default: return "unknown completion status";
    }
}

int hc_ib_mtu_min(int a, int b)
{
    return a < b ? a : b;
}

int hc_ib_mtu_bytes(int mtu_enum)
{
    return mtu_enum >= 1 && mtu_enum <= 5 ? 128 << mtu_enum : 0;
}

hcoll_status_t hc_ib_config_from_env(hc_ib_config_t *cfg_out, char *err, size_t errlen)
{
    hc_params_t p;
    hcoll_status_t st = hc_params_load(&p, NULL, err, errlen);
    if (st != HCOLL_SUCCESS)
        return st;
    hc_ib_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.sysfs_root, sizeof c.sysfs_root, "%s", p.sysfs_root[0] ? p.sysfs_root : "/");
    snprintf(c.hca, sizeof c.hca, "%s", p.ib_hca);
    c.gid_index = (long)p.ib_gid_index;
    c.tc = (int)p.ib_tc;
    c.sl = (int)p.ib_sl;
    c.timeout = (int)p.ib_timeout;
    c.retry_cnt = (int)p.ib_retry_cnt;
    c.gdr_level = p.gdr_level;
    c.gdr_flush = p.gdr_flush;
    c.gpu = -1;
    c.local_rank = -1;
    *cfg_out = c;
    return HCOLL_SUCCESS;
}

#if HCOLL_BUILD_VERBS

#include <infiniband/verbs.h>

#define IB_ADDR_MAGIC 0x48434942u /* "HCIB" */
#define IB_SQ_DEPTH   256
#define IB_SQ_RESERVE 8           /* kept for credit writes and flush reads */
#define IB_RQ_DEPTH   512
#define IB_CQ_DEPTH   (IB_SQ_DEPTH + IB_RQ_DEPTH + 16)
#define IB_MRC_IDLE   64
#define IB_INLINE     64

/* ------------------------------------------------------------------------ */
/* libibverbs, loaded at run time                                            */
/* ------------------------------------------------------------------------ */

typedef struct verbs_fns {
    int ok;
    char why[200];
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    /* The exported symbol behind verbs.h's inline ibv_query_port wrapper,
     * with the compat layout; port_query below does what the wrapper does. */
    int (*query_port_compat)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *,
                                int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*destroy_qp)(struct ibv_qp *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
    int (*dereg_mr)(struct ibv_mr *);
} verbs_fns_t;

/* Filled once, read-only afterwards. */
static verbs_fns_t g_verbs;
static pthread_once_t g_verbs_once = PTHREAD_ONCE_INIT;

static void verbs_load(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_verbs.why, sizeof g_verbs.why, "libibverbs not loadable (%s)", dlerror());
        return;
    }
#define SYM(field, name)                                                                     \
    do {                                                                                     \
        *(void **)&g_verbs.field = dlsym(h, name);                                           \
        if (!g_verbs.field) {                                                                \
            snprintf(g_verbs.why, sizeof g_verbs.why, "libibverbs.so.1 lacks %s", name);     \
            return;                                                                          \
        }                                                                                    \
    } while (0)
    SYM(get_device_list, "ibv_get_device_list");
    SYM(free_device_list, "ibv_free_device_list");
    SYM(get_device_name, "ibv_get_device_name");
    SYM(open_device, "ibv_open_device");
    SYM(close_device, "ibv_close_device");
    SYM(query_port_compat, "ibv_query_port");
    SYM(query_gid, "ibv_query_gid");
    SYM(alloc_pd, "ibv_alloc_pd");
    SYM(dealloc_pd, "ibv_dealloc_pd");
    SYM(create_cq, "ibv_create_cq");
    SYM(destroy_cq, "ibv_destroy_cq");
    SYM(create_qp, "ibv_create_qp");
    SYM(modify_qp, "ibv_modify_qp");
    SYM(destroy_qp, "ibv_destroy_qp");
    SYM(reg_mr, "ibv_reg_mr");
    SYM(dereg_mr, "ibv_dereg_mr");
#undef SYM
    /* rdma-core >= 34 only: dma-buf is then simply not offered. */
    *(void **)&g_verbs.reg_dmabuf_mr = dlsym(h, "ibv_reg_dmabuf_mr");
    g_verbs.ok = 1;
}

static const verbs_fns_t *verbs_get(void)
{
    pthread_once(&g_verbs_once, verbs_load);
    return &g_verbs;
}

static void copy_str(char *dst, size_t len, const char *src)
{
    if (len == 0)
        return;
    size_t n = strnlen(src, len - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

int hc_ib_verbs_loadable(char *why, size_t whylen)
{
    const verbs_fns_t *v = verbs_get();
    if (!v->ok && why)
        copy_str(why, whylen, v->why);
    return v->ok;
}

/* ibv_query_port as verbs.h's inline wrapper does it: the extended op when
 * the provider has one, else the exported compat entry point. */
static int port_query(const verbs_fns_t *v, struct ibv_context *ctx, uint8_t port,
                      struct ibv_port_attr *attr)
{
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (vctx)
        return vctx->query_port(ctx, port, attr, sizeof *attr);
    memset(attr, 0, sizeof *attr);
    return v->query_port_compat(ctx, port, (struct _compat_ibv_port_attr *)attr);
}

/* ------------------------------------------------------------------------ */
/* Objects                                                                    */
/* ------------------------------------------------------------------------ */

/* Published through the allgather; followed by nranks uint32_t QPNs. */
typedef struct ib_addr {
    uint32_t magic;
    uint32_t rank;
    uint32_t nranks;
    uint32_t psn;
    uint16_t lid;
    uint8_t link_layer;
    uint8_t mtu;        /* enum ibv_mtu, the port's active MTU */
    uint8_t gid_index;
    uint8_t port;
    uint8_t pad[2];
    uint8_t gid[16];
    uint64_t credit_addr; /* my credit words: [nranks] uint64_t, peer r writes word r */
    uint32_t credit_rkey;
    uint32_t rq_depth;
} ib_addr_t;

enum tx_kind { TX_PUT = 1, TX_CREDIT = 2, TX_FLUSH = 3 };

typedef struct tx_rec {
    int kind;
    uint64_t wr_id;
    uint32_t imm;
} tx_rec_t;

typedef struct pend_put {
    hc_mr_t *lmr;
    size_t loff, len;
    hc_rkey_t rkey;
    int has_rkey;
    uint64_t roff;
    uint32_t imm;
    uint64_t wr_id;
} pend_put_t;

/* A cached registration; several hc_mr_t handles may share one. */
typedef struct ib_mrent {
    hc_mrc_entry_t e; /* first: the cache hands entries back as ib_mrent_t */
    struct ibv_mr *mr;
    int device;       /* device memory */
} ib_mrent_t;

/* What mr_reg returns: the caller's range within a cached registration. */
struct hc_mr {
    ib_mrent_t *ent;
    char *base;
    size_t len;
};

struct hc_ep {
    hc_transport_t *tr;
    int peer;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t rqpn;
    /* send queue FIFO */
    tx_rec_t fifo[IB_SQ_DEPTH];
    int fhead, fcount;
    /* receive credits */
    uint64_t imm_sent;          /* puts posted to the peer */
    uint64_t reposted;          /* receives reposted for the peer */
    uint64_t reported;          /* last count written to the peer */
    uint64_t peer_credit_addr;  /* the peer's credit word for me */
    uint32_t peer_credit_rkey;
    /* puts waiting for a credit or a send slot */
    pend_put_t *pend;
    size_t pcap, phead, pcount;
};

struct hc_transport {
    hc_transport_params_t p;
    hc_ib_config_t cfg;
    const verbs_fns_t *v;
    char bind_addr[64];
    hc_ib_choice_t choice;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_port_attr pattr;
    union ibv_gid gid;
    int roce;
    uint32_t psn;
    volatile uint64_t *credits; /* [nranks] written by peers, then scratch words */
    size_t credits_len;
    struct ibv_mr *credits_mr;
    hc_mrc_t mrc;
    /* GPUDirect */
    int gdr;          /* device memory may be registered */
    int gdr_reg;      /* enum hc_gdr_reg */
    int peermem;      /* nvidia-peermem loaded: the fallback when dma-buf fails */
    int flush;        /* hold immediates until a flush read returns */
    char gdr_why[400];
    /* A word of device memory of our own for flush reads: never a user's
     * buffer, which the user may free while the cache still holds it. */
    hc_cu_dptr_t flush_word;
    struct ibv_mr *flush_mr;
    int flush_cudev;
    struct ibv_cq *loop_cq;
    struct ibv_qp *loop_qp;
    int flush_inflight;
    hc_comp_t *held;             /* immediates waiting for the flush */
    size_t nheld, heldcap, nflushing;
    /* endpoints and reported completions */
    hc_ep_t **eps;
    int neps;
    hc_compq_t cq; /* found, not yet reported */
    hcoll_status_t err;
};

static hcoll_status_t tr_fail(hc_transport_t *tr, hcoll_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The first failure is recorded and logged; later ones return it. */
static hcoll_status_t tr_fail(hc_transport_t *tr, hcoll_status_t st, const char *fmt, ...)
{
    char who[96];
    snprintf(who, sizeof who, "NET/IB rank %d (%s:%d)", tr->p.log_rank, tr->choice.port.dev,
             tr->choice.port.port);
    va_list ap;
    va_start(ap, fmt);
    st = hc_tp_failv(&tr->p, &tr->err, st, who, fmt, ap);
    va_end(ap);
    return st;
}

static int cq_push(hc_transport_t *tr, const hc_comp_t *c)
{
    return hc_compq_push(&tr->cq, c);
}

/* ------------------------------------------------------------------------ */
/* Device choice                                                              */
/* ------------------------------------------------------------------------ */

int hc_ib_usable(const hc_ib_config_t *cfg, int local_rank, hc_ib_choice_t *choice_out,
                 char *why, size_t whylen)
{
    char lw[200];
    if (!hc_ib_verbs_loadable(lw, sizeof lw)) {
        copy_str(why, whylen, lw);
        return 0;
    }
    hc_ib_choice_t c;
    if (hc_ibdev_for_rank(cfg->sysfs_root, cfg->hca, local_rank, NULL, cfg->gid_index, 0, &c, why,
                          whylen) != HCOLL_SUCCESS)
        return 0;
    if (choice_out)
        *choice_out = c;
    return 1;
}

static struct ibv_context *device_open(const verbs_fns_t *v, const char *name, int *ndev_out)
{
    int n = 0;
    struct ibv_device **list = v->get_device_list(&n);
    *ndev_out = list ? n : 0;
    struct ibv_context *ctx = NULL;
    for (int i = 0; list && i < n && !ctx; i++)
        if (strcmp(v->get_device_name(list[i]), name) == 0)
            ctx = v->open_device(list[i]);
    if (list)
        v->free_device_list(list);
    return ctx;
}

/* GPU of this rank: its PCI path, the GDR decision and registration mode. */
static void gdr_decide(hc_transport_t *tr)
{
    const hc_ib_config_t *c = &tr->cfg;
    char bdf[64] = "", gpu_path[HC_PCI_PATH_MAX], nic_path[HC_PCI_PATH_MAX];
    int cc = 0, gpu_dmabuf = 0;
    if (c->gpu < 0) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why,
                 "no GPU for this rank (none was current at hcoll_comm_init)");
        HC_INFO(HC_GDR, tr->p.log_rank, "GPU Direct RDMA Disabled: %s", tr->gdr_why);
        return;
    }
    if (hc_gdr_gpu_info(c->gpu, bdf, sizeof bdf, &cc, &gpu_dmabuf) != 0 ||
        hc_pci_bdf_path(c->sysfs_root, bdf, gpu_path, sizeof gpu_path) != 0 ||
        hc_pci_ibdev_path(c->sysfs_root, tr->choice.port.dev, nic_path, sizeof nic_path) != 0) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why,
                 "PCI path of GPU %d (%s) or of %s unknown", c->gpu, bdf[0] ? bdf : "?",
                 tr->choice.port.dev);
        HC_INFO(HC_GDR, tr->p.log_rank, "GPU Direct RDMA Disabled: %s", tr->gdr_why);
        return;
    }
    int dist = hc_pci_distance(c->sysfs_root, gpu_path, nic_path);
    char line[200];
    if (!hc_gdr_level_allows(dist, c->gdr_level, c->gpu, tr->choice.port.dev, tr->p.log_rank,
                             line, sizeof line)) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why, "%s", line);
        return;
    }
    hc_gdr_caps_t caps;
    hc_gdr_probe(c->sysfs_root, &caps);
    tr->peermem = caps.peermem;
    tr->gdr_reg = hc_gdr_reg_choose(&caps, gpu_dmabuf, tr->v->reg_dmabuf_mr != NULL);
    if (tr->gdr_reg == HC_GDR_REG_STAGING) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why,
                 "GPU %d / HCA %.64s: neither dma-buf (kernel %.64s, GPU %s, libibverbs %s) nor "
                 "nvidia-peermem available",
                 c->gpu, tr->choice.port.dev, caps.kernel[0] ? caps.kernel : "?",
                 gpu_dmabuf ? "yes" : "no", tr->v->reg_dmabuf_mr ? "yes" : "no");
        HC_INFO(HC_GDR, tr->p.log_rank, "%s: host staging", tr->gdr_why);
        return;
    }
    tr->gdr = 1;
    tr->flush = hc_gdr_flush_needed(c->gdr_flush, cc);
    HC_INFO(HC_GDR, tr->p.log_rank, "GPU %d (%s, sm_%d): registration through %s, flush %s",
            c->gpu, bdf, cc * 10, hc_gdr_reg_name(tr->gdr_reg), tr->flush ? "on" : "off");
}

static void ib_destroy(hc_transport_t *tr, int graceful);
static void mrc_dereg(void *ctx, hc_mrc_entry_t *e);
static int flush_word_setup(hc_transport_t *tr);
static void flush_word_free(hc_transport_t *tr);

hcoll_status_t hc_ib_create(const hc_transport_params_t *params, const hc_ib_config_t *cfg,
                            hc_transport_t **tr_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_transport_t *tr = calloc(1, sizeof *tr);
    if (!tr)
        return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_NO_MEMORY,
                          "NET/IB: out of memory creating the transport");
    tr->p = *params;
    tr->cfg = *cfg;
    tr->v = verbs_get();
    snprintf(tr->bind_addr, sizeof tr->bind_addr, "%s", params->bind_addr ? params->bind_addr : "");
    tr->p.bind_addr = tr->bind_addr;
    tr->p.ifname = NULL;
    snprintf(tr->choice.port.dev, sizeof tr->choice.port.dev, "?");
    if (tr->p.timeout_ms < 1)
        tr->p.timeout_ms = 1;
    hc_mrc_init(&tr->mrc, IB_MRC_IDLE, mrc_dereg, tr);
    if (!tr->v->ok) {
        st = tr_fail(tr, HCOLL_ERR_RDMA, "%s", tr->v->why);
        goto fail;
    }
    const int local_rank = cfg->local_rank >= 0 ? cfg->local_rank : params->rail;
    uint32_t prefer_ip = 0;
    if (tr->bind_addr[0])
        inet_pton(AF_INET, tr->bind_addr, &prefer_ip);
    char gpu_path[HC_PCI_PATH_MAX], bdf[64], err[256];
    const char *gp = NULL;
    if (cfg->gpu >= 0 && hc_gdr_gpu_info(cfg->gpu, bdf, sizeof bdf, NULL, NULL) == 0 &&
        hc_pci_bdf_path(cfg->sysfs_root, bdf, gpu_path, sizeof gpu_path) == 0)
        gp = gpu_path;
    if (hc_ibdev_for_rank(cfg->sysfs_root, cfg->hca, local_rank, gp, cfg->gid_index, prefer_ip,
                          &tr->choice, err, sizeof err) != HCOLL_SUCCESS) {
        st = tr_fail(tr, HCOLL_ERR_RDMA, "%s", err);
        goto fail;
    }
    int ndev = 0;
    tr->ctx = device_open(tr->v, tr->choice.port.dev, &ndev);
    if (!tr->ctx) {
        st = tr_fail(tr, HCOLL_ERR_RDMA,
                     "sysfs lists %s but libibverbs cannot open it (%d verbs device(s); is the "
                     "provider library, e.g. libmlx5, installed? errno %d)",
                     tr->choice.port.dev, ndev, errno);
        goto fail;
    }
    if (port_query(tr->v, tr->ctx, (uint8_t)tr->choice.port.port, &tr->pattr) != 0 ||
        tr->pattr.state != IBV_PORT_ACTIVE) {
        st = tr_fail(tr, HCOLL_ERR_RDMA, "port %d is not ACTIVE according to ibv_query_port",
                     tr->choice.port.port);
        goto fail;
    }
    tr->roce = tr->pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
    tr->choice.port.active_mtu = hc_ib_mtu_bytes(tr->pattr.active_mtu);
    if (tr->v->query_gid(tr->ctx, (uint8_t)tr->choice.port.port, tr->choice.gid_index,
                         &tr->gid) != 0) {
        st = tr_fail(tr, HCOLL_ERR_RDMA, "ibv_query_gid(index %d) failed", tr->choice.gid_index);
        goto fail;
    }
    tr->pd = tr->v->alloc_pd(tr->ctx);
    if (!tr->pd) {
        st = tr_fail(tr, HCOLL_ERR_RDMA, "ibv_alloc_pd failed (errno %d)", errno);
        goto fail;
    }
    /* Credit words, then one scratch word for flush reads. */
    tr->credits_len = ((size_t)params->nranks + 1) * sizeof(uint64_t);
    void *cw = NULL;
    if (posix_memalign(&cw, 64, tr->credits_len) != 0) {
        st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for credit words");
        goto fail;
    }
    memset(cw, 0, tr->credits_len);
    tr->credits = cw;
    tr->credits_mr = tr->v->reg_mr(tr->pd, cw, tr->credits_len,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!tr->credits_mr) {
        st = tr_fail(tr, HCOLL_ERR_RDMA, "ibv_reg_mr of the credit words failed (errno %d)",
                     errno);
        goto fail;
    }
    if (getrandom(&tr->psn, sizeof tr->psn, 0) != (ssize_t)sizeof tr->psn)
        tr->psn = (uint32_t)getpid() * 2654435761u;
    tr->psn &= 0xffffff;
    gdr_decide(tr);
    if (tr->gdr && tr->flush && flush_word_setup(tr) != 0) {
        snprintf(tr->gdr_why, sizeof tr->gdr_why,
                 "GPU %d: no device word or loopback QP for GPUDirect flush reads", cfg->gpu);
        HC_INFO(HC_GDR, tr->p.log_rank, "%s: host staging", tr->gdr_why);
        tr->gdr = 0;
    }

    char gtxt[64];
    hc_gid_format(tr->gid.raw, gtxt, sizeof gtxt);
    HC_INFO(HC_NET, tr->p.log_rank, "NET/IB: rank %d -> [%d]%s:%d/%s%s", tr->p.log_rank,
            tr->choice.index, tr->choice.port.dev, tr->choice.port.port, tr->roce ? "RoCE" : "IB",
            tr->gdr ? "/GDRDMA" : "");
    HC_INFO(HC_NET, tr->p.log_rank,
            "NET/IB: rank %d %s:%d %s, LID %u, MTU %d, rate %s, %s (sysfs: %s)", tr->p.log_rank,
            tr->choice.port.dev, tr->choice.port.port, tr->roce ? "RoCE" : "InfiniBand",
            tr->pattr.lid, tr->choice.port.active_mtu,
            tr->choice.port.rate[0] ? tr->choice.port.rate : "?", gtxt, tr->choice.gid_why);
    *tr_out = tr;
    return HCOLL_SUCCESS;

fail:
    ib_destroy(tr, 0);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Queue pairs                                                                */
/* ------------------------------------------------------------------------ */

static int qp_to_init(hc_transport_t *tr, struct ibv_qp *qp)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = (uint8_t)tr->choice.port.port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    return tr->v->modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int qp_to_rtr_rts(hc_transport_t *tr, struct ibv_qp *qp, const ib_addr_t *peer,
                         uint32_t rqpn, int *mtu_out)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)hc_ib_mtu_min(tr->pattr.active_mtu, peer->mtu);
    a.dest_qp_num = rqpn;
    a.rq_psn = peer->psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12; /* 0.64 ms; RNR should never happen with our credits */
    a.ah_attr.port_num = (uint8_t)tr->choice.port.port;
    a.ah_attr.sl = (uint8_t)tr->cfg.sl;
    a.ah_attr.dlid = peer->lid;
    if (tr->roce || peer->link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)tr->choice.gid_index;
        a.ah_attr.grh.hop_limit = 255;
        a.ah_attr.grh.traffic_class = (uint8_t)tr->cfg.tc;
    }
    if (tr->v->modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                             IBV_QP_MIN_RNR_TIMER) != 0)
        return -1;
    *mtu_out = hc_ib_mtu_bytes(a.path_mtu);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = (uint8_t)tr->cfg.timeout;
    a.retry_cnt = (uint8_t)tr->cfg.retry_cnt;
    a.rnr_retry = 7; /* infinite: a slow receiver is not a failure */
    a.sq_psn = tr->psn;
    a.max_rd_atomic = 1;
    return tr->v->modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int qp_create(hc_transport_t *tr, struct ibv_cq **cq_out, struct ibv_qp **qp_out)
{
    struct ibv_cq *cq = tr->v->create_cq(tr->ctx, IB_CQ_DEPTH, NULL, NULL, 0);
    if (!cq)
        return -1;
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = IB_SQ_DEPTH;
    ia.cap.max_recv_wr = IB_RQ_DEPTH;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = IB_INLINE;
    struct ibv_qp *qp = tr->v->create_qp(tr->pd, &ia);
    if (!qp || qp_to_init(tr, qp) != 0) {
        if (qp)
            tr->v->destroy_qp(qp);
        tr->v->destroy_cq(cq);
        return -1;
    }
    *cq_out = cq;
    *qp_out = qp;
    return 0;
}

/* Zero-SGE receives: a WRITE_WITH_IMM needs a WR, not a buffer. */
static int post_recvs(hc_ep_t *ep, int n)
{
    for (int i = 0; i < n; i++) {
        struct ibv_recv_wr wr, *bad;
        memset(&wr, 0, sizeof wr);
        wr.wr_id = (uintptr_t)ep;
        if (ibv_post_recv(ep->qp, &wr, &bad) != 0)
            return -1;
    }
    return 0;
}

static void ep_free(hc_transport_t *tr, hc_ep_t *ep)
{
    if (!ep)
        return;
    if (ep->qp)
        tr->v->destroy_qp(ep->qp);
    if (ep->cq)
        tr->v->destroy_cq(ep->cq);
    free(ep->pend);
    free(ep);
}

static hcoll_status_t ib_connect(hc_transport_t *tr, const int *peers, int npeers,
                                 hc_allgather_fn allgather, void *ag_ctx, hc_ep_t **eps_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const int n = tr->p.nranks, me = tr->p.rank;
    const size_t blen = sizeof(ib_addr_t) + (size_t)n * sizeof(uint32_t);
    char *mine = calloc(1, blen), *all = calloc((size_t)n, blen);
    hc_ep_t **eps = calloc((size_t)(npeers > 0 ? npeers : 1), sizeof *eps);
    if (!mine || !all || !eps) {
        st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto out_free;
    }
    ib_addr_t *a = (ib_addr_t *)mine;
    uint32_t *qpns = (uint32_t *)(mine + sizeof *a);
    a->magic = IB_ADDR_MAGIC;
    a->rank = (uint32_t)me;
    a->nranks = (uint32_t)n;
    a->psn = tr->psn;
    a->lid = tr->pattr.lid;
    a->link_layer = tr->pattr.link_layer;
    a->mtu = (uint8_t)tr->pattr.active_mtu;
    a->gid_index = (uint8_t)tr->choice.gid_index;
    a->port = (uint8_t)tr->choice.port.port;
    memcpy(a->gid, tr->gid.raw, 16);
    a->credit_addr = (uintptr_t)tr->credits;
    a->credit_rkey = tr->credits_mr->rkey;
    a->rq_depth = IB_RQ_DEPTH;
    for (int i = 0; i < npeers; i++) {
        int p = peers[i];
        if (p < 0 || p >= n || p == me) {
            st = tr_fail(tr, HCOLL_ERR_INVALID_ARG, "connect: bad peer %d", p);
            goto out_eps;
        }
        eps[i] = calloc(1, sizeof **eps);
        if (!eps[i]) {
            st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
            goto out_eps;
        }
        eps[i]->tr = tr;
        eps[i]->peer = p;
        if (qp_create(tr, &eps[i]->cq, &eps[i]->qp) != 0) {
            st = tr_fail(tr, HCOLL_ERR_RDMA, "creating the RC QP for rank %d failed (errno %d)",
                         hc_tp_rank(&tr->p, p), errno);
            goto out_eps;
        }
        if (post_recvs(eps[i], IB_RQ_DEPTH) != 0) {
            st = tr_fail(tr, HCOLL_ERR_RDMA, "posting receives for rank %d failed",
                         hc_tp_rank(&tr->p, p));
            goto out_eps;
        }
        qpns[p] = eps[i]->qp->qp_num;
    }
    HC_CHECK(allgather(ag_ctx, mine, all, blen), out_eps);
    for (int i = 0; i < npeers; i++) {
        const ib_addr_t *pa = (const ib_addr_t *)(all + (size_t)peers[i] * blen);
        const uint32_t *pq = (const uint32_t *)((const char *)pa + sizeof *pa);
        if (pa->magic != IB_ADDR_MAGIC || pa->rank != (uint32_t)peers[i] ||
            pa->nranks != (uint32_t)n) {
            st = tr_fail(tr, HCOLL_ERR_MISMATCH,
                         "rank %d published no verbs address (is it using HCOLL_NET=tcp?)",
                         hc_tp_rank(&tr->p, peers[i]));
            goto out_eps;
        }
        if (pq[me] == 0) {
            st = tr_fail(tr, HCOLL_ERR_MISMATCH, "rank %d created no queue pair for rank %d",
                         hc_tp_rank(&tr->p, peers[i]), tr->p.log_rank);
            goto out_eps;
        }
        if (pa->link_layer != tr->pattr.link_layer) {
            st = tr_fail(tr, HCOLL_ERR_RDMA,
                         "rank %d's NIC is %s, this one is %s: they cannot talk RC",
                         hc_tp_rank(&tr->p, peers[i]),
                         pa->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                         tr->roce ? "RoCE" : "InfiniBand");
            goto out_eps;
        }
        int mtu = 0;
        if (qp_to_rtr_rts(tr, eps[i]->qp, pa, pq[me], &mtu) != 0) {
            char g[64];
            hc_gid_format(pa->gid, g, sizeof g);
            st = tr_fail(tr, HCOLL_ERR_RDMA,
                         "moving the QP to rank %d to RTR/RTS failed (errno %d: %s); remote "
                         "QPN %u LID %u GID %s, local GID index %d, TC %d, SL %d",
                         hc_tp_rank(&tr->p, peers[i]), errno, strerror(errno), pq[me], pa->lid, g,
                         tr->choice.gid_index, tr->cfg.tc, tr->cfg.sl);
            goto out_eps;
        }
        eps[i]->rqpn = pq[me];
        eps[i]->peer_credit_addr = pa->credit_addr + (uint64_t)me * sizeof(uint64_t);
        eps[i]->peer_credit_rkey = pa->credit_rkey;
        HC_INFO(HC_NET, tr->p.log_rank,
                "NET/IB: rank %d -> rank %d via %s:%d/%s%s QPN %u -> %u, MTU %d", tr->p.log_rank,
                hc_tp_rank(&tr->p, peers[i]), tr->choice.port.dev, tr->choice.port.port,
                tr->roce ? "RoCE" : "IB", tr->gdr ? "/GDRDMA" : "", eps[i]->qp->qp_num, pq[me],
                mtu);
    }
    /* Barrier: every QP is ready to receive before anyone sends. */
    uint64_t tag = IB_ADDR_MAGIC, *tags = calloc((size_t)n, sizeof *tags);
    if (!tags) {
        st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto out_eps;
    }
    st = allgather(ag_ctx, &tag, tags, sizeof tag);
    free(tags);
    if (st != HCOLL_SUCCESS)
        goto out_eps;
    hc_ep_t **grown = realloc(tr->eps, (size_t)(tr->neps + npeers) * sizeof *grown);
    if (!grown) {
        st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto out_eps;
    }
    tr->eps = grown;
    for (int i = 0; i < npeers; i++) {
        tr->eps[tr->neps++] = eps[i];
        eps_out[i] = eps[i];
    }
    free(eps);
    free(all);
    free(mine);
    return HCOLL_SUCCESS;

out_eps:
    for (int i = 0; i < npeers; i++)
        ep_free(tr, eps[i]);
out_free:
    free(eps);
    free(all);
    free(mine);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Memory regions                                                             */
/* ------------------------------------------------------------------------ */

static void mrc_dereg(void *ctx, hc_mrc_entry_t *e)
{
    hc_transport_t *tr = ctx;
    ib_mrent_t *mr = (ib_mrent_t *)e;
    if (mr->mr)
        tr->v->dereg_mr(mr->mr);
    if (e->dmabuf_fd >= 0)
        close(e->dmabuf_fd);
    free(mr);
}

/* A loopback QP on our own NIC for flush reads of device memory. */
static hcoll_status_t loop_qp_setup(hc_transport_t *tr)
{
    if (tr->loop_qp)
        return HCOLL_SUCCESS;
    if (qp_create(tr, &tr->loop_cq, &tr->loop_qp) != 0)
        return tr_fail(tr, HCOLL_ERR_RDMA, "creating the GPUDirect flush QP failed (errno %d)",
                       errno);
    ib_addr_t self;
    memset(&self, 0, sizeof self);
    self.psn = tr->psn;
    self.lid = tr->pattr.lid;
    self.link_layer = tr->pattr.link_layer;
    self.mtu = (uint8_t)tr->pattr.active_mtu;
    memcpy(self.gid, tr->gid.raw, 16);
    int mtu;
    if (qp_to_rtr_rts(tr, tr->loop_qp, &self, tr->loop_qp->qp_num, &mtu) != 0)
        return tr_fail(tr, HCOLL_ERR_RDMA, "connecting the GPUDirect flush QP failed (errno %d)",
                       errno);
    return HCOLL_SUCCESS;
}

/* The flush word: 64 bytes of the rank's GPU, registered like any device
 * buffer, and the loopback QP that reads it. Without them no GPUDirect.
 * The GPU's primary context stays retained while the word lives. */
static int flush_word_setup(hc_transport_t *tr)
{
    char why[200] = "";
    const hc_cu_api_t *cu = hc_gdr_cu(why, sizeof why);
    void *ctx = NULL, *prev;
    if (!cu || cu->device_get(&tr->flush_cudev, tr->cfg.gpu) != HC_CU_SUCCESS ||
        cu->primary_retain(&ctx, tr->flush_cudev) != HC_CU_SUCCESS)
        return -1;
    cu->ctx_push(ctx);
    hc_cu_res_t r = cu->mem_alloc(&tr->flush_word, 64);
    cu->ctx_pop(&prev);
    if (r != HC_CU_SUCCESS) {
        tr->flush_word = 0;
        cu->primary_release(tr->flush_cudev);
        return -1;
    }
    tr->flush_mr = tr->v->reg_mr(tr->pd, (void *)(uintptr_t)tr->flush_word, 64,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!tr->flush_mr || loop_qp_setup(tr) != HCOLL_SUCCESS)
        return -1; /* flush_word_free undoes the rest */
    return 0;
}

static void flush_word_free(hc_transport_t *tr)
{
    if (tr->flush_mr)
        tr->v->dereg_mr(tr->flush_mr);
    tr->flush_mr = NULL;
    const hc_cu_api_t *cu = tr->flush_word ? hc_gdr_cu(NULL, 0) : NULL;
    if (!cu)
        return;
    void *ctx, *prev, *s = NULL;
    if (cu->primary_retain(&ctx, tr->flush_cudev) == HC_CU_SUCCESS) {
        cu->ctx_push(ctx);
        /* Stream-ordered on a stream of our own: cuMemFree would wait for
         * every stream of the context, the application's included. */
        if (cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) == HC_CU_SUCCESS) {
            cu->mem_free_async(tr->flush_word, s);
            cu->stream_destroy(s);
        }
        cu->ctx_pop(&prev);
        cu->primary_release(tr->flush_cudev);
    }
    cu->primary_release(tr->flush_cudev); /* flush_word_setup's */
    tr->flush_word = 0;
}

static int ib_gdr(hc_transport_t *tr)
{
    return tr->gdr;
}

static hcoll_status_t ib_mr_reg(hc_transport_t *tr, void *base, size_t len, hc_mr_t **mr_out,
                                hc_rkey_t *rkey_out)
{
    if (tr->err)
        return tr->err;
    hc_mr_t *h = calloc(1, sizeof *h);
    if (!h)
        return tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory registering %zu bytes", len);
    h->base = base;
    h->len = len;
    int dev = -1;
    /* Only a process that loaded CUDA can hold device memory: a host-only
     * job must not pay for (or be changed by) cuInit. */
    int kind = hc_gdr_cuda_in_process() ? hc_gdr_ptr_kind(base, &dev) : HC_MEM_HOST;
    uint64_t gen = kind == HC_MEM_HOST ? 0 : hc_gdr_ptr_buffer_id(base);
    ib_mrent_t *mr = (ib_mrent_t *)hc_mrc_find(&tr->mrc, base, len, gen);
    if (!mr) {
        hcoll_status_t st = HCOLL_SUCCESS;
        if (kind != HC_MEM_HOST && !tr->gdr) {
            st = tr_fail(tr, HCOLL_ERR_UNSUPPORTED,
                         "device buffer %p (GPU %d) cannot be registered for the NIC: %s; the "
                         "caller must stage it through host memory",
                         base, dev, tr->gdr_why[0] ? tr->gdr_why : "GPUDirect RDMA disabled");
            goto fail_handle;
        }
        mr = calloc(1, sizeof *mr);
        if (!mr) {
            st = tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory registering %zu bytes", len);
            goto fail_handle;
        }
        mr->e.base = base;
        mr->e.len = len;
        mr->e.gen = gen;
        mr->e.dmabuf_fd = -1;
        mr->device = kind != HC_MEM_HOST;
        const int access =
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        char why[200] = "";
        if (mr->device && tr->gdr_reg == HC_GDR_REG_DMABUF) {
            int fd;
            uint64_t off;
            size_t alen;
            if (hc_gdr_dmabuf_fd(base, len, &fd, &off, &alen, why, sizeof why) == 0) {
                mr->e.dmabuf_fd = fd;
                mr->mr = tr->v->reg_dmabuf_mr(tr->pd, off, len, (uintptr_t)base, fd, access);
                if (!mr->mr)
                    snprintf(why, sizeof why, "ibv_reg_dmabuf_mr: %s", strerror(errno));
            }
            if (!mr->mr && tr->peermem) {
                /* dma-buf was the first choice, not the only one. */
                HC_INFO(HC_GDR, tr->p.log_rank,
                        "dma-buf registration of %zu bytes failed (%s); nvidia-peermem instead",
                        len, why);
                if (mr->e.dmabuf_fd >= 0)
                    close(mr->e.dmabuf_fd);
                mr->e.dmabuf_fd = -1;
                why[0] = '\0';
                mr->mr = tr->v->reg_mr(tr->pd, base, len, access);
            }
        } else {
            /* Host memory; device memory through nvidia-peermem. */
            mr->mr = tr->v->reg_mr(tr->pd, base, len, access);
            /* A read-only send buffer (const, PROT_READ) cannot be pinned
             * writable; the NIC only reads it. Its rkey then allows
             * nothing, which a peer writing to it would learn. */
            if (!mr->mr && errno == EFAULT && kind == HC_MEM_HOST)
                mr->mr = tr->v->reg_mr(tr->pd, base, len, 0);
        }
        if (!mr->mr) {
            int e = errno;
            if (mr->e.dmabuf_fd >= 0)
                close(mr->e.dmabuf_fd);
            free(mr);
            st = tr_fail(tr, HCOLL_ERR_RDMA,
                         "registering %zu bytes of %s memory at %p failed (%s%s%s)%s",
                         len, kind == HC_MEM_HOST ? "host" : "device", base,
                         why[0] ? why : strerror(e), kind == HC_MEM_HOST ? "" : ", via ",
                         kind == HC_MEM_HOST ? "" : hc_gdr_reg_name(tr->gdr_reg),
                         kind == HC_MEM_HOST && (e == ENOMEM || e == EPERM)
                             ? "; check `ulimit -l` (locked memory)"
                             : "");
            goto fail_handle;
        }
        mr->e.handle = mr->mr;
        hc_mrc_insert(&tr->mrc, &mr->e);
        if (st != HCOLL_SUCCESS) {
fail_handle:
            free(h);
            return st;
        }
    }
    h->ent = mr;
    /* The peer adds its offsets to the address the caller registered. */
    rkey_out->w[0] = (uintptr_t)base;
    rkey_out->w[1] = mr->mr->rkey;
    *mr_out = h;
    return HCOLL_SUCCESS;
}

static void ib_mr_dereg(hc_transport_t *tr, hc_mr_t *h)
{
    if (!h)
        return;
    hc_mrc_release(&tr->mrc, &h->ent->e);
    free(h);
}

/* ------------------------------------------------------------------------ */
/* Sending                                                                    */
/* ------------------------------------------------------------------------ */

static int fifo_push(hc_ep_t *ep, int kind, uint64_t wr_id, uint32_t imm)
{
    if (ep->fcount == IB_SQ_DEPTH)
        return -1;
    tx_rec_t *r = &ep->fifo[(ep->fhead + ep->fcount) % IB_SQ_DEPTH];
    r->kind = kind;
    r->wr_id = wr_id;
    r->imm = imm;
    ep->fcount++;
    return 0;
}

static int can_post_put(const hc_ep_t *ep)
{
    const hc_transport_t *tr = ep->tr;
    uint64_t peer_reposted = tr->credits[ep->peer];
    return ep->fcount < IB_SQ_DEPTH - IB_SQ_RESERVE && ep->imm_sent < IB_RQ_DEPTH + peer_reposted;
}

static hcoll_status_t post_put(hc_ep_t *ep, const pend_put_t *pp)
{
    hc_transport_t *tr = ep->tr;
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    if (pp->len) {
        sge.addr = (uintptr_t)pp->lmr->base + pp->loff;
        sge.length = (uint32_t)pp->len;
        sge.lkey = pp->lmr->ent->mr->lkey;
        wr.sg_list = &sge;
        wr.num_sge = 1;
    }
    wr.wr_id = TX_PUT;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(pp->imm);
    if (pp->has_rkey) {
        wr.wr.rdma.remote_addr = pp->rkey.w[0] + pp->roff;
        wr.wr.rdma.rkey = (uint32_t)pp->rkey.w[1];
    }
    int rc = ibv_post_send(ep->qp, &wr, &bad);
    if (rc != 0)
        return tr_fail(tr, HCOLL_ERR_RDMA, "ibv_post_send of a %zu-byte put to rank %d failed: %s",
                       pp->len, hc_tp_rank(&tr->p, ep->peer), strerror(rc));
    fifo_push(ep, TX_PUT, pp->wr_id, pp->imm);
    ep->imm_sent++;
    return HCOLL_SUCCESS;
}

/* Write val into the peer's credit word for us (inline: val may die once
 * this returns); recorded in the send FIFO. Returns ibv_post_send's code. */
static int credit_write(hc_ep_t *ep, uint64_t val)
{
    struct ibv_sge sge = { (uintptr_t)&val, sizeof val, 0 };
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = TX_CREDIT;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = ep->peer_credit_addr;
    wr.wr.rdma.rkey = ep->peer_credit_rkey;
    int rc = ibv_post_send(ep->qp, &wr, &bad);
    if (rc == 0)
        fifo_push(ep, TX_CREDIT, 0, 0);
    return rc;
}

/* Tell the peer how many receives we have reposted for it. */
static hcoll_status_t post_credit(hc_ep_t *ep)
{
    if (ep->reposted - ep->reported < IB_RQ_DEPTH / 4 || ep->fcount >= IB_SQ_DEPTH)
        return HCOLL_SUCCESS;
    uint64_t val = ep->reposted;
    int rc = credit_write(ep, val);
    if (rc != 0)
        return tr_fail(ep->tr, HCOLL_ERR_RDMA, "posting a credit update to rank %d failed: %s",
                       hc_tp_rank(&ep->tr->p, ep->peer), strerror(rc));
    ep->reported = val;
    return HCOLL_SUCCESS;
}

static hcoll_status_t pend_push(hc_ep_t *ep, const pend_put_t *pp)
{
    if (ep->pcount == ep->pcap) {
        size_t ncap = ep->pcap ? ep->pcap * 2 : 64;
        pend_put_t *n = malloc(ncap * sizeof *n);
        if (!n)
            return tr_fail(ep->tr, HCOLL_ERR_NO_MEMORY, "out of memory queueing a put");
        for (size_t i = 0; i < ep->pcount; i++)
            n[i] = ep->pend[(ep->phead + i) % ep->pcap];
        free(ep->pend);
        ep->pend = n;
        ep->pcap = ncap;
        ep->phead = 0;
    }
    ep->pend[(ep->phead + ep->pcount) % ep->pcap] = *pp;
    ep->pcount++;
    return HCOLL_SUCCESS;
}

static hcoll_status_t pend_flush(hc_ep_t *ep)
{
    while (ep->pcount && can_post_put(ep)) {
        hcoll_status_t st = post_put(ep, &ep->pend[ep->phead]);
        if (st != HCOLL_SUCCESS)
            return st;
        ep->phead = (ep->phead + 1) % ep->pcap;
        ep->pcount--;
    }
    return HCOLL_SUCCESS;
}

static hcoll_status_t ib_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                             uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id)
{
    hc_transport_t *tr = ep->tr;
    if (tr->err)
        return tr->err;
    if (len && (!lmr || loff > lmr->len || len > lmr->len - loff || len > UINT32_MAX))
        return tr_fail(tr, HCOLL_ERR_INTERNAL,
                       "put to rank %d: local range %zu+%zu outside its region (%zu bytes)",
                       hc_tp_rank(&tr->p, ep->peer), loff, len, lmr ? lmr->len : 0);
    pend_put_t pp = { lmr, loff, len, { { 0, 0 } }, rkey != NULL, roff, imm, wr_id };
    if (rkey)
        pp.rkey = *rkey;
    /* Queued puts go first: the order of posting stays the order of calls. */
    if (ep->pcount || !can_post_put(ep))
        return pend_push(ep, &pp);
    return post_put(ep, &pp);
}

/* ------------------------------------------------------------------------ */
/* Completions                                                                */
/* ------------------------------------------------------------------------ */

/* what: the work request, known from wr_id and the send FIFO, since an
 * error completion's opcode is undefined (ibv_poll_cq(3)). */
static hcoll_status_t wc_failed(hc_transport_t *tr, const char *what, int peer,
                                const struct ibv_wc *wc)
{
    hcoll_status_t st = wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_RNR_RETRY_EXC_ERR
                            ? HCOLL_ERR_PEER_FAILED
                            : HCOLL_ERR_RDMA;
    return tr_fail(tr, st, "%s rank %d failed: status %d, %s (vendor error 0x%x)", what,
                   hc_tp_rank(&tr->p, peer), (int)wc->status,
                   hc_ib_wc_status_text((int)wc->status, tr->roce), wc->vendor_err);
}

static hcoll_status_t flush_start(hc_transport_t *tr)
{
    if (tr->flush_inflight || !tr->nheld)
        return HCOLL_SUCCESS;
    volatile uint64_t *scratch = &tr->credits[tr->p.nranks];
    struct ibv_sge sge = { (uintptr_t)scratch, 4, tr->credits_mr->lkey };
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = TX_FLUSH;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = tr->flush_word;
    wr.wr.rdma.rkey = tr->flush_mr->rkey;
    int rc = ibv_post_send(tr->loop_qp, &wr, &bad);
    if (rc != 0)
        return tr_fail(tr, HCOLL_ERR_RDMA, "posting the GPUDirect flush read failed: %s",
                       strerror(rc));
    tr->flush_inflight = 1;
    tr->nflushing = tr->nheld; /* these are covered by this read */
    return HCOLL_SUCCESS;
}

static hcoll_status_t flush_done(hc_transport_t *tr)
{
    for (size_t i = 0; i < tr->nflushing; i++)
        if (cq_push(tr, &tr->held[i]) != 0)
            return tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
    memmove(tr->held, tr->held + tr->nflushing, (tr->nheld - tr->nflushing) * sizeof *tr->held);
    tr->nheld -= tr->nflushing;
    tr->nflushing = 0;
    tr->flush_inflight = 0;
    return flush_start(tr);
}

static hcoll_status_t deliver_imm(hc_transport_t *tr, const hc_comp_t *c)
{
    if (!(tr->flush && tr->flush_mr)) {
        if (cq_push(tr, c) != 0)
            return tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
        return HCOLL_SUCCESS;
    }
    if (tr->nheld == tr->heldcap) {
        size_t ncap = tr->heldcap ? tr->heldcap * 2 : 64;
        hc_comp_t *n = realloc(tr->held, ncap * sizeof *n);
        if (!n)
            return tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
        tr->held = n;
        tr->heldcap = ncap;
    }
    tr->held[tr->nheld++] = *c;
    return HCOLL_SUCCESS;
}

static hcoll_status_t ep_progress(hc_ep_t *ep)
{
    hc_transport_t *tr = ep->tr;
    struct ibv_wc wc[32];
    int n = ibv_poll_cq(ep->cq, 32, wc);
    if (n < 0)
        return tr_fail(tr, HCOLL_ERR_RDMA, "ibv_poll_cq failed for rank %d",
                       hc_tp_rank(&tr->p, ep->peer));
    int reposts = 0;
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS) {
            const char *what = wc[i].wr_id == (uintptr_t)ep ? "a receive from"
                               : ep->fcount && ep->fifo[ep->fhead].kind == TX_CREDIT
                                   ? "a credit update to"
                                   : "an RDMA write to";
            return wc_failed(tr, what, ep->peer, &wc[i]);
        }
        if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            hc_comp_t c = { HC_COMP_IMM, ep->peer, ntohl(wc[i].imm_data), 0 };
            hcoll_status_t st = deliver_imm(tr, &c);
            if (st != HCOLL_SUCCESS)
                return st;
            reposts++;
            continue;
        }
        if (wc[i].opcode & IBV_WC_RECV)
            return tr_fail(tr, HCOLL_ERR_NETWORK, "unexpected receive (opcode %d) from rank %d",
                           (int)wc[i].opcode, hc_tp_rank(&tr->p, ep->peer));
        if (ep->fcount == 0)
            return tr_fail(tr, HCOLL_ERR_INTERNAL, "send completion with nothing posted");
        tx_rec_t r = ep->fifo[ep->fhead];
        ep->fhead = (ep->fhead + 1) % IB_SQ_DEPTH;
        ep->fcount--;
        if (r.kind == TX_PUT) {
            hc_comp_t c = { HC_COMP_PUT, ep->peer, r.imm, r.wr_id };
            if (cq_push(tr, &c) != 0)
                return tr_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
        }
    }
    if (reposts) {
        if (post_recvs(ep, reposts) != 0)
            return tr_fail(tr, HCOLL_ERR_RDMA, "reposting receives for rank %d failed",
                           hc_tp_rank(&tr->p, ep->peer));
        ep->reposted += (uint64_t)reposts;
    }
    hcoll_status_t st = post_credit(ep);
    if (st == HCOLL_SUCCESS)
        st = pend_flush(ep);
    return st;
}

#define IB_CREDIT_RESET UINT64_MAX /* in a credit word: "I failed, give up on me" */

static hcoll_status_t progress(hc_transport_t *tr)
{
    hcoll_status_t st;
    for (int i = 0; i < tr->neps; i++) {
        if (tr->credits[tr->eps[i]->peer] == IB_CREDIT_RESET)
            return tr_fail(tr, HCOLL_ERR_PEER_FAILED,
                           "rank %d reset its connection (it failed or aborted)",
                           hc_tp_rank(&tr->p, tr->eps[i]->peer));
        if ((st = ep_progress(tr->eps[i])) != HCOLL_SUCCESS)
            return st;
    }
    if (tr->loop_cq) {
        struct ibv_wc wc;
        int n = ibv_poll_cq(tr->loop_cq, 1, &wc);
        if (n < 0)
            return tr_fail(tr, HCOLL_ERR_RDMA, "ibv_poll_cq failed on the flush QP");
        if (n == 1) {
            if (wc.status != IBV_WC_SUCCESS)
                return wc_failed(tr, "the GPUDirect flush read on", tr->p.rank, &wc);
            if ((st = flush_done(tr)) != HCOLL_SUCCESS)
                return st;
        }
    }
    return flush_start(tr);
}

static hcoll_status_t ib_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                              int *n_out)
{
    *n_out = 0;
    if (tr->err)
        return tr->err;
    hcoll_status_t st = progress(tr);
    if (st == HCOLL_SUCCESS && tr->cq.count == 0 && wait_ms > 0) {
        /* Busy-poll as RDMA libraries do, yielding the core between
         * sweeps so that the reduction on the same core is not starved. */
        const double deadline = hc_now_ms() + wait_ms;
        while (st == HCOLL_SUCCESS && tr->cq.count == 0 && hc_now_ms() < deadline) {
            struct timespec ts = { 0, 20000 };
            nanosleep(&ts, NULL);
            st = progress(tr);
        }
    }
    if (st != HCOLL_SUCCESS)
        return st;
    *n_out = hc_compq_pop(&tr->cq, comps, max);
    return HCOLL_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Close                                                                      */
/* ------------------------------------------------------------------------ */

static void ib_destroy(hc_transport_t *tr, int graceful)
{
    if (!tr)
        return;
    if (graceful && tr->err == HCOLL_SUCCESS) {
        /* Let our last puts be acknowledged before the QPs go away: a peer
         * still waiting for them would otherwise see retries exceeded. */
        double deadline = hc_now_ms() + (tr->p.timeout_ms < 1000 ? tr->p.timeout_ms : 1000);
        for (;;) {
            int busy = 0;
            for (int i = 0; i < tr->neps; i++)
                busy |= tr->eps[i]->fcount > 0 || tr->eps[i]->pcount > 0;
            if (!busy || progress(tr) != HCOLL_SUCCESS || hc_now_ms() > deadline)
                break;
        }
    }
    if (!graceful) {
        /* An RC peer notices a vanished QP only when it next sends to it:
         * tell each one, as a TCP reset would (transport.h's contract). */
        int posted = 0;
        for (int i = 0; i < tr->neps; i++)
            if (tr->eps[i]->fcount < IB_SQ_DEPTH && credit_write(tr->eps[i], IB_CREDIT_RESET) == 0)
                posted++;
        /* Until the writes are out (or failed), briefly: a QP destroyed
         * with them queued may never send them. */
        double deadline = hc_now_ms() + 100;
        while (posted && hc_now_ms() < deadline) {
            int busy = 0;
            for (int i = 0; i < tr->neps; i++) {
                struct ibv_wc wc[32];
                int n = ibv_poll_cq(tr->eps[i]->cq, 32, wc);
                for (int k = 0; k < n; k++)
                    if (!(wc[k].status == IBV_WC_SUCCESS && (wc[k].opcode & IBV_WC_RECV)) &&
                        tr->eps[i]->fcount)
                        tr->eps[i]->fcount--;
                busy |= tr->eps[i]->fcount > 0;
            }
            if (!busy)
                break;
        }
    }
    for (int i = 0; i < tr->neps; i++)
        ep_free(tr, tr->eps[i]);
    free(tr->eps);
    if (tr->loop_qp)
        tr->v->destroy_qp(tr->loop_qp);
    if (tr->loop_cq)
        tr->v->destroy_cq(tr->loop_cq);
    flush_word_free(tr);
    hc_mrc_fini(&tr->mrc);
    if (tr->credits_mr)
        tr->v->dereg_mr(tr->credits_mr);
    free((void *)tr->credits);
    if (tr->pd)
        tr->v->dealloc_pd(tr->pd);
    if (tr->ctx)
        tr->v->close_device(tr->ctx);
    free(tr->held);
    hc_compq_free(&tr->cq);
    free(tr);
}

static hcoll_status_t ib_create_env(const hc_transport_params_t *params, hc_transport_t **tr_out)
{
    hc_ib_config_t cfg;
    char err[300];
    if (hc_ib_config_from_env(&cfg, err, sizeof err) != HCOLL_SUCCESS)
        return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_INVALID_ARG,
                          "NET/IB: %s", err);
    cfg.gpu = params->has_gpu ? params->gpu : -1;
    return hc_ib_create(params, &cfg, tr_out);
}

const hc_transport_ops_t hc_ib_ops = {
    .name = "ib",
    .create = ib_create_env,
    .connect = ib_connect,
    .mr_reg = ib_mr_reg,
    .mr_dereg = ib_mr_dereg,
    .gdr = ib_gdr,
    .put = ib_put,
    .poll = ib_poll,
    .destroy = ib_destroy,
};

#else /* !HCOLL_BUILD_VERBS */

/* Built without <infiniband/verbs.h>: the table exists so that selection
 * code is the same everywhere, and every entry says why it cannot work. */

int hc_ib_verbs_loadable(char *why, size_t whylen)
{
    snprintf(why, whylen, "hcoll was built without libibverbs headers (rdma-core)");
    return 0;
}

int hc_ib_usable(const hc_ib_config_t *cfg, int local_rank, hc_ib_choice_t *choice_out,
                 char *why, size_t whylen)
{
    (void)cfg;
    (void)local_rank;
    (void)choice_out;
    return hc_ib_verbs_loadable(why, whylen);
}

hcoll_status_t hc_ib_create(const hc_transport_params_t *params, const hc_ib_config_t *cfg,
                            hc_transport_t **tr_out)
{
    (void)cfg;
    (void)tr_out;
    return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_UNSUPPORTED,
                      "NET/IB: hcoll was built without libibverbs headers (rdma-core)");
}

static hcoll_status_t ib_create_env(const hc_transport_params_t *params, hc_transport_t **tr_out)
{
    return hc_ib_create(params, NULL, tr_out);
}

const hc_transport_ops_t hc_ib_ops = {
    .name = "ib",
    .create = ib_create_env,
};

#endif
