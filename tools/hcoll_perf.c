/*
 * hcoll_perf: nccl-tests' all_reduce_perf for the three-stage pattern.
 * hcoll is driven through its public API (hcoll.h) only; CUDA and NCCL
 * (--mem device, --peer nccl) through the library's run-time loaders
 * (gdr/gdr.h, intra/nccl_api.h), so the binary links neither.
 *
 *   sizes -b..-e ─► per size: check (-c) ─► warm-up (-w) ─► -n timed calls,
 *                   out of place then in place, then the same for --peer
 *                 ─► max of times / sum of #wrong over ranks (a small
 *                   hcoll_allreduce, as nccl-tests uses its own collective)
 *                 ─► rank 0: a row (+ NIC columns, + -p stage split)
 *   end: # Avg bus bandwidth, the NIC verdict on the plateau, -J, --plot
 *
 * Launch: mpirun/srun (rank from the launcher; under Open MPI the unique id
 * travels by MPI_Bcast unless HCOLL_ROOT is set), the library's own env
 * launch (HCOLL_RANK, HCOLL_NRANKS, HCOLL_ROOT, HCOLL_SECRET), or -np N:
 * fork N ranks here with a loopback rendezvous; --ranks-per-node groups
 * them into emulated nodes through HCOLL_HOSTID (and NCCL_HOSTID, so that
 * NCCL, for hcoll's intra-node stages and for --peer nccl, sees the same
 * nodes).
 *
 * --mem device: local rank i uses GPU i mod #GPUs (its primary context) and
 * one non-blocking CUDA stream; every call goes on that stream, a timed
 * batch ends with a stream synchronize, -c fills and reads through host
 * copies. --peer nccl: one flat NCCL communicator over all ranks, its
 * unique id carried by a small hcoll_allreduce.
 *
 * Exit: 0; 1 on an error or a non-zero #wrong; 2 usage; 3 when
 * hcoll_allreduce says HCOLL_ERR_UNSUPPORTED (this library version has no
 * all-reduce yet), so that scripts can tell "not there" from "broken".
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hcoll.h"
#include "gdr/gdr.h"
#include "intra/nccl_api.h"
#include "lib/perf.h"

#ifndef HCOLL_PERF_MPI
#define HCOLL_PERF_MPI 0
#endif
#if HCOLL_PERF_MPI
#include <mpi.h>
#endif

#define EXIT_WRONG 1
#define EXIT_USAGE 2
#define EXIT_UNSUPPORTED 3

typedef struct perf perf_t;

/* A peer implementation timed on the same buffers: MPI or NCCL. */
typedef struct peer_ops {
    const char *name;
    /* 0 ok; -1 with a message in err. */
    int (*allreduce)(perf_t *p, const void *send, void *recv, size_t count, char *err,
                     size_t errlen);
    void (*barrier)(perf_t *p);
    /* Wait until every call issued so far is done; 0 ok, -1 with err.
     * NULL: calls complete before they return (MPI). */
    int (*sync)(perf_t *p, char *err, size_t errlen);
} peer_ops_t;

/* --mem device: this rank's GPU. */
typedef struct perf_gpu {
    const hc_cu_api_t *cu; /* NULL: host memory */
    int ordinal, cudev;
    void *ctx, *stream;
    char busid[32];
} perf_gpu_t;

/* --peer nccl. */
typedef struct perf_nccl {
    const hc_nccl_api_t *nc;
    hc_nccl_comm_t comm;
    int dtype, op;
} perf_nccl_t;

struct perf {
    hp_opts_t o;
    hcoll_comm_t comm;
    int rank, nranks, nodes, local_size;
    int mpi;                 /* MPI_Init was called */
    int async_ok;            /* hcoll_allreduce_async works */
    double line_bps;
    char line_src[200];
    void *send, *recv;       /* host, or device addresses with --mem device */
    void *stage;             /* host copy for -c fills and reads */
    perf_gpu_t gpu;
    perf_nccl_t nccl;
    int64_t *scratch;        /* barrier and cross-rank reductions */
    const peer_ops_t *peer;
    hp_row_t *rows;
    int nrows, caprows;
    int stages_known;        /* the library reported stage times */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------------ */
/* Errors: a benchmark stops at the first one, on every rank                  */
/* ------------------------------------------------------------------------ */

static void finish_mpi(perf_t *p, int abort_code)
{
#if HCOLL_PERF_MPI
    if (p->mpi) {
        if (abort_code)
            MPI_Abort(MPI_COMM_WORLD, abort_code);
        MPI_Finalize();
    }
#else
    (void)p, (void)abort_code;
#endif
}

static void die_status(perf_t *p, const char *what, hcoll_status_t st)
{
    fprintf(stderr, "hcoll_perf: rank %d: %s: %s (%s)\n", p->rank, what, hcoll_status_name(st),
            hcoll_comm_last_error(p->comm));
    int code = st == HCOLL_ERR_UNSUPPORTED ? EXIT_UNSUPPORTED : 1;
    if (st == HCOLL_ERR_UNSUPPORTED && p->rank == 0)
        fprintf(stderr, "hcoll_perf: this libhcoll has no all-reduce yet "
                        "(hcoll_allreduce returns HCOLL_ERR_UNSUPPORTED)\n");
    /* Abort, not destroy: peers may be stuck in a call and must see us go. */
    hcoll_comm_abort(p->comm);
    p->comm = NULL;
    finish_mpi(p, code);
    exit(code);
}

static void die(perf_t *p, const char *fmt, const char *detail)
{
    fprintf(stderr, "hcoll_perf: rank %d: ", p->rank);
    fprintf(stderr, fmt, detail);
    fputc('\n', stderr);
    hcoll_comm_abort(p->comm);
    p->comm = NULL;
    finish_mpi(p, 1);
    exit(1);
}

/* ------------------------------------------------------------------------ */
/* Cross-rank helpers, on hcoll itself                                        */
/* ------------------------------------------------------------------------ */

static void hc_barrier(perf_t *p)
{
    p->scratch[0] = 0;
    hcoll_status_t st = hcoll_allreduce(p->comm, p->scratch, p->scratch, 1, HCOLL_INT64,
                                        HCOLL_SUM, NULL);
    if (st != HCOLL_SUCCESS)
        die_status(p, "hcoll_allreduce (barrier)", st);
}

static void reduce_max(perf_t *p, double *v, size_t n)
{
    hcoll_status_t st = hcoll_allreduce(p->comm, v, v, n, HCOLL_FLOAT64, HCOLL_MAX, NULL);
    if (st != HCOLL_SUCCESS)
        die_status(p, "hcoll_allreduce (max of times)", st);
}

static void reduce_sum(perf_t *p, int64_t *v, size_t n)
{
    hcoll_status_t st = hcoll_allreduce(p->comm, v, v, n, HCOLL_INT64, HCOLL_SUM, NULL);
    if (st != HCOLL_SUCCESS)
        die_status(p, "hcoll_allreduce (sum of #wrong)", st);
}

/* ------------------------------------------------------------------------ */
/* Buffers: host memory, or device memory on this rank's GPU (--mem device)   */
/* ------------------------------------------------------------------------ */

static void cu_die(perf_t *p, const char *what, hc_cu_res_t r)
{
    char eb[200], msg[300];
    snprintf(msg, sizeof msg, "--mem device: %s: %s", what, hc_gdr_cu_errstr(r, eb, sizeof eb));
    die(p, "%s", msg);
}

/* Local rank i on GPU i mod #GPUs, as a job with one GPU per local rank
 * would be placed; the primary context is the one the CUDA runtime of a
 * training framework would use. */
static void gpu_open(perf_t *p)
{
    char why[256] = "";
    perf_gpu_t *g = &p->gpu;
    const hc_cu_api_t *cu = hc_gdr_cu(why, sizeof why);
    if (!cu)
        die(p, "--mem device: no usable CUDA driver: %s", why);
    int ndev = 0, d;
    while (ndev < 1024 && cu->device_get(&d, ndev) == HC_CU_SUCCESS)
        ndev++;
    if (ndev == 0)
        die(p, "%s", "--mem device: the CUDA driver reports no GPU");
    int local = 0;
    hcoll_comm_local_rank(p->comm, &local);
    g->ordinal = local % ndev;
    hc_cu_res_t r;
    if ((r = cu->device_get(&g->cudev, g->ordinal)) != HC_CU_SUCCESS)
        cu_die(p, "cuDeviceGet", r);
    if ((r = cu->primary_retain(&g->ctx, g->cudev)) != HC_CU_SUCCESS)
        cu_die(p, "cuDevicePrimaryCtxRetain", r);
    g->cu = cu; /* from here on, gpu_close releases */
    if ((r = cu->ctx_set_current(g->ctx)) != HC_CU_SUCCESS)
        cu_die(p, "cuCtxSetCurrent", r);
    if ((r = cu->stream_create(&g->stream, HC_CU_STREAM_NON_BLOCKING)) != HC_CU_SUCCESS)
        cu_die(p, "cuStreamCreate", r);
    int cc = 0, dmabuf = 0;
    if (hc_gdr_gpu_info(g->ordinal, g->busid, sizeof g->busid, &cc, &dmabuf) != 0)
        snprintf(g->busid, sizeof g->busid, "?");
}

static void gpu_close(perf_t *p)
{
    perf_gpu_t *g = &p->gpu;
    if (!g->cu)
        return;
    if (g->stream)
        g->cu->stream_destroy(g->stream);
    g->cu->primary_release(g->cudev);
    g->cu = NULL;
}

static void *buf_alloc(perf_t *p, size_t n)
{
    if (!n)
        n = 1;
    if (p->gpu.cu) {
        hc_cu_dptr_t d = 0;
        hc_cu_res_t r = p->gpu.cu->mem_alloc(&d, n);
        if (r != HC_CU_SUCCESS)
            cu_die(p, "cuMemAlloc", r);
        return (void *)(uintptr_t)d;
    }
    void *h = NULL;
    if (posix_memalign(&h, 4096, n) != 0)
        die(p, "%s", "out of memory for the buffers");
    return h;
}

static void buf_free(perf_t *p, void *b)
{
    if (p->gpu.cu && b)
        p->gpu.cu->mem_free((hc_cu_dptr_t)(uintptr_t)b);
    else
        free(b);
}

/* Wait for everything on this rank's stream; nothing to do on the host. */
static void buf_sync(perf_t *p)
{
    if (!p->gpu.cu)
        return;
    hc_cu_res_t r = p->gpu.cu->stream_synchronize(p->gpu.stream);
    if (r != HC_CU_SUCCESS)
        cu_die(p, "cuStreamSynchronize", r);
}

/* n bytes from the host to a benchmark buffer, complete on return. */
static void buf_put(perf_t *p, void *dst, const void *host, size_t n)
{
    if (!p->gpu.cu) {
        memcpy(dst, host, n);
        return;
    }
    hc_cu_res_t r = p->gpu.cu->memcpy_htod_async((hc_cu_dptr_t)(uintptr_t)dst, host, n,
                                                 p->gpu.stream);
    if (r != HC_CU_SUCCESS)
        cu_die(p, "cuMemcpyHtoDAsync", r);
    buf_sync(p);
}

/* n bytes of a benchmark buffer to the host, after everything before. */
static void buf_get(perf_t *p, void *host, const void *src, size_t n)
{
    if (!p->gpu.cu) {
        memcpy(host, src, n);
        return;
    }
    hc_cu_res_t r = p->gpu.cu->memcpy_dtoh_async(host, (hc_cu_dptr_t)(uintptr_t)src, n,
                                                 p->gpu.stream);
    if (r != HC_CU_SUCCESS)
        cu_die(p, "cuMemcpyDtoHAsync", r);
    buf_sync(p);
}

/* ------------------------------------------------------------------------ */
/* Per-stage times                                                            */
/* ------------------------------------------------------------------------ */

/*
 * The intra RS / inter / intra AG times of the last all-reduce on comm (or
 * of req, when given), in microseconds on this rank; the one place that
 * asks the library. Returns 0 with us_out filled, -1 when unknown.
 */
static int stage_times_last(hcoll_comm_t comm, hcoll_request_t req, double us_out[HP_NSTAGES])
{
    hcoll_stage_times_t t;
    hcoll_status_t st = req ? hcoll_request_stage_times(req, &t)
                            : hcoll_comm_last_stage_times(comm, &t);
    if (st != HCOLL_SUCCESS)
        return -1;
    us_out[HP_STAGE_RS] = t.intra_rs_us;
    us_out[HP_STAGE_INTER] = t.inter_us;
    us_out[HP_STAGE_AG] = t.intra_ag_us;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* hcoll                                                                      */
/* ------------------------------------------------------------------------ */

/* Enqueue one call (device memory) or run it (host memory). */
static void hcoll_issue(perf_t *p, const void *s, void *r, size_t count)
{
    hcoll_status_t st = hcoll_allreduce(p->comm, s, r, count, p->o.dtype, p->o.op,
                                        p->gpu.stream);
    if (st != HCOLL_SUCCESS)
        die_status(p, "hcoll_allreduce", st);
}

/* One call, complete on return. */
static void hcoll_call(perf_t *p, const void *s, void *r, size_t count)
{
    hcoll_issue(p, s, r, count);
    buf_sync(p);
}

static void add_stage_times(perf_t *p, double st_us[HP_NSTAGES], int *st_n)
{
    double us[HP_NSTAGES];
    if (st_us && stage_times_last(p->comm, NULL, us) == 0) {
        for (int k = 0; k < HP_NSTAGES; k++)
            st_us[k] += us[k];
        ++*st_n;
    }
}

/* Seconds per call, this rank; stage times summed into st_us when asked. */
static double hcoll_time(perf_t *p, const void *s, void *r, size_t count, int iters,
                         double st_us[HP_NSTAGES], int *st_n)
{
    hc_barrier(p);
    double t0 = now_s();
    if (p->gpu.cu) {
        /* Device memory: calls go on the stream as nccl-tests issues them;
         * -z 1 waits for each. Stage times: of a call near the end of the
         * batch (the library writes them as each call's host stage ends). */
        for (int i = 0; i < iters; i++) {
            hcoll_issue(p, s, r, count);
            if (p->o.blocking)
                buf_sync(p);
        }
        buf_sync(p);
        double t = (now_s() - t0) / iters;
        add_stage_times(p, st_us, st_n);
        return t;
    }
    if (p->o.blocking || !p->async_ok) {
        for (int i = 0; i < iters; i++) {
            hcoll_call(p, s, r, count);
            add_stage_times(p, st_us, st_n);
        }
        return (now_s() - t0) / iters;
    }
    /* nccl-tests' default: issue every call, then wait for all of them. */
    hcoll_request_t *reqs = calloc((size_t)iters, sizeof *reqs);
    if (!reqs)
        die(p, "%s", "out of memory for requests");
    for (int i = 0; i < iters; i++) {
        hcoll_status_t st = hcoll_allreduce_async(p->comm, s, r, count, p->o.dtype, p->o.op,
                                                  NULL, &reqs[i]);
        if (st == HCOLL_ERR_UNSUPPORTED && i == 0) {
            /* Same answer on every rank: nothing was started anywhere. */
            free(reqs);
            p->async_ok = 0;
            if (p->rank == 0)
                printf("# -z 0: hcoll_allreduce_async is not supported by this library; "
                       "timing blocking calls instead\n");
            return hcoll_time(p, s, r, count, iters, st_us, st_n);
        }
        if (st != HCOLL_SUCCESS)
            die_status(p, "hcoll_allreduce_async", st);
    }
    for (int i = 0; i < iters; i++) {
        hcoll_status_t st = hcoll_wait(reqs[i]);
        if (st != HCOLL_SUCCESS)
            die_status(p, "hcoll_wait", st);
    }
    double t = (now_s() - t0) / iters;
    for (int i = 0; i < iters; i++) {
        double us[HP_NSTAGES];
        if (st_us && stage_times_last(p->comm, reqs[i], us) == 0) {
            for (int k = 0; k < HP_NSTAGES; k++)
                st_us[k] += us[k];
            ++*st_n;
        }
        hcoll_request_free(reqs[i]);
    }
    free(reqs);
    return t;
}

/* ------------------------------------------------------------------------ */
/* Peers                                                                      */
/* ------------------------------------------------------------------------ */

#if HCOLL_PERF_MPI
static int mpi_types(hcoll_dtype_t t, hcoll_op_t op, MPI_Datatype *dt, MPI_Op *mop)
{
    switch (t) {
    case HCOLL_FLOAT32: *dt = MPI_FLOAT; break;
    case HCOLL_FLOAT64: *dt = MPI_DOUBLE; break;
    case HCOLL_INT8: *dt = MPI_INT8_T; break;
    case HCOLL_UINT8: *dt = MPI_UINT8_T; break;
    case HCOLL_INT32: *dt = MPI_INT32_T; break;
    case HCOLL_INT64: *dt = MPI_INT64_T; break;
    default: return -1; /* MPI has no half types */
    }
    switch (op) {
    case HCOLL_SUM: *mop = MPI_SUM; break;
    case HCOLL_PROD: *mop = MPI_PROD; break;
    case HCOLL_MAX: *mop = MPI_MAX; break;
    case HCOLL_MIN: *mop = MPI_MIN; break;
    default: return -1; /* no MPI_AVG */
    }
    return 0;
}

static int mpi_allreduce(perf_t *p, const void *s, void *r, size_t count, char *err,
                         size_t errlen)
{
    MPI_Datatype dt;
    MPI_Op op;
    if (mpi_types(p->o.dtype, p->o.op, &dt, &op) != 0) {
        snprintf(err, errlen, "MPI has no %s %s", hcoll_dtype_name(p->o.dtype),
                 hcoll_op_name(p->o.op));
        return -1;
    }
    if (count > INT_MAX) {
        snprintf(err, errlen, "MPI_Allreduce: count %zu exceeds INT_MAX", count);
        return -1;
    }
    int rc = MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, (int)count, dt, op, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        int len = 0;
        char msg[MPI_MAX_ERROR_STRING];
        MPI_Error_string(rc, msg, &len);
        snprintf(err, errlen, "MPI_Allreduce: %s", msg);
        return -1;
    }
    return 0;
}

static void mpi_barrier(perf_t *p)
{
    (void)p;
    MPI_Barrier(MPI_COMM_WORLD);
}

static const peer_ops_t mpi_peer = { "mpi", mpi_allreduce, mpi_barrier, NULL };
#endif

/*
 * NCCL on one flat communicator over all ranks, on this rank's GPU and
 * stream. Rank 0's unique id reaches the others inside an int64 SUM
 * all-reduce in which every other rank adds zeros: exact, and it needs no
 * MPI. Set-up is non-blocking, polled against a deadline, so that a rank
 * that cannot join makes the others fail instead of hang.
 */
#define NCCL_PEER_INIT_S 120.0

static int nccl_settle(perf_t *p, hc_nccl_res_t r, const char *what, char *err, size_t errlen)
{
    const hc_nccl_api_t *nc = p->nccl.nc;
    double deadline = now_s() + NCCL_PEER_INIT_S;
    while (r == HC_NCCL_IN_PROGRESS && now_s() < deadline) {
        struct timespec ts = { 0, 200000 };
        nanosleep(&ts, NULL);
        if (nc->get_async_error(p->nccl.comm, &r) != HC_NCCL_SUCCESS)
            break;
    }
    if (r == HC_NCCL_SUCCESS)
        return 0;
    snprintf(err, errlen, "--peer nccl: %s: %s", what,
             r == HC_NCCL_IN_PROGRESS ? "no answer within the deadline" : nc->err_string(r));
    return -1;
}

static int nccl_allreduce(perf_t *p, const void *s, void *r, size_t count, char *err,
                          size_t errlen)
{
    const hc_nccl_api_t *nc = p->nccl.nc;
    hc_nccl_res_t res = nc->all_reduce(s, r, count, p->nccl.dtype, p->nccl.op, p->nccl.comm,
                                       p->gpu.stream);
    /* A non-blocking communicator may answer "in progress": the call is on
     * the stream only once it settles, and the next call waits for that. */
    return nccl_settle(p, res, "ncclAllReduce", err, errlen);
}

static int nccl_sync(perf_t *p, char *err, size_t errlen)
{
    hc_cu_res_t r = p->gpu.cu->stream_synchronize(p->gpu.stream);
    if (r != HC_CU_SUCCESS) {
        char eb[200];
        snprintf(err, errlen, "--peer nccl: cuStreamSynchronize: %s",
                 hc_gdr_cu_errstr(r, eb, sizeof eb));
        return -1;
    }
    hc_nccl_res_t a = HC_NCCL_SUCCESS;
    p->nccl.nc->get_async_error(p->nccl.comm, &a);
    if (a != HC_NCCL_SUCCESS && a != HC_NCCL_IN_PROGRESS) {
        snprintf(err, errlen, "--peer nccl: asynchronous error: %s", p->nccl.nc->err_string(a));
        return -1;
    }
    return 0;
}

static const peer_ops_t nccl_peer = { "nccl", nccl_allreduce, hc_barrier, nccl_sync };

/* Collective over hcoll: every rank ends with the NCCL communicator, or
 * every rank stops with a message (rank 0 says why when it knows). */
static void peer_nccl_open(perf_t *p)
{
    char why[300] = "", load[200] = "";
    perf_nccl_t *n = &p->nccl;
    n->nc = hc_nccl_api(load, sizeof load);
    n->dtype = hc_nccl_dtype(p->o.dtype);
    n->op = hc_nccl_op(p->o.op, 0);
    /* [0..15] the unique id, [16] ranks that cannot go on. */
    int64_t x[HC_NCCL_UNIQUE_ID_BYTES / 8 + 1];
    memset(x, 0, sizeof x);
    if (!n->nc)
        snprintf(why, sizeof why, "--peer nccl: %s", load);
    else if (n->dtype < 0 || n->op < 0)
        snprintf(why, sizeof why, "--peer nccl: NCCL has no %s %s", hcoll_dtype_name(p->o.dtype),
                 hcoll_op_name(p->o.op));
    else if (p->rank == 0) {
        hc_nccl_res_t r = n->nc->get_unique_id((hc_nccl_uid_t *)(void *)x);
        if (r != HC_NCCL_SUCCESS)
            snprintf(why, sizeof why, "--peer nccl: ncclGetUniqueId: %s", n->nc->err_string(r));
    }
    x[HC_NCCL_UNIQUE_ID_BYTES / 8] = why[0] != '\0';
    reduce_sum(p, x, sizeof x / sizeof x[0]);
    if (x[HC_NCCL_UNIQUE_ID_BYTES / 8])
        die(p, "%s", why[0] ? why : "--peer nccl: another rank cannot use NCCL (see its message)");

    hc_nccl_config_t cfg;
    hc_nccl_config_init(&cfg, 0);
    hc_nccl_uid_t id;
    memcpy(&id, x, sizeof id);
    hc_nccl_res_t r = n->nc->init_rank_config(&n->comm, p->nranks, id, p->rank, &cfg);
    int bad = nccl_settle(p, r, "ncclCommInitRankConfig (every rank needs a GPU of its own)",
                          why, sizeof why) != 0;
    int64_t fails[1] = { bad };
    reduce_sum(p, fails, 1);
    if (fails[0]) {
        if (n->comm)
            n->nc->abort(n->comm);
        n->comm = NULL;
        die(p, "%s", bad ? why : "--peer nccl: another rank failed to join NCCL");
    }
    p->peer = &nccl_peer;
}

static void peer_nccl_close(perf_t *p)
{
    perf_nccl_t *n = &p->nccl;
    if (!n->comm)
        return;
    char err[300];
    if (nccl_settle(p, n->nc->finalize(n->comm), "ncclCommFinalize", err, sizeof err) == 0)
        n->nc->destroy(n->comm);
    else
        n->nc->abort(n->comm);
    n->comm = NULL;
}

/* Seconds per call of the peer, this rank. */
static double peer_time(perf_t *p, const void *s, void *r, size_t count, int iters)
{
    char err[300];
    p->peer->barrier(p);
    double t0 = now_s();
    for (int i = 0; i < iters; i++) {
        if (p->peer->allreduce(p, s, r, count, err, sizeof err) != 0)
            die(p, "%s", err);
        if (p->o.blocking && p->peer->sync && p->peer->sync(p, err, sizeof err) != 0)
            die(p, "%s", err);
    }
    if (p->peer->sync && p->peer->sync(p, err, sizeof err) != 0)
        die(p, "%s", err);
    return (now_s() - t0) / iters;
}

static void peer_call(perf_t *p, const void *s, void *r, size_t count)
{
    char err[300];
    if (p->peer->allreduce(p, s, r, count, err, sizeof err) != 0 ||
        (p->peer->sync && p->peer->sync(p, err, sizeof err) != 0))
        die(p, "%s", err);
}

/* ------------------------------------------------------------------------ */
/* One size                                                                   */
/* ------------------------------------------------------------------------ */

typedef void (*call_fn)(perf_t *p, const void *s, void *r, size_t count);

/* -c checked calls, out of place and in place; #wrong on this rank. */
static void run_check(perf_t *p, call_fn call, size_t count, int64_t wrong[2])
{
    size_t bytes = count * hcoll_dtype_size(p->o.dtype);
    wrong[0] = wrong[1] = 0;
    const hcoll_dtype_t dt = p->o.dtype;
    const hcoll_op_t op = p->o.op;
    for (int c = 0; c < p->o.check; c++) {
        /* Filled and read through p->stage, so device memory works too. */
        hp_check_fill(p->stage, count, dt, op, p->rank, p->nranks);
        buf_put(p, p->send, p->stage, bytes);
        memset(p->stage, 0xa5, bytes); /* a result never written shows as wrong */
        buf_put(p, p->recv, p->stage, bytes);
        call(p, p->send, p->recv, count);
        buf_get(p, p->stage, p->recv, bytes);
        wrong[0] += (int64_t)hp_check_count_wrong(p->stage, count, dt, op, p->nranks);
        hp_check_fill(p->stage, count, dt, op, p->rank, p->nranks);
        buf_put(p, p->recv, p->stage, bytes);
        call(p, p->recv, p->recv, count);
        buf_get(p, p->stage, p->recv, bytes);
        wrong[1] += (int64_t)hp_check_count_wrong(p->stage, count, dt, op, p->nranks);
    }
}

static hp_row_t *row_new(perf_t *p, const char *impl, uint64_t bytes, size_t count)
{
    if (p->nrows == p->caprows) {
        p->caprows = p->caprows ? 2 * p->caprows : 64;
        hp_row_t *n = realloc(p->rows, (size_t)p->caprows * sizeof *n);
        if (!n)
            die(p, "%s", "out of memory for rows");
        p->rows = n;
    }
    hp_row_t *r = &p->rows[p->nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->impl, sizeof r->impl, "%s", impl);
    r->bytes = bytes;
    r->count = count;
    r->dtype = p->o.dtype;
    r->op = p->o.op;
    r->ratio = -1;
    return r;
}

static void fmt_time(char *b, size_t n, double us)
{
    snprintf(b, n, us >= 10000 ? "%.0f" : "%.2f", us);
}

static void print_result(const hp_result_t *r)
{
    char t[32], w[32];
    fmt_time(t, sizeof t, r->time_us);
    if (r->wrong >= 0)
        snprintf(w, sizeof w, "%lld", (long long)r->wrong);
    else
        snprintf(w, sizeof w, "N/A");
    printf("  %9s  %7.2f  %7.2f  %6s", t, r->algbw, r->busbw, w);
}

static void print_row(const perf_t *p, const hp_row_t *r)
{
    printf("%12llu  %12zu  %8s  %6s  %5s", (unsigned long long)r->bytes, r->count,
           hcoll_dtype_name(r->dtype), hcoll_op_name(r->op), r->impl);
    print_result(&r->oop);
    print_result(&r->ip);
    char nic[32] = "-", pct[32] = "-";
    if (r->nic_gbs >= 0)
        snprintf(nic, sizeof nic, "%.2f", r->nic_gbs);
    if (r->nic_pct >= 0)
        snprintf(pct, sizeof pct, "%.1f", r->nic_pct);
    printf("  %7s  %6s", nic, pct);
    if (p->o.stages) {
        /* A stage the library did not time (< 0) shows '-', and then no
         * split is given. */
        char us[HP_NSTAGES][16], pc[HP_NSTAGES][16];
        double sum = 0;
        int all = r->have_stages;
        for (int k = 0; k < HP_NSTAGES; k++) {
            if (r->have_stages && r->stage_us[k] >= 0) {
                snprintf(us[k], sizeof us[k], "%.1f", r->stage_us[k]);
                sum += r->stage_us[k];
            } else {
                snprintf(us[k], sizeof us[k], "-");
                all = 0;
            }
        }
        for (int k = 0; k < HP_NSTAGES; k++) {
            if (all)
                snprintf(pc[k], sizeof pc[k], "%.1f", 100 * r->stage_us[k] / (sum > 0 ? sum : 1));
            else
                snprintf(pc[k], sizeof pc[k], "-");
        }
        printf("  %8s %8s %8s  %5s %5s %5s", us[0], us[1], us[2], pc[0], pc[1], pc[2]);
    }
    if (p->peer) {
        if (r->ratio >= 0)
            printf("  %9.2f", r->ratio);
        else
            printf("  %9s", "-");
    }
    putchar('\n');
    fflush(stdout);
}

static void print_header(const perf_t *p)
{
    printf("#\n#%50s  %-35s  %-35s  %-15s", "", "out-of-place", "in-place", "NIC");
    if (p->o.stages)
        printf("  %-45s", "stages: intra RS / inter / intra AG");
    printf("\n#%11s  %12s  %8s  %6s  %5s", "size", "count", "type", "redop", "impl");
    for (int k = 0; k < 2; k++)
        printf("  %9s  %7s  %7s  %6s", "time", "algbw", "busbw", "#wrong");
    printf("  %7s  %6s", "nicbw", "%line");
    if (p->o.stages)
        printf("  %8s %8s %8s  %5s %5s %5s", "rs", "inter", "ag", "rs%", "int%", "ag%");
    if (p->peer)
        printf("  %9s", "hcoll/peer");
    printf("\n#%11s  %12s  %8s  %6s  %5s", "(B)", "(elements)", "", "", "");
    for (int k = 0; k < 2; k++)
        printf("  %9s  %7s  %7s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
    printf("  %7s  %6s", "(GB/s)", "");
    if (p->o.stages)
        printf("  %8s %8s %8s  %5s %5s %5s", "(us)", "(us)", "(us)", "", "", "");
    if (p->peer)
        printf("  %9s", "(busbw)");
    printf("\n");
}

static double best_busbw(const hp_row_t *r)
{
    return r->oop.busbw > r->ip.busbw ? r->oop.busbw : r->ip.busbw;
}

static void run_size(perf_t *p, uint64_t bytes)
{
    size_t count = bytes / hcoll_dtype_size(p->o.dtype);
    int checked = p->o.check > 0 && hp_check_exact(p->o.dtype, p->o.op, p->nranks);
    /* [0..1] hcoll oop/ip, [2..4] stages, [5..6] peer oop/ip; max over ranks */
    double t[7] = { 0 };
    int64_t w[4] = { 0 };
    double st_us[HP_NSTAGES] = { 0 };
    int st_n = 0;

    if (checked)
        run_check(p, hcoll_call, count, w);
    for (int i = 0; i < p->o.warmup; i++)
        hcoll_call(p, p->send, p->recv, count);
    t[0] = hcoll_time(p, p->send, p->recv, count, p->o.iters, p->o.stages ? st_us : NULL, &st_n);
    for (int i = 0; i < p->o.warmup; i++)
        hcoll_call(p, p->recv, p->recv, count);
    t[1] = hcoll_time(p, p->recv, p->recv, count, p->o.iters, NULL, NULL);
    for (int k = 0; k < HP_NSTAGES; k++)
        t[2 + k] = st_n ? st_us[k] / st_n : -1;

    if (p->peer) {
        if (checked)
            run_check(p, peer_call, count, w + 2);
        for (int i = 0; i < p->o.warmup; i++)
            peer_call(p, p->send, p->recv, count);
        t[5] = peer_time(p, p->send, p->recv, count, p->o.iters);
        for (int i = 0; i < p->o.warmup; i++)
            peer_call(p, p->recv, p->recv, count);
        t[6] = peer_time(p, p->recv, p->recv, count, p->o.iters);
    }

    reduce_max(p, t, 7);
    reduce_sum(p, w, 4);

    hp_row_t *h = row_new(p, "hcoll", bytes, count);
    hp_result_fill(&h->oop, (double)bytes, t[0] * 1e6, p->nranks, checked ? w[0] : -1);
    hp_result_fill(&h->ip, (double)bytes, t[1] * 1e6, p->nranks, checked ? w[1] : -1);
    hp_row_nic(h, p->nodes, p->local_size, p->line_bps);
    h->have_stages = t[3] >= 0; /* the inter stage is always timed when any is */
    for (int k = 0; k < HP_NSTAGES; k++)
        h->stage_us[k] = t[2 + k];
    if (h->have_stages)
        p->stages_known = 1;
    if (p->rank == 0)
        print_row(p, h);
    if (p->peer) {
        hp_row_t *q = row_new(p, p->peer->name, bytes, count);
        h = q - 1; /* rows may have moved */
        hp_result_fill(&q->oop, (double)bytes, t[5] * 1e6, p->nranks, checked ? w[2] : -1);
        hp_result_fill(&q->ip, (double)bytes, t[6] * 1e6, p->nranks, checked ? w[3] : -1);
        hp_row_nic(q, p->nodes, p->local_size, p->line_bps);
        q->ratio = best_busbw(q) > 0 ? best_busbw(h) / best_busbw(q) : -1;
        if (p->rank == 0)
            print_row(p, q);
    }
}

/* ------------------------------------------------------------------------ */
/* After the table                                                            */
/* ------------------------------------------------------------------------ */

static const char *print_verdict(const perf_t *p, double *pct_out)
{
    double pct, nic, bus;
    uint64_t from;
    char sz[64];
    *pct_out = -1;
    if (hp_plateau(p->rows, p->nrows, "hcoll", &pct, &nic, &bus, &from) == 0)
        return "unknown";
    hp_format_bytes((double)from, 0, sz, sizeof sz);
    printf("#\n# NIC verdict (plateau: %s%s):\n", from >= HP_PLATEAU_BYTES ? "sizes >= " : "",
           from >= HP_PLATEAU_BYTES ? sz : strcat(sz, ", the largest size run"));
    if (p->nodes <= 1) {
        printf("#   none: all %d ranks are on one node, nothing crosses a NIC "
               "(--ranks-per-node emulates nodes)\n", p->nranks);
        return "unknown";
    }
    if (pct < 0) {
        printf("#   unknown: NIC bandwidth %.2f GB/s per NIC, but the line rate is %s; "
               "give --line-rate\n", nic, p->line_src);
        return "unknown";
    }
    hp_verdict_t v = hp_verdict_of(pct);
    printf("#   NIC bandwidth %.2f GB/s per NIC = %.1f%% of the line rate %.2f GB/s (%s)\n", nic,
           pct, p->line_bps / 1e9, p->line_src);
    printf("#   %s (%s)\n", hp_verdict_name(v), hp_verdict_range(v));
    if (v == HP_VERDICT_PROBLEM || v == HP_VERDICT_POOR) {
        printf("#   the usual suspects:\n");
        const char *s = hp_verdict_suspects();
        while (*s) {
            size_t n = strcspn(s, "\n");
            printf("# %.*s\n", (int)n, s);
            s += n + (s[n] == '\n');
        }
    }
    *pct_out = pct;
    return hp_verdict_name(v);
}

static int write_plot(const perf_t *p, const char *png)
{
    char dir[] = "/tmp/hcoll_perf_plot.XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "hcoll_perf: --plot: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    const char *impls[2] = { "hcoll", p->peer ? p->peer->name : NULL };
    char path[2][256];
    for (int k = 0; k < 2 && impls[k]; k++) {
        snprintf(path[k], sizeof path[k], "%s/%s.dat", dir, impls[k]);
        FILE *f = fopen(path[k], "w");
        if (!f)
            return -1;
        for (int i = 0; i < p->nrows; i++)
            if (strcmp(p->rows[i].impl, impls[k]) == 0)
                fprintf(f, "%llu %g %g\n", (unsigned long long)p->rows[i].bytes,
                        best_busbw(&p->rows[i]),
                        p->rows[i].nic_pct >= 0 ? p->rows[i].nic_pct : NAN);
        fclose(f);
    }
    char script[256];
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    FILE *g = fopen(script, "w");
    if (!g)
        return -1;
    fprintf(g, "set terminal png size 1000,600 noenhanced\nset output '%s'\n", png);
    fprintf(g, "set title 'hcoll_perf: %d ranks, %d nodes x %d, %s %s'\n", p->nranks, p->nodes,
            p->local_size, hcoll_dtype_name(p->o.dtype), hcoll_op_name(p->o.op));
    fprintf(g, "set logscale x 2\nset format x '%%.0b %%BB'\nset xlabel 'size'\nset ylabel 'busbw (GB/s)'\n"
               "set y2label 'NIC %% of line rate'\nset y2tics\nset ytics nomirror\n"
               "set key top left\nset grid\nset datafile missing 'nan'\n");
    fprintf(g, "plot '%s' u 1:2 w lp t 'hcoll busbw', '%s' u 1:3 axes x1y2 w lp t 'hcoll NIC %%'",
            path[0], path[0]);
    if (impls[1])
        fprintf(g, ", '%s' u 1:2 w lp t '%s busbw', '%s' u 1:3 axes x1y2 w lp t '%s NIC %%'",
                path[1], impls[1], path[1], impls[1]);
    fprintf(g, "\n");
    fclose(g);
    pid_t pid = fork();
    if (pid == 0) {
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        fprintf(stderr, "hcoll_perf: --plot: cannot run gnuplot (%s); install gnuplot-nox\n",
                strerror(errno));
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "hcoll_perf: --plot: gnuplot failed; data and script kept in %s\n", dir);
        return -1;
    }
    unlink(path[0]);
    if (impls[1])
        unlink(path[1]);
    unlink(script);
    rmdir(dir);
    printf("# plot: %s\n", png);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* One rank                                                                   */
/* ------------------------------------------------------------------------ */

/* This process's rank as its launcher tells it, before any init; -1. */
static int launcher_rank(void)
{
    static const char *vars[] = { "HCOLL_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                  "SLURM_PROCID", "RANK" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        int r;
        if (v && hp_parse_int(v, 0, INT_MAX, &r) == 0)
            return r;
    }
    return -1;
}

#if HCOLL_PERF_MPI
static int under_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}
#endif

static void comm_create(perf_t *p)
{
    hcoll_status_t st;
#if HCOLL_PERF_MPI
    if (p->mpi && !getenv("HCOLL_RANK") && !getenv("HCOLL_ROOT") && !getenv("MASTER_ADDR")) {
        /* The usual MPI way: rank 0's unique id, broadcast. */
        int rank, size;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        p->rank = rank;
        hcoll_unique_id_t id;
        memset(&id, 0, sizeof id);
        int ok = 1;
        if (rank == 0 && (st = hcoll_get_unique_id(&id)) != HCOLL_SUCCESS) {
            fprintf(stderr, "hcoll_perf: hcoll_get_unique_id: %s (%s)\n", hcoll_status_name(st),
                    hcoll_comm_last_error(NULL));
            ok = 0;
        }
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!ok)
            MPI_Abort(MPI_COMM_WORLD, 1);
        MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        st = hcoll_comm_init(&p->comm, size, rank, &id, NULL);
        goto done;
    }
#endif
    st = hcoll_comm_init_env(&p->comm, NULL);
#if HCOLL_PERF_MPI
done:
#endif
    if (st != HCOLL_SUCCESS) {
        fprintf(stderr, "hcoll_perf: rank %d: hcoll_comm_init: %s (%s)\n", launcher_rank(),
                hcoll_status_name(st), hcoll_comm_last_error(NULL));
        if (launcher_rank() < 0)
            fprintf(stderr, "hcoll_perf: no launcher found: use -np N on one host, or run "
                            "under mpirun/srun/torchrun, or set HCOLL_RANK, HCOLL_NRANKS, "
                            "HCOLL_ROOT and HCOLL_SECRET\n");
        finish_mpi(p, 1);
        exit(1);
    }
}

static int rank_main(const hp_opts_t *o)
{
    perf_t P, *p = &P;
    memset(p, 0, sizeof *p);
    p->o = *o;
    p->async_ok = 1;
    p->rank = launcher_rank();

#if HCOLL_PERF_MPI
    if (under_mpirun() && !getenv("HCOLL_PERF_CHILD")) {
        MPI_Init(NULL, NULL);
        p->mpi = 1;
        if (o->peer == HP_PEER_MPI) {
            MPI_Datatype dt;
            MPI_Op mop;
            if (mpi_types(o->dtype, o->op, &dt, &mop) != 0) {
                fprintf(stderr, "hcoll_perf: --peer mpi: MPI has no %s/%s; use another -d/-o\n",
                        hcoll_dtype_name(o->dtype), hcoll_op_name(o->op));
                finish_mpi(p, 0);
                return EXIT_USAGE;
            }
            p->peer = &mpi_peer;
        }
    }
#endif
    if (o->peer == HP_PEER_MPI && !p->peer) {
        fprintf(stderr, "hcoll_perf: --peer mpi: %s\n",
                HCOLL_PERF_MPI ? "not running under mpirun (MPI must launch the ranks)"
                               : "this hcoll_perf was built without MPI (install Open MPI's "
                                 "mpicc and rebuild)");
        return EXIT_USAGE;
    }
    if (o->ranks_per_node > 0 && !getenv("HCOLL_PERF_CHILD")) {
        int r = launcher_rank();
#if HCOLL_PERF_MPI
        if (p->mpi)
            MPI_Comm_rank(MPI_COMM_WORLD, &r);
#endif
        if (r < 0) {
            fprintf(stderr, "hcoll_perf: --ranks-per-node: no rank from a launcher "
                            "(HCOLL_RANK, mpirun, srun, torchrun); or use -np\n");
            finish_mpi(p, 0);
            return EXIT_USAGE;
        }
        char host[64];
        snprintf(host, sizeof host, "hcoll-perf-node%d", r / o->ranks_per_node);
        setenv("HCOLL_HOSTID", host, 1);
        setenv("NCCL_HOSTID", host, 1);
    }

    comm_create(p);
    hcoll_comm_rank(p->comm, &p->rank);
    hcoll_comm_size(p->comm, &p->nranks);
    hcoll_comm_local_size(p->comm, &p->local_size);
    hcoll_comm_node_count(p->comm, &p->nodes);
    if (p->rank == 0 && hp_line_rate_resolve(o->line_rate, getenv("HCOLL_SOCKET_IFNAME"), "/sys",
                                             1, &p->line_bps, p->line_src,
                                             sizeof p->line_src) != 0)
        p->line_bps = 0;

    size_t max = (size_t)o->maxbytes;
    if (posix_memalign(&p->stage, 4096, max ? max : 1) ||
        posix_memalign((void **)&p->scratch, 64, 64))
        die(p, "%s", "out of memory for the buffers");
    if (o->mem == HP_MEM_DEVICE)
        gpu_open(p);
    p->send = buf_alloc(p, max);
    p->recv = buf_alloc(p, max);
    memset(p->stage, 0, max);
    buf_put(p, p->send, p->stage, max);
    buf_put(p, p->recv, p->stage, max);
    if (o->peer == HP_PEER_NCCL)
        peer_nccl_open(p);

    if (p->rank == 0) {
        printf("# hcoll_perf (hcoll %s): %d ranks, %d nodes x %d ranks/node, %s %s, -n %d -w %d "
               "-c %d -z %d\n",
               HCOLL_VERSION_STRING, p->nranks, p->nodes, p->local_size,
               hcoll_dtype_name(o->dtype), hcoll_op_name(o->op), o->iters, o->warmup, o->check,
               o->blocking);
        if (p->gpu.cu)
            printf("# buffers: device memory; local rank i on GPU i mod #GPUs (rank 0: GPU %d, "
                   "%s), one CUDA stream per rank\n", p->gpu.ordinal, p->gpu.busid);
        if (p->line_bps > 0)
            printf("# line rate: %.2f GB/s per NIC (%s)\n", p->line_bps / 1e9, p->line_src);
        else
            printf("# line rate: %s\n", p->line_src);
        if (o->check > 0 && !hp_check_exact(o->dtype, o->op, p->nranks))
            printf("# -c: %d ranks is too many for exact %s %s values: #wrong not checked\n",
                   p->nranks, hcoll_dtype_name(o->dtype), hcoll_op_name(o->op));
        if (p->peer)
            printf("# peer: %s on one flat communicator over all %d ranks, same buffers, "
                   "alternating with hcoll per size\n", p->peer->name, p->nranks);
        print_header(p);
    }

    for (uint64_t b = hp_next_size(o, 0); b; b = hp_next_size(o, b))
        run_size(p, b);

    int rc = 0;
    if (p->rank == 0) {
        int64_t wrong = 0;
        for (int i = 0; i < p->nrows; i++)
            wrong += (p->rows[i].oop.wrong > 0 ? p->rows[i].oop.wrong : 0) +
                     (p->rows[i].ip.wrong > 0 ? p->rows[i].ip.wrong : 0);
        printf("# Out of bounds values : %lld %s\n", (long long)wrong, wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n", hp_avg_busbw(p->rows, p->nrows, "hcoll"));
        if (p->peer)
            printf("# Avg bus bandwidth (%s) : %g\n", p->peer->name,
                   hp_avg_busbw(p->rows, p->nrows, p->peer->name));
        if (o->stages && !p->stages_known)
            printf("# -p: this library does not report per-stage times yet ('-')\n");
        double pct;
        const char *verdict = print_verdict(p, &pct);
        printf("#\n");
        if (wrong)
            rc = EXIT_WRONG;
        if (o->json) {
            hp_meta_t m = { p->nranks, p->nodes, p->local_size, p->line_bps, p->line_src,
                            verdict, pct };
            FILE *f = fopen(o->json, "w");
            if (!f || hp_json_write(f, &m, p->rows, p->nrows) != 0) {
                fprintf(stderr, "hcoll_perf: -J %s: %s\n", o->json, strerror(errno));
                rc = 1;
            }
            if (f && fclose(f) != 0)
                rc = 1;
        }
        if (o->plot && write_plot(p, o->plot) != 0)
            rc = 1;
    }
    fflush(stdout);
    /* Every rank learns rank 0's verdict on #wrong, so the exit codes agree. */
    int64_t agree[1] = { rc };
    reduce_sum(p, agree, 1);
    rc = agree[0] ? (p->rank == 0 ? rc : EXIT_WRONG) : 0;

    peer_nccl_close(p);
    hcoll_comm_destroy(p->comm);
    finish_mpi(p, 0);
    buf_free(p, p->send);
    buf_free(p, p->recv);
    gpu_close(p);
    free(p->stage);
    free(p->scratch);
    free(p->rows);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* -np: launch the ranks here                                                 */
/* ------------------------------------------------------------------------ */

static int free_loopback_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

static int launch(const hp_opts_t *o)
{
    int n = o->np;
    int port = free_loopback_port();
    unsigned char rnd[16];
    char secret[33], root[32], buf[64];
    if (port < 0 || getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        fprintf(stderr, "hcoll_perf: -np: no loopback port or random secret: %s\n",
                strerror(errno));
        return 1;
    }
    for (int i = 0; i < 16; i++)
        snprintf(secret + 2 * i, 3, "%02x", rnd[i]);
    snprintf(root, sizeof root, "127.0.0.1:%d", port);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    int *done = calloc((size_t)n, sizeof *done);
    int *codes = calloc((size_t)n, sizeof *codes);
    if (!pids || !done || !codes)
        return 1;
    fflush(stdout);
    fflush(stderr);
    pid_t me = getpid();
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            fprintf(stderr, "hcoll_perf: fork: %s\n", strerror(errno));
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGKILL);
            return 1;
        }
        if (pids[r] == 0) {
            snprintf(buf, sizeof buf, "%d", r);
            setenv("HCOLL_RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", n);
            setenv("HCOLL_NRANKS", buf, 1);
            setenv("HCOLL_ROOT", root, 1);
            setenv("HCOLL_SECRET", secret, 1);
            setenv("HCOLL_PERF_CHILD", "1", 1);
            /* One host: the rails are loopback unless the user chose. */
            setenv("HCOLL_SOCKET_IFNAME", "lo", 0);
            if (o->ranks_per_node) {
                snprintf(buf, sizeof buf, "hcoll-perf-%d-node%d", (int)me, r / o->ranks_per_node);
                setenv("HCOLL_HOSTID", buf, 1);
                setenv("NCCL_HOSTID", buf, 1);
            }
            if (r != 0) /* only rank 0 prints the table */
                if (!freopen("/dev/null", "w", stdout))
                    _exit(1);
            exit(rank_main(o));
        }
    }
    /* Wait; once a rank fails, give the others a moment to report, then
     * kill them: they would otherwise wait for the dead one until
     * HCOLL_TIMEOUT_MS. */
    double deadline = now_s() + o->deadline_s, kill_at = 0;
    int left = n, first_bad = -1, killed = 0;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] != pid)
                    continue;
                done[r] = 1;
                left--;
                codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                if (codes[r] != 0 && first_bad < 0) {
                    first_bad = r;
                    kill_at = now_s() + 2.0;
                }
            }
            continue;
        }
        double t = now_s();
        if (!killed && ((kill_at > 0 && t > kill_at) || t > deadline)) {
            if (t > deadline)
                fprintf(stderr, "hcoll_perf: -np: deadline of %.0f s passed; killing the ranks\n",
                        o->deadline_s);
            for (int r = 0; r < n; r++)
                if (!done[r])
                    kill(pids[r], SIGKILL);
            killed = 1;
        }
        usleep(20000);
    }
    int rc = 0;
    if (first_bad >= 0) {
        /* Rank 0's code says most (it sees the whole job); else the first. */
        rc = codes[0] != 0 && codes[0] < 128 ? codes[0] : codes[first_bad];
        for (int r = 0; r < n; r++)
            if (codes[r] != 0)
                fprintf(stderr, "hcoll_perf: -np: rank %d %s %d\n", r,
                        codes[r] >= 128 ? "died of signal" : "exited with",
                        codes[r] >= 128 ? codes[r] - 128 : codes[r]);
    } else if (killed) {
        rc = 124;
    }
    free(pids);
    free(done);
    free(codes);
    return rc;
}

int main(int argc, char **argv)
{
    hp_opts_t o;
    char err[300];
    hp_opts_default(&o);
    if (hp_opts_parse(argc, argv, &o, err, sizeof err) != 0) {
        fprintf(stderr, "hcoll_perf: %s\n%s", err, hp_usage());
        return EXIT_USAGE;
    }
    if (o.help) {
        fputs(hp_usage(), stdout);
        return 0;
    }
    if (o.np > 0 && !getenv("HCOLL_PERF_CHILD"))
        return launch(&o);
    return rank_main(&o);
}
