/*
 * Unit tests for the host reduction kernels (src/base/reduce.c).
 *
 * Every kernel result is compared with a plain scalar reference written
 * here, independently of the library: half types are decoded with ldexp and
 * rounded with rint on the exact quotient by their quantum, so the
 * reference shares no bit tricks with the code under test. Floats are
 * compared bit for bit, except that a NaN only has to be a NaN (its payload
 * is not part of the contract).
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "base/reduce.h"

#define TEST_TIMEOUT_S 60

static const hcoll_dtype_t all_dtypes[] = {
    HCOLL_FLOAT32, HCOLL_FLOAT16, HCOLL_BFLOAT16, HCOLL_FLOAT64,
    HCOLL_INT8,    HCOLL_UINT8,   HCOLL_INT32,    HCOLL_INT64,
};
static const hcoll_op_t all_ops[] = { HCOLL_SUM, HCOLL_PROD, HCOLL_MAX, HCOLL_MIN, HCOLL_AVG };
#define N_DTYPES (sizeof all_dtypes / sizeof all_dtypes[0])
#define N_OPS (sizeof all_ops / sizeof all_ops[0])

/* ------------------------------------------------------------------------ */
/* Random numbers (fixed seeds: failures reproduce)                           */
/* ------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* ------------------------------------------------------------------------ */
/* Reference conversions                                                      */
/* ------------------------------------------------------------------------ */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int half_is_nan(uint16_t h) { return (h & 0x7fff) > 0x7c00; }
static int bf16_is_nan(uint16_t h) { return (h & 0x7fff) > 0x7f80; }

static float ref_h2f(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;

    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return (float)(sign ? -v : v);
}

static float ref_b2f(uint16_t h)
{
    int sign = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;

    if (e == 255)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -133);
    else
        v = ldexp(128 + m, e - 134);
    return (float)(sign ? -v : v);
}

/*
 * Round |f| to a multiple of the target's quantum at its binade: q/|f| is
 * exact in double, rint rounds to nearest-even (the default mode), and the
 * rounded value is re-encoded from scratch.
 */
static uint16_t ref_f2h(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);

    if (isnan(f))
        return sign | 0x7e00;
    if (isinf(f))
        return sign | 0x7c00;
    if (a < ldexp(1, -14)) {
        double r = rint(a / ldexp(1, -24)); /* 0..1024; 1024 is the smallest normal */
        return sign | (uint16_t)r;
    }
    int e;
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1): a in [2^(e-1), 2^e) */
    e -= 1;
    double r = rint(a / ldexp(1, e - 10)); /* 1024..2048 */
    if (e + 15 >= 31 || (e + 15 == 30 && r >= 2048))
        return sign | 0x7c00;
    return sign | (uint16_t)(((e + 15) << 10) + (int)(r - 1024));
}

static uint16_t ref_f2b(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);

    if (isnan(f))
        return sign | 0x7fc0;
    if (isinf(f))
        return sign | 0x7f80;
    double q;
    if (a < ldexp(1, -126)) {
        q = ldexp(1, -133);
    } else {
        int e;
        frexp(a, &e);
        q = ldexp(1, e - 1 - 7);
    }
    double v = rint(a / q) * q;
    if (v >= ldexp(1, 128))
        return sign | 0x7f80;
    return sign | (uint16_t)(f2u((float)v) >> 16);
}

/* ------------------------------------------------------------------------ */
/* Reference reduction of one element                                         */
/* ------------------------------------------------------------------------ */

static float ref_fop(hcoll_op_t op, float x, float y)
{
    switch (op) {
    case HCOLL_SUM:
    case HCOLL_AVG:
        return x + y;
    case HCOLL_PROD:
        return x * y;
    case HCOLL_MAX:
        if (isnan(x) || isnan(y))
            return NAN;
        return x > y ? x : y;
    case HCOLL_MIN:
        if (isnan(x) || isnan(y))
            return NAN;
        return x < y ? x : y;
    default:
        abort();
    }
}

static double ref_dop(hcoll_op_t op, double x, double y)
{
    switch (op) {
    case HCOLL_SUM:
    case HCOLL_AVG:
        return x + y;
    case HCOLL_PROD:
        return x * y;
    case HCOLL_MAX:
        if (isnan(x) || isnan(y))
            return NAN;
        return x > y ? x : y;
    case HCOLL_MIN:
        if (isnan(x) || isnan(y))
            return NAN;
        return x < y ? x : y;
    default:
        abort();
    }
}

/* Integers: sum/prod modulo 2^bits (unsigned arithmetic), max/min in the
 * signed or unsigned order of the type. */
static uint64_t ref_iop(hcoll_op_t op, int64_t x, int64_t y, uint64_t mask)
{
    switch (op) {
    case HCOLL_SUM:
    case HCOLL_AVG:
        return ((uint64_t)x + (uint64_t)y) & mask;
    case HCOLL_PROD:
        return ((uint64_t)x * (uint64_t)y) & mask;
    case HCOLL_MAX:
        return (uint64_t)(x > y ? x : y) & mask;
    case HCOLL_MIN:
        return (uint64_t)(x < y ? x : y) & mask;
    default:
        abort();
    }
}

static void ref_elem(hcoll_dtype_t dt, hcoll_op_t op, const unsigned char *px,
                     const unsigned char *py, unsigned char *out)
{
    switch (dt) {
    case HCOLL_FLOAT32: {
        float x, y, r;
        memcpy(&x, px, 4);
        memcpy(&y, py, 4);
        r = ref_fop(op, x, y);
        memcpy(out, &r, 4);
        break;
    }
    case HCOLL_FLOAT64: {
        double x, y, r;
        memcpy(&x, px, 8);
        memcpy(&y, py, 8);
        r = ref_dop(op, x, y);
        memcpy(out, &r, 8);
        break;
    }
    case HCOLL_FLOAT16:
    case HCOLL_BFLOAT16: {
        uint16_t x, y, r;
        memcpy(&x, px, 2);
        memcpy(&y, py, 2);
        if (dt == HCOLL_FLOAT16)
            r = ref_f2h(ref_fop(op, ref_h2f(x), ref_h2f(y)));
        else
            r = ref_f2b(ref_fop(op, ref_b2f(x), ref_b2f(y)));
        memcpy(out, &r, 2);
        break;
    }
    case HCOLL_INT8: {
        int8_t x = (int8_t)px[0], y = (int8_t)py[0];
        out[0] = (unsigned char)ref_iop(op, x, y, 0xff);
        break;
    }
    case HCOLL_UINT8:
        out[0] = (unsigned char)ref_iop(op, px[0], py[0], 0xff);
        break;
    case HCOLL_INT32: {
        int32_t x, y;
        uint32_t r;
        memcpy(&x, px, 4);
        memcpy(&y, py, 4);
        r = (uint32_t)ref_iop(op, x, y, 0xffffffffu);
        memcpy(out, &r, 4);
        break;
    }
    case HCOLL_INT64: {
        int64_t x, y;
        uint64_t r;
        memcpy(&x, px, 8);
        memcpy(&y, py, 8);
        r = ref_iop(op, x, y, ~(uint64_t)0);
        memcpy(out, &r, 8);
        break;
    }
    default:
        abort();
    }
}

/* Equal bits, or both NaN for the float types. */
static int elem_equal(hcoll_dtype_t dt, const unsigned char *got, const unsigned char *exp)
{
    size_t sz = hcoll_dtype_size(dt);

    if (memcmp(got, exp, sz) == 0)
        return 1;
    switch (dt) {
    case HCOLL_FLOAT32: {
        float g, e;
        memcpy(&g, got, 4);
        memcpy(&e, exp, 4);
        return isnan(g) && isnan(e);
    }
    case HCOLL_FLOAT64: {
        double g, e;
        memcpy(&g, got, 8);
        memcpy(&e, exp, 8);
        return isnan(g) && isnan(e);
    }
    case HCOLL_FLOAT16:
    case HCOLL_BFLOAT16: {
        uint16_t g, e;
        memcpy(&g, got, 2);
        memcpy(&e, exp, 2);
        return dt == HCOLL_FLOAT16 ? half_is_nan(g) && half_is_nan(e)
                                   : bf16_is_nan(g) && bf16_is_nan(e);
    }
    default:
        return 0;
    }
}

static int elem_is_nan(hcoll_dtype_t dt, const unsigned char *p)
{
    switch (dt) {
    case HCOLL_FLOAT32: {
        float f;
        memcpy(&f, p, 4);
        return isnan(f);
    }
    case HCOLL_FLOAT64: {
        double d;
        memcpy(&d, p, 8);
        return isnan(d);
    }
    case HCOLL_FLOAT16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return half_is_nan(h);
    }
    case HCOLL_BFLOAT16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return bf16_is_nan(h);
    }
    default:
        return 0;
    }
}

/* ------------------------------------------------------------------------ */
/* Inputs                                                                     */
/* ------------------------------------------------------------------------ */

enum { GEN_ANY, GEN_FINITE };

/* Values whose sums and products land everywhere that matters: mostly
 * ordinary numbers of nearby magnitude (so rounding is exercised), some
 * raw bit patterns (subnormals, huge values), some specials. */
static void gen_elem(hcoll_dtype_t dt, uint64_t *s, int mode, unsigned char *out)
{
    uint64_t r = rng_next(s);
    unsigned cls = (unsigned)(r >> 56) & 15;

    switch (dt) {
    case HCOLL_FLOAT32: {
        static const float specials[] = { 0.0f, -0.0f, 1e-40f, -3e-42f, FLT_MAX, -FLT_MIN,
                                          INFINITY, -INFINITY, NAN };
        size_t nsp = mode == GEN_FINITE ? 6 : 9;
        float f;
        if (cls == 0)
            f = specials[(r >> 8) % nsp];
        else
            f = ldexpf((float)(r & 0xffffff) / 0x1000000, (int)((r >> 24) % 41) - 20) *
                ((r >> 40) & 1 ? -1.0f : 1.0f);
        memcpy(out, &f, 4);
        break;
    }
    case HCOLL_FLOAT64: {
        static const double specials[] = { 0.0, -0.0, 1e-310, -4e-320, DBL_MAX, -DBL_MIN,
                                           INFINITY, -INFINITY, NAN };
        size_t nsp = mode == GEN_FINITE ? 6 : 9;
        double d;
        if (cls == 0)
            d = specials[(r >> 8) % nsp];
        else
            d = ldexp((double)(r & 0xfffffffffffull) / 0x100000000000ull,
                      (int)((r >> 44) % 41) - 20) *
                ((r >> 60) & 1 ? -1.0 : 1.0);
        memcpy(out, &d, 8);
        break;
    }
    case HCOLL_FLOAT16:
    case HCOLL_BFLOAT16: {
        uint16_t h;
        int f16 = dt == HCOLL_FLOAT16;
        for (;;) {
            if (cls < 6) /* any pattern at all */
                h = (uint16_t)r;
            else if (f16) /* exponent 10..20: sums and products round */
                h = (uint16_t)((r & 0x83ff) | (uint64_t)(10 + (r >> 16) % 11) << 10);
            else
                h = (uint16_t)((r & 0x807f) | (uint64_t)(120 + (r >> 16) % 15) << 7);
            if (mode == GEN_ANY || (f16 ? (h & 0x7c00) != 0x7c00 : (h & 0x7f80) != 0x7f80))
                break;
            r = rng_next(s);
        }
        memcpy(out, &h, 2);
        break;
    }
    default:
        memcpy(out, &r, hcoll_dtype_size(dt));
        break;
    }
}

static void gen_fill(hcoll_dtype_t dt, uint64_t *s, int mode, unsigned char *p, size_t n)
{
    size_t sz = hcoll_dtype_size(dt);
    for (size_t i = 0; i < n; i++)
        gen_elem(dt, s, mode, p + i * sz);
}

/* ------------------------------------------------------------------------ */
/* One checked call                                                           */
/* ------------------------------------------------------------------------ */

enum { MODE_SEPARATE, MODE_DST_IS_A, MODE_DST_IS_B };

/*
 * Run hc_reduce on n random elements at the given byte offsets and compare
 * with the reference. Buffers are exactly as large as needed, so that
 * AddressSanitizer or valgrind sees any access past the end.
 */
static void check_case(hcoll_dtype_t dt, hcoll_op_t op, size_t n, size_t offd, size_t offa,
                       size_t offb, int mode, uint64_t seed)
{
    size_t sz = hcoll_dtype_size(dt), bytes = n * sz;
    unsigned char *xa = malloc(bytes + 1), *xb = malloc(bytes + 1), *exp = malloc(bytes + 1);
    unsigned char *ba = malloc(offa + bytes + 1), *bb = malloc(offb + bytes + 1);
    unsigned char *bd = mode == MODE_SEPARATE ? malloc(offd + bytes + 1) : NULL;
    ck_assert(xa && xb && exp && ba && bb && (mode != MODE_SEPARATE || bd));

    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    gen_fill(dt, &s, GEN_ANY, xa, n);
    gen_fill(dt, &s, GEN_ANY, xb, n);
    for (size_t i = 0; i < n; i++)
        ref_elem(dt, op, xa + i * sz, xb + i * sz, exp + i * sz);

    unsigned char *a = ba + offa, *b = bb + offb, *d;
    memcpy(a, xa, bytes);
    memcpy(b, xb, bytes);
    d = mode == MODE_DST_IS_A ? a : mode == MODE_DST_IS_B ? b : bd + offd;
    if (mode == MODE_SEPARATE)
        memset(bd, 0x5a, offd + bytes + 1);
    /* One guard byte past the end catches overruns without a sanitizer. */
    ba[offa + bytes] = bb[offb + bytes] = 0xa5;
    if (bd)
        bd[offd + bytes] = 0xa5;

    hc_reduce(d, a, b, n, dt, op);

    for (size_t i = 0; i < n; i++) {
        if (!elem_equal(dt, d + i * sz, exp + i * sz)) {
            uint64_t g = 0, e = 0, va = 0, vb = 0;
            memcpy(&g, d + i * sz, sz);
            memcpy(&e, exp + i * sz, sz);
            memcpy(&va, xa + i * sz, sz);
            memcpy(&vb, xb + i * sz, sz);
            ck_abort_msg("%s %s n=%zu offs=%zu/%zu/%zu mode=%d [%zu]: a=%#llx b=%#llx "
                         "got %#llx want %#llx (impl %s)",
                         hcoll_dtype_name(dt), hcoll_op_name(op), n, offd, offa, offb, mode,
                         i, (unsigned long long)va, (unsigned long long)vb,
                         (unsigned long long)g, (unsigned long long)e, hc_reduce_impl_name());
        }
    }
    /* The input that is not the destination must be untouched. */
    if (mode != MODE_DST_IS_A)
        ck_assert_msg(memcmp(a, xa, bytes) == 0, "%s %s: a modified", hcoll_dtype_name(dt),
                      hcoll_op_name(op));
    if (mode != MODE_DST_IS_B)
        ck_assert_msg(memcmp(b, xb, bytes) == 0, "%s %s: b modified", hcoll_dtype_name(dt),
                      hcoll_op_name(op));
    ck_assert_msg(ba[offa + bytes] == 0xa5 && bb[offb + bytes] == 0xa5 &&
                      (!bd || bd[offd + bytes] == 0xa5),
                  "%s %s n=%zu: wrote past the end", hcoll_dtype_name(dt), hcoll_op_name(op), n);
    if (bd) {
        for (size_t i = 0; i < offd; i++)
            ck_assert_msg(bd[i] == 0x5a, "%s %s: wrote before dst", hcoll_dtype_name(dt),
                          hcoll_op_name(op));
    }

    free(xa);
    free(xb);
    free(exp);
    free(ba);
    free(bb);
    free(bd);
}

/* ------------------------------------------------------------------------ */
/* Conversions                                                                */
/* ------------------------------------------------------------------------ */

START_TEST(test_half_to_float_exhaustive)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float got = hc_half_to_float((uint16_t)h), want = ref_h2f((uint16_t)h);
        if (half_is_nan((uint16_t)h)) {
            ck_assert_msg(isnan(got), "fp16 %#x: not NaN", h);
            /* Quiet, sign and payload kept. */
            ck_assert_msg(f2u(got) & 0x400000u, "fp16 %#x: NaN not quiet", h);
            ck_assert_msg(((f2u(got) >> 13) & 0x1ff) == (h & 0x1ff), "fp16 %#x payload", h);
            ck_assert_msg(!!(f2u(got) >> 31) == !!(h >> 15), "fp16 %#x NaN sign", h);
        } else {
            ck_assert_msg(f2u(got) == f2u(want), "fp16 %#x: got %a want %a", h, got, want);
        }
    }
}
END_TEST

START_TEST(test_bf16_to_float_exhaustive)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float got = hc_bf16_to_float((uint16_t)h), want = ref_b2f((uint16_t)h);
        if (bf16_is_nan((uint16_t)h))
            ck_assert_msg(isnan(got), "bf16 %#x: not NaN", h);
        else
            ck_assert_msg(f2u(got) == f2u(want), "bf16 %#x: got %a want %a", h, got, want);
    }
}
END_TEST

/* Every representable value, both neighbours of it, and for each pair of
 * consecutive values the exact midpoint (a tie) and both floats next to it. */
START_TEST(test_float_to_half_ties_and_sweep)
{
    for (uint32_t h = 0; h < 0x7c00; h++) {
        for (int neg = 0; neg < 2; neg++) {
            float v = ref_h2f((uint16_t)h), w = ref_h2f((uint16_t)(h + 1));
            float mid = (float)(((double)v + (double)w) / 2); /* exact: 12 bits */
            if (h == 0x7bff) /* past 65504 the next "value" is inf */
                mid = 65520.0f;
            float probes[] = { v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY) };
            for (size_t k = 0; k < 4; k++) {
                float f = neg ? -probes[k] : probes[k];
                uint16_t got = hc_float_to_half(f), want = ref_f2h(f);
                ck_assert_msg(got == want, "f2h(%a) got %#x want %#x", f, got, want);
            }
            /* Ties go to the even neighbour. */
            uint16_t t = hc_float_to_half(neg ? -mid : mid) & 0x7fff;
            ck_assert_msg((t & 1) == 0, "f2h tie %a -> %#x not even", mid, t);
        }
    }
    /* A sparse sweep of all float bit patterns. */
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
        float f = u2f((uint32_t)u);
        uint16_t got = hc_float_to_half(f), want = ref_f2h(f);
        if (isnan(f))
            ck_assert_msg(half_is_nan(got) && !!(got >> 15) == !!(u >> 31),
                          "f2h(NaN %#x) = %#x", (unsigned)u, got);
        else
            ck_assert_msg(got == want, "f2h(%a) got %#x want %#x", f, got, want);
    }
    /* Overflow, the largest finite, subnormals, and NaN with a payload only
     * in the bits that do not fit. */
    ck_assert_uint_eq(hc_float_to_half(65504.0f), 0x7bff);
    ck_assert_uint_eq(hc_float_to_half(65519.99f), 0x7bff);
    ck_assert_uint_eq(hc_float_to_half(65520.0f), 0x7c00);
    ck_assert_uint_eq(hc_float_to_half(1e10f), 0x7c00);
    ck_assert_uint_eq(hc_float_to_half(-INFINITY), 0xfc00);
    ck_assert_uint_eq(hc_float_to_half(ldexpf(1, -24)), 0x0001);
    ck_assert_uint_eq(hc_float_to_half(ldexpf(1, -25)), 0x0000);
    ck_assert_uint_eq(hc_float_to_half(ldexpf(3, -26)), 0x0001);
    ck_assert_uint_eq(hc_float_to_half(ldexpf(3, -25)), 0x0002);
    ck_assert_uint_eq(hc_float_to_half(ldexpf(1023, -24) + ldexpf(1, -25)), 0x0400);
    ck_assert_uint_eq(hc_float_to_half(-0.0f), 0x8000);
    ck_assert(half_is_nan(hc_float_to_half(u2f(0x7f800001u))));
    ck_assert(half_is_nan(hc_float_to_half(u2f(0xff800001u))));
    ck_assert(half_is_nan(hc_float_to_half(NAN)));
}
END_TEST

START_TEST(test_float_to_bf16_ties_and_sweep)
{
    for (uint32_t h = 0; h < 0x7f80; h++) {
        for (int neg = 0; neg < 2; neg++) {
            uint32_t lo = h << 16, mid = lo | 0x8000u; /* the exact midpoint */
            uint32_t probes[] = { lo, mid, mid - 1, mid + 1 };
            for (size_t k = 0; k < 4; k++) {
                float f = u2f(probes[k] | (neg ? 0x80000000u : 0));
                uint16_t got = hc_float_to_bf16(f), want = ref_f2b(f);
                ck_assert_msg(got == want, "f2b(%a) got %#x want %#x", f, got, want);
            }
            ck_assert_msg((hc_float_to_bf16(u2f(mid)) & 1) == 0, "f2b tie %#x not even", mid);
        }
    }
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
        float f = u2f((uint32_t)u);
        uint16_t got = hc_float_to_bf16(f), want = ref_f2b(f);
        if (isnan(f))
            ck_assert_msg(bf16_is_nan(got) && !!(got >> 15) == !!(u >> 31),
                          "f2b(NaN %#x) = %#x", (unsigned)u, got);
        else
            ck_assert_msg(got == want, "f2b(%a) got %#x want %#x", f, got, want);
    }
    /* NaNs whose payload is only in the low half must not become inf. */
    ck_assert(bf16_is_nan(hc_float_to_bf16(u2f(0x7f800001u))));
    ck_assert(bf16_is_nan(hc_float_to_bf16(u2f(0xff800001u))));
    ck_assert(bf16_is_nan(hc_float_to_bf16(u2f(0x7fffffffu))));
    ck_assert(bf16_is_nan(hc_float_to_bf16(u2f(0x7f80ffffu))));
    ck_assert_uint_eq(hc_float_to_bf16(FLT_MAX), 0x7f80);
    ck_assert_uint_eq(hc_float_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(hc_float_to_bf16(-INFINITY), 0xff80);
    ck_assert_uint_eq(hc_float_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(hc_float_to_bf16(u2f(0x3f808000u)), 0x3f80); /* tie, down to even */
    ck_assert_uint_eq(hc_float_to_bf16(u2f(0x3f818000u)), 0x3f82); /* tie, up to even */
    ck_assert_uint_eq(hc_float_to_bf16(u2f(0x00008000u)), 0x0000); /* subnormal tie */
    ck_assert_uint_eq(hc_float_to_bf16(u2f(0x00018000u)), 0x0002);
}
END_TEST

#if defined(__x86_64__)
__attribute__((target("f16c"))) static void check_against_f16c(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float hw = _cvtsh_ss((unsigned short)h), sw = hc_half_to_float((uint16_t)h);
        ck_assert_msg(f2u(hw) == f2u(sw), "h2f %#x: f16c %#x, ours %#x", h, f2u(hw), f2u(sw));
    }
    uint64_t s = 42;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng_next(&s);
        if (i & 1) /* half of them near the fp16 range */
            u = (u & 0x807fffffu) | ((100u + (u >> 23) % 45) << 23);
        float f = u2f(u);
        unsigned short hw = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
        uint16_t sw = hc_float_to_half(f);
        ck_assert_msg(hw == sw, "f2h %#x: f16c %#x, ours %#x", u, hw, sw);
    }
}
#endif

/* The scalar conversions must give F16C's bits, NaNs included: the vector
 * path uses F16C and the tail uses the scalar code. */
START_TEST(test_half_matches_f16c)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("f16c")) {
        fprintf(stderr, "test_half_matches_f16c: skipped, CPU has no F16C\n");
        return;
    }
    check_against_f16c();
#else
    fprintf(stderr, "test_half_matches_f16c: skipped, not x86-64\n");
#endif
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Kernels against the reference                                              */
/* ------------------------------------------------------------------------ */

/* Lengths 0..1025 cover empty, shorter than a vector, every tail length. */
START_TEST(test_all_lengths)
{
    hcoll_dtype_t dt = all_dtypes[_i];
    for (size_t o = 0; o < N_OPS; o++)
        for (size_t n = 0; n <= 1025; n++)
            check_case(dt, all_ops[o], n, 0, 0, 0, MODE_SEPARATE, n * 131 + o);
}
END_TEST

START_TEST(test_misaligned)
{
    static const size_t lens[] = { 0, 1, 3, 17, 33, 64, 100, 257 };
    hcoll_dtype_t dt = all_dtypes[_i];
    for (size_t o = 0; o < N_OPS; o++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
            for (size_t od = 0; od < 8; od++)
                for (size_t oa = 0; oa < 8; oa++)
                    for (size_t ob = 0; ob < 8; ob++)
                        check_case(dt, all_ops[o], lens[l], od, oa, ob, MODE_SEPARATE,
                                   l * 1000 + od * 64 + oa * 8 + ob);
}
END_TEST

START_TEST(test_in_place)
{
    hcoll_dtype_t dt = all_dtypes[_i];
    for (size_t o = 0; o < N_OPS; o++)
        for (int mode = MODE_DST_IS_A; mode <= MODE_DST_IS_B; mode++)
            for (size_t off = 0; off < 8; off += 3)
                for (size_t n = 0; n <= 300; n += (n < 70 ? 1 : 23))
                    check_case(dt, all_ops[o], n, 0, off, off, mode, n + 7 * mode + o);
    for (size_t o = 0; o < N_OPS; o++) {
        check_case(dt, all_ops[o], 1025, 0, 5, 5, MODE_DST_IS_A, 99);
        check_case(dt, all_ops[o], 1025, 0, 5, 5, MODE_DST_IS_B, 98);
    }
}
END_TEST

/*
 * A long vector with finite inputs (no NaN, so no payload question): the
 * whole result must equal the reference bit for bit, whichever path the
 * dispatcher picked, in place and not.
 */
START_TEST(test_long_bitwise)
{
    const size_t n = (1u << 20) + 3;
    hcoll_dtype_t dt = all_dtypes[_i];
    size_t sz = hcoll_dtype_size(dt), bytes = n * sz;
    unsigned char *a = malloc(bytes + 1), *b = malloc(bytes), *d = malloc(bytes),
                  *exp = malloc(bytes);
    ck_assert(a && b && d && exp);
    uint64_t s = 1234 + (uint64_t)_i;

    for (size_t o = 0; o < N_OPS; o++) {
        hcoll_op_t op = all_ops[o];
        gen_fill(dt, &s, GEN_FINITE, a + 1, n);
        gen_fill(dt, &s, GEN_FINITE, b, n);
        for (size_t i = 0; i < n; i++)
            ref_elem(dt, op, a + 1 + i * sz, b + i * sz, exp + i * sz);

        hc_reduce(d, a + 1, b, n, dt, op);
        ck_assert_msg(memcmp(d, exp, bytes) == 0, "%s %s long: mismatch (impl %s)",
                      hcoll_dtype_name(dt), hcoll_op_name(op), hc_reduce_impl_name());
        hc_reduce(a + 1, a + 1, b, n, dt, op);
        ck_assert_msg(memcmp(a + 1, exp, bytes) == 0, "%s %s long in place: mismatch",
                      hcoll_dtype_name(dt), hcoll_op_name(op));
    }
    free(a);
    free(b);
    free(d);
    free(exp);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Specific values                                                            */
/* ------------------------------------------------------------------------ */

/*
 * Reduce x op y placed at every index of a 40-element vector (the rest 0),
 * so the pair goes through both the vector body and the scalar tail, and
 * return the result at each index through check().
 */
#define SPOT_N 40
typedef void (*spot_check_fn)(const unsigned char *got, const void *ctx, size_t idx);

static void spot(hcoll_dtype_t dt, hcoll_op_t op, const void *x, const void *y,
                 spot_check_fn check, const void *ctx)
{
    size_t sz = hcoll_dtype_size(dt);
    unsigned char a[SPOT_N * 8], b[SPOT_N * 8], d[SPOT_N * 8];

    for (size_t k = 0; k < SPOT_N; k++) {
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        memcpy(a + k * sz, x, sz);
        memcpy(b + k * sz, y, sz);
        hc_reduce(d, a, b, SPOT_N, dt, op);
        check(d + k * sz, ctx, k);
    }
}

struct spot16 {
    hcoll_dtype_t dt;
    hcoll_op_t op;
    uint16_t x, y, want;
};

static void spot16_check(const unsigned char *got, const void *ctx, size_t idx)
{
    const struct spot16 *c = ctx;
    uint16_t g;
    memcpy(&g, got, 2);
    ck_assert_msg(g == c->want, "%s %s %#x,%#x at [%zu]: got %#x want %#x",
                  hcoll_dtype_name(c->dt), hcoll_op_name(c->op), c->x, c->y, idx, g, c->want);
}

START_TEST(test_half_rounding)
{
    static const struct spot16 cases[] = {
        /* fp16: ties to even at 2048 (spacing 2), both directions. */
        { HCOLL_FLOAT16, HCOLL_SUM, 0x6800, 0x3c00, 0x6800 },  /* 2048+1 -> 2048 */
        { HCOLL_FLOAT16, HCOLL_SUM, 0x6801, 0x3c00, 0x6802 },  /* 2050+1 -> 2052 */
        { HCOLL_FLOAT16, HCOLL_SUM, 0x6800, 0x4200, 0x6802 },  /* 2048+3 -> 2052 */
        { HCOLL_FLOAT16, HCOLL_AVG, 0x6800, 0x3c00, 0x6800 },
        /* fp16: overflow to inf, and just below it. */
        { HCOLL_FLOAT16, HCOLL_SUM, 0x7bff, 0x4c00, 0x7c00 },  /* 65504+16 = 65520 */
        { HCOLL_FLOAT16, HCOLL_SUM, 0x7bff, 0x4800, 0x7bff },  /* 65504+8 */
        { HCOLL_FLOAT16, HCOLL_SUM, 0xfbff, 0xcc00, 0xfc00 },
        { HCOLL_FLOAT16, HCOLL_PROD, 0x5c00, 0x5c00, 0x7c00 }, /* 256*256 */
        /* fp16 subnormals. */
        { HCOLL_FLOAT16, HCOLL_SUM, 0x0001, 0x0001, 0x0002 },
        { HCOLL_FLOAT16, HCOLL_SUM, 0x03ff, 0x0001, 0x0400 },  /* to the smallest normal */
        { HCOLL_FLOAT16, HCOLL_SUM, 0x0400, 0x8001, 0x03ff },  /* and back */
        { HCOLL_FLOAT16, HCOLL_PROD, 0x0001, 0x3800, 0x0000 }, /* 2^-25: tie to 0 */
        { HCOLL_FLOAT16, HCOLL_PROD, 0x0003, 0x3800, 0x0002 }, /* 1.5*2^-24: tie to 2 */
        { HCOLL_FLOAT16, HCOLL_PROD, 0x0001, 0x3c00, 0x0001 },
        { HCOLL_FLOAT16, HCOLL_MIN, 0x0001, 0x8001, 0x8001 },
        { HCOLL_FLOAT16, HCOLL_MAX, 0x0001, 0x8001, 0x0001 },
        { HCOLL_FLOAT16, HCOLL_SUM, 0x8000, 0x8000, 0x8000 },  /* -0 + -0 = -0 */
        { HCOLL_FLOAT16, HCOLL_PROD, 0xbc00, 0x0000, 0x8000 }, /* -1 * 0 = -0 */
        { HCOLL_FLOAT16, HCOLL_SUM, 0x7c00, 0x3c00, 0x7c00 },
        /* bf16: ties at 1 (spacing 2^-7). */
        { HCOLL_BFLOAT16, HCOLL_SUM, 0x3f80, 0x3b80, 0x3f80 }, /* 1+2^-8 -> 1 */
        { HCOLL_BFLOAT16, HCOLL_SUM, 0x3f81, 0x3b80, 0x3f82 }, /* up to even */
        { HCOLL_BFLOAT16, HCOLL_SUM, 0x7f7f, 0x7f7f, 0x7f80 }, /* overflow */
        { HCOLL_BFLOAT16, HCOLL_PROD, 0x5f80, 0x6080, 0x7f80 }, /* 2^64*2^66 */
        { HCOLL_BFLOAT16, HCOLL_SUM, 0x0001, 0x0001, 0x0002 }, /* subnormals */
        { HCOLL_BFLOAT16, HCOLL_SUM, 0x007f, 0x0001, 0x0080 },
        { HCOLL_BFLOAT16, HCOLL_PROD, 0x0001, 0x3f00, 0x0000 }, /* tie to 0 */
        { HCOLL_BFLOAT16, HCOLL_PROD, 0x0003, 0x3f00, 0x0002 },
        { HCOLL_BFLOAT16, HCOLL_MAX, 0xbf80, 0x3f80, 0x3f80 },
        { HCOLL_BFLOAT16, HCOLL_MIN, 0xbf80, 0x3f80, 0xbf80 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        spot(cases[i].dt, cases[i].op, &cases[i].x, &cases[i].y, spot16_check, &cases[i]);
}
END_TEST

struct spot_nan {
    hcoll_dtype_t dt;
    hcoll_op_t op;
};

static void nan_check(const unsigned char *got, const void *ctx, size_t idx)
{
    const struct spot_nan *c = ctx;
    ck_assert_msg(elem_is_nan(c->dt, got), "%s %s: NaN lost at [%zu]", hcoll_dtype_name(c->dt),
                  hcoll_op_name(c->op), idx);
}

/* NaN in either position, against every kind of other value, every op. */
START_TEST(test_nan_propagation)
{
    float fn[] = { NAN, -NAN, u2f(0x7f800001u) /* signalling */ };
    float fo[] = { 0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, FLT_MAX, 1e-40f, NAN };
    double dn[] = { NAN, -NAN };
    double dd[] = { 0.0, -0.0, 1.0, -1.0, INFINITY, -INFINITY, DBL_MAX, 1e-310, NAN };
    uint16_t hn[] = { 0x7e00, 0xfe00, 0x7c01 /* signalling */ };
    uint16_t ho[] = { 0x0000, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7bff, 0x0001, 0x7e00 };
    uint16_t bn[] = { 0x7fc0, 0xffc0, 0x7f81 /* signalling */ };
    uint16_t bo[] = { 0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7f7f, 0x0001, 0x7fc0 };

    for (size_t o = 0; o < N_OPS; o++) {
        hcoll_op_t op = all_ops[o];
        for (size_t i = 0; i < 3; i++) {
            for (size_t j = 0; j < 9; j++) {
                struct spot_nan c = { HCOLL_FLOAT32, op };
                spot(c.dt, op, &fn[i], &fo[j], nan_check, &c);
                spot(c.dt, op, &fo[j], &fn[i], nan_check, &c);
                c.dt = HCOLL_FLOAT16;
                spot(c.dt, op, &hn[i], &ho[j], nan_check, &c);
                spot(c.dt, op, &ho[j], &hn[i], nan_check, &c);
                c.dt = HCOLL_BFLOAT16;
                spot(c.dt, op, &bn[i], &bo[j], nan_check, &c);
                spot(c.dt, op, &bo[j], &bn[i], nan_check, &c);
                if (i < 2) {
                    c.dt = HCOLL_FLOAT64;
                    spot(c.dt, op, &dn[i], &dd[j], nan_check, &c);
                    spot(c.dt, op, &dd[j], &dn[i], nan_check, &c);
                }
            }
        }
    }
}
END_TEST

struct spot_int {
    hcoll_dtype_t dt;
    hcoll_op_t op;
    int64_t x, y, want;
};

static void int_check(const unsigned char *got, const void *ctx, size_t idx)
{
    const struct spot_int *c = ctx;
    int64_t g;
    switch (c->dt) {
    case HCOLL_INT8: g = (int8_t)got[0]; break;
    case HCOLL_UINT8: g = got[0]; break;
    case HCOLL_INT32: { int32_t v; memcpy(&v, got, 4); g = v; break; }
    default: memcpy(&g, got, 8); break;
    }
    ck_assert_msg(g == c->want, "%s %s %lld,%lld at [%zu]: got %lld want %lld",
                  hcoll_dtype_name(c->dt), hcoll_op_name(c->op), (long long)c->x,
                  (long long)c->y, idx, (long long)g, (long long)c->want);
}

static void spot_int(const struct spot_int *c)
{
    unsigned char x[8], y[8];
    int8_t x8 = (int8_t)c->x, y8 = (int8_t)c->y;
    int32_t x32 = (int32_t)c->x, y32 = (int32_t)c->y;
    switch (c->dt) {
    case HCOLL_INT8:
    case HCOLL_UINT8: memcpy(x, &x8, 1); memcpy(y, &y8, 1); break;
    case HCOLL_INT32: memcpy(x, &x32, 4); memcpy(y, &y32, 4); break;
    default: memcpy(x, &c->x, 8); memcpy(y, &c->y, 8); break;
    }
    spot(c->dt, c->op, x, y, int_check, c);
}

START_TEST(test_int_wraparound)
{
    static const struct spot_int cases[] = {
        { HCOLL_INT8, HCOLL_SUM, 127, 1, -128 },
        { HCOLL_INT8, HCOLL_SUM, -128, -1, 127 },
        { HCOLL_INT8, HCOLL_PROD, 16, 16, 0 },
        { HCOLL_INT8, HCOLL_PROD, -128, -1, -128 },
        { HCOLL_INT8, HCOLL_PROD, 11, 13, (int8_t)143 },
        { HCOLL_INT8, HCOLL_MAX, -128, 127, 127 },
        { HCOLL_INT8, HCOLL_MIN, -128, 127, -128 },
        { HCOLL_INT8, HCOLL_AVG, 100, 100, -56 },
        { HCOLL_UINT8, HCOLL_SUM, 255, 1, 0 },
        { HCOLL_UINT8, HCOLL_PROD, 255, 255, 1 },
        { HCOLL_UINT8, HCOLL_MAX, 255, 1, 255 },
        { HCOLL_UINT8, HCOLL_MIN, 255, 1, 1 },
        { HCOLL_INT32, HCOLL_SUM, INT32_MAX, 1, INT32_MIN },
        { HCOLL_INT32, HCOLL_SUM, INT32_MIN, -1, INT32_MAX },
        { HCOLL_INT32, HCOLL_PROD, 65536, 65536, 0 },
        { HCOLL_INT32, HCOLL_PROD, INT32_MIN, -1, INT32_MIN },
        { HCOLL_INT32, HCOLL_PROD, 65537, 65537, 131073 },
        { HCOLL_INT32, HCOLL_MAX, INT32_MIN, INT32_MAX, INT32_MAX },
        { HCOLL_INT32, HCOLL_MIN, -1, 0, -1 },
        { HCOLL_INT64, HCOLL_SUM, INT64_MAX, 1, INT64_MIN },
        { HCOLL_INT64, HCOLL_PROD, 1ll << 32, 1ll << 32, 0 },
        { HCOLL_INT64, HCOLL_PROD, INT64_MIN, -1, INT64_MIN },
        { HCOLL_INT64, HCOLL_PROD, (1ll << 32) + 1, (1ll << 32) + 1, (2ll << 32) + 1 },
        { HCOLL_INT64, HCOLL_PROD, -3, 5, -15 },
        { HCOLL_INT64, HCOLL_MAX, INT64_MIN, INT64_MAX, INT64_MAX },
        { HCOLL_INT64, HCOLL_MIN, INT64_MIN, INT64_MAX, INT64_MIN },
        { HCOLL_INT64, HCOLL_MAX, -1, 1, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        spot_int(&cases[i]);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Pre-multiplication (AVG of floats, PREMUL_SUM)                             */
/* ------------------------------------------------------------------------ */

/* AVG of floats now multiplies each input by 1/n before the sum (it used to
 * divide the sum): hc_reduce_scale, element by element, checked against the
 * documented arithmetic, in and out of place, and the scalars' round trip. */
START_TEST(test_scale)
{
    /* fp16: widen, times the float 1/4, round at the store. */
    uint16_t h[3] = { 0x74e2 /* 20000 */, 0x7bff /* 65504 */, 0x3c01 }, ho[3];
    hc_reduce_scale(ho, h, 3, HCOLL_FLOAT16, hc_scalar_avg(HCOLL_FLOAT16, 4));
    ck_assert_uint_eq(ho[0], hc_float_to_half(5000.0f));
    ck_assert_uint_eq(ho[1], hc_float_to_half(16376.0f));
    ck_assert_uint_eq(ho[2], hc_float_to_half(hc_half_to_float(0x3c01) * 0.25f));
    /* fp16 by 1/3: the float product rounded once. */
    hc_reduce_scale(h, h, 3, HCOLL_FLOAT16, hc_scalar_avg(HCOLL_FLOAT16, 3)); /* in place */
    ck_assert_uint_eq(h[0], hc_float_to_half(20000.0f * (1.0f / 3.0f)));
    /* bf16 */
    uint16_t b = hc_float_to_bf16(3.0f);
    hc_reduce_scale(&b, &b, 1, HCOLL_BFLOAT16, hc_scalar_avg(HCOLL_BFLOAT16, 3));
    ck_assert_uint_eq(b, hc_float_to_bf16(3.0f * (1.0f / 3.0f)));
    /* f32 and f64: one product in the type. */
    float f[2] = { 0.1f, -7.0f };
    hc_reduce_scale(f, f, 2, HCOLL_FLOAT32, hc_scalar_avg(HCOLL_FLOAT32, 5));
    ck_assert(f[0] == 0.1f * (1.0f / 5.0f) && f[1] == -7.0f * (1.0f / 5.0f));
    double d = 0.1;
    hc_reduce_scale(&d, &d, 1, HCOLL_FLOAT64, hc_scalar_avg(HCOLL_FLOAT64, 3));
    ck_assert(d == 0.1 * (1.0 / 3.0));
    /* Integers wrap. */
    int8_t i8[2] = { 100, -128 };
    int32_t s8 = -3;
    hc_reduce_scale(i8, i8, 2, HCOLL_INT8, hc_scalar_load(&(int8_t){ (int8_t)s8 }, HCOLL_INT8));
    ck_assert_int_eq(i8[0], (int8_t)(uint8_t)(100 * -3));
    ck_assert_int_eq(i8[1], (int8_t)(uint8_t)(-128 * -3));
    int64_t i64 = INT64_MAX, k64 = 2;
    hc_reduce_scale(&i64, &i64, 1, HCOLL_INT64, hc_scalar_load(&k64, HCOLL_INT64));
    ck_assert_int_eq(i64, -2);
    /* A scalar stored then loaded is the same value (half types exactly). */
    for (int dt = 0; dt < HCOLL_DTYPE_COUNT_; dt++) {
        unsigned char buf[8] = { 0 }, back[8] = { 0 };
        hc_scalar_t s = hc_dtype_is_float((hcoll_dtype_t)dt) ? hc_scalar_avg((hcoll_dtype_t)dt, 4)
                                                              : (hc_scalar_t){ .i64 = -5 };
        hc_scalar_store(buf, (hcoll_dtype_t)dt, s);
        hc_scalar_store(back, (hcoll_dtype_t)dt, hc_scalar_load(buf, (hcoll_dtype_t)dt));
        ck_assert_mem_eq(buf, back, 8);
    }
}
END_TEST

/* ------------------------------------------------------------------------ */
/* AVG finish                                                                 */
/* ------------------------------------------------------------------------ */

START_TEST(test_avg_finish_int)
{
    int8_t v8[] = { -7, 7, -128, 127, -1, 0, 1, -3, 100, -100, 5 };
    uint8_t u8[] = { 255, 7, 0, 1, 2, 254, 128, 3, 9, 10, 11 };
    int32_t v32[] = { -7, 7, INT32_MIN, INT32_MAX, -1, 0, 1, -3, 1000001, -1000001, 5 };
    int64_t v64[] = { -7, 7, INT64_MIN, INT64_MAX, -1, 0, 1, -3, 1ll << 40, -(1ll << 40), 5 };
    const size_t n = 11;
    int divs[] = { 2, 3, 7, 1000 };

    for (size_t k = 0; k < 4; k++) {
        int nr = divs[k];
        int8_t b8[11];
        uint8_t bu[11];
        int32_t b32[11];
        int64_t b64[11];
        memcpy(b8, v8, sizeof b8);
        memcpy(bu, u8, sizeof bu);
        memcpy(b32, v32, sizeof b32);
        memcpy(b64, v64, sizeof b64);
        hc_reduce_avg_finish(b8, n, HCOLL_INT8, HCOLL_AVG, nr);
        hc_reduce_avg_finish(bu, n, HCOLL_UINT8, HCOLL_AVG, nr);
        hc_reduce_avg_finish(b32, n, HCOLL_INT32, HCOLL_AVG, nr);
        hc_reduce_avg_finish(b64, n, HCOLL_INT64, HCOLL_AVG, nr);
        for (size_t i = 0; i < n; i++) {
            /* C division truncates toward zero: -7/2 = -3. */
            ck_assert_int_eq(b8[i], v8[i] / nr);
            ck_assert_int_eq(bu[i], u8[i] / nr);
            ck_assert_int_eq(b32[i], v32[i] / nr);
            ck_assert_int_eq(b64[i], v64[i] / nr);
        }
    }
    int8_t t[] = { -7, -5, -1 };
    hc_reduce_avg_finish(t, 3, HCOLL_INT8, HCOLL_AVG, 2);
    ck_assert_int_eq(t[0], -3);
    ck_assert_int_eq(t[1], -2);
    ck_assert_int_eq(t[2], 0);
}
END_TEST

/* Divisors the exact-reciprocal finish must get right: every small one,
 * powers of two and their neighbours, and the largest an int holds. */
static int avg_divisor(int k)
{
    if (k < 300)
        return k + 2;
    k -= 300;
    if (k < 3 * 29) {
        int e = k / 3 + 2, s = k % 3 - 1;
        return (1 << e) + s;
    }
    return k == 3 * 29 ? INT32_MAX : INT32_MAX - 1;
}
#define AVG_NDIV (300 + 3 * 29 + 2)

/* x / d for every int8 and uint8 value and each divisor, once through the
 * vector body (a buffer offset by one byte, 3 longer than a vector
 * multiple) and once element by element through the scalar tail. */
START_TEST(test_avg_finish_int_exhaustive8)
{
    unsigned char raw[256 + 8], want[256 + 8];

    for (int k = 0; k < AVG_NDIV; k++) {
        int d = avg_divisor(k);
        for (int t = 0; t < 4; t++) {
            hcoll_dtype_t dt = t % 2 ? HCOLL_UINT8 : HCOLL_INT8;
            for (int v = 0; v < 259; v++) {
                raw[1 + v] = (unsigned char)(v + 128 * (v >= 256));
                want[1 + v] = t % 2 ? (unsigned char)(raw[1 + v] / d)
                                    : (unsigned char)(int8_t)((int8_t)raw[1 + v] / d);
            }
            if (t < 2)
                hc_reduce_avg_finish(raw + 1, 259, dt, HCOLL_AVG, d);
            else
                for (int v = 0; v < 259; v++)
                    hc_reduce_avg_finish(raw + 1 + v, 1, dt, HCOLL_AVG, d);
            for (int v = 0; v < 259; v++)
                ck_assert_msg(raw[1 + v] == want[1 + v], "%s %d / %d (%s): got %d want %d",
                              hcoll_dtype_name(dt), v, d, t < 2 ? "vector" : "scalar",
                              raw[1 + v], want[1 + v]);
        }
    }
}
END_TEST

/* Values next to every multiple of d that the type's ends reach, the ends
 * themselves, and pseudo-random ones. */
START_TEST(test_avg_finish_int_edges)
{
    enum { N = 64 + 3 };
    uint64_t s = 0x9e3779b97f4a7c15ull;

    for (int k = 0; k < AVG_NDIV; k++) {
        int d = avg_divisor(k);
        int32_t a[N], w32[N];
        int64_t b[N], w64[N];
        int64_t q32 = INT32_MAX / d, q64 = INT64_MAX / d;
        for (int i = 0; i < N; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            int j = i % 8, sign = (i / 8) % 2 ? -1 : 1;
            int64_t m32 = j < 3 ? q32 * d + j - 1 : (int64_t)(int32_t)s;
            /* Past INT64_MAX (d divides it, as 7 does) it wraps to the
             * other end, on purpose: unsigned, which is defined (UBSan). */
            uint64_t m64 = j < 3 ? (uint64_t)q64 * (uint64_t)d + (uint64_t)(j - 1) : s;
            a[i] = j == 3 ? INT32_MIN : j == 4 ? INT32_MAX : (int32_t)(sign * m32);
            b[i] = j == 3 ? INT64_MIN : j == 4 ? INT64_MAX : (int64_t)((uint64_t)sign * m64);
            w32[i] = a[i] / d;
            w64[i] = b[i] / d;
        }
        hc_reduce_avg_finish(a, N, HCOLL_INT32, HCOLL_AVG, d);
        hc_reduce_avg_finish(b, N, HCOLL_INT64, HCOLL_AVG, d);
        for (int i = 0; i < N; i++) {
            ck_assert_msg(a[i] == w32[i], "int32 [%d] / %d: got %d want %d", i, d, a[i], w32[i]);
            ck_assert_msg(b[i] == w64[i], "int64 [%d] / %d: got %lld want %lld", i, d,
                          (long long)b[i], (long long)w64[i]);
        }
    }
}
END_TEST

START_TEST(test_avg_finish_float)
{
    int divs[] = { 2, 3, 7, 1024, 12345 };
    uint64_t s = 77;
    for (size_t k = 0; k < 5; k++) {
        for (size_t n = 0; n <= 70; n++) {
            for (size_t off = 0; off < 3; off++) {
                unsigned char raw[70 * 8 + 3], exp[70 * 8];
                for (size_t t = 0; t < 4; t++) {
                    hcoll_dtype_t dt = (hcoll_dtype_t[]){ HCOLL_FLOAT32, HCOLL_FLOAT64,
                                                          HCOLL_FLOAT16, HCOLL_BFLOAT16 }[t];
                    size_t sz = hcoll_dtype_size(dt);
                    unsigned char *p = raw + off;
                    gen_fill(dt, &s, GEN_ANY, p, n);
                    for (size_t i = 0; i < n; i++) {
                        unsigned char *x = p + i * sz, *e = exp + i * sz;
                        if (dt == HCOLL_FLOAT32) {
                            float f;
                            memcpy(&f, x, 4);
                            f = f / (float)divs[k];
                            memcpy(e, &f, 4);
                        } else if (dt == HCOLL_FLOAT64) {
                            double f;
                            memcpy(&f, x, 8);
                            f = f / (double)divs[k];
                            memcpy(e, &f, 8);
                        } else {
                            uint16_t h;
                            memcpy(&h, x, 2);
                            h = dt == HCOLL_FLOAT16 ? ref_f2h(ref_h2f(h) / (float)divs[k])
                                                    : ref_f2b(ref_b2f(h) / (float)divs[k]);
                            memcpy(e, &h, 2);
                        }
                    }
                    hc_reduce_avg_finish(p, n, dt, HCOLL_AVG, divs[k]);
                    for (size_t i = 0; i < n; i++)
                        ck_assert_msg(elem_equal(dt, p + i * sz, exp + i * sz),
                                      "avg %s /%d n=%zu [%zu]", hcoll_dtype_name(dt), divs[k],
                                      n, i);
                }
            }
        }
    }
    /* Half types round the quotient to nearest-even: ties at the bottom. */
    uint16_t h[] = { 0x0001, 0x0003, 0x4200, 0x3c00 };
    hc_reduce_avg_finish(h, 4, HCOLL_FLOAT16, HCOLL_AVG, 2);
    ck_assert_uint_eq(h[0], 0x0000);
    ck_assert_uint_eq(h[1], 0x0002);
    ck_assert_uint_eq(h[2], 0x3e00); /* 3/2 */
    ck_assert_uint_eq(h[3], 0x3800);
    uint16_t b[] = { 0x0001, 0x0003, 0x4040, 0x3f80 };
    hc_reduce_avg_finish(b, 4, HCOLL_BFLOAT16, HCOLL_AVG, 2);
    ck_assert_uint_eq(b[0], 0x0000);
    ck_assert_uint_eq(b[1], 0x0002);
    ck_assert_uint_eq(b[2], 0x3fc0);
    ck_assert_uint_eq(b[3], 0x3f00);
    float f[] = { 1.0f, NAN, -3.0f };
    hc_reduce_avg_finish(f, 3, HCOLL_FLOAT32, HCOLL_AVG, 3);
    ck_assert(f2u(f[0]) == f2u(1.0f / 3.0f));
    ck_assert(isnan(f[1]));
    ck_assert(f[2] == -1.0f);
}
END_TEST

/* Only AVG divides; one rank (or a meaningless count) changes nothing. */
START_TEST(test_avg_finish_noop)
{
    for (size_t t = 0; t < N_DTYPES; t++) {
        hcoll_dtype_t dt = all_dtypes[t];
        unsigned char buf[64 * 8], orig[64 * 8];
        uint64_t s = 5 + t;
        gen_fill(dt, &s, GEN_FINITE, orig, 64);
        for (size_t o = 0; o < N_OPS; o++) {
            if (all_ops[o] == HCOLL_AVG)
                continue;
            memcpy(buf, orig, sizeof buf);
            hc_reduce_avg_finish(buf, 64, dt, all_ops[o], 4);
            ck_assert(memcmp(buf, orig, sizeof buf) == 0);
        }
        int nrs[] = { 1, 0, -3 };
        for (size_t k = 0; k < 3; k++) {
            memcpy(buf, orig, sizeof buf);
            hc_reduce_avg_finish(buf, 64, dt, HCOLL_AVG, nrs[k]);
            ck_assert_msg(memcmp(buf, orig, sizeof buf) == 0, "%s nranks=%d changed data",
                          hcoll_dtype_name(dt), nrs[k]);
        }
        hc_reduce_avg_finish(NULL, 0, dt, HCOLL_AVG, 4);
    }
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Validation and dispatch                                                    */
/* ------------------------------------------------------------------------ */

START_TEST(test_valid)
{
    for (size_t t = 0; t < N_DTYPES; t++)
        for (size_t o = 0; o < N_OPS; o++)
            ck_assert(hc_reduce_valid(all_dtypes[t], all_ops[o]));
    ck_assert(!hc_reduce_valid((hcoll_dtype_t)-1, HCOLL_SUM));
    ck_assert(!hc_reduce_valid(HCOLL_DTYPE_COUNT_, HCOLL_SUM));
    ck_assert(!hc_reduce_valid((hcoll_dtype_t)100, HCOLL_SUM));
    ck_assert(!hc_reduce_valid((hcoll_dtype_t)0x7fffffff, HCOLL_SUM));
    ck_assert(!hc_reduce_valid(HCOLL_FLOAT32, (hcoll_op_t)-1));
    ck_assert(!hc_reduce_valid(HCOLL_FLOAT32, HCOLL_OP_COUNT_));
    ck_assert(!hc_reduce_valid(HCOLL_FLOAT32, (hcoll_op_t)1000));
    ck_assert(!hc_reduce_valid(HCOLL_DTYPE_COUNT_, HCOLL_OP_COUNT_));

    /* Invalid arguments: nothing is written. */
    unsigned char a[16] = { 1 }, b[16] = { 2 }, d[16], d0[16];
    memset(d, 0x33, sizeof d);
    memcpy(d0, d, sizeof d);
    hc_reduce(d, a, b, 4, HCOLL_DTYPE_COUNT_, HCOLL_SUM);
    hc_reduce(d, a, b, 4, HCOLL_FLOAT32, HCOLL_OP_COUNT_);
    hc_reduce(d, a, b, 4, (hcoll_dtype_t)-5, (hcoll_op_t)-5);
    hc_reduce_avg_finish(d, 4, HCOLL_DTYPE_COUNT_, HCOLL_AVG, 2);
    ck_assert(memcmp(d, d0, sizeof d) == 0);
    /* Count 0 touches nothing, not even the pointers. */
    hc_reduce(NULL, NULL, NULL, 0, HCOLL_FLOAT32, HCOLL_SUM);
}
END_TEST

START_TEST(test_impl_name)
{
    const char *name = hc_reduce_impl_name();
    ck_assert_ptr_nonnull(name);
    ck_assert_str_eq(name, hc_reduce_impl_name());
    /* HCOLL_CPU_KERNELS (tests/kernels.test.sh runs this under each set)
     * must pick exactly the set asked for, or init must refuse. */
    const char *want = getenv("HCOLL_CPU_KERNELS");
    char err[256];
    if (want && strcasecmp(want, "generic") == 0) {
        ck_assert_str_eq(name, "generic");
    } else if (want && strcasecmp(want, "avx2") == 0) {
        if (strcmp(name, "avx2+f16c") != 0)
            ck_assert_int_eq(hc_reduce_check(err, sizeof err), HCOLL_ERR_INVALID_ARG);
    } else {
#if defined(__x86_64__)
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
            ck_assert_str_eq(name, "avx2+f16c");
        else
            ck_assert_str_eq(name, "generic");
#endif
    }
    if (!want || strcasecmp(want, "avx2") != 0 || strcmp(name, "avx2+f16c") == 0)
        ck_assert_int_eq(hc_reduce_check(err, sizeof err), HCOLL_SUCCESS);
    fprintf(stderr, "test_reduce: kernels use the %s path\n", name);
}
END_TEST

/* ------------------------------------------------------------------------ */

static TCase *tcase(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    return tc;
}

static Suite *reduce_suite(void)
{
    Suite *s = suite_create("reduce");
    TCase *tc;

    tc = tcase("conversions");
    tcase_add_test(tc, test_half_to_float_exhaustive);
    tcase_add_test(tc, test_bf16_to_float_exhaustive);
    tcase_add_test(tc, test_float_to_half_ties_and_sweep);
    tcase_add_test(tc, test_float_to_bf16_ties_and_sweep);
    tcase_add_test(tc, test_half_matches_f16c);
    suite_add_tcase(s, tc);

    tc = tcase("kernels");
    tcase_add_loop_test(tc, test_all_lengths, 0, N_DTYPES);
    tcase_add_loop_test(tc, test_misaligned, 0, N_DTYPES);
    tcase_add_loop_test(tc, test_in_place, 0, N_DTYPES);
    tcase_add_loop_test(tc, test_long_bitwise, 0, N_DTYPES);
    suite_add_tcase(s, tc);

    tc = tcase("values");
    tcase_add_test(tc, test_half_rounding);
    tcase_add_test(tc, test_nan_propagation);
    tcase_add_test(tc, test_int_wraparound);
    suite_add_tcase(s, tc);

    tc = tcase("avg");
    tcase_add_test(tc, test_scale);
    tcase_add_test(tc, test_avg_finish_int);
    tcase_add_test(tc, test_avg_finish_int_exhaustive8);
    tcase_add_test(tc, test_avg_finish_int_edges);
    tcase_add_test(tc, test_avg_finish_float);
    tcase_add_test(tc, test_avg_finish_noop);
    suite_add_tcase(s, tc);

    tc = tcase("api");
    tcase_add_test(tc, test_valid);
    tcase_add_test(tc, test_impl_name);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(reduce_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
