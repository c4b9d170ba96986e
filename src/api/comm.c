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
#include "core/coll.h"
#include "core/comm.h"
#include "hcoll.h"

/* Destroy or abort from one of comm's own completion callbacks would join
 * the very thread that runs it. */
static hcoll_status_t refuse_in_callback(hcoll_comm_t comm, const char *what)
{
    /* In a forked child, tearing down would shut the parent's sockets,
     * send its goodbyes, unlink its segments and join threads that do not
     * exist here: the child leaves the communicator alone (its copy of the
     * memory goes with the child). */
    if (hc_comm_forked(comm))
        return hc_err_set(&comm->err, HC_INIT, comm->rank, HCOLL_ERR_INVALID_ARG,
                          "%s in a forked child (pid %d) of the communicator's process %d: "
                          "refused, the parent's connections are left alone",
                          what, (int)getpid(), comm->owner_pid);
    const void *owner = hc_request_callback_owner();
    if (owner && owner == (const void *)comm->coll)
        return hc_err_set(&comm->err, HC_INIT, comm->rank, HCOLL_ERR_INVALID_ARG,
                          "%s from a completion callback of the same communicator", what);
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_destroy(hcoll_comm_t comm)
{
    if (!comm)
        return HCOLL_SUCCESS;
    hcoll_status_t st = refuse_in_callback(comm, "hcoll_comm_destroy");
    if (st != HCOLL_SUCCESS)
        return st;
    hc_comm_free(comm, 0);
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_abort(hcoll_comm_t comm)
{
    if (!comm)
        return HCOLL_SUCCESS;
    hcoll_status_t st = refuse_in_callback(comm, "hcoll_comm_abort");
    if (st != HCOLL_SUCCESS)
        return st;
    hc_comm_abort(comm);
    return HCOLL_SUCCESS;
}

HCOLL_API hcoll_status_t hcoll_comm_split(hcoll_comm_t comm, int color, int key,
                                          const hcoll_config_t *config, hcoll_comm_t *newcomm_out)
{
    if (!comm)
        return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "split: comm is NULL");
    hcoll_status_t st = hc_comm_ready(comm, "split");
    if (st != HCOLL_SUCCESS)
        return st;
    int ok = 1;
    if (!newcomm_out) {
        hc_err_set(&comm->err, HC_INIT, comm->rank, HCOLL_ERR_INVALID_ARG,
                   "split: newcomm_out is NULL");
        ok = 0;
    } else if (color < HCOLL_SPLIT_NOCOLOR) {
        hc_err_set(&comm->err, HC_INIT, comm->rank, HCOLL_ERR_INVALID_ARG,
                   "split: color %d is negative (use a color >= 0, or HCOLL_SPLIT_NOCOLOR)",
                   color);
        ok = 0;
    }
    /* Bad arguments still take part in the exchange, so that every rank
     * learns of them at once instead of at the timeout. */
    st = hc_comm_split(comm, color, key, config, ok, newcomm_out);
    return ok ? st : HCOLL_ERR_INVALID_ARG;
}

HCOLL_API hcoll_status_t hcoll_comm_get_async_error(hcoll_comm_t comm,
                                                    hcoll_status_t *async_error_out)
{
    if (!comm || !async_error_out)
        return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG,
                          "get_async_error: %s is NULL", comm ? "async_error_out" : "comm");
    /* While the set-up runs, nothing else of comm may be read here. */
    hcoll_status_t st = (hcoll_status_t)atomic_load_explicit(&comm->setup_state,
                                                             memory_order_acquire);
    if (st != HCOLL_SUCCESS) {
        *async_error_out = st;
        return HCOLL_SUCCESS;
    }
    st = (hcoll_status_t)atomic_load(&comm->async_error);
    if (st == HCOLL_SUCCESS && comm->boot)
        st = hc_boot_status(comm->boot);
    *async_error_out = st;
    return HCOLL_SUCCESS;
}

HCOLL_API const char *hcoll_comm_last_error(hcoll_comm_t comm)
{
    return hc_errbuf_get(comm ? &comm->err : hc_errbuf_thread());
}

/* rank and size are known before the set-up (topo 0); the topology only
 * once it is done (topo 1). */
#define QUERY(fn, field, topo)                                                       \
    HCOLL_API hcoll_status_t fn(hcoll_comm_t comm, int *out)                         \
    {                                                                                \
        if (!comm || !out)                                                           \
            return hc_err_set(NULL, HC_INIT, -1, HCOLL_ERR_INVALID_ARG, "%s: %s is NULL", \
                              #fn, comm ? "output" : "comm");                        \
        if (topo) {                                                                  \
            hcoll_status_t st_ = hc_comm_ready(comm, #fn);                           \
            if (st_ != HCOLL_SUCCESS)                                                \
                return st_;                                                          \
        }                                                                            \
        *out = comm->field;                                                          \
        return HCOLL_SUCCESS;                                                        \
    }
QUERY(hcoll_comm_rank, rank, 0)
QUERY(hcoll_comm_size, nranks, 0)
QUERY(hcoll_comm_local_rank, local_rank, 1)
QUERY(hcoll_comm_local_size, local_size, 1)
QUERY(hcoll_comm_node_count, nnodes, 1)
