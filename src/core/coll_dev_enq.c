/*
 * The device path's caller side (design: coll_dev.c): validation, the
 * first call's set-up, and the GPU stages of each plan on the caller's
 * stream, with the gated parts that join them to the host stage.
 */
#include "core/coll_dev_priv.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"
#include "core/comm.h"
#include "core/ringdrv.h"
#include "gdr/gdr.h"
#include "gdr/mem.h"

/* ------------------------------------------------------------------------ */
/* Enqueue (caller's thread)                                                  */
/* ------------------------------------------------------------------------ */

static hcoll_status_t dev_validate(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                                   size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                   void *stream, int *dev_out)
{
    struct hcoll_comm *c = d->c;
    /* Device buffers must be given even for count 0: their GPU is checked. */
    hcoll_status_t ast = hc_coll_check_args(c, sendbuf, recvbuf, count, dtype, op, 1);
    if (ast != HCOLL_SUCCESS)
        return ast;
    char why[200];
    if (!hc_gdr_cu(why, sizeof why))
        return hc_err_set(&c->err, HC_GDR, c->rank,
                          stream ? HCOLL_ERR_UNSUPPORTED : HCOLL_ERR_INVALID_ARG,
                          "a CUDA stream was given, but device buffers cannot be used here: %s",
                          why);
    int sdev = -1, rdev = -1;
    int sk = hc_gdr_ptr_kind(sendbuf, &sdev), rk = hc_gdr_ptr_kind(recvbuf, &rdev);
    /* NULL with device buffers is the legacy default stream, as
     * CU_STREAM_LEGACY (hcoll.h): it reaches the driver as it is. */
    if (hc_gdr_stream_per_thread(stream))
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "stream is CU_STREAM_PER_THREAD (0x2, cudaStreamPerThread), which "
                          "names a different stream on each thread, and parts of the call are "
                          "enqueued by hcoll's and NCCL's threads: pass a stream of your own "
                          "(cudaStreamCreate), or NULL / CU_STREAM_LEGACY (0x1) for the legacy "
                          "default stream");
    if (sk == HC_MEM_HOST || rk == HC_MEM_HOST)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          stream ? "a CUDA stream was given but %s is host memory: with a "
                                   "stream both buffers must be device (or managed) memory; "
                                   "pass stream = NULL for host buffers"
                                 : "%s is host memory but the other buffer is device memory: "
                                   "both must be device (or managed) memory, or both host",
                          sk == HC_MEM_HOST ? "sendbuf" : "recvbuf");
    if (sdev != rdev)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "sendbuf is on GPU %d but recvbuf on GPU %d", sdev, rdev);
    if (c->gpu >= 0 && sdev != c->gpu)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "the buffers are on GPU %d, but this communicator's GPU is %d (the "
                          "current device at hcoll_comm_init)",
                          sdev, c->gpu);
    if (d->ready && sdev != d->dev)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "the buffers are on GPU %d, but this communicator uses GPU %d (the "
                          "device of its first device-buffer call; no device was current at "
                          "hcoll_comm_init)",
                          sdev, d->dev);
    if (d->plan == HC_PLAN_INTRA && op == HCOLL_AVG && d->ready && !d->gpu->kern)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_UNSUPPORTED,
                          "AVG on device buffers within one node needs the division kernel: %s",
                          d->gpu->kern_why);
    *dev_out = sdev;
    return HCOLL_SUCCESS;
}


/* Scaled ops without an NCCL stage (o->ro.dev_scale): recvbuf = scalar *
 * sendbuf on stream, which the next stage then reads in place. */
hcoll_status_t hc_dev_prescale(hc_coll_dev_t *d, const hc_dev_op_t *o, const void *sendbuf,
                               void *recvbuf, size_t count, void *stream)
{
    uint64_t kbits = 0;
    memcpy(&kbits, &o->ro.scalar, sizeof o->ro.scalar < 8 ? sizeof o->ro.scalar : 8);
    return hc_gdr_dev_scale_async(d->gpu, recvbuf, sendbuf, count, o->dtype, o->ro.dev_scalar,
                                  kbits, stream);
}

/* Stage ③ of segment k of a gated three-stage call, after its wait. */
typedef struct ag_arg {
    void *recvbuf;
    size_t count, segc;
} ag_arg_t;

static hcoll_status_t gated_ag(hc_coll_dev_t *d, hc_dev_op_t *o, size_t k, void *stream,
                               void *arg)
{
    const ag_arg_t *a = arg;
    const size_t es = hcoll_dtype_size(o->dtype), off = k * a->segc;
    const size_t n = a->count - off < a->segc ? a->count - off : a->segc;
    hc_dev_tev_mark(d, o, 2 + 2 * (int)k, stream);
    hcoll_status_t st =
        d->nccl->ops->all_gather(d->nccl, (char *)a->recvbuf + off * es, n, o->dtype, stream);
    hc_dev_tev_mark(d, o, 3 + 2 * (int)k, stream);
    return st;
}

/*
 * The stream side of the ring plans: every segment's RS and ready event
 * first (three stages only), then the gated copies or reductions, and per
 * segment the wait for its event and its AG (coll_dev_gated.c). Once a
 * gate is issued the worker must open it, so a later failure is kept in
 * o->status instead of returned: the operation still goes to the executor.
 */
static hcoll_status_t staged_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, const void *sendbuf,
                                     void *recvbuf, size_t count, size_t segc, size_t nseg,
                                     void *stream)
{
    struct hcoll_comm *c = d->c;
    const size_t es = hcoll_dtype_size(o->dtype);
    const int three = d->plan == HC_PLAN_3STAGE;
    hcoll_status_t st = HCOLL_SUCCESS;
    size_t made = 0; /* segments with a recorded ready event */
    if (three)
        hc_dev_tev_mark(d, o, 0, stream);
    for (; made < nseg; made++) {
        hc_dev_seg_t *g = &o->seg[made];
        size_t off = made * segc, n = count - off < segc ? count - off : segc;
        size_t soff = 0, slen = n;
        if (three) {
            HC_CHECK(d->nccl->ops->reduce_scatter(d->nccl, (const char *)sendbuf + off * es,
                                                  (char *)recvbuf + off * es, n, o->dtype, o->op,
                                                  stream),
                     clean_ready);
            hc_intra_shard(n, c->local_size, c->local_rank, &soff, &slen);
            g->src = (const unsigned char *)recvbuf + (off + soff) * es;
        } else if (o->ro.dev_scale) {
            HC_CHECK(hc_dev_prescale(d, o, sendbuf, recvbuf, count, stream), clean_ready);
            g->src = recvbuf;
        } else {
            g->src = sendbuf;
        }
        g->dst = (unsigned char *)recvbuf + (off + soff) * es;
        g->count = slen;
        HC_CHECK(hc_gdr_dev_event_mark(d->gpu, stream, &g->ev_ready), clean_ready);
    }
    if (three)
        hc_dev_tev_mark(d, o, 1, stream);
    /* The copies through staging (or, GPUDirect, the ring's reductions)
     * go on the gate stream, and the caller's stream waits for events only
     * (coll_dev_gated.c). */
    ag_arg_t a = { recvbuf, count, segc };
    st = hc_dev_gated_enqueue(d, o, nseg, stream, three ? gated_ag : NULL, &a);
    if (st != HCOLL_SUCCESS)
        goto clean_ready;
    return HCOLL_SUCCESS;

clean_ready:
    for (size_t k = 0; k < made; k++)
        hc_gdr_dev_event_free(d->gpu, o->seg[k].ev_ready);
    hc_dev_tev_free(d, o);
    return st;
}

/* Put the plan's GPU stages on stream (context pushed). */
static hcoll_status_t plan_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, const void *sendbuf,
                                   void *recvbuf, size_t count, size_t segc, size_t nseg,
                                   void *stream)
{
    struct hcoll_comm *c = d->c;
    const size_t es = hcoll_dtype_size(o->dtype);
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_intra_t *scaler = plan_needs_nccl(d->plan) ? d->nccl : NULL; /* PreMulSum, redop.h */
    HC_CHECK(hc_redop_intra_scale(scaler, &o->ro, o->dtype, 1), out);
    switch (d->plan) {
    case HC_PLAN_SINGLE:
        if (o->ro.dev_scale)
            st = hc_dev_prescale(d, o, sendbuf, recvbuf, count, stream);
        else if (sendbuf != recvbuf)
            st = hc_gdr_dev_copy_async(d->gpu, recvbuf, sendbuf, count * es, stream);
        break;
    case HC_PLAN_INTRA: {
        const hc_intra_ops_t *iops = d->nccl->ops;
        hc_dev_tev_mark(d, o, 0, stream);
        o->fused = 1;
        HC_CHECK(iops->allreduce(d->nccl, sendbuf, recvbuf, count, o->dtype, o->op, stream),
                 out);
        if (o->op == HCOLL_AVG)
            HC_CHECK(hc_gdr_dev_avg_async(d->gpu, recvbuf, count, o->dtype, c->nranks, stream),
                     out);
        hc_dev_tev_mark(d, o, 1, stream);
        break;
    }
    case HC_PLAN_RING:
    case HC_PLAN_FLAT:
    case HC_PLAN_3STAGE:
        st = staged_enqueue(d, o, sendbuf, recvbuf, count, segc, nseg, stream);
        break;
    }
    hc_redop_intra_scale(scaler, &o->ro, o->dtype, 0); /* clearing cannot fail */
out:
    return st;
}

/* The first device call sets the path up (collective). Asked before the
 * set-up as well (with the caller's context, which owns the stream), so
 * that a capture is refused as such and not turned into a set-up failure,
 * which would be sticky. */
static hcoll_status_t dev_first_call(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                                     size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                     void *stream, int dev)
{
    hcoll_status_t st;
    HC_CHECK(hc_gdr_stream_refuse_capture(hc_gdr_cu(NULL, 0), stream, &d->rp), out);
    HC_CHECK(hc_coll_dev_setup(d, dev), out);
    st = dev_validate(d, sendbuf, recvbuf, count, dtype, op, stream, &dev);
out:
    return st;
}

hcoll_status_t hc_dev_prepare(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                              size_t count, hcoll_dtype_t dtype, hcoll_op_t op, void *stream)
{
    struct hcoll_comm *c = d->c;
    int dev = -1;
    hcoll_status_t st = dev_validate(d, sendbuf, recvbuf, count, dtype, op, stream, &dev);
    if (st != HCOLL_SUCCESS)
        return st;
    if (d->setup_failed != HCOLL_SUCCESS)
        return hc_err_set(&c->err, HC_COLL, c->rank, d->setup_failed,
                          "the device path could not be set up earlier (%s)",
                          hcoll_strerror(d->setup_failed));
    if (!d->ready)
        return dev_first_call(d, sendbuf, recvbuf, count, dtype, op, stream, dev);
    return HCOLL_SUCCESS;
}

/*
 * Managed memory on a GPUDirect ring: neither dma-buf nor nvidia-peermem
 * pins it, and every other rank runs the ring on device memory, so this
 * call runs on device memory of hcoll's own, copied in and out on the
 * caller's stream and given back behind the copy out (gdr/mem.h): the
 * one staging of managed buffers, for every device call that takes the
 * ring. Costs two copies per call: pass cuMemAlloc'd buffers for speed.
 * The op's count and dtype say the size; plan enqueues the call on the
 * copy.
 */
typedef hcoll_status_t (*plan_fn)(hc_coll_dev_t *d, hc_dev_op_t *o, const void *sendbuf,
                                  void *recvbuf, void *stream);
static hcoll_status_t managed_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, const void *sendbuf,
                                      void *recvbuf, void *stream, plan_fn plan)
{
    const size_t bytes = o->count * hcoll_dtype_size(o->dtype);
    hc_gdr_dev_t *gpu = d->gpu;
    hc_cu_dptr_t t = 0;
    hc_cu_res_t r = hc_gdr_dbuf_get(gpu->cu, gpu->cudev, bytes, &t);
    if (r != HC_CU_SUCCESS)
        return hc_gdr_cu_fail(&d->rp, r, "cuMemAlloc (staging a managed buffer for the "
                                         "GPUDirect ring)");
    void *tp = (void *)(uintptr_t)t;
    hcoll_status_t st = hc_gdr_dev_copy_async(gpu, tp, sendbuf, bytes, stream);
    if (st == HCOLL_SUCCESS)
        st = plan(d, o, tp, tp, stream);
    if (st == HCOLL_SUCCESS) {
        /* Gates are issued: a failure now is the operation's, not the call's. */
        hcoll_status_t out = hc_gdr_dev_copy_async(gpu, recvbuf, tp, bytes, stream);
        if (o->status == HCOLL_SUCCESS)
            o->status = out;
    }
    if (hc_gdr_dbuf_put(gpu->cu, gpu->cudev, t, stream) < 0)
        HC_WARN(HC_GDR, d->c->rank, "a managed buffer's device copy could not be given back; "
                "%zu bytes left allocated", bytes);
    return st;
}

/* The all-reduce's plan, on a managed buffer's copy. */
static hcoll_status_t ar_plan(hc_coll_dev_t *d, hc_dev_op_t *o, const void *sendbuf,
                              void *recvbuf, void *stream)
{
    const size_t nseg = (o->count + o->segc - 1) / o->segc;
    return plan_enqueue(d, o, sendbuf, recvbuf, o->count, o->segc, nseg, stream);
}

static int is_managed(const void *p)
{
    return hc_gdr_ptr_kind(p, NULL) == HC_MEM_MANAGED;
}

hcoll_status_t hc_coll_dev_enqueue(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                                   size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                   const hc_redop_t *ro, void *stream, hc_dev_op_t **op_out)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st;
    *op_out = NULL;
    const size_t es = hcoll_dtype_size(dtype);
    size_t segc = count, nseg = 1;
    if (d->plan == HC_PLAN_3STAGE && es) {
        segc = hc_devsched_segment_count(count, es, d->stage_bytes, c->local_size);
        nseg = (count + segc - 1) / segc;
    }
    hc_dev_op_t *o = calloc(1, sizeof *o + nseg * sizeof o->seg[0]);
    if (!o)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a device operation");
    o->dtype = dtype;
    o->op = ro->op;
    o->ro = *ro;
    if (count == 0) {
        /* Nothing moves; the request still completes in order. */
        if ((st = hc_coll_check_args(c, sendbuf, recvbuf, 0, dtype, o->op, 0)) != HCOLL_SUCCESS) {
            free(o);
            return st;
        }
        *op_out = o;
        return HCOLL_SUCCESS;
    }
    HC_CHECK(hc_dev_prepare(d, sendbuf, recvbuf, count, dtype, o->op, stream), clean_op);
    HC_CHECK(hc_redop_dev_plan(c, &o->ro, &o->op, op, plan_needs_nccl(d->plan),
                               d->plan == HC_PLAN_SINGLE, d->gdr, d->gpu->kern != NULL,
                               d->gpu->kern_why),
             clean_op);

    void *ev_done;
    HC_CHECK(hc_dev_call_begin(d, stream, &ev_done), clean_op);
    o->count = count;
    o->segc = segc;
    if (d->gdr && (is_managed(sendbuf) || is_managed(recvbuf)))
        st = managed_enqueue(d, o, sendbuf, recvbuf, stream, ar_plan);
    else
        st = plan_enqueue(d, o, sendbuf, recvbuf, count, segc, nseg, stream);
    if (st != HCOLL_SUCCESS)
        hc_dev_tev_free(d, o);
    HC_CHECK(hc_dev_call_end(d, stream, ev_done, st), clean_op);
    *op_out = o;
    return o->status;

clean_op:
    free(o);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Broadcast                                                                  */
/* ------------------------------------------------------------------------ */

/* Stage ③ of a three-stage broadcast on a node without the root: the
 * shards the rail rings brought, gathered, after the wait for the ring. */
static hcoll_status_t bcast_ag(hc_coll_dev_t *d, hc_dev_op_t *o, size_t k, void *stream,
                               void *arg)
{
    (void)k;
    (void)arg;
    return d->nccl->ops->all_gather(d->nccl, o->recvbuf, o->count, o->dtype, stream);
}

/*
 * The stream side of a device broadcast of o->count elements of o->dtype
 * from o->sendbuf (the root's; else recvbuf) into o->recvbuf, all at call
 * time on the caller's thread, so that the caller's NCCL communicator
 * serves it in call order as the other device calls:
 *   single   the root's copy
 *   intra    ncclBroadcast
 *   ring     root's copy, ready event, the chain over all ranks from the
 *   flat     root through the gate stream (staged copies around it, or
 *            GPUDirect on device memory), the wait for its event
 *   3stage   root's node: ncclBroadcast (each local rank then holds its
 *            shard); local rank i chains shard i along rail i from the
 *            root's node, as above; other nodes: ncclAllGather of the
 *            shards after the wait
 * The chain waits on the worker for every rank's agreement on the root and
 * the size (coll.c): a mismatch opens the gates without running it, and
 * the staged copies then put back what they took.
 */
static hcoll_status_t bcast_plan_enqueue(hc_coll_dev_t *d, hc_dev_op_t *o, const void *sendbuf,
                                         void *recvbuf, void *stream)
{
    struct hcoll_comm *c = d->c;
    const size_t es = hcoll_dtype_size(o->dtype), n = o->count;
    const int root_node = c->node_of[o->root], three = d->plan == HC_PLAN_3STAGE;
    const int is_root = c->rank == o->root;
    unsigned char *buf = recvbuf;
    hcoll_status_t st = HCOLL_SUCCESS;
    o->sendbuf = sendbuf;
    o->recvbuf = recvbuf;
    if (d->plan == HC_PLAN_INTRA || (three && c->node == root_node))
        HC_CHECK(d->nccl->ops->bcast(d->nccl, sendbuf, buf, n, o->dtype, c->local_of[o->root],
                                     stream),
                 out);
    else if (is_root && sendbuf != buf)
        HC_CHECK(hc_gdr_dev_copy_async(d->gpu, buf, sendbuf, n * es, stream), out);
    if (!plan_stages(d->plan))
        return HCOLL_SUCCESS;
    size_t soff = 0, slen = n;
    if (three)
        hc_intra_shard(n, c->local_size, c->local_rank, &soff, &slen);
    /* Rail rings have one rank per node, in node order; else positions are
     * ranks. */
    o->chain_root = three ? root_node : o->root;
    hc_dev_seg_t *g = &o->seg[0];
    g->src = g->dst = buf + soff * es;
    g->count = slen;
    HC_CHECK(hc_gdr_dev_event_mark(d->gpu, stream, &g->ev_ready), out);
    st = hc_dev_gated_enqueue(d, o, 1, stream, three && c->node != root_node ? bcast_ag : NULL,
                              NULL);
    if (st != HCOLL_SUCCESS)
        hc_gdr_dev_event_free(d->gpu, g->ev_ready);
out:
    return st;
}

/*
 * A device broadcast: checks, then its GPU stages and the gated chain on
 * the stream at call time (bcast_plan_enqueue). Nothing waits for work
 * that hcoll submits later, so a shared hardware queue cannot hold it up.
 */
hcoll_status_t hc_coll_dev_bcast_enqueue(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                                         size_t count, hcoll_dtype_t dtype, int root,
                                         void *stream, hc_dev_op_t **op_out)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st;
    *op_out = NULL;
    const int is_root = c->rank == root;
    HC_CHECK(hc_coll_check_bcast(c, sendbuf, recvbuf, count, dtype, root), out);
    hc_dev_op_t *o = calloc(1, sizeof *o + sizeof o->seg[0]);
    if (!o)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a device operation");
    /* As the host broadcast: the widest integer that divides the size. */
    const size_t bytes = count * hcoll_dtype_size(dtype);
    o->kind = HC_DEV_BCAST;
    o->dtype = bytes % 8 == 0 ? HCOLL_INT64 : bytes % 4 == 0 ? HCOLL_INT32 : HCOLL_UINT8;
    o->op = HCOLL_SUM;
    o->count = bytes / hcoll_dtype_size(o->dtype);
    o->root = root;
    o->sendbuf = is_root ? sendbuf : recvbuf;
    o->recvbuf = recvbuf;
    o->fp_count = bytes;
    o->fp_dtype = -1; /* the bytes count, whatever the dtype */
    o->fp_op = -1;
    int agree = 1;
    if (count == 0) { /* the worker still checks that every rank agrees */
        if (d->ready)
            HC_CHECK(hc_dev_local_agree(d, o, &agree), clean_op);
        *op_out = o;
        return HCOLL_SUCCESS;
    }
    HC_CHECK(hc_dev_prepare(d, o->sendbuf, recvbuf, count, dtype, HCOLL_SUM, stream), clean_op);
    /* Before NCCL sees the root and the size (coll_dev.c, "Argument
     * agreement"): on a disagreement nothing goes on the stream, and the
     * worker's check fails the call on every rank. */
    HC_CHECK(hc_dev_local_agree(d, o, &agree), clean_op);
    if (!agree) {
        *op_out = o;
        return HCOLL_SUCCESS;
    }
    void *ev_done;
    HC_CHECK(hc_dev_call_begin(d, stream, &ev_done), clean_op);
    const void *sb = o->sendbuf;
    if (d->gdr && (is_managed(sb) || is_managed(recvbuf)))
        st = managed_enqueue(d, o, sb, recvbuf, stream, bcast_plan_enqueue);
    else
        st = bcast_plan_enqueue(d, o, sb, recvbuf, stream);
    HC_CHECK(hc_dev_call_end(d, stream, ev_done, st), clean_op);
    *op_out = o;
    return o->status;

clean_op:
    free(o);
out:
    return st;
}
