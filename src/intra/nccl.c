/*
 * NCCL intra-node backend for device buffers, on the caller's CUDA stream.
 *
 *   create:  local rank 0 ──ncclGetUniqueId──► {ok, id} ──allgather (node)──► all
 *            every local rank: ncclCommInitRankConfig(L, id, local rank),
 *            non-blocking, polled against timeout_ms
 *
 *   reduce_scatter, count = q*L + r (shards from hc_intra_shard):
 *     r == 0   ncclReduceScatter(send, recv + shard_i, q)        one call
 *     r != 0   group { ncclReduce(send + shard_j, recv + shard_j, len_j, root j) : j < L }
 *   all_gather:
 *     r == 0   ncclAllGather(recv + shard_i, recv, q)            in place
 *     r != 0   group { ncclBroadcast(recv + shard_j, len_j, root j) : j < L }
 *   allreduce: ncclAllReduce
 *   bcast:     ncclBroadcast (device broadcast: the root's node)
 *
 * Uneven counts cannot use NCCL's equal-block reduce-scatter without
 * changing the shard split that the ring and the executor share, so they
 * take one rooted operation per shard inside a group: the same bytes move.
 *
 * AVG reduces as SUM here (intra.h): the caller divides once by the full
 * rank count. Scaled sums (set_scale: floating AVG, PREMUL_SUM) are SUM
 * calls made with a PreMulSum op created for the one call and destroyed
 * once it is enqueued (ncclRedOpCreatePreMulSum; NCCL holds the scalar, or
 * its device address, from then on). NCCL's MAX/MIN do not propagate NaN (they are fmax/fmin) and
 * NCCL's half-type reductions round at every step in its own order, so
 * device results equal the host path's except for NaN under MAX/MIN and
 * the order of half/float sums; they are bit-identical across ranks.
 *
 * libnccl.so.2 is opened at run time: libhcoll has no link-time NCCL
 * dependency, and no NCCL header is needed: the few entry points, enums and
 * the 2.14 prefix of ncclConfig_t are stable ABI (NCCL reads a config by its
 * version field, so an older prefix stays valid on newer libraries).
 *
 * Every stream argument is a CUstream of the communicator's device; the
 * caller makes that device's context current around each call. Calls only
 * enqueue: they return before the GPU has run anything.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/clock.h"
#include "intra/intra.h"
#include "intra/nccl_api.h"

#define NCCL_CONFIG_MAGIC 0xcafebeefu
#define NCCL_UNDEF_INT (-2147483647 - 1)
/* nccl.h values. */
enum { NCCL_SUM = 0, NCCL_PROD = 1, NCCL_MAX = 2, NCCL_MIN = 3, NCCL_AVG = 4 };
enum {
    NCCL_INT8 = 0, NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_INT64 = 4,
    NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8, NCCL_BFLOAT16 = 9,
};

/* Filled once, then read-only. */
static struct {
    int ok;
    char why[200];
    hc_nccl_api_t api;
} g_nccl_lib;
static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;

static void nccl_load(void)
{
    /* Found the way the dynamic loader finds anything (LD_LIBRARY_PATH,
     * ld.so.cache): the NCCL that the rest of the process uses. */
    const char *lib = "libnccl.so.2";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_nccl_lib.why, sizeof g_nccl_lib.why, "%s not loadable (%s)", lib, dlerror());
        return;
    }
#define SYM(field, name)                                                                     \
    do {                                                                                     \
        *(void **)&g_nccl_lib.api.field = dlsym(h, name);                                            \
        if (!g_nccl_lib.api.field) {                                                                 \
            snprintf(g_nccl_lib.why, sizeof g_nccl_lib.why,                                  \
                     "%s lacks %s (NCCL 2.14 or newer needed)", lib, name);                  \
            return;                                                                          \
        }                                                                                    \
    } while (0)
    SYM(get_version, "ncclGetVersion");
    SYM(err_string, "ncclGetErrorString");
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(init_rank_config, "ncclCommInitRankConfig");
    SYM(get_async_error, "ncclCommGetAsyncError");
    SYM(finalize, "ncclCommFinalize");
    SYM(destroy, "ncclCommDestroy");
    SYM(abort, "ncclCommAbort");
    SYM(reduce_scatter, "ncclReduceScatter");
    SYM(all_gather, "ncclAllGather");
    SYM(all_reduce, "ncclAllReduce");
    SYM(reduce, "ncclReduce");
    SYM(broadcast, "ncclBroadcast");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(premul_create, "ncclRedOpCreatePreMulSum");
    SYM(premul_destroy, "ncclRedOpDestroy");
#undef SYM
    g_nccl_lib.api.get_version(&g_nccl_lib.api.version);
    if (g_nccl_lib.api.version < HC_NCCL_VERSION_2_14) {
        snprintf(g_nccl_lib.why, sizeof g_nccl_lib.why, "%s is NCCL %d; 2.14 or newer is needed", lib,
                 g_nccl_lib.api.version);
        return;
    }
    g_nccl_lib.ok = 1;
}


const hc_nccl_api_t *hc_nccl_api(char *why, size_t whylen)
{
    pthread_once(&g_nccl_once, nccl_load);
    if (!g_nccl_lib.ok && why && whylen)
        snprintf(why, whylen, "%s", g_nccl_lib.why);
    return g_nccl_lib.ok ? &g_nccl_lib.api : NULL;
}

void hc_nccl_config_init(hc_nccl_config_t *cfg, int blocking)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->size = sizeof *cfg;
    cfg->magic = NCCL_CONFIG_MAGIC;
    cfg->version = HC_NCCL_VERSION_2_14;
    cfg->blocking = blocking;
    cfg->cga_cluster_size = NCCL_UNDEF_INT;
    cfg->min_ctas = NCCL_UNDEF_INT;
    cfg->max_ctas = NCCL_UNDEF_INT;
    cfg->net_name = NULL;
}

int hc_nccl_dtype(hcoll_dtype_t dt)
{
    switch (dt) {
    case HCOLL_FLOAT32: return NCCL_FLOAT32;
    case HCOLL_FLOAT16: return NCCL_FLOAT16;
    case HCOLL_BFLOAT16: return NCCL_BFLOAT16;
    case HCOLL_FLOAT64: return NCCL_FLOAT64;
    case HCOLL_INT8: return NCCL_INT8;
    case HCOLL_UINT8: return NCCL_UINT8;
    case HCOLL_INT32: return NCCL_INT32;
    case HCOLL_INT64: return NCCL_INT64;
    default: return -1;
    }
}

int hc_nccl_op(hcoll_op_t op, int avg_as_sum)
{
    switch (op) {
    case HCOLL_SUM: return NCCL_SUM;
    case HCOLL_AVG: return avg_as_sum ? NCCL_SUM : NCCL_AVG;
    case HCOLL_PROD: return NCCL_PROD;
    case HCOLL_MAX: return NCCL_MAX;
    case HCOLL_MIN: return NCCL_MIN;
    default: return -1;
    }
}

typedef struct nccl_ctx {
    hc_intra_t base;
    const hc_nccl_api_t *nc;
    hc_nccl_comm_t comm;
    int local_rank, local_size;
    int timeout_ms;
    int rank;
    hc_errbuf_t *eb;
    atomic_int aborted;
    hcoll_status_t failed; /* sticky */
    /* set_scale: SUM calls become PreMulSum with this scalar. */
    int scaled, scale_on_device;
    const void *scale_dev;       /* device memory */
    unsigned char scale_host[8]; /* one element, copied */
} nccl_ctx_t;

/* A non-blocking communicator's call may answer "in progress": poll its
 * state until it settles, against the deadline and the abort flag. */
static hcoll_status_t nccl_settle(nccl_ctx_t *x, hc_nccl_res_t r, const char *what)
{
    double deadline = hc_now_ms() + x->timeout_ms;
    while (r == HC_NCCL_IN_PROGRESS) {
        if (atomic_load(&x->aborted))
            return x->failed = hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_ABORTED,
                                          "aborted during %s", what);
        if (hc_now_ms() > deadline)
            return x->failed = hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_TIMEOUT,
                                          "%s did not complete within %d ms (a local rank "
                                          "did not join?)",
                                          what, x->timeout_ms);
        struct timespec ts = { 0, 100000 };
        nanosleep(&ts, NULL);
        if (x->nc->get_async_error(x->comm, &r) != HC_NCCL_SUCCESS)
            break;
    }
    if (r != HC_NCCL_SUCCESS)
        return x->failed = hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_NCCL, "%s failed: %s",
                                      what, x->nc->err_string(r));
    return HCOLL_SUCCESS;
}

/* Before each call: a failure NCCL found in the background (a local rank
 * died, a network error) ends the backend here. */
static hcoll_status_t nccl_ready(nccl_ctx_t *x)
{
    if (x->failed != HCOLL_SUCCESS)
        return hc_err_set(x->eb, HC_COLL, x->rank, x->failed,
                          "the NCCL backend failed earlier (%s)", hcoll_strerror(x->failed));
    if (atomic_load(&x->aborted))
        return x->failed = hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_ABORTED,
                                      "the NCCL backend was aborted");
    hc_nccl_res_t st = HC_NCCL_SUCCESS;
    x->nc->get_async_error(x->comm, &st);
    if (st != HC_NCCL_SUCCESS && st != HC_NCCL_IN_PROGRESS)
        return x->failed = hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_NCCL,
                                      "NCCL reported an asynchronous error: %s",
                                      x->nc->err_string(st));
    return nccl_settle(x, st, "an earlier NCCL call");
}

typedef struct nccl_hello {
    int ok;            /* this local rank can take part */
    hc_nccl_uid_t id;     /* meaningful from local rank 0 */
} nccl_hello_t;

static hcoll_status_t nccl_create(const hc_intra_params_t *p, hc_intra_t **out)
{
    hcoll_status_t st;
    char why[200] = "";
    const hc_nccl_api_t *api = hc_nccl_api(why, sizeof why);
    nccl_hello_t mine, *all = calloc((size_t)p->local_size, sizeof *all);
    if (!all)
        return hc_err_set(p->errbuf, HC_COLL, p->rank, HCOLL_ERR_NO_MEMORY,
                          "no memory for the NCCL set-up");
    memset(&mine, 0, sizeof mine);
    mine.ok = api != NULL;
    hc_nccl_res_t r = HC_NCCL_SUCCESS;
    if (mine.ok && p->local_rank == 0) {
        r = api->get_unique_id(&mine.id);
        mine.ok = r == HC_NCCL_SUCCESS;
    }
    /* Everyone joins the exchange even when it cannot go on, so that the
     * node fails together instead of waiting for the missing rank. */
    HC_CHECK(p->allgather(p->allgather_ctx, &mine, all, sizeof mine), clean_hello);
    if (!api) {
        st = hc_err_set(p->errbuf, HC_COLL, p->rank, HCOLL_ERR_UNSUPPORTED,
                        "device buffers on a node with several ranks need NCCL: %s",
                        why);
        goto clean_hello;
    }
    if (r != HC_NCCL_SUCCESS) {
        st = hc_err_set(p->errbuf, HC_COLL, p->rank, HCOLL_ERR_NCCL, "ncclGetUniqueId: %s",
                        api->err_string(r));
        goto clean_hello;
    }
    for (int i = 0; i < p->local_size; i++)
        if (!all[i].ok) {
            st = hc_err_set(p->errbuf, HC_COLL, p->rank, HCOLL_ERR_NCCL,
                            "local rank %d cannot use NCCL (see its log)", i);
            goto clean_hello;
        }

    nccl_ctx_t *x = calloc(1, sizeof *x);
    if (!x) {
        st = hc_err_set(p->errbuf, HC_COLL, p->rank, HCOLL_ERR_NO_MEMORY,
                        "no memory for the NCCL backend");
        goto clean_hello;
    }
    x->base.ops = &hc_intra_nccl_ops;
    x->nc = api;
    x->local_rank = p->local_rank;
    x->local_size = p->local_size;
    x->timeout_ms = p->timeout_ms;
    x->rank = p->rank;
    x->eb = p->errbuf;
    atomic_init(&x->aborted, 0);
    hc_nccl_config_t cfg;
    hc_nccl_config_init(&cfg, 0); /* non-blocking: set-up and every call have our deadline */
    r = api->init_rank_config(&x->comm, p->local_size, all[0].id, p->local_rank, &cfg);
    if (r != HC_NCCL_SUCCESS && r != HC_NCCL_IN_PROGRESS) {
        st = hc_err_set(p->errbuf, HC_COLL, p->rank, HCOLL_ERR_NCCL,
                        "ncclCommInitRankConfig (%d local ranks; ranks of one node need "
                        "distinct GPUs): %s",
                        p->local_size, api->err_string(r));
        goto clean_ctx;
    }
    HC_CHECK(nccl_settle(x, r, "ncclCommInitRankConfig (ranks of one node need distinct GPUs)"),
             clean_comm);
    HC_INFO(HC_INIT, p->rank, "NCCL %d intra-node communicator: local rank %d of %d",
            api->version, p->local_rank, p->local_size);
    free(all);
    *out = &x->base;
    return HCOLL_SUCCESS;

clean_comm:
    api->abort(x->comm);
clean_ctx:
    free(x);
clean_hello:
    free(all);
    return st;
}

static hcoll_status_t nccl_check_args(nccl_ctx_t *x, hcoll_dtype_t dtype, hcoll_op_t op,
                                      void *stream, int *ndt, int *nop)
{
    *ndt = hc_nccl_dtype(dtype);
    *nop = hc_nccl_op(op, 1); /* the caller divides AVG once, at the end */
    if (*ndt < 0 || *nop < 0)
        return hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_INVALID_ARG,
                          "dtype %d / op %d unknown", (int)dtype, (int)op);
    if (!stream)
        return hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_INVALID_ARG,
                          "the NCCL backend needs a CUDA stream");
    return nccl_ready(x);
}

static hcoll_status_t nccl_set_scale(hc_intra_t *ctx, const void *scalar, hcoll_dtype_t dtype,
                                     int on_device)
{
    nccl_ctx_t *x = (nccl_ctx_t *)ctx;
    x->scaled = scalar != NULL;
    x->scale_on_device = on_device;
    x->scale_dev = on_device ? scalar : NULL;
    if (scalar && !on_device)
        memcpy(x->scale_host, scalar, hcoll_dtype_size(dtype));
    return HCOLL_SUCCESS;
}

/* A SUM call while scaled: *nop becomes a PreMulSum op for this call
 * (*made = 1: destroy it once the call is enqueued). */
static hcoll_status_t nccl_scaled_op(nccl_ctx_t *x, hcoll_op_t op, int ndt, int *nop, int *made)
{
    *made = 0;
    if (!x->scaled || op != HCOLL_SUM)
        return HCOLL_SUCCESS;
    /* ncclScalarDevice = 0, ncclScalarHostImmediate = 1 (nccl.h). */
    hc_nccl_res_t r = x->nc->premul_create(nop,
                                           x->scale_on_device ? (void *)x->scale_dev
                                                              : (void *)x->scale_host,
                                           ndt, x->scale_on_device ? 0 : 1, x->comm);
    if (r != HC_NCCL_SUCCESS)
        return x->failed = hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_NCCL,
                                      "ncclRedOpCreatePreMulSum: %s", x->nc->err_string(r));
    *made = 1;
    return HCOLL_SUCCESS;
}

static hcoll_status_t nccl_scaled_done(nccl_ctx_t *x, int nop, int made, hcoll_status_t st)
{
    if (made)
        x->nc->premul_destroy(nop, x->comm);
    return st;
}

static hcoll_status_t nccl_group_end(nccl_ctx_t *x, const char *what)
{
    return nccl_settle(x, x->nc->group_end(), what);
}

static hcoll_status_t nccl_rs_run(nccl_ctx_t *x, const void *sendbuf, void *recvbuf,
                                  size_t count, hcoll_dtype_t dtype, int ndt, int nop,
                                  void *stream);

static hcoll_status_t nccl_reduce_scatter(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                          size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                          void *stream)
{
    nccl_ctx_t *x = (nccl_ctx_t *)ctx;
    int ndt, nop, made;
    hcoll_status_t st = nccl_check_args(x, dtype, op, stream, &ndt, &nop);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    if ((st = nccl_scaled_op(x, op, ndt, &nop, &made)) != HCOLL_SUCCESS)
        return st;
    return nccl_scaled_done(x, nop, made,
                            nccl_rs_run(x, sendbuf, recvbuf, count, dtype, ndt, nop, stream));
}

static hcoll_status_t nccl_rs_run(nccl_ctx_t *x, const void *sendbuf, void *recvbuf,
                                  size_t count, hcoll_dtype_t dtype, int ndt, int nop,
                                  void *stream)
{
    const size_t es = hcoll_dtype_size(dtype);
    const int L = x->local_size;
    size_t off, len;
    if (count % (size_t)L == 0) {
        hc_intra_shard(count, L, x->local_rank, &off, &len);
        return nccl_settle(x,
                           x->nc->reduce_scatter(sendbuf, (char *)recvbuf + off * es, len, ndt,
                                                 nop, x->comm, stream),
                           "ncclReduceScatter");
    }
    x->nc->group_start();
    for (int j = 0; j < L; j++) {
        hc_intra_shard(count, L, j, &off, &len);
        if (len == 0)
            continue;
        /* Only the root writes its recvbuf; the others pass theirs as NCCL
         * wants a valid pointer. */
        hc_nccl_res_t r = x->nc->reduce((const char *)sendbuf + off * es, (char *)recvbuf + off * es,
                                     len, ndt, nop, j, x->comm, stream);
        if (r != HC_NCCL_SUCCESS && r != HC_NCCL_IN_PROGRESS) {
            x->nc->group_end();
            return x->failed = hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_NCCL,
                                          "ncclReduce (shard %d): %s", j, x->nc->err_string(r));
        }
    }
    return nccl_group_end(x, "ncclReduce group (reduce-scatter of uneven shards)");
}

static hcoll_status_t nccl_all_gather(hc_intra_t *ctx, void *recvbuf, size_t count,
                                      hcoll_dtype_t dtype, void *stream)
{
    nccl_ctx_t *x = (nccl_ctx_t *)ctx;
    int ndt, nop;
    hcoll_status_t st = nccl_check_args(x, dtype, HCOLL_SUM, stream, &ndt, &nop);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    const size_t es = hcoll_dtype_size(dtype);
    const int L = x->local_size;
    size_t off, len;
    if (count % (size_t)L == 0) {
        hc_intra_shard(count, L, x->local_rank, &off, &len);
        return nccl_settle(x,
                           x->nc->all_gather((char *)recvbuf + off * es, recvbuf, len, ndt,
                                             x->comm, stream),
                           "ncclAllGather");
    }
    x->nc->group_start();
    for (int j = 0; j < L; j++) {
        hc_intra_shard(count, L, j, &off, &len);
        if (len == 0)
            continue;
        char *p = (char *)recvbuf + off * es;
        hc_nccl_res_t r = x->nc->broadcast(p, p, len, ndt, j, x->comm, stream);
        if (r != HC_NCCL_SUCCESS && r != HC_NCCL_IN_PROGRESS) {
            x->nc->group_end();
            return x->failed = hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_NCCL,
                                          "ncclBroadcast (shard %d): %s", j,
                                          x->nc->err_string(r));
        }
    }
    return nccl_group_end(x, "ncclBroadcast group (all-gather of uneven shards)");
}

static hcoll_status_t nccl_allreduce(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                     size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                                     void *stream)
{
    nccl_ctx_t *x = (nccl_ctx_t *)ctx;
    int ndt, nop, made;
    hcoll_status_t st = nccl_check_args(x, dtype, op, stream, &ndt, &nop);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    if ((st = nccl_scaled_op(x, op, ndt, &nop, &made)) != HCOLL_SUCCESS)
        return st;
    st = nccl_settle(x, x->nc->all_reduce(sendbuf, recvbuf, count, ndt, nop, x->comm, stream),
                     "ncclAllReduce");
    return nccl_scaled_done(x, nop, made, st);
}

static hcoll_status_t nccl_bcast(hc_intra_t *ctx, const void *sendbuf, void *recvbuf,
                                 size_t count, hcoll_dtype_t dtype, int root, void *stream)
{
    nccl_ctx_t *x = (nccl_ctx_t *)ctx;
    int ndt, nop;
    hcoll_status_t st = nccl_check_args(x, dtype, HCOLL_SUM, stream, &ndt, &nop);
    if (st != HCOLL_SUCCESS || count == 0)
        return st;
    if (root < 0 || root >= x->local_size)
        return hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_INVALID_ARG,
                          "ncclBroadcast: root %d of %d local ranks", root, x->local_size);
    /* NCCL reads sendbuf on the root only; the others pass a valid one. */
    const void *src = x->local_rank == root ? sendbuf : recvbuf;
    return nccl_settle(x, x->nc->broadcast(src, recvbuf, count, ndt, root, x->comm, stream),
                       "ncclBroadcast");
}

static hcoll_status_t nccl_barrier(hc_intra_t *ctx)
{
    nccl_ctx_t *x = (nccl_ctx_t *)ctx;
    /* A barrier would need a device buffer and a stream of its own; the
     * executor orders device work on the caller's stream instead. */
    return hc_err_set(x->eb, HC_COLL, x->rank, HCOLL_ERR_UNSUPPORTED,
                      "the NCCL backend has no host barrier (use the bootstrap's)");
}

static void nccl_abort_op(hc_intra_t *ctx)
{
    nccl_ctx_t *x = (nccl_ctx_t *)ctx;
    atomic_store(&x->aborted, 1);
}

static void nccl_destroy(hc_intra_t *ctx)
{
    nccl_ctx_t *x = (nccl_ctx_t *)ctx;
    if (!x)
        return;
    /* ncclCommFinalize waits for the node's other ranks: only when healthy,
     * and only as long as the deadline allows; otherwise abort, which never
     * waits for peers. */
    int clean = !atomic_load(&x->aborted) && x->failed == HCOLL_SUCCESS;
    if (clean) {
        hc_nccl_res_t r = x->nc->finalize(x->comm);
        clean = (r == HC_NCCL_SUCCESS || r == HC_NCCL_IN_PROGRESS) &&
                nccl_settle(x, r, "ncclCommFinalize") == HCOLL_SUCCESS;
    }
    if (clean)
        x->nc->destroy(x->comm);
    else
        x->nc->abort(x->comm);
    free(x);
}

const hc_intra_ops_t hc_intra_nccl_ops = {
    .name = "nccl",
    .create = nccl_create,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .allreduce = nccl_allreduce,
    .barrier = nccl_barrier,
    .set_scale = nccl_set_scale,
    .abort = nccl_abort_op,
    .destroy = nccl_destroy,
    .bcast = nccl_bcast,
};
