/*
 * Device memory that hcoll itself owns (not a user's buffer): a small
 * allocation on one GPU that lives as long as its owner wants, whatever
 * the application does with its own buffers and contexts. The verbs
 * transport's GPUDirect flush reads target such a word.
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

/* Free m (stream-ordered on a stream of its own, so that it never waits
 * for the application's streams) and release the context. A cleared m is
 * a no-op. */
void hc_gdr_dmem_free(hc_gdr_dmem_t *m);

#endif
