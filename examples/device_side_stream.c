/*
 * Gradients in GPU memory, all-reduced on a side stream while the compute
 * stream goes on, ordered with events as a framework's DDP does it:
 *
 *   compute  ── write grad ── [ready] ── next forward ──────── wait [done] ── read grad
 *   comm                          └── wait ── hcoll_allreduce ── [done] ──┘
 *
 * hcoll_allreduce with a stream only enqueues: it returns at once, and work
 * queued after it on that stream (here the [done] event) sees the result.
 * The CUDA driver is opened at run time, as hcoll itself does, so this
 * builds wherever the CUDA headers are and exits 77 where there is no GPU.
 * Each rank uses GPU LOCAL_RANK mod the GPU count (before joining, so that
 * hcoll takes the GPU as the communicator's).
 *
 *   LOCAL_RANK=l HCOLL_RANK=r HCOLL_NRANKS=n HCOLL_ROOT=host:port ./device_side_stream
 */
#include <cuda.h>
#include <dlfcn.h>
#include <hcoll.h>
#include <stdio.h>
#include <stdlib.h>

/* The driver calls used, by their cuda.h names (some are macros for _v2). */
#define CU_CALLS(X)                                                                  \
    X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain)         \
    X(cuCtxSetCurrent) X(cuStreamCreate) X(cuEventCreate) X(cuEventRecord)           \
    X(cuStreamWaitEvent) X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoDAsync)             \
    X(cuMemcpyDtoHAsync) X(cuStreamSynchronize) X(cuStreamDestroy) X(cuEventDestroy) \
    X(cuDevicePrimaryCtxRelease)
#define DECLARE(f) static __typeof__(&f) p_##f;
#define NAME(f) #f
#define LOAD(f) if (!(p_##f = (__typeof__(&f))dlsym(lib, NAME(f)))) return NAME(f);
CU_CALLS(DECLARE)

static const char *load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib)
        return "libcuda.so.1";
    CU_CALLS(LOAD)
    return NULL;
}

#define CU(call) do { CUresult r_ = p_##call; if (r_ != CUDA_SUCCESS) { \
        fprintf(stderr, "%s: CUDA error %d\n", #call, (int)r_); exit(1); } } while (0)
#define HC(call) do { hcoll_status_t s_ = (call); if (s_ != HCOLL_SUCCESS) { \
        fprintf(stderr, "%s: %s (%s)\n", #call, hcoll_strerror(s_), \
                hcoll_comm_last_error(comm)); exit(1); } } while (0)

enum { COUNT = 1 << 20, STEPS = 3 };

int main(void)
{
    const char *missing = load_driver();
    int ndev = 0;
    if (missing || p_cuInit(0) != CUDA_SUCCESS || p_cuDeviceGetCount(&ndev) != CUDA_SUCCESS ||
        ndev == 0) {
        printf("SKIP: no GPU (%s)\n", missing ? missing : "the CUDA driver sees no device");
        return 77;
    }
    const char *lr = getenv("LOCAL_RANK");
    CUdevice dev;
    CUcontext ctx;
    CU(cuDeviceGet(&dev, (lr ? atoi(lr) : 0) % ndev));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));

    hcoll_comm_t comm = NULL;
    HC(hcoll_comm_init_env(&comm, NULL));
    int rank, size;
    HC(hcoll_comm_rank(comm, &rank));
    HC(hcoll_comm_size(comm, &size));

    CUstream compute, side;
    CUevent ready, done;
    CUdeviceptr grad, act;
    CU(cuStreamCreate(&compute, CU_STREAM_NON_BLOCKING));
    CU(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    CU(cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING));
    CU(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    CU(cuMemAlloc(&grad, COUNT * sizeof(float)));
    CU(cuMemAlloc(&act, COUNT * sizeof(float)));
    float *in = malloc(COUNT * sizeof *in), *out = malloc(COUNT * sizeof *out);
    if (!in || !out)
        return 1;

    size_t wrong = 0;
    for (int step = 0; step < STEPS; step++) {
        for (size_t i = 0; i < COUNT; i++) /* small integers: the sum is exact */
            in[i] = (float)((rank + step + i) % 13);
        /* Backward writes the gradients on the compute stream (a copy stands in
         * for the kernels), and marks them ready. */
        CU(cuMemcpyHtoDAsync(grad, in, COUNT * sizeof(float), compute));
        CU(cuEventRecord(ready, compute));
        /* The side stream waits for them, then all-reduces in place. */
        CU(cuStreamWaitEvent(side, ready, 0));
        HC(hcoll_allreduce(comm, (void *)grad, (void *)grad, COUNT, HCOLL_FLOAT32, HCOLL_SUM,
                           (void *)side));
        CU(cuEventRecord(done, side));
        /* The compute stream goes on with work that does not touch grad... */
        CU(cuMemcpyHtoDAsync(act, in, COUNT * sizeof(float), compute));
        /* ...and waits for the sum only where it reads it (the optimizer). */
        CU(cuStreamWaitEvent(compute, done, 0));
        CU(cuMemcpyDtoHAsync(out, grad, COUNT * sizeof(float), compute));
        CU(cuStreamSynchronize(compute));
        for (size_t i = 0; i < COUNT; i++) {
            float want = 0;
            for (int r = 0; r < size; r++)
                want += (float)((r + step + i) % 13);
            wrong += out[i] != want;
        }
    }
    hcoll_status_t async_err;
    HC(hcoll_comm_get_async_error(comm, &async_err));
    printf("rank %d of %d on GPU %d: %d steps of %d floats on a side stream, %zu wrong, %s\n",
           rank, size, (int)dev, STEPS, COUNT, wrong, hcoll_status_name(async_err));

    HC(hcoll_comm_destroy(comm));
    CU(cuMemFree(grad));
    CU(cuMemFree(act));
    CU(cuEventDestroy(ready));
    CU(cuEventDestroy(done));
    CU(cuStreamDestroy(compute));
    CU(cuStreamDestroy(side));
    CU(cuDevicePrimaryCtxRelease(dev));
    free(in);
    free(out);
    return wrong || async_err != HCOLL_SUCCESS ? 1 : 0;
}
