/*
 * TCP transport internals that tests and the ring's debug hooks may reach.
 * Everything else about the backend is behind hc_tcp_ops (transport.h).
 */
#ifndef HC_INTER_TCP_H
#define HC_INTER_TCP_H

#include <stdint.h>

#include "inter/transport.h"

/* Frame header on the wire (host byte order; peers share an architecture).
 * Every byte of a connection after the hello is a sequence of
 *   [hc_tcp_hdr][len payload bytes]
 * and the payload lands at region(key) + off on the receiver. */
#define HC_TCP_MAGIC_PUT 0x48435450u /* "HCTP": a put */
#define HC_TCP_MAGIC_BYE 0x48434259u /* "HCBY": orderly close, no payload */

typedef struct hc_tcp_hdr {
    uint32_t magic;
    uint32_t imm;
    uint64_t key; /* region id on the receiver; 0 = none (len must be 0) */
    uint64_t off;
    uint64_t len;
} hc_tcp_hdr_t;

/* Test-only: the next frame sent on ep gets a header broken this way. The
 * receiver must reject it with HCOLL_ERR_NETWORK before writing a byte. */
enum hc_tcp_corrupt {
    HC_TCP_CORRUPT_NONE = 0,
    HC_TCP_CORRUPT_MAGIC,  /* unknown magic */
    HC_TCP_CORRUPT_KEY,    /* a key no region has */
    HC_TCP_CORRUPT_OFFSET, /* offset past the region's end */
    HC_TCP_CORRUPT_LENGTH, /* offset + length past the region's end */
};
void hc_tcp_ep_corrupt_next(hc_ep_t *ep, int mode);

/* Test hook: how often this instance raised a socket's SO_RCVLOWAT above 1
 * for a payload (HCOLL_TCP_RCVLOWAT). */
uint64_t hc_tcp_lowat_raised(const hc_transport_t *tr);

/* Test hook: the data path's recv and epoll_wait calls so far (the system
 * calls a small message costs). */
void hc_tcp_io_calls(const hc_transport_t *tr, uint64_t *nrecv_out, uint64_t *nwait_out);

/* The port this instance listens on (for tests that knock on it). */
int hc_tcp_listen_port(const hc_transport_t *tr);

#endif
