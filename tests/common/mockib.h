/*
 * Tests on the emulated libibverbs (tests/mock/verbs.c, built as
 * $HCOLL_TEST_BUILD/mock/libibverbs.so.1) and the sysfs fixture trees:
 * entering the emulation, checking its counters, and the parameters that
 * build a verbs transport on it.
 *
 * A verbs transport on the emulation, in a forked rank:
 *
 *   hc_errbuf_t eb;            hc_params_t settings;
 *   hc_transport_params_t tp;  hc_transport_t *tr;
 *   hct_ib_params(rank, n, &eb, &settings, &tp);   // reads HCOLL_* here
 *   settings.sysfs_root / gdr_level ...;           // optional overrides
 *   tp.has_gpu = 1; tp.gpu = 0;                    // optional: GPUDirect
 *   hc_ib_ops.create(&tp, &tr);  hc_ib_ops.connect(tr, ..., allgather, ...);
 */
#ifndef HCT_MOCKIB_H
#define HCT_MOCKIB_H

#include <check.h>
#include <stddef.h>

#include "base/config.h"
#include "base/err.h"
#include "inter/transport.h"

/*
 * First thing in main. dlopen reads LD_LIBRARY_PATH when the process
 * starts, so this re-executes the program with
 * LD_LIBRARY_PATH=$HCOLL_TEST_BUILD/mock and HCOLL_SYSFS_ROOT (when unset)
 * = tests/fixtures/sysfs-roce. Returns 0 in the re-executed program, once
 * the libibverbs.so.1 it loads is the emulation; otherwise the code main
 * returns (77: skipped, with the reason printed).
 */
int hct_mockib_enter(char **argv);

/* Run every case of s; main's exit code (0: all passed). */
int hct_mockib_run(Suite *s);

/* The emulated CUDA driver ($HCOLL_TEST_BUILD/mock/libcuda.so.1) into
 * path; 1 when it is built. */
int hct_mock_cuda_built(char *path, size_t len);

/* Rank checks (0 or 1, printing why), from the emulation's counters: no
 * RNR, CQ overrun, drop or retry happened (and, with need_writes, some
 * RDMA write went through); every verbs object is released. */
int hct_mock_clean(const char *who, int need_writes);
int hct_mock_released(const char *who);

/* tp for a verbs transport of rank of n on the loopback address, on the
 * first allowed port (rail 0), 10 s deadline, no GPU, errors into eb;
 * *settings is loaded from the environment and tp points at it. Returns
 * hc_params_load's status (its message in eb). */
hcoll_status_t hct_ib_params(int rank, int n, hc_errbuf_t *eb, hc_params_t *settings,
                             hc_transport_params_t *tp);

#endif
