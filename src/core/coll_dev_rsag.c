/*
 * Reduce-scatter and all-gather on device buffers (the design of the
 * device path is at the top of coll_dev.c; the host versions and the
 * permuted vector V are coll_rsag.c's). N ring positions x L local ranks,
 * B elements per block, rank (n, l) owns block map(l, n); V holds local
 * rank l's N blocks contiguously (shard l), in its rail ring's order.
 *
 *   reduce-scatter, three stages
 *     caller's stream  permute sendbuf → V ─ ncclReduceScatter(V) (NCCL
 *                      scales AVG/PREMUL_SUM) ─ ev ─ wait(back) ──────────►
 *     gate stream      wait ev → the pieces' copies, each copy back behind
 *                      its gate (GPUDirect: the ring's reductions behind
 *                      theirs, then gate(end)) → block n into recvbuf → back
 *     worker           ring RS of shard l along rail l, opening the gates
 *   all-gather, three stages: the mirror
 *     caller's stream  sendbuf → V(l, n) ─ ev ─ wait(back) ─ ncclAllGather(V)
 *                      ─ permute V → recvbuf ──────────────────────────────►
 *     gate stream      wait ev → the pieces' copies and gates → back
 *     worker           ring AG of shard l along rail l, opening the gates
 *   (all enqueued at call time: coll_dev_gated.c says why and how)
 *
 *   one node (N = 1)  ncclReduceScatter / ncclAllGather straight between
 *                     the caller's buffers (local rank order is rank order
 *                     there; else through V); integer AVG: a division kernel
 *   ring, flat (L = 1, positions = ranks)  the ring alone: RS reads
 *                     sendbuf (V: a scaled copy, or GPUDirect's scratch),
 *                     AG works in recvbuf
 *   single            a copy (times the scalar)
 *
 * Staged pieces: piece k is elements [kP, kP+P) of each of the N blocks,
 * copied into one pinned buffer side by side (N copies), so that the ring
 * phase sees N blocks of P; the two buffers alternate, so the copies of
 * one piece overlap the ring of the other. V is reused between calls: the
 * stream of a call waits for the event recorded behind the previous call's
 * last use of it (the gate stream's uses all precede that call's back
 * event).
 */
#include "core/coll_dev_priv.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "core/comm.h"
#include "core/ringdrv.h"

/* ------------------------------------------------------------------------ */
/* Caller's thread                                                            */
/* ------------------------------------------------------------------------ */

/* The rank whose block sits at V's (l, m) on this plan. */
static int blk_rank(const struct hcoll_comm *c, int plan, int l, int m)
{
    if (plan == HC_PLAN_3STAGE)
        return hc_comm_rank_at(c, m, l);
    if (plan == HC_PLAN_INTRA)
        return hc_comm_rank_at(c, c->node, l);
    return m;
}

/* Local rank order is rank order (one node): no permutation needed. */
static int intra_identity(const struct hcoll_comm *c)
{
    for (int l = 0; l < c->local_size; l++)
        if (hc_comm_rank_at(c, c->node, l) != l)
            return 0;
    return 1;
}

/* V of at least bytes, for a call on stream: after the previous call's
 * last use of it. */
static hcoll_status_t v_get(hc_coll_dev_t *d, size_t bytes, void *stream, unsigned char **out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    if (!d->v_free)
        HC_CHECK(hc_gdr_dev_event_new(d->gpu, &d->v_free), out);
    else
        HC_CHECK(hc_gdr_dev_stream_wait_event(d->gpu, stream, d->v_free), out);
    if (bytes > d->v_cap) {
        void *nv = NULL;
        HC_CHECK(hc_gdr_dev_alloc(d->gpu, bytes, &nv), out);
        if (d->v_buf)
            hc_gdr_dev_free_async(d->gpu, d->v_buf, stream); /* behind its last use */
        d->v_buf = nv;
        d->v_cap = bytes;
    }
    *out = d->v_buf;
out:
    return st;
}

/* Copies between the caller's rank-ordered blocks and V, on stream. */
static hcoll_status_t v_permute(hc_coll_dev_t *d, unsigned char *V, const unsigned char *rbuf,
                                unsigned char *wbuf, size_t B, size_t es, int N, void *stream)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st = HCOLL_SUCCESS;
    for (int l = 0; l < c->local_size && st == HCOLL_SUCCESS; l++)
        for (int m = 0; m < N && st == HCOLL_SUCCESS; m++) {
            unsigned char *v = V + ((size_t)l * (size_t)N + (size_t)m) * B * es;
            size_t r = (size_t)blk_rank(c, d->plan, l, m);
            st = rbuf ? hc_gdr_dev_copy_async(d->gpu, v, rbuf + r * B * es, B * es, stream)
                      : hc_gdr_dev_copy_async(d->gpu, wbuf + r * B * es, v, B * es, stream);
        }
    return st;
}

/* The stream side of the three-stage and ring plans: stage ① (RS) or the
 * ready copy (AG), the ready event, the gated ring, stage ③ (AG). */
static hcoll_status_t rsag_ring_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, const void *sendbuf,
                                        void *recvbuf, void *stream)
{
    struct hcoll_comm *c = d->c;
    const size_t es = hcoll_dtype_size(o->dtype), B = o->count;
    const int three = d->plan == HC_PLAN_3STAGE, rs = o->kind == HC_DEV_RS;
    const int N = three ? c->nnodes : c->nranks, L = three ? c->local_size : 1;
    const size_t all = (size_t)N * (size_t)L * B;
    unsigned char *V = NULL, *send = (unsigned char *)sendbuf, *recv = recvbuf;
    hcoll_status_t st;
    o->nblk = N;
    o->pos = three ? c->node : c->rank;
    if (three || (rs && (d->gdr || o->ro.dev_scale)))
        HC_CHECK(v_get(d, all * es, stream, &V), out);
    if (three) {
        unsigned char *shard = V + (size_t)c->local_rank * (size_t)N * B * es;
        if (rs) {
            HC_CHECK(v_permute(d, V, send, NULL, B, es, N, stream), out);
            HC_CHECK(hc_redop_intra_scale(d->nccl, &o->ro, o->dtype, 1), out);
            st = d->nccl->ops->reduce_scatter(d->nccl, V, V, all, o->dtype, o->op, stream);
            hc_redop_intra_scale(d->nccl, &o->ro, o->dtype, 0);
            if (st != HCOLL_SUCCESS)
                goto out;
        } else {
            HC_CHECK(hc_gdr_dev_copy_async(d->gpu, shard + (size_t)o->pos * B * es, send, B * es,
                                           stream),
                     out);
        }
        o->rsrc = o->rdst = shard;
    } else if (rs) {
        if (o->ro.dev_scale)
            HC_CHECK(hc_dev_prescale(d, o, send, V, all, stream), out);
        o->rsrc = o->ro.dev_scale ? V : send;
        o->rdst = d->gdr ? V : NULL;
    } else {
        if (send != recv + (size_t)c->rank * B * es)
            HC_CHECK(hc_gdr_dev_copy_async(d->gpu, recv + (size_t)c->rank * B * es, send,
                                           B * es, stream),
                     out);
        o->rsrc = o->rdst = recv;
    }
    HC_CHECK(hc_gdr_dev_event_mark(d->gpu, stream, &o->seg[0].ev_ready), out);
    /* The ring's copies or reductions on the gate stream, the stream waits
     * on an event (coll_dev_gated.c). */
    const size_t P = d->stage_bytes / es / (size_t)N;
    if (P == 0 && !d->gdr)
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_UNSUPPORTED,
                        "%d ring positions do not fit one staging buffer of %zu bytes; "
                        "raise HCOLL_CHUNK_BYTES (the buffers are a multiple of it)",
                        N, d->stage_bytes);
    else
        st = hc_dev_gated_rsag_enqueue(d, o, stream, P);
    if (st != HCOLL_SUCCESS) {
        hc_gdr_dev_event_free(d->gpu, o->seg[0].ev_ready);
        goto out;
    }
    /* o->nseg = 1: from here on the executor must open the gates */
    if (o->status != HCOLL_SUCCESS)
        return HCOLL_SUCCESS;
    if (three && !rs) {
        st = d->nccl->ops->all_gather(d->nccl, V, all, o->dtype, stream);
        if (st == HCOLL_SUCCESS)
            st = v_permute(d, V, NULL, recv, B, es, N, stream);
        o->status = st;
    }
    if (V && hc_gdr_dev_event_record(d->gpu, d->v_free, stream) != HCOLL_SUCCESS &&
        o->status == HCOLL_SUCCESS)
        o->status = HCOLL_ERR_CUDA;
    return HCOLL_SUCCESS;
out:
    return st;
}

/* One node: NCCL straight between the caller's buffers (a base pointer
 * that puts local rank l's shard at recvbuf; NCCL touches only the
 * shard), or through V when local rank order is not rank order. */
static hcoll_status_t rsag_intra_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, const void *sendbuf,
                                         void *recvbuf, void *stream)
{
    struct hcoll_comm *c = d->c;
    const size_t es = hcoll_dtype_size(o->dtype), B = o->count;
    const size_t all = (size_t)c->local_size * B, mine = (size_t)c->local_rank * B * es;
    const int ident = intra_identity(c);
    const unsigned char *send = sendbuf;
    unsigned char *recv = recvbuf, *V = NULL;
    hcoll_status_t st;
    if (!ident)
        HC_CHECK(v_get(d, all * es, stream, &V), out);
    if (o->kind == HC_DEV_RS) {
        if (V)
            HC_CHECK(v_permute(d, V, send, NULL, B, es, 1, stream), out);
        unsigned char *base = (unsigned char *)((uintptr_t)recv - mine);
        HC_CHECK(hc_redop_intra_scale(d->nccl, &o->ro, o->dtype, 1), out);
        st = d->nccl->ops->reduce_scatter(d->nccl, V ? V : send, base, all, o->dtype, o->op,
                                          stream);
        hc_redop_intra_scale(d->nccl, &o->ro, o->dtype, 0);
        if (st == HCOLL_SUCCESS && o->op == HCOLL_AVG)
            st = hc_gdr_dev_avg_async(d->gpu, recv, B, o->dtype, c->nranks, stream);
    } else {
        unsigned char *g = V ? V : recv;
        if (send != g + mine)
            HC_CHECK(hc_gdr_dev_copy_async(d->gpu, g + mine, send, B * es, stream), out);
        st = d->nccl->ops->all_gather(d->nccl, g, all, o->dtype, stream);
        if (st == HCOLL_SUCCESS && V)
            st = v_permute(d, V, NULL, recv, B, es, 1, stream);
    }
    if (st == HCOLL_SUCCESS && V)
        st = hc_gdr_dev_event_record(d->gpu, d->v_free, stream);
out:
    return st;
}

hcoll_status_t hc_coll_dev_rsag_enqueue(hc_coll_dev_t *d, int rs, const void *sendbuf,
                                        void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                        hcoll_op_t op, const hc_redop_t *ro, void *stream,
                                        hc_dev_op_t **op_out)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st;
    *op_out = NULL;
    hc_dev_op_t *o = calloc(1, sizeof *o + sizeof o->seg[0]);
    if (!o)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a device operation");
    o->kind = rs ? HC_DEV_RS : HC_DEV_AG;
    o->dtype = dtype;
    o->op = rs ? ro->op : HCOLL_SUM;
    if (rs)
        o->ro = *ro;
    o->count = count;
    o->sendbuf = sendbuf;
    o->recvbuf = recvbuf;
    o->fp_count = count;
    o->fp_dtype = dtype;
    o->fp_op = rs ? (int)ro->op * 2 + (ro->scaled != 0) : -1;
    HC_CHECK(hc_coll_check_rsag(c, rs ? HC_COLL_REDUCE_SCATTER : HC_COLL_ALLGATHER, sendbuf,
                                recvbuf, count, dtype, o->op),
             clean_op);
    int agree = 1;
    if (count == 0) { /* the node's check still runs: the others may not be empty */
        if (d->ready)
            HC_CHECK(hc_dev_local_agree(d, o, &agree), clean_op);
        *op_out = o;
        return HCOLL_SUCCESS;
    }
    HC_CHECK(hc_dev_prepare(d, sendbuf, recvbuf, count, dtype, o->op, stream), clean_op);
    /* Before NCCL sees the arguments (coll_dev.c, "Argument agreement"):
     * on a disagreement nothing goes on the stream, and the worker's
     * check fails the call on every rank. */
    HC_CHECK(hc_dev_local_agree(d, o, &agree), clean_op);
    if (!agree) {
        *op_out = o;
        return HCOLL_SUCCESS;
    }
    if (rs)
        HC_CHECK(hc_redop_dev_plan(c, &o->ro, &o->op, op, plan_needs_nccl(d->plan),
                                   d->plan == HC_PLAN_SINGLE, d->gdr, d->gpu->kern != NULL,
                                   d->gpu->kern_why),
                 clean_op);
    void *ev_done;
    HC_CHECK(hc_dev_call_begin(d, stream, &ev_done), clean_op);
    const size_t bytes = count * hcoll_dtype_size(dtype);
    switch (d->plan) {
    case HC_PLAN_SINGLE:
        if (o->ro.dev_scale)
            st = hc_dev_prescale(d, o, sendbuf, recvbuf, count, stream);
        else
            st = sendbuf != recvbuf ? hc_gdr_dev_copy_async(d->gpu, recvbuf, sendbuf, bytes,
                                                            stream)
                                    : HCOLL_SUCCESS;
        break;
    case HC_PLAN_INTRA:
        st = rsag_intra_enqueue(d, o, sendbuf, recvbuf, stream);
        break;
    default:
        st = rsag_ring_enqueue(d, o, sendbuf, recvbuf, stream);
        break;
    }
    HC_CHECK(hc_dev_call_end(d, stream, ev_done, st), clean_op);
    *op_out = o;
    return o->status;

clean_op:
    free(o);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Worker                                                                     */
/* ------------------------------------------------------------------------ */

/* One ring phase over n blocks of cnt elements from src into dst (host
 * staging, or device memory: dev); a void as ring_run (coll_dev_host.c). */
static hcoll_status_t rsag_ring(hc_coll_dev_t *d, const hc_dev_op_t *o, const void *src,
                                void *dst, size_t cnt, int dev, hc_dev_run_t *run)
{
    struct hcoll_comm *c = d->c;
    const hc_ringdrv_op_t rop = { src, dst, cnt * (size_t)o->nblk, o->dtype, o->op, c->nranks,
                                  dev, 0, 0,
                                  o->kind == HC_DEV_RS ? HC_RING_PHASE_RS : HC_RING_PHASE_AG, 0 };
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank,
                                   o->kind == HC_DEV_RS ? "the reduce-scatter's ring"
                                                        : "the all-gather's ring",
                                   NULL, NULL };
    const uint64_t voided = hc_ring_voided(d->ring);
    const double t0 = hc_now_us();
    hcoll_status_t st = hc_ringdrv_run(d->ring, &rop, &env);
    run->ring_us += hc_now_us() - t0;
    return hc_coll_rail_ran(d->c->coll, st, voided, &run->v);
}

/* The worker's side of a gated reduce-scatter or all-gather. */
hcoll_status_t hc_dev_rsag_gated(hc_coll_dev_t *d, hc_dev_op_t *o, hcoll_status_t st,
                                 hc_dev_run_t *run)
{
    hc_gdr_dev_t *gpu = d->gpu;
    const hc_dev_seg_t *g = &o->seg[0];
    const int rs = o->kind == HC_DEV_RS, N = o->nblk;
    const size_t es = hcoll_dtype_size(o->dtype), B = o->count;
    hc_gdr_gate_release(d->gate, o->gate_start);
    if (st == HCOLL_SUCCESS)
        st = hc_dev_wait_stream(d, g->ev_ready, "the caller's stream before the ring");
    if (st == HCOLL_SUCCESS && d->gdr) {
        /* Only a reduce-scatter has reductions to gate. */
        hc_dev_gdr_seg_t x = { 0 };
        if (rs)
            st = hc_dev_gdr_seg_begin(d, g, &x);
        if (st == HCOLL_SUCCESS)
            st = rsag_ring(d, o, o->rsrc, o->rdst, B, 1, run);
        if (rs && x.landed)
            hc_dev_gdr_seg_end(d, &x);
    } else if (st == HCOLL_SUCCESS) {
        const size_t P = d->stage_bytes / es / (size_t)N;
        hc_devstage_t it;
        hc_devstage_init(&it, (size_t)g->npc);
        for (;;) {
            hc_devstage_step_t step = hc_devstage_next(&it);
            if (step.kind == HC_DEVSTAGE_DONE || st != HCOLL_SUCCESS)
                break;
            const size_t off = step.piece * P, p = B - off < P ? B - off : P;
            unsigned char *host = gpu->stage[step.buf];
            if (step.kind == HC_DEVSTAGE_WAIT) {
                st = hc_dev_wait_stream(d, o->pc[step.piece].ev_in, "a copy into staging");
            } else if (step.kind == HC_DEVSTAGE_RING) {
                if (rs && o->ro.host_scale)
                    hc_redop_scale_host(&o->ro, host, NULL, p * (size_t)N, o->dtype);
                st = rsag_ring(d, o, host, host, p, 0, run);
            } else if (step.kind == HC_DEVSTAGE_H2D) {
                hc_gdr_gate_release(d->gate, o->pc[step.piece].gate);
            }
        }
    }
    hc_gdr_gate_release(d->gate, o->gate_hi); /* always, in order */
    if (o->ev_tail) {
        hcoll_status_t w = hc_gdr_event_wait(gpu->cu, o->ev_tail, (int)d->c->params.timeout_ms,
                                             0, &d->rp, "hcoll's gate stream after the call");
        if (st == HCOLL_SUCCESS)
            st = w;
    }
    return st;
}
