/*
 * The all-reduce's crossovers from a cost model (algo.h): what recursive
 * doubling and the ring cost on this machine's links, from a latency alpha
 * (us per message) and a bandwidth beta (bytes per us per rank, all ranks
 * sending at once), measured at init by timing rd itself (the probe) or
 * given by HCOLL_ALGO_MODEL.
 *
 *   N nodes (ranks of the rd / ring group), L rails (local ranks; 1 for
 *   the flat plans), S bytes, steps = log2 P (+2 for a fold, P the largest
 *   power of two <= N), node = one node step (shared memory; probed, else
 *   0), agree = steps * alpha + node with the agreement, else 0:
 *
 *   rd     steps * (alpha + S / beta)          whole vector per message,
 *          + agree where S > the inline limit  on every rail at once
 *   split  steps * (alpha + S / (L beta))      inline vectors from the split
 *          + 2 (alpha + node)                  limit: a shard per rail, then
 *                                              a node all-gather
 *   ring   agree + 2(N-1) * (alpha + S / (N beta))          fused (S <= small)
 *          agree + 2(N-1) * (alpha + S / (N L beta)) + node three stages
 *
 * Node steps count beyond the one inline rd takes (the agreement's, with
 * the data): the agreement's own, then the three stages' second (a
 * reduce-scatter and an all-gather where the fused path has one step).
 * rd_max is the largest size up to which rd (split where it would be)
 * costs no more than the ring (capped at one rd slot), inline_max the
 * smaller of it and the agreement's slot. A broadcast travels with the
 * agreement as one rd of its bytes (coll_run.c) up to its own limit under
 * it, where that costs no more than the tree after the agreement, depth *
 * (alpha + S / beta) with depth = ceil(log2 N) (the node step it saves is
 * not counted: the limit leans to the tree). The probe's figures are
 * gathered from every rank and their medians taken, so every rank
 * computes the same choice from the same numbers.
 */
#include "core/algo.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

#include "base/log.h"
#include "base/clock.h"
#include "boot/boot.h"
#include "core/coll_priv.h"
#include "core/comm.h"
#include "core/ringdrv.h"
#include "inter/rd.h"

#define PROBE_SMALL 64u          /* bytes: alpha */
#define PROBE_BIG   (256u << 10) /* bytes: beta, at the largest size rd may get (one slot) */
#define PROBE_REPS  9            /* small ones timed, after one warm-up; the median */
#define PROBE_BIG_REPS 3         /* big ones (each after a small one) */
#define BETA_MAX    1e6          /* bytes/us: "no bandwidth cost" */

int hc_algo_model_parse(const char *s, hc_algo_model_t *m)
{
    memset(m, 0, sizeof *m);
    if (!s || !*s || strcasecmp(s, "probe") == 0) {
        m->mode = HC_MODEL_PROBE;
        return 0;
    }
    if (strcasecmp(s, "table") == 0) {
        m->mode = HC_MODEL_TABLE;
        return 0;
    }
    char *end;
    double a = strtod(s, &end);
    if (end == s || *end != ':' || !(a >= 0 && a < 1e7))
        return -1;
    const char *b = end + 1;
    double bw = strtod(b, &end);
    if (end == b || *end || !(bw > 0 && bw <= BETA_MAX))
        return -1;
    m->mode = HC_MODEL_GIVEN;
    m->alpha_us = a;
    m->beta = bw;
    return 0;
}

int hc_algo_model_steps(int n)
{
    int p = 1, k = 0;
    while (p * 2 <= n) {
        p *= 2;
        k++;
    }
    return k + (n > p ? 2 : 0);
}

/* The agreement on its own (no data with it): one rd of words, then its
 * node step; nothing with HCOLL_CHECK_ARGS=0. */
static double cost_agree(const hc_algo_model_t *m, const hc_algo_layout_t *l)
{
    return l->check_args ? hc_algo_model_steps(l->nnodes) * m->alpha_us + m->node_us : 0;
}

double hc_algo_cost_rd(const hc_algo_model_t *m, const hc_algo_layout_t *l, size_t bytes)
{
    const int steps = hc_algo_model_steps(l->nnodes);
    const double whole = steps * (m->alpha_us + (double)bytes / m->beta);
    if (bytes > l->inline_cap) /* the agreement first, then the data */
        return whole + cost_agree(m, l);
    if (l->check_args && l->split_from && bytes >= l->split_from && l->rails > 1)
        return steps * (m->alpha_us + (double)bytes / (l->rails * m->beta)) +
               2 * (m->alpha_us + m->node_us);
    return whole;
}

double hc_algo_cost_ring(const hc_algo_model_t *m, const hc_algo_layout_t *l, size_t bytes)
{
    const int n = l->nnodes;
    const int fused = bytes <= l->small_bytes || l->rails < 1;
    const int rails = fused ? 1 : l->rails;
    double t = 2.0 * (n - 1) * (m->alpha_us + (double)bytes / ((double)n * rails * m->beta));
    if (!fused)
        t += m->node_us; /* the intra step is a reduce-scatter and an all-gather */
    return t + cost_agree(m, l);
}

static int rd_wins(const hc_algo_model_t *m, const hc_algo_layout_t *l, uint64_t s)
{
    return hc_algo_cost_rd(m, l, (size_t)s) <= hc_algo_cost_ring(m, l, (size_t)s);
}

void hc_algo_model_choose(const hc_algo_model_t *m, const hc_algo_layout_t *l, uint64_t rd_cap,
                          uint64_t *rd_max, size_t *inline_max)
{
    /* Both costs are linear between these sizes, so rd's lead changes
     * sign at most once in each piece: find it by bisection (64-byte
     * steps), piece by piece from the smallest. The split's limit is a
     * multiple of 64 and the split's piece starts there: its last
     * whole-vector size is the cut before it. */
    enum { NCUT = 4 };
    uint64_t cut[NCUT] = { l->inline_cap, l->small_bytes, rd_cap,
                           l->split_from ? l->split_from - 64 : rd_cap };
    uint64_t ok = 0, lo = 0;
    for (int i = 0; i < NCUT; i++) /* sort them */
        for (int j = i + 1; j < NCUT; j++)
            if (cut[j] < cut[i]) {
                uint64_t t = cut[i];
                cut[i] = cut[j];
                cut[j] = t;
            }
    for (int i = 0; i < NCUT && lo < rd_cap; i++) {
        uint64_t hi = (cut[i] > rd_cap ? rd_cap : cut[i]) / 64;
        if (hi <= lo)
            continue;
        if (!rd_wins(m, l, (lo + 1) * 64))
            break;
        if (rd_wins(m, l, hi * 64)) {
            ok = lo = hi;
            continue;
        }
        uint64_t a = lo + 1, b = hi; /* rd wins at a, loses at b */
        while (b - a > 1) {
            uint64_t mid = a + (b - a) / 2;
            if (rd_wins(m, l, mid * 64))
                a = mid;
            else
                b = mid;
        }
        ok = a;
        break;
    }
    *rd_max = ok * 64;
    *inline_max = (size_t)(*rd_max < l->inline_cap ? *rd_max : l->inline_cap);
}

/* The largest size (a multiple of 64, at most cap) with slope * S <= room:
 * where one linear cost stops beating another. */
static size_t limit_where(double slope, double room, size_t cap)
{
    if (slope <= 0 || room / slope >= (double)cap)
        return cap;
    return room > 0 ? (size_t)(room / slope) & ~(size_t)63 : 0;
}

size_t hc_algo_model_inline_bcast(const hc_algo_model_t *m, const hc_algo_layout_t *l,
                                  size_t cap)
{
    const int n = l->nnodes, steps = hc_algo_model_steps(n);
    int depth = 0; /* the tree's: ceil(log2 n) */
    while ((1 << depth) < n)
        depth++;
    /* The tree after the agreement: as deep as rd's rounds, with no fold. */
    return limit_where((steps - depth) / m->beta, depth * m->alpha_us, cap);
}

size_t hc_algo_model_inline_split(const hc_algo_model_t *m, const hc_algo_layout_t *l)
{
    const double cost = 2 * (m->alpha_us + m->node_us);
    if (l->rails < 2 || cost <= 0 || m->beta <= 0)
        return SIZE_MAX;
    const double L = l->rails, steps = hc_algo_model_steps(l->nnodes);
    const double s = cost * m->beta * L / (steps * (L - 1));
    if (s >= (double)(SIZE_MAX / 2))
        return SIZE_MAX;
    return s < 64 ? 64 : ((size_t)s + 63) & ~(size_t)63;
}

/* ------------------------------------------------------------------------ */
/* The probe: rd itself, timed at init                                        */
/* ------------------------------------------------------------------------ */

static hcoll_status_t probe_once(hc_coll_t *co, void *buf, size_t count, double *us)
{
    struct hcoll_comm *c = co->comm;
    const double t = hc_now_us();
    hcoll_status_t st = hc_rd_start(co->rd, buf, count, HCOLL_INT64, HCOLL_MAX);
    for (int done = 0; st == HCOLL_SUCCESS && !done;) {
        if (atomic_load(&c->aborted))
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_ABORTED,
                              "communicator aborted during init (the link probe)");
        /* At init, on the caller's thread: it waits as a blocking call. */
        st = hc_rd_progress(co->rd, HC_RINGDRV_POLL_MS, (int)c->params.spin_us, &done);
    }
    *us = hc_now_us() - t;
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of n doubles, sorted in place. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One node step as the split adds it: a shared-memory all-gather of a
 * small vector, timed PROBE_REPS times after a warm-up; the median. */
static hcoll_status_t probe_node(hc_coll_t *co, int64_t *buf, double *us)
{
    const hc_intra_ops_t *ops = co->intra->ops;
    const size_t n = (size_t)co->comm->local_size * 8;
    double t[PROBE_REPS];
    hcoll_status_t st = HCOLL_SUCCESS;
    for (int r = -1; st == HCOLL_SUCCESS && r < PROBE_REPS; r++) {
        const double t0 = hc_now_us();
        st = ops->all_gather(co->intra, buf, n, HCOLL_INT64, NULL);
        if (r >= 0)
            t[r] = hc_now_us() - t0;
    }
    if (st == HCOLL_SUCCESS)
        *us = median(t, PROBE_REPS);
    return st;
}

/* This rank's alpha and beta from timed rd all-reduces over its rail, and
 * (three stages) its node step. */
static hcoll_status_t probe_local(hc_coll_t *co, int nnodes, double out[3])
{
    /* mmap, not malloc: freeing a 256 KiB malloc'd block raises glibc's
     * mmap threshold, and the heap then kept ~1.4 MB more over
     * test_lifecycle's init/destroy cycles. */
    int64_t *buf = mmap(NULL, PROBE_BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (buf == MAP_FAILED)
        return hc_err_set(&co->comm->err, HC_COLL, co->comm->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the link probe");
    double small[PROBE_REPS], big[PROBE_BIG_REPS], t;
    hcoll_status_t st = HCOLL_SUCCESS;
    for (int r = -1; st == HCOLL_SUCCESS && r < PROBE_REPS; r++) {
        if ((st = probe_once(co, buf, PROBE_SMALL / 8, &t)) == HCOLL_SUCCESS && r >= 0)
            small[r] = t;
        if (st == HCOLL_SUCCESS && r < PROBE_BIG_REPS &&
            (st = probe_once(co, buf, PROBE_BIG / 8, &t)) == HCOLL_SUCCESS && r >= 0)
            big[r] = t;
    }
    out[2] = 0;
    if (st == HCOLL_SUCCESS && co->plan == HC_PLAN_3STAGE && co->comm->local_size > 1)
        st = probe_node(co, buf, &out[2]);
    munmap(buf, PROBE_BIG);
    if (st != HCOLL_SUCCESS)
        return st;
    const int steps = hc_algo_model_steps(nnodes);
    /* Medians: the latency calls typically pay (the fastest of nine is a
     * lucky one on a loaded host, and made the ring look cheap at 4 KiB). */
    const double ts = median(small, PROBE_REPS), tb = median(big, PROBE_BIG_REPS);
    out[0] = ts / steps;
    /* The bytes' share of the big one's time, at least half of it: a
     * small one slowed by the load must not make the link look free. */
    const double tbytes = tb - ts > tb / 2 ? tb - ts : tb / 2;
    out[1] = tbytes > 0 ? (PROBE_BIG - PROBE_SMALL) * steps / tbytes : BETA_MAX;
    if (out[1] > BETA_MAX)
        out[1] = BETA_MAX;
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_coll_algo_tune(hc_coll_t *co)
{
    struct hcoll_comm *c = co->comm;
    hc_algo_model_t *m = &co->model;
    if (co->algo.forced || m->mode == HC_MODEL_TABLE || !co->rd ||
        (co->plan != HC_PLAN_3STAGE && co->plan != HC_PLAN_RING && co->plan != HC_PLAN_FLAT))
        return HCOLL_SUCCESS;
    const int three = co->plan == HC_PLAN_3STAGE;
    hc_algo_layout_t l = {
        .nnodes = three ? c->nnodes : c->nranks,
        .rails = three ? c->local_size : 1,
        .small_bytes = three ? co->small_bytes : 0,
        .check_args = co->check_args,
        .inline_cap = co->inline_max,
    };
    if (m->mode == HC_MODEL_PROBE) {
        double mine[3], *all = calloc((size_t)c->nranks * 3, sizeof *all);
        if (!all)
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                              "no memory for the link probe");
        hcoll_status_t st = probe_local(co, l.nnodes, mine);
        if (st == HCOLL_SUCCESS)
            st = hc_boot_allgather(c->boot, mine, all, sizeof mine);
        if (st == HCOLL_SUCCESS) {
            double *a = malloc((size_t)c->nranks * sizeof *a);
            if (!a)
                st = hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                                "no memory for the link probe");
            double *fig[3] = { &m->alpha_us, &m->beta, &m->node_us };
            for (int k = 0; a && k < 3; k++) {
                for (int r = 0; r < c->nranks; r++)
                    a[r] = all[3 * r + k];
                *fig[k] = median(a, c->nranks);
            }
            free(a);
        }
        free(all);
        if (st != HCOLL_SUCCESS)
            return st;
    }
    if (three) {
        co->inline_split = hc_algo_model_inline_split(m, &l);
        l.split_from = co->inline_split; /* SIZE_MAX: never */
    }
    hc_algo_model_choose(m, &l, hc_algo_rd_seg_max(), &co->algo.rd_max, &co->inline_max);
    co->inline_bcast = hc_algo_model_inline_bcast(m, &l, co->inline_max);
    m->chosen = 1;
    if (c->rank == 0)
        HC_INFO(HC_INIT, c->rank,
                "all-reduce model (%s): alpha %.1f us, beta %.1f MB/s per rank; rd up to %llu "
                "bytes (inline up to %zu, broadcasts %zu, split from %zu; node step %.1f us), "
                "the ring above",
                m->mode == HC_MODEL_PROBE ? "probed" : "HCOLL_ALGO_MODEL", m->alpha_us, m->beta,
                (unsigned long long)co->algo.rd_max, co->inline_max, co->inline_bcast,
                co->inline_split, m->node_us);
    return HCOLL_SUCCESS;
}

int hc_coll_algo_model_str(const hc_coll_t *co, char *buf, size_t len)
{
    const hc_algo_model_t *m = &co->model;
    if (!m->chosen)
        return snprintf(buf, len, "%s: rd up to %llu bytes, inline up to %zu",
                        co->algo.forced ? "HCOLL_ALGO" : "table",
                        (unsigned long long)co->algo.rd_max, co->inline_max);
    return snprintf(buf, len,
                    "%s: alpha %.1f us, beta %.1f MB/s per rank; rd up to %llu bytes, inline up "
                    "to %zu (broadcasts %zu, split from %zu)",
                    m->mode == HC_MODEL_PROBE ? "probe" : "given", m->alpha_us, m->beta,
                    (unsigned long long)co->algo.rd_max, co->inline_max, co->inline_bcast,
                    co->inline_split);
}
