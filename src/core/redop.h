/*
 * Reduction operations as the executors run them: the built-in ops, and the
 * PREMUL_SUM ops a communicator holds (hcoll_op_create_premul_sum).
 *
 *   hcoll_allreduce(op) ─resolve─► { stage op, scaled?, scalar }
 *     SUM/PROD/MAX/MIN, integer AVG   { op, no }           (AVG divides at the end)
 *     AVG of a floating dtype         { SUM, yes, 1/n }
 *     a PREMUL_SUM handle             { SUM, yes, its scalar (host or device) }
 *
 * A scaled call multiplies each rank's own input by the scalar once, at the
 * first stage that reads it, and every later stage sums. Results stay
 * bit-identical on every rank: the scaling is elementwise and local, and
 * the sums keep their fixed order.
 *
 * Handles: HC_REDOP_BASE + (tag << 23 | generation << 12 | slot). The tag
 * differs between the communicators of a process (with high probability),
 * the generation counts the slot's reuses, so an op of another
 * communicator or one already destroyed is refused, not misread.
 */
#ifndef HC_CORE_REDOP_H
#define HC_CORE_REDOP_H

#include "base/reduce.h"
#include "hcoll.h"

struct hcoll_comm;

#define HC_REDOP_BASE  0x100
#define HC_REDOP_SLOTS 4096 /* live PREMUL_SUM ops per communicator */

typedef struct hc_redop {
    hcoll_op_t op;          /* what the stages combine with (SUM when scaled) */
    int scaled;             /* each rank's input is multiplied by the scalar first */
    hc_scalar_t scalar;     /* the multiplier, when it lives on the host */
    const void *dev_scalar; /* else: one element of device memory, read at run time */
    int host_scale;         /* device buffers: the staged ring scales its host copy */
    int dev_scale;          /* device buffers: hcoll's kernel scales on the stream */
} hc_redop_t;

/* The op table of a new / freed communicator (comm.c). */
void hc_redop_table_init(struct hcoll_comm *c);
void hc_redop_table_fini(struct hcoll_comm *c);

/* hcoll_op_create_premul_sum / hcoll_op_destroy on a ready communicator. */
hcoll_status_t hc_redop_create(struct hcoll_comm *c, const void *scalar, hcoll_dtype_t dtype,
                               hcoll_scalar_residence_t residence, hcoll_op_t *op_out);
hcoll_status_t hc_redop_destroy(struct hcoll_comm *c, hcoll_op_t op);

/* What op means on c for dtype. A built-in op (valid or not: the argument
 * checks judge it later) resolves without error; a handle that is not a
 * live op of c, or was made for another dtype, is HCOLL_ERR_INVALID_ARG. */
hcoll_status_t hc_redop_resolve(struct hcoll_comm *c, hcoll_op_t op, hcoll_dtype_t dtype,
                                hc_redop_t *out);

/* Host buffers: dst = scalar * src (count elements; dst may be src, and
 * src NULL means dst in place) when r is scaled and its scalar lives on
 * the host. */
void hc_redop_scale_host(const hc_redop_t *r, void *dst, const void *src, size_t count,
                         hcoll_dtype_t dtype);

/* Device buffers: where a scaled op scales, given the plan. nccl: an NCCL
 * stage reads the input (it scales: hc_redop_intra_scale). single: one
 * rank (AVG is then a copy, *op = HCOLL_SUM). A ring staged through host
 * memory with a host scalar: r->host_scale = 1 (the host copy is scaled).
 * Else (one rank, the GPUDirect ring, a device scalar without NCCL):
 * r->dev_scale = 1, hcoll's scaling kernel scales the input on the stream
 * (kern: the kernels are loaded; without them this is refused with
 * HCOLL_ERR_UNSUPPORTED, recorded in c; why_kern says why they are not). */
hcoll_status_t hc_redop_dev_plan(struct hcoll_comm *c, hc_redop_t *r, hcoll_op_t *op,
                                 hcoll_op_t user_op, int nccl, int single, int gdr, int kern,
                                 const char *why_kern);

/* Around intra-node calls on device buffers: on = 1 hands r's scalar to
 * the backend (set_scale) when r is scaled, on = 0 clears it. intra NULL
 * (no intra stage): nothing. */
struct hc_intra;
hcoll_status_t hc_redop_intra_scale(struct hc_intra *intra, const hc_redop_t *r,
                                    hcoll_dtype_t dtype, int on);

#endif
