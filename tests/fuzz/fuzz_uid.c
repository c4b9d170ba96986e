/* The unique id (boot/uid.c): 128 bytes a launcher or a driver process
 * hands to every rank. The first input byte chooses whether the 4-byte
 * check is recomputed, so that mutations reach the fields behind it. */
#include "fuzz.h"

#include "boot/hmac.h"
#include "boot/uid.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    hcoll_unique_id_t id;
    memset(&id, 0, sizeof id);
    int fix = data[0] & 1;
    size_t n = size - 1 < sizeof id.internal ? size - 1 : sizeof id.internal;
    memcpy(id.internal, data + 1, n);
    if (fix) {
        unsigned char sum[HC_SHA256_BYTES];
        hc_sha256(id.internal, 60, sum);
        memcpy(id.internal + 60, sum, 4);
    }
    hc_uid_t u;
    if (hc_uid_decode(&id, NULL, 0, &u) != HCOLL_SUCCESS)
        return 0;
    /* What decodes encodes back to an id that decodes to the same. */
    hcoll_unique_id_t again;
    hc_uid_t u2;
    hc_uid_encode(&u, &again);
    FUZZ_CHECK(hc_uid_decode(&again, NULL, 0, &u2) == HCOLL_SUCCESS);
    FUZZ_CHECK(memcmp(u.secret, u2.secret, sizeof u.secret) == 0);
    FUZZ_CHECK(u.root.sa.sa_family == u2.root.sa.sa_family);
    FUZZ_CHECK(hc_sockaddr_port(&u.root) == hc_sockaddr_port(&u2.root));
    FUZZ_CHECK(hc_sockaddr_port(&u.root) > 0);
    /* The fields the id carries are what encode wrote back. */
    FUZZ_CHECK(memcmp(again.internal, id.internal, 8) == 0);
    FUZZ_CHECK(memcmp(again.internal + 28, id.internal + 28, HC_UID_SECRET_BYTES) == 0);
    return 0;
}
