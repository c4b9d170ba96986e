/*
 * Public entry points of registered buffers (hcoll.h): argument checks,
 * then the executor (core/coll.h, core/memreg.c).
 */
#include "base/err.h"
#include "base/log.h"
#include "core/coll.h"
#include "core/comm.h"
#include "hcoll.h"
#include "inter/transport.h"

#include <stddef.h>

static hcoll_status_t mem_entry(hcoll_comm_t comm, const char *what)
{
    if (!comm)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "%s: comm is NULL", what);
    hcoll_status_t st = hc_comm_ready(comm, what);
    if (st != HCOLL_SUCCESS)
        return st;
    if (!comm->coll)
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INTERNAL,
                          "%s: communicator has no data plane", what);
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_mem_register(hcoll_comm_t comm, void *ptr, size_t bytes,
                                            hcoll_mem_t *handle_out)
{
    hcoll_status_t st = mem_entry(comm, "mem_register");
    if (st != HCOLL_SUCCESS)
        return st;
    return hc_coll_mem_register(comm->coll, ptr, bytes, handle_out);
}

HCOLL_API hcoll_status_t hcoll_mem_deregister(hcoll_comm_t comm, hcoll_mem_t handle)
{
    hcoll_status_t st = mem_entry(comm, "mem_deregister");
    if (st != HCOLL_SUCCESS)
        return st;
    if (!handle)
        return HCOLL_SUCCESS;
    return hc_coll_mem_deregister(comm->coll, handle);
}

HCOLL_API hcoll_status_t hcoll_rdma_counters(hcoll_rdma_counters_t *c)
{
    if (!c || c->size < offsetof(hcoll_rdma_counters_t, registrations) + sizeof(uint64_t))
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG,
                          "rdma_counters: counters is NULL or its size is too small");
    const struct {
        size_t off;
        enum hc_tp_counter which;
    } f[] = {
        { offsetof(hcoll_rdma_counters_t, registrations), HC_TP_REG },
        { offsetof(hcoll_rdma_counters_t, deregistrations), HC_TP_DEREG },
        { offsetof(hcoll_rdma_counters_t, cache_hits), HC_TP_CACHE_HIT },
        { offsetof(hcoll_rdma_counters_t, cache_misses), HC_TP_CACHE_MISS },
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].off + sizeof(uint64_t) <= c->size)
            *(uint64_t *)((char *)c + f[i].off) = hc_tp_counter(f[i].which);
    return HCOLL_SUCCESS;
}
