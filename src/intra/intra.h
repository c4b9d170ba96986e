/*
 * Intra-node phase of the hierarchical all-reduce, behind one ops table.
 *
 *   stage ①  reduce_scatter: afterwards local rank i holds, at shard i's
 *            offset in its own recvbuf, the node's reduction of shard i
 *   stage ③  all_gather:     afterwards every local rank holds all L shards
 *   one-node plan: allreduce = reduce_scatter then all_gather
 *
 * Shards come from hc_intra_shard(), which the ring and the executor use
 * too, so that everybody agrees on who owns which elements.
 *
 * A backend never sees the communicator: it gets its inputs explicitly in
 * hc_intra_params_t, including a callback that all-gathers a few bytes over
 * the node's local ranks (the executor wires it to the bootstrap).
 *
 * Backends: hc_intra_shm_ops (host memory, POSIX shared memory, shm.c);
 * hc_intra_nccl_ops (device memory on the caller's stream, nccl.c).
 *
 * AVG: no intra operation ever divides. reduce_scatter, all_gather and
 * allreduce treat HCOLL_AVG as HCOLL_SUM; the caller finishes integer AVG
 * exactly once at the very end with hc_reduce_avg_finish over the *full*
 * rank count (all nodes). Floating AVG and PREMUL_SUM are sums of scaled
 * inputs (core/redop.h): the host executor scales host buffers before the
 * intra stage; device backends scale inside it (set_scale).
 *
 * Calls on one hc_intra_t are collective over the L local ranks: every
 * local rank issues the same calls, in the same order, with the same count,
 * dtype and op (a disagreement that a backend notices ends in
 * HCOLL_ERR_MISMATCH, otherwise in HCOLL_ERR_TIMEOUT). They are serialised
 * by the caller (one thread at a time), except hc_intra_abort, which any
 * thread may call at any time; destroy must not run concurrently with it.
 * Each call takes plain pointer + count, so the executor may slice a vector
 * into pieces and call reduce_scatter / all_gather per piece (the shard
 * split then applies within each piece); successive calls never mix.
 *
 * Every wait is bounded: create's by timeout_ms, an operation's by
 * op_timeout_ms without progress, and a waited-for rank that stops
 * beating for liveness_ms is dead. After any failed call the object
 * is unusable: later calls fail at once; only destroy remains. A failure
 * seen by one local rank (death, abort, timeout, mismatch) is published to
 * the others, whose blocked calls then fail promptly:
 *   HCOLL_ERR_ABORTED      hc_intra_abort was called on this rank
 *   HCOLL_ERR_PEER_FAILED  a local rank died, left (destroyed) or aborted
 *   HCOLL_ERR_TIMEOUT      an awaited local rank made no progress in time
 *   HCOLL_ERR_MISMATCH     local ranks called with different arguments
 */
#ifndef HC_INTRA_H
#define HC_INTRA_H

#include <stddef.h>

#include "base/err.h"
#include "base/exchange.h"
#include "hcoll.h"

typedef struct hc_intra hc_intra_t;
typedef struct hc_intra_ops hc_intra_ops_t;

/* The set-up exchange (base/exchange.h) is over the node's local ranks
 * only: member q is local rank q. */

typedef struct hc_intra_params {
    int local_rank;      /* 0 .. local_size-1 */
    int local_size;      /* L >= 1 */
    /* Name unique to the communicator and node, agreed over the bootstrap,
     * e.g. "/hcoll-<jobid>-<node>". POSIX shm rules: leading '/', no other
     * '/', at most NAME_MAX bytes. Copied; need not outlive create. */
    const char *name;
    size_t chunk_bytes;  /* pipelining granule (HCOLL_CHUNK_BYTES), >= 4096 */
    int timeout_ms;      /* deadline of create's waits (set-up), > 0 */
    /* Waits inside an operation, for a local rank that is alive but has
     * not called it yet: > 0 this many ms without progress, < 0 no limit,
     * 0 timeout_ms (callers that predate the split). */
    int op_timeout_ms;
    /* A local rank awaited whose heartbeat (hc_intra_beat, from its
     * liveness thread) has not moved for this many ms is declared dead
     * (stopped, hung); 0: no heartbeat check (the exit checks remain). */
    int liveness_ms;
    hc_errbuf_t *errbuf; /* where errors are recorded (NULL: thread's) */
    int rank;            /* global rank, for messages only */
    hc_allgather_fn allgather; /* used during create only */
    void *allgather_ctx;
} hc_intra_params_t;

struct hc_intra_ops {
    const char *name;
    /* Collective over the local ranks; blocks until all have joined or the
     * deadline passed. *out is written only on success. */
    hcoll_status_t (*create)(const hc_intra_params_t *params, hc_intra_t **out);
    /* In place on the caller's buffers. sendbuf == recvbuf is allowed;
     * otherwise they must not overlap. Only shard i of recvbuf (local rank
     * i) is written. count may be 0. stream: NULL for host backends. */
    hcoll_status_t (*reduce_scatter)(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                     size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                     void *stream);
    /* recvbuf holds this rank's shard at its offset; afterwards it holds
     * all shards. */
    hcoll_status_t (*all_gather)(hc_intra_t *ctx, void *recvbuf, size_t count,
                                 hcoll_dtype_t dtype, void *stream);
    hcoll_status_t (*allreduce)(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                void *stream);
    hcoll_status_t (*barrier)(hc_intra_t *ctx);
    /* Optional (NULL: the backend cannot; the host executor scales host
     * buffers itself). Until the next call, reduce_scatter and allreduce
     * with op HCOLL_SUM multiply each local rank's input by the scalar
     * before summing: one element of the calls' dtype, in device memory
     * when on_device (read when the GPU runs the call), else host memory
     * read now. scalar NULL: plain sums again. */
    hcoll_status_t (*set_scale)(hc_intra_t *ctx, const void *scalar, hcoll_dtype_t dtype,
                                int on_device);
    /* Thread-safe, non-blocking: blocked and later calls of this rank
     * return HCOLL_ERR_ABORTED; peers' calls fail with
     * HCOLL_ERR_PEER_FAILED promptly. Frees nothing. */
    void (*abort)(hc_intra_t *ctx);
    /* Local, never blocks on peers. NULL is a no-op. */
    void (*destroy)(hc_intra_t *ctx);
    /* Show the local peers that this rank is alive (a counter they watch
     * while they wait for it). Thread-safe, non-blocking; called by the
     * communicator's liveness thread whether or not a call runs. NULL:
     * the backend has no such wait. */
    void (*beat)(hc_intra_t *ctx);
    /* HCOLL_SUCCESS while no local rank has failed or aborted; else that
     * failure, recorded (what: the stage named in the message). Thread-safe,
     * non-blocking: lets a thread that waits elsewhere (the ring) learn that
     * the call is lost. NULL: nothing to report. */
    hcoll_status_t (*health)(hc_intra_t *ctx, const char *what);
    /* A failure elsewhere (a ring neighbour died) dooms the node's calls:
     * every local rank's wait, and every later call, fails with
     * HCOLL_ERR_PEER_FAILED. Thread-safe, non-blocking. NULL: none. */
    void (*poison)(hc_intra_t *ctx);
    /* For a wait elsewhere that depends on every local rank (a device
     * stage on the caller's stream): HCOLL_SUCCESS while each other local
     * rank is alive, or has left in order; else HCOLL_ERR_PEER_FAILED
     * (recorded, the segment poisoned) once one died or stopped beating
     * for liveness_ms, and health's failure. Not thread-safe with the
     * backend's own calls (the executor's thread). NULL: health only. */
    hcoll_status_t (*alive)(hc_intra_t *ctx, const char *what);
    /* Optional (NULL: the backend has none). Local rank root's sendbuf
     * (count elements) into every local rank's recvbuf (root: sendbuf ==
     * recvbuf allowed; the others' sendbuf is ignored). On stream, as the
     * other operations. */
    hcoll_status_t (*bcast)(hc_intra_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                            hcoll_dtype_t dtype, int root, void *stream);
    /* Optional (NULL: the backend cannot). reduce_scatter of the vector
     * that is the concatenation of count / blen blocks of blen elements,
     * block j at blocks[j] (any order in memory; none overlaps recvbuf):
     * the same result bits as reduce_scatter of that vector gathered into
     * one buffer, without the gathering copy. blen > 0 divides count. */
    hcoll_status_t (*reduce_scatter_blocks)(hc_intra_t *ctx, const void *const *blocks,
                                            size_t blen, void *recvbuf, size_t count,
                                            hcoll_dtype_t dtype, hcoll_op_t op, void *stream);
    /* Optional (NULL: the backend cannot). all_gather into the vector that
     * is the concatenation of count / blen blocks of blen elements, block j
     * at blocks[j] (none overlapping src, except that this rank's shard in
     * src may be exactly where the blocks hold it: then it is left alone):
     * src holds this rank's shard at its offset (the rest of src is not
     * read or written); afterwards the blocks hold all shards, this rank's
     * included, without a copy through one contiguous buffer. blen > 0
     * divides count. */
    hcoll_status_t (*all_gather_blocks)(hc_intra_t *ctx, const void *src, void *const *blocks,
                                        size_t blen, size_t count, hcoll_dtype_t dtype,
                                        void *stream);
    /* Optional (NULL: the backend cannot). Local rank root's sendbuf
     * (count elements): shard i of it (hc_intra_shard) into local rank i's
     * recvbuf at shard i's offset; nothing else of recvbuf is written.
     * Root: sendbuf == recvbuf allowed; the others' sendbuf is ignored. */
    hcoll_status_t (*scatter)(hc_intra_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                              hcoll_dtype_t dtype, int root, void *stream);
    /* Optional (NULL: the backend cannot; host backends only). One step
     * that carries the argument agreement and a small all-reduce at once:
     * words (nwords int64, in/out) become their MAX over the local ranks;
     * sendbuf's count elements are reduced into recvbuf (a scratch buffer
     * of the caller's; may equal sendbuf) only where every local rank
     * passed the same count, dtype and op, and then *data_ok = 1, else 0
     * and recvbuf is not written. Never poisons the node for that: the
     * caller judges the words. Words and data must fit one slot. */
    hcoll_status_t (*agree)(hc_intra_t *ctx, int64_t *words, int nwords, const void *sendbuf,
                            void *recvbuf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                            int *data_ok);
    /* Optional (NULL: the backend carries no note). A word that rides on
     * every step this rank publishes from now on (0: none), at no extra
     * synchronisation: the three-stage plan's rail that voided an
     * operation tells the node's other ranks through the steps that follow
     * (core/coll_pin.c). Not thread-safe with the backend's calls. */
    void (*note_set)(hc_intra_t *ctx, uint32_t note);
    /* The first non-zero note seen on another local rank's steps that this
     * rank consumed since the last take (0: none); clears it. */
    uint32_t (*note_take)(hc_intra_t *ctx);
};

/* Every backend's object starts with this, so the generic helpers below can
 * dispatch. */
struct hc_intra {
    const hc_intra_ops_t *ops;
};

/*
 * Shared memory, host buffers (stream must be NULL, else
 * HCOLL_ERR_UNSUPPORTED). One POSIX segment per node and communicator,
 * L * 2 slots of chunk_bytes (rounded up to pages); params->name is
 * unlinked before create returns, so a crash afterwards leaves nothing in
 * /dev/shm. L = 1 uses no segment. A local rank that dies is noticed in
 * about 10 ms (pidfd, else kill/proc), except for a rank in another pid
 * namespace, which only the deadline catches. See shm.c for the design.
 */
extern const hc_intra_ops_t hc_intra_shm_ops;

/*
 * NCCL, device buffers on the caller's CUDA stream (stream required; the
 * caller makes the device's context current). libnccl.so.2 is opened at
 * run time; create fails with HCOLL_ERR_UNSUPPORTED where it is missing.
 * Ranks of one node need distinct GPUs. No host barrier. See nccl.c.
 */
extern const hc_intra_ops_t hc_intra_nccl_ops;

/*
 * The shard split: shard i of a count-element vector over L parts is
 * [*offset_out, *offset_out + *len_out). Contiguous blocks in rank order
 * covering the vector exactly; the first count % L shards have one element
 * more than the others. Any count works (0, < L, primes).
 */
void hc_intra_shard(size_t count, int L, int i, size_t *offset_out, size_t *len_out);

/* ctx->ops->abort / destroy / beat; NULL is a no-op. */
void hc_intra_abort(hc_intra_t *ctx);
void hc_intra_beat(hc_intra_t *ctx);
/* ctx->ops->health; HCOLL_SUCCESS for NULL. */
hcoll_status_t hc_intra_health(hc_intra_t *ctx, const char *what);
/* ctx->ops->alive, else ctx->ops->health; HCOLL_SUCCESS for NULL. */
hcoll_status_t hc_intra_alive(hc_intra_t *ctx, const char *what);
/* ctx->ops->poison; NULL is a no-op. */
void hc_intra_poison(hc_intra_t *ctx);
/* ctx->ops->note_set / note_take; a no-op / 0 where the backend has none. */
void hc_intra_note_set(hc_intra_t *ctx, uint32_t note);
uint32_t hc_intra_note_take(hc_intra_t *ctx);
void hc_intra_destroy(hc_intra_t *ctx);

#endif
