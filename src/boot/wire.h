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
/* 2: the client speaks first (HELLO), CHALLENGE carries the key
 * stretching's salt and cost, and a refusal can be authenticated (REFUSE). */
#define HC_BWIRE_VERSION 2u
#define HC_BWIRE_HDR_BYTES 16
#define HC_BWIRE_NONCE_BYTES 32
#define HC_BWIRE_MAC_BYTES HC_SHA256_BYTES
#define HC_BWIRE_SALT_BYTES 16
/* CHALLENGE body: nonce_s, salt, kdf_iters (4 bytes; 0: the key is used as
 * it is). */
#define HC_BWIRE_CHALLENGE_BYTES (HC_BWIRE_NONCE_BYTES + HC_BWIRE_SALT_BYTES + 4)
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
    HC_BMSG_HELLO = 10,  /* empty: a client's first message; the root answers it
                          * with CHALLENGE */
    HC_BMSG_REFUSE = 11, /* the root's refusal of an AUTH whose MAC it checked:
                          * arg the status, body MAC('R') then the text */
    HC_BMSG_LAST_ = HC_BMSG_REFUSE,
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
 * side 'C' proves the client holds the key, 'S' the root. key is the
 * session key (hc_bwire_kdf's output when the secret is stretched). */
void hc_bwire_mac(const unsigned char *key, char side, const unsigned char *nonce_s,
                  const unsigned char *nonce_c, uint32_t rank, uint32_t nranks,
                  uint32_t rec_len, unsigned char out[HC_BWIRE_MAC_BYTES]);

/* A REFUSE's MAC: HMAC(key, "hcoll-refuse-v1" nonce_s nonce_c status text),
 * so that only a root holding the key can end a client's init with a
 * status and text of its choosing. */
void hc_bwire_refuse_mac(const unsigned char *key, const unsigned char *nonce_s,
                         const unsigned char *nonce_c, uint32_t status, const char *text,
                         size_t len, unsigned char out[HC_BWIRE_MAC_BYTES]);

/* The session key of a stretched secret: PBKDF2-HMAC-SHA256 (RFC 8018)
 * with password prekey (hc_boot_key_from_string's output), salt
 * "hcoll-kdf-v1" || salt, iters iterations, 32 bytes. */
void hc_bwire_kdf(const unsigned char prekey[HC_BOOT_KEY_BYTES],
                  const unsigned char salt[HC_BWIRE_SALT_BYTES], uint32_t iters,
                  unsigned char key_out[HC_BOOT_KEY_BYTES]);

#endif
