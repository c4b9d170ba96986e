/*
 * The ring's schedule arithmetic: how a vector of count elements is cut
 * into N blocks and each block into chunks, which message carries which
 * chunk, and whether an operation runs in gather mode. Pure functions of
 * their arguments (no ring, no transport), so that every rank computes the
 * same schedule and a unit test can check it on its own.
 *
 *   vector:  | block 0 | block 1 | ... | block N-1 |   block b: elements
 *              [off(b), off(b+1)), the first count%N blocks one longer
 *              (aligned: units of 64 bytes instead of elements, the last
 *              nonempty block clipped at count)
 *   block:   | chunk 0 | chunk 1 | ... | chunk C-1 |   ce elements each,
 *              the last one shorter; C from the longest block
 *   message m = s*C + c: step s, chunk c; nmsg = (N-1)*C per phase
 */
#ifndef HC_INTER_RING_SCHED_H
#define HC_INTER_RING_SCHED_H

#include <stddef.h>
#include <stdint.h>

/* Reduce-scatter messages of the next operation a rank keeps until that
 * operation starts; gather mode is chosen only where all of them fit. */
#define HC_RING_EARLY_MAX 64

/* Gather mode saves N-1 hops and sends (N-1)(N-2)/N vectors more per rank
 * (none for N = 2), so it pays while (N-2)/N of a vector takes less than a
 * hop. This is a floor for what a hop costs in bytes (its latency times the
 * link rate): 16 KiB is 130 us at 1 Gbit/s, 1.3 us at 100 Gbit/s. On the
 * emulated 4x2 cluster at 1 Gbit/s, 32 KiB shards (N = 4) were even and 128
 * KiB ones twice as slow in gather mode. */
#define HC_RING_GATHER_HOP_BYTES (16 * 1024)

typedef struct hc_ring_sched {
    int n;              /* ring size */
    size_t count;       /* elements in the vector */
    size_t q;           /* elements per unit: blocks are whole units (the last
                         * one clipped at count); 1 unless aligned */
    size_t base, rem;   /* block geometry, in units */
    size_t ce, C, nmsg; /* chunk elements, chunks per block, messages per phase */
    int gather;         /* gather mode: nmsg = N-1 whole vectors, C = 1 */
} hc_ring_sched_t;

/* The schedule of count elements of esize bytes on a ring of n >= 2 ranks
 * with chunk_bytes per chunk. gather_max: the largest vector (bytes) a
 * gather region holds; dev: device buffers, which never gather. */
void hc_ring_sched_plan(hc_ring_sched_t *g, int n, size_t count, size_t esize,
                        size_t chunk_bytes, size_t gather_max, int dev);

/* Blocks of an all-reduce (where only the ring sees them) start on
 * HC_RING_ALIGN-byte boundaries of the vector: every chunk's offset, in
 * the staging slots and the caller's buffers alike, is then a multiple of
 * 64 bytes (chunks are), so reductions and copies take whole aligned
 * vectors, and the NIC whole cache lines. A phase alone keeps the caller's
 * blocks (recvcount elements each). */
#define HC_RING_ALIGN 64

/* Align the blocks of a plan (not in gather mode) to HC_RING_ALIGN bytes
 * (16 elements where esize does not divide it); chunks, C and nmsg
 * follow. Every rank must do the same for an operation. */
void hc_ring_sched_align(hc_ring_sched_t *g, size_t esize);

/* First element of block b. */
static inline size_t hc_ring_blk_off(const hc_ring_sched_t *g, int b)
{
    size_t u = (size_t)b * g->base + ((size_t)b < g->rem ? (size_t)b : g->rem);
    return u * g->q < g->count ? u * g->q : g->count;
}

/* Elements in block b. */
static inline size_t hc_ring_blk_cnt(const hc_ring_sched_t *g, int b)
{
    return hc_ring_blk_off(g, b + 1) - hc_ring_blk_off(g, b);
}

/* Element offset and count of chunk c of block b (count 0, offset the
 * block's start, for a chunk past a shorter block's end). */
static inline void hc_ring_chunk_of(const hc_ring_sched_t *g, int b, size_t c, size_t *off,
                                    size_t *cnt)
{
    size_t bc = hc_ring_blk_cnt(g, b), start = c * g->ce;
    *off = hc_ring_blk_off(g, b) + start;
    *cnt = start >= bc ? 0 : (bc - start < g->ce ? bc - start : g->ce);
    if (start >= bc)
        *off = hc_ring_blk_off(g, b);
}

/* v mod n in [0, n), for ring positions r - s that go negative. */
static inline int hc_ring_mod(int n, long v)
{
    long nn = n;
    return (int)(((v % nn) + nn) % nn);
}

#endif
