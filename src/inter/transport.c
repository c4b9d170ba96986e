/*
 * Transport choice, in one place (HCOLL_NET). There is no verbs backend in
 * this version, so "ib" is refused with a reason and "auto" settles on TCP,
 * saying why at INFO.
 */
#include "inter/transport.h"

#include <dirent.h>
#include <string.h>

#include "core/config.h"
#include "core/log.h"

/* Number of RDMA devices the kernel exposes; only used to make the "why"
 * of the choice precise. */
static int rdma_device_count(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

hcoll_status_t hc_transport_select(int net, hc_errbuf_t *eb, int log_rank,
                                   const hc_transport_ops_t **ops_out)
{
    const int ndev = rdma_device_count();
    switch (net) {
    case HC_NET_TCP:
        HC_INFO(HC_NET, log_rank, "transport: tcp (HCOLL_NET=tcp)");
        *ops_out = &hc_tcp_ops;
        return HCOLL_SUCCESS;
    case HC_NET_IB:
        return hc_err_set(eb, HC_NET, log_rank, HCOLL_ERR_UNSUPPORTED,
                          "HCOLL_NET=ib: the verbs transport is not built into this version of "
                          "hcoll (%d RDMA device(s) present); use HCOLL_NET=tcp or auto",
                          ndev);
    case HC_NET_AUTO:
        HC_INFO(HC_NET, log_rank,
                "transport: tcp (HCOLL_NET=auto: %s; the verbs transport is not built into "
                "this version)",
                ndev ? "RDMA device(s) present but unusable" : "no RDMA device found");
        *ops_out = &hc_tcp_ops;
        return HCOLL_SUCCESS;
    default:
        return hc_err_set(eb, HC_NET, log_rank, HCOLL_ERR_INVALID_ARG,
                          "HCOLL_NET: unknown transport kind %d", net);
    }
}
