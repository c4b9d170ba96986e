/*
 * Public entry points of the communicator's life and queries (hcoll.h):
 * argument checks, then core/comm.h. Init (hcoll_get_unique_id,
 * hcoll_comm_init, hcoll_comm_init_env) stays with the rendezvous in
 * core/comm.c.
 */
#include <stdatomic.h>

#include "base/err.h"
#include "base/log.h"
#include "boot/boot.h"
#include "core/comm.h"
#include "hcoll.h"

HCOLL_API hcoll_status_t hcoll_comm_destroy(hcoll_comm_t comm)
{
    if (!comm)
        return HCOLL_SUCCESS;
    hc_comm_free(comm, 0);
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_abort(hcoll_comm_t comm)
{
    if (!comm)
        return HCOLL_SUCCESS;
    hc_comm_abort(comm);
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_get_async_error(hcoll_comm_t comm,
                                                    hcoll_status_t *async_error_out)
{
    if (!comm || !async_error_out)
        return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG,
                          "get_async_error: %s is NULL", comm ? "async_error_out" : "comm");
    hcoll_status_t st = (hcoll_status_t)atomic_load(&comm->async_error);
    if (st == HCOLL_SUCCESS && comm->boot)
        st = hc_boot_status(comm->boot);
    *async_error_out = st;
    return HCOLL_SUCCESS;
}

HCOLL_API const char *hcoll_comm_last_error(hcoll_comm_t comm)
{
    return hc_errbuf_get(comm ? &comm->err : hc_errbuf_thread());
}

#define QUERY(fn, field)                                                             \
    HCOLL_API hcoll_status_t fn(hcoll_comm_t comm, int *out)                         \
    {                                                                                \
        if (!comm || !out)                                                           \
            return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "%s: %s is NULL", \
                              #fn, comm ? "output" : "comm");                        \
        *out = comm->field;                                                          \
        return HCOLL_SUCCESS;                                                        \
    }
QUERY(hcoll_comm_rank, rank)
QUERY(hcoll_comm_size, nranks)
QUERY(hcoll_comm_local_rank, local_rank)
QUERY(hcoll_comm_local_size, local_size)
QUERY(hcoll_comm_node_count, nnodes)
