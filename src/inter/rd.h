/*
 * Recursive-doubling all-reduce among N ranks over any transport
 * (transport.h), on a transport instance of its own: the latency path
 * across nodes for small vectors (core/algo.c chooses it).
 *
 *   P = the largest power of two <= N; positions p >= P are "extra"
 *
 *   fold    extra p sends its vector to p - P, which reduces it in
 *   rounds  k = 0 .. log2(P)-1, among positions < P: exchange the whole
 *           vector with p ^ 2^k, both reduce (lower position's vector
 *           first, so both hold the same bits)
 *   unfold  p - P sends the result back to extra p
 *
 *   N = 6 (P = 4):  fold   4→0 5→1
 *                   k=0    0↔1 2↔3
 *                   k=1    0↔2 1↔3
 *                   unfold 0→4 1→5
 *
 * Every rank ends with the same bits: after round k the 2^(k+1) positions
 * of a block hold one value, reduced in one fixed tree (lower block's
 * value op upper block's), whatever position computed it. The tree is not
 * the ring's chain, so rd and the ring may differ in the last bits of a
 * floating sum (never between ranks of one call).
 *
 * Each message is one put of the vector into a staging slot of the
 * receiver (slot = round, plus one for the fold), whose immediate names
 * the operation and the slot. A partner can be at most one operation
 * ahead (it cannot finish operation s+1 without this rank's data of s+1),
 * so slots are kept twice, by the operation's parity, and an early arrival
 * is remembered for the next operation. Vectors longer than a slot go in
 * segments of seg_bytes, each one operation. Sources are staged in a
 * registered send area (no per-call registration of user memory), and an
 * operation ends only when its puts are locally complete.
 *
 * Threading: one thread at a time (the executor's); hc_rd_fail from it.
 */
#ifndef HC_INTER_RD_H
#define HC_INTER_RD_H

#include <stddef.h>
#include <stdint.h>

#include "inter/transport.h"

typedef struct hc_rd hc_rd_t;

typedef struct hc_rd_params {
    const hc_transport_ops_t *ops;  /* from hc_transport_select, as the ring's */
    /* tp.rank/tp.nranks: position and size; nsocks_perpeer is forced to 1
     * (small messages, and one socket keeps them in order). */
    hc_transport_params_t tp;
    hc_allgather_fn allgather;      /* address and key exchange among the N */
    void *ag_ctx;
    /* How long a step waits for a partner that is alive but has not
     * arrived: > 0 ms, < 0 no limit, 0 tp.timeout_ms. */
    int op_timeout_ms;
    size_t seg_bytes;               /* one slot; >= 64, a multiple of 8 */
} hc_rd_params_t;

/* Connect to every partner and register the slots. Collective over the N
 * ranks; blocks up to tp.timeout_ms. N = 1 connects nothing. */
hcoll_status_t hc_rd_create(const hc_rd_params_t *p, hc_rd_t **out);

/* Start an all-reduce of buf (count elements, in place). op is reduced as
 * hc_reduce does (AVG sums; the caller finishes it). Non-blocking. */
hcoll_status_t hc_rd_start(hc_rd_t *d, void *buf, size_t count, hcoll_dtype_t dtype,
                           hcoll_op_t op);

/* Start an all-reduce that carries the argument agreement: nw int64 words
 * (in/out), MAX-combined over every rank, travel in each message ahead of
 * buf (count elements, in place; count 0: the words alone). The data of
 * two values is combined only where their lengths are equal; *data_ok in:
 * whether this rank's data is whole (0: it sends none); at the end,
 * once hc_rd_progress says done, *data_ok is 1 where every rank's length
 * was this one's (buf holds the reduction), else 0 (buf holds partial
 * sums: the words tell why). The words and data must fit one slot
 * (seg_bytes, less 64 bytes or more of header). Drive with hc_rd_progress. */
hcoll_status_t hc_rd_start_agree(hc_rd_t *d, int64_t *words, int nw, void *buf, size_t count,
                                 hcoll_dtype_t dtype, hcoll_op_t op, int *data_ok);

/* Drive it: returns when done (*done_out = 1) or after waiting about
 * wait_ms with nothing arriving, having first polled for spin_us without
 * sleeping (a sched_yield between looks; 0: sleep at once). HCOLL_ERR_TIMEOUT
 * (recorded, naming the awaited rank) after op_timeout_ms in one step; the
 * transport's error (sticky) when a partner failed. */
hcoll_status_t hc_rd_progress(hc_rd_t *d, int wait_ms, int spin_us, int *done_out);

/* The communicator failed: reset the connections so that partners fail at
 * once. Later calls return st. NULL: no-op. */
void hc_rd_fail(hc_rd_t *d, hcoll_status_t st);

/* Close; an idle, healthy instance says goodbye, anything else resets.
 * Local. NULL: no-op. */
void hc_rd_destroy(hc_rd_t *d);

#endif
