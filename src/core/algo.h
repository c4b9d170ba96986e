/*
 * Algorithm choice by size (algo.c): which algorithm a host collective
 * runs, from one table of measured crossovers, overridden by HCOLL_ALGO.
 *
 *   all-reduce, across nodes (ring, flat and three-stage plans):
 *     bytes <= crossover   rd    fused intra-node step (three stages), then
 *                                recursive doubling across nodes (inter/rd.h),
 *                                on the executor's thread
 *     bytes >  crossover   ring  what the ring plans do: up to
 *                                HCOLL_SMALL_BYTES the fused step and a
 *                                whole-vector ring ("fused-ring"), above it
 *                                the pipelined three stages or flat ring
 *
 * The choice depends only on the bytes and on settings every rank agreed on
 * at init (the rd limit is compared then), so every rank picks alike.
 */
#ifndef HC_CORE_ALGO_H
#define HC_CORE_ALGO_H

#include <stddef.h>
#include <stdint.h>

#include "core/coll.h"
#include "hcoll.h"

/* What ran; recorded per call (hcoll_comm_last_algo). */
enum hc_algo {
    HC_ALGO_NONE = 0,   /* nothing yet */
    HC_ALGO_COPY,       /* one rank */
    HC_ALGO_INTRA,      /* one node: shared memory only */
    HC_ALGO_RING,       /* pipelined three stages, or the flat ring */
    HC_ALGO_FUSED_RING, /* fused intra step + whole-vector ring (HCOLL_SMALL_BYTES) */
    HC_ALGO_RD,         /* fused intra step + recursive doubling */
    HC_ALGO_RD_SPLIT,   /* the same, each rail's rd on its local rank's shard, then
                         * a node all-gather (the agreement's inline data) */
    HC_ALGO_CHAIN,      /* broadcast: the ring's chain */
    HC_ALGO_DISSEM,     /* barrier: dissemination (without the agreement) */
    HC_ALGO_RSAG,       /* reduce-scatter / all-gather: the ring's phases */
    HC_ALGO_TREE,       /* broadcast: binomial tree across nodes + node step */
};

/* HCOLL_ALGO, parsed: all-reduces of at most rd_max bytes take rd
 * (0: never; UINT64_MAX: always). */
typedef struct hc_algo_conf {
    uint64_t rd_max;
    int forced;          /* set by HCOLL_ALGO rather than the table */
    /* Broadcasts of at most bcast_max bytes take the tree (0: never;
     * UINT64_MAX: always); bcast_forced as forced. */
    uint64_t bcast_max;
    int bcast_forced;
} hc_algo_conf_t;

/* The table's crossover for this plan and layout (nodes x ranks per node). */
uint64_t hc_algo_default_rd_max(enum hc_plan plan, int nnodes, int local_size);

/* Parse HCOLL_ALGO into *out (the table's crossover for this plan and
 * layout where it says auto). Accepted: "", "auto", "ring", "rd", "rd:SIZE"
 * (rd up to SIZE bytes, then ring), each optionally as "allreduce=...";
 * "broadcast=auto|tree|chain|tree:SIZE" (the tree up to SIZE bytes, then
 * the chain); a comma list of such entries, the last of each collective
 * winning. Bad: HCOLL_ERR_INVALID_ARG
 * with the reason in msg (nothing recorded: the caller does). */
hcoll_status_t hc_algo_parse(const char *s, enum hc_plan plan, int nnodes, int local_size,
                             hc_algo_conf_t *out, char *msg, size_t msglen);

/* The all-reduce algorithm for bytes on this plan. small_bytes:
 * HCOLL_SMALL_BYTES (the ring's fused variant up to it). */
enum hc_algo hc_algo_allreduce(const hc_algo_conf_t *conf, enum hc_plan plan, size_t bytes,
                               size_t small_bytes);

/* "rd", "ring", ... for messages and hcoll_perf's column. */
const char *hc_algo_name(enum hc_algo a);

/* The slot size of the recursive doubling for this configuration. */
size_t hc_algo_rd_seg(const hc_algo_conf_t *conf);

/* The largest all-reduce (bytes) that travels with the argument agreement
 * (coll_run.c): 0 without the agreement (check_args 0) or under
 * HCOLL_ALGO=ring; else HC_ALGO_INLINE_MAX, less where the intra-node
 * slot (chunk_bytes) is smaller. The same on every rank (the inputs are
 * compared at init). */
#define HC_ALGO_INLINE_MAX (64u << 10)
#define HC_ALGO_AGREE_HDR  256u /* room for the agreement's header in a slot */
/* A reduce-scatter or all-gather (the whole vector) travels with the
 * agreement up to the inline limit and at most this. Measured with
 * hcoll_perf -o reduce_scatter|allgather -z 1, inline against the ring's
 * phase (HCOLL_ALGO=ring): the crossover is 8-32 KiB on 3 x 2 at 500
 * Mbit/s and 16-64 KiB on 4 x 2 at 1 Gbit/s, where the all-reduce's
 * inline limit is 8-13 KiB and 64 KiB; an alpha-beta model of one ring
 * phase missed both (its hand-off, node steps and permutation cost what
 * alpha and beta do not say). */
#define HC_ALGO_INLINE_RSAG_MAX (16u << 10)
size_t hc_algo_inline_max(const hc_algo_conf_t *conf, int check_args, size_t chunk_bytes);
/* Broadcast (the block at the end of algo.c). */

/* The table's broadcast crossover for this plan and layout. */
uint64_t hc_algo_default_bcast_max(enum hc_plan plan, int nnodes, int local_size);

/* The broadcast algorithm for bytes on this plan: copy, intra, tree or
 * chain. */
enum hc_algo hc_algo_bcast(const hc_algo_conf_t *conf, enum hc_plan plan, size_t bytes);

/* The slot size of the tree broadcast for this configuration. */
size_t hc_algo_tree_seg(const hc_algo_conf_t *conf);

/* The cost model (algo_model.c): under HCOLL_ALGO=auto the all-reduce's
 * rd limit and inline limit come from it unless HCOLL_ALGO_MODEL=table. */
enum hc_model_mode { HC_MODEL_PROBE = 0, HC_MODEL_TABLE, HC_MODEL_GIVEN };
typedef struct hc_algo_model {
    enum hc_model_mode mode;
    double alpha_us; /* per message across nodes, us */
    double beta;     /* bytes per us (MB/s) per rank, every rank sending */
    double node_us;  /* one node step (a small shared-memory all-gather), us;
                      * 0: not measured (given figures) */
    int chosen;      /* the limits in force came from this model */
} hc_algo_model_t;

/* What the costs depend on besides alpha and beta. */
typedef struct hc_algo_layout {
    int nnodes;          /* members of the rd / ring group */
    int rails;           /* the three-stage ring's shards (local ranks); 1: flat */
    size_t small_bytes;  /* HCOLL_SMALL_BYTES: the fused, whole-vector ring up to it */
    int check_args;      /* the agreement costs one rd of words... */
    size_t inline_cap;   /* ...unless the data travels with it (up to this) */
    size_t split_from;   /* inline vectors from here (a multiple of 64) travel
                          * split across the rails; 0 or past the inline
                          * cap: never */
} hc_algo_layout_t;

/* HCOLL_ALGO_MODEL: "probe" (or ""), "table", "ALPHA_US:MBPS". 0, or -1
 * when bad. */
int hc_algo_model_parse(const char *s, hc_algo_model_t *m);
/* Messages on rd's critical path among n: log2 P, +2 with a fold. */
int hc_algo_model_steps(int n);
/* Modelled time (us) of an all-reduce of bytes by rd (split from
 * l->split_from up to the inline limit) / by the ring, the agreement
 * included. */
double hc_algo_cost_rd(const hc_algo_model_t *m, const hc_algo_layout_t *l, size_t bytes);
double hc_algo_cost_ring(const hc_algo_model_t *m, const hc_algo_layout_t *l, size_t bytes);
/* The largest size (a multiple of 64, at most rd_cap) up to which rd
 * costs no more than the ring, and the inline limit under it. Pure. */
void hc_algo_model_choose(const hc_algo_model_t *m, const hc_algo_layout_t *l, uint64_t rd_cap,
                          uint64_t *rd_max, size_t *inline_max);
/* Under the inline limit cap: the largest broadcast (bytes) that one rd
 * with the agreement moves no slower than the tree after it. Pure. */
size_t hc_algo_model_inline_bcast(const hc_algo_model_t *m, const hc_algo_layout_t *l,
                                  size_t cap);
/* The smallest inline vector (bytes, a multiple of 64) that travels split:
 * each local rank's rail runs rd on its 1/L shard and a node all-gather
 * follows, where steps * S * (1 - 1/L) / beta, the transfer time the split
 * saves, is at least 2 (alpha + node_us). The node step it adds waits for
 * the node's slowest rail and wakes the ranks waiting for it, which the
 * probe's node step (ranks arriving together) does not show; alpha, which
 * carries this host's wake-ups, stands in for that. Measured on the
 * emulated clusters: 3 x 2 at 500 Mbit/s, 4 KiB (a saving of 1.7-2.5
 * alpha) took 30-150 us longer split; 4 x 2 at 1 Gbit/s, 32 KiB (0.8-1.8
 * alpha) gained nothing, 64 KiB (1.6-3.6 alpha) ran 1.3-2x faster.
 * SIZE_MAX: never (one rail). Pure. */
size_t hc_algo_model_inline_split(const hc_algo_model_t *m, const hc_algo_layout_t *l);
/* rd's largest slot: the model's rd limit is capped at it. */
size_t hc_algo_rd_seg_max(void);

#endif
