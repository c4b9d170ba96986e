/*
 * mpi_allreduce_bench: Open MPI's MPI_Allreduce (float32 sum, out of place)
 * timed like ring_bench's (a): best of `reps` rounds of `iters` calls, bus
 * bandwidth = bytes / t * 2(n-1)/n. Run it by scripts/bench-ring.sh:
 *   mpirun --allow-run-as-root --oversubscribe -np N --mca pml ob1 \
 *     --mca btl tcp,self --mca btl_tcp_if_include lo bin/mpi_allreduce_bench
 * usage: mpi_allreduce_bench [bytes] [iters] [reps]
 * Prints "RESULT_MPI n=.. bytes=.. busbw=.." (GB/s = 1e9 bytes/s).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (64u << 20);
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    size_t count = bytes / sizeof(float);
    float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        send[i] = (float)(i % 17), recv[i] = 0;
    for (int i = 0; i < 2; i++)
        MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters;
        best = t < best ? t : best;
    }
    int ok = recv[5] == (float)(5 * n);
    if (rank == 0) {
        double busbw = (double)bytes / best / 1e9 * 2 * (n - 1) / n;
        printf("# MPI_Allreduce n=%d %zu bytes: %.2f ms, busbw %.3f GB/s%s\n", n, bytes,
               best * 1e3, busbw, ok ? "" : " (WRONG RESULT)");
        printf("RESULT_MPI n=%d bytes=%zu busbw=%.4f\n", n, bytes, busbw);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return ok ? 0 : 1;
}
