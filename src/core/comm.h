/*
 * The communicator: who is where, and the bootstrap that found it out.
 *
 * Topology, the same on every rank because every rank derives it from the
 * same rank table:
 *   - a node is a set of ranks with the same host id; nodes are numbered by
 *     their lowest rank;
 *   - a rank's local rank is its index among its node's ranks in rank
 *     order; local rank i drives rail i (the i-th address of its node);
 *   - uniform: every node has the same number of local ranks, which the
 *     three-stage plan needs; otherwise only the flat ring is possible.
 *
 * The data plane (core/coll.h: transport, ring, intra-node backend,
 * threads) hangs off comm->coll; destroy and abort free it with
 * hc_coll_destroy before the bootstrap goes.
 *
 * Files: comm.c the lifecycle (init, free, abort), topo.c the topology;
 * the public entry points are in src/api.
 */
#ifndef HC_CORE_COMM_H
#define HC_CORE_COMM_H

#include <stdatomic.h>
#include <stdint.h>

#include "boot/boot.h"
#include "base/config.h"
#include "base/err.h"
#include "hcoll.h"
#include "sys/ifaces.h"

#define HC_HOST_LABEL_MAX 64
/* Bytes of the record each rank sends at the rendezvous (layout in comm.c);
 * part of the authenticated handshake, so versions that differ fail clearly. */
#define HC_COMM_REC_BYTES (88 + HC_IFACE_MAX * 40)

/* What each rank told the others about itself at the rendezvous. */
typedef struct hc_peer {
    uint64_t hostid;
    char host[HC_HOST_LABEL_MAX]; /* HCOLL_HOSTID, else the host name */
    int pid;
    int naddrs;                   /* >= 1 */
    hc_iface_t addrs[HC_IFACE_MAX]; /* in rail order; ports are 0 */
} hc_peer_t;

struct hcoll_comm {
    hc_errbuf_t err;
    hc_params_t params;

    int rank, nranks;
    int local_rank, local_size;
    int gpu;            /* CUDA device current at init, -1 none (hcoll.h) */
    int node, nnodes;
    int uniform;        /* every node has local_size ranks */
    int *node_of;       /* [nranks] node index of each rank */
    int *local_of;      /* [nranks] local rank of each rank */
    int *node_start;    /* [nnodes+1] node n's ranks are */
    int *node_ranks;    /* node_ranks[node_start[n] .. node_start[n+1]), by local rank */
    hc_peer_t *peers;   /* [nranks] */

    hc_boot_t *boot;
    int authenticated;  /* the rendezvous checked a shared secret */

    atomic_int async_error; /* hcoll_status_t: first background failure */
    atomic_int aborted;

    struct hc_coll *coll; /* the data plane and executor (core/coll.h) */
};

/* Rank with local rank `local` on node `node`, or -1 when there is none. */
int hc_comm_rank_at(const struct hcoll_comm *c, int node, int local);

/* Number of ranks on node n. */
int hc_comm_node_size(const struct hcoll_comm *c, int node);

/* Record a background failure; only the first one sticks. Thread-safe. */
static inline void hc_comm_set_async_error(struct hcoll_comm *c, hcoll_status_t st)
{
    int expected = HCOLL_SUCCESS;
    atomic_compare_exchange_strong(&c->async_error, &expected, (int)st);
}

/* Free c and everything it holds: the data plane (aborting: peers may be
 * dead; do not wait for them, fail pending operations with
 * HCOLL_ERR_ABORTED), then the bootstrap. */
void hc_comm_free(struct hcoll_comm *c, int aborting);

/* hcoll_comm_abort: mark c aborted, wake whatever is blocked, free it. */
void hc_comm_abort(struct hcoll_comm *c);

/*
 * Fill node_of/local_of/node_start/node_ranks/nnodes/uniform and this
 * rank's node/local_rank/local_size from c->peers[].hostid. Allocates the
 * arrays (freed by destroy). Exposed so tests can check placements that
 * forked ranks cannot easily produce (interleaved nodes).
 */
hcoll_status_t hc_comm_topo_build(struct hcoll_comm *c);

/* Log the topology at INFO (INIT): rank 0 one line per node, every rank
 * one line about itself. */
void hc_comm_topo_log(const struct hcoll_comm *c);

#endif
