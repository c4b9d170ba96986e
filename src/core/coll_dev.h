/*
 * The all-reduce on device buffers, on the caller's CUDA stream (coll_dev.c).
 *
 * The executor (coll.c) hands a call here when it has a stream or a device
 * buffer: hc_coll_dev_enqueue puts the GPU stages on the stream and returns
 * an operation, which the executor queues like any request; its worker
 * later runs hc_coll_dev_execute, the host stage, in issue order with the
 * host-buffer requests (they share the ring).
 *
 * The pure parts, the flag sequence and the staging schedule, are exposed
 * so that tests check them without a GPU.
 */
#ifndef HC_CORE_COLL_DEV_H
#define HC_CORE_COLL_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "base/exchange.h"
#include "hcoll.h"

struct hcoll_comm;
struct hc_ring;

typedef struct hc_coll_dev hc_coll_dev_t;
typedef struct hc_dev_op hc_dev_op_t;

/* ---- Stream release sequence --------------------------------------------
 * Every staged operation gets the next 32-bit sequence number s; the user's
 * stream waits until (int32_t)(flag - s) >= 0 (CU_STREAM_WAIT_VALUE_GEQ, a
 * cyclic compare), and the host stage writes flag = s when it is done.
 * Operations are released strictly in issue order, so writing s releases
 * s and everything before it, and never anything after it. */
typedef struct hc_devseq {
    uint32_t issued;   /* last number handed out */
    uint32_t released; /* last number written to the flag */
} hc_devseq_t;

/* Both start at start (the flag's initial value). */
void hc_devseq_init(hc_devseq_t *s, uint32_t start);
/* The next operation's number. */
uint32_t hc_devseq_issue(hc_devseq_t *s);
/* Record that the flag now holds seq: 0, or -1 (nothing recorded) when seq
 * is not the oldest unreleased number. */
int hc_devseq_release(hc_devseq_t *s, uint32_t seq);
/* Does a stream waiting for seq pass with this flag value? (What the GPU
 * evaluates.) */
int hc_devseq_passes(uint32_t flag, uint32_t seq);
/* Numbers issued and not released yet. */
uint32_t hc_devseq_pending(const hc_devseq_t *s);

/* ---- Staging schedule ---------------------------------------------------
 * The host stage moves its range through two pinned buffers:
 *   D2H(0); for k: WAIT(k); D2H(k+1) unless last; RING(k); H2D(k)
 * all copies on one internal stream, so D2H(k+1) into buffer (k+1)%2 runs
 * after H2D(k-1) out of it, and RING(k) overlaps both copies. */
enum hc_devstage_kind {
    HC_DEVSTAGE_D2H,  /* enqueue device → staging[buf] for piece, record its event */
    HC_DEVSTAGE_WAIT, /* wait for piece's D2H event */
    HC_DEVSTAGE_RING, /* host ring all-reduce of staging[buf] */
    HC_DEVSTAGE_H2D,  /* enqueue staging[buf] → device for piece */
    HC_DEVSTAGE_DONE,
};
typedef struct hc_devstage_step {
    enum hc_devstage_kind kind;
    size_t piece;
    int buf; /* piece % 2 */
} hc_devstage_step_t;
typedef struct hc_devstage {
    size_t npieces, k;
    int phase;
} hc_devstage_t;

void hc_devstage_init(hc_devstage_t *s, size_t npieces);
hc_devstage_step_t hc_devstage_next(hc_devstage_t *s);

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
                                   void *stream, hc_dev_op_t **op_out);

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
 * After the executor has stopped: release every stream still waiting,
 * wait (up to the timeout) until those streams have passed the flag, and
 * free everything. aborting: abort NCCL instead of finalising it. NULL is
 * a no-op.
 */
void hc_coll_dev_destroy(hc_coll_dev_t *d, int aborting);

#endif
