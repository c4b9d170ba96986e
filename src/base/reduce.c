/*
 * Host reduction kernels: dst[i] = a[i] op b[i] for every dtype and op.
 *
 * Semantics (hcoll.h): half types are widened to float, combined, and
 * rounded to nearest-even on store; integer SUM/PROD wrap (done in unsigned
 * types, so there is no signed-overflow UB); MAX/MIN return NaN when either
 * input is NaN; AVG reduces as SUM and hc_reduce_avg_finish divides once.
 *
 * Why explicit vectors: the library is built with plain -O2, where GCC's
 * "very-cheap" vectoriser leaves every loop of unknown length scalar. GNU
 * vector types state the width instead of hoping for it, and still lower to
 * whatever the target has (SSE2 baseline here, NEON elsewhere).
 *
 * Why run-time dispatch: the build cannot assume more than SSE2, yet AVX2
 * doubles the width and F16C is the only way to convert fp16 at memory
 * speed. The same kernel templates are therefore instantiated twice, once
 * for the baseline and once with target("avx2,f16c"), and one table of
 * function pointers is picked from cpuid on first use (pthread_once). That
 * pointer is the only mutable global; it is written once and read after.
 * FMA is left out of the target on purpose: with -ffp-contract=fast GCC
 * could fuse multiply-adds and make the two paths round differently.
 *
 * Why the paths agree bit for bit (for every non-NaN result): the vector
 * body and the scalar tail evaluate the same expression ("x > y ? x : y" is
 * exactly what maxps computes), and the scalar half conversions round and
 * quiet NaNs the way F16C does. So a result never depends on where an
 * element falls in a vector, nor on which CPU a rank runs.
 *
 * Why no restrict: dst may equal a or b. Every block loads all its inputs
 * before storing, and all memory goes through memcpy on byte pointers, so
 * exact aliasing is correct and pointers need no alignment.
 */
#include "base/reduce.h"
#include "base/intdiv.h"

#include "base/config.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

typedef void (*hc_reduce_fn_t)(void *dst, const void *a, const void *b, size_t n);
typedef void (*hc_avg_fn_t)(void *buf, size_t n, int nranks);

/* Kernel slots per dtype; AVG reduces with the SUM kernel. */
enum { HC_RK_SUM, HC_RK_PROD, HC_RK_MAX, HC_RK_MIN, HC_RK_COUNT };

typedef struct hc_reduce_impl {
    const char *name;
    hc_reduce_fn_t reduce[HCOLL_DTYPE_COUNT_][HC_RK_COUNT];
    hc_avg_fn_t avg[HCOLL_DTYPE_COUNT_];
} hc_reduce_impl_t;

/* Floats in which half types are widened and combined, and the words
 * they are loaded as: 16 bytes for the baseline, 32 for AVX2. */
typedef float hc_f32x4_t __attribute__((vector_size(16)));
typedef uint32_t hc_u32x4_t __attribute__((vector_size(16)));
typedef float hc_f32x8_t __attribute__((vector_size(32)));
typedef uint32_t hc_u32x8_t __attribute__((vector_size(32)));

/* ------------------------------------------------------------------------ */
/* Scalar conversions                                                         */
/* ------------------------------------------------------------------------ */

static inline uint32_t hc_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float hc_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Integer-only, so the result does not depend on the FP environment. A
 * signalling NaN comes back quiet, as VCVTPH2PS does. */
float hc_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0x1f)
        return hc_f32_from_bits(sign | 0x7f800000u | (mant ? 0x400000u | (mant << 13) : 0));
    if (exp == 0) {
        if (mant == 0)
            return hc_f32_from_bits(sign);
        /* Subnormal: shift the leading one up to the implicit bit. */
        int shift = __builtin_clz(mant) - 21;
        mant = (mant << shift) & 0x3ffu;
        return hc_f32_from_bits(sign | ((uint32_t)(113 - shift) << 23) | (mant << 13));
    }
    return hc_f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Round to nearest-even, overflow to inf; NaN keeps the top of its payload
 * and is made quiet, as VCVTPS2PH does, so both paths give the same bits. */
uint16_t hc_float_to_half(float f)
{
    uint32_t u = hc_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;

    if (u > 0x7f800000u)
        return sign | 0x7e00u | (uint16_t)((u >> 13) & 0x3ffu);
    if (u >= 0x477ff000u) /* >= 65520: the tie above 65504 goes to even, inf */
        return sign | 0x7c00u;
    if (u < 0x38800000u) { /* below 2^-14: a half subnormal, or zero */
        if (u < 0x33000000u) /* below half the smallest subnormal */
            return sign;
        uint32_t exp = u >> 23;
        uint32_t mant = (u & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp; /* 14..24 */
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        r += rem > halfway || (rem == halfway && (r & 1));
        return sign | (uint16_t)r; /* a carry to 0x400 is the smallest normal */
    }
    uint32_t r = (u - (112u << 23)) >> 13;
    uint32_t rem = u & 0x1fffu;
    r += rem > 0x1000u || (rem == 0x1000u && (r & 1));
    return sign | (uint16_t)r; /* a carry into the exponent is still right */
}

float hc_bf16_to_float(uint16_t h)
{
    return hc_f32_from_bits((uint32_t)h << 16);
}

/* NaN is handled first: rounding a NaN whose payload sits only in the low
 * 16 bits would otherwise truncate or carry it into inf. */
uint16_t hc_float_to_bf16(float f)
{
    uint32_t u = hc_f32_bits(f);

    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ------------------------------------------------------------------------ */
/* Element operations, scalar (S) and vector (V)                              */
/* ------------------------------------------------------------------------ */

#define HC_S_SUM(x, y)  ((x) + (y))
#define HC_S_PROD(x, y) ((x) * (y))
#define HC_S_MAX(x, y)  ((x) > (y) ? (x) : (y))
#define HC_S_MIN(x, y)  ((x) < (y) ? (x) : (y))
/* x + y is NaN when either is, and quiet: the cheapest NaN to return. */
#define HC_S_FMAX(x, y)                                                       \
    __extension__({                                                           \
        __typeof__(x) x_ = (x), y_ = (y);                                     \
        (x_ != x_ || y_ != y_) ? x_ + y_ : (x_ > y_ ? x_ : y_);               \
    })
#define HC_S_FMIN(x, y)                                                       \
    __extension__({                                                           \
        __typeof__(x) x_ = (x), y_ = (y);                                     \
        (x_ != x_ || y_ != y_) ? x_ + y_ : (x_ < y_ ? x_ : y_);               \
    })

/* C has no vector ?: (only C++), so selects are masks. */
#define HC_V_SELECT(m, x, y)                                                  \
    ((__typeof__(x))(((m) & (__typeof__(m))(x)) | (~(m) & (__typeof__(m))(y))))

#define HC_V_SUM(x, y)  ((x) + (y))
#define HC_V_PROD(x, y) ((x) * (y))
#define HC_V_MAX(x, y)                                                        \
    __extension__({                                                           \
        __typeof__(x) x_ = (x), y_ = (y);                                     \
        HC_V_SELECT(x_ > y_, x_, y_);                                         \
    })
#define HC_V_MIN(x, y)                                                        \
    __extension__({                                                           \
        __typeof__(x) x_ = (x), y_ = (y);                                     \
        HC_V_SELECT(x_ < y_, x_, y_);                                         \
    })
#define HC_V_FMAX(x, y)                                                       \
    __extension__({                                                           \
        __typeof__(x) x_ = (x), y_ = (y);                                     \
        __typeof__(x_ > y_) nan_ = (x_ != x_) | (y_ != y_);                   \
        HC_V_SELECT(nan_, x_ + y_, HC_V_SELECT(x_ > y_, x_, y_));             \
    })
#define HC_V_FMIN(x, y)                                                       \
    __extension__({                                                           \
        __typeof__(x) x_ = (x), y_ = (y);                                     \
        __typeof__(x_ > y_) nan_ = (x_ != x_) | (y_ != y_);                   \
        HC_V_SELECT(nan_, x_ + y_, HC_V_SELECT(x_ < y_, x_, y_));             \
    })

/* ------------------------------------------------------------------------ */
/* Half-type loads and stores                                                 */
/* ------------------------------------------------------------------------ */

/*
 * LOAD(p, lo, hi, FV, UV) widens sizeof(FV) bytes of halves at p into two
 * float vectors of type FV; STORE(p, lo, hi, FV, UV) rounds them back. UV
 * is the matching vector of uint32_t. The element order inside lo/hi is the
 * loader's business: the ops are elementwise and STORE undoes it.
 */

/*
 * bf16 needs no shuffle: seen as 32-bit words, element 2k sits in the low
 * half and 2k+1 in the high half, so a shift and a mask give the floats of
 * the even and the odd elements, and the store puts each rounded high half
 * back in its place. Plain integer vector code, fast with SSE2, AVX2 or NEON.
 */
#define HC_BF16_LOAD(p, ev, od, FV, UV)                                       \
    do {                                                                      \
        UV w_;                                                                \
        memcpy(&w_, (p), sizeof w_);                                          \
        (ev) = (FV)(w_ << 16);                                                \
        (od) = (FV)(w_ & 0xffff0000u);                                        \
    } while (0)
/* The rounded bf16 in the high half of each word; a NaN only gets its quiet
 * bit, as in hc_float_to_bf16. The NaN test is an integer compare (on a
 * value whose sign bit is clear, so signed is fine) because SSE2 has no
 * unsigned one. */
#define HC_BF16_ROUND_HI(v, UV)                                               \
    __extension__({                                                           \
        UV u_ = (UV)(v);                                                      \
        UV nan_ = (UV)(((__typeof__(u_ > u_))(u_ & 0x7fffffffu)) > 0x7f800000); \
        (nan_ & (u_ | 0x400000u)) | (~nan_ & (u_ + 0x7fffu + ((u_ >> 16) & 1u))); \
    })
#define HC_BF16_STORE(p, ev, od, FV, UV)                                      \
    do {                                                                      \
        UV w_ = (HC_BF16_ROUND_HI(ev, UV) >> 16) |                            \
                (HC_BF16_ROUND_HI(od, UV) & 0xffff0000u);                     \
        memcpy((p), &w_, sizeof w_);                                          \
    } while (0)

/* fp16 without F16C: scalar conversion, element by element. */
#define HC_F16SW_LOAD(p, lo, hi, FV, UV)                                      \
    do {                                                                      \
        enum { k_n = sizeof(FV) / sizeof(float) };                            \
        uint16_t h_[2 * k_n];                                                 \
        memcpy(h_, (p), sizeof h_);                                           \
        for (int k_ = 0; k_ < k_n; k_++) {                                    \
            (lo)[k_] = hc_half_to_float(h_[k_]);                              \
            (hi)[k_] = hc_half_to_float(h_[k_ + k_n]);                        \
        }                                                                     \
    } while (0)
#define HC_F16SW_STORE(p, lo, hi, FV, UV)                                     \
    do {                                                                      \
        enum { k_n = sizeof(FV) / sizeof(float) };                            \
        uint16_t h_[2 * k_n];                                                 \
        for (int k_ = 0; k_ < k_n; k_++) {                                    \
            h_[k_] = hc_float_to_half((lo)[k_]);                              \
            h_[k_ + k_n] = hc_float_to_half((hi)[k_]);                        \
        }                                                                     \
        memcpy((p), h_, sizeof h_);                                           \
    } while (0)

#if defined(__x86_64__)
/* Only with FV = hc_f32x8_t: 16 halves, 32 bytes. The explicit rounding
 * immediate ignores MXCSR, so a caller's rounding mode cannot change
 * results. */
#define HC_F16C_LOAD(p, lo, hi, FV, UV)                                       \
    do {                                                                      \
        (lo) = _mm256_cvtph_ps(                                               \
            _mm_loadu_si128((const __m128i *)(const void *)(p)));             \
        (hi) = _mm256_cvtph_ps(                                               \
            _mm_loadu_si128((const __m128i *)(const void *)((p) + 16)));      \
    } while (0)
#define HC_F16C_STORE(p, lo, hi, FV, UV)                                      \
    do {                                                                      \
        _mm_storeu_si128((__m128i *)(void *)(p),                              \
                         _mm256_cvtps_ph((lo), _MM_FROUND_TO_NEAREST_INT));   \
        _mm_storeu_si128((__m128i *)(void *)((p) + 16),                       \
                         _mm256_cvtps_ph((hi), _MM_FROUND_TO_NEAREST_INT));   \
    } while (0)

/* maxps is exactly "x > y ? x : y" and cmpunord finds a NaN in either input
 * in one instruction: half the work of the portable selects, which matters
 * for bf16, where conversion already costs most of the budget. */
#define HC_AVX2_FMAX_PS(x, y)                                                 \
    __extension__({                                                           \
        __m256 x_ = (x), y_ = (y);                                            \
        _mm256_blendv_ps(_mm256_max_ps(x_, y_), _mm256_add_ps(x_, y_),        \
                         _mm256_cmp_ps(x_, y_, _CMP_UNORD_Q));                \
    })
#define HC_AVX2_FMIN_PS(x, y)                                                 \
    __extension__({                                                           \
        __m256 x_ = (x), y_ = (y);                                            \
        _mm256_blendv_ps(_mm256_min_ps(x_, y_), _mm256_add_ps(x_, y_),        \
                         _mm256_cmp_ps(x_, y_, _CMP_UNORD_Q));                \
    })
#define HC_AVX2_FMAX_PD(x, y)                                                 \
    __extension__({                                                           \
        __m256d x_ = (x), y_ = (y);                                           \
        _mm256_blendv_pd(_mm256_max_pd(x_, y_), _mm256_add_pd(x_, y_),        \
                         _mm256_cmp_pd(x_, y_, _CMP_UNORD_Q));                \
    })
#define HC_AVX2_FMIN_PD(x, y)                                                 \
    __extension__({                                                           \
        __m256d x_ = (x), y_ = (y);                                           \
        _mm256_blendv_pd(_mm256_min_pd(x_, y_), _mm256_add_pd(x_, y_),        \
                         _mm256_cmp_pd(x_, y_, _CMP_UNORD_Q));                \
    })
#endif

/* ------------------------------------------------------------------------ */
/* Kernel templates                                                           */
/* ------------------------------------------------------------------------ */

/*
 * A type that is its own arithmetic type. Two vectors per step: enough
 * loads in flight to stream from memory, short enough that the scalar tail
 * stays short.
 */
#define HC_DEF_PLAIN(isa, TGT, VB, name, T, VOP, SOP)                         \
    static TGT void hc_##isa##_##name(void *dst, const void *a, const void *b, \
                                      size_t n)                               \
    {                                                                         \
        typedef T vec_t_ __attribute__((vector_size(VB)));                    \
        const size_t per = VB / sizeof(T);                                    \
        unsigned char *d = dst;                                               \
        const unsigned char *pa = a, *pb = b;                                 \
        size_t i = 0;                                                         \
        for (; n - i >= 2 * per; i += 2 * per) {                              \
            vec_t_ x0, x1, y0, y1, r0, r1;                                    \
            memcpy(&x0, pa + i * sizeof(T), VB);                              \
            memcpy(&x1, pa + i * sizeof(T) + VB, VB);                         \
            memcpy(&y0, pb + i * sizeof(T), VB);                              \
            memcpy(&y1, pb + i * sizeof(T) + VB, VB);                         \
            r0 = VOP(x0, y0);                                                 \
            r1 = VOP(x1, y1);                                                 \
            memcpy(d + i * sizeof(T), &r0, VB);                               \
            memcpy(d + i * sizeof(T) + VB, &r1, VB);                          \
        }                                                                     \
        for (; i < n; i++) {                                                  \
            T x, y, r;                                                        \
            memcpy(&x, pa + i * sizeof(T), sizeof x);                         \
            memcpy(&y, pb + i * sizeof(T), sizeof y);                         \
            r = SOP(x, y);                                                    \
            memcpy(d + i * sizeof(T), &r, sizeof r);                          \
        }                                                                     \
    }

/* A half type: sizeof(FV) bytes of each input (two float vectors) per
 * step. */
#define HC_DEF_HALF(isa, TGT, name, FV, UV, LOAD, STORE, TO_F, FROM_F, VOP, SOP) \
    static TGT void hc_##isa##_##name(void *dst, const void *a, const void *b, \
                                      size_t n)                               \
    {                                                                         \
        const size_t per = sizeof(FV) / 2;                                    \
        unsigned char *d = dst;                                               \
        const unsigned char *pa = a, *pb = b;                                 \
        size_t i = 0;                                                         \
        for (; n - i >= per; i += per) {                                      \
            FV x0, x1, y0, y1, r0, r1;                                        \
            LOAD(pa + 2 * i, x0, x1, FV, UV);                                 \
            LOAD(pb + 2 * i, y0, y1, FV, UV);                                 \
            r0 = VOP(x0, y0);                                                 \
            r1 = VOP(x1, y1);                                                 \
            STORE(d + 2 * i, r0, r1, FV, UV);                                 \
        }                                                                     \
        for (; i < n; i++) {                                                  \
            uint16_t x, y, r;                                                 \
            memcpy(&x, pa + 2 * i, 2);                                        \
            memcpy(&y, pb + 2 * i, 2);                                        \
            r = FROM_F(SOP(TO_F(x), TO_F(y)));                                \
            memcpy(d + 2 * i, &r, 2);                                         \
        }                                                                     \
    }

/* Float AVG: a true division (not a reciprocal multiply), as documented. */
#define HC_DEF_AVG_PLAIN(isa, TGT, VB, name, T)                               \
    static TGT void hc_##isa##_avg_##name(void *buf, size_t n, int nranks)    \
    {                                                                         \
        typedef T vec_t_ __attribute__((vector_size(VB)));                    \
        const size_t per = VB / sizeof(T);                                    \
        const T div = (T)nranks;                                              \
        unsigned char *p = buf;                                               \
        size_t i = 0;                                                         \
        for (; n - i >= per; i += per) {                                      \
            vec_t_ x;                                                         \
            memcpy(&x, p + i * sizeof(T), VB);                                \
            x = x / div;                                                      \
            memcpy(p + i * sizeof(T), &x, VB);                                \
        }                                                                     \
        for (; i < n; i++) {                                                  \
            T x;                                                              \
            memcpy(&x, p + i * sizeof(T), sizeof x);                          \
            x = x / div;                                                      \
            memcpy(p + i * sizeof(T), &x, sizeof x);                          \
        }                                                                     \
    }

#define HC_DEF_AVG_HALF(isa, TGT, name, FV, UV, LOAD, STORE, TO_F, FROM_F)    \
    static TGT void hc_##isa##_avg_##name(void *buf, size_t n, int nranks)    \
    {                                                                         \
        const size_t per = sizeof(FV) / 2;                                    \
        const float div = (float)nranks;                                      \
        unsigned char *p = buf;                                               \
        size_t i = 0;                                                         \
        for (; n - i >= per; i += per) {                                      \
            FV x0, x1;                                                        \
            LOAD(p + 2 * i, x0, x1, FV, UV);                                  \
            x0 = x0 / div;                                                    \
            x1 = x1 / div;                                                    \
            STORE(p + 2 * i, x0, x1, FV, UV);                                 \
        }                                                                     \
        for (; i < n; i++) {                                                  \
            uint16_t h;                                                       \
            memcpy(&h, p + 2 * i, 2);                                         \
            h = FROM_F(TO_F(h) / div);                                        \
            memcpy(p + 2 * i, &h, 2);                                         \
        }                                                                     \
    }

/* Integer AVG finishing (truncation toward zero, as C's '/') multiplies
 * by a per-call reciprocal: base/intdiv.h, where the exactness is argued. */

/*
 * Every kernel of one instruction set. Integer SUM/PROD use unsigned
 * element types (wrap-around is defined there); MAX/MIN use the signed ones.
 */
#define HC_DEF_ALL(isa, TGT, VB, FV, UV, F16_LOAD, F16_STORE, FMAX_PS, FMIN_PS, \
                   FMAX_PD, FMIN_PD)                                          \
    HC_DEF_PLAIN(isa, TGT, VB, f32_sum, float, HC_V_SUM, HC_S_SUM)            \
    HC_DEF_PLAIN(isa, TGT, VB, f32_prod, float, HC_V_PROD, HC_S_PROD)         \
    HC_DEF_PLAIN(isa, TGT, VB, f32_max, float, FMAX_PS, HC_S_FMAX)            \
    HC_DEF_PLAIN(isa, TGT, VB, f32_min, float, FMIN_PS, HC_S_FMIN)            \
    HC_DEF_PLAIN(isa, TGT, VB, f64_sum, double, HC_V_SUM, HC_S_SUM)           \
    HC_DEF_PLAIN(isa, TGT, VB, f64_prod, double, HC_V_PROD, HC_S_PROD)        \
    HC_DEF_PLAIN(isa, TGT, VB, f64_max, double, FMAX_PD, HC_S_FMAX)           \
    HC_DEF_PLAIN(isa, TGT, VB, f64_min, double, FMIN_PD, HC_S_FMIN)           \
    HC_DEF_PLAIN(isa, TGT, VB, i8_sum, uint8_t, HC_V_SUM, HC_S_SUM)           \
    HC_DEF_PLAIN(isa, TGT, VB, i8_prod, uint8_t, HC_V_PROD, HC_S_PROD)        \
    HC_DEF_PLAIN(isa, TGT, VB, i8_max, int8_t, HC_V_MAX, HC_S_MAX)            \
    HC_DEF_PLAIN(isa, TGT, VB, i8_min, int8_t, HC_V_MIN, HC_S_MIN)            \
    HC_DEF_PLAIN(isa, TGT, VB, u8_max, uint8_t, HC_V_MAX, HC_S_MAX)           \
    HC_DEF_PLAIN(isa, TGT, VB, u8_min, uint8_t, HC_V_MIN, HC_S_MIN)           \
    HC_DEF_PLAIN(isa, TGT, VB, i32_sum, uint32_t, HC_V_SUM, HC_S_SUM)         \
    HC_DEF_PLAIN(isa, TGT, VB, i32_prod, uint32_t, HC_V_PROD, HC_S_PROD)      \
    HC_DEF_PLAIN(isa, TGT, VB, i32_max, int32_t, HC_V_MAX, HC_S_MAX)          \
    HC_DEF_PLAIN(isa, TGT, VB, i32_min, int32_t, HC_V_MIN, HC_S_MIN)          \
    HC_DEF_PLAIN(isa, TGT, VB, i64_sum, uint64_t, HC_V_SUM, HC_S_SUM)         \
    HC_DEF_PLAIN(isa, TGT, VB, i64_prod, uint64_t, HC_V_PROD, HC_S_PROD)      \
    HC_DEF_PLAIN(isa, TGT, VB, i64_max, int64_t, HC_V_MAX, HC_S_MAX)          \
    HC_DEF_PLAIN(isa, TGT, VB, i64_min, int64_t, HC_V_MIN, HC_S_MIN)          \
    HC_DEF_HALF(isa, TGT, bf16_sum, FV, UV, HC_BF16_LOAD, HC_BF16_STORE,      \
                hc_bf16_to_float, hc_float_to_bf16, HC_V_SUM, HC_S_SUM)       \
    HC_DEF_HALF(isa, TGT, bf16_prod, FV, UV, HC_BF16_LOAD, HC_BF16_STORE,     \
                hc_bf16_to_float, hc_float_to_bf16, HC_V_PROD, HC_S_PROD)     \
    HC_DEF_HALF(isa, TGT, bf16_max, FV, UV, HC_BF16_LOAD, HC_BF16_STORE,      \
                hc_bf16_to_float, hc_float_to_bf16, FMAX_PS, HC_S_FMAX)       \
    HC_DEF_HALF(isa, TGT, bf16_min, FV, UV, HC_BF16_LOAD, HC_BF16_STORE,      \
                hc_bf16_to_float, hc_float_to_bf16, FMIN_PS, HC_S_FMIN)       \
    HC_DEF_HALF(isa, TGT, f16_sum, FV, UV, F16_LOAD, F16_STORE,               \
                hc_half_to_float, hc_float_to_half, HC_V_SUM, HC_S_SUM)       \
    HC_DEF_HALF(isa, TGT, f16_prod, FV, UV, F16_LOAD, F16_STORE,              \
                hc_half_to_float, hc_float_to_half, HC_V_PROD, HC_S_PROD)     \
    HC_DEF_HALF(isa, TGT, f16_max, FV, UV, F16_LOAD, F16_STORE,               \
                hc_half_to_float, hc_float_to_half, FMAX_PS, HC_S_FMAX)       \
    HC_DEF_HALF(isa, TGT, f16_min, FV, UV, F16_LOAD, F16_STORE,               \
                hc_half_to_float, hc_float_to_half, FMIN_PS, HC_S_FMIN)       \
    HC_DEF_AVG_PLAIN(isa, TGT, VB, f32, float)                                \
    HC_DEF_AVG_PLAIN(isa, TGT, VB, f64, double)                               \
    HC_DEF_AVG_HALF(isa, TGT, bf16, FV, UV, HC_BF16_LOAD, HC_BF16_STORE,      \
                    hc_bf16_to_float, hc_float_to_bf16)                       \
    HC_DEF_AVG_HALF(isa, TGT, f16, FV, UV, F16_LOAD, F16_STORE, hc_half_to_float, \
                    hc_float_to_half)

/* The kernels' table for one instruction set. uint8 SUM/PROD wrap exactly
 * like int8's, so they share the kernel. */
#define HC_IMPL_TABLE(isa, label)                                             \
    static const hc_reduce_impl_t hc_reduce_impl_##isa = {                    \
        .name = label,                                                        \
        .reduce = {                                                           \
            [HCOLL_FLOAT32] = { hc_##isa##_f32_sum, hc_##isa##_f32_prod,      \
                                hc_##isa##_f32_max, hc_##isa##_f32_min },     \
            [HCOLL_FLOAT16] = { hc_##isa##_f16_sum, hc_##isa##_f16_prod,      \
                                hc_##isa##_f16_max, hc_##isa##_f16_min },     \
            [HCOLL_BFLOAT16] = { hc_##isa##_bf16_sum, hc_##isa##_bf16_prod,   \
                                 hc_##isa##_bf16_max, hc_##isa##_bf16_min },  \
            [HCOLL_FLOAT64] = { hc_##isa##_f64_sum, hc_##isa##_f64_prod,      \
                                hc_##isa##_f64_max, hc_##isa##_f64_min },     \
            [HCOLL_INT8] = { hc_##isa##_i8_sum, hc_##isa##_i8_prod,           \
                             hc_##isa##_i8_max, hc_##isa##_i8_min },          \
            [HCOLL_UINT8] = { hc_##isa##_i8_sum, hc_##isa##_i8_prod,          \
                              hc_##isa##_u8_max, hc_##isa##_u8_min },         \
            [HCOLL_INT32] = { hc_##isa##_i32_sum, hc_##isa##_i32_prod,        \
                              hc_##isa##_i32_max, hc_##isa##_i32_min },       \
            [HCOLL_INT64] = { hc_##isa##_i64_sum, hc_##isa##_i64_prod,        \
                              hc_##isa##_i64_max, hc_##isa##_i64_min },       \
        },                                                                    \
        .avg = {                                                              \
            [HCOLL_FLOAT32] = hc_##isa##_avg_f32,                             \
            [HCOLL_FLOAT16] = hc_##isa##_avg_f16,                             \
            [HCOLL_BFLOAT16] = hc_##isa##_avg_bf16,                           \
            [HCOLL_FLOAT64] = hc_##isa##_avg_f64,                             \
            [HCOLL_INT8] = hc_idiv_i8,                                        \
            [HCOLL_UINT8] = hc_idiv_u8,                                       \
            [HCOLL_INT32] = hc_idiv_i32,                                      \
            [HCOLL_INT64] = hc_idiv_i64,                                      \
        },                                                                    \
    };

/* Baseline: 16-byte vectors, which every x86-64 (SSE2) and most other
 * 64-bit targets have. */
#define HC_TARGET_GENERIC
HC_DEF_ALL(generic, HC_TARGET_GENERIC, 16, hc_f32x4_t, hc_u32x4_t, HC_F16SW_LOAD,
           HC_F16SW_STORE, HC_V_FMAX, HC_V_FMIN, HC_V_FMAX, HC_V_FMIN)
HC_IMPL_TABLE(generic, "generic")

#if defined(__x86_64__)
#define HC_TARGET_AVX2 __attribute__((target("avx2,f16c")))
HC_DEF_ALL(avx2, HC_TARGET_AVX2, 32, hc_f32x8_t, hc_u32x8_t, HC_F16C_LOAD, HC_F16C_STORE,
           HC_AVX2_FMAX_PS, HC_AVX2_FMIN_PS, HC_AVX2_FMAX_PD, HC_AVX2_FMIN_PD)
HC_IMPL_TABLE(avx2, "avx2+f16c")
#endif

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                   */
/* ------------------------------------------------------------------------ */

/* Every kernel set this build contains, in the order of HCOLL_CPU_KERNELS's
 * choices after "auto" (config.c), with whether this CPU can run it. The
 * knob exists so that tests run the fallback kernels on a CPU that would
 * never pick them: a bug there is otherwise invisible on an AVX2 machine. */
enum { HC_KSET_AUTO, HC_KSET_GENERIC, HC_KSET_AVX2, HC_KSET_COUNT };

static const hc_reduce_impl_t *hc_reduce_kset(int kset)
{
#if defined(__x86_64__)
    unsigned eax, ebx, ecx, edx;
#endif
    switch (kset) {
    case HC_KSET_GENERIC: return &hc_reduce_impl_generic;
#if defined(__x86_64__)
    case HC_KSET_AVX2:
        /* cpu_supports("avx2") also checks that the OS saves YMM state;
         * F16C is CPUID.1:ECX bit 29 (clang's cpu_supports lacks "f16c"). */
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
            (ecx & bit_F16C))
            return &hc_reduce_impl_avx2;
        return NULL;
#endif
    default: return NULL;
    }
}

static pthread_once_t hc_reduce_once = PTHREAD_ONCE_INIT;
static const hc_reduce_impl_t *hc_reduce_impl; /* written once, in hc_reduce_pick */
static int hc_reduce_wanted = HC_KSET_AUTO;    /* likewise: the set asked for */

static void hc_reduce_pick(void)
{
    hc_knob_value_t v;
    char err[160];
    /* A malformed value is rejected by hc_params_load at init; until then
     * (or without a communicator) the best set stands, as for logging. */
    if (hc_knob_env("HCOLL_CPU_KERNELS", &v, err, sizeof err) == HCOLL_SUCCESS &&
        v.choice > HC_KSET_AUTO && v.choice < HC_KSET_COUNT)
        hc_reduce_wanted = v.choice;
    const hc_reduce_impl_t *impl = hc_reduce_kset(hc_reduce_wanted);
    for (int k = HC_KSET_COUNT - 1; !impl && k > HC_KSET_AUTO; k--)
        impl = hc_reduce_kset(k);
    hc_reduce_impl = impl;
}

static const hc_reduce_impl_t *hc_reduce_get(void)
{
    pthread_once(&hc_reduce_once, hc_reduce_pick);
    return hc_reduce_impl;
}

/* ------------------------------------------------------------------------ */
/* Entry points                                                               */
/* ------------------------------------------------------------------------ */

int hc_reduce_valid(hcoll_dtype_t dtype, hcoll_op_t op)
{
    return (unsigned)dtype < HCOLL_DTYPE_COUNT_ && (unsigned)op < HCOLL_OP_COUNT_;
}

void hc_reduce(void *dst, const void *a, const void *b, size_t count, hcoll_dtype_t dtype,
               hcoll_op_t op)
{
    static const unsigned char slot[HCOLL_OP_COUNT_] = {
        [HCOLL_SUM] = HC_RK_SUM, [HCOLL_PROD] = HC_RK_PROD, [HCOLL_MAX] = HC_RK_MAX,
        [HCOLL_MIN] = HC_RK_MIN, [HCOLL_AVG] = HC_RK_SUM,
    };

    if (!hc_reduce_valid(dtype, op) || count == 0)
        return;
    hc_reduce_get()->reduce[dtype][slot[op]](dst, a, b, count);
}

void hc_reduce_avg_finish(void *buf, size_t count, hcoll_dtype_t dtype, hcoll_op_t op,
                          int nranks)
{
    /* Dividing by 1 changes nothing, and nranks < 1 has no meaning. */
    if (op != HCOLL_AVG || !hc_reduce_valid(dtype, op) || nranks <= 1 || count == 0)
        return;
    hc_reduce_get()->avg[dtype](buf, count, nranks);
}

/* ------------------------------------------------------------------------ */
/* Pre-multiplication (AVG of floats, PREMUL_SUM)                             */
/* ------------------------------------------------------------------------ */

int hc_dtype_is_float(hcoll_dtype_t dtype)
{
    return dtype == HCOLL_FLOAT32 || dtype == HCOLL_FLOAT16 || dtype == HCOLL_BFLOAT16 ||
           dtype == HCOLL_FLOAT64;
}

hc_scalar_t hc_scalar_load(const void *p, hcoll_dtype_t dtype)
{
    hc_scalar_t s = { .i64 = 0 };
    uint16_t h;
    switch (dtype) {
    case HCOLL_FLOAT32: memcpy(&s.f32, p, sizeof s.f32); break;
    case HCOLL_FLOAT64: memcpy(&s.f64, p, sizeof s.f64); break;
    case HCOLL_FLOAT16: memcpy(&h, p, 2); s.f32 = hc_half_to_float(h); break;
    case HCOLL_BFLOAT16: memcpy(&h, p, 2); s.f32 = hc_bf16_to_float(h); break;
    case HCOLL_INT8: { int8_t v; memcpy(&v, p, 1); s.i64 = v; break; }
    case HCOLL_UINT8: { uint8_t v; memcpy(&v, p, 1); s.i64 = v; break; }
    case HCOLL_INT32: { int32_t v; memcpy(&v, p, 4); s.i64 = v; break; }
    case HCOLL_INT64: memcpy(&s.i64, p, 8); break;
    default: break;
    }
    return s;
}

void hc_scalar_store(void *p, hcoll_dtype_t dtype, hc_scalar_t s)
{
    uint16_t h;
    switch (dtype) {
    case HCOLL_FLOAT32: memcpy(p, &s.f32, 4); break;
    case HCOLL_FLOAT64: memcpy(p, &s.f64, 8); break;
    case HCOLL_FLOAT16: h = hc_float_to_half(s.f32); memcpy(p, &h, 2); break;
    case HCOLL_BFLOAT16: h = hc_float_to_bf16(s.f32); memcpy(p, &h, 2); break;
    case HCOLL_INT8: case HCOLL_UINT8: { uint8_t v = (uint8_t)s.i64; memcpy(p, &v, 1); break; }
    case HCOLL_INT32: { uint32_t v = (uint32_t)s.i64; memcpy(p, &v, 4); break; }
    case HCOLL_INT64: memcpy(p, &s.i64, 8); break;
    default: break;
    }
}

hc_scalar_t hc_scalar_avg(hcoll_dtype_t dtype, int n)
{
    hc_scalar_t s;
    if (dtype == HCOLL_FLOAT64)
        s.f64 = 1.0 / (double)n;
    else
        s.f32 = 1.0f / (float)n;
    return s;
}

/* Plain loops: the compiler vectorises the float ones, and a scaling pass
 * is memory-bound anyway. Integer products go through unsigned types so
 * that they wrap instead of being undefined. */
#define HC_SCALE_LOOP(T, EXPR)                                                \
    do {                                                                      \
        for (size_t i_ = 0; i_ < count; i_++) {                               \
            T v_;                                                             \
            memcpy(&v_, (const unsigned char *)src + i_ * sizeof(T), sizeof(T)); \
            v_ = (EXPR);                                                      \
            memcpy((unsigned char *)dst + i_ * sizeof(T), &v_, sizeof(T));    \
        }                                                                     \
    } while (0)

void hc_reduce_scale(void *dst, const void *src, size_t count, hcoll_dtype_t dtype,
                     hc_scalar_t s)
{
    switch (dtype) {
    case HCOLL_FLOAT32: HC_SCALE_LOOP(float, v_ * s.f32); break;
    case HCOLL_FLOAT64: HC_SCALE_LOOP(double, v_ * s.f64); break;
    case HCOLL_FLOAT16: HC_SCALE_LOOP(uint16_t, hc_float_to_half(hc_half_to_float(v_) * s.f32)); break;
    case HCOLL_BFLOAT16: HC_SCALE_LOOP(uint16_t, hc_float_to_bf16(hc_bf16_to_float(v_) * s.f32)); break;
    case HCOLL_INT8:
    case HCOLL_UINT8: HC_SCALE_LOOP(uint8_t, (uint8_t)(v_ * (uint8_t)s.i64)); break;
    case HCOLL_INT32: HC_SCALE_LOOP(uint32_t, v_ * (uint32_t)s.i64); break;
    case HCOLL_INT64: HC_SCALE_LOOP(uint64_t, v_ * (uint64_t)s.i64); break;
    default: break;
    }
}

const char *hc_reduce_impl_name(void)
{
    return hc_reduce_get()->name;
}

hcoll_status_t hc_reduce_check(char *err, size_t errlen)
{
    const hc_reduce_impl_t *impl = hc_reduce_get();
    if (hc_reduce_wanted == HC_KSET_AUTO || impl == hc_reduce_kset(hc_reduce_wanted))
        return HCOLL_SUCCESS;
    snprintf(err, errlen, "HCOLL_CPU_KERNELS: this build or CPU has no such kernel set "
             "(available here: generic%s)", hc_reduce_kset(HC_KSET_AVX2) ? ", avx2" : "");
    return HCOLL_ERR_INVALID_ARG;
}
