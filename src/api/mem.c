/*
 * Public entry points of registered buffers (hcoll.h): argument checks,
 * then the executor (core/coll.h, core/memreg.c).
 */
#include "base/err.h"
#include "base/log.h"
#include "core/coll.h"
#include "core/comm.h"
#include "hcoll.h"

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
