/*
 * The unique id (hcoll_unique_id_t, 128 opaque bytes), big-endian:
 *
 *   0  magic "HCID"   4  version   5  family (4 or 6)   6  port
 *   8  address (16 bytes; IPv4 in the first 4)          24 IPv6 scope id
 *   28 secret (32 bytes from getrandom)                 60 check (4 bytes
 *   of SHA-256 over bytes 0..59, to catch an id that was not copied whole)
 *   64..127 zero
 *
 * Port hand-over: hcoll_get_unique_id reserves the root's port at once
 * (so that it cannot be taken by someone else before rank 0 comes up) with
 * a socket that is bound but never listens, made with SO_REUSEPORT, and
 * parks it in a small per-process table keyed by the id's secret. Rank 0
 * then listens in one of two ways (hc_uid_listen):
 *   - in the process that made the id, it takes the parked socket out of
 *     the table and listens on it;
 *   - in any other process (the maker is a driver that stays alive, or has
 *     exited), it binds the id's address and port itself with SO_REUSEPORT
 *     (and SO_REUSEADDR) and listens. The kernel lets that bind share the
 *     port with the maker's parked socket because both sockets ask for
 *     SO_REUSEPORT, belong to the same user, and the parked one has no
 *     SO_REUSEADDR and does not listen; it refuses any socket that does
 *     not ask, or belongs to another user.
 * Only a listening socket receives connections, so every rank's connection
 * reaches rank 0 whether or not the maker still holds its socket. Ranks
 * that start before rank 0 listens are refused and retry (boot/client.c)
 * until their deadline.
 * The table is the one piece of process-wide mutable state in the
 * bootstrap; it is guarded by a mutex, and an entry is reachable only with
 * its 256-bit secret, so no communicator can see another's. Entries never
 * taken are closed when the table is full (oldest first) or at process
 * exit. Each entry records the process that parked it: a forked child
 * closes its copies at once (a pthread_atfork handler; hc_uid_take drops
 * them too, for a child made without the handlers), so it neither listens
 * on its parent's socket (a rank 0 forked from the id's maker binds its
 * own, as any other process does) nor keeps that socket open after the
 * parent has closed it.
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

/* Park a reserved socket under secret (the table takes ownership). */
void hc_uid_park(const unsigned char secret[HC_UID_SECRET_BYTES], int fd);
/* Take the fd parked under secret out of the table, or -1. */
int hc_uid_take(const unsigned char secret[HC_UID_SECRET_BYTES]);

/* The id maker's side: a socket bound to addr (port 0: an ephemeral port)
 * with SO_REUSEPORT, not listening, close-on-exec; *addr_out the bound
 * address. HCOLL_ERR_NETWORK recorded in eb (NULL: the thread's buffer)
 * on failure. Non-blocking, local. */
hcoll_status_t hc_uid_reserve(const hc_sockaddr_t *addr, hc_errbuf_t *eb, int *fd_out,
                              hc_sockaddr_t *addr_out);

/* Rank 0's side: a socket listening on u->root, the parked one when this
 * process made the id, else a new one that shares the port with the
 * maker's (see above). *fd_out is owned by the caller. HCOLL_ERR_NETWORK
 * recorded in eb (NULL: the thread's buffer) naming the address on
 * failure. Non-blocking, local. */
hcoll_status_t hc_uid_listen(const hc_uid_t *u, hc_errbuf_t *eb, int *fd_out);

#endif
