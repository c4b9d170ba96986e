/*
 * Transport choice, in one place (HCOLL_NET):
 *
 *   tcp   TCP
 *   ib    verbs, or HCOLL_ERR_UNSUPPORTED saying what was found
 *   auto  verbs when libibverbs loads and an ACTIVE port passes
 *         HCOLL_IB_HCA, else TCP with an INFO line saying why
 *
 * Which NIC each local rank then uses is decided when the verbs transport
 * is created (hc_ibdev_for_rank with the rank's rail and GPU).
 */
#include "inter/transport.h"

#include <stdio.h>
#include <string.h>

#include "core/config.h"
#include "core/log.h"
#include "inter/ib/ib.h"

hcoll_status_t hc_transport_select(int net, hc_errbuf_t *eb, int log_rank,
                                   const hc_transport_ops_t **ops_out)
{
    if (net == HC_NET_TCP) {
        HC_INFO(HC_NET, log_rank, "transport: tcp (HCOLL_NET=tcp)");
        *ops_out = &hc_tcp_ops;
        return HCOLL_SUCCESS;
    }
    if (net != HC_NET_IB && net != HC_NET_AUTO)
        return hc_err_set(eb, HC_NET, log_rank, HCOLL_ERR_INVALID_ARG,
                          "HCOLL_NET: unknown transport kind %d", net);
    hc_ib_config_t cfg;
    char err[300], why[300] = "";
    if (hc_ib_config_from_env(&cfg, err, sizeof err) != HCOLL_SUCCESS)
        return hc_err_set(eb, HC_NET, log_rank, HCOLL_ERR_INVALID_ARG, "%s", err);
    /* Any rank's NIC will do for the question "is verbs usable here". */
    hc_ib_choice_t c;
    if (hc_ib_usable(&cfg, 0, &c, why, sizeof why)) {
        HC_INFO(HC_NET, log_rank, "transport: ib (HCOLL_NET=%s: %d ACTIVE RDMA port(s)%s%s)",
                net == HC_NET_IB ? "ib" : "auto", c.nselected, cfg.hca[0] ? " matching " : "",
                cfg.hca);
        *ops_out = &hc_ib_ops;
        return HCOLL_SUCCESS;
    }
    if (net == HC_NET_IB)
        return hc_err_set(eb, HC_NET, log_rank, HCOLL_ERR_UNSUPPORTED,
                          "HCOLL_NET=ib: the verbs transport is not built for this rank: %s; use "
                          "HCOLL_NET=tcp or auto",
                          why);
    HC_INFO(HC_NET, log_rank, "NET: %s, using TCP", why);
    *ops_out = &hc_tcp_ops;
    return HCOLL_SUCCESS;
}
