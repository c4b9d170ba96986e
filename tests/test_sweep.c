/*
 * The correctness sweep: every host collective x dtype x op x count x
 * placement, on forked ranks grouped into emulated nodes (HCOLL_HOSTID),
 * bit-exact against a serial reference computed here, and identical on
 * every rank (each rank publishes a hash of its result per case).
 *
 *   layouts     3x1 (ring)  2x2, 2x3, 3x2 (three stages)  2,1 (flat), over
 *               TCP; and 2x2 over the emulated verbs provider (tests/mock,
 *               HCOLL_NET=ib; skipped without rdma-core headers), which
 *               must have carried RDMA writes and released every object
 *   collectives all-reduce, reduce-scatter, all-gather, broadcast (every
 *               root), barrier (between the others: nobody leaves before
 *               all entered)
 *   requests    every fifth case and the next run as two requests with a
 *               barrier request queued between them, waited for only once
 *               all three are queued: nothing may mix
 *   dtypes      all eight of hcoll.h
 *   ops         SUM PROD MAX MIN AVG and a PREMUL_SUM op (scalar per rank)
 *   counts      0, 1, 7, 4093, 2^20+3
 *   placement   out of place and in place (NCCL's definitions)
 *
 * The reference follows hcoll.h's arithmetic: half types combine in float
 * and round at every step; integer SUM/PROD wrap; MAX/MIN propagate NaN;
 * float AVG pre-multiplies each input by 1.0f/n (double 1.0/n for FLOAT64)
 * and rounds the product into the type; integer AVG divides the wrapped
 * sum once, truncating; PREMUL_SUM multiplies as AVG with the rank's
 * scalar. Its fold order is the one hcoll.h calls "one fixed order", as
 * docs/design.md builds it: on nodes of equal size each node folds its
 * local ranks in order 0..L-1, then the nodes' partial sums are folded
 * along a ring; on uneven nodes (the flat plan) the ring runs over all
 * ranks. (The reduce-scatter's ring chain starts one position later than
 * the all-reduce's, hcoll.h's "not the order of the all-reduce"; with the
 * inputs below that is invisible, so one reference serves both.) Float
 * elements come in kinds (u = element index mod PERIOD):
 *   exact     the value depends on the rank and the result is exact in
 *             any order: small integers (SUM), powers of two (PROD), one
 *             rank's arbitrary value and zeros elsewhere ("solo": checks
 *             the rounding of AVG/PREMUL_SUM products bit for bit, and
 *             that each rank's data lands where it belongs)
 *   rounding  the value depends only on the local rank (on every rank in
 *             the flat plan) with full mantissas, so each step rounds and
 *             the result depends on the intra-node order; nodes hold equal
 *             partial sums, so the ring's starting node does not matter
 * MAX/MIN take arbitrary non-zero values per rank, a NaN now and then;
 * integers take arbitrary bits (PROD: small odd values, so products never
 * collapse to 0 mod 2^width). Inputs repeat with PERIOD (a prime, 65537),
 * so the reference of a 2^20+3 vector costs one period.
 *
 * Cut by default, to stay within ~90 s on two cores (HCOLL_SWEEP_FULL=1
 * runs the whole matrix), only at 2^20+3 elements (count = recvcount for
 * the reduce-scatter, sendcount for the all-gather):
 *   all-reduce      SUM and one other op per dtype (the op rotating with
 *                   the dtype), each in one placement (alternating)
 *   reduce-scatter  one op per dtype (rotating over all six), one placement
 *   all-gather      one placement per dtype (alternating)
 *   broadcast       each root once, the dtype rotating, the placement
 *                   alternating
 * Every other count runs the whole matrix. The reduce-scatter's result is
 * each rank's own block, so only the other collectives compare hashes.
 * Also: fp16 AVG of 20000 on 4 ranks (2x2) gives exactly 20000 (bf16: its
 * nearest, 19968), at 1, 4093 and 2^20+3 elements.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/elems.h"
#include "common/mockib.h"
#include "common/ranks.h"
#include "hc_build.h"

#define MAX_RANKS 8
#define TIMEOUT_MS 20000
#define GUARD 64
#define BIG_COUNT (((size_t)1 << 20) + 3)
#define PERIOD ((size_t)65537)
#define MAX_CASES 8192
#define NOPS 6 /* SUM PROD MAX MIN AVG, then PREMUL_SUM */
#define OP_PREMUL 5

static const size_t counts[] = { 0, 1, 7, 4093, BIG_COUNT };
#define NCOUNTS ((int)(sizeof counts / sizeof counts[0]))

enum { C_AR, C_RS, C_AG, C_BC, C_COUNT };
static const char *const coll_names[C_COUNT] = { "allreduce", "reduce_scatter", "allgather",
                                                 "broadcast" };

typedef struct sw_case {
    int coll;
    hcoll_dtype_t dt;
    int op; /* 0..4: hcoll_op_t; OP_PREMUL */
    size_t count;
    int inplace;
    int root;
} sw_case_t;

typedef struct world {
    hct_id_slot_t slot;
    char name[32];
    int nranks;
    int nnodes;
    int lsize; /* ranks per node; 0: nodes of different sizes */
    int node_of[MAX_RANKS];
    int full;
    int ib; /* HCOLL_NET=ib on the emulated verbs provider */
    hct_barrier_t bar;
    int ncases;
    volatile int entered[MAX_CASES];
    uint64_t hash[MAX_CASES][MAX_RANKS];
} world_t;

static uint64_t mix(uint64_t h)
{
    h ^= h >> 31;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static const char *op_label(int op)
{
    return op == OP_PREMUL ? "premul_sum" : hcoll_op_name((hcoll_op_t)op);
}

/* ------------------------------------------------------------------------ */
/* Elements as raw bits (the dtype's bytes, little-endian, in a uint64)       */
/* ------------------------------------------------------------------------ */

static uint64_t bits_of(hcoll_dtype_t dt, double v)
{
    uint64_t b = 0;
    put(dt, &b, 0, v);
    return b;
}

static double val_of(hcoll_dtype_t dt, uint64_t b)
{
    return get(dt, &b, 0);
}

static int is_nan_bits(hcoll_dtype_t dt, uint64_t b)
{
    return is_float(dt) && isnan(val_of(dt, b));
}

static int width_of(hcoll_dtype_t dt)
{
    return (int)hcoll_dtype_size(dt) * 8;
}

static uint64_t mask_of(hcoll_dtype_t dt)
{
    int w = width_of(dt);
    return w == 64 ? ~0ull : ((1ull << w) - 1);
}

/* The integer as the library's signed (or, for UINT8, unsigned) type. */
static int64_t int_of(hcoll_dtype_t dt, uint64_t b)
{
    int w = width_of(dt);
    if (dt == HCOLL_UINT8 || w == 64)
        return (int64_t)b;
    uint64_t sign = 1ull << (w - 1);
    return (int64_t)((b ^ sign) - sign);
}

/* Round a float result into the type: half types round to nearest-even. */
static uint64_t store_f(hcoll_dtype_t dt, float f)
{
    switch (dt) {
    case HCOLL_FLOAT16: return f2h(f);
    case HCOLL_BFLOAT16: return f2bf(f);
    default: { uint32_t u; memcpy(&u, &f, 4); return u; }
    }
}

static float load_f(hcoll_dtype_t dt, uint64_t b)
{
    switch (dt) {
    case HCOLL_FLOAT16: return h2f((uint16_t)b);
    case HCOLL_BFLOAT16: return bf2f((uint16_t)b);
    default: { uint32_t u = (uint32_t)b; float f; memcpy(&f, &u, 4); return f; }
    }
}

/* a op b, one step of the library's reduction (op: SUM PROD MAX MIN). */
static uint64_t combine(hcoll_dtype_t dt, int op, uint64_t a, uint64_t b)
{
    if (dt == HCOLL_FLOAT64) {
        double x, y, r;
        memcpy(&x, &a, 8);
        memcpy(&y, &b, 8);
        switch (op) {
        case HCOLL_SUM: r = x + y; break;
        case HCOLL_PROD: r = x * y; break;
        case HCOLL_MAX: r = (isnan(x) || isnan(y)) ? NAN : (x > y ? x : y); break;
        default: r = (isnan(x) || isnan(y)) ? NAN : (x < y ? x : y); break;
        }
        uint64_t o;
        memcpy(&o, &r, 8);
        return o;
    }
    if (is_float(dt)) {
        float x = load_f(dt, a), y = load_f(dt, b), r;
        switch (op) {
        case HCOLL_SUM: r = x + y; break;
        case HCOLL_PROD: r = x * y; break;
        case HCOLL_MAX: r = (isnan(x) || isnan(y)) ? NAN : (x > y ? x : y); break;
        default: r = (isnan(x) || isnan(y)) ? NAN : (x < y ? x : y); break;
        }
        return store_f(dt, r);
    }
    int64_t x = int_of(dt, a), y = int_of(dt, b);
    switch (op) {
    case HCOLL_SUM: return (a + b) & mask_of(dt);
    case HCOLL_PROD: return (a * b) & mask_of(dt);
    case HCOLL_MAX: return (uint64_t)(x > y ? x : y) & mask_of(dt);
    default: return (uint64_t)(x < y ? x : y) & mask_of(dt);
    }
}

/* x times s, rounded as AVG/PREMUL_SUM's product (hcoll.h). */
static uint64_t premul(hcoll_dtype_t dt, uint64_t x, uint64_t s)
{
    if (dt == HCOLL_FLOAT64 || !is_float(dt))
        return combine(dt, HCOLL_PROD, x, s);
    return store_f(dt, load_f(dt, x) * load_f(dt, s));
}

/* ------------------------------------------------------------------------ */
/* Inputs                                                                     */
/* ------------------------------------------------------------------------ */

/* Rank r's local rank in the reference's sense: its key for "rounding"
 * elements (0 everywhere on uneven nodes, where the ring spans all ranks). */
static int key_of(const world_t *w, int r)
{
    return w->lsize ? r % w->lsize : 0;
}

/* Rank r's PREMUL_SUM scalar (one element of dt). Floats: depends on the
 * key only and is not dyadic, so products round; integers: any value. */
static uint64_t scalar_of(const world_t *w, hcoll_dtype_t dt, int r)
{
    if (!is_float(dt))
        return (uint64_t)(7 * r - 3) & mask_of(dt);
    return bits_of(dt, 0.1 * (key_of(w, r) + 1) + 0.7);
}

/* An arbitrary non-zero float: sign, full mantissa, exponent in
 * [-emax, emax]. */
static double wide(uint64_t h, int emax)
{
    double m = 1.0 + (double)((h >> 12) & 0xfffffffffffull) / 17592186044416.0;
    int e = (int)((h >> 4) % (uint64_t)(2 * emax + 1)) - emax;
    return ldexp((h & 1) ? -m : m, e);
}

/* Rank r's input element at residue u, as raw bits. */
static uint64_t input(const world_t *w, const sw_case_t *c, int r, size_t u)
{
    const hcoll_dtype_t dt = c->dt;
    const int n = w->nranks;
    const uint64_t seed = ((uint64_t)dt << 8 | (uint64_t)c->op << 4 | (uint64_t)c->coll) << 40;
    const uint64_t hr = mix(seed ^ (u * 1000003u + (uint64_t)r * 7919u + 17));
    const uint64_t hk = mix(seed ^ (u * 1000003u + (uint64_t)key_of(w, r) * 7919u + 99991));
    if (c->coll == C_BC || c->coll == C_AG)
        return hr & mask_of(dt); /* any bits, NaNs included */
    if (!is_float(dt)) {
        if (c->op == HCOLL_PROD) {
            if (u % 7 == 0)
                return 2;
            int64_t v = (int64_t)((hr % 4) * 2 + 1);
            return (uint64_t)((hr & 16) ? -v : v) & mask_of(dt);
        }
        return hr & mask_of(dt);
    }
    if (c->op == HCOLL_MAX || c->op == HCOLL_MIN) {
        if (u % 61 == 7 && (size_t)r == (u / 61) % (size_t)n)
            return bits_of(dt, NAN);
        return bits_of(dt, wide(hr, 6));
    }
    if (u % 2 == 1) { /* rounding: the key's value */
        if (c->op == HCOLL_PROD)
            return bits_of(dt, 1.0 + ((double)(hk % 2001) - 1000.0) / 4096.0);
        return bits_of(dt, wide(hk, 3));
    }
    if (c->op == HCOLL_PROD) { /* exact: powers of two */
        static const double p2[] = { 0.5, 1.0, 2.0, -0.5, -1.0, -2.0 };
        return bits_of(dt, p2[hr % 6]);
    }
    if (c->op == HCOLL_SUM && u % 4 == 0) /* exact: small integers */
        return bits_of(dt, (double)(hr % 17) - 8.0);
    /* solo: one rank's arbitrary value, zeros elsewhere */
    return (size_t)r == (u / 4) % (size_t)n ? bits_of(dt, wide(hr, 8)) : 0;
}

/* ------------------------------------------------------------------------ */
/* The reference                                                              */
/* ------------------------------------------------------------------------ */

/* The input of rank r as the sum sees it: scaled for AVG (floats) and
 * PREMUL_SUM. */
static uint64_t term(const world_t *w, const sw_case_t *c, int r, size_t u)
{
    uint64_t x = input(w, c, r, u);
    if (c->op == OP_PREMUL)
        return premul(c->dt, x, scalar_of(w, c->dt, r));
    if (c->op == HCOLL_AVG && is_float(c->dt)) {
        uint64_t s = c->dt == HCOLL_FLOAT64 ? bits_of(c->dt, 1.0 / w->nranks)
                                            : store_f(HCOLL_FLOAT32, 1.0f / (float)w->nranks);
        if (c->dt == HCOLL_FLOAT64)
            return premul(c->dt, x, s);
        return store_f(c->dt, load_f(c->dt, x) * load_f(HCOLL_FLOAT32, s));
    }
    return x;
}

static uint64_t reference(const world_t *w, const sw_case_t *c, size_t u)
{
    const int op = c->op == OP_PREMUL || c->op == HCOLL_AVG ? HCOLL_SUM : c->op;
    uint64_t acc = 0;
    if (w->lsize) { /* each node in local-rank order, then the nodes */
        for (int nd = 0; nd < w->nnodes; nd++) {
            uint64_t p = term(w, c, nd * w->lsize, u);
            for (int l = 1; l < w->lsize; l++)
                p = combine(c->dt, op, p, term(w, c, nd * w->lsize + l, u));
            acc = nd == 0 ? p : combine(c->dt, op, acc, p);
        }
    } else {
        acc = term(w, c, 0, u);
        for (int r = 1; r < w->nranks; r++)
            acc = combine(c->dt, op, acc, term(w, c, r, u));
    }
    if (c->op == HCOLL_AVG && !is_float(c->dt)) {
        int64_t s = int_of(c->dt, acc);
        acc = c->dt == HCOLL_UINT8 ? (uint64_t)(s / w->nranks)
                                   : (uint64_t)(s / (int64_t)w->nranks) & mask_of(c->dt);
    }
    return acc;
}

/* ------------------------------------------------------------------------ */
/* Tiles: a period of elements, laid over a buffer or compared with it        */
/* ------------------------------------------------------------------------ */

static void tile_fill(unsigned char *buf, const unsigned char *tile, size_t es, size_t first,
                      size_t n)
{
    size_t done = 0;
    while (done < n) {
        size_t u = (first + done) % PERIOD;
        size_t run = PERIOD - u < n - done ? PERIOD - u : n - done;
        memcpy(buf + done * es, tile + u * es, run * es);
        done += run;
    }
}

/* Index of the first element of buf[0..n) (global index first..) that is
 * not the tile's, NaN matching any NaN; n when all match. */
static size_t tile_diff(const unsigned char *buf, const unsigned char *tile, hcoll_dtype_t dt,
                        int nan_any, size_t first, size_t n)
{
    const size_t es = hcoll_dtype_size(dt);
    size_t done = 0;
    while (done < n) {
        size_t u = (first + done) % PERIOD;
        size_t run = PERIOD - u < n - done ? PERIOD - u : n - done;
        if (memcmp(buf + done * es, tile + u * es, run * es) != 0) {
            for (size_t k = 0; k < run; k++) {
                uint64_t g = 0, x = 0;
                memcpy(&g, buf + (done + k) * es, es);
                memcpy(&x, tile + (u + k) * es, es);
                if (g != x && !(nan_any && is_nan_bits(dt, g) && is_nan_bits(dt, x)))
                    return done + k;
            }
        }
        done += run;
    }
    return n;
}

static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        h = (h ^ x) * 0x100000001b3ull;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ------------------------------------------------------------------------ */
/* The matrix                                                                 */
/* ------------------------------------------------------------------------ */

static int add_case(sw_case_t *cs, int n, int coll, hcoll_dtype_t dt, int op, size_t count,
                    int inplace, int root)
{
    if (n < MAX_CASES)
        cs[n] = (sw_case_t){ coll, dt, op, count, inplace, root };
    return n + 1;
}

/* The cut at 2^20+3 elements (unless HCOLL_SWEEP_FULL): the all-reduce
 * runs SUM and one other op per dtype (rotating over the other five), each
 * in one placement (alternating); the reduce-scatter, which moves nranks
 * times the bytes, one op per dtype (rotating over all six) in one
 * placement (alternating). */
static int keep_big_ar(int d, int op, int ip)
{
    if (op == HCOLL_SUM)
        return ip == d % 2;
    return op == 1 + d % (NOPS - 1) && ip == 1 - d % 2;
}

static int keep_big_rs(int d, int op, int ip)
{
    return op == d % NOPS && ip == (d / 2) % 2;
}

/* Every case of the layout, in the order all ranks run them. */
static int build_cases(const world_t *w, sw_case_t *cs)
{
    int n = 0;
    for (int ci = 0; ci < NCOUNTS; ci++) {
        const size_t count = counts[ci];
        const int big = count == BIG_COUNT && !w->full;
        for (int d = 0; d < HCOLL_DTYPE_COUNT_; d++) {
            for (int op = 0; op < NOPS; op++) {
                for (int ip = 0; ip <= 1; ip++) {
                    if (!big || keep_big_ar(d, op, ip))
                        n = add_case(cs, n, C_AR, (hcoll_dtype_t)d, op, count, ip, 0);
                    if (!big || keep_big_rs(d, op, ip))
                        n = add_case(cs, n, C_RS, (hcoll_dtype_t)d, op, count, ip, 0);
                }
            }
        }
        for (int d = 0; d < HCOLL_DTYPE_COUNT_; d++)
            for (int ip = 0; ip <= 1; ip++)
                if (!big || ip == d % 2)
                    n = add_case(cs, n, C_AG, (hcoll_dtype_t)d, HCOLL_SUM, count, ip, 0);
        for (int root = 0; root < w->nranks; root++) {
            for (int d = 0; d < HCOLL_DTYPE_COUNT_; d++) {
                if (big && d != (root * 3) % HCOLL_DTYPE_COUNT_)
                    continue;
                for (int ip = 0; ip <= 1; ip++) {
                    if (big && ip != root % 2)
                        continue;
                    n = add_case(cs, n, C_BC, (hcoll_dtype_t)d, HCOLL_SUM, count, ip, root);
                }
            }
        }
    }
    return n;
}

/* ------------------------------------------------------------------------ */
/* One case on one rank                                                       */
/* ------------------------------------------------------------------------ */

typedef struct bufs {
    unsigned char *send, *recv;
    unsigned char *in_tile;  /* this rank's inputs, one period */
    unsigned char *ref_tile; /* the reference, one period */
} bufs_t;

#define CASE_FMT "%s rank %d: %s %s %s count %zu %s root %d"
#define CASE_ARGS(w, rank, c)                                                    \
    (w)->name, rank, coll_names[(c)->coll], hcoll_dtype_name((c)->dt), op_label((c)->op), \
        (c)->count, (c)->inplace ? "in place" : "out of place", (c)->root

/* Elements of the buffer the result lands in: recvbuf, or for a
 * reduce-scatter in place the whole sendbuf it is part of. */
static size_t recv_elems(const world_t *w, const sw_case_t *c)
{
    if (c->coll == C_AG || (c->coll == C_RS && c->inplace))
        return c->count * (size_t)w->nranks;
    return c->count;
}

/* Elements this rank sends: all of sendbuf. */
static size_t send_elems(const world_t *w, const sw_case_t *c)
{
    return c->coll == C_RS ? c->count * (size_t)w->nranks : c->count;
}

/* Fills in_tile with rank src's inputs, one period (or fewer). */
static void inputs_tile(const world_t *w, const sw_case_t *c, int src, unsigned char *tile)
{
    const size_t es = hcoll_dtype_size(c->dt);
    const size_t n = send_elems(w, c);
    const size_t tile_n = n < PERIOD ? n : PERIOD;
    for (size_t u = 0; u < tile_n; u++) {
        uint64_t x = input(w, c, src, u);
        memcpy(tile + u * es, &x, es);
    }
}

/* Issue case c: blocking with req NULL, else as a request in *req. Then
 * *res_out is the result to check and hash, its first element being
 * global element *first_out. In place as NCCL defines it. */
static int run_one(world_t *w, hcoll_comm_t comm, int rank, const sw_case_t *c, bufs_t *b,
                   hcoll_request_t *req, unsigned char **res_out, size_t *first_out)
{
    const size_t es = hcoll_dtype_size(c->dt), n = c->count;
    inputs_tile(w, c, c->coll == C_BC ? c->root : rank, b->in_tile);
    memset(b->recv, 0xa5, recv_elems(w, c) * es + GUARD);
    unsigned char *sb = c->inplace ? b->recv : b->send, *rb = b->recv;
    *res_out = b->recv;
    *first_out = 0;
    hcoll_op_t op = (hcoll_op_t)c->op;
    const int made = c->op == OP_PREMUL && (c->coll == C_AR || c->coll == C_RS);
    if (made) {
        uint64_t s = scalar_of(w, c->dt, rank);
        HCT_OK(comm, hcoll_op_create_premul_sum(comm, &s, c->dt, HCOLL_SCALAR_HOST_IMMEDIATE, &op));
    }
    hcoll_status_t st;
    switch (c->coll) {
    case C_AR:
        tile_fill(sb, b->in_tile, es, 0, n);
        st = req ? hcoll_allreduce_async(comm, sb, rb, n, c->dt, op, NULL, req)
                 : hcoll_allreduce(comm, sb, rb, n, c->dt, op, NULL);
        break;
    case C_RS:
        tile_fill(sb, b->in_tile, es, 0, n * (size_t)w->nranks);
        if (c->inplace)
            rb = sb + (size_t)rank * n * es;
        *res_out = rb;
        *first_out = (size_t)rank * n;
        st = req ? hcoll_reduce_scatter_async(comm, sb, rb, n, c->dt, op, NULL, req)
                 : hcoll_reduce_scatter(comm, sb, rb, n, c->dt, op, NULL);
        break;
    case C_AG:
        if (c->inplace)
            sb = rb + (size_t)rank * n * es;
        tile_fill(sb, b->in_tile, es, 0, n);
        st = req ? hcoll_allgather_async(comm, sb, rb, n, c->dt, NULL, req)
                 : hcoll_allgather(comm, sb, rb, n, c->dt, NULL);
        break;
    default:
        if (rank == c->root)
            tile_fill(sb, b->in_tile, es, 0, n);
        st = req ? hcoll_broadcast_async(comm, sb, rb, n, c->dt, c->root, NULL, req)
                 : hcoll_broadcast(comm, sb, rb, n, c->dt, c->root, NULL);
        break;
    }
    /* A request keeps its op's scalar: destroying the op now is allowed. */
    if (made)
        HCT_OK(comm, hcoll_op_destroy(comm, op));
    HCT_REQUIRE(st == HCOLL_SUCCESS, CASE_FMT " -> %s (%s)", CASE_ARGS(w, rank, c),
                hcoll_status_name(st), hcoll_comm_last_error(comm));
    return 0;
}

/* 0 when buf[0..n) (global elements first..) holds want's elements. */
static int expect(world_t *w, int rank, const sw_case_t *c, const char *what,
                  const unsigned char *buf, const unsigned char *want, size_t first, size_t n)
{
    const size_t es = hcoll_dtype_size(c->dt);
    const int nan_any = c->coll == C_AR || c->coll == C_RS;
    size_t i = tile_diff(buf, want, c->dt, nan_any, first, n);
    if (i < n) {
        uint64_t g = 0, x = 0;
        memcpy(&g, buf + i * es, es);
        memcpy(&x, want + ((first + i) % PERIOD) * es, es);
        HCT_REQUIRE(0, CASE_FMT ": %s element %zu is 0x%llx (%.9g), want 0x%llx (%.9g)",
                    CASE_ARGS(w, rank, c), what, first + i, (unsigned long long)g,
                    val_of(c->dt, g), (unsigned long long)x, val_of(c->dt, x));
    }
    return 0;
}

static int check_one(world_t *w, int rank, int k, const sw_case_t *c, bufs_t *b,
                     const unsigned char *res, size_t first)
{
    const size_t es = hcoll_dtype_size(c->dt), n = c->count, nr = (size_t)w->nranks;
    if (c->coll == C_AG) { /* block q is rank q's inputs */
        for (int q = 0; q < w->nranks; q++) {
            inputs_tile(w, c, q, b->ref_tile);
            if (expect(w, rank, c, "result", res + (size_t)q * n * es, b->ref_tile, 0, n))
                return 1;
        }
    } else if (c->coll == C_BC) { /* the root's inputs */
        if (expect(w, rank, c, "result", res, b->in_tile, 0, n))
            return 1;
    } else {
        /* the residues of this rank's elements, or one whole period */
        const size_t all = send_elems(w, c), lo = all <= PERIOD ? first : 0;
        const size_t hi = all <= PERIOD ? first + n : PERIOD;
        for (size_t u = lo; u < hi; u++) {
            uint64_t x = reference(w, c, u);
            memcpy(b->ref_tile + u * es, &x, es);
        }
        if (expect(w, rank, c, "result", res, b->ref_tile, first, n))
            return 1;
    }
    const size_t end = recv_elems(w, c) * es;
    for (size_t g = 0; g < GUARD; g++)
        HCT_REQUIRE(b->recv[end + g] == 0xa5, CASE_FMT ": wrote %zu bytes past the end",
                    CASE_ARGS(w, rank, c), g + 1);
    /* Inputs left alone: sendbuf out of place; in place, a reduce-scatter's
     * other blocks. */
    if (c->coll == C_RS && c->inplace) {
        for (size_t q = 0; q < nr; q++)
            if (q != (size_t)rank &&
                expect(w, rank, c, "sendbuf", b->recv + q * n * es, b->in_tile, q * n, n))
                return 1;
    } else if (!c->inplace && (c->coll != C_BC || rank == c->root)) {
        if (expect(w, rank, c, "sendbuf", b->send, b->in_tile, 0, send_elems(w, c)))
            return 1;
    }
    w->hash[k][rank] = c->coll == C_RS ? 0 : hash_bytes(res, (c->coll == C_AG ? nr : 1) * n * es);
    return 0;
}

/* hcoll_barrier between cases: every rank must have entered before any
 * leaves (a counter in shared memory). */
static int barrier_between(world_t *w, hcoll_comm_t comm, int rank, int k)
{
    __atomic_add_fetch(&w->entered[k], 1, __ATOMIC_ACQ_REL);
    HCT_OK(comm, hcoll_barrier(comm));
    int in = __atomic_load_n(&w->entered[k], __ATOMIC_ACQUIRE);
    HCT_REQUIRE(in == w->nranks, "%s rank %d: left barrier %d with %d of %d ranks in", w->name,
                rank, k, in, w->nranks);
    return 0;
}

static int wait_case(world_t *w, hcoll_comm_t comm, int rank, const sw_case_t *c,
                     hcoll_request_t rq)
{
    hcoll_status_t st = hcoll_wait(rq);
    HCT_REQUIRE(st == HCOLL_SUCCESS, CASE_FMT ": wait -> %s (%s)", CASE_ARGS(w, rank, c),
                hcoll_status_name(st), hcoll_comm_last_error(comm));
    HCT_OK(comm, hcoll_request_free(rq));
    return 0;
}

/* Cases k and k+1 as requests with a barrier request between them, all
 * three queued before the first is waited for: each result must still be
 * its own, and the barrier must hold every rank until all entered. */
static int run_pair(world_t *w, hcoll_comm_t comm, int rank, int k, const sw_case_t *cs,
                    bufs_t *b)
{
    hcoll_request_t rq[2], bar;
    unsigned char *res[2];
    size_t first[2];
    if (run_one(w, comm, rank, &cs[k], &b[0], &rq[0], &res[0], &first[0]))
        return 1;
    __atomic_add_fetch(&w->entered[k], 1, __ATOMIC_ACQ_REL);
    HCT_OK(comm, hcoll_barrier_async(comm, &bar));
    if (run_one(w, comm, rank, &cs[k + 1], &b[1], &rq[1], &res[1], &first[1]))
        return 1;
    if (wait_case(w, comm, rank, &cs[k], rq[0]))
        return 1;
    HCT_OK(comm, hcoll_wait(bar));
    HCT_OK(comm, hcoll_request_free(bar));
    int in = __atomic_load_n(&w->entered[k], __ATOMIC_ACQUIRE);
    HCT_REQUIRE(in == w->nranks, "%s rank %d: left barrier request %d with %d of %d ranks in",
                w->name, rank, k, in, w->nranks);
    if (wait_case(w, comm, rank, &cs[k + 1], rq[1]))
        return 1;
    if (check_one(w, rank, k, &cs[k], &b[0], res[0], first[0]))
        return 1;
    return check_one(w, rank, k + 1, &cs[k + 1], &b[1], res[1], first[1]);
}

/* The case: fp16 AVG of 20000 on 4 ranks is exactly 20000 (the sum,
 * 80000, would be past fp16's 65504); bf16 likewise gives its own 20000
 * (19968) back. */
static int avg_20000(world_t *w, hcoll_comm_t comm, int rank, unsigned char *buf)
{
    static const hcoll_dtype_t dts[] = { HCOLL_FLOAT16, HCOLL_BFLOAT16 };
    static const size_t ns[] = { 1, 4093, BIG_COUNT };
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            const uint64_t v = bits_of(dts[d], 20000.0);
            for (size_t i = 0; i < ns[k]; i++)
                memcpy(buf + 2 * i, &v, 2);
            HCT_OK(comm, hcoll_allreduce(comm, buf, buf, ns[k], dts[d], HCOLL_AVG, NULL));
            for (size_t i = 0; i < ns[k]; i++) {
                uint64_t g = 0;
                memcpy(&g, buf + 2 * i, 2);
                HCT_REQUIRE(g == v, "%s rank %d: %s AVG of 20000 count %zu: element %zu is "
                            "%.9g", w->name, rank, hcoll_dtype_name(dts[d]), ns[k], i,
                            val_of(dts[d], g));
            }
        }
    HCT_REQUIRE(val_of(HCOLL_FLOAT16, bits_of(HCOLL_FLOAT16, 20000.0)) == 20000.0, "fp16 20000");
    return 0;
}

static int rank_sweep(int rank, int nranks, void *argp)
{
    world_t *w = argp;
    char hostid[96];
    snprintf(hostid, sizeof hostid, "hct-sw-%d-%s-node%d", (int)getppid(), w->name,
             w->node_of[rank]);
    setenv("HCOLL_HOSTID", hostid, 1);
    setenv("HCOLL_SMALL_BYTES", "4096", 1); /* 4093 elements take the pipelined path */
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.chunk_bytes = 65536; /* several pieces for 4093 doubles, many for 2^20 */
    if (w->ib) {
        setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
        cfg.net = "ib";
    }
    HCT_REQUIRE(hct_share_unique_id(&w->slot, rank, TIMEOUT_MS, &id) == 0, "no unique id");
    hcoll_comm_t comm;
    HCT_OK(NULL, hcoll_comm_init(&comm, nranks, rank, &id, &cfg));
    if (w->lsize) {
        int lr = -1;
        HCT_OK(comm, hcoll_comm_local_rank(comm, &lr));
        HCT_REQUIRE(lr == rank % w->lsize, "%s rank %d: local rank %d", w->name, rank, lr);
    }

    static sw_case_t cs[MAX_CASES];
    const int ncases = build_cases(w, cs);
    HCT_REQUIRE(ncases <= MAX_CASES, "%d cases", ncases);
    const size_t max = BIG_COUNT * 8 * (size_t)nranks + GUARD;
    bufs_t b[2];
    for (int i = 0; i < 2; i++) {
        b[i] = (bufs_t){ malloc(max), malloc(max), malloc(PERIOD * 8), malloc(PERIOD * 8) };
        HCT_REQUIRE(b[i].send && b[i].recv && b[i].in_tile && b[i].ref_tile, "no memory");
    }
    int rc = nranks == 4 ? avg_20000(w, comm, rank, b[0].recv) : 0;
    for (int k = 0; k < ncases && rc == 0; k++) {
        if (k % 5 == 1 && k + 1 < ncases) { /* a pair of requests, a barrier between */
            rc = run_pair(w, comm, rank, k, cs, b);
            k++;
            continue;
        }
        unsigned char *res;
        size_t first;
        rc = run_one(w, comm, rank, &cs[k], &b[0], NULL, &res, &first);
        if (rc == 0)
            rc = check_one(w, rank, k, &cs[k], &b[0], res, first);
        if (rc == 0 && k % 5 == 3)
            rc = barrier_between(w, comm, rank, k);
    }
    if (rc == 0) {
        /* Every rank's hash of every case against rank 0's. */
        HCT_REQUIRE(hct_barrier_wait(&w->bar, nranks, TIMEOUT_MS) == 0, "barrier");
        for (int k = 0; k < ncases && rc == 0; k++)
            if (w->hash[k][rank] != w->hash[k][0]) {
                fprintf(stderr, CASE_FMT ": result differs from rank 0's\n",
                        CASE_ARGS(w, rank, &cs[k]));
                rc = 1;
            }
        w->ncases = ncases;
    }
    if (rc == 0 && w->ib) /* verbs carried it: RDMA writes, and no RNR or drops */
        rc = hct_mock_clean(w->name, 1);
    if (rc)
        hcoll_comm_abort(comm);
    else
        HCT_OK(comm, hcoll_comm_destroy(comm));
    if (rc == 0 && w->ib)
        rc = hct_mock_released(w->name);
    for (int i = 0; i < 2; i++) {
        free(b[i].send);
        free(b[i].recv);
        free(b[i].in_tile);
        free(b[i].ref_tile);
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Layouts                                                                    */
/* ------------------------------------------------------------------------ */

/* Runs the sweep on one layout; returns the number of ranks that failed
 * (or -1 when nothing ran). */
static int layout_run(const char *name, const int *node_sizes, int nnodes, int ib)
{
    world_t *w = hct_shared_alloc(sizeof *w);
    if (!w)
        return -1;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->nnodes = nnodes;
    w->lsize = node_sizes[0];
    w->ib = ib;
    for (int nd = 0; nd < nnodes; nd++) {
        if (node_sizes[nd] != node_sizes[0])
            w->lsize = 0;
        for (int k = 0; k < node_sizes[nd]; k++)
            w->node_of[w->nranks++] = nd;
    }
    const char *full = getenv("HCOLL_SWEEP_FULL");
    w->full = full && atoi(full) > 0;
    const double t0 = hct_now_ms();
    hct_opts_t o = { .nranks = w->nranks, .timeout_ms = w->full ? 1800000 : 110000 };
    hct_result_t res[MAX_RANKS];
    int bad = hct_run(&o, rank_sweep, w, res);
    fprintf(stderr, "[time] %s: %d cases, %.1f s\n", name, w->ncases,
            (hct_now_ms() - t0) / 1e3);
    if (bad == 0 && w->ncases == 0)
        bad = -1;
    hct_shared_free(w, sizeof *w);
    return bad;
}

static void run_layout(const char *name, const int *node_sizes, int nnodes)
{
    int bad = layout_run(name, node_sizes, nnodes, 0);
    ck_assert_msg(bad == 0, "%s: %d rank(s) failed (see stderr)", name, bad);
}

START_TEST(sweep_3x1)
{
    run_layout("3x1", (int[]){ 1, 1, 1 }, 3);
}
END_TEST

START_TEST(sweep_2x2)
{
    run_layout("2x2", (int[]){ 2, 2 }, 2);
}
END_TEST

START_TEST(sweep_2x3)
{
    run_layout("2x3", (int[]){ 3, 3 }, 2);
}
END_TEST

START_TEST(sweep_3x2)
{
    run_layout("3x2", (int[]){ 2, 2, 2 }, 3);
}
END_TEST

START_TEST(sweep_uneven)
{
    run_layout("2,1", (int[]){ 2, 1 }, 2);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 2x2 over the emulated verbs provider                                       */
/* ------------------------------------------------------------------------ */

/* The emulation has to be loaded when the process starts
 * (common/mockib.h), so this case runs the program again with
 * HCT_SWEEP_IB=1, which enters the emulation (a second exec) and runs
 * only this layout; the other layouts keep the plain environment. */
static char **prog_argv;

static int sweep_ib_main(char **argv)
{
#if HCOLL_BUILD_VERBS
    int rc = hct_mockib_enter(argv);
    if (rc != 0)
        return rc;
    int bad = layout_run("2x2-ib", (int[]){ 2, 2 }, 2, 1);
    if (bad != 0)
        fprintf(stderr, "2x2-ib: %d rank(s) failed (see above)\n", bad);
    return bad == 0 ? 0 : 1;
#else
    (void)argv;
    printf("SKIP: hcoll was built without rdma-core headers: no verbs transport to sweep\n");
    return 77;
#endif
}

START_TEST(sweep_2x2_ib)
{
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("HCT_SWEEP_IB", "1", 1);
        execv("/proc/self/exe", prog_argv);
        _exit(127);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "the verbs sweep died of signal %d", WTERMSIG(status));
    ck_assert_msg(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77,
                  "the verbs sweep failed (exit %d, see stderr)", WEXITSTATUS(status));
}
END_TEST

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("HCT_SWEEP_IB"))
        return sweep_ib_main(argv);
    prog_argv = argv;
    Suite *s = suite_create("sweep");
    TCase *tc = tcase_create("sweep");
    const char *full = getenv("HCOLL_SWEEP_FULL");
    tcase_set_timeout(tc, full && atoi(full) > 0 ? 1800 : 120);
    tcase_add_test(tc, sweep_3x1);
    tcase_add_test(tc, sweep_2x2);
    tcase_add_test(tc, sweep_2x3);
    tcase_add_test(tc, sweep_3x2);
    tcase_add_test(tc, sweep_uneven);
    tcase_add_test(tc, sweep_2x2_ib);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
