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
    hc_cu_res_t r = hc_gdr_dbuf_get(cu, dev, bytes, &p);
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
        /* Stream-ordered on a stream of our own, or kept for reuse:
         * cuMemFree would wait for every stream of the context, the
         * application's included. */
        if (cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) == HC_CU_SUCCESS) {
            hc_gdr_dbuf_put(cu, m->cudev, m->ptr, s);
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

/* Device memory of hcoll's: in use, or idle (kept for reuse where
 * cuMemFreeAsync cannot free it) once ev (NULL: at once) has completed. */
typedef struct dev_buf {
    hc_cu_dptr_t p;
    size_t bytes;
    int idle;
    void *ev;
} dev_buf_t;

static struct {
    pthread_mutex_t lock;
    struct {
        int kept;           /* the primary context is retained */
        pin_buf_t *idle;
        size_t nidle, cap;
        int pools;          /* MEMORY_POOLS_SUPPORTED: 1 yes, 2 no, 0 not asked yet */
        int said;           /* the fallback was logged */
        dev_buf_t *dbuf;
        size_t ndbuf, capdbuf;
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

/* ---- Device memory without memory pools ---------------------------------- */

#define CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 115

/* Lock held. */
static int dbuf_add(int i, hc_cu_dptr_t p, size_t bytes)
{
    if (g_keep.dev[i].ndbuf == g_keep.dev[i].capdbuf) {
        size_t cap = g_keep.dev[i].capdbuf ? 2 * g_keep.dev[i].capdbuf : 8;
        dev_buf_t *n = realloc(g_keep.dev[i].dbuf, cap * sizeof *n);
        if (!n)
            return -1;
        g_keep.dev[i].dbuf = n;
        g_keep.dev[i].capdbuf = cap;
    }
    g_keep.dev[i].dbuf[g_keep.dev[i].ndbuf++] = (dev_buf_t){ p, bytes, 0, NULL };
    return 0;
}

/* An idle buffer of at least bytes whose last use is over, smallest
 * first; taken (in use again). 0: none. Lock held, context current. */
static hc_cu_dptr_t dbuf_take(const hc_cu_api_t *cu, int i, size_t bytes)
{
    dev_buf_t *best = NULL;
    for (size_t k = 0; k < g_keep.dev[i].ndbuf; k++) {
        dev_buf_t *b = &g_keep.dev[i].dbuf[k];
        if (!b->idle || b->bytes < bytes || (best && b->bytes >= best->bytes))
            continue;
        if (b->ev) {
            if (cu->event_query(b->ev) != HC_CU_SUCCESS)
                continue;
            cu->event_destroy(b->ev);
            b->ev = NULL;
        }
        best = b;
    }
    if (!best)
        return 0;
    best->idle = 0;
    return best->p;
}

hc_cu_res_t hc_gdr_dbuf_get(const hc_cu_api_t *cu, int cudev, size_t bytes, hc_cu_dptr_t *out)
{
    int i = keep_slot(cudev);
    *out = 0;
    if (i < 0 || hc_gdr_keep_ctx(cu, cudev) != 0)
        return 1; /* CUDA_ERROR_INVALID_VALUE: no such GPU */
    pthread_mutex_lock(&g_keep.lock);
    hc_cu_dptr_t p = dbuf_take(cu, i, bytes);
    hc_cu_res_t r = HC_CU_SUCCESS;
    if (!p) {
        r = cu->mem_alloc(&p, bytes);
        if (r == HC_CU_SUCCESS && dbuf_add(i, p, bytes) != 0) {
            /* Untracked, it could not be kept for reuse: give it up now,
             * unused (stream-ordered only where pools exist). */
            void *s = NULL;
            if (cu->stream_create(&s, HC_CU_STREAM_NON_BLOCKING) == HC_CU_SUCCESS) {
                cu->mem_free_async(p, s);
                cu->stream_destroy(s);
            }
            r = 2; /* CUDA_ERROR_OUT_OF_MEMORY */
            p = 0;
        }
    }
    pthread_mutex_unlock(&g_keep.lock);
    *out = p;
    return r;
}

int hc_gdr_dbuf_put(const hc_cu_api_t *cu, int cudev, hc_cu_dptr_t p, void *stream)
{
    int i = keep_slot(cudev);
    if (!p || i < 0)
        return 0;
    pthread_mutex_lock(&g_keep.lock);
    dev_buf_t *b = NULL;
    for (size_t k = 0; k < g_keep.dev[i].ndbuf && !b; k++)
        if (g_keep.dev[i].dbuf[k].p == p && !g_keep.dev[i].dbuf[k].idle)
            b = &g_keep.dev[i].dbuf[k];
    if (!g_keep.dev[i].pools) {
        int v = 0;
        g_keep.dev[i].pools =
            cu->device_attr(&v, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, cudev) ==
                    HC_CU_SUCCESS && v ? 1 : 2;
    }
    int ret = -1;
    /* cuMemFreeAsync needs memory-pool support (also for cuMemAlloc
     * memory); without it, or should it fail anyway, the buffer is kept
     * for reuse behind an event on stream: cuMemFree would wait for every
     * stream of the context. */
    if (g_keep.dev[i].pools == 1 && cu->mem_free_async(p, stream) == HC_CU_SUCCESS) {
        if (b)
            *b = g_keep.dev[i].dbuf[--g_keep.dev[i].ndbuf];
        ret = 0;
    } else if (b) {
        void *ev = NULL;
        if (cu->event_create(&ev, HC_CU_EVENT_DISABLE_TIMING) != HC_CU_SUCCESS ||
            cu->event_record(ev, stream) != HC_CU_SUCCESS) {
            /* Its last use cannot be told: never reused, left allocated. */
            if (ev)
                cu->event_destroy(ev);
        } else {
            b->idle = 1;
            b->ev = ev;
            ret = g_keep.dev[i].said ? 1 : 2;
            g_keep.dev[i].said = 1;
        }
    }
    pthread_mutex_unlock(&g_keep.lock);
    return ret;
}
