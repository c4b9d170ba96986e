/*
 * The device executor's schedule, free of CUDA so that tests check it on
 * any host: the order of the host stage's copies and ring runs through two staging buffers, and how a
 * call is cut into segments and pieces.
 */
#ifndef HC_CORE_DEVSCHED_H
#define HC_CORE_DEVSCHED_H

#include <stddef.h>
#include <stdint.h>

/* ---- Staging schedule ---------------------------------------------------
 * The host stage moves its range through two pinned buffers:
 *   D2H(0); for k: WAIT(k); D2H(k+1) unless last; RING(k); H2D(k)
 * all copies on one internal stream, so D2H(k+1) into buffer (k+1)%2 runs
 * after H2D(k-1) out of it, and RING(k) overlaps both copies. */
enum hc_devstage_kind {
    HC_DEVSTAGE_D2H,  /* enqueue device → staging[buf] for piece, record its event */
    HC_DEVSTAGE_WAIT, /* wait for piece's D2H event */
    HC_DEVSTAGE_RING, /* host ring all-reduce of staging[buf] */
    HC_DEVSTAGE_H2D,  /* enqueue staging[buf] → device for piece */
    HC_DEVSTAGE_DONE,
};
typedef struct hc_devstage_step {
    enum hc_devstage_kind kind;
    size_t piece;
    int buf; /* piece % 2 */
} hc_devstage_step_t;
typedef struct hc_devstage {
    size_t npieces, k;
    int phase;
} hc_devstage_t;

void hc_devstage_init(hc_devstage_t *s, size_t npieces);
hc_devstage_step_t hc_devstage_next(hc_devstage_t *s);

/* ---- Sizes ----------------------------------------------------------------
 * A three-stage call is cut into at most HC_DEVSCHED_SEGMENTS segments, each
 * at least one staging buffer per local rank, so that its stages overlap;
 * a segment's host stage goes through the staging buffers one piece of
 * stage_bytes at a time. Every rank computes the same sizes: they depend on
 * count, the node size and the settings only. */
#define HC_DEVSCHED_SEGMENTS 4
/* The smallest staging buffer (large enough for the ring's pipeline). */
#define HC_DEVSCHED_STAGE_MIN_BYTES (1u << 20)

/* Bytes of each staging buffer for the executor's piece_bytes: at least
 * HC_DEVSCHED_STAGE_MIN_BYTES, whole 16-byte vectors whatever the dtype. */
size_t hc_devsched_stage_bytes(size_t piece_bytes);

/* Elements per segment of a three-stage call of count elements of es
 * bytes (es > 0): a multiple of local_size x 16 bytes, so that every
 * segment but the last divides into L equal, 16-byte aligned shards. */
size_t hc_devsched_segment_count(size_t count, size_t es, size_t stage_bytes, int local_size);

/* Pieces of stage_bytes / es elements that count elements take. */
size_t hc_devsched_pieces(size_t count, size_t es, size_t stage_bytes);

#endif
