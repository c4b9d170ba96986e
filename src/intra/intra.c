/* Helpers shared by every intra-node backend and its callers. */
#include "intra/intra.h"

void hc_intra_shard(size_t count, int L, int i, size_t *offset_out, size_t *len_out)
{
    /* q*L + r == count; shards below r take q+1. Written without i*count so
     * that no product can overflow. */
    size_t n = L > 0 ? (size_t)L : 1;
    size_t k = i < 0 ? 0 : (size_t)i;
    size_t q = count / n, r = count % n;
    if (k > n)
        k = n;
    *offset_out = k * q + (k < r ? k : r);
    *len_out = k < n ? q + (k < r ? 1 : 0) : 0;
}

void hc_intra_abort(hc_intra_t *ctx)
{
    if (ctx && ctx->ops && ctx->ops->abort)
        ctx->ops->abort(ctx);
}

void hc_intra_destroy(hc_intra_t *ctx)
{
    if (ctx && ctx->ops && ctx->ops->destroy)
        ctx->ops->destroy(ctx);
}

void hc_intra_beat(hc_intra_t *ctx)
{
    if (ctx && ctx->ops && ctx->ops->beat)
        ctx->ops->beat(ctx);
}

hcoll_status_t hc_intra_health(hc_intra_t *ctx, const char *what)
{
    if (ctx && ctx->ops && ctx->ops->health)
        return ctx->ops->health(ctx, what);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_intra_alive(hc_intra_t *ctx, const char *what)
{
    if (ctx && ctx->ops && ctx->ops->alive)
        return ctx->ops->alive(ctx, what);
    return hc_intra_health(ctx, what);
}

void hc_intra_poison(hc_intra_t *ctx)
{
    if (ctx && ctx->ops && ctx->ops->poison)
        ctx->ops->poison(ctx);
}

void hc_intra_note_set(hc_intra_t *ctx, uint32_t note)
{
    if (ctx && ctx->ops && ctx->ops->note_set)
        ctx->ops->note_set(ctx, note);
}

uint32_t hc_intra_note_take(hc_intra_t *ctx)
{
    if (ctx && ctx->ops && ctx->ops->note_take)
        return ctx->ops->note_take(ctx);
    return 0;
}
