/*
 * The communicator's liveness thread: shows this rank is alive to every
 * peer that may wait for it, whether or not a call runs, and watches the
 * ring neighbours' heartbeats.
 *
 *   every beat interval (HCOLL_LIVENESS_MS / 8, 5 ms .. 1 s):
 *     hc_intra_beat      a counter in the node's segment (local peers)
 *     hc_ring_live_beat  a byte on the liveness link to each neighbour
 *   in between:
 *     hc_ring_live_poll  the neighbours' beats, their goodbyes, their EOF
 *
 * The waits (shm, ring) read what this thread keeps up to date; none of
 * them depends on this thread for progress, only for verdicts on life.
 *
 * Spreading a failure: a ring neighbour whose link closes without a
 * goodbye has exited or failed, so the communicator is lost; the thread
 * then poisons the node's segment (hc_intra_poison), so that a local rank
 * waiting there for a rank that is minutes late hears of it now. The
 * other way round, the ring driver asks the segment's health on every
 * slice (ringdrv.h), so a ring waiting for a late neighbour hears of a
 * local failure (an abort) at once.
 */
#ifndef HC_CORE_LIVE_H
#define HC_CORE_LIVE_H

#include "base/err.h"
#include "hcoll.h"

struct hc_intra;
struct hc_ring;
typedef struct hc_live hc_live_t;

/* Start the thread over intra and ring (either may be NULL). Nothing to
 * watch: *out = NULL and success. HCOLL_ERR_SYSTEM (recorded) when no
 * thread can start. */
hcoll_status_t hc_live_start(struct hc_intra *intra, struct hc_ring *ring, int liveness_ms,
                             hc_errbuf_t *eb, int rank, hc_live_t **out);

/* Stop and join (within one poll slice); before intra and ring go. NULL:
 * no-op. */
void hc_live_stop(hc_live_t *l);

#endif
