/*
 * The all-reduce on device buffers: GPU stages on the caller's stream, the
 * inter-node stage on the host, joined by gates on hcoll's stream (the
 * reduce-scatter, all-gather and broadcast alike).
 *
 * Staged plans (ring, flat, three stages; stage ② through pinned host
 * memory): everything is enqueued at call time, the copies on hcoll's
 * gate stream behind gates that the worker opens, and the caller's stream
 * waits on events only, so that no stream waits for work submitted after
 * it (streams share in-order hardware queues: CUDA_DEVICE_MAX_CONNECTIONS).
 * The drawing and the reasons are in coll_dev_gated.c.
 *
 * The same on device memory (GPUDirect stage ②): the ring's reductions
 * go on the gate stream at call time, each behind its gate.
 *
 * Reduce-scatter and all-gather (coll_dev_rsag.c) and the broadcast
 * (coll_dev_enq.c) the same: no device call waits for work submitted
 * after it. Their arguments are compared before anything moves
 * ("Argument agreement" below).
 *
 * hcoll_allreduce returns once the stream holds every RS, wait and AG: the
 * host never synchronises the caller's stream. Segments pipeline the three
 * stages: the GPU reduce-scatters segment k+1 while the ring all-reduces
 * segment k's shard, and all-gathers segment k while the ring runs k+1.
 * The worker (the executor's thread, coll.c) waits for events by polling,
 * which blocks hcoll's thread only.
 *
 * Other plans: one rank per node and unequal nodes stage the whole vector
 * (no NCCL); one node is ncclAllReduce on the stream; one rank is a device
 * copy. Scaled ops (AVG of floats, PREMUL_SUM) scale where the input is
 * first read (redop.h): NCCL's PreMulSum, the staged host copy, or
 * hcoll's scaling kernel on the stream (GPUDirect ring, one rank, a
 * device scalar without NCCL); integer AVG divides once at the end.
 *
 * Failure: a stream waiting on a gate must never hang. A host stage that
 * fails still opens its gates (the result is then undefined, the error is
 * sticky and reported by the request and hcoll_comm_get_async_error; but
 * a ring that voided the call, a rank's registration refused, fails it on
 * every rank alike and leaves the communicator usable: ring_void.c, and
 * with three stages coll_rail.c, which tells the node's other rails), and
 * destroy/abort opens every gate issued before it frees anything, after
 * waiting (up to the timeout) for every stream to pass hcoll's work; if
 * one does not, what it may still use is left allocated rather than freed
 * under it.
 *
 * Which GPU: the device current at hcoll_comm_init (comm->gpu); buffers on
 * another device are refused. When none was current (CUDA not yet loaded
 * then), the device of the buffers at the first device call. Its primary
 * context (the one the CUDA runtime uses) is retained for the
 * communicator's life.
 *
 * Files: this one sets the path up, compares arguments and tears it down;
 * coll_dev_enq.c puts the GPU stages on the caller's stream (all-reduce,
 * broadcast); coll_dev_gated.c the gated copies and reductions;
 * coll_dev_host.c is the host stage;
 * coll_dev_rsag.c reduce-scatter and all-gather; coll_dev_priv.h the
 * state they share.
 */
#include "core/coll_dev_priv.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"
#include "core/coll_priv.h"
#include "core/comm.h"
#include "core/ringdrv.h"
#include "gdr/gdr.h"

/* After abort, how long destroy waits for streams to pass hcoll's work. */
#define DEV_ABORT_DRAIN_MS 2000

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
    hc_gdr_evlist_init(&d->done);
    *out = d;
    return HCOLL_SUCCESS;
}

typedef struct dev_hello {
    int32_t ok;
    int32_t dev;
    int32_t gdr; /* this rank's ring can take device memory, and kernels loaded */
    int32_t pad;
    uint64_t nonce; /* rank 0's names the agreement segments */
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
static hcoll_status_t dev_hello(hc_coll_dev_t *d, hcoll_status_t local, int dev, int *all_gdr_out,
                                uint64_t *nonce_out)
{
    struct hcoll_comm *c = d->c;
    hcoll_status_t st;
    /* GPUDirect stage ②: where the rank's ring takes device memory (verbs
     * with GPUDirect on) and the kernels that reduce there are loaded. */
    int gdr = local == HCOLL_SUCCESS && d->ring && plan_stages(d->plan) && d->gpu->kern &&
              hc_ring_gdr_capable(d->ring);
    dev_hello_t mine = { local == HCOLL_SUCCESS, dev, gdr, 0, 0 },
                *all = calloc((size_t)c->nranks, sizeof *all);
    if (!all)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY, "no memory");
    if (getrandom(&mine.nonce, sizeof mine.nonce, 0) != (ssize_t)sizeof mine.nonce)
        mine.nonce = (uint64_t)hc_now_us() ^ ((uint64_t)getpid() << 32);
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
    *nonce_out = all[0].nonce;
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

/* An NCCL communicator over the node's local ranks, on the device's
 * context: collective over the node (every local rank makes the same
 * call). name tells the set-up exchanges of several apart. */
static hcoll_status_t hc_dev_nccl_open(hc_coll_dev_t *d, const char *name, hc_intra_t **out)
{
    struct hcoll_comm *c = d->c;
    const hc_intra_params_t ip = {
        .local_rank = c->local_rank,
        .local_size = c->local_size,
        .name = name,
        .chunk_bytes = c->params.chunk_bytes,
        .timeout_ms = (int)c->params.timeout_ms,
        .errbuf = &c->err,
        .rank = c->rank,
        .allgather = d->node_ag,
        .allgather_ctx = d->node_ag_ctx,
    };
    hc_gdr_dev_push(d->gpu);
    hcoll_status_t st = hc_intra_nccl_ops.create(&ip, out);
    hc_gdr_dev_pop(d->gpu);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Argument agreement                                                         */
/* ------------------------------------------------------------------------ */

/*
 * A device reduce-scatter, all-gather or broadcast puts its NCCL stages on
 * the stream at call time, and NCCL given other counts or roots on two
 * local ranks hangs or writes out of bounds. So where a plan has NCCL
 * stages, the node's ranks compare their arguments at call time over a
 * small shared-memory segment of their own (the caller's thread; the
 * worker's segment is busy with host calls): one all-reduce (MAX) of the
 * fingerprint and its negation, which waits for the node's late ranks as
 * a host call does (none stopped: HCOLL_OP_TIMEOUT_MS; a dead one fails
 * it). Ranks that disagree enqueue nothing. Every rank's worker then
 * compares the same fingerprint across all ranks before its ring
 * (hc_coll_dev_agree; the broadcast's through hc_coll_bcast_agree): a
 * difference anywhere, the node's included, fails the call alike on every
 * rank with HCOLL_ERR_MISMATCH, the ring is skipped and the gates open
 * onto copies that put back what they took. With HCOLL_CHECK_ARGS=0 the
 * call-time comparison is not made (no segment): the caller never waits
 * for the node's other ranks, and ranks must agree.
 */
static hcoll_status_t dev_agree_open(hc_coll_dev_t *d, uint64_t nonce)
{
    struct hcoll_comm *c = d->c;
    char name[64];
    snprintf(name, sizeof name, "/hcoll-dev-%016llx-n%d", (unsigned long long)nonce, c->node);
    const int op_tmo = d->c->params.op_timeout_ms > 0 ? (int)d->c->params.op_timeout_ms : -1;
    const hc_intra_params_t ip = {
        .local_rank = c->local_rank,
        .local_size = c->local_size,
        .name = name,
        .chunk_bytes = 4096, /* a fingerprint: the smallest slots */
        .timeout_ms = (int)c->params.timeout_ms,
        .op_timeout_ms = op_tmo,
        .liveness_ms = 0, /* no heartbeat on this segment; exits are seen */
        .errbuf = &c->err,
        .rank = c->rank,
        .allgather = d->node_ag,
        .allgather_ctx = d->node_ag_ctx,
    };
    return hc_intra_shm_ops.create(&ip, &d->agree);
}

/* What ranks must agree on: the kind, count (elements, or a broadcast's
 * bytes), dtype and op (a PREMUL_SUM counts as one op) or root. */
static void dev_fingerprint(const hc_dev_op_t *o, int64_t chk[8])
{
    const int64_t v[4] = { o->kind, (int64_t)o->fp_count, o->fp_dtype,
                           o->kind == HC_DEV_BCAST ? o->root : o->fp_op };
    for (int i = 0; i < 4; i++) {
        chk[2 * i] = v[i];
        chk[2 * i + 1] = -v[i];
    }
}

static int fingerprint_equal(const int64_t chk[8])
{
    for (int i = 0; i < 4; i++)
        if (chk[2 * i] != -chk[2 * i + 1])
            return 0;
    return 1;
}

hcoll_status_t hc_dev_local_agree(hc_coll_dev_t *d, const hc_dev_op_t *o, int *agree_out)
{
    *agree_out = 1;
    if (!d->agree)
        return HCOLL_SUCCESS;
    int64_t chk[8];
    dev_fingerprint(o, chk);
    hcoll_status_t st =
        d->agree->ops->allreduce(d->agree, chk, chk, 8, HCOLL_INT64, HCOLL_MAX, NULL);
    if (st == HCOLL_SUCCESS)
        *agree_out = fingerprint_equal(chk);
    return st;
}

hcoll_status_t hc_coll_dev_agree(hc_coll_dev_t *d, const hc_dev_op_t *o, int *agreed_out)
{
    struct hcoll_comm *c = d->c;
    int64_t chk[8], mine[8];
    dev_fingerprint(o, chk);
    memcpy(mine, chk, sizeof mine);
    const hc_coll_args_t a = { .kind = HC_COLL_ALLREDUCE, .sendbuf = chk, .recvbuf = chk,
                               .count = 8, .dtype = HCOLL_INT64, .op = HCOLL_MAX };
    hcoll_stage_times_t t;
    int agreed = 0;
    hcoll_status_t st = hc_coll_run(c->coll, &a, &t, &agreed);
    if (st != HCOLL_SUCCESS || fingerprint_equal(chk))
        return st;
    *agreed_out = 1;
    return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_MISMATCH,
                      "%s on device buffers: ranks disagree on the arguments (count %lld..%lld, "
                      "dtype %lld..%lld, op %lld..%lld; this rank: %lld, %s, %lld)",
                      o->kind == HC_DEV_RS ? "reduce_scatter" : "allgather", (long long)-chk[3],
                      (long long)chk[2], (long long)-chk[5], (long long)chk[4],
                      (long long)-chk[7], (long long)chk[6], (long long)mine[2],
                      hcoll_dtype_name((hcoll_dtype_t)mine[4]), (long long)mine[6]);
}

/* The staging buffers pinned with the ring's transport (verbs; nothing
 * over TCP), before the set-up's hello: a registration the NIC or the
 * locked-memory limit refuses is this rank's failed half, and every rank
 * fails the set-up alike. */
static hcoll_status_t dev_pin_staging(hc_coll_dev_t *d)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    for (int i = 0; i < 2 && st == HCOLL_SUCCESS; i++)
        st = hc_ring_mem_pin(d->ring, d->gpu->stage[i], d->stage_bytes, &d->stage_pin[i]);
    return st;
}

static void dev_unpin_staging(hc_coll_dev_t *d)
{
    for (int i = 0; i < 2; i++) {
        hc_ring_mem_unpin(d->ring, d->stage_pin[i]);
        d->stage_pin[i] = NULL;
    }
}

/* Collective over all ranks: every rank reports whether its half worked,
 * so that one rank's missing GPU fails the call everywhere at once instead
 * of leaving the others in the ring until the timeout. */
hcoll_status_t hc_coll_dev_setup(hc_coll_dev_t *d, int dev)
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
    if (local == HCOLL_SUCCESS && plan_stages(d->plan)) {
        hc_gdr_dev_push(d->gpu);
        local = hc_gdr_gate_open(cu, &d->rp, &d->gate);
        if (local == HCOLL_SUCCESS && (local = dev_pin_staging(d)) != HCOLL_SUCCESS) {
            dev_unpin_staging(d);
            hc_gdr_gate_close(d->gate, (int)c->params.timeout_ms);
            d->gate = NULL;
        }
        hc_gdr_dev_pop(d->gpu);
        if (local != HCOLL_SUCCESS) {
            hc_gdr_dev_close(d->gpu);
            d->gpu = NULL;
        }
    }
    int all_gdr = 0;
    uint64_t nonce = 0;
    HC_CHECK(dev_hello(d, local, dev, &all_gdr, &nonce), clean_gpu);
    d->dev = dev;
    if (plan_needs_nccl(d->plan) &&
        (st = hc_dev_nccl_open(d, "nccl", &d->nccl)) != HCOLL_SUCCESS)
        goto clean_gpu;
    /* HCOLL_CHECK_ARGS=0 drops the call-time wait among the node's ranks. */
    if (plan_needs_nccl(d->plan) && c->params.check_args &&
        (st = dev_agree_open(d, nonce)) != HCOLL_SUCCESS)
        goto clean_nccl;
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

clean_nccl:
    hc_intra_destroy(d->nccl);
    d->nccl = NULL;
clean_gpu:
    if (local == HCOLL_SUCCESS) {
        dev_unpin_staging(d);
        hc_gdr_dev_push(d->gpu);
        hc_gdr_gate_close(d->gate, (int)c->params.timeout_ms);
        hc_gdr_dev_pop(d->gpu);
        hc_gdr_dev_close(d->gpu);
    }
    d->gate = NULL;
    d->gpu = NULL;
    d->dev = -1;
    d->setup_failed = st;
    return st;
}

/* ------------------------------------------------------------------------ */
/* Timing events                                                              */
/* ------------------------------------------------------------------------ */

/* Record timing event i of o on stream. Timing is best effort: an event
 * that cannot be made leaves its stage untimed, never fails the call. */
void hc_dev_tev_mark(hc_coll_dev_t *d, hc_dev_op_t *o, int i, void *stream)
{
    void *e = hc_gdr_tev_mark(d->gpu->cu, stream);
    if (!e)
        return;
    o->tev[i] = e;
    if (i + 1 > o->ntev)
        o->ntev = i + 1;
}

void hc_dev_tev_free(hc_coll_dev_t *d, hc_dev_op_t *o)
{
    for (int i = 0; i < o->ntev; i++)
        hc_gdr_dev_event_free(d->gpu, o->tev[i]);
    o->ntev = 0;
}

/* Microseconds between timing events a and b of o, or -1. */
double hc_dev_tev_us(hc_coll_dev_t *d, const hc_dev_op_t *o, int a, int b)
{
    if (a >= o->ntev || b >= o->ntev)
        return -1;
    return hc_gdr_tev_us(d->gpu->cu, o->tev[a], o->tev[b]);
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
        /* The executor has drained its queue, so every issued gate was
         * opened; this is the safety net should one not have been. */
        if (d->gate)
            hc_gdr_gate_release_all(d->gate);
        /* On abort, NCCL goes first: ncclCommAbort ends its kernels, which
         * may wait for dead peers, so that the streams can move on. */
        if (aborting) {
            hc_intra_abort(d->agree);
            hc_intra_abort(d->nccl);
            hc_intra_destroy(d->nccl);
            d->nccl = NULL;
        }
        /* Streams must be past hcoll's work before its memory goes. */
        int drain_ms = aborting ? DEV_ABORT_DRAIN_MS : (int)c->params.timeout_ms;
        int stuck = hc_gdr_evlist_drain(&d->done, d->gpu->cu, drain_ms, &d->rp) != HCOLL_SUCCESS;
        hc_intra_destroy(d->nccl);
        hc_intra_destroy(d->agree);
        if (stuck) {
            /* Leaving memory allocated is the lesser harm: freeing memory a
             * stream still uses could corrupt it at random. */
            HC_WARN(HC_GDR, c->rank,
                    "a CUDA stream is still inside a device call; hcoll's device memory "
                    "is left allocated");
        }
        if (d->v_buf && !stuck) /* else a stream may still use it */
            hc_gdr_dev_free(d->gpu, d->v_buf);
        hc_gdr_dev_event_free(d->gpu, d->v_free);
        if (d->gdr)
            hc_ring_disable_device(d->ring);
        hc_gdr_gate_close(d->gate, stuck ? 0 : drain_ms);
        hc_gdr_dev_pop(d->gpu);
        dev_unpin_staging(d);
        hc_gdr_dev_close(d->gpu);
    } else {
        hc_gdr_evlist_drain(&d->done, NULL, 0, &d->rp);
    }
    free(d);
}

/* Between slices of a wait for the caller's stream: a late local peer is
 * waited for, a dead or stopped one ends the call. */
static hcoll_status_t stream_watch(void *arg)
{
    hc_coll_dev_t *d = arg;
    return hc_coll_peers_alive(d->c->coll, "(seen from the device stage)");
}

hcoll_status_t hc_dev_wait_stream(hc_coll_dev_t *d, void *ev, const char *what)
{
    const int op_tmo = d->c->params.op_timeout_ms > 0 ? (int)d->c->params.op_timeout_ms : -1;
    return hc_gdr_event_wait_watched(d->gpu->cu, ev, op_tmo, &d->rp, what, stream_watch, d);
}

hcoll_status_t hc_dev_call_begin(hc_coll_dev_t *d, void *stream, void **ev_done_out)
{
    hcoll_status_t st;
    *ev_done_out = NULL;
    HC_CHECK(hc_gdr_dev_enter(d->gpu), out);
    HC_CHECK(hc_gdr_dev_stream_check(d->gpu, stream), clean_ctx);
    HC_CHECK(hc_gdr_dev_event_new(d->gpu, ev_done_out), clean_ctx);
    return HCOLL_SUCCESS;

clean_ctx:
    hc_gdr_dev_pop(d->gpu);
out:
    return st;
}

hcoll_status_t hc_dev_call_end(hc_coll_dev_t *d, void *stream, void *ev_done, hcoll_status_t st)
{
    if (st == HCOLL_SUCCESS)
        hc_gdr_dev_event_track(d->gpu, ev_done, stream, &d->done, (int)d->c->params.timeout_ms);
    else
        hc_gdr_dev_event_free(d->gpu, ev_done);
    hc_gdr_dev_pop(d->gpu);
    return st;
}
