/*
 * The ring driver (ringdrv.h): start, then progress in slices of
 * HC_RINGDRV_POLL_MS, looking at the abort flag between slices.
 */
#include "core/ringdrv.h"

#include "base/log.h"
#include "inter/dissem.h"
#include "inter/ring.h"
#include "intra/intra.h"

hcoll_status_t hc_ringdrv_run(struct hc_ring *ring, const hc_ringdrv_op_t *op,
                              const hc_ringdrv_env_t *env)
{
    return hc_ringdrv_run_watched(ring, op, env, NULL);
}

hcoll_status_t hc_ringdrv_run_watched(struct hc_ring *ring, const hc_ringdrv_op_t *op,
                                      const hc_ringdrv_env_t *env, atomic_size_t *landed)
{
    int done = 0;
    hcoll_status_t st;
    if (op->bcast)
        st = op->device ? hc_ring_bcast_start_device(ring, op->dst, op->count, op->dtype,
                                                     op->root, landed)
                        : hc_ring_bcast_start_watched(ring, op->dst, op->count, op->dtype,
                                                      op->root, landed);
    else if (op->phase == HC_RING_PHASE_RS)
        st = op->device ? hc_ring_rs_start_device(ring, op->src, op->dst, op->count, op->dtype,
                                                  op->op, op->avg_div)
                        : hc_ring_rs_start(ring, op->src, op->dst, op->count, op->dtype, op->op,
                                           op->avg_div);
    else if (op->phase == HC_RING_PHASE_AG)
        st = op->device ? hc_ring_ag_start_device(ring, op->dst, op->count, op->dtype)
                        : hc_ring_ag_start(ring, op->dst, op->count, op->dtype);
    else
        st = op->device ? hc_ring_start_device(ring, op->src, op->dst, op->count, op->dtype,
                                               op->op, op->avg_div)
                        : hc_ring_start(ring, op->src, op->dst, op->count, op->dtype, op->op,
                                        op->avg_div);
    for (int slice = 0; st == HCOLL_SUCCESS && !done; slice++) {
        if (atomic_load(env->aborted))
            return hc_err_set(env->err, HC_COLL, env->rank, HCOLL_ERR_ABORTED,
                              "communicator aborted during %s", env->stage);
        if ((st = hc_intra_health(env->intra, "(seen from the ring)")) != HCOLL_SUCCESS)
            return st;
        /* Only once a slice went by without the end: a call that is not
         * held up pays nothing for it. */
        if (slice > 0 &&
            (st = hc_dissem_absorb(env->dissem, op->seq, env->stage)) != HCOLL_SUCCESS)
            return st;
        st = hc_ring_progress(ring, HC_RINGDRV_POLL_MS, &done);
    }
    /* A failure that an abort of this rank set off (its node's segment
     * poisoned, a neighbour resetting in turn) is the abort. */
    if (st != HCOLL_SUCCESS && atomic_load(env->aborted))
        return hc_err_set(env->err, HC_COLL, env->rank, HCOLL_ERR_ABORTED,
                          "communicator aborted during %s", env->stage);
    return st;
}
