/* Slurm host lists (boot/hostlist.c): SLURM_JOB_NODELIST and the like,
 * "node[01-04,7],gpu-[1-2]a". Every host expanded must be a non-empty
 * string under HC_HOSTLIST_NAME_MAX; the first host agrees with the
 * expansion's first. */
#include "fuzz.h"

#include "boot/hostlist.h"

typedef struct seen {
    int count;
    char first[HC_HOSTLIST_NAME_MAX];
} seen_t;

static int on_host(const char *host, void *ctx)
{
    seen_t *s = ctx;
    size_t len = strlen(host);
    FUZZ_CHECK(len > 0 && len < HC_HOSTLIST_NAME_MAX);
    if (s->count++ == 0)
        memcpy(s->first, host, len + 1);
    return s->count >= 4096; /* a list of a million hosts is valid: stop early */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *list = fuzz_str(data, size);
    char err[256], host[HC_HOSTLIST_NAME_MAX];
    seen_t s = { 0, "" };
    hcoll_status_t st = hc_hostlist_expand(list, on_host, &s, err, sizeof err);
    if (st != HCOLL_SUCCESS)
        fuzz_check_err(err, sizeof err);
    hcoll_status_t st1 = hc_hostlist_first(list, host, sizeof host, err, sizeof err);
    FUZZ_CHECK((st == HCOLL_SUCCESS) == (st1 == HCOLL_SUCCESS) || s.count == 0);
    if (st == HCOLL_SUCCESS && st1 == HCOLL_SUCCESS && s.count > 0)
        FUZZ_CHECK(strcmp(host, s.first) == 0);
    free(list);
    return 0;
}
