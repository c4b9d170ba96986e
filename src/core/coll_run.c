/*
 * One operation of each kind, on the executor's thread (coll.c holds the
 * requests and the worker).
 *
 * All-reduce.
 *
 * Three-stage plan, one vector of S bytes cut into pieces p0 p1 p2 ...:
 *
 *   executor thread   RS(p0) RS(p1) AG(p0) RS(p2) AG(p1) ... AG(pK-1)
 *   ring thread              ring(p0)  ring(p1)   ring(p2) ...
 *                     (ring(k) overlaps RS(k+1) and AG(k-1))
 *
 *   RS(p)   intra-node reduce-scatter: local rank i now holds shard i of p
 *   ring(p) shard i of p all-reduced among the ranks with local rank i, one
 *           per node, over rail i (in place in recvbuf)
 *   AG(p)   intra-node all-gather: every local rank holds all of p
 *
 * Small vectors (at most HCOLL_SMALL_BYTES) take the latency path instead:
 *
 *   executor thread   AR(all)            ring(all, on rail i)
 *   AR(all)   the intra stage fused into one step (every local rank folds
 *             all L contributions: intra->ops->allreduce)
 *   ring(all) every local rank runs its rail's ring over the whole node sum,
 *             on the executor's own thread; no intra all-gather follows
 *
 * A small all-reduce costs synchronisations, not bytes: this path has one
 * intra-node step instead of two and no hand-off to the ring thread and
 * back (each a futex wake and a trip through the scheduler, tens of us on
 * a busy host), for L times the bytes on the wire. Every local rank feeds
 * its ring the same bits (the fused fold has RS's fixed order) and every
 * rail's ring has the same node order, so all ranks still end with the
 * same bits. The threshold must be equal on every rank (checked at init).
 *
 * Every kind starts with the argument agreement (hc_coll_agree, packing
 * in coll_agree.c): one all-reduce (MAX) of every rank's fingerprint and
 * verdict, so ranks called differently, or one that could not register
 * its buffer, fail alike before any data moves (not sticky: every rank saw
 * the same words after a complete exchange). HCOLL_CHECK_ARGS=0: none.
 *
 * Broadcast: the agreement (root, bytes), then the vector.
 *
 *   3stage  root's node          node B               node C
 *           RS: local rank i     ┌──────────┐         ┌──────────┐
 *           holds shard i ──rail i chain──► │ shard i ├──rail i──►│ shard i │
 *           then every node all-gathers its L shards (shared memory)
 *           RS is a reduce-scatter of the root's bytes and everyone else's
 *           zeros as integers (x + 0 = x exactly, whatever the bits); the
 *           chain (hc_ring_bcast_start) forwards each chunk as it lands, so
 *           each NIC carries about S/L bytes; the all-gather follows the
 *           chain piece by piece (coll_bcast.c)
 *   ring, flat   the chain over all ranks, from the root
 *   intra   the all-reduce of the root's bytes and the others' zeros
 *
 * Barrier: the agreement is the barrier (an all-reduce). Without it
 * (barrier.c):
 *
 *   intra   the node's barrier (shared memory): every local rank entered
 *   dissem  local rank i: ceil(log2 N) rounds over rail i, signalling the
 *           node 2^k ahead and waiting for the one 2^k behind (all ranks
 *           in the ring and flat plans, which have no intra step)
 *
 * Its signals are named by the operation's number, so a rank that runs an
 * all-reduce or broadcast where another entered a barrier finds out in its
 * ring driver (HCOLL_ERR_MISMATCH) rather than both waiting for ever.
 */
#include "core/coll_priv.h"
#include "base/clock.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/ringdrv.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"

/* ------------------------------------------------------------------------ */
/* Executing one all-reduce                                                   */
/* ------------------------------------------------------------------------ */

/* Scaled ops (redop.h): elements [off, off + n) of this rank's input times
 * the scalar, into recvbuf, which the first stage then reads in place.
 * Returns the buffer the first stage reads. */
static const void *prescale(const hc_coll_args_t *rq, size_t off, size_t n)
{
    const size_t es = hcoll_dtype_size(rq->dtype);
    if (!rq->ro.scaled || n == 0)
        return (const unsigned char *)rq->sendbuf + off * es;
    unsigned char *dst = (unsigned char *)rq->recvbuf + off * es;
    hc_redop_scale_host(&rq->ro, dst, (const unsigned char *)rq->sendbuf + off * es, n, rq->dtype);
    return dst;
}

/* The ring over buf on the calling thread, until done, an error or abort. */
static hcoll_status_t ring_run_here(hc_coll_t *co, const void *send, void *recv, size_t count,
                                    hcoll_dtype_t dtype, hcoll_op_t op)
{
    struct hcoll_comm *c = co->comm;
    const hc_ringdrv_op_t rop = { send, recv, count, dtype, op, c->nranks, 0, 0, 0,
                                  HC_RING_PHASE_ALLREDUCE,
                                  (uint32_t)co->opseq };
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank, "the all-reduce",
                                   co->intra, co->dissem };
    return hc_ringdrv_run(co->ring, &rop, &env);
}

/* Latency path of the three-stage plan (see the top of the file). The ring
 * thread is idle: run_3stage waits for every job it posts, and the ring is
 * handed over under the ring thread's lock, so this thread may drive the ring itself. */
static hcoll_status_t run_3stage_small(hc_coll_t *co, const hc_coll_args_t *rq, hcoll_stage_times_t *tm)
{
    double t = hc_now_us();
    hcoll_status_t st = co->intra->ops->allreduce(co->intra, prescale(rq, 0, rq->count),
                                                  rq->recvbuf, rq->count, rq->dtype, rq->op, NULL);
    /* One fused stage: split it evenly, as the one-node plan does. */
    tm->intra_rs_us = tm->intra_ag_us = (hc_now_us() - t) / 2;
    if (st != HCOLL_SUCCESS)
        return st;
    t = hc_now_us();
    st = ring_run_here(co, rq->recvbuf, rq->recvbuf, rq->count, rq->dtype, rq->op);
    tm->inter_us = hc_now_us() - t;
    return st;
}

static hcoll_status_t run_3stage(hc_coll_t *co, const hc_coll_args_t *rq, hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    const hc_intra_ops_t *iops = co->intra->ops;
    const size_t esize = hcoll_dtype_size(rq->dtype);
    const int L = c->local_size;
    unsigned char *recv = rq->recvbuf;
    size_t piece = co->piece_bytes / esize;
    if (piece < (size_t)L)
        piece = (size_t)L;
    const size_t npieces = (rq->count + piece - 1) / piece;
    hcoll_status_t st = HCOLL_SUCCESS, rst;
    double t;

    /* Stage 2 of piece k is waited for only after stage 1 of piece k+1. */
    uint64_t pending_id = 0;
    size_t pending_off = 0, pending_n = 0;
    int have_pending = 0;
    hc_coll_void_t v = { HCOLL_SUCCESS }; /* a void on this rail (coll_rail.c) */

    for (size_t k = 0; k <= npieces; k++) {
        if (k < npieces) {
            size_t off = k * piece;
            size_t n = rq->count - off < piece ? rq->count - off : piece;
            t = hc_now_us();
            st = iops->reduce_scatter(co->intra, prescale(rq, off, n), recv + off * esize, n,
                                      rq->dtype, rq->op, NULL);
            tm->intra_rs_us += hc_now_us() - t;
            if (st != HCOLL_SUCCESS) {
                /* The ring thread may still be reducing the previous piece
                 * in recvbuf: the buffers go back to the caller only after
                 * it is done with them. */
                if (have_pending)
                    hc_ringthr_wait(co->ringthr, pending_id, &tm->inter_us);
                break;
            }
            size_t soff, slen;
            hc_intra_shard(n, L, c->local_rank, &soff, &slen);
            unsigned char *shard = recv + (off + soff) * esize;
            const hc_ringdrv_op_t job = { shard, shard,     slen, rq->dtype, rq->op,
                                          c->nranks, 0, 0, 0, HC_RING_PHASE_ALLREDUCE,
                                          (uint32_t)co->opseq };
            uint64_t id = hc_ringthr_post(co->ringthr, &job);
            if (have_pending) {
                rst = hc_coll_rail_wait(co, pending_id, &tm->inter_us, &v);
                if (rst != HCOLL_SUCCESS) {
                    st = rst;
                    /* Let the ring thread finish the job just posted (it
                     * fails at once) before the buffers go back. */
                    hc_ringthr_wait(co->ringthr, id, &tm->inter_us);
                    break;
                }
                t = hc_now_us();
                st = iops->all_gather(co->intra, recv + pending_off * esize, pending_n,
                                      rq->dtype, NULL);
                tm->intra_ag_us += hc_now_us() - t;
                if (st != HCOLL_SUCCESS) {
                    hc_ringthr_wait(co->ringthr, id, &tm->inter_us);
                    break;
                }
            }
            pending_id = id;
            pending_off = off;
            pending_n = n;
            have_pending = 1;
        } else if (have_pending) {
            st = hc_coll_rail_wait(co, pending_id, &tm->inter_us, &v);
            if (st != HCOLL_SUCCESS)
                break;
            t = hc_now_us();
            st = iops->all_gather(co->intra, recv + pending_off * esize, pending_n, rq->dtype,
                                  NULL);
            tm->intra_ag_us += hc_now_us() - t;
        }
    }
    return hc_coll_rail_end(co, &v, st, 1);
}

/* Recursive doubling (algo.c): the fused intra step where there is one,
 * else this rank's (scaled) input copied into recvbuf; then rd across
 * nodes in recvbuf on this thread; integer AVG divided at the end. */
static hcoll_status_t run_rd(hc_coll_t *co, const hc_coll_args_t *rq, hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    double t = hc_now_us();
    hcoll_status_t st = HCOLL_SUCCESS;
    const void *src = prescale(rq, 0, rq->count);
    if (co->plan == HC_PLAN_3STAGE) {
        st = co->intra->ops->allreduce(co->intra, src, rq->recvbuf, rq->count, rq->dtype,
                                       rq->op, NULL);
        tm->intra_rs_us = tm->intra_ag_us = (hc_now_us() - t) / 2;
        if (st != HCOLL_SUCCESS)
            return st;
    } else if (src != rq->recvbuf && rq->count > 0) {
        memcpy(rq->recvbuf, src, rq->count * hcoll_dtype_size(rq->dtype));
    }
    t = hc_now_us();
    st = hc_coll_rd_run(co, rq->recvbuf, rq->count, rq->dtype, rq->op);
    tm->inter_us = hc_now_us() - t;
    if (st == HCOLL_SUCCESS)
        hc_reduce_avg_finish(rq->recvbuf, rq->count, rq->dtype, rq->op, c->nranks);
    return st;
}

static hcoll_status_t run_allreduce(hc_coll_t *co, const hc_coll_args_t *rq, hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    double t0 = hc_now_us(), t;
    hcoll_status_t st = HCOLL_SUCCESS;
    /* The same on every rank: count and dtype must be, and so must the knobs. */
    const size_t bytes = rq->count * hcoll_dtype_size(rq->dtype);
    const int small = bytes <= co->small_bytes;
    co->cur_algo = hc_algo_allreduce(&co->algo, co->plan, bytes, co->small_bytes);
    memset(tm, 0, sizeof *tm);
    if (co->cur_algo == HC_ALGO_RD) {
        st = run_rd(co, rq, tm);
        tm->total_us = hc_now_us() - t0;
        return st;
    }

    switch (co->plan) {
    case HC_PLAN_SINGLE:
        /* count 0 may come with NULL buffers, which memcpy must not see. */
        if (rq->ro.scaled)
            prescale(rq, 0, rq->count);
        else if (rq->sendbuf != rq->recvbuf && rq->count > 0)
            memcpy(rq->recvbuf, rq->sendbuf, rq->count * hcoll_dtype_size(rq->dtype));
        break;
    case HC_PLAN_INTRA: {
        const hc_intra_ops_t *iops = co->intra->ops;
        t = hc_now_us();
        const void *src = prescale(rq, 0, rq->count);
        if (small) {
            st = iops->allreduce(co->intra, src, rq->recvbuf, rq->count, rq->dtype, rq->op, NULL);
            /* One fused stage: split it evenly so the breakdown still adds up. */
            tm->intra_rs_us = tm->intra_ag_us = (hc_now_us() - t) / 2;
        } else {
            st = iops->reduce_scatter(co->intra, src, rq->recvbuf, rq->count, rq->dtype, rq->op,
                                      NULL);
            tm->intra_rs_us = hc_now_us() - t;
            t = hc_now_us();
            if (st == HCOLL_SUCCESS)
                st = iops->all_gather(co->intra, rq->recvbuf, rq->count, rq->dtype, NULL);
            tm->intra_ag_us = hc_now_us() - t;
        }
        if (st == HCOLL_SUCCESS)
            hc_reduce_avg_finish(rq->recvbuf, rq->count, rq->dtype, rq->op, c->nranks);
        break;
    }
    case HC_PLAN_RING:
    case HC_PLAN_FLAT:
        t = hc_now_us();
        st = ring_run_here(co, prescale(rq, 0, rq->count), rq->recvbuf, rq->count, rq->dtype,
                           rq->op);
        tm->inter_us = hc_now_us() - t;
        break;
    case HC_PLAN_3STAGE:
        st = small ? run_3stage_small(co, rq, tm) : run_3stage(co, rq, tm);
        break;
    }
    tm->total_us = hc_now_us() - t0;
    return st;
}

/* ------------------------------------------------------------------------ */
/* Broadcast and barrier                                                      */
/* ------------------------------------------------------------------------ */

static void times_add(hcoll_stage_times_t *sum, const hcoll_stage_times_t *t)
{
    sum->intra_rs_us += t->intra_rs_us;
    sum->inter_us += t->inter_us;
    sum->intra_ag_us += t->intra_ag_us;
}

/* An all-reduce of count elements in place in buf; its times add to *tm. */
static hcoll_status_t allreduce_in_place(hc_coll_t *co, void *buf, size_t count,
                                         hcoll_dtype_t dtype, hcoll_op_t op,
                                         hcoll_stage_times_t *tm)
{
    const hc_coll_args_t a = { .kind = HC_COLL_ALLREDUCE, .sendbuf = buf, .recvbuf = buf,
                               .count = count, .dtype = dtype, .op = op };
    hcoll_stage_times_t t;
    hcoll_status_t st = run_allreduce(co, &a, &t);
    times_add(tm, &t);
    return st;
}

/* The ring's broadcast chain from position root over buf, on this thread
 * (the ring thread is idle between operations). */
static hcoll_status_t chain_here(hc_coll_t *co, void *buf, size_t count, hcoll_dtype_t dtype,
                                 int root, hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    const hc_ringdrv_op_t rop = { .dst = buf, .count = count, .dtype = dtype, .bcast = 1,
                                  .root = root, .seq = (uint32_t)co->opseq };
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank, "the broadcast",
                                   co->intra, co->dissem };
    double t = hc_now_us();
    hcoll_status_t st = hc_ringdrv_run(co->ring, &rop, &env);
    tm->inter_us += hc_now_us() - t;
    return st;
}

/* Whether the node's combined vector of count elements travels split
 * (co->inline_split): rail l's rd carries local rank l's shard, so each
 * NIC sends 1/L of the bytes, and a node all-gather follows. Every local
 * rank decides alike: node_ok says that they all passed this count and
 * dtype. */
static int split_inline(const hc_coll_t *co, size_t count, hcoll_dtype_t dtype, int node_ok)
{
    const struct hcoll_comm *c = co->comm;
    return node_ok && co->plan == HC_PLAN_3STAGE && c->local_size > 1 &&
           count >= (size_t)c->local_size && count * hcoll_dtype_size(dtype) >= co->inline_split;
}

/* The agreement's exchange: w (in/out) MAX-combined over every rank, and
 * count elements of src reduced into co->agree_buf on the way (count 0:
 * the words alone): the node's shared-memory step, then recursive
 * doubling across nodes (of the whole vector on every rail, or split).
 * *data_ok: every rank's data went along and the buffer holds the sum. */
static hcoll_status_t agree_exchange(hc_coll_t *co, int64_t *w, const void *src, size_t count,
                                     hcoll_dtype_t dtype, hcoll_op_t op, hcoll_stage_times_t *tm,
                                     int *data_ok)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    unsigned char *buf = co->agree_buf;
    double t = hc_now_us();
    int ok = 1;
    if (co->plan == HC_PLAN_3STAGE || co->plan == HC_PLAN_INTRA) {
        st = co->intra->ops->agree(co->intra, w, HC_AGREE_WORDS, src, buf, count, dtype, op,
                                   &ok);
        tm->intra_rs_us += (hc_now_us() - t) / 2;
        tm->intra_ag_us += (hc_now_us() - t) / 2;
        if (st != HCOLL_SUCCESS)
            return st;
    } else if (count && src != buf) {
        memcpy(buf, src, count * hcoll_dtype_size(dtype));
    }
    co->cur_algo = HC_ALGO_INTRA;
    if (co->plan != HC_PLAN_INTRA) {
        const int split = split_inline(co, count, dtype, ok);
        size_t off = 0, len = count;
        if (split)
            hc_intra_shard(count, co->comm->local_size, co->comm->local_rank, &off, &len);
        t = hc_now_us();
        st = hc_coll_rd_agree(co, w, HC_AGREE_WORDS, buf + off * hcoll_dtype_size(dtype), len,
                              dtype, op, &ok);
        tm->inter_us += hc_now_us() - t;
        co->cur_algo = split ? HC_ALGO_RD_SPLIT : HC_ALGO_RD;
        if (split && st != HCOLL_SUCCESS) {
            /* The node's other ranks would wait for this shard in the
             * all-gather: they fail now rather than at a deadline. */
            hc_intra_poison(co->intra);
        } else if (split) {
            /* Every local rank gathers, whatever its rd said of the data:
             * the words decide afterwards whether the sum is used. */
            t = hc_now_us();
            st = co->intra->ops->all_gather(co->intra, buf, count, dtype, NULL);
            tm->intra_ag_us += hc_now_us() - t;
        }
    }
    *data_ok = ok;
    return st;
}

/* What travels with the agreement as one all-reduce of at most
 * co->inline_max bytes (agree_run). */
typedef struct inline_vec {
    const void *src;  /* this rank's contribution */
    size_t n;         /* elements of dt */
    hcoll_dtype_t dt;
    hcoll_op_t op;
    size_t bytes;
} inline_vec_t;

/* The elements of the vector a would send with the agreement (the whole
 * nranks x count for a reduce-scatter or all-gather); 0 when it does not
 * travel with it: too large for its limit, a barrier, HCOLL_ALGO's
 * broadcast=tree|chain, or no agreement (the limits are 0 then). */
static size_t inline_count(const hc_coll_t *co, const hc_coll_args_t *a)
{
    const int whole = a->kind == HC_COLL_REDUCE_SCATTER || a->kind == HC_COLL_ALLGATHER;
    const size_t n = whole ? a->count * (size_t)co->comm->nranks : a->count;
    size_t cap = a->kind == HC_COLL_BROADCAST ? co->inline_bcast : co->inline_max;
    if (whole && cap > HC_ALGO_INLINE_RSAG_MAX)
        cap = HC_ALGO_INLINE_RSAG_MAX;
    if (a->count == 0 || n > cap / hcoll_dtype_size(a->dtype) || a->kind == HC_COLL_BARRIER ||
        (a->kind == HC_COLL_BROADCAST && co->algo.bcast_forced))
        return 0;
    return n;
}

/* 1 when a fits the agreement, with *v filled in (co->agree_buf may hold
 * the contribution). A broadcast and an all-gather become sums of
 * integers: the root's bytes plus everybody's zeros, or each rank's block
 * at its place plus zeros; no two ranks' non-zero bytes meet, so the sum
 * has no carry and is exact. A reduce-scatter reduces the whole vector
 * and each rank keeps its block. One node step and one exchange across
 * nodes, where the broadcast's tree or the ring's phases after the
 * agreement took a second synchronisation of each and the ring thread's
 * hand-off. */
static int inline_vec(hc_coll_t *co, const hc_coll_args_t *a, inline_vec_t *v)
{
    const size_t n = inline_count(co, a), es = hcoll_dtype_size(a->dtype);
    if (n == 0)
        return 0;
    const size_t bytes = n * es;
    if (a->kind == HC_COLL_ALLREDUCE || a->kind == HC_COLL_REDUCE_SCATTER) {
        *v = (inline_vec_t){ a->sendbuf, n, a->dtype, a->op, bytes };
        if (a->ro.scaled) { /* scaled into the buffer: recvbuf stays as it is */
            hc_redop_scale_host(&a->ro, co->agree_buf, a->sendbuf, n, a->dtype);
            v->src = co->agree_buf;
        }
        return 1;
    }
    const hcoll_dtype_t dt = hc_coll_bytes_dtype(bytes);
    *v = (inline_vec_t){ a->sendbuf, bytes / hcoll_dtype_size(dt), dt, HCOLL_SUM, bytes };
    if (a->kind == HC_COLL_ALLGATHER || co->comm->rank != a->root) {
        memset(co->agree_buf, 0, bytes);
        v->src = co->agree_buf;
    }
    if (a->kind == HC_COLL_ALLGATHER)
        memcpy(co->agree_buf + (size_t)co->comm->rank * a->count * es, a->sendbuf,
               a->count * es);
    return 1;
}

/* The agreement (coll_priv.h), carrying the collective's data when inl
 * and inline_vec says it fits: then *done_out = 1 once the result is in
 * recvbuf. Each rank decides by its own arguments: ranks that decide
 * differently disagree on the collective, count or dtype, so their data
 * does not combine (or is not kept), the words say why, and nothing is
 * written. */
static hcoll_status_t agree_run(hc_coll_t *co, const hc_coll_args_t *a, hcoll_status_t verdict,
                                int inl, hcoll_stage_times_t *tm, int *agreed_out, int *done_out)
{
    struct hcoll_comm *c = co->comm;
    *done_out = 0;
    if (!co->check_args || co->plan == HC_PLAN_SINGLE)
        return verdict;
    int64_t w[HC_AGREE_WORDS];
    hc_agree_pack(a, co->opseq, c->rank, verdict, w);
    inline_vec_t v = { 0 };
    inl = inl && verdict == HCOLL_SUCCESS && inline_vec(co, a, &v);
    int ok = 0;
    hcoll_status_t st = inl ? agree_exchange(co, w, v.src, v.n, v.dt, v.op, tm, &ok)
                            : agree_exchange(co, w, NULL, 0, HCOLL_INT64, HCOLL_MAX, tm, &ok);
    if (st != HCOLL_SUCCESS)
        return st;
    st = hc_agree_judge(w, a, co->opseq, c->rank, verdict, &c->err);
    if (st != HCOLL_SUCCESS) {
        *agreed_out = 1;
        return st;
    }
    if (!inl)
        return HCOLL_SUCCESS;
    if (!ok) /* equal arguments everywhere, so equal lengths: cannot happen */
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INTERNAL,
                          "%s: the ranks agreed but their data did not combine",
                          hc_coll_kind_name(a->kind));
    /* The vector's part this rank receives: all of it, or (reduce-scatter)
     * its block. */
    const size_t es = hcoll_dtype_size(a->dtype), mine = a->count * es;
    const size_t at = a->kind == HC_COLL_REDUCE_SCATTER ? (size_t)c->rank * mine : 0;
    memcpy(a->recvbuf, co->agree_buf + at, a->kind == HC_COLL_ALLGATHER ? v.bytes : mine);
    if (a->kind == HC_COLL_ALLREDUCE || a->kind == HC_COLL_REDUCE_SCATTER)
        hc_reduce_avg_finish(a->recvbuf, a->count, a->dtype, a->op, c->nranks);
    *done_out = 1;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_coll_agree(hc_coll_t *co, const hc_coll_args_t *a, hcoll_status_t verdict,
                             hcoll_stage_times_t *tm, int *agreed_out)
{
    int done;
    return agree_run(co, a, verdict, 0, tm, agreed_out, &done);
}

hcoll_status_t hc_coll_bcast_agree(hc_coll_t *co, const hc_coll_args_t *a,
                                   hcoll_stage_times_t *tm, int *agreed_out)
{
    return hc_coll_agree(co, a, HCOLL_SUCCESS, tm, agreed_out);
}

static hcoll_status_t run_broadcast(hc_coll_t *co, const hc_coll_args_t *a,
                                    hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    const size_t bytes = a->count * hcoll_dtype_size(a->dtype);
    const int is_root = c->rank == a->root;
    if (bytes == 0)
        return HCOLL_SUCCESS;
    if (is_root && a->sendbuf != a->recvbuf)
        memcpy(a->recvbuf, a->sendbuf, bytes);
    hcoll_dtype_t idt = hc_coll_bytes_dtype(bytes);
    const size_t n = bytes / hcoll_dtype_size(idt);
    if (hc_coll_bcast_tree_applies(co, bytes)) /* small: tree + node step (coll_bcast.c) */
        return hc_coll_bcast_tree(co, a, n, idt, tm);
    switch (co->plan) {
    case HC_PLAN_SINGLE:
        return HCOLL_SUCCESS;
    case HC_PLAN_INTRA:
        if (!is_root)
            memset(a->recvbuf, 0, bytes);
        return allreduce_in_place(co, a->recvbuf, n, idt, HCOLL_SUM, tm);
    case HC_PLAN_RING:
    case HC_PLAN_FLAT:
        /* Ring positions are ranks. */
        return chain_here(co, a->recvbuf, n, idt, a->root, tm);
    case HC_PLAN_3STAGE:
        return hc_coll_bcast_3stage(co, a, n, idt, tm);
    }
    return HCOLL_ERR_INTERNAL;
}

/* ------------------------------------------------------------------------ */
/* Reduce-scatter and all-gather: the arguments, then coll_rsag.c             */
/* ------------------------------------------------------------------------ */

hcoll_status_t hc_coll_run(hc_coll_t *co, const hc_coll_args_t *a, hcoll_stage_times_t *tm,
                           int *agreed_out)
{
    *agreed_out = 0;
    const double t0 = hc_now_us();
    memset(tm, 0, sizeof *tm);
    /* What the call will register, first (coll_pin.c): a failure is this
     * rank's verdict. One that travels with the agreement registers
     * nothing (rd copies through areas of its own). */
    hc_coll_pins_t pins = { .co = co };
    const hcoll_status_t verdict =
        co->check_args && inline_count(co, a) ? HCOLL_SUCCESS : hc_coll_pin(co, a, &pins);
    int inline_done = 0;
    hcoll_status_t st = agree_run(co, a, verdict, 1, tm, agreed_out, &inline_done);
    if (st != HCOLL_SUCCESS || inline_done) {
        /* A small all-reduce travelled with the agreement: its stages. */
        hc_coll_unpin(&pins);
        tm->total_us = hc_now_us() - t0;
        return st;
    }
    memset(tm, 0, sizeof *tm); /* the check is not a stage */
    switch (a->kind) {
    case HC_COLL_ALLREDUCE: st = run_allreduce(co, a, tm); break;
    case HC_COLL_BROADCAST:
        st = run_broadcast(co, a, tm);
        co->cur_algo = hc_coll_bcast_algo(co, a->count * hcoll_dtype_size(a->dtype));
        break;
    case HC_COLL_BARRIER:
        /* The agreement is itself a barrier: an all-reduce, which no rank
         * leaves before every rank has entered it. */
        st = co->check_args && co->plan != HC_PLAN_SINGLE ? HCOLL_SUCCESS
                                                          : hc_coll_barrier(co, tm);
        if (!co->check_args || co->plan == HC_PLAN_SINGLE) /* else: the agreement's */
            co->cur_algo = co->plan == HC_PLAN_SINGLE ? HC_ALGO_COPY : HC_ALGO_DISSEM;
        break;
    default:
        st = hc_coll_run_rsag(co, a, tm);
        co->cur_algo = HC_ALGO_RSAG;
        break;
    }
    hc_coll_unpin(&pins);
    tm->total_us = hc_now_us() - t0;
    return st;
}
