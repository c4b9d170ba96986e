/*
 * Public entry points of broadcast and barrier (hcoll.h): the communicator
 * checks, then the executor (core/coll.h), as for the all-reduce.
 */
#include "base/err.h"
#include "base/log.h"
#include "core/coll.h"
#include "core/comm.h"
#include "hcoll.h"

static hcoll_status_t coll_entry(hcoll_comm_t comm, const hc_coll_args_t *a, void *stream,
                                 hcoll_request_t *req_out, int async)
{
    const char *what = a->kind == HC_COLL_BROADCAST ? "broadcast" : "barrier";
    if (!comm)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "%s: comm is NULL", what);
    if (async && !req_out)
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INVALID_ARG,
                          "%s: req_out is NULL", what);
    hcoll_status_t st = hc_comm_ready(comm, what);
    if (st != HCOLL_SUCCESS)
        return st;
    if (!comm->coll)
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INTERNAL,
                          "communicator has no data plane");
    return hc_coll_submit(comm->coll, a, stream, async ? req_out : NULL);
}

HCOLL_API hcoll_status_t hcoll_broadcast(hcoll_comm_t comm, const void *sendbuf, void *recvbuf,
                                         size_t count, hcoll_dtype_t dtype, int root,
                                         void *stream)
{
    const hc_coll_args_t a = { .kind = HC_COLL_BROADCAST, .sendbuf = sendbuf, .recvbuf = recvbuf,
                               .count = count, .dtype = dtype, .root = root };
    return coll_entry(comm, &a, stream, NULL, 0);
}

HCOLL_API hcoll_status_t hcoll_broadcast_async(hcoll_comm_t comm, const void *sendbuf,
                                               void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                               int root, void *stream, hcoll_request_t *req_out)
{
    const hc_coll_args_t a = { .kind = HC_COLL_BROADCAST, .sendbuf = sendbuf, .recvbuf = recvbuf,
                               .count = count, .dtype = dtype, .root = root };
    return coll_entry(comm, &a, stream, req_out, 1);
}

HCOLL_API hcoll_status_t hcoll_barrier(hcoll_comm_t comm)
{
    const hc_coll_args_t a = { .kind = HC_COLL_BARRIER };
    return coll_entry(comm, &a, NULL, NULL, 0);
}

HCOLL_API hcoll_status_t hcoll_barrier_async(hcoll_comm_t comm, hcoll_request_t *req_out)
{
    const hc_coll_args_t a = { .kind = HC_COLL_BARRIER };
    return coll_entry(comm, &a, NULL, req_out, 1);
}
