/*
 * The launcher environment, read in one place: what hcoll_comm_init_env
 * needs to join a job (rank, size, rendezvous address, shared secret)
 * from the variables a launcher sets.
 *
 * Rank and size: the first launcher whose rank variable is set decides,
 * and its size variable must be set too:
 *   hcoll      HCOLL_RANK            HCOLL_NRANKS
 *   Open MPI   OMPI_COMM_WORLD_RANK  OMPI_COMM_WORLD_SIZE
 *   Slurm      SLURM_PROCID          SLURM_NTASKS
 *   torchrun   RANK                  WORLD_SIZE
 * Rendezvous: HCOLL_ROOT ("host:port", "[v6]:port"), else MASTER_ADDR and
 * MASTER_PORT. Secret: HCOLL_SECRET, hashed into the bootstrap key; unset,
 * the public key (peers are not authenticated).
 *
 * A variable that is empty counts as unset. The HCOLL_* ones are parsed
 * by the configuration table (base/config.h), so a malformed value is
 * rejected as every knob is, naming the variable.
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
    const char *launcher;   /* "hcoll", "Open MPI", "Slurm" or "torchrun" */
    hc_sockaddr_t root;     /* where rank 0 listens */
    const char *root_from;  /* "HCOLL_ROOT" or "MASTER_ADDR/MASTER_PORT" */
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

#endif
