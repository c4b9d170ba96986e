/*
 * The device path's state, shared by its files (coll_dev.h is the
 * interface; the design is at the top of coll_dev.c):
 *   coll_dev.c       set-up, timing events, teardown
 *   coll_dev_enq.c   validation and the GPU stages on the caller's stream
 *   coll_dev_gated.c the gated copies or reductions on hcoll's gate stream
 *   coll_dev_host.c  the host stage on the executor's worker
 *   coll_dev_rsag.c  reduce-scatter and all-gather, both sides
 */
#ifndef HC_CORE_COLL_DEV_PRIV_H
#define HC_CORE_COLL_DEV_PRIV_H

#include <pthread.h>

#include "core/coll.h"
#include "core/coll_dev.h"
#include "core/coll_priv.h"
#include "core/redop.h"
#include "gdr/devctx.h"
#include "gdr/event.h"
#include "gdr/gate.h"
#include "inter/ring.h"
#include "intra/intra.h"

/* ------------------------------------------------------------------------ */
/* State                                                                      */
/* ------------------------------------------------------------------------ */

/* One segment's host stage. */
typedef struct hc_dev_seg {
    void *ev_ready;           /* its stage ① done on the caller's stream */
    const unsigned char *src; /* device range the host stage reads ... */
    unsigned char *dst;       /* ... and writes back */
    size_t count;
    /* Gated (coll_dev_gated.c): its pieces o->pc[pc0 .. pc0+npc), and the
     * event on the gate stream after its last copy back, which the
     * caller's stream waits for. */
    int pc0, npc;
    void *ev_back;
    /* Gated on device memory (GPUDirect): njobs reductions behind tickets
     * jt0.. and signalling sig0..; gate_end lets the copy of the ring's
     * end go (ev_back). */
    size_t njobs;
    uint32_t jt0, sig0, gate_end;
} hc_dev_seg_t;

/* One staged piece of a gated call (coll_dev_gated.c). */
typedef struct hc_dev_piece {
    void *ev_in;   /* its copy into staging done (the worker polls it) */
    uint32_t gate; /* the ticket its copy back waits for */
} hc_dev_piece_t;

/* Timing events on the caller's stream: [0] before the first RS, [1]
 * after the last; [2+2k], [3+2k] around segment k's AG. One node: [0], [1]
 * around the all-reduce (fused). NULL where one could not be made. */
#define DEV_TEV (2 + 2 * HC_DEVSCHED_SEGMENTS)

/* What a device operation is. */
enum hc_dev_kind { HC_DEV_ALLREDUCE, HC_DEV_BCAST, HC_DEV_RS, HC_DEV_AG };

struct hc_dev_op {
    enum hc_dev_kind kind;
    hcoll_status_t status; /* an enqueue failure after the first stream wait */
    int nseg;              /* segments with a host stage and a flag number */
    hcoll_dtype_t dtype;
    hcoll_op_t op;
    hc_redop_t ro;         /* scaled ops: where and by what (redop.h) */
    void *tev[DEV_TEV];
    int ntev;              /* slots used */
    int fused;             /* one NCCL all-reduce: its time is split RS/AG */
    /* Broadcast: the whole call (dtype is then an integer type that divides
     * the size, count its elements), and the ring chain's first position.
     * All-reduce: count and the segments' (segc elements each). */
    int root;
    const void *sendbuf; /* the root's */
    void *recvbuf;
    size_t count, segc;
    int chain_root;
    /* What the ranks compare (hc_dev_local_agree, hc_coll_dev_agree). */
    size_t fp_count;
    int fp_dtype, fp_op;
    /* Reduce-scatter / all-gather (count: elements per block): the ring's
     * N blocks of count elements, read from rsrc and written to rdst
     * (equal but for a GPUDirect reduce-scatter from sendbuf), at ring
     * position pos; NULL: no ring stage. */
    const unsigned char *rsrc;
    unsigned char *rdst;
    int nblk, pos;
    /* Gated calls (coll_dev_gated.c): the ticket the first copy waits for
     * (released when the worker starts the call), the last ticket issued
     * (0 with gated unset), the pieces, the gate stream's last event. */
    int gated;
    uint32_t gate_start, gate_hi;
    hc_dev_piece_t *pc;
    int npc;
    void *ev_tail;
    hc_dev_seg_t seg[];    /* [nseg] (room for every segment of the call) */
};

struct hc_coll_dev {
    struct hcoll_comm *c;
    hc_gdr_report_t rp; /* the communicator's errbuf, rank and abort flag */
    int plan;
    hc_ring_t *ring;
    hc_allgather_fn node_ag;
    void *node_ag_ctx;
    size_t stage_bytes; /* each of the two buffers */

    /* Set up by the first device call. */
    int ready;
    hcoll_status_t setup_failed; /* sticky */
    int dev;            /* ordinal, -1 before the set-up */
    hc_gdr_dev_t *gpu;  /* context, internal stream, staging, kernels */
    hc_intra_t *nccl;   /* NCCL stages, all issued by the caller's thread */
    hc_intra_t *agree;  /* plans with NCCL: the node's call-time argument check */
    int gdr;                  /* stage ② on device memory (GPUDirect ring) */
    hc_gdr_gate_t *gate;      /* staged plans: hcoll's gated stream (gdr/gate.h) */
    hc_ring_devops_t devops;  /* the ring's device operations (ctx = gpu) */
    /* Staged plans: the two staging buffers, registered with the ring's
     * transport from set-up to teardown, so that no device call registers
     * them (a refusal fails the set-up, never a ring half-way). */
    hc_mr_t *stage_pin[2];

    /* Reduce-scatter / all-gather: the permuted vector (device memory),
     * reused; v_free is recorded behind a call's last use of it, and the
     * next call's stream waits for it (the caller's thread only). */
    void *v_buf;
    size_t v_cap;
    void *v_free;

    hc_gdr_evlist_t done; /* recorded after each call's last stream work */
};

static inline int plan_needs_nccl(int plan)
{
    return plan == HC_PLAN_INTRA || plan == HC_PLAN_3STAGE;
}

static inline int plan_stages(int plan)
{
    return plan == HC_PLAN_RING || plan == HC_PLAN_FLAT || plan == HC_PLAN_3STAGE;
}

/* The first device call's set-up on device dev (coll_dev.c): collective
 * over all ranks; a failure is sticky (d->setup_failed). */
hcoll_status_t hc_coll_dev_setup(hc_coll_dev_t *d, int dev);

/* The checks and the first call's set-up of every device call, on the
 * caller's thread (coll_dev_enq.c); *dev_out is the buffers' GPU. */
hcoll_status_t hc_dev_prepare(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                              size_t count, hcoll_dtype_t dtype, hcoll_op_t op, void *stream);

/* The node's call-time check of o's fingerprint (coll_dev.c), where the
 * plan has NCCL stages: *agree_out = 0 when the node's ranks disagree
 * (then nothing may go on the stream). A failure is recorded. */
hcoll_status_t hc_dev_local_agree(hc_coll_dev_t *d, const hc_dev_op_t *o, int *agree_out);

/* recvbuf = scalar * sendbuf on stream, for o->ro.dev_scale (coll_dev_enq.c). */
hcoll_status_t hc_dev_prescale(hc_coll_dev_t *d, const hc_dev_op_t *o, const void *sendbuf,
                               void *recvbuf, size_t count, void *stream);

/* The frame of every device call's stream work (coll_dev.c). begin: the
 * device's context made current, stream checked to be on the device, and
 * *ev_done_out made (on failure nothing is left). end: with st ==
 * HCOLL_SUCCESS, ev_done is recorded behind the call's work on stream
 * and kept in the done list; otherwise it is freed; the context is popped
 * either way. Returns st. */
hcoll_status_t hc_dev_call_begin(hc_coll_dev_t *d, void *stream, void **ev_done_out);
hcoll_status_t hc_dev_call_end(hc_coll_dev_t *d, void *stream, void *ev_done, hcoll_status_t st);

/* Wait for ev, recorded on the caller's stream behind work that other
 * ranks hold up (a collective's NCCL stage, a flag wait): no deadline
 * while every local rank is alive, up to HCOLL_OP_TIMEOUT_MS, with the
 * abort check; a dead or stopped local rank ends it (coll_dev.c). */
hcoll_status_t hc_dev_wait_stream(hc_coll_dev_t *d, void *ev, const char *what);

/* A gated segment on device memory (GPUDirect), while the ring runs it
 * (coll_dev_gated.c): the ring says which of its messages landed, their
 * enqueued reductions' gates open in message order, and the gate stream's
 * signals tell the ring which are reduced. begin installs the ring's hooks
 * (a failure is recorded; nothing is installed), end removes them. */
typedef struct hc_dev_gdr_seg {
    hc_gdr_gate_t *gate;
    const hc_dev_seg_t *g;
    uint8_t *landed; /* [njobs] */
    size_t opened;   /* gates opened: jobs 0 .. opened-1 */
    hc_ring_gated_t hooks;
} hc_dev_gdr_seg_t;
hcoll_status_t hc_dev_gdr_seg_begin(hc_coll_dev_t *d, const hc_dev_seg_t *g,
                                    hc_dev_gdr_seg_t *x);
void hc_dev_gdr_seg_end(hc_coll_dev_t *d, hc_dev_gdr_seg_t *x);

/* The gated all-reduce of the staged plans (coll_dev_gated.c): the
 * caller's side, after stage ① of every segment (whose ready events are in
 * o->seg), puts the copies through staging on the gate stream and makes
 * stream wait for them before stage ③ (ag(k) called for each segment k
 * right after its wait). A failure after the first gate is kept in
 * o->status (the worker must still release the gates). */
hcoll_status_t hc_dev_gated_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, size_t nseg, void *stream,
                                    hcoll_status_t (*ag)(hc_coll_dev_t *d, hc_dev_op_t *o,
                                                         size_t k, void *stream, void *arg),
                                    void *arg);
/* The gated reduce-scatter or all-gather (coll_dev_gated.c): after the
 * stream's ready event (o->seg[0].ev_ready), the staged pieces of P
 * elements per block (or, GPUDirect, the ring's reductions) on the gate
 * stream, and stream's wait for them; what hc_dev_gated_enqueue says of
 * failures. */
hcoll_status_t hc_dev_gated_rsag_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, void *stream,
                                         size_t P);
/* The worker's account of one call's host stage (coll_dev_host.c): the
 * time its rings took, and, three stages, a void on this rank's rail
 * (each ring job's status through hc_coll_rail_ran, coll_rail.c), which
 * the call goes on past, in step, to fail at its end. */
typedef struct hc_dev_run {
    double ring_us;
    hc_coll_void_t v;
} hc_dev_run_t;

/* The worker's side of it (coll_dev_rsag.c), as the all-reduce's. */
hcoll_status_t hc_dev_rsag_gated(hc_coll_dev_t *d, hc_dev_op_t *o, hcoll_status_t st,
                                 hc_dev_run_t *run);

/* Free what the op's gated part holds (events, pieces); the worker
 * (coll_dev_host.c) runs the host side before. */
void hc_dev_gated_free(hc_coll_dev_t *d, hc_dev_op_t *o);

/* Timing events (coll_dev.c): mark event i of o on stream (best effort),
 * free o's events, the microseconds between events a and b (or -1). */
void hc_dev_tev_mark(hc_coll_dev_t *d, hc_dev_op_t *o, int i, void *stream);
void hc_dev_tev_free(hc_coll_dev_t *d, hc_dev_op_t *o);
double hc_dev_tev_us(hc_coll_dev_t *d, const hc_dev_op_t *o, int a, int b);

#endif
