/*
 * The liveness thread (live.h): beats on a fixed interval, polls the ring's
 * liveness links in short slices so that a stop request and a neighbour's
 * EOF are both seen within LIVE_SLICE_MS.
 */
#include "core/live.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "inter/ring.h"
#include "intra/intra.h"

#define LIVE_SLICE_MS 20

struct hc_live {
    struct hc_intra *intra;
    struct hc_ring *ring;
    int interval_ms;
    int rank;
    int lost;       /* a ring neighbour died: the node was told */
    atomic_int stop;
    pthread_t thread;
};

static void *live_main(void *arg)
{
    hc_live_t *l = arg;
    double next_beat = 0;
    while (!atomic_load(&l->stop)) {
        double now = hc_now_ms();
        if (now >= next_beat) {
            hc_intra_beat(l->intra);
            hc_ring_live_beat(l->ring);
            next_beat = now + l->interval_ms;
        }
        if (l->ring)
            hc_ring_live_poll(l->ring, LIVE_SLICE_MS);
        else
            usleep(LIVE_SLICE_MS * 1000);
        char why[200];
        if (!l->lost && hc_ring_live_lost(l->ring, why, sizeof why)) {
            /* The communicator is lost: tell the local ranks now, even
             * those waiting in the node's segment for a rank that is late
             * and would otherwise hear of it only when it arrives. */
            l->lost = 1;
            HC_INFO(HC_COLL, l->rank, "liveness: %s; failing this node's calls", why);
            hc_intra_poison(l->intra);
        }
    }
    return NULL;
}

hcoll_status_t hc_live_start(struct hc_intra *intra, struct hc_ring *ring, int liveness_ms,
                             hc_errbuf_t *eb, int rank, hc_live_t **out)
{
    *out = NULL;
    if (!intra && !ring)
        return HCOLL_SUCCESS;
    hc_live_t *l = calloc(1, sizeof *l);
    if (!l)
        return hc_err_set(eb, HC_COLL, rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the liveness thread");
    l->intra = intra;
    l->ring = ring;
    l->rank = rank;
    /* Eight beats per liveness period: a few lost to a busy scheduler
     * still leave the peers far from their verdict. */
    l->interval_ms = liveness_ms / 8;
    if (l->interval_ms < 5)
        l->interval_ms = 5;
    if (l->interval_ms > 1000)
        l->interval_ms = 1000;
    atomic_init(&l->stop, 0);
    int rc = pthread_create(&l->thread, NULL, live_main, l);
    if (rc != 0) {
        free(l);
        return hc_err_set(eb, HC_COLL, rank, HCOLL_ERR_SYSTEM,
                          "cannot start the liveness thread: %s", strerror(rc));
    }
    *out = l;
    return HCOLL_SUCCESS;
}

void hc_live_stop(hc_live_t *l)
{
    if (!l)
        return;
    atomic_store(&l->stop, 1);
    pthread_join(l->thread, NULL);
    free(l);
}
