/*
 * Broadcast of the three-stage plan on host buffers, on the executor's
 * thread (coll_run.c has agreed root and size across ranks, copied the
 * root's bytes into its recvbuf, and chosen the integer type whose n
 * elements are the vector).
 *
 *   root's node   scatter: local rank i gets shard i of the root's bytes
 *                 (shared memory, the root the only writer; a backend
 *                 without scatter: RS of the root's bytes and the others'
 *                 zeros, x + 0 = x exactly as integers)
 *   ring thread   the chain of shard i along rail i from the root's node
 *                 (hc_ring_bcast_start_watched), counting the bytes of
 *                 shard i that have landed
 *   executor      AG(p0) AG(p1) ... AG(pK-1): piece k of every shard as soon
 *                 as this rank's chain has landed piece k of its own
 *
 *   shard i  | p0 | p1 | ... | pK-1 |x|     piece k: elements [kP, kP+P) of
 *                                          each shard, within its first
 *                                          q = n / L elements (equal in all
 *                                          shards); x: the one element more
 *                                          of the first n % L shards, sent
 *                                          round the node at the end
 *
 *   time ─►   chain  ████████████████████████████████
 *             AG        p0  p1  p2  ...             pK-1 x
 *
 * so a node all-gathers piece k while its chain forwards piece k+1, and
 * the call ends one piece's all-gather after the last chunk landed instead
 * of a whole vector's. Each piece's all-gather writes the others' shards
 * straight into recvbuf (all_gather_blocks: blocks of the same length, one
 * per shard), never this rank's own shard, which the chain may still be
 * reading to forward it. Where the intra backend cannot gather blocks, the
 * all-gather runs once the chain is done, as one call.
 *
 * Small broadcasts (up to the crossover of algo.c, HCOLL_ALGO's broadcast=)
 * take the tree instead, on the executor's thread, no hand-off:
 *
 *   rail of the root (local rank r = the root's)   every other local rank
 *     binomial tree of the whole vector among          │
 *     the nodes' local rank r (inter/tree.h)           │
 *     ── landed ──► node step: shm bcast from ────────►│ copies it out
 *                   local rank r                       ▼
 *     then the acks of its own tree messages
 *
 * One node step, none before the tree: the root sends from where it is.
 * One rank per node or unequal nodes: the tree over all ranks (the flat
 * fallback); one node: the node step alone.
 */
#include "core/coll_priv.h"
#include "base/clock.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "boot/boot.h"
#include "core/comm.h"
#include "core/ringdrv.h"
#include "base/err.h"
#include "base/log.h"
#include "inter/dissem.h"
#include "inter/tree.h"

/* The executor sleeps between two looks at the chain's count for about
 * half the time the bytes it waits for should take at the rate seen so
 * far, within these bounds: a few looks per piece, not one every few
 * microseconds taking the CPU from the ranks that move the data. */
#define BCAST_NAP_MIN_US 100.0
#define BCAST_NAP_MAX_US 5000.0

typedef struct landed_watch {
    atomic_size_t *landed;
    uint64_t id;       /* the chain's ring job */
    double t0;         /* when the executor first looked */
    size_t got0;       /* and what had landed then */
    double idle_nap;   /* the next nap while nothing has landed (no rate yet) */
} landed_watch_t;

/* Wait until the chain has landed need bytes of this rank's shard; 0 once
 * it has, 1 when the ring job ended first (it failed: the caller waits for
 * it to learn how). */
static int wait_landed(hc_coll_t *co, landed_watch_t *w, size_t need)
{
    for (;;) {
        const size_t got = atomic_load_explicit(w->landed, memory_order_acquire);
        if (got >= need)
            return 0;
        if (hc_ringthr_test(co->ringthr, w->id))
            return atomic_load_explicit(w->landed, memory_order_acquire) < need;
        const double now = hc_now_us();
        /* No rate yet: naps from the shortest, doubling, rather than the
         * longest (a small chain lands in well under 5 ms). */
        double nap = w->idle_nap;
        if (got > w->got0)
            nap = (double)(need - got) * (now - w->t0) / (double)(got - w->got0) / 2;
        else if (w->idle_nap < BCAST_NAP_MAX_US)
            w->idle_nap *= 2;
        if (nap < BCAST_NAP_MIN_US)
            nap = BCAST_NAP_MIN_US;
        if (nap > BCAST_NAP_MAX_US)
            nap = BCAST_NAP_MAX_US;
        const struct timespec ts = { 0, (long)(nap * 1e3) };
        nanosleep(&ts, NULL);
    }
}

/* The pieces' all-gathers as the chain lands them (see the drawing).
 * *ring_ended_out = 1 when the chain ended before landing everything. */
static hcoll_status_t gather_pieces(hc_coll_t *co, unsigned char *buf, size_t n, size_t es,
                                    hcoll_dtype_t idt, landed_watch_t *w,
                                    hcoll_stage_times_t *tm, int *ring_ended_out)
{
    struct hcoll_comm *c = co->comm;
    const int L = c->local_size, me = c->local_rank;
    const size_t q = n / (size_t)L;
    size_t P = (size_t)c->params.chunk_bytes * PIECE_CHUNKS / es;
    if (P == 0)
        P = 1;
    void **blk = malloc((size_t)L * sizeof *blk);
    size_t *off = malloc((size_t)L * sizeof *off);
    hcoll_status_t st = HCOLL_SUCCESS;
    if (!blk || !off) {
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                        "broadcast: no memory for %d block pointers", L);
        goto clean_blk;
    }
    for (int j = 0; j < L; j++) {
        size_t len;
        hc_intra_shard(n, L, j, &off[j], &len);
    }
    for (size_t k0 = 0; k0 < q; k0 += P) {
        const size_t pk = q - k0 < P ? q - k0 : P;
        if (wait_landed(co, w, (k0 + pk) * es)) {
            *ring_ended_out = 1;
            break;
        }
        for (int j = 0; j < L; j++)
            blk[j] = buf + (off[j] + k0) * es;
        /* Our shard at its offset in a vector of L blocks: the block's own
         * place, so the backend finds it there and leaves it alone. Inside
         * buf: off[me] >= me * q >= me * pk. */
        const unsigned char *src = buf + (off[me] + k0 - (size_t)me * pk) * es;
        const double t = hc_now_us();
        st = co->intra->ops->all_gather_blocks(co->intra, src, blk, pk, (size_t)L * pk, idt,
                                               NULL);
        tm->intra_ag_us += hc_now_us() - t;
        if (st != HCOLL_SUCCESS)
            break;
    }
clean_blk:
    free(off);
    free(blk);
    return st;
}

/* The one element more of the first n % L shards (n % L < L of them), to
 * every local rank: a fused all-reduce of those elements, each from its
 * owner and zeros from the others. */
static hcoll_status_t gather_rest(hc_coll_t *co, unsigned char *buf, size_t n, size_t es,
                                  hcoll_dtype_t idt, hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    const int L = c->local_size;
    const size_t r = n % (size_t)L, q = n / (size_t)L;
    if (r == 0)
        return HCOLL_SUCCESS;
    unsigned char *v = calloc(r, es);
    if (!v)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "broadcast: no memory for %zu elements", r);
    size_t off, len;
    if ((size_t)c->local_rank < r) {
        hc_intra_shard(n, L, c->local_rank, &off, &len);
        memcpy(v + (size_t)c->local_rank * es, buf + (off + q) * es, es);
    }
    const double t = hc_now_us();
    hcoll_status_t st = co->intra->ops->allreduce(co->intra, v, v, r, idt, HCOLL_SUM, NULL);
    tm->intra_ag_us += hc_now_us() - t;
    for (size_t j = 0; st == HCOLL_SUCCESS && j < r; j++) {
        hc_intra_shard(n, L, (int)j, &off, &len);
        memcpy(buf + (off + q) * es, v + j * es, es);
    }
    free(v);
    return st;
}

hcoll_status_t hc_coll_bcast_3stage(hc_coll_t *co, const hc_coll_args_t *a, size_t n,
                                    hcoll_dtype_t idt, hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    const hc_intra_ops_t *iops = co->intra->ops;
    const size_t es = hcoll_dtype_size(idt);
    unsigned char *buf = a->recvbuf;
    const int root_node = c->node_of[a->root];
    hcoll_status_t st;
    double t = hc_now_us();
    if (c->node == root_node && iops->scatter) {
        st = iops->scatter(co->intra, buf, buf, n, idt, c->local_of[a->root], NULL);
        tm->intra_rs_us += hc_now_us() - t;
        if (st != HCOLL_SUCCESS)
            return st;
    } else if (c->node == root_node) {
        if (c->rank != a->root)
            memset(buf, 0, n * es);
        st = iops->reduce_scatter(co->intra, buf, buf, n, idt, HCOLL_SUM, NULL);
        tm->intra_rs_us += hc_now_us() - t;
        if (st != HCOLL_SUCCESS)
            return st;
    }
    size_t soff, slen;
    hc_intra_shard(n, c->local_size, c->local_rank, &soff, &slen);
    atomic_size_t landed;
    atomic_init(&landed, 0);
    /* Rail rings have one rank per node, in node order. */
    const hc_ringdrv_op_t job = { .dst = buf + soff * es, .count = slen, .dtype = idt,
                                  .bcast = 1, .root = root_node, .seq = (uint32_t)co->opseq };
    const uint64_t id = hc_ringthr_post_watched(co->ringthr, &job, &landed);
    landed_watch_t w = { &landed, id, hc_now_us(), atomic_load(&landed), BCAST_NAP_MIN_US };
    int ring_ended = 0;
    st = iops->all_gather_blocks ? gather_pieces(co, buf, n, es, idt, &w, tm, &ring_ended)
                                 : HCOLL_SUCCESS;
    /* The buffer goes back to the caller only once the ring is done with it.
     * A void chain (its watcher saw every byte) goes on to the end, the
     * node told (coll_rail.c). */
    hc_coll_void_t v = { HCOLL_SUCCESS };
    const hcoll_status_t rst = hc_coll_rail_wait(co, id, &tm->inter_us, &v);
    if (st == HCOLL_SUCCESS && rst != HCOLL_SUCCESS)
        st = rst;
    if (st == HCOLL_SUCCESS && ring_ended)
        st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INTERNAL,
                        "broadcast: the chain ended with %zu of %zu bytes landed",
                        atomic_load(&landed), slen * es);
    if (st != HCOLL_SUCCESS) {
        /* Local ranks may be waiting for this one in a piece's all-gather
         * that it will not run: they fail now rather than at a deadline. */
        hc_intra_poison(co->intra);
        return st;
    }
    if (!iops->all_gather_blocks) {
        t = hc_now_us();
        st = iops->all_gather(co->intra, buf, n, idt, NULL);
        tm->intra_ag_us += hc_now_us() - t;
        return hc_coll_rail_end(co, &v, st, 1);
    }
    return hc_coll_rail_end(co, &v, gather_rest(co, buf, n, es, idt, tm), 0);
}

/* ------------------------------------------------------------------------ */
/* The small broadcast: tree across nodes, then the node step               */
/* ------------------------------------------------------------------------ */

hcoll_status_t hc_coll_tree_setup(hc_coll_t *co, const hc_transport_ops_t *ops,
                                  const hc_transport_params_t *tp, hc_allgather_fn allgather,
                                  void *ag_ctx, int op_timeout_ms)
{
    struct hcoll_comm *c = co->comm;
    /* Ranks with different limits would run the tree against the chain
     * (or connect against nothing): refuse at init, over every rank. */
    const uint64_t mine = co->algo.bcast_max;
    uint64_t *all = calloc((size_t)c->nranks, sizeof *all);
    if (!all)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the set-up exchange");
    hcoll_status_t st = hc_boot_allgather(c->boot, &mine, all, sizeof mine);
    for (int r = 0; st == HCOLL_SUCCESS && r < c->nranks; r++)
        if (all[r] != mine)
            st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_MISMATCH,
                            "HCOLL_ALGO's broadcast limit is %llu on rank %d but %llu on "
                            "rank %d; it must be equal on every rank",
                            (unsigned long long)all[r], r, (unsigned long long)mine, c->rank);
    free(all);
    if (st != HCOLL_SUCCESS || mine == 0)
        return st; /* broadcast=chain: no connections for the tree */
    const hc_tree_params_t p = { .ops = ops, .tp = *tp, .allgather = allgather,
                                 .ag_ctx = ag_ctx, .op_timeout_ms = op_timeout_ms,
                                 .seg_bytes = hc_algo_tree_seg(&co->algo) };
    return hc_tree_create(&p, &co->tree);
}

/* Drive the tree until *cond says so (landed, or done), an error or an
 * abort; the driver's checks between slices are the ring driver's. */
static hcoll_status_t tree_drive(hc_coll_t *co, int until_done)
{
    struct hcoll_comm *c = co->comm;
    hcoll_status_t st = HCOLL_SUCCESS;
    int done = 0;
    for (int slice = 0; !(until_done ? done : hc_tree_landed(co->tree)); slice++) {
        if (atomic_load(&c->aborted))
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                              "communicator aborted during the broadcast");
        if ((st = hc_intra_health(co->intra, "(seen from the broadcast)")) != HCOLL_SUCCESS)
            return st;
        /* Only once a slice went by without the end: a call that is not
         * held up pays nothing for these. */
        if (slice > 0) {
            if ((st = hc_coll_peers_alive(co, "(seen from the broadcast)")) != HCOLL_SUCCESS)
                return st;
            if ((st = hc_ring_live_left_status(co->ring)) != HCOLL_SUCCESS)
                return st;
            if ((st = hc_dissem_absorb(co->dissem, (uint32_t)co->opseq, "a broadcast")) !=
                HCOLL_SUCCESS)
                return st;
        }
        /* Spin only before the first slice, as rd_drive. */
        if ((st = hc_tree_progress(co->tree, HC_RINGDRV_POLL_MS, slice == 0 ? co->spin_us : 0,
                                   &done)) != HCOLL_SUCCESS)
            break;
    }
    if (st != HCOLL_SUCCESS && atomic_load(&c->aborted))
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                          "communicator aborted during the broadcast");
    return st;
}

hcoll_status_t hc_coll_bcast_tree(hc_coll_t *co, const hc_coll_args_t *a, size_t n,
                                  hcoll_dtype_t idt, hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    const hc_intra_ops_t *iops = co->intra ? co->intra->ops : NULL;
    unsigned char *buf = a->recvbuf;
    const int lroot = c->local_of[a->root];
    const int on_tree = co->plan != HC_PLAN_INTRA && (co->plan != HC_PLAN_3STAGE ||
                                                      c->local_rank == lroot);
    const int node_step = co->plan == HC_PLAN_INTRA || co->plan == HC_PLAN_3STAGE;
    hcoll_status_t st = HCOLL_SUCCESS;
    double t = hc_now_us();
    if (on_tree) {
        if (!co->tree)
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INTERNAL,
                              "tree broadcast chosen without its connections");
        /* Rail rings have one rank per node, in node order; the others
         * all ranks in rank order. */
        const int root = co->plan == HC_PLAN_3STAGE ? c->node_of[a->root] : a->root;
        st = hc_tree_start(co->tree, buf, n * hcoll_dtype_size(idt), root);
        if (st == HCOLL_SUCCESS)
            st = tree_drive(co, 0);
        tm->inter_us += hc_now_us() - t;
    }
    if (st == HCOLL_SUCCESS && node_step) {
        t = hc_now_us();
        st = iops->bcast(co->intra, buf, buf, n, idt, lroot, NULL);
        tm->intra_ag_us += hc_now_us() - t;
    }
    if (st == HCOLL_SUCCESS && on_tree) {
        /* The acks of our own messages, which travelled meanwhile. */
        t = hc_now_us();
        st = tree_drive(co, 1);
        tm->inter_us += hc_now_us() - t;
    }
    /* Local ranks may wait for this one in the node step that it will not
     * run: they fail now rather than at a deadline. */
    if (st != HCOLL_SUCCESS && node_step)
        hc_intra_poison(co->intra);
    return st;
}

int hc_coll_bcast_tree_applies(const hc_coll_t *co, size_t bytes)
{
    if (co->plan == HC_PLAN_SINGLE)
        return 0;
    if (co->plan == HC_PLAN_INTRA || co->plan == HC_PLAN_3STAGE)
        if (!co->intra->ops->bcast)
            return 0;
    return co->plan == HC_PLAN_INTRA || hc_algo_bcast(&co->algo, co->plan, bytes) == HC_ALGO_TREE;
}

enum hc_algo hc_coll_bcast_algo(const hc_coll_t *co, size_t bytes)
{
    if (co->plan == HC_PLAN_SINGLE || co->plan == HC_PLAN_INTRA)
        return hc_algo_bcast(&co->algo, co->plan, bytes);
    return hc_coll_bcast_tree_applies(co, bytes) ? HC_ALGO_TREE : HC_ALGO_CHAIN;
}
