/*
 * An emulated CUDA driver (libcuda.so.1) for hosts without a GPU, so that
 * hcoll's device path runs in CI and fails where a real GPU would fail.
 *
 *   caller thread                          this file
 *   ─────────────                          ─────────
 *   cuInit ─────────────────────────────►  pid recorded: a forked child that
 *                                          inherits it gets "initialization error"
 *   cuCtxPush / SetCurrent ─────────────►  per-thread context stack (TLS)
 *   cuMemAlloc ─────────────────────────►  address in a PROT_NONE reservation
 *        │                                 (a host load/store SIGSEGVs, as with
 *        │                                 real device memory) + a separate
 *        ▼                                 backing mapping, found by the table
 *   allocation table  dptr range ──► backing, device, buffer id, refs
 *
 *   cuMemcpy*Async, cuMemsetD32, cuLaunchKernel, cuEventRecord,
 *   cuStreamWait/WriteValue32, cuStreamWaitEvent, hcmock_stream_enqueue
 *        │ checked now (context, handles, address ranges), then queued
 *        ▼
 *   stream ──FIFO──► worker thread (one per stream, the stream's context
 *                    current) ──► random delay ──► op on the backing memory
 *   legacy stream (NULL, 0x1): its own worker; "after stream S reaches
 *   op n" entries added at enqueue order it against the blocking streams
 *   cuStreamSynchronize / cuEventQuery / cuEventSynchronize ──► counters
 *   a faulting op (bad address, misaligned) ──► sticky context error
 *   an op racing with unordered work queued on another stream ──► "RACE"
 *
 *   kernels: cuModuleLoadData checks the fatbin (magic, SASS or PTX for the
 *   device's compute capability, kernel names from its ELF sections); a
 *   launch reads the parameters with kernels.cu's layout and runs
 *   hc_reduce / hc_reduce_avg_finish / hc_reduce_scale on the backing memory (NaN results
 *   canonical, as the GPU returns them).
 *
 * Environment (read at cuInit):
 *   HCMOCK_NDEV      devices (default 2; 0: cuInit says CUDA_ERROR_NO_DEVICE)
 *   HCMOCK_CC        compute capability "9.0"
 *   HCMOCK_DELAY_US  each queued op waits a random 0..N us first (default 50)
 *   HCMOCK_POISON    byte that fresh allocations are filled with (default
 *                    0xa5; -1: no fill). Device memory is not zeroed.
 *   HCMOCK_CAPTURE   1: every stream reports CU_STREAM_CAPTURE_STATUS_ACTIVE
 *   HCMOCK_DMABUF    1: CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 1 but the export
 *                    fails; 2: the export works too (default 0: neither)
 *   HCMOCK_RDMA_ORDERING  GPU_DIRECT_RDMA_WRITES_ORDERING (default 100 from
 *                    sm_90, else 0)
 *   HCMOCK_C2C       1: the GPU reaches the CPU over NVLink-C2C (Grace
 *                    Hopper): HOST_NATIVE_ATOMIC_SUPPORTED is 1 (default 0)
 *   HCMOCK_MEMPOOLS  0: no memory-pool support, as on some vGPU/MIG setups:
 *                    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED is 0 and
 *                    cuMemFreeAsync fails with CUDA_ERROR_NOT_SUPPORTED
 *                    (default 1)
 *   HCMOCK_MEM_GB    device memory per GPU (default 80)
 *   HCMOCK_PINNED_DEVPTR  1: pinned host memory's device address
 *                    (cuMemHostGetDevicePointer) differs from its host address,
 *                    which device-side calls then refuse (default 0: the
 *                    same, as with unified addressing)
 *   HCMOCK_TRACE     1: print every queued op as it runs (stderr)
 *   HCMOCK_RACE      unordered device-memory accesses of two streams: 0
 *                    ignored, 1 reported on stderr (default), 2 reported
 *                    and the op fails (sticky CUDA_ERROR_UNKNOWN)
 *   CUDA_DEVICE_MAX_CONNECTIONS  hardware queues per context (default 8, as
 *                    the driver; 1..32): see "Hardware queues" below
 *   HCMOCK_QUEUES    "stream": every stream runs on its own, as if it had a
 *                    queue of its own (the emulation before queues existed)
 *
 * Hardware queues: the driver maps streams round-robin, at creation, onto
 * CUDA_DEVICE_MAX_CONNECTIONS queues per context, and a queue executes the
 * work of all its streams strictly in submission order. So a blocking
 * wait (cuStreamWaitValue32, a cuStreamWaitEvent on work not yet done, an
 * NCCL kernel waiting for its peers) holds up every stream on that queue,
 * work submitted later on another stream included. Here every op gets a
 * ticket of its stream's queue when queued, and a stream's worker runs an
 * op only once the queue has run every earlier ticket. (Stricter than a
 * GPU, which overlaps consecutive kernels of one queue: a queue here runs
 * one op at a time.)
 *
 * Simplified, on purpose (see also the comments at each point):
 *   - no stream priorities, no peer access control for copies, no graphs
 *     beyond an empty handle from cuStreamEndCapture;
 *   - NULL and CU_STREAM_LEGACY (0x1) are the context's legacy stream;
 *     CU_STREAM_PER_THREAD (0x2) is the calling thread's own per-thread
 *     default stream (a blocking stream made on first use), a different
 *     stream on each thread;
 *   - captures enforce the threads' interaction modes
 *     (cuThreadExchangeStreamCaptureMode): an allocation, free, module
 *     load/unload, synchronisation or query that a capture forbids to the
 *     calling thread fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 *     invalidates that capture, also from another thread (global mode);
 *   - a kernel's threads are not run: the launch's effect is computed on
 *     the host, each element once per (gridDim.y*z x blockDim.y*z), since the
 *     kernels index with x only;
 *   - the release of a primary context to refcount 0 abandons queued work
 *     and invalidates its memory, streams, events and modules (a retain
 *     starts a new life of the same handle);
 *   - cuMemFree, cuMemFreeHost and cuModuleUnload synchronise the
 *     context (the implicit synchronisation real drivers do: a stream held
 *     by the application holds them too);
 *   - async copies touch host memory when they run, never when queued (the
 *     driver may do either for pageable memory: the strict reading);
 *   - cuMemsetD32 goes on the legacy stream and returns (it is asynchronous
 *     to the host for device memory, per CUDA's API synchronisation rules);
 *   - explicit-stream calls want a current context that owns the stream (the
 *     real driver may take the stream's context instead: stricter here).
 * Messages about faults go to stderr, prefixed "hcmock:".
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/reduce.h"
#include "hcmock.h"

#define CUAPI HCMOCK_API

/* ---- cuda.h values (driver ABI) ----------------------------------------- */

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_UNKNOWN = 999,
};

#define CU_STREAM_NON_BLOCKING 0x1
#define CU_STREAM_LEGACY ((void *)0x1)
#define CU_STREAM_PER_THREAD ((void *)0x2)
#define CU_EVENT_VALID_FLAGS 0x7 /* BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS */
#define CU_MEMHOSTALLOC_VALID_FLAGS 0x7
#define CU_STREAM_WAIT_VALUE_GEQ 0x0
#define CU_STREAM_WAIT_VALUE_EQ 0x1
#define CU_STREAM_WAIT_VALUE_AND 0x2
#define CU_STREAM_WAIT_VALUE_NOR 0x3
#define CU_STREAM_WAIT_VALUE_FLUSH (1u << 30)
#define CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER 0x1
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_STREAM_CAPTURE_STATUS_INVALIDATED 2
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_STREAM_CAPTURE_MODE_RELAXED 2
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_LAUNCH_PARAM_END ((void *)0x0)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x1)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x2)

enum {
    PA_CONTEXT = 1,
    PA_MEMORY_TYPE = 2,
    PA_DEVICE_POINTER = 3,
    PA_HOST_POINTER = 4,
    PA_SYNC_MEMOPS = 6,
    PA_BUFFER_ID = 7,
    PA_IS_MANAGED = 8,
    PA_DEVICE_ORDINAL = 9,
    PA_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
    PA_RANGE_START_ADDR = 11,
    PA_RANGE_SIZE = 12,
    PA_MAPPED = 13,
    PA_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
};

#define CU_DEVICE_ATTRIBUTE_MAX 148 /* one past the last in CUDA 13.0 */

/* ---- Objects ------------------------------------------------------------ */

#define MAGIC_STREAM 0x5354524du
#define MAGIC_EVENT 0x4556454eu
#define MAGIC_MODULE 0x4d4f4455u
#define MAGIC_FUNC 0x46554e43u
#define MAGIC_GRAPH 0x47524150u

#define MAX_DEV 64
#define MAX_HWQ 32               /* CUDA_DEVICE_MAX_CONNECTIONS's maximum */
#define CTX_STACK 32
#define VA_RESERVE (1ull << 40)  /* device address space of the process */
#define BIG_ALIGN (2u << 20)     /* large allocations, as the driver aligns them */
#define SMALL_ALIGN 512u
#define SLOW_WAIT_S 10           /* a blocking call says where it is stuck */

struct mstream;

/* A primary context. The handle stays the same across retain/release
 * cycles (as the driver's does); gen tells objects of an earlier life. */
typedef struct mctx {
    int dev;
    int refs;
    int active;
    unsigned gen;
    int sticky; /* first fault of a queued op: every later call fails with it */
    struct mstream *legacy;
    /* Hardware queues (of this life): tickets handed out, tickets run. */
    struct { uint64_t next, done; } hwq[MAX_HWQ];
    unsigned nstreams; /* streams made in this life: round-robin onto hwq */
} mctx_t;

typedef struct mmem {
    uint64_t base;   /* device address (host address for pinned memory) */
    size_t size;     /* as asked */
    size_t span;     /* reserved: size rounded to the alignment */
    void *host;      /* backing */
    int pinned;      /* cuMemHostAlloc memory (identity mapped) */
    int managed;     /* cuMemAllocManaged: identity mapped too, freed by cuMemFree */
    mctx_t *ctx;
    unsigned gen;
    uint64_t id;     /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused */
    int refs;        /* the table's, plus one per op using it right now */
    int live;
    /* HCMOCK_PINNED_DEVPTR=1: pinned memory's device address (dalias, an
     * entry of its own whose owner holds the backing) is not its host
     * address, which is then no device address at all. */
    uint64_t dalias;
    struct mmem *owner;
} mmem_t;

typedef struct mevent {
    uint32_t magic;
    struct mevent *next;
    mctx_t *ctx;
    unsigned gen;
    uint64_t rec;  /* records issued */
    uint64_t done; /* the latest record number that has completed */
    int captured;  /* last recorded into a capturing stream */
    int timing;    /* created without CU_EVENT_DISABLE_TIMING */
    double t_ms;   /* when the latest record completed (monotonic) */
    int refs;
    int destroyed;
} mevent_t;

enum op_kind {
    OP_NOP,
    OP_H2D,
    OP_D2H,
    OP_D2D,
    OP_SET32,
    OP_WAIT32,
    OP_WRITE32,
    OP_EVENT,
    OP_WAIT_EVENT,
    OP_AFTER, /* legacy-stream ordering: wait until another stream ran n ops */
    OP_KERNEL,
    OP_HOSTFN,
};

struct mfunc;

typedef struct mop {
    struct mop *next;
    enum op_kind kind;
    uint64_t d0, d1;  /* device addresses: destination, source */
    void *h;          /* host address */
    struct mmem *hm;  /* h's pinned allocation, if it is one (referenced) */
    size_t n;         /* bytes; elements for kernels and memset */
    uint32_t v;
    unsigned flags;
    mevent_t *ev;
    uint64_t target;
    struct mstream *after;
    struct mfunc *fn;
    uint64_t karg[5]; /* kernel parameters, copied at launch as the driver does */
    unsigned reps;    /* gridDim.y*z x blockDim.y*z */
    hcmock_fn hfn;
    void *harg;
    uint64_t qticket; /* its place in its stream's hardware queue */
} mop_t;

typedef struct mstream {
    uint32_t magic;
    struct mstream *next;
    mctx_t *ctx;
    unsigned gen;
    unsigned flags;
    int legacy;
    int destroyed; /* no more work; the worker leaves when the queue is empty */
    int capture;   /* CU_STREAM_CAPTURE_STATUS_* */
    int capmode;   /* the capture's CU_STREAM_CAPTURE_MODE_*, and its thread */
    pthread_t capthread;
    int refs;      /* registry, worker, waiters, OP_AFTER entries */
    unsigned id;
    int hwq;       /* its hardware queue (g.nhwq > 0) */
    pthread_cond_t cv;
    mop_t *head, *tail;
    uint64_t enq, done;
    char cur[200]; /* what the worker is doing, for "stuck" messages */
} mstream_t;

enum { K_REDUCE, K_AVG, K_SCALE };

/* A kernel's element count, from its parameters (kernels.cu's layouts). */
#define KARG_N(f, karg) ((f)->avg == K_AVG ? (karg)[1] : (f)->avg == K_SCALE ? (karg)[2] : (karg)[3])

typedef struct mfunc {
    uint32_t magic;
    struct mmodule *mod;
    char name[64];
    int avg; /* K_REDUCE, K_AVG or K_SCALE: which kernels.cu family */
    hcoll_dtype_t dt;
    hcoll_op_t op;
} mfunc_t;

typedef struct mmodule {
    uint32_t magic;
    struct mmodule *next;
    int refs;         /* the handle, plus one per queued launch */
    mctx_t *ctx;
    unsigned gen;
    int verify_names; /* the image's ELF sections could be read */
    char **names;     /* kernels in the image */
    size_t nnames;
    mfunc_t *funcs[64]; /* handles given out, one per name */
    size_t nfuncs;
} mmodule_t;

typedef struct mgraph {
    uint32_t magic;
} mgraph_t;

/* ---- Process state ----------------------------------------------------- */

/* The driver is one per process, like the real one: this state is the
 * emulated device, not per-object state of a library. One lock guards it;
 * queued ops run without it. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t done_cv; /* some op completed */
    pid_t pid;              /* of cuInit; 0 before */
    int ndev;
    int cc_major, cc_minor;
    unsigned delay_us;
    int poison;
    int capture_all;
    int dmabuf;
    int mempools; /* HCMOCK_MEMPOOLS */
    int pin_alias; /* HCMOCK_PINNED_DEVPTR */
    int trace;
    int race;  /* HCMOCK_RACE: 0 off, 1 report, 2 report and fail the op */
    int nhwq;  /* hardware queues per context; 0: one per stream (HCMOCK_QUEUES=stream) */
    int races; /* reported so far */
    size_t mem_per_dev;
    size_t mem_used[MAX_DEV];
    mctx_t ctx[MAX_DEV];
    /* device address space */
    char *va_base;
    uint64_t va_next, va_end;
    struct { uint64_t base; size_t span; } *va_free;
    size_t nva_free, cap_va_free;
    /* allocation table, sorted by base */
    mmem_t **mem;
    size_t nmem, capmem;
    uint64_t next_buffer_id;
    mstream_t *streams;
    mevent_t *events;
    mmodule_t *modules;
    unsigned next_stream_id;
} g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
};

static __thread mctx_t *t_stack[CTX_STACK];
static __thread int t_depth;
static __thread int t_capmode; /* cuThreadExchangeStreamCaptureMode; 0: GLOBAL */

static void mock_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void mock_say(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "hcmock[%d]: %s\n", (int)getpid(), buf);
}

/* ---- Errors --------------------------------------------------------------- */

static const struct {
    int code;
    const char *name, *text;
} err_table[] = {
    { CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
    { CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
    { CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
    { CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
    { 4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
    { CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
    { CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
    { CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid" },
    { CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
    { CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
      "no kernel image is available for execution on the device" },
    { CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
    { CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
      "the operation cannot be performed in the present state" },
    { CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
    { CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
    { CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
      "an illegal memory access was encountered" },
    { CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed" },
    { CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address" },
    { CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
    { CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
      "operation not permitted when stream is capturing" },
    { CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
      "operation failed due to a previous error during capture" },
    { CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
      "capture was not initiated in this stream" },
    { CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
      "operation would make the legacy stream depend on a capturing stream" },
    { CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
      "operation not permitted on an event last recorded in a capturing stream" },
    { CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

static int err_find(int code)
{
    for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++)
        if (err_table[i].code == code)
            return (int)i;
    return -1;
}

CUAPI int cuGetErrorName(int error, const char **pstr)
{
    int i = err_find(error);
    if (!pstr)
        return CUDA_ERROR_INVALID_VALUE;
    *pstr = i >= 0 ? err_table[i].name : NULL;
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUAPI int cuGetErrorString(int error, const char **pstr)
{
    int i = err_find(error);
    if (!pstr)
        return CUDA_ERROR_INVALID_VALUE;
    *pstr = i >= 0 ? err_table[i].text : NULL;
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static const char *err_name(int code)
{
    int i = err_find(code);
    return i >= 0 ? err_table[i].name : "CUDA_ERROR_?";
}

CUAPI const char *hcmock_driver(void)
{
    return "hcoll-mock-cuda";
}

/* ---- Initialisation and fork ---------------------------------------------- */

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long x = strtol(v, &end, 0);
    return *end ? dflt : x;
}

/* Every entry point but the error strings starts here. A child forked
 * after cuInit gets CUDA_ERROR_NOT_INITIALIZED from every call, cuInit
 * included, as from the real driver. The lock is not taken: a fork may
 * have copied it held. */
static int check_init(void)
{
    pid_t p = __atomic_load_n(&g.pid, __ATOMIC_ACQUIRE);
    if (p == 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (p != getpid()) {
        static int said;
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            mock_say("CUDA was initialised in parent process %d before fork(): every call in "
                     "this child fails with CUDA_ERROR_NOT_INITIALIZED, as on a real driver",
                     (int)p);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    return CUDA_SUCCESS;
}

#define CHECK_INIT()                                                                         \
    do {                                                                                     \
        int ci_ = check_init();                                                              \
        if (ci_ != CUDA_SUCCESS)                                                             \
            return ci_;                                                                      \
    } while (0)

CUAPI int cuInit(unsigned flags)
{
    pid_t p = __atomic_load_n(&g.pid, __ATOMIC_ACQUIRE);
    if (p != 0)
        return check_init();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    if (g.pid == 0) {
        long n = env_long("HCMOCK_NDEV", 2);
        if (n <= 0) {
            pthread_mutex_unlock(&g.lock);
            return CUDA_ERROR_NO_DEVICE;
        }
        g.ndev = n > MAX_DEV ? MAX_DEV : (int)n;
        g.cc_major = 9;
        g.cc_minor = 0;
        const char *cc = getenv("HCMOCK_CC");
        if (cc && sscanf(cc, "%d.%d", &g.cc_major, &g.cc_minor) != 2) {
            g.cc_major = 9;
            g.cc_minor = 0;
        }
        long d = env_long("HCMOCK_DELAY_US", 50);
        g.delay_us = d > 0 ? (unsigned)d : 0;
        g.poison = (int)env_long("HCMOCK_POISON", 0xa5);
        g.capture_all = env_long("HCMOCK_CAPTURE", 0) == 1;
        g.mempools = env_long("HCMOCK_MEMPOOLS", 1) != 0;
        g.pin_alias = env_long("HCMOCK_PINNED_DEVPTR", 0) == 1;
        g.dmabuf = (int)env_long("HCMOCK_DMABUF", 0);
        g.trace = env_long("HCMOCK_TRACE", 0) == 1;
        g.race = (int)env_long("HCMOCK_RACE", 1);
        long q = env_long("CUDA_DEVICE_MAX_CONNECTIONS", 8);
        g.nhwq = q < 1 ? 1 : q > MAX_HWQ ? MAX_HWQ : (int)q;
        const char *qm = getenv("HCMOCK_QUEUES");
        if (qm && strcmp(qm, "stream") == 0)
            g.nhwq = 0;
        g.mem_per_dev = (size_t)env_long("HCMOCK_MEM_GB", 80) << 30;
        for (int i = 0; i < g.ndev; i++)
            g.ctx[i].dev = i;
        /* Device addresses: reserved, never accessible from the host. */
        void *va = mmap(NULL, VA_RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
        if (va == MAP_FAILED) {
            pthread_mutex_unlock(&g.lock);
            mock_say("cannot reserve the device address space: %s", strerror(errno));
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g.va_base = va;
        g.va_next = (uint64_t)(uintptr_t)va + BIG_ALIGN; /* 0 offset is never handed out */
        g.va_end = (uint64_t)(uintptr_t)va + VA_RESERVE;
        g.next_buffer_id = 1;
        __atomic_store_n(&g.pid, getpid(), __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g.lock);
    return CUDA_SUCCESS;
}

CUAPI int cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = 12080;
    return CUDA_SUCCESS;
}

/* ---- Devices ------------------------------------------------------------ */

static int dev_check(int dev)
{
    return dev >= 0 && dev < g.ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUAPI int cuDeviceGet(int *device, int ordinal)
{
    CHECK_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev_check(ordinal) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUAPI int cuDeviceGetCount(int *count)
{
    CHECK_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g.ndev;
    return CUDA_SUCCESS;
}

CUAPI int cuDeviceGetName(char *name, int len, int dev)
{
    CHECK_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev_check(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "hcoll mock GPU");
    return CUDA_SUCCESS;
}

CUAPI int cuDeviceTotalMem_v2(size_t *bytes, int dev)
{
    CHECK_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev_check(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g.mem_per_dev;
    return CUDA_SUCCESS;
}

/* PCI bus numbers of an 8-GPU HGX board; more devices count on. */
static int dev_bus(int dev)
{
    static const int bus[8] = { 0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf };
    return dev < 8 ? bus[dev] : 0xe0 + dev;
}

static int rdma_ordering(void);

CUAPI int cuDeviceGetAttribute(int *pi, int attrib, int dev)
{
    CHECK_INIT();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev_check(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (attrib < 1 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    int v = 0; /* attributes not listed: 0 (not supported / none) */
    switch (attrib) {
    case 1: v = 1024; break;         /* MAX_THREADS_PER_BLOCK */
    case 2: case 3: v = 1024; break; /* MAX_BLOCK_DIM_X, Y */
    case 4: v = 64; break;           /* MAX_BLOCK_DIM_Z */
    case 5: v = 2147483647; break;   /* MAX_GRID_DIM_X */
    case 6: case 7: v = 65535; break;
    case 8: v = 49152; break;        /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 9: v = 65536; break;        /* TOTAL_CONSTANT_MEMORY */
    case 10: v = 32; break;          /* WARP_SIZE */
    case 12: v = 65536; break;       /* MAX_REGISTERS_PER_BLOCK */
    case 13: v = 1980000; break;     /* CLOCK_RATE (kHz) */
    case 14: v = 512; break;         /* TEXTURE_ALIGNMENT */
    case 15: v = 1; break;           /* GPU_OVERLAP */
    case 16: v = 132; break;         /* MULTIPROCESSOR_COUNT */
    case 19: v = 1; break;           /* CAN_MAP_HOST_MEMORY */
    case 31: v = 1; break;           /* CONCURRENT_KERNELS */
    case 33: v = dev_bus(dev); break; /* PCI_BUS_ID */
    case 36: v = 2619000; break;     /* MEMORY_CLOCK_RATE */
    case 37: v = 5120; break;        /* GLOBAL_MEMORY_BUS_WIDTH */
    case 38: v = 50 << 20; break;    /* L2_CACHE_SIZE */
    case 39: v = 2048; break;        /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 40: v = 3; break;           /* ASYNC_ENGINE_COUNT */
    case 41: v = 1; break;           /* UNIFIED_ADDRESSING */
    case 75: v = g.cc_major; break;  /* COMPUTE_CAPABILITY_MAJOR */
    case 76: v = g.cc_minor; break;
    case 83: v = 1; break;           /* MANAGED_MEMORY */
    case 97: v = 232448; break;      /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 102: v = 1; break;          /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    case 115: v = g.mempools; break; /* MEMORY_POOLS_SUPPORTED */
    case 116: v = 1; break;          /* GPU_DIRECT_RDMA_SUPPORTED */
    case 122: v = 1; break;          /* CAN_USE_64_BIT_STREAM_MEM_OPS */
    case 123: v = 1; break;          /* CAN_USE_STREAM_WAIT_VALUE_NOR */
    case 124: v = g.dmabuf >= 1; break; /* DMA_BUF_SUPPORTED */
    case 118: v = rdma_ordering(); break; /* GPU_DIRECT_RDMA_WRITES_ORDERING */
    case 86: v = env_long("HCMOCK_C2C", 0) == 1; break; /* HOST_NATIVE_ATOMIC_SUPPORTED */
    default: break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

CUAPI int cuDeviceGetPCIBusId(char *id, int len, int dev)
{
    CHECK_INIT();
    if (!id || len < 13)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev_check(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    /* Upper case, as the driver writes it. */
    snprintf(id, (size_t)len, "0000:%02X:00.0", dev_bus(dev));
    return CUDA_SUCCESS;
}

/* ---- Contexts ----------------------------------------------------------- */

static int ctx_known(const void *c)
{
    for (int i = 0; i < g.ndev; i++)
        if (c == &g.ctx[i])
            return 1;
    return 0;
}

/* The calling thread's context, usable for new work. Lock held. */
static int ctx_current(mctx_t **out)
{
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    mctx_t *c = t_stack[t_depth - 1];
    if (!c->active)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (c->sticky)
        return c->sticky;
    *out = c;
    return CUDA_SUCCESS;
}

static void stream_unref(mstream_t *s);
static void mem_unref(mmem_t *m);
static int capture_forbids(const char *who);
static void mem_table_remove(mmem_t *m);

CUAPI int cuDevicePrimaryCtxRetain(void **pctx, int dev)
{
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev_check(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c = &g.ctx[dev];
    if (c->refs++ == 0) {
        c->active = 1;
        c->gen++;
        c->sticky = 0;
        memset(c->hwq, 0, sizeof c->hwq);
        c->nstreams = 0;
    }
    pthread_mutex_unlock(&g.lock);
    *pctx = c;
    return CUDA_SUCCESS;
}

/* The last release destroys the primary context: its streams stop, its
 * memory and handles become invalid. */
static void ctx_deactivate(mctx_t *c)
{
    c->active = 0;
    pthread_cond_broadcast(&g.done_cv); /* workers waiting for their queue's turn */
    /* Each stream's worker still holds a reference: none is freed here. */
    for (mstream_t *s = g.streams; s; s = s->next)
        if (s->ctx == c && s->gen == c->gen && !s->destroyed) {
            s->destroyed = 1;
            pthread_cond_signal(&s->cv);
            if (!s->legacy)
                stream_unref(s); /* the registry's reference */
        }
    if (c->legacy) {
        stream_unref(c->legacy);
        c->legacy = NULL;
    }
    for (size_t i = 0; i < g.nmem;) {
        mmem_t *m = g.mem[i];
        if (m->ctx == c && m->gen == c->gen) {
            m->live = 0;
            if (!m->pinned)
                g.mem_used[c->dev] -= m->span;
            mem_table_remove(m);
            mem_unref(m);
        } else {
            i++;
        }
    }
}

CUAPI int cuDevicePrimaryCtxRelease_v2(int dev)
{
    CHECK_INIT();
    if (dev_check(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c = &g.ctx[dev];
    int r = CUDA_SUCCESS;
    if (c->refs == 0)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--c->refs == 0)
        ctx_deactivate(c);
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuCtxGetCurrent(void **pctx)
{
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_depth ? t_stack[t_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

CUAPI int cuCtxSetCurrent(void *ctx)
{
    CHECK_INIT();
    if (!ctx) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_known(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUAPI int cuCtxPushCurrent_v2(void *ctx)
{
    CHECK_INIT();
    if (!ctx || !ctx_known(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUAPI int cuCtxPopCurrent_v2(void **pctx)
{
    CHECK_INIT();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    mctx_t *c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUAPI int cuCtxGetDevice(int *dev)
{
    CHECK_INIT();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    mctx_t *c = t_stack[t_depth - 1];
    if (!c->active)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

CUAPI int hcmock_current_device(void)
{
    if (check_init() != CUDA_SUCCESS || t_depth == 0)
        return -1;
    return t_stack[t_depth - 1]->dev;
}

/* ---- Memory table ------------------------------------------------------- */

/* Index of the allocation that holds address p, or -1. Lock held. */
static long mem_find(uint64_t p)
{
    size_t lo = 0, hi = g.nmem;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g.mem[mid]->base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    mmem_t *m = g.mem[lo - 1];
    return p < m->base + m->size ? (long)(lo - 1) : -1;
}

static int mem_table_add(mmem_t *m)
{
    if (g.nmem == g.capmem) {
        size_t cap = g.capmem ? g.capmem * 2 : 64;
        mmem_t **p = realloc(g.mem, cap * sizeof *p);
        if (!p)
            return -1;
        g.mem = p;
        g.capmem = cap;
    }
    size_t i = g.nmem;
    while (i > 0 && g.mem[i - 1]->base > m->base) {
        g.mem[i] = g.mem[i - 1];
        i--;
    }
    g.mem[i] = m;
    g.nmem++;
    return 0;
}

static void mem_table_remove(mmem_t *m)
{
    for (size_t i = 0; i < g.nmem; i++)
        if (g.mem[i] == m) {
            memmove(&g.mem[i], &g.mem[i + 1], (g.nmem - i - 1) * sizeof g.mem[0]);
            g.nmem--;
            return;
        }
}

/* The backing goes when the table and every op using it let go. A freed
 * device range goes back to the address pool: the driver hands the same
 * addresses out again, so anything keyed by address alone goes stale. */
static void mem_unref(mmem_t *m)
{
    if (--m->refs > 0)
        return;
    if (m->owner) { /* a device alias of pinned memory: the owner maps it */
        mem_unref(m->owner);
        free(m);
        return;
    }
    munmap(m->host, m->span);
    if (!m->pinned && g.nva_free < 4096) {
        if (g.nva_free == g.cap_va_free) {
            size_t cap = g.cap_va_free ? g.cap_va_free * 2 : 64;
            void *p = realloc(g.va_free, cap * sizeof g.va_free[0]);
            if (p) {
                g.va_free = p;
                g.cap_va_free = cap;
            }
        }
        if (g.nva_free < g.cap_va_free) {
            g.va_free[g.nva_free].base = m->base;
            g.va_free[g.nva_free].span = m->span;
            g.nva_free++;
        }
    }
    free(m);
}

/*
 * The backing of [p, p+len) when the whole range lies in one live
 * allocation (len 0: p inside or at its end), device memory or, with UVA,
 * pinned host memory. *mem_out (may be NULL) gets the allocation with a
 * reference taken. Lock held.
 */
static void *mem_xlate(uint64_t p, size_t len, mmem_t **mem_out)
{
    long i = mem_find(p);
    if (i < 0 && len == 0 && p > 0)
        i = mem_find(p - 1); /* the end of an allocation, for an empty range */
    if (i < 0)
        return NULL;
    mmem_t *m = g.mem[i];
    if (!m->live || len > m->size - (p - m->base))
        return NULL;
    if (m->dalias) /* pinned memory's host address, with a device address of its own */
        return NULL;
    if (mem_out) {
        m->refs++;
        *mem_out = m;
    }
    return (char *)m->host + (p - m->base);
}

/* A host pointer argument that is really a device address (the caller
 * mixed them up) would make the worker fault on the reservation. */
static int is_device_va(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    return g.va_base && a >= (uint64_t)(uintptr_t)g.va_base && a < g.va_end;
}

CUAPI void *hcmock_dev_to_host(uint64_t p, size_t len)
{
    if (check_init() != CUDA_SUCCESS)
        return NULL;
    pthread_mutex_lock(&g.lock);
    void *h = mem_xlate(p, len, NULL);
    pthread_mutex_unlock(&g.lock);
    return h;
}

static int mem_new(mctx_t *c, size_t size, int pinned, mmem_t **out)
{
    size_t align = pinned              ? (size_t)sysconf(_SC_PAGESIZE)
                   : size >= BIG_ALIGN ? BIG_ALIGN
                                       : SMALL_ALIGN;
    size_t span = (size + align - 1) & ~(align - 1);
    if (!pinned && g.mem_used[c->dev] + span > g.mem_per_dev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    mmem_t *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t mspan = (span + 4095) & ~(size_t)4095;
    void *host = mmap(NULL, mspan, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->host = host;
    m->size = size;
    m->span = mspan;
    m->pinned = pinned;
    if (pinned) {
        m->base = (uint64_t)(uintptr_t)host;
    } else {
        /* The same span freed earlier is reused first, as a driver's
         * sub-allocator does. */
        m->base = 0;
        for (size_t i = g.nva_free; i-- > 0;)
            if (g.va_free[i].span == mspan) {
                m->base = g.va_free[i].base;
                g.va_free[i] = g.va_free[--g.nva_free];
                break;
            }
        if (!m->base) {
            uint64_t b = (g.va_next + align - 1) & ~(uint64_t)(align - 1);
            if (b + mspan > g.va_end) {
                munmap(host, mspan);
                free(m);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            m->base = b;
            g.va_next = b + mspan;
        }
        g.mem_used[c->dev] += mspan;
    }
    m->ctx = c;
    m->gen = c->gen;
    m->id = g.next_buffer_id++;
    m->refs = 1;
    m->live = 1;
    if (mem_table_add(m) != 0) {
        if (!pinned)
            g.mem_used[c->dev] -= mspan;
        munmap(host, mspan);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = m;
    return CUDA_SUCCESS;
}

/* ---- Streams ------------------------------------------------------------ */

static void *stream_main(void *arg);

static void stream_unref(mstream_t *s)
{
    if (--s->refs > 0)
        return;
    mstream_t **pp = &g.streams;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp)
        *pp = s->next;
    pthread_cond_destroy(&s->cv);
    s->magic = 0;
    free(s);
}

/* Lock held. */
static int stream_new(mctx_t *c, unsigned flags, int legacy, mstream_t **out)
{
    mstream_t *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = MAGIC_STREAM;
    s->ctx = c;
    s->gen = c->gen;
    s->flags = flags;
    s->legacy = legacy;
    s->id = ++g.next_stream_id;
    s->hwq = g.nhwq ? (int)(c->nstreams++ % (unsigned)g.nhwq) : 0;
    s->refs = 2; /* the registry (or the context, for legacy) and the worker */
    snprintf(s->cur, sizeof s->cur, "idle");
    pthread_cond_init(&s->cv, NULL);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int rc = pthread_create(&th, &at, stream_main, s);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->next = g.streams;
    g.streams = s;
    *out = s;
    return CUDA_SUCCESS;
}

/* The calling thread's per-thread default stream of each device (and the
 * context life it belongs to): made on first use, a blocking stream like
 * the driver's, so the legacy stream and it wait for each other. */
static __thread mstream_t *t_ptds[MAX_DEV];
static __thread unsigned t_ptds_gen[MAX_DEV];

/* A live user stream handle, the current context's legacy stream for NULL
 * and CU_STREAM_LEGACY, or the calling thread's own per-thread default
 * stream for CU_STREAM_PER_THREAD (each thread a different stream, as on a
 * real driver). need_ctx: the call also needs a current context that owns
 * the stream. Lock held. */
static int stream_resolve(void *h, int need_ctx, mstream_t **out)
{
    mctx_t *cur = NULL;
    int r = ctx_current(&cur);
    if (h == CU_STREAM_PER_THREAD) {
        if (r != CUDA_SUCCESS)
            return r;
        if (!t_ptds[cur->dev] || t_ptds_gen[cur->dev] != cur->gen) {
            r = stream_new(cur, 0, 0, &t_ptds[cur->dev]);
            if (r != CUDA_SUCCESS)
                return r;
            t_ptds_gen[cur->dev] = cur->gen;
        }
        if (cur->sticky)
            return cur->sticky;
        *out = t_ptds[cur->dev];
        return CUDA_SUCCESS;
    }
    if (!h || h == CU_STREAM_LEGACY) {
        if (r != CUDA_SUCCESS)
            return r;
        if (!cur->legacy) {
            r = stream_new(cur, 0, 1, &cur->legacy);
            if (r != CUDA_SUCCESS)
                return r;
        }
        *out = cur->legacy;
        return CUDA_SUCCESS;
    }
    mstream_t *s = g.streams;
    while (s && (s != h || s->legacy || s->destroyed))
        s = s->next;
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!s->ctx->active || s->gen != s->ctx->gen)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (need_ctx) {
        if (r != CUDA_SUCCESS)
            return r;
        if (cur != s->ctx) {
            mock_say("stream %u belongs to GPU %d's context, but the calling thread has GPU "
                     "%d's context current",
                     s->id, s->ctx->dev, cur->dev);
            return CUDA_ERROR_INVALID_HANDLE;
        }
    }
    if (s->ctx->sticky)
        return s->ctx->sticky;
    *out = s;
    return CUDA_SUCCESS;
}

static mop_t *op_new(enum op_kind kind)
{
    mop_t *op = calloc(1, sizeof *op);
    if (op)
        op->kind = kind;
    return op;
}

static void event_unref(mevent_t *e)
{
    if (--e->refs > 0)
        return;
    mevent_t **pp = &g.events;
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp)
        *pp = e->next;
    e->magic = 0;
    free(e);
}

static void module_unref(struct mmodule *m);

/* Drop what an op holds (events, streams, a module, pinned host memory);
 * device ranges are looked up again when it runs. Lock held. */
static void op_free(mop_t *op)
{
    if (op->ev)
        event_unref(op->ev);
    if (op->after)
        stream_unref(op->after);
    if (op->fn)
        module_unref(op->fn->mod);
    if (op->hm)
        mem_unref(op->hm);
    free(op);
}

static void queue_push(mstream_t *s, mop_t *op)
{
    op->next = NULL;
    if (g.nhwq)
        op->qticket = s->ctx->hwq[s->hwq].next++;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->enq++;
    pthread_cond_signal(&s->cv);
}

/* While a blocking stream is being captured the legacy stream, which
 * would depend on it, is unusable (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). */
static int legacy_blocked(const mctx_t *c)
{
    for (const mstream_t *b = g.streams; b; b = b->next)
        if (!b->legacy && b->ctx == c && b->gen == c->gen && !b->destroyed &&
            !(b->flags & CU_STREAM_NON_BLOCKING) && b->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE)
            return 1;
    return 0;
}

/*
 * Queue op on s. The legacy stream waits for the work already queued on
 * every blocking stream of its context, and a blocking stream waits for
 * the work already on the legacy stream (non-blocking streams do neither).
 * Work on a capturing stream goes into the graph, which is never run.
 * Takes op in every case. Lock held.
 */
static int enqueue(mstream_t *s, mop_t *op)
{
    if (s->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        if (op->kind == OP_EVENT)
            op->ev->captured = 1;
        op_free(op);
        if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE)
            return CUDA_SUCCESS;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    if (s->legacy) {
        if (legacy_blocked(s->ctx)) {
            mock_say("work on the legacy stream while a blocking stream of GPU %d is being "
                     "captured: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
                     s->ctx->dev);
            op_free(op);
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
        for (mstream_t *b = g.streams; b; b = b->next) {
            if (b == s || b->legacy || b->ctx != s->ctx || b->gen != s->gen ||
                (b->flags & CU_STREAM_NON_BLOCKING) || b->done >= b->enq)
                continue;
            mop_t *w = op_new(OP_AFTER);
            if (!w)
                break;
            w->after = b;
            w->target = b->enq;
            b->refs++;
            queue_push(s, w);
        }
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
        mstream_t *l = s->ctx->legacy;
        if (l && l->done < l->enq) {
            mop_t *w = op_new(OP_AFTER);
            if (w) {
                w->after = l;
                w->target = l->enq;
                l->refs++;
                queue_push(s, w);
            }
        }
    }
    queue_push(s, op);
    return CUDA_SUCCESS;
}

/* Wait until s has run target ops, or its context is gone. Says once
 * where it is stuck after SLOW_WAIT_S. Lock held. */
static void stream_wait_done(mstream_t *s, uint64_t target, const char *who)
{
    time_t t0 = time(NULL);
    int said = 0;
    s->refs++;
    while (s->done < target && s->ctx->active && s->gen == s->ctx->gen) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&g.done_cv, &g.lock, &ts);
        if (!said && time(NULL) - t0 >= SLOW_WAIT_S) {
            said = 1;
            mock_say("%s has waited %d s for stream %u (GPU %d), which is at: %s", who,
                     SLOW_WAIT_S, s->id, s->ctx->dev, s->cur);
        }
    }
    stream_unref(s);
}

/* Implicit synchronisation (cuMemFree, cuCtxSynchronize): every stream of
 * the context runs what was queued before the call (work queued later by
 * other threads is not waited for). Lock held. */
static void ctx_drain(mctx_t *c, const char *who)
{
    size_t n = 0;
    for (mstream_t *s = g.streams; s; s = s->next)
        n += s->ctx == c && s->gen == c->gen && s->done < s->enq;
    if (n == 0)
        return;
    struct {
        mstream_t *s;
        uint64_t target;
    } *snap = calloc(n, sizeof *snap);
    if (!snap)
        return;
    size_t k = 0;
    for (mstream_t *s = g.streams; s && k < n; s = s->next)
        if (s->ctx == c && s->gen == c->gen && s->done < s->enq) {
            snap[k].s = s;
            snap[k].target = s->enq;
            s->refs++;
            k++;
        }
    for (size_t i = 0; i < k; i++) {
        stream_wait_done(snap[i].s, snap[i].target, who);
        stream_unref(snap[i].s);
    }
    free(snap);
}

CUAPI int cuStreamCreate(void **ph, unsigned flags)
{
    CHECK_INIT();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c;
    mstream_t *s = NULL;
    int r = ctx_current(&c);
    if (r == CUDA_SUCCESS)
        r = stream_new(c, flags, 0, &s);
    pthread_mutex_unlock(&g.lock);
    if (r == CUDA_SUCCESS)
        *ph = s;
    return r;
}

/* Returns at once, as the driver does; the worker finishes what is queued
 * and then goes. */
CUAPI int cuStreamDestroy_v2(void *h)
{
    CHECK_INIT();
    if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g.lock);
    mstream_t *s = g.streams;
    while (s && (s != h || s->legacy || s->destroyed))
        s = s->next;
    int r = CUDA_ERROR_INVALID_HANDLE;
    if (s) {
        if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE)
            mock_say("stream %u destroyed while capturing", s->id);
        s->destroyed = 1;
        pthread_cond_signal(&s->cv);
        stream_unref(s);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuStreamSynchronize(void *h)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(h, 0, &s);
    if (r == CUDA_SUCCESS && s->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (r == CUDA_SUCCESS)
        r = capture_forbids("cuStreamSynchronize");
    if (r == CUDA_SUCCESS) {
        if (s->legacy) {
            /* Synchronising the legacy stream also waits for the blocking
             * streams: an empty op behind them. */
            mop_t *op = op_new(OP_NOP);
            if (op)
                enqueue(s, op);
        }
        mctx_t *c = s->ctx; /* s may be gone after the wait (destroyed meanwhile) */
        stream_wait_done(s, s->enq, "cuStreamSynchronize");
        r = !c->active ? CUDA_ERROR_CONTEXT_IS_DESTROYED : c->sticky;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuStreamQuery(void *h)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(h, 0, &s);
    if (r == CUDA_SUCCESS && s->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (r == CUDA_SUCCESS)
        r = capture_forbids("cuStreamQuery");
    if (r == CUDA_SUCCESS)
        r = s->done < s->enq ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuStreamGetCtx(void *h, void **pctx)
{
    CHECK_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(h, 0, &s);
    if (r == CUDA_SUCCESS)
        *pctx = s->ctx;
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuStreamIsCapturing(void *h, int *status)
{
    CHECK_INIT();
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(h, 0, &s);
    if (r == CUDA_SUCCESS && s->legacy && legacy_blocked(s->ctx))
        r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if (r == CUDA_SUCCESS)
        *status = g.capture_all ? CU_STREAM_CAPTURE_STATUS_ACTIVE : s->capture;
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuStreamBeginCapture_v2(void *h, int mode)
{
    CHECK_INIT();
    if (mode < 0 || mode > 2)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(h, 1, &s);
    if (r == CUDA_SUCCESS && s->legacy)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    else if (r == CUDA_SUCCESS && s->capture != CU_STREAM_CAPTURE_STATUS_NONE)
        r = CUDA_ERROR_ILLEGAL_STATE;
    if (r == CUDA_SUCCESS) {
        s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        s->capmode = mode;
        s->capthread = pthread_self();
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* The thread's interaction mode with captures (cuStreamBeginCapture's
 * rules): GLOBAL (the default) forbids potentially unsafe calls while this
 * thread captures in a mode other than RELAXED or any thread captures in
 * GLOBAL mode; THREAD_LOCAL only the former; RELAXED neither. */
CUAPI int cuThreadExchangeStreamCaptureMode(int *mode)
{
    CHECK_INIT();
    if (!mode || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int prev = t_capmode;
    t_capmode = *mode;
    *mode = prev;
    return CUDA_SUCCESS;
}

/*
 * A potentially unsafe call (one that is not stream-ordered, so a graph
 * could not replay it: allocation, free, module load/unload, host
 * synchronisation and queries) made while a capture forbids it for this
 * thread (cuThreadExchangeStreamCaptureMode): it fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures it
 * conflicts with, as on a real driver. Lock held.
 */
static int capture_forbids(const char *who)
{
    if (t_capmode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    int r = CUDA_SUCCESS;
    const pthread_t self = pthread_self();
    for (mstream_t *s = g.streams; s; s = s->next) {
        if (s->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE || s->destroyed)
            continue;
        int mine = pthread_equal(s->capthread, self);
        if ((mine && s->capmode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && s->capmode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
             t_capmode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            mock_say("%s while stream %u (GPU %d) is being captured in %s mode%s: "
                     "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture is invalidated "
                     "(cuThreadExchangeStreamCaptureMode(RELAXED) around it avoids this)",
                     who, s->id, s->ctx->dev,
                     s->capmode == CU_STREAM_CAPTURE_MODE_GLOBAL ? "global" : "thread-local",
                     mine ? " by this thread" : " by another thread");
            s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    return r;
}

/* The graph is an empty handle: nothing replays captured work here. */
CUAPI int cuStreamEndCapture(void *h, void **pgraph)
{
    CHECK_INIT();
    if (!pgraph)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(h, 0, &s);
    if (r == CUDA_SUCCESS) {
        if (s->capture == CU_STREAM_CAPTURE_STATUS_NONE)
            r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
        else if (s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    }
    pthread_mutex_unlock(&g.lock);
    *pgraph = NULL;
    if (r == CUDA_SUCCESS) {
        mgraph_t *gr = calloc(1, sizeof *gr);
        if (!gr)
            return CUDA_ERROR_OUT_OF_MEMORY;
        gr->magic = MAGIC_GRAPH;
        *pgraph = gr;
    }
    return r;
}

CUAPI int cuGraphDestroy(void *graph)
{
    CHECK_INIT();
    mgraph_t *gr = graph;
    if (!gr || gr->magic != MAGIC_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    gr->magic = 0;
    free(gr);
    return CUDA_SUCCESS;
}

/* ---- Events ------------------------------------------------------------- */

/* Lock held. */
static mevent_t *event_find(void *h)
{
    mevent_t *e = g.events;
    while (e && (e != h || e->destroyed))
        e = e->next;
    return e;
}

CUAPI int cuEventCreate(void **ph, unsigned flags)
{
    CHECK_INIT();
    if (!ph || (flags & ~(unsigned)CU_EVENT_VALID_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    if ((flags & 0x4) && !(flags & 0x2)) /* INTERPROCESS needs DISABLE_TIMING */
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c;
    int r = ctx_current(&c);
    mevent_t *e = NULL;
    if (r == CUDA_SUCCESS) {
        e = calloc(1, sizeof *e);
        if (!e) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            e->magic = MAGIC_EVENT;
            e->timing = !(flags & 0x2);
            e->ctx = c;
            e->gen = c->gen;
            e->refs = 1;
            e->next = g.events;
            g.events = e;
        }
    }
    pthread_mutex_unlock(&g.lock);
    if (r == CUDA_SUCCESS)
        *ph = e;
    return r;
}

static int event_check(mevent_t *e)
{
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!e->ctx->active || e->gen != e->ctx->gen)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return e->ctx->sticky;
}

CUAPI int cuEventRecord(void *he, void *hs)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mevent_t *e = event_find(he);
    mstream_t *s;
    int r = event_check(e);
    if (r == CUDA_SUCCESS)
        r = stream_resolve(hs, 1, &s);
    if (r == CUDA_SUCCESS && s->ctx != e->ctx)
        r = CUDA_ERROR_INVALID_HANDLE;
    mop_t *op = NULL;
    if (r == CUDA_SUCCESS && !(op = op_new(OP_EVENT)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        e->captured = 0;
        op->ev = e;
        op->target = ++e->rec;
        e->refs++;
        r = enqueue(s, op);
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuEventQuery(void *he)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mevent_t *e = event_find(he);
    int r = event_check(e);
    if (r == CUDA_SUCCESS && e->captured)
        r = CUDA_ERROR_CAPTURED_EVENT;
    if (r == CUDA_SUCCESS)
        r = capture_forbids("cuEventQuery");
    if (r == CUDA_SUCCESS && e->done < e->rec)
        r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* Milliseconds between two completed records, as the real driver measures
 * them (here: when each record ran on its stream's worker). Events made
 * with CU_EVENT_DISABLE_TIMING, or never recorded, are invalid handles;
 * records not yet completed are NOT_READY. */
CUAPI int cuEventElapsedTime(float *ms, void *hstart, void *hend)
{
    CHECK_INIT();
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mevent_t *a = event_find(hstart), *b = event_find(hend);
    int r = event_check(a);
    if (r == CUDA_SUCCESS)
        r = event_check(b);
    if (r == CUDA_SUCCESS && (!a->timing || !b->timing || a->rec == 0 || b->rec == 0))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && (a->done < a->rec || b->done < b->rec))
        r = CUDA_ERROR_NOT_READY;
    if (r == CUDA_SUCCESS)
        *ms = (float)(b->t_ms - a->t_ms);
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuEventSynchronize(void *he)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mevent_t *e = event_find(he);
    int r = event_check(e);
    if (r == CUDA_SUCCESS && e->captured)
        r = CUDA_ERROR_CAPTURED_EVENT;
    if (r == CUDA_SUCCESS)
        r = capture_forbids("cuEventSynchronize");
    if (r == CUDA_SUCCESS) {
        uint64_t target = e->rec;
        time_t t0 = time(NULL);
        int said = 0;
        e->refs++;
        /* A sticky error drops the record: then that error is the answer. */
        while (e->done < target && e->ctx->active && e->gen == e->ctx->gen && !e->ctx->sticky) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&g.done_cv, &g.lock, &ts);
            if (!said && time(NULL) - t0 >= SLOW_WAIT_S) {
                said = 1;
                mock_say("cuEventSynchronize has waited %d s for an event on GPU %d",
                         SLOW_WAIT_S, e->ctx->dev);
            }
        }
        r = event_check(e);
        event_unref(e);
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* A pending event goes when its last record has run (the driver's rule). */
CUAPI int cuEventDestroy_v2(void *he)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mevent_t *e = event_find(he);
    int r = CUDA_ERROR_INVALID_HANDLE;
    if (e) {
        e->destroyed = 1;
        event_unref(e);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuStreamWaitEvent(void *hs, void *he, unsigned flags)
{
    CHECK_INIT();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mevent_t *e = event_find(he);
    mstream_t *s;
    int r = event_check(e);
    if (r == CUDA_SUCCESS)
        r = stream_resolve(hs, 1, &s);
    mop_t *op = NULL;
    if (r == CUDA_SUCCESS && e->rec > 0) {
        if (!(op = op_new(OP_WAIT_EVENT))) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->ev = e;
            op->target = e->rec;
            e->refs++;
            r = enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* ---- Memory API --------------------------------------------------------- */

CUAPI int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
{
    CHECK_INIT();
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c;
    mmem_t *m = NULL;
    int r = ctx_current(&c);
    if (r == CUDA_SUCCESS)
        r = capture_forbids("cuMemAlloc");
    if (r == CUDA_SUCCESS)
        r = mem_new(c, size, 0, &m);
    pthread_mutex_unlock(&g.lock);
    if (r != CUDA_SUCCESS)
        return r;
    /* Device memory holds whatever it held before. */
    if (g.poison >= 0)
        memset(m->host, g.poison, size);
    *dptr = m->base;
    return CUDA_SUCCESS;
}

/* Device memory of the current context's GPU: what is left, and all. */
CUAPI int cuMemGetInfo_v2(size_t *free_out, size_t *total_out)
{
    CHECK_INIT();
    if (!free_out || !total_out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c;
    int r = ctx_current(&c);
    if (r == CUDA_SUCCESS) {
        *free_out = g.mem_per_dev - g.mem_used[c->dev];
        *total_out = g.mem_per_dev;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static int mem_free_common(uint64_t p, int pinned, const char *who)
{
    pthread_mutex_lock(&g.lock);
    long i = p ? mem_find(p) : -1;
    mmem_t *m = i >= 0 ? g.mem[i] : NULL;
    int r = CUDA_SUCCESS;
    if (!m || m->base != p || (m->pinned && !m->managed) != pinned) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!m->ctx->active || m->gen != m->ctx->gen) {
        r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    } else if ((r = capture_forbids(who)) != CUDA_SUCCESS) {
        /* refused: nothing freed */
    } else {
        /* cuMemFree and cuMemFreeHost synchronise the allocation's
         * context, as real drivers do: work queued before them finishes
         * first (a stream that never gets there hangs the free, as on a
         * GPU). Copies also hold their pinned buffer until they ran. */
        m->refs++;
        ctx_drain(m->ctx, who);
        if (m->live) {
            m->live = 0;
            if (!pinned)
                g.mem_used[m->ctx->dev] -= m->span;
            mem_table_remove(m);
            long ai = m->dalias ? mem_find(m->dalias) : -1;
            if (ai >= 0 && g.mem[ai]->owner == m) {
                mmem_t *a = g.mem[ai];
                a->live = 0;
                mem_table_remove(a);
                mem_unref(a); /* the table's */
            }
            mem_unref(m); /* the table's */
        }
        r = m->ctx->sticky;
        mem_unref(m);
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuMemFree_v2(unsigned long long dptr)
{
    CHECK_INIT();
    if (dptr == 0)
        return CUDA_SUCCESS;
    return mem_free_common(dptr, 0, "cuMemFree");
}

/* Stream-ordered free (CUDA 11.2): the allocation goes when the stream
 * reaches this point; the rest of the context is not waited for. */
static void mem_free_async_run(void *arg)
{
    mmem_t *m = arg;
    pthread_mutex_lock(&g.lock);
    if (m->live) {
        m->live = 0;
        g.mem_used[m->ctx->dev] -= m->span;
        mem_table_remove(m);
        mem_unref(m); /* the table's */
    }
    mem_unref(m);
    pthread_mutex_unlock(&g.lock);
}

CUAPI int cuMemFreeAsync(unsigned long long dptr, void *hstream)
{
    CHECK_INIT();
    if (!g.mempools)
        return CUDA_ERROR_NOT_SUPPORTED; /* stream-ordered allocation needs pools */
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g.lock);
    long i = mem_find(dptr);
    mmem_t *m = i >= 0 ? g.mem[i] : NULL;
    int r = CUDA_SUCCESS;
    if (!m || m->base != dptr || m->pinned || !m->live)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (!m->ctx->active || m->gen != m->ctx->gen)
        r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    else
        m->refs++;
    pthread_mutex_unlock(&g.lock);
    if (r != CUDA_SUCCESS)
        return r;
    r = hcmock_stream_enqueue(hstream, mem_free_async_run, m);
    if (r != CUDA_SUCCESS) {
        pthread_mutex_lock(&g.lock);
        mem_unref(m);
        pthread_mutex_unlock(&g.lock);
    }
    return r;
}

CUAPI int cuMemFreeHost(void *p);

/* HCMOCK_PINNED_DEVPTR=1: give pinned allocation m a device address in
 * the device range, an entry that shares m's backing. */
static int pin_alias_add(mmem_t *m)
{
    pthread_mutex_lock(&g.lock);
    int r = CUDA_ERROR_OUT_OF_MEMORY;
    mmem_t *a = calloc(1, sizeof *a);
    uint64_t b = (g.va_next + SMALL_ALIGN - 1) & ~(uint64_t)(SMALL_ALIGN - 1);
    if (a && b + m->span <= g.va_end) {
        *a = *m;
        a->base = b;
        a->owner = m;
        a->dalias = 0;
        a->refs = 1;
        if (mem_table_add(a) == 0) {
            g.va_next = b + m->span;
            m->refs++; /* the alias's hold on the backing */
            m->dalias = b;
            a = NULL;
            r = CUDA_SUCCESS;
        }
    }
    free(a);
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuMemHostAlloc(void **pp, size_t size, unsigned flags)
{
    CHECK_INIT();
    if (!pp || size == 0 || (flags & ~(unsigned)CU_MEMHOSTALLOC_VALID_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c;
    mmem_t *m = NULL;
    int r = ctx_current(&c);
    if (r == CUDA_SUCCESS)
        r = capture_forbids("cuMemHostAlloc");
    if (r == CUDA_SUCCESS)
        r = mem_new(c, size, 1, &m);
    pthread_mutex_unlock(&g.lock);
    if (r != CUDA_SUCCESS)
        return r;
    if (g.poison >= 0)
        memset(m->host, g.poison, size);
    if (g.pin_alias && pin_alias_add(m) != CUDA_SUCCESS) {
        cuMemFreeHost(m->host);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = m->host;
    return CUDA_SUCCESS;
}

/* The device address of pinned host memory: with unified addressing its
 * host address (the default here), under HCMOCK_PINNED_DEVPTR=1 one of
 * its own, as on a platform without that identity. */
CUAPI int cuMemHostGetDevicePointer_v2(unsigned long long *pdptr, void *p, unsigned flags)
{
    CHECK_INIT();
    if (!pdptr || !p || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    long i = mem_find((uint64_t)(uintptr_t)p);
    mmem_t *m = i >= 0 ? g.mem[i] : NULL;
    int r = CUDA_SUCCESS;
    if (!m || !m->live || !m->pinned || m->managed || m->owner)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        *pdptr = (m->dalias ? m->dalias : m->base) + ((uint64_t)(uintptr_t)p - m->base);
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuMemFreeHost(void *p)
{
    CHECK_INIT();
    return mem_free_common((uint64_t)(uintptr_t)p, 1, "cuMemFreeHost");
}

/* Checks shared by the queued memory calls. Lock held. */
static int dev_range_ok(uint64_t p, size_t n, const char *who, const char *arg)
{
    if (mem_xlate(p, n, NULL))
        return CUDA_SUCCESS;
    mock_say("%s: %s 0x%llx (+%zu bytes) is not inside one live device allocation", who, arg,
             (unsigned long long)p, n);
    return CUDA_ERROR_INVALID_VALUE;
}

static int host_ptr_ok(const void *h, const char *who, const char *arg)
{
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_device_va(h)) {
        mock_say("%s: %s %p is a device address, not host memory", who, arg, h);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Async copies read and write host memory when they run, not when they
 * are queued: the driver may do either for pageable memory, and only
 * this order shows a caller that reuses a buffer before synchronising. */
static int copy_queue(enum op_kind kind, uint64_t d0, uint64_t d1, void *h, size_t n, void *hs,
                      const char *who)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(hs, 1, &s);
    if (r == CUDA_SUCCESS && n > 0) {
        if (kind == OP_H2D || kind == OP_D2H)
            r = host_ptr_ok(h, who, kind == OP_H2D ? "srcHost" : "dstHost");
        if (r == CUDA_SUCCESS)
            r = dev_range_ok(kind == OP_D2H ? d1 : d0, n, who,
                             kind == OP_D2H ? "srcDevice" : "dstDevice");
        if (r == CUDA_SUCCESS && kind == OP_D2D)
            r = dev_range_ok(d1, n, who, "srcDevice");
    }
    if (r == CUDA_SUCCESS && n > 0) {
        mop_t *op = op_new(kind);
        if (!op) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->d0 = d0;
            op->d1 = d1;
            op->h = h;
            op->n = n;
            /* Pinned host memory must outlive the copy (cuMemFreeHost does
             * not wait for it here): hold it. Pageable memory is the
             * caller's to keep. */
            if (h) {
                long i = mem_find((uint64_t)(uintptr_t)h);
                if (i >= 0 && g.mem[i]->pinned) {
                    op->hm = g.mem[i];
                    op->hm->refs++;
                }
            }
            r = enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *hs)
{
    return copy_queue(OP_H2D, dst, 0, (void *)src, n, hs, "cuMemcpyHtoDAsync");
}

CUAPI int cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t n, void *hs)
{
    return copy_queue(OP_D2H, 0, src, dst, n, hs, "cuMemcpyDtoHAsync");
}

CUAPI int cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t n, void *hs)
{
    return copy_queue(OP_D2D, dst, src, NULL, n, hs, "cuMemcpyDtoDAsync");
}

/*
 * The "synchronous" memset is asynchronous to the host for device memory
 * (CUDA's API synchronisation rules): it goes on the legacy stream of the
 * current context, so a non-blocking stream is not ordered after it.
 * Pinned host memory is set before the call returns.
 */
CUAPI int cuMemsetD32_v2(unsigned long long dptr, unsigned v, size_t n)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(NULL, 1, &s);
    if (r == CUDA_SUCCESS && n > 0) {
        if (dptr & 3)
            r = CUDA_ERROR_INVALID_VALUE;
        else if (n > SIZE_MAX / 4)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            r = dev_range_ok(dptr, n * 4, "cuMemsetD32", "dstDevice");
    }
    if (r == CUDA_SUCCESS && n > 0) {
        long i = mem_find(dptr);
        int pinned = g.mem[i]->pinned;
        mop_t *op = op_new(OP_SET32);
        if (!op) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->d0 = dptr;
            op->n = n;
            op->v = v;
            r = enqueue(s, op);
            if (r == CUDA_SUCCESS && pinned)
                stream_wait_done(s, s->enq, "cuMemsetD32");
        }
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuPointerGetAttribute(void *data, int attr, unsigned long long ptr)
{
    CHECK_INIT();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    long i = ptr ? mem_find(ptr) : -1;
    mmem_t *m = i >= 0 ? g.mem[i] : NULL;
    int r = CUDA_SUCCESS;
    if (!m) {
        /* Memory the driver does not know (malloc, stack): as the driver. */
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    switch (attr) {
    case PA_CONTEXT: *(void **)data = m->ctx; break;
    case PA_MEMORY_TYPE:
        *(unsigned *)data = m->pinned && !m->managed ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
    case PA_DEVICE_POINTER: *(unsigned long long *)data = ptr; break;
    case PA_HOST_POINTER:
        if (!m->pinned)
            r = CUDA_ERROR_INVALID_VALUE; /* device memory has no host address */
        else
            *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case PA_SYNC_MEMOPS: *(unsigned *)data = 0; break;
    case PA_BUFFER_ID: *(unsigned long long *)data = m->id; break;
    case PA_IS_MANAGED: *(unsigned *)data = (unsigned)m->managed; break;
    case PA_DEVICE_ORDINAL: *(int *)data = m->ctx->dev; break;
    case PA_IS_LEGACY_CUDA_IPC_CAPABLE: *(unsigned *)data = !m->pinned; break;
    case PA_RANGE_START_ADDR: *(unsigned long long *)data = m->base; break;
    case PA_RANGE_SIZE: *(size_t *)data = m->size; break;
    case PA_MAPPED: *(unsigned *)data = 1; break;
    case PA_IS_GPU_DIRECT_RDMA_CAPABLE: *(unsigned *)data = !m->pinned; break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
out:
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* ---- dma-buf export and GPUDirect write ordering (verbs emulation) ------- */

/* HCMOCK_DMABUF=2: a dma-buf fd that the emulated libibverbs imports
 * (hcmock.h's hcmock_dmabuf_t in a memfd). As the driver wants, dptr and
 * size are multiples of the host page size (sysconf: 4 KiB, or 64 KiB on
 * Grace-like hosts, HCMOCK_PAGE_SIZE under libhcmock_page.so), and dptr
 * lies in device memory. 1: the attribute says yes, the export fails. */
CUAPI int cuMemGetHandleForAddressRange(void *handle, unsigned long long dptr, size_t size,
                                        int type, unsigned long long flags)
{
    CHECK_INIT();
    if (!handle || type != 1 /* DMA_BUF_FD */ || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (g.dmabuf != 2)
        return CUDA_ERROR_NOT_SUPPORTED;
    const unsigned long long page = (unsigned long long)sysconf(_SC_PAGESIZE);
    if (!size || dptr % page || size % page)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    int in = g.va_base && dptr >= (uint64_t)(uintptr_t)g.va_base && dptr + size <= g.va_end;
    pthread_mutex_unlock(&g.lock);
    if (!in)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("hcmock-dmabuf", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    const hcmock_dmabuf_t d = { HCMOCK_DMABUF_MAGIC, dptr, size };
    if (pwrite(fd, &d, sizeof d, 0) != (ssize_t)sizeof d) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

/* Managed memory, for the verbs tests: host-addressable (as on a GPU with
 * unified memory) and, to the NIC, neither dma-buf exportable (its address
 * is outside the device range) nor pinnable through nvidia-peermem (the
 * emulated libibverbs refuses it). */
CUAPI int cuMemAllocManaged(unsigned long long *dptr, size_t size, unsigned flags)
{
    CHECK_INIT();
    if (!dptr || size == 0 || (flags != 1 && flags != 2)) /* GLOBAL, HOST */
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c;
    mmem_t *m = NULL;
    int r = ctx_current(&c);
    if (r == CUDA_SUCCESS)
        r = mem_new(c, size, 1, &m);
    if (r == CUDA_SUCCESS)
        m->managed = 1;
    pthread_mutex_unlock(&g.lock);
    if (r != CUDA_SUCCESS)
        return r;
    *dptr = m->base;
    return CUDA_SUCCESS;
}

/* The allocation holding dptr: its base and size (either may be NULL), as
 * the driver answers for device memory and for its pinned host memory. */
CUAPI int cuMemGetAddressRange_v2(unsigned long long *base, size_t *size, unsigned long long dptr)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    long i = mem_find(dptr);
    mmem_t *m = i >= 0 && g.mem[i]->live ? g.mem[i] : NULL;
    if (m && base)
        *base = m->base;
    if (m && size)
        *size = m->size;
    pthread_mutex_unlock(&g.lock);
    return m ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* CU_GPU_DIRECT_RDMA_WRITES_ORDERING_*: NONE (0) before Hopper, OWNER
 * (100) from sm_90; HCMOCK_RDMA_ORDERING overrides (a platform whose
 * path orders nothing, say). */
static int rdma_ordering(void)
{
    return (int)env_long("HCMOCK_RDMA_ORDERING", g.cc_major >= 9 ? 100 : 0);
}

/* ---- Stream memory operations --------------------------------------------- */

static int memop_queue(enum op_kind kind, void *hs, uint64_t addr, uint32_t v, unsigned flags,
                       const char *who)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(hs, 1, &s);
    if (r == CUDA_SUCCESS && (addr & 3))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = dev_range_ok(addr, 4, who, "addr");
    if (r == CUDA_SUCCESS) {
        mop_t *op = op_new(kind);
        if (!op) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->d0 = addr;
            op->v = v;
            op->flags = flags;
            r = enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuStreamWaitValue32_v2(void *hs, unsigned long long addr, uint32_t v, unsigned flags)
{
    unsigned kind = flags & ~CU_STREAM_WAIT_VALUE_FLUSH;
    if (kind > CU_STREAM_WAIT_VALUE_NOR)
        return CUDA_ERROR_INVALID_VALUE;
    return memop_queue(OP_WAIT32, hs, addr, v, flags, "cuStreamWaitValue32");
}

CUAPI int cuStreamWriteValue32_v2(void *hs, unsigned long long addr, uint32_t v, unsigned flags)
{
    if (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
        return CUDA_ERROR_INVALID_VALUE;
    return memop_queue(OP_WRITE32, hs, addr, v, flags, "cuStreamWriteValue32");
}

CUAPI int hcmock_stream_enqueue(void *stream, hcmock_fn fn, void *arg)
{
    CHECK_INIT();
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mstream_t *s;
    int r = stream_resolve(stream, 0, &s);
    if (r == CUDA_SUCCESS) {
        mop_t *op = op_new(OP_HOSTFN);
        if (!op) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->hfn = fn;
            op->harg = arg;
            r = enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* ---- Modules and kernels ------------------------------------------------ */

#define FATBIN_MAGIC 0xBA55ED50u

/* The kernels kernels.cu defines, by the names it gives them. */
static const struct {
    const char *name;
    hcoll_dtype_t dt;
} k_types[] = {
    { "f32", HCOLL_FLOAT32 }, { "f16", HCOLL_FLOAT16 }, { "bf16", HCOLL_BFLOAT16 },
    { "f64", HCOLL_FLOAT64 }, { "i8", HCOLL_INT8 },     { "u8", HCOLL_UINT8 },
    { "i32", HCOLL_INT32 },   { "i64", HCOLL_INT64 },
};
static const char *const k_ops[] = { "sum", "prod", "max", "min" };

static size_t dt_size(hcoll_dtype_t dt)
{
    switch (dt) {
    case HCOLL_FLOAT16: case HCOLL_BFLOAT16: return 2;
    case HCOLL_FLOAT32: case HCOLL_INT32: return 4;
    case HCOLL_FLOAT64: case HCOLL_INT64: return 8;
    default: return 1;
    }
}

/* 0 when name is a kernel this file can run. */
static int kernel_parse(const char *name, mfunc_t *f)
{
    const char *t;
    if (strncmp(name, "hc_k_reduce_", 12) == 0) {
        t = name + 12;
        f->avg = K_REDUCE;
    } else if (strncmp(name, "hc_k_avg_", 9) == 0) {
        t = name + 9;
        f->avg = K_AVG;
    } else if (strncmp(name, "hc_k_scale_", 11) == 0) {
        t = name + 11;
        f->avg = K_SCALE;
    } else {
        return -1;
    }
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++) {
        size_t l = strlen(k_types[i].name);
        if (strncmp(t, k_types[i].name, l) != 0)
            continue;
        f->dt = k_types[i].dt;
        if (f->avg != K_REDUCE)
            return t[l] == 0 ? 0 : -1;
        if (t[l] != '_')
            return -1;
        for (size_t o = 0; o < sizeof k_ops / sizeof k_ops[0]; o++)
            if (strcmp(t + l + 1, k_ops[o]) == 0) {
                f->op = (hcoll_op_t)o; /* HCOLL_SUM, PROD, MAX, MIN in this order */
                return 0;
            }
        return -1;
    }
    return -1;
}

/* Kernel names from the ELF sections ".text.<name>" of the image's cubins. */
static void module_scan_names(mmodule_t *m, const unsigned char *p, size_t len)
{
    static const char pre[] = ".text.";
    const size_t pl = sizeof pre - 1;
    for (size_t i = 0; i + pl < len; i++) {
        /* ".rel.text.<name>" names the same kernel (and string tables
         * may share that suffix), so what precedes does not matter. */
        if (p[i] != '.' || memcmp(p + i, pre, pl) != 0)
            continue;
        size_t j = i + pl, k = j;
        while (k < len && k - j < 63 &&
               ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') ||
                (p[k] >= '0' && p[k] <= '9') || p[k] == '_'))
            k++;
        if (k >= len || p[k] != 0 || k == j)
            continue;
        int dup = 0;
        for (size_t n = 0; n < m->nnames && !dup; n++)
            dup = strlen(m->names[n]) == k - j && memcmp(m->names[n], p + j, k - j) == 0;
        if (dup)
            continue;
        char **nn = realloc(m->names, (m->nnames + 1) * sizeof *nn);
        if (!nn)
            return;
        m->names = nn;
        m->names[m->nnames] = strndup((const char *)p + j, k - j);
        if (m->names[m->nnames])
            m->nnames++;
        m->verify_names = 1;
    }
}

/*
 * A fatbin: a 16-byte header (magic, version, header size, payload size),
 * then entries (kind 1 PTX, 2 ELF; header size and payload size; the
 * target SM at byte 28 of the entry header). The device runs SASS of its
 * own major version and no newer minor, or JIT-compiles PTX not newer than
 * itself; anything else is CUDA_ERROR_NO_BINARY_FOR_GPU.
 */
static int fatbin_check(const unsigned char *img, mmodule_t *m)
{
    uint32_t magic;
    uint16_t hsize;
    uint64_t fsize;
    memcpy(&magic, img, 4);
    if (magic != FATBIN_MAGIC) {
        if (memcmp(img, "\177ELF", 4) == 0 || memcmp(img, "//", 2) == 0 ||
            memcmp(img, ".version", 8) == 0) {
            mock_say("cuModuleLoadData: only fatbin images are emulated (this is a cubin or "
                     "PTX)");
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        return CUDA_ERROR_INVALID_IMAGE;
    }
    memcpy(&hsize, img + 6, 2);
    memcpy(&fsize, img + 8, 8);
    if (hsize < 16 || fsize > (1ull << 32))
        return CUDA_ERROR_INVALID_IMAGE;
    const int cc = g.cc_major * 10 + g.cc_minor;
    int runnable = 0;
    size_t off = hsize, end = hsize + (size_t)fsize;
    while (off + 32 <= end) {
        uint16_t kind;
        uint32_t ehs, arch;
        uint64_t size;
        memcpy(&kind, img + off, 2);
        memcpy(&ehs, img + off + 4, 4);
        memcpy(&size, img + off + 8, 8);
        memcpy(&arch, img + off + 28, 4);
        if (ehs < 32 || size > end - off - ehs)
            return CUDA_ERROR_INVALID_IMAGE;
        if (kind == 2 && (int)arch / 10 == cc / 10 && (int)arch % 10 <= cc % 10)
            runnable = 1;
        if (kind == 1 && (int)arch <= cc)
            runnable = 1;
        if (kind == 2)
            module_scan_names(m, img + off + ehs, (size_t)size);
        off += ehs + (size_t)size;
    }
    if (off != end)
        return CUDA_ERROR_INVALID_IMAGE;
    return runnable ? CUDA_SUCCESS : CUDA_ERROR_NO_BINARY_FOR_GPU;
}

static void module_free(mmodule_t *m)
{
    for (size_t i = 0; i < m->nnames; i++)
        free(m->names[i]);
    free(m->names);
    for (size_t i = 0; i < m->nfuncs; i++) {
        m->funcs[i]->magic = 0;
        free(m->funcs[i]);
    }
    m->magic = 0;
    free(m);
}

/* An unloaded module's functions stay valid for the launches already
 * queued; new launches find no handle. Lock held. */
static void module_unref(mmodule_t *m)
{
    if (--m->refs == 0)
        module_free(m);
}

CUAPI int cuModuleLoadData(void **pmod, const void *image)
{
    CHECK_INIT();
    if (!pmod || !image)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mctx_t *c;
    int r = ctx_current(&c);
    mmodule_t *m = NULL;
    if (r == CUDA_SUCCESS)
        r = capture_forbids("cuModuleLoadData");
    if (r == CUDA_SUCCESS && !(m = calloc(1, sizeof *m)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        r = fatbin_check(image, m);
    if (r == CUDA_SUCCESS) {
        m->magic = MAGIC_MODULE;
        m->refs = 1;
        m->ctx = c;
        m->gen = c->gen;
        m->next = g.modules;
        g.modules = m;
        *pmod = m;
    } else if (m) {
        module_free(m);
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static mmodule_t *module_find(void *h)
{
    mmodule_t *m = g.modules;
    while (m && m != h)
        m = m->next;
    return m;
}

CUAPI int cuModuleUnload(void *hmod)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mmodule_t *m = module_find(hmod);
    int r = m ? capture_forbids("cuModuleUnload") : CUDA_ERROR_INVALID_HANDLE;
    if (m && r == CUDA_SUCCESS) {
        r = CUDA_ERROR_INVALID_HANDLE;
        /* Real drivers synchronise the context first (the module's code
         * may still run): a stream that never gets there hangs it. */
        m->refs++;
        if (m->ctx->active && m->gen == m->ctx->gen)
            ctx_drain(m->ctx, "cuModuleUnload");
        if (module_find(hmod) == m) { /* not unloaded by another thread meanwhile */
            mmodule_t **pp = &g.modules;
            while (*pp != m)
                pp = &(*pp)->next;
            *pp = m->next;
            module_unref(m);
            r = CUDA_SUCCESS;
        }
        module_unref(m);
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUAPI int cuModuleGetFunction(void **pfn, void *hmod, const char *name)
{
    CHECK_INIT();
    if (!pfn || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g.lock);
    mmodule_t *m = module_find(hmod);
    int r = m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && (!m->ctx->active || m->gen != m->ctx->gen))
        r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    mfunc_t *f = NULL;
    for (size_t i = 0; r == CUDA_SUCCESS && i < m->nfuncs && !f; i++)
        if (strcmp(m->funcs[i]->name, name) == 0)
            f = m->funcs[i];
    if (r == CUDA_SUCCESS && !f) {
        int in_image = !m->verify_names;
        for (size_t i = 0; i < m->nnames && !in_image; i++)
            in_image = strcmp(m->names[i], name) == 0;
        mfunc_t tmp;
        memset(&tmp, 0, sizeof tmp);
        if (!in_image) {
            r = CUDA_ERROR_NOT_FOUND;
        } else if (strlen(name) >= sizeof tmp.name || kernel_parse(name, &tmp) != 0) {
            mock_say("cuModuleGetFunction: the image has kernel %s, but the mock cannot run it "
                     "(a mock limitation: add it to tests/mock/cuda.c)",
                     name);
            r = CUDA_ERROR_NOT_FOUND;
        } else if (m->nfuncs == sizeof m->funcs / sizeof m->funcs[0] ||
                   !(f = malloc(sizeof *f))) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *f = tmp;
            f->magic = MAGIC_FUNC;
            f->mod = m;
            snprintf(f->name, sizeof f->name, "%s", name);
            m->funcs[m->nfuncs++] = f;
        }
    }
    if (r == CUDA_SUCCESS)
        *pfn = f;
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* Lock held. */
static mfunc_t *func_find(void *h)
{
    for (mmodule_t *m = g.modules; m; m = m->next)
        for (size_t i = 0; i < m->nfuncs; i++)
            if (m->funcs[i] == h)
                return m->funcs[i];
    return NULL;
}

CUAPI int cuLaunchKernel(void *hf, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shmem, void *hs, void **params,
                         void **extra)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mfunc_t *f = func_find(hf);
    mstream_t *s = NULL;
    int r = f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        r = stream_resolve(hs, 1, &s);
    if (r == CUDA_SUCCESS && (f->mod->ctx != s->ctx || f->mod->gen != s->gen))
        r = CUDA_ERROR_INVALID_HANDLE; /* a function of another context */
    /* Geometry: what the device attributes allow. */
    if (r == CUDA_SUCCESS &&
        (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || gx > 2147483647u ||
         gy > 65535 || gz > 65535 || bx > 1024 || by > 1024 || bz > 64 ||
         (unsigned long long)bx * by * bz > 1024 || shmem > 49152)) {
        mock_say("cuLaunchKernel %s: invalid geometry grid (%u,%u,%u) block (%u,%u,%u) shared "
                 "%u",
                 f->name, gx, gy, gz, bx, by, bz, shmem);
        r = CUDA_ERROR_INVALID_VALUE;
    }
    /* Parameters, with kernels.cu's layout: reduce (void *, const void *,
     * const void *, unsigned long long), avg (void *, unsigned long long,
     * int), scale (void *, const void *, unsigned long long, const void *,
     * unsigned long long). Copied now, as the driver copies them. */
    uint64_t karg[5] = { 0, 0, 0, 0, 0 };
    if (r == CUDA_SUCCESS) {
        static const size_t reduce_sz[] = { 8, 8, 8, 8 }, avg_sz[] = { 8, 8, 4 },
                            scale_sz[] = { 8, 8, 8, 8, 8 };
        const size_t *sz = f->avg == K_AVG ? avg_sz : f->avg == K_SCALE ? scale_sz : reduce_sz;
        size_t np = f->avg == K_AVG ? 3 : f->avg == K_SCALE ? 5 : 4;
        if ((params && extra) || (!params && !extra)) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else if (params) {
            for (size_t i = 0; i < np; i++) {
                if (!params[i]) {
                    r = CUDA_ERROR_INVALID_VALUE;
                    break;
                }
                memcpy(&karg[i], params[i], sz[i]);
            }
        } else {
            const char *buf = NULL;
            size_t blen = 0;
            for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
                if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                    buf = extra[i + 1];
                else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
                    blen = *(const size_t *)extra[i + 1];
                else {
                    r = CUDA_ERROR_INVALID_VALUE;
                    break;
                }
            }
            size_t need = f->avg == K_AVG ? 20 : f->avg == K_SCALE ? 40 : 32;
            if (r == CUDA_SUCCESS && (!buf || blen < need))
                r = CUDA_ERROR_INVALID_VALUE;
            for (size_t i = 0, o = 0; r == CUDA_SUCCESS && i < np; o += 8, i++)
                memcpy(&karg[i], buf + o, sz[i]);
        }
    }
    /* The kernels index with x only: every other thread dimension runs
     * the whole body again (racing on a GPU; in sequence here). */
    unsigned long long reps = (unsigned long long)gy * gz * by * bz;
    if (r == CUDA_SUCCESS && reps > 1) {
        mock_say("cuLaunchKernel %s: grid (%u,%u,%u) block (%u,%u,%u): kernels.cu indexes with "
                 "x only, so each element is processed %llu times",
                 f->name, gx, gy, gz, bx, by, bz, reps);
        if (reps > 16)
            reps = 16;
    }
    if (r == CUDA_SUCCESS) {
        mop_t *op = op_new(OP_KERNEL);
        if (!op) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->fn = f;
            f->mod->refs++;
            memcpy(op->karg, karg, sizeof karg);
            op->reps = reps;
            r = enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* ---- The stream worker ---------------------------------------------------- */

/* The GPU's float arithmetic returns the canonical NaN whatever the
 * inputs' payloads (the host keeps the first operand's). */
static void nan_canonical(void *p, size_t n, hcoll_dtype_t dt)
{
    if (dt == HCOLL_FLOAT32) {
        uint32_t *u = p;
        for (size_t i = 0; i < n; i++)
            if ((u[i] & 0x7fffffffu) > 0x7f800000u)
                u[i] = 0x7fffffffu;
    } else if (dt == HCOLL_FLOAT16 || dt == HCOLL_BFLOAT16) {
        uint16_t *u = p, inf = dt == HCOLL_FLOAT16 ? 0x7c00 : 0x7f80;
        for (size_t i = 0; i < n; i++)
            if ((u[i] & 0x7fff) > inf)
                u[i] = 0x7fff;
    }
}

/* A range the kernel touches: translated (with a reference), on the
 * stream's GPU, aligned to the element. Lock held. */
static int kernel_arg(mstream_t *s, mop_t *op, uint64_t p, size_t n, const char *arg,
                      void **host_out, mmem_t **m_out)
{
    size_t es = dt_size(op->fn->dt);
    if (p % es != 0) {
        snprintf(s->cur, sizeof s->cur, "kernel %s: %s 0x%llx is not aligned to its %zu-byte "
                 "elements", op->fn->name, arg, (unsigned long long)p, es);
        return CUDA_ERROR_MISALIGNED_ADDRESS;
    }
    void *h = mem_xlate(p, n * es, m_out);
    if (!h) {
        snprintf(s->cur, sizeof s->cur, "kernel %s: %s [0x%llx, +%zu) is not inside one live "
                 "device allocation", op->fn->name, arg, (unsigned long long)p, n * es);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    if (!(*m_out)->pinned && (*m_out)->ctx->dev != s->ctx->dev) {
        snprintf(s->cur, sizeof s->cur, "kernel %s: %s is memory of GPU %d, the kernel runs on "
                 "GPU %d (no peer access)", op->fn->name, arg, (*m_out)->ctx->dev, s->ctx->dev);
        mem_unref(*m_out);
        *m_out = NULL;
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    *host_out = h;
    return CUDA_SUCCESS;
}

static int run_kernel(mstream_t *s, mop_t *op)
{
    mfunc_t *f = op->fn;
    size_t es = dt_size(f->dt);
    uint64_t n = KARG_N(f, op->karg);
    if (n == 0)
        return CUDA_SUCCESS;
    if (n > ((uint64_t)1 << 62) / es) {
        snprintf(s->cur, sizeof s->cur, "kernel %s: n = %llu", f->name, (unsigned long long)n);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    void *h[3] = { NULL, NULL, NULL };
    mmem_t *m[3] = { NULL, NULL, NULL };
    int r = CUDA_SUCCESS;
    pthread_mutex_lock(&g.lock);
    if (f->avg == K_AVG) {
        r = kernel_arg(s, op, op->karg[0], n, "buf", &h[0], &m[0]);
    } else if (f->avg == K_SCALE) {
        r = kernel_arg(s, op, op->karg[0], n, "dst", &h[0], &m[0]);
        if (r == CUDA_SUCCESS)
            r = kernel_arg(s, op, op->karg[1], n, "src", &h[1], &m[1]);
        if (r == CUDA_SUCCESS && op->karg[3])
            r = kernel_arg(s, op, op->karg[3], 1, "kp", &h[2], &m[2]);
    } else {
        static const char *const names[3] = { "dst", "a", "b" };
        for (int i = 0; i < 3 && r == CUDA_SUCCESS; i++)
            r = kernel_arg(s, op, op->karg[i], n, names[i], &h[i], &m[i]);
    }
    pthread_mutex_unlock(&g.lock);
    if (r == CUDA_SUCCESS && f->avg == K_SCALE) {
        hc_scalar_t k;
        if (h[2]) {
            k = hc_scalar_load(h[2], f->dt);
        } else {
            memset(&k, 0, sizeof k);
            memcpy(&k, &op->karg[4], sizeof k < 8 ? sizeof k : 8);
        }
        uintptr_t d = (uintptr_t)h[0], x = (uintptr_t)h[1];
        size_t bytes = (size_t)n * es;
        if (d != x && d < x + bytes && x < d + bytes)
            mock_say("kernel %s: dst and src overlap without being equal (the GPU's result is "
                     "undefined)", f->name);
        hc_reduce_scale(h[0], h[1], (size_t)n, f->dt, k);
        nan_canonical(h[0], (size_t)n, f->dt);
    } else if (r == CUDA_SUCCESS) {
        if (f->avg) {
            int nranks;
            memcpy(&nranks, &op->karg[2], sizeof nranks);
            if (nranks < 1)
                mock_say("kernel %s with nranks %d: a division by %d (the GPU's result is "
                         "not emulated; the buffer is left as it is)",
                         f->name, nranks, nranks);
            for (unsigned k = 0; k < op->reps && nranks >= 1; k++)
                hc_reduce_avg_finish(h[0], (size_t)n, f->dt, HCOLL_AVG, nranks);
            if (nranks >= 1)
                nan_canonical(h[0], (size_t)n, f->dt);
        } else {
            size_t bytes = (size_t)n * es;
            for (int i = 1; i < 3; i++) {
                uintptr_t d = (uintptr_t)h[0], x = (uintptr_t)h[i];
                if (d != x && d < x + bytes && x < d + bytes)
                    mock_say("kernel %s: dst and %s overlap without being equal (the GPU's "
                             "result is undefined)",
                             f->name, i == 1 ? "a" : "b");
            }
            for (unsigned k = 0; k < op->reps; k++)
                hc_reduce(h[0], h[1], h[2], (size_t)n, f->dt, f->op);
            nan_canonical(h[0], (size_t)n, f->dt);
        }
    }
    pthread_mutex_lock(&g.lock);
    for (int i = 0; i < 3; i++)
        if (m[i])
            mem_unref(m[i]);
    pthread_mutex_unlock(&g.lock);
    return r;
}

static const char *op_name(const mop_t *op)
{
    static const char *const n[] = {
        [OP_NOP] = "nop", [OP_H2D] = "memcpy HtoD", [OP_D2H] = "memcpy DtoH",
        [OP_D2D] = "memcpy DtoD", [OP_SET32] = "memset D32", [OP_WAIT32] = "wait value32",
        [OP_WRITE32] = "write value32", [OP_EVENT] = "event record",
        [OP_WAIT_EVENT] = "wait event", [OP_AFTER] = "legacy-stream ordering wait",
        [OP_KERNEL] = "kernel", [OP_HOSTFN] = "host function (hcmock_stream_enqueue)",
    };
    return n[op->kind];
}

/* One op; 0 or the fault that makes the context's error sticky. */
static int op_run(mstream_t *s, mop_t *op)
{
    mmem_t *m0 = NULL, *m1 = NULL;
    void *p0 = NULL, *p1 = NULL;
    int r = CUDA_SUCCESS;
    switch (op->kind) {
    case OP_NOP:
        break;
    case OP_H2D:
    case OP_D2H:
    case OP_D2D:
    case OP_SET32:
    case OP_WAIT32:
    case OP_WRITE32: {
        /* The range was checked when queued; freed since, it faults. */
        size_t len = op->kind == OP_SET32 ? op->n * 4
                     : (op->kind == OP_WAIT32 || op->kind == OP_WRITE32) ? 4
                                                                          : op->n;
        pthread_mutex_lock(&g.lock);
        uint64_t bad = 0;
        if (op->kind != OP_D2H && !(p0 = mem_xlate(op->d0, len, &m0)))
            bad = op->d0;
        if (!bad && (op->kind == OP_D2H || op->kind == OP_D2D) &&
            !(p1 = mem_xlate(op->d1, len, &m1)))
            bad = op->d1;
        if (!bad && op->hm && !op->hm->live)
            bad = (uint64_t)(uintptr_t)op->h;
        if (bad) {
            snprintf(s->cur, sizeof s->cur, "%s: 0x%llx (+%zu bytes) was freed before the "
                     "stream reached it", op_name(op), (unsigned long long)bad, len);
            r = CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        pthread_mutex_unlock(&g.lock);
        if (r != CUDA_SUCCESS)
            break;
        switch (op->kind) {
        case OP_H2D: memcpy(p0, op->h, op->n); break;
        case OP_D2H: memcpy(op->h, p1, op->n); break;
        case OP_D2D: memmove(p0, p1, op->n); break;
        case OP_SET32:
            for (size_t i = 0; i < op->n; i++)
                ((uint32_t *)p0)[i] = op->v;
            break;
        case OP_WRITE32:
            __atomic_store_n((uint32_t *)p0, op->v, __ATOMIC_RELEASE);
            break;
        case OP_WAIT32: {
            long sleep_ns = 1000;
            for (;;) {
                uint32_t x = __atomic_load_n((uint32_t *)p0, __ATOMIC_ACQUIRE);
                int ok;
                switch (op->flags & 3) {
                case CU_STREAM_WAIT_VALUE_GEQ: ok = (int32_t)(x - op->v) >= 0; break;
                case CU_STREAM_WAIT_VALUE_EQ: ok = x == op->v; break;
                case CU_STREAM_WAIT_VALUE_AND: ok = (x & op->v) != 0; break;
                default: ok = ~(x | op->v) != 0; break;
                }
                if (ok || !__atomic_load_n(&s->ctx->active, __ATOMIC_RELAXED) ||
                    __atomic_load_n(&s->ctx->sticky, __ATOMIC_RELAXED))
                    break;
                struct timespec ts = { 0, sleep_ns };
                nanosleep(&ts, NULL);
                if (sleep_ns < 200000)
                    sleep_ns *= 2;
            }
            break;
        }
        default: break;
        }
        break;
    }
    case OP_EVENT:
        pthread_mutex_lock(&g.lock);
        if (op->target > op->ev->done) {
            op->ev->done = op->target;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            op->ev->t_ms = ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
        }
        pthread_mutex_unlock(&g.lock);
        break;
    case OP_WAIT_EVENT:
        pthread_mutex_lock(&g.lock);
        while (op->ev->done < op->target && op->ev->ctx->active && !op->ev->ctx->sticky)
            pthread_cond_wait(&g.done_cv, &g.lock);
        pthread_mutex_unlock(&g.lock);
        break;
    case OP_AFTER:
        pthread_mutex_lock(&g.lock);
        while (op->after->done < op->target && op->after->ctx->active &&
               op->after->gen == op->after->ctx->gen)
            pthread_cond_wait(&g.done_cv, &g.lock);
        pthread_mutex_unlock(&g.lock);
        break;
    case OP_KERNEL:
        r = run_kernel(s, op);
        break;
    case OP_HOSTFN:
        op->hfn(op->harg);
        break;
    }
    if (m0 || m1) {
        pthread_mutex_lock(&g.lock);
        if (m0)
            mem_unref(m0);
        if (m1)
            mem_unref(m1);
        pthread_mutex_unlock(&g.lock);
    }
    return r;
}

static void op_describe(const mstream_t *s, const mop_t *op, char *buf, size_t len)
{
    switch (op->kind) {
    case OP_WAIT32: {
        uint32_t now = 0;
        void *p = mem_xlate(op->d0, 4, NULL);
        if (p)
            now = __atomic_load_n((uint32_t *)p, __ATOMIC_RELAXED);
        snprintf(buf, len, "wait value32 at 0x%llx for %s 0x%x (now 0x%x)",
                 (unsigned long long)op->d0,
                 (op->flags & 3) == 0 ? ">=" : (op->flags & 3) == 1 ? "==" : "flag", op->v, now);
        break;
    }
    case OP_AFTER:
        snprintf(buf, len, "waiting (legacy-stream order) for stream %u to reach op %llu",
                 op->after->id, (unsigned long long)op->target);
        break;
    case OP_KERNEL:
        snprintf(buf, len, "kernel %s n=%llu", op->fn->name,
                 (unsigned long long)KARG_N(op->fn, op->karg));
        break;
    default:
        snprintf(buf, len, "%s (%zu)", op_name(op), op->n);
        break;
    }
    (void)s;
}

/* ---- Stream race detector -------------------------------------------------- */

/*
 * When an op starts, any op queued on another stream that touches the
 * same device bytes (one of the two writing) and will run without waiting
 * for anything (only copies, kernels, memsets, event records ahead of it
 * in its queue) is not ordered with it: a data race, which on a GPU shows
 * as a wrong result once in a while. Stream memory operations on the same
 * word (wait value / write value) are synchronisation, not a race. Ops
 * behind a wait, and host functions (mock NCCL), are not judged. The
 * random delays widen the windows in which races show.
 */
enum { ACC_READ = 1, ACC_WRITE = 2, ACC_SYNC = 4 };

typedef struct {
    uint64_t lo, hi;
    int how;
} acc_t;

static int op_accesses(const mop_t *op, acc_t out[3])
{
    int n = 0;
    switch (op->kind) {
    case OP_H2D: out[n++] = (acc_t){ op->d0, op->d0 + op->n, ACC_WRITE }; break;
    case OP_D2H: out[n++] = (acc_t){ op->d1, op->d1 + op->n, ACC_READ }; break;
    case OP_D2D:
        out[n++] = (acc_t){ op->d0, op->d0 + op->n, ACC_WRITE };
        out[n++] = (acc_t){ op->d1, op->d1 + op->n, ACC_READ };
        break;
    case OP_SET32: out[n++] = (acc_t){ op->d0, op->d0 + 4 * op->n, ACC_WRITE }; break;
    case OP_WAIT32: out[n++] = (acc_t){ op->d0, op->d0 + 4, ACC_READ | ACC_SYNC }; break;
    case OP_WRITE32: out[n++] = (acc_t){ op->d0, op->d0 + 4, ACC_WRITE | ACC_SYNC }; break;
    case OP_KERNEL: {
        size_t es = dt_size(op->fn->dt);
        uint64_t cnt = KARG_N(op->fn, op->karg);
        if (cnt == 0 || cnt > ((uint64_t)1 << 40))
            break;
        uint64_t bytes = cnt * es;
        if (op->fn->avg == K_SCALE) {
            out[n++] = (acc_t){ op->karg[0], op->karg[0] + bytes, ACC_WRITE };
            out[n++] = (acc_t){ op->karg[1], op->karg[1] + bytes, ACC_READ };
            if (op->karg[3])
                out[n++] = (acc_t){ op->karg[3], op->karg[3] + es, ACC_READ };
        } else if (op->fn->avg) {
            out[n++] = (acc_t){ op->karg[0], op->karg[0] + bytes, ACC_READ | ACC_WRITE };
        } else {
            out[n++] = (acc_t){ op->karg[0], op->karg[0] + bytes, ACC_WRITE };
            out[n++] = (acc_t){ op->karg[1], op->karg[1] + bytes, ACC_READ };
            out[n++] = (acc_t){ op->karg[2], op->karg[2] + bytes, ACC_READ };
        }
        break;
    }
    default: break;
    }
    return n;
}

static int op_may_block(const mop_t *op)
{
    return op->kind == OP_WAIT32 || op->kind == OP_WAIT_EVENT || op->kind == OP_AFTER ||
           op->kind == OP_HOSTFN;
}

static int acc_conflict(const acc_t *x, const acc_t *w)
{
    if (x->hi <= w->lo || w->hi <= x->lo)
        return 0;
    if (!((x->how | w->how) & ACC_WRITE))
        return 0;
    return !((x->how & ACC_SYNC) && (w->how & ACC_SYNC));
}

/* 0, or a message in msg about the first race of op on s. Lock held. */
static int race_find(const mstream_t *s, const mop_t *op, char *msg, size_t len)
{
    acc_t x[3], w[3];
    int nx = op_accesses(op, x);
    if (nx == 0)
        return 0;
    for (mstream_t *o = g.streams; o; o = o->next) {
        if (o == s || !o->head || !o->ctx->active || o->gen != o->ctx->gen)
            continue;
        for (const mop_t *q = o->head; q; q = q->next) {
            int nw = op_accesses(q, w);
            for (int i = 0; i < nx; i++)
                for (int j = 0; j < nw; j++)
                    if (acc_conflict(&x[i], &w[j])) {
                        char a[200], b[200];
                        op_describe(s, op, a, sizeof a);
                        op_describe(o, q, b, sizeof b);
                        snprintf(msg, len,
                                 "RACE: stream %u (GPU %d) runs [%s] while [%s] is queued on "
                                 "stream %u (GPU %d) with no wait ahead of it: both touch "
                                 "[0x%llx, 0x%llx) and nothing orders them (an event, a "
                                 "stream wait or a synchronisation is missing)",
                                 s->id, s->ctx->dev, a, b, o->id, o->ctx->dev,
                                 (unsigned long long)(x[i].lo > w[j].lo ? x[i].lo : w[j].lo),
                                 (unsigned long long)(x[i].hi < w[j].hi ? x[i].hi : w[j].hi));
                        return 1;
                    }
            if (op_may_block(q))
                break; /* what follows may be ordered after op */
        }
    }
    return 0;
}

static void *stream_main(void *arg)
{
    mstream_t *s = arg;
    unsigned seed = (unsigned)(uintptr_t)s ^ (unsigned)getpid();
    t_stack[0] = s->ctx;
    t_depth = 1;
    pthread_mutex_lock(&g.lock);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&s->cv, &g.lock);
        if (!s->head)
            break;
        mop_t *op = s->head;
        int dead = !s->ctx->active || s->gen != s->ctx->gen || s->ctx->sticky;
        /* Its hardware queue's turn: every earlier ticket run, whichever
         * stream it came from. */
        int turn = 0;
        if (g.nhwq && !dead) {
            char what[160];
            op_describe(s, op, what, sizeof what);
            snprintf(s->cur, sizeof s->cur,
                     "[%s] queued in hardware queue %d behind work of other streams (ticket "
                     "%llu, queue at %llu)",
                     what, s->hwq, (unsigned long long)op->qticket,
                     (unsigned long long)s->ctx->hwq[s->hwq].done);
            while (s->ctx->hwq[s->hwq].done != op->qticket && s->ctx->active &&
                   s->gen == s->ctx->gen && !s->ctx->sticky)
                pthread_cond_wait(&g.done_cv, &g.lock);
            dead = !s->ctx->active || s->gen != s->ctx->gen || s->ctx->sticky;
            turn = !dead;
        }
        op_describe(s, op, s->cur, sizeof s->cur);
        pthread_mutex_unlock(&g.lock);

        int r = CUDA_SUCCESS;
        if (!dead) {
            if (g.delay_us && op->kind != OP_AFTER) {
                unsigned us = (unsigned)rand_r(&seed) % (g.delay_us + 1);
                if (us)
                    usleep(us);
            }
            if (g.trace)
                mock_say("stream %u (GPU %d): %s", s->id, s->ctx->dev, s->cur);
            if (g.race) {
                char msg[700];
                pthread_mutex_lock(&g.lock);
                int raced = race_find(s, op, msg, sizeof msg);
                pthread_mutex_unlock(&g.lock);
                if (raced && __atomic_fetch_add(&g.races, 1, __ATOMIC_RELAXED) < 20)
                    mock_say("%s", msg);
                if (raced && g.race == 2) {
                    snprintf(s->cur, sizeof s->cur, "a race (HCMOCK_RACE=2)");
                    r = CUDA_ERROR_UNKNOWN;
                }
            }
            if (r == CUDA_SUCCESS)
                r = op_run(s, op);
        }

        pthread_mutex_lock(&g.lock);
        if (r != CUDA_SUCCESS && !s->ctx->sticky) {
            s->ctx->sticky = r;
            mock_say("stream %u (GPU %d): %s: %s; the context is unusable from now on (a sticky "
                     "error, as on a GPU)",
                     s->id, s->ctx->dev, s->cur, err_name(r));
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->done++;
        if (turn && s->gen == s->ctx->gen)
            s->ctx->hwq[s->hwq].done++;
        op_free(op);
        snprintf(s->cur, sizeof s->cur, "idle");
        pthread_cond_broadcast(&g.done_cv);
    }
    stream_unref(s);
    pthread_mutex_unlock(&g.lock);
    return NULL;
}

CUAPI int cuCtxSynchronize(void)
{
    CHECK_INIT();
    pthread_mutex_lock(&g.lock);
    mctx_t *c;
    int r = ctx_current(&c);
    if (r == CUDA_SUCCESS)
        r = capture_forbids("cuCtxSynchronize");
    if (r == CUDA_SUCCESS) {
        if (c->legacy) {
            mop_t *op = op_new(OP_NOP);
            if (op)
                enqueue(c->legacy, op);
        }
        ctx_drain(c, "cuCtxSynchronize");
        r = c->active ? c->sticky : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}
