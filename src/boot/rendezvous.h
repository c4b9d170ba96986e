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

/*
 * The two sides' connection handling without their listener, dialling
 * and retries, for tests (tests/fuzz/fuzz_rdv.c feeds them a peer's
 * bytes).
 *
 * Root: hc_boot_root_open makes the context hc_boot_root_rendezvous runs
 * on (the session key drawn, rec in slot 0 of recs), with no listener;
 * hc_boot_root_adopt takes a connected non-blocking fd as if accepted
 * (owned from here); hc_boot_root_serve reads what every pending
 * connection has sent and answers it, once each, never blocking, and
 * returns how many ranks have registered (their fds in b->conn);
 * hc_boot_root_close drops the pending ones and frees (NULL: no-op).
 */
typedef struct root_ctx hc_boot_root_t;
hcoll_status_t hc_boot_root_open(hc_boot_t *b, const void *rec, size_t rec_len,
                                 unsigned char *recs, hc_boot_root_t **rc_out);
void hc_boot_root_adopt(hc_boot_root_t *rc, int fd);
int hc_boot_root_serve(hc_boot_root_t *rc);
void hc_boot_root_close(hc_boot_root_t *rc);

/* Client: one handshake attempt on a connected non-blocking fd (HELLO,
 * CHALLENGE, AUTH with a fresh nonce, the root's answer) up to deadline
 * (hc_now_ms). On failure *end says what hc_boot_client_rendezvous does
 * next: 0 gives up (the error recorded), 1 retries (dropped before
 * AUTH_OK), 2 retries and counts an unverified refusal, whose text is in
 * why (sanitized). */
hcoll_status_t hc_boot_client_handshake(hc_boot_t *b, int fd, size_t rec_len, double deadline,
                                        int *end, char *why, size_t whylen);
/* After RECORD: the table (len bytes) into recs, or the root's verdict. */
hcoll_status_t hc_boot_client_wait_table(hc_boot_t *b, int fd, unsigned char *recs, size_t len,
                                         double deadline);

#endif
