/*
 * The soak: a 2 x 2 job (forked ranks, nodes emulated with HCOLL_HOSTID,
 * TCP on loopback) runs random collectives for a while and verifies every
 * result, element by element, against a reference computed here.
 *
 *   collectives  all-reduce, reduce-scatter, all-gather, broadcast (random
 *                root), barrier
 *   arguments    every dtype; SUM PROD MAX MIN AVG and PREMUL_SUM (a
 *                scalar per rank); in place or not; sizes 0..64 MiB of user
 *                data per call, log-uniform (every size class is hit as
 *                often; one call in 16 is empty)
 *   calls        blocking, or a batch of up to NSLOT requests at once, each
 *                with a completion callback that either leaves the request
 *                to hcoll_wait or frees it itself (the binding pattern)
 *   inputs       reductions take values whose result is exact in any order
 *                (small integers, +-2^k products, arbitrary floats for
 *                MAX/MIN, arbitrary integer bits: wrap-around is exact), so
 *                the reference is bit for bit; copies take arbitrary bits
 *   resources    each rank samples its RSS, threads and open fds; after the
 *                warm-up (every collective at the largest size, in place
 *                and out of place, reduce-scatter with a scaled op, see
 *                step(); then 10 % of the run) none may grow: RSS and
 *                malloc's bytes in use by at most 5 %, fds and threads
 *                not at all
 *
 * Every rank draws the same sequence from the seed (printed), so ranks agree
 * on each call without talking; they agree to stop with an all-reduce.
 * Fails on any wrong element, any error status, a callback that did not run
 * exactly once, or growth as above.
 *
 *   soak [-m MINUTES] [-s SEED] [-M MAX_MIB] [-n NODES] [-l RANKS_PER_NODE]
 *        [-x RANK:STEP]   (RANK fails on purpose at STEP: the others must
 *                          end at once with an error, not hang)
 * `make soak SOAK_MINUTES=N` runs it (and the 1000-cycle lifecycle test).
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/elems.h"
#include "common/ranks.h"
#include "soak_proc.h"

#define MAX_RANKS 16
#define NSLOT 2
#define CHECK_EVERY 8
#define OP_PREMUL 5
#define NOPS 6
#define RSS_SLACK 0.05
#define WARM_STEPS (2 * K_BAR + 2) /* step()'s forced largest calls */

enum { K_AR, K_RS, K_AG, K_BC, K_BAR, K_COUNT };
static const char *const kind_names[K_COUNT] = { "allreduce", "reduce_scatter", "allgather",
                                                 "broadcast", "barrier" };

typedef struct rank_stats {
    long ops, ops_by[K_COUNT], async_ops, freed_in_cb;
    double bytes;
    hct_proc_t first, base, last, max;
    double base_at_s;
    int have_base;
} rank_stats_t;

typedef struct soak_world {
    hct_id_slot_t slot;
    uint64_t seed;
    double seconds, warm_s;
    size_t max_bytes;
    int fail_rank;   /* -x: this rank fails on purpose at step fail_step */
    long fail_step;
    rank_stats_t st[MAX_RANKS];
} soak_world_t;

typedef struct soak_op {
    int kind;
    hcoll_dtype_t dt;
    int op; /* hcoll_op_t, or OP_PREMUL */
    size_t count;
    int inplace, root;
    uint64_t salt;
    uint64_t tab_bits[MAX_RANKS][16]; /* reductions' inputs (make_tables) */
    double tab_val[MAX_RANKS][16];
} soak_op_t;

/* One request of a batch and what its callback saw. */
typedef struct soak_req {
    hcoll_request_t req;
    int free_in_cb;
    volatile int calls;
    volatile int status;
} soak_req_t;

typedef struct rank_ctx {
    hcoll_comm_t comm;
    int rank, nranks;
    unsigned char *send[NSLOT], *recv[NSLOT];
    soak_world_t *w;
    rank_stats_t *st;
    uint64_t rng;
    double t0;
} rank_ctx_t;

/* ------------------------------------------------------------------------ */
/* Numbers                                                                    */
/* ------------------------------------------------------------------------ */

static uint64_t mix(uint64_t h)
{
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

static uint64_t rnd(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    return mix(*s);
}

static uint64_t mask_of(hcoll_dtype_t dt)
{
    size_t w = hcoll_dtype_size(dt) * 8;
    return w == 64 ? ~0ull : ((1ull << w) - 1);
}

static int64_t sext(hcoll_dtype_t dt, uint64_t b)
{
    size_t w = hcoll_dtype_size(dt) * 8;
    if (dt == HCOLL_UINT8 || w == 64)
        return (int64_t)b;
    uint64_t sign = 1ull << (w - 1);
    return (int64_t)((b ^ sign) - sign);
}

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

static uint64_t load_bits(const unsigned char *buf, size_t i, size_t es)
{
    uint64_t b = 0;
    memcpy(&b, buf + i * es, es);
    return b;
}

static void store_bits(unsigned char *buf, size_t i, size_t es, uint64_t b)
{
    memcpy(buf + i * es, &b, es);
}

/* Rank r's PREMUL_SUM scalar: powers of two for floats (exact products). */
static double premul_scalar(hcoll_dtype_t dt, int r)
{
    static const double f[4] = { 0.5, 1, 2, 4 };
    return is_float(dt) ? f[r % 4] : (double)(r + 1);
}

/* Reductions draw rank r's element i from a table of 16 values per rank
 * (16 random bits of one hash per element pick them), so the reference
 * costs one hash and a few loads per element: small integers (SUM, AVG,
 * PREMUL_SUM), +-2^k (PROD), arbitrary floats (MAX, MIN), arbitrary bits
 * (integers). Copies take a hash per element and rank. */
static void make_tables(soak_op_t *o, int nranks)
{
    static const double prodv[8] = { 1, -1, 2, -2, 0.5, -0.5, 4, -0.25 };
    uint64_t s = o->salt;
    for (int r = 0; r < nranks; r++)
        for (int k = 0; k < 16; k++) {
            uint64_t h = rnd(&s);
            double v;
            if (!is_float(o->dt)) {
                o->tab_bits[r][k] = h & mask_of(o->dt);
                continue;
            }
            switch (o->op) {
            case HCOLL_PROD: v = prodv[h & 7]; break;
            case HCOLL_MAX:
            case HCOLL_MIN: v = (double)(int32_t)(uint32_t)h / 65536.0; break;
            default: v = (double)((int)(h & 15) - 8); break;
            }
            o->tab_bits[r][k] = bits_of(o->dt, v);
            o->tab_val[r][k] = val_of(o->dt, o->tab_bits[r][k]);
        }
}

static uint64_t elem_hash(const soak_op_t *o, size_t i)
{
    return mix(o->salt + (uint64_t)i * 0x9e3779b97f4a7c15ull);
}

/* Element i of rank r's input. */
static uint64_t in_bits(const soak_op_t *o, int r, size_t i)
{
    if (o->kind == K_AG || o->kind == K_BC)
        return mix(o->salt + (uint64_t)i * 0x9e3779b97f4a7c15ull +
                   (uint64_t)(r + 1) * 0xd1b54a32d192ed03ull) & mask_of(o->dt);
    return o->tab_bits[r][(elem_hash(o, i) >> (4 * r)) & 15];
}

static uint64_t ref_float(const soak_op_t *o, int nranks, size_t i)
{
    const uint64_t h = elem_hash(o, i);
    double acc = o->op == HCOLL_PROD ? 1 : o->op == HCOLL_MAX ? -INFINITY
               : o->op == HCOLL_MIN ? INFINITY : 0;
    for (int r = 0; r < nranks; r++) {
        double x = o->tab_val[r][(h >> (4 * r)) & 15];
        switch (o->op) {
        case HCOLL_SUM: acc += x; break;
        case HCOLL_PROD: acc *= x; break;
        case HCOLL_MAX: acc = x > acc ? x : acc; break;
        case HCOLL_MIN: acc = x < acc ? x : acc; break;
        case HCOLL_AVG: acc += x * (1.0 / nranks); break;
        default: acc += x * premul_scalar(o->dt, r); break;
        }
    }
    return bits_of(o->dt, acc);
}

static uint64_t ref_int(const soak_op_t *o, int nranks, size_t i)
{
    const uint64_t m = mask_of(o->dt), h = elem_hash(o, i);
    uint64_t acc = o->op == HCOLL_PROD ? 1 : 0;
    for (int r = 0; r < nranks; r++) {
        uint64_t x = o->tab_bits[r][(h >> (4 * r)) & 15];
        switch (o->op) {
        case HCOLL_SUM:
        case HCOLL_AVG: acc += x; break;
        case HCOLL_PROD: acc *= x; break;
        case HCOLL_MAX: acc = (r == 0 || sext(o->dt, x) > sext(o->dt, acc)) ? x : acc; break;
        case HCOLL_MIN: acc = (r == 0 || sext(o->dt, x) < sext(o->dt, acc)) ? x : acc; break;
        default: acc += x * (uint64_t)(int64_t)premul_scalar(o->dt, r); break;
        }
    }
    if (o->op == HCOLL_AVG)
        acc = (uint64_t)(sext(o->dt, acc & m) / nranks);
    return acc & m;
}

/* ------------------------------------------------------------------------ */
/* One call                                                                   */
/* ------------------------------------------------------------------------ */

static void draw_op(rank_ctx_t *c, int force_kind, soak_op_t *o)
{
    o->kind = force_kind >= 0 ? force_kind : (int)(rnd(&c->rng) % K_COUNT);
    o->dt = (hcoll_dtype_t)(rnd(&c->rng) % HCOLL_DTYPE_COUNT_);
    o->op = (int)(rnd(&c->rng) % NOPS);
    /* The warm-up's reduce-scatters are PREMUL_SUM: see step(). */
    if (force_kind == K_RS)
        o->op = OP_PREMUL;
    /* Float AVG's products 1/n are exact only for n a power of two. */
    if (o->op == HCOLL_AVG && is_float(o->dt) && (c->nranks & (c->nranks - 1)))
        o->op = HCOLL_SUM;
    double u = (double)(rnd(&c->rng) >> 11) / 9007199254740992.0;
    size_t bytes = (size_t)exp2(u * log2((double)c->w->max_bytes));
    if (force_kind >= 0)
        bytes = c->w->max_bytes;
    else if (rnd(&c->rng) % 16 == 0)
        bytes = 0;
    size_t unit = hcoll_dtype_size(o->dt) * (o->kind == K_RS || o->kind == K_AG ? c->nranks : 1);
    o->count = bytes / unit;
    o->inplace = (int)(rnd(&c->rng) & 1);
    o->root = (int)(rnd(&c->rng) % (uint64_t)c->nranks);
    o->salt = rnd(&c->rng);
    make_tables(o, c->nranks);
}

/* Elements of the caller's whole vector (what the bytes figure counts). */
static size_t op_elems(const rank_ctx_t *c, const soak_op_t *o)
{
    return o->kind == K_RS || o->kind == K_AG ? o->count * c->nranks
         : o->kind == K_BAR ? 0 : o->count;
}

static void describe(const rank_ctx_t *c, const soak_op_t *o, char *buf, size_t len)
{
    snprintf(buf, len, "%s %s %s count %zu %s root %d salt %016" PRIx64, kind_names[o->kind],
             hcoll_dtype_name(o->dt),
             o->op == OP_PREMUL ? "premul_sum" : hcoll_op_name((hcoll_op_t)o->op), o->count,
             o->inplace ? "in place" : "out of place", o->root, o->salt);
    (void)c;
}

/* Poison the output, write this rank's input; send_out and recv_out get the
 * pointers the call takes. */
static void prepare(rank_ctx_t *c, const soak_op_t *o, int s, void **send_out, void **recv_out)
{
    const size_t es = hcoll_dtype_size(o->dt), n = op_elems(c, o);
    unsigned char *snd = c->send[s], *rcv = c->recv[s];
    memset(rcv, 0xa5, n * es);
    size_t off = 0, nin = o->count; /* where this rank's input goes, elements */
    unsigned char *in = o->inplace ? rcv : snd;
    if (o->kind == K_RS)
        nin = n;
    else if (o->kind == K_AG && o->inplace)
        off = (size_t)c->rank * o->count;
    int src = o->kind == K_BC ? o->root : c->rank;
    if (o->kind != K_BC || c->rank == o->root)
        for (size_t i = 0; i < nin; i++)
            store_bits(in, off + i, es, in_bits(o, src, i));
    *send_out = in + off * es;
    *recv_out = rcv;
    if (o->kind == K_RS && o->inplace)
        *recv_out = rcv + (size_t)c->rank * o->count * es;
    if (o->kind == K_BC && o->inplace && c->rank != o->root)
        *send_out = rcv;
}

static hcoll_status_t issue(rank_ctx_t *c, const soak_op_t *o, void *snd, void *rcv,
                            hcoll_request_t *req)
{
    hcoll_op_t op = (hcoll_op_t)o->op;
    const int premul = o->op == OP_PREMUL && (o->kind == K_AR || o->kind == K_RS);
    if (premul) {
        uint64_t sc = bits_of(o->dt, premul_scalar(o->dt, c->rank));
        hcoll_status_t st = hcoll_op_create_premul_sum(c->comm, &sc, o->dt,
                                                       HCOLL_SCALAR_HOST_IMMEDIATE, &op);
        if (st != HCOLL_SUCCESS)
            return st;
    }
    hcoll_status_t st;
    switch (o->kind) {
    case K_AR:
        st = req ? hcoll_allreduce_async(c->comm, snd, rcv, o->count, o->dt, op, NULL, req)
                 : hcoll_allreduce(c->comm, snd, rcv, o->count, o->dt, op, NULL);
        break;
    case K_RS:
        st = req ? hcoll_reduce_scatter_async(c->comm, snd, rcv, o->count, o->dt, op, NULL, req)
                 : hcoll_reduce_scatter(c->comm, snd, rcv, o->count, o->dt, op, NULL);
        break;
    case K_AG:
        st = req ? hcoll_allgather_async(c->comm, snd, rcv, o->count, o->dt, NULL, req)
                 : hcoll_allgather(c->comm, snd, rcv, o->count, o->dt, NULL);
        break;
    case K_BC:
        st = req ? hcoll_broadcast_async(c->comm, snd, rcv, o->count, o->dt, o->root, NULL, req)
                 : hcoll_broadcast(c->comm, snd, rcv, o->count, o->dt, o->root, NULL);
        break;
    default:
        st = req ? hcoll_barrier_async(c->comm, req) : hcoll_barrier(c->comm);
        break;
    }
    /* Issued requests keep their copy of the scalar. */
    if (premul) {
        hcoll_status_t st2 = hcoll_op_destroy(c->comm, op);
        if (st == HCOLL_SUCCESS)
            st = st2;
    }
    return st;
}

/* Every output element against the reference; prints the first few wrong. */
static int verify(rank_ctx_t *c, const soak_op_t *o, int s)
{
    if (o->kind == K_BAR)
        return 0;
    const size_t es = hcoll_dtype_size(o->dt), n = op_elems(c, o);
    const unsigned char *out = c->recv[s];
    size_t nout = n, base = 0;
    if (o->kind == K_RS) {
        nout = o->count;
        base = (size_t)c->rank * o->count;
        if (o->inplace)
            out += base * es;
    }
    size_t wrong = 0;
    for (size_t k = 0; k < nout; k++) {
        uint64_t want;
        if (o->kind == K_AG)
            want = in_bits(o, (int)(k / o->count), k % o->count);
        else if (o->kind == K_BC)
            want = in_bits(o, o->root, k);
        else if (is_float(o->dt))
            want = ref_float(o, c->nranks, base + k);
        else
            want = ref_int(o, c->nranks, base + k);
        uint64_t got = load_bits(out, k, es);
        if (got != want && wrong++ < 4)
            fprintf(stderr, "rank %d: element %zu: 0x%" PRIx64 ", want 0x%" PRIx64 "\n",
                    c->rank, k, got, want);
    }
    if (wrong) {
        char d[256];
        describe(c, o, d, sizeof d);
        fprintf(stderr, "rank %d: %zu of %zu elements wrong after %s (seed %" PRIu64 ")\n",
                c->rank, wrong, nout, d, c->w->seed);
        return 1;
    }
    return 0;
}

static void count_op(rank_ctx_t *c, const soak_op_t *o, int async)
{
    c->st->ops++;
    c->st->ops_by[o->kind]++;
    c->st->async_ops += async;
    c->st->bytes += (double)(op_elems(c, o) * hcoll_dtype_size(o->dt));
}

static int fail_status(rank_ctx_t *c, const soak_op_t *o, const char *what, hcoll_status_t st)
{
    char d[256];
    describe(c, o, d, sizeof d);
    fprintf(stderr, "rank %d: %s of %s: %s (%s), seed %" PRIu64 "\n", c->rank, what, d,
            hcoll_status_name(st), hcoll_comm_last_error(c->comm), c->w->seed);
    return 1;
}

static int run_blocking(rank_ctx_t *c, const soak_op_t *o)
{
    void *snd, *rcv;
    prepare(c, o, 0, &snd, &rcv);
    hcoll_status_t st = issue(c, o, snd, rcv, NULL);
    if (st != HCOLL_SUCCESS)
        return fail_status(c, o, "blocking call", st);
    count_op(c, o, 0);
    return verify(c, o, 0);
}

static void on_done(hcoll_request_t req, hcoll_status_t status, void *arg)
{
    soak_req_t *r = arg;
    r->status = (int)status;
    if (r->free_in_cb)
        hcoll_request_free(req);
    __atomic_add_fetch(&r->calls, 1, __ATOMIC_RELEASE);
}

/* Waits for one request of a batch: hcoll_wait, or (freed by its own
 * callback) for the callback's mark, within a deadline. */
static hcoll_status_t finish_req(soak_req_t *r)
{
    if (!r->free_in_cb) {
        hcoll_status_t st = hcoll_wait(r->req);
        hcoll_status_t st2 = hcoll_request_free(r->req);
        return st != HCOLL_SUCCESS ? st : st2;
    }
    double end = hct_now_ms() + 120000;
    while (!__atomic_load_n(&r->calls, __ATOMIC_ACQUIRE) && hct_now_ms() < end)
        usleep(50);
    return HCOLL_SUCCESS;
}

static int run_batch(rank_ctx_t *c, const soak_op_t *ops, int n)
{
    soak_req_t reqs[NSLOT];
    for (int j = 0; j < n; j++) {
        void *snd, *rcv;
        soak_req_t *r = &reqs[j];
        memset(r, 0, sizeof *r);
        r->free_in_cb = (int)((ops[j].salt >> 7) & 1);
        prepare(c, &ops[j], j, &snd, &rcv);
        hcoll_status_t st = issue(c, &ops[j], snd, rcv, &r->req);
        if (st != HCOLL_SUCCESS)
            return fail_status(c, &ops[j], "async call", st);
        st = hcoll_request_set_callback(r->req, on_done, r);
        if (st != HCOLL_SUCCESS)
            return fail_status(c, &ops[j], "set_callback", st);
    }
    int bad = 0;
    for (int j = 0; j < n && !bad; j++) {
        hcoll_status_t st = finish_req(&reqs[j]);
        int calls = __atomic_load_n(&reqs[j].calls, __ATOMIC_ACQUIRE);
        if (st != HCOLL_SUCCESS)
            bad = fail_status(c, &ops[j], "request", st);
        else if (calls != 1 || reqs[j].status != HCOLL_SUCCESS) {
            fprintf(stderr, "rank %d: request %d: callback ran %d time(s), status %s\n",
                    c->rank, j, calls, hcoll_status_name((hcoll_status_t)reqs[j].status));
            bad = 1;
        } else {
            count_op(c, &ops[j], 1);
            c->st->freed_in_cb += reqs[j].free_in_cb;
            bad = verify(c, &ops[j], j);
        }
    }
    return bad;
}

/* ------------------------------------------------------------------------ */
/* Resources and the run                                                      */
/* ------------------------------------------------------------------------ */

/* Samples this rank; after the warm-up, any growth fails. */
static int sample(rank_ctx_t *c, double now_s, int warm_steps_done)
{
    rank_stats_t *st = c->st;
    hct_proc_t p = hct_proc_sample();
    st->last = p;
    if (st->ops == 0 || st->first.rss_kb == 0)
        st->first = p;
    if (now_s < c->w->warm_s || !warm_steps_done)
        return 0;
    if (!st->have_base) {
        st->base = st->max = p;
        st->base_at_s = now_s;
        st->have_base = 1;
        return 0;
    }
    if (p.rss_kb > st->max.rss_kb)
        st->max.rss_kb = p.rss_kb;
    /* malloc's bytes in use too: a leaked buffer that is never written
     * stays out of the RSS. */
    if (p.rss_kb > st->base.rss_kb * (1 + RSS_SLACK) ||
        p.heap_bytes > st->base.heap_bytes * (1 + RSS_SLACK)) {
        fprintf(stderr, "rank %d: RSS %ld kB, %.1f %% above %ld kB after the warm-up (anon "
                "%ld -> %ld kB, shmem %ld -> %ld kB, malloc in use %ld -> %ld kB, held %ld -> %ld kB)\n",
                c->rank, p.rss_kb, 100.0 * (p.rss_kb - st->base.rss_kb) / st->base.rss_kb,
                st->base.rss_kb, st->base.anon_kb, p.anon_kb, st->base.shmem_kb, p.shmem_kb,
                st->base.heap_bytes >> 10, p.heap_bytes >> 10, st->base.arena_bytes >> 10,
                p.arena_bytes >> 10);
        return 1;
    }
    if (p.fds > st->base.fds || p.threads > st->base.threads)
        p = hct_proc_settle(st->base.fds, st->base.threads);
    if (p.fds > st->base.fds || p.threads > st->base.threads) {
        fprintf(stderr, "rank %d: fds %d -> %d, threads %d -> %d since the warm-up\n", c->rank,
                st->base.fds, p.fds, st->base.threads, p.threads);
        return 1;
    }
    return 0;
}

/* One step: a blocking call or a batch of requests. */
static int step(rank_ctx_t *c, long n)
{
    soak_op_t ops[NSLOT];
    /* Warm-up: every collective at the largest size, blocking, out of
     * place and in place, then two at once, so that every buffer the
     * library keeps exists, and has been written all over, before the
     * baseline. The reduce-scatters are PREMUL_SUM (draw_op), a scaled
     * op: the library's reduce-scatter/all-gather vector (rsag_buf,
     * coll_rsag.c) is malloc'ed at the whole vector of the largest call
     * so far and kept until destroy, but an unscaled reduce-scatter or an
     * all-gather writes only the ring's shard of it (1/L: the intra stage
     * reads and writes the caller's blocks in place); only a scaled one
     * (float AVG, PREMUL_SUM) copies the whole vector through it. A warm-up
     * whose random ops happened to be unscaled left half of that 64 MiB
     * untouched, and the first large scaled reduce-scatter afterwards put
     * it in the RSS, malloc's bytes in use unchanged (+6 %, seed
     * 22495067760 at operation 495). That memory is bounded by the largest
     * call, so the warm-up reaches it instead of the bound allowing it. */
    if (n < 2 * K_BAR) {
        draw_op(c, (int)n / 2, &ops[0]);
        ops[0].inplace = (int)(n & 1);
        return run_blocking(c, &ops[0]);
    }
    if (n < 2 * K_BAR + 2) {
        draw_op(c, (int)(n - 2 * K_BAR) * 2, &ops[0]);
        draw_op(c, (int)(n - 2 * K_BAR) * 2 + 1, &ops[1]);
        return run_batch(c, ops, 2);
    }
    if (rnd(&c->rng) & 1) {
        draw_op(c, -1, &ops[0]);
        return run_blocking(c, &ops[0]);
    }
    int k = 1 + (int)(rnd(&c->rng) % NSLOT);
    for (int j = 0; j < k; j++)
        draw_op(c, -1, &ops[j]);
    return run_batch(c, ops, k);
}

static int stop_agreed(rank_ctx_t *c, int mine, int *stop_out)
{
    int32_t v = mine;
    hcoll_status_t st = hcoll_allreduce(c->comm, &v, &v, 1, HCOLL_INT32, HCOLL_MAX, NULL);
    if (st != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: stop agreement: %s (%s)\n", c->rank, hcoll_status_name(st),
                hcoll_comm_last_error(c->comm));
        return 1;
    }
    *stop_out = v;
    return 0;
}

static int soak_loop(rank_ctx_t *c)
{
    double next_print = 60;
    for (long n = 0;; n++) {
        if (c->rank == c->w->fail_rank && n == c->w->fail_step) {
            fprintf(stderr, "rank %d: failing on purpose at step %ld (-x)\n", c->rank, n);
            return 1;
        }
        if (step(c, n))
            return 1;
        if (n % CHECK_EVERY != CHECK_EVERY - 1)
            continue;
        double now = (hct_now_ms() - c->t0) / 1e3;
        /* Not before one sample has been compared with the baseline, however
         * long the warm-up took on a loaded host. */
        int stop = 0, mine = now >= c->w->seconds && c->st->have_base;
        if (stop_agreed(c, mine, &stop) || sample(c, now, n >= WARM_STEPS))
            return 1;
        if (c->rank == 0 && now >= next_print) {
            printf("soak: %4.0f s  %ld ops  %.1f GiB  RSS %ld kB\n", now, c->st->ops,
                   c->st->bytes / (1 << 30), c->st->last.rss_kb);
            fflush(stdout);
            next_print += 60;
        }
        if (stop)
            return 0;
    }
}

static int rank_main(int rank, int nranks, void *arg)
{
    soak_world_t *w = arg;
    rank_ctx_t c = { .rank = rank, .nranks = nranks, .w = w, .st = &w->st[rank],
                     .rng = w->seed };
    for (int s = 0; s < NSLOT; s++) {
        c.send[s] = malloc(w->max_bytes);
        c.recv[s] = malloc(w->max_bytes);
        HCT_REQUIRE(c.send[s] && c.recv[s], "out of memory");
        /* Touched now, so that the buffers are in the RSS from the start
         * (not zeros: the compiler would turn malloc + memset 0 into a
         * calloc, which leaves fresh pages untouched). */
        memset(c.send[s], 0x5a, w->max_bytes);
        memset(c.recv[s], 0x5a, w->max_bytes);
    }
    hcoll_unique_id_t id;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 60000;
    /* A rank waiting for a peer that will never come fails within two
     * minutes rather than the default half hour (the largest call takes
     * seconds even on a loaded host). */
    cfg.op_timeout_ms = 120000;
    HCT_REQUIRE(hct_share_unique_id(&w->slot, rank, 60000, &id) == 0, "no unique id");
    HCT_OK(NULL, hcoll_comm_init(&c.comm, nranks, rank, &id, &cfg));
    c.t0 = hct_now_ms();
    int bad = soak_loop(&c);
    hcoll_status_t st = hcoll_comm_destroy(c.comm);
    HCT_REQUIRE(st == HCOLL_SUCCESS, "destroy: %s", hcoll_status_name(st));
    for (int s = 0; s < NSLOT; s++)
        free(c.send[s]), free(c.recv[s]);
    return bad;
}

static double pct(long a, long b)
{
    return b > 0 ? 100.0 * (double)(a - b) / (double)b : 0;
}

static int report(const soak_world_t *w, int nranks, const hct_result_t *res, double secs)
{
    const rank_stats_t *s0 = &w->st[0];
    printf("soak: %.1f min, seed %" PRIu64 ": %ld operations (%ld async, %ld freed in their "
           "callback), %.2f GiB of user data per rank\n",
           secs / 60, w->seed, s0->ops, s0->async_ops, s0->freed_in_cb, s0->bytes / (1 << 30));
    printf("soak: by collective:");
    for (int k = 0; k < K_COUNT; k++)
        printf(" %s %ld", kind_names[k], s0->ops_by[k]);
    printf("\n");
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        const rank_stats_t *s = &w->st[r];
        int ok = res[r].exited && res[r].code == 0;
        printf("soak: rank %d %s after %.1f s: ops %ld, RSS %ld kB at %.0f s (after warm-up) -> %ld kB at "
               "the end (%+.2f %%, max %+.2f %%), heap %+.2f %%, fds %d -> %d, threads %d -> "
               "%d\n",
               r, ok ? "ok" : res[r].killed ? "KILLED at the deadline" : "FAILED",
               res[r].seconds, s->ops,
               s->base.rss_kb, s->base_at_s, s->last.rss_kb,
               pct(s->last.rss_kb, s->base.rss_kb), pct(s->max.rss_kb, s->base.rss_kb),
               pct(s->last.heap_bytes, s->base.heap_bytes), s->base.fds, s->last.fds,
               s->base.threads, s->last.threads);
        bad |= !ok || !s->have_base || s->ops != s0->ops;
    }
    printf("soak: %s\n", bad ? "FAIL" : "PASS");
    return bad;
}

int main(int argc, char **argv)
{
    double minutes = 1;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    int nodes = 2, per_node = 2, max_mib = 64, o;
    int fail_rank = -1;
    long fail_step = 0;
    while ((o = getopt(argc, argv, "m:s:M:n:l:x:")) != -1) {
        switch (o) {
        case 'm': minutes = atof(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 0); break;
        case 'M': max_mib = atoi(optarg); break;
        case 'n': nodes = atoi(optarg); break;
        case 'l': per_node = atoi(optarg); break;
        case 'x': sscanf(optarg, "%d:%ld", &fail_rank, &fail_step); break;
        default:
            fprintf(stderr, "usage: %s [-m MINUTES] [-s SEED] [-M MAX_MIB] [-n NODES] "
                            "[-l RANKS_PER_NODE] [-x RANK:STEP]\n", argv[0]);
            return 2;
        }
    }
    const int nranks = nodes * per_node;
    if (minutes <= 0 || max_mib < 1 || nodes < 1 || per_node < 1 || nranks > MAX_RANKS) {
        fprintf(stderr, "soak: bad arguments (minutes > 0, 1 <= ranks <= %d)\n", MAX_RANKS);
        return 2;
    }
    setenv("HCOLL_SOCKET_IFNAME", "=lo", 1);
    soak_world_t *w = hct_shared_alloc(sizeof *w);
    if (!w)
        return 1;
    w->seed = seed;
    w->seconds = minutes * 60;
    w->warm_s = w->seconds * 0.1;
    w->max_bytes = (size_t)max_mib << 20;
    w->fail_rank = fail_rank;
    w->fail_step = fail_step;
    printf("soak: %d x %d ranks, %.1f min, sizes 0..%d MiB, seed %" PRIu64
           " (rerun: -s %" PRIu64 ")\n", nodes, per_node, minutes, max_mib, seed, seed);
    fflush(stdout);
    /* The last resort only: a rank waiting for a peer fails after its
     * op_timeout_ms (2 min) by itself. On a loaded host the warm-up's
     * twelve 64 MiB calls alone took over 3 minutes (a 1-minute run was
     * killed in them, making progress), hence 10 minutes' slack. */
    hct_opts_t opts = { .nranks = nranks, .ranks_per_node = per_node,
                        .timeout_ms = (int)(w->seconds * 1000) + 600000 };
    hct_result_t res[MAX_RANKS];
    double t0 = hct_now_ms();
    hct_run(&opts, rank_main, w, res);
    int bad = report(w, nranks, res, (hct_now_ms() - t0) / 1e3);
    hct_shared_free(w, sizeof *w);
    return bad ? 1 : 0;
}
