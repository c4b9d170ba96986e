/*
 * Stage ② of the design: a chunked, pipelined ring all-reduce among the
 * ranks that share a local rank, over any transport (transport.h).
 *
 * The ring knows nothing of communicators: the caller hands it the
 * transport, its position, the rail address and an address-exchange
 * callback. One all-reduce runs at a time per ring; the caller keeps
 * several in issue order (every rank must issue the same sequence).
 *
 *   blocking:  hc_ring_allreduce(ring, send, recv, count, dtype, op)
 *   step-wise: hc_ring_start(...) then hc_ring_progress(ring, wait, &done)
 *              until done (a progress thread interleaves this with other
 *              work; a sub-range of a vector is simply a pointer + count)
 *
 * Threading: a ring is used by one thread at a time.
 */
#ifndef HC_INTER_RING_H
#define HC_INTER_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "inter/transport.h"

typedef struct hc_ring hc_ring_t;

#define HC_RING_MAX_SLOTS 16

typedef struct hc_ring_params {
    const hc_transport_ops_t *ops; /* from hc_transport_select */
    /* Transport settings; tp.rank/tp.nranks are the ring position and size,
     * tp.timeout_ms the deadline for set-up and for any wait without
     * progress, tp.errbuf where messages go, tp.log_rank the rank in logs. */
    hc_transport_params_t tp;
    uint64_t chunk_bytes;          /* pipelining unit (HCOLL_CHUNK_BYTES), >= 8 */
    int nslots;                    /* staging slots, 0 = default (4), max 16 */
    hc_allgather_fn allgather;     /* address exchange among the ring */
    void *ag_ctx;
    /* An operation waits this long without progress for neighbours that
     * are alive but late: > 0 ms, < 0 no limit, 0 tp.timeout_ms. */
    int op_timeout_ms;
    /* > 0: liveness links to both neighbours (ring_live.c); a neighbour
     * silent this long, or whose link closes without a goodbye, fails the
     * operation waiting for it. Someone must then call hc_ring_live_beat
     * and hc_ring_live_poll (the communicator's liveness thread). 0: none. */
    int liveness_ms;
} hc_ring_params_t;

/* Connect the ring. Collective over the ring's ranks; blocks up to the
 * timeout. chunk_bytes and nslots must be equal on every rank
 * (HCOLL_ERR_MISMATCH otherwise). */
hcoll_status_t hc_ring_create(const hc_ring_params_t *params, hc_ring_t **ring_out);

/* Start recvbuf = op over the ring of sendbuf (count elements; in place
 * when sendbuf == recvbuf, else no overlap). AVG divides by avg_divisor
 * (0: the ring's size), so a hierarchical caller can divide by the total
 * number of ranks. Buffers must stay valid until the operation is done.
 * Non-blocking; HCOLL_ERR_INVALID_ARG while another operation is active. */
hcoll_status_t hc_ring_start(hc_ring_t *ring, const void *sendbuf, void *recvbuf, size_t count,
                             hcoll_dtype_t dtype, hcoll_op_t op, int avg_divisor);

/* Drive the active operation: works until it is done or until nothing
 * happened for wait_ms (0: one non-blocking sweep). *done_out = 1 once the
 * result is in recvbuf (also when no operation is active). An error is
 * sticky: the ring is unusable afterwards and should be destroyed.
 * HCOLL_ERR_TIMEOUT when nothing arrived for the ring's timeout. */
hcoll_status_t hc_ring_progress(hc_ring_t *ring, int wait_ms, int *done_out);

/*
 * Device buffers (GPUDirect RDMA). Where the transport registers device
 * memory (ops->gdr), the ring can run on device buffers: the previous rank
 * writes straight into device staging slots, and the caller's device
 * operations below reduce, divide and copy. Each completes before it
 * returns (the ring sends what a reduction wrote right after it).
 */
typedef struct hc_ring_devops {
    void *ctx;
    hcoll_status_t (*alloc)(void *ctx, size_t bytes, void **out);
    void (*free)(void *ctx, void *p);
    /* dst = a op b, count elements (AVG reduces as SUM). */
    hcoll_status_t (*reduce)(void *ctx, void *dst, const void *a, const void *b, size_t count,
                             hcoll_dtype_t dtype, hcoll_op_t op);
    /* buf /= div when op is AVG; nothing otherwise. */
    hcoll_status_t (*avg)(void *ctx, void *buf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                          int div);
    hcoll_status_t (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
} hc_ring_devops_t;

/*
 * Gated device reductions: the caller enqueued the reduce-scatter's
 * reductions of the next device all-reduce beforehand, in message order,
 * each behind a gate it opens when told the message landed
 * (hc_ring_dev_jobs lists them), so that nothing is submitted to the GPU
 * while the ring runs. The ring then puts message m in slot m % nslots,
 * calls landed(m) where it would reduce, and polls reduced() (how many
 * messages, in order, are reduced: their results in place, their slots
 * free) between transport polls, sending each credit then.
 */
typedef struct hc_ring_gated {
    void *ctx;
    void (*landed)(void *ctx, size_t m);
    size_t (*reduced)(void *ctx);
} hc_ring_gated_t;

/* Use g for the device all-reduces and reduce-scatters started from now on (NULL: reduce
 * through the devops, synchronously). Every rank of the ring must agree. */
void hc_ring_set_gated(hc_ring_t *ring, const hc_ring_gated_t *g);

/* The reductions of a device all-reduce (phase HC_RING_PHASE_ALLREDUCE) or
 * reduce-scatter alone (HC_RING_PHASE_RS) of count elements of dtype on
 * this rank, in message order: fn(arg, m, off, cnt, slot, last) for
 * dst[off..off+cnt) = slot op src[off..off+cnt) (elements; slot the device
 * address the message lands at), last: the block is then complete (AVG
 * divides it). Returns the first failure of fn, or HCOLL_SUCCESS. */
typedef hcoll_status_t (*hc_ring_job_fn)(void *arg, size_t m, size_t off, size_t cnt,
                                         void *slot, int last);
hcoll_status_t hc_ring_dev_jobs(const hc_ring_t *ring, size_t count, hcoll_dtype_t dtype,
                                int phase, hc_ring_job_fn fn, void *arg);

/* 1 when the ring's transport can take device memory (a 1-rank ring: 1). */
int hc_ring_gdr_capable(const hc_ring_t *ring);

/* Device staging slots, allocated with ops, registered and exchanged:
 * collective over the ring (every rank calls it, in the same place of the
 * set-up sequence). Where a rank cannot allocate or register them, every
 * rank fails with HCOLL_ERR_UNSUPPORTED and the ring stays usable for host
 * buffers. ops must outlive the ring (or hc_ring_disable_device). */
hcoll_status_t hc_ring_enable_device(hc_ring_t *ring, const hc_ring_devops_t *ops);

/* Deregister and free the device slots, while the GPU context still
 * lives; the ring keeps working on host buffers. Local. */
void hc_ring_disable_device(hc_ring_t *ring);

/* hc_ring_start on device buffers (after hc_ring_enable_device). Every
 * rank of the ring must start the same operation this way. */
hcoll_status_t hc_ring_start_device(hc_ring_t *ring, const void *sendbuf, void *recvbuf,
                                    size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                    int avg_divisor);

/*
 * Reduce-scatter and all-gather alone: one phase of the all-reduce's
 * chunked ring, with the blocks rotated so that ring position p ends with
 * (reduce-scatter) or starts from (all-gather) block p, where the N blocks
 * are the all-reduce's split of count elements (ring_sched.h: count/N
 * each, the first count%N one longer). No gather mode: either phase takes
 * N-1 hops anyway.
 *
 * hc_ring_rs_start: afterwards block p of recvbuf (count elements, its
 * other blocks overwritten with partial sums) = op over the ring of block
 * p of sendbuf; recvbuf == sendbuf is in place, else no overlap; AVG
 * divides block p once by avg_divisor (0: the ring's size).
 * hc_ring_ag_start: afterwards every block of buf (count elements) =
 * block q of position q's buf; position p must hold its block p there.
 * Progress and finish as an all-reduce (hc_ring_progress). Every rank of
 * the ring must start the same phase with the same count, dtype (and op):
 * the descriptor's signature carries the phase, so a neighbour that
 * started another fails with HCOLL_ERR_MISMATCH. The _device forms take
 * device buffers (after hc_ring_enable_device), as hc_ring_start_device.
 */
enum hc_ring_phase { HC_RING_PHASE_ALLREDUCE = 0, HC_RING_PHASE_RS = 1, HC_RING_PHASE_AG = 2 };
hcoll_status_t hc_ring_rs_start(hc_ring_t *ring, const void *sendbuf, void *recvbuf, size_t count,
                                hcoll_dtype_t dtype, hcoll_op_t op, int avg_divisor);
hcoll_status_t hc_ring_ag_start(hc_ring_t *ring, void *buf, size_t count, hcoll_dtype_t dtype);
hcoll_status_t hc_ring_rs_start_device(hc_ring_t *ring, const void *sendbuf, void *recvbuf,
                                       size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                       int avg_divisor);
hcoll_status_t hc_ring_ag_start_device(hc_ring_t *ring, void *buf, size_t count,
                                       hcoll_dtype_t dtype);

/*
 * Start a broadcast of buf (count elements) from ring position root: a
 * chain root -> root+1 -> ... -> root-1 along the ring's direction, cut
 * into chunk_bytes messages, each forwarded as soon as it lands, straight
 * into the next rank's buf (its key comes in the operation's descriptor,
 * whose signature carries count, dtype and root). Progress and finish as
 * an all-reduce (hc_ring_progress). Every rank of the ring must start it,
 * with the same count, dtype and root; root must hold the data in buf.
 */
hcoll_status_t hc_ring_bcast_start(hc_ring_t *ring, void *buf, size_t count, hcoll_dtype_t dtype,
                                   int root);
/* hc_ring_bcast_start that also says, in *landed (not NULL), how many bytes
 * of buf from its start are in place on this rank: all of them at once on
 * the root, else the chunks landed so far with none missing before them.
 * The ring's thread stores it (release) as chunks land; another thread may
 * read it (acquire) and then read those bytes, which the chain only reads
 * from then on, while the operation runs. Written before the start
 * returns, even where nothing moves (count 0, one position). */
hcoll_status_t hc_ring_bcast_start_watched(hc_ring_t *ring, void *buf, size_t count,
                                           hcoll_dtype_t dtype, int root, atomic_size_t *landed);
/* hc_ring_bcast_start_watched on device memory (a GPUDirect ring): never
 * in the stage, which host code copies (the chain itself only moves
 * bytes; landed as above). */
hcoll_status_t hc_ring_bcast_start_device(hc_ring_t *ring, void *buf, size_t count,
                                          hcoll_dtype_t dtype, int root, atomic_size_t *landed);

/* Start + progress until done. Blocking, collective. */
hcoll_status_t hc_ring_allreduce(hc_ring_t *ring, const void *sendbuf, void *recvbuf,
                                 size_t count, hcoll_dtype_t dtype, hcoll_op_t op);

/* Make the ring fail now with st (unless it already failed): its
 * connections are reset at once, so that neighbours blocked on this rank
 * fail promptly instead of waiting for their deadline. Later calls return
 * the sticky error; hc_ring_destroy still frees. Same thread rules as the
 * other calls. NULL: no-op. */
void hc_ring_fail(hc_ring_t *ring, hcoll_status_t st);

/* Close the ring. After an error the connections are reset so that peers
 * fail fast; otherwise peers get an orderly goodbye. Local. NULL: no-op. */
void hc_ring_destroy(hc_ring_t *ring);

/* The liveness thread's side of the liveness links (thread-safe with the
 * ring's own thread; no-ops without links): send one heartbeat to both
 * neighbours; read theirs, waiting up to wait_ms. */
void hc_ring_live_beat(hc_ring_t *ring);
void hc_ring_live_poll(hc_ring_t *ring, int wait_ms);
/* 1 when a neighbour's liveness link closed without a goodbye (it exited,
 * was killed, or failed and reset its ring), with what happened in why;
 * 0 otherwise. Thread-safe; NULL ring: 0. */
int hc_ring_live_lost(hc_ring_t *ring, char *why, size_t len);
/* What a wait elsewhere (the barrier) needs from the liveness links: as
 * the ring's own waits, HCOLL_ERR_PEER_FAILED (recorded, naming the rank
 * and the rail) when a neighbour's link closed without a goodbye or was
 * silent for liveness_ms; else success. Reads atomics only; NULL: success. */
hcoll_status_t hc_ring_live_status(hc_ring_t *ring);
/* For a wait that needs every rank and moves no data on the ring (the
 * recursive doubling): HCOLL_ERR_PEER_FAILED (recorded, naming the rank)
 * when a neighbour said goodbye (destroyed its communicator) at least
 * HC_RING_LEFT_GRACE_MS ago; else success. Reads atomics only; NULL:
 * success. */
hcoll_status_t hc_ring_live_left_status(hc_ring_t *ring);
/* A user's registered range (hcoll_mem_register), kept registered with the
 * ring's transport until unpinned, so that operations inside it register
 * nothing (transport.h, mem_pin). *pin_out NULL: nothing to keep (TCP, no
 * ring). Same thread rules as the other calls. */
hcoll_status_t hc_ring_mem_pin(hc_ring_t *ring, void *base, size_t len, hc_mr_t **pin_out);
void hc_ring_mem_unpin(hc_ring_t *ring, hc_mr_t *pin);

/* 1 when an operation of count elements of dtype (phase: enum
 * hc_ring_phase, or -1 for a broadcast chain) on host buffers would
 * register them with a transport that can pin ranges beforehand
 * (hc_ring_mem_pin; verbs): a caller that wants to know whether they can
 * be registered before the operation starts pins them first, and the
 * operation's own registrations then hit the pinned entry. 0: the
 * operation registers nothing (gather mode copies into the ring's own
 * region, TCP, a 1-rank ring, count 0). */
int hc_ring_registers(const hc_ring_t *ring, size_t count, hcoll_dtype_t dtype, int phase);

/* Host operations (all-reduce, a phase alone, broadcast chain) of at
 * most HC_RING_STAGE_MAX bytes whose buffers nobody holds registered
 * (hcoll_mem_register, hcoll's own kept registrations) run in the ring's
 * stage, registered once and grown to the largest seen: copied in at
 * start (a broadcast: on its root only), out at the end (a broadcast: each
 * message as it lands, before a watcher hears of it), instead of
 * registering the caller's buffers per operation (verbs; nothing changes
 * where the ring registers nothing). Larger ones
 * register the caller's buffers: per byte, pinning (about 0.25 us a 4 KiB
 * page) is cheaper than copying a page in and out (0.6-0.9 us measured
 * here), so past the registration's fixed cost the stage buys no time,
 * only no per-call registration (no locked caller memory, no refusal, no
 * system calls); the bound keeps its own locked memory small. Three-stage
 * jobs (shards of pieces) always fit. */
#define HC_RING_STAGE_MAX ((size_t)4 << 20)
/* 1 when an operation over these buffers would run in the stage (the
 * caller then pins nothing for it). */
int hc_ring_stages(const hc_ring_t *ring, const void *sendbuf, const void *recvbuf, size_t count,
                   hcoll_dtype_t dtype, int phase);
/* Grow the stage to hold bytes now (before an operation, where a refusal
 * can still be the caller's verdict); HCOLL_SUCCESS where it holds them
 * already or the ring stages nothing. Not sticky. Not while an operation
 * runs. */
hcoll_status_t hc_ring_stage_reserve(hc_ring_t *ring, size_t bytes);

/* Operations voided so far: a rank could not register its buffers when
 * one started, so every rank of the ring failed it (its error, recorded,
 * not sticky) and the ring went on in step (ring_void.c). A caller that
 * sees it grow over a failed call knows every rank of the ring failed
 * that call alike. 0 for NULL. */
uint64_t hc_ring_voided(const hc_ring_t *ring);
/* The communicator rank that could not register in the last voided
 * operation (this rank's own where it refused), -1 where no position came
 * with the notice or nothing was voided. Read after the operation ended,
 * from the thread that waited for it. */
int hc_ring_void_rank(const hc_ring_t *ring);
/* The ring's sticky error (HCOLL_SUCCESS while it works); NULL: success. */
hcoll_status_t hc_ring_error(const hc_ring_t *ring);

/* Test hook: the endpoint towards the next rank (NULL for a 1-rank ring). */
hc_ep_t *hc_ring_debug_ep_next(hc_ring_t *ring);

#endif
