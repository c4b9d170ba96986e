/*
 * The ranks' side of the emulated cluster's split case (cluster-test.sh):
 * init from the launcher's variables, split, all-reduce in the children
 * concurrently, check every element exactly.
 *
 *   split_ranks rail BYTES0 BYTES1 ITERS   color = local rank: one
 *       communicator of one rank per node per rail; local rank 0's group
 *       all-reduces BYTES0, the others BYTES1, so the per-rail byte counters
 *       show which group ran on which rail
 *   split_ranks node BYTES0 BYTES1 ITERS   color = node: intra-node
 *       communicators, BYTES0 each; nothing may cross the rails
 *
 * Placement as netcluster.sh launches: rank = node * L + local rank.
 * Exit 0 when every check holds; prints one line per rank.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hcoll.h"

#define CHECK(comm, call)                                                                     \
    do {                                                                                \
        hcoll_status_t st_ = (call);                                                    \
        if (st_ != HCOLL_SUCCESS) {                                                     \
            fprintf(stderr, "split_ranks: %s: %s (%s)\n", #call, hcoll_status_name(st_), \
                    hcoll_comm_last_error(comm));                                       \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[1], "rail") != 0 && strcmp(argv[1], "node") != 0)) {
        fprintf(stderr, "usage: split_ranks rail|node BYTES0 BYTES1 ITERS\n");
        return 2;
    }
    const int by_rail = strcmp(argv[1], "rail") == 0;
    const size_t b0 = strtoull(argv[2], NULL, 0), b1 = strtoull(argv[3], NULL, 0);
    const int iters = atoi(argv[4]);
    hcoll_comm_t w, c;
    int rank, nranks, lr, L;
    CHECK(NULL, hcoll_comm_init_env(&w, NULL));
    CHECK(w, hcoll_comm_rank(w, &rank));
    CHECK(w, hcoll_comm_size(w, &nranks));
    CHECK(w, hcoll_comm_local_rank(w, &lr));
    CHECK(w, hcoll_comm_local_size(w, &L));
    const int node = rank / L, nnodes = nranks / L;
    CHECK(w, hcoll_comm_split(w, by_rail ? lr : node, rank, NULL, &c));

    int crank, csize, cnodes, expect = 0;
    CHECK(c, hcoll_comm_rank(c, &crank));
    CHECK(c, hcoll_comm_size(c, &csize));
    CHECK(c, hcoll_comm_node_count(c, &cnodes));
    if (by_rail) {
        for (int k = 0; k < nnodes; k++)
            expect += k * L + lr + 1;
        if (csize != nnodes || cnodes != nnodes || crank != node) {
            fprintf(stderr, "split_ranks: rail group: rank %d of %d on %d nodes\n", crank, csize,
                    cnodes);
            return 1;
        }
    } else {
        for (int l = 0; l < L; l++)
            expect += node * L + l + 1;
        if (csize != L || cnodes != 1 || crank != lr) {
            fprintf(stderr, "split_ranks: node group: rank %d of %d on %d nodes\n", crank, csize,
                    cnodes);
            return 1;
        }
    }

    const size_t n = (by_rail && lr != 0 ? b1 : b0) / sizeof(int32_t);
    int32_t *v = malloc(n * sizeof *v + 1);
    if (!v)
        return 1;
    long wrong = 0;
    for (int it = 0; it < iters; it++) {
        for (size_t i = 0; i < n; i++)
            v[i] = (rank + 1) * (int32_t)(i % 97 + 1);
        CHECK(c, hcoll_allreduce(c, v, v, n, HCOLL_INT32, HCOLL_SUM, NULL));
        for (size_t i = 0; i < n; i++)
            wrong += v[i] != expect * (int32_t)(i % 97 + 1);
    }
    free(v);
    printf("split_ranks: rank %d (node %d, local rank %d): %s group rank %d of %d, %zu bytes x "
           "%d, #wrong %ld\n",
           rank, node, lr, argv[1], crank, csize, n * sizeof(int32_t), iters, wrong);
    CHECK(NULL, hcoll_comm_destroy(c));
    CHECK(NULL, hcoll_comm_destroy(w));
    return wrong != 0;
}
