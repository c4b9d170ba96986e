/*
 * The verbs (libibverbs RC) transport: its settings, whether it can run
 * for a rank, and what tests can reach without an RDMA device. The
 * transport itself is hc_ib_ops (transport.h); its internals are in
 * ib_priv.h.
 *
 * libibverbs is loaded at run time (dlopen "libibverbs.so.1") into a table
 * filled once per process; libhcoll never links it, so the library loads
 * and runs over TCP on hosts without it. The transport never reads the
 * environment: its settings come from the communicator's hc_params_t
 * (hc_transport_params_t.settings).
 */
#ifndef HC_INTER_IB_H
#define HC_INTER_IB_H

#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "inter/ib/mr_cache.h"
#include "inter/transport.h"
#include "sys/ibdev.h"

/* The verbs settings of one transport instance, copied from hc_params_t. */
typedef struct hc_ib_config {
    char sysfs_root[256];  /* "/" on a real host */
    char hca[256];         /* HCOLL_IB_HCA */
    long gid_index;        /* HCOLL_IB_GID_INDEX, -1 auto */
    int tc, sl;            /* HCOLL_IB_TC, HCOLL_IB_SL */
    int timeout, retry_cnt;/* HCOLL_IB_TIMEOUT (4.096 us * 2^t), HCOLL_IB_RETRY_CNT */
    int gdr_level;         /* HCOLL_NET_GDR_LEVEL (enum hc_pci_dist) */
    int64_t gdr_flush;     /* HCOLL_GDR_FLUSH: -1 auto, 0, 1 */
    int spin_us;           /* HCOLL_IB_SPIN_US */
    int qps_per_peer;      /* HCOLL_IB_QPS_PER_PEER (1..4) */
    int relaxed_ordering;  /* HCOLL_IB_PCI_RELAXED_ORDERING: -1 auto, 0, 1 */
} hc_ib_config_t;

/* The verbs part of p (already validated by hc_params_load). */
void hc_ib_config_from_params(const hc_params_t *p, hc_ib_config_t *cfg_out);

/*
 * Can this host run the verbs transport with these settings? 1 when
 * libibverbs loads and an ACTIVE port passes the HCA list (under
 * cfg->sysfs_root) for this local rank, ordered by distance to GPU gpu
 * (-1: none) as create orders them; 0 with the reason in why
 * ("libibverbs not loadable: ...", "no RDMA device found ...",
 * "no ACTIVE port matching HCOLL_IB_HCA=...").
 */
int hc_ib_usable(const hc_ib_config_t *cfg, int local_rank, int gpu, hc_ib_choice_t *choice_out,
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

#endif
