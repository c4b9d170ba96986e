/*
 * The two sides of the bootstrap's rendezvous (protocol in boot.h, the
 * root's state machine drawn in root.c). hc_boot_create (boot.c) calls
 * one of them once the hc_boot_t is set up; each records its failures in
 * b->eb.
 */
#ifndef HC_BOOT_RENDEZVOUS_H
#define HC_BOOT_RENDEZVOUS_H

#include <stddef.h>

#include "boot/boot.h"

/* Rank 0: serve the listener lfd (owned from here: closed in every case)
 * until every rank has joined; recs (nranks*rec_len) gets the table, this
 * rank's rec first. On failure every connected rank is told why. Keys:
 * b->prekey and b->kdf_iters in; b->key (the session key) out. */
hcoll_status_t hc_boot_root_rendezvous(hc_boot_t *b, int lfd, const void *rec, size_t rec_len,
                                       unsigned char *recs);

/* Any other rank: connect to b->root (retrying until the deadline),
 * authenticate, send rec and receive the table into recs. On success
 * b->conn[0] is the connection to the root and b->key the session key. */
hcoll_status_t hc_boot_client_rendezvous(hc_boot_t *b, const void *rec, size_t rec_len,
                                         unsigned char *recs);

#endif
