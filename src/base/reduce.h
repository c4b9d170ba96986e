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

/*
 * A scalar multiplier (AVG's 1/n, a PREMUL_SUM op's scalar) in the precision
 * the scaling computes in: f32 for FLOAT32/FLOAT16/BFLOAT16, f64 for
 * FLOAT64, i64 for the integers (used modulo 2^width).
 */
typedef union hc_scalar {
    float f32;
    double f64;
    int64_t i64;
} hc_scalar_t;

/* The scalar stored at p as one element of dtype (half types widened to
 * float exactly). dtype must be valid. */
hc_scalar_t hc_scalar_load(const void *p, hcoll_dtype_t dtype);

/* s as one element of dtype at p (half types rounded to nearest-even). */
void hc_scalar_store(void *p, hcoll_dtype_t dtype, hc_scalar_t s);

/* AVG's multiplier over n ranks for a floating dtype: the float 1.0f / n
 * (FLOAT32 and the half types) or the double 1.0 / n (FLOAT64). */
hc_scalar_t hc_scalar_avg(hcoll_dtype_t dtype, int n);

/* 1 for the floating dtypes (AVG pre-multiplies them). */
int hc_dtype_is_float(hcoll_dtype_t dtype);

/* dst[i] = s * src[i], for i < count; dst may equal src. FLOAT32: one float
 * product; FLOAT64: one double product; FLOAT16/BFLOAT16: the element
 * widened to float times s.f32, rounded to nearest-even at the store;
 * integers: the product modulo 2^width (wraps, never traps). */
void hc_reduce_scale(void *dst, const void *src, size_t count, hcoll_dtype_t dtype,
                     hc_scalar_t s);

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

/* HCOLL_CPU_KERNELS (auto, generic, avx2) picks the kernel set, once per
 * process at the first reduction; a set this build or CPU lacks falls back
 * to the best one. HCOLL_SUCCESS, or HCOLL_ERR_INVALID_ARG with a message in
 * err when the set asked for is not the one running (init calls it, so that
 * a test asking for a set never silently runs another). */
hcoll_status_t hc_reduce_check(char *err, size_t errlen);

#endif
