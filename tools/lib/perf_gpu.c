/*
 * hcoll_perf's buffers (see perf_rank.h): host memory, or with --mem
 * device memory on this rank's GPU through the library's CUDA driver
 * loader (gdr/gdr.h), so that the binary never links CUDA. Every call goes
 * on the rank's one non-blocking stream; -c fills and reads go through
 * host copies.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_rank.h"

static void cu_die(hp_perf_t *p, const char *what, hc_cu_res_t r)
{
    char eb[200], msg[300];
    snprintf(msg, sizeof msg, "--mem device: %s: %s", what, hc_gdr_cu_errstr(r, eb, sizeof eb));
    hp_die(p, "%s", msg);
}

/* Local rank i on GPU i mod #GPUs, as a job with one GPU per local rank
 * would be placed; the primary context is the one the CUDA runtime of a
 * training framework would use. */
void hp_gpu_open(hp_perf_t *p)
{
    char why[256] = "";
    hp_gpu_t *g = &p->gpu;
    const hc_cu_api_t *cu = hc_gdr_cu(why, sizeof why);
    if (!cu)
        hp_die(p, "--mem device: no usable CUDA driver: %s", why);
    int ndev = 0, d;
    while (ndev < 1024 && cu->device_get(&d, ndev) == HC_CU_SUCCESS)
        ndev++;
    if (ndev == 0)
        hp_die(p, "%s", "--mem device: the CUDA driver reports no GPU");
    int local = 0;
    hcoll_comm_local_rank(p->comm, &local);
    g->ordinal = local % ndev;
    hc_cu_res_t r;
    if ((r = cu->device_get(&g->cudev, g->ordinal)) != HC_CU_SUCCESS)
        cu_die(p, "cuDeviceGet", r);
    if ((r = cu->primary_retain(&g->ctx, g->cudev)) != HC_CU_SUCCESS)
        cu_die(p, "cuDevicePrimaryCtxRetain", r);
    g->cu = cu; /* from here on, hp_gpu_close releases */
    if ((r = cu->ctx_set_current(g->ctx)) != HC_CU_SUCCESS)
        cu_die(p, "cuCtxSetCurrent", r);
    if ((r = cu->stream_create(&g->stream, HC_CU_STREAM_NON_BLOCKING)) != HC_CU_SUCCESS)
        cu_die(p, "cuStreamCreate", r);
    int cc = 0, dmabuf = 0;
    if (hc_gdr_gpu_info(g->ordinal, g->busid, sizeof g->busid, &cc, &dmabuf) != 0)
        snprintf(g->busid, sizeof g->busid, "?");
}

void hp_gpu_close(hp_perf_t *p)
{
    hp_gpu_t *g = &p->gpu;
    if (!g->cu)
        return;
    if (g->stream)
        g->cu->stream_destroy(g->stream);
    g->cu->primary_release(g->cudev);
    g->cu = NULL;
}

void *hp_buf_alloc(hp_perf_t *p, size_t n)
{
    if (!n)
        n = 1;
    if (p->gpu.cu) {
        hc_cu_dptr_t d = 0;
        hc_cu_res_t r = p->gpu.cu->mem_alloc(&d, n);
        if (r != HC_CU_SUCCESS)
            cu_die(p, "cuMemAlloc", r);
        return (void *)(uintptr_t)d;
    }
    void *h = NULL;
    if (posix_memalign(&h, 4096, n) != 0)
        hp_die(p, "%s", "out of memory for the buffers");
    return h;
}

void hp_buf_free(hp_perf_t *p, void *b)
{
    if (p->gpu.cu && b)
        p->gpu.cu->mem_free((hc_cu_dptr_t)(uintptr_t)b);
    else
        free(b);
}

/* Wait for everything on this rank's stream; nothing to do on the host. */
void hp_buf_sync(hp_perf_t *p)
{
    if (!p->gpu.cu)
        return;
    hc_cu_res_t r = p->gpu.cu->stream_synchronize(p->gpu.stream);
    if (r != HC_CU_SUCCESS)
        cu_die(p, "cuStreamSynchronize", r);
}

/* n bytes from the host to a benchmark buffer, complete on return. */
void hp_buf_put(hp_perf_t *p, void *dst, const void *host, size_t n)
{
    if (!p->gpu.cu) {
        memcpy(dst, host, n);
        return;
    }
    hc_cu_res_t r = p->gpu.cu->memcpy_htod_async((hc_cu_dptr_t)(uintptr_t)dst, host, n,
                                                 p->gpu.stream);
    if (r != HC_CU_SUCCESS)
        cu_die(p, "cuMemcpyHtoDAsync", r);
    hp_buf_sync(p);
}

/* n bytes of a benchmark buffer to the host, after everything before. */
void hp_buf_get(hp_perf_t *p, void *host, const void *src, size_t n)
{
    if (!p->gpu.cu) {
        memcpy(host, src, n);
        return;
    }
    hc_cu_res_t r = p->gpu.cu->memcpy_dtoh_async(host, (hc_cu_dptr_t)(uintptr_t)src, n,
                                                 p->gpu.stream);
    if (r != HC_CU_SUCCESS)
        cu_die(p, "cuMemcpyDtoHAsync", r);
    hp_buf_sync(p);
}

void hp_buffers_open(hp_perf_t *p)
{
    size_t max = (size_t)p->o.maxbytes;
    if (posix_memalign(&p->stage, 4096, max ? max : 1) ||
        posix_memalign((void **)&p->scratch, 64, 64))
        hp_die(p, "%s", "out of memory for the buffers");
    if (p->o.mem == HP_MEM_DEVICE)
        hp_gpu_open(p);
    p->send = hp_buf_alloc(p, max);
    p->recv = hp_buf_alloc(p, max);
    memset(p->stage, 0, max);
    hp_buf_put(p, p->send, p->stage, max);
    hp_buf_put(p, p->recv, p->stage, max);
}

void hp_buffers_close(hp_perf_t *p)
{
    hp_buf_free(p, p->send);
    hp_buf_free(p, p->recv);
    hp_gpu_close(p);
    free(p->stage);
    free(p->scratch);
}
