/*
 * Shared-memory intra-node backend (src/intra/shm.c) through its ops table.
 *
 * Ranks are forked with tests/common/ranks.h; the allgather that create
 * needs runs over hct_shared memory. References are computed in each rank
 * with hc_reduce in the fixed order (local rank 0 first), from inputs every
 * rank can generate for every other rank. Most inputs are small integers,
 * so every float reduction is exact; one case uses inexact floats so that
 * only the fixed order can give the same bits.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/ranks.h"
#include "base/reduce.h"
#include "intra/intra.h"
#include "intra/shm.h"

#define TSHM_MAXL 8
#define TEST_TIMEOUT_S 120

static const hcoll_dtype_t all_dtypes[] = {
    HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16, HCOLL_FLOAT64,
    HCOLL_INT8,    HCOLL_UINT8,   HCOLL_INT32,    HCOLL_INT64,
};
static const hcoll_op_t all_ops[] = { HCOLL_SUM, HCOLL_PROD, HCOLL_MAX, HCOLL_MIN, HCOLL_AVG };

/* Everything the ranks of one run share (mapped before the fork). */
typedef struct tshm {
    int L;
    size_t chunk;
    int timeout_ms;
    int op_timeout_ms;       /* 0: timeout_ms (as before the split) */
    int liveness_ms;         /* 0: heartbeats not checked */
    int die_after_allgather; /* local rank that SIGKILLs itself there, or -1 */
    int victim;              /* rank the parent kills mid-operation, or -1 */
    char name[64];
    hct_barrier_t ag_bar;
    unsigned char ag_buf[TSHM_MAXL * 64];
    hct_barrier_t bar;
    volatile int looping;
    volatile double kill_ms;
    volatile double err_ms[TSHM_MAXL];
    volatile int status[TSHM_MAXL];
    volatile uint64_t hash[TSHM_MAXL];
} tshm_t;

typedef struct tshm_ag {
    tshm_t *sh;
    int lrank;
} tshm_ag_t;

static int name_seq;

static tshm_t *tshm_new(int L)
{
    tshm_t *sh = hct_shared_alloc(sizeof *sh);
    ck_assert_ptr_nonnull(sh);
    sh->L = L;
    sh->chunk = 1 << 20;
    sh->timeout_ms = 10000;
    sh->die_after_allgather = -1;
    sh->victim = -1;
    snprintf(sh->name, sizeof sh->name, "/hcoll-test-%d-%d", (int)getpid(), ++name_seq);
    for (int i = 0; i < TSHM_MAXL; i++)
        sh->status[i] = -1;
    return sh;
}

/* 1 when /dev/shm holds the segment's name. */
static int shm_name_exists(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    struct stat st;
    return stat(path, &st) == 0;
}

/* Count /dev/shm entries this test process made (any run). */
static int shm_leftovers(void)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "hcoll-test-%d-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

static hcoll_status_t tshm_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    tshm_ag_t *a = ctx;
    tshm_t *sh = a->sh;
    if (len * (size_t)sh->L > sizeof sh->ag_buf)
        return HCOLL_ERR_INTERNAL;
    memcpy(sh->ag_buf + (size_t)a->lrank * len, mine, len);
    if (hct_barrier_wait(&sh->ag_bar, sh->L, sh->timeout_ms) != 0)
        return HCOLL_ERR_TIMEOUT;
    memcpy(all, sh->ag_buf, len * (size_t)sh->L);
    if (hct_barrier_wait(&sh->ag_bar, sh->L, sh->timeout_ms) != 0)
        return HCOLL_ERR_TIMEOUT;
    if (sh->die_after_allgather == a->lrank)
        raise(SIGKILL);
    return HCOLL_SUCCESS;
}

static hcoll_status_t tshm_create(tshm_t *sh, int lrank, tshm_ag_t *ag, hc_errbuf_t *eb,
                                  hc_intra_t **out)
{
    ag->sh = sh;
    ag->lrank = lrank;
    hc_errbuf_init(eb);
    hc_intra_params_t p = {
        .local_rank = lrank, .local_size = sh->L, .name = sh->name,
        .chunk_bytes = sh->chunk, .timeout_ms = sh->timeout_ms, .errbuf = eb,
        .op_timeout_ms = sh->op_timeout_ms, .liveness_ms = sh->liveness_ms,
        .rank = lrank, .allgather = tshm_allgather, .allgather_ctx = ag,
    };
    return hc_intra_shm_ops.create(&p, out);
}

#define TSHM_OK(eb, call)                                                       \
    do {                                                                        \
        hcoll_status_t st_ = (call);                                            \
        if (st_ != HCOLL_SUCCESS) {                                             \
            fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call, \
                    hcoll_status_name(st_), (eb)->msg);                         \
            return 1;                                                           \
        }                                                                       \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Inputs and references                                                      */
/* ------------------------------------------------------------------------ */

static uint32_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static void put(void *buf, hcoll_dtype_t dt, size_t i, double v)
{
    switch (dt) {
    case HCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case HCOLL_FLOAT16: ((uint16_t *)buf)[i] = hc_float_to_half((float)v); break;
    case HCOLL_BFLOAT16: ((uint16_t *)buf)[i] = hc_float_to_bf16((float)v); break;
    case HCOLL_FLOAT64: ((double *)buf)[i] = v; break;
    case HCOLL_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case HCOLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int)v; break;
    case HCOLL_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HCOLL_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
    }
}

/*
 * Rank q's input. Small integers: sums of up to 8 stay exact in every type;
 * products use {-1, 1, 2}, exact as powers of two. inexact: thirds, whose
 * float32 sums depend on the order.
 */
static void gen(void *buf, hcoll_dtype_t dt, hcoll_op_t op, int q, size_t count, int inexact)
{
    static const double prodv[] = { 1, 2, -1, 1, 2 };
    for (size_t i = 0; i < count; i++) {
        uint32_t h = mix(i * 131 + (uint64_t)q * 1000003u + (uint64_t)dt * 7 + 1);
        double v;
        if (inexact)
            v = (double)(h % 100000) / 3.0 - 10000.0;
        else if (op == HCOLL_PROD)
            v = prodv[h % 5];
        else
            v = (int)(h % 9) - 4;
        put(buf, dt, i, v);
    }
}

/* ref = in_0 op in_1 op ... op in_{L-1}, folded left as the backend does. */
static void reference(void *ref, void *tmp, hcoll_dtype_t dt, hcoll_op_t op, int L, size_t count,
                      int inexact)
{
    gen(ref, dt, op, 0, count, inexact);
    for (int q = 1; q < L; q++) {
        gen(tmp, dt, op, q, count, inexact);
        hc_reduce(ref, ref, tmp, count, dt, op);
    }
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* First differing element, or -1. */
static long first_diff(const void *a, const void *b, size_t off, size_t n, size_t es)
{
    const unsigned char *x = (const unsigned char *)a + off * es;
    const unsigned char *y = (const unsigned char *)b + off * es;
    for (size_t i = 0; i < n; i++)
        if (memcmp(x + i * es, y + i * es, es) != 0)
            return (long)(off + i);
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Shard split                                                                */
/* ------------------------------------------------------------------------ */

START_TEST(shard_split_covers_exactly)
{
    static const size_t counts[] = { 0, 1, 2, 3, 7, 8, 9, 13, 64, 1000003, (size_t)1 << 40 };
    for (int L = 1; L <= 17; L++) {
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            size_t count = counts[c], next = 0, minl = SIZE_MAX, maxl = 0;
            for (int i = 0; i < L; i++) {
                size_t off, len;
                hc_intra_shard(count, L, i, &off, &len);
                ck_assert_uint_eq(off, next);
                next = off + len;
                minl = len < minl ? len : minl;
                maxl = len > maxl ? len : maxl;
                if (i == 0)
                    ck_assert_uint_eq(len, (count + (size_t)L - 1) / (size_t)L);
            }
            ck_assert_uint_eq(next, count);
            ck_assert_uint_le(maxl - minl, 1);
        }
    }
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Correctness matrix                                                         */
/* ------------------------------------------------------------------------ */

/* RS then AG, and allreduce, for one case; checks against the reference
 * and chains the result into *h. */
static int check_case(hc_intra_t *ctx, hc_errbuf_t *eb, int lrank, int L, hcoll_dtype_t dt,
                      hcoll_op_t op, size_t count, int inplace, int inexact, uint64_t *h)
{
    const size_t es = hcoll_dtype_size(dt);
    const size_t bytes = count * es + 1;
    unsigned char *send = malloc(bytes), *recv = malloc(bytes), *ref = malloc(bytes),
                  *tmp = malloc(bytes);
    HCT_REQUIRE(send && recv && ref && tmp, "malloc");
    reference(ref, tmp, dt, op, L, count, inexact);
    size_t off, len;
    hc_intra_shard(count, L, lrank, &off, &len);
    int rc = 1;

    for (int variant = 0; variant < 2; variant++) {
        gen(send, dt, op, lrank, count, inexact);
        unsigned char *rb = recv;
        if (inplace) {
            rb = send;
        } else {
            memset(recv, 0xa5, bytes);
        }
        if (variant == 0) {
            hcoll_status_t st = hc_intra_shm_ops.reduce_scatter(ctx, send, rb, count, dt, op, NULL);
            if (st != HCOLL_SUCCESS) {
                fprintf(stderr, "reduce_scatter: %s (%s)\n", hcoll_status_name(st), eb->msg);
                goto out;
            }
            long d = first_diff(rb, ref, off, len, es);
            if (d >= 0) {
                fprintf(stderr, "L=%d local %d %s %s count %zu inplace %d: RS differs at %ld\n",
                        L, lrank, hcoll_dtype_name(dt), hcoll_op_name(op), count, inplace, d);
                goto out;
            }
            st = hc_intra_shm_ops.all_gather(ctx, rb, count, dt, NULL);
            if (st != HCOLL_SUCCESS) {
                fprintf(stderr, "all_gather: %s (%s)\n", hcoll_status_name(st), eb->msg);
                goto out;
            }
        } else {
            hcoll_status_t st = hc_intra_shm_ops.allreduce(ctx, send, rb, count, dt, op, NULL);
            if (st != HCOLL_SUCCESS) {
                fprintf(stderr, "allreduce: %s (%s)\n", hcoll_status_name(st), eb->msg);
                goto out;
            }
        }
        long d = first_diff(rb, ref, 0, count, es);
        if (d >= 0) {
            fprintf(stderr, "L=%d local %d %s %s count %zu inplace %d %s: differs at %ld\n", L,
                    lrank, hcoll_dtype_name(dt), hcoll_op_name(op), count, inplace,
                    variant ? "allreduce" : "RS+AG", d);
            goto out;
        }
        if (!inplace && recv[count * es] != 0xa5) {
            fprintf(stderr, "wrote past the end of recvbuf\n");
            goto out;
        }
        *h = fnv(*h, rb, count * es);
    }
    rc = 0;
out:
    free(send);
    free(recv);
    free(ref);
    free(tmp);
    return rc;
}

static int rank_matrix(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    const int L = sh->L;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    HCT_REQUIRE(!shm_name_exists(sh->name), "segment still named after create");

    /* A 4 KiB chunk makes even these counts run over several steps, so the
     * slots are reused within a call and across calls. */
    const size_t counts[] = { 0, 1, (size_t)L - 1, (size_t)L + 1, 7, 13, 101, 1009, 4099 };
    uint64_t h = 0xcbf29ce484222325ull;
    int n = 0;
    for (size_t d = 0; d < sizeof all_dtypes / sizeof all_dtypes[0]; d++)
        for (size_t o = 0; o < sizeof all_ops / sizeof all_ops[0]; o++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++, n++)
                if (check_case(ctx, &eb, lrank, L, all_dtypes[d], all_ops[o], counts[c],
                               n % 3 == 0, 0, &h))
                    return 1;
    /* Inexact floats: only the fixed order gives the reference's bits. */
    if (check_case(ctx, &eb, lrank, L, HCOLL_FLOAT32, HCOLL_SUM, 30011, 0, 1, &h) ||
        check_case(ctx, &eb, lrank, L, HCOLL_FLOAT64, HCOLL_SUM, 30011, 1, 1, &h) ||
        check_case(ctx, &eb, lrank, L, HCOLL_BFLOAT16, HCOLL_AVG, 30011, 0, 1, &h))
        return 1;
    TSHM_OK(&eb, hc_intra_shm_ops.barrier(ctx));
    sh->hash[lrank] = h;
    hc_intra_destroy(ctx);
    hc_errbuf_fini(&eb);
    return 0;
}

static void run_matrix(int L, size_t chunk, hct_rank_fn fn)
{
    tshm_t *sh = tshm_new(L);
    sh->chunk = chunk;
    hct_opts_t o = { .nranks = L, .timeout_ms = 100000 };
    hct_result_t res[TSHM_MAXL];
    int bad = hct_run(&o, fn, sh, res);
    ck_assert_msg(bad == 0, "L=%d: %d ranks failed", L, bad);
    for (int r = 1; r < L; r++)
        ck_assert_msg(sh->hash[r] == sh->hash[0], "L=%d: local rank %d's results differ from 0's",
                      L, r);
    ck_assert_int_eq(shm_leftovers(), 0);
    hct_shared_free(sh, sizeof *sh);
}

START_TEST(matrix_every_dtype_op_count)
{
    run_matrix(_i, 4096, rank_matrix);
}
END_TEST

/* 1 MiB + 3 elements with the default chunk, a few types per L. */
static int rank_large(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    uint64_t h = 0;
    const size_t count = ((size_t)1 << 20) + 3;
    if (check_case(ctx, &eb, lrank, sh->L, HCOLL_FLOAT32, HCOLL_SUM, count, 0, 0, &h) ||
        check_case(ctx, &eb, lrank, sh->L, HCOLL_INT8, HCOLL_MAX, count, 1, 0, &h) ||
        check_case(ctx, &eb, lrank, sh->L, HCOLL_FLOAT16, HCOLL_PROD, count, 0, 0, &h))
        return 1;
    sh->hash[lrank] = h;
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(large_1mib_plus_3)
{
    run_matrix(_i, 1 << 20, rank_large);
}
END_TEST

/* 64 MiB of float32 (one L only): exact inputs, checked element by element
 * against the integer sum, without materialising every rank's input. */
static int rank_64mib(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    const size_t count = ((size_t)64 << 20) / sizeof(float);
    float *send = malloc(count * sizeof *send), *recv = malloc(count * sizeof *recv);
    HCT_REQUIRE(send && recv, "malloc");
    for (size_t i = 0; i < count; i++)
        send[i] = (float)((int)((i * 7 + (size_t)lrank * 3) % 17) - 8);
    TSHM_OK(&eb, hc_intra_shm_ops.allreduce(ctx, send, recv, count, HCOLL_FLOAT32, HCOLL_SUM,
                                            NULL));
    for (size_t i = 0; i < count; i++) {
        int want = 0;
        for (int q = 0; q < sh->L; q++)
            want += (int)((i * 7 + (size_t)q * 3) % 17) - 8;
        HCT_REQUIRE(recv[i] == (float)want, "element %zu: %g, want %d", i, recv[i], want);
    }
    sh->hash[lrank] = fnv(0, recv, count * sizeof *recv);
    free(send);
    free(recv);
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(large_64mib_l4)
{
    run_matrix(4, 1 << 20, rank_64mib);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Call patterns                                                              */
/* ------------------------------------------------------------------------ */

/* Many back-to-back small calls of varying size, and barriers between. */
static int rank_small_calls(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    int32_t send[8], recv[8];
    for (int it = 0; it < 3000; it++) {
        size_t count = (size_t)(it % 8) + 1;
        for (size_t i = 0; i < count; i++)
            send[i] = it + lrank * 10 + (int)i;
        TSHM_OK(&eb, hc_intra_shm_ops.allreduce(ctx, send, recv, count, HCOLL_INT32, HCOLL_SUM,
                                                NULL));
        for (size_t i = 0; i < count; i++) {
            int32_t want = sh->L * (it + (int32_t)i) + 10 * (sh->L * (sh->L - 1) / 2);
            HCT_REQUIRE(recv[i] == want, "call %d element %zu: %d, want %d", it, i, recv[i], want);
        }
        if (it % 500 == 0)
            TSHM_OK(&eb, hc_intra_shm_ops.barrier(ctx));
    }
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(many_small_calls)
{
    run_matrix(4, 1 << 20, rank_small_calls);
}
END_TEST

/* The executor's way: the vector cut into pieces, RS and AG per piece, the
 * shard split applied within each piece. */
static int rank_pieces(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    const size_t count = 100003, piece = 9973;
    float *send = malloc(count * 4), *recv = malloc(count * 4), *ref = malloc(count * 4),
          *tmp = malloc(count * 4);
    HCT_REQUIRE(send && recv && ref && tmp, "malloc");
    gen(send, HCOLL_FLOAT32, HCOLL_SUM, lrank, count, 1);
    reference(ref, tmp, HCOLL_FLOAT32, HCOLL_SUM, sh->L, count, 1);
    for (size_t p = 0; p < count; p += piece) {
        size_t n = count - p < piece ? count - p : piece;
        TSHM_OK(&eb, hc_intra_shm_ops.reduce_scatter(ctx, send + p, recv + p, n, HCOLL_FLOAT32,
                                                     HCOLL_SUM, NULL));
    }
    for (size_t p = 0; p < count; p += piece) {
        size_t n = count - p < piece ? count - p : piece;
        TSHM_OK(&eb, hc_intra_shm_ops.all_gather(ctx, recv + p, n, HCOLL_FLOAT32, NULL));
    }
    long d = first_diff(recv, ref, 0, count, 4);
    HCT_REQUIRE(d < 0, "differs at %ld", d);
    sh->hash[lrank] = fnv(0, recv, count * 4);
    free(send);
    free(recv);
    free(ref);
    free(tmp);
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(pieces_like_the_executor)
{
    run_matrix(3, 8192, rank_pieces);
}
END_TEST

/* The executor's reduce-scatter and all-gather: the vector's blocks
 * scattered through a buffer in another order, with gaps (the interleaved
 * layouts' permutation), read in place by reduce_scatter_blocks (the shard
 * must be bit-identical to the contiguous reduction's, nothing else
 * written), then written in place by all_gather_blocks. Block
 * counts that do and do not divide into the shards, blocks shorter and
 * longer than a step. */
static int blocks_case(hc_intra_t *ctx, hc_errbuf_t *eb, int lrank, int L, hcoll_dtype_t dt,
                       hcoll_op_t op, size_t nb, size_t blen)
{
    const size_t es = hcoll_dtype_size(dt), count = nb * blen, stride = blen + 5;
    unsigned char *vec = malloc(count * es), *ref = malloc(count * es),
                  *tmp = malloc(count * es), *scat = malloc(nb * stride * es),
                  *recv = malloc(count * es);
    const void **blocks = malloc(nb * sizeof *blocks);
    HCT_REQUIRE(vec && ref && tmp && scat && recv && blocks, "malloc");
    gen(vec, dt, op, lrank, count, 1);
    reference(ref, tmp, dt, op, L, count, 1);
    for (size_t j = 0; j < nb; j++) { /* block j at slot nb-1-j, reversed */
        blocks[j] = scat + (nb - 1 - j) * stride * es;
        memcpy(scat + (nb - 1 - j) * stride * es, vec + j * blen * es, blen * es);
    }
    memset(recv, 0xa5, count * es);
    hcoll_status_t st = hc_intra_shm_ops.reduce_scatter_blocks(ctx, blocks, blen, recv, count,
                                                               dt, op, NULL);
    HCT_REQUIRE(st == HCOLL_SUCCESS, "reduce_scatter_blocks: %s (%s)", hcoll_status_name(st),
                eb->msg);
    size_t off, len;
    hc_intra_shard(count, L, lrank, &off, &len);
    long d = first_diff(recv, ref, off, len, es);
    HCT_REQUIRE(d < 0, "L=%d %s %s nb %zu blen %zu: differs at %ld", L, hcoll_dtype_name(dt),
                hcoll_op_name(op), nb, blen, d);
    for (size_t i = 0; i < count * es; i++)
        HCT_REQUIRE(recv[i] == 0xa5 || (i >= off * es && i < (off + len) * es),
                    "byte %zu outside the shard written", i);
    /* The mirror: all_gather_blocks of the shards just reduced into the
     * scattered blocks; the gaps between blocks stay untouched. */
    memset(scat, 0x5a, nb * stride * es);
    st = hc_intra_shm_ops.all_gather_blocks(ctx, recv, (void *const *)blocks, blen, count, dt,
                                            NULL);
    HCT_REQUIRE(st == HCOLL_SUCCESS, "all_gather_blocks: %s (%s)", hcoll_status_name(st),
                eb->msg);
    for (size_t j = 0; j < nb; j++) {
        d = first_diff(blocks[j], ref + j * blen * es, 0, blen, es);
        HCT_REQUIRE(d < 0, "L=%d nb %zu blen %zu: all-gathered block %zu differs at %ld", L, nb,
                    blen, j, d);
        const unsigned char *gap = (const unsigned char *)blocks[j] + blen * es;
        for (size_t i = 0; i < 5 * es; i++)
            HCT_REQUIRE(gap[i] == 0x5a, "block %zu: gap byte %zu written", j, i);
    }
    free(vec);
    free(ref);
    free(tmp);
    free(scat);
    free(recv);
    free(blocks);
    return 0;
}

static int rank_blocks(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    const size_t L = (size_t)sh->L;
    const size_t shapes[][2] = { { 2 * L, 1237 }, { 2 * L + 1, 1237 }, { 3 * L, 1 },
                                 { L, 5000 }, { 2 * L + 1, 3 } };
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        if (blocks_case(ctx, &eb, lrank, sh->L, HCOLL_FLOAT32, HCOLL_SUM, shapes[c][0],
                        shapes[c][1]) ||
            blocks_case(ctx, &eb, lrank, sh->L, HCOLL_INT32, HCOLL_MAX, shapes[c][0],
                        shapes[c][1]) ||
            blocks_case(ctx, &eb, lrank, sh->L, HCOLL_FLOAT64, HCOLL_PROD, shapes[c][0],
                        shapes[c][1]))
            return 1;
    /* Not whole blocks: refused on every rank, and the context still works. */
    float x[4] = { 0 };
    const void *one[1] = { x };
    HCT_REQUIRE(hc_intra_shm_ops.reduce_scatter_blocks(ctx, one, 3, x, 4, HCOLL_FLOAT32,
                                                       HCOLL_SUM, NULL) == HCOLL_ERR_INVALID_ARG,
                "4 elements in blocks of 3 accepted");
    void *oned[1] = { x };
    HCT_REQUIRE(hc_intra_shm_ops.all_gather_blocks(ctx, x, oned, 3, 4, HCOLL_FLOAT32, NULL) ==
                    HCOLL_ERR_INVALID_ARG,
                "all_gather_blocks: 4 elements in blocks of 3 accepted");
    TSHM_OK(&eb, hc_intra_shm_ops.barrier(ctx));
    sh->hash[lrank] = 1;
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(rs_ag_on_scattered_blocks)
{
    run_matrix(_i, 8192, rank_blocks);
}
END_TEST

/* Ranks that disagree on the count get MISMATCH, not garbage. */
static int rank_mismatch(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    float buf[128] = { 0 };
    hcoll_status_t st = hc_intra_shm_ops.reduce_scatter(ctx, buf, buf, 100 + (size_t)lrank,
                                                        HCOLL_FLOAT32, HCOLL_SUM, NULL);
    HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "got %s (%s)", hcoll_status_name(st), eb.msg);
    st = hc_intra_shm_ops.barrier(ctx);
    HCT_REQUIRE(st != HCOLL_SUCCESS, "a broken context must stay broken");
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(mismatched_counts)
{
    run_matrix(2, 4096, rank_mismatch);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Failures                                                                   */
/* ------------------------------------------------------------------------ */

static int rank_until_error(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    const size_t count = 256 * 1024;
    float *send = calloc(count, 4), *recv = calloc(count, 4);
    HCT_REQUIRE(send && recv, "calloc");
    __atomic_add_fetch(&sh->looping, 1, __ATOMIC_SEQ_CST);
    hcoll_status_t st;
    double t0 = hct_now_ms();
    do {
        st = hc_intra_shm_ops.allreduce(ctx, send, recv, count, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    } while (st == HCOLL_SUCCESS && hct_now_ms() - t0 < 30000);
    sh->err_ms[lrank] = hct_now_ms();
    sh->status[lrank] = st;
    fprintf(stderr, "local rank %d: %s (%s)\n", lrank, hcoll_status_name(st), eb.msg);
    free(send);
    free(recv);
    hc_intra_destroy(ctx);
    return 0;
}

static void kill_victim(const pid_t *pids, int nranks, void *arg)
{
    tshm_t *sh = arg;
    double deadline = hct_now_ms() + 20000;
    while (__atomic_load_n(&sh->looping, __ATOMIC_SEQ_CST) < nranks && hct_now_ms() < deadline)
        usleep(1000);
    usleep(100 * 1000);
    sh->kill_ms = hct_now_ms();
    kill(pids[sh->victim], SIGKILL);
}

START_TEST(killed_rank_mid_operation)
{
    const int L = 4;
    tshm_t *sh = tshm_new(L);
    sh->timeout_ms = 3000;
    sh->victim = _i; /* rank 0 (the creator) and a middle rank */
    hct_opts_t o = { .nranks = L, .timeout_ms = 60000, .on_started = kill_victim };
    hct_result_t res[TSHM_MAXL];
    hct_run(&o, rank_until_error, sh, res);
    ck_assert_msg(res[sh->victim].signaled && res[sh->victim].sig == SIGKILL,
                  "the victim was not killed");
    ck_assert_msg(sh->kill_ms > 0, "never killed");
    for (int r = 0; r < L; r++) {
        if (r == sh->victim)
            continue;
        ck_assert_msg(res[r].exited && res[r].code == 0, "local rank %d failed", r);
        ck_assert_msg(sh->status[r] == HCOLL_ERR_PEER_FAILED, "local rank %d got %s", r,
                      hcoll_status_name((hcoll_status_t)sh->status[r]));
        double lat = sh->err_ms[r] - sh->kill_ms;
        ck_assert_msg(lat < sh->timeout_ms + 1000, "local rank %d took %.0f ms", r, lat);
        printf("killed rank %d: local rank %d saw PEER_FAILED after %.1f ms\n", sh->victim, r,
               lat);
    }
    ck_assert_msg(!shm_name_exists(sh->name), "segment left in /dev/shm");
    ck_assert_int_eq(shm_leftovers(), 0);
    hct_shared_free(sh, sizeof *sh);
}
END_TEST

/* A rank dies after the allgather and before attaching: everybody fails
 * promptly and the name is gone, whoever the victim was. */
static int rank_create_fails(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    double t0 = hct_now_ms();
    hcoll_status_t st = tshm_create(sh, lrank, &ag, &eb, &ctx);
    sh->err_ms[lrank] = hct_now_ms() - t0;
    sh->status[lrank] = st;
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "create: %s (%s)", hcoll_status_name(st), eb.msg);
    HCT_REQUIRE(!ctx, "output written on failure");
    return 0;
}

START_TEST(death_before_attach_leaves_nothing)
{
    const int L = 3;
    tshm_t *sh = tshm_new(L);
    sh->timeout_ms = 5000;
    sh->die_after_allgather = _i == 0 ? 0 : L - 1;
    hct_opts_t o = { .nranks = L, .timeout_ms = 30000 };
    hct_result_t res[TSHM_MAXL];
    hct_run(&o, rank_create_fails, sh, res);
    for (int r = 0; r < L; r++) {
        if (r == sh->die_after_allgather)
            continue;
        ck_assert_msg(res[r].exited && res[r].code == 0, "local rank %d failed", r);
        ck_assert_msg(sh->err_ms[r] < 1000, "local rank %d took %.0f ms", r, sh->err_ms[r]);
    }
    ck_assert_msg(!shm_name_exists(sh->name), "segment left in /dev/shm");
    ck_assert_int_eq(shm_leftovers(), 0);
    hct_shared_free(sh, sizeof *sh);
}
END_TEST

/* A rank that never shows up: the waiters time out after timeout_ms, and
 * the late rank's call fails too instead of waiting. */
static int rank_timeout(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    if (lrank == 1)
        usleep((useconds_t)(sh->timeout_ms + 500) * 1000);
    double t0 = hct_now_ms();
    hcoll_status_t st = hc_intra_shm_ops.barrier(ctx);
    double ms = hct_now_ms() - t0;
    HCT_REQUIRE(st == HCOLL_ERR_TIMEOUT, "local rank %d: %s (%s)", lrank,
                hcoll_status_name(st), eb.msg);
    if (lrank == 0)
        HCT_REQUIRE(ms >= sh->timeout_ms - 50 && ms < sh->timeout_ms + 1000, "%.0f ms", ms);
    else
        HCT_REQUIRE(ms < 100, "the late rank waited %.0f ms", ms);
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(silent_rank_times_out)
{
    tshm_t *sh = tshm_new(2);
    sh->timeout_ms = 400;
    hct_opts_t o = { .nranks = 2, .timeout_ms = 20000 };
    hct_result_t res[TSHM_MAXL];
    ck_assert_int_eq(hct_run(&o, rank_timeout, sh, res), 0);
    ck_assert_int_eq(shm_leftovers(), 0);
    hct_shared_free(sh, sizeof *sh);
}
END_TEST

/* Liveness: a local rank that keeps beating is waited for past the
 * liveness period (no operation timeout here); once it stops beating, the
 * waiter fails within the liveness period, naming it. */
typedef struct beater {
    hc_intra_t *ctx;
    volatile int stop;
} beater_t;

static void *beat_main(void *p)
{
    beater_t *b = p;
    while (!b->stop) {
        hc_intra_beat(b->ctx);
        usleep(30000);
    }
    return NULL;
}

static int rank_beats(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    beater_t b = { ctx, 0 };
    pthread_t th;
    HCT_REQUIRE(pthread_create(&th, NULL, beat_main, &b) == 0, "pthread_create");
    /* 1. late but alive: 3 liveness periods late. */
    if (lrank == 1)
        usleep((useconds_t)sh->liveness_ms * 3 * 1000);
    double t0 = hct_now_ms();
    TSHM_OK(&eb, hc_intra_shm_ops.barrier(ctx));
    if (lrank == 0)
        HCT_REQUIRE(hct_now_ms() - t0 > sh->liveness_ms * 2, "did not wait for the late rank");
    /* 2. frozen: rank 1 stops beating and does not call. */
    if (lrank == 1) {
        b.stop = 1;
        pthread_join(th, NULL);
        usleep((useconds_t)sh->liveness_ms * 4 * 1000);
        hcoll_status_t st = hc_intra_shm_ops.barrier(ctx);
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "frozen rank: %s", hcoll_status_name(st));
        hc_intra_destroy(ctx);
        return 0;
    }
    t0 = hct_now_ms();
    hcoll_status_t st = hc_intra_shm_ops.barrier(ctx);
    double ms = hct_now_ms() - t0;
    HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "-> %s (%s)", hcoll_status_name(st), eb.msg);
    HCT_REQUIRE(strstr(eb.msg, "local rank 1") && strstr(eb.msg, "no sign of life"), "%s",
                eb.msg);
    HCT_REQUIRE(ms < sh->liveness_ms + 500, "found after %.0f ms", ms);
    b.stop = 1;
    pthread_join(th, NULL);
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(frozen_rank_vs_late_rank)
{
    tshm_t *sh = tshm_new(2);
    sh->timeout_ms = 1000;   /* set-up only: the late rank is 1.2 s late */
    sh->op_timeout_ms = -1;  /* operations wait without limit */
    sh->liveness_ms = 400;
    hct_opts_t o = { .nranks = 2, .timeout_ms = 20000 };
    hct_result_t res[TSHM_MAXL];
    ck_assert_int_eq(hct_run(&o, rank_beats, sh, res), 0);
    ck_assert_int_eq(shm_leftovers(), 0);
    hct_shared_free(sh, sizeof *sh);
}
END_TEST

typedef struct abort_arg {
    hc_intra_t *ctx;
    int delay_ms;
} abort_arg_t;

static void *abort_thread(void *p)
{
    abort_arg_t *a = p;
    usleep((useconds_t)a->delay_ms * 1000);
    hc_intra_abort(a->ctx);
    return NULL;
}

/* Ranks 0 and 2 block in an allreduce that rank 1 never joins; a thread of
 * rank 0 aborts: rank 0 gets ABORTED, rank 2 PEER_FAILED, both promptly,
 * and rank 1's late call fails at once. */
static int rank_abort(int lrank, int nranks, void *arg)
{
    (void)nranks;
    tshm_t *sh = arg;
    tshm_ag_t ag;
    hc_errbuf_t eb;
    hc_intra_t *ctx = NULL;
    TSHM_OK(&eb, tshm_create(sh, lrank, &ag, &eb, &ctx));
    float buf[1000] = { 0 };
    hcoll_status_t st;
    if (lrank == 1) {
        usleep(800 * 1000);
        double t0 = hct_now_ms();
        st = hc_intra_shm_ops.allreduce(ctx, buf, buf, 1000, HCOLL_FLOAT32, HCOLL_SUM, NULL);
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "late rank: %s", hcoll_status_name(st));
        HCT_REQUIRE(hct_now_ms() - t0 < 200, "late rank waited");
        hc_intra_destroy(ctx);
        return 0;
    }
    pthread_t th;
    abort_arg_t a = { ctx, 300 };
    if (lrank == 0)
        HCT_REQUIRE(pthread_create(&th, NULL, abort_thread, &a) == 0, "pthread_create");
    double t0 = hct_now_ms();
    st = hc_intra_shm_ops.allreduce(ctx, buf, buf, 1000, HCOLL_FLOAT32, HCOLL_SUM, NULL);
    double ms = hct_now_ms() - t0;
    if (lrank == 0) {
        pthread_join(th, NULL);
        HCT_REQUIRE(st == HCOLL_ERR_ABORTED, "%s (%s)", hcoll_status_name(st), eb.msg);
        st = hc_intra_shm_ops.barrier(ctx);
        HCT_REQUIRE(st == HCOLL_ERR_ABORTED, "after abort: %s", hcoll_status_name(st));
    } else {
        HCT_REQUIRE(st == HCOLL_ERR_PEER_FAILED, "%s (%s)", hcoll_status_name(st), eb.msg);
    }
    HCT_REQUIRE(ms < 300 + 500, "returned after %.0f ms", ms);
    hc_intra_destroy(ctx);
    return 0;
}

START_TEST(abort_from_another_thread)
{
    tshm_t *sh = tshm_new(3);
    sh->timeout_ms = 20000;
    hct_opts_t o = { .nranks = 3, .timeout_ms = 30000 };
    hct_result_t res[TSHM_MAXL];
    ck_assert_int_eq(hct_run(&o, rank_abort, sh, res), 0);
    ck_assert_int_eq(shm_leftovers(), 0);
    hct_shared_free(sh, sizeof *sh);
}
END_TEST

START_TEST(bad_arguments)
{
    hc_errbuf_t eb;
    hc_errbuf_init(&eb);
    hc_intra_t *ctx = NULL;
    hc_intra_params_t p = { .local_rank = 0, .local_size = 2, .name = "no-slash",
                            .chunk_bytes = 4096, .timeout_ms = 100, .errbuf = &eb,
                            .allgather = tshm_allgather };
    ck_assert_int_eq(hc_intra_shm_ops.create(&p, &ctx), HCOLL_ERR_INVALID_ARG);
    p.name = "/ok";
    p.local_rank = 2;
    ck_assert_int_eq(hc_intra_shm_ops.create(&p, &ctx), HCOLL_ERR_INVALID_ARG);
    ck_assert_ptr_null(ctx);
    /* L = 1 needs no segment and no peers. */
    p.local_rank = 0;
    p.local_size = 1;
    p.allgather = NULL;
    ck_assert_int_eq(hc_intra_shm_ops.create(&p, &ctx), HCOLL_SUCCESS);
    float a[3] = { 1, 2, 3 }, b[3] = { 0 };
    ck_assert_int_eq(hc_intra_shm_ops.allreduce(ctx, a, b, 3, HCOLL_FLOAT32, HCOLL_SUM, NULL),
                     HCOLL_SUCCESS);
    ck_assert_mem_eq(a, b, sizeof a);
    ck_assert_int_eq(hc_intra_shm_ops.allreduce(ctx, a, b, 3, HCOLL_FLOAT32, HCOLL_SUM, &p),
                     HCOLL_ERR_UNSUPPORTED);
    ck_assert_int_eq(hc_intra_shm_ops.allreduce(ctx, a, b, 3, HCOLL_DTYPE_COUNT_, HCOLL_SUM,
                                                NULL),
                     HCOLL_ERR_INVALID_ARG);
    ck_assert_int_eq(hc_intra_shm_ops.barrier(ctx), HCOLL_SUCCESS);
    hc_intra_destroy(ctx);
    hc_intra_destroy(NULL);
    hc_errbuf_fini(&eb);
}
END_TEST


/* ---- a segment left by ranks that all died while creating it ---------- */

static void die_at_created(const char *point)
{
    if (strcmp(point, "created") == 0)
        raise(SIGKILL);
}

static void pause_at_created(const char *point)
{
    if (strcmp(point, "created") == 0)
        for (;;)
            pause();
}

static hcoll_status_t failing_allgather(void *ctx, const void *mine, void *all, size_t len)
{
    (void)ctx, (void)mine, (void)all, (void)len;
    return HCOLL_ERR_TIMEOUT;
}

/* Local rank 0 of 2 creating `name`; its partner never comes. */
static hcoll_status_t create_alone(const char *name, hc_errbuf_t *eb)
{
    hc_errbuf_init(eb);
    hc_intra_params_t p = { .local_rank = 0, .local_size = 2, .name = name,
                            .chunk_bytes = 4096, .timeout_ms = 2000, .errbuf = eb,
                            .allgather = failing_allgather };
    hc_intra_t *ctx = NULL;
    return hc_intra_shm_ops.create(&p, &ctx);
}

static pid_t create_in_child(const char *name, void (*hook)(const char *))
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        hc_errbuf_t eb;
        hc_shm_test_hook = hook;
        alarm(30);
        create_alone(name, &eb);
        _exit(3); /* the hook never let create return */
    }
    return pid;
}

static int shm_exists(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* Rank 0 SIGKILLed right after creating its segment (its partner gone
 * too): the name is left in /dev/shm. The next create on the node removes
 * it, and leaves alone the segment of a creator that is still alive. */
START_TEST(leftover_segment_reaped)
{
    char dead[64], alive[64], next[64];
    snprintf(dead, sizeof dead, "/hcoll-test-%d-dead", (int)getpid());
    snprintf(alive, sizeof alive, "/hcoll-test-%d-alive", (int)getpid());
    snprintf(next, sizeof next, "/hcoll-test-%d-next", (int)getpid());
    int status;
    pid_t a = create_in_child(dead, die_at_created);
    ck_assert_int_eq(waitpid(a, &status, 0), a);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ck_assert_msg(shm_exists(dead), "the kill left no segment: the test tests nothing");
    pid_t b = create_in_child(alive, pause_at_created);
    for (int i = 0; i < 500 && !shm_exists(alive); i++)
        usleep(10000);
    ck_assert(shm_exists(alive));
    usleep(50000); /* its header is written before the hook runs */
    hc_errbuf_t eb;
    ck_assert_int_eq(create_alone(next, &eb), HCOLL_ERR_TIMEOUT);
    ck_assert_msg(!shm_exists(dead), "the dead creator's segment is still there");
    ck_assert_msg(shm_exists(alive), "a live creator's segment was removed");
    ck_assert(!shm_exists(next));
    kill(b, SIGKILL);
    waitpid(b, &status, 0);
    shm_unlink(alive);
    shm_unlink(dead);
}
END_TEST

static Suite *shm_suite(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("split");
    tcase_add_test(tc, shard_split_covers_exactly);
    tcase_add_test(tc, bad_arguments);
    suite_add_tcase(s, tc);

    tc = tcase_create("correctness");
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    tcase_add_loop_test(tc, matrix_every_dtype_op_count, 1, TSHM_MAXL + 1);
    tcase_add_loop_test(tc, large_1mib_plus_3, 2, TSHM_MAXL + 1);
    tcase_add_test(tc, large_64mib_l4);
    tcase_add_test(tc, many_small_calls);
    tcase_add_test(tc, pieces_like_the_executor);
    tcase_add_loop_test(tc, rs_ag_on_scattered_blocks, 1, 5);
    tcase_add_test(tc, mismatched_counts);
    suite_add_tcase(s, tc);

    tc = tcase_create("failures");
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    tcase_add_loop_test(tc, killed_rank_mid_operation, 0, 3);
    tcase_add_loop_test(tc, death_before_attach_leaves_nothing, 0, 2);
    tcase_add_test(tc, silent_rank_times_out);
    tcase_add_test(tc, frozen_rank_vs_late_rank);
    tcase_add_test(tc, abort_from_another_thread);
    tcase_add_test(tc, leftover_segment_reaped);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(shm_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
