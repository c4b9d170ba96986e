/*
 * The bootstrap's wire format (see wire.h): header packing and checking,
 * the text and status an ERROR message carries, and the key and MAC
 * derivations of the rendezvous handshake. Pure functions, no I/O.
 */
#include "boot/wire.h"

#include <stdio.h>
#include <string.h>

void hc_bwire_pack(unsigned char *p, unsigned type, uint32_t len, uint32_t arg)
{
    hc_bwire_put32(p, HC_BWIRE_MAGIC);
    p[4] = (unsigned char)(HC_BWIRE_VERSION >> 8), p[5] = (unsigned char)HC_BWIRE_VERSION;
    p[6] = (unsigned char)(type >> 8), p[7] = (unsigned char)type;
    hc_bwire_put32(p + 8, len);
    hc_bwire_put32(p + 12, arg);
}

void hc_bwire_unpack(const unsigned char *p, hc_bwire_hdr_t *h)
{
    h->magic = hc_bwire_get32(p);
    h->version = (uint16_t)(p[4] << 8 | p[5]);
    h->type = (uint16_t)(p[6] << 8 | p[7]);
    h->len = hc_bwire_get32(p + 8);
    h->arg = hc_bwire_get32(p + 12);
}

/* Longest message body of each type a receiver is ever willing to read,
 * before it compares with the exact length it expects. */
int hc_bwire_sane(const hc_bwire_hdr_t *h, char *why, size_t whylen)
{
    if (h->magic != HC_BWIRE_MAGIC) {
        snprintf(why, whylen, "bad magic 0x%08x", h->magic);
        return 0;
    }
    if (h->version != HC_BWIRE_VERSION) {
        snprintf(why, whylen, "protocol version %u (this library speaks %u)", h->version,
                 HC_BWIRE_VERSION);
        return 0;
    }
    if (h->type < HC_BMSG_CHALLENGE || h->type > HC_BMSG_LAST_) {
        snprintf(why, whylen, "unknown message type %u", h->type);
        return 0;
    }
    if (h->type == HC_BMSG_ERROR && h->len > HC_BWIRE_ERRTEXT_MAX) {
        snprintf(why, whylen, "error text of %u bytes (at most %d)", h->len, HC_BWIRE_ERRTEXT_MAX);
        return 0;
    }
    if (h->type == HC_BMSG_REFUSE &&
        (h->len < HC_BWIRE_MAC_BYTES || h->len > HC_BWIRE_MAC_BYTES + HC_BWIRE_ERRTEXT_MAX)) {
        snprintf(why, whylen, "refusal of %u bytes (%d to %d)", h->len, HC_BWIRE_MAC_BYTES,
                 HC_BWIRE_MAC_BYTES + HC_BWIRE_ERRTEXT_MAX);
        return 0;
    }
    return 1;
}

void hc_bwire_sanitize(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            *s = '?';
}

const char *hc_bwire_op_name(unsigned op)
{
    static const char *const names[] = { "?", "allgather", "bcast", "barrier" };
    return op < 4 ? names[op] : "?";
}

hcoll_status_t hc_bwire_status(uint32_t v)
{
    if (v <= HCOLL_IN_PROGRESS || v >= HCOLL_STATUS_COUNT_)
        return HCOLL_ERR_PEER_FAILED;
    return (hcoll_status_t)v;
}

void hc_boot_key_from_string(const char *secret, unsigned char key_out[HC_BOOT_KEY_BYTES])
{
    hc_sha256_t s;
    hc_sha256_init(&s);
    hc_sha256_update(&s, "hcoll-secret-v1:", 16);
    hc_sha256_update(&s, secret, strlen(secret));
    hc_sha256_final(&s, key_out);
}

void hc_boot_key_public(unsigned char key_out[HC_BOOT_KEY_BYTES])
{
    hc_sha256("hcoll-unauthenticated-v1", 24, key_out);
}

void hc_bwire_mac(const unsigned char *key, char side, const unsigned char *nonce_s,
                  const unsigned char *nonce_c, uint32_t rank, uint32_t nranks,
                  uint32_t rec_len, unsigned char out[HC_BWIRE_MAC_BYTES])
{
    unsigned char nums[13];
    nums[0] = (unsigned char)side;
    hc_bwire_put32(nums + 1, rank);
    hc_bwire_put32(nums + 5, nranks);
    hc_bwire_put32(nums + 9, rec_len);
    hc_hmac_t h;
    hc_hmac_init(&h, key, HC_BOOT_KEY_BYTES);
    hc_hmac_update(&h, "hcoll-boot-v1", 13);
    hc_hmac_update(&h, nonce_s, HC_BWIRE_NONCE_BYTES);
    hc_hmac_update(&h, nonce_c, HC_BWIRE_NONCE_BYTES);
    hc_hmac_update(&h, nums, sizeof nums);
    hc_hmac_final(&h, out);
}

void hc_bwire_refuse_mac(const unsigned char *key, const unsigned char *nonce_s,
                         const unsigned char *nonce_c, uint32_t status, const char *text,
                         size_t len, unsigned char out[HC_BWIRE_MAC_BYTES])
{
    unsigned char st[4];
    hc_bwire_put32(st, status);
    hc_hmac_t h;
    hc_hmac_init(&h, key, HC_BOOT_KEY_BYTES);
    hc_hmac_update(&h, "hcoll-refuse-v1", 15);
    hc_hmac_update(&h, nonce_s, HC_BWIRE_NONCE_BYTES);
    hc_hmac_update(&h, nonce_c, HC_BWIRE_NONCE_BYTES);
    hc_hmac_update(&h, st, sizeof st);
    hc_hmac_update(&h, text, len);
    hc_hmac_final(&h, out);
}

void hc_bwire_kdf(const unsigned char prekey[HC_BOOT_KEY_BYTES],
                  const unsigned char salt[HC_BWIRE_SALT_BYTES], uint32_t iters,
                  unsigned char key_out[HC_BOOT_KEY_BYTES])
{
    unsigned char s[12 + HC_BWIRE_SALT_BYTES];
    memcpy(s, "hcoll-kdf-v1", 12);
    memcpy(s + 12, salt, HC_BWIRE_SALT_BYTES);
    hc_pbkdf2_sha256(prekey, HC_BOOT_KEY_BYTES, s, sizeof s, iters, key_out, HC_BOOT_KEY_BYTES);
    hc_secure_zero(s, sizeof s);
}
