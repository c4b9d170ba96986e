/*
 * The device executor's schedule, on the CPU (core/devsched.h): the staging
 * schedule (every piece copied in, reduced,
 * copied out, in the documented order, and a staging buffer never refilled
 * before it was copied out), and the segment and piece sizes at their
 * boundaries.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/devsched.h"

/* Run the schedule against a model of one in-order internal stream and
 * two staging buffers, checking the invariants the host stage relies on. */
static void check_schedule(size_t npieces)
{
    hc_devstage_t it;
    hc_devstage_init(&it, npieces);
    enum { NONE, FILLING, FULL, REDUCED, EMPTIED } buf_state[2] = { EMPTIED, EMPTIED };
    long buf_piece[2] = { -1, -1 };
    size_t d2h = 0, waits = 0, rings = 0, h2d = 0;
    int in_flight_d2h = 0; /* at most one copy ahead of the ring */
    for (int guard = 0; guard < 10 + 5 * (int)npieces; guard++) {
        hc_devstage_step_t s = hc_devstage_next(&it);
        if (s.kind == HC_DEVSTAGE_DONE)
            break;
        ck_assert_int_eq(s.buf, (int)(s.piece % 2));
        ck_assert_uint_lt(s.piece, npieces);
        int b = s.buf;
        switch (s.kind) {
        case HC_DEVSTAGE_D2H:
            /* In stream order the buffer's previous piece was copied out
             * (H2D enqueued) before this copy in. */
            ck_assert_msg(buf_state[b] == EMPTIED, "piece %zu refills buffer %d too early",
                          s.piece, b);
            ck_assert_uint_eq(s.piece, d2h);
            buf_state[b] = FILLING;
            buf_piece[b] = (long)s.piece;
            d2h++;
            in_flight_d2h++;
            ck_assert_int_le(in_flight_d2h, 2);
            break;
        case HC_DEVSTAGE_WAIT:
            ck_assert(buf_state[b] == FILLING && buf_piece[b] == (long)s.piece);
            ck_assert_uint_eq(s.piece, waits);
            buf_state[b] = FULL;
            waits++;
            in_flight_d2h--;
            break;
        case HC_DEVSTAGE_RING:
            ck_assert(buf_state[b] == FULL && buf_piece[b] == (long)s.piece);
            ck_assert_uint_eq(s.piece, rings);
            /* The next piece's copy is already on its way (overlap). */
            if (s.piece + 1 < npieces)
                ck_assert_uint_eq(d2h, s.piece + 2);
            buf_state[b] = REDUCED;
            rings++;
            break;
        case HC_DEVSTAGE_H2D:
            ck_assert(buf_state[b] == REDUCED && buf_piece[b] == (long)s.piece);
            ck_assert_uint_eq(s.piece, h2d);
            buf_state[b] = EMPTIED;
            h2d++;
            break;
        default:
            ck_abort_msg("unknown step");
        }
    }
    ck_assert_uint_eq(d2h, npieces);
    ck_assert_uint_eq(waits, npieces);
    ck_assert_uint_eq(rings, npieces);
    ck_assert_uint_eq(h2d, npieces);
    ck_assert_int_eq(hc_devstage_next(&it).kind, HC_DEVSTAGE_DONE);
    ck_assert_int_eq(hc_devstage_next(&it).kind, HC_DEVSTAGE_DONE);
}

START_TEST(staging_schedule)
{
    static const size_t n[] = { 0, 1, 2, 3, 4, 17, 64 };
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++)
        check_schedule(n[i]);
}
END_TEST

/* The documented order: D2H(0); for k: WAIT(k); D2H(k+1) unless last;
 * RING(k); H2D(k). */
START_TEST(staging_order_exact)
{
    static const struct {
        enum hc_devstage_kind kind;
        size_t piece;
    } want[] = {
        { HC_DEVSTAGE_D2H, 0 },  { HC_DEVSTAGE_WAIT, 0 }, { HC_DEVSTAGE_D2H, 1 },
        { HC_DEVSTAGE_RING, 0 }, { HC_DEVSTAGE_H2D, 0 },  { HC_DEVSTAGE_WAIT, 1 },
        { HC_DEVSTAGE_D2H, 2 },  { HC_DEVSTAGE_RING, 1 }, { HC_DEVSTAGE_H2D, 1 },
        { HC_DEVSTAGE_WAIT, 2 }, { HC_DEVSTAGE_RING, 2 }, { HC_DEVSTAGE_H2D, 2 },
        { HC_DEVSTAGE_DONE, 0 },
    };
    hc_devstage_t it;
    hc_devstage_init(&it, 3);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        hc_devstage_step_t s = hc_devstage_next(&it);
        ck_assert_msg(s.kind == want[i].kind, "step %zu: kind %d, want %d", i, s.kind,
                      want[i].kind);
        if (s.kind != HC_DEVSTAGE_DONE) {
            ck_assert_uint_eq(s.piece, want[i].piece);
            ck_assert_int_eq(s.buf, (int)(want[i].piece % 2));
        }
    }
    /* One piece: no look-ahead copy. */
    hc_devstage_init(&it, 1);
    ck_assert_int_eq(hc_devstage_next(&it).kind, HC_DEVSTAGE_D2H);
    ck_assert_int_eq(hc_devstage_next(&it).kind, HC_DEVSTAGE_WAIT);
    ck_assert_int_eq(hc_devstage_next(&it).kind, HC_DEVSTAGE_RING);
    ck_assert_int_eq(hc_devstage_next(&it).kind, HC_DEVSTAGE_H2D);
    ck_assert_int_eq(hc_devstage_next(&it).kind, HC_DEVSTAGE_DONE);
    /* None: done at once. */
    hc_devstage_init(&it, 0);
    ck_assert_int_eq(hc_devstage_next(&it).kind, HC_DEVSTAGE_DONE);
}
END_TEST

START_TEST(stage_bytes_bounds)
{
    const size_t min = HC_DEVSCHED_STAGE_MIN_BYTES;
    ck_assert_uint_eq(hc_devsched_stage_bytes(0), min);
    ck_assert_uint_eq(hc_devsched_stage_bytes(min - 1), min);
    ck_assert_uint_eq(hc_devsched_stage_bytes(min), min);
    ck_assert_uint_eq(hc_devsched_stage_bytes(min + 15), min);
    ck_assert_uint_eq(hc_devsched_stage_bytes(min + 16), min + 16);
    ck_assert_uint_eq(hc_devsched_stage_bytes(3 * min + 17), 3 * min + 16);
}
END_TEST

START_TEST(segment_count_bounds)
{
    const size_t stage = HC_DEVSCHED_STAGE_MIN_BYTES;
    static const size_t es[] = { 1, 2, 4, 8 };
    static const int L[] = { 1, 2, 3, 8 };
    for (size_t i = 0; i < sizeof es / sizeof es[0]; i++)
        for (size_t j = 0; j < sizeof L / sizeof L[0]; j++) {
            const size_t min = stage / es[i] * (size_t)L[j];
            const size_t unit = (size_t)L[j] * (16 / es[i]); /* L x 16 bytes */
            /* Small calls: one segment of the minimum. */
            ck_assert_uint_eq(hc_devsched_segment_count(0, es[i], stage, L[j]), min);
            ck_assert_uint_eq(hc_devsched_segment_count(1, es[i], stage, L[j]), min);
            ck_assert_uint_eq(hc_devsched_segment_count(min, es[i], stage, L[j]), min);
            /* Exactly HC_DEVSCHED_SEGMENTS minimum segments, then one more
             * element: the segment grows, the count of segments does not. */
            const size_t full = HC_DEVSCHED_SEGMENTS * min;
            ck_assert_uint_eq(hc_devsched_segment_count(full, es[i], stage, L[j]), min);
            ck_assert_uint_eq(hc_devsched_segment_count(full + 1, es[i], stage, L[j]),
                              min + unit);
            ck_assert_uint_eq(hc_devsched_segment_count(full - 1, es[i], stage, L[j]), min);
            const size_t counts[] = { min - 1, min + 1, 2 * min + 1, full - 1, full, full + 1,
                                      7 * min + 3, 100 * min + 99 };
            for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
                size_t n = counts[k];
                size_t seg = hc_devsched_segment_count(n, es[i], stage, L[j]);
                size_t nseg = (n + seg - 1) / seg;
                ck_assert_uint_ge(seg, min);
                ck_assert_uint_ge(nseg, 1);
                ck_assert_uint_le(nseg, HC_DEVSCHED_SEGMENTS);
                ck_assert_uint_ge(nseg * seg, n);
                ck_assert_uint_lt((nseg - 1) * seg, n);
                /* L equal shards of whole 16-byte vectors per segment. */
                ck_assert_uint_eq(seg % unit, 0);
            }
        }
}
END_TEST

START_TEST(pieces_bounds)
{
    const size_t stage = HC_DEVSCHED_STAGE_MIN_BYTES;
    const size_t piece = stage / 4;
    ck_assert_uint_eq(hc_devsched_pieces(0, 4, stage), 0);
    ck_assert_uint_eq(hc_devsched_pieces(1, 4, stage), 1);
    ck_assert_uint_eq(hc_devsched_pieces(piece, 4, stage), 1);
    ck_assert_uint_eq(hc_devsched_pieces(piece + 1, 4, stage), 2);
    ck_assert_uint_eq(hc_devsched_pieces(2 * piece, 4, stage), 2);
    ck_assert_uint_eq(hc_devsched_pieces(2 * piece + 1, 4, stage), 3);
    ck_assert_uint_eq(hc_devsched_pieces(stage, 1, stage), 1);
    ck_assert_uint_eq(hc_devsched_pieces(stage + 1, 1, stage), 2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("devsched");
    TCase *tc = tcase_create("schedule");
    tcase_add_test(tc, staging_schedule);
    tcase_add_test(tc, staging_order_exact);
    tcase_add_test(tc, stage_bytes_bounds);
    tcase_add_test(tc, segment_count_bounds);
    tcase_add_test(tc, pieces_bounds);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
