/*
 * The communicator's topology (comm.h): nodes, local ranks and rails, from
 * the rank table. Below both the communicator's lifecycle (comm.c) and the
 * executors, which all ask it where ranks are.
 */
#include "core/comm.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"


hcoll_status_t hc_comm_topo_build(struct hcoll_comm *c)
{
    const int n = c->nranks;
    int *node_of = calloc((size_t)n, sizeof *node_of);
    int *local_of = calloc((size_t)n, sizeof *local_of);
    int *start = calloc((size_t)n + 1, sizeof *start);
    int *ranks = calloc((size_t)n, sizeof *ranks);
    int *first = calloc((size_t)n, sizeof *first); /* first rank of node k */
    if (!node_of || !local_of || !start || !ranks || !first) {
        free(node_of), free(local_of), free(start), free(ranks), free(first);
        return hc_err_set(&c->err, HC_INIT, c->rank, HCOLL_ERR_NO_MEMORY,
                          "topology: out of memory");
    }
    int nnodes = 0;
    for (int r = 0; r < n; r++) {
        int k = 0;
        while (k < nnodes && c->peers[first[k]].hostid != c->peers[r].hostid)
            k++;
        if (k == nnodes)
            first[nnodes++] = r;
        node_of[r] = k;
        start[k + 1]++;
    }
    for (int k = 0; k < nnodes; k++)
        start[k + 1] += start[k];
    /* Fill each node's slice in rank order: local rank = position. */
    int *fill = first; /* reused as a cursor per node */
    for (int k = 0; k < nnodes; k++)
        fill[k] = start[k];
    for (int r = 0; r < n; r++) {
        int k = node_of[r];
        local_of[r] = fill[k] - start[k];
        ranks[fill[k]++] = r;
    }
    free(first);

    int uniform = 1;
    for (int k = 1; k < nnodes; k++)
        uniform &= start[k + 1] - start[k] == start[1] - start[0];

    free(c->node_of), free(c->local_of), free(c->node_start), free(c->node_ranks);
    c->node_of = node_of;
    c->local_of = local_of;
    c->node_start = start;
    c->node_ranks = ranks;
    c->nnodes = nnodes;
    c->uniform = uniform;
    c->node = node_of[c->rank];
    c->local_rank = local_of[c->rank];
    c->local_size = start[c->node + 1] - start[c->node];
    return HCOLL_SUCCESS;
}

void hc_comm_rails_resolve(struct hcoll_comm *c)
{
    for (int r = 0; r < c->nranks; r++)
        if (c->peers[r].rail < 0)
            c->peers[r].rail = c->local_of[r];
}

int hc_comm_node_size(const struct hcoll_comm *c, int node)
{
    if (node < 0 || node >= c->nnodes)
        return 0;
    return c->node_start[node + 1] - c->node_start[node];
}

int hc_comm_rank_at(const struct hcoll_comm *c, int node, int local)
{
    if (local < 0 || local >= hc_comm_node_size(c, node))
        return -1;
    return c->node_ranks[c->node_start[node] + local];
}

void hc_comm_topo_log(const struct hcoll_comm *c)
{
    if (!hc_log_enabled(HC_LOG_INFO, HC_INIT))
        return;
    char as[80], gpu[32] = "no current GPU";
    const hc_peer_t *me = &c->peers[c->rank];
    if (c->gpu >= 0)
        snprintf(gpu, sizeof gpu, "GPU %d", c->gpu);
    const hc_iface_t *rail = &me->addrs[me->rail % me->naddrs];
    HC_INFO(HC_INIT, c->rank,
            "rank %d/%d: node %d/%d '%s', local rank %d/%d, rail %d via %s %s (%d address%s), "
            "%s",
            c->rank, c->nranks, c->node, c->nnodes, me->host, c->local_rank, c->local_size,
            me->rail, rail->name, hc_sockaddr_str(&rail->addr, as, sizeof as), me->naddrs,
            me->naddrs == 1 ? "" : "es", gpu);
    if (c->rank != 0)
        return;
    HC_INFO(HC_INIT, 0, "topology: %d ranks on %d node%s, %s, %s", c->nranks, c->nnodes,
            c->nnodes == 1 ? "" : "s",
            c->authenticated ? "authenticated rendezvous" : "UNAUTHENTICATED rendezvous",
            c->uniform ? "same number of ranks on every node" : "nodes differ in size");
    for (int k = 0; k < c->nnodes; k++) {
        char line[700];
        size_t o = 0;
        const int r0 = hc_comm_rank_at(c, k, 0);
        for (int l = 0; l < hc_comm_node_size(c, k) && o < sizeof line - 80; l++) {
            const int r = hc_comm_rank_at(c, k, l);
            const hc_peer_t *p = &c->peers[r];
            const hc_iface_t *f = &p->addrs[p->rail % p->naddrs];
            o += (size_t)snprintf(line + o, sizeof line - o, "%s rank %d (pid %d) rail %d %s %s",
                                  l ? ";" : "", r, p->pid, p->rail, f->name,
                                  hc_sockaddr_str(&f->addr, as, sizeof as));
        }
        HC_INFO(HC_INIT, 0, "node %d '%s' (%d ranks):%s", k, c->peers[r0].host,
                hc_comm_node_size(c, k), line);
    }
    if (!c->uniform) {
        char sizes[256];
        size_t o = 0;
        for (int k = 0; k < c->nnodes && o < sizeof sizes - 16; k++)
            o += (size_t)snprintf(sizes + o, sizeof sizes - o, "%s%d", k ? "," : "",
                                  hc_comm_node_size(c, k));
        HC_INFO(HC_INIT, 0,
                "flat ring only: nodes have %s ranks (the three-stage plan needs the same "
                "number on every node)", sizes);
    }
}
