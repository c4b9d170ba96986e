/*
 * Shared by the two halves of build/tests/gpu_probe (tests/gpu_probe.c:
 * driver facts and driver-level probes; tests/gpu_probe_coll.c: probes of
 * hcoll's device collectives with forked ranks). See gpu_probe.c.
 *
 * Output contract (scripts/gpu-check.sh and tests/gpu-probe.test.sh parse
 * it): one line per probe,
 *   PROBE <name>: PASS|FAIL|SKIP|INFO <what was observed, and why>
 * and figures as
 *   FIGURE <name>: <value> <unit> [<note>]
 * and the environment as
 *   ENV <key>: <value>
 */
#ifndef HCT_GPU_PROBE_H
#define HCT_GPU_PROBE_H

#include <stddef.h>
#include <stdint.h>

/* The raw driver calls the probes make, by their ABI names, from the
 * libcuda.so.1 hcoll itself loads (NULL: this driver lacks it). */
typedef struct pd {
    void *lib;
    int (*init)(unsigned);
    int (*driver_version)(int *);
    int (*device_get)(int *, int);
    int (*device_count)(int *);
    int (*device_name)(char *, int, int);
    int (*device_attr)(int *, int, int);
    int (*primary_retain)(void **, int);
    int (*ctx_set_current)(void *);
    int (*stream_create)(void **, unsigned);
    int (*stream_destroy)(void *);
    int (*stream_sync)(void *);
    int (*wait_value32)(void *, unsigned long long, uint32_t, unsigned);
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*mem_free)(unsigned long long);
    int (*host_alloc)(void **, size_t, unsigned);
    int (*host_free)(void *);
    int (*host_dptr)(unsigned long long *, void *, unsigned); /* optional */
    int (*alloc_managed)(unsigned long long *, size_t, unsigned); /* optional */
    int (*htod)(unsigned long long, const void *, size_t, void *);
    int (*dtoh)(void *, unsigned long long, size_t, void *);
    int (*dtod)(unsigned long long, unsigned long long, size_t, void *);
    int (*module_load)(void **, const void *);
    int (*module_unload)(void *);
    int (*begin_capture)(void *, int);
    int (*end_capture)(void *, void **);
    int (*graph_destroy)(void *);
    int (*error_name)(int, const char **);
} pd_t;

/* Loads and initialises the driver and makes GPU dev's primary context
 * current on this thread. NULL with why filled when there is none. */
const pd_t *pd_open(int dev, char *why, size_t whylen);
/* "CUDA_ERROR_..." for a CUresult (static storage). */
const char *pd_err(int r);
/* 1 when this process runs the emulated driver of tests/mock. */
int pd_is_mock(void);

/* A host word the GPU can wait on: pinned, mapped; *dptr is its device
 * address. 0 or a CUresult. */
int pd_host_flag(const pd_t *d, volatile uint32_t **flag, unsigned long long *dptr);

/* One verdict line (see above). */
void probe_say(const char *name, const char *verdict, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* How many FAIL lines were printed. */
int probe_failures(void);

/* The collective probes (gpu_probe_coll.c). Each returns 0 when it ran
 * (its verdicts printed), non-zero when it could not run at all. */
int probe_allreduce(int extra_streams);
int probe_three_stage(size_t bytes, int iters);
int probe_handles(void);
int probe_managed(void);
int probe_capture(void);
int probe_destroy(void);

#endif
