/*
 * Registration cache. The ring registers the user's buffers for every
 * operation; training loops pass the same buffers each iteration, and
 * ibv_reg_mr pins pages (tens of microseconds to milliseconds), so a
 * registration is kept after its last user and found again by address.
 *
 *   mr_reg(p, n) ─► covering entry of the same allocation? ─ yes ─► refs++
 *                                   │ no
 *                                   └─► ibv_reg_mr ─► insert (refs = 1)
 *   mr_dereg ─► refs-- ─► idle entries beyond max_idle: deregister LRU
 *
 * The classic trap of every registration cache: a buffer freed and
 * reallocated at the same address would hit a stale entry whose pinned
 * pages are no longer the application's. Device buffers carry CUDA's
 * allocation id (gen), so a reallocation never matches; host memory has no
 * such id, so host entries are only shared while in use and deregistered
 * when their last user lets go (a registration per operation for host
 * buffers: slower, never wrong). Host memory that CUDA allocated (the
 * pinned staging pool, cuMemHostAlloc) does carry one, and is cached as
 * device memory is. An idle entry of another allocation over a range
 * looked up is stale (its buffer was freed) and goes at once, and every
 * miss sweeps the idle entries whose allocation id changed (freed buffers
 * nobody looks up again: a dma-buf import keeps the GPU's pages). Device
 * memory is registered a whole CUDA allocation at a time (mr.c), so every
 * sub-range of it hits the one entry.
 *
 * Entries also carry what they allow (HC_MRC_REMOTE): a send buffer is
 * registered for local access only, and never serves a lookup that hands
 * out an rkey.
 */
#include <stdlib.h>

#include "inter/ib/mr_cache.h"

void hc_mrc_init(hc_mrc_t *c, int max_idle, void (*dereg)(void *, hc_mrc_entry_t *), void *ctx)
{
    c->list = NULL;
    c->count = 0;
    c->max_idle = max_idle;
    c->tick = 0;
    c->hits = c->misses = c->stale = 0;
    c->dereg = dereg;
    c->ctx = ctx;
}

/* Two live allocations never overlap: an entry of another allocation id
 * over this range belongs to a buffer that was freed. Idle, it holds
 * pinned pages (and for dma-buf an export) of memory nobody owns any more:
 * deregistered now, not when it ages out of the LRU. */
static int stale(const hc_mrc_entry_t *e, const char *b, size_t len, uint64_t gen)
{
    const char *eb = e->base;
    return e->refs == 0 && e->gen != 0 && gen != 0 && e->gen != gen && b < eb + e->len &&
           eb < b + len;
}

hc_mrc_entry_t *hc_mrc_find(hc_mrc_t *c, void *base, size_t len, uint64_t gen)
{
    return hc_mrc_find_flags(c, base, len, gen, 0);
}

hc_mrc_entry_t *hc_mrc_find_flags(hc_mrc_t *c, void *base, size_t len, uint64_t gen,
                                  unsigned need)
{
    char *b = base;
    for (hc_mrc_entry_t **pp = &c->list; *pp;) {
        hc_mrc_entry_t *e = *pp;
        char *eb = e->base;
        if (e->gen == gen && (e->flags & need) == need && b >= eb && len <= e->len &&
            (size_t)(b - eb) <= e->len - len) {
            e->refs++;
            e->last_use = ++c->tick;
            c->hits++;
            return e;
        }
        if (stale(e, b, len, gen)) {
            *pp = e->next;
            c->count--;
            c->stale++;
            c->dereg(c->ctx, e);
            continue;
        }
        pp = &e->next;
    }
    c->misses++;
    return NULL;
}

int hc_mrc_sweep(hc_mrc_t *c, int (*alive)(void *ctx, const hc_mrc_entry_t *e), void *ctx)
{
    int n = 0;
    for (hc_mrc_entry_t **pp = &c->list; *pp;) {
        hc_mrc_entry_t *e = *pp;
        if (e->refs == 0 && e->gen != 0 && !alive(ctx, e)) {
            *pp = e->next;
            c->count--;
            c->stale++;
            c->dereg(c->ctx, e);
            n++;
            continue;
        }
        pp = &e->next;
    }
    return n;
}

void hc_mrc_insert(hc_mrc_t *c, hc_mrc_entry_t *e)
{
    e->refs = 1;
    e->last_use = ++c->tick;
    e->next = c->list;
    c->list = e;
    c->count++;
}

static void evict_idle(hc_mrc_t *c, int keep)
{
    for (;;) {
        int idle = 0;
        hc_mrc_entry_t **victim = NULL;
        for (hc_mrc_entry_t **pp = &c->list; *pp; pp = &(*pp)->next)
            if ((*pp)->refs == 0) {
                idle++;
                if (!victim || (*pp)->last_use < (*victim)->last_use)
                    victim = pp;
            }
        if (idle <= keep || !victim)
            return;
        hc_mrc_entry_t *e = *victim;
        *victim = e->next;
        c->count--;
        c->dereg(c->ctx, e);
    }
}

void hc_mrc_release(hc_mrc_t *c, hc_mrc_entry_t *e)
{
    if (e->refs > 0)
        e->refs--;
    if (e->refs != 0)
        return;
    if (e->gen == 0) {
        /* Host memory carries no allocation id, so an idle entry could
         * outlive the buffer and later send from (or land in) pages the
         * application freed: correctness first, it goes now. */
        for (hc_mrc_entry_t **pp = &c->list; *pp; pp = &(*pp)->next) {
            if (*pp == e) {
                *pp = e->next;
                c->count--;
                c->dereg(c->ctx, e);
                return;
            }
        }
    }
    evict_idle(c, c->max_idle);
}

void hc_mrc_fini(hc_mrc_t *c)
{
    while (c->list) {
        hc_mrc_entry_t *e = c->list;
        c->list = e->next;
        c->count--;
        c->dereg(c->ctx, e);
    }
}
