/*
 * One ring operation, from start to done: the checks and the schedule at
 * start, the descriptor that tells prev where this rank's output is, the
 * messages that arrived early, and the progress loop that polls the
 * transport, hands each completion to the protocol (ring.c) and enforces
 * the no-progress deadline (the operation timeout) and, on every slice,
 * the neighbours' liveness (ring_live.c).
 */
#include "inter/ring_priv.h"
#include "base/clock.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/reduce.h"

/* Longest transport wait between two looks at the liveness links. */
#define RING_LIVE_SLICE_MS 50

/* The invariant of an operation's end, checked on its own (not through
 * op_complete), so that an operation reported done early fails every test
 * that runs a ring, TCP ones included, instead of passing wherever the
 * transport happens to have drained already: every message of both phases
 * sent and received, none of this rank's puts in flight, no slot of next's
 * still owed a credit. A few compares per operation. */
static hcoll_status_t op_drained(hc_ring_t *r)
{
    const ring_op_t *o = &r->op;
    const size_t m = o->g.nmsg;
    if (r->puts_out == 0 && r->nbusy == 0 && o->rs_next == m && o->rs_nrecv == m &&
        o->ag_next == m && o->ag_nrecv == m)
        return HCOLL_SUCCESS;
    return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_INTERNAL,
                      "ring: operation %llu reported done with %zu put(s) in flight, %d "
                      "credit(s) owed by next, messages sent %zu+%zu and received %zu+%zu of "
                      "%zu per phase",
                      (unsigned long long)r->seq, r->puts_out, r->nbusy, o->rs_next, o->ag_next,
                      o->rs_nrecv, o->ag_nrecv, m);
}

static void op_finish(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    if (o->user_recv) /* the stage's registration stays */
        o->send_mr = o->recv_mr = NULL;
    if (o->send_mr && o->send_mr != o->recv_mr)
        r->ops->mr_dereg(r->tr, o->send_mr);
    if (o->recv_mr)
        r->ops->mr_dereg(r->tr, o->recv_mr);
    o->send_mr = o->recv_mr = NULL;
    o->active = 0;
    r->seq++;
}

static int op_complete(const hc_ring_t *r)
{
    const ring_op_t *o = &r->op;
    /* Also wait for my credits and my puts: when an operation ends nothing
     * of it is still in flight towards or from this rank. */
    /* The descriptor too (its signature check), which a phase alone or a
     * broadcast's root may not otherwise wait for. */
    return o->rs_next == o->g.nmsg && o->rs_nrecv == o->g.nmsg && o->ag_next == o->g.nmsg &&
           o->ag_nrecv == o->g.nmsg && r->puts_out == 0 && r->nbusy == 0 &&
           (o->g.gather || o->have_desc);
}

/* What a start may not be called with; not sticky, the ring stays usable. */
static hcoll_status_t start_check(hc_ring_t *r, const void *sendbuf, const void *recvbuf,
                                  size_t count, hcoll_dtype_t dtype, hcoll_op_t op, int dev)
{
    hc_errbuf_t *eb = RING_ERRBUF(r);
    if (r->err)
        return r->err;
    if (dev && !r->devops)
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_INVALID_ARG,
                          "ring: device buffers before hc_ring_enable_device");
    if (r->op.active)
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_INVALID_ARG,
                          "ring: an operation is already active");
    if (!hc_reduce_valid(dtype, op))
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_INVALID_ARG,
                          "ring: invalid dtype %d or op %d", (int)dtype, (int)op);
    if (count && (!sendbuf || !recvbuf))
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_INVALID_ARG,
                          "ring: NULL buffer with count %zu", count);
    return HCOLL_SUCCESS;
}

/* A 1-rank ring: the result is the input (divided, for AVG); an
 * all-gather has nothing to do. */
static hcoll_status_t start_alone(hc_ring_t *r, const void *sendbuf, void *recvbuf, size_t count,
                                  hcoll_dtype_t dtype, hcoll_op_t op, int div, int dev, int phase)
{
    hcoll_status_t st;
    const size_t es = hcoll_dtype_size(dtype);
    if (phase == HC_RING_PHASE_AG)
        return HCOLL_SUCCESS;
    if (dev) {
        const hc_ring_devops_t *d = r->devops;
        if (sendbuf != recvbuf && (st = d->copy(d->ctx, recvbuf, sendbuf, count * es)) != 0)
            return st;
        return d->avg(d->ctx, recvbuf, count, dtype, op, div);
    }
    if (sendbuf != recvbuf)
        memmove(recvbuf, sendbuf, count * es);
    hc_reduce_avg_finish(recvbuf, count, dtype, op, div);
    return HCOLL_SUCCESS;
}

/* The operation's arguments, its schedule and its message flags; nothing
 * is sent yet. Every rank decides alike: count, dtype, N and the chunk are
 * equal. */
static hcoll_status_t op_init(hc_ring_t *r, const void *sendbuf, void *recvbuf, size_t count,
                              hcoll_dtype_t dtype, hcoll_op_t op, int div, int dev, int phase)
{
    hc_errbuf_t *eb = RING_ERRBUF(r);
    ring_op_t *o = &r->op;
    memset(o, 0, sizeof *o);
    o->send = sendbuf;
    o->recv = recvbuf;
    o->count = count;
    o->esize = hcoll_dtype_size(dtype);
    o->dtype = dtype;
    o->op = op;
    o->avg_div = div;
    o->dev = dev;
    o->phase = phase;
    o->rot = phase == HC_RING_PHASE_ALLREDUCE ? 0 : -1;
    o->gated = dev && phase != HC_RING_PHASE_AG ? r->gated : NULL;
    const size_t trailer = sizeof(gather_trailer_t);
    /* A phase alone takes N-1 hops chunked too: no gather mode. */
    hc_ring_sched_plan(&o->g, r->n, count, o->esize, r->chunk_bytes,
                       r->gvec >= trailer ? r->gvec - trailer : 0,
                       dev || phase != HC_RING_PHASE_ALLREDUCE);
    if (phase == HC_RING_PHASE_ALLREDUCE) /* blocks only the ring sees */
        hc_ring_sched_align(&o->g, o->esize);
    if (o->g.nmsg >= IMM_MSG_MAX)
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_UNSUPPORTED,
                          "ring: %zu elements need %zu messages of %zu bytes per phase, more "
                          "than %zu; raise HCOLL_CHUNK_BYTES",
                          count, o->g.nmsg, r->chunk_bytes, IMM_MSG_MAX - 1);
    if (o->g.nmsg * 2 > r->flags_cap) {
        uint8_t *f = realloc(r->flags, o->g.nmsg * 2);
        if (!f)
            return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_NO_MEMORY,
                              "ring: out of memory");
        r->flags = f;
        r->flags_cap = o->g.nmsg * 2;
    }
    memset(r->flags, 0, o->g.nmsg * 2);
    o->rs_done = r->flags;
    o->ag_done = r->flags + o->g.nmsg;
    /* The phase that does not run counts as done. */
    if (phase == HC_RING_PHASE_AG)
        o->rs_next = o->rs_nrecv = o->g.nmsg;
    if (phase == HC_RING_PHASE_RS)
        o->ag_next = o->ag_nrecv = o->g.nmsg;
    return HCOLL_SUCCESS;
}

/* Reduce-scatter messages that arrived before this operation began. */
static hcoll_status_t take_early(hc_ring_t *r)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    int nearly = r->nearly;
    r->nearly = 0;
    for (int i = 0; i < nearly && st == HCOLL_SUCCESS; i++)
        st = hc_ring_on_rs(r, r->early[i]);
    return st;
}

/* Gather mode: my vector and its trailer into my place of this
 * operation's half, then round it goes. */
static hcoll_status_t start_gather(hc_ring_t *r)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    ring_op_t *o = &r->op;
    o->ghalf = r->gbuf + (size_t)(r->seq & 1) * (size_t)r->n * r->gvec;
    char *mine = o->ghalf + (size_t)r->rank * r->gvec;
    memcpy(mine, o->send, o->count * o->esize);
    const gather_trailer_t t = { r->seq, ring_op_sig(o->count, o->phase, o->dtype, o->op) };
    memcpy(mine + o->count * o->esize, &t, sizeof t);
    o->ag_next = o->ag_nrecv = o->g.nmsg; /* no all-gather half */
    o->active = 1;
    r->last_activity = hc_now_ms();
    HC_CHECK(take_early(r), clean_active);
    HC_CHECK(hc_ring_send_ready(r), clean_active);
    return HCOLL_SUCCESS;

clean_active:
    return ring_fail(r, st);
}

/* ---- the stage (ring.h, HC_RING_STAGE_MAX) -------------------------------- */

/* Every host operation (both phases, one alone, a broadcast chain) whose
 * buffers nobody holds registered. */
static int stage_wanted(const hc_ring_t *r, const void *send, const void *recv, size_t bytes)
{
    return bytes > 0 && bytes <= HC_RING_STAGE_MAX && r->ops->mem_pinned &&
           !(r->ops->mem_pinned(r->tr, recv, bytes) &&
             (send == recv || r->ops->mem_pinned(r->tr, send, bytes)));
}

int hc_ring_stages(const hc_ring_t *r, const void *sendbuf, const void *recvbuf, size_t count,
                   hcoll_dtype_t dtype, int phase)
{
    return hc_ring_registers(r, count, dtype, phase) &&
           stage_wanted(r, sendbuf, recvbuf, count * hcoll_dtype_size(dtype));
}

hcoll_status_t hc_ring_stage_reserve(hc_ring_t *r, size_t bytes)
{
    if (!r || bytes <= r->stage_cap || bytes > HC_RING_STAGE_MAX || !r->ops->mem_pinned)
        return HCOLL_SUCCESS;
    /* Whole 64 KiB, at least twice the last size: a few growths at most. */
    size_t cap = r->stage_cap * 2 > bytes ? r->stage_cap * 2 : bytes;
    cap = (cap + 65535) & ~(size_t)65535;
    if (cap > HC_RING_STAGE_MAX)
        cap = HC_RING_STAGE_MAX;
    char *p = aligned_alloc(4096, cap);
    if (!p)
        return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NO_MEMORY,
                          "ring: no memory for a stage of %zu bytes", cap);
    hc_mr_t *mr = NULL;
    hc_rkey_t rk;
    hcoll_status_t st = r->ops->mr_reg(r->tr, p, cap, &mr, &rk);
    if (st != HCOLL_SUCCESS) {
        free(p);
        return st;
    }
    if (r->stage_mr)
        r->ops->mr_dereg(r->tr, r->stage_mr);
    free(r->stage);
    r->stage = p;
    r->stage_cap = cap;
    r->stage_mr = mr;
    r->stage_rkey = rk;
    return HCOLL_SUCCESS;
}

/* Run the operation in the stage: sendbuf copied in (a broadcast's only
 * on its root: the others' bytes come from prev), recv kept for the end
 * (op_stage_out); the stage's registration serves both sides. */
static hcoll_status_t op_stage_in(hc_ring_t *r, size_t bytes, hc_rkey_t *rkey_out)
{
    ring_op_t *o = &r->op;
    hcoll_status_t st = hc_ring_stage_reserve(r, bytes);
    if (st != HCOLL_SUCCESS)
        return st;
    if (!o->bcast || r->rank == o->root)
        memcpy(r->stage, o->send, bytes);
    o->user_recv = o->recv;
    o->send = o->recv = r->stage;
    o->send_mr = o->recv_mr = r->stage_mr;
    *rkey_out = r->stage_rkey;
    return HCOLL_SUCCESS;
}

static void op_stage_out(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    /* A broadcast's came out as it landed; the root's was there. */
    if (o->user_recv && !o->voided && !o->bcast)
        memcpy(o->user_recv, r->stage, o->count * o->esize);
}

/* The chunked ring: both buffers registered, prev told where my output
 * is (its all-gather writes straight there), then the first chunks. */
static hcoll_status_t start_chunked(hc_ring_t *r)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    ring_op_t *o = &r->op;
    const size_t bytes = o->count * o->esize;
    hc_rkey_t recv_rkey;
    /* A refused registration voids the operation (ring_void.c) instead of
     * breaking the ring: the neighbours are in it already. */
    hcoll_status_t reg;
    if (!o->dev && stage_wanted(r, o->send, o->recv, bytes))
        reg = op_stage_in(r, bytes, &recv_rkey);
    else
        reg = r->ops->mr_reg(r->tr, o->recv, bytes, &o->recv_mr, &recv_rkey);
    if (reg == HCOLL_SUCCESS && o->user_recv) {
        /* both in the stage */
    } else if (reg == HCOLL_SUCCESS && o->send == o->recv) {
        o->send_mr = o->recv_mr;
    } else if (reg == HCOLL_SUCCESS) {
        reg = r->ops->mr_reg(r->tr, (void *)o->send, bytes, &o->send_mr, NULL);
        if (reg != HCOLL_SUCCESS) {
            r->ops->mr_dereg(r->tr, o->recv_mr);
            o->recv_mr = NULL;
        }
    }
    o->active = 1;

    if (reg != HCOLL_SUCCESS) {
        HC_CHECK(hc_ring_void_self(r, reg), clean_active);
    } else {
        const size_t box = r->seq % DESC_SLOTS;
        ring_desc_t d = { recv_rkey, r->seq, ring_op_sig(o->count, o->phase, o->dtype, o->op) };
        memcpy(r->ctrl + (DESC_SLOTS + box) * DESC_BYTES, &d, sizeof d);
        HC_CHECK(hc_ring_put(r, r->ep_prev, r->ctrl_mr, (DESC_SLOTS + box) * DESC_BYTES,
                             &r->prev_ctrl, box * DESC_BYTES, sizeof d,
                             IMM(IMM_DESC, r->seq & 15, 0, 0)),
                 clean_active);
    }

    r->last_activity = hc_now_ms();
    if (r->desc_seen[r->seq & 15])
        HC_CHECK(hc_ring_on_desc(r), clean_active);
    HC_CHECK(take_early(r), clean_active);
    HC_CHECK(hc_ring_send_ready(r), clean_active);
    HC_TRACE(HC_NET, RING_LOGRANK(r),
             "ring: op %llu started: %zu x %s %s, %zu chunk(s) of %zu elements per block",
             (unsigned long long)r->seq, o->count, hcoll_dtype_name(o->dtype),
             hcoll_op_name(o->op), o->g.C, o->g.ce);
    return HCOLL_SUCCESS;

clean_active:
    /* The ring is broken (sticky error); keep the op marked active so that
     * destroy resets the connections. */
    return ring_fail(r, st);
}

static hcoll_status_t ring_start(hc_ring_t *r, const void *sendbuf, void *recvbuf, size_t count,
                                 hcoll_dtype_t dtype, hcoll_op_t op, int avg_divisor, int dev,
                                 int phase)
{
    hcoll_status_t st = start_check(r, sendbuf, recvbuf, count, dtype, op, dev);
    if (st != HCOLL_SUCCESS)
        return st;
    const int div = avg_divisor > 0 ? avg_divisor : r->n;
    /* Nothing to exchange: every rank sees the same count and skips alike,
     * so sequence numbers stay in step. */
    if (count == 0)
        return HCOLL_SUCCESS;
    if (r->n == 1)
        return start_alone(r, sendbuf, recvbuf, count, dtype, op, div, dev, phase);
    st = op_init(r, sendbuf, recvbuf, count, dtype, op, div, dev, phase);
    if (st != HCOLL_SUCCESS)
        return st;
    return r->op.g.gather ? start_gather(r) : start_chunked(r);
}

hcoll_status_t hc_ring_start(hc_ring_t *r, const void *sendbuf, void *recvbuf, size_t count,
                             hcoll_dtype_t dtype, hcoll_op_t op, int avg_divisor)
{
    return ring_start(r, sendbuf, recvbuf, count, dtype, op, avg_divisor, 0,
                      HC_RING_PHASE_ALLREDUCE);
}

hcoll_status_t hc_ring_start_device(hc_ring_t *r, const void *sendbuf, void *recvbuf,
                                    size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                    int avg_divisor)
{
    return ring_start(r, sendbuf, recvbuf, count, dtype, op, avg_divisor, 1,
                      HC_RING_PHASE_ALLREDUCE);
}

hcoll_status_t hc_ring_rs_start(hc_ring_t *r, const void *sendbuf, void *recvbuf, size_t count,
                                hcoll_dtype_t dtype, hcoll_op_t op, int avg_divisor)
{
    return ring_start(r, sendbuf, recvbuf, count, dtype, op, avg_divisor, 0, HC_RING_PHASE_RS);
}

hcoll_status_t hc_ring_rs_start_device(hc_ring_t *r, const void *sendbuf, void *recvbuf,
                                       size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                       int avg_divisor)
{
    return ring_start(r, sendbuf, recvbuf, count, dtype, op, avg_divisor, 1, HC_RING_PHASE_RS);
}

/* The all-gather's data only moves: its signature says SUM whatever the
 * caller reduces elsewhere. */
hcoll_status_t hc_ring_ag_start(hc_ring_t *r, void *buf, size_t count, hcoll_dtype_t dtype)
{
    return ring_start(r, buf, buf, count, dtype, HCOLL_SUM, 0, 0, HC_RING_PHASE_AG);
}

hcoll_status_t hc_ring_ag_start_device(hc_ring_t *r, void *buf, size_t count, hcoll_dtype_t dtype)
{
    return ring_start(r, buf, buf, count, dtype, HCOLL_SUM, 0, 1, HC_RING_PHASE_AG);
}

int hc_ring_registers(const hc_ring_t *r, size_t count, hcoll_dtype_t dtype, int phase)
{
    if (!r || r->n == 1 || count == 0 || !r->ops->mem_pin)
        return 0;
    if (phase != HC_RING_PHASE_ALLREDUCE)
        return 1;
    hc_ring_sched_t g;
    const size_t trailer = sizeof(gather_trailer_t);
    hc_ring_sched_plan(&g, r->n, count, hcoll_dtype_size(dtype), r->chunk_bytes,
                       r->gvec >= trailer ? r->gvec - trailer : 0, 0);
    return !g.gather;
}

/* No progress for the operation timeout: every neighbour is alive (the
 * liveness links say so), but at least one has not called it. */
static hcoll_status_t op_timed_out(hc_ring_t *r)
{
    const ring_op_t *o = &r->op;
    return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_TIMEOUT,
                      "ring: no progress for %d ms in operation %llu (reduce-scatter "
                      "%zu/%zu received from rank %d, all-gather %zu/%zu received, "
                      "%d credit(s) owed by rank %d, %s; operation timeout%s)",
                      r->op_timeout_ms, (unsigned long long)r->seq, o->rs_nrecv, o->g.nmsg,
                      hc_tp_rank(&r->p.tp, r->prev), o->ag_nrecv, o->g.nmsg, r->nbusy,
                      hc_tp_rank(&r->p.tp, r->next),
                      o->g.gather    ? "vectors gathered"
                      : o->have_desc ? "descriptor received"
                                     : "no descriptor from next rank",
                      r->p.liveness_ms > 0 ? " HCOLL_OP_TIMEOUT_MS, neighbours alive" : "");
}

/*
 * The broadcast chain. No reduce-scatter phase and no staging slots: every
 * message goes straight into next's buffer at its own offset (as the
 * all-gather does), so there are no credits either; the root only sends,
 * the last rank only receives (and closes the chain), the others forward
 * each message once it landed. The op field of the signature names the root, so that a
 * neighbour with another root fails with HCOLL_ERR_MISMATCH.
 */
hcoll_status_t hc_ring_bcast_start(hc_ring_t *r, void *buf, size_t count, hcoll_dtype_t dtype,
                                   int root)
{
    return hc_ring_bcast_start_watched(r, buf, count, dtype, root, NULL);
}

static hcoll_status_t bcast_start(hc_ring_t *r, void *buf, size_t count, hcoll_dtype_t dtype,
                                  int root, int dev, atomic_size_t *landed)
{
    hc_errbuf_t *eb = RING_ERRBUF(r);
    hcoll_status_t st = start_check(r, buf, buf, count, dtype, HCOLL_SUM, 0);
    if (st != HCOLL_SUCCESS)
        return st;
    if (root < 0 || root >= r->n)
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_INVALID_ARG,
                          "ring: broadcast root %d out of %d positions", root, r->n);
    const int all_here = count == 0 || r->n == 1 || r->rank == root;
    if (landed)
        atomic_store_explicit(landed, all_here ? count * hcoll_dtype_size(dtype) : 0,
                              memory_order_release);
    if (count == 0 || r->n == 1)
        return HCOLL_SUCCESS;
    ring_op_t *o = &r->op;
    memset(o, 0, sizeof *o);
    o->landed = landed;
    o->send = o->recv = buf;
    o->count = count;
    o->esize = hcoll_dtype_size(dtype);
    o->dtype = dtype;
    o->op = (hcoll_op_t)(0x80 | (root & 0x7f));
    o->bcast = 1;
    o->dev = dev; /* only keeps it out of the stage: the chain moves bytes alike */
    o->root = root;
    const size_t bytes = count * o->esize;
    o->g.n = r->n;
    o->g.nmsg = (bytes + r->chunk_bytes - 1) / r->chunk_bytes;
    if (o->g.nmsg >= IMM_MSG_MAX)
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_UNSUPPORTED,
                          "ring: a broadcast of %zu bytes needs more than %zu messages; raise "
                          "HCOLL_CHUNK_BYTES",
                          bytes, IMM_MSG_MAX - 1);
    if (o->g.nmsg > r->flags_cap) {
        uint8_t *f = realloc(r->flags, o->g.nmsg);
        if (!f)
            return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_NO_MEMORY,
                              "ring: out of memory");
        r->flags = f;
        r->flags_cap = o->g.nmsg;
    }
    memset(r->flags, 0, o->g.nmsg);
    o->ag_done = r->flags;
    o->rs_next = o->rs_nrecv = o->g.nmsg; /* no reduce-scatter */
    /* The last rank closes the chain with one empty message (number
     * nmsg-1) to the root once it holds everything: the root finishes an
     * operation only after its prev has started it, which keeps every rank
     * at most one operation ahead of its prev, as the ring's immediates
     * need. The root receives only that. */
    if (r->rank == root) {
        memset(o->ag_done, 1, o->g.nmsg - 1);
        o->ag_nrecv = o->g.nmsg - 1;
    }
    if (r->next == root)
        o->ag_next = o->g.nmsg - 1;
    return start_chunked(r);
}

hcoll_status_t hc_ring_bcast_start_watched(hc_ring_t *r, void *buf, size_t count,
                                           hcoll_dtype_t dtype, int root, atomic_size_t *landed)
{
    return bcast_start(r, buf, count, dtype, root, 0, landed);
}

hcoll_status_t hc_ring_bcast_start_device(hc_ring_t *r, void *buf, size_t count,
                                          hcoll_dtype_t dtype, int root, atomic_size_t *landed)
{
    return bcast_start(r, buf, count, dtype, root, 1, landed);
}

/* What this unfinished operation still waits for from each neighbour:
 * next takes puts and returns credits, prev sends messages and the
 * descriptor. */
static hcoll_status_t op_left_check(hc_ring_t *r)
{
    const ring_op_t *o = &r->op;
    const size_t m = o->g.nmsg;
    int need_next = r->puts_out > 0 || r->nbusy > 0 || o->rs_next < m || o->ag_next < m;
    int need_prev = o->rs_nrecv < m || o->ag_nrecv < m || !(o->g.gather || o->have_desc);
    return hc_ring_live_left_check(r, need_next, need_prev);
}

hcoll_status_t hc_ring_progress(hc_ring_t *r, int wait_ms, int *done_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    *done_out = 0;
    if (r->err)
        return r->err;
    if (!r->op.active) {
        *done_out = 1;
        return HCOLL_SUCCESS;
    }
    const double give_up = hc_now_ms() + wait_ms;
    hc_comp_t comps[64];
    for (;;) {
        int n = 0;
        if (r->op.gated) {
            int moved = 0;
            HC_CHECK(hc_ring_gated_poll(r, &moved), out);
            if (moved) {
                r->last_activity = hc_now_ms();
                HC_CHECK(hc_ring_send_ready(r), out);
            }
        }
        HC_CHECK(r->ops->poll(r->tr, comps, (int)HC_ARRAY_LEN(comps), 0, &n), out);
        if (n == 0) {
            if (op_complete(r))
                break;
            HC_CHECK(hc_ring_live_check(r), out);
            HC_CHECK(op_left_check(r), out);
            double now = hc_now_ms();
            if (r->op_timeout_ms > 0 && now - r->last_activity > r->op_timeout_ms) {
                st = op_timed_out(r);
                goto out;
            }
            if (now >= give_up)
                return HCOLL_SUCCESS;
            /* Short slices while liveness links run, so that a dead
             * neighbour is noticed in a fraction of a second. */
            double left = give_up - now;
            if (r->op_timeout_ms > 0 && r->last_activity + r->op_timeout_ms - now < left)
                left = r->last_activity + r->op_timeout_ms - now;
            if (r->p.liveness_ms > 0 && left > RING_LIVE_SLICE_MS)
                left = RING_LIVE_SLICE_MS;
            /* Reductions running on the GPU: look again soon. */
            if (r->op.gated && r->op.rs_red < r->op.g.nmsg && left > 0)
                left = 0;
            int wait = (int)left + 1;
            HC_CHECK(r->ops->poll(r->tr, comps, (int)HC_ARRAY_LEN(comps), wait, &n), out);
            if (n == 0)
                continue;
        }
        r->last_activity = hc_now_ms();
        for (int i = 0; i < n; i++)
            HC_CHECK(hc_ring_on_comp(r, &comps[i]), out);
        HC_CHECK(hc_ring_send_ready(r), out);
    }
    HC_CHECK(op_drained(r), out);
    st = r->op.voided ? hc_ring_void_end(r) : HCOLL_SUCCESS; /* not sticky */
    op_stage_out(r);
    op_finish(r);
    *done_out = 1;
    return st;

out:
    return ring_fail(r, st);
}

hcoll_status_t hc_ring_allreduce(hc_ring_t *r, const void *sendbuf, void *recvbuf, size_t count,
                                 hcoll_dtype_t dtype, hcoll_op_t op)
{
    hcoll_status_t st = hc_ring_start(r, sendbuf, recvbuf, count, dtype, op, 0);
    int done = 0;
    while (st == HCOLL_SUCCESS && !done)
        st = hc_ring_progress(r, 1000, &done);
    return st;
}
