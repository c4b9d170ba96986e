/*
 * What an operation will register, pinned before the argument agreement
 * (coll_run.c), so that a registration failure is this rank's verdict and
 * fails that call alike on every rank before anything moves, and never
 * the ring half-way (design: "The verdict: registration").
 *
 *   pin set   every range a ring job of the call registers (verbs: the
 *             transport pins it, hc_ring_mem_pin; TCP: nothing)
 *     ring, flat all-reduce   recvbuf (and sendbuf when the ring sends from it)
 *     latency path            recvbuf (the ring over the node's sum)
 *     three-stage all-reduce  the shard of recvbuf of every piece (S/L bytes)
 *     broadcast               the chain's range (the shard, three stages)
 *     reduce-scatter, gather  each piece's ring job (coll_rsag.c), in
 *                             hcoll's own vector, which stays registered
 *   a job that runs in the ring's stage (ring.h, HC_RING_STAGE_MAX) pins
 *   nothing of the caller's: the stage is grown to hold it instead
 *   agreement verdict = the first pin that failed (already recorded)
 *   the operation         its own mr_reg hits the pinned entries
 *   after it              every pin released
 *
 * Only the ranges the ring registers whole anyway (never a contiguous
 * cover of the shards, which would lock L times more), so nothing more is
 * locked at once than one call's ring ranges: S/L for a three-stage call,
 * S for the ring plan, as before. Where a job registers nothing (gather
 * mode, TCP, a one-rank ring) nothing is pinned.
 */
#include "core/coll_priv.h"

#include <stdlib.h>

#include "core/comm.h"
#include "base/err.h"
#include "base/log.h"

/* One range into the set (nothing where the transport keeps none). */
static hcoll_status_t pins_add(void *arg, const void *p, size_t bytes)
{
    hc_coll_pins_t *s = arg;
    struct hcoll_comm *c = s->co->comm;
    if (bytes == 0)
        return HCOLL_SUCCESS;
    if (s->n == s->cap) {
        const size_t cap = s->cap ? 2 * s->cap : 8;
        hc_mr_t **m = realloc(s->mr, cap * sizeof *m);
        if (!m)
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                              "no memory to pin %zu ranges before the call", cap);
        s->mr = m;
        s->cap = cap;
    }
    hc_mr_t *pin = NULL;
    hcoll_status_t st = hc_ring_mem_pin(s->co->ring, (void *)p, bytes, &pin);
    if (st == HCOLL_SUCCESS && pin)
        s->mr[s->n++] = pin;
    return st;
}

/* One ring job's buffers: nothing where it registers nothing; where it
 * runs in the ring's stage, the stage grown to hold it (nothing of the
 * caller's); else recv pinned, and send where it is apart. */
static hcoll_status_t pin_job(void *arg, const void *send, void *recv, size_t count,
                              hcoll_dtype_t dtype, int phase)
{
    hc_coll_pins_t *s = arg;
    hc_ring_t *ring = s->co->ring;
    const size_t bytes = count * hcoll_dtype_size(dtype);
    if (!hc_ring_registers(ring, count, dtype, phase))
        return HCOLL_SUCCESS;
    if (hc_ring_stages(ring, send, recv, count, dtype, phase))
        return hc_ring_stage_reserve(ring, bytes);
    hcoll_status_t st = pins_add(s, recv, bytes);
    if (st == HCOLL_SUCCESS && send != recv)
        st = pins_add(s, send, bytes);
    return st;
}

/* The three-stage all-reduce's ring jobs: piece k's shard of recvbuf, cut
 * as run_3stage cuts it. */
static hcoll_status_t pin_3stage_shards(hc_coll_pins_t *s, const hc_coll_args_t *a)
{
    hc_coll_t *co = s->co;
    struct hcoll_comm *c = co->comm;
    const size_t es = hcoll_dtype_size(a->dtype);
    const int L = c->local_size;
    size_t piece = co->piece_bytes / es;
    if (piece < (size_t)L)
        piece = (size_t)L;
    hcoll_status_t st = HCOLL_SUCCESS;
    for (size_t off = 0; off < a->count && st == HCOLL_SUCCESS; off += piece) {
        const size_t n = a->count - off < piece ? a->count - off : piece;
        size_t soff, slen;
        hc_intra_shard(n, L, c->local_rank, &soff, &slen);
        unsigned char *shard = (unsigned char *)a->recvbuf + (off + soff) * es;
        st = pin_job(s, shard, shard, slen, a->dtype, HC_RING_PHASE_ALLREDUCE);
    }
    return st;
}

static hcoll_status_t pin_allreduce(hc_coll_pins_t *s, const hc_coll_args_t *a)
{
    hc_coll_t *co = s->co;
    const size_t bytes = a->count * hcoll_dtype_size(a->dtype);
    /* Recursive doubling sends from its own registered slots (as
     * run_allreduce chooses it). */
    if (hc_algo_allreduce(&co->algo, co->plan, bytes, co->small_bytes) == HC_ALGO_RD)
        return HCOLL_SUCCESS;
    if (co->plan == HC_PLAN_3STAGE && bytes > co->small_bytes)
        return pin_3stage_shards(s, a);
    /* The ring and flat plans send from sendbuf itself (unscaled). */
    const void *send = co->plan != HC_PLAN_3STAGE && !a->ro.scaled ? a->sendbuf : a->recvbuf;
    return pin_job(s, send, a->recvbuf, a->count, a->dtype, HC_RING_PHASE_ALLREDUCE);
}

static hcoll_status_t pin_broadcast(hc_coll_pins_t *s, const hc_coll_args_t *a)
{
    hc_coll_t *co = s->co;
    struct hcoll_comm *c = co->comm;
    const size_t bytes = a->count * hcoll_dtype_size(a->dtype);
    unsigned char *base = a->recvbuf;
    size_t len = bytes;
    if (co->plan == HC_PLAN_3STAGE) { /* as run_broadcast cuts it */
        const size_t es = bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : 1;
        size_t soff, slen;
        hc_intra_shard(bytes / es, c->local_size, c->local_rank, &soff, &slen);
        base += soff * es;
        len = slen * es;
    }
    return pin_job(s, base, base, len, HCOLL_UINT8, -1);
}

hcoll_status_t hc_coll_pin(hc_coll_t *co, const hc_coll_args_t *a, hc_coll_pins_t *s)
{
    s->co = co;
    s->mr = NULL;
    s->n = s->cap = 0;
    if (!co->ring || a->count == 0 || !co->check_args)
        return HCOLL_SUCCESS;
    switch (a->kind) {
    case HC_COLL_ALLREDUCE: return pin_allreduce(s, a);
    case HC_COLL_BROADCAST: return pin_broadcast(s, a);
    case HC_COLL_REDUCE_SCATTER:
    case HC_COLL_ALLGATHER: return hc_coll_rsag_ring_jobs(co, a, pin_job, s);
    default: return HCOLL_SUCCESS;
    }
}

void hc_coll_unpin(hc_coll_pins_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        hc_ring_mem_unpin(s->co->ring, s->mr[i]);
    free(s->mr);
    s->mr = NULL;
    s->n = s->cap = 0;
}

int hc_coll_void_agreed(const hc_coll_t *co, uint64_t voided_before)
{
    if (!co->ring || hc_ring_error(co->ring) != HCOLL_SUCCESS)
        return 0;
    if (co->plan == HC_PLAN_3STAGE)
        return co->rail_void_op != 0 && co->rail_void_op == co->opseq;
    return hc_ring_voided(co->ring) > voided_before &&
           (co->plan == HC_PLAN_RING || co->plan == HC_PLAN_FLAT);
}
