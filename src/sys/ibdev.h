/*
 * RDMA devices as sysfs shows them, under a root directory (sysfs.h):
 *
 *   sys/class/infiniband/<dev>/ports/<p>/state          "4: ACTIVE"
 *                                       /link_layer     InfiniBand | Ethernet
 *                                       /rate           "200 Gb/sec (4X HDR)"
 *                                       /gids/<i>       fe80:0000:...:1234
 *                                       /gid_attrs/types/<i>  "RoCE v2"
 *   sys/class/infiniband/<dev>/device → the PCI device (pci.h)
 *
 * Which device each local rank uses, which GID a RoCE port uses, and the
 * line rate of a NIC, all without libibverbs, so that the choice can be
 * tested on fixtures and shown by hcoll_info on any host. The verbs
 * transport cross-checks with ibv_query_port at run time (active MTU is
 * only known there). Depends on nothing of ours but sysfs, pci, envlist.
 * Errors follow the sys convention (sys/sysfs.h).
 */
#ifndef HC_SYS_IBDEV_H
#define HC_SYS_IBDEV_H

#include <stddef.h>
#include <stdint.h>

#include "hcoll.h"
#include "sys/sysfs.h"

#define HC_IBDEV_MAX_PORTS 64
#define HC_IBDEV_MAX_GIDS  256

enum hc_ib_link { HC_IB_LINK_UNKNOWN = 0, HC_IB_LINK_IB = 1, HC_IB_LINK_ETH = 2 };
enum hc_gid_type { HC_GID_TYPE_UNKNOWN = 0, HC_GID_TYPE_IB, HC_GID_TYPE_ROCE_V1,
                   HC_GID_TYPE_ROCE_V2 };

typedef struct hc_ibport {
    char dev[HC_SYSFS_NAME_MAX];
    int port;
    int active;              /* state reads "... ACTIVE" */
    char state[32];          /* as sysfs has it, "4: ACTIVE" */
    int link_layer;          /* enum hc_ib_link */
    char rate[64];           /* as sysfs has it, "" when unreadable */
    double rate_gbps;        /* parsed; 0 when unknown */
    int active_mtu;          /* bytes; 0 = unknown (only verbs knows it) */
    int pci_dist;            /* to the rank's GPU (enum hc_pci_dist), -1 none */
} hc_ibport_t;

typedef struct hc_gid_entry {
    int index;
    uint8_t raw[16];
    int type; /* enum hc_gid_type */
} hc_gid_entry_t;

/* "InfiniBand"/"RoCE" (the link layer as NCCL names it in its log). */
const char *hc_ib_link_name(int link_layer);
const char *hc_gid_type_name(int type);

/* "200 Gb/sec (4X HDR)" → 200.0, "2.5 Gb/sec (1X SDR)" → 2.5. Returns the
 * rate in Gb/s, or -1 when s does not start with "<number> Gb/sec" (also
 * accepts "Mb/sec"). */
double hc_ibdev_parse_rate(const char *s);

/* Line rate of one port in whole Gb/s (rounded); 0 when unknown. */
int hc_ibdev_rate_gbps(const char *root, const char *dev, int port);

/* Every port of every device, in natural (dev, port) order, whatever its
 * state. Returns the count (0 when there is no sys/class/infiniband). */
int hc_ibdev_scan(const char *root, hc_ibport_t *ports, int max);

/* "fe80:0000:...:1234" (sysfs) → 16 bytes. Returns 0 or -1. */
int hc_gid_parse(const char *s, uint8_t raw[16]);
/* Compact text: "::ffff:10.0.0.1", "fe80::1". */
void hc_gid_format(const uint8_t raw[16], char *out, size_t outlen);
int hc_gid_is_zero(const uint8_t raw[16]);
int hc_gid_is_link_local(const uint8_t raw[16]);
/* IPv4-mapped (::ffff:a.b.c.d); *ip_out in network order when non-NULL. */
int hc_gid_is_ipv4(const uint8_t raw[16], uint32_t *ip_out);

/* The non-zero entries of a port's GID table, in index order. Returns the
 * count. */
int hc_ibdev_gids(const char *root, const char *dev, int port, hc_gid_entry_t *out, int max);

/*
 * The GID index a port uses:
 *   forced >= 0 (HCOLL_IB_GID_INDEX): that index, whatever it holds (a zero
 *     entry is an error: the peer could never reach it);
 *   InfiniBand: 0;
 *   RoCE: a RoCE v2 GID holding an IPv4-mapped address (the one holding
 *     prefer_ip, network order, when non-zero), else a RoCE v2 global IPv6
 *     GID; zero and link-local (fe80) GIDs never.
 * HCOLL_SUCCESS with the index, its GID and a one-line reason in why; or,
 * with what the table holds in why, HCOLL_ERR_INVALID_ARG for an empty
 * forced index and HCOLL_ERR_RDMA when no GID is usable.
 */
hcoll_status_t hc_ibdev_gid_choose(const char *root, const char *dev, int port, int link_layer,
                                   long forced, uint32_t prefer_ip, int *index_out,
                                   hc_gid_entry_t *gid_out, char *why, size_t whylen);

/*
 * The ports HCOLL_IB_HCA (NCCL list syntax, NULL/"" = all) allows, ACTIVE
 * only, ordered by PCI distance to the GPU at gpu_path (a resolved sysfs
 * path, NULL without a GPU) then natural name and port. Bonded devices
 * (mlx5_bond_*) are ordinary devices. HCOLL_SUCCESS with their number in
 * *count_out (0 is an answer, not an error), or HCOLL_ERR_INVALID_ARG with
 * a message in err for a malformed list.
 */
hcoll_status_t hc_ibdev_select(const char *root, const char *hca_spec, const char *gpu_path,
                               hc_ibport_t *out, int max, int *count_out, char *err,
                               size_t errlen);

/* The NIC of one local rank. */
typedef struct hc_ib_choice {
    hc_ibport_t port;
    int index;          /* position in the selected list: the [5] of the log */
    int nselected;      /* ports that passed the filter */
    int gid_index;      /* -1 when no GID could be chosen (then ok = 0) */
    hc_gid_entry_t gid;
    char gid_why[160];
} hc_ib_choice_t;

/*
 * Local rank i takes the i-th selected port (modulo their number); with a
 * GPU, the i-th among the ports nearest to it, so each GPU gets its own
 * nearest NIC on rail-optimized nodes. The GID is chosen as above.
 * HCOLL_SUCCESS, or a message in err saying what was found:
 * HCOLL_ERR_INVALID_ARG for a malformed list or an empty forced GID index,
 * HCOLL_ERR_RDMA for no sys/class/infiniband, no ACTIVE port, none
 * matching the list or no usable GID.
 */
hcoll_status_t hc_ibdev_for_rank(const char *root, const char *hca_spec, int local_rank,
                                 const char *gpu_path, long gid_index, uint32_t prefer_ip,
                                 hc_ib_choice_t *choice_out, char *err, size_t errlen);

#endif
