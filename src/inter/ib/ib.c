/*
 * Verbs transport: one RC queue pair per peer on this rank's NIC, behind
 * the ops table of transport.h. This file holds the table and the
 * instance's life cycle; the parts live beside it (ib_priv.h lists them):
 *
 *   create ─► device.c: NIC of this local rank, port, GID, PD
 *          ─► credit words (registered: peers write them)
 *          ─► device.c: GPUDirect decision ─► mr.c: flush word and QP
 *   connect ─► qp.c      mr_reg/mr_dereg ─► mr.c
 *   put ─► send.c        poll ─► poll.c
 *   destroy: graceful: drain our puts; otherwise: tell every peer we
 *            failed (credit word reset), then free in reverse order
 *
 * None of this has run on an RDMA NIC yet: see the README.
 */
#include "inter/ib/ib_priv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"

#if HCOLL_BUILD_VERBS

/* Until our last puts are acknowledged, up to a second: a peer still
 * waiting for them would otherwise see retries exceeded. */
static void drain_graceful(hc_transport_t *tr)
{
    double deadline = hc_now_ms() + (tr->p.timeout_ms < 1000 ? tr->p.timeout_ms : 1000);
    for (;;) {
        int busy = 0;
        for (int i = 0; i < tr->neps; i++)
            busy |= tr->eps[i]->fcount > 0 || tr->eps[i]->pcount > 0;
        if (!busy || ib_progress(tr) != HCOLL_SUCCESS || hc_now_ms() > deadline)
            break;
    }
}

/* An RC peer notices a vanished QP only when it next sends to it: tell
 * each one, as a TCP reset would (transport.h's contract). */
static void reset_peers(hc_transport_t *tr)
{
    int posted = 0;
    for (int i = 0; i < tr->neps; i++)
        if (tr->eps[i]->q[0].fcount < IB_SQ_DEPTH &&
            ib_credit_write(tr->eps[i], 0, IB_CREDIT_RESET) == 0)
            posted++;
    /* Until the writes are out (or failed), briefly: a QP destroyed with
     * them queued may never send them. */
    double deadline = hc_now_ms() + 100;
    while (posted && hc_now_ms() < deadline) {
        int busy = 0;
        for (int i = 0; i < tr->neps; i++) {
            struct ibv_wc wc[32];
            int n = ibv_poll_cq(tr->eps[i]->cq, 32, wc);
            for (int k = 0; k < n; k++)
                if (!(wc[k].status == IBV_WC_SUCCESS && (wc[k].opcode & IBV_WC_RECV)) &&
                    tr->eps[i]->fcount)
                    tr->eps[i]->fcount--;
            busy |= tr->eps[i]->fcount > 0;
        }
        if (!busy)
            break;
    }
}

static void ib_destroy(hc_transport_t *tr, int graceful)
{
    if (!tr)
        return;
    if (graceful && tr->err == HCOLL_SUCCESS)
        drain_graceful(tr);
    if (!graceful)
        reset_peers(tr);
    for (int i = 0; i < tr->neps; i++)
        ib_ep_free(tr, tr->eps[i]);
    free(tr->eps);
    ib_chan_free(tr); /* after the CQs on it */
    ib_flush_free(tr);
    ib_mr_free_handles(tr);
    hc_mrc_fini(&tr->mrc);
    if (tr->credits_mr) {
        tr->v->dereg_mr(tr->credits_mr);
        hc_tp_count(HC_TP_DEREG);
    }
    free((void *)tr->credits);
    if (tr->pd)
        tr->v->dealloc_pd(tr->pd);
    if (tr->ctx)
        tr->v->close_device(tr->ctx);
    free(tr->held);
    hc_compq_free(&tr->cq);
    free(tr);
}

/* Credit words, then one scratch word for flush reads; peers write them. */
static hcoll_status_t credits_setup(hc_transport_t *tr)
{
    tr->credits_len = IB_CREDIT_WORDS(tr->p.nranks) * sizeof(uint64_t);
    void *cw = NULL;
    if (posix_memalign(&cw, 64, tr->credits_len) != 0)
        return ib_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory for credit words");
    memset(cw, 0, tr->credits_len);
    tr->credits = cw;
    tr->credits_mr = tr->v->reg_mr(tr->pd, cw, tr->credits_len,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!tr->credits_mr)
        return ib_fail(tr, HCOLL_ERR_RDMA, "ibv_reg_mr of the credit words failed (errno %d)",
                       errno);
    hc_tp_count(HC_TP_REG);
    return HCOLL_SUCCESS;
}

/* GPUDirect as decided, with the flush word it needs; without the word,
 * host staging. */
static void gdr_setup(hc_transport_t *tr)
{
    ib_gdr_decide(tr);
    char why[240] = "";
    if (tr->gdr && tr->flush && ib_flush_setup(tr, why, sizeof why) != 0) {
        ib_flush_free(tr);
        snprintf(tr->gdr_why, sizeof tr->gdr_why, "GPU %d: no GPUDirect flush reads: %s",
                 tr->gpu, why);
        HC_INFO(HC_GDR, tr->p.log_rank, "%s: host staging", tr->gdr_why);
        tr->gdr = 0;
    }
}

/* Relaxed ordering where asked and libibverbs has ibv_reg_mr_iova2; a NIC
 * that refuses the flag turns it off at its first registration (mr.c). */
static void ro_setup(hc_transport_t *tr)
{
    const int knob = tr->cfg.relaxed_ordering;
    tr->ro = knob != 0 && tr->v->reg_mr_iova2 != NULL;
    if (knob == 1 && !tr->ro)
        HC_WARN(HC_NET, tr->p.log_rank,
                "NET/IB: HCOLL_IB_PCI_RELAXED_ORDERING=1, but libibverbs has no "
                "ibv_reg_mr_iova2 (rdma-core < 27): registering without relaxed ordering");
    HC_INFO(HC_NET, tr->p.log_rank, "NET/IB: relaxed ordering %s", tr->ro ? "on" : "off");
}

static void log_choice(const hc_transport_t *tr)
{
    char gtxt[64];
    hc_gid_format(tr->gid.raw, gtxt, sizeof gtxt);
    HC_INFO(HC_NET, tr->p.log_rank, "NET/IB: rank %d -> [%d]%s:%d/%s%s", tr->p.log_rank,
            tr->choice.index, tr->choice.port.dev, tr->choice.port.port, tr->roce ? "RoCE" : "IB",
            tr->gdr ? "/GDRDMA" : "");
    HC_INFO(HC_NET, tr->p.log_rank,
            "NET/IB: rank %d %s:%d %s, LID %u, MTU %d, rate %s, %s (sysfs: %s)", tr->p.log_rank,
            tr->choice.port.dev, tr->choice.port.port, tr->roce ? "RoCE" : "InfiniBand",
            tr->pattr.lid, tr->choice.port.active_mtu,
            tr->choice.port.rate[0] ? tr->choice.port.rate : "?", gtxt, tr->choice.gid_why);
}

static hcoll_status_t ib_create(const hc_transport_params_t *params, hc_transport_t **tr_out)
{
    if (!params->settings)
        return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_INVALID_ARG,
                          "NET/IB: no settings (hc_transport_params_t.settings is NULL)");
    hcoll_status_t st;
    hc_transport_t *tr = calloc(1, sizeof *tr);
    if (!tr)
        return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_NO_MEMORY,
                          "NET/IB: out of memory creating the transport");
    tr->p = *params;
    tr->p.settings = NULL; /* read here, not kept */
    hc_ib_config_from_params(params->settings, &tr->cfg);
    tr->gpu = params->has_gpu ? params->gpu : -1;
    tr->local_rank = params->rail;
    tr->v = ib_verbs_get();
    snprintf(tr->bind_addr, sizeof tr->bind_addr, "%s", params->bind_addr ? params->bind_addr : "");
    tr->p.bind_addr = tr->bind_addr;
    tr->p.ifname = NULL;
    snprintf(tr->choice.port.dev, sizeof tr->choice.port.dev, "?");
    if (tr->p.timeout_ms < 1)
        tr->p.timeout_ms = 1;
    hc_mrc_init(&tr->mrc, IB_MRC_IDLE, ib_mrc_dereg, tr);
    if (!tr->v->ok) {
        st = ib_fail(tr, HCOLL_ERR_RDMA, "%s", tr->v->why);
        goto clean_tr;
    }
    /* Before the process's first registration (the credit words). */
    const char *fork_state = ib_fork_setup();
    HC_CHECK(ib_dev_open(tr), clean_tr);
    ro_setup(tr);
    HC_CHECK(credits_setup(tr), clean_tr);
    if (getrandom(&tr->psn, sizeof tr->psn, 0) != (ssize_t)sizeof tr->psn)
        tr->psn = (uint32_t)getpid() * 2654435761u;
    tr->psn &= 0xffffff;
    gdr_setup(tr);
    log_choice(tr);
    HC_INFO(HC_NET, tr->p.log_rank, "NET/IB: fork safety: %s", fork_state);
    *tr_out = tr;
    return HCOLL_SUCCESS;

clean_tr:
    ib_destroy(tr, 0);
    return st;
}

static int ib_gdr(hc_transport_t *tr)
{
    return tr->gdr;
}

static void ib_rail_name(hc_transport_t *tr, char *buf, size_t len)
{
    snprintf(buf, len, "%s port %d", tr->choice.port.dev, tr->choice.port.port);
}

const hc_transport_ops_t hc_ib_ops = {
    .name = "ib",
    .create = ib_create,
    .connect = ib_connect,
    .rail_name = ib_rail_name,
    .mr_reg = ib_mr_reg,
    .mr_dereg = ib_mr_dereg,
    .mem_pin = ib_mem_pin,
    .mem_unpin = ib_mem_unpin,
    .gdr = ib_gdr,
    .put = ib_put,
    .poll = ib_poll,
    .destroy = ib_destroy,
    .mem_pinned = ib_mem_pinned,
};

#else /* !HCOLL_BUILD_VERBS */

/* Built without <infiniband/verbs.h>: the table exists so that selection
 * code is the same everywhere, and create says why it cannot work. */
static hcoll_status_t ib_create(const hc_transport_params_t *params, hc_transport_t **tr_out)
{
    (void)tr_out;
    if (!params->settings)
        return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_INVALID_ARG,
                          "NET/IB: no settings (hc_transport_params_t.settings is NULL)");
    return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_UNSUPPORTED,
                      "NET/IB: hcoll was built without libibverbs headers (rdma-core)");
}

const hc_transport_ops_t hc_ib_ops = {
    .name = "ib",
    .create = ib_create,
};

#endif
