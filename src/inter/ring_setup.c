/*
 * The ring's set-up and teardown: connecting to next and prev over the
 * transport, the host staging slots, mailbox and gather region each rank
 * registers, the one exchange that tells every rank its neighbours' keys,
 * and the two ways a ring ends (an orderly goodbye, or a reset so that the
 * neighbours fail at once).
 */
#include "inter/ring_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* Every rank's ring info, checked: the same slots and chunk everywhere. */
static hcoll_status_t exchange_info(hc_ring_t *r, const ring_info_t *mine)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_errbuf_t *eb = RING_ERRBUF(r);
    const int lr = RING_LOGRANK(r), n = r->n;
    ring_info_t *all = calloc((size_t)n, sizeof *all);
    if (!all)
        return hc_err_set(eb, HC_NET, lr, HCOLL_ERR_NO_MEMORY, "ring: out of memory");
    HC_CHECK(r->p.allgather(r->p.ag_ctx, mine, all, sizeof *mine), clean_all);
    for (int i = 0; i < n; i++) {
        if (all[i].magic != RING_MAGIC || all[i].rank != (uint32_t)i) {
            st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_INTERNAL,
                            "ring: rank %d published no valid ring info",
                            hc_tp_rank(&r->p.tp, i));
            goto clean_all;
        }
        if (all[i].nslots != mine->nslots || all[i].chunk_bytes != mine->chunk_bytes) {
            st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_MISMATCH,
                            "ring: rank %d uses %u slots of %llu bytes, rank %d %u of %llu "
                            "(HCOLL_CHUNK_BYTES must be equal everywhere)",
                            hc_tp_rank(&r->p.tp, i), all[i].nslots,
                            (unsigned long long)all[i].chunk_bytes, lr, mine->nslots,
                            (unsigned long long)mine->chunk_bytes);
            goto clean_all;
        }
    }
    r->next_slots = all[r->next].slots_rkey;
    r->prev_ctrl = all[r->prev].ctrl_rkey;
    r->next_gbuf = all[r->next].gather_rkey;
    st = hc_ring_live_connect(r, all[r->next].live_ip, all[r->next].live_port);
clean_all:
    free(all);
    return st;
}

hcoll_status_t hc_ring_create(const hc_ring_params_t *params, hc_ring_t **ring_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_errbuf_t *eb = params->tp.errbuf;
    const int lr = params->tp.log_rank;
    const int n = params->tp.nranks, me = params->tp.rank;
    if (n < 1 || me < 0 || me >= n || !params->ops || !params->allgather ||
        params->chunk_bytes < 8 || params->nslots < 0 || params->nslots > HC_RING_MAX_SLOTS)
        return hc_err_set(eb, HC_NET, lr, HCOLL_ERR_INVALID_ARG,
                          "ring: bad parameters (position %d of %d, chunk %llu bytes, %d slots)",
                          me, n, (unsigned long long)params->chunk_bytes, params->nslots);

    hc_ring_t *r = calloc(1, sizeof *r);
    if (!r)
        return hc_err_set(eb, HC_NET, lr, HCOLL_ERR_NO_MEMORY, "ring: out of memory");
    r->p = *params;
    r->rank = me;
    r->n = n;
    r->next = (me + 1) % n;
    r->prev = (me + n - 1) % n;
    r->ops = params->ops;
    /* Whole elements of any type; and whole 64-byte lines where a chunk
     * can hold one, so that every staging slot, and every chunk of an
     * aligned block (ring_sched.h), starts on one. */
    r->chunk_bytes = (size_t)params->chunk_bytes &
                     ~(size_t)(params->chunk_bytes >= HC_RING_ALIGN ? HC_RING_ALIGN - 1 : 7);
    r->nslots = params->nslots ? params->nslots : DEFAULT_SLOTS;
    r->op_timeout_ms = params->op_timeout_ms ? params->op_timeout_ms : params->tp.timeout_ms;
    r->live_listen = -1;
    /* The caller's strings need not outlive create. */
    snprintf(r->rail_addr, sizeof r->rail_addr, "%s",
             params->tp.bind_addr ? params->tp.bind_addr : "");
    snprintf(r->rail_ifname, sizeof r->rail_ifname, "%s",
             params->tp.ifname ? params->tp.ifname : "?");
    r->p.tp.bind_addr = r->rail_addr;
    r->p.tp.ifname = r->rail_ifname;
    for (int i = 0; i < 2; i++)
        r->live[i].fd = -1;
    if (n == 1) {
        *ring_out = r;
        return HCOLL_SUCCESS;
    }

    HC_CHECK(r->ops->create(&params->tp, &r->tr), clean_ring);
    /* Over verbs the rail is a NIC, not the IP interface of its address:
     * name the NIC in the ring's messages. */
    if (r->ops->rail_name)
        r->ops->rail_name(r->tr, r->rail_ifname, sizeof r->rail_ifname);
    int peers[2] = { r->next, r->prev };
    hc_ep_t *eps[2] = { NULL, NULL };
    HC_CHECK(r->ops->connect(r->tr, peers, n == 2 ? 1 : 2, params->allgather, params->ag_ctx, eps),
             clean_tr);
    r->ep_next = eps[0];
    r->ep_prev = n == 2 ? eps[0] : eps[1];

    /* aligned_alloc wants a whole number of alignments (C11; ASan checks):
     * a chunk under 64 bytes is only a multiple of 8. */
    r->slots = aligned_alloc(64, ((size_t)r->nslots * r->chunk_bytes + 63) & ~(size_t)63);
    r->ctrl = aligned_alloc(64, 2 * DESC_SLOTS * DESC_BYTES);
    r->gvec = r->chunk_bytes / (size_t)n & ~(size_t)63;
    r->gbuf = aligned_alloc(64, 2 * (size_t)n * r->gvec + 64);
    if (!r->slots || !r->ctrl || !r->gbuf) {
        st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_NO_MEMORY,
                        "ring: out of memory for %d staging slots of %zu bytes", r->nslots,
                        r->chunk_bytes);
        goto clean_bufs;
    }
    memset(r->ctrl, 0, 2 * DESC_SLOTS * DESC_BYTES);
    ring_info_t mine = { RING_MAGIC, (uint32_t)me, (uint32_t)r->nslots, 0, 0, 0, r->chunk_bytes,
                         { { 0, 0 } }, { { 0, 0 } }, { { 0, 0 } } };
    HC_CHECK(hc_ring_live_listen(r, &mine.live_ip, &mine.live_port), clean_bufs);
    HC_CHECK(r->ops->mr_reg(r->tr, r->slots, (size_t)r->nslots * r->chunk_bytes, &r->slots_mr,
                            &mine.slots_rkey),
             clean_bufs);
    HC_CHECK(r->ops->mr_reg(r->tr, r->ctrl, 2 * DESC_SLOTS * DESC_BYTES, &r->ctrl_mr,
                            &mine.ctrl_rkey),
             clean_slots_mr);
    HC_CHECK(r->ops->mr_reg(r->tr, r->gbuf, 2 * (size_t)n * r->gvec + 64, &r->gbuf_mr,
                            &mine.gather_rkey),
             clean_ctrl_mr);
    HC_CHECK(exchange_info(r, &mine), clean_gbuf_mr);
    HC_INFO(HC_NET, lr,
            "ring: position %d of %d, next rank %d, prev rank %d, %d slots of %zu bytes over %s",
            me, n, hc_tp_rank(&r->p.tp, r->next), hc_tp_rank(&r->p.tp, r->prev), r->nslots,
            r->chunk_bytes, r->ops->name);
    *ring_out = r;
    return HCOLL_SUCCESS;

clean_gbuf_mr:
    r->ops->mr_dereg(r->tr, r->gbuf_mr);
clean_ctrl_mr:
    r->ops->mr_dereg(r->tr, r->ctrl_mr);
clean_slots_mr:
    r->ops->mr_dereg(r->tr, r->slots_mr);
clean_bufs:
    hc_ring_live_close(r, 0);
    free(r->gbuf);
    free(r->ctrl);
    free(r->slots);
clean_tr:
    r->ops->destroy(r->tr, 0);
clean_ring:
    free(r);
    return st;
}

void hc_ring_destroy(hc_ring_t *r)
{
    if (!r)
        return;
    int graceful = r->err == HCOLL_SUCCESS && !r->op.active;
    hc_ring_disable_device(r); /* normally done already, by the device path */
    if (r->tr) {
        /* Only an idle, healthy ring says goodbye; anything else resets so
         * that the neighbours stop waiting for us at once. */
        r->ops->destroy(r->tr, graceful); /* frees its regions too */
        r->tr = NULL;
    }
    hc_ring_live_close(r, graceful);
    free(r->stage); /* its registration went with the transport */
    free(r->flags);
    free(r->gbuf);
    free(r->ctrl);
    free(r->slots);
    free(r);
}

void hc_ring_fail(hc_ring_t *r, hcoll_status_t st)
{
    if (!r)
        return;
    if (r->err == HCOLL_SUCCESS)
        r->err = st;
    if (r->tr) {
        r->ops->destroy(r->tr, 0);
        r->tr = NULL;
        r->ep_next = r->ep_prev = NULL;
    }
}

hc_ep_t *hc_ring_debug_ep_next(hc_ring_t *r)
{
    return r->ep_next;
}

hcoll_status_t hc_ring_mem_pin(hc_ring_t *r, void *base, size_t len, hc_mr_t **pin_out)
{
    *pin_out = NULL;
    if (!r || !r->ops->mem_pin)
        return HCOLL_SUCCESS;
    return r->ops->mem_pin(r->tr, base, len, pin_out);
}

void hc_ring_mem_unpin(hc_ring_t *r, hc_mr_t *pin)
{
    if (r && pin && r->ops->mem_unpin)
        r->ops->mem_unpin(r->tr, pin);
}
