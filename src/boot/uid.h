/*
 * The unique id (hcoll_unique_id_t, 128 opaque bytes), big-endian:
 *
 *   0  magic "HCID"   4  version   5  family (4 or 6)   6  port
 *   8  address (16 bytes; IPv4 in the first 4)          24 IPv6 scope id
 *   28 secret (32 bytes from getrandom)                 60 check (4 bytes
 *   of SHA-256 over bytes 0..59, to catch an id that was not copied whole)
 *   64..127 zero
 *
 * Listener hand-over: hcoll_get_unique_id opens the root's listening socket
 * at once (so that ranks that start early queue in its backlog instead of
 * being refused, and so that the port cannot be taken by someone else
 * between the two calls), and parks it in a small per-process table keyed
 * by the id's secret. Rank 0's hcoll_comm_init takes it out. The table is
 * the one piece of process-wide mutable state in the bootstrap; it is
 * guarded by a mutex, and an entry is reachable only with its 256-bit
 * secret, so no communicator can see another's. Entries never taken are
 * closed when the table is full (oldest first) or at process exit. When
 * rank 0 runs in a process that did not make the id, it finds no entry and
 * binds the id's address and port itself (SO_REUSEADDR).
 */
#ifndef HC_BOOT_UID_H
#define HC_BOOT_UID_H

#include "boot/boot.h"
#include "hcoll.h"
#include "sys/ifaces.h"

#define HC_UID_SECRET_BYTES 32
#define HC_UID_PARKED_MAX 16

typedef struct hc_uid {
    hc_sockaddr_t root;
    unsigned char secret[HC_UID_SECRET_BYTES];
} hc_uid_t;

void hc_uid_encode(const hc_uid_t *u, hcoll_unique_id_t *id_out);
/* HCOLL_SUCCESS, or HCOLL_ERR_INVALID_ARG recorded in eb (NULL: the
 * thread's buffer) as the init step's when id is not a valid unique id. */
hcoll_status_t hc_uid_decode(const hcoll_unique_id_t *id, hc_errbuf_t *eb, int rank,
                             hc_uid_t *u_out);

/* Park a listening fd under secret (the table takes ownership). */
void hc_uid_park(const unsigned char secret[HC_UID_SECRET_BYTES], int fd);
/* Take the fd parked under secret out of the table, or -1. */
int hc_uid_take(const unsigned char secret[HC_UID_SECRET_BYTES]);

#endif
