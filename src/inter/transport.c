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
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/err.h"
#include "base/log.h"
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

int hc_compq_push(hc_compq_t *q, const hc_comp_t *c)
{
    if (q->count == q->cap) {
        size_t ncap = q->cap ? q->cap * 2 : 256;
        hc_comp_t *n = malloc(ncap * sizeof *n);
        if (!n)
            return -1;
        for (size_t i = 0; i < q->count; i++)
            n[i] = q->buf[(q->head + i) % q->cap];
        free(q->buf);
        q->buf = n;
        q->cap = ncap;
        q->head = 0;
    }
    q->buf[(q->head + q->count) % q->cap] = *c;
    q->count++;
    return 0;
}

int hc_compq_pop(hc_compq_t *q, hc_comp_t *out, int max)
{
    int k = 0;
    while (k < max && q->count) {
        out[k++] = q->buf[q->head];
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    return k;
}

void hc_compq_free(hc_compq_t *q)
{
    free(q->buf);
    memset(q, 0, sizeof *q);
}

hcoll_status_t hc_tp_failv(const hc_transport_params_t *p, hcoll_status_t *err, hcoll_status_t st,
                           const char *who, const char *fmt, va_list ap)
{
    if (*err != HCOLL_SUCCESS)
        return *err;
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    *err = st;
    hc_err_set(p->errbuf, HC_NET, p->log_rank, st, "%s: %s", who, msg);
    return st;
}
