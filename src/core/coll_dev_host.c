/*
 * The device path's host stage (design: coll_dev.c), on the executor's
 * worker in issue order: wait for the stream's ready event, run the ring
 * over the rank's shard (staged through pinned host memory, or on device
 * memory with GPUDirect), and release the stream's flag, always and in
 * order.
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
 * o->chain_root. Adds its time to *ring_us. */
static hcoll_status_t ring_run(hc_coll_dev_t *d, const void *src, void *buf, size_t n,
                               const hc_dev_op_t *o, int dev, double *ring_us)
{
    struct hcoll_comm *c = d->c;
    const int bcast = o->kind == HC_DEV_BCAST;
    const hc_ringdrv_op_t rop = { dev ? src : buf, buf, n, o->dtype, o->op, c->nranks, dev,
                                  bcast, bcast ? o->chain_root : 0, HC_RING_PHASE_ALLREDUCE,
                                  0 /* no barrier signals looked at */ };
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank,
                                   bcast ? "the broadcast chain" : "the inter-node stage",
                                   NULL /* NCCL: its own failures */, NULL };
    const double t0 = hc_now_us();
    hcoll_status_t st = hc_ringdrv_run(d->ring, &rop, &env);
    *ring_us += hc_now_us() - t0;
    return st;
}

/* ---- vfix (issue 19 item 6): managed memory on a GPUDirect ring ----------
 * Neither dma-buf nor nvidia-peermem pins managed memory, so the NIC cannot
 * take it. Every other rank runs this ring operation on device memory, so
 * this one must too: through device memory of hcoll's own, copied in and
 * out on the internal stream. Costs an allocation and two copies per call:
 * pass cuMemAlloc'd buffers for speed. */
static hcoll_status_t gdr_ring_run(hc_coll_dev_t *d, const hc_dev_op_t *o, const void *src,
                                   void *dst, size_t count, double *ring_us)
{
    if (hc_gdr_ptr_kind(src, NULL) != HC_MEM_MANAGED &&
        hc_gdr_ptr_kind(dst, NULL) != HC_MEM_MANAGED)
        return ring_run(d, src, dst, count, o, 1, ring_us);
    hc_gdr_dev_t *gpu = d->gpu;
    const int tmo = (int)d->c->params.timeout_ms;
    const size_t bytes = count * hcoll_dtype_size(o->dtype);
    hcoll_status_t st;
    hc_gdr_dmem_t tmp;
    if (hc_gdr_dmem_alloc(d->dev, bytes, &tmp) != 0)
        return hc_err_set(&d->c->err, HC_GDR, d->c->rank, HCOLL_ERR_NO_MEMORY,
                          "no %zu bytes of device memory to stage a managed buffer for the "
                          "GPUDirect ring",
                          bytes);
    void *t = (void *)(uintptr_t)tmp.ptr;
    HC_CHECK(hc_gdr_dev_copy_async(gpu, t, src, bytes, gpu->istream), clean_tmp);
    HC_CHECK(hc_gdr_dev_fence(gpu, tmo, 1, "staging a managed buffer in"), clean_tmp);
    HC_CHECK(ring_run(d, t, t, count, o, 1, ring_us), clean_tmp);
    HC_CHECK(hc_gdr_dev_copy_async(gpu, dst, t, bytes, gpu->istream), clean_tmp);
    st = hc_gdr_dev_fence(gpu, tmo, 1, "staging a managed buffer out");
clean_tmp:
    hc_gdr_dmem_free(&tmp);
    return st;
}
/* ---- end vfix ---------------------------------------------------------- */

hcoll_status_t hc_dev_ring_stage(hc_coll_dev_t *d, const hc_dev_op_t *o, const void *src_p,
                                 void *dst_p, size_t count, double *ring_us)
{
    hc_gdr_dev_t *gpu = d->gpu;
    const int tmo = (int)d->c->params.timeout_ms;
    const size_t es = hcoll_dtype_size(o->dtype);
    const size_t piece = d->stage_bytes / es;
    const size_t npieces = hc_devsched_pieces(count, es, d->stage_bytes);
    const unsigned char *src = src_p;
    unsigned char *dst = dst_p;
    hcoll_status_t st;
    /* GPUDirect: the ring reads and writes the device range itself. */
    if (d->gdr)
        return gdr_ring_run(d, o, src, dst, count, ring_us);
    hc_devstage_t it;
    hc_devstage_init(&it, npieces);
    for (;;) {
        hc_devstage_step_t step = hc_devstage_next(&it);
        if (step.kind == HC_DEVSTAGE_DONE)
            break;
        size_t off = step.piece * piece;
        size_t n = count - off < piece ? count - off : piece;
        switch (step.kind) {
        case HC_DEVSTAGE_D2H:
            HC_CHECK(hc_gdr_dev_stage_in(gpu, step.buf, src + off * es, n * es), out);
            break;
        case HC_DEVSTAGE_WAIT:
            HC_CHECK(hc_gdr_dev_stage_wait(gpu, step.buf, tmo), out);
            break;
        case HC_DEVSTAGE_RING:
            if (o->ro.host_scale) /* no NCCL stage scaled this rank's input */
                hc_redop_scale_host(&o->ro, gpu->stage[step.buf], NULL, n, o->dtype);
            HC_CHECK(ring_run(d, gpu->stage[step.buf], gpu->stage[step.buf], n, o, 0, ring_us),
                     out);
            break;
        case HC_DEVSTAGE_H2D:
            HC_CHECK(hc_gdr_dev_stage_out(gpu, step.buf, dst + off * es, n * es), out);
            break;
        case HC_DEVSTAGE_DONE:
            break;
        }
    }
    st = HCOLL_SUCCESS;
out:
    return st;
}

/* A gated segment staged through host memory: the ring of every piece
 * between its copies, each piece's gate opened after its ring. */
static hcoll_status_t gated_seg_staged(hc_coll_dev_t *d, const hc_dev_op_t *o,
                                       const hc_dev_seg_t *g, double *ring_us)
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
            st = ring_run(d, buf, buf, n, o, 0, ring_us);
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
                                    const hc_dev_seg_t *g, double *ring_us)
{
    /* The NIC reads the range: stage ① must be done. */
    hcoll_status_t st =
        hc_dev_wait_stream(d, g->ev_ready, "the intra-node stage on the caller's stream");
    if (st != HCOLL_SUCCESS)
        return st;
    hc_dev_gdr_seg_t x;
    HC_CHECK(hc_dev_gdr_seg_begin(d, g, &x), out);
    st = ring_run(d, g->src, g->dst, g->count, o, 1, ring_us);
    hc_dev_gdr_seg_end(d, &x);
out:
    hc_gdr_gate_release(d->gate, g->gate_end);
    return st;
}

/* The worker's side of a gated all-reduce (coll_dev_gated.c): each
 * segment's ring, every gate opened (always, in order), the gate stream
 * waited for. */
static hcoll_status_t gated_stage(hc_coll_dev_t *d, hc_dev_op_t *o, hcoll_status_t st,
                                  double *ring_us)
{
    if (o->kind == HC_DEV_RS || o->kind == HC_DEV_AG)
        return hc_dev_rsag_gated(d, o, st, ring_us);
    hc_gdr_gate_release(d->gate, o->gate_start); /* the staging buffers are this call's now */
    for (int k = 0; k < o->nseg && st == HCOLL_SUCCESS; k++)
        st = d->gdr ? gated_seg_gdr(d, o, &o->seg[k], ring_us)
                    : gated_seg_staged(d, o, &o->seg[k], ring_us);
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

/*
 * A device broadcast, once every rank agreed on its arguments: all on the
 * internal stream after the caller's ready event, in the plan's order
 * (the worker's NCCL communicator; "chain" is the ring's broadcast chain,
 * staged through pinned host memory or, GPUDirect, on device memory):
 *   single   the root's copy
 *   intra    ncclBroadcast
 *   ring     chain over all ranks from the root
 *   flat     the same
 *   3stage   root's node: ncclBroadcast (each local rank then holds its
 *            shard); local rank i chains shard i along rail i from the
 *            root's node; other nodes: ncclAllGather of the shards
 */
static hcoll_status_t bcast_stage(hc_coll_dev_t *d, hc_dev_op_t *o, const hc_dev_seg_t *g,
                                  double *ring_us)
{
    struct hcoll_comm *c = d->c;
    hc_gdr_dev_t *gpu = d->gpu;
    const int tmo = (int)c->params.timeout_ms;
    const size_t es = hcoll_dtype_size(o->dtype), n = o->count;
    unsigned char *buf = o->recvbuf;
    const int root_node = c->node_of[o->root], three = d->plan == HC_PLAN_3STAGE;
    hcoll_status_t st;
    HC_CHECK(hc_dev_wait_stream(d, g->ev_ready, "the caller's stream before the broadcast"),
             out);
    if (c->rank == o->root && o->sendbuf != buf && (d->plan != HC_PLAN_INTRA && !three))
        HC_CHECK(hc_gdr_dev_copy_async(gpu, buf, o->sendbuf, n * es, gpu->istream), out);
    if (d->plan == HC_PLAN_INTRA || (three && c->node == root_node))
        HC_CHECK(d->wnccl->ops->bcast(d->wnccl, o->sendbuf, buf, n, o->dtype,
                                      c->local_of[o->root], gpu->istream),
                 out);
    if (d->plan == HC_PLAN_SINGLE || d->plan == HC_PLAN_INTRA)
        return HCOLL_SUCCESS;
    size_t soff = 0, slen = n;
    if (three)
        hc_intra_shard(n, c->local_size, c->local_rank, &soff, &slen);
    /* Rail rings have one rank per node, in node order; else positions are
     * ranks. */
    o->chain_root = three ? root_node : o->root;
    /* GPUDirect reads device memory from the host's side: the stream's
     * work must be done first (staging copies are ordered on it). */
    if (d->gdr)
        HC_CHECK(hc_gdr_dev_fence(gpu, tmo, 1, "the broadcast's intra-node stage"), out);
    HC_CHECK(hc_dev_ring_stage(d, o, buf + soff * es, buf + soff * es, slen, ring_us), out);
    if (three && c->node != root_node)
        HC_CHECK(d->wnccl->ops->all_gather(d->wnccl, buf, n, o->dtype, gpu->istream), out);
    st = HCOLL_SUCCESS;
out:
    return st;
}

/* Write seq to the flag behind everything on the internal stream, and wait
 * until it is written (the staging buffers are then free, and the request
 * may complete). */
static hcoll_status_t release(hc_coll_dev_t *d, uint32_t seq, int check_abort)
{
    hcoll_status_t st;
    HC_CHECK(hc_gdr_dev_write_flag(d->gpu, seq), out);
    pthread_mutex_lock(&d->lock);
    int order = hc_devseq_release(&d->seq, seq);
    pthread_mutex_unlock(&d->lock);
    if (order != 0) {
        st = hc_err_set(&d->c->err, HC_COLL, d->c->rank, HCOLL_ERR_INTERNAL,
                        "stream flag released out of order (seq %u)", seq);
        goto out;
    }
    st = hc_gdr_dev_fence(d->gpu, (int)d->c->params.timeout_ms, check_abort,
                          "the copy back from staging");
out:
    if (st != HCOLL_SUCCESS)
        HC_WARN(HC_GDR, d->c->rank,
                "releasing device all-reduce %u failed; a stream waiting for it may hang", seq);
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
    double ring_us = 0;
    memset(times, 0, sizeof *times);
    /* Pushed, not set: without a worker thread this runs on the caller's
     * thread, whose current context is the application's. */
    const int gpu = o->nseg > 0 || o->ntev > 0;
    if (gpu)
        hc_gdr_dev_push(d->gpu);
    if (o->gated) {
        st = gated_stage(d, o, st, &ring_us);
        for (int k = 0; k < o->nseg; k++)
            hc_gdr_dev_event_free(d->gpu, o->seg[k].ev_ready);
        hc_dev_gated_free(d, o);
    }
    for (int k = 0; k < o->nseg && !o->gated; k++) {
        if (st == HCOLL_SUCCESS)
            st = bcast_stage(d, o, &o->seg[k], &ring_us); /* the only one with a flag */
        /* Always, and in order: the caller's stream waits for it. */
        hcoll_status_t rst = release(d, o->seg[k].seq, 0);
        if (st == HCOLL_SUCCESS)
            st = rst;
        hc_gdr_dev_event_free(d->gpu, o->seg[k].ev_ready);
    }
    times->inter_us = ring_us;
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
