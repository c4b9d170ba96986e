/*
 * GPU reduction kernels: dst = a op b for every dtype x op, and the AVG
 * finishing division, with the host kernels' semantics (core/reduce.c):
 *
 *   global memory ──16-byte loads──► registers ──op in the arithmetic type──► 16-byte store
 *                    (a scalar head up to the 16-byte boundary when dst, a
 *                     and b are misaligned alike; scalar loads when they
 *                     are misaligned differently, and for the tail)
 *
 *   half types   widened to float, combined, rounded to nearest-even on
 *                store (__float2half_rn / __float2bfloat16_rn are exact
 *                IEEE rounding, as the host's integer code is)
 *   integers     SUM/PROD in the unsigned type (wrap), MAX/MIN signed
 *   float MAX    (x != x || y != y) ? x + y : (x > y ? x : y): the host's
 *                expression, so signed zeros pick the same operand; a NaN
 *                result is NaN on both sides (payloads may differ: the GPU
 *                returns the canonical NaN)
 *   AVG finish   a true division (not a reciprocal), integers truncate
 *   scale        dst = k * src (PREMUL_SUM, AVG's 1/n): one product in the
 *                scalar's precision (base/reduce.h hc_reduce_scale): f32
 *                for f32 and the half types, f64, integers wrap; k is kbits
 *                (hc_scalar_t's bits) or, with kp, one element of the dtype
 *                in device memory (half types widened exactly)
 *
 * Built without --use_fast_math: denormals are kept and division is IEEE,
 * as on the host. Every name is extern "C" so kern.c finds it by name.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr int kUnroll = 4;

struct F32 { typedef float S; typedef float A;
    __device__ static A ld(S s) { return s; } __device__ static S st(A a) { return a; } };
struct F64 { typedef double S; typedef double A;
    __device__ static A ld(S s) { return s; } __device__ static S st(A a) { return a; } };
struct F16 { typedef uint16_t S; typedef float A;
    __device__ static A ld(S s) { return __half2float(__ushort_as_half(s)); }
    __device__ static S st(A a) { return __half_as_ushort(__float2half_rn(a)); } };
struct BF16 { typedef uint16_t S; typedef float A;
    __device__ static A ld(S s) { return __bfloat162float(__ushort_as_bfloat16(s)); }
    __device__ static S st(A a) { return __bfloat16_as_ushort(__float2bfloat16_rn(a)); } };

template <typename T> struct Sum {
    __device__ static typename T::S f(typename T::S x, typename T::S y)
    { return T::st(T::ld(x) + T::ld(y)); } };
template <typename T> struct Prod {
    __device__ static typename T::S f(typename T::S x, typename T::S y)
    { return T::st(T::ld(x) * T::ld(y)); } };
template <typename T> struct Max {
    __device__ static typename T::S f(typename T::S xs, typename T::S ys) {
        typename T::A x = T::ld(xs), y = T::ld(ys);
        return T::st((x != x || y != y) ? x + y : (x > y ? x : y)); } };
template <typename T> struct Min {
    __device__ static typename T::S f(typename T::S xs, typename T::S ys) {
        typename T::A x = T::ld(xs), y = T::ld(ys);
        return T::st((x != x || y != y) ? x + y : (x < y ? x : y)); } };

/* Integers: U is the unsigned storage type (wrap-around arithmetic), I the
 * signed one for MAX/MIN of signed types (I == U for uint8). */
template <typename U, typename I> struct ISum {
    typedef U S; __device__ static S f(S x, S y) { return (S)(x + y); } };
template <typename U, typename I> struct IProd {
    typedef U S; __device__ static S f(S x, S y) { return (S)(x * y); } };
template <typename U, typename I> struct IMax {
    typedef U S; __device__ static S f(S x, S y) { return (I)x > (I)y ? x : y; } };
template <typename U, typename I> struct IMin {
    typedef U S; __device__ static S f(S x, S y) { return (I)x < (I)y ? x : y; } };

template <typename S> struct Vec {
    static constexpr int N = 16 / sizeof(S);
    union { uint4 v; S e[N]; };
};

template <typename Op, typename S>
__device__ void reduce_body(S *dst, const S *a, const S *b, unsigned long long n)
{
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
    /* Ring chunks start at arbitrary element offsets, usually the same one
     * in all three buffers: peel the head up to dst's next 16-byte
     * boundary, so that the rest takes the vector loads. */
    const uintptr_t mis = (uintptr_t)dst & 15;
    if (mis && ((uintptr_t)a & 15) == mis && ((uintptr_t)b & 15) == mis && mis % sizeof(S) == 0) {
        unsigned long long head = (16 - mis) / sizeof(S);
        if (head > n)
            head = n;
        for (unsigned long long i = tid; i < head; i += nthreads)
            dst[i] = Op::f(a[i], b[i]);
        dst += head;
        a += head;
        b += head;
        n -= head;
    }
    unsigned long long done = 0;
    if ((((uintptr_t)dst | (uintptr_t)a | (uintptr_t)b) & 15) == 0) {
        typedef Vec<S> V;
        const unsigned long long nv = n / V::N;
        const uint4 *va = reinterpret_cast<const uint4 *>(a);
        const uint4 *vb = reinterpret_cast<const uint4 *>(b);
        uint4 *vd = reinterpret_cast<uint4 *>(dst);
        /* kUnroll independent 16-byte loads per input in flight per thread. */
        unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x * kUnroll + threadIdx.x;
        const unsigned long long step = nthreads * kUnroll;
        for (; i + (kUnroll - 1) * (unsigned long long)blockDim.x < nv; i += step) {
            V x[kUnroll], y[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                x[u].v = va[i + u * blockDim.x];
                y[u].v = vb[i + u * blockDim.x];
            }
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
#pragma unroll
                for (int e = 0; e < V::N; e++)
                    x[u].e[e] = Op::f(x[u].e[e], y[u].e[e]);
                vd[i + u * blockDim.x] = x[u].v;
            }
        }
        /* The last partial tile, one vector at a time. */
        for (; i < nv; i += blockDim.x) {
            V x, y;
            x.v = va[i];
            y.v = vb[i];
#pragma unroll
            for (int e = 0; e < V::N; e++)
                x.e[e] = Op::f(x.e[e], y.e[e]);
            vd[i] = x.v;
        }
        done = nv * V::N;
    }
    for (unsigned long long i = done + tid; i < n; i += nthreads)
        dst[i] = Op::f(a[i], b[i]);
}

template <typename T>
__device__ void avg_float(typename T::S *buf, unsigned long long n, int nranks)
{
    const typename T::A div = (typename T::A)nranks;
    const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += nthreads)
        buf[i] = T::st(T::ld(buf[i]) / div);
}

template <typename S, typename D>
__device__ void avg_int(S *buf, unsigned long long n, int nranks)
{
    const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += nthreads)
        buf[i] = (S)((D)buf[i] / (D)nranks);
}

template <typename T>
__device__ void scale_float(typename T::S *dst, const typename T::S *src, unsigned long long n,
                            const typename T::S *kp, typename T::A kv)
{
    const typename T::A k = kp ? T::ld(*kp) : kv;
    const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += nthreads)
        dst[i] = T::st(T::ld(src[i]) * k);
}

template <typename U>
__device__ void scale_int(U *dst, const U *src, unsigned long long n, const U *kp,
                          unsigned long long kbits)
{
    const U k = kp ? *kp : (U)kbits;
    const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += nthreads)
        dst[i] = (U)(src[i] * k);
}

__device__ float bits_f32(unsigned long long b) { return __uint_as_float((unsigned)b); }
__device__ double bits_f64(unsigned long long b) { return __longlong_as_double((long long)b); }

} // namespace

#define HC_K_SCALE_FLOAT(name, T, conv)                                                      \
    extern "C" __global__ void hc_k_scale_##name(void *d, const void *s, unsigned long long n, \
                                                 const void *kp, unsigned long long kbits)    \
    { scale_float<T>((T::S *)d, (const T::S *)s, n, (const T::S *)kp, conv(kbits)); }
#define HC_K_SCALE_INT(name, U)                                                              \
    extern "C" __global__ void hc_k_scale_##name(void *d, const void *s, unsigned long long n, \
                                                 const void *kp, unsigned long long kbits)    \
    { scale_int<U>((U *)d, (const U *)s, n, (const U *)kp, kbits); }

#define HC_K_FLOAT(name, T)                                                                  \
    extern "C" __global__ void hc_k_reduce_##name##_sum(void *d, const void *a, const void *b, \
                                                         unsigned long long n)                \
    { reduce_body<Sum<T>>((T::S *)d, (const T::S *)a, (const T::S *)b, n); }                  \
    extern "C" __global__ void hc_k_reduce_##name##_prod(void *d, const void *a, const void *b, \
                                                          unsigned long long n)               \
    { reduce_body<Prod<T>>((T::S *)d, (const T::S *)a, (const T::S *)b, n); }                 \
    extern "C" __global__ void hc_k_reduce_##name##_max(void *d, const void *a, const void *b, \
                                                         unsigned long long n)                \
    { reduce_body<Max<T>>((T::S *)d, (const T::S *)a, (const T::S *)b, n); }                  \
    extern "C" __global__ void hc_k_reduce_##name##_min(void *d, const void *a, const void *b, \
                                                         unsigned long long n)                \
    { reduce_body<Min<T>>((T::S *)d, (const T::S *)a, (const T::S *)b, n); }                  \
    extern "C" __global__ void hc_k_avg_##name(void *buf, unsigned long long n, int nranks)   \
    { avg_float<T>((T::S *)buf, n, nranks); }

#define HC_K_INT(name, U, I, D)                                                              \
    extern "C" __global__ void hc_k_reduce_##name##_sum(void *d, const void *a, const void *b, \
                                                         unsigned long long n)                \
    { reduce_body<ISum<U, I>>((U *)d, (const U *)a, (const U *)b, n); }                       \
    extern "C" __global__ void hc_k_reduce_##name##_prod(void *d, const void *a, const void *b, \
                                                          unsigned long long n)               \
    { reduce_body<IProd<U, I>>((U *)d, (const U *)a, (const U *)b, n); }                      \
    extern "C" __global__ void hc_k_reduce_##name##_max(void *d, const void *a, const void *b, \
                                                         unsigned long long n)                \
    { reduce_body<IMax<U, I>>((U *)d, (const U *)a, (const U *)b, n); }                       \
    extern "C" __global__ void hc_k_reduce_##name##_min(void *d, const void *a, const void *b, \
                                                         unsigned long long n)                \
    { reduce_body<IMin<U, I>>((U *)d, (const U *)a, (const U *)b, n); }                       \
    extern "C" __global__ void hc_k_avg_##name(void *buf, unsigned long long n, int nranks)   \
    { avg_int<I, D>((I *)buf, n, nranks); }

HC_K_FLOAT(f32, F32)
HC_K_FLOAT(f16, F16)
HC_K_FLOAT(bf16, BF16)
HC_K_FLOAT(f64, F64)
HC_K_INT(i8, uint8_t, int8_t, int)
HC_K_INT(u8, uint8_t, uint8_t, int)
HC_K_INT(i32, uint32_t, int32_t, int32_t)
HC_K_INT(i64, unsigned long long, long long, long long)
HC_K_SCALE_FLOAT(f32, F32, bits_f32)
HC_K_SCALE_FLOAT(f16, F16, bits_f32)
HC_K_SCALE_FLOAT(bf16, BF16, bits_f32)
HC_K_SCALE_FLOAT(f64, F64, bits_f64)
HC_K_SCALE_INT(i8, uint8_t)
HC_K_SCALE_INT(u8, uint8_t)
HC_K_SCALE_INT(i32, uint32_t)
HC_K_SCALE_INT(i64, unsigned long long)
