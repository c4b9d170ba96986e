/*
 * The device all-reduce of the staged plans (ring, flat, three stages),
 * ordered so that no stream ever waits for work submitted after it (the
 * design is at the top of coll_dev.c). Everything is enqueued at call
 * time, on the caller's thread, in an order a single in-order hardware
 * queue can run (CUDA_DEVICE_MAX_CONNECTIONS=1):
 *
 *   caller's stream  RS(0) ev0 RS(1) ev1 …                 wait(back0) AG(0) wait(back1) AG(1) …
 *   gate stream          wait(start) wait(ev0) D2H(p0) in0 D2H(p1) in1 gate(p0) H2D(p0) D2H(p2) …
 *                                     gate(p_last) H2D(p_last) back0 wait(ev1) … back1 …
 *   worker (later)   start → wait in0, ring(p0), open gate(p0) → wait in1, ring(p1), … → tail
 *
 * "gate(t)" waits until a word of pinned host memory, mapped into the
 * device, reaches t; only the worker's store opens it, and everything it
 * depends on (the copies into staging, and through ev_k stage ①) was
 * submitted before it. The caller's stream waits on events only. Pieces
 * alternate between the two staging buffers, so the copy of piece p+2
 * queues behind the copy back of piece p, as in the host stage's
 * schedule (devsched.h); RS(k+1) runs while the ring reduces segment k
 * where the streams have queues of their own. The start gate keeps the
 * copies off the staging buffers until the worker reaches this call:
 * calls before it (a broadcast, a reduce-scatter) may still use them.
 *
 * On device memory (GPUDirect stage ②) the gate stream holds, per
 * segment, the ring's reductions instead of copies, in its message order
 * (hc_ring_dev_jobs), each behind a gate and followed by a signal (a word
 * of the same pinned page that the stream writes):
 *
 *   gate stream  wait(ev_k) gate(m0) reduce(m0) sig … gate(m_last) reduce sig gate(end) back_k
 *   worker       ring: message m lands → open the gates up to the longest landed prefix;
 *                signal ≥ m → m reduced: its credit goes, the next step may send it;
 *                ring done → open gate(end)
 *
 * so the GPU reduces while the progress loop polls the CQs, and nothing
 * is submitted while the ring runs (the reductions used to be enqueued
 * then, each followed by a cuStreamSynchronize on hcoll's thread).
 *
 * A failure never leaves a stream waiting: the worker opens every gate of
 * the call whatever happened (the result is then undefined and the error
 * is reported), and destroy opens every gate issued.
 */
#include "core/coll_dev_priv.h"

#include <stdlib.h>

#include "base/err.h"
#include "base/log.h"
#include "core/comm.h"

/* Segment g's reductions on device memory, each behind its gate and
 * followed by a signal, in the ring's message order (GPUDirect). */
typedef struct job_arg {
    hc_coll_dev_t *d;
    hc_dev_op_t *o;
    hc_dev_seg_t *g;
} job_arg_t;

static hcoll_status_t seg_job(void *arg, size_t m, size_t off, size_t cnt, void *slot, int last)
{
    job_arg_t *j = arg;
    hc_gdr_gate_t *gt = j->d->gate;
    hc_gdr_dev_t *gpu = j->d->gpu;
    hc_dev_seg_t *g = j->g;
    const size_t es = hcoll_dtype_size(j->o->dtype);
    hcoll_status_t st;
    uint32_t t, v;
    HC_CHECK(hc_gdr_gate_wait(gt, &t), out);
    j->o->gate_hi = t;
    if (m == 0)
        g->jt0 = t;
    const hc_cu_dptr_t dst = (hc_cu_dptr_t)(uintptr_t)(g->dst + off * es);
    hc_cu_res_t r = hc_gdr_kern_reduce(gpu->kern, dst, (hc_cu_dptr_t)(uintptr_t)slot,
                                       (hc_cu_dptr_t)(uintptr_t)(g->src + off * es), cnt,
                                       j->o->dtype, j->o->op, gt->stream);
    if (r == HC_CU_SUCCESS && last && j->o->op == HCOLL_AVG)
        r = hc_gdr_kern_avg(gpu->kern, dst, cnt, j->o->dtype, j->d->c->nranks, gt->stream);
    if (r != HC_CU_SUCCESS) {
        st = hc_gdr_cu_fail(&j->d->rp, r, "launching a gated reduction (GPUDirect ring)");
        goto out;
    }
    HC_CHECK(hc_gdr_gate_signal(gt, &v), out);
    if (m == 0)
        g->sig0 = v;
    g->njobs = m + 1;
out:
    return st;
}

/* phase: the ring's (HC_RING_PHASE_*); an all-gather alone reduces
 * nothing. rs_copy: the block then copied from g->dst + rs_copy_off into
 * o->recvbuf (a reduce-scatter), or NULL. */
static hcoll_status_t seg_jobs_phase(hc_coll_dev_t *d, hc_dev_op_t *o, hc_dev_seg_t *g, int phase,
                                     size_t ring_count, const void *rs_copy, size_t rs_bytes)
{
    hcoll_status_t st;
    job_arg_t j = { d, o, g };
    HC_CHECK(hc_gdr_dev_stream_wait_event(d->gpu, d->gate->stream, g->ev_ready), out);
    if (phase != HC_RING_PHASE_AG)
        HC_CHECK(hc_ring_dev_jobs(d->ring, ring_count, o->dtype, phase, seg_job, &j), out);
    /* The ring's end: the all-gather's last data landed in g->dst. */
    HC_CHECK(hc_gdr_gate_wait(d->gate, &g->gate_end), out);
    o->gate_hi = g->gate_end;
    if (rs_copy)
        HC_CHECK(hc_gdr_dev_copy_async(d->gpu, o->recvbuf, rs_copy, rs_bytes, d->gate->stream),
                 out);
    HC_CHECK(hc_gdr_dev_event_mark(d->gpu, d->gate->stream, &g->ev_back), out);
out:
    return st;
}

static hcoll_status_t seg_jobs(hc_coll_dev_t *d, hc_dev_op_t *o, hc_dev_seg_t *g)
{
    return seg_jobs_phase(d, o, g, HC_RING_PHASE_ALLREDUCE, g->count, NULL, 0);
}

/* A reduce-scatter's or all-gather's staged pieces (coll_dev_rsag.c's
 * layout: piece k is elements [kP, kP+P) of each of the N blocks, side by
 * side in one staging buffer), in the staging schedule's order. */
static hcoll_status_t rsag_copies(hc_coll_dev_t *d, hc_dev_op_t *o, size_t P)
{
    hc_gdr_gate_t *gt = d->gate;
    hc_gdr_dev_t *gpu = d->gpu;
    hc_dev_seg_t *g = &o->seg[0];
    const int rs = o->kind == HC_DEV_RS, N = o->nblk;
    const size_t es = hcoll_dtype_size(o->dtype), B = o->count;
    unsigned char *rsrc = (unsigned char *)o->rsrc;
    hcoll_status_t st = HCOLL_SUCCESS;
    HC_CHECK(hc_gdr_dev_stream_wait_event(gpu, gt->stream, g->ev_ready), out);
    hc_devstage_t it;
    hc_devstage_init(&it, (size_t)g->npc);
    for (;;) {
        hc_devstage_step_t step = hc_devstage_next(&it);
        if (step.kind == HC_DEVSTAGE_DONE)
            break;
        const size_t off = step.piece * P, p = B - off < P ? B - off : P;
        hc_dev_piece_t *pc = &o->pc[step.piece];
        unsigned char *host = gpu->stage[step.buf];
        if (step.kind == HC_DEVSTAGE_D2H) {
            for (int m = 0; m < N; m++)
                if (rs || m == o->pos)
                    HC_CHECK(hc_gdr_gate_copy(gt, host + (size_t)m * p * es,
                                              rsrc + ((size_t)m * B + off) * es, p * es, 1),
                             out);
            HC_CHECK(hc_gdr_dev_event_mark(gpu, gt->stream, &pc->ev_in), out);
        } else if (step.kind == HC_DEVSTAGE_H2D) {
            HC_CHECK(hc_gdr_gate_wait(gt, &pc->gate), out);
            o->gate_hi = pc->gate;
            for (int m = 0; m < N; m++)
                if (!rs || m == o->pos)
                    HC_CHECK(hc_gdr_gate_copy(gt, host + (size_t)m * p * es,
                                              rs ? (unsigned char *)o->recvbuf + off * es
                                                 : rsrc + ((size_t)m * B + off) * es,
                                              p * es, 0),
                             out);
        }
    }
    HC_CHECK(hc_gdr_dev_event_mark(gpu, gt->stream, &g->ev_back), out);
out:
    return st;
}

hcoll_status_t hc_dev_gated_rsag_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, void *stream,
                                         size_t P)
{
    struct hcoll_comm *c = d->c;
    const int rs = o->kind == HC_DEV_RS;
    const size_t es = hcoll_dtype_size(o->dtype), B = o->count;
    hc_dev_seg_t *g = &o->seg[0];
    hcoll_status_t st;
    if (!d->gdr) {
        g->pc0 = 0;
        g->npc = (int)((B + P - 1) / P);
        o->pc = calloc((size_t)g->npc + 1, sizeof *o->pc);
        if (!o->pc)
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                              "no memory for a device operation");
        o->npc = g->npc;
    }
    st = hc_gdr_gate_wait(d->gate, &o->gate_start);
    if (st != HCOLL_SUCCESS) {
        free(o->pc);
        o->pc = NULL;
        return st;
    }
    o->gated = 1;
    o->gate_hi = o->gate_start;
    o->nseg = 1;
    if (d->gdr) {
        g->src = o->rsrc;
        g->dst = o->rdst;
        st = seg_jobs_phase(d, o, g, rs ? HC_RING_PHASE_RS : HC_RING_PHASE_AG,
                            B * (size_t)o->nblk, rs ? o->rdst + (size_t)o->pos * B * es : NULL,
                            B * es);
    } else {
        st = rsag_copies(d, o, P);
    }
    if (st == HCOLL_SUCCESS)
        st = hc_gdr_dev_stream_wait_event(d->gpu, stream, g->ev_back);
    o->status = st;
    if (hc_gdr_dev_event_mark(d->gpu, d->gate->stream, &o->ev_tail) != HCOLL_SUCCESS)
        o->ev_tail = NULL;
    hcoll_status_t mst = hc_gdr_gate_mark(d->gate); /* what destroy waits for */
    if (o->status == HCOLL_SUCCESS)
        o->status = mst;
    return HCOLL_SUCCESS;
}

/* Segment g's copies through staging and gates, on the gate stream. */
static hcoll_status_t seg_copies(hc_coll_dev_t *d, hc_dev_op_t *o, hc_dev_seg_t *g)
{
    hc_gdr_gate_t *gt = d->gate;
    hc_gdr_dev_t *gpu = d->gpu;
    const size_t es = hcoll_dtype_size(o->dtype), piece = d->stage_bytes / es;
    hcoll_status_t st = HCOLL_SUCCESS;
    HC_CHECK(hc_gdr_dev_stream_wait_event(gpu, gt->stream, g->ev_ready), out);
    hc_devstage_t it;
    hc_devstage_init(&it, (size_t)g->npc);
    for (;;) {
        hc_devstage_step_t step = hc_devstage_next(&it);
        if (step.kind == HC_DEVSTAGE_DONE)
            break;
        const size_t off = step.piece * piece;
        const size_t n = g->count - off < piece ? g->count - off : piece;
        hc_dev_piece_t *p = &o->pc[g->pc0 + (int)step.piece];
        if (step.kind == HC_DEVSTAGE_D2H) {
            HC_CHECK(hc_gdr_gate_copy(gt, gpu->stage[step.buf], (void *)(g->src + off * es),
                                      n * es, 1),
                     out);
            HC_CHECK(hc_gdr_dev_event_mark(gpu, gt->stream, &p->ev_in), out);
        } else if (step.kind == HC_DEVSTAGE_H2D) {
            HC_CHECK(hc_gdr_gate_wait(gt, &p->gate), out);
            o->gate_hi = p->gate;
            HC_CHECK(hc_gdr_gate_copy(gt, gpu->stage[step.buf], g->dst + off * es, n * es, 0),
                     out);
        }
    }
    HC_CHECK(hc_gdr_dev_event_mark(gpu, gt->stream, &g->ev_back), out);
out:
    return st;
}

hcoll_status_t hc_dev_gated_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, size_t nseg, void *stream,
                                    hcoll_status_t (*ag)(hc_coll_dev_t *d, hc_dev_op_t *o,
                                                         size_t k, void *stream, void *arg),
                                    void *arg)
{
    struct hcoll_comm *c = d->c;
    const size_t es = hcoll_dtype_size(o->dtype);
    hcoll_status_t st;
    int npc = 0;
    for (size_t k = 0; k < nseg && !d->gdr; k++) {
        o->seg[k].pc0 = npc;
        o->seg[k].npc = (int)hc_devsched_pieces(o->seg[k].count, es, d->stage_bytes);
        npc += o->seg[k].npc;
    }
    o->pc = calloc((size_t)npc + 1, sizeof *o->pc);
    if (!o->pc)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a device operation");
    o->npc = npc;
    st = hc_gdr_gate_wait(d->gate, &o->gate_start);
    if (st != HCOLL_SUCCESS) {
        free(o->pc);
        o->pc = NULL;
        return st;
    }
    /* From here on the worker must open the gates: the op goes to it. */
    o->gated = 1;
    o->gate_hi = o->gate_start;
    o->nseg = (int)nseg;
    for (size_t k = 0; k < nseg && st == HCOLL_SUCCESS; k++)
        st = !d->gdr                   ? seg_copies(d, o, &o->seg[k])
             : o->kind == HC_DEV_BCAST ? seg_jobs_phase(d, o, &o->seg[k], HC_RING_PHASE_AG, 0,
                                                        NULL, 0) /* the chain reduces nothing */
                                       : seg_jobs(d, o, &o->seg[k]);
    for (size_t k = 0; k < nseg && st == HCOLL_SUCCESS; k++) {
        st = hc_gdr_dev_stream_wait_event(d->gpu, stream, o->seg[k].ev_back);
        if (st == HCOLL_SUCCESS && ag)
            st = ag(d, o, k, stream, arg);
    }
    o->status = st;
    /* Best effort: without it the worker cannot tell when staging is free. */
    if (hc_gdr_dev_event_mark(d->gpu, d->gate->stream, &o->ev_tail) != HCOLL_SUCCESS)
        o->ev_tail = NULL;
    hcoll_status_t mst = hc_gdr_gate_mark(d->gate); /* what destroy waits for */
    if (o->status == HCOLL_SUCCESS)
        o->status = mst;
    return HCOLL_SUCCESS;
}

void hc_dev_gated_free(hc_coll_dev_t *d, hc_dev_op_t *o)
{
    for (int i = 0; i < o->npc; i++)
        hc_gdr_dev_event_free(d->gpu, o->pc[i].ev_in);
    for (int k = 0; k < o->nseg; k++)
        hc_gdr_dev_event_free(d->gpu, o->seg[k].ev_back);
    hc_gdr_dev_event_free(d->gpu, o->ev_tail);
    free(o->pc);
    o->pc = NULL;
    o->npc = 0;
}

/* A gated GPUDirect segment while the ring runs it (coll_dev_priv.h). */
static void gdr_landed(void *ctx, size_t m)
{
    hc_dev_gdr_seg_t *x = ctx;
    if (m >= x->g->njobs)
        return;
    x->landed[m] = 1;
    size_t was = x->opened;
    while (x->opened < x->g->njobs && x->landed[x->opened])
        x->opened++;
    if (x->opened > was)
        hc_gdr_gate_release(x->gate, x->g->jt0 + (uint32_t)(x->opened - 1));
}

static size_t gdr_reduced(void *ctx)
{
    const hc_dev_gdr_seg_t *x = ctx;
    int32_t n = (int32_t)(hc_gdr_gate_done(x->gate) - (x->g->sig0 - 1));
    return n < 0 ? 0 : (size_t)n > x->g->njobs ? x->g->njobs : (size_t)n;
}

hcoll_status_t hc_dev_gdr_seg_begin(hc_coll_dev_t *d, const hc_dev_seg_t *g,
                                    hc_dev_gdr_seg_t *x)
{
    *x = (hc_dev_gdr_seg_t){ d->gate, g, calloc(g->njobs + 1, 1), 0, { 0 } };
    if (!x->landed)
        return hc_err_set(&d->c->err, HC_COLL, d->c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a GPUDirect segment's %zu landing flags", g->njobs);
    x->hooks = (hc_ring_gated_t){ x, gdr_landed, gdr_reduced };
    hc_ring_set_gated(d->ring, &x->hooks);
    return HCOLL_SUCCESS;
}

void hc_dev_gdr_seg_end(hc_coll_dev_t *d, hc_dev_gdr_seg_t *x)
{
    hc_ring_set_gated(d->ring, NULL);
    free(x->landed);
    x->landed = NULL;
}
