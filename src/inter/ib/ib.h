/*
 * The verbs (libibverbs RC) transport: its settings, the per-rank device
 * choice the communicator wires in, and what tests can reach without an
 * RDMA device. The transport itself is hc_ib_ops (transport.h).
 *
 * libibverbs is loaded at run time (dlopen "libibverbs.so.1") into a table
 * filled once per process; libhcoll never links it, so the library loads
 * and runs over TCP on hosts without it.
 */
#ifndef HC_INTER_IB_H
#define HC_INTER_IB_H

#include <stddef.h>
#include <stdint.h>

#include "inter/transport.h"
#include "sys/ibdev.h"

/* Settings of one verbs transport instance (the HCOLL_IB_* knobs and the
 * rank's device). hc_ib_config_from_env fills it as hc_ib_ops.create does. */
typedef struct hc_ib_config {
    char sysfs_root[256];  /* "/" on a real host */
    char hca[256];         /* HCOLL_IB_HCA */
    long gid_index;        /* HCOLL_IB_GID_INDEX, -1 auto */
    int tc, sl;            /* HCOLL_IB_TC, HCOLL_IB_SL */
    int timeout, retry_cnt;/* HCOLL_IB_TIMEOUT (4.096 us * 2^t), HCOLL_IB_RETRY_CNT */
    int gdr_level;         /* HCOLL_NET_GDR_LEVEL (enum hc_pci_dist) */
    int64_t gdr_flush;     /* HCOLL_GDR_FLUSH: -1 auto, 0, 1 */
    int gpu;               /* CUDA device ordinal of this rank, -1 none */
    int local_rank;        /* picks the NIC; -1: use params->rail */
} hc_ib_config_t;

/* Defaults overridden by the environment (HCOLL_IB_*). Returns
 * HCOLL_SUCCESS or HCOLL_ERR_INVALID_ARG with the message in err. */
hcoll_status_t hc_ib_config_from_env(hc_ib_config_t *cfg_out, char *err, size_t errlen);

/* create() with explicit settings (hc_ib_ops.create reads the environment
 * and uses params->rail as the local rank). */
hcoll_status_t hc_ib_create(const hc_transport_params_t *params, const hc_ib_config_t *cfg,
                            hc_transport_t **tr_out);

/*
 * Can this host run the verbs transport with these settings? 1 when
 * libibverbs loads and an ACTIVE port passes the HCA list (under
 * cfg->sysfs_root, for the local rank); 0 with the reason in why
 * ("libibverbs not loadable: ...", "no RDMA device found ...",
 * "no ACTIVE port matching HCOLL_IB_HCA=...").
 */
int hc_ib_usable(const hc_ib_config_t *cfg, int local_rank, hc_ib_choice_t *choice_out,
                 char *why, size_t whylen);

/* libibverbs loadable (once per process)? why gets dlopen's reason. */
int hc_ib_verbs_loadable(char *why, size_t whylen);

/* Text for an ibv_wc_status with what to check, e.g. for 12:
 * "transport retry counter exceeded: peer unreachable over RoCE — check
 * GID index, traffic class/PFC and that both NICs reach each other". */
const char *hc_ib_wc_status_text(int status, int roce);

/* IB MTU enum (1..5) of the smaller of two ends; bytes ↔ enum. */
int hc_ib_mtu_min(int a, int b);
int hc_ib_mtu_bytes(int mtu_enum);

/* ---- registration cache (ib_mr.c), generic so tests can drive it -------- */

typedef struct hc_mrc_entry {
    void *base;
    size_t len;
    uint64_t gen;      /* allocation id (CUDA buffer id; 0 for host) */
    int refs;
    uint64_t last_use;
    void *handle;      /* what reg returned (struct ibv_mr *) */
    int dmabuf_fd;     /* -1 unless registered through dma-buf */
    struct hc_mrc_entry *next;
} hc_mrc_entry_t;

typedef struct hc_mrc {
    hc_mrc_entry_t *list;
    int count, max_idle;     /* idle (refs == 0) entries kept */
    uint64_t tick;
    uint64_t hits, misses;
    void (*dereg)(void *ctx, hc_mrc_entry_t *e);
    void *ctx;
} hc_mrc_t;

void hc_mrc_init(hc_mrc_t *c, int max_idle, void (*dereg)(void *, hc_mrc_entry_t *), void *ctx);
/* An entry covering [base, base+len) of allocation gen, with a reference
 * taken; NULL on a miss. */
hc_mrc_entry_t *hc_mrc_find(hc_mrc_t *c, void *base, size_t len, uint64_t gen);
/* Adopt a fresh registration (refs = 1). */
void hc_mrc_insert(hc_mrc_t *c, hc_mrc_entry_t *e);
/* Drop a reference; idle entries beyond max_idle are deregistered, least
 * recently used first. */
void hc_mrc_release(hc_mrc_t *c, hc_mrc_entry_t *e);
/* Deregister everything (transport teardown). */
void hc_mrc_fini(hc_mrc_t *c);

#endif
