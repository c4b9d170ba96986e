/*
 * The executor's objects, shared by coll.c (requests, the worker, the data
 * plane's life) and coll_run.c (what one operation of each kind does), its
 * part coll_rsag.c (reduce-scatter, all-gather), and by nothing else.
 * Calls go one way: coll.c -> coll_run.c -> coll_rsag.c (and coll.c ->
 * coll_rsag.c, which frees its buffers at destroy; coll_run.c ->
 * coll_pin.c -> coll_rsag.c, what a call will register), coll_run.c ->
 * coll_bcast.c (the three-stage broadcast); coll_run.c, coll_bcast.c,
 * coll_rsag.c -> coll_rail.c (a void on one rail, three stages).
 */
#ifndef HC_CORE_COLL_PRIV_H
#define HC_CORE_COLL_PRIV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "boot/boot.h"
#include "core/algo.h"
#include "core/coll.h"
#include "core/coll_dev.h"
#include "core/live.h"
#include "core/ringthr.h"
#include "inter/ring.h"
#include "intra/intra.h"

/* Pieces of the pipeline hold this many ring chunks per shard: enough to
 * keep the ring's slots busy, small enough that the pipeline fills fast. */
#define PIECE_CHUNKS 4

typedef struct hc_group_ag {
    hc_boot_t *boot;
    int nranks;     /* of the communicator */
    int nmembers;
    int *members;   /* communicator ranks, in group order */
} hc_group_ag_t;

struct hc_coll {
    struct hcoll_comm *comm;
    enum hc_plan plan;
    hc_intra_t *intra;
    hc_ring_t *ring;
    hc_group_ag_t intra_ag, ring_ag;
    size_t piece_bytes;
    size_t small_bytes; /* latency path up to this many bytes (HCOLL_SMALL_BYTES) */

    /* Requests and the executor role. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct hcoll_request *head, *tail;
    int exec_busy;
    int waiters;   /* blocking callers queued behind earlier requests */
    int worker_started;
    int stopping;
    pthread_t worker;
    hcoll_status_t failed; /* sticky; HCOLL_SUCCESS while healthy */
    hcoll_stage_times_t last_times;
    int have_last_times;
    hc_coll_dev_t *dev; /* device-buffer path (coll_dev.c); CUDA only once used */

    hc_ringthr_t *ringthr; /* the ring thread (three-stage plan only) */
    hc_live_t *live;       /* the liveness thread (core/live.h) */
    struct hcoll_mem *mems; /* registered ranges (memreg.c), under the executor role */
    /* Reduce-scatter and all-gather (coll_rsag.c), under the executor role. */
    int *rsag_map;          /* which rank's block goes where in the permuted vector */
    unsigned char *rsag_buf; /* the permuted vector, kept between calls */
    size_t rsag_cap;
    hc_mr_t *rsag_pin;      /* its registration, held while it is kept (verbs) */
    struct hc_dissem *dissem; /* the barrier across nodes (barrier.c); NULL: none */
    uint64_t opseq;        /* operations executed, counted alike on every rank */
    /* How long this operation's recursive doubling and tree poll before
     * they sleep (execute, under the executor role): HCOLL_SPIN_US on a
     * blocking caller's thread, which has nothing else to run; 0 on the
     * worker, whose _async calls run beside the application's own work
     * (a backward pass), which a spinning rank would slow. */
    int spin_us;
    void **rsag_blk;        /* a piece's blocks of sendbuf / recvbuf in that order */
    int check_args;         /* HCOLL_CHECK_ARGS: the agreement before every host call */
    /* Algorithm choice (algo.c): HCOLL_ALGO or the table; the recursive
     * doubling's own transport instance (NULL under HCOLL_ALGO=ring or
     * without inter-node stage); what the last operation ran. */
    hc_algo_conf_t algo;
    hc_algo_model_t model;  /* HCOLL_ALGO_MODEL and what it measured (algo_model.c) */
    struct hc_rd *rd;
    enum hc_algo last_algo; /* under lock */
    enum hc_algo cur_algo;  /* the running operation's, under the executor role */
    /* The agreement carries all-reduces up to inline_max bytes (algo.c;
     * 0: never), reduced in agree_buf until every rank has judged. */
    size_t inline_max;
    /* ...and so do reduce-scatters and all-gathers (the whole vector, at
     * most HC_ALGO_INLINE_RSAG_MAX); broadcasts up to inline_bcast (at
     * most inline_max), where the model finds one rd of the bytes no
     * slower than the tree after the agreement (algo_model.c). */
    size_t inline_bcast;
    /* Inline vectors of at least inline_split bytes travel split on the
     * three-stage plan: rail l's rd carries local rank l's shard, and a
     * node all-gather follows (SIZE_MAX: never; algo_model.c). */
    size_t inline_split;
    unsigned char *agree_buf;
    /* The small broadcast's tree across nodes (coll_bcast.c), on a
     * transport instance of its own; NULL under HCOLL_ALGO=broadcast=chain
     * or without inter-node stage. */
    struct hc_tree *tree;
    /* The operation (opseq) that a rail voided under three stages and
     * every local rank failed alike (coll_rail.c, hc_coll_rail_end); 0:
     * none. Under the executor role. */
    uint64_t rail_void_op;
};

/* Run one host-buffer operation of any kind as the executor (the caller
 * holds the role), on this thread; *times is overwritten (coll_run.c).
 * *agreed_out = 1 when it failed because the ranks' arguments differ and
 * every rank found out alike after a complete exchange: the data plane is
 * then idle and sound, so the failure need not be sticky. */
hcoll_status_t hc_coll_run(hc_coll_t *co, const hc_coll_args_t *a, hcoll_stage_times_t *times,
                           int *agreed_out);

/* The agreement before any data moves (coll_run.c; coll_agree.c packs and
 * judges): one host all-reduce (MAX) over every rank of each rank's
 * fingerprint of a (collective, operation number, count, dtype, op, root)
 * and its local verdict (HCOLL_SUCCESS, or why it cannot take part, already
 * recorded). Every rank decides alike: HCOLL_SUCCESS, HCOLL_ERR_MISMATCH
 * naming the field and two ranks that differ on it, or the status of a
 * rank whose verdict failed; then *agreed_out = 1 (the data plane is idle
 * and sound). Off (HCOLL_CHECK_ARGS=0) or one rank: returns verdict, with
 * *agreed_out untouched. Its time adds to *times. */
hcoll_status_t hc_coll_agree(hc_coll_t *co, const hc_coll_args_t *a, hcoll_status_t verdict,
                             hcoll_stage_times_t *times, int *agreed_out);

#define HC_AGREE_WORDS 15
/* "allreduce", "broadcast", ... as messages name a collective kind. */
const char *hc_coll_kind_name(int64_t kind);
/* coll_agree.c: this rank's words; the decision over the words MAX-reduced
 * over every rank (records the message, except for this rank's own failed
 * verdict, which it returns as it is). */
void hc_agree_pack(const hc_coll_args_t *a, uint64_t seq, int rank, hcoll_status_t verdict,
                   int64_t w[HC_AGREE_WORDS]);
hcoll_status_t hc_agree_judge(const int64_t w[HC_AGREE_WORDS], const hc_coll_args_t *a,
                              uint64_t seq, int rank, hcoll_status_t verdict, hc_errbuf_t *err);

/* The broadcast's argument check alone, which the device broadcast runs
 * before any data moves: hc_coll_agree with a sound verdict. */
hcoll_status_t hc_coll_bcast_agree(hc_coll_t *co, const hc_coll_args_t *a,
                                   hcoll_stage_times_t *times, int *agreed_out);

/* Run one host reduce-scatter or all-gather whose arguments every rank
 * agreed on, as hc_coll_run (coll_rsag.c; coll_run.c -> coll_rsag.c). */
hcoll_status_t hc_coll_run_rsag(hc_coll_t *co, const hc_coll_args_t *a, hcoll_stage_times_t *times);

/* The ranges an operation's ring jobs will register, pinned before the
 * agreement (coll_pin.c; coll_run.c -> coll_pin.c -> coll_rsag.c). */
typedef struct hc_coll_pins {
    hc_coll_t *co;
    hc_mr_t **mr; /* what hc_ring_mem_pin kept */
    size_t n, cap;
} hc_coll_pins_t;
/* Pin what a will register (verbs host or GPUDirect ranges; nothing where
 * the ring registers nothing or HCOLL_CHECK_ARGS=0): the first failure,
 * recorded, is this rank's verdict. *pins is set either way and must be
 * released with hc_coll_unpin after the operation. */
hcoll_status_t hc_coll_pin(hc_coll_t *co, const hc_coll_args_t *a, hc_coll_pins_t *pins);
void hc_coll_unpin(hc_coll_pins_t *pins);
/* 1 when a call that failed failed alike on every rank and left the
 * communicator usable because the ring voided one of its operations (a
 * rank could not register its buffers; ring_void.c): the ring still works
 * and either holds every rank and voided more than voided_before
 * operations (the ring and flat plans), or, three stages, a rail voided
 * this operation and every local rank heard (hc_coll_rail_end). */
int hc_coll_void_agreed(const hc_coll_t *co, uint64_t voided_before);
/* Three stages (several ranks per node): a void on one rail reaches the
 * node's other ranks through the node's later steps (coll_rail.c). A call
 * starts with v zeroed; hc_coll_rail_wait is hc_ringthr_wait, except that
 * a void operation's failure is kept in v, marks this rank's node steps
 * from now on, and returns HCOLL_SUCCESS so that the call goes on in
 * step with the other rails (its result undefined); hc_coll_rail_end
 * takes st, the call's status, at its end, after its last node step: st
 * where it failed; else the void's (this rail's, recorded, or another
 * rail's, recorded here naming the rank), and then hc_coll_void_agreed
 * holds for this operation. */
typedef struct hc_coll_void {
    hcoll_status_t st;
} hc_coll_void_t;
hcoll_status_t hc_coll_rail_wait(hc_coll_t *co, uint64_t id, double *inter_us, hc_coll_void_t *v);
/* The same for a ring job run on this thread: st its status, voided_before
 * hc_ring_voided before it. */
hcoll_status_t hc_coll_rail_ran(hc_coll_t *co, hcoll_status_t st, uint64_t voided_before,
                                hc_coll_void_t *v);
/* step_after: a node step (intra all-gather) followed the call's last ring
 * job wait; 0: one more (a barrier) where the ring can void, to carry the
 * note. */
hcoll_status_t hc_coll_rail_end(hc_coll_t *co, hc_coll_void_t *v, hcoll_status_t st,
                                int step_after);
/* The same end for a device call whose rings ran (its arguments agreed):
 * NCCL's node steps on the caller's stream carry no note, so one node
 * barrier carries it, on every local rank alike wherever the ring can
 * register (verbs), whatever st (a local rank that left it out would
 * hold the others up to the deadline). */
hcoll_status_t hc_coll_rail_end_dev(hc_coll_t *co, hc_coll_void_t *v, hcoll_status_t st);
/* fn(arg, src, dst, count, dtype, phase) for every ring job of the
 * reduce-scatter or all-gather a (coll_rsag.c; makes its permuted vector
 * first); stops at fn's first failure and returns it. */
typedef hcoll_status_t (*hc_coll_job_fn)(void *arg, const void *src, void *dst, size_t count,
                                         hcoll_dtype_t dtype, int phase);
hcoll_status_t hc_coll_rsag_ring_jobs(hc_coll_t *co, const hc_coll_args_t *a, hc_coll_job_fn fn,
                                      void *arg);

/* Free what reduce-scatter and all-gather keep in co (hc_coll_destroy). */
void hc_coll_rsag_free(hc_coll_t *co);
/* The barrier (barrier.c): connect its partners among the ring's ranks,
 * on a transport instance of their own with the ring's settings (tp).
 * Collective over those ranks, right after the ring is made. */
hcoll_status_t hc_coll_barrier_setup(hc_coll_t *co, const hc_transport_ops_t *ops,
                                     const hc_transport_params_t *tp, hc_allgather_fn allgather,
                                     void *ag_ctx, int op_timeout_ms);
/* One barrier as operation co->opseq; its stage times go to *times. */
hcoll_status_t hc_coll_barrier(hc_coll_t *co, hcoll_stage_times_t *times);

/* Recursive doubling (algo.c): connect its partners among the ring's
 * ranks on a transport instance of its own, as the barrier's (nothing
 * under HCOLL_ALGO=ring). Collective over those ranks, after the ring. */
/* Under HCOLL_ALGO=auto and the model (algo_model.c): probe the links
 * (collective over every rank; a few ms) or take HCOLL_ALGO_MODEL's
 * figures, and set co->algo.rd_max and co->inline_max from the costs.
 * After ring_setup (needs co->rd), before any operation. */
hcoll_status_t hc_coll_algo_tune(hc_coll_t *co);
/* The model and the limits in force, one line, for hcoll_comm_algo_model. */
int hc_coll_algo_model_str(const hc_coll_t *co, char *buf, size_t len);

hcoll_status_t hc_coll_rd_setup(hc_coll_t *co, const hc_transport_ops_t *ops,
                                const hc_transport_params_t *tp, hc_allgather_fn allgather,
                                void *ag_ctx, int op_timeout_ms);
/* One recursive-doubling all-reduce of buf in place among the ring's
 * ranks, driven on this thread to its end, an error or an abort. */
hcoll_status_t hc_coll_rd_run(hc_coll_t *co, void *buf, size_t count, hcoll_dtype_t dtype,
                              hcoll_op_t op);
/* The agreement across nodes (hc_rd_start_agree): nw words MAX-combined
 * over the ring's ranks, buf's count elements reduced along; *data_ok in:
 * this rank's data is whole, out: every rank's was and buf holds the sum. */
hcoll_status_t hc_coll_rd_agree(hc_coll_t *co, int64_t *words, int nw, void *buf, size_t count,
                                hcoll_dtype_t dtype, hcoll_op_t op, int *data_ok);

/* The three-stage plan's broadcast of n elements of idt in a->recvbuf,
 * which holds the root's bytes on the root (coll_bcast.c, called by
 * coll_run.c); its stage times add to *tm. */
hcoll_status_t hc_coll_bcast_3stage(hc_coll_t *co, const hc_coll_args_t *a, size_t n,
                                    hcoll_dtype_t idt, hcoll_stage_times_t *tm);

/* The small broadcast (coll_bcast.c). Setup: every rank compares
 * HCOLL_ALGO's broadcast limit (HCOLL_ERR_MISMATCH where they differ) and
 * the ring's ranks connect the tree's partners on a transport instance of
 * their own, as the barrier's (nothing under broadcast=chain). Collective
 * over every rank, after the ring. */
hcoll_status_t hc_coll_tree_setup(hc_coll_t *co, const hc_transport_ops_t *ops,
                                  const hc_transport_params_t *tp, hc_allgather_fn allgather,
                                  void *ag_ctx, int op_timeout_ms);
/* Whether a broadcast of bytes takes hc_coll_bcast_tree: the tree's size
 * on plans across nodes, every size on one node (the node step alone). */
int hc_coll_bcast_tree_applies(const hc_coll_t *co, size_t bytes);
/* The widest integer type that divides a size: fewer, cheaper elements
 * for a broadcast's bytes, shards that split none of them, and exact sums
 * (the broadcast and all-gather that travel with the agreement add bytes
 * to zeros). */
static inline hcoll_dtype_t hc_coll_bytes_dtype(size_t bytes)
{
    return bytes % 8 == 0 ? HCOLL_INT64 : bytes % 4 == 0 ? HCOLL_INT32 : HCOLL_UINT8;
}
/* What a broadcast of bytes runs after the agreement, as
 * hcoll_comm_last_algo names it: copy, intra, tree or chain (a broadcast
 * that travelled with the agreement names its exchange, coll_run.c). */
enum hc_algo hc_coll_bcast_algo(const hc_coll_t *co, size_t bytes);
/* The broadcast of n elements of idt in a->recvbuf (the root's bytes on
 * the root): the tree across nodes among the root's rail (all ranks where
 * the plan has no node step), then the node step from the root's local
 * rank, on this thread; its stage times add to *tm. */
hcoll_status_t hc_coll_bcast_tree(hc_coll_t *co, const hc_coll_args_t *a, size_t n,
                                  hcoll_dtype_t idt, hcoll_stage_times_t *tm);

#endif
