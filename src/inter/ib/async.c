/*
 * The NIC's asynchronous events: what completions cannot say. A port that
 * went down, a QP the NIC killed, a responder access error, a CQ that
 * overran (its lost completions never show) reach the application only
 * through the context's async fd. Progress reads it without blocking
 * (every 64th sweep: ib_async_poll), and ib_fail reads it before recording
 * any failure (ib_async_drain), so that the error names the cause. Each
 * event is acknowledged at once (destroying a QP or CQ waits for its
 * events' acknowledgements).
 */
#include "inter/ib/ib_priv.h"

#include <string.h>

#include "base/log.h"

#if HCOLL_BUILD_VERBS

/* Which of our QPs or CQs an event names, for the message. */
static void async_whose(const hc_transport_t *tr, const struct ibv_async_event *ev, char *who,
                        size_t len)
{
    snprintf(who, len, "a QP of ours");
    if (tr->loop_qp && (ev->element.qp == tr->loop_qp || ev->element.cq == tr->loop_cq))
        snprintf(who, len, "the GPUDirect flush QP");
    for (int i = 0; i < tr->neps; i++)
        if (ib_ep_qp_index(tr->eps[i], ev->element.qp) >= 0 || ev->element.cq == tr->eps[i]->cq)
            snprintf(who, len, "the QP to rank %d", hc_tp_rank(&tr->p, tr->eps[i]->peer));
}

/* Name the event; 1 when the transport cannot go on after it. */
static int async_describe(const hc_transport_t *tr, const struct ibv_async_event *ev, char *out,
                          size_t len)
{
    char who[64];
    async_whose(tr, ev, who, sizeof who);
    const int port = ev->element.port_num;
    switch (ev->event_type) {
    case IBV_EVENT_CQ_ERR:
        snprintf(out, len, "completion queue of %s overran, completions were lost "
                 "(IBV_EVENT_CQ_ERR)", who);
        return 1;
    case IBV_EVENT_QP_FATAL:
        snprintf(out, len, "%s hit a fatal error (IBV_EVENT_QP_FATAL)", who);
        return 1;
    case IBV_EVENT_QP_REQ_ERR:
        snprintf(out, len, "%s received an invalid request (IBV_EVENT_QP_REQ_ERR)", who);
        return 1;
    case IBV_EVENT_QP_ACCESS_ERR:
        snprintf(out, len, "responder access error on %s (IBV_EVENT_QP_ACCESS_ERR): a put hit a "
                 "region that is not registered, deregistered or too small", who);
        return 1;
    case IBV_EVENT_PATH_MIG_ERR:
        snprintf(out, len, "path migration failed on %s (IBV_EVENT_PATH_MIG_ERR)", who);
        return 1;
    case IBV_EVENT_DEVICE_FATAL:
        snprintf(out, len, "%s failed (IBV_EVENT_DEVICE_FATAL): the NIC or its driver needs a "
                 "reset", tr->choice.port.dev);
        return 1;
    case IBV_EVENT_PORT_ERR:
        snprintf(out, len, "%s port %d went down (IBV_EVENT_PORT_ERR): check the link, cable "
                 "and switch port", tr->choice.port.dev, port);
        return port == tr->choice.port.port;
    case IBV_EVENT_GID_CHANGE:
        snprintf(out, len, "the GID table of %s port %d changed (IBV_EVENT_GID_CHANGE): an "
                 "address was added or removed on the interface; connections using a removed "
                 "GID fail", tr->choice.port.dev, port);
        return 0;
    default:
        snprintf(out, len, "async event %d on %s port %d", (int)ev->event_type,
                 tr->choice.port.dev, port);
        return 0;
    }
}

void ib_async_drain(hc_transport_t *tr)
{
    if (!tr->async_ok)
        return;
    struct ibv_async_event ev;
    while (tr->v->get_async_event(tr->ctx, &ev) == 0) {
        char what[240];
        int fatal = async_describe(tr, &ev, what, sizeof what);
        tr->v->ack_async_event(&ev);
        if (fatal && !tr->async_why[0])
            snprintf(tr->async_why, sizeof tr->async_why, "%s", what);
        else if (ev.event_type == IBV_EVENT_GID_CHANGE || ev.event_type == IBV_EVENT_PORT_ERR)
            HC_WARN(HC_NET, tr->p.log_rank, "NET/IB: %s", what);
        else
            HC_INFO(HC_NET, tr->p.log_rank, "NET/IB: %s", what);
    }
}

hcoll_status_t ib_async_poll(hc_transport_t *tr)
{
    if ((++tr->async_sweeps & 63) != 1)
        return HCOLL_SUCCESS;
    ib_async_drain(tr);
    if (tr->async_why[0])
        return ib_fail(tr, HCOLL_ERR_RDMA, "asynchronous error");
    return HCOLL_SUCCESS;
}

#endif /* HCOLL_BUILD_VERBS */
