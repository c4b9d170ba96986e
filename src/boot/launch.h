/*
 * The launcher environment, read in one place: what hcoll_comm_init_env
 * needs to join a job (rank, size, rendezvous address, shared secret)
 * from the variables a launcher sets.
 *
 * Rank and size: the first launcher present decides, and both of its
 * variables must be set:
 *   1 hcoll      HCOLL_RANK            HCOLL_NRANKS      (HCOLL_RANK set)
 *   2 torchrun   RANK                  WORLD_SIZE        (TORCHELASTIC_RUN_ID
 *                                      set, or LOCAL_RANK, RANK and WORLD_SIZE)
 *   3 Open MPI   OMPI_COMM_WORLD_RANK  OMPI_COMM_WORLD_SIZE
 *   4 Slurm      SLURM_PROCID          SLURM_NTASKS
 *   5 torch env  RANK                  WORLD_SIZE        (RANK set, alone)
 * torchrun before Slurm: under `srun torchrun`, SLURM_PROCID is the node's
 * task, shared by all its workers. Open MPI before Slurm: mpirun inside an
 * allocation.
 *
 * Rendezvous, never on a port a launcher owns:
 *   1 HCOLL_ROOT ("host:port", "[v6]:port"), always first;
 *   2 else MASTER_ADDR and MASTER_PORT + HCOLL_ROOT_PORT_OFFSET (default
 *     1; both MASTER_* or neither; the sum must stay <= 65535), since
 *     MASTER_PORT is torch's own TCPStore (torchrun's agent, or
 *     init_process_group's);
 *   3 else, when Slurm gave the rank (srun alone): the first host of
 *     SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST),
 *     expanded from Slurm's compressed syntax (boot/hostlist.h) and
 *     resolved with getaddrinfo, port hc_launch_slurm_port(SLURM_JOB_ID,
 *     SLURM_STEP_ID) = 12000 + (job * 7919 + step) mod 20000, the same on
 *     every rank of a step, different for the steps of a job, and below the
 *     kernel's ephemeral range (32768-60999). The node's name must resolve
 *     to the same reachable address on every node (as MASTER_ADDR must; a
 *     name that maps to 127.0.1.1 in rank 0's /etc/hosts does not), and
 *     rank 0 must run on that first host (Slurm's block and cyclic
 *     distributions put it there; a rank 0 whose SLURM_NODEID is not 0 is
 *     refused, naming HCOLL_ROOT);
 *   4 else an error that says what to set.
 * Secret: HCOLL_SECRET, hashed into the bootstrap key; unset, the public
 * key (peers are not authenticated).
 *
 * A variable that is empty counts as unset. The HCOLL_* ones are parsed
 * by the configuration table (base/config.h), so a malformed value is
 * rejected as every knob is, naming the variable; every other malformed
 * value is rejected naming its variable too.
 *
 * The environment comes through a lookup function, so that tests can pass
 * a synthetic one without touching the process's.
 */
#ifndef HC_BOOT_LAUNCH_H
#define HC_BOOT_LAUNCH_H

#include "base/err.h"
#include "boot/boot.h"
#include "hcoll.h"
#include "sys/ifaces.h"

/* The value of name, or NULL when unset. */
typedef const char *(*hc_getenv_fn)(const char *name, void *ctx);

/* The process environment (getenv); ctx is unused. */
const char *hc_launch_process_env(const char *name, void *ctx);

typedef struct hc_launch {
    int rank, nranks;
    /* "hcoll", "torchrun", "Open MPI", "Slurm" or "RANK/WORLD_SIZE" */
    const char *launcher;
    hc_sockaddr_t root;     /* where rank 0 listens */
    /* "HCOLL_ROOT", "MASTER_ADDR/MASTER_PORT+HCOLL_ROOT_PORT_OFFSET", or
     * the Slurm node-list variable used */
    const char *root_from;
    int authenticated;      /* 1: key is from HCOLL_SECRET; 0: the public key */
    unsigned char key[HC_BOOT_KEY_BYTES];
} hc_launch_t;

/*
 * Read the launch variables through getenv_fn(name, ctx). HCOLL_SUCCESS
 * with *out filled, or HCOLL_ERR_INVALID_ARG recorded in eb (NULL: the
 * thread's buffer) with a message that names the variable. Resolves the
 * rendezvous host name (getaddrinfo), so it may block on DNS. Logs nothing
 * else; the caller wipes out->key when done with it.
 */
hcoll_status_t hc_launch_read(hc_getenv_fn getenv_fn, void *ctx, hc_errbuf_t *eb,
                              hc_launch_t *out);

#define HC_LAUNCH_SLURM_PORT_BASE 12000
#define HC_LAUNCH_SLURM_PORT_SPAN 20000
#define HC_LAUNCH_SLURM_PORT_MULT 7919 /* prime: jobs of one step number spread out */

/* The rendezvous port of Slurm step (job, step), see above. */
int hc_launch_slurm_port(unsigned long long job, unsigned long long step);

#endif
