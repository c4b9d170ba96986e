/*
 * The all-reduce on device buffers: GPU stages on the caller's stream, the
 * inter-node stage on the host, joined by a flag in device memory.
 *
 * Three-stage plan, one call of segments 0..m-1 (flag: a 32-bit word in
 * device memory; s_k: segment k's number, issued in order):
 *
 *   caller's stream ─ RS(0) ev0 RS(1) ev1 … RS(m-1) ─ wait(flag ≥ s_0) AG(0) ─ wait(≥ s_1) AG(1) … ─►
 *                            │          │                    ▲                     ▲
 *   worker thread            ▼          ▼                    │                     │
 *     segment 0: wait ev0 → D2H(0) ┬ ring(0) ┬ … → write(flag = s_0)               │
 *     istream (internal)           └ D2H(1)  └ H2D(0) …                            │
 *     segment 1: wait ev1 → …                                 … → write(flag = s_1)
 *
 * hcoll_allreduce returns once the stream holds every RS, wait and AG: the
 * host never synchronises the caller's stream. Segments pipeline the three
 * stages: the GPU reduce-scatters segment k+1 while the ring all-reduces
 * segment k's shard, and all-gathers segment k while the ring runs k+1.
 * The worker (the executor's thread, coll.c) waits for ev_k by polling,
 * which blocks hcoll's thread only; it stages the rank's shard of the
 * segment through two pinned buffers (copies on an internal stream, so
 * that the ring of piece j overlaps the copies of pieces j±1), all-reduces
 * it with the ring of its rail, copies it back, and then writes s_k to the
 * flag on the internal stream behind the last copy, which lets AG(k) go.
 *
 * Other plans: one rank per node and unequal nodes stage the whole vector
 * (no NCCL); one node is ncclAllReduce on the stream; one rank is a device
 * copy. Scaled ops (AVG of floats, PREMUL_SUM) scale where the input is
 * first read (redop.h); integer AVG divides once at the end.
 *
 * Failure: a stream waiting on the flag must never hang. A host stage that
 * fails still writes its s (the result is then undefined, the error is
 * sticky and reported by the request and hcoll_comm_get_async_error), and
 * destroy/abort writes the last issued s before freeing the flag, after
 * waiting (up to the timeout) for every stream to pass it; if one does not,
 * the flag's memory is left allocated rather than freed under it.
 *
 * Which GPU: the device current at hcoll_comm_init (comm->gpu); buffers on
 * another device are refused. When none was current (CUDA not yet loaded
 * then), the device of the buffers at the first device call. Its primary
 * context (the one the CUDA runtime uses) is retained for the
 * communicator's life.
 */
#include "core/coll_dev.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"
#include "core/coll.h"
#include "core/comm.h"
#include "core/redop.h"
#include "core/ringdrv.h"
#include "gdr/devctx.h"
#include "gdr/event.h"
#include "gdr/gdr.h"
#include "inter/ring.h"
#include "intra/intra.h"

/* After abort, how long destroy waits for streams to pass the flag. */
#define DEV_ABORT_DRAIN_MS 2000

/* ------------------------------------------------------------------------ */
/* State                                                                      */
/* ------------------------------------------------------------------------ */

/* One segment's host stage. */
typedef struct hc_dev_seg {
    void *ev_ready;           /* its stage ① done on the caller's stream */
    uint32_t seq;             /* the flag number the stream waits for */
    const unsigned char *src; /* device range the host stage reads ... */
    unsigned char *dst;       /* ... and writes back */
    size_t count;
} hc_dev_seg_t;

/* Timing events on the caller's stream: [0] before the first RS, [1]
 * after the last; [2+2k], [3+2k] around segment k's AG. One node: [0], [1]
 * around the all-reduce (fused). NULL where one could not be made. */
#define DEV_TEV (2 + 2 * HC_DEVSCHED_SEGMENTS)

struct hc_dev_op {
    hcoll_status_t status; /* an enqueue failure after the first stream wait */
    int nseg;              /* segments with a host stage and a flag number */
    hcoll_dtype_t dtype;
    hcoll_op_t op;
    hc_redop_t ro;         /* scaled ops: where and by what (redop.h) */
    void *tev[DEV_TEV];
    int ntev;              /* slots used */
    int fused;             /* one NCCL all-reduce: its time is split RS/AG */
    hc_dev_seg_t seg[];    /* [nseg] (room for every segment of the call) */
};

struct hc_coll_dev {
    struct hcoll_comm *c;
    hc_gdr_report_t rp; /* the communicator's errbuf, rank and abort flag */
    int plan;
    hc_ring_t *ring;
    hc_allgather_fn node_ag;
    void *node_ag_ctx;
    size_t stage_bytes; /* each of the two buffers */

    /* Set up by the first device call. */
    int ready;
    hcoll_status_t setup_failed; /* sticky */
    int dev;            /* ordinal, -1 before the set-up */
    hc_gdr_dev_t *gpu;  /* context, internal stream, flag, staging, kernels */
    hc_intra_t *nccl;
    int gdr;                  /* stage ② on device memory (GPUDirect ring) */
    hc_ring_devops_t devops;  /* the ring's device operations (ctx = gpu) */

    pthread_mutex_t lock; /* seq */
    hc_devseq_t seq;
    hc_gdr_evlist_t done; /* recorded after each call's last stream work */
};

/* ------------------------------------------------------------------------ */
/* Which calls, and set-up                                                    */
/* ------------------------------------------------------------------------ */

int hc_coll_dev_wanted(const void *sendbuf, const void *recvbuf, void *stream)
{
    if (stream)
        return 1;
    if (!hc_gdr_cuda_in_process())
        return 0;
    /* Managed memory is host-accessible: the host path serves it. */
    return hc_gdr_ptr_kind(sendbuf, NULL) == HC_MEM_DEVICE ||
           hc_gdr_ptr_kind(recvbuf, NULL) == HC_MEM_DEVICE;
}

hcoll_status_t hc_coll_dev_create(struct hcoll_comm *c, int plan, struct hc_ring *ring,
                                  hc_allgather_fn node_ag, void *node_ag_ctx,
                                  size_t piece_bytes, hc_coll_dev_t **out)
{
    hc_coll_dev_t *d = calloc(1, sizeof *d);
    if (!d)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the device path");
    d->c = c;
    d->rp = (hc_gdr_report_t){ &c->err, c->rank, &c->aborted };
    d->plan = plan;
    d->ring = ring;
    d->node_ag = node_ag;
    d->node_ag_ctx = node_ag_ctx;
    d->stage_bytes = hc_devsched_stage_bytes(piece_bytes);
    d->dev = -1;
    pthread_mutex_init(&d->lock, NULL);
    hc_devseq_init(&d->seq, 0);
    hc_gdr_evlist_init(&d->done);
    *out = d;
    return HCOLL_SUCCESS;
}

static int plan_needs_nccl(int plan)
{
    return plan == HC_PLAN_INTRA || plan == HC_PLAN_3STAGE;
}

static int plan_stages(int plan)
{
    return plan == HC_PLAN_RING || plan == HC_PLAN_FLAT || plan == HC_PLAN_3STAGE;
}

typedef struct dev_hello {
    int32_t ok;
    int32_t dev;
    int32_t gdr; /* this rank's ring can take device memory, and kernels loaded */
} dev_hello_t;

/* The ring's device operations (GPUDirect stage ②): the GPU's own. */
static hcoll_status_t devop_alloc(void *ctx, size_t bytes, void **out)
{
    return hc_gdr_dev_alloc(ctx, bytes, out);
}

static void devop_free(void *ctx, void *p)
{
    hc_gdr_dev_free(ctx, p);
}

static hcoll_status_t devop_reduce(void *ctx, void *dst, const void *a, const void *b,
                                   size_t count, hcoll_dtype_t dtype, hcoll_op_t op)
{
    return hc_gdr_dev_reduce(ctx, dst, a, b, count, dtype, op);
}

static hcoll_status_t devop_avg(void *ctx, void *buf, size_t count, hcoll_dtype_t dtype,
                                hcoll_op_t op, int div)
{
    if (op != HCOLL_AVG)
        return HCOLL_SUCCESS;
    return hc_gdr_dev_avg(ctx, buf, count, dtype, div);
}

static hcoll_status_t devop_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    return hc_gdr_dev_copy(ctx, dst, src, bytes);
}

/* Every rank's hello: whether its half of the set-up worked and whether
 * its ring can go GPUDirect. local is this rank's half's status. */
static hcoll_status_t dev_hello(hc_coll_dev_t *d, hcoll_status_t local, int dev, int *all_gdr_out)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st;
    /* GPUDirect stage ②: where the rank's ring takes device memory (verbs
     * with GPUDirect on) and the kernels that reduce there are loaded. */
    int gdr = local == HCOLL_SUCCESS && d->ring && plan_stages(d->plan) && d->gpu->kern &&
              hc_ring_gdr_capable(d->ring);
    dev_hello_t mine = { local == HCOLL_SUCCESS, dev, gdr },
                *all = calloc((size_t)c->nranks, sizeof *all);
    if (!all)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY, "no memory");
    st = hc_boot_allgather(c->boot, &mine, all, sizeof mine);
    if (st == HCOLL_SUCCESS && local != HCOLL_SUCCESS)
        st = local;
    for (int r = 0; st == HCOLL_SUCCESS && r < c->nranks; r++)
        if (!all[r].ok)
            st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_UNSUPPORTED,
                            "rank %d could not set up its GPU for device buffers (its "
                            "hcoll_comm_last_error says why)",
                            r);
    int all_gdr = st == HCOLL_SUCCESS;
    for (int r = 0; all_gdr && r < c->nranks; r++)
        all_gdr = all[r].gdr;
    free(all);
    *all_gdr_out = all_gdr;
    return st;
}

/* Every rank's ring enables device slots (collective over each ring, and
 * every rank is here). A failure leaves host staging. */
static void dev_enable_gdr(hc_coll_dev_t *d)
{
    d->devops = (hc_ring_devops_t){ d->gpu, devop_alloc, devop_free, devop_reduce, devop_avg,
                                    devop_copy };
    hc_gdr_dev_push(d->gpu);
    hcoll_status_t gst = hc_ring_enable_device(d->ring, &d->devops);
    hc_gdr_dev_pop(d->gpu);
    d->gdr = gst == HCOLL_SUCCESS;
    if (!d->gdr)
        HC_WARN(HC_GDR, d->c->rank, "GPUDirect stage 2 not possible (%s); staging through host "
                "memory", hc_errbuf_get(&d->c->err));
}

/* Collective over all ranks: every rank reports whether its half worked,
 * so that one rank's missing GPU fails the call everywhere at once instead
 * of leaving the others in the ring until the timeout. */
static hcoll_status_t dev_setup(hc_coll_dev_t *d, int dev)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st, local;
    char why[200];
    const hc_cu_api_t *cu = hc_gdr_cu(why, sizeof why);
    if (!cu)
        local = hc_err_set(&c->err, HC_GDR, c->rank, HCOLL_ERR_UNSUPPORTED,
                           "device buffers need the CUDA driver: %s", why);
    else
        local = hc_gdr_dev_open(cu, dev, plan_stages(d->plan) ? d->stage_bytes : 0, &d->rp,
                                &d->gpu);
    int all_gdr = 0;
    HC_CHECK(dev_hello(d, local, dev, &all_gdr), clean_gpu);
    d->dev = dev;
    if (plan_needs_nccl(d->plan)) {
        hc_intra_params_t ip = {
            .local_rank = c->local_rank,
            .local_size = c->local_size,
            .name = "nccl",
            .chunk_bytes = c->params.chunk_bytes,
            .timeout_ms = (int)c->params.timeout_ms,
            .errbuf = &c->err,
            .rank = c->rank,
            .allgather = d->node_ag,
            .allgather_ctx = d->node_ag_ctx,
        };
        hc_gdr_dev_push(d->gpu);
        st = hc_intra_nccl_ops.create(&ip, &d->nccl);
        hc_gdr_dev_pop(d->gpu);
        if (st != HCOLL_SUCCESS)
            goto clean_gpu;
    }
    if (all_gdr)
        dev_enable_gdr(d);
    char bdf[32] = "?";
    hc_gdr_gpu_info(dev, bdf, sizeof bdf, NULL, NULL);
    HC_INFO(HC_GDR, c->rank,
            "device buffers: GPU %d (%s), %s, stage 2 %s, reduction kernels %s%s", dev, bdf,
            plan_needs_nccl(d->plan) ? "NCCL intra-node" : "no intra-node stage",
            d->gdr ? "on device memory (GPUDirect RDMA)" : "staged through pinned host memory",
            d->gpu->kern ? "loaded" : "absent: ", d->gpu->kern ? "" : d->gpu->kern_why);
    d->ready = 1;
    return HCOLL_SUCCESS;

clean_gpu:
    hc_gdr_dev_close(local == HCOLL_SUCCESS ? d->gpu : NULL);
    d->gpu = NULL;
    d->dev = -1;
    d->setup_failed = st;
    return st;
}

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
    if (!stream)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "%s is device memory but stream is NULL: pass the CUDA stream to "
                          "order the all-reduce on (NULL is for host buffers)",
                          sk == HC_MEM_DEVICE ? "sendbuf" : "recvbuf");
    if (sk == HC_MEM_HOST || rk == HC_MEM_HOST)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "a CUDA stream was given but %s is host memory: with a stream both "
                          "buffers must be device (or managed) memory; pass stream = NULL for "
                          "host buffers",
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

/* Record timing event i of o on stream. Timing is best effort: an event
 * that cannot be made leaves its stage untimed, never fails the call. */
static void tev_mark(hc_coll_dev_t *d, hc_dev_op_t *o, int i, void *stream)
{
    void *e = hc_gdr_tev_mark(d->gpu->cu, stream);
    if (!e)
        return;
    o->tev[i] = e;
    if (i + 1 > o->ntev)
        o->ntev = i + 1;
}

static void tev_free(hc_coll_dev_t *d, hc_dev_op_t *o)
{
    for (int i = 0; i < o->ntev; i++)
        hc_gdr_dev_event_free(d->gpu, o->tev[i]);
    o->ntev = 0;
}

/* Microseconds between timing events a and b of o, or -1. */
static double tev_us(hc_coll_dev_t *d, const hc_dev_op_t *o, int a, int b)
{
    if (a >= o->ntev || b >= o->ntev)
        return -1;
    return hc_gdr_tev_us(d->gpu->cu, o->tev[a], o->tev[b]);
}

/* Issue the next flag number and make stream wait for it; on failure the
 * number is given back, so that numbers stay dense. */
static hcoll_status_t seq_wait(hc_coll_dev_t *d, void *stream, uint32_t *seq_out)
{
    pthread_mutex_lock(&d->lock);
    uint32_t seq = hc_devseq_issue(&d->seq);
    pthread_mutex_unlock(&d->lock);
    hcoll_status_t st = hc_gdr_dev_stream_wait(d->gpu, stream, seq);
    if (st != HCOLL_SUCCESS) {
        pthread_mutex_lock(&d->lock);
        d->seq.issued--;
        pthread_mutex_unlock(&d->lock);
        return st;
    }
    *seq_out = seq;
    return HCOLL_SUCCESS;
}

/*
 * The stream side of the ring plans: every segment's RS and ready event
 * first (three stages only), then per segment the wait for its flag number
 * and its AG. Once a wait is enqueued the stream depends on the executor
 * releasing that number, so o->nseg counts them and a later failure is
 * kept in o->status instead of returned: the operation still goes to the
 * executor, which releases every number in order.
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
        tev_mark(d, o, 0, stream);
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
        } else {
            g->src = sendbuf;
        }
        g->dst = (unsigned char *)recvbuf + (off + soff) * es;
        g->count = slen;
        HC_CHECK(hc_gdr_dev_event_mark(d->gpu, stream, &g->ev_ready), clean_ready);
    }
    if (three)
        tev_mark(d, o, 1, stream);
    for (size_t k = 0; k < nseg; k++) {
        uint32_t seq;
        st = seq_wait(d, stream, &seq);
        if (st != HCOLL_SUCCESS) {
            if (k == 0)
                goto clean_ready;
            o->status = st;
            break;
        }
        o->seg[k].seq = seq;
        o->nseg = (int)k + 1;
        if (three) {
            size_t off = k * segc, n = count - off < segc ? count - off : segc;
            tev_mark(d, o, 2 + 2 * (int)k, stream);
            st = d->nccl->ops->all_gather(d->nccl, (char *)recvbuf + off * es, n, o->dtype,
                                          stream);
            if (st != HCOLL_SUCCESS) {
                o->status = st;
                break;
            }
            tev_mark(d, o, 3 + 2 * (int)k, stream);
        }
    }
    /* Ready events of segments that will not run. */
    for (size_t k = (size_t)o->nseg; k < made; k++)
        hc_gdr_dev_event_free(d->gpu, o->seg[k].ev_ready);
    return HCOLL_SUCCESS;

clean_ready:
    for (size_t k = 0; k < made; k++)
        hc_gdr_dev_event_free(d->gpu, o->seg[k].ev_ready);
    tev_free(d, o);
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
        if (sendbuf != recvbuf)
            st = hc_gdr_dev_copy_async(d->gpu, recvbuf, sendbuf, count * es, stream);
        break;
    case HC_PLAN_INTRA: {
        const hc_intra_ops_t *iops = d->nccl->ops;
        tev_mark(d, o, 0, stream);
        o->fused = 1;
        HC_CHECK(iops->allreduce(d->nccl, sendbuf, recvbuf, count, o->dtype, o->op, stream),
                 out);
        if (o->op == HCOLL_AVG)
            HC_CHECK(hc_gdr_dev_avg_async(d->gpu, recvbuf, count, o->dtype, c->nranks, stream),
                     out);
        tev_mark(d, o, 1, stream);
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
    HC_CHECK(dev_setup(d, dev), out);
    st = dev_validate(d, sendbuf, recvbuf, count, dtype, op, stream, &dev);
out:
    return st;
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
    int dev = -1;
    HC_CHECK(dev_validate(d, sendbuf, recvbuf, count, dtype, o->op, stream, &dev), clean_op);
    if (d->setup_failed != HCOLL_SUCCESS) {
        st = hc_err_set(&c->err, HC_COLL, c->rank, d->setup_failed,
                        "the device path could not be set up earlier (%s)",
                        hcoll_strerror(d->setup_failed));
        goto clean_op;
    }
    if (!d->ready)
        HC_CHECK(dev_first_call(d, sendbuf, recvbuf, count, dtype, o->op, stream, dev), clean_op);
    HC_CHECK(hc_redop_dev_plan(c, &o->ro, &o->op, op, plan_needs_nccl(d->plan),
                               d->plan == HC_PLAN_SINGLE, d->gdr), clean_op);

    HC_CHECK(hc_gdr_dev_enter(d->gpu), clean_op);
    HC_CHECK(hc_gdr_dev_stream_check(d->gpu, stream), clean_ctx);
    void *ev_done = NULL;
    HC_CHECK(hc_gdr_dev_event_new(d->gpu, &ev_done), clean_ctx);
    HC_CHECK(plan_enqueue(d, o, sendbuf, recvbuf, count, segc, nseg, stream), clean_ev);
    hc_gdr_dev_event_track(d->gpu, ev_done, stream, &d->done, (int)c->params.timeout_ms);
    hc_gdr_dev_pop(d->gpu);
    *op_out = o;
    return o->status;

clean_ev:
    hc_gdr_dev_event_free(d->gpu, ev_done);
    tev_free(d, o);
clean_ctx:
    hc_gdr_dev_pop(d->gpu);
clean_op:
    free(o);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Host stage (worker thread)                                                 */
/* ------------------------------------------------------------------------ */

/* The ring on buf in place (host staging), or from src to dst in device
 * memory (GPUDirect: dev); adds its time to *ring_us. */
static hcoll_status_t ring_run(hc_coll_dev_t *d, const void *src, void *buf, size_t n,
                               const hc_dev_op_t *o, int dev, double *ring_us)
{
    struct hcoll_comm *c = d->c;
    const hc_ringdrv_op_t rop = { dev ? src : buf, buf, n, o->dtype, o->op, c->nranks, dev,
                                  0, 0, HC_RING_PHASE_ALLREDUCE };
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank, "the inter-node stage",
                                   NULL /* NCCL: its own failures */ };
    const double t0 = hc_now_us();
    hcoll_status_t st = hc_ringdrv_run(d->ring, &rop, &env);
    *ring_us += hc_now_us() - t0;
    return st;
}

static hcoll_status_t host_stage(hc_coll_dev_t *d, const hc_dev_op_t *o, const hc_dev_seg_t *g,
                                 double *ring_us)
{
    hc_gdr_dev_t *gpu = d->gpu;
    const int tmo = (int)d->c->params.timeout_ms;
    const size_t es = hcoll_dtype_size(o->dtype);
    const size_t piece = d->stage_bytes / es;
    const size_t npieces = hc_devsched_pieces(g->count, es, d->stage_bytes);
    hcoll_status_t st;
    HC_CHECK(hc_gdr_event_wait(gpu->cu, g->ev_ready, tmo, 1, &d->rp,
                               "the intra-node stage on the caller's stream"),
             out);
    /* GPUDirect: the ring reads and writes the device range itself. */
    if (d->gdr)
        return ring_run(d, g->src, g->dst, g->count, o, 1, ring_us);
    hc_devstage_t it;
    hc_devstage_init(&it, npieces);
    for (;;) {
        hc_devstage_step_t step = hc_devstage_next(&it);
        if (step.kind == HC_DEVSTAGE_DONE)
            break;
        size_t off = step.piece * piece;
        size_t n = g->count - off < piece ? g->count - off : piece;
        switch (step.kind) {
        case HC_DEVSTAGE_D2H:
            HC_CHECK(hc_gdr_dev_stage_in(gpu, step.buf, g->src + off * es, n * es), out);
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
            HC_CHECK(hc_gdr_dev_stage_out(gpu, step.buf, g->dst + off * es, n * es), out);
            break;
        case HC_DEVSTAGE_DONE:
            break;
        }
    }
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
        double us = tev_us(d, o, 0, 1);
        times->intra_rs_us = times->intra_ag_us = us >= 0 ? us / 2 : -1;
        return;
    }
    times->intra_rs_us = tev_us(d, o, 0, 1);
    double ag = 0;
    for (int k = 0; k < o->nseg && ag >= 0; k++) {
        double us = tev_us(d, o, 2 + 2 * k, 3 + 2 * k);
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
    for (int k = 0; k < o->nseg; k++) {
        if (st == HCOLL_SUCCESS)
            st = host_stage(d, o, &o->seg[k], &ring_us);
        /* Always, and in order: the caller's stream waits for it. */
        hcoll_status_t rst = release(d, o->seg[k].seq, 0);
        if (st == HCOLL_SUCCESS)
            st = rst;
        hc_gdr_dev_event_free(d->gpu, o->seg[k].ev_ready);
    }
    times->inter_us = ring_us;
    if (gpu) {
        gpu_times(d, o, st, times);
        tev_free(d, o);
        hc_gdr_dev_pop(d->gpu);
    } else if (plan_needs_nccl(d->plan)) {
        times->intra_rs_us = times->intra_ag_us = -1;
    }
    free(o);
    times->total_us = hc_now_us() - t0;
    return st;
}

/* ------------------------------------------------------------------------ */
/* Teardown                                                                   */
/* ------------------------------------------------------------------------ */

void hc_coll_dev_destroy(hc_coll_dev_t *d, int aborting)
{
    if (!d)
        return;
    if (d->ready) {
        struct hcoll_comm *c = d->c;
        hc_gdr_dev_push(d->gpu);
        /* The executor has drained its queue, so every issued number was
         * released; this is the safety net should one not have been. */
        if (hc_devseq_pending(&d->seq) != 0) {
            HC_WARN(HC_GDR, c->rank, "%u device all-reduces were never released; releasing",
                    hc_devseq_pending(&d->seq));
            if (hc_gdr_dev_write_flag(d->gpu, d->seq.issued) == HCOLL_SUCCESS)
                d->seq.released = d->seq.issued;
        }
        /* On abort, NCCL goes first: ncclCommAbort ends its kernels, which
         * may wait for dead peers, so that the streams can move on. */
        if (aborting) {
            hc_intra_abort(d->nccl);
            hc_intra_destroy(d->nccl);
            d->nccl = NULL;
        }
        /* Streams must be past the flag before its memory goes. */
        int drain_ms = aborting ? DEV_ABORT_DRAIN_MS : (int)c->params.timeout_ms;
        int stuck = hc_gdr_evlist_drain(&d->done, d->gpu->cu, drain_ms, &d->rp) != HCOLL_SUCCESS;
        hc_intra_destroy(d->nccl);
        if (stuck) {
            /* Leaving the flag allocated is the lesser harm: freeing memory a
             * stream still waits on could release it at random. */
            HC_WARN(HC_GDR, c->rank,
                    "a CUDA stream is still inside a device all-reduce; its flag is left "
                    "allocated");
            hc_gdr_dev_leak_flag(d->gpu);
        }
        if (d->gdr)
            hc_ring_disable_device(d->ring);
        hc_gdr_dev_pop(d->gpu);
        hc_gdr_dev_close(d->gpu);
    } else {
        hc_gdr_evlist_drain(&d->done, NULL, 0, &d->rp);
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
}
