/*
 * A dissemination barrier among N ranks over any transport (transport.h),
 * on a transport instance of its own.
 *
 *   round k = 0 .. ceil(log2 N)-1, at position p:
 *     signal  p + 2^k  (a zero-byte put whose immediate names the barrier
 *                       and the round)
 *     wait    p - 2^k  (its signal of round k)
 *
 *   N = 5:  round 0   0→1 1→2 2→3 3→4 4→0
 *           round 1   0→2 1→3 2→4 3→0 4→1
 *           round 2   0→4 1→0 2→1 3→2 4→3
 *
 * After round k a rank has heard, directly or through the chain, from the
 * 2^(k+1) - 1 ranks before it; after the last round from all N - 1, so
 * nobody leaves before everyone entered. The partners at distance 2^k are
 * connected once, at create.
 *
 * Barriers are named by the caller's operation number (seq, equal on every
 * rank for the same call: the executor counts its operations). A signal
 * for the next barrier may land while this rank still finishes the
 * current one or runs the operation before it: it is kept. A signal for
 * the operation this rank runs as something else (hc_dissem_absorb) means
 * that rank entered a barrier where this one called another collective:
 * HCOLL_ERR_MISMATCH instead of two waits that never end.
 *
 * Why a transport instance of its own: its completions never reach the
 * ring, which would not know what to do with a signal that lands in the
 * middle of an all-reduce, and the ring's never reach it.
 *
 * Threading: one thread at a time (the executor's, or the ring thread
 * while the executor waits for it); hc_dissem_fail from that thread too.
 */
#ifndef HC_INTER_DISSEM_H
#define HC_INTER_DISSEM_H

#include <stdint.h>

#include "inter/transport.h"

typedef struct hc_dissem hc_dissem_t;

typedef struct hc_dissem_params {
    const hc_transport_ops_t *ops;  /* from hc_transport_select, as the ring's */
    /* tp.rank/tp.nranks: position and size among the barrier's ranks;
     * tp.timeout_ms bounds create; nsocks_perpeer is forced to 1. */
    hc_transport_params_t tp;
    hc_allgather_fn allgather;      /* address exchange among the N ranks */
    void *ag_ctx;
    /* How long a round waits for a partner that is alive but has not
     * entered: > 0 ms, < 0 no limit, 0 tp.timeout_ms. */
    int op_timeout_ms;
} hc_dissem_params_t;

/* Connect to every partner. Collective over the N ranks (every one calls
 * it at the same point of its set-up); blocks up to tp.timeout_ms. N = 1
 * connects nothing. */
hcoll_status_t hc_dissem_create(const hc_dissem_params_t *p, hc_dissem_t **out);

/* Enter barrier seq and send the first round. Non-blocking. */
hcoll_status_t hc_dissem_start(hc_dissem_t *d, uint32_t seq);

/* Drive the barrier: returns when it is done (*done_out = 1) or when
 * nothing arrived for wait_ms. HCOLL_ERR_TIMEOUT (recorded, naming the
 * awaited rank) after op_timeout_ms in one round; the transport's error
 * (sticky) when a partner failed. With no barrier running (before the
 * first start, or after one is done): takes the signals that landed,
 * without waiting, and keeps them for the barrier to come (sends nothing;
 * *done_out = 1); HCOLL_ERR_MISMATCH when they name a barrier this rank
 * already ran, or two different barriers. */
hcoll_status_t hc_dissem_progress(hc_dissem_t *d, int wait_ms, int *done_out);

/* While this rank runs operation seq that is not a barrier: take the
 * signals that landed, without waiting. HCOLL_ERR_MISMATCH (recorded,
 * naming the rank) when one says its sender entered a barrier as
 * operation seq. NULL d: success. */
hcoll_status_t hc_dissem_absorb(hc_dissem_t *d, uint32_t seq, const char *what);

/* The communicator failed: reset the connections so the partners, who may
 * wait for this rank, fail at once. Later calls return st. NULL: no-op. */
void hc_dissem_fail(hc_dissem_t *d, hcoll_status_t st);

/* Close; an idle, healthy barrier says goodbye, anything else resets.
 * Local. NULL: no-op. */
void hc_dissem_destroy(hc_dissem_t *d);

#endif
