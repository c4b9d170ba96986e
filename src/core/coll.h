/*
 * The executor: plan selection, the data plane of a communicator
 * (intra-node backend, ring, threads) and requests of every kind
 * (all-reduce, broadcast, barrier, reduce-scatter, all-gather).
 *
 * Plans, chosen once per communicator from its topology:
 *   single  one rank: a copy
 *   intra   one node: the intra-node backend's all-reduce
 *   ring    one rank per node: the ring over all ranks
 *   flat    nodes of different sizes: the ring over all ranks, in rank order
 *   3stage  intra reduce-scatter → ring per rail → intra all-gather
 */
#ifndef HC_CORE_COLL_H
#define HC_CORE_COLL_H

#include "core/redop.h"
#include "hcoll.h"

struct hcoll_comm;
typedef struct hc_coll hc_coll_t;

enum hc_plan { HC_PLAN_SINGLE, HC_PLAN_INTRA, HC_PLAN_RING, HC_PLAN_FLAT, HC_PLAN_3STAGE };

/* The plan a topology calls for. */
enum hc_plan hc_coll_plan_for(int nranks, int nnodes, int local_size, int uniform);
const char *hc_coll_plan_name(enum hc_plan plan);

/*
 * The arguments every all-reduce checks, host or device: a known dtype and
 * op, buffers present (when count > 0, or always with require_ptrs), a
 * size that fits memory, no partial overlap. Records the message in the
 * communicator and returns HCOLL_ERR_INVALID_ARG, or HCOLL_SUCCESS.
 */
hcoll_status_t hc_coll_check_args(struct hcoll_comm *c, const void *sendbuf,
                                  const void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                  hcoll_op_t op, int require_ptrs);

/*
 * Build the communicator's data plane: collective over all ranks (it
 * connects rings and attaches shared memory through the bootstrap). Sets
 * comm->coll first: on failure, hc_coll_destroy(comm->coll, 1) frees what
 * was built.
 */
hcoll_status_t hc_coll_create(struct hcoll_comm *comm);

/*
 * Stop the worker after it drained its queue (aborting: queued requests
 * fail at once and blocked stages are woken), stop the ring thread, free
 * the device path, the ring and the intra-node backend; clears
 * comm->coll. NULL is a no-op. Any thread, once per communicator.
 */
void hc_coll_destroy(hc_coll_t *co, int aborting);

/* The collectives a request can carry. */
enum hc_coll_kind {
    HC_COLL_ALLREDUCE,
    HC_COLL_BROADCAST,
    HC_COLL_BARRIER,
    HC_COLL_REDUCE_SCATTER,
    HC_COLL_ALLGATHER,
};

/* One call's arguments, whatever its kind (fields a kind does not use are
 * ignored): all-reduce sendbuf, recvbuf, count, dtype, op; broadcast
 * sendbuf (root only), recvbuf, count, dtype, root; barrier none;
 * reduce-scatter sendbuf (nranks x count), recvbuf, count (recvcount),
 * dtype, op; all-gather sendbuf, recvbuf (nranks x count), count
 * (sendcount), dtype. */
typedef struct hc_coll_args {
    enum hc_coll_kind kind;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    hcoll_dtype_t dtype;
    hcoll_op_t op;        /* all-reduce, reduce-scatter: the stages' op (SUM for a scaled one) */
    hc_redop_t ro;        /* all-reduce, reduce-scatter: what the caller's op means (redop.h) */
    hcoll_op_t user_op;   /* reduce-scatter: the op as the caller passed it (argument check) */
    int root;
} hc_coll_args_t;

/*
 * The arguments of a host broadcast: a known dtype, root a rank, recvbuf
 * present (and on the root sendbuf) when count > 0, a size that fits
 * memory, no partial overlap on the root. As hc_coll_check_args.
 */
hcoll_status_t hc_coll_check_bcast(struct hcoll_comm *c, const void *sendbuf,
                                   const void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                   int root);

/*
 * The arguments of a host reduce-scatter (kind HC_COLL_REDUCE_SCATTER; op
 * checked) or all-gather (HC_COLL_ALLGATHER; op ignored): a known dtype
 * (and op), buffers present when count > 0, nranks x count elements that
 * fit memory, and no overlap other than the in-place one (reduce-scatter:
 * recvbuf == sendbuf + rank x count; all-gather: sendbuf == recvbuf + rank
 * x count). As hc_coll_check_args.
 */
hcoll_status_t hc_coll_check_rsag(struct hcoll_comm *c, enum hc_coll_kind kind,
                                  const void *sendbuf, const void *recvbuf, size_t count,
                                  hcoll_dtype_t dtype, hcoll_op_t op);

/*
 * Every collective, blocking (req_out NULL) or not: the checks, the device
 * stages (device all-reduce), then the request, queued for the worker or
 * (blocking, host buffers) run on this thread after every earlier one.
 */
hcoll_status_t hc_coll_submit(hc_coll_t *co, const hc_coll_args_t *args, void *stream,
                              struct hcoll_request **req_out);

/* hcoll_mem_register / hcoll_mem_deregister (memreg.c): after every
 * earlier request, as the executor. */
struct hcoll_mem;
hcoll_status_t hc_coll_mem_register(hc_coll_t *co, void *ptr, size_t bytes,
                                    struct hcoll_mem **handle_out);
hcoll_status_t hc_coll_mem_deregister(hc_coll_t *co, struct hcoll_mem *handle);

/* What a wait outside the host executor (the device path's host stage,
 * waiting for a stage on the caller's stream that local peers hold up)
 * checks between slices: every local rank alive (shared memory: died or
 * stopped beating), the node healthy, the ring's neighbours alive.
 * HCOLL_SUCCESS or the failure, recorded. Executor's thread. */
hcoll_status_t hc_coll_peers_alive(hc_coll_t *co, const char *what);

/* The stage times of the last collective that succeeded: 1 and
 * *times_out, or 0 when none has finished yet. */
int hc_coll_last_times(hc_coll_t *co, hcoll_stage_times_t *times_out);
/* The algorithm of the most recently finished operation ("rd", "ring",
 * ... algo.h), or NULL before the first. Thread-safe. */
const char *hc_coll_last_algo(hc_coll_t *co);

/* Requests (hcoll.h's hcoll_test, hcoll_wait, hcoll_request_free,
 * hcoll_request_stage_times and hcoll_request_set_callback, on a request
 * that is not NULL, with a callback that is not NULL); request.c. */
hcoll_status_t hc_request_test(struct hcoll_request *rq, int *done_out);
hcoll_status_t hc_request_wait(struct hcoll_request *rq);
hcoll_status_t hc_request_free(struct hcoll_request *rq);
hcoll_status_t hc_request_times(struct hcoll_request *rq, hcoll_stage_times_t *times_out);
hcoll_status_t hc_request_set_callback(struct hcoll_request *rq, hcoll_request_cb_t cb, void *arg);
/* The executor whose completion callback this thread is running on hcoll's
 * worker, or NULL: such a thread must not block on that communicator. */
const void *hc_request_callback_owner(void);

#endif
