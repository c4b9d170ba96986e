/*
 * Shared-memory intra-node backend for host buffers.
 *
 * One POSIX segment per node and communicator. Every local rank owns
 * NSLOTS slots of slot_bytes; a call is cut into steps, step g uses slot
 * g % NSLOTS of every rank, so while the owners reduce step g the ranks
 * already fill step g+1 (double buffering).
 *
 *   reduce-scatter, step g (L = 3; sub-piece j of a slot belongs to shard j)
 *
 *     rank 0 sendbuf ─copy─► slot0[g%2] = | s0 | s1 | s2 |
 *     rank 1 sendbuf ─copy─► slot1[g%2] = | s0 | s1 | s2 |
 *     rank 2 sendbuf ─copy─► slot2[g%2] = | s0 | s1 | s2 |
 *                                            │    │    └─► rank 2: ((s2@0 op s2@1) op s2@2)
 *                                            │    └──────► rank 1: ((s1@0 op s1@1) op s1@2)
 *                                            └───────────► rank 0: ((s0@0 op s0@1) op s0@2)
 *                                                          into recvbuf at shard j's offset
 *   (an owner reads its own term from its sendbuf, so it skips copying its
 *   own sub-piece, unless sendbuf == recvbuf: then the result would
 *   overwrite the term before it is read, and the term goes through the
 *   slot like the others.)
 *
 *   all-gather, step g: rank j copies a piece of its shard into its slot,
 *   every other rank copies it out to recvbuf at shard j's offset.
 *
 *   allreduce (fused), step g: every rank copies a piece of the whole
 *   vector into its slot, then every rank folds all L slots into recvbuf:
 *
 *     rank q sendbuf[piece g] ─copy─► slotq[g%2]     (q = 0..L-1)
 *     every rank: recvbuf[piece g] = ((slot0 op slot1) op slot2) ...
 *
 *   one synchronisation per step instead of RS's and AG's two, at the price
 *   of L times the reads and folds: the latency path for small vectors.
 *   The fold order is RS's, so the bits equal RS then AG.
 *
 * Every element is folded in local-rank order 0,1,..,L-1 by exactly one
 * rank, so results are bit-identical on all ranks.
 *
 * Synchronisation, per rank in the segment: posted (steps published) and
 * done (steps consumed), monotonic over the life of the segment, so
 * successive calls never mix. Publishing step g waits for every done >=
 * g-NSLOTS+1 (nobody still reads the slot); consuming waits for every
 * posted >= g+1. Each rank runs publish(0), then publish(k+1) before
 * consume(k): every wait is on an event that comes earlier in every rank's
 * sequence, so the scheme cannot deadlock. Slot descriptors carry the step,
 * kind, count, dtype and op, so ranks that disagree get HCOLL_ERR_MISMATCH
 * instead of garbage.
 *
 * Waiting: a brief spin (only with two cores per local rank), a few
 * sched_yield, then FUTEX_WAIT on one event counter in the segment, in
 * slices of HC_SHM_SLICE_MS. Every writer bumps the counter and wakes when
 * somebody sleeps. Between slices: the abort/failure word, the deadline,
 * and the liveness of the ranks still awaited (pidfd, else kill(pid,0) and
 * /proc zombie state). The first rank that sees a failure poisons the
 * segment so that every other rank's wait ends at once too.
 *
 * Segment life: local rank 0 creates it (O_EXCL), announces a nonce over
 * the caller's allgather, the others attach and check the nonce, then every
 * rank waits for all to be attached and unlinks the name (the first unlink
 * wins). From then on a crash leaves nothing behind. On any failure during
 * create (a rank that never attaches within timeout_ms, one that died, a
 * failed allgather) every surviving rank unlinks the name too, so a dead
 * creator is covered by the others. What can remain: the name, if every
 * local rank dies (SIGKILL, node failure) between rank 0's shm_open and the
 * first unlink, a window of one allgather plus the attach. Peers in another
 * pid namespace cannot be watched by pid; for them only the deadline and
 * the "left"/"aborted" state words tell.
 *
 * Cross-memory attach (process_vm_readv) is not used: every byte goes
 * through the slots, which works under any ptrace policy.
 */
#include "intra/intra.h"
#include "base/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
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

#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"

#define HC_SHM_MAGIC     0x6d6873686c6f6368ull /* "hcollshm" */
#define HC_SHM_VERSION   1u
#define HC_SHM_NSLOTS    2
#define HC_SHM_LINE      64
#define HC_SHM_PAGE      4096
#define HC_SHM_SLICE_MS  10   /* longest futex sleep between looks around */
#define HC_SHM_LIVE_MS   2    /* liveness checks at most this often */
#define HC_SHM_YIELDS    4
#define HC_SHM_SPINS     2000
/* Reductions run over blocks this big so that the L-way fold re-reads the
 * destination from L1/L2 rather than from memory. */
#define HC_SHM_FOLD_BYTES (16 * 1024)

enum { HC_SHM_KIND_RS = 1, HC_SHM_KIND_AG = 2, HC_SHM_KIND_BARRIER = 3, HC_SHM_KIND_AR = 4 };
enum { HC_SHM_ST_NONE = 0, HC_SHM_ST_ATTACHED = 1, HC_SHM_ST_LEFT = 2, HC_SHM_ST_ABORTED = 3 };

/* Written by the slot's owner before it publishes the step. */
typedef struct hc_shm_desc {
    uint64_t step;
    uint64_t count;
    uint32_t kind, dtype, op, pad;
} hc_shm_desc_t;

typedef struct hc_shm_rank {
    _Alignas(HC_SHM_LINE) uint64_t posted; /* steps published */
    _Alignas(HC_SHM_LINE) uint64_t done;   /* steps consumed */
    _Alignas(HC_SHM_LINE) hc_shm_desc_t desc[HC_SHM_NSLOTS];
    int32_t pid;
    uint32_t state; /* HC_SHM_ST_* */
} hc_shm_rank_t;

typedef struct hc_shm_hdr {
    uint64_t magic;
    uint64_t nonce;
    uint32_t version, L, nslots, pad;
    uint64_t slot_bytes, data_offset, seg_bytes;
    _Alignas(HC_SHM_LINE) uint32_t ev; /* futex word: bumped on every event */
    uint32_t nwaiters;
    /* First failure: 0, or HC_SHM_FAIL(status, culprit, reporter). */
    _Alignas(HC_SHM_LINE) uint64_t fail;
    _Alignas(HC_SHM_LINE) hc_shm_rank_t ranks[];
} hc_shm_hdr_t;

#define HC_SHM_FAIL(st, culprit, reporter)                                    \
    ((1ull << 63) | ((uint64_t)(uint16_t)(reporter) << 32) |                 \
     ((uint64_t)(uint16_t)(culprit) << 16) | (uint64_t)(uint16_t)(st))

/* What each local rank tells the others during create. */
typedef struct hc_shm_hello {
    int32_t pid;
    int32_t status; /* local rank 0: outcome of creating the segment */
    uint64_t pidns; /* inode of /proc/self/ns/pid: pids compare only within one */
    uint64_t nonce;
    uint64_t seg_bytes;
} hc_shm_hello_t;

typedef struct hc_shm {
    hc_intra_t base;
    int lrank, L, rank, timeout_ms;
    hc_errbuf_t *eb;
    hc_shm_hdr_t *hdr;
    unsigned char *data;
    size_t seg_bytes, slot_bytes, data_offset;
    uint64_t step;       /* next global step */
    int spins;           /* spin iterations before yielding */
    int aborted;         /* atomic: hc_intra_abort was called here */
    hcoll_status_t broken; /* a call failed: every later call fails alike */
    int *pidfd;          /* per local rank; -1: none (self, or fallback) */
    pid_t *pid;          /* per local rank; 0: liveness unknown (other pid ns) */
    char name[NAME_MAX + 1];
} hc_shm_t;

/* One call being run: the step engine's view of it. */
typedef struct hc_shm_call {
    int kind;
    const unsigned char *src;
    unsigned char *dst;
    size_t count, es, per; /* per: elements of one shard per step */
    hcoll_dtype_t dtype;
    hcoll_op_t op;
    int inplace;
    uint64_t base, nsteps;
} hc_shm_call_t;

typedef int (*hc_shm_pending_fn)(const hc_shm_t *s, int q, uint64_t target);

static const char *hc_shm_kind_name(int kind)
{
    switch (kind) {
    case HC_SHM_KIND_RS: return "reduce_scatter";
    case HC_SHM_KIND_AG: return "all_gather";
    case HC_SHM_KIND_BARRIER: return "barrier";
    case HC_SHM_KIND_AR: return "allreduce";
    default: return "unknown";
    }
}

static inline void hc_shm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static size_t hc_shm_round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* ------------------------------------------------------------------------ */
/* Events: one futex word for the whole segment                              */
/* ------------------------------------------------------------------------ */

static void hc_shm_wake(hc_shm_hdr_t *hdr)
{
    /* seq_cst RMW then seq_cst load pairs with the waiter's nwaiters
     * increment then condition re-check: one of the two sees the other. */
    __atomic_add_fetch(&hdr->ev, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&hdr->nwaiters, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &hdr->ev, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void hc_shm_sleep(hc_shm_hdr_t *hdr, uint32_t seen, double ms)
{
    if (ms <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1e3);
    ts.tv_nsec = (long)((ms - ts.tv_sec * 1e3) * 1e6);
    /* Not FUTEX_PRIVATE: the word is shared between processes. EAGAIN (the
     * word moved), EINTR and ETIMEDOUT all just mean "look again". */
    syscall(SYS_futex, &hdr->ev, FUTEX_WAIT, seen, &ts, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* Health: abort, poison, liveness                                           */
/* ------------------------------------------------------------------------ */

static void hc_shm_poison(hc_shm_t *s, hcoll_status_t st, int culprit)
{
    uint64_t expect = 0;
    uint64_t v = HC_SHM_FAIL(st, culprit < 0 ? 0xffff : culprit, s->lrank);
    __atomic_compare_exchange_n(&s->hdr->fail, &expect, v, 0, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
    hc_shm_wake(s->hdr);
}

/* HCOLL_SUCCESS, or the error (recorded) that ends this call. */
static hcoll_status_t hc_shm_check_health(hc_shm_t *s, const char *what)
{
    if (__atomic_load_n(&s->aborted, __ATOMIC_ACQUIRE))
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_ABORTED,
                          "intra-node shm %s: aborted on this rank", what);
    if (!s->hdr)
        return HCOLL_SUCCESS;
    uint64_t f = __atomic_load_n(&s->hdr->fail, __ATOMIC_SEQ_CST);
    if (!f)
        return HCOLL_SUCCESS;
    hcoll_status_t fst = (hcoll_status_t)(f & 0xffff);
    int culprit = (int)((f >> 16) & 0xffff), reporter = (int)((f >> 32) & 0xffff);
    hcoll_status_t st = fst;
    const char *how;
    switch (fst) {
    case HCOLL_ERR_ABORTED: how = "aborted"; st = HCOLL_ERR_PEER_FAILED; break;
    case HCOLL_ERR_PEER_FAILED: how = "failed"; break;
    case HCOLL_ERR_TIMEOUT: how = "did not respond in time"; break;
    case HCOLL_ERR_MISMATCH: how = "called with different arguments"; break;
    default: how = "failed"; st = HCOLL_ERR_PEER_FAILED; break;
    }
    if (culprit == s->lrank)
        return hc_err_set(s->eb, HC_SHM, s->rank, st,
                          "intra-node shm %s: local rank %d reported that this rank (local "
                          "%d) %s", what, reporter, culprit, how);
    if (culprit == 0xffff)
        return hc_err_set(s->eb, HC_SHM, s->rank, st,
                          "intra-node shm %s: the node's segment was marked failed "
                          "(%s) by local rank %d", what, hcoll_status_name(fst), reporter);
    return hc_err_set(s->eb, HC_SHM, s->rank, st,
                      "intra-node shm %s: local rank %d %s (reported by local rank %d)",
                      what, culprit, how, reporter);
}

/* 0 alive, 1 exited, 2 left the segment (destroyed its context). */
static int hc_shm_peer_gone(const hc_shm_t *s, int q)
{
    uint32_t state = __atomic_load_n(&s->hdr->ranks[q].state, __ATOMIC_ACQUIRE);
    if (state == HC_SHM_ST_LEFT || state == HC_SHM_ST_ABORTED)
        return 2;
    if (s->pidfd[q] >= 0) {
        /* A pidfd turns readable when the process exits, zombie or not, and
         * never refers to a recycled pid. */
        struct pollfd p = { .fd = s->pidfd[q], .events = POLLIN };
        return poll(&p, 1, 0) > 0 ? 1 : 0;
    }
    pid_t pid = s->pid[q];
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    /* kill() succeeds on a zombie that nobody has reaped yet. */
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 1 : 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return rp && (rp[1] == ' ') && (rp[2] == 'Z' || rp[2] == 'X') ? 1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Waiting                                                                    */
/* ------------------------------------------------------------------------ */

static int hc_shm_pending_posted(const hc_shm_t *s, int q, uint64_t target)
{
    return __atomic_load_n(&s->hdr->ranks[q].posted, __ATOMIC_SEQ_CST) < target;
}

static int hc_shm_pending_done(const hc_shm_t *s, int q, uint64_t target)
{
    return __atomic_load_n(&s->hdr->ranks[q].done, __ATOMIC_SEQ_CST) < target;
}

static int hc_shm_pending_attach(const hc_shm_t *s, int q, uint64_t target)
{
    (void)target;
    return __atomic_load_n(&s->hdr->ranks[q].state, __ATOMIC_SEQ_CST) == HC_SHM_ST_NONE;
}

/* First rank other than self, from `from` on (cyclically), still pending;
 * -1 when none. Starting where the last scan stopped keeps rescans short. */
static int hc_shm_first_pending(const hc_shm_t *s, hc_shm_pending_fn pending,
                                uint64_t target, int from)
{
    for (int i = 0; i < s->L; i++) {
        int q = (from + i) % s->L;
        if (q != s->lrank && pending(s, q, target))
            return q;
    }
    return -1;
}

/*
 * Wait until no other rank is pending. Errors: ABORTED (here), whatever
 * poisoned the segment, PEER_FAILED (an awaited rank exited or left),
 * TIMEOUT (timeout_ms without progress from the awaited ranks).
 */
static hcoll_status_t hc_shm_wait(hc_shm_t *s, hc_shm_pending_fn pending, uint64_t target,
                                  const char *what)
{
    hc_shm_hdr_t *hdr = s->hdr;
    int q = hc_shm_first_pending(s, pending, target, 0);
    if (q < 0)
        return HCOLL_SUCCESS;
    for (int i = 0; i < s->spins; i++) {
        hc_shm_cpu_relax();
        if (!pending(s, q, target) && (q = hc_shm_first_pending(s, pending, target, q)) < 0)
            return HCOLL_SUCCESS;
    }

    hcoll_status_t st;
    double now = hc_now_ms();
    const double deadline = now + s->timeout_ms;
    double next_check = now + HC_SHM_LIVE_MS;
    int yields = 0;
    for (;;) {
        if ((st = hc_shm_check_health(s, what)) != HCOLL_SUCCESS)
            return st;
        now = hc_now_ms();
        if (now >= next_check) {
            next_check = now + HC_SHM_LIVE_MS;
            /* Only the ranks still awaited matter: one that finished its
             * part and went away is not a failure. */
            for (int r = 0; r < s->L; r++) {
                if (r == s->lrank || !pending(s, r, target))
                    continue;
                int gone = hc_shm_peer_gone(s, r);
                if (!gone)
                    continue;
                hc_shm_poison(s, HCOLL_ERR_PEER_FAILED, r);
                return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_PEER_FAILED,
                                  "intra-node shm %s: local rank %d (pid %d) %s", what, r,
                                  (int)s->pid[r],
                                  gone == 2 ? "left the node's segment" : "died");
            }
        }
        if (now >= deadline) {
            hc_shm_poison(s, HCOLL_ERR_TIMEOUT, q);
            return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_TIMEOUT,
                              "intra-node shm %s: local rank %d made no progress in %d ms",
                              what, q, s->timeout_ms);
        }
        if (yields < HC_SHM_YIELDS) {
            yields++;
            sched_yield();
        } else {
            uint32_t seen = __atomic_load_n(&hdr->ev, __ATOMIC_SEQ_CST);
            __atomic_add_fetch(&hdr->nwaiters, 1, __ATOMIC_SEQ_CST);
            if (pending(s, q, target) && !__atomic_load_n(&s->aborted, __ATOMIC_SEQ_CST) &&
                !__atomic_load_n(&hdr->fail, __ATOMIC_SEQ_CST)) {
                double left = deadline - now;
                hc_shm_sleep(hdr, seen, left < HC_SHM_SLICE_MS ? left : HC_SHM_SLICE_MS);
            }
            __atomic_sub_fetch(&hdr->nwaiters, 1, __ATOMIC_SEQ_CST);
        }
        if (!pending(s, q, target) && (q = hc_shm_first_pending(s, pending, target, q)) < 0)
            return HCOLL_SUCCESS;
    }
}

/* ------------------------------------------------------------------------ */
/* The step engine                                                            */
/* ------------------------------------------------------------------------ */

static unsigned char *hc_shm_slot(const hc_shm_t *s, int q, uint64_t g)
{
    return s->data + ((size_t)q * HC_SHM_NSLOTS + (size_t)(g % HC_SHM_NSLOTS)) * s->slot_bytes;
}

/* Shard j's piece of step k: *elem_out (offset in the vector) and length. */
static size_t hc_shm_piece(const hc_shm_t *s, const hc_shm_call_t *c, int j, uint64_t k,
                           size_t *elem_out)
{
    size_t off, len;
    hc_intra_shard(c->count, s->L, j, &off, &len);
    size_t start = (size_t)k * c->per;
    *elem_out = off + start;
    if (start >= len)
        return 0;
    return len - start < c->per ? len - start : c->per;
}

/* Piece k of a fused allreduce: elements [*elem_out, *elem_out + n). */
static size_t hc_shm_ar_piece(const hc_shm_call_t *c, uint64_t k, size_t *elem_out)
{
    size_t start = (size_t)k * c->per;
    *elem_out = start;
    return c->count - start < c->per ? c->count - start : c->per;
}

static hcoll_status_t hc_shm_publish(hc_shm_t *s, const hc_shm_call_t *c, uint64_t k)
{
    const uint64_t g = c->base + k;
    hcoll_status_t st;
    if (g >= HC_SHM_NSLOTS) {
        st = hc_shm_wait(s, hc_shm_pending_done, g - HC_SHM_NSLOTS + 1,
                         hc_shm_kind_name(c->kind));
        if (st != HCOLL_SUCCESS)
            return st;
    }
    unsigned char *slot = hc_shm_slot(s, s->lrank, g);
    size_t elem, n;
    if (c->kind == HC_SHM_KIND_RS) {
        for (int j = 0; j < s->L; j++) {
            if (j == s->lrank && !c->inplace)
                continue; /* the owner folds its own term straight from sendbuf */
            n = hc_shm_piece(s, c, j, k, &elem);
            if (n)
                memcpy(slot + (size_t)j * c->per * c->es, c->src + elem * c->es, n * c->es);
        }
    } else if (c->kind == HC_SHM_KIND_AG) {
        n = hc_shm_piece(s, c, s->lrank, k, &elem);
        if (n)
            memcpy(slot, c->dst + elem * c->es, n * c->es);
    } else if (c->kind == HC_SHM_KIND_AR) {
        n = hc_shm_ar_piece(c, k, &elem);
        memcpy(slot, c->src + elem * c->es, n * c->es);
    }
    hc_shm_desc_t *d = &s->hdr->ranks[s->lrank].desc[g % HC_SHM_NSLOTS];
    d->step = g;
    d->count = c->count;
    d->kind = (uint32_t)c->kind;
    d->dtype = (uint32_t)c->dtype;
    d->op = (uint32_t)c->op;
    __atomic_store_n(&s->hdr->ranks[s->lrank].posted, g + 1, __ATOMIC_SEQ_CST);
    hc_shm_wake(s->hdr);
    return HCOLL_SUCCESS;
}

static hcoll_status_t hc_shm_check_desc(hc_shm_t *s, const hc_shm_call_t *c, uint64_t g)
{
    for (int q = 0; q < s->L; q++) {
        if (q == s->lrank)
            continue;
        const hc_shm_desc_t *d = &s->hdr->ranks[q].desc[g % HC_SHM_NSLOTS];
        int same = d->step == g && d->kind == (uint32_t)c->kind && d->count == c->count &&
                   d->dtype == (uint32_t)c->dtype &&
                   ((c->kind != HC_SHM_KIND_RS && c->kind != HC_SHM_KIND_AR) ||
                    d->op == (uint32_t)c->op);
        if (!same) {
            hc_shm_poison(s, HCOLL_ERR_MISMATCH, q);
            return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_MISMATCH,
                              "intra-node shm: local rank %d runs %s(count %llu, %s, %s) at "
                              "step %llu while this rank (local %d) runs %s(count %zu, %s, %s)"
                              " at step %llu",
                              q, hc_shm_kind_name((int)d->kind), (unsigned long long)d->count,
                              hcoll_dtype_name((hcoll_dtype_t)d->dtype),
                              hcoll_op_name((hcoll_op_t)d->op), (unsigned long long)d->step,
                              s->lrank, hc_shm_kind_name(c->kind), c->count,
                              hcoll_dtype_name(c->dtype), hcoll_op_name(c->op),
                              (unsigned long long)g);
        }
    }
    return HCOLL_SUCCESS;
}

/* Local rank q's term of our shard's piece at step g, byte offset boff. */
static const unsigned char *hc_shm_term(const hc_shm_t *s, const hc_shm_call_t *c, uint64_t g,
                                        int q, size_t elem, size_t boff)
{
    if (q == s->lrank && !c->inplace)
        return c->src + elem * c->es + boff;
    return hc_shm_slot(s, q, g) + (size_t)s->lrank * c->per * c->es + boff;
}

static void hc_shm_fold(hc_shm_t *s, const hc_shm_call_t *c, uint64_t g, size_t elem, size_t n)
{
    unsigned char *dst = c->dst + elem * c->es;
    const size_t blk = HC_SHM_FOLD_BYTES / c->es;
    for (size_t b = 0; b < n; b += blk) {
        size_t nb = n - b < blk ? n - b : blk;
        size_t boff = b * c->es;
        /* Always ((t0 op t1) op t2) op ...: the fixed order. */
        hc_reduce(dst + boff, hc_shm_term(s, c, g, 0, elem, boff),
                  hc_shm_term(s, c, g, 1, elem, boff), nb, c->dtype, c->op);
        for (int q = 2; q < s->L; q++)
            hc_reduce(dst + boff, dst + boff, hc_shm_term(s, c, g, q, elem, boff), nb,
                      c->dtype, c->op);
    }
}

/* Fused allreduce: every term comes from its slot (our own too: in place,
 * recvbuf is being overwritten), folded in local-rank order as RS does. */
static void hc_shm_ar_fold(hc_shm_t *s, const hc_shm_call_t *c, uint64_t g, size_t elem,
                           size_t n)
{
    unsigned char *dst = c->dst + elem * c->es;
    const size_t blk = HC_SHM_FOLD_BYTES / c->es;
    for (size_t b = 0; b < n; b += blk) {
        size_t nb = n - b < blk ? n - b : blk;
        size_t boff = b * c->es;
        hc_reduce(dst + boff, hc_shm_slot(s, 0, g) + boff, hc_shm_slot(s, 1, g) + boff, nb,
                  c->dtype, c->op);
        for (int q = 2; q < s->L; q++)
            hc_reduce(dst + boff, dst + boff, hc_shm_slot(s, q, g) + boff, nb, c->dtype, c->op);
    }
}

static hcoll_status_t hc_shm_consume(hc_shm_t *s, const hc_shm_call_t *c, uint64_t k)
{
    const uint64_t g = c->base + k;
    hcoll_status_t st = hc_shm_wait(s, hc_shm_pending_posted, g + 1, hc_shm_kind_name(c->kind));
    if (st != HCOLL_SUCCESS)
        return st;
    if ((st = hc_shm_check_desc(s, c, g)) != HCOLL_SUCCESS)
        return st;
    size_t elem, n;
    if (c->kind == HC_SHM_KIND_RS) {
        n = hc_shm_piece(s, c, s->lrank, k, &elem);
        if (n)
            hc_shm_fold(s, c, g, elem, n);
    } else if (c->kind == HC_SHM_KIND_AG) {
        for (int q = 0; q < s->L; q++) {
            if (q == s->lrank)
                continue;
            n = hc_shm_piece(s, c, q, k, &elem);
            if (n)
                memcpy(c->dst + elem * c->es, hc_shm_slot(s, q, g), n * c->es);
        }
    } else if (c->kind == HC_SHM_KIND_AR) {
        n = hc_shm_ar_piece(c, k, &elem);
        hc_shm_ar_fold(s, c, g, elem, n);
    }
    /* seq_cst (hence release): our reads of the slots happen before the
     * owners may overwrite them. */
    __atomic_store_n(&s->hdr->ranks[s->lrank].done, g + 1, __ATOMIC_SEQ_CST);
    hc_shm_wake(s->hdr);
    return HCOLL_SUCCESS;
}

static hcoll_status_t hc_shm_run(hc_shm_t *s, hc_shm_call_t *c)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    c->base = s->step;
    if (c->nsteps == 0)
        return HCOLL_SUCCESS;
    HC_CHECK(hc_shm_publish(s, c, 0), fail);
    for (uint64_t k = 0; k < c->nsteps; k++) {
        if (k + 1 < c->nsteps)
            HC_CHECK(hc_shm_publish(s, c, k + 1), fail);
        HC_CHECK(hc_shm_consume(s, c, k), fail);
    }
    s->step += c->nsteps;
    return HCOLL_SUCCESS;
fail:
    /* The step counters no longer agree between ranks: this context is
     * finished, and peers must not wait for us. */
    s->broken = st;
    hc_shm_poison(s, st, -1);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Operations                                                                 */
/* ------------------------------------------------------------------------ */

static hcoll_status_t hc_shm_enter(hc_shm_t *s, const char *what, const void *a, const void *b,
                                   size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                   void *stream)
{
    if (!s)
        return hc_err_set(NULL, HC_SHM, -1, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: NULL context", what);
    if (stream)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_UNSUPPORTED,
                          "intra-node shm %s: host buffers only (got a stream)", what);
    if (!hc_reduce_valid(dtype, op))
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: invalid dtype %d or op %d", what, (int)dtype,
                          (int)op);
    if (count > 0 && (!a || !b))
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: NULL buffer for %zu elements", what, count);
    if (count > SIZE_MAX / 8)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm %s: count %zu too large", what, count);
    if (s->broken) {
        return hc_err_set(s->eb, HC_SHM, s->rank, s->broken,
                          "intra-node shm %s: an earlier call failed (%s); the context is "
                          "unusable", what, hcoll_status_name(s->broken));
    }
    hcoll_status_t st = hc_shm_check_health(s, what);
    if (st != HCOLL_SUCCESS)
        s->broken = st;
    return st;
}

static hcoll_status_t hc_shm_reduce_scatter(hc_intra_t *ctx, const void *sendbuf,
                                            void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                            hcoll_op_t op, void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st =
        hc_shm_enter(s, "reduce_scatter", sendbuf, recvbuf, count, dtype, op, stream);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    const size_t es = hcoll_dtype_size(dtype);
    if (s->L == 1) {
        if (sendbuf != recvbuf)
            memcpy(recvbuf, sendbuf, count * es);
        return HCOLL_SUCCESS;
    }
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_RS, .src = sendbuf, .dst = recvbuf, .count = count, .es = es,
        .dtype = dtype, .op = op, .inplace = sendbuf == recvbuf,
    };
    /* Sub-pieces start on cache lines; create made slot_bytes >= 64 L. */
    c.per = (s->slot_bytes / (size_t)s->L / HC_SHM_LINE * HC_SHM_LINE) / es;
    size_t off, maxlen;
    hc_intra_shard(count, s->L, 0, &off, &maxlen);
    c.nsteps = (maxlen + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

static hcoll_status_t hc_shm_all_gather(hc_intra_t *ctx, void *recvbuf, size_t count,
                                        hcoll_dtype_t dtype, void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st =
        hc_shm_enter(s, "all_gather", recvbuf, recvbuf, count, dtype, HCOLL_SUM, stream);
    if (st != HCOLL_SUCCESS || count == 0 || s->L == 1)
        return st;
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_AG, .dst = recvbuf, .count = count,
        .es = hcoll_dtype_size(dtype), .dtype = dtype, .op = HCOLL_SUM,
    };
    c.per = s->slot_bytes / c.es;
    size_t off, maxlen;
    hc_intra_shard(count, s->L, 0, &off, &maxlen);
    c.nsteps = (maxlen + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

/* The fused step: one synchronisation per slot-full instead of two, each
 * rank reading all L slots. The executor calls it for small vectors and
 * runs reduce_scatter + all_gather itself for large ones, where reading L
 * times the data would cost more than the second synchronisation. */
static hcoll_status_t hc_shm_allreduce(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                       size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                       void *stream)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    hcoll_status_t st = hc_shm_enter(s, "allreduce", sendbuf, recvbuf, count, dtype, op, stream);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    const size_t es = hcoll_dtype_size(dtype);
    if (s->L == 1) {
        if (sendbuf != recvbuf)
            memcpy(recvbuf, sendbuf, count * es);
        return HCOLL_SUCCESS;
    }
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_AR, .src = sendbuf, .dst = recvbuf, .count = count, .es = es,
        .dtype = dtype, .op = op, .inplace = sendbuf == recvbuf,
    };
    c.per = s->slot_bytes / es;
    c.nsteps = (count + c.per - 1) / c.per;
    return hc_shm_run(s, &c);
}

static hcoll_status_t hc_shm_barrier(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    static const char one;
    hcoll_status_t st = hc_shm_enter(s, "barrier", &one, &one, 0, HCOLL_UINT8, HCOLL_SUM, NULL);
    if (st != HCOLL_SUCCESS || s->L == 1)
        return st;
    hc_shm_call_t c = {
        .kind = HC_SHM_KIND_BARRIER, .es = 1, .per = 1, .dtype = HCOLL_UINT8,
        .op = HCOLL_SUM, .nsteps = 1,
    };
    return hc_shm_run(s, &c);
}

static void hc_shm_abort(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    if (!s)
        return;
    __atomic_store_n(&s->aborted, 1, __ATOMIC_SEQ_CST);
    if (s->hdr) {
        __atomic_store_n(&s->hdr->ranks[s->lrank].state, HC_SHM_ST_ABORTED, __ATOMIC_SEQ_CST);
        /* Also wakes our own blocked thread: it sleeps on the same word. */
        hc_shm_poison(s, HCOLL_ERR_ABORTED, s->lrank);
    }
}

/* ------------------------------------------------------------------------ */
/* Create / destroy                                                           */
/* ------------------------------------------------------------------------ */

static void hc_shm_free(hc_shm_t *s)
{
    if (s->pidfd) {
        for (int q = 0; q < s->L; q++)
            if (s->pidfd[q] >= 0)
                close(s->pidfd[q]);
    }
    free(s->pidfd);
    free(s->pid);
    free(s);
}

static void hc_shm_destroy(hc_intra_t *ctx)
{
    hc_shm_t *s = (hc_shm_t *)ctx;
    if (!s)
        return;
    if (s->hdr) {
        /* A peer still waiting on us learns at once that we are gone. */
        uint32_t none = HC_SHM_ST_ATTACHED;
        __atomic_compare_exchange_n(&s->hdr->ranks[s->lrank].state, &none, HC_SHM_ST_LEFT, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        hc_shm_wake(s->hdr);
        munmap(s->hdr, s->seg_bytes);
    }
    hc_shm_free(s);
}

static uint64_t hc_shm_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static hcoll_status_t hc_shm_segment_create(hc_shm_t *s, size_t seg_bytes, uint64_t nonce)
{
    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_SYSTEM,
                          "intra-node shm: cannot create segment %s: %s%s", s->name,
                          strerror(errno),
                          errno == EEXIST ? " (name not unique, or left by a crashed job)" : "");
    hcoll_status_t st = HCOLL_SUCCESS;
    /* Reserve the pages now: on a full /dev/shm a write into a sparse
     * segment would be a SIGBUS, not an error. */
    int rc = posix_fallocate(fd, 0, (off_t)seg_bytes);
    if (rc == EOPNOTSUPP || rc == EINVAL)
        rc = ftruncate(fd, (off_t)seg_bytes) == 0 ? 0 : errno;
    if (rc != 0) {
        st = hc_err_set(s->eb, HC_SHM, s->rank,
                        rc == ENOSPC ? HCOLL_ERR_NO_MEMORY : HCOLL_ERR_SYSTEM,
                        "intra-node shm: cannot size segment %s to %zu bytes: %s%s", s->name,
                        seg_bytes, strerror(rc),
                        rc == ENOSPC ? " (is /dev/shm large enough?)" : "");
        goto unlink_fd;
    }
    void *p = mmap(NULL, seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_SYSTEM,
                        "intra-node shm: mmap of %s (%zu bytes): %s", s->name, seg_bytes,
                        strerror(errno));
        goto unlink_fd;
    }
    close(fd);
    hc_shm_hdr_t *hdr = p;
    hdr->nonce = nonce;
    hdr->version = HC_SHM_VERSION;
    hdr->L = (uint32_t)s->L;
    hdr->nslots = HC_SHM_NSLOTS;
    hdr->slot_bytes = s->slot_bytes;
    hdr->seg_bytes = seg_bytes;
    hdr->data_offset = s->data_offset;
    __atomic_store_n(&hdr->magic, HC_SHM_MAGIC, __ATOMIC_RELEASE);
    s->hdr = hdr;
    return HCOLL_SUCCESS;

unlink_fd:
    close(fd);
    shm_unlink(s->name);
    return st;
}

static hcoll_status_t hc_shm_segment_attach(hc_shm_t *s, size_t seg_bytes, uint64_t nonce)
{
    int fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0);
    /* The name is unlinked early only by a rank that saw set-up fail (the
     * normal unlink waits until everyone has attached), so a missing name
     * means a local rank failed: report it as that, not as a system error. */
    if (fd < 0 && errno == ENOENT)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_PEER_FAILED,
                          "intra-node shm create: segment %s was removed before this rank "
                          "attached: another local rank failed during set-up",
                          s->name);
    if (fd < 0)
        return hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_SYSTEM,
                          "intra-node shm: cannot open segment %s made by local rank 0: %s",
                          s->name, strerror(errno));
    hcoll_status_t st = HCOLL_SUCCESS;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != seg_bytes) {
        st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INTERNAL,
                        "intra-node shm: segment %s has %lld bytes, local rank 0 announced %zu",
                        s->name, (long long)sb.st_size, seg_bytes);
        goto close_fd;
    }
    void *p = mmap(NULL, seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_SYSTEM,
                        "intra-node shm: mmap of %s (%zu bytes): %s", s->name, seg_bytes,
                        strerror(errno));
        goto close_fd;
    }
    hc_shm_hdr_t *hdr = p;
    if (__atomic_load_n(&hdr->magic, __ATOMIC_ACQUIRE) != HC_SHM_MAGIC || hdr->nonce != nonce ||
        hdr->version != HC_SHM_VERSION || hdr->L != (uint32_t)s->L ||
        hdr->slot_bytes != s->slot_bytes) {
        st = hc_err_set(s->eb, HC_SHM, s->rank, HCOLL_ERR_INTERNAL,
                        "intra-node shm: segment %s is not the one local rank 0 created "
                        "(stale or foreign)", s->name);
        munmap(p, seg_bytes);
        goto close_fd;
    }
    s->hdr = hdr;
close_fd:
    close(fd);
    return st;
}

static hcoll_status_t hc_shm_create(const hc_intra_params_t *prm, hc_intra_t **out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_errbuf_t *eb = prm ? prm->errbuf : NULL;
    int rank = prm ? prm->rank : -1;
    if (!prm || !out || prm->local_size < 1 || prm->local_size > 0xfffe ||
        prm->local_rank < 0 || prm->local_rank >= prm->local_size || prm->timeout_ms <= 0 ||
        (prm->local_size > 1 && (!prm->allgather || !prm->name || prm->name[0] != '/' ||
                                 strchr(prm->name + 1, '/') ||
                                 strlen(prm->name) > NAME_MAX)))
        return hc_err_set(eb, HC_SHM, rank, HCOLL_ERR_INVALID_ARG,
                          "intra-node shm create: bad parameters (local rank %d of %d, "
                          "name '%s', timeout %d ms)",
                          prm ? prm->local_rank : -1, prm ? prm->local_size : -1,
                          prm && prm->name ? prm->name : "(null)", prm ? prm->timeout_ms : -1);

    hc_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return hc_err_set(eb, HC_SHM, rank, HCOLL_ERR_NO_MEMORY, "intra-node shm: calloc");
    s->base.ops = &hc_intra_shm_ops;
    s->lrank = prm->local_rank;
    s->L = prm->local_size;
    s->rank = rank;
    s->eb = eb;
    s->timeout_ms = prm->timeout_ms;
    if (s->L == 1) {
        *out = &s->base; /* nothing to share */
        return HCOLL_SUCCESS;
    }
    snprintf(s->name, sizeof s->name, "%s", prm->name);
    s->pidfd = malloc((size_t)s->L * sizeof *s->pidfd);
    s->pid = calloc((size_t)s->L, sizeof *s->pid);
    hc_shm_hello_t *all = calloc((size_t)s->L, sizeof *all);
    if (!s->pidfd || !s->pid || !all) {
        free(all);
        hc_shm_free(s);
        return hc_err_set(eb, HC_SHM, rank, HCOLL_ERR_NO_MEMORY, "intra-node shm: calloc");
    }
    for (int q = 0; q < s->L; q++)
        s->pidfd[q] = -1;

    /* Spinning only pays when the rank awaited is running: every rank
     * needs a core to itself and another for the thread that drives its
     * network stage (the ring thread, a progress thread). Otherwise the
     * spin burns the very core the awaited rank is queued for: with 4
     * ranks and their ring threads on 2 cores, a 2000-pause spin made a
     * 4 KiB all-reduce 1.6 times slower than going to sleep at once.
     * The cores counted are those this process may run on. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0)
        ncpu = CPU_COUNT(&cpus);
    s->spins = ncpu >= 2L * s->L ? HC_SHM_SPINS : 0;

    size_t chunk = prm->chunk_bytes < HC_SHM_PAGE ? HC_SHM_PAGE : prm->chunk_bytes;
    size_t min_slot = (size_t)s->L * HC_SHM_LINE;
    s->slot_bytes = hc_shm_round_up(chunk > min_slot ? chunk : min_slot, HC_SHM_PAGE);
    size_t hdr_bytes = sizeof(hc_shm_hdr_t) + (size_t)s->L * sizeof(hc_shm_rank_t);
    size_t data_offset = hc_shm_round_up(hdr_bytes, HC_SHM_PAGE);
    size_t seg_bytes = data_offset + (size_t)s->L * HC_SHM_NSLOTS * s->slot_bytes;
    s->seg_bytes = seg_bytes;
    s->data_offset = data_offset;

    hc_shm_hello_t mine = { .pid = (int32_t)getpid(), .pidns = hc_shm_pidns() };
    if (s->lrank == 0) {
        uint64_t nonce;
        if (getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != (ssize_t)sizeof nonce)
            nonce = (uint64_t)hc_now_ms() * 1000003u ^ (uint64_t)getpid() << 32;
        mine.nonce = nonce;
        mine.seg_bytes = seg_bytes;
        mine.status = hc_shm_segment_create(s, seg_bytes, nonce);
    }
    /* Rank 0 takes part even after a failure, so nobody waits for it. */
    st = prm->allgather(prm->allgather_ctx, &mine, all, sizeof mine);
    if (st != HCOLL_SUCCESS) {
        if (!eb || !hc_errbuf_get(eb)[0])
            hc_err_set(eb, HC_SHM, rank, st, "intra-node shm create: local allgather failed");
        goto unlink_name;
    }
    /* Rank 0 cleaned up after its own failure; the name may belong to
     * somebody else (EEXIST), so nobody unlinks it. */
    if (s->lrank == 0 && mine.status != HCOLL_SUCCESS) {
        st = (hcoll_status_t)mine.status;
        goto free_all;
    }
    if (all[0].status != HCOLL_SUCCESS) {
        st = hc_err_set(eb, HC_SHM, rank, (hcoll_status_t)all[0].status,
                        "intra-node shm create: local rank 0 could not create segment %s",
                        s->name);
        goto free_all;
    }
    if (s->lrank != 0)
        HC_CHECK(hc_shm_segment_attach(s, all[0].seg_bytes, all[0].nonce), unlink_name);
    s->data = (unsigned char *)s->hdr + data_offset;

    for (int q = 0; q < s->L; q++) {
        if (q == s->lrank || all[q].pidns != mine.pidns)
            continue; /* another pid namespace: its pid means nothing here */
        s->pid[q] = all[q].pid;
        s->pidfd[q] = (int)syscall(SYS_pidfd_open, (pid_t)all[q].pid, 0);
        if (s->pidfd[q] < 0 && errno == ESRCH) {
            st = hc_err_set(eb, HC_SHM, rank, HCOLL_ERR_PEER_FAILED,
                            "intra-node shm create: local rank %d (pid %d) is gone", q,
                            (int)all[q].pid);
            hc_shm_poison(s, st, q);
            goto unmap;
        }
    }
    __atomic_store_n(&s->hdr->ranks[s->lrank].pid, mine.pid, __ATOMIC_RELAXED);
    __atomic_store_n(&s->hdr->ranks[s->lrank].state, HC_SHM_ST_ATTACHED, __ATOMIC_SEQ_CST);
    hc_shm_wake(s->hdr);
    HC_CHECK(hc_shm_wait(s, hc_shm_pending_attach, 0, "create"), unmap);
    /* Everybody has it mapped: the name can go, so that no crash from now
     * on leaves anything in /dev/shm. Each rank tries; the first wins. */
    if (shm_unlink(s->name) != 0 && errno != ENOENT)
        HC_WARN(HC_SHM, rank, "intra-node shm: shm_unlink(%s): %s", s->name, strerror(errno));
    free(all);
    HC_INFO(HC_SHM, rank, "intra-node shm: local rank %d of %d attached %s (%zu bytes, "
            "%d slots of %zu bytes per rank)", s->lrank, s->L, s->name, seg_bytes,
            HC_SHM_NSLOTS, s->slot_bytes);
    *out = &s->base;
    return HCOLL_SUCCESS;

unmap:
    if (s->hdr) {
        hc_shm_poison(s, st, -1);
        munmap(s->hdr, s->seg_bytes);
        s->hdr = NULL;
    }
unlink_name:
    /* Whoever fails unlinks: local rank 0 may be the one that died. */
    shm_unlink(s->name);
free_all:
    free(all);
    hc_shm_free(s);
    return st;
}

const hc_intra_ops_t hc_intra_shm_ops = {
    .name = "shm",
    .create = hc_shm_create,
    .reduce_scatter = hc_shm_reduce_scatter,
    .all_gather = hc_shm_all_gather,
    .allreduce = hc_shm_allreduce,
    .barrier = hc_shm_barrier,
    .abort = hc_shm_abort,
    .destroy = hc_shm_destroy,
};
