/*
 * Public entry points of the collectives other than the all-reduce
 * (hcoll.h): broadcast, barrier, reduce-scatter, all-gather. The
 * communicator checks, then the executor (core/coll.h), as for the
 * all-reduce; what each does is core/coll_run.c, core/barrier.c and
 * core/coll_rsag.c.
 */
#include "base/err.h"
#include "base/log.h"
#include "core/coll.h"
#include "core/comm.h"
#include "hcoll.h"

static hcoll_status_t coll_entry(hcoll_comm_t comm, const hc_coll_args_t *a, void *stream,
                                 hcoll_request_t *req_out, int async)
{
    static const char *const names[] = { [HC_COLL_BROADCAST] = "broadcast",
                                         [HC_COLL_BARRIER] = "barrier",
                                         [HC_COLL_REDUCE_SCATTER] = "reduce_scatter",
                                         [HC_COLL_ALLGATHER] = "allgather" };
    const char *what = names[a->kind];
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

HCOLL_API hcoll_status_t hcoll_reduce_scatter(hcoll_comm_t comm, const void *sendbuf,
                                              void *recvbuf, size_t recvcount,
                                              hcoll_dtype_t dtype, hcoll_op_t op, void *stream)
{
    const hc_coll_args_t a = { .kind = HC_COLL_REDUCE_SCATTER, .sendbuf = sendbuf,
                               .recvbuf = recvbuf, .count = recvcount, .dtype = dtype,
                               .op = op, .user_op = op };
    return coll_entry(comm, &a, stream, NULL, 0);
}

HCOLL_API hcoll_status_t hcoll_reduce_scatter_async(hcoll_comm_t comm, const void *sendbuf,
                                                    void *recvbuf, size_t recvcount,
                                                    hcoll_dtype_t dtype, hcoll_op_t op,
                                                    void *stream, hcoll_request_t *req_out)
{
    const hc_coll_args_t a = { .kind = HC_COLL_REDUCE_SCATTER, .sendbuf = sendbuf,
                               .recvbuf = recvbuf, .count = recvcount, .dtype = dtype,
                               .op = op, .user_op = op };
    return coll_entry(comm, &a, stream, req_out, 1);
}

HCOLL_API hcoll_status_t hcoll_allgather(hcoll_comm_t comm, const void *sendbuf, void *recvbuf,
                                         size_t sendcount, hcoll_dtype_t dtype, void *stream)
{
    const hc_coll_args_t a = { .kind = HC_COLL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                               .count = sendcount, .dtype = dtype };
    return coll_entry(comm, &a, stream, NULL, 0);
}

HCOLL_API hcoll_status_t hcoll_allgather_async(hcoll_comm_t comm, const void *sendbuf,
                                               void *recvbuf, size_t sendcount,
                                               hcoll_dtype_t dtype, void *stream,
                                               hcoll_request_t *req_out)
{
    const hc_coll_args_t a = { .kind = HC_COLL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                               .count = sendcount, .dtype = dtype };
    return coll_entry(comm, &a, stream, req_out, 1);
}
