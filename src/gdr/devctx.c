/*
 * One GPU for the device executor (devctx.h): open/close, callers'
 * streams, and the device memory operations of a GPUDirect ring.
 */
#include "gdr/devctx.h"

#include <stdlib.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "gdr/mem.h"

/* How long close waits for the internal stream before it gives up reusing
 * the staging buffers. */
#define DEV_CLOSE_DRAIN_MS 2000

#define CU_TRY(g, call, what, label)                                                         \
    do {                                                                                     \
        hc_cu_res_t r_ = (call);                                                             \
        if (r_ != HC_CU_SUCCESS) {                                                           \
            st = hc_gdr_cu_fail(&(g)->rp, r_, (what));                                       \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

static hc_cu_dptr_t dptr(const void *p)
{
    return (hc_cu_dptr_t)(uintptr_t)p;
}

void hc_gdr_dev_push(hc_gdr_dev_t *g)
{
    g->cu->ctx_push(g->ctx);
}

hcoll_status_t hc_gdr_dev_enter(hc_gdr_dev_t *g)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    CU_TRY(g, g->cu->ctx_push(g->ctx), "cuCtxPushCurrent", out);
out:
    return st;
}

void hc_gdr_dev_pop(hc_gdr_dev_t *g)
{
    void *popped;
    g->cu->ctx_pop(&popped);
}

/* Has the internal stream run everything queued so far? ev_fence is
 * recorded behind each piece of work when it is enqueued (istream_mark),
 * never here: at destroy, a record would queue behind whatever an
 * application's blocked stream holds up on a shared hardware queue. Polled
 * with a bound, so that a wait of its own that never ends cannot hang a
 * destroy. */
static int dev_istream_idle(hc_gdr_dev_t *g)
{
    const hc_cu_api_t *cu = g->cu;
    if (!g->ev_fence)
        return 0;
    const double deadline = hc_now_ms() + DEV_CLOSE_DRAIN_MS;
    for (;;) {
        hc_cu_res_t r = cu->event_query(g->ev_fence);
        if (r != HC_CU_ERROR_NOT_READY)
            return r == HC_CU_SUCCESS;
        if (hc_now_ms() > deadline)
            return 0;
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
    }
}

/* ev_fence behind everything enqueued on istream so far (call it after
 * each enqueue); a failed record leaves close unsure, so it keeps the
 * staging buffers. */
static hc_cu_res_t istream_mark(hc_gdr_dev_t *g, hc_cu_res_t r)
{
    if (r == HC_CU_SUCCESS && g->ev_fence && g->cu->event_record(g->ev_fence, g->istream) !=
                                                 HC_CU_SUCCESS)
        g->fence_lost = 1;
    return r;
}

/* Give device memory of hcoll's back behind stream's work (mem.h), and say
 * once per GPU when it is kept for reuse rather than freed. */
static void dev_put(hc_gdr_dev_t *g, hc_cu_dptr_t p, void *stream, const char *what)
{
    int r = hc_gdr_dbuf_put(g->cu, g->cudev, p, stream);
    if (r == 2)
        HC_INFO(HC_GDR, g->rp.rank, "GPU %d has no memory pools (cuMemFreeAsync): hcoll keeps "
                "its device memory for reuse instead of freeing it, as cuMemFree would wait "
                "for the application's streams", g->ordinal);
    else if (r < 0)
        HC_WARN(HC_GDR, g->rp.rank, "%s could not be freed; left allocated", what);
}

/* Free what open made; the context must be current. Nothing here may
 * synchronise the device (gdr/mem.h): the kernels stay loaded for the next
 * communicator, the staging buffers go back to the GPU's pinned pool. */
static void dev_free_locals(hc_gdr_dev_t *g)
{
    const hc_cu_api_t *cu = g->cu;
    g->kern = NULL;
    const int idle = (g->stage[0] || g->stage[1]) && !g->fence_lost && dev_istream_idle(g);
    if ((g->stage[0] || g->stage[1]) && !idle)
        HC_WARN(HC_GDR, g->rp.rank, "hcoll's internal stream did not drain within %d ms; its "
                "staging buffers are left allocated", DEV_CLOSE_DRAIN_MS);
    for (int i = 0; i < 2; i++) {
        if (idle)
            hc_gdr_pin_put(g->cudev, g->stage[i], g->stage_bytes);
        g->stage[i] = NULL;
    }
    if (g->ev_fence)
        cu->event_destroy(g->ev_fence);
    if (g->istream)
        cu->stream_destroy(g->istream);
    g->ev_fence = g->istream = NULL;
}

/* Everything after the context: stream, fence, staging, kernels. */
static hcoll_status_t dev_make_locals(hc_gdr_dev_t *g)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    const hc_cu_api_t *cu = g->cu;
    CU_TRY(g, cu->stream_create(&g->istream, HC_CU_STREAM_NON_BLOCKING), "cuStreamCreate", out);
    CU_TRY(g, cu->event_create(&g->ev_fence, HC_CU_EVENT_DISABLE_TIMING), "cuEventCreate", out);
    for (int i = 0; g->stage_bytes && i < 2; i++)
        CU_TRY(g, hc_gdr_pin_get(cu, g->cudev, g->stage_bytes, &g->stage[i]),
               "cuMemHostAlloc (staging)", out);
    /* The kernels are optional: only AVG on one node and a GPUDirect ring
     * need them. */
    if (hc_gdr_kern_shared(g->cudev, &g->kern, g->kern_why, sizeof g->kern_why) != HCOLL_SUCCESS)
        g->kern = NULL;
out:
    return st;
}

hcoll_status_t hc_gdr_dev_open(const hc_cu_api_t *cu, int ordinal, size_t stage_bytes,
                               const hc_gdr_report_t *rp, hc_gdr_dev_t **out)
{
    hcoll_status_t st;
    hc_gdr_dev_t *g = calloc(1, sizeof *g);
    if (!g)
        return hc_err_set(rp->err, HC_GDR, rp->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the device path");
    g->cu = cu;
    g->rp = *rp;
    g->ordinal = ordinal;
    g->stage_bytes = stage_bytes;
    CU_TRY(g, cu->device_get(&g->cudev, ordinal), "cuDeviceGet", clean_dev);
    CU_TRY(g, cu->primary_retain(&g->ctx, g->cudev), "cuDevicePrimaryCtxRetain", clean_dev);
    /* Our release at close must never destroy the context: that would
     * synchronise the device, and free what the GPU's pool keeps. */
    if (hc_gdr_keep_ctx(cu, g->cudev) != 0) {
        st = hc_err_set(rp->err, HC_GDR, rp->rank, HCOLL_ERR_CUDA,
                        "GPU %d's primary context cannot be retained", ordinal);
        goto clean_ctx;
    }
    CU_TRY(g, cu->ctx_push(g->ctx), "cuCtxPushCurrent", clean_ctx);
    st = dev_make_locals(g);
    if (st != HCOLL_SUCCESS)
        dev_free_locals(g);
    hc_gdr_dev_pop(g);
    if (st != HCOLL_SUCCESS)
        goto clean_ctx;
    *out = g;
    return HCOLL_SUCCESS;

clean_ctx:
    cu->primary_release(g->cudev);
clean_dev:
    free(g);
    return st;
}

void hc_gdr_dev_close(hc_gdr_dev_t *g)
{
    if (!g)
        return;
    hc_gdr_dev_push(g);
    dev_free_locals(g);
    hc_gdr_dev_pop(g);
    g->cu->primary_release(g->cudev);
    free(g);
}

static hcoll_status_t capture_refused(const hc_gdr_report_t *rp)
{
    return hc_err_set(rp->err, HC_COLL, rp->rank, HCOLL_ERR_UNSUPPORTED,
                      "the stream is being captured into a CUDA graph: hcoll's device "
                      "all-reduce waits on a host thread, which a graph cannot replay; call "
                      "it outside the capture");
}

hcoll_status_t hc_gdr_stream_refuse_capture(const hc_cu_api_t *cu, void *stream,
                                            const hc_gdr_report_t *rp)
{
    int cap = HC_CU_STREAM_CAPTURE_STATUS_NONE;
    if (cu && cu->stream_is_capturing(stream, &cap) == HC_CU_SUCCESS &&
        cap != HC_CU_STREAM_CAPTURE_STATUS_NONE)
        return capture_refused(rp);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_gdr_dev_stream_check(hc_gdr_dev_t *g, void *stream)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    int cap = HC_CU_STREAM_CAPTURE_STATUS_NONE;
    CU_TRY(g, g->cu->stream_is_capturing(stream, &cap),
           "cuStreamIsCapturing (is the stream valid?)", out);
    if (cap != HC_CU_STREAM_CAPTURE_STATUS_NONE)
        return capture_refused(&g->rp);
    void *sctx = NULL;
    if (g->cu->stream_get_ctx(stream, &sctx) == HC_CU_SUCCESS && sctx && sctx != g->ctx)
        st = hc_err_set(g->rp.err, HC_COLL, g->rp.rank, HCOLL_ERR_INVALID_ARG,
                        "the stream belongs to another CUDA context than GPU %d's primary "
                        "context, which this communicator uses",
                        g->ordinal);
out:
    return st;
}

hcoll_status_t hc_gdr_dev_event_new(hc_gdr_dev_t *g, void **ev_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    void *ev = NULL;
    CU_TRY(g, g->cu->event_create(&ev, HC_CU_EVENT_DISABLE_TIMING), "cuEventCreate", out);
    *ev_out = ev;
out:
    return st;
}

hcoll_status_t hc_gdr_dev_event_mark(hc_gdr_dev_t *g, void *stream, void **ev_out)
{
    void *ev = NULL;
    hcoll_status_t st = hc_gdr_dev_event_new(g, &ev);
    if (st != HCOLL_SUCCESS)
        return st;
    hc_cu_res_t r = g->cu->event_record(ev, stream);
    if (r != HC_CU_SUCCESS) {
        g->cu->event_destroy(ev);
        return hc_gdr_cu_fail(&g->rp, r, "cuEventRecord");
    }
    *ev_out = ev;
    return HCOLL_SUCCESS;
}

void hc_gdr_dev_event_free(hc_gdr_dev_t *g, void *ev)
{
    if (ev)
        g->cu->event_destroy(ev);
}

void hc_gdr_dev_event_track(hc_gdr_dev_t *g, void *ev, void *stream, hc_gdr_evlist_t *l,
                            int timeout_ms)
{
    if (g->cu->event_record(ev, stream) == HC_CU_SUCCESS)
        hc_gdr_evlist_add(l, g->cu, ev, timeout_ms, &g->rp);
    else
        g->cu->event_destroy(ev);
}

hcoll_status_t hc_gdr_dev_copy_async(hc_gdr_dev_t *g, void *dst, const void *src, size_t bytes,
                                     void *stream)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    CU_TRY(g, g->cu->memcpy_dtod_async(dptr(dst), dptr(src), bytes, stream),
           "cuMemcpyDtoDAsync", out);
out:
    return st;
}

hcoll_status_t hc_gdr_dev_avg_async(hc_gdr_dev_t *g, void *buf, size_t count,
                                    hcoll_dtype_t dtype, int div, void *stream)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    CU_TRY(g, hc_gdr_kern_avg(g->kern, dptr(buf), count, dtype, div, stream),
           "launching the AVG kernel", out);
out:
    return st;
}

hcoll_status_t hc_gdr_dev_scale_async(hc_gdr_dev_t *g, void *dst, const void *src, size_t count,
                                      hcoll_dtype_t dtype, const void *dev_scalar, uint64_t kbits,
                                      void *stream)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    CU_TRY(g, hc_gdr_kern_scale(g->kern, dptr(dst), dptr(src), count, dtype, dptr(dev_scalar),
                                kbits, stream),
           "launching the scaling kernel", out);
out:
    return st;
}

void hc_gdr_dev_free_async(hc_gdr_dev_t *g, void *p, void *stream)
{
    dev_put(g, dptr(p), stream, "device memory");
}

hcoll_status_t hc_gdr_dev_stream_wait_event(hc_gdr_dev_t *g, void *stream, void *ev)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    CU_TRY(g, g->cu->stream_wait_event(stream, ev, 0), "cuStreamWaitEvent", out);
out:
    return st;
}

hcoll_status_t hc_gdr_dev_event_record(hc_gdr_dev_t *g, void *ev, void *stream)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    CU_TRY(g, g->cu->event_record(ev, stream), "cuEventRecord", out);
out:
    return st;
}

/* Finish a device memory operation: wait for the internal stream, pop the
 * context pushed before it. */
static hcoll_status_t devop_done(hc_gdr_dev_t *g, hc_cu_res_t r, const char *what)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    r = istream_mark(g, r);
    if (r == HC_CU_SUCCESS)
        r = g->cu->stream_synchronize(g->istream);
    if (r != HC_CU_SUCCESS)
        st = hc_gdr_cu_fail(&g->rp, r, what);
    hc_gdr_dev_pop(g);
    return st;
}

hcoll_status_t hc_gdr_dev_alloc(hc_gdr_dev_t *g, size_t bytes, void **out)
{
    hc_cu_dptr_t p = 0;
    hc_gdr_dev_push(g);
    hcoll_status_t st =
        devop_done(g, hc_gdr_dbuf_get(g->cu, g->cudev, bytes, &p), "cuMemAlloc (device slots)");
    *out = (void *)(uintptr_t)p;
    return st;
}

void hc_gdr_dev_free(hc_gdr_dev_t *g, void *p)
{
    hc_gdr_dev_push(g);
    /* Stream-ordered: never waits for the application's streams. */
    dev_put(g, dptr(p), g->istream, "device slots");
    hc_gdr_dev_pop(g);
}

hcoll_status_t hc_gdr_dev_reduce(hc_gdr_dev_t *g, void *dst, const void *a, const void *b,
                                 size_t count, hcoll_dtype_t dtype, hcoll_op_t op)
{
    hc_gdr_dev_push(g);
    return devop_done(g,
                      hc_gdr_kern_reduce(g->kern, dptr(dst), dptr(a), dptr(b), count, dtype, op,
                                         g->istream),
                      "the reduction kernel (GPUDirect ring)");
}

hcoll_status_t hc_gdr_dev_avg(hc_gdr_dev_t *g, void *buf, size_t count, hcoll_dtype_t dtype,
                              int div)
{
    hc_gdr_dev_push(g);
    return devop_done(g, hc_gdr_kern_avg(g->kern, dptr(buf), count, dtype, div, g->istream),
                      "the AVG kernel (GPUDirect ring)");
}

hcoll_status_t hc_gdr_dev_copy(hc_gdr_dev_t *g, void *dst, const void *src, size_t bytes)
{
    hc_gdr_dev_push(g);
    return devop_done(g, g->cu->memcpy_dtod_async(dptr(dst), dptr(src), bytes, g->istream),
                      "cuMemcpyDtoDAsync (GPUDirect ring)");
}
