/*
 * The PREMUL_SUM op table of a communicator, and what an op means to the
 * executors (redop.h). The table is the communicator's own; communicators
 * share only the counter that gives each its handle tag.
 */
#include "core/redop.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/log.h"
#include "core/comm.h"
#include "gdr/gdr.h"
#include "intra/intra.h"

#define TAG_BITS 7
#define GEN_BITS 11
#define SLOT_BITS 12

typedef struct hc_premul {
    int live;
    unsigned gen;
    hcoll_dtype_t dtype;
    hc_scalar_t scalar;
    const void *dev_scalar; /* HCOLL_SCALAR_DEVICE: read when the op runs */
} hc_premul_t;

void hc_redop_table_init(struct hcoll_comm *c)
{
    /* Tags are handed out in creation order, so communicators made within
     * 2^TAG_BITS of each other never share one (a tag folded from the
     * address collided 1 time in 128 for any two). The counter is the only
     * process-wide state here: an id, never read back by another
     * communicator's data. */
    static atomic_uint next_tag;
    pthread_mutex_init(&c->op_lock, NULL);
    c->op_tag = atomic_fetch_add(&next_tag, 1) & ((1u << TAG_BITS) - 1);
}

void hc_redop_table_fini(struct hcoll_comm *c)
{
    free(c->premul);
    c->premul = NULL;
    c->npremul = 0;
    pthread_mutex_destroy(&c->op_lock);
}

static hcoll_op_t handle_of(const struct hcoll_comm *c, int slot, unsigned gen)
{
    unsigned v = c->op_tag << (GEN_BITS + SLOT_BITS) |
                 (gen & ((1u << GEN_BITS) - 1)) << SLOT_BITS | (unsigned)slot;
    return (hcoll_op_t)(HC_REDOP_BASE + (int)v);
}

/* The live slot of handle op on c, or NULL (the reason in *why). Called
 * with op_lock held. */
static hc_premul_t *slot_of(struct hcoll_comm *c, hcoll_op_t op, const char **why)
{
    if ((int)op < HC_REDOP_BASE) {
        *why = "is not an op";
        return NULL;
    }
    unsigned v = (unsigned)((int)op - HC_REDOP_BASE);
    unsigned slot = v & ((1u << SLOT_BITS) - 1);
    unsigned gen = (v >> SLOT_BITS) & ((1u << GEN_BITS) - 1);
    if (v >> (GEN_BITS + SLOT_BITS) != c->op_tag) {
        *why = "was not made on this communicator";
        return NULL;
    }
    if ((int)slot >= c->npremul || !c->premul[slot].live ||
        (c->premul[slot].gen & ((1u << GEN_BITS) - 1)) != gen) {
        *why = "was destroyed (or never made)";
        return NULL;
    }
    return &c->premul[slot];
}

static hcoll_status_t check_scalar(struct hcoll_comm *c, const void *scalar,
                                   hcoll_dtype_t dtype, hcoll_scalar_residence_t residence)
{
    if (!scalar)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "op_create_premul_sum: scalar is NULL");
    if ((unsigned)dtype >= HCOLL_DTYPE_COUNT_)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "op_create_premul_sum: dtype %d is not a type", (int)dtype);
    if (residence == HCOLL_SCALAR_HOST_IMMEDIATE)
        return HCOLL_SUCCESS;
    if (residence != HCOLL_SCALAR_DEVICE)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "op_create_premul_sum: residence %d is neither "
                          "HCOLL_SCALAR_HOST_IMMEDIATE nor HCOLL_SCALAR_DEVICE",
                          (int)residence);
    if (!hc_gdr_cuda_in_process() || hc_gdr_ptr_kind(scalar, NULL) != HC_MEM_DEVICE)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "op_create_premul_sum: HCOLL_SCALAR_DEVICE needs a pointer to "
                          "device memory, and %p is not one", scalar);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_redop_create(struct hcoll_comm *c, const void *scalar, hcoll_dtype_t dtype,
                               hcoll_scalar_residence_t residence, hcoll_op_t *op_out)
{
    if (!op_out)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "op_create_premul_sum: op_out is NULL");
    hcoll_status_t st = check_scalar(c, scalar, dtype, residence);
    if (st != HCOLL_SUCCESS)
        return st;
    pthread_mutex_lock(&c->op_lock);
    int slot = 0;
    while (slot < c->npremul && c->premul[slot].live)
        slot++;
    if (slot == c->npremul) {
        if (c->npremul == HC_REDOP_SLOTS) {
            pthread_mutex_unlock(&c->op_lock);
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                              "op_create_premul_sum: %d ops are live on this communicator "
                              "(the most it holds); destroy some first", HC_REDOP_SLOTS);
        }
        int n = c->npremul ? c->npremul * 2 : 8;
        hc_premul_t *t = realloc(c->premul, (size_t)n * sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&c->op_lock);
            return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_NO_MEMORY,
                              "op_create_premul_sum: no memory for the op table");
        }
        memset(t + c->npremul, 0, (size_t)(n - c->npremul) * sizeof *t);
        c->premul = t;
        c->npremul = n;
    }
    hc_premul_t *p = &c->premul[slot];
    p->live = 1;
    p->dtype = dtype;
    p->dev_scalar = residence == HCOLL_SCALAR_DEVICE ? scalar : NULL;
    p->scalar = residence == HCOLL_SCALAR_DEVICE ? (hc_scalar_t){ .i64 = 0 }
                                                 : hc_scalar_load(scalar, dtype);
    *op_out = handle_of(c, slot, p->gen);
    pthread_mutex_unlock(&c->op_lock);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_redop_destroy(struct hcoll_comm *c, hcoll_op_t op)
{
    const char *why = NULL;
    pthread_mutex_lock(&c->op_lock);
    hc_premul_t *p = slot_of(c, op, &why);
    if (p) {
        p->live = 0;
        p->gen++; /* the old handle no longer matches */
    }
    pthread_mutex_unlock(&c->op_lock);
    if (!p)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "op_destroy: op %d %s", (int)op, why);
    return HCOLL_SUCCESS;
}

hcoll_status_t hc_redop_resolve(struct hcoll_comm *c, hcoll_op_t op, hcoll_dtype_t dtype,
                                hc_redop_t *out)
{
    hc_redop_t r = { .op = op };
    if ((int)op < HC_REDOP_BASE) {
        if (op == HCOLL_AVG && hc_dtype_is_float(dtype)) {
            r.op = HCOLL_SUM;
            r.scaled = 1;
            r.scalar = hc_scalar_avg(dtype, c->nranks);
        }
        *out = r;
        return HCOLL_SUCCESS;
    }
    const char *why = NULL;
    pthread_mutex_lock(&c->op_lock);
    const hc_premul_t *p = slot_of(c, op, &why);
    hc_premul_t copy;
    if (p)
        copy = *p;
    pthread_mutex_unlock(&c->op_lock);
    if (!p)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "allreduce: op %d %s", (int)op, why);
    if (copy.dtype != dtype)
        return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_INVALID_ARG,
                          "allreduce: op %d is a PREMUL_SUM made for %s, called with %s",
                          (int)op, hcoll_dtype_name(copy.dtype), hcoll_dtype_name(dtype));
    r.op = HCOLL_SUM;
    r.scaled = 1;
    r.scalar = copy.scalar;
    r.dev_scalar = copy.dev_scalar;
    *out = r;
    return HCOLL_SUCCESS;
}

void hc_redop_scale_host(const hc_redop_t *r, void *dst, const void *src, size_t count,
                         hcoll_dtype_t dtype)
{
    if (r->scaled && !r->dev_scalar && count > 0)
        hc_reduce_scale(dst, src ? src : dst, count, dtype, r->scalar);
}

hcoll_status_t hc_redop_dev_plan(struct hcoll_comm *c, hc_redop_t *r, hcoll_op_t *op,
                                 hcoll_op_t user_op, int nccl, int single, int gdr, int kern,
                                 const char *why_kern)
{
    r->host_scale = r->dev_scale = 0;
    if (!r->scaled || nccl)
        return HCOLL_SUCCESS;
    if (user_op == HCOLL_AVG && single) {
        r->scaled = 0; /* times 1/1 */
        *op = HCOLL_SUM;
        return HCOLL_SUCCESS;
    }
    if (!single && !gdr && !r->dev_scalar) {
        r->host_scale = 1; /* free: the host copy is there anyway */
        return HCOLL_SUCCESS;
    }
    if (kern) {
        r->dev_scale = 1;
        return HCOLL_SUCCESS;
    }
    return hc_err_set(&c->err, HC_COLL, c->rank, HCOLL_ERR_UNSUPPORTED,
                      "%s on device buffers: %s scales with hcoll's kernel, which is absent (%s)",
                      user_op == HCOLL_AVG ? "AVG" : "PREMUL_SUM",
                      single ? "a single-rank communicator"
                      : r->dev_scalar ? "a device-resident scalar without an NCCL stage"
                                      : "the GPUDirect ring",
                      why_kern ? why_kern : "not loaded");
}

hcoll_status_t hc_redop_intra_scale(struct hc_intra *intra, const hc_redop_t *r,
                                    hcoll_dtype_t dtype, int on)
{
    unsigned char v[8];
    if (!r->scaled || !intra)
        return HCOLL_SUCCESS;
    if (!on)
        return intra->ops->set_scale(intra, NULL, dtype, 0);
    if (r->dev_scalar)
        return intra->ops->set_scale(intra, r->dev_scalar, dtype, 1);
    hc_scalar_store(v, dtype, r->scalar);
    return intra->ops->set_scale(intra, v, dtype, 0);
}
