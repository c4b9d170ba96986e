/*
 * SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), written here so that the
 * bootstrap's challenge-response needs no crypto library. They authenticate
 * the rendezvous; they do not encrypt anything.
 */
#ifndef HC_BOOT_HMAC_H
#define HC_BOOT_HMAC_H

#include <stddef.h>
#include <stdint.h>

#define HC_SHA256_BYTES 32
#define HC_SHA256_BLOCK 64

typedef struct hc_sha256 {
    uint32_t h[8];
    uint64_t total;               /* bytes hashed so far */
    size_t fill;                  /* bytes waiting in buf */
    unsigned char buf[HC_SHA256_BLOCK];
} hc_sha256_t;

void hc_sha256_init(hc_sha256_t *s);
void hc_sha256_update(hc_sha256_t *s, const void *data, size_t len);
void hc_sha256_final(hc_sha256_t *s, unsigned char out[HC_SHA256_BYTES]);
void hc_sha256(const void *data, size_t len, unsigned char out[HC_SHA256_BYTES]);

/* Incremental HMAC so that a MAC can cover several fields without copying
 * them into one buffer first. */
typedef struct hc_hmac {
    hc_sha256_t inner;
    unsigned char okey[HC_SHA256_BLOCK]; /* key ^ opad */
} hc_hmac_t;

void hc_hmac_init(hc_hmac_t *h, const void *key, size_t keylen);
void hc_hmac_update(hc_hmac_t *h, const void *data, size_t len);
void hc_hmac_final(hc_hmac_t *h, unsigned char out[HC_SHA256_BYTES]);
void hc_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                    unsigned char out[HC_SHA256_BYTES]);

/* PBKDF2-HMAC-SHA256 (RFC 8018 section 5.2): outlen bytes of key from a
 * password, a salt and an iteration count (>= 1). Each iteration costs two
 * SHA-256 blocks, which is what makes guessing the password expensive. */
void hc_pbkdf2_sha256(const void *pass, size_t passlen, const void *salt, size_t saltlen,
                      uint32_t iters, unsigned char *out, size_t outlen);

/* Compare in time independent of where the first difference is, so that a
 * MAC check leaks nothing through timing. 1 when equal. */
int hc_ct_equal(const void *a, const void *b, size_t len);

/* Fill buf from the kernel's random source (getrandom). 0, or -1 with errno. */
int hc_random_bytes(void *buf, size_t len);

/* Overwrite memory in a way the compiler does not drop. */
void hc_secure_zero(void *p, size_t len);

#endif
