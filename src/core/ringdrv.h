/*
 * The ring driver: start one all-reduce on a ring and progress it until it
 * is done, fails, or the communicator is aborted. The one loop that the
 * host executor's ring thread, its caller-thread latency path and the
 * device executor's host stage all run.
 */
#ifndef HC_CORE_RINGDRV_H
#define HC_CORE_RINGDRV_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "hcoll.h"

struct hc_ring;

/* How long one progress call sleeps in the transport before the driver
 * looks at the abort flag again. */
#define HC_RINGDRV_POLL_MS 20

/* One ring all-reduce: src into dst (equal: in place), the average divided
 * by avg_div; device: both are device memory (hc_ring_start_device).
 * bcast: instead a broadcast of dst from ring position root
 * (hc_ring_bcast_start; src, op and avg_div unused). phase (enum
 * hc_ring_phase, inter/ring.h): HC_RING_PHASE_RS a reduce-scatter alone
 * (hc_ring_rs_start: src into dst, block p to position p), HC_RING_PHASE_AG
 * an all-gather alone in dst (hc_ring_ag_start; src, op, avg_div unused);
 * 0 the all-reduce. */
typedef struct hc_ringdrv_op {
    const void *src;
    void *dst;
    size_t count;
    hcoll_dtype_t dtype;
    hcoll_op_t op;
    int avg_div;
    int device;
    int bcast;
    int root;
    int phase;
    uint32_t seq; /* the executor's operation number (hc_dissem_absorb) */
} hc_ringdrv_op_t;

/* Where the driver reports an abort: the communicator's abort flag, its
 * error buffer and rank, and the stage named in the message
 * ("communicator aborted during <stage>"). */
typedef struct hc_ringdrv_env {
    atomic_int *aborted;
    hc_errbuf_t *err;
    int rank;
    const char *stage;
    /* The node's intra-node backend, or NULL: a local rank that failed or
     * aborted dooms the call, so the ring stops waiting for peers that
     * may be late by minutes. */
    struct hc_intra *intra;
    /* The communicator's barrier, or NULL: between slices the driver takes
     * the barrier signals that landed (hc_dissem_absorb), so a rank that
     * entered a barrier where this one runs op->seq fails both with
     * HCOLL_ERR_MISMATCH instead of leaving them waiting for each other. */
    struct hc_dissem *dissem;
} hc_ringdrv_env_t;

/* Run op on ring to the end. Blocks; HCOLL_ERR_ABORTED (recorded here)
 * once *env->aborted is set, the intra backend's failure once a local rank
 * failed, else the ring's own status. */
hcoll_status_t hc_ringdrv_run(struct hc_ring *ring, const hc_ringdrv_op_t *op,
                              const hc_ringdrv_env_t *env);

/* hc_ringdrv_run where a broadcast (op->bcast) counts in *landed the bytes
 * of op->dst in place on this rank (hc_ring_bcast_start_watched), for
 * another thread to follow; NULL: not counted, as hc_ringdrv_run. */
hcoll_status_t hc_ringdrv_run_watched(struct hc_ring *ring, const hc_ringdrv_op_t *op,
                                      const hc_ringdrv_env_t *env, atomic_size_t *landed);

#endif
