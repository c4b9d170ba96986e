/*
 * The device path's host stage (design: coll_dev.c), on the executor's
 * worker in issue order: wait for the stream's ready events, run the ring
 * over the rank's shard (staged through pinned host memory, or on device
 * memory with GPUDirect), and open the call's gates, always and in order;
 * with three stages, a void on any rail is then told to the node's ranks
 * (coll_rail.c, hc_coll_rail_end_dev).
 */
#include "core/coll_dev_priv.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"
#include "core/coll.h"
#include "core/comm.h"
#include "core/ringdrv.h"
#include "gdr/gdr.h"
#include "gdr/mem.h"

/* ------------------------------------------------------------------------ */
/* Host stage (worker thread)                                                 */
/* ------------------------------------------------------------------------ */

/* The ring on buf in place (host staging), or from src to dst in device
 * memory (GPUDirect: dev); a broadcast: buf along the chain from
 * o->chain_root. Adds its time to run; a void on this rail (three
 * stages) is kept in run->v and the call goes on (coll_rail.c). */
static hcoll_status_t ring_run(hc_coll_dev_t *d, const void *src, void *buf, size_t n,
                               const hc_dev_op_t *o, int dev, hc_dev_run_t *run)
{
    struct hcoll_comm *c = d->c;
    const int bcast = o->kind == HC_DEV_BCAST;
    const hc_ringdrv_op_t rop = { dev ? src : buf, buf, n, o->dtype, o->op, c->nranks, dev,
                                  bcast, bcast ? o->chain_root : 0, HC_RING_PHASE_ALLREDUCE,
                                  0 /* no barrier signals looked at */ };
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank,
                                   bcast ? "the broadcast chain" : "the inter-node stage",
                                   NULL /* NCCL: its own failures */, NULL };
    const uint64_t voided = hc_ring_voided(d->ring);
    const double t0 = hc_now_us();
    hcoll_status_t st = hc_ringdrv_run(d->ring, &rop, &env);
    run->ring_us += hc_now_us() - t0;
    return hc_coll_rail_ran(d->c->coll, st, voided, &run->v);
}

/* A gated segment staged through host memory: the ring of every piece
 * between its copies, each piece's gate opened after its ring. */
static hcoll_status_t gated_seg_staged(hc_coll_dev_t *d, const hc_dev_op_t *o,
                                       const hc_dev_seg_t *g, hc_dev_run_t *run)
{
    hc_gdr_dev_t *gpu = d->gpu;
    const size_t es = hcoll_dtype_size(o->dtype), piece = d->stage_bytes / es;
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_devstage_t it;
    hc_devstage_init(&it, (size_t)g->npc);
    for (;;) {
        hc_devstage_step_t step = hc_devstage_next(&it);
        if (step.kind == HC_DEVSTAGE_DONE || st != HCOLL_SUCCESS)
            break;
        const size_t off = step.piece * piece, n = g->count - off < piece ? g->count - off : piece;
        const hc_dev_piece_t *p = &o->pc[g->pc0 + (int)step.piece];
        unsigned char *buf = gpu->stage[step.buf];
        switch (step.kind) {
        case HC_DEVSTAGE_WAIT: /* behind stage ①, which waits for every local rank */
            st = hc_dev_wait_stream(d, p->ev_in, "the intra-node stage and the copy into staging");
            break;
        case HC_DEVSTAGE_RING:
            if (o->ro.host_scale) /* no NCCL stage scaled this rank's input */
                hc_redop_scale_host(&o->ro, buf, NULL, n, o->dtype);
            st = ring_run(d, buf, buf, n, o, 0, run);
            break;
        case HC_DEVSTAGE_H2D:
            hc_gdr_gate_release(d->gate, p->gate);
            break;
        default:
            break;
        }
    }
    return st;
}

static hcoll_status_t gated_seg_gdr(hc_coll_dev_t *d, const hc_dev_op_t *o,
                                    const hc_dev_seg_t *g, hc_dev_run_t *run)
{
    /* The NIC reads the range: stage ① must be done. */
    hcoll_status_t st =
        hc_dev_wait_stream(d, g->ev_ready, "the intra-node stage on the caller's stream");
    if (st != HCOLL_SUCCESS)
        return st;
    if (o->kind == HC_DEV_BCAST) { /* the chain: nothing for the GPU to reduce */
        st = ring_run(d, g->src, g->dst, g->count, o, 1, run);
        goto out;
    }
    hc_dev_gdr_seg_t x;
    HC_CHECK(hc_dev_gdr_seg_begin(d, g, &x), out);
    st = ring_run(d, g->src, g->dst, g->count, o, 1, run);
    hc_dev_gdr_seg_end(d, &x);
out:
    hc_gdr_gate_release(d->gate, g->gate_end);
    return st;
}

/* The worker's side of a gated all-reduce or broadcast
 * (coll_dev_gated.c): each segment's ring (st_in: the call failed, or the
 * ranks disagree on it: none runs), every gate opened (always, in order),
 * the gate stream waited for. */
static hcoll_status_t gated_stage(hc_coll_dev_t *d, hc_dev_op_t *o, hcoll_status_t st,
                                  hc_dev_run_t *run)
{
    if (o->kind == HC_DEV_RS || o->kind == HC_DEV_AG)
        return hc_dev_rsag_gated(d, o, st, run);
    hc_gdr_gate_release(d->gate, o->gate_start); /* the staging buffers are this call's now */
    for (int k = 0; k < o->nseg && st == HCOLL_SUCCESS; k++)
        st = d->gdr ? gated_seg_gdr(d, o, &o->seg[k], run)
                    : gated_seg_staged(d, o, &o->seg[k], run);
    /* Always, and in order: the copies back, and the caller's stream behind
     * them, wait for these gates. */
    hc_gdr_gate_release(d->gate, o->gate_hi);
    if (o->ev_tail) {
        hcoll_status_t w = hc_gdr_event_wait(d->gpu->cu, o->ev_tail,
                                             (int)d->c->params.timeout_ms, 0, &d->rp,
                                             "hcoll's gate stream after the call");
        if (st == HCOLL_SUCCESS)
            st = w;
    }
    return st;
}

/* The NCCL stages' times, from the timing events once the GPU has passed
 * the last one (the request completes with the whole all-reduce); -1
 * where a stage could not be timed. */
static void gpu_times(hc_coll_dev_t *d, const hc_dev_op_t *o, hcoll_status_t st,
                      hcoll_stage_times_t *times)
{
    if (plan_needs_nccl(d->plan))
        times->intra_rs_us = times->intra_ag_us = -1;
    void *last = NULL;
    for (int i = o->ntev - 1; i >= 0 && !last; i--)
        last = o->tev[i];
    if (st != HCOLL_SUCCESS || !last ||
        hc_gdr_event_wait(d->gpu->cu, last, (int)d->c->params.timeout_ms, 1, &d->rp,
                          "the GPU stages of the call") != HCOLL_SUCCESS)
        return;
    if (o->fused) {
        double us = hc_dev_tev_us(d, o, 0, 1);
        times->intra_rs_us = times->intra_ag_us = us >= 0 ? us / 2 : -1;
        return;
    }
    times->intra_rs_us = hc_dev_tev_us(d, o, 0, 1);
    double ag = 0;
    for (int k = 0; k < o->nseg && ag >= 0; k++) {
        double us = hc_dev_tev_us(d, o, 2 + 2 * k, 3 + 2 * k);
        ag = us >= 0 ? ag + us : -1;
    }
    times->intra_ag_us = o->nseg > 0 ? ag : -1;
}

hcoll_status_t hc_coll_dev_execute(hc_coll_dev_t *d, hc_dev_op_t *o, hcoll_status_t status_in,
                                   hcoll_stage_times_t *times)
{
    const double t0 = hc_now_us();
    hcoll_status_t st = status_in != HCOLL_SUCCESS ? status_in : o->status;
    hc_dev_run_t run = { 0, { HCOLL_SUCCESS } };
    memset(times, 0, sizeof *times);
    /* Pushed, not set: without a worker thread this runs on the caller's
     * thread, whose current context is the application's. */
    const int gpu = o->nseg > 0 || o->ntev > 0;
    if (gpu)
        hc_gdr_dev_push(d->gpu);
    if (o->gated) {
        st = gated_stage(d, o, st, &run);
        for (int k = 0; k < o->nseg; k++)
            hc_gdr_dev_event_free(d->gpu, o->seg[k].ev_ready);
        hc_dev_gated_free(d, o);
        /* The rings ran (every rank agreed, the communicator works): the
         * node's ranks hear of a void on any rail, or end in step. */
        if (status_in == HCOLL_SUCCESS)
            st = hc_coll_rail_end_dev(d->c->coll, &run.v, st);
    }
    times->inter_us = run.ring_us;
    if (gpu) {
        gpu_times(d, o, st, times);
        hc_dev_tev_free(d, o);
        hc_gdr_dev_pop(d->gpu);
    } else if (plan_needs_nccl(d->plan)) {
        times->intra_rs_us = times->intra_ag_us = -1;
    }
    free(o);
    times->total_us = hc_now_us() - t0;
    return st;
}
