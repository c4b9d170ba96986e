/*
 * Algorithm choice by size (algo.h): the crossover table, HCOLL_ALGO, and
 * the loop that drives a recursive-doubling all-reduce on the executor's
 * thread.
 *
 *   caller's thread (blocking call; the worker for an _async one)
 *     fused intra step (shm: every local rank folds all L vectors)
 *     rd over rail i among the nodes' local rank i ──► same bits everywhere
 *     AVG of integers: divided here, once
 *
 * The crossover: below it a small all-reduce costs synchronisations, not
 * bytes, and recursive doubling has log2(N) of them, each one message of
 * the whole vector, against the ring's N-1 hops plus its descriptors and
 * credits. Above it the ring's bandwidth (2(N-1)/N S per NIC, pipelined)
 * wins. Measured with hcoll_info --tune (README).
 */
#include "core/algo.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/config.h"
#include "base/log.h"
#include "core/coll_priv.h"
#include "core/comm.h"
#include "core/ringdrv.h"
#include "inter/dissem.h"
#include "inter/rd.h"
#include "intra/intra.h"

/* Largest all-reduce (bytes) that takes rd, by plan and node count (the
 * first row that matches), measured with hcoll_info --tune over TCP
 * loopback on the shared 2-core host (docs/design.md, "Algorithm choice"):
 *   4 x 1: rd 1.11-2.32x faster than the ring from 1 KiB to 256 KiB, the ring
 *          1.75x faster at 1 MiB: rd up to 256 KiB;
 *   2 x 2: with the agreement on rd (and the data inline up to 64 KiB), rd
 *          1.14x faster than the ring at 256 KiB, the ring 1.76x faster at
 *          1 MiB: rd up to 256 KiB;
 *   3 nodes fold into two (three messages against the ring's two hops):
 *          the ring, as measured before the agreement moved to rd. */
static const struct {
    enum hc_plan plan;
    int min_nodes, max_nodes;
    uint64_t rd_max;
} crossover[] = {
    { HC_PLAN_RING, 4, INT32_MAX, 256 << 10 },
    { HC_PLAN_FLAT, 4, INT32_MAX, 256 << 10 },
    { HC_PLAN_3STAGE, 4, INT32_MAX, 256 << 10 },
    { HC_PLAN_3STAGE, 2, 2, 256 << 10 },
};

/* Slots of the recursive doubling: vectors up to the crossover go in one
 * message per step, longer ones (HCOLL_ALGO=rd) in segments of this. */
#define RD_SEG_MIN (4u << 10)
#define RD_SEG_MAX (256u << 10)

uint64_t hc_algo_default_rd_max(enum hc_plan plan, int nnodes, int local_size)
{
    (void)local_size;
    for (size_t i = 0; i < sizeof crossover / sizeof crossover[0]; i++)
        if (crossover[i].plan == plan && nnodes >= crossover[i].min_nodes &&
            nnodes <= crossover[i].max_nodes)
            return crossover[i].rd_max;
    return 0;
}

/* One "algo[:size]" into *conf. */
static int parse_one(const char *v, hc_algo_conf_t *conf, uint64_t dflt)
{
    if (strcasecmp(v, "auto") == 0) {
        conf->rd_max = dflt;
        conf->forced = 0;
        return 0;
    }
    if (strcasecmp(v, "ring") == 0) {
        conf->rd_max = 0;
        conf->forced = 1;
        return 0;
    }
    if (strcasecmp(v, "rd") == 0) {
        conf->rd_max = UINT64_MAX;
        conf->forced = 1;
        return 0;
    }
    if (strncasecmp(v, "rd:", 3) == 0) {
        uint64_t b;
        if (hc_parse_size(v + 3, &b) != HCOLL_SUCCESS)
            return -1;
        conf->rd_max = b;
        conf->forced = 1;
        return 0;
    }
    return -1;
}

static int hc_algo_parse_bcast(const char *v, enum hc_plan plan, int nnodes, int local_size,
                               hc_algo_conf_t *conf);

hcoll_status_t hc_algo_parse(const char *s, enum hc_plan plan, int nnodes, int local_size,
                             hc_algo_conf_t *out, char *msg, size_t msglen)
{
    const uint64_t dflt = hc_algo_default_rd_max(plan, nnodes, local_size);
    hc_algo_conf_t conf = { dflt, 0, 0, 0 };
    conf.bcast_max = hc_algo_default_bcast_max(plan, nnodes, local_size);
    char buf[HC_PARAM_STR_MAX];
    snprintf(buf, sizeof buf, "%s", s ? s : "");
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        char *end = tok + strlen(tok);
        while (end > tok && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (!*tok)
            continue;
        char *v = tok, *eq = strchr(tok, '=');
        if (eq) {
            *eq = '\0';
            v = eq + 1;
            if (strcasecmp(tok, "broadcast") == 0) {
                if (hc_algo_parse_bcast(v, plan, nnodes, local_size, &conf) != 0) {
                    snprintf(msg, msglen,
                             "HCOLL_ALGO: bad broadcast algorithm '%s' (expected auto, tree, "
                             "chain or tree:SIZE)",
                             v);
                    return HCOLL_ERR_INVALID_ARG;
                }
                continue;
            }
            if (strcasecmp(tok, "allreduce") != 0) {
                snprintf(msg, msglen,
                         "HCOLL_ALGO: unknown collective '%s' (allreduce and broadcast have a "
                         "choice of algorithm)",
                         tok);
                return HCOLL_ERR_INVALID_ARG;
            }
        }
        if (parse_one(v, &conf, dflt) != 0) {
            snprintf(msg, msglen,
                     "HCOLL_ALGO: bad algorithm '%s' (expected auto, ring, rd or rd:SIZE, "
                     "optionally as allreduce=...)",
                     v);
            return HCOLL_ERR_INVALID_ARG;
        }
    }
    *out = conf;
    return HCOLL_SUCCESS;
}

enum hc_algo hc_algo_allreduce(const hc_algo_conf_t *conf, enum hc_plan plan, size_t bytes,
                               size_t small_bytes)
{
    switch (plan) {
    case HC_PLAN_SINGLE: return HC_ALGO_COPY;
    case HC_PLAN_INTRA: return HC_ALGO_INTRA;
    case HC_PLAN_RING:
    case HC_PLAN_FLAT:
        return conf->rd_max && bytes <= conf->rd_max ? HC_ALGO_RD : HC_ALGO_RING;
    case HC_PLAN_3STAGE:
        if (conf->rd_max && bytes <= conf->rd_max)
            return HC_ALGO_RD;
        return bytes <= small_bytes ? HC_ALGO_FUSED_RING : HC_ALGO_RING;
    }
    return HC_ALGO_RING;
}

const char *hc_algo_name(enum hc_algo a)
{
    switch (a) {
    case HC_ALGO_NONE: return "none";
    case HC_ALGO_COPY: return "copy";
    case HC_ALGO_INTRA: return "intra";
    case HC_ALGO_RING: return "ring";
    case HC_ALGO_FUSED_RING: return "fused-ring";
    case HC_ALGO_RD: return "rd";
    case HC_ALGO_RD_SPLIT: return "rd-split";
    case HC_ALGO_CHAIN: return "chain";
    case HC_ALGO_DISSEM: return "dissem";
    case HC_ALGO_RSAG: return "ring-rsag";
    case HC_ALGO_TREE: return "tree";
    }
    return "?";
}

size_t hc_algo_rd_seg(const hc_algo_conf_t *conf)
{
    uint64_t s = conf->rd_max;
    if (s < RD_SEG_MIN)
        s = RD_SEG_MIN;
    if (s > RD_SEG_MAX)
        s = RD_SEG_MAX;
    return (size_t)((s + 63) & ~(uint64_t)63);
}

size_t hc_algo_rd_seg_max(void)
{
    return RD_SEG_MAX;
}

size_t hc_algo_inline_max(const hc_algo_conf_t *conf, int check_args, size_t chunk_bytes)
{
    if (!check_args || (conf->forced && conf->rd_max == 0))
        return 0;
    size_t m = HC_ALGO_INLINE_MAX;
    if (chunk_bytes < m + HC_ALGO_AGREE_HDR)
        m = chunk_bytes > HC_ALGO_AGREE_HDR ? chunk_bytes - HC_ALGO_AGREE_HDR : 0;
    return m & ~(size_t)63;
}

/* ------------------------------------------------------------------------ */
/* Set-up and the driver                                                      */
/* ------------------------------------------------------------------------ */

hcoll_status_t hc_coll_rd_setup(hc_coll_t *co, const hc_transport_ops_t *ops,
                                const hc_transport_params_t *tp, hc_allgather_fn allgather,
                                void *ag_ctx, int op_timeout_ms)
{
    const int model = !co->algo.forced && co->model.mode != HC_MODEL_TABLE;
    if (co->algo.rd_max == 0 && !co->check_args && !model)
        return HCOLL_SUCCESS; /* HCOLL_ALGO=ring, no agreement: no connections for it */
    /* The model may choose rd up to one whole slot (algo_model.c). */
    size_t seg = model ? RD_SEG_MAX : hc_algo_rd_seg(&co->algo);
    if (co->check_args && seg < co->inline_max + HC_ALGO_AGREE_HDR)
        seg = co->inline_max + HC_ALGO_AGREE_HDR; /* the agreement with its data */
    const hc_rd_params_t rp = { .ops = ops, .tp = *tp, .allgather = allgather,
                                .ag_ctx = ag_ctx, .op_timeout_ms = op_timeout_ms,
                                .seg_bytes = seg };
    return hc_rd_create(&rp, &co->rd);
}

/* Drive the started rd operation (st: its start's status) to its end on
 * this thread, looking around between slices as the ring driver does. */
static hcoll_status_t rd_drive(hc_coll_t *co, hcoll_status_t st)
{
    struct hcoll_comm *c = co->comm;
    int done = 0;
    for (int slice = 0; st == HCOLL_SUCCESS && !done; slice++) {
        if (atomic_load(&c->aborted))
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                              "communicator aborted during the all-reduce");
        /* A local rank that failed or aborted dooms the call (its
         * segment is poisoned): the ring driver's check. */
        if ((st = hc_intra_health(co->intra, "(seen from the all-reduce)")) != HCOLL_SUCCESS)
            return st;
        /* Only once a slice went by without the end, as the ring driver:
         * a call that is not held up pays nothing for the others. */
        if (slice > 0) {
            if ((st = hc_coll_peers_alive(co, "(seen from the all-reduce)")) != HCOLL_SUCCESS)
                return st;
            /* A neighbour that left cannot take part; without an operation
             * timeout nothing else would end this wait. */
            if ((st = hc_ring_live_left_status(co->ring)) != HCOLL_SUCCESS)
                return st;
            if ((st = hc_dissem_absorb(co->dissem, (uint32_t)co->opseq, "the all-reduce")) !=
                HCOLL_SUCCESS)
                return st;
        }
        /* The spin is for a partner microseconds away: a wait that already
         * slept a slice sleeps again at once. */
        st = hc_rd_progress(co->rd, HC_RINGDRV_POLL_MS, slice == 0 ? co->spin_us : 0, &done);
    }
    if (st != HCOLL_SUCCESS && atomic_load(&c->aborted))
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                          "communicator aborted during the all-reduce");
    return st;
}

hcoll_status_t hc_coll_rd_run(hc_coll_t *co, void *buf, size_t count, hcoll_dtype_t dtype,
                              hcoll_op_t op)
{
    struct hcoll_comm *c = co->comm;
    if (!co->rd)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INTERNAL,
                          "recursive doubling chosen without its connections");
    return rd_drive(co, hc_rd_start(co->rd, buf, count, dtype, op));
}

hcoll_status_t hc_coll_rd_agree(hc_coll_t *co, int64_t *words, int nw, void *buf, size_t count,
                                hcoll_dtype_t dtype, hcoll_op_t op, int *data_ok)
{
    struct hcoll_comm *c = co->comm;
    if (!co->rd)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INTERNAL,
                          "the agreement without its connections");
    return rd_drive(co, hc_rd_start_agree(co->rd, words, nw, buf, count, dtype, op, data_ok));
}

/* ------------------------------------------------------------------------ */
/* Broadcast: the tree below the crossover, the chain above it               */
/* ------------------------------------------------------------------------ */

/* Largest broadcast (bytes) that takes the tree, by plan and node count
 * (the first row that matches; docs/design.md, "Algorithm choice").
 * hcoll_info --tune over TCP loopback on the shared 2-core host: the tree
 * 1.4-2.9x faster than the chain from 1 KiB to 256 KiB on 2 x 2 and 4 x 1
 * in every run, and still ahead (0.94-3.3x) up to 16 MiB, where loopback
 * cannot show what the chain is for: its root's NIC sends S/L bytes, the
 * tree's root S per child (log2 N children) over one rail. So the tree up
 * to 256 KiB, the size a network hop of any rail sends in tens of us. */
static const struct {
    enum hc_plan plan;
    int min_nodes;
    uint64_t tree_max;
} bcast_crossover[] = {
    { HC_PLAN_3STAGE, 2, 256 << 10 },
    { HC_PLAN_RING, 2, 256 << 10 },
    { HC_PLAN_FLAT, 2, 256 << 10 },
};

/* Slots of the tree: broadcasts up to the crossover go in one message per
 * hop, longer ones (HCOLL_ALGO=broadcast=tree) in segments of this. */
#define TREE_SEG_MIN (4u << 10)
#define TREE_SEG_MAX (256u << 10)

uint64_t hc_algo_default_bcast_max(enum hc_plan plan, int nnodes, int local_size)
{
    (void)local_size;
    for (size_t i = 0; i < sizeof bcast_crossover / sizeof bcast_crossover[0]; i++)
        if (bcast_crossover[i].plan == plan && nnodes >= bcast_crossover[i].min_nodes)
            return bcast_crossover[i].tree_max;
    return 0;
}

static int hc_algo_parse_bcast(const char *v, enum hc_plan plan, int nnodes, int local_size,
                               hc_algo_conf_t *conf)
{
    uint64_t b;
    if (strcasecmp(v, "auto") == 0) {
        conf->bcast_max = hc_algo_default_bcast_max(plan, nnodes, local_size);
        conf->bcast_forced = 0;
        return 0;
    }
    if (strcasecmp(v, "chain") == 0)
        b = 0;
    else if (strcasecmp(v, "tree") == 0)
        b = UINT64_MAX;
    else if (strncasecmp(v, "tree:", 5) != 0 || hc_parse_size(v + 5, &b) != HCOLL_SUCCESS)
        return -1;
    conf->bcast_max = b;
    conf->bcast_forced = 1;
    return 0;
}

enum hc_algo hc_algo_bcast(const hc_algo_conf_t *conf, enum hc_plan plan, size_t bytes)
{
    switch (plan) {
    case HC_PLAN_SINGLE: return HC_ALGO_COPY;
    case HC_PLAN_INTRA: return HC_ALGO_INTRA;
    default: return conf->bcast_max && bytes <= conf->bcast_max ? HC_ALGO_TREE : HC_ALGO_CHAIN;
    }
}

size_t hc_algo_tree_seg(const hc_algo_conf_t *conf)
{
    uint64_t s = conf->bcast_max;
    if (s < TREE_SEG_MIN)
        s = TREE_SEG_MIN;
    if (s > TREE_SEG_MAX)
        s = TREE_SEG_MAX;
    return (size_t)((s + 63) & ~(uint64_t)63);
}
