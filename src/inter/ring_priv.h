/*
 * The ring's objects and messages, shared by its files and by nothing
 * else:
 *
 *   ring.c        the algorithm (its drawing): what to send next and what
 *                 each arriving message means
 *   ring_sched.c  the schedule arithmetic (blocks, chunks, gather mode)
 *   ring_setup.c  creation (connect, staging slots, the info exchange),
 *                 failure and destruction
 *   ring_op.c     one operation: start, progress, finish
 *   ring_dev.c    device buffers (GPUDirect staging slots)
 *   ring_void.c   an operation a rank could not register its buffers for
 *
 * The calls go one way: ring_op.c -> ring.c -> ring_sched.h, ring.c and
 * ring_op.c -> ring_void.c, and
 * ring_setup.c -> ring_dev.c.
 */
#ifndef HC_INTER_RING_PRIV_H
#define HC_INTER_RING_PRIV_H

#include <stdatomic.h>

#include "inter/ring.h"
#include "inter/ring_sched.h"

/* Immediate (32 bits): kind:2 | seq:4 | slot:4 | message:22. */
enum { IMM_RS = 0, IMM_AG = 1, IMM_CREDIT = 2, IMM_DESC = 3 };
#define IMM(kind, seq, slot, m) \
    (((uint32_t)(kind) << 30) | (((uint32_t)(seq)&15u) << 26) | (((uint32_t)(slot)&15u) << 22) | \
     ((uint32_t)(m)&0x3fffffu))
#define IMM_KIND(i) ((int)((i) >> 30))
#define IMM_SEQ(i)  ((unsigned)(((i) >> 26) & 15u))
#define IMM_SLOT(i) ((int)(((i) >> 22) & 15u))
#define IMM_MSG(i)  ((size_t)((i)&0x3fffffu))
/* Message numbers below IMM_MSG_MAX; the field's top bit marks a void
 * notice instead (ring_void.c): void:1 | status:5 | failing position:16. */
#define IMM_MSG_MAX ((size_t)1 << 21)
#define IMM_VOID ((size_t)1 << 21)
#define IMM_IS_VOID(i) ((IMM_MSG(i) & IMM_VOID) != 0)
#define IMM_VOID_MSG(st, pos) \
    (IMM_VOID | (((size_t)(st)&31u) << 16) | ((pos) < 0xffff ? (size_t)(pos) : (size_t)0xffff))
#define IMM_VOID_ST(i) ((hcoll_status_t)((IMM_MSG(i) >> 16) & 31u))
#define IMM_VOID_POS(i) ((int)(IMM_MSG(i) & 0xffffu)) /* 0xffff: not known */

#define RING_MAGIC 0x48435247u /* "HCRG" */
#define DESC_SLOTS 4           /* mailbox entries; neighbours differ by <= 1 op */
#define DESC_BYTES 32
#define EARLY_MAX  HC_RING_EARLY_MAX
#define DEFAULT_SLOTS 4

/* What each rank publishes once at creation. */
typedef struct ring_info {
    uint32_t magic;
    uint32_t rank;
    uint32_t nslots;
    uint32_t live_port;  /* liveness link listener, 0: none */
    uint32_t live_ip;    /* network order */
    uint32_t pad;
    uint64_t chunk_bytes;
    hc_rkey_t slots_rkey;
    hc_rkey_t ctrl_rkey;
    hc_rkey_t gather_rkey;
} ring_info_t;

typedef struct ring_desc {
    hc_rkey_t recv_rkey;
    uint64_t seq;
    uint64_t sig; /* ring_op_sig(): what this operation was called with */
} ring_desc_t;

/* count, phase (enum hc_ring_phase), dtype and op of an operation in one
 * word, so that neighbours called with different arguments, or for
 * another phase, find out at the start of the operation instead of through
 * an out-of-bounds frame, a deadline or mixed data. */
static inline uint64_t ring_op_sig(size_t count, int phase, hcoll_dtype_t dtype, hcoll_op_t op)
{
    return ((uint64_t)count << 18) | ((uint64_t)(phase & 3) << 16) |
           ((uint64_t)(dtype & 0xff) << 8) | (uint64_t)(op & 0xff);
}
#define RING_SIG_COUNT(sig) ((unsigned long long)((sig) >> 18))
#define RING_SIG_PHASE(sig) ((int)(((sig) >> 16) & 3))

/* Gather mode has no descriptor: each vector travels with this trailer
 * right behind its last byte. A receiver reads it at the offset its own
 * count gives, so a vector sent with another count (or dtype, op) shows a
 * trailer that does not match, and the sequence number keeps a trailer
 * left by an older operation in the same half from passing for a new one. */
typedef struct gather_trailer {
    uint64_t seq;
    uint64_t sig;
} gather_trailer_t;

typedef struct ring_op {
    int active;
    const char *send;
    char *recv;
    size_t count, esize;
    hcoll_dtype_t dtype;
    hcoll_op_t op;
    int avg_div;
    hc_ring_sched_t g;   /* blocks, chunks, messages, gather mode */
    hc_mr_t *send_mr, *recv_mr;
    hc_rkey_t next_recv; /* next's receive buffer */
    int have_desc;
    size_t rs_next;      /* next reduce-scatter message to send */
    size_t rs_nrecv;     /* reduced so far */
    size_t ag_next;
    size_t ag_nrecv;
    int dev;             /* device buffers: device slots and devops */
    char *ghalf;         /* gather mode: this operation's half of gbuf */
    uint8_t *rs_done;    /* [nmsg] received and reduced */
    uint8_t *ag_done;    /* [nmsg] landed */
    int phase;           /* enum hc_ring_phase: both phases, or one alone */
    int rot;             /* block rotation: 0 (all-reduce), -1 (one phase: p ends/starts with p) */
    int bcast;           /* a broadcast chain (ring_op.c): root, ..., root-1 */
    const hc_ring_gated_t *gated; /* device all-reduce with gated reductions */
    size_t rs_red;       /* gated: reductions seen done (credits sent) */
    int root;            /* the chain's first position */
    atomic_size_t *landed; /* broadcast: bytes in place from buf's start, or NULL */
    size_t bc_prefix;    /* broadcast: messages landed with none missing before */
    /* Void (ring_void.c): a rank could not register its buffers; every
     * message from then on is an empty notice, counted, not reduced. */
    int voided;
    int void_pos;        /* ring position of the rank that failed (0xffff: ?) */
    hcoll_status_t void_st; /* its status */
    int void_self;       /* this rank is the one (its error is recorded) */
    char *user_recv;     /* staged: the caller's recvbuf (recv is the stage) */
    uint32_t slot_landed[HC_RING_MAX_SLOTS]; /* gated: messages landed per slot */
} ring_op_t;

enum { HC_RING_LIVE_OFF = 0, HC_RING_LIVE_UP, HC_RING_LIVE_LEFT, HC_RING_LIVE_DEAD };

/* A liveness link (ring_live.c): fd used by the liveness thread, the rest
 * read by the ring's thread. */
typedef struct ring_live {
    int fd;
    atomic_int state;      /* HC_RING_LIVE_* */
    atomic_llong last_ms;  /* when the last byte arrived (hc_now_ms) */
    atomic_llong left_ms;  /* LEFT: when the goodbye arrived */
    char why[112];         /* DEAD: what happened, written before state */
} ring_live_t;

struct hc_ring {
    hc_ring_params_t p;
    int rank, n, next, prev;
    const hc_transport_ops_t *ops;
    hc_transport_t *tr;
    hc_ep_t *ep_next, *ep_prev;
    size_t chunk_bytes;
    int nslots;
    char *slots;          /* my staging slots, written by prev */
    hc_mr_t *slots_mr;
    char *ctrl;           /* [mailbox DESC_SLOTS][outbox DESC_SLOTS] */
    hc_mr_t *ctrl_mr;
    hc_rkey_t next_slots, prev_ctrl;
    uint8_t slot_busy[HC_RING_MAX_SLOTS]; /* next's slots I have filled */
    int nbusy;
    uint64_t seq;         /* operations started */
    uint8_t desc_seen[16];
    uint32_t desc_void[16]; /* an early descriptor's void notice (0: none) */
    uint64_t nvoid;       /* operations voided (hc_ring_voided) */
    int void_rank;        /* hc_ring_void_rank */
    /* The stage (ring_op.c): host operations run here instead of in the
     * caller's buffers, registered once, grown to the largest seen. */
    char *stage;
    size_t stage_cap;
    hc_mr_t *stage_mr;
    hc_rkey_t stage_rkey;
    uint32_t early[EARLY_MAX];
    int nearly;
    size_t puts_out;
    char *gbuf;           /* gather mode: 2 halves of N vectors of gvec bytes */
    size_t gvec;
    hc_mr_t *gbuf_mr;
    hc_rkey_t next_gbuf;
    const hc_ring_devops_t *devops; /* device buffers, once enabled */
    const hc_ring_gated_t *gated;   /* hc_ring_set_gated */
    void *dslots;         /* device staging slots, written by prev */
    hc_mr_t *dslots_mr;
    hc_rkey_t next_dslots;
    uint8_t *flags;       /* storage for rs_done/ag_done */
    size_t flags_cap;
    ring_op_t op;
    double last_activity;
    int op_timeout_ms;    /* < 0: none */
    int live_listen;      /* during set-up */
    char rail_addr[64];   /* tp.bind_addr and tp.ifname, kept for messages */
    char rail_ifname[64];
    ring_live_t live[2];  /* [0] to next, [1] from prev */
    hcoll_status_t err;
};

#define RING_ERRBUF(r) ((r)->p.tp.errbuf)
#define RING_LOGRANK(r) ((r)->p.tp.log_rank)

/* The ring's sticky error: the first one stays. */
static inline hcoll_status_t ring_fail(hc_ring_t *r, hcoll_status_t st)
{
    if (r->err == HCOLL_SUCCESS)
        r->err = st;
    return r->err;
}

/* ---- ring_live.c: liveness links ---------------------------------------- */

/* Listen on the rail address (nothing when liveness_ms <= 0). */
hcoll_status_t hc_ring_live_listen(hc_ring_t *r, uint32_t *ip_out, uint32_t *port_out);
/* Dial next, accept prev, each end proving the communicator's key
 * (ring_link.c); after the info exchange. */
hcoll_status_t hc_ring_live_connect(hc_ring_t *r, uint32_t next_ip, uint32_t next_port);
/* ring_link.c hands the two proven links over: out to next, in from prev. */
void hc_ring_live_up(hc_ring_t *r, int out, int in);
/* HCOLL_ERR_PEER_FAILED (recorded) when a neighbour is dead. */
hcoll_status_t hc_ring_live_check(hc_ring_t *r);
/* An operation that still needs next (need_next) or prev (need_prev) after
 * that neighbour said goodbye can never finish: PEER_FAILED once the
 * goodbye is HC_RING_LEFT_GRACE_MS old and nothing moved since. */
#define HC_RING_LEFT_GRACE_MS 500
hcoll_status_t hc_ring_live_left_check(hc_ring_t *r, int need_next, int need_prev);
/* Close the links; graceful: with a goodbye. */
void hc_ring_live_close(hc_ring_t *r, int graceful);

/* ---- ring.c: the protocol ----------------------------------------------- */

/* A put that counts towards puts_out; a failure is the ring's. */
hcoll_status_t hc_ring_put(hc_ring_t *r, hc_ep_t *ep, hc_mr_t *lmr, size_t loff,
                           const hc_rkey_t *rkey, uint64_t roff, size_t len, uint32_t imm);

/* Send every message of the active operation whose turn has come. */
hcoll_status_t hc_ring_send_ready(hc_ring_t *r);

/* ---- ring_void.c: an operation a rank could not register for ------------ */

/* This rank's registration failed with st (recorded): the operation goes
 * on void. Sends the void descriptor to prev. */
hcoll_status_t hc_ring_void_self(hc_ring_t *r, hcoll_status_t st);
/* A void notice (imm) arrived: note it. */
void hc_ring_void_learn(hc_ring_t *r, uint32_t imm);
/* The void operation's sends: every message still owed, empty. */
hcoll_status_t hc_ring_void_send(hc_ring_t *r);
/* A void reduce-scatter notice, or any reduce-scatter message once void. */
hcoll_status_t hc_ring_void_on_rs(hc_ring_t *r, uint32_t imm);
/* The operation ended void: its error (recorded, not sticky). */
hcoll_status_t hc_ring_void_end(hc_ring_t *r);
/* Gated device reductions (ring_dev.c): mark what the GPU reduced since
 * the last look as done and send its credits; *moved_out: any. */
hcoll_status_t hc_ring_gated_poll(hc_ring_t *r, int *moved_out);

/* A reduce-scatter (or gather) message of the active operation landed. */
hcoll_status_t hc_ring_on_rs(hc_ring_t *r, uint32_t imm);

/* next's descriptor for the active operation is in the mailbox. */
hcoll_status_t hc_ring_on_desc(hc_ring_t *r);

/* One completion from the transport, whatever it is. */
hcoll_status_t hc_ring_on_comp(hc_ring_t *r, const hc_comp_t *c);

#endif
