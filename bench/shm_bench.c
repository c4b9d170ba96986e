/*
 * shm_bench: all-reduce bus bandwidth of the shared-memory intra-node
 * backend, against memcpy bandwidth measured in the same run.
 *
 *   usage: shm_bench [MiB (64)] [iterations (10)] [local sizes (2,4)]
 *
 * For each L, L processes are forked; each all-reduces a float32 vector of
 * the given size (not in place) through hc_intra_shm_ops.allreduce. The
 * time of one all-reduce is the slowest rank's, averaged over the
 * iterations after a warm-up call; bus bandwidth is nccl-tests' figure,
 * bytes / time * 2 (L-1) / L. memcpy bandwidth is one process copying a
 * buffer of the same size (bytes copied / time, best of the iterations).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/config.h"
#include "base/reduce.h"
#include "intra/intra.h"

#define BENCH_MAXL 16

typedef struct bench_shared {
    int L;
    size_t chunk_bytes;
    volatile int arrived[2];
    unsigned char ag[BENCH_MAXL * 64];
    volatile double seconds[BENCH_MAXL];
    volatile int failed;
} bench_shared_t;

typedef struct bench_ag {
    bench_shared_t *sh;
    int lrank;
} bench_ag_t;

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One-shot counting barrier for the allgather (used twice, two counters). */
static int bench_arrive(volatile int *counter, int L)
{
    __atomic_add_fetch(counter, 1, __ATOMIC_SEQ_CST);
    double deadline = bench_now() + 30;
    while (__atomic_load_n(counter, __ATOMIC_SEQ_CST) < L)
        if (bench_now() > deadline)
            return -1;
        else
            usleep(100);
    return 0;
}

static hcoll_status_t bench_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    bench_ag_t *a = ctx;
    if (len * (size_t)a->sh->L > sizeof a->sh->ag)
        return HCOLL_ERR_INTERNAL;
    memcpy(a->sh->ag + (size_t)a->lrank * len, mine, len);
    if (bench_arrive(&a->sh->arrived[0], a->sh->L) != 0)
        return HCOLL_ERR_TIMEOUT;
    memcpy(all, a->sh->ag, len * (size_t)a->sh->L);
    if (bench_arrive(&a->sh->arrived[1], a->sh->L) != 0)
        return HCOLL_ERR_TIMEOUT;
    return HCOLL_SUCCESS;
}

static int bench_rank(bench_shared_t *sh, int lrank, const char *name, size_t count, int iters)
{
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    bench_ag_t ag = { sh, lrank };
    hc_intra_params_t p = {
        .local_rank = lrank, .local_size = sh->L, .name = name, .chunk_bytes = sh->chunk_bytes,
        .timeout_ms = 30000, .errbuf = &eb, .rank = lrank, .allgather = bench_allgather,
        .allgather_ctx = &ag,
    };
    hc_intra_t *ctx;
    if (hc_intra_shm_ops.create(&p, &ctx) != HCOLL_SUCCESS) {
        fprintf(stderr, "local rank %d: create: %s\n", lrank, eb.msg);
        return 1;
    }
    float *send = malloc(count * sizeof *send), *recv = malloc(count * sizeof *recv);
    if (!send || !recv)
        return 1;
    for (size_t i = 0; i < count; i++)
        send[i] = (float)((i + (size_t)lrank) % 13);
    memset(recv, 0, count * sizeof *recv);
    int rc = 0;
    /* Warm-up, which also lines the ranks up. */
    if (hc_intra_shm_ops.allreduce(ctx, send, recv, count, HCOLL_FLOAT32, HCOLL_SUM, NULL) ||
        hc_intra_shm_ops.barrier(ctx)) {
        fprintf(stderr, "local rank %d: %s\n", lrank, eb.msg);
        rc = 1;
        goto clean_intra;
    }
    double t0 = bench_now();
    for (int it = 0; it < iters; it++) {
        if (hc_intra_shm_ops.allreduce(ctx, send, recv, count, HCOLL_FLOAT32, HCOLL_SUM,
                                       NULL)) {
            fprintf(stderr, "local rank %d: %s\n", lrank, eb.msg);
            rc = 1;
            goto clean_intra;
        }
    }
    sh->seconds[lrank] = (bench_now() - t0) / iters;
clean_intra:
    hc_intra_destroy(ctx);
    free(send);
    free(recv);
    return rc;
}

static double bench_allreduce(int L, size_t bytes, size_t chunk_bytes, int iters)
{
    bench_shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return -1;
    memset(sh, 0, sizeof *sh);
    sh->L = L;
    sh->chunk_bytes = chunk_bytes;
    char name[64];
    snprintf(name, sizeof name, "/hcoll-bench-%d-%d", (int)getpid(), L);
    pid_t pids[BENCH_MAXL];
    fflush(stdout);
    for (int r = 0; r < L; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(bench_rank(sh, r, name, bytes / sizeof(float), iters));
    }
    int bad = 0;
    for (int r = 0; r < L; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    double worst = 0;
    for (int r = 0; r < L; r++)
        if (sh->seconds[r] > worst)
            worst = sh->seconds[r];
    munmap(sh, sizeof *sh);
    return bad ? -1 : worst;
}

static double bench_memcpy(size_t bytes, int iters)
{
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b)
        return -1;
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int it = 0; it < iters + 1; it++) {
        double t0 = bench_now();
        memcpy(b, a, bytes);
        __asm__ volatile("" : : "r"(b) : "memory");
        double t = bench_now() - t0;
        if (it > 0 && t < best)
            best = t;
    }
    free(a);
    free(b);
    return best;
}

/* HCOLL_CHUNK_BYTES when set, parsed by the configuration table so that a
 * malformed value is an error naming it; else 1 MiB, this benchmark's own
 * default. 0 ok, -1 with a message in err. */
static int bench_chunk_bytes(size_t *chunk_out, char *err, size_t errlen)
{
    const hc_knob_t *k = hc_knob_find("HCOLL_CHUNK_BYTES");
    int from_env = 0;
    const char *v = hc_knob_current(k, &from_env);
    if (!from_env) {
        *chunk_out = (size_t)1 << 20;
        return 0;
    }
    hc_params_t params;
    memset(&params, 0, sizeof params);
    if (hc_knob_parse(k, v, &params, err, errlen) != HCOLL_SUCCESS)
        return -1;
    *chunk_out = (size_t)params.chunk_bytes;
    return 0;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 64;
    int iters = argc > 2 ? atoi(argv[2]) : 10;
    const char *sizes = argc > 3 ? argv[3] : "2,4";
    if (mib == 0 || iters <= 0) {
        fprintf(stderr, "usage: %s [MiB] [iterations] [local sizes, e.g. 2,4]\n", argv[0]);
        return 2;
    }
    size_t bytes = mib << 20, chunk_bytes;
    char err[300];
    if (bench_chunk_bytes(&chunk_bytes, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", argv[0], err);
        return 2;
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double tcopy = bench_memcpy(bytes, iters);
    double copy_gbs = (double)bytes / tcopy / 1e9;
    printf("# shm all-reduce, float32 sum, %zu MiB, %d iterations, %ld CPUs, reduce kernels: %s\n",
           mib, iters, ncpu, hc_reduce_impl_name());
    printf("# memcpy bandwidth (1 process): %.2f GB/s\n", copy_gbs);
    printf("%4s %12s %12s %12s %10s\n", "L", "time(ms)", "algbw(GB/s)", "busbw(GB/s)",
           "busbw/memcpy");
    int rc = 0;
    for (const char *p = sizes; *p;) {
        int L = atoi(p);
        if (L >= 1 && L <= BENCH_MAXL) {
            double t = bench_allreduce(L, bytes, chunk_bytes, iters);
            if (t < 0) {
                printf("%4d  failed\n", L);
                rc = 1;
            } else {
                double alg = (double)bytes / t / 1e9;
                double bus = alg * 2.0 * (L - 1) / L;
                printf("%4d %12.2f %12.2f %12.2f %10.2f\n", L, t * 1e3, alg, bus,
                       bus / copy_gbs);
            }
        }
        const char *comma = strchr(p, ',');
        if (!comma)
            break;
        p = comma + 1;
    }
    return rc;
}
