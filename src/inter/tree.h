/*
 * Binomial-tree broadcast among N positions over any transport
 * (transport.h), on a transport instance of its own: the latency path of
 * a small broadcast across nodes (core/coll_bcast.c chooses it).
 *
 *   v = (position - root) mod N; v > 0 receives from v - 2^j (2^j the
 *   lowest set bit of v) and sends to v + 2^k for every k < j (the root:
 *   every 2^k < N) with v + 2^k < N, the farthest first: it heads the
 *   largest subtree
 *
 *   N = 6, root 0:   time 1   0 ──► 4
 *                    time 2   0 ──► 2     4 ──► 5
 *                    time 3   0 ──► 1     2 ──► 3
 *   (ceil(log2 N) message times deep, each message the whole segment)
 *
 * Every message goes from p to p + 2^k mod N for some k < ceil(log2 N),
 * whatever the root, so each rank connects once, at create, to p + 2^k and
 * p - 2^k: the dissemination barrier's partners.
 *
 * A message is one put of a segment (up to seg_bytes) into the receiver's
 * slot (k, parity): k names the distance to the sender (so the slot has
 * one writer), and the parity alternates with each message that sender
 * sends this receiver (both count them). The receiver forwards the
 * segment from that slot (no copy), copies it out, and once its own puts
 * are locally complete returns the slot with a zero-byte put (an ack). A
 * sender puts into a slot only after the ack of the message before last
 * (two segments of a long vector in flight per child), and ends a
 * broadcast only once every message of it was acked: so no rank ever
 * puts to a partner that may have finished, and destroyed its
 * communicator, without its message (TCP refuses a put to a rank that
 * said goodbye). A partner is thus at most one broadcast ahead: its
 * message for the next broadcast may land early, and waits in its slot.
 * Immediates carry the segment's number (16 bits, counted alike by every
 * rank of the instance: they run the same broadcasts), checked on use.
 *
 * The ack costs the sender one more message time, not the receivers: a
 * receiver acks before its own children's acks come back, and
 * hc_tree_landed says when this rank's buffer holds the vector, so the
 * caller may pass it on (the node's step) while the acks travel.
 *
 * Threading: one thread at a time (the executor's); hc_tree_fail from it.
 */
#ifndef HC_INTER_TREE_H
#define HC_INTER_TREE_H

#include <stddef.h>
#include <stdint.h>

#include "inter/transport.h"

typedef struct hc_tree hc_tree_t;

typedef struct hc_tree_params {
    const hc_transport_ops_t *ops;  /* from hc_transport_select, as the ring's */
    /* tp.rank/tp.nranks: position and size; nsocks_perpeer is forced to 1
     * (small messages). */
    hc_transport_params_t tp;
    hc_allgather_fn allgather;      /* address and key exchange among the N */
    void *ag_ctx;
    /* How long a rank waits for its segment, or for a slot to come back,
     * from a partner that is alive but has not got there: > 0 ms, < 0 no
     * limit, 0 tp.timeout_ms. */
    int op_timeout_ms;
    size_t seg_bytes;               /* one slot; >= 64, a multiple of 64 */
} hc_tree_params_t;

/* Connect to the partners and register the slots. Collective over the N
 * ranks; blocks up to tp.timeout_ms. N = 1 connects nothing. */
hcoll_status_t hc_tree_create(const hc_tree_params_t *p, hc_tree_t **out);

/* Start a broadcast of bytes bytes of buf from position root (its buf
 * holds them; everybody else's receives them). Non-blocking. */
hcoll_status_t hc_tree_start(hc_tree_t *t, void *buf, size_t bytes, int root);

/* Drive it: returns when done (*done_out = 1), when the vector has just
 * landed here (hc_tree_landed turned 1), or after waiting about wait_ms
 * with nothing arriving, having first polled for spin_us without sleeping
 * (a sched_yield between looks; 0: sleep at once).
 * HCOLL_ERR_TIMEOUT (recorded, naming the awaited rank) after
 * op_timeout_ms without progress; the transport's error (sticky) when a
 * partner failed; HCOLL_ERR_NETWORK for a message that breaks the
 * protocol. */
hcoll_status_t hc_tree_progress(hc_tree_t *t, int wait_ms, int spin_us, int *done_out);

/* 1 once this rank's buffer holds the whole vector and it has acked
 * every segment (hc_tree_progress may still be waiting for the acks of
 * its own messages); also 1 when no broadcast runs. */
int hc_tree_landed(const hc_tree_t *t);

/* The communicator failed: reset the connections so that partners fail at
 * once. Later calls return st. NULL: no-op. */
void hc_tree_fail(hc_tree_t *t, hcoll_status_t st);

/* Close; an idle, healthy instance says goodbye, anything else resets.
 * Local. NULL: no-op. */
void hc_tree_destroy(hc_tree_t *t);

#endif
