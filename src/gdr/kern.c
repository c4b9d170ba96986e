/*
 * The reduction kernels of kernels.cu, from the fatbin embedded in this
 * library to a launch on a stream:
 *
 *   build:  kernels.cu ──nvcc -fatbin──► hc_kernels.fatbin ──.incbin──► libhcoll
 *   run:    cuModuleLoadData(fatbin) ──cuModuleGetFunction × 48──► hc_gdr_kern_t
 *           hc_gdr_kern_reduce ──cuLaunchKernel──► caller's stream
 *
 * Built without nvcc, the fatbin is absent and loading says so; nothing
 * links against CUDA either way (the driver comes from gdr.c's dlopen).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdr/gdr.h"
#include "gdr/mem.h"
#include "hc_build.h"
#include "hcoll.h"

#ifndef HCOLL_BUILD_KERNELS
#define HCOLL_BUILD_KERNELS 0
#endif

#if HCOLL_BUILD_KERNELS
/* From the generated hc_kernels_fatbin.S (Makefile). */
extern const unsigned char hc_kernels_fatbin[];
#endif

/* Threads per block; blocks are capped at this many per SM, the grid-stride
 * loops cover the rest. */
#define KERN_THREADS 256
#define KERN_BLOCKS_PER_SM 16
/* Elements per thread per tile in kernels.cu (kUnroll 16-byte vectors). */
#define KERN_UNROLL 4

/* AVG has no kernel of its own: it reduces with SUM. */
#define KERN_NOPS 4

#if HCOLL_BUILD_KERNELS
static const char *const dt_names[HCOLL_DTYPE_COUNT_] = {
    [HCOLL_FLOAT32] = "f32", [HCOLL_FLOAT16] = "f16", [HCOLL_BFLOAT16] = "bf16",
    [HCOLL_FLOAT64] = "f64", [HCOLL_INT8] = "i8",     [HCOLL_UINT8] = "u8",
    [HCOLL_INT32] = "i32",   [HCOLL_INT64] = "i64",
};
static const char *const op_names[KERN_NOPS] = { "sum", "prod", "max", "min" };
#endif

struct hc_gdr_kern {
    const hc_cu_api_t *cu;
    void *module;
    void *reduce[HCOLL_DTYPE_COUNT_][KERN_NOPS];
    void *avg[HCOLL_DTYPE_COUNT_];
    void *scale[HCOLL_DTYPE_COUNT_];
    unsigned max_blocks;
};

int hc_gdr_kern_built(void)
{
    return HCOLL_BUILD_KERNELS;
}

hcoll_status_t hc_gdr_kern_load(hc_gdr_kern_t **out, char *why, size_t whylen)
{
#if !HCOLL_BUILD_KERNELS
    snprintf(why, whylen,
             "this libhcoll was built without the CUDA kernels (no nvcc under CUDA_HOME at "
             "build time, or HCOLL_CUDA=0)");
    (void)out;
    return HCOLL_ERR_UNSUPPORTED;
#else
    const hc_cu_api_t *cu = hc_gdr_cu(why, whylen);
    if (!cu)
        return HCOLL_ERR_UNSUPPORTED;
    hc_gdr_kern_t *k = calloc(1, sizeof *k);
    if (!k) {
        snprintf(why, whylen, "out of memory");
        return HCOLL_ERR_NO_MEMORY;
    }
    k->cu = cu;
    char eb[160];
    hc_cu_res_t r = cu->module_load_data(&k->module, hc_kernels_fatbin);
    if (r != HC_CU_SUCCESS) {
        /* NO_BINARY_FOR_GPU: neither SASS nor PTX this driver can JIT. */
        snprintf(why, whylen, "cuModuleLoadData of the embedded kernels failed: %s",
                 hc_gdr_cu_errstr(r, eb, sizeof eb));
        free(k);
        return HCOLL_ERR_CUDA;
    }
    char name[64];
    for (int d = 0; d < HCOLL_DTYPE_COUNT_; d++) {
        for (int o = 0; o < KERN_NOPS; o++) {
            snprintf(name, sizeof name, "hc_k_reduce_%s_%s", dt_names[d], op_names[o]);
            r = cu->module_get_function(&k->reduce[d][o], k->module, name);
            if (r != HC_CU_SUCCESS)
                goto clean_module;
        }
        snprintf(name, sizeof name, "hc_k_avg_%s", dt_names[d]);
        r = cu->module_get_function(&k->avg[d], k->module, name);
        if (r != HC_CU_SUCCESS)
            goto clean_module;
        snprintf(name, sizeof name, "hc_k_scale_%s", dt_names[d]);
        r = cu->module_get_function(&k->scale[d], k->module, name);
        if (r != HC_CU_SUCCESS)
            goto clean_module;
    }
    /* Enough blocks to fill the current device; the loops stride over
     * the rest. */
    int dev = 0, sms = 0;
    if (cu->ctx_get_device(&dev) != HC_CU_SUCCESS ||
        cu->device_attr(&sms, HC_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != HC_CU_SUCCESS)
        sms = 0;
    k->max_blocks = sms > 0 ? (unsigned)sms * KERN_BLOCKS_PER_SM : 256u * KERN_BLOCKS_PER_SM;
    *out = k;
    return HCOLL_SUCCESS;
clean_module:
    snprintf(why, whylen, "the embedded kernels lack %s: %s", name,
             hc_gdr_cu_errstr(r, eb, sizeof eb));
    cu->module_unload(k->module);
    free(k);
    return HCOLL_ERR_CUDA;
#endif
}

void hc_gdr_kern_unload(hc_gdr_kern_t *k)
{
    if (!k)
        return;
    k->cu->module_unload(k->module);
    free(k);
}

/* One module per GPU for the process life (mem.h says why it is never
 * unloaded). Loaded under the lock, so that two communicators opening at
 * once do not both load it and then have to unload one. */
#define KERN_MAX_DEV 64
static pthread_mutex_t g_kern_lock = PTHREAD_MUTEX_INITIALIZER;
static hc_gdr_kern_t *g_kern[KERN_MAX_DEV];

hcoll_status_t hc_gdr_kern_shared(int cudev, hc_gdr_kern_t **out, char *why, size_t whylen)
{
    *out = NULL;
    if (cudev < 0 || cudev >= KERN_MAX_DEV) {
        snprintf(why, whylen, "CUdevice %d is past the %d this build keeps kernels for", cudev,
                 KERN_MAX_DEV);
        return HCOLL_ERR_UNSUPPORTED;
    }
    hcoll_status_t st = HCOLL_SUCCESS;
    pthread_mutex_lock(&g_kern_lock);
    if (!g_kern[cudev]) {
        const hc_cu_api_t *cu = hc_gdr_cu(why, whylen);
        if (!cu || hc_gdr_keep_ctx(cu, cudev) != 0) {
            if (cu)
                snprintf(why, whylen, "the primary context of CUdevice %d cannot be retained",
                         cudev);
            st = HCOLL_ERR_UNSUPPORTED;
        } else {
            st = hc_gdr_kern_load(&g_kern[cudev], why, whylen);
        }
    }
    *out = g_kern[cudev];
    pthread_mutex_unlock(&g_kern_lock);
    return st;
}

#if HCOLL_BUILD_KERNELS
static unsigned kern_grid(const hc_gdr_kern_t *k, size_t count, size_t esize)
{
    /* One thread per 16-byte vector, KERN_UNROLL vectors per thread. */
    size_t per_block = (size_t)KERN_THREADS * KERN_UNROLL * (16 / esize);
    size_t blocks = (count + per_block - 1) / per_block;
    if (blocks < 1)
        blocks = 1;
    if (blocks > k->max_blocks)
        blocks = k->max_blocks;
    return (unsigned)blocks;
}
#endif

hc_cu_res_t hc_gdr_kern_reduce(hc_gdr_kern_t *k, hc_cu_dptr_t dst, hc_cu_dptr_t a,
                               hc_cu_dptr_t b, size_t count, int dtype, int op, void *stream)
{
#if HCOLL_BUILD_KERNELS
    if (count == 0)
        return HC_CU_SUCCESS;
    if (op == HCOLL_AVG)
        op = HCOLL_SUM;
    if (dtype < 0 || dtype >= HCOLL_DTYPE_COUNT_ || op < 0 || op >= KERN_NOPS)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    unsigned long long n = count;
    void *args[] = { &dst, &a, &b, &n };
    return k->cu->launch_kernel(k->reduce[dtype][op], kern_grid(k, count, hcoll_dtype_size(dtype)),
                                1, 1, KERN_THREADS, 1, 1, 0, stream, args, NULL);
#else
    (void)k, (void)dst, (void)a, (void)b, (void)count, (void)dtype, (void)op, (void)stream;
    return 1;
#endif
}

hc_cu_res_t hc_gdr_kern_avg(hc_gdr_kern_t *k, hc_cu_dptr_t buf, size_t count, int dtype,
                            int nranks, void *stream)
{
#if HCOLL_BUILD_KERNELS
    if (count == 0)
        return HC_CU_SUCCESS;
    if (dtype < 0 || dtype >= HCOLL_DTYPE_COUNT_ || nranks < 1)
        return 1;
    unsigned long long n = count;
    void *args[] = { &buf, &n, &nranks };
    return k->cu->launch_kernel(k->avg[dtype], kern_grid(k, count, hcoll_dtype_size(dtype)), 1, 1,
                                KERN_THREADS, 1, 1, 0, stream, args, NULL);
#else
    (void)k, (void)buf, (void)count, (void)dtype, (void)nranks, (void)stream;
    return 1;
#endif
}

hc_cu_res_t hc_gdr_kern_scale(hc_gdr_kern_t *k, hc_cu_dptr_t dst, hc_cu_dptr_t src,
                              size_t count, int dtype, hc_cu_dptr_t kp, uint64_t kbits,
                              void *stream)
{
#if HCOLL_BUILD_KERNELS
    if (count == 0)
        return HC_CU_SUCCESS;
    if (dtype < 0 || dtype >= HCOLL_DTYPE_COUNT_)
        return 1;
    unsigned long long n = count, kb = kbits;
    void *args[] = { &dst, &src, &n, &kp, &kb };
    return k->cu->launch_kernel(k->scale[dtype], kern_grid(k, count, hcoll_dtype_size(dtype)), 1,
                                1, KERN_THREADS, 1, 1, 0, stream, args, NULL);
#else
    (void)k, (void)dst, (void)src, (void)count, (void)dtype, (void)kp, (void)kbits, (void)stream;
    return 1;
#endif
}
