/*
 * Reduce-scatter and all-gather on host buffers, on the executor's thread
 * (coll_run.c has checked that every rank called the same collective with
 * the same count, dtype and op, and dispatches here).
 *
 * Three-stage plan, N nodes x L local ranks; rank g = (node n, local rank
 * l); block g of the nranks x B vector belongs to rank g. The rail ring of
 * local rank l has the ranks (m, l), one per node, at position m.
 *
 *   V: the vector permuted so that local rank l's N blocks are contiguous,
 *      in its rail ring's order (shard l of the intra stage):
 *
 *        | shard 0                       | shard 1                       | ...
 *        | blk(0,0) blk(1,0) .. blk(N-1,0) | blk(0,1) blk(1,1) .. blk(N-1,1) | ...
 *        blk(m,l) = block of the rank at node m, local rank l (any rank order)
 *
 *   reduce-scatter (rank (n, l)):
 *     permute   V = sendbuf's blocks in V's order (times the scalar, for
 *               AVG of floats and PREMUL_SUM: the first stage reads them)
 *     intra RS  shard l of V = the node's sum of shard l   (shared memory)
 *     ring RS   shard l's N blocks reduce-scattered along rail l
 *               (hc_ring_rs_start): position n ends with blk(n, l), mine
 *     copy      recvbuf = that block
 *
 *   all-gather: the mirror
 *     copy      blk(n, l) of V = sendbuf
 *     ring AG   shard l's N blocks all-gathered along rail l (hc_ring_ag_start)
 *     intra AG  every local rank gets every shard          (shared memory)
 *     permute   recvbuf's blocks = V's, back in rank order
 *
 * Each NIC carries (N-1)/N of its shard, (N-1)/N x S/L bytes for S bytes in
 * all. Vectors are cut into pieces (piece k = elements [k*P, k*P+P) of
 * every block, PIECE_CHUNKS ring chunks per block; V holds the pieces one
 * after the other, each laid out as above) and the ring of piece k runs on
 * the ring thread while the executor does the other stages of its
 * neighbours, as the all-reduce does:
 *
 *   executor     RS:  perm+RS(p0) perm+RS(p1) copy(p0) perm+RS(p2) copy(p1) ...
 *                AG:  copy(p0) copy(p1) AG+perm(p0) copy(p2) AG+perm(p1) ...
 *   ring thread              ring(p0)        ring(p1)         ring(p2) ...
 *
 * The other plans are the same code with a stage left out:
 *   ring, flat  L = 1, N = nranks, positions = ranks (the ring over all
 *               ranks, in rank order): permute, ring, copy
 *   intra       N = 1: permute (local rank order, which on one node is rank
 *               order, but the map does not assume it), intra stage, copy
 *   single      a copy (times the scalar)
 * and one piece (the ring, or the shared memory steps, pipeline within).
 * Where V's order is rank order and there is one piece (those plans, and a
 * three-stage plan whose ranks are interleaved so), the copies into or out
 * of V are skipped: reduce-scatter's first stage reads sendbuf, all-gather
 * works in recvbuf itself. Otherwise, with an intra stage whose backend
 * takes blocks (shm), the permutes are done by it: reduce_scatter_blocks
 * reads piece k of sendbuf's blocks in V's order where they lie, and
 * all_gather_blocks writes the shards to recvbuf's blocks, so V only holds
 * the shard of the ring (on 2 cores for 6 ranks, the copy of S saved per
 * call is what kept the NICs below the TCP goodput). The scaled
 * reduce-scatter (float AVG, PREMUL_SUM) still permutes through V.
 *
 * AVG: floats are pre-multiplied by 1/nranks in the permuting copy and
 * summed; integers are summed and divided once, by nranks, truncating: by
 * the ring on its last step (hc_ring_rs_start's avg_divisor), or, without a
 * ring, in the final copy. Each element is reduced in one fixed order (the
 * intra stage's, then the ring's chain, which for the rotated phase starts
 * one position later than the all-reduce's), so the result does not depend
 * on timing, but it is not the order of the all-reduce: a float block may
 * differ in the last bits from that block of an all-reduce of the same
 * inputs.
 */
#include "core/coll_priv.h"
#include "base/clock.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/ringdrv.h"
#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"

/* One call's shape: who owns which part of V, which stages run. */
typedef struct rsag {
    hc_coll_t *co;
    const hc_coll_args_t *a;
    int rs;          /* reduce-scatter (else all-gather) */
    int N, L;        /* ring positions, local ranks (1 where a stage is absent) */
    int n, l;        /* this rank's position and local rank */
    const int *map;  /* [L*N]: map[l*N + m] = the rank whose block is V's (l, m) */
    int use_intra, use_ring, threaded;
    /* V's order is rank order (one piece, map the identity: the ring over
     * all ranks, one node): reduce-scatter's first stage reads sendbuf
     * itself, all-gather works in recvbuf itself; a copy of S saved. */
    int direct;
    size_t es;       /* element size */
    size_t B;        /* elements per block (recvcount / sendcount) */
    size_t P;        /* elements per block in one piece */
    unsigned char *V;
    hcoll_stage_times_t *tm;
} rsag_t;

/* The permuted vector's own registration, if it has one. */
static void rsag_unpin(hc_coll_t *co)
{
    hc_ring_mem_unpin(co->ring, co->rsag_pin);
    co->rsag_pin = NULL;
}

void hc_coll_rsag_free(hc_coll_t *co)
{
    rsag_unpin(co);
    free(co->rsag_map);
    free(co->rsag_buf);
    free(co->rsag_blk);
    co->rsag_blk = NULL;
    co->rsag_map = NULL;
    co->rsag_buf = NULL;
    co->rsag_cap = 0;
}

/* The block map of the communicator's plan, made once. */
static hcoll_status_t rsag_map(hc_coll_t *co, int N, int L)
{
    struct hcoll_comm *c = co->comm;
    if (co->rsag_map)
        return HCOLL_SUCCESS;
    int *map = calloc((size_t)N * (size_t)L, sizeof *map);
    free(co->rsag_blk);
    co->rsag_blk = calloc((size_t)N * (size_t)L, sizeof *co->rsag_blk);
    if (!map || !co->rsag_blk) {
        free(map);
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the reduce-scatter block map");
    }
    for (int l = 0; l < L; l++)
        for (int m = 0; m < N; m++)
            switch (co->plan) {
            case HC_PLAN_3STAGE: map[l * N + m] = hc_comm_rank_at(c, m, l); break;
            case HC_PLAN_INTRA: map[l * N + m] = hc_comm_rank_at(c, c->node, l); break;
            default: map[l * N + m] = m; break; /* ring positions are ranks */
            }
    co->rsag_map = map;
    return HCOLL_SUCCESS;
}

/* The permuted vector: kept between calls, grown when a call needs more.
 * It is hcoll's own memory, so where the ring registers its buffers
 * (verbs) it is registered once for its life (hc_ring_mem_pin), not per
 * ring job: no buffer of the caller's can be freed under a kept
 * registration. That locks the vector (S bytes, the largest call's) for
 * as long as the communicator keeps it, where per-job registrations
 * locked S/L at a time; a refusal (ulimit -l) only leaves it unregistered,
 * and its jobs register as before (their refusal is then a verdict). */
static hcoll_status_t rsag_scratch(hc_coll_t *co, size_t bytes)
{
    struct hcoll_comm *c = co->comm;
    if (bytes <= co->rsag_cap)
        return HCOLL_SUCCESS;
    rsag_unpin(co);
    free(co->rsag_buf);
    co->rsag_cap = 0;
    co->rsag_buf = malloc(bytes);
    if (!co->rsag_buf)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for a %zu-byte reduce-scatter/all-gather buffer", bytes);
    co->rsag_cap = bytes;
    if (co->ring && hc_ring_registers(co->ring, bytes, HCOLL_UINT8, -1) &&
        hc_ring_mem_pin(co->ring, co->rsag_buf, bytes, &co->rsag_pin) != HCOLL_SUCCESS) {
        co->rsag_pin = NULL;
        HC_WARN(HC_COLL, c->rank,
                "keeping the %zu-byte reduce-scatter/all-gather vector registered failed "
                "(above); nothing fails for it: its ring jobs run in the ring's stage or "
                "register it each call",
                bytes);
    }
    return HCOLL_SUCCESS;
}

static hcoll_status_t rsag_setup(rsag_t *x, hc_coll_t *co, const hc_coll_args_t *a,
                                 hcoll_stage_times_t *tm)
{
    struct hcoll_comm *c = co->comm;
    memset(x, 0, sizeof *x);
    x->co = co;
    x->a = a;
    x->tm = tm;
    x->rs = a->kind == HC_COLL_REDUCE_SCATTER;
    x->es = hcoll_dtype_size(a->dtype);
    x->B = a->count;
    x->P = a->count;
    x->N = x->L = 1;
    switch (co->plan) {
    case HC_PLAN_SINGLE:
        break;
    case HC_PLAN_INTRA:
        x->L = c->local_size;
        x->l = c->local_rank;
        x->use_intra = 1;
        break;
    case HC_PLAN_RING:
    case HC_PLAN_FLAT:
        x->N = c->nranks;
        x->n = c->rank;
        x->use_ring = 1;
        break;
    case HC_PLAN_3STAGE:
        x->N = c->nnodes;
        x->L = c->local_size;
        x->n = c->node;
        x->l = c->local_rank;
        x->use_intra = x->use_ring = x->threaded = 1;
        /* PIECE_CHUNKS ring chunks per block and piece. */
        x->P = (size_t)c->params.chunk_bytes * PIECE_CHUNKS / x->es;
        if (x->P == 0)
            x->P = 1;
        break;
    }
    hcoll_status_t st = rsag_map(co, x->N, x->L);
    if (st == HCOLL_SUCCESS)
        st = rsag_scratch(co, a->count * x->es * (size_t)c->nranks);
    x->map = co->rsag_map;
    x->V = co->rsag_buf;
    if (st != HCOLL_SUCCESS || x->P < x->B || !(x->use_intra || x->use_ring))
        return st;
    x->direct = x->rs ? !a->ro.scaled : 1;
    for (int j = 0; j < x->N * x->L; j++)
        x->direct &= x->map[j] == j;
    if (x->direct && !x->rs)
        x->V = a->recvbuf;
    return st;
}

/* Piece k: its first element within a block, its length, its V. */
static size_t piece_len(const rsag_t *x, size_t k)
{
    size_t k0 = k * x->P;
    return x->B - k0 < x->P ? x->B - k0 : x->P;
}

static unsigned char *piece_v(const rsag_t *x, size_t k)
{
    return x->V + k * x->P * (size_t)x->N * (size_t)x->L * x->es;
}

/* The ring stage of piece k: on shard l of its V, N blocks of pk. */
static hc_ringdrv_op_t ring_job(const rsag_t *x, size_t k)
{
    const size_t pk = piece_len(x, k);
    unsigned char *shard = piece_v(x, k) + (size_t)x->l * (size_t)x->N * pk * x->es;
    /* Direct reduce-scatter without an intra stage (L = 1: the shard is
     * the whole piece): the ring reads sendbuf; after an intra stage it
     * works on that stage's result in V. */
    const void *src = x->direct && x->rs && !x->use_intra ? x->a->sendbuf : shard;
    const hc_ringdrv_op_t job = { .src = src, .dst = shard, .count = (size_t)x->N * pk,
                                  .dtype = x->a->dtype, .op = x->a->op,
                                  .avg_div = x->co->comm->nranks,
                                  .phase = x->rs ? HC_RING_PHASE_RS : HC_RING_PHASE_AG,
                                  .seq = (uint32_t)x->co->opseq };
    return job;
}

/* The ring stage on this thread (one piece; the ring thread is idle
 * between operations, as for the all-reduce's latency path). */
static hcoll_status_t ring_here(const rsag_t *x, size_t k)
{
    struct hcoll_comm *c = x->co->comm;
    const hc_ringdrv_op_t job = ring_job(x, k);
    const hc_ringdrv_env_t env = { &c->aborted, &c->err, c->rank,
                                   x->rs ? "the reduce-scatter" : "the all-gather",
                                   x->co->intra, x->co->dissem };
    double t = hc_now_us();
    hcoll_status_t st = hc_ringdrv_run(x->co->ring, &job, &env);
    x->tm->inter_us += hc_now_us() - t;
    return st;
}

/* ---- reduce-scatter ---------------------------------------------------- */

/* Piece k of every block of sendbuf into V's order (scaled), then the
 * intra-node reduce-scatter of it. */
static hcoll_status_t rs_first(const rsag_t *x, size_t k)
{
    const hc_coll_args_t *a = x->a;
    const size_t pk = piece_len(x, k), k0 = k * x->P, nb = (size_t)x->N * (size_t)x->L;
    unsigned char *v = piece_v(x, k);
    double t = hc_now_us();
    const void *in = x->direct ? a->sendbuf : v;
    hc_intra_t *intra = x->co->intra;
    if (!x->direct && !a->ro.scaled && x->use_intra && intra->ops->reduce_scatter_blocks) {
        /* The intra stage reads sendbuf's blocks where they are: no copy
         * of the piece into V's order first. */
        for (size_t j = 0; j < nb; j++)
            x->co->rsag_blk[j] = (unsigned char *)(uintptr_t)a->sendbuf +
                                 ((size_t)x->map[j] * x->B + k0) * x->es;
        hcoll_status_t st = intra->ops->reduce_scatter_blocks(
            intra, (const void *const *)x->co->rsag_blk, pk, v, nb * pk, a->dtype, a->op, NULL);
        x->tm->intra_rs_us += hc_now_us() - t;
        return st;
    }
    for (size_t j = 0; j < nb && !x->direct; j++) {
        const unsigned char *src =
            (const unsigned char *)a->sendbuf + ((size_t)x->map[j] * x->B + k0) * x->es;
        if (a->ro.scaled)
            hc_redop_scale_host(&a->ro, v + j * pk * x->es, src, pk, a->dtype);
        else
            memcpy(v + j * pk * x->es, src, pk * x->es);
    }
    hcoll_status_t st = HCOLL_SUCCESS;
    if (x->use_intra)
        st = intra->ops->reduce_scatter(intra, in, v, nb * pk, a->dtype, a->op, NULL);
    x->tm->intra_rs_us += hc_now_us() - t;
    return st;
}

/* Piece k of my block, from V to recvbuf (integer AVG divided here when no
 * ring did it). */
static void rs_last(const rsag_t *x, size_t k)
{
    const hc_coll_args_t *a = x->a;
    const size_t pk = piece_len(x, k);
    unsigned char *dst = (unsigned char *)a->recvbuf + k * x->P * x->es;
    double t = hc_now_us();
    memcpy(dst, piece_v(x, k) + ((size_t)x->l * (size_t)x->N + (size_t)x->n) * pk * x->es,
           pk * x->es);
    if (!x->use_ring)
        hc_reduce_avg_finish(dst, pk, a->dtype, a->op, x->co->comm->nranks);
    x->tm->intra_ag_us += hc_now_us() - t;
}

/* ---- all-gather -------------------------------------------------------- */

/* Piece k of sendbuf into my block of V. */
static void ag_first(const rsag_t *x, size_t k)
{
    const size_t pk = piece_len(x, k);
    double t = hc_now_us();
    unsigned char *mine = piece_v(x, k) + ((size_t)x->l * (size_t)x->N + (size_t)x->n) * pk * x->es;
    const unsigned char *src = (const unsigned char *)x->a->sendbuf + k * x->P * x->es;
    if (mine != src) /* direct and in place: already there */
        memcpy(mine, src, pk * x->es);
    x->tm->intra_rs_us += hc_now_us() - t;
}

/* The intra-node all-gather of piece k, then its blocks back to recvbuf in
 * rank order. */
static hcoll_status_t ag_last(const rsag_t *x, size_t k)
{
    const hc_coll_args_t *a = x->a;
    const size_t pk = piece_len(x, k), k0 = k * x->P, nb = (size_t)x->N * (size_t)x->L;
    unsigned char *v = piece_v(x, k);
    double t = hc_now_us();
    hcoll_status_t st = HCOLL_SUCCESS;
    hc_intra_t *intra = x->co->intra;
    if (!x->direct && x->use_intra && intra->ops->all_gather_blocks) {
        /* The intra stage writes recvbuf's blocks where they belong: no
         * copy out of V's order afterwards. */
        for (size_t j = 0; j < nb; j++)
            x->co->rsag_blk[j] =
                (unsigned char *)a->recvbuf + ((size_t)x->map[j] * x->B + k0) * x->es;
        st = intra->ops->all_gather_blocks(intra, v, x->co->rsag_blk, pk, nb * pk, a->dtype,
                                           NULL);
        x->tm->intra_ag_us += hc_now_us() - t;
        return st;
    }
    if (x->use_intra)
        st = intra->ops->all_gather(intra, v, nb * pk, a->dtype, NULL);
    if (st == HCOLL_SUCCESS && !x->direct)
        for (size_t j = 0; j < nb; j++)
            memcpy((unsigned char *)a->recvbuf + ((size_t)x->map[j] * x->B + k0) * x->es,
                   v + j * pk * x->es, pk * x->es);
    x->tm->intra_ag_us += hc_now_us() - t;
    return st;
}

/* ---- the pipeline ------------------------------------------------------ */

/* Stage 1 of piece k (before its ring). */
static hcoll_status_t stage_first(const rsag_t *x, size_t k)
{
    if (x->rs)
        return rs_first(x, k);
    ag_first(x, k);
    return HCOLL_SUCCESS;
}

/* The stage after the ring of piece k. */
static hcoll_status_t stage_last(const rsag_t *x, size_t k)
{
    if (x->rs) {
        rs_last(x, k);
        return HCOLL_SUCCESS;
    }
    return ag_last(x, k);
}

/* Pieces through the ring thread: ring(k) overlaps stage_last(k-1) and
 * stage_first(k+1). Every job posted is waited for before returning, so
 * the buffers go back to the caller only when the ring thread is done
 * with them. */
static hcoll_status_t run_pipelined(const rsag_t *x, size_t npieces, hc_coll_void_t *v)
{
    hc_ringthr_t *rt = x->co->ringthr;
    hcoll_status_t st = HCOLL_SUCCESS;
    uint64_t pending = 0;
    int have_pending = 0;
    for (size_t k = 0; k <= npieces && st == HCOLL_SUCCESS; k++) {
        uint64_t id = 0;
        int posted = 0;
        if (k < npieces) {
            st = stage_first(x, k);
            if (st != HCOLL_SUCCESS)
                break;
            const hc_ringdrv_op_t job = ring_job(x, k);
            id = hc_ringthr_post(rt, &job);
            posted = 1;
        }
        if (have_pending) {
            st = hc_coll_rail_wait(x->co, pending, &x->tm->inter_us, v);
            if (st == HCOLL_SUCCESS)
                st = stage_last(x, k - 1);
        }
        pending = id;
        have_pending = posted;
    }
    if (have_pending)
        hc_ringthr_wait(rt, pending, &x->tm->inter_us);
    return st;
}

/* Before the agreement (coll_pin.c): every piece's ring job. The
 * permuted vector is made here already (kept between calls, so the run
 * finds it again), and its failure is a verdict too. */
hcoll_status_t hc_coll_rsag_ring_jobs(hc_coll_t *co, const hc_coll_args_t *a, hc_coll_job_fn fn,
                                      void *arg)
{
    rsag_t x;
    hcoll_stage_times_t tm;
    if (a->count == 0)
        return HCOLL_SUCCESS;
    hcoll_status_t st = rsag_setup(&x, co, a, &tm);
    if (st != HCOLL_SUCCESS || !x.use_ring)
        return st;
    const size_t npieces = (x.B + x.P - 1) / x.P;
    for (size_t k = 0; k < npieces && st == HCOLL_SUCCESS; k++) {
        const hc_ringdrv_op_t job = ring_job(&x, k);
        st = fn(arg, job.src, job.dst, job.count, job.dtype, job.phase);
    }
    return st;
}

hcoll_status_t hc_coll_run_rsag(hc_coll_t *co, const hc_coll_args_t *a, hcoll_stage_times_t *tm)
{
    rsag_t x;
    if (a->count == 0)
        return HCOLL_SUCCESS;
    hcoll_status_t st = rsag_setup(&x, co, a, tm);
    if (st != HCOLL_SUCCESS)
        return st;
    const size_t npieces = (x.B + x.P - 1) / x.P;
    /* A void on this rail goes on to the end, the node told (coll_rail.c);
     * the all-gather's last stage is a node step, the reduce-scatter's
     * a copy. */
    hc_coll_void_t v = { HCOLL_SUCCESS };
    if (x.threaded && npieces > 1)
        return hc_coll_rail_end(co, &v, run_pipelined(&x, npieces, &v), !x.rs && x.use_intra);
    for (size_t k = 0; k < npieces && st == HCOLL_SUCCESS; k++) {
        st = stage_first(&x, k);
        if (st == HCOLL_SUCCESS && x.use_ring) {
            const uint64_t voided = hc_ring_voided(co->ring);
            st = hc_coll_rail_ran(co, ring_here(&x, k), voided, &v);
        }
        if (st == HCOLL_SUCCESS)
            st = stage_last(&x, k);
    }
    return hc_coll_rail_end(co, &v, st, !x.rs && x.use_intra);
}
