/*
 * The communicator: who is where, and the bootstrap that found it out.
 *
 * Topology, the same on every rank because every rank derives it from the
 * same rank table:
 *   - a node is a set of ranks with the same host id; nodes are numbered by
 *     their lowest rank;
 *   - a rank's local rank is its index among its node's ranks in rank
 *     order; its rail (hc_peer_t.rail) is its local rank unless it asked
 *     for another (HCOLL_RAIL, config rail, or a split keeping the
 *     parent's), and it binds the rail-th address of its node;
 *   - uniform: every node has the same number of local ranks, which the
 *     three-stage plan needs; otherwise only the flat ring is possible.
 *
 * The data plane (core/coll.h: transport, ring, intra-node backend,
 * threads) hangs off comm->coll; destroy and abort free it with
 * hc_coll_destroy before the bootstrap goes.
 *
 * Files: comm.c the lifecycle (init, blocking or in the background; free,
 * abort), topo.c the topology and rails, split.c hcoll_comm_split;
 * the public entry points are in src/api.
 */
#ifndef HC_CORE_COMM_H
#define HC_CORE_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "boot/boot.h"
#include "base/config.h"
#include "base/err.h"
#include "base/pid.h"
#include "hcoll.h"
#include "sys/ifaces.h"

#define HC_HOST_LABEL_MAX 64
/* Bytes of the record each rank sends at the rendezvous (layout in comm.c);
 * part of the authenticated handshake, so versions that differ fail clearly. */
#define HC_COMM_REC_BYTES (92 + HC_IFACE_MAX * 40)

/* What each rank told the others about itself at the rendezvous. */
typedef struct hc_peer {
    uint64_t hostid;
    char host[HC_HOST_LABEL_MAX]; /* HCOLL_HOSTID, else the host name */
    int pid;
    int naddrs;                   /* >= 1 */
    hc_iface_t addrs[HC_IFACE_MAX]; /* in rail order; ports are 0 */
    /* Its rail: the rail-th address (wrapping) is the one it binds, and
     * verbs picks its NIC with it. The record carries the rank's request
     * (-1: default); hc_comm_rails_resolve turns -1 into the local rank. */
    int rail;
} hc_peer_t;

/* What a communicator's set-up needs beyond its configuration: the
 * rendezvous (hcoll_comm_init, hcoll_comm_init_env) or a split's child
 * bootstrap (split.c). */
typedef struct hc_comm_init {
    int nranks, rank;
    hc_sockaddr_t root;
    int listen_fd; /* root only, else -1; consumed in every case */
    unsigned char key[HC_BOOT_KEY_BYTES];
    int authenticated;
    int rail;      /* this rank's rail when params.rail is -1; -1: local rank */
    uint32_t kdf_iters; /* hc_boot_args_t.kdf_iters: > 0 stretches key (init_env) */
} hc_comm_init_t;

struct hc_comm_setup; /* comm.c: what the set-up thread works from */

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
    /* The rendezvous key, kept so that split can derive its children's
     * keys without sending a secret (split.c); zeroed when c is freed. */
    unsigned char key[HC_BOOT_KEY_BYTES];

    /* Set-up (hcoll.h's blocking = 0): HCOLL_SUCCESS once the communicator
     * is ready, HCOLL_IN_PROGRESS while the set-up thread runs, else the
     * set-up's error. Written with release by the set-up thread; everything
     * but rank/nranks/err is read only after an acquire load shows
     * HCOLL_SUCCESS (hc_comm_ready). */
    atomic_int setup_state;
    int cancel_fd;            /* eventfd: readable cancels the set-up's waits */
    int setup_joinable;       /* the set-up thread has not been joined */
    pthread_t setup_thread;
    struct hc_comm_setup *setup;

    atomic_int async_error; /* hcoll_status_t: first background failure */
    atomic_int aborted;

    struct hc_coll *coll; /* the data plane and executor (core/coll.h) */

    /* PREMUL_SUM ops made on this communicator (core/redop.h). */
    pthread_mutex_t op_lock;
    struct hc_premul *premul; /* [npremul] slots */
    int npremul;
    unsigned op_tag;          /* tells this communicator's handles from others' */

    /* The process that created it. A forked child inherits the memory but
     * not the threads, and shares the sockets and segments with the
     * parent: it must neither use nor tear down any of them. */
    int owner_pid;
};

/* 1 in a process forked from the one that created c (hc_comm_ready and
 * destroy/abort refuse there). */
static inline int hc_comm_forked(const struct hcoll_comm *c)
{
    return hc_pid() != c->owner_pid;
}

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

/* HCOLL_SUCCESS when c is ready for collectives and topology queries;
 * else HCOLL_IN_PROGRESS (recorded in c->err with `what`) or the set-up's
 * error (its message already in c->err). Thread-safe. */
hcoll_status_t hc_comm_ready(struct hcoll_comm *c, const char *what);

/* Create a communicator from ia; params NULL: load them from config. Blocks
 * or runs the set-up in the background as params.blocking says (then
 * returns HCOLL_IN_PROGRESS with *comm_out set). Errors of a failed create
 * are in the calling thread's buffer. ia->listen_fd is consumed. */
hcoll_status_t hc_comm_create(hc_comm_init_t *ia, const hcoll_config_t *config,
                              const hc_params_t *params, hcoll_comm_t *comm_out);

/* hcoll_comm_split (split.c) on a ready parent p. args_ok 0: this rank's
 * arguments were bad (already recorded): it still takes part in the
 * exchange, so every rank fails with HCOLL_ERR_INVALID_ARG at once. */
hcoll_status_t hc_comm_split(struct hcoll_comm *p, int color, int key,
                             const hcoll_config_t *config, int args_ok, hcoll_comm_t *newcomm_out);

/* Resolve every peer's rail request (-1: its local rank) once the topology
 * is known (topo.c). */
void hc_comm_rails_resolve(struct hcoll_comm *c);

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
