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
 * Secret: HCOLL_SECRET, hashed into the bootstrap's pre-key, which the
 * rendezvous stretches with HCOLL_KDF_ITERS PBKDF2 iterations over a salt
 * rank 0 draws (boot.h); one shorter than 16 characters, or than 32 hex
 * digits when it is all hex (128 bits), gets a WARN. Unset, init refuses
 * to run (HCOLL_ERR_INVALID_ARG saying what to set) unless the root
 * address is loopback (every rank is then on this host) or
 * HCOLL_ALLOW_UNAUTHENTICATED=1; it then runs with the public key.
 *
 * Host names (HCOLL_ROOT, MASTER_ADDR, a Slurm node) resolve within
 * HCOLL_TIMEOUT_MS: a numeric address is parsed at once (AI_NUMERICHOST,
 * never blocks); a name is looked up on a detached helper thread that the
 * caller waits for up to the timeout, since getaddrinfo itself cannot be
 * cancelled or bounded (glibc's getaddrinfo_a runs the same kind of
 * thread, and its gai_cancel cannot stop a lookup in progress either).
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
    uint32_t kdf_iters;     /* for hc_boot_args_t.kdf_iters: 0 with the public key */
} hc_launch_t;

/*
 * Read the launch variables through getenv_fn(name, ctx). HCOLL_SUCCESS
 * with *out filled, or HCOLL_ERR_INVALID_ARG recorded in eb (NULL: the
 * thread's buffer) with a message that names the variable. Resolves the
 * rendezvous host name (getaddrinfo), so it may block on DNS up to
 * HCOLL_TIMEOUT_MS. Logs only the weak-secret WARN; the caller wipes
 * out->key when done with it.
 */
hcoll_status_t hc_launch_read(hc_getenv_fn getenv_fn, void *ctx, hc_errbuf_t *eb,
                              hc_launch_t *out);

/* 1 when a is a loopback address (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104). */
int hc_launch_is_loopback(const hc_sockaddr_t *a);

/* 1 when secret is weak: fewer than 16 characters, or all hex digits and
 * fewer than 32 of them (under 128 bits). */
int hc_launch_secret_weak(const char *secret);

#define HC_LAUNCH_SLURM_PORT_BASE 12000
#define HC_LAUNCH_SLURM_PORT_SPAN 20000
#define HC_LAUNCH_SLURM_PORT_MULT 7919 /* prime: jobs of one step number spread out */

/* The rendezvous port of Slurm step (job, step), see above. */
int hc_launch_slurm_port(unsigned long long job, unsigned long long step);

#endif
