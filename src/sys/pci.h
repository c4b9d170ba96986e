/*
 * PCI paths and the distance between two devices, in NCCL's classes, from
 * sysfs under a root directory (sysfs.h) so tests run on fixture trees.
 *
 *            CPU0 ══════ SMP interconnect ══════ CPU1          SYS
 *       pci0000:00 (host bridge)           pci0000:80
 *        │root port │root port               │
 *        │          └── NIC c                └── NIC d       GPU↔c: PHB
 *     switch up                                              GPU↔d: SYS
 *      ┌──┴──────┐
 *     down      down
 *      │         │
 *     GPU       NIC a                                        GPU↔a: PIX
 *
 *   LOC  same device (functions of one BDF)
 *   PIX  through one PCIe switch (at most one bridge below the common one
 *        on each side)
 *   PXB  through several PCIe bridges, never the host bridge
 *   PHB  through a host bridge: different root ports of one root complex,
 *        or root complexes on the same NUMA node
 *   SYS  across the SMP interconnect (different NUMA nodes, or unknown)
 *
 * The numeric order is HCOLL_NET_GDR_LEVEL's (enum hc_gdr_level):
 * LOC=0 .. SYS=4, so "distance <= level" is the GPUDirect test.
 * Depends on nothing of ours but sysfs.
 */
#ifndef HC_SYS_PCI_H
#define HC_SYS_PCI_H

#include <stddef.h>

enum hc_pci_dist { HC_PCI_LOC = 0, HC_PCI_PIX, HC_PCI_PXB, HC_PCI_PHB, HC_PCI_SYS };

#define HC_PCI_PATH_MAX 512

/* "LOC", "PIX", ... ; "?" for anything else. */
const char *hc_pci_dist_name(int dist);

/* The resolved sysfs device path of an RDMA device
 * (/sys/devices/pci0000:00/0000:00:01.0/.../0000:03:00.0). Returns 0 or
 * -errno (virtual devices such as rxe have no PCI device). */
int hc_pci_ibdev_path(const char *root, const char *ibdev, char *out, size_t outlen);

/* The same for a PCI bus id ("0000:3b:00.0", as cuDeviceGetPCIBusId gives;
 * case-insensitive) through /sys/bus/pci/devices. */
int hc_pci_bdf_path(const char *root, const char *bdf, char *out, size_t outlen);

/* Distance class between two resolved device paths. root is used to read
 * each device's numa_node when they sit under different root complexes. */
int hc_pci_distance(const char *root, const char *path_a, const char *path_b);

#endif
