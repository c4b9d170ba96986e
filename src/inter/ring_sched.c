/*
 * The ring's schedule: the one decision about an operation's shape that
 * every rank makes alike from count, dtype, N and the chunk size (see
 * ring_sched.h for the geometry).
 */
#include "inter/ring_sched.h"

void hc_ring_sched_plan(hc_ring_sched_t *g, int n, size_t count, size_t esize,
                        size_t chunk_bytes, size_t gather_max, int dev)
{
    g->n = n;
    g->count = count;
    g->q = 1;
    g->base = count / (size_t)n;
    g->rem = count % (size_t)n;
    g->ce = chunk_bytes / esize;
    size_t maxblk = g->base + (g->rem > 0);
    g->C = (maxblk + g->ce - 1) / g->ce;
    g->nmsg = (size_t)(n - 1) * g->C;
    /* A next operation's N-1 messages must fit the early list. */
    g->gather = !dev && count * esize <= gather_max && n - 1 <= HC_RING_EARLY_MAX &&
                count * esize * (size_t)(n - 2) <= (size_t)n * HC_RING_GATHER_HOP_BYTES;
    if (g->gather) {
        g->C = 1;
        g->nmsg = (size_t)(n - 1);
    }
}

void hc_ring_sched_align(hc_ring_sched_t *g, size_t esize)
{
    if (g->gather || esize == 0)
        return;
    const size_t q = HC_RING_ALIGN % esize == 0 ? HC_RING_ALIGN / esize : 16;
    const size_t units = (g->count + q - 1) / q;
    g->q = q;
    g->base = units / (size_t)g->n;
    g->rem = units % (size_t)g->n;
    size_t maxblk = hc_ring_blk_cnt(g, 0); /* the first blocks are the longest */
    g->C = (maxblk + g->ce - 1) / g->ce;
    g->nmsg = (size_t)(g->n - 1) * g->C;
}
