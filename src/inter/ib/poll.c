/*
 * Completions and progress: what the CQs report becomes hc_comp_t.
 *
 *   ep CQ ──► recv WRITE_WITH_IMM ─► HC_COMP_IMM (held for the flush when
 *        │                            GPUDirect needs one and a device region
 *        │                            is registered) ─► repost receive
 *        └──► send completion ─► send FIFO head: put ─► HC_COMP_PUT
 *                                                credit write, flush read: internal
 *   flush QP CQ ──► read done ─► release the immediates it covers
 *
 * After each sweep the endpoint writes its credits back (send.c) and posts
 * the puts that waited for them.
 *
 * A wait (ib_poll with wait_ms) spins for HCOLL_IB_SPIN_US, then sleeps on
 * the completion channel of the endpoints' CQs:
 *
 *   drain old events ─► arm every CQ (ibv_req_notify_cq) ─► sweep again
 *     (a completion before the arming raises nothing) ─► ppoll(channel fd,
 *     up to 10 ms or the deadline) ─► sweep
 *
 * Puts waiting for credit words and flush reads in flight raise no event
 * on the channel: while there are any, the wait sweeps every 20 us instead. A peer that failed writes IB_CREDIT_RESET
 * into our credit word for it; the next sweep reports the failure.
 */
#include "inter/ib/ib_priv.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "base/clock.h"

const char *hc_ib_wc_status_text(int status, int roce)
{
    /* enum ibv_wc_status values: stable ABI since OFED 1.x. */
    switch (status) {
    case 0: return "success";
    case 1: return "local length error (a put larger than its local region)";
    case 2: return "local QP operation error";
    case 3: return "local EE context operation error";
    case 4: return "local protection error: the local buffer is not registered (or was freed)";
    case 5: return "work request flushed: the QP had already failed (see the first error)";
    case 6: return "memory window bind error";
    case 7: return "bad response from the peer";
    case 8: return "local access error";
    case 9: return "remote invalid request: the peer's QP rejected the operation";
    case 10:
        return "remote access error: the peer's region key or range is wrong (deregistered "
               "buffer, or a put past its end)";
    case 11: return "remote operation error at the peer";
    case 12:
        return roce ? "transport retry counter exceeded: peer unreachable over RoCE — check GID "
                      "index, traffic class/PFC and that both NICs reach each other"
                    : "transport retry counter exceeded: peer unreachable over InfiniBand — "
                      "check the subnet manager, the links and that the peer process is alive";
    case 13:
        return roce ? "receiver-not-ready retry exceeded: the peer posted no receive (is it "
                      "alive?) — on RoCE also check GID index, traffic class/PFC"
                    : "receiver-not-ready retry exceeded: the peer posted no receive (is it "
                      "alive and progressing?)";
    case 14: return "local RDD violation";
    case 15: return "remote invalid RD request";
    case 16: return "remote aborted";
    case 17: return "invalid EE context number";
    case 18: return "invalid EE context state";
    case 19: return "fatal error (the NIC or its driver failed)";
    case 20: return "response timeout";
    case 21: return "general error";
    default: return "unknown completion status";
    }
}

#if HCOLL_BUILD_VERBS

/* what: the work request, known from wr_id and the send FIFO, since an
 * error completion's opcode is undefined (ibv_poll_cq(3)). */
static hcoll_status_t wc_failed(hc_transport_t *tr, const char *what, int peer,
                                const struct ibv_wc *wc)
{
    hcoll_status_t st = wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_RNR_RETRY_EXC_ERR
                            ? HCOLL_ERR_PEER_FAILED
                            : HCOLL_ERR_RDMA;
    return ib_fail(tr, st, "%s rank %d failed: status %d, %s (vendor error 0x%x)", what,
                   hc_tp_rank(&tr->p, peer), (int)wc->status,
                   hc_ib_wc_status_text((int)wc->status, tr->roce), wc->vendor_err);
}

static int cq_push(hc_transport_t *tr, const hc_comp_t *c)
{
    return hc_compq_push(&tr->cq, c);
}

static hcoll_status_t flush_start(hc_transport_t *tr)
{
    if (tr->flush_inflight || !tr->nheld)
        return HCOLL_SUCCESS;
    int rc = ib_flush_post(tr); /* mr.c: reads of the landed buffers */
    if (rc != 0)
        return ib_fail(tr, HCOLL_ERR_RDMA, "posting the GPUDirect flush read failed: %s",
                       strerror(rc));
    tr->flush_inflight = 1;
    tr->nflushing = tr->nheld; /* these are covered by this read */
    return HCOLL_SUCCESS;
}

static hcoll_status_t flush_done(hc_transport_t *tr)
{
    ib_flush_release(tr);
    for (size_t i = 0; i < tr->nflushing; i++)
        if (cq_push(tr, &tr->held[i]) != 0)
            return ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
    memmove(tr->held, tr->held + tr->nflushing, (tr->nheld - tr->nflushing) * sizeof *tr->held);
    tr->nheld -= tr->nflushing;
    tr->nflushing = 0;
    tr->flush_inflight = 0;
    return flush_start(tr);
}

/* Can a NIC write have landed in device memory? Only into a device region
 * that is registered: a ring that moves host memory only (host calls, or
 * staging) has none, and its immediates need no flush read. The list is
 * short (live regions plus IB_MRC_IDLE) and looked at only when flushes
 * are on. */
static int device_regions(const hc_transport_t *tr)
{
    for (const hc_mrc_entry_t *e = tr->mrc.list; e; e = e->next)
        if (((const ib_mrent_t *)e)->device)
            return 1;
    return 0;
}

static hcoll_status_t deliver_imm(hc_transport_t *tr, const hc_comp_t *c)
{
    if (!(tr->flush && tr->flush_mr && (tr->nheld || device_regions(tr)))) {
        if (cq_push(tr, c) != 0)
            return ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
        return HCOLL_SUCCESS;
    }
    if (tr->nheld == tr->heldcap) {
        size_t ncap = tr->heldcap ? tr->heldcap * 2 : 64;
        hc_comp_t *n = realloc(tr->held, ncap * sizeof *n);
        if (!n)
            return ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
        tr->held = n;
        tr->heldcap = ncap;
    }
    tr->held[tr->nheld++] = *c;
    return HCOLL_SUCCESS;
}

/* Which of ep's QPs a completion is from (-1: none of them). */
static int wc_qp(const hc_ep_t *ep, const struct ibv_wc *wc)
{
    for (int q = 0; q < ep->nqp; q++)
        if (ep->q[q].qp->qp_num == wc->qp_num)
            return q;
    return -1;
}

/* One send completion of QP q: the head of its FIFO. */
static hcoll_status_t send_done(hc_ep_t *ep, int q)
{
    hc_transport_t *tr = ep->tr;
    ib_qpc_t *c = &ep->q[q];
    if (c->fcount == 0)
        return ib_fail(tr, HCOLL_ERR_INTERNAL, "send completion with nothing posted");
    ib_tx_t r = c->fifo[c->fhead];
    c->fhead = (c->fhead + 1) % IB_SQ_DEPTH;
    c->fcount--;
    ep->fcount--;
    if (r.kind == TX_PUT) {
        hc_comp_t comp = { HC_COMP_PUT, ep->peer, r.imm, r.wr_id };
        if (cq_push(tr, &comp) != 0)
            return ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for completions");
    }
    return HCOLL_SUCCESS;
}

static hcoll_status_t ep_progress(hc_ep_t *ep)
{
    hc_transport_t *tr = ep->tr;
    struct ibv_wc wc[32];
    /* What the last puts held goes first: one doorbell per QP. */
    hcoll_status_t st = ib_pend_flush(ep);
    if (st != HCOLL_SUCCESS)
        return st;
    int n = ibv_poll_cq(ep->cq, 32, wc);
    if (n < 0)
        return ib_fail(tr, HCOLL_ERR_RDMA, "ibv_poll_cq failed for rank %d",
                       hc_tp_rank(&tr->p, ep->peer));
    int reposts[IB_QPS_MAX] = { 0 };
    for (int i = 0; i < n; i++) {
        const int q = wc_qp(ep, &wc[i]);
        if (wc[i].status != IBV_WC_SUCCESS) {
            const char *what = wc[i].wr_id == (uintptr_t)ep ? "a receive from"
                               : q >= 0 && ep->q[q].fcount &&
                                       ep->q[q].fifo[ep->q[q].fhead].kind == TX_CREDIT
                                   ? "a credit update to"
                                   : "an RDMA write to";
            return wc_failed(tr, what, ep->peer, &wc[i]);
        }
        if (q < 0)
            return ib_fail(tr, HCOLL_ERR_INTERNAL, "completion of QP %u, not one to rank %d",
                           wc[i].qp_num, hc_tp_rank(&tr->p, ep->peer));
        if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            hc_comp_t c = { HC_COMP_IMM, ep->peer, ntohl(wc[i].imm_data), 0 };
            if ((st = deliver_imm(tr, &c)) != HCOLL_SUCCESS)
                return st;
            reposts[q]++;
            continue;
        }
        if (wc[i].opcode & IBV_WC_RECV)
            return ib_fail(tr, HCOLL_ERR_NETWORK, "unexpected receive (opcode %d) from rank %d",
                           (int)wc[i].opcode, hc_tp_rank(&tr->p, ep->peer));
        if ((st = send_done(ep, q)) != HCOLL_SUCCESS)
            return st;
    }
    for (int q = 0; q < ep->nqp; q++) {
        if (!reposts[q])
            continue;
        if (ib_post_recvs(ep, q, reposts[q]) != 0)
            return ib_fail(tr, HCOLL_ERR_RDMA, "reposting receives for rank %d failed",
                           hc_tp_rank(&tr->p, ep->peer));
        ep->q[q].reposted += (uint64_t)reposts[q];
    }
    st = ib_post_credit(ep);
    if (st == HCOLL_SUCCESS)
        st = ib_pend_flush(ep);
    return st;
}

hcoll_status_t ib_progress(hc_transport_t *tr)
{
    hcoll_status_t st = ib_async_poll(tr);
    if (st != HCOLL_SUCCESS)
        return st;
    for (int i = 0; i < tr->neps; i++) {
        if (tr->credits[IB_CREDIT_IDX(tr->eps[i]->peer, 0)] == IB_CREDIT_RESET)
            return ib_fail(tr, HCOLL_ERR_PEER_FAILED,
                           "rank %d reset its connection (it failed or aborted)",
                           hc_tp_rank(&tr->p, tr->eps[i]->peer));
        if ((st = ep_progress(tr->eps[i])) != HCOLL_SUCCESS)
            return st;
    }
    if (tr->loop_cq) {
        struct ibv_wc wc;
        int n = ibv_poll_cq(tr->loop_cq, 1, &wc);
        if (n < 0)
            return ib_fail(tr, HCOLL_ERR_RDMA, "ibv_poll_cq failed on the flush QP");
        if (n == 1) {
            if (wc.status != IBV_WC_SUCCESS)
                return wc_failed(tr, "the GPUDirect flush read on", tr->p.rank, &wc);
            if ((st = flush_done(tr)) != HCOLL_SUCCESS)
                return st;
        }
    }
    return flush_start(tr);
}

/* Sleep between sweeps once the spin is over, where the completion
 * channel cannot be used. The thread's timer slack (50 us by default)
 * would stretch every sleep to about 70 us against a NIC round trip of
 * 2-5 us; it is 1 ns for the sleep and restored after, since the caller's
 * thread may be the application's. */
#define IB_SLEEP_NS 20000
/* The longest sleep on the channel: what arrives without a completion (a
 * peer's credit words, its reset) is seen at least this often. */
#define IB_CHAN_MAX_MS 10.0

static void nap(void)
{
    const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > 1)
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    struct timespec ts = { 0, IB_SLEEP_NS };
    nanosleep(&ts, NULL);
    if (slack > 1)
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
}

/* Can a sleep on the channel miss the next thing to do? Puts waiting for
 * the peer's credit words (written without a completion) and flush reads
 * (their CQ is not on the channel) are only seen by sweeping. */
static int chan_ok(const hc_transport_t *tr)
{
    if (!tr->chan || tr->flush_inflight || tr->nheld)
        return 0;
    for (int i = 0; i < tr->neps; i++)
        if (tr->eps[i]->pcount)
            return 0;
    return 1;
}

/* Arm every endpoint's CQ, sweep once more (what completed before the
 * arming raises no event), then sleep on the channel's fd until an event,
 * the deadline or IB_CHAN_MAX_MS. Returns -1 when arming failed (the
 * caller naps instead). */
static int chan_sleep(hc_transport_t *tr, double deadline_ms, hcoll_status_t *st)
{
    ib_chan_drain(tr); /* old events: their completions were polled */
    for (int i = 0; i < tr->neps; i++)
        if (ibv_req_notify_cq(tr->eps[i]->cq, 0) != 0)
            return -1;
    *st = ib_progress(tr);
    if (*st != HCOLL_SUCCESS || tr->cq.count || !chan_ok(tr))
        return 0;
    double ms = deadline_ms - hc_now_ms();
    if (ms > IB_CHAN_MAX_MS)
        ms = IB_CHAN_MAX_MS;
    if (ms <= 0)
        return 0;
    struct pollfd pfd = { tr->chan->fd, POLLIN, 0 };
    const long us = (long)(ms * 1e3);
    struct timespec ts = { (time_t)(us / 1000000), (us % 1000000) * 1000 };
    ppoll(&pfd, 1, &ts, NULL);
    return 0;
}

static hcoll_status_t poll_sleep_wait(hc_transport_t *tr, double deadline_ms)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    int armable = 1;
    while (st == HCOLL_SUCCESS && tr->cq.count == 0 && hc_now_ms() < deadline_ms) {
        if (armable && chan_ok(tr)) {
            armable = chan_sleep(tr, deadline_ms, &st) == 0;
            if (st != HCOLL_SUCCESS || tr->cq.count)
                break;
        } else {
            nap();
        }
        st = ib_progress(tr);
    }
    return st;
}

hcoll_status_t ib_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms, int *n_out)
{
    *n_out = 0;
    if (tr->err)
        return tr->err;
    hcoll_status_t st = ib_progress(tr);
    if (st == HCOLL_SUCCESS && tr->cq.count == 0 && wait_ms > 0) {
        /* Spin first, as RDMA libraries do: a completion a few
         * microseconds away is seen within a sweep. Each sweep yields
         * the core, so that a reduction or a NIC emulation sharing it
         * is not starved. */
        const double deadline = hc_now_ms() + wait_ms;
        double spin_end = hc_now_ms() + tr->cfg.spin_us / 1e3;
        if (spin_end > deadline)
            spin_end = deadline;
        while (st == HCOLL_SUCCESS && tr->cq.count == 0 && hc_now_ms() < spin_end) {
            sched_yield();
            st = ib_progress(tr);
        }
        if (st == HCOLL_SUCCESS && tr->cq.count == 0)
            st = poll_sleep_wait(tr, deadline);
    }
    if (st != HCOLL_SUCCESS)
        return st;
    *n_out = hc_compq_pop(&tr->cq, comps, max);
    return HCOLL_SUCCESS;
}

#endif /* HCOLL_BUILD_VERBS */
