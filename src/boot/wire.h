/*
 * The bootstrap's wire format: every message is a 16-byte big-endian
 * header {magic "HCBT", version, type, length, arg} followed by length
 * bytes. The receiver always knows the exact length it expects (or a small
 * cap for error texts) and checks the header before reading or allocating
 * anything. The authentication MACs are defined here too, since their
 * input is part of what crosses the wire.
 *
 *   byte  0       4        6      8        12       16
 *         │ magic │ version│ type │ length │ arg    │ body (length bytes)
 *
 * arg: the sender's status for ERROR; (op << 24 | sequence) for UP and
 * DOWN, so that ranks that call set-up collectives in a different order
 * are told so; 0 otherwise.
 */
#ifndef HC_BOOT_WIRE_H
#define HC_BOOT_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "boot/boot.h"
#include "boot/hmac.h"
#include "hcoll.h"

#define HC_BWIRE_MAGIC 0x48434254u /* "HCBT" */
#define HC_BWIRE_VERSION 1u
#define HC_BWIRE_HDR_BYTES 16
#define HC_BWIRE_NONCE_BYTES 32
#define HC_BWIRE_MAC_BYTES HC_SHA256_BYTES
/* AUTH body: rank, nranks, rec_len (4 bytes each), nonce_c, MAC. */
#define HC_BWIRE_AUTH_BYTES (12 + HC_BWIRE_NONCE_BYTES + HC_BWIRE_MAC_BYTES)
#define HC_BWIRE_ERRTEXT_MAX 256

enum hc_bwire_msg {
    HC_BMSG_CHALLENGE = 1,
    HC_BMSG_AUTH = 2,
    HC_BMSG_AUTH_OK = 3,
    HC_BMSG_RECORD = 4,
    HC_BMSG_TABLE = 5,
    HC_BMSG_ERROR = 6,
    HC_BMSG_UP = 7,
    HC_BMSG_DOWN = 8,
    HC_BMSG_BEAT = 9, /* empty: "alive", while init waits for every rank */
};

/* The set-up collectives, as carried in the top byte of UP/DOWN's arg. */
enum hc_bwire_op { HC_BOOT_OP_ALLGATHER = 1, HC_BOOT_OP_BCAST = 2, HC_BOOT_OP_BARRIER = 3 };

typedef struct hc_bwire_hdr {
    uint32_t magic;
    uint16_t version, type;
    uint32_t len, arg;
} hc_bwire_hdr_t;

static inline void hc_bwire_put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static inline uint32_t hc_bwire_get32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* HC_BWIRE_HDR_BYTES at p. */
void hc_bwire_pack(unsigned char *p, unsigned type, uint32_t len, uint32_t arg);
void hc_bwire_unpack(const unsigned char *p, hc_bwire_hdr_t *h);
/* 1 when h may be read on (magic, version, known type, error text within
 * its cap); 0 with the reason in why. */
int hc_bwire_sane(const hc_bwire_hdr_t *h, char *why, size_t whylen);
/* "allgather", "bcast", "barrier", or "?" for anything else. */
const char *hc_bwire_op_name(unsigned op);
/* An ERROR message's arg as a status; anything not a failure status is
 * HCOLL_ERR_PEER_FAILED. */
hcoll_status_t hc_bwire_status(uint32_t v);
/* Replace what is not printable ASCII in a peer's text by '?'. */
void hc_bwire_sanitize(char *s);

/* HMAC(key, "hcoll-boot-v1" nonce_s nonce_c side rank nranks rec_len):
 * side 'C' proves the client holds the key, 'S' the root. */
void hc_bwire_mac(const unsigned char *key, char side, const unsigned char *nonce_s,
                  const unsigned char *nonce_c, uint32_t rank, uint32_t nranks,
                  uint32_t rec_len, unsigned char out[HC_BWIRE_MAC_BYTES]);

#endif
