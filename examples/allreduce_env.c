/*
 * The smallest complete hcoll program: join the job described by the
 * launcher's environment, all-reduce a vector of floats, check the result.
 *
 *   HCOLL_RANK=0 HCOLL_NRANKS=2 HCOLL_ROOT=127.0.0.1:29500 ./allreduce_env &
 *   HCOLL_RANK=1 HCOLL_NRANKS=2 HCOLL_ROOT=127.0.0.1:29500 ./allreduce_env
 *
 * or under mpirun / srun / torchrun, which set their own variables.
 */
#include <hcoll.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        hcoll_status_t st_ = (call);                                             \
        if (st_ != HCOLL_SUCCESS) {                                              \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, hcoll_strerror(st_),  \
                    hcoll_comm_last_error(comm));                                \
            hcoll_comm_destroy(comm);                                            \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char **argv)
{
    size_t count = argc > 1 ? strtoull(argv[1], NULL, 0) : 1 << 20;
    hcoll_comm_t comm = NULL;

    if (hcoll_version() != HCOLL_VERSION_CODE) {
        fprintf(stderr, "header %d but library %d\n", HCOLL_VERSION_CODE, hcoll_version());
        return 1;
    }
    CHECK(hcoll_comm_init_env(&comm, NULL));

    int rank, size, local_rank, local_size, nodes;
    CHECK(hcoll_comm_rank(comm, &rank));
    CHECK(hcoll_comm_size(comm, &size));
    CHECK(hcoll_comm_local_rank(comm, &local_rank));
    CHECK(hcoll_comm_local_size(comm, &local_size));
    CHECK(hcoll_comm_node_count(comm, &nodes));

    float *buf = malloc(count * sizeof *buf);
    if (!buf && count) {
        hcoll_comm_destroy(comm);
        return 1;
    }
    /* Small integers: their sum is exact in any order. */
    for (size_t i = 0; i < count; i++)
        buf[i] = (float)((rank + i) % 7);

    CHECK(hcoll_allreduce(comm, buf, buf, count, HCOLL_FLOAT32, HCOLL_SUM, NULL));

    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < size; r++)
            want += (float)((r + i) % 7);
        wrong += buf[i] != want;
    }
    printf("rank %d of %d (%d nodes, local rank %d of %d): %zu floats, %zu wrong\n", rank, size,
           nodes, local_rank, local_size, count, wrong);
    free(buf);
    CHECK(hcoll_comm_destroy(comm));
    return wrong ? 1 : 0;
}
