/* NCCL-style name lists (sys/envlist.c): HCOLL_SOCKET_IFNAME, HCOLL_IB_HCA,
 * "^=mlx5_0:1,mlx5_1". The input is the list, then (after the first NUL)
 * a name and port to match, and the natural-order comparison of the two. */
#include "fuzz.h"

#include "sys/envlist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *spec = fuzz_str(data, size);
    size_t slen = strlen(spec);
    const char *name = slen < size ? spec + slen + 1 : "";
    char *nm = fuzz_str((const uint8_t *)name, slen < size ? size - slen - 1 : 0);
    hc_list_t list;
    char err[256];
    if (hc_list_parse(spec, &list, err, sizeof err) == HCOLL_SUCCESS) {
        FUZZ_CHECK(list.count >= 0 && list.count <= HC_LIST_MAX_ENTRIES);
        for (int i = 0; i < list.count; i++) {
            FUZZ_CHECK(memchr(list.entries[i].name, '\0', HC_LIST_NAME_MAX) != NULL);
            FUZZ_CHECK(list.entries[i].port >= -1);
        }
        int port = nm[0] ? (unsigned char)nm[0] : -1;
        int m = hc_list_match(&list, nm, port);
        FUZZ_CHECK(m == 0 || m == 1);
        (void)hc_list_names(&list, nm);
        if (list.count > 0)
            (void)hc_list_match(&list, list.entries[0].name, list.entries[0].port);
    } else {
        fuzz_check_err(err, sizeof err);
    }
    int c = hc_name_natcmp(spec, nm), r = hc_name_natcmp(nm, spec);
    FUZZ_CHECK((c < 0 && r > 0) || (c > 0 && r < 0) || (c == 0 && r == 0));
    FUZZ_CHECK(hc_name_natcmp(spec, spec) == 0);
    free(nm);
    free(spec);
    return 0;
}
