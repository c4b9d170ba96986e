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
 * Small vectors (N vectors fit in one chunk, and see
 * HC_RING_GATHER_HOP_BYTES): the vectors themselves go round (gather
 * mode), into a region of the next rank kept for this, two halves used by
 * alternate operations:
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
 * One phase alone (hc_ring_rs_start, hc_ring_ag_start): the same chunked
 * phase with every block index one lower (rot = -1), so that position r
 * ends the reduce-scatter with block r, or starts the all-gather from it:
 *
 *   reduce-scatter alone, step s: send block (r-1-s), reduce block (r-2-s);
 *     after N-1 steps rank r holds block r (chain r+1, r+2, ..., r)
 *   all-gather alone, step s: send block (r-s), straight into next's buffer
 *
 * The phase is part of the descriptor's signature, and data of the phase
 * an operation does not run is refused, so neighbours that started
 * different phases fail instead of mixing data. No gather mode: a phase
 * alone takes N-1 hops chunked as well.
 *
 * Broadcast (hc_ring_bcast_start): a chain root, root+1, ..., root-1 of
 * all-gather-like puts straight into next's buffer, chunk by chunk, each
 * forwarded as soon as it landed (no staging slots, no credits):
 *
 *   root ──m0 m1 m2──► root+1 ──m0 m1──► root+2 ──m0──► ... ──► root-1
 *     ▲                                                             │
 *     └──────────── one empty message once root-1 has all ──────────┘
 *
 * (so the root does not finish before its prev started: neighbours stay
 * at most one operation apart, as the immediates' seq needs).
 * Watched (hc_ring_bcast_start_watched): each landing also publishes, in
 * the caller's atomic, the bytes landed with none missing before them, so
 * another thread can use each piece while the chain still runs.
 *
 * Device buffers (GPUDirect): the same chunked ring, with staging slots in
 * device memory that prev's NIC writes, the reductions, the AVG division
 * and copies done by the caller's device operations (hc_ring_devops_t),
 * and no gather mode. Every rank runs a given operation the same way.
 * Gated (hc_ring_set_gated, the device all-reduce): the caller enqueued
 * the reductions beforehand, message m's behind a gate and reading slot
 * m % nslots; the ring puts m there, reports each landing, and sends the
 * credit once the GPU says m is reduced (polled between transport polls,
 * ring_dev.c), so the GPU reduces while the CQs are polled.
 *
 * Immediate (32 bits): kind:2 | seq:4 | slot:4 | message:22. seq is the
 * operation's sequence number mod 16: a neighbour can be at most one
 * operation ahead, so messages of the next operation are recognised and
 * kept until it starts.
 *
 * This file holds the protocol: what to send next and what each arriving
 * message means. The schedule arithmetic is in ring_sched.h, an
 * operation's start and progress loop in ring_op.c, creation in
 * ring_setup.c, device slots in ring_dev.c (map in ring_priv.h).
 */
#include "inter/ring_priv.h"

#include <string.h>

#include "base/log.h"
#include "base/reduce.h"

/* ------------------------------------------------------------------------ */
/* Sending                                                                    */
/* ------------------------------------------------------------------------ */

hcoll_status_t hc_ring_put(hc_ring_t *r, hc_ep_t *ep, hc_mr_t *lmr, size_t loff,
                           const hc_rkey_t *rkey, uint64_t roff, size_t len, uint32_t imm)
{
    hcoll_status_t st = r->ops->put(ep, lmr, loff, rkey, roff, len, imm, 0);
    if (st != HCOLL_SUCCESS)
        return ring_fail(r, st);
    r->puts_out++;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_ring_send_ready(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    const unsigned seq = (unsigned)(r->seq & 15);
    hcoll_status_t st;

    if (o->voided)
        return hc_ring_void_send(r);
    while (o->g.gather && o->rs_next < o->g.nmsg) {
        size_t s = o->rs_next;
        if (s > 0 && !o->rs_done[s - 1])
            break;
        /* Step 0 sends my vector, step s the one that came in at s-1. */
        size_t off = (size_t)(o->ghalf - r->gbuf) +
                     (size_t)hc_ring_mod(r->n, (long)r->rank - (long)s) * r->gvec;
        st = hc_ring_put(r, r->ep_next, r->gbuf_mr, off, &r->next_gbuf, off,
                         o->count * o->esize + sizeof(gather_trailer_t), IMM(IMM_RS, seq, 0, s));
        if (st != HCOLL_SUCCESS)
            return st;
        o->rs_next++;
    }
    while (!o->g.gather && o->rs_next < o->g.nmsg && r->nbusy < r->nslots) {
        size_t m = o->rs_next, s = m / o->g.C, c = m % o->g.C;
        if (s > 0 && !o->rs_done[m - o->g.C])
            break;
        int slot = 0;
        if (o->gated) { /* the reductions were enqueued for slot m % nslots */
            slot = (int)(m % (size_t)r->nslots);
            if (r->slot_busy[slot])
                break;
        }
        while (r->slot_busy[slot])
            slot++;
        size_t off, cnt;
        hc_ring_chunk_of(&o->g, hc_ring_mod(r->n, (long)r->rank - (long)s + o->rot), c, &off,
                         &cnt);
        /* Step 0 sends my own contribution, later steps what I reduced. */
        hc_mr_t *mr = s == 0 ? o->send_mr : o->recv_mr;
        st = hc_ring_put(r, r->ep_next, mr, off * o->esize,
                         o->dev ? &r->next_dslots : &r->next_slots,
                         (uint64_t)slot * r->chunk_bytes, cnt * o->esize,
                         IMM(IMM_RS, seq, slot, m));
        if (st != HCOLL_SUCCESS)
            return st;
        r->slot_busy[slot] = 1;
        r->nbusy++;
        o->rs_next++;
    }
    /* Broadcast chain: message m is bytes [m*chunk, ...), sent by the root
     * at once and forwarded by the others as it lands. */
    while (o->bcast && o->have_desc && o->ag_next < o->g.nmsg) {
        size_t m = o->ag_next, off = m * r->chunk_bytes, bytes = o->count * o->esize;
        if (r->next == o->root) { /* the last rank: all landed, tell the root */
            if (o->ag_nrecv < o->g.nmsg)
                break;
            st = hc_ring_put(r, r->ep_next, NULL, 0, &o->next_recv, 0, 0,
                             IMM(IMM_AG, seq, 0, m));
            if (st != HCOLL_SUCCESS)
                return st;
            o->ag_next++;
            continue;
        }
        if (r->rank != o->root && !o->ag_done[m])
            break;
        size_t len = bytes - off < r->chunk_bytes ? bytes - off : r->chunk_bytes;
        st = hc_ring_put(r, r->ep_next, o->recv_mr, off, &o->next_recv, off, len,
                         IMM(IMM_AG, seq, 0, m));
        if (st != HCOLL_SUCCESS)
            return st;
        o->ag_next++;
    }
    while (!o->bcast && o->have_desc && o->ag_next < o->g.nmsg) {
        size_t m = o->ag_next, s = m / o->g.C, c = m % o->g.C;
        /* Step 0 sends the block my reduce-scatter finished (all-reduce),
         * or my own (all-gather alone). */
        const int ready = s > 0 ? o->ag_done[m - o->g.C]
                          : o->phase != HC_RING_PHASE_ALLREDUCE ||
                                o->rs_done[(size_t)(r->n - 2) * o->g.C + c];
        if (!ready)
            break;
        size_t off, cnt;
        hc_ring_chunk_of(&o->g, hc_ring_mod(r->n, (long)r->rank + 1 - (long)s + o->rot), c, &off,
                         &cnt);
        st = hc_ring_put(r, r->ep_next, o->recv_mr, off * o->esize, &o->next_recv,
                         off * o->esize, cnt * o->esize, IMM(IMM_AG, seq, 0, m));
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
    if (s >= o->g.nmsg || o->rs_done[s])
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                       "ring: unexpected gather message %zu from rank %d", s,
                                       hc_tp_rank(&r->p.tp, r->prev)));
    o->rs_done[s] = 1;
    if (++o->rs_nrecv < o->g.nmsg)
        return HCOLL_SUCCESS;
    /* Every vector was sent for this operation with these arguments. */
    const char *v = o->ghalf;
    const gather_trailer_t want = { r->seq, ring_op_sig(o->count, o->phase, o->dtype, o->op) };
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

hcoll_status_t hc_ring_on_rs(hc_ring_t *r, uint32_t imm)
{
    ring_op_t *o = &r->op;
    size_t m = IMM_MSG(imm);
    int slot = IMM_SLOT(imm);
    if (o->g.gather)
        return on_gather(r, m);
    /* An all-gather alone or a broadcast (which has no rs_done) takes no
     * reduce-scatter data: prev started another phase or collective (it
     * may be here before next's descriptor says so). */
    if (o->phase == HC_RING_PHASE_AG || o->bcast)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_MISMATCH,
                                       "ring: rank %d sent reduce-scatter data in operation %llu, "
                                       "which this rank runs as %s: every rank must call the "
                                       "same",
                                       hc_tp_rank(&r->p.tp, r->prev), (unsigned long long)r->seq,
                                       o->bcast ? "a broadcast" : "an all-gather"));
    /* A void notice, or data once the operation is void (ring_void.c). */
    if (IMM_IS_VOID(imm) || (o->voided && !o->gated))
        return hc_ring_void_on_rs(r, imm);
    if (m >= o->g.nmsg || o->rs_done[m] || slot >= r->nslots)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                       "ring: unexpected reduce-scatter message %zu slot %d "
                                       "from rank %d",
                                       m, slot, hc_tp_rank(&r->p.tp, r->prev)));
    size_t s = m / o->g.C, c = m % o->g.C, off, cnt;
    hc_ring_chunk_of(&o->g, hc_ring_mod(r->n, (long)r->rank - 1 - (long)s + o->rot), c, &off,
                     &cnt);
    /* One pass: partial from the chain ⊕ my own contribution → my output. */
    if (o->gated) {
        /* Its reduction waits on the GPU for this; the credit goes once it
         * ran (hc_ring_gated_poll). */
        if (slot != (int)(m % (size_t)r->nslots))
            return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r),
                                           HCOLL_ERR_NETWORK,
                                           "ring: gated message %zu landed in slot %d, not %d",
                                           m, slot, (int)(m % (size_t)r->nslots)));
        o->slot_landed[slot]++;
        o->gated->landed(o->gated->ctx, m);
        return HCOLL_SUCCESS;
    }
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
    return hc_ring_put(r, r->ep_prev, NULL, 0, NULL, 0, 0,
                       IMM(IMM_CREDIT, r->seq & 15, slot, m));
}

/* What an operation is, from its signature's phase and op (a broadcast's
 * op field is 0x80 | root). */
static const char *sig_name(int phase, int op)
{
    return phase == HC_RING_PHASE_RS   ? "reduce-scatter"
           : phase == HC_RING_PHASE_AG ? "all-gather"
           : (op & 0x80)               ? "broadcast"
                                       : "all-reduce";
}

hcoll_status_t hc_ring_on_desc(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    const uint32_t note = r->desc_void[r->seq & 15];
    r->desc_void[r->seq & 15] = 0;
    if (note) { /* next could not register its buffer: no key */
        hc_ring_void_learn(r, note);
        o->have_desc = 1;
        r->desc_seen[r->seq & 15] = 0;
        return HCOLL_SUCCESS;
    }
    ring_desc_t d;
    memcpy(&d, r->ctrl + (r->seq % DESC_SLOTS) * DESC_BYTES, sizeof d);
    if (d.seq != r->seq)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                       "ring: descriptor from rank %d is for operation %llu, "
                                       "expected %llu",
                                       hc_tp_rank(&r->p.tp, r->next), (unsigned long long)d.seq,
                                       (unsigned long long)r->seq));
    uint64_t mine = ring_op_sig(o->count, o->phase, o->dtype, o->op);
    if (d.sig != mine)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_MISMATCH,
                                       "ring: rank %d called operation %llu as %s with count "
                                       "%llu, dtype %s, op %s; this rank as %s with count %zu, "
                                       "dtype %s, op %s: every rank must pass the same",
                                       hc_tp_rank(&r->p.tp, r->next), (unsigned long long)r->seq,
                                       sig_name(RING_SIG_PHASE(d.sig), (int)(d.sig & 0xff)),
                                       RING_SIG_COUNT(d.sig),
                                       hcoll_dtype_name((hcoll_dtype_t)((d.sig >> 8) & 0xff)),
                                       hcoll_op_name((hcoll_op_t)(d.sig & 0xff)),
                                       sig_name(o->phase, o->op), o->count,
                                       hcoll_dtype_name(o->dtype), hcoll_op_name(o->op)));
    o->next_recv = d.recv_rkey;
    o->have_desc = 1;
    r->desc_seen[r->seq & 15] = 0;
    return HCOLL_SUCCESS;
}

/* A watched broadcast (hc_ring_bcast_start_watched): publish the bytes
 * that are in place with none missing before them. Not on the root, whose
 * only message is the chain's closing one (its bytes were all there). */
static void bcast_landed(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    if (r->rank == o->root)
        return;
    const size_t before = o->bc_prefix;
    while (o->bc_prefix < o->g.nmsg && o->ag_done[o->bc_prefix])
        o->bc_prefix++;
    if (o->bc_prefix == before)
        return;
    const size_t bytes = o->count * o->esize, got = o->bc_prefix * r->chunk_bytes;
    atomic_store_explicit(o->landed, got < bytes ? got : bytes, memory_order_release);
}

/* A broadcast run in the stage (ring_op.c): message m, landed there, into
 * the caller's buffer now, before the watcher hears of it. */
static void bcast_stage_out(hc_ring_t *r, size_t m)
{
    ring_op_t *o = &r->op;
    if (!o->user_recv || !o->bcast || r->rank == o->root) /* the root's closing message */
        return;
    const size_t bytes = o->count * o->esize, off = m * r->chunk_bytes;
    if (off < bytes)
        memcpy(o->user_recv + off, r->stage + off,
               bytes - off < r->chunk_bytes ? bytes - off : r->chunk_bytes);
}

hcoll_status_t hc_ring_on_comp(hc_ring_t *r, const hc_comp_t *c)
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
    if (kind == IMM_DESC) /* a void notice instead of a key, or none */
        r->desc_void[s4] = IMM_IS_VOID(imm) ? imm : 0;
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
            return hc_ring_on_rs(r, imm);
        case IMM_AG: {
            size_t m = IMM_MSG(imm);
            /* A void notice counts as one message (ring_void.c). */
            if (IMM_IS_VOID(imm) && r->op.phase != HC_RING_PHASE_RS &&
                r->op.ag_nrecv < r->op.g.nmsg) {
                hc_ring_void_learn(r, imm);
                r->op.ag_nrecv++;
                return HCOLL_SUCCESS;
            }
            /* A reduce-scatter alone takes no all-gather data. */
            if (m < r->op.g.nmsg && !r->op.ag_done[m] && r->op.phase != HC_RING_PHASE_RS) {
                r->op.ag_done[m] = 1;
                r->op.ag_nrecv++;
                bcast_stage_out(r, m);
                if (r->op.landed)
                    bcast_landed(r);
                return HCOLL_SUCCESS;
            }
            break;
        }
        case IMM_DESC:
            return hc_ring_on_desc(r);
        }
    }
    return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                   "ring: unexpected message (kind %d, operation %u mod 16, "
                                   "message %zu) from rank %d during operation %llu",
                                   kind, s4, IMM_MSG(imm), hc_tp_rank(&r->p.tp, c->peer),
                                   (unsigned long long)r->seq));
}
