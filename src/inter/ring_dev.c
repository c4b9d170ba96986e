/*
 * The ring on device buffers (GPUDirect RDMA): staging slots in device
 * memory that prev's NIC writes, allocated with the caller's device
 * operations and registered with the transport. Enabling them is
 * collective so that the ring either runs on device buffers everywhere or
 * nowhere; the operation itself is the chunked ring of ring.c with the
 * reductions done by hc_ring_devops_t.
 */
#include "inter/ring_priv.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

int hc_ring_gdr_capable(const hc_ring_t *r)
{
    if (r->n == 1)
        return 1;
    return r->tr && r->ops->gdr && r->ops->gdr(r->tr);
}

void hc_ring_disable_device(hc_ring_t *r)
{
    if (!r || !r->devops)
        return;
    if (r->dslots_mr && r->tr)
        r->ops->mr_dereg(r->tr, r->dslots_mr);
    if (r->dslots)
        r->devops->free(r->devops->ctx, r->dslots);
    r->dslots_mr = NULL;
    r->dslots = NULL;
    r->devops = NULL;
}

/* What each rank publishes when device buffers are enabled. */
typedef struct ring_dev_info {
    uint32_t magic;
    uint32_t ok;
    hc_rkey_t dslots_rkey;
} ring_dev_info_t;

hcoll_status_t hc_ring_enable_device(hc_ring_t *r, const hc_ring_devops_t *ops)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_errbuf_t *eb = RING_ERRBUF(r);
    const int lr = RING_LOGRANK(r);
    if (r->err)
        return r->err;
    if (r->devops)
        return HCOLL_SUCCESS;
    if (r->n == 1) {
        r->devops = ops;
        return HCOLL_SUCCESS;
    }
    ring_dev_info_t mine;
    memset(&mine, 0, sizeof mine);
    mine.magic = RING_MAGIC;
    void *slots = NULL;
    hc_mr_t *mr = NULL;
    const size_t bytes = (size_t)r->nslots * r->chunk_bytes;
    if (ops->alloc(ops->ctx, bytes, &slots) == HCOLL_SUCCESS) {
        if (r->ops->mr_reg(r->tr, slots, bytes, &mr, &mine.dslots_rkey) == HCOLL_SUCCESS)
            mine.ok = 1;
        else
            HC_WARN(HC_NET, lr, "ring: device staging slots not registered: %s",
                    hc_errbuf_get(eb));
    }
    /* Everyone exchanges, whatever happened here: the ring fails together. */
    ring_dev_info_t *all = calloc((size_t)r->n, sizeof *all);
    if (!all) {
        st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_NO_MEMORY, "ring: out of memory");
        goto clean_slots;
    }
    HC_CHECK(r->p.allgather(r->p.ag_ctx, &mine, all, sizeof mine), clean_all);
    for (int i = 0; i < r->n; i++)
        if (all[i].magic != RING_MAGIC || !all[i].ok) {
            st = hc_err_set(eb, HC_NET, lr, HCOLL_ERR_UNSUPPORTED,
                            "ring: rank %d cannot take device buffers over %s (GPUDirect); "
                            "its log says why",
                            hc_tp_rank(&r->p.tp, i), r->ops->name);
            goto clean_all;
        }
    r->next_dslots = all[r->next].dslots_rkey;
    r->dslots = slots;
    r->dslots_mr = mr;
    r->devops = ops;
    free(all);
    HC_INFO(HC_NET, lr, "ring: device buffers over %s: %d device slots of %zu bytes (GPUDirect)",
            r->ops->name, r->nslots, r->chunk_bytes);
    return HCOLL_SUCCESS;

clean_all:
    free(all);
clean_slots:
    if (mr)
        r->ops->mr_dereg(r->tr, mr);
    if (slots)
        ops->free(ops->ctx, slots);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Gated reductions (ring.h)                                                  */
/* ------------------------------------------------------------------------ */

void hc_ring_set_gated(hc_ring_t *r, const hc_ring_gated_t *g)
{
    r->gated = g;
}

hcoll_status_t hc_ring_dev_jobs(const hc_ring_t *r, size_t count, hcoll_dtype_t dtype,
                                int phase, hc_ring_job_fn fn, void *arg)
{
    if (r->n == 1 || count == 0)
        return HCOLL_SUCCESS;
    const size_t trailer = sizeof(gather_trailer_t), es = hcoll_dtype_size(dtype);
    hc_ring_sched_t g;
    /* As op_init plans a device operation (no gather mode; a phase alone
     * rotates blocks by -1; an all-reduce's blocks aligned). */
    const long rot = phase == HC_RING_PHASE_ALLREDUCE ? 0 : -1;
    hc_ring_sched_plan(&g, r->n, count, es, r->chunk_bytes,
                       r->gvec >= trailer ? r->gvec - trailer : 0, 1);
    if (phase == HC_RING_PHASE_ALLREDUCE)
        hc_ring_sched_align(&g, es);
    for (size_t m = 0; m < g.nmsg; m++) {
        size_t s = m / g.C, c = m % g.C, off, cnt;
        hc_ring_chunk_of(&g, hc_ring_mod(r->n, (long)r->rank - 1 - (long)s + rot), c, &off, &cnt);
        void *slot = (char *)r->dslots + (m % (size_t)r->nslots) * r->chunk_bytes;
        hcoll_status_t st = fn(arg, m, off, cnt, slot, s == (size_t)r->n - 2);
        if (st != HCOLL_SUCCESS)
            return st;
    }
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_ring_gated_poll(hc_ring_t *r, int *moved_out)
{
    ring_op_t *o = &r->op;
    size_t red = o->gated->reduced(o->gated->ctx);
    if (red > o->g.nmsg)
        red = o->g.nmsg;
    *moved_out = red > o->rs_red;
    for (; o->rs_red < red; o->rs_red++) {
        const size_t m = o->rs_red;
        o->rs_done[m] = 1;
        o->rs_nrecv++;
        hcoll_status_t st = hc_ring_put(r, r->ep_prev, NULL, 0, NULL, 0, 0,
                                        IMM(IMM_CREDIT, r->seq & 15,
                                            (int)(m % (size_t)r->nslots), m));
        if (st != HCOLL_SUCCESS)
            return st;
    }
    return HCOLL_SUCCESS;
}
