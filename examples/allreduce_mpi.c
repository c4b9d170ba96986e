/*
 * hcoll inside an MPI program: MPI launches the ranks and carries the
 * unique id; hcoll does the all-reduce. Rank 0 makes the id, MPI_Bcast
 * copies its bytes to everyone, every rank joins with hcoll_comm_init.
 *
 *   mpicc allreduce_mpi.c -lhcoll -o allreduce_mpi
 *   mpirun -np 4 ./allreduce_mpi [count]
 *
 * The id holds a secret: whoever has it can join, so send it only over a
 * channel the job trusts (MPI's own, here). The result is checked against
 * MPI_Allreduce on the same data.
 */
#include <hcoll.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(hcoll_comm_t comm, const char *what, hcoll_status_t st)
{
    fprintf(stderr, "%s failed: %s (%s)\n", what, hcoll_strerror(st), hcoll_comm_last_error(comm));
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t count = argc > 1 ? strtoull(argv[1], NULL, 0) : 1 << 20;

    /* One id per communicator, made on rank 0's host, copied byte for byte. */
    hcoll_unique_id_t id;
    hcoll_status_t st = HCOLL_SUCCESS;
    if (rank == 0)
        st = hcoll_get_unique_id(&id);
    MPI_Bcast(&st, sizeof st, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (st != HCOLL_SUCCESS)
        return fail(NULL, "hcoll_get_unique_id", st);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);

    hcoll_comm_t comm;
    st = hcoll_comm_init(&comm, size, rank, &id, NULL);
    if (st != HCOLL_SUCCESS)
        return fail(NULL, "hcoll_comm_init", st);
    int nodes, local_size;
    hcoll_comm_node_count(comm, &nodes);
    hcoll_comm_local_size(comm, &local_size);

    float *buf = malloc(count * sizeof *buf), *ref = malloc(count * sizeof *ref);
    if ((!buf || !ref) && count)
        return fail(comm, "malloc", HCOLL_ERR_NO_MEMORY);
    for (size_t i = 0; i < count; i++)
        buf[i] = (float)((rank * 3 + i) % 11); /* small integers: exact sums */
    MPI_Allreduce(buf, ref, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

    double t0 = MPI_Wtime();
    st = hcoll_allreduce(comm, buf, buf, count, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    double t = MPI_Wtime() - t0;
    if (st != HCOLL_SUCCESS)
        return fail(comm, "hcoll_allreduce", st);

    long wrong = 0, all_wrong;
    for (size_t i = 0; i < count; i++)
        wrong += buf[i] != ref[i];
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%d ranks on %d nodes (%d per node): %zu floats in %.2f ms, %ld wrong "
               "against MPI_Allreduce\n", size, nodes, local_size, count, t * 1e3, all_wrong);
    free(buf);
    free(ref);
    hcoll_comm_destroy(comm);
    MPI_Finalize();
    return rank == 0 && all_wrong ? 1 : 0;
}
