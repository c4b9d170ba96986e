/*
 * The inside of a bootstrap (struct hc_boot) and the connection I/O that
 * every part of it shares: waits against a deadline and the abort
 * eventfd, full sends and receives on non-blocking sockets, framed
 * messages (wire.h), the wording of transfer failures, and the "break"
 * that tells every rank when a set-up step failed half-way.
 *
 * Internal to src/boot: boot.c, root.c, client.c and coll.c use it.
 */
#ifndef HC_BOOT_IO_H
#define HC_BOOT_IO_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "boot/boot.h"
#include "boot/wire.h"

#define HC_BIO_CONNECT_RETRY_MS 50

struct hc_boot {
    int rank, nranks;
    int64_t timeout_ms;
    int64_t init_timeout_ms; /* > 0 */
    int64_t liveness_ms;     /* 0: not checked */
    hc_errbuf_t *eb;
    /* Root: conn[r] for r >= 1. Other ranks: conn[0] is the root. */
    int *conn;
    int abort_fd;
    atomic_int aborted;
    atomic_int broken; /* hcoll_status_t that broke it */
    uint32_t seq;
    hc_sockaddr_t root;
    pthread_mutex_t call_lock;
    int saved_errno;
    /* Keys: prekey is the one given (hc_boot_args_t.key); key is the
     * session key, prekey itself when kdf_iters is 0, else stretched with
     * the root's salt (the root draws salt; a client caches the salt it
     * derived key for, so that a retry does not pay again). */
    unsigned char prekey[HC_BOOT_KEY_BYTES];
    unsigned char key[HC_BOOT_KEY_BYTES];
    uint32_t kdf_iters;
    int have_key;
    unsigned char salt[HC_BWIRE_SALT_BYTES];
};

static inline int hc_bio_is_aborted(hc_boot_t *b)
{
    return atomic_load(&b->aborted);
}

void hc_bio_nonblock(int fd);
void hc_bio_nodelay(int fd);
/* The peer's address as text into buf ("(unknown peer)" when unknown). */
const char *hc_bio_peer_str(int fd, char *buf, size_t len);

/* Records and returns HCOLL_ERR_ABORTED for the step `what`. */
hcoll_status_t hc_bio_aborted(hc_boot_t *b, const char *what);

/*
 * Wait until fd is ready for events, the deadline passes or the boot is
 * aborted. Returns SUCCESS, TIMEOUT or ABORTED without recording an error:
 * the caller knows what it was waiting for.
 */
hcoll_status_t hc_bio_wait(hc_boot_t *b, int fd, short events, double deadline);

/* Full send/receive on a non-blocking socket. EOF, reset and broken pipe
 * are HCOLL_ERR_PEER_FAILED; nothing is recorded: the caller words the
 * error (hc_bio_err). */
hcoll_status_t hc_bio_send(hc_boot_t *b, int fd, const void *buf, size_t len, double deadline);
hcoll_status_t hc_bio_recv(hc_boot_t *b, int fd, void *buf, size_t len, double deadline);
/* Header then body; unrecorded like hc_bio_send. */
hcoll_status_t hc_bio_send_msg(hc_boot_t *b, int fd, unsigned type, uint32_t arg,
                               const void *body, size_t len, double deadline);

/* Words a failed transfer with peer `who` during `what`, and records it. */
hcoll_status_t hc_bio_err(hc_boot_t *b, hcoll_status_t st, int who, const char *what,
                          int64_t waited_ms);

/*
 * Receive one message of the given type, arg and exact length from rank
 * who, recording any failure. An ERROR message instead becomes this call's
 * error, carrying the sender's status and text.
 */
/* Heartbeats while the rendezvous waits (liveness_ms > 0): the interval
 * (liveness / 8, 5 ms .. 1 s); send one without blocking; take one that
 * is next on fd: 1 taken, 0 not all there yet, -1 something else is next
 * (a message, EOF, part of a header and then EOF, an error: read it the
 * ordinary way). */
int hc_bio_beat_ms(const hc_boot_t *b);
void hc_bio_beat_nb(int fd);
int hc_bio_take_beat(int fd);

hcoll_status_t hc_bio_recv_msg(hc_boot_t *b, int fd, int who, unsigned type, uint32_t arg,
                               void *body, size_t len, double deadline, const char *what);

/* Best-effort ERROR to a peer that we are about to leave: never blocks. */
void hc_bio_send_error_nb(int fd, hcoll_status_t st, const char *text);

/* The message of the error recorded last for this boot. */
const char *hc_bio_errtext(hc_boot_t *b);

/*
 * A collective failed half-way: nothing can be resumed consistently, so
 * the root tells every rank why and every connection is shut (not closed,
 * so that another thread's poll on it stays valid until destroy). Only the
 * first status sticks.
 */
void hc_bio_break(hc_boot_t *b, hcoll_status_t st);

/* The ranks that are not present, as "3,5-7", into out. */
void hc_bio_format_ranks(const char *present, int n, char *out, size_t len);

#endif
