/*
 * An emulated libibverbs.so.1 (RC only) for hosts without an RDMA NIC, so
 * that hcoll's verbs transport runs whole in CI. Never installed; loaded
 * through LD_LIBRARY_PATH=build/mock by the tests.
 *
 *   process A ("node" A)                          process B ("node" B)
 *   ┌──────────────────────────────┐              ┌──────────────────────────────┐
 *   │ app: ibv_post_send ─► SQ     │              │ RQ ◄─ ibv_post_recv          │
 *   │      ibv_poll_cq  ◄─ CQ      │              │ CQ ─► ibv_poll_cq            │
 *   │ progress thread (1/context)  │  requests    │ progress thread (1/context)  │
 *   │  QP a: out conn ─────────────┼─────────────►│─ listener @hcmock-verbs-qp-b │
 *   │   streams WRITE payload      │  HELLO, WRITE│  checks HELLO (QPN, PSN, GID │
 *   │   straight from the MR       │  (+imm), READ│  or LID, MTU), rkey + range  │
 *   │                              │ ◄────────────┼─ of a live REMOTE_* MR, lands │
 *   │   ACK ─► send CQE            │  ACK / NAK / │  the payload, consumes a recv│
 *   │   NAK ─► error CQE, QP → ERR │  RNR / READ  │  WR (imm) ─► recv CQE, ACK   │
 *   │   no ACK in the retry window │  response    │                              │
 *   │     ─► RETRY_EXC_ERR, QP→ERR │              │                              │
 *   │  listener @hcmock-verbs-qp-a ◄──── the same, B's requests to A ──────────── │
 *   └──────────────────────────────┘              └──────────────────────────────┘
 *
 * The wire is one Unix stream socket per direction of a QP pair, in the
 * abstract namespace under the QP's number. A QPN is drawn at random and
 * owned by binding that name, so QPNs are unique across the processes of a
 * host (24 bits, as on a NIC). Devices, ports, link layers, LIDs and GID
 * tables come from the same sysfs tree that hcoll reads (HCMOCK_IB_SYSFS,
 * else HCOLL_SYSFS_ROOT, else /), so both views always agree. The context
 * is an extended one (verbs_context), as the inline ibv_query_port expects;
 * ibv_post_send/post_recv/poll_cq reach us through context->ops.
 *
 * The point is fidelity: where a NIC would fail, so does this.
 *   - Registration pins: an unmapped range is EFAULT, and so is a read-only
 *     one asked for write access; REMOTE_WRITE without LOCAL_WRITE is
 *     EINVAL. Device addresses of the mock CUDA driver (tests/mock/cuda.c,
 *     found with dlopen RTLD_NOLOAD) are registered as nvidia-peermem would
 *     (only when the sysfs tree shows it loaded; EFAULT otherwise), and the
 *     MR dies with the allocation (a freed buffer is not reachable through
 *     it, even if its addresses are reused). Host MRs count against
 *     HCMOCK_IB_MEMLOCK_KB (ENOMEM past it, as RLIMIT_MEMLOCK).
 *   - dma-buf: ibv_reg_dmabuf_mr imports the emulated driver's export (a
 *     memfd naming a page-aligned device range) and honours the offset into
 *     it; a NIC without import answers EOPNOTSUPP first (the probe with fd
 *     -1 that NCCL uses; EBADF where import exists).
 *   - HCMOCK_IB_GDR_LAZY=1: the NIC's writes into device memory stay
 *     invisible until a read through the same NIC of the allocation they
 *     landed in (the GPUDirect flush, as NCCL reads the buffer it just
 *     received), as on a platform that does not order them; a read of
 *     some other device buffer leaves them held.
 *   - Async events on context->async_fd (blocking unless the caller sets
 *     O_NONBLOCK): a CQ overrun is IBV_EVENT_CQ_ERR (polling goes on,
 *     completions are lost), and hcmock_verbs_inject_async raises a port
 *     down, a fatal QP or an access error with its effect.
 *   - fork: a fork with live MRs before ibv_fork_init (or RDMAV_FORK_SAFE)
 *     is counted as unsafe, unless HCMOCK_IB_COPY_ON_FORK=1 (a kernel that
 *     copies pinned pages, where ibv_is_fork_initialized says UNNEEDED).
 *   - Queues: posting past max_send_wr/max_recv_wr outstanding is ENOMEM; a
 *     slot is free once a completion at or after it has been polled (so
 *     unsignaled WRs hold theirs); a CQ holds exactly cqe entries, one more
 *     is an overrun (an async event; the CQ loses everything after it).
 *   - modify_qp follows the RC state table and its attribute masks (EINVAL);
 *     RoCE needs a GRH and a valid source GID, and a destination GID of the
 *     other IP family has no route (EHOSTUNREACH).
 *   - The responder drops what a NIC would (wrong QPN, PSN, GID or LID, an
 *     MTU too large, a QP not yet RTR): never acknowledged, so the
 *     requester's retries run out, IBV_WC_RETRY_EXC_ERR after the QP's
 *     timeout x (retry_cnt + 1) -- the same for a dead peer or a destroyed
 *     QP. An rkey or range violation is IBV_WC_REM_ACCESS_ERR and puts the
 *     responder's QP in error too; a WRITE_WITH_IMM without a posted
 *     receive is RNR, retried (rnr_retry 7: forever) until
 *     IBV_WC_RNR_RETRY_EXC_ERR. Once in error, every outstanding WR of both
 *     queues flushes, signaled or not.
 *   - Error completions carry garbage (0xa5) where verbs leaves them
 *     undefined: opcode, byte_len, imm_data, flags.
 * Counters of each event, and of objects alive: hcmock_verbs_stat(name).
 *
 *   - Completion channels: ibv_req_notify_cq arms a CQ for its next
 *     completion only (CQEs already there raise nothing: a waiter must poll
 *     once more after arming), which queues one event on the channel's fd
 *     (blocking unless the caller sets O_NONBLOCK); destroying a CQ with
 *     events not acknowledged is EBUSY (a real one blocks), and a channel
 *     with CQs on it too.
 *
 * Simplified: RC only, no SEND/atomics/SRQ/UD;
 * one "packet" per request (PSNs still advance per MTU); a READ returns a
 * snapshot taken when the request is served; RNR is decided by the
 * responder; the retry window is capped (HCMOCK_IB_RETRY_MS) and floored
 * (100 ms: an emulated round trip is milliseconds); a forked child cannot
 * use the parent's contexts. Knobs:
 *   HCMOCK_IB_SYSFS        tree to read instead of HCOLL_SYSFS_ROOT
 *   HCMOCK_IB_RETRY_MS     cap of the retry window (default 2000)
 *   HCMOCK_IB_MTU          active MTU in bytes of every port (default 4096)
 *   HCMOCK_IB_TX_DELAY_US  hold every WR that long before sending it, so
 *                          that a source reused before its completion shows
 *   HCMOCK_IB_TRACE        1: print every drop, NAK and timeout on stderr
 *   HCMOCK_IB_DMABUF       0: no dma-buf import (EOPNOTSUPP); default 1
 *   HCMOCK_IB_MEMLOCK_KB   locked-memory limit for host MRs (default none)
 *   HCMOCK_IB_REG_FAIL     an errno (12 ENOMEM, 95 EOPNOTSUPP...): every
 *                          registration, host or device, fails with it
 *                          while set (the dma-buf probe with fd -1 excepted)
 *   HCMOCK_IB_GDR_LAZY     1: device writes visible only after a flush read
 *   HCMOCK_IB_LOOPBACK_FAIL an errno: a QP connected to itself (a loopback,
 *                          as GPUDirect flush reads use) is refused at RTR
 *   HCMOCK_IB_COPY_ON_FORK 1: the kernel copies pinned pages at fork
 *   HCMOCK_IB_RO           0: a provider that refuses IBV_ACCESS_RELAXED_ORDERING
 *                          (EINVAL from ibv_reg_mr_iova2/ibv_reg_dmabuf_mr)
 *   HCMOCK_IB_IOVA2        0: ibv_reg_mr_iova2 answers EOPNOTSUPP (a library
 *                          without the call, as far as a caller can tell)
 * Timing, so that a host's costs show in tests (a NIC's are microseconds):
 *   HCMOCK_IB_LAT_US       one-way latency: every WR reaches the wire that
 *                          long after it was posted (a round trip is twice
 *                          it plus the emulation's own transit)
 *   HCMOCK_IB_REG_US       fixed cost of each ibv_reg_mr/ibv_reg_dmabuf_mr
 *   HCMOCK_IB_REG_PAGE_NS  cost per 4 KiB page registered (pinning)
 * and hcmock_verbs_pickup_us(q, reset): a quantile of how long completions
 * sat in their CQ before a poll took them (a poller's own latency).
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "hcmock.h"

/* verbs.h turns these into inline wrappers; the library exports the real
 * entry points under the plain names, and so do we. */
#undef ibv_query_port
#undef ibv_reg_mr

#define MAX_WR      16384
#define MAX_SGE     30
#define MAX_INLINE  512
#define MAX_CQE     4194303
#define MAX_RD_ATOM 16
#define MAX_MSG     0x80000000u
#define IO_CHUNK    (1u << 20)

/* ------------------------------------------------------------------------ */
/* Settings, counters, tracing                                               */
/* ------------------------------------------------------------------------ */

enum stat_id {
    ST_WRITES, ST_READS, ST_BYTES, ST_RNR_NAKS, ST_RNR_EXC, ST_RETRY_EXC, ST_REM_ACCESS,
    ST_REM_INV, ST_LOC_PROT, ST_CQ_OVERRUN, ST_DROPPED, ST_MUTED, ST_FLUSHED, ST_QPS,
    ST_MR_REGS, /* memory regions ever registered (a registration's cost) */
    ST_MEMLOCK_FAILS, ST_DEV_NO_PEERMEM, ST_DMABUF_REGS, ST_GDR_HELD, ST_ASYNC_EVENTS,
    ST_UNSAFE_FORKS,
    ST_POST_SENDS, /* ibv_post_send calls (doorbells), whatever the chain's length */
    ST_CQ_EVENTS,  /* completion events delivered to a channel */
    ST_MISALIGNED, /* writes of more than 64 bytes whose source or target is not on a
                    * 64-byte boundary (the NIC splits them at cache lines) */
    ST_RO_REGS, /* registered with IBV_ACCESS_RELAXED_ORDERING */
    ST_REG_INJECTED, /* registrations failed by HCMOCK_IB_REG_FAIL */
    /* objects alive now (a leak shows as non-zero after teardown) */
    ST_LIVE_CTX, ST_LIVE_PD, ST_LIVE_MR, ST_LIVE_CQ, ST_LIVE_QP, ST_COUNT
};
static const char *const stat_names[ST_COUNT] = {
    "writes", "reads", "bytes", "rnr_naks", "rnr_exceeded", "retry_exceeded", "rem_access_errors",
    "rem_inv_req", "loc_prot_errors", "cq_overruns", "dropped_conns", "muted_conns", "flushed",
    "qps_created", "mr_registrations", "memlock_failures", "device_reg_without_peermem",
    "dmabuf_registrations", "gdr_writes_held", "async_events", "unsafe_forks",
    "post_send_calls", "cq_events", "misaligned_writes", "relaxed_ordering_registrations",
    "injected_reg_failures",
    "live_contexts",
    "live_pds", "live_mrs", "live_cqs", "live_qps",
};
/* Per process, like a NIC's port counters; read by tests. */
static _Atomic uint64_t g_stats[ST_COUNT];

static void stat_add(enum stat_id s, uint64_t n)
{
    atomic_fetch_add_explicit(&g_stats[s], n, memory_order_relaxed);
}

static void stat_sub(enum stat_id s)
{
    atomic_fetch_sub_explicit(&g_stats[s], 1, memory_order_relaxed);
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* A registration pins its pages: the caller waits, as ibv_reg_mr blocks
 * in the kernel (HCMOCK_IB_REG_US + pages x HCMOCK_IB_REG_PAGE_NS). */
static void reg_cost(size_t len)
{
    const double ns = env_int("HCMOCK_IB_REG_US", 0) * 1e3 +
                      (double)((len + 4095) / 4096) * env_int("HCMOCK_IB_REG_PAGE_NS", 0);
    if (ns <= 0)
        return;
    struct timespec ts = { (time_t)(ns / 1e9), (long)(ns - (double)(time_t)(ns / 1e9) * 1e9) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* HCMOCK_IB_REG_FAIL: a registration refused as the kernel may refuse
 * one (a test sets it around one call). 1 with errno set when it is. */
static int reg_injected(void)
{
    const int e = env_int("HCMOCK_IB_REG_FAIL", 0);
    if (e <= 0)
        return 0;
    stat_add(ST_REG_INJECTED, 1);
    errno = e;
    return 1;
}

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...)
{
    if (env_int("HCMOCK_IB_TRACE", 0) <= 0)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "hcmock-verbs[%d]: %s\n", (int)getpid(), line);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char *sysfs_root(void)
{
    const char *r = getenv("HCMOCK_IB_SYSFS");
    if (!r || !*r)
        r = getenv("HCOLL_SYSFS_ROOT");
    return r && *r ? r : "/";
}

/* ------------------------------------------------------------------------ */
/* sysfs                                                                     */
/* ------------------------------------------------------------------------ */

static int sys_read(const char *root, const char *dev, int port, const char *what, char *buf,
                    size_t len)
{
    char path[PATH_MAX];
    if (port > 0)
        snprintf(path, sizeof path, "%s/sys/class/infiniband/%s/ports/%d/%s", root, dev, port,
                 what);
    else
        snprintf(path, sizeof path, "%s/sys/class/infiniband/%s/%s", root, dev, what);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    return 0;
}

typedef struct port_info {
    int state;        /* enum ibv_port_state: the number before ':' in sysfs */
    int link_layer;   /* IBV_LINK_LAYER_* */
    uint16_t lid;
    int active_mtu;   /* enum ibv_mtu */
    int gid_tbl_len;  /* highest index + 1 */
} port_info_t;

static int mtu_enum(int bytes)
{
    switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    default: return IBV_MTU_4096;
    }
}

static uint32_t mtu_bytes(int e)
{
    return e >= 1 && e <= 5 ? 128u << e : 4096u;
}

/* A LID for an IB port that has no lid file: stable and non-zero. */
static uint16_t fake_lid(const char *dev, int port)
{
    uint32_t h = 2166136261u;
    for (const char *p = dev; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return (uint16_t)(((h + (uint32_t)port) % 0xbffe) + 1);
}

static int port_load(const char *root, const char *dev, int port, port_info_t *pi)
{
    char buf[128];
    memset(pi, 0, sizeof *pi);
    if (sys_read(root, dev, port, "state", buf, sizeof buf) != 0)
        return -1;
    pi->state = atoi(buf); /* "4: ACTIVE" */
    pi->link_layer = IBV_LINK_LAYER_INFINIBAND;
    if (sys_read(root, dev, port, "link_layer", buf, sizeof buf) == 0 &&
        strcmp(buf, "Ethernet") == 0)
        pi->link_layer = IBV_LINK_LAYER_ETHERNET;
    if (pi->link_layer == IBV_LINK_LAYER_INFINIBAND) {
        if (sys_read(root, dev, port, "lid", buf, sizeof buf) == 0)
            pi->lid = (uint16_t)strtoul(buf, NULL, 0);
        if (!pi->lid)
            pi->lid = fake_lid(dev, port);
    }
    pi->active_mtu = mtu_enum(env_int("HCMOCK_IB_MTU", 4096));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/sys/class/infiniband/%s/ports/%d/gids", root, dev, port);
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            long i = strtol(e->d_name, &end, 10);
            if (*end == '\0' && end != e->d_name && i >= 0 && i < 1024 && i + 1 > pi->gid_tbl_len)
                pi->gid_tbl_len = (int)i + 1;
        }
        closedir(d);
    }
    return 0;
}

static int gid_parse(const char *s, uint8_t raw[16])
{
    unsigned g[8];
    char tail;
    if (sscanf(s, "%4x:%4x:%4x:%4x:%4x:%4x:%4x:%4x%c", &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
               &g[6], &g[7], &tail) != 8)
        return -1;
    for (int i = 0; i < 8; i++) {
        raw[2 * i] = (uint8_t)(g[i] >> 8);
        raw[2 * i + 1] = (uint8_t)g[i];
    }
    return 0;
}

enum { GT_NONE = 0, GT_IB = 1, GT_V1 = 2, GT_V2 = 3 };

/* GID and its type at an index. Returns 0 or -1 (no such entry). */
static int gid_load(const char *root, const char *dev, int port, int idx, uint8_t raw[16],
                    int *type_out)
{
    char what[64], buf[128];
    snprintf(what, sizeof what, "gids/%d", idx);
    if (sys_read(root, dev, port, what, buf, sizeof buf) != 0 || gid_parse(buf, raw) != 0)
        return -1;
    int t = GT_NONE;
    snprintf(what, sizeof what, "gid_attrs/types/%d", idx);
    if (sys_read(root, dev, port, what, buf, sizeof buf) == 0) {
        if (strcmp(buf, "RoCE v2") == 0)
            t = GT_V2;
        else if (strstr(buf, "RoCE v1"))
            t = GT_V1;
        else if (strcmp(buf, "IB") == 0)
            t = GT_IB;
    }
    if (type_out)
        *type_out = t;
    return 0;
}

static int gid_is_zero(const uint8_t g[16])
{
    for (int i = 0; i < 16; i++)
        if (g[i])
            return 0;
    return 1;
}

static int gid_is_v4mapped(const uint8_t g[16])
{
    static const uint8_t pre[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    return memcmp(g, pre, 12) == 0;
}

static void gid_str(const uint8_t g[16], char *out, size_t len)
{
    snprintf(out, len, "%02x%02x:%02x%02x:...:%02x%02x:%02x%02x", g[0], g[1], g[2], g[3], g[12],
             g[13], g[14], g[15]);
}

/* ------------------------------------------------------------------------ */
/* Objects                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct mdev {
    struct ibv_device dev; /* what callers hold */
    char root[1024];
    struct mdev *next;
} mdev_t;

/* Device objects live as long as the process: contexts point at them and
 * the list that named them may be freed first. */
static pthread_mutex_t g_devs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mctx *g_ctxs; /* open contexts, oldest first (g_devs_mu) */
static mdev_t *g_devs;

typedef struct mctx mctx_t;
typedef struct mqp mqp_t;

typedef struct mpd {
    struct ibv_pd pd;
    int users; /* MRs and QPs */
} mpd_t;

typedef int (*ptrattr_fn)(void *, int, unsigned long long); /* cuPointerGetAttribute */

typedef struct mmr {
    struct ibv_mr mr;
    int access;
    int device;       /* a device address of the mock CUDA driver */
    void *(*d2h)(uint64_t, size_t); /* its translation */
    ptrattr_fn attr;
    unsigned long long buf_id; /* the allocation registered (device) */
    int64_t dev_delta; /* dma-buf: device address = MR address + this */
    int host_pinned;   /* host bytes counted against HCMOCK_IB_MEMLOCK */
    struct mmr *next_l, *next_r;
} mmr_t;

typedef struct cqe {
    struct ibv_wc wc;
    int is_send;
    uint64_t seq;     /* WQE index in its queue: polling it frees slots */
    double t_ready;   /* when it was pushed (pickup delays) */
} cqe_t;

typedef struct mcq {
    struct ibv_cq cq;
    int cap;
    cqe_t *ring;
    int head, count;
    int overrun;
    int users;        /* QPs */
    int armed;        /* ibv_req_notify_cq: the next CQE raises an event */
    unsigned events, acked; /* completion events delivered, acknowledged */
} mcq_t;

/* A completion channel: events (the CQs they name) in order; the fd is an
 * eventfd in semaphore mode, one count per queued event. */
typedef struct mchan {
    struct ibv_comp_channel ch;
    pthread_mutex_t mu;
    mcq_t **q;
    int n, cap;
} mchan_t;

typedef struct swqe {
    uint64_t wr_id;
    int opcode;       /* enum ibv_wr_opcode */
    int signaled;
    int nsge;
    struct ibv_sge sge[MAX_SGE];
    uint8_t *inl;     /* inline copy, or NULL */
    uint32_t len;
    uint64_t raddr;
    uint32_t rkey;
    uint32_t imm;
    uint32_t psn;
    int local_err;    /* set when the source vanished mid-transfer */
    double not_before; /* HCMOCK_IB_TX_DELAY_US: when the NIC gets to it */
} swqe_t;

/* A framed message on a QP's socket; requests flow requester → responder,
 * responses the other way on the same connection. */
enum ftype { F_HELLO = 1, F_WRITE, F_WRITE_IMM, F_READ_REQ, F_ACK, F_NAK, F_READ_RESP, F_RNR };
#define F_MAGIC 0x4d56u

typedef struct frame {
    uint16_t magic;
    uint8_t type;
    uint8_t syndrome; /* NAK: the ibv_wc_status the requester reports */
    uint32_t psn;
    uint32_t len;     /* payload that follows (requested length for READ_REQ) */
    uint32_t rkey;
    uint64_t raddr;
    uint32_t imm;     /* as posted: already network order */
    uint32_t pad;
} frame_t;

/* First frame of a requester: what a responding NIC would check on every
 * packet (destination QP, PSN, addressing, MTU). */
typedef struct hello {
    uint32_t src_qpn, dst_qpn, sq_psn;
    uint16_t slid, dlid;
    uint8_t sgid[16], dgid[16];
    uint8_t link_layer, path_mtu, rnr_retry, is_global;
    uint8_t sgid_type, pad[3];
    int32_t pid;
} hello_t;

enum { IN_HDR = 0, IN_PAY, IN_RNR };
enum { PAY_DISCARD = 0, PAY_MR, PAY_SMALL, PAY_SGE, PAY_LAZY };
#define SMALL_PAYLOAD 64

typedef struct conn {
    int fd;
    int out;          /* 1: my requests go out here; 0: a peer's requests come in */
    mqp_t *qp;
    /* input */
    int istate;
    frame_t ih;
    size_t ih_got;
    uint64_t ileft, idone;
    int pay_mode;
    mmr_t *pay_mr;    /* PAY_MR: target region (re-checked per chunk) */
    uint32_t pay_key;
    uint64_t pay_addr;
    int pay_err;      /* enum ibv_wc_status to answer once drained, 0 none */
    uint8_t small[SMALL_PAYLOAD];
    struct lazy_write *lazy_w; /* PAY_LAZY: the held write being received */
    uint8_t hello_buf[sizeof(hello_t)];
    /* responder */
    int bound;        /* a valid HELLO came */
    int blackhole;    /* drop everything: the NIC would */
    int mute;         /* execute but never answer: responses are misrouted */
    int mtu_bad;
    int rnr_retry;
    double rnr_since, rnr_last;
    /* output */
    uint8_t *ob;
    size_t ob_len, ob_off, ob_cap;
    int tx_active;    /* requester: streaming the payload of WQE tx_seq */
    uint64_t tx_seq;
    uint64_t tx_off;
    struct conn *next;
} conn_t;

struct mqp {
    struct ibv_qp qp;
    mctx_t *ctx;
    int listen_fd;
    struct ibv_qp_cap cap;
    int sq_sig_all;
    /* attributes */
    int port;
    int access;
    uint32_t dest_qpn, rq_psn, sq_psn, epsn, next_psn;
    int path_mtu, min_rnr_timer, timeout, retry_cnt, rnr_retry;
    struct ibv_ah_attr ah;
    /* send queue: free <= ack <= tx <= post */
    swqe_t *sq;
    uint64_t sq_post, sq_tx, sq_ack, sq_free;
    /* receive queue: free <= cons <= post */
    uint64_t *rq;
    uint64_t rq_post, rq_cons, rq_free;
    conn_t *outc;     /* my requests */
    int out_broken;   /* the connection was up and died: never redialled */
    double next_dial;
    double last_progress;
    conn_t *inc;      /* peers' requests (a list) */
    mqp_t *next;
};

struct mctx {
    struct verbs_context vc; /* must hold ibv_context; rest is ours */
    mdev_t *dev;
    char root[1024];
    int nports;
    pthread_mutex_t mu;
    pthread_t thr;
    int thr_started;
    int wake_fd;
    int stop;
    unsigned gen;     /* bumped on any change of the set of fds */
    mqp_t *qps;
    mmr_t *by_l[256], *by_r[256];
    uint64_t rnd;
    /* async events (faults.h section below) */
    int async_fd;     /* eventfd (semaphore): one count per queued event */
    struct ibv_async_event *aq;
    int naq, aqcap, unacked;
    int port_down;
    struct lazy_write *lazy; /* HCMOCK_IB_GDR_LAZY: device writes not yet visible */
    struct mctx *next_ctx;
};

static mctx_t *ctx_of(struct ibv_context *c)
{
    return (mctx_t *)((char *)c - offsetof(mctx_t, vc.context));
}

static void wake(mctx_t *c)
{
    uint64_t one = 1;
    if (write(c->wake_fd, &one, sizeof one) < 0) {
        /* the counter is saturated: the thread is awake anyway */
    }
}

static uint64_t rnd_next(mctx_t *c)
{
    uint64_t x = c->rnd;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return c->rnd = x;
}

/* ------------------------------------------------------------------------ */
/* Completion queues                                                         */
/* ------------------------------------------------------------------------ */

static mqp_t *qp_by_num(mctx_t *c, uint32_t qpn)
{
    for (mqp_t *q = c->qps; q; q = q->next)
        if (q->qp.qp_num == qpn)
            return q;
    return NULL;
}

static void async_push(mctx_t *c, enum ibv_event_type type, void *obj, int port);

/* Pickup delays: how long each completion sat in its CQ before a poll took
 * it (the last PICKUP_MAX, per process). A NIC's completion is seen at the
 * next sweep of a spinning poller; a poller that sleeps leaves it there. */
#define PICKUP_MAX 8192
static pthread_mutex_t g_pickup_mu = PTHREAD_MUTEX_INITIALIZER;
static float g_pickup_us[PICKUP_MAX];
static uint64_t g_pickups;

static void pickup_note(double ms)
{
    pthread_mutex_lock(&g_pickup_mu);
    g_pickup_us[g_pickups++ % PICKUP_MAX] = (float)(ms * 1e3);
    pthread_mutex_unlock(&g_pickup_mu);
}

/* An armed CQ got a completion: one event on its channel (the caller holds
 * the context's mutex). */
static void chan_push(mcq_t *cq)
{
    mchan_t *ch = (mchan_t *)cq->cq.channel;
    cq->armed = 0;
    pthread_mutex_lock(&ch->mu);
    if (ch->n == ch->cap) {
        int ncap = ch->cap ? ch->cap * 2 : 16;
        mcq_t **nq = realloc(ch->q, (size_t)ncap * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&ch->mu);
            return; /* lost, as a CQ overrun loses completions */
        }
        ch->q = nq;
        ch->cap = ncap;
    }
    ch->q[ch->n++] = cq;
    cq->events++;
    pthread_mutex_unlock(&ch->mu);
    uint64_t one = 1;
    if (write(ch->ch.fd, &one, sizeof one) < 0) {
        /* saturated: get_cq_event still finds the queue */
    }
    stat_add(ST_CQ_EVENTS, 1);
}

static void cq_push(mcq_t *cq, const struct ibv_wc *wc, int is_send, uint64_t seq)
{
    if (cq->overrun || cq->count == cq->cap) {
        /* A NIC raises IBV_EVENT_CQ_ERR and the CQ is unusable from here. */
        if (!cq->overrun) {
            stat_add(ST_CQ_OVERRUN, 1);
            trace("CQ overrun: %d entries", cq->cap);
            async_push(ctx_of(cq->cq.context), IBV_EVENT_CQ_ERR, &cq->cq, 0);
        }
        cq->overrun = 1;
        return;
    }
    cqe_t *e = &cq->ring[(cq->head + cq->count) % cq->cap];
    e->wc = *wc;
    e->is_send = is_send;
    e->seq = seq;
    e->t_ready = now_ms();
    cq->count++;
    if (cq->armed && cq->cq.channel)
        chan_push(cq);
}

/* Fields verbs leaves undefined on an error completion get garbage, so that
 * a caller reading them shows up. */
static void wc_error_fill(struct ibv_wc *wc, uint64_t wr_id, int status, uint32_t qpn)
{
    memset(wc, 0xa5, sizeof *wc);
    wc->wr_id = wr_id;
    wc->status = (enum ibv_wc_status)status;
    wc->qp_num = qpn;
    wc->vendor_err = status == IBV_WC_WR_FLUSH_ERR ? 0xf9 : 0x81;
}

static void send_complete(mqp_t *q, uint64_t seq, int status)
{
    swqe_t *w = &q->sq[seq % q->cap.max_send_wr];
    struct ibv_wc wc;
    if (status != IBV_WC_SUCCESS) {
        wc_error_fill(&wc, w->wr_id, status, q->qp.qp_num);
    } else {
        if (!(w->signaled || q->sq_sig_all))
            return;
        memset(&wc, 0, sizeof wc);
        wc.wr_id = w->wr_id;
        wc.status = IBV_WC_SUCCESS;
        wc.opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
        wc.byte_len = w->opcode == IBV_WR_RDMA_READ ? w->len : 0;
        wc.qp_num = q->qp.qp_num;
    }
    cq_push((mcq_t *)q->qp.send_cq, &wc, 1, seq);
}

static void conn_close(mctx_t *c, conn_t *k);

/* The QP enters the error state: the first failed WR reports status, every
 * other outstanding WR of both queues is flushed. */
static void qp_error_at(mqp_t *q, uint64_t fail_seq, int status)
{
    mctx_t *c = q->ctx;
    if (q->qp.state == IBV_QPS_ERR)
        return;
    /* Completions stay in order: WRs before the failed one were not
     * acknowledged and flush too. */
    for (; q->sq_ack < q->sq_post; q->sq_ack++) {
        int st = status && q->sq_ack == fail_seq ? status : IBV_WC_WR_FLUSH_ERR;
        send_complete(q, q->sq_ack, st);
        if (st == IBV_WC_WR_FLUSH_ERR)
            stat_add(ST_FLUSHED, 1);
    }
    q->sq_tx = q->sq_post;
    for (; q->rq_cons < q->rq_post; q->rq_cons++) {
        struct ibv_wc wc;
        wc_error_fill(&wc, q->rq[q->rq_cons % q->cap.max_recv_wr], IBV_WC_WR_FLUSH_ERR,
                      q->qp.qp_num);
        cq_push((mcq_t *)q->qp.recv_cq, &wc, 0, q->rq_cons);
        stat_add(ST_FLUSHED, 1);
    }
    q->qp.state = IBV_QPS_ERR;
    /* An errored QP sends nothing more; the peer's retries will run out. */
    if (q->outc) {
        conn_close(c, q->outc);
        q->outc = NULL;
        q->out_broken = 1;
    }
}

/* The oldest outstanding WR failed with status (0: just flush everything). */
static void qp_error(mqp_t *q, int status)
{
    qp_error_at(q, q->sq_ack, status);
}

static int mock_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    mcq_t *cq = (mcq_t *)ibcq;
    mctx_t *c = ctx_of(ibcq->context);
    pthread_mutex_lock(&c->mu);
    int k = 0;
    /* An overrun CQ goes on answering: what it lost is not there, and only
     * the async event (IBV_EVENT_CQ_ERR) says so, as on a NIC. */
    const double t_poll = k < n && cq->count ? now_ms() : 0;
    while (k < n && cq->count) {
        cqe_t *e = &cq->ring[cq->head];
        wc[k++] = e->wc;
        pickup_note(t_poll - e->t_ready);
        /* Polling the completion is what frees the queue slots up to it. */
        mqp_t *q = qp_by_num(c, e->wc.qp_num);
        if (q && e->is_send && e->seq + 1 > q->sq_free)
            q->sq_free = e->seq + 1;
        if (q && !e->is_send && e->seq + 1 > q->rq_free)
            q->rq_free = e->seq + 1;
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    pthread_mutex_unlock(&c->mu);
    return k;
}

/* Solicited-only is armed as "any": every WR here is unsolicited anyway. */
static int mock_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    (void)solicited_only;
    mctx_t *c = ctx_of(cq->context);
    pthread_mutex_lock(&c->mu);
    ((mcq_t *)cq)->armed = 1;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

HCMOCK_API struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ic)
{
    mchan_t *ch = calloc(1, sizeof *ch);
    if (!ch) {
        errno = ENOMEM;
        return NULL;
    }
    ch->ch.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (ch->ch.fd < 0) {
        free(ch);
        return NULL;
    }
    ch->ch.context = ic;
    pthread_mutex_init(&ch->mu, NULL);
    return &ch->ch;
}

HCMOCK_API int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    mchan_t *ch = (mchan_t *)channel;
    mctx_t *c = ctx_of(channel->context);
    pthread_mutex_lock(&c->mu);
    int busy = channel->refcnt > 0;
    pthread_mutex_unlock(&c->mu);
    if (busy)
        return EBUSY;
    close(channel->fd);
    pthread_mutex_destroy(&ch->mu);
    free(ch->q);
    free(ch);
    return 0;
}

/* The next event: blocks on a blocking fd, EAGAIN on an O_NONBLOCK one. */
HCMOCK_API int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
                                void **cq_context)
{
    mchan_t *ch = (mchan_t *)channel;
    uint64_t one;
    if (read(channel->fd, &one, sizeof one) != (ssize_t)sizeof one)
        return -1;
    pthread_mutex_lock(&ch->mu);
    mcq_t *q = ch->n ? ch->q[0] : NULL;
    if (q) {
        memmove(ch->q, ch->q + 1, (size_t)(ch->n - 1) * sizeof *ch->q);
        ch->n--;
    }
    pthread_mutex_unlock(&ch->mu);
    if (!q) {
        errno = EAGAIN;
        return -1;
    }
    *cq = &q->cq;
    *cq_context = q->cq.cq_context;
    return 0;
}

HCMOCK_API void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    mctx_t *c = ctx_of(cq->context);
    pthread_mutex_lock(&c->mu);
    ((mcq_t *)cq)->acked += nevents;
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------------ */
/* Memory regions                                                            */
/* ------------------------------------------------------------------------ */

typedef void *(*dev2host_fn)(uint64_t, size_t);

/* The mock CUDA driver, when the process loaded it: device addresses are
 * not host memory, and this is how a NIC with peermem would reach them. */
static dev2host_fn dev2host(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return NULL;
    dev2host_fn f = (dev2host_fn)dlsym(h, "hcmock_dev_to_host");
    dlclose(h);
    return f;
}

static ptrattr_fn ptr_attr(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return NULL;
    ptrattr_fn f = (ptrattr_fn)dlsym(h, "cuPointerGetAttribute");
    dlclose(h);
    return f;
}

/* CUDA's id of the allocation holding a device address (0: none). */
static unsigned long long dev_buffer_id(ptrattr_fn attr, uint64_t addr)
{
    unsigned long long id = 0;
    if (!attr || attr(&id, 7 /* CU_POINTER_ATTRIBUTE_BUFFER_ID */, addr) != 0)
        id = 0;
    return id;
}

/* Host pointer behind [addr, addr+len) of a live region, or NULL. */
static void *mr_ptr(const mmr_t *m, uint64_t addr, size_t len)
{
    if (!m->device)
        return (void *)(uintptr_t)addr;
    /* Translated at every access. nvidia-peermem invalidates the MR when the
     * allocation is freed, even if a new one takes its addresses later: it
     * must still be the allocation registered. */
    addr += (uint64_t)m->dev_delta;
    if (!m->d2h || dev_buffer_id(m->attr, addr) != m->buf_id)
        return NULL;
    return m->d2h(addr, len);
}

static mmr_t *mr_by_lkey(mctx_t *c, uint32_t k)
{
    for (mmr_t *m = c->by_l[k & 255]; m; m = m->next_l)
        if (m->mr.lkey == k)
            return m;
    return NULL;
}

static mmr_t *mr_by_rkey(mctx_t *c, uint32_t k)
{
    for (mmr_t *m = c->by_r[k & 255]; m; m = m->next_r)
        if (m->mr.rkey == k)
            return m;
    return NULL;
}

static int mr_covers(const mmr_t *m, uint64_t addr, uint64_t len)
{
    uint64_t b = (uintptr_t)m->mr.addr;
    return addr >= b && len <= m->mr.length && addr - b <= m->mr.length - len;
}

/* Is every page of [p, p+len) mapped, and writable when asked? What
 * get_user_pages checks when a NIC pins memory. */
static int host_range_ok(const void *p, size_t len, int need_write)
{
    /* The kernel's page size (mincore's unit), even where a test makes
     * sysconf answer a bigger one (libhcmock_page.so). */
    long pg = (long)getauxval(AT_PAGESZ);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    uintptr_t e = ((uintptr_t)p + len + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    size_t npg = (e - a) / (size_t)pg;
    unsigned char *vec = malloc(npg ? npg : 1);
    if (!vec)
        return 0;
    int ok = mincore((void *)a, e - a, vec) == 0;
    free(vec);
    if (!ok || !need_write)
        return ok;
    /* Writable: every byte must lie in a mapping with 'w'. */
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 1;
    uintptr_t cur = a;
    char line[512];
    while (cur < e && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
            continue;
        if (cur >= lo && cur < hi) {
            if (perms[1] != 'w')
                break;
            cur = hi;
        }
    }
    fclose(f);
    return cur >= e;
}

static uint32_t key_new(mctx_t *c)
{
    for (;;) {
        uint32_t k = (uint32_t)rnd_next(c);
        if (k && !mr_by_lkey(c, k) && !mr_by_rkey(c, k))
            return k;
    }
}

static struct ibv_mr *mr_create(struct ibv_pd *pd, void *addr, size_t len, int access,
                                dev2host_fn device)
{
    mctx_t *c = ctx_of(pd->context);
    reg_cost(len);
    mmr_t *m = calloc(1, sizeof *m);
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&c->mu);
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.handle = (uint32_t)rnd_next(c);
    /* Distinct lkey and rkey, random: a caller that mixes them up, or uses a
     * key after deregistering, fails here. */
    m->mr.lkey = key_new(c);
    m->mr.rkey = key_new(c);
    while (m->mr.rkey == m->mr.lkey)
        m->mr.rkey = key_new(c);
    m->access = access;
    if (access & IBV_ACCESS_RELAXED_ORDERING)
        stat_add(ST_RO_REGS, 1);
    m->device = device != NULL;
    m->d2h = device;
    if (device) {
        m->attr = ptr_attr();
        m->buf_id = dev_buffer_id(m->attr, (uintptr_t)addr);
    }
    m->next_l = c->by_l[m->mr.lkey & 255];
    c->by_l[m->mr.lkey & 255] = m;
    m->next_r = c->by_r[m->mr.rkey & 255];
    c->by_r[m->mr.rkey & 255] = m;
    ((mpd_t *)pd)->users++;
    pthread_mutex_unlock(&c->mu);
    stat_add(ST_LIVE_MR, 1);
    stat_add(ST_MR_REGS, 1);
    return &m->mr;
}

/* ------------------------------------------------------------------------ */
/* Where registration meets the host: peermem, locked memory, dma-buf,       */
/* GPUDirect write visibility, async events, fork                            */
/* ------------------------------------------------------------------------ */

/* Is nvidia-peermem (or its predecessors) loaded, in the tree the devices
 * come from? Without it a NIC cannot pin device memory through
 * ibv_reg_mr: get_user_pages fails on the GPU's addresses (EFAULT). */
static int peermem_loaded(void)
{
    static const char *const files[] = { "sys/kernel/mm/memory_peers/nv_mem/version",
                                         "sys/module/nvidia_peermem", "sys/module/nv_peer_mem" };
    char path[PATH_MAX];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", sysfs_root(), files[i]);
        if (access(path, F_OK) == 0)
            return 1;
    }
    return 0;
}

/* Device memory, not the driver's pinned host memory (which is host
 * memory to the NIC). */
static int is_device_memory(const void *p)
{
    ptrattr_fn attr = ptr_attr();
    unsigned mt = 0;
    return attr && attr(&mt, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */, (uintptr_t)p) == 0 &&
           mt == 2 /* CU_MEMORYTYPE_DEVICE */;
}

/* Managed memory: nvidia-peermem does not take it, and pinning its host
 * pages would register a copy the GPU does not use. */
static int is_managed_memory(const void *p)
{
    ptrattr_fn attr = ptr_attr();
    unsigned v = 0;
    return attr && attr(&v, 8 /* CU_POINTER_ATTRIBUTE_IS_MANAGED */, (uintptr_t)p) == 0 && v;
}

/* Host bytes pinned by live MRs, against HCMOCK_IB_MEMLOCK (RLIMIT_MEMLOCK:
 * ib_umem_get answers ENOMEM past it). */
static _Atomic uint64_t g_pinned;

static int memlock_take(size_t len)
{
    long lim = env_int("HCMOCK_IB_MEMLOCK_KB", 0);
    uint64_t now = atomic_fetch_add(&g_pinned, len) + len;
    if (lim > 0 && now > (uint64_t)lim * 1024) {
        atomic_fetch_sub(&g_pinned, len);
        stat_add(ST_MEMLOCK_FAILS, 1);
        trace("ibv_reg_mr of %zu bytes: %llu KiB would be locked, limit %ld KiB", len,
              (unsigned long long)(now / 1024), lim);
        return -1;
    }
    return 0;
}

/* HCMOCK_IB_GDR_LAZY=1: what the NIC writes into device memory stays
 * invisible (to kernels and copies) until a read through the same NIC of
 * the allocation it landed in has pushed it ahead: a PCIe read does not
 * pass the posted writes before it on its path, and on a C2C host the only
 * path known to be shared is the target's own. Pre-Hopper GPUs, or a path
 * that orders nothing, behave so; hcoll must flush, and read the landed
 * buffer, not a word of its own. */
typedef struct lazy_write {
    mmr_t *m;
    uint64_t addr;
    size_t len;
    struct lazy_write *next;
    uint8_t data[];
} lazy_write_t;

static int gdr_lazy(const mmr_t *m)
{
    return m->device && env_int("HCMOCK_IB_GDR_LAZY", 0) == 1;
}

/* A write of len bytes at addr of device region m, held back (NULL: no
 * memory, written at once by the caller). Appended in arrival order. */
static lazy_write_t *lazy_new(mctx_t *c, mmr_t *m, uint64_t addr, size_t len)
{
    lazy_write_t *w = malloc(sizeof *w + len);
    if (!w)
        return NULL;
    w->m = m;
    w->addr = addr;
    w->len = len;
    w->next = NULL;
    lazy_write_t **pp = &c->lazy;
    while (*pp)
        pp = &(*pp)->next;
    *pp = w;
    stat_add(ST_GDR_HELD, 1);
    return w;
}

/* A read of device region r went through this NIC: every write held for
 * r's allocation lands, in order. Writes whose region went away are lost,
 * as on the bus. */
static void lazy_flush(mctx_t *c, const mmr_t *r)
{
    for (lazy_write_t **pp = &c->lazy; *pp;) {
        lazy_write_t *w = *pp;
        if (w->m->buf_id != r->buf_id) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        void *p = mr_ptr(w->m, w->addr, w->len);
        if (p)
            memcpy(p, w->data, w->len);
        free(w);
    }
}

static void lazy_drop_mr(mctx_t *c, const mmr_t *m)
{
    for (lazy_write_t **pp = &c->lazy; *pp;) {
        lazy_write_t *w = *pp;
        if (w->m == m) {
            *pp = w->next;
            free(w);
        } else {
            pp = &w->next;
        }
    }
}

/* Queue an async event (the caller holds c->mu); ibv_get_async_event
 * returns it. */
static void async_push(mctx_t *c, enum ibv_event_type type, void *obj, int port)
{
    if (c->naq == c->aqcap) {
        int ncap = c->aqcap ? c->aqcap * 2 : 8;
        struct ibv_async_event *n = realloc(c->aq, (size_t)ncap * sizeof *n);
        if (!n)
            return;
        c->aq = n;
        c->aqcap = ncap;
    }
    struct ibv_async_event *e = &c->aq[c->naq++];
    memset(e, 0, sizeof *e);
    e->event_type = type;
    if (type == IBV_EVENT_CQ_ERR)
        e->element.cq = obj;
    else if (type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_PORT_ACTIVE ||
             type == IBV_EVENT_GID_CHANGE)
        e->element.port_num = port;
    else
        e->element.qp = obj;
    uint64_t one = 1;
    if (write(c->async_fd, &one, sizeof one) < 0) {
        /* the count saturated: ibv_get_async_event still finds the queue */
    }
    stat_add(ST_ASYNC_EVENTS, 1);
    trace("async event %d queued", (int)type);
}

static int access_valid(int access)
{
    const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING;
    if (access & ~known)
        return 0;
    /* ibv_reg_mr(3): remote write or atomic needs local write. */
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE))
        return 0;
    return 1;
}

HCMOCK_API struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    if (!pd || !access_valid(access) || length == 0) {
        errno = EINVAL;
        return NULL;
    }
    if (reg_injected())
        return NULL;
    const int write = access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_ATOMIC);
    dev2host_fn f = dev2host();
    if (f && f((uintptr_t)addr, length) && is_managed_memory(addr)) {
        trace("ibv_reg_mr of managed memory %p: EFAULT", addr);
        errno = EFAULT;
        return NULL;
    }
    if (f && f((uintptr_t)addr, length) && is_device_memory(addr)) {
        /* Device memory: reachable through nvidia-peermem only. */
        if (!peermem_loaded()) {
            stat_add(ST_DEV_NO_PEERMEM, 1);
            trace("ibv_reg_mr of device address %p without nvidia-peermem: EFAULT", addr);
            errno = EFAULT;
            return NULL;
        }
        return mr_create(pd, addr, length, access, f);
    }
    /* Plain host memory, or an address nobody mapped (a freed buffer):
     * pinning fails with EFAULT. */
    if (!host_range_ok(addr, length, write)) {
        errno = EFAULT;
        return NULL;
    }
    if (memlock_take(length) != 0) {
        errno = ENOMEM;
        return NULL;
    }
    struct ibv_mr *mr = mr_create(pd, addr, length, access, NULL);
    if (!mr)
        atomic_fetch_sub(&g_pinned, length);
    else
        ((mmr_t *)mr)->host_pinned = 1;
    return mr;
}

HCMOCK_API struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                           uint64_t iova, unsigned int access)
{
    if (iova != (uintptr_t)addr || env_int("HCMOCK_IB_IOVA2", 1) == 0) {
        errno = EOPNOTSUPP; /* only iova == addr is emulated */
        return NULL;
    }
    if ((access & IBV_ACCESS_RELAXED_ORDERING) && env_int("HCMOCK_IB_RO", 1) == 0) {
        errno = EINVAL;
        return NULL;
    }
    /* Optional flags this NIC does not know are ignored, as the providers
     * do; relaxed ordering it knows. */
    const unsigned ignored = IBV_ACCESS_OPTIONAL_RANGE & ~(unsigned)IBV_ACCESS_RELAXED_ORDERING;
    return ibv_reg_mr(pd, addr, length, (int)(access & ~ignored));
}

/* dma-buf: HCMOCK_IB_DMABUF=0 is a NIC or kernel without dma-buf import
 * (EOPNOTSUPP, before anything else is looked at: NCCL's probe with fd -1
 * relies on it); otherwise the fd must be the emulated driver's export
 * (hcmock_dmabuf_t), and the MR covers [offset, offset + length) of the
 * exported range, addressed from iova. */
HCMOCK_API struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                            uint64_t iova, int fd, int access)
{
    if (env_int("HCMOCK_IB_DMABUF", 1) == 0) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (fd < 0 || fcntl(fd, F_GETFD) < 0) {
        errno = EBADF;
        return NULL;
    }
    if (reg_injected())
        return NULL;
    if (!pd || !access_valid(access) || length == 0 ||
        ((access & IBV_ACCESS_RELAXED_ORDERING) && env_int("HCMOCK_IB_RO", 1) == 0)) {
        errno = EINVAL;
        return NULL;
    }
    hcmock_dmabuf_t d;
    dev2host_fn f = dev2host();
    if (pread(fd, &d, sizeof d, 0) != (ssize_t)sizeof d || d.magic != HCMOCK_DMABUF_MAGIC || !f) {
        errno = EINVAL; /* not a dma-buf */
        return NULL;
    }
    if (offset > d.size || length > d.size - offset) {
        trace("ibv_reg_dmabuf_mr: [%llu, +%zu) outside the %llu-byte dma-buf",
              (unsigned long long)offset, length, (unsigned long long)d.size);
        errno = EINVAL;
        return NULL;
    }
    const uint64_t dev = d.dptr + offset;
    if (!f(dev, length)) {
        errno = EFAULT;
        return NULL;
    }
    struct ibv_mr *mr = mr_create(pd, (void *)(uintptr_t)iova, length, access, f);
    if (mr) {
        mmr_t *m = (mmr_t *)mr;
        m->dev_delta = (int64_t)(dev - iova);
        m->buf_id = dev_buffer_id(m->attr, dev);
        stat_add(ST_DMABUF_REGS, 1);
    }
    return mr;
}

HCMOCK_API int ibv_dereg_mr(struct ibv_mr *mr)
{
    if (!mr)
        return EINVAL;
    mctx_t *c = ctx_of(mr->context);
    mmr_t *m = (mmr_t *)mr;
    pthread_mutex_lock(&c->mu);
    mmr_t **pp;
    for (pp = &c->by_l[mr->lkey & 255]; *pp && *pp != m; pp = &(*pp)->next_l)
        ;
    if (*pp)
        *pp = m->next_l;
    for (pp = &c->by_r[mr->rkey & 255]; *pp && *pp != m; pp = &(*pp)->next_r)
        ;
    if (*pp)
        *pp = m->next_r;
    ((mpd_t *)mr->pd)->users--;
    /* A payload being landed in it is dropped from the next chunk on. */
    for (mqp_t *q = c->qps; q; q = q->next)
        for (conn_t *k = q->inc; k; k = k->next)
            if (k->pay_mr == m)
                k->pay_mr = NULL;
    lazy_drop_mr(c, m);
    pthread_mutex_unlock(&c->mu);
    if (m->host_pinned)
        atomic_fetch_sub(&g_pinned, m->mr.length);
    free(m);
    stat_sub(ST_LIVE_MR);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Connections                                                               */
/* ------------------------------------------------------------------------ */

static void qp_addr(uint32_t qpn, struct sockaddr_un *sa, socklen_t *len)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "hcmock-verbs-qp-%06x", qpn);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static conn_t *conn_new(mctx_t *c, mqp_t *q, int fd, int out)
{
    conn_t *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    int buf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    k->fd = fd;
    k->out = out;
    k->qp = q;
    c->gen++;
    return k;
}

static void conn_close(mctx_t *c, conn_t *k)
{
    if (!k)
        return;
    close(k->fd);
    free(k->ob);
    free(k->lazy_w);
    free(k);
    c->gen++;
}

static int ob_append(conn_t *k, const void *p, size_t n)
{
    if (k->ob_off && k->ob_off == k->ob_len)
        k->ob_off = k->ob_len = 0;
    if (k->ob_len + n > k->ob_cap) {
        size_t ncap = k->ob_cap ? k->ob_cap : 4096;
        while (ncap < k->ob_len + n)
            ncap *= 2;
        uint8_t *nb = realloc(k->ob, ncap);
        if (!nb)
            return -1;
        k->ob = nb;
        k->ob_cap = ncap;
    }
    memcpy(k->ob + k->ob_len, p, n);
    k->ob_len += n;
    return 0;
}

static void respond(conn_t *k, int type, uint32_t psn, int syndrome, const void *pay,
                    uint32_t len)
{
    if (k->mute)
        return;
    frame_t f;
    memset(&f, 0, sizeof f);
    f.magic = F_MAGIC;
    f.type = (uint8_t)type;
    f.psn = psn;
    f.syndrome = (uint8_t)syndrome;
    f.len = len;
    if (ob_append(k, &f, sizeof f) != 0 || (len && ob_append(k, pay, len) != 0))
        k->blackhole = 1; /* out of memory: the peer will time out */
}

/* ------------------------------------------------------------------------ */
/* Requester                                                                 */
/* ------------------------------------------------------------------------ */

static uint32_t npkts(const mqp_t *q, uint32_t len)
{
    uint32_t m = mtu_bytes(q->path_mtu);
    return len ? (len + m - 1) / m : 1;
}

/* How long a NIC retries before IBV_WC_RETRY_EXC_ERR: 4.096 us x 2^timeout
 * per try, retry_cnt + 1 tries; timeout 0 is "forever". Capped for tests,
 * and floored because a round trip here is milliseconds, not microseconds. */
static double retry_window_ms(const mqp_t *q)
{
    if (q->timeout == 0)
        return -1;
    double real = 4.096e-3 * (double)(1ull << q->timeout) * (q->retry_cnt + 1);
    double cap = env_int("HCMOCK_IB_RETRY_MS", 2000);
    double floor_ms = cap < 100 ? cap : 100;
    return real > cap ? cap : real < floor_ms ? floor_ms : real;
}

static int local_sge_ok(mctx_t *c, mqp_t *q, const struct ibv_sge *s, int need_write)
{
    mmr_t *m = mr_by_lkey(c, s->lkey);
    return m && m->mr.pd == q->qp.pd && mr_covers(m, s->addr, s->length) &&
           (!need_write || (m->access & IBV_ACCESS_LOCAL_WRITE));
}

static void dial(mctx_t *c, mqp_t *q)
{
    double t = now_ms();
    if (q->outc || q->out_broken || t < q->next_dial)
        return;
    q->next_dial = t + 20;
    port_info_t pi;
    if (port_load(c->root, c->dev->dev.name, q->port, &pi) != 0 || pi.state != IBV_PORT_ACTIVE)
        return; /* no link: nothing leaves the port */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    struct sockaddr_un sa;
    socklen_t sl;
    qp_addr(q->dest_qpn, &sa, &sl);
    if (connect(fd, (struct sockaddr *)&sa, sl) != 0 && errno != EINPROGRESS) {
        close(fd); /* no such QP (yet): like packets to nowhere, retried */
        return;
    }
    conn_t *k = conn_new(c, q, fd, 1);
    if (!k) {
        close(fd);
        return;
    }
    hello_t h;
    memset(&h, 0, sizeof h);
    h.src_qpn = q->qp.qp_num;
    h.dst_qpn = q->dest_qpn;
    h.sq_psn = q->sq_psn;
    h.slid = pi.lid;
    h.dlid = q->ah.dlid;
    h.link_layer = (uint8_t)pi.link_layer;
    h.path_mtu = (uint8_t)q->path_mtu;
    h.rnr_retry = (uint8_t)q->rnr_retry;
    h.is_global = q->ah.is_global;
    int type = GT_NONE;
    if (q->ah.is_global)
        gid_load(c->root, c->dev->dev.name, q->port, q->ah.grh.sgid_index, h.sgid, &type);
    h.sgid_type = (uint8_t)type;
    memcpy(h.dgid, q->ah.grh.dgid.raw, 16);
    h.pid = (int32_t)getpid();
    frame_t f;
    memset(&f, 0, sizeof f);
    f.magic = F_MAGIC;
    f.type = F_HELLO;
    f.len = sizeof h;
    ob_append(k, &f, sizeof f);
    ob_append(k, &h, sizeof h);
    q->outc = k;
}

/* Put the next WQE's header on the wire (its payload streams after it). */
static void tx_start(mctx_t *c, mqp_t *q)
{
    conn_t *k = q->outc;
    if (!k || k->tx_active || q->sq_tx == q->sq_post || k->ob_len - k->ob_off > 0)
        return;
    swqe_t *w = &q->sq[q->sq_tx % q->cap.max_send_wr];
    if (w->not_before > now_ms())
        return; /* the timers wake the thread for it */
    /* The NIC fetches the WQE's data now: keys are checked here, not at
     * post time (inline data has no key). */
    for (int i = 0; !w->local_err && !w->inl && i < w->nsge; i++) {
        if (!local_sge_ok(c, q, &w->sge[i], w->opcode == IBV_WR_RDMA_READ)) {
            stat_add(ST_LOC_PROT, 1);
            trace("QP %06x: local protection error (lkey 0x%x)", q->qp.qp_num, w->sge[i].lkey);
            w->local_err = IBV_WC_LOC_PROT_ERR;
        }
    }
    if (w->local_err) {
        qp_error_at(q, q->sq_tx, w->local_err);
        return;
    }
    frame_t f;
    memset(&f, 0, sizeof f);
    f.magic = F_MAGIC;
    f.type = w->opcode == IBV_WR_RDMA_READ             ? F_READ_REQ
             : w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? F_WRITE_IMM
                                                       : F_WRITE;
    f.psn = w->psn;
    f.len = w->len;
    f.rkey = w->rkey;
    f.raddr = w->raddr;
    f.imm = w->imm;
    ob_append(k, &f, sizeof f);
    q->sq_tx++;
    if (f.type != F_READ_REQ && w->len) {
        k->tx_active = 1;
        k->tx_seq = q->sq_tx - 1;
        k->tx_off = 0;
    }
    stat_add(f.type == F_READ_REQ ? ST_READS : ST_WRITES, 1);
}

/* Next piece of the payload being streamed: straight from the source
 * memory, as a NIC reads it while sending. */
static const void *tx_piece(mctx_t *c, mqp_t *q, conn_t *k, size_t *n_out)
{
    static const uint8_t zeros[4096];
    swqe_t *w = &q->sq[k->tx_seq % q->cap.max_send_wr];
    if (w->inl) {
        *n_out = w->len - k->tx_off;
        return w->inl + k->tx_off;
    }
    uint64_t off = k->tx_off;
    for (int i = 0; i < w->nsge; i++) {
        if (off >= w->sge[i].length) {
            off -= w->sge[i].length;
            continue;
        }
        size_t n = w->sge[i].length - off;
        if (n > IO_CHUNK)
            n = IO_CHUNK;
        mmr_t *m = mr_by_lkey(c, w->sge[i].lkey);
        void *p = m && mr_covers(m, w->sge[i].addr, w->sge[i].length)
                      ? mr_ptr(m, w->sge[i].addr + off, n)
                      : NULL;
        if (!p) {
            /* Deregistered (or freed device memory) mid-transfer. */
            w->local_err = IBV_WC_LOC_PROT_ERR;
            *n_out = n < sizeof zeros ? n : sizeof zeros;
            return zeros;
        }
        *n_out = n;
        return p;
    }
    *n_out = 0;
    return zeros;
}

static int out_write(mctx_t *c, mqp_t *q, conn_t *k)
{
    size_t budget = 8u << 20;
    while (budget) {
        const void *p;
        size_t n;
        if (k->ob_off < k->ob_len) {
            p = k->ob + k->ob_off;
            n = k->ob_len - k->ob_off;
        } else if (k->out && k->tx_active) {
            p = tx_piece(c, q, k, &n);
            if (n == 0) {
                k->tx_active = 0;
                continue;
            }
        } else if (k->out && q->qp.state == IBV_QPS_RTS && q->sq_tx < q->sq_post) {
            tx_start(c, q);
            if (q->outc != k)
                return 1; /* the QP failed and closed k */
            if (k->ob_off == k->ob_len)
                break;
            continue;
        } else {
            break;
        }
        ssize_t r = send(k->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return 0;
            return -1;
        }
        budget = (size_t)r >= budget ? 0 : budget - (size_t)r;
        if (k->ob_off < k->ob_len) {
            k->ob_off += (size_t)r;
        } else {
            k->tx_off += (uint64_t)r;
            swqe_t *w = &q->sq[k->tx_seq % q->cap.max_send_wr];
            stat_add(ST_BYTES, (uint64_t)r);
            if (k->tx_off >= w->len)
                k->tx_active = 0;
        }
        if (k->out)
            q->last_progress = now_ms(); /* the peer is taking bytes */
    }
    return 0;
}

/* A response to the oldest request in flight. */
static void out_response(mqp_t *q, conn_t *k)
{
    const frame_t *f = &k->ih;
    q->last_progress = now_ms();
    if (f->type == F_RNR) {
        stat_add(ST_RNR_NAKS, 1);
        return;
    }
    if (q->sq_ack == q->sq_tx) {
        trace("QP %06x: response %d with nothing in flight", q->qp.qp_num, f->type);
        return;
    }
    swqe_t *w = &q->sq[q->sq_ack % q->cap.max_send_wr];
    if (f->type == F_NAK) {
        switch (f->syndrome) {
        case IBV_WC_REM_ACCESS_ERR: stat_add(ST_REM_ACCESS, 1); break;
        case IBV_WC_REM_INV_REQ_ERR: stat_add(ST_REM_INV, 1); break;
        case IBV_WC_RNR_RETRY_EXC_ERR: stat_add(ST_RNR_EXC, 1); break;
        default: break;
        }
        trace("QP %06x: NAK status %d for PSN %06x", q->qp.qp_num, f->syndrome, f->psn);
        qp_error(q, f->syndrome);
        return;
    }
    if ((f->type == F_READ_RESP) != (w->opcode == IBV_WR_RDMA_READ) || f->psn != w->psn) {
        trace("QP %06x: response type %d PSN %06x does not match the WQE (PSN %06x)",
              q->qp.qp_num, f->type, f->psn, w->psn);
        qp_error(q, IBV_WC_BAD_RESP_ERR);
        return;
    }
    int st = w->local_err ? w->local_err : k->pay_err;
    if (st) {
        stat_add(ST_LOC_PROT, 1);
        qp_error(q, st);
        return;
    }
    send_complete(q, q->sq_ack, IBV_WC_SUCCESS);
    q->sq_ack++;
}

/* ------------------------------------------------------------------------ */
/* Responder                                                                 */
/* ------------------------------------------------------------------------ */

/* Would this NIC accept the requester's packets, and reach it with its
 * answers? Decided once per connection from the HELLO. */
static void hello_check(mctx_t *c, mqp_t *q, conn_t *k, const hello_t *h)
{
    char why[256] = "";
    port_info_t pi;
    int ok = port_load(c->root, c->dev->dev.name, q->port, &pi) == 0;
    if (!ok || pi.state != IBV_PORT_ACTIVE)
        snprintf(why, sizeof why, "port %d is not ACTIVE", q->port);
    else if (h->dst_qpn != q->qp.qp_num)
        snprintf(why, sizeof why, "addressed to QPN %06x", h->dst_qpn);
    else if (h->src_qpn != q->dest_qpn)
        snprintf(why, sizeof why, "from QPN %06x, but this QP is connected to %06x", h->src_qpn,
                 q->dest_qpn);
    else if (h->sq_psn != q->epsn)
        snprintf(why, sizeof why, "first PSN %06x, this QP expects %06x (rq_psn)", h->sq_psn,
                 q->epsn);
    else if (h->link_layer != pi.link_layer)
        snprintf(why, sizeof why, "link layer %d, this port's is %d", h->link_layer,
                 pi.link_layer);
    if (!why[0] && pi.link_layer == IBV_LINK_LAYER_ETHERNET) {
        /* RoCE: the packet's destination GID must be one of this port's, of
         * the type the sender used (RoCE v1 and v2 are different packets). */
        int hit = 0;
        for (int i = 0; i < pi.gid_tbl_len && !hit; i++) {
            uint8_t g[16];
            int t;
            if (gid_load(c->root, c->dev->dev.name, q->port, i, g, &t) == 0 &&
                !gid_is_zero(g) && memcmp(g, h->dgid, 16) == 0 && t == h->sgid_type)
                hit = 1;
        }
        char gs[64];
        gid_str(h->dgid, gs, sizeof gs);
        if (!h->is_global)
            snprintf(why, sizeof why, "RoCE packet without GRH");
        else if (!hit)
            snprintf(why, sizeof why, "destination GID %s (type %d) is not in %s:%d's table", gs,
                     h->sgid_type, c->dev->dev.name, q->port);
    } else if (!why[0] && h->dlid != pi.lid) {
        snprintf(why, sizeof why, "DLID %u, this port's LID is %u", h->dlid, pi.lid);
    }
    if (why[0]) {
        stat_add(ST_DROPPED, 1);
        trace("QP %06x drops everything from QP %06x (pid %d): %s", q->qp.qp_num, h->src_qpn,
              (int)h->pid, why);
        k->blackhole = 1;
        return;
    }
    /* Our answers go where our own address vector points. */
    if (pi.link_layer == IBV_LINK_LAYER_ETHERNET
            ? memcmp(q->ah.grh.dgid.raw, h->sgid, 16) != 0
            : q->ah.dlid != h->slid) {
        stat_add(ST_MUTED, 1);
        trace("QP %06x: its address vector does not point back at QP %06x: answers are lost",
              q->qp.qp_num, h->src_qpn);
        k->mute = 1;
    }
    /* A packet longer than this port's MTU never arrives. */
    k->mtu_bad = h->path_mtu > pi.active_mtu;
    k->rnr_retry = h->rnr_retry;
    k->bound = 1;
}

static const double rnr_table_ms[32] = {
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32,
    0.48,   0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36,
    20.48,  30.72, 40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
};

/* The request whose payload (if any) is in place: finish it. Returns 1
 * when it must wait for a receive WR (RNR). */
static int in_execute(mctx_t *c, mqp_t *q, conn_t *k)
{
    const frame_t *f = &k->ih;
    if (k->pay_err) {
        /* Counted where the NAK lands (out_response), once per event. */
        trace("QP %06x: NAK status %d (rkey 0x%x addr 0x%llx len %u)", q->qp.qp_num, k->pay_err,
              f->rkey, (unsigned long long)f->raddr, f->len);
        respond(k, F_NAK, f->psn, k->pay_err, NULL, 0);
        /* The responder's QP fails too (an affiliated access error); a QP
         * connected to itself fails when its requester side takes the NAK,
         * so that the WR reports the access error rather than a flush. */
        if (q->dest_qpn != q->qp.qp_num)
            qp_error(q, 0);
        k->blackhole = 1;
        return 0;
    }
    if (f->type == F_WRITE_IMM) {
        if (q->rq_cons == q->rq_post) {
            double t = now_ms();
            if (k->istate != IN_RNR) {
                k->istate = IN_RNR;
                k->rnr_since = t;
                k->rnr_last = 0;
            }
            double step = rnr_table_ms[q->min_rnr_timer & 31];
            /* Floored: posting a receive here takes a thread wake-up. */
            double limit = (k->rnr_retry + 1) * (step > 5 ? step : 5);
            if (k->rnr_retry != 7 && t - k->rnr_since > limit) {
                stat_add(ST_RNR_EXC, 1);
                trace("QP %06x: no receive posted for %.0f ms: RNR retries exceeded",
                      q->qp.qp_num, t - k->rnr_since);
                respond(k, F_NAK, f->psn, IBV_WC_RNR_RETRY_EXC_ERR, NULL, 0);
                /* The requester stops; what it sent after this is void. */
                k->blackhole = 1;
                k->istate = IN_HDR;
                return 0;
            }
            if (t - k->rnr_last >= (step > 50 ? step : 50)) {
                respond(k, F_RNR, f->psn, 0, NULL, 0);
                k->rnr_last = t;
            }
            return 1;
        }
        uint64_t seq = q->rq_cons++;
        struct ibv_wc wc;
        memset(&wc, 0, sizeof wc);
        wc.wr_id = q->rq[seq % q->cap.max_recv_wr];
        wc.status = IBV_WC_SUCCESS;
        wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
        wc.byte_len = f->len;
        wc.imm_data = f->imm;
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.qp_num = q->qp.qp_num;
        wc.src_qp = q->dest_qpn;
        cq_push((mcq_t *)q->qp.recv_cq, &wc, 0, seq);
    }
    k->istate = IN_HDR;
    if (f->type == F_READ_REQ) {
        mmr_t *m = f->len ? mr_by_rkey(c, f->rkey) : NULL;
        void *p = NULL;
        if (m && m->device)
            lazy_flush(c, m); /* the read pushes the NIC's earlier writes ahead */
        int st = 0;
        if (!(q->access & IBV_ACCESS_REMOTE_READ))
            st = IBV_WC_REM_INV_REQ_ERR;
        else if (f->len && (!m || m->mr.pd != q->qp.pd || !(m->access & IBV_ACCESS_REMOTE_READ) ||
                            !mr_covers(m, f->raddr, f->len) ||
                            !(p = mr_ptr(m, f->raddr, f->len))))
            st = IBV_WC_REM_ACCESS_ERR;
        if (st) {
            k->pay_err = st;
            return in_execute(c, q, k);
        }
        respond(k, F_READ_RESP, f->psn, 0, p, f->len);
        q->epsn = (q->epsn + npkts(q, f->len)) & 0xffffff;
        return 0;
    }
    respond(k, F_ACK, f->psn, 0, NULL, 0);
    q->epsn = (q->epsn + npkts(q, f->len)) & 0xffffff;
    return 0;
}

/* A request header has arrived: decide where its payload goes. */
static void in_request(mctx_t *c, mqp_t *q, conn_t *k)
{
    const frame_t *f = &k->ih;
    k->pay_mode = PAY_DISCARD;
    k->pay_mr = NULL;
    k->pay_err = 0;
    k->ileft = f->type == F_READ_REQ ? 0 : f->len;
    k->idone = 0;
    if (f->psn != q->epsn) {
        /* Out of sequence: NAKed and retried forever on a NIC, which ends
         * in the requester's retry counter. */
        trace("QP %06x: PSN %06x, expected %06x: dropping the connection", q->qp.qp_num, f->psn,
              q->epsn);
        stat_add(ST_DROPPED, 1);
        k->blackhole = 1;
        return;
    }
    if (k->mtu_bad && f->len > mtu_bytes(q->path_mtu)) {
        trace("QP %06x: a %u-byte message with a path MTU larger than the port's: lost",
              q->qp.qp_num, f->len);
        stat_add(ST_DROPPED, 1);
        k->blackhole = 1;
        return;
    }
    if (f->type == F_READ_REQ)
        return;
    if (!(q->access & IBV_ACCESS_REMOTE_WRITE)) {
        k->pay_err = IBV_WC_REM_INV_REQ_ERR;
        return;
    }
    if (f->len == 0)
        return; /* a zero-length write checks neither rkey nor address */
    mmr_t *m = mr_by_rkey(c, f->rkey);
    if (!m || m->mr.pd != q->qp.pd || !(m->access & IBV_ACCESS_REMOTE_WRITE) ||
        !mr_covers(m, f->raddr, f->len)) {
        trace("QP %06x: write to rkey 0x%x [0x%llx, +%u): %s", q->qp.qp_num, f->rkey,
              (unsigned long long)f->raddr, f->len,
              !m                                        ? "no such key"
              : m->mr.pd != q->qp.pd                    ? "region of another PD"
              : !(m->access & IBV_ACCESS_REMOTE_WRITE) ? "region without REMOTE_WRITE"
                                                        : "outside the region");
        k->pay_err = IBV_WC_REM_ACCESS_ERR;
        return;
    }
    /* A NIC writes a small payload in one PCIe transaction: a reader never
     * sees half of an 8-byte counter. Staged, then stored at once. */
    k->pay_mode = f->len <= SMALL_PAYLOAD ? PAY_SMALL : PAY_MR;
    k->pay_mr = m;
    k->pay_key = m->mr.rkey;
    k->pay_addr = f->raddr;
    if (gdr_lazy(m)) {
        free(k->lazy_w);
        k->lazy_w = malloc(sizeof *k->lazy_w + f->len);
        if (k->lazy_w)
            k->pay_mode = PAY_LAZY;
    }
}

/* A held write came in whole: queued behind the others, invisible until a
 * flush read (its region may have gone meanwhile). */
static void lazy_land(mctx_t *c, conn_t *k)
{
    lazy_write_t *w = k->lazy_w;
    k->lazy_w = NULL;
    mmr_t *m = k->pay_mr;
    if (!w || !m || mr_by_rkey(c, k->pay_key) != m) {
        free(w);
        if (w)
            k->pay_err = IBV_WC_REM_ACCESS_ERR;
        return;
    }
    lazy_write_t *q = lazy_new(c, m, k->pay_addr, k->ih.len);
    if (q) {
        memcpy(q->data, w->data, k->ih.len);
    } else {
        void *p = mr_ptr(m, k->pay_addr, k->ih.len);
        if (p)
            memcpy(p, w->data, k->ih.len);
    }
    free(w);
}

static void small_land(mctx_t *c, conn_t *k)
{
    mmr_t *m = k->pay_mr;
    uint32_t len = k->ih.len;
    void *p = m && mr_by_rkey(c, k->pay_key) == m ? mr_ptr(m, k->pay_addr, len) : NULL;
    if (!p) {
        k->pay_err = IBV_WC_REM_ACCESS_ERR;
        return;
    }
    if (len == 8 && ((uintptr_t)p & 7) == 0) {
        uint64_t v;
        memcpy(&v, k->small, 8);
        __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
    } else {
        memcpy(p, k->small, len);
    }
}

/* Where the next incoming payload bytes go (requester: a READ response into
 * the WQE's local buffers; responder: the target region). */
static void *in_sink(mctx_t *c, mqp_t *q, conn_t *k, size_t *n)
{
    static uint8_t sink[65536];
    size_t want = k->ileft < IO_CHUNK ? (size_t)k->ileft : IO_CHUNK;
    if (k->pay_mode == PAY_SMALL) {
        *n = (size_t)k->ileft;
        return k->small + k->idone;
    }
    if (k->pay_mode == PAY_LAZY) {
        *n = want;
        return k->lazy_w->data + k->idone;
    }
    if (k->pay_mode == PAY_MR) {
        mmr_t *m = k->pay_mr;
        void *p = m && mr_by_rkey(c, k->pay_key) == m ? mr_ptr(m, k->pay_addr + k->idone, want)
                                                        : NULL;
        if (p) {
            *n = want;
            return p;
        }
        /* The region went away under the transfer. */
        trace("QP %06x: region of rkey 0x%x gone or invalidated at +%llu", q->qp.qp_num,
              k->pay_key, (unsigned long long)k->idone);
        k->pay_mode = PAY_DISCARD;
        k->pay_err = IBV_WC_REM_ACCESS_ERR;
    } else if (k->pay_mode == PAY_SGE) {
        swqe_t *w = &q->sq[q->sq_ack % q->cap.max_send_wr];
        uint64_t off = k->idone;
        for (int i = 0; i < w->nsge; i++) {
            if (off >= w->sge[i].length) {
                off -= w->sge[i].length;
                continue;
            }
            size_t len = w->sge[i].length - off;
            if (len > want)
                len = want;
            mmr_t *m = mr_by_lkey(c, w->sge[i].lkey);
            void *p = m ? mr_ptr(m, w->sge[i].addr + off, len) : NULL;
            if (p && local_sge_ok(c, q, &w->sge[i], 1)) {
                *n = len;
                return p;
            }
            break;
        }
        k->pay_mode = PAY_DISCARD;
        k->pay_err = IBV_WC_LOC_PROT_ERR;
    }
    *n = want < sizeof sink ? want : sizeof sink;
    return sink;
}

/* ------------------------------------------------------------------------ */
/* Reading a connection                                                      */
/* ------------------------------------------------------------------------ */

static int in_read(mctx_t *c, mqp_t *q, conn_t *k)
{
    size_t budget = 8u << 20;
    while (budget) {
        if (k->istate == IN_RNR) {
            if (in_execute(c, q, k))
                return 0;
            continue;
        }
        if (k->istate == IN_HDR) {
            ssize_t r = recv(k->fd, (char *)&k->ih + k->ih_got, sizeof k->ih - k->ih_got,
                             MSG_DONTWAIT);
            if (r == 0)
                return -1;
            if (r < 0)
                return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
            k->ih_got += (size_t)r;
            if (k->ih_got < sizeof k->ih)
                continue;
            k->ih_got = 0;
            if (k->ih.magic != F_MAGIC)
                return -1;
            k->idone = 0;
            k->pay_mode = PAY_DISCARD;
            k->pay_err = 0;
            if (k->out) {
                q->last_progress = now_ms();
                k->ileft = k->ih.type == F_READ_RESP ? k->ih.len : 0;
                if (k->ih.type == F_READ_RESP && q->sq_ack < q->sq_tx)
                    k->pay_mode = PAY_SGE;
            } else if (k->ih.type == F_HELLO) {
                k->ileft = k->ih.len;
            } else if (!k->bound || k->blackhole || q->qp.state == IBV_QPS_ERR ||
                       q->qp.state == IBV_QPS_RESET) {
                k->ileft = k->ih.type == F_READ_REQ ? 0 : k->ih.len; /* dropped */
                if (!k->bound && !k->blackhole) {
                    stat_add(ST_DROPPED, 1);
                    trace("QP %06x: request before HELLO: dropping the connection",
                          q->qp.qp_num);
                    k->blackhole = 1;
                }
            } else {
                in_request(c, q, k);
            }
            k->istate = IN_PAY;
        }
        /* IN_PAY */
        if (k->ileft) {
            void *dst;
            size_t n;
            if (!k->out && k->ih.type == F_HELLO) {
                dst = k->hello_buf + k->idone;
                n = sizeof k->hello_buf - (size_t)k->idone;
                if (n > k->ileft)
                    n = (size_t)k->ileft;
                if (n == 0)
                    return -1;
            } else if (k->blackhole && !k->out) {
                static uint8_t sink[65536];
                dst = sink;
                n = k->ileft < sizeof sink ? (size_t)k->ileft : sizeof sink;
            } else {
                dst = in_sink(c, q, k, &n);
            }
            ssize_t r = recv(k->fd, dst, n, MSG_DONTWAIT);
            if (r == 0)
                return -1;
            if (r < 0)
                return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
            k->ileft -= (uint64_t)r;
            k->idone += (uint64_t)r;
            budget = (size_t)r >= budget ? 0 : budget - (size_t)r;
            if (k->out)
                q->last_progress = now_ms();
            if (k->ileft)
                continue;
        }
        /* whole frame in */
        k->istate = IN_HDR;
        if (k->out) {
            out_response(q, k);
            if (q->outc != k)
                return 1; /* the QP failed and closed this connection */
        } else if (k->ih.type == F_HELLO) {
            if (k->ih.len != sizeof(hello_t))
                return -1;
            if (!k->bound && !k->blackhole)
                hello_check(c, q, k, (const hello_t *)k->hello_buf);
        } else if (k->bound && !k->blackhole && q->qp.state != IBV_QPS_ERR &&
                   q->qp.state != IBV_QPS_RESET) {
            if (k->pay_mode == PAY_SMALL)
                small_land(c, k);
            if (k->pay_mode == PAY_LAZY)
                lazy_land(c, k);
            if (in_execute(c, q, k))
                return 0; /* RNR: this connection waits for a receive WR */
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Progress thread                                                           */
/* ------------------------------------------------------------------------ */

typedef struct pslot {
    int kind; /* 0 wake, 1 listener, 2 connection */
    mqp_t *qp;
    conn_t *k;
} pslot_t;

static int readable_state(const mqp_t *q)
{
    /* Before RTR a QP's receive side is off: packets are not taken (and
     * the sender retries). In error they are taken and dropped. */
    return q->qp.state != IBV_QPS_INIT && q->qp.state != IBV_QPS_RESET;
}

static void timers(mctx_t *c, double *next)
{
    double t = now_ms();
    for (mqp_t *q = c->qps; q; q = q->next) {
        if (q->qp.state != IBV_QPS_RTS || q->sq_ack == q->sq_post)
            continue;
        if (!q->outc && !q->out_broken) {
            dial(c, q);
            if (!q->outc && q->next_dial < *next)
                *next = q->next_dial;
        }
        if (q->sq_tx < q->sq_post) {
            double nb = q->sq[q->sq_tx % q->cap.max_send_wr].not_before;
            if (nb > t && nb < *next)
                *next = nb;
        }
        double win = retry_window_ms(q);
        if (win < 0)
            continue;
        double dl = q->last_progress + win;
        if (t >= dl) {
            stat_add(ST_RETRY_EXC, 1);
            trace("QP %06x: no answer from QP %06x for %.0f ms: retries exceeded", q->qp.qp_num,
                  q->dest_qpn, t - q->last_progress);
            qp_error(q, IBV_WC_RETRY_EXC_ERR);
        } else if (dl < *next) {
            *next = dl;
        }
    }
    for (mqp_t *q = c->qps; q; q = q->next)
        for (conn_t *k = q->inc; k; k = k->next)
            if (k->istate == IN_RNR && t + 5 < *next)
                *next = t + 5;
}

static void drop_in_conn(mctx_t *c, mqp_t *q, conn_t *k)
{
    conn_t **pp;
    for (pp = &q->inc; *pp && *pp != k; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = k->next;
    conn_close(c, k);
}

static void *progress_main(void *arg)
{
    mctx_t *c = arg;
    /* A NIC has no timer slack: latencies of microseconds stay so. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    size_t cap = 64;
    struct pollfd *pf = malloc(cap * sizeof *pf);
    pslot_t *ps = malloc(cap * sizeof *ps);
    pthread_mutex_lock(&c->mu);
    while (!c->stop && pf && ps) {
        /* Writes are attempted eagerly; poll only waits for what blocks. */
        for (mqp_t *q = c->qps; q; q = q->next) {
            if (q->outc && out_write(c, q, q->outc) < 0) {
                trace("QP %06x: connection to QP %06x lost", q->qp.qp_num, q->dest_qpn);
                conn_close(c, q->outc);
                q->outc = NULL;
                q->out_broken = 1;
            }
            for (conn_t *k = q->inc, *nk; k; k = nk) {
                nk = k->next;
                if (k->istate == IN_RNR && in_read(c, q, k) < 0) {
                    drop_in_conn(c, q, k);
                    continue;
                }
                if (out_write(c, q, k) != 0)
                    drop_in_conn(c, q, k);
            }
        }
        double next = now_ms() + 1000;
        timers(c, &next);
        size_t n = 0;
        size_t need = 1;
        for (mqp_t *q = c->qps; q; q = q->next) {
            need += 2;
            for (conn_t *k = q->inc; k; k = k->next)
                need++;
        }
        if (need > cap) {
            while (cap < need)
                cap *= 2;
            struct pollfd *npf = realloc(pf, cap * sizeof *pf);
            if (npf)
                pf = npf;
            pslot_t *nps = realloc(ps, cap * sizeof *ps);
            if (nps)
                ps = nps;
            if (!npf || !nps)
                break;
        }
        pf[n] = (struct pollfd){ c->wake_fd, POLLIN, 0 };
        ps[n++] = (pslot_t){ 0, NULL, NULL };
        for (mqp_t *q = c->qps; q; q = q->next) {
            pf[n] = (struct pollfd){ q->listen_fd, POLLIN, 0 };
            ps[n++] = (pslot_t){ 1, q, NULL };
            if (q->outc) {
                short ev = POLLIN;
                if (q->outc->ob_off < q->outc->ob_len || q->outc->tx_active)
                    ev |= POLLOUT;
                pf[n] = (struct pollfd){ q->outc->fd, ev, 0 };
                ps[n++] = (pslot_t){ 2, q, q->outc };
            }
            for (conn_t *k = q->inc; k; k = k->next) {
                short ev = 0;
                /* Backpressure: a responder with answers piling up stops
                 * taking requests, like a NIC out of responder resources. */
                if (readable_state(q) && k->istate != IN_RNR && k->ob_len - k->ob_off < (4u << 20))
                    ev |= POLLIN;
                if (k->ob_off < k->ob_len)
                    ev |= POLLOUT;
                pf[n] = (struct pollfd){ k->fd, ev, 0 };
                ps[n++] = (pslot_t){ 2, q, k };
            }
        }
        unsigned gen = c->gen;
        /* Microseconds, not poll's milliseconds: HCMOCK_IB_LAT_US. */
        double wait_ms = next - now_ms();
        if (wait_ms < 0)
            wait_ms = 0;
        struct timespec wts = { (time_t)(wait_ms / 1e3),
                                (long)((wait_ms - (double)(time_t)(wait_ms / 1e3) * 1e3) * 1e6) };
        pthread_mutex_unlock(&c->mu);
        int r = ppoll(pf, (nfds_t)n, &wts, NULL);
        pthread_mutex_lock(&c->mu);
        if (r <= 0 || c->stop)
            continue;
        if (pf[0].revents & POLLIN) {
            uint64_t v;
            if (read(c->wake_fd, &v, sizeof v) < 0) {
                /* nothing to drain */
            }
        }
        for (size_t i = 1; i < n && c->gen == gen; i++) {
            if (!pf[i].revents)
                continue;
            mqp_t *q = ps[i].qp;
            if (ps[i].kind == 1) {
                int fd = accept4(q->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    continue;
                conn_t *k = conn_new(c, q, fd, 0);
                if (!k) {
                    close(fd);
                    continue;
                }
                k->next = q->inc;
                q->inc = k;
                continue;
            }
            conn_t *k = ps[i].k;
            int rc = 0;
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR))
                rc = in_read(c, q, k);
            if (rc == 1)
                continue; /* k is gone */
            if (rc == 0 && (pf[i].revents & POLLOUT))
                rc = out_write(c, q, k);
            if (rc == 1)
                continue;
            if (rc < 0) {
                if (k->out) {
                    /* The peer closed (process gone, QP destroyed): nothing
                     * answers any more; outstanding WRs run into the retry
                     * limit, as on a NIC. */
                    trace("QP %06x: connection to QP %06x closed by the peer", q->qp.qp_num,
                          q->dest_qpn);
                    conn_close(c, k);
                    q->outc = NULL;
                    q->out_broken = 1;
                } else {
                    drop_in_conn(c, q, k);
                }
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(pf);
    free(ps);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Devices and contexts                                                      */
/* ------------------------------------------------------------------------ */

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

HCMOCK_API struct ibv_device **ibv_get_device_list(int *num)
{
    const char *root = sysfs_root();
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/sys/class/infiniband", root);
    char *names[256];
    int n = 0;
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && n < 256)
            if (e->d_name[0] != '.')
                names[n++] = strdup(e->d_name);
        closedir(d);
    }
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    struct ibv_device **list = calloc((size_t)n + 1, sizeof *list);
    if (!list) {
        for (int i = 0; i < n; i++)
            free(names[i]);
        errno = ENOMEM;
        return NULL;
    }
    int k = 0;
    pthread_mutex_lock(&g_devs_mu);
    for (int i = 0; i < n; i++) {
        if (!names[i])
            continue;
        mdev_t *m;
        for (m = g_devs; m; m = m->next)
            if (strcmp(m->dev.name, names[i]) == 0 && strcmp(m->root, root) == 0)
                break;
        if (!m && (m = calloc(1, sizeof *m))) {
            snprintf(m->dev.name, sizeof m->dev.name, "%s", names[i]);
            snprintf(m->dev.dev_name, sizeof m->dev.dev_name, "uverbs%d", i);
            snprintf(m->dev.ibdev_path, sizeof m->dev.ibdev_path, "%.180s/%.64s", path, names[i]);
            m->dev.node_type = IBV_NODE_CA;
            m->dev.transport_type = IBV_TRANSPORT_IB;
            snprintf(m->root, sizeof m->root, "%s", root);
            m->next = g_devs;
            g_devs = m;
        }
        if (m)
            list[k++] = &m->dev;
        free(names[i]);
    }
    pthread_mutex_unlock(&g_devs_mu);
    if (num)
        *num = k;
    return list;
}

HCMOCK_API void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

HCMOCK_API const char *ibv_get_device_name(struct ibv_device *dev)
{
    return dev ? dev->name : NULL;
}

static int mock_query_port_ex(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a,
                              size_t len);
static int mock_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int mock_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

HCMOCK_API struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
    mdev_t *md = NULL;
    pthread_mutex_lock(&g_devs_mu);
    for (mdev_t *m = g_devs; m; m = m->next)
        if (&m->dev == dev)
            md = m;
    pthread_mutex_unlock(&g_devs_mu);
    if (!md) {
        errno = ENODEV;
        return NULL;
    }
    mctx_t *c = calloc(1, sizeof *c);
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->dev = md;
    snprintf(c->root, sizeof c->root, "%s", md->root);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/sys/class/infiniband/%s/ports", c->root, md->dev.name);
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            int p = atoi(e->d_name);
            if (p > c->nports)
                c->nports = p;
        }
        closedir(d);
    }
    struct ibv_context *ic = &c->vc.context;
    ic->device = dev;
    ic->ops.poll_cq = mock_poll_cq;
    ic->ops.req_notify_cq = mock_req_notify_cq;
    ic->ops.post_send = mock_post_send;
    ic->ops.post_recv = mock_post_recv;
    ic->cmd_fd = -1;
    /* Blocking, as the kernel's: a caller that polls sets O_NONBLOCK. */
    c->async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    ic->async_fd = c->async_fd;
    ic->num_comp_vectors = 1;
    pthread_mutex_init(&ic->mutex, NULL);
    /* An extended context, as every provider of this rdma-core builds: the
     * inline ibv_query_port goes through vc.query_port. */
    ic->abi_compat = __VERBS_ABI_IS_EXTENDED;
    c->vc.sz = sizeof(struct verbs_context);
    c->vc.query_port = mock_query_port_ex;
    pthread_mutex_init(&c->mu, NULL);
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)now_ms();
    c->rnd = seed | 1;
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->wake_fd < 0 || c->async_fd < 0 ||
        pthread_create(&c->thr, NULL, progress_main, c) != 0) {
        int e = errno;
        if (c->wake_fd >= 0)
            close(c->wake_fd);
        if (c->async_fd >= 0)
            close(c->async_fd);
        free(c);
        errno = e ? e : EAGAIN;
        return NULL;
    }
    c->thr_started = 1;
    pthread_mutex_lock(&g_devs_mu);
    mctx_t **pp = &g_ctxs;
    while (*pp)
        pp = &(*pp)->next_ctx;
    *pp = c;
    pthread_mutex_unlock(&g_devs_mu);
    stat_add(ST_LIVE_CTX, 1);
    return ic;
}

static void qp_free(mctx_t *c, mqp_t *q);

HCMOCK_API int ibv_close_device(struct ibv_context *ic)
{
    if (!ic)
        return EINVAL;
    mctx_t *c = ctx_of(ic);
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    if (c->thr_started)
        pthread_join(c->thr, NULL);
    /* Like the kernel closing the uverbs fd: whatever is left goes. */
    while (c->qps) {
        mqp_t *q = c->qps;
        c->qps = q->next;
        qp_free(c, q);
    }
    close(c->wake_fd);
    pthread_mutex_lock(&g_devs_mu);
    for (mctx_t **pp = &g_ctxs; *pp; pp = &(*pp)->next_ctx)
        if (*pp == c) {
            *pp = c->next_ctx;
            break;
        }
    pthread_mutex_unlock(&g_devs_mu);
    if (c->unacked)
        trace("ibv_close_device with %d async event(s) not acknowledged", c->unacked);
    close(c->async_fd);
    free(c->aq);
    while (c->lazy) {
        lazy_write_t *w = c->lazy;
        c->lazy = w->next;
        free(w);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
    stat_sub(ST_LIVE_CTX);
    return 0;
}

static int port_attr_fill(mctx_t *c, uint8_t port, struct ibv_port_attr *a)
{
    port_info_t pi;
    if (port < 1 || port > c->nports || port_load(c->root, c->dev->dev.name, port, &pi) != 0)
        return EINVAL;
    memset(a, 0, sizeof *a);
    a->state = c->port_down ? IBV_PORT_DOWN : (enum ibv_port_state)pi.state;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = (enum ibv_mtu)pi.active_mtu;
    a->gid_tbl_len = pi.gid_tbl_len;
    a->max_msg_sz = MAX_MSG;
    a->pkey_tbl_len = pi.link_layer == IBV_LINK_LAYER_INFINIBAND ? 128 : 1;
    a->lid = pi.lid;
    a->sm_lid = pi.link_layer == IBV_LINK_LAYER_INFINIBAND ? 1 : 0;
    a->max_vl_num = 4;
    a->active_width = 2; /* 4X */
    a->active_speed = 64; /* HDR */
    a->phys_state = pi.state == IBV_PORT_ACTIVE ? 5 : 3; /* LinkUp : Disabled */
    a->link_layer = (uint8_t)pi.link_layer;
    return 0;
}

static int mock_query_port_ex(struct ibv_context *ic, uint8_t port, struct ibv_port_attr *a,
                              size_t len)
{
    struct ibv_port_attr full;
    int rc = port_attr_fill(ctx_of(ic), port, &full);
    if (rc)
        return rc;
    memcpy(a, &full, len < sizeof full ? len : sizeof full);
    return 0;
}

/* The exported entry point has the older, shorter layout (it ends before
 * port_cap_flags2). */
HCMOCK_API int ibv_query_port(struct ibv_context *ic, uint8_t port,
                              struct _compat_ibv_port_attr *a)
{
    return mock_query_port_ex(ic, port, (struct ibv_port_attr *)(void *)a,
                              offsetof(struct ibv_port_attr, port_cap_flags2));
}

HCMOCK_API int ibv_query_gid(struct ibv_context *ic, uint8_t port, int index, union ibv_gid *gid)
{
    mctx_t *c = ctx_of(ic);
    port_info_t pi;
    if (port < 1 || port > c->nports || port_load(c->root, c->dev->dev.name, port, &pi) != 0 ||
        index < 0 || index >= pi.gid_tbl_len) {
        errno = EINVAL;
        return -1;
    }
    if (gid_load(c->root, c->dev->dev.name, port, index, gid->raw, NULL) != 0)
        memset(gid->raw, 0, 16); /* an unused slot reads as zero */
    return 0;
}

HCMOCK_API int ibv_query_device(struct ibv_context *ic, struct ibv_device_attr *a)
{
    mctx_t *c = ctx_of(ic);
    memset(a, 0, sizeof *a);
    snprintf(a->fw_ver, sizeof a->fw_ver, "hcmock-verbs");
    a->max_mr_size = UINT64_MAX;
    a->page_size_cap = 0xfffff000;
    a->vendor_id = 0x02c9;
    a->max_qp = 1 << 17;
    a->max_qp_wr = MAX_WR;
    a->max_sge = MAX_SGE;
    a->max_cq = 1 << 16;
    a->max_cqe = MAX_CQE;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 20;
    a->max_qp_rd_atom = MAX_RD_ATOM;
    a->max_qp_init_rd_atom = MAX_RD_ATOM;
    a->max_pkeys = 128;
    a->phys_port_cnt = (uint8_t)c->nports;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* PD, CQ                                                                    */
/* ------------------------------------------------------------------------ */

HCMOCK_API struct ibv_pd *ibv_alloc_pd(struct ibv_context *ic)
{
    mpd_t *p = calloc(1, sizeof *p);
    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    p->pd.context = ic;
    p->pd.handle = (uint32_t)(uintptr_t)p;
    stat_add(ST_LIVE_PD, 1);
    return &p->pd;
}

HCMOCK_API int ibv_dealloc_pd(struct ibv_pd *pd)
{
    mctx_t *c = ctx_of(pd->context);
    pthread_mutex_lock(&c->mu);
    int busy = ((mpd_t *)pd)->users > 0;
    pthread_mutex_unlock(&c->mu);
    if (busy) {
        trace("ibv_dealloc_pd: %d MR(s)/QP(s) still use it", ((mpd_t *)pd)->users);
        return EBUSY;
    }
    free(pd);
    stat_sub(ST_LIVE_PD);
    return 0;
}

HCMOCK_API struct ibv_cq *ibv_create_cq(struct ibv_context *ic, int cqe, void *cq_context,
                                        struct ibv_comp_channel *channel, int comp_vector)
{
    if (cqe < 1 || cqe > MAX_CQE || comp_vector < 0 || comp_vector >= ic->num_comp_vectors) {
        errno = EINVAL;
        return NULL;
    }
    mcq_t *q = calloc(1, sizeof *q);
    cqe_t *ring = calloc((size_t)cqe, sizeof *ring);
    if (!q || !ring) {
        free(q);
        free(ring);
        errno = ENOMEM;
        return NULL;
    }
    q->cq.context = ic;
    q->cq.channel = channel;
    q->cq.cq_context = cq_context;
    /* Exactly what was asked: a NIC rounds up, which would hide a CQ sized
     * too small by a little. */
    q->cq.cqe = cqe;
    pthread_mutex_init(&q->cq.mutex, NULL);
    pthread_cond_init(&q->cq.cond, NULL);
    q->cap = cqe;
    q->ring = ring;
    if (channel) {
        pthread_mutex_lock(&ctx_of(ic)->mu);
        channel->refcnt++;
        pthread_mutex_unlock(&ctx_of(ic)->mu);
    }
    stat_add(ST_LIVE_CQ, 1);
    return &q->cq;
}

HCMOCK_API int ibv_destroy_cq(struct ibv_cq *cq)
{
    mctx_t *c = ctx_of(cq->context);
    mcq_t *q = (mcq_t *)cq;
    pthread_mutex_lock(&c->mu);
    /* libibverbs waits for every event's acknowledgement: a destroy that
     * would block forever is EBUSY here. */
    int busy = q->users > 0 || q->events != q->acked;
    if (!busy && cq->channel)
        cq->channel->refcnt--;
    pthread_mutex_unlock(&c->mu);
    if (busy)
        return EBUSY;
    pthread_mutex_destroy(&cq->mutex);
    pthread_cond_destroy(&cq->cond);
    free(q->ring);
    free(q);
    stat_sub(ST_LIVE_CQ);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Queue pairs                                                               */
/* ------------------------------------------------------------------------ */

HCMOCK_API struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    if (!pd || !ia || !ia->send_cq || !ia->recv_cq) {
        errno = EINVAL;
        return NULL;
    }
    if (ia->qp_type != IBV_QPT_RC || ia->srq) {
        errno = EOPNOTSUPP; /* only RC without SRQ is emulated */
        return NULL;
    }
    const struct ibv_qp_cap *cp = &ia->cap;
    if (cp->max_send_wr < 1 || cp->max_send_wr > MAX_WR || cp->max_recv_wr < 1 ||
        cp->max_recv_wr > MAX_WR || cp->max_send_sge > MAX_SGE || cp->max_recv_sge > MAX_SGE ||
        cp->max_inline_data > MAX_INLINE) {
        errno = EINVAL;
        return NULL;
    }
    mctx_t *c = ctx_of(pd->context);
    mqp_t *q = calloc(1, sizeof *q);
    if (!q) {
        errno = ENOMEM;
        return NULL;
    }
    q->sq = calloc(cp->max_send_wr, sizeof *q->sq);
    q->rq = calloc(cp->max_recv_wr, sizeof *q->rq);
    q->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (!q->sq || !q->rq || q->listen_fd < 0) {
        int e = q->listen_fd < 0 ? errno : ENOMEM;
        if (q->listen_fd >= 0)
            close(q->listen_fd);
        free(q->sq);
        free(q->rq);
        free(q);
        errno = e;
        return NULL;
    }
    /* The QPN is whatever name this process manages to own. */
    pthread_mutex_lock(&c->mu);
    uint32_t qpn = 0;
    for (int tries = 0; tries < 1000 && !qpn; tries++) {
        uint32_t cand = (uint32_t)(rnd_next(c) & 0xffffff);
        if (cand < 2)
            continue;
        struct sockaddr_un sa;
        socklen_t sl;
        qp_addr(cand, &sa, &sl);
        if (bind(q->listen_fd, (struct sockaddr *)&sa, sl) == 0)
            qpn = cand;
    }
    if (!qpn || listen(q->listen_fd, 16) != 0) {
        pthread_mutex_unlock(&c->mu);
        close(q->listen_fd);
        free(q->sq);
        free(q->rq);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->ctx = c;
    q->qp.context = pd->context;
    q->qp.qp_context = ia->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = ia->send_cq;
    q->qp.recv_cq = ia->recv_cq;
    q->qp.handle = qpn;
    q->qp.qp_num = qpn;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&q->qp.mutex, NULL);
    pthread_cond_init(&q->qp.cond, NULL);
    q->cap = *cp;
    if (q->cap.max_send_sge == 0)
        q->cap.max_send_sge = 1;
    ia->cap = q->cap; /* the caps granted: exactly those asked */
    q->sq_sig_all = ia->sq_sig_all;
    ((mpd_t *)pd)->users++;
    ((mcq_t *)ia->send_cq)->users++;
    ((mcq_t *)ia->recv_cq)->users++;
    q->next = c->qps;
    c->qps = q;
    c->gen++;
    pthread_mutex_unlock(&c->mu);
    stat_add(ST_QPS, 1);
    stat_add(ST_LIVE_QP, 1);
    wake(c);
    return &q->qp;
}

static void qp_free(mctx_t *c, mqp_t *q)
{
    conn_close(c, q->outc);
    while (q->inc) {
        conn_t *k = q->inc;
        q->inc = k->next;
        conn_close(c, k);
    }
    close(q->listen_fd);
    for (uint64_t s = 0; s < q->cap.max_send_wr; s++)
        free(q->sq[s].inl);
    free(q->sq);
    free(q->rq);
    pthread_mutex_destroy(&q->qp.mutex);
    pthread_cond_destroy(&q->qp.cond);
    free(q);
    stat_sub(ST_LIVE_QP);
}

HCMOCK_API int ibv_destroy_qp(struct ibv_qp *qp)
{
    mctx_t *c = ctx_of(qp->context);
    mqp_t *q = (mqp_t *)qp;
    pthread_mutex_lock(&c->mu);
    mqp_t **pp;
    for (pp = &c->qps; *pp && *pp != q; pp = &(*pp)->next)
        ;
    if (!*pp) {
        pthread_mutex_unlock(&c->mu);
        return EINVAL;
    }
    *pp = q->next;
    ((mpd_t *)qp->pd)->users--;
    ((mcq_t *)qp->send_cq)->users--;
    ((mcq_t *)qp->recv_cq)->users--;
    /* Its number stops answering: a peer still sending runs into its retry
     * limit (the sockets close; the peer's QP sees nothing more). */
    qp_free(c, q);
    c->gen++;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    return 0;
}

static int transition_masks(int cur, int next, int *req, int *opt)
{
    *req = IBV_QP_STATE;
    *opt = 0;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
        return 0;
    if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
        *req |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        return 0;
    }
    if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
        *opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        return 0;
    }
    if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
        *req |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        *opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
        return 0;
    }
    if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
        *req |= IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                IBV_QP_TIMEOUT;
        *opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
               IBV_QP_PATH_MIG_STATE;
        return 0;
    }
    if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
        *opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
               IBV_QP_MIN_RNR_TIMER;
        return 0;
    }
    return -1; /* SQD/SQE and everything else: not emulated or not allowed */
}

static int av_check(mctx_t *c, const struct ibv_ah_attr *ah, char *why, size_t len)
{
    port_info_t pi;
    if (ah->port_num < 1 || ah->port_num > c->nports ||
        port_load(c->root, c->dev->dev.name, ah->port_num, &pi) != 0) {
        snprintf(why, len, "address vector port %d does not exist", ah->port_num);
        return -1;
    }
    if (pi.link_layer == IBV_LINK_LAYER_ETHERNET) {
        uint8_t g[16];
        if (!ah->is_global) {
            snprintf(why, len, "RoCE needs a GRH (is_global = 1)");
            return -1;
        }
        if (ah->grh.sgid_index >= pi.gid_tbl_len ||
            gid_load(c->root, c->dev->dev.name, ah->port_num, ah->grh.sgid_index, g, NULL) != 0 ||
            gid_is_zero(g)) {
            snprintf(why, len, "sgid_index %d is not a valid GID of port %d", ah->grh.sgid_index,
                     ah->port_num);
            return -1;
        }
        /* RoCE v2 is IP: the kernel resolves the destination's MAC from the
         * source GID's netdev, which cannot reach an IPv6 address from an
         * IPv4 one or the other way round. */
        if (gid_is_v4mapped(g) != gid_is_v4mapped(ah->grh.dgid.raw) ||
            gid_is_zero(ah->grh.dgid.raw)) {
            char sg[64], dg[64];
            gid_str(g, sg, sizeof sg);
            gid_str(ah->grh.dgid.raw, dg, sizeof dg);
            snprintf(why, len, "no route from source GID %s to destination GID %s", sg, dg);
            return -2;
        }
    } else if (ah->dlid == 0) {
        snprintf(why, len, "InfiniBand needs a DLID");
        return -1;
    }
    return 0;
}

HCMOCK_API int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    mctx_t *c = ctx_of(qp->context);
    mqp_t *q = (mqp_t *)qp;
    char why[256] = "";
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    int cur = q->qp.state;
    int next = (mask & IBV_QP_STATE) ? (int)a->qp_state : cur;
    int req, opt;
    if (!(mask & IBV_QP_STATE) || transition_masks(cur, next, &req, &opt) != 0) {
        snprintf(why, sizeof why, "transition %d -> %d is not allowed", cur, next);
        rc = EINVAL;
    } else if ((mask & req) != req) {
        snprintf(why, sizeof why, "%d -> %d lacks attributes 0x%x", cur, next, req & ~mask);
        rc = EINVAL;
    } else if (mask & ~(req | opt)) {
        snprintf(why, sizeof why, "%d -> %d does not take attributes 0x%x", cur, next,
                 mask & ~(req | opt));
        rc = EINVAL;
    } else if ((mask & IBV_QP_CUR_STATE) && (int)a->cur_qp_state != cur) {
        snprintf(why, sizeof why, "cur_qp_state %d but the QP is in %d", a->cur_qp_state, cur);
        rc = EINVAL;
    } else if ((mask & IBV_QP_PORT) && (a->port_num < 1 || a->port_num > c->nports)) {
        snprintf(why, sizeof why, "port %d does not exist", a->port_num);
        rc = EINVAL;
    } else if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0) {
        snprintf(why, sizeof why, "pkey_index %d", a->pkey_index);
        rc = EINVAL;
    } else if ((mask & IBV_QP_ACCESS_FLAGS) &&
               (a->qp_access_flags & ~(unsigned)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                 IBV_ACCESS_REMOTE_READ |
                                                 IBV_ACCESS_REMOTE_ATOMIC))) {
        snprintf(why, sizeof why, "qp_access_flags 0x%x", a->qp_access_flags);
        rc = EINVAL;
    } else if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096)) {
        snprintf(why, sizeof why, "path_mtu %d", a->path_mtu);
        rc = EINVAL;
    } else if ((mask & IBV_QP_DEST_QPN) && (a->dest_qp_num > 0xffffff || a->dest_qp_num < 2)) {
        snprintf(why, sizeof why, "dest_qp_num 0x%x", a->dest_qp_num);
        rc = EINVAL;
    } else if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num == qp->qp_num &&
               env_int("HCMOCK_IB_LOOPBACK_FAIL", 0) > 0) {
        snprintf(why, sizeof why, "a QP connected to itself (HCMOCK_IB_LOOPBACK_FAIL)");
        rc = env_int("HCMOCK_IB_LOOPBACK_FAIL", 0);
    } else if ((mask & IBV_QP_AV) && (rc = av_check(c, &a->ah_attr, why, sizeof why)) != 0) {
        rc = rc == -2 ? EHOSTUNREACH : EINVAL;
    } else if (((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > MAX_RD_ATOM) ||
               ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > MAX_RD_ATOM)) {
        snprintf(why, sizeof why, "rd_atomic %d/%d above %d", a->max_rd_atomic,
                 a->max_dest_rd_atomic, MAX_RD_ATOM);
        rc = EINVAL;
    } else if (((mask & IBV_QP_TIMEOUT) && a->timeout > 31) ||
               ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) ||
               ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) ||
               ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)) {
        snprintf(why, sizeof why, "timeout %d retry_cnt %d rnr_retry %d min_rnr_timer %d",
                 a->timeout, a->retry_cnt, a->rnr_retry, a->min_rnr_timer);
        rc = EINVAL;
    } else if ((mask & IBV_QP_PATH_MTU) && q->port &&
               (int)a->path_mtu > IBV_MTU_4096 /* the port's max_mtu */) {
        rc = EINVAL;
    }
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        trace("ibv_modify_qp(QP %06x): %s: %s", qp->qp_num, strerror(rc), why);
        errno = rc;
        return rc;
    }
    if (mask & IBV_QP_PORT)
        q->port = a->port_num;
    if (mask & IBV_QP_ACCESS_FLAGS)
        q->access = (int)a->qp_access_flags;
    if (mask & IBV_QP_AV)
        q->ah = a->ah_attr;
    if (mask & IBV_QP_PATH_MTU)
        q->path_mtu = a->path_mtu;
    if (mask & IBV_QP_DEST_QPN)
        q->dest_qpn = a->dest_qp_num;
    if (mask & IBV_QP_RQ_PSN)
        q->rq_psn = q->epsn = a->rq_psn & 0xffffff;
    if (mask & IBV_QP_MIN_RNR_TIMER)
        q->min_rnr_timer = a->min_rnr_timer;
    if (mask & IBV_QP_SQ_PSN)
        q->sq_psn = q->next_psn = a->sq_psn & 0xffffff;
    if (mask & IBV_QP_TIMEOUT)
        q->timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT)
        q->retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY)
        q->rnr_retry = a->rnr_retry;
    if (next == IBV_QPS_ERR) {
        qp_error(q, 0);
    } else if (next == IBV_QPS_RESET) {
        /* Back to square one, without completions. */
        conn_close(c, q->outc);
        q->outc = NULL;
        q->out_broken = 0;
        while (q->inc) {
            conn_t *k = q->inc;
            q->inc = k->next;
            conn_close(c, k);
        }
        q->sq_post = q->sq_tx = q->sq_ack = q->sq_free = 0;
        q->rq_post = q->rq_cons = q->rq_free = 0;
    }
    q->qp.state = (enum ibv_qp_state)next;
    if (next == IBV_QPS_RTS && cur == IBV_QPS_RTR)
        q->last_progress = now_ms();
    c->gen++;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    return 0;
}

static int mock_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    mctx_t *c = ctx_of(qp->context);
    mqp_t *q = (mqp_t *)qp;
    int rc = 0;
    stat_add(ST_POST_SENDS, 1);
    pthread_mutex_lock(&c->mu);
    for (; wr; wr = wr->next) {
        int st = q->qp.state;
        if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) {
            rc = EINVAL; /* RESET/INIT/RTR: the send queue is not running */
            break;
        }
        if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
            wr->opcode != IBV_WR_RDMA_READ) {
            rc = EINVAL; /* SEND, atomics, ...: not emulated */
            break;
        }
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge) {
            rc = EINVAL;
            break;
        }
        uint64_t len = 0;
        for (int i = 0; i < wr->num_sge; i++)
            len += wr->sg_list[i].length;
        const int inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
        if (inl && wr->opcode == IBV_WR_RDMA_READ) {
            rc = EINVAL;
            break;
        }
        if (inl && len > q->cap.max_inline_data) {
            rc = ENOMEM; /* as mlx5 answers it */
            break;
        }
        if (q->sq_post - q->sq_free >= q->cap.max_send_wr) {
            rc = ENOMEM; /* send queue full */
            break;
        }
        if (wr->opcode != IBV_WR_RDMA_READ && len > 64 &&
            ((wr->wr.rdma.remote_addr | (wr->num_sge ? wr->sg_list[0].addr : 0)) & 63))
            stat_add(ST_MISALIGNED, 1);
        swqe_t *w = &q->sq[q->sq_post % q->cap.max_send_wr];
        free(w->inl);
        memset(w, 0, sizeof *w);
        w->wr_id = wr->wr_id;
        w->opcode = wr->opcode;
        w->signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
        w->nsge = wr->num_sge;
        if (wr->num_sge)
            memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *w->sge);
        w->len = (uint32_t)len;
        w->raddr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
        w->imm = wr->imm_data;
        if (inl && len) {
            /* Inline data is copied now: the buffer may die on return. */
            w->inl = malloc(len);
            if (!w->inl) {
                rc = ENOMEM;
                break;
            }
            uint64_t o = 0;
            for (int i = 0; i < wr->num_sge; i++) {
                memcpy(w->inl + o, (void *)(uintptr_t)wr->sg_list[i].addr,
                       wr->sg_list[i].length);
                o += wr->sg_list[i].length;
            }
        }
        if (q->sq_ack == q->sq_post)
            q->last_progress = now_ms(); /* the retry timer starts */
        uint64_t seq = q->sq_post++;
        if (st == IBV_QPS_ERR) {
            send_complete(q, seq, IBV_WC_WR_FLUSH_ERR);
            q->sq_ack = q->sq_tx = q->sq_post;
            stat_add(ST_FLUSHED, 1);
            continue;
        }
        if (len > MAX_MSG)
            w->local_err = IBV_WC_LOC_LEN_ERR; /* reported when the NIC gets to it */
        w->psn = q->next_psn;
        q->next_psn = (q->next_psn + npkts(q, w->len)) & 0xffffff;
        /* Adversarial timing: a caller that reuses a source buffer before
         * the completion sends the new bytes. */
        int delay_us = env_int("HCMOCK_IB_TX_DELAY_US", 0);
        if (env_int("HCMOCK_IB_LAT_US", 0) > delay_us)
            delay_us = env_int("HCMOCK_IB_LAT_US", 0);
        if (delay_us > 0)
            w->not_before = now_ms() + delay_us / 1e3;
    }
    if (rc && bad)
        *bad = wr;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    return rc;
}

static int mock_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    mctx_t *c = ctx_of(qp->context);
    mqp_t *q = (mqp_t *)qp;
    int rc = 0;
    stat_add(ST_POST_SENDS, 1);
    pthread_mutex_lock(&c->mu);
    for (; wr; wr = wr->next) {
        if (q->qp.state == IBV_QPS_RESET || wr->num_sge < 0 ||
            (uint32_t)wr->num_sge > q->cap.max_recv_sge) {
            rc = EINVAL;
            break;
        }
        if (q->rq_post - q->rq_free >= q->cap.max_recv_wr) {
            rc = ENOMEM; /* receive queue full */
            break;
        }
        uint64_t seq = q->rq_post++;
        q->rq[seq % q->cap.max_recv_wr] = wr->wr_id;
        if (q->qp.state == IBV_QPS_ERR) {
            struct ibv_wc wc;
            wc_error_fill(&wc, wr->wr_id, IBV_WC_WR_FLUSH_ERR, q->qp.qp_num);
            cq_push((mcq_t *)q->qp.recv_cq, &wc, 0, seq);
            q->rq_cons = q->rq_post;
            stat_add(ST_FLUSHED, 1);
        }
    }
    if (rc && bad)
        *bad = wr;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* For tests                                                                 */
/* ------------------------------------------------------------------------ */

HCMOCK_API const char *hcmock_verbs(void)
{
    return "hcoll-mock-verbs";
}

static int float_cmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Quantile q (0..1) of the pickup delays recorded since the last reset,
 * microseconds; -1 when none were. reset: forget them afterwards. */
HCMOCK_API double hcmock_verbs_pickup_us(double q, int reset)
{
    static float tmp[PICKUP_MAX];
    pthread_mutex_lock(&g_pickup_mu);
    size_t n = g_pickups < PICKUP_MAX ? (size_t)g_pickups : PICKUP_MAX;
    memcpy(tmp, g_pickup_us, n * sizeof *tmp);
    if (reset)
        g_pickups = 0;
    pthread_mutex_unlock(&g_pickup_mu);
    if (n == 0)
        return -1;
    qsort(tmp, n, sizeof *tmp, float_cmp);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return tmp[i < n ? i : n - 1];
}

/* This process's count of one event (stat_names), or UINT64_MAX for an
 * unknown name. */
HCMOCK_API uint64_t hcmock_verbs_stat(const char *name)
{
    for (int i = 0; i < ST_COUNT; i++)
        if (strcmp(name, stat_names[i]) == 0)
            return atomic_load_explicit(&g_stats[i], memory_order_relaxed);
    return UINT64_MAX;
}

/* ------------------------------------------------------------------------ */
/* Async events                                                              */
/* ------------------------------------------------------------------------ */

/* The next event: blocks on a blocking async_fd, EAGAIN on one the caller
 * made O_NONBLOCK (the fd's count is the queue's length). */
HCMOCK_API int ibv_get_async_event(struct ibv_context *ic, struct ibv_async_event *event)
{
    if (!ic || !event) {
        errno = EINVAL;
        return -1;
    }
    mctx_t *c = ctx_of(ic);
    uint64_t one;
    if (read(c->async_fd, &one, sizeof one) != (ssize_t)sizeof one)
        return -1; /* errno: EAGAIN when non-blocking and none is queued */
    pthread_mutex_lock(&c->mu);
    int got = c->naq > 0;
    if (got) {
        *event = c->aq[0];
        memmove(c->aq, c->aq + 1, (size_t)(c->naq - 1) * sizeof *c->aq);
        c->naq--;
        c->unacked++;
    }
    pthread_mutex_unlock(&c->mu);
    if (!got) {
        errno = EAGAIN;
        return -1;
    }
    return 0;
}

HCMOCK_API void ibv_ack_async_event(struct ibv_async_event *event)
{
    if (!event)
        return;
    struct ibv_context *ic = NULL;
    if (event->event_type == IBV_EVENT_CQ_ERR && event->element.cq)
        ic = event->element.cq->context;
    else if (event->event_type != IBV_EVENT_PORT_ERR &&
             event->event_type != IBV_EVENT_PORT_ACTIVE &&
             event->event_type != IBV_EVENT_GID_CHANGE &&
             event->event_type != IBV_EVENT_DEVICE_FATAL && event->element.qp)
        ic = event->element.qp->context;
    pthread_mutex_lock(&g_devs_mu);
    for (mctx_t *c = g_ctxs; c; c = c->next_ctx)
        if (!ic || &c->vc.context == ic) {
            pthread_mutex_lock(&c->mu);
            if (c->unacked > 0) {
                c->unacked--;
                pthread_mutex_unlock(&c->mu);
                break;
            }
            pthread_mutex_unlock(&c->mu);
        }
    pthread_mutex_unlock(&g_devs_mu);
}

/* A QP of c connected to another QP, in RTS (NULL: none). */
static mqp_t *busy_qp(mctx_t *c)
{
    for (mqp_t *q = c->qps; q; q = q->next)
        if (q->qp.state == IBV_QPS_RTS && q->dest_qpn != q->qp.qp_num)
            return q;
    return NULL;
}

/*
 * For tests: raise an async event on this process's oldest context that has
 * a connected QP, with the fault behind it. Returns 0, or -1 (unknown kind,
 * no such context). kind:
 *   "port_down"   IBV_EVENT_PORT_ERR; the port reads DOWN, every QP fails
 *   "qp_fatal"    IBV_EVENT_QP_FATAL on one QP, which fails (WRs flushed)
 *   "access_err"  IBV_EVENT_QP_ACCESS_ERR on one QP, which fails
 *   "cq_overrun"  IBV_EVENT_CQ_ERR on that QP's CQ, which loses every
 *                 completion from now on (polling it still answers)
 */
HCMOCK_API int hcmock_verbs_inject_async(const char *kind)
{
    int rc = -1;
    pthread_mutex_lock(&g_devs_mu);
    for (mctx_t *c = g_ctxs; c && rc != 0; c = c->next_ctx) {
        pthread_mutex_lock(&c->mu);
        mqp_t *q = busy_qp(c);
        if (q && strcmp(kind, "port_down") == 0) {
            c->port_down = 1;
            async_push(c, IBV_EVENT_PORT_ERR, NULL, q->port ? q->port : 1);
            for (mqp_t *x = c->qps; x; x = x->next)
                qp_error(x, 0);
            rc = 0;
        } else if (q && strcmp(kind, "qp_fatal") == 0) {
            async_push(c, IBV_EVENT_QP_FATAL, &q->qp, 0);
            qp_error(q, 0);
            rc = 0;
        } else if (q && strcmp(kind, "access_err") == 0) {
            async_push(c, IBV_EVENT_QP_ACCESS_ERR, &q->qp, 0);
            qp_error(q, 0);
            rc = 0;
        } else if (q && strcmp(kind, "cq_overrun") == 0) {
            mcq_t *cq = (mcq_t *)q->qp.recv_cq;
            if (!cq->overrun)
                stat_add(ST_CQ_OVERRUN, 1);
            cq->overrun = 1;
            async_push(c, IBV_EVENT_CQ_ERR, &cq->cq, 0);
            rc = 0;
        }
        pthread_mutex_unlock(&c->mu);
        if (rc == 0)
            wake(c);
    }
    pthread_mutex_unlock(&g_devs_mu);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* fork                                                                      */
/* ------------------------------------------------------------------------ */

/*
 * A child forked while MRs are live shares their pages copy-on-write; the
 * NIC keeps the parent's old physical pages, so the parent's next write to
 * a registered buffer lands where the NIC no longer looks (kernels before
 * 5.13 lack copy-on-fork for pinned pages). ibv_fork_init (or
 * RDMAV_FORK_SAFE) marks registered ranges MADV_DONTFORK first. Here such
 * a fork is counted ("unsafe_forks"); HCMOCK_IB_COPY_ON_FORK=1 is a kernel
 * that copies pinned pages at fork, where nothing is needed.
 */
static atomic_int g_fork_inited;

static int copy_on_fork(void)
{
    return env_int("HCMOCK_IB_COPY_ON_FORK", 0) == 1;
}

static int fork_safe_env(void)
{
    const char *a = getenv("RDMAV_FORK_SAFE"), *b = getenv("IBV_FORK_SAFE");
    return (a && *a && strcmp(a, "0") != 0) || (b && *b && strcmp(b, "0") != 0);
}

static void fork_prepare(void)
{
    if (atomic_load(&g_stats[ST_LIVE_MR]) > 0 && !copy_on_fork() && !atomic_load(&g_fork_inited) &&
        !fork_safe_env()) {
        stat_add(ST_UNSAFE_FORKS, 1);
        trace("fork with %llu live MR(s) and no ibv_fork_init: the parent's registered pages "
              "may go astray",
              (unsigned long long)atomic_load(&g_stats[ST_LIVE_MR]));
    }
}

__attribute__((constructor)) static void fork_hook(void)
{
    pthread_atfork(fork_prepare, NULL, NULL);
}

/* Too late once a region exists (rdma-core: EINVAL). */
HCMOCK_API int ibv_fork_init(void)
{
    if (copy_on_fork())
        return 0;
    if (atomic_load(&g_stats[ST_MR_REGS]) > 0 && !atomic_load(&g_fork_inited))
        return EINVAL;
    atomic_store(&g_fork_inited, 1);
    return 0;
}

HCMOCK_API enum ibv_fork_status ibv_is_fork_initialized(void)
{
    if (copy_on_fork())
        return IBV_FORK_UNNEEDED;
    return atomic_load(&g_fork_inited) || fork_safe_env() ? IBV_FORK_ENABLED : IBV_FORK_DISABLED;
}
