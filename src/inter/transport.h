/*
 * The inter-node transport seam: an RDMA-shaped ops table that the ring
 * drives and that a backend implements (tcp.c; ib/ over libibverbs).
 *
 *   rank A                                    rank B
 *   ┌───────────────┐  put(lmr+loff → rkey+roff, len, imm)  ┌───────────────┐
 *   │ region (lmr)  │ ────────────────────────────────────► │ region (rkey) │
 *   └───────────────┘                                       └───────────────┘
 *     poll → HC_COMP_PUT (wr_id)                 poll → HC_COMP_IMM (imm, peer)
 *     "source may be reused"                     "payload is in place"
 *
 * verbs maps onto it one to one (ibv_reg_mr, RC QP, RDMA_WRITE_WITH_IMM,
 * ibv_poll_cq); TCP emulates the write with a framed header and payload.
 *
 * Ordering guarantees, per endpoint (the only ones a user may rely on):
 *   - A put's immediate is reported (HC_COMP_IMM at the target) only after
 *     its whole payload is in the target region.
 *   - A put's local completion (HC_COMP_PUT) means the source bytes have
 *     been taken: the source may be rewritten. It does NOT mean the target
 *     has them.
 *   - Puts on one endpoint are NOT ordered with respect to each other (TCP
 *     with several sockets per peer stripes them; a verbs backend may use
 *     several QPs). Users that need an order build it from immediates.
 *   - Nothing is ordered across endpoints.
 * Flow control is the user's: a put may target any registered bytes at any
 * time, and the transport lands it there. The ring keeps staging slots safe
 * with credits (a slot is put into only after its receiver handed it back
 * with a zero-length put whose immediate names it), which maps to verbs as
 * a zero-byte RDMA_WRITE_WITH_IMM.
 *
 * Threading: one transport instance is used by one thread at a time (the
 * ring's caller: the executor, or the communicator's ring thread). Distinct
 * instances are independent; there is no process-wide mutable state.
 *
 * Files: select.c picks the ops table (the only file that names both
 * backends); tcp.c and ib/ implement it; seam.c holds what both backends
 * share (the completion FIFO, the sticky-failure recorder). Calls run one
 * way: select -> backends -> seam.
 */
#ifndef HC_INTER_TRANSPORT_H
#define HC_INTER_TRANSPORT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "base/err.h"
#include "base/exchange.h"
#include "hcoll.h"

/* Endpoint addresses are exchanged with the set-up exchange of
 * base/exchange.h, over the transport's ranks. */

typedef struct hc_transport hc_transport_t; /* one instance per ring */
typedef struct hc_ep hc_ep_t;               /* a connection to one peer */
typedef struct hc_mr hc_mr_t;               /* a registered local region */

/* What a peer needs to target a region; opaque, copied byte for byte.
 * TCP: w[0] = region id. verbs: remote address and rkey. */
typedef struct hc_rkey {
    uint64_t w[2];
} hc_rkey_t;

#define HC_TP_KEY_BYTES 32
#define HC_TP_MAC_BYTES 32
/* HMAC-SHA-256 of data under key into out (HC_TP_MAC_BYTES). */
typedef void (*hc_mac_fn)(const void *key, size_t keylen, const void *data, size_t len,
                          unsigned char out[HC_TP_MAC_BYTES]);

typedef struct hc_transport_params {
    int rank;                /* this rank's index among the transport's ranks */
    int nranks;
    const char *bind_addr;   /* IPv4 address (rail) to listen on and send from */
    const char *ifname;      /* for the log line only; may be NULL */
    int rail;                /* the rank's rail (kept by split): picks the verbs NIC */
    int log_rank;            /* rank printed in logs (communicator rank) */
    int timeout_ms;          /* connection set-up and silent-link deadline */
    int nsocks_perpeer;      /* TCP: sockets per peer, >= 1 */
    uint64_t socket_buf;     /* TCP: SO_SNDBUF/SO_RCVBUF, 0 = autotuning */
    hc_errbuf_t *errbuf;     /* where error messages go (NULL: thread's) */
    int has_gpu;             /* verbs: gpu below is this rank's GPU: it orders */
    int gpu;                 /* the NICs by PCI distance and decides GPUDirect */
    const int *peer_ranks;   /* [nranks] communicator rank at each position, for
                              * messages; NULL: positions are the ranks */
    const hc_params_t *settings; /* the communicator's knobs, read at create and not
                              * kept: verbs takes HCA list, GID index, TC, SL,
                              * timeout, retry count, GDR level and flush and
                              * sysfs root from it (required); TCP its
                              * HCOLL_TCP_RCVLOWAT (NULL: 0) */
    const int *cancel_fd;    /* NULL, or an eventfd that turns readable when the
                              * set-up is cancelled (the communicator's, which
                              * abort and destroy write): connect's waits that
                              * are not exchanges (dial, accept) watch it and
                              * end with HCOLL_ERR_ABORTED */
    /* TCP's hello (tcp_hello.c): both ends of every data connection prove
     * with HMAC-SHA-256 over fresh nonces of both sides that they hold
     * auth_key (HC_TP_KEY_BYTES bytes: the communicator's bootstrap key,
     * read at create and not kept). mac is HMAC-SHA-256 (the caller passes
     * boot's hc_hmac_sha256: inter may not call boot). TCP refuses to be
     * created without both; verbs ignores them. */
    const unsigned char *auth_key;
    hc_mac_fn mac;
} hc_transport_params_t;

/* A transport's failure: the first one is recorded in *err and logged as
 * "<who>: <message>"; later ones (cascades of the first) only return *err. */
hcoll_status_t hc_tp_failv(const hc_transport_params_t *p, hcoll_status_t *err, hcoll_status_t st,
                           const char *who, const char *fmt, va_list ap);

/* Set-up waits that watch p->cancel_fd (seam.c): poll fd for ev up to
 * timeout_ms. 1 ready, 0 timed out, -1 poll failed (errno), -2 cancelled. */
int hc_tp_wait_fd(const hc_transport_params_t *p, int fd, short ev, int timeout_ms);
/* 1 when p->cancel_fd is readable (never blocks). */
int hc_tp_cancelled(const hc_transport_params_t *p);

/* Fill buf from getrandom (nonces, tokens, region keys): 0, or -1 with
 * errno; never a weaker source. */
int hc_tp_random(void *buf, size_t len);

/* The rank to name in a message about the peer at position pos. */
static inline int hc_tp_rank(const hc_transport_params_t *p, int pos)
{
    return p->peer_ranks && pos >= 0 && pos < p->nranks ? p->peer_ranks[pos] : pos;
}

enum hc_comp_kind {
    HC_COMP_PUT = 1, /* a local put finished: wr_id is valid */
    HC_COMP_IMM = 2, /* a remote put landed here: imm and peer are valid */
};

typedef struct hc_comp {
    int kind;        /* enum hc_comp_kind */
    int peer;        /* rank of the endpoint's peer */
    uint32_t imm;
    uint64_t wr_id;
} hc_comp_t;

/* The completions a transport has found and not yet reported through
 * poll: a FIFO that grows as needed (shared by the transports). */
typedef struct hc_compq {
    hc_comp_t *buf; /* circular */
    size_t cap, head, count;
} hc_compq_t;

/* 0, or -1 when out of memory (q unchanged). */
int hc_compq_push(hc_compq_t *q, const hc_comp_t *c);
/* Up to max completions, oldest first, into out; returns how many. */
int hc_compq_pop(hc_compq_t *q, hc_comp_t *out, int max);
void hc_compq_free(hc_compq_t *q);

typedef struct hc_transport_ops {
    const char *name;

    hcoll_status_t (*create)(const hc_transport_params_t *params, hc_transport_t **tr_out);

    /* Connect one endpoint to each of peers[0..npeers-1] (distinct, not
     * self). Collective over all nranks: every rank calls it once, and the
     * addresses are exchanged with allgather. Blocks up to timeout_ms.
     * eps_out[i] is the endpoint to peers[i]. */
    hcoll_status_t (*connect)(hc_transport_t *tr, const int *peers, int npeers,
                              hc_allgather_fn allgather, void *ag_ctx, hc_ep_t **eps_out);

    /* Register [base, base+len) (host memory; device memory where the
     * backend supports it). rkey_out is what a peer passes to put; NULL
     * registers a region this rank only sends from, which no peer may
     * reach (verbs: no remote access flags). */
    hcoll_status_t (*mr_reg)(hc_transport_t *tr, void *base, size_t len, hc_mr_t **mr_out,
                             hc_rkey_t *rkey_out);
    void (*mr_dereg)(hc_transport_t *tr, hc_mr_t *mr);

    /* 1 when mr_reg takes device memory of this rank's GPU and the NIC
     * writes it directly (GPUDirect RDMA, with any flush it needs done
     * before the immediate is reported). NULL: never. */
    int (*gdr)(hc_transport_t *tr);

    /* Start a one-sided write of lmr[loff, loff+len) to the peer's region
     * rkey at roff, carrying imm. len may be 0 (a pure notification). Does
     * not block; completes through poll. */
    hcoll_status_t (*put)(hc_ep_t *ep, hc_mr_t *lmr, size_t loff, const hc_rkey_t *rkey,
                          uint64_t roff, size_t len, uint32_t imm, uint64_t wr_id);

    /* Progress and reap up to max completions into comps. Waits up to
     * wait_ms (0: never blocks) when there is nothing to report. Returns an
     * error once any endpoint failed (sticky): HCOLL_ERR_PEER_FAILED (peer
     * closed or reset), HCOLL_ERR_TIMEOUT (link silent past the deadline),
     * HCOLL_ERR_NETWORK (malformed traffic). */
    hcoll_status_t (*poll)(hc_transport_t *tr, hc_comp_t *comps, int max, int wait_ms,
                           int *n_out);

    /* Optional (NULL: nothing to keep, as for TCP, which copies through
     * sockets and registers nothing with a device). Keep [base, base+len)
     * registered until mem_unpin, so that mr_reg of any range inside it
     * finds that registration instead of making one. *pin_out may be NULL
     * on success (memory this backend never registers, e.g. device memory
     * it stages). A failure is not sticky: the transport stays usable. */
    hcoll_status_t (*mem_pin)(hc_transport_t *tr, void *base, size_t len, hc_mr_t **pin_out);
    void (*mem_unpin)(hc_transport_t *tr, hc_mr_t *pin); /* NULL pin: no-op */

    /* Optional: what carries this instance's rail, for messages (verbs:
     * "mlx5_1 port 1"), into buf. NULL: the rail's IP interface names it
     * (TCP). */
    void (*rail_name)(hc_transport_t *tr, char *buf, size_t len);

    /* Close every endpoint and free the instance. graceful: tell peers this
     * is an orderly goodbye; otherwise reset the connections so that peers
     * notice a failure at once. NULL is a no-op. */
    void (*destroy)(hc_transport_t *tr, int graceful);

    /* Optional (NULL: never). 1 when [base, base+len) of host memory lies
     * inside a registration someone holds now (mem_pin: hcoll_mem_register),
     * so that mr_reg of it would register nothing; idle cache entries (of
     * memory that may have been freed) do not count. Changes nothing. */
    int (*mem_pinned)(hc_transport_t *tr, const void *base, size_t len);
} hc_transport_ops_t;

/* What the selector needs to know about this rank (select.c). */
typedef struct hc_select_params {
    const hc_params_t *settings; /* net (HCOLL_NET) and the verbs settings */
    int rank;                    /* communicator rank: logs and messages */
    int local_rank;              /* picks this rank's NIC */
    int gpu;                     /* CUDA ordinal of this rank's GPU, -1 none */
    hc_errbuf_t *errbuf;         /* NULL: the calling thread's */
    int nranks;                  /* ranks taking part in the agreement */
    hc_allgather_fn allgather;   /* over those nranks ranks; NULL: this rank alone */
    void *ag_ctx;
} hc_select_params_t;

/*
 * The one place that picks a transport, in one agreement: every rank
 * publishes one byte (1: verbs works for its own NIC; always 0 under
 * HCOLL_NET=tcp, which never loads libibverbs) through allgather, and
 *   tcp   TCP;
 *   ib    verbs, or HCOLL_ERR_UNSUPPORTED naming what this rank found;
 *   auto  verbs when every rank published 1, else TCP with an INFO line
 *         naming the reason (this rank's, or the first rank that cannot).
 * Collective over the nranks ranks when allgather is given (every rank
 * calls it once, whatever its HCOLL_NET); blocks for that exchange only.
 */
hcoll_status_t hc_transport_select(const hc_select_params_t *sp,
                                   const hc_transport_ops_t **ops_out);

/* Process-wide counts of what the backends did with the NIC's memory
 * registration (seam.c): a statistic for hcoll_rdma_counters, shared by
 * every communicator of the process on purpose (registrations pin pages
 * of the process, whichever communicator asked). Thread-safe. */
enum hc_tp_counter {
    HC_TP_REG,        /* ibv_reg_mr / ibv_reg_dmabuf_mr calls that succeeded */
    HC_TP_DEREG,      /* ibv_dereg_mr calls */
    HC_TP_CACHE_HIT,  /* mr_reg / mem_pin served by the registration cache */
    HC_TP_CACHE_MISS, /* mr_reg / mem_pin that had to register */
    HC_TP_NCOUNTERS
};
void hc_tp_count(enum hc_tp_counter which);
uint64_t hc_tp_counter(enum hc_tp_counter which);

/* The TCP backend's table (tcp.c). */
extern const hc_transport_ops_t hc_tcp_ops;
/* The verbs backend's table (ib/ib.c; loads libibverbs at run time).
 * create needs params->settings. */
extern const hc_transport_ops_t hc_ib_ops;

#endif
