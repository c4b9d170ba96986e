/*
 * Helpers for the tests on the emulated libibverbs (mockib.h).
 */
#include "common/mockib.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranks.h"

static const char *build_dir(void)
{
    const char *build = getenv("HCOLL_TEST_BUILD");
    return build && *build ? build : "build";
}

static int reexec(char **argv)
{
    char mock[PATH_MAX], dir[PATH_MAX], lib[PATH_MAX + 32];
    snprintf(mock, sizeof mock, "%s/mock", build_dir());
    snprintf(lib, sizeof lib, "%s/libibverbs.so.1", mock);
    if (access(lib, R_OK) != 0 || !realpath(mock, dir)) {
        printf("SKIP: %s not built (make tests)\n", lib);
        return 77;
    }
    const char *old = getenv("LD_LIBRARY_PATH");
    size_t ldlen = strlen(dir) + (old ? strlen(old) : 0) + 2;
    char *ld = malloc(ldlen);
    if (!ld)
        return 1;
    snprintf(ld, ldlen, "%s%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
    setenv("LD_LIBRARY_PATH", ld, 1);
    free(ld);
    if (!getenv("HCOLL_SYSFS_ROOT")) {
        char root[PATH_MAX];
        if (!realpath("tests/fixtures/sysfs-roce", root)) {
            printf("SKIP: tests/fixtures/sysfs-roce not found (run from the source tree)\n");
            return 77;
        }
        setenv("HCOLL_SYSFS_ROOT", root, 1);
    }
    setenv("HCMOCK_IB_TEST_CHILD", "1", 1);
    execv("/proc/self/exe", argv);
    perror("execv /proc/self/exe");
    return 1;
}

int hct_mockib_enter(char **argv)
{
    if (!getenv("HCMOCK_IB_TEST_CHILD"))
        return reexec(argv);
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("FAIL: dlopen libibverbs.so.1: %s (LD_LIBRARY_PATH=%s)\n", dlerror(),
               getenv("LD_LIBRARY_PATH"));
        return 1;
    }
    const char *(*who)(void) = (const char *(*)(void))dlsym(h, "hcmock_verbs");
    if (!who || strcmp(who(), "hcoll-mock-verbs") != 0) {
        printf("FAIL: the libibverbs.so.1 found is not the mock (LD_LIBRARY_PATH=%s)\n",
               getenv("LD_LIBRARY_PATH"));
        return 1;
    }
    return 0; /* the handle stays: the emulation lives for the whole run */
}

int hct_mockib_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

int hct_mock_cuda_built(char *path, size_t len)
{
    snprintf(path, len, "%s/mock/libcuda.so.1", build_dir());
    return access(path, R_OK) == 0;
}

typedef uint64_t (*stat_fn)(const char *);

int hct_mock_clean(const char *who, int need_writes)
{
    static const char *const bad[] = { "rnr_naks", "cq_overruns", "dropped_conns",
                                       "muted_conns", "retry_exceeded", "loc_prot_errors" };
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    HCT_REQUIRE(h, "%s: libibverbs.so.1 is not loaded: hcoll did not use verbs", who);
    stat_fn stat = (stat_fn)dlsym(h, "hcmock_verbs_stat");
    HCT_REQUIRE(stat, "%s: not the mock", who);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        HCT_REQUIRE(stat(bad[i]) == 0, "%s: the mock counted %llu %s", who,
                    (unsigned long long)stat(bad[i]), bad[i]);
    HCT_REQUIRE(!need_writes || stat("writes") > 0, "%s: no RDMA write went through the mock",
                who);
    dlclose(h);
    return 0;
}

/* A leaked MR pins memory, a leaked QP keeps a peer's connection half
 * open. */
int hct_mock_released(const char *who)
{
    static const char *const live[] = { "live_contexts", "live_pds", "live_mrs", "live_cqs",
                                        "live_qps" };
    void *h = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_NOW);
    HCT_REQUIRE(h, "%s: libibverbs.so.1 is not loaded", who);
    stat_fn stat = (stat_fn)dlsym(h, "hcmock_verbs_stat");
    HCT_REQUIRE(stat, "%s: not the mock", who);
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
        HCT_REQUIRE(stat(live[i]) == 0, "%s: %llu verbs object(s) left after teardown (%s)", who,
                    (unsigned long long)stat(live[i]), live[i]);
    dlclose(h);
    return 0;
}

hcoll_status_t hct_ib_params(int rank, int n, hc_errbuf_t *eb, hc_params_t *settings,
                             hc_transport_params_t *tp)
{
    hc_errbuf_init(eb);
    char err[256];
    hcoll_status_t st = hc_params_load(settings, NULL, err, sizeof err);
    if (st != HCOLL_SUCCESS) {
        snprintf(eb->msg, sizeof eb->msg, "%s", err);
        return st;
    }
    hc_transport_params_t p = {
        .rank = rank,
        .nranks = n,
        .bind_addr = "127.0.0.1",
        .ifname = "lo",
        .rail = 0,
        .log_rank = rank,
        .timeout_ms = 10000,
        .nsocks_perpeer = 1,
        .errbuf = eb,
        .has_gpu = 0,
        .gpu = -1,
        .settings = settings,
    };
    *tp = p;
    return HCOLL_SUCCESS;
}
