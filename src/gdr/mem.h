/*
 * Memory that hcoll itself owns (not a user's buffer): a small device
 * allocation on one GPU that lives as long as its owner wants, whatever
 * the application does with its own buffers and contexts (the verbs
 * transport's GPUDirect flush reads target such a word); and what hcoll
 * keeps per GPU for the process life so that no destroy synchronises the
 * device.
 */
#ifndef HC_GDR_MEM_H
#define HC_GDR_MEM_H

#include <stddef.h>

#include "gdr/gdr.h"

typedef struct hc_gdr_dmem {
    hc_cu_dptr_t ptr; /* 0: nothing allocated */
    int cudev;        /* CUdevice of the GPU */
} hc_gdr_dmem_t;

/* bytes of device memory on CUDA ordinal gpu, in its primary context,
 * which stays retained until hc_gdr_dmem_free. Returns 0, or -1 (no
 * driver, no such GPU, out of device memory) with *m cleared. */
int hc_gdr_dmem_alloc(int gpu, size_t bytes, hc_gdr_dmem_t *m);

/* Free m (hc_gdr_dbuf_put on a stream of its own, so that it never waits
 * for the application's streams) and release the context. A cleared m is
 * a no-op. */
void hc_gdr_dmem_free(hc_gdr_dmem_t *m);

/* ---- Kept per GPU for the process life ----------------------------------
 * cuMemFreeHost, cuModuleUnload and the destruction of a context
 * synchronise the device on real drivers (they wait for the application's
 * streams too), so hcoll never calls them after set-up: per GPU it keeps
 * one reference on the primary context, the kernels' module (kern.c) and
 * its idle pinned buffers, for reuse by later communicators. cudev is a
 * CUdevice. Thread-safe. */

/* Retain cudev's primary context once for the process life. 0, or -1 (no
 * such device). */
int hc_gdr_keep_ctx(const hc_cu_api_t *cu, int cudev);

/* A pinned host buffer of at least bytes: an idle one of cudev's, or a new
 * one (cuMemHostAlloc in the calling thread's current context, which must
 * be cudev's primary context). Returns a CUresult. */
hc_cu_res_t hc_gdr_pin_get(const hc_cu_api_t *cu, int cudev, size_t bytes, void **out);

/* Give p (bytes long, from hc_gdr_pin_get) back for reuse: no copy may use
 * it any more. Never frees, never blocks. NULL is a no-op. */
void hc_gdr_pin_put(int cudev, void *p, size_t bytes);

/* How many of cudev's pinned buffers are idle (tests). */
size_t hc_gdr_pin_idle(int cudev);

/* Device memory of hcoll's own on cudev (its primary context current):
 * an idle buffer of at least bytes whose last use is over, or a new one
 * (cuMemAlloc). Returns a CUresult. Every device allocation of hcoll's
 * goes through here, so that hc_gdr_dbuf_put can keep it. */
hc_cu_res_t hc_gdr_dbuf_get(const hc_cu_api_t *cu, int cudev, size_t bytes, hc_cu_dptr_t *out);

/* Free p of hc_gdr_dbuf_get behind the work queued on stream so far,
 * without waiting for any other stream: cuMemFreeAsync where the GPU
 * supports memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED),
 * else (or should it fail) p is kept, idle, for reuse once an event
 * recorded on stream now has completed. Returns 0 (freed), 1 (kept), 2
 * (kept, the first time on this GPU: the caller says so once), -1 (p is
 * not hcoll's, or its last use cannot be told: left allocated). */
int hc_gdr_dbuf_put(const hc_cu_api_t *cu, int cudev, hc_cu_dptr_t p, void *stream);

#endif
