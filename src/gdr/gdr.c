/*
 * GPUDirect decisions and the few CUDA driver calls they need (gdr.h).
 *
 * No CUDA header is included: the handful of driver entry points and enum
 * values used here are stable ABI (cuda.h documents them as such), and
 * building without a toolkit must give the same library.
 */
#include "gdr/gdr.h"

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "sys/pci.h"
#include "sys/sysfs.h"

/* cuda.h values (driver ABI). */
#define CU_OK                                   0
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE        2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED         8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL     9
#define CU_POINTER_ATTRIBUTE_BUFFER_ID          7
#define CU_MEMORYTYPE_DEVICE                    2
#define CU_MEMORYTYPE_UNIFIED                   4
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED   124
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING 118
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD     1
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR   11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE         12
#define CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED 86

typedef int cu_result_t;
typedef unsigned long long cu_ptr_t;

typedef struct cuda_fns {
    int ok;
    char why[160];
    cu_result_t (*init)(unsigned);
    cu_result_t (*ptr_attr)(void *, int, cu_ptr_t);
    cu_result_t (*dev_get)(int *, int);
    cu_result_t (*dev_attr)(int *, int, int);
    cu_result_t (*dev_busid)(char *, int, int);
    cu_result_t (*range_handle)(void *, cu_ptr_t, size_t, int, unsigned long long); /* may be NULL */
    cu_result_t (*addr_range)(cu_ptr_t *, size_t *, cu_ptr_t); /* cuMemGetAddressRange_v2; may be NULL */
    cu_result_t (*err_name)(cu_result_t, const char **);
    cu_result_t (*err_string)(cu_result_t, const char **);
    hc_cu_api_t api; /* the device path's calls */
    hc_cu_api_t raw; /* the driver's own entry points, behind api's relaxed ones */
    int api_ok;
    char api_why[160];
} cuda_fns_t;

/* Filled once, then read-only: not shared mutable state. */
static cuda_fns_t g_cuda;
static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;

/*
 * The calls a graph capture may forbid, in the relaxed capture mode (gdr.h
 * says why): the calling thread's mode is swapped for RELAXED around the
 * driver's own entry point and restored after.
 */
#define RELAXED(name, params, args)                                                          \
    static hc_cu_res_t relaxed_##name params                                                 \
    {                                                                                        \
        int mode = HC_CU_STREAM_CAPTURE_MODE_RELAXED;                                        \
        int swapped = g_cuda.raw.thread_exchange_capture_mode(&mode) == CU_OK;               \
        hc_cu_res_t r = g_cuda.raw.name args;                                                \
        if (swapped)                                                                         \
            g_cuda.raw.thread_exchange_capture_mode(&mode);                                  \
        return r;                                                                            \
    }
RELAXED(mem_alloc, (hc_cu_dptr_t * p, size_t n), (p, n))
RELAXED(mem_free, (hc_cu_dptr_t p), (p))
RELAXED(host_alloc, (void **p, size_t n, unsigned flags), (p, n, flags))
RELAXED(host_free, (void *p), (p))
RELAXED(module_load_data, (void **m, const void *image), (m, image))
RELAXED(module_unload, (void *m), (m))
RELAXED(stream_synchronize, (void *s), (s))
RELAXED(event_query, (void *e), (e))
RELAXED(event_synchronize, (void *e), (e))
#undef RELAXED

static void cuda_relax(void)
{
    hc_cu_api_t *a = &g_cuda.api;
    g_cuda.raw = *a;
    a->mem_alloc = relaxed_mem_alloc;
    a->mem_free = relaxed_mem_free;
    a->host_alloc = relaxed_host_alloc;
    a->host_free = relaxed_host_free;
    a->module_load_data = relaxed_module_load_data;
    a->module_unload = relaxed_module_unload;
    a->stream_synchronize = relaxed_stream_synchronize;
    a->event_query = relaxed_event_query;
    a->event_synchronize = relaxed_event_synchronize;
}

/* The device path's entry points. The versioned names are what cuda.h
 * maps the plain ones to (without per-thread default streams); a driver
 * that lacks one is too old for the device path, not for the rest. */
static void cuda_load_api(void *h)
{
    hc_cu_api_t *a = &g_cuda.api;
    static const struct {
        size_t off;
        const char *name;
    } syms[] = {
#define E(field, name) { offsetof(hc_cu_api_t, field), name }
        E(ctx_get_current, "cuCtxGetCurrent"),
        E(ctx_set_current, "cuCtxSetCurrent"),
        E(ctx_push, "cuCtxPushCurrent_v2"),
        E(ctx_pop, "cuCtxPopCurrent_v2"),
        E(ctx_get_device, "cuCtxGetDevice"),
        E(device_get, "cuDeviceGet"),
        E(device_attr, "cuDeviceGetAttribute"),
        E(primary_retain, "cuDevicePrimaryCtxRetain"),
        E(primary_release, "cuDevicePrimaryCtxRelease_v2"),
        E(stream_create, "cuStreamCreate"),
        E(stream_destroy, "cuStreamDestroy_v2"),
        E(stream_synchronize, "cuStreamSynchronize"),
        E(stream_get_ctx, "cuStreamGetCtx"),
        E(stream_is_capturing, "cuStreamIsCapturing"),
        E(stream_wait_value32, "cuStreamWaitValue32_v2"),
        E(stream_write_value32, "cuStreamWriteValue32_v2"),
        E(stream_wait_event, "cuStreamWaitEvent"),
        E(event_create, "cuEventCreate"),
        E(event_record, "cuEventRecord"),
        E(event_query, "cuEventQuery"),
        E(event_synchronize, "cuEventSynchronize"),
        E(event_destroy, "cuEventDestroy_v2"),
        E(event_elapsed, "cuEventElapsedTime"),
        E(mem_alloc, "cuMemAlloc_v2"),
        E(mem_free, "cuMemFree_v2"),
        E(mem_free_async, "cuMemFreeAsync"),
        E(host_alloc, "cuMemHostAlloc"),
        E(host_free, "cuMemFreeHost"),
        E(host_get_device_pointer, "cuMemHostGetDevicePointer_v2"),
        E(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2"),
        E(memcpy_htod_async, "cuMemcpyHtoDAsync_v2"),
        E(memcpy_dtod_async, "cuMemcpyDtoDAsync_v2"),
        E(memset_d32, "cuMemsetD32_v2"),
        E(module_load_data, "cuModuleLoadData"),
        E(module_unload, "cuModuleUnload"),
        E(module_get_function, "cuModuleGetFunction"),
        E(launch_kernel, "cuLaunchKernel"),
        /* Graph capture: see cuda_relax. */
        E(thread_exchange_capture_mode, "cuThreadExchangeStreamCaptureMode"),
#undef E
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(g_cuda.api_why, sizeof g_cuda.api_why,
                     "libcuda.so.1 lacks %s (the device path needs a CUDA 11.7 or newer "
                     "driver)",
                     syms[i].name);
            return;
        }
        memcpy((char *)a + syms[i].off, &f, sizeof f);
    }
    cuda_relax();
    g_cuda.api_ok = 1;
}

static void cuda_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_cuda.why, sizeof g_cuda.why, "libcuda.so.1 not loadable (%s)", dlerror());
        return;
    }
#define SYM(field, name)                                                                     \
    do {                                                                                     \
        *(void **)&g_cuda.field = dlsym(h, name);                                            \
        if (!g_cuda.field) {                                                                 \
            snprintf(g_cuda.why, sizeof g_cuda.why, "libcuda.so.1 lacks %s", name);          \
            return;                                                                          \
        }                                                                                    \
    } while (0)
    SYM(init, "cuInit");
    SYM(ptr_attr, "cuPointerGetAttribute");
    SYM(dev_get, "cuDeviceGet");
    SYM(dev_attr, "cuDeviceGetAttribute");
    SYM(dev_busid, "cuDeviceGetPCIBusId");
#undef SYM
    *(void **)&g_cuda.range_handle = dlsym(h, "cuMemGetHandleForAddressRange");
    *(void **)&g_cuda.addr_range = dlsym(h, "cuMemGetAddressRange_v2");
    *(void **)&g_cuda.err_name = dlsym(h, "cuGetErrorName");
    *(void **)&g_cuda.err_string = dlsym(h, "cuGetErrorString");
    cuda_load_api(h);
    cu_result_t r = g_cuda.init(0);
    if (r != CU_OK) {
        snprintf(g_cuda.why, sizeof g_cuda.why, "cuInit failed (CUresult %d): no usable GPU", r);
        return;
    }
    g_cuda.ok = 1;
    /* The handle stays open for the life of the process, as the table. */
}

int hc_gdr_cuda_available(char *why, size_t whylen)
{
    pthread_once(&g_cuda_once, cuda_load);
    if (!g_cuda.ok && why)
        snprintf(why, whylen, "%s", g_cuda.why);
    return g_cuda.ok;
}

const hc_cu_api_t *hc_gdr_cu(char *why, size_t whylen)
{
    if (!hc_gdr_cuda_available(why, whylen))
        return NULL;
    if (!g_cuda.api_ok) {
        if (why)
            snprintf(why, whylen, "%s", g_cuda.api_why);
        return NULL;
    }
    return &g_cuda.api;
}

const char *hc_gdr_cu_errstr(hc_cu_res_t r, char *buf, size_t buflen)
{
    const char *name = NULL, *text = NULL;
    pthread_once(&g_cuda_once, cuda_load);
    if (g_cuda.err_name)
        g_cuda.err_name(r, &name);
    if (g_cuda.err_string)
        g_cuda.err_string(r, &text);
    snprintf(buf, buflen, "%s (CUresult %d)%s%s", name ? name : "CUDA error", r,
             text ? ": " : "", text ? text : "");
    return buf;
}

int hc_gdr_stream_per_thread(const void *stream)
{
    return stream == HC_CU_STREAM_PER_THREAD;
}

static int find_libcuda(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size, (void)data;
    const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    base = base ? base + 1 : info->dlpi_name;
    return base && strncmp(base, "libcuda.so", 10) == 0;
}

int hc_gdr_cuda_in_process(void)
{
    /* Asked on every all-reduce: walking the loaded objects costs well
     * under a microsecond, where dlopen(RTLD_NOLOAD) searched the library
     * path with a handful of system calls (~18 us) each time. */
    return dl_iterate_phdr(find_libcuda, NULL);
}

int hc_gdr_current_device(void)
{
    if (!hc_gdr_cuda_in_process())
        return -1;
    const hc_cu_api_t *cu = hc_gdr_cu(NULL, 0);
    void *ctx = NULL;
    int cudev;
    if (!cu || cu->ctx_get_current(&ctx) != CU_OK || !ctx || cu->ctx_get_device(&cudev) != CU_OK)
        return -1;
    /* The ordinal whose CUdevice handle this is. */
    for (int ord = 0, d; ord < 1024 && cu->device_get(&d, ord) == CU_OK; ord++)
        if (d == cudev)
            return ord;
    return -1;
}

int hc_gdr_ptr_kind(const void *p, int *dev_out)
{
    if (!p || !hc_gdr_cuda_available(NULL, 0))
        return HC_MEM_HOST;
    unsigned mt = 0;
    /* Plain host memory answers CUDA_ERROR_INVALID_VALUE: host. */
    if (g_cuda.ptr_attr(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (cu_ptr_t)(uintptr_t)p) != CU_OK)
        return HC_MEM_HOST;
    if (mt != CU_MEMORYTYPE_DEVICE && mt != CU_MEMORYTYPE_UNIFIED)
        return HC_MEM_HOST;
    int ord = -1, managed = 0;
    g_cuda.ptr_attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (cu_ptr_t)(uintptr_t)p);
    g_cuda.ptr_attr(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (cu_ptr_t)(uintptr_t)p);
    if (dev_out)
        *dev_out = ord;
    return managed ? HC_MEM_MANAGED : HC_MEM_DEVICE;
}

uint64_t hc_gdr_ptr_buffer_id(const void *p)
{
    unsigned long long id = 0;
    if (!p || !hc_gdr_cuda_available(NULL, 0) ||
        g_cuda.ptr_attr(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (cu_ptr_t)(uintptr_t)p) != CU_OK)
        return 0;
    return id;
}

hcoll_status_t hc_gdr_gpu_info(int dev, char *bdf, size_t bdflen, int *cc_major_out, int *dmabuf_out)
{
    if (!hc_gdr_cuda_available(NULL, 0))
        return HCOLL_ERR_UNSUPPORTED;
    int d;
    if (g_cuda.dev_get(&d, dev) != CU_OK)
        return HCOLL_ERR_CUDA;
    char id[64] = "";
    if (bdf && g_cuda.dev_busid(id, (int)sizeof id, d) == CU_OK) {
        for (char *c = id; *c; c++)
            if (*c >= 'A' && *c <= 'F')
                *c = (char)(*c - 'A' + 'a');
        snprintf(bdf, bdflen, "%s", id);
    }
    int v = 0;
    if (cc_major_out)
        *cc_major_out = g_cuda.dev_attr(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d) == CU_OK
                            ? v
                            : 0;
    v = 0;
    if (dmabuf_out)
        *dmabuf_out = g_cuda.range_handle &&
                      g_cuda.dev_attr(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d) == CU_OK && v;
    return HCOLL_SUCCESS;
}

int hc_gdr_rdma_ordering(int dev)
{
    int d, v = 0;
    if (!hc_gdr_cuda_available(NULL, 0) || g_cuda.dev_get(&d, dev) != CU_OK ||
        g_cuda.dev_attr(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, d) != CU_OK)
        return -1;
    return v;
}

int hc_gdr_flush_decide(int64_t knob, int cc_major, int ordering)
{
    if (knob == 0 || knob == 1)
        return (int)knob;
    /* OWNER (100) or ALL_DEVICES (200): the device itself sees the NIC's
     * writes in order once the completion is seen; NONE (0): it may not,
     * whatever the architecture. Unknown (an old driver): by generation. */
    if (ordering >= 0)
        return ordering < HC_GDR_ORDERING_OWNER;
    return cc_major > 0 && cc_major < 9;
}

int hc_gdr_gpu_c2c(int dev)
{
    int d, v = 0;
    if (!hc_gdr_cuda_available(NULL, 0) || g_cuda.dev_get(&d, dev) != CU_OK ||
        g_cuda.dev_attr(&v, CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED, d) != CU_OK)
        return -1;
    return v != 0;
}

int hc_gdr_flush_decide_path(int64_t knob, int cc_major, int ordering, int c2c, int nic_dist)
{
    if (knob == 0 || knob == 1)
        return (int)knob;
    /* The GPU may order the NIC's writes for itself, but on a C2C host
     * the CPU learns of the completion over C2C while the payload crossed
     * the PCIe switch the GPU and NIC share: two paths, no order between
     * them (NCCL flushes there too, whatever the generation). */
    if (c2c == 1 && nic_dist >= 0 && nic_dist <= HC_PCI_PXB)
        return 1;
    return hc_gdr_flush_decide(knob, cc_major, ordering);
}

hcoll_status_t hc_gdr_ptr_range(const void *p, uintptr_t *base_out, size_t *size_out)
{
    if (!p || !hc_gdr_cuda_available(NULL, 0))
        return HCOLL_ERR_UNSUPPORTED;
    cu_ptr_t b = 0;
    size_t n = 0;
    if (g_cuda.addr_range) {
        if (g_cuda.addr_range(&b, &n, (cu_ptr_t)(uintptr_t)p) != CU_OK)
            return HCOLL_ERR_CUDA;
    } else if (g_cuda.ptr_attr(&b, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                               (cu_ptr_t)(uintptr_t)p) != CU_OK ||
               g_cuda.ptr_attr(&n, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (cu_ptr_t)(uintptr_t)p) !=
                   CU_OK) {
        return HCOLL_ERR_CUDA;
    }
    if (n == 0 || (uintptr_t)p < b || (uintptr_t)p - b >= n)
        return HCOLL_ERR_CUDA;
    *base_out = (uintptr_t)b;
    *size_out = n;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_gdr_dmabuf_fd(void *p, size_t len, int *fd_out, uint64_t *offset_out, size_t *len_out,
                     char *why, size_t whylen)
{
    if (!hc_gdr_cuda_available(why, whylen))
        return HCOLL_ERR_UNSUPPORTED;
    if (!g_cuda.range_handle) {
        snprintf(why, whylen, "the CUDA driver has no cuMemGetHandleForAddressRange (< 11.7)");
        return HCOLL_ERR_UNSUPPORTED;
    }
    /* The driver exports whole host pages: 4 KiB on x86, often 64 KiB on
     * aarch64 (Grace). */
    long ps = sysconf(_SC_PAGESIZE);
    const uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    uintptr_t a = (uintptr_t)p, base = a & ~(page - 1);
    size_t alen = ((a + len + page - 1) & ~(page - 1)) - base;
    int fd = -1;
    cu_result_t r = g_cuda.range_handle(&fd, (cu_ptr_t)base, alen,
                                        CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CU_OK || fd < 0) {
        snprintf(why, whylen, "cuMemGetHandleForAddressRange failed (CUresult %d)", r);
        return HCOLL_ERR_CUDA;
    }
    *fd_out = fd;
    *offset_out = a - base;
    *len_out = alen;
    return HCOLL_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Kernel probes and decisions                                               */
/* ------------------------------------------------------------------------ */

void hc_gdr_probe(const char *root, hc_gdr_caps_t *caps_out)
{
    hc_gdr_caps_t c;
    memset(&c, 0, sizeof c);
    static const char *const peer_files[] = {
        "sys/kernel/mm/memory_peers/nv_mem/version", /* MLNX_OFED peer-memory API */
        "sys/module/nvidia_peermem",                 /* in-tree module (CUDA >= 11.4) */
        "sys/module/nv_peer_mem",                    /* the older out-of-tree module */
    };
    for (size_t i = 0; i < sizeof peer_files / sizeof peer_files[0]; i++)
        if (hc_sysfs_exists(root, peer_files[i])) {
            c.peermem = 1;
            snprintf(c.peermem_how, sizeof c.peermem_how, "/%s", peer_files[i]);
            break;
        }
    if (hc_sysfs_read(root, "proc/sys/kernel/osrelease", c.kernel, sizeof c.kernel) == 0) {
        int maj = 0, min = 0;
        if (sscanf(c.kernel, "%d.%d", &maj, &min) == 2)
            c.dmabuf_kernel = maj > 5 || (maj == 5 && min >= 12);
    }
    *caps_out = c;
}

int hc_gdr_reg_choose(const hc_gdr_caps_t *caps, int gpu_dmabuf, int verbs_dmabuf)
{
    if (caps->dmabuf_kernel && gpu_dmabuf && verbs_dmabuf)
        return HC_GDR_REG_DMABUF;
    if (caps->peermem)
        return HC_GDR_REG_PEERMEM;
    return HC_GDR_REG_STAGING;
}

const char *hc_gdr_reg_name(int reg)
{
    switch (reg) {
    case HC_GDR_REG_DMABUF: return "dma-buf";
    case HC_GDR_REG_PEERMEM: return "nvidia-peermem";
    case HC_GDR_REG_STAGING: return "host staging";
    default: return "?";
    }
}

int hc_gdr_level_allows(int dist, int level, int gpu, const char *hca, int log_rank, char *line,
                        size_t linelen)
{
    int on = dist >= 0 && dist <= level;
    char buf[200];
    snprintf(buf, sizeof buf, "GPU Direct RDMA %s for GPU %d / HCA %s (distance %s %s %s)",
             on ? "Enabled" : "Disabled", gpu, hca ? hca : "?", hc_pci_dist_name(dist),
             on ? "<=" : ">", hc_pci_dist_name(level));
    HC_INFO(HC_GDR, log_rank, "%s", buf);
    if (line)
        snprintf(line, linelen, "%s", buf);
    return on;
}
