/*
 * The ring thread of the three-stage plan: a thread that runs the ring on
 * shard jobs the executor posts, so that ring(k) overlaps the intra-node
 * stages of pieces k-1 and k+1 (drawing in coll.c).
 *
 * Jobs complete in posting order; at most HC_RINGTHR_JOBS are in flight
 * (post blocks beyond). The first failure is sticky: later jobs fail at
 * once with it, and every wait returns it.
 */
#ifndef HC_CORE_RINGTHR_H
#define HC_CORE_RINGTHR_H

#include <stddef.h>
#include <stdint.h>

#include "core/ringdrv.h"
#include "hcoll.h"

struct hc_ring;
typedef struct hc_ringthr hc_ringthr_t;

/* Ring jobs in flight between executor and ring thread (a power of two). */
#define HC_RINGTHR_JOBS 8

/* Start the thread on ring; env (copied) says where aborts are reported.
 * HCOLL_ERR_SYSTEM (recorded in env->err) when no thread can start. */
hcoll_status_t hc_ringthr_start(struct hc_ring *ring, const hc_ringdrv_env_t *env,
                                hc_ringthr_t **out);

/* Queue job (in place on job->dst; copied); returns its id. */
uint64_t hc_ringthr_post(hc_ringthr_t *t, const hc_ringdrv_op_t *job);

/* hc_ringthr_post of a broadcast job whose chain counts the bytes of
 * job->dst in place in *landed (hc_ringdrv_run_watched), which the poster
 * may read while the job runs. */
uint64_t hc_ringthr_post_watched(hc_ringthr_t *t, const hc_ringdrv_op_t *job,
                                 atomic_size_t *landed);

/* Wait for job id; returns the sticky status and adds the job's ring time
 * to *inter_us. */
hcoll_status_t hc_ringthr_wait(hc_ringthr_t *t, uint64_t id, double *inter_us);

/* After hc_ringthr_wait(id) failed: whether job id was a void operation
 * (hc_ring_voided: every rank of this rail failed it alike, the ring
 * went on in step) rather than the ring's failure. Before the next post. */
int hc_ringthr_voided(hc_ringthr_t *t, uint64_t id);

/* Whether job id is done (waited for or not); never blocks. */
int hc_ringthr_test(hc_ringthr_t *t, uint64_t id);

/* Stop and join the thread, free t. Jobs must all have been waited for.
 * NULL is a no-op. */
void hc_ringthr_stop(hc_ringthr_t *t);

#endif
