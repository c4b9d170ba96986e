/*
 * Queue pairs: HCOLL_IB_QPS_PER_PEER RC QPs (sharing one CQ) per peer,
 * moved through
 *
 *   RESET ──create──► INIT ──(peer's LID/GID, QPN, PSN, MTU)──► RTR ──► RTS
 *
 * and the connection set-up that feeds RTR. Address exchange (connect's
 * allgather): one fixed-size blob per rank, a header (LID, GID, GID
 * index, MTU, PSN, credit region, QPs per peer) then the QPNs this rank
 * created for each other rank (IB_QPS_MAX slots each). Two ranks whose
 * counts differ use the smaller; the rest stay in INIT, unused. A second
 * allgather after RTR is a barrier, so nobody sends into a QP that is not
 * yet ready to receive.
 */
#include "inter/ib/ib_priv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

int hc_ib_mtu_min(int a, int b)
{
    return a < b ? a : b;
}

int hc_ib_mtu_bytes(int mtu_enum)
{
    return mtu_enum >= 1 && mtu_enum <= 5 ? 128 << mtu_enum : 0;
}

#if HCOLL_BUILD_VERBS

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

int ib_qp_connect(hc_transport_t *tr, struct ibv_qp *qp, const ib_addr_t *peer, uint32_t rqpn,
                  int *mtu_out)
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

/* The completion channel of the endpoints' CQs, made on first use (NULL
 * when libibverbs has none or it cannot be made: waits then sleep in
 * steps). */
static struct ibv_comp_channel *ib_chan_get(hc_transport_t *tr)
{
    if (tr->chan || !tr->v->create_comp_channel || !tr->v->get_cq_event ||
        !tr->v->ack_cq_events || !tr->v->destroy_comp_channel)
        return tr->chan;
    struct ibv_comp_channel *ch = tr->v->create_comp_channel(tr->ctx);
    if (!ch)
        return NULL;
    /* Events are taken without blocking: a wait polls the fd itself. */
    int fl = fcntl(ch->fd, F_GETFL);
    if (fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        tr->v->destroy_comp_channel(ch);
        return NULL;
    }
    return tr->chan = ch;
}

void ib_chan_drain(hc_transport_t *tr)
{
    struct ibv_cq *cq;
    void *ctx;
    while (tr->chan && tr->v->get_cq_event(tr->chan, &cq, &ctx) == 0)
        tr->v->ack_cq_events(cq, 1);
}

void ib_chan_free(hc_transport_t *tr)
{
    if (!tr->chan)
        return;
    ib_chan_drain(tr);
    tr->v->destroy_comp_channel(tr->chan);
    tr->chan = NULL;
}

/* chan: the transport's completion channel, or NULL. */
static struct ibv_cq *cq_create(hc_transport_t *tr, int nqp, struct ibv_comp_channel *chan)
{
    return tr->v->create_cq(tr->ctx, IB_CQ_DEPTH * nqp, NULL, chan, 0);
}

/* An RC QP on cq (send and receive), in INIT; NULL with errno set. */
static struct ibv_qp *qp_make(hc_transport_t *tr, struct ibv_cq *cq)
{
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
    if (qp && qp_to_init(tr, qp) != 0) {
        tr->v->destroy_qp(qp);
        qp = NULL;
    }
    return qp;
}

int ib_qp_create(hc_transport_t *tr, struct ibv_cq **cq_out, struct ibv_qp **qp_out)
{
    struct ibv_cq *cq = cq_create(tr, 1, NULL);
    if (!cq)
        return -1;
    struct ibv_qp *qp = qp_make(tr, cq);
    if (!qp) {
        tr->v->destroy_cq(cq);
        return -1;
    }
    *cq_out = cq;
    *qp_out = qp;
    return 0;
}

int ib_post_recvs(hc_ep_t *ep, int q, int n)
{
    for (int i = 0; i < n; i++) {
        struct ibv_recv_wr wr, *bad;
        memset(&wr, 0, sizeof wr);
        wr.wr_id = (uintptr_t)ep;
        if (ibv_post_recv(ep->q[q].qp, &wr, &bad) != 0)
            return -1;
    }
    return 0;
}

void ib_ep_free(hc_transport_t *tr, hc_ep_t *ep)
{
    if (!ep)
        return;
    for (int q = 0; q < IB_QPS_MAX; q++)
        if (ep->q[q].qp)
            tr->v->destroy_qp(ep->q[q].qp);
    /* No completion can come now: the CQ's events are all taken (and
     * acknowledged) before it goes. */
    if (ep->cq && ep->cq->channel)
        ib_chan_drain(tr);
    if (ep->cq)
        tr->v->destroy_cq(ep->cq);
    free(ep->pend);
    free(ep);
}

/* ---- connection set-up ------------------------------------------------------ */

/* This rank's header of the address blob. */
static void addr_fill(const hc_transport_t *tr, ib_addr_t *a)
{
    a->magic = IB_ADDR_MAGIC;
    a->rank = (uint32_t)tr->p.rank;
    a->nranks = (uint32_t)tr->p.nranks;
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
    a->nqp = (uint8_t)tr->cfg.qps_per_peer;
}

/* An endpoint in INIT with its receives posted; its QPNs go to
 * qpns[p * IB_QPS_MAX + q]. */
static hcoll_status_t ep_create(hc_transport_t *tr, int p, uint32_t *qpns, hc_ep_t **ep_out)
{
    if (p < 0 || p >= tr->p.nranks || p == tr->p.rank)
        return ib_fail(tr, HCOLL_ERR_INVALID_ARG, "connect: bad peer %d", p);
    hc_ep_t *ep = calloc(1, sizeof *ep);
    if (!ep)
        return ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
    *ep_out = ep; /* the caller frees it, whatever happens below */
    ep->tr = tr;
    ep->peer = p;
    ep->nqp = tr->cfg.qps_per_peer;
    if (!(ep->cq = cq_create(tr, ep->nqp, ib_chan_get(tr))))
        return ib_fail(tr, HCOLL_ERR_RDMA, "creating the CQ for rank %d failed (errno %d)",
                       hc_tp_rank(&tr->p, p), errno);
    for (int q = 0; q < ep->nqp; q++) {
        if (!(ep->q[q].qp = qp_make(tr, ep->cq)))
            return ib_fail(tr, HCOLL_ERR_RDMA,
                           "creating RC QP %d of %d for rank %d failed (errno %d)", q + 1,
                           ep->nqp, hc_tp_rank(&tr->p, p), errno);
        if (ib_post_recvs(ep, q, IB_RQ_DEPTH) != 0)
            return ib_fail(tr, HCOLL_ERR_RDMA, "posting receives for rank %d failed",
                           hc_tp_rank(&tr->p, p));
        qpns[(size_t)p * IB_QPS_MAX + (size_t)q] = ep->q[q].qp->qp_num;
    }
    return HCOLL_SUCCESS;
}

/* RTR/RTS towards the peer whose blob is pa (its QPNs follow it). */
static hcoll_status_t ep_connect(hc_transport_t *tr, hc_ep_t *ep, const ib_addr_t *pa)
{
    const int me = tr->p.rank, peer = ep->peer;
    const uint32_t *pq =
        (const uint32_t *)((const char *)pa + sizeof *pa) + (size_t)me * IB_QPS_MAX;
    if (pa->magic != IB_ADDR_MAGIC || pa->rank != (uint32_t)peer ||
        pa->nranks != (uint32_t)tr->p.nranks)
        return ib_fail(tr, HCOLL_ERR_MISMATCH,
                       "rank %d published no verbs address (is it using HCOLL_NET=tcp?)",
                       hc_tp_rank(&tr->p, peer));
    if (pa->nqp < 1 || pa->nqp > IB_QPS_MAX || pq[0] == 0)
        return ib_fail(tr, HCOLL_ERR_MISMATCH, "rank %d created no queue pair for rank %d",
                       hc_tp_rank(&tr->p, peer), tr->p.log_rank);
    if (pa->link_layer != tr->pattr.link_layer)
        return ib_fail(tr, HCOLL_ERR_RDMA,
                       "rank %d's NIC is %s, this one is %s: they cannot talk RC",
                       hc_tp_rank(&tr->p, peer),
                       pa->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                       tr->roce ? "RoCE" : "InfiniBand");
    if (pa->nqp < ep->nqp)
        ep->nqp = pa->nqp; /* the others stay in INIT, unused */
    int mtu = 0;
    for (int q = 0; q < ep->nqp; q++) {
        if (ib_qp_connect(tr, ep->q[q].qp, pa, pq[q], &mtu) == 0) {
            ep->q[q].rqpn = pq[q];
            continue;
        }
        char g[64];
        hc_gid_format(pa->gid, g, sizeof g);
        return ib_fail(tr, HCOLL_ERR_RDMA,
                       "moving the QP to rank %d to RTR/RTS failed (errno %d: %s); remote "
                       "QPN %u LID %u GID %s, local GID index %d, TC %d, SL %d",
                       hc_tp_rank(&tr->p, peer), errno, strerror(errno), pq[q], pa->lid, g,
                       tr->choice.gid_index, tr->cfg.tc, tr->cfg.sl);
    }
    ep->peer_credit_addr = pa->credit_addr + IB_CREDIT_IDX(me, 0) * sizeof(uint64_t);
    ep->peer_credit_rkey = pa->credit_rkey;
    HC_INFO(HC_NET, tr->p.log_rank,
            "NET/IB: rank %d -> rank %d via %s:%d/%s%s QPN %u -> %u (%d QP%s), MTU %d",
            tr->p.log_rank, hc_tp_rank(&tr->p, peer), tr->choice.port.dev, tr->choice.port.port,
            tr->roce ? "RoCE" : "IB", tr->gdr ? "/GDRDMA" : "", ep->q[0].qp->qp_num, pq[0],
            ep->nqp, ep->nqp > 1 ? "s" : "", mtu);
    return HCOLL_SUCCESS;
}

/* Every QP is ready to receive before anyone sends. */
static hcoll_status_t ready_barrier(hc_transport_t *tr, hc_allgather_fn allgather, void *ag_ctx)
{
    uint64_t tag = IB_ADDR_MAGIC, *tags = calloc((size_t)tr->p.nranks, sizeof *tags);
    if (!tags)
        return ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
    hcoll_status_t st = allgather(ag_ctx, &tag, tags, sizeof tag);
    free(tags);
    return st;
}

hcoll_status_t ib_connect(hc_transport_t *tr, const int *peers, int npeers,
                          hc_allgather_fn allgather, void *ag_ctx, hc_ep_t **eps_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const int n = tr->p.nranks;
    const size_t blen = sizeof(ib_addr_t) + (size_t)n * IB_QPS_MAX * sizeof(uint32_t);
    char *mine = calloc(1, blen), *all = calloc((size_t)n, blen);
    hc_ep_t **eps = calloc((size_t)(npeers > 0 ? npeers : 1), sizeof *eps);
    if (!mine || !all || !eps) {
        st = ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto clean_bufs;
    }
    addr_fill(tr, (ib_addr_t *)mine);
    uint32_t *qpns = (uint32_t *)(mine + sizeof(ib_addr_t));
    for (int i = 0; i < npeers; i++)
        HC_CHECK(ep_create(tr, peers[i], qpns, &eps[i]), clean_eps);
    HC_CHECK(allgather(ag_ctx, mine, all, blen), clean_eps);
    for (int i = 0; i < npeers; i++)
        HC_CHECK(ep_connect(tr, eps[i], (const ib_addr_t *)(all + (size_t)peers[i] * blen)),
                 clean_eps);
    HC_CHECK(ready_barrier(tr, allgather, ag_ctx), clean_eps);
    hc_ep_t **grown = realloc(tr->eps, (size_t)(tr->neps + npeers) * sizeof *grown);
    if (!grown) {
        st = ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory connecting");
        goto clean_eps;
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

clean_eps:
    for (int i = 0; i < npeers; i++)
        ib_ep_free(tr, eps[i]);
clean_bufs:
    free(eps);
    free(all);
    free(mine);
    return st;
}

#endif /* HCOLL_BUILD_VERBS */
