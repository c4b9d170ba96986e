/*
 * The shared-memory intra-node backend's private parts: the segment's
 * layout, the context, the call being run, and what its files share:
 *   shm.c        the segment's life (create, attach, destroy), the ops table
 *   shm_steps.c  the step engine and the collective operations
 *   shm_wait.c   waiting on the segment's futex word, and the peers' health
 */
#ifndef HC_INTRA_SHM_H
#define HC_INTRA_SHM_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/err.h"
#include "intra/intra.h"

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

enum { HC_SHM_KIND_RS = 1, HC_SHM_KIND_AG = 2, HC_SHM_KIND_BARRIER = 3, HC_SHM_KIND_AR = 4,
       HC_SHM_KIND_SC = 5, HC_SHM_KIND_AGREE = 6, HC_SHM_KIND_BC = 7 };
enum { HC_SHM_ST_NONE = 0, HC_SHM_ST_ATTACHED = 1, HC_SHM_ST_LEFT = 2, HC_SHM_ST_ABORTED = 3 };

/* Written by the slot's owner before it publishes the step. */
typedef struct hc_shm_desc {
    uint64_t step;
    uint64_t count;
    uint32_t kind, dtype, op;
    uint32_t note; /* the owner's note (intra.h note_set), 0: none */
} hc_shm_desc_t;

typedef struct hc_shm_rank {
    _Alignas(HC_SHM_LINE) uint64_t posted; /* steps published */
    _Alignas(HC_SHM_LINE) uint64_t done;   /* steps consumed */
    _Alignas(HC_SHM_LINE) hc_shm_desc_t desc[HC_SHM_NSLOTS];
    int32_t pid;
    uint32_t state; /* HC_SHM_ST_* */
    /* Bumped by the owner's liveness thread (hc_intra_beat): a rank that
     * waits for this one reads it to tell a late rank from a frozen one. */
    _Alignas(HC_SHM_LINE) uint64_t beat;
} hc_shm_rank_t;

/* Test-only: called with a point's name ("created": local rank 0 holds a
 * named, not yet announced segment) so that a test can kill the process
 * exactly there. NULL in the library. */
extern void (*hc_shm_test_hook)(const char *point);

typedef struct hc_shm_hdr {
    uint64_t magic;
    uint64_t nonce;
    uint32_t version, L, nslots;
    int32_t creator_pid;  /* written before magic: the reaper's test (shm.c) */
    uint64_t slot_bytes, data_offset, seg_bytes;
    uint64_t creator_ns;  /* creator's pid namespace (inode), as hello.pidns */
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
    int op_timeout_ms;   /* < 0: operations wait without limit */
    int liveness_ms;     /* 0: heartbeats not checked */
    uint64_t *seen_beat; /* per local rank: its beat when last looked at */
    double *seen_at;     /* ... and when it last moved; 0: never looked */
    hc_errbuf_t *eb;
    hc_shm_hdr_t *hdr;
    unsigned char *data;
    size_t seg_bytes, slot_bytes, data_offset;
    uint64_t step;       /* next global step */
    int spins;           /* spin iterations before yielding */
    int aborted;         /* atomic: hc_intra_abort was called here */
    hcoll_status_t broken; /* a call failed: every later call fails alike */
    uint32_t note_out;   /* published with every step (note_set) */
    uint32_t note_in;    /* first other rank's note consumed (note_take) */
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
    /* Reduce-scatter's source, all-gather's destination in blocks (NULL:
     * contiguous src / dst): the vector is blocks[0] .. blocks[count/blen
     * - 1], blen elements each; all-gather's own shard is then read from
     * src, at its offset. */
    unsigned char *const *blocks;
    size_t blen;
    /* The agreement (KIND_AGREE; count is nwords there): words in/out,
     * MAX-combined; the data (dcount elements of dtype under op, after
     * the header) folded only where every local rank's equals this one's. */
    int64_t *words;
    size_t dcount;
    int data_ok;
} hc_shm_call_t;

typedef int (*hc_shm_pending_fn)(const hc_shm_t *s, int q, uint64_t target);

static inline const char *hc_shm_kind_name(int kind)
{
    switch (kind) {
    case HC_SHM_KIND_RS: return "reduce_scatter";
    case HC_SHM_KIND_AG: return "all_gather";
    case HC_SHM_KIND_BARRIER: return "barrier";
    case HC_SHM_KIND_AR: return "allreduce";
    case HC_SHM_KIND_SC: return "scatter";
    case HC_SHM_KIND_AGREE: return "agreement";
    case HC_SHM_KIND_BC: return "bcast";
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

/* ---- shm_wait.c ---- */

/* Bump the event word and wake every sleeper. */
void hc_shm_wake(hc_shm_hdr_t *hdr);
/* Mark the segment failed (the first failure sticks) and wake everyone;
 * culprit -1: no particular rank. */
void hc_shm_poison(hc_shm_t *s, hcoll_status_t st, int culprit);
/* HCOLL_SUCCESS, or the error (recorded) that ends this call. */
hcoll_status_t hc_shm_check_health(hc_shm_t *s, const char *what);
/* Is rank q still short of target (posted / done) or not attached? */
int hc_shm_pending_posted(const hc_shm_t *s, int q, uint64_t target);
int hc_shm_pending_done(const hc_shm_t *s, int q, uint64_t target);
int hc_shm_pending_attach(const hc_shm_t *s, int q, uint64_t target);
/* Wait until no other rank is pending (errors recorded). */
hcoll_status_t hc_shm_wait(hc_shm_t *s, hc_shm_pending_fn pending, uint64_t target,
                           const char *what);

/* ---- shm_steps.c: the hc_intra_ops_t entries ---- */

hcoll_status_t hc_shm_reduce_scatter(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                     size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                     void *stream);
hcoll_status_t hc_shm_reduce_scatter_blocks(hc_intra_t *ctx, const void *const *blocks,
                                           size_t blen, void *recvbuf, size_t count,
                                           hcoll_dtype_t dtype, hcoll_op_t op, void *stream);
hcoll_status_t hc_shm_all_gather_blocks(hc_intra_t *ctx, const void *src, void *const *blocks,
                                        size_t blen, size_t count, hcoll_dtype_t dtype,
                                        void *stream);
hcoll_status_t hc_shm_all_gather(hc_intra_t *ctx, void *recvbuf, size_t count,
                                 hcoll_dtype_t dtype, void *stream);
hcoll_status_t hc_shm_agree(hc_intra_t *ctx, int64_t *words, int nwords, const void *sendbuf,
                            void *recvbuf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                            int *data_ok);
hcoll_status_t hc_shm_allreduce(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                size_t count, hcoll_dtype_t dtype, hcoll_op_t op, void *stream);
hcoll_status_t hc_shm_scatter(hc_intra_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                              hcoll_dtype_t dtype, int root, void *stream);
hcoll_status_t hc_shm_bcast(hc_intra_t *ctx, const void *sendbuf, void *recvbuf, size_t count,
                            hcoll_dtype_t dtype, int root, void *stream);
hcoll_status_t hc_shm_barrier(hc_intra_t *ctx);
void hc_shm_abort(hc_intra_t *ctx);
void hc_shm_beat(hc_intra_t *ctx);
hcoll_status_t hc_shm_health(hc_intra_t *ctx, const char *what);
hcoll_status_t hc_shm_alive(hc_intra_t *ctx, const char *what);
void hc_shm_poison_op(hc_intra_t *ctx);

#endif
