/*
 * Public entry points of the all-reduce and its requests (hcoll.h):
 * argument checks, then the executor (core/coll.h).
 */
#include "base/err.h"
#include "base/log.h"
#include "core/coll.h"
#include "core/comm.h"
#include "core/redop.h"
#include "hcoll.h"

static hcoll_status_t allreduce_entry(hcoll_comm_t comm, const void *sendbuf, void *recvbuf,
                                      size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                      void *stream, hcoll_request_t *req_out)
{
    if (!comm)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "comm is NULL");
    hcoll_status_t st = hc_comm_ready(comm, "allreduce");
    if (st != HCOLL_SUCCESS)
        return st;
    if (!comm->coll)
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INTERNAL,
                          "communicator has no data plane");
    const hc_coll_args_t a = { .kind = HC_COLL_ALLREDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                               .count = count, .dtype = dtype, .op = op };
    return hc_coll_submit(comm->coll, &a, stream, req_out);
}

HCOLL_API hcoll_status_t hcoll_allreduce(hcoll_comm_t comm, const void *sendbuf, void *recvbuf,
                                         size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                         void *stream)
{
    return allreduce_entry(comm, sendbuf, recvbuf, count, dtype, op, stream, NULL);
}

HCOLL_API hcoll_status_t hcoll_allreduce_async(hcoll_comm_t comm, const void *sendbuf,
                                               void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                               hcoll_op_t op, void *stream,
                                               hcoll_request_t *req_out)
{
    if (!req_out)
        return hc_err_set(comm ? &comm->err : NULL, HC_COLL, comm ? comm->rank : -1,
                          HCOLL_ERR_INVALID_ARG, "req_out is NULL");
    return allreduce_entry(comm, sendbuf, recvbuf, count, dtype, op, stream, req_out);
}

HCOLL_API hcoll_status_t hcoll_test(hcoll_request_t req, int *done_out)
{
    if (!req || !done_out)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "%s is NULL",
                          req ? "done_out" : "req");
    return hc_request_test(req, done_out);
}

HCOLL_API hcoll_status_t hcoll_wait(hcoll_request_t req)
{
    if (!req)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "req is NULL");
    return hc_request_wait(req);
}

HCOLL_API hcoll_status_t hcoll_request_free(hcoll_request_t req)
{
    if (!req)
        return HCOLL_SUCCESS;
    return hc_request_free(req);
}

HCOLL_API hcoll_status_t hcoll_request_set_callback(hcoll_request_t req, hcoll_request_cb_t cb,
                                                    void *arg)
{
    if (!req || !cb)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "%s is NULL",
                          req ? "cb" : "req");
    return hc_request_set_callback(req, cb, arg);
}

HCOLL_API hcoll_status_t hcoll_request_stage_times(hcoll_request_t req,
                                                   hcoll_stage_times_t *times_out)
{
    if (!req || !times_out)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "%s is NULL",
                          req ? "times_out" : "req");
    return hc_request_times(req, times_out);
}

HCOLL_API hcoll_status_t hcoll_comm_last_stage_times(hcoll_comm_t comm,
                                                     hcoll_stage_times_t *times_out)
{
    if (!comm || !times_out)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "%s is NULL",
                          comm ? "times_out" : "comm");
    hcoll_status_t st = hc_comm_ready(comm, "last_stage_times");
    if (st != HCOLL_SUCCESS)
        return st;
    if (!comm->coll)
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INVALID_ARG,
                          "communicator has no data plane");
    if (!hc_coll_last_times(comm->coll, times_out))
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INVALID_ARG,
                          "no collective has finished on this communicator yet");
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_last_algo(hcoll_comm_t comm, const char **name_out)
{
    if (!comm || !name_out)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "%s is NULL",
                          comm ? "name_out" : "comm");
    hcoll_status_t st = hc_comm_ready(comm, "last_algo");
    if (st != HCOLL_SUCCESS)
        return st;
    const char *name = comm->coll ? hc_coll_last_algo(comm->coll) : NULL;
    if (!name)
        return hc_err_set(&comm->err, HC_COLL, comm->rank, HCOLL_ERR_INVALID_ARG,
                          "no collective has finished on this communicator yet");
    *name_out = name;
    return HCOLL_SUCCESS;
}

/* PREMUL_SUM ops: a table in the communicator (core/redop.c). */
static hcoll_status_t op_entry(hcoll_comm_t comm, const char *what)
{
    if (!comm)
        return hc_err_set(NULL, HC_COLL, -1, HCOLL_ERR_INVALID_ARG, "%s: comm is NULL", what);
    return hc_comm_ready(comm, what);
}

HCOLL_API hcoll_status_t hcoll_op_create_premul_sum(hcoll_comm_t comm, const void *scalar,
                                                    hcoll_dtype_t dtype,
                                                    hcoll_scalar_residence_t residence,
                                                    hcoll_op_t *op_out)
{
    hcoll_status_t st = op_entry(comm, "op_create_premul_sum");
    if (st != HCOLL_SUCCESS)
        return st;
    return hc_redop_create(comm, scalar, dtype, residence, op_out);
}

HCOLL_API hcoll_status_t hcoll_op_destroy(hcoll_comm_t comm, hcoll_op_t op)
{
    hcoll_status_t st = op_entry(comm, "op_destroy");
    if (st != HCOLL_SUCCESS)
        return st;
    return hc_redop_destroy(comm, op);
}
