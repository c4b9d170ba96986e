/*
 * Host reduction kernels, used by every stage that combines data on the CPU
 * (shared-memory reduce-scatter, the ring's staging slots).
 *
 * Semantics are those documented for hcoll_dtype_t / hcoll_op_t in hcoll.h:
 * half types combine in float and round to nearest-even on store; integer
 * SUM/PROD wrap; MAX/MIN propagate NaN; AVG reduces as SUM and is finished
 * by hc_reduce_avg_finish (one division by the number of ranks).
 *
 * Pointers may be unaligned and counts odd. dst may equal a or b exactly
 * (in-place accumulate); any other overlap is not allowed.
 */
#ifndef HC_REDUCE_H
#define HC_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "hcoll.h"

/* dst[i] = a[i] op b[i], for i < count. Invalid dtype/op: no-op (callers
 * validate first with hc_reduce_valid). */
void hc_reduce(void *dst, const void *a, const void *b, size_t count, hcoll_dtype_t dtype,
               hcoll_op_t op);

/* buf[i] = buf[i] / nranks, in the dtype's arithmetic (integers truncate
 * toward zero, half types divide in float and round to nearest-even).
 * A no-op unless op == HCOLL_AVG. */
void hc_reduce_avg_finish(void *buf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                          int nranks);

/* 1 when dtype and op are values this library knows. */
int hc_reduce_valid(hcoll_dtype_t dtype, hcoll_op_t op);

/* Scalar conversions, exposed for tests and for the GPU kernels' reference. */
float hc_half_to_float(uint16_t h);
uint16_t hc_float_to_half(float f);      /* round to nearest-even */
float hc_bf16_to_float(uint16_t h);
uint16_t hc_float_to_bf16(float f);      /* round to nearest-even, NaN stays NaN */

/* Which code path the dispatcher picked on this CPU ("avx2+f16c", "generic"),
 * for benchmarks and hcoll_info. */
const char *hc_reduce_impl_name(void);

#endif
