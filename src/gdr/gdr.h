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

#include "hcoll.h"

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

/* ---- CUDA driver (dlopen) ---------------------------------------------- */

/* 1 when libcuda.so.1 loaded and cuInit succeeded; why (may be NULL) gets
 * the reason otherwise. Thread-safe; loads once per process. */
int hc_gdr_cuda_available(char *why, size_t whylen);

/* Device ordinal of the calling thread's current CUDA context, or -1: no
 * context, or no CUDA in this process (libcuda.so.1 not loaded: a
 * host-only program is never made to initialise CUDA by asking). */
int hc_gdr_current_device(void);

/* Kind of memory at p; *dev_out (may be NULL) gets the device ordinal for
 * device/managed memory. Host when there is no driver. */
int hc_gdr_ptr_kind(const void *p, int *dev_out);

/* CUDA's id of the allocation holding p (CU_POINTER_ATTRIBUTE_BUFFER_ID),
 * never reused within a process: a registration cache keys device memory
 * by it. 0 for host memory or without a driver. */
uint64_t hc_gdr_ptr_buffer_id(const void *p);

/* PCI bus id ("0000:3b:00.0"), compute capability major and dma-buf
 * support of device ordinal dev. HCOLL_ERR_UNSUPPORTED without a driver,
 * HCOLL_ERR_CUDA for an ordinal the driver does not know; a query, so
 * nothing is recorded: callers fall back to "?". */
hcoll_status_t hc_gdr_gpu_info(int dev, char *bdf, size_t bdflen, int *cc_major_out, int *dmabuf_out);

/* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING of device ordinal dev:
 * 0 (NONE), HC_GDR_ORDERING_OWNER (100), 200 (ALL_DEVICES); -1 when the
 * driver does not say (no driver, or one older than CUDA 11.3). */
#define HC_GDR_ORDERING_OWNER 100
int hc_gdr_rdma_ordering(int dev);

/* Flush reads after GPUDirect writes: HCOLL_GDR_FLUSH 1/0 force it; auto
 * (-1) wants it unless the device orders the NIC's writes for itself
 * (ordering >= OWNER), and, where the driver does not say (ordering -1),
 * before Hopper (cc_major < 9). */
int hc_gdr_flush_decide(int64_t knob, int cc_major, int ordering);

/* Is GPU dev tied to the CPU by a coherent link (NVLink-C2C on Grace
 * Hopper; NVLink on POWER9)? Read from
 * CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED, which only such a link
 * gives: 1 yes, 0 no (PCIe), -1 unknown (no driver). */
int hc_gdr_gpu_c2c(int dev);

/* hc_gdr_flush_decide, plus the path: with auto (-1), a GPU behind a C2C
 * link to the CPU (c2c 1) whose NIC shares its PCIe switch (nic_dist, enum
 * hc_pci_dist, at most PXB) is flushed whatever its ordering attribute,
 * since completions and flags reach the CPU over C2C while the payload
 * crosses the switch. */
int hc_gdr_flush_decide_path(int64_t knob, int cc_major, int ordering, int c2c, int nic_dist);

/* The CUDA allocation holding p (cuMemGetAddressRange, or the pointer's
 * RANGE_START_ADDR/RANGE_SIZE attributes where the driver lacks it): its
 * first address and size. HCOLL_ERR_UNSUPPORTED without a driver,
 * HCOLL_ERR_CUDA for memory the driver does not know; a query: nothing is
 * recorded. */
hcoll_status_t hc_gdr_ptr_range(const void *p, uintptr_t *base_out, size_t *size_out);

/* A dma-buf fd for the device range [p, p+len) (aligned to the host page
 * size, sysconf(_SC_PAGESIZE), as the driver wants; *offset_out is p's
 * offset inside it, *len_out the aligned length). The caller closes the
 * fd. A probe: HCOLL_ERR_UNSUPPORTED (no driver, or one without dma-buf
 * export) or HCOLL_ERR_CUDA leave the reason in why, and the caller,
 * which falls back to another registration, decides whether it is an
 * error and records it; nothing is logged here. */
hcoll_status_t hc_gdr_dmabuf_fd(void *p, size_t len, int *fd_out, uint64_t *offset_out, size_t *len_out,
                     char *why, size_t whylen);

/* ---- CUDA driver table for the device data path ------------------------- */

/*
 * The driver entry points the device path (core/coll_dev.c) and the kernels
 * (kern.c) need, from the same dlopen as above. Handles are opaque
 * pointers (CUcontext, CUstream, CUevent, CUmodule, CUfunction); device
 * addresses are hc_cu_dptr_t (CUdeviceptr). Every call returns a CUresult
 * (0 = success). Names are the versioned ABI symbols cuda.h maps to.
 */
typedef int hc_cu_res_t;
typedef unsigned long long hc_cu_dptr_t;

#define HC_CU_SUCCESS                   0
#define HC_CU_ERROR_NOT_READY           600
#define HC_CU_STREAM_NON_BLOCKING       0x1
#define HC_CU_EVENT_DISABLE_TIMING      0x2
#define HC_CU_STREAM_WAIT_VALUE_GEQ     0x0
#define HC_CU_STREAM_WRITE_VALUE_DEFAULT 0x0
#define HC_CU_STREAM_CAPTURE_STATUS_NONE 0
#define HC_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16

typedef struct hc_cu_api {
    hc_cu_res_t (*ctx_get_current)(void **ctx);
    hc_cu_res_t (*ctx_set_current)(void *ctx);
    hc_cu_res_t (*ctx_push)(void *ctx);
    hc_cu_res_t (*ctx_pop)(void **ctx);
    hc_cu_res_t (*ctx_get_device)(int *dev);
    hc_cu_res_t (*device_get)(int *dev, int ordinal);
    hc_cu_res_t (*device_attr)(int *v, int attrib, int dev);
    hc_cu_res_t (*primary_retain)(void **ctx, int dev);
    hc_cu_res_t (*primary_release)(int dev);
    hc_cu_res_t (*stream_create)(void **s, unsigned flags);
    hc_cu_res_t (*stream_destroy)(void *s);
    hc_cu_res_t (*stream_synchronize)(void *s);
    hc_cu_res_t (*stream_get_ctx)(void *s, void **ctx);
    hc_cu_res_t (*stream_is_capturing)(void *s, int *status);
    hc_cu_res_t (*stream_wait_value32)(void *s, hc_cu_dptr_t addr, uint32_t v, unsigned flags);
    hc_cu_res_t (*stream_write_value32)(void *s, hc_cu_dptr_t addr, uint32_t v, unsigned flags);
    hc_cu_res_t (*stream_wait_event)(void *s, void *e, unsigned flags);
    hc_cu_res_t (*event_create)(void **e, unsigned flags);
    hc_cu_res_t (*event_record)(void *e, void *s);
    hc_cu_res_t (*event_query)(void *e);
    hc_cu_res_t (*event_synchronize)(void *e);
    hc_cu_res_t (*event_destroy)(void *e);
    hc_cu_res_t (*event_elapsed)(float *ms, void *start, void *end);
    hc_cu_res_t (*mem_alloc)(hc_cu_dptr_t *p, size_t n);
    hc_cu_res_t (*mem_free)(hc_cu_dptr_t p);
    hc_cu_res_t (*mem_free_async)(hc_cu_dptr_t p, void *s);
    hc_cu_res_t (*host_alloc)(void **p, size_t n, unsigned flags);
    hc_cu_res_t (*host_free)(void *p);
    /* cuMemHostGetDevicePointer: pinned memory's device address (equal to
     * the host address only with unified addressing, and not for
     * write-combined memory). */
    hc_cu_res_t (*host_get_device_pointer)(hc_cu_dptr_t *dptr, void *p, unsigned flags);
    hc_cu_res_t (*memcpy_dtoh_async)(void *dst, hc_cu_dptr_t src, size_t n, void *s);
    hc_cu_res_t (*memcpy_htod_async)(hc_cu_dptr_t dst, const void *src, size_t n, void *s);
    hc_cu_res_t (*memcpy_dtod_async)(hc_cu_dptr_t dst, hc_cu_dptr_t src, size_t n, void *s);
    hc_cu_res_t (*memset_d32)(hc_cu_dptr_t p, unsigned v, size_t n);
    hc_cu_res_t (*module_load_data)(void **m, const void *image);
    hc_cu_res_t (*module_unload)(void *m);
    hc_cu_res_t (*module_get_function)(void **f, void *m, const char *name);
    hc_cu_res_t (*launch_kernel)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shmem, void *s,
                                 void **params, void **extra);
    /* Graph capture (cuThreadExchangeStreamCaptureMode; CUDA >= 10.1). */
    hc_cu_res_t (*thread_exchange_capture_mode)(int *mode);
} hc_cu_api_t;

/* cuStreamBeginCapture's interaction modes (CUstreamCaptureMode). */
#define HC_CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define HC_CU_STREAM_CAPTURE_MODE_RELAXED 2

/* The table, or NULL (why gets the reason) without a usable driver. The
 * stream memory operations (cuStreamWaitValue32_v2, CUDA >= 11.7) are
 * required: without them the table is NULL too. Thread-safe.
 * Graph capture: the calls a capture may forbid (allocation, free, module
 * load/unload, stream and event synchronisation and queries: mem_alloc,
 * mem_free, host_alloc, host_free, module_load_data, module_unload,
 * stream_synchronize, event_query, event_synchronize) run in the relaxed
 * capture mode, the thread's mode restored after: they are hcoll's own,
 * never part of a captured sequence, and in the default global mode the
 * driver would fail them, and invalidate the application's capture, while
 * any thread captures (PyTorch's default). */
const hc_cu_api_t *hc_gdr_cu(char *why, size_t whylen);

/* Stream handles with a meaning of their own (cuda.h): NULL and
 * CU_STREAM_LEGACY are the context's legacy default stream, the same one
 * on every thread; CU_STREAM_PER_THREAD is the calling thread's per-thread
 * default stream, a different one on each thread. */
#define HC_CU_STREAM_LEGACY ((void *)0x1)
#define HC_CU_STREAM_PER_THREAD ((void *)0x2)

/* 1 when stream names a different stream on each thread
 * (CU_STREAM_PER_THREAD, cudaStreamPerThread): such a handle cannot be
 * handed to another thread, as hcoll's and NCCL's threads would be. */
int hc_gdr_stream_per_thread(const void *stream);

/* "CUDA_ERROR_NOT_READY: device not ready"-style text for a CUresult;
 * never NULL. */
const char *hc_gdr_cu_errstr(hc_cu_res_t r, char *buf, size_t buflen);

/* 1 when libcuda.so.1 is already loaded in this process (by the CUDA
 * runtime, typically); loads nothing. Host-only programs thus never pay
 * for cuInit when hcoll checks whether a pointer could be device memory. */
int hc_gdr_cuda_in_process(void);

/* ---- Reduction kernels (kern.c, kernels.cu) ----------------------------- */

/*
 * dst = a op b and buf /= nranks on the GPU, with the host kernels'
 * semantics (base/reduce.h) bit for bit on non-NaN results. The kernels
 * are compiled into a fatbin embedded in libhcoll (sm_80, sm_90 SASS and
 * compute_90 PTX), loaded into the current context with cuModuleLoadData.
 */
typedef struct hc_gdr_kern hc_gdr_kern_t;

/* 1 when this build embeds the kernels (nvcc was found at build time). */
int hc_gdr_kern_built(void);

/* Load into the calling thread's current context. A probe, as the kernels
 * are optional: HCOLL_ERR_UNSUPPORTED (not built, no driver),
 * HCOLL_ERR_NO_MEMORY or HCOLL_ERR_CUDA (no SASS/PTX for this GPU) leave
 * the reason in why for the caller to report; nothing is logged here. */
hcoll_status_t hc_gdr_kern_load(hc_gdr_kern_t **out, char *why, size_t whylen);
/* Unloading synchronises the device (cuModuleUnload waits for every
 * stream on real drivers): the library itself never does it after
 * set-up, see hc_gdr_kern_shared. */
void hc_gdr_kern_unload(hc_gdr_kern_t *k);

/* The kernels of CUdevice cudev, loaded into its primary context (current
 * on the calling thread) on the first call and kept, with one reference on
 * that context, for the process life (gdr/mem.h): never unloaded, shared
 * by every communicator on the GPU. Errors as hc_gdr_kern_load; a failed
 * load is tried again by the next call. Thread-safe. */
hcoll_status_t hc_gdr_kern_shared(int cudev, hc_gdr_kern_t **out, char *why, size_t whylen);

/* Enqueue on stream (a CUstream; NULL: the legacy default stream). dtype,
 * op as hcoll_dtype_t / hcoll_op_t; AVG reduces as SUM. Return a CUresult. */
hc_cu_res_t hc_gdr_kern_reduce(hc_gdr_kern_t *k, hc_cu_dptr_t dst, hc_cu_dptr_t a,
                               hc_cu_dptr_t b, size_t count, int dtype, int op, void *stream);
hc_cu_res_t hc_gdr_kern_avg(hc_gdr_kern_t *k, hc_cu_dptr_t buf, size_t count, int dtype,
                            int nranks, void *stream);
/* dst = scalar * src (dst may be src), as hc_reduce_scale: the scalar is
 * one element of dtype at device address kp, or, with kp 0, kbits (an
 * hc_scalar_t's 8 bytes, base/reduce.h). */
hc_cu_res_t hc_gdr_kern_scale(hc_gdr_kern_t *k, hc_cu_dptr_t dst, hc_cu_dptr_t src,
                              size_t count, int dtype, hc_cu_dptr_t kp, uint64_t kbits,
                              void *stream);

#endif
