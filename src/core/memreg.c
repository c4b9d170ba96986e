/*
 * Registered buffers. Local to a rank: a registration changes which
 * registration the transport uses for this rank's side of an operation,
 * nothing that a peer sees, so ranks register whatever and whenever they
 * like (as NCCL's ncclCommRegister).
 *
 *   hcoll_mem_register(p, n) ─► list (no overlap) ─► ring pin ─► transport
 *                                                     verbs: ibv_reg_mr once, a cache entry held
 *                                                     TCP:   nothing
 *   every operation in [p, p+n) ─► mr_reg ─► cache hit (no ibv_reg_mr)
 */
#include "core/memreg.h"

#include <stdint.h>
#include <stdlib.h>

#include "base/log.h"

struct hcoll_mem {
    char *base;
    size_t len;
    hc_mr_t *pin; /* the transport's hold; NULL when it keeps nothing */
    struct hcoll_mem *next;
};

hcoll_status_t hc_memreg_add(struct hcoll_mem **list, hc_ring_t *ring, hc_errbuf_t *eb, int rank,
                             void *ptr, size_t bytes, struct hcoll_mem **handle_out)
{
    if (!ptr || !handle_out)
        return hc_err_set(eb, HC_COLL, rank, HCOLL_ERR_INVALID_ARG, "mem_register: %s is NULL",
                          ptr ? "handle_out" : "ptr");
    if (bytes == 0)
        return hc_err_set(eb, HC_COLL, rank, HCOLL_ERR_INVALID_ARG,
                          "mem_register: 0 bytes at %p", ptr);
    char *b = ptr;
    if ((uintptr_t)b + bytes < (uintptr_t)b)
        return hc_err_set(eb, HC_COLL, rank, HCOLL_ERR_INVALID_ARG,
                          "mem_register: %zu bytes at %p wrap around the address space", bytes,
                          ptr);
    for (const struct hcoll_mem *m = *list; m; m = m->next)
        if (b < m->base + m->len && m->base < b + bytes)
            return hc_err_set(eb, HC_COLL, rank, HCOLL_ERR_INVALID_ARG,
                              "mem_register: [%p, +%zu) overlaps the registered [%p, +%zu); "
                              "deregister it first",
                              ptr, bytes, (void *)m->base, m->len);
    struct hcoll_mem *m = calloc(1, sizeof *m);
    if (!m)
        return hc_err_set(eb, HC_COLL, rank, HCOLL_ERR_NO_MEMORY,
                          "mem_register: no memory for a handle");
    hcoll_status_t st = hc_ring_mem_pin(ring, ptr, bytes, &m->pin);
    if (st != HCOLL_SUCCESS) {
        free(m); /* the transport recorded why */
        return st;
    }
    m->base = b;
    m->len = bytes;
    m->next = *list;
    *list = m;
    HC_TRACE(HC_COLL, rank, "registered [%p, +%zu)%s", ptr, bytes,
             m->pin ? "" : " (the transport keeps no registration)");
    *handle_out = m;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_memreg_remove(struct hcoll_mem **list, hc_ring_t *ring, hc_errbuf_t *eb,
                                int rank, struct hcoll_mem *h)
{
    for (struct hcoll_mem **pp = list; *pp; pp = &(*pp)->next) {
        if (*pp != h)
            continue;
        *pp = h->next;
        hc_ring_mem_unpin(ring, h->pin);
        free(h);
        return HCOLL_SUCCESS;
    }
    return hc_err_set(eb, HC_COLL, rank, HCOLL_ERR_INVALID_ARG,
                      "mem_deregister: %p is not a registration of this communicator "
                      "(already deregistered?)",
                      (void *)h);
}

void hc_memreg_clear(struct hcoll_mem **list, hc_ring_t *ring)
{
    while (*list) {
        struct hcoll_mem *m = *list;
        *list = m->next;
        hc_ring_mem_unpin(ring, m->pin);
        free(m);
    }
}
