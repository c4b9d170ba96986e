/*
 * Multi-rank tests on one host: fork R ranks, group them into emulated
 * nodes through HCOLL_HOSTID, collect each rank's result, and kill them all
 * after a deadline so that a test never hangs.
 *
 * Rank functions run in forked children: they must not use ck_assert (its
 * messages belong to the Check child); they return 0 for success or a
 * non-zero code, printing why on stderr (HCT_REQUIRE does both).
 */
#ifndef HCT_RANKS_H
#define HCT_RANKS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "hcoll.h"

typedef struct hct_result {
    int exited;     /* exited normally: code is valid */
    int code;
    int signaled;   /* died of a signal: sig is valid */
    int sig;
    int killed;     /* killed by the harness at the deadline */
    double seconds; /* from start to exit */
} hct_result_t;

typedef int (*hct_rank_fn)(int rank, int nranks, void *arg);

/* Options for hct_run; zero-initialise and set what you need. */
typedef struct hct_opts {
    int nranks;
    int ranks_per_node;   /* >0: HCOLL_HOSTID = "hct-<pid>-node<r/rpn>"; 0: leave env */
    int timeout_ms;       /* whole run; ranks alive after it are SIGKILLed */
    /* Optional: called in the parent once all ranks are forked, with their
     * pids, e.g. to kill one mid-operation. */
    void (*on_started)(const pid_t *pids, int nranks, void *arg);
} hct_opts_t;

/* Run fn on every rank. results (nranks entries) gets each rank's outcome.
 * Returns the number of ranks that did not exit with code 0. */
int hct_run(const hct_opts_t *opts, hct_rank_fn fn, void *arg, hct_result_t *results);

/* Memory shared by all ranks of the next hct_run (mmap'd MAP_SHARED before
 * the fork). Freed with hct_shared_free. */
void *hct_shared_alloc(size_t bytes);
void hct_shared_free(void *p, size_t bytes);

/* A counting barrier in shared memory with a deadline: returns 0, or -1
 * when the deadline passed (a rank died). Initialise to zero. */
typedef struct hct_barrier {
    volatile int count;
    volatile int generation;
} hct_barrier_t;
int hct_barrier_wait(hct_barrier_t *b, int nranks, int timeout_ms);

/* Unique id passing for hcoll_comm_init tests: rank 0 creates the id and
 * publishes it in *slot (shared memory); the others wait for it. Returns
 * 0, or -1 after timeout_ms. */
typedef struct hct_id_slot {
    volatile int ready;
    hcoll_unique_id_t id;
} hct_id_slot_t;
int hct_share_unique_id(hct_id_slot_t *slot, int rank, int timeout_ms, hcoll_unique_id_t *id_out);

/* Milliseconds since an arbitrary point, monotonic. */
double hct_now_ms(void);

#define HCT_REQUIRE(cond, ...)                                                  \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: rank check failed: %s: ", __FILE__, __LINE__, \
                    #cond);                                                     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            return 1;                                                           \
        }                                                                       \
    } while (0)

/* Status check inside a rank function: prints the call and last error. */
#define HCT_OK(comm, call)                                                      \
    do {                                                                        \
        hcoll_status_t hct_st_ = (call);                                        \
        if (hct_st_ != HCOLL_SUCCESS) {                                         \
            fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call, \
                    hcoll_status_name(hct_st_), hcoll_comm_last_error(comm));   \
            return 1;                                                           \
        }                                                                       \
    } while (0)

/* Skip a whole test binary: prints the reason and exits with 77, which
 * tests/run.sh reports as skipped. */
#define HCT_SKIP_ALL(...)                                                       \
    do {                                                                        \
        printf("SKIP: ");                                                       \
        printf(__VA_ARGS__);                                                    \
        printf("\n");                                                           \
        return 77;                                                              \
    } while (0)

#endif
