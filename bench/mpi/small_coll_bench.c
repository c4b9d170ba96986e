/*
 * small_coll_bench: hcoll's broadcast or barrier against Open MPI's
 * MPI_Bcast / MPI_Barrier in the same processes, call by call:
 *
 *   per size, per round:  MPI_Barrier, then one call of each library, the
 *                         first library rotating round by round; a call's
 *                         time is the slowest rank's (MPI_Allreduce MAX of
 *                         each rank's time, outside the timing)
 *
 * so both libraries see the same load at the same moments. Emulates nodes
 * of --ranks-per-node ranks through HCOLL_HOSTID (Open MPI sees one host).
 * Each size first runs one checked broadcast of each library (every byte
 * of the root's pattern compared on every rank) and 5 warm-up calls.
 *
 *   mpirun --oversubscribe -np 4 --mca pml ob1 --mca btl tcp,self,vader \
 *     --mca btl_tcp_if_include lo --mca mpi_yield_when_idle 1 \
 *     bin/small_coll_bench --ranks-per-node 2 -o broadcast -b 4K -e 64K -n 200
 *
 * usage: small_coll_bench [--ranks-per-node L] [-o broadcast|barrier]
 *                         [-b MIN] [-e MAX] [-f FACTOR] [-n CALLS] [-r ROOT]
 * Prints per size median / mean / p99 (us) of both and hcoll / MPI.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hcoll.h"

#define WARMUP 5

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median, mean and p99 (nearest rank) of v[0..n), sorted here. */
static void stats(double *v, int n, double *med, double *mean, double *p99)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    *mean = s / n;
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    int k = (int)(0.99 * n + 0.999999) - 1;
    *p99 = v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

typedef struct bench {
    hcoll_comm_t comm;
    int rank, n, root, barrier;
    unsigned char *buf;
} bench_t;

/* One call of library lib (0 hcoll, 1 MPI); 0 on success. */
static int one_call(bench_t *b, int lib, size_t bytes)
{
    if (lib == 0) {
        hcoll_status_t st = b->barrier ? hcoll_barrier(b->comm)
                                       : hcoll_broadcast(b->comm, b->buf, b->buf, bytes,
                                                         HCOLL_UINT8, b->root, NULL);
        if (st != HCOLL_SUCCESS)
            fprintf(stderr, "rank %d: hcoll: %s (%s)\n", b->rank, hcoll_status_name(st),
                    hcoll_comm_last_error(b->comm));
        return st != HCOLL_SUCCESS;
    }
    return (b->barrier ? MPI_Barrier(MPI_COMM_WORLD)
                       : MPI_Bcast(b->buf, (int)bytes, MPI_BYTE, b->root, MPI_COMM_WORLD)) !=
           MPI_SUCCESS;
}

/* One broadcast of each library with the root's pattern, checked on every
 * rank; 0 when both delivered every byte. */
static int check_bcast(bench_t *b, size_t bytes)
{
    int bad = 0;
    for (int lib = 0; lib < 2; lib++) {
        for (size_t i = 0; i < bytes; i++)
            b->buf[i] = b->rank == b->root ? (unsigned char)(i * 131 + lib + 7) : 0;
        if (one_call(b, lib, bytes))
            return 1;
        for (size_t i = 0; i < bytes; i++)
            bad += b->buf[i] != (unsigned char)(i * 131 + lib + 7);
    }
    int all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    return all != 0;
}

static int run_size(bench_t *b, size_t bytes, int calls)
{
    double *t[2] = { malloc((size_t)calls * sizeof(double)),
                     malloc((size_t)calls * sizeof(double)) };
    if (!t[0] || !t[1])
        return 1;
    int rc = !b->barrier && check_bcast(b, bytes);
    if (rc && b->rank == 0)
        fprintf(stderr, "small_coll_bench: %zu bytes: WRONG broadcast result\n", bytes);
    for (int i = 0; !rc && i < WARMUP; i++)
        rc = one_call(b, 0, bytes) || one_call(b, 1, bytes);
    for (int c = 0; !rc && c < calls; c++)
        for (int k = 0; k < 2 && !rc; k++) {
            const int lib = (c + k) % 2; /* the first library rotates */
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime();
            rc = one_call(b, lib, bytes);
            double dt = (MPI_Wtime() - t0) * 1e6, slowest = 0;
            MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            t[lib][c] = slowest;
        }
    if (!rc && b->rank == 0) {
        double m[2], a[2], p[2];
        for (int lib = 0; lib < 2; lib++)
            stats(t[lib], calls, &m[lib], &a[lib], &p[lib]);
        const char *algo = "?";
        hcoll_comm_last_algo(b->comm, &algo);
        printf("%10zu  %9.1f %9.1f %9.1f  %9.1f %9.1f %9.1f  %6.2f %6.2f  %s\n", bytes, m[0],
               a[0], p[0], m[1], a[1], p[1], m[0] / m[1], a[0] / a[1], algo);
        fflush(stdout);
    }
    free(t[0]);
    free(t[1]);
    return rc;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    bench_t b = { 0 };
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.n);
    int rpn = 1, calls = 200, factor = 4;
    size_t lo = 4096, hi = 65536;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(argv[i], "--ranks-per-node") == 0)
            rpn = atoi(v), i++;
        else if (strcmp(argv[i], "-o") == 0)
            b.barrier = strcmp(v, "barrier") == 0, i++;
        else if (strcmp(argv[i], "-b") == 0)
            lo = parse_size(v), i++;
        else if (strcmp(argv[i], "-e") == 0)
            hi = parse_size(v), i++;
        else if (strcmp(argv[i], "-f") == 0)
            factor = atoi(v), i++;
        else if (strcmp(argv[i], "-n") == 0)
            calls = atoi(v), i++;
        else if (strcmp(argv[i], "-r") == 0)
            b.root = atoi(v), i++;
        else {
            if (b.rank == 0)
                fprintf(stderr, "usage: small_coll_bench [--ranks-per-node L] "
                                "[-o broadcast|barrier] [-b MIN] [-e MAX] [-f F] [-n CALLS] "
                                "[-r ROOT]\n");
            MPI_Finalize();
            return 2;
        }
    }
    if (rpn < 1 || b.n % rpn || calls < 1 || factor < 2 || b.root < 0 || b.root >= b.n) {
        if (b.rank == 0)
            fprintf(stderr, "small_coll_bench: bad arguments\n");
        MPI_Finalize();
        return 2;
    }
    if (b.barrier)
        lo = hi = 0;
    /* Emulated nodes: one host id per rpn ranks, unique to this run. */
    int job = (int)getpid();
    MPI_Bcast(&job, 1, MPI_INT, 0, MPI_COMM_WORLD);
    char hostid[64];
    snprintf(hostid, sizeof hostid, "scb-%d-node%d", job, b.rank / rpn);
    setenv("HCOLL_HOSTID", hostid, 1);
    hcoll_unique_id_t id;
    if (b.rank == 0 && hcoll_get_unique_id(&id) != HCOLL_SUCCESS)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    hcoll_status_t st = hcoll_comm_init(&b.comm, b.n, b.rank, &id, NULL);
    if (st != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: hcoll_comm_init: %s (%s)\n", b.rank, hcoll_status_name(st),
                hcoll_comm_last_error(NULL));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    b.buf = malloc(hi > 0 ? hi : 1);
    if (b.rank == 0) {
        printf("# small_coll_bench: %s, %d ranks, %d per emulated node, %d calls per size and "
               "library, alternating; us per call (slowest rank)\n",
               b.barrier ? "barrier" : "broadcast", b.n, rpn, calls);
        printf("# %8s  %9s %9s %9s  %9s %9s %9s  %6s %6s  %s\n", "bytes", "hc med", "hc mean",
               "hc p99", "mpi med", "mpi mean", "mpi p99", "med x", "mean x", "algo");
    }
    int rc = 0;
    for (size_t bytes = lo; !rc && bytes <= hi; bytes = bytes ? bytes * (size_t)factor : 1) {
        rc = run_size(&b, bytes, calls);
        if (bytes == 0)
            break;
    }
    hcoll_comm_destroy(b.comm);
    free(b.buf);
    MPI_Finalize();
    return rc;
}
