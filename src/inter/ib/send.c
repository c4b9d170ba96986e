/*
 * The sending side of an endpoint: puts, receive credits and the send FIFO.
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
 * RQ_DEPTH receives posted per QP and reposts one per receive completion
 * (poll.c); it tells the sender how many it has reposted in total by
 * writing that count into the sender's credit word (a plain RDMA write,
 * which consumes no receive). The sender posts a put only while
 *   imm_sent < RQ_DEPTH + peer's reposted count,
 * and queues it locally otherwise, so the target never answers RNR. The
 * ring's staging-slot credits (zero-byte puts) sit on top of this and are
 * ordinary puts here.
 *
 * Puts of at most IB_INLINE bytes from host memory are posted inline.
 *
 * QPs per peer (HCOLL_IB_QPS_PER_PEER, 1-4, as NCCL_IB_QPS_PER_CONNECTION):
 * puts go round robin over the peer's QPs, so that a LAG or an ECMP fabric
 * spreads them over its links (each QP is one flow). Receive credits,
 * credit words and the send FIFO are per QP; the puts of one endpoint were
 * never ordered (transport.h), so nothing above notices.
 *
 * Doorbells: a put of more than IB_INLINE bytes is held until the next
 * poll (or until IB_CHAIN are held), which posts what is held as one
 * chain of work requests per QP: one ibv_post_send, one MMIO write to the
 * NIC, for the chunks the ring sends together. Small puts (inline, the
 * ring's credits and descriptors) go at once, and take what is held with
 * them. Like TCP's, a put is thus under way once its caller polls, which
 * every user of the seam does to see it complete.
 *
 * Send queue: every WR is signaled and one QP's send completions come in
 * posting order, so a FIFO per QP says what each completion was (a user
 * put, a credit write, a flush read).
 */
#include "inter/ib/ib_priv.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#if HCOLL_BUILD_VERBS

static int fifo_push(hc_ep_t *ep, int q, int kind, uint64_t wr_id, uint32_t imm)
{
    ib_qpc_t *c = &ep->q[q];
    if (c->fcount == IB_SQ_DEPTH)
        return -1;
    ib_tx_t *r = &c->fifo[(c->fhead + c->fcount) % IB_SQ_DEPTH];
    r->kind = kind;
    r->wr_id = wr_id;
    r->imm = imm;
    c->fcount++;
    ep->fcount++;
    return 0;
}

/* How many more puts QP q may take now: send slots and receive credits. */
static size_t qp_room(const hc_ep_t *ep, int q)
{
    const ib_qpc_t *c = &ep->q[q];
    const uint64_t credits = IB_RQ_DEPTH + ep->tr->credits[IB_CREDIT_IDX(ep->peer, q)];
    size_t slots = c->fcount < IB_SQ_DEPTH - IB_SQ_RESERVE
                       ? (size_t)(IB_SQ_DEPTH - IB_SQ_RESERVE - c->fcount)
                       : 0;
    size_t cred = c->imm_sent < credits ? (size_t)(credits - c->imm_sent) : 0;
    return slots < cred ? slots : cred;
}

/* The work request of one put (sge: its storage). */
static void put_wr(const ib_pend_t *pp, struct ibv_send_wr *wr, struct ibv_sge *sge)
{
    memset(wr, 0, sizeof *wr);
    if (pp->len) {
        sge->addr = (uintptr_t)pp->lmr->base + pp->loff;
        sge->length = (uint32_t)pp->len;
        sge->lkey = pp->lmr->ent->mr->lkey;
        wr->sg_list = sge;
        wr->num_sge = 1;
    }
    wr->wr_id = TX_PUT;
    wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr->send_flags = IBV_SEND_SIGNALED;
    /* Small puts (descriptors, gathered vectors' tails, credits of the
     * ring) go inline: the NIC takes the bytes with the WQE instead of a
     * second DMA read of host memory, a PCIe round trip saved. The bytes
     * are copied at posting, which only makes the source free sooner. */
    if (pp->len && pp->len <= IB_INLINE && !pp->lmr->ent->device)
        wr->send_flags |= IBV_SEND_INLINE;
    wr->imm_data = htonl(pp->imm);
    if (pp->has_rkey) {
        wr->wr.rdma.remote_addr = pp->rkey.w[0] + pp->roff;
        wr->wr.rdma.rkey = (uint32_t)pp->rkey.w[1];
    }
}

/* Post the chain wr[first], linked through next, on QP q; the puts pp[i]
 * it holds are accounted for up to a failed one. */
static hcoll_status_t post_chain(hc_ep_t *ep, int q, struct ibv_send_wr *wr, int first,
                                 const int *qof, int n, const ib_pend_t *const *pp)
{
    hc_transport_t *tr = ep->tr;
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(ep->q[q].qp, &wr[first], &bad);
    for (int i = first; i < n; i++) {
        if (qof[i] != q)
            continue;
        if (rc != 0 && bad == &wr[i])
            return ib_fail(tr, HCOLL_ERR_RDMA,
                           "ibv_post_send of a %zu-byte put to rank %d failed: %s", pp[i]->len,
                           hc_tp_rank(&tr->p, ep->peer), strerror(rc));
        fifo_push(ep, q, TX_PUT, pp[i]->wr_id, pp[i]->imm);
        ep->q[q].imm_sent++;
    }
    if (rc != 0)
        return ib_fail(tr, HCOLL_ERR_RDMA, "ibv_post_send of a put chain to rank %d failed: %s",
                       hc_tp_rank(&tr->p, ep->peer), strerror(rc));
    return HCOLL_SUCCESS;
}

/* Up to IB_CHAIN queued puts, round robin over the QPs that have room,
 * one chain (one doorbell) per QP. *posted_out: how many left the queue
 * (all that were taken, unless a post failed). */
static hcoll_status_t post_round(hc_ep_t *ep, size_t *posted_out)
{
    struct ibv_sge sge[IB_CHAIN];
    struct ibv_send_wr wr[IB_CHAIN];
    const ib_pend_t *pp[IB_CHAIN];
    int qof[IB_CHAIN], first[IB_QPS_MAX], last[IB_QPS_MAX];
    size_t room[IB_QPS_MAX];
    for (int q = 0; q < ep->nqp; q++) {
        room[q] = qp_room(ep, q);
        first[q] = last[q] = -1;
    }
    int n = 0;
    while ((size_t)n < ep->pcount && n < IB_CHAIN) {
        int q = -1;
        for (int k = 0; k < ep->nqp && q < 0; k++)
            if (room[(ep->rr + k) % ep->nqp])
                q = (ep->rr + k) % ep->nqp;
        if (q < 0)
            break;
        ep->rr = (q + 1) % ep->nqp;
        room[q]--;
        pp[n] = &ep->pend[(ep->phead + (size_t)n) % ep->pcap];
        put_wr(pp[n], &wr[n], &sge[n]);
        qof[n] = q;
        if (last[q] >= 0)
            wr[last[q]].next = &wr[n];
        else
            first[q] = n;
        last[q] = n++;
    }
    *posted_out = (size_t)n;
    for (int q = 0; q < ep->nqp; q++) {
        if (first[q] < 0)
            continue;
        hcoll_status_t st = post_chain(ep, q, wr, first[q], qof, n, pp);
        if (st != HCOLL_SUCCESS)
            return st;
    }
    return HCOLL_SUCCESS;
}

/* Inline: val may die once this returns; recorded in QP q's send FIFO. */
int ib_credit_write(hc_ep_t *ep, int q, uint64_t val)
{
    struct ibv_sge sge = { (uintptr_t)&val, sizeof val, 0 };
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = TX_CREDIT;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = ep->peer_credit_addr + (uint64_t)q * sizeof(uint64_t);
    wr.wr.rdma.rkey = ep->peer_credit_rkey;
    int rc = ibv_post_send(ep->q[q].qp, &wr, &bad);
    if (rc == 0)
        fifo_push(ep, q, TX_CREDIT, 0, 0);
    return rc;
}

hcoll_status_t ib_post_credit(hc_ep_t *ep)
{
    for (int q = 0; q < ep->nqp; q++) {
        ib_qpc_t *c = &ep->q[q];
        if (c->reposted - c->reported < IB_RQ_DEPTH / 4 || c->fcount >= IB_SQ_DEPTH)
            continue;
        uint64_t val = c->reposted;
        int rc = ib_credit_write(ep, q, val);
        if (rc != 0)
            return ib_fail(ep->tr, HCOLL_ERR_RDMA, "posting a credit update to rank %d failed: %s",
                           hc_tp_rank(&ep->tr->p, ep->peer), strerror(rc));
        c->reported = val;
    }
    return HCOLL_SUCCESS;
}

static hcoll_status_t pend_push(hc_ep_t *ep, const ib_pend_t *pp)
{
    if (ep->pcount == ep->pcap) {
        size_t ncap = ep->pcap ? ep->pcap * 2 : 64;
        ib_pend_t *n = malloc(ncap * sizeof *n);
        if (!n)
            return ib_fail(ep->tr, HCOLL_ERR_NO_MEMORY, "out of memory queueing a put");
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

hcoll_status_t ib_pend_flush(hc_ep_t *ep)
{
    while (ep->pcount) {
        size_t posted = 0;
        hcoll_status_t st = post_round(ep, &posted);
        ep->phead = (ep->phead + posted) % ep->pcap;
        ep->pcount -= posted;
        if (st != HCOLL_SUCCESS || posted == 0)
            return st;
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t ib_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                      uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id)
{
    hc_transport_t *tr = ep->tr;
    if (tr->err)
        return tr->err;
    if (len && (!lmr || loff > lmr->len || len > lmr->len - loff || len > UINT32_MAX))
        return ib_fail(tr, HCOLL_ERR_INTERNAL,
                       "put to rank %d: local range %zu+%zu outside its region (%zu bytes)",
                       hc_tp_rank(&tr->p, ep->peer), loff, len, lmr ? lmr->len : 0);
    ib_pend_t pp = { lmr, loff, len, { { 0, 0 } }, rkey != NULL, roff, imm, wr_id };
    if (rkey)
        pp.rkey = *rkey;
    /* Queued puts go first: the order of posting stays the order of calls. */
    hcoll_status_t st = pend_push(ep, &pp);
    if (st != HCOLL_SUCCESS)
        return st;
    /* A small put goes now (an inline one's bytes are taken at posting),
     * ringing the doorbell for what is held; so does a full chain. */
    if (len <= IB_INLINE || ep->pcount >= IB_CHAIN)
        return ib_pend_flush(ep);
    return HCOLL_SUCCESS;
}

#endif /* HCOLL_BUILD_VERBS */
