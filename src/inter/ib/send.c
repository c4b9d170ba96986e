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
 * Send queue: every WR is signaled and one QP's send completions come in
 * posting order, so a FIFO per endpoint says what each completion was (a
 * user put, a credit write, a flush read).
 */
#include "inter/ib/ib_priv.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#if HCOLL_BUILD_VERBS

static int fifo_push(hc_ep_t *ep, int kind, uint64_t wr_id, uint32_t imm)
{
    if (ep->fcount == IB_SQ_DEPTH)
        return -1;
    ib_tx_t *r = &ep->fifo[(ep->fhead + ep->fcount) % IB_SQ_DEPTH];
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

static hcoll_status_t post_put(hc_ep_t *ep, const ib_pend_t *pp)
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
    /* Small puts (descriptors, gathered vectors' tails, credits of the
     * ring) go inline: the NIC takes the bytes with the WQE instead of a
     * second DMA read of host memory, a PCIe round trip saved. The bytes
     * are copied at posting, which only makes the source free sooner. */
    if (pp->len && pp->len <= IB_INLINE && !pp->lmr->ent->device)
        wr.send_flags |= IBV_SEND_INLINE;
    wr.imm_data = htonl(pp->imm);
    if (pp->has_rkey) {
        wr.wr.rdma.remote_addr = pp->rkey.w[0] + pp->roff;
        wr.wr.rdma.rkey = (uint32_t)pp->rkey.w[1];
    }
    int rc = ibv_post_send(ep->qp, &wr, &bad);
    if (rc != 0)
        return ib_fail(tr, HCOLL_ERR_RDMA, "ibv_post_send of a %zu-byte put to rank %d failed: %s",
                       pp->len, hc_tp_rank(&tr->p, ep->peer), strerror(rc));
    fifo_push(ep, TX_PUT, pp->wr_id, pp->imm);
    ep->imm_sent++;
    return HCOLL_SUCCESS;
}

/* Inline: val may die once this returns; recorded in the send FIFO. */
int ib_credit_write(hc_ep_t *ep, uint64_t val)
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

hcoll_status_t ib_post_credit(hc_ep_t *ep)
{
    if (ep->reposted - ep->reported < IB_RQ_DEPTH / 4 || ep->fcount >= IB_SQ_DEPTH)
        return HCOLL_SUCCESS;
    uint64_t val = ep->reposted;
    int rc = ib_credit_write(ep, val);
    if (rc != 0)
        return ib_fail(ep->tr, HCOLL_ERR_RDMA, "posting a credit update to rank %d failed: %s",
                       hc_tp_rank(&ep->tr->p, ep->peer), strerror(rc));
    ep->reported = val;
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
    while (ep->pcount && can_post_put(ep)) {
        hcoll_status_t st = post_put(ep, &ep->pend[ep->phead]);
        if (st != HCOLL_SUCCESS)
            return st;
        ep->phead = (ep->phead + 1) % ep->pcap;
        ep->pcount--;
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
    if (ep->pcount || !can_post_put(ep))
        return pend_push(ep, &pp);
    return post_put(ep, &pp);
}

#endif /* HCOLL_BUILD_VERBS */
