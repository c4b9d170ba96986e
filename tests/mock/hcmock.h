/*
 * The seam between the two driver emulations used by the GPU tests on
 * machines without a GPU: build/mock/libcuda.so.1 (tests/mock/cuda.c) and
 * build/mock/libnccl.so.2 (tests/mock/nccl.c, linked against the former).
 *
 *   libhcoll ──dlopen──► mock libcuda.so.1 ◄──DT_NEEDED── mock libnccl.so.2
 *                          │ streams: one worker thread each, in order
 *                          │ device memory: host memory behind addresses the
 *                          │ host cannot dereference (translated here)
 *                          ▼
 *                        hcmock_stream_enqueue / hcmock_dev_to_host
 *
 * Neither mock is a GPU: they run the library's device path (contexts,
 * streams, events, stream memory operations, kernels, NCCL collectives)
 * so that its control flow is tested in CI. Speed figures under them mean
 * nothing.
 */
#ifndef HCMOCK_H
#define HCMOCK_H

#include <stddef.h>
#include <stdint.h>

#define HCMOCK_API __attribute__((visibility("default")))

typedef void (*hcmock_fn)(void *arg);

/* Run fn(arg) on stream's worker after everything enqueued on it before
 * (stream NULL: the legacy default stream of the current context). fn runs
 * with the stream's context current. Returns 0 or a CUresult (e.g. 201
 * CUDA_ERROR_INVALID_CONTEXT when no context is current for NULL). */
HCMOCK_API int hcmock_stream_enqueue(void *stream, hcmock_fn fn, void *arg);

/* Host address behind the device range [p, p+len), or NULL when the range
 * is not inside one live device allocation. */
HCMOCK_API void *hcmock_dev_to_host(uint64_t p, size_t len);

/* What a dma-buf fd of the emulated driver holds (cuMemGetHandleForAddressRange
 * with HCMOCK_DMABUF=2): the exported device range, read back by the
 * emulated libibverbs' ibv_reg_dmabuf_mr. */
#define HCMOCK_DMABUF_MAGIC 0x6863646d61627566ull /* "hcdmabuf" */
typedef struct hcmock_dmabuf {
    uint64_t magic;
    uint64_t dptr; /* page-aligned start */
    uint64_t size; /* page-aligned length */
} hcmock_dmabuf_t;

/* Device ordinal of the calling thread's current context, or -1. */
HCMOCK_API int hcmock_current_device(void);

/* "hcoll-mock-cuda": a test finds it with dlsym in libcuda.so.1 to know it
 * runs on this emulation rather than on a GPU. */
HCMOCK_API const char *hcmock_driver(void);

#endif
