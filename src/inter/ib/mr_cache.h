/*
 * The registration cache (mr_cache.c): generic over what a registration
 * is, so that tests drive it without a NIC. The verbs transport keeps its
 * struct ibv_mr in handle (mr.c).
 */
#ifndef HC_INTER_IB_MR_CACHE_H
#define HC_INTER_IB_MR_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct hc_mrc_entry {
    void *base;
    size_t len;
    uint64_t gen;      /* allocation id (CUDA buffer id; 0 for host) */
    int refs;
    uint64_t last_use;
    void *handle;      /* what reg returned (struct ibv_mr *) */
    int dmabuf_fd;     /* -1 unless registered through dma-buf */
    unsigned flags;    /* HC_MRC_* what the registration allows */
    struct hc_mrc_entry *next;
} hc_mrc_entry_t;

typedef struct hc_mrc {
    hc_mrc_entry_t *list;
    int count, max_idle;     /* idle (refs == 0) entries kept */
    uint64_t tick;
    uint64_t hits, misses;
    uint64_t stale;          /* entries dropped: their allocation id changed */
    void (*dereg)(void *ctx, hc_mrc_entry_t *e);
    void *ctx;
} hc_mrc_t;

/* flags: a peer may write and read it (an rkey was handed out). An entry
 * without it serves local-only lookups alone: a send buffer's pages are
 * never reachable by a peer through a later receive's lookup. */
#define HC_MRC_REMOTE 1u

void hc_mrc_init(hc_mrc_t *c, int max_idle, void (*dereg)(void *, hc_mrc_entry_t *), void *ctx);
/* An entry covering [base, base+len) of allocation gen, with a reference
 * taken; NULL on a miss. Idle entries of another allocation id overlapping
 * the range (a freed buffer whose addresses were reused) are deregistered. */
hc_mrc_entry_t *hc_mrc_find(hc_mrc_t *c, void *base, size_t len, uint64_t gen);
/* The same, for an entry whose flags include need (hc_mrc_find: need 0). */
hc_mrc_entry_t *hc_mrc_find_flags(hc_mrc_t *c, void *base, size_t len, uint64_t gen,
                                  unsigned need);
/* Deregister every idle entry with an allocation id for which
 * alive(ctx, e) says 0 (its buffer was freed: CUDA's id at its address
 * changed); returns how many went. */
int hc_mrc_sweep(hc_mrc_t *c, int (*alive)(void *ctx, const hc_mrc_entry_t *e), void *ctx);
/* Adopt a fresh registration (refs = 1). */
void hc_mrc_insert(hc_mrc_t *c, hc_mrc_entry_t *e);
/* Drop a reference; idle entries beyond max_idle are deregistered, least
 * recently used first. */
void hc_mrc_release(hc_mrc_t *c, hc_mrc_entry_t *e);
/* Deregister everything (transport teardown). */
void hc_mrc_fini(hc_mrc_t *c);

#endif
