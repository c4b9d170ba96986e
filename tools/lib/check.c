/*
 * Inputs whose reductions are exact in any order (the idea of nccl-tests'
 * verifiable/): every rank's element i is a small integer chosen so that
 *   SUM   the total stays below the type's exact-integer limit
 *   PROD  at most one factor is 2, the rest are +-1
 *   MAX/MIN  any small integers
 *   AVG   the total is a multiple of nranks, so the one division is exact
 *         (floats, pre-multiplied by 1/n: checked for n a power of two)
 * Integer types wrap on SUM/PROD, which is exact modular arithmetic in any
 * order, so they only need the AVG limit. The expected result is then one
 * value per element, compared bit for bit.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "perf.h"

/* Largest integer magnitude every intermediate may reach exactly. */
static double exact_limit(hcoll_dtype_t t)
{
    switch (t) {
    case HCOLL_FLOAT32: return 0x1p24;
    case HCOLL_FLOAT16: return 2048;
    case HCOLL_BFLOAT16: return 256;
    case HCOLL_FLOAT64: return 0x1p53;
    case HCOLL_INT8: return 127;
    case HCOLL_UINT8: return 255;
    case HCOLL_INT32: return 2147483647.0;
    case HCOLL_INT64: return 0x1p62;
    default: return 0;
    }
}

static int is_int(hcoll_dtype_t t)
{
    return t == HCOLL_INT8 || t == HCOLL_UINT8 || t == HCOLL_INT32 || t == HCOLL_INT64;
}

/* SUM values are 0..k with k*nranks within the limit (k <= 3). */
static int64_t sum_k(hcoll_dtype_t t, int nranks)
{
    if (is_int(t))
        return 3;
    double k = floor(exact_limit(t) / (nranks > 0 ? nranks : 1));
    return k >= 3 ? 3 : (int64_t)k;
}

static int64_t value(hcoll_dtype_t t, hcoll_op_t op, int rank, int nranks, size_t i)
{
    int64_t r = rank, n = nranks;
    switch (op) {
    case HCOLL_SUM: {
        /* Rank 0 steps every third element, the others every element, so
         * the total changes along the vector (period 3(k+1)) and a
         * reduce-scatter block read from the wrong place shows. */
        int64_t k = sum_k(t, nranks);
        uint64_t j = r == 0 ? i / 3 : i;
        return k > 0 ? (int64_t)((j + 3 * (uint64_t)r) % (uint64_t)(k + 1)) : 0;
    }
    case HCOLL_PROD: {
        int64_t mag = (int64_t)(i % (uint64_t)n) == r ? 2 : 1;
        return (i + r) % 3 == 0 ? -mag : mag;
    }
    case HCOLL_MAX:
    case HCOLL_MIN: return (int64_t)((i * 13 + (uint64_t)r * 7) % 17);
    case HCOLL_AVG: return (int64_t)(i % 4) + ((int64_t)((i + r) % (uint64_t)n) == 0 ? n : 0);
    default: return 0;
    }
}

static int64_t expected(hcoll_dtype_t t, hcoll_op_t op, int nranks, size_t i)
{
    int64_t acc = value(t, op, 0, nranks, i);
    for (int r = 1; r < nranks; r++) {
        int64_t v = value(t, op, r, nranks, i);
        switch (op) {
        case HCOLL_SUM:
        case HCOLL_AVG: acc += v; break;
        case HCOLL_PROD: acc *= v; break;
        case HCOLL_MAX: acc = v > acc ? v : acc; break;
        case HCOLL_MIN: acc = v < acc ? v : acc; break;
        default: break;
        }
    }
    if (op == HCOLL_AVG)
        acc /= nranks; /* exact by construction */
    return acc;
}

/* Exact small integers only: sign, exponent and the top mantissa bits. */
static uint16_t int_to_half(int64_t v)
{
    if (v == 0)
        return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    uint64_t m = (uint64_t)(v < 0 ? -v : v);
    int e = 63 - __builtin_clzll(m);             /* value = 1.f × 2^e */
    uint16_t frac = (uint16_t)(((m << (63 - e)) >> 53) & 0x3ff); /* 10 bits below the 1 */
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | frac);
}

static uint16_t int_to_bf16(int64_t v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact: at most 8 significant bits */
}

static void store(void *buf, size_t i, hcoll_dtype_t t, int64_t v)
{
    switch (t) {
    case HCOLL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case HCOLL_FLOAT64: ((double *)buf)[i] = (double)v; break;
    case HCOLL_FLOAT16: ((uint16_t *)buf)[i] = int_to_half(v); break;
    case HCOLL_BFLOAT16: ((uint16_t *)buf)[i] = int_to_bf16(v); break;
    /* Integers: two's complement truncation is the wrap-around result. */
    case HCOLL_INT8:
    case HCOLL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(uint64_t)v; break;
    case HCOLL_INT32: ((uint32_t *)buf)[i] = (uint32_t)(uint64_t)v; break;
    case HCOLL_INT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    default: break;
    }
}

void hp_check_fill(void *buf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op, int rank,
                   int nranks)
{
    for (size_t i = 0; i < count; i++)
        store(buf, i, dtype, value(dtype, op, rank, nranks, i));
}

size_t hp_check_count_wrong_at(const void *buf, size_t count, size_t first, hcoll_dtype_t dtype,
                               hcoll_op_t op, int nranks)
{
    size_t es = hcoll_dtype_size(dtype), wrong = 0;
    unsigned char want[8];
    /* The expected values repeat with a period that divides
     * lcm(17, 4·nranks, 12·nranks...); computing each is cheap enough. */
    for (size_t i = 0; i < count; i++) {
        store(want, 0, dtype, expected(dtype, op, nranks, first + i));
        if (memcmp((const unsigned char *)buf + i * es, want, es) != 0)
            wrong++;
    }
    return wrong;
}

size_t hp_check_count_wrong(const void *buf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                            int nranks)
{
    return hp_check_count_wrong_at(buf, count, 0, dtype, op, nranks);
}

/* 127 is prime: blocks of a power-of-two count start at different values,
 * and every value (0..126) is exact even in int8 and bfloat16. */
#define COPY_PERIOD 127

void hp_check_fill_copy(void *buf, size_t count, size_t first, hcoll_dtype_t dtype)
{
    for (size_t i = 0; i < count; i++)
        store(buf, i, dtype, (int64_t)((first + i) % COPY_PERIOD));
}

size_t hp_check_count_wrong_copy(const void *buf, size_t count, hcoll_dtype_t dtype)
{
    size_t es = hcoll_dtype_size(dtype), wrong = 0;
    unsigned char want[8];
    for (size_t i = 0; i < count; i++) {
        store(want, 0, dtype, (int64_t)(i % COPY_PERIOD));
        if (memcmp((const unsigned char *)buf + i * es, want, es) != 0)
            wrong++;
    }
    return wrong;
}

int hp_check_exact(hcoll_dtype_t dtype, hcoll_op_t op, int nranks)
{
    double lim = exact_limit(dtype);
    switch (op) {
    case HCOLL_SUM: return is_int(dtype) || sum_k(dtype, nranks) >= 1;
    case HCOLL_PROD: return 1;
    case HCOLL_MAX:
    case HCOLL_MIN: return 1;
    case HCOLL_AVG:
        /* Floats multiply each input by 1/n first (hcoll.h): exact, in any
         * order, only where 1/n is a power of two. */
        if (!is_int(dtype) && (nranks & (nranks - 1)) != 0)
            return 0;
        return 4.0 * nranks + 3 <= lim; /* the largest total: n·(3+1) */
    default: return 0;
    }
}
