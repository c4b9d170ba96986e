/*
 * Device memory owned by hcoll (mem.h), through the driver table of
 * gdr.c. The GPU's primary context is retained for as long as the memory
 * lives, so the application resetting or releasing it cannot pull the
 * allocation away underneath its owner.
 */
#include "gdr/mem.h"

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
