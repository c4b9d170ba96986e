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
 * (no NCCL); one node is ncclAllReduce on the stream (plus the AVG kernel);
 * one rank is a device copy. AVG: the intra stages sum; the ring divides
 * its shard by the total rank count (its avg_divisor) before its own
 * all-gather, so the final NCCL all-gather moves divided shards.
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
#include "base/clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/coll.h"
#include "core/comm.h"
#include "core/ringdrv.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"
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
    void *tev[DEV_TEV];
    int ntev;              /* slots used */
    int fused;             /* one NCCL all-reduce: its time is split RS/AG */
    hc_dev_seg_t seg[];    /* [nseg] (room for every segment of the call) */
};

struct hc_coll_dev {
    struct hcoll_comm *c;
    int plan;
    hc_ring_t *ring;
    hc_allgather_fn node_ag;
    void *node_ag_ctx;
    size_t stage_bytes; /* each of the two buffers */

    /* Set up by the first device call. */
    int ready;
    hcoll_status_t setup_failed; /* sticky */
    const hc_cu_api_t *cu;
    int dev;   /* ordinal */
    int cudev; /* its CUdevice */
    void *ctx; /* retained primary context */
    void *istream;
    hc_cu_dptr_t flag;
    void *stage[2];
    void *ev_d2h[2];
    void *ev_fence; /* istream drained */
    hc_intra_t *nccl;
    hc_gdr_kern_t *kern;
    char kern_why[200];
    int gdr;                  /* stage ② on device memory (GPUDirect ring) */
    hc_ring_devops_t devops;  /* the ring's device operations (ctx = d) */

    pthread_mutex_t lock; /* seq and the done events */
    hc_devseq_t seq;
    void **done_ev; /* recorded after each call's last stream work */
    size_t ndone, capdone;
};

static hcoll_status_t cu_fail(hc_coll_dev_t *d, hc_cu_res_t r, const char *what)
{
    char eb[200];
    return hc_err_set(&d->c->err, HC_GDR, d->c->rank, HCOLL_ERR_CUDA, "%s: %s", what,
                      hc_gdr_cu_errstr(r, eb, sizeof eb));
}

#define CU_TRY(d, call, what, label)                                                         \
    do {                                                                                     \
        hc_cu_res_t r_ = (call);                                                             \
        if (r_ != HC_CU_SUCCESS) {                                                           \
            st = cu_fail((d), r_, (what));                                                   \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

/*
 * Poll an event until it completes: the only way to wait for GPU work with
 * a deadline and an abort check. A short spin keeps small calls fast; then
 * sleeps that grow to 200 us.
 */
static hcoll_status_t event_wait(hc_coll_dev_t *d, void *ev, int timeout_ms, int check_abort,
                                 const char *what)
{
    struct hcoll_comm *c = d->c;
    double deadline = hc_now_ms() + timeout_ms;
    long sleep_ns = 2000;
    for (int spins = 0;; spins++) {
        hc_cu_res_t r = d->cu->event_query(ev);
        if (r == HC_CU_SUCCESS)
            return HCOLL_SUCCESS;
        if (r != HC_CU_ERROR_NOT_READY)
            return cu_fail(d, r, what);
        if (check_abort && atomic_load(&c->aborted))
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                              "communicator aborted while waiting for %s", what);
        if (spins > 64) {
            if (hc_now_ms() > deadline)
                return hc_err_set(&c->err, HC_GDR, c->rank, HCOLL_ERR_TIMEOUT,
                                  "%s did not happen within %d ms (HCOLL_TIMEOUT_MS)", what,
                                  timeout_ms);
            struct timespec ts = { 0, sleep_ns };
            nanosleep(&ts, NULL);
            if (sleep_ns < 200000)
                sleep_ns *= 2;
        }
    }
}

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
    d->plan = plan;
    d->ring = ring;
    d->node_ag = node_ag;
    d->node_ag_ctx = node_ag_ctx;
    d->stage_bytes = hc_devsched_stage_bytes(piece_bytes);
    d->dev = -1;
    pthread_mutex_init(&d->lock, NULL);
    hc_devseq_init(&d->seq, 0);
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

/* Free what local_setup made; the context must be current. */
static void local_free(hc_coll_dev_t *d)
{
    const hc_cu_api_t *cu = d->cu;
    if (!cu)
        return;
    hc_gdr_kern_unload(d->kern);
    d->kern = NULL;
    for (int i = 0; i < 2; i++) {
        if (d->ev_d2h[i])
            cu->event_destroy(d->ev_d2h[i]);
        if (d->stage[i])
            cu->host_free(d->stage[i]);
        d->ev_d2h[i] = d->stage[i] = NULL;
    }
    if (d->ev_fence)
        cu->event_destroy(d->ev_fence);
    /* Stream-ordered: cuMemFree would wait for every stream of the context,
     * the application's included, and destroy must not hang on those. */
    if (d->flag && (!d->istream || cu->mem_free_async(d->flag, d->istream) != HC_CU_SUCCESS))
        HC_WARN(HC_GDR, d->c->rank, "the stream flag could not be freed; left allocated");
    if (d->istream)
        cu->stream_destroy(d->istream);
    d->ev_fence = d->istream = NULL;
    d->flag = 0;
}

/* This rank's half of the set-up: context, internal stream, flag,
 * staging, kernels. Nothing collective. */
static hcoll_status_t local_setup(hc_coll_dev_t *d, int dev)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const hc_cu_api_t *cu = d->cu;
    void *popped;
    CU_TRY(d, cu->device_get(&d->cudev, dev), "cuDeviceGet", out);
    CU_TRY(d, cu->primary_retain(&d->ctx, d->cudev), "cuDevicePrimaryCtxRetain", out);
    d->dev = dev;
    CU_TRY(d, cu->ctx_push(d->ctx), "cuCtxPushCurrent", release);
    CU_TRY(d, cu->stream_create(&d->istream, HC_CU_STREAM_NON_BLOCKING), "cuStreamCreate", fail);
    CU_TRY(d, cu->mem_alloc(&d->flag, 256), "cuMemAlloc (stream flag)", fail);
    /* The flag is 0 before any stream waits on it (fresh memory holds
     * anything). On the internal stream, not with cuMemsetD32: that goes on
     * the legacy stream, which is unordered with non-blocking streams and
     * refused while a blocking stream of the context is being captured. */
    static const uint32_t zero = 0;
    CU_TRY(d, cu->memcpy_htod_async(d->flag, &zero, sizeof zero, d->istream),
           "cuMemcpyHtoDAsync (stream flag)", fail);
    CU_TRY(d, cu->stream_synchronize(d->istream), "cuStreamSynchronize (stream flag)", fail);
    CU_TRY(d, cu->event_create(&d->ev_fence, HC_CU_EVENT_DISABLE_TIMING), "cuEventCreate", fail);
    if (plan_stages(d->plan))
        for (int i = 0; i < 2; i++) {
            CU_TRY(d, cu->host_alloc(&d->stage[i], d->stage_bytes, 0),
                   "cuMemHostAlloc (staging)", fail);
            CU_TRY(d, cu->event_create(&d->ev_d2h[i], HC_CU_EVENT_DISABLE_TIMING),
                   "cuEventCreate", fail);
        }
    /* The kernels are optional: only AVG on one node needs them. */
    if (hc_gdr_kern_load(&d->kern, d->kern_why, sizeof d->kern_why) != 0)
        d->kern = NULL;
    cu->ctx_pop(&popped);
    return HCOLL_SUCCESS;

fail:
    local_free(d);
    cu->ctx_pop(&popped);
release:
    cu->primary_release(d->cudev);
    d->ctx = NULL;
    d->dev = -1;
out:
    return st;
}

typedef struct dev_hello {
    int32_t ok;
    int32_t dev;
    int32_t gdr; /* this rank's ring can take device memory, and kernels loaded */
} dev_hello_t;

/* The ring's device operations (GPUDirect stage ②): on the internal
 * stream, each complete on return, with the context pushed (they run on
 * hcoll's threads). */
static hcoll_status_t devop_done(hc_coll_dev_t *d, hc_cu_res_t r, const char *what)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    if (r == HC_CU_SUCCESS)
        r = d->cu->stream_synchronize(d->istream);
    if (r != HC_CU_SUCCESS)
        st = cu_fail(d, r, what);
    void *popped;
    d->cu->ctx_pop(&popped);
    return st;
}

static hcoll_status_t devop_alloc(void *ctx, size_t bytes, void **out)
{
    hc_coll_dev_t *d = ctx;
    hc_cu_dptr_t p = 0;
    d->cu->ctx_push(d->ctx);
    hcoll_status_t st = devop_done(d, d->cu->mem_alloc(&p, bytes), "cuMemAlloc (device slots)");
    *out = (void *)(uintptr_t)p;
    return st;
}

static void devop_free(void *ctx, void *p)
{
    hc_coll_dev_t *d = ctx;
    d->cu->ctx_push(d->ctx);
    /* Stream-ordered, like the flag: never waits for other streams. */
    devop_done(d, d->cu->mem_free_async((hc_cu_dptr_t)(uintptr_t)p, d->istream),
               "cuMemFreeAsync (device slots)");
}

static hcoll_status_t devop_reduce(void *ctx, void *dst, const void *a, const void *b,
                                   size_t count, hcoll_dtype_t dtype, hcoll_op_t op)
{
    hc_coll_dev_t *d = ctx;
    d->cu->ctx_push(d->ctx);
    return devop_done(d,
                      hc_gdr_kern_reduce(d->kern, (hc_cu_dptr_t)(uintptr_t)dst,
                                         (hc_cu_dptr_t)(uintptr_t)a, (hc_cu_dptr_t)(uintptr_t)b,
                                         count, dtype, op, d->istream),
                      "the reduction kernel (GPUDirect ring)");
}

static hcoll_status_t devop_avg(void *ctx, void *buf, size_t count, hcoll_dtype_t dtype,
                                hcoll_op_t op, int div)
{
    hc_coll_dev_t *d = ctx;
    if (op != HCOLL_AVG)
        return HCOLL_SUCCESS;
    d->cu->ctx_push(d->ctx);
    return devop_done(d,
                      hc_gdr_kern_avg(d->kern, (hc_cu_dptr_t)(uintptr_t)buf, count, dtype, div,
                                      d->istream),
                      "the AVG kernel (GPUDirect ring)");
}

static hcoll_status_t devop_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    hc_coll_dev_t *d = ctx;
    d->cu->ctx_push(d->ctx);
    return devop_done(d,
                      d->cu->memcpy_dtod_async((hc_cu_dptr_t)(uintptr_t)dst,
                                               (hc_cu_dptr_t)(uintptr_t)src, bytes, d->istream),
                      "cuMemcpyDtoDAsync (GPUDirect ring)");
}

/* Collective over all ranks: every rank reports whether its half worked,
 * so that one rank's missing GPU fails the call everywhere at once instead
 * of leaving the others in the ring until the timeout. */
static hcoll_status_t dev_setup(hc_coll_dev_t *d, int dev)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st, local;
    char why[200];
    d->cu = hc_gdr_cu(why, sizeof why);
    if (!d->cu)
        local = hc_err_set(&c->err, HC_GDR, c->rank, HCOLL_ERR_UNSUPPORTED,
                           "device buffers need the CUDA driver: %s", why);
    else
        local = local_setup(d, dev);

    /* GPUDirect stage ②: where the rank's ring takes device memory (verbs
     * with GPUDirect on) and the kernels that reduce there are loaded. */
    int gdr = local == HCOLL_SUCCESS && d->ring && plan_stages(d->plan) && d->kern &&
              hc_ring_gdr_capable(d->ring);
    dev_hello_t mine = { local == HCOLL_SUCCESS, dev, gdr },
                *all = calloc((size_t)c->nranks, sizeof *all);
    if (!all) {
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY, "no memory");
        goto undo;
    }
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
    if (st != HCOLL_SUCCESS)
        goto undo;

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
        void *popped;
        d->cu->ctx_push(d->ctx);
        st = hc_intra_nccl_ops.create(&ip, &d->nccl);
        d->cu->ctx_pop(&popped);
        if (st != HCOLL_SUCCESS)
            goto undo;
    }
    if (all_gdr) {
        /* Every rank's ring enables device slots (collective over each
         * ring, and every rank is here). A failure leaves host staging. */
        d->devops = (hc_ring_devops_t){ d, devop_alloc, devop_free, devop_reduce, devop_avg,
                                        devop_copy };
        void *popped;
        d->cu->ctx_push(d->ctx);
        hcoll_status_t gst = hc_ring_enable_device(d->ring, &d->devops);
        d->cu->ctx_pop(&popped);
        d->gdr = gst == HCOLL_SUCCESS;
        if (!d->gdr)
            HC_WARN(HC_GDR, c->rank, "GPUDirect stage 2 not possible (%s); staging through host "
                    "memory", hc_errbuf_get(&c->err));
    }
    char bdf[32] = "?";
    hc_gdr_gpu_info(dev, bdf, sizeof bdf, NULL, NULL);
    HC_INFO(HC_GDR, c->rank,
            "device buffers: GPU %d (%s), %s, stage 2 %s, reduction kernels %s%s", dev, bdf,
            plan_needs_nccl(d->plan) ? "NCCL intra-node" : "no intra-node stage",
            d->gdr ? "on device memory (GPUDirect RDMA)" : "staged through pinned host memory",
            d->kern ? "loaded" : "absent: ", d->kern ? "" : d->kern_why);
    d->ready = 1;
    return HCOLL_SUCCESS;

undo:
    if (local == HCOLL_SUCCESS) {
        void *popped;
        d->cu->ctx_push(d->ctx);
        local_free(d);
        d->cu->ctx_pop(&popped);
        d->cu->primary_release(d->cudev);
        d->ctx = NULL;
    }
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
    if (d->plan == HC_PLAN_INTRA && op == HCOLL_AVG && d->ready && !d->kern)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_UNSUPPORTED,
                          "AVG on device buffers within one node needs the division kernel: %s",
                          d->kern_why);
    *dev_out = sdev;
    return HCOLL_SUCCESS;
}

/* Keep the event that tells when the stream is past this call; reap those
 * that completed, so the list stays as long as the stream's backlog. */
static void done_track(hc_coll_dev_t *d, void *ev)
{
    pthread_mutex_lock(&d->lock);
    size_t keep = 0;
    for (size_t i = 0; i < d->ndone; i++) {
        if (d->cu->event_query(d->done_ev[i]) == HC_CU_SUCCESS)
            d->cu->event_destroy(d->done_ev[i]);
        else
            d->done_ev[keep++] = d->done_ev[i];
    }
    d->ndone = keep;
    if (d->ndone == d->capdone) {
        size_t cap = d->capdone ? d->capdone * 2 : 16;
        void **p = realloc(d->done_ev, cap * sizeof *p);
        if (!p) {
            /* Without a slot, wait for the GPU to pass it now (rare). */
            pthread_mutex_unlock(&d->lock);
            event_wait(d, ev, (int)d->c->params.timeout_ms, 0, "the end of a device all-reduce");
            d->cu->event_destroy(ev);
            return;
        }
        d->done_ev = p;
        d->capdone = cap;
    }
    d->done_ev[d->ndone++] = ev;
    pthread_mutex_unlock(&d->lock);
}

static hcoll_status_t capture_refused(struct hcoll_comm *c)
{
    return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_UNSUPPORTED,
                      "the stream is being captured into a CUDA graph: hcoll's device "
                      "all-reduce waits on a host thread, which a graph cannot replay; call "
                      "it outside the capture");
}

/* Record timing event i of o on stream. Timing is best effort: an event
 * that cannot be made leaves its stage untimed, never fails the call. */
static void tev_mark(hc_coll_dev_t *d, hc_dev_op_t *o, int i, void *stream)
{
    void *e = NULL;
    if (d->cu->event_create(&e, 0) != HC_CU_SUCCESS)
        return;
    if (d->cu->event_record(e, stream) != HC_CU_SUCCESS) {
        d->cu->event_destroy(e);
        return;
    }
    o->tev[i] = e;
    if (i + 1 > o->ntev)
        o->ntev = i + 1;
}

static void tev_free(hc_coll_dev_t *d, hc_dev_op_t *o)
{
    for (int i = 0; i < o->ntev; i++)
        if (o->tev[i])
            d->cu->event_destroy(o->tev[i]);
    o->ntev = 0;
}

/* Microseconds between timing events a and b of o, or -1. */
static double tev_us(hc_coll_dev_t *d, const hc_dev_op_t *o, int a, int b)
{
    float ms = 0;
    if (a >= o->ntev || b >= o->ntev || !o->tev[a] || !o->tev[b] ||
        d->cu->event_elapsed(&ms, o->tev[a], o->tev[b]) != HC_CU_SUCCESS)
        return -1;
    return ms * 1e3;
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
    const hc_cu_api_t *cu = d->cu;
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
                     undo);
            hc_intra_shard(n, c->local_size, c->local_rank, &soff, &slen);
            g->src = (const unsigned char *)recvbuf + (off + soff) * es;
        } else {
            g->src = sendbuf;
        }
        g->dst = (unsigned char *)recvbuf + (off + soff) * es;
        g->count = slen;
        CU_TRY(d, cu->event_create(&g->ev_ready, HC_CU_EVENT_DISABLE_TIMING), "cuEventCreate",
               undo);
        hc_cu_res_t rr = cu->event_record(g->ev_ready, stream);
        if (rr != HC_CU_SUCCESS) {
            cu->event_destroy(g->ev_ready);
            g->ev_ready = NULL;
            st = cu_fail(d, rr, "cuEventRecord");
            goto undo;
        }
    }
    if (three)
        tev_mark(d, o, 1, stream);
    for (size_t k = 0; k < nseg; k++) {
        pthread_mutex_lock(&d->lock);
        uint32_t seq = hc_devseq_issue(&d->seq);
        pthread_mutex_unlock(&d->lock);
        hc_cu_res_t rr = cu->stream_wait_value32(stream, d->flag, seq, HC_CU_STREAM_WAIT_VALUE_GEQ);
        if (rr != HC_CU_SUCCESS) {
            /* Nothing waits for seq: give it back so numbers stay dense. */
            pthread_mutex_lock(&d->lock);
            d->seq.issued--;
            pthread_mutex_unlock(&d->lock);
            st = cu_fail(d, rr, "cuStreamWaitValue32");
            if (k == 0)
                goto undo;
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
        cu->event_destroy(o->seg[k].ev_ready);
    return HCOLL_SUCCESS;

undo:
    for (size_t k = 0; k < made; k++)
        cu->event_destroy(o->seg[k].ev_ready);
    tev_free(d, o);
    return st;
}

hcoll_status_t hc_coll_dev_enqueue(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                                   size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                   void *stream, hc_dev_op_t **op_out)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st;
    *op_out = NULL;
    const size_t es = hcoll_dtype_size(dtype);
    size_t segc = count, nseg = 1;
    if (d->plan == HC_PLAN_3STAGE && es) {
        segc = hc_devsched_segment_count(count, es, d->stage_bytes, d->c->local_size);
        nseg = (count + segc - 1) / segc;
    }
    hc_dev_op_t *o = calloc(1, sizeof *o + nseg * sizeof o->seg[0]);
    if (!o)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a device operation");
    o->dtype = dtype;
    o->op = op;
    if (count == 0) {
        /* Nothing moves; the request still completes in order. */
        if (!hc_reduce_valid(dtype, op)) {
            free(o);
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                              "dtype %d / op %d is not a known type and operation",
                              (int)dtype, (int)op);
        }
        *op_out = o;
        return HCOLL_SUCCESS;
    }
    int dev = -1;
    HC_CHECK(dev_validate(d, sendbuf, recvbuf, count, dtype, op, stream, &dev), free_op);
    if (d->setup_failed != HCOLL_SUCCESS) {
        st = hc_err_set(&c->err, HC_COLL, c->rank, d->setup_failed,
                        "the device path could not be set up earlier (%s)",
                        hcoll_strerror(d->setup_failed));
        goto free_op;
    }
    if (!d->ready) {
        /* Asked before the set-up as well (with the caller's context, which
         * owns the stream), so that a capture is refused as such and not
         * turned into a set-up failure, which would be sticky. */
        const hc_cu_api_t *cu0 = hc_gdr_cu(NULL, 0);
        int cap0 = HC_CU_STREAM_CAPTURE_STATUS_NONE;
        if (cu0 && cu0->stream_is_capturing(stream, &cap0) == HC_CU_SUCCESS &&
            cap0 != HC_CU_STREAM_CAPTURE_STATUS_NONE) {
            st = capture_refused(c);
            goto free_op;
        }
        HC_CHECK(dev_setup(d, dev), free_op);
        HC_CHECK(dev_validate(d, sendbuf, recvbuf, count, dtype, op, stream, &dev), free_op);
    }

    const hc_cu_api_t *cu = d->cu;
    void *popped;
    CU_TRY(d, cu->ctx_push(d->ctx), "cuCtxPushCurrent", free_op);
    int cap = HC_CU_STREAM_CAPTURE_STATUS_NONE;
    CU_TRY(d, cu->stream_is_capturing(stream, &cap), "cuStreamIsCapturing (is the stream valid?)",
           pop);
    if (cap != HC_CU_STREAM_CAPTURE_STATUS_NONE) {
        st = capture_refused(c);
        goto pop;
    }
    void *sctx = NULL;
    if (cu->stream_get_ctx(stream, &sctx) == HC_CU_SUCCESS && sctx && sctx != d->ctx) {
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                        "the stream belongs to another CUDA context than GPU %d's primary "
                        "context, which this communicator uses",
                        d->dev);
        goto pop;
    }

    const hc_cu_dptr_t s = (hc_cu_dptr_t)(uintptr_t)sendbuf, r = (hc_cu_dptr_t)(uintptr_t)recvbuf;
    void *ev_done = NULL;
    CU_TRY(d, cu->event_create(&ev_done, HC_CU_EVENT_DISABLE_TIMING), "cuEventCreate", pop);

    switch (d->plan) {
    case HC_PLAN_SINGLE:
        if (s != r)
            CU_TRY(d, cu->memcpy_dtod_async(r, s, count * es, stream), "cuMemcpyDtoDAsync",
                   free_ev);
        break;
    case HC_PLAN_INTRA: {
        const hc_intra_ops_t *iops = d->nccl->ops;
        tev_mark(d, o, 0, stream);
        o->fused = 1;
        HC_CHECK(iops->allreduce(d->nccl, sendbuf, recvbuf, count, dtype, op, stream), free_ev);
        if (op == HCOLL_AVG)
            CU_TRY(d, hc_gdr_kern_avg(d->kern, r, count, dtype, c->nranks, stream),
                   "launching the AVG kernel", free_ev);
        tev_mark(d, o, 1, stream);
        break;
    }
    case HC_PLAN_RING:
    case HC_PLAN_FLAT:
    case HC_PLAN_3STAGE:
        HC_CHECK(staged_enqueue(d, o, sendbuf, recvbuf, count, segc, nseg, stream), free_ev);
        break;
    }
    if (cu->event_record(ev_done, stream) == HC_CU_SUCCESS)
        done_track(d, ev_done);
    else
        cu->event_destroy(ev_done);
    cu->ctx_pop(&popped);
    *op_out = o;
    return o->status;

free_ev:
    cu->event_destroy(ev_done);
    tev_free(d, o);
pop:
    cu->ctx_pop(&popped);
free_op:
    free(o);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Host stage (worker thread)                                                 */
/* ------------------------------------------------------------------------ */

/* The ring on buf in place (host staging), or from src to dst in device
 * memory (GPUDirect: dev). */
static hcoll_status_t ring_run(hc_coll_dev_t *d, const void *src, void *buf, size_t n,
                               hcoll_dtype_t dtype, hcoll_op_t op, int dev)
{
    struct hcoll_comm *c = d->c;
    const hc_ringdrv_op_t rop = { dev ? src : buf, buf, n, dtype, op, c->nranks, dev };
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank, "the inter-node stage" };
    return hc_ringdrv_run(d->ring, &rop, &env);
}

static hcoll_status_t host_stage(hc_coll_dev_t *d, const hc_dev_op_t *o, const hc_dev_seg_t *g,
                                 double *ring_us)
{
    const hc_cu_api_t *cu = d->cu;
    const int tmo = (int)d->c->params.timeout_ms;
    const size_t es = hcoll_dtype_size(o->dtype);
    const size_t piece = d->stage_bytes / es;
    const size_t npieces = hc_devsched_pieces(g->count, es, d->stage_bytes);
    hcoll_status_t st;
    HC_CHECK(event_wait(d, g->ev_ready, tmo, 1, "the intra-node stage on the caller's stream"),
             out);
    if (d->gdr) {
        /* GPUDirect: the ring reads and writes the device range itself. */
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        st = ring_run(d, g->src, g->dst, g->count, o->dtype, o->op, 1);
        clock_gettime(CLOCK_MONOTONIC, &b);
        *ring_us += (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
        return st;
    }
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
            CU_TRY(d,
                   cu->memcpy_dtoh_async(d->stage[step.buf],
                                         (hc_cu_dptr_t)(uintptr_t)(g->src + off * es), n * es,
                                         d->istream),
                   "cuMemcpyDtoHAsync (staging)", out);
            CU_TRY(d, cu->event_record(d->ev_d2h[step.buf], d->istream), "cuEventRecord", out);
            break;
        case HC_DEVSTAGE_WAIT:
            HC_CHECK(event_wait(d, d->ev_d2h[step.buf], tmo, 1, "a copy into staging"), out);
            break;
        case HC_DEVSTAGE_RING: {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            st = ring_run(d, d->stage[step.buf], d->stage[step.buf], n, o->dtype, o->op, 0);
            clock_gettime(CLOCK_MONOTONIC, &b);
            *ring_us += (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
            if (st != HCOLL_SUCCESS)
                goto out;
            break;
        }
        case HC_DEVSTAGE_H2D:
            CU_TRY(d,
                   cu->memcpy_htod_async((hc_cu_dptr_t)(uintptr_t)(g->dst + off * es),
                                         d->stage[step.buf], n * es, d->istream),
                   "cuMemcpyHtoDAsync (staging)", out);
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
    const hc_cu_api_t *cu = d->cu;
    hcoll_status_t st;
    CU_TRY(d, cu->stream_write_value32(d->istream, d->flag, seq, HC_CU_STREAM_WRITE_VALUE_DEFAULT),
           "cuStreamWriteValue32 (releasing the caller's stream)", out);
    pthread_mutex_lock(&d->lock);
    int order = hc_devseq_release(&d->seq, seq);
    pthread_mutex_unlock(&d->lock);
    if (order != 0) {
        st = hc_err_set(&d->c->err, HC_COLL, d->c->rank, HCOLL_ERR_INTERNAL,
                        "stream flag released out of order (seq %u)", seq);
        goto out;
    }
    CU_TRY(d, cu->event_record(d->ev_fence, d->istream), "cuEventRecord", out);
    st = event_wait(d, d->ev_fence, (int)d->c->params.timeout_ms, check_abort,
                    "the copy back from staging");
out:
    if (st != HCOLL_SUCCESS)
        HC_WARN(HC_GDR, d->c->rank,
                "releasing device all-reduce %u failed; a stream waiting for it may hang", seq);
    return st;
}

hcoll_status_t hc_coll_dev_execute(hc_coll_dev_t *d, hc_dev_op_t *o, hcoll_status_t status_in,
                                   hcoll_stage_times_t *times)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    hcoll_status_t st = status_in != HCOLL_SUCCESS ? status_in : o->status;
    double ring_us = 0;
    memset(times, 0, sizeof *times);
    /* Pushed, not set: without a worker thread this runs on the caller's
     * thread, whose current context is the application's. */
    void *popped;
    const int gpu = o->nseg > 0 || o->ntev > 0;
    if (gpu)
        d->cu->ctx_push(d->ctx);
    for (int k = 0; k < o->nseg; k++) {
        if (st == HCOLL_SUCCESS)
            st = host_stage(d, o, &o->seg[k], &ring_us);
        /* Always, and in order: the caller's stream waits for it. */
        hcoll_status_t rst = release(d, o->seg[k].seq, 0);
        if (st == HCOLL_SUCCESS)
            st = rst;
        d->cu->event_destroy(o->seg[k].ev_ready);
    }
    times->inter_us = ring_us;
    /* The NCCL stages, from the timing events once the GPU has passed the
     * last one (the request completes with the whole all-reduce); -1 where
     * a stage could not be timed. */
    if (plan_needs_nccl(d->plan))
        times->intra_rs_us = times->intra_ag_us = -1;
    void *last = NULL;
    for (int i = o->ntev - 1; i >= 0 && !last; i--)
        last = o->tev[i];
    if (st == HCOLL_SUCCESS && last &&
        event_wait(d, last, (int)d->c->params.timeout_ms, 1, "the GPU stages of the call") ==
            HCOLL_SUCCESS) {
        if (o->fused) {
            double us = tev_us(d, o, 0, 1);
            times->intra_rs_us = times->intra_ag_us = us >= 0 ? us / 2 : -1;
        } else {
            times->intra_rs_us = tev_us(d, o, 0, 1);
            double ag = 0;
            for (int k = 0; k < o->nseg && ag >= 0; k++) {
                double us = tev_us(d, o, 2 + 2 * k, 3 + 2 * k);
                ag = us >= 0 ? ag + us : -1;
            }
            times->intra_ag_us = o->nseg > 0 ? ag : -1;
        }
    }
    tev_free(d, o);
    if (gpu)
        d->cu->ctx_pop(&popped);
    free(o);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    times->total_us = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
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
        const hc_cu_api_t *cu = d->cu;
        struct hcoll_comm *c = d->c;
        void *popped;
        cu->ctx_push(d->ctx);
        /* The executor has drained its queue, so every issued number was
         * released; this is the safety net should one not have been. */
        if (hc_devseq_pending(&d->seq) != 0) {
            HC_WARN(HC_GDR, c->rank, "%u device all-reduces were never released; releasing",
                    hc_devseq_pending(&d->seq));
            if (cu->stream_write_value32(d->istream, d->flag, d->seq.issued,
                                         HC_CU_STREAM_WRITE_VALUE_DEFAULT) == HC_CU_SUCCESS)
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
        int stuck = 0;
        for (size_t i = 0; i < d->ndone; i++) {
            if (!stuck && event_wait(d, d->done_ev[i], drain_ms, 0,
                                     "a stream to pass hcoll's all-reduce") != HCOLL_SUCCESS)
                stuck = 1;
            if (!stuck)
                cu->event_destroy(d->done_ev[i]);
        }
        free(d->done_ev);
        hc_intra_destroy(d->nccl);
        if (stuck) {
            /* Leaving the flag allocated is the lesser harm: freeing memory a
             * stream still waits on could release it at random. */
            HC_WARN(HC_GDR, c->rank,
                    "a CUDA stream is still inside a device all-reduce; its flag is left "
                    "allocated");
            d->flag = 0;
        }
        if (d->gdr)
            hc_ring_disable_device(d->ring);
        local_free(d);
        cu->ctx_pop(&popped);
        cu->primary_release(d->cudev);
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
}
