/*
 * The one shape in which set-up code exchanges small blobs among a group of
 * ranks: every member passes len bytes in `mine`, and all_out receives
 * nmembers * len bytes, member i's at offset i * len. Blocking and
 * collective over the group, with the communicator's deadline.
 *
 * The bootstrap provides it over all ranks (hc_boot_allgather); the
 * executor narrows it to a node or a rail (core/coll.c); tests provide it
 * over shared memory. Backends take it as a callback so that they never
 * depend on the bootstrap or the communicator.
 */
#ifndef HC_BASE_EXCHANGE_H
#define HC_BASE_EXCHANGE_H

#include <stddef.h>

#include "hcoll.h"

typedef hcoll_status_t (*hc_allgather_fn)(void *ctx, const void *mine, void *all_out,
                                          size_t len);

#endif
