/*
 * An emulated NCCL (build/mock/libnccl.so.2) for running hcoll's device
 * path where there is no GPU. It runs on the emulated CUDA driver of
 * tests/mock/cuda.c (the seam is hcmock.h): collectives run on the caller's
 * stream worker, "device" memory is reached through hcmock_dev_to_host.
 *
 *  rank r's process                         one POSIX shm segment per communicator,
 *                                           "/hcmock-nccl-<id>", unlinked once the
 *                                           last rank has attached
 *  ncclCommInitRank[Config] ── attach ───►  ┌───────────────────────────────────────┐
 *   (blocking=0: a thread; InProgress)      │ header: nranks, attached, fail, bell  │
 *                                           │ rank[i]: pid, host, device, step,     │
 *  ncclAllReduce(..., stream)               │          conn, fin                    │
 *   ├ checks (arguments, pointers)          │ desc[t%2][i]: what rank i runs at     │
 *   └ group end: launch                     │          step t (checked equal)       │
 *      (blocking=0: a thread; InProgress)   │ slot[t%2][i]: chunk rank i posts at t │
 *      first launch: connect rendezvous     └───────────────────────────────────────┘
 *      hcmock_stream_enqueue(stream, op) ─┐        ▲ post chunk, publish step t,
 *                                         ▼        │ wait every rank's step ≥ t,
 *  stream worker (mock libcuda): op k runs after   │ read all slots: reduce in rank
 *   op k-1 of the communicator, steps through  ────┘ order 0..n-1, or copy
 *
 * One collective = one arrival step (descriptors compared: a different
 * collective, count, type, op or root on another rank is ncclInvalidUsage)
 * then one step per chunk of at most slot_bytes per rank. Two slot sets
 * alternate by step parity: writing set t%2 is safe once every rank has
 * published step t-1, i.e. finished reading step t-2.
 *
 * Emulated as NCCL 2.28 behaves:
 *   - init: arguments (nranks, rank: ncclInvalidArgument), config (magic,
 *     version-gated fields, blocking 0/1, NCCL_COMM_BLOCKING), a rendezvous
 *     that blocks until all ranks arrive, "Duplicate GPU detected" for two
 *     ranks on one (host, device) (ncclInvalidUsage; the other ranks fail
 *     with ncclRemoteError as their bootstrap would), a peer dying during
 *     set-up (ncclRemoteError). Host = NCCL_HOSTID, else hostname plus
 *     HCOLL_HOSTID (hcoll's emulated nodes). Device = the calling thread's
 *     current device, 0 when none (cudaGetDevice's answer).
 *   - non-blocking communicators: init, every group launch (so every
 *     collective outside a group) and finalize return ncclInProgress and
 *     finish on a thread; the stream holds the work only once
 *     ncclCommGetAsyncError says ncclSuccess. Using the communicator
 *     meanwhile is ncclInvalidArgument ("Attempt to use communicator before
 *     the previous operation returned ncclSuccess"). An error (also one
 *     inside a failed group) stays: later calls return it.
 *   - the first collective of a communicator connects: a host-side
 *     rendezvous with the other ranks' first collective (runtime connect;
 *     a blocking communicator's first call blocks until then).
 *   - a communicator's operations run in issue order, also across streams
 *     (NCCL serialises its kernels); one on a stream of another device
 *     fails its launch: ncclUnhandledCudaError.
 *   - groups nest; an error inside a group cancels the whole group. (A
 *     non-blocking group with a NULL stream launches in the calling
 *     thread, whose context owns that stream, and returns ncclSuccess.)
 *   - ncclRedOpCreatePreMulSum / ncclRedOpDestroy: each input times the
 *     scalar (host immediate: copied; device: read when the op runs),
 *     rounded in its type, then summed; the op may be destroyed once the
 *     calls using it are enqueued.
 *   - ncclAvg: floats pre-multiply each input by 1/n (NCCL's PreMulSum),
 *     integers sum then divide; MAX/MIN of floats are fmax/fmin (NaN does
 *     not propagate); half types round at every step.
 *   - finalize waits for this rank's enqueued operations, then for every
 *     rank's finalize (NCCL's intra-node barrier; a peer that aborted or
 *     died fails it: ncclRemoteError); destroy without finalize does the
 *     same but only logs; destroy/finalize of a busy or failed communicator
 *     return its state; abort never waits and ends a blocked collective
 *     within ~10 ms. A destroyed handle is recognised: ncclInvalidArgument.
 * Stricter than NCCL, to show bugs instead of corrupting data:
 *   - every buffer must lie inside one live device allocation
 *     (NCCL_CHECK_POINTERS=1 behaviour, always on): ncclInvalidArgument;
 *     at run time (memory freed meanwhile): ncclUnhandledCudaError;
 *   - send/recv overlapping other than at NCCL's in-place position:
 *     ncclInvalidArgument;
 *   - a rank that never reaches a step (dead, hung, called something else)
 *     makes the waiting stream function give up after HCMOCK_NCCL_TIMEOUT_MS
 *     (default 30000) with ncclRemoteError, where NCCL's kernel would spin
 *     forever; a dead peer is not noticed sooner inside a collective,
 *     as in NCCL.
 * Not emulated: send/recv, split, user reduction ops, fp8 reductions,
 * ncclCommInitAll, init inside a group, the cross-stream join of a group
 * (its operations simply run in order on their own streams), a unique id
 * used for a second communicator (it rendezvouses again instead of failing).
 *
 * Knobs: HCMOCK_NCCL_TIMEOUT_MS, HCMOCK_NCCL_CHUNK_BYTES (per rank and slot,
 * default 256 KiB), HCMOCK_NCCL_LAUNCH_US (how long a non-blocking launch
 * stays in progress, default 1000), NCCL_DEBUG (NONE silences the WARN
 * lines, INFO adds set-up lines, TRACE a line as each collective starts and
 * ends on its stream), NCCL_COMM_BLOCKING, NCCL_HOSTID.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/reduce.h"
#include "hcmock.h"

/* ------------------------------------------------------------------------ */
/* NCCL's ABI (values from nccl.h 2.28)                                       */
/* ------------------------------------------------------------------------ */

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

enum { NC_SUM = 0, NC_PROD = 1, NC_MAX = 2, NC_MIN = 3, NC_AVG = 4, NC_NUM_OPS = 5 };
#define PM_MAX 64 /* live PreMulSum ops per communicator */
enum {
    NC_INT8 = 0, NC_UINT8 = 1, NC_INT32 = 2, NC_UINT32 = 3, NC_INT64 = 4, NC_UINT64 = 5,
    NC_FLOAT16 = 6, NC_FLOAT32 = 7, NC_FLOAT64 = 8, NC_BFLOAT16 = 9, NC_FP8E4M3 = 10,
    NC_FP8E5M2 = 11, NC_NUM_TYPES = 12
};

#define NC_VERSION_CODE 22809 /* 2.28.9, the toolkit's nccl.h */
#define NC_CONFIG_MAGIC 0xcafebeefu
#define NC_UNDEF_INT INT_MIN
#define NC_V(x, y, z) ((x) * 10000 + (y) * 100 + (z)) /* NCCL_VERSION for y > 8 */

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;

/* ncclConfig_t of NCCL 2.28; callers may pass a shorter, older prefix. */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_API __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* Settings, messages, small helpers                                          */
/* ------------------------------------------------------------------------ */

enum { LOG_NONE, LOG_WARN, LOG_INFO, LOG_TRACE };

/* Read once, then read-only. */
static struct {
    int timeout_ms;
    size_t chunk_bytes;
    int launch_us;
    int log;
    int blocking_env; /* NC_UNDEF_INT, 0 or 1 */
} g_set;
static pthread_once_t g_set_once = PTHREAD_ONCE_INIT;

static long env_long(const char *name, long def, long lo, long hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end;
    long v = strtol(s, &end, 0);
    return *end || v < lo || v > hi ? def : v;
}

static void settings_load(void)
{
    g_set.timeout_ms = (int)env_long("HCMOCK_NCCL_TIMEOUT_MS", 30000, 1, INT_MAX);
    g_set.chunk_bytes = (size_t)env_long("HCMOCK_NCCL_CHUNK_BYTES", 256 << 10, 4096, 1L << 30);
    g_set.chunk_bytes &= ~(size_t)63;
    g_set.launch_us = (int)env_long("HCMOCK_NCCL_LAUNCH_US", 1000, 0, 10000000);
    const char *d = getenv("NCCL_DEBUG");
    g_set.log = !d ? LOG_WARN
              : !strcasecmp(d, "NONE") ? LOG_NONE
              : !strcasecmp(d, "INFO")  ? LOG_INFO
              : !strcasecmp(d, "TRACE") ? LOG_TRACE
                                        : LOG_WARN;
    g_set.blocking_env = (int)env_long("NCCL_COMM_BLOCKING", NC_UNDEF_INT, 0, 1);
}

static void settings(void)
{
    pthread_once(&g_set_once, settings_load);
}

/* ncclGetLastError's text: process-wide, as in NCCL. */
static pthread_mutex_t g_last_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_last[512];

static void __attribute__((format(printf, 2, 3))) say(int level, const char *fmt, ...)
{
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    settings();
    if (level == LOG_WARN) {
        pthread_mutex_lock(&g_last_lock);
        snprintf(g_last, sizeof g_last, "%s", msg);
        pthread_mutex_unlock(&g_last_lock);
    }
    if (g_set.log >= level)
        fprintf(stderr, "hcmock-nccl pid %d %s %s\n", (int)getpid(),
                level == LOG_WARN ? "WARN" : level == LOG_INFO ? "INFO" : "TRACE", msg);
}
#define WARN(...) say(LOG_WARN, __VA_ARGS__)
#define INFO(...) say(LOG_INFO, __VA_ARGS__)
#define TRACE(...) say(LOG_TRACE, __VA_ARGS__)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

/* Shared (not private) futex: the word lives in the segment. */
static void futex_wait(_Atomic uint32_t *w, uint32_t seen, int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* A zombie still answers kill(pid, 0): look at its state too. */
static int pid_alive(int pid)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

#define HOST_MAX 96

static void host_key(char *out, size_t len)
{
    const char *nid = getenv("NCCL_HOSTID"), *hid = getenv("HCOLL_HOSTID");
    if (nid && *nid) {
        snprintf(out, len, "%s", nid);
        return;
    }
    char h[64] = "?";
    gethostname(h, sizeof h - 1);
    h[sizeof h - 1] = '\0';
    snprintf(out, len, "%s%s%s", h, hid && *hid ? "/" : "", hid && *hid ? hid : "");
}

/* ------------------------------------------------------------------------ */
/* Types and reductions                                                       */
/* ------------------------------------------------------------------------ */

static size_t type_size(int t)
{
    static const unsigned char sz[NC_NUM_TYPES] = { 1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1 };
    return t >= 0 && t < NC_NUM_TYPES ? sz[t] : 0;
}

static int type_is_float(int t)
{
    return t == NC_FLOAT16 || t == NC_FLOAT32 || t == NC_FLOAT64 || t == NC_BFLOAT16;
}

static hcoll_dtype_t type_hcoll(int t)
{
    switch (t) {
    case NC_INT8: return HCOLL_INT8;
    case NC_UINT8: return HCOLL_UINT8;
    case NC_INT32: return HCOLL_INT32;
    case NC_INT64: return HCOLL_INT64;
    case NC_FLOAT16: return HCOLL_FLOAT16;
    case NC_FLOAT32: return HCOLL_FLOAT32;
    case NC_FLOAT64: return HCOLL_FLOAT64;
    case NC_BFLOAT16: return HCOLL_BFLOAT16;
    default: return HCOLL_DTYPE_COUNT_;
    }
}

static const char *type_name(int t)
{
    static const char *n[NC_NUM_TYPES] = { "int8",    "uint8",   "int32",   "uint32",
                                           "int64",   "uint64",  "float16", "float32",
                                           "float64", "bfloat16", "fp8e4m3", "fp8e5m2" };
    return t >= 0 && t < NC_NUM_TYPES ? n[t] : "?";
}

static const char *op_name(int op)
{
    static const char *n[NC_NUM_OPS] = { "sum", "prod", "max", "min", "avg" };
    return op >= 0 && op < NC_NUM_OPS ? n[op] : "?";
}

static float half_get(const void *p, int t)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return t == NC_FLOAT16 ? hc_half_to_float(h) : hc_bf16_to_float(h);
}

static void half_put(void *p, int t, float f)
{
    uint16_t h = t == NC_FLOAT16 ? hc_float_to_half(f) : hc_float_to_bf16(f);
    memcpy(p, &h, 2);
}

/* NCCL's floating MAX/MIN are fmax/fmin (__hmax/__hmin for half types): a
 * NaN input yields the other input, unlike hcoll's host kernels. */
static void minmax_float(unsigned char *dst, const unsigned char *a, const unsigned char *b,
                         size_t n, int t, int is_max)
{
    const size_t es = type_size(t);
    for (size_t i = 0; i < n; i++, dst += es, a += es, b += es) {
        if (t == NC_FLOAT32) {
            float x, y, r;
            memcpy(&x, a, 4);
            memcpy(&y, b, 4);
            r = is_max ? fmaxf(x, y) : fminf(x, y);
            memcpy(dst, &r, 4);
        } else if (t == NC_FLOAT64) {
            double x, y, r;
            memcpy(&x, a, 8);
            memcpy(&y, b, 8);
            r = is_max ? fmax(x, y) : fmin(x, y);
            memcpy(dst, &r, 8);
        } else {
            float x = half_get(a, t), y = half_get(b, t);
            uint16_t pick;
            if (isnan(x) && isnan(y))
                pick = 0x7fff; /* CUDA's canonical NaN */
            else if (isnan(x) || (!isnan(y) && (is_max ? y > x : y < x)))
                memcpy(&pick, b, 2);
            else
                memcpy(&pick, a, 2);
            memcpy(dst, &pick, 2);
        }
    }
}

/* hcoll has no unsigned 32/64-bit types. */
static void reduce_unsigned(unsigned char *dst, const unsigned char *a, const unsigned char *b,
                            size_t n, int t, int op)
{
    for (size_t i = 0; i < n; i++) {
        if (t == NC_UINT32) {
            uint32_t x, y, r;
            memcpy(&x, a + 4 * i, 4);
            memcpy(&y, b + 4 * i, 4);
            r = op == NC_PROD ? x * y : op == NC_MAX ? (x > y ? x : y)
              : op == NC_MIN  ? (x < y ? x : y) : x + y;
            memcpy(dst + 4 * i, &r, 4);
        } else {
            uint64_t x, y, r;
            memcpy(&x, a + 8 * i, 8);
            memcpy(&y, b + 8 * i, 8);
            r = op == NC_PROD ? x * y : op == NC_MAX ? (x > y ? x : y)
              : op == NC_MIN  ? (x < y ? x : y) : x + y;
            memcpy(dst + 8 * i, &r, 8);
        }
    }
}

/* dst = a op b (dst may equal a); op is never AVG here. */
static void reduce2(void *dst, const void *a, const void *b, size_t n, int t, int op)
{
    if (t == NC_UINT32 || t == NC_UINT64)
        reduce_unsigned(dst, a, b, n, t, op);
    else if (type_is_float(t) && (op == NC_MAX || op == NC_MIN))
        minmax_float(dst, a, b, n, t, op == NC_MAX);
    else
        hc_reduce(dst, a, b, n, type_hcoll(t),
                  op == NC_PROD ? HCOLL_PROD : op == NC_MAX ? HCOLL_MAX
                : op == NC_MIN  ? HCOLL_MIN : HCOLL_SUM);
}

/* ncclAvg on floats: every input times 1/n, rounded in its type, before
 * the sum (NCCL's PreMulSum with scalar 1/nRanks). */
static void premul(void *dst, const void *src, size_t n, int t, int nranks)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (t == NC_FLOAT32) {
        const float k = (float)(1.0 / nranks);
        for (size_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, s + 4 * i, 4);
            x *= k;
            memcpy(d + 4 * i, &x, 4);
        }
    } else if (t == NC_FLOAT64) {
        const double k = 1.0 / nranks;
        for (size_t i = 0; i < n; i++) {
            double x;
            memcpy(&x, s + 8 * i, 8);
            x *= k;
            memcpy(d + 8 * i, &x, 8);
        }
    } else {
        unsigned char kb[2];
        half_put(kb, t, (float)(1.0 / nranks));
        const float k = half_get(kb, t);
        for (size_t i = 0; i < n; i++)
            half_put(d + 2 * i, t, half_get(s + 2 * i, t) * k);
    }
}

/* ncclAvg on integers: the sum divided once (NCCL's SumPostDiv). */
static void postdiv(void *buf, size_t n, int t, int nranks)
{
    if (t == NC_UINT32 || t == NC_UINT64) {
        unsigned char *b = buf;
        for (size_t i = 0; i < n; i++) {
            if (t == NC_UINT32) {
                uint32_t x;
                memcpy(&x, b + 4 * i, 4);
                x /= (uint32_t)nranks;
                memcpy(b + 4 * i, &x, 4);
            } else {
                uint64_t x;
                memcpy(&x, b + 8 * i, 8);
                x /= (uint64_t)nranks;
                memcpy(b + 8 * i, &x, 8);
            }
        }
        return;
    }
    hc_reduce_avg_finish(buf, n, type_hcoll(t), HCOLL_AVG, nranks);
}

/* ------------------------------------------------------------------------ */
/* The shared segment                                                         */
/* ------------------------------------------------------------------------ */

#define SEG_MAGIC 0x6e63636cu /* "nccl" */
#define ID_TAG "hcmock-nccl-id"

/* What ncclGetUniqueId writes into the 128 bytes. */
typedef struct {
    char tag[16];
    int32_t pid;      /* the process that made it: NCCL's bootstrap root lives there */
    uint32_t serial;
    uint64_t rnd[2];
} hcm_uid_t;

typedef struct {
    _Atomic uint64_t step; /* stream side: the last step this rank published */
    _Atomic uint32_t conn; /* host side: connect rendezvous reached */
    _Atomic uint32_t fin;  /* host side: FIN_DONE (finalize barrier reached) or FIN_ABORTED */
    _Atomic int32_t pid;   /* 0 until the rank attached */
    int32_t dev;
    char host[HOST_MAX];
} seg_rank_t;

enum { FIN_DONE = 1, FIN_ABORTED = 2 };

typedef struct {
    uint64_t seq, count;
    int32_t coll, dtype, redop, root;
} seg_desc_t;

typedef struct {
    _Atomic uint32_t ready;   /* SEG_MAGIC once the creator laid it out */
    _Atomic uint32_t bell;    /* futex word, bumped at every publication */
    _Atomic int32_t attached; /* ranks that claimed their slot */
    _Atomic int32_t fail;     /* a set-up failure every rank reports */
    int32_t nranks;
    int32_t pad;
    uint64_t slot_bytes;
    uint64_t total_bytes;
} seg_hdr_t;

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

static size_t seg_ranks_off(void)
{
    return ALIGN_UP(sizeof(seg_hdr_t), 64);
}
static size_t seg_desc_off(int n)
{
    return ALIGN_UP(seg_ranks_off() + (size_t)n * sizeof(seg_rank_t), 64);
}
static size_t seg_slots_off(int n)
{
    return ALIGN_UP(seg_desc_off(n) + 2 * (size_t)n * sizeof(seg_desc_t), 4096);
}

static void bell_ring(seg_hdr_t *h)
{
    atomic_fetch_add(&h->bell, 1);
    futex_wake_all(&h->bell);
}

/* ------------------------------------------------------------------------ */
/* Communicators                                                              */
/* ------------------------------------------------------------------------ */

#define COMM_LIVE 0x4c495645u
#define COMM_DEAD 0x44454144u

enum { COLL_BCAST, COLL_REDUCE, COLL_ALLGATHER, COLL_REDUCESCATTER, COLL_ALLREDUCE };
static const char *const coll_name[] = { "ncclBroadcast", "ncclReduce", "ncclAllGather",
                                         "ncclReduceScatter", "ncclAllReduce" };

struct ncclComm {
    _Atomic uint32_t magic;  /* COMM_LIVE until destroy/abort returned */
    struct ncclComm *next;   /* registry */
    int rank, nranks, dev, blocking;
    char host[HOST_MAX];
    char name[64];
    hcm_uid_t id;
    seg_hdr_t *seg;
    size_t seg_len;
    seg_rank_t *ranks;
    seg_desc_t *desc;
    unsigned char *slots;
    size_t slot_bytes;
    atomic_int refs;     /* the user's handle, queued operations, threads */
    atomic_int err;      /* first error, sticky (NCCL's asyncResult) */
    atomic_int busy;     /* jobs in flight: init, launch, finalize */
    atomic_int aborted;
    atomic_int init_ok;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int connected, finalized;     /* host side, under lock */
    uint64_t issued, done;        /* operations enqueued / finished, under lock */
    uint64_t step;                /* the running operation's step counter */
    /* ncclRedOpCreatePreMulSum ops: handle NC_NUM_OPS + index, under lock. */
    struct {
        int live, dtype, residence; /* residence: 0 device, 1 host immediate */
        unsigned char val[8];
        const void *dev;
    } pm[PM_MAX];
};

/* Every communicator ever made stays listed (destroyed ones marked dead and
 * emptied), so that a stale handle is recognised instead of reused. */
static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *g_reg;

static ncclResult_t comm_check(ncclComm_t c, const char *fn)
{
    if (!c) {
        WARN("%s: comm argument is NULL", fn);
        return ncclInvalidArgument;
    }
    pthread_mutex_lock(&g_reg_lock);
    struct ncclComm *p = g_reg;
    while (p && p != c)
        p = p->next;
    uint32_t m = p ? atomic_load(&p->magic) : 0;
    pthread_mutex_unlock(&g_reg_lock);
    if (!p) {
        WARN("%s: %p is not a communicator (corrupted comm object)", fn, (void *)c);
        return ncclInvalidArgument;
    }
    if (m != COMM_LIVE) {
        WARN("%s: comm %p has already been destroyed or aborted", fn, (void *)c);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static void comm_ref(ncclComm_t c)
{
    atomic_fetch_add(&c->refs, 1);
}

static void comm_unref(ncclComm_t c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->seg)
        munmap(c->seg, c->seg_len);
    c->seg = NULL;
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
}

/* The communicator's state as ncclCommGetAsyncError reports it. */
static ncclResult_t comm_state(ncclComm_t c)
{
    int e = atomic_load(&c->err);
    if (e != ncclSuccess)
        return (ncclResult_t)e;
    return atomic_load(&c->busy) > 0 ? ncclInProgress : ncclSuccess;
}

static void comm_fail(ncclComm_t c, ncclResult_t r)
{
    int zero = ncclSuccess;
    if (r != ncclSuccess && r != ncclInProgress)
        atomic_compare_exchange_strong(&c->err, &zero, (int)r);
}

/* NCCL's ncclCommEnsureReady. */
static ncclResult_t comm_ready(ncclComm_t c, const char *fn)
{
    ncclResult_t s = comm_state(c);
    if (s == ncclInProgress) {
        WARN("%s: Attempt to use communicator before the previous operation returned "
             "ncclSuccess (poll ncclCommGetAsyncError until it does)",
             fn);
        return ncclInvalidArgument;
    }
    if (s != ncclSuccess)
        WARN("%s: the communicator failed earlier: %d", fn, (int)s);
    return s;
}

static void comm_wake(ncclComm_t c)
{
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (c->seg)
        bell_ring(c->seg);
}

/* Wait until pred holds for every rank of the segment. Host-side waits
 * (set-up, connect, finalize) notice a dead peer, as NCCL's bootstrap
 * sockets would; stream-side waits only time out, as NCCL's kernels spin. */
typedef int (*rank_pred_fn)(ncclComm_t c, int j, uint64_t want);

static ncclResult_t wait_ranks(ncclComm_t c, rank_pred_fn pred, uint64_t want, int host_side,
                               const char *what)
{
    seg_hdr_t *h = c->seg;
    double t0 = now_ms(), deadline = t0 + g_set.timeout_ms, next_alive = t0 + 50;
    for (;;) {
        uint32_t seen = atomic_load(&h->bell);
        int missing = -1;
        for (int j = 0; j < c->nranks && missing < 0; j++)
            if (!pred(c, j, want))
                missing = j;
        if (missing < 0)
            return ncclSuccess;
        if (atomic_load(&c->aborted))
            return ncclInvalidUsage; /* nobody reads it: the handle is gone */
        double t = now_ms();
        if (host_side && t >= next_alive) {
            next_alive = t + 50;
            for (int j = 0; j < c->nranks; j++) {
                int pid = atomic_load(&c->ranks[j].pid);
                if (j != c->rank && pid > 0 && !pred(c, j, want) && !pid_alive(pid)) {
                    WARN("rank %d: %s: rank %d (pid %d) exited", c->rank, what, j, pid);
                    return ncclRemoteError;
                }
            }
        }
        if (t >= deadline) {
            WARN("rank %d: %s: rank %d did not arrive within %d ms (HCMOCK_NCCL_TIMEOUT_MS)",
                 c->rank, what, missing, g_set.timeout_ms);
            return ncclRemoteError;
        }
        futex_wait(&h->bell, seen, 10);
    }
}

static int pred_step(ncclComm_t c, int j, uint64_t want)
{
    return atomic_load(&c->ranks[j].step) >= want;
}
static int pred_conn(ncclComm_t c, int j, uint64_t want)
{
    return atomic_load(&c->ranks[j].conn) >= want;
}
static int pred_fin(ncclComm_t c, int j, uint64_t want)
{
    return atomic_load(&c->ranks[j].fin) >= want;
}

/* ------------------------------------------------------------------------ */
/* Set-up: the rendezvous                                                     */
/* ------------------------------------------------------------------------ */

static void seg_map_fields(ncclComm_t c)
{
    unsigned char *base = (unsigned char *)c->seg;
    c->ranks = (seg_rank_t *)(base + seg_ranks_off());
    c->desc = (seg_desc_t *)(base + seg_desc_off(c->nranks));
    c->slots = base + seg_slots_off(c->nranks);
    c->slot_bytes = c->seg->slot_bytes;
}

/* Leaving before every rank attached: tell the others and take the name
 * away, so that nothing stays in /dev/shm. */
static void seg_give_up(ncclComm_t c, ncclResult_t why)
{
    seg_hdr_t *h = c->seg;
    if (!h || atomic_load(&h->ready) != SEG_MAGIC) {
        shm_unlink(c->name);
        return;
    }
    int zero = 0;
    atomic_compare_exchange_strong(&h->fail, &zero, (int)why);
    if (atomic_load(&h->attached) < h->nranks)
        shm_unlink(c->name);
    bell_ring(h);
}

static ncclResult_t seg_create(ncclComm_t c, int fd)
{
    const size_t slot = g_set.chunk_bytes;
    const size_t total = seg_slots_off(c->nranks) + 2 * (size_t)c->nranks * slot;
    int e = posix_fallocate(fd, 0, (off_t)total);
    if (e != 0) {
        WARN("rank %d: cannot size shared segment %s to %zu bytes: %s", c->rank, c->name, total,
             strerror(e));
        return ncclSystemError;
    }
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        WARN("rank %d: mmap %s: %s", c->rank, c->name, strerror(errno));
        return ncclSystemError;
    }
    c->seg = p;
    c->seg_len = total;
    c->seg->nranks = c->nranks;
    c->seg->slot_bytes = slot;
    c->seg->total_bytes = total;
    seg_map_fields(c);
    atomic_store(&c->seg->ready, SEG_MAGIC);
    return ncclSuccess;
}

static ncclResult_t seg_join(ncclComm_t c, int fd, double deadline)
{
    struct stat st;
    for (;;) {
        if (fstat(fd, &st) != 0) {
            WARN("rank %d: fstat %s: %s", c->rank, c->name, strerror(errno));
            return ncclSystemError;
        }
        if (st.st_size > 0)
            break;
        if (atomic_load(&c->aborted))
            return ncclInvalidUsage;
        if (now_ms() > deadline) {
            WARN("rank %d: the rank that created %s never laid it out", c->rank, c->name);
            return ncclSystemError;
        }
        sleep_us(1000);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        WARN("rank %d: mmap %s: %s", c->rank, c->name, strerror(errno));
        return ncclSystemError;
    }
    c->seg = p;
    c->seg_len = (size_t)st.st_size;
    while (atomic_load(&c->seg->ready) != SEG_MAGIC) {
        if (atomic_load(&c->aborted))
            return ncclInvalidUsage;
        if (now_ms() > deadline) {
            WARN("rank %d: the rank that created %s never laid it out", c->rank, c->name);
            return ncclSystemError;
        }
        sleep_us(1000);
    }
    if (c->seg->nranks != c->nranks || c->seg->total_bytes != c->seg_len) {
        WARN("rank %d: ncclCommInitRank with nranks %d, but the communicator of this unique "
             "id has %d ranks",
             c->rank, c->nranks, c->seg->nranks);
        seg_give_up(c, ncclInvalidUsage);
        return ncclInvalidUsage;
    }
    seg_map_fields(c);
    return ncclSuccess;
}

static ncclResult_t comm_setup(ncclComm_t c)
{
    const double deadline = now_ms() + g_set.timeout_ms;
    ncclResult_t r;
    int fd;
    for (;;) {
        fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            r = seg_create(c, fd);
            break;
        }
        if (errno != EEXIST) {
            WARN("rank %d: shm_open %s: %s", c->rank, c->name, strerror(errno));
            return ncclSystemError;
        }
        fd = shm_open(c->name, O_RDWR, 0);
        if (fd >= 0) {
            r = seg_join(c, fd, deadline);
            break;
        }
        if (errno != ENOENT) {
            WARN("rank %d: shm_open %s: %s", c->rank, c->name, strerror(errno));
            return ncclSystemError;
        }
        /* Unlinked between the two opens: its communicator is complete or
         * failed; try again as the creator of a new one. */
    }
    close(fd);
    if (r != ncclSuccess) {
        if (r != ncclInvalidUsage) /* a mismatch gave up already */
            seg_give_up(c, r);
        return r;
    }
    seg_hdr_t *h = c->seg;
    if (atomic_load(&h->fail) != 0) {
        WARN("rank %d: another rank of this communicator failed its set-up", c->rank);
        return ncclRemoteError;
    }
    int expect = 0;
    seg_rank_t *me = &c->ranks[c->rank];
    if (!atomic_compare_exchange_strong(&me->pid, &expect, (int32_t)getpid())) {
        WARN("rank %d: two processes initialise rank %d of one communicator (pid %d first)",
             c->rank, c->rank, expect);
        seg_give_up(c, ncclInvalidUsage);
        return ncclInvalidUsage;
    }
    me->dev = c->dev;
    memcpy(me->host, c->host, HOST_MAX);
    if (atomic_fetch_add(&h->attached, 1) + 1 == c->nranks)
        shm_unlink(c->name);
    bell_ring(h);

    /* Everyone attached; the process holding the id's root must live until
     * then, as NCCL's bootstrap root thread must. */
    double next_alive = now_ms() + 50;
    for (;;) {
        uint32_t seen = atomic_load(&h->bell);
        if (atomic_load(&h->attached) >= c->nranks)
            break;
        int f = atomic_load(&h->fail);
        if (f != 0) {
            WARN("rank %d: another rank of this communicator failed its set-up", c->rank);
            return ncclRemoteError;
        }
        if (atomic_load(&c->aborted)) {
            seg_give_up(c, ncclRemoteError);
            return ncclInvalidUsage;
        }
        double t = now_ms();
        if (t >= next_alive) {
            next_alive = t + 50;
            int dead = 0;
            for (int j = 0; j < c->nranks && !dead; j++) {
                int pid = atomic_load(&c->ranks[j].pid);
                if (pid > 0 && !pid_alive(pid)) {
                    WARN("rank %d: rank %d (pid %d) exited during ncclCommInitRank", c->rank, j,
                         pid);
                    dead = 1;
                }
            }
            if (!dead && !pid_alive(c->id.pid)) {
                WARN("rank %d: the process that called ncclGetUniqueId (pid %d, NCCL's "
                     "bootstrap root) exited before every rank joined",
                     c->rank, c->id.pid);
                dead = 1;
            }
            if (dead) {
                seg_give_up(c, ncclRemoteError);
                return ncclRemoteError;
            }
        }
        if (t >= deadline) {
            WARN("rank %d: bootstrap timeout: %d of %d ranks joined within %d ms "
                 "(HCMOCK_NCCL_TIMEOUT_MS)",
                 c->rank, atomic_load(&h->attached), c->nranks, g_set.timeout_ms);
            seg_give_up(c, ncclSystemError);
            return ncclSystemError;
        }
        futex_wait(&h->bell, seen, 10);
    }

    r = ncclSuccess;
    for (int i = 0; i < c->nranks; i++)
        for (int j = i + 1; j < c->nranks; j++)
            if (c->ranks[i].dev == c->ranks[j].dev &&
                !strncmp(c->ranks[i].host, c->ranks[j].host, HOST_MAX)) {
                if (i == c->rank || j == c->rank) {
                    WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %d "
                         "(host %.*s)",
                         c->rank, i == c->rank ? j : i, c->dev, HOST_MAX, c->host);
                    r = ncclInvalidUsage;
                } else if (r == ncclSuccess) {
                    WARN("rank %d: ranks %d and %d failed their set-up (duplicate GPU)", c->rank,
                         i, j);
                    r = ncclRemoteError;
                }
            }
    if (r == ncclSuccess) {
        atomic_store(&c->init_ok, 1);
        INFO("comm %p rank %d nranks %d cudaDev %d host %s - Init COMPLETE", (void *)c, c->rank,
             c->nranks, c->dev, c->host);
    }
    return r;
}

static void *init_thread(void *arg)
{
    ncclComm_t c = arg;
    comm_fail(c, comm_setup(c));
    atomic_fetch_sub(&c->busy, 1);
    comm_unref(c);
    return NULL;
}

static int spawn(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&t, &a, fn, arg);
    pthread_attr_destroy(&a);
    return e;
}

/* ------------------------------------------------------------------------ */
/* Collectives on the stream worker                                           */
/* ------------------------------------------------------------------------ */

typedef struct op {
    struct op *next;
    ncclComm_t comm;
    int coll, dtype, redop, root;
    const void *send;
    void *recv;
    size_t count; /* as NCCL counts: per rank for AllGather/ReduceScatter */
    void *stream;
    uint64_t seq;
    /* A PreMulSum op, captured at enqueue (NCCL lets the op be destroyed
     * once the call is enqueued): the scalar, or its device address. */
    int pm;
    unsigned char pm_val[8];
    const void *pm_dev;
} op_t;

static unsigned char *slot_at(ncclComm_t c, uint64_t t, int j)
{
    return c->slots + ((size_t)(t % 2) * (size_t)c->nranks + (size_t)j) * c->slot_bytes;
}

static ncclResult_t step_sync(ncclComm_t c, uint64_t t, const op_t *o)
{
    atomic_store(&c->ranks[c->rank].step, t);
    bell_ring(c->seg);
    char what[96];
    snprintf(what, sizeof what, "%s #%llu", coll_name[o->coll], (unsigned long long)o->seq);
    return wait_ranks(c, pred_step, t, 0, what);
}

static void buf_bytes(const ncclComm_t c, const op_t *o, size_t *sb, size_t *rb)
{
    const size_t b = o->count * type_size(o->dtype), n = (size_t)c->nranks;
    const int root = c->rank == o->root;
    switch (o->coll) {
    case COLL_ALLREDUCE: *sb = b; *rb = b; break;
    case COLL_REDUCESCATTER: *sb = n * b; *rb = b; break;
    case COLL_ALLGATHER: *sb = b; *rb = n * b; break;
    case COLL_REDUCE: *sb = b; *rb = root ? b : 0; break;
    default: *sb = root ? b : 0; *rb = b; break;
    }
}

/* PreMulSum: every input times the scalar, rounded in its type (half types
 * in float); integers wrap. */
static void premul_scalar(void *dst, const void *src, size_t n, int t, const unsigned char *k)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case NC_FLOAT32: { float x, y; memcpy(&x, s + 4 * i, 4); memcpy(&y, k, 4); x *= y;
                           memcpy(d + 4 * i, &x, 4); break; }
        case NC_FLOAT64: { double x, y; memcpy(&x, s + 8 * i, 8); memcpy(&y, k, 8); x *= y;
                           memcpy(d + 8 * i, &x, 8); break; }
        case NC_FLOAT16: case NC_BFLOAT16:
            half_put(d + 2 * i, t, half_get(s + 2 * i, t) * half_get(k, t)); break;
        case NC_INT8: case NC_UINT8: d[i] = (unsigned char)(s[i] * k[0]); break;
        case NC_INT32: case NC_UINT32: { uint32_t x, y; memcpy(&x, s + 4 * i, 4); memcpy(&y, k, 4);
                                         x *= y; memcpy(d + 4 * i, &x, 4); break; }
        default: { uint64_t x, y; memcpy(&x, s + 8 * i, 8); memcpy(&y, k, 8); x *= y;
                   memcpy(d + 8 * i, &x, 8); break; }
        }
    }
}

/* What every rank posts: its input, pre-multiplied for a floating AVG. */
static void post(void *slot, const void *src, size_t m, const op_t *o, int nranks)
{
    if (o->pm) {
        unsigned char k[8] = { 0 };
        const size_t es = type_size(o->dtype);
        const void *p = o->pm_dev ? hcmock_dev_to_host((uint64_t)(uintptr_t)o->pm_dev, es)
                                  : o->pm_val;
        if (p) /* a device scalar freed meanwhile reads as 0 */
            memcpy(k, p, es);
        premul_scalar(slot, src, m, o->dtype, k);
    } else if (o->redop == NC_AVG && type_is_float(o->dtype))
        premul(slot, src, m, o->dtype, nranks);
    else
        memcpy(slot, src, m * type_size(o->dtype));
}

/* dst = contributions of ranks 0..n-1 at byte offset off of step t's slots,
 * combined in rank order: the same bits on every rank. */
static void combine(ncclComm_t c, void *dst, uint64_t t, size_t off, size_t m, const op_t *o)
{
    const size_t es = type_size(o->dtype);
    const int op = o->redop == NC_AVG || o->pm ? NC_SUM : o->redop;
    memcpy(dst, slot_at(c, t, 0) + off, m * es);
    for (int j = 1; j < c->nranks; j++)
        reduce2(dst, dst, slot_at(c, t, j) + off, m, o->dtype, op);
    if (o->redop == NC_AVG && !type_is_float(o->dtype))
        postdiv(dst, m, o->dtype, c->nranks);
}

static ncclResult_t run_collective(ncclComm_t c, const op_t *o, const unsigned char *s,
                                   unsigned char *r)
{
    const int n = c->nranks, me = c->rank;
    const size_t es = type_size(o->dtype), S = c->slot_bytes;
    ncclResult_t st;

    /* Arrival: every rank says what it runs; all must agree. */
    uint64_t t = ++c->step;
    seg_desc_t *mine = &c->desc[(t % 2) * (size_t)n + (size_t)me];
    /* Every PreMulSum op reads alike: ranks' handles may differ. */
    *mine = (seg_desc_t){ o->seq, o->count, o->coll, o->dtype,
                          o->pm ? NC_NUM_OPS : o->redop, o->root };
    if ((st = step_sync(c, t, o)) != ncclSuccess)
        return st;
    for (int j = 0; j < n; j++) {
        const seg_desc_t *d = &c->desc[(t % 2) * (size_t)n + (size_t)j];
        int root_matters = o->coll == COLL_BCAST || o->coll == COLL_REDUCE;
        int red_matters = o->coll != COLL_BCAST && o->coll != COLL_ALLGATHER;
        if (d->coll != o->coll || d->count != o->count || d->dtype != o->dtype ||
            (red_matters && d->redop != (o->pm ? NC_NUM_OPS : o->redop)) || (root_matters && d->root != o->root)) {
            WARN("rank %d: operation #%llu: this rank runs %s(count %zu, %s, %s, root %d) but "
                 "rank %d runs %s(count %llu, %s, %s, root %d): every rank must issue the same "
                 "collectives in the same order",
                 me, (unsigned long long)o->seq, coll_name[o->coll], o->count,
                 type_name(o->dtype), op_name(o->redop), o->root, j, coll_name[d->coll],
                 (unsigned long long)d->count, type_name(d->dtype), op_name(d->redop), d->root);
            return ncclInvalidUsage;
        }
    }

    size_t per, m;
    switch (o->coll) {
    case COLL_ALLREDUCE:
    case COLL_REDUCE:
        per = S / es;
        for (size_t done = 0; done < o->count; done += m) {
            m = o->count - done < per ? o->count - done : per;
            t = ++c->step;
            post(slot_at(c, t, me), s + done * es, m, o, n);
            if ((st = step_sync(c, t, o)) != ncclSuccess)
                return st;
            if (o->coll == COLL_ALLREDUCE || me == o->root)
                combine(c, r + done * es, t, 0, m, o);
        }
        break;
    case COLL_REDUCESCATTER:
        per = S / ((size_t)n * es);
        if (per == 0) {
            WARN("rank %d: %d ranks do not fit HCMOCK_NCCL_CHUNK_BYTES %zu", me, n, S);
            return ncclInternalError;
        }
        for (size_t done = 0; done < o->count; done += m) {
            m = o->count - done < per ? o->count - done : per;
            t = ++c->step;
            for (int b = 0; b < n; b++)
                post(slot_at(c, t, me) + (size_t)b * m * es, s + ((size_t)b * o->count + done) * es,
                     m, o, n);
            if ((st = step_sync(c, t, o)) != ncclSuccess)
                return st;
            combine(c, r + done * es, t, (size_t)me * m * es, m, o);
        }
        break;
    case COLL_ALLGATHER:
        per = S / es;
        for (size_t done = 0; done < o->count; done += m) {
            m = o->count - done < per ? o->count - done : per;
            t = ++c->step;
            memcpy(slot_at(c, t, me), s + done * es, m * es);
            if ((st = step_sync(c, t, o)) != ncclSuccess)
                return st;
            for (int j = 0; j < n; j++) {
                unsigned char *dst = r + ((size_t)j * o->count + done) * es;
                if (dst != s + done * es)
                    memcpy(dst, slot_at(c, t, j), m * es);
            }
        }
        break;
    default: /* COLL_BCAST */
        per = S / es;
        for (size_t done = 0; done < o->count; done += m) {
            m = o->count - done < per ? o->count - done : per;
            t = ++c->step;
            if (me == o->root)
                memcpy(slot_at(c, t, me), s + done * es, m * es);
            if ((st = step_sync(c, t, o)) != ncclSuccess)
                return st;
            if (me != o->root || r != s)
                memcpy(r + done * es, slot_at(c, t, o->root), m * es);
        }
        break;
    }
    return ncclSuccess;
}

/* The communicator's operations run in the order they were issued, even
 * across streams (NCCL serialises a communicator's kernels). */
static ncclResult_t wait_turn(ncclComm_t c, uint64_t seq)
{
    const double deadline = now_ms() + g_set.timeout_ms;
    pthread_mutex_lock(&c->lock);
    while (c->done + 1 < seq && !atomic_load(&c->aborted)) {
        if (now_ms() > deadline) {
            pthread_mutex_unlock(&c->lock);
            WARN("rank %d: operation #%llu waited %d ms for operation #%llu of the same "
                 "communicator (on another stream) to finish",
                 c->rank, (unsigned long long)seq, g_set.timeout_ms,
                 (unsigned long long)(seq - 1));
            return ncclRemoteError;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&c->cond, &c->lock, &ts);
    }
    pthread_mutex_unlock(&c->lock);
    return ncclSuccess;
}

static void op_run(void *arg)
{
    op_t *o = arg;
    ncclComm_t c = o->comm;
    ncclResult_t r = wait_turn(c, o->seq);
    if (r == ncclSuccess && !atomic_load(&c->aborted) && atomic_load(&c->err) == ncclSuccess) {
        size_t sb, rb;
        buf_bytes(c, o, &sb, &rb);
        int dev = hcmock_current_device();
        const unsigned char *s = sb ? hcmock_dev_to_host((uint64_t)(uintptr_t)o->send, sb) : NULL;
        unsigned char *d = rb ? hcmock_dev_to_host((uint64_t)(uintptr_t)o->recv, rb) : NULL;
        if (dev != c->dev) {
            WARN("rank %d: %s #%llu runs on a stream of device %d, the communicator's device "
                 "is %d (invalid resource handle)",
                 c->rank, coll_name[o->coll], (unsigned long long)o->seq, dev, c->dev);
            r = ncclUnhandledCudaError;
        } else if ((sb && !s) || (rb && !d)) {
            WARN("rank %d: %s #%llu: %s %p is no longer inside one device allocation when the "
                 "stream runs it (illegal memory access)",
                 c->rank, coll_name[o->coll], (unsigned long long)o->seq,
                 sb && !s ? "sendbuff" : "recvbuff", sb && !s ? o->send : (const void *)o->recv);
            r = ncclUnhandledCudaError;
        } else {
            TRACE("rank %d: %s #%llu count %zu %s %s root %d stream %p: starts", c->rank,
                  coll_name[o->coll], (unsigned long long)o->seq, o->count, type_name(o->dtype),
                  op_name(o->redop), o->root, o->stream);
            r = run_collective(c, o, s, d);
            TRACE("rank %d: %s #%llu: done (%d)", c->rank, coll_name[o->coll],
                  (unsigned long long)o->seq, (int)r);
        }
    }
    if (!atomic_load(&c->aborted))
        comm_fail(c, r);
    pthread_mutex_lock(&c->lock);
    if (c->done < o->seq)
        c->done = o->seq;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    comm_unref(c);
    free(o);
}

/* ------------------------------------------------------------------------ */
/* Groups and launches                                                        */
/* ------------------------------------------------------------------------ */

/* NCCL keeps its group state per thread, too. */
static __thread int g_depth;
static __thread ncclResult_t g_group_err;
static __thread int g_group_blocking = -1;
static __thread op_t *g_head, *g_tail;

/* Inside a group, the first error fails the whole group at its end. */
static ncclResult_t group_err_check(ncclResult_t r)
{
    if (g_depth > 0 && r != ncclSuccess && r != ncclInProgress && g_group_err == ncclSuccess)
        g_group_err = r;
    return r;
}

/* The first collective of a communicator connects its ranks (NCCL's
 * runtime connect): a host-side rendezvous with their first collectives. */
static ncclResult_t comm_connect(ncclComm_t c)
{
    pthread_mutex_lock(&c->lock);
    int done = c->connected;
    pthread_mutex_unlock(&c->lock);
    if (done)
        return ncclSuccess;
    atomic_store(&c->ranks[c->rank].conn, 1);
    bell_ring(c->seg);
    ncclResult_t r = wait_ranks(c, pred_conn, 1, 1, "connecting (first collective)");
    if (r == ncclSuccess) {
        pthread_mutex_lock(&c->lock);
        c->connected = 1;
        pthread_mutex_unlock(&c->lock);
    }
    return r;
}

static ncclResult_t op_enqueue(op_t *o)
{
    ncclComm_t c = o->comm;
    comm_ref(c);
    int e = hcmock_stream_enqueue(o->stream, op_run, o);
    if (e == 0)
        return ncclSuccess;
    WARN("rank %d: %s: launching on stream %p failed: CUDA error %d", c->rank,
         coll_name[o->coll], o->stream, e);
    /* It will never run: count it finished so that later ones go on. */
    pthread_mutex_lock(&c->lock);
    if (c->done < o->seq)
        c->done = o->seq;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    comm_unref(c);
    free(o);
    return ncclUnhandledCudaError;
}

typedef struct launch {
    op_t *ops;
    ncclComm_t comms[64];
    int ncomms;
} launch_t;

/* Connect what needs it, then hand every operation to its stream. */
static ncclResult_t launch_run(launch_t *l)
{
    ncclResult_t ret = ncclSuccess;
    for (int i = 0; i < l->ncomms; i++) {
        ncclResult_t r = comm_connect(l->comms[i]);
        if (r != ncclSuccess) {
            comm_fail(l->comms[i], r);
            if (ret == ncclSuccess)
                ret = r;
        }
    }
    op_t *o = l->ops;
    while (o) {
        op_t *next = o->next;
        ncclComm_t c = o->comm; /* op_enqueue may free o */
        ncclResult_t r = ret == ncclSuccess ? op_enqueue(o) : ncclSuccess;
        if (ret != ncclSuccess) {
            /* Cancelled: count it finished. */
            comm_fail(o->comm, ret);
            pthread_mutex_lock(&o->comm->lock);
            if (o->comm->done < o->seq)
                o->comm->done = o->seq;
            pthread_cond_broadcast(&o->comm->cond);
            pthread_mutex_unlock(&o->comm->lock);
            free(o);
        } else if (r != ncclSuccess) {
            comm_fail(c, r);
            ret = r;
        }
        o = next;
    }
    return ret;
}

static void *launch_thread(void *arg)
{
    launch_t *l = arg;
    if (g_set.launch_us > 0)
        sleep_us(g_set.launch_us);
    launch_run(l);
    for (int i = 0; i < l->ncomms; i++) {
        atomic_fetch_sub(&l->comms[i]->busy, 1);
        comm_unref(l->comms[i]);
    }
    free(l);
    return NULL;
}

static void ops_free(op_t *o)
{
    while (o) {
        op_t *n = o->next;
        free(o);
        o = n;
    }
}

static ncclResult_t group_end_internal(void)
{
    if (g_depth == 0) {
        WARN("ncclGroupEnd: not in a group call.");
        return ncclInvalidUsage;
    }
    if (--g_depth > 0)
        return ncclSuccess;
    op_t *ops = g_head;
    ncclResult_t err = g_group_err;
    int blocking = g_group_blocking;
    g_head = g_tail = NULL;
    g_group_err = ncclSuccess;
    g_group_blocking = -1;
    if (err != ncclSuccess) {
        /* A failed group is cancelled whole; non-blocking communicators keep
         * the error (NCCL's groupCleanup). */
        for (op_t *o = ops; o; o = o->next)
            if (!o->comm->blocking)
                comm_fail(o->comm, err);
        ops_free(ops);
        return err;
    }
    if (!ops)
        return ncclSuccess;

    launch_t *l = calloc(1, sizeof *l);
    if (!l) {
        ops_free(ops);
        return ncclSystemError;
    }
    l->ops = ops;
    for (op_t *o = ops; o; o = o->next) {
        int k = 0;
        while (k < l->ncomms && l->comms[k] != o->comm)
            k++;
        if (k == l->ncomms) {
            if (k == (int)(sizeof l->comms / sizeof l->comms[0])) {
                WARN("ncclGroupEnd: more than %d communicators in one group (mock limit)", k);
                ops_free(ops);
                free(l);
                return ncclInternalError;
            }
            l->comms[l->ncomms++] = o->comm;
        }
        pthread_mutex_lock(&o->comm->lock);
        o->seq = ++o->comm->issued;
        pthread_mutex_unlock(&o->comm->lock);
    }
    int null_stream = 0;
    for (op_t *o = ops; o; o = o->next)
        null_stream |= o->stream == NULL;
    /* The legacy stream belongs to the calling thread's context: a launch
     * thread could not name it, so such a group launches here. */
    if (blocking || null_stream) {
        ncclResult_t r = launch_run(l);
        free(l);
        return r;
    }
    for (int i = 0; i < l->ncomms; i++) {
        comm_ref(l->comms[i]);
        atomic_fetch_add(&l->comms[i]->busy, 1);
    }
    int e = spawn(launch_thread, l);
    if (e != 0) {
        WARN("ncclGroupEnd: pthread_create: %s", strerror(e));
        for (int i = 0; i < l->ncomms; i++) {
            atomic_fetch_sub(&l->comms[i]->busy, 1);
            comm_unref(l->comms[i]);
        }
        ncclResult_t r = launch_run(l);
        free(l);
        return r;
    }
    return ncclInProgress;
}

static int overlaps(uint64_t a, size_t la, uint64_t b, size_t lb)
{
    return la && lb && a < b + lb && b < a + la;
}

static ncclResult_t check_buf(ncclComm_t c, const char *fn, const char *what, const void *p,
                              size_t bytes)
{
    if (!bytes)
        return ncclSuccess;
    if (!p) {
        WARN("%s : %s argument is NULL", fn, what);
        return ncclInvalidArgument;
    }
    if (!hcmock_dev_to_host((uint64_t)(uintptr_t)p, bytes)) {
        WARN("rank %d: %s : %s %p (%zu bytes) is not inside one live device allocation", c->rank,
             fn, what, p, bytes);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* NCCL's ArgsCheck, plus the pointer checks of NCCL_CHECK_POINTERS=1 and a
 * refusal of overlaps other than NCCL's in-place positions. */
static ncclResult_t check_args(ncclComm_t c, const op_t *o)
{
    const char *fn = coll_name[o->coll];
    if (o->root < 0 || o->root >= c->nranks) {
        WARN("%s : invalid root %d (root should be in the 0..%d range)", fn, o->root,
             c->nranks);
        return ncclInvalidArgument;
    }
    if (o->dtype < 0 || o->dtype >= NC_NUM_TYPES) {
        WARN("%s : invalid type %d", fn, o->dtype);
        return ncclInvalidArgument;
    }
    if (o->redop < 0 || (o->redop >= NC_NUM_OPS && !o->pm)) {
        WARN("%s : reduction operation %d unknown to this communicator (user-defined "
             "operations are not emulated)",
             fn, o->redop);
        return ncclInvalidArgument;
    }
    int reduces = o->coll != COLL_BCAST && o->coll != COLL_ALLGATHER;
    if (reduces && (o->dtype == NC_FP8E4M3 || o->dtype == NC_FP8E5M2)) {
        WARN("%s : fp8 reductions are not emulated by the mock", fn);
        return ncclInvalidArgument;
    }
    if (o->count == 0)
        return ncclSuccess;
    size_t sb, rb;
    buf_bytes(c, o, &sb, &rb);
    ncclResult_t r;
    if ((r = check_buf(c, fn, "sendbuff", o->send, sb)) != ncclSuccess ||
        (r = check_buf(c, fn, "recvbuff", o->recv, rb)) != ncclSuccess)
        return r;
    const uint64_t s = (uint64_t)(uintptr_t)o->send, d = (uint64_t)(uintptr_t)o->recv;
    const size_t b = o->count * type_size(o->dtype);
    uint64_t inplace_recv = s; /* where recvbuff must be for in-place use */
    if (o->coll == COLL_REDUCESCATTER)
        inplace_recv = s + (uint64_t)c->rank * b;
    else if (o->coll == COLL_ALLGATHER)
        inplace_recv = s - (uint64_t)c->rank * b;
    if (d != inplace_recv && overlaps(s, sb, d, rb)) {
        WARN("rank %d: %s: recvbuff %p overlaps sendbuff %p without being at the in-place "
             "position %p: NCCL's result would be undefined",
             c->rank, fn, o->recv, o->send, (void *)(uintptr_t)inplace_recv);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* NCCL's ncclEnqueueCheck: an implicit group around one collective. */
static ncclResult_t coll_call(int coll, const void *send, void *recv, size_t count, int dtype,
                              int redop, int root, ncclComm_t c, void *stream)
{
    settings();
    ncclResult_t r = comm_check(c, coll_name[coll]);
    if (r != ncclSuccess)
        return group_err_check(r);
    g_depth++;
    op_t tmp = { NULL, c, coll, dtype, redop, root, send, recv, count, stream, 0, 0, { 0 }, NULL };
    if ((r = comm_ready(c, coll_name[coll])) != ncclSuccess)
        goto out;
    if (redop >= NC_NUM_OPS && redop < NC_NUM_OPS + PM_MAX) {
        pthread_mutex_lock(&c->lock);
        int k = redop - NC_NUM_OPS;
        if (c->pm[k].live && c->pm[k].dtype == dtype) {
            tmp.pm = 1;
            memcpy(tmp.pm_val, c->pm[k].val, sizeof tmp.pm_val);
            tmp.pm_dev = c->pm[k].dev;
        }
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_lock(&c->lock);
    int fin = c->finalized;
    pthread_mutex_unlock(&c->lock);
    if (fin) {
        WARN("rank %d: %s on a communicator after ncclCommFinalize", c->rank, coll_name[coll]);
        r = ncclInvalidUsage;
        goto out;
    }
    if ((r = check_args(c, &tmp)) != ncclSuccess || count == 0)
        goto out;
    if (g_group_blocking == -1) {
        g_group_blocking = c->blocking;
    } else if (g_group_blocking != c->blocking) {
        WARN("Blocking and nonblocking communicators are not allowed in the same group.");
        r = ncclInvalidArgument;
        goto out;
    }
    op_t *o = malloc(sizeof *o);
    if (!o) {
        r = ncclSystemError;
        goto out;
    }
    *o = tmp;
    if (g_tail)
        g_tail->next = o;
    else
        g_head = o;
    g_tail = o;
out:
    group_err_check(r);
    ncclResult_t e = group_end_internal();
    if (e != ncclSuccess && e != ncclInProgress)
        return e;
    if (!c->blocking)
        r = comm_state(c);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Finalize                                                                   */
/* ------------------------------------------------------------------------ */

/* This rank's operations done, then every rank here (NCCL's intra-node
 * barrier in commDestroySync). */
static ncclResult_t comm_quiesce(ncclComm_t c)
{
    const double deadline = now_ms() + g_set.timeout_ms;
    pthread_mutex_lock(&c->lock);
    while (c->done < c->issued && !atomic_load(&c->aborted)) {
        if (now_ms() > deadline) {
            uint64_t d = c->done, i = c->issued;
            pthread_mutex_unlock(&c->lock);
            WARN("rank %d: finalize: %llu of %llu enqueued operations still not run after %d ms "
                 "(a stream is held?)",
                 c->rank, (unsigned long long)(i - d), (unsigned long long)i, g_set.timeout_ms);
            return ncclRemoteError;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&c->cond, &c->lock, &ts);
    }
    pthread_mutex_unlock(&c->lock);
    atomic_store(&c->ranks[c->rank].fin, FIN_DONE);
    bell_ring(c->seg);
    ncclResult_t r = wait_ranks(c, pred_fin, FIN_DONE, 1,
                                "finalize (every rank's ncclCommFinalize/Destroy)");
    for (int j = 0; r == ncclSuccess && j < c->nranks; j++)
        if (atomic_load(&c->ranks[j].fin) == FIN_ABORTED) {
            WARN("rank %d: finalize: rank %d aborted its communicator", c->rank, j);
            r = ncclRemoteError;
        }
    return r;
}

static void *finalize_thread(void *arg)
{
    ncclComm_t c = arg;
    comm_fail(c, comm_quiesce(c));
    atomic_fetch_sub(&c->busy, 1);
    comm_unref(c);
    return NULL;
}

/* ncclCommDestroy without ncclCommFinalize synchronises the same way; its
 * errors are only logged. */
static void *destroy_thread(void *arg)
{
    ncclComm_t c = arg;
    comm_quiesce(c);
    comm_unref(c);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The API                                                                    */
/* ------------------------------------------------------------------------ */

NCCL_API const char *hcmock_nccl(void)
{
    return "hcoll-mock-nccl";
}

NCCL_API ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NC_VERSION_CODE;
    return ncclSuccess;
}

NCCL_API const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (hcmock: see its WARN lines)";
    case ncclSystemError: return "unhandled system error (hcmock: see its WARN lines)";
    case ncclInternalError: return "internal error (hcmock)";
    case ncclInvalidArgument: return "invalid argument (hcmock: see its WARN lines)";
    case ncclInvalidUsage: return "invalid usage (hcmock: see its WARN lines)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

NCCL_API const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return g_last;
}

NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId *out)
{
    static atomic_uint serial;
    if (!out) {
        WARN("GetUniqueId : out argument is NULL");
        return ncclInvalidArgument;
    }
    hcm_uid_t u;
    memset(&u, 0, sizeof u);
    memcpy(u.tag, ID_TAG, sizeof ID_TAG);
    u.pid = (int32_t)getpid();
    u.serial = atomic_fetch_add(&serial, 1);
    if (getrandom(u.rnd, sizeof u.rnd, 0) != (ssize_t)sizeof u.rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        u.rnd[0] = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
        u.rnd[1] = (uint64_t)u.pid << 32 | u.serial;
    }
    memset(out, 0, sizeof *out);
    memcpy(out, &u, sizeof u);
    return ncclSuccess;
}

static ncclResult_t init_common(ncclComm_t *newcomm, int nranks, ncclUniqueId id, int rank,
                                ncclConfig_t *config)
{
    settings();
    if (!newcomm) {
        WARN("CommInitRank : newcomm argument is NULL");
        return ncclInvalidArgument;
    }
    *newcomm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        WARN("Invalid rank requested : %d/%d", rank, nranks);
        return ncclInvalidArgument;
    }
    int blocking = 1;
    if (config) {
        ncclConfig_t in = { 0 };
        size_t size;
        memcpy(&size, config, sizeof size);
        memcpy(&in, config, size < sizeof in ? size : sizeof in);
        if (in.magic != NC_CONFIG_MAGIC) {
            WARN("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
            return ncclInvalidArgument;
        }
        if (in.version >= NC_V(2, 14, 0) && size >= offsetof(ncclConfig_t, blocking) + sizeof(int)) {
            if (in.blocking != NC_UNDEF_INT && in.blocking != 0 && in.blocking != 1) {
                WARN("Invalid config blocking attribute value %d", in.blocking);
                return ncclInvalidArgument;
            }
            if (in.blocking != NC_UNDEF_INT)
                blocking = in.blocking;
        }
    }
    if (g_set.blocking_env != NC_UNDEF_INT)
        blocking = g_set.blocking_env;
    if (g_depth > 0) {
        WARN("ncclCommInitRank inside ncclGroupStart/End is not emulated by the mock");
        return group_err_check(ncclInvalidUsage);
    }
    hcm_uid_t u;
    memcpy(&u, &id, sizeof u);
    if (memcmp(u.tag, ID_TAG, sizeof ID_TAG) != 0) {
        WARN("rank %d: the unique id was not made by ncclGetUniqueId (bootstrap: cannot reach "
             "its root)",
             rank);
        return ncclSystemError;
    }

    ncclComm_t c = calloc(1, sizeof *c);
    if (!c)
        return ncclSystemError;
    c->rank = rank;
    c->nranks = nranks;
    int dev = hcmock_current_device();
    c->dev = dev < 0 ? 0 : dev;
    c->blocking = blocking;
    c->id = u;
    host_key(c->host, sizeof c->host);
    snprintf(c->name, sizeof c->name, "/hcmock-nccl-%016llx%016llx",
             (unsigned long long)u.rnd[0], (unsigned long long)(u.rnd[1] ^ u.serial));
    atomic_init(&c->refs, 1);
    atomic_init(&c->err, ncclSuccess);
    atomic_init(&c->busy, 0);
    atomic_init(&c->aborted, 0);
    atomic_init(&c->init_ok, 0);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    atomic_init(&c->magic, COMM_LIVE);
    pthread_mutex_lock(&g_reg_lock);
    c->next = g_reg;
    g_reg = c;
    pthread_mutex_unlock(&g_reg_lock);

    if (blocking) {
        ncclResult_t r = comm_setup(c);
        if (r != ncclSuccess) {
            atomic_store(&c->magic, COMM_DEAD);
            comm_unref(c);
            return r;
        }
        *newcomm = c;
        return ncclSuccess;
    }
    atomic_store(&c->busy, 1);
    comm_ref(c);
    *newcomm = c;
    int e = spawn(init_thread, c);
    if (e != 0) {
        WARN("ncclCommInitRankConfig: pthread_create: %s", strerror(e));
        atomic_store(&c->busy, 0);
        comm_unref(c);
        comm_fail(c, ncclSystemError);
        return ncclSystemError;
    }
    return comm_state(c);
}

NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                             int rank, ncclConfig_t *config)
{
    return init_common(comm, nranks, id, rank, config);
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return init_common(comm, nranks, id, rank, NULL);
}

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
    ncclResult_t r = comm_check(comm, "ncclCommGetAsyncError");
    if (r != ncclSuccess)
        return r;
    if (!async) {
        WARN("ncclCommGetAsyncError : asyncError argument is NULL");
        return ncclInvalidArgument;
    }
    *async = comm_state(comm);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    settings();
    if (!comm)
        return ncclSuccess;
    ncclResult_t r = comm_check(comm, "ncclCommFinalize");
    if (r != ncclSuccess || (r = comm_ready(comm, "ncclCommFinalize")) != ncclSuccess)
        return r;
    pthread_mutex_lock(&comm->lock);
    int again = comm->finalized;
    comm->finalized = 1;
    pthread_mutex_unlock(&comm->lock);
    if (again) {
        WARN("rank %d: ncclCommFinalize called twice", comm->rank);
        return ncclInvalidArgument;
    }
    if (comm->blocking) {
        r = comm_quiesce(comm);
        comm_fail(comm, r);
        return r;
    }
    atomic_fetch_add(&comm->busy, 1);
    comm_ref(comm);
    int e = spawn(finalize_thread, comm);
    if (e != 0) {
        atomic_fetch_sub(&comm->busy, 1);
        comm_unref(comm);
        r = comm_quiesce(comm);
        comm_fail(comm, r);
        return r;
    }
    return comm_state(comm);
}

NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    settings();
    if (!comm)
        return ncclSuccess;
    ncclResult_t r = comm_check(comm, "ncclCommDestroy");
    if (r != ncclSuccess || (r = comm_ready(comm, "ncclCommDestroy")) != ncclSuccess)
        return r;
    atomic_store(&comm->magic, COMM_DEAD);
    pthread_mutex_lock(&comm->lock);
    int fin = comm->finalized;
    pthread_mutex_unlock(&comm->lock);
    if (!fin && atomic_load(&comm->init_ok)) {
        if (comm->blocking || spawn(destroy_thread, comm) != 0)
            comm_quiesce(comm);
        else
            return ncclSuccess; /* the thread drops the handle's reference */
    }
    comm_unref(comm);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    settings();
    if (!comm)
        return ncclSuccess;
    ncclResult_t r = comm_check(comm, "ncclCommAbort");
    if (r != ncclSuccess)
        return r;
    atomic_store(&comm->magic, COMM_DEAD);
    atomic_store(&comm->aborted, 1);
    /* NCCL's abort closes the bootstrap sockets: a peer in finalize's
     * barrier fails instead of waiting. */
    if (atomic_load(&comm->init_ok))
        atomic_store(&comm->ranks[comm->rank].fin, FIN_ABORTED);
    comm_wake(comm);
    comm_unref(comm);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    ncclResult_t r = comm_check(comm, "ncclCommCount");
    if (r != ncclSuccess || (r = comm_ready(comm, "ncclCommCount")) != ncclSuccess)
        return r;
    if (!count)
        return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    ncclResult_t r = comm_check(comm, "ncclCommCuDevice");
    if (r != ncclSuccess || (r = comm_ready(comm, "ncclCommCuDevice")) != ncclSuccess)
        return r;
    if (!device)
        return ncclInvalidArgument;
    *device = comm->dev;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    ncclResult_t r = comm_check(comm, "ncclCommUserRank");
    if (r != ncclSuccess || (r = comm_ready(comm, "ncclCommUserRank")) != ncclSuccess)
        return r;
    if (!rank)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclGroupStart(void)
{
    g_depth++;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclGroupEnd(void)
{
    settings();
    return group_end_internal();
}

/* ncclRedOpCreatePreMulSum: residence 0 (ncclScalarDevice) keeps the
 * address, read when the operation runs; 1 (ncclScalarHostImmediate)
 * copies the value now. */
NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(int *op, void *scalar, int datatype,
                                               int residence, ncclComm_t comm)
{
    ncclResult_t r = comm_check(comm, "ncclRedOpCreatePreMulSum");
    if (r != ncclSuccess)
        return r;
    if (!op || !scalar || datatype < 0 || datatype >= NC_NUM_TYPES ||
        (residence != 0 && residence != 1)) {
        WARN("ncclRedOpCreatePreMulSum: invalid argument (op %p, scalar %p, type %d, "
             "residence %d)", (void *)op, scalar, datatype, residence);
        return ncclInvalidArgument;
    }
    const size_t es = type_size(datatype);
    if (residence == 0 && !hcmock_dev_to_host((uint64_t)(uintptr_t)scalar, es)) {
        WARN("ncclRedOpCreatePreMulSum: ncclScalarDevice %p is not device memory", scalar);
        return ncclInvalidArgument;
    }
    pthread_mutex_lock(&comm->lock);
    int k = 0;
    while (k < PM_MAX && comm->pm[k].live)
        k++;
    if (k < PM_MAX) {
        comm->pm[k].live = 1;
        comm->pm[k].dtype = datatype;
        comm->pm[k].residence = residence;
        comm->pm[k].dev = residence == 0 ? scalar : NULL;
        memset(comm->pm[k].val, 0, sizeof comm->pm[k].val);
        if (residence == 1)
            memcpy(comm->pm[k].val, scalar, es);
    }
    pthread_mutex_unlock(&comm->lock);
    if (k == PM_MAX) {
        WARN("ncclRedOpCreatePreMulSum: more than %d live ops", PM_MAX);
        return ncclInternalError;
    }
    *op = NC_NUM_OPS + k;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclRedOpDestroy(int op, ncclComm_t comm)
{
    ncclResult_t r = comm_check(comm, "ncclRedOpDestroy");
    if (r != ncclSuccess)
        return r;
    int k = op - NC_NUM_OPS;
    pthread_mutex_lock(&comm->lock);
    int ok = k >= 0 && k < PM_MAX && comm->pm[k].live;
    if (ok)
        comm->pm[k].live = 0;
    pthread_mutex_unlock(&comm->lock);
    if (!ok) {
        WARN("ncclRedOpDestroy: op %d is not a live user-defined op of this communicator", op);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    int datatype, int op, ncclComm_t comm, void *stream)
{
    return coll_call(COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

NCCL_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                        int datatype, int op, ncclComm_t comm, void *stream)
{
    return coll_call(COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm,
                     stream);
}

NCCL_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                    int datatype, ncclComm_t comm, void *stream)
{
    return coll_call(COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, NC_SUM, 0, comm,
                     stream);
}

NCCL_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype,
                                 int op, int root, ncclComm_t comm, void *stream)
{
    return coll_call(COLL_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

NCCL_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                    int datatype, int root, ncclComm_t comm, void *stream)
{
    return coll_call(COLL_BCAST, sendbuff, recvbuff, count, datatype, NC_SUM, root, comm,
                     stream);
}
