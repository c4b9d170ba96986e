/*
 * A void on one rail, three stages (several ranks per node): the node's
 * other ranks hear of it through the node's steps, and every rank of every
 * node fails that call alike (design: "Registration failures").
 *
 *   rail i (every node)    its ring fails the piece (ring_void.c), and
 *                          every rank of it marks its node steps from
 *                          then on with a note: void | status | rank f
 *   the other rails        their rings went through; they read the note
 *                          in the node step that follows (the all-gather
 *                          of that piece waits for rail i's rank, whose
 *                          step carries it; where no node step follows the
 *                          last ring job, one barrier, only where the ring
 *                          can void: verbs, HCOLL_CHECK_ARGS=0)
 *   every rank             goes on to the call's end in step (later
 *                          pieces run as usual), then fails it: rail i
 *                          with the ring's message, the others naming f;
 *                          hc_coll_void_agreed then holds (not sticky)
 *
 * The note rides in the node steps' descriptors (intra.h note_set): no
 * extra synchronisation on the all-reduce's path.
 *
 * Device calls (three stages, coll_dev_host.c): the node steps are NCCL's,
 * on the caller's stream, enqueued at call time; they carry no word. The
 * worker keeps the void the same way (its gates open as usual, so every
 * NCCL step runs on every local rank and the streams stay in step), and at
 * the call's end one node barrier on the shared-memory backend carries
 * the note (hc_coll_rail_end_dev): every local rank's worker runs the
 * same calls in the same order, so the barriers pair up.
 */
#include "core/coll_priv.h"

#include <stdatomic.h>
#include <stdio.h>

#include "core/comm.h"
#include "base/err.h"
#include "base/log.h"

/* A note: 1 bit set, the status in 7 bits, the refusing rank in 24. */
#define RAIL_NOTE(st, rank) \
    (0x80000000u | ((uint32_t)(st)&0x7f) << 24 | ((uint32_t)(rank)&0xffffff))
#define RAIL_NOTE_ST(n) ((hcoll_status_t)(((n) >> 24) & 0x7f))
#define RAIL_NOTE_RANK(n) ((int)((n)&0xffffff))
#define RAIL_NOTE_NONE 0xffffff

/* This rail's ring voided an operation: keep going, and say so. */
static hcoll_status_t rail_voided(hc_coll_t *co, hcoll_status_t st, hc_coll_void_t *v)
{
    if (v->st == HCOLL_SUCCESS) {
        const int f = hc_ring_void_rank(co->ring);
        v->st = st;
        hc_intra_note_set(co->intra, RAIL_NOTE(st, f < 0 ? RAIL_NOTE_NONE : f));
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_coll_rail_wait(hc_coll_t *co, uint64_t id, double *inter_us, hc_coll_void_t *v)
{
    hcoll_status_t st = hc_ringthr_wait(co->ringthr, id, inter_us);
    if (st == HCOLL_SUCCESS || co->plan != HC_PLAN_3STAGE || !hc_ringthr_voided(co->ringthr, id))
        return st;
    return rail_voided(co, st, v);
}

hcoll_status_t hc_coll_rail_ran(hc_coll_t *co, hcoll_status_t st, uint64_t voided_before,
                                hc_coll_void_t *v)
{
    if (st == HCOLL_SUCCESS || co->plan != HC_PLAN_3STAGE ||
        hc_ring_voided(co->ring) == voided_before || hc_ring_error(co->ring) != HCOLL_SUCCESS)
        return st;
    return rail_voided(co, st, v);
}

/* The call's end, after the note went round (or failed to): st where the
 * call failed; else this rail's void, or the note another rail left. */
static hcoll_status_t rail_close(hc_coll_t *co, hc_coll_void_t *v, hcoll_status_t st)
{
    struct hcoll_comm *c = co->comm;
    const uint32_t note = hc_intra_note_take(co->intra);
    hc_intra_note_set(co->intra, 0);
    if (st != HCOLL_SUCCESS)
        return st;
    if (v->st != HCOLL_SUCCESS) {
        co->rail_void_op = co->opseq;
        return v->st; /* the ring's message, recorded */
    }
    if (!note)
        return HCOLL_SUCCESS;
    co->rail_void_op = co->opseq;
    hcoll_status_t vst = RAIL_NOTE_ST(note);
    if (vst == HCOLL_SUCCESS)
        vst = HCOLL_ERR_RDMA;
    char who[32];
    if (RAIL_NOTE_RANK(note) == RAIL_NOTE_NONE)
        snprintf(who, sizeof who, "a rank");
    else
        snprintf(who, sizeof who, "rank %d", RAIL_NOTE_RANK(note));
    return hc_err_set(&c->err, HC_COLL, c->rank, vst,
                      "%s could not take part in this call (the communicator's operation "
                      "%llu): registering its buffers failed there (%s; its own message says "
                      "why); its rail's ring voided its part and told this node; every rank "
                      "fails this call, its result is undefined, and the next call runs",
                      who, (unsigned long long)co->opseq, hcoll_status_name(vst));
}

hcoll_status_t hc_coll_rail_end(hc_coll_t *co, hc_coll_void_t *v, hcoll_status_t st,
                                int step_after)
{
    /* No node step followed the last ring job (a reduce-scatter's ends in
     * a local copy; a broadcast's last all-gather may come before its
     * chain's end): one more, only where the ring can void (verbs without
     * the agreement). */
    if (!step_after && st == HCOLL_SUCCESS && co->plan == HC_PLAN_3STAGE && !co->check_args &&
        hc_ring_registers(co->ring, 1, HCOLL_UINT8, -1))
        st = co->intra->ops->barrier(co->intra);
    return rail_close(co, v, st);
}

hcoll_status_t hc_coll_rail_end_dev(hc_coll_t *co, hc_coll_void_t *v, hcoll_status_t st)
{
    /* The agreement does not help here: a GPUDirect ring registers device
     * memory when it starts, whatever HCOLL_CHECK_ARGS says. Staged rings
     * (pinned at set-up) cannot void, but which rails went GPUDirect is
     * each rail's own (coll_dev.c, dev_enable_gdr), and the barrier must
     * be alike on every local rank: the node pays it on verbs either way.
     * An abort ends the communicator and the barrier with it. */
    if (co->plan == HC_PLAN_3STAGE && hc_ring_registers(co->ring, 1, HCOLL_UINT8, -1) &&
        !atomic_load(&co->comm->aborted)) {
        const hcoll_status_t b = co->intra->ops->barrier(co->intra);
        if (st == HCOLL_SUCCESS)
            st = b;
    }
    return rail_close(co, v, st);
}
