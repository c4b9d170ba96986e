/* The bootstrap's 16-byte header and its helpers (boot/wire.c) on any 16
 * bytes, plus an ERROR text through hc_bwire_sanitize: a sane header has
 * the magic, the version and an error text within its cap, and packs back
 * to the same bytes; a sanitized text is printable ASCII. */
#include "fuzz.h"

#include "boot/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < HC_BWIRE_HDR_BYTES)
        return 0;
    hc_bwire_hdr_t h;
    char why[96];
    hc_bwire_unpack(data, &h);
    memset(why, 'x', sizeof why);
    if (hc_bwire_sane(&h, why, sizeof why)) {
        FUZZ_CHECK(h.magic == HC_BWIRE_MAGIC && h.version == HC_BWIRE_VERSION);
        FUZZ_CHECK(h.type >= HC_BMSG_CHALLENGE);
        if (h.type == HC_BMSG_ERROR)
            FUZZ_CHECK(h.len <= HC_BWIRE_ERRTEXT_MAX);
        unsigned char again[HC_BWIRE_HDR_BYTES];
        hc_bwire_pack(again, h.type, h.len, h.arg);
        FUZZ_CHECK(memcmp(again, data, HC_BWIRE_HDR_BYTES) == 0);
    } else {
        fuzz_check_err(why, sizeof why);
    }
    hcoll_status_t st = hc_bwire_status(h.arg);
    FUZZ_CHECK(st != HCOLL_SUCCESS && hcoll_status_name(st) != NULL);
    FUZZ_CHECK(hc_bwire_op_name(h.arg >> 24) != NULL);
    char *text = fuzz_str(data + HC_BWIRE_HDR_BYTES, size - HC_BWIRE_HDR_BYTES);
    hc_bwire_sanitize(text);
    for (const char *c = text; *c; c++)
        FUZZ_CHECK(*c >= 0x20 && *c < 0x7f);
    free(text);
    return 0;
}
