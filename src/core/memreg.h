/*
 * Registered buffers (hcoll_mem_register): a communicator's list of the
 * ranges its user registered, each pinned with the ring's transport
 * (inter/ring.h, hc_ring_mem_pin) so that operations inside it register
 * nothing. The caller (coll.c) holds the executor role around every call,
 * which also guards the list.
 */
#ifndef HC_CORE_MEMREG_H
#define HC_CORE_MEMREG_H

#include <stddef.h>

#include "base/err.h"
#include "hcoll.h"
#include "inter/ring.h"

struct hcoll_mem;

/* Check [ptr, ptr+bytes) (not NULL, not empty, no overlap with a range in
 * *list), pin it with ring (may be NULL: nothing to pin) and add it. */
hcoll_status_t hc_memreg_add(struct hcoll_mem **list, hc_ring_t *ring, hc_errbuf_t *eb, int rank,
                             void *ptr, size_t bytes, struct hcoll_mem **handle_out);

/* Unpin and remove h; HCOLL_ERR_INVALID_ARG if it is not in *list (never
 * dereferenced before it is found there). */
hcoll_status_t hc_memreg_remove(struct hcoll_mem **list, hc_ring_t *ring, hc_errbuf_t *eb,
                                int rank, struct hcoll_mem *h);

/* Unpin and free every range left (communicator teardown). */
void hc_memreg_clear(struct hcoll_mem **list, hc_ring_t *ring);

#endif
