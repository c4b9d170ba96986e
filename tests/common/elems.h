/*
 * Element conversions for the reference side of the collective tests:
 * float <-> binary16 and bfloat16 with round to nearest-even, and element
 * i of a buffer of any dtype as a double. Written here rather than taken
 * from the library, so that a reference never shares the library's bugs.
 */
#ifndef HCT_ELEMS_H
#define HCT_ELEMS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hcoll.h"

static inline int is_float(hcoll_dtype_t dt)
{
    return dt == HCOLL_FLOAT32 || dt == HCOLL_FLOAT16 || dt == HCOLL_BFLOAT16 ||
           dt == HCOLL_FLOAT64;
}

/* float -> IEEE binary16, round to nearest-even. */
static inline uint16_t f2h(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half or zero */
        uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u;
        if (e == 0)
            return sign;
        uint32_t shift = 126 - e;
        if (shift > 24)
            return sign;
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return sign | (uint16_t)q;
    }
    uint32_t m = ax + 0xfffu + ((ax >> 13) & 1);
    return sign | (uint16_t)((m - 0x38000000u) >> 13);
}

static inline float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff, x;
    if (e == 0) {
        float v = (float)man / 16777216.0f;
        return sign ? -v : v;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (man << 13);
    else
        x = sign | ((e + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t f2bf(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static inline float bf2f(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Store v (exactly representable, or rounded to nearest-even) as element i. */
static inline void put(hcoll_dtype_t dt, void *buf, size_t i, double v)
{
    unsigned char *p = (unsigned char *)buf + i * hcoll_dtype_size(dt);
    switch (dt) {
    case HCOLL_FLOAT32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case HCOLL_FLOAT64: memcpy(p, &v, 8); break;
    case HCOLL_FLOAT16: { uint16_t h = f2h((float)v); memcpy(p, &h, 2); break; }
    case HCOLL_BFLOAT16: { uint16_t h = f2bf((float)v); memcpy(p, &h, 2); break; }
    case HCOLL_INT8: { int8_t x = (int8_t)(int64_t)v; memcpy(p, &x, 1); break; }
    case HCOLL_UINT8: { uint8_t x = (uint8_t)(int64_t)v; memcpy(p, &x, 1); break; }
    case HCOLL_INT32: { int32_t x = (int32_t)(int64_t)v; memcpy(p, &x, 4); break; }
    case HCOLL_INT64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    default: break;
    }
}

/* Element i as a double, for messages and tolerance checks. */
static inline double get(hcoll_dtype_t dt, const void *buf, size_t i)
{
    const unsigned char *p = (const unsigned char *)buf + i * hcoll_dtype_size(dt);
    switch (dt) {
    case HCOLL_FLOAT32: { float f; memcpy(&f, p, 4); return f; }
    case HCOLL_FLOAT64: { double d; memcpy(&d, p, 8); return d; }
    case HCOLL_FLOAT16: { uint16_t h; memcpy(&h, p, 2); return h2f(h); }
    case HCOLL_BFLOAT16: { uint16_t h; memcpy(&h, p, 2); return bf2f(h); }
    case HCOLL_INT8: { int8_t x; memcpy(&x, p, 1); return x; }
    case HCOLL_UINT8: { uint8_t x; memcpy(&x, p, 1); return x; }
    case HCOLL_INT32: { int32_t x; memcpy(&x, p, 4); return x; }
    case HCOLL_INT64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    default: return 0;
    }
}

#endif
