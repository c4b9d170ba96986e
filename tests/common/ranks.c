#include "common/ranks.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double hct_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void *hct_shared_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

void hct_shared_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}

int hct_barrier_wait(hct_barrier_t *b, int nranks, int timeout_ms)
{
    int gen = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == nranks) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&b->generation, 1, __ATOMIC_RELEASE);
        return 0;
    }
    double deadline = hct_now_ms() + timeout_ms;
    while (__atomic_load_n(&b->generation, __ATOMIC_ACQUIRE) == gen) {
        if (hct_now_ms() > deadline)
            return -1;
        usleep(200);
    }
    return 0;
}

int hct_share_unique_id(hct_id_slot_t *slot, int rank, int timeout_ms, hcoll_unique_id_t *id_out)
{
    if (rank == 0) {
        hcoll_status_t st = hcoll_get_unique_id(&slot->id);
        if (st != HCOLL_SUCCESS) {
            fprintf(stderr, "hcoll_get_unique_id: %s (%s)\n", hcoll_status_name(st),
                    hcoll_comm_last_error(NULL));
            return -1;
        }
        __atomic_store_n(&slot->ready, 1, __ATOMIC_RELEASE);
    } else {
        double deadline = hct_now_ms() + timeout_ms;
        while (!__atomic_load_n(&slot->ready, __ATOMIC_ACQUIRE)) {
            if (hct_now_ms() > deadline) {
                fprintf(stderr, "rank %d: no unique id from rank 0 within %d ms\n", rank,
                        timeout_ms);
                return -1;
            }
            usleep(500);
        }
    }
    *id_out = slot->id;
    return 0;
}

#if defined(__SANITIZE_THREAD__)
static void *tsan_warm(void *arg)
{
    return arg;
}
#endif

int hct_run(const hct_opts_t *opts, hct_rank_fn fn, void *arg, hct_result_t *results)
{
    const int n = opts->nranks;
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!pids)
        return n;
    memset(results, 0, (size_t)n * sizeof *results);
    const double t0 = hct_now_ms();
    /* Each run gets its own host-id namespace so that concurrent or
     * successive runs never merge their emulated nodes. */
    static int run_seq;
    run_seq++;

    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGKILL);
            for (int k = 0; k < r; k++)
                waitpid(pids[k], NULL, 0);
            free(pids);
            return n;
        }
        if (pid == 0) {
            /* Die with the test rather than linger if the parent is killed. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (opts->ranks_per_node > 0) {
                char hostid[64];
                snprintf(hostid, sizeof hostid, "hct-%d-%d-node%d", (int)getppid(), run_seq,
                         r / opts->ranks_per_node);
                setenv("HCOLL_HOSTID", hostid, 1);
            }
#if defined(__SANITIZE_THREAD__)
            /* ThreadSanitizer starts a thread of its own at the first
             * pthread_create: have it before a rank counts its threads
             * (leak checks), under make test-tsan. */
            pthread_t t;
            if (pthread_create(&t, NULL, tsan_warm, NULL) == 0)
                pthread_join(t, NULL);
#endif
            int rc = fn(r, n, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc & 0xff);
        }
        pids[r] = pid;
    }
    if (opts->on_started)
        opts->on_started(pids, n, arg);

    int remaining = n;
    const double deadline = t0 + (opts->timeout_ms > 0 ? opts->timeout_ms : 60000);
    while (remaining > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno != EINTR)
            break;
        if (pid > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] != pid)
                    continue;
                results[r].seconds = (hct_now_ms() - t0) / 1e3;
                if (WIFEXITED(status)) {
                    results[r].exited = 1;
                    results[r].code = WEXITSTATUS(status);
                } else if (WIFSIGNALED(status)) {
                    results[r].signaled = 1;
                    results[r].sig = WTERMSIG(status);
                }
                pids[r] = 0;
                remaining--;
            }
            continue;
        }
        if (hct_now_ms() > deadline) {
            for (int r = 0; r < n; r++) {
                if (pids[r] > 0) {
                    results[r].killed = 1;
                    kill(pids[r], SIGKILL);
                }
            }
        }
        usleep(1000);
    }

    int bad = 0;
    for (int r = 0; r < n; r++) {
        if (!(results[r].exited && results[r].code == 0)) {
            bad++;
            fprintf(stderr, "rank %d: %s %d%s after %.2f s\n", r,
                    results[r].exited ? "exit code" : "signal",
                    results[r].exited ? results[r].code : results[r].sig,
                    results[r].killed ? " (killed at the deadline)" : "", results[r].seconds);
        }
    }
    free(pids);
    return bad;
}
