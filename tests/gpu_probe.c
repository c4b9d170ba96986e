/*
 * gpu_probe: what a real GPU does where the emulation (tests/mock) can only
 * guess, for scripts/gpu-check.sh on first contact (issue 19). Each case
 * prints what it observes against the documented contract (tests/gpu/
 * probe.h gives the line format); nothing here is a unit test, and the
 * same cases run end to end on the emulated driver (tests/gpu-probe.test.sh).
 *
 *   gpu_probe env              driver, GPU, compute capability, NCCL version,
 *                              attributes (memory pools, RDMA write ordering,
 *                              dma-buf, stream memory operations), CUDA_DEVICE_MAX_CONNECTIONS
 *   gpu_probe block            whether cuMemFree (control: documented to
 *                              synchronise), cuMemFreeHost and cuModuleUnload return
 *                              while another stream waits on a host flag
 *                              (the call on another thread, a timed wait, then the
 *                              flag is released)
 *   gpu_probe destroy          hcoll_comm_destroy while the application's stream
 *                              waits (contract: it returns)
 *   gpu_probe kernels [--bench] [--quick]
 *                              the reduction kernels at misaligned offsets of
 *                              dst, a, b (every dtype x op, and the AVG and
 *                              scaling kernels, against the host kernels;
 *                              --quick: fewer sizes and offsets, for the
 *                              sanitizers); --bench: their bandwidth there, 256 MiB
 *   gpu_probe allreduce [--extra-streams N]
 *                              device all-reduce, 2 emulated nodes x 1 rank on
 *                              GPU 0, after the application made N streams with
 *                              work on them (run under CUDA_DEVICE_MAX_CONNECTIONS=1 too)
 *   gpu_probe three-stage [--bytes B] [--iters N]
 *                              2 nodes x 2 ranks on GPU 0: one HCOLL_HOSTID per
 *                              node, one NCCL_HOSTID per rank (so NCCL takes the
 *                              two ranks of a node for two hosts and accepts the
 *                              shared GPU): NCCL RS, ring, NCCL AG
 *   gpu_probe handles          stream handles 0x1 (legacy), 0x2 (per-thread), a
 *                              blocking stream (flags 0) and 0 with device buffers
 *   gpu_probe managed          cuMemAllocManaged buffers through the all-reduce
 *   gpu_probe capture          a global-mode graph capture on another thread of
 *                              each rank during its first device call
 *
 * Exit: 0 when every case ran and none said FAIL, 1 otherwise, 77 (with a
 * "SKIP: no GPU: ..." line) without a driver or GPU.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/reduce.h"
#include "common/ranks.h"
#include "gpu/gpuhelp.h"
#include "gpu/probe.h"
#include "hc_build.h"

#if HCOLL_BUILD_KERNELS
/* The library's embedded kernel image (Makefile: hc_kernels_fatbin.S);
 * hidden in libhcoll.so, visible here since the probe links libhcoll.a. */
extern const unsigned char hc_kernels_fatbin[];
#endif

/* ---- output -------------------------------------------------------------- */

static int fails;

void probe_say(const char *name, const char *verdict, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (strcmp(verdict, "FAIL") == 0)
        fails++;
    printf("PROBE %s: %s %s\n", name, verdict, msg);
    fflush(stdout);
}

int probe_failures(void)
{
    return fails;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- the raw driver -------------------------------------------------------- */

static pd_t pd;

#define PD_SYM(field, name) (*(void **)&pd.field = dlsym(pd.lib, name))

const char *pd_err(int r)
{
    const char *s = NULL;
    if (pd.error_name && pd.error_name(r, &s) == 0 && s)
        return s;
    static char buf[32];
    snprintf(buf, sizeof buf, "CUresult %d", r);
    return buf;
}

int pd_is_mock(void)
{
    return pd.lib && dlsym(pd.lib, "hcmock_driver") != NULL;
}

const pd_t *pd_open(int dev, char *why, size_t whylen)
{
    if (!pd.lib) {
        pd.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!pd.lib) {
            snprintf(why, whylen, "libcuda.so.1 does not load: %s", dlerror());
            return NULL;
        }
        PD_SYM(init, "cuInit");
        PD_SYM(driver_version, "cuDriverGetVersion");
        PD_SYM(device_get, "cuDeviceGet");
        PD_SYM(device_count, "cuDeviceGetCount");
        PD_SYM(device_name, "cuDeviceGetName");
        PD_SYM(device_attr, "cuDeviceGetAttribute");
        PD_SYM(primary_retain, "cuDevicePrimaryCtxRetain");
        PD_SYM(ctx_set_current, "cuCtxSetCurrent");
        PD_SYM(stream_create, "cuStreamCreate");
        PD_SYM(stream_destroy, "cuStreamDestroy_v2");
        PD_SYM(stream_sync, "cuStreamSynchronize");
        PD_SYM(wait_value32, "cuStreamWaitValue32_v2");
        PD_SYM(mem_alloc, "cuMemAlloc_v2");
        PD_SYM(mem_free, "cuMemFree_v2");
        PD_SYM(host_alloc, "cuMemHostAlloc");
        PD_SYM(host_free, "cuMemFreeHost");
        PD_SYM(host_dptr, "cuMemHostGetDevicePointer_v2");
        PD_SYM(alloc_managed, "cuMemAllocManaged");
        PD_SYM(htod, "cuMemcpyHtoDAsync_v2");
        PD_SYM(dtoh, "cuMemcpyDtoHAsync_v2");
        PD_SYM(dtod, "cuMemcpyDtoDAsync_v2");
        PD_SYM(module_load, "cuModuleLoadData");
        PD_SYM(module_unload, "cuModuleUnload");
        PD_SYM(begin_capture, "cuStreamBeginCapture_v2");
        PD_SYM(end_capture, "cuStreamEndCapture");
        PD_SYM(graph_destroy, "cuGraphDestroy");
        PD_SYM(error_name, "cuGetErrorName");
        if (!pd.init || !pd.device_get || !pd.primary_retain || !pd.ctx_set_current ||
            !pd.stream_create || !pd.wait_value32 || !pd.mem_alloc || !pd.host_alloc) {
            snprintf(why, whylen, "libcuda.so.1 lacks a basic driver call");
            return NULL;
        }
    }
    int r = pd.init(0), d;
    void *ctx;
    if (r == 0)
        r = pd.device_get(&d, dev);
    if (r == 0)
        r = pd.primary_retain(&ctx, d);
    if (r == 0)
        r = pd.ctx_set_current(ctx);
    if (r != 0) {
        snprintf(why, whylen, "GPU %d: %s", dev, pd_err(r));
        return NULL;
    }
    return &pd;
}

int pd_host_flag(const pd_t *d, volatile uint32_t **flag, unsigned long long *dptr)
{
    void *p;
    /* PORTABLE | DEVICEMAP: mapped into every context. */
    int r = d->host_alloc(&p, 4096, 0x1 | 0x2);
    if (r != 0)
        return r;
    memset(p, 0, 4096);
    *dptr = (unsigned long long)(uintptr_t)p; /* unified addressing */
    if (d->host_dptr && d->host_dptr(dptr, p, 0) != 0)
        *dptr = (unsigned long long)(uintptr_t)p;
    *flag = p;
    return 0;
}

/* ---- env -------------------------------------------------------------- */

static int cmd_env(void)
{
    char why[256];
    const pd_t *d = pd_open(0, why, sizeof why);
    if (!d) {
        printf("ENV driver: none (%s)\n", why);
        return 77;
    }
    int v = 0, n = 0;
    if (d->driver_version && d->driver_version(&v) == 0)
        printf("ENV cuda driver API version: %d.%d\n", v / 1000, v % 1000 / 10);
    printf("ENV emulated driver: %s\n", pd_is_mock() ? "yes (tests/mock)" : "no");
    if (d->device_count && d->device_count(&n) == 0)
        printf("ENV devices: %d\n", n);
    static const struct { int id; const char *name; } attrs[] = {
        { 41, "unified addressing" },
        { 83, "managed memory" },
        { 89, "concurrent managed access" },
        { 92, "stream memory operations (v1 attribute)" },
        { 115, "memory pools (cuMemAllocAsync/cuMemFreeAsync)" },
        { 116, "GPUDirect RDMA supported" },
        { 117, "GPUDirect RDMA flush-writes options (bit 0: cuFlushGPUDirectRDMAWrites)" },
        { 118, "GPUDirect RDMA writes ordering (0 none, 100 owner, 200 all devices)" },
        { 122, "64-bit stream memory operations" },
        { 123, "stream wait value NOR" },
        { 124, "dma-buf supported" },
    };
    for (int dev = 0; dev < n && dev < 8; dev++) {
        char name[128] = "?";
        int maj = 0, min = 0;
        if (d->device_name)
            d->device_name(name, sizeof name, dev);
        d->device_attr(&maj, 75, dev);
        d->device_attr(&min, 76, dev);
        printf("ENV gpu %d: %s, compute capability %d.%d\n", dev, name, maj, min);
        if (dev > 0)
            continue; /* the attributes of GPU 0 stand for all */
        for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
            int a = -1, r = d->device_attr(&a, attrs[i].id, dev);
            if (r == 0)
                printf("ENV gpu 0 %s: %d\n", attrs[i].name, a);
            else
                printf("ENV gpu 0 %s: unknown to this driver (%s)\n", attrs[i].name, pd_err(r));
        }
    }
    void *nccl = dlopen("libnccl.so.2", RTLD_NOW);
    int (*ver)(int *) = nccl ? (int (*)(int *))dlsym(nccl, "ncclGetVersion") : NULL;
    int nv = 0;
    if (ver && ver(&nv) == 0)
        printf("ENV nccl: %d.%d.%d (%d)\n", nv / 10000, nv / 100 % 100, nv % 100, nv);
    else
        printf("ENV nccl: none (%s)\n", nccl ? "no ncclGetVersion" : dlerror());
    const char *cdmc = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    printf("ENV CUDA_DEVICE_MAX_CONNECTIONS: %s\n", cdmc ? cdmc : "unset (driver default: 8)");
    printf("ENV hcoll kernels built: %s\n", HCOLL_BUILD_KERNELS ? "yes" : "no");
    return 0;
}

/* ---- block: does a call return while another stream waits? ----------------- */

typedef struct blk {
    const pd_t *d;
    void *ctx_dev;     /* device index, for the thread's context */
    int which;         /* 0 cuMemFree, 1 cuMemFreeHost, 2 cuModuleUnload */
    unsigned long long dmem;
    void *hmem, *module;
    volatile int done;
    int rc;
} blk_t;

static void *blk_thread(void *arg)
{
    blk_t *b = arg;
    char why[128];
    pd_open(0, why, sizeof why); /* the thread's current context */
    int r = b->which == 0   ? b->d->mem_free(b->dmem)
            : b->which == 1 ? b->d->host_free(b->hmem)
                            : b->d->module_unload(b->module);
    b->rc = r;
    __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* A module image this driver takes: the library's kernels; else tiny PTX
 * text (a real driver JIT-compiles it); else (the emulated driver takes
 * fatbins only) a fatbin holding one PTX entry. */
static int load_some_module(const pd_t *d, void **mod)
{
#if HCOLL_BUILD_KERNELS
    if (d->module_load(mod, hc_kernels_fatbin) == 0)
        return 0;
#endif
    static const char ptx[] = ".version 7.0\n.target sm_70\n.address_size 64\n"
                              ".visible .entry hc_probe_nop()\n{\n\tret;\n}\n";
    if (d->module_load(mod, ptx) == 0)
        return 0;
    static unsigned char fb[16 + 32 + 64];
    uint32_t magic = 0xBA55ED50u, arch = 70, ehs = 32;
    uint16_t ver = 1, hs = 16, kind = 1;
    uint64_t fsize = 32 + 64, psize = 64;
    memcpy(fb, &magic, 4);
    memcpy(fb + 4, &ver, 2);
    memcpy(fb + 6, &hs, 2);
    memcpy(fb + 8, &fsize, 8);
    memcpy(fb + 16, &kind, 2);
    memcpy(fb + 20, &ehs, 4);
    memcpy(fb + 24, &psize, 8);
    memcpy(fb + 16 + 28, &arch, 4);
    memcpy(fb + 48, ptx, 63);
    return d->module_load(mod, fb);
}

static void block_one(const pd_t *d, int which, double limit_ms)
{
    static const char *const names[] = { "cuMemFree", "cuMemFreeHost", "cuModuleUnload" };
    char name[64];
    snprintf(name, sizeof name, "block.%s", names[which]);
    blk_t b = { .d = d, .which = which };
    int r = which == 0 ? d->mem_alloc(&b.dmem, 1 << 20)
            : which == 1 ? d->host_alloc(&b.hmem, 1 << 20, 0)
                         : load_some_module(d, &b.module);
    if (r != 0) {
        probe_say(name, "SKIP", "could not make the object to free: %s", pd_err(r));
        return;
    }
    volatile uint32_t *flag;
    unsigned long long fdev;
    void *s;
    if ((r = pd_host_flag(d, &flag, &fdev)) != 0 ||
        (r = d->stream_create(&s, 0x1 /* non-blocking */)) != 0 ||
        (r = d->wait_value32(s, fdev, 1, 0 /* GEQ */)) != 0) {
        probe_say(name, "SKIP", "could not hold a stream on a host flag: %s", pd_err(r));
        return;
    }
    pthread_t t;
    double t0 = now_ms();
    pthread_create(&t, NULL, blk_thread, &b);
    while (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE) && now_ms() - t0 < limit_ms)
        usleep(1000);
    int returned = __atomic_load_n(&b.done, __ATOMIC_ACQUIRE);
    double took = now_ms() - t0;
    *flag = 1; /* release the stream: a blocked call returns now */
    __sync_synchronize();
    double t1 = now_ms();
    while (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE) && now_ms() - t1 < 10000)
        usleep(1000);
    if (!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE)) {
        probe_say(name, "FAIL", "did not return even 10 s after the waiting stream was released");
        fflush(stdout);
        _exit(1); /* the thread is stuck in the driver: nothing else can run */
    }
    pthread_join(t, NULL);
    d->stream_sync(s);
    if (returned)
        probe_say(name, "INFO", "returns while another stream waits (%.1f ms, %s)", took,
                  pd_err(b.rc));
    else
        probe_say(name, "INFO",
                  "BLOCKS while another stream waits: not back after %.0f ms, returned %.1f ms "
                  "after the stream was released (%s)",
                  limit_ms, now_ms() - t1, pd_err(b.rc));
    printf("FIGURE block.%s: %s\n", names[which], returned ? "returns" : "blocks");
    d->stream_destroy(s);
    d->host_free((void *)flag);
}

static int cmd_block(void)
{
    char why[256];
    const pd_t *d = pd_open(0, why, sizeof why);
    if (!d) {
        printf("SKIP: no GPU: %s\n", why);
        return 77;
    }
    /* cuMemFree first: documented to synchronise, it shows that the
     * detection works on this machine. */
    for (int w = 0; w < 3; w++)
        block_one(d, w, 2000);
    return 0;
}

/* ---- kernels at misaligned offsets ----------------------------------------- */

/* Exact values (small integers; PROD stays small), so any kernel agrees
 * with the host kernel bit for bit. */
static void kfill(unsigned char *p, size_t n, hcoll_dtype_t dt, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        int v = (int)((i * 2654435761u + seed * 40503u) >> 7) % 9 - 4;
        switch (dt) {
        case HCOLL_FLOAT32: ((float *)p)[i] = (float)v; break;
        case HCOLL_FLOAT64: ((double *)p)[i] = v; break;
        case HCOLL_FLOAT16: ((uint16_t *)p)[i] = hc_float_to_half((float)v); break;
        case HCOLL_BFLOAT16: ((uint16_t *)p)[i] = hc_float_to_bf16((float)v); break;
        case HCOLL_INT8: case HCOLL_UINT8: p[i] = (unsigned char)v; break;
        case HCOLL_INT32: ((int32_t *)p)[i] = v; break;
        case HCOLL_INT64: ((int64_t *)p)[i] = v; break;
        default: break;
        }
    }
}

/* Offsets in elements of dst, a and b from a 256-byte aligned base. */
static const size_t koffs[][3] = { { 0, 0, 0 }, { 1, 1, 1 }, { 0, 1, 2 }, { 3, 0, 1 }, { 5, 7, 2 } };

static const char *kern_case(const hc_cu_api_t *cu, hc_gdr_kern_t *k, hcoll_dtype_t dt,
                             hcoll_op_t op, size_t n, const size_t off[3], char *msg, size_t len)
{
    size_t es = hcoll_dtype_size(dt), bytes = (n + 8) * es;
    unsigned char *a = malloc(bytes), *b = malloc(bytes), *ref = malloc(bytes),
                  *got = malloc(bytes);
    hc_cu_dptr_t da = 0, db = 0, dd = 0;
    const char *fail = NULL;
    if (!a || !b || !ref || !got || cu->mem_alloc(&da, bytes) || cu->mem_alloc(&db, bytes) ||
        cu->mem_alloc(&dd, bytes)) {
        fail = "out of memory";
        goto out;
    }
    kfill(a, n + 8, dt, 1);
    kfill(b, n + 8, dt, 2);
    cu->memcpy_htod_async(da, a, bytes, NULL);
    cu->memcpy_htod_async(db, b, bytes, NULL);
    hc_cu_res_t r = hc_gdr_kern_reduce(k, dd + off[0] * es, da + off[1] * es, db + off[2] * es,
                                       n, dt, op, NULL);
    if (r == HC_CU_SUCCESS)
        r = cu->stream_synchronize(NULL);
    if (r == HC_CU_SUCCESS)
        r = cu->memcpy_dtoh_async(got, dd, bytes, NULL);
    if (r == HC_CU_SUCCESS)
        r = cu->stream_synchronize(NULL);
    if (r != HC_CU_SUCCESS) {
        snprintf(msg, len, "%s %s n=%zu offsets (%zu,%zu,%zu): %s", hcoll_dtype_name(dt),
                 hcoll_op_name(op), n, off[0], off[1], off[2], pd_err(r));
        fail = msg;
        goto out;
    }
    hc_reduce(ref, a + off[1] * es, b + off[2] * es, n, dt, op);
    if (memcmp(got + off[0] * es, ref, n * es) != 0) {
        size_t i = 0;
        while (i < n && memcmp(got + (off[0] + i) * es, ref + i * es, es) == 0)
            i++;
        snprintf(msg, len, "%s %s n=%zu offsets (%zu,%zu,%zu): element %zu differs from the "
                 "host kernel", hcoll_dtype_name(dt), hcoll_op_name(op), n, off[0], off[1],
                 off[2], i);
        fail = msg;
    }
out:
    if (da)
        cu->mem_free(da);
    if (db)
        cu->mem_free(db);
    if (dd)
        cu->mem_free(dd);
    free(a);
    free(b);
    free(ref);
    free(got);
    return fail;
}

static const hcoll_dtype_t kdts[] = { HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16, HCOLL_FLOAT64,
                                      HCOLL_INT8,    HCOLL_UINT8,   HCOLL_INT32,    HCOLL_INT64 };

/* The AVG division and the scaling kernel on a misaligned buffer. */
static const char *kern_unary(const hc_cu_api_t *cu, hc_gdr_kern_t *k, hcoll_dtype_t dt,
                              size_t n, size_t off, int scale, char *msg, size_t len)
{
    size_t es = hcoll_dtype_size(dt), bytes = (n + 8) * es;
    unsigned char *h = malloc(bytes), *got = malloc(bytes);
    hc_cu_dptr_t p = 0;
    const char *fail = NULL;
    if (!h || !got || cu->mem_alloc(&p, bytes)) {
        fail = "out of memory";
        goto out;
    }
    kfill(h, n + 8, dt, 3);
    cu->memcpy_htod_async(p, h, bytes, NULL);
    hc_scalar_t sc = hc_scalar_avg(dt, 4);
    uint64_t kbits = 0;
    memcpy(&kbits, &sc, sizeof sc < 8 ? sizeof sc : 8);
    hc_cu_res_t r = scale ? hc_gdr_kern_scale(k, p + off * es, p + off * es, n, dt, 0, kbits, NULL)
                          : hc_gdr_kern_avg(k, p + off * es, n, dt, 4, NULL);
    if (r == HC_CU_SUCCESS)
        r = cu->memcpy_dtoh_async(got, p, bytes, NULL);
    if (r == HC_CU_SUCCESS)
        r = cu->stream_synchronize(NULL);
    if (scale)
        hc_reduce_scale(h + off * es, h + off * es, n, dt, sc);
    else
        hc_reduce_avg_finish(h + off * es, n, dt, HCOLL_AVG, 4);
    if (r != HC_CU_SUCCESS || memcmp(got + off * es, h + off * es, n * es) != 0) {
        snprintf(msg, len, "%s %s n=%zu offset %zu: %s", scale ? "scale" : "avg",
                 hcoll_dtype_name(dt), n, off, r != HC_CU_SUCCESS ? pd_err(r) : "differs from the "
                 "host kernel");
        fail = msg;
    }
out:
    if (p)
        cu->mem_free(p);
    free(h);
    free(got);
    return fail;
}

static void kern_check(const hc_cu_api_t *cu, hc_gdr_kern_t *k, int quick)
{
    static const size_t sizes[] = { 1, 33, 65537, 7, 1000 };
    static const hcoll_op_t ops[] = { HCOLL_SUM, HCOLL_PROD, HCOLL_MAX, HCOLL_MIN };
    const size_t nsizes = quick ? 3 : 5, noffs = quick ? 3 : sizeof koffs / sizeof koffs[0];
    char msg[300];
    int cases = 0;
    for (size_t d = 0; d < sizeof kdts / sizeof kdts[0]; d++)
        for (size_t s = 0; s < nsizes; s++)
            for (size_t f = 0; f < noffs; f++)
                for (int sc = 0; sc < 2; sc++) {
                    const char *e = kern_unary(cu, k, kdts[d], sizes[s], koffs[f][1], sc, msg,
                                               sizeof msg);
                    if (e) {
                        probe_say("kernels.misaligned", "FAIL", "%s", e);
                        return;
                    }
                    cases++;
                }
    for (size_t d = 0; d < sizeof kdts / sizeof kdts[0]; d++)
        for (size_t o = 0; o < 4; o++)
            for (size_t s = 0; s < nsizes; s++)
                for (size_t f = 0; f < noffs; f++) {
                    const char *e = kern_case(cu, k, kdts[d], ops[o], sizes[s], koffs[f], msg,
                                              sizeof msg);
                    if (e) {
                        probe_say("kernels.misaligned", "FAIL", "%s", e);
                        return;
                    }
                    cases++;
                }
    probe_say("kernels.misaligned", "PASS",
              "%d cases (reduce: every dtype x op; avg, scale; n 1..65537; dst/a/b offsets by "
              "0..7 elements) equal to the host kernels", cases);
}

/* GB/s of dst = a + b over n elements at the given byte offsets, counting
 * 3 bytes moved per output byte. */
static double kern_gbs(const hc_cu_api_t *cu, hc_gdr_kern_t *k, hc_cu_dptr_t base[3],
                       size_t bytes, hcoll_dtype_t dt, const size_t offb[3], int iters)
{
    size_t n = (bytes - 64) / hcoll_dtype_size(dt);
    hc_cu_dptr_t p[3] = { base[0] + offb[0], base[1] + offb[1], base[2] + offb[2] };
    for (int i = 0; i < 2; i++)
        hc_gdr_kern_reduce(k, p[0], p[1], p[2], n, dt, HCOLL_SUM, NULL);
    if (cu->stream_synchronize(NULL) != HC_CU_SUCCESS)
        return -1;
    double t = now_ms();
    for (int i = 0; i < iters; i++)
        hc_gdr_kern_reduce(k, p[0], p[1], p[2], n, dt, HCOLL_SUM, NULL);
    if (cu->stream_synchronize(NULL) != HC_CU_SUCCESS)
        return -1;
    return 3.0 * (double)(n * hcoll_dtype_size(dt)) * iters / ((now_ms() - t) / 1e3) / 1e9;
}

static void kern_bench(const hc_cu_api_t *cu, hc_gdr_kern_t *k, int mock)
{
    const size_t bytes = mock ? 8u << 20 : 256u << 20;
    const int iters = mock ? 2 : 20;
    hc_cu_dptr_t base[3];
    for (int i = 0; i < 3; i++)
        if (cu->mem_alloc(&base[i], bytes) != HC_CU_SUCCESS) {
            probe_say("kernels.misaligned_bw", "SKIP", "cannot allocate 3 x %zu MiB", bytes >> 20);
            return;
        }
    for (int i = 0; i < 3; i++)
        cu->memset_d32(base[i], 0x3f800000u, bytes / 4);
    cu->stream_synchronize(NULL);
    for (int i = 0; i < 2; i++)
        cu->memcpy_dtod_async(base[0], base[1], bytes, NULL);
    cu->stream_synchronize(NULL);
    double t = now_ms();
    for (int i = 0; i < iters; i++)
        cu->memcpy_dtod_async(base[0], base[1], bytes, NULL);
    cu->stream_synchronize(NULL);
    double copy = 2.0 * bytes * iters / ((now_ms() - t) / 1e3) / 1e9;
    printf("FIGURE kernels.d2d_copy %zuMiB: %.1f GB/s\n", bytes >> 20, copy);
    static const struct { hcoll_dtype_t dt; size_t off[3]; } cs[] = {
        { HCOLL_FLOAT32, { 0, 0, 0 } },  { HCOLL_FLOAT32, { 4, 4, 4 } },
        { HCOLL_FLOAT32, { 0, 4, 8 } },  { HCOLL_FLOAT32, { 12, 0, 4 } },
        { HCOLL_BFLOAT16, { 0, 0, 0 } }, { HCOLL_BFLOAT16, { 2, 2, 2 } },
        { HCOLL_BFLOAT16, { 0, 2, 6 } },
    };
    double worst = 1e9;
    char worst_case[64] = "";
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        double g = kern_gbs(cu, k, base, bytes, cs[c].dt, cs[c].off, iters);
        printf("FIGURE kernels.bw %s sum %zuMiB offsets(dst,a,b)=(%zu,%zu,%zu)B: %.1f GB/s, "
               "%.2fx copy\n", hcoll_dtype_name(cs[c].dt), bytes >> 20, cs[c].off[0],
               cs[c].off[1], cs[c].off[2], g, g / copy);
        if (g / copy < worst) {
            worst = g / copy;
            snprintf(worst_case, sizeof worst_case, "%s (%zu,%zu,%zu)", hcoll_dtype_name(cs[c].dt),
                     cs[c].off[0], cs[c].off[1], cs[c].off[2]);
        }
    }
    for (int i = 0; i < 3; i++)
        cu->mem_free(base[i]);
    if (mock)
        probe_say("kernels.misaligned_bw", "INFO", "emulated driver: figures meaningless");
    else
        probe_say("kernels.misaligned_bw", worst >= 0.85 ? "PASS" : "FAIL",
                  "slowest %s at %.2fx the copy bandwidth (goal >= 0.85x, as test_gpu_kernels "
                  "for aligned buffers; issue 19: peel a head so misaligned ring offsets keep "
                  "vector loads)", worst_case, worst);
}

static int cmd_kernels(int bench, int quick)
{
    char why[256];
    if (gpu_probe(why, sizeof why) < 1) {
        printf("SKIP: no GPU: %s\n", why);
        return 77;
    }
    const hc_cu_api_t *cu = gpu_open(0);
    hc_gdr_kern_t *k = NULL;
    if (!cu || !pd_open(0, why, sizeof why)) {
        probe_say("kernels.misaligned", "FAIL", "cannot open GPU 0");
        return 1;
    }
    if (hc_gdr_kern_load(&k, why, sizeof why) != HCOLL_SUCCESS) {
        probe_say("kernels.misaligned", HCOLL_BUILD_KERNELS ? "FAIL" : "SKIP",
                  "the kernels do not load: %s", why);
        return 0;
    }
    kern_check(cu, k, quick);
    if (bench)
        kern_bench(cu, k, pd_is_mock());
    hc_gdr_kern_unload(k);
    return 0;
}

/* ---- main ------------------------------------------------------------------ */

static int usage(void)
{
    fprintf(stderr, "usage: gpu_probe env|block|destroy|kernels [--bench] [--quick]|allreduce "
                    "[--extra-streams N]|three-stage [--bytes B] [--iters N]|handles|managed|"
                    "capture\n");
    return 2;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return usage();
    const char *c = argv[1];
    long extra = 0, iters = 5;
    size_t bytes = 0;
    int bench = 0, quick = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--bench") == 0)
            bench = 1;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--extra-streams") == 0 && i + 1 < argc)
            extra = strtol(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc)
            bytes = (size_t)strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = strtol(argv[++i], NULL, 0);
        else
            return usage();
    }
    int rc;
    if (strcmp(c, "env") == 0)
        rc = cmd_env();
    else if (strcmp(c, "block") == 0)
        rc = cmd_block();
    else if (strcmp(c, "kernels") == 0)
        rc = cmd_kernels(bench, quick);
    else if (strcmp(c, "destroy") == 0)
        rc = probe_destroy();
    else if (strcmp(c, "allreduce") == 0)
        rc = probe_allreduce((int)extra);
    else if (strcmp(c, "three-stage") == 0)
        rc = probe_three_stage(bytes, (int)iters);
    else if (strcmp(c, "handles") == 0)
        rc = probe_handles();
    else if (strcmp(c, "managed") == 0)
        rc = probe_managed();
    else if (strcmp(c, "capture") == 0)
        rc = probe_capture();
    else
        return usage();
    if (rc == 77)
        return 77;
    return rc != 0 || probe_failures() ? 1 : 0;
}
