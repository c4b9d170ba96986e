/*
 * Public calls whose implementation has not landed yet. Each returns
 * HCOLL_ERR_UNSUPPORTED with a message rather than pretending to work; the
 * issue that implements a call deletes it from here.
 */
#include "hcoll.h"

#include "core/err.h"
#include "core/log.h"

#define NOT_YET(what) \
    hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_UNSUPPORTED, "%s is not implemented in this version", what)

HCOLL_API hcoll_status_t hcoll_get_unique_id(hcoll_unique_id_t *id_out)
{
    if (!id_out)
        return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "id_out is NULL");
    return NOT_YET("hcoll_get_unique_id");
}

HCOLL_API hcoll_status_t hcoll_comm_init(hcoll_comm_t *comm_out, int nranks, int rank,
                                         const hcoll_unique_id_t *id,
                                         const hcoll_config_t *config)
{
    (void)comm_out, (void)nranks, (void)rank, (void)id, (void)config;
    return NOT_YET("hcoll_comm_init");
}

HCOLL_API hcoll_status_t hcoll_comm_init_env(hcoll_comm_t *comm_out, const hcoll_config_t *config)
{
    (void)comm_out, (void)config;
    return NOT_YET("hcoll_comm_init_env");
}

/* No communicator can exist yet, so every handle-taking call sees either
 * NULL or garbage; NULL gets the documented no-op or an argument error. */
HCOLL_API hcoll_status_t hcoll_comm_destroy(hcoll_comm_t comm)
{
    return comm ? NOT_YET("hcoll_comm_destroy") : HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_abort(hcoll_comm_t comm)
{
    return comm ? NOT_YET("hcoll_comm_abort") : HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_get_async_error(hcoll_comm_t comm, hcoll_status_t *out)
{
    (void)comm, (void)out;
    return NOT_YET("hcoll_comm_get_async_error");
}

HCOLL_API const char *hcoll_comm_last_error(hcoll_comm_t comm)
{
    (void)comm;
    return hc_errbuf_get(hc_errbuf_thread());
}

#define QUERY_STUB(fn)                                            \
    HCOLL_API hcoll_status_t fn(hcoll_comm_t comm, int *out)      \
    {                                                             \
        (void)comm, (void)out;                                    \
        return NOT_YET(#fn);                                      \
    }
QUERY_STUB(hcoll_comm_rank)
QUERY_STUB(hcoll_comm_size)
QUERY_STUB(hcoll_comm_local_rank)
QUERY_STUB(hcoll_comm_local_size)
QUERY_STUB(hcoll_comm_node_count)

HCOLL_API hcoll_status_t hcoll_allreduce(hcoll_comm_t comm, const void *sendbuf, void *recvbuf,
                                         size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                         void *stream)
{
    (void)comm, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op, (void)stream;
    return NOT_YET("hcoll_allreduce");
}

HCOLL_API hcoll_status_t hcoll_allreduce_async(hcoll_comm_t comm, const void *sendbuf,
                                               void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                               hcoll_op_t op, void *stream,
                                               hcoll_request_t *req_out)
{
    (void)comm, (void)sendbuf, (void)recvbuf, (void)count, (void)dtype, (void)op, (void)stream;
    (void)req_out;
    return NOT_YET("hcoll_allreduce_async");
}

HCOLL_API hcoll_status_t hcoll_test(hcoll_request_t req, int *done_out)
{
    (void)req, (void)done_out;
    return NOT_YET("hcoll_test");
}

HCOLL_API hcoll_status_t hcoll_wait(hcoll_request_t req)
{
    (void)req;
    return NOT_YET("hcoll_wait");
}

HCOLL_API hcoll_status_t hcoll_request_free(hcoll_request_t req)
{
    return req ? NOT_YET("hcoll_request_free") : HCOLL_SUCCESS;
}
