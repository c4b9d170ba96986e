/*
 * Integer AVG finishing: x / d for a whole buffer, with the divisor fixed
 * for the call, bit-identical to C's '/' (truncation toward zero).
 *
 * Why not '/': a hardware divide costs 20–90 cycles per element and does
 * not vectorise, which left the finish at 0.04–0.30 of the memory bound.
 * Each method below replaces it with one multiply by a reciprocal fixed
 * per call; the argument that each is exact is here.
 *
 * 8-bit values, in 16-bit lanes (SSE2's unsigned multiply-high): with
 * m = floor(2^16 / d) + 1 and e = m·d − 2^16 ∈ (0, d], q = (|x|·m) >> 16
 * for |x| ≤ 255 and d ≤ 255, by the argument given for 64 bits below
 * (|x|·e ≤ 255·255 < 2^16). Larger divisors give 0, except −128 / 128.
 *
 * 32-bit values: multiply in double by r = 1/d rounded *up*, then
 * truncate. With |x| < 2^49, q = x/d is reproduced exactly:
 *   - x/d = k exactly: x·r ≥ k as a real (r ≥ 1/d), and rounding is
 *     monotonic with k representable, so the product rounds to ≥ k; and it
 *     is below k + 1 by far more than an ulp, so truncation gives k.
 *   - otherwise x/d = k + f with 1/d ≤ f ≤ 1 − 1/d. r exceeds 1/d by at
 *     most two ulps (the rounding of 1/d, then one nextafter), so x·r
 *     exceeds x/d by at most |x|/d · 2^-51, far below the 1/d of room
 *     left before k + 1 when |x| is that small.
 *   Negative x is symmetric: rounding to nearest is.
 *
 * 64-bit values: Granlund–Montgomery magic numbers. With l = ceil(log2 d)
 * and M = ceil(2^(63+l) / d) (2^63 ≤ M < 2^64), q = (|x| · M) >> (63 + l)
 * for every |x| ≤ 2^63. Write x = q·d + r and e = M·d − 2^(63+l) ∈ [0, d);
 * then |x|·M / 2^(63+l) = q + r/d + |x|·e / (d·2^(63+l)), and the last term
 * is below 1/d because |x|·e < 2^63·2^l, so the floor is q.
 *
 * Included by reduce.c only; the kernels are static to keep the dispatch
 * table the one place that names them.
 */
#ifndef HC_INTDIV_H
#define HC_INTDIV_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef double hc_idv4df __attribute__((vector_size(32)));
typedef int32_t hc_idv4si __attribute__((vector_size(16)));

/* d ≥ 2 in every function below: hc_reduce_avg_finish returns early for 1. */

static inline double hc_idiv_rcp_f64(int d)
{
    return nextafter(1.0 / (double)d, INFINITY);
}

/* 8-bit multiplier: m = floor(2^16 / d) + 1, or 0 when every quotient is
 * 0 except -128 / 128 (d > 128), which the callers fix up. */
static inline uint16_t hc_idiv_m8(int d)
{
    return d > 255 ? 0 : (uint16_t)(65536 / d + 1);
}

static inline uint8_t hc_idiv_u8_one(uint8_t x, uint16_t m)
{
    return (uint8_t)(((uint32_t)x * m) >> 16);
}

static inline int8_t hc_idiv_i8_one(int8_t x, uint16_t m, int d)
{
    if (d > 128)
        return (int8_t)(x == -128 && d == 128 ? -1 : 0);
    uint32_t ax = (uint32_t)(x < 0 ? -x : x);
    int32_t q = (int32_t)((ax * m) >> 16);
    return (int8_t)(x < 0 ? -q : q);
}

static inline void hc_idiv_u8(void *buf, size_t n, int d)
{
    unsigned char *p = buf;
    const uint16_t m = hc_idiv_m8(d);
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i mv = _mm_set1_epi16((short)m), z = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        __m128i lo = _mm_mulhi_epu16(_mm_unpacklo_epi8(v, z), mv);
        __m128i hi = _mm_mulhi_epu16(_mm_unpackhi_epi8(v, z), mv);
        _mm_storeu_si128((__m128i *)(p + i), _mm_packus_epi16(lo, hi));
    }
#endif
    for (; i < n; i++)
        p[i] = hc_idiv_u8_one(p[i], m);
}

static inline void hc_idiv_i8(void *buf, size_t n, int d)
{
    int8_t *p = buf;
    const uint16_t m = hc_idiv_m8(d);
    size_t i = 0;
#if defined(__SSE2__)
    /* |x| in 16-bit lanes, the unsigned multiply-high, the sign back. */
    const __m128i mv = _mm_set1_epi16((short)m), z = _mm_setzero_si128();
    for (; d <= 128 && i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        __m128i s = _mm_cmpgt_epi8(z, v);
        __m128i half[2] = { _mm_unpacklo_epi8(v, s), _mm_unpackhi_epi8(v, s) };
        for (int h = 0; h < 2; h++) {
            __m128i s16 = _mm_srai_epi16(half[h], 15);
            __m128i a = _mm_sub_epi16(_mm_xor_si128(half[h], s16), s16);
            __m128i q = _mm_mulhi_epu16(a, mv);
            half[h] = _mm_sub_epi16(_mm_xor_si128(q, s16), s16);
        }
        _mm_storeu_si128((__m128i *)(p + i), _mm_packs_epi16(half[0], half[1]));
    }
#endif
    for (; i < n; i++)
        p[i] = hc_idiv_i8_one(p[i], m, d);
}

static inline void hc_idiv_i32(void *buf, size_t n, int d)
{
    unsigned char *p = buf;
    const double r = hc_idiv_rcp_f64(d);
    const hc_idv4df rv = { r, r, r, r };
    size_t i = 0;

    for (; i + 4 <= n; i += 4) {
        hc_idv4si v;
        memcpy(&v, p + 4 * i, sizeof v);
        v = __builtin_convertvector(__builtin_convertvector(v, hc_idv4df) * rv, hc_idv4si);
        memcpy(p + 4 * i, &v, sizeof v);
    }
    for (; i < n; i++) {
        int32_t x;
        memcpy(&x, p + 4 * i, 4);
        x = (int32_t)((double)x * r);
        memcpy(p + 4 * i, &x, 4);
    }
}

static inline void hc_idiv_i64(void *buf, size_t n, int d)
{
    unsigned char *p = buf;
    int l = 0;
    while (((uint64_t)1 << l) < (uint64_t)d)
        l++;
    const unsigned __int128 pw = (unsigned __int128)1 << (63 + l);
    const uint64_t m = (uint64_t)((pw + (unsigned __int128)(d - 1)) / (unsigned)d);

    for (size_t i = 0; i < n; i++) {
        int64_t x;
        memcpy(&x, p + 8 * i, 8);
        uint64_t ax = x < 0 ? 0 - (uint64_t)x : (uint64_t)x;
        /* The high half of the product, then the rest of the shift
         * (63 + l − 64 = l − 1, l ≥ 1). */
        uint64_t q = (uint64_t)(((unsigned __int128)ax * m) >> 64) >> (l - 1);
        x = x < 0 ? (int64_t)(0 - q) : (int64_t)q;
        memcpy(p + 8 * i, &x, 8);
    }
}

#endif
