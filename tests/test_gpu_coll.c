/*
 * The collectives on device buffers besides the all-reduce's plain ops,
 * with forked ranks over TCP on emulated nodes (HCOLL_HOSTID), each rank on
 * GPU (local rank % GPUs):
 *   - PREMUL_SUM (host and device scalars) and float AVG, every dtype, on
 *     one rank (the single plan: hcoll's scaling kernel) and 2 x 1 (the
 *     staged ring: the host copy is scaled, or the kernel for a device
 *     scalar), against a host reference built from base/reduce.h, bit for
 *     bit; counts 0, 1, 7, 4093, in place and not;
 *   - broadcast from every root, blocking and _async, in place and not,
 *     sizes that take each integer width, bit for bit (the byte past the
 *     vector untouched); roots that disagree: HCOLL_ERR_MISMATCH from the
 *     request, nothing moved, the stream goes on, the communicator works;
 *     with the blocking call (returned already) the async error says so;
 *   - reduce-scatter (SUM, AVG, PREMUL_SUM) and all-gather, every dtype,
 *     in place and not, against the reference, bit for bit;
 *   each on 1 x 1 (single), 2 x 1 (ring), nodes of 2 and 1 (flat), and,
 *   with 2 GPUs (NCCL refuses a shared one), 1 x 2 (intra) and 2 x 2
 *   (three stages). GPUDirect cases are in test_ib_api (emulated verbs).
 * Needs a GPU (the emulated driver under tests/gpu-mock.test.sh); prints
 * "SKIP: no GPU: <why>" and exits 77 otherwise.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/reduce.h"
#include "common/ranks.h"
#include "gpu/gpuhelp.h"
#include "hc_build.h"

#define TIMEOUT_MS 60000
static int ngpus;

typedef struct shared {
    hct_id_slot_t id;
} shared_t;

typedef struct job {
    shared_t *sh;
    int rpn; /* ranks per node */
} job_t;

static const hcoll_dtype_t dts[] = { HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16,
                                     HCOLL_FLOAT64, HCOLL_INT8,    HCOLL_UINT8,
                                     HCOLL_INT32,   HCOLL_INT64 };
#define NDT (sizeof dts / sizeof dts[0])
static const size_t counts[] = { 0, 1, 7, 4093 };
#define NCOUNT (sizeof counts / sizeof counts[0])

static hcoll_comm_t rank_init(job_t *j, int rank, int nranks)
{
    hcoll_unique_id_t id;
    hcoll_comm_t comm = NULL;
    setenv("HCOLL_SOCKET_IFNAME", "lo", 1);
    setenv("HCOLL_NET", "tcp", 1);
    if (hct_share_unique_id(&j->sh->id, rank, 20000, &id) != 0)
        return NULL;
    hcoll_config_t cfg = HCOLL_CONFIG_INITIALIZER;
    cfg.timeout_ms = 30000;
    if (hcoll_comm_init(&comm, nranks, rank, &id, &cfg) != HCOLL_SUCCESS) {
        fprintf(stderr, "rank %d: init: %s\n", rank, hcoll_comm_last_error(NULL));
        return NULL;
    }
    return comm;
}

/* Element i of rank r: a small integer, exact in every dtype and in any
 * order of summation. */
static void fill(void *p, size_t n, hcoll_dtype_t dt, int r, unsigned salt)
{
    for (size_t i = 0; i < n; i++) {
        double v = (double)((i * 7 + (size_t)r * 13 + salt) % 23) - 11.0;
        switch (dt) {
        case HCOLL_FLOAT32: ((float *)p)[i] = (float)v; break;
        case HCOLL_FLOAT64: ((double *)p)[i] = v; break;
        case HCOLL_FLOAT16: ((uint16_t *)p)[i] = hc_float_to_half((float)v); break;
        case HCOLL_BFLOAT16: ((uint16_t *)p)[i] = hc_float_to_bf16((float)v); break;
        case HCOLL_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
        case HCOLL_UINT8: ((uint8_t *)p)[i] = (uint8_t)(int)v; break;
        case HCOLL_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
        case HCOLL_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
        default: break;
        }
    }
}

/* Rank r's PREMUL_SUM scalar: (r + 1) / 4 for floats (exact), r + 2 for
 * integers. */
static hc_scalar_t scalar_of(int r, hcoll_dtype_t dt)
{
    hc_scalar_t s;
    memset(&s, 0, sizeof s);
    if (dt == HCOLL_FLOAT64)
        s.f64 = (double)(r + 1) / 4.0;
    else if (hc_dtype_is_float(dt))
        s.f32 = (float)(r + 1) / 4.0f;
    else
        s.i64 = r + 2;
    return s;
}

/* The reference: sum over ranks of (scaled) inputs, in rank order. */
static void reference(void *want, size_t n, hcoll_dtype_t dt, int nranks, int scaled,
                      hcoll_op_t avg_or_sum, unsigned salt)
{
    const size_t es = hcoll_dtype_size(dt);
    unsigned char *tmp = malloc(n * es + 1);
    for (int r = 0; r < nranks; r++) {
        unsigned char *dst = r == 0 ? want : tmp;
        fill(dst, n, dt, r, salt);
        if (scaled)
            hc_reduce_scale(dst, dst, n, dt, scalar_of(r, dt));
        else if (avg_or_sum == HCOLL_AVG)
            hc_reduce_scale(dst, dst, n, dt, hc_scalar_avg(dt, nranks));
        if (r > 0)
            hc_reduce(want, want, tmp, n, dt, HCOLL_SUM);
    }
    free(tmp);
}

/* One PREMUL_SUM (how: 0 host scalar, 1 device scalar) or float AVG (how
 * 2) all-reduce of count elements of dt, compared bit for bit. */
static int check_scaled(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                        int nranks, hcoll_dtype_t dt, size_t count, int how, int inplace)
{
    const size_t es = hcoll_dtype_size(dt), bytes = count * es + 8;
    unsigned char *in = malloc(bytes), *out = malloc(bytes), *want = malloc(bytes);
    HCT_REQUIRE(in && out && want, "no memory");
    const unsigned salt = (unsigned)(count + (size_t)how);
    fill(in, count, dt, rank, salt);
    reference(want, count, dt, nranks, how < 2, how < 2 ? HCOLL_SUM : HCOLL_AVG, salt);
    hc_cu_dptr_t ds, dr, dk;
    GPU_OK(cu->mem_alloc(&ds, bytes));
    GPU_OK(cu->mem_alloc(&dr, bytes));
    GPU_OK(cu->mem_alloc(&dk, 16));
    unsigned char k[8];
    hc_scalar_store(k, dt, scalar_of(rank, dt));
    hcoll_op_t op = HCOLL_AVG;
    if (how == 0) {
        HCT_OK(comm, hcoll_op_create_premul_sum(comm, k, dt, HCOLL_SCALAR_HOST_IMMEDIATE, &op));
    } else if (how == 1) {
        GPU_OK(cu->memcpy_htod_async(dk, k, es, stream));
        HCT_OK(comm, hcoll_op_create_premul_sum(comm, (void *)(uintptr_t)dk, dt,
                                                HCOLL_SCALAR_DEVICE, &op));
    }
    GPU_OK(cu->memcpy_htod_async(inplace ? dr : ds, in, count * es + 1, stream));
    void *sp = (void *)(uintptr_t)(inplace ? dr : ds), *rp = (void *)(uintptr_t)dr;
    HCT_OK(comm, hcoll_allreduce(comm, sp, rp, count, dt, op, stream));
    GPU_OK(cu->memcpy_dtoh_async(out, dr, count * es + 1, stream));
    GPU_OK(cu->stream_synchronize(stream));
    if (how < 2)
        HCT_OK(comm, hcoll_op_destroy(comm, op));
    for (size_t i = 0; i < count * es; i++)
        HCT_REQUIRE(out[i] == want[i],
                    "rank %d: %s %s of %zu x %s%s: byte %zu is 0x%02x, want 0x%02x", rank,
                    how == 2 ? "AVG" : "PREMUL_SUM",
                    how == 0 ? "(host scalar)" : how == 1 ? "(device scalar)" : "", count,
                    hcoll_dtype_name(dt), inplace ? " in place" : "", i, out[i], want[i]);
    GPU_OK(cu->mem_free(ds));
    GPU_OK(cu->mem_free(dr));
    GPU_OK(cu->mem_free(dk));
    free(in);
    free(out);
    free(want);
    return 0;
}

static int rank_premul(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    const hc_cu_api_t *cu = gpu_open(ngpus > 1 ? (rank % j->rpn) % ngpus : 0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    for (size_t d = 0; d < NDT; d++)
        for (size_t c = 0; c < NCOUNT; c++)
            for (int how = 0; how < 3; how++) {
                if ((how == 2 && !hc_dtype_is_float(dts[d])) || (how == 1 && !HCOLL_BUILD_KERNELS))
                    continue;
                if (check_scaled(comm, cu, stream, rank, nranks, dts[d], counts[c], how,
                                 (int)((c + (size_t)how) & 1)))
                    return 1;
            }
    HCT_OK(comm, hcoll_comm_destroy(comm));
    cu->stream_destroy(stream);
    return 0;
}

/* ---- Broadcast ------------------------------------------------------------ */

/* Byte i of root r's vector (a pattern no rank's garbage shares). */
static unsigned char bpat(int r, size_t i, unsigned salt)
{
    return (unsigned char)(i * 131u + (unsigned)r * 17u + salt * 7u + 1u);
}

/* One device broadcast of count x dt from root, blocking or _async, in
 * place or not on the root, bit for bit; the byte past the vector stays. */
static int check_bcast(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                       int root, hcoll_dtype_t dt, size_t count, int inplace, int async)
{
    const size_t bytes = count * hcoll_dtype_size(dt);
    const unsigned salt = (unsigned)(count + (size_t)dt);
    unsigned char *h = malloc(bytes + 1), *out = malloc(bytes + 1);
    HCT_REQUIRE(h && out, "no memory");
    hc_cu_dptr_t ds, dr;
    GPU_OK(cu->mem_alloc(&ds, bytes + 1));
    GPU_OK(cu->mem_alloc(&dr, bytes + 1));
    for (size_t i = 0; i <= bytes; i++)
        h[i] = rank == root ? bpat(root, i, salt) : (unsigned char)(0xa5 ^ rank);
    h[bytes] = 0x5a; /* the guard */
    GPU_OK(cu->memcpy_htod_async(dr, h, bytes + 1, stream));
    if (rank == root && !inplace)
        GPU_OK(cu->memcpy_htod_async(ds, h, bytes + 1, stream));
    const void *sp = rank != root ? NULL : (void *)(uintptr_t)(inplace ? dr : ds);
    void *rp = (void *)(uintptr_t)dr;
    if (async) {
        hcoll_request_t req;
        HCT_OK(comm, hcoll_broadcast_async(comm, sp, rp, count, dt, root, stream, &req));
        HCT_OK(comm, hcoll_wait(req));
        HCT_OK(comm, hcoll_request_free(req));
    } else {
        HCT_OK(comm, hcoll_broadcast(comm, sp, rp, count, dt, root, stream));
    }
    GPU_OK(cu->memcpy_dtoh_async(out, dr, bytes + 1, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < bytes; i++)
        HCT_REQUIRE(out[i] == bpat(root, i, salt),
                    "rank %d: broadcast of %zu x %s from %d%s%s: byte %zu is 0x%02x, want 0x%02x",
                    rank, count, hcoll_dtype_name(dt), root, inplace ? " in place" : "",
                    async ? " (async)" : "", i, out[i], bpat(root, i, salt));
    HCT_REQUIRE(out[bytes] == 0x5a, "rank %d: broadcast of %zu x %s from %d wrote past the end",
                rank, count, hcoll_dtype_name(dt), root);
    GPU_OK(cu->mem_free(ds));
    GPU_OK(cu->mem_free(dr));
    free(h);
    free(out);
    return 0;
}

/* Ranks that disagree on the root get HCOLL_ERR_MISMATCH from the request,
 * nothing moves, the stream goes on, and the communicator still works. */
static int check_bcast_mismatch(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                                int nranks)
{
    const size_t n = 1000;
    hc_cu_dptr_t d;
    GPU_OK(cu->mem_alloc(&d, n * 4));
    uint32_t *h = malloc(n * 4);
    HCT_REQUIRE(h, "no memory");
    for (size_t i = 0; i < n; i++)
        h[i] = 0x11223344u;
    GPU_OK(cu->memcpy_htod_async(d, h, n * 4, stream));
    hcoll_request_t req;
    void *p = (void *)(uintptr_t)d;
    HCT_OK(comm, hcoll_broadcast_async(comm, p, p, n, HCOLL_FLOAT32, rank, stream, &req));
    hcoll_status_t st = hcoll_wait(req);
    HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "rank %d: roots differ, the broadcast said %s", rank,
                hcoll_status_name(st));
    HCT_OK(comm, hcoll_request_free(req));
    GPU_OK(cu->stream_synchronize(stream));
    memset(h, 0, n * 4);
    GPU_OK(cu->memcpy_dtoh_async(h, d, n * 4, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < n; i++)
        HCT_REQUIRE(h[i] == 0x11223344u, "rank %d: a refused broadcast wrote element %zu", rank,
                    i);
    free(h);
    GPU_OK(cu->mem_free(d));
    hcoll_status_t async = HCOLL_IN_PROGRESS;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &async));
    HCT_REQUIRE(async == HCOLL_SUCCESS, "rank %d: a mismatch made the communicator fail (%s)",
                rank, hcoll_status_name(async));
    return check_bcast(comm, cu, stream, rank, nranks - 1, HCOLL_FLOAT32, 4093, 0, 0);
}

static int rank_bcast(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    const hc_cu_api_t *cu = gpu_open(ngpus > 1 ? (rank % j->rpn) % ngpus : 0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    /* Sizes that take each integer width: 4, 1, 8 and 2 bytes. */
    static const hcoll_dtype_t bdt[] = { HCOLL_FLOAT32, HCOLL_UINT8, HCOLL_FLOAT64,
                                         HCOLL_FLOAT16 };
    int k = 0;
    for (int root = 0; root < nranks; root++)
        for (size_t c = 0; c < NCOUNT; c++, k++)
            if (check_bcast(comm, cu, stream, rank, root, bdt[k % 4], counts[c], k & 1,
                            (k >> 1) & 1))
                return 1;
    if (nranks > 1 && check_bcast_mismatch(comm, cu, stream, rank, nranks))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    cu->stream_destroy(stream);
    return 0;
}

/* ---- Reduce-scatter and all-gather ------------------------------------------ */

/* One device reduce-scatter (how: 0 SUM, 1 AVG, 2 PREMUL_SUM with a host
 * scalar) of B per rank, against the reference, bit for bit. In place:
 * recvbuf = sendbuf + rank x B. */
static int check_rs(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank, int nranks,
                    hcoll_dtype_t dt, size_t B, int how, int inplace)
{
    const size_t es = hcoll_dtype_size(dt), all = (size_t)nranks * B;
    const unsigned salt = (unsigned)(B * 3 + (size_t)how);
    unsigned char *in = malloc(all * es + 1), *want = malloc(all * es + 1),
                  *out = malloc(B * es + 1), *tmp = malloc(all * es + 1);
    HCT_REQUIRE(in && want && out && tmp, "no memory");
    for (int r = 0; r < nranks; r++) {
        unsigned char *dst = r == 0 ? want : tmp;
        fill(dst, all, dt, r, salt);
        if (how == 2)
            hc_reduce_scale(dst, dst, all, dt, scalar_of(r, dt));
        else if (how == 1 && hc_dtype_is_float(dt))
            hc_reduce_scale(dst, dst, all, dt, hc_scalar_avg(dt, nranks));
        if (r > 0)
            hc_reduce(want, want, tmp, all, dt, HCOLL_SUM);
    }
    if (how == 1 && !hc_dtype_is_float(dt))
        hc_reduce_avg_finish(want, all, dt, HCOLL_AVG, nranks);
    fill(in, all, dt, rank, salt);
    hc_cu_dptr_t ds, dr;
    GPU_OK(cu->mem_alloc(&ds, all * es + 1));
    GPU_OK(cu->mem_alloc(&dr, B * es + 1));
    GPU_OK(cu->memcpy_htod_async(ds, in, all * es + 1, stream));
    hcoll_op_t op = how == 1 ? HCOLL_AVG : HCOLL_SUM;
    if (how == 2) {
        unsigned char k[8];
        hc_scalar_store(k, dt, scalar_of(rank, dt));
        HCT_OK(comm, hcoll_op_create_premul_sum(comm, k, dt, HCOLL_SCALAR_HOST_IMMEDIATE, &op));
    }
    unsigned char *rp = (unsigned char *)(uintptr_t)(inplace ? ds + (size_t)rank * B * es : dr);
    HCT_OK(comm, hcoll_reduce_scatter(comm, (void *)(uintptr_t)ds, rp, B, dt, op, stream));
    GPU_OK(cu->memcpy_dtoh_async(out, (hc_cu_dptr_t)(uintptr_t)rp, B * es + (inplace ? 0 : 1),
                                 stream));
    GPU_OK(cu->stream_synchronize(stream));
    if (how == 2)
        HCT_OK(comm, hcoll_op_destroy(comm, op));
    const unsigned char *w = want + (size_t)rank * B * es;
    for (size_t i = 0; i < B * es; i++)
        HCT_REQUIRE(out[i] == w[i],
                    "rank %d: reduce_scatter %s of %zu x %s%s: byte %zu is 0x%02x, want 0x%02x",
                    rank, how == 0 ? "SUM" : how == 1 ? "AVG" : "PREMUL_SUM", B,
                    hcoll_dtype_name(dt), inplace ? " in place" : "", i, out[i], w[i]);
    GPU_OK(cu->mem_free(ds));
    GPU_OK(cu->mem_free(dr));
    free(in);
    free(want);
    free(out);
    free(tmp);
    return 0;
}

/* One device all-gather of B per rank, bit for bit; in place: sendbuf =
 * recvbuf + rank x B. */
static int check_ag(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank, int nranks,
                    hcoll_dtype_t dt, size_t B, int inplace)
{
    const size_t es = hcoll_dtype_size(dt), all = (size_t)nranks * B;
    const unsigned salt = (unsigned)(B * 5 + 1);
    unsigned char *want = malloc(all * es + 1), *out = malloc(all * es + 1);
    HCT_REQUIRE(want && out, "no memory");
    for (int r = 0; r < nranks; r++)
        fill(want + (size_t)r * B * es, B, dt, r, salt);
    hc_cu_dptr_t ds, dr;
    GPU_OK(cu->mem_alloc(&ds, B * es + 1));
    GPU_OK(cu->mem_alloc(&dr, all * es + 1));
    memset(out, 0xcd, all * es + 1);
    GPU_OK(cu->memcpy_htod_async(dr, out, all * es + 1, stream));
    hc_cu_dptr_t sp = inplace ? dr + (size_t)rank * B * es : ds;
    GPU_OK(cu->memcpy_htod_async(sp, want + (size_t)rank * B * es, B * es + !inplace, stream));
    HCT_OK(comm, hcoll_allgather(comm, (void *)(uintptr_t)sp, (void *)(uintptr_t)dr, B, dt,
                                 stream));
    GPU_OK(cu->memcpy_dtoh_async(out, dr, all * es + 1, stream));
    GPU_OK(cu->stream_synchronize(stream));
    for (size_t i = 0; i < all * es; i++)
        HCT_REQUIRE(out[i] == want[i],
                    "rank %d: allgather of %zu x %s%s: byte %zu is 0x%02x, want 0x%02x", rank, B,
                    hcoll_dtype_name(dt), inplace ? " in place" : "", i, out[i], want[i]);
    HCT_REQUIRE(out[all * es] == 0xcd, "rank %d: allgather wrote past the end", rank);
    GPU_OK(cu->mem_free(ds));
    GPU_OK(cu->mem_free(dr));
    free(want);
    free(out);
    return 0;
}

/* Ranks that disagree (rank 0 one element more, then another dtype, then
 * a reduce-scatter against the others' all-gather) get HCOLL_ERR_MISMATCH
 * from every request, none hangs, NCCL never sees the disagreement (the
 * emulated NCCL fails a call whose count differs between ranks), and the
 * communicator works on. */
static int check_rsag_mismatch(hcoll_comm_t comm, const hc_cu_api_t *cu, void *stream, int rank,
                               int nranks)
{
    const size_t B = 1000;
    hc_cu_dptr_t big, blk;
    GPU_OK(cu->mem_alloc(&big, (B + 1) * 8 * (size_t)nranks));
    GPU_OK(cu->mem_alloc(&blk, (B + 1) * 8));
    void *pb = (void *)(uintptr_t)big, *pk = (void *)(uintptr_t)blk;
    for (int how = 0; how < 3; how++) {
        const size_t n = how == 0 && rank == 0 ? B + 1 : B;
        const hcoll_dtype_t dt = how == 1 && rank == 0 ? HCOLL_INT32 : HCOLL_FLOAT32;
        const int rs = how != 2 || rank != 0;
        hcoll_request_t req;
        if (rs)
            HCT_OK(comm, hcoll_reduce_scatter_async(comm, pb, pk, n, dt, HCOLL_SUM, stream, &req));
        else
            HCT_OK(comm, hcoll_allgather_async(comm, pk, pb, n, dt, stream, &req));
        hcoll_status_t st = hcoll_wait(req);
        HCT_REQUIRE(st == HCOLL_ERR_MISMATCH, "rank %d: mismatch %d: the %s said %s (%s)", rank,
                    how, rs ? "reduce_scatter" : "allgather", hcoll_status_name(st),
                    hcoll_comm_last_error(comm));
        HCT_OK(comm, hcoll_request_free(req));
        GPU_OK(cu->stream_synchronize(stream));
    }
    hcoll_status_t async = HCOLL_IN_PROGRESS;
    HCT_OK(comm, hcoll_comm_get_async_error(comm, &async));
    HCT_REQUIRE(async == HCOLL_SUCCESS, "rank %d: a mismatch made the communicator fail (%s)",
                rank, hcoll_status_name(async));
    GPU_OK(cu->mem_free(big));
    GPU_OK(cu->mem_free(blk));
    return check_rs(comm, cu, stream, rank, nranks, HCOLL_FLOAT32, 4093, 0, 0) ||
           check_ag(comm, cu, stream, rank, nranks, HCOLL_FLOAT32, 4093, 1);
}

static int rank_rsag(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    const hc_cu_api_t *cu = gpu_open(ngpus > 1 ? (rank % j->rpn) % ngpus : 0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    /* AVG of floats is exact only where 1/n is a power of two. */
    const int pow2 = (nranks & (nranks - 1)) == 0;
    int k = 0;
    for (size_t d = 0; d < NDT; d++)
        for (size_t c = 0; c < NCOUNT; c++, k++) {
            int how = k % 3;
            if (how == 1 && hc_dtype_is_float(dts[d]) && !pow2)
                how = 0;
            if (check_rs(comm, cu, stream, rank, nranks, dts[d], counts[c], how, k & 1) ||
                check_ag(comm, cu, stream, rank, nranks, dts[d], counts[c], (k >> 1) & 1))
                return 1;
        }
    if (nranks > 1 && check_rsag_mismatch(comm, cu, stream, rank, nranks))
        return 1;
    HCT_OK(comm, hcoll_comm_destroy(comm));
    cu->stream_destroy(stream);
    return 0;
}

/* A blocking device broadcast has returned before the ranks compare their
 * arguments: a mismatch cannot come back from the call, so it becomes the
 * communicator's async error; the stream is released all the same. */
static int rank_bcast_mismatch_blocking(int rank, int nranks, void *arg)
{
    job_t *j = arg;
    const hc_cu_api_t *cu = gpu_open(0);
    HCT_REQUIRE(cu, "no GPU");
    hcoll_comm_t comm = rank_init(j, rank, nranks);
    HCT_REQUIRE(comm, "init failed");
    void *stream;
    GPU_OK(cu->stream_create(&stream, HC_CU_STREAM_NON_BLOCKING));
    hc_cu_dptr_t d;
    GPU_OK(cu->mem_alloc(&d, 4096));
    void *p = (void *)(uintptr_t)d;
    HCT_OK(comm, hcoll_broadcast(comm, p, p, 1024, HCOLL_FLOAT32, rank, stream));
    GPU_OK(cu->stream_synchronize(stream));
    hcoll_status_t async = HCOLL_SUCCESS;
    for (double t0 = hct_now_ms(); hct_now_ms() - t0 < 20000;) {
        HCT_OK(comm, hcoll_comm_get_async_error(comm, &async));
        if (async != HCOLL_SUCCESS)
            break;
    }
    HCT_REQUIRE(async == HCOLL_ERR_MISMATCH, "rank %d: async error %s", rank,
                hcoll_status_name(async));
    hcoll_comm_destroy(comm); /* may report the failure */
    GPU_OK(cu->mem_free(d));
    cu->stream_destroy(stream);
    return 0;
}

static void run(hct_rank_fn fn, int nranks, int rpn)
{
    shared_t *sh = hct_shared_alloc(sizeof *sh);
    job_t j = { sh, rpn };
    hct_opts_t o = { .nranks = nranks, .ranks_per_node = rpn, .timeout_ms = TIMEOUT_MS };
    hct_result_t res[8];
    int bad = hct_run(&o, fn, &j, res);
    hct_shared_free(sh, sizeof *sh);
    ck_assert_msg(bad == 0, "%d of %d ranks failed (see stderr)", bad, nranks);
}

START_TEST(premul_single)
{
    if (!HCOLL_BUILD_KERNELS) {
        printf("SKIP: premul_single: the single plan scales with hcoll's kernels, not built\n");
        return;
    }
    run(rank_premul, 1, 1);
}
END_TEST
START_TEST(premul_ring_2x1) { run(rank_premul, 2, 1); }
END_TEST

START_TEST(bcast_single) { run(rank_bcast, 1, 1); }
END_TEST
START_TEST(bcast_ring_2x1) { run(rank_bcast, 2, 1); }
END_TEST
START_TEST(bcast_mismatch_blocking) { run(rank_bcast_mismatch_blocking, 2, 1); }
END_TEST
START_TEST(bcast_flat_2_1)
{
    /* Nodes of 2 and 1 ranks: the flat chain over all ranks. */
    run(rank_bcast, 3, 2);
}
END_TEST
START_TEST(bcast_intra_1x2)
{
    if (ngpus < 2) {
        printf("SKIP: bcast_intra_1x2 needs 2 GPUs (NCCL refuses a shared one); %d here\n",
               ngpus);
        return;
    }
    run(rank_bcast, 2, 2);
}
END_TEST
START_TEST(bcast_3stage_2x2)
{
    if (ngpus < 2) {
        printf("SKIP: bcast_3stage_2x2 needs 2 GPUs (NCCL refuses a shared one); %d here\n",
               ngpus);
        return;
    }
    run(rank_bcast, 4, 2);
}
END_TEST

START_TEST(rsag_single) { run(rank_rsag, 1, 1); }
END_TEST
START_TEST(rsag_ring_2x1) { run(rank_rsag, 2, 1); }
END_TEST
START_TEST(rsag_flat_2_1) { run(rank_rsag, 3, 2); }
END_TEST
START_TEST(rsag_intra_1x2)
{
    if (ngpus < 2) {
        printf("SKIP: rsag_intra_1x2 needs 2 GPUs; %d here\n", ngpus);
        return;
    }
    run(rank_rsag, 2, 2);
}
END_TEST
START_TEST(rsag_3stage_2x2)
{
    if (ngpus < 2) {
        printf("SKIP: rsag_3stage_2x2 needs 2 GPUs; %d here\n", ngpus);
        return;
    }
    run(rank_rsag, 4, 2);
}
END_TEST

int main(void)
{
    char why[256];
    ngpus = gpu_probe(why, sizeof why);
    if (ngpus < 1)
        HCT_SKIP_ALL("no GPU: %s", why);
    Suite *s = suite_create("gpu_coll");
    TCase *tc = tcase_create("premul");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, premul_single);
    tcase_add_test(tc, premul_ring_2x1);
    suite_add_tcase(s, tc);
    tc = tcase_create("bcast");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, bcast_single);
    tcase_add_test(tc, bcast_ring_2x1);
    tcase_add_test(tc, bcast_flat_2_1);
    tcase_add_test(tc, bcast_mismatch_blocking);
    tcase_add_test(tc, bcast_intra_1x2);
    tcase_add_test(tc, bcast_3stage_2x2);
    suite_add_tcase(s, tc);
    tc = tcase_create("rsag");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rsag_single);
    tcase_add_test(tc, rsag_ring_2x1);
    tcase_add_test(tc, rsag_flat_2_1);
    tcase_add_test(tc, rsag_intra_1x2);
    tcase_add_test(tc, rsag_3stage_2x2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
