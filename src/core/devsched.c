/*
 * The device executor's schedule (devsched.h): pure arithmetic, no CUDA.
 */
#include "core/devsched.h"


void hc_devstage_init(hc_devstage_t *s, size_t npieces)
{
    s->npieces = npieces;
    s->k = 0;
    s->phase = 0;
}

hc_devstage_step_t hc_devstage_next(hc_devstage_t *s)
{
    hc_devstage_step_t st = { HC_DEVSTAGE_DONE, 0, 0 };
    if (s->k >= s->npieces)
        return st;
    for (;;) {
        switch (s->phase) {
        case 0: /* prologue */
            s->phase = 1;
            st.kind = HC_DEVSTAGE_D2H;
            st.piece = 0;
            break;
        case 1:
            s->phase = 2;
            st.kind = HC_DEVSTAGE_WAIT;
            st.piece = s->k;
            break;
        case 2:
            s->phase = 3;
            if (s->k + 1 >= s->npieces)
                continue;
            st.kind = HC_DEVSTAGE_D2H;
            st.piece = s->k + 1;
            break;
        case 3:
            s->phase = 4;
            st.kind = HC_DEVSTAGE_RING;
            st.piece = s->k;
            break;
        default:
            st.kind = HC_DEVSTAGE_H2D;
            st.piece = s->k;
            s->k++;
            s->phase = 1;
            break;
        }
        st.buf = (int)(st.piece % 2);
        return st;
    }
}

size_t hc_devsched_stage_bytes(size_t piece_bytes)
{
    size_t b = piece_bytes < HC_DEVSCHED_STAGE_MIN_BYTES ? HC_DEVSCHED_STAGE_MIN_BYTES
                                                         : piece_bytes;
    return b & ~(size_t)15;
}

size_t hc_devsched_segment_count(size_t count, size_t es, size_t stage_bytes, int local_size)
{
    size_t min = stage_bytes / es * (size_t)local_size;
    size_t seg = (count + HC_DEVSCHED_SEGMENTS - 1) / HC_DEVSCHED_SEGMENTS;
    if (seg <= min)
        return min;
    /* Whole 16-byte vectors per local rank: NCCL then splits a segment
     * into L equal shards (reduce-scatter, all-gather) instead of running
     * L reduces and L broadcasts, and each shard starts aligned for the
     * kernels' vector loads. min is such a multiple already. */
    const size_t unit = (size_t)local_size * (16 % es == 0 ? 16 / es : 1);
    return (seg + unit - 1) / unit * unit;
}

size_t hc_devsched_pieces(size_t count, size_t es, size_t stage_bytes)
{
    size_t piece = stage_bytes / es;
    return (count + piece - 1) / piece;
}
