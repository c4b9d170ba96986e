/*
 * Memory owned by hcoll (mem.h), through the driver table of gdr.c: device
 * memory of its own, and what it keeps per GPU for the process life. The
 * GPU's primary context is retained for as long as the memory lives, so
 * the application resetting or releasing it cannot pull the allocation
 * away underneath its owner.
 */
#include "gdr/mem.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

int hc_gdr_dmem_alloc(int gpu, size_t bytes, hc_gdr_dmem_t *m)
{
    memset(m, 0, sizeof *m);
    const hc_cu_api_t *cu = hc_gdr_cu(NULL, 0);
    int dev;
    void *ctx = NULL, *prev;
    if (!cu || cu->device_get(&dev, gpu) != HC_CU_SUCCESS ||
        cu->primary_retain(&ctx, dev) != HC_CU_SUCCESS)
        return -1;
    cu->ctx_push(ctx);
    hc_cu_dptr_t p = 0;
    hc_cu_res_t r = cu->mem_alloc(&p, bytes);
    cu->ctx_pop(&prev);
    if (r != HC_CU_SUCCESS) {
        cu->primary_release(dev);
        return -1;
    }
    m->ptr = p;
    m->cudev = dev;
    return 0;
}

void hc_gdr_dmem_free(hc_gdr_dmem_t *m)
{
    const hc_cu_api_t *cu = m->ptr ? hc_gdr_cu(NULL, 0) : NULL;
    if (!cu)
        return;
    void *ctx, *prev, *s = NULL;
    if (cu->primary_retain(&ctx, m->cudev) == HC_CU_SUCCESS) {
        cu->ctx_push(ctx);
        /* Stream-ordered on a stream of our own: cuMemFree would wait for
         * every stream of the context, the application's included. */
        if (cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) == HC_CU_SUCCESS) {
            cu->mem_free_async(m->ptr, s);
            cu->stream_destroy(s);
        }
        cu->ctx_pop(&prev);
        cu->primary_release(m->cudev);
    }
    cu->primary_release(m->cudev); /* hc_gdr_dmem_alloc's */
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------------ */
/* What hcoll keeps per GPU for the process life                             */
/* ------------------------------------------------------------------------ */

/*
 * cuMemFreeHost and cuModuleUnload synchronise the device on real drivers:
 * they wait for every stream, the application's included, so a destroy that
 * called them would hang behind a stream the application holds. Nor can
 * the primary context be released to nothing (destroying it synchronises
 * too). So per GPU, once: one reference on its primary context, the
 * kernels' module (kern.c) and the idle pinned staging buffers, reused by
 * every later communicator on that GPU and never freed; the driver reclaims
 * them when the process ends. Process-wide on purpose: this is driver
 * state, like the driver's own, and bounded by the most buffers that were
 * ever in use at once.
 */
#define KEEP_MAX_DEV 64

typedef struct pin_buf {
    void *p;
    size_t bytes;
} pin_buf_t;

static struct {
    pthread_mutex_t lock;
    struct {
        int kept;           /* the primary context is retained */
        pin_buf_t *idle;
        size_t nidle, cap;
    } dev[KEEP_MAX_DEV];
} g_keep = { .lock = PTHREAD_MUTEX_INITIALIZER };

static int keep_slot(int cudev)
{
    return cudev >= 0 && cudev < KEEP_MAX_DEV ? cudev : -1;
}

int hc_gdr_keep_ctx(const hc_cu_api_t *cu, int cudev)
{
    int i = keep_slot(cudev);
    if (i < 0)
        return -1;
    void *ctx;
    int ok = 1;
    pthread_mutex_lock(&g_keep.lock);
    if (!g_keep.dev[i].kept) {
        ok = cu->primary_retain(&ctx, cudev) == HC_CU_SUCCESS;
        g_keep.dev[i].kept = ok;
    }
    pthread_mutex_unlock(&g_keep.lock);
    return ok ? 0 : -1;
}

hc_cu_res_t hc_gdr_pin_get(const hc_cu_api_t *cu, int cudev, size_t bytes, void **out)
{
    int i = keep_slot(cudev);
    *out = NULL;
    if (i >= 0) {
        pthread_mutex_lock(&g_keep.lock);
        size_t best = g_keep.dev[i].nidle;
        for (size_t k = 0; k < g_keep.dev[i].nidle; k++) {
            const pin_buf_t *b = &g_keep.dev[i].idle[k];
            if (b->bytes >= bytes &&
                (best == g_keep.dev[i].nidle || b->bytes < g_keep.dev[i].idle[best].bytes))
                best = k;
        }
        if (best < g_keep.dev[i].nidle) {
            *out = g_keep.dev[i].idle[best].p;
            g_keep.dev[i].idle[best] = g_keep.dev[i].idle[--g_keep.dev[i].nidle];
        }
        pthread_mutex_unlock(&g_keep.lock);
        if (*out)
            return HC_CU_SUCCESS;
    }
    /* The context stays retained while the buffer may be reused. */
    if (i < 0 || hc_gdr_keep_ctx(cu, cudev) != 0)
        return 1; /* CUDA_ERROR_INVALID_VALUE: no such GPU */
    return cu->host_alloc(out, bytes, 0);
}

void hc_gdr_pin_put(int cudev, void *p, size_t bytes)
{
    int i = keep_slot(cudev);
    if (!p || i < 0)
        return;
    pthread_mutex_lock(&g_keep.lock);
    if (g_keep.dev[i].nidle == g_keep.dev[i].cap) {
        size_t cap = g_keep.dev[i].cap ? 2 * g_keep.dev[i].cap : 4;
        pin_buf_t *n = realloc(g_keep.dev[i].idle, cap * sizeof *n);
        if (n) {
            g_keep.dev[i].idle = n;
            g_keep.dev[i].cap = cap;
        }
    }
    /* No room (out of host memory): the buffer stays allocated, unused. */
    if (g_keep.dev[i].nidle < g_keep.dev[i].cap)
        g_keep.dev[i].idle[g_keep.dev[i].nidle++] = (pin_buf_t){ p, bytes };
    pthread_mutex_unlock(&g_keep.lock);
}

size_t hc_gdr_pin_idle(int cudev)
{
    int i = keep_slot(cudev);
    if (i < 0)
        return 0;
    pthread_mutex_lock(&g_keep.lock);
    size_t n = g_keep.dev[i].nidle;
    pthread_mutex_unlock(&g_keep.lock);
    return n;
}
