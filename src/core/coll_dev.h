/*
 * The all-reduce on device buffers, on the caller's CUDA stream (coll_dev.c).
 *
 * The executor (coll.c) hands a call here when it has a stream or a device
 * buffer: hc_coll_dev_enqueue puts the GPU stages on the stream and returns
 * an operation, which the executor queues like any request; its worker
 * later runs hc_coll_dev_execute, the host stage, in issue order with the
 * host-buffer requests (they share the ring).
 *
 * The pure parts, the staging schedule and the
 * segment sizes, are in devsched.h, which tests check without a GPU.
 */
#ifndef HC_CORE_COLL_DEV_H
#define HC_CORE_COLL_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "base/exchange.h"
#include "core/devsched.h"
#include "hcoll.h"

struct hcoll_comm;
struct hc_ring;

typedef struct hc_coll_dev hc_coll_dev_t;
typedef struct hc_dev_op hc_dev_op_t;
struct hc_redop; /* core/redop.h */

/* ---- The device path ---------------------------------------------------- */

/* Does this call take the device path? Yes with a stream; with NULL, yes
 * when a buffer is device memory (only checked when the process has the
 * CUDA driver loaded, so host-only programs never initialise CUDA), so
 * that enqueue can refuse it clearly. */
int hc_coll_dev_wanted(const void *sendbuf, const void *recvbuf, void *stream);

/*
 * Per-communicator state, created with the data plane; no CUDA is touched
 * until the first device call. plan is enum hc_plan; ring is the
 * communicator's ring (NULL for the single and intra plans); node_ag
 * exchanges over the node's local ranks (for NCCL's unique id).
 */
hcoll_status_t hc_coll_dev_create(struct hcoll_comm *c, int plan, struct hc_ring *ring,
                                  hc_allgather_fn node_ag, void *node_ag_ctx,
                                  size_t piece_bytes, hc_coll_dev_t **out);

/*
 * Validate a device call and enqueue its GPU stages on stream. The first
 * call sets the device path up: collective over all ranks (every rank must
 * make the same device call), it retains the current GPU's primary context
 * and, for nodes of several ranks, creates the NCCL communicator.
 * On success *op_out is the operation for hc_coll_dev_execute.
 * On failure *op_out is NULL when nothing waits on the stream, else an
 * operation that must still be executed (with the error) so that the
 * stream is released in order. Called by one thread at a time.
 */
hcoll_status_t hc_coll_dev_enqueue(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                                   size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                   const struct hc_redop *ro, void *stream,
                                   hc_dev_op_t **op_out);

/*
 * A broadcast on device buffers (recvbuf everywhere, sendbuf on the root;
 * equal: in place): checks as hc_coll_check_bcast, then what
 * hc_coll_dev_enqueue says. Everything goes on the stream now (NCCL
 * stages, the chain's gated copies); where a node has several ranks they
 * first compare the root and size (waiting for each other), and ranks
 * that disagree enqueue nothing. The executor compares them across all
 * ranks before hc_coll_dev_execute (hc_coll_bcast_agree), which it calls
 * with HCOLL_ERR_MISMATCH (the chain is skipped, the gates open) when
 * they differ.
 */
hcoll_status_t hc_coll_dev_bcast_enqueue(hc_coll_dev_t *d, const void *sendbuf, void *recvbuf,
                                         size_t count, hcoll_dtype_t dtype, int root,
                                         void *stream, hc_dev_op_t **op_out);

/*
 * A reduce-scatter (rs; count = recvcount, op as hc_coll_dev_enqueue) or
 * all-gather (count = sendcount) on device buffers: checks as
 * hc_coll_check_rsag, then what hc_coll_dev_enqueue says, with the
 * broadcast's argument comparison (hc_coll_dev_agree on the worker)
 * (coll_dev_rsag.c).
 */
hcoll_status_t hc_coll_dev_rsag_enqueue(hc_coll_dev_t *d, int rs, const void *sendbuf,
                                        void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                        hcoll_op_t op, const struct hc_redop *ro, void *stream,
                                        hc_dev_op_t **op_out);

/*
 * The worker's check, before a device reduce-scatter's or all-gather's
 * ring, that every rank called it with the same collective, count, dtype
 * and op (collective over all ranks: one host all-reduce). On a mismatch
 * returns HCOLL_ERR_MISMATCH with *agreed_out = 1 on every rank alike;
 * pass that status to hc_coll_dev_execute, which then skips the ring and
 * only releases the stream. (The broadcast's is hc_coll_bcast_agree.)
 */
hcoll_status_t hc_coll_dev_agree(hc_coll_dev_t *d, const hc_dev_op_t *op, int *agreed_out);

/*
 * The host stage of op, on the executor (worker thread), in issue order.
 * status_in != HCOLL_SUCCESS (the communicator failed or was aborted):
 * skip the work and only release the stream. Always consumes op; returns
 * the operation's status. times gets the host stage's time (inter_us,
 * total_us); the GPU stages are not timed.
 */
hcoll_status_t hc_coll_dev_execute(hc_coll_dev_t *d, hc_dev_op_t *op, hcoll_status_t status_in,
                                   hcoll_stage_times_t *times);

/*
 * After the executor has stopped: open every gate still closed, wait (up
 * to the timeout) until the streams have passed hcoll's work, and
 * free everything. aborting: abort NCCL instead of finalising it. NULL is
 * a no-op.
 */
void hc_coll_dev_destroy(hc_coll_dev_t *d, int aborting);

#endif
