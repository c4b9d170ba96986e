/* SHA-256 and HMAC-SHA-256: FIPS 180-4 examples and RFC 4231's vectors;
 * PBKDF2-HMAC-SHA256 against RFC 7914 section 11 and vectors computed with
 * Python's hashlib.pbkdf2_hmac (an independent implementation); the
 * bootstrap's key stretching and refusal MAC. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boot/hmac.h"
#include "boot/wire.h"

static void hex(const unsigned char *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static void check_sha(const void *data, size_t len, const char *want)
{
    unsigned char d[32];
    char h[65];
    hc_sha256(data, len, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, want);
}

START_TEST(sha256_fips)
{
    check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha(two, strlen(two),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* One million 'a', fed in odd-sized pieces to exercise the block buffer. */
    hc_sha256_t s;
    unsigned char d[32];
    char h[65], a[1024];
    memset(a, 'a', sizeof a);
    hc_sha256_init(&s);
    size_t left = 1000000;
    for (size_t step = 1; left; step = step % 997 + 13) {
        size_t n = step < left ? step : left;
        hc_sha256_update(&s, a, n);
        left -= n;
    }
    hc_sha256_final(&s, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
END_TEST

/* Lengths around the padding boundary (55, 56, 63, 64 bytes), whole vs.
 * byte-at-a-time must agree. */
START_TEST(sha256_incremental)
{
    unsigned char buf[200];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 7 + 3);
    for (size_t len = 0; len < sizeof buf; len++) {
        unsigned char a[32], b[32];
        hc_sha256(buf, len, a);
        hc_sha256_t s;
        hc_sha256_init(&s);
        for (size_t i = 0; i < len; i++)
            hc_sha256_update(&s, buf + i, 1);
        hc_sha256_final(&s, b);
        ck_assert_msg(memcmp(a, b, 32) == 0, "length %zu", len);
    }
}
END_TEST

struct vec {
    unsigned char key[131];
    size_t keylen;
    unsigned char data[160];
    size_t datalen;
    const char *mac;
    size_t maclen; /* bytes compared (test case 5 truncates to 16) */
};

static void fill(unsigned char *p, size_t n, unsigned char v)
{
    memset(p, v, n);
}

START_TEST(hmac_rfc4231)
{
    static struct vec v[7];
    memset(v, 0, sizeof v);
    /* 1 */
    fill(v[0].key, 20, 0x0b), v[0].keylen = 20;
    strcpy((char *)v[0].data, "Hi There"), v[0].datalen = 8;
    v[0].mac = "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7";
    /* 2 */
    strcpy((char *)v[1].key, "Jefe"), v[1].keylen = 4;
    strcpy((char *)v[1].data, "what do ya want for nothing?"), v[1].datalen = 28;
    v[1].mac = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
    /* 3 */
    fill(v[2].key, 20, 0xaa), v[2].keylen = 20;
    fill(v[2].data, 50, 0xdd), v[2].datalen = 50;
    v[2].mac = "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe";
    /* 4 */
    for (int i = 0; i < 25; i++)
        v[3].key[i] = (unsigned char)(i + 1);
    v[3].keylen = 25;
    fill(v[3].data, 50, 0xcd), v[3].datalen = 50;
    v[3].mac = "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b";
    /* 5: truncated to 128 bits */
    fill(v[4].key, 20, 0x0c), v[4].keylen = 20;
    strcpy((char *)v[4].data, "Test With Truncation"), v[4].datalen = 20;
    v[4].mac = "a3b6167473100ee06e0c796c2955552b";
    v[4].maclen = 16;
    /* 6: key larger than a block */
    fill(v[5].key, 131, 0xaa), v[5].keylen = 131;
    strcpy((char *)v[5].data, "Test Using Larger Than Block-Size Key - Hash Key First");
    v[5].datalen = 54;
    v[5].mac = "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54";
    /* 7: key and data larger than a block */
    fill(v[6].key, 131, 0xaa), v[6].keylen = 131;
    strcpy((char *)v[6].data, "This is a test using a larger than block-size key and a larger "
                              "than block-size data. The key needs to be hashed before being "
                              "used by the HMAC algorithm.");
    v[6].datalen = strlen((char *)v[6].data);
    v[6].mac = "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2";

    for (int i = 0; i < 7; i++) {
        unsigned char m[32];
        char h[65];
        hc_hmac_sha256(v[i].key, v[i].keylen, v[i].data, v[i].datalen, m);
        size_t n = v[i].maclen ? v[i].maclen : 32;
        hex(m, n, h);
        ck_assert_msg(strcmp(h, v[i].mac) == 0, "test case %d: got %s want %s", i + 1, h,
                      v[i].mac);
        /* The incremental form gives the same MAC, split anywhere. */
        hc_hmac_t x;
        hc_hmac_init(&x, v[i].key, v[i].keylen);
        hc_hmac_update(&x, v[i].data, v[i].datalen / 3);
        hc_hmac_update(&x, v[i].data + v[i].datalen / 3, v[i].datalen - v[i].datalen / 3);
        unsigned char m2[32];
        hc_hmac_final(&x, m2);
        ck_assert(memcmp(m, m2, 32) == 0);
    }
}
END_TEST

static void check_pbkdf2(const char *pass, size_t passlen, const char *salt, uint32_t iters,
                         size_t outlen, const char *want)
{
    unsigned char out[64];
    char h[129];
    hc_pbkdf2_sha256(pass, passlen, salt, strlen(salt), iters, out, outlen);
    hex(out, outlen, h);
    ck_assert_msg(strcmp(h, want) == 0, "pbkdf2(%.12s, %s, %u, %zu): got %s want %s", pass, salt,
                  iters, outlen, h, want);
}

START_TEST(pbkdf2_vectors)
{
    check_pbkdf2("password", 8, "salt", 1, 32,
                 "120fb6cffcf8b32c43e7225256c4f837a86548c92ccc35480805987cb70be17b");
    check_pbkdf2("password", 8, "salt", 4096, 32,
                 "c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a");
    /* Output longer than one block (40 bytes: blocks 1 and 2). */
    check_pbkdf2("passwordPASSWORDpassword", 24, "saltSALTsaltSALTsaltSALTsaltSALTsalt", 4096, 40,
                 "348c89dbcbd32b2f32d814b8116e84cf2b17347ebc1800181c4e2a1fb8dd53e1c635518c7dac47e9");
    /* RFC 7914 section 11, 64 bytes. */
    check_pbkdf2("passwd", 6, "salt", 1, 64,
                 "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc49ca9cccf179b645"
                 "991664b39d77ef317c71b845b1e30bd509112041d3a19783");
    /* A password longer than a block (hashed first), an empty salt. */
    char k[100];
    memset(k, 'k', sizeof k);
    check_pbkdf2(k, sizeof k, "", 2, 33,
                 "c6240d6034800799638db95e360a5c988b1c16459b6ba73e6e7bcae79870d44d32");
}
END_TEST

/* The bootstrap's stretching depends on every input: the secret's pre-key,
 * the root's salt and the cost; and a refusal's MAC on every field. */
START_TEST(boot_kdf_and_refusal)
{
    unsigned char pre[32], pre2[32], salt[HC_BWIRE_SALT_BYTES] = { 1, 2, 3 }, a[32], b[32];
    hc_boot_key_from_string("correct horse battery staple", pre);
    hc_boot_key_from_string("correct horse battery stapler", pre2);
    hc_bwire_kdf(pre, salt, 1000, a);
    hc_bwire_kdf(pre, salt, 1000, b);
    ck_assert(memcmp(a, b, 32) == 0);
    ck_assert(memcmp(a, pre, 32) != 0);
    hc_bwire_kdf(pre2, salt, 1000, b);
    ck_assert(memcmp(a, b, 32) != 0);
    hc_bwire_kdf(pre, salt, 1001, b);
    ck_assert(memcmp(a, b, 32) != 0);
    salt[15] ^= 1;
    hc_bwire_kdf(pre, salt, 1000, b);
    ck_assert(memcmp(a, b, 32) != 0);
    /* It is PBKDF2 over the documented salt ("hcoll-kdf-v1" || salt). */
    unsigned char s2[12 + HC_BWIRE_SALT_BYTES];
    memcpy(s2, "hcoll-kdf-v1", 12);
    memcpy(s2 + 12, salt, HC_BWIRE_SALT_BYTES);
    hc_pbkdf2_sha256(pre, 32, s2, sizeof s2, 1000, a, 32);
    ck_assert(memcmp(a, b, 32) == 0);

    unsigned char ns[32] = { 9 }, nc[32] = { 7 }, m1[32], m2[32];
    hc_bwire_refuse_mac(a, ns, nc, 5, "text", 4, m1);
    hc_bwire_refuse_mac(a, ns, nc, 6, "text", 4, m2);
    ck_assert(memcmp(m1, m2, 32) != 0);
    hc_bwire_refuse_mac(a, ns, nc, 5, "texT", 4, m2);
    ck_assert(memcmp(m1, m2, 32) != 0);
    nc[31] ^= 1;
    hc_bwire_refuse_mac(a, ns, nc, 5, "text", 4, m2);
    ck_assert(memcmp(m1, m2, 32) != 0);
}
END_TEST

START_TEST(ct_equal_and_random)
{
    unsigned char a[32] = { 1, 2, 3 }, b[32] = { 1, 2, 3 };
    ck_assert(hc_ct_equal(a, b, 32));
    b[31] ^= 0x80;
    ck_assert(!hc_ct_equal(a, b, 32));
    ck_assert(hc_ct_equal(a, b, 0));

    unsigned char r1[32], r2[32], zero[32] = { 0 };
    ck_assert_int_eq(hc_random_bytes(r1, sizeof r1), 0);
    ck_assert_int_eq(hc_random_bytes(r2, sizeof r2), 0);
    ck_assert(memcmp(r1, r2, 32) != 0);
    ck_assert(memcmp(r1, zero, 32) != 0);
    hc_secure_zero(r1, sizeof r1);
    ck_assert(memcmp(r1, zero, 32) == 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hmac");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, sha256_fips);
    tcase_add_test(tc, sha256_incremental);
    tcase_add_test(tc, hmac_rfc4231);
    tcase_add_test(tc, ct_equal_and_random);
    tcase_add_test(tc, pbkdf2_vectors);
    tcase_add_test(tc, boot_kdf_and_refusal);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
