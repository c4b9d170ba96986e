/*
 * Gates (gate.h): a host-written word that hcoll's own stream waits on.
 */
#include "gdr/gate.h"

#include <stdlib.h>

#include "base/log.h"
#include "gdr/mem.h"

/* The word and its neighbour "done" on their own cache lines. */
#define GATE_WORD_BYTES 128

static hc_cu_dptr_t dptr(const void *p)
{
    return (hc_cu_dptr_t)(uintptr_t)p;
}

hcoll_status_t hc_gdr_gate_open(const hc_cu_api_t *cu, const hc_gdr_report_t *rp,
                                hc_gdr_gate_t **out)
{
    hc_cu_res_t r;
    const char *what = "cuStreamCreate (gate stream)";
    hc_gdr_gate_t *g = calloc(1, sizeof *g);
    if (!g)
        return hc_err_set(rp->err, HC_GDR, rp->rank, HCOLL_ERR_NO_MEMORY, "no memory for a gate");
    g->cu = cu;
    g->rp = *rp;
    pthread_mutex_init(&g->lock, NULL);
    if ((r = cu->stream_create(&g->stream, HC_CU_STREAM_NON_BLOCKING)) != HC_CU_SUCCESS)
        goto clean_gate;
    /* From the GPU's pinned pool (gdr/mem.h): cuMemFreeHost would wait for
     * every stream at close, the application's included. With unified
     * addressing pinned memory is mapped into every context at its host
     * address, but the driver's word for the device address is
     * cuMemHostGetDevicePointer's (write-combined memory, platforms
     * without that identity); a driver that will not say (memory not
     * allocated with DEVICEMAP, on a driver that insists) leaves the host
     * address, which is the device address wherever it cannot tell. */
    what = "cuCtxGetDevice (gate word)";
    if ((r = cu->ctx_get_device(&g->cudev)) != HC_CU_SUCCESS)
        goto clean_stream;
    what = "cuMemHostAlloc (gate word)";
    if ((r = hc_gdr_pin_get(cu, g->cudev, GATE_WORD_BYTES, (void **)&g->word)) != HC_CU_SUCCESS)
        goto clean_stream;
    if (cu->host_get_device_pointer(&g->dword, g->word, 0) != HC_CU_SUCCESS)
        g->dword = dptr(g->word);
    __atomic_store_n(g->word, 0, __ATOMIC_RELEASE);
    g->done = g->word + 16;
    __atomic_store_n(g->done, 0, __ATOMIC_RELEASE);
    what = "cuEventCreate (gate)";
    if ((r = cu->event_create(&g->ev_drain, HC_CU_EVENT_DISABLE_TIMING)) != HC_CU_SUCCESS)
        goto clean_word;
    *out = g;
    return HCOLL_SUCCESS;

clean_word:
    hc_gdr_pin_put(g->cudev, g->word, GATE_WORD_BYTES);
clean_stream:
    cu->stream_destroy(g->stream);
clean_gate:
    pthread_mutex_destroy(&g->lock);
    free(g);
    return hc_gdr_cu_fail(rp, r, what);
}

void hc_gdr_gate_close(hc_gdr_gate_t *g, int timeout_ms)
{
    if (!g)
        return;
    const hc_cu_api_t *cu = g->cu;
    hc_gdr_gate_release_all(g);
    /* ev_drain was recorded behind each call's work at call time
     * (hc_gdr_gate_mark): recording it now could put it behind an
     * application's blocked stream on a shared hardware queue. */
    int drained = hc_gdr_event_wait(cu, g->ev_drain, timeout_ms, 0, &g->rp,
                                    "hcoll's gate stream to drain") == HCOLL_SUCCESS;
    cu->event_destroy(g->ev_drain);
    cu->stream_destroy(g->stream);
    if (drained)
        hc_gdr_pin_put(g->cudev, g->word, GATE_WORD_BYTES);
    else
        HC_WARN(HC_GDR, g->rp.rank, "hcoll's gate stream did not drain; its word is left "
                "allocated");
    pthread_mutex_destroy(&g->lock);
    free(g);
}

hcoll_status_t hc_gdr_gate_wait(hc_gdr_gate_t *g, uint32_t *ticket_out)
{
    pthread_mutex_lock(&g->lock);
    uint32_t t = ++g->issued;
    hc_cu_res_t r = g->cu->stream_wait_value32(g->stream, g->dword, t,
                                               HC_CU_STREAM_WAIT_VALUE_GEQ);
    if (r != HC_CU_SUCCESS)
        g->issued--;
    pthread_mutex_unlock(&g->lock);
    if (r != HC_CU_SUCCESS)
        return hc_gdr_cu_fail(&g->rp, r, "cuStreamWaitValue32 (gate)");
    *ticket_out = t;
    return HCOLL_SUCCESS;
}

void hc_gdr_gate_release(hc_gdr_gate_t *g, uint32_t t)
{
    pthread_mutex_lock(&g->lock);
    /* Never backwards, never past what was issued. */
    if ((int32_t)(t - g->released) > 0 && (int32_t)(g->issued - t) >= 0) {
        g->released = t;
        __atomic_store_n(g->word, t, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g->lock);
}

void hc_gdr_gate_release_all(hc_gdr_gate_t *g)
{
    pthread_mutex_lock(&g->lock);
    uint32_t t = g->issued;
    pthread_mutex_unlock(&g->lock);
    hc_gdr_gate_release(g, t);
}

hcoll_status_t hc_gdr_gate_signal(hc_gdr_gate_t *g, uint32_t *value_out)
{
    const uint32_t v = g->signaled + 1;
    /* done is 16 words past word, on the device as on the host */
    hc_cu_res_t r = g->cu->stream_write_value32(g->stream, g->dword + 16 * sizeof *g->word, v,
                                                HC_CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != HC_CU_SUCCESS)
        return hc_gdr_cu_fail(&g->rp, r, "cuStreamWriteValue32 (gate signal)");
    g->signaled = v;
    *value_out = v;
    return HCOLL_SUCCESS;
}

uint32_t hc_gdr_gate_done(const hc_gdr_gate_t *g)
{
    return __atomic_load_n(g->done, __ATOMIC_ACQUIRE);
}

hcoll_status_t hc_gdr_gate_copy(hc_gdr_gate_t *g, void *host, void *dev, size_t bytes,
                                int to_host)
{
    hc_cu_res_t r = to_host ? g->cu->memcpy_dtoh_async(host, dptr(dev), bytes, g->stream)
                            : g->cu->memcpy_htod_async(dptr(dev), host, bytes, g->stream);
    if (r != HC_CU_SUCCESS)
        return hc_gdr_cu_fail(&g->rp, r, to_host ? "cuMemcpyDtoHAsync (staging)"
                                                 : "cuMemcpyHtoDAsync (staging)");
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_gdr_gate_mark(hc_gdr_gate_t *g)
{
    hc_cu_res_t r = g->cu->event_record(g->ev_drain, g->stream);
    return r == HC_CU_SUCCESS ? HCOLL_SUCCESS : hc_gdr_cu_fail(&g->rp, r, "cuEventRecord (gate)");
}
