/*
 * What a call asks of the executors: the plan a topology calls for, and
 * the argument checks every all-reduce makes, host or device. Below both
 * executors (coll.c, coll_dev.c), which share them.
 */
#include "core/coll.h"

#include <stdint.h>

#include "base/err.h"
#include "base/log.h"
#include "base/reduce.h"
#include "core/comm.h"

enum hc_plan hc_coll_plan_for(int nranks, int nnodes, int local_size, int uniform)
{
    if (nranks == 1)
        return HC_PLAN_SINGLE;
    if (nnodes == 1)
        return HC_PLAN_INTRA;
    if (!uniform)
        return HC_PLAN_FLAT;
    if (local_size == 1)
        return HC_PLAN_RING;
    return HC_PLAN_3STAGE;
}

const char *hc_coll_plan_name(enum hc_plan plan)
{
    switch (plan) {
    case HC_PLAN_SINGLE: return "single rank (copy)";
    case HC_PLAN_INTRA: return "one node: intra-node all-reduce";
    case HC_PLAN_RING: return "one rank per node: inter-node ring";
    case HC_PLAN_FLAT: return "unequal nodes: flat ring over all ranks";
    case HC_PLAN_3STAGE: return "three stages: intra RS, ring per rail, intra AG";
    }
    return "?";
}


hcoll_status_t hc_coll_check_args(struct hcoll_comm *c, const void *sendbuf,
                                  const void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                  hcoll_op_t op, int require_ptrs)
{
    if (!hc_reduce_valid(dtype, op))
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "dtype %d / op %d is not a known type and operation", (int)dtype,
                          (int)op);
    if (count == 0 && !require_ptrs)
        return HCOLL_SUCCESS;
    if (!sendbuf || !recvbuf)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "%s is NULL with count %zu", !sendbuf ? "sendbuf" : "recvbuf", count);
    size_t esize = hcoll_dtype_size(dtype);
    if (count > SIZE_MAX / esize / 2)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "count %zu of %s is larger than memory", count, hcoll_dtype_name(dtype));
    uintptr_t s = (uintptr_t)sendbuf, r = (uintptr_t)recvbuf, bytes = count * esize;
    if (s != r && s < r + bytes && r < s + bytes)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "sendbuf and recvbuf overlap without being equal (in place means "
                          "sendbuf == recvbuf)");
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_coll_check_bcast(struct hcoll_comm *c, const void *sendbuf,
                                   const void *recvbuf, size_t count, hcoll_dtype_t dtype,
                                   int root)
{
    if (hcoll_dtype_size(dtype) == 0)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "dtype %d is not a known type", (int)dtype);
    if (root < 0 || root >= c->nranks)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "root %d is not a rank of this communicator (size %d)", root,
                          c->nranks);
    if (count == 0)
        return HCOLL_SUCCESS;
    const int is_root = c->rank == root;
    if (!recvbuf || (is_root && !sendbuf))
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "%s is NULL with count %zu", !recvbuf ? "recvbuf" : "sendbuf", count);
    size_t esize = hcoll_dtype_size(dtype);
    if (count > SIZE_MAX / esize / 2)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "count %zu of %s is larger than memory", count, hcoll_dtype_name(dtype));
    uintptr_t s = (uintptr_t)sendbuf, r = (uintptr_t)recvbuf, bytes = count * esize;
    if (is_root && s != r && s < r + bytes && r < s + bytes)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "sendbuf and recvbuf overlap without being equal (in place means "
                          "sendbuf == recvbuf)");
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_coll_check_rsag(struct hcoll_comm *c, enum hc_coll_kind kind,
                                  const void *sendbuf, const void *recvbuf, size_t count,
                                  hcoll_dtype_t dtype, hcoll_op_t op)
{
    const int rs = kind == HC_COLL_REDUCE_SCATTER;
    const char *what = rs ? "reduce_scatter" : "allgather";
    if (rs ? !hc_reduce_valid(dtype, op) : hcoll_dtype_size(dtype) == 0)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          rs ? "%s: dtype %d / op %d is not a known type and operation"
                             : "%s: dtype %d is not a known type",
                          what, (int)dtype, (int)op);
    if (count == 0)
        return HCOLL_SUCCESS;
    if (!sendbuf || !recvbuf)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "%s: %s is NULL with count %zu", what, !sendbuf ? "sendbuf" : "recvbuf",
                          count);
    const size_t esize = hcoll_dtype_size(dtype);
    if (count > SIZE_MAX / esize / 2 / (size_t)c->nranks)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "%s: %d x %zu elements of %s are larger than memory", what, c->nranks,
                          count, hcoll_dtype_name(dtype));
    /* The big buffer holds nranks blocks; in place, the small one is block
     * rank of it. */
    const uintptr_t big = (uintptr_t)(rs ? sendbuf : recvbuf);
    const uintptr_t small = (uintptr_t)(rs ? recvbuf : sendbuf);
    const uintptr_t blk = count * esize, all = blk * (uintptr_t)c->nranks;
    if (small == big + (uintptr_t)c->rank * blk)
        return HCOLL_SUCCESS;
    if (small < big + all && big < small + blk)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "%s: sendbuf and recvbuf overlap, but not in place (in place means "
                          "%s == %s + rank * count elements)",
                          what, rs ? "recvbuf" : "sendbuf", rs ? "sendbuf" : "recvbuf");
    return HCOLL_SUCCESS;
}
