/*
 * Inside the verbs transport: the objects every file of src/inter/ib/
 * shares and the calls between those files. Not for use outside ib/.
 *
 *   ib.c        the ops table: create, destroy
 *   loader.c    libibverbs, loaded at run time into one table
 *   device.c    settings, NIC and port choice, the GPUDirect decision
 *   qp.c        queue pairs: RC state machine, connection set-up
 *   mr.c        memory registration, the GPUDirect flush reads and QP
 *   mr_cache.c  the registration cache (generic, mr_cache.h)
 *   send.c      puts, the send FIFO, receive credits, queued puts
 *   poll.c      completions, flush hold-back, progress and poll
 *   async.c     the NIC's async events (read by progress and by ib_fail)
 *
 * Calls run one way: ib.c -> {poll, mr, qp, device} ; poll -> {send, qp};
 * mr -> {qp, mr_cache}; device -> loader; everything -> seam and async
 * (ib_fail).
 */
#ifndef HC_INTER_IB_PRIV_H
#define HC_INTER_IB_PRIV_H

#include "inter/ib/ib.h"

#include <stdarg.h>
#include <stdio.h>

#include "gdr/mem.h"
#include "hc_build.h"

#if HCOLL_BUILD_VERBS

#include <infiniband/verbs.h>

#define IB_ADDR_MAGIC 0x48434942u /* "HCIB" */
#define IB_SQ_DEPTH   256
#define IB_SQ_RESERVE 8           /* kept for credit writes and flush reads */
#define IB_RQ_DEPTH   512
#define IB_CQ_DEPTH   (IB_SQ_DEPTH + IB_RQ_DEPTH + 16)
#define IB_MRC_IDLE   64
#define IB_INLINE     64
#define IB_CREDIT_RESET UINT64_MAX /* in a credit word: "I failed, give up on me" */
#define IB_QPS_MAX    4           /* QPs per peer: HCOLL_IB_QPS_PER_PEER's bound */
#define IB_CHAIN      16          /* puts per ibv_post_send (one doorbell) */
/* Credit words: [peer][QP] written by the peers (word [peer][0] also
 * carries IB_CREDIT_RESET), then one scratch word for flush reads. */
#define IB_CREDIT_WORDS(nranks) ((size_t)(nranks) * IB_QPS_MAX + 1)
#define IB_CREDIT_IDX(peer, q)  ((size_t)(peer) * IB_QPS_MAX + (size_t)(q))
#define IB_FLUSH_REGIONS 64       /* device regions one flush reads, at most */

/* ---- loader.c ------------------------------------------------------------ */

typedef struct ib_verbs {
    int ok;
    char why[200];
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    /* The exported symbol behind verbs.h's inline ibv_query_port wrapper,
     * with the compat layout; ib_port_query does what the wrapper does. */
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
    /* optional (NULL when the library lacks them) */
    struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int);
    int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
    void (*ack_async_event)(struct ibv_async_event *);
    int (*fork_init)(void);
    enum ibv_fork_status (*is_fork_initialized)(void);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
    int (*destroy_comp_channel)(struct ibv_comp_channel *);
    int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
    void (*ack_cq_events)(struct ibv_cq *, unsigned int);
} ib_verbs_t;

/* The process's table, loaded on first use; read-only afterwards. */
const ib_verbs_t *ib_verbs_get(void);

/* Fork safety before the process's first registration (once); returns
 * what was done, for the log. */
const char *ib_fork_setup(void);

/* ibv_query_port as verbs.h's inline wrapper does it. */
int ib_port_query(const ib_verbs_t *v, struct ibv_context *ctx, uint8_t port,
                  struct ibv_port_attr *attr);

/* ---- objects --------------------------------------------------------------- */

/* Published through connect's allgather; followed by nranks x IB_QPS_MAX
 * uint32_t QPNs (the QPs this rank created for each rank, 0 past nqp). */
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
    uint8_t nqp;        /* QPs per peer this rank created (HCOLL_IB_QPS_PER_PEER) */
    uint8_t pad;
    uint8_t gid[16];
    uint64_t credit_addr; /* my credit words: [nranks] uint64_t, peer r writes word r */
    uint32_t credit_rkey;
    uint32_t rq_depth;
} ib_addr_t;

enum ib_tx_kind { TX_PUT = 1, TX_CREDIT = 2, TX_FLUSH = 3 };

/* What one send completion was (the send FIFO's element). */
typedef struct ib_tx {
    int kind;
    uint64_t wr_id;
    uint32_t imm;
} ib_tx_t;

/* A put waiting for a receive credit or a send slot. */
typedef struct ib_pend {
    hc_mr_t *lmr;
    size_t loff, len;
    hc_rkey_t rkey;
    int has_rkey;
    uint64_t roff;
    uint32_t imm;
    uint64_t wr_id;
} ib_pend_t;

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
    struct hc_mr *prev, *next; /* tr->mrs: handles still held, freed by destroy */
};

/* One of a peer's QPs, with what its send and receive queues hold. */
typedef struct ib_qpc {
    struct ibv_qp *qp;
    uint32_t rqpn;
    /* send queue FIFO: one QP's send completions come in posting order */
    ib_tx_t fifo[IB_SQ_DEPTH];
    int fhead, fcount;
    /* receive credits, per QP: a WRITE_WITH_IMM takes a receive of the
     * peer's QP it arrives on */
    uint64_t imm_sent;          /* puts posted on this QP */
    uint64_t reposted;          /* receives reposted on it */
    uint64_t reported;          /* last count written to the peer */
} ib_qpc_t;

struct hc_ep {
    hc_transport_t *tr;
    int peer;
    struct ibv_cq *cq;          /* one for all the peer's QPs */
    ib_qpc_t q[IB_QPS_MAX];
    int nqp;                    /* in use: the smaller of both sides' counts */
    int rr;                     /* the QP of the next put (round robin) */
    int fcount;                 /* send WRs outstanding on all QPs */
    uint64_t peer_credit_addr;  /* the peer's credit word for my QP 0 (QP q: + 8q) */
    uint32_t peer_credit_rkey;
    /* puts not yet posted: held for the next doorbell (poll), or waiting
     * for a credit or a send slot */
    ib_pend_t *pend;
    size_t pcap, phead, pcount;
};

struct hc_transport {
    hc_transport_params_t p;
    hc_ib_config_t cfg;
    int gpu;                    /* CUDA ordinal of this rank's GPU, -1 none */
    int local_rank;             /* picks the NIC (params->rail) */
    const ib_verbs_t *v;
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
    struct hc_mr *mrs; /* live handles (the ring's own regions are never dereg'ed) */
    /* GPUDirect */
    int gdr;          /* device memory may be registered */
    int gdr_reg;      /* enum hc_gdr_reg */
    int peermem;      /* nvidia-peermem loaded: the fallback when dma-buf fails */
    int flush;        /* hold immediates until a flush read returns */
    char gdr_why[400];
    /* A word of device memory of our own for flush reads: never a user's
     * buffer, which the user may free while the cache still holds it. */
    hc_gdr_dmem_t flush_mem;
    struct ibv_mr *flush_mr;
    struct ibv_cq *loop_cq;
    struct ibv_qp *loop_qp;
    int flush_inflight;
    hc_comp_t *held;             /* immediates waiting for the flush */
    size_t nheld, heldcap, nflushing;
    /* poll.c: the endpoints' CQs report to this channel; long waits sleep
     * on its fd (NULL: the library has none, timed sleeps) */
    struct ibv_comp_channel *chan;
    /* the regions the flush in flight reads, each held until it is back */
    hc_mrc_entry_t *flush_ents[IB_FLUSH_REGIONS];
    int nflush_ents, flush_warned;
    int ro;                      /* register with IBV_ACCESS_RELAXED_ORDERING */
    /* endpoints and reported completions */
    hc_ep_t **eps;
    int neps;
    hc_compq_t cq; /* found, not yet reported */
    hcoll_status_t err;
    /* device.c: registration and the NIC's async events */
    int dmabuf_ok;          /* the probe found dma-buf import on this NIC */
    int async_ok;           /* the async fd polls without blocking */
    unsigned async_sweeps;  /* progress sweeps since the last look */
    char async_why[240];    /* the first fatal event, named */
};

/* async.c: read the NIC's pending async events (never blocks); the first
 * fatal one is kept in tr->async_why. */
void ib_async_drain(hc_transport_t *tr);

static inline hcoll_status_t ib_fail_str(hc_transport_t *tr, hcoll_status_t st, const char *who,
                                         const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline hcoll_status_t ib_fail_str(hc_transport_t *tr, hcoll_status_t st, const char *who,
                                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    st = hc_tp_failv(&tr->p, &tr->err, st, who, fmt, ap);
    va_end(ap);
    return st;
}

/* The transport's first failure is recorded and logged as "NET/IB rank R,
 * rail K (dev port P): ...", with the NIC's own account when it sent one
 * (an async event: port down, fatal QP, access error, CQ overrun); later
 * ones return it (seam.c's recorder). */
static inline hcoll_status_t ib_fail(hc_transport_t *tr, hcoll_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline hcoll_status_t ib_fail(hc_transport_t *tr, hcoll_status_t st, const char *fmt, ...)
{
    char who[96], msg[320];
    snprintf(who, sizeof who, "NET/IB rank %d, rail %d (%s port %d)", tr->p.log_rank,
             tr->p.rail, tr->choice.port.dev, tr->choice.port.port);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (tr->err == HCOLL_SUCCESS)
        ib_async_drain(tr);
    return ib_fail_str(tr, st, who, "%s%s%s", msg, tr->async_why[0] ? "; the NIC reported: " : "",
                       tr->async_why);
}

/* ---- device.c -------------------------------------------------------------- */

/* This rank's NIC: choice, open, ACTIVE port, GID, protection domain. */
hcoll_status_t ib_dev_open(hc_transport_t *tr);
/* GPUDirect for this rank's GPU and NIC: sets gdr, gdr_reg, peermem, flush
 * and gdr_why, with the INFO line saying what was decided. */
void ib_gdr_decide(hc_transport_t *tr);
/* async.c: every 64th progress sweep, the NIC's async events; a fatal one
 * fails the transport, named (port down, fatal QP, access error, CQ
 * overrun). */
hcoll_status_t ib_async_poll(hc_transport_t *tr);

/* ---- qp.c ------------------------------------------------------------------ */

/* An RC QP with its own CQ, in INIT. Returns 0, or -1 (errno set). */
int ib_qp_create(hc_transport_t *tr, struct ibv_cq **cq_out, struct ibv_qp **qp_out);
/* Take and acknowledge every event queued on the channel (never blocks):
 * before a CQ is destroyed, since destroy waits for acknowledgements. */
void ib_chan_drain(hc_transport_t *tr);
void ib_chan_free(hc_transport_t *tr);
/* Which of ep's QPs qp is (its index), or -1. Inline: async.c names QPs
 * with it, and qp.c already calls async.c (ib_fail). */
static inline int ib_ep_qp_index(const hc_ep_t *ep, const struct ibv_qp *qp)
{
    for (int q = 0; q < IB_QPS_MAX; q++)
        if (qp && ep->q[q].qp == qp)
            return q;
    return -1;
}
/* INIT -> RTR -> RTS towards peer's QP rqpn; *mtu_out gets the path MTU. */
int ib_qp_connect(hc_transport_t *tr, struct ibv_qp *qp, const ib_addr_t *peer, uint32_t rqpn,
                  int *mtu_out);
/* n zero-SGE receives on ep's QP q (a WRITE_WITH_IMM needs a WR, not a
 * buffer). */
int ib_post_recvs(hc_ep_t *ep, int q, int n);
void ib_ep_free(hc_transport_t *tr, hc_ep_t *ep);
hcoll_status_t ib_connect(hc_transport_t *tr, const int *peers, int npeers,
                          hc_allgather_fn allgather, void *ag_ctx, hc_ep_t **eps_out);

/* ---- mr.c ------------------------------------------------------------------ */

hcoll_status_t ib_mr_reg(hc_transport_t *tr, void *base, size_t len, hc_mr_t **mr_out,
                         hc_rkey_t *rkey_out);
void ib_mr_dereg(hc_transport_t *tr, hc_mr_t *h);
/* Free the handles still held (teardown, before the cache goes). */
void ib_mr_free_handles(hc_transport_t *tr);
/* The transport's mem_pin / mem_unpin: a cache entry held until unpinned. */
hcoll_status_t ib_mem_pin(hc_transport_t *tr, void *base, size_t len, hc_mr_t **pin_out);
int ib_mem_pinned(hc_transport_t *tr, const void *base, size_t len);
void ib_mem_unpin(hc_transport_t *tr, hc_mr_t *pin);
/* The cache's deregistration callback (ctx: the transport). */
void ib_mrc_dereg(void *ctx, hc_mrc_entry_t *e);
/* The flush word (registered as device buffers are: dma-buf or peermem)
 * and its loopback QP; -1 with the reason in why when either cannot be had
 * (ib_flush_free undoes whatever was set up; the transport stays sound). */
int ib_flush_setup(hc_transport_t *tr, char *why, size_t whylen);
void ib_flush_free(hc_transport_t *tr);
/* Post the flush reads for the immediates held now on the loopback QP
 * (one signaled completion); ibv_post_send's code. ib_flush_release once
 * that completion is in. */
int ib_flush_post(hc_transport_t *tr);
void ib_flush_release(hc_transport_t *tr);

/* ---- send.c ---------------------------------------------------------------- */

hcoll_status_t ib_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                      uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id);
/* Write val into the peer's credit word for our QP q, on QP q;
 * ibv_post_send's code. */
int ib_credit_write(hc_ep_t *ep, int q, uint64_t val);
/* Tell the peer how many receives we reposted, once enough have been. */
hcoll_status_t ib_post_credit(hc_ep_t *ep);
/* Post queued puts while credits and send slots allow, in chains (one
 * ibv_post_send per QP for up to IB_CHAIN of them). */
hcoll_status_t ib_pend_flush(hc_ep_t *ep);

/* ---- poll.c ---------------------------------------------------------------- */

/* One sweep over every endpoint and the flush QP. */
hcoll_status_t ib_progress(hc_transport_t *tr);
hcoll_status_t ib_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms, int *n_out);

#endif /* HCOLL_BUILD_VERBS */

#endif
