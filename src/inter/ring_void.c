/*
 * A void operation: a rank that cannot register its buffers when an
 * operation starts (a NIC that refuses device memory, the locked-memory
 * limit) still takes part, without them, so that no neighbour is left
 * waiting and the ring stays in step: every rank of the ring fails that
 * call, and the next one runs. Nothing needs an exchange beforehand
 * (device calls and HCOLL_CHECK_ARGS=0 have none).
 *
 *   rank f (failed)   descriptor to prev: a void notice instead of a key
 *                     every message it owes: an empty put whose message
 *                     field is the notice (void:1 | status:5 | f:16)
 *   any rank          the first notice it sees (in prev's messages or
 *                     next's descriptor) makes the operation void there:
 *                     every message it still owes leaves at once as a
 *                     notice (no data to wait for); nothing more reduced
 *   the end           the ordinary one (every message of both phases sent
 *                     and received, every credit back), then the error,
 *                     which is not sticky
 *
 * Every rank learns before it can finish. Reduce-scatter (and the
 * all-gather alone, alike): f+1 hears only notices from f; f+j sends its
 * step j only after prev's step j-1 reached it, a notice by induction; so
 * f+k gets prev's step k-1 <= N-2 as a notice. f-1 reads f's descriptor
 * before it sends any all-gather message. The broadcast chain: the ranks
 * after f learn, and the root through the closing message; those between
 * the root and f-1 hold the whole vector already and finish normally.
 *
 * Gated reductions (device all-reduce): message m lands in slot m % nslots,
 * in order per slot, so a notice is the slot's next message number; its
 * gate opens as for data (the GPU reduces what the slot holds: undefined),
 * and its credit goes once the GPU is past it, as always.
 */
#include "inter/ring_priv.h"

#include <stdio.h>

#include "base/log.h"

/* An empty put carrying imm, counted as the ring's puts are (here rather
 * than through ring.c, so that the calls go one way: ring.c ->
 * ring_void.c). */
static hcoll_status_t void_put(hc_ring_t *r, hc_ep_t *ep, uint32_t imm)
{
    hcoll_status_t st = r->ops->put(ep, NULL, 0, NULL, 0, 0, imm, 0);
    if (st != HCOLL_SUCCESS)
        return ring_fail(r, st);
    r->puts_out++;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_ring_void_self(hc_ring_t *r, hcoll_status_t st)
{
    ring_op_t *o = &r->op;
    o->voided = 1;
    o->void_self = 1;
    o->void_pos = r->rank;
    o->void_st = st;
    HC_WARN(HC_NET, RING_LOGRANK(r),
            "ring: operation %llu goes on without this rank's buffers (registration refused); "
            "every rank fails it",
            (unsigned long long)r->seq);
    return void_put(r, r->ep_prev, IMM(IMM_DESC, r->seq & 15, 0, IMM_VOID_MSG(st, r->rank)));
}

void hc_ring_void_learn(hc_ring_t *r, uint32_t imm)
{
    ring_op_t *o = &r->op;
    if (o->voided)
        return;
    o->voided = 1;
    o->void_pos = IMM_VOID_POS(imm);
    o->void_st = IMM_VOID_ST(imm);
    if (o->void_st == HCOLL_SUCCESS)
        o->void_st = HCOLL_ERR_RDMA;
}

hcoll_status_t hc_ring_void_send(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    const unsigned seq = (unsigned)(r->seq & 15);
    const uint32_t note = (uint32_t)IMM_VOID_MSG(o->void_st, o->void_pos);
    hcoll_status_t st;
    /* Reduce-scatter: each notice takes a slot of next's, as data would
     * (gated: slot m % nslots, so next knows m). */
    while (!o->bcast && o->rs_next < o->g.nmsg && r->nbusy < r->nslots) {
        int slot = 0;
        if (o->gated) {
            slot = (int)(o->rs_next % (size_t)r->nslots);
            if (r->slot_busy[slot])
                break;
        }
        while (r->slot_busy[slot])
            slot++;
        if ((st = void_put(r, r->ep_next, IMM(IMM_RS, seq, slot, note))) != HCOLL_SUCCESS)
            return st;
        r->slot_busy[slot] = 1;
        r->nbusy++;
        o->rs_next++;
    }
    /* All-gather or the chain: only once next has started (its
     * descriptor), as for data; the chain's closing message still waits
     * for everything to have come. */
    while (o->have_desc && o->ag_next < o->g.nmsg) {
        if (o->bcast && r->next == o->root && o->ag_nrecv < o->g.nmsg)
            break;
        if ((st = void_put(r, r->ep_next, IMM(IMM_AG, seq, 0, note))) != HCOLL_SUCCESS)
            return st;
        o->ag_next++;
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_ring_void_on_rs(hc_ring_t *r, uint32_t imm)
{
    ring_op_t *o = &r->op;
    const int slot = IMM_SLOT(imm);
    if (IMM_IS_VOID(imm))
        hc_ring_void_learn(r, imm);
    if (slot >= r->nslots)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                       "ring: void message in slot %d from rank %d", slot,
                                       hc_tp_rank(&r->p.tp, r->prev)));
    if (o->gated) {
        const size_t m = (size_t)slot + (size_t)r->nslots * o->slot_landed[slot];
        if (m >= o->g.nmsg)
            return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r),
                                           HCOLL_ERR_NETWORK,
                                           "ring: void message %zu in slot %d from rank %d "
                                           "past the operation's %zu",
                                           m, slot, hc_tp_rank(&r->p.tp, r->prev), o->g.nmsg));
        o->slot_landed[slot]++;
        o->gated->landed(o->gated->ctx, m);
        return HCOLL_SUCCESS;
    }
    if (o->rs_nrecv >= o->g.nmsg)
        return ring_fail(r, hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), HCOLL_ERR_NETWORK,
                                       "ring: one reduce-scatter message too many from rank %d "
                                       "in void operation %llu",
                                       hc_tp_rank(&r->p.tp, r->prev), (unsigned long long)r->seq));
    o->rs_nrecv++;
    return void_put(r, r->ep_prev, IMM(IMM_CREDIT, r->seq & 15, slot, 0));
}

hcoll_status_t hc_ring_void_end(hc_ring_t *r)
{
    ring_op_t *o = &r->op;
    r->nvoid++;
    /* A watcher of the chain's bytes (the broadcast's all-gather) must not
     * wait for bytes that will never come: it is a failed call. */
    if (o->landed)
        atomic_store_explicit(o->landed, o->count * o->esize, memory_order_release);
    r->void_rank = o->void_pos == 0xffff ? -1 : hc_tp_rank(&r->p.tp, o->void_pos);
    if (o->void_self)
        return o->void_st; /* recorded by the registration */
    char who[32];
    if (r->void_rank < 0)
        snprintf(who, sizeof who, "a rank");
    else
        snprintf(who, sizeof who, "rank %d", r->void_rank);
    return hc_err_set(RING_ERRBUF(r), HC_NET, RING_LOGRANK(r), o->void_st,
                      "ring: %s could not take part in operation %llu: registering its buffers "
                      "failed there (%s; its own message says why); every rank of the ring fails "
                      "this call, its result is undefined, and the next call runs",
                      who, (unsigned long long)r->seq, hcoll_status_name(o->void_st));
}

uint64_t hc_ring_voided(const hc_ring_t *r)
{
    return r ? r->nvoid : 0;
}

int hc_ring_void_rank(const hc_ring_t *r)
{
    return r && r->nvoid ? r->void_rank : -1;
}

hcoll_status_t hc_ring_error(const hc_ring_t *r)
{
    return r ? r->err : HCOLL_SUCCESS;
}
