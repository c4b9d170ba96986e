/*
 * SHA-256 per FIPS 180-4 §6.2 and HMAC per RFC 2104; tests/test_hmac.c checks
 * them against the FIPS examples and RFC 4231's vectors.
 */
#include "boot/hmac.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static inline uint32_t ror(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

static void sha256_block(uint32_t h[8], const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t S1 = ror(e, 6) ^ ror(e, 11) ^ ror(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + S1 + ch + K[i] + w[i];
        uint32_t S0 = ror(a, 2) ^ ror(a, 13) ^ ror(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d;
    h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

void hc_sha256_init(hc_sha256_t *s)
{
    static const uint32_t iv[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    memcpy(s->h, iv, sizeof iv);
    s->total = 0;
    s->fill = 0;
}

void hc_sha256_update(hc_sha256_t *s, const void *data, size_t len)
{
    const unsigned char *p = data;
    s->total += len;
    if (s->fill) {
        size_t take = HC_SHA256_BLOCK - s->fill;
        if (take > len)
            take = len;
        memcpy(s->buf + s->fill, p, take);
        s->fill += take;
        p += take;
        len -= take;
        if (s->fill < HC_SHA256_BLOCK)
            return;
        sha256_block(s->h, s->buf);
        s->fill = 0;
    }
    for (; len >= HC_SHA256_BLOCK; p += HC_SHA256_BLOCK, len -= HC_SHA256_BLOCK)
        sha256_block(s->h, p);
    memcpy(s->buf, p, len);
    s->fill = len;
}

void hc_sha256_final(hc_sha256_t *s, unsigned char out[HC_SHA256_BYTES])
{
    const uint64_t bits = s->total * 8;
    /* Padding: 0x80, zeros up to 56 mod 64, then the bit length big-endian. */
    unsigned char pad[HC_SHA256_BLOCK + 8] = { 0x80 };
    size_t padlen = (s->fill < 56 ? 56 : 120) - s->fill;
    for (int i = 0; i < 8; i++)
        pad[padlen + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
    hc_sha256_update(s, pad, padlen + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(s->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)s->h[i];
    }
    hc_secure_zero(s, sizeof *s);
}

void hc_sha256(const void *data, size_t len, unsigned char out[HC_SHA256_BYTES])
{
    hc_sha256_t s;
    hc_sha256_init(&s);
    hc_sha256_update(&s, data, len);
    hc_sha256_final(&s, out);
}

void hc_hmac_init(hc_hmac_t *h, const void *key, size_t keylen)
{
    unsigned char k[HC_SHA256_BLOCK] = { 0 };
    unsigned char ipad[HC_SHA256_BLOCK];
    /* Keys longer than a block are hashed first (RFC 2104 §2). */
    if (keylen > HC_SHA256_BLOCK)
        hc_sha256(key, keylen, k);
    else if (keylen)
        memcpy(k, key, keylen);
    for (int i = 0; i < HC_SHA256_BLOCK; i++) {
        ipad[i] = k[i] ^ 0x36;
        h->okey[i] = k[i] ^ 0x5c;
    }
    hc_sha256_init(&h->inner);
    hc_sha256_update(&h->inner, ipad, sizeof ipad);
    hc_secure_zero(k, sizeof k);
    hc_secure_zero(ipad, sizeof ipad);
}

void hc_hmac_update(hc_hmac_t *h, const void *data, size_t len)
{
    hc_sha256_update(&h->inner, data, len);
}

void hc_hmac_final(hc_hmac_t *h, unsigned char out[HC_SHA256_BYTES])
{
    unsigned char ih[HC_SHA256_BYTES];
    hc_sha256_final(&h->inner, ih);
    hc_sha256_t outer;
    hc_sha256_init(&outer);
    hc_sha256_update(&outer, h->okey, sizeof h->okey);
    hc_sha256_update(&outer, ih, sizeof ih);
    hc_sha256_final(&outer, out);
    hc_secure_zero(h, sizeof *h);
    hc_secure_zero(ih, sizeof ih);
}

void hc_hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
                    unsigned char out[HC_SHA256_BYTES])
{
    hc_hmac_t h;
    hc_hmac_init(&h, key, keylen);
    hc_hmac_update(&h, data, len);
    hc_hmac_final(&h, out);
}

/* The 32-byte digest of h's state (big-endian). */
static void sha256_store(const uint32_t h[8], unsigned char out[HC_SHA256_BYTES])
{
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(h[i] >> 8);
        out[4 * i + 3] = (unsigned char)h[i];
    }
}

/* HMAC of a 32-byte message from the states after the key's inner and outer
 * pad blocks: each hash is then one block, the message and its padding
 * (0x80, zeros, 96 bytes = 768 bits), with no buffering. */
static void pbkdf2_step(const uint32_t ist[8], const uint32_t ost[8], unsigned char blk[64])
{
    uint32_t h[8];
    memcpy(h, ist, sizeof h);
    sha256_block(h, blk);
    sha256_store(h, blk);
    memcpy(h, ost, sizeof h);
    sha256_block(h, blk);
    sha256_store(h, blk);
    hc_secure_zero(h, sizeof h);
}

void hc_pbkdf2_sha256(const void *pass, size_t passlen, const void *salt, size_t saltlen,
                      uint32_t iters, unsigned char *out, size_t outlen)
{
    hc_hmac_t base;
    hc_hmac_init(&base, pass, passlen);
    uint32_t ist[8], ost[8];
    memcpy(ist, base.inner.h, sizeof ist); /* after the ipad block */
    hc_sha256_t o;
    hc_sha256_init(&o);
    hc_sha256_update(&o, base.okey, sizeof base.okey);
    memcpy(ost, o.h, sizeof ost);
    unsigned char blk[HC_SHA256_BLOCK], t[HC_SHA256_BYTES];
    for (uint32_t i = 1; outlen; i++) {
        /* U1 = HMAC(P, S || INT(i)); Uk = HMAC(P, Uk-1); T = U1 ^ ... ^ Uc */
        unsigned char be[4] = { (unsigned char)(i >> 24), (unsigned char)(i >> 16),
                                (unsigned char)(i >> 8), (unsigned char)i };
        hc_hmac_t h = base;
        hc_hmac_update(&h, salt, saltlen);
        hc_hmac_update(&h, be, sizeof be);
        hc_hmac_final(&h, t);
        memset(blk, 0, sizeof blk);
        memcpy(blk, t, sizeof t);
        blk[32] = 0x80, blk[62] = 0x03; /* the step overwrites only blk[0..31] */
        for (uint32_t k = 1; k < iters; k++) {
            pbkdf2_step(ist, ost, blk);
            for (int j = 0; j < HC_SHA256_BYTES; j++)
                t[j] ^= blk[j];
        }
        size_t n = outlen < sizeof t ? outlen : sizeof t;
        memcpy(out, t, n);
        out += n;
        outlen -= n;
    }
    hc_secure_zero(&base, sizeof base);
    hc_secure_zero(&o, sizeof o);
    hc_secure_zero(ist, sizeof ist);
    hc_secure_zero(ost, sizeof ost);
    hc_secure_zero(blk, sizeof blk);
    hc_secure_zero(t, sizeof t);
}

int hc_ct_equal(const void *a, const void *b, size_t len)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < len; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}

int hc_random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

void hc_secure_zero(void *p, size_t len)
{
    volatile unsigned char *v = p;
    while (len--)
        *v++ = 0;
}
