/*
 * Transport choice (HCOLL_NET), in one place and one agreement:
 *
 *   each rank:  tcp  -> mine = 0 (libibverbs never loaded)
 *               ib   -> mine = can verbs run on this rank's NIC?
 *               auto -> mine = can verbs run on this rank's NIC?
 *   allgather(mine) over every rank
 *   tcp  -> TCP
 *   ib   -> verbs if mine, else HCOLL_ERR_UNSUPPORTED with the reason
 *   auto -> verbs if every rank's byte is 1, else TCP (INFO says why)
 *
 * Every rank takes part in the exchange whatever its HCOLL_NET, so the
 * ranks' set-up exchanges stay aligned and auto ranks never pick verbs
 * beside a rank that cannot (or will not) use it. The NIC asked about is
 * the one create picks: the local rank's, ordered by distance to its GPU.
 */
#include "inter/transport.h"

#include <stdlib.h>

#include "base/config.h"
#include "base/err.h"
#include "base/log.h"
#include "inter/ib/ib.h"

/* This rank's answer: 1 when verbs runs on its own NIC; why otherwise. */
static int verbs_here(const hc_select_params_t *sp, hc_ib_choice_t *choice, char *why,
                      size_t whylen)
{
    if (sp->settings->net == HC_NET_TCP)
        return 0;
    hc_ib_config_t cfg;
    hc_ib_config_from_params(sp->settings, &cfg);
    return hc_ib_usable(&cfg, sp->local_rank, sp->gpu, choice, why, whylen);
}

/* all[i] for every rank (mine alone without an exchange). */
static hcoll_status_t agree(const hc_select_params_t *sp, uint8_t mine, uint8_t **all_out)
{
    const int n = sp->allgather ? sp->nranks : 1;
    uint8_t *all = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!all)
        return hc_err_set(sp->errbuf, HC_NET, sp->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the transport agreement");
    all[0] = mine;
    if (sp->allgather) {
        hcoll_status_t st = sp->allgather(sp->ag_ctx, &mine, all, 1);
        if (st != HCOLL_SUCCESS) {
            free(all);
            return st;
        }
    }
    *all_out = all;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_transport_select(const hc_select_params_t *sp,
                                   const hc_transport_ops_t **ops_out)
{
    const hc_params_t *s = sp->settings;
    const int net = s->net;
    if (net != HC_NET_TCP && net != HC_NET_IB && net != HC_NET_AUTO)
        return hc_err_set(sp->errbuf, HC_NET, sp->rank, HCOLL_ERR_INVALID_ARG,
                          "HCOLL_NET: unknown transport kind %d", net);
    char why[300] = "";
    hc_ib_choice_t c = { 0 };
    const uint8_t mine = (uint8_t)verbs_here(sp, &c, why, sizeof why);
    uint8_t *all = NULL;
    hcoll_status_t st = agree(sp, mine, &all);
    if (st != HCOLL_SUCCESS)
        return st;
    const int n = sp->allgather ? sp->nranks : 1;
    int refuser = -1;
    for (int i = 0; i < n && refuser < 0; i++)
        if (!all[i])
            refuser = i;
    free(all);

    if (net == HC_NET_TCP) {
        HC_INFO(HC_NET, sp->rank, "transport: tcp (HCOLL_NET=tcp)");
        *ops_out = &hc_tcp_ops;
        return HCOLL_SUCCESS;
    }
    if (net == HC_NET_IB && !mine)
        return hc_err_set(sp->errbuf, HC_NET, sp->rank, HCOLL_ERR_UNSUPPORTED,
                          "HCOLL_NET=ib: the verbs transport is not built for this rank: %s; use "
                          "HCOLL_NET=tcp or auto",
                          why);
    if (net == HC_NET_AUTO && !mine) {
        HC_INFO(HC_NET, sp->rank, "NET: %s, using TCP", why);
        *ops_out = &hc_tcp_ops;
        return HCOLL_SUCCESS;
    }
    if (net == HC_NET_AUTO && refuser >= 0) {
        HC_INFO(HC_NET, sp->rank, "NET: rank %d cannot use verbs, using TCP", refuser);
        *ops_out = &hc_tcp_ops;
        return HCOLL_SUCCESS;
    }
    HC_INFO(HC_NET, sp->rank, "transport: ib (HCOLL_NET=%s: %d ACTIVE RDMA port(s)%s%s)",
            net == HC_NET_IB ? "ib" : "auto", c.nselected, s->ib_hca[0] ? " matching " : "",
            s->ib_hca);
    *ops_out = &hc_ib_ops;
    return HCOLL_SUCCESS;
}
