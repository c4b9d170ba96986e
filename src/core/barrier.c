/*
 * The barrier: an intra-node step, then a dissemination barrier across
 * nodes among the nodes' local rank 0 (inter/dissem.h), then a second
 * intra-node step that lets the node's other ranks go.
 *
 *   node A            node B            node C
 *   r0 r1             r0 r1             r0 r1
 *   └intra barrier┘   └intra barrier┘   └intra barrier┘   every local rank entered
 *   r0 ─rail 0 dissemination (A, B, C): ceil(log2 N) rounds of signals─
 *   └intra barrier┘   └intra barrier┘   └intra barrier┘   r0 has heard from every node
 *
 * When local rank 0 of a node leaves the dissemination, it has heard,
 * through the chain, from every node's local rank 0, each of which left
 * its first intra barrier only after all its node's ranks had entered: so
 * everyone has; the second intra barrier passes that on. One rail instead
 * of every rail running the dissemination: on 2 x 2 over loopback
 * (bench/RESULTS.md, HCOLL_CHECK_ARGS=0) a median of 86-139 us against
 * 120-155 us, L - 1 fewer ranks sending and waking per round for one
 * more shared-memory step.
 *
 *   plan     intra step          dissemination over
 *   single   -                   -
 *   intra    the node's barrier  -
 *   ring     -                   all ranks (one per node)
 *   flat     -                   all ranks (nodes of different sizes)
 *   3stage   the node's barrier  the nodes' local rank 0, then the node's
 *                                barrier again
 *
 * The dissemination's partners are connected with the ring, at set-up
 * (hc_coll_barrier_setup), on a transport instance of their own. Its wait
 * is watched as the ring driver's is: the abort flag, every local rank alive,
 * the ring's liveness links (a stopped or dead neighbour) between slices
 * of HC_RINGDRV_POLL_MS.
 */
#include "core/coll_priv.h"

#include <stdatomic.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "core/comm.h"
#include "core/ringdrv.h"
#include "inter/dissem.h"

hcoll_status_t hc_coll_barrier_setup(hc_coll_t *co, const hc_transport_ops_t *ops,
                                     const hc_transport_params_t *tp, hc_allgather_fn allgather,
                                     void *ag_ctx, int op_timeout_ms)
{
    const hc_dissem_params_t dp = { .ops = ops, .tp = *tp, .allgather = allgather,
                                    .ag_ctx = ag_ctx, .op_timeout_ms = op_timeout_ms };
    return hc_dissem_create(&dp, &co->dissem);
}

/* Also the device path's wait for the caller's stream (coll.h). */
hcoll_status_t hc_coll_peers_alive(hc_coll_t *co, const char *what)
{
    hcoll_status_t st = hc_intra_alive(co->intra, what);
    return st != HCOLL_SUCCESS ? st : hc_ring_live_status(co->ring);
}

/* The dissemination to its end, an error, or an abort. */
static hcoll_status_t dissem_run(hc_coll_t *co, uint32_t seq)
{
    struct hcoll_comm *c = co->comm;
    int done = 0;
    hcoll_status_t st = hc_dissem_start(co->dissem, seq);
    while (st == HCOLL_SUCCESS && !done) {
        if (atomic_load(&c->aborted))
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                              "communicator aborted during the barrier");
        if ((st = hc_coll_peers_alive(co, "(seen from the barrier)")) != HCOLL_SUCCESS)
            return st;
        st = hc_dissem_progress(co->dissem, HC_RINGDRV_POLL_MS, &done);
    }
    return st;
}

hcoll_status_t hc_coll_barrier(hc_coll_t *co, hcoll_stage_times_t *tm)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    double t = hc_now_us();
    const int node_step = co->plan == HC_PLAN_INTRA || co->plan == HC_PLAN_3STAGE;
    if (node_step) {
        st = co->intra->ops->barrier(co->intra);
        tm->intra_rs_us = hc_now_us() - t;
    }
    if (st == HCOLL_SUCCESS && co->dissem && (co->plan != HC_PLAN_3STAGE ||
                                              co->comm->local_rank == 0)) {
        t = hc_now_us();
        st = dissem_run(co, (uint32_t)co->opseq);
        tm->inter_us = hc_now_us() - t;
    }
    if (st == HCOLL_SUCCESS && co->plan == HC_PLAN_3STAGE) {
        t = hc_now_us();
        st = co->intra->ops->barrier(co->intra);
        tm->intra_ag_us = hc_now_us() - t;
    }
    return st;
}
