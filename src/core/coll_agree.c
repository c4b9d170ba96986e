/*
 * The agreement that every host collective starts with (coll_run.c runs
 * it as one all-reduce MAX of HC_AGREE_WORDS int64 words; this file only
 * packs and judges them, pure arithmetic):
 *
 *   each rank    fingerprint {collective, sequence, count, dtype, op, root}
 *                + its local verdict (arguments usable, buffers registered)
 *   MAX over     per field: (value << 24 | rank) and ((MASK - value) << 24 |
 *   all ranks    rank): the largest and the smallest value, each with a rank
 *                that passed it; count also exactly ({count, -count}); the
 *                verdict as (status << 24 | rank), -1 when fine
 *   every rank   the same words, so the same decision: all fields equal and
 *                no failed verdict, or HCOLL_ERR_MISMATCH naming the first
 *                field that differs and two ranks that disagree on it, or
 *                the failed rank's status naming that rank
 *
 * Nothing has moved when the decision is taken, so a failure leaves every
 * recvbuf as it was and the communicator usable.
 */
#include "core/coll_priv.h"

#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "core/redop.h"

#define RANK_BITS 24
#define RANK_MASK (((int64_t)1 << RANK_BITS) - 1)
#define VAL_MASK  (((int64_t)1 << (63 - RANK_BITS)) - 1)

enum { FP_KIND, FP_SEQ, FP_COUNT, FP_DTYPE, FP_OP, FP_ROOT, FP_N };
/* Words: FP_N (max, min) pairs, the exact count pair, the verdict. */
enum { W_COUNT_MAX = 2 * FP_N, W_COUNT_NEG, W_VERDICT, W_N };
_Static_assert(W_N == HC_AGREE_WORDS, "HC_AGREE_WORDS");

static const char *const field_names[FP_N] = {
    "collective", "operation number", "count", "dtype", "op", "root",
};

const char *hc_coll_kind_name(int64_t k)
{
    switch (k) {
    case HC_COLL_ALLREDUCE: return "allreduce";
    case HC_COLL_BROADCAST: return "broadcast";
    case HC_COLL_BARRIER: return "barrier";
    case HC_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case HC_COLL_ALLGATHER: return "allgather";
    }
    return "?";
}

/* The fields ranks must agree on; -1 where a collective has none. A
 * broadcast compares bytes (the dtype only sizes them); a PREMUL_SUM op
 * counts as one op whatever its scalar. */
static void fingerprint(const hc_coll_args_t *a, uint64_t seq, int64_t fp[FP_N])
{
    const int reduces = a->kind == HC_COLL_ALLREDUCE || a->kind == HC_COLL_REDUCE_SCATTER;
    fp[FP_KIND] = a->kind;
    fp[FP_SEQ] = (int64_t)(seq & (uint64_t)(VAL_MASK >> 1));
    fp[FP_COUNT] = a->kind == HC_COLL_BARRIER     ? 0
                   : a->kind == HC_COLL_BROADCAST ? (int64_t)(a->count * hcoll_dtype_size(a->dtype))
                                                  : (int64_t)a->count;
    fp[FP_DTYPE] = a->kind == HC_COLL_BARRIER || a->kind == HC_COLL_BROADCAST ? -1 : (int64_t)a->dtype;
    fp[FP_OP] = !reduces ? -1
                : (int)a->user_op < HC_REDOP_BASE ? (int64_t)a->user_op
                                                  : HC_REDOP_BASE;
    fp[FP_ROOT] = a->kind == HC_COLL_BROADCAST ? a->root : -1;
}

static int64_t enc(int64_t v)
{
    v += 1; /* -1 (none) is 0 */
    return v < 0 ? 0 : v > VAL_MASK ? VAL_MASK : v;
}

void hc_agree_pack(const hc_coll_args_t *a, uint64_t seq, int rank, hcoll_status_t verdict,
                   int64_t w[HC_AGREE_WORDS])
{
    int64_t fp[FP_N];
    fingerprint(a, seq, fp);
    const int64_t r = rank & RANK_MASK;
    for (int f = 0; f < FP_N; f++) {
        w[2 * f] = enc(fp[f]) << RANK_BITS | r;
        w[2 * f + 1] = (VAL_MASK - enc(fp[f])) << RANK_BITS | r;
    }
    w[W_COUNT_MAX] = fp[FP_COUNT];
    w[W_COUNT_NEG] = -fp[FP_COUNT];
    w[W_VERDICT] = verdict == HCOLL_SUCCESS ? -1 : (int64_t)verdict << RANK_BITS | r;
}

/* A field's value as a message shows it. */
static void field_str(int f, int64_t v, char *buf, size_t len)
{
    if (f == FP_KIND)
        snprintf(buf, len, "%s", hc_coll_kind_name(v));
    else if (f == FP_DTYPE && v >= 0)
        snprintf(buf, len, "%s", hcoll_dtype_name((hcoll_dtype_t)v));
    else if (f == FP_OP && v >= HC_REDOP_BASE)
        snprintf(buf, len, "a PREMUL_SUM op");
    else if (f == FP_OP && v >= 0)
        snprintf(buf, len, "%s", hcoll_op_name((hcoll_op_t)v));
    else if (v < 0)
        snprintf(buf, len, "none");
    else
        snprintf(buf, len, "%lld", (long long)v);
}

hcoll_status_t hc_agree_judge(const int64_t w[HC_AGREE_WORDS], const hc_coll_args_t *a,
                              uint64_t seq, int rank, hcoll_status_t verdict, hc_errbuf_t *err)
{
    int64_t fp[FP_N];
    fingerprint(a, seq, fp);
    const char *what = hc_coll_kind_name(a->kind);
    if (w[W_VERDICT] >= 0) {
        /* A rank could not take part; it recorded why itself. */
        if (verdict != HCOLL_SUCCESS)
            return verdict;
        const int who = (int)(w[W_VERDICT] & RANK_MASK);
        const hcoll_status_t st = (hcoll_status_t)(w[W_VERDICT] >> RANK_BITS);
        /* HCOLL_ERR_RDMA: a verdict's registration failed (coll_pin.c). */
        return hc_err_set(err, HC_COLL, rank, st,
                          "%s: rank %d could not take part (%s%s; its error says why); "
                          "nothing moved on any rank and the communicator stays usable",
                          what, who, hcoll_status_name(st),
                          st == HCOLL_ERR_RDMA ? ": registering its buffers failed" : "");
    }
    for (int f = 0; f < FP_N; f++) {
        const int64_t hi = w[2 * f] >> RANK_BITS, lo = VAL_MASK - (w[2 * f + 1] >> RANK_BITS);
        const int exact_differs = f == FP_COUNT && w[W_COUNT_MAX] != -w[W_COUNT_NEG];
        if (hi == lo && !exact_differs)
            continue;
        char vmax[48], vmin[48], mine[48];
        field_str(f, f == FP_COUNT ? w[W_COUNT_MAX] : hi - 1, vmax, sizeof vmax);
        field_str(f, f == FP_COUNT ? -w[W_COUNT_NEG] : lo - 1, vmin, sizeof vmin);
        field_str(f, fp[f], mine, sizeof mine);
        return hc_err_set(err, HC_COLL, rank, HCOLL_ERR_MISMATCH,
                          "%s: ranks disagree on the %s: rank %d passed %s, rank %d passed %s "
                          "(this rank: %s); nothing moved on any rank and the communicator "
                          "stays usable",
                          what, field_names[f], (int)(w[2 * f] & RANK_MASK), vmax,
                          (int)(w[2 * f + 1] & RANK_MASK), vmin, mine);
    }
    return HCOLL_SUCCESS;
}
