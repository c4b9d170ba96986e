/*
 * Bootstrap: the authenticated TCP rendezvous that lets the ranks of a job
 * find each other, and small collectives over it for set-up (exchanging
 * data-plane endpoint addresses, agreeing, synchronising).
 *
 * Shape: a star through rank 0 (the root). Every other rank keeps one
 * connection to the root for the communicator's life.
 *
 *            rank 1 ─┐                        ┌─► rank 1
 *            rank 2 ─┼─ UP (len) ─► rank 0 ───┼─► rank 2   DOWN (nranks*len)
 *            rank 3 ─┘   gathers in rank order└─► rank 3
 *
 * Wire: every message is a 16-byte header {magic, version, type, length,
 * arg} (big-endian) then length bytes. The receiver always knows the exact
 * length it expects (or a small cap for error texts) and checks the header
 * before reading or allocating anything.
 *
 * Rendezvous (hc_boot_create):
 *   rank → root   HELLO      (empty: the client speaks first)
 *   root → rank   CHALLENGE  nonce_s (32 random bytes), salt, kdf_iters
 *   rank → root   AUTH       rank, nranks, rec_len, nonce_c,
 *                            HMAC(key, "C" nonce_s nonce_c rank nranks rec_len)
 *   root → rank   AUTH_OK    HMAC(key, "S" nonce_s nonce_c rank nranks rec_len)
 *                 (or REFUSE with its own MAC and the reason; ERROR when the
 *                 AUTH MAC was wrong; then close)
 *   rank → root   RECORD     rec_len bytes (opaque to boot)
 *   root → rank   TABLE      nranks * rec_len bytes, rank order
 * key is the session key: args.key, or with kdf_iters > 0 args.key
 * stretched with PBKDF2 over the salt rank 0 drew (wire.h).
 * Both sides prove they hold the key, the secret never crosses the wire,
 * and a MAC made for one rank, job size or nonce is useless for any other.
 * A client honours a refusal only when the root proved it holds the key;
 * one it cannot verify is retried (HC_BOOT_UNVERIFIED_MAX times).
 * What this does not give: confidentiality or integrity of later messages
 * against an active man in the middle (that would need TLS).
 *
 * Stray connections (port scanners, HTTP requests, garbage, a wrong secret,
 * a duplicate rank, floods) are dropped with a WARN (the first 32; then at
 * TRACE, counted at the end) and do not disturb the job: the root serves
 * every connection from one non-blocking loop, evicts only connections
 * that have sent nothing valid (HC_BOOT_PENDING_MAX), never one that holds
 * its challenge or is authenticated, accepts in batches between turns of
 * service, and gives each connection a time cap (a quarter of the timeout,
 * clamped to 1..10 s) to finish the handshake. A client dropped before
 * AUTH_OK starts over, with a fresh nonce, until its deadline.
 *
 * Deadlines: each call's deadline is timeout_ms from its start, except the
 * rendezvous's wait for every rank to arrive, which is init_timeout_ms
 * (ranks of a job start minutes apart). While it waits, the root and the
 * ranks that joined send each other BEAT messages every liveness_ms / 8,
 * so that one of them that froze is named after liveness_ms. A rank that
 * never arrives makes the root fail with HCOLL_ERR_TIMEOUT naming the
 * missing ranks, and the root tells every connected rank so; a rank that
 * connected waits up to HC_BOOT_VERDICT_GRACE_MS past its own deadline for
 * that verdict, so that it can name the missing ranks too.
 *
 * Failure: when the root sees a rank fail (connection closed, bad message),
 * it sends ERROR to every other rank and shuts all connections, so pending
 * calls everywhere fail promptly with HCOLL_ERR_PEER_FAILED. A boot that
 * failed once stays failed: later calls return the same status at once.
 *
 * Threads: one caller at a time per boot, except hc_boot_abort, which any
 * thread may call at any time; it wakes a blocked call (which then returns
 * HCOLL_ERR_ABORTED) and closes nothing, so hc_boot_destroy must follow.
 */
#ifndef HC_BOOT_H
#define HC_BOOT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/exchange.h"
#include "hcoll.h"
#include "sys/ifaces.h"

#define HC_BOOT_KEY_BYTES 32
/* The root's table of connections not yet registered: at most
 * HC_BOOT_PENDING_MAX that have sent nothing valid yet (the oldest of them
 * is evicted for a newcomer) and HC_BOOT_HANDSHAKE_MAX that hold their
 * challenge or are authenticated (never evicted; a HELLO beyond them is
 * dropped, and its client retries). */
#define HC_BOOT_PENDING_MAX 32
#define HC_BOOT_HANDSHAKE_MAX 64
/* Connections accepted per turn of the root's loop before it serves the
 * ones it has (fair accepting under a flood). */
#define HC_BOOT_ACCEPT_BATCH 8
/* The listener's backlog at the root: a burst of strangers waits there
 * instead of having its SYNs dropped (the kernel caps it at somaxconn). */
#define HC_BOOT_BACKLOG 4096
/* A client retries a refusal it cannot verify (ERROR, or a REFUSE whose
 * MAC is wrong) this many times before it gives up. */
#define HC_BOOT_UNVERIFIED_MAX 3
#define HC_BOOT_VERDICT_GRACE_MS 500
#define HC_BOOT_REC_MAX (64u * 1024)
/* Largest nranks * len one collective may move (a sanity bound, not a
 * protocol limit that set-up data comes near). */
#define HC_BOOT_COLL_MAX ((size_t)1 << 30)

typedef struct hc_boot hc_boot_t;

/* hc_boot_allgather has the hc_allgather_fn shape (base/exchange.h), with
 * the hc_boot_t as ctx. */

typedef struct hc_boot_args {
    int rank, nranks;
    hc_sockaddr_t root;  /* where the root listens */
    /* Root only: an already listening socket bound to root, which boot
     * takes over (and closes in every case); -1 to bind root here. */
    int listen_fd;
    unsigned char key[HC_BOOT_KEY_BYTES];
    int authenticated;   /* 0: the key is public, logged as such */
    /* 0: key is used as it is (a full-entropy key: the unique id's secret,
     * a split's derived key). > 0: key is a human-chosen secret's pre-key
     * (hc_boot_key_from_string), stretched with PBKDF2-HMAC-SHA256 and this
     * many iterations over a salt the root draws for the job; every rank
     * must pass the same count (a different one is HCOLL_ERR_MISMATCH). */
    uint32_t kdf_iters;
    int64_t timeout_ms;      /* each set-up step once its peers are there */
    int64_t init_timeout_ms; /* the rendezvous: every rank's arrival; 0: timeout_ms */
    int64_t liveness_ms;     /* a joined rank (or the root) silent this long while
                              * the rendezvous waits is dead; 0: not checked */
    hc_errbuf_t *eb;     /* where errors go; NULL: the calling thread's */
    /* NULL, or an eventfd of the caller's that cancels this boot when it
     * becomes readable, from the rendezvous on (as hc_boot_abort does once
     * the boot exists): a communicator set up in the background is
     * cancelled before hc_boot_create has returned. The boot keeps a
     * duplicate, so the caller may close its fd after hc_boot_destroy. */
    const int *cancel_fd;
} hc_boot_args_t;

/*
 * Rendezvous: blocks until every rank has joined or the deadline passed.
 * rec (rec_len bytes, same rec_len on every rank, <= HC_BOOT_REC_MAX) is
 * this rank's record; all_recs_out (nranks*rec_len) receives everyone's.
 * Collective. On success *boot_out is the bootstrap for later collectives.
 */
hcoll_status_t hc_boot_create(const hc_boot_args_t *args, const void *rec, size_t rec_len,
                              void *all_recs_out, hc_boot_t **boot_out);

/* Where errors of later calls go (the communicator's buffer once it exists). */
void hc_boot_set_errbuf(hc_boot_t *b, hc_errbuf_t *eb);

/* Collectives. Every rank must call the same ones in the same order with
 * the same len (and root); a mismatch seen on the wire is
 * HCOLL_ERR_MISMATCH. Each returns HCOLL_ERR_TIMEOUT, HCOLL_ERR_PEER_FAILED
 * or HCOLL_ERR_ABORTED as the case may be. ctx is an hc_boot_t. */
hcoll_status_t hc_boot_allgather(void *boot, const void *mine, void *all_out, size_t len);
hcoll_status_t hc_boot_bcast(void *boot, void *buf, size_t len, int root);
hcoll_status_t hc_boot_barrier(void *boot);

/* Thread-safe, idempotent: wake a blocked call and shut the connections so
 * that peers see this rank leave. */
void hc_boot_abort(hc_boot_t *b);

/* Close and free everything; waits for a call in flight on another thread
 * to return (call hc_boot_abort first to make that prompt). NULL: no-op. */
void hc_boot_destroy(hc_boot_t *b);

/* The session key every rank of this boot shares: args->key, or with
 * kdf_iters > 0 the stretched key. Keys derived later (a split's, a data
 * connection's) should come from this one, never from the unstretched
 * pre-key, so that what they expose does not allow cheap guessing. */
void hc_boot_key(const hc_boot_t *b, unsigned char key_out[HC_BOOT_KEY_BYTES]);

/* The status that broke this boot, or HCOLL_SUCCESS while it is healthy. */
hcoll_status_t hc_boot_status(const hc_boot_t *b);

/* Shared secrets: the unique id's secret is used as the key directly; a
 * launcher's HCOLL_SECRET string is hashed into a pre-key, which the
 * rendezvous stretches (kdf_iters). The unauthenticated mode uses a fixed
 * public key so that it runs the same protocol. */
void hc_boot_key_from_string(const char *secret, unsigned char key_out[HC_BOOT_KEY_BYTES]);
void hc_boot_key_public(unsigned char key_out[HC_BOOT_KEY_BYTES]);

/* What hc_boot_socket sets on its socket. REUSEPORT is the unique id's
 * port hand-over (uid.h); a bind that fails then says who may hold the
 * port. */
enum { HC_BOOT_SOCK_LISTEN = 1, HC_BOOT_SOCK_REUSEADDR = 2, HC_BOOT_SOCK_REUSEPORT = 4 };

/* Open a non-blocking, close-on-exec TCP socket bound to addr (port 0: an
 * ephemeral port) with the options in flags (HC_BOOT_SOCK_*), listening
 * with LISTEN. On success *fd_out is the fd and *addr_out (may be NULL,
 * may be addr) the bound address; on failure HCOLL_ERR_NETWORK, recorded
 * in eb with `what` as the message's prefix. */
hcoll_status_t hc_boot_socket(const hc_sockaddr_t *addr, int flags, hc_errbuf_t *eb, int rank,
                              const char *what, int *fd_out, hc_sockaddr_t *addr_out);

#endif
