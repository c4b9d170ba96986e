/*
 * The TCP transport's objects, shared by its files and by nothing else:
 *
 *   tcp.c       the instance: create, regions, destroy, the ops table
 *   tcp_conn.c  connection set-up: endpoints, socket options, watching
 *   tcp_hello.c dialling and accepting in one loop, the authenticated hello
 *   tcp_ep.c    the data path: send queues, frame parsing, progress, poll
 *
 * The calls go one way, tcp.c -> tcp_conn.c / tcp_ep.c; what all three
 * need (the failure recorder, region lookup) is inline here.
 */
#ifndef HC_INTER_TCP_PRIV_H
#define HC_INTER_TCP_PRIV_H

#include <netinet/in.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "inter/tcp.h"

#define HC_TCP_ADDR_MAGIC  0x48434144u /* "HCAD" */
#define HC_TCP_HELLO_MAGIC 0x4843484cu /* "HCHL" */
/* Headers are read into the socket's buffer with whatever follows them:
 * a frame up to 16 KiB (a small all-reduce's) in one recv, where 4 KiB took
 * a second for the payload's tail; copying it out costs far less than that
 * system call. Longer payloads go straight into their region after it. */
#define HC_TCP_RXBUF       (16 * 1024)
#define HC_TCP_IOV_MAX     64
#define HC_TCP_LOWAT_MIN   (16 * 1024) /* smaller payload rests: SO_RCVLOWAT 1 */
#define HC_TCP_HDR         ((size_t)sizeof(hc_tcp_hdr_t))

/* Published through the allgather. */
typedef struct tcp_addr {
    uint32_t magic;
    uint32_t ip;     /* network order */
    uint32_t port;   /* host order */
    uint32_t rank;
    uint64_t token;  /* random per instance: names the instance a hello is for */
} tcp_addr_t;

/* The hello (tcp_hello.c): dialer -> acceptor, acceptor -> dialer, dialer
 * -> acceptor; fixed sizes, host byte order as the frames. */
#define HC_TCP_NONCE 16
#define HC_TCP_CHAL_MAGIC 0x48434348u /* "HCCH" */
#define HC_TCP_RESP_MAGIC 0x48435253u /* "HCRS" */
typedef struct tcp_hello {
    uint32_t magic;
    uint32_t rank;     /* the dialer's position */
    uint32_t sock_idx;
    uint32_t nsocks;
    uint64_t token;    /* the acceptor's token (not a secret: a filter) */
    unsigned char nonce[HC_TCP_NONCE];
} tcp_hello_t;

typedef struct tcp_chal {
    uint32_t magic;
    uint32_t pad;
    unsigned char nonce[HC_TCP_NONCE];
    unsigned char mac[HC_TP_MAC_BYTES]; /* the acceptor's proof */
} tcp_chal_t;

typedef struct tcp_resp {
    uint32_t magic;
    uint32_t pad;
    unsigned char mac[HC_TP_MAC_BYTES]; /* the dialer's proof */
} tcp_resp_t;

struct hc_mr {
    uint64_t id;     /* random, never 0; 0 for a send-only region */
    int remote;      /* peers may put into it (mr_reg gave an rkey) */
    char *base;
    size_t len;
    struct hc_mr *next;
};

typedef struct tx_entry {
    hc_tcp_hdr_t hdr;
    const char *src;
    size_t len;  /* payload bytes actually sent (hdr.len may be corrupted) */
    size_t done; /* bytes of header + payload written so far */
    uint64_t wr_id;
    int signal;  /* report HC_COMP_PUT */
} tx_entry_t;

typedef struct tcp_sock {
    int fd;
    hc_ep_t *ep;
    int in_epoll;
    int want_out;                  /* EPOLLOUT armed */
    tx_entry_t *txq;               /* circular */
    size_t txcap, txhead, txcount;
    /* receive state */
    int rx_payload;                /* 1: reading a payload directly */
    char *rx_dst;
    size_t rx_left;
    uint32_t rx_imm;
    size_t rxpos, rxfill;
    int lowat;                     /* SO_RCVLOWAT set now (0: never set, 1) */
    int rcvbuf;                    /* SO_RCVBUF last read, for lowat's cap */
    char rxbuf[HC_TCP_RXBUF];
} tcp_sock_t;

struct hc_ep {
    hc_transport_t *tr;
    int peer;
    int nsocks;
    tcp_sock_t *socks;
    unsigned rr;
    int bye;      /* peer said goodbye: its EOF is not a failure */
    int corrupt;  /* enum hc_tcp_corrupt, test hook */
};

struct hc_transport {
    hc_transport_params_t p;
    char bind_addr[64];
    char ifname[64];
    struct in_addr ip;
    int listen_fd;
    int port;
    int epfd;
    uint64_t token;
    unsigned char hkey[HC_TP_KEY_BYTES]; /* the hello's key, from params.auth_key */
    hc_mac_fn mac;
    hc_mr_t *mrs;
    hc_ep_t **eps;
    int neps;
    size_t rcvlowat; /* HCOLL_TCP_RCVLOWAT: largest SO_RCVLOWAT, 0 = never set */
    uint64_t lowat_raised; /* times a payload raised a socket's SO_RCVLOWAT */
    uint64_t nrecv, nwait; /* recv and epoll_wait calls of the data path */
    hc_compq_t cq; /* found, not yet reported */
    hcoll_status_t err; /* sticky: the first failure */
};

/* ---- shared by the three files ------------------------------------------ */

static inline hcoll_status_t hc_tcp_fail(hc_transport_t *tr, hcoll_status_t st, const char *fmt,
                                         ...) __attribute__((format(printf, 3, 4)));

/* The first failure is recorded and logged; later ones (cascades of the
 * first) only return the sticky status. */
static inline hcoll_status_t hc_tcp_fail(hc_transport_t *tr, hcoll_status_t st, const char *fmt,
                                         ...)
{
    char who[96];
    snprintf(who, sizeof who, "tcp rank %d (%s)", tr->p.log_rank, tr->bind_addr);
    va_list ap;
    va_start(ap, fmt);
    st = hc_tp_failv(&tr->p, &tr->err, st, who, fmt, ap);
    va_end(ap);
    return st;
}

static inline void hc_tcp_sock_unwatch(hc_transport_t *tr, tcp_sock_t *s)
{
    if (s->in_epoll) {
        epoll_ctl(tr->epfd, EPOLL_CTL_DEL, s->fd, NULL);
        s->in_epoll = 0;
    }
}

/* SO_SNDBUF/SO_RCVBUF from the parameters; before listen/connect, as they
 * decide window scaling. */
static inline void hc_tcp_set_bufs(const hc_transport_t *tr, int fd)
{
    if (tr->p.socket_buf) {
        int v = (int)tr->p.socket_buf;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
    }
}

static inline hc_mr_t *hc_tcp_mr_find(hc_transport_t *tr, uint64_t id)
{
    /* Most-recent first; a ring holds a handful of regions. A send-only
     * region has no key a peer could name. */
    for (hc_mr_t *mr = tr->mrs; mr; mr = mr->next)
        if (mr->remote && mr->id == id)
            return mr;
    return NULL;
}


/* ---- tcp_conn.c: connection set-up -------------------------------------- */


/* connect() of the ops table. */
hcoll_status_t hc_tcp_connect(hc_transport_t *tr, const int *peers, int npeers,
                              hc_allgather_fn allgather, void *ag_ctx, hc_ep_t **eps_out);

/* Close an endpoint's sockets and free it (not unwatched: the caller's). */
void hc_tcp_ep_free(hc_ep_t *ep);

/* ---- tcp_hello.c: dialling, accepting and the hello -------------------- */

/* Make every socket of eps: ns dialled to each higher peer in all[], ns
 * accepted from each lower one, all at once in one loop, each checked by
 * the hello; a connection that is not an expected peer is dropped without
 * holding up the others. Blocks until every socket is in place, deadline
 * (HCOLL_ERR_TIMEOUT, naming who is missing), cancellation or a peer that
 * fails to prove the key (HCOLL_ERR_MISMATCH). */
hcoll_status_t hc_tcp_handshake(hc_transport_t *tr, const tcp_addr_t *all, const int *peers,
                                int npeers, hc_ep_t **eps, double deadline);

/* ---- tcp_ep.c: the data path -------------------------------------------- */

/* put() and poll() of the ops table. */
hcoll_status_t hc_tcp_put(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                          uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id);
hcoll_status_t hc_tcp_poll(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                           int *n_out);

/* Queue a goodbye frame on every open socket and write the queues out for
 * up to a second (or the timeout, if shorter). */
void hc_tcp_say_goodbye(hc_transport_t *tr);

#endif
