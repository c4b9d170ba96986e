/*
 * The shared-memory backend's step engine and its collective operations
 * (shm.h).
 *
 * One POSIX segment per node and communicator. Every local rank owns
 * NSLOTS slots of slot_bytes; a call is cut into steps, step g uses slot
 * g % NSLOTS of every rank, so while the owners reduce step g the ranks
 * already fill step g+1 (double buffering).
 *
 *   reduce-scatter, step g (L = 3; sub-piece j of a slot belongs to shard j)
 *
 *     rank 0 sendbuf ─copy─► slot0[g%2] = | s0 | s1 | s2 |
 *     rank 1 sendbuf ─copy─► slot1[g%2] = | s0 | s1 | s2 |
 *     rank 2 sendbuf ─copy─► slot2[g%2] = | s0 | s1 | s2 |
 *                                            │    │    └─► rank 2: ((s2@0 op s2@1) op s2@2)
 *                                            │    └──────► rank 1: ((s1@0 op s1@1) op s1@2)
 *                                            └───────────► rank 0: ((s0@0 op s0@1) op s0@2)
 *                                                          into recvbuf at shard j's offset
 *   (an owner reads its own term from its sendbuf, so it skips copying its
 *   own sub-piece, unless sendbuf == recvbuf: then the result would
 *   overwrite the term before it is read, and the term goes through the
 *   slot like the others.)
 *
 *   all-gather, step g: rank j copies a piece of its shard into its slot,
 *   every other rank copies it out to recvbuf at shard j's offset.
 *
 *   scatter, step g: the root copies piece g of every other shard into
 *   its slot, laid out as RS's, and rank j copies sub-piece j out to recvbuf
 *   at shard j's offset (one writer; the broadcast's first stage).
 *
 *   bcast, step g: the root copies piece g of the whole vector into its
 *   slot, every other rank copies it out to recvbuf (one writer; the small
 *   broadcast's node step).
 *
 *   allreduce (fused), step g: every rank copies a piece of the whole
 *   vector into its slot, then every rank folds all L slots into recvbuf:
 *
 *     rank q sendbuf[piece g] ─copy─► slotq[g%2]     (q = 0..L-1)
 *     every rank: recvbuf[piece g] = ((slot0 op slot1) op slot2) ...
 *
 *   one synchronisation per step instead of RS's and AG's two, at the price
 *   of L times the reads and folds: the latency path for small vectors.
 *   The fold order is RS's, so the bits equal RS then AG.
 *
 * Every element is folded in local-rank order 0,1,..,L-1 by exactly one
 * rank, so results are bit-identical on all ranks.
 *
 * Synchronisation, per rank in the segment: posted (steps published) and
 * done (steps consumed), monotonic over the life of the segment, so
 * successive calls never mix. Publishing step g waits for every done >=
 * g-NSLOTS+1 (nobody still reads the slot); consuming waits for every
 * posted >= g+1. Each rank runs publish(0), then publish(k+1) before
 * consume(k): every wait is on an event that comes earlier in every rank's
 * sequence, so the scheme cannot deadlock. Slot descriptors carry the step,
 * kind, count, dtype and op, so ranks that disagree get HCOLL_ERR_MISMATCH
 * instead of garbage.
 *
 * Cross-memory attach (process_vm_readv) is not used: every byte goes
 * through the slots, which works under any ptrace policy.
 */
#include "intra/shm.h"

#include <stdint.h>
#include <string.h>

#include "base/log.h"
#include "base/reduce.h"

/* ------------------------------------------------------------------------ */
/* The step engine                                                            */
/* ------------------------------------------------------------------------ */

static unsigned char *hc_shm_slot(const hc_shm_t *s, int q, uint64_t g)
{
    return s->data + ((size_t)q * HC_SHM_NSLOTS + (size_t)(g % HC_SHM_NSLOTS)) * s->slot_bytes;
}

/* Shard j's piece of step k: *elem_out (offset in the vector) and length. */
static size_t hc_shm_piece(const hc_shm_t *s, const hc_shm_call_t *c, int j, uint64_t k,
                           size_t *elem_out)
{
    size_t off, len;
    hc_intra_shard(c->count, s->L, j, &off, &len);
    size_t start = (size_t)k * c->per;
    *elem_out = off + start;
    if (start >= len)
        return 0;
    return len - start < c->per ? len - start : c->per;
}

/* Piece k of a fused allreduce: elements [*elem_out, *elem_out + n). */
static size_t hc_shm_ar_piece(const hc_shm_call_t *c, uint64_t k, size_t *elem_out)
{
    size_t start = (size_t)k * c->per;
    *elem_out = start;
    return c->count - start < c->per ? c->count - start : c->per;
}

/* Element elem of the call's source (contiguous, or in blocks). */
static const unsigned char *hc_shm_src_at(const hc_shm_call_t *c, size_t elem)
{
    if (!c->blocks)
        return c->src + elem * c->es;
    return c->blocks[elem / c->blen] + elem % c->blen * c->es;
}

/* Elements [elem, elem + n) of the call's source into dst, block by block. */
static void hc_shm_src_copy(const hc_shm_call_t *c, unsigned char *dst, size_t elem, size_t n)
{
    while (n > 0) {
        size_t m = c->blocks && c->blen - elem % c->blen < n ? c->blen - elem % c->blen : n;
        memcpy(dst, hc_shm_src_at(c, elem), m * c->es);
        dst += m * c->es;
        elem += m;
        n -= m;
    }
}

/* src (n elements) to elements [elem, elem + n) of the call's destination,
 * block by block. */
static void hc_shm_dst_copy(const hc_shm_call_t *c, size_t elem, const unsigned char *src,
                            size_t n)
{
    while (n > 0) {
        if (!c->blocks) {
            memcpy(c->dst + elem * c->es, src, n * c->es);
            return;
        }
        size_t o = elem % c->blen, m = c->blen - o < n ? c->blen - o : n;
        memcpy(c->blocks[elem / c->blen] + o * c->es, src, m * c->es);
        src += m * c->es;
        elem += m;
        n -= m;
    }
}

/* Whether elements [elem, elem + n) of the call's destination blocks are
 * where src holds them already (an all-gather whose caller passed its own
 * block as src's shard): then copying them there is a no-op we skip. */
static int hc_shm_dst_is_src(const hc_shm_call_t *c, size_t elem, size_t n)
{
    while (n > 0) {
        size_t o = elem % c->blen, m = c->blen - o < n ? c->blen - o : n;
        if (c->blocks[elem / c->blen] + o * c->es != c->src + elem * c->es)
            return 0;
        elem += m;
        n -= m;
    }
    return 1;
}

/* The agreement's slot: the words, then this rank's data length, dtype
 * and op, then (from a cache line on) its data. */
static size_t hc_shm_agree_hdr(int nwords)
{
    return ((size_t)(nwords + 3) * 8 + HC_SHM_LINE - 1) / HC_SHM_LINE * HC_SHM_LINE;
}

static void hc_shm_agree_publish(const hc_shm_call_t *c, unsigned char *slot)
{
    const int64_t meta[3] = { (int64_t)(c->dcount * c->es), (int64_t)c->dtype, (int64_t)c->op };
    memcpy(slot, c->words, c->count * 8);
    memcpy(slot + c->count * 8, meta, sizeof meta);
    if (c->dcount)
        memcpy(slot + hc_shm_agree_hdr((int)c->count), c->src, c->dcount * c->es);
}

/* Every local rank's words MAX-combined into ours; the data folded in
 * local-rank order (every term from its slot, as the fused step) only
 * where every rank's length, dtype and op equal ours. */
static void hc_shm_agree_consume(hc_shm_t *s, hc_shm_call_t *c, uint64_t g)
{
    const size_t hb = hc_shm_agree_hdr((int)c->count);
    const unsigned char *mine = hc_shm_slot(s, s->lrank, g) + c->count * 8;
    int same = 1;
    for (int q = 0; q < s->L; q++) {
        const unsigned char *slot = hc_shm_slot(s, q, g);
        for (size_t i = 0; q != s->lrank && i < c->count; i++) {
            int64_t v;
            memcpy(&v, slot + i * 8, 8);
            if (v > c->words[i])
                c->words[i] = v;
        }
        same &= memcmp(slot + c->count * 8, mine, 24) == 0;
    }
    c->data_ok = same;
    if (!same || !c->dcount)
        return;
    const size_t blk = HC_SHM_FOLD_BYTES / c->es, n = c->dcount;
    for (size_t b = 0; b < n; b += blk) {
        size_t nb = n - b < blk ? n - b : blk, boff = hb + b * c->es;
        hc_reduce(c->dst + b * c->es, hc_shm_slot(s, 0, g) + boff, hc_shm_slot(s, 1, g) + boff,
                  nb, c->dtype, c->op);
        for (int q = 2; q < s->L; q++)
            hc_reduce(c->dst + b * c->es, c->dst + b * c->es, hc_shm_slot(s, q, g) + boff, nb,
                      c->dtype, c->op);
    }
}

static hcoll_status_t hc_shm_publish(hc_shm_t *s, const hc_shm_call_t *c, uint64_t k)
{
    const uint64_t g = c->base + k;
    hcoll_status_t st;
    if (g >= HC_SHM_NSLOTS) {
        st = hc_shm_wait(s, hc_shm_pending_done, g - HC_SHM_NSLOTS + 1,
                         hc_shm_kind_name(c->kind));
        if (st != HCOLL_SUCCESS)
            return st;
    }
    unsigned char *slot = hc_shm_slot(s, s->lrank, g);
    size_t elem, n;
    if (c->kind == HC_SHM_KIND_RS) {
        for (int j = 0; j < s->L; j++) {
            if (j == s->lrank && !c->inplace)
                continue; /* the owner folds its own term straight from sendbuf */
            n = hc_shm_piece(s, c, j, k, &elem);
            if (n)
                hc_shm_src_copy(c, slot + (size_t)j * c->per * c->es, elem, n);
        }
    } else if (c->kind == HC_SHM_KIND_AG) {
        n = hc_shm_piece(s, c, s->lrank, k, &elem);
        if (n && c->blocks) { /* our shard comes from src, and goes to the blocks too */
            memcpy(slot, c->src + elem * c->es, n * c->es);
            if (!hc_shm_dst_is_src(c, elem, n))
                hc_shm_dst_copy(c, elem, slot, n);
        } else if (n) {
            memcpy(slot, c->dst + elem * c->es, n * c->es);
        }
    } else if (c->kind == HC_SHM_KIND_AR) {
        n = hc_shm_ar_piece(c, k, &elem);
        memcpy(slot, c->src + elem * c->es, n * c->es);
    } else if (c->kind == HC_SHM_KIND_AGREE) {
        hc_shm_agree_publish(c, slot);
    } else if (c->kind == HC_SHM_KIND_SC && s->lrank == (int)c->op) {
        /* The root: every other shard's piece through its sub-piece of the
         * slot, as RS lays them out; its own straight to recvbuf. */
        for (int j = 0; j < s->L; j++) {
            n = hc_shm_piece(s, c, j, k, &elem);
            if (n && j != s->lrank)
                memcpy(slot + (size_t)j * c->per * c->es, c->src + elem * c->es, n * c->es);
            else if (n && c->src != c->dst)
                memcpy(c->dst + elem * c->es, c->src + elem * c->es, n * c->es);
        }
    } else if (c->kind == HC_SHM_KIND_BC && s->lrank == (int)c->op) {
        /* The root: piece k of the whole vector through its slot. */
        n = hc_shm_ar_piece(c, k, &elem);
        memcpy(slot, c->src + elem * c->es, n * c->es);
        if (c->src != c->dst)
            memcpy(c->dst + elem * c->es, c->src + elem * c->es, n * c->es);
    }
    hc_shm_desc_t *d = &s->hdr->ranks[s->lrank].desc[g % HC_SHM_NSLOTS];
    d->step = g;
    d->count = c->count;
    d->kind = (uint32_t)c->kind;
    d->dtype = (uint32_t)c->dtype;
    d->op = (uint32_t)c->op;
    d->note = s->note_out;
    __atomic_store_n(&s->hdr->ranks[s->lrank].posted, g + 1, __ATOMIC_SEQ_CST);
    hc_shm_wake(s->hdr);
    return HCOLL_SUCCESS;
}

static hcoll_status_t hc_shm_check_desc(hc_shm_t *s, const hc_shm_call_t *c, uint64_t g)
{
    for (int q = 0; q < s->L; q++) {
        if (q == s->lrank)
            continue;
        const hc_shm_desc_t *d = &s->hdr->ranks[q].desc[g % HC_SHM_NSLOTS];
        /* An agreement's data may differ: its words say so (hc_shm_agree). */
        int same = d->step == g && d->kind == (uint32_t)c->kind && d->count == c->count &&
                   (c->kind == HC_SHM_KIND_AGREE || d->dtype == (uint32_t)c->dtype) &&
                   ((c->kind != HC_SHM_KIND_RS && c->kind != HC_SHM_KIND_AR &&
                     c->kind != HC_SHM_KIND_SC && c->kind != HC_SHM_KIND_BC) ||
                    d->op == (uint32_t)c->op);
        if (!same) {
            hc_shm_poison(s, HCOLL_ERR_MISMATCH, q);
            return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_MISMATCH,
                              "intra-node shm: local rank %d runs %s(count %llu, %s, %s) at "
                              "step %llu while this rank (local %d) runs %s(count %zu, %s, %s)"
                              " at step %llu",
                              q, hc_shm_kind_name((int)d->kind), (unsigned long long)d->count,
                              hcoll_dtype_name((hcoll_dtype_t)d->dtype),
                              hcoll_op_name((hcoll_op_t)d->op), (unsigned long long)d->step,
                              s->lrank, hc_shm_kind_name(c->kind), c->count,
                              hcoll_dtype_name(c->dtype), hcoll_op_name(c->op),
                              (unsigned long long)g);
        }
        if (d->note && !s->note_in)
            s->note_in = d->note;
    }
    return HCOLL_SUCCESS;
}

/* Local rank q's term of our shard's piece at step g, byte offset boff. */
static const unsigned char *hc_shm_term(const hc_shm_t *s, const hc_shm_call_t *c, uint64_t g,
                                        int q, size_t elem, size_t boff)
{
    if (q == s->lrank && !c->inplace)
        return hc_shm_src_at(c, elem + boff / c->es);
    return hc_shm_slot(s, q, g) + (size_t)s->lrank * c->per * c->es + boff;
}

static void hc_shm_fold(hc_shm_t *s, const hc_shm_call_t *c, uint64_t g, size_t elem, size_t n)
{
    unsigned char *dst = c->dst + elem * c->es;
    const size_t blk = HC_SHM_FOLD_BYTES / c->es;
    for (size_t b = 0, nb; b < n; b += nb) {
        nb = n - b < blk ? n - b : blk;
        /* Our own term from blocks: no fold crosses a block's end. */
        if (c->blocks && c->blen - (elem + b) % c->blen < nb)
            nb = c->blen - (elem + b) % c->blen;
        size_t boff = b * c->es;
        /* Always ((t0 op t1) op t2) op ...: the fixed order. */
        hc_reduce(dst + boff, hc_shm_term(s, c, g, 0, elem, boff),
                  hc_shm_term(s, c, g, 1, elem, boff), nb, c->dtype, c->op);
        for (int q = 2; q < s->L; q++)
            hc_reduce(dst + boff, dst + boff, hc_shm_term(s, c, g, q, elem, boff), nb,
                      c->dtype, c->op);
    }
}

/* Fused allreduce: every term comes from its slot (our own too: in place,
 * recvbuf is being overwritten), folded in local-rank order as RS does. */
static void hc_shm_ar_fold(hc_shm_t *s, const hc_shm_call_t *c, uint64_t g, size_t elem,
                           size_t n)
{
    unsigned char *dst = c->dst + elem * c->es;
    const size_t blk = HC_SHM_FOLD_BYTES / c->es;
    for (size_t b = 0; b < n; b += blk) {
        size_t nb = n - b < blk ? n - b : blk;
        size_t boff = b * c->es;
        hc_reduce(dst + boff, hc_shm_slot(s, 0, g) + boff, hc_shm_slot(s, 1, g) + boff, nb,
                  c->dtype, c->op);
        for (int q = 2; q < s->L; q++)
            hc_reduce(dst + boff, dst + boff, hc_shm_slot(s, q, g) + boff, nb, c->dtype, c->op);
    }
}

static hcoll_status_t hc_shm_consume(hc_shm_t *s, hc_shm_call_t *c, uint64_t k)
{
    const uint64_t g = c->base + k;
    hcoll_status_t st = hc_shm_wait(s, hc_shm_pending_posted, g + 1, hc_shm_kind_name(c->kind));
    if (st != HCOLL_SUCCESS)
        return st;
    if ((st = hc_shm_check_desc(s, c, g)) != HCOLL_SUCCESS)
        return st;
    size_t elem, n;
    if (c->kind == HC_SHM_KIND_RS) {
        n = hc_shm_piece(s, c, s->lrank, k, &elem);
        if (n)
            hc_shm_fold(s, c, g, elem, n);
    } else if (c->kind == HC_SHM_KIND_AG) {
        for (int q = 0; q < s->L; q++) {
            if (q == s->lrank)
                continue;
            n = hc_shm_piece(s, c, q, k, &elem);
            if (n)
                hc_shm_dst_copy(c, elem, hc_shm_slot(s, q, g), n);
        }
    } else if (c->kind == HC_SHM_KIND_AR) {
        n = hc_shm_ar_piece(c, k, &elem);
        hc_shm_ar_fold(s, c, g, elem, n);
    } else if (c->kind == HC_SHM_KIND_AGREE) {
        hc_shm_agree_consume(s, c, g);
    } else if (c->kind == HC_SHM_KIND_SC && s->lrank != (int)c->op) {
        n = hc_shm_piece(s, c, s->lrank, k, &elem);
        if (n)
            memcpy(c->dst + elem * c->es,
                   hc_shm_slot(s, (int)c->op, g) + (size_t)s->lrank * c->per * c->es,
                   n * c->es);
    } else if (c->kind == HC_SHM_KIND_BC && s->lrank != (int)c->op) {
        n = hc_shm_ar_piece(c, k, &elem);
        memcpy(c->dst + elem * c->es, hc_shm_slot(s, (int)c->op, g), n * c->es);
    }
    /* seq_cst (hence release): our reads of the slots happen before the
     * owners may overwrite them. */
    __atomic_store_n(&s->hdr->ranks[s->lrank].done, g + 1, __ATOMIC_SEQ_CST);
    hc_shm_wake(s->hdr);
    return HCOLL_SUCCESS;
}

static hcoll_status_t hc_shm_run(hc_shm_t *s, hc_shm_call_t *c)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    c->base = s->step;
    if (c->nsteps == 0)
        return HCOLL_SUCCESS;
    HC_CHECK(hc_shm_publish(s, c, 0), clean_steps);
    for (uint64_t k = 0; k < c->nsteps; k++) {
        if (k + 1 < c->nsteps)
            HC_CHECK(hc_shm_publish(s, c, k + 1), clean_steps);
        HC_CHECK(hc_shm_consume(s, c, k), clean_steps);
    }
    s->step += c->nsteps;
    return HCOLL_SUCCESS;
clean_steps:
    /* The step counters no longer agree between ranks: this context is
     * finished, and peers must not wait for us. */
    s->broken = st;
    hc_shm_poison(s, st, -1);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Operations                                                                 */
/* ------------------------------------------------------------------------ */

static hcoll_status_t hc_shm_enter(hc_shm_t *s, const char *what, const void *a, const void *b,
                                   size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                   void *stream)
{
    if (!s)
        return hc_err_set(NULL, HC_SHM, -1, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: NULL context", what);
    if (stream)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_UNSUPPORTED,
                          "intra-node shm %s: host buffers only (got a stream)", what);
    if (!hc_reduce_valid(dtype, op))
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: invalid dtype %d or op %d", what, (int)dtype,
                          (int)op);
    if (count > 0 && (!a || !b))
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: NULL buffer for %zu elements", what, count);
    if (count > SIZE_MAX / 8)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: count %zu too large", what, count);
    if (s->broken) {
        return hc_err_set(s->eb, HC_SHM, s->rank, s->broken,
                          "intra-node shm %s: an earlier call failed (%s); the context is "
                          "unusable", what, hcoll_status_name(s->broken));
    }
    hcoll_status_t st = hc_shm_check_health(s, what);
    if (st != HCOLL_SUCCESS)
        s->broken = st;
    return st;
}

hcoll_status_t hc_shm_reduce_scatter(hc_intra_t *ctx, const void *sendbuf,
                                            void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                            hcoll_op_t op, void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st =
        hc_shm_enter(s, "reduce_scatter", sendbuf, recvbuf, count, dtype, op, stream);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    const size_t es = hcoll_dtype_size(dtype);
    if (s->L == 1) {
        if (sendbuf != recvbuf)
            memcpy(recvbuf, sendbuf, count * es);
        return HCOLL_SUCCESS;
    }
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_RS, .src = sendbuf, .dst = recvbuf, .count = count, .es = es,
        .dtype = dtype, .op = op, .inplace = sendbuf == recvbuf,
    };
    /* Sub-pieces start on cache lines; create made slot_bytes >= 64 L. */
    c.per = (s->slot_bytes / (size_t)s->L / HC_SHM_LINE * HC_SHM_LINE) / es;
    size_t off, maxlen;
    hc_intra_shard(count, s->L, 0, &off, &maxlen);
    c.nsteps = (maxlen + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

/* reduce_scatter of blocks[0..count/blen-1] laid end to end: the same
 * steps, with every read of the source (the slot copies, the owner's own
 * term) split at the blocks' ends. */
hcoll_status_t hc_shm_reduce_scatter_blocks(hc_intra_t *ctx, const void *const *blocks,
                                           size_t blen, void *recvbuf, size_t count,
                                           hcoll_dtype_t dtype, hcoll_op_t op, void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st =
        hc_shm_enter(s, "reduce_scatter", blocks, recvbuf, count, dtype, op, stream);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    if (blen == 0 || count % blen != 0) {
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm reduce_scatter: %zu elements are not whole blocks "
                          "of %zu", count, blen);
    }
    const size_t es = hcoll_dtype_size(dtype);
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_RS, .dst = recvbuf, .count = count, .es = es, .dtype = dtype,
        .op = op, .blocks = (unsigned char *const *)blocks, .blen = blen,
    };
    if (s->L == 1) {
        hc_shm_src_copy(&c, recvbuf, 0, count);
        return HCOLL_SUCCESS;
    }
    c.per = (s->slot_bytes / (size_t)s->L / HC_SHM_LINE * HC_SHM_LINE) / es;
    size_t off, maxlen;
    hc_intra_shard(count, s->L, 0, &off, &maxlen);
    c.nsteps = (maxlen + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

hcoll_status_t hc_shm_all_gather(hc_intra_t *ctx, void *recvbuf, size_t count,
                                        hcoll_dtype_t dtype, void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st =
        hc_shm_enter(s, "all_gather", recvbuf, recvbuf, count, dtype, HCOLL_SUM, stream);
    if (st != HCOLL_SUCCESS || count == 0 || s->L == 1)
        return st;
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_AG, .dst = recvbuf, .count = count,
        .es = hcoll_dtype_size(dtype), .dtype = dtype, .op = HCOLL_SUM,
    };
    c.per = s->slot_bytes / c.es;
    size_t off, maxlen;
    hc_intra_shard(count, s->L, 0, &off, &maxlen);
    c.nsteps = (maxlen + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

/* all_gather into blocks: the same steps, our own shard read from src
 * and copied to the blocks as it is published, the others' from the slots
 * straight to the blocks. */
hcoll_status_t hc_shm_all_gather_blocks(hc_intra_t *ctx, const void *src, void *const *blocks,
                                        size_t blen, size_t count, hcoll_dtype_t dtype,
                                        void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st =
        hc_shm_enter(s, "all_gather", src, blocks, count, dtype, HCOLL_SUM, stream);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    if (blen == 0 || count % blen != 0)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm all_gather: %zu elements are not whole blocks of %zu",
                          count, blen);
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_AG, .src = src, .count = count, .es = hcoll_dtype_size(dtype),
        .dtype = dtype, .op = HCOLL_SUM, .blocks = (unsigned char *const *)blocks,
        .blen = blen,
    };
    size_t off, maxlen;
    if (s->L == 1) {
        hc_shm_dst_copy(&c, 0, c.src, count);
        return HCOLL_SUCCESS;
    }
    c.per = s->slot_bytes / c.es;
    hc_intra_shard(count, s->L, 0, &off, &maxlen);
    c.nsteps = (maxlen + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

/* What scatter and bcast share before their steps: enter, check the root,
 * and on a node of one rank just copy. *done is set when nothing is left
 * to run (an error, count 0 or L == 1). */
static hcoll_status_t root_prologue(hc_shm_t *s, const char *what, const void *sendbuf,
                                    void *recvbuf, size_t count, hcoll_dtype_t dtype, int root,
                                    void *stream, int *done)
{
    *done = 1;
    hcoll_status_t st = hc_shm_enter(s, what, recvbuf, recvbuf, count, dtype, HCOLL_SUM, stream);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    if (root < 0 || root >= s->L || (s->lrank == root && !sendbuf))
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: root %d of %d local ranks%s", what, root, s->L,
                          s->lrank == root && !sendbuf ? " has a NULL sendbuf" : "");
    if (s->L == 1) {
        if (sendbuf != recvbuf)
            memcpy(recvbuf, sendbuf, count * hcoll_dtype_size(dtype));
        return HCOLL_SUCCESS;
    }
    *done = 0;
    return HCOLL_SUCCESS;
}

/* Scatter: the root's shards through its slots, RS's layout with one
 * writer; the op field of the steps' descriptors names the root, so local
 * ranks that disagree on it fail with HCOLL_ERR_MISMATCH. */
hcoll_status_t hc_shm_scatter(hc_intra_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                              hcoll_dtype_t dtype, int root, void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    int done;
    hcoll_status_t st = root_prologue(s, "scatter", sendbuf, recvbuf, count, dtype, root, stream,
                                      &done);
    if (done)
        return st;
    const size_t es = hcoll_dtype_size(dtype);
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_SC, .src = sendbuf, .dst = recvbuf, .count = count, .es = es,
        .dtype = dtype, .op = (hcoll_op_t)root,
    };
    c.per = (s->slot_bytes / (size_t)s->L / HC_SHM_LINE * HC_SHM_LINE) / es;
    size_t off, maxlen;
    hc_intra_shard(count, s->L, 0, &off, &maxlen);
    c.nsteps = (maxlen + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

/* The fused step: one synchronisation per slot-full instead of two, each
 * rank reading all L slots. The executor calls it for small vectors and
 * runs reduce_scatter + all_gather itself for large ones, where reading L
 * times the data would cost more than the second synchronisation. */
hcoll_status_t hc_shm_allreduce(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                       size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                       void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st = hc_shm_enter(s, "allreduce", sendbuf, recvbuf, count, dtype, op, stream);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    const size_t es = hcoll_dtype_size(dtype);
    if (s->L == 1) {
        if (sendbuf != recvbuf)
            memcpy(recvbuf, sendbuf, count * es);
        return HCOLL_SUCCESS;
    }
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_AR, .src = sendbuf, .dst = recvbuf, .count = count, .es = es,
        .dtype = dtype, .op = op, .inplace = sendbuf == recvbuf,
    };
    c.per = s->slot_bytes / es;
    c.nsteps = (count + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

/* The agreement and a small all-reduce in one step (intra.h, agree): the
 * descriptors name the kind and the number of words only, so local ranks
 * that passed different arguments run the same step and learn it from the
 * words; the data goes along when it fits the slot with the header. */
hcoll_status_t hc_shm_agree(hc_intra_t *ctx, int64_t *words, int nwords, const void *sendbuf,
                            void *recvbuf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                            int *data_ok)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    *data_ok = 0;
    hcoll_status_t st = hc_shm_enter(s, "agreement", words, count ? recvbuf : words, count,
                                     dtype, op, NULL);
    if (st != HCOLL_SUCCESS)
        return st;
    const size_t es = hcoll_dtype_size(dtype);
    if (nwords < 1 || hc_shm_agree_hdr(nwords) + count * es > s->slot_bytes)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm agreement: %d words and %zu bytes do not fit a slot "
                          "of %zu", nwords, count * es, s->slot_bytes);
    if (s->L == 1) {
        if (count && sendbuf != recvbuf)
            memcpy(recvbuf, sendbuf, count * es);
        *data_ok = 1;
        return HCOLL_SUCCESS;
    }
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_AGREE, .src = sendbuf, .dst = recvbuf, .count = (size_t)nwords,
        .es = es, .dtype = dtype, .op = op, .per = 1, .nsteps = 1, .words = words,
        .dcount = count,
    };
    st = hc_shm_run(s, &c);
    *data_ok = c.data_ok;
    return st;
}

/* Broadcast: the root's whole vector through its slots, a slot-full per
 * step, every other rank copying it out (one writer, as the scatter, and
 * one synchronisation per step); the descriptors' op names the root. */
hcoll_status_t hc_shm_bcast(hc_intra_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                            hcoll_dtype_t dtype, int root, void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    int done;
    hcoll_status_t st = root_prologue(s, "bcast", sendbuf, recvbuf, count, dtype, root, stream,
                                      &done);
    if (done)
        return st;
    const size_t es = hcoll_dtype_size(dtype);
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_BC, .src = sendbuf, .dst = recvbuf, .count = count, .es = es,
        .dtype = dtype, .op = (hcoll_op_t)root,
    };
    c.per = s->slot_bytes / es;
    c.nsteps = (count + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

hcoll_status_t hc_shm_barrier(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    static const char one;
    hcoll_status_t st = hc_shm_enter(s, "barrier", &one, &one, 0, HCOLL_UINT8, HCOLL_SUM, NULL);
    if (st != HCOLL_SUCCESS || s->L == 1)
        return st;
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_BARRIER, .es = 1, .per = 1, .dtype = HCOLL_UINT8,
        .op = HCOLL_SUM, .nsteps = 1,
    };
    return hc_shm_run(s, &c);
}

void hc_shm_abort(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    if (!s)
        return;
    __atomic_store_n(&s->aborted, 1, __ATOMIC_SEQ_CST);
    if (s->hdr) {
        __atomic_store_n(&s->hdr->ranks[s->lrank].state, HC_SHM_ST_ABORTED, __ATOMIC_SEQ_CST);
        /* Also wakes our own blocked thread: it sleeps on the same word. */
        hc_shm_poison(s, HCOLL_ERR_ABORTED, s->lrank);
    }
}
