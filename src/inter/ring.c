/*
 * Ring all-reduce: reduce-scatter then all-gather, each cut into chunks
 * that flow independently, over the RDMA-shaped transport seam.
 *
 * The vector is split into N blocks (block b: elements [off(b), off(b+1)),
 * the first count%N blocks one element longer), each block into C chunks.
 * Message m = s*C + c is "step s, chunk c".
 *
 *   reduce-scatter, step s, rank r:                 (N-1 steps)
 *     send block (r-s) chunk c ──put──► next's staging slot j  (needs a credit)
 *     prev's put lands in my slot j  → recv[blk(r-1-s)] = slot j ⊕ send[...]
 *                                    → credit j back to prev (0-byte put)
 *   after step N-2, rank r holds block r+1 fully reduced (AVG divided here,
 *   once, so every rank later gets the same bits).
 *
 *   all-gather, step s, rank r:                     (N-1 steps)
 *     send block (r+1-s) chunk c ──put──► next's recv buffer, same offset
 *     (next told me its buffer's key with a descriptor put at the start)
 *
 *   r-1 ──► r ──► r+1 ──► ... ──► r-1      block b is reduced in one fixed
 *                                           chain b, b+1, ..., b-1, so the
 *                                           result is bit-identical everywhere
 *
 * A chunk of step s+1 leaves as soon as its step-s chunk is reduced, so
 * while one chunk is being reduced the others are on the wire. Nothing here
 * relies on puts arriving in order: every immediate names its message.
 *
 * Small vectors (N vectors fit in one chunk, and see GATHER_HOP_BYTES): the
 * vectors themselves go
 * round (gather mode), into a region of the next rank kept for this, two
 * halves used by alternate operations:
 *
 *   step s, rank r: vector (r-s) ──put──► next's gather[seq%2][r-s]
 *   after N-1 steps every rank holds all N vectors and folds them:
 *   recv = ((v0 ⊕ v1) ⊕ v2) ... ⊕ v(N-1)            same order everywhere
 *
 * N-1 hops instead of 2(N-1) (for N = 2 the two vectors cross once instead
 * of a reduce-scatter then an all-gather), no descriptor and no credits:
 * a rank starts operation k+2 only after the vector of its next rank for
 * k+1 has reached it, sent when that rank had finished k, its last use of
 * the half that k+2 writes. AVG divides once, after the fold.
 *
 * Device buffers (GPUDirect): the same chunked ring, with staging slots in
 * device memory that prev's NIC writes, the reductions, the AVG division
 * and copies done by the caller's device operations (hc_ring_devops_t),
 * and no gather mode. Every rank runs a given operation the same way.
 *
 * Immediate (32 bits): kind:2 | seq:4 | slot:4 | message:22. seq is the
 * operation's sequence number mod 16: a neighbour can be at most one
 * operation ahead, so messages of the next operation are recognised and
 * kept until it starts.
 */
#include "inter/ring.h"
#include "base/clock.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/reduce.h"

enum { IMM_RS = 0, IMM_AG = 1, IMM_CREDIT = 2, IMM_DESC = 3 };
#define IMM(kind, seq, slot, m) \
    (((uint32_t)(kind) << 30) | (((uint32_t)(seq)&15u) << 26) | (((uint32_t)(slot)&15u) << 22) | \
     ((uint32_t)(m)&0x3fffffu))
#define IMM_KIND(i) ((int)((i) >> 30))
#define IMM_SEQ(i)  ((unsigned)(((i) >> 26) & 15u))
#define IMM_SLOT(i) ((int)(((i) >> 22) & 15u))
#define IMM_MSG(i)  ((size_t)((i)&0x3fffffu))
#define IMM_MSG_MAX ((size_t)1 << 22)

#define RING_MAGIC 0x48435247u /* "HCRG" */
#define DESC_SLOTS 4           /* mailbox entries; neighbours differ by <= 1 op */
#define DESC_BYTES 32
#define EARLY_MAX  64
#define DEFAULT_SLOTS 4
/* Gather mode saves N-1 hops and sends (N-1)(N-2)/N vectors more per rank
 * (none for N = 2), so it pays while (N-2)/N of a vector takes less than a
 * hop. This is a floor for what a hop costs in bytes (its latency times the
 * link rate): 16 KiB is 130 us at 1 Gbit/s, 1.3 us at 100 Gbit/s. On the
 * emulated 4x2 cluster at 1 Gbit/s, 32 KiB shards (N = 4) were even and 128
 * KiB ones twice as slow in gather mode. */
#define GATHER_HOP_BYTES (16 * 1024)

/* What each rank publishes once at creation. */
typedef struct ring_info {
    uint32_t magic;
    uint32_t rank;
    uint32_t nslots;
    uint32_t pad;
    uint64_t chunk_bytes;
    hc_rkey_t slots_rkey;
    hc_rkey_t ctrl_rkey;
    hc_rkey_t gather_rkey;
} ring_info_t;

typedef struct ring_desc {
    hc_rkey_t recv_rkey;
    uint64_t seq;
    uint64_t sig; /* op_sig(): what this operation was called with */
} ring_desc_t;

/* count, dtype and op of an operation in one word, so that neighbours
 * called with different arguments find out at the start of the operation
 * instead of through an out-of-bounds frame or a deadline. */
static uint64_t op_sig(size_t count, hcoll_dtype_t dtype, hcoll_op_t op)
{
    return ((uint64_t)count << 16) | ((uint64_t)(dtype & 0xff) << 8) | (uint64_t)(op & 0xff);
}

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
    size_t base, rem;   /* block geometry */
    size_t ce, C, nmsg; /* chunk elements, chunks per block, messages per phase */
    hc_mr_t *send_mr, *recv_mr;
    hc_rkey_t next_recv; /* next's receive buffer */
    int have_desc;
    size_t rs_next;      /* next reduce-scatter message to send */
    size_t rs_nrecv;     /* reduced so far */
    size_t ag_next;
    size_t ag_nrecv;
    int gather;          /* gather mode: nmsg = N-1 whole vectors */
    int dev;             /* device buffers: device slots and devops */
    char *ghalf;         /* gather mode: this operation's half of gbuf */
    uint8_t *rs_done;    /* [nmsg] received and reduced */
    uint8_t *ag_done;    /* [nmsg] landed */
} ring_op_t;

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
    uint32_t early[EARLY_MAX];
    int nearly;
    size_t puts_out;
    char *gbuf;           /* gather mode: 2 halves of N vectors of gvec bytes */
    size_t gvec;
    hc_mr_t *gbuf_mr;
    hc_rkey_t next_gbuf;
    const hc_ring_devops_t *devops; /* device buffers, once enabled */
    void *dslots;         /* device staging slots, written by prev */
    hc_mr_t *dslots_mr;
    hc_rkey_t next_dslots;
    uint8_t *flags;       /* storage for rs_done/ag_done */
    size_t flags_cap;
    ring_op_t op;
    double last_activity;
    hcoll_status_t err;
};

#define RING_ERRBUF(r) ((r)->p.tp.errbuf)
#define RING_LOGRANK(r) ((r)->p.tp.log_rank)

static hcoll_status_t ring_fail(hc_ring_t *r, hcoll_status_t st)
{
    if (r->err == HCOLL_SUCCESS)
        r->err = st;
    return r->err;
}

/* ------------------------------------------------------------------------ */
/* Creation                                                                   */
/* ------------------------------------------------------------------------ */

hcoll_status_t hc_ring_create(const hc_ring_params_t *params, hc_ring_t **ring_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_errbuf_t *eb = params->tp.errbuf;
    const int lr = params->tp.log_rank;
    const int n = params->tp.nranks, me = params->tp.rank;
    if (n < 1 || me < 0 || me >= n || !params->ops || !params->allgather ||
        params->chunk_bytes < 8 || params->nslots < 0 || params->nslots > HC_RING_MAX_SLOTS)
        return hc_err_set(eb, HC_NET, lr, HCOLL_ERR_INVALID_ARG,
                          "ring: bad parameters (position %d of %d, chunk %llu bytes, %d slots)",
                          me, n, (unsigned long long)params->chunk_bytes, params->nslots);

    hc_ring_t *r = calloc(1, sizeof *r);
    if (!r)
        return hc_err_set(eb, HC_NET, lr, HCOLL_ERR_NO_MEMORY, "ring: out of memory");
    r->p = *params;
    r->rank = me;
    r->n = n;
    r->next = (me + 1) % n;
    r->prev = (me + n - 1) % n;
    r->ops = params->ops;
    r->chunk_bytes = (size_t)params->chunk_bytes & ~(size_t)7; /* whole elements of any type */
    r->nslots = params->nslots ? params->nslots : DEFAULT_SLOTS;
    *ring_out = r;
    if (n == 1)
        return HCOLL_SUCCESS;

    HC_CHECK(r->ops->create(&params->tp, &r->tr), fail_ring);
    int peers[2] = { r->next, r->prev };
    hc_ep_t *eps[2] = { NULL, NULL };
    HC_CHECK(r->ops->connect(r->tr, peers, n == 2 ? 1 : 2, params->allgather, params->ag_ctx, eps),
             fail_tr);
    r->ep_next = eps[0];
    r->ep_prev = n == 2 ? eps[0] : eps[1];

    r->slots = aligned_alloc(64, (size_t)r->nslots * r->chunk_bytes);
    r->ctrl = aligned_alloc(64, 2 * DESC_SLOTS * DESC_BYTES);
    r->gvec = r->chunk_bytes / (size_t)n & ~(size_t)63;
    r->gbuf = aligned_alloc(64, 2 * (size_t)n * r->gvec + 64);
    if (!r->slots || !r->ctrl || !r->gbuf) {
        st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_NO_MEMORY,
                        "ring: out of memory for %d staging slots of %zu bytes", r->nslots,
                        r->chunk_bytes);
        goto fail_mem;
    }
    memset(r->ctrl, 0, 2 * DESC_SLOTS * DESC_BYTES);
    ring_info_t mine = { RING_MAGIC, (uint32_t)me, (uint32_t)r->nslots, 0, r->chunk_bytes,
                         { { 0, 0 } }, { { 0, 0 } }, { { 0, 0 } } };
    HC_CHECK(r->ops->mr_reg(r->tr, r->slots, (size_t)r->nslots * r->chunk_bytes, &r->slots_mr,
                            &mine.slots_rkey),
             fail_mem);
    HC_CHECK(r->ops->mr_reg(r->tr, r->ctrl, 2 * DESC_SLOTS * DESC_BYTES, &r->ctrl_mr,
                            &mine.ctrl_rkey),
             fail_slots_mr);
    HC_CHECK(r->ops->mr_reg(r->tr, r->gbuf, 2 * (size_t)n * r->gvec + 64, &r->gbuf_mr,
                            &mine.gather_rkey),
             fail_ctrl_mr);

    ring_info_t *all = calloc((size_t)n, sizeof *all);
    if (!all) {
        st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_NO_MEMORY, "ring: out of memory");
        goto fail_gbuf_mr;
    }
    HC_CHECK(params->allgather(params->ag_ctx, &mine, all, sizeof mine), fail_all);
    for (int i = 0; i < n; i++) {
        if (all[i].magic != RING_MAGIC || all[i].rank != (uint32_t)i) {
            st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_INTERNAL,
                            "ring: rank %d published no valid ring info",
                            hc_tp_rank(&params->tp, i));
            goto fail_all;
        }
        if (all[i].nslots != mine.nslots || all[i].chunk_bytes != mine.chunk_bytes) {
            st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_MISMATCH,
                            "ring: rank %d uses %u slots of %llu bytes, rank %d %u of %llu "
                            "(HCOLL_CHUNK_BYTES must be equal everywhere)",
                            hc_tp_rank(&params->tp, i), all[i].nslots,
                            (unsigned long long)all[i].chunk_bytes, lr, mine.nslots,
                            (unsigned long long)mine.chunk_bytes);
            goto fail_all;
        }
    }
    r->next_slots = all[r->next].slots_rkey;
    r->prev_ctrl = all[r->prev].ctrl_rkey;
    r->next_gbuf = all[r->next].gather_rkey;
    free(all);
    HC_INFO(HC_NET, lr,
            "ring: position %d of %d, next rank %d, prev rank %d, %d slots of %zu bytes over %s",
            me, n, hc_tp_rank(&r->p.tp, r->next), hc_tp_rank(&r->p.tp, r->prev), r->nslots,
            r->chunk_bytes, r->ops->name);
    return HCOLL_SUCCESS;

fail_all:
    free(all);
fail_gbuf_mr:
    r->ops->mr_dereg(r->tr, r->gbuf_mr);
fail_ctrl_mr:
    r->ops->mr_dereg(r->tr, r->ctrl_mr);
fail_slots_mr:
    r->ops->mr_dereg(r->tr, r->slots_mr);
fail_mem:
    free(r->gbuf);
    free(r->ctrl);
    free(r->slots);
fail_tr:
    r->ops->destroy(r->tr, 0);
fail_ring:
    free(r);
    *ring_out = NULL;
    return st;
}

void hc_ring_destroy(hc_ring_t *r)
{
    if (!r)
        return;
    int graceful = r->err == HCOLL_SUCCESS && !r->op.active;
    hc_ring_disable_device(r); /* normally done already, by the device path */
    if (r->tr) {
        /* Only an idle, healthy ring says goodbye; anything else resets so
         * that the neighbours stop waiting for us at once. */
        r->ops->destroy(r->tr, graceful); /* frees its regions too */
        r->tr = NULL;
    }
    free(r->flags);
    free(r->gbuf);
    free(r->ctrl);
    free(r->slots);
    free(r);
}

void hc_ring_fail(hc_ring_t *r, hcoll_status_t st)
{
    if (!r)
        return;
    if (r->err == HCOLL_SUCCESS)
        r->err = st;
    if (r->tr) {
        r->ops->destroy(r->tr, 0);
        r->tr = NULL;
        r->ep_next = r->ep_prev = NULL;
    }
}

hc_ep_t *hc_ring_debug_ep_next(hc_ring_t *r)
{
    return r->ep_next;
}

/* ------------------------------------------------------------------------ */
/* Geometry                                                                   */
/* ------------------------------------------------------------------------ */

static inline size_t blk_off(const ring_op_t *o, int b)
{
    return (size_t)b * o->base + ((size_t)b < o->rem ? (size_t)b : o->rem);
}

static inline size_t blk_cnt(const ring_op_t *o, int b)
{
    return o->base + ((size_t)b < o->rem);
}

/* Element offset and count of chunk c of block b. */
static inline void chunk_of(const ring_op_t *o, int b, size_t c, size_t *off, size_t *cnt)
{
    size_t bc = blk_cnt(o, b), start = c * o->ce;
    *off = blk_off(o, b) + start;
    *cnt = start >= bc ? 0 : (bc - start < o->ce ? bc - start : o->ce);
    if (start >= bc)
        *off = blk_off(o, b);
}

static inline int mod_n(const hc_ring_t *r, long v)
{
    long n = r->n;
    return (int)(((v % n) + n) % n);
}

/* ------------------------------------------------------------------------ */
/* Sending                                                                    */
/* ------------------------------------------------------------------------ */

static hcoll_status_t put(hc_ring_t *r, hc_ep_t *ep, hc_mr_t *lmr, size_t loff,
                          const hc_rkey_t *rkey, uint64_t roff, size_t len, uint32_t imm)
{
    hcoll_status_t st = r->ops->put(ep, lmr, loff, rkey, roff, len, imm, 0);
    if (st != HCOLL_SUCCESS)
        return ring_fail(r, st);
    r->puts_out++;
    return HCOLL_SUCCESS;
}

static hcoll_status_t try_send(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    const unsigned seq = (unsigned)(r->seq & 15);
    hcoll_status_t st;

    while (o->gather && o->rs_next < o->nmsg) {
        size_t s = o->rs_next;
        if (s > 0 && !o->rs_done[s - 1])
            break;
        /* Step 0 sends my vector, step s the one that came in at s-1. */
        size_t off = (size_t)(o->ghalf - r->gbuf) +
                     (size_t)mod_n(r, (long)r->rank - (long)s) * r->gvec;
        st = put(r, r->ep_next, r->gbuf_mr, off, &r->next_gbuf, off,
                 o->count * o->esize + sizeof(gather_trailer_t), IMM(IMM_RS, seq, 0, s));
        if (st != HCOLL_SUCCESS)
            return st;
        o->rs_next++;
    }
    while (!o->gather && o->rs_next < o->nmsg && r->nbusy < r->nslots) {
        size_t m = o->rs_next, s = m / o->C, c = m % o->C;
        if (s > 0 && !o->rs_done[m - o->C])
            break;
        int slot = 0;
        while (r->slot_busy[slot])
            slot++;
        size_t off, cnt;
        chunk_of(o, mod_n(r, (long)r->rank - (long)s), c, &off, &cnt);
        /* Step 0 sends my own contribution, later steps what I reduced. */
        hc_mr_t *mr = s == 0 ? o->send_mr : o->recv_mr;
        st = put(r, r->ep_next, mr, off * o->esize, o->dev ? &r->next_dslots : &r->next_slots,
                 (uint64_t)slot * r->chunk_bytes, cnt * o->esize, IMM(IMM_RS, seq, slot, m));
        if (st != HCOLL_SUCCESS)
            return st;
        r->slot_busy[slot] = 1;
        r->nbusy++;
        o->rs_next++;
    }
    while (o->have_desc && o->ag_next < o->nmsg) {
        size_t m = o->ag_next, s = m / o->C, c = m % o->C;
        if (s == 0 ? !o->rs_done[(size_t)(r->n - 2) * o->C + c] : !o->ag_done[m - o->C])
            break;
        size_t off, cnt;
        chunk_of(o, mod_n(r, (long)r->rank + 1 - (long)s), c, &off, &cnt);
        st = put(r, r->ep_next, o->recv_mr, off * o->esize, &o->next_recv, off * o->esize,
                 cnt * o->esize, IMM(IMM_AG, seq, 0, m));
        if (st != HCOLL_SUCCESS)
            return st;
        o->ag_next++;
    }
    return HCOLL_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Receiving                                                                  */
/* ------------------------------------------------------------------------ */

/* Gather mode: the vector of step s has landed in this operation's half;
 * the last one in makes the result. */
static hcoll_status_t on_gather(hc_ring_t *r, size_t s)
{
    ring_op_t *o = &r->op;
    if (s >= o->nmsg || o->rs_done[s])
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                       "ring: unexpected gather message %zu from rank %d", s,
                                       hc_tp_rank(&r->p.tp, r->prev)));
    o->rs_done[s] = 1;
    if (++o->rs_nrecv < o->nmsg)
        return HCOLL_SUCCESS;
    /* Every vector was sent for this operation with these arguments. */
    const char *v = o->ghalf;
    const gather_trailer_t want = { r->seq, op_sig(o->count, o->dtype, o->op) };
    for (int q = 0; q < r->n; q++) {
        gather_trailer_t got;
        memcpy(&got, v + (size_t)q * r->gvec + o->count * o->esize, sizeof got);
        if (got.seq != want.seq || got.sig != want.sig)
            return ring_fail(
                r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_MISMATCH,
                              "ring: the vector of rank %d in operation %llu "
                              "was not sent with this rank's count %zu, dtype %s "
                              "and op %s: every rank must pass the same",
                              hc_tp_rank(&r->p.tp, q), (unsigned long long)r->seq, o->count,
                              hcoll_dtype_name(o->dtype), hcoll_op_name(o->op)));
    }
    /* Order 0, 1, ..., N-1 on every rank; my own vector is read from the
     * half too, as recv may be send. */
    hc_reduce(o->recv, v, v + r->gvec, o->count, o->dtype, o->op);
    for (int q = 2; q < r->n; q++)
        hc_reduce(o->recv, o->recv, v + (size_t)q * r->gvec, o->count, o->dtype, o->op);
    hc_reduce_avg_finish(o->recv, o->count, o->dtype, o->op, o->avg_div);
    return HCOLL_SUCCESS;
}

static hcoll_status_t on_rs(hc_ring_t *r, uint32_t imm)
{
    ring_op_t *o = &r->op;
    size_t m = IMM_MSG(imm);
    int slot = IMM_SLOT(imm);
    if (o->gather)
        return on_gather(r, m);
    if (m >= o->nmsg || o->rs_done[m] || slot >= r->nslots)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                       "ring: unexpected reduce-scatter message %zu slot %d "
                                       "from rank %d",
                                       m, slot, hc_tp_rank(&r->p.tp, r->prev)));
    size_t s = m / o->C, c = m % o->C, off, cnt;
    chunk_of(o, mod_n(r, (long)r->rank - 1 - (long)s), c, &off, &cnt);
    /* One pass: partial from the chain ⊕ my own contribution → my output. */
    if (o->dev) {
        const hc_ring_devops_t *d = r->devops;
        char *dst = o->recv + off * o->esize;
        const char *landed = (const char *)r->dslots + (size_t)slot * r->chunk_bytes;
        hcoll_status_t st =
            d->reduce(d->ctx, dst, landed, o->send + off * o->esize, cnt, o->dtype, o->op);
        if (st == HCOLL_SUCCESS && s == (size_t)r->n - 2 && o->op == HCOLL_AVG)
            st = d->avg(d->ctx, dst, cnt, o->dtype, o->op, o->avg_div);
        if (st != HCOLL_SUCCESS)
            return ring_fail(r, st);
    } else {
        hc_reduce(o->recv + off * o->esize, r->slots + (size_t)slot * r->chunk_bytes,
                  o->send + off * o->esize, cnt, o->dtype, o->op);
        if (s == (size_t)r->n - 2 && o->op == HCOLL_AVG)
            hc_reduce_avg_finish(o->recv + off * o->esize, cnt, o->dtype, o->op, o->avg_div);
    }
    o->rs_done[m] = 1;
    o->rs_nrecv++;
    return put(r, r->ep_prev, NULL, 0, NULL, 0, 0,
               IMM(IMM_CREDIT, r->seq & 15, slot, m));
}

static hcoll_status_t on_desc(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    ring_desc_t d;
    memcpy(&d, r->ctrl + (r->seq % DESC_SLOTS) * DESC_BYTES, sizeof d);
    if (d.seq != r->seq)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                       "ring: descriptor from rank %d is for operation %llu, "
                                       "expected %llu",
                                       hc_tp_rank(&r->p.tp, r->next), (unsigned long long)d.seq,
                                       (unsigned long long)r->seq));
    uint64_t mine = op_sig(o->count, o->dtype, o->op);
    if (d.sig != mine)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_MISMATCH,
                                       "ring: rank %d called operation %llu with count %llu, "
                                       "dtype %s, op %s; this rank with count %zu, dtype %s, "
                                       "op %s: every rank must pass the same",
                                       hc_tp_rank(&r->p.tp, r->next), (unsigned long long)r->seq,
                                       (unsigned long long)(d.sig >> 16),
                                       hcoll_dtype_name((hcoll_dtype_t)((d.sig >> 8) & 0xff)),
                                       hcoll_op_name((hcoll_op_t)(d.sig & 0xff)), o->count,
                                       hcoll_dtype_name(o->dtype), hcoll_op_name(o->op)));
    o->next_recv = d.recv_rkey;
    o->have_desc = 1;
    r->desc_seen[r->seq & 15] = 0;
    return HCOLL_SUCCESS;
}

static hcoll_status_t on_comp(hc_ring_t *r, const hc_comp_t *c)
{
    if (c->kind == HC_COMP_PUT) {
        r->puts_out--;
        return HCOLL_SUCCESS;
    }
    uint32_t imm = c->imm;
    int kind = IMM_KIND(imm);
    if (kind == IMM_CREDIT) {
        int slot = IMM_SLOT(imm);
        if (slot >= r->nslots || !r->slot_busy[slot])
            return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r),
                                           HCOLL_ERR_NETWORK,
                                           "ring: credit for slot %d that is not in use", slot));
        r->slot_busy[slot] = 0;
        r->nbusy--;
        return HCOLL_SUCCESS;
    }
    const unsigned cur = (unsigned)(r->seq & 15), nxt = (unsigned)((r->seq + 1) & 15);
    const unsigned s4 = IMM_SEQ(imm);
    const int active = r->op.active;
    /* Between operations, the next one to start is r->seq. */
    if ((active && s4 == nxt) || (!active && s4 == cur)) {
        if (kind == IMM_DESC) {
            r->desc_seen[s4] = 1;
            return HCOLL_SUCCESS;
        }
        if (kind == IMM_RS && r->nearly < EARLY_MAX) {
            r->early[r->nearly++] = imm;
            return HCOLL_SUCCESS;
        }
    } else if (active && s4 == cur) {
        switch (kind) {
        case IMM_RS:
            return on_rs(r, imm);
        case IMM_AG: {
            size_t m = IMM_MSG(imm);
            if (m < r->op.nmsg && !r->op.ag_done[m]) {
                r->op.ag_done[m] = 1;
                r->op.ag_nrecv++;
                return HCOLL_SUCCESS;
            }
            break;
        }
        case IMM_DESC:
            return on_desc(r);
        }
    }
    return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                   "ring: unexpected message (kind %d, operation %u mod 16, "
                                   "message %zu) from rank %d during operation %llu",
                                   kind, s4, IMM_MSG(imm), hc_tp_rank(&r->p.tp, c->peer),
                                   (unsigned long long)r->seq));
}

/* ------------------------------------------------------------------------ */
/* Operation                                                                  */
/* ------------------------------------------------------------------------ */

static void op_finish(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
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
    return o->rs_next == o->nmsg && o->rs_nrecv == o->nmsg && o->ag_next == o->nmsg &&
           o->ag_nrecv == o->nmsg && r->puts_out == 0 && r->nbusy == 0;
}

static hcoll_status_t ring_start(hc_ring_t *r, const void *sendbuf, void *recvbuf, size_t count,
                                 hcoll_dtype_t dtype, hcoll_op_t op, int avg_divisor, int dev)
{
    hcoll_status_t st = HCOLL_SUCCESS;
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
    const size_t es = hcoll_dtype_size(dtype);
    const int div = avg_divisor > 0 ? avg_divisor : r->n;
    /* Nothing to exchange: every rank sees the same count and skips alike,
     * so sequence numbers stay in step. */
    if (count == 0)
        return HCOLL_SUCCESS;
    if (r->n == 1 && dev) {
        const hc_ring_devops_t *d = r->devops;
        if (sendbuf != recvbuf && (st = d->copy(d->ctx, recvbuf, sendbuf, count * es)) != 0)
            return st;
        return d->avg(d->ctx, recvbuf, count, dtype, op, div);
    }
    if (r->n == 1) {
        if (sendbuf != recvbuf)
            memmove(recvbuf, sendbuf, count * es);
        hc_reduce_avg_finish(recvbuf, count, dtype, op, div);
        return HCOLL_SUCCESS;
    }

    ring_op_t *o = &r->op;
    memset(o, 0, sizeof *o);
    o->send = sendbuf;
    o->recv = recvbuf;
    o->count = count;
    o->esize = es;
    o->dtype = dtype;
    o->op = op;
    o->avg_div = div;
    o->base = count / (size_t)r->n;
    o->rem = count % (size_t)r->n;
    o->ce = r->chunk_bytes / es;
    size_t maxblk = o->base + (o->rem > 0);
    o->C = (maxblk + o->ce - 1) / o->ce;
    o->nmsg = (size_t)(r->n - 1) * o->C;
    /* Every rank decides alike: count, dtype, N and the chunk are equal.
     * A next operation's N-1 messages must fit the early list. */
    o->dev = dev;
    o->gather = !dev && count * es + sizeof(gather_trailer_t) <= r->gvec &&
                r->n - 1 <= EARLY_MAX &&
                count * es * (size_t)(r->n - 2) <= (size_t)r->n * GATHER_HOP_BYTES;
    if (o->gather) {
        o->C = 1;
        o->nmsg = (size_t)(r->n - 1);
    }
    if (o->nmsg >= IMM_MSG_MAX)
        return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_UNSUPPORTED,
                          "ring: %zu elements need %zu messages of %zu bytes per phase, more "
                          "than %zu; raise HCOLL_CHUNK_BYTES",
                          count, o->nmsg, r->chunk_bytes, IMM_MSG_MAX - 1);
    if (o->nmsg * 2 > r->flags_cap) {
        uint8_t *f = realloc(r->flags, o->nmsg * 2);
        if (!f)
            return hc_err_set(eb, HC_NET, RING_LOGRANK(r), HCOLL_ERR_NO_MEMORY,
                              "ring: out of memory");
        r->flags = f;
        r->flags_cap = o->nmsg * 2;
    }
    memset(r->flags, 0, o->nmsg * 2);
    o->rs_done = r->flags;
    o->ag_done = r->flags + o->nmsg;

    if (o->gather) {
        o->ghalf = r->gbuf + (size_t)(r->seq & 1) * (size_t)r->n * r->gvec;
        char *mine = o->ghalf + (size_t)r->rank * r->gvec;
        memcpy(mine, sendbuf, count * es);
        const gather_trailer_t t = { r->seq, op_sig(count, dtype, op) };
        memcpy(mine + count * es, &t, sizeof t);
        o->ag_next = o->ag_nrecv = o->nmsg; /* no all-gather half */
        o->active = 1;
        r->last_activity = hc_now_ms();
        int nearly = r->nearly;
        r->nearly = 0;
        for (int i = 0; i < nearly; i++)
            HC_CHECK(on_rs(r, r->early[i]), fail_active);
        HC_CHECK(try_send(r), fail_active);
        return HCOLL_SUCCESS;
    }

    hc_rkey_t recv_rkey;
    HC_CHECK(r->ops->mr_reg(r->tr, recvbuf, count * es, &o->recv_mr, &recv_rkey), fail);
    if (sendbuf == recvbuf) {
        o->send_mr = o->recv_mr;
    } else {
        hc_rkey_t unused;
        HC_CHECK(r->ops->mr_reg(r->tr, (void *)sendbuf, count * es, &o->send_mr, &unused),
                 fail_recv_mr);
    }
    o->active = 1;

    /* Tell prev where my output is: its all-gather writes straight there. */
    const size_t box = r->seq % DESC_SLOTS;
    ring_desc_t d = { recv_rkey, r->seq, op_sig(count, dtype, op) };
    memcpy(r->ctrl + (DESC_SLOTS + box) * DESC_BYTES, &d, sizeof d);
    HC_CHECK(put(r, r->ep_prev, r->ctrl_mr, (DESC_SLOTS + box) * DESC_BYTES, &r->prev_ctrl,
                 box * DESC_BYTES, sizeof d, IMM(IMM_DESC, r->seq & 15, 0, 0)),
             fail_active);

    r->last_activity = hc_now_ms();
    if (r->desc_seen[r->seq & 15])
        HC_CHECK(on_desc(r), fail_active);
    /* Reduce-scatter messages that arrived before this operation began. */
    int nearly = r->nearly;
    r->nearly = 0;
    for (int i = 0; i < nearly; i++)
        HC_CHECK(on_rs(r, r->early[i]), fail_active);
    HC_CHECK(try_send(r), fail_active);
    HC_TRACE(HC_NET, RING_LOGRANK(r),
             "ring: op %llu started: %zu x %s %s, %zu chunk(s) of %zu elements per block",
             (unsigned long long)r->seq, count, hcoll_dtype_name(dtype), hcoll_op_name(op), o->C,
             o->ce);
    return HCOLL_SUCCESS;

fail_active:
    /* The ring is broken (sticky error); keep the op marked active so that
     * destroy resets the connections. */
    return ring_fail(r, st);
fail_recv_mr:
    r->ops->mr_dereg(r->tr, o->recv_mr);
    o->recv_mr = NULL;
fail:
    return ring_fail(r, st);
}

hcoll_status_t hc_ring_start(hc_ring_t *r, const void *sendbuf, void *recvbuf, size_t count,
                             hcoll_dtype_t dtype, hcoll_op_t op, int avg_divisor)
{
    return ring_start(r, sendbuf, recvbuf, count, dtype, op, avg_divisor, 0);
}

hcoll_status_t hc_ring_start_device(hc_ring_t *r, const void *sendbuf, void *recvbuf,
                                    size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                    int avg_divisor)
{
    return ring_start(r, sendbuf, recvbuf, count, dtype, op, avg_divisor, 1);
}

/* ------------------------------------------------------------------------ */
/* Device buffers                                                             */
/* ------------------------------------------------------------------------ */

int hc_ring_gdr_capable(const hc_ring_t *r)
{
    if (r->n == 1)
        return 1;
    return r->tr && r->ops->gdr && r->ops->gdr(r->tr);
}

void hc_ring_disable_device(hc_ring_t *r)
{
    if (!r || !r->devops)
        return;
    if (r->dslots_mr && r->tr)
        r->ops->mr_dereg(r->tr, r->dslots_mr);
    if (r->dslots)
        r->devops->free(r->devops->ctx, r->dslots);
    r->dslots_mr = NULL;
    r->dslots = NULL;
    r->devops = NULL;
}

/* What each rank publishes when device buffers are enabled. */
typedef struct ring_dev_info {
    uint32_t magic;
    uint32_t ok;
    hc_rkey_t dslots_rkey;
} ring_dev_info_t;

hcoll_status_t hc_ring_enable_device(hc_ring_t *r, const hc_ring_devops_t *ops)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_errbuf_t *eb = RING_ERRBUF(r);
    const int lr = RING_LOGRANK(r);
    if (r->err)
        return r->err;
    if (r->devops)
        return HCOLL_SUCCESS;
    if (r->n == 1) {
        r->devops = ops;
        return HCOLL_SUCCESS;
    }
    ring_dev_info_t mine;
    memset(&mine, 0, sizeof mine);
    mine.magic = RING_MAGIC;
    void *slots = NULL;
    hc_mr_t *mr = NULL;
    const size_t bytes = (size_t)r->nslots * r->chunk_bytes;
    if (ops->alloc(ops->ctx, bytes, &slots) == HCOLL_SUCCESS) {
        if (r->ops->mr_reg(r->tr, slots, bytes, &mr, &mine.dslots_rkey) == HCOLL_SUCCESS)
            mine.ok = 1;
        else
            HC_WARN(HC_NET, lr, "ring: device staging slots not registered: %s",
                    hc_errbuf_get(eb));
    }
    /* Everyone exchanges, whatever happened here: the ring fails together. */
    ring_dev_info_t *all = calloc((size_t)r->n, sizeof *all);
    if (!all) {
        st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_NO_MEMORY, "ring: out of memory");
        goto undo;
    }
    HC_CHECK(r->p.allgather(r->p.ag_ctx, &mine, all, sizeof mine), free_all);
    for (int i = 0; i < r->n; i++)
        if (all[i].magic != RING_MAGIC || !all[i].ok) {
            st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_UNSUPPORTED,
                            "ring: rank %d cannot take device buffers over %s (GPUDirect); "
                            "its log says why",
                            hc_tp_rank(&r->p.tp, i), r->ops->name);
            goto free_all;
        }
    r->next_dslots = all[r->next].dslots_rkey;
    r->dslots = slots;
    r->dslots_mr = mr;
    r->devops = ops;
    free(all);
    HC_INFO(HC_NET, lr, "ring: device buffers over %s: %d device slots of %zu bytes (GPUDirect)",
            r->ops->name, r->nslots, r->chunk_bytes);
    return HCOLL_SUCCESS;

free_all:
    free(all);
undo:
    if (mr)
        r->ops->mr_dereg(r->tr, mr);
    if (slots)
        ops->free(ops->ctx, slots);
    return st;
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
        HC_CHECK(r->ops->poll(r->tr, comps, (int)HC_ARRAY_LEN(comps), 0, &n), fail);
        if (n == 0) {
            if (op_complete(r))
                break;
            double now = hc_now_ms();
            if (now - r->last_activity > r->p.tp.timeout_ms) {
                const ring_op_t *o = &r->op;
                st = hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_TIMEOUT,
                                "ring: no progress for %d ms in operation %llu (reduce-scatter "
                                "%zu/%zu received from rank %d, all-gather %zu/%zu received, "
                                "%d credit(s) owed by rank %d, %s)",
                                r->p.tp.timeout_ms, (unsigned long long)r->seq, o->rs_nrecv,
                                o->nmsg, hc_tp_rank(&r->p.tp, r->prev), o->ag_nrecv, o->nmsg,
                                r->nbusy, hc_tp_rank(&r->p.tp, r->next),
                                o->gather      ? "vectors gathered"
                                : o->have_desc ? "descriptor received"
                                               : "no descriptor from next rank");
                goto fail;
            }
            if (now >= give_up)
                return HCOLL_SUCCESS;
            double left = r->last_activity + r->p.tp.timeout_ms - now;
            if (give_up - now < left)
                left = give_up - now;
            int wait = (int)left + 1;
            HC_CHECK(r->ops->poll(r->tr, comps, (int)HC_ARRAY_LEN(comps), wait, &n), fail);
            if (n == 0)
                continue;
        }
        r->last_activity = hc_now_ms();
        for (int i = 0; i < n; i++)
            HC_CHECK(on_comp(r, &comps[i]), fail);
        HC_CHECK(try_send(r), fail);
    }
    op_finish(r);
    *done_out = 1;
    return HCOLL_SUCCESS;

fail:
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
