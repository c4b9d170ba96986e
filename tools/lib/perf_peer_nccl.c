/*
 * --peer nccl (see perf_rank.h): NCCL through the library's run-time
 * loader (intra/nccl_api.h), so that the binary never links it.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "perf_rank.h"

/*
 * NCCL on one flat communicator over all ranks, on this rank's GPU and
 * stream. Rank 0's unique id reaches the others inside an int64 SUM
 * all-reduce in which every other rank adds zeros: exact, and it needs no
 * MPI. Set-up is non-blocking, polled against a deadline, so that a rank
 * that cannot join makes the others fail instead of hang.
 */
#define NCCL_PEER_INIT_S 120.0

static int nccl_settle(hp_perf_t *p, hc_nccl_res_t r, const char *what, char *err, size_t errlen)
{
    const hc_nccl_api_t *nc = p->nccl.nc;
    double deadline = hp_now_s() + NCCL_PEER_INIT_S;
    while (r == HC_NCCL_IN_PROGRESS && hp_now_s() < deadline) {
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

static int nccl_call(hp_perf_t *p, int ip, size_t count, void **res_out, char *err,
                     size_t errlen)
{
    const hc_nccl_api_t *nc = p->nccl.nc;
    const hp_nccl_t *n = &p->nccl;
    const void *s;
    void *r;
    hc_nccl_res_t res;
    const char *what;
    hp_coll_bufs(p, ip, count, &s, &r); /* NCCL's own in-place layout */
    switch (p->o.coll) {
    case HP_COLL_REDUCE_SCATTER:
        what = "ncclReduceScatter";
        res = nc->reduce_scatter(s, r, count, n->dtype, n->op, n->comm, p->gpu.stream);
        break;
    case HP_COLL_ALLGATHER:
        what = "ncclAllGather";
        res = nc->all_gather(s, r, count, n->dtype, n->comm, p->gpu.stream);
        break;
    case HP_COLL_BROADCAST:
        what = "ncclBroadcast";
        res = nc->broadcast(s, r, count, n->dtype, p->o.root, n->comm, p->gpu.stream);
        break;
    default:
        what = "ncclAllReduce";
        res = nc->all_reduce(s, r, count, n->dtype, n->op, n->comm, p->gpu.stream);
        break;
    }
    if (res_out)
        *res_out = r;
    /* A non-blocking communicator may answer "in progress": the call is on
     * the stream only once it settles, and the next call waits for that. */
    return nccl_settle(p, res, what, err, errlen);
}

static int nccl_sync(hp_perf_t *p, char *err, size_t errlen)
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

static const hp_peer_ops_t nccl_peer = { "nccl", nccl_call, hp_barrier, nccl_sync };

/* Collective over hcoll: every rank ends with the NCCL communicator, or
 * every rank stops with a message (rank 0 says why when it knows). */
void hp_peer_nccl_open(hp_perf_t *p)
{
    char why[300] = "", load[200] = "";
    hp_nccl_t *n = &p->nccl;
    n->nc = hc_nccl_api(load, sizeof load);
    n->dtype = hc_nccl_dtype(p->o.dtype);
    n->op = hc_nccl_op(p->o.op, 0);
    /* [0..15] the unique id, [16] ranks that cannot go on. */
    int64_t x[HC_NCCL_UNIQUE_ID_BYTES / 8 + 1];
    memset(x, 0, sizeof x);
    if (!n->nc)
        snprintf(why, sizeof why, "--peer nccl: %s", load);
    else if (n->dtype < 0 || (n->op < 0 && hp_coll_reduces(p->o.coll)))
        snprintf(why, sizeof why, "--peer nccl: NCCL has no %s %s", hcoll_dtype_name(p->o.dtype),
                 hcoll_op_name(p->o.op));
    else if (p->rank == 0) {
        hc_nccl_res_t r = n->nc->get_unique_id((hc_nccl_uid_t *)(void *)x);
        if (r != HC_NCCL_SUCCESS)
            snprintf(why, sizeof why, "--peer nccl: ncclGetUniqueId: %s", n->nc->err_string(r));
    }
    x[HC_NCCL_UNIQUE_ID_BYTES / 8] = why[0] != '\0';
    hp_reduce_sum(p, x, sizeof x / sizeof x[0]);
    if (x[HC_NCCL_UNIQUE_ID_BYTES / 8])
        hp_die(p, "%s", why[0] ? why : "--peer nccl: another rank cannot use NCCL (see its message)");

    hc_nccl_config_t cfg;
    hc_nccl_config_init(&cfg, 0);
    hc_nccl_uid_t id;
    memcpy(&id, x, sizeof id);
    hc_nccl_res_t r = n->nc->init_rank_config(&n->comm, p->nranks, id, p->rank, &cfg);
    int bad = nccl_settle(p, r, "ncclCommInitRankConfig (every rank needs a GPU of its own)",
                          why, sizeof why) != 0;
    int64_t fails[1] = { bad };
    hp_reduce_sum(p, fails, 1);
    if (fails[0]) {
        if (n->comm)
            n->nc->abort(n->comm);
        n->comm = NULL;
        hp_die(p, "%s", bad ? why : "--peer nccl: another rank failed to join NCCL");
    }
    p->peer = &nccl_peer;
}

void hp_peer_nccl_close(hp_perf_t *p)
{
    hp_nccl_t *n = &p->nccl;
    if (!n->comm)
        return;
    char err[300];
    if (nccl_settle(p, n->nc->finalize(n->comm), "ncclCommFinalize", err, sizeof err) == 0)
        n->nc->destroy(n->comm);
    else
        n->nc->abort(n->comm);
    n->comm = NULL;
}
