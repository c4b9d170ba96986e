/*
 * TCP transport: emulates RDMA write-with-immediate over plain sockets.
 * This file holds the instance (its listening socket, epoll set and
 * registered regions), its creation and destruction, and the ops table;
 * connection set-up is in tcp_conn.c, the data path (the drawing of a put)
 * in tcp_ep.c, the wire frame in tcp.h.
 *
 * A registered region is a name, not a pinning: its random id travels in
 * the rkey, and a receiver checks every frame's target against the
 * region's bounds before writing a byte; a region registered without an
 * rkey (only sent from) has no id a frame can name.
 */
#include "inter/tcp_priv.h"
#include "base/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/config.h"
#include "base/log.h"

static hcoll_status_t tcp_create(const hc_transport_params_t *params, hc_transport_t **tr_out)
{
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_transport_t *tr = calloc(1, sizeof *tr);
    if (!tr)
        return hc_err_set(params->errbuf, HC_NET, params->log_rank, HCOLL_ERR_NO_MEMORY,
                          "tcp: out of memory creating the transport");
    tr->p = *params;
    tr->listen_fd = tr->epfd = -1;
    if (tr->p.nsocks_perpeer < 1)
        tr->p.nsocks_perpeer = 1;
    if (tr->p.timeout_ms < 1)
        tr->p.timeout_ms = 1;
    snprintf(tr->bind_addr, sizeof tr->bind_addr, "%s",
             params->bind_addr ? params->bind_addr : "");
    snprintf(tr->ifname, sizeof tr->ifname, "%s", params->ifname ? params->ifname : "?");
    tr->p.bind_addr = tr->bind_addr;
    tr->p.ifname = tr->ifname;
    tr->rcvlowat = params->settings ? (size_t)params->settings->tcp_rcvlowat : 0;
    tr->p.settings = NULL; /* read here, not kept */

    if (inet_pton(AF_INET, tr->bind_addr, &tr->ip) != 1) {
        st = hc_tcp_fail(tr, HCOLL_ERR_INVALID_ARG,
                         "bind address '%s' is not an IPv4 address", tr->bind_addr);
        goto clean_tr;
    }
    if (!params->auth_key || !params->mac) {
        st = hc_tcp_fail(tr, HCOLL_ERR_INVALID_ARG,
                         "no key for the data connections' hello (auth_key and mac)");
        goto clean_tr;
    }
    /* No weaker source if the kernel has none: a guessable token or nonce
     * is worse than a clear failure. */
    if (hc_tp_random(&tr->token, sizeof tr->token) != 0) {
        st = hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "getrandom: %s", strerror(errno));
        goto clean_tr;
    }
    /* A key of its own, so that a hello's MAC is no MAC of the bootstrap. */
    tr->mac = params->mac;
    tr->mac(params->auth_key, HC_TP_KEY_BYTES, "hcoll-tcp-hello-v1", 18, tr->hkey);
    tr->p.auth_key = NULL;

    tr->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (tr->listen_fd < 0) {
        st = hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "socket: %s", strerror(errno));
        goto clean_tr;
    }
    hc_tcp_set_bufs(tr, tr->listen_fd);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr = tr->ip, .sin_port = 0 };
    if (bind(tr->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(tr->listen_fd, 128) != 0) {
        st = hc_tcp_fail(tr, HCOLL_ERR_NETWORK, "cannot listen on %s: %s", tr->bind_addr,
                         strerror(errno));
        goto clean_socket;
    }
    socklen_t sl = sizeof sa;
    getsockname(tr->listen_fd, (struct sockaddr *)&sa, &sl);
    tr->port = ntohs(sa.sin_port);

    tr->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (tr->epfd < 0) {
        st = hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "epoll_create1: %s", strerror(errno));
        goto clean_socket;
    }
    HC_INFO(HC_NET, tr->p.log_rank,
            "rank %d -> rail %d %s %s (tcp port %d, ring position %d, %d socket%s per peer)",
            tr->p.log_rank, tr->p.rail, tr->ifname, tr->bind_addr, tr->port, tr->p.rank,
            tr->p.nsocks_perpeer, tr->p.nsocks_perpeer > 1 ? "s" : "");
    *tr_out = tr;
    return HCOLL_SUCCESS;

clean_socket:
    close(tr->listen_fd);
clean_tr:
    explicit_bzero(tr->hkey, sizeof tr->hkey);
    free(tr);
    return st;
}

int hc_tcp_listen_port(const hc_transport_t *tr)
{
    return tr->port;
}

/* ------------------------------------------------------------------------ */
/* Memory regions                                                             */
/* ------------------------------------------------------------------------ */

static hcoll_status_t tcp_mr_reg(hc_transport_t *tr, void *base, size_t len, hc_mr_t **mr_out,
                                 hc_rkey_t *rkey_out)
{
    hc_mr_t *mr = calloc(1, sizeof *mr);
    if (!mr)
        return hc_tcp_fail(tr, HCOLL_ERR_NO_MEMORY, "out of memory registering %zu bytes", len);
    /* A random key, unique among this instance's regions: a peer that
     * guesses (or remembers a deregistered key) hits no region. Without
     * rkey_out the region is only sent from and no frame may target it. */
    mr->remote = rkey_out != NULL;
    while (mr->remote && (mr->id == 0 || hc_tcp_mr_find(tr, mr->id))) {
        if (hc_tp_random(&mr->id, sizeof mr->id) != 0) {
            int err = errno;
            free(mr);
            return hc_tcp_fail(tr, HCOLL_ERR_SYSTEM, "getrandom for a region key: %s",
                               strerror(err));
        }
    }
    mr->base = base;
    mr->len = len;
    mr->next = tr->mrs;
    tr->mrs = mr;
    if (rkey_out) {
        rkey_out->w[0] = mr->id;
        rkey_out->w[1] = len;
    }
    *mr_out = mr;
    return HCOLL_SUCCESS;
}

static void tcp_mr_dereg(hc_transport_t *tr, hc_mr_t *mr)
{
    if (!mr)
        return;
    for (hc_mr_t **pp = &tr->mrs; *pp; pp = &(*pp)->next)
        if (*pp == mr) {
            *pp = mr->next;
            break;
        }
    free(mr);
}

/* ------------------------------------------------------------------------ */
/* Close                                                                      */
/* ------------------------------------------------------------------------ */

static void tcp_destroy(hc_transport_t *tr, int graceful)
{
    if (!tr)
        return;
    graceful = graceful && tr->err == HCOLL_SUCCESS;
    if (graceful)
        hc_tcp_say_goodbye(tr);
    for (int i = 0; i < tr->neps; i++) {
        hc_ep_t *ep = tr->eps[i];
        for (int k = 0; k < ep->nsocks; k++) {
            tcp_sock_t *s = &ep->socks[k];
            if (s->fd < 0)
                continue;
            if (graceful) {
                /* Unread bytes at close() turn the FIN into a reset. */
                char sink[4096];
                while (recv(s->fd, sink, sizeof sink, MSG_DONTWAIT) > 0)
                    ;
            } else {
                struct linger lg = { 1, 0 }; /* reset: peers learn at once */
                setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            }
        }
        hc_tcp_ep_free(ep);
    }
    free(tr->eps);
    while (tr->mrs)
        tcp_mr_dereg(tr, tr->mrs);
    hc_compq_free(&tr->cq);
    close(tr->epfd);
    close(tr->listen_fd);
    explicit_bzero(tr->hkey, sizeof tr->hkey);
    free(tr);
}

const hc_transport_ops_t hc_tcp_ops = {
    .name = "tcp",
    .create = tcp_create,
    .connect = hc_tcp_connect,
    .mr_reg = tcp_mr_reg,
    .mr_dereg = tcp_mr_dereg,
    .put = hc_tcp_put,
    .poll = hc_tcp_poll,
    .destroy = tcp_destroy,
};
