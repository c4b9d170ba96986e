/*
 * GPU memory and the NIC: what kind of memory a pointer is, how device
 * memory can be registered for RDMA, and whether GPUDirect is used for a
 * GPU/NIC pair.
 *
 *   pointer ──cuPointerGetAttribute──► host | device | managed
 *   device memory ──► dma-buf   (cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr)
 *                 └─► peermem   (ibv_reg_mr on the device pointer; nvidia-peermem)
 *                 └─► staging   (pinned host bounce buffer)
 *   GPU ↔ NIC PCI distance (sys/pci.h) <= HCOLL_NET_GDR_LEVEL ──► GPUDirect on
 *
 * The CUDA driver is loaded at run time (dlopen libcuda.so.1) once per
 * process into an immutable table: libhcoll has no link-time CUDA
 * dependency and runs on hosts without a driver (every pointer is then host
 * memory). Probes of the kernel take a root directory (sys/sysfs.h) so
 * tests run them on fixture trees.
 */
#ifndef HC_GDR_H
#define HC_GDR_H

#include <stddef.h>
#include <stdint.h>

enum hc_mem_kind { HC_MEM_HOST = 0, HC_MEM_DEVICE = 1, HC_MEM_MANAGED = 2 };
enum hc_gdr_reg { HC_GDR_REG_STAGING = 0, HC_GDR_REG_PEERMEM = 1, HC_GDR_REG_DMABUF = 2 };

/* What the kernel offers, read under root. */
typedef struct hc_gdr_caps {
    int peermem;          /* nvidia-peermem (or the older nv_peer_mem) is loaded */
    char peermem_how[96]; /* which file told us */
    int dmabuf_kernel;    /* kernel >= 5.12: RDMA dma-buf import exists */
    char kernel[64];      /* osrelease, "" when unreadable */
} hc_gdr_caps_t;

/* Probe root/sys/kernel/mm/memory_peers/nv_mem/version,
 * root/sys/module/nvidia_peermem, root/sys/module/nv_peer_mem and
 * root/proc/sys/kernel/osrelease. Never fails; absent files mean "no". */
void hc_gdr_probe(const char *root, hc_gdr_caps_t *caps_out);

/* dma-buf when the kernel, the GPU (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
 * and libibverbs (ibv_reg_dmabuf_mr) all support it; else peermem when
 * loaded; else staging. */
int hc_gdr_reg_choose(const hc_gdr_caps_t *caps, int gpu_dmabuf, int verbs_dmabuf);
const char *hc_gdr_reg_name(int reg);

/*
 * Is GPUDirect RDMA used between GPU `gpu` and HCA `hca` at PCI distance
 * `dist` (enum hc_pci_dist) under HCOLL_NET_GDR_LEVEL `level`? Writes the
 * NCCL-style line into line (may be NULL) and logs it at INFO (GDR):
 *   GPU Direct RDMA Enabled for GPU 0 / HCA mlx5_bond_0 (distance PXB <= PHB)
 *   GPU Direct RDMA Disabled for GPU 3 / HCA mlx5_bond_0 (distance SYS > PHB)
 * Returns 1 (enabled) or 0.
 */
int hc_gdr_level_allows(int dist, int level, int gpu, const char *hca, int log_rank, char *line,
                        size_t linelen);

/* Flush read after a GPUDirect write lands: HCOLL_GDR_FLUSH 1/0 force it,
 * -1 (auto) wants it before Hopper (compute capability major < 9), where
 * the PCIe writes may still be in flight when the completion arrives. */
int hc_gdr_flush_needed(int64_t knob, int cc_major);

/* ---- CUDA driver (dlopen) ---------------------------------------------- */

/* 1 when libcuda.so.1 loaded and cuInit succeeded; why (may be NULL) gets
 * the reason otherwise. Thread-safe; loads once per process. */
int hc_gdr_cuda_available(char *why, size_t whylen);

/* Kind of memory at p; *dev_out (may be NULL) gets the device ordinal for
 * device/managed memory. Host when there is no driver. */
int hc_gdr_ptr_kind(const void *p, int *dev_out);

/* CUDA's id of the allocation holding p (CU_POINTER_ATTRIBUTE_BUFFER_ID),
 * never reused within a process: a registration cache keys device memory
 * by it. 0 for host memory or without a driver. */
uint64_t hc_gdr_ptr_buffer_id(const void *p);

/* PCI bus id ("0000:3b:00.0"), compute capability major and dma-buf
 * support of device ordinal dev. Returns 0, or -1 without a driver. */
int hc_gdr_gpu_info(int dev, char *bdf, size_t bdflen, int *cc_major_out, int *dmabuf_out);

/* A dma-buf fd for the device range [p, p+len) (page-aligned as the
 * driver wants; *offset_out is p's offset inside it, *len_out the aligned
 * length). Returns 0, or -1 with a reason. The caller closes the fd. */
int hc_gdr_dmabuf_fd(void *p, size_t len, int *fd_out, uint64_t *offset_out, size_t *len_out,
                     char *why, size_t whylen);

#endif
